//! The API's own rules over a real router on 127.0.0.1:0: the auth scheme, calls with
//! more than their route takes, the metrics URL of a new backend, reloads.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;

use flowgate_core::service::AdminState;
use flowgate_core::{Config, Controller};
use flowgate_testbed::ScratchDir;

use crate::runtime::Handle;

const TOKEN: &str = "api-unit-token-0123";

const CONFIG: &str = "[api]\ntoken = \"api-unit-token-0123\"\n\
    [[service]]\nname = \"web\"\nvip = \"10.0.0.100\"\nport = 80\n\
    [service.health]\nkind = \"none\"\n\
    [[service.backend]]\naddress = \"10.0.0.2\"\n\
    [[service.backend]]\naddress = \"10.0.0.3\"\n";

struct Api {
    addr: SocketAddr,
    handle: Handle,
    _rt: tokio::runtime::Runtime,
}

fn api(config_path: Option<PathBuf>) -> Api {
    let text = match &config_path {
        Some(p) => std::fs::read_to_string(p).expect("config file"),
        None => CONFIG.to_string(),
    };
    let config = Config::from_toml(&text, &|_| None).expect("valid config");
    let handle = Handle::new(Controller::new(&config), config, config_path);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind");
    let addr = listener.local_addr().expect("address");
    let app = super::router(handle.clone());
    rt.spawn(async move { axum::serve(listener, app).await });
    Api {
        addr,
        handle,
        _rt: rt,
    }
}

/// One HTTP/1.1 call: its status and body.
fn call(
    addr: SocketAddr,
    method: &str,
    path: &str,
    auth: Option<&str>,
    body: &str,
) -> (u16, String) {
    let mut s = TcpStream::connect(addr).expect("connect");
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n");
    if let Some(a) = auth {
        req += &format!("Authorization: {a}\r\n");
    }
    if !body.is_empty() {
        req += &format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        );
    }
    req += "\r\n";
    req += body;
    s.write_all(req.as_bytes()).expect("send");
    let mut resp = String::new();
    s.read_to_string(&mut resp).expect("read");
    let status = resp
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("status");
    let body = resp
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

fn bearer() -> String {
    format!("Bearer {TOKEN}")
}

#[test]
fn the_auth_scheme_is_case_insensitive() {
    let a = api(None);
    let drain = "/api/v1/services/web/backends/10.0.0.2/drain";
    for scheme in ["Bearer", "bearer", "BEARER", "bEaReR"] {
        let (status, body) = call(
            a.addr,
            "POST",
            drain,
            Some(&format!("{scheme} {TOKEN}")),
            "",
        );
        assert_eq!(status, 200, "{scheme}: {body}");
    }
    for wrong in [
        format!("Basic {TOKEN}"),
        format!("Bearer{TOKEN}"),
        TOKEN.to_string(),
    ] {
        let (status, _) = call(a.addr, "POST", drain, Some(&wrong), "");
        assert_eq!(status, 401, "{wrong}");
    }
}

#[test]
fn a_call_with_a_query_or_body_its_route_does_not_take_is_refused() {
    let a = api(None);
    let auth = bearer();
    let b = "/api/v1/services/web/backends/10.0.0.2";
    for (method, path, body) in [
        ("POST", format!("{b}/drain"), "{\"bogus\":1}"),
        ("POST", format!("{b}/undrain"), "[]"),
        ("POST", format!("{b}/drain?now=1"), ""),
        ("DELETE", format!("{b}?force=1"), ""),
        ("POST", "/api/v1/reload?x=1".to_string(), ""),
        ("PUT", format!("{b}/weight?w=3"), "{\"weight\":3}"),
        ("GET", "/api/v1/services?verbose=1".to_string(), ""),
    ] {
        let (status, text) = call(a.addr, method, &path, Some(&auth), body);
        assert_eq!(status, 400, "{method} {path} {body}: {text}");
        let json: serde_json::Value = serde_json::from_str(&text).expect("JSON");
        assert!(json["error"].is_string(), "{text}");
    }
    // Nothing was changed by the refused calls.
    let core = a.handle.lock();
    let s = &core.controller.services()[0];
    assert_eq!(s.backends.len(), 2);
    assert!(
        s.backends
            .iter()
            .all(|b| b.weight == 1 && b.admin == AdminState::Active)
    );
    drop(core);
    // What the routes do take still works.
    let (status, text) = call(
        a.addr,
        "PUT",
        &format!("{b}/weight"),
        Some(&auth),
        "{\"weight\":3}",
    );
    assert_eq!(status, 200, "{text}");
    let (status, text) = call(a.addr, "GET", "/api/v1/events?limit=1", None, "");
    assert_eq!(status, 200, "{text}");
    // An empty query, and an empty body in any form, are none.
    for body in ["", "null", "{}", " { } "] {
        let (status, text) = call(a.addr, "POST", &format!("{b}/drain?"), Some(&auth), body);
        assert_eq!(status, 200, "{body}: {text}");
    }
}

#[test]
fn a_new_backends_metrics_url_is_one_the_scraper_fetches() {
    let a = api(None);
    let auth = bearer();
    let add = "/api/v1/services/web/backends";
    for bad in [
        "http://backend.example/metrics",
        "http://10.0.0.9:0/metrics",
        "http://10.0.0.9/me trics",
        "https://10.0.0.9/metrics",
    ] {
        let body = serde_json::json!({ "address": "10.0.0.9", "metrics": bad }).to_string();
        let (status, text) = call(a.addr, "POST", add, Some(&auth), &body);
        assert_eq!(status, 400, "{bad}: {text}");
        assert!(text.contains("metrics: "), "{text}");
    }
    let body =
        serde_json::json!({ "address": "10.0.0.9", "metrics": "http://10.0.0.9:9100/metrics" })
            .to_string();
    let (status, text) = call(a.addr, "POST", add, Some(&auth), &body);
    assert_eq!(status, 201, "{text}");
}

/// A backend added through the API may pin its MAC, held to the file's rules.
#[test]
fn a_new_backends_mac_is_a_hosts() {
    let a = api(None);
    let auth = bearer();
    let add = "/api/v1/services/web/backends";
    for bad in ["nope", "ff:ff:ff:ff:ff:ff", "00:00:00:00:00:00"] {
        let body = serde_json::json!({ "address": "10.0.0.9", "mac": bad }).to_string();
        let (status, text) = call(a.addr, "POST", add, Some(&auth), &body);
        assert_eq!(status, 400, "{bad}: {text}");
        assert!(text.contains("mac: "), "{text}");
    }
    let body = serde_json::json!({ "address": "10.0.0.9", "mac": "02:00:00:00:00:09" }).to_string();
    let (status, text) = call(a.addr, "POST", add, Some(&auth), &body);
    assert_eq!(status, 201, "{text}");
}

/// A new backend's capacity (DWRS's and MRBS's reference) is a positive number, as in
/// a file, and reaches the balancer.
#[test]
fn a_new_backends_capacity_is_positive_and_reaches_the_balancer() {
    let a = api(None);
    let auth = bearer();
    let add = "/api/v1/services/web/backends";
    // Not positive: 400; not a number: 422, as any body of the wrong shape.
    for (bad, code) in [
        (serde_json::json!(0), 400),
        (serde_json::json!(-5.5), 400),
        (serde_json::json!("fast"), 422),
    ] {
        let body = serde_json::json!({ "address": "10.0.0.9", "capacity_rps": bad }).to_string();
        let (status, text) = call(a.addr, "POST", add, Some(&auth), &body);
        assert_eq!(status, code, "{bad}: {text}");
        assert!(text.contains("capacity_rps"), "{text}");
    }
    let body = serde_json::json!({ "address": "10.0.0.9", "capacity_rps": 250.5 }).to_string();
    let (status, text) = call(a.addr, "POST", add, Some(&auth), &body);
    assert_eq!(status, 201, "{text}");
    let core = a.handle.lock();
    let b = core.controller.services()[0]
        .backends
        .iter()
        .find(|b| b.address == std::net::Ipv4Addr::new(10, 0, 0, 9))
        .expect("the new backend");
    assert_eq!(b.capacity_rps, Some(250.5));
}

/// The config file `CONFIG` in a scratch directory.
fn config_file(name: &str) -> (ScratchDir, PathBuf) {
    let dir = ScratchDir::new(&format!("api-unit-{name}")).expect("temp dir");
    let path = dir.join("flowgate.toml");
    std::fs::write(&path, CONFIG).expect("write config");
    (dir, path)
}

#[test]
fn a_reload_says_which_api_changes_the_file_put_back() {
    let (_dir, path) = config_file("discarded");
    let a = api(Some(path.clone()));
    let auth = bearer();
    let web = "/api/v1/services/web";
    for (method, route, body) in [
        ("POST", "/backends", "{\"address\":\"10.0.0.9\"}"),
        ("DELETE", "/backends/10.0.0.3", ""),
        ("PUT", "/backends/10.0.0.2/weight", "{\"weight\":7}"),
        ("PUT", "/algorithm", "{\"algorithm\":\"least-connections\"}"),
        ("POST", "/backends/10.0.0.2/drain", ""),
    ] {
        let (status, text) = call(a.addr, method, &format!("{web}{route}"), Some(&auth), body);
        assert!(status < 300, "{method} {route}: {text}");
    }
    let (status, text) = call(a.addr, "POST", "/api/v1/reload", Some(&auth), "");
    assert_eq!(status, 200, "{text}");
    let report: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(
        report["discarded"],
        serde_json::json!([
            "web: algorithm least-connections (set through the API) is round-robin again",
            "web: backend 10.0.0.2 weight 7 (set through the API) is 1 again",
            "web: backend 10.0.0.9 (added through the API) is removed",
            "web: backend 10.0.0.3 (removed through the API) is back",
        ]),
        "{text}"
    );
    // A second reload has nothing left to put back.
    let (_, text) = call(a.addr, "POST", "/api/v1/reload", Some(&auth), "");
    let report: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(report["discarded"], serde_json::json!([]), "{text}");
}

/// A reload reads the file only once it is the one reload running: one that waited for
/// another applies the file as it is when its turn comes, not as it was when it was asked.
#[test]
fn a_reload_reads_the_file_in_its_turn() {
    let (_dir, path) = config_file("turns");
    let a = api(Some(path.clone()));
    let running = a.handle.reloads.lock().unwrap_or_else(|e| e.into_inner());
    let handle = a.handle.clone();
    let waiting = std::thread::spawn(move || crate::runtime::reload::reload_from_file(&handle));
    std::thread::sleep(std::time::Duration::from_millis(100));
    let newer = CONFIG.replace("name = \"web\"", "name = \"web2\"");
    std::fs::write(&path, newer).expect("write config");
    drop(running);
    let report = waiting.join().expect("no panic").expect("reloaded");
    assert_eq!(report.services, 1);
    let core = a.handle.lock();
    assert_eq!(core.controller.services()[0].cfg.name, "web2");
}
