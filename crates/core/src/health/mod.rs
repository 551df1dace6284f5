//! Backend health: pure state machines with time passed in (sans-IO).
//!
//! * [`ActiveHealth`]: rise/fall counting of active probe results (HAProxy defaults
//!   rise 2, fall 3; anchors §2.2), with Envoy's "a single success marks a new host
//!   healthy" at start (anchors §2.1).
//! * [`Outlier`] / [`PoolOutliers`]: passive outlier ejection after consecutive failures,
//!   with Envoy's defaults and rules (anchors §2.1): 5 consecutive failures, ejection for
//!   30 s × number of ejections capped at 300 s, the multiplier decaying while the host
//!   stays un-ejected, and at most 10 % of a pool ejected (at least one host always
//!   ejectable).
//! * [`SlowStart`]: Envoy's slow-start weight ramp (aggression 1.0 = linear).
//! * [`AdminState`]: the operator's ready/drain switch.
//!
//! Together they give the balancer its `BackendLoad::eligible` (healthy, not draining,
//! not ejected) and the slow-start fraction of `Balancer::set_ramp` (the exact
//! [`SlowStart::factor`]; `BackendLoad::weight` stays the configured weight).

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, Instant};

#[cfg(test)]
mod tests;

// ---- active health ------------------------------------------------------------------

/// Result of active health checking.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HealthState {
    /// No probe answered yet; not eligible.
    #[default]
    Unknown,
    /// Up.
    Healthy,
    /// Down.
    Unhealthy,
}

/// A change of [`HealthState`] reported by [`ActiveHealth::on_probe`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HealthTransition {
    /// Became healthy.
    Up,
    /// Became unhealthy.
    Down,
}

/// Rise/fall counting of active probe results.
///
/// * `Unknown` → `Healthy` on the **first** success (Envoy: "a single success marks a host
///   healthy" at start), so a freshly added backend serves after one probe.
/// * `Unknown` → `Unhealthy` on a failure before any success (our reading: it then
///   needs `rise` successes like any down server).
/// * `Healthy` → `Unhealthy` after `fall` consecutive failures; `Unhealthy` → `Healthy`
///   after `rise` consecutive successes (HAProxy semantics, defaults 2/3).
/// * `rise`/`fall` of 0 are treated as 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ActiveHealth {
    /// Consecutive successes that bring an unhealthy backend up (default 2).
    pub rise: u32,
    /// Consecutive failures that take a healthy backend down (default 3).
    pub fall: u32,
    /// Current state.
    pub state: HealthState,
    successes: u32,
    failures: u32,
}

impl Default for ActiveHealth {
    fn default() -> Self {
        ActiveHealth::new(ActiveHealth::DEFAULT_RISE, ActiveHealth::DEFAULT_FALL)
    }
}

impl ActiveHealth {
    /// HAProxy's default `rise`.
    pub const DEFAULT_RISE: u32 = 2;
    /// HAProxy's default `fall`.
    pub const DEFAULT_FALL: u32 = 3;

    /// A checker in state `Unknown`.
    pub fn new(rise: u32, fall: u32) -> Self {
        ActiveHealth {
            rise,
            fall,
            state: HealthState::Unknown,
            successes: 0,
            failures: 0,
        }
    }

    /// True in state `Healthy`.
    pub fn is_healthy(&self) -> bool {
        self.state == HealthState::Healthy
    }

    /// Feeds one probe result; returns the transition it caused, if any.
    pub fn on_probe(&mut self, ok: bool) -> Option<HealthTransition> {
        let (rise, fall) = (self.rise.max(1), self.fall.max(1));
        match (self.state, ok) {
            (HealthState::Unknown, true) => self.set(HealthState::Healthy),
            (HealthState::Unknown, false) => self.set(HealthState::Unhealthy),
            (HealthState::Healthy, true) => {
                self.failures = 0;
                None
            }
            (HealthState::Healthy, false) => {
                self.failures = self.failures.saturating_add(1);
                if self.failures >= fall {
                    self.set(HealthState::Unhealthy)
                } else {
                    None
                }
            }
            (HealthState::Unhealthy, false) => {
                self.successes = 0;
                None
            }
            (HealthState::Unhealthy, true) => {
                self.successes = self.successes.saturating_add(1);
                if self.successes >= rise {
                    self.set(HealthState::Healthy)
                } else {
                    None
                }
            }
        }
    }

    /// Immediate down, regardless of `fall` (e.g. an HTTP status outside the expected
    /// ones, as Envoy does, or an agent saying `down`).
    pub fn force_down(&mut self) -> Option<HealthTransition> {
        if self.state == HealthState::Unhealthy {
            self.successes = 0;
            None
        } else {
            self.set(HealthState::Unhealthy)
        }
    }

    fn set(&mut self, s: HealthState) -> Option<HealthTransition> {
        self.successes = 0;
        self.failures = 0;
        let was = self.state;
        self.state = s;
        match s {
            HealthState::Healthy if was != HealthState::Healthy => Some(HealthTransition::Up),
            HealthState::Unhealthy if was != HealthState::Unhealthy => Some(HealthTransition::Down),
            _ => None,
        }
    }
}

// ---- passive outlier detection ------------------------------------------------------

/// Outlier-detection settings (Envoy defaults, anchors §2.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutlierConfig {
    /// Consecutive failures (resets, timeouts, 5xx) that eject a host (5).
    pub consecutive_failures: u32,
    /// Ejection time per ejection (30 s): the n-th ejection lasts n × this.
    pub base_ejection: Duration,
    /// Cap on one ejection (300 s).
    pub max_ejection: Duration,
    /// Most of a pool that may be ejected at once, in percent (10); at least one host is
    /// always ejectable.
    pub max_ejection_percent: u32,
    /// The ejection multiplier drops by one per this much time un-ejected (10 s, Envoy's
    /// analysis `interval`).
    pub decay_interval: Duration,
}

impl Default for OutlierConfig {
    fn default() -> Self {
        OutlierConfig {
            consecutive_failures: 5,
            base_ejection: Duration::from_secs(30),
            max_ejection: Duration::from_secs(300),
            max_ejection_percent: 10,
            decay_interval: Duration::from_secs(10),
        }
    }
}

/// Passive outlier state of one host. Failures observed while the host is ejected are
/// ignored (it should carry no new traffic then).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outlier {
    cfg: OutlierConfig,
    consecutive: u32,
    multiplier: u32,
    ejected_until: Option<Instant>,
    /// Start of the current decay period (end of the last ejection or last decrement).
    decay_from: Option<Instant>,
}

impl Outlier {
    /// A host with no failures and no ejection history.
    pub fn new(cfg: OutlierConfig) -> Self {
        Outlier {
            cfg,
            consecutive: 0,
            multiplier: 0,
            ejected_until: None,
            decay_from: None,
        }
    }

    /// The settings.
    pub fn config(&self) -> &OutlierConfig {
        &self.cfg
    }

    /// Ejected at `now`?
    pub fn is_ejected(&self, now: Instant) -> bool {
        self.ejected_until.is_some_and(|u| now < u)
    }

    /// End of the current (or last) ejection.
    pub fn ejected_until(&self) -> Option<Instant> {
        self.ejected_until
    }

    /// Current consecutive-failure count.
    pub fn consecutive_failures(&self) -> u32 {
        self.consecutive
    }

    /// The ejection multiplier (number of ejections, after decay) at `now`.
    pub fn multiplier(&self, now: Instant) -> u32 {
        let mut o = *self;
        o.settle(now);
        o.multiplier
    }

    /// One observed failure; ejects the host when the threshold is reached and returns
    /// the end of the ejection. No pool cap: use [`PoolOutliers`] for that.
    pub fn on_failure(&mut self, now: Instant) -> Option<Instant> {
        if self.count_failure(now) {
            Some(self.eject(now))
        } else {
            None
        }
    }

    /// One observed success: the consecutive count restarts.
    pub fn on_success(&mut self, now: Instant) {
        self.settle(now);
        self.consecutive = 0;
    }

    /// Ends an ejection early (Envoy: a successful active health check un-ejects).
    pub fn uneject(&mut self, now: Instant) {
        if self.is_ejected(now) {
            self.ejected_until = Some(now);
        }
        self.settle(now);
        self.consecutive = 0;
    }

    /// Counts a failure; true when the host has reached the threshold (and is not
    /// already ejected).
    fn count_failure(&mut self, now: Instant) -> bool {
        self.settle(now);
        if self.is_ejected(now) {
            return false;
        }
        self.consecutive = self.consecutive.saturating_add(1);
        self.consecutive >= self.cfg.consecutive_failures.max(1)
    }

    /// Ejects for `base × multiplier` (after incrementing it), capped at `max_ejection`.
    fn eject(&mut self, now: Instant) -> Instant {
        self.settle(now);
        self.multiplier = self.multiplier.saturating_add(1);
        let d = self
            .cfg
            .base_ejection
            .saturating_mul(self.multiplier)
            .min(self.cfg.max_ejection);
        let until = now.checked_add(d).unwrap_or(now);
        self.ejected_until = Some(until);
        self.consecutive = 0;
        self.decay_from = None;
        until
    }

    /// Ends a finished ejection and applies the multiplier decay up to `now`.
    fn settle(&mut self, now: Instant) {
        if let Some(u) = self.ejected_until {
            if now < u {
                return;
            }
            if self.decay_from.is_none_or(|d| d < u) {
                self.decay_from = Some(u);
            }
        }
        if self.multiplier == 0 {
            return;
        }
        let Some(from) = self.decay_from else {
            self.decay_from = Some(now);
            return;
        };
        let step = self.cfg.decay_interval.as_nanos().max(1);
        let steps = now.saturating_duration_since(from).as_nanos() / step;
        if steps == 0 {
            return;
        }
        let dec = u32::try_from(steps)
            .unwrap_or(u32::MAX)
            .min(self.multiplier);
        self.multiplier -= dec;
        self.decay_from = from
            .checked_add(self.cfg.decay_interval.saturating_mul(dec))
            .or(Some(now));
    }
}

/// Outlier detection across one pool, enforcing `max_ejection_percent` the Envoy way: a
/// host reaching the threshold is ejected only if no host is ejected yet or the ejected
/// share is below the limit (`ejected × 100 < percent × pool`). A host refused for that
/// reason keeps its count and is retried on its next failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolOutliers {
    cfg: OutlierConfig,
    hosts: Vec<Outlier>,
}

impl PoolOutliers {
    /// A pool of `n` hosts.
    pub fn new(cfg: OutlierConfig, n: usize) -> Self {
        PoolOutliers {
            cfg,
            hosts: vec![Outlier::new(cfg); n],
        }
    }

    /// Pool size.
    pub fn len(&self) -> usize {
        self.hosts.len()
    }

    /// Empty pool?
    pub fn is_empty(&self) -> bool {
        self.hosts.is_empty()
    }

    /// The pool grew or shrank at the end.
    pub fn resize(&mut self, n: usize) {
        self.hosts.resize(n, Outlier::new(self.cfg));
    }

    /// Host `i` left the pool; later hosts shift down.
    pub fn remove(&mut self, i: usize) {
        if i < self.hosts.len() {
            self.hosts.remove(i);
        }
    }

    /// Host `i` is `h`, which stayed in the pool across a reconfiguration: it keeps its
    /// failures, ejection and history under this pool's settings.
    pub fn keep(&mut self, i: usize, h: &Outlier) {
        if let Some(slot) = self.hosts.get_mut(i) {
            *slot = Outlier {
                cfg: self.cfg,
                ..*h
            };
        }
    }

    /// Host `i`'s state.
    pub fn host(&self, i: usize) -> Option<&Outlier> {
        self.hosts.get(i)
    }

    /// Is host `i` ejected at `now`? (false for an unknown index)
    pub fn is_ejected(&self, i: usize, now: Instant) -> bool {
        self.hosts.get(i).is_some_and(|h| h.is_ejected(now))
    }

    /// Number of hosts ejected at `now`.
    pub fn ejected_count(&self, now: Instant) -> usize {
        self.hosts.iter().filter(|h| h.is_ejected(now)).count()
    }

    /// Whether one more host may be ejected at `now`.
    pub fn may_eject(&self, now: Instant) -> bool {
        let e = self.ejected_count(now) as u128;
        e == 0 || e * 100 < u128::from(self.cfg.max_ejection_percent) * self.hosts.len() as u128
    }

    /// One failure of host `i`; returns the end of the ejection if it got ejected.
    pub fn on_failure(&mut self, i: usize, now: Instant) -> Option<Instant> {
        let may = self.may_eject(now);
        let h = self.hosts.get_mut(i)?;
        if h.count_failure(now) && may {
            Some(h.eject(now))
        } else {
            None
        }
    }

    /// One success of host `i`.
    pub fn on_success(&mut self, i: usize, now: Instant) {
        if let Some(h) = self.hosts.get_mut(i) {
            h.on_success(now);
        }
    }

    /// Ends host `i`'s ejection early (successful active health check).
    pub fn uneject(&mut self, i: usize, now: Instant) {
        if let Some(h) = self.hosts.get_mut(i) {
            h.uneject(now);
        }
    }
}

// ---- slow start ---------------------------------------------------------------------

/// Envoy slow start: `weight × max(min_weight_percent, (t / window)^(1/aggression))`
/// during `window` after [`SlowStart::start`], full weight afterwards (anchors §2.1).
/// Our deviation: the time factor is plain `t / window` (Envoy floors `t` at 1 s).
///
/// The balancer takes the exact multiplier, [`SlowStart::factor`], through
/// `Balancer::set_ramp` while [`SlowStart::is_active`], with the configured weight in
/// `BackendLoad::weight`: every algorithm but `none` applies it as a fraction (the
/// weighted ones as the `f64` weight `weight × f`), so a backend of weight 1, the
/// default, ramps as smoothly as one of 100. [`SlowStart::effective_weight`] is the
/// rounded integer `weight × f` (kept ≥ 1), for display only: the balancer does not use
/// it, since with small weights it does not ramp at all (always 1 for a weight of 1).
/// Call `start` when a backend is added or comes back up, not at controller start
/// (HAProxy: never applied at startup; Envoy: ineffective when all are new).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SlowStart {
    /// Ramp duration.
    pub window: Duration,
    /// Floor of the ramp in percent (Envoy `min_weight_percent`, 10).
    pub min_weight_percent: u32,
    /// Envoy `aggression` (1.0 = linear; > 1 ramps faster early).
    pub aggression: f64,
    started: Option<Instant>,
}

impl SlowStart {
    /// Envoy's default `min_weight_percent`.
    pub const DEFAULT_MIN_WEIGHT_PERCENT: u32 = 10;

    /// A ramp of `window`, 10 % floor, aggression 1.0, not started.
    pub fn new(window: Duration) -> Self {
        SlowStart {
            window,
            min_weight_percent: SlowStart::DEFAULT_MIN_WEIGHT_PERCENT,
            aggression: 1.0,
            started: None,
        }
    }

    /// The backend (re)entered service at `now`.
    pub fn start(&mut self, now: Instant) {
        self.started = Some(now);
    }

    /// Abandons the ramp (full weight).
    pub fn stop(&mut self) {
        self.started = None;
    }

    /// Ramping at `now`?
    pub fn is_active(&self, now: Instant) -> bool {
        self.started.is_some_and(|s| {
            !self.window.is_zero() && now.saturating_duration_since(s) < self.window
        })
    }

    /// Weight multiplier in `[min_weight_percent / 100, 1]` at `now`.
    pub fn factor(&self, now: Instant) -> f64 {
        let Some(s) = self.started else { return 1.0 };
        if !self.is_active(now) {
            return 1.0;
        }
        let tf = now.saturating_duration_since(s).as_secs_f64() / self.window.as_secs_f64();
        let aggr = if self.aggression.is_finite() && self.aggression > 0.0 {
            self.aggression
        } else {
            1.0
        };
        let f = tf.powf(1.0 / aggr);
        let min = (f64::from(self.min_weight_percent) / 100.0).min(1.0);
        let f = if f.is_nan() { min } else { f.max(min) };
        f.min(1.0)
    }

    /// `base` scaled by [`SlowStart::factor`], rounded, at least 1 when `base > 0`. An
    /// integer view of the ramp for display; the balancer applies the exact factor (see
    /// the type's docs), `f64::from(base) * factor` being the exact ramped weight.
    pub fn effective_weight(&self, now: Instant, base: u32) -> u32 {
        if base == 0 {
            return 0;
        }
        let w = (f64::from(base) * self.factor(now)).round();
        // `w` is in [0, base] so the cast cannot truncate.
        (w as u32).clamp(1, base)
    }
}

// ---- admin state --------------------------------------------------------------------

/// The operator's switch for a backend (HAProxy agent `ready` / `drain`): a draining
/// backend takes no new connections, while its pinned flows run until they end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AdminState {
    /// Takes new connections.
    #[default]
    Active,
    /// No new connections; existing ones continue.
    Draining,
}

impl AdminState {
    /// True for `Active`.
    pub fn accepts_new(self) -> bool {
        self == AdminState::Active
    }

    /// `"active"` / `"draining"`.
    pub const fn as_str(self) -> &'static str {
        match self {
            AdminState::Active => "active",
            AdminState::Draining => "draining",
        }
    }
}

impl fmt::Display for AdminState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for AdminState {
    type Err = String;

    /// `active`/`ready` and `draining`/`drain` (ASCII case-insensitive).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "active" | "ready" => Ok(AdminState::Active),
            "draining" | "drain" => Ok(AdminState::Draining),
            _ => Err(format!(
                "unknown admin state {s:?}; expected \"active\" or \"draining\""
            )),
        }
    }
}
