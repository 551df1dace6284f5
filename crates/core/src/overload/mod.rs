//! Overload control: call gapping of new flows, driven by feedback, in the manner of the
//! adaptive congestion control mechanism (ACCM) of Polykalas, Kolyvas and Venieris.
//!
//! Two kinds of destination can overload, and each gets its own gap controller:
//!
//! - a **service's backend pool** ([`GapController`] per service), whose load `ρ` is its
//!   measured load against its capacity: the admitted new-connection rate against
//!   `capacity_rps`, the live connections against `max_active_connections`, the backends'
//!   response time against `target_response_ms` (the largest of the configured ratios);
//! - **the controller itself** ([`ControllerGap`]), whose load is the busy fraction of its
//!   PACKET_IN path against `target_utilization`, the standing PACKET_IN queue against
//!   `target_delay_ms`, the bytes queued for a switch against `target_outflow_bytes` and
//!   the control channel's standing round trip (ECHO) against `target_rtt_ms`, as
//!   measured by the runtime ([`WorkSample`]). The busy fraction counts only the work
//!   the gap controls, the flows the controller admitted: refusing a flood's excess costs
//!   time too, but gapping harder cannot reduce it (only the switches' meters can), and a
//!   law fed it would gap a controller that is merely busy refusing (or merely busy).
//!
//! # The control law (`mode = "adaptive"`)
//!
//! Every control interval `T` (10–100 ms) the controller measures `ρ` and adapts the
//! admitted rate of new flows `a` (the gap is `g = 1/a`; `a = ∞` means no gap):
//!
//! - `ρ > high_watermark`: multiplicative decrease, `a ← max(min_rate, b · max(β, m/ρ))`
//!   where `b = min(a, 2 × measured admitted rate)` (with no gap yet in force, the
//!   measured rate; for the controller's CPU, the window's handled rate, as the smoothed
//!   one lags a step from idle), `m = (low+high)/2` and `β` is
//!   `decrease_factor`. It tightens fast: in one step straight to where the measured load
//!   says the target is, but never by more than `β` at once. At most one decrease per
//!   `settle` period (the memory of the rate measurement), so a decrease is not repeated
//!   on a measurement that still shows the load from before it (TCP's "once per RTT").
//! - `ρ < low_watermark` and the limit is binding (offered ≥ a): additive increase,
//!   `a ← a + α` with `α = increase_fraction · reference` per interval, `reference` being
//!   `capacity_rps` when configured, else the largest admitted rate seen. It relaxes gently.
//!   When the offered rate falls below `a/2` the gap is lifted entirely (`a = ∞`).
//! - between the watermarks: hold. At steady load the rate then stays put (no sawtooth).
//! - with `capacity_rps` configured, the gate never admits more than
//!   `capacity_rps × (low+high)/2` even with no gap in force (the ceiling): a step from
//!   idle to overload then meets a closed gate, not a measurement still catching up.
//!   `ceiling = false` removes it and leaves the law alone: with no gap in force nothing
//!   is limited, a step from idle is admitted in full until the measured load crosses the
//!   high watermark, and only then does the first decrease cut (`capacity_rps` still sets
//!   ρ and the additive step's reference).
//!
//! `mode = "static"` keeps the same measurement and the same settle period but takes the
//! gap from a fixed table, as AIN Automatic Code Gapping does: an overload *level* rises by
//! one above the high watermark and falls by one below the low watermark, and the gap is
//! `gaps_ms[level]` (default: the AIN ACG interval table, 0, 0.1, 0.25, 0.5, 1, 2 … 600 s).
//!
//! Our reading of ACCM, where it differs from the paper's words:
//!
//! - ACCM "adapts the duration and the number of ON and OFF periods within the gap". Here
//!   the OFF period (the gap `g`) adapts; the ON period is fixed, `gate_burst` admissions
//!   (default 2; 1 is Crawford's deterministic gap), and the number of periods follows
//!   from `g` and the control interval.
//! - The ceiling belongs to the adaptive mode only: the static mode has the AIN table's
//!   levels and no ceiling (`ceiling` is refused in any other mode). A comparison of
//!   `static` with `adaptive` at its default (`ceiling = true`) with `capacity_rps` set
//!   measures the adaptive law together with its ceiling, not the law alone. The lab's
//!   overload scenario (`flowgate lab run overload`, `docs/lab.md`; not `--quick`) runs,
//!   and `flowgate sim --overload` takes, a fourth arm, `adaptive-no-ceiling`: the law with
//!   `ceiling = false`, the ablation of the ceiling.
//!
//! # Enforcement
//!
//! - At the controller, a deterministic (Crawford) gate: after each admitted new
//!   connection the gate closes for `g`; a SYN that arrives while it is closed is answered
//!   with a TCP RST, so the client learns at once ([`Gate`]).
//! - At the switch, a meter (PKTPS, BURST, one DROP band) on the service's intercept rule,
//!   set to `backstop_factor · a`: a backstop that keeps the controller's channel from
//!   carrying more refusals than it is worth, above the gate so that most refusals are
//!   RSTs rather than silent drops ([`meter_plan`]). Its rate is quantized to 1/8-octave
//!   steps, and changed at most every `meter_hold`, a change of one step only after it
//!   lasted five: OFPMC_MODIFY refills the bucket ([`meter_change_due`]).
//! - OFF periods of `off_rule_min_gap_ms` or longer (a gap of seconds): after each
//!   admission a high-priority drop rule for the service address with `hard_timeout` = the
//!   OFF period in whole seconds, withdrawn (deleted) as soon as the gap relaxes.
//! - Per switch: the admitted rate is split across the switches that bring the
//!   destination's new flows by their offered demand ([`split_by_demand`]; PACKET_INs seen
//!   plus meter drops), each switch with its own gate and meter at its share.
//! - Meter feedback: METER_STATS (§7.3.5.12) polled every controller interval; band drops
//!   are offered demand the gate never saw, added to λ and to the switch's demand.
//! - The controller's own channel: a meter on the table-miss rule, and a cap on every
//!   intercept meter, at the switch's share of the controller's admitted PACKET_IN rate;
//!   and at the controller, a gate per service at the max-min fair level of that rate
//!   ([`max_min_fair`]: the share of the services held below their demand, so a service
//!   that asks less is not held at all), which drops new flows beyond it without
//!   answering (no FLOW_MOD, no PACKET_OUT: measured on OVS, a flooded switch stops
//!   reading what the controller sends, so each admitted flood SYN would queue more for
//!   it).

pub mod config;
#[cfg(test)]
mod sim_tests;
#[cfg(test)]
mod tests;

use std::time::{Duration, Instant};

use serde::Serialize;

pub use config::{ControllerOverloadConfig, OverloadConfig, Refusal};

/// Meter id of the controller's own meter on the table-miss rule.
pub const TABLE_MISS_METER: u32 = 1;
/// Meter id of service `i`'s intercept meter: `SERVICE_METER_BASE + i`.
pub const SERVICE_METER_BASE: u32 = 16;
/// A meter rate that never binds (packets per second), for meters that must exist but
/// gate nothing yet.
pub const OPEN_METER_RATE: u32 = 1_000_000;

/// The AIN Automatic Code Gapping interval table (seconds), as listed in a vendor's SS7
/// documentation (research note §2.1), in milliseconds. Index 0 is "no gap".
pub const AIN_ACG_GAPS_MS: [u32; 27] = [
    0, 100, 250, 500, 1_000, 2_000, 3_000, 4_000, 5_000, 6_000, 8_000, 10_000, 11_000, 15_000,
    16_000, 22_000, 30_000, 42_000, 58_000, 60_000, 81_000, 112_000, 120_000, 156_000, 217_000,
    300_000, 600_000,
];

/// How new flows to a destination are gapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// No gapping.
    #[default]
    Off,
    /// A fixed gap table indexed by load level (AIN ACG).
    Static,
    /// ACCM: the gap adapts to the measured load (AIMD with watermarks).
    Adaptive,
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Mode::Off => "off",
            Mode::Static => "static",
            Mode::Adaptive => "adaptive",
        })
    }
}

/// The law's parameters, shared by the service and the controller gaps.
#[derive(Debug, Clone, PartialEq)]
pub struct LawParams {
    pub mode: Mode,
    pub interval: Duration,
    pub high_watermark: f64,
    pub low_watermark: f64,
    pub decrease_factor: f64,
    pub increase_fraction: f64,
    pub min_rate: f64,
    /// Memory of the rate measurements, and the shortest time between two decreases.
    pub settle: Duration,
    /// Reference rate for the additive step (e.g. the pool's capacity), if known.
    pub reference_rate: Option<f64>,
    /// `static` mode's gap table (ms; 0 = no gap).
    pub gaps_ms: Vec<u32>,
    /// `adaptive` with a known capacity: the gate never admits more than
    /// `capacity × (low+high)/2`, the middle of the hold band, even with no gap in force.
    /// Saves the overshoot of a step from idle to overload. `None` without a capacity, in
    /// any other mode, and with `ceiling = false`.
    pub ceiling: Option<f64>,
}

/// Exponentially weighted rate estimate with time constant `tau`.
#[derive(Debug, Clone, Copy, Default)]
pub struct RateEwma {
    pub rate: f64,
    primed: bool,
}

impl RateEwma {
    pub fn update(&mut self, count: u64, dt: Duration, tau: Duration) {
        let secs = dt.as_secs_f64();
        if secs <= 0.0 {
            return;
        }
        let inst = count as f64 / secs;
        if !self.primed {
            self.rate = inst;
            self.primed = true;
            return;
        }
        let alpha = 1.0 - (-secs / tau.as_secs_f64().max(1e-6)).exp();
        self.rate += alpha * (inst - self.rate);
    }
}

/// What one control step decided.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Step {
    /// The admitted rate before and after.
    pub before: Option<f64>,
    pub after: Option<f64>,
    pub load: f64,
}

/// The gap state of one destination: the law, its measurements, its counters.
#[derive(Debug, Clone)]
pub struct GapController {
    pub params: LawParams,
    /// Admitted new-flow rate (per second); `None` = no gap.
    rate: Option<f64>,
    /// `static` mode's level (index into `gaps_ms`).
    level: usize,
    offered: RateEwma,
    admitted: RateEwma,
    offered_since: u64,
    admitted_since: u64,
    pub offered_total: u64,
    pub admitted_total: u64,
    pub refused_total: u64,
    /// New flows the switches' meters dropped before they reached the gate (from
    /// METER_STATS band counts): offered, never admitted, refused silently.
    pub meter_dropped_total: u64,
    last_step: Option<Instant>,
    last_decrease: Option<Instant>,
    last_load: f64,
    max_admitted_seen: f64,
}

impl GapController {
    pub fn new(params: LawParams) -> Self {
        GapController {
            params,
            rate: None,
            level: 0,
            offered: RateEwma::default(),
            admitted: RateEwma::default(),
            offered_since: 0,
            admitted_since: 0,
            offered_total: 0,
            admitted_total: 0,
            refused_total: 0,
            meter_dropped_total: 0,
            last_step: None,
            last_decrease: None,
            last_load: 0.0,
            max_admitted_seen: 0.0,
        }
    }

    pub fn mode(&self) -> Mode {
        self.params.mode
    }

    /// The admitted-rate limit (new flows per second); `None` when nothing is gapped.
    pub fn rate(&self) -> Option<f64> {
        match self.params.mode {
            Mode::Off => None,
            _ => self.rate,
        }
    }

    /// The gap `g = 1/a`, if any.
    pub fn gap(&self) -> Option<Duration> {
        self.rate()
            .map(|a| Duration::from_secs_f64(1.0 / a.max(1e-3)))
    }

    /// The rate the gate enforces: the gap's, else the ceiling (adaptive only).
    pub fn gate_rate(&self) -> Option<f64> {
        match self.params.mode {
            Mode::Adaptive => match (self.rate, self.params.ceiling) {
                (Some(a), Some(c)) => Some(a.min(c)),
                (a, c) => a.or(c),
            },
            _ => self.rate(),
        }
    }

    /// The gap the gate enforces (`1 / gate_rate`).
    pub fn gate_gap(&self) -> Option<Duration> {
        self.gate_rate()
            .map(|a| Duration::from_secs_f64(1.0 / a.max(1e-3)))
    }

    pub fn level(&self) -> usize {
        self.level
    }

    pub fn load(&self) -> f64 {
        self.last_load
    }

    pub fn offered_rate(&self) -> f64 {
        self.offered.rate
    }

    pub fn admitted_rate(&self) -> f64 {
        self.admitted.rate
    }

    /// A new flow arrived at the gate; `admitted` says what the gate decided.
    pub fn record(&mut self, admitted: bool) {
        self.offered_since += 1;
        self.offered_total += 1;
        if admitted {
            self.admitted_since += 1;
            self.admitted_total += 1;
        } else {
            self.refused_total += 1;
        }
    }

    /// Count `n` flows the destination took without going through the gate (the
    /// controller's PACKET_INs are measured in bulk).
    pub fn record_bulk(&mut self, offered: u64, admitted: u64) {
        self.offered_since += offered;
        self.offered_total += offered;
        self.admitted_since += admitted;
        self.admitted_total += admitted;
        self.refused_total += offered.saturating_sub(admitted);
    }

    /// Count `n` new flows a switch meter dropped (METER_STATS band counts): they were
    /// offered, so the offered rate λ the law sees includes them, though the gate never
    /// saw them.
    pub fn record_meter_drops(&mut self, n: u64) {
        // `n` comes from a switch's counters: saturate rather than wrap.
        self.offered_since = self.offered_since.saturating_add(n);
        self.offered_total = self.offered_total.saturating_add(n);
        self.meter_dropped_total = self.meter_dropped_total.saturating_add(n);
    }

    /// Whether a control step is due at `now`.
    pub fn due(&self, now: Instant) -> bool {
        self.last_step
            .is_none_or(|t| now.saturating_duration_since(t) >= self.params.interval)
    }

    /// Fold the counts since the last step into the rate estimates (and return `dt`).
    pub fn measure(&mut self, now: Instant) -> Duration {
        let dt = match self.last_step {
            Some(t) => now.saturating_duration_since(t),
            None => Duration::ZERO,
        };
        self.last_step = Some(now);
        if !dt.is_zero() {
            self.offered
                .update(self.offered_since, dt, self.params.settle);
            self.admitted
                .update(self.admitted_since, dt, self.params.settle);
            self.max_admitted_seen = self.max_admitted_seen.max(self.admitted.rate);
        }
        self.offered_since = 0;
        self.admitted_since = 0;
        dt
    }

    /// One control step with the measured load `load` (ρ; 1.0 = at target). Call
    /// [`GapController::measure`] first, at the same `now`.
    pub fn control(&mut self, now: Instant, load: f64) -> Step {
        self.control_from(now, load, None)
    }

    /// [`GapController::control`], where a first cut (no gap yet in force) starts from
    /// `first_base` when it is above the smoothed admitted rate: a rate the caller knows
    /// the load scales with (the controller's CPU and the PACKET_INs it handled in the
    /// window that overloaded). Without it the first cut starts from the smoothed rate,
    /// which lags a step from idle and so cuts deeper.
    pub fn control_from(&mut self, now: Instant, load: f64, first_base: Option<f64>) -> Step {
        let load = if load.is_finite() { load.max(0.0) } else { 0.0 };
        self.last_load = load;
        let before = self.rate();
        let p = &self.params;
        let settled = self
            .last_decrease
            .is_none_or(|t| now.saturating_duration_since(t) >= p.settle);
        match p.mode {
            Mode::Off => {
                self.rate = None;
                self.level = 0;
            }
            Mode::Adaptive => {
                let measured = self.admitted.rate;
                if load > p.high_watermark {
                    if settled {
                        let mid = 0.5 * (p.low_watermark + p.high_watermark);
                        let base = match self.rate {
                            // Relative to the limit, proportional to the overshoot, but
                            // never from far above what was admitted: a limit that does
                            // not bind must bind after the cut. A deterministic gate
                            // admits λa/(λ+a) ≥ a/2 while a ≤ λ, hence the 2.
                            Some(a) => a.min(2.0 * measured.max(p.min_rate)),
                            None => first_base.map_or(measured, |b| b.max(measured)),
                        };
                        let factor = (mid / load).max(p.decrease_factor);
                        self.rate = Some((base * factor).max(p.min_rate));
                        self.last_decrease = Some(now);
                    }
                } else if load < p.low_watermark
                    && let Some(a) = self.rate
                {
                    let offered = self.offered.rate;
                    if offered < 0.5 * a || p.ceiling.is_some_and(|c| a >= c) {
                        // Demand is well under the limit (or the limit reached the
                        // ceiling): lift the gap.
                        self.rate = None;
                    } else if offered >= a * 0.95 || measured >= a * 0.8 {
                        let reference = p
                            .reference_rate
                            .unwrap_or(self.max_admitted_seen.max(p.min_rate * 10.0));
                        self.rate = Some(a + p.increase_fraction * reference);
                    }
                }
            }
            Mode::Static => {
                let top = p.gaps_ms.len().saturating_sub(1);
                if load > p.high_watermark {
                    if settled && self.level < top {
                        self.level += 1;
                        self.last_decrease = Some(now);
                    }
                } else if load < p.low_watermark && self.level > 0 && settled {
                    self.level -= 1;
                    self.last_decrease = Some(now);
                }
                self.rate = match p.gaps_ms.get(self.level).copied().unwrap_or(0) {
                    0 => None,
                    ms => Some(1000.0 / f64::from(ms)),
                };
            }
        }
        Step {
            before,
            after: self.rate(),
            load,
        }
    }

    /// A serialisable view for the API.
    pub fn view(&self) -> GapView {
        GapView {
            mode: self.params.mode,
            gapping: self.rate().is_some()
                || self.gate_rate().is_some_and(|c| self.offered.rate > c),
            admitted_rate_limit: self.gate_rate(),
            gap_ms: self.gate_gap().map(|g| g.as_secs_f64() * 1000.0),
            level: (self.params.mode == Mode::Static).then_some(self.level),
            load: self.last_load,
            offered_rate: self.offered.rate,
            admitted_rate: self.admitted.rate,
            offered_total: self.offered_total,
            admitted_total: self.admitted_total,
            refused_total: self.refused_total,
            controller_refused_total: None,
            meter_dropped_total: self.meter_dropped_total,
            switches: Vec::new(),
            handshakes: None,
        }
    }
}

/// The gap state of one destination, as the API and `/metrics` show it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct GapView {
    pub mode: Mode,
    /// True while new flows are being gapped.
    pub gapping: bool,
    /// The admitted new-flow rate (per second) the gate enforces (the gap's, or the
    /// capacity ceiling in `adaptive` mode); `null` = no limit.
    pub admitted_rate_limit: Option<f64>,
    /// The current gap (ms between two admissions); `null` = no gap.
    pub gap_ms: Option<f64>,
    /// `static` mode: the overload level (index into the gap table).
    pub level: Option<usize>,
    /// The last measured load ρ (1.0 = at target).
    pub load: f64,
    /// Measured new-flow arrival rate at the gate (per second).
    pub offered_rate: f64,
    /// Measured admitted rate (per second).
    pub admitted_rate: f64,
    pub offered_total: u64,
    pub admitted_total: u64,
    /// New flows refused by the gap (RST from the controller, or dropped by a gap rule).
    pub refused_total: u64,
    /// A service's new flows that the controller's own gate dropped while it gapped
    /// itself (beyond the max-min fair level of the controller's admitted rate); counted
    /// in neither `offered_total` nor `refused_total`. `null` for the controller, whose
    /// `refused_total` counts them all.
    pub controller_refused_total: Option<u64>,
    /// New flows (PACKET_INs) the switches' meters dropped, from METER_STATS; counted in
    /// `offered_total` and `offered_rate`, not in `refused_total`.
    pub meter_dropped_total: u64,
    /// Per switch: its offered demand and its share of the admitted rate.
    pub switches: Vec<SwitchShareView>,
    /// A service's connections admitted while the controller gapped it, whose rules
    /// waited for the client's ACK (`controller::handshake`); `null` for the controller.
    pub handshakes: Option<crate::controller::handshake::ServiceHandshakes>,
}

/// One switch's part of a destination's gap, for the API.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct SwitchShareView {
    /// Datapath id, hex.
    pub dpid: String,
    /// Offered new flows per second at this switch: PACKET_INs seen plus meter drops.
    pub offered_rate: f64,
    /// This switch's share of the admitted rate (per second); `null` = no limit.
    pub admitted_rate_limit: Option<f64>,
    /// The rate of the meter installed for this destination on this switch (pktps).
    pub meter_rate: Option<u32>,
    /// Packets this switch's meter dropped (METER_STATS band count, since the controller
    /// connected to it).
    pub meter_dropped_total: u64,
}

/// Every switch keeps at least this fraction of the even share (`total / n`), so a
/// switch that was idle can still admit its first new flows, and so show its demand.
pub const SWITCH_FLOOR_FRACTION: f64 = 0.1;
/// Weight of the newest interval in a switch's demand estimate: a switch that goes idle
/// gives its share away within a few intervals (0.5⁴ ≈ 6% left after four).
pub const DEMAND_SMOOTHING: f64 = 0.5;

/// Split an admitted rate `total` across switches by their offered `demands`.
///
/// Shares are in proportion to demand: the weighted max-min fair allocation with weights
/// = demands. When the demands together exceed `total`, no proportional share exceeds its
/// demand, so none is capped and the shares are proportional (offered 3:1 → admitted
/// 3:1); when they do not, every switch gets its demand and the surplus is spread in the
/// same proportion (headroom to grow into). Every switch keeps at least the floor
/// `floor_fraction · total / n` (an idle switch can still admit the first flows that show
/// its demand); the switches above the floor share the rest in proportion. With no demand
/// anywhere the split is even. The shares always sum to `total`.
pub fn split_by_demand(total: f64, demands: &[f64], floor_fraction: f64) -> Vec<f64> {
    let n = demands.len();
    if n == 0 {
        return Vec::new();
    }
    let total = if total.is_finite() {
        total.max(0.0)
    } else {
        0.0
    };
    let floor = floor_fraction.clamp(0.0, 1.0) * total / n as f64;
    let d: Vec<f64> = demands
        .iter()
        .map(|&d| if d.is_finite() { d.max(0.0) } else { 0.0 })
        .collect();
    // Water-fill: fix at the floor every switch whose proportional share falls below it,
    // and share the rest among the others; at most n rounds (each fixes one or more).
    let mut at_floor = vec![false; n];
    let mut shares = vec![0.0; n];
    for _ in 0..=n {
        let fixed = at_floor.iter().filter(|&&f| f).count();
        let free = total - floor * fixed as f64;
        let sum: f64 = (0..n).filter(|&i| !at_floor[i]).map(|i| d[i]).sum();
        let mut changed = false;
        for i in 0..n {
            shares[i] = if at_floor[i] {
                floor
            } else if sum > 0.0 {
                free * d[i] / sum
            } else {
                free / (n - fixed).max(1) as f64
            };
            if !at_floor[i] && shares[i] < floor - 1e-12 {
                at_floor[i] = true;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    shares
}

/// Max-min fair split of `total` among demands (equal weights, each capped at its
/// demand): a destination asking less than its fair share gets all it asks, the rest is
/// shared equally among the others. The controller shares its admitted new-flow rate
/// among services this way, so a flooded service cannot starve a quiet one. Whatever the
/// demands leave over is spread evenly (headroom).
pub fn max_min_fair(total: f64, demands: &[f64]) -> Vec<f64> {
    let n = demands.len();
    if n == 0 {
        return Vec::new();
    }
    let total = if total.is_finite() {
        total.max(0.0)
    } else {
        0.0
    };
    let d: Vec<f64> = demands
        .iter()
        .map(|&d| if d.is_finite() { d.max(0.0) } else { 0.0 })
        .collect();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| d[a].total_cmp(&d[b]));
    let mut shares = vec![0.0; n];
    let mut left = total;
    for (k, &i) in order.iter().enumerate() {
        let fair = left / (n - k) as f64;
        shares[i] = d[i].min(fair);
        left -= shares[i];
    }
    let extra = left / n as f64;
    shares.iter_mut().for_each(|x| *x += extra);
    shares
}

/// One switch's offered demand for a destination, measured per control interval.
#[derive(Debug, Clone, Copy, Default)]
pub struct SwitchDemand {
    /// Arrivals (PACKET_INs of new flows) since the last step.
    arrivals_since: u64,
    /// Meter drops (METER_STATS deltas) since the last step.
    dropped_since: u64,
    /// Smoothed offered rate (per second).
    pub rate: f64,
    primed: bool,
    pub dropped_total: u64,
    /// This switch's share of the admitted rate; `None` = no limit.
    pub share: Option<f64>,
    /// The gate this switch's new flows meet (service gaps only).
    pub gate: Gate,
}

impl SwitchDemand {
    pub fn arrival(&mut self) {
        self.arrivals_since += 1;
    }

    pub fn arrivals(&mut self, n: u64) {
        self.arrivals_since += n;
    }

    pub fn dropped(&mut self, n: u64) {
        self.dropped_since = self.dropped_since.saturating_add(n);
        self.dropped_total = self.dropped_total.saturating_add(n);
    }

    /// (offered rate, share), for views.
    pub fn demand_view(&self) -> (f64, Option<f64>) {
        (self.rate, self.share)
    }

    /// Fold the counts of the last `dt` into the demand estimate.
    pub fn measure(&mut self, dt: Duration) {
        let secs = dt.as_secs_f64();
        if secs <= 0.0 {
            return;
        }
        let inst = (self.arrivals_since + self.dropped_since) as f64 / secs;
        self.arrivals_since = 0;
        self.dropped_since = 0;
        if self.primed {
            self.rate += DEMAND_SMOOTHING * (inst - self.rate);
        } else {
            self.rate = inst;
            self.primed = true;
        }
    }
}

/// Set every switch's share of `total` (`None`: no limit) from their demands.
pub fn apply_split<'a>(
    total: Option<f64>,
    switches: impl ExactSizeIterator<Item = &'a mut SwitchDemand>,
) {
    let mut v: Vec<&mut SwitchDemand> = switches.collect();
    match total {
        None => v.iter_mut().for_each(|s| s.share = None),
        Some(t) => {
            let demands: Vec<f64> = v.iter().map(|s| s.rate).collect();
            for (s, share) in v
                .iter_mut()
                .zip(split_by_demand(t, &demands, SWITCH_FLOOR_FRACTION))
            {
                s.share = Some(share);
            }
        }
    }
}

/// The controller-side gate: a token bucket refilled at one token per gap `g`, holding at
/// most `depth` tokens.
///
/// With `depth = 1` it is the deterministic call gap (Crawford): after each admission the
/// gate stays closed for `g`; the first arrival after that is admitted. For Poisson
/// arrivals at rate λ it admits `λ/(1+λg)` (research note §7.1). A deeper bucket (the
/// default `gate_burst = 2`) carries unused time over, so periodic or clustered arrivals
/// get the full `1/g` rather than a rate rounded down to a divisor of theirs.
#[derive(Debug, Clone, Copy, Default)]
pub struct Gate {
    tokens: f64,
    last: Option<Instant>,
}

impl Gate {
    /// Crawford's gap: decide one arrival at `now` under `gap` (`None`: no gap, admit).
    pub fn admit(&mut self, now: Instant, gap: Option<Duration>) -> bool {
        self.admit_with_depth(now, gap, 1.0)
    }

    /// Decide one arrival with a bucket of `depth` tokens (≥ 1).
    pub fn admit_with_depth(&mut self, now: Instant, gap: Option<Duration>, depth: f64) -> bool {
        let depth = depth.max(1.0);
        let Some(g) = gap else {
            self.last = None;
            return true;
        };
        let g = g.as_secs_f64().max(1e-9);
        self.tokens = match self.last {
            // A gap starts with a full bucket: the first arrival passes.
            None => depth,
            Some(t) => {
                (self.tokens + now.saturating_duration_since(t).as_secs_f64() / g).min(depth)
            }
        };
        self.last = Some(now);
        if self.tokens >= 1.0 - 1e-9 {
            self.tokens = (self.tokens - 1.0).max(0.0);
            true
        } else {
            false
        }
    }
}

/// Quantize a meter rate (pktps) up to the next 1/8-octave step (2^(k/8)), so that small
/// changes of the admitted rate do not each cost an OFPMC_MODIFY (which refills the
/// bucket, research note §8.3).
pub fn quantize_rate(rate: f64) -> u32 {
    if !rate.is_finite() || rate >= f64::from(OPEN_METER_RATE) {
        return OPEN_METER_RATE;
    }
    if rate <= 1.0 {
        return 1;
    }
    let k = (rate.log2() * 8.0 - 1e-9).ceil();
    let q = 2f64.powf(k / 8.0).ceil();
    (q as u32).clamp(1, OPEN_METER_RATE)
}

/// How many holds a meter keeps a rate one quantization step (1/8 octave, 9 %) from the
/// one wanted, before it is modified.
pub const METER_SMALL_CHANGE_HOLDS: u32 = 5;

/// Whether a meter installed as `have` `held` ago should be modified to `want`.
///
/// An OFPMC_MODIFY refills the bucket (research note §8.3), a free burst of `burst_ms`
/// worth of packets. A wanted rate that jitters across one quantization step (a demand
/// split that moves by a few percent) would modify the meter every `hold` and let that
/// burst through each time: in `flowgate sim`, with 100 ms bursts and a 200 ms hold, an
/// overloaded controller was sent about 30 % more than its admitted rate, and spent an
/// eighth of its time dropping the excess. So a change of
/// one step waits [`METER_SMALL_CHANGE_HOLDS`] holds (the meter is then at most 9 % off
/// meanwhile); a change of two steps or more, a real change of the rate, waits one.
pub fn meter_change_due(have: MeterBand, want: MeterBand, held: Duration, hold: Duration) -> bool {
    if have == want || held < hold {
        return false;
    }
    let steps = (8.0 * (f64::from(want.rate.max(1)) / f64::from(have.rate.max(1))).log2())
        .abs()
        .round();
    steps >= 2.0 || held >= hold * METER_SMALL_CHANGE_HOLDS
}

/// One meter's band: rate and burst (packets).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MeterBand {
    pub rate: u32,
    pub burst: u32,
}

/// The meter a service's intercept rule should carry on one switch.
///
/// `service_rate`: the service gap's admitted rate (`None` = no gap); `controller_share`:
/// the controller's admitted PACKET_IN rate for this switch (`None` = no cap).
pub fn meter_plan(
    service_rate: Option<f64>,
    backstop_factor: f64,
    controller_share: Option<f64>,
    burst_ms: u32,
) -> MeterBand {
    let want = match (service_rate.map(|a| a * backstop_factor), controller_share) {
        (Some(a), Some(c)) => a.min(c),
        (Some(a), None) => a,
        (None, Some(c)) => c,
        (None, None) => f64::INFINITY,
    };
    let rate = quantize_rate(want);
    let burst = ((f64::from(rate) * f64::from(burst_ms) / 1000.0).ceil() as u32).max(1);
    MeterBand { rate, burst }
}

/// What the runtime measured of the controller's own PACKET_IN work over one batch.
#[derive(Debug, Clone, Copy, Default)]
pub struct WorkSample {
    /// PACKET_INs handled in the batch.
    pub packet_ins: u64,
    /// PACKET_INs the session dropped unhandled since the last sample (a flood beyond
    /// its `packet_in_rate`, or read while its switch was behind on the controller's
    /// messages): offered to the controller, so counted in λ.
    pub session_dropped: u64,
    /// Time spent handling them (the decision latency of the batch, in total).
    pub busy: Duration,
    /// The part of `busy` spent on PACKET_INs the controller's own gate dropped (reading,
    /// decoding and refusing them). Gapping cannot reduce it, only the switches' meters
    /// can: the law leaves it out of the utilization it controls, or a flood that keeps
    /// the controller busy merely refusing would drive the admitted rate to its floor.
    pub shed: Duration,
    /// The longest a message of the batch waited in the controller between being read
    /// off the socket and being handled (its queueing delay).
    pub queueing: Duration,
    /// Bytes still buffered (read but not yet handled) after the batch: the backlog.
    pub backlog: u64,
    /// Bytes queued for the switch (written by the controller, not yet taken by the
    /// switch): a switch that cannot read what the controller decides is an overloaded
    /// control channel, whatever the controller's own CPU says.
    pub outflow: u64,
    /// How long the oldest of those bytes has waited for the switch to take them: the
    /// control channel's queueing delay, whatever the switch's reading speed.
    pub outflow_delay: Duration,
    /// The control channel's round trip (zero: not measured): an ECHO_REQUEST's wait for
    /// its reply, the latest one's or, while one is unanswered, at least its age so far.
    /// It crosses every queue a new flow's setup crosses, the switch's own included (its
    /// socket buffers, the messages it has read but not yet processed, the PACKET_INs it
    /// has not yet sent), which the outflow cannot see once the kernel has taken the bytes.
    pub channel_rtt: Duration,
    /// The switch (datapath id) the batch came from.
    pub switch: u64,
}

/// Per switch, the least of a window's readings of one delay: the standing part (a burst
/// drained within the window is not overload). The largest switch's is the channel's: one
/// switch that cannot keep up is enough.
#[derive(Debug, Clone, Default)]
struct StandingPerSwitch(Vec<(u64, Duration)>);

impl StandingPerSwitch {
    fn record(&mut self, switch: u64, d: Duration) {
        match self.0.iter_mut().find(|(sw, _)| *sw == switch) {
            Some((_, m)) => *m = (*m).min(d),
            None => self.0.push((switch, d)),
        }
    }

    /// The window's figure, and a fresh window.
    fn take(&mut self) -> Duration {
        let d = self
            .0
            .iter()
            .map(|(_, d)| *d)
            .max()
            .unwrap_or(Duration::ZERO);
        self.0.clear();
        d
    }
}

/// The controller's own gap: its PACKET_IN path's load, measured by the runtime, drives
/// the admitted PACKET_IN rate, enforced by meters at the switches.
#[derive(Debug, Clone)]
pub struct ControllerGap {
    pub cfg: ControllerOverloadConfig,
    pub law: GapController,
    busy: Duration,
    shed: Duration,
    queueing_max: Duration,
    /// The smallest queueing delay of the window's batches (0 for a batch that left
    /// nothing behind): the standing queue, CoDel's signal.
    standing_min: Option<Duration>,
    backlog_max: u64,
    outflow_max: u64,
    /// The standing outflow delay toward each switch.
    outflow_delay_min: StandingPerSwitch,
    /// The standing round trip of each switch's channel.
    channel_rtt_min: StandingPerSwitch,
    handled_since: u64,
    busy_since: Duration,
    /// Last window's figures, for operators.
    pub utilization: f64,
    pub queueing_delay: Duration,
    pub standing_delay: Duration,
    pub backlog: u64,
    pub outflow: u64,
    pub outflow_delay: Duration,
    pub channel_rtt: Duration,
    pub decision_latency_us: f64,
    /// The highest PACKET_IN rate handled in a window where the controller was saturated.
    pub max_handled_rate: f64,
    pub handled_rate: f64,
}

impl ControllerGap {
    pub fn new(cfg: ControllerOverloadConfig) -> Self {
        let law = GapController::new(cfg.law());
        ControllerGap {
            cfg,
            law,
            busy: Duration::ZERO,
            shed: Duration::ZERO,
            queueing_max: Duration::ZERO,
            standing_min: None,
            backlog_max: 0,
            outflow_max: 0,
            outflow_delay_min: StandingPerSwitch::default(),
            channel_rtt_min: StandingPerSwitch::default(),
            handled_since: 0,
            busy_since: Duration::ZERO,
            utilization: 0.0,
            queueing_delay: Duration::ZERO,
            standing_delay: Duration::ZERO,
            backlog: 0,
            outflow: 0,
            outflow_delay: Duration::ZERO,
            channel_rtt: Duration::ZERO,
            decision_latency_us: 0.0,
            max_handled_rate: 0.0,
            handled_rate: 0.0,
        }
    }

    pub fn record(&mut self, s: WorkSample) {
        self.busy += s.busy;
        self.shed += s.shed.min(s.busy);
        self.busy_since += s.busy;
        self.handled_since += s.packet_ins;
        // A batch that left nothing behind kept up: its wait was the scheduler's, not a
        // queue's. Only a batch with a backlog behind it measures queueing.
        let q = if s.backlog > 0 {
            s.queueing
        } else {
            Duration::ZERO
        };
        self.queueing_max = self.queueing_max.max(q);
        // Only a batch with PACKET_INs in it says anything about their queue.
        if s.packet_ins > 0 {
            self.standing_min = Some(self.standing_min.map_or(q, |m| m.min(q)));
        }
        self.backlog_max = self.backlog_max.max(s.backlog);
        self.outflow_max = self.outflow_max.max(s.outflow);
        self.outflow_delay_min.record(s.switch, s.outflow_delay);
        self.channel_rtt_min.record(s.switch, s.channel_rtt);
        self.law
            .record_bulk(s.packet_ins + s.session_dropped, s.packet_ins);
    }

    /// PACKET_INs the switches' meters dropped (METER_STATS): offered to the controller,
    /// never handled. Counted so that the offered rate is not underestimated while a
    /// meter binds.
    pub fn record_meter_drops(&mut self, n: u64) {
        self.law.record_meter_drops(n);
    }

    /// One control step; returns the step when one ran.
    pub fn step(&mut self, now: Instant) -> Option<Step> {
        if !self.law.due(now) {
            return None;
        }
        let dt = self.law.measure(now);
        if dt.is_zero() {
            return None;
        }
        let secs = dt.as_secs_f64();
        self.utilization = (self.busy.as_secs_f64() / secs).min(1.0);
        self.queueing_delay = self.queueing_max;
        self.standing_delay = self.standing_min.unwrap_or(Duration::ZERO);
        self.backlog = self.backlog_max;
        self.outflow = self.outflow_max;
        self.outflow_delay = self.outflow_delay_min.take();
        self.channel_rtt = self.channel_rtt_min.take();
        self.handled_rate = self.handled_since as f64 / secs;
        if self.handled_since > 0 {
            self.decision_latency_us =
                self.busy_since.as_secs_f64() * 1e6 / self.handled_since as f64;
        }
        // The work the gate controls: what the controller spent on flows it admitted.
        let controlled = (self.busy.saturating_sub(self.shed).as_secs_f64() / secs).min(1.0);
        let cpu = controlled / self.cfg.target_utilization;
        let target_delay = self.cfg.target_delay.as_secs_f64().max(1e-6);
        // The standing queue (the window's least delay), not its worst: a burst that
        // drains within the window is not overload (CoDel's reasoning).
        let channel = (self.standing_delay.as_secs_f64() / target_delay)
            .max(self.outflow as f64 / self.cfg.target_outflow_bytes.max(1) as f64)
            .max(self.outflow_delay.as_secs_f64() / target_delay)
            .max(self.channel_rtt.as_secs_f64() / self.cfg.target_rtt.as_secs_f64().max(1e-6));
        let load = cpu.max(channel);
        if load >= 1.0 {
            // The maximum of the smoothed rate (memory `settle`), not of one window: a
            // window that drains a backlog read in one go is not a rate the controller
            // sustains.
            self.max_handled_rate = self.max_handled_rate.max(self.law.admitted_rate());
        }
        self.busy = Duration::ZERO;
        self.shed = Duration::ZERO;
        self.busy_since = Duration::ZERO;
        self.handled_since = 0;
        self.queueing_max = Duration::ZERO;
        self.standing_min = None;
        self.backlog_max = 0;
        self.outflow_max = 0;
        // When the CPU is what overloads, the PACKET_INs it handled in this window are
        // what the load scales with: the first cut starts from them (from the smoothed
        // rate, which lags a step from idle, `flowgate sim` cut a controller of 5,000/s
        // to 894/s, and it then spent 4.5 s climbing back). When the channel is (a
        // standing queue, a switch that does not read), the handled rate says nothing of
        // what the switch takes, and the cut stays deep: in `ovs_overload_packet_in_flood`
        // a cut from the handled rate left the channel full for seconds, and a quiet
        // service lost up to 17 of its 45 new connections.
        let first_base = (cpu >= channel).then_some(self.handled_rate);
        Some(self.law.control_from(now, load, first_base))
    }

    pub fn view(&self) -> ControllerGapView {
        ControllerGapView {
            gap: self.law.view(),
            utilization: self.utilization,
            queueing_delay_ms: self.queueing_delay.as_secs_f64() * 1000.0,
            standing_queue_ms: self.standing_delay.as_secs_f64() * 1000.0,
            backlog_bytes: self.backlog,
            outflow_bytes: self.outflow,
            outflow_delay_ms: self.outflow_delay.as_secs_f64() * 1000.0,
            channel_rtt_ms: self.channel_rtt.as_secs_f64() * 1000.0,
            decision_latency_us: self.decision_latency_us,
            handled_rate: self.handled_rate,
            max_handled_rate: self.max_handled_rate,
        }
    }
}

/// The controller's own overload state, for the API and `/metrics`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ControllerGapView {
    #[serde(flatten)]
    pub gap: GapView,
    /// Fraction of the last window spent handling PACKET_INs.
    pub utilization: f64,
    /// Longest PACKET_IN queueing delay in the controller over the last window.
    pub queueing_delay_ms: f64,
    /// The standing queue: the least PACKET_IN queueing delay of the window's batches
    /// (what the law compares with `target_delay_ms`).
    pub standing_queue_ms: f64,
    /// Largest backlog (bytes read from a switch, not yet handled) over the last window.
    pub backlog_bytes: u64,
    /// Largest queue of bytes for a switch (written, not yet taken) over the last window.
    pub outflow_bytes: u64,
    /// The standing delay of that queue over the last window: how long the oldest unread
    /// bytes had waited, at the least (compared with `target_delay_ms`).
    pub outflow_delay_ms: f64,
    /// The standing round trip of the control channel over the last window: the least
    /// ECHO round trip the window measured, of the slowest switch (compared with
    /// `target_rtt_ms`; 0 while the controller's overload control is off).
    pub channel_rtt_ms: f64,
    /// Mean handling time of one PACKET_IN over the last window.
    pub decision_latency_us: f64,
    /// PACKET_INs handled per second over the last window.
    pub handled_rate: f64,
    /// The highest PACKET_IN rate handled while saturated: the measured maximum.
    pub max_handled_rate: f64,
}
