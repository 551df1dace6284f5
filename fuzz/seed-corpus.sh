#!/usr/bin/env bash
# Copy the Ryu OpenFlow 1.3 conformance messages, and the example configurations, into the
# fuzz corpora.
# Usage: fuzz/seed-corpus.sh [CONFORMANCE_DIR]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
src="${1:-${FLOWGATE_CONFORMANCE_DIR:-$here/../crates/ofp/tests/data/ryu-of13}}"
for t in decode framer; do
    mkdir -p "$here/corpus/$t"
    for f in "$src"/*.packet; do
        # framer's first 8 bytes are chunk sizes; prefix them so the message stays whole.
        if [ "$t" = framer ]; then
            { printf '\x07\x00\x03\x1f\x01\x40\x02\x09'; cat "$f"; cat "$f"; } > "$here/corpus/$t/$(basename "$f")"
        else
            cp "$f" "$here/corpus/$t/"
        fi
    done
done
# The config target starts from the example configurations, the controller target from
# programs that reach the decisions (written by crates/core/tests/fuzz_controller.rs).
mkdir -p "$here/corpus/config" "$here/corpus/controller"
cp "$here"/../examples/*.toml "$here/corpus/config/"
cp "$here"/seeds/controller/* "$here/corpus/controller/"
echo "seeded $(ls "$here/corpus/decode" | wc -l) files into each of $here/corpus/{decode,framer}"
