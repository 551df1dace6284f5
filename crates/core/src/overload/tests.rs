//! The gap controller against analytic expectations (research note §7), with Poisson
//! arrivals from a seeded RNG, in simulated time.

use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::*;

fn exp(rng: &mut SmallRng, rate: f64) -> f64 {
    let u: f64 = rng.r#gen::<f64>().max(1e-12);
    -u.ln() / rate
}

/// §7.1: deterministic gapping of Poisson arrivals admits λ/(1+λg).
#[test]
fn crawford_gate_admits_lambda_over_one_plus_lambda_g() {
    let t0 = Instant::now();
    for (lambda, g_ms) in [
        (50.0, 10.0),
        (100.0, 10.0),
        (300.0, 10.0),
        (1000.0, 10.0),
        (20.0, 100.0),
    ] {
        let mut rng = SmallRng::seed_from_u64(7);
        let g = Duration::from_secs_f64(g_ms / 1000.0);
        let mut gate = Gate::default();
        let (mut t, mut admitted, n) = (0.0, 0u64, 200_000u64);
        for _ in 0..n {
            t += exp(&mut rng, lambda);
            if gate.admit(t0 + Duration::from_secs_f64(t), Some(g)) {
                admitted += 1;
            }
        }
        let measured = admitted as f64 / t;
        let lg = lambda * g.as_secs_f64();
        let expected = lambda / (1.0 + lg);
        let err = (measured - expected).abs() / expected;
        assert!(
            err < 0.02,
            "λ={lambda} g={g_ms}ms: admitted {measured:.2}/s, expected {expected:.2}/s (err {err:.3})"
        );
        // Never more than one admission per gap.
        assert!(measured <= 1.0 / g.as_secs_f64() + 1e-9);
        // Rejected fraction λg/(1+λg).
        let rejected = 1.0 - admitted as f64 / n as f64;
        assert!(
            (rejected - lg / (1.0 + lg)).abs() < 0.01,
            "rejected {rejected}"
        );
    }
}

#[test]
fn meter_rates_are_quantized_upwards_in_eighth_octaves() {
    let mut last = 0;
    for r in 1..5000 {
        let q = quantize_rate(f64::from(r));
        assert!(q >= r as u32, "{r} -> {q}");
        assert!(f64::from(q) <= f64::from(r) * 1.10 + 1.0, "{r} -> {q}");
        assert!(q >= last);
        last = q;
    }
    // Nearby rates share a step: a small change costs no OFPMC_MODIFY.
    assert_eq!(quantize_rate(200.0), quantize_rate(205.0));
    assert_eq!(quantize_rate(f64::INFINITY), OPEN_METER_RATE);
    let b = meter_plan(Some(100.0), 4.0, None, 20);
    assert_eq!(b.rate, quantize_rate(400.0));
    assert_eq!(
        b.burst,
        (f64::from(b.rate) * 0.02).ceil() as u32,
        "20 ms' worth"
    );
    // The controller's share caps it.
    assert_eq!(
        meter_plan(Some(100.0), 4.0, Some(150.0), 20).rate,
        quantize_rate(150.0)
    );
}

/// A pool of capacity `cap` behind a gate driven by `mode`, with Poisson offered load
/// `lambda(t)`. Returns the admitted count per 1 s window and the limit at each step.
struct Run {
    admitted_per_s: Vec<f64>,
    /// Completed within the deadline, after the first 5 s (Berger's goodput).
    good: u64,
    /// Sojourn times (queueing + service) of admissions after the first 5 s.
    sojourn: Vec<f64>,
    rejected: u64,
    limits: Vec<(f64, Option<f64>)>,
    /// The rate the gate enforced after each step (the gap's, or the ceiling).
    gate_limits: Vec<(f64, Option<f64>)>,
}

fn simulate(mode: Mode, cap: f64, secs: f64, lambda: impl Fn(f64) -> f64, seed: u64) -> Run {
    let cfg = OverloadConfig {
        mode,
        capacity_rps: Some(cap),
        ..OverloadConfig::default()
    };
    simulate_cfg(&cfg, secs, lambda, seed)
}

/// [`simulate`] with the whole `[service.overload]` given (`capacity_rps` must be set).
fn simulate_cfg(cfg: &OverloadConfig, secs: f64, lambda: impl Fn(f64) -> f64, seed: u64) -> Run {
    let cap = cfg.capacity_rps.expect("a capacity");
    let mut law = GapController::new(cfg.law());
    let mut gate = Gate::default();
    let mut rng = SmallRng::seed_from_u64(seed);
    let t0 = Instant::now();
    let tick = 0.010;
    let mut t = 0.0;
    let mut next_arrival = exp(&mut rng, lambda(0.0));
    let mut windows = vec![0.0; secs.ceil() as usize];
    let mut limits = Vec::new();
    let mut gate_limits = Vec::new();
    // The pool: a FIFO server of rate `cap` (deterministic service 1/cap).
    let (mut next_free, mut good, mut sojourn) = (0.0f64, 0u64, Vec::new());
    let deadline = 1.0;
    while t < secs {
        let end = t + tick;
        while next_arrival < end {
            let at = t0 + Duration::from_secs_f64(next_arrival);
            let ok = gate.admit_with_depth(at, law.gate_gap(), cfg.gate_burst);
            law.record(ok);
            if ok {
                if let Some(w) = windows.get_mut(next_arrival as usize) {
                    *w += 1.0;
                }
                let finish = next_free.max(next_arrival) + 1.0 / cap;
                next_free = finish;
                if next_arrival >= 5.0 {
                    sojourn.push(finish - next_arrival);
                    if finish - next_arrival <= deadline {
                        good += 1;
                    }
                }
            }
            next_arrival += exp(&mut rng, lambda(next_arrival));
        }
        t = end;
        let now = t0 + Duration::from_secs_f64(t);
        if law.due(now) {
            law.measure(now);
            let load = law.admitted_rate() / cap;
            law.control(now, load);
            limits.push((t, law.rate()));
            gate_limits.push((t, law.gate_rate()));
        }
    }
    sojourn.sort_by(f64::total_cmp);
    Run {
        admitted_per_s: windows,
        good,
        sojourn,
        rejected: law.refused_total,
        limits,
        gate_limits,
    }
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

fn cv(v: &[f64]) -> f64 {
    let m = mean(v);
    (v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / v.len() as f64).sqrt() / m
}

/// Under load below the low watermark nothing is gapped; after a step to 3× capacity the
/// adaptive gap converges (admitted within 80–100% of capacity within 3 s) and then holds
/// steady: the admitted rate's coefficient of variation over the last 10 s is small and
/// the limit itself barely moves (no sawtooth).
#[test]
fn adaptive_gap_converges_after_a_step_and_does_not_oscillate() {
    let cap = 100.0;
    let run = simulate(
        Mode::Adaptive,
        cap,
        30.0,
        |t| if t < 10.0 { 50.0 } else { 300.0 },
        11,
    );
    // Before the step: no gap at all.
    assert!(
        run.limits
            .iter()
            .filter(|(t, _)| *t > 1.0 && *t < 10.0)
            .all(|(_, a)| a.is_none()),
        "no gap below the low watermark"
    );
    let w = &run.admitted_per_s;
    // Converged within 3 s of the step.
    for (i, &n) in w.iter().enumerate().skip(13) {
        assert!(
            (0.70 * cap..=1.0 * cap).contains(&n),
            "second {i}: admitted {n}/s, capacity {cap}/s: {w:?}"
        );
    }
    // Steady: small variation of the admitted rate, and of the limit.
    let tail = &w[20..30];
    assert!(
        mean(tail) >= 0.8 * cap,
        "steady admitted rate {}",
        mean(tail)
    );
    let c = cv(tail);
    assert!(
        c < 0.08,
        "admitted rate CV {c:.3} over the last 10 s: {tail:?}"
    );
    let lims: Vec<f64> = run
        .limits
        .iter()
        .filter(|(t, _)| *t > 20.0)
        .filter_map(|(_, a)| *a)
        .collect();
    let (lo, hi) = lims
        .iter()
        .fold((f64::MAX, 0.0f64), |(lo, hi), &a| (lo.min(a), hi.max(a)));
    assert!(
        hi / lo < 1.25,
        "the limit oscillates between {lo:.1} and {hi:.1}"
    );
    // And when the load falls again, the gap relaxes and lifts.
    let run = simulate(
        Mode::Adaptive,
        cap,
        20.0,
        |t| if t < 8.0 { 300.0 } else { 40.0 },
        12,
    );
    assert_eq!(run.limits.last().map(|l| l.1), Some(None), "gap lifted");
    let w = &run.admitted_per_s;
    assert!(
        mean(&w[14..20]) > 35.0,
        "all of the lighter load admitted: {w:?}"
    );
}

/// ACCM's qualitative claim (research note §7.11) against the AIN static table: under the
/// same overload the adaptive gap establishes at least as many flows within capacity and
/// spends less time overloaded.
#[test]
fn adaptive_beats_the_static_ain_table_under_the_same_overload() {
    let cap = 100.0;
    let lam = |_t: f64| 300.0;
    let a = simulate(Mode::Adaptive, cap, 30.0, lam, 5);
    let s = simulate(Mode::Static, cap, 30.0, lam, 5);
    let p99 = |r: &Run| r.sojourn[r.sojourn.len() * 99 / 100];
    let (ga, gs) = (a.good, s.good);
    assert!(
        ga >= gs,
        "adaptive {ga} vs static {gs} flows served within the deadline"
    );
    assert!(ga as f64 > 0.8 * cap * 25.0, "adaptive goodput {ga}");
    assert!(
        p99(&a) <= p99(&s),
        "p99 sojourn: adaptive {:.3}s static {:.3}s",
        p99(&a),
        p99(&s)
    );
    assert!(p99(&a) < 10.0 / cap, "adaptive p99 sojourn {:.3}s", p99(&a));
    // The static table only knows its own gaps.
    let s_limits: Vec<Option<f64>> = s.limits.iter().map(|l| l.1).collect();
    assert!(s_limits.iter().flatten().all(|r| {
        AIN_ACG_GAPS_MS
            .iter()
            .any(|&g| g > 0 && (1000.0 / f64::from(g) - r).abs() < 1e-9)
    }));
    let _ = a.rejected + s.rejected;
}

/// The ablation of the ceiling (`ceiling = false`): a step from near idle (10/s) to 3×
/// capacity meets no limit at all, and is admitted in full, above the ceiling
/// (`capacity × (low+high)/2` = 95/s), until the measured load crosses the high
/// watermark; then the law cuts, and gaps from there on, holding the admitted rate within
/// capacity as it does with the ceiling. With the ceiling (the default, same seed), the
/// gate holds 95/s from the start, idle or not, and the step's first second is admitted
/// at most that.
#[test]
fn without_the_ceiling_a_step_is_admitted_in_full_until_the_load_is_measured() {
    let cap = 100.0;
    let ceiling = cap * 0.5 * (config::DEFAULT_LOW_WATERMARK + config::DEFAULT_HIGH_WATERMARK);
    let step = |t: f64| if t < 5.0 { 10.0 } else { 300.0 };
    let with = OverloadConfig {
        mode: Mode::Adaptive,
        capacity_rps: Some(cap),
        ..OverloadConfig::default()
    };
    let without = OverloadConfig {
        ceiling: false,
        ..with.clone()
    };
    assert_eq!(with.law().ceiling, Some(ceiling));
    assert_eq!(without.law().ceiling, None, "no ceiling in the law");
    assert_eq!(
        without.law().reference_rate,
        Some(cap),
        "the step still scales"
    );
    let (on, off) = (
        simulate_cfg(&with, 20.0, step, 21),
        simulate_cfg(&without, 20.0, step, 21),
    );

    // Before the step: the default gate holds the ceiling, the ablation has no limit.
    let before = |r: &Run| -> Vec<Option<f64>> {
        r.gate_limits
            .iter()
            .filter(|(t, _)| *t < 5.0)
            .map(|l| l.1)
            .collect()
    };
    assert!(
        before(&on).iter().all(|a| *a == Some(ceiling)),
        "{:?}",
        before(&on)
    );
    assert!(
        before(&off).iter().all(Option::is_none),
        "{:?}",
        before(&off)
    );

    // The step's first second: above the ceiling without it, at most the ceiling (plus
    // the gate's burst of 2) with it.
    let (first_on, first_off) = (on.admitted_per_s[5], off.admitted_per_s[5]);
    assert!(
        first_off > 1.2 * ceiling,
        "without the ceiling the step is admitted above {ceiling}/s at first: {first_off}"
    );
    assert!(first_on <= ceiling + 2.0, "with it: {first_on}");

    // Not limited until the measured load crossed the high watermark: the first limit
    // comes after the step, and is the law's cut (a gap), not a ceiling.
    let first_cut = off
        .gate_limits
        .iter()
        .find(|l| l.1.is_some())
        .expect("the law gaps the overload");
    assert!(
        (5.0..6.0).contains(&first_cut.0),
        "the first cut within the step's first second: {first_cut:?}"
    );
    assert!(
        off.limits
            .iter()
            .any(|(t, a)| *t > 5.0 && *t < first_cut.0 && a.is_none()),
        "the step's first intervals pass with no limit: {:?}",
        &off.limits[95..105]
    );
    // Then the law gaps, and holds the pool within capacity, as with the ceiling.
    let gapped: Vec<&(f64, Option<f64>)> = off.limits.iter().filter(|l| l.0 > 8.0).collect();
    assert!(gapped.iter().all(|l| l.1.is_some()), "gapping from then on");
    for (i, &n) in off.admitted_per_s.iter().enumerate().skip(8) {
        assert!(
            (0.70 * cap..=1.0 * cap).contains(&n),
            "second {i}: admitted {n}/s, capacity {cap}/s: {:?}",
            off.admitted_per_s
        );
    }
}

/// `off` never gaps.
#[test]
fn off_mode_admits_everything() {
    let run = simulate(Mode::Off, 100.0, 5.0, |_| 300.0, 3);
    assert_eq!(run.rejected, 0);
    assert!(run.limits.iter().all(|l| l.1.is_none()));
}

/// The controller's own gap: a PACKET_IN flood beyond what it can handle. The meter (here
/// a gate at the admitted rate) keeps the handled rate near the measured maximum instead
/// of letting the backlog grow: utilization stays at target, the handled rate does not
/// collapse.
#[test]
fn controller_gap_holds_the_packet_in_rate_near_its_maximum() {
    let cfg = ControllerOverloadConfig {
        mode: Mode::Adaptive,
        ..ControllerOverloadConfig::default()
    };
    let mut g = ControllerGap::new(cfg);
    let t0 = Instant::now();
    let service_rate = 2_000.0; // PACKET_INs per second the controller can handle
    let offered = 10_000.0;
    let mut backlog = 0.0f64;
    let mut handled_tail = Vec::new();
    let tick = 0.01;
    for k in 0..2_000 {
        let t = k as f64 * tick;
        // Arrivals the switch meter lets through (token-bucket average = the limit).
        let admitted = g.law.rate().map_or(offered, |r| r.min(offered)) * tick;
        backlog += admitted;
        let handled = backlog.min(service_rate * tick);
        backlog -= handled;
        g.record(WorkSample {
            packet_ins: handled.round() as u64,
            busy: Duration::from_secs_f64(handled / service_rate),
            queueing: Duration::from_secs_f64(backlog / service_rate),
            backlog: backlog as u64,
            switch: 1,
            ..WorkSample::default()
        });
        g.step(t0 + Duration::from_secs_f64(t + tick));
        if t > 10.0 {
            handled_tail.push(handled / tick);
        }
    }
    let m = mean(&handled_tail);
    assert!(
        m > 0.75 * service_rate && m <= service_rate,
        "handled {m:.0}/s of a {service_rate}/s maximum"
    );
    assert!(
        backlog < service_rate * 0.05,
        "the backlog stays bounded: {backlog}"
    );
    assert!(g.max_handled_rate >= 0.9 * service_rate);
}

/// A flood the switches do not meter (no meter support, or a meter not yet in place): the
/// controller itself must read and refuse every excess PACKET_IN. Refusing is cheap but not
/// free. The law controls only the work of the flows it admits ([`WorkSample::shed`] is
/// left out), so it settles near the most the time left over allows (96 % of it here); fed
/// the whole busy time, it would hold refusals plus decisions at its target utilization
/// and give the difference away (78 %), and in the closed-loop bench, where the queue stays
/// short, it gapped a merely busy controller to 39 % of its peak.
#[test]
fn a_controller_busy_refusing_a_flood_keeps_admitting_what_it_can() {
    let (decide, refuse) = (500e-6, 50e-6); // seconds of work per admitted / refused flow
    let offered = 10_000.0;
    // Refusing everything costs 0.5 s a second; the rest admits (1 - 0.5) / (500 - 50 µs).
    let best = (1.0 - offered * refuse) / (decide - refuse);
    let mut results = Vec::new();
    for leave_shed_out in [true, false] {
        let mut g = ControllerGap::new(ControllerOverloadConfig {
            mode: Mode::Adaptive,
            ..ControllerOverloadConfig::default()
        });
        let t0 = Instant::now();
        let tick = 0.01;
        let (mut backlog, mut tail) = (0.0f64, Vec::new());
        for k in 0..3_000 {
            let t = f64::from(k) * tick;
            let waiting = backlog + offered * tick;
            let quota = g.law.rate().map_or(f64::INFINITY, |r| r * tick);
            // Work in arrival order until the tick's time is spent: the gate admits up to
            // its quota, every other flow is refused.
            let all_admitted = waiting.min(quota);
            let (processed, admitted) =
                if all_admitted * decide + (waiting - all_admitted) * refuse <= tick {
                    (waiting, all_admitted)
                } else {
                    let a = all_admitted.min(tick / decide);
                    (a + (tick - a * decide) / refuse, a)
                };
            let processed = processed.min(waiting);
            backlog = waiting - processed;
            let busy = admitted * decide + (processed - admitted) * refuse;
            let shed = (processed - admitted) * refuse;
            g.record(WorkSample {
                packet_ins: processed.round() as u64,
                busy: Duration::from_secs_f64(busy),
                shed: Duration::from_secs_f64(if leave_shed_out { shed } else { 0.0 }),
                queueing: Duration::from_secs_f64(backlog / (processed / tick).max(1.0)),
                backlog: backlog as u64,
                switch: 1,
                ..WorkSample::default()
            });
            g.step(t0 + Duration::from_secs_f64(t + tick));
            if t > 20.0 {
                tail.push(admitted / tick);
            }
        }
        let m = mean(&tail);
        eprintln!("shed left out: {leave_shed_out}: admitted {m:.0}/s of {best:.0}/s");
        results.push(m);
        assert!(
            backlog < offered * 0.05,
            "the backlog stays bounded: {backlog}"
        );
    }
    let (new, old) = (results[0], results[1]);
    assert!(
        new > 0.9 * best && new <= best * 1.01,
        "admitted {new:.0}/s of the {best:.0}/s the flood leaves"
    );
    // Fed the whole busy time, the law holds refusals plus decisions at its target
    // utilization and gives away the difference.
    assert!(
        new > old * 1.1,
        "{new:.0}/s, against {old:.0}/s with the refusals counted"
    );
}

#[test]
fn config_keys_are_read_strictly_with_paths() {
    let ok = crate::Config::from_toml(
        "[controller.overload]\nmode = \"adaptive\"\ntarget_delay_ms = 10\ntarget_rtt_ms = 30\n\
         [[service]]\nname = \"web\"\nvip = \"10.0.0.100\"\nport = 80\n\
         [service.overload]\nmode = \"adaptive\"\ncapacity_rps = 80\ninterval_ms = 20\n\
         high_watermark = 0.9\nlow_watermark = 0.8\nbackstop_factor = 3\n\
         gaps_ms = \"0, 100, 250\"\n",
        &|_| None,
    )
    .expect("valid");
    let o = &ok.services[0].overload;
    assert_eq!(o.mode, Mode::Adaptive);
    assert_eq!(o.capacity_rps, Some(80.0));
    assert_eq!(o.interval, Duration::from_millis(20));
    assert_eq!(o.gaps_ms, vec![0, 100, 250]);
    assert_eq!(ok.controller.overload.mode, Mode::Adaptive);
    assert_eq!(
        ok.controller.overload.target_delay,
        Duration::from_millis(10)
    );
    assert_eq!(ok.controller.overload.target_rtt, Duration::from_millis(30));

    let bad = crate::Config::from_toml(
        "[[service]]\nname = \"web\"\nvip = \"10.0.0.100\"\nport = 80\n\
         [service.overload]\nmode = \"adaptive\"\ninterval_ms = 500\nbogus = 1\n\
         low_watermark = 1.5\n",
        &|_| None,
    )
    .expect_err("invalid");
    let paths: Vec<&str> = bad.0.iter().map(|e| e.path.as_str()).collect();
    for p in [
        "service[0].overload.interval_ms",
        "service[0].overload.bogus",
        "service[0].overload.low_watermark",
        "service[0].overload.mode",
    ] {
        assert!(paths.contains(&p), "{p} reported: {bad}");
    }
}

/// `ceiling = true | false`: a TOML boolean, default true, refused where no ceiling
/// exists (a mode other than adaptive, no `capacity_rps`, `[controller.overload]`), each
/// error against the key's path. A string (the `"on"` / `"off"` once written here) is
/// not a boolean: refused, saying so.
#[test]
fn the_ceiling_key_is_read_strictly() {
    let svc = |body: &str| {
        format!(
            "[[service]]\nname = \"web\"\nvip = \"10.0.0.100\"\nport = 80\n\
             [service.overload]\n{body}\n"
        )
    };
    let read = |body: &str| crate::Config::from_toml(&svc(body), &|_| None);
    let on = read("mode = \"adaptive\"\ncapacity_rps = 80").expect("valid");
    assert!(on.services[0].overload.ceiling, "on by default");
    assert_eq!(on.services[0].overload.law().ceiling, Some(80.0 * 0.95));
    let on = read("mode = \"adaptive\"\ncapacity_rps = 80\nceiling = true").expect("valid");
    assert_eq!(on.services[0].overload.law().ceiling, Some(80.0 * 0.95));
    let off = read("mode = \"adaptive\"\ncapacity_rps = 80\nceiling = false").expect("valid");
    let o = &off.services[0].overload;
    assert!(!o.ceiling);
    assert_eq!(o.law().ceiling, None);
    assert_eq!(
        o.capacity_rps,
        Some(80.0),
        "the capacity still sets the load"
    );
    assert_eq!(o.law().reference_rate, Some(80.0));

    let bad = |body: &str, path: &str, says: &str| {
        let e = read(body).expect_err(body);
        assert!(
            e.0.iter()
                .any(|e| e.path == path && e.message.contains(says)),
            "{body}: want {path}: …{says}…, got {e}"
        );
    };
    let at = "service[0].overload.ceiling";
    // A string, even one that reads as a boolean, or a number: one error, that a boolean
    // is expected (not also that the key is misplaced or unknown).
    for (mode, value, found) in [
        ("adaptive", "\"off\"", "found string \"off\""),
        ("adaptive", "\"on\"", "found string \"on\""),
        ("adaptive", "\"false\"", "found string \"false\""),
        ("adaptive", "0", "found integer"),
        ("static", "\"off\"", "found string \"off\""),
    ] {
        let body = format!("mode = \"{mode}\"\ncapacity_rps = 80\nceiling = {value}");
        let e = read(&body).expect_err(&body);
        assert_eq!(
            e.0,
            [crate::config::ConfigError::new(
                at,
                format!("expected a boolean (true or false), {found}")
            )],
            "{body}"
        );
    }
    bad(
        "mode = \"static\"\ncapacity_rps = 80\nceiling = false",
        at,
        "only mode = \"adaptive\" has a ceiling (mode is \"static\")",
    );
    bad(
        "mode = \"off\"\nceiling = true",
        at,
        "only mode = \"adaptive\" has a ceiling (mode is \"off\")",
    );
    bad(
        "mode = \"adaptive\"\nmax_active_connections = 10\nceiling = false",
        at,
        "without capacity_rps",
    );
    // An invalid mode or capacity is reported once, not again through the ceiling.
    let e = read("mode = \"fast\"\ncapacity_rps = 80\nceiling = false").expect_err("mode");
    assert!(!e.0.iter().any(|e| e.path == at), "{e}");
    let e = read("mode = \"adaptive\"\ncapacity_rps = -1\nceiling = false").expect_err("cap");
    assert!(!e.0.iter().any(|e| e.path == at), "{e}");
    // The controller's own gap has no capacity, hence no ceiling.
    let e = crate::Config::from_toml(
        "[controller.overload]\nmode = \"adaptive\"\nceiling = false\n",
        &|_| None,
    )
    .expect_err("no ceiling for the controller");
    assert!(
        e.0.iter()
            .any(|e| e.path == "controller.overload.ceiling" && e.message == "unknown key"),
        "{e}"
    );
}

/// Per switch: the admitted rate is split by offered demand. Two switches offered 3:1,
/// both beyond their share, are admitted 3:1; the shares sum to the law's rate; an idle
/// switch keeps the floor.
#[test]
fn the_admitted_rate_is_split_by_demand() {
    let s = split_by_demand(100.0, &[300.0, 100.0], SWITCH_FLOOR_FRACTION);
    assert!(
        (s[0] - 75.0).abs() < 1e-9 && (s[1] - 25.0).abs() < 1e-9,
        "{s:?}"
    );
    // Under demand: each gets at least its demand, the surplus in proportion.
    let s = split_by_demand(100.0, &[30.0, 10.0], SWITCH_FLOOR_FRACTION);
    assert!(s[0] >= 30.0 && s[1] >= 10.0, "{s:?}");
    assert!((s[0] / s[1] - 3.0).abs() < 1e-9, "{s:?}");
    // An idle switch keeps the floor (10% of the even share); the busy one the rest.
    let s = split_by_demand(100.0, &[500.0, 0.0], SWITCH_FLOOR_FRACTION);
    assert!(
        (s[1] - 5.0).abs() < 1e-9 && (s[0] - 95.0).abs() < 1e-9,
        "{s:?}"
    );
    // A tiny demand below the floor is lifted to it; the others stay in proportion.
    let s = split_by_demand(100.0, &[600.0, 200.0, 1.0], SWITCH_FLOOR_FRACTION);
    let floor = 0.1 * 100.0 / 3.0;
    assert!((s[2] - floor).abs() < 1e-9, "{s:?}");
    assert!((s[0] / s[1] - 3.0).abs() < 1e-9, "{s:?}");
    // No demand anywhere: even. Always sums to the total; never negative.
    assert_eq!(split_by_demand(90.0, &[0.0, 0.0, 0.0], 0.1), vec![30.0; 3]);
    for d in [[1.0, 2.0, 3.0], [0.0, 1e9, 1.0], [f64::NAN, 5.0, -3.0]] {
        let s = split_by_demand(120.0, &d, SWITCH_FLOOR_FRACTION);
        assert!((s.iter().sum::<f64>() - 120.0).abs() < 1e-6, "{d:?}: {s:?}");
        assert!(s.iter().all(|&x| x >= 0.0), "{d:?}: {s:?}");
    }
    assert!(split_by_demand(100.0, &[], 0.1).is_empty());
}

/// Measured demand drives the split: offered 3:1 at two switches (arrivals plus meter
/// drops), then one goes idle and gives its share away within a few intervals.
#[test]
fn an_idle_switch_gives_its_share_away_within_a_few_intervals() {
    let dt = Duration::from_millis(50);
    let (mut a, mut b) = (SwitchDemand::default(), SwitchDemand::default());
    let total = Some(100.0);
    for _ in 0..20 {
        // 300/s and 100/s offered; at a, a third of it was dropped by its meter.
        a.arrivals(10);
        a.dropped(5);
        b.arrivals(5);
        a.measure(dt);
        b.measure(dt);
        apply_split(total, [&mut a, &mut b].into_iter());
    }
    let (sa, sb) = (a.share.expect("share"), b.share.expect("share"));
    assert!((a.rate - 300.0).abs() < 1.0 && (b.rate - 100.0).abs() < 1.0);
    assert!((sa / sb - 3.0).abs() < 0.01, "{sa} : {sb}");
    assert_eq!(a.dropped_total, 100);
    // b goes idle.
    let mut after = Vec::new();
    for _ in 0..4 {
        a.arrivals(15);
        a.measure(dt);
        b.measure(dt);
        apply_split(total, [&mut a, &mut b].into_iter());
        after.push(a.share.expect("share"));
    }
    assert!(
        after[3] >= 90.0,
        "the busy switch has ≥ 90% of the rate after 4 intervals: {after:?}"
    );
    assert!(after.windows(2).all(|w| w[1] >= w[0]), "{after:?}");
    assert!(
        b.share.expect("share") >= 5.0 - 1e-9,
        "the idle switch keeps its floor"
    );
    // No limit: no shares.
    apply_split(None, [&mut a, &mut b].into_iter());
    assert_eq!((a.share, b.share), (None, None));
}

/// Meter drops count as offered load: the law sees λ, not only what reached the gate.
#[test]
fn meter_drops_count_as_offered() {
    let mut p = OverloadConfig {
        mode: Mode::Adaptive,
        capacity_rps: Some(100.0),
        ..OverloadConfig::default()
    }
    .law();
    p.settle = Duration::from_millis(50);
    let mut g = GapController::new(p);
    let t0 = Instant::now();
    g.measure(t0);
    for _ in 0..50 {
        g.record(true);
    }
    g.record_meter_drops(150);
    g.measure(t0 + Duration::from_secs(1));
    assert!(
        (g.offered_rate() - 200.0).abs() < 1e-9,
        "{}",
        g.offered_rate()
    );
    assert!((g.admitted_rate() - 50.0).abs() < 1e-9);
    let v = g.view();
    assert_eq!(
        (v.offered_total, v.meter_dropped_total, v.refused_total),
        (200, 150, 0)
    );
}

/// The controller shares its admitted rate among services max-min fair: a quiet service
/// gets all it asks, a flooded one the rest.
#[test]
fn max_min_fair_serves_the_quiet_first() {
    let s = max_min_fair(100.0, &[1000.0, 5.0]);
    assert_eq!(s, vec![95.0, 5.0]);
    let s = max_min_fair(100.0, &[1000.0, 400.0, 10.0]);
    assert_eq!(s, vec![45.0, 45.0, 10.0]);
    // Under demand: everyone gets its demand, the surplus evenly.
    let s = max_min_fair(100.0, &[10.0, 30.0]);
    assert_eq!(s, vec![40.0, 60.0]);
    assert!(max_min_fair(5.0, &[]).is_empty());
    let s = max_min_fair(60.0, &[f64::NAN, -1.0, 100.0]);
    assert!((s.iter().sum::<f64>() - 60.0).abs() < 1e-9 && s.iter().all(|&x| x >= 0.0));
}

/// The runtime hands the gate a batch of arrivals with one timestamp: with a bucket of
/// `gate_burst` tokens only, a batch of 256 every millisecond under a 100k/s gap admitted
/// 2 a batch (2k/s); with the batch window in the depth it admits the gap's rate.
#[test]
fn a_gate_admits_its_rate_when_arrivals_come_in_batches() {
    let t0 = Instant::now();
    let gap = Some(Duration::from_micros(10)); // 100,000 a second
    for (depth, want) in [
        (
            crate::controller::overload::batch_depth(2.0, gap),
            100_000.0,
        ),
        (2.0, 2_000.0),
    ] {
        let mut gate = Gate::default();
        let mut admitted = 0_u32;
        for ms in 0..1_000_u64 {
            let at = t0 + Duration::from_millis(ms);
            for _ in 0..256 {
                admitted += u32::from(gate.admit_with_depth(at, gap, depth));
            }
        }
        let rate = f64::from(admitted); // over one second
        assert!(
            (rate - want).abs() <= 0.02 * want + 256.0,
            "depth {depth}: admitted {rate}/s, want {want}/s"
        );
    }
}

/// A METER_STATS reply in parts (OFPMPF_REPLY_MORE) answers one request, so its parts
/// share one reply index. A reply to a poll sent before an OFPMC_MODIFY carries the
/// meter's old band count even in a later part; counted part by part, that part would
/// pass for the first reply after the modification (whose count OVS restarted), and its
/// whole count for new drops.
#[test]
fn a_meter_stats_reply_in_parts_counts_as_one_reply() {
    use crate::testkit::sim::{Sim, VIP, ip};
    use ofp::{Message, MultipartReply, MultipartReplyBody, MultipartRequestBody};

    // The service's intercept meter, capped by the controller's share: a saturated
    // controller modifies it, then not again for its hold time (1 s, 10 polls).
    const METER: u32 = SERVICE_METER_BASE;
    let config = format!(
        "[controller.overload]\nmode = \"adaptive\"\n\
         [[service]]\nname = \"web\"\nvip = \"{VIP}\"\nport = 80\n\
         [service.health]\nkind = \"none\"\n[service.overload]\nmeter_hold_ms = 1000\n\
         [[service.backend]]\naddress = \"{}\"\n",
        ip(2)
    );
    let stats = |meter_id: u32, band: u64| ofp::MeterStats {
        meter_id,
        flow_count: 1,
        packet_in_count: band,
        byte_in_count: 0,
        duration_sec: 1,
        duration_nsec: 0,
        band_stats: vec![ofp::MeterBandStats {
            packet_band_count: band,
            byte_band_count: 0,
        }],
    };
    let reply = |sim: &mut Sim, flags: u16, meter: ofp::MeterStats| {
        let msg = Message::MultipartReply(MultipartReply {
            flags,
            body: MultipartReplyBody::Meter(vec![meter]),
        });
        let now = sim.now;
        sim.c.handle_message(now, 1, &msg, &mut sim.out);
    };
    // One controller interval: (METER_STATS polls sent, whether METER was modified).
    let tick = |sim: &mut Sim| {
        sim.now += Duration::from_millis(100);
        let now = sim.now;
        sim.c.handle_tick(now, &mut sim.out);
        let msgs: Vec<(u64, Message)> = sim.out.drain().collect();
        let polls = msgs
            .iter()
            .filter(|(_, m)| {
                matches!(m, Message::MultipartRequest(r)
                    if matches!(r.body, MultipartRequestBody::Meter { .. }))
            })
            .count();
        let modified = msgs.iter().any(|(_, m)| {
            matches!(m, Message::MeterMod(mm)
                if mm.command == ofp::MeterModCommand::Modify && mm.meter_id == METER)
        });
        for (d, m) in msgs {
            sim.carry_out(d, m);
        }
        sim.pump();
        (polls, modified)
    };
    // The table-miss meter drops nothing here: every drop counted is METER's.
    let dropped = |sim: &Sim| sim.c.controller_gap_view().gap.meter_dropped_total;

    let mut sim = Sim::new(&config, &[(1, 3)], &[], &[]);
    // METER's band count before the modification. Every poll is answered in its own tick
    // (the fake switch answers none), starting with the one of `Sim::new`'s tick.
    const OLD: u64 = 1_000;
    reply(&mut sim, 0, stats(METER, OLD));
    assert_eq!(dropped(&sim), OLD);
    let mut modified = false;
    for _ in 0..50 {
        sim.c.record_packet_in_work(WorkSample {
            packet_ins: 200,
            busy: Duration::from_millis(100),
            queueing: Duration::from_millis(20),
            backlog: 500,
            switch: 1,
            ..WorkSample::default()
        });
        let polls;
        (polls, modified) = tick(&mut sim);
        assert_eq!(polls, 1, "a poll every controller interval");
        if modified {
            break;
        }
        reply(&mut sim, 0, stats(METER, OLD));
    }
    assert!(modified, "the saturated controller modified the meter");
    assert_eq!(dropped(&sim), OLD, "no drops since the first reply");

    // This tick's poll went out before the OFPMC_MODIFY: its reply, in two parts, still
    // counts from OLD.
    reply(&mut sim, ofp::MULTIPART_MORE, stats(TABLE_MISS_METER, 0));
    reply(&mut sim, 0, stats(METER, OLD + 10));
    assert_eq!(dropped(&sim), OLD + 10, "10 new drops, not OLD + 10");

    // The next poll's reply is the first after the modification: counted from zero,
    // though above the last count.
    let (polls, modified) = tick(&mut sim);
    assert_eq!((polls, modified), (1, false));
    reply(&mut sim, 0, stats(METER, OLD + 500));
    assert_eq!(
        dropped(&sim),
        2 * OLD + 510,
        "the restarted count is all new"
    );
}

/// A switch's band counts are its to send: ones whose sum overflows a u64 are taken at
/// the most a u64 holds, never wrapped into a small count (or, in a debug build, a
/// panic under the core's lock).
#[test]
fn meter_band_counts_that_overflow_saturate() {
    use crate::testkit::sim::{Sim, VIP, ip};
    use ofp::{Message, MultipartReply, MultipartReplyBody};

    let config = format!(
        "[controller.overload]\nmode = \"adaptive\"\n\
         [[service]]\nname = \"web\"\nvip = \"{VIP}\"\nport = 80\n\
         [service.health]\nkind = \"none\"\n\
         [[service.backend]]\naddress = \"{}\"\n",
        ip(2)
    );
    let mut sim = Sim::new(&config, &[(1, 3)], &[], &[]);
    let band = |packet_band_count| ofp::MeterBandStats {
        packet_band_count,
        byte_band_count: 0,
    };
    let reply = |sim: &mut Sim, counts: [u64; 2]| {
        let msg = Message::MultipartReply(MultipartReply {
            flags: 0,
            body: MultipartReplyBody::Meter(vec![ofp::MeterStats {
                meter_id: SERVICE_METER_BASE,
                flow_count: 1,
                packet_in_count: 0,
                byte_in_count: 0,
                duration_sec: 1,
                duration_nsec: 0,
                band_stats: counts.map(band).to_vec(),
            }]),
        });
        let now = sim.now;
        sim.c.handle_message(now, 1, &msg, &mut sim.out);
    };
    let dropped = |sim: &Sim| sim.c.controller_gap_view().gap.meter_dropped_total;

    reply(&mut sim, [10, 20]);
    assert_eq!(dropped(&sim), 30);
    reply(&mut sim, [u64::MAX - 5, 100]);
    assert_eq!(dropped(&sim), u64::MAX, "saturated, not wrapped");
    reply(&mut sim, [u64::MAX, u64::MAX]);
    assert_eq!(dropped(&sim), u64::MAX, "the same count again adds nothing");
}

/// A meter is not modified for a jitter of one quantization step (each OFPMC_MODIFY
/// refills its bucket), unless the step lasts; a real change is made at the next hold.
#[test]
fn a_meter_changes_for_a_real_change_not_for_a_jitter() {
    let band = |rate: f64| meter_plan(Some(rate), 1.0, None, 100);
    let hold = Duration::from_millis(200);
    let (have, up_one, up_two) = (band(1_000.0), band(1_050.0), band(1_200.0));
    assert_ne!(have, up_one, "the next step up");
    assert!(!meter_change_due(have, have, hold * 10, hold));
    assert!(
        !meter_change_due(have, up_two, hold / 2, hold),
        "within the hold"
    );
    assert!(
        meter_change_due(have, up_two, hold, hold),
        "two steps: at once"
    );
    assert!(meter_change_due(up_two, have, hold, hold), "down as well");
    assert!(
        !meter_change_due(have, up_one, hold, hold),
        "one step: waits"
    );
    assert!(!meter_change_due(up_one, have, hold * 4, hold));
    assert!(meter_change_due(
        have,
        up_one,
        hold * METER_SMALL_CHANGE_HOLDS,
        hold
    ));
    // Opening a meter (no limit) or closing one is always a real change.
    assert!(meter_change_due(have, band(f64::INFINITY), hold, hold));
}

/// A controller gap in adaptive mode after ten control intervals (100 ms) of `sample`,
/// none of which gapped it; with its start and its interval.
fn after_a_quiet_second(sample: WorkSample) -> (ControllerGap, Instant, Duration) {
    let mut g = ControllerGap::new(ControllerOverloadConfig {
        mode: Mode::Adaptive,
        ..ControllerOverloadConfig::default()
    });
    let t0 = Instant::now();
    let tick = Duration::from_millis(100);
    for k in 1..=10 {
        g.record(sample);
        assert_eq!(g.step(t0 + tick * k).and_then(|s| s.after), None);
    }
    (g, t0, tick)
}

/// The controller's first cut after idle: when its CPU overloads, from the PACKET_INs it
/// handled in that window (the smoothed rate still lags the step); when its channel does
/// (a switch that does not read what it is sent), deeper, from the smoothed rate.
#[test]
fn the_controllers_first_cut_depends_on_what_overloads() {
    let first_cut = |outflow: u64| {
        // Idle for a second, at 100 PACKET_INs a second, 200 µs each.
        let (mut g, t0, tick) = after_a_quiet_second(WorkSample {
            packet_ins: 10,
            busy: Duration::from_millis(2),
            switch: 1,
            ..WorkSample::default()
        });
        // Then 5,000 a second: all its time.
        g.record(WorkSample {
            packet_ins: 500,
            busy: tick,
            outflow,
            switch: 1,
            ..WorkSample::default()
        });
        let step = g.step(t0 + tick * 11).expect("a step");
        (step.load, step.after.expect("a cut"))
    };
    // CPU: load 1/0.9; mid / load = 0.95 × 0.9 of the window's 5,000.
    let (load, cut) = first_cut(0);
    assert!((load - 1.0 / 0.9).abs() < 1e-9, "{load}");
    assert!((cut - 5_000.0 * 0.95 * 0.9).abs() < 1.0, "{cut}");
    // Channel: twice the outflow target; by at most half, of a smoothed rate under 2,000.
    let (load, cut) = first_cut(2 * config::DEFAULT_TARGET_OUTFLOW_BYTES);
    assert!((load - 2.0).abs() < 1e-9, "{load}");
    assert!(cut < 1_000.0, "{cut}");
}

/// The control channel's round trip is a load like the others: one that stands over a
/// window beyond `target_rtt_ms` cuts the admitted rate, and one slow echo among fast ones
/// (a burst the switch drained within the window) does not. The slowest switch counts.
#[test]
fn a_standing_channel_round_trip_beyond_its_target_cuts_the_admitted_rate() {
    let run = |rtts_ms: &[u64]| {
        // A second at 2,000 PACKET_INs a second, 10 % busy, the channel fast.
        let (mut g, t0, tick) = after_a_quiet_second(WorkSample {
            packet_ins: 200,
            busy: Duration::from_millis(10),
            channel_rtt: Duration::from_micros(300),
            switch: 1,
            ..WorkSample::default()
        });
        // Then a window whose batches read these round trips: switch 1 fast throughout,
        // switch 2 as given.
        for &ms in rtts_ms {
            for (switch, rtt) in [
                (1, Duration::from_micros(300)),
                (2, Duration::from_millis(ms)),
            ] {
                g.record(WorkSample {
                    packet_ins: 50,
                    busy: Duration::from_millis(2),
                    channel_rtt: rtt,
                    switch,
                    ..WorkSample::default()
                });
            }
        }
        let step = g.step(t0 + tick * 11).expect("a step");
        (step.load, step.after, g.view().channel_rtt_ms)
    };
    let target = config::DEFAULT_TARGET_RTT_MS as f64;
    // Four times the target, all window long: load 4, a cut.
    let (load, after, rtt) = run(&[200, 210, 250, 200]);
    assert!((rtt - 200.0).abs() < 1e-9, "{rtt}");
    assert!((load - 200.0 / target).abs() < 1e-9, "{load}");
    let cut = after.expect("a cut");
    assert!(cut < 2_000.0, "{cut}");
    // One slow reading among fast ones: the standing round trip is the fast one.
    let (load, after, rtt) = run(&[1, 300, 1, 1]);
    assert!((rtt - 1.0).abs() < 1e-9, "{rtt}");
    assert!(load < 1.0, "{load}");
    assert_eq!(after, None);
}
