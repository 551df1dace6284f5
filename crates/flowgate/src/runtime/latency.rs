//! The decision-latency histogram: how long the core takes per PACKET_IN, measured by the
//! sessions around the core call and exported by `/metrics`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds (inclusive, nanoseconds) of the decision latency buckets: 1 µs to 100 ms,
/// 1-2.5-5 steps.
pub const LATENCY_BOUNDS_NS: [u64; 16] = [
    1_000,
    2_500,
    5_000,
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
];

/// A fixed-bucket histogram of durations. Observing is a few relaxed atomic adds: no lock,
/// no allocation.
#[derive(Debug, Default)]
pub struct LatencyHistogram {
    /// Per-bucket (not cumulative) counts; the last one is above the largest bound.
    buckets: [AtomicU64; LATENCY_BOUNDS_NS.len() + 1],
    sum_ns: AtomicU64,
}

impl LatencyHistogram {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn observe(&self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let i = LATENCY_BOUNDS_NS
            .iter()
            .position(|&b| ns <= b)
            .unwrap_or(LATENCY_BOUNDS_NS.len());
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// Cumulative counts per bound (the last is `+Inf`, the total) and the sum in seconds.
    pub fn snapshot(&self) -> ([u64; LATENCY_BOUNDS_NS.len() + 1], f64) {
        let mut out = [0u64; LATENCY_BOUNDS_NS.len() + 1];
        let mut acc = 0u64;
        for (o, b) in out.iter_mut().zip(self.buckets.iter()) {
            acc += b.load(Ordering::Relaxed);
            *o = acc;
        }
        (out, self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9)
    }
}
