//! `flowgate bench cluster`: the distributed mode's benchmark (issue 9), in one run with
//! one etcd:
//!
//! 1. **Flow setup, domain vs single.** The controller bench's emulated OpenFlow 1.3
//!    switches ([`super::controller`]) against a single-mode `flowgate controller` and
//!    against a domain-mode one (elected MASTER of the same switches through etcd,
//!    publishing its summary and reading its spill every `summary_interval_ms`), same
//!    switches, same window, alternating, every answer checked.
//! 2. **Spill latency.** Two domains (one emulated switch each, one local backend each,
//!    the other domain's backend behind an uplink port) and a global controller. Domain
//!    d1's switch sends SYNs at `overload` × its capacity (`threshold_rps`); the bench
//!    watches etcd (d1's summary, d1's spill decision) and the switch sees the first
//!    FLOW_MOD that rewrites a connection to d2's backend out of the uplink. Reported:
//!    load start → first overloaded summary → decision written → that FLOW_MOD.
//!
//! Every number is measured; nothing is assumed about the machine. `FLOWGATE_BENCH_LOG=info`
//! runs the controllers at that log level and prints the global controller's log after
//! each spill trial (its decisions, with their times).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use flowgate_packet::MacAddr;

use super::controller::{self, ControllerArgs, Peer, RunResult, TempDir};
use super::switch::{CheckMode, Pace, RunFlags, SwitchCounters, SwitchPlan, SwitchRun, run_switch};
use super::{Table, fmt_rate};

#[derive(Debug, Clone, clap::Args)]
pub struct ClusterArgs {
    /// Emulated switches in the flow-setup comparison.
    #[arg(long, short = 's', default_value_t = 4)]
    pub switches: usize,
    /// Measured loops per flow-setup run.
    #[arg(long, short = 'l', default_value_t = 5)]
    pub loops: usize,
    /// Milliseconds per loop.
    #[arg(long, short = 'm', default_value_t = 1000)]
    pub ms_per_loop: u64,
    /// Warm-up loops, not counted.
    #[arg(long, short = 'w', default_value_t = 1)]
    pub warmup: usize,
    /// Outstanding probes per switch (throughput mode).
    #[arg(long, default_value_t = 64)]
    pub window: usize,
    /// One probe outstanding per switch instead (latency mode).
    #[arg(long)]
    pub latency: bool,
    /// Single/domain pairs of flow-setup runs (alternating, each with fresh controllers).
    #[arg(long, default_value_t = 2)]
    pub runs: usize,
    /// Spill trials (each with fresh controllers and a fresh cluster name).
    #[arg(long, default_value_t = 3)]
    pub spills: usize,
    /// `[cluster] summary_interval_ms` of every instance.
    #[arg(long, default_value_t = 200)]
    pub summary_interval_ms: u64,
    /// d1's capacity in the spill trials (`threshold_rps` × its one local backend).
    #[arg(long, default_value_t = 50.0)]
    pub capacity_rps: f64,
    /// d1's new connections/s in the spill trials, as a multiple of its capacity.
    #[arg(long, default_value_t = 4.0)]
    pub overload: f64,
    /// Give up on a spill trial after this long without a remote FLOW_MOD.
    #[arg(long, default_value_t = 20_000)]
    pub spill_timeout_ms: u64,
    /// Milliseconds between the handshake and the first probe.
    #[arg(long, default_value_t = 1000)]
    pub delay_ms: u64,
    /// Only the spill trials.
    #[arg(long, conflicts_with = "skip_spill")]
    pub skip_setup: bool,
    /// Only the flow-setup comparison.
    #[arg(long)]
    pub skip_spill: bool,
    /// Write the results (Markdown) here.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Print less.
    #[arg(long, short)]
    pub quiet: bool,
}

/// One spill trial.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SpillTrial {
    /// Load start → first summary of d1 at or above its threshold, as read from etcd.
    pub to_overloaded_summary_ms: f64,
    /// Overloaded summary → d1's spill decision in etcd.
    pub to_decision_ms: f64,
    /// Decision → first complete answer (FLOW_MODs + PACKET_OUT) to d2's backend.
    pub to_remote_flow_mod_ms: f64,
    /// Overloaded summary → that FLOW_MOD: the spill's latency.
    pub spill_latency_ms: f64,
    /// Load start → that FLOW_MOD.
    pub from_load_start_ms: f64,
    pub first_fraction: f64,
    pub last_fraction: f64,
    pub local_answers: u64,
    pub remote_answers: u64,
    pub valid: u64,
    pub invalid: u64,
    pub lost: u64,
    pub invalid_samples: Vec<String>,
}

pub struct Report {
    /// (mode, run index, result), alternating single/domain.
    pub setup: Vec<(String, usize, RunResult)>,
    pub spills: Vec<Result<SpillTrial, String>>,
    pub etcd_version: String,
}

// ----- processes ---------------------------------------------------------------------

fn flowgate_exe() -> anyhow::Result<PathBuf> {
    let mut exe = std::env::current_exe()?;
    // Rebuilt while the bench runs (a shared tree): Linux names the old file
    // "flowgate (deleted)"; the new one is at the same path.
    if let Some(name) = exe.file_name().and_then(|n| n.to_str())
        && let Some(live) = name.strip_suffix(" (deleted)")
    {
        exe = exe.with_file_name(live);
    }
    if exe.file_stem().is_some_and(|s| s == "flowgate") {
        return Ok(exe);
    }
    if let Ok(p) = std::env::var("FLOWGATE_BIN") {
        return Ok(PathBuf::from(p));
    }
    bail!("cannot find the flowgate binary (set FLOWGATE_BIN)")
}

/// A `flowgate controller` started here; SIGKILLed (by its own pid) on drop.
struct Proc {
    name: String,
    openflow: SocketAddr,
    api: SocketAddr,
    child: Child,
    dir: TempDir,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Proc {
    fn start(name: &str, config: &str) -> anyhow::Result<Proc> {
        let dir = TempDir::new(&format!("cluster-{name}"))?;
        let cfg = dir.0.join("flowgate.toml");
        std::fs::write(&cfg, config)?;
        let ready = dir.0.join("ready.json");
        let log_path = dir.0.join("controller.log");
        let log = std::fs::File::create(&log_path)?;
        let exe = flowgate_exe()?;
        let mut child = Command::new(&exe)
            .args([
                "--log",
                &std::env::var("FLOWGATE_BENCH_LOG").unwrap_or_else(|_| "warn".into()),
                "controller",
                "--config",
            ])
            .arg(&cfg)
            .arg("--ready-file")
            .arg(&ready)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("start {}", exe.display()))?;
        let t0 = Instant::now();
        loop {
            if let Ok(s) = std::fs::read_to_string(&ready)
                && let Ok(v) = serde_json::from_str::<serde_json::Value>(&s)
            {
                let addr = |k: &str| -> anyhow::Result<SocketAddr> {
                    Ok(v[k]
                        .as_str()
                        .with_context(|| format!("ready file without {k}"))?
                        .parse()?)
                };
                return Ok(Proc {
                    name: name.to_string(),
                    openflow: addr("openflow")?,
                    api: addr("api")?,
                    child,
                    dir,
                });
            }
            if let Some(st) = child.try_wait()? {
                bail!(
                    "{name} exited ({st}): {}",
                    std::fs::read_to_string(&log_path).unwrap_or_default()
                );
            }
            if t0.elapsed() > Duration::from_secs(20) {
                let _ = child.kill();
                bail!("{name} did not start");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.0.join("controller.log")).unwrap_or_default()
    }

    /// GET on the controller's API (HTTP/1.1, `Connection: close`), as JSON.
    fn get_json(&self, path: &str) -> anyhow::Result<serde_json::Value> {
        let mut s = TcpStream::connect_timeout(&self.api, Duration::from_secs(2))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            self.api
        )?;
        let mut text = String::new();
        s.read_to_string(&mut text)?;
        let body = text
            .split_once("\r\n\r\n")
            .map(|(_, b)| b)
            .context("no HTTP body")?;
        Ok(serde_json::from_str(body)?)
    }

    /// Wait until this instance is elected (a domain master: every switch it has
    /// confirmed is MASTER; a global instance: active).
    fn wait_master(&self, timeout: Duration) -> anyhow::Result<()> {
        let t0 = Instant::now();
        loop {
            if let Ok(v) = self.get_json("/api/v1/cluster")
                && v["mastership"] == "master"
            {
                return Ok(());
            }
            if t0.elapsed() > timeout {
                bail!(
                    "{} was not elected within {timeout:?}: {}",
                    self.name,
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A domain instance's place: domain name, its switches, its uplink (`dpid`, `port`).
type DomainPlace<'a> = (&'a str, &'a [u64], Option<(u64, u32)>);

fn cluster_section(
    role: &str,
    cluster: &str,
    instance: &str,
    domain: Option<DomainPlace<'_>>,
    etcd: &str,
    interval_ms: u64,
) -> String {
    let mut s = format!(
        "\n[cluster]\nrole = \"{role}\"\nname = \"{cluster}\"\ninstance = \"{instance}\"\netcd = {etcd}\nlease_ttl_ms = 2000\nsummary_interval_ms = {interval_ms}\n"
    );
    if let Some((d, dpids, uplink)) = domain {
        let list: Vec<String> = dpids.iter().map(|d| format!("\"{d:016x}\"")).collect();
        s += &format!("domain = \"{d}\"\ndpids = [{}]\n", list.join(", "));
        if let Some((dpid, port)) = uplink {
            s += &format!("uplink = \"{dpid:016x}:{port}\"\n");
        }
    }
    s
}

// ----- 1. flow setup -------------------------------------------------------------------

#[derive(Parser)]
struct Wrap {
    #[command(flatten)]
    args: ControllerArgs,
}

/// The controller bench's arguments for this run (parsed, so its defaults apply).
fn controller_args(a: &ClusterArgs) -> anyhow::Result<ControllerArgs> {
    let mut argv: Vec<String> = [
        "bench",
        "-s",
        &a.switches.to_string(),
        "-l",
        &a.loops.to_string(),
        "-m",
        &a.ms_per_loop.to_string(),
        "-w",
        &a.warmup.to_string(),
        "--window",
        &a.window.max(1).to_string(),
        "--delay-ms",
        &a.delay_ms.to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if a.latency {
        argv.push("--latency".into());
    }
    if a.quiet {
        argv.push("-q".into());
    }
    Ok(Wrap::try_parse_from(argv)?.args)
}

fn setup_runs(
    a: &ClusterArgs,
    etcd: &str,
    rt: &tokio::runtime::Runtime,
) -> anyhow::Result<Vec<(String, usize, RunResult)>> {
    let cargs = controller_args(a)?;
    let pace = if a.latency {
        Pace::Window(1)
    } else {
        Pace::Window(a.window.max(1))
    };
    let dpids: Vec<u64> = controller::plans(&cargs)?.iter().map(|p| p.dpid).collect();
    let mut out = Vec::new();
    for run in 1..=a.runs {
        // Alternate which mode goes first, so a drifting machine favours neither.
        let order: [bool; 2] = if run % 2 == 1 {
            [false, true]
        } else {
            [true, false]
        };
        for domain in order {
            let r = if domain {
                let cluster = format!("benchsetup{}r{run}", std::process::id());
                let cfg = controller::flowgate_config(&cargs)?
                    + &cluster_section(
                        "domain",
                        &cluster,
                        "d1a",
                        Some(("d1", &dpids, None)),
                        etcd,
                        a.summary_interval_ms,
                    );
                let p = Proc::start("domain", &cfg)?;
                p.wait_master(Duration::from_secs(15))?;
                let r = controller::measure(
                    rt,
                    "flowgate domain",
                    p.openflow,
                    &cargs,
                    CheckMode::Vip,
                    pace,
                )?;
                // Still the elected master with etcd reachable after the run (its answers
                // were written only once the switches confirmed it MASTER).
                let v = p.get_json("/api/v1/cluster")?;
                if v["mastership"] != "master" || v["store"]["reachable"] != true {
                    bail!("the domain instance lost mastership or etcd during the run: {v}");
                }
                r
            } else {
                let p = controller::spawn_peer(Peer::Flowgate, &cargs, None)?;
                controller::measure(rt, "flowgate single", p.addr, &cargs, CheckMode::Vip, pace)?
            };
            let mode = if domain { "domain" } else { "single" };
            out.push((mode.to_string(), run, r));
        }
    }
    Ok(out)
}

// ----- 2. spill latency ----------------------------------------------------------------

const VIP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 100);
const UPLINK_PORT: u32 = 9;

fn backend_ip(domain: u64) -> Ipv4Addr {
    Ipv4Addr::new(10, 0, 0, 10 + domain as u8)
}

fn backend_mac(domain: u64) -> MacAddr {
    MacAddr([0x02, 0x00, 0x0b, 0x00, 0x00, 0x10 + domain as u8])
}

/// Domain `d`'s switch: its client on port 1, its backend on port 2, the other domain's
/// backend behind the uplink (its ARP arrives there, as over an L2 fabric).
fn spill_plan(d: u64) -> SwitchPlan {
    let other = 3 - d;
    SwitchPlan {
        dpid: d,
        vip: VIP,
        vport: 80,
        backends: vec![
            (backend_ip(d), backend_mac(d), 2),
            (backend_ip(other), backend_mac(other), UPLINK_PORT),
        ],
        client_mac: MacAddr([0x02, 0x00, 0x0c, d as u8, 0x00, 0x01]),
        client_base: [11, d as u8],
        client_port: 1,
    }
}

fn spill_services(capacity: f64) -> String {
    let mut c = format!(
        "[openflow]\nlisten = \"127.0.0.1:0\"\npacket_in_rate = 100000000\n\n[api]\nlisten = \"127.0.0.1:0\"\n\n[[service]]\nname = \"web\"\nvip = \"{VIP}\"\nport = 80\nalgorithm = \"weighted-round-robin\"\nvirtual_mac = \"02:66:67:00:00:01\"\nthreshold_rps = {capacity:.3}\n\n[service.health]\nkind = \"none\"\n"
    );
    for d in 1..=2 {
        c += &format!("\n[[service.backend]]\naddress = \"{}\"\n", backend_ip(d));
    }
    c
}

#[cfg(feature = "etcd")]
fn spill_trial(
    a: &ClusterArgs,
    trial: usize,
    etcd: &[String],
    etcd_toml: &str,
    rt: &tokio::runtime::Runtime,
) -> anyhow::Result<SpillTrial> {
    use flowgate_coord::spill::{DomainSummary, SpillDecision};
    use flowgate_coord::{Store, keys};

    let cluster = format!("benchspill{}t{trial}", std::process::id());
    let iv = a.summary_interval_ms;
    let services = spill_services(a.capacity_rps);
    let g = Proc::start(
        "global",
        &(String::from("[openflow]\nlisten = \"127.0.0.1:0\"\n[api]\nlisten = \"127.0.0.1:0\"\n")
            + &cluster_section("global", &cluster, "g1", None, etcd_toml, iv)),
    )?;
    let mut domains = Vec::new();
    for d in 1..=2u64 {
        let cfg = services.clone()
            + &cluster_section(
                "domain",
                &cluster,
                &format!("d{d}a"),
                Some((&format!("d{d}"), &[d], Some((d, UPLINK_PORT)))),
                etcd_toml,
                iv,
            );
        domains.push(Proc::start(&format!("d{d}"), &cfg)?);
    }
    g.wait_master(Duration::from_secs(15))?;
    for p in &domains {
        p.wait_master(Duration::from_secs(15))?;
    }
    let rate = a.capacity_rps * a.overload;
    let timeout = Duration::from_millis(a.spill_timeout_ms);
    let threshold = 1.0; // the default `spill_threshold` of the global instance
    let quiet = a.quiet;
    let delay = Duration::from_millis(a.delay_ms);
    let d1_addr = domains[0].openflow;
    let d2_addr = domains[1].openflow;

    let r = rt.block_on(async move {
        let store = flowgate_coord::etcd::EtcdStore::connect(etcd, Duration::from_secs(2))
            .await
            .map_err(|e| anyhow::anyhow!("etcd: {e}"))?;
        let flags1 = Arc::new(RunFlags::default());
        let flags2 = Arc::new(RunFlags::default());
        let c1 = Arc::new(SwitchCounters::default());
        let c2 = Arc::new(SwitchCounters::default());
        let probe_timeout = Duration::from_secs(10);
        let s1 = tokio::spawn(run_switch(SwitchRun {
            controller: d1_addr,
            plan: spill_plan(1),
            check: CheckMode::Vip,
            pace: Pace::Rate(rate),
            timeout: probe_timeout,
            expire_after: 0,
            counters: c1.clone(),
            flags: flags1.clone(),
        }));
        // d2's switch sends no probe: d2 has all its capacity to spare.
        let s2 = tokio::spawn(run_switch(SwitchRun {
            controller: d2_addr,
            plan: spill_plan(2),
            check: CheckMode::Vip,
            pace: Pace::Window(0),
            timeout: probe_timeout,
            expire_after: 0,
            counters: c2.clone(),
            flags: flags2.clone(),
        }));
        let summary = |d: &'static str| {
            let store = &store;
            let key = keys::domain_summary(&cluster, d);
            async move {
                store
                    .get(key)
                    .await
                    .ok()
                    .flatten()
                    .and_then(|kv| DomainSummary::from_json(&kv.value).ok())
                    .and_then(|s| s.services.get("web").cloned())
            }
        };
        // Ready: both switches connected and announced, d2 reports its backend (with its
        // MAC) as healthy, so d2 can be a target.
        let t0 = Instant::now();
        loop {
            let d2 = summary("d2").await;
            let ready = c1.ready.load(Ordering::Relaxed)
                && c2.ready.load(Ordering::Relaxed)
                && d2.is_some_and(|s| {
                    s.healthy >= 1 && s.local_backends.iter().any(|b| b.mac.is_some())
                });
            if ready {
                break;
            }
            if t0.elapsed() > Duration::from_secs(20) || s1.is_finished() || s2.is_finished() {
                flags1.stop.store(true, Ordering::Relaxed);
                flags2.stop.store(true, Ordering::Relaxed);
                let e1 = s1.await.ok().and_then(|r| r.error);
                let e2 = s2.await.ok().and_then(|r| r.error);
                bail!("the spill setup did not get ready (switch errors {e1:?} {e2:?})");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(delay).await;

        let start = Instant::now();
        flags1.measuring.store(true, Ordering::Relaxed);
        flags1.go.store(true, Ordering::Relaxed);
        let mut overloaded_at = None;
        let mut decided_at = None;
        let mut first_fraction = 0.0;
        let mut last_fraction = 0.0;
        let spill_key = keys::spill(&cluster, "d1");
        loop {
            let now = Instant::now();
            if overloaded_at.is_none()
                && let Some(s) = summary("d1").await {
                    let cap = s.capacity_rps.unwrap_or(f64::INFINITY);
                    if s.load_rps >= threshold * cap {
                        overloaded_at = Some(now);
                        if !quiet {
                            eprintln!("bench cluster: d1 overloaded at {:.0} ms: {s:?}; d2: {:?}", now.duration_since(start).as_secs_f64() * 1000.0, summary("d2").await);
                        }
                    }
                }
            let decision = store
                .get(spill_key.clone())
                .await
                .ok()
                .flatten()
                .and_then(|kv| SpillDecision::from_json(&kv.value).ok())
                .and_then(|d| d.services.get("web").map(|w| w.fraction));
            if let Some(f) = decision {
                if decided_at.is_none() {
                    if !quiet {
                        eprintln!("bench cluster: decision at {:.0} ms: fraction {f}; d1: {:?}", now.duration_since(start).as_secs_f64() * 1000.0, summary("d1").await);
                    }
                    decided_at = Some(now);
                    first_fraction = f;
                }
                last_fraction = f;
            }
            // A few intervals after the decision: the domain has read and applied it.
            if decided_at.is_some_and(|t| now.duration_since(t) > Duration::from_millis(5 * iv + 1000)) {
                break;
            }
            if now.duration_since(start) > timeout {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        flags1.stop.store(true, Ordering::Relaxed);
        flags2.stop.store(true, Ordering::Relaxed);
        let r1 = s1.await.map_err(|e| anyhow::anyhow!("switch task: {e}"))?;
        let _ = s2.await;
        if let Some(e) = r1.error {
            bail!("d1's emulated switch: {e}");
        }
        let local = r1.by_backend.first().copied().unwrap_or((0, None));
        let remote = r1.by_backend.get(1).copied().unwrap_or((0, None));
        let ms = |a: Instant, b: Instant| b.saturating_duration_since(a).as_secs_f64() * 1000.0;
        let (Some(over), Some(dec), Some(first_remote)) = (overloaded_at, decided_at, remote.1)
        else {
            bail!(
                "no spill within {timeout:?}: overloaded summary {:?}, decision {:?}, remote answers {} (local {})",
                overloaded_at.map(|t| ms(start, t)),
                decided_at.map(|t| ms(start, t)),
                remote.0,
                local.0
            );
        };
        if !quiet {
            eprintln!(
                "bench cluster: spill trial {trial}: overloaded summary at {:.0} ms, decision at {:.0} ms, first remote FLOW_MOD at {:.0} ms",
                ms(start, over),
                ms(start, dec),
                ms(start, first_remote)
            );
        }
        Ok::<_, anyhow::Error>(SpillTrial {
            to_overloaded_summary_ms: ms(start, over),
            to_decision_ms: ms(over, dec),
            to_remote_flow_mod_ms: ms(dec, first_remote),
            spill_latency_ms: ms(over, first_remote),
            from_load_start_ms: ms(start, first_remote),
            first_fraction,
            last_fraction,
            local_answers: local.0,
            remote_answers: remote.0,
            valid: c1.valid.load(Ordering::Relaxed),
            invalid: c1.invalid.load(Ordering::Relaxed),
            lost: c1.lost.load(Ordering::Relaxed),
            invalid_samples: r1.samples,
        })
    });
    if std::env::var_os("FLOWGATE_BENCH_LOG").is_some() {
        eprintln!("--- global log ---\n{}", g.log());
    }
    drop(g);
    drop(domains);
    r
}

// ----- the run -----------------------------------------------------------------------

pub fn run(a: &ClusterArgs) -> anyhow::Result<Report> {
    #[cfg(not(feature = "etcd"))]
    {
        let _ = a;
        bail!("this flowgate was built without the `etcd` feature: bench cluster needs it")
    }
    #[cfg(feature = "etcd")]
    {
        use flowgate_coord::process::{EtcdCluster, etcd_available, etcd_binary};
        if !etcd_available() {
            bail!(
                "no etcd binary ({}): apt-get install etcd-server, or set FLOWGATE_ETCD",
                etcd_binary()
            );
        }
        let etcd_version = Command::new(etcd_binary())
            .arg("--version")
            .output()
            .ok()
            .and_then(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .next()
                    .map(|l| l.trim().to_string())
            })
            .unwrap_or_else(|| "etcd ?".into());
        let etcd = EtcdCluster::start("bench-cluster", 1).context("start etcd")?;
        // One thread for the emulated switches, as `bench controller`.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let setup = if a.skip_setup {
            Vec::new()
        } else {
            setup_runs(a, &etcd.toml_endpoints(), &rt)?
        };
        let mut spills = Vec::new();
        if !a.skip_spill {
            for t in 1..=a.spills {
                spills.push(
                    spill_trial(a, t, &etcd.endpoints(), &etcd.toml_endpoints(), &rt)
                        .map_err(|e| format!("{e:#}")),
                );
            }
        }
        Ok(Report {
            setup,
            spills,
            etcd_version,
        })
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The flow-setup table: every run, then domain ÷ single per pair and overall (medians).
pub fn setup_table(r: &Report) -> Table {
    let mut t = Table::new(&[
        "mode",
        "run",
        "load",
        "setups/s avg (min–max)",
        "p50 µs",
        "p99 µs",
        "valid / invalid / lost",
    ]);
    for (mode, run, x) in &r.setup {
        t.row(vec![
            mode.clone(),
            run.to_string(),
            format!("{}, {} switches", x.pace, x.switches),
            format!(
                "{} ({}–{})",
                fmt_rate(x.avg),
                fmt_rate(x.min),
                fmt_rate(x.max)
            ),
            x.p50_us.to_string(),
            x.p99_us.to_string(),
            format!("{} / {} / {}", x.valid, x.invalid, x.lost),
        ]);
    }
    let mut ratios: BTreeMap<usize, (Option<&RunResult>, Option<&RunResult>)> = BTreeMap::new();
    for (mode, run, x) in &r.setup {
        let e = ratios.entry(*run).or_default();
        if mode == "single" {
            e.0 = Some(x);
        } else {
            e.1 = Some(x);
        }
    }
    let (mut rs, mut p50s, mut p99s) = (Vec::new(), Vec::new(), Vec::new());
    for (run, (s, d)) in &ratios {
        if let (Some(s), Some(d)) = (s, d)
            && s.avg > 0.0
            && s.p50_us > 0
            && s.p99_us > 0
        {
            let (a, b, c) = (
                d.avg / s.avg,
                d.p50_us as f64 / s.p50_us as f64,
                d.p99_us as f64 / s.p99_us as f64,
            );
            rs.push(a);
            p50s.push(b);
            p99s.push(c);
            t.row(vec![
                "domain ÷ single".into(),
                run.to_string(),
                String::new(),
                format!("{a:.2}×"),
                format!("{b:.2}×"),
                format!("{c:.2}×"),
                String::new(),
            ]);
        }
    }
    if rs.len() > 1 {
        t.row(vec![
            "domain ÷ single, median".into(),
            "all".into(),
            String::new(),
            format!("{:.2}×", median(rs)),
            format!("{:.2}×", median(p50s)),
            format!("{:.2}×", median(p99s)),
            String::new(),
        ]);
    }
    t
}

pub fn spill_table(r: &Report) -> Table {
    let mut t = Table::new(&[
        "trial",
        "load start → overloaded summary (ms)",
        "→ decision in etcd (ms)",
        "→ first FLOW_MOD to d2's backend (ms)",
        "spill latency: overloaded summary → FLOW_MOD (ms)",
        "load start → FLOW_MOD (ms)",
        "fraction first → last",
        "d1 answers local / remote",
        "valid / invalid / lost",
    ]);
    for (i, s) in r.spills.iter().enumerate() {
        match s {
            Ok(s) => t.row(vec![
                (i + 1).to_string(),
                format!("{:.0}", s.to_overloaded_summary_ms),
                format!("{:.0}", s.to_decision_ms),
                format!("{:.0}", s.to_remote_flow_mod_ms),
                format!("{:.0}", s.spill_latency_ms),
                format!("{:.0}", s.from_load_start_ms),
                format!("{} → {}", s.first_fraction, s.last_fraction),
                format!("{} / {}", s.local_answers, s.remote_answers),
                format!("{} / {} / {}", s.valid, s.invalid, s.lost),
            ]),
            Err(e) => {
                let mut row = vec![(i + 1).to_string(), format!("failed: {e}")];
                row.resize(9, String::new());
                t.row(row);
            }
        }
    }
    let ok: Vec<&SpillTrial> = r.spills.iter().filter_map(|s| s.as_ref().ok()).collect();
    if ok.len() > 1 {
        let med =
            |f: fn(&SpillTrial) -> f64| format!("{:.0}", median(ok.iter().map(|s| f(s)).collect()));
        t.row(vec![
            "median".into(),
            med(|s| s.to_overloaded_summary_ms),
            med(|s| s.to_decision_ms),
            med(|s| s.to_remote_flow_mod_ms),
            med(|s| s.spill_latency_ms),
            med(|s| s.from_load_start_ms),
            String::new(),
            String::new(),
            String::new(),
        ]);
    }
    t
}

/// The Markdown body of the report.
pub fn body(a: &ClusterArgs, r: &Report) -> String {
    let mut b = String::new();
    b += &format!("etcd: {} (one member on loopback)\n\n", r.etcd_version);
    if !r.setup.is_empty() {
        b += &format!(
            "### Flow setup: domain mode vs single mode (same emulated switches, same run)\n\n\
             The domain instance is elected MASTER through etcd (ROLE_REQUEST with its generation) and \
             publishes its summary / reads its spill every {} ms during the run; no standby is connected.\n\n",
            a.summary_interval_ms
        );
        b += &setup_table(r).markdown();
        for (mode, run, x) in &r.setup {
            if !x.invalid_samples.is_empty() || !x.errors.is_empty() {
                b += &format!(
                    "\n{mode} run {run}: invalid answers {:?}, switch errors {:?}\n",
                    x.invalid_samples, x.errors
                );
            }
        }
    }
    if !r.spills.is_empty() {
        b += &format!(
            "\n### Spill latency\n\nTwo domains (one emulated switch, one local backend each) and a global \
             controller; d1's capacity {} new connections/s (`threshold_rps` × 1 backend), its switch \
             sends SYNs at {} /s from the load start; `summary_interval_ms` = {}. etcd polled every 10 ms; \
             the FLOW_MOD is the first complete answer (forward and reverse rule, PACKET_OUT) that rewrites \
             to d2's backend out of d1's uplink, as the emulated switch saw it.\n\n",
            fmt_rate(a.capacity_rps),
            fmt_rate(a.capacity_rps * a.overload),
            a.summary_interval_ms
        );
        b += &spill_table(r).markdown();
        for s in r.spills.iter().flatten() {
            if !s.invalid_samples.is_empty() {
                b += &format!(
                    "\nInvalid answers in a spill trial: {:?}\n",
                    s.invalid_samples
                );
            }
        }
    }
    b
}
