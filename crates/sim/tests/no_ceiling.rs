//! `adaptive-no-ceiling`: the adaptive law without the service's ceiling, the ablation of
//! the ceiling, beside `adaptive` in the same scenario.

use std::time::Duration;

use flowgate_sim::engine::controller_config;
use flowgate_sim::{OVERLOADS, Scenario, Shape, run};

fn small(overload: &str, loads: &[f64]) -> Scenario {
    Scenario {
        shape: Shape {
            leaves: 4,
            spines: 2,
            servers_per_leaf: 4,
            clients_per_leaf: 4,
        },
        loads: loads.to_vec(),
        phase: Duration::from_secs(2),
        algorithm: "least-connections".into(),
        overload: overload.into(),
        ..Scenario::data_centre()
    }
}

/// The arm is a scenario like the others, and its controller config is `adaptive`'s with
/// `ceiling = "off"` for the service, which the controller accepts.
#[test]
fn the_ablation_is_adaptive_with_the_ceiling_off() {
    for o in OVERLOADS {
        assert_eq!(small(o, &[0.5]).check(), Ok(()), "{o}");
    }
    assert!(small("adaptive-no-gap", &[0.5]).check().is_err());
    let (with, without) = (
        controller_config(&small("adaptive", &[0.5])),
        controller_config(&small("adaptive-no-ceiling", &[0.5])),
    );
    assert!(!with.contains("ceiling"), "{with}");
    assert_eq!(
        without.matches("ceiling = \"off\"\n").count(),
        1,
        "{without}"
    );
    assert_eq!(
        without.replace("ceiling = \"off\"\n", ""),
        with,
        "adaptive's config, and the ceiling off"
    );
    let (with, without) = (
        flowgate_core::Config::from_toml(&with, &|_| None).expect("adaptive"),
        flowgate_core::Config::from_toml(&without, &|_| None).expect("no ceiling"),
    );
    assert!(with.services[0].overload.ceiling);
    assert!(!without.services[0].overload.ceiling);
    assert_eq!(without.services[0].overload.law().ceiling, None);
    assert_eq!(
        without.controller.overload.mode, with.controller.overload.mode,
        "the controller's own gap as adaptive's"
    );
}

/// A step from idle to 1.5 × capacity: with its ceiling the gate refuses from the first
/// new connection beyond `0.95 × capacity`; without it the law admits everything until it
/// has measured the overload, and so refuses fewer of the phase's new connections.
#[test]
fn without_the_ceiling_a_step_is_refused_later() {
    let (with, without) = (
        run(&small("adaptive", &[1.5])).expect("adaptive"),
        run(&small("adaptive-no-ceiling", &[1.5])).expect("no ceiling"),
    );
    let (a, b) = (&with.phases[0], &without.phases[0]);
    eprintln!(
        "offered / served / refused: adaptive {} / {} / {}, no ceiling {} / {} / {}",
        a.offered, a.served, a.reset, b.offered, b.served, b.reset
    );
    assert!(a.reset > 0 && b.reset > 0, "both gap: {a:?} {b:?}");
    assert!(
        b.reset < a.reset,
        "no ceiling {} vs {} refused",
        b.reset,
        a.reset
    );
}
