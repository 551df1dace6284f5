//! What a run measured: per phase, the requests' outcomes and response times and the
//! servers' and the controller's busy shares; the time series.

use super::*;

/// What became of the requests of one phase (those whose first SYN was sent in it).
#[derive(Debug, Clone, serde::Serialize)]
pub struct PhaseStats {
    /// Offered load, a fraction of the pool's capacity.
    pub load: f64,
    pub offered: u64,
    pub served: u64,
    /// Refused by the controller with a RST (its gate, the service's, or no backend).
    pub reset: u64,
    /// Refused by a server whose queue was full.
    pub server_refused: u64,
    /// SYNs dropped three times (gap rules, meters, a silent refusal): given up.
    pub timed_out: u64,
    /// Connections that reached a faulty server ([`Scenario::is_faulty`]).
    pub to_faulty: u64,
    /// Of those, the ones it dropped: their clients gave up after their third SYN.
    pub dropped_by_server: u64,
    /// Connections a server dropped that the controller sent to another server at their
    /// client's retransmitted SYN (`redispatch`); served there, they are not dropped.
    pub redispatched: u64,
    /// SYNs dropped at the switch (each try).
    pub syn_drops: u64,
    /// Connections with no outcome by the end of the run (0 unless a handshake stalled).
    pub lost: u64,
    /// Response times of the served, µs, from the first SYN to the response.
    #[serde(skip)]
    pub rt: Histogram<u64>,
    pub rt_p50_ms: f64,
    pub rt_p99_ms: f64,
    /// Of each server, the share of its worker time busy in this phase.
    #[serde(skip)]
    pub utilization: Vec<f64>,
    pub util_mean: f64,
    pub util_max: f64,
    /// Coefficient of variation of the servers' utilization: 0 is perfect balance.
    pub util_cov: f64,
    /// Share of the controller's time busy handling PACKET_INs.
    pub controller_util: f64,
}

/// A server the controller's outlier detection ejected.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Ejection {
    pub server: usize,
    /// Whether it is one of the faulty servers (else the ejection is a false one).
    pub faulty: bool,
    /// When, in seconds from the first request.
    pub at_s: f64,
    /// `consecutive`, `success_rate` or `failure_percentage`.
    pub detector: &'static str,
}

/// One point of the time series.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Sample {
    pub t: f64,
    /// Per second over the sample.
    pub offered: f64,
    pub served: f64,
    pub refused: f64,
    pub util_mean: f64,
    /// The controller's own gate: the PACKET_IN rate it admits (`None`: no limit), and
    /// the load it measured (1.0 = at its target).
    pub controller_limit: Option<f64>,
    pub controller_load: f64,
}

/// Everything one run measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Outcome {
    pub algorithm: String,
    pub overload: String,
    /// The outlier detection ([`crate::OUTLIERS`]).
    pub outlier: String,
    /// Whether the service redispatched silent connections ([`Scenario::redispatch`]).
    pub redispatch: bool,
    /// The faulty servers, by index.
    pub faulty: Vec<usize>,
    /// Every ejection by the controller's outlier detection, in order.
    pub ejections: Vec<Ejection>,
    pub capacity: f64,
    pub phases: Vec<PhaseStats>,
    pub series: Vec<Sample>,
    pub links_found: usize,
    pub hosts_learned: usize,
    pub packet_ins: u64,
    /// Connection rules on the busiest switch at its fullest.
    pub max_conn_rules: usize,
    /// Spines that carried any connection (the controller routes each connection along
    /// one shortest path).
    pub spines_used: usize,
    /// Connection rules still on the switches at the end (0: every one ended, and its
    /// FLOW_REMOVED reached the controller).
    pub conn_rules_left: usize,
    /// Connections whose rules the controller deferred to the client's ACK.
    pub deferred: u64,
    /// Wall-clock time the run took.
    pub wall_secs: f64,
}

impl Engine<'_> {
    fn busy_now(&mut self) -> Vec<f64> {
        let now = self.now;
        self.servers
            .iter_mut()
            .map(|s| {
                s.settle(now);
                s.busy_ns
            })
            .collect()
    }

    /// At each phase's start (and the end of the last), the servers' and the
    /// controller's busy time, for each phase's utilization.
    pub(super) fn mark_phase(&mut self) {
        let n = self.sc.loads.len();
        let phase_ns = self.sc.phase.as_nanos() as u64;
        while self.phase_marks.len() <= n {
            let at = self.start + self.phase_marks.len() as u64 * phase_ns;
            if self.now < at {
                return;
            }
            let busy = self.busy_now();
            self.phase_marks.push((busy, self.ctl_busy_ns));
        }
    }

    pub(super) fn sample(&mut self) {
        let busy = self.busy_now();
        let dt = SAMPLE as f64;
        let util: f64 = busy
            .iter()
            .zip(&self.series_busy)
            .zip(&self.servers)
            .map(|((b, a), s)| (b - a) / (dt * f64::from(s.workers)))
            .sum::<f64>()
            / busy.len().max(1) as f64;
        self.series_busy = busy;
        let (o, s, r) = std::mem::take(&mut self.series_counts);
        let gate = self.c.controller_gap_view();
        let per_sec = 1e9 / dt;
        self.series.push(Sample {
            t: self.now.saturating_sub(self.start) as f64 / 1e9,
            offered: o as f64 * per_sec,
            served: s as f64 * per_sec,
            refused: r as f64 * per_sec,
            util_mean: util,
            controller_limit: gate.gap.admitted_rate_limit,
            controller_load: gate.gap.load,
        });
    }

    pub(super) fn finish_phases(&mut self) {
        let phase_ns = self.sc.phase.as_nanos() as f64;
        for (i, p) in self.phases.iter_mut().enumerate() {
            p.lost = p.offered.saturating_sub(
                p.served + p.reset + p.server_refused + p.timed_out + p.dropped_by_server,
            );
            let (Some((a, ca)), Some((b, cb))) =
                (self.phase_marks.get(i), self.phase_marks.get(i + 1))
            else {
                continue;
            };
            p.utilization = a
                .iter()
                .zip(b)
                .zip(&self.servers)
                .map(|((x, y), s)| (y - x) / (phase_ns * f64::from(s.workers)))
                .collect();
            let n = p.utilization.len().max(1) as f64;
            let mean = p.utilization.iter().sum::<f64>() / n;
            let var = p
                .utilization
                .iter()
                .map(|u| (u - mean).powi(2))
                .sum::<f64>()
                / n;
            p.util_mean = mean;
            p.util_max = p.utilization.iter().copied().fold(0.0, f64::max);
            p.util_cov = if mean > 0.0 { var.sqrt() / mean } else { 0.0 };
            p.controller_util = (cb - ca) / phase_ns;
            p.rt_p50_ms = p.rt.value_at_quantile(0.5) as f64 / 1000.0;
            p.rt_p99_ms = p.rt.value_at_quantile(0.99) as f64 / 1000.0;
        }
    }
}
