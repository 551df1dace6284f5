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
//! - **Modelled:** faulty servers ([`Scenario::faulty`]), which silently drop a share of
//!   their connections, every SYN of them, until they recover; the controller's outlier
//!   detection judges them from the clients' retransmitted SYNs and the rules'
//!   FLOW_REMOVEDs, and the run records each ejection ([`Ejection`]). Unless
//!   [`Scenario::redispatch`] is off, the controller sends a connection judged silent to
//!   another server at its client's third SYN.
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

pub use engine::{Ejection, Outcome, PhaseStats, Sample, run};
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

/// The passive outlier detection a scenario may name (`[service.outlier]`):
/// - `default`: the controller's own, Envoy's: consecutive failures (5) and success rate;
/// - `off`: neither detector;
/// - `consecutive`, `success-rate`: that detector alone;
/// - `failure-percentage`: that detector alone, at [`FAILURE_PERCENTAGE_THRESHOLD`] %
///   (it is off in the controller's default, as in Envoy).
pub const OUTLIERS: [&str; 5] = [
    "default",
    "off",
    "consecutive",
    "success-rate",
    "failure-percentage",
];

/// The shortest idle timeout a scenario with faulty servers may have (`Scenario::check`).
pub const MIN_IDLE_WITH_FAULTY: u16 = 4;

/// The `failure-percentage` outlier setting's threshold: a backend that leaves this share
/// of its connections unanswered in an interval is ejected.
pub const FAILURE_PERCENTAGE_THRESHOLD: u32 = 20;

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
    /// Servers that silently drop a share of their connections ([`Scenario::is_faulty`]):
    /// every SYN of a dropped connection, its client's retransmissions too, as a server
    /// with a broken receive queue that the connection's hash picks, or a full accept
    /// queue that a connection meets every time.
    pub faulty: u32,
    /// The share of its connections a faulty server drops, in (0, 1].
    pub drop_share: f64,
    /// When the faulty servers recover (drop nothing more), from the first request;
    /// `None`: never.
    pub recover_at: Option<Duration>,
    /// Passive outlier detection ([`OUTLIERS`]).
    pub outlier: String,
    /// The connection rules' idle timeout (`idle_timeout_secs`): a silent connection's
    /// rules end, and its silence reaches the outlier detectors, this long after they
    /// were installed.
    pub idle_timeout_secs: u16,
    /// Whether the service redispatches (`redispatch`): a silent server's connection
    /// goes to another server at its client's SYN 2.5 s or more after the decision (the
    /// client's third, at 3 s).
    pub redispatch: bool,
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
            faulty: 0,
            drop_share: 0.5,
            recover_at: None,
            outlier: "default".into(),
            idle_timeout_secs: 30,
            redispatch: true,
            seed: 1,
        }
    }

    /// Whether server `i` is one of the `faulty`: spread evenly over the pool, the middle
    /// one of each of `faulty` equal runs of servers.
    pub fn is_faulty(&self, i: usize) -> bool {
        let (n, k) = (self.shape.servers(), self.faulty as usize);
        if k == 0 || k > n {
            return false;
        }
        let stride = n / k;
        i % stride == stride / 2 && i / stride < k
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
        if self.faulty as usize > self.shape.servers() {
            errs.push(format!(
                "faulty: {} servers of {}",
                self.faulty,
                self.shape.servers()
            ));
        }
        if !(positive(self.drop_share) && self.drop_share <= 1.0) {
            errs.push("drop_share must be in (0, 1]".into());
        }
        if !OUTLIERS.contains(&self.outlier.as_str()) {
            errs.push(format!(
                "outlier {:?}: {}",
                self.outlier,
                OUTLIERS.join(", ")
            ));
        }
        if self.idle_timeout_secs == 0 {
            errs.push("idle_timeout_secs must be at least 1".into());
        } else if self.faulty > 0 && self.idle_timeout_secs < MIN_IDLE_WITH_FAULTY {
            // A dropped connection's client sends its last SYN 3 s after its first, and
            // the controller installs the rules again then; the model ends those rules
            // when the client gives up (7 s), so they must not idle out before.
            errs.push(format!(
                "idle_timeout_secs must be at least {MIN_IDLE_WITH_FAULTY} with faulty servers"
            ));
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
