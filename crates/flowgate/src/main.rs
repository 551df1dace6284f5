//! The `flowgate` binary: one program, several subcommands.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use flowgate_core::Config;

#[derive(Parser)]
#[command(
    name = "flowgate",
    version,
    about = "An OpenFlow 1.3 SDN controller that balances HTTP services at virtual IPs"
)]
struct Cli {
    /// Log filter (tracing EnvFilter syntax), e.g. "info" or "flowgate=debug".
    #[arg(long, global = true, env = "FLOWGATE_LOG", default_value = "info")]
    log: String,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the controller.
    Controller {
        /// The TOML config file.
        #[arg(long, short)]
        config: PathBuf,
        /// Validate the config, print every error, and exit.
        #[arg(long)]
        check: bool,
        /// Once listening, write the bound addresses here as JSON (for scripts and tests
        /// that configure port 0).
        #[arg(long)]
        ready_file: Option<PathBuf>,
    },
    /// The OpenFlow 1.3 codec from the command line.
    Ofp {
        #[command(subcommand)]
        cmd: OfpCmd,
    },
    /// A real HTTP server, for backends in test networks.
    Httpd(flowgate_testbed::httpd::HttpdArgs),
    /// A real HTTP load generator (bounded in requests and time).
    Load(flowgate_testbed::load::LoadArgs),
    /// A command-line client of the controller's HTTP API.
    Ctl(flowgate::cli::ctl::CtlArgs),
    /// Benchmarks: controller flow setups, the data path, memory (docs/benchmarks.md).
    Bench {
        #[command(subcommand)]
        cmd: flowgate::bench::BenchCmd,
    },
    /// The controller core at data-centre scale: a simulated leaf-spine fabric, servers
    /// and clients, over algorithms and overload controls (docs/simulator.md).
    Sim(flowgate::cli::sim::SimArgs),
    /// The paper's experiments on real Open vSwitch and network namespaces.
    Lab {
        #[command(subcommand)]
        cmd: LabCmd,
    },
}

#[derive(Subcommand)]
enum LabCmd {
    /// Name the scenarios.
    List,
    /// Run one scenario (needs root and Open vSwitch): build the network, run the load,
    /// measure, and write tables and plots to --out.
    Run {
        /// Scenario name (see `flowgate lab list`).
        name: String,
        /// The quick variant: fewer clients and requests, shorter (under two minutes).
        #[arg(long)]
        quick: bool,
        /// Output directory for the tables (Markdown, CSV) and plots (SVG).
        #[arg(long, default_value = "out/lab")]
        out: PathBuf,
        /// Name prefix of the bridges, namespaces and interfaces (4-6 characters).
        #[arg(long)]
        prefix: Option<String>,
        /// Seed of the random client draws and of the controller.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Run it this many times (1 to 50), run i into OUT/run-i with seed SEED+i-1, and
        /// write every figure's median and range over the runs to OUT/NAME-runs.{md,csv,json}.
        #[arg(long, default_value_t = 1)]
        runs: u32,
        /// Case C only: a third phase, the heavy load twice more, first as a control, then
        /// with the active global controller C_p1 killed (SIGKILL) a quarter of the way
        /// in; the report gives the takeover, the spills across it and the requests around
        /// it beside the control's.
        #[arg(long)]
        failover: bool,
    },
    /// Every figure of several runs of one scenario (their directories or JSON files,
    /// from `lab run` on any build or day) as median and range, to OUT/NAME-runs.{md,csv,json}.
    Summarize {
        /// The runs: each a run's output directory or its NAME.json.
        #[arg(required = true, num_args = 2..)]
        runs: Vec<PathBuf>,
        /// Output directory.
        #[arg(long)]
        out: PathBuf,
    },
}

#[derive(Subcommand)]
enum OfpCmd {
    /// Print each message in each file as JSON.
    Decode { files: Vec<PathBuf> },
    /// Exit 0 only when every file holds one valid message that re-encodes identically.
    Roundtrip { files: Vec<PathBuf> },
}

fn init_logging(filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(&cli.log);
    let result = match cli.cmd {
        Cmd::Controller {
            config,
            check,
            ready_file,
        } => controller(config, check, ready_file),
        Cmd::Ofp {
            cmd: OfpCmd::Decode { files },
        } => flowgate::cli::ofp::decode(&files),
        Cmd::Ofp {
            cmd: OfpCmd::Roundtrip { files },
        } => flowgate::cli::ofp::roundtrip(&files),
        Cmd::Httpd(args) => runtime().and_then(|rt| {
            Ok(rt.block_on(flowgate_testbed::httpd::run_httpd(args, shutdown_signal()))?)
        }),
        Cmd::Load(args) => runtime().and_then(|rt| {
            let report = rt.block_on(flowgate_testbed::load::run_load(&args))?;
            println!("{}", serde_json::to_string_pretty(&report)?);
            Ok(())
        }),
        Cmd::Bench { cmd } => flowgate::bench::run(cmd),
        Cmd::Ctl(args) => flowgate::cli::ctl::run(args),
        Cmd::Sim(args) => flowgate::cli::sim::run(&args),
        Cmd::Lab { cmd: LabCmd::List } => {
            print!("{}", flowgate_lab::list());
            Ok(())
        }
        Cmd::Lab {
            cmd:
                LabCmd::Run {
                    name,
                    quick,
                    out,
                    prefix,
                    seed,
                    runs,
                    failover,
                },
        } => std::env::current_exe()
            .map_err(anyhow::Error::from)
            .and_then(|flowgate| {
                flowgate_lab::cli_run(&flowgate_lab::RunOptions {
                    scenario: name,
                    quick,
                    out,
                    flowgate,
                    prefix,
                    seed,
                    progress: true,
                    runs,
                    failover,
                })
            }),
        Cmd::Lab {
            cmd: LabCmd::Summarize { runs, out },
        } => flowgate_lab::cli_summarize(&runs, &out),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("flowgate: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?)
}

fn load_config(path: &PathBuf) -> anyhow::Result<Config> {
    let text =
        std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    Config::from_toml(&text, &|k| std::env::var(k).ok())
        .map_err(|errs| anyhow::anyhow!("{}: {errs}", path.display()))
}

fn controller(path: PathBuf, check: bool, ready_file: Option<PathBuf>) -> anyhow::Result<()> {
    let config = load_config(&path)?;
    if check {
        // What a start would load besides the file (the TLS certificate and key).
        flowgate::runtime::reload::check_start(&config)
            .map_err(|e| anyhow::anyhow!("{}: {e:#}", path.display()))?;
        println!(
            "{}: OK ({} service(s))",
            path.display(),
            config.services.len()
        );
        return Ok(());
    }
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = config.runtime.worker_threads {
        rt.worker_threads(n);
    }
    let park_spin = flowgate::runtime::spin::hook(&mut rt, config.runtime.spin_before_park)
        .map_err(|e| anyhow::anyhow!("runtime.spin_before_park_us: {e}"))?;
    rt.enable_all().build()?.block_on(async move {
        let openflow = tokio::net::TcpListener::bind(config.openflow.listen)
            .await
            .map_err(|e| anyhow::anyhow!("openflow.listen {}: {e}", config.openflow.listen))?;
        let api = tokio::net::TcpListener::bind(config.api.listen)
            .await
            .map_err(|e| anyhow::anyhow!("api.listen {}: {e}", config.api.listen))?;
        if let Some(path) = ready_file {
            let ready = serde_json::json!({
                "openflow": openflow.local_addr()?.to_string(),
                "api": api.local_addr()?.to_string(),
                "pid": std::process::id(),
            });
            // Write then rename, so a reader never sees half a file.
            let tmp = path.with_extension("tmp");
            std::fs::write(&tmp, ready.to_string())?;
            std::fs::rename(&tmp, &path)?;
        }
        flowgate::server::run_with_path(
            config,
            Some(std::fs::canonicalize(&path).unwrap_or(path)),
            flowgate::server::Listeners {
                openflow,
                api: Some(api),
                park_spin,
            },
            shutdown_signal(),
        )
        .await
    })
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
