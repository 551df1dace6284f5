//! Active health checks and response-time probes, one task per backend.
//!
//! A probe is a real TCP connection (and, for `http`, a real GET) from the controller's
//! host to the backend. Results go to the core, which owns the rise/fall state machine;
//! the response time of each successful probe feeds the backend's response-time average.
//! A supervisor starts and stops probe tasks as the pools change.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Instant;

use flowgate_core::config::{HealthConfig, HealthKind};
use flowgate_core::controller::ProbeResult;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;

use super::Handle;

/// Which backend a probe task serves, by name and address (indexes change on reloads).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Target {
    service: String,
    address: Ipv4Addr,
    port: u16,
}

pub(super) async fn probe_loop(handle: Handle, stop: watch::Receiver<bool>) {
    let wanted = |c: &flowgate_core::Controller| -> Vec<(Target, HealthConfig)> {
        c.services()
            .iter()
            .filter(|s| s.cfg.health.kind != HealthKind::None)
            .flat_map(|s| {
                s.backends.iter().map(move |b| {
                    let t = Target {
                        service: s.cfg.name.clone(),
                        address: b.address,
                        port: s.cfg.port,
                    };
                    (t, s.cfg.health.clone())
                })
            })
            .collect()
    };
    super::per_backend::supervise(handle, stop, wanted, probe_backend).await;
}

async fn probe_backend(handle: Handle, target: Target, cfg: HealthConfig) {
    let addr = SocketAddr::from((target.address, target.port));
    let mut interval = tokio::time::interval(cfg.interval);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        let started = Instant::now();
        let result = match tokio::time::timeout(cfg.timeout, probe_once(addr, &cfg)).await {
            Ok(Ok(())) => ProbeResult::Ok,
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                tracing::debug!(backend = %addr, "health probe refused");
                ProbeResult::Refused
            }
            Ok(Err(e)) => {
                tracing::debug!(backend = %addr, error = %e, "health probe failed");
                ProbeResult::Failed
            }
            Err(_) => {
                tracing::debug!(backend = %addr, "health probe timed out");
                ProbeResult::Failed
            }
        };
        let ok = result == ProbeResult::Ok;
        let rtt_ms = started.elapsed().as_secs_f64() * 1000.0;
        let now = Instant::now();
        let mut core = handle.lock();
        core.with(|c, _out| {
            let Some(si) = c.service_index(&target.service) else {
                return;
            };
            let Some(bi) = c.services()[si].backend_index(target.address) else {
                return;
            };
            c.handle_probe(now, si, bi, result);
            if ok {
                c.handle_response_time(si, bi, rtt_ms);
            }
        });
    }
}

async fn probe_once(addr: SocketAddr, cfg: &HealthConfig) -> std::io::Result<()> {
    let mut s = TcpStream::connect(addr).await?;
    if cfg.kind != HealthKind::Http {
        return Ok(());
    }
    let req = format!(
        "GET {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: flowgate-health\r\nConnection: close\r\n\r\n",
        cfg.path,
        addr.ip()
    );
    s.write_all(req.as_bytes()).await?;
    let mut buf = [0u8; 64];
    let mut n = 0;
    while n < 12 {
        let r = s.read(&mut buf[n..]).await?;
        if r == 0 {
            break;
        }
        n += r;
    }
    // "HTTP/1.1 200": any 2xx or 3xx is healthy.
    let line = std::str::from_utf8(&buf[..n]).unwrap_or("");
    match line.get(9..10) {
        Some("2") | Some("3") => Ok(()),
        _ => Err(std::io::Error::other(format!(
            "unhealthy status: {:?}",
            line.lines().next().unwrap_or("")
        ))),
    }
}
