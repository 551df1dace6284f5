//! Backend health: pure state machines with time passed in (sans-IO).
//!
//! * [`ActiveHealth`]: rise/fall counting of active probe results (HAProxy defaults
//!   rise 2, fall 3; anchors §2.2), with Envoy's "a single success marks a new host
//!   healthy" at start (anchors §2.1).
//! * [`Outlier`] / [`PoolOutliers`]: passive outlier ejection with Envoy's three detectors
//!   and rules (anchors §2.1): consecutive failures (5), a success rate under the pool's
//!   mean by 1.9 standard deviations, a failure percentage over a threshold (off by
//!   default); ejection for 30 s × number of ejections capped at 300 s, the multiplier
//!   decaying while the host stays un-ejected, and at most 10 % of a pool ejected (at
//!   least one host always ejectable). Settings in `[service.outlier]` ([`outlier`]).
//! * [`SlowStart`]: Envoy's slow-start weight ramp (aggression 1.0 = linear).
//! * [`AdminState`]: the operator's ready/drain switch.
//!
//! Together they give the balancer its `BackendLoad::eligible` (healthy, not draining,
//! not ejected) and the slow-start fraction of `Balancer::set_ramp` (the exact
//! [`SlowStart::factor`]; `BackendLoad::weight` stays the configured weight).

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, Instant};

pub mod outlier;
#[cfg(test)]
mod tests;

pub use outlier::{
    Detector, FailurePercentageConfig, Outlier, OutlierConfig, PoolOutliers, RateWindow,
    SuccessRateConfig, SuccessRateStats,
};

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
