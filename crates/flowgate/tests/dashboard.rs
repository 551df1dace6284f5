//! The dashboard in a real browser: headless Chromium, driven through chromedriver's
//! WebDriver HTTP API (a few JSON calls over a plain TCP client, no extra crates), while
//! real traffic flows through a real Open vSwitch test network.

#![allow(clippy::unwrap_used)]

mod support;

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use flowgate_testbed::topo::{self, TopoOptions};
use flowgate_testbed::{Prefix, cleanup_stale, require_root_ovs};
use serde_json::{Value, json};
use support::*;

const VIP: &str = "10.0.0.100";
const TOKEN: &str = "dashboard-test-token-0123";

/// chromedriver, killed on drop.
struct Driver {
    child: Child,
    addr: SocketAddr,
    session: Option<String>,
}

impl Drop for Driver {
    fn drop(&mut self) {
        if let Some(s) = self.session.take() {
            let _ = wd(self.addr, "DELETE", &format!("/session/{s}"), None);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One WebDriver call; returns the `value`.
fn wd(addr: SocketAddr, method: &str, path: &str, body: Option<Value>) -> Result<Value, String> {
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let (status, text) = wd_http(addr, method, path, &body)?;
    let v: Value =
        serde_json::from_str(&text).map_err(|e| format!("{method} {path}: {e}: {text}"))?;
    if status != 200 {
        return Err(format!("{method} {path}: {status}: {v}"));
    }
    Ok(v["value"].clone())
}

/// HTTP/1.1 with a Content-Length-delimited answer (chromedriver may keep the socket open).
fn wd_http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
) -> Result<(u16, String), String> {
    use std::io::{BufRead, BufReader, Read, Write};
    let mut s = std::net::TcpStream::connect(addr).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(60))).ok();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
    let mut r = BufReader::new(s);
    let mut line = String::new();
    r.read_line(&mut line).map_err(|e| e.to_string())?;
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let mut len = None;
    loop {
        line.clear();
        if r.read_line(&mut line).map_err(|e| e.to_string())? == 0 || line.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':')
            && k.trim().eq_ignore_ascii_case("content-length")
        {
            len = v.trim().parse::<usize>().ok();
        }
    }
    let mut buf = Vec::new();
    match len {
        Some(n) => {
            buf.resize(n, 0);
            r.read_exact(&mut buf).map_err(|e| e.to_string())?;
        }
        None => {
            r.read_to_end(&mut buf).map_err(|e| e.to_string())?;
        }
    }
    Ok((status, String::from_utf8_lossy(&buf).into_owned()))
}

impl Driver {
    fn start(dir: &std::path::Path) -> Driver {
        let port = free_port();
        let log = std::fs::File::create(dir.join("chromedriver.log")).unwrap();
        let child = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("chromedriver");
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let mut d = Driver {
            child,
            addr,
            session: None,
        };
        wait_until("chromedriver", Duration::from_secs(15), || {
            std::net::TcpStream::connect(addr).is_ok()
                && wd(addr, "GET", "/status", None).is_ok_and(|v| v["ready"] == true)
        });
        let profile = dir.join("chromium-profile");
        let caps = json!({ "capabilities": { "alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": "/usr/bin/chromium",
                "args": ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                    "--no-first-run", "--disable-background-networking", "--disable-component-update",
                    "--disable-sync", "--disable-dev-shm-usage", "--window-size=1440,1500",
                    format!("--user-data-dir={}", profile.display())]
            }
        }}});
        let v = wd(addr, "POST", "/session", Some(caps)).expect("new session");
        d.session = Some(v["sessionId"].as_str().expect("session id").to_string());
        d
    }

    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let s = self.session.as_deref().unwrap();
        wd(self.addr, method, &format!("/session/{s}{path}"), body)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    fn goto(&self, url: &str) {
        self.call("POST", "/url", Some(json!({ "url": url })));
    }

    fn js(&self, script: &str) -> Value {
        self.call(
            "POST",
            "/execute/sync",
            Some(json!({ "script": script, "args": [] })),
        )
    }

    fn find(&self, css: &str) -> String {
        let v = self.call(
            "POST",
            "/element",
            Some(json!({ "using": "css selector", "value": css })),
        );
        v.as_object()
            .and_then(|o| o.values().next())
            .and_then(Value::as_str)
            .expect("element id")
            .to_string()
    }

    fn click(&self, css: &str) {
        let e = self.find(css);
        self.call("POST", &format!("/element/{e}/click"), Some(json!({})));
    }

    fn type_into(&self, css: &str, text: &str) {
        let e = self.find(css);
        self.call(
            "POST",
            &format!("/element/{e}/value"),
            Some(json!({ "text": text })),
        );
    }

    fn screenshot(&self, path: &std::path::Path) {
        use base64_decode as b64;
        let v = self.call("GET", "/screenshot", None);
        let png = b64(v.as_str().expect("base64"));
        std::fs::write(path, png).expect("write screenshot");
    }
}

/// Standard base64 (the WebDriver screenshot), decoded without a crate.
fn base64_decode(s: &str) -> Vec<u8> {
    let val = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0);
    for c in s.bytes().filter_map(val) {
        acc = (acc << 6) | c;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    out
}

fn artifacts() -> PathBuf {
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    let d = target.join("test-artifacts");
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Per-backend `connections_total` as the page shows it, and the snapshot it came from.
fn dom_totals(d: &Driver) -> (i64, Vec<(String, u64)>) {
    let v = d.js(
        "return JSON.stringify({seq: Number(document.body.dataset.seq), rows: [...document.querySelectorAll('tr[data-backend]')].map(r => [r.dataset.backend, Number(r.querySelector('td[data-field=connections_total]').dataset.value)])});",
    );
    let v: Value = serde_json::from_str(v.as_str().unwrap()).unwrap();
    let rows = v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r[0].as_str().unwrap().to_string(),
                r[1].as_u64().unwrap_or(0),
            )
        })
        .collect();
    (v["seq"].as_i64().unwrap_or(-1), rows)
}

fn api_totals(ctl: &Ctl) -> Vec<(String, u64)> {
    let v = ctl.get_json("/api/v1/services");
    let mut out = Vec::new();
    for s in v.as_array().unwrap() {
        for b in s["backends"].as_array().unwrap() {
            out.push((
                format!(
                    "{}/{}",
                    s["name"].as_str().unwrap(),
                    b["address"].as_str().unwrap()
                ),
                b["connections_total"].as_u64().unwrap(),
            ));
        }
    }
    out
}

#[test]
fn ovs_dashboard_in_chromium() {
    if !require_root_ovs("ovs_dashboard_in_chromium") {
        return;
    }
    let p = Prefix::for_test("ovs_dashboard_in_chromium");
    cleanup_stale(p.as_str()).expect("clean leftovers");
    let t = topo::single(&TopoOptions::new(p.as_str()), 3).expect("topology");
    let (b2, b3) = (t.hosts[1].ip(), t.hosts[2].ip());
    let cfg = vip_config(VIP, "round-robin", &[b2, b3], "").replacen(
        "[api]\n",
        &format!("[api]\ntoken = \"{TOKEN}\"\n"),
        1,
    );
    let ctl = Ctl::start("dashboard", &cfg);
    t.bridges[0]
        .set_controller(&[ctl.target()])
        .expect("set controller");
    t.bridges[0]
        .wait_connected(Duration::from_secs(10))
        .expect("switch connects");
    // b3 sends at 1 MB/s, so that a download from it stays open while it is removed.
    let _servers = [
        httpd(&t.hosts[1], "b2", &[]),
        httpd(&t.hosts[2], "b3", &["--rate-bytes-per-sec", "1000000"]),
    ];
    ctl.wait_backends_ready(Duration::from_secs(15));
    let client = &t.hosts[0];

    let art = artifacts();
    let driver = Driver::start(&ctl.dir);
    driver.goto(&format!("http://{}/", ctl.api));
    wait_until(
        "the page renders a snapshot",
        Duration::from_secs(10),
        || dom_totals(&driver).0 >= 1,
    );

    // Rate-bounded traffic for ~12 s.
    let url = format!("http://{VIP}/");
    let mut traffic = client
        .command(&[
            FLOWGATE,
            "load",
            "--url",
            &url,
            "--requests",
            "240",
            "--rate",
            "20",
            "--concurrency",
            "4",
            "--duration-secs",
            "30",
            "--json",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("load");
    std::thread::sleep(Duration::from_secs(4));
    let (seq1, first) = dom_totals(&driver);
    let api_now = api_totals(&ctl);
    assert_eq!(first.len(), 2, "both backends on the page: {first:?}");
    for ((k, dom), (k2, api)) in first.iter().zip(api_now.iter()) {
        assert_eq!(k, k2);
        // The page is at most one update (1 s at 20 req/s, split over two) behind the API.
        assert!(
            *dom <= *api && api - dom <= 25,
            "{k}: page {dom}, API {api}"
        );
        assert!(*dom > 0, "{k}: traffic shows on the page");
    }
    std::thread::sleep(Duration::from_secs(3));
    let (seq2, second) = dom_totals(&driver);
    assert!(seq2 >= seq1 + 2, "updates every second: {seq1} -> {seq2}");
    assert!(
        second.iter().zip(first.iter()).all(|(a, b)| a.1 > b.1),
        "figures follow the traffic: {first:?} -> {second:?}"
    );
    driver.screenshot(&art.join("dashboard-live.png"));
    let _ = traffic.wait();

    // The switch's row counts the hosts learned at its ports, as the API does: the
    // client and both backends at least.
    let api_hosts = || -> u64 {
        ctl.get_json("/api/v1/switches")[0]["ports"]
            .as_array()
            .map_or(0, |ps| ps.iter().filter_map(|p| p["hosts"].as_u64()).sum())
    };
    // Each backend's overload gate shows as its mode (none configured here: off).
    for b in [b2, b3] {
        let api = ctl.get_json(&format!("/api/v1/services/web/backends/{b}"));
        assert_eq!(api["gap"]["mode"], "off", "{api}");
        let shown = driver.js(&format!(
            "return document.querySelector('tr[data-backend=\"web/{b}\"] td[data-field=gap]').textContent"
        ));
        assert_eq!(shown, "off", "{b}");
    }
    // The service's mode, as the API says it.
    assert_eq!(
        driver.js("return document.querySelector('[data-field=mode]').textContent"),
        ctl.get_json("/api/v1/services/web")["mode"]
    );
    // The controller's own gate, and no service gate (none configured: both off).
    assert_eq!(
        ctl.get_json("/api/v1/overload")["controller"]["mode"],
        "off"
    );
    assert_eq!(
        driver.js("return document.getElementById('controller-gate').textContent"),
        "off"
    );
    assert_eq!(
        driver.js("return document.querySelectorAll('[data-field=service_gate]').length"),
        0
    );
    wait_until("the page shows the hosts", Duration::from_secs(5), || {
        let shown = driver
            .js("return document.querySelector('#switches td[data-field=hosts]').textContent");
        let n = api_hosts();
        n >= 3 && shown == serde_json::json!(n.to_string())
    });

    // Quiet: the page settles on exactly the API's figures.
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(
        dom_totals(&driver).1,
        api_totals(&ctl),
        "page equals API once traffic stops"
    );

    // Drain b2 from the page, after entering the token.
    let target = format!("web/{b2}");
    driver.click(&format!("button[data-target=\"{target}\"]"));
    wait_until("the refusal shows", Duration::from_secs(5), || {
        driver
            .js("return document.getElementById('flash').textContent")
            .as_str()
            .unwrap_or("")
            .contains("401")
            || driver
                .js("return document.getElementById('flash').textContent")
                .as_str()
                .unwrap_or("")
                .contains("Bearer")
    });
    assert_eq!(
        ctl.get_json(&format!("/api/v1/services/web/backends/{b2}"))["state"],
        "active",
        "refused without the token"
    );
    driver.type_into("#token", TOKEN);
    driver.click("#token-save");
    assert_eq!(
        driver.js("return sessionStorage.getItem('flowgate.token')"),
        json!(TOKEN)
    );
    driver.click(&format!("button[data-target=\"{target}\"]"));
    wait_until("the API shows the drain", Duration::from_secs(5), || {
        ctl.get_json(&format!("/api/v1/services/web/backends/{b2}"))["state"] == "draining"
    });
    wait_until("the page shows the drain", Duration::from_secs(5), || {
        driver
            .js(&format!("return document.querySelector('tr[data-backend=\"{target}\"] td[data-field=state]').textContent"))
            .as_str()
            == Some("draining")
    });
    driver.screenshot(&art.join("dashboard-drained.png"));
    let r = load(client, &url, &["--requests", "20", "--concurrency", "2"]);
    assert_eq!(r["ok"], 20, "{r}");
    assert_eq!(
        shares(&r),
        vec![("b3".to_string(), 20)],
        "new connections avoid the drained backend"
    );

    // Remove b3, the one backend left in rotation, while a 5 MB download from it is open
    // (five seconds at its 1 MB/s): the page lists it as removed with that connection
    // open, as the API does, until the download ends. First the load's connections end
    // (a second after their FINs), so that the one tracked next is the download's.
    let tracked = || -> Vec<Value> {
        ctl.get_json("/api/v1/connections?limit=10")["items"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    };
    wait_until(
        "the load's connections end",
        Duration::from_secs(10),
        || tracked().is_empty(),
    );
    let dl = Download::start(client, &format!("http://{VIP}/bytes/5000000"));
    wait_until(
        "the download's connection is tracked",
        Duration::from_secs(5),
        || tracked().iter().any(|c| c["backend"] == b3.to_string()),
    );
    let (st, body) = http_request(
        ctl.api,
        "DELETE",
        &format!("/api/v1/services/web/backends/{b3}"),
        &[("Authorization", &format!("Bearer {TOKEN}"))],
        "",
    );
    assert_eq!(st, 200, "{body}");
    let removed: Value = serde_json::from_str(&body).unwrap();
    assert!(removed["open_connections"].as_u64() >= Some(1), "{removed}");
    let left = format!("web/{b3}");
    let shown_open = || {
        driver.js(&format!(
            "const r = document.querySelector('tr[data-left=\"{left}\"]'); return r ? r.querySelector('td[data-field=open_connections]').textContent : null"
        ))
    };
    let api_open = || -> Option<u64> {
        ctl.get_json("/api/v1/services/web")["left_backends"]
            .as_array()?
            .iter()
            .find(|l| l["address"] == b3.to_string())?["open_connections"]
            .as_u64()
    };
    wait_until(
        "the page lists the removed backend with its open connections",
        Duration::from_secs(5),
        || {
            let n = api_open();
            n.is_some_and(|n| n >= 1) && shown_open() == json!(n.map(|n| n.to_string()))
        },
    );
    assert_eq!(
        driver.js(&format!(
            "return document.querySelectorAll('tr[data-backend=\"{left}\"]').length"
        )),
        0,
        "no longer among the pool's rows"
    );
    // The service's header counts the pool's connections, and those to removed backends
    // apart.
    let shown_left = || {
        driver.js(
            "const e = document.querySelector('[data-field=service_left]'); return e ? e.textContent : null",
        )
    };
    wait_until(
        "the service's header counts the removed backend's connections apart",
        Duration::from_secs(5),
        || api_open().is_some_and(|n| shown_left() == json!(format!(" + {n} to removed"))),
    );
    driver.screenshot(&art.join("dashboard-removed.png"));
    dl.finishes(5_000_000, "the download from the removed backend");
    // The connection's rules end a second after its FIN (fin_timeout): the row goes.
    wait_until(
        "the removed backend's row goes when its connection ends",
        Duration::from_secs(10),
        || api_open().is_none() && shown_open() == Value::Null && shown_left() == Value::Null,
    );
    ctl.assert_no_openflow_errors();
}
