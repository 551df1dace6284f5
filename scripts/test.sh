#!/usr/bin/env bash
# The project's test command (README, CI): setup, then every test of the workspace.
#   FLOWGATE_SKIP_SETUP=1 scripts/test.sh    # skip package installs / OVS start
# Extra arguments go to `cargo nextest run`.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${FLOWGATE_SKIP_SETUP:-0}" != "1" ]; then
  scripts/setup-debian.sh
fi

if ! cargo nextest --version >/dev/null 2>&1; then
  echo "test.sh: cargo-nextest missing; installing" >&2
  cargo install cargo-nextest --locked
fi

# The doc tests, and the codec's fuzz targets for a short bounded time.
cargo test --workspace --doc
# The API docs build without a warning (broken links included), private items too.
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --features flowgate-core/testkit --no-deps --document-private-items
scripts/fuzz.sh "${FLOWGATE_FUZZ_SECS:-20}"
# Networks of earlier runs killed outright (a nextest timeout's SIGKILL): each test removes
# its own prefix's (cleanup_stale), but a root-namespace address left by another test would
# capture this run's traffic meanwhile. The sweep takes only prefixes whose owner process
# is gone (see flowgate_testbed::sweep_orphans), so concurrent live runs keep theirs.
if [ "$(id -u)" = 0 ]; then
  cargo run -q -p flowgate-testbed --bin fg-testbed-tools -- sweep ||
    echo "test.sh: the sweep of dead runs' networks failed; testing anyway" >&2
fi
# Every other test, last, so its summary closes the run. The OVS tests are serialized by
# the `ovs` test group in .config/nextest.toml.
cargo nextest run --workspace --no-fail-fast --profile "${NEXTEST_PROFILE:-ci}" "$@"
