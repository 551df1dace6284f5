#!/usr/bin/env bash
# Fuzz the OpenFlow decoder, the stream framer, the controller core (a hostile switch) and
# the configuration parser for a bounded time (default 20 s each).
#   scripts/fuzz.sh [SECONDS]
# cargo-fuzz needs a nightly toolchain; without one this says so and runs the stable smoke
# fuzzer (the same target code over the conformance files plus 200,000 mutations); the
# controller and config targets' stable drivers are tests of their own
# (crates/core/tests/fuzz_controller.rs, fuzz_config.rs).
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-20}"

if ! rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
  echo "fuzz.sh: no nightly toolchain; running the stable fuzz smoke test instead"
  exec cargo test -p flowgate-ofp --test fuzz_smoke
fi
if ! command -v cargo-fuzz >/dev/null 2>&1; then
  cargo install cargo-fuzz --locked
fi
fuzz/seed-corpus.sh
cd fuzz
for target in decode framer controller config; do
  echo "fuzz.sh: $target for ${secs}s"
  cargo +nightly fuzz run "$target" "corpus/$target" -- -max_total_time="$secs" -rss_limit_mb=2048
done
