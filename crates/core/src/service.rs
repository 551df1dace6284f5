//! A service's live state: its backends with their measured load and health, and the
//! balancer that decides for it.
//!
//! Load is refreshed on the controller's refresh tick (about every 10 ms, as the source
//! paper's server-load module does), never on the decision path: a decision reads the
//! last refresh plus the connections assigned since (`picks_since_refresh`), so a burst
//! between two refreshes does not herd onto the server that looked idle 10 ms ago.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use flowgate_packet::MacAddr;
use serde::Serialize;

use crate::balance::{AlgorithmKind, AlgorithmParams, BackendLoad, Balancer, Search};
use crate::config::{BackendConfig, HealthConfig, HealthKind, ServiceConfig};
use crate::health::{ActiveHealth, Detector, PoolOutliers, SlowStart};

/// Time constant of the request-rate average. A 10 ms window alone is too noisy (one new
/// connection in 10 ms reads as 100 per second); one second of memory is smooth and still
/// follows a step in load within a few seconds.
pub const RATE_TIME_CONSTANT: Duration = Duration::from_secs(1);

/// An operator's wish for a backend, independent of its health (re-exported here, where
/// backends live).
pub use crate::health::AdminState;

/// A backend's number in its service (re-exported here, where backends live; defined
/// with the connection table, which names backends by it).
pub use crate::conntrack::BackendId;

/// The numbers a service may give its backends (after them, it numbers them afresh:
/// [`ServiceState::renumber`]).
pub const BACKEND_IDS: usize = u16::MAX as usize;

/// What a backend number stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Numbered {
    /// A backend of the pool, at this position.
    Live(u16),
    /// A backend that left the pool: its connections stay open, by their rules, until
    /// they end, and keep going where it was. `open`: how many are left.
    Left {
        address: Ipv4Addr,
        mac: Option<MacAddr>,
        open: u32,
    },
}

/// The number a backend at `address` had when it left the pool, and the connections
/// still open to it.
fn left_number(numbers: &[Numbered], address: Ipv4Addr) -> Option<(usize, u32)> {
    numbers.iter().enumerate().find_map(|(i, n)| match *n {
        Numbered::Left {
            address: a, open, ..
        } if a == address => Some((i, open)),
        _ => None,
    })
}

/// Number `b`, which joins the pool: the number it had when it left, if it had one, with
/// the connections still open to it counted as its own again; else the next, if any is
/// left. Its entry says `Live(0)` until the caller places it.
fn take_number(numbers: &mut Vec<Numbered>, b: &mut BackendState) -> Option<BackendId> {
    let id = match left_number(numbers, b.address) {
        Some((id, open)) => {
            b.active_connections = open;
            numbers[id] = Numbered::Live(0);
            id
        }
        None if numbers.len() < BACKEND_IDS => {
            numbers.push(Numbered::Live(0));
            numbers.len() - 1
        }
        None => return None,
    };
    b.id = BackendId(id as u16);
    Some(b.id)
}

/// A backend that left its service's pool while connections to it were open: where they
/// go, and how many are still open (when none is, the backend can be taken down without
/// breaking a connection).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LeftBackend {
    pub address: Ipv4Addr,
    pub open_connections: u32,
}

#[derive(Debug, Clone)]
pub struct BackendState {
    /// Its number in the service ([`BackendId`]).
    pub id: BackendId,
    pub address: Ipv4Addr,
    /// Configured weight (before slow start).
    pub weight: u32,
    pub metrics_url: Option<String>,
    pub admin: AdminState,
    /// Result of active health checks (true until a check says otherwise).
    pub healthy: bool,
    /// Where the backend is on the network, once found (ARP or learning).
    pub mac: Option<MacAddr>,
    /// Connections whose rules exist, as counted from the switch's reports.
    pub active_connections: u32,
    pub connections_total: u64,
    pub picks_since_refresh: u32,
    /// Connections assigned since the backend's last metrics report: they are in flight
    /// but the report could not count them yet.
    pub picks_since_metrics: u32,
    new_since_refresh: u32,
    /// New connections per second, averaged over [`RATE_TIME_CONSTANT`].
    pub rps: f64,
    pub response_time_ms: Option<f64>,
    pub cpu: Option<f64>,
    /// Request rate reported by the backend itself (Prometheus), when configured.
    pub reported_rps: Option<f64>,
    /// Requests in progress as the backend reports them, when configured.
    pub reported_active: Option<f64>,
    /// The requests per second it can serve, as configured (`capacity_rps`), if known.
    pub capacity_rps: Option<f64>,
    /// The response time comes from the backend's own metrics, not the probes.
    pub rt_from_metrics: bool,
    pub metrics_at: Option<Instant>,
    /// When the backend (re)joined, for slow start.
    pub since: Option<Instant>,
    /// Rise/fall state of the active checks.
    pub health: ActiveHealth,
    /// Ejected by passive outlier detection (kept in step with the pool's outlier state
    /// at each refresh).
    pub ejected: bool,
    /// The ejection is not in force: the pool is in panic (too few backends available,
    /// [`ServiceState::in_panic`]), so the backend takes new connections all the same.
    pub ejection_waived: bool,
    /// Cluster mode: a backend of another domain, behind this domain's uplink, which
    /// takes its connections only as the global controller's spill decides
    /// ([`crate::Controller::set_spill_weight`]).
    pub remote: bool,
    /// The latest decision (controller-relative ms) of a connection this backend is
    /// known to have answered: a silence of a connection decided before it is no sign
    /// that the backend was gone ([`ServiceState::answered_after`]). 0: none known.
    pub answered_decided_ms: u64,
    /// Connections passive outlier detection judged: answered, and not (a silence or a
    /// RST, in a row or not; not those a switch that was behind excuses).
    pub outcomes_answered: u64,
    pub outcomes_unanswered: u64,
}

impl BackendState {
    pub fn new(cfg: &BackendConfig) -> Self {
        BackendState {
            id: BackendId::default(),
            address: cfg.address,
            weight: cfg.weight,
            metrics_url: cfg.metrics.clone(),
            admin: AdminState::Active,
            healthy: true,
            mac: None,
            active_connections: 0,
            connections_total: 0,
            picks_since_refresh: 0,
            picks_since_metrics: 0,
            new_since_refresh: 0,
            rps: 0.0,
            response_time_ms: None,
            cpu: None,
            reported_rps: None,
            reported_active: None,
            capacity_rps: cfg.capacity_rps,
            rt_from_metrics: false,
            metrics_at: None,
            since: None,
            health: ActiveHealth::default(),
            ejected: false,
            ejection_waived: false,
            remote: false,
            answered_decided_ms: 0,
            outcomes_answered: 0,
            outcomes_unanswered: 0,
        }
    }

    /// This backend as a reload configures it anew (`fresh`, under the service's new
    /// `health` settings), keeping what was learned of it where that still holds: its
    /// connections, rates, location, admin state and health; the new weight and capacity.
    ///
    /// What no longer holds starts again: a changed or removed metrics endpoint's
    /// figures (else a removed endpoint's last report would stand for good, stale), and,
    /// with the checks turned off, the health they judged (else a backend they took down
    /// would stay down, with no check left to bring it back). New `rise` and `fall`
    /// apply at once.
    pub fn reconfigured(&self, fresh: &BackendState, health: &HealthConfig, now: Instant) -> Self {
        let mut b = self.clone();
        b.weight = fresh.weight;
        b.capacity_rps = fresh.capacity_rps;
        if b.metrics_url != fresh.metrics_url {
            b.metrics_url = fresh.metrics_url.clone();
            b.metrics_at = None;
            b.picks_since_metrics = 0;
            b.reported_rps = None;
            b.reported_active = None;
            b.cpu = None;
            if b.rt_from_metrics {
                b.rt_from_metrics = false;
                b.response_time_ms = None;
            }
        }
        if health.kind == HealthKind::None {
            if !b.healthy {
                b.since = Some(now);
            }
            b.healthy = true;
            b.health = fresh.health;
        } else {
            b.health.rise = health.rise;
            b.health.fall = health.fall;
        }
        b
    }

    /// Can this backend take a new connection at all?
    pub fn eligible(&self) -> bool {
        self.eligible_but_for_ejection() && (!self.ejected || self.ejection_waived)
    }

    fn eligible_but_for_ejection(&self) -> bool {
        self.healthy && self.admin == AdminState::Active && self.mac.is_some()
    }
}

/// Counters of one service, as exported.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ServiceCounters {
    /// New connections given a backend.
    pub connections_total: u64,
    /// ISSLM searches that found no optimal server.
    pub no_optimal_server: u64,
    /// New connections refused because no backend could take them.
    pub refused_no_backend: u64,
    /// SYNs no backend could take yet, held instead of refused while a switch was in its
    /// reconnect grace (answered once a backend can take them: `controller::held`).
    pub held_settling: u64,
    /// Held SYNs given a backend once one could take them, within their client's
    /// initial RTO (it did not have to send them again).
    pub held_answered: u64,
    /// Non-SYN packets of connections the controller did not know.
    pub unknown_flow_packets: u64,
    /// Connections whose backend stayed silent, given another backend at their client's
    /// retransmitted SYN (`redispatch`); each is in `connections_total` once more.
    pub redispatched: u64,
    /// Backends ejected by passive outlier detection (each ejection once).
    pub ejections: u64,
    /// The same ejections, by the detector that made each.
    pub ejections_by: EjectionsByDetector,
    /// Times the pool went into panic ([`ServiceState::in_panic`]).
    pub panics: u64,
    /// ISSLM's moves, by the search that found the target.
    pub isslm_moves: IsslmMoves,
}

/// A service's ejections by detector ([`Detector`]), as exported.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct EjectionsByDetector {
    pub consecutive: u64,
    pub success_rate: u64,
    pub failure_percentage: u64,
}

impl EjectionsByDetector {
    pub fn count(&mut self, by: Detector) {
        let n = match by {
            Detector::Consecutive => &mut self.consecutive,
            Detector::SuccessRate => &mut self.success_rate,
            Detector::FailurePercentage => &mut self.failure_percentage,
        };
        *n += 1;
    }

    pub fn get(&self, by: Detector) -> u64 {
        match by {
            Detector::Consecutive => self.consecutive,
            Detector::SuccessRate => self.success_rate,
            Detector::FailurePercentage => self.failure_percentage,
        }
    }
}

/// ISSLM's moves away from an over-threshold requested server, by the search of
/// Table 2's chain that found the target. With fresh metrics and no hysteresis latch
/// the first search decides every move it can: if the candidate with the least request
/// load is over the threshold, so is every other, and the later searches (which accept
/// only candidates under it) find nothing either. The later searches decide when the
/// request-load leader's metrics are stale, or it is still latched over.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct IsslmMoves {
    pub request_load: u64,
    pub connections: u64,
    pub response_time: u64,
}

impl IsslmMoves {
    pub fn count(&mut self, search: Search) {
        let n = match search {
            Search::RequestLoad => &mut self.request_load,
            Search::Connections => &mut self.connections,
            Search::ResponseTime => &mut self.response_time,
        };
        *n += 1;
    }

    pub fn get(&self, search: Search) -> u64 {
        match search {
            Search::RequestLoad => self.request_load,
            Search::Connections => self.connections,
            Search::ResponseTime => self.response_time,
        }
    }
}

pub struct ServiceState {
    pub cfg: ServiceConfig,
    /// The service's number on the switches: its meter, its select group and its rules'
    /// cookies are named by it. It stays with the service (by name) across reloads, so a
    /// reordered file never hands one service's meter or group to another while rules
    /// that name it are still on the switches (`Controller::reload`).
    pub slot: u16,
    pub balancer: Balancer,
    pub backends: Vec<BackendState>,
    /// The balancer's view, rebuilt at each refresh and patched on each pick.
    pub loads: Vec<BackendLoad>,
    pub counters: ServiceCounters,
    /// Passive outlier detection over the pool: connections the backend never answered,
    /// or answered only with a RST, as the switch reports them.
    pub outliers: PoolOutliers,
    /// Connections admitted without rules while the controller gaps (see
    /// [`crate::controller::handshake`]).
    pub handshakes: crate::controller::handshake::ServiceHandshakes,
    /// What each backend number given so far stands for (the number is the index).
    numbers: Vec<Numbered>,
    last_refresh: Option<Instant>,
    /// Ejections are waived: see [`ServiceState::in_panic`].
    panic: bool,
    /// `panic` as [`ServiceState::panic_change`] last reported it.
    panic_reported: bool,
}

impl ServiceState {
    pub fn new(cfg: ServiceConfig, slot: u16, seed: u64) -> Self {
        // The configuration holds at most `MAX_BACKENDS` backends, fewer than the numbers.
        let backends: Vec<BackendState> = cfg
            .backends
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let mut st = BackendState::new(b);
                st.id = BackendId(i as u16);
                st.health = ActiveHealth::new(cfg.health.rise, cfg.health.fall);
                st
            })
            .collect();
        let numbers = (0..backends.len())
            .map(|i| Numbered::Live(i as u16))
            .collect();
        let balancer = Balancer::new(cfg.algorithm, cfg.params.clone(), backends.len(), seed);
        let n = backends.len();
        let outliers = PoolOutliers::new(cfg.outlier, n);
        let mut s = ServiceState {
            cfg,
            slot,
            balancer,
            backends,
            loads: Vec::new(),
            counters: ServiceCounters::default(),
            outliers,
            handshakes: Default::default(),
            numbers,
            last_refresh: None,
            panic: false,
            panic_reported: false,
        };
        s.rebuild_loads(None);
        s
    }

    pub fn algorithm(&self) -> AlgorithmKind {
        self.balancer.kind()
    }

    /// Change the algorithm (or its parameters). Existing connections keep their backend:
    /// only new decisions use the new balancer.
    pub fn set_algorithm(&mut self, kind: AlgorithmKind, params: AlgorithmParams, seed: u64) {
        self.cfg.algorithm = kind;
        self.cfg.params = params.clone();
        self.balancer = Balancer::new(kind, params, self.backends.len(), seed);
    }

    pub fn backend_index(&self, addr: Ipv4Addr) -> Option<usize> {
        self.backends.iter().position(|b| b.address == addr)
    }

    /// The position in the pool of backend `id`; `None` once it has left the pool.
    #[inline]
    pub fn position(&self, id: BackendId) -> Option<usize> {
        match self.numbers.get(usize::from(id.0)) {
            Some(Numbered::Live(p)) => Some(usize::from(*p)),
            _ => None,
        }
    }

    /// The backend of the pool numbered `id`.
    #[inline]
    pub fn backend(&self, id: BackendId) -> Option<&BackendState> {
        self.backends.get(self.position(id)?)
    }

    /// The backends that left the pool with connections still open to them, and how many
    /// (an address has one number at most: one that comes back takes its own again).
    pub fn left_backends(&self) -> Vec<LeftBackend> {
        self.numbers
            .iter()
            .filter_map(|n| match *n {
                Numbered::Left { address, open, .. } if open > 0 => Some(LeftBackend {
                    address,
                    open_connections: open,
                }),
                _ => None,
            })
            .collect()
    }

    /// The MACs the service's connections go to: its backends' (once found), and those of
    /// backends that left the pool with connections still open to them, which follow them
    /// until they end (host ageing must not forget where they are).
    pub fn connection_macs(&self) -> impl Iterator<Item = MacAddr> + '_ {
        let left = self.numbers.iter().filter_map(|n| match *n {
            Numbered::Left {
                mac: Some(mac),
                open,
                ..
            } if open > 0 => Some(mac),
            _ => None,
        });
        self.backends.iter().filter_map(|b| b.mac).chain(left)
    }

    /// Connections open to backend `id` by the service's count: a backend's in the pool
    /// (`active_connections`), or what is left of one that left it.
    pub fn open_connections(&self, id: BackendId) -> Option<u32> {
        match *self.numbers.get(usize::from(id.0))? {
            Numbered::Live(p) => self
                .backends
                .get(usize::from(p))
                .map(|b| b.active_connections),
            Numbered::Left { open, .. } => Some(open),
        }
    }

    /// Whether a backend at `address` joining now needs a number the service no longer
    /// has: none left to give, and none of its own from before it left.
    pub fn out_of_numbers_for(&self, address: Ipv4Addr) -> bool {
        self.numbers.len() >= BACKEND_IDS && left_number(&self.numbers, address).is_none()
    }

    /// How many backend numbers the service has given (see [`BACKEND_IDS`]).
    pub fn numbers_given(&self) -> usize {
        self.numbers.len()
    }

    /// Give `n` numbers to backends that came and went (the numbers run out after 65,535
    /// backends joined a service).
    #[cfg(test)]
    pub(crate) fn spend_numbers(&mut self, n: usize) {
        let left = Numbered::Left {
            address: Ipv4Addr::UNSPECIFIED,
            mac: None,
            open: 0,
        };
        self.numbers.extend(std::iter::repeat_n(left, n));
    }

    /// The number of the backend at `position` in the pool.
    pub fn id_at(&self, position: usize) -> Option<BackendId> {
        self.backends.get(position).map(|b| b.id)
    }

    /// Where the connections to backend `id` go: its address, and its MAC once known,
    /// whether it is in the pool or has left it.
    pub fn destination(&self, id: BackendId) -> Option<(Ipv4Addr, Option<MacAddr>)> {
        match *self.numbers.get(usize::from(id.0))? {
            Numbered::Live(p) => self
                .backends
                .get(usize::from(p))
                .map(|b| (b.address, b.mac)),
            Numbered::Left { address, mac, .. } => Some((address, mac)),
        }
    }

    /// Add `b` (configured as `cfg`) at the end of the pool with a number of its own;
    /// its position. `None` when the service has given all its numbers: the caller
    /// numbers the pool afresh ([`ServiceState::renumber`]) and tries again.
    ///
    /// A backend that left the pool and comes back takes its number back, and with it
    /// the connections still open to it from before it left: counted as its own again
    /// (a least-connections balancer sees them), not listed as a removed backend's.
    pub fn join(&mut self, mut b: BackendState, cfg: BackendConfig) -> Option<usize> {
        let position = self.backends.len();
        let id = take_number(&mut self.numbers, &mut b)?;
        self.numbers[usize::from(id.0)] = Numbered::Live(position as u16);
        self.backends.push(b);
        self.cfg.backends.push(cfg);
        Some(position)
    }

    /// Number the pool afresh, each backend by its position, and forget those that left.
    /// What each earlier number becomes (by the old number as index; `None`: one that
    /// had left), for the connections that hold them.
    pub fn renumber(&mut self) -> Vec<Option<BackendId>> {
        let map = self
            .numbers
            .iter()
            .map(|n| match n {
                Numbered::Live(p) => Some(BackendId(*p)),
                Numbered::Left { .. } => None,
            })
            .collect();
        self.numbers.clear();
        for (i, b) in self.backends.iter_mut().enumerate() {
            b.id = BackendId(i as u16);
            self.numbers.push(Numbered::Live(i as u16));
        }
        map
    }

    /// A reload built this service anew from `prev`: the backends that stay have kept
    /// their numbers (they are `prev`'s, reconfigured); those that left `prev`'s pool
    /// keep theirs, left; new ones take the number they had when they left, if they
    /// had one (as in [`ServiceState::join`]), else the next. False when the numbers ran
    /// out and the pool was numbered afresh instead ([`ServiceState::renumber`]): then
    /// `prev`'s numbers mean nothing here.
    pub(crate) fn number_after(&mut self, prev: &ServiceState) -> bool {
        let mut numbers = prev.numbers.clone();
        for b in &prev.backends {
            if self.backend_index(b.address).is_none()
                && let Some(n) = numbers.get_mut(usize::from(b.id.0))
            {
                *n = Numbered::Left {
                    address: b.address,
                    mac: b.mac,
                    open: b.active_connections,
                };
            }
        }
        let joins = |b: &&BackendState| prev.backend_index(b.address).is_none();
        let fresh = self
            .backends
            .iter()
            .filter(joins)
            .filter(|b| left_number(&numbers, b.address).is_none())
            .count();
        if numbers.len() + fresh > BACKEND_IDS {
            self.renumber();
            return false;
        }
        for b in &mut self.backends {
            // Counted above: each has a number. `place_numbers` gives its position.
            if prev.backend_index(b.address).is_none() {
                take_number(&mut numbers, b);
            }
        }
        self.numbers = numbers;
        self.place_numbers();
        true
    }

    /// Point each pool backend's number at its position (after the pool shifted).
    fn place_numbers(&mut self) {
        for (i, b) in self.backends.iter().enumerate() {
            if let Some(n) = self.numbers.get_mut(usize::from(b.id.0)) {
                *n = Numbered::Live(i as u16);
            }
        }
    }

    /// The balancer's pick for a connection that must not go to backend `avoid` (its
    /// backend stayed silent, see `redispatch`): every algorithm passes over an ineligible
    /// backend, so `avoid` is one for this pick alone. `None` when no other can take it.
    /// Weighted round robin forgets `avoid`'s running credit, as for any backend that
    /// turns ineligible: its next turn comes as for a backend that has just come back.
    pub fn select_avoiding(
        &mut self,
        req: &crate::balance::SelectRequest,
        avoid: usize,
    ) -> crate::balance::Selection {
        let Some(was) = self
            .loads
            .get_mut(avoid)
            .map(|l| std::mem::take(&mut l.eligible))
        else {
            return self.balancer.select(req, &self.loads);
        };
        let sel = self.balancer.select(req, &self.loads);
        if let Some(l) = self.loads.get_mut(avoid) {
            l.eligible = was;
        }
        match sel.backend {
            Some(b) if b == avoid => crate::balance::Selection {
                backend: None,
                ..sel
            },
            _ => sel,
        }
    }

    /// Record a decision made by [`crate::Controller`].
    pub fn record_pick(&mut self, backend: usize) {
        self.counters.connections_total += 1;
        if let Some(b) = self.backends.get_mut(backend) {
            b.picks_since_refresh += 1;
            b.picks_since_metrics += 1;
            b.new_since_refresh += 1;
            b.connections_total += 1;
        }
        if let Some(l) = self.loads.get_mut(backend) {
            l.picks_since_refresh += 1;
        }
        // Open, as a resumed one is.
        self.record_resumed(backend);
    }

    /// A connection decided before, ended during its handshake, placed again for its
    /// client's retransmitted SYN: open again, but no new decision (neither in
    /// `connections_total` nor in the request rate: the client's one attempt).
    pub fn record_resumed(&mut self, backend: usize) {
        if let Some(b) = self.backends.get_mut(backend) {
            b.active_connections += 1;
        }
        if let Some(l) = self.loads.get_mut(backend) {
            l.active_connections += 1;
        }
    }

    /// The switch reported the end of a connection's reverse rule: `answered` is false when
    /// the backend sent nothing back, or only a RST (at most one packet), which is how a
    /// refused or timed-out connection looks from the switch.
    pub fn record_outcome(
        &mut self,
        now: Instant,
        backend: usize,
        answered: bool,
    ) -> Option<Instant> {
        let b = self.backends.get_mut(backend)?;
        if answered {
            b.outcomes_answered += 1;
            self.outliers.on_success(backend, now);
            return None;
        }
        b.outcomes_unanswered += 1;
        let until = self.outliers.on_failure(backend, now);
        if until.is_some() {
            self.note_ejected(backend, Detector::Consecutive);
            self.sync_eligibility();
        }
        until
    }

    /// A connection backend `id` never answered, though it answered one decided after
    /// it ([`Self::answered_after`]): no failure in a row, but one in the rates the
    /// success-rate and failure-percentage detectors judge. A backend that answers some
    /// connections and drops the others (a full accept queue) shows only here.
    pub fn record_failure_out_of_order(&mut self, now: Instant, id: BackendId) {
        let Some(p) = self.position(id) else {
            return;
        };
        if let Some(b) = self.backends.get_mut(p) {
            b.outcomes_unanswered += 1;
        }
        self.outliers.on_failure_out_of_order(p, now);
    }

    /// Runs the rate detectors when their interval is due (`[service.outlier]
    /// interval_ms`); returns the backends they ejected (positions), each with the end of
    /// its ejection and the detector.
    pub fn sweep_outliers(&mut self, now: Instant) -> Vec<(usize, Instant, Detector)> {
        let ejected = self.outliers.sweep(now);
        if !ejected.is_empty() {
            for &(i, _, by) in &ejected {
                self.note_ejected(i, by);
            }
            self.sync_eligibility();
        }
        ejected
    }

    fn note_ejected(&mut self, i: usize, by: Detector) {
        self.counters.ejections += 1;
        self.counters.ejections_by.count(by);
        if let Some(b) = self.backends.get_mut(i) {
            b.ejected = true;
        }
    }

    /// A connection's accounting rule is gone.
    /// A live connection the controller had not tracked (a partitioned service's, placed
    /// by its partition's rule) now has rules of its own: counted as active, so that its
    /// end balances, but not as a new connection.
    pub fn record_adopted(&mut self, backend: usize) {
        if let Some(b) = self.backends.get_mut(backend) {
            b.active_connections += 1;
        }
        if let Some(l) = self.loads.get_mut(backend) {
            l.active_connections += 1;
        }
    }

    /// Backend `id` answered a connection decided at `decided_ms` (controller-relative).
    pub fn record_answered(&mut self, id: BackendId, decided_ms: u64) {
        if let Some(b) = self.position(id).and_then(|p| self.backends.get_mut(p)) {
            b.answered_decided_ms = b.answered_decided_ms.max(decided_ms);
        }
    }

    /// Whether backend `id` answered a connection decided after `decided_ms`: it was
    /// there after that one was sent to it, so that one's silence was the path's (lost
    /// on the way, or in a switch). Passive outlier detection's "consecutive" failures are
    /// then consecutive in the order the connections were made, as Envoy's are in the
    /// order of its requests, not in the order the switch reports them: a silence is
    /// reported only when its rule idles out (`idle_timeout_secs` later), an answered
    /// connection about a second after it closes, so a burst of lost answers would
    /// otherwise reach the detector as a run of failures with none of the answers
    /// between them.
    pub fn answered_after(&self, id: BackendId, decided_ms: u64) -> bool {
        self.backend(id)
            .is_some_and(|b| b.answered_decided_ms > decided_ms)
    }

    /// A connection to backend `id` ended, in the pool or out of it.
    pub fn record_end(&mut self, id: BackendId) {
        let backend = match self.numbers.get_mut(usize::from(id.0)) {
            Some(Numbered::Live(p)) => usize::from(*p),
            Some(Numbered::Left { open, .. }) => {
                *open = open.saturating_sub(1);
                return;
            }
            None => return,
        };
        if let Some(b) = self.backends.get_mut(backend) {
            b.active_connections = b.active_connections.saturating_sub(1);
        }
        if let Some(l) = self.loads.get_mut(backend) {
            l.active_connections = l.active_connections.saturating_sub(1);
        }
    }

    /// Fold the connections assigned since the last refresh into the rate averages, and
    /// give the balancer a fresh view.
    pub fn refresh(&mut self, now: Instant, stale_after: Duration) {
        let dt = match self.last_refresh {
            Some(t) => now.saturating_duration_since(t),
            None => Duration::ZERO,
        };
        self.last_refresh = Some(now);
        if !dt.is_zero() {
            let secs = dt.as_secs_f64();
            let alpha = 1.0 - (-secs / RATE_TIME_CONSTANT.as_secs_f64()).exp();
            for b in &mut self.backends {
                let inst = f64::from(b.new_since_refresh) / secs;
                b.rps += alpha * (inst - b.rps);
                b.new_since_refresh = 0;
                b.picks_since_refresh = 0;
            }
        }
        for (i, b) in self.backends.iter_mut().enumerate() {
            b.ejected = self.outliers.is_ejected(i, now);
        }
        self.rebuild_loads(Some((now, stale_after)));
        self.balancer.on_refresh(&self.loads, dt);
    }

    fn rebuild_loads(&mut self, now: Option<(Instant, Duration)>) {
        self.settle_panic();
        self.loads.clear();
        for (i, b) in self.backends.iter().enumerate() {
            // Slow start reaches every algorithm through the balancer's ramp fraction, once:
            // the weighted ones use `weight × f` exactly, the others their own way, so a
            // backend ramping at f takes about f of a full share under all but `none`
            // (see `balance`'s module docs). The load keeps the configured weight.
            let ramp = match (b.since, now) {
                (Some(since), Some((now, _))) if !self.cfg.slow_start.is_zero() => {
                    let mut ramp = SlowStart::new(self.cfg.slow_start);
                    ramp.start(since);
                    ramp.is_active(now).then(|| ramp.factor(now))
                }
                _ => None,
            };
            self.balancer.set_ramp(i, ramp);
            let weight = b.weight;
            let metrics_fresh = match (b.metrics_at, now) {
                (Some(at), Some((now, stale))) => now.saturating_duration_since(at) <= stale,
                // Without a metrics endpoint our own counts are the metrics: always fresh.
                (None, _) => b.metrics_url.is_none(),
                (Some(_), None) => true,
            };
            // Only the reactive mode sees every connection; the others' own counts hold
            // the few that reached the controller (a partition moving), a sample whose
            // bias would steer their weights (seen on OVS: partitions that kept moving).
            let counted = self.cfg.mode == crate::config::ServiceMode::Reactive;
            loads_push(&mut self.loads, b, weight, metrics_fresh, counted);
        }
    }

    /// Backend `i` left the pool. Every per-backend state of the later backends (the
    /// balancer's, the outlier detector's, the `none` algorithm's target) shifts down
    /// with them, so that none inherits its neighbour's: an ejection, a learned weight, a
    /// role. Its number stays its own: its open connections keep going to it and end
    /// uncounted. False if there is no backend `i`.
    pub fn remove_backend(&mut self, now: Instant, i: usize) -> bool {
        if i >= self.backends.len() {
            return false;
        }
        let gone = self.backends.remove(i);
        if let Some(n) = self.numbers.get_mut(usize::from(gone.id.0)) {
            *n = Numbered::Left {
                address: gone.address,
                mac: gone.mac,
                open: gone.active_connections,
            };
        }
        self.cfg.backends.remove(i);
        self.cfg.params.backend_removed(i);
        self.balancer.remove_backend(i);
        self.outliers.remove(i);
        self.pool_changed(now);
        true
    }

    /// A reload: go on with `prev`'s balancer (ISSLM's latches, SRT's averages, MRBS's
    /// model and its warm-up, the round-robin cursor) when it would be built as before:
    /// the same algorithm and parameters, and the backends that stay in their order, any
    /// new ones after them (the balancer's state is positional). Else the new one starts
    /// afresh. Returns whether `prev`'s was kept.
    pub fn keep_balancer(&mut self, prev: &ServiceState) -> bool {
        if prev.balancer.kind() != self.balancer.kind() {
            return false;
        }
        let stays = |b: &&BackendState| self.backend_index(b.address).is_some();
        let n_stay = prev.backends.iter().filter(stays).count();
        let in_order = prev
            .backends
            .iter()
            .filter(stays)
            .map(|b| b.address)
            .eq(self.backends.iter().take(n_stay).map(|b| b.address));
        if !in_order {
            return false;
        }
        let mut balancer = prev.balancer.clone();
        for i in (0..prev.backends.len()).rev() {
            if self.backend_index(prev.backends[i].address).is_none() {
                balancer.remove_backend(i);
            }
        }
        if balancer.params() != self.balancer.params() {
            return false;
        }
        balancer.resize(self.backends.len());
        self.balancer = balancer;
        true
    }

    /// The balancer's view must track pool changes (add/remove backend).
    pub fn pool_changed(&mut self, now: Instant) {
        self.place_numbers();
        self.balancer.resize(self.backends.len());
        self.outliers.resize(self.backends.len());
        self.rebuild_loads(Some((now, Duration::from_secs(3600))));
    }

    /// Refresh eligibility of one backend in the balancer's view without waiting for the
    /// next tick (health or drain changes must take effect at once).
    pub fn sync_eligibility(&mut self) {
        self.settle_panic();
        for (b, l) in self.backends.iter().zip(self.loads.iter_mut()) {
            l.eligible = b.eligible();
        }
    }

    /// Is the pool in panic? Outlier detection has ejected so much of it that fewer than
    /// `panic_threshold_percent` of the backends that could take a new connection (healthy
    /// by the active checks, not drained, located, weighted, the domain's own) are left,
    /// and the ejections are waived: every one of them takes connections again. Envoy's
    /// panic threshold (default 50 %, anchors §2.1), which keeps an ejection from emptying
    /// a one-host pool.
    ///
    /// Two departures from Envoy, both for the same reason: an ejection is evidence from
    /// the path (a connection whose backend's answer never reached the switch's reverse
    /// rule), which a switch that lags or loses packets produces against a healthy
    /// backend (full Case C: a domain's switch seconds behind ejected its one server).
    /// - Only ejections are waived, not failed active checks: a probe asked the backend
    ///   itself, and a domain whose probes find nothing healthy should spill its
    ///   connections, not send them to a dead host. (nginx likewise never counts a lone
    ///   server unavailable for its failures.)
    /// - Another domain's backends (`remote`) do not count: they take the spill the
    ///   global controller sized to their spare capacity, and would otherwise take the
    ///   domain's whole demand the moment its own server's answers went missing.
    pub fn in_panic(&self) -> bool {
        self.panic
    }

    /// The backends the panic threshold counts, and how many of them are ejected.
    fn panic_census(&self) -> (u64, u64) {
        let (mut counted, mut ejected) = (0u64, 0u64);
        for b in &self.backends {
            if b.eligible_but_for_ejection() && b.weight > 0 && !b.remote {
                counted += 1;
                ejected += u64::from(b.ejected);
            }
        }
        (counted, ejected)
    }

    /// Decides [`Self::in_panic`] from the backends' ejections as they stand.
    fn settle_panic(&mut self) {
        let percent = u64::from(self.cfg.health.panic_threshold_percent);
        let (counted, ejected) = self.panic_census();
        // Fewer available than the threshold: (counted − ejected) / counted < percent / 100.
        let panic = ejected > 0 && (counted - ejected) * 100 < percent * counted;
        if panic && !self.panic {
            self.counters.panics += 1;
        }
        self.panic = panic;
        for b in &mut self.backends {
            b.ejection_waived = panic && b.ejected;
        }
    }

    /// Goes on in `prev`'s panic, as reported (a reload): the next settle counts and
    /// reports only a change.
    pub(crate) fn keep_panic(&mut self, prev: &ServiceState) {
        self.panic = prev.panic;
        self.panic_reported = prev.panic_reported;
    }

    /// Whether the pool went into panic (`Some(true)`, with its available and counted
    /// backends) or out of it (`Some(false)`) since the last call: for the controller's
    /// log and events.
    pub fn panic_change(&mut self) -> Option<(bool, u64, u64)> {
        if self.panic == self.panic_reported {
            return None;
        }
        self.panic_reported = self.panic;
        let (counted, ejected) = self.panic_census();
        Some((self.panic, counted - ejected, counted))
    }

    /// The weight backend `i` takes connections with now: the weight the balancer sees
    /// ([`BackendLoad::weight`], the configured one) times its slow-start fraction, as a
    /// float (`weight × f`: a weight of 1 ramping at a quarter is 0.25). What an operator
    /// reads as the "effective weight"; `None` if there is no backend `i`.
    pub fn effective_weight(&self, i: usize) -> Option<f64> {
        let weight = match self.loads.get(i) {
            Some(l) => l.weight,
            None => self.backends.get(i)?.weight,
        };
        Some(f64::from(weight) * self.balancer.ramp(i))
    }
}

fn loads_push(
    loads: &mut Vec<BackendLoad>,
    b: &BackendState,
    weight: u32,
    metrics_fresh: bool,
    counted: bool,
) {
    loads.push(BackendLoad {
        eligible: b.eligible(),
        weight,
        // What the backend itself reports in progress is the truer figure for short
        // requests (the switch reports a connection's end about a second after its FIN);
        // the flow count stands in when there is no fresh report, if the controller
        // counts every connection.
        active_connections: match b.reported_active {
            Some(a) if metrics_fresh && a.is_finite() && a >= 0.0 => {
                (a.round() as u32).saturating_add(b.picks_since_metrics)
            }
            _ if counted => b.active_connections,
            _ => 0,
        },
        // A stale report would freeze the backend's load at its last value: the
        // controller's own rate replaces it where the controller sees every connection.
        rps: match b.reported_rps {
            Some(r) if metrics_fresh || !counted => r,
            _ => b.rps,
        },
        picks_since_refresh: b.picks_since_refresh,
        response_time_ms: b.response_time_ms,
        cpu: b.cpu,
        capacity_rps: b.capacity_rps,
        metrics_fresh,
    });
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::ServiceState;
    use crate::balance::SelectRequest;
    use crate::config::Config;

    /// A weighted-round-robin service with slow start; backend weights as given.
    fn service(weights: &[u32]) -> ServiceState {
        let mut text = String::from(
            "[[service]]\nname = \"web\"\nvip = \"10.0.0.100\"\nport = 80\n\
             algorithm = \"weighted-round-robin\"\nslow_start_secs = 10\n",
        );
        for (i, w) in weights.iter().enumerate() {
            text.push_str(&format!(
                "[[service.backend]]\naddress = \"10.0.0.{}\"\nweight = {w}\n",
                i + 2
            ));
        }
        let cfg = Config::from_toml(&text, &|_| None).expect("valid config");
        ServiceState::new(cfg.services[0].clone(), 0, 1)
    }

    /// A round-robin pool of `n` located backends whose `[service.health]` adds `health`
    /// to `kind = "none"`.
    fn pool(n: usize, health: &str) -> ServiceState {
        let mut text = format!(
            "[[service]]\nname = \"web\"\nvip = \"10.0.0.100\"\nport = 80\n\
             algorithm = \"round-robin\"\n[service.health]\nkind = \"none\"\n{health}\n"
        );
        for i in 0..n {
            text.push_str(&format!(
                "[[service.backend]]\naddress = \"10.0.0.{}\"\n",
                i + 2
            ));
        }
        let cfg = Config::from_toml(&text, &|_| None).expect("valid config");
        let mut s = ServiceState::new(cfg.services[0].clone(), 0, 1);
        for (i, b) in s.backends.iter_mut().enumerate() {
            b.mac = Some(flowgate_packet::MacAddr([2, 0, 0, 0, 0, i as u8 + 2]));
        }
        s.sync_eligibility();
        s
    }

    /// Five connections backend `i` never answered: ejected.
    fn eject(s: &mut ServiceState, i: usize, now: Instant) {
        for _ in 0..5 {
            s.record_outcome(now, i, false);
        }
        assert!(s.backends[i].ejected, "backend {i} ejected");
    }

    fn eligible(s: &ServiceState) -> Vec<bool> {
        assert!(
            s.backends
                .iter()
                .zip(&s.loads)
                .all(|(b, l)| b.eligible() == l.eligible),
            "the balancer's view is in step"
        );
        s.loads.iter().map(|l| l.eligible).collect()
    }

    /// Envoy's panic threshold: an ejection that would leave fewer than half the pool
    /// available is waived, so a one-backend pool is never emptied by its outlier detector.
    #[test]
    fn an_ejection_that_leaves_too_few_backends_is_waived() {
        let now = Instant::now();
        let mut s = pool(1, "");
        eject(&mut s, 0, now);
        assert!(s.in_panic());
        assert_eq!(
            eligible(&s),
            [true],
            "the one backend takes connections still"
        );
        assert_eq!((s.counters.ejections, s.counters.panics), (1, 1));
        assert_eq!(s.panic_change(), Some((true, 0, 1)));
        assert_eq!(s.panic_change(), None, "reported once");
        // The ejection ends after 30 s: the panic with it.
        s.refresh(now + Duration::from_secs(31), Duration::from_secs(1));
        assert!(!s.in_panic() && !s.backends[0].ejected);
        assert_eq!(s.panic_change(), Some((false, 1, 1)));

        // Two backends, one ejected: half are available, which is not fewer than half.
        let mut s = pool(2, "");
        eject(&mut s, 1, now);
        assert!(!s.in_panic());
        assert_eq!(eligible(&s), [true, false]);
        assert_eq!((s.counters.ejections, s.counters.panics), (1, 0));
        // With a threshold of 60 % it is too few.
        let mut s = pool(2, "panic_threshold_percent = 60");
        eject(&mut s, 1, now);
        assert!(s.in_panic());
        assert_eq!(eligible(&s), [true, true]);
    }

    #[test]
    fn a_zero_panic_threshold_lets_an_ejection_empty_the_pool() {
        let mut s = pool(1, "panic_threshold_percent = 0");
        eject(&mut s, 0, Instant::now());
        assert!(!s.in_panic());
        assert_eq!(eligible(&s), [false]);
        assert_eq!(s.panic_change(), None);
    }

    /// Panic waives ejections only: a backend its checks found down, or an operator
    /// drained, stays out, and neither counts toward the threshold.
    #[test]
    fn panic_waives_ejections_but_not_failed_checks_or_drains() {
        let now = Instant::now();
        let mut s = pool(3, "");
        s.backends[0].healthy = false;
        s.backends[2].admin = super::AdminState::Draining;
        eject(&mut s, 1, now);
        assert!(s.in_panic(), "backend 1 was the only one available");
        assert_eq!(eligible(&s), [false, true, false]);
        assert_eq!(s.panic_change(), Some((true, 0, 1)));
        // Backend 0 is back: one of two available, no panic, and the ejection holds.
        s.backends[0].healthy = true;
        s.sync_eligibility();
        assert!(!s.in_panic());
        assert_eq!(eligible(&s), [true, false, false]);
    }

    /// A domain controller's pool lists the other domains' backends too, weighted only
    /// while it spills to them: they never count toward its panic threshold, so a domain
    /// whose one server is ejected while it spills keeps it, and its spill stays the size
    /// the global controller gave it. Nor does a backend its operator weighted 0.
    #[test]
    fn remote_and_unweighted_backends_do_not_count_toward_the_panic_threshold() {
        let now = Instant::now();
        let mut s = pool(4, "");
        for b in &mut s.backends[1..] {
            b.remote = true;
            b.weight = 100; // spilling to them
        }
        eject(&mut s, 0, now);
        assert!(s.in_panic(), "the domain's own backend was ejected");
        assert_eq!(eligible(&s), [true, true, true, true]);
        // Its own backend, not a remote one, made the difference.
        s.backends[1].remote = false;
        s.sync_eligibility();
        assert!(!s.in_panic(), "one of two own backends available");
        assert_eq!(eligible(&s), [false, true, true, true]);

        let mut s = pool(2, "");
        s.backends[1].weight = 0;
        eject(&mut s, 0, now);
        assert!(s.in_panic(), "the one weighted backend was ejected");
        assert_eq!(s.panic_change(), Some((true, 0, 1)));
    }

    /// Backend 0 came back 2.5 s into a 10 s ramp (f = 0.25); `n` picks over the loads.
    fn ramping(weights: &[u32], n: usize) -> (ServiceState, Vec<usize>) {
        let mut s = service(weights);
        for (i, b) in s.backends.iter_mut().enumerate() {
            b.mac = Some(flowgate_packet::MacAddr([2, 0, 0, 0, 0, i as u8 + 2])); // located
        }
        let now = Instant::now() + Duration::from_secs(60);
        s.backends[0].since = now.checked_sub(Duration::from_millis(2500));
        s.refresh(now, Duration::from_secs(1));
        let mut got = vec![0; weights.len()];
        for _ in 0..n {
            if let Some(i) = s
                .balancer
                .select(&SelectRequest::default(), &s.loads)
                .backend
            {
                got[i] += 1;
            }
        }
        (s, got)
    }

    /// Slow start reaches the weighted algorithms once, as the exact fraction: the loads
    /// keep the configured weight, the balancer ramps it. With the default weight of 1
    /// the returning backend takes a quarter of a peer's turns (before: the ramped
    /// integer weight stayed 1, the full share); with weights of 100 a quarter too (not
    /// a sixteenth, as a ramped weight ramped again would give).
    #[test]
    fn slow_start_ramps_a_weight_of_one_exactly_once() {
        for w in [1, 100] {
            let (s, got) = ramping(&[w; 4], 1300);
            assert!(
                (s.balancer.ramp(0) - 0.25).abs() < 1e-9,
                "{}",
                s.balancer.ramp(0)
            );
            assert_eq!(s.loads[0].weight, w, "the configured weight");
            assert_eq!(got, [100, 400, 400, 400], "weight {w}");
            let ew = s.effective_weight(0).expect("backend 0");
            assert!((ew - 0.25 * f64::from(w)).abs() < 1e-9, "{ew}");
            assert_eq!(s.effective_weight(1), Some(f64::from(w)));
            assert_eq!(s.effective_weight(4), None);
        }
    }
}
