//! The composition root: the runtime and the API, started together and stopped together.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use flowgate_core::{Config, Controller};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::runtime::spin::ParkSpin;
use crate::runtime::{self, Handle};

/// The sockets the controller runs with: passed in so tests bind port 0.
pub struct Listeners {
    pub openflow: TcpListener,
    pub api: Option<TcpListener>,
    /// The runtime's poller before its workers park (`[runtime] spin_before_park_us`),
    /// which watches every switch socket the OpenFlow listener accepts.
    pub park_spin: Option<Arc<ParkSpin>>,
}

/// Run the controller until `shutdown` resolves.
pub async fn run(
    config: Config,
    listeners: Listeners,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    run_with_path(config, None, listeners, shutdown).await
}

/// [`run`], with the file the config came from: SIGHUP and `POST /api/v1/reload` re-read it.
pub async fn run_with_path(
    config: Config,
    config_path: Option<PathBuf>,
    listeners: Listeners,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let built = Instant::now();
    // With `preallocate_connections`, this maps the connection table's memory (0.3 s for
    // 8 million here) before any switch is served: their connections wait in the
    // listener's backlog.
    let mut controller = Controller::new(&config);
    // The core's LLDP key comes from the config's seed, which anyone who reads the config
    // knows: a secret one, so that no host can tag a forged probe.
    controller.set_lldp_key(flowgate_packet::LldpKey(rand::random()));
    if config.controller.preallocate_connections > 0 {
        tracing::info!(
            connections = config.controller.preallocate_connections,
            ms = built.elapsed().as_millis() as u64,
            "connection table preallocated"
        );
    }
    let handle = Handle::new(controller, config, config_path).with_park_spin(listeners.park_spin);
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut tasks = tokio::task::JoinSet::new();
    runtime::spawn(&handle, listeners.openflow, &mut tasks, &stop_rx)?;
    if let Some(api) = listeners.api {
        tracing::info!(listen = %api.local_addr()?, "API listener up");
        tasks.spawn(crate::api::serve(api, handle.clone(), stop_rx.clone()));
    }

    shutdown.await;
    tracing::info!("shutting down");
    let _ = stop_tx.send(true);
    // Give sessions a moment to close cleanly; the switches keep their rules (fail-secure).
    let _ = tokio::time::timeout(Duration::from_secs(3), async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    Ok(())
}
