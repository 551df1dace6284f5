use std::time::Duration;

use super::*;

const MS10: Duration = Duration::from_millis(10);

fn pool(n: usize) -> Vec<BackendLoad> {
    (0..n).map(|_| BackendLoad::new(1)).collect()
}

fn params() -> AlgorithmParams {
    AlgorithmParams {
        threshold_rps: Some(100.0),
        ..AlgorithmParams::default()
    }
}

fn bal(kind: AlgorithmKind, n: usize) -> Balancer {
    Balancer::new(kind, params(), n, 7)
}

fn req() -> SelectRequest {
    SelectRequest::default()
}

fn to(r: usize) -> SelectRequest {
    SelectRequest {
        requested: Some(r),
        ..SelectRequest::default()
    }
}

/// `count` selections without a refresh, updating picks (and active connections) the way
/// the core does; returns how many each backend got.
fn burst(
    b: &mut Balancer,
    r: &SelectRequest,
    pool: &mut [BackendLoad],
    count: usize,
) -> Vec<usize> {
    let mut got = vec![0; pool.len()];
    for _ in 0..count {
        let s = b.select(r, pool);
        if let Some(i) = s.backend {
            got[i] += 1;
            pool[i].picks_since_refresh += 1;
            pool[i].active_connections += 1;
        }
    }
    got
}

fn pick(b: &mut Balancer, pool: &[BackendLoad]) -> Option<usize> {
    b.select(&req(), pool).backend
}

// ---- names and params ---------------------------------------------------------------

#[test]
fn names_round_trip() {
    assert_eq!(AlgorithmKind::ALL.len(), 11);
    for &k in AlgorithmKind::ALL {
        assert_eq!(k.to_string().parse::<AlgorithmKind>(), Ok(k));
        assert_eq!(
            k.as_str().to_ascii_uppercase().replace('-', "_").parse(),
            Ok(k)
        );
    }
    let names: Vec<String> = AlgorithmKind::ALL.iter().map(|k| k.to_string()).collect();
    assert_eq!(
        names,
        [
            "none",
            "round-robin",
            "weighted-round-robin",
            "least-connections",
            "random",
            "p2c",
            "isslm",
            "dwrs",
            "mrbs",
            "amlob",
            "srt"
        ]
    );
    assert_eq!("rr".parse(), Ok(AlgorithmKind::RoundRobin));
    assert_eq!("leastconn".parse(), Ok(AlgorithmKind::LeastConnections));
    let e = "maglev".parse::<AlgorithmKind>().expect_err("unknown name");
    assert!(e.to_string().contains("least-connections"), "{e}");
}

#[test]
fn validate_params() {
    let p = AlgorithmParams::default();
    assert!(
        p.validate(AlgorithmKind::Isslm)
            .expect_err("no threshold")
            .contains("threshold_rps")
    );
    for &k in AlgorithmKind::ALL {
        if k != AlgorithmKind::Isslm {
            assert_eq!(p.validate(k), Ok(()), "{k}");
        }
    }
    assert_eq!(params().validate(AlgorithmKind::Isslm), Ok(()));
    let bad = |f: fn(&mut AlgorithmParams), k| {
        let mut p = params();
        f(&mut p);
        p.validate(k).is_err()
    };
    assert!(bad(
        |p| p.threshold_rps = Some(f64::NAN),
        AlgorithmKind::Isslm
    ));
    assert!(bad(|p| p.threshold_rps = Some(0.0), AlgorithmKind::Isslm));
    assert!(bad(|p| p.hysteresis = 1.0, AlgorithmKind::Isslm));
    assert!(bad(|p| p.isslm_tries = 0, AlgorithmKind::Isslm));
    assert!(bad(|p| p.dwrs_min_weight = 0.0, AlgorithmKind::Dwrs));
    assert!(bad(
        |p| p.srt_stale_half_life = Duration::ZERO,
        AlgorithmKind::Srt
    ));
    assert!(bad(|p| p.mrbs_learning_rate = -1.0, AlgorithmKind::Mrbs));
    assert!(bad(
        |p| p.rps_window = Some(Duration::ZERO),
        AlgorithmKind::Random
    ));
}

// ---- every algorithm: degenerate pools ----------------------------------------------

#[test]
fn empty_pool_every_algorithm() {
    for &k in AlgorithmKind::ALL {
        let mut b = bal(k, 0);
        b.on_refresh(&[], MS10);
        let s = b.select(&req(), &[]);
        assert_eq!(
            s,
            Selection {
                backend: None,
                outcome: Outcome::NoEligible
            },
            "{k}"
        );
        let s = b.select(&to(3), &[]);
        assert_eq!(s.backend, None, "{k}");
    }
}

#[test]
fn all_ineligible_or_weight_zero_every_algorithm() {
    for &k in AlgorithmKind::ALL {
        for variant in 0..2 {
            let mut p = pool(4);
            for x in &mut p {
                if variant == 0 {
                    x.eligible = false;
                } else {
                    x.weight = 0;
                }
            }
            let mut b = bal(k, 4);
            b.on_refresh(&p, MS10);
            let s = b.select(&req(), &p);
            assert_eq!(s, Selection::NONE_ELIGIBLE, "{k} variant {variant}");
            let s = b.select(&to(1), &p);
            if k == AlgorithmKind::None {
                // Plain forwarding honours what the client addressed.
                assert_eq!(
                    s,
                    Selection {
                        backend: Some(1),
                        outcome: Outcome::Requested
                    }
                );
            } else {
                assert_eq!(
                    s,
                    Selection::NONE_ELIGIBLE,
                    "{k} variant {variant} requested"
                );
            }
        }
    }
}

#[test]
fn weight_zero_gets_nothing_every_algorithm() {
    for &k in AlgorithmKind::ALL {
        if k == AlgorithmKind::None {
            continue;
        }
        let mut p = pool(3);
        p[1].weight = 0;
        let mut b = bal(k, 3);
        for _ in 0..60 {
            b.on_refresh(&p, MS10);
        }
        let got = burst(&mut b, &req(), &mut p, 300);
        assert_eq!(got[1], 0, "{k}: {got:?}");
        assert!(got[0] > 0 && got[2] > 0, "{k}: {got:?}");
    }
}

#[test]
fn garbage_metrics_never_panic() {
    let weird = [
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        -5.0,
        0.0,
        1e308,
        5.0,
    ];
    for &k in AlgorithmKind::ALL {
        let mut b = bal(k, 7);
        let mut p: Vec<BackendLoad> = (0..7)
            .map(|i| BackendLoad {
                eligible: i != 3,
                weight: [1, 0, u32::MAX, 1, 7, 1, 2][i],
                active_connections: [0, u32::MAX, 3, 0, 1, 2, 9][i],
                rps: weird[i],
                picks_since_refresh: [0, u32::MAX, 0, 1, 0, 0, 2][i],
                response_time_ms: Some(weird[(i + 1) % 7]),
                cpu: Some(weird[(i + 2) % 7]),
                capacity_rps: Some(weird[(i + 3) % 7]),
                metrics_fresh: i % 2 == 0,
            })
            .collect();
        for round in 0..100 {
            b.on_refresh(&p, if round % 3 == 0 { Duration::ZERO } else { MS10 });
            for r in [req(), to(2), to(3), to(99)] {
                let r = SelectRequest {
                    since_refresh: Duration::from_micros(round),
                    ..r
                };
                let s = b.select(&r, &p);
                if let Some(i) = s.backend {
                    assert!(i < p.len(), "{k}");
                    if k != AlgorithmKind::None {
                        assert!(usable(&p[i]), "{k} picked unusable {i}");
                    }
                }
            }
            p[round as usize % 7].rps = weird[(round as usize * 3) % 7];
        }
    }
}

#[test]
fn deterministic_for_a_seed() {
    for &k in AlgorithmKind::ALL {
        let mut p = pool(16);
        for (i, x) in p.iter_mut().enumerate() {
            x.rps = (i * 13 % 7) as f64 * 10.0;
            x.response_time_ms = Some((i * 7 % 5) as f64 + 1.0);
            x.active_connections = (i * 3 % 4) as u32;
        }
        let run = || {
            let mut b = Balancer::new(k, params(), 16, 42);
            let mut q = p.clone();
            b.on_refresh(&q, MS10);
            burst(&mut b, &req(), &mut q, 200)
        };
        assert_eq!(run(), run(), "{k}");
    }
}

#[test]
fn resize_remove_and_longer_slice() {
    for &k in AlgorithmKind::ALL {
        let mut b = bal(k, 2);
        let p = pool(5);
        // Slice longer than the sized pool: state grows, every backend reachable.
        let mut seen = [false; 5];
        for _ in 0..200 {
            b.on_refresh(&p, MS10);
            if let Some(i) = pick(&mut b, &p) {
                seen[i] = true;
            }
        }
        assert_eq!(b.n_backends(), 5, "{k}");
        if !matches!(k, AlgorithmKind::None) {
            assert!(seen.iter().all(|s| *s), "{k}: {seen:?}");
        }
        b.remove_backend(1);
        b.remove_backend(99);
        assert_eq!(b.n_backends(), 4);
        b.resize(1);
        assert!(pick(&mut b, &p[..1]).is_some(), "{k}");
        b.resize(0);
        assert_eq!(pick(&mut b, &[]), None);
    }
}

#[test]
fn requested_outcomes_for_free_choice_algorithms() {
    let mut b = bal(AlgorithmKind::RoundRobin, 3);
    let p = pool(3);
    assert_eq!(
        b.select(&to(0), &p),
        Selection {
            backend: Some(0),
            outcome: Outcome::Requested
        }
    );
    assert_eq!(
        b.select(&to(0), &p),
        Selection {
            backend: Some(1),
            outcome: Outcome::Moved {
                from: 0,
                search: None
            }
        }
    );
    assert_eq!(
        b.select(&to(9), &p),
        Selection {
            backend: Some(2),
            outcome: Outcome::Chosen
        }
    );
}

// ---- none ---------------------------------------------------------------------------

#[test]
fn none_policy() {
    let mut p = pool(3);
    let mut b = Balancer::new(
        AlgorithmKind::None,
        AlgorithmParams {
            none_target: Some(2),
            ..params()
        },
        3,
        1,
    );
    p[0].rps = 1e9; // load is ignored
    assert_eq!(
        b.select(&to(0), &p),
        Selection {
            backend: Some(0),
            outcome: Outcome::Requested
        }
    );
    for _ in 0..5 {
        assert_eq!(
            b.select(&req(), &p),
            Selection {
                backend: Some(2),
                outcome: Outcome::Chosen
            }
        );
    }
    p[2].eligible = false; // configured server down: first usable
    assert_eq!(pick(&mut b, &p), Some(0));
    // Out-of-range requested falls back to the target logic.
    assert_eq!(b.select(&to(7), &p).backend, Some(0));
    let mut b = bal(AlgorithmKind::None, 3);
    p[0].eligible = false;
    assert_eq!(pick(&mut b, &p), Some(1));
}

// ---- round robin (CRRM) -------------------------------------------------------------

#[test]
fn round_robin_skips_unusable() {
    let mut p = pool(4);
    p[1].eligible = false;
    let mut b = bal(AlgorithmKind::RoundRobin, 4);
    let seq: Vec<_> = (0..6).map(|_| pick(&mut b, &p).unwrap_or(99)).collect();
    assert_eq!(seq, [0, 2, 3, 0, 2, 3]);
    p[1].eligible = true;
    p[3].weight = 0;
    let seq: Vec<_> = (0..4).map(|_| pick(&mut b, &p).unwrap_or(99)).collect();
    assert_eq!(seq, [0, 1, 2, 0]);
}

// ---- smooth WRR ---------------------------------------------------------------------

#[test]
fn smooth_wrr_matches_nginx() {
    let mut p = pool(3);
    p[0].weight = 5;
    let mut b = bal(AlgorithmKind::WeightedRoundRobin, 3);
    let seq: Vec<_> = (0..14).map(|_| pick(&mut b, &p).unwrap_or(99)).collect();
    // nginx's {a:5, b:1, c:1} example: a a b a c a a, repeating.
    assert_eq!(seq, [0, 0, 1, 0, 2, 0, 0, 0, 0, 1, 0, 2, 0, 0]);
}

#[test]
fn smooth_wrr_shares() {
    let mut p = pool(4);
    for (i, x) in p.iter_mut().enumerate() {
        x.weight = i as u32 + 1;
    }
    let mut b = bal(AlgorithmKind::WeightedRoundRobin, 4);
    let got = burst(&mut b, &req(), &mut p, 1000);
    assert_eq!(got, [100, 200, 300, 400]);
}

// ---- least connections --------------------------------------------------------------

#[test]
fn least_connections_hand_cases() {
    let mut p = pool(4);
    for (x, c) in p.iter_mut().zip([3, 1, 1, 2]) {
        x.active_connections = c;
    }
    let mut b = bal(AlgorithmKind::LeastConnections, 4);
    // Keys (c+1)/w = 4, 2, 2, 3: ties between 1 and 2 rotate.
    assert_eq!(pick(&mut b, &p), Some(1));
    assert_eq!(pick(&mut b, &p), Some(2));
    assert_eq!(pick(&mut b, &p), Some(1));
    // Weighted: (4+1)/1 = 5 vs (9+1)/3 = 3.33.
    let mut q = pool(2);
    q[0].active_connections = 4;
    q[1].active_connections = 9;
    q[1].weight = 3;
    assert_eq!(pick(&mut b, &q), Some(1));
    // Picks since refresh count: 0 conns + 5 picks loses to 3 conns.
    let mut q = pool(2);
    q[0].picks_since_refresh = 5;
    q[1].active_connections = 3;
    assert_eq!(pick(&mut b, &q), Some(1));
}

#[test]
fn least_connections_burst_spreads() {
    let mut p = pool(4);
    let mut b = bal(AlgorithmKind::LeastConnections, 4);
    assert_eq!(burst(&mut b, &req(), &mut p, 100), [25, 25, 25, 25]);
    // Equal idle pool, one pick at a time with no pick accounting: rotation, not index 0.
    let q = pool(4);
    let seq: Vec<_> = (0..5).map(|_| pick(&mut b, &q).unwrap_or(99)).collect();
    assert_eq!(seq, [0, 1, 2, 3, 0]);
}

// ---- random -------------------------------------------------------------------------

fn shares(got: &[usize]) -> Vec<f64> {
    let total: usize = got.iter().sum();
    got.iter().map(|&g| g as f64 / total as f64).collect()
}

fn assert_shares(got: &[usize], want: &[f64], tol: f64) {
    for (i, (s, w)) in shares(got).iter().zip(want).enumerate() {
        if *w == 0.0 {
            assert_eq!(got[i], 0, "{got:?}");
        } else {
            assert!(
                (s - w).abs() <= tol * w,
                "backend {i}: share {s} want {w} ±{tol}: {got:?}"
            );
        }
    }
}

#[test]
fn weighted_random_distribution() {
    let mut p = pool(5);
    for (x, w) in p.iter_mut().zip([1, 2, 3, 4, 9]) {
        x.weight = w;
    }
    p[4].eligible = false;
    let mut b = bal(AlgorithmKind::Random, 5);
    let mut got = vec![0; 5];
    for _ in 0..100_000 {
        got[pick(&mut b, &p).unwrap_or(4)] += 1;
    }
    assert_shares(&got, &[0.1, 0.2, 0.3, 0.4, 0.0], 0.05);
}

// ---- p2c ----------------------------------------------------------------------------

#[test]
fn p2c_picks_lesser_of_two() {
    let mut b = bal(AlgorithmKind::P2c, 3);
    let mut p = pool(3);
    for (x, c) in p.iter_mut().zip([0, 10, 20]) {
        x.active_connections = c;
    }
    let mut got = vec![0; 3];
    for _ in 0..30_000 {
        got[pick(&mut b, &p).unwrap_or(0)] += 1;
    }
    // Pairs are uniform: {0,1}→0, {0,2}→0, {1,2}→1; the worst is never chosen.
    assert_shares(&got, &[2.0 / 3.0, 1.0 / 3.0, 0.0], 0.05);
    // Two equal backends: ties random, about half each.
    let q = pool(2);
    let mut got = vec![0; 2];
    for _ in 0..20_000 {
        got[pick(&mut b, &q).unwrap_or(0)] += 1;
    }
    assert_shares(&got, &[0.5, 0.5], 0.05);
    // A single usable backend among many.
    let mut q = pool(64);
    for x in q.iter_mut().skip(1) {
        x.eligible = false;
    }
    q[0].eligible = false;
    q[40].eligible = true;
    for _ in 0..50 {
        assert_eq!(pick(&mut b, &q), Some(40));
    }
}

// ---- ISSLM --------------------------------------------------------------------------

fn isslm_pool(rps: &[f64]) -> Vec<BackendLoad> {
    rps.iter()
        .map(|&r| BackendLoad {
            rps: r,
            ..BackendLoad::new(1)
        })
        .collect()
}

#[test]
fn isslm_below_threshold_keeps_requested() {
    let p = isslm_pool(&[99.0, 0.0, 0.0]);
    let mut b = bal(AlgorithmKind::Isslm, 3);
    b.on_refresh(&p, MS10);
    assert_eq!(
        b.select(&to(0), &p),
        Selection {
            backend: Some(0),
            outcome: Outcome::Requested
        }
    );
}

#[test]
fn isslm_moves_to_lesser_request_load() {
    // T = 100, W = 10 ms, since = 0: effective load = rps.
    let p = isslm_pool(&[150.0, 80.0, 30.0, 60.0]);
    let mut b = bal(AlgorithmKind::Isslm, 4);
    b.on_refresh(&p, MS10);
    assert_eq!(
        b.select(&to(0), &p),
        Selection {
            backend: Some(2),
            outcome: Outcome::Moved {
                from: 0,
                search: Some(Search::RequestLoad)
            }
        }
    );
    // Exactly at the threshold counts as over (">=").
    let p = isslm_pool(&[100.0, 80.0, 30.0]);
    assert_eq!(b.select(&to(0), &p).backend, Some(2));
}

#[test]
fn isslm_vip_uses_round_robin_base() {
    let mut p = isslm_pool(&[10.0, 10.0, 500.0, 10.0]);
    p[3].rps = 20.0;
    let mut b = bal(AlgorithmKind::Isslm, 4);
    b.on_refresh(&p, MS10);
    let got: Vec<_> = (0..4).map(|_| b.select(&req(), &p)).collect();
    assert_eq!(
        got[0],
        Selection {
            backend: Some(0),
            outcome: Outcome::Requested
        }
    );
    assert_eq!(
        got[1],
        Selection {
            backend: Some(1),
            outcome: Outcome::Requested
        }
    );
    assert_eq!(
        got[2].outcome,
        Outcome::Moved {
            from: 2,
            search: Some(Search::RequestLoad)
        }
    );
    assert_eq!(
        got[3],
        Selection {
            backend: Some(3),
            outcome: Outcome::Requested
        }
    );
}

#[test]
fn isslm_every_backend_over_is_no_optimal_server() {
    let p = isslm_pool(&[150.0, 120.0, 100.0, 300.0]);
    let mut b = bal(AlgorithmKind::Isslm, 4);
    b.on_refresh(&p, MS10);
    // The flow stays on the requested server.
    assert_eq!(
        b.select(&to(1), &p),
        Selection {
            backend: Some(1),
            outcome: Outcome::NoOptimalServer
        }
    );
    // Behind a VIP: the base choice keeps it.
    assert_eq!(
        b.select(&req(), &p),
        Selection {
            backend: Some(0),
            outcome: Outcome::NoOptimalServer
        }
    );
    // Requested server down and every other over: nowhere to go.
    let mut q = p.clone();
    q[1].eligible = false;
    assert_eq!(
        b.select(&to(1), &q),
        Selection {
            backend: None,
            outcome: Outcome::NoOptimalServer
        }
    );
    // Requested server down, another one fine: moved.
    q[3].rps = 5.0;
    b.on_refresh(&q, MS10);
    assert_eq!(
        b.select(&to(1), &q).outcome,
        Outcome::Moved {
            from: 1,
            search: Some(Search::RequestLoad)
        }
    );
    // Nothing usable at all.
    for x in &mut q {
        x.eligible = false;
    }
    assert_eq!(b.select(&to(1), &q), Selection::NONE_ELIGIBLE);
}

#[test]
fn isslm_hysteresis_latch_prevents_flapping() {
    // T = 100, hysteresis 0.1: over at >= 100, back under only below 90.
    let mut b = bal(AlgorithmKind::Isslm, 2);
    let mut seq = Vec::new();
    let mut latch = Vec::new();
    for rps in [
        95.0, 101.0, 97.0, 99.0, 93.0, 91.0, 89.0, 95.0, 99.0, 100.0, 96.0,
    ] {
        let p = isslm_pool(&[rps, 10.0]);
        b.on_refresh(&p, MS10);
        latch.push(b.is_over(0));
        seq.push(b.select(&to(0), &p).backend.unwrap_or(9));
    }
    assert_eq!(
        latch,
        [
            false, true, true, true, true, true, false, false, false, true, true
        ]
    );
    assert_eq!(seq, [0, 1, 1, 1, 1, 1, 0, 0, 0, 1, 1]);
    // Without hysteresis the same trace flaps on every crossing.
    let mut b = Balancer::new(
        AlgorithmKind::Isslm,
        AlgorithmParams {
            hysteresis: 0.0,
            ..params()
        },
        2,
        7,
    );
    let mut seq = Vec::new();
    for rps in [95.0, 101.0, 97.0, 101.0, 99.0, 100.0, 98.0] {
        let p = isslm_pool(&[rps, 10.0]);
        b.on_refresh(&p, MS10);
        seq.push(b.select(&to(0), &p).backend.unwrap_or(9));
    }
    assert_eq!(seq, [0, 1, 0, 1, 0, 1, 0]);
}

#[test]
fn isslm_stale_target_rejected_and_second_search_used() {
    // Requested 0 is over. Backend 1 has the lowest RPS but stale metrics: rejected by
    // the first search; the second search (fewest connections) proposes 3 in the same
    // try and it is accepted — not 2, which a deeper first search would have chosen.
    let mut p = isslm_pool(&[150.0, 10.0, 50.0, 70.0]);
    for (x, c) in p.iter_mut().zip([0, 4, 5, 1]) {
        x.active_connections = c;
    }
    p[1].metrics_fresh = false;
    let mut b = bal(AlgorithmKind::Isslm, 4);
    b.on_refresh(&p, MS10);
    assert_eq!(
        b.select(&to(0), &p),
        Selection {
            backend: Some(3),
            outcome: Outcome::Moved {
                from: 0,
                search: Some(Search::Connections)
            }
        }
    );
    // A stale requested server still takes flows addressed to it when under threshold.
    assert_eq!(
        b.select(&to(1), &p),
        Selection {
            backend: Some(1),
            outcome: Outcome::Requested
        }
    );
    // Third search: response time decides when RPS and connection leaders are stale.
    let mut p = isslm_pool(&[150.0, 10.0, 50.0, 70.0]);
    for (x, (c, rt)) in p.iter_mut().zip([(0, 1.0), (0, 9.0), (5, 8.0), (7, 2.0)]) {
        x.active_connections = c;
        x.response_time_ms = Some(rt);
    }
    p[1].metrics_fresh = false;
    assert_eq!(
        b.select(&to(0), &p),
        Selection {
            backend: Some(3),
            outcome: Outcome::Moved {
                from: 0,
                search: Some(Search::ResponseTime)
            }
        }
    );
}

#[test]
fn isslm_tries_bound_the_search() {
    // 15 stale backends lead every ranking; the only good target is 16th in each.
    let mut p = isslm_pool(&[500.0; 17]);
    for x in p.iter_mut().skip(1).take(15) {
        *x = BackendLoad {
            rps: 0.0,
            response_time_ms: Some(1.0),
            metrics_fresh: false,
            ..*x
        };
    }
    p[16] = BackendLoad {
        rps: 50.0,
        active_connections: 10,
        response_time_ms: Some(50.0),
        ..BackendLoad::new(1)
    };
    let mut b = bal(AlgorithmKind::Isslm, 17);
    b.on_refresh(&p, MS10);
    assert_eq!(
        b.select(&to(0), &p),
        Selection {
            backend: Some(0),
            outcome: Outcome::NoOptimalServer
        }
    );
    let mut b = Balancer::new(
        AlgorithmKind::Isslm,
        AlgorithmParams {
            isslm_tries: 16,
            ..params()
        },
        17,
        7,
    );
    b.on_refresh(&p, MS10);
    assert_eq!(b.select(&to(0), &p).backend, Some(16));
}

#[test]
fn isslm_burst_of_moves_spreads() {
    // T = 10k/s, W = 10 ms, 5 ms into the window: each pick adds 1/0.015 s ≈ 67/s.
    let mut p = isslm_pool(&[20_000.0, 100.0, 100.0, 100.0]);
    let mut b = Balancer::new(
        AlgorithmKind::Isslm,
        AlgorithmParams {
            threshold_rps: Some(10_000.0),
            ..params()
        },
        4,
        7,
    );
    b.on_refresh(&p, MS10);
    let r = SelectRequest {
        requested: Some(0),
        since_refresh: Duration::from_millis(5),
        ..req()
    };
    let got = burst(&mut b, &r, &mut p, 100);
    assert_eq!(got[0], 0);
    for g in &got[1..] {
        assert!((33..=34).contains(g), "{got:?}");
    }
}

#[test]
fn isslm_picks_push_a_target_over_threshold() {
    // T = 100/s, W = 10 ms, since = 0: one pick = +100/s, so each target takes one.
    let mut p = isslm_pool(&[500.0, 0.0, 0.0]);
    let mut b = bal(AlgorithmKind::Isslm, 3);
    b.on_refresh(&p, MS10);
    let got: Vec<_> = (0..3)
        .map(|_| {
            let s = b.select(&to(0), &p);
            if let Some(i) = s.backend {
                p[i].picks_since_refresh += 1;
            }
            s
        })
        .collect();
    assert_eq!(got[0].backend, Some(1));
    assert_eq!(got[1].backend, Some(2));
    assert_eq!(
        got[2],
        Selection {
            backend: Some(0),
            outcome: Outcome::NoOptimalServer
        }
    );
}

#[test]
fn effective_rps_blend() {
    let x = BackendLoad {
        rps: 900.0,
        picks_since_refresh: 9,
        ..BackendLoad::new(1)
    };
    // Steady state at the end of a window: still 900/s (the plain sum would say 1800).
    assert!((effective_rps(&x, MS10, MS10) - 900.0).abs() < 1e-9);
    // Burst right after a refresh: 900 + 9/0.01.
    assert!((effective_rps(&x, Duration::ZERO, MS10) - 1800.0).abs() < 1e-9);
    // Tiny windows are guarded (1 ms floor).
    let y = BackendLoad {
        rps: f64::NAN,
        picks_since_refresh: 1,
        ..BackendLoad::new(1)
    };
    assert!((effective_rps(&y, Duration::ZERO, Duration::ZERO) - 1000.0).abs() < 1e-9);
}

#[test]
fn isslm_without_threshold_never_moves() {
    let p = isslm_pool(&[1e9, 0.0]);
    let mut b = Balancer::new(AlgorithmKind::Isslm, AlgorithmParams::default(), 2, 1);
    b.on_refresh(&p, MS10);
    assert_eq!(b.select(&to(0), &p).outcome, Outcome::Requested);
}

// ---- DWRS ---------------------------------------------------------------------------

#[test]
fn dwrs_headroom_weights() {
    // Capacity 100: loads 0, .5, .9, 1.2 → weights 1, .5, .1, w_min .05.
    let mut p = isslm_pool(&[0.0, 50.0, 90.0, 120.0]);
    for x in &mut p {
        x.capacity_rps = Some(100.0);
    }
    let mut b = bal(AlgorithmKind::Dwrs, 4);
    b.on_refresh(&p, MS10);
    let mut got = vec![0; 4];
    for _ in 0..100_000 {
        got[pick(&mut b, &p).unwrap_or(0)] += 1;
    }
    let t = 1.65;
    assert_shares(&got, &[1.0 / t, 0.5 / t, 0.1 / t, 0.05 / t], 0.05);
}

#[test]
fn dwrs_cpu_weight_and_stale_prior() {
    // cpu .2 and .6 with weights 1 and 2 → .8 and .8; stale one takes the mean load .4.
    let mut p = isslm_pool(&[0.0, 0.0, 0.0]);
    p[0].cpu = Some(0.2);
    p[1].cpu = Some(0.6);
    p[1].weight = 2;
    p[2].cpu = Some(0.99);
    p[2].metrics_fresh = false;
    let mut b = bal(AlgorithmKind::Dwrs, 3);
    b.on_refresh(&p, MS10);
    let mut got = vec![0; 3];
    for _ in 0..100_000 {
        got[pick(&mut b, &p).unwrap_or(0)] += 1;
    }
    assert_shares(&got, &[0.8 / 2.2, 0.8 / 2.2, 0.6 / 2.2], 0.05);
}

#[test]
fn dwrs_relative_load_without_capacity() {
    // Mean 100: loads .25, .75 → weights .75, .25.
    let p = isslm_pool(&[50.0, 150.0]);
    let mut b = bal(AlgorithmKind::Dwrs, 2);
    b.on_refresh(&p, MS10);
    let mut got = vec![0; 2];
    for _ in 0..100_000 {
        got[pick(&mut b, &p).unwrap_or(0)] += 1;
    }
    assert_shares(&got, &[0.75, 0.25], 0.05);
}

// ---- MRBS ---------------------------------------------------------------------------

/// Backends whose RT follows RT = 1 + 0.1·rps (ms), the ground truth MRBS should learn.
fn mrbs_pool(rps: &[f64]) -> Vec<BackendLoad> {
    rps.iter()
        .map(|&r| BackendLoad {
            rps: r,
            response_time_ms: Some(1.0 + 0.1 * r),
            ..BackendLoad::new(1)
        })
        .collect()
}

#[test]
fn mrbs_warm_up_is_least_connections() {
    let mut p = mrbs_pool(&[100.0, 10.0, 50.0]);
    for (x, c) in p.iter_mut().zip([0, 5, 9]) {
        x.active_connections = c;
    }
    let mut b = bal(AlgorithmKind::Mrbs, 3);
    b.on_refresh(&p, MS10);
    assert!(b.mrbs_samples() < 50);
    assert_eq!(pick(&mut b, &p), Some(0)); // fewest connections, ignoring RT
}

#[test]
fn mrbs_learns_and_picks_lowest_predicted_rt() {
    let mut b = bal(AlgorithmKind::Mrbs, 3);
    // Training: loads vary over time so the model sees the RPS → RT relation.
    for t in 0..3000 {
        let f = (t % 10) as f64 / 10.0;
        let p = mrbs_pool(&[100.0 * f, 100.0 * (1.0 - f), 50.0]);
        b.on_refresh(&p, MS10);
    }
    assert!(b.mrbs_samples() >= 50);
    let beta = b.mrbs_model();
    assert!(beta.iter().all(|v| v.is_finite()), "{beta:?}");
    assert!(beta[1] > 0.1, "RPS coefficient not learned: {beta:?}");
    let p = mrbs_pool(&[100.0, 10.0, 50.0]);
    b.on_refresh(&p, MS10);
    assert_eq!(pick(&mut b, &p), Some(1));
    // A burst spreads: the fastest gets the most, but not all.
    let mut q = p.clone();
    let got = burst(&mut b, &req(), &mut q, 100);
    assert!(got[1] > got[2] && got[2] > got[0], "{got:?}");
    assert!(got[1] < 80, "{got:?}");
}

// ---- AMLOB --------------------------------------------------------------------------

#[test]
fn amlob_cv_weights_and_ties() {
    // RPS 10/30/20, conns 6/2/4, equal RT: CV(rps) = CV(conns) = 0.408, CV(rt) = 0
    // → a = (.5, .5, 0); z_rps = (0, 1, .5), z_conns = (1, 0, .5) → all scores .5;
    // tie broken by fewer connections → backend 1.
    let mut p = isslm_pool(&[10.0, 30.0, 20.0]);
    for (x, c) in p.iter_mut().zip([6, 2, 4]) {
        x.active_connections = c;
        x.response_time_ms = Some(5.0);
    }
    let mut b = bal(AlgorithmKind::Amlob, 3);
    b.on_refresh(&p, MS10);
    let a = b.amlob_weights();
    assert!(
        (a[0] - 0.5).abs() < 1e-9 && (a[1] - 0.5).abs() < 1e-9 && a[2] == 0.0,
        "{a:?}"
    );
    assert_eq!(pick(&mut b, &p), Some(1));
    // RT is the only metric that differs → it alone decides.
    let mut p = isslm_pool(&[10.0, 10.0, 10.0]);
    for (x, rt) in p.iter_mut().zip([9.0, 3.0, 6.0]) {
        x.response_time_ms = Some(rt);
    }
    b.on_refresh(&p, MS10);
    assert_eq!(b.amlob_weights(), [0.0, 0.0, 1.0]);
    assert_eq!(pick(&mut b, &p), Some(1));
}

#[test]
fn amlob_burst_spreads() {
    let mut p = isslm_pool(&[10.0, 10.0, 10.0, 10.0]);
    for (x, rt) in p.iter_mut().zip([3.0, 5.0, 5.0, 5.0]) {
        x.response_time_ms = Some(rt);
    }
    let mut b = bal(AlgorithmKind::Amlob, 4);
    b.on_refresh(&p, MS10);
    let got = burst(&mut b, &req(), &mut p, 100);
    assert!(got.iter().all(|&g| g >= 15), "{got:?}");
    assert!(got[0] >= got[1], "{got:?}");
}

// ---- SRT ----------------------------------------------------------------------------

fn srt_pool(rt: &[f64]) -> Vec<BackendLoad> {
    rt.iter()
        .map(|&r| BackendLoad {
            response_time_ms: Some(r),
            ..BackendLoad::new(1)
        })
        .collect()
}

#[test]
fn srt_argmin_and_ties() {
    let mut b = bal(AlgorithmKind::Srt, 3);
    let p = srt_pool(&[10.0, 5.0, 7.0]);
    b.on_refresh(&p, MS10);
    assert_eq!(pick(&mut b, &p), Some(1));
    // Equal RT: fewer connections.
    let mut b = bal(AlgorithmKind::Srt, 3);
    let mut p = srt_pool(&[5.0, 5.0, 5.0]);
    for (x, c) in p.iter_mut().zip([3, 1, 2]) {
        x.active_connections = c;
    }
    b.on_refresh(&p, MS10);
    assert_eq!(pick(&mut b, &p), Some(1));
    // Everything equal: round robin.
    let p = srt_pool(&[5.0, 5.0, 5.0]);
    let seq: Vec<_> = (0..4).map(|_| pick(&mut b, &p).unwrap_or(9)).collect();
    assert_eq!(seq, [2, 0, 1, 2]);
}

#[test]
fn srt_ewma_and_unmeasured_prior() {
    // The core's figure is the EWMA already: SRT takes it as is.
    let mut b = bal(AlgorithmKind::Srt, 3);
    b.on_refresh(&srt_pool(&[10.0, 4.0, 8.0]), MS10);
    b.on_refresh(&srt_pool(&[20.0, 4.0, 8.0]), MS10);
    assert!((b.srt_rt_ms(0).unwrap_or(0.0) - 20.0).abs() < 1e-9);
    // A never-measured backend takes the pool mean (not 0, not ∞).
    let mut p = srt_pool(&[12.0, 4.0, 8.0]);
    p[2].response_time_ms = None;
    let mut b = bal(AlgorithmKind::Srt, 3);
    b.on_refresh(&p, MS10);
    assert_eq!(b.srt_rt_ms(2), None);
    // mean(12, 4) = 8 for backend 2: after 1 pick on 1 (cost 8), 2 ties 1 → conns decide.
    let mut q = p.clone();
    let got = burst(&mut b, &req(), &mut q, 3);
    assert_eq!(got, [0, 2, 1]);
}

/// A step in a backend's measured response time reaches SRT through one EWMA (the core's,
/// α = 0.2 per sample), not two: with a probe every 100 ms and a refresh every 10 ms (the
/// lab's), SRT's figure equals the single EWMA after every refresh, and the first sample
/// after the step already moves the next connection away from the slowed backend.
#[test]
fn srt_reacts_to_a_response_time_step_as_one_ewma() {
    let mut b = bal(AlgorithmKind::Srt, 2);
    let mut core = None::<f64>; // the controller's `record_response_time`
    let mut first_after_step = None;
    for (k, sample) in [10.0; 5].into_iter().chain([50.0; 20]).enumerate() {
        let ewma = core.map_or(sample, |prev| prev + 0.2 * (sample - prev));
        core = Some(ewma);
        for _ in 0..10 {
            let p = srt_pool(&[ewma, 15.0]);
            b.on_refresh(&p, MS10);
            let srt = b.srt_rt_ms(0).unwrap_or(f64::NAN);
            assert!(
                (srt - ewma).abs() < 1e-9,
                "sample {k}: srt {srt}, one EWMA {ewma}"
            );
            if k == 5 && first_after_step.is_none() {
                first_after_step = pick(&mut b, &p);
            }
        }
    }
    // 10 + 0.2·(50 − 10) = 18 ms > 15 ms: backend 1 is now the faster.
    assert_eq!(first_after_step, Some(1));
}

#[test]
fn srt_burst_spreads_in_proportion_to_speed() {
    let mut p = srt_pool(&[5.0, 10.0, 10.0, 10.0]);
    let mut b = bal(AlgorithmKind::Srt, 4);
    b.on_refresh(&p, MS10);
    let got = burst(&mut b, &req(), &mut p, 100);
    // Equilibrium 5(1+p0) ≈ 10(1+p): p0 ≈ 41, others ≈ 20.
    assert!((38..=43).contains(&got[0]), "{got:?}");
    assert!(got[1..].iter().all(|&g| (18..=21).contains(&g)), "{got:?}");
    let mut p = srt_pool(&[10.0; 4]);
    let mut b = bal(AlgorithmKind::Srt, 4);
    b.on_refresh(&p, MS10);
    assert_eq!(burst(&mut b, &req(), &mut p, 100), [25, 25, 25, 25]);
}

#[test]
fn srt_recovers_from_slow_sample_and_stale_decays() {
    // One slow sample on backend 0 (the Traefik #12306 pattern), then identical again.
    let mut b = bal(AlgorithmKind::Srt, 5);
    b.on_refresh(&srt_pool(&[10.0; 5]), MS10);
    b.on_refresh(&srt_pool(&[100.0, 10.0, 10.0, 10.0, 10.0]), MS10);
    let mut refreshes = 0;
    let mut got0 = 0;
    for _ in 0..50 {
        let mut p = srt_pool(&[10.0; 5]);
        b.on_refresh(&p, MS10);
        refreshes += 1;
        got0 += burst(&mut b, &req(), &mut p, 10)[0];
    }
    assert!(refreshes == 50 && got0 >= 50, "backend 0 starved: {got0}");
    // Stale: RT 100 decays toward the pool mean 10 with a 5 s half-life.
    let mut b = bal(AlgorithmKind::Srt, 2);
    b.on_refresh(&srt_pool(&[100.0, 10.0]), MS10);
    let mut p = srt_pool(&[100.0, 10.0]);
    p[0].metrics_fresh = false;
    for _ in 0..500 {
        b.on_refresh(&p, MS10);
    }
    let rt = b.srt_rt_ms(0).unwrap_or(0.0);
    assert!((rt - 55.0).abs() < 0.5, "{rt}");
}

// ---- herd resistance summary --------------------------------------------------------

#[test]
fn argmin_algorithms_do_not_herd_on_a_burst() {
    for k in [
        AlgorithmKind::LeastConnections,
        AlgorithmKind::Srt,
        AlgorithmKind::Amlob,
        AlgorithmKind::Mrbs,
        AlgorithmKind::P2c,
    ] {
        let mut p = srt_pool(&[10.0; 8]);
        let mut b = bal(k, 8);
        for _ in 0..100 {
            b.on_refresh(&p, MS10);
        }
        let got = burst(&mut b, &req(), &mut p, 100);
        let max = got.iter().copied().max().unwrap_or(0);
        assert!(max <= 25, "{k} herded: {got:?}");
    }
}

/// The O(n) ISSLM search equals the literal try-by-try walk of the three rankings.
#[test]
#[allow(clippy::needless_range_loop)]
fn isslm_search_matches_literal_walk() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::SmallRng::seed_from_u64(99);
    let t = 100.0;
    for case in 0..3000 {
        let n = rng.gen_range(2..12);
        let tries = rng.gen_range(1..6);
        let mut p: Vec<BackendLoad> = (0..n)
            .map(|_| BackendLoad {
                eligible: rng.gen_bool(0.8),
                rps: f64::from(rng.gen_range(0..15u32)) * 10.0,
                active_connections: rng.gen_range(0..4),
                response_time_ms: rng.gen_bool(0.7).then(|| f64::from(rng.gen_range(1..5u32))),
                metrics_fresh: rng.gen_bool(0.6),
                ..BackendLoad::new(1)
            })
            .collect();
        p[0].rps = 500.0; // requested, over
        let rc = RateCtx::new(Duration::ZERO, MS10);
        let accept = |x: &BackendLoad| x.metrics_fresh && rc.eff(x) < t;
        let key = |k: usize, x: &BackendLoad| match k {
            0 => Some(rc.eff(x)),
            1 => Some(conns(x)),
            _ => x.response_time_ms,
        };
        let mut want = None;
        let mut last: [Option<(f64, usize)>; 3] = [None; 3];
        'walk: for _ in 0..tries {
            let mut proposed = false;
            for k in 0..3 {
                let mut best: Option<(f64, usize)> = None;
                for (i, x) in p.iter().enumerate().skip(1) {
                    let Some(v) = key(k, x).filter(|_| usable(x)) else {
                        continue;
                    };
                    let after = last[k].is_none_or(|l| (v, i) > l);
                    if after && best.is_none_or(|bb| (v, i) < bb) {
                        best = Some((v, i));
                    }
                }
                let Some((v, i)) = best else { continue };
                proposed = true;
                last[k] = Some((v, i));
                if accept(&p[i]) {
                    want = Some(i);
                    break 'walk;
                }
            }
            if !proposed {
                break;
            }
        }
        let mut b = Balancer::new(
            AlgorithmKind::Isslm,
            AlgorithmParams {
                hysteresis: 0.0,
                isslm_tries: tries,
                ..params()
            },
            n,
            1,
        );
        let got = b.select(&to(0), &p);
        match want {
            Some(i) => assert_eq!(got.backend, Some(i), "case {case}: {p:?}"),
            None => assert!(
                matches!(got.outcome, Outcome::NoOptimalServer | Outcome::NoEligible),
                "case {case}: {got:?} {p:?}"
            ),
        }
    }
}

// ---- slow start ---------------------------------------------------------------------

/// The algorithms that read weight only as "> 0" give a backend ramping at f = 0.25
/// about a quarter of an equal peer's share (before: the full share at once).
#[test]
fn slow_start_limits_the_share_of_weight_blind_algorithms() {
    for k in [
        AlgorithmKind::RoundRobin,
        AlgorithmKind::Isslm,
        AlgorithmKind::Srt,
        AlgorithmKind::Mrbs,
        AlgorithmKind::Amlob,
    ] {
        let params = AlgorithmParams {
            threshold_rps: Some(1e12), // ISSLM behind a VIP: its round-robin base decides
            mrbs_warmup: 0,
            ..AlgorithmParams::default()
        };
        let mut b = Balancer::new(k, params, 4, 7);
        let mut p = srt_pool(&[10.0; 4]);
        b.set_ramp(0, Some(0.25));
        b.on_refresh(&p, MS10);
        let got = burst(&mut b, &req(), &mut p, 400);
        let peers = got[1..].iter().sum::<usize>() as f64 / 3.0;
        let ratio = got[0] as f64 / peers;
        assert!((0.15..=0.4).contains(&ratio), "{k}: {got:?}");
        // The ramp over: the full share again.
        b.set_ramp(0, None);
        let mut p = srt_pool(&[10.0; 4]);
        b.on_refresh(&p, MS10);
        let got = burst(&mut b, &req(), &mut p, 400);
        assert!(got.iter().all(|&g| (80..=120).contains(&g)), "{k}: {got:?}");
    }
}

/// ISSLM counts a ramping requested server over at f·S_Load and moves its flow.
#[test]
fn slow_start_lowers_isslms_threshold() {
    let p = isslm_pool(&[60.0, 10.0, 10.0, 10.0]);
    let mut b = bal(AlgorithmKind::Isslm, 4); // S_Load 100
    b.on_refresh(&p, MS10);
    assert_eq!(b.select(&to(0), &p).outcome, Outcome::Requested);
    b.set_ramp(0, Some(0.5)); // over at 50
    b.on_refresh(&p, MS10);
    let s = b.select(&to(0), &p);
    assert!(
        matches!(s.outcome, Outcome::Moved { from: 0, .. }) && s.backend != Some(0),
        "{s:?}"
    );
}

/// The weighted algorithms, and MRBS in its least-connections warm-up.
const WEIGHTED: [AlgorithmKind; 6] = [
    AlgorithmKind::WeightedRoundRobin,
    AlgorithmKind::LeastConnections,
    AlgorithmKind::Random,
    AlgorithmKind::P2c,
    AlgorithmKind::Dwrs,
    AlgorithmKind::Mrbs,
];

/// Backend 0's picks over the mean of its peers'.
fn ratio_to_peers(got: &[usize]) -> f64 {
    let peers = got[1..].iter().sum::<usize>() as f64 / (got.len() - 1) as f64;
    got[0] as f64 / peers
}

/// The weighted algorithms apply the exact fraction as the weight `weight·f`: with the
/// default weight of 1 a backend ramping at f = 0.25 takes about a quarter of an equal
/// peer's share (before, the ramped integer weight stayed 1: the full share at once).
/// 4,000 picks, seed 7, picks and connections counted as the core does; the ratio to a
/// peer's share must be 0.25 ± 0.05 (smooth WRR: exactly 1 in 13 picks).
#[test]
fn slow_start_limits_the_share_of_weighted_algorithms() {
    for k in WEIGHTED {
        let mut b = bal(k, 4);
        let mut p = pool(4);
        b.set_ramp(0, Some(0.25));
        b.on_refresh(&p, MS10);
        let got = burst(&mut b, &req(), &mut p, 4000);
        let ratio = ratio_to_peers(&got);
        assert!((0.2..=0.3).contains(&ratio), "{k}: {ratio} {got:?}");
        if k == AlgorithmKind::WeightedRoundRobin {
            // 0.25 / (3 + 0.25) of the turns, evenly spread.
            let mut q = pool(4);
            let mut c = bal(k, 4);
            c.set_ramp(0, Some(0.25));
            assert_eq!(burst(&mut c, &req(), &mut q, 1300), [100, 400, 400, 400]);
        }
        // The ramp multiplies the weight: 4 at a quarter is worth a peer's 1.
        let mut b = bal(k, 4);
        let mut p = pool(4);
        p[0].weight = 4;
        b.set_ramp(0, Some(0.25));
        b.on_refresh(&p, MS10);
        let got = burst(&mut b, &req(), &mut p, 4000);
        let ratio = ratio_to_peers(&got);
        assert!(
            (0.9..=1.1).contains(&ratio),
            "{k} weight 4: {ratio} {got:?}"
        );
        // The ramp over: the full share again.
        b.set_ramp(0, None);
        let mut p = pool(4);
        b.on_refresh(&p, MS10);
        let got = burst(&mut b, &req(), &mut p, 4000);
        let ratio = ratio_to_peers(&got);
        assert!((0.9..=1.1).contains(&ratio), "{k} after: {ratio} {got:?}");
    }
}

/// A fraction of 1 is no ramp at all: the same picks, seed for seed, as a balancer that
/// was never given one (mixed weights and loads, counts updated).
#[test]
fn slow_start_at_full_fraction_is_the_old_behaviour() {
    for k in WEIGHTED {
        let mut p = pool(5);
        for (i, x) in p.iter_mut().enumerate() {
            x.weight = [1, 2, 3, 5, 8][i];
            x.active_connections = [4, 0, 7, 1, 2][i];
        }
        p[2].eligible = false;
        let mut plain = bal(k, 5);
        let mut full = bal(k, 5);
        for i in 0..5 {
            full.set_ramp(i, Some(1.0));
        }
        plain.on_refresh(&p, MS10);
        full.on_refresh(&p, MS10);
        let (mut p1, mut p2) = (p.clone(), p);
        for n in 0..2000 {
            let (a, c) = (plain.select(&req(), &p1), full.select(&req(), &p2));
            assert_eq!(a, c, "{k}: pick {n}");
            if let Some(i) = a.backend {
                for q in [&mut p1, &mut p2] {
                    q[i].picks_since_refresh += 1;
                    q[i].active_connections += 1;
                }
            }
        }
    }
}

/// A ramp gives nothing to a backend of weight 0, and leaves a ramping one usable.
#[test]
fn slow_start_keeps_weight_zero_at_nothing() {
    for &k in AlgorithmKind::ALL {
        if k == AlgorithmKind::None {
            continue;
        }
        let mut p = pool(3);
        p[1].weight = 0;
        let mut b = bal(k, 3);
        b.set_ramp(0, Some(0.01));
        b.set_ramp(1, Some(0.25));
        for _ in 0..60 {
            b.on_refresh(&p, MS10);
        }
        let got = burst(&mut b, &req(), &mut p, 3000);
        assert_eq!(got[1], 0, "{k}: {got:?}");
        assert!(got[0] > 0 && got[2] > got[0], "{k}: {got:?}");
        // Only ramping backends: still placed.
        let mut q = pool(2);
        let mut b = bal(k, 2);
        b.set_ramp(0, Some(0.01));
        b.set_ramp(1, Some(0.01));
        b.on_refresh(&q, MS10);
        let got = burst(&mut b, &req(), &mut q, 100);
        assert_eq!(got.iter().sum::<usize>(), 100, "{k}: {got:?}");
    }
}

#[test]
fn slow_start_fractions_are_clamped() {
    let mut b = bal(AlgorithmKind::RoundRobin, 2);
    for (f, want) in [
        (Some(f64::NAN), 1.0),
        (Some(-1.0), 0.01),
        (Some(0.0), 0.01),
        (Some(2.0), 1.0),
        (Some(0.3), 0.3),
        (None, 1.0),
    ] {
        b.set_ramp(1, f);
        assert_eq!(b.ramp(1), want, "{f:?}");
    }
    // Every usable backend ramping and passing its turn: the first still takes it.
    let p = pool(2);
    b.set_ramp(0, Some(0.01));
    b.set_ramp(1, Some(0.01));
    assert!((0..50).all(|_| pick(&mut b, &p).is_some()));
    assert_eq!(b.ramp(5), 1.0);
}

/// Behind a VIP, ISSLM's "requested" server is a smooth weighted round robin's pick, so a
/// domain controller's spill (weights only: local 100, two remote backends 6 each, for a
/// tenth of the flows) holds under ISSLM while nobody is over. A plain rotation gave the
/// remote backends a third of the flows each (the lab's full Case C).
#[test]
fn isslm_behind_a_vip_takes_its_base_pick_by_weight() {
    let mut p = pool(3);
    p[0].weight = 100;
    p[1].weight = 6;
    p[2].weight = 6;
    let mut b = Balancer::new(
        AlgorithmKind::Isslm,
        AlgorithmParams {
            threshold_rps: Some(1e9),
            ..AlgorithmParams::default()
        },
        3,
        7,
    );
    b.on_refresh(&p, MS10);
    let mut got = [0usize; 3];
    for _ in 0..1120 {
        let s = b.select(&req(), &p);
        assert_eq!(s.outcome, Outcome::Requested, "nobody is over");
        got[s.backend.expect("placed")] += 1;
    }
    assert_eq!(got, [1000, 60, 60]);
}
