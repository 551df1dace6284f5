#!/usr/bin/env bash
# Instructions the controller's core executes per PACKET_IN, counted by callgrind over the
# core's own bench (crates/core/benches/packet_in.rs): everything inside
# `Controller::handle_packet_in_frame`, the encoding of the answers included, per call
# (the difference between a short and a longer run, so the process's one-time costs drop
# out). Unlike a timing it does not move with the host (the same build gives the same
# count to a few hundredths of a per cent), so a change to the PACKET_IN path can be judged
# on a shared VM whose timings move by tens of per cent from run to run. It counts
# instructions, not cycles: cache misses (the connection table's, at millions of entries)
# are not in it; the timed benches say what those cost.
#
# usage: scripts/instructions-per-packet-in.sh [FILTER] [BENCH_BINARY]
#   FILTER        a bench of packet_in.rs (default syn/isslm/0; e.g. syn/refused/0, or
#                 syn-16-services/isslm/0 for the controller bench's 16 services)
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
# Prints "instructions calls" for a run of $1 seconds.
count() {
  valgrind --tool=callgrind --callgrind-out-file="$out/cg$1" \
    --toggle-collect='*Controller::handle_packet_in_frame*' \
    "$bin" --bench --profile-time "$1" "$filter" >/dev/null 2>"$out/log" \
    || { cat "$out/log" >&2; exit 1; }
  awk '
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
      print total, calls
    }
  ' "$out/cg$1"
}
# The process pays some costs once (its outbox's buffers grow to their size, each rule
# shape's template is built): a few hundred thousand instructions, which a run's
# average spreads over however many calls the run made. Two runs of different lengths
# give what one more PACKET_IN costs, whatever the number of calls.
# (Command substitutions, so that a failed run stops the script under `set -e`.)
short="$(count 1)"
long="$(count 4)"
read -r i1 n1 <<< "$short"
read -r i2 n2 <<< "$long"
awk -v f="$filter" -v i1="$i1" -v n1="$n1" -v i2="$i2" -v n2="$n2" 'BEGIN {
  if (n2 <= n1) { print "the longer run made no more calls (" n1 ", " n2 ")" > "/dev/stderr"; exit 1 }
  printf "%s: %.1f instructions per PACKET_IN (%d more instructions over %d more calls; the longer run averaged %.1f over its %d calls, its one-time costs included)\n", f, (i2 - i1) / (n2 - n1), i2 - i1, n2 - n1, i2 / n2, n2
}'
