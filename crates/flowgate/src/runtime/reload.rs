//! Reloading the config file (SIGHUP and `POST /api/v1/reload`): validated first, so a
//! file with any error changes nothing.

use std::time::Instant;

use flowgate_core::Config;
use flowgate_core::config::ConfigErrors;
use serde::Serialize;

use super::Handle;

/// What a successful reload did.
#[derive(Debug, Clone, Serialize)]
pub struct ReloadReport {
    pub ok: bool,
    pub file: String,
    pub services: usize,
    /// Keys that changed but only take effect on a restart (listen addresses, TLS, ...).
    pub restart_needed: Vec<&'static str>,
}

/// Why a reload changed nothing.
#[derive(Debug)]
pub enum ReloadError {
    NoFile,
    Read(String),
    Invalid(String, ConfigErrors),
}

impl std::fmt::Display for ReloadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReloadError::NoFile => write!(f, "the controller was not started from a config file"),
            ReloadError::Read(e) => write!(f, "{e}"),
            ReloadError::Invalid(file, errs) => write!(f, "{file}: {errs}"),
        }
    }
}

impl std::error::Error for ReloadError {}

/// Re-read the config file, validate it, and apply it (SIGHUP and `POST /api/v1/reload`).
/// A file with any error changes nothing.
pub fn reload_from_file(handle: &Handle) -> Result<ReloadReport, ReloadError> {
    let path = handle.config_path.as_ref().ok_or(ReloadError::NoFile)?;
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path.as_path())
        .map_err(|e| ReloadError::Read(format!("{file}: {e}")))?;
    let mut config = Config::from_toml(&text, &|k| std::env::var(k).ok())
        .map_err(|errs| ReloadError::Invalid(file.clone(), errs))?;
    let mut restart_needed = Vec::new();
    {
        // The running settings: a reload keeps the ones only a restart changes, so that
        // each later reload compares its file with what runs.
        let old = handle.config.lock().unwrap_or_else(|e| e.into_inner());
        let checks: [(&'static str, bool); 10] = [
            (
                "openflow.listen",
                old.openflow.listen != config.openflow.listen,
            ),
            ("openflow.tls", old.openflow.tls != config.openflow.tls),
            (
                "openflow.echo_interval_ms",
                old.openflow.echo_interval != config.openflow.echo_interval,
            ),
            (
                "openflow.echo_timeout_ms",
                old.openflow.echo_timeout != config.openflow.echo_timeout,
            ),
            (
                "openflow.packet_in_rate",
                old.openflow.packet_in_rate != config.openflow.packet_in_rate,
            ),
            ("api.listen", old.api.listen != config.api.listen),
            // The cluster task, its store and its election start with the controller.
            ("cluster", old.cluster != config.cluster),
            // The runtime is built once, before the config's first use.
            (
                "runtime.worker_threads",
                old.runtime.worker_threads != config.runtime.worker_threads,
            ),
            (
                "runtime.spin_before_park_us",
                old.runtime.spin_before_park != config.runtime.spin_before_park,
            ),
            // The connection table is built with the controller.
            (
                "controller.preallocate_connections",
                old.controller.preallocate_connections != config.controller.preallocate_connections,
            ),
        ];
        restart_needed.extend(checks.iter().filter(|c| c.1).map(|c| c.0));
        config.openflow = old.openflow.clone();
        config.api.listen = old.api.listen;
        config.cluster = old.cluster.clone();
        config.runtime = old.runtime;
        config.controller.preallocate_connections = old.controller.preallocate_connections;
    }
    let services = config.services.len();
    {
        let now = Instant::now();
        let mut core = handle.lock();
        core.with(|c, out| c.reload(now, &config, out));
        // Swapped under the core lock, so no reader sees the new services with the old
        // config (or the other way round).
        let probe_us = super::channel_rtt::probe_interval_us(&config);
        let was = handle
            .rtt_probe_us
            .swap(probe_us, std::sync::atomic::Ordering::Relaxed);
        if was != probe_us {
            handle.rtt_probe_changed.notify_waiters();
        }
        *handle.config.lock().unwrap_or_else(|e| e.into_inner()) = config;
    }
    Ok(ReloadReport {
        ok: true,
        file,
        services,
        restart_needed,
    })
}
