//! Passive outlier detection: Envoy's detectors and ejection rules (anchors §2.1), pure
//! state with time passed in.
//!
//! A host's connections end in outcomes: answered (a success) or not (a failure). Three
//! detectors judge them, each naming itself in the ejection ([`Detector`]):
//!
//! * **Consecutive failures** (5), at each failure. Catches a host that stopped answering.
//! * **Success rate**, once an `interval` (10 s), across the pool: a host whose share of
//!   answered connections is below the pool's mean by more than 1.9 standard deviations
//!   is ejected, given at least 5 hosts with 100 outcomes each in the interval. Catches a
//!   host that answers some connections and drops others (a full accept queue), whose
//!   failures come between successes and never make a run.
//! * **Failure percentage**, on the same sweep: a host failing at least `threshold` % of
//!   its connections (85), given 5 hosts with 50 outcomes each. Off by default, as in
//!   Envoy (`enforcing_failure_percentage` 0).
//!
//! Every ejection lasts `base_ejection` × the host's ejection count, capped at
//! `max_ejection`; the count decays by one per `interval` un-ejected; at most
//! `max_ejection_percent` of the pool is ejected at once, but always at least one host.

use std::time::{Duration, Instant};

use crate::config::ConfigError;
use crate::config::reader::Obj;

/// Envoy's `consecutive_5xx`.
pub const DEFAULT_CONSECUTIVE_FAILURES: u32 = 5;
/// Envoy's `base_ejection_time`.
pub const DEFAULT_BASE_EJECTION_MS: u64 = 30_000;
/// Envoy's `max_ejection_time`.
pub const DEFAULT_MAX_EJECTION_MS: u64 = 300_000;
/// Envoy's `max_ejection_percent`.
pub const DEFAULT_MAX_EJECTION_PERCENT: u32 = 10;
/// Envoy's `interval`: the rate detectors' sweep and the ejection count's decay.
pub const DEFAULT_INTERVAL_MS: u64 = 10_000;

/// Which detector ejected a host (Envoy's ejection types).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Detector {
    /// `consecutive_failures` in a row.
    Consecutive,
    /// A success rate under the pool's mean by `stdev_factor` deviations.
    SuccessRate,
    /// A failure percentage at or over the threshold.
    FailurePercentage,
}

impl Detector {
    /// Every detector, in the order of [`Detector::as_str`]'s names in the metrics.
    pub const ALL: [Detector; 3] = [
        Detector::Consecutive,
        Detector::SuccessRate,
        Detector::FailurePercentage,
    ];

    /// `consecutive`, `success_rate`, `failure_percentage`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Detector::Consecutive => "consecutive",
            Detector::SuccessRate => "success_rate",
            Detector::FailurePercentage => "failure_percentage",
        }
    }
}

/// The success-rate detector's settings (Envoy's `success_rate_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SuccessRateConfig {
    /// Hosts with enough outcomes needed in an interval for any verdict (5).
    pub minimum_hosts: u32,
    /// Outcomes a host needs in an interval to be judged, or to count in the mean (100).
    pub request_volume: u32,
    /// Standard deviations under the mean that eject, in thousandths (1900: 1.9), as
    /// Envoy's `success_rate_stdev_factor`.
    pub stdev_factor_milli: u32,
}

impl Default for SuccessRateConfig {
    fn default() -> Self {
        SuccessRateConfig {
            minimum_hosts: 5,
            request_volume: 100,
            stdev_factor_milli: 1_900,
        }
    }
}

/// The failure-percentage detector's settings (Envoy's `failure_percentage_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailurePercentageConfig {
    /// A host failing this share of its outcomes or more is ejected, in percent (85).
    pub threshold: u32,
    /// Hosts with enough outcomes needed in an interval for any verdict (5).
    pub minimum_hosts: u32,
    /// Outcomes a host needs in an interval to be judged (50).
    pub request_volume: u32,
}

impl Default for FailurePercentageConfig {
    fn default() -> Self {
        FailurePercentageConfig {
            threshold: 85,
            minimum_hosts: 5,
            request_volume: 50,
        }
    }
}

/// Outlier-detection settings (`[service.outlier]`; Envoy's defaults, anchors §2.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutlierConfig {
    /// Failures in a row that eject a host (5); 0 turns this detector off.
    pub consecutive_failures: u32,
    /// Ejection time per ejection (30 s): the n-th ejection lasts n × this.
    pub base_ejection: Duration,
    /// Cap on one ejection (300 s).
    pub max_ejection: Duration,
    /// Most of a pool that may be ejected at once, in percent (10); at least one host is
    /// always ejectable.
    pub max_ejection_percent: u32,
    /// The rate detectors' sweep, and the time un-ejected that takes one off a host's
    /// ejection count (10 s, Envoy's `interval`).
    pub interval: Duration,
    /// The success-rate detector; `None`: off.
    pub success_rate: Option<SuccessRateConfig>,
    /// The failure-percentage detector; `None`: off (the default).
    pub failure_percentage: Option<FailurePercentageConfig>,
}

impl Default for OutlierConfig {
    fn default() -> Self {
        OutlierConfig {
            consecutive_failures: DEFAULT_CONSECUTIVE_FAILURES,
            base_ejection: Duration::from_millis(DEFAULT_BASE_EJECTION_MS),
            max_ejection: Duration::from_millis(DEFAULT_MAX_EJECTION_MS),
            max_ejection_percent: DEFAULT_MAX_EJECTION_PERCENT,
            interval: Duration::from_millis(DEFAULT_INTERVAL_MS),
            success_rate: Some(SuccessRateConfig::default()),
            failure_percentage: None,
        }
    }
}

impl OutlierConfig {
    /// Read `[service.outlier]` from `o` (the table itself).
    pub(crate) fn read(mut o: Obj<'_>, errs: &mut Vec<ConfigError>) -> OutlierConfig {
        let d = OutlierConfig::default();
        let consecutive_failures = o.count(
            "consecutive_failures",
            d.consecutive_failures,
            0,
            1_000,
            errs,
        );
        let base = o.millis_checked(
            "base_ejection_ms",
            DEFAULT_BASE_EJECTION_MS,
            1,
            86_400_000,
            errs,
        );
        let max = o.millis_checked(
            "max_ejection_ms",
            DEFAULT_MAX_EJECTION_MS,
            1,
            86_400_000,
            errs,
        );
        if let (Some(base), Some(max)) = (base, max)
            && max < base
        {
            errs.push(ConfigError::new(
                o.key_path("max_ejection_ms"),
                format!(
                    "{} is under base_ejection_ms ({}): no ejection could last its base",
                    max.as_millis(),
                    base.as_millis()
                ),
            ));
        }
        let max_ejection_percent =
            o.count("max_ejection_percent", d.max_ejection_percent, 0, 100, errs);
        let interval = o.millis("interval_ms", DEFAULT_INTERVAL_MS, 100, 3_600_000, errs);

        let sr_default = SuccessRateConfig::default();
        let sr_on = o.boolean("success_rate", errs).unwrap_or(true);
        let sr_minimum_hosts = o.count(
            "success_rate_minimum_hosts",
            sr_default.minimum_hosts,
            1,
            10_000,
            errs,
        );
        let sr_request_volume = o.count(
            "success_rate_request_volume",
            sr_default.request_volume,
            1,
            1_000_000,
            errs,
        );
        let stdev_factor_milli = o
            .float_where(
                "success_rate_stdev_factor",
                |v| (0.0..=100.0).contains(&v),
                "must be in [0, 100] (standard deviations under the pool's mean)",
                errs,
            )
            .filter(|v| (0.0..=100.0).contains(v))
            .map(|v| (v * 1000.0).round() as u32)
            .unwrap_or(sr_default.stdev_factor_milli);

        let fp_default = FailurePercentageConfig::default();
        let fp_threshold = o
            .int_in("failure_percentage_threshold", 1, 100, errs)
            .map(|v| v as u32);
        let fp_minimum_hosts = o.count(
            "failure_percentage_minimum_hosts",
            fp_default.minimum_hosts,
            1,
            10_000,
            errs,
        );
        let fp_request_volume = o.count(
            "failure_percentage_request_volume",
            fp_default.request_volume,
            1,
            1_000_000,
            errs,
        );
        o.finish(errs);
        OutlierConfig {
            consecutive_failures,
            base_ejection: base.unwrap_or(d.base_ejection),
            max_ejection: max.unwrap_or(d.max_ejection),
            max_ejection_percent,
            interval,
            success_rate: sr_on.then_some(SuccessRateConfig {
                minimum_hosts: sr_minimum_hosts,
                request_volume: sr_request_volume,
                stdev_factor_milli,
            }),
            failure_percentage: fp_threshold.map(|threshold| FailurePercentageConfig {
                threshold,
                minimum_hosts: fp_minimum_hosts,
                request_volume: fp_request_volume,
            }),
        }
    }
}

/// One host's outcomes over an interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RateWindow {
    /// Connections judged: answered or not.
    pub outcomes: u32,
    /// Of them, not answered.
    pub failures: u32,
}

impl RateWindow {
    /// Answered share in percent; `None` without outcomes.
    pub fn success_rate(&self) -> Option<f64> {
        (self.outcomes > 0).then(|| {
            100.0 * f64::from(self.outcomes - self.failures.min(self.outcomes))
                / f64::from(self.outcomes)
        })
    }
}

/// The success-rate detector's last sweep over a pool that had enough hosts to judge.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SuccessRateStats {
    /// The judged hosts' mean success rate, in percent.
    pub mean: f64,
    /// Under this, a host was ejected: `mean − stdev_factor × stdev`.
    pub threshold: f64,
    /// Hosts judged (each with `request_volume` outcomes or more).
    pub hosts: u32,
}

/// Passive outlier state of one host. Failures observed while the host is ejected are
/// ignored (it should carry no new traffic then).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outlier {
    cfg: OutlierConfig,
    consecutive: u32,
    multiplier: u32,
    ejected_until: Option<Instant>,
    ejected_by: Option<Detector>,
    /// Start of the current (or last) ejection.
    ejected_at: Option<Instant>,
    /// Start of the current decay period (end of the last ejection or last decrement).
    decay_from: Option<Instant>,
    /// Outcomes since the last sweep.
    window: RateWindow,
    /// The last complete interval's outcomes.
    last_window: RateWindow,
}

impl Outlier {
    /// A host with no failures and no ejection history.
    pub fn new(cfg: OutlierConfig) -> Self {
        Outlier {
            cfg,
            consecutive: 0,
            multiplier: 0,
            ejected_until: None,
            ejected_by: None,
            ejected_at: None,
            decay_from: None,
            window: RateWindow::default(),
            last_window: RateWindow::default(),
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

    /// Start of the current (or last) ejection: a connection decided before it has an
    /// outcome that ejection already answered for (`Controller::record_outcome`).
    pub fn ejected_at(&self) -> Option<Instant> {
        self.ejected_at
    }

    /// The detector of the current (or last) ejection.
    pub fn ejected_by(&self) -> Option<Detector> {
        self.ejected_by
    }

    /// Current consecutive-failure count.
    pub fn consecutive_failures(&self) -> u32 {
        self.consecutive
    }

    /// The outcomes of the last complete interval (as the rate detectors judged them).
    pub fn last_window(&self) -> RateWindow {
        self.last_window
    }

    /// The ejection multiplier (number of ejections, after decay) at `now`.
    pub fn multiplier(&self, now: Instant) -> u32 {
        let mut o = *self;
        o.settle(now);
        o.multiplier
    }

    /// One observed failure; ejects the host when the consecutive threshold is reached
    /// and returns the end of the ejection. No pool cap: use [`PoolOutliers`] for that.
    pub fn on_failure(&mut self, now: Instant) -> Option<Instant> {
        if self.count_failure(now) {
            Some(self.eject(now, Detector::Consecutive))
        } else {
            None
        }
    }

    /// One observed success: the consecutive count restarts.
    pub fn on_success(&mut self, now: Instant) {
        self.settle(now);
        self.consecutive = 0;
        if !self.is_ejected(now) {
            self.window.outcomes = self.window.outcomes.saturating_add(1);
        }
    }

    /// A failure that is not one in a row: the host is known to have answered a
    /// connection made after it, so the consecutive count stands (Envoy counts in the
    /// order of its requests), but the interval's rates count it.
    pub fn on_failure_out_of_order(&mut self, now: Instant) {
        self.settle(now);
        if !self.is_ejected(now) {
            self.count_in_window(false);
        }
    }

    /// Ends an ejection early (Envoy: a successful active health check un-ejects).
    pub fn uneject(&mut self, now: Instant) {
        if self.is_ejected(now) {
            self.ejected_until = Some(now);
        }
        self.settle(now);
        self.consecutive = 0;
    }

    fn count_in_window(&mut self, success: bool) {
        self.window.outcomes = self.window.outcomes.saturating_add(1);
        if !success {
            self.window.failures = self.window.failures.saturating_add(1);
        }
    }

    /// Counts a failure; true when the host has reached the consecutive threshold (and
    /// is not already ejected).
    fn count_failure(&mut self, now: Instant) -> bool {
        self.settle(now);
        if self.is_ejected(now) {
            return false;
        }
        self.count_in_window(false);
        self.consecutive = self.consecutive.saturating_add(1);
        self.cfg.consecutive_failures > 0 && self.consecutive >= self.cfg.consecutive_failures
    }

    /// Ejects for `base × multiplier` (after incrementing it), capped at `max_ejection`.
    fn eject(&mut self, now: Instant, by: Detector) -> Instant {
        self.settle(now);
        self.multiplier = self.multiplier.saturating_add(1);
        let d = self
            .cfg
            .base_ejection
            .saturating_mul(self.multiplier)
            .min(self.cfg.max_ejection);
        let until = now.checked_add(d).unwrap_or(now);
        self.ejected_until = Some(until);
        self.ejected_by = Some(by);
        self.ejected_at = Some(now);
        self.consecutive = 0;
        self.decay_from = None;
        until
    }

    /// Closes the interval: its outcomes become the last window's.
    fn close_window(&mut self) -> RateWindow {
        self.last_window = std::mem::take(&mut self.window);
        self.last_window
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
        let step = self.cfg.interval.as_nanos().max(1);
        let steps = now.saturating_duration_since(from).as_nanos() / step;
        if steps == 0 {
            return;
        }
        let dec = u32::try_from(steps)
            .unwrap_or(u32::MAX)
            .min(self.multiplier);
        self.multiplier -= dec;
        self.decay_from = from
            .checked_add(self.cfg.interval.saturating_mul(dec))
            .or(Some(now));
    }
}

/// Outlier detection across one pool, enforcing `max_ejection_percent` the Envoy way: a
/// host reaching a detector's verdict is ejected only if no host is ejected yet or the
/// ejected share is below the limit (`ejected × 100 < percent × pool`). A host refused for
/// that reason keeps its consecutive count and is retried on its next failure.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolOutliers {
    cfg: OutlierConfig,
    hosts: Vec<Outlier>,
    /// When the current interval began (the first sweep call starts the first).
    window_from: Option<Instant>,
    /// The success-rate detector's last sweep, if it had hosts enough to judge.
    success_rate: Option<SuccessRateStats>,
}

impl PoolOutliers {
    /// A pool of `n` hosts.
    pub fn new(cfg: OutlierConfig, n: usize) -> Self {
        PoolOutliers {
            cfg,
            hosts: vec![Outlier::new(cfg); n],
            window_from: None,
            success_rate: None,
        }
    }

    /// The settings.
    pub fn config(&self) -> &OutlierConfig {
        &self.cfg
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

    /// Goes on with `prev`'s interval and its last success-rate sweep (a reload).
    pub fn keep_sweep(&mut self, prev: &PoolOutliers) {
        self.window_from = prev.window_from;
        self.success_rate = prev.success_rate;
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
            Some(h.eject(now, Detector::Consecutive))
        } else {
            None
        }
    }

    /// One failure of host `i` that is not one in a row
    /// ([`Outlier::on_failure_out_of_order`]): counted in the interval's rates only.
    pub fn on_failure_out_of_order(&mut self, i: usize, now: Instant) {
        if let Some(h) = self.hosts.get_mut(i) {
            h.on_failure_out_of_order(now);
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

    /// The success-rate detector's last sweep, if it had hosts enough to judge.
    pub fn success_rate_stats(&self) -> Option<SuccessRateStats> {
        self.success_rate
    }

    /// Runs the rate detectors if an interval has passed since the last sweep (the
    /// first call starts the first interval), and returns the hosts they ejected, with
    /// the end of each ejection. Call it at least once an interval.
    pub fn sweep(&mut self, now: Instant) -> Vec<(usize, Instant, Detector)> {
        let Some(from) = self.window_from else {
            self.window_from = Some(now);
            return Vec::new();
        };
        if now.saturating_duration_since(from) < self.cfg.interval {
            return Vec::new();
        }
        self.window_from = Some(now);
        // The hosts in service through the interval are judged: an ejected one took no
        // new connections (Envoy skips them too).
        let windows: Vec<Option<RateWindow>> = self
            .hosts
            .iter_mut()
            .map(|h| {
                h.settle(now);
                let w = h.close_window();
                (!h.is_ejected(now)).then_some(w)
            })
            .collect();
        // The hosts a detector judges: those with its volume of outcomes in the interval.
        let with_volume = |volume: u32| {
            windows
                .iter()
                .enumerate()
                .filter_map(move |(i, w)| w.filter(|w| w.outcomes >= volume.max(1)).map(|w| (i, w)))
        };
        let mut ejected = Vec::new();
        // Judged afresh each sweep: no last judgement stands for a pool too small to judge,
        // or for a detector turned off since.
        self.success_rate = None;
        if let Some(sr) = self.cfg.success_rate {
            let judged: Vec<(usize, f64)> = with_volume(sr.request_volume)
                .filter_map(|(i, w)| Some((i, w.success_rate()?)))
                .collect();
            if judged.len() >= sr.minimum_hosts.max(1) as usize {
                let n = judged.len() as f64;
                let mean = judged.iter().map(|(_, r)| r).sum::<f64>() / n;
                let variance = judged.iter().map(|(_, r)| (r - mean).powi(2)).sum::<f64>() / n;
                let threshold = mean - f64::from(sr.stdev_factor_milli) / 1000.0 * variance.sqrt();
                self.success_rate = Some(SuccessRateStats {
                    mean,
                    threshold,
                    hosts: judged.len() as u32,
                });
                for (i, rate) in judged {
                    if rate < threshold {
                        self.eject_swept(i, now, Detector::SuccessRate, &mut ejected);
                    }
                }
            }
        }
        if let Some(fp) = self.cfg.failure_percentage {
            // Not those the success rate just ejected (Envoy's second pass skips them too).
            let judged: Vec<(usize, RateWindow)> = with_volume(fp.request_volume)
                .filter(|&(i, _)| !self.is_ejected(i, now))
                .collect();
            if judged.len() >= fp.minimum_hosts.max(1) as usize {
                for (i, w) in judged {
                    let failing = u64::from(w.failures) * 100
                        >= u64::from(fp.threshold) * u64::from(w.outcomes);
                    if failing {
                        self.eject_swept(i, now, Detector::FailurePercentage, &mut ejected);
                    }
                }
            }
        }
        ejected
    }

    fn eject_swept(
        &mut self,
        i: usize,
        now: Instant,
        by: Detector,
        out: &mut Vec<(usize, Instant, Detector)>,
    ) {
        if !self.may_eject(now) {
            return;
        }
        if let Some(h) = self.hosts.get_mut(i)
            && !h.is_ejected(now)
        {
            out.push((i, h.eject(now, by), by));
        }
    }
}
