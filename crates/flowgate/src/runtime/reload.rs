//! Reloading the config file (SIGHUP and `POST /api/v1/reload`): validated first, so a
//! file with any error changes nothing.

use std::time::Instant;

use flowgate_core::Config;
use flowgate_core::config::{ConfigErrors, ServiceConfig};
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
    /// Changes made through the API since the last config applied that this reload put
    /// back to the file's (the file is the truth; drains, which no file holds, stay).
    pub discarded: Vec<String>,
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

/// Load what a start loads beyond the file itself (`[openflow.tls]`'s certificate, key
/// and CA), so that `flowgate controller --check` passes only a config that starts.
pub fn check_start(config: &Config) -> anyhow::Result<()> {
    if let Some(tls) = &config.openflow.tls {
        super::tls::acceptor(tls)?;
    }
    Ok(())
}

/// Re-read the config file, validate it, and apply it (SIGHUP and `POST /api/v1/reload`).
/// A file with any error changes nothing.
pub fn reload_from_file(handle: &Handle) -> Result<ReloadReport, ReloadError> {
    let _one_at_a_time = handle.reloads.lock().unwrap_or_else(|e| e.into_inner());
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
    let discarded;
    {
        let now = Instant::now();
        let mut core = handle.lock();
        discarded = {
            let running: Vec<&ServiceConfig> =
                core.controller.services().iter().map(|s| &s.cfg).collect();
            let old = handle.config.lock().unwrap_or_else(|e| e.into_inner());
            api_changes_discarded(&running, &old.services, &config.services)
        };
        core.with(|c, out| c.reload(now, &config, out));
        // Swapped under the core lock, so no reader sees the new services with the old
        // config (or the other way round).
        let plan = super::channel_rtt::ProbePlan::of(&config);
        let probe = plan.bits();
        let was = handle
            .rtt_probe
            .swap(probe, std::sync::atomic::Ordering::Relaxed);
        if was != probe {
            handle.rtt_probe_changed.notify_waiters();
            if plan.every_us == 0 {
                // Under the core lock: a session reports no reading of the old probes
                // after this (it checks the plan under the same lock).
                core.controller.forget_channel_rtts();
            }
        }
        *handle.config.lock().unwrap_or_else(|e| e.into_inner()) = config;
    }
    Ok(ReloadReport {
        ok: true,
        file,
        services,
        restart_needed,
        discarded,
    })
}

/// The changes made through the API (what `running` holds that `old`, the config applied
/// last, does not) that `new` does not keep, one line each.
fn api_changes_discarded(
    running: &[&ServiceConfig],
    old: &[ServiceConfig],
    new: &[ServiceConfig],
) -> Vec<String> {
    // What the API sets of an algorithm (the rest is the file's, or derived).
    let algorithm = |s: &ServiceConfig| (s.algorithm, s.params.threshold_rps, s.params.hysteresis);
    let mut out = Vec::new();
    for r in running {
        let name = &r.name;
        // A service the new file drops is the file's change, not a discarded one.
        let (Some(o), Some(n)) = (
            old.iter().find(|s| &s.name == name),
            new.iter().find(|s| &s.name == name),
        ) else {
            continue;
        };
        if algorithm(r) != algorithm(o) && algorithm(r) != algorithm(n) {
            out.push(format!(
                "{name}: algorithm {} (set through the API) is {} again",
                r.algorithm, n.algorithm
            ));
        }
        for b in &r.backends {
            let was = o.backends.iter().find(|x| x.address == b.address);
            match n.backends.iter().find(|x| x.address == b.address) {
                None if was.is_none() => out.push(format!(
                    "{name}: backend {} (added through the API) is removed",
                    b.address
                )),
                Some(nb) if nb.weight != b.weight && was.is_none_or(|w| w.weight != b.weight) => {
                    out.push(format!(
                        "{name}: backend {} weight {} (set through the API) is {} again",
                        b.address, b.weight, nb.weight
                    ))
                }
                _ => {}
            }
        }
        for ob in &o.backends {
            let removed = !r.backends.iter().any(|b| b.address == ob.address);
            if removed && n.backends.iter().any(|b| b.address == ob.address) {
                out.push(format!(
                    "{name}: backend {} (removed through the API) is back",
                    ob.address
                ));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_check_loads_the_tls_files_a_start_loads() {
        let config = |tls: &str| {
            Config::from_toml(&format!("[openflow.tls]\n{tls}"), &|_| None)
                .unwrap_or_else(|e| panic!("{e}"))
        };
        let missing = config("cert = \"/nonexistent/c.pem\"\nkey = \"/nonexistent/k.pem\"\n");
        let err = check_start(&missing).map_err(|e| e.to_string());
        assert_eq!(
            err,
            Err("openflow.tls.cert: cannot open /nonexistent/c.pem".to_string())
        );
        assert!(check_start(&Config::empty()).is_ok());
    }
}
