#!/usr/bin/env bash
# flowgate's first command on a fresh Debian machine: install what the lab needs, build
# flowgate in release, and run the default lab scenario (the ISSLM paper's Case B, quick
# variant: Case A's "no load management" beside ISSLM, on Fig. 9's network on real Open
# vSwitch and network namespaces). Takes a few minutes the first time (packages, build),
# then about a minute. Needs root (or sudo) for OVS and namespaces.
#
#   scripts/lab-demo.sh            # writes out/lab-demo/
#   OUT=/tmp/x scripts/lab-demo.sh
set -euo pipefail

cd "$(dirname "$0")/.."
OUT="${OUT:-out/lab-demo}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo"
fi

echo "== 1/3 installing packages and starting Open vSwitch (scripts/setup-debian.sh)"
scripts/setup-debian.sh

if ! command -v cargo >/dev/null 2>&1; then
  echo "lab-demo: cargo is not installed; install Rust from https://rustup.rs and run again" >&2
  exit 1
fi

echo "== 2/3 building flowgate (release)"
cargo build --release -p flowgate

echo "== 3/3 flowgate lab run case-b --quick --out $OUT"
mkdir -p "$OUT"
$SUDO ./target/release/flowgate lab run case-b --quick --out "$OUT"

echo
echo "Tables:  $OUT/case-b.md (Markdown), $OUT/case-b.csv (every column)"
echo "Plots:   $OUT/case-b-*.svg (bandwidth, transfer, B_d(max), D_Transfer, ok rate, p99, delay, shares)"
echo "Logs:    $OUT/logs/"
echo "More:    ./target/release/flowgate lab list; docs/lab.md explains the scenarios and measures."
