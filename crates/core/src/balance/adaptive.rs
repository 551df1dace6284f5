//! The adaptive comparison algorithms of the paper's Case D: DWRS (anchors §1.1), MRBS
//! (§1.2), AMLOB (§1.3, project-defined) and SRT (§1.4). The rules and our readings are
//! documented on [`AlgorithmKind`](super::AlgorithmKind).
//!
//! Shared conventions (our reading):
//! * Pool statistics (means, scales, CV weights) are computed on refresh over the usable
//!   backends with fresh metrics.
//! * A value that is unknown for a backend (never measured, or its metrics are stale) is
//!   replaced by the pool mean of the known ones: neither starved nor preferred.
//! * The "expected response time" of a backend for one more connection is
//!   `RT · (1 + picks_since_refresh)`: each connection assigned since the measurement is
//!   assumed to add one RT of queueing (Peak-EWMA's `rtt · (pending + 1)`, restricted to
//!   what the last measurement cannot have seen). This is what keeps the RT argmins from
//!   herding between two refreshes.

use std::time::Duration;

use rand::Rng;

use super::{
    BackendLoad, Balancer, RateCtx, SelectRequest, clean, conns, effective_rps, ramp_of,
    ramped_weight, usable, valid,
};

/// Smallest RT (ms) used in the `RT · (1 + picks)` product, so a zero RT still grows.
const MIN_RT_MS: f64 = 1e-3;

/// Mean and population standard deviation accumulator.
#[derive(Default, Clone, Copy)]
struct Stat {
    n: f64,
    sum: f64,
    sum2: f64,
}

impl Stat {
    fn push(&mut self, x: f64) {
        if x.is_finite() {
            self.n += 1.0;
            self.sum += x;
            self.sum2 += x * x;
        }
    }
    fn mean(&self) -> Option<f64> {
        (self.n > 0.0).then(|| self.sum / self.n)
    }
    /// Coefficient of variation, 0 when undefined.
    fn cv(&self) -> f64 {
        let Some(m) = self.mean() else { return 0.0 };
        if m <= 0.0 {
            return 0.0;
        }
        let var = (self.sum2 / self.n - m * m).max(0.0);
        let cv = var.sqrt() / m;
        if cv.is_finite() { cv } else { 0.0 }
    }
}

// ---- DWRS ---------------------------------------------------------------------------

#[derive(Debug, Clone, Default)]
pub(super) struct DwrsState {
    /// Mean measured RPS of the usable fresh backends (relative-load normaliser).
    mean_rps: f64,
    /// Mean load of the usable fresh backends (prior for stale ones).
    mean_load: f64,
}

/// DWRS load of a backend with fresh metrics: the larger of `eff / capacity` and `cpu`
/// when either is known, else `eff / (2 · mean_rps)`. `None` when metrics are stale.
fn dwrs_load(x: &BackendLoad, eff: f64, mean_rps: f64) -> Option<f64> {
    if !x.metrics_fresh {
        return None;
    }
    let cap = valid(x.capacity_rps).filter(|c| *c > 0.0).map(|c| eff / c);
    let cpu = valid(x.cpu);
    Some(match (cap, cpu) {
        (Some(a), Some(c)) => a.max(c),
        (Some(a), None) => a,
        (None, Some(c)) => c,
        (None, None) if mean_rps > 0.0 => eff / (2.0 * mean_rps),
        (None, None) => 0.0,
    })
}

impl Balancer {
    pub(super) fn refresh_dwrs(&mut self, b: &[BackendLoad]) {
        let w = self.rate_window();
        let mut rps = Stat::default();
        for x in b.iter().filter(|x| usable(x) && x.metrics_fresh) {
            rps.push(clean(x.rps));
        }
        let mean_rps = rps.mean().unwrap_or(0.0);
        let mut load = Stat::default();
        for x in b.iter().filter(|x| usable(x)) {
            if let Some(l) = dwrs_load(x, effective_rps(x, Duration::ZERO, w), mean_rps) {
                load.push(l);
            }
        }
        self.dwrs = DwrsState {
            mean_rps,
            mean_load: load.mean().unwrap_or(0.0),
        };
    }

    pub(super) fn select_dwrs(&mut self, req: &SelectRequest, b: &[BackendLoad]) -> Option<usize> {
        let w_min = self.params.dwrs_min_weight;
        let w_min = if w_min.is_finite() && w_min > 0.0 {
            w_min.min(1.0)
        } else {
            0.05
        };
        let rc = RateCtx::new(req.since_refresh, self.rate_window());
        let DwrsState {
            mean_rps,
            mean_load,
        } = self.dwrs;
        let mut sum = 0.0;
        for (i, x) in b.iter().enumerate() {
            let mut w = 0.0;
            if usable(x) {
                let eff = rc.eff(x);
                let load = dwrs_load(x, eff, mean_rps).unwrap_or(mean_load);
                let head = 1.0 - load;
                let head = if head.is_nan() {
                    w_min
                } else {
                    head.max(w_min)
                };
                w = ramped_weight(x, ramp_of(&self.ramp, i)) * head;
            }
            self.scratch[i][0] = w;
            sum += w;
        }
        if !(sum > 0.0 && sum.is_finite()) {
            return None;
        }
        let r = self.rng.gen_range(0.0..sum);
        let mut acc = 0.0;
        let mut last = None;
        for (i, sc) in self.scratch[..b.len()].iter().enumerate() {
            let w = sc[0];
            if w > 0.0 {
                acc += w;
                last = Some(i);
                if r < acc {
                    return Some(i);
                }
            }
        }
        last // rounding at the end of the wheel
    }
}

// ---- MRBS ---------------------------------------------------------------------------

/// Number of model features: `[1, rps, conns, rt_prev, util]`.
const F: usize = 5;
/// Per-refresh decay of the normalising maxima.
const SCALE_DECAY: f64 = 0.999;

#[derive(Debug, Clone)]
pub(super) struct MrbsState {
    beta: [f64; F],
    samples: u64,
    /// Normalising maxima of rps, conns, rt (ms).
    scale: [f64; 3],
    /// Features taken at the previous refresh, per backend.
    prev: Vec<Option<[f64; F]>>,
    /// Predicted normalised RT per backend from the last refresh (NaN = unknown).
    pred: Vec<f64>,
    /// Mean prediction over the known ones (prior), NaN if none.
    mean_pred: f64,
    /// Smallest observed normalised RT (predictions are floored at it).
    floor: f64,
}

impl Default for MrbsState {
    fn default() -> Self {
        MrbsState {
            beta: [0.0; F],
            samples: 0,
            scale: [0.0; 3],
            prev: Vec::new(),
            pred: Vec::new(),
            mean_pred: f64::NAN,
            floor: 1e-6,
        }
    }
}

impl MrbsState {
    /// The model coefficients `β` over `[1, rps, conns, rt_prev, util]` (normalised).
    pub(super) fn beta(&self) -> [f64; F] {
        self.beta
    }
    pub(super) fn resize(&mut self, n: usize) {
        self.prev.resize(n, None);
        self.pred.resize(n, f64::NAN);
    }
    pub(super) fn remove(&mut self, i: usize) {
        if i < self.prev.len() {
            self.prev.remove(i);
        }
        if i < self.pred.len() {
            self.pred.remove(i);
        }
    }
    /// SGD samples taken so far.
    pub(super) fn samples(&self) -> u64 {
        self.samples
    }
    fn features(&self, x: &BackendLoad, mean_rt_n: f64) -> [f64; F] {
        let n = |v: f64, s: f64| {
            if s > 0.0 {
                (v / s).clamp(0.0, 4.0)
            } else {
                0.0
            }
        };
        let rps = clean(x.rps);
        let rps = if rps.is_finite() {
            rps
        } else {
            self.scale[0] * 4.0
        };
        let rt = valid(x.response_time_ms).map_or(mean_rt_n, |r| n(r, self.scale[2]));
        let util = valid(x.cpu)
            .map(|c| c.min(1.0))
            .or_else(|| {
                valid(x.capacity_rps)
                    .filter(|c| *c > 0.0)
                    .map(|c| (rps / c).min(4.0))
            })
            .unwrap_or(0.0);
        [
            1.0,
            n(rps, self.scale[0]),
            n(conns(x), self.scale[1]),
            rt,
            util,
        ]
    }
    fn predict(&self, f: &[f64; F]) -> f64 {
        self.beta.iter().zip(f).map(|(b, x)| b * x).sum()
    }
}

impl Balancer {
    pub(super) fn refresh_mrbs(&mut self, b: &[BackendLoad]) {
        let lr = self.params.mrbs_learning_rate;
        let lr = if lr.is_finite() && lr > 0.0 {
            lr.min(1.0)
        } else {
            0.01
        };
        let m = &mut self.mrbs;
        // 1. Normalising maxima (decaying, with floors) over usable fresh backends.
        let mut mx = [0.0f64; 3];
        let mut rt_stat = Stat::default();
        for x in b.iter().filter(|x| usable(x) && x.metrics_fresh) {
            let rps = clean(x.rps);
            if rps.is_finite() {
                mx[0] = mx[0].max(rps);
            }
            mx[1] = mx[1].max(conns(x));
            if let Some(rt) = valid(x.response_time_ms) {
                mx[2] = mx[2].max(rt);
                rt_stat.push(rt);
            }
        }
        let floors = [1.0, 1.0, 1e-3];
        for k in 0..3 {
            m.scale[k] = mx[k].max(m.scale[k] * SCALE_DECAY).max(floors[k]);
        }
        let mean_rt_n = rt_stat.mean().map_or(0.0, |r| r / m.scale[2]);
        // 2. One SGD step per backend with a fresh RT and features from the last refresh.
        for (i, x) in b.iter().enumerate() {
            if !(usable(x) && x.metrics_fresh) {
                continue;
            }
            let (Some(rt), Some(Some(xp))) = (valid(x.response_time_ms), m.prev.get(i)) else {
                continue;
            };
            let y = rt / m.scale[2];
            let err = m.predict(xp) - y;
            for (bk, xk) in m.beta.iter_mut().zip(xp) {
                *bk -= lr * err * xk;
            }
            // Projection: more load cannot make a server faster (our reading).
            m.beta[1] = m.beta[1].max(0.0);
            m.beta[2] = m.beta[2].max(0.0);
            m.samples += 1;
        }
        if !m.beta.iter().all(|v| v.is_finite()) {
            m.beta = [0.0; F];
            m.samples = 0;
        }
        // 3. Features for the next step and predictions for selection.
        let mut pred = Stat::default();
        let mut floor = f64::INFINITY;
        for (i, x) in b.iter().enumerate() {
            if i >= m.prev.len() {
                break;
            }
            if usable(x) && x.metrics_fresh {
                let f = m.features(x, mean_rt_n);
                let p = m.predict(&f);
                m.prev[i] = Some(f);
                m.pred[i] = p;
                pred.push(p);
                if let Some(rt) = valid(x.response_time_ms) {
                    floor = floor.min(rt / m.scale[2]);
                }
            } else {
                m.prev[i] = None;
                m.pred[i] = f64::NAN;
            }
        }
        m.mean_pred = pred.mean().unwrap_or(f64::NAN);
        m.floor = if floor.is_finite() {
            floor.max(1e-6)
        } else {
            1e-6
        };
    }

    pub(super) fn select_mrbs(&mut self, req: &SelectRequest, b: &[BackendLoad]) -> Option<usize> {
        if self.mrbs.samples < u64::from(self.params.mrbs_warmup) {
            return self.select_lc(b);
        }
        let rc = RateCtx::new(req.since_refresh, self.rate_window());
        let (floor, mean) = (self.mrbs.floor, self.mrbs.mean_pred);
        let pred = std::mem::take(&mut self.mrbs.pred);
        let ramps = std::mem::take(&mut self.ramp);
        let r = self.argmin(b, |i, x| {
            let p = pred.get(i).copied().filter(|p| !p.is_nan()).unwrap_or(mean);
            let p = if p.is_nan() { floor } else { p.max(floor) };
            let f = ramp_of(&ramps, i);
            let cost = p * (1.0 + f64::from(x.picks_since_refresh)) / f;
            Some([cost, rc.eff(x) / f])
        });
        self.mrbs.pred = pred;
        self.ramp = ramps;
        r
    }
}

// ---- AMLOB --------------------------------------------------------------------------

#[derive(Debug, Clone, Copy)]
pub(super) struct AmlobState {
    /// CV weights of (RPS, connections, RT).
    a: [f64; 3],
    mean_rps: f64,
    /// NaN when no RT is known.
    mean_rt: f64,
}

impl Default for AmlobState {
    fn default() -> Self {
        AmlobState {
            a: [1.0 / 3.0; 3],
            mean_rps: 0.0,
            mean_rt: f64::NAN,
        }
    }
}

impl AmlobState {
    /// The current CV weights of (RPS, connections, RT).
    pub(super) fn weights(&self) -> [f64; 3] {
        self.a
    }
}

impl Balancer {
    pub(super) fn refresh_amlob(&mut self, b: &[BackendLoad]) {
        let mut s = [Stat::default(); 3];
        for x in b.iter().filter(|x| usable(x) && x.metrics_fresh) {
            s[0].push(clean(x.rps));
            s[1].push(conns(x));
            if let Some(rt) = valid(x.response_time_ms) {
                s[2].push(rt);
            }
        }
        let cv = [s[0].cv(), s[1].cv(), s[2].cv()];
        let total: f64 = cv.iter().sum();
        let a = if total > 0.0 && total.is_finite() {
            [cv[0] / total, cv[1] / total, cv[2] / total]
        } else {
            [1.0 / 3.0; 3]
        };
        self.amlob = AmlobState {
            a,
            mean_rps: s[0].mean().unwrap_or(0.0),
            mean_rt: s[2].mean().unwrap_or(f64::NAN),
        };
    }

    pub(super) fn select_amlob(&mut self, req: &SelectRequest, b: &[BackendLoad]) -> Option<usize> {
        let rc = RateCtx::new(req.since_refresh, self.rate_window());
        let st = self.amlob;
        let mut lo = [f64::INFINITY; 3];
        let mut hi = [f64::NEG_INFINITY; 3];
        // Pass 1: metrics into the scratch buffer, pool minima and maxima.
        for (i, x) in b.iter().enumerate() {
            if !usable(x) {
                continue;
            }
            let m = amlob_metrics(&st, x, rc, self.ramp(i));
            for k in 0..3 {
                if !m[k].is_nan() {
                    lo[k] = lo[k].min(m[k]);
                    hi[k] = hi[k].max(m[k]);
                }
            }
            self.scratch[i] = [m[0], m[1], m[2], 0.0];
        }
        // `a_k / range_k`; a zero or infinite range scores `a_k` above the minimum.
        let mut scale = [0.0; 3];
        let mut step = [false; 3];
        for k in 0..3 {
            let range = hi[k] - lo[k];
            if range > 0.0 && range.is_finite() {
                scale[k] = st.a[k] / range;
            } else {
                step[k] = true;
            }
        }
        // Pass 2: argmin of the weighted min-max score, ties by fewer connections.
        let sc = std::mem::take(&mut self.scratch);
        let r = self.argmin(b, |i, _| {
            let m = sc[i];
            let mut score = 0.0;
            for k in 0..3 {
                score += if step[k] {
                    if m[k] > lo[k] { st.a[k] } else { 0.0 }
                } else {
                    (m[k] - lo[k]) * scale[k]
                };
            }
            Some([score, m[1]])
        });
        self.scratch = sc;
        r
    }
}

/// AMLOB metrics of one backend: effective RPS, connections, expected RT; stale or
/// unmeasured values take the pool mean; all divided by its slow-start fraction.
fn amlob_metrics(st: &AmlobState, x: &BackendLoad, rc: RateCtx, f: f64) -> [f64; 3] {
    let eff = if x.metrics_fresh {
        rc.eff(x)
    } else {
        rc.eff(&BackendLoad {
            rps: st.mean_rps,
            ..*x
        })
    };
    let rt = if x.metrics_fresh {
        valid(x.response_time_ms)
    } else {
        None
    };
    let rt = rt.unwrap_or(if st.mean_rt.is_nan() { 1.0 } else { st.mean_rt });
    [
        eff / f,
        conns(x) / f,
        rt.max(MIN_RT_MS) * (1.0 + f64::from(x.picks_since_refresh)) / f,
    ]
}

// ---- SRT ----------------------------------------------------------------------------

#[derive(Debug, Clone)]
pub(super) struct SrtState {
    /// RT (ms) per backend: the core's EWMA as last seen fresh, decaying toward the pool
    /// mean while stale; NaN = never measured.
    rt: Vec<f64>,
    /// Pool mean of the fresh RTs, NaN if none.
    mean: f64,
}

impl Default for SrtState {
    fn default() -> Self {
        SrtState {
            rt: Vec::new(),
            mean: f64::NAN,
        }
    }
}

impl SrtState {
    pub(super) fn resize(&mut self, n: usize) {
        self.rt.resize(n, f64::NAN);
    }
    pub(super) fn remove(&mut self, i: usize) {
        if i < self.rt.len() {
            self.rt.remove(i);
        }
    }
    /// The RT SRT uses for backend `i` (NaN when never measured).
    pub(super) fn rt(&self, i: usize) -> f64 {
        self.rt.get(i).copied().unwrap_or(f64::NAN)
    }
}

impl Balancer {
    pub(super) fn refresh_srt(&mut self, b: &[BackendLoad], interval: Duration) {
        let st = &mut self.srt;
        let mut mean = Stat::default();
        for (i, x) in b.iter().enumerate() {
            let Some(cur) = st.rt.get_mut(i) else { break };
            if !x.metrics_fresh {
                continue;
            }
            // The core's figure is already the source's EWMA of the measured RT (α = 0.2
            // per measurement); smoothing it again per refresh would delay a step by
            // another ~5 refreshes (anchors §1.4: one EWMA of the measured RT).
            if let Some(s) = valid(x.response_time_ms) {
                *cur = s;
            }
            if usable(x) && !cur.is_nan() {
                mean.push(*cur);
            }
        }
        st.mean = mean.mean().unwrap_or(f64::NAN);
        // Stale backends: decay toward the pool mean (starvation mitigation, §1.4).
        let hl = self.params.srt_stale_half_life.as_secs_f64();
        if !st.mean.is_nan() && hl > 0.0 && !interval.is_zero() {
            let d = 0.5f64.powf(interval.as_secs_f64() / hl);
            for (i, x) in b.iter().enumerate() {
                let Some(cur) = st.rt.get_mut(i) else { break };
                if !x.metrics_fresh && !cur.is_nan() {
                    *cur = st.mean + (*cur - st.mean) * d;
                }
            }
        }
    }

    pub(super) fn select_srt(&mut self, b: &[BackendLoad]) -> Option<usize> {
        let rts = std::mem::take(&mut self.srt.rt);
        let ramps = std::mem::take(&mut self.ramp);
        let mean = self.srt.mean;
        let r = self.argmin(b, |i, x| {
            let rt = rts.get(i).copied().filter(|r| !r.is_nan());
            let rt = rt.or_else(|| valid(x.response_time_ms).filter(|_| x.metrics_fresh));
            let rt = rt.unwrap_or(if mean.is_nan() { 1.0 } else { mean });
            let f = ramp_of(&ramps, i);
            Some([
                rt.max(MIN_RT_MS) * (1.0 + f64::from(x.picks_since_refresh)) / f,
                conns(x) / f,
            ])
        });
        self.srt.rt = rts;
        self.ramp = ramps;
        r
    }
}
