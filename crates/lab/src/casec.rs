//! Case C: the paper's distributed control. Four sub-networks L_d1..L_d4, each one switch
//! with its clients and one HTTP server, joined by an inter-domain fabric (a fifth bridge,
//! `NORMAL`, one patch uplink per domain, as `ovs_four_domains_spill_through_global` in
//! `crates/flowgate/tests/distributed.rs`). Each domain has its own controller process
//! (role `domain`, ISSLM, C_d1..C_d4); two controller processes of role `global` (C_p1
//! active, C_p2 standby) decide where an overloaded domain spills; a one-node etcd started
//! here holds their state. Every domain's clients address the service VIP `100.0.0.100`;
//! the service lists all four servers (shared pool), each domain serves locally and
//! spills only when the active global controller says so.
//!
//! Load follows the paper's proportions: C_d1 and C_d3 carry 6000 requests each, C_d2 and
//! C_d4 4000 each (heavy, full variant: 20,000 in 10 s in all, as Cases A, B and D);
//! the normal phase and `--quick` keep the 6:4:6:4 split. Each domain is measured like a
//! Case B arm: iperf3 from its server to its first client (B_d(max), T_h, D_Transfer),
//! ping from its second client to its server, the HTTP load of its own clients.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, anyhow, bail};
use flowgate_coord::process::EtcdCluster;
use flowgate_testbed::netns::HostOptions;
use flowgate_testbed::{Bridge, Host, Link, LinkKind, ProcGuard};
use indicatif::ProgressBar;
use rand::SeedableRng;
use rand::rngs::SmallRng;

use crate::ctl::{Controller, LISTEN_ANY_PORT, http_get};
use crate::failover::{self, Failover, Killer};
use crate::measure::{self, Interval, Probe, Row};
use crate::net::{IPERF_PORT, SERVERS, client_ip, spawn_httpd, spawn_iperf_server, wait_httpd};
use crate::scenario::{Params, Scenario};

/// The service's virtual address (every client's destination).
pub const VIP: Ipv4Addr = Ipv4Addr::new(100, 0, 0, 100);
/// The paper's per-domain request counts (C_d1..C_d4), as weights of the total.
pub const SPLIT: [u64; 4] = [6000, 4000, 6000, 4000];

/// Requests of each domain in a phase of `total` requests (6:4:6:4, rounded, summing to
/// `total`).
pub fn split(total: u64) -> [u64; 4] {
    let sum: u64 = SPLIT.iter().sum();
    let mut out = [0u64; 4];
    for (i, w) in SPLIT.iter().enumerate() {
        out[i] = total * w / sum;
    }
    let rest = total - out.iter().sum::<u64>();
    out[0] += rest;
    out
}

/// Clients of each domain: `n` dealt out in order, the first domains getting the extra.
pub fn clients_per_domain(n: usize) -> [usize; 4] {
    let mut out = [n / 4; 4];
    // The heavier domains (C_d1, C_d3) first.
    for d in [0, 2, 1, 3].into_iter().take(n % 4) {
        out[d] += 1;
    }
    out
}

/// The four-domain network. Field order is drop order.
#[derive(Debug)]
pub struct DomainNet {
    /// httpd and iperf3 on every server.
    pub procs: Vec<ProcGuard>,
    /// Clients of each domain.
    pub clients: Vec<Vec<Host>>,
    /// Server of each domain (server d has 100.0.0.d).
    pub servers: Vec<Host>,
    /// Uplinks s_d – fabric.
    pub links: Vec<Link>,
    /// s1..s4.
    pub bridges: Vec<Bridge>,
    /// The fabric bridge (NORMAL).
    pub fabric: Option<Bridge>,
    /// Each domain's uplink port on its switch.
    pub uplinks: Vec<u32>,
}

impl DomainNet {
    /// Builds the network. Its switches have no controller yet: [`run`] gives each its
    /// own once that controller is up.
    fn build(prefix: &str, p: &Params, step: impl Fn(&str)) -> Result<Self> {
        let mut net = DomainNet {
            procs: Vec::new(),
            clients: Vec::new(),
            servers: Vec::new(),
            links: Vec::new(),
            bridges: Vec::new(),
            fabric: None,
            uplinks: Vec::new(),
        };
        let fabric = Bridge::create(&format!("{prefix}f0"), 0xf0, &[]).context("fabric")?;
        fabric.add_flow("actions=NORMAL")?;
        for d in 0..SERVERS.len() {
            step(&format!("switch s{}", d + 1));
            let br = Bridge::create(&format!("{prefix}s{}", d + 1), d as u64 + 1, &[])
                .context("bridge")?;
            let link = Link::create(
                LinkKind::Patch,
                &br,
                &format!("{prefix}u{}", d + 1),
                &fabric,
                &format!("{prefix}f{}", d + 1),
            )
            .context("uplink")?;
            net.uplinks.push(link.a.ofport);
            net.links.push(link);
            net.bridges.push(br);
            crate::signal::check()?;
        }
        net.fabric = Some(fabric);
        for (d, ip) in SERVERS.iter().enumerate() {
            step(&format!("server sv{} {ip}", d + 1));
            let opts = HostOptions {
                mac: Some(format!("00:00:00:00:01:{:02x}", d + 1)),
                ..HostOptions::default()
            };
            net.servers.push(
                Host::create_with(
                    prefix,
                    &format!("sv{}", d + 1),
                    &format!("{ip}/24"),
                    &net.bridges[d],
                    &opts,
                )
                .context("server host")?,
            );
            crate::signal::check()?;
        }
        let mut i = 0usize;
        for (d, n) in clients_per_domain(p.clients).iter().enumerate() {
            let mut hs = Vec::new();
            for _ in 0..*n {
                step(&format!("client h{} {} (d{})", i + 1, client_ip(i), d + 1));
                let opts = HostOptions {
                    mac: Some(format!("00:00:00:00:02:{:02x}", i + 1)),
                    ..HostOptions::default()
                };
                hs.push(
                    Host::create_with(
                        prefix,
                        &format!("h{}", i + 1),
                        &format!("{}/24", client_ip(i)),
                        &net.bridges[d],
                        &opts,
                    )
                    .context("client host")?,
                );
                i += 1;
                crate::signal::check()?;
            }
            net.clients.push(hs);
        }
        Ok(net)
    }

    /// Starts `flowgate httpd` (the capacity model of `p`) and iperf3 on every server.
    fn start_servers(&mut self, p: &Params, flowgate: &Path) -> Result<()> {
        for (i, h) in self.servers.iter().enumerate() {
            let name = format!("srv{}", i + 1);
            self.procs.push(spawn_httpd(
                flowgate,
                h,
                &name,
                p.server_delay_ms,
                p.server_concurrency as u64,
                p.server_queue as u64,
            )?);
            self.procs.push(spawn_iperf_server(h)?);
        }
        wait_httpd(&self.servers)
    }
}

/// A domain controller's config.
fn domain_config(d: usize, uplink: u32, p: &Params, seed: u64, etcd: &str) -> String {
    let mut c = format!(
        "{LISTEN_ANY_PORT}\
[controller]\nidle_timeout_secs = 10\nseed = {seed}\n\n\
[[service]]\nname = \"web\"\nvip = \"{VIP}\"\nport = 80\nalgorithm = \"isslm\"\nthreshold_rps = {:.1}\n\
\n[service.health]\nkind = \"none\"\n",
        p.threshold_rps()
    );
    for s in SERVERS {
        c += &format!("\n[[service.backend]]\naddress = \"{s}\"\n");
    }
    c += &cluster_section("domain", &format!("d{}", d + 1), etcd);
    c += &format!(
        "domain = \"d{}\"\ndpids = [\"{:016x}\"]\nuplink = \"{:016x}:{uplink}\"\n",
        d + 1,
        d + 1,
        d + 1
    );
    c
}

fn cluster_section(role: &str, instance: &str, etcd: &str) -> String {
    format!(
        "\n[cluster]\nrole = \"{role}\"\nname = \"lab\"\ninstance = \"{instance}\"\netcd = {etcd}\nlease_ttl_ms = 2000\nsummary_interval_ms = 200\n"
    )
}

fn global_config(instance: &str, etcd: &str) -> String {
    LISTEN_ANY_PORT.to_owned() + &cluster_section("global", instance, etcd)
}

fn cluster_view(c: &Controller) -> serde_json::Value {
    http_get(c.api, "/api/v1/cluster")
        .ok()
        .and_then(|b| serde_json::from_str(&b).ok())
        .unwrap_or(serde_json::Value::Null)
}

fn wait_for(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) -> Result<()> {
    let deadline = Instant::now() + timeout;
    while !f() {
        if Instant::now() > deadline {
            bail!("{what}: not within {timeout:?}");
        }
        crate::signal::sleep(Duration::from_millis(100))?;
    }
    Ok(())
}

/// Located, and weighted as local: a domain sets its backends' weights on its next work
/// tick after locating them, and until then a new connection finds no weighted backend.
fn located(c: &Controller, addr: Ipv4Addr) -> bool {
    let Ok(v) = c.services() else { return false };
    v.as_array()
        .into_iter()
        .flatten()
        .flat_map(|s| s["backends"].as_array().cloned().unwrap_or_default())
        .any(|b| {
            b["address"] == addr.to_string()
                && b["located"] == true
                && b["effective_weight"].as_f64().is_some_and(|w| w > 0.0)
        })
}

/// What a Case C run leaves beside its rows: iperf3 intervals per series, and notes
/// (spill decisions seen) for the Markdown.
pub struct CaseCOut {
    pub rows: Vec<Row>,
    pub iperf: Vec<(String, Vec<Interval>)>,
    pub notes: Vec<String>,
    /// The failover phase's findings (`--failover`).
    pub failover: Option<Failover>,
}

/// Runs Case C: builds everything, measures normal then heavy (then, `with_failover`, the
/// heavy load again with C_p1 killed: [`failover`]), removes everything.
#[allow(clippy::too_many_arguments)]
pub fn run(
    flowgate: &Path,
    sc: &Scenario,
    p: &Params,
    prefix: &str,
    (seed, with_failover): (u64, bool),
    logs: &Path,
    pb: &ProgressBar,
) -> Result<CaseCOut> {
    let say = |l: String| {
        if pb.is_hidden() {
            eprintln!("{l}");
        } else {
            pb.println(l);
        }
    };
    pb.set_message("etcd (one node)");
    let etcd = EtcdCluster::start(&format!("lab-{prefix}"), 1).map_err(|e| anyhow!("etcd: {e}"))?;
    let endpoints = etcd.toml_endpoints();
    crate::signal::check()?;
    pb.set_message("building the four domains");
    let mut net = DomainNet::build(prefix, p, |w| {
        pb.set_message(format!("building the network: {w}"))
    })?;
    pb.inc(1);
    // Each config needs its domain's uplink port, so the controllers start once the network
    // stands, and the switches learn their controller's port from its ready file.
    let mut domains: Vec<Controller> = Vec::new();
    for (d, uplink) in net.uplinks.iter().enumerate() {
        pb.set_message(format!("domain controller C_d{}", d + 1));
        let cfg = domain_config(d, *uplink, p, seed, &endpoints);
        let c = Controller::start(flowgate, logs, &format!("{}-d{}", sc.name, d + 1), &cfg)?;
        net.bridges[d].set_controller(&[c.target()])?;
        domains.push(c);
    }
    let result = (|| -> Result<CaseCOut> {
        for (d, c) in domains.iter().enumerate() {
            net.bridges[d].wait_connected(Duration::from_secs(20))?;
            let key = format!("{:016x}", d + 1);
            wait_for(
                &format!("C_d{} masters s{}", d + 1, d + 1),
                Duration::from_secs(20),
                || cluster_view(c)["switches"][&key]["role"] == "master",
            )?;
        }
        pb.set_message("servers");
        net.start_servers(p, flowgate)?;
        for (d, c) in domains.iter().enumerate() {
            // Each domain locates its own server (ARP from the server's namespace).
            let _ = net.servers[d].spawn(&["ping", "-n", "-c", "1", "-w", "1", "100.0.0.254"]);
            wait_for(
                &format!("C_d{} locates server {}", d + 1, SERVERS[d]),
                Duration::from_secs(30),
                || located(c, SERVERS[d]),
            )?;
        }
        pb.set_message("global controllers C_p1, C_p2");
        let g1 = Controller::start(
            flowgate,
            logs,
            &format!("{}-p1", sc.name),
            &global_config("p1", &endpoints),
        )?;
        wait_for("C_p1 active", Duration::from_secs(15), || {
            cluster_view(&g1)["mastership"] == "master"
        })?;
        let g2 = Controller::start(
            flowgate,
            logs,
            &format!("{}-p2", sc.name),
            &global_config("p2", &endpoints),
        )?;
        warm_up(&net)?;
        pb.inc(1);
        let mut out = CaseCOut {
            rows: Vec::new(),
            iperf: Vec::new(),
            notes: Vec::new(),
            failover: None,
        };
        let mut normal: Vec<Row> = Vec::new();
        let mut phases = vec![
            ("normal", p.normal_requests, p.normal_secs),
            ("heavy", p.heavy_requests, p.heavy_secs),
        ];
        if with_failover {
            phases.push(("failover", p.heavy_requests, p.heavy_secs));
        }
        for (phase, total, secs) in phases {
            signal_settle(p)?;
            let per = split(total);
            pb.set_message(format!(
                "{phase} phase: {per:?} requests in {secs} s (C_d1..C_d4)"
            ));
            let fresh_rows = || -> Vec<Row> {
                (0..4)
                    .map(|d| Row {
                        scenario: sc.name.to_owned(),
                        arm: sc.arms[d].label.to_owned(),
                        case: sc.arms[d].case.to_owned(),
                        algorithm: sc.arms[d].algorithm.to_owned(),
                        phase: phase.to_owned(),
                        offered: per[d],
                        duration_s: secs,
                        ..Row::default()
                    })
                    .collect()
            };
            let snapshots =
                || -> Result<Vec<_>> { domains.iter().map(Controller::snapshot).collect() };
            let mut rows = fresh_rows();
            let before = snapshots()?;
            let phase_start = before.clone();
            let apis: Vec<_> = domains.iter().map(|c| c.api).collect();
            let mon = Monitor::start(apis);
            // The same seed for the same total: the failover phase's passes replay the
            // heavy phase's load.
            let pass_seed = seed.wrapping_mul(31).wrapping_add(total);
            // Every request of each domain, one file per domain and pass (see
            // `measure::wait_loads`).
            let requests_logs = |pass: u8| -> [PathBuf; 4] {
                std::array::from_fn(|d| {
                    logs.join(format!(
                        "requests-{}-d{}-{phase}-{pass}.txt",
                        sc.name,
                        d + 1
                    ))
                })
            };
            // The phase's first pass: HTTP and ping.
            let ping_pass = |pass: u8, rows: &mut [Row]| {
                run_pass(
                    &net,
                    flowgate,
                    &per,
                    secs,
                    p,
                    (pass_seed, Probe::Ping, &requests_logs(pass)),
                    rows,
                )
                .map(|(_, started)| started)
            };
            // The failover phase's first pass is its control: the same load, nothing
            // killed, after a heavy pass as its second pass is.
            let started = ping_pass(1, &mut rows)?;
            let after = snapshots()?;
            if phase == "failover" {
                signal_settle(p)?;
                pb.set_message(format!(
                    "{phase} phase again, C_p1 killed {:.1} s in",
                    secs * failover::KILL_AT
                ));
                // Its rows are the second pass's; its one pass with C_p1 killed (an
                // iperf3 pass would measure a cluster that had already failed over).
                let mut rows = fresh_rows();
                let before = snapshots()?;
                let killer = Killer::start(
                    g1.pid(),
                    Duration::from_secs_f64(secs * failover::KILL_AT),
                    g2.api,
                );
                let kill_started = ping_pass(2, &mut rows)?;
                let after = snapshots()?;
                let kill = killer.join()?;
                let seen = mon.stop();
                let f = measure_failover(
                    kill,
                    &seen,
                    secs,
                    (started, &requests_logs(1)),
                    (kill_started, &requests_logs(2)),
                )?;
                say(format!(
                    "  C_p1 killed {:.2} s in; C_p2 active after {} ms; spilling at the kill {:?}, dropped {:?}",
                    f.killed_at_s,
                    f.takeover_ms
                        .map_or_else(|| "no takeover in 15 s".to_owned(), |ms| ms.to_string()),
                    f.spilling_at_kill,
                    f.spill_dropped
                ));
                for (d, r) in rows.iter_mut().enumerate() {
                    r.set_controller_counts(&before[d], &after[d]);
                    r.derive(baseline(&normal, d, p.shared_normal_qos));
                    say(row_line(r));
                }
                let mut all = aggregate(&rows);
                all.derive(normal.get(4));
                rows.push(all);
                let outliers = outlier_counts(&phase_start, &after);
                out.notes.push(spill_note(
                    phase,
                    "both passes",
                    &seen.domains,
                    &outliers,
                    p,
                ));
                out.rows.extend(rows);
                out.failover = Some(f);
                pb.inc(1);
                continue;
            }
            signal_settle(p)?;
            pb.set_message(format!("{phase} phase again with iperf3 in every domain"));
            let mut qos: Vec<Row> = (0..4).map(|_| Row::default()).collect();
            let (extra, _) = run_pass(
                &net,
                flowgate,
                &per,
                secs,
                p,
                (pass_seed, Probe::Iperf, &requests_logs(2)),
                &mut qos,
            )?;
            for d in 0..4 {
                let r = &mut rows[d];
                r.iperf_bytes = qos[d].iperf_bytes;
                r.iperf_secs = qos[d].iperf_secs;
                r.iperf_max_bps = qos[d].iperf_max_bps;
                r.qos_pass_ok = qos[d].ok;
                let (a, b) = (&after[d], &before[d]);
                r.set_controller_counts(b, a);
                r.derive(baseline(&normal, d, p.shared_normal_qos));
                say(row_line(r));
                out.iperf
                    .push((format!("{} {phase}", r.arm), extra[d].clone()));
            }
            let mut all = aggregate(&rows);
            all.derive(normal.get(4));
            rows.push(all);
            let seen = mon.stop();
            let outliers = outlier_counts(&phase_start, &snapshots()?);
            let spill_line = spill_note(phase, "both passes", &seen.domains, &outliers, p);
            say(format!("  {spill_line}"));
            out.notes.push(spill_line);
            if phase == "normal" {
                normal = rows.clone();
            }
            out.rows.extend(rows);
            pb.inc(1);
        }
        let gv = [cluster_view(&g1), cluster_view(&g2)];
        out.notes.push(format!(
            "global controllers at the end: C_p1 {}, C_p2 {}",
            if out.failover.is_some() {
                "killed".to_owned()
            } else {
                gv[0]["mastership"].to_string()
            },
            gv[1]["mastership"]
        ));
        let saved = [(&g1, "p1"), (&g2, "p2")]
            .map(|(g, name)| (g, g.save_log(logs, &format!("{}-{name}", sc.name))));
        for (c, log) in saved {
            if c.output().contains("panicked") {
                bail!("a global controller panicked; see {}", log.display());
            }
        }
        Ok(out)
    })();
    let saved: Vec<std::path::PathBuf> = domains
        .iter()
        .enumerate()
        .map(|(d, c)| c.save_log(logs, &format!("{}-d{}", sc.name, d + 1)))
        .collect();
    let panicked = domains
        .iter()
        .zip(&saved)
        .find(|(c, _)| c.output().contains("panicked"));
    if let (Ok(_), Some((_, log))) = (&result, panicked) {
        bail!("a domain controller panicked; see {}", log.display());
    }
    if result.is_err() {
        let _ = std::fs::write(logs.join(format!("{}-etcd.log", sc.name)), etcd.logs());
    }
    pb.set_message("removing the network, controllers and etcd");
    drop(domains);
    drop(net);
    drop(etcd);
    result
}

/// A domain's row as the terminal shows it while the run goes on.
fn row_line(r: &Row) -> String {
    format!(
        "  {} {:<8} ok {:>6}/{:<6} ok/s {:>7.1}  srv1..4 {:?}  B_d(max) {} Gb/s  RTT {} ms",
        r.arm,
        r.phase,
        r.ok,
        r.offered,
        r.ok_rps,
        r.shares(),
        crate::report::fmt(r.bdmax_gbps, 3),
        crate::report::fmt(r.ping_rtt_avg_ms, 3)
    )
}

/// Each domain's ejections, panics (its pool's ejections waived) and silences excused (its
/// server answered a later connection; a switch behind) between two sets of snapshots.
fn outlier_counts(
    before: &[crate::ctl::Snapshot],
    after: &[crate::ctl::Snapshot],
) -> Vec<[u64; 4]> {
    before
        .iter()
        .zip(after)
        .map(|(b, a)| {
            [
                a.ejections.saturating_sub(b.ejections),
                a.panics.saturating_sub(b.panics),
                a.silences_excused[0].saturating_sub(b.silences_excused[0]),
                a.silences_excused[1].saturating_sub(b.silences_excused[1]),
            ]
        })
        .collect()
}

/// The Markdown's line on what the domains reported during a phase.
fn spill_note(
    phase: &str,
    passes: &str,
    seen: &[(f64, bool, serde_json::Value)],
    outliers: &[[u64; 4]],
    p: &Params,
) -> String {
    format!(
        "{phase} ({passes}): peak demand seen by C_d1..C_d4 {:?} req/s against a spill threshold of {:.0} req/s each (threshold_rps × 1 local server); spill in force at some sample: {:?}; ejections / panics (a pool's ejections waived) / silences excused as answered later / as a switch behind by C_d1..C_d4 {:?}; last spill decisions {:?}",
        seen.iter().map(|s| s.0.round()).collect::<Vec<_>>(),
        p.threshold_rps(),
        seen.iter().map(|s| s.1).collect::<Vec<_>>(),
        outliers
            .iter()
            .map(|[e, w, a, x]| format!("{e}/{w}/{a}/{x}"))
            .collect::<Vec<_>>(),
        seen.iter().map(|s| s.2.to_string()).collect::<Vec<_>>(),
    )
}

/// The failover phase's findings: the kill and takeover against its pass's start, the
/// spills across the gap, and the requests in each window beside the control pass's.
/// Each pass is given by when it began and its request logs.
fn measure_failover(
    kill: failover::Kill,
    seen: &Seen,
    secs: f64,
    control: (SystemTime, &[PathBuf; 4]),
    (started, logs): (SystemTime, &[PathBuf; 4]),
) -> Result<Failover> {
    let unix = |t: SystemTime| failover::unix_ms(t) as f64 / 1000.0;
    let killed_at_s = kill.killed_unix_ms as f64 / 1000.0 - unix(started);
    let takeover_ms = kill
        .takeover_unix_ms
        .map(|t| t.saturating_sub(kill.killed_unix_ms));
    let until = kill.takeover_unix_ms.map_or_else(
        || failover::unix_ms(started) + (secs * 1000.0) as u64,
        |t| t + failover::HELD_AFTER_MS,
    );
    let (spilling_at_kill, spill_dropped, samples_in_gap) =
        failover::spills_across(&seen.timeline, kill.killed_unix_ms, until);
    let bounds = failover::bounds(killed_at_s, takeover_ms, secs);
    let mut windows = Vec::new();
    for (pass, (start, files)) in [("control", control), ("failover", (started, logs))] {
        let mut requests = Vec::new();
        for (d, f) in files.iter().enumerate() {
            let text =
                std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
            requests.extend(
                failover::parse_requests(&text, &format!("srv{}", d + 1))
                    .with_context(|| f.display().to_string())?,
            );
        }
        windows.extend(failover::windows(pass, &requests, unix(start), &bounds));
    }
    Ok(Failover {
        killed_at_s,
        takeover_ms,
        spilling_at_kill,
        spill_dropped,
        samples_in_gap,
        windows,
    })
}

/// Samples every domain controller every 250 ms while a phase runs: its demand (the sum
/// of its backends' `rps`, what its summary reports) and whether a spill is in force.
struct Monitor {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    handle: Option<std::thread::JoinHandle<Seen>>,
}

/// What a [`Monitor`] saw.
#[derive(Default)]
struct Seen {
    /// Per domain: its peak demand (req/s), whether a spill was in force at some sample,
    /// and its last spill decision (the last one in force, if any was).
    domains: Vec<(f64, bool, serde_json::Value)>,
    /// Every sample's time and spills.
    timeline: Vec<failover::SpillSample>,
}

impl Monitor {
    fn start(apis: Vec<std::net::SocketAddr>) -> Monitor {
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::spawn(move || {
            let mut seen = Seen {
                domains: vec![(0.0, false, serde_json::Value::Null); apis.len()],
                timeline: Vec::new(),
            };
            while !flag.load(Ordering::SeqCst) {
                let mut now = Vec::with_capacity(apis.len());
                for (i, api) in apis.iter().enumerate() {
                    let get = |path: &str| {
                        http_get(*api, path)
                            .ok()
                            .and_then(|b| serde_json::from_str::<serde_json::Value>(&b).ok())
                            .unwrap_or(serde_json::Value::Null)
                    };
                    let load: f64 = get("/api/v1/services")
                        .as_array()
                        .into_iter()
                        .flatten()
                        .flat_map(|s| s["backends"].as_array().cloned().unwrap_or_default())
                        .map(|b| b["rps"].as_f64().unwrap_or(0.0))
                        .sum();
                    let v = get("/api/v1/cluster");
                    let spilling = v["spill"]["services"]
                        .as_object()
                        .is_some_and(|m| !m.is_empty());
                    let s = &mut seen.domains[i];
                    s.0 = s.0.max(load);
                    s.1 |= spilling;
                    if spilling || s.2.is_null() {
                        s.2 = v["spill"].clone();
                    }
                    now.push(spilling);
                }
                seen.timeline
                    .push((failover::unix_ms(SystemTime::now()), now));
                std::thread::sleep(Duration::from_millis(250));
            }
            seen
        });
        Monitor {
            stop,
            handle: Some(handle),
        }
    }

    fn stop(mut self) -> Seen {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        self.handle
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The normal-load baseline of domain `d`'s heavy row (Eqs. 2, 3, 6): with `shared`, the
/// normal `all` row (index 4), one baseline for every domain as the paper's Table 7 has
/// (its single "normal conditions" figures); else the domain's own normal row.
pub fn baseline(normal: &[Row], d: usize, shared: bool) -> Option<&Row> {
    normal.get(if shared { 4 } else { d })
}

/// The row `all`: the four domains together. HTTP counts, per-server responses and
/// controller picks are sums (so shares and Jain are over the whole network, as in Case
/// B), as are passive outlier detection's counts; latency percentiles are over all the
/// domains' ok requests together; the iperf3 and ping figures are the mean of the
/// domains' that were measured (one sub-network on average), missing when none was.
pub fn aggregate(rows: &[Row]) -> Row {
    let mut a = Row {
        scenario: rows.first().map(|r| r.scenario.clone()).unwrap_or_default(),
        arm: "all".to_owned(),
        case: "C".to_owned(),
        algorithm: "isslm".to_owned(),
        phase: rows.first().map(|r| r.phase.clone()).unwrap_or_default(),
        duration_s: rows.first().map_or(0.0, |r| r.duration_s),
        syn_retransmits: Some(0),
        ..Row::default()
    };
    for r in rows {
        a.offered += r.offered;
        a.clients_used += r.clients_used;
        a.clients_failed += r.clients_failed;
        a.wall_s = a.wall_s.max(r.wall_s);
        a.sent += r.sent;
        a.ok += r.ok;
        a.failed += r.failed;
        a.http_503 += r.http_503;
        a.timeouts += r.timeouts;
        // Missing in one domain: missing in all of them.
        a.syn_retransmits = a.syn_retransmits.zip(r.syn_retransmits).map(|(x, y)| x + y);
        a.ok_latencies_ms.extend_from_slice(&r.ok_latencies_ms);
        a.srv1 += r.srv1;
        a.srv2 += r.srv2;
        a.srv3 += r.srv3;
        a.srv4 += r.srv4;
        a.ctl_srv1 += r.ctl_srv1;
        a.ctl_srv2 += r.ctl_srv2;
        a.ctl_srv3 += r.ctl_srv3;
        a.ctl_srv4 += r.ctl_srv4;
        a.no_optimal_server += r.no_optimal_server;
        a.moved_by_load += r.moved_by_load;
        a.moved_by_conns += r.moved_by_conns;
        a.moved_by_rt += r.moved_by_rt;
        a.ejections += r.ejections;
        a.panics += r.panics;
        a.excused_answered_later += r.excused_answered_later;
        a.excused_switch_behind += r.excused_switch_behind;
        a.outcomes_answered += r.outcomes_answered;
        a.outcomes_unanswered += r.outcomes_unanswered;
        a.outcomes_unjudged += r.outcomes_unjudged;
        a.redispatched += r.redispatched;
        a.qos_pass_ok += r.qos_pass_ok;
    }
    measure::set_percentiles(&mut a);
    // Only the domains where iperf3 gave a result: its three figures come together.
    let iperf: Vec<&Row> = rows.iter().filter(|r| r.iperf_max_bps.is_some()).collect();
    let mean = |v: Vec<f64>| (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64);
    a.iperf_max_bps = mean(iperf.iter().filter_map(|r| r.iperf_max_bps).collect());
    a.iperf_secs = mean(iperf.iter().filter_map(|r| r.iperf_secs).collect());
    a.iperf_bytes = mean(
        iperf
            .iter()
            .filter_map(|r| r.iperf_bytes.map(|b| b as f64))
            .collect(),
    )
    .map(|b| b.round() as u64);
    // RTT and loss each over the domains that have it (no reply: a loss, but no RTT).
    a.ping_rtt_avg_ms = mean(rows.iter().filter_map(|r| r.ping_rtt_avg_ms).collect());
    a.ping_loss_pct = mean(rows.iter().filter_map(|r| r.ping_loss_pct).collect());
    a
}

fn signal_settle(p: &Params) -> Result<()> {
    crate::signal::sleep(Duration::from_secs_f64(p.settle_secs))
}

/// Every client pings its domain's server and the VIP (ARP and L2 rules in place before
/// the measured phases).
fn warm_up(net: &DomainNet) -> Result<()> {
    let mut pings = Vec::new();
    let vip = VIP.to_string();
    for (d, hs) in net.clients.iter().enumerate() {
        let dst = SERVERS[d].to_string();
        for h in hs {
            pings.push(h.spawn(&["ping", "-n", "-c", "2", "-i", "0.2", "-w", "3", &dst])?);
            // Resolves the VIP (the controller answers its ARP); the echo itself may go
            // unanswered.
            pings.push(h.spawn(&["ping", "-n", "-c", "1", "-w", "2", &vip])?);
        }
    }
    for mut g in pings {
        let _ = g.wait_timeout(Duration::from_secs(5))?;
    }
    Ok(())
}

/// One pass of one phase in all four domains at once: each domain's HTTP load from its
/// own clients to the VIP, and (pass 1) ping or (pass 2) iperf3 within each domain. The
/// clients are drawn by `seed`; each domain's requests are written to its file of
/// `requests_logs`. Returns each domain's iperf3 intervals and when the pass began.
fn run_pass(
    net: &DomainNet,
    flowgate: &Path,
    per: &[u64; 4],
    secs: f64,
    p: &Params,
    (seed, probe, requests_logs): (u64, Probe, &[PathBuf; 4]),
    rows: &mut [Row],
) -> Result<(Vec<Vec<Interval>>, SystemTime)> {
    let t_int = secs.ceil().max(1.0) as u64;
    let t = t_int.to_string();
    let port = IPERF_PORT.to_string();
    let mut probes = Vec::new();
    for (server, hs) in SERVERS.iter().zip(&net.clients) {
        let dst = server.to_string();
        let g = match probe {
            Probe::Iperf => hs[0].spawn(&measure::iperf_client_argv(&dst, &port, &t))?,
            Probe::Ping => hs
                .get(1)
                .unwrap_or(&hs[0])
                .spawn(&["ping", "-n", "-i", "0.2", "-w", &t, &dst])?,
        };
        probes.push(g);
    }
    let url = format!("http://{VIP}/");
    let started = Instant::now();
    let started_at = SystemTime::now();
    let mut loads: Vec<Vec<measure::LoadClient>> = Vec::new();
    let mut counts_all = Vec::new();
    for d in 0..4 {
        let mut rng = SmallRng::seed_from_u64(seed.wrapping_add(d as u64));
        let counts = measure::assign(per[d], net.clients[d].len(), &mut rng);
        let mut ls = Vec::new();
        for (i, &k) in counts.iter().enumerate() {
            if k == 0 {
                continue;
            }
            crate::signal::check()?;
            let g = measure::spawn_paced_load(
                flowgate,
                &net.clients[d][i],
                &url,
                k,
                secs,
                p.request_timeout_ms,
            )?;
            ls.push(g);
        }
        rows[d].clients_used = ls.len() as u64;
        loads.push(ls);
        counts_all.push(counts);
    }
    let deadline = measure::load_deadline(started, secs, p.request_timeout_ms);
    for (d, ls) in loads.iter_mut().enumerate() {
        let reports = measure::wait_loads(ls, deadline, Some(&requests_logs[d]))?;
        rows[d].wall_s = started.elapsed().as_secs_f64();
        measure::fold_reports(&reports, &counts_all[d], &mut rows[d]);
    }
    let probe_deadline = Instant::now() + Duration::from_secs(t_int + 10);
    let mut extra = Vec::new();
    for (d, g) in probes.iter_mut().enumerate() {
        while g.try_wait()?.is_none() && Instant::now() < probe_deadline {
            crate::signal::sleep(Duration::from_millis(50))?;
        }
        g.kill();
        let mut iv = Vec::new();
        match probe {
            Probe::Iperf => match measure::parse_iperf(&g.output()) {
                Ok((bytes, s, intervals)) => {
                    rows[d].iperf_bytes = Some(bytes);
                    rows[d].iperf_secs = Some(s);
                    rows[d].iperf_max_bps = Some(measure::max_rate(&intervals));
                    iv = intervals;
                }
                Err(e) => eprintln!("flowgate lab: iperf3 in d{} gave no result: {e:#}", d + 1),
            },
            Probe::Ping => {
                let (rtt, loss) = measure::parse_ping(&g.output());
                if rtt.is_none() {
                    eprintln!("flowgate lab: ping in d{} gave no round-trip time", d + 1);
                }
                rows[d].ping_rtt_avg_ms = rtt;
                rows[d].ping_loss_pct = loss;
            }
        }
        extra.push(iv);
    }
    Ok((extra, started_at))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_keeps_the_papers_proportions() {
        assert_eq!(split(20_000), [6000, 4000, 6000, 4000]);
        assert_eq!(split(200), [60, 40, 60, 40]);
        assert_eq!(split(2_000).iter().sum::<u64>(), 2_000);
        assert_eq!(clients_per_domain(30), [8, 7, 8, 7]);
        assert_eq!(clients_per_domain(8), [2, 2, 2, 2]);
    }

    #[test]
    fn controllers_bind_port_zero() {
        let p = Params::for_scenario("case-c", true);
        for cfg in [domain_config(0, 1, &p, 7, "[]"), global_config("p1", "[]")] {
            let listens: Vec<&str> = cfg.lines().filter(|l| l.starts_with("listen")).collect();
            assert_eq!(listens, ["listen = \"127.0.0.1:0\""; 2], "{cfg}");
            assert!(
                cfg.starts_with("[openflow]\n") && cfg.contains("\n[api]\n"),
                "{cfg}"
            );
        }
    }

    #[test]
    fn all_row_sums_http_and_averages_iperf() {
        let r = |ok, srv: [u64; 4], bps| Row {
            ok,
            srv1: srv[0],
            srv2: srv[1],
            srv3: srv[2],
            srv4: srv[3],
            iperf_max_bps: Some(bps),
            iperf_bytes: Some(100),
            iperf_secs: Some(10.0),
            ping_rtt_avg_ms: Some(1.0),
            ..Row::default()
        };
        let a = aggregate(&[
            r(6, [6, 0, 0, 0], 1e9),
            r(4, [0, 4, 0, 0], 3e9),
            r(6, [0, 0, 6, 0], 1e9),
            r(4, [0, 0, 0, 4], 3e9),
        ]);
        assert_eq!((a.ok, a.shares()), (20, [6, 4, 6, 4]));
        assert_eq!((a.iperf_max_bps, a.iperf_bytes), (Some(2e9), Some(100)));
        // Passive outlier detection's counts are the domains' sums.
        let outliers = |e, p, answered, behind, judged: [u64; 3]| Row {
            ejections: e,
            panics: p,
            excused_answered_later: answered,
            excused_switch_behind: behind,
            outcomes_answered: judged[0],
            outcomes_unanswered: judged[1],
            outcomes_unjudged: judged[2],
            redispatched: e * 10,
            ..Row::default()
        };
        let a = aggregate(&[
            outliers(1, 1, 600, 13, [900, 40, 2]),
            outliers(0, 0, 30, 0, [100, 0, 1]),
        ]);
        let got = (
            a.ejections,
            a.panics,
            a.excused_answered_later,
            a.excused_switch_behind,
        );
        assert_eq!(got, (1, 1, 630, 13));
        let judged = (
            a.outcomes_answered,
            a.outcomes_unanswered,
            a.outcomes_unjudged,
        );
        assert_eq!(judged, (1000, 40, 3));
        assert_eq!(a.redispatched, 10);
    }

    /// A domain whose iperf3 or ping failed is left out of the `all` row's means (it used
    /// to count as a zero); its latencies are all the domains' ok requests together.
    #[test]
    fn all_row_leaves_out_failed_measurements() {
        let r = |bps: Option<f64>, rtt: Option<f64>, lat: Vec<f64>| Row {
            ok: lat.len() as u64,
            iperf_max_bps: bps,
            iperf_bytes: bps.map(|b| (b / 8.0) as u64),
            iperf_secs: bps.map(|_| 1.0),
            ping_rtt_avg_ms: rtt,
            ping_loss_pct: rtt.map(|_| 0.0),
            ok_latencies_ms: lat,
            ..Row::default()
        };
        let mut a = aggregate(&[
            r(Some(4e9), Some(1.0), vec![1.0; 90]),
            r(None, Some(3.0), vec![50.0; 10]),
            r(Some(2e9), None, vec![]),
            r(None, None, vec![]),
        ]);
        a.derive(None);
        assert_eq!(a.iperf_max_bps, Some(3e9));
        assert_eq!(a.iperf_bytes, Some(375_000_000));
        assert_eq!(a.ping_rtt_avg_ms, Some(2.0));
        assert_eq!((a.lat_p50_ms, a.lat_p95_ms), (Some(1.0), Some(50.0)));
        let none = aggregate(&[r(None, None, vec![]), r(None, None, vec![])]);
        assert_eq!((none.iperf_max_bps, none.ping_rtt_avg_ms), (None, None));
    }

    /// With one shared baseline (the default) every domain's heavy row is compared with
    /// the normal `all` row, as the paper's Table 7 (5.901 against 6.5 Gb/s: 9.22 %).
    #[test]
    fn domains_share_one_normal_baseline() {
        let q = |bps: f64| Row {
            iperf_max_bps: Some(bps),
            iperf_bytes: Some(7_019_000_000),
            iperf_secs: Some(10.0),
            ..Row::default()
        };
        let mut normal: Vec<Row> = [6.0e9, 7.0e9, 6.2e9, 6.8e9].map(q).to_vec();
        let mut all = aggregate(&normal);
        all.derive(None);
        normal.iter_mut().for_each(|r| r.derive(None));
        normal.push(all);
        assert!(Params::for_scenario("case-c", false).shared_normal_qos);
        let mut h = q(5.901e9);
        h.derive(baseline(&normal, 0, true));
        assert!((h.isl_pct.unwrap_or(0.0) - 9.22).abs() < 0.01, "{h:?}");
        h.derive(baseline(&normal, 0, false));
        assert!((h.isl_pct.unwrap_or(0.0) - 1.65).abs() < 0.01, "{h:?}");
    }
}
