//! A real HTTP/1.1 load client with bounded request count and time.
//!
//! Closed loop (`--concurrency C`): C workers, each sends its next request when the last
//! one finished. Open loop (`--rate R`): request i is due at `start + i/R` and starts on a
//! new connection then, whether or not earlier ones finished; its latency is measured from
//! that due time, so a stalled server can't hide its stall (no coordinated omission).
//!
//! By default every request opens a new TCP connection and sends `Connection: close`, so
//! each request is a new flow at the controller. It only ever talks to the one given URL.

use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Empty};
use hyper::Request;
use hyper::body::Bytes;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use serde::{Deserialize, Serialize};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::httpd::BACKEND_HEADER;

/// Hard upper bound on `--requests`.
pub const MAX_REQUESTS: u64 = 10_000_000;
/// Hard upper bound on `--duration-secs`.
pub const MAX_DURATION_SECS: f64 = 3600.0;

/// Command-line arguments of the load client (`fg-testbed-tools load`, `flowgate load`).
#[derive(Debug, Clone, clap::Args, Serialize, Deserialize)]
pub struct LoadArgs {
    /// The one URL to request (`http://HOST[:PORT]/PATH`).
    #[arg(long)]
    pub url: String,
    /// Number of requests to send (at most 10 000 000).
    #[arg(long, default_value_t = 100)]
    pub requests: u64,
    /// Closed loop: this many concurrent workers.
    #[arg(long, default_value_t = 1)]
    pub concurrency: usize,
    /// Open loop: start requests at this fixed rate per second (overrides --concurrency).
    #[arg(long)]
    pub rate: Option<f64>,
    /// Stop sending new requests after this many seconds (at most 3600).
    #[arg(long, default_value_t = 60.0)]
    pub duration_secs: f64,
    /// Per-request timeout (connect + response + body), in milliseconds.
    #[arg(long, default_value_t = 5000)]
    pub timeout_ms: u64,
    /// Open a new TCP connection for every request (`Connection: close`); `false` keeps one
    /// connection per worker alive (closed loop only).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub new_connection_per_request: bool,
    /// Open loop: at most this many requests outstanding (later ones wait, and their
    /// latency still counts from their due time).
    #[arg(long, default_value_t = 10_000)]
    pub max_in_flight: usize,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Write one line per request to this file: the local TCP port it used, the backend
    /// that answered, the outcome, its latency and when it was due (`PORT BACKEND
    /// STATUS|ERROR MS UNIX_SECS`; `-` where unknown), so each response can be traced to
    /// the controller's decision for that port and a slow one placed in its logs.
    #[arg(long)]
    #[serde(default)]
    pub conn_log: Option<std::path::PathBuf>,
}

impl LoadArgs {
    /// Arguments for `requests` requests to `url` with defaults otherwise.
    pub fn new(url: impl Into<String>, requests: u64) -> Self {
        Self {
            url: url.into(),
            requests,
            concurrency: 1,
            rate: None,
            duration_secs: 60.0,
            timeout_ms: 5000,
            new_connection_per_request: true,
            max_in_flight: 10_000,
            json: false,
            conn_log: None,
        }
    }
}

/// Why a load run could not start.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The URL is not `http://host[:port]/path`.
    #[error("invalid url `{0}`: {1}")]
    Url(String, &'static str),
    /// The host did not resolve.
    #[error("cannot resolve `{0}`: {1}")]
    Resolve(String, io::Error),
    /// An argument is out of range.
    #[error("invalid arguments: {0}")]
    Args(String),
    /// The `--conn-log` file could not be written.
    #[error("cannot write the connection log `{path}`: {err}", path = .0.display(), err = .1)]
    ConnLog(std::path::PathBuf, io::Error),
}

/// Failed requests by kind.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorCounts {
    /// TCP connect got RST (nothing listening / rejected).
    pub connect_refused: u64,
    /// TCP connect did not complete within the timeout (SYN unanswered).
    pub connect_timeout: u64,
    /// Host or network unreachable (no ARP answer, no route).
    pub unreachable: u64,
    /// Connection reset or closed before a complete response.
    pub reset: u64,
    /// Connected, but the response (or its body) did not complete within the timeout.
    pub timeout: u64,
    /// Complete responses with a non-2xx status, by status code.
    pub http_status: BTreeMap<u16, u64>,
    /// Anything else.
    pub other: u64,
}

/// Latency of successful requests, in milliseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    /// Minimum.
    pub min: f64,
    /// Median.
    pub p50: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Maximum.
    pub max: f64,
    /// Mean.
    pub mean: f64,
}

/// The outcome of a load run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LoadReport {
    /// The URL requested.
    pub url: String,
    /// Requests started.
    pub sent: u64,
    /// Requests answered 2xx with a complete body.
    pub ok: u64,
    /// Requests that failed (sum of `errors`).
    pub failed: u64,
    /// Failures by kind.
    pub errors: ErrorCounts,
    /// Latency of the `ok` requests (open loop: from their due time).
    pub latency_ms: Latency,
    /// Time to failure of the failed requests (open loop: from their due time): how long
    /// a refused client waited to learn it (an RST at once, or a timeout).
    #[serde(default)]
    pub failed_ms: Latency,
    /// Responses (any status) by their `X-Backend` header; `"-"` when absent.
    pub per_backend: BTreeMap<String, u64>,
    /// Response body bytes received.
    pub bytes: u64,
    /// Wall time from first request to last completion, in seconds.
    pub elapsed_secs: f64,
    /// Completed requests (ok + failed) per second.
    pub achieved_rate: f64,
    /// SYNs sent again during the run by the network namespace the client runs in
    /// (`TcpExt: TCPSynRetrans` of `/proc/net/netstat`, at the end minus at the start;
    /// other sockets of the namespace count too): each is a handshake whose SYN or
    /// SYN-ACK was lost, which costs its request a second (RFC 6298's initial RTO).
    /// `None` where that counter cannot be read.
    #[serde(default)]
    pub syn_retransmits: Option<u64>,
}

impl LoadReport {
    /// Share of responses from `backend` among all responses carrying a backend header.
    pub fn share(&self, backend: &str) -> f64 {
        let total: u64 = self
            .per_backend
            .iter()
            .filter(|(k, _)| k.as_str() != "-")
            .map(|(_, v)| v)
            .sum();
        if total == 0 {
            0.0
        } else {
            *self.per_backend.get(backend).unwrap_or(&0) as f64 / total as f64
        }
    }
}

impl std::fmt::Display for LoadReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "url          {}", self.url)?;
        writeln!(
            f,
            "sent         {}  ok {}  failed {}",
            self.sent, self.ok, self.failed
        )?;
        let e = &self.errors;
        writeln!(
            f,
            "errors       refused {}  connect-timeout {}  unreachable {}  reset {}  timeout {}  other {}  http {:?}",
            e.connect_refused,
            e.connect_timeout,
            e.unreachable,
            e.reset,
            e.timeout,
            e.other,
            e.http_status
        )?;
        let l = &self.latency_ms;
        writeln!(
            f,
            "latency ms   p50 {:.2}  p95 {:.2}  p99 {:.2}  max {:.2}  mean {:.2}",
            l.p50, l.p95, l.p99, l.max, l.mean
        )?;
        writeln!(f, "backends     {:?}", self.per_backend)?;
        if let Some(n) = self.syn_retransmits {
            writeln!(f, "handshakes   SYNs sent again {n}")?;
        }
        write!(
            f,
            "elapsed      {:.3}s  rate {:.1}/s  bytes {}",
            self.elapsed_secs, self.achieved_rate, self.bytes
        )
    }
}

#[derive(Debug, Clone)]
struct Target {
    addr: SocketAddr,
    host_header: String,
    path: String,
}

/// Splits `http://host[:port]/path` into (host, port, path).
pub fn parse_url(url: &str) -> Result<(String, u16, String), LoadError> {
    let bad = |why| LoadError::Url(url.to_owned(), why);
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| bad("only http:// is supported"))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    if authority.is_empty() || authority.contains('@') {
        return Err(bad("missing host (or userinfo given)"));
    }
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (h, after) = v6.split_once(']').ok_or_else(|| bad("unclosed ["))?;
        let port = match after.strip_prefix(':') {
            Some(p) => p.parse().map_err(|_| bad("bad port"))?,
            None if after.is_empty() => 80,
            None => return Err(bad("junk after ]")),
        };
        (h.to_owned(), port)
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h.to_owned(), p.parse().map_err(|_| bad("bad port"))?),
            None => (authority.to_owned(), 80),
        }
    };
    Ok((host, port, path.to_owned()))
}

async fn resolve(url: &str) -> Result<Target, LoadError> {
    let (host, port, path) = parse_url(url)?;
    let addr = tokio::net::lookup_host((host.as_str(), port))
        .await
        .map_err(|e| LoadError::Resolve(host.clone(), e))?
        .next()
        .ok_or_else(|| LoadError::Resolve(host.clone(), io::Error::other("no address")))?;
    let host_header = if port == 80 {
        host
    } else if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    Ok(Target {
        addr,
        host_header,
        path,
    })
}

#[derive(Debug)]
enum Fail {
    Refused,
    ConnectTimeout,
    Unreachable,
    Reset,
    Timeout,
    Other,
}

#[derive(Debug)]
struct Response {
    status: u16,
    backend: Option<String>,
    bytes: u64,
}

/// One request as `--conn-log` writes it.
struct ConnRecord {
    /// When it was due (open loop) or began (closed loop).
    at: Instant,
    port: Option<u16>,
    backend: Option<String>,
    outcome: String,
    took: Duration,
}

/// Per-worker tallies, merged at the end.
struct Tally {
    hist: Histogram<u64>,
    /// Time to failure of failed requests.
    fail_hist: Histogram<u64>,
    report: LoadReport,
    /// Kept only with `--conn-log`.
    records: Option<Vec<ConnRecord>>,
}

impl Tally {
    fn new(record: bool) -> Self {
        // 1 µs .. 1 h, 3 significant digits. Bounds are constants, so this cannot fail.
        #[allow(clippy::unwrap_used)]
        let hist = Histogram::new_with_bounds(1, 3_600_000_000, 3).unwrap();
        Self {
            fail_hist: hist.clone(),
            hist,
            report: LoadReport::default(),
            records: record.then(Vec::new),
        }
    }

    fn add(&mut self, at: Instant, took: Duration, port: Option<u16>, r: Result<Response, Fail>) {
        if let Some(recs) = &mut self.records {
            let (backend, outcome) = match &r {
                Ok(resp) => (resp.backend.clone(), resp.status.to_string()),
                Err(f) => (None, format!("{f:?}")),
            };
            recs.push(ConnRecord {
                at,
                port,
                backend,
                outcome,
                took,
            });
        }
        let rep = &mut self.report;
        rep.sent += 1;
        let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX).max(1);
        if !matches!(&r, Ok(resp) if (200..300).contains(&resp.status)) {
            self.fail_hist.saturating_record(us);
        }
        match r {
            Ok(resp) => {
                rep.bytes += resp.bytes;
                *rep.per_backend
                    .entry(resp.backend.unwrap_or_else(|| "-".into()))
                    .or_default() += 1;
                if (200..300).contains(&resp.status) {
                    rep.ok += 1;
                    self.hist.saturating_record(us);
                } else {
                    rep.failed += 1;
                    *rep.errors.http_status.entry(resp.status).or_default() += 1;
                }
            }
            Err(f) => {
                rep.failed += 1;
                let e = &mut rep.errors;
                match f {
                    Fail::Refused => e.connect_refused += 1,
                    Fail::ConnectTimeout => e.connect_timeout += 1,
                    Fail::Unreachable => e.unreachable += 1,
                    Fail::Reset => e.reset += 1,
                    Fail::Timeout => e.timeout += 1,
                    Fail::Other => e.other += 1,
                }
            }
        }
    }

    fn merge(&mut self, o: Tally) {
        if let (Some(a), Some(b)) = (&mut self.records, o.records) {
            a.extend(b);
        }
        let _ = self.hist.add(&o.hist);
        let _ = self.fail_hist.add(&o.fail_hist);
        let (a, b) = (&mut self.report, o.report);
        a.sent += b.sent;
        a.ok += b.ok;
        a.failed += b.failed;
        a.bytes += b.bytes;
        for (k, v) in b.per_backend {
            *a.per_backend.entry(k).or_default() += v;
        }
        let (x, y) = (&mut a.errors, b.errors);
        x.connect_refused += y.connect_refused;
        x.connect_timeout += y.connect_timeout;
        x.unreachable += y.unreachable;
        x.reset += y.reset;
        x.timeout += y.timeout;
        x.other += y.other;
        for (k, v) in y.http_status {
            *x.http_status.entry(k).or_default() += v;
        }
    }
}

fn classify_io(e: &io::Error, connecting: bool) -> Fail {
    use io::ErrorKind as K;
    match e.kind() {
        K::ConnectionRefused => Fail::Refused,
        K::ConnectionReset | K::ConnectionAborted | K::BrokenPipe | K::UnexpectedEof => Fail::Reset,
        K::TimedOut if connecting => Fail::ConnectTimeout,
        K::TimedOut => Fail::Timeout,
        K::HostUnreachable | K::NetworkUnreachable => Fail::Unreachable,
        _ => match e.raw_os_error() {
            // EHOSTUNREACH, ENETUNREACH on older kinds mapping
            Some(113) | Some(101) => Fail::Unreachable,
            _ => Fail::Other,
        },
    }
}

fn classify_hyper(e: &hyper::Error) -> Fail {
    let mut src: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(s) = src {
        if let Some(io) = s.downcast_ref::<io::Error>() {
            return classify_io(io, false);
        }
        src = s.source();
    }
    if e.is_incomplete_message() || e.is_canceled() || e.is_closed() {
        Fail::Reset
    } else {
        Fail::Other
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);
impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

type Sender = SendRequest<Empty<Bytes>>;

/// A connection to the target: its request sender, the task driving it, its local port.
type Connected = (Sender, AbortOnDrop, Option<u16>);

async fn connect(t: &Target, deadline: Instant) -> Result<Connected, Fail> {
    let stream = match tokio::time::timeout_at(deadline, TcpStream::connect(t.addr)).await {
        Err(_) => return Err(Fail::ConnectTimeout),
        Ok(Err(e)) => return Err(classify_io(&e, true)),
        Ok(Ok(s)) => s,
    };
    let port = stream.local_addr().ok().map(|a| a.port());
    let _ = stream.set_nodelay(true);
    let (sender, conn) =
        match tokio::time::timeout_at(deadline, http1::handshake(TokioIo::new(stream))).await {
            Err(_) => return Err(Fail::Timeout),
            Ok(Err(e)) => return Err(classify_hyper(&e)),
            Ok(Ok(x)) => x,
        };
    let task = tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok((sender, AbortOnDrop(task), port))
}

async fn send(t: &Target, sender: &mut Sender, close: bool) -> Result<Response, Fail> {
    sender.ready().await.map_err(|e| classify_hyper(&e))?;
    let mut b = Request::get(t.path.as_str()).header(hyper::header::HOST, t.host_header.as_str());
    if close {
        b = b.header(hyper::header::CONNECTION, "close");
    }
    let req = b.body(Empty::<Bytes>::new()).map_err(|_| Fail::Other)?;
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| classify_hyper(&e))?;
    let status = resp.status().as_u16();
    let backend = resp
        .headers()
        .get(BACKEND_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let mut body = resp.into_body();
    let mut bytes = 0u64;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| classify_hyper(&e))?;
        if let Some(d) = frame.data_ref() {
            bytes += d.len() as u64;
        }
    }
    Ok(Response {
        status,
        backend,
        bytes,
    })
}

/// One request on a fresh connection, bounded by `timeout`; the connection's local port
/// when it got one. Never retried: one request is one connection attempt.
async fn one_fresh(t: &Target, timeout: Duration) -> (Option<u16>, Result<Response, Fail>) {
    let deadline = Instant::now() + timeout;
    let (mut sender, _conn, port) = match connect(t, deadline).await {
        Ok(c) => c,
        Err(f) => return (None, Err(f)),
    };
    let r = match tokio::time::timeout_at(deadline, send(t, &mut sender, true)).await {
        Err(_) => Err(Fail::Timeout),
        Ok(r) => r,
    };
    (port, r)
}

fn validate(args: &LoadArgs) -> Result<(), LoadError> {
    if args.requests == 0 || args.requests > MAX_REQUESTS {
        return Err(LoadError::Args(format!(
            "--requests must be 1..={MAX_REQUESTS}"
        )));
    }
    if !(args.duration_secs > 0.0 && args.duration_secs <= MAX_DURATION_SECS) {
        return Err(LoadError::Args(format!(
            "--duration-secs must be in (0, {MAX_DURATION_SECS}]"
        )));
    }
    if args.timeout_ms == 0 {
        return Err(LoadError::Args("--timeout-ms must be positive".into()));
    }
    if let Some(r) = args.rate {
        if !(r > 0.0 && r.is_finite()) {
            return Err(LoadError::Args("--rate must be positive".into()));
        }
    } else if args.concurrency == 0 || args.concurrency > 100_000 {
        return Err(LoadError::Args("--concurrency must be 1..=100000".into()));
    }
    if args.max_in_flight == 0 {
        return Err(LoadError::Args("--max-in-flight must be positive".into()));
    }
    Ok(())
}

/// `anchor` is one moment read on both clocks: each request's start is written as wall
/// time (UNIX seconds), so a slow one can be placed beside the controller's and the
/// switch's logs.
/// The network namespace's count of SYNs sent again, if `/proc/net/netstat` has it.
fn syn_retransmits() -> Option<u64> {
    tcp_ext(
        &std::fs::read_to_string("/proc/net/netstat").ok()?,
        "TCPSynRetrans",
    )
}

/// A `TcpExt` counter of `/proc/net/netstat`'s text (a line of names, then one of
/// values), such as `TCPSynRetrans`.
pub fn tcp_ext(netstat: &str, name: &str) -> Option<u64> {
    let mut lines = netstat.lines().filter(|l| l.starts_with("TcpExt:"));
    let (names, values) = (lines.next()?, lines.next()?);
    let i = names.split_whitespace().position(|n| n == name)?;
    values.split_whitespace().nth(i)?.parse().ok()
}

fn write_conn_log(
    path: &std::path::Path,
    recs: &[ConnRecord],
    anchor: (Instant, SystemTime),
) -> io::Result<()> {
    use std::io::Write;
    let mut f = io::BufWriter::new(std::fs::File::create(path)?);
    for r in recs {
        let port = r.port.map_or_else(|| "-".to_owned(), |p| p.to_string());
        let backend = r.backend.as_deref().unwrap_or("-");
        let ms = r.took.as_secs_f64() * 1000.0;
        // No request starts before the run's anchor.
        let wall = anchor.1 + r.at.saturating_duration_since(anchor.0);
        let unix = wall
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        writeln!(f, "{port} {backend} {} {ms:.3} {unix:.3}", r.outcome)?;
    }
    f.flush()
}

/// Runs the load described by `args` and reports what happened.
pub async fn run_load(args: &LoadArgs) -> Result<LoadReport, LoadError> {
    validate(args)?;
    let target = Arc::new(resolve(&args.url).await?);
    let timeout = Duration::from_millis(args.timeout_ms);
    let syns_before = syn_retransmits();
    let start = Instant::now();
    let anchor = (start, SystemTime::now());
    let stop_sending = start + Duration::from_secs_f64(args.duration_secs);
    let record = args.conn_log.is_some();
    let mut total = Tally::new(record);

    if let Some(rate) = args.rate {
        let sem = Arc::new(tokio::sync::Semaphore::new(args.max_in_flight));
        let mut set = tokio::task::JoinSet::new();
        for i in 0..args.requests {
            let due = start + Duration::from_secs_f64(i as f64 / rate);
            if due > stop_sending {
                break;
            }
            tokio::time::sleep_until(due).await;
            let Ok(permit) = sem.clone().acquire_owned().await else {
                break;
            };
            let t = target.clone();
            set.spawn(async move {
                let (port, r) = one_fresh(&t, timeout).await;
                drop(permit);
                (due, due.elapsed(), port, r)
            });
            while let Some(done) = set.try_join_next() {
                if let Ok((due, took, port, r)) = done {
                    total.add(due, took, port, r);
                }
            }
        }
        while let Some(done) = set.join_next().await {
            if let Ok((due, took, port, r)) = done {
                total.add(due, took, port, r);
            }
        }
    } else {
        let next = Arc::new(AtomicU64::new(0));
        let mut set = tokio::task::JoinSet::new();
        for _ in 0..args
            .concurrency
            .min(usize::try_from(args.requests).unwrap_or(usize::MAX))
        {
            let (t, next, n, fresh) = (
                target.clone(),
                next.clone(),
                args.requests,
                args.new_connection_per_request,
            );
            set.spawn(async move {
                let mut tally = Tally::new(record);
                let mut conn: Option<Connected> = None;
                while next.fetch_add(1, Ordering::Relaxed) < n && Instant::now() < stop_sending {
                    let t0 = Instant::now();
                    let (port, r) = if fresh {
                        one_fresh(&t, timeout).await
                    } else {
                        let deadline = t0 + timeout;
                        let r = async {
                            if conn.as_ref().is_none_or(|(s, _, _)| s.is_closed()) {
                                conn = Some(connect(&t, deadline).await?);
                            }
                            let Some((s, _, _)) = conn.as_mut() else {
                                return Err(Fail::Other);
                            };
                            match tokio::time::timeout_at(deadline, send(&t, s, false)).await {
                                Err(_) => Err(Fail::Timeout),
                                Ok(r) => r,
                            }
                        }
                        .await;
                        let port = conn.as_ref().and_then(|c| c.2);
                        if r.is_err() {
                            conn = None;
                        }
                        (port, r)
                    };
                    tally.add(t0, t0.elapsed(), port, r);
                }
                tally
            });
        }
        while let Some(done) = set.join_next().await {
            if let Ok(t) = done {
                total.merge(t);
            }
        }
    }

    let elapsed = start.elapsed().as_secs_f64();
    if let (Some(path), Some(recs)) = (&args.conn_log, &total.records) {
        write_conn_log(path, recs, anchor).map_err(|e| LoadError::ConnLog(path.clone(), e))?;
    }
    let mut rep = total.report;
    rep.syn_retransmits = syns_before
        .zip(syn_retransmits())
        .map(|(a, b)| b.saturating_sub(a));
    rep.url = args.url.clone();
    rep.elapsed_secs = elapsed;
    rep.achieved_rate = if elapsed > 0.0 {
        rep.sent as f64 / elapsed
    } else {
        0.0
    };
    let summary = |h: &Histogram<u64>| {
        let ms = |us: u64| us as f64 / 1000.0;
        Latency {
            min: ms(h.min()),
            p50: ms(h.value_at_quantile(0.50)),
            p95: ms(h.value_at_quantile(0.95)),
            p99: ms(h.value_at_quantile(0.99)),
            max: ms(h.max()),
            mean: h.mean() / 1000.0,
        }
    };
    if !total.hist.is_empty() {
        rep.latency_ms = summary(&total.hist);
    }
    if !total.fail_hist.is_empty() {
        rep.failed_ms = summary(&total.fail_hist);
    }
    Ok(rep)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel's `TcpExt` counters: names on one line, values on the next, after
    /// other groups' lines; a counter it does not list is `None`.
    #[test]
    fn a_tcp_ext_counter_is_read_by_name() {
        let text = "TcpExt: SyncookiesSent TCPSynRetrans TCPOrigDataSent\n\
                    TcpExt: 0 7 1234\n\
                    IpExt: InNoRoutes InTruncatedPkts\n\
                    IpExt: 0 0\n";
        assert_eq!(tcp_ext(text, "TCPSynRetrans"), Some(7));
        assert_eq!(tcp_ext(text, "TCPOrigDataSent"), Some(1234));
        assert_eq!(tcp_ext(text, "TCPNope"), None);
        assert_eq!(tcp_ext("IpExt: A\nIpExt: 1\n", "TCPSynRetrans"), None);
        // Where the process runs (here: this test's namespace), the counter is there.
        if std::path::Path::new("/proc/net/netstat").exists() {
            assert!(syn_retransmits().is_some());
        }
    }

    /// `--conn-log` lines: port, backend, status or failure kind, milliseconds, wall time
    /// due; `-` where a field is unknown (no connection, no backend header).
    #[test]
    fn conn_log_lines_trace_each_request() {
        let mut t = Tally::new(true);
        let start = Instant::now();
        let anchor = (start, UNIX_EPOCH + Duration::from_secs(1_800_000_000));
        let ok = Response {
            status: 200,
            backend: Some("b2".into()),
            bytes: 3,
        };
        t.add(start, Duration::from_micros(1500), Some(40000), Ok(ok));
        let later = start + Duration::from_millis(1250);
        t.add(later, Duration::from_millis(2), None, Err(Fail::Refused));
        let path = std::env::temp_dir().join(format!("fg-conn-log-{}.txt", std::process::id()));
        write_conn_log(&path, t.records.as_deref().unwrap_or_default(), anchor).expect("write");
        let text = std::fs::read_to_string(&path).expect("read");
        let _ = std::fs::remove_file(&path);
        assert_eq!(
            text,
            "40000 b2 200 1.500 1800000000.000\n- - Refused 2.000 1800000001.250\n"
        );
        assert!(
            Tally::new(false).records.is_none(),
            "nothing kept without the option"
        );
    }
}
