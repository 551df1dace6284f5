#!/usr/bin/env bash
# The benchmark peers (docs/benchmarks.md): os-ken (the Ryu fork, pinned) in a venv, and
# ovs-testcontroller. Idempotent; called from setup-debian.sh; safe to run again.
# The venv path can be overridden with FLOWGATE_OSKEN_VENV (the bench and tests read it too).
set -euo pipefail

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo"
fi
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${FLOWGATE_OSKEN_VENV:-/opt/flowgate/osken-venv}"
REQ="$HERE/../bench/osken/requirements.txt"

if ! command -v ovs-testcontroller >/dev/null 2>&1; then
  echo "setup-bench-peers: installing openvswitch-testcontroller"
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y openvswitch-testcontroller
fi
# The package may start a system service listening on 6653; the bench starts its own.
if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet openvswitch-testcontroller 2>/dev/null; then
  $SUDO systemctl stop openvswitch-testcontroller || true
elif [ -x /etc/init.d/openvswitch-testcontroller ]; then
  $SUDO /etc/init.d/openvswitch-testcontroller stop >/dev/null 2>&1 || true
fi

want="$(grep -E '^os-ken==' "$REQ" | head -1)"
if [ -x "$VENV/bin/osken-manager" ] && "$VENV/bin/pip" freeze 2>/dev/null | grep -qx "$want"; then
  echo "setup-bench-peers: $want present in $VENV"
  exit 0
fi
echo "setup-bench-peers: creating $VENV with $want"
$SUDO mkdir -p "$(dirname "$VENV")"
$SUDO python3 -m venv "$VENV"
$SUDO "$VENV/bin/pip" install --quiet --disable-pip-version-check -r "$REQ"
"$VENV/bin/osken-manager" --version
