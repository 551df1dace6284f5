//! A real HTTP/1.1 backend server (tokio + hyper) for tests, the lab and benchmarks.
//!
//! Routes:
//! - `GET /health` → `200 ok` (never subject to the concurrency limit);
//! - `GET /metrics` → Prometheus text (with `--metrics`; never limited);
//! - `GET /bytes/N` → exactly N bytes, streamed at `--rate-bytes-per-sec` (a long download);
//! - anything else → the backend name (or `--body-bytes` bytes) after `--delay-ms`.
//!
//! Every response carries `X-Backend: NAME`. With `--concurrency N` at most N requests are
//! served at once (streams included); up to `--queue` more wait, beyond that `503`.
//! Keep-alive and `Connection: close` both work (hyper's HTTP/1.1 connection handling).

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::fmt::Write as _;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Bytes, Frame, Incoming, SizeHint};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};

/// Response header naming the backend that served a request.
pub const BACKEND_HEADER: &str = "x-backend";

/// Command-line arguments of the backend server (`fg-testbed-tools httpd`, `flowgate httpd`).
#[derive(Debug, Clone, clap::Args, serde::Serialize, serde::Deserialize)]
pub struct HttpdArgs {
    /// Address to listen on.
    #[arg(long, default_value = "0.0.0.0:8080")]
    pub listen: SocketAddr,
    /// Backend name, returned in the `X-Backend` header and the body.
    #[arg(long, default_value = "backend")]
    pub name: String,
    /// Service time added to every ordinary request, in milliseconds.
    #[arg(long, default_value_t = 0)]
    pub delay_ms: u64,
    /// At most this many requests served at once (0 = unlimited).
    #[arg(long, default_value_t = 0)]
    pub concurrency: usize,
    /// With a concurrency limit: how many requests may wait; beyond that `503`.
    #[arg(long, default_value_t = 1024)]
    pub queue: usize,
    /// Size of an ordinary response body (0 = just the name and a newline).
    #[arg(long, default_value_t = 0)]
    pub body_bytes: usize,
    /// Pace of `GET /bytes/N` downloads, in bytes per second (0 = as fast as possible).
    #[arg(long, default_value_t = 1_000_000)]
    pub rate_bytes_per_sec: u64,
    /// Serve `GET /metrics` in Prometheus text format.
    #[arg(long)]
    pub metrics: bool,
}

impl Default for HttpdArgs {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([0, 0, 0, 0], 8080)),
            name: "backend".into(),
            delay_ms: 0,
            concurrency: 0,
            queue: 1024,
            body_bytes: 0,
            rate_bytes_per_sec: 1_000_000,
            metrics: false,
        }
    }
}

/// Upper bounds of the request duration histogram, in seconds.
pub const DURATION_BUCKETS: [f64; 15] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// The server's counters.
#[derive(Debug, Default)]
pub struct Metrics {
    by_code: Mutex<BTreeMap<u16, u64>>,
    in_flight: AtomicI64,
    queued: AtomicI64,
    buckets: [AtomicU64; DURATION_BUCKETS.len()],
    count: AtomicU64,
    sum_us: AtomicU64,
}

impl Metrics {
    fn record(&self, code: StatusCode, took: Duration) {
        if let Ok(mut m) = self.by_code.lock() {
            *m.entry(code.as_u16()).or_default() += 1;
        }
        let secs = took.as_secs_f64();
        for (i, b) in DURATION_BUCKETS.iter().enumerate() {
            if secs <= *b {
                self.buckets[i].fetch_add(1, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(
            u64::try_from(took.as_micros()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    /// Requests answered so far, by status code.
    pub fn requests_by_code(&self) -> BTreeMap<u16, u64> {
        self.by_code.lock().map(|m| m.clone()).unwrap_or_default()
    }

    /// Requests being served right now (holding a concurrency slot, streams included).
    pub fn in_flight(&self) -> i64 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Prometheus text exposition.
    pub fn render(&self, backend: &str) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "# HELP http_requests_total Requests answered, by status code."
        );
        let _ = writeln!(s, "# TYPE http_requests_total counter");
        for (code, n) in self.requests_by_code() {
            let _ = writeln!(
                s,
                "http_requests_total{{backend=\"{backend}\",code=\"{code}\"}} {n}"
            );
        }
        let _ = writeln!(
            s,
            "# HELP http_requests_in_flight Requests being served now."
        );
        let _ = writeln!(s, "# TYPE http_requests_in_flight gauge");
        let _ = writeln!(
            s,
            "http_requests_in_flight{{backend=\"{backend}\"}} {}",
            self.in_flight()
        );
        let _ = writeln!(
            s,
            "# HELP http_requests_queued Requests waiting for a concurrency slot."
        );
        let _ = writeln!(s, "# TYPE http_requests_queued gauge");
        let _ = writeln!(
            s,
            "http_requests_queued{{backend=\"{backend}\"}} {}",
            self.queued.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            s,
            "# HELP http_request_duration_seconds Time from request to the end of the response."
        );
        let _ = writeln!(s, "# TYPE http_request_duration_seconds histogram");
        for (i, b) in DURATION_BUCKETS.iter().enumerate() {
            let n = self.buckets[i].load(Ordering::Relaxed);
            let _ = writeln!(
                s,
                "http_request_duration_seconds_bucket{{backend=\"{backend}\",le=\"{b}\"}} {n}"
            );
        }
        let count = self.count.load(Ordering::Relaxed);
        let _ = writeln!(
            s,
            "http_request_duration_seconds_bucket{{backend=\"{backend}\",le=\"+Inf\"}} {count}"
        );
        let sum = self.sum_us.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(
            s,
            "http_request_duration_seconds_sum{{backend=\"{backend}\"}} {sum}"
        );
        let _ = writeln!(
            s,
            "http_request_duration_seconds_count{{backend=\"{backend}\"}} {count}"
        );
        s
    }
}

/// Increments a gauge now, decrements it on drop (also when hyper drops a request whose
/// client went away).
struct GaugeGuard(Arc<State>, fn(&Metrics) -> &AtomicI64);

impl GaugeGuard {
    fn new(st: &Arc<State>, f: fn(&Metrics) -> &AtomicI64) -> Self {
        f(&st.metrics).fetch_add(1, Ordering::Relaxed);
        Self(st.clone(), f)
    }
}

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        (self.1)(&self.0.metrics).fetch_sub(1, Ordering::Relaxed);
    }
}

#[derive(Debug)]
struct State {
    args: HttpdArgs,
    sem: Option<Arc<Semaphore>>,
    metrics: Metrics,
    body: Bytes,
}

type RespBody = BoxBody<Bytes, Infallible>;

/// A bound server, not yet serving. Lets a caller bind port 0 and learn the address.
#[derive(Debug)]
pub struct Httpd {
    listener: TcpListener,
    state: Arc<State>,
}

/// Binds the listening socket.
pub async fn bind_httpd(args: HttpdArgs) -> io::Result<Httpd> {
    let listener = TcpListener::bind(args.listen).await?;
    let sem = (args.concurrency > 0).then(|| Arc::new(Semaphore::new(args.concurrency)));
    let body = if args.body_bytes == 0 {
        Bytes::from(format!("{}\n", args.name))
    } else {
        let mut v = format!("{}\n", args.name).into_bytes();
        v.resize(args.body_bytes, b'x');
        Bytes::from(v)
    };
    Ok(Httpd {
        listener,
        state: Arc::new(State {
            args,
            sem,
            metrics: Metrics::default(),
            body,
        }),
    })
}

impl Httpd {
    /// The bound address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `shutdown` completes, then stops accepting and gives open connections
    /// up to 5 s to finish.
    pub async fn serve(self, shutdown: impl Future<Output = ()>) -> io::Result<()> {
        let graceful = hyper_util::server::graceful::GracefulShutdown::new();
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                r = self.listener.accept() => {
                    let stream = match r {
                        Ok((s, _)) => s,
                        Err(e) => {
                            // EMFILE and friends: back off rather than spin.
                            tracing::warn!("accept failed: {e}");
                            tokio::time::sleep(Duration::from_millis(20)).await;
                            continue;
                        }
                    };
                    let _ = stream.set_nodelay(true);
                    let st = self.state.clone();
                    let conn = http1::Builder::new()
                        .keep_alive(true)
                        .serve_connection(TokioIo::new(stream), service_fn(move |req| handle(st.clone(), req)));
                    let conn = graceful.watch(conn);
                    tokio::spawn(async move {
                        if let Err(e) = conn.await {
                            tracing::debug!("connection ended with error: {e}");
                        }
                    });
                }
                () = &mut shutdown => break,
            }
        }
        drop(self.listener);
        tokio::select! {
            () = graceful.shutdown() => {}
            () = tokio::time::sleep(Duration::from_secs(5)) => {}
        }
        Ok(())
    }
}

/// Binds, prints `flowgate-httpd NAME listening on ADDR` to stdout, and serves until
/// `shutdown` completes.
pub async fn run_httpd(args: HttpdArgs, shutdown: impl Future<Output = ()>) -> io::Result<()> {
    let name = args.name.clone();
    let srv = bind_httpd(args).await?;
    println!("flowgate-httpd {name} listening on {}", srv.local_addr()?);
    srv.serve(shutdown).await
}

fn text(st: &State, code: StatusCode, body: impl Into<Bytes>) -> Response<RespBody> {
    let mut r = Response::new(Full::new(body.into()).boxed());
    *r.status_mut() = code;
    let h = r.headers_mut();
    h.insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    if let Ok(v) = hyper::header::HeaderValue::from_str(&st.args.name) {
        h.insert(BACKEND_HEADER, v);
    }
    r
}

async fn handle(st: Arc<State>, req: Request<Incoming>) -> Result<Response<RespBody>, Infallible> {
    let start = Instant::now();
    let path = req.uri().path().to_owned();
    if req.method() == Method::GET && path == "/health" {
        let r = text(&st, StatusCode::OK, "ok\n");
        st.metrics.record(r.status(), start.elapsed());
        return Ok(r);
    }
    if req.method() == Method::GET && path == "/metrics" && st.args.metrics {
        let body = st.metrics.render(&st.args.name);
        let mut r = text(&st, StatusCode::OK, body);
        r.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        );
        return Ok(r);
    }
    let download = match path.strip_prefix("/bytes/") {
        Some(n) => match n.parse::<u64>() {
            Ok(n) => Some(n),
            Err(_) => {
                let r = text(&st, StatusCode::BAD_REQUEST, "bad byte count\n");
                st.metrics.record(r.status(), start.elapsed());
                return Ok(r);
            }
        },
        None => None,
    };
    // Admission: a free slot, else a place in the queue, else 503.
    let permit: Option<OwnedSemaphorePermit> = match &st.sem {
        None => None,
        Some(sem) => match sem.clone().try_acquire_owned() {
            Ok(p) => Some(p),
            Err(_) => {
                let waiting = st.metrics.queued.load(Ordering::Relaxed);
                if waiting >= i64::try_from(st.args.queue).unwrap_or(i64::MAX) {
                    let r = text(&st, StatusCode::SERVICE_UNAVAILABLE, "overloaded\n");
                    st.metrics.record(r.status(), start.elapsed());
                    return Ok(r);
                }
                let _q = GaugeGuard::new(&st, |m| &m.queued);
                match sem.clone().acquire_owned().await {
                    Ok(p) => Some(p),
                    Err(_) => {
                        let r = text(&st, StatusCode::SERVICE_UNAVAILABLE, "shutting down\n");
                        st.metrics.record(r.status(), start.elapsed());
                        return Ok(r);
                    }
                }
            }
        },
    };
    let in_flight = GaugeGuard::new(&st, |m| &m.in_flight);
    if st.args.delay_ms > 0 {
        tokio::time::sleep(Duration::from_millis(st.args.delay_ms)).await;
    }
    match download {
        None => {
            let r = text(&st, StatusCode::OK, st.body.clone());
            st.metrics.record(r.status(), start.elapsed());
            drop((permit, in_flight));
            Ok(r)
        }
        Some(n) => {
            let (tx, rx) = mpsc::channel::<Bytes>(4);
            let rate = st.args.rate_bytes_per_sec;
            let st2 = st.clone();
            tokio::spawn(async move {
                let _held = (permit, in_flight);
                let chunk = if rate == 0 {
                    64 * 1024
                } else {
                    (rate / 20).clamp(1, 64 * 1024)
                };
                let buf = Bytes::from(vec![b'x'; usize::try_from(chunk).unwrap_or(65536)]);
                let t0 = tokio::time::Instant::now();
                let mut sent: u64 = 0;
                while sent < n {
                    let len = chunk.min(n - sent);
                    if tx
                        .send(buf.slice(..usize::try_from(len).unwrap_or(0)))
                        .await
                        .is_err()
                    {
                        return; // client went away; not counted as answered
                    }
                    sent += len;
                    if rate > 0 && sent < n {
                        let due = Duration::from_secs_f64(sent as f64 / rate as f64);
                        tokio::time::sleep_until(t0 + due).await;
                    }
                }
                st2.metrics.record(StatusCode::OK, start.elapsed());
            });
            let mut r = Response::new(ChannelBody { rx, remaining: n }.boxed());
            let h = r.headers_mut();
            h.insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static("application/octet-stream"),
            );
            if let Ok(v) = hyper::header::HeaderValue::from_str(&st.args.name) {
                h.insert(BACKEND_HEADER, v);
            }
            Ok(r)
        }
    }
}

/// A body fed by a channel, with an exact length (so hyper sends `Content-Length`).
struct ChannelBody {
    rx: mpsc::Receiver<Bytes>,
    remaining: u64,
}

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.rx.poll_recv(cx) {
            Poll::Ready(Some(b)) => {
                self.remaining = self.remaining.saturating_sub(b.len() as u64);
                Poll::Ready(Some(Ok(Frame::data(b))))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.remaining == 0
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.remaining)
    }
}
