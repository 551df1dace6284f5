#!/usr/bin/env bash
# Installs everything flowgate's tests need on Debian 12 and starts Open vSwitch.
# Idempotent: safe to run again. Needs root (or sudo). Used by .ci/run and the README.
set -euo pipefail

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo"
fi

PACKAGES=(
  openvswitch-switch openvswitch-common iproute2 ethtool iputils-ping util-linux procps
  curl wrk iperf3 tshark mininet nginx-light haproxy etcd-server etcd-client
  protobuf-compiler chromium chromium-driver python3 python3-venv openssl
  openvswitch-testcontroller nftables
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup-debian: installing ${missing[*]}"
  # tshark asks whether non-root users may capture; answer no, non-interactively.
  echo "wireshark-common wireshark-common/install-setuid boolean false" | $SUDO debconf-set-selections
  $SUDO apt-get update
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y "${missing[@]}"
else
  echo "setup-debian: all packages present"
fi

# The etcd and nginx/haproxy packages may start system services; tests start their own.
for svc in etcd nginx haproxy; do
  if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet "$svc" 2>/dev/null; then
    $SUDO systemctl stop "$svc" || true
  fi
done

# The benchmark peers (os-ken venv pinned in bench/osken/requirements.txt, and
# ovs-testcontroller's own service stopped): see docs/benchmarks.md.
"$(dirname "${BASH_SOURCE[0]}")/setup-bench-peers.sh"

# Open vSwitch: no kernel module here, bridges use the userspace (netdev) datapath.
if ! $SUDO ovs-vsctl --timeout=5 show >/dev/null 2>&1; then
  echo "setup-debian: starting Open vSwitch"
  # ovs-ctl detaches the daemons; keep their stdio off our pipe.
  $SUDO /usr/share/openvswitch/scripts/ovs-ctl start </dev/null >/tmp/flowgate-ovs-ctl.log 2>&1 || {
    cat /tmp/flowgate-ovs-ctl.log >&2
    exit 1
  }
fi
for _ in $(seq 1 50); do
  if $SUDO ovs-vsctl --timeout=5 show >/dev/null 2>&1; then
    echo "setup-debian: Open vSwitch $($SUDO ovs-vsctl --version | head -1 | awk '{print $NF}') is running"
    exit 0
  fi
  sleep 0.2
done
echo "setup-debian: Open vSwitch did not come up" >&2
cat /tmp/flowgate-ovs-ctl.log >&2 || true
exit 1
