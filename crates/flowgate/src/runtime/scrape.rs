//! Scraping backends' own Prometheus endpoints (`metrics = "http://..."` on a backend),
//! one task per backend, at the service's `[service.metrics] interval_ms`.
//!
//! Each scrape is a plain HTTP/1.1 GET with a timeout; two successive scrapes become a
//! load sample (`flowgate_core::metrics_text`) handed to the core. A failed scrape leaves
//! the last figures to age: the core marks them stale and the algorithms stop trusting them.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Instant;

use flowgate_core::config::{MetricsConfig, parse_metrics_url};
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
    // The config and the API checked it with the same parser.
    let url = match parse_metrics_url(&target.url) {
        Ok(u) => u,
        Err(why) => {
            tracing::warn!(url = %target.url, "cannot scrape: {why}");
            return;
        }
    };
    let (addr, host, path) = (url.addr, url.host, url.path);
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
    metrics_page(&body).map_err(std::io::Error::other)
}

/// The text of a metrics page from the whole HTTP/1.x response (the connection closed
/// after it). Bytes from the network: the chunk sizes count bytes, so the body is
/// de-chunked before it is read as UTF-8 (lossily), and a size that points past the end
/// or mid-character ends the body there rather than panicking.
fn metrics_page(response: &[u8]) -> Result<String, String> {
    let Some(split) = find(response, b"\r\n\r\n") else {
        return Err("no HTTP header end".into());
    };
    if !response.starts_with(b"HTTP/1.1 200") && !response.starts_with(b"HTTP/1.0 200") {
        let status = response
            .split(|&b| b == b'\r' || b == b'\n')
            .next()
            .unwrap_or(b"");
        return Err(format!("status {:?}", String::from_utf8_lossy(status)));
    }
    let head = response[..split].to_ascii_lowercase();
    let payload = &response[split + 4..];
    if find(&head, b"transfer-encoding: chunked").is_some() {
        return Ok(String::from_utf8_lossy(&dechunk(payload)).into_owned());
    }
    Ok(String::from_utf8_lossy(payload).into_owned())
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The body of a chunked transfer (RFC 9112 §7.1), up to the last chunk or the first
/// malformed one.
fn dechunk(mut rest: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(i) = find(rest, b"\r\n") {
        let size = std::str::from_utf8(&rest[..i]).unwrap_or("");
        let Ok(n) = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16) else {
            break;
        };
        let Some(data) = (i + 2).checked_add(n).and_then(|end| rest.get(i + 2..end)) else {
            break;
        };
        if n == 0 {
            break;
        }
        out.extend_from_slice(data);
        rest = rest.get(i + 4 + n..).unwrap_or(&[]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_chunks() {
        let u = parse_metrics_url("http://10.0.0.2:9100/metrics").unwrap();
        assert_eq!(u.addr, "10.0.0.2:9100".parse().unwrap());
        assert_eq!(u.host, "10.0.0.2:9100");
        assert_eq!(u.path, "/metrics");
        assert_eq!(
            parse_metrics_url("http://10.0.0.2").unwrap().addr.port(),
            80
        );
        assert!(parse_metrics_url("https://x/").is_err());
        assert!(parse_metrics_url("http://name.example/").is_err());
        assert_eq!(
            dechunk(b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"),
            b"hello world"
        );
        assert_eq!(dechunk(b"zz\r\n"), b"");
    }

    #[test]
    fn a_hostile_metrics_page_is_read_or_refused_never_a_panic() {
        let ok = |body: &[u8]| {
            let mut r = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
            r.extend_from_slice(body);
            metrics_page(&r)
        };
        // Chunk sizes count bytes: a chunk boundary inside a two-byte character (é), and
        // bytes that are no UTF-8 at all, are read as bytes first.
        assert_eq!(
            ok(b"3\r\nx \xc3\r\n2\r\n\xa9y\r\n0\r\n\r\n").as_deref(),
            Ok("x éy")
        );
        assert_eq!(ok(b"2\r\n\xff1\r\n0\r\n\r\n").as_deref(), Ok("\u{fffd}1"));
        // A size past the end, or one that overflows, ends the body there.
        assert_eq!(ok(b"2\r\nab\r\n9\r\nabc").as_deref(), Ok("ab"));
        assert_eq!(ok(b"ffffffffffffffff\r\nab\r\n").as_deref(), Ok(""));
        assert_eq!(
            ok(b"5\r\nabcde\r\nffffffffffffffffff\r\n").as_deref(),
            Ok("abcde")
        );
        // Not a 200, or no header end: refused with the reason.
        assert_eq!(
            metrics_page(b"HTTP/1.1 503 Busy\r\n\r\n"),
            Err("status \"HTTP/1.1 503 Busy\"".to_string())
        );
        assert!(metrics_page(b"HTTP/1.1 200 OK\r\nX: \xff").is_err());
        assert_eq!(
            metrics_page(b"HTTP/1.0 200 OK\r\n\r\nup 1\n\xe2\x82").as_deref(),
            Ok("up 1\n\u{fffd}")
        );
    }
}
