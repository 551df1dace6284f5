use super::*;

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

// ---- active health ------------------------------------------------------------------

#[test]
fn active_defaults_are_haproxy() {
    let h = ActiveHealth::default();
    assert_eq!((h.rise, h.fall, h.state), (2, 3, HealthState::Unknown));
    assert!(!h.is_healthy());
}

#[test]
fn first_success_marks_healthy() {
    let mut h = ActiveHealth::default();
    assert_eq!(h.on_probe(true), Some(HealthTransition::Up));
    assert!(h.is_healthy());
    assert_eq!(h.on_probe(true), None);
}

#[test]
fn failure_before_any_success_is_down_then_needs_rise() {
    let mut h = ActiveHealth::default();
    assert_eq!(h.on_probe(false), Some(HealthTransition::Down));
    assert_eq!(h.on_probe(true), None);
    assert_eq!(h.on_probe(true), Some(HealthTransition::Up));
}

#[test]
fn fall_three_consecutive_failures() {
    let mut h = ActiveHealth::default();
    h.on_probe(true);
    assert_eq!(h.on_probe(false), None);
    assert_eq!(h.on_probe(false), None);
    assert_eq!(h.on_probe(true), None); // resets the failure count
    assert_eq!(h.on_probe(false), None);
    assert_eq!(h.on_probe(false), None);
    assert_eq!(h.on_probe(false), Some(HealthTransition::Down));
    assert_eq!(h.state, HealthState::Unhealthy);
    assert_eq!(h.on_probe(false), None);
}

#[test]
fn rise_two_consecutive_successes() {
    let mut h = ActiveHealth::default();
    h.on_probe(true);
    for _ in 0..3 {
        h.on_probe(false);
    }
    assert_eq!(h.on_probe(true), None);
    assert_eq!(h.on_probe(false), None); // resets the success count
    assert_eq!(h.on_probe(true), None);
    assert_eq!(h.on_probe(true), Some(HealthTransition::Up));
}

#[test]
fn zero_rise_fall_behave_as_one_and_force_down() {
    let mut h = ActiveHealth::new(0, 0);
    h.on_probe(true);
    assert_eq!(h.on_probe(false), Some(HealthTransition::Down));
    assert_eq!(h.on_probe(true), Some(HealthTransition::Up));
    assert_eq!(h.force_down(), Some(HealthTransition::Down));
    assert_eq!(h.force_down(), None);
}

// ---- outliers -----------------------------------------------------------------------

#[test]
fn ejects_after_five_consecutive_failures() {
    let t0 = Instant::now();
    let mut o = Outlier::new(OutlierConfig::default());
    for _ in 0..4 {
        assert_eq!(o.on_failure(t0), None);
    }
    o.on_success(t0); // resets
    for _ in 0..4 {
        assert_eq!(o.on_failure(t0), None);
    }
    assert_eq!(o.on_failure(t0), Some(t0 + secs(30)));
    assert!(o.is_ejected(t0 + secs(29)));
    assert!(!o.is_ejected(t0 + secs(30)));
    // failures while ejected are ignored
    assert_eq!(o.on_failure(t0 + secs(1)), None);
    assert_eq!(o.consecutive_failures(), 0);
}

#[test]
fn ejection_time_grows_and_is_capped() {
    let cfg = OutlierConfig::default();
    let mut o = Outlier::new(cfg);
    let mut now = Instant::now();
    let mut got = Vec::new();
    for _ in 0..12 {
        let mut until = None;
        for _ in 0..5 {
            until = o.on_failure(now);
        }
        let until = until.expect("ejected");
        got.push((until - now).as_secs());
        // Fail again right after the ejection ends: no time to decay.
        now = until;
    }
    assert_eq!(
        got,
        vec![30, 60, 90, 120, 150, 180, 210, 240, 270, 300, 300, 300]
    );
}

#[test]
fn multiplier_decays_while_healthy() {
    let cfg = OutlierConfig::default();
    let mut o = Outlier::new(cfg);
    let t0 = Instant::now();
    let eject = |o: &mut Outlier, now| {
        let mut u = None;
        for _ in 0..5 {
            u = o.on_failure(now);
        }
        u.expect("ejected")
    };
    let u1 = eject(&mut o, t0); // 30 s, multiplier 1
    let u2 = eject(&mut o, u1); // 60 s, multiplier 2
    assert_eq!(u2 - u1, secs(60));
    assert_eq!(o.multiplier(u2), 2);
    assert_eq!(o.multiplier(u2 + secs(9)), 2);
    assert_eq!(o.multiplier(u2 + secs(10)), 1);
    assert_eq!(o.multiplier(u2 + secs(25)), 0);
    // After 10 s of good behaviour the next ejection is 30 s × 2 again, not × 3.
    let u3 = eject(&mut o, u2 + secs(10));
    assert_eq!(u3 - (u2 + secs(10)), secs(60));
}

#[test]
fn max_ejection_percent_limits_the_pool() {
    let t0 = Instant::now();
    // 20 hosts, 10 %: two may be ejected at once.
    let mut p = PoolOutliers::new(OutlierConfig::default(), 20);
    let fail5 = |p: &mut PoolOutliers, i| {
        let mut u = None;
        for _ in 0..5 {
            u = p.on_failure(i, t0);
        }
        u
    };
    assert!(fail5(&mut p, 0).is_some());
    assert!(fail5(&mut p, 1).is_some());
    assert!(fail5(&mut p, 2).is_none());
    assert_eq!(p.ejected_count(t0), 2);
    assert!(!p.is_ejected(2, t0));
    // Host 2 keeps its count: once host 0 is back, its next failure ejects it.
    let later = t0 + secs(31);
    assert!(!p.is_ejected(0, later));
    assert!(p.on_failure(2, later).is_some());
}

#[test]
fn at_least_one_host_is_always_ejectable() {
    let t0 = Instant::now();
    let mut p = PoolOutliers::new(OutlierConfig::default(), 4);
    let fail5 = |p: &mut PoolOutliers, i| (0..5).filter_map(|_| p.on_failure(i, t0)).last();
    assert!(fail5(&mut p, 3).is_some()); // 10 % of 4 < 1, still one
    assert!(fail5(&mut p, 1).is_none());
    let cfg = OutlierConfig {
        max_ejection_percent: 0,
        ..OutlierConfig::default()
    };
    let mut p = PoolOutliers::new(cfg, 1);
    assert!(fail5(&mut p, 0).is_some());
    // Out-of-range host: no panic.
    assert!(p.on_failure(7, t0).is_none());
    assert!(!p.is_ejected(7, t0));
}

#[test]
fn uneject_ends_ejection_early() {
    let t0 = Instant::now();
    let mut p = PoolOutliers::new(OutlierConfig::default(), 3);
    for _ in 0..5 {
        p.on_failure(0, t0);
    }
    assert!(p.is_ejected(0, t0 + secs(1)));
    p.uneject(0, t0 + secs(1));
    assert!(!p.is_ejected(0, t0 + secs(1)));
    p.resize(5);
    p.remove(0);
    assert_eq!(p.len(), 4);
}

// ---- slow start ---------------------------------------------------------------------

#[test]
fn slow_start_ramp_is_linear_with_floor() {
    let t0 = Instant::now();
    let mut s = SlowStart::new(secs(60));
    assert_eq!(s.effective_weight(t0, 100), 100); // not started
    s.start(t0);
    assert_eq!(s.effective_weight(t0, 100), 10); // 10 % floor
    assert_eq!(s.effective_weight(t0 + secs(3), 100), 10); // 5 % < floor
    assert_eq!(s.effective_weight(t0 + secs(15), 100), 25);
    assert_eq!(s.effective_weight(t0 + secs(30), 100), 50);
    assert_eq!(s.effective_weight(t0 + secs(45), 100), 75);
    assert_eq!(s.effective_weight(t0 + secs(60), 100), 100);
    assert!(!s.is_active(t0 + secs(60)));
    assert_eq!(s.effective_weight(t0 + secs(90), 100), 100);
    // Never 0 for a non-zero base; 0 stays 0.
    assert_eq!(s.effective_weight(t0, 1), 1);
    assert_eq!(s.effective_weight(t0, 0), 0);
    // Time going backwards (earlier `now`): the floor, no panic.
    assert_eq!(
        s.effective_weight(t0.checked_sub(secs(1)).unwrap_or(t0), 100),
        10
    );
}

#[test]
fn slow_start_aggression() {
    let t0 = Instant::now();
    let mut s = SlowStart::new(secs(100));
    s.aggression = 2.0;
    s.start(t0);
    // (0.25)^(1/2) = 0.5
    assert_eq!(s.effective_weight(t0 + secs(25), 100), 50);
    s.aggression = f64::NAN; // treated as 1.0
    assert_eq!(s.effective_weight(t0 + secs(25), 100), 25);
    let z = SlowStart {
        window: Duration::ZERO,
        ..s
    };
    assert_eq!(z.effective_weight(t0, 100), 100);
}

#[test]
fn admin_state_parse_and_display() {
    assert_eq!("draining".parse::<AdminState>(), Ok(AdminState::Draining));
    assert_eq!("Drain".parse::<AdminState>(), Ok(AdminState::Draining));
    assert_eq!("ready".parse::<AdminState>(), Ok(AdminState::Active));
    assert!("maint".parse::<AdminState>().is_err());
    assert_eq!(AdminState::default().to_string(), "active");
    assert!(AdminState::Active.accepts_new());
    assert!(!AdminState::Draining.accepts_new());
}

// ---- the rate detectors ---------------------------------------------------------------

/// A pool whose host `i` answers `answered[i]` of `per_host` connections in one interval,
/// its failures spread among its successes (each out of order, as a dropping host's are:
/// it answered a later connection), then swept at the interval's end.
fn sweep_one_interval(
    cfg: OutlierConfig,
    answered: &[u32],
    per_host: u32,
) -> (PoolOutliers, Vec<(usize, Instant, Detector)>, Instant) {
    let t0 = Instant::now();
    let mut p = PoolOutliers::new(cfg, answered.len());
    assert!(p.sweep(t0).is_empty(), "the first call starts the interval");
    for (i, &ok) in answered.iter().enumerate() {
        for k in 0..per_host {
            if k < ok {
                p.on_success(i, t0 + secs(1));
            } else {
                p.on_failure_out_of_order(i, t0 + secs(1));
            }
        }
    }
    let end = t0 + cfg.interval;
    assert!(
        p.sweep(end - secs(1)).is_empty(),
        "not due before the interval ends"
    );
    let ejected = p.sweep(end);
    (p, ejected, end)
}

#[test]
fn success_rate_ejects_a_host_that_drops_half_its_connections() {
    let cfg = OutlierConfig::default();
    let (p, ejected, end) = sweep_one_interval(cfg, &[100, 100, 99, 100, 50], 100);
    assert_eq!(ejected, vec![(4, end + secs(30), Detector::SuccessRate)]);
    assert!(p.is_ejected(4, end));
    assert_eq!(
        p.host(4).and_then(|h| h.ejected_by()),
        Some(Detector::SuccessRate)
    );
    // Its failures were never in a row: the consecutive detector saw none.
    assert_eq!(p.host(4).map(|h| h.consecutive_failures()), Some(0));
    let stats = p.success_rate_stats().expect("five hosts judged");
    assert_eq!(stats.hosts, 5);
    assert!((stats.mean - 89.8).abs() < 1e-9, "{stats:?}");
    // The population's deviation is √(1980.8 / 5) = 19.904; 89.8 − 1.9 × 19.904 = 51.98.
    assert!((stats.threshold - 51.983).abs() < 0.01, "{stats:?}");
    assert_eq!(
        p.host(4).map(|h| h.last_window()),
        Some(RateWindow {
            outcomes: 100,
            failures: 50
        })
    );
    // An interval without outcomes judges nothing: the last judgement is not shown as
    // the pool's still.
    let mut off = PoolOutliers::new(
        OutlierConfig {
            success_rate: None,
            ..cfg
        },
        5,
    );
    off.keep_sweep(&p);
    let mut p = p;
    assert!(p.sweep(end + cfg.interval).is_empty());
    assert_eq!(p.success_rate_stats(), None);
    // Nor after a reload turns the detector off.
    assert!(off.success_rate_stats().is_some(), "kept across the reload");
    assert!(off.sweep(end + cfg.interval).is_empty());
    assert_eq!(off.success_rate_stats(), None);
}

#[test]
fn success_rate_judges_no_pool_under_its_minimum_or_volume() {
    let cfg = OutlierConfig::default();
    // Four hosts: under the minimum of five, however far one falls.
    let (p, ejected, _) = sweep_one_interval(cfg, &[100, 100, 100, 0], 100);
    assert!(ejected.is_empty());
    assert_eq!(p.success_rate_stats(), None);
    // Five hosts, each under the volume (99 outcomes of the 100 needed): none judged.
    let (p, ejected, _) = sweep_one_interval(cfg, &[99, 99, 99, 99, 50], 99);
    assert!(ejected.is_empty());
    assert_eq!(p.success_rate_stats(), None);
    // Turned off.
    let off = OutlierConfig {
        success_rate: None,
        ..cfg
    };
    let (_, ejected, _) = sweep_one_interval(off, &[100, 100, 99, 100, 50], 100);
    assert!(ejected.is_empty());
}

#[test]
fn success_rate_ejects_no_one_when_the_whole_pool_loses_alike() {
    // A switch that loses a third of every backend's answers: no outlier.
    let (p, ejected, _) = sweep_one_interval(OutlierConfig::default(), &[66, 68, 67, 65, 67], 100);
    assert!(ejected.is_empty(), "{ejected:?}");
    assert!(p.success_rate_stats().is_some_and(|s| s.threshold < 65.0));
}

#[test]
fn failure_percentage_ejects_at_its_threshold_when_on() {
    let fp = FailurePercentageConfig {
        threshold: 40,
        minimum_hosts: 3,
        request_volume: 20,
    };
    let cfg = OutlierConfig {
        success_rate: None,
        failure_percentage: Some(fp),
        ..OutlierConfig::default()
    };
    // 40 % failed: at the threshold, ejected; 39 % is not.
    let (_, ejected, end) = sweep_one_interval(cfg, &[20, 20, 12], 20);
    assert_eq!(
        ejected,
        vec![(2, end + secs(30), Detector::FailurePercentage)]
    );
    let (_, ejected, _) = sweep_one_interval(cfg, &[100, 100, 61], 100);
    assert!(ejected.is_empty());
    // Off by default, as Envoy's is (enforcing_failure_percentage 0).
    assert_eq!(OutlierConfig::default().failure_percentage, None);
    let (_, ejected, _) = sweep_one_interval(OutlierConfig::default(), &[20, 20, 0], 20);
    assert!(ejected.is_empty());
    // Two hosts of enough volume are under its minimum of three.
    let (_, ejected, _) = sweep_one_interval(cfg, &[20, 20, 0, 5], 20);
    assert_eq!(ejected.len(), 1, "the three of volume judged: {ejected:?}");
    let (_, ejected, _) = sweep_one_interval(cfg, &[20, 0], 20);
    assert!(ejected.is_empty());
}

#[test]
fn the_rate_detectors_keep_to_the_pool_cap_and_skip_the_ejected() {
    let fp = FailurePercentageConfig {
        threshold: 50,
        minimum_hosts: 1,
        request_volume: 10,
    };
    let cfg = OutlierConfig {
        failure_percentage: Some(fp),
        ..OutlierConfig::default()
    };
    // 10 % of ten hosts: one ejected, the other failing host waits.
    let (mut p, ejected, end) =
        sweep_one_interval(cfg, &[10, 10, 10, 10, 10, 10, 10, 10, 0, 0], 10);
    assert_eq!(ejected.len(), 1, "{ejected:?}");
    assert_eq!(p.ejected_count(end), 1);
    // The ejected host's outcomes are not counted while it is out; the next interval
    // judges the other one.
    let next = end + cfg.interval;
    for i in 0..10 {
        for _ in 0..10 {
            if i >= 8 {
                p.on_failure_out_of_order(i, end + secs(1));
            } else {
                p.on_success(i, end + secs(1));
            }
        }
    }
    let again = p.sweep(next);
    assert_eq!(
        again.len(),
        0,
        "the cap still holds: one of ten is out: {again:?}"
    );
    let ejected_one = ejected[0].0;
    assert_eq!(
        p.host(ejected_one).map(|h| h.last_window().outcomes),
        Some(0),
        "an ejected host's outcomes do not count"
    );
}

#[test]
fn consecutive_failures_of_zero_turn_that_detector_off() {
    let cfg = OutlierConfig {
        consecutive_failures: 0,
        ..OutlierConfig::default()
    };
    let t0 = Instant::now();
    let mut p = PoolOutliers::new(cfg, 1);
    for _ in 0..100 {
        assert_eq!(p.on_failure(0, t0), None);
    }
    assert!(!p.is_ejected(0, t0));
}

#[test]
fn out_of_order_failures_break_no_run() {
    let t0 = Instant::now();
    let mut p = PoolOutliers::new(OutlierConfig::default(), 5);
    for _ in 0..4 {
        p.on_failure(0, t0);
    }
    for _ in 0..10 {
        p.on_failure_out_of_order(0, t0);
    }
    assert_eq!(p.host(0).map(|h| h.consecutive_failures()), Some(4));
    assert!(p.on_failure(0, t0).is_some(), "the fifth in a row ejects");
}
