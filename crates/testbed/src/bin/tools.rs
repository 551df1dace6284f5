//! `fg-testbed-tools`: the testbed's backend server and load client as a binary, so they
//! can run inside network namespaces (`ip netns exec NS fg-testbed-tools httpd ...`).

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use flowgate_testbed::httpd::{HttpdArgs, run_httpd};
use flowgate_testbed::load::{LoadArgs, run_load};

#[derive(Parser, Debug)]
#[command(
    name = "fg-testbed-tools",
    about = "flowgate testbed: HTTP backend and load client"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Run an HTTP/1.1 backend until SIGTERM / SIGINT.
    Httpd(HttpdArgs),
    /// Send a bounded HTTP load to one URL and print a report.
    Load(LoadArgs),
    /// Remove the networks of test and lab runs whose process is gone (needs root).
    Sweep,
}

/// Completes on SIGTERM or SIGINT.
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Httpd(args) => {
            let listen = args.listen;
            run_httpd(args, shutdown_signal())
                .await
                .with_context(|| format!("httpd on {listen}"))?;
        }
        Cmd::Load(args) => {
            let report = run_load(&args).await?;
            if args.json {
                println!("{}", serde_json::to_string(&report)?);
            } else {
                println!("{report}");
            }
        }
        Cmd::Sweep => {
            let sw = flowgate_testbed::sweep_orphans()?;
            for (prefix, c) in &sw.orphans {
                println!(
                    "swept {prefix} (owner gone): bridges {:?}, namespaces {:?}, links {:?}",
                    c.bridges, c.namespaces, c.links
                );
            }
            if !sw.in_use.is_empty() {
                println!(
                    "left alone, owner gone but processes still parented (an older build's run?): {}",
                    sw.in_use.join(" ")
                );
            }
            if !sw.unowned.is_empty() {
                println!(
                    "left alone, no owner recorded (remove by hand if stale): {}",
                    sw.unowned.join(" ")
                );
            }
        }
    }
    Ok(())
}
