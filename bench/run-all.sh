#!/usr/bin/env bash
# The runs behind docs/benchmarks.md. Run on an otherwise idle machine, as root (the data
# path bench builds namespaces and an OVS bridge), after scripts/setup-debian.sh and
# `cargo build --release -p flowgate`. Tables land in target/bench/.
set -euxo pipefail
cd "$(dirname "$0")/.."
F=target/release/flowgate
mkdir -p target/bench
$F bench hiccups --secs 10 --out target/bench/hiccups.md
$F bench controller --peers flowgate,osken,ovs-testcontroller -l 10 -w 2 --also-rate-fraction 0.5 -q --out target/bench/controller-throughput.md
$F bench controller --peers flowgate,osken,ovs-testcontroller -l 10 -w 2 --latency -q --out target/bench/controller-latency.md
$F bench controller --peers flowgate,osken -l 10 -w 2 --expire-after 10000 -q --out target/bench/controller-expire.md
$F bench controller --peers flowgate -l 10 -w 2 --rate 10000 -q --out target/bench/controller-rate10k.md
$F bench controller --peers flowgate -l 10 -w 2 --pin --also-rate-fraction 0.1,0.2,0.3,0.5 -q --out target/bench/controller-pinned.md
$F bench controller --peers flowgate,floor -l 10 -w 2 --pin --busy-poll --also-rate-fraction 0.1,0.2,0.3,0.5 --fractions-of-first -q --out target/bench/controller-pinned-busy-poll.md
$F bench controller --peers flowgate,floor -l 10 -w 2 --pin --busy-poll --controller-spin-us 150 --also-rate-fraction 0.1,0.2,0.3,0.5 --fractions-of-first -q --out target/bench/controller-pinned-busy-poll-spin.md
cargo bench -p flowgate-core --features testkit --bench packet_in -- --warm-up-time 1 --measurement-time 3 | tee target/bench/core-packet-in.txt
$F bench memory --out target/bench/memory.md
$F --log warn bench datapath --duration 10 --rounds 5 --cases direct,flowgate-partitioned,flowgate-proactive,ovs-hash,ovs-group,haproxy,nginx,flowgate --out target/bench/datapath.md
