//! The controller core at data-centre scale: a discrete-event simulation of a leaf-spine
//! fabric, its servers and its clients, driving the very `Controller` the `flowgate
//! controller` process runs (sans-IO: events in, OpenFlow messages out, time passed in).
//!
//! What is real and what is modelled:
//! - **Real:** the controller core: link discovery over LLDP, host learning from ARP,
//!   paths, every balancing algorithm, the connection table, the deferral of rules to the
//!   client's ACK, and both levels of ACCM (the services' gaps and the controller's own),
//!   with their meters, OFF-period rules and refusals. It sees OpenFlow messages only.
//! - **Modelled** ([`switch`]): of each switch, what decides a new connection's SYN
//!   before the controller: gap rules and meters (token buckets). Established
//!   connections are carried by their rules, not simulated packet by packet; their rules
//!   end `fin_timeout_secs` after the response (Open vSwitch's `fin_timeout`), and the
//!   controller gets their FLOW_REMOVEDs.
//! - **Modelled** ([`server`]): each backend is `workers` parallel slots with exponential
//!   service times and a bounded accept queue; it reports its completion rate, requests in
//!   it, busy share and response time every `report_every` (the paper's 10 ms refresh), as
//!   a backend's metrics endpoint does.
//! - **Modelled:** the controller's CPU: one PACKET_IN costs `controller_cost`, handled in
//!   order of arrival; its busy time and queueing go to the controller's own gap as the
//!   runtime's measurements do. Clients: Poisson arrivals, one request per connection, SYN
//!   retransmitted after 1 s and 2 s more when dropped silently, given up after that.
//!
//! Every run with the same [`Scenario`] gives the same numbers: arrivals come from their
//! own random stream (the same for every algorithm: common random numbers), service
//! times from another, the controller from its configured seed.

pub mod engine;
pub mod fabric;
pub mod report;
pub mod server;
pub mod switch;

use std::time::Duration;

pub use engine::{Outcome, PhaseStats, Sample, run};
pub use fabric::Shape;

/// What a SYN the controller refuses costs it, as a share of one it places: measured by
/// `cargo bench -p flowgate-core --features testkit --bench packet_in`, `syn/refused/0`
/// against `syn/round-robin/0` (docs/simulator.md).
pub const REFUSAL_SHARE: f64 = 0.5;

/// The overload controls a scenario may name: the three modes of `[service.overload]`
/// (and, for `adaptive`, of `[controller.overload]`), and `adaptive-no-ceiling`, `adaptive`
/// with `ceiling = false`: the adaptive law without the ceiling that otherwise holds the
/// service's gate at `capacity_rps × (low+high)/2` while no gap is in force (the ablation).
pub const OVERLOADS: [&str; 4] = ["off", "static", "adaptive", "adaptive-no-ceiling"];

/// One simulated experiment: the fabric, the servers, the load, and the controller's
/// choices.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Scenario {
    pub shape: Shape,
    /// Requests in service at once on one server.
    pub workers: u32,
    /// Mean service time of a request at speed 1.
    pub service: Duration,
    /// Server speeds, cycled over the servers (heterogeneous pools: 1, 1, 0.5, 2 ...).
    pub speeds: Vec<f64>,
    /// Requests waiting at one server beyond its workers before it refuses.
    pub backlog: u32,
    /// Offered load in phases of `phase` each, as fractions of the pool's capacity.
    pub loads: Vec<f64>,
    pub phase: Duration,
    /// The balancing algorithm (`isslm`, `round-robin`, `p2c`, ...).
    pub algorithm: String,
    /// ISSLM's load threshold (`threshold_rps`), a fraction of a server's mean capacity:
    /// one number for the whole pool, as the paper has it.
    pub isslm_threshold: f64,
    /// ACCM for the service and the controller: `off`, `static`, `adaptive` or
    /// `adaptive-no-ceiling` ([`OVERLOADS`]).
    pub overload: String,
    /// The controller's CPU time per PACKET_IN.
    pub controller_cost: Duration,
    /// Its CPU time for a new connection's SYN it does not place (refused with a RST, or
    /// dropped by its gate), as a share of `controller_cost` ([`REFUSAL_SHARE`]).
    pub refusal_share: f64,
    /// How often each server's load figures reach the controller.
    pub report_every: Duration,
    /// One network round trip between a client and a server (half each way).
    pub rtt: Duration,
    pub seed: u64,
}

impl Scenario {
    /// A small data centre: 16 leaves, 4 spines, 16 servers and 16 clients a leaf (256
    /// servers, 256 clients), 4 workers a server, 10 ms mean service, mixed speeds.
    pub fn data_centre() -> Self {
        Scenario {
            shape: Shape {
                leaves: 16,
                spines: 4,
                servers_per_leaf: 16,
                clients_per_leaf: 16,
            },
            workers: 4,
            service: Duration::from_millis(10),
            speeds: vec![1.0, 1.0, 0.5, 2.0],
            backlog: 64,
            loads: vec![0.5, 0.9, 1.3],
            phase: Duration::from_secs(4),
            algorithm: "isslm".into(),
            isslm_threshold: 0.8,
            overload: "off".into(),
            controller_cost: Duration::from_micros(2),
            refusal_share: REFUSAL_SHARE,
            report_every: Duration::from_millis(10),
            rtt: Duration::from_micros(100),
            seed: 1,
        }
    }

    /// Requests per second the whole pool completes with every worker busy.
    pub fn capacity(&self) -> f64 {
        (0..self.shape.servers())
            .map(|i| f64::from(self.workers) * self.speed(i) / self.service.as_secs_f64().max(1e-9))
            .sum()
    }

    /// The controller's CPU time for a new connection's SYN it does not place.
    pub fn refusal_cost(&self) -> Duration {
        self.controller_cost.mul_f64(self.refusal_share)
    }

    pub fn speed(&self, server: usize) -> f64 {
        if self.speeds.is_empty() {
            return 1.0;
        }
        self.speeds[server % self.speeds.len()].max(1e-3)
    }

    /// What is wrong with the scenario, every problem.
    pub fn check(&self) -> Result<(), String> {
        let mut errs = Vec::new();
        if let Err(e) = self.shape.check() {
            errs.push(e);
        }
        if self.workers == 0 {
            errs.push("workers must be at least 1".into());
        }
        if self.service.is_zero() {
            errs.push("the service time must be over 0".into());
        }
        if self.loads.is_empty() || !self.loads.iter().all(|&l| positive(l) && l <= 10.0) {
            errs.push("loads must each be in (0, 10]".into());
        }
        if self.phase.is_zero() {
            errs.push("a phase must last over 0 s".into());
        }
        if !self.speeds.iter().all(|&s| positive(s)) {
            errs.push("speeds must be over 0".into());
        }
        if !OVERLOADS.contains(&self.overload.as_str()) {
            errs.push(format!(
                "overload {:?}: off, static, adaptive or adaptive-no-ceiling",
                self.overload
            ));
        }
        if !(positive(self.refusal_share) && self.refusal_share <= 1.0) {
            errs.push("refusal_share must be in (0, 1]".into());
        }
        if !positive(self.isslm_threshold) {
            errs.push("isslm_threshold must be over 0".into());
        }
        if self.report_every.is_zero() {
            errs.push("report_every must be over 0".into());
        }
        if errs.is_empty() {
            Ok(())
        } else {
            Err(errs.join("; "))
        }
    }
}

/// Over zero and finite (not NaN).
fn positive(x: f64) -> bool {
    x.is_finite() && x > 0.0
}
