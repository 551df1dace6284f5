//! Round trips per second of *CPU time* of this thread (from /proc/thread-self/stat), for
//! measuring on a loaded machine where criterion's wall-clock figure is diluted.
//! `cargo run --release -p flowgate-ofp --example roundtrip_cpu`

use bytes::BytesMut;

#[path = "../tests/common/roundtrip.rs"]
mod roundtrip;

fn cpu_ticks() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/thread-self/stat").ok()?;
    let rest = s.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

fn main() {
    let frame = roundtrip::packet_in_bytes();
    let mut out = BytesMut::with_capacity(4096);
    for _ in 0..100_000 {
        roundtrip::round_trip(&frame, &mut out);
    }
    let t0 = std::time::Instant::now();
    let c0 = cpu_ticks().unwrap_or(0);
    let mut n = 0u64;
    while t0.elapsed().as_secs_f64() < 4.0 {
        for _ in 0..10_000 {
            std::hint::black_box(roundtrip::round_trip(
                std::hint::black_box(&frame),
                &mut out,
            ));
        }
        n += 10_000;
    }
    let wall = t0.elapsed().as_secs_f64();
    let cpu = (cpu_ticks().unwrap_or(0) - c0) as f64 / 100.0; // USER_HZ = 100
    println!(
        "{n} round trips: {:.0}/s wall-clock, {:.0}/s of CPU time ({cpu:.2}s CPU in {wall:.2}s)",
        n as f64 / wall,
        n as f64 / cpu
    );
}
