//! `flowgate bench controller`: cbench for OpenFlow 1.3, with VIP-balancer answers checked.

use std::fmt::Write as _;
use std::net::{Ipv4Addr, SocketAddr, TcpListener as StdListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use flowgate_packet::MacAddr;

use super::bursts::Bursts;
use super::hiccups::{self, Hiccups};

use super::switch::{
    CheckMode, OpenLoop, Pace, RunFlags, SwitchCounters, SwitchPlan, SwitchRun, micros_hist,
    run_switch_in,
};
use super::{Table, fmt_rate};

/// The os-ken peer app, written out next to its plan when the peer is started.
pub const OSKEN_APP: &str = include_str!("../../../../bench/osken/vip_lb.py");

/// A controller the bench can start itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Peer {
    /// This binary's `controller`, one VIP service per emulated switch.
    Flowgate,
    /// bench/osken/vip_lb.py under `osken-manager` (the seed's balancer on os-ken).
    Osken,
    /// Debian's `ovs-testcontroller` (a learning switch: L2 mode only).
    OvsTestcontroller,
    /// `flowgate bench floor`: a VIP responder that decides nothing (prebuilt answers,
    /// no state): what the machine alone costs. With `--fractions-of-first`, at
    /// flowgate's rates.
    Floor,
}

impl Peer {
    fn name(self) -> &'static str {
        match self {
            Peer::Flowgate => "flowgate",
            Peer::Osken => "os-ken vip_lb.py",
            Peer::OvsTestcontroller => "ovs-testcontroller",
            Peer::Floor => "floor",
        }
    }
}

#[derive(Debug, Clone, clap::Args)]
pub struct ControllerArgs {
    /// The controller under test (an already running OpenFlow 1.3 controller).
    /// Without it, the `--peers` are started here, one after the other.
    #[arg(long)]
    pub controller: Option<SocketAddr>,
    /// Controllers to start and measure side by side (comma-separated).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "flowgate")]
    pub peers: Vec<Peer>,
    /// Emulated switches (cbench -s).
    #[arg(long, short = 's', default_value_t = 16)]
    pub switches: usize,
    /// Measured loops (cbench -l).
    #[arg(long, short = 'l', default_value_t = 16)]
    pub loops: usize,
    /// Milliseconds per loop (cbench -m).
    #[arg(long, short = 'm', default_value_t = 1000)]
    pub ms_per_loop: u64,
    /// Warm-up loops, not counted (cbench -w).
    #[arg(long, short = 'w', default_value_t = 1)]
    pub warmup: usize,
    /// What counts as an answer: `vip` checks a VIP balancer's three messages; `l2`
    /// counts any FLOW_MOD/PACKET_OUT as cbench does (for learning switches). The
    /// default is `vip`, except for ovs-testcontroller which is always measured in `l2`.
    #[arg(long, value_enum, default_value = "vip")]
    pub mode: CheckMode,
    /// Latency mode: one probe outstanding per switch (cbench's default). Without it
    /// (and without --rate), throughput mode: `--window` outstanding per switch.
    #[arg(long, conflicts_with = "rate")]
    pub latency: bool,
    /// Outstanding probes per switch in throughput mode.
    #[arg(long, default_value_t = 256)]
    pub window: usize,
    /// Open loop: new connections per second, all switches together, at a fixed rate.
    #[arg(long)]
    pub rate: Option<f64>,
    /// flowgate only: its own overload control (`[controller.overload] mode`), e.g.
    /// `adaptive` with `--rate` far beyond its capacity to see it gate a PACKET_IN flood.
    #[arg(long, default_value = "off", value_parser = ["off", "adaptive"])]
    pub controller_overload: String,
    /// After each throughput run, also run open loop at these fractions of the peak just
    /// measured, each with a fresh controller (comma-separated): 0.5 for the "p99 at half
    /// the peak rate" figure, or several for the latency against the rate, to read at
    /// which share of its peak a controller still meets a latency target.
    #[arg(long, value_delimiter = ',', value_parser = fraction)]
    pub also_rate_fraction: Vec<f64>,
    /// Every peer's `--also-rate-fraction` runs take the fractions of the first peer's
    /// peak, not of their own: to measure a peer at the first one's rates (the `floor` at
    /// flowgate's, above all).
    #[arg(long, requires = "also_rate_fraction")]
    pub fractions_of_first: bool,
    /// Give the controller under test and the emulated switches CPUs of their own: the
    /// controller the first CPU this process may use, the switches the others. cbench's
    /// method runs them on separate machines; sharing the cores, the two preempt each
    /// other and the latency measures the scheduler. Needs two CPUs; applies to every peer
    /// the bench starts (not to a `--controller` running elsewhere).
    #[arg(long, conflicts_with = "controller")]
    pub pin: bool,
    /// The emulated switches' thread polls rather than sleeps between messages, as a
    /// load generator on a core of its own does (DPDK's, or cbench's on a machine of its
    /// own): the controller's answers then neither wake it (on a VM, an interrupt to its
    /// CPU, which the controller's write pays for) nor wait for it to wake. It takes the
    /// whole of its CPU, so it needs `--pin`.
    #[arg(long, requires = "pin")]
    pub busy_poll: bool,
    /// flowgate only: its worker threads (`[runtime] worker_threads`; 0: its default, one
    /// per CPU). Its decisions run under one lock whatever the count, and here the
    /// emulated switches need one of the machine's cores: a second worker only contends
    /// for that lock and with the switches (measured on a 2-core VM: 600–630k setups/s
    /// with one against 419–523k with two, in four alternating pairs). So one by default.
    #[arg(long, default_value_t = 1)]
    pub controller_threads: usize,
    /// flowgate and the floor: their worker polls the switches' sockets for this many
    /// microseconds before it sleeps (`[runtime] spin_before_park_us`; 0, the default:
    /// off). Under a steady load longer than the gap between two batches, it never
    /// sleeps, so a batch does not wait for its CPU to wake.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=10_000))]
    pub controller_spin_us: u64,
    /// flowgate only: the connections its table is built for at start (`[controller]
    /// preallocate_connections`; 0, the default: it grows as they come). Every probe is
    /// a new connection and none ends unless `--expire-after`, so a run tracks about its
    /// rate times its length.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=100_000_000))]
    pub controller_preallocate: u64,
    /// Before each run, measure the machine's hiccups for this many milliseconds: a busy
    /// thread on each CPU, and how long each went without running (see `flowgate bench
    /// hiccups`), before the controller under test is started. 0: not measured.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(0..=60_000))]
    pub hiccups_ms: u64,
    /// A probe without a complete answer after this many milliseconds is lost.
    #[arg(long, default_value_t = 10_000)]
    pub timeout_ms: u64,
    /// Connections end: once a switch has more than this many live connections, the
    /// oldest one's rules idle out and the switch sends FLOW_REMOVED for each rule that
    /// asked for it (OFPFF_SEND_FLOW_REM), as OVS would. 0 = never (cbench: every probe
    /// is a new flow and the controller's table grows for the whole run).
    #[arg(long, default_value_t = 0)]
    pub expire_after: usize,
    /// The VIP of switch 0 (switch i uses the second octet + i).
    #[arg(long, default_value = "10.0.0.100")]
    pub vip: Ipv4Addr,
    /// Backends of switch 0, on ports 2, 3, ... (switch i: second octet + i).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "10.0.0.2,10.0.0.3,10.0.0.4"
    )]
    pub backends: Vec<Ipv4Addr>,
    /// The service port.
    #[arg(long, default_value_t = 80)]
    pub vport: u16,
    /// Milliseconds between the handshake and the first probe (cbench -D).
    #[arg(long, default_value_t = 1000)]
    pub delay_ms: u64,
    /// The os-ken venv (with `osken-manager`).
    #[arg(
        long,
        env = "FLOWGATE_OSKEN_VENV",
        default_value = "/opt/flowgate/osken-venv"
    )]
    pub osken_venv: PathBuf,
    /// Write the results table here (Markdown).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Print less (no per-loop lines).
    #[arg(long, short)]
    pub quiet: bool,
}

/// One measured run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RunResult {
    pub controller: String,
    pub mode: CheckMode,
    pub pace: String,
    /// The offered rate of an open-loop run, setups/s (`None`: a closed loop).
    pub offered: Option<f64>,
    pub switches: usize,
    /// responses/s per measured loop.
    pub loops: Vec<f64>,
    pub min: f64,
    pub max: f64,
    pub avg: f64,
    pub stdev: f64,
    /// Setup latency: from a probe's send to its answer's arrival in the switch's socket
    /// (the kernel's receive stamp, where `arrival_stamped`).
    pub p50_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub max_us: u64,
    /// Every switch's answers carried the kernel's stamp of their arrival; without it,
    /// an answer arrived when the bench read it.
    pub arrival_stamped: bool,
    /// The latencies counted to when the bench read each answer instead: they add the
    /// bench's own delays in reading and checking (how stop 40 and before counted).
    pub at_read: Quantiles,
    /// Setups with a latency: those answered during the measured loops.
    pub measured: u64,
    /// The slow ones among them, in bursts (open loop and latency mode).
    pub bursts: Option<Bursts>,
    pub sent: u64,
    pub valid: u64,
    pub invalid: u64,
    pub lost: u64,
    /// Open loop: probes the emulated switches dropped, their queue to the controller full.
    pub not_sent: u64,
    /// Probes whose rules the controller deferred to the client's ACK (it gapped itself).
    pub deferred: u64,
    /// PACKET_INs per second the controller took from the switches over the measured
    /// loops (probes plus the handshakes' SYN-ACKs and ACKs; see
    /// `SwitchCounters::packet_ins`).
    pub packet_in_rate: f64,
    pub vip_arp_answered: bool,
    pub invalid_samples: Vec<String>,
    pub errors: Vec<String>,
    /// The controller's CPU time (all threads) per valid setup over the measured loops,
    /// when the bench started it: unlike setups/s, barely moved by other load on a
    /// shared machine.
    pub cpu_us_per_setup: Option<f64>,
    /// The same for the bench itself (the emulated switches: encode, decode, check).
    pub bench_cpu_us_per_setup: Option<f64>,
    /// Connections the controller tracked when the measured loops ended (flowgate, when
    /// the bench started it: its API's `flowgate_connections`).
    pub tracked_at_end: Option<u64>,
    /// What the hypervisor took from this (virtual) machine over the measured loops.
    pub steal: Option<Steal>,
    /// Open loop: how late the emulated switches sent their probes against the schedule
    /// (a probe's latency counts from when it was sent, so this is not in it).
    pub against_schedule: Option<AgainstSchedule>,
    /// The machine's hiccups just before the run (`--hiccups-ms`), one per CPU, before
    /// the bench started the controller under test.
    pub hiccups_before: Vec<Hiccups>,
}

/// How late the emulated switches sent their batches of probes against the open-loop
/// schedule, in µs: the bench's own delay (its thread busy, or its CPU stalled), which a
/// probe's latency does not count; and the latencies counted from the schedule instead,
/// which do (wrk2's correction for coordinated omission).
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct AgainstSchedule {
    pub send_lag_p50_us: u64,
    pub send_lag_p99_us: u64,
    pub send_lag_max_us: u64,
    pub from_due: Quantiles,
}

/// Three quantiles of a latency distribution, µs.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Quantiles {
    pub p50_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
}

impl Quantiles {
    pub fn of(h: &hdrhistogram::Histogram<u64>) -> Quantiles {
        Quantiles {
            p50_us: h.value_at_quantile(0.5),
            p99_us: h.value_at_quantile(0.99),
            p999_us: h.value_at_quantile(0.999),
        }
    }
}

/// Milliseconds each CPU was ready to run but the hypervisor ran something else
/// (`/proc/stat` steal), over a span: stalls that no controller can answer through.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Steal {
    pub per_cpu_ms: Vec<u64>,
    pub over: Duration,
}

/// A fraction of the peak rate for `--also-rate-fraction`: above 0 (over 1 runs past
/// the peak, to see a controller overloaded).
fn fraction(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(f) if f.is_finite() && f > 0.0 => Ok(f),
        _ => Err(format!("{s:?} is not a fraction above 0")),
    }
}

fn second_octet_plus(a: Ipv4Addr, i: usize) -> Ipv4Addr {
    let o = a.octets();
    Ipv4Addr::new(o[0], o[1].wrapping_add(i as u8), o[2], o[3])
}

/// The address plan of every emulated switch.
pub fn plans(args: &ControllerArgs) -> anyhow::Result<Vec<SwitchPlan>> {
    if args.switches == 0 || args.switches > 200 {
        bail!("--switches must be 1..=200");
    }
    if args.backends.is_empty() {
        bail!("--backends must name at least one backend");
    }
    Ok((0..args.switches)
        .map(|i| SwitchPlan {
            dpid: i as u64 + 1,
            vip: second_octet_plus(args.vip, i),
            vport: args.vport,
            backends: args
                .backends
                .iter()
                .enumerate()
                .map(|(b, ip)| {
                    (
                        second_octet_plus(*ip, i),
                        MacAddr([0x02, 0x00, 0x0b, i as u8, 0x00, b as u8 + 2]),
                        b as u32 + 2,
                    )
                })
                .collect(),
            client_mac: MacAddr([0x02, 0x00, 0x0c, i as u8, 0x00, 0x01]),
            client_base: [11, i as u8],
            client_port: 1,
        })
        .collect())
}

/// Run one measurement against `addr`.
pub fn measure(
    rt: &tokio::runtime::Runtime,
    name: &str,
    addr: SocketAddr,
    args: &ControllerArgs,
    mode: CheckMode,
    pace: Pace,
) -> anyhow::Result<RunResult> {
    measure_watched(rt, name, addr, args, mode, pace, None)
}

/// [`measure`], watching the controller under test (see [`Watched`]).
pub fn measure_watched(
    rt: &tokio::runtime::Runtime,
    name: &str,
    addr: SocketAddr,
    args: &ControllerArgs,
    mode: CheckMode,
    pace: Pace,
    watched: Option<Watched>,
) -> anyhow::Result<RunResult> {
    rt.block_on(measure_async(name, addr, args, mode, pace, watched))
}

/// Each CPU's steal time so far, in ms (`/proc/stat`: the 8th figure of each `cpuN`
/// line, in clock ticks of 1/100 s). `None` where the kernel does not count it.
fn steal_ms() -> Option<Vec<u64>> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let cpus: Vec<u64> = stat
        .lines()
        .filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
        .map(|l| {
            l.split_whitespace()
                .nth(8)
                .and_then(|v| v.parse::<u64>().ok())
        })
        .collect::<Option<_>>()?;
    (!cpus.is_empty()).then(|| cpus.iter().map(|t| t * 10).collect())
}

/// User + system CPU time of a process, all its threads, in seconds (`/proc/PID/stat`
/// fields 14 and 15, in clock ticks of 1/100 s on Linux).
fn cpu_secs(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces: count fields after its closing paren.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / 100.0)
}

async fn measure_async(
    name: &str,
    addr: SocketAddr,
    args: &ControllerArgs,
    mode: CheckMode,
    pace: Pace,
    watched: Option<Watched>,
) -> anyhow::Result<RunResult> {
    let pid = watched.map(|w| w.pid);
    let plans = plans(args)?;
    let n = plans.len();
    let flags = Arc::new(RunFlags::default());
    let counters: Vec<Arc<SwitchCounters>> = (0..n)
        .map(|_| Arc::new(SwitchCounters::default()))
        .collect();
    let per_switch = match pace {
        Pace::Window(w) => Pace::Window(w),
        Pace::Rate(r) => Pace::Rate(r / n as f64),
    };
    // Open loop: one schedule for all the switches, so that their probes interleave
    // evenly instead of each switch keeping time on its own.
    let open = match pace {
        Pace::Rate(r) => Some(OpenLoop::new(r, n)),
        Pace::Window(_) => None,
    };
    let driver = open
        .as_ref()
        .map(|o| o.spawn(flags.clone(), args.busy_poll));
    // Without a schedule to step, `--busy-poll` still keeps the switches' thread awake.
    let spinner = (args.busy_poll && open.is_none()).then(|| {
        let flags = flags.clone();
        tokio::spawn(async move {
            while !flags.stop.load(Ordering::Relaxed) {
                tokio::task::yield_now().await;
            }
        })
    });
    let mut pace_label = match pace {
        Pace::Window(1) => "latency (1 outstanding/switch)".to_string(),
        Pace::Window(w) => format!("throughput ({w} outstanding/switch)"),
        Pace::Rate(r) => format!("open loop {}/s", fmt_rate(r)),
    };
    if args.expire_after > 0 {
        pace_label += &format!(", FLOW_REMOVED beyond {} live/switch", args.expire_after);
    }
    if args.busy_poll {
        pace_label += ", switches busy-polled";
    }
    if !args.quiet {
        eprintln!("bench controller: {name} at {addr}, {n} switches, {pace_label}, mode {mode:?}");
    }
    let handles: Vec<_> = plans
        .into_iter()
        .zip(&counters)
        .enumerate()
        .map(|(i, (p, c))| {
            tokio::spawn(run_switch_in(
                SwitchRun {
                    controller: addr,
                    plan: p,
                    check: mode,
                    pace: per_switch,
                    timeout: Duration::from_millis(args.timeout_ms),
                    expire_after: args.expire_after,
                    counters: c.clone(),
                    flags: flags.clone(),
                },
                open.clone().map(|o| (o, i)),
            ))
        })
        .collect();

    // Handshake and learning, then cbench's -D delay.
    let t0 = Instant::now();
    while !counters.iter().all(|c| c.ready.load(Ordering::Relaxed)) {
        if t0.elapsed() > Duration::from_secs(15) || handles.iter().any(|h| h.is_finished()) {
            flags.stop.store(true, Ordering::Relaxed);
            let errs: Vec<String> = futures_join(handles)
                .await
                .into_iter()
                .filter_map(|r| r.error)
                .collect();
            bail!("{name}: the switches did not finish the handshake: {errs:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(args.delay_ms)).await;
    flags.go.store(true, Ordering::Relaxed);

    let total = |f: fn(&SwitchCounters) -> u64| counters.iter().map(|c| f(c)).sum::<u64>();
    let mut loops = Vec::new();
    let mut last: Vec<u64> = counters
        .iter()
        .map(|c| c.valid.load(Ordering::Relaxed))
        .collect();
    let mut at = Instant::now();
    let mut cpu_start = None;
    let mut bench_cpu_start = None;
    let mut steal_start = None;
    let mut valid_start = 0;
    let (mut packet_in_start, mut measured_from) = (0, Instant::now());
    for l in 0..(args.warmup + args.loops) {
        if l == args.warmup {
            flags.measuring.store(true, Ordering::Relaxed);
            packet_in_start = total(|c| c.packet_ins.load(Ordering::Relaxed));
            measured_from = Instant::now();
            cpu_start = pid.and_then(cpu_secs);
            bench_cpu_start = cpu_secs(std::process::id());
            steal_start = steal_ms();
            valid_start = total(|c| c.valid.load(Ordering::Relaxed));
        }
        let next = at + Duration::from_millis(args.ms_per_loop);
        tokio::time::sleep(next.saturating_duration_since(Instant::now())).await;
        let now = Instant::now();
        let secs = now.duration_since(at).as_secs_f64();
        at = now;
        let cur: Vec<u64> = counters
            .iter()
            .map(|c| c.valid.load(Ordering::Relaxed))
            .collect();
        let per: Vec<u64> = cur.iter().zip(&last).map(|(a, b)| a - b).collect();
        last = cur;
        let sum: u64 = per.iter().sum();
        let rate = sum as f64 / secs;
        if !args.quiet {
            let ms = secs * 1000.0;
            let each: Vec<String> = per
                .iter()
                .map(|x| format!("{:.2}", *x as f64 / ms))
                .collect();
            eprintln!(
                "{n:>3} switches: flows/ms: {}  total = {:.2} per ms{}",
                each.join(" "),
                sum as f64 / ms,
                if l < args.warmup { " (warm-up)" } else { "" }
            );
        }
        if l >= args.warmup {
            loops.push(rate);
        }
    }
    let setups = total(|c| c.valid.load(Ordering::Relaxed)) - valid_start;
    let packet_in_rate = (total(|c| c.packet_ins.load(Ordering::Relaxed)) - packet_in_start) as f64
        / measured_from.elapsed().as_secs_f64().max(1e-9);
    let per_setup = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if setups > 0 => Some((b - a) * 1e6 / setups as f64),
        _ => None,
    };
    let cpu_us_per_setup = per_setup(cpu_start, pid.and_then(cpu_secs));
    let steal = match (steal_start, steal_ms()) {
        (Some(a), Some(b)) if a.len() == b.len() => Some(Steal {
            per_cpu_ms: a
                .iter()
                .zip(&b)
                .map(|(a, b)| b.saturating_sub(*a))
                .collect(),
            over: measured_from.elapsed(),
        }),
        _ => None,
    };
    let bench_cpu_us_per_setup = per_setup(bench_cpu_start, cpu_secs(std::process::id()));
    // Asked while the switches still run, as they left it.
    let tracked_at_end = match watched.and_then(|w| w.api) {
        Some(api) => tokio::task::spawn_blocking(move || tracked_connections(api))
            .await
            .ok()
            .flatten(),
        None => None,
    };
    flags.stop.store(true, Ordering::Relaxed);
    let results = futures_join(handles).await;
    let (mut hist, mut send_lag, mut from_due) = (micros_hist(), micros_hist(), micros_hist());
    let mut at_read = micros_hist();
    let mut arrival_stamped = true;
    let mut samples = Vec::new();
    let mut errors = Vec::new();
    let (mut slow, mut capped, mut sent_late) = (Vec::new(), false, 0);
    for (i, r) in results.into_iter().enumerate() {
        hist.add(&r.hist)?;
        at_read.add(&r.hist_at_read)?;
        arrival_stamped &= r.arrival_stamped;
        send_lag.add(&r.send_lag)?;
        from_due.add(&r.hist_from_due)?;
        let i = u16::try_from(i).unwrap_or(u16::MAX);
        slow.extend(r.slow.into_iter().map(|t| (t, i)));
        capped |= r.slow_capped;
        sent_late += r.slow_sent_late;
        samples.extend(r.samples);
        errors.extend(r.error);
    }
    if let Some(s) = spinner {
        let _ = s.await;
    }
    if let Some(d) = driver {
        match d.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => errors.push(e),
            Err(e) => errors.push(format!("open-loop schedule: {e}")),
        }
    }
    samples.truncate(5);
    let (min, max, avg, stdev) = stats(&loops);
    println!(
        "RESULT: {n} switches {} tests min/max/avg/stdev = {min:.2}/{max:.2}/{avg:.2}/{stdev:.2} responses/s",
        loops.len()
    );
    Ok(RunResult {
        controller: name.to_string(),
        mode,
        pace: pace_label,
        offered: match pace {
            Pace::Rate(r) => Some(r),
            Pace::Window(_) => None,
        },
        switches: n,
        loops,
        min,
        max,
        avg,
        stdev,
        p50_us: hist.value_at_quantile(0.5),
        p99_us: hist.value_at_quantile(0.99),
        p999_us: hist.value_at_quantile(0.999),
        max_us: hist.max(),
        arrival_stamped,
        at_read: Quantiles::of(&at_read),
        measured: hist.len(),
        bursts: pace.keeps_slow().then(|| Bursts {
            sent_late: matches!(pace, Pace::Rate(_)).then_some(sent_late),
            ..Bursts::of(slow, n, capped)
        }),
        sent: total(|c| c.sent.load(Ordering::Relaxed)),
        valid: total(|c| c.valid.load(Ordering::Relaxed)),
        invalid: total(|c| c.invalid.load(Ordering::Relaxed)),
        lost: total(|c| c.lost.load(Ordering::Relaxed)),
        not_sent: total(|c| c.not_sent.load(Ordering::Relaxed)),
        deferred: total(|c| c.deferred.load(Ordering::Relaxed)),
        packet_in_rate,
        vip_arp_answered: counters
            .iter()
            .all(|c| c.vip_arp_answered.load(Ordering::Relaxed)),
        invalid_samples: samples,
        errors,
        cpu_us_per_setup,
        bench_cpu_us_per_setup,
        tracked_at_end,
        steal,
        against_schedule: (matches!(pace, Pace::Rate(_)) && !send_lag.is_empty()).then(|| {
            AgainstSchedule {
                send_lag_p50_us: send_lag.value_at_quantile(0.5),
                send_lag_p99_us: send_lag.value_at_quantile(0.99),
                send_lag_max_us: send_lag.max(),
                from_due: Quantiles::of(&from_due),
            }
        }),
        hiccups_before: Vec::new(),
    })
}

/// The machine's hiccups over `--hiccups-ms`, before a run (empty when 0). Measured
/// before the bench starts the controller under test: a controller that polls when it
/// is idle (`--controller-spin-us`) would take the meter's CPU, and the switches'
/// thread does, busy-polled. Not measured is no reason to stop the bench: the report
/// then has no such line.
fn hiccups_before(args: &ControllerArgs) -> Vec<Hiccups> {
    if args.hiccups_ms == 0 {
        return Vec::new();
    }
    let span = Duration::from_millis(args.hiccups_ms);
    match hiccups::online_cpus().and_then(|cpus| hiccups::measure(&cpus, span)) {
        Ok(h) => h,
        Err(e) => {
            eprintln!("bench controller: the host's hiccups were not measured: {e:#}");
            Vec::new()
        }
    }
}

/// Before a run: the host's hiccups, then the peer under test started (none for a
/// controller the user runs) and its pinning checked.
fn start_peer(
    peer: Option<Peer>,
    args: &ControllerArgs,
    pin: Option<&Pinning>,
) -> anyhow::Result<(Vec<Hiccups>, Option<Spawned>)> {
    let before = hiccups_before(args);
    let Some(p) = peer else {
        return Ok((before, None));
    };
    let spawned = spawn_peer(p, args, pin)?;
    if let Some(pin) = pin {
        pin.check(spawned.pid())?;
    }
    Ok((before, Some(spawned)))
}

async fn futures_join(
    handles: Vec<tokio::task::JoinHandle<super::switch::SwitchResult>>,
) -> Vec<super::switch::SwitchResult> {
    let mut out = Vec::new();
    for h in handles {
        if let Ok(r) = h.await {
            out.push(r);
        }
    }
    out
}

fn stats(v: &[f64]) -> (f64, f64, f64, f64) {
    if v.is_empty() {
        return (0.0, 0.0, 0.0, 0.0);
    }
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = v.iter().copied().fold(0.0, f64::max);
    let avg = v.iter().sum::<f64>() / v.len() as f64;
    let var = v.iter().map(|x| (x - avg).powi(2)).sum::<f64>() / v.len() as f64;
    (min, max, avg, var.sqrt())
}

// ----- peers -------------------------------------------------------------------------

/// A controller started for the bench; killed (by its own pid) when dropped.
pub struct Spawned {
    pub name: String,
    pub addr: SocketAddr,
    pub version: String,
    /// flowgate's HTTP API.
    pub api: Option<SocketAddr>,
    child: Child,
    _dir: TempDir,
}

impl Spawned {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What the bench watches of it while it measures.
    pub fn watched(&self) -> Watched {
        Watched {
            pid: self.pid(),
            api: self.api,
        }
    }
}

/// The controller under test, when the bench started it: its CPU time is charged to the
/// setups it answered, and flowgate's API says how many connections it still tracks at
/// the end (with `--expire-after`, bounded by what the switches keep live, if it ends
/// connections on their FLOW_REMOVED).
#[derive(Debug, Clone, Copy)]
pub struct Watched {
    pub pid: u32,
    pub api: Option<SocketAddr>,
}

/// `flowgate_connections` from flowgate's `/metrics`.
fn tracked_connections(api: SocketAddr) -> Option<u64> {
    let r = crate::cli::ctl::request(&format!("http://{api}"), "GET", "/metrics", None, None)
        .ok()
        .filter(|r| r.status == 200)?;
    r.body
        .lines()
        .find_map(|l| l.strip_prefix("flowgate_connections "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|v| v as u64)
}

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> anyhow::Result<TempDir> {
        let p = std::env::temp_dir().join(format!(
            "flowgate-bench-{tag}-{}-{}",
            std::process::id(),
            Instant::now().elapsed().as_nanos()
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p)?;
        Ok(TempDir(p))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn free_port() -> anyhow::Result<u16> {
    Ok(StdListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn wait_listening(addr: SocketAddr, child: &mut Child, log: &Path) -> anyhow::Result<()> {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(30) {
        if std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return Ok(());
        }
        if let Some(st) = child.try_wait()? {
            bail!(
                "exited ({st}) before listening: {}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("not listening on {addr} after 30 s")
}

/// flowgate's config for the bench: one VIP service per emulated switch.
pub fn flowgate_config(args: &ControllerArgs) -> anyhow::Result<String> {
    let mut c = String::from(
        "[openflow]\nlisten = \"127.0.0.1:0\"\npacket_in_rate = 100000000\n\n[api]\nlisten = \"127.0.0.1:0\"\n",
    );
    if args.controller_threads > 0 || args.controller_spin_us > 0 {
        c += "\n[runtime]\n";
    }
    if args.controller_threads > 0 {
        c += &format!("worker_threads = {}\n", args.controller_threads);
    }
    if args.controller_spin_us > 0 {
        c += &format!("spin_before_park_us = {}\n", args.controller_spin_us);
    }
    if args.controller_preallocate > 0 {
        c += &format!(
            "\n[controller]\npreallocate_connections = {}\n",
            args.controller_preallocate
        );
    }
    if args.controller_overload != "off" {
        c += &format!(
            "\n[controller.overload]\nmode = \"{}\"\n",
            args.controller_overload
        );
    }
    for (i, p) in plans(args)?.iter().enumerate() {
        c += &format!(
            "\n[[service]]\nname = \"s{i}\"\nvip = \"{}\"\nport = {}\nalgorithm = \"round-robin\"\nvirtual_mac = \"02:66:67:00:{:02x}:01\"\n\n[service.health]\nkind = \"none\"\n",
            p.vip, p.vport, i
        );
        for (ip, _, _) in &p.backends {
            c += &format!("\n[[service.backend]]\naddress = \"{ip}\"\n");
        }
    }
    Ok(c)
}

/// How a peer's version line names `--controller-spin-us`.
fn spin_label(us: u64) -> String {
    match us {
        0 => String::new(),
        us => format!(", polls {us} µs before it sleeps"),
    }
}

fn flowgate_exe() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    // The bench may run from a test binary: use the real `flowgate` next to it.
    if exe.file_stem().is_some_and(|s| s == "flowgate") {
        return Ok(exe);
    }
    if let Ok(p) = std::env::var("FLOWGATE_BIN") {
        return Ok(PathBuf::from(p));
    }
    bail!("cannot find the flowgate binary (set FLOWGATE_BIN)")
}

/// The CPUs of `--pin`: the controller's, and the emulated switches'.
#[derive(Debug, Clone)]
pub struct Pinning {
    controller: usize,
    switches: rustix::thread::CpuSet,
}

impl Pinning {
    /// Split the CPUs this process may use: the first for the controller, the rest here.
    pub fn from_affinity() -> anyhow::Result<Self> {
        let cpus = cpus_of(None)?;
        let [controller, rest @ ..] = cpus.as_slice() else {
            bail!("--pin: no CPU to run on");
        };
        if rest.is_empty() {
            bail!("--pin needs two CPUs; this process may use only CPU {controller}");
        }
        let mut switches = rustix::thread::CpuSet::new();
        for &c in rest {
            switches.set(c);
        }
        Ok(Pinning {
            controller: *controller,
            switches,
        })
    }

    /// Check that the controller under test (`pid`) runs on its CPU alone.
    fn check(&self, pid: u32) -> anyhow::Result<()> {
        let pid = rustix::thread::Pid::from_raw(pid as i32).context("pid 0")?;
        let cpus = cpus_of(Some(pid))?;
        if cpus != [self.controller] {
            bail!(
                "--pin: the controller runs on CPUs {cpus:?}, not CPU {}",
                self.controller
            );
        }
        Ok(())
    }

    /// Move this thread (and the threads it starts from now on) to the switches' CPUs.
    pub fn pin_switches(&self) -> anyhow::Result<()> {
        rustix::thread::sched_setaffinity(None, &self.switches).context("sched_setaffinity")
    }
}

/// The CPUs a process (this one for `None`) may run on.
fn cpus_of(pid: Option<rustix::thread::Pid>) -> anyhow::Result<Vec<usize>> {
    let set = rustix::thread::sched_getaffinity(pid).context("sched_getaffinity")?;
    Ok((0..rustix::thread::CpuSet::MAX_CPU)
        .filter(|&c| set.is_set(c))
        .collect())
}

/// `prog`, or `taskset -c CPU prog` when pinned (`taskset` execs it: the same process).
fn command(prog: impl AsRef<std::ffi::OsStr>, pin: Option<&Pinning>) -> Command {
    match pin {
        Some(p) => {
            let mut c = Command::new("taskset");
            c.arg("-c").arg(p.controller.to_string()).arg(prog);
            c
        }
        None => Command::new(prog),
    }
}

/// A started peer's output, in its temporary directory.
const LOG_FILE: &str = "controller.log";

pub fn spawn_peer(
    peer: Peer,
    args: &ControllerArgs,
    pin: Option<&Pinning>,
) -> anyhow::Result<Spawned> {
    let dir = TempDir::new(match peer {
        Peer::Flowgate => "flowgate",
        Peer::Osken => "osken",
        Peer::OvsTestcontroller => "testcontroller",
        Peer::Floor => "floor",
    })?;
    let log_path = dir.0.join(LOG_FILE);
    let log = std::fs::File::create(&log_path)?;
    match peer {
        Peer::Flowgate => {
            let cfg = dir.0.join("flowgate.toml");
            std::fs::write(&cfg, flowgate_config(args)?)?;
            let ready = dir.0.join("ready.json");
            let exe = flowgate_exe()?;
            let mut child = command(&exe, pin)
                .args(["--log", "warn", "controller", "--config"])
                .arg(&cfg)
                .arg("--ready-file")
                .arg(&ready)
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .spawn()
                .with_context(|| format!("start {}", exe.display()))?;
            let t0 = Instant::now();
            let (addr, api): (SocketAddr, Option<SocketAddr>) = loop {
                if let Ok(s) = std::fs::read_to_string(&ready) {
                    let v: serde_json::Value = serde_json::from_str(&s)?;
                    let openflow = v["openflow"]
                        .as_str()
                        .context("ready file without openflow")?
                        .parse()?;
                    break (openflow, v["api"].as_str().and_then(|a| a.parse().ok()));
                }
                if let Some(st) = child.try_wait()? {
                    bail!(
                        "flowgate exited ({st}): {}",
                        std::fs::read_to_string(&log_path).unwrap_or_default()
                    );
                }
                if t0.elapsed() > Duration::from_secs(20) {
                    let _ = child.kill();
                    bail!("flowgate did not start");
                }
                std::thread::sleep(Duration::from_millis(20));
            };
            Ok(Spawned {
                name: peer.name().into(),
                addr,
                api,
                version: format!(
                    "flowgate {} ({}{}{})",
                    env!("CARGO_PKG_VERSION"),
                    match args.controller_threads {
                        0 => "worker threads: one per CPU".to_string(),
                        1 => "1 worker thread".to_string(),
                        n => format!("{n} worker threads"),
                    },
                    spin_label(args.controller_spin_us),
                    match args.controller_preallocate {
                        0 => String::new(),
                        n => format!(", table preallocated for {n} connections"),
                    }
                ),
                child,
                _dir: dir,
            })
        }
        Peer::Osken => {
            let manager = args.osken_venv.join("bin/osken-manager");
            if !manager.exists() {
                bail!(
                    "{} not found: run scripts/setup-bench-peers.sh (or set FLOWGATE_OSKEN_VENV)",
                    manager.display()
                );
            }
            let app = dir.0.join("vip_lb.py");
            std::fs::write(&app, OSKEN_APP)?;
            let plan = dir.0.join("plan.json");
            std::fs::write(&plan, services_plan(args)?)?;
            let port = free_port()?;
            let version = Command::new(&manager)
                .arg("--version")
                .output()
                .map(|o| {
                    let s = String::from_utf8_lossy(&o.stdout).to_string()
                        + &String::from_utf8_lossy(&o.stderr);
                    s.lines()
                        .find(|l| l.contains("osken-manager"))
                        .unwrap_or("os-ken ?")
                        .trim()
                        .to_string()
                })
                .unwrap_or_else(|_| "os-ken ?".into());
            let mut cmd = command(&manager, pin);
            cmd.args(["--ofp-listen-host", "127.0.0.1", "--ofp-tcp-listen-port"])
                .arg(port.to_string())
                .arg(&app)
                .env("FLOWGATE_BENCH_PLAN", &plan)
                .env("PYTHONWARNINGS", "ignore");
            let version = format!("os-ken {}", version.trim_start_matches("osken-manager "));
            spawn_listening(peer, cmd, port, version, log, dir)
        }
        Peer::Floor => {
            let plan = dir.0.join("plan.json");
            std::fs::write(&plan, services_plan(args)?)?;
            let port = free_port()?;
            let mut cmd = command(flowgate_exe()?, pin);
            cmd.args(["--log", "warn", "bench", "floor", "--listen"])
                .arg(format!("127.0.0.1:{port}"))
                .arg("--plan")
                .arg(&plan)
                .arg("--spin-before-park-us")
                .arg(args.controller_spin_us.to_string());
            let version = format!(
                "floor (flowgate {} bench floor, 1 worker thread{})",
                env!("CARGO_PKG_VERSION"),
                spin_label(args.controller_spin_us)
            );
            spawn_listening(peer, cmd, port, version, log, dir)
        }
        Peer::OvsTestcontroller => {
            let port = free_port()?;
            let version = Command::new("ovs-testcontroller")
                .arg("--version")
                .output()
                .map(|o| {
                    String::from_utf8_lossy(&o.stdout)
                        .lines()
                        .next()
                        .unwrap_or("")
                        .to_string()
                })
                .context("ovs-testcontroller not found: run scripts/setup-bench-peers.sh")?;
            let mut cmd = command("ovs-testcontroller", pin);
            cmd.args(["-O", "OpenFlow13", "--no-chdir", "-vconsole:off"])
                .arg(format!("ptcp:{port}:127.0.0.1"));
            spawn_listening(peer, cmd, port, version, log, dir)
        }
    }
}

/// Start a peer that listens for switches on 127.0.0.1:`port`, its output to `log` (in
/// `dir`, which it keeps), and wait until it listens.
fn spawn_listening(
    peer: Peer,
    mut cmd: Command,
    port: u16,
    version: String,
    log: std::fs::File,
    dir: TempDir,
) -> anyhow::Result<Spawned> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .with_context(|| {
            let prog = cmd.get_program().to_string_lossy().into_owned();
            let args: Vec<_> = cmd.get_args().map(|a| a.to_string_lossy()).collect();
            format!("start {}: {prog} {}", peer.name(), args.join(" "))
        })?;
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    if let Err(e) = wait_listening(addr, &mut child, &dir.0.join(LOG_FILE)) {
        let _ = child.kill();
        bail!("{}: {e}", peer.name());
    }
    Ok(Spawned {
        name: peer.name().into(),
        addr,
        version,
        api: None,
        child,
        _dir: dir,
    })
}

/// The services the os-ken app and the floor serve: per dpid, the VIP, its MAC, the
/// service port and the backends (IP, MAC, port).
pub fn services_plan(args: &ControllerArgs) -> anyhow::Result<String> {
    let mut m = serde_json::Map::new();
    for (i, p) in plans(args)?.iter().enumerate() {
        m.insert(
            p.dpid.to_string(),
            serde_json::json!({
                "vip": p.vip.to_string(),
                "vmac": format!("02:66:67:00:{i:02x}:01"),
                "port": p.vport,
                "backends": p.backends.iter().map(|(ip, mac, port)| serde_json::json!([ip.to_string(), mac.to_string(), port])).collect::<Vec<_>>(),
            }),
        );
    }
    Ok(serde_json::Value::Object(m).to_string())
}

/// Everything `flowgate bench controller` measured.
pub struct Report {
    pub runs: Vec<RunResult>,
    pub versions: Vec<String>,
}

pub fn run(args: &ControllerArgs) -> anyhow::Result<Report> {
    let pin = if args.pin {
        let p = Pinning::from_affinity()?;
        p.pin_switches()?;
        Some(p)
    } else {
        None
    };
    // One thread for all the emulated switches, as cbench: the other core is the
    // controller's.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let base_pace = match (args.rate, args.latency) {
        (Some(r), _) => Pace::Rate(r),
        (None, true) => Pace::Window(1),
        (None, false) => Pace::Window(args.window.max(1)),
    };
    let mut runs = Vec::new();
    let mut versions = Vec::new();
    // The first peer's peak, which `--fractions-of-first` applies to every peer.
    let mut first_peak: Option<(String, f64)> = None;
    let targets: Vec<Option<Peer>> = match args.controller {
        Some(_) => vec![None],
        None => args.peers.iter().copied().map(Some).collect(),
    };
    for t in targets {
        let mode = if t == Some(Peer::OvsTestcontroller) {
            CheckMode::L2
        } else {
            args.mode
        };
        let (before, mut spawned) = start_peer(t, args, pin.as_ref())?;
        let (name, addr) = match &spawned {
            Some(s) => {
                versions.push(s.version.clone());
                (s.name.clone(), s.addr)
            }
            None => (
                format!(
                    "controller at {}",
                    args.controller.unwrap_or(([127, 0, 0, 1], 6653).into())
                ),
                args.controller.unwrap_or(([127, 0, 0, 1], 6653).into()),
            ),
        };
        let watched = spawned.as_ref().map(Spawned::watched);
        let pinned = |mut r: RunResult, before: Vec<Hiccups>| {
            if let Some(p) = &pin {
                let _ = write!(r.pace, ", pinned (controller on CPU {})", p.controller);
            }
            r.hiccups_before = before;
            r
        };
        let r = pinned(
            measure_watched(&rt, &name, addr, args, mode, base_pace, watched)?,
            before,
        );
        let own_peak = r.avg;
        runs.push(r);
        if !matches!(base_pace, Pace::Window(w) if w > 1) || own_peak <= 0.0 {
            continue;
        }
        let first = first_peak.get_or_insert_with(|| (name.clone(), own_peak));
        let (peak, whose) = if args.fractions_of_first && first.0 != name {
            (first.1, format!("{}'s peak", first.0))
        } else {
            (own_peak, "the peak".to_string())
        };
        for &f in &args.also_rate_fraction {
            // A fresh controller, so each open-loop run starts from the same state
            // (the one before is stopped first: they would share the cores).
            drop(spawned.take());
            let before;
            (before, spawned) = start_peer(t, args, pin.as_ref())?;
            let addr = spawned.as_ref().map_or(addr, |s| s.addr);
            let watched = spawned.as_ref().map(Spawned::watched);
            let pace = Pace::Rate(peak * f);
            let mut r = pinned(
                measure_watched(&rt, &name, addr, args, mode, pace, watched)?,
                before,
            );
            // "open loop N/s (F of the peak), ..."
            r.pace = r.pace.replacen("/s", &format!("/s ({f} of {whose})"), 1);
            runs.push(r);
        }
    }
    Ok(Report { runs, versions })
}

/// flowgate's latency beside each other peer's at the same offered rate, one sentence
/// per rate both were run at: the comparison with a peer measured in the same run, on
/// the same cores, that a latency from a shared machine needs (`--fractions-of-first`
/// gives the peers flowgate's rates).
pub fn latency_against_peers(report: &Report) -> Vec<String> {
    let open = |r: &&RunResult| r.offered.is_some() && r.measured > 0;
    let mut out = Vec::new();
    for f in report
        .runs
        .iter()
        .filter(open)
        .filter(|r| r.controller == "flowgate")
    {
        let Some(rate) = f.offered else { continue };
        let same_rate = |r: &&RunResult| r.offered.is_some_and(|o| (o - rate).abs() <= rate * 1e-6);
        for p in report
            .runs
            .iter()
            .filter(open)
            .filter(|r| r.controller != "flowgate")
            .filter(same_rate)
        {
            out.push(format!(
                "At {}/s offered, flowgate against {}: p50 {} / {} µs ({}), p99 {} / {} µs ({}), p99.9 {} / {} µs ({}); setups over {} µs {} / {}.",
                fmt_rate(rate),
                p.controller,
                f.p50_us,
                p.p50_us,
                ratio(f.p50_us, p.p50_us),
                f.p99_us,
                p.p99_us,
                ratio(f.p99_us, p.p99_us),
                f.p999_us,
                p.p999_us,
                ratio(f.p999_us, p.p999_us),
                super::bursts::SLOW.as_micros(),
                slow_share(f),
                slow_share(p),
            ));
        }
    }
    out
}

/// `a` as a multiple of `b` ("–" when `b` is 0).
fn ratio(a: u64, b: u64) -> String {
    if b == 0 {
        "–".to_string()
    } else {
        format!("{:.2}×", a as f64 / b as f64)
    }
}

/// The share of a run's measured setups over [`super::bursts::SLOW`], when it kept them.
fn slow_share(r: &RunResult) -> String {
    match &r.bursts {
        Some(b) if r.measured > 0 && !b.capped => {
            format!("{:.2} %", 100.0 * b.slow as f64 / r.measured as f64)
        }
        _ => "–".into(),
    }
}

pub fn table(report: &Report) -> Table {
    let reference = report
        .runs
        .iter()
        .find(|r| r.controller == "flowgate" && r.pace.starts_with("throughput"))
        .map(|r| r.avg);
    let mut t = Table::new(&[
        "controller",
        "answers checked",
        "load",
        "switches",
        "setups/s avg (min–max, stdev)",
        "PACKET_INs/s taken",
        "flowgate ÷ this",
        "p50 µs",
        "p99 µs",
        "p99.9 µs",
        "CPU µs / setup: controller, bench",
        "valid / invalid / lost",
    ]);
    for r in &report.runs {
        let ratio = match reference {
            Some(f)
                if r.avg > 0.0
                    && r.pace.starts_with("throughput")
                    && r.controller != "flowgate" =>
            {
                format!("{:.1}×", f / r.avg)
            }
            _ => "–".into(),
        };
        t.row(vec![
            r.controller.clone(),
            match r.mode {
                CheckMode::Vip => "VIP (fwd+rev rule, PACKET_OUT)".into(),
                CheckMode::L2 => "L2 (any FLOW_MOD/PACKET_OUT, as cbench)".into(),
            },
            r.pace.clone(),
            r.switches.to_string(),
            format!(
                "{} ({}–{}, {})",
                fmt_rate(r.avg),
                fmt_rate(r.min),
                fmt_rate(r.max),
                fmt_rate(r.stdev)
            ),
            fmt_rate(r.packet_in_rate),
            ratio,
            r.p50_us.to_string(),
            r.p99_us.to_string(),
            r.p999_us.to_string(),
            format!(
                "{}, {}",
                r.cpu_us_per_setup.map_or("–".into(), |c| format!("{c:.2}")),
                r.bench_cpu_us_per_setup
                    .map_or("–".into(), |c| format!("{c:.2}"))
            ),
            {
                let mut v = format!("{} / {} / {}", r.valid, r.invalid, r.lost);
                if r.not_sent > 0 {
                    let _ = write!(v, " ({} dropped by the switches, queue full)", r.not_sent);
                }
                if r.deferred > 0 {
                    let _ = write!(v, " ({} with rules deferred to the ACK)", r.deferred);
                }
                v
            },
        ]);
    }
    t
}
