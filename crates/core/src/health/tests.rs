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
