//! The `overload` scenario (issue 5): overload control (`[service.overload]`, ACCM) against
//! offered load, for four arms: the three modes `off`, `static` and `adaptive`, and
//! `adaptive-no-ceiling`, the adaptive law without its ceiling (`ceiling = false`: no limit
//! while no gap is in force, where `adaptive` never admits more than `capacity_rps × (low +
//! high)/2`). `static` against `adaptive` compares the AIN gap table with the adaptive law
//! together with its ceiling; `adaptive-no-ceiling` tells what the law alone does, and so
//! what the ceiling buys. The quick variant runs the first three only (its CI test,
//! `ovs_lab_overload_quick`, counts three arms' rows).
//!
//! One OVS switch, one client host and two backends behind a VIP. Each backend is
//! `flowgate httpd --delay-ms 200 --concurrency 2 --queue 200`: a fixed concurrency limit,
//! 10 requests/s each, and up to 200 requests (20 s of work) may wait, so without control
//! queues grow. The pool's capacity is measured first (closed loop, one worker per slot,
//! through the controller in mode `off`), and the unloaded latency (open loop at a quarter
//! of the nominal capacity). Then, for each arm, a new controller with
//! `[service.overload] mode = MODE` (and `ceiling = false` for `adaptive-no-ceiling`) and
//! `capacity_rps` = the measured capacity (as the integration test `ovs_overload_three_modes`
//! configures it) takes new connections offered
//! open loop (a new connection per request, at a fixed rate) at several multiples of that
//! capacity. Between points the lab waits until the backends' queues are empty (their own
//! `/metrics`, read through a root-namespace leg).
//!
//! Per point: offered rate; admitted rate and refusals as the controller counts them
//! (`/api/v1/overload`: `admitted_total`, `refused_total`, `meter_dropped_total`, before and
//! after); goodput (2xx responses per second); p50/p99 latency of the successful requests;
//! refusals the client learnt at once (connection refused, reset, HTTP 503) and those left
//! waiting (connect or response timeout), with the time to failure.

use std::fmt::Write as _;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use flowgate_testbed::rootleg::RootLeg;
use flowgate_testbed::topo::{self, TopoOptions, Topology};
use flowgate_testbed::{Host, ProcGuard};
use indicatif::ProgressBar;
use serde::{Deserialize, Serialize};

use crate::ctl::{self, Controller, LISTEN_ANY_PORT};
use crate::net::{spawn_httpd, wait_httpd};
use crate::{plot, signal};

/// The VIP of the service.
pub const VIP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 100);
/// The root-namespace leg (the controller scrapes the backends' metrics through it).
const LEG_CIDR: &str = "10.0.0.250/24";
use crate::scenario::{NO_CEILING, OVERLOAD_ARMS};
/// Cookie match of flowgate's per-connection rules (kind byte 0x05).
const CONN_RULES: &str = "cookie=0x0500000000000000/0xff00000000000000";

/// Sizes of the scenario.
#[derive(Debug, Clone, Serialize)]
pub struct OverloadParams {
    /// Backends in the pool.
    pub backends: usize,
    /// Each backend: service time of every request (ms).
    pub delay_ms: u64,
    /// Each backend: requests served at once.
    pub concurrency: u64,
    /// Each backend: requests that may wait for a slot (beyond: 503).
    pub queue: u64,
    /// Client timeout per request (connect + response), ms.
    pub timeout_ms: u64,
    /// Length of one point (s).
    pub run_secs: f64,
    /// Offered load of each point, as multiples of the measured capacity.
    pub multiples: Vec<f64>,
    /// Requests of the closed-loop capacity measurement.
    pub capacity_requests: u64,
    /// Requests of the unloaded-latency measurement (open loop at `unloaded_rate`).
    pub unloaded_requests: u64,
    /// Rate of the unloaded-latency measurement (req/s).
    pub unloaded_rate: f64,
    /// The arms that run, in order (labels of [`OVERLOAD_ARMS`]).
    pub modes: Vec<&'static str>,
}

impl OverloadParams {
    pub fn new(quick: bool) -> OverloadParams {
        OverloadParams {
            backends: 2,
            delay_ms: 200,
            concurrency: 2,
            queue: 200,
            timeout_ms: 3_000,
            run_secs: if quick { 5.0 } else { 10.0 },
            multiples: if quick {
                vec![0.5, 1.5, 3.0]
            } else {
                vec![0.5, 1.0, 1.5, 2.0, 3.0]
            },
            capacity_requests: if quick { 100 } else { 300 },
            unloaded_requests: if quick { 20 } else { 40 },
            unloaded_rate: 5.0,
            // The quick variant keeps the three modes: its CI test counts their rows.
            modes: if quick {
                OVERLOAD_ARMS[..3].to_vec()
            } else {
                OVERLOAD_ARMS.to_vec()
            },
        }
    }

    /// The pool's capacity by its settings: backends × concurrency / service time.
    pub fn nominal_rps(&self) -> f64 {
        self.backends as f64 * self.concurrency as f64 * 1000.0 / self.delay_ms.max(1) as f64
    }
}

/// One point: one arm at one offered load.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Point {
    /// The arm's label (one of [`OVERLOAD_ARMS`]).
    pub mode: String,
    /// Offered load as a multiple of the measured capacity.
    pub multiple: f64,
    /// Offered rate (req/s): new connections per second the client opened.
    pub offered_rps: f64,
    pub sent: u64,
    pub ok: u64,
    /// 2xx responses per second of the point.
    pub goodput_rps: f64,
    /// New connections the controller admitted per second (its gate's count).
    pub admitted_rps: f64,
    /// New connections the controller's gate saw (PACKET_INs and meter drops).
    pub ctl_offered: u64,
    pub ctl_admitted: u64,
    /// Refused by the gap (RST from the controller, or a gap rule's drop).
    pub ctl_refused: u64,
    /// Dropped by the switch's meter (silent).
    pub ctl_meter_dropped: u64,
    /// The gate's admitted-rate limit at the end of the point (`None`: no limit).
    pub admitted_rate_limit: Option<f64>,
    /// Latency of the successful requests (ms).
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Failed requests the client learnt of at once: connection refused (RST to the SYN),
    /// reset, or an HTTP error status.
    pub refused_prompt: u64,
    /// Failed requests left waiting: connect or response timeouts.
    pub timeouts: u64,
    /// Time to failure of the failed requests (ms): median and largest.
    pub failed_p50_ms: f64,
    pub failed_max_ms: f64,
    /// The point's wall time (s), first request to last completion.
    pub wall_s: f64,
}

/// What the scenario measured.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    pub params: OverloadParams,
    /// The pool's capacity by its settings (req/s).
    pub nominal_rps: f64,
    /// Measured closed loop (req/s).
    pub measured_rps: f64,
    /// The capacity the gate is given and the loads are multiples of: min(measured, nominal).
    pub capacity_rps: f64,
    /// p50/p99 of the unloaded run (ms).
    pub unloaded_p50_ms: f64,
    pub unloaded_p99_ms: f64,
    pub points: Vec<Point>,
}

/// The `[service.overload]` mode of an arm, and whether its ceiling is removed.
pub fn arm_mode(arm: &str) -> (&str, bool) {
    if arm == NO_CEILING {
        ("adaptive", true)
    } else {
        (arm, false)
    }
}

/// The controller config for one arm (one of [`OVERLOAD_ARMS`]). Metrics of the backends are
/// scraped every 50 ms (their requests in flight plus queued are ACCM's buffer occupancy, against
/// `max_active_connections`: the pool's slots plus two waiting), as in the integration
/// test. The capacity is exact here (fixed delay, fixed concurrency), so the adaptive
/// gate holds the load between 95 % and 100 % of it rather than the default 90-100 %.
/// `adaptive-no-ceiling` is `adaptive` with the same keys and `ceiling = false`.
pub fn config(backends: &[Ipv4Addr], arm: &str, capacity: f64, op: &OverloadParams) -> String {
    let (mode, no_ceiling) = arm_mode(arm);
    let mut c = format!(
        "{LISTEN_ANY_PORT}\
         [controller.overload]\nmode = \"off\"\n\n\
         [[service]]\nname = \"web\"\nvip = \"{VIP}\"\nport = 80\nalgorithm = \"round-robin\"\n\
         [service.health]\nkind = \"none\"\n[service.metrics]\ninterval_ms = 50\n\
         [service.overload]\nmode = \"{mode}\"\n"
    );
    if mode != "off" {
        let slots = backends.len() as u64 * op.concurrency + 2;
        c += &format!(
            "capacity_rps = {capacity:.1}\nlow_watermark = 0.95\nmax_active_connections = {slots}\n"
        );
    }
    if no_ceiling {
        c += "ceiling = false\n";
    }
    for b in backends {
        c += &format!(
            "\n[[service.backend]]\naddress = \"{b}\"\nmetrics = \"http://{b}:80/metrics\"\n"
        );
    }
    c
}

/// The network. Field order is drop order: servers (held only to be killed on drop), the
/// leg, then the topology.
struct Net {
    _servers: Vec<ProcGuard>,
    leg: RootLeg,
    topo: Topology,
}

impl Net {
    fn client(&self) -> &Host {
        &self.topo.hosts[0]
    }

    fn backends(&self) -> Vec<Ipv4Addr> {
        self.topo.hosts[1..].iter().map(Host::ip).collect()
    }
}

/// Without a controller: each arm's controller is set on the switch when it starts.
fn build(prefix: &str, op: &OverloadParams, flowgate: &Path) -> Result<Net> {
    let topo = topo::single(&TopoOptions::new(prefix), 1 + op.backends).context("topology")?;
    signal::check()?;
    let leg = RootLeg::create(prefix, "lg", LEG_CIDR, &topo.bridges[0]).context("root leg")?;
    // The leg's own traffic (scrapes, drain checks) goes with NORMAL, not through the
    // controller's gate.
    leg.install_bypass(&topo.bridges[0])?;
    let mut servers = Vec::new();
    for (i, h) in topo.hosts[1..].iter().enumerate() {
        let name = format!("b{}", i + 1);
        servers.push(spawn_httpd(
            flowgate,
            h,
            &name,
            op.delay_ms,
            op.concurrency,
            op.queue,
        )?);
    }
    wait_httpd(&topo.hosts[1..])?;
    Ok(Net {
        _servers: servers,
        leg,
        topo,
    })
}

/// Runs `flowgate load` on `host` (bounded; interruptible) and returns its JSON report.
fn load(host: &Host, flowgate: &Path, args: &[&str], limit: Duration) -> Result<serde_json::Value> {
    let fg = flowgate.to_string_lossy().into_owned();
    let url = format!("http://{VIP}/");
    let mut argv = vec![
        fg.as_str(),
        "--log",
        "error",
        "load",
        "--url",
        &url,
        "--json",
    ];
    argv.extend_from_slice(args);
    let mut g = host.spawn(&argv).context("spawn load")?;
    let deadline = Instant::now() + limit;
    while g.try_wait()?.is_none() {
        if Instant::now() > deadline {
            g.kill();
            bail!("load did not finish in {limit:?}: {}", g.output());
        }
        signal::sleep(Duration::from_millis(50))?;
    }
    let out = g.output();
    let (s, e) = (out.find('{'), out.rfind('}'));
    match (s, e) {
        (Some(s), Some(e)) if s < e => {
            serde_json::from_str(&out[s..=e]).with_context(|| format!("load report: {out}"))
        }
        _ => bail!("load printed no report: {out}"),
    }
}

/// Requests in flight plus queued at `backend`, from its own `/metrics`.
fn backlog(backend: Ipv4Addr) -> Result<f64> {
    let body = ctl::http_get(SocketAddr::from((backend, 80)), "/metrics")?;
    let mut n = 0.0;
    for l in body.lines() {
        if l.starts_with("http_requests_in_flight") || l.starts_with("http_requests_queued") {
            n += l
                .rsplit(' ')
                .next()
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0);
        }
    }
    Ok(n)
}

/// Waits (bounded) until no backend has a request in service or waiting: each point starts
/// from an empty pool, whatever the last one left queued.
fn drain(backends: &[Ipv4Addr], limit: Duration) -> Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        let mut total = 0.0;
        for b in backends {
            total += backlog(*b).unwrap_or(f64::INFINITY);
        }
        if total == 0.0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            eprintln!("flowgate lab: the backends still hold {total} requests after {limit:?}");
            return Ok(());
        }
        signal::sleep(Duration::from_millis(200))?;
    }
}

/// The service's overload counters from `/api/v1/overload`.
#[derive(Debug, Clone, Copy, Default)]
struct Gate {
    offered: u64,
    admitted: u64,
    refused: u64,
    meter_dropped: u64,
    limit: Option<f64>,
}

fn gate(c: &Controller) -> Result<Gate> {
    let v: serde_json::Value = serde_json::from_str(&ctl::http_get(c.api, "/api/v1/overload")?)?;
    let s = &v["services"][0]["overload"];
    let u = |k: &str| s[k].as_u64().unwrap_or(0);
    Ok(Gate {
        offered: u("offered_total"),
        admitted: u("admitted_total"),
        refused: u("refused_total"),
        meter_dropped: u("meter_dropped_total"),
        limit: s["admitted_rate_limit"].as_f64(),
    })
}

fn start_controller(
    flowgate: &Path,
    logs: &Path,
    net: &Net,
    mode: &str,
    cfg: &str,
) -> Result<Controller> {
    // Rules and meters of the last controller go while none is connected, so the new one
    // starts from a clean switch (their expiry would otherwise reach it as connections of
    // its backends).
    let br = &net.topo.bridges[0];
    br.ofctl("del-flows", &[CONN_RULES])?;
    let _ = br.ofctl("del-meters", &["-O", "OpenFlow13"]);
    let c = Controller::start(flowgate, logs, &format!("overload-{mode}"), cfg)?;
    br.set_controller(&[c.target()])?;
    br.wait_connected(Duration::from_secs(20))?;
    net.leg.install_bypass(br)?;
    c.wait_backends_ready(Duration::from_secs(20))?;
    Ok(c)
}

fn f(v: &serde_json::Value, path: &[&str]) -> f64 {
    let mut x = v;
    for k in path {
        x = &x[*k];
    }
    x.as_f64().unwrap_or(0.0)
}

/// Runs the scenario on network `prefix`; returns what it measured.
pub fn run(
    flowgate: &Path,
    quick: bool,
    prefix: &str,
    logs: &Path,
    pb: &ProgressBar,
) -> Result<Outcome> {
    let op = OverloadParams::new(quick);
    pb.set_length(3 + (op.modes.len() * op.multiples.len()) as u64);
    pb.set_message("building the network (one switch, a client, two backends)");
    let net = build(prefix, &op, flowgate)?;
    let backends = net.backends();
    pb.inc(1);
    let say = |line: String| {
        if pb.is_hidden() {
            eprintln!("{line}");
        } else {
            pb.println(line);
        }
    };

    // Calibration through the controller in mode `off`.
    let nominal = op.nominal_rps();
    pb.set_message("measuring the unloaded latency and the pool's capacity (mode off)");
    let mut c = start_controller(
        flowgate,
        logs,
        &net,
        "calibration",
        &config(&backends, "off", nominal, &op),
    )?;
    let limit = Duration::from_secs(120);
    let to = op.timeout_ms.to_string();
    let un = load(
        net.client(),
        flowgate,
        &[
            "--rate",
            &op.unloaded_rate.to_string(),
            "--requests",
            &op.unloaded_requests.to_string(),
            "--timeout-ms",
            &to,
        ],
        limit,
    )?;
    if un["ok"].as_u64() != Some(op.unloaded_requests) {
        bail!("the unloaded run failed requests: {un}");
    }
    let slots = (op.backends as u64 * op.concurrency).to_string();
    let sat = load(
        net.client(),
        flowgate,
        &[
            "--concurrency",
            &slots,
            "--requests",
            &op.capacity_requests.to_string(),
            "--timeout-ms",
            &to,
        ],
        limit,
    )?;
    let measured = f(&sat, &["ok"]) / f(&sat, &["elapsed_secs"]).max(1e-3);
    if measured < 0.5 * nominal {
        bail!("measured capacity {measured:.1}/s is under half the nominal {nominal:.1}/s: {sat}");
    }
    // The gate gets the capacity the pool really has here (a ceiling above it would let a
    // queue build through a whole point).
    let capacity = measured.min(nominal);
    let (un_p50, un_p99) = (
        f(&un, &["latency_ms", "p50"]),
        f(&un, &["latency_ms", "p99"]),
    );
    say(format!(
        "  pool: nominal {nominal:.1} req/s, measured {measured:.1} req/s (closed loop); unloaded p50 {un_p50:.1} ms, p99 {un_p99:.1} ms"
    ));
    c.save_log(logs, "overload-calibration");
    c.stop();
    pb.inc(1);

    let mut points = Vec::new();
    for mode in op.modes.clone() {
        signal::check()?;
        pb.set_message(format!("mode {mode}: controller"));
        c = start_controller(
            flowgate,
            logs,
            &net,
            mode,
            &config(&backends, mode, capacity, &op),
        )?;
        for &x in &op.multiples {
            signal::check()?;
            pb.set_message(format!("mode {mode}: draining the backends"));
            drain(&backends, Duration::from_secs(40))?;
            let rate = (x * capacity * 10.0).round() / 10.0;
            let n = (rate * op.run_secs).round().max(1.0) as u64;
            pb.set_message(format!(
                "mode {mode}: {x}× capacity, {rate} new connections/s for {} s",
                op.run_secs
            ));
            let before = gate(&c)?;
            let r = load(
                net.client(),
                flowgate,
                &[
                    "--rate",
                    &rate.to_string(),
                    "--requests",
                    &n.to_string(),
                    "--timeout-ms",
                    &to,
                    "--duration-secs",
                    &(op.run_secs + 1.0).to_string(),
                ],
                limit,
            )?;
            let after = gate(&c)?;
            let e = &r["errors"];
            let u = |v: &serde_json::Value| v.as_u64().unwrap_or(0);
            let http: u64 = e["http_status"]
                .as_object()
                .map(|m| m.values().map(u).sum())
                .unwrap_or(0);
            let wall = f(&r, &["elapsed_secs"]);
            let pt = Point {
                mode: mode.to_owned(),
                multiple: x,
                offered_rps: rate,
                sent: u(&r["sent"]),
                ok: u(&r["ok"]),
                goodput_rps: u(&r["ok"]) as f64 / wall.max(op.run_secs),
                admitted_rps: after.admitted.saturating_sub(before.admitted) as f64 / op.run_secs,
                ctl_offered: after.offered.saturating_sub(before.offered),
                ctl_admitted: after.admitted.saturating_sub(before.admitted),
                ctl_refused: after.refused.saturating_sub(before.refused),
                ctl_meter_dropped: after.meter_dropped.saturating_sub(before.meter_dropped),
                admitted_rate_limit: after.limit,
                p50_ms: f(&r, &["latency_ms", "p50"]),
                p99_ms: f(&r, &["latency_ms", "p99"]),
                refused_prompt: u(&e["connect_refused"]) + u(&e["reset"]) + http,
                timeouts: u(&e["connect_timeout"]) + u(&e["timeout"]),
                failed_p50_ms: f(&r, &["failed_ms", "p50"]),
                failed_max_ms: f(&r, &["failed_ms", "max"]),
                wall_s: wall,
            };
            say(format!(
                "  {mode:<19} {x:>3}× offered {:>5.1}/s admitted {:>5.1}/s goodput {:>5.1}/s p99 {:>7.1} ms  refused at once {:>4}  timeouts {:>4}",
                pt.offered_rps,
                pt.admitted_rps,
                pt.goodput_rps,
                pt.p99_ms,
                pt.refused_prompt,
                pt.timeouts
            ));
            points.push(pt);
            pb.inc(1);
        }
        let saved = c.save_log(logs, &format!("overload-{mode}"));
        if c.output().contains("panicked") {
            bail!("the controller panicked; see {}", saved.display());
        }
        c.stop();
    }
    drop(c);
    pb.set_message("removing the network");
    drop(net);
    pb.inc(1);
    Ok(Outcome {
        params: op,
        nominal_rps: nominal,
        measured_rps: measured,
        capacity_rps: capacity,
        unloaded_p50_ms: un_p50,
        unloaded_p99_ms: un_p99,
        points,
    })
}

/// Every point, every column.
pub fn csv(o: &Outcome) -> String {
    let mut s = String::from(
        "mode,multiple,offered_rps,capacity_rps,sent,ok,goodput_rps,admitted_rps,ctl_offered,ctl_admitted,ctl_refused,ctl_meter_dropped,admitted_rate_limit,p50_ms,p99_ms,unloaded_p99_ms,refused_prompt,timeouts,failed_p50_ms,failed_max_ms,wall_s\n",
    );
    for p in &o.points {
        let _ = writeln!(
            s,
            "{},{},{},{:.2},{},{},{:.2},{:.2},{},{},{},{},{},{:.1},{:.1},{:.1},{},{},{:.1},{:.1},{:.2}",
            p.mode,
            p.multiple,
            p.offered_rps,
            o.capacity_rps,
            p.sent,
            p.ok,
            p.goodput_rps,
            p.admitted_rps,
            p.ctl_offered,
            p.ctl_admitted,
            p.ctl_refused,
            p.ctl_meter_dropped,
            p.admitted_rate_limit
                .map_or(String::new(), |a| format!("{a:.1}")),
            p.p50_ms,
            p.p99_ms,
            o.unloaded_p99_ms,
            p.refused_prompt,
            p.timeouts,
            p.failed_p50_ms,
            p.failed_max_ms,
            p.wall_s
        );
    }
    s
}

/// The table, and what holds at the highest offered load against issue 5's targets.
pub fn markdown(o: &Outcome) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "#### overload: {} against offered load\n",
        o.params.modes.join(", ")
    );
    let _ = writeln!(
        s,
        "Capacity {:.1} req/s (nominal {:.1}, measured closed loop {:.1}); unloaded p50 {:.1} ms, p99 {:.1} ms.\n",
        o.capacity_rps, o.nominal_rps, o.measured_rps, o.unloaded_p50_ms, o.unloaded_p99_ms
    );
    if o.params.modes.contains(&NO_CEILING) {
        let _ = writeln!(
            s,
            "`{NO_CEILING}` is `adaptive` with the same keys and `ceiling = false`: the adaptive law without the ceiling that holds `adaptive` at `capacity_rps × (low+high)/2` while no gap is in force.\n"
        );
    }
    let _ = writeln!(
        s,
        "| mode | × capacity | offered req/s | sent | admitted req/s (controller) | refused by the gap | meter drops | goodput req/s | goodput / capacity | p50 ms | p99 ms | p99 / unloaded | refused, told at once | left waiting (timeouts) | time to failure p50 / max ms | admitted-rate limit at end |"
    );
    let _ = writeln!(
        s,
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for p in &o.points {
        let _ = writeln!(
            s,
            "| {} | {} | {:.1} | {} | {:.1} | {} | {} | {:.1} | {:.2} | {:.1} | {:.1} | {:.2} | {} | {} | {} | {} |",
            p.mode,
            p.multiple,
            p.offered_rps,
            p.sent,
            p.admitted_rps,
            p.ctl_refused,
            p.ctl_meter_dropped,
            p.goodput_rps,
            p.goodput_rps / o.capacity_rps,
            p.p50_ms,
            p.p99_ms,
            p.p99_ms / o.unloaded_p99_ms.max(1e-9),
            p.refused_prompt,
            p.timeouts,
            if p.sent > p.ok {
                format!("{:.1} / {:.1}", p.failed_p50_ms, p.failed_max_ms)
            } else {
                "–".to_owned()
            },
            p.admitted_rate_limit
                .map_or("none".to_owned(), |a| format!("{a:.1}")),
        );
    }
    if let Some(top) = o.points.iter().map(|p| p.multiple).reduce(f64::max) {
        let at = |m: &str| o.points.iter().find(|p| p.mode == m && p.multiple == top);
        if let (Some(off), Some(st), Some(ad)) = (at("off"), at("static"), at("adaptive")) {
            let yes = |b: bool| if b { "**yes**" } else { "**no**" };
            let _ = writeln!(
                s,
                "\nAt {top}× capacity (the overload control's targets, from the rows above):\n"
            );
            let _ = writeln!(
                s,
                "- adaptive goodput ≥ 90 % of capacity: {} ({:.1} of {:.1} req/s, {:.0} %)",
                yes(ad.goodput_rps >= 0.9 * o.capacity_rps),
                ad.goodput_rps,
                o.capacity_rps,
                100.0 * ad.goodput_rps / o.capacity_rps
            );
            let _ = writeln!(
                s,
                "- adaptive p99 ≤ 3 × unloaded p99: {} ({:.1} ms vs 3 × {:.1} = {:.1} ms)",
                yes(ad.p99_ms <= 3.0 * o.unloaded_p99_ms),
                ad.p99_ms,
                o.unloaded_p99_ms,
                3.0 * o.unloaded_p99_ms
            );
            let _ = writeln!(
                s,
                "- adaptive goodput above off's and static's: {} ({:.1} vs {:.1} and {:.1} req/s)",
                yes(ad.goodput_rps > off.goodput_rps && ad.goodput_rps > st.goodput_rps),
                ad.goodput_rps,
                off.goodput_rps,
                st.goodput_rps
            );
            let _ = writeln!(
                s,
                "- adaptive p99 below off's and static's: {} ({:.1} vs {:.1} and {:.1} ms)",
                yes(ad.p99_ms < off.p99_ms && ad.p99_ms < st.p99_ms),
                ad.p99_ms,
                off.p99_ms,
                st.p99_ms
            );
            let _ = writeln!(
                s,
                "- every refused client told at once (no timeouts) with adaptive: {} ({} refused at once, {} timeouts, slowest failure {:.1} ms)",
                yes(ad.timeouts == 0 && ad.ok + ad.refused_prompt == ad.sent),
                ad.refused_prompt,
                ad.timeouts,
                ad.failed_max_ms
            );
        }
        // The ablation: figures beside adaptive's, no target (the law alone has none of
        // its own, and what a step lets through depends on the machine).
        if let (Some(nc), Some(ad)) = (at(NO_CEILING), at("adaptive")) {
            let _ = writeln!(
                s,
                "\nAt {top}× capacity, the adaptive law without its ceiling ({NO_CEILING}, `ceiling = false`) beside adaptive: admitted {:.1} vs {:.1} req/s, goodput {:.1} vs {:.1} req/s, p99 {:.1} vs {:.1} ms, refused at once {} vs {}, timeouts {} vs {}.",
                nc.admitted_rps,
                ad.admitted_rps,
                nc.goodput_rps,
                ad.goodput_rps,
                nc.p99_ms,
                ad.p99_ms,
                nc.refused_prompt,
                ad.refused_prompt,
                nc.timeouts,
                ad.timeouts
            );
        }
    }
    s
}

/// The three plots: admitted rate, goodput and p99 latency against offered load, one line
/// per arm that ran, with the capacity (or 3 × the unloaded p99) as a reference line.
pub fn plots(out: &Path, o: &Outcome) -> Result<Vec<PathBuf>> {
    let xmax = o.points.iter().map(|p| p.offered_rps).fold(0.0, f64::max);
    let by_mode = |g: &dyn Fn(&Point) -> f64| -> Vec<plot::Series> {
        o.params
            .modes
            .iter()
            .map(|m| {
                (
                    (*m).to_owned(),
                    o.points
                        .iter()
                        .filter(|p| p.mode == *m)
                        .map(|p| (p.offered_rps, g(p)))
                        .filter(|p| p.1.is_finite())
                        .collect(),
                )
            })
            .collect()
    };
    let reference = |name: String, y: f64| -> plot::Series { (name, vec![(0.0, y), (xmax, y)]) };
    let mut files = Vec::new();
    let charts: [(&str, &str, &str, Vec<plot::Series>); 3] = [
        (
            "admitted",
            "admitted new connections (controller's count) vs offered",
            "admitted req/s",
            {
                let mut v = by_mode(&|p| p.admitted_rps);
                v.push(reference(
                    format!("capacity {:.1}", o.capacity_rps),
                    o.capacity_rps,
                ));
                v
            },
        ),
        (
            "goodput",
            "goodput (2xx responses/s) vs offered",
            "req/s",
            {
                let mut v = by_mode(&|p| p.goodput_rps);
                v.push(reference(
                    format!("capacity {:.1}", o.capacity_rps),
                    o.capacity_rps,
                ));
                v.push(reference(
                    "90 % of capacity".to_owned(),
                    0.9 * o.capacity_rps,
                ));
                v
            },
        ),
        (
            "p99",
            "p99 latency of successful requests vs offered",
            "ms",
            {
                let mut v = by_mode(&|p| p.p99_ms);
                v.push(reference(
                    format!("3 × unloaded p99 ({:.0} ms)", 3.0 * o.unloaded_p99_ms),
                    3.0 * o.unloaded_p99_ms,
                ));
                v
            },
        ),
    ];
    for (tag, title, unit, series) in charts {
        let path = out.join(format!("overload-{tag}.svg"));
        plot::xy(
            &path,
            &format!("overload: {title}"),
            "offered new connections/s",
            unit,
            &series,
        )
        .map_err(|e| anyhow!("{}: {e}", path.display()))?;
        files.push(path);
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backends() -> Vec<Ipv4Addr> {
        vec![Ipv4Addr::new(10, 0, 0, 2), Ipv4Addr::new(10, 0, 0, 3)]
    }

    /// Each arm writes its mode; `adaptive-no-ceiling` is `adaptive`'s config and
    /// `ceiling = false`, nothing else.
    #[test]
    fn each_arm_writes_its_mode_and_only_the_ablation_removes_the_ceiling() {
        let op = OverloadParams::new(false);
        assert_eq!(op.modes, OVERLOAD_ARMS, "the full run has every arm");
        assert_eq!(
            OverloadParams::new(true).modes,
            ["off", "static", "adaptive"],
            "the quick run keeps the three modes"
        );
        let cfg = |arm| config(&backends(), arm, 20.0, &op);
        for arm in OVERLOAD_ARMS {
            let (mode, _) = arm_mode(arm);
            assert!(
                cfg(arm).contains(&format!("[service.overload]\nmode = \"{mode}\"\n")),
                "{arm}: {}",
                cfg(arm)
            );
            assert_eq!(cfg(arm).contains("ceiling"), arm == NO_CEILING, "{arm}");
        }
        assert_eq!(arm_mode(NO_CEILING), ("adaptive", true));
        assert_eq!(
            cfg(NO_CEILING),
            cfg("adaptive").replace(
                "max_active_connections = 6\n",
                "max_active_connections = 6\nceiling = false\n"
            ),
            "the same keys as adaptive, and no ceiling"
        );
    }

    fn outcome() -> Outcome {
        let mut points = Vec::new();
        for (i, arm) in OVERLOAD_ARMS.iter().enumerate() {
            for x in [0.5, 3.0] {
                points.push(Point {
                    mode: (*arm).to_owned(),
                    multiple: x,
                    offered_rps: x * 20.0,
                    sent: 10,
                    ok: 8,
                    goodput_rps: 10.0 + i as f64,
                    admitted_rps: 12.0 + i as f64,
                    p50_ms: 200.0,
                    p99_ms: 300.0 + i as f64,
                    ..Point::default()
                });
            }
        }
        Outcome {
            params: OverloadParams::new(false),
            nominal_rps: 20.0,
            measured_rps: 19.5,
            capacity_rps: 19.5,
            unloaded_p50_ms: 200.0,
            unloaded_p99_ms: 210.0,
            points,
        }
    }

    /// The fourth arm reaches the CSV, the table (with adaptive's checks unchanged, and
    /// the ablation's figures beside adaptive's, no check of its own) and every plot.
    #[test]
    fn the_fourth_arm_flows_through_the_csv_the_table_and_the_plots() {
        let o = outcome();
        let csv = csv(&o);
        assert_eq!(csv.lines().count(), 1 + OVERLOAD_ARMS.len() * 2, "{csv}");
        for arm in OVERLOAD_ARMS {
            assert_eq!(
                csv.lines()
                    .filter(|l| l.split(',').next() == Some(arm))
                    .count(),
                2,
                "{arm}: {csv}"
            );
        }
        let md = markdown(&o);
        assert!(md.contains("| adaptive-no-ceiling | 3 |"), "{md}");
        assert!(md.contains("- adaptive goodput ≥ 90 % of capacity"), "{md}");
        assert!(
            md.contains("without its ceiling (adaptive-no-ceiling, `ceiling = false`) beside adaptive: admitted 15.0 vs 14.0 req/s, goodput 13.0 vs 12.0"),
            "{md}"
        );
        assert_eq!(
            md.matches("**yes**").count() + md.matches("**no**").count(),
            5,
            "adaptive's five checks, none on the ablation: {md}"
        );
        let dir =
            std::env::temp_dir().join(format!("flowgate-lab-overload-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let files = plots(&dir, &o).expect("plots");
        assert_eq!(files.len(), 3);
        for f in &files {
            let svg = std::fs::read_to_string(f).expect("svg");
            // One legend entry per arm (each a line of its own colour).
            for arm in OVERLOAD_ARMS {
                assert!(
                    svg.contains(&format!(">\n{arm}\n</text>")),
                    "{arm} in {}",
                    f.display()
                );
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
