//! `flowgate sim`: the controller core at data-centre scale (`flowgate_sim`), over a
//! matrix of balancing algorithms, overload controls and outlier detections, with tables
//! and plots.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use flowgate_sim::{Outcome, Scenario, Shape};

#[derive(Debug, Clone, Args)]
pub struct SimArgs {
    /// Leaf switches.
    #[arg(long, default_value_t = 16)]
    pub leaves: u32,
    /// Spine switches (every leaf links to every spine).
    #[arg(long, default_value_t = 4)]
    pub spines: u32,
    #[arg(long, default_value_t = 16)]
    pub servers_per_leaf: u32,
    #[arg(long, default_value_t = 16)]
    pub clients_per_leaf: u32,
    /// Requests one server serves at once.
    #[arg(long, default_value_t = 4)]
    pub workers: u32,
    /// Mean service time of a request at speed 1, ms (exponentially distributed).
    #[arg(long, default_value_t = 10.0)]
    pub service_ms: f64,
    /// Server speeds, cycled over the servers.
    #[arg(long, value_delimiter = ',', default_value = "1,1,0.5,2")]
    pub speeds: Vec<f64>,
    /// Requests waiting at one server before it refuses.
    #[arg(long, default_value_t = 64)]
    pub backlog: u32,
    /// Offered load of each phase, as fractions of the pool's capacity.
    #[arg(long, value_delimiter = ',', default_value = "0.5,0.9,1.3")]
    pub loads: Vec<f64>,
    /// Length of each phase, seconds (of simulated time).
    #[arg(long, default_value_t = 4.0)]
    pub phase_secs: f64,
    /// Balancing algorithms to compare.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "round-robin,least-connections,p2c,isslm,dwrs,mrbs,amlob,srt"
    )]
    pub algorithms: Vec<String>,
    /// Overload controls to compare (ACCM for the service and the controller): off,
    /// static, adaptive, adaptive-no-ceiling (adaptive without the service's ceiling).
    #[arg(long, value_delimiter = ',', default_value = "off,adaptive")]
    pub overload: Vec<String>,
    /// The controller's CPU time per PACKET_IN, µs.
    #[arg(long, default_value_t = 2.0)]
    pub controller_cost_us: f64,
    /// What a SYN the controller refuses (or its gate drops) costs it, a share of
    /// --controller-cost-us (the default is measured: docs/simulator.md).
    #[arg(long, default_value_t = flowgate_sim::REFUSAL_SHARE)]
    pub refusal_share: f64,
    /// How often the servers' load reaches the controller, ms.
    #[arg(long, default_value_t = 10.0)]
    pub report_ms: f64,
    /// Client-server round trip, µs.
    #[arg(long, default_value_t = 100.0)]
    pub rtt_us: f64,
    /// Passive outlier detections to compare: default (the controller's: consecutive
    /// failures and success rate), off, consecutive, success-rate, failure-percentage.
    #[arg(long, value_delimiter = ',', default_value = "default")]
    pub outliers: Vec<String>,
    /// Whether the service redispatches, to compare: on (the controller's default: a
    /// connection judged silent goes to another server at its client's third SYN), off.
    #[arg(long, value_delimiter = ',', default_value = "on")]
    pub redispatch: Vec<String>,
    /// Servers that silently drop --drop-share of their connections, spread over the pool.
    #[arg(long, default_value_t = 0)]
    pub faulty: u32,
    /// The share of its connections a faulty server drops (its clients' retransmitted
    /// SYNs too).
    #[arg(long, default_value_t = 0.5)]
    pub drop_share: f64,
    /// When the faulty servers recover (drop nothing more), seconds from the first
    /// request; never if not given.
    #[arg(long)]
    pub recover_at_secs: Option<f64>,
    /// The connection rules' idle timeout, s: a dropped connection's silence reaches the
    /// outlier detection this long after its rules were installed.
    #[arg(long, default_value_t = 30)]
    pub idle_timeout_secs: u16,
    /// ISSLM's threshold, a fraction of a server's mean capacity.
    #[arg(long, default_value_t = 0.8)]
    pub isslm_threshold: f64,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Where the tables (Markdown, CSV, JSON) and plots (SVG) go.
    #[arg(long, default_value = "out/sim")]
    pub out: PathBuf,
    /// A small fabric and short phases (seconds of wall time), for a smoke test.
    #[arg(long)]
    pub quick: bool,
}

fn label(sc: &Scenario) -> String {
    flowgate_sim::report::run_name(&sc.algorithm, &sc.overload, &sc.outlier, sc.redispatch)
}

fn duration(what: &str, secs: f64) -> anyhow::Result<Duration> {
    Duration::try_from_secs_f64(secs)
        .map_err(|_| anyhow::anyhow!("{what}: {secs} is not a duration"))
}

impl SimArgs {
    /// The scenario of each algorithm, overload control, outlier detection and redispatch,
    /// in that order.
    pub fn scenarios(&self) -> anyhow::Result<Vec<Scenario>> {
        let mut shape = Shape {
            leaves: self.leaves,
            spines: self.spines,
            servers_per_leaf: self.servers_per_leaf,
            clients_per_leaf: self.clients_per_leaf,
        };
        let mut phase = duration("--phase-secs", self.phase_secs)?;
        if self.quick {
            shape = Shape {
                leaves: 4,
                spines: 2,
                servers_per_leaf: 4,
                clients_per_leaf: 4,
            };
            phase = phase.min(Duration::from_secs(1));
        }
        let base = Scenario {
            shape,
            workers: self.workers,
            service: duration("--service-ms", self.service_ms / 1e3)?,
            speeds: self.speeds.clone(),
            backlog: self.backlog,
            loads: self.loads.clone(),
            phase,
            algorithm: String::new(),
            isslm_threshold: self.isslm_threshold,
            overload: String::new(),
            controller_cost: duration("--controller-cost-us", self.controller_cost_us / 1e6)?,
            refusal_share: self.refusal_share,
            report_every: duration("--report-ms", self.report_ms / 1e3)?,
            rtt: duration("--rtt-us", self.rtt_us / 1e6)?,
            faulty: self.faulty,
            drop_share: self.drop_share,
            recover_at: self
                .recover_at_secs
                .map(|s| duration("--recover-at-secs", s))
                .transpose()?,
            outlier: String::new(),
            idle_timeout_secs: self.idle_timeout_secs,
            redispatch: true,
            seed: self.seed,
        };
        let mut v = Vec::new();
        let mut errs = Vec::new();
        let mut redispatch = Vec::new();
        for r in &self.redispatch {
            redispatch.push(r != "off");
            if r != "on" && r != "off" {
                // Reported; the scenarios are checked all the same, for their own errors.
                errs.push(format!("redispatch {r:?}: on or off"));
            }
        }
        for a in &self.algorithms {
            for o in &self.overload {
                for d in &self.outliers {
                    for &r in &redispatch {
                        let sc = Scenario {
                            algorithm: a.clone(),
                            overload: o.clone(),
                            outlier: d.clone(),
                            redispatch: r,
                            ..base.clone()
                        };
                        if let Err(e) = sc.check() {
                            errs.push(format!("{}: {e}", label(&sc)));
                        }
                        v.push(sc);
                    }
                }
            }
        }
        if v.is_empty() {
            errs.push(
                "no algorithm, overload control, outlier detection or redispatch to run".into(),
            );
        }
        if errs.is_empty() {
            Ok(v)
        } else {
            anyhow::bail!("{}", errs.join("\n"))
        }
    }
}

/// Run every scenario (on every CPU, each run on one), print the table, write the files.
pub fn run(args: &SimArgs) -> anyhow::Result<()> {
    let scenarios = args.scenarios()?;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: Vec<std::sync::Mutex<Option<anyhow::Result<Outcome>>>> = scenarios
        .iter()
        .map(|_| std::sync::Mutex::new(None))
        .collect();
    std::thread::scope(|s| {
        for _ in 0..threads.min(scenarios.len()) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(sc) = scenarios.get(i) else { break };
                    let r = flowgate_sim::run(sc);
                    if let Ok(o) = &r {
                        eprintln!(
                            "{}: done in {:.1} s",
                            flowgate_sim::report::name(o),
                            o.wall_secs
                        );
                    }
                    if let Ok(mut slot) = results[i].lock() {
                        *slot = Some(r);
                    }
                }
            });
        }
    });
    let mut runs = Vec::new();
    for (r, sc) in results.into_iter().zip(&scenarios) {
        let r = r
            .into_inner()
            .map_err(|_| anyhow::anyhow!("a run panicked"))?
            .ok_or_else(|| anyhow::anyhow!("{}: not run", label(sc)))?;
        runs.push(r.map_err(|e| anyhow::anyhow!("{}: {e}", label(sc)))?);
    }
    let first = &scenarios[0];
    print!("{}", flowgate_sim::report::markdown(first, &runs));
    flowgate_sim::report::write(&args.out, first, &runs)?;
    eprintln!("wrote {}", args.out.display());
    Ok(())
}
