//! Decision cost of every balancing algorithm, and of one metrics refresh.
//!
//! `cargo bench -p flowgate-core --bench balance -- --warm-up-time 1 --measurement-time 2`
//!
//! * `select/<n>/<algorithm>`: one `Balancer::select` over `n` backends (4, 64, 1,024)
//!   with realistic random loads: 95 % eligible, weights 1-100, one in ten backends in
//!   slow start (a ramp fraction of 0.01-1), 0-200 active
//!   connections, 0-2,000 rps against an ISSLM threshold of 1,500 (about a quarter of the
//!   backends over it), a few picks since the refresh, 1-50 ms response times, CPU and
//!   capacity on half of them, 10 % stale. Behind a VIP (no `requested`). Throughput is
//!   reported in decisions per second. Target: < 1 µs per decision at 64 backends.
//! * `select/<n>/isslm-all-over`: ISSLM's worst case, every backend over the threshold,
//!   so every decision runs all five tries before `NoOptimalServer`.
//! * `on_refresh/<n>/<algorithm>`: one `Balancer::on_refresh` (per 10 ms metrics tick).

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use flowgate_core::balance::{
    AlgorithmKind, AlgorithmParams, BackendLoad, Balancer, SelectRequest,
};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const SIZES: [usize; 3] = [4, 64, 1024];
const TICK: Duration = Duration::from_millis(10);

fn params() -> AlgorithmParams {
    AlgorithmParams {
        threshold_rps: Some(1500.0),
        ..AlgorithmParams::default()
    }
}

fn loads(n: usize, rng: &mut SmallRng) -> Vec<BackendLoad> {
    (0..n)
        .map(|_| BackendLoad {
            eligible: rng.gen_bool(0.95),
            weight: rng.gen_range(1..=100),
            active_connections: rng.gen_range(0..200),
            rps: rng.gen_range(0.0..2000.0),
            picks_since_refresh: rng.gen_range(0..5),
            response_time_ms: rng.gen_bool(0.95).then(|| rng.gen_range(1.0..50.0)),
            cpu: rng.gen_bool(0.5).then(|| rng.gen_range(0.0..1.0)),
            capacity_rps: rng.gen_bool(0.5).then_some(2000.0),
            metrics_fresh: rng.gen_bool(0.9),
        })
        .collect()
}

/// A balancer that has seen `refreshes` ticks of varying load (MRBS leaves warm-up).
fn warmed(kind: AlgorithmKind, n: usize, rng: &mut SmallRng) -> (Balancer, Vec<BackendLoad>) {
    let mut b = Balancer::new(kind, params(), n, 1);
    for i in (0..n).step_by(10) {
        b.set_ramp(i, Some(rng.gen_range(0.01..1.0)));
    }
    let mut l = loads(n, rng);
    for _ in 0..100 {
        l = loads(n, rng);
        b.on_refresh(&l, TICK);
    }
    (b, l)
}

fn select(c: &mut Criterion) {
    let mut rng = SmallRng::seed_from_u64(0x5eed);
    for n in SIZES {
        let mut g = c.benchmark_group(format!("select/{n}"));
        g.throughput(Throughput::Elements(1));
        for &kind in AlgorithmKind::ALL {
            let (mut b, l) = warmed(kind, n, &mut rng);
            let mut req = SelectRequest {
                since_refresh: Duration::from_millis(4),
                ..Default::default()
            };
            g.bench_function(BenchmarkId::from_parameter(kind), |bench| {
                bench.iter(|| {
                    req.flow_hash = req.flow_hash.wrapping_add(0x9e37_79b9_7f4a_7c15);
                    black_box(b.select(black_box(&req), black_box(&l)))
                })
            });
        }
        // ISSLM worst case: every backend over the threshold.
        let (mut b, mut l) = warmed(AlgorithmKind::Isslm, n, &mut rng);
        for x in &mut l {
            x.rps += 2000.0;
            x.eligible = true;
        }
        b.on_refresh(&l, TICK);
        let req = SelectRequest {
            since_refresh: Duration::from_millis(4),
            ..Default::default()
        };
        g.bench_function(BenchmarkId::from_parameter("isslm-all-over"), |bench| {
            bench.iter(|| black_box(b.select(black_box(&req), black_box(&l))))
        });
        g.finish();
    }
}

fn refresh(c: &mut Criterion) {
    let mut rng = SmallRng::seed_from_u64(0xfeed);
    for n in SIZES {
        let mut g = c.benchmark_group(format!("on_refresh/{n}"));
        for &kind in AlgorithmKind::ALL {
            let (mut b, l) = warmed(kind, n, &mut rng);
            g.bench_function(BenchmarkId::from_parameter(kind), |bench| {
                bench.iter(|| b.on_refresh(black_box(&l), black_box(TICK)))
            });
        }
        g.finish();
    }
}

criterion_group!(benches, select, refresh);
criterion_main!(benches);
