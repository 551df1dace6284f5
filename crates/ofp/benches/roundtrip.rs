//! Decode a PACKET_IN (TCP SYN) + encode two FLOW_MODs and a PACKET_OUT: the controller's
//! per-connection hot path. Reported as round trips per second.

use bytes::BytesMut;
use criterion::{Criterion, Throughput, black_box, criterion_group, criterion_main};

#[path = "../tests/common/roundtrip.rs"]
mod roundtrip;

fn bench(c: &mut Criterion) {
    let frame = roundtrip::packet_in_bytes();
    let mut out = BytesMut::with_capacity(4096);
    let mut g = c.benchmark_group("ofp");
    g.throughput(Throughput::Elements(1));
    g.bench_function("packet_in_to_2_flow_mods_and_packet_out", |b| {
        b.iter(|| roundtrip::round_trip(black_box(&frame), &mut out))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
