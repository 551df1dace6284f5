//! `[service.overload]` and `[controller.overload]`: read strictly, every key documented,
//! every problem reported with its path.

use std::time::Duration;

use super::{AIN_ACG_GAPS_MS, LawParams, Mode};
use crate::config::reader::Obj;
use crate::config::{ConfigError, choice};

/// Control interval: ACCM adapts at every measurement; 50 ms sits in the 10–100 ms range
/// and holds a few new flows per interval at the rates an HTTP pool serves.
pub const DEFAULT_INTERVAL_MS: u64 = 50;
/// Above this load (ρ, 1.0 = at target) the gap tightens: only beyond the target itself.
pub const DEFAULT_HIGH_WATERMARK: f64 = 1.0;
/// Below this load the gap relaxes; in between it holds (no sawtooth at steady load).
pub const DEFAULT_LOW_WATERMARK: f64 = 0.9;
/// A decrease cuts the rate by at most half in one step (fast, but bounded).
pub const DEFAULT_DECREASE_FACTOR: f64 = 0.5;
/// An increase adds 2% of the reference rate per interval: 0.4×capacity per second at
/// 50 ms, from half capacity back to target in about a second.
pub const DEFAULT_INCREASE_FRACTION: f64 = 0.02;
/// Never gap below one new flow per second from the meter's point of view.
pub const DEFAULT_MIN_RATE: f64 = 1.0;
/// Rate measurements remember about half a second, and decreases are that far apart.
pub const DEFAULT_SETTLE_MS: u64 = 500;
/// The switch meter lets 4× the admitted rate up to the controller: at up to 4× overload
/// every refusal is a RST from the controller; beyond it the switch drops silently.
pub const DEFAULT_BACKSTOP_FACTOR: f64 = 4.0;
/// Meter bursts of 100 ms' worth of packets. The precise gap is the controller's gate;
/// the meter is a backstop, and a burst much smaller than a client's scheduling jitter
/// drops SYNs silently (the client then retries only after its 1 s SYN timeout).
pub const DEFAULT_BURST_MS: u32 = 100;
/// The controller-side gate holds two tokens: periodic arrivals get the full admitted
/// rate, bursts at most two admissions back to back.
pub const DEFAULT_GATE_BURST: f64 = 2.0;
/// Meter rates change at most every 200 ms (each OFPMC_MODIFY refills the bucket).
pub const DEFAULT_METER_HOLD_MS: u64 = 200;
/// OFF periods of 2 s or longer are switch rules (hard_timeout has 1 s granularity).
pub const DEFAULT_OFF_RULE_MIN_GAP_MS: u64 = 2_000;
/// The controller's targets: 90% busy, 5 ms queueing (CoDel's target).
pub const DEFAULT_TARGET_UTILIZATION: f64 = 0.9;
pub const DEFAULT_TARGET_DELAY_MS: u64 = 5;
/// Bytes queued for one switch beyond which the control channel counts as overloaded:
/// about a thousand connections' answers, as much again as the socket's own buffer holds.
/// Every answer waits behind them, a quiet service's too: with 1 MiB, Open vSwitch under a
/// SYN flood read them so late that `ovs_overload_packet_in_flood` failed 12 of 16 runs
/// (up to 13 of a quiet service's 45 new connections timed out); with 256 KiB it passed 9
/// of 9 (`docs/benchmarks.md`, stop 16).
pub const DEFAULT_TARGET_OUTFLOW_BYTES: u64 = 256 << 10;
/// The control channel's round trip beyond which it counts as overloaded: what a new
/// flow's setup waits for, the switch's queues included. In `ovs_overload_packet_in_flood`
/// its standing value was 0.1–13 ms between bursts, and 150–500 ms in the flood's first
/// seconds, while the outflow stayed within its target (33 KB) and a quiet service's SYNs
/// waited up to 290 ms for their answers (p95 of its connections 1.4 s in CI). The quiet
/// service's p95 there, three runs each: 144–242 ms at a 50 ms target, 71–144 ms at 20,
/// 110–172 ms at 10 (`docs/benchmarks.md`, stop 35).
pub const DEFAULT_TARGET_RTT_MS: u64 = 20;
/// The controller's control interval (its PACKET_IN rate is measured in bulk).
pub const DEFAULT_CONTROLLER_INTERVAL_MS: u64 = 100;
/// The controller never meters itself below 100 PACKET_INs per second (OVS's own floor
/// for controller_rate_limit).
pub const DEFAULT_CONTROLLER_MIN_RATE: f64 = 100.0;

/// How the controller refuses a gapped new connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Refusal {
    /// A TCP RST from the controller: the client learns at once.
    Reset,
    /// Drop the SYN: the client retries after its SYN timeout (1 s, then 3 s ...).
    Drop,
}

/// `[service.overload]`.
#[derive(Debug, Clone, PartialEq)]
pub struct OverloadConfig {
    pub mode: Mode,
    pub interval: Duration,
    /// The pool's capacity in new connections (requests) per second.
    pub capacity_rps: Option<f64>,
    /// Target for the live connections of the pool (as counted from the switch's rules).
    pub max_active_connections: Option<u32>,
    /// Target for the backends' mean response time (probes or metrics).
    pub target_response_ms: Option<f64>,
    pub high_watermark: f64,
    pub low_watermark: f64,
    pub decrease_factor: f64,
    pub increase_fraction: f64,
    pub min_rate: f64,
    pub settle: Duration,
    pub backstop_factor: f64,
    pub burst_ms: u32,
    pub meter_hold: Duration,
    pub off_rule_min_gap: Duration,
    pub refusal: Refusal,
    pub gaps_ms: Vec<u32>,
    /// Depth of the controller-side gate's token bucket (1 = Crawford's deterministic gap).
    pub gate_burst: f64,
    /// `adaptive` with `capacity_rps`: whether the gate also holds the admitted rate under
    /// the ceiling, `capacity_rps × (low+high)/2`, while no gap is in force (`ceiling =
    /// true`, the default). `false` leaves the law alone: no limit until the measured load
    /// crosses the high watermark (the ablation of the ceiling).
    pub ceiling: bool,
}

impl Default for OverloadConfig {
    fn default() -> Self {
        OverloadConfig {
            mode: Mode::Off,
            interval: Duration::from_millis(DEFAULT_INTERVAL_MS),
            capacity_rps: None,
            max_active_connections: None,
            target_response_ms: None,
            high_watermark: DEFAULT_HIGH_WATERMARK,
            low_watermark: DEFAULT_LOW_WATERMARK,
            decrease_factor: DEFAULT_DECREASE_FACTOR,
            increase_fraction: DEFAULT_INCREASE_FRACTION,
            min_rate: DEFAULT_MIN_RATE,
            settle: Duration::from_millis(DEFAULT_SETTLE_MS),
            backstop_factor: DEFAULT_BACKSTOP_FACTOR,
            burst_ms: DEFAULT_BURST_MS,
            meter_hold: Duration::from_millis(DEFAULT_METER_HOLD_MS),
            off_rule_min_gap: Duration::from_millis(DEFAULT_OFF_RULE_MIN_GAP_MS),
            refusal: Refusal::Reset,
            gaps_ms: AIN_ACG_GAPS_MS.to_vec(),
            gate_burst: DEFAULT_GATE_BURST,
            ceiling: true,
        }
    }
}

impl OverloadConfig {
    pub fn law(&self) -> LawParams {
        LawParams {
            mode: self.mode,
            interval: self.interval,
            high_watermark: self.high_watermark,
            low_watermark: self.low_watermark,
            decrease_factor: self.decrease_factor,
            increase_fraction: self.increase_fraction,
            min_rate: self.min_rate,
            settle: self.settle,
            reference_rate: self.capacity_rps,
            gaps_ms: self.gaps_ms.clone(),
            ceiling: match self.mode {
                Mode::Adaptive if self.ceiling => self
                    .capacity_rps
                    .map(|c| c * 0.5 * (self.low_watermark + self.high_watermark)),
                _ => None,
            },
        }
    }

    /// Read `[service.overload]` from `o` (the table itself).
    pub(crate) fn read(mut o: Obj<'_>, errs: &mut Vec<ConfigError>) -> OverloadConfig {
        let before = errs.len();
        let mode = choice(
            &mut o,
            "mode",
            ("off", Mode::Off),
            &[("static", Mode::Static), ("adaptive", Mode::Adaptive)],
            errs,
        );
        let mode_ok = errs.len() == before;
        let mut c = OverloadConfig {
            mode,
            ..OverloadConfig::default()
        };
        c.interval = o.millis("interval_ms", DEFAULT_INTERVAL_MS, 10, 100, errs);
        c.capacity_rps = positive(&mut o, "capacity_rps", errs);
        c.max_active_connections = o
            .int_in("max_active_connections", 1, 10_000_000, errs)
            .map(|v| v as u32);
        c.target_response_ms = positive(&mut o, "target_response_ms", errs);
        read_watermarks(
            &mut o,
            &mut c.high_watermark,
            &mut c.low_watermark,
            &mut c.decrease_factor,
            &mut c.increase_fraction,
            errs,
        );
        if let Some(v) = positive(&mut o, "min_rate", errs) {
            c.min_rate = v;
        }
        c.settle = o.millis("settle_ms", DEFAULT_SETTLE_MS, 10, 60_000, errs);
        if let Some(v) = o.float_where(
            "backstop_factor",
            |v| (1.0..=1000.0).contains(&v),
            "must be in [1, 1000]",
            errs,
        ) {
            c.backstop_factor = v;
        }
        c.burst_ms = burst_ms(&mut o, errs);
        if let Some(v) = o.float_where(
            "gate_burst",
            |v| (1.0..=1000.0).contains(&v),
            "must be in [1, 1000]",
            errs,
        ) {
            c.gate_burst = v;
        }
        c.meter_hold = o.millis("meter_hold_ms", DEFAULT_METER_HOLD_MS, 0, 60_000, errs);
        c.off_rule_min_gap = o.millis(
            "off_rule_min_gap_ms",
            DEFAULT_OFF_RULE_MIN_GAP_MS,
            1_000,
            3_600_000,
            errs,
        );
        c.refusal = choice(
            &mut o,
            "refusal",
            ("reset", Refusal::Reset),
            &[("drop", Refusal::Drop)],
            errs,
        );
        if let Some(s) = o.string("gaps_ms", errs) {
            let mut v = Vec::new();
            for part in s.split(',') {
                match part.trim().parse::<u32>() {
                    Ok(n) if n <= 3_600_000 => v.push(n),
                    _ => {
                        errs.push(ConfigError::new(
                            o.key_path("gaps_ms"),
                            format!("{part:?} is not a gap in ms (0..=3600000)"),
                        ));
                        break;
                    }
                }
            }
            if v.windows(2).any(|w| w[0] >= w[1]) || v.first() != Some(&0) {
                errs.push(ConfigError::new(
                    o.key_path("gaps_ms"),
                    "must start with 0 (no gap) and increase strictly",
                ));
            }
            c.gaps_ms = v;
        }
        c.ceiling = read_ceiling(&mut o, mode_ok.then_some(c.mode), errs);
        if c.mode != Mode::Off
            && c.capacity_rps.is_none()
            && c.max_active_connections.is_none()
            && c.target_response_ms.is_none()
        {
            errs.push(ConfigError::new(
                o.key_path("mode"),
                "a gap needs a target: set capacity_rps, max_active_connections or target_response_ms",
            ));
        }
        o.finish(errs);
        c
    }
}

/// `[controller.overload]`.
#[derive(Debug, Clone, PartialEq)]
pub struct ControllerOverloadConfig {
    /// `off` or `adaptive` (a static table makes no sense for the controller's own rate).
    pub mode: Mode,
    pub interval: Duration,
    pub target_utilization: f64,
    pub target_delay: Duration,
    /// Target for the bytes queued for a switch (the control channel's backlog).
    pub target_outflow_bytes: u64,
    /// Target for the control channel's standing round trip (ECHO).
    pub target_rtt: Duration,
    pub high_watermark: f64,
    pub low_watermark: f64,
    pub decrease_factor: f64,
    pub increase_fraction: f64,
    pub min_rate: f64,
    pub settle: Duration,
    pub burst_ms: u32,
}

impl Default for ControllerOverloadConfig {
    fn default() -> Self {
        ControllerOverloadConfig {
            mode: Mode::Off,
            interval: Duration::from_millis(DEFAULT_CONTROLLER_INTERVAL_MS),
            target_utilization: DEFAULT_TARGET_UTILIZATION,
            target_delay: Duration::from_millis(DEFAULT_TARGET_DELAY_MS),
            target_outflow_bytes: DEFAULT_TARGET_OUTFLOW_BYTES,
            target_rtt: Duration::from_millis(DEFAULT_TARGET_RTT_MS),
            high_watermark: DEFAULT_HIGH_WATERMARK,
            low_watermark: DEFAULT_LOW_WATERMARK,
            decrease_factor: DEFAULT_DECREASE_FACTOR,
            increase_fraction: DEFAULT_INCREASE_FRACTION,
            min_rate: DEFAULT_CONTROLLER_MIN_RATE,
            settle: Duration::from_millis(DEFAULT_SETTLE_MS),
            burst_ms: DEFAULT_BURST_MS,
        }
    }
}

impl ControllerOverloadConfig {
    pub fn law(&self) -> LawParams {
        LawParams {
            mode: self.mode,
            interval: self.interval,
            high_watermark: self.high_watermark,
            low_watermark: self.low_watermark,
            decrease_factor: self.decrease_factor,
            increase_fraction: self.increase_fraction,
            min_rate: self.min_rate,
            settle: self.settle,
            reference_rate: None,
            gaps_ms: vec![0],
            ceiling: None,
        }
    }

    pub(crate) fn read(mut o: Obj<'_>, errs: &mut Vec<ConfigError>) -> ControllerOverloadConfig {
        let mode = choice(
            &mut o,
            "mode",
            ("off", Mode::Off),
            &[("adaptive", Mode::Adaptive)],
            errs,
        );
        let mut c = ControllerOverloadConfig {
            mode,
            ..ControllerOverloadConfig::default()
        };
        c.interval = o.millis(
            "interval_ms",
            DEFAULT_CONTROLLER_INTERVAL_MS,
            10,
            1_000,
            errs,
        );
        if let Some(v) = o.float_where(
            "target_utilization",
            |v| v > 0.0 && v <= 1.0,
            "must be in (0, 1]",
            errs,
        ) {
            c.target_utilization = v;
        }
        c.target_delay = o.millis("target_delay_ms", DEFAULT_TARGET_DELAY_MS, 1, 10_000, errs);
        if let Some(v) = o.int_in("target_outflow_bytes", 1024, 1 << 32, errs) {
            c.target_outflow_bytes = v as u64;
        }
        c.target_rtt = o.millis("target_rtt_ms", DEFAULT_TARGET_RTT_MS, 1, 10_000, errs);
        read_watermarks(
            &mut o,
            &mut c.high_watermark,
            &mut c.low_watermark,
            &mut c.decrease_factor,
            &mut c.increase_fraction,
            errs,
        );
        if let Some(v) = positive(&mut o, "min_rate", errs) {
            c.min_rate = v;
        }
        c.settle = o.millis("settle_ms", DEFAULT_SETTLE_MS, 10, 60_000, errs);
        c.burst_ms = burst_ms(&mut o, errs);
        o.finish(errs);
        c
    }
}

/// `ceiling = true | false` (a TOML boolean; default `true`). It means something only in
/// `adaptive` mode with `capacity_rps` set, the only place a ceiling exists: given
/// anywhere else it is refused, against its own path, rather than silently ignored.
/// `mode`: the mode read, `None` when `mode` itself was invalid (then only the key's own
/// value is checked).
fn read_ceiling(o: &mut Obj<'_>, mode: Option<Mode>, errs: &mut Vec<ConfigError>) -> bool {
    // Absent, or not a boolean (a string, `"off"` say: that error alone).
    let Some(on) = o.boolean("ceiling", errs) else {
        return true;
    };
    match mode {
        Some(Mode::Adaptive) if !o.has("capacity_rps") => errs.push(ConfigError::new(
            o.key_path("ceiling"),
            "the ceiling is capacity_rps × (low_watermark + high_watermark) / 2: without capacity_rps there is none",
        )),
        Some(m) if m != Mode::Adaptive => errs.push(ConfigError::new(
            o.key_path("ceiling"),
            format!("only mode = \"adaptive\" has a ceiling (mode is \"{m}\")"),
        )),
        _ => {}
    }
    on
}

/// The switch meter's burst, `burst_ms`, in both gates.
fn burst_ms(o: &mut Obj<'_>, errs: &mut Vec<ConfigError>) -> u32 {
    o.count("burst_ms", DEFAULT_BURST_MS, 1, 10_000, errs)
}

fn positive(o: &mut Obj<'_>, key: &str, errs: &mut Vec<ConfigError>) -> Option<f64> {
    let v = o.float(key, errs)?;
    if v <= 0.0 {
        errs.push(ConfigError::new(o.key_path(key), "must be positive"));
        return None;
    }
    Some(v)
}

fn read_watermarks(
    o: &mut Obj<'_>,
    high: &mut f64,
    low: &mut f64,
    decrease: &mut f64,
    increase: &mut f64,
    errs: &mut Vec<ConfigError>,
) {
    if let Some(v) = o.float("high_watermark", errs) {
        *high = v;
    }
    if let Some(v) = o.float("low_watermark", errs) {
        *low = v;
    }
    if !(*low > 0.0 && *low < *high && *high <= 10.0) {
        errs.push(ConfigError::new(
            o.key_path("low_watermark"),
            format!("need 0 < low_watermark ({low}) < high_watermark ({high}) <= 10"),
        ));
    }
    if let Some(v) = o.float_where(
        "decrease_factor",
        |v| v > 0.0 && v < 1.0,
        "must be in (0, 1)",
        errs,
    ) {
        *decrease = v;
    }
    if let Some(v) = o.float_where(
        "increase_fraction",
        |v| v > 0.0 && v <= 1.0,
        "must be in (0, 1]",
        errs,
    ) {
        *increase = v;
    }
}
