//! `flowgate bench`: the benchmarks behind docs/benchmarks.md.
//!
//! - [`controller`]: cbench for OpenFlow 1.3 — emulated switches send TCP SYN PACKET_INs
//!   to a VIP and check the balancer's answers; flowgate, an os-ken app and
//!   ovs-testcontroller are measured side by side.
//! - [`datapath`]: HTTP requests/s and p99 through flowgate's VIP, HAProxy, nginx, and
//!   straight to a backend, on one Open vSwitch bridge with the same namespaces.
//! - [`memory`]: resident bytes per tracked connection.
//! - [`floor`]: the controller bench's floor, a VIP responder that decides nothing: the
//!   machine's part of a setup's cost and latency.
//! - [`bursts`]: what the latency tail of a run is made of.
//! - [`hiccups`]: how long the machine's CPUs go without running a busy thread: the
//!   host's part of any latency tail, measured before each controller run.
//! - [`cluster`]: the distributed mode: spill latency, and a domain's flow setup against
//!   single-controller mode, in one run with one etcd.
//!
//! Each prints a Markdown table and writes it to `--out FILE` when asked.

pub mod bursts;
pub mod cluster;
pub mod controller;
pub mod datapath;
pub mod floor;
pub mod hiccups;
pub mod memory;
pub mod switch;

use std::fmt::Write as _;
use std::path::Path;

/// The `bench` subcommands.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum BenchCmd {
    /// cbench for OpenFlow 1.3: flow setups/s and setup latency of a VIP balancer.
    Controller(controller::ControllerArgs),
    /// HTTP through the VIP vs HAProxy, nginx and direct, on real OVS (needs root).
    Datapath(datapath::DatapathArgs),
    /// Resident memory per tracked connection.
    Memory(memory::MemoryArgs),
    /// Distributed mode (needs etcd): spill latency, and flow setup domain vs single.
    Cluster(cluster::ClusterArgs),
    /// The controller bench's floor: a VIP responder that decides nothing (its peer
    /// `floor`; it runs until stopped).
    Floor(floor::FloorArgs),
    /// The machine's hiccups: a busy thread on each CPU, and how long each went without
    /// running (what no controller can answer through).
    Hiccups(hiccups::HiccupsArgs),
}

/// A Markdown table.
#[derive(Debug, Clone, Default)]
pub struct Table {
    pub header: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(header: &[&str]) -> Self {
        Table {
            header: header.iter().map(|s| s.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, r: Vec<String>) {
        self.rows.push(r);
    }

    pub fn markdown(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "| {} |", self.header.join(" | "));
        let _ = writeln!(
            s,
            "|{}|",
            self.header
                .iter()
                .map(|_| " --- ")
                .collect::<Vec<_>>()
                .join("|")
        );
        for r in &self.rows {
            let _ = writeln!(s, "| {} |", r.join(" | "));
        }
        s
    }
}

/// 1234567.8 → "1,234,568".
pub fn fmt_rate(x: f64) -> String {
    let n = x.round().max(0.0) as u64;
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The machine, for the results: nproc, CPU model, kernel, OVS version.
///
/// nproc counts the machine's CPUs (`/proc/cpuinfo`), not the ones this process may use:
/// `--pin` leaves the bench one.
pub fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let nproc = match cpuinfo
        .lines()
        .filter(|l| l.starts_with("processor"))
        .count()
    {
        0 => std::thread::available_parallelism().map_or(0, |n| n.get()),
        n => n,
    };
    let cpu = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map_or_else(|| "?".into(), |s| s.trim().to_string());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into());
    let ovs = std::process::Command::new("ovs-vsctl")
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .map(|l| l.trim().to_string())
        })
        .unwrap_or_else(|| "ovs-vsctl not found".into());
    format!("nproc {nproc}; CPU {cpu}; kernel {kernel}; {ovs}")
}

fn emit(title: &str, command: &str, body: &str, out: Option<&Path>) -> anyhow::Result<()> {
    let doc = format!(
        "## {title}\n\nMachine: {}\n\nCommand: `{command}`\n\n{body}",
        machine()
    );
    println!("{doc}");
    if let Some(p) = out {
        std::fs::write(p, &doc).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?;
    }
    Ok(())
}

fn command_line() -> String {
    std::env::args().collect::<Vec<_>>().join(" ")
}

/// Run one `bench` subcommand.
pub fn run(cmd: BenchCmd) -> anyhow::Result<()> {
    match cmd {
        BenchCmd::Controller(args) => {
            let report = controller::run(&args)?;
            let mut body = controller::table(&report).markdown();
            body += "\nLatencies run from each probe's send to its answer's arrival in the switch's socket (the kernel's receive stamp); counted to the bench's read of it, they are given run by run below.\n";
            if !report.versions.is_empty() {
                body += &format!("\nControllers: {}\n", report.versions.join("; "));
            }
            let against = controller::latency_against_peers(&report);
            if !against.is_empty() {
                body += "\nLatency against the peers at the same rates (flowgate / peer):\n\n";
                for line in against {
                    body += &format!("- {line}\n");
                }
            }
            for r in &report.runs {
                if !r.invalid_samples.is_empty() {
                    body += &format!(
                        "\nInvalid answers from {}: {:?}\n",
                        r.controller, r.invalid_samples
                    );
                }
                if !r.errors.is_empty() {
                    body += &format!("\nSwitch errors with {}: {:?}\n", r.controller, r.errors);
                }
                if let Some(n) = r.tracked_at_end {
                    body += &format!(
                        "\nConnections {} tracked at the end of its run ({}): {}.\n",
                        r.controller,
                        r.pace,
                        fmt_rate(n as f64)
                    );
                }
                if let Some(s) = &r.steal {
                    let cpus: Vec<String> = s
                        .per_cpu_ms
                        .iter()
                        .enumerate()
                        .map(|(i, ms)| format!("CPU {i} {ms} ms"))
                        .collect();
                    body += &format!(
                        "\nHost steal over the measured loops of {}, {} ({:.1} s): {}.\n",
                        r.controller,
                        r.pace,
                        s.over.as_secs_f64(),
                        cpus.join(", ")
                    );
                }
                if !r.hiccups_before.is_empty() {
                    let cpus: Vec<String> = r
                        .hiccups_before
                        .iter()
                        .map(hiccups::Hiccups::sentence)
                        .collect();
                    // Peers the bench started have a version line; those were started
                    // after the meter ran.
                    let when = if report.versions.is_empty() {
                        ""
                    } else {
                        ", before the controller was started"
                    };
                    body += &format!(
                        "\nHost hiccups in the {:.1} s before {}, {} (a busy thread on each CPU{when}): {}.\n",
                        r.hiccups_before[0].span.as_secs_f64(),
                        r.controller,
                        r.pace,
                        cpus.join("; ")
                    );
                }
                if let Some(l) = &r.against_schedule {
                    body += &format!(
                        "\nSend lag of {}, {} (how late the switches sent their probes against the schedule; not in the latencies, which count from the send): p50 {} µs, p99 {} µs, max {} µs. Counted from the schedule instead, the setups' latency: p50 {} µs, p99 {} µs, p99.9 {} µs.\n",
                        r.controller,
                        r.pace,
                        l.send_lag_p50_us,
                        l.send_lag_p99_us,
                        l.send_lag_max_us,
                        l.from_due.p50_us,
                        l.from_due.p99_us,
                        l.from_due.p999_us
                    );
                }
                body += &format!(
                    "\nLatency of {}, {}, counted to when the bench read each answer instead of to its arrival in the switch's socket{}: p50 {} µs, p99 {} µs, p99.9 {} µs.\n",
                    r.controller,
                    r.pace,
                    if r.arrival_stamped {
                        " (the bench's own delays in reading and checking included)"
                    } else {
                        " (the kernel did not stamp every answer's arrival: the table counts to the read too)"
                    },
                    r.at_read.p50_us,
                    r.at_read.p99_us,
                    r.at_read.p999_us
                );
                if let Some(b) = &r.bursts {
                    body += &format!(
                        "\nTail of {}, {}: {}.\n",
                        r.controller,
                        r.pace,
                        b.sentence(r.measured, r.switches)
                    );
                }
            }
            emit(
                "Controller: flow setups (cbench for OpenFlow 1.3)",
                &command_line(),
                &body,
                args.out.as_deref(),
            )
        }
        BenchCmd::Datapath(args) => {
            let results = datapath::run(&args)?;
            emit(
                "Data path: HTTP through the VIP, proxies and direct",
                &command_line(),
                &datapath::table(&results).markdown(),
                args.out.as_deref(),
            )
        }
        BenchCmd::Cluster(args) => {
            let report = cluster::run(&args)?;
            emit(
                "Distributed mode: spill latency and flow setup (domain vs single)",
                &command_line(),
                &cluster::body(&args, &report),
                args.out.as_deref(),
            )
        }
        BenchCmd::Floor(args) => floor::run(&args),
        BenchCmd::Hiccups(args) => {
            let seen = hiccups::run(&args)?;
            emit(
                "Host hiccups: how long a busy thread on each CPU went without running",
                &command_line(),
                &hiccups::table(&seen).markdown(),
                args.out.as_deref(),
            )
        }
        BenchCmd::Memory(args) => {
            let results = memory::run(&args)?;
            if args.child.is_some() {
                return Ok(());
            }
            emit(
                "Memory per tracked connection",
                &command_line(),
                &memory::table(&results, args.ports_per_client).markdown(),
                args.out.as_deref(),
            )
        }
    }
}
