//! httpd + load in-process on loopback: no root, no OVS.

use std::time::Duration;

use flowgate_testbed::httpd::{HttpdArgs, bind_httpd};
use flowgate_testbed::load::{LoadArgs, parse_url, run_load};
use tokio::sync::oneshot;

struct Server {
    url: String,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Server {
    async fn start(mut args: HttpdArgs) -> Server {
        args.listen = "127.0.0.1:0".parse().expect("addr");
        let srv = bind_httpd(args).await.expect("bind");
        let url = format!("http://{}", srv.local_addr().expect("addr"));
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(srv.serve(async move {
            let _ = rx.await;
        }));
        Server {
            url,
            stop: Some(tx),
            task,
        }
    }
    async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        tokio::time::timeout(Duration::from_secs(10), &mut self.task)
            .await
            .expect("server stops")
            .expect("join")
            .expect("serve ok");
    }
}

fn args(name: &str) -> HttpdArgs {
    HttpdArgs {
        name: name.into(),
        metrics: true,
        ..HttpdArgs::default()
    }
}

#[tokio::test]
async fn closed_loop_new_connections_counts_everything() {
    let s = Server::start(args("b1")).await;
    let mut a = LoadArgs::new(format!("{}/", s.url), 200);
    a.concurrency = 8;
    let r = run_load(&a).await.expect("load");
    assert_eq!((r.sent, r.ok, r.failed), (200, 200, 0), "{r}");
    assert_eq!(r.per_backend.get("b1"), Some(&200));
    assert_eq!(r.bytes, 200 * 3);
    assert!(r.latency_ms.p50 > 0.0 && r.latency_ms.p99 >= r.latency_ms.p50);
    assert!((r.share("b1") - 1.0).abs() < 1e-9);
    s.stop().await;
}

#[tokio::test]
async fn keep_alive_mode_and_metrics() {
    let s = Server::start(args("ka")).await;
    let mut a = LoadArgs::new(format!("{}/x", s.url), 50);
    a.concurrency = 2;
    a.new_connection_per_request = false;
    let r = run_load(&a).await.expect("load");
    assert_eq!((r.ok, r.failed), (50, 0), "{r}");
    // /metrics through a plain request.
    let client = LoadArgs::new(format!("{}/metrics", s.url), 1);
    let m = run_load(&client).await.expect("metrics");
    assert_eq!(m.ok, 1);
    let body = fetch(&format!("{}/metrics", s.url)).await;
    assert!(
        body.contains("http_requests_total{backend=\"ka\",code=\"200\"} 50"),
        "{body}"
    );
    assert!(
        body.contains("http_request_duration_seconds_count{backend=\"ka\"} 50"),
        "{body}"
    );
    assert!(
        body.contains("http_requests_in_flight{backend=\"ka\"} 0"),
        "{body}"
    );
    s.stop().await;
}

async fn fetch(url: &str) -> String {
    use http_body_util::{BodyExt, Empty};
    let (host, port, path) = parse_url(url).expect("url");
    let stream = tokio::net::TcpStream::connect((host.as_str(), port))
        .await
        .expect("connect");
    let (mut tx, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .expect("hs");
    tokio::spawn(conn);
    let req = hyper::Request::get(path)
        .header("host", host)
        .body(Empty::<hyper::body::Bytes>::new())
        .expect("req");
    let resp = tx.send_request(req).await.expect("send");
    let b = resp.into_body().collect().await.expect("body").to_bytes();
    String::from_utf8_lossy(&b).into_owned()
}

#[tokio::test]
async fn concurrency_limit_rejects_with_503() {
    let s = Server::start(HttpdArgs {
        concurrency: 1,
        queue: 0,
        delay_ms: 200,
        ..args("lim")
    })
    .await;
    let mut a = LoadArgs::new(format!("{}/", s.url), 8);
    a.concurrency = 4;
    let r = run_load(&a).await.expect("load");
    assert_eq!(r.sent, 8);
    // One slot, no queue: while one request is served the other workers are turned away.
    assert!(r.ok >= 1, "{r}");
    let rejected = r.errors.http_status.get(&503).copied().unwrap_or(0);
    assert!(rejected >= 3, "{r}");
    assert_eq!(r.ok + rejected, 8, "{r}");
    // The health check is never limited.
    assert!(fetch(&format!("{}/health", s.url)).await.starts_with("ok"));
    s.stop().await;
}

#[tokio::test]
async fn queue_waits_instead_of_rejecting() {
    let s = Server::start(HttpdArgs {
        concurrency: 1,
        queue: 10,
        delay_ms: 20,
        ..args("q")
    })
    .await;
    let mut a = LoadArgs::new(format!("{}/", s.url), 8);
    a.concurrency = 4;
    let r = run_load(&a).await.expect("load");
    assert_eq!((r.ok, r.failed), (8, 0), "{r}");
    // Serialized: 8 × 20 ms.
    assert!(r.elapsed_secs >= 0.15, "{r}");
    s.stop().await;
}

#[tokio::test]
async fn slow_download_streams_exact_bytes() {
    let s = Server::start(HttpdArgs {
        rate_bytes_per_sec: 100_000,
        ..args("dl")
    })
    .await;
    let a = LoadArgs::new(format!("{}/bytes/30000", s.url), 1);
    let r = run_load(&a).await.expect("load");
    assert_eq!((r.ok, r.bytes), (1, 30_000), "{r}");
    // 30 kB at 100 kB/s ≈ 0.3 s.
    assert!(r.latency_ms.p50 >= 200.0, "{r}");
    s.stop().await;
}

#[tokio::test]
async fn body_bytes_and_open_loop_rate() {
    let s = Server::start(HttpdArgs {
        body_bytes: 1000,
        ..args("ol")
    })
    .await;
    let mut a = LoadArgs::new(format!("{}/", s.url), 40);
    a.rate = Some(200.0);
    let r = run_load(&a).await.expect("load");
    assert_eq!((r.sent, r.ok), (40, 40), "{r}");
    assert_eq!(r.bytes, 40_000);
    // 40 requests at 200/s take about 0.2 s.
    assert!(r.elapsed_secs >= 0.18 && r.elapsed_secs < 5.0, "{r}");
    s.stop().await;
}

#[tokio::test]
async fn refused_and_timeout_are_classified() {
    // A port that was just free: bind, learn, drop.
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = l.local_addr().expect("addr").port();
    drop(l);
    let r = run_load(&LoadArgs::new(format!("http://127.0.0.1:{port}/"), 5))
        .await
        .expect("load");
    assert_eq!((r.failed, r.errors.connect_refused), (5, 5), "{r}");

    let s = Server::start(HttpdArgs {
        delay_ms: 2000,
        ..args("slow")
    })
    .await;
    let mut a = LoadArgs::new(format!("{}/", s.url), 2);
    a.timeout_ms = 100;
    a.concurrency = 2;
    let r = run_load(&a).await.expect("load");
    assert_eq!((r.failed, r.errors.timeout), (2, 2), "{r}");
    s.stop().await;
}

#[tokio::test]
async fn duration_cap_bounds_the_run() {
    let s = Server::start(HttpdArgs {
        delay_ms: 50,
        ..args("cap")
    })
    .await;
    let mut a = LoadArgs::new(format!("{}/", s.url), 1_000_000);
    a.duration_secs = 0.3;
    let r = run_load(&a).await.expect("load");
    assert!(r.sent < 20 && r.sent >= 2, "{r}");
    assert!(r.elapsed_secs < 2.0, "{r}");
    s.stop().await;
}

#[test]
fn url_parsing_and_validation() {
    assert_eq!(
        parse_url("http://10.0.0.2:8080/a?b").ok(),
        Some(("10.0.0.2".into(), 8080, "/a?b".into()))
    );
    assert_eq!(
        parse_url("http://h").ok(),
        Some(("h".into(), 80, "/".into()))
    );
    assert_eq!(
        parse_url("http://[::1]:81/").ok(),
        Some(("::1".into(), 81, "/".into()))
    );
    assert!(parse_url("https://h/").is_err());
    assert!(parse_url("http://u@h/").is_err());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("rt");
    assert!(
        rt.block_on(run_load(&LoadArgs::new("http://127.0.0.1:1/", 0)))
            .is_err()
    );
}
