//! `flowgate lab`: the ISSLM paper's experiments on real Open vSwitch (userspace datapath)
//! and network namespaces. It builds the network of the paper's Fig. 9, starts the HTTP
//! servers, the controller (the real `flowgate` binary) and the clients, runs a normal and
//! a heavy load phase per arm, measures, and writes tables (terminal, Markdown, CSV) and
//! SVG plots. Case C ([`casec`]) builds four domains instead, with four domain controllers,
//! two global controllers and a one-node etcd. Everything it made is removed on success,
//! on failure and on Ctrl-C.
//!
//! See `docs/lab.md` for the scenario design, the capacity model and the measurements.

pub mod casec;
pub mod ctl;
pub mod failover;
pub mod measure;
pub mod net;
pub mod overload;
pub mod plot;
pub mod repeats;
pub mod report;
pub mod scenario;
pub mod signal;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

use crate::ctl::Controller;
use crate::measure::{PhaseExtra, Row};
use crate::net::{LabNet, REQUESTED};
use crate::scenario::{Params, Scenario};

/// How to run a scenario.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Scenario name (`flowgate lab list`).
    pub scenario: String,
    /// The quick variant (under two minutes).
    pub quick: bool,
    /// Output directory.
    pub out: PathBuf,
    /// The `flowgate` binary (controller, httpd and load are its subcommands).
    pub flowgate: PathBuf,
    /// Name prefix of every bridge, namespace and interface (at most 6 characters); by
    /// default a fixed one, so a re-run removes what a crashed run left.
    pub prefix: Option<String>,
    /// Seed of the client draws and of the controller.
    pub seed: u64,
    /// Show a progress bar (indicatif hides it when stderr is not a terminal).
    pub progress: bool,
    /// How many times to run it ([`cli_run`]): past one, each run gets its own directory
    /// under `out` (`run-1`, ...) and seed (`seed`, `seed + 1`, ...), and a summary of
    /// every figure over the runs is written beside them ([`repeats`]).
    pub runs: u32,
    /// Case C only: a third phase, the heavy load twice more, a control and then a pass
    /// with the active global controller killed a quarter of the way in ([`failover`]).
    pub failover: bool,
}

/// What a run produced.
#[derive(Debug, Clone, Serialize)]
pub struct RunSummary {
    /// Scenario name.
    pub scenario: String,
    /// Whether it was the quick variant.
    pub quick: bool,
    /// The seed of the client draws and of the controller (`None`: the overload
    /// scenario, which draws nothing at random).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// The parameters used.
    pub params: Params,
    /// One row per arm and phase.
    pub rows: Vec<Row>,
    /// The overload scenario's results (its rows are not the paper's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overload: Option<overload::Outcome>,
    /// Case C's failover phase (`--failover`): the takeover, the spills across it and the
    /// requests around it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failover: Option<failover::Failover>,
    /// The tables as Markdown (what the terminal shows).
    #[serde(skip)]
    pub table: String,
    /// Files written.
    pub files: Vec<PathBuf>,
    /// Where and on what it ran.
    pub machine: Machine,
}

/// The machine a run used.
#[derive(Debug, Clone, Serialize, Default)]
pub struct Machine {
    pub uname: String,
    pub cpu: String,
    pub cpus: usize,
    pub mem_gb: f64,
    pub ovs: String,
    pub iperf3: String,
}

impl Machine {
    fn detect() -> Machine {
        let sh = |c: &str| {
            std::process::Command::new("sh")
                .args(["-c", c])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
                .unwrap_or_default()
        };
        Machine {
            uname: sh("uname -srm"),
            cpu: sh("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"),
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            mem_gb: sh("awk '/MemTotal/ {print $2}' /proc/meminfo")
                .parse::<f64>()
                .map(|kb| (kb / 1048576.0 * 10.0).round() / 10.0)
                .unwrap_or(0.0),
            ovs: sh("ovs-vswitchd --version | head -1"),
            iperf3: sh("iperf3 --version | head -1"),
        }
    }
}

/// `flowgate lab list`.
pub fn list() -> String {
    let mut s = String::new();
    for sc in scenario::all() {
        s += &format!("{:<9} {}\n", sc.name, sc.about);
    }
    s += "\nRun one with `flowgate lab run NAME [--quick] --out DIR` (needs root and Open vSwitch).\n";
    s
}

/// The most runs `--runs` takes (a full Case D run is about five minutes).
pub const MAX_RUNS: u32 = 50;

/// `flowgate lab run`: runs (once, or `opts.runs` times), prints the tables and where the
/// files are.
pub fn cli_run(opts: &RunOptions) -> Result<()> {
    if opts.runs == 0 || opts.runs > MAX_RUNS {
        bail!("--runs {} is out of range: 1 to {MAX_RUNS}", opts.runs);
    }
    // Before the first of several runs, not as that run's failure.
    check_failover(opts)?;
    if opts.runs == 1 {
        let summary = run(opts)?;
        println!();
        println!("{}", summary.table);
        print_files(&summary.files);
        return Ok(());
    }
    let mut runs = Vec::new();
    for i in 1..=opts.runs {
        let dir = opts.out.join(format!("run-{i}"));
        let seed = opts.seed + u64::from(i - 1);
        eprintln!(
            "flowgate lab: run {i} of {}{} into {}",
            opts.runs,
            if opts.scenario == "overload" {
                String::new()
            } else {
                format!(" (seed {seed})")
            },
            dir.display()
        );
        let one = RunOptions {
            out: dir.clone(),
            seed,
            runs: 1,
            ..opts.clone()
        };
        let summary = run(&one).with_context(|| {
            format!(
                "run {i} of {} failed; the runs before it are in {}/run-* (`flowgate lab summarize` reads them)",
                opts.runs,
                opts.out.display()
            )
        })?;
        // Read back from the JSON it wrote, as `lab summarize` reads a run.
        runs.push(repeats::Run::read(
            &dir.join(format!("{}.json", summary.scenario)),
        )?);
    }
    summarize_into(&runs, &opts.out)
}

/// `--failover` fails over Case C's global controllers: no other scenario has any.
fn check_failover(opts: &RunOptions) -> Result<()> {
    if opts.failover && opts.scenario != "case-c" {
        bail!(
            "--failover applies to case-c only (its global controllers are what fails over), not to `{}`",
            opts.scenario
        );
    }
    Ok(())
}

/// `flowgate lab summarize`: every figure of the runs in `inputs` (their JSON files or
/// directories), as median and range, written to `out`.
pub fn cli_summarize(inputs: &[PathBuf], out: &Path) -> Result<()> {
    if inputs.len() < 2 {
        bail!("name at least two runs (their directories or JSON files)");
    }
    let runs = inputs
        .iter()
        .map(|p| repeats::Run::read(p))
        .collect::<Result<Vec<_>>>()?;
    summarize_into(&runs, out)
}

fn summarize_into(runs: &[repeats::Run], out: &Path) -> Result<()> {
    let mut summary = repeats::summarize(runs)?;
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    // Runs inside the summary's directory (`--runs`) are named relative to it, so the
    // directory can be moved or published whole.
    let here = out.canonicalize()?;
    for p in &mut summary.runs {
        if let Some(rel) = p
            .canonicalize()
            .ok()
            .and_then(|c| c.strip_prefix(&here).ok().map(Path::to_path_buf))
        {
            *p = rel;
        }
    }
    let files = summary.write(out)?;
    println!();
    println!("{}", summary.markdown());
    print_files(&files);
    Ok(())
}

fn print_files(files: &[PathBuf]) {
    println!("Wrote:");
    for f in files {
        println!("  {}", f.display());
    }
}

#[allow(clippy::incompatible_msrv)]
fn lock() -> Result<std::fs::File> {
    // The lab owns 100.0.0.0/24 in the root namespace (the controller's leg): one run at
    // a time on a machine.
    let f = std::fs::File::create(std::env::temp_dir().join("flowgate-lab.lock"))?;
    f.lock()?;
    Ok(f)
}

/// Runs a scenario. Needs root, Open vSwitch, iperf3, ping and curl.
pub fn run(opts: &RunOptions) -> Result<RunSummary> {
    signal::install();
    let sc = scenario::find(&opts.scenario).ok_or_else(|| {
        anyhow!(
            "no scenario `{}`; `flowgate lab list` names them",
            opts.scenario
        )
    })?;
    let p = Params::for_scenario(sc.name, opts.quick);
    p.check().map_err(|e| anyhow!("capacity model: {e}"))?;
    check_failover(opts)?;
    if let Some(why) = flowgate_testbed::root_ovs_unavailable() {
        bail!("the lab needs root and Open vSwitch: {why} (scripts/setup-debian.sh installs it)");
    }
    for prog in ["iperf3", "ping", "curl"] {
        if !flowgate_testbed::cmd::have(prog) {
            bail!("`{prog}` is not installed (scripts/setup-debian.sh installs it)");
        }
    }
    let prefix = opts.prefix.clone().unwrap_or_else(|| "fglab".to_owned());
    if prefix.len() < 4 || prefix.len() > 6 {
        bail!("prefix `{prefix}` must have 4 to 6 characters");
    }
    std::fs::create_dir_all(&opts.out)
        .with_context(|| format!("creating {}", opts.out.display()))?;
    let out = opts.out.canonicalize()?;
    let logs = out.join("logs");
    std::fs::create_dir_all(&logs)?;

    let pb = if opts.progress {
        ProgressBar::new((2 + sc.arms.len() * 3) as u64)
    } else {
        ProgressBar::hidden()
    };
    pb.set_style(
        ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:30.cyan/blue} {pos}/{len} {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    pb.enable_steady_tick(Duration::from_millis(200));
    pb.set_message("waiting for the lab lock");
    let waited = std::time::Instant::now();
    let _lock = lock()?;
    // A run's wall time includes this wait; say so when another run held the lock.
    if waited.elapsed() > Duration::from_secs(1) {
        let line = format!(
            "flowgate lab: waited {:.1} s for the lab lock (another lab run held it)",
            waited.elapsed().as_secs_f64()
        );
        if pb.is_hidden() {
            eprintln!("{line}");
        } else {
            pb.println(line);
        }
    }
    signal::check()?;
    flowgate_testbed::cleanup_stale(&prefix)?;

    if sc.name == "overload" {
        let result = overload::run(&opts.flowgate, opts.quick, &prefix, &logs, &pb);
        pb.finish_and_clear();
        let _ = flowgate_testbed::cleanup_stale(&prefix);
        return write_overload(opts, &out, p, result?);
    }
    let mut notes: Vec<String> = Vec::new();
    let mut failover = None;
    let result = if sc.name == "case-c" {
        pb.set_length(if opts.failover { 5 } else { 4 });
        let how = (opts.seed, opts.failover);
        casec::run(&opts.flowgate, &sc, &p, &prefix, how, &logs, &pb).and_then(|o| {
            write_iperf_csv(&out, sc.name, &o.iperf)?;
            notes = o.notes;
            failover = o.failover;
            Ok(o.rows)
        })
    } else {
        run_arms(opts, &sc, &p, &prefix, &out, &logs, &pb)
    };
    pb.finish_and_clear();
    // Whatever happened, the network is gone by now (dropped inside run_arms); sweep
    // anything a half-built step left.
    let _ = flowgate_testbed::cleanup_stale(&prefix);
    let rows = result?;

    let mut files = Vec::new();
    let name = sc.name;
    let csv_path = out.join(format!("{name}.csv"));
    std::fs::write(&csv_path, report::csv(&rows))?;
    files.push(csv_path);
    let machine = Machine::detect();
    let md_path = out.join(format!("{name}.md"));
    let md = format!(
        "### {name}{}\n\nCommand: `flowgate lab run {name}{}{}{} --out {}`\n\nMachine: {} ({} CPUs, {} GB RAM), {}, {}, {}.\n\nParameters: {} clients; normal {} requests in {} s; heavy {} requests in {} s (R = {:.0} req/s); servers: {} ms service time × {} slots = μ = {:.0} req/s each, queue {}; ISSLM threshold {:.0} req/s (0.75 μ).\n\n{}",
        if opts.quick { " (quick)" } else { "" },
        if opts.quick { " --quick" } else { "" },
        if opts.seed == 1 {
            String::new()
        } else {
            format!(" --seed {}", opts.seed)
        },
        if opts.failover { " --failover" } else { "" },
        opts.out.display(),
        machine.cpu,
        machine.cpus,
        machine.mem_gb,
        machine.uname,
        machine.ovs,
        machine.iperf3,
        p.clients,
        p.normal_requests,
        p.normal_secs,
        p.heavy_requests,
        p.heavy_secs,
        p.heavy_rate(),
        p.server_delay_ms,
        p.server_concurrency,
        p.capacity_rps(),
        p.server_queue,
        p.threshold_rps(),
        report::markdown(name, &rows)
    );
    let md = if p.shared_normal_qos && sc.arms.len() > 1 && name != "case-c" {
        md.replacen(
            "\n\n#### ",
            &format!(
                "\n\nThe normal phase's QoS pass (iperf3) ran once, with the first arm ({}), and is every arm's normal-load baseline for Eqs. 2, 3 and 6 (its B_d(max), T_h, D_Transfer and Delay_Tx are repeated in each arm's normal row), as the paper computes every case's %I_SL and %D_Transfer against one normal-conditions baseline (Tables 5-7: 6.5 Gb/s, 7.019 GB; Table 8: 4.02 Gb/s, 7.02 GB); each arm's normal HTTP pass and ping are its own.\n\n#### ",
                sc.arms[0].label
            ),
            1,
        )
    } else {
        md
    };
    let md = if name == "case-c" {
        let n = casec::split(p.normal_requests);
        let h = casec::split(p.heavy_requests);
        md.replacen(
            "\n\n#### ",
            &format!(
                "\n\nCase C: four domains, clients per domain {:?}, one server each (server d = 100.0.0.d), all clients to the VIP {}; four domain controllers (ISSLM, role domain), two global controllers (role global), one-node etcd. Requests per domain C_d1..C_d4: normal {:?}, heavy {:?} (the paper's 6000/4000/6000/4000 proportions). Each row is one domain: iperf3 from its server to its first client, ping from its second client to its server, the HTTP load of its own clients; %I_SL, %D_Transfer and ΔDelay_Tx are {}. Row `all` is the four domains together: HTTP counts, server shares, Jain and controller picks summed over the network (comparable with Case B's ISSLM arm), latency percentiles over all the domains' ok requests together, iperf3 and ping figures the mean of the domains' measured ones.\n\nWhat the domain controllers reported during each phase (sampled every 250 ms over both passes):\n\n{}\n\n#### ",
                casec::clients_per_domain(p.clients),
                casec::VIP,
                n,
                h,
                if p.shared_normal_qos {
                    "against one baseline for every domain, the normal `all` row, as the paper's Table 7 uses one normal-conditions baseline (6.5 Gb/s, 7.019 GB) for all four"
                } else {
                    "against the same domain's normal phase"
                },
                notes.iter().map(|l| format!("- {l}")).collect::<Vec<_>>().join("\n")
            ),
            1,
        )
    } else {
        md
    };
    let md = match sc.fault {
        Some(scenario::Fault::SilentToClients(i)) => md.replacen(
            "\n\n#### ",
            &format!(
                "\n\nThe fault, for every arm: server {} ({}) drops every TCP segment its web server sends to a client (an nftables rule in its namespace), so a client's SYN reaches it and no SYN-ACK comes back; the controller's health checks, from its own leg, pass. Clients wait {} ms for a request, connection included, and send their SYN again at 1 and 3 s (Linux). The arms: `eject` is passive outlier detection (five silences in a row eject a server, 30 s for a first ejection), `redispatch` moves a silent connection to another server at its client's SYN sent 2.5 s or more after the decision, `both` is the controller's default, `neither` has both off. No QoS pass (iperf3): its figures are missing by design.\n\n#### ",
                i + 1,
                net::SERVERS.get(i).map_or_else(String::new, ToString::to_string),
                p.request_timeout_ms
            ),
            1,
        ),
        None => md,
    };
    let md = match &failover {
        Some(f) => format!("{md}\n{}", f.markdown()),
        None => md,
    };
    std::fs::write(&md_path, md)?;
    files.push(md_path);
    files.extend(write_plots(&out, name, &rows, p.qos_pass)?);
    let table = report::markdown(name, &rows);
    let summary = RunSummary {
        scenario: name.to_owned(),
        quick: opts.quick,
        seed: Some(opts.seed),
        params: p,
        rows,
        overload: None,
        failover,
        table,
        files,
        machine,
    };
    let json_path = out.join(format!("{name}.json"));
    std::fs::write(&json_path, serde_json::to_string_pretty(&summary)?)?;
    let mut summary = summary;
    summary.files.push(json_path);
    Ok(summary)
}

/// Writes the overload scenario's table (Markdown, CSV), plots and JSON.
fn write_overload(
    opts: &RunOptions,
    out: &Path,
    p: Params,
    o: overload::Outcome,
) -> Result<RunSummary> {
    let machine = Machine::detect();
    let mut files = Vec::new();
    let csv_path = out.join("overload.csv");
    std::fs::write(&csv_path, overload::csv(&o))?;
    files.push(csv_path);
    let table = overload::markdown(&o);
    let op = &o.params;
    let md = format!(
        "### overload{}\n\nCommand: `flowgate lab run overload{} --out {}`\n\nMachine: {} ({} CPUs, {} GB RAM), {}, {}.\n\nSetup: one OVS switch (userspace datapath), one client host, {} backends behind the VIP {} (`flowgate httpd --delay-ms {} --concurrency {} --queue {}`: nominal capacity {:.1} req/s), round robin, the controller scraping the backends' metrics every 50 ms. Each point: `flowgate load` open loop, a new connection per request, at a fixed rate for {} s, client timeout {} ms; the backends' queues are empty before each point. Loads: {:?} × the measured capacity. `static` and `adaptive` get `capacity_rps` = the measured capacity, `low_watermark = 0.95`, `max_active_connections` = slots + 2; other keys default.\n\n{}",
        if opts.quick { " (quick)" } else { "" },
        if opts.quick { " --quick" } else { "" },
        opts.out.display(),
        machine.cpu,
        machine.cpus,
        machine.mem_gb,
        machine.uname,
        machine.ovs,
        op.backends,
        overload::VIP,
        op.delay_ms,
        op.concurrency,
        op.queue,
        op.nominal_rps(),
        op.run_secs,
        op.timeout_ms,
        op.multiples,
        table
    );
    let md_path = out.join("overload.md");
    std::fs::write(&md_path, md)?;
    files.push(md_path);
    files.extend(overload::plots(out, &o)?);
    let summary = RunSummary {
        scenario: "overload".to_owned(),
        quick: opts.quick,
        seed: None,
        params: p,
        rows: Vec::new(),
        overload: Some(o),
        failover: None,
        table,
        files,
        machine,
    };
    let json_path = out.join("overload.json");
    std::fs::write(&json_path, serde_json::to_string_pretty(&summary)?)?;
    let mut summary = summary;
    summary.files.push(json_path);
    Ok(summary)
}

fn run_arms(
    opts: &RunOptions,
    sc: &Scenario,
    p: &Params,
    prefix: &str,
    out: &Path,
    logs: &Path,
    pb: &ProgressBar,
) -> Result<Vec<Row>> {
    let mut clock = Laps::new();
    let first = &sc.arms[0];
    pb.set_message(format!("controller ({})", first.label));
    let mut controller = Controller::start(
        &opts.flowgate,
        logs,
        &format!("{}-{}", sc.name, first.label),
        &ctl::config(first, p, opts.seed),
    )?;
    clock.lap("controller start (first arm)");
    pb.set_message("building the network (Fig. 9)");
    let net = LabNet::build(prefix, &controller.target(), p, &opts.flowgate, |what| {
        pb.set_message(format!("building the network: {what}"));
    })?;
    if let Some(fault) = sc.fault {
        net.inject(fault)?;
    }
    clock.lap("network build and servers");
    pb.inc(1);
    let mut rows = Vec::new();
    let mut iperf_series: Vec<(String, PhaseExtra)> = Vec::new();
    // The normal phase's QoS pass of the first arm, when it is every arm's baseline.
    let mut shared_normal_qos: Option<Row> = None;
    for (ai, arm) in sc.arms.iter().enumerate() {
        signal::check()?;
        pb.set_message(format!("arm {}: controller ({})", arm.label, arm.algorithm));
        if ai > 0 {
            controller.save_log(logs, &format!("{}-{}", sc.name, sc.arms[ai - 1].label));
            controller.stop();
            // Arms must not see each other: drop the last arm's per-connection rules
            // while no controller is connected, so their expiry (FLOW_REMOVED) does not
            // reach the next controller as failed connections of its backends.
            for b in &net.bridges {
                b.ofctl("del-flows", &[CONN_RULES])?;
            }
            controller = Controller::start(
                &opts.flowgate,
                logs,
                &format!("{}-{}", sc.name, arm.label),
                &ctl::config(arm, p, opts.seed),
            )?;
            // Each controller has ports of its own (bound, not picked beforehand).
            for b in &net.bridges {
                b.set_controller(&[controller.target()])?;
            }
            clock.lap(&format!("{}: controller restart", arm.label));
        }
        for b in &net.bridges {
            b.wait_connected(Duration::from_secs(20))?;
        }
        net.reinstall_bypass()?;
        controller.wait_backends_ready(Duration::from_secs(30))?;
        clock.lap(&format!(
            "{}: switches connected, backends ready",
            arm.label
        ));
        warm_up(&net)?;
        clock.lap(&format!("{}: warm-up pings", arm.label));
        pb.inc(1);
        let mut normal: Option<Row> = None;
        for (phase, requests, secs) in [
            ("normal", p.normal_requests, p.normal_secs),
            ("heavy", p.heavy_requests, p.heavy_secs),
        ] {
            signal::check()?;
            pb.set_message(format!(
                "arm {}: {phase} phase, {requests} requests in {secs} s from {} clients",
                arm.label, p.clients
            ));
            let mut row = Row {
                scenario: sc.name.to_owned(),
                arm: arm.label.to_owned(),
                case: arm.case.to_owned(),
                algorithm: arm.algorithm.to_owned(),
                phase: phase.to_owned(),
                offered: requests,
                duration_s: secs,
                ..Row::default()
            };
            let before = controller.snapshot()?;
            // Same client draws for every arm: the seed depends on the phase only.
            let seed = opts.seed.wrapping_mul(31).wrapping_add(requests);
            let requests_log =
                logs.join(format!("requests-{}-{}-{phase}-1.txt", sc.name, arm.label));
            let load = measure::PassLoad {
                requests,
                secs,
                timeout_ms: p.request_timeout_ms,
                seed,
                probe: measure::Probe::Ping,
                requests_log: Some(&requests_log),
            };
            measure::run_phase(&net, &opts.flowgate, load, &mut row)?;
            let after = controller.snapshot()?;
            clock.lap(&format!("{}: {phase} HTTP pass", arm.label));
            // Pass 2: the same load again (same draws), with iperf3 beside it; or, when the
            // normal phase has one QoS baseline for all arms, the first arm's.
            let shared = p.shared_normal_qos && phase == "normal";
            let (qos, extra) = match (&shared_normal_qos, shared) {
                (Some(base), true) => (base.clone(), None),
                // No QoS pass: its figures stay missing.
                _ if !p.qos_pass => (Row::default(), None),
                _ => {
                    settle(&controller, p)?;
                    clock.lap(&format!("{}: settle", arm.label));
                    pb.set_message(format!(
                        "arm {}: {phase} phase again with iperf3 (B_d(max), D_Transfer)",
                        arm.label
                    ));
                    let mut qos = Row::default();
                    let requests_log =
                        logs.join(format!("requests-{}-{}-{phase}-2.txt", sc.name, arm.label));
                    let load = measure::PassLoad {
                        probe: measure::Probe::Iperf,
                        requests_log: Some(&requests_log),
                        ..load
                    };
                    let extra = measure::run_phase(&net, &opts.flowgate, load, &mut qos)?;
                    clock.lap(&format!("{}: {phase} QoS pass (iperf3)", arm.label));
                    if shared {
                        shared_normal_qos = Some(qos.clone());
                    }
                    (qos, Some(extra))
                }
            };
            row.iperf_bytes = qos.iperf_bytes;
            row.iperf_secs = qos.iperf_secs;
            row.iperf_max_bps = qos.iperf_max_bps;
            row.qos_pass_ok = qos.ok;
            row.set_controller_counts(&before, &after);
            row.derive(normal.as_ref());
            let line = format!(
                "  {} {:<6} ok {:>6}/{:<6} ok/s {:>7.1}  srv1..4 {:?}  B_d(max) {} Gb/s  RTT {} ms",
                arm.label,
                phase,
                row.ok,
                row.offered,
                row.ok_rps,
                row.shares(),
                report::fmt(row.bdmax_gbps, 3),
                report::fmt(row.ping_rtt_avg_ms, 3)
            );
            if pb.is_hidden() {
                eprintln!("{line}");
            } else {
                pb.println(line);
            }
            if let Some(extra) = extra {
                let name = if shared {
                    "normal (all arms)".to_owned()
                } else {
                    format!("{} {phase}", arm.label)
                };
                iperf_series.push((name, extra));
            }
            if phase == "normal" {
                normal = Some(row.clone());
            }
            rows.push(row);
            pb.inc(1);
            if phase != "heavy" {
                settle(&controller, p)?;
            } else {
                // The next arm starts a new controller (fresh rate averages): only the
                // servers' queues must drain.
                signal::sleep(Duration::from_secs_f64(p.settle_min_secs))?;
            }
            clock.lap(&format!("{}: settle", arm.label));
        }
    }
    let last = sc.arms[sc.arms.len() - 1].label;
    let saved = controller.save_log(logs, &format!("{}-{last}", sc.name));
    if controller.output().contains("panicked") {
        bail!("the controller panicked; see {}", saved.display());
    }
    pb.set_message("removing the network");
    drop(controller);
    drop(net);
    clock.lap("teardown");
    let _ = std::fs::write(
        logs.join(format!("timings-{}.txt", sc.name)),
        clock.report(),
    );
    // iperf3 intervals, for re-plotting.
    let series: Vec<(String, Vec<measure::Interval>)> = iperf_series
        .into_iter()
        .map(|(n, e)| (n, e.intervals))
        .collect();
    if p.qos_pass {
        write_iperf_csv(out, sc.name, &series)?;
    }
    pb.inc(1);
    Ok(rows)
}

fn write_iperf_csv(
    out: &Path,
    name: &str,
    series: &[(String, Vec<measure::Interval>)],
) -> Result<()> {
    let mut t = String::from("series,t_end_s,bits_per_second,bytes\n");
    for (name, intervals) in series {
        for (te, bps, b) in intervals {
            t += &format!("{name},{te},{bps},{b}\n");
        }
    }
    std::fs::write(out.join(format!("{name}-iperf.csv")), t)?;
    Ok(())
}

/// The pause between two passes: at least `settle_min_secs`; then, up to `settle_secs`,
/// until every backend's measured request rate (the controller's 1 s average) is below a
/// quarter of the ISSLM threshold, so the next pass starts from a quiet controller rather
/// than one still reading the last pass's load. With `settle_min_secs == settle_secs`
/// (the full variant) it is a fixed pause.
fn settle(c: &Controller, p: &Params) -> Result<()> {
    let started = std::time::Instant::now();
    signal::sleep(Duration::from_secs_f64(p.settle_min_secs))?;
    let max = Duration::from_secs_f64(p.settle_secs);
    let quiet = p.threshold_rps() / 4.0;
    while started.elapsed() < max {
        let rates: Option<Vec<f64>> = c.services().ok().map(|v| {
            v.as_array()
                .into_iter()
                .flatten()
                .flat_map(|s| s["backends"].as_array().cloned().unwrap_or_default())
                .map(|b| b["measured_rps"].as_f64().unwrap_or(f64::INFINITY))
                .collect()
        });
        if rates.is_some_and(|r| !r.is_empty() && r.iter().all(|&x| x < quiet)) {
            return Ok(());
        }
        signal::sleep(Duration::from_millis(100))?;
    }
    Ok(())
}

/// Wall time of each step of a run, written to `logs/timings-NAME.txt`.
struct Laps {
    last: std::time::Instant,
    first: std::time::Instant,
    laps: Vec<(String, f64)>,
}

impl Laps {
    fn new() -> Laps {
        let now = std::time::Instant::now();
        Laps {
            last: now,
            first: now,
            laps: Vec::new(),
        }
    }

    fn lap(&mut self, what: &str) {
        let now = std::time::Instant::now();
        self.laps
            .push((what.to_owned(), (now - self.last).as_secs_f64()));
        self.last = now;
    }

    /// One line per step, then the totals per kind of step (the text after `: `).
    fn report(&self) -> String {
        let mut s = String::new();
        let mut kinds: Vec<(String, f64)> = Vec::new();
        for (what, secs) in &self.laps {
            s += &format!("{secs:8.2} s  {what}\n");
            let kind = what
                .split_once(": ")
                .map_or(what.as_str(), |k| k.1)
                .to_owned();
            match kinds.iter_mut().find(|k| k.0 == kind) {
                Some(k) => k.1 += secs,
                None => kinds.push((kind, *secs)),
            }
        }
        s += "\ntotals:\n";
        for (k, secs) in kinds {
            s += &format!("{secs:8.2} s  {k}\n");
        }
        s += &format!("{:8.2} s  all\n", self.first.elapsed().as_secs_f64());
        s
    }
}

/// Cookie match of flowgate's per-connection rules (kind byte 0x05, `cookie::RuleKind`).
const CONN_RULES: &str = "cookie=0x0500000000000000/0xff00000000000000";

/// Every client pings server 2 once, so ARP and the controller's L2 rules are in place
/// before the measured phases (all at once; bounded by ping's own deadline).
fn warm_up(net: &LabNet) -> Result<()> {
    let dst = REQUESTED.to_string();
    let mut pings = Vec::new();
    for h in &net.clients {
        pings.push(h.spawn(&["ping", "-n", "-c", "2", "-i", "0.2", "-w", "3", &dst])?);
    }
    for mut g in pings {
        let _ = g.wait_timeout(Duration::from_secs(5))?;
    }
    Ok(())
}

fn iperf_path(name: &str) -> &'static str {
    if name == "case-c" {
        "each domain's server → its first client"
    } else {
        "server 2 → h1"
    }
}

/// The plots of a run's rows; `qos`: whether its phases had a QoS pass, without which
/// the iperf3 figures' plots would be empty and are not drawn.
fn write_plots(out: &Path, name: &str, rows: &[Row], qos: bool) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    if qos {
        files.extend(write_iperf_plots(out, name)?);
    }
    // Bars per arm: normal vs heavy.
    let arms: Vec<String> = {
        let mut v: Vec<String> = Vec::new();
        for r in rows {
            if !v.contains(&r.arm) {
                v.push(r.arm.clone());
            }
        }
        v
    };
    // A missing row or a failed measurement is no bar, not a zero one.
    let pick = |phase: &str, f: &dyn Fn(&Row) -> Option<f64>| -> Vec<Option<f64>> {
        arms.iter()
            .map(|a| {
                rows.iter()
                    .find(|r| &r.arm == a && r.phase == phase)
                    .and_then(f)
            })
            .collect()
    };
    // (file tag, title, unit, figure, whether it is a QoS pass's)
    type Chart<'a> = (
        &'a str,
        &'a str,
        &'a str,
        &'a dyn Fn(&Row) -> Option<f64>,
        bool,
    );
    let charts: [Chart<'_>; 4] = [
        (
            "bdmax",
            "B_d(max), normal vs heavy",
            "Gb/s",
            &|r: &Row| r.bdmax_gbps,
            true,
        ),
        (
            "dtransfer",
            "D_Transfer, normal vs heavy",
            "GB",
            &|r: &Row| r.dtransfer_gb,
            true,
        ),
        (
            "ok-rate",
            "HTTP requests answered 2xx per second",
            "req/s",
            &|r: &Row| Some(r.ok_rps),
            false,
        ),
        (
            "p99",
            "HTTP p99 latency",
            "ms",
            &|r: &Row| r.lat_p99_ms,
            false,
        ),
    ];
    for (tag, title, unit, f, _) in charts.into_iter().filter(|c| qos || !c.4) {
        let path = out.join(format!("{name}-{tag}.svg"));
        plot::bars(
            &path,
            &format!("{name}: {title}"),
            unit,
            &arms,
            &[
                ("normal".to_owned(), pick("normal", f)),
                ("heavy".to_owned(), pick("heavy", f)),
            ],
        )?;
        files.push(path);
    }
    if qos {
        let path = out.join(format!("{name}-delay.svg"));
        plot::bars(
            &path,
            &format!("{name}: differential transmission delay (Eq. 6)"),
            "ms",
            &arms,
            &[(
                "heavy − normal".to_owned(),
                pick("heavy", &|r: &Row| r.diff_delay_ms),
            )],
        )?;
        files.push(path);
    }
    let path = out.join(format!("{name}-shares.svg"));
    let share = |i: usize| -> Vec<Option<f64>> {
        pick("heavy", &|r: &Row| {
            let s = r.shares();
            let t: u64 = s.iter().sum();
            Some(if t == 0 { 0.0 } else { s[i] as f64 / t as f64 })
        })
    };
    plot::bars(
        &path,
        &format!("{name}: each server's share of the heavy phase's responses"),
        "share",
        &arms,
        &(0..4)
            .map(|i| (format!("srv{}", i + 1), share(i)))
            .collect::<Vec<_>>(),
    )?;
    files.push(path);
    Ok(files)
}

/// The iperf3 time series of a run with QoS passes: bandwidth and cumulative transfer.
fn write_iperf_plots(out: &Path, name: &str) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    // Time series from the iperf CSV written by run_arms.
    let text = std::fs::read_to_string(out.join(format!("{name}-iperf.csv"))).unwrap_or_default();
    let mut bw: Vec<plot::Series> = Vec::new();
    let mut tr: Vec<plot::Series> = Vec::new();
    for l in text.lines().skip(1) {
        let f: Vec<&str> = l.split(',').collect();
        if f.len() != 4 {
            continue;
        }
        // An unreadable line is no point (a zero would look measured).
        let (Ok(t), Ok(bps), Ok(b)) = (
            f[1].parse::<f64>(),
            f[2].parse::<f64>(),
            f[3].parse::<f64>(),
        ) else {
            continue;
        };
        if bw.last().map(|s| s.0.as_str()) != Some(f[0]) {
            bw.push((f[0].to_owned(), Vec::new()));
            tr.push((f[0].to_owned(), Vec::new()));
        }
        if let (Some(s), Some(r)) = (bw.last_mut(), tr.last_mut()) {
            s.1.push((t, bps / 1e9));
            let prev = r.1.last().map_or(0.0, |p| p.1);
            r.1.push((t, prev + b / 1e9));
        }
    }
    let f = out.join(format!("{name}-bandwidth.svg"));
    plot::lines(
        &f,
        &format!(
            "{name}: iperf3 bandwidth, {} (0.5 s intervals)",
            iperf_path(name)
        ),
        "time (s)",
        "Gb/s",
        &bw,
    )?;
    files.push(f);
    let f = out.join(format!("{name}-transfer.svg"));
    plot::lines(
        &f,
        &format!(
            "{name}: iperf3 data transfer, {} (cumulative)",
            iperf_path(name)
        ),
        "time (s)",
        "GB",
        &tr,
    )?;
    files.push(f);
    Ok(files)
}
