//! Backend selection for VIP services: the paper's ISSLM, its comparison algorithms
//! (DWRS, MRBS, AMLOB, SRT, CRRM) and the production baselines (smooth WRR, least
//! connections, weighted random, power of two choices).
//!
//! Sources: the seed paper's ISSLM pseudo-code (Table 2, Cases A-D) and
//! `shared/research/load-balancing-anchors.md` (§1.1-1.6 for the comparison algorithms,
//! §2 for the production features). Where a source leaves a gap the doc comment of the
//! algorithm says "our reading" and states the rule we chose.
//!
//! # Contract
//!
//! * Sans-IO: no clock, no socket. Time comes in as [`SelectRequest::since_refresh`] and
//!   the `interval` of [`Balancer::on_refresh`]; randomness from a seeded [`SmallRng`]
//!   owned by the balancer, so simulations replay exactly.
//! * [`Balancer::select`] runs per new connection (PACKET_IN path). It does no heap
//!   allocation as long as the slice is no longer than the pool size given to
//!   [`Balancer::new`]/[`Balancer::resize`] (a longer slice grows the state once).
//! * No panics on any input: empty pools, all-ineligible pools, NaN/negative/infinite
//!   metrics, out-of-range `requested`, zero durations, invalid parameters.
//! * A backend is *usable* for a new connection iff `eligible && weight > 0`.
//! * Slow start ([`Balancer::set_ramp`]): a backend ramping at fraction `f` of its share
//!   takes about `f` times the connections of an equal peer under every algorithm but
//!   `none`, whatever its weight (a weight of 1 ramps as smoothly as one of 100). The
//!   caller passes the configured weight in [`BackendLoad::weight`] and the fraction
//!   through `set_ramp`, once; the balancer applies it exactly (`f64`, not a rounded
//!   weight). The weighted ones (smooth WRR, least connections, random, P2C, DWRS) use
//!   `weight·f` as the backend's weight in their own arithmetic, as HAProxy's
//!   `slowstart` and Envoy's slow start scale the weight: WRR's current values grow by
//!   `weight·f` per pick, least connections and P2C compare `(conns + 1) / (weight·f)`,
//!   random and DWRS draw with `weight·f` (DWRS: times the headroom). With `f = 1` all
//!   of them behave exactly as without a ramp. The others read weight only as "> 0", so
//!   they apply `f` in their own way: round robin takes
//!   a ramping backend in turn with probability `f`; ISSLM, SRT, MRBS and AMLOB see each
//!   cost they minimise (request load, connections, response time) divided by `f`, so a
//!   backend ends with `f` times an equal peer's load, and ISSLM counts it over at
//!   `f·S_Load` (HAProxy ramps `maxconn` with the weight); MRBS's warm-up is least
//!   connections, ramped as above. Our reading: a ramp is a capacity that grows,
//!   whatever the algorithm. Since `f ≥ 1 %` a ramping backend with a weight is always
//!   usable, and a weight of 0 still means no new connections.
//! * Load seen by every load-aware algorithm includes `picks_since_refresh` (connections
//!   this balancer assigned since the metrics were taken), so a burst of SYNs between two
//!   10 ms refreshes spreads instead of herding onto one "least loaded" backend
//!   (anchors §1.6, §5.2; Envoy #44989).
//! * Unknown values (never measured, or stale metrics) are replaced by the pool mean of
//!   the fresh values (a *neutral prior*) in the adaptive algorithms, so a backend whose
//!   metrics endpoint fails is neither starved nor flooded (our reading). ISSLM is
//!   stricter: a stale backend is never a move target (see [`AlgorithmKind::Isslm`]).
//!
//! # Effective request rate
//!
//! `rps` was measured over the last window `W` (the refresh interval, or
//! [`AlgorithmParams::rps_window`]); `picks_since_refresh` connections were added during the
//! `since_refresh` that followed. We estimate the current rate over both as
//! `(rps·W + picks) / (W + since_refresh)` (floor 1 ms on the denominator), see
//! [`effective_rps`]. This is our reading of "rps + picks/since_refresh": the plain sum
//! counts the steady-state rate twice (a backend at exactly `r` would read `2r` at the end
//! of each window), which would halve ISSLM's threshold in effect.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

mod adaptive;
mod isslm;
#[cfg(test)]
mod tests;

/// Refresh interval assumed before the first [`Balancer::on_refresh`] (the paper's 10 ms).
pub const DEFAULT_REFRESH_INTERVAL: Duration = Duration::from_millis(10);
/// Floor on the rate denominator of [`effective_rps`], in seconds.
const MIN_RATE_WINDOW_S: f64 = 1e-3;

/// The balancing algorithm of a service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AlgorithmKind {
    /// No balancing (paper Case A). A connection goes to the backend the client addressed
    /// (`requested`), else to [`AlgorithmParams::none_target`] (the one configured server
    /// of a VIP service) if usable, else to the first usable backend. Load is ignored.
    /// A `requested` backend is honoured even when ineligible: without balancing the
    /// controller just forwards what the client addressed (our reading).
    None,
    /// CRRM, conventional round robin (anchors §1.5): `idx = (idx + 1) mod N` over the
    /// usable backends, on each new connection.
    RoundRobin,
    /// nginx's smooth weighted round robin over usable backends: every pick adds each
    /// weight to its current value, takes the largest (first on ties) and subtracts the
    /// total from it. A backend that becomes unusable has its current value reset to 0.
    /// A backend in slow start adds `weight·f` (an `f64`), so it takes the fraction `f`
    /// of its turns, evenly spread.
    WeightedRoundRobin,
    /// Least connections: the smallest `(active_connections + picks_since_refresh + 1) /
    /// weight` (`weight·f` for a backend in slow start); the `+1` (as HAProxy's leastconn
    /// and Envoy's least-request) lets an idle heavier backend win. Ties rotate round
    /// robin from the cursor, never index 0 first. If the core's `active_connections`
    /// already counts its own assignments, recent picks are counted twice, which only
    /// strengthens herd resistance.
    LeastConnections,
    /// Weighted random over usable backends (probability `weight / Σweight`; `weight·f`
    /// for a backend in slow start).
    Random,
    /// Power of two choices (Envoy least-request / linkerd / nginx `random two`): two
    /// distinct usable backends drawn uniformly, the one with the lower
    /// `(active + picks + 1) / weight` wins (`weight·f` in slow start). Ties go to the
    /// first draw, which is itself uniformly random, so ties are random.
    P2c,
    /// ISSLM, the seed paper's algorithm; see the module `isslm` doc and
    /// [`Balancer::select`]. Summary of our reading:
    ///
    /// * `requested` = `SelectRequest::requested` (services without a VIP, Cases A/B), or
    ///   behind a VIP the base policy's choice (smooth weighted round robin, as
    ///   `weighted-round-robin`: with equal weights, a plain rotation).
    /// * Effective load = [`effective_rps`]. Hysteresis: a backend becomes *over* at
    ///   `load ≥ T` and stops being over only when `load < T·(1 − hysteresis)`; the latch
    ///   is kept per backend and updated on refresh and whenever select examines it.
    /// * Requested usable and not over: it takes the flow (`Requested`).
    /// * Otherwise the requested server is removed from the candidates (the usable
    ///   backends) and up to `isslm_tries` times the three searches of the pseudo-code run
    ///   in order: lowest request load, fewest active connections, fastest response time.
    ///   The data do not change between tries, so a try only means something if it looks
    ///   further: each search proposes its best candidate *not yet rejected by that search*,
    ///   and a proposal is accepted iff its metrics are fresh, valid and it is not over.
    ///   So try k examines each ranking's k-th candidate; with the paper's 5 tries at most
    ///   15 proposals are examined (bounded work), and a server whose RPS ranking leads
    ///   with stale backends is still found through the connection or RT ranking.
    /// * None accepted: `NoOptimalServer` ("The optimal server was not found"; the paper
    ///   only prints). The flow stays on the requested server if it is usable, else
    ///   `backend: None` (or `NoEligible` when nothing at all is usable).
    /// * A stale backend keeps receiving flows addressed to it, but is never a move target.
    Isslm,
    /// DWRS, dynamic weighted random selection (anchors §1.1): roulette wheel with
    /// `w_i = weight_i · f_i · max(w_min, 1 − load_i)` (`f_i`: the slow-start fraction, 1
    /// when not ramping). Our reading of `load_i`: the larger of `effective_rps /
    /// capacity_rps` and `cpu` when either is known, else relative load `effective_rps /
    /// (2 · mean rps)`; stale metrics use the pool's mean load. The
    /// optional "dynamic correction" of Wang et al. is not applied.
    Dwrs,
    /// MRBS, multiple-regression-based search (anchors §1.2): one shared linear model
    /// `RT_pred = β·[1, rps, conns, rt_prev, util]` (features normalised to [0, 1] by a
    /// slowly decaying pool maximum), trained online by SGD on each refresh with
    /// `(x(t−1), RT(t))` pairs; `β_rps, β_conns` are projected to ≥ 0 (load cannot make a
    /// server faster; our reading). Selection: argmin of `max(pred, min observed RT) ·
    /// (1 + picks)`, ties by lower effective rps, then round robin. Warm-up (our reading):
    /// until `mrbs_warmup` SGD samples have been taken, least connections decides.
    Mrbs,
    /// AMLOB, adaptive multi-objective load balancing — **project-defined** (anchors
    /// §1.3: no published definition was found). Metrics RPS (effective), connections
    /// (active + picks) and RT (× (1 + picks)) are min-max normalised across usable
    /// backends at select time; weights `a_k = CV_k / ΣCV` (coefficient of variation
    /// across the pool, computed on refresh; equal thirds when all CVs are 0);
    /// argmin `Σ a_k z_k`, ties by fewer connections, then round robin.
    Amlob,
    /// SRT, shortest response time (anchors §1.4, LBBSRT): argmin of the response time
    /// inflated by `(1 + picks_since_refresh)`, ties by fewer connections, then round
    /// robin. The response time is [`BackendLoad::response_time_ms`] as is: the source's
    /// "EWMA of measured RT" (α = 0.2), which the core already keeps per measurement (a
    /// probe's round trip or a metrics report); SRT does not smooth it a second time per
    /// refresh (our reading of "α ≈ 0.2 per 10 ms tick": one EWMA step per new sample,
    /// a sample arriving each tick in the source's setting). Starvation mitigation (§1.4, Traefik #12306),
    /// our reading: (1) never-measured backends use the pool mean RT (they get a fair share
    /// and so get measured), (2) a backend whose metrics are stale has its RT decay toward
    /// the pool mean with half-life `srt_stale_half_life`, (3) the pick inflation sends
    /// bursts to the runners-up in proportion to speed, so no backend keeps every flow.
    Srt,
}

impl AlgorithmKind {
    /// Every algorithm, in a stable order (used by the benchmarks and the lab).
    pub const ALL: &'static [AlgorithmKind] = &[
        AlgorithmKind::None,
        AlgorithmKind::RoundRobin,
        AlgorithmKind::WeightedRoundRobin,
        AlgorithmKind::LeastConnections,
        AlgorithmKind::Random,
        AlgorithmKind::P2c,
        AlgorithmKind::Isslm,
        AlgorithmKind::Dwrs,
        AlgorithmKind::Mrbs,
        AlgorithmKind::Amlob,
        AlgorithmKind::Srt,
    ];

    /// The configuration name (`"round-robin"`, `"isslm"`, ...).
    pub const fn as_str(self) -> &'static str {
        match self {
            AlgorithmKind::None => "none",
            AlgorithmKind::RoundRobin => "round-robin",
            AlgorithmKind::WeightedRoundRobin => "weighted-round-robin",
            AlgorithmKind::LeastConnections => "least-connections",
            AlgorithmKind::Random => "random",
            AlgorithmKind::P2c => "p2c",
            AlgorithmKind::Isslm => "isslm",
            AlgorithmKind::Dwrs => "dwrs",
            AlgorithmKind::Mrbs => "mrbs",
            AlgorithmKind::Amlob => "amlob",
            AlgorithmKind::Srt => "srt",
        }
    }
}

impl fmt::Display for AlgorithmKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An algorithm name that [`AlgorithmKind::from_str`] does not know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownAlgorithm(pub String);

impl fmt::Display for UnknownAlgorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown balancing algorithm {:?}; expected one of ",
            self.0
        )?;
        for (i, k) in AlgorithmKind::ALL.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            f.write_str(k.as_str())?;
        }
        Ok(())
    }
}

impl std::error::Error for UnknownAlgorithm {}

impl FromStr for AlgorithmKind {
    type Err = UnknownAlgorithm;

    /// Canonical names as printed by `Display`; ASCII case and `_`/`-` are not
    /// significant, and a few common aliases are accepted (`rr`, `wrr`, `leastconn`,
    /// `lc`, `crrm`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        let eq = |name: &str| {
            t.len() == name.len()
                && t.bytes().zip(name.bytes()).all(|(a, b)| {
                    let a = if a == b'_' {
                        b'-'
                    } else {
                        a.to_ascii_lowercase()
                    };
                    a == b
                })
        };
        for &k in AlgorithmKind::ALL {
            if eq(k.as_str()) {
                return Ok(k);
            }
        }
        let alias = [
            ("rr", AlgorithmKind::RoundRobin),
            ("crrm", AlgorithmKind::RoundRobin),
            ("roundrobin", AlgorithmKind::RoundRobin),
            ("wrr", AlgorithmKind::WeightedRoundRobin),
            ("lc", AlgorithmKind::LeastConnections),
            ("leastconn", AlgorithmKind::LeastConnections),
            ("least-conn", AlgorithmKind::LeastConnections),
        ];
        for (name, k) in alias {
            if eq(name) {
                return Ok(k);
            }
        }
        Err(UnknownAlgorithm(s.to_owned()))
    }
}

/// Tunables of the algorithms. Every field has a default; [`AlgorithmParams::validate`]
/// checks them for a given algorithm. An invalid value that slips through never panics:
/// it is clamped or ignored at run time (a missing ISSLM threshold means "never over").
#[derive(Debug, Clone, PartialEq)]
pub struct AlgorithmParams {
    /// ISSLM `S_Load`: the request-rate threshold (1/s). Required for `isslm`.
    pub threshold_rps: Option<f64>,
    /// ISSLM hysteresis as a fraction of the threshold (default 0.1): over at `≥ T`, back
    /// under only below `T·(1 − hysteresis)`.
    pub hysteresis: f64,
    /// `none`: the one configured server of a VIP service (paper Case A), by index in the
    /// pool; [`AlgorithmParams::backend_removed`] keeps it on its server.
    pub none_target: Option<usize>,
    /// ISSLM: how many times the three searches run (the paper's "For five times").
    pub isslm_tries: u32,
    /// Window the measured `rps` covers; `None` = the last refresh interval.
    pub rps_window: Option<Duration>,
    /// DWRS `w_min` (default 0.05): the smallest headroom weight, keeps every usable
    /// backend reachable.
    pub dwrs_min_weight: f64,
    /// MRBS SGD learning rate on normalised data (default 0.01).
    pub mrbs_learning_rate: f64,
    /// MRBS SGD samples before predictions are used (default 50); least connections
    /// decides until then.
    pub mrbs_warmup: u32,
    /// SRT: half-life of the decay of a stale backend's RT toward the pool mean (5 s).
    pub srt_stale_half_life: Duration,
}

impl Default for AlgorithmParams {
    fn default() -> Self {
        AlgorithmParams {
            threshold_rps: None,
            hysteresis: 0.1,
            none_target: None,
            isslm_tries: 5,
            rps_window: None,
            dwrs_min_weight: 0.05,
            mrbs_learning_rate: 0.01,
            mrbs_warmup: 50,
            srt_stale_half_life: Duration::from_secs(5),
        }
    }
}

impl AlgorithmParams {
    /// Backend `index` left the pool and later ones shifted down: the `none` target
    /// follows its server, and is forgotten with it (the first usable server then takes
    /// the service's connections, as when none is configured).
    pub fn backend_removed(&mut self, index: usize) {
        self.none_target = match self.none_target {
            Some(t) if t == index => None,
            Some(t) if t > index => Some(t - 1),
            t => t,
        };
    }

    /// Checks the parameters that `kind` uses.
    pub fn validate(&self, kind: AlgorithmKind) -> Result<(), String> {
        let frac = |name: &str, v: f64, lo_open: bool| -> Result<(), String> {
            let ok = v.is_finite() && v <= 1.0 && if lo_open { v > 0.0 } else { v >= 0.0 };
            if ok {
                Ok(())
            } else {
                let lo = if lo_open { "(0" } else { "[0" };
                Err(format!("{name} must be in {lo}, 1], got {v}"))
            }
        };
        match kind {
            AlgorithmKind::Isslm => {
                match self.threshold_rps {
                    None => {
                        return Err("isslm needs threshold_rps (the S_Load request-rate \
                                    threshold, requests per second)"
                            .into());
                    }
                    Some(t) if !(t.is_finite() && t > 0.0) => {
                        return Err(format!("threshold_rps must be a positive number, got {t}"));
                    }
                    Some(_) => {}
                }
                if !(self.hysteresis.is_finite() && (0.0..1.0).contains(&self.hysteresis)) {
                    return Err(format!(
                        "hysteresis must be in [0, 1), got {}",
                        self.hysteresis
                    ));
                }
                if self.isslm_tries == 0 {
                    return Err("isslm_tries must be at least 1".into());
                }
            }
            AlgorithmKind::Dwrs => frac("dwrs_min_weight", self.dwrs_min_weight, true)?,
            AlgorithmKind::Mrbs => frac("mrbs_learning_rate", self.mrbs_learning_rate, true)?,
            AlgorithmKind::Srt if self.srt_stale_half_life.is_zero() => {
                return Err("srt_stale_half_life must be positive".into());
            }
            _ => {}
        }
        if self.rps_window.is_some_and(|w| w.is_zero()) {
            return Err("rps_window must be positive".into());
        }
        Ok(())
    }
}

/// What the core knows about one backend, in pool order.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct BackendLoad {
    /// Healthy, not draining, not ejected.
    pub eligible: bool,
    /// The backend's weight before slow start (the balancer applies the ramp from
    /// [`Balancer::set_ramp`]: do not pass a ramped weight); 0 means no new connections.
    pub weight: u32,
    /// Connections from existing flows (FLOW_REMOVED / flow stats) plus assigned ones.
    pub active_connections: u32,
    /// Measured new-connection/request rate (1/s) at the last refresh.
    pub rps: f64,
    /// Connections assigned since that refresh (herd resistance).
    pub picks_since_refresh: u32,
    /// EWMA of probe/metric response times in ms; `None` = never measured.
    pub response_time_ms: Option<f64>,
    /// CPU utilisation 0..=1 from backend metrics, if any.
    pub cpu: Option<f64>,
    /// Operator-set or learned capacity (1/s), if any.
    pub capacity_rps: Option<f64>,
    /// False when the last metrics are older than the stale limit.
    pub metrics_fresh: bool,
}

impl BackendLoad {
    /// An eligible, idle backend with fresh (empty) metrics and the given weight.
    pub fn new(weight: u32) -> Self {
        BackendLoad {
            eligible: true,
            weight,
            metrics_fresh: true,
            ..Default::default()
        }
    }
}

/// One new connection to place.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SelectRequest {
    /// The backend the client addressed (services without a VIP, paper Cases A/B).
    pub requested: Option<usize>,
    /// Hash of the connection's 5-tuple (available to hash-based policies).
    pub flow_hash: u64,
    /// Time since the last metrics refresh, to turn picks into a rate.
    pub since_refresh: Duration,
}

/// How a selection came about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The algorithm chose freely (no `requested` backend).
    Chosen,
    /// The requested backend (or, for ISSLM behind a VIP, the base policy's choice) takes
    /// the connection.
    Requested,
    /// The connection goes elsewhere than the requested backend `from`.
    Moved {
        /// The requested backend.
        from: usize,
        /// For ISSLM, which of its searches found the target; `None` for the others.
        search: Option<Search>,
    },
    /// ISSLM found no move target ("The optimal server was not found"); `backend` is the
    /// requested server if it is usable, else `None`.
    NoOptimalServer,
    /// No usable backend: the connection cannot be placed.
    NoEligible,
}

/// ISSLM's three searches, in the order of Table 2's if / else-if chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Search {
    /// "Server search with lesser request load value".
    RequestLoad = 0,
    /// "Server search with the fewest connections active".
    Connections = 1,
    /// "Server search with slowest [sic: fastest] response time".
    ResponseTime = 2,
}

impl Search {
    pub const ALL: [Search; 3] = [
        Search::RequestLoad,
        Search::Connections,
        Search::ResponseTime,
    ];

    /// Its name in the API and the metrics.
    pub fn name(self) -> &'static str {
        match self {
            Search::RequestLoad => "request_load",
            Search::Connections => "connections",
            Search::ResponseTime => "response_time",
        }
    }
}

/// The result of [`Balancer::select`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Selection {
    /// Index into the backend slice, or `None` if the connection cannot be placed.
    pub backend: Option<usize>,
    /// Why.
    pub outcome: Outcome,
}

impl Selection {
    const NONE_ELIGIBLE: Selection = Selection {
        backend: None,
        outcome: Outcome::NoEligible,
    };
}

/// The effective request rate (1/s) of a backend: `(rps·W + picks) / (W + since)`, the
/// rate over the last measured window `W` and the part of the current one that has
/// elapsed, with a 1 ms floor on the denominator. NaN or negative `rps` counts as 0;
/// `+∞` stays `+∞` (over any threshold).
pub fn effective_rps(b: &BackendLoad, since_refresh: Duration, window: Duration) -> f64 {
    RateCtx::new(since_refresh, window).eff(b)
}

/// [`effective_rps`] with the per-selection constants hoisted out of the backend loop.
#[derive(Debug, Clone, Copy)]
struct RateCtx {
    /// `W` in seconds.
    w: f64,
    /// `1 / max(W + since, 1 ms)`.
    inv: f64,
}

impl RateCtx {
    fn new(since_refresh: Duration, window: Duration) -> Self {
        let w = window.as_secs_f64();
        let total = (w + since_refresh.as_secs_f64()).max(MIN_RATE_WINDOW_S);
        RateCtx {
            w,
            inv: 1.0 / total,
        }
    }

    #[inline]
    fn eff(&self, b: &BackendLoad) -> f64 {
        let measured = clean(b.rps) * self.w;
        let measured = if measured.is_nan() { 0.0 } else { measured };
        (measured + f64::from(b.picks_since_refresh)) * self.inv
    }
}

/// Smallest slow-start fraction honoured (HAProxy's ramp starts at 1 %).
const MIN_RAMP: f64 = 0.01;

/// Backend `i`'s slow-start fraction from `ramps` (1 beyond its end).
#[inline]
fn ramp_of(ramps: &[f64], i: usize) -> f64 {
    ramps.get(i).copied().unwrap_or(1.0)
}

/// `eligible && weight > 0`.
#[inline]
fn usable(b: &BackendLoad) -> bool {
    b.eligible && b.weight > 0
}

/// Active connections plus picks since refresh.
#[inline]
fn conns(b: &BackendLoad) -> f64 {
    f64::from(b.active_connections) + f64::from(b.picks_since_refresh)
}

/// NaN and negatives to 0; +∞ stays.
#[inline]
fn clean(x: f64) -> f64 {
    if x.is_nan() || x < 0.0 { 0.0 } else { x }
}

/// `Some(x)` for a finite, non-negative value.
#[inline]
fn valid(x: Option<f64>) -> Option<f64> {
    x.filter(|v| v.is_finite() && *v >= 0.0)
}

/// Backend `b`'s weight scaled by its slow-start fraction `f` (`weight·f`, exact; `f` in
/// `[MIN_RAMP, 1]`, so a usable backend's is > 0).
#[inline]
fn ramped_weight(b: &BackendLoad, f: f64) -> f64 {
    f64::from(b.weight) * f
}

/// `(conns + 1) / (weight·f)`, the least-connections key of a backend ramping at `f`
/// (weight > 0 by caller; `f = 1` is the plain `(conns + 1) / weight`).
#[inline]
fn lc_key(b: &BackendLoad, f: f64) -> f64 {
    (conns(b) + 1.0) / ramped_weight(b, f).max(f64::MIN_POSITIVE)
}

/// Lexicographic "a < b" on keys already free of NaN (see [`key_f`]).
#[inline]
fn lex_less<const K: usize>(a: &[f64; K], b: &[f64; K]) -> bool {
    for i in 0..K {
        if a[i] < b[i] {
            return true;
        }
        if a[i] > b[i] {
            return false;
        }
    }
    false
}

/// NaN to +∞ (worst) for minimisation keys.
#[inline]
fn key_f(x: f64) -> f64 {
    if x.is_nan() { f64::INFINITY } else { x }
}

/// The per-connection balancer of one service. See the module docs.
#[derive(Debug, Clone)]
pub struct Balancer {
    kind: AlgorithmKind,
    params: AlgorithmParams,
    n: usize,
    rng: SmallRng,
    /// Round-robin cursor; also the starting point of tie rotation in argmin algorithms.
    cursor: usize,
    /// Last refresh interval (window of `rps`).
    window: Duration,
    /// Smooth WRR current weights (`f64`: a ramping backend adds `weight·f`).
    wrr_current: Vec<f64>,
    /// ISSLM hysteresis latch: true while the backend is "over".
    over: Vec<bool>,
    /// Slow-start fraction per backend in `[MIN_RAMP, 1]` (1 = full share), from
    /// [`Balancer::set_ramp`].
    ramp: Vec<f64>,
    /// Per-backend scratch for one selection (DWRS wheel, AMLOB metrics, ISSLM
    /// rankings), sized `n` so select never allocates.
    scratch: Vec<[f64; 4]>,
    dwrs: adaptive::DwrsState,
    mrbs: adaptive::MrbsState,
    amlob: adaptive::AmlobState,
    srt: adaptive::SrtState,
}

impl Balancer {
    /// A balancer for a pool of `n_backends`, deterministic for a given `seed`.
    pub fn new(kind: AlgorithmKind, params: AlgorithmParams, n_backends: usize, seed: u64) -> Self {
        let mut b = Balancer {
            kind,
            params,
            n: 0,
            rng: SmallRng::seed_from_u64(seed),
            cursor: 0,
            window: DEFAULT_REFRESH_INTERVAL,
            wrr_current: Vec::new(),
            over: Vec::new(),
            ramp: Vec::new(),
            scratch: Vec::new(),
            dwrs: adaptive::DwrsState::default(),
            mrbs: adaptive::MrbsState::default(),
            amlob: adaptive::AmlobState::default(),
            srt: adaptive::SrtState::default(),
        };
        b.resize(n_backends);
        b
    }

    /// The algorithm.
    pub fn kind(&self) -> AlgorithmKind {
        self.kind
    }

    /// The parameters.
    pub fn params(&self) -> &AlgorithmParams {
        &self.params
    }

    /// The pool size the per-backend state is sized for.
    pub fn n_backends(&self) -> usize {
        self.n
    }

    /// The window `rps` is taken to cover: `params.rps_window`, else the last refresh
    /// interval (10 ms before the first refresh).
    pub fn rate_window(&self) -> Duration {
        self.params
            .rps_window
            .filter(|w| !w.is_zero())
            .unwrap_or(self.window)
    }

    /// ISSLM hysteresis latch of backend `i` (true while it counts as over the threshold).
    pub fn is_over(&self, i: usize) -> bool {
        self.over.get(i).copied().unwrap_or(false)
    }

    /// MRBS: SGD samples taken so far (predictions are used from `mrbs_warmup` on).
    pub fn mrbs_samples(&self) -> u64 {
        self.mrbs.samples()
    }

    /// MRBS: the model coefficients over the normalised features
    /// `[1, rps, conns, rt_prev, util]`.
    pub fn mrbs_model(&self) -> [f64; 5] {
        self.mrbs.beta()
    }

    /// AMLOB: the current CV weights of (RPS, connections, RT).
    pub fn amlob_weights(&self) -> [f64; 3] {
        self.amlob.weights()
    }

    /// SRT: the response time of backend `i` it decides on, in ms (the core's EWMA as last
    /// seen fresh, decaying toward the pool mean while stale), `None` when never measured.
    pub fn srt_rt_ms(&self, i: usize) -> Option<f64> {
        Some(self.srt.rt(i)).filter(|r| !r.is_nan())
    }

    /// Slow start: backend `i` ramps up after (re)joining and may take the fraction `f`
    /// of its full share (`None`, or `f ≥ 1`: the full share). Every algorithm but `none`
    /// applies it, the weighted ones as the weight `weight·f` (so [`BackendLoad::weight`]
    /// must be the configured weight, not one already ramped); see the module docs. A NaN
    /// fraction counts as 1, one below 1 % as 1 %. Kept until changed (positional, like
    /// the other per-backend state).
    pub fn set_ramp(&mut self, i: usize, f: Option<f64>) {
        if i >= self.n {
            self.resize(i + 1);
        }
        self.ramp[i] = match f {
            Some(f) if !f.is_nan() => f.clamp(MIN_RAMP, 1.0),
            _ => 1.0,
        };
    }

    /// Backend `i`'s slow-start fraction (1 when not ramping).
    pub fn ramp(&self, i: usize) -> f64 {
        ramp_of(&self.ramp, i)
    }

    /// The pool changed size. State of backends `0..min(old, new)` is kept (state is
    /// positional: when a backend is removed from the middle, prefer
    /// [`Balancer::remove_backend`]); new backends start with fresh state.
    pub fn resize(&mut self, n_backends: usize) {
        self.n = n_backends;
        self.wrr_current.resize(n_backends, 0.0);
        self.over.resize(n_backends, false);
        self.ramp.resize(n_backends, 1.0);
        self.scratch.resize(n_backends, [0.0; 4]);
        self.mrbs.resize(n_backends);
        self.srt.resize(n_backends);
        if n_backends == 0 {
            self.cursor = 0;
        } else {
            self.cursor %= n_backends;
        }
    }

    /// Backend `index` left the pool; later backends shift down by one, with their state.
    pub fn remove_backend(&mut self, index: usize) {
        if index >= self.n {
            return;
        }
        self.wrr_current.remove(index);
        self.over.remove(index);
        self.ramp.remove(index);
        self.scratch.remove(index);
        self.mrbs.remove(index);
        self.srt.remove(index);
        self.params.backend_removed(index);
        self.n -= 1;
        if self.cursor > index {
            self.cursor -= 1;
        }
        if self.n == 0 {
            self.cursor = 0;
        } else {
            self.cursor %= self.n;
        }
    }

    /// Picks a backend for one new connection. No heap allocation (see module docs).
    pub fn select(&mut self, req: &SelectRequest, backends: &[BackendLoad]) -> Selection {
        if backends.len() > self.n {
            // Caller forgot `resize`: grow once rather than ignore backends.
            self.resize(backends.len());
        }
        let b = backends;
        let choice = match self.kind {
            AlgorithmKind::None => return self.select_none(req, b),
            AlgorithmKind::Isslm => return self.select_isslm(req, b),
            AlgorithmKind::RoundRobin => self.next_rr(b),
            AlgorithmKind::WeightedRoundRobin => self.select_wrr(b),
            AlgorithmKind::LeastConnections => self.select_lc(b),
            AlgorithmKind::Random => self.select_random(b),
            AlgorithmKind::P2c => self.select_p2c(b),
            AlgorithmKind::Dwrs => self.select_dwrs(req, b),
            AlgorithmKind::Mrbs => self.select_mrbs(req, b),
            AlgorithmKind::Amlob => self.select_amlob(req, b),
            AlgorithmKind::Srt => self.select_srt(b),
        };
        finish(req, b.len(), choice)
    }

    /// Per metrics refresh (~10 ms): `backends` carry the new measurements (normally with
    /// `picks_since_refresh` reset), `interval` is the time since the previous refresh.
    /// Updates ISSLM latches, DWRS/AMLOB pool statistics, the MRBS model (one SGD step per
    /// backend with a fresh RT) and SRT's response times.
    pub fn on_refresh(&mut self, backends: &[BackendLoad], interval: Duration) {
        if backends.len() > self.n {
            self.resize(backends.len());
        }
        if !interval.is_zero() {
            self.window = interval;
        }
        match self.kind {
            AlgorithmKind::Isslm => self.refresh_isslm(backends),
            AlgorithmKind::Dwrs => self.refresh_dwrs(backends),
            AlgorithmKind::Mrbs => self.refresh_mrbs(backends),
            AlgorithmKind::Amlob => self.refresh_amlob(backends),
            AlgorithmKind::Srt => self.refresh_srt(backends, interval),
            _ => {}
        }
    }

    // ---- shared helpers -------------------------------------------------------------

    /// Start of the rotation for a pool of `n` (n > 0).
    #[inline]
    fn start(&self, n: usize) -> usize {
        if n == 0 { 0 } else { self.cursor % n }
    }

    /// Next usable backend in round-robin order; advances the cursor past it. A backend
    /// in slow start takes its turn with probability `f` (else the turn passes on), so it
    /// gets `f` times a full backend's share; if every usable backend passes, the first
    /// takes the turn. No random draw unless a backend ramps.
    fn next_rr(&mut self, b: &[BackendLoad]) -> Option<usize> {
        let n = b.len();
        let s = self.start(n);
        let mut first = None;
        for i in (s..n).chain(0..s) {
            if !usable(&b[i]) {
                continue;
            }
            let f = ramp_of(&self.ramp, i);
            if f >= 1.0 || self.rng.r#gen::<f64>() < f {
                first = Some(i);
                break;
            }
            first.get_or_insert(i);
        }
        let i = first?;
        self.cursor = i + 1;
        Some(i)
    }

    /// Argmin of `key` over usable backends (`None` key = skip), lexicographic on the
    /// key array; ties go to the first in rotation order from the cursor, and the cursor
    /// moves past the winner, so equal backends take turns.
    fn argmin<const K: usize>(
        &mut self,
        b: &[BackendLoad],
        mut key: impl FnMut(usize, &BackendLoad) -> Option<[f64; K]>,
    ) -> Option<usize> {
        let n = b.len();
        let s = self.start(n);
        let mut best = usize::MAX;
        let mut best_k = [f64::INFINITY; K];
        let mut visit = |i: usize, x: &BackendLoad| {
            if !usable(x) {
                return;
            }
            let Some(mut k) = key(i, x) else { return };
            for v in &mut k {
                *v = key_f(*v);
            }
            if best == usize::MAX || lex_less(&k, &best_k) {
                best = i;
                best_k = k;
            }
        };
        for (i, x) in b.iter().enumerate().skip(s) {
            visit(i, x);
        }
        for (i, x) in b.iter().enumerate().take(s) {
            visit(i, x);
        }
        if best == usize::MAX {
            return None;
        }
        self.cursor = best + 1;
        Some(best)
    }

    // ---- none, wrr, random, p2c ----------------------------------------------------

    fn select_none(&mut self, req: &SelectRequest, b: &[BackendLoad]) -> Selection {
        let n = b.len();
        if let Some(r) = req.requested.filter(|&r| r < n) {
            return Selection {
                backend: Some(r),
                outcome: Outcome::Requested,
            };
        }
        let target = self.params.none_target.filter(|&t| t < n && usable(&b[t]));
        match target.or_else(|| b.iter().position(usable)) {
            Some(i) => Selection {
                backend: Some(i),
                outcome: Outcome::Chosen,
            },
            None => Selection::NONE_ELIGIBLE,
        }
    }

    /// Smooth WRR on `weight·f`. Weights are whole numbers unless a backend ramps, and
    /// `f64` adds and compares whole numbers below 2^53 exactly, so without a ramp the
    /// sequence is nginx's, as with integers; a ramp only adds its fraction.
    fn select_wrr(&mut self, b: &[BackendLoad]) -> Option<usize> {
        let mut total = 0.0;
        let mut best: Option<usize> = None;
        for (i, x) in b.iter().enumerate() {
            if !usable(x) {
                self.wrr_current[i] = 0.0;
                continue;
            }
            let w = ramped_weight(x, ramp_of(&self.ramp, i));
            self.wrr_current[i] += w;
            total += w;
            let cur = self.wrr_current[i];
            if best.is_none_or(|bi| cur > self.wrr_current[bi]) {
                best = Some(i);
            }
        }
        let bi = best?;
        self.wrr_current[bi] -= total;
        Some(bi)
    }

    /// Least connections: argmin of `(conns + 1) / (weight·f)`.
    fn select_lc(&mut self, b: &[BackendLoad]) -> Option<usize> {
        let ramps = std::mem::take(&mut self.ramp);
        let r = self.argmin(b, |i, x| Some([lc_key(x, ramp_of(&ramps, i))]));
        self.ramp = ramps;
        r
    }

    /// Weighted random on `weight·f`. Without a usable backend ramping, the integer draw
    /// of old (the same sequence for a seed); with one, a draw over the `f64` weights.
    fn select_random(&mut self, b: &[BackendLoad]) -> Option<usize> {
        let mut total: u64 = 0;
        let mut total_f = 0.0;
        let mut ramping = false;
        for (i, x) in b.iter().enumerate() {
            if usable(x) {
                let f = ramp_of(&self.ramp, i);
                ramping |= f < 1.0;
                total += u64::from(x.weight);
                total_f += ramped_weight(x, f);
            }
        }
        if total == 0 {
            return None;
        }
        if ramping && total_f > 0.0 && total_f.is_finite() {
            let mut r = self.rng.gen_range(0.0..total_f);
            let mut last = None;
            for (i, x) in b.iter().enumerate() {
                if !usable(x) {
                    continue;
                }
                let w = ramped_weight(x, ramp_of(&self.ramp, i));
                if r < w {
                    return Some(i);
                }
                r -= w;
                last = Some(i);
            }
            return last; // rounding at the end of the wheel
        }
        let mut r = self.rng.gen_range(0..total);
        for (i, x) in b.iter().enumerate() {
            if !usable(x) {
                continue;
            }
            let w = u64::from(x.weight);
            if r < w {
                return Some(i);
            }
            r -= w;
        }
        None
    }

    /// A uniformly random usable backend other than `exclude`: a few rejection draws
    /// (O(1) when most backends are usable), then an exact count-and-walk.
    fn random_usable(&mut self, b: &[BackendLoad], exclude: Option<usize>) -> Option<usize> {
        let n = b.len();
        if n == 0 {
            return None;
        }
        for _ in 0..8 {
            let i = self.rng.gen_range(0..n);
            if usable(&b[i]) && Some(i) != exclude {
                return Some(i);
            }
        }
        let ok = |i: usize, x: &BackendLoad| usable(x) && Some(i) != exclude;
        let m = b.iter().enumerate().filter(|(i, x)| ok(*i, x)).count();
        if m == 0 {
            return None;
        }
        let k = self.rng.gen_range(0..m);
        b.iter()
            .enumerate()
            .filter(|(i, x)| ok(*i, x))
            .nth(k)
            .map(|(i, _)| i)
    }

    fn select_p2c(&mut self, b: &[BackendLoad]) -> Option<usize> {
        let a = self.random_usable(b, None)?;
        let Some(c) = self.random_usable(b, Some(a)) else {
            return Some(a);
        };
        // `a` is a uniform draw, so preferring it on ties is a random tie break.
        let key = |i: usize| lc_key(&b[i], ramp_of(&self.ramp, i));
        if key(c) < key(a) { Some(c) } else { Some(a) }
    }
}

/// Turns a free choice into a [`Selection`], relating it to `requested` if present.
fn finish(req: &SelectRequest, n: usize, choice: Option<usize>) -> Selection {
    let Some(c) = choice else {
        return Selection::NONE_ELIGIBLE;
    };
    let outcome = match req.requested.filter(|&r| r < n) {
        Some(r) if r == c => Outcome::Requested,
        Some(r) => Outcome::Moved {
            from: r,
            search: None,
        },
        None => Outcome::Chosen,
    };
    Selection {
        backend: Some(c),
        outcome,
    }
}
