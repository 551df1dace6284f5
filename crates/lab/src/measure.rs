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
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use flowgate_testbed::{Host, ProcGuard};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::net::{IPERF_PORT, LabNet, REQUESTED};

/// One row of a scenario's results: an arm in one phase. The first block is raw
/// measurements, the second is derived from them by the paper's equations. `None` is a
/// measurement that failed (or a figure derived from one): it is never a zero.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
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
    /// Load clients that gave no report (their requests count as failed).
    pub clients_failed: u64,
    pub wall_s: f64,
    pub sent: u64,
    pub ok: u64,
    pub failed: u64,
    pub http_503: u64,
    pub timeouts: u64,
    /// SYNs the clients sent again (lost handshakes, a second each): the sum of their
    /// namespaces' `TCPSynRetrans` over the pass; missing if a client could not read it.
    pub syn_retransmits: Option<u64>,
    pub lat_p50_ms: Option<f64>,
    pub lat_p95_ms: Option<f64>,
    pub lat_p99_ms: Option<f64>,
    pub srv1: u64,
    pub srv2: u64,
    pub srv3: u64,
    pub srv4: u64,
    pub ctl_srv1: u64,
    pub ctl_srv2: u64,
    pub ctl_srv3: u64,
    pub ctl_srv4: u64,
    pub no_optimal_server: u64,
    /// ISSLM's moves off the requested server, by the search that found the target.
    pub moved_by_load: u64,
    pub moved_by_conns: u64,
    pub moved_by_rt: u64,
    /// Passive outlier detection in the phase: backends ejected, times a pool went into
    /// panic (its ejections waived), and silences not judged because the backend answered
    /// a later connection, or because a switch on the way was behind.
    pub ejections: u64,
    pub panics: u64,
    pub excused_answered_later: u64,
    pub excused_switch_behind: u64,
    /// Connections it judged over the phase: answered, and not (excused as answered later
    /// included).
    pub outcomes_answered: u64,
    pub outcomes_unanswered: u64,
    /// Outcome rules that ended without a verdict (the connection no longer known, over
    /// in under a second, or decided before its backend's last ejection).
    pub outcomes_unjudged: u64,
    /// Connections the controller gave another backend at their client's retransmitted
    /// SYN, their own having stayed silent (`redispatch`).
    pub redispatched: u64,
    pub iperf_bytes: Option<u64>,
    pub iperf_secs: Option<f64>,
    pub iperf_max_bps: Option<f64>,
    pub ping_rtt_avg_ms: Option<f64>,
    pub ping_loss_pct: Option<f64>,
    pub qos_pass_ok: u64,
    // --- derived ---
    pub ok_rps: f64,
    pub jain: f64,
    pub bdmax_gbps: Option<f64>,
    pub dtransfer_gb: Option<f64>,
    pub th_gbps: Option<f64>,
    pub de2e_ms: Option<f64>,
    pub tx_delay_ms: Option<f64>,
    pub isl_pct: Option<f64>,
    pub dtransfer_pct: Option<f64>,
    pub diff_delay_ms: Option<f64>,
    /// Latency of every ok request of the phase (ms), kept so rows can be merged into
    /// true percentiles (Case C's `all`); not written out.
    #[serde(skip)]
    pub ok_latencies_ms: Vec<f64>,
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
    /// What the controller counted between two snapshots: its picks of each server, the
    /// ISSLM searches that found no optimal server, ISSLM's moves by search, and passive
    /// outlier detection's ejections, panics and excused silences.
    pub fn set_controller_counts(
        &mut self,
        before: &crate::ctl::Snapshot,
        after: &crate::ctl::Snapshot,
    ) {
        let picks = |k: usize| after.conns[k].saturating_sub(before.conns[k]);
        [self.ctl_srv1, self.ctl_srv2, self.ctl_srv3, self.ctl_srv4] =
            [picks(0), picks(1), picks(2), picks(3)];
        self.no_optimal_server = after
            .no_optimal_server
            .saturating_sub(before.no_optimal_server);
        let moves = |k: usize| after.isslm_moves[k].saturating_sub(before.isslm_moves[k]);
        (self.moved_by_load, self.moved_by_conns, self.moved_by_rt) =
            (moves(0), moves(1), moves(2));
        self.ejections = after.ejections.saturating_sub(before.ejections);
        self.panics = after.panics.saturating_sub(before.panics);
        self.redispatched = after.redispatched.saturating_sub(before.redispatched);
        let excused =
            |k: usize| after.silences_excused[k].saturating_sub(before.silences_excused[k]);
        (self.excused_answered_later, self.excused_switch_behind) = (excused(0), excused(1));
        let judged = |k: usize| after.outcomes[k].saturating_sub(before.outcomes[k]);
        (
            self.outcomes_answered,
            self.outcomes_unanswered,
            self.outcomes_unjudged,
        ) = (judged(0), judged(1), judged(2));
    }

    /// Per-server responses, in server order.
    pub fn shares(&self) -> [u64; 4] {
        [self.srv1, self.srv2, self.srv3, self.srv4]
    }

    /// Fills the derived columns from the raw ones; `normal` is the normal-load baseline
    /// of Eqs. 2, 3 and 6 (see `Params::shared_normal_qos`), `None` for a normal phase.
    /// A figure whose inputs are missing is missing too.
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
        self.bdmax_gbps = self.iperf_max_bps.map(|b| b / 1e9);
        self.dtransfer_gb = self.iperf_bytes.map(|b| b as f64 / 1e9);
        self.th_gbps = match (self.dtransfer_gb, self.iperf_secs) {
            (Some(d), Some(s)) if s > 0.0 => Some(8.0 * d / s),
            _ => None,
        };
        self.de2e_ms = self.ping_rtt_avg_ms.map(|r| r / 2.0);
        self.tx_delay_ms = match (self.dtransfer_gb, self.bdmax_gbps) {
            (Some(d), Some(b)) if b > 0.0 => Some(d * 8.0 / b * 1000.0),
            _ => None,
        };
        let pct = |heavy: Option<f64>, normal: Option<f64>| match (heavy, normal) {
            (Some(h), Some(n)) if n > 0.0 => Some(100.0 - 100.0 * h / n),
            _ => None,
        };
        match normal {
            Some(n) => {
                self.isl_pct = pct(self.bdmax_gbps, n.bdmax_gbps);
                self.dtransfer_pct = pct(self.dtransfer_gb, n.dtransfer_gb);
                self.diff_delay_ms = self.tx_delay_ms.zip(n.tx_delay_ms).map(|(h, n)| h - n);
            }
            None => {
                self.isl_pct = None;
                self.dtransfer_pct = None;
                self.diff_delay_ms = None;
            }
        }
    }

    /// Measurements of this row that failed: (iperf3 gave no result, ping gave no RTT,
    /// load clients of the HTTP pass that gave no report).
    pub fn failures(&self) -> (u64, u64, u64) {
        // A scenario without a QoS pass runs no iperf3 to fail.
        let qos = crate::scenario::Params::for_scenario(&self.scenario, false).qos_pass;
        (
            u64::from(qos && self.iperf_max_bps.is_none()),
            u64::from(self.ping_rtt_avg_ms.is_none()),
            self.clients_failed,
        )
    }
}

/// The parts of a `flowgate load --json` report the lab uses.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct LoadJson {
    sent: u64,
    ok: u64,
    failed: u64,
    errors: LoadErrors,
    per_backend: BTreeMap<String, u64>,
    #[serde(default)]
    syn_retransmits: Option<u64>,
    /// Latency (ms) of each ok request, from the client's `--conn-log`; `None` when that
    /// file could not be read.
    #[serde(skip)]
    ok_ms: Option<Vec<f64>>,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct LoadErrors {
    connect_timeout: u64,
    timeout: u64,
    http_status: BTreeMap<String, u64>,
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

/// The HTTP load of one pass.
#[derive(Debug, Clone, Copy)]
pub struct PassLoad<'a> {
    pub requests: u64,
    pub secs: f64,
    pub timeout_ms: u64,
    /// Which client sends each request: the same seed, the same draws.
    pub seed: u64,
    pub probe: Probe,
    /// Where every request of the pass is written, one line each (see `wait_loads`).
    pub requests_log: Option<&'a Path>,
}

/// Runs one phase. Fills the raw columns of a [`Row`].
pub fn run_phase(
    net: &LabNet,
    flowgate: &Path,
    load: PassLoad<'_>,
    row: &mut Row,
) -> Result<PhaseExtra> {
    let PassLoad {
        requests,
        secs,
        timeout_ms,
        seed,
        probe,
        requests_log,
    } = load;
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
    let deadline = load_deadline(started, secs, timeout_ms);
    let reports = wait_loads(&mut loads, deadline, requests_log)?;
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
            row.iperf_bytes = Some(bytes);
            row.iperf_secs = Some(secs);
            row.iperf_max_bps = Some(max_rate(&intervals));
            extra.intervals = intervals;
        }
        Err(e) if iperf_on => eprintln!("flowgate lab: iperf3 gave no result: {e:#}"),
        Err(_) => {}
    }
    if !iperf_on {
        let (rtt, loss) = parse_ping(&ping.output());
        if rtt.is_none() {
            eprintln!("flowgate lab: ping gave no round-trip time (loss {loss:?} %)");
        }
        row.ping_rtt_avg_ms = rtt;
        row.ping_loss_pct = loss;
    }
    Ok(extra)
}

/// B_d(max): the largest interval rate; an iperf3 test without intervals has none.
pub fn max_rate(intervals: &[Interval]) -> f64 {
    intervals.iter().map(|i| i.1).fold(0.0, f64::max)
}

/// The `q` quantile (0..=1) of `sorted` by nearest rank, as hdrhistogram's
/// `value_at_quantile`: the smallest value with at least q of the samples at or below it.
pub fn quantile(sorted: &[f64], q: f64) -> Option<f64> {
    let n = sorted.len();
    if n == 0 {
        return None;
    }
    let rank = ((q * n as f64).ceil() as usize).clamp(1, n);
    Some(sorted[rank - 1])
}

/// Sets the row's p50/p95/p99 from `ok_latencies_ms`; missing when it has no samples, or
/// fewer than the row's ok count (a client's samples were lost: percentiles of the rest
/// would be biased).
pub fn set_percentiles(row: &mut Row) {
    row.ok_latencies_ms.sort_by(f64::total_cmp);
    let s = &row.ok_latencies_ms;
    let complete = s.len() as u64 == row.ok;
    let q = |q| quantile(s, q).filter(|_| complete);
    (row.lat_p50_ms, row.lat_p95_ms, row.lat_p99_ms) = (q(0.50), q(0.95), q(0.99));
}

/// Folds the clients' `flowgate load` reports into `row`: sums, per-server responses, and
/// latency percentiles over all the clients' ok requests together (each client's own
/// percentiles cannot be combined into the phase's). `counts` are the requests each client
/// was given (clients with none have no report).
pub(crate) fn fold_reports(reports: &[Option<LoadJson>], counts: &[u64], row: &mut Row) {
    let mut per: BTreeMap<String, u64> = BTreeMap::new();
    let mut missing = 0;
    let mut syns = Some(0);
    for r in reports {
        let Some(r) = r else {
            missing += 1;
            syns = None;
            continue;
        };
        syns = syns.zip(r.syn_retransmits).map(|(a, b)| a + b);
        row.sent += r.sent;
        row.ok += r.ok;
        row.failed += r.failed;
        row.http_503 += r.errors.http_status.get("503").copied().unwrap_or(0);
        row.timeouts += r.errors.timeout + r.errors.connect_timeout;
        row.ok_latencies_ms
            .extend(r.ok_ms.iter().flatten().copied());
        for (k, v) in &r.per_backend {
            *per.entry(k.clone()).or_default() += v;
        }
    }
    // One fold per row (a pass, or a domain of Case C's): its clients' count.
    row.syn_retransmits = syns;
    row.clients_failed += missing;
    if missing > 0 {
        eprintln!("flowgate lab: {missing} load client(s) gave no report");
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
    set_percentiles(row);
    row.srv1 = per.get("srv1").copied().unwrap_or(0);
    row.srv2 = per.get("srv2").copied().unwrap_or(0);
    row.srv3 = per.get("srv3").copied().unwrap_or(0);
    row.srv4 = per.get("srv4").copied().unwrap_or(0);
}

/// Latencies (ms) of the ok (2xx) requests in a `--conn-log` file
/// (`PORT BACKEND STATUS|ERROR MS` per request).
pub(crate) fn parse_conn_log(text: &str) -> Vec<f64> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let status: u16 = f.get(2)?.parse().ok()?;
            (200..300)
                .contains(&status)
                .then(|| f.get(3)?.parse().ok())
                .flatten()
        })
        .collect()
}

/// A client's report: its `--json` output, with its ok requests' latencies from its
/// `--conn-log` text (`None` when that file was unreadable).
pub(crate) fn parse_client(out: &str, conn_log: Option<&str>) -> Option<LoadJson> {
    let mut r = parse_load(out)?;
    r.ok_ms = conn_log.map(parse_conn_log);
    Some(r)
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

/// A running `flowgate load` client, the host it runs on and the file of its per-request
/// log (removed when dropped).
#[derive(Debug)]
pub struct LoadClient {
    guard: ProcGuard,
    client: std::net::Ipv4Addr,
    conn_log: PathBuf,
}

impl Drop for LoadClient {
    fn drop(&mut self) {
        // Stopped first, so it cannot write the file after it is removed.
        self.guard.kill();
        let _ = std::fs::remove_file(&self.conn_log);
    }
}

/// Starts one `flowgate load` client on `host`: `requests` requests to `url` at an even
/// rate over `secs`, stopping `secs` + 2 s after the start whatever is left, each request
/// given up after `timeout_ms`. Each request's latency goes to a `--conn-log` file, so
/// the phase's percentiles can be taken over all clients' requests together.
pub fn spawn_paced_load(
    flowgate: &Path,
    host: &Host,
    url: &str,
    requests: u64,
    secs: f64,
    timeout_ms: u64,
) -> Result<LoadClient> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let conn_log = std::env::temp_dir().join(format!(
        "flowgate-lab-conns-{}-{}.txt",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let fg = flowgate.to_string_lossy();
    let rate = format!("{:.3}", requests as f64 / secs);
    let requests = requests.to_string();
    let dur = format!("{:.1}", secs + 2.0);
    let to = timeout_ms.to_string();
    let log = conn_log.to_string_lossy();
    let guard = host
        .spawn(&[
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
            "--conn-log",
            &log,
        ])
        .context("spawn load")?;
    Ok(LoadClient {
        guard,
        client: host.ip(),
        conn_log,
    })
}

/// When to stop waiting for load clients started at `started`: the phase, the client
/// timeout, and slack for process start-up.
pub fn load_deadline(started: Instant, secs: f64, timeout_ms: u64) -> Instant {
    started + Duration::from_secs_f64(secs + timeout_ms as f64 / 1000.0 + 20.0)
}

/// Waits for each load client (killing any still running at `deadline`) and parses what
/// each reported. With `requests_log`, every client's requests are written there, one
/// line each: `CLIENT PORT BACKEND STATUS|ERROR MS UNIX_SECS` (the client's address, then
/// its `--conn-log` line), so a slow or failed request can be placed in the controller's
/// log by its address, port and time.
pub(crate) fn wait_loads<'a>(
    loads: impl IntoIterator<Item = &'a mut LoadClient>,
    deadline: Instant,
    requests_log: Option<&Path>,
) -> Result<Vec<Option<LoadJson>>> {
    let mut reports = Vec::new();
    let mut lines = String::new();
    for c in loads {
        let g = &mut c.guard;
        while g.try_wait()?.is_none() {
            if Instant::now() > deadline {
                g.kill();
                break;
            }
            crate::signal::sleep(Duration::from_millis(20))?;
        }
        let log = std::fs::read_to_string(&c.conn_log).ok();
        for l in log.iter().flat_map(|t| t.lines()) {
            // Writing to a String cannot fail.
            let _ = writeln!(lines, "{} {l}", c.client);
        }
        reports.push(parse_client(&g.output(), log.as_deref()));
    }
    if let Some(path) = requests_log {
        std::fs::write(path, lines).with_context(|| format!("write {}", path.display()))?;
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

/// Parses ping's summary: (mean RTT ms, loss %), each `None` when ping did not print it
/// (no summary at all, or no reply, hence no RTT line).
pub fn parse_ping(out: &str) -> (Option<f64>, Option<f64>) {
    let mut rtt = None;
    let mut loss = None;
    for l in out.lines() {
        if let Some(rest) = l.split(" = ").nth(1).filter(|_| l.starts_with("rtt")) {
            rtt = rest.split('/').nth(1).and_then(|v| v.parse().ok());
        }
        if let Some(i) = l.find("% packet loss") {
            loss = l[..i]
                .rsplit([' ', ','])
                .next()
                .and_then(|v| v.parse().ok());
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

    fn iperf(max_bps: f64, bytes: u64, secs: f64) -> Row {
        Row {
            iperf_max_bps: Some(max_bps),
            iperf_bytes: Some(bytes),
            iperf_secs: Some(secs),
            ping_rtt_avg_ms: Some(0.5),
            ping_loss_pct: Some(0.0),
            ..Row::default()
        }
    }

    fn close(a: Option<f64>, b: f64) -> bool {
        a.is_some_and(|a| (a - b).abs() < 0.01)
    }

    #[test]
    fn paper_case_a_numbers_satisfy_the_equations() {
        let mut n = iperf(6.5e9, 7_019_000_000, 10.0);
        n.derive(None);
        assert!(close(n.th_gbps, 5.6152));
        let mut h = iperf(1.449e9, 1_652_000_000, 10.0);
        h.derive(Some(&n));
        assert!(close(h.th_gbps, 1.3216));
        assert!(close(h.isl_pct, 77.71));
        assert!(close(h.dtransfer_pct, 76.46));
    }

    /// A failed iperf3 or ping leaves its figures and everything derived from them
    /// missing: no B_d(max) of 0 giving %I_SL 100 and a negative ΔDelay, no D_E-E of 0.
    #[test]
    fn failed_measurements_stay_missing_in_the_equations() {
        let mut n = iperf(6.5e9, 7_019_000_000, 10.0);
        n.derive(None);
        let mut h = Row::default();
        h.derive(Some(&n));
        assert_eq!(
            (
                h.bdmax_gbps,
                h.dtransfer_gb,
                h.th_gbps,
                h.tx_delay_ms,
                h.de2e_ms
            ),
            (None, None, None, None, None)
        );
        assert_eq!(
            (h.isl_pct, h.dtransfer_pct, h.diff_delay_ms),
            (None, None, None)
        );
        assert_eq!(h.failures(), (1, 1, 0));
        assert_eq!(n.failures(), (0, 0, 0));
        // A failed baseline: the heavy row's own figures stand, the comparisons cannot.
        let mut h = iperf(1.449e9, 1_652_000_000, 10.0);
        h.derive(Some(&Row::default()));
        assert!(close(h.bdmax_gbps, 1.449) && h.de2e_ms == Some(0.25));
        assert_eq!(
            (h.isl_pct, h.dtransfer_pct, h.diff_delay_ms),
            (None, None, None)
        );
    }

    #[test]
    fn ping_summary_parses() {
        let out = "5 packets transmitted, 5 received, 0% packet loss, time 801ms\nrtt min/avg/max/mdev = 0.045/0.080/0.200/0.020 ms\n";
        assert_eq!(parse_ping(out), (Some(0.080), Some(0.0)));
        let out = "10 packets transmitted, 9 received, 10% packet loss, time 1801ms\n";
        assert_eq!(parse_ping(out).1, Some(10.0));
        // No reply: a loss, but no round-trip time; no summary: nothing.
        let out = "5 packets transmitted, 0 received, 100% packet loss, time 4000ms\n";
        assert_eq!(parse_ping(out), (None, Some(100.0)));
        assert_eq!(
            parse_ping("ping: connect: Network is unreachable\n"),
            (None, None)
        );
    }

    /// One client's `--json` report and `--conn-log` text: `ok` requests at the given
    /// latencies, one 503 and one timeout; its own percentiles as the client reports them.
    fn client(lat: &[f64]) -> (String, String) {
        let mut sorted = lat.to_vec();
        sorted.sort_by(f64::total_cmp);
        let p = |q| quantile(&sorted, q).unwrap_or(0.0);
        let json = format!(
            r#"{{"url":"http://100.0.0.2/","sent":{},"ok":{},"failed":2,"errors":{{"connect_refused":0,"connect_timeout":0,"unreachable":0,"reset":0,"timeout":1,"http_status":{{"503":1}},"other":0}},"latency_ms":{{"min":0,"p50":{},"p95":{},"p99":{},"max":0,"mean":0}},"per_backend":{{"srv2":{}}},"bytes":0,"elapsed_secs":1,"achieved_rate":1}}"#,
            lat.len() + 2,
            lat.len(),
            p(0.50),
            p(0.95),
            p(0.99),
            lat.len() + 1
        );
        let mut log: String = lat
            .iter()
            .enumerate()
            .map(|(i, ms)| format!("{} srv2 200 {ms:.3}\n", 40000 + i))
            .collect();
        log += "39999 srv2 503 3000.000\n- - Timeout 2000.000\n";
        (json, log)
    }

    /// Two clients of different sizes: the phase's percentiles are those of all 110 ok
    /// requests, not the ok-weighted mean of each client's (p95 105.5, p50 64.1 here).
    #[test]
    fn percentiles_are_over_all_clients_requests() {
        let a: Vec<f64> = (1..=100).map(f64::from).collect();
        let b: Vec<f64> = (201..=210).map(f64::from).collect();
        let (ja, la) = (client(&a), client(&b));
        let reports = [
            parse_client(&ja.0, Some(&ja.1)),
            parse_client(&la.0, Some(&la.1)),
        ];
        let mut row = Row::default();
        fold_reports(&reports, &[102, 12], &mut row);
        assert_eq!(
            (row.ok, row.failed, row.http_503, row.timeouts),
            (110, 4, 2, 2)
        );
        // Merged: p50 is the 55th of 110 (55 ms), p95 the 105th (205), p99 the 109th (209).
        assert_eq!(
            (row.lat_p50_ms, row.lat_p95_ms, row.lat_p99_ms),
            (Some(55.0), Some(205.0), Some(209.0))
        );
        let weighted_p95 = (100.0 * 95.0 + 10.0 * 210.0) / 110.0;
        assert!((row.lat_p95_ms.unwrap_or(0.0) - weighted_p95).abs() > 50.0);
    }

    /// The clients' SYNs sent again are summed; a client that could not count them (an
    /// older `flowgate load`, no `/proc`) leaves the row's count missing, not short.
    #[test]
    fn syn_retransmits_are_summed_and_missing_if_a_client_lacks_them() {
        let (j, l) = client(&[5.0]);
        let with = |n: u64| j.replacen('{', &format!("{{\"syn_retransmits\":{n},"), 1);
        let fold = |jsons: &[String]| {
            let reports: Vec<_> = jsons.iter().map(|j| parse_client(j, Some(&l))).collect();
            let mut row = Row::default();
            fold_reports(&reports, &vec![3; jsons.len()], &mut row);
            row.syn_retransmits
        };
        assert_eq!(fold(&[with(1), with(2)]), Some(3));
        assert_eq!(fold(&[with(1), j.clone()]), None);
        assert_eq!(fold(&[with(0)]), Some(0));
    }

    /// A client without a report counts as a failed measurement and its requests as
    /// failed; a client whose samples were lost leaves the percentiles missing rather than
    /// taken over the others' requests only.
    #[test]
    fn lost_clients_and_samples_are_counted_not_hidden() {
        let (j, l) = client(&[5.0, 6.0]);
        let mut row = Row::default();
        fold_reports(&[parse_client(&j, Some(&l)), None], &[4, 7], &mut row);
        assert_eq!((row.clients_failed, row.sent, row.failed), (1, 11, 9));
        assert_eq!(row.failures().2, 1);
        assert_eq!(row.lat_p50_ms, Some(5.0));
        let mut row = Row::default();
        fold_reports(
            &[parse_client(&j, Some(&l)), parse_client(&j, None)],
            &[4, 4],
            &mut row,
        );
        assert_eq!((row.ok, row.lat_p50_ms, row.lat_p99_ms), (4, None, None));
        // No ok request at all: no latency, not a latency of 0.
        let mut row = Row::default();
        fold_reports(&[parse_client(&client(&[]).0, Some(""))], &[2], &mut row);
        assert_eq!((row.ok, row.lat_p50_ms), (0, None));
    }

    #[test]
    fn assignment_is_seeded_and_complete() {
        let a = assign(200, 30, &mut SmallRng::seed_from_u64(7));
        let b = assign(200, 30, &mut SmallRng::seed_from_u64(7));
        assert_eq!(a, b);
        assert_eq!(a.iter().sum::<u64>(), 200);
    }
}
