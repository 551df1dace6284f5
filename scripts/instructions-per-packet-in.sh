#!/usr/bin/env bash
# Instructions the controller's core executes per PACKET_IN, counted by callgrind over the
# core's own bench (crates/core/benches/packet_in.rs): everything inside
# `Controller::handle_packet_in_frame`, the encoding of the answers included, divided by
# its calls. Unlike a timing it does not move with the host (the same build gives the same
# count to a few hundredths of a per cent), so a change to the PACKET_IN path can be judged
# on a shared VM whose timings move by tens of per cent from run to run. It counts
# instructions, not cycles: cache misses (the connection table's, at millions of entries)
# are not in it; the timed benches say what those cost.
#
# usage: scripts/instructions-per-packet-in.sh [FILTER] [BENCH_BINARY]
#   FILTER        a bench of packet_in.rs (default syn/isslm/0; e.g. syn/refused/0)
#   BENCH_BINARY  a bench binary built earlier (to compare two builds); default: build it
# Needs valgrind (Debian: apt-get install valgrind).
set -euo pipefail

filter="${1:-syn/isslm/0}"
bin="${2:-}"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
command -v valgrind >/dev/null || { echo "needs valgrind (apt-get install valgrind)" >&2; exit 2; }
if [ -z "$bin" ]; then
  bin="$(cargo bench --no-run -p flowgate-core --features testkit --bench packet_in \
    --message-format=json 2>/dev/null \
    | sed -n 's/.*"executable":"\([^"]*packet_in[^"]*\)".*/\1/p' | tail -1)"
  [ -x "$bin" ] || { echo "could not build the packet_in bench" >&2; exit 1; }
fi
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
# Criterion's --profile-time runs the bench without its analysis; only the calls of
# handle_packet_in_frame are counted (the bench's set-up and its prefetch are not).
valgrind --tool=callgrind --callgrind-out-file="$out/cg" \
  --toggle-collect='*Controller::handle_packet_in_frame*' \
  "$bin" --bench --profile-time 1 "$filter" >/dev/null 2>"$out/log" \
  || { cat "$out/log" >&2; exit 1; }
awk -v filter="$filter" '
  # Function names are given once as "(id) name", then referred to by "(id)".
  /^c?fn=\(/ {
    id = $0; sub(/^c?fn=/, "", id); name = id
    sub(/\).*/, ")", id); sub(/^\([0-9]+\) ?/, "", name)
    if (name != "") names[id] = name
    if ($0 ~ /^cfn=/) callee = names[id]
    next
  }
  /^calls=/ && callee ~ /Controller::handle_packet_in_frame$/ {
    n = $1; sub(/^calls=/, "", n); calls += n
  }
  /^(summary|totals):/ { total = $2 }
  END {
    if (calls == 0) { print "no call of handle_packet_in_frame counted" > "/dev/stderr"; exit 1 }
    printf "%s: %.1f instructions per PACKET_IN (%d instructions over %d calls)\n", filter, total / calls, total, calls
  }
' "$out/cg"
