//! One load phase (normal or heavy) and what is measured during it.
//!
//! During a phase of `T` seconds, at the same time:
//! * HTTP load: `N` requests, each from a client host drawn at random (seeded), all to
//!   `http://100.0.0.2/`; every client with `k` requests runs one `flowgate load` with
//!   `--requests k --rate k/T` (open loop, a new connection per request).
//! * iperf3: `iperf3 -c 100.0.0.2 -R -t T -i 0.5 -J` from client h1: server 2 sends to
//!   h1 across s3–s1, the path of the responses of the loaded server. B_d(max) is the
//!   largest 0.5 s interval rate, D_Transfer the bytes received in the test.
//! * ping: `ping -i 0.2 -w T 100.0.0.2` from client h2 (h1 when there is only one);
//!   the round-trip delay RTD is the mean RTT.
//!
//! The QoS figures follow the paper's equations on those raw values, see [`Row::derive`].

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use flowgate_testbed::{Host, ProcGuard};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::net::{IPERF_PORT, LabNet, REQUESTED};

/// One row of a scenario's results: an arm in one phase. The first block is raw
/// measurements, the second is derived from them by the paper's equations.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Row {
    pub scenario: String,
    pub arm: String,
    pub case: String,
    pub algorithm: String,
    pub phase: String,
    // --- raw ---
    pub offered: u64,
    pub duration_s: f64,
    pub clients_used: u64,
    pub wall_s: f64,
    pub sent: u64,
    pub ok: u64,
    pub failed: u64,
    pub http_503: u64,
    pub timeouts: u64,
    pub lat_p50_ms: f64,
    pub lat_p95_ms: f64,
    pub lat_p99_ms: f64,
    pub srv1: u64,
    pub srv2: u64,
    pub srv3: u64,
    pub srv4: u64,
    pub ctl_srv1: u64,
    pub ctl_srv2: u64,
    pub ctl_srv3: u64,
    pub ctl_srv4: u64,
    pub no_optimal_server: u64,
    pub iperf_bytes: u64,
    pub iperf_secs: f64,
    pub iperf_max_bps: f64,
    pub ping_rtt_avg_ms: f64,
    pub ping_loss_pct: f64,
    pub qos_pass_ok: u64,
    // --- derived ---
    pub ok_rps: f64,
    pub jain: f64,
    pub bdmax_gbps: f64,
    pub dtransfer_gb: f64,
    pub th_gbps: f64,
    pub de2e_ms: f64,
    pub tx_delay_ms: f64,
    pub isl_pct: Option<f64>,
    pub dtransfer_pct: Option<f64>,
    pub diff_delay_ms: Option<f64>,
}

/// Jain's fairness index of `x`: (Σx)² / (n Σx²); 1 when all equal, 1/n when one has all.
pub fn jain(x: &[f64]) -> f64 {
    let s: f64 = x.iter().sum();
    let s2: f64 = x.iter().map(|v| v * v).sum();
    if s2 == 0.0 {
        0.0
    } else {
        s * s / (x.len() as f64 * s2)
    }
}

impl Row {
    /// Per-server responses, in server order.
    pub fn shares(&self) -> [u64; 4] {
        [self.srv1, self.srv2, self.srv3, self.srv4]
    }

    /// Fills the derived columns from the raw ones; `normal` is the same arm's normal
    /// phase (the baseline of Eqs. 2, 3 and 6), `None` for the normal phase itself.
    ///
    /// * Eq. 1: T_h = D_Transfer / time, in Gb/s: 8 · D_Transfer\[GB\] / iperf seconds.
    /// * Eq. 2: %I_SL = 100 − 100 · B_d(max)(heavy) / B_d(max)(normal).
    /// * Eq. 3: %D_Transfer = 100 − 100 · D_Transfer(heavy) / D_Transfer(normal).
    /// * Eq. 4: D_E-E = RTD / 2.
    /// * Eq. 5: Delay_Transmission = D_Transfer\[GB\] · 8 / B_d(max)\[Gb/s\], in ms.
    /// * Eq. 6: Δ = Delay_Transmission(heavy) − Delay_Transmission(normal).
    pub fn derive(&mut self, normal: Option<&Row>) {
        self.ok_rps = if self.wall_s > 0.0 {
            self.ok as f64 / self.wall_s
        } else {
            0.0
        };
        let sh = self.shares().map(|v| v as f64);
        self.jain = jain(&sh);
        self.bdmax_gbps = self.iperf_max_bps / 1e9;
        self.dtransfer_gb = self.iperf_bytes as f64 / 1e9;
        self.th_gbps = if self.iperf_secs > 0.0 {
            8.0 * self.dtransfer_gb / self.iperf_secs
        } else {
            0.0
        };
        self.de2e_ms = self.ping_rtt_avg_ms / 2.0;
        self.tx_delay_ms = if self.bdmax_gbps > 0.0 {
            self.dtransfer_gb * 8.0 / self.bdmax_gbps * 1000.0
        } else {
            0.0
        };
        match normal {
            Some(n) => {
                self.isl_pct =
                    (n.bdmax_gbps > 0.0).then(|| 100.0 - 100.0 * self.bdmax_gbps / n.bdmax_gbps);
                self.dtransfer_pct = (n.dtransfer_gb > 0.0)
                    .then(|| 100.0 - 100.0 * self.dtransfer_gb / n.dtransfer_gb);
                self.diff_delay_ms = Some(self.tx_delay_ms - n.tx_delay_ms);
            }
            None => {
                self.isl_pct = None;
                self.dtransfer_pct = None;
                self.diff_delay_ms = None;
            }
        }
    }
}

/// The parts of a `flowgate load --json` report the lab uses.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct LoadJson {
    sent: u64,
    ok: u64,
    failed: u64,
    errors: LoadErrors,
    latency_ms: LoadLatency,
    per_backend: BTreeMap<String, u64>,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct LoadErrors {
    connect_timeout: u64,
    timeout: u64,
    http_status: BTreeMap<String, u64>,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct LoadLatency {
    p50: f64,
    p95: f64,
    p99: f64,
}

/// One iperf3 interval: end time (s), rate (bit/s), bytes.
pub type Interval = (f64, f64, u64);

/// What a phase returns beside its row: iperf3's intervals (for the plots).
#[derive(Debug, Clone, Default)]
pub struct PhaseExtra {
    pub intervals: Vec<Interval>,
}

/// What runs beside the HTTP load in a pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// Pass 1: ping only (light), so the HTTP figures are the load's own.
    Ping,
    /// Pass 2: the same load replayed (same draws) with iperf3 beside it.
    Iperf,
}

/// Draws which client sends each request: counts per client.
pub fn assign(requests: u64, clients: usize, rng: &mut SmallRng) -> Vec<u64> {
    let mut counts = vec![0u64; clients.max(1)];
    for _ in 0..requests {
        counts[rng.gen_range(0..clients.max(1))] += 1;
    }
    counts
}

/// Runs one phase. Fills the raw columns of a [`Row`].
#[allow(clippy::too_many_arguments)]
pub fn run_phase(
    net: &LabNet,
    flowgate: &Path,
    requests: u64,
    secs: f64,
    timeout_ms: u64,
    seed: u64,
    probe: Probe,
    row: &mut Row,
) -> Result<PhaseExtra> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let counts = assign(requests, net.clients.len(), &mut rng);
    let dst = REQUESTED.to_string();
    let t_int = secs.ceil().max(1.0) as u64;

    // iperf3 and ping first (they take a moment to start), then the HTTP clients.
    let iperf_client = &net.clients[0];
    let t = t_int.to_string();
    let port = IPERF_PORT.to_string();
    let iperf_on = probe == Probe::Iperf;
    let sleeper = ["sleep", "0"];
    let iperf_argv = iperf_client_argv(&dst, &port, &t);
    let mut iperf = iperf_client.spawn(if iperf_on { &iperf_argv } else { &sleeper })?;
    let pinger = net.clients.get(1).unwrap_or(&net.clients[0]);
    let ping_argv = ["ping", "-n", "-i", "0.2", "-w", &t, &dst];
    let mut ping = pinger.spawn(if iperf_on {
        &sleeper[..]
    } else {
        &ping_argv[..]
    })?;

    let url = format!("http://{dst}/");
    let started = Instant::now();
    let mut loads = Vec::new();
    for (i, &k) in counts.iter().enumerate() {
        if k == 0 {
            continue;
        }
        crate::signal::check()?;
        loads.push(spawn_paced_load(
            flowgate,
            &net.clients[i],
            &url,
            k,
            secs,
            timeout_ms,
        )?);
    }
    row.clients_used = loads.len() as u64;
    let reports = wait_loads(&mut loads, load_deadline(started, secs, timeout_ms))?;
    row.wall_s = started.elapsed().as_secs_f64();
    let iperf_deadline = Instant::now() + Duration::from_secs(t_int + 10);
    while iperf.try_wait()?.is_none() && Instant::now() < iperf_deadline {
        crate::signal::sleep(Duration::from_millis(50))?;
    }
    let ping_deadline = Instant::now() + Duration::from_secs(t_int + 5);
    while ping.try_wait()?.is_none() && Instant::now() < ping_deadline {
        crate::signal::sleep(Duration::from_millis(50))?;
    }
    iperf.kill();
    ping.kill();

    fold_reports(&reports, &counts, row);

    let mut extra = PhaseExtra::default();
    match parse_iperf(&iperf.output()).and_then(|r| {
        if iperf_on {
            Ok(r)
        } else {
            bail!("not run in this pass")
        }
    }) {
        Ok((bytes, secs, intervals)) => {
            row.iperf_bytes = bytes;
            row.iperf_secs = secs;
            row.iperf_max_bps = intervals.iter().map(|i| i.1).fold(0.0, f64::max);
            extra.intervals = intervals;
        }
        Err(e) if iperf_on => eprintln!("flowgate lab: iperf3 gave no result: {e:#}"),
        Err(_) => {}
    }
    if !iperf_on {
        let (rtt, loss) = parse_ping(&ping.output());
        row.ping_rtt_avg_ms = rtt;
        row.ping_loss_pct = loss;
    }
    Ok(extra)
}

/// Folds the clients' `flowgate load` reports into `row`: sums, per-server responses, and
/// latency percentiles as the ok-weighted mean of each client's percentile (each client
/// reports only its own). `counts` are the requests each client was given (clients with
/// none have no report).
pub(crate) fn fold_reports(reports: &[Option<LoadJson>], counts: &[u64], row: &mut Row) {
    let (mut w, mut p50, mut p95, mut p99) = (0.0, 0.0, 0.0, 0.0);
    let mut per: BTreeMap<String, u64> = BTreeMap::new();
    let mut missing = 0;
    for r in reports {
        let Some(r) = r else {
            missing += 1;
            continue;
        };
        row.sent += r.sent;
        row.ok += r.ok;
        row.failed += r.failed;
        row.http_503 += r.errors.http_status.get("503").copied().unwrap_or(0);
        row.timeouts += r.errors.timeout + r.errors.connect_timeout;
        let wt = r.ok as f64;
        w += wt;
        p50 += wt * r.latency_ms.p50;
        p95 += wt * r.latency_ms.p95;
        p99 += wt * r.latency_ms.p99;
        for (k, v) in &r.per_backend {
            *per.entry(k.clone()).or_default() += v;
        }
    }
    if missing > 0 {
        // A client that produced no report counts all its requests as failed.
        let lost: u64 = counts
            .iter()
            .filter(|&&k| k > 0)
            .zip(reports)
            .filter(|(_, r)| r.is_none())
            .map(|(k, _)| *k)
            .sum();
        row.failed += lost;
        row.sent += lost;
    }
    if w > 0.0 {
        row.lat_p50_ms = p50 / w;
        row.lat_p95_ms = p95 / w;
        row.lat_p99_ms = p99 / w;
    }
    row.srv1 = per.get("srv1").copied().unwrap_or(0);
    row.srv2 = per.get("srv2").copied().unwrap_or(0);
    row.srv3 = per.get("srv3").copied().unwrap_or(0);
    row.srv4 = per.get("srv4").copied().unwrap_or(0);
}

pub(crate) fn parse_load(out: &str) -> Option<LoadJson> {
    let start = out.find('{')?;
    let end = out.rfind('}')?;
    serde_json::from_str(out.get(start..=end)?).ok()
}

/// `iperf3` as a client of `dst:port` for `secs` seconds, reversed (the server sends), with
/// JSON output and half-second intervals.
pub fn iperf_client_argv<'a>(dst: &'a str, port: &'a str, secs: &'a str) -> [&'a str; 13] {
    [
        "iperf3",
        "-c",
        dst,
        "-p",
        port,
        "-R",
        "-t",
        secs,
        "-i",
        "0.5",
        "-J",
        "--connect-timeout",
        "3000",
    ]
}

/// Starts one `flowgate load` client on `host`: `requests` requests to `url` at an even
/// rate over `secs`, stopping `secs` + 2 s after the start whatever is left, each request
/// given up after `timeout_ms`.
pub fn spawn_paced_load(
    flowgate: &Path,
    host: &Host,
    url: &str,
    requests: u64,
    secs: f64,
    timeout_ms: u64,
) -> Result<ProcGuard> {
    let fg = flowgate.to_string_lossy();
    let rate = format!("{:.3}", requests as f64 / secs);
    let requests = requests.to_string();
    let dur = format!("{:.1}", secs + 2.0);
    let to = timeout_ms.to_string();
    host.spawn(&[
        &*fg,
        "--log",
        "error",
        "load",
        "--url",
        url,
        "--requests",
        &requests,
        "--rate",
        &rate,
        "--duration-secs",
        &dur,
        "--timeout-ms",
        &to,
        "--json",
    ])
    .context("spawn load")
}

/// When to stop waiting for load clients started at `started`: the phase, the client
/// timeout, and slack for process start-up.
pub fn load_deadline(started: Instant, secs: f64, timeout_ms: u64) -> Instant {
    started + Duration::from_secs_f64(secs + timeout_ms as f64 / 1000.0 + 20.0)
}

/// Waits for each load client (killing any still running at `deadline`) and parses what
/// each reported.
pub(crate) fn wait_loads<'a>(
    loads: impl IntoIterator<Item = &'a mut ProcGuard>,
    deadline: Instant,
) -> Result<Vec<Option<LoadJson>>> {
    let mut reports = Vec::new();
    for g in loads {
        while g.try_wait()?.is_none() {
            if Instant::now() > deadline {
                g.kill();
                break;
            }
            crate::signal::sleep(Duration::from_millis(20))?;
        }
        reports.push(parse_load(&g.output()));
    }
    Ok(reports)
}

/// Parses `iperf3 -J`: (bytes received, seconds, intervals).
pub fn parse_iperf(out: &str) -> Result<(u64, f64, Vec<Interval>)> {
    let start = out.find('{').context("no JSON")?;
    let end = out.rfind('}').context("no JSON")?;
    let v: serde_json::Value = serde_json::from_str(&out[start..=end])?;
    if let Some(e) = v["error"].as_str() {
        bail!("iperf3: {e}");
    }
    let recv = &v["end"]["sum_received"];
    let bytes = recv["bytes"].as_u64().context("end.sum_received.bytes")?;
    let secs = recv["seconds"].as_f64().unwrap_or(0.0);
    let mut intervals = Vec::new();
    for i in v["intervals"].as_array().into_iter().flatten() {
        let s = &i["sum"];
        intervals.push((
            s["end"].as_f64().unwrap_or(0.0),
            s["bits_per_second"].as_f64().unwrap_or(0.0),
            s["bytes"].as_u64().unwrap_or(0),
        ));
    }
    Ok((bytes, secs, intervals))
}

/// Parses ping's summary: (mean RTT ms, loss %). Zeros when absent.
pub fn parse_ping(out: &str) -> (f64, f64) {
    let mut rtt = 0.0;
    let mut loss = 0.0;
    for l in out.lines() {
        if let Some(rest) = l.split(" = ").nth(1).filter(|_| l.starts_with("rtt")) {
            rtt = rest
                .split('/')
                .nth(1)
                .and_then(|v| v.parse().ok())
                .unwrap_or(0.0);
        }
        if let Some(i) = l.find("% packet loss") {
            loss = l[..i]
                .rsplit([' ', ','])
                .next()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0.0);
        }
    }
    (rtt, loss)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jain_bounds() {
        assert!((jain(&[1.0, 1.0, 1.0, 1.0]) - 1.0).abs() < 1e-12);
        assert!((jain(&[0.0, 5.0, 0.0, 0.0]) - 0.25).abs() < 1e-12);
    }

    #[test]
    fn paper_case_a_numbers_satisfy_the_equations() {
        let n = Row {
            iperf_max_bps: 6.5e9,
            iperf_bytes: 7_019_000_000,
            iperf_secs: 10.0,
            ..Row::default()
        };
        let mut n2 = n.clone();
        n2.derive(None);
        assert!((n2.th_gbps - 5.6152).abs() < 1e-9);
        let mut h = Row {
            iperf_max_bps: 1.449e9,
            iperf_bytes: 1_652_000_000,
            iperf_secs: 10.0,
            ..Row::default()
        };
        h.derive(Some(&n2));
        assert!((h.th_gbps - 1.3216).abs() < 1e-9);
        assert!((h.isl_pct.unwrap_or(0.0) - 77.71).abs() < 0.01);
        assert!((h.dtransfer_pct.unwrap_or(0.0) - 76.46).abs() < 0.01);
    }

    #[test]
    fn ping_summary_parses() {
        let out = "5 packets transmitted, 5 received, 0% packet loss, time 801ms\nrtt min/avg/max/mdev = 0.045/0.080/0.200/0.020 ms\n";
        assert_eq!(parse_ping(out), (0.080, 0.0));
        let out = "10 packets transmitted, 9 received, 10% packet loss, time 1801ms\n";
        assert_eq!(parse_ping(out).1, 10.0);
    }

    #[test]
    fn assignment_is_seeded_and_complete() {
        let a = assign(200, 30, &mut SmallRng::seed_from_u64(7));
        let b = assign(200, 30, &mut SmallRng::seed_from_u64(7));
        assert_eq!(a, b);
        assert_eq!(a.iter().sum::<u64>(), 200);
    }
}
