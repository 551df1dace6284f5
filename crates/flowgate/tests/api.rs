//! The HTTP API: in-process tests (a router over a real `Controller`, no OVS, bound to
//! 127.0.0.1:0) for every endpoint, including unauthorised, malformed and oversized calls,
//! the OpenAPI document against the router, the Prometheus output against a strict checker,
//! `flowgate ctl`, and one end-to-end test on real Open vSwitch.

#![allow(clippy::unwrap_used)]

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use flowgate::runtime::Handle;
use flowgate_core::service::BackendId;
use flowgate_core::{Config, Controller};
use flowgate_testbed::ScratchDir;
use serde_json::{Value, json};
use support::dechunk;

const TOKEN: &str = "test-token-0123456789";

fn config_text(token: Option<&str>, extra_backend: bool) -> String {
    let mut c = String::from("[api]\nlisten = \"127.0.0.1:0\"\n");
    if let Some(t) = token {
        c += &format!("token = \"{t}\"\n");
    }
    c += "\n[[service]]\nname = \"web\"\nvip = \"10.0.0.100\"\nport = 80\nalgorithm = \"round-robin\"\n[service.health]\nkind = \"none\"\n";
    c += "\n[[service.backend]]\naddress = \"10.0.0.2\"\n\n[[service.backend]]\naddress = \"10.0.0.3\"\nweight = 2\n";
    if extra_backend {
        c += "\n[[service.backend]]\naddress = \"10.0.0.9\"\n";
    }
    c
}

/// A server over a controller with the given config, its config file written to a temp dir.
struct Server {
    addr: SocketAddr,
    handle: Handle,
    path: PathBuf,
    _rt: tokio::runtime::Runtime,
    _dir: ScratchDir,
}

fn server(name: &str, token: Option<&str>) -> Server {
    server_with(name, &config_text(token, false))
}

/// A server over a controller configured by `text`.
fn server_with(name: &str, text: &str) -> Server {
    let dir = ScratchDir::new(&format!("api-{name}")).expect("temp dir");
    let path = dir.join("flowgate.toml");
    std::fs::write(&path, text).expect("write config");
    // Not from the environment: the tests decide whether there is a token.
    let config = Config::from_toml(text, &|_| None).expect("valid config");
    server_over(dir, path, Controller::new(&config), config)
}

/// A server over `controller`, configured by `text`.
fn server_with_controller(name: &str, text: &str, controller: Controller) -> Server {
    let dir = ScratchDir::new(&format!("api-{name}")).expect("temp dir");
    let path = dir.join("flowgate.toml");
    std::fs::write(&path, text).expect("write config");
    let config = Config::from_toml(text, &|_| None).expect("valid config");
    server_over(dir, path, controller, config)
}

fn server_over(dir: ScratchDir, path: PathBuf, controller: Controller, config: Config) -> Server {
    let handle = Handle::new(controller, config, Some(path.clone()));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let app = flowgate::api::router(handle.clone());
    rt.spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Server {
        addr,
        handle,
        path,
        _rt: rt,
        _dir: dir,
    }
}

struct Resp {
    status: u16,
    head: String,
    body: String,
}

impl Resp {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {} {}", self.status, self.body))
    }
    fn header(&self, name: &str) -> Option<String> {
        self.head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_string())
        })
    }
}

/// A raw HTTP/1.1 request (so tests can send exactly what they want).
fn raw(addr: SocketAddr, req: &[u8]) -> Resp {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).ok();
    s.write_all(req).expect("send");
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf).to_string();
    let status = text.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_string()
    };
    Resp {
        status,
        head: head.to_string(),
        body,
    }
}

fn req(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    content_type: Option<&str>,
    body: &str,
) -> Resp {
    let mut r = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    if let Some(t) = token {
        r += &format!("Authorization: Bearer {t}\r\n");
    }
    if let Some(ct) = content_type {
        r += &format!("Content-Type: {ct}\r\n");
    }
    r += &format!("Content-Length: {}\r\n\r\n{body}", body.len());
    raw(addr, r.as_bytes())
}

fn get(addr: SocketAddr, path: &str) -> Resp {
    req(addr, "GET", path, None, None, "")
}

fn post_json(addr: SocketAddr, method: &str, path: &str, body: &Value) -> Resp {
    req(
        addr,
        method,
        path,
        Some(TOKEN),
        Some("application/json"),
        &body.to_string(),
    )
}

fn assert_json_error(r: &Resp, status: u16) -> String {
    assert_eq!(r.status, status, "{} {}", r.head, r.body);
    assert!(
        r.header("content-type")
            .is_some_and(|c| c.starts_with("application/json")),
        "JSON error: {}",
        r.head
    );
    let v = r.json();
    let msg = v["error"]
        .as_str()
        .unwrap_or_else(|| panic!("an error field: {v}"));
    assert!(!msg.is_empty());
    msg.to_string()
}

// ----- reads ----------------------------------------------------------------------------------

#[test]
fn reads_services_backends_switches_events_status() {
    let s = server("reads", Some(TOKEN));
    let v = get(s.addr, "/api/v1/services").json();
    assert_eq!(v[0]["name"], "web");
    assert_eq!(v[0]["vip"], "10.0.0.100");
    assert_eq!(v[0]["algorithm"], "round-robin");
    assert_eq!(v[0]["panic"], false);
    let b = &v[0]["backends"][1];
    for field in [
        "address",
        "weight",
        "effective_weight",
        "healthy",
        "state",
        "draining",
        "eligible",
        "ejected",
        "ejected_by",
        "outcomes_last_interval",
        "success_rate_last_interval",
        "connections_answered_total",
        "connections_unanswered_total",
        "located",
        "active_connections",
        "connections_total",
        "picks_since_refresh",
        "rps",
        "measured_rps",
        "reported_rps",
        "response_time_ms",
        "cpu",
        "metrics_fresh",
        "gap",
    ] {
        assert!(b.get(field).is_some(), "backend has {field}: {b}");
    }
    assert_eq!(b["address"], "10.0.0.3");
    assert_eq!(b["weight"], 2);
    assert_eq!(b["state"], "active");
    assert_eq!(b["ejected"], false);
    assert_eq!(b["ejected_by"], Value::Null);
    assert_eq!(b["outcomes_last_interval"], 0);
    assert_eq!(b["success_rate_last_interval"], Value::Null);
    assert_eq!(
        v[0]["outlier_success_rate"],
        Value::Null,
        "two backends are under the success-rate detector's minimum: {}",
        v[0]
    );
    assert_eq!(v[0]["counters"]["ejections_by"]["success_rate"], 0);
    assert_eq!(
        b["gap"]["mode"], "off",
        "no overload control configured: {b}"
    );

    assert_eq!(get(s.addr, "/api/v1/services/web").json()["name"], "web");
    assert_eq!(
        get(s.addr, "/api/v1/services/web/backends").json()[0]["address"],
        "10.0.0.2"
    );
    assert_eq!(
        get(s.addr, "/api/v1/services/web/backends/10.0.0.3").json()["weight"],
        2
    );
    assert_json_error(&get(s.addr, "/api/v1/services/nope"), 404);
    assert_json_error(&get(s.addr, "/api/v1/services/web/backends/10.9.9.9"), 404);
    assert_json_error(&get(s.addr, "/api/v1/services/web/backends/not-an-ip"), 400);

    assert_eq!(get(s.addr, "/api/v1/switches").json(), json!([]));
    let events = get(s.addr, "/api/v1/events").json();
    assert!(events.is_array());
    let st = get(s.addr, "/api/v1/status").json();
    assert_eq!(st["mutations_enabled"], true);
    assert_eq!(st["services"], 1);
    assert_json_error(&get(s.addr, "/api/v1/events?since_ms=abc"), 400);
}

#[test]
fn connections_page_and_counts() {
    let s = server("conns", None);
    let v = get(s.addr, "/api/v1/connections").json();
    assert_eq!(v["total"], 0);
    assert_eq!(v["items"], json!([]));
    assert_eq!(v["next"], Value::Null);
    let per: Vec<_> = v["per_backend"].as_array().unwrap().clone();
    assert_eq!(per.len(), 2);
    assert_eq!(per[0]["service"], "web");
    assert_eq!(per[0]["connections"], 0);
    assert_json_error(&get(s.addr, "/api/v1/connections?limit=0"), 400);
    assert_json_error(&get(s.addr, "/api/v1/connections?limit=1001"), 400);
    assert_json_error(&get(s.addr, "/api/v1/connections?limit=x"), 400);
    assert_json_error(&get(s.addr, "/api/v1/connections?cursor=garbage"), 400);
    assert_json_error(&get(s.addr, "/api/v1/connections?cursor=-1"), 400);
    // The key cursor of earlier versions is refused, not taken for the first page.
    assert_json_error(
        &get(
            s.addr,
            "/api/v1/connections?after=10.0.0.1:40000%3E10.0.0.100:80",
        ),
        400,
    );
    assert_json_error(&get(s.addr, "/api/v1/connections?bogus=1"), 400);
    // A cursor past the table's end (the table shrank meanwhile) starts at its end.
    let ok = get(s.addr, "/api/v1/connections?limit=1000&cursor=123456");
    assert_eq!(ok.status, 200, "{}", ok.body);
    assert_eq!(ok.json()["items"], json!([]));
}

/// A controller holding `n` connections of clients 10.128.x.y, spread round-robin over
/// backends 10.0.0.2 and 10.0.0.3, its configuration, and the rule whose end ends each
/// connection.
fn controller_with_connections(
    n: u32,
) -> (flowgate_core::testkit::sim::Sim, String, Vec<ofp::FlowMod>) {
    use flowgate_core::testkit::sim::{Sim, arp_request, ip};

    let text = format!(
        "[api]\nlisten = \"127.0.0.1:0\"\ntoken = \"{TOKEN}\"\n\n\
        [controller]\nreconnect_grace_ms = 0\n\n\
        [[service]]\nname = \"web\"\nvip = \"10.0.0.100\"\nvirtual_mac = \"02:66:67:00:00:01\"\n\
        port = 80\nalgorithm = \"round-robin\"\n[service.health]\nkind = \"none\"\n\n\
        [[service.backend]]\naddress = \"10.0.0.2\"\n\n[[service.backend]]\naddress = \"10.0.0.3\"\n"
    );
    let hosts = [("h1", 1, 1), ("h2", 1, 2), ("h3", 1, 3)];
    let mut sim = Sim::new(&text, &[(1, 3)], &[], &hosts);
    for i in 1..=3u8 {
        sim.send(&format!("h{i}"), &arp_request(i, ip(9)));
    }
    let rules = open_connections(&mut sim.c, sim.now, 0..n);
    (sim, text, rules)
}

/// Connections from clients `10.128.0.0 + k / 256`, port `1024 + k % 256`, for each `k`;
/// the rule of each whose FLOW_REMOVED ends it (the forward rule at the client's edge).
fn open_connections(
    c: &mut Controller,
    now: Instant,
    ks: std::ops::Range<u32>,
) -> Vec<ofp::FlowMod> {
    use flowgate_core::Outbox;
    use flowgate_core::cookie::{self, RuleKind};
    use flowgate_core::testkit::sim::{SYN, VIP, VMAC, mac, tcp};
    use std::net::Ipv4Addr;

    let mut out = Outbox::new();
    let mut ending = Vec::new();
    for k in ks {
        let client = (
            Ipv4Addr::from(0x0a80_0000 + (k >> 8)),
            1024 + (k & 0xff) as u16,
        );
        let pi = ofp::PacketIn::table_miss(1, tcp(mac(1), VMAC, client, (VIP, 80), SYN));
        c.handle_message(now, 1, &ofp::Message::PacketIn(pi), &mut out);
        ending.extend(out.drain().filter_map(|(_, m)| match m {
            ofp::Message::FlowMod(fm)
                if cookie::kind_of(fm.cookie) == Some(RuleKind::Conn)
                    && fm.cookie & cookie::conn::ACCOUNTING != 0 =>
            {
                Some(fm)
            }
            _ => None,
        }));
    }
    ending
}

/// The switch reports `rule` gone, idle: its connection ends.
fn rule_ended(c: &mut Controller, now: Instant, rule: &ofp::FlowMod) {
    let fr = ofp::FlowRemoved {
        cookie: rule.cookie,
        priority: rule.priority,
        reason: ofp::FlowRemovedReason::IdleTimeout,
        table_id: rule.table_id,
        duration_sec: 31,
        duration_nsec: 0,
        idle_timeout: rule.idle_timeout,
        hard_timeout: 0,
        packet_count: 10,
        byte_count: 1000,
        match_: rule.match_.clone(),
    };
    let mut out = flowgate_core::Outbox::new();
    c.handle_message(now, 1, &ofp::Message::FlowRemoved(fr), &mut out);
}

/// One page of the listing at `cursor`: its keys with their backends, and its `next`.
fn connections_page(
    addr: SocketAddr,
    cursor: &str,
) -> (Value, Vec<(String, String)>, Option<String>) {
    let v = get(
        addr,
        &format!("/api/v1/connections?limit=1000&cursor={cursor}"),
    )
    .json();
    let items = v["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            (
                i["key"].as_str().unwrap().to_string(),
                i["backend"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let next = v["next"].as_str().map(str::to_string);
    (v, items, next)
}

/// Ten thousand connections, paged through a thousand at a time: every connection once,
/// and counted per backend on every page.
#[test]
fn ten_thousand_connections_are_paged_through_each_once() {
    const N: u32 = 10_000;
    let (sim, text, _) = controller_with_connections(N);
    assert_eq!(sim.c.connections().len(), N as usize);
    let s = server_with_controller("conns-paged", &text, sim.c);

    let mut seen = BTreeSet::new();
    let mut cursor = String::new();
    let mut pages = 0;
    loop {
        let (v, items, next) = connections_page(s.addr, &cursor);
        assert_eq!(v["total"], N);
        let per: BTreeMap<String, u64> = v["per_backend"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| {
                (
                    b["backend"].as_str().unwrap().to_string(),
                    b["connections"].as_u64().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            per,
            BTreeMap::from([("10.0.0.2".into(), 5_000), ("10.0.0.3".into(), 5_000)]),
            "round-robin over two"
        );
        assert_eq!(items.len(), 1000);
        for (key, _) in items {
            assert!(seen.insert(key), "listed once");
        }
        pages += 1;
        match next {
            Some(next) => cursor = next,
            None => break,
        }
        assert!(pages <= 10, "ten pages of a thousand");
    }
    assert_eq!(pages, 10);
    assert_eq!(seen.len(), N as usize, "every connection listed");
}

/// While a listing pages through, half the table ends (every other connection, all of
/// backend 10.0.0.2's, so the rest move about in the store) and new connections open:
/// every connection open from its first page to its last is still listed.
#[test]
fn a_listing_lists_every_connection_open_throughout_while_others_end_and_open() {
    const N: u32 = 10_000;
    let (sim, text, rules) = controller_with_connections(N);
    let now = sim.now;
    let throughout: BTreeSet<String> = sim
        .c
        .connections()
        .iter()
        .filter(|(_, c)| c.backend == BackendId(1))
        .map(|(k, _)| {
            format!(
                "{}:{}>{}:{}",
                k.client, k.client_port, k.service_addr, k.service_port
            )
        })
        .collect();
    assert_eq!(throughout.len(), 5_000);
    let s = server_with_controller("conns-churn", &text, sim.c);

    let mut seen = BTreeSet::new();
    let mut cursor = String::new();
    let mut pages = 0;
    loop {
        let (_, items, next) = connections_page(s.addr, &cursor);
        seen.extend(items.into_iter().map(|(k, _)| k));
        pages += 1;
        if pages == 3 {
            let mut core = s.handle.lock();
            let c = &mut core.controller;
            for rule in rules.iter().step_by(2) {
                rule_ended(c, now, rule);
            }
            assert!(
                c.connections()
                    .iter()
                    .all(|(_, x)| x.backend == BackendId(1)),
                "10.0.0.2's connections ended, 10.0.0.3's open"
            );
            open_connections(c, now, N..N + 2_000);
            assert_eq!(c.connections().len(), 7_000);
        }
        match next {
            Some(next) => cursor = next,
            None => break,
        }
        assert!(pages <= 10, "at most the pages the table had at the start");
    }
    let missed: Vec<_> = throughout.difference(&seen).collect();
    assert!(
        missed.is_empty(),
        "{} of the connections open throughout were not listed, such as {:?}",
        missed.len(),
        missed.first()
    );
}

/// A backend removed through the API takes none of its open connections with it: the
/// answer says how many it had, and the listing still lists them, going to it, out of the
/// pool, while the backend that stays counts its own.
#[test]
fn a_removed_backends_connections_are_listed_out_of_the_pool() {
    let (sim, text, rules) = controller_with_connections(10);
    let now = sim.now;
    let s = server_with_controller("conns-removed", &text, sim.c);
    let r = req(
        s.addr,
        "DELETE",
        "/api/v1/services/web/backends/10.0.0.2",
        Some(TOKEN),
        None,
        "",
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["open_connections"], 5, "{}", r.body);
    let (page, _, _) = connections_page(s.addr, "");
    assert_eq!(page["total"], 10, "none dropped: {page}");
    let mut by_backend = BTreeMap::new();
    for item in page["items"].as_array().unwrap() {
        let key = (
            item["backend"].as_str().unwrap().to_string(),
            item["backend_in_pool"].as_bool().unwrap(),
        );
        *by_backend.entry(key).or_insert(0) += 1;
    }
    assert_eq!(
        by_backend,
        BTreeMap::from([
            (("10.0.0.2".to_string(), false), 5),
            (("10.0.0.3".to_string(), true), 5)
        ])
    );
    assert_eq!(
        page["per_backend"],
        json!([{ "service": "web", "backend": "10.0.0.3", "connections": 5 }])
    );
    // How many are still open to it, to know when it can be taken down.
    let left_metric =
        "flowgate_left_backend_open_connections{service=\"web\",backend=\"10.0.0.2\"}";
    let svc = get(s.addr, "/api/v1/services/web").json();
    assert_eq!(
        svc["left_backends"],
        json!([{ "address": "10.0.0.2", "open_connections": 5 }])
    );
    let metrics = get(s.addr, "/metrics").body;
    assert!(metrics.contains(&format!("{left_metric} 5\n")), "{metrics}");
    // Their rules end: none is left open to it.
    {
        let mut core = s.handle.lock();
        for rule in rules.iter().step_by(2) {
            rule_ended(&mut core.controller, now, rule);
        }
        assert_eq!(core.controller.connections().len(), 5);
    }
    let svc = get(s.addr, "/api/v1/services/web").json();
    assert_eq!(svc["left_backends"], json!([]));
    assert_eq!(svc["active_connections"], 5, "10.0.0.3's, still open");
    assert!(!get(s.addr, "/metrics").body.contains(left_metric));
}

/// `flowgate ctl services` says how many of a service's connections went to another
/// backend at their client's retransmitted SYN, their own having stayed silent.
#[test]
fn ctl_services_counts_the_redispatched_connections() {
    use flowgate_core::testkit::sim::{SYN, VIP, VMAC, ip, mac, tcp};
    let (mut sim, text, _) = controller_with_connections(0);
    let syn = tcp(mac(1), VMAC, (ip(1), 45000), (VIP, 80), SYN);
    sim.send("h1", &syn);
    sim.tick(Duration::from_secs(3));
    sim.send("h1", &syn);
    assert_eq!(sim.c.services()[0].counters.redispatched, 1);
    let s = server_with_controller("ctl-redispatch", &text, sim.c);
    let (ok, out, err) = ctl(s.addr, &["services"], None);
    assert!(ok, "{err}");
    let head = out.lines().next().unwrap_or_default();
    assert!(
        head.contains("connections 2 (1 redispatched)"),
        "two decisions for the one connection: {out}"
    );
}

/// `flowgate ctl` shows a removed backend's open connections: a row of its own under its
/// service, and each connection marked as going to a removed backend.
#[test]
fn ctl_shows_a_removed_backends_open_connections() {
    let (sim, text, _) = controller_with_connections(10);
    let s = server_with_controller("ctl-removed", &text, sim.c);
    let (ok, _, err) = ctl(s.addr, &["remove-backend", "web", "10.0.0.2"], Some(TOKEN));
    assert!(ok, "{err}");
    let (ok, out, err) = ctl(s.addr, &["services"], None);
    assert!(ok, "{err}");
    let row: Vec<&str> = out
        .lines()
        .find(|l| l.trim_start().starts_with("10.0.0.2 "))
        .map(|l| l.split_whitespace().collect())
        .unwrap_or_default();
    assert_eq!(row, ["10.0.0.2", "-", "-", "removed", "5"], "{out}");
    let (ok, out, err) = ctl(s.addr, &["connections"], None);
    assert!(ok, "{err}");
    assert_eq!(
        out.lines()
            .filter(|l| l.ends_with("-> 10.0.0.2 (removed)"))
            .count(),
        5,
        "{out}"
    );
    assert_eq!(
        out.lines().filter(|l| l.ends_with("-> 10.0.0.3")).count(),
        5,
        "{out}"
    );
}

// ----- changes ----------------------------------------------------------------------------------

#[test]
fn drain_undrain_weight_algorithm_add_remove() {
    let s = server("changes", Some(TOKEN));
    let a = s.addr;
    let put_weight = |v: Value| {
        post_json(
            a,
            "PUT",
            "/api/v1/services/web/backends/10.0.0.3/weight",
            &v,
        )
    };
    let put_algorithm = |v: Value| post_json(a, "PUT", "/api/v1/services/web/algorithm", &v);
    let r = post_json(
        a,
        "POST",
        "/api/v1/services/web/backends/10.0.0.2/drain",
        &json!(null),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["state"], "draining");
    assert_eq!(r.json()["draining"], true);
    assert_eq!(
        get(a, "/api/v1/services/web/backends/10.0.0.2").json()["state"],
        "draining"
    );
    // No body at all is fine for drain/undrain.
    let r = req(
        a,
        "POST",
        "/api/v1/services/web/backends/10.0.0.2/undrain",
        Some(TOKEN),
        None,
        "",
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["state"], "active");

    let r = put_weight(json!({"weight": 7}));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["weight"], 7);
    assert_json_error(&put_weight(json!({"weight": 2_000_000})), 400);
    assert_json_error(&put_weight(json!({"weight": -1})), 422);

    let r = put_algorithm(json!({"algorithm": "least-connections"}));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["algorithm"], "least-connections");
    // ISSLM needs a threshold: refused without, accepted with; then only the threshold.
    assert_json_error(&put_algorithm(json!({"algorithm": "isslm"})), 400);
    let r = put_algorithm(json!({"algorithm": "isslm", "threshold_rps": 50.0}));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["threshold_rps"], 50.0);
    let r = put_algorithm(json!({"threshold_rps": 80.0}));
    assert_eq!(r.json()["algorithm"], "isslm");
    assert_eq!(r.json()["threshold_rps"], 80.0);
    let msg = assert_json_error(&put_algorithm(json!({"algorithm": "fastest"})), 400);
    assert!(
        msg.contains("round-robin"),
        "lists the known algorithms: {msg}"
    );
    assert_json_error(&put_algorithm(json!({"threshold_rps": -3})), 400);
    assert_json_error(
        &post_json(a, "PUT", "/api/v1/services/nope/algorithm", &json!({})),
        404,
    );

    let r = post_json(
        a,
        "POST",
        "/api/v1/services/web/backends",
        &json!({"address": "10.0.0.7", "weight": 3}),
    );
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(r.json()["address"], "10.0.0.7");
    assert_json_error(
        &post_json(
            a,
            "POST",
            "/api/v1/services/web/backends",
            &json!({"address": "10.0.0.7"}),
        ),
        409,
    );
    assert_json_error(
        &post_json(
            a,
            "POST",
            "/api/v1/services/web/backends",
            &json!({"address": "10.0.0.100"}),
        ),
        409,
    );
    assert_json_error(
        &post_json(
            a,
            "POST",
            "/api/v1/services/web/backends",
            &json!({"address": "nope"}),
        ),
        400,
    );
    assert_json_error(
        &post_json(
            a,
            "POST",
            "/api/v1/services/web/backends",
            &json!({"address": "224.0.0.1"}),
        ),
        400,
    );
    assert_eq!(
        get(a, "/api/v1/services/web/backends")
            .json()
            .as_array()
            .unwrap()
            .len(),
        3
    );
    let r = req(
        a,
        "DELETE",
        "/api/v1/services/web/backends/10.0.0.7",
        Some(TOKEN),
        None,
        "",
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        get(a, "/api/v1/services/web/backends")
            .json()
            .as_array()
            .unwrap()
            .len(),
        2
    );
    assert_json_error(
        &req(
            a,
            "DELETE",
            "/api/v1/services/web/backends/10.0.0.7",
            Some(TOKEN),
            None,
            "",
        ),
        404,
    );

    let kinds: Vec<String> = get(a, "/api/v1/events")
        .json()
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap().to_string())
        .collect();
    assert!(
        kinds.contains(&"admin".to_string()) && kinds.contains(&"algorithm".to_string()),
        "{kinds:?}"
    );
}

/// A backend added through the API obeys the rules a configuration file's backends do,
/// across services too: no other service's VIP, and no address and port that another
/// service intercepts (these were once accepted). A refused addition changes nothing; and
/// the file written from what the API then reports is one the controller takes back.
#[test]
fn pool_changes_refuse_what_a_configuration_would() {
    let text = format!(
        "[api]\nlisten = \"127.0.0.1:0\"\ntoken = \"{TOKEN}\"\n\
         [[service]]\nname = \"web\"\nvip = \"10.0.0.100\"\nport = 80\n\
         [[service.backend]]\naddress = \"10.0.0.2\"\n\
         [[service]]\nname = \"api\"\nvip = \"10.0.0.200\"\nport = 80\n\
         [[service.backend]]\naddress = \"10.0.0.3\"\n\
         [[service]]\nname = \"ssh\"\nport = 22\n\
         [[service.backend]]\naddress = \"10.0.0.5\"\n\
         [[service]]\nname = \"ssh-b\"\nport = 22\n\
         [[service.backend]]\naddress = \"10.0.0.6\"\n"
    );
    let s = server_with("pool-rules", &text);
    let a = s.addr;
    let add = |service: &str, address: &str| {
        post_json(
            a,
            "POST",
            &format!("/api/v1/services/{service}/backends"),
            &json!({ "address": address }),
        )
    };
    let pools = || -> Vec<Vec<String>> {
        ["web", "api", "ssh", "ssh-b"]
            .iter()
            .map(|svc| {
                get(a, &format!("/api/v1/services/{svc}/backends"))
                    .json()
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|b| b["address"].as_str().unwrap().to_string())
                    .collect()
            })
            .collect()
    };
    let before = pools();
    let msg = assert_json_error(&add("web", "10.0.0.200"), 409);
    assert!(msg.contains("VIP of service \"api\""), "{msg}");
    let msg = assert_json_error(&add("ssh-b", "10.0.0.5"), 409);
    assert!(
        msg.contains("10.0.0.5:22 is intercepted by service \"ssh\""),
        "{msg}"
    );
    assert_json_error(&add("api", "10.0.0.3"), 409);
    assert_eq!(pools(), before, "refusals change nothing");
    // What a file may hold, the API may add: a VIP service may share another's backend.
    assert_eq!(add("web", "10.0.0.5").status, 201);
    assert_eq!(add("ssh-b", "10.0.0.7").status, 201);
    let after = pools();
    assert_eq!(after[0], ["10.0.0.2", "10.0.0.5"]);
    assert_eq!(after[3], ["10.0.0.6", "10.0.0.7"]);
    let mut file = text.clone();
    for (svc, extra) in [("web", "10.0.0.5"), ("ssh-b", "10.0.0.7")] {
        let at = file.find(&format!("name = \"{svc}\"")).unwrap();
        let end = file[at..]
            .find("[[service]]")
            .map_or(file.len(), |e| at + e);
        file.insert_str(
            end,
            &format!("[[service.backend]]\naddress = \"{extra}\"\n"),
        );
    }
    Config::from_toml(&file, &|_| None).expect("the pools the API made are a valid file");
}

/// A reload applies what it can and names what it cannot: a changed `[cluster]` section
/// (the cluster task runs with the one it started with) was applied silently by neither.
#[test]
fn a_reload_names_the_settings_that_need_a_restart() {
    let s = server("restart-needed", Some(TOKEN));
    let text = config_text(Some(TOKEN), false);
    let reload = |text: &str| {
        std::fs::write(&s.path, text).expect("write config");
        let r = post_json(s.addr, "POST", "/api/v1/reload", &json!(null));
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()["restart_needed"].clone()
    };
    assert_eq!(reload(&text), json!([]), "nothing changed");
    let domain = "[cluster]\nrole = \"domain\"\nname = \"t\"\ninstance = \"d1a\"\n\
                  domain = \"d1\"\ndpids = [\"0000000000000001\"]\netcd = [\"memory:\"]\n";
    assert_eq!(reload(&format!("{text}{domain}")), json!(["cluster"]));
    // Host-table bounds apply at once.
    let bounds = "[controller]\nmax_hosts_per_port = 9\n";
    assert_eq!(reload(&format!("{text}{bounds}")), json!([]));
    // The connection table is built at start.
    let table = "[controller]\npreallocate_connections = 1000\n";
    assert_eq!(
        reload(&format!("{text}{table}")),
        json!(["controller.preallocate_connections"])
    );
    // Each reload compares its file with what runs (the table built at start).
    assert_eq!(
        reload(&format!("{text}{table}")),
        json!(["controller.preallocate_connections"])
    );
    assert_eq!(reload(&text), json!([]));
}

#[test]
fn reload_validates_first_and_lists_every_error() {
    let s = server("reload", Some(TOKEN));
    let a = s.addr;
    // A good file with a third backend: applied.
    std::fs::write(&s.path, config_text(Some(TOKEN), true)).unwrap();
    let r = post_json(a, "POST", "/api/v1/reload", &json!(null));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["ok"], true);
    assert_eq!(
        get(a, "/api/v1/services/web/backends")
            .json()
            .as_array()
            .unwrap()
            .len(),
        3
    );

    // A bad file: three errors, all listed with their paths; nothing changes.
    let before = get(a, "/api/v1/services").json();
    let bad = config_text(Some(TOKEN), true)
        .replace(
            "algorithm = \"round-robin\"",
            "algorithm = \"fastest\"\nbogus_key = 1",
        )
        .replace("address = \"10.0.0.9\"", "address = \"10.0.0.300\"");
    std::fs::write(&s.path, bad).unwrap();
    let r = post_json(a, "POST", "/api/v1/reload", &json!(null));
    assert_eq!(r.status, 422, "{}", r.body);
    let v = r.json();
    assert!(
        v["error"].as_str().unwrap().contains("nothing was changed"),
        "{v}"
    );
    let paths: BTreeSet<String> = v["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap().to_string())
        .collect();
    for p in [
        "service[0].algorithm",
        "service[0].bogus_key",
        "service[0].backend[2].address",
    ] {
        assert!(paths.contains(p), "{p} listed: {v}");
    }
    assert_eq!(
        get(a, "/api/v1/services").json(),
        before,
        "a bad file changes nothing"
    );

    // Unreadable: a 5xx with the reason; nothing changes either.
    std::fs::remove_file(&s.path).unwrap();
    assert_json_error(&post_json(a, "POST", "/api/v1/reload", &json!(null)), 500);
    assert_eq!(get(a, "/api/v1/services").json(), before);
}

// ----- security ------------------------------------------------------------------------------

#[test]
fn mutations_need_the_token() {
    let s = server("auth", Some(TOKEN));
    let a = s.addr;
    let path = "/api/v1/services/web/backends/10.0.0.2/drain";
    let r = req(a, "POST", path, None, None, "");
    let msg = assert_json_error(&r, 401);
    assert!(msg.contains("Bearer"), "{msg}");
    assert!(r.header("www-authenticate").is_some());
    assert_json_error(
        &req(a, "POST", path, Some("test-token-0123456780"), None, ""),
        401,
    );
    assert_json_error(&req(a, "POST", path, Some("short"), None, ""), 401);
    let r = raw(a, format!("POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Basic {TOKEN}\r\nContent-Length: 0\r\n\r\n").as_bytes());
    assert_json_error(&r, 401);
    assert_eq!(
        get(a, "/api/v1/services/web/backends/10.0.0.2").json()["state"],
        "active"
    );
    // Every mutating route refuses without the token, and reads need none.
    for r in flowgate::api::ROUTES {
        if r.op == flowgate::api::Op::Stream {
            continue; // never ends; covered by stream_sends_snapshots
        }
        let path = r
            .path
            .replace("{service}", "web")
            .replace("{backend}", "10.0.0.2");
        let resp = req(
            a,
            r.verb.as_str(),
            &path,
            None,
            Some("application/json"),
            "{}",
        );
        if r.mutating {
            assert_json_error(&resp, 401);
        } else {
            assert_eq!(
                resp.status,
                200,
                "{} {path}: {}",
                r.verb.as_str(),
                resp.body
            );
        }
    }
    assert_eq!(req(a, "POST", path, Some(TOKEN), None, "").status, 200);
}

#[test]
fn without_a_configured_token_mutations_are_forbidden() {
    let s = server("notoken", None);
    let r = req(
        s.addr,
        "POST",
        "/api/v1/services/web/backends/10.0.0.2/drain",
        Some(TOKEN),
        None,
        "",
    );
    let msg = assert_json_error(&r, 403);
    assert!(msg.contains("no API token"), "{msg}");
    assert_json_error(&req(s.addr, "POST", "/api/v1/reload", None, None, ""), 403);
    assert_eq!(
        get(s.addr, "/api/v1/status").json()["mutations_enabled"],
        false
    );
}

#[test]
fn malformed_and_oversized_input_get_json_4xx() {
    let s = server("malformed", Some(TOKEN));
    let a = s.addr;
    let w = "/api/v1/services/web/backends/10.0.0.3/weight";
    // Bad JSON, wrong content type, missing content type, wrong shape, unknown field.
    assert_json_error(
        &req(
            a,
            "PUT",
            w,
            Some(TOKEN),
            Some("application/json"),
            "{\"weight\": ",
        ),
        400,
    );
    assert_json_error(
        &req(
            a,
            "PUT",
            w,
            Some(TOKEN),
            Some("text/plain"),
            "{\"weight\": 3}",
        ),
        415,
    );
    assert_json_error(&req(a, "PUT", w, Some(TOKEN), None, "{\"weight\": 3}"), 415);
    assert_json_error(
        &req(
            a,
            "PUT",
            w,
            Some(TOKEN),
            Some("application/json"),
            "{\"weight\": \"3\"}",
        ),
        422,
    );
    assert_json_error(
        &req(
            a,
            "PUT",
            w,
            Some(TOKEN),
            Some("application/json"),
            "{\"weight\": 3, \"x\": 1}",
        ),
        422,
    );
    assert_json_error(
        &req(a, "PUT", w, Some(TOKEN), Some("application/json"), "[]"),
        422,
    );
    // Unknown path and method.
    let msg = assert_json_error(&get(a, "/api/v1/nope"), 404);
    assert!(msg.contains("no such endpoint"));
    assert_json_error(&get(a, "/nope"), 404);
    let r = req(a, "DELETE", "/api/v1/services", Some(TOKEN), None, "");
    assert_json_error(&r, 405);
    assert_json_error(&req(a, "PATCH", w, Some(TOKEN), None, ""), 405);
    assert_json_error(&req(a, "GET", "/api/v1/reload", None, None, ""), 405);
    // Oversized: declared, and chunked (no Content-Length).
    let big = format!("{{\"weight\": 3, \"pad\": \"{}\"}}", "x".repeat(70 * 1024));
    let msg = assert_json_error(
        &req(a, "PUT", w, Some(TOKEN), Some("application/json"), &big),
        413,
    );
    assert!(msg.contains("65536"), "{msg}");
    let mut chunked = format!(
        "PUT {w} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    );
    chunked += &format!("{:x}\r\n{big}\r\n0\r\n\r\n", big.len());
    assert_json_error(&raw(a, chunked.as_bytes()), 413);
    // Even unauthenticated, an oversized body is refused before anything reads it.
    assert_json_error(
        &req(
            a,
            "POST",
            "/api/v1/reload",
            None,
            Some("application/json"),
            &big,
        ),
        413,
    );
    assert_eq!(
        get(a, "/api/v1/services/web/backends/10.0.0.3").json()["weight"],
        2
    );
}

// ----- OpenAPI ---------------------------------------------------------------------------------

#[test]
fn openapi_document_matches_the_router() {
    let s = server("openapi", Some(TOKEN));
    let a = s.addr;
    let doc = get(a, "/api/v1/openapi.json").json();
    assert!(
        doc["openapi"].as_str().unwrap().starts_with("3."),
        "{}",
        doc["openapi"]
    );
    assert!(doc["info"]["title"].is_string() && doc["info"]["version"].is_string());
    let paths = doc["paths"].as_object().expect("paths");
    let mut documented = BTreeSet::new();
    for (path, item) in paths {
        assert!(path.starts_with("/api/v1/"), "{path}");
        for (method, op) in item.as_object().unwrap() {
            documented.insert((method.to_uppercase(), path.clone()));
            assert!(op["responses"].is_object(), "{method} {path} has responses");
            assert!(op["operationId"].is_string());
            // Every $ref resolves.
            for r in refs(op) {
                let name = r.trim_start_matches("#/components/schemas/");
                assert!(
                    doc["components"]["schemas"][name].is_object(),
                    "{r} resolves"
                );
            }
            // Path parameters are declared.
            for seg in path.split('/').filter(|s| s.starts_with('{')) {
                let n = seg.trim_matches(|c| c == '{' || c == '}');
                assert!(
                    op["parameters"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .any(|p| p["name"] == n && p["in"] == "path"),
                    "{method} {path} declares {n}"
                );
            }
            // Routed: a request to it does not 404/405 (a fresh server: some calls change state).
            let fresh = server(&format!("openapi-{}", documented.len()), Some(TOKEN));
            let concrete = path
                .replace("{service}", "web")
                .replace("{backend}", "10.0.0.2");
            let body = match op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
                .as_str()
            {
                Some(r) if r.ends_with("WeightChange") => json!({"weight": 1}).to_string(),
                Some(r) if r.ends_with("NewBackend") => json!({"address": "10.0.0.8"}).to_string(),
                Some(_) => json!({}).to_string(),
                None => String::new(),
            };
            let resp = if op["operationId"] == "stream" {
                sse_head(fresh.addr, &concrete)
            } else {
                req(
                    fresh.addr,
                    &method.to_uppercase(),
                    &concrete,
                    Some(TOKEN),
                    Some("application/json"),
                    &body,
                )
            };
            assert!(
                resp.status != 404 && resp.status != 405 && resp.status != 0,
                "{method} {concrete} is routed: {} {}",
                resp.status,
                resp.body
            );
            assert!(
                resp.status < 400,
                "{method} {concrete} works as documented: {} {}",
                resp.status,
                resp.body
            );
        }
    }
    // Every routed /api/v1 path+method is documented (the router is built from ROUTES).
    let routed: BTreeSet<(String, String)> = flowgate::api::ROUTES
        .iter()
        .map(|r| (r.verb.as_str().to_string(), r.path.to_string()))
        .collect();
    assert_eq!(routed, documented);
    // And methods not in the document are not routed.
    for (path, item) in paths {
        let concrete = path
            .replace("{service}", "web")
            .replace("{backend}", "10.0.0.2");
        for m in ["GET", "POST", "PUT", "DELETE"] {
            if item.get(m.to_lowercase()).is_none() {
                let r = req(a, m, &concrete, Some(TOKEN), Some("application/json"), "{}");
                assert_eq!(r.status, 405, "{m} {path}: {}", r.body);
            }
        }
    }
}

fn refs(v: &Value) -> Vec<String> {
    let mut out = Vec::new();
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                if k == "$ref" {
                    out.push(x.as_str().unwrap_or("").to_string());
                } else {
                    out.extend(refs(x));
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|x| out.extend(refs(x))),
        _ => {}
    }
    out
}

// ----- stream ----------------------------------------------------------------------------------

/// The head of an SSE response and its first event's data.
fn sse_head(addr: SocketAddr, path: &str) -> Resp {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5))).ok();
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n").as_bytes(),
    )
    .unwrap();
    let mut buf = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut chunk = [0u8; 4096];
    while Instant::now() < deadline {
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
        let t = String::from_utf8_lossy(&buf);
        if t.contains("\r\n\r\n")
            && (t.contains("data:") && t.contains("\n\n") || !t.contains("200 OK"))
        {
            let after = t.split_once("\r\n\r\n").map(|x| x.1).unwrap_or("");
            if after.contains("}\n") || !t.contains("200 OK") {
                break;
            }
        }
    }
    let text = String::from_utf8_lossy(&buf).to_string();
    let status = text.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    Resp {
        status,
        head: head.to_string(),
        body: body.to_string(),
    }
}

#[test]
fn stream_sends_snapshots() {
    let s = server("stream", None);
    let r = sse_head(s.addr, "/api/v1/stream?interval_ms=200");
    assert_eq!(r.status, 200);
    assert!(
        r.header("content-type")
            .unwrap()
            .starts_with("text/event-stream")
    );
    let data = r
        .body
        .lines()
        .find_map(|l| l.strip_prefix("data: ").or_else(|| l.strip_prefix("data:")))
        .unwrap_or_else(|| panic!("an event: {}", r.body));
    let v: Value = serde_json::from_str(data).expect("snapshot JSON");
    assert_eq!(v["services"][0]["name"], "web");
    assert!(v["switches"].is_array() && v["events"].is_array());
    assert!(r.body.contains("event: snapshot"));
    assert_json_error(&get(s.addr, "/api/v1/stream?interval_ms=5"), 400);
}

// ----- dashboard and metrics ---------------------------------------------------------------------

#[test]
fn dashboard_and_assets_are_served_from_the_binary() {
    let s = server("dash", None);
    for p in ["/", "/dashboard"] {
        let r = get(s.addr, p);
        assert_eq!(r.status, 200);
        assert!(r.header("content-type").unwrap().starts_with("text/html"));
        assert!(r.body.contains("/assets/app.js") && r.body.contains("/assets/app.css"));
        assert!(
            !r.body.contains("http://") && !r.body.contains("https://"),
            "no CDN"
        );
    }
    for (p, ct) in [
        ("/assets/app.js", "text/javascript"),
        ("/assets/app.css", "text/css"),
        ("/assets/favicon.svg", "image/svg+xml"),
    ] {
        let r = get(s.addr, p);
        assert_eq!(r.status, 200, "{p}");
        assert!(r.header("content-type").unwrap().starts_with(ct), "{p}");
        assert!(!r.body.contains("https://"), "{p}: no external resources");
    }
    assert_json_error(&get(s.addr, "/assets/evil.js"), 404);
}

/// A strict check of the Prometheus text format (0.0.4): names, HELP/TYPE before samples,
/// one TYPE per family, families contiguous, no duplicate series, histograms cumulative.
fn check_prometheus(text: &str) -> BTreeMap<String, String> {
    let name_ok = |n: &str| {
        !n.is_empty()
            && n.chars().enumerate().all(|(i, c)| {
                c.is_ascii_alphabetic() || c == '_' || c == ':' || (i > 0 && c.is_ascii_digit())
            })
    };
    let mut types: BTreeMap<String, String> = BTreeMap::new();
    let mut finished: BTreeSet<String> = BTreeSet::new();
    let mut current: Option<String> = None;
    let mut series = BTreeSet::new();
    let mut buckets: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    let mut counts: BTreeMap<String, f64> = BTreeMap::new();
    assert!(text.ends_with('\n'), "ends with a newline");
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# ") {
            let mut it = rest.splitn(3, ' ');
            let kw = it.next().unwrap();
            let name = it.next().unwrap_or_else(|| panic!("{line}")).to_string();
            assert!(name_ok(&name), "name {name}");
            match kw {
                "HELP" => {
                    assert!(
                        it.next().is_some_and(|h| !h.is_empty()),
                        "help text: {line}"
                    );
                    if current.as_deref() != Some(&name)
                        && let Some(c) = current.take()
                    {
                        finished.insert(c);
                    }
                    assert!(!finished.contains(&name), "{name} declared again");
                    current = Some(name);
                }
                "TYPE" => {
                    let kind = it.next().unwrap().to_string();
                    assert!(
                        ["counter", "gauge", "histogram", "summary", "untyped"]
                            .contains(&kind.as_str()),
                        "{line}"
                    );
                    assert!(
                        types.insert(name.clone(), kind.clone()).is_none(),
                        "one TYPE for {name}"
                    );
                    if kind == "counter" {
                        assert!(name.ends_with("_total"), "counter {name} ends in _total");
                    }
                    if current.as_deref() != Some(&name) {
                        if let Some(c) = current.take() {
                            finished.insert(c);
                        }
                        current = Some(name);
                    }
                }
                _ => {}
            }
            continue;
        }
        assert!(!line.trim().is_empty(), "no blank lines");
        let (id, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("sample: {line}"));
        let v: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            "NaN" => f64::NAN,
            x => x.parse().unwrap_or_else(|_| panic!("value of {line}")),
        };
        let (name, labels) = match id.find('{') {
            Some(i) => {
                assert!(id.ends_with('}'), "{line}");
                (&id[..i], &id[i + 1..id.len() - 1])
            }
            None => (id, ""),
        };
        assert!(name_ok(name), "{line}");
        let family = current
            .clone()
            .unwrap_or_else(|| panic!("{line} before any TYPE"));
        let kind = types
            .get(&family)
            .unwrap_or_else(|| panic!("TYPE of {family} before {line}"));
        let ok = match kind.as_str() {
            "histogram" => [
                format!("{family}_bucket"),
                format!("{family}_sum"),
                format!("{family}_count"),
            ]
            .contains(&name.to_string()),
            _ => name == family,
        };
        assert!(ok, "{line} belongs to the declared family {family}");
        let mut seen_labels = BTreeSet::new();
        if !labels.is_empty() {
            for pair in split_labels(labels) {
                let (k, v) = pair.split_once('=').unwrap_or_else(|| panic!("{line}"));
                assert!(name_ok(k) && !k.starts_with("__"), "label {k}");
                assert!(
                    v.starts_with('"') && v.ends_with('"') && v.len() >= 2,
                    "{line}"
                );
                assert!(
                    seen_labels.insert(k.to_string()),
                    "label {k} twice in {line}"
                );
            }
        }
        assert!(series.insert(id.to_string()), "duplicate series {id}");
        if name.ends_with("_bucket") {
            let le = labels.split("le=\"").nth(1).unwrap().trim_end_matches('"');
            let le: f64 = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().unwrap()
            };
            buckets.entry(family.clone()).or_default().push((le, v));
        } else if kind == "histogram" && name.ends_with("_count") {
            counts.insert(family.clone(), v);
        } else if kind == "counter" || kind == "gauge" {
            assert!(!v.is_nan(), "{line}");
        }
        if kind == "counter" {
            assert!(v >= 0.0, "{line}");
        }
    }
    for (fam, b) in &buckets {
        assert!(
            b.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1),
            "{fam} cumulative"
        );
        assert_eq!(b.last().unwrap().0, f64::INFINITY, "{fam} has +Inf");
        assert_eq!(
            Some(&b.last().unwrap().1),
            counts.get(fam),
            "{fam}: +Inf bucket = count"
        );
    }
    types
}

fn split_labels(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut in_q = false;
    let mut esc = false;
    for c in s.chars() {
        if esc {
            cur.push(c);
            esc = false;
            continue;
        }
        match c {
            '\\' if in_q => {
                cur.push(c);
                esc = true;
            }
            '"' => {
                in_q = !in_q;
                cur.push(c);
            }
            ',' if !in_q => out.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

#[test]
fn metrics_are_valid_prometheus_text() {
    let s = server("metrics", None);
    for ns in [500u64, 3_000, 40_000, 2_000_000, 200_000_000] {
        s.handle.decision_latency.observe(Duration::from_nanos(ns));
    }
    let r = get(s.addr, "/metrics");
    assert_eq!(r.status, 200);
    assert!(
        r.header("content-type")
            .unwrap()
            .starts_with("text/plain; version=0.0.4")
    );
    let types = check_prometheus(&r.body);
    for (f, k) in [
        ("flowgate_decision_latency_seconds", "histogram"),
        ("flowgate_backend_active_connections", "gauge"),
        ("flowgate_backend_connections_total", "counter"),
        ("flowgate_backend_requests_per_second", "gauge"),
        ("flowgate_backend_response_time_seconds", "gauge"),
        ("flowgate_backend_healthy", "gauge"),
        ("flowgate_switch_packet_in_total", "counter"),
        ("flowgate_packet_in_dropped_total", "counter"),
        ("flowgate_backend_ejected", "gauge"),
        ("flowgate_service_isslm_moves_total", "counter"),
        ("flowgate_service_ejections_total", "counter"),
        ("flowgate_service_ejections_by_detector_total", "counter"),
        ("flowgate_backend_connection_outcomes_total", "counter"),
        ("flowgate_outlier_outcomes_unjudged_total", "counter"),
        ("flowgate_outlier_silences_at_syn_retry_total", "counter"),
        ("flowgate_service_panics_total", "counter"),
        ("flowgate_service_panic", "gauge"),
        ("flowgate_lldp_forged_total", "counter"),
        ("flowgate_ports_refused_total", "counter"),
        ("flowgate_openflow_handshakes_refused_total", "counter"),
        ("flowgate_openflow_undecodable_total", "counter"),
        ("flowgate_address_claims_refused_total", "counter"),
    ] {
        assert_eq!(types.get(f).map(String::as_str), Some(k), "{f}");
    }
    assert!(
        r.body
            .contains("flowgate_decision_latency_seconds_bucket{le=\"0.000001\"} 1\n"),
        "{}",
        r.body
    );
    assert!(
        r.body
            .contains("flowgate_decision_latency_seconds_bucket{le=\"0.1\"} 4\n")
    );
    assert!(
        r.body
            .contains("flowgate_decision_latency_seconds_count 5\n")
    );
    assert!(
        r.body
            .contains("flowgate_backend_healthy{service=\"web\",backend=\"10.0.0.2\"} 1\n")
    );
    for search in ["request_load", "connections", "response_time"] {
        let line = format!(
            "flowgate_service_isslm_moves_total{{service=\"web\",search=\"{search}\"}} 0\n"
        );
        assert!(r.body.contains(&line), "{line}");
    }
    for line in [
        "flowgate_backend_ejected{service=\"web\",backend=\"10.0.0.2\"} 0\n",
        "flowgate_service_ejections_total{service=\"web\"} 0\n",
        "flowgate_service_ejections_by_detector_total{service=\"web\",detector=\"consecutive\"} 0\n",
        "flowgate_service_ejections_by_detector_total{service=\"web\",detector=\"success_rate\"} 0\n",
        "flowgate_service_ejections_by_detector_total{service=\"web\",detector=\"failure_percentage\"} 0\n",
        "flowgate_backend_connection_outcomes_total{service=\"web\",backend=\"10.0.0.2\",outcome=\"answered\"} 0\n",
        "flowgate_backend_connection_outcomes_total{service=\"web\",backend=\"10.0.0.2\",outcome=\"unanswered\"} 0\n",
        "flowgate_service_panic{service=\"web\"} 0\n",
    ] {
        assert!(r.body.contains(line), "{line}");
    }
}

#[test]
fn prometheus_checker_catches_mistakes() {
    let good = "# HELP a_total A.\n# TYPE a_total counter\na_total 1\n";
    check_prometheus(good);
    for bad in [
        "a_total 1\n",
        "# HELP a_total A.\n# TYPE a_total counter\na_total 1\na_total 2\n",
        "# HELP a A.\n# TYPE a counter\na 1\n",
        "# HELP a_total A.\n# TYPE a_total counter\nb_total 1\n",
        "# HELP g G.\n# TYPE g gauge\ng{x=\"1\",x=\"2\"} 1\n",
    ] {
        assert!(
            std::panic::catch_unwind(|| check_prometheus(bad)).is_err(),
            "rejects {bad:?}"
        );
    }
}

// ----- ctl --------------------------------------------------------------------------------------

fn ctl(addr: SocketAddr, args: &[&str], token: Option<&str>) -> (bool, String, String) {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_flowgate"));
    c.arg("ctl")
        .arg("--api")
        .arg(format!("http://{addr}"))
        .args(args);
    c.env_remove("FLOWGATE_API_TOKEN");
    if let Some(t) = token {
        c.env("FLOWGATE_API_TOKEN", t);
    }
    let out = c.output().expect("run flowgate ctl");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

#[test]
fn ctl_reads_and_changes() {
    let s = server("ctl", Some(TOKEN));
    let a = s.addr;
    let (ok, out, err) = ctl(a, &["services"], None);
    assert!(ok, "{err}");
    assert!(
        out.contains("web")
            && out.contains("10.0.0.3")
            && out.contains("mode reactive")
            && out.contains("round-robin"),
        "{out}"
    );
    assert!(!out.contains("redispatched"), "none yet: {out}");
    let (ok, out, _) = ctl(a, &["--json", "services"], None);
    assert!(ok);
    assert_eq!(
        serde_json::from_str::<Value>(&out).unwrap()[0]["name"],
        "web"
    );
    for cmd in ["switches", "connections", "events"] {
        let (ok, _, err) = ctl(a, &[cmd], None);
        assert!(ok, "{cmd}: {err}");
    }
    // The backends' table lines up under its header (numbers padded as text, not JSON),
    // and a backend no switch has shown yet is "unlocated", as on the dashboard.
    let (_, out, _) = ctl(a, &["services"], None);
    let header = out.lines().find(|l| l.contains("BACKEND")).expect("header");
    let row = out.lines().find(|l| l.contains("10.0.0.3")).expect("row");
    // Right-aligned: the weight's last digit ends under the header's last letter.
    let end = header.find("WEIGHT").expect("column") + "WEIGHT".len();
    let bytes = row.as_bytes();
    assert!(
        bytes[end - 1].is_ascii_digit() && bytes[end] == b' ',
        "WEIGHT:\n{header}\n{row}"
    );
    // Left-aligned: the cell starts under its header.
    for (column, cell) in [("HEALTH", "unlocated"), ("STATE", "active")] {
        assert_eq!(
            row.find(cell),
            header.find(column),
            "{column}:\n{header}\n{row}"
        );
    }
    let (ok, out, err) = ctl(a, &["status"], None);
    assert!(
        ok && out.contains("version") && out.contains(env!("CARGO_PKG_VERSION")),
        "{out}{err}"
    );
    let (ok, out, err) = ctl(a, &["overload"], None);
    assert!(ok, "{err}");
    let gates: Vec<&str> = out
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().next().unwrap_or(""))
        .collect();
    assert_eq!(gates, ["controller", "service"], "{out}");
    assert!(out.contains("service web"), "{out}");

    // Refused without a token: non-zero, with the API's reason.
    let (ok, _, err) = ctl(a, &["drain", "web", "10.0.0.2"], None);
    assert!(!ok);
    assert!(err.contains("401") && err.contains("Bearer"), "{err}");
    let (ok, _, err) = ctl(
        a,
        &[
            "--token",
            "wrong-token-xxxxxxxx",
            "drain",
            "web",
            "10.0.0.2",
        ],
        None,
    );
    assert!(!ok && err.contains("not valid"), "{err}");

    let (ok, out, err) = ctl(a, &["drain", "web", "10.0.0.2"], Some(TOKEN));
    assert!(ok, "{err}");
    assert!(out.contains("draining"), "{out}");
    let (ok, _, err) = ctl(a, &["undrain", "web", "10.0.0.2"], Some(TOKEN));
    assert!(ok, "{err}");
    let (ok, out, _) = ctl(a, &["weight", "web", "10.0.0.2", "5"], Some(TOKEN));
    assert!(ok && out.contains("\"weight\": 5"), "{out}");
    let (ok, out, err) = ctl(
        a,
        &["algorithm", "web", "isslm", "--threshold-rps", "40"],
        Some(TOKEN),
    );
    assert!(ok && out.contains("isslm"), "{out}{err}");
    let (ok, _, err) = ctl(
        a,
        &["add-backend", "web", "10.0.0.8", "--weight", "3"],
        Some(TOKEN),
    );
    assert!(ok, "{err}");
    let (ok, _, err) = ctl(a, &["remove-backend", "web", "10.0.0.8"], Some(TOKEN));
    assert!(ok, "{err}");
    let (ok, _, err) = ctl(a, &["drain", "web", "10.9.9.9"], Some(TOKEN));
    assert!(
        !ok && err.contains("404") && err.contains("not a backend"),
        "{err}"
    );
    let (ok, _, err) = ctl(a, &["algorithm", "web", "fastest"], Some(TOKEN));
    assert!(!ok && err.contains("400"), "{err}");

    // Reload: a bad file lists every error, exits non-zero.
    std::fs::write(
        &s.path,
        config_text(Some(TOKEN), false).replace("port = 80", "port = 0\nnope = 1"),
    )
    .unwrap();
    let (ok, _, err) = ctl(a, &["reload"], Some(TOKEN));
    assert!(
        !ok && err.contains("422")
            && err.contains("service[0].port")
            && err.contains("service[0].nope"),
        "{err}"
    );
    std::fs::write(&s.path, config_text(Some(TOKEN), false)).unwrap();
    let (ok, _, err) = ctl(a, &["reload"], Some(TOKEN));
    assert!(ok, "{err}");

    // A controller that is not there: a clear error.
    let (ok, _, err) = ctl("127.0.0.1:1".parse().unwrap(), &["services"], None);
    assert!(!ok && err.contains("cannot connect"), "{err}");
}

// ----- end to end on real Open vSwitch -----------------------------------------------------------

/// A long download through the VIP keeps going while its backend is drained, weights and the
/// algorithm change, the config is reloaded (a bad one refused, changing nothing), and its
/// backend leaves the pool; new connections follow each change.
#[test]
fn ovs_api_changes_keep_connections() {
    use flowgate_testbed::topo::{self, TopoOptions};
    use support::*;
    const VIP: &str = "10.0.0.100";
    let Some(p) = setup("ovs_api_changes_keep_connections") else {
        return;
    };
    let t = topo::single(&TopoOptions::new(p.as_str()), 4).expect("topology");
    let (b2, b3, b4) = (t.hosts[1].ip(), t.hosts[2].ip(), t.hosts[3].ip());
    let with_token = |c: String| c.replacen("[api]\n", &format!("[api]\ntoken = \"{TOKEN}\"\n"), 1);
    let cfg = with_token(vip_config(VIP, "round-robin", &[b2, b3], ""));
    let ctl = Ctl::start("api-changes", &cfg);
    ctl.control(&t.bridges[..1]);
    let _servers = [
        httpd(&t.hosts[1], "b2", &["--rate-bytes-per-sec", "1000000"]),
        httpd(&t.hosts[2], "b3", &["--rate-bytes-per-sec", "1000000"]),
        httpd(&t.hosts[3], "b4", &["--rate-bytes-per-sec", "1000000"]),
    ];
    ctl.wait_backends_ready(Duration::from_secs(15));
    let client = &t.hosts[0];
    let api = ctl.api;
    let auth = [("Authorization", format!("Bearer {TOKEN}"))];
    let call = |method: &str, path: &str, body: &str| -> (u16, Value) {
        let headers: Vec<(&str, &str)> = vec![
            (auth[0].0, auth[0].1.as_str()),
            ("Content-Type", "application/json"),
        ];
        let (st, body) = http_request(api, method, path, &headers, body);
        (st, serde_json::from_str(&body).unwrap_or(Value::Null))
    };

    // An 8 MB download at 1 MB/s: eight seconds on the wire.
    let dl = Download::start(client, &format!("http://{VIP}/bytes/8000000"));
    let mut carrier = None;
    wait_until(
        "the download's connection is tracked",
        Duration::from_secs(5),
        || {
            let v = ctl.get_json("/api/v1/connections?limit=10");
            carrier = v["items"]
                .as_array()
                .and_then(|i| i.first())
                .and_then(|c| c["backend"].as_str())
                .map(str::to_string);
            carrier.is_some()
        },
    );
    let carrier = carrier.unwrap();
    let other = if carrier == b2.to_string() {
        b3.to_string()
    } else {
        b2.to_string()
    };

    // Drain the backend carrying the download.
    let (st, v) = call(
        "POST",
        &format!("/api/v1/services/web/backends/{carrier}/drain"),
        "",
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["state"], "draining");
    let r = load(
        client,
        &format!("http://{VIP}/"),
        &["--requests", "20", "--concurrency", "2"],
    );
    assert_eq!(r["ok"], 20, "{r}");
    assert_eq!(
        shares(&r).len(),
        1,
        "new connections avoid the drained backend: {r}"
    );

    // Weights and algorithm.
    let (st, v) = call(
        "PUT",
        &format!("/api/v1/services/web/backends/{other}/weight"),
        "{\"weight\": 3}",
    );
    assert_eq!(st, 200, "{v}");
    let (st, v) = call(
        "PUT",
        "/api/v1/services/web/algorithm",
        "{\"algorithm\": \"weighted-round-robin\"}",
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["algorithm"], "weighted-round-robin");
    let (st, v) = call(
        "POST",
        &format!("/api/v1/services/web/backends/{carrier}/undrain"),
        "",
    );
    assert_eq!(st, 200, "{v}");
    let r = load(
        client,
        &format!("http://{VIP}/"),
        &["--requests", "40", "--concurrency", "1"],
    );
    assert_eq!(r["ok"], 40, "{r}");
    let sh: BTreeMap<String, u64> = shares(&r).into_iter().collect();
    assert_eq!(sh.values().sum::<u64>(), 40);
    let heavy = sh
        .get(if other == b2.to_string() { "b2" } else { "b3" })
        .copied()
        .unwrap_or(0);
    assert!(
        (27..=33).contains(&heavy),
        "weights 3:1 under weighted round robin: {sh:?}"
    );

    // A bad config: refused with every error, nothing changes.
    let before = ctl.get_json("/api/v1/services");
    let cfg_path = ctl.dir.join("flowgate.toml");
    let good_text = std::fs::read_to_string(&cfg_path).unwrap();
    let bad = good_text.replace(
        "algorithm = \"round-robin\"",
        "algorithm = \"nope\"\nport2 = 1",
    );
    std::fs::write(&cfg_path, &bad).unwrap();
    let (st, v) = call("POST", "/api/v1/reload", "");
    assert_eq!(st, 422, "{v}");
    let paths: Vec<&str> = v["errors"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["path"].as_str())
        .collect();
    assert!(
        paths.contains(&"service[0].algorithm") && paths.contains(&"service[0].port2"),
        "every error listed: {v}"
    );
    let after = ctl.get_json("/api/v1/services");
    assert_eq!(after[0]["algorithm"], before[0]["algorithm"]);
    assert_eq!(after[0]["backends"].as_array().unwrap().len(), 2);

    // A good config adding b4 and going back to round robin; drain the carrier again first.
    call(
        "POST",
        &format!("/api/v1/services/web/backends/{carrier}/drain"),
        "",
    );
    let text = with_token(vip_config(VIP, "round-robin", &[b2, b3, b4], ""));
    let text = text
        .lines()
        .map(|l| if l.starts_with("listen") { "" } else { l })
        .collect::<Vec<_>>()
        .join("\n");
    // Keep the listen addresses the controller runs with.
    let text = text
        .replacen(
            "[openflow]\n",
            &format!("[openflow]\nlisten = \"{}\"\n", ctl.openflow),
            1,
        )
        .replacen("[api]\n", &format!("[api]\nlisten = \"{api}\"\n"), 1);
    std::fs::write(&cfg_path, &text).unwrap();
    let (st, v) = call("POST", "/api/v1/reload", "");
    assert_eq!(st, 200, "{v}");
    // The controller started with port 0 and the file now names the bound ports: only the
    // listen addresses differ, and they are reported as needing a restart.
    assert!(
        v["restart_needed"]
            .as_array()
            .unwrap()
            .iter()
            .all(|k| k.as_str().unwrap().ends_with(".listen")),
        "{v}"
    );
    ctl.wait_backends_ready(Duration::from_secs(15));
    let svc = ctl.get_json("/api/v1/services/web");
    assert_eq!(svc["algorithm"], "round-robin");
    assert_eq!(svc["backends"].as_array().unwrap().len(), 3);
    let reopened_before = reopened(&ctl);
    let r = load(
        client,
        &format!("http://{VIP}/"),
        &["--requests", "30", "--concurrency", "1"],
    );
    assert_eq!(r["ok"], 30, "{r}");
    // The two active backends (b4 new, the carrier still drained), alternately.
    assert_round_robin(&shares(&r), 30, 2, reopened(&ctl) - reopened_before);

    // The carrier leaves the pool: the download goes on to it, listed out of the pool.
    let (st, v) = call(
        "DELETE",
        &format!("/api/v1/services/web/backends/{carrier}"),
        "",
    );
    assert_eq!(st, 200, "{v}");
    assert!(
        v["open_connections"].as_u64().is_some_and(|n| n >= 1),
        "the download's connection at least: {v}"
    );
    let listed = ctl.get_json("/api/v1/connections?limit=1000");
    assert!(
        listed["items"].as_array().unwrap().iter().any(|c| {
            c["backend"].as_str() == Some(carrier.as_str()) && c["backend_in_pool"] == false
        }),
        "{listed}"
    );
    let svc = ctl.get_json("/api/v1/services/web");
    assert_eq!(
        svc["left_backends"][0]["address"].as_str(),
        Some(carrier.as_str()),
        "{svc}"
    );
    // Each ends only when its rules have been idle 30 s: the download's is still open.
    let left_open = svc["left_backends"][0]["open_connections"].as_u64();
    assert!(
        left_open.is_some_and(|n| n >= 1 && Some(n) <= v["open_connections"].as_u64()),
        "{svc}"
    );

    dl.finishes(8_000_000, "the download through every change");
    ctl.assert_no_openflow_errors();
}
