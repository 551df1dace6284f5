//! Scraping backends' own Prometheus endpoints (`metrics = "http://..."` on a backend),
//! one task per backend, at the service's `[service.metrics] interval_ms`.
//!
//! Each scrape is a plain HTTP/1.1 GET with a timeout; two successive scrapes become a
//! load sample (`flowgate_core::metrics_text`) handed to the core. A failed scrape leaves
//! the last figures to age: the core marks them stale and the algorithms stop trusting them.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Instant;

use flowgate_core::config::MetricsConfig;
use flowgate_core::metrics_text::{self, Totals};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;

use super::Handle;

/// The most a scrape may return; a metrics page is a few kilobytes.
const MAX_BODY: usize = 4 << 20;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Target {
    service: String,
    backend: Ipv4Addr,
    url: String,
}

pub(super) async fn scrape_loop(handle: Handle, stop: watch::Receiver<bool>) {
    let wanted = |c: &flowgate_core::Controller| -> Vec<(Target, MetricsConfig)> {
        c.services()
            .iter()
            .flat_map(|s| {
                s.backends.iter().filter_map(move |b| {
                    let url = b.metrics_url.clone()?;
                    Some((
                        Target {
                            service: s.cfg.name.clone(),
                            backend: b.address,
                            url,
                        },
                        s.cfg.metrics.clone(),
                    ))
                })
            })
            .collect()
    };
    super::per_backend::supervise(handle, stop, wanted, scrape_backend).await;
}

async fn scrape_backend(handle: Handle, target: Target, cfg: MetricsConfig) {
    let Some((addr, host, path)) = parse_url(&target.url) else {
        tracing::warn!(url = %target.url, "cannot scrape: not an http://HOST:PORT/PATH URL");
        return;
    };
    let mut interval = tokio::time::interval(cfg.interval);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut prev: Option<(Instant, Totals)> = None;
    loop {
        interval.tick().await;
        let text = match tokio::time::timeout(cfg.timeout, fetch(addr, &host, &path)).await {
            Ok(Ok(t)) => t,
            Ok(Err(e)) => {
                tracing::debug!(url = %target.url, error = %e, "scrape failed");
                continue;
            }
            Err(_) => {
                tracing::debug!(url = %target.url, "scrape timed out");
                continue;
            }
        };
        let now = Instant::now();
        let totals = metrics_text::totals(&text, &cfg.names);
        if let Some(p) = prev {
            let sample = metrics_text::derive(p, (now, totals));
            tracing::trace!(url = %target.url, ?sample, "scraped");
            let mut core = handle.lock();
            core.with(|c, _| {
                let Some(si) = c.service_index(&target.service) else {
                    return;
                };
                let Some(bi) = c.services()[si].backend_index(target.backend) else {
                    return;
                };
                c.handle_backend_load(now, si, bi, sample);
            });
        }
        prev = Some((now, totals));
    }
}

/// `http://HOST:PORT/PATH` with a literal IPv4 host (backends are addressed by IP).
fn parse_url(url: &str) -> Option<(SocketAddr, String, String)> {
    let rest = url.strip_prefix("http://")?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let addr: SocketAddr = if authority.contains(':') {
        authority.parse().ok()?
    } else {
        SocketAddr::new(authority.parse().ok()?, 80)
    };
    Some((addr, authority.to_string(), path.to_string()))
}

async fn fetch(addr: SocketAddr, host: &str, path: &str) -> std::io::Result<String> {
    let mut s = TcpStream::connect(addr).await?;
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nAccept: text/plain\r\nUser-Agent: flowgate-scrape\r\nConnection: close\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await?;
    let mut body = Vec::with_capacity(16 * 1024);
    let mut chunk = [0u8; 16 * 1024];
    loop {
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        if body.len() + n > MAX_BODY {
            return Err(std::io::Error::other("metrics page too large"));
        }
        body.extend_from_slice(&chunk[..n]);
    }
    let text = String::from_utf8_lossy(&body);
    let Some(split) = text.find("\r\n\r\n") else {
        return Err(std::io::Error::other("no HTTP header end"));
    };
    if !text.starts_with("HTTP/1.1 200") && !text.starts_with("HTTP/1.0 200") {
        return Err(std::io::Error::other(format!(
            "status {:?}",
            text.lines().next().unwrap_or("")
        )));
    }
    let head = text[..split].to_ascii_lowercase();
    let payload = &text[split + 4..];
    if head.contains("transfer-encoding: chunked") {
        return Ok(dechunk(payload));
    }
    Ok(payload.to_string())
}

fn dechunk(mut rest: &str) -> String {
    let mut out = String::new();
    while let Some(i) = rest.find("\r\n") {
        let Ok(n) = usize::from_str_radix(rest[..i].split(';').next().unwrap_or("").trim(), 16)
        else {
            break;
        };
        if n == 0 || rest.len() < i + 2 + n {
            break;
        }
        out.push_str(&rest[i + 2..i + 2 + n]);
        rest = rest.get(i + 4 + n..).unwrap_or("");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_chunks() {
        let (a, h, p) = parse_url("http://10.0.0.2:9100/metrics").unwrap();
        assert_eq!(a, "10.0.0.2:9100".parse().unwrap());
        assert_eq!(h, "10.0.0.2:9100");
        assert_eq!(p, "/metrics");
        assert_eq!(parse_url("http://10.0.0.2").unwrap().0.port(), 80);
        assert!(parse_url("https://x/").is_none());
        assert!(parse_url("http://name.example/").is_none());
        assert_eq!(
            dechunk("5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"),
            "hello world"
        );
        assert_eq!(dechunk("zz\r\n"), "");
    }
}
