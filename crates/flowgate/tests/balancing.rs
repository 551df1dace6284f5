//! Server load management on real Open vSwitch with real HTTP servers: the paper's Cases A
//! and B in small, backends of unequal capacity, and a backend killed mid-run.

mod support;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use flowgate_testbed::rootleg::RootLeg;
use flowgate_testbed::topo::{self, TopoOptions};
use support::*;

const VIP: &str = "10.0.0.100";

/// Tests here give the controller a leg into 10.0.0.0/24 from the root namespace; two
/// such legs at once would share a route, so they run one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn direct_config(algorithm: &str, extra: &str, backends: &[std::net::Ipv4Addr]) -> String {
    format!(
        "{LISTEN_ANY}[[service]]\nname = \"direct\"\nport = 80\nalgorithm = \"{algorithm}\"\n{extra}\n[service.health]\nkind = \"none\"\n{}",
        backend_entries(backends, false)
    )
}

/// The paper's Cases A and B in small: every client addresses server 2 (10.0.0.2) by its
/// own address at several times the threshold. Without management it takes everything;
/// under ISSLM it keeps about its threshold's worth and the rest is moved, invisibly to
/// the clients (the replies still come from 10.0.0.2), and every request succeeds.
#[test]
fn ovs_isslm_cases_a_and_b() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(p) = setup("ovs_isslm_cases_a_and_b") else {
        return;
    };
    // h1 client; h2 = server 2 (the requested one); h3, h4 the others.
    let t = topo::single(&TopoOptions::new(p.as_str()), 4).expect("topology");
    let backends: Vec<_> = t.hosts[1..].iter().map(|h| h.ip()).collect();
    let _servers: Vec<_> = t.hosts[1..]
        .iter()
        .enumerate()
        .map(|(i, h)| httpd(h, &format!("s{}", i + 2), &[]))
        .collect();
    let client = &t.hosts[0];
    let url = "http://10.0.0.2/";
    // 400 requests at 80 per second: 5 s, four times the 20/s threshold.
    let args = ["--rate", "80", "--requests", "400", "--timeout-ms", "3000"];

    // Case A: no management.
    {
        let ctl = Ctl::start("case-a", &direct_config("none", "", &backends));
        ctl.control(&t.bridges[..1]);
        ctl.wait_backends_ready(Duration::from_secs(15));
        let r = load(client, url, &args);
        assert_eq!(r["ok"], 400, "case A: every request succeeds: {r}");
        assert_eq!(
            shares(&r),
            vec![("s2".to_string(), 400)],
            "case A: server 2 takes everything"
        );
        ctl.assert_no_openflow_errors();
    }
    // Case B: ISSLM with S_Load = 20 requests/s.
    let ctl = Ctl::start(
        "case-b",
        &direct_config("isslm", "threshold_rps = 20", &backends),
    );
    ctl.control(&t.bridges[..1]);
    ctl.wait_backends_ready(Duration::from_secs(15));
    let r = load(client, url, &args);
    assert_eq!(
        r["ok"], 400,
        "case B: every request succeeds, moved or not: {r}"
    );
    let s = shares(&r);
    let s2 = s.iter().find(|(n, _)| n == "s2").map_or(0, |x| x.1);
    let moved: u64 = s.iter().filter(|(n, _)| n != "s2").map(|x| x.1).sum();
    // Server 2 keeps about its threshold's worth (20/s of 80/s = 100 of 400), plus what
    // arrives while its one-second rate average catches up.
    assert!(
        (60..=200).contains(&s2),
        "case B: server 2 keeps about its threshold's worth: {s:?}"
    );
    assert!(
        moved >= 200,
        "case B: the rest is moved to the other servers: {s:?}"
    );
    assert!(
        s.iter().filter(|(n, _)| n != "s2").all(|x| x.1 > 0),
        "both other servers take some: {s:?}"
    );
    let flows = t.bridges[0].dump_flows().expect("flows");
    assert!(
        flows.contains("set_field:10.0.0.2->ip_src"),
        "moved replies are rewritten to come from server 2:\n{flows}"
    );
    ctl.assert_no_openflow_errors();
}

/// Backends of unequal capacity (one four times slower), the same load in the same run:
/// `p2c` gives the slow backend a smaller share and a much lower p99 than `round-robin`.
/// The other algorithms are measured beside them and printed as they come out.
#[test]
fn ovs_unequal_capacity() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(p) = setup("ovs_unequal_capacity") else {
        return;
    };
    let t = topo::single(&TopoOptions::new(p.as_str()), 4).expect("topology");
    let leg = RootLeg::create(p.as_str(), "leg", "10.0.0.250/24", &t.bridges[0]).expect("root leg");
    let backends: Vec<_> = t.hosts[1..].iter().map(|h| h.ip()).collect();
    let _servers = [
        // Four workers each: the slow one serves 100 requests/s, the fast ones 400.
        httpd(
            &t.hosts[1],
            "slow",
            &["--delay-ms", "40", "--concurrency", "4", "--metrics"],
        ),
        httpd(
            &t.hosts[2],
            "fast1",
            &["--delay-ms", "10", "--concurrency", "4", "--metrics"],
        ),
        httpd(
            &t.hosts[3],
            "fast2",
            &["--delay-ms", "10", "--concurrency", "4", "--metrics"],
        ),
    ];
    let client = &t.hosts[0];
    let mut results = Vec::new();
    for algorithm in [
        "round-robin",
        "p2c",
        "least-connections",
        "isslm",
        "srt",
        "dwrs",
        "mrbs",
        "amlob",
    ] {
        let extra = if algorithm == "isslm" {
            "threshold_rps = 60"
        } else {
            ""
        };
        let cfg = format!(
            "{LISTEN_ANY}[[service]]\nname = \"web\"\nvip = \"{VIP}\"\nport = 80\nalgorithm = \"{algorithm}\"\n{extra}\n[service.health]\nkind = \"http\"\npath = \"/health\"\ninterval_ms = 200\n[service.metrics]\ninterval_ms = 20\n{}",
            backend_entries(&backends, true)
        );
        let ctl = Ctl::start(&format!("unequal-{algorithm}"), &cfg);
        ctl.control(&t.bridges[..1]);
        announce_leg(&leg, "10.0.0.2");
        ctl.wait_backends_ready(Duration::from_secs(20));
        // Warm up the load figures, then measure: 16 concurrent clients, 800 requests.
        let _ = load(
            client,
            &format!("http://{VIP}/"),
            &["--requests", "100", "--concurrency", "16"],
        );
        let r = load(
            client,
            &format!("http://{VIP}/"),
            &["--requests", "800", "--concurrency", "16"],
        );
        let failed = r["failed"].as_u64().unwrap_or(800);
        let slow = r["per_backend"]["slow"].as_u64().unwrap_or(0);
        let p99 = r["latency_ms"]["p99"].as_f64().unwrap_or(f64::MAX);
        let rate = r["achieved_rate"].as_f64().unwrap_or(0.0);
        println!(
            "{algorithm:>20}: slow share {:5.1}%  p99 {p99:7.1} ms  {rate:7.1} req/s  failed {failed}",
            slow as f64 / 8.0
        );
        if algorithm == "round-robin" || algorithm == "p2c" {
            assert_eq!(failed, 0, "{algorithm}: every request succeeds: {r}");
        }
        results.push((algorithm, slow, p99));
        ctl.assert_no_openflow_errors();
    }
    let (_, rr_slow, rr_p99) = results[0];
    let (_, p2c_slow, p2c_p99) = results[1];
    assert!(
        (240..=293).contains(&rr_slow),
        "round robin gives the slow backend its third: {rr_slow}"
    );
    assert!(
        p2c_slow * 10 < rr_slow * 8,
        "p2c gives the slow backend a smaller share: {p2c_slow} vs {rr_slow}"
    );
    assert!(
        p2c_p99 < rr_p99 * 0.8,
        "p2c's p99 is much lower: {p2c_p99} vs {rr_p99}"
    );
}

/// A backend killed in the middle of a run gets no new connection after the detection
/// window (one check interval plus its timeout, default health settings), and every
/// request after that window succeeds.
#[test]
fn ovs_killed_backend_is_avoided() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(p) = setup("ovs_killed_backend_is_avoided") else {
        return;
    };
    let t = topo::single(&TopoOptions::new(p.as_str()), 4).expect("topology");
    let leg = RootLeg::create(p.as_str(), "leg", "10.0.0.250/24", &t.bridges[0]).expect("root leg");
    let backends: Vec<_> = t.hosts[1..].iter().map(|h| h.ip()).collect();
    let cfg = format!(
        "{LISTEN_ANY}[[service]]\nname = \"web\"\nvip = \"{VIP}\"\nport = 80\nalgorithm = \"round-robin\"\n{}",
        backend_entries(&backends, false)
    );
    let ctl = Ctl::start("killed", &cfg);
    ctl.control(&t.bridges[..1]);
    announce_leg(&leg, "10.0.0.2");
    let mut victim = httpd(&t.hosts[1], "b2", &[]);
    let _others = [httpd(&t.hosts[2], "b3", &[]), httpd(&t.hosts[3], "b4", &[])];
    ctl.wait_backends_ready(Duration::from_secs(20));

    let client = &t.hosts[0];
    let r = load(
        client,
        &format!("http://{VIP}/"),
        &["--requests", "60", "--concurrency", "3"],
    );
    assert_eq!(r["ok"], 60);
    assert_eq!(r["per_backend"]["b2"], 20);
    victim.kill();
    let killed = Instant::now();
    // Default health: interval 1 s, timeout 0.5 s; a refused probe marks it down at once.
    std::thread::sleep(Duration::from_millis(1500));
    let services = ctl.get_json("/api/v1/services");
    let b2 = services[0]["backends"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["address"] == "10.0.0.2")
        .cloned()
        .unwrap();
    assert_eq!(
        b2["healthy"],
        false,
        "b2 detected as failed {:?} after the kill: {b2}",
        killed.elapsed()
    );
    let r = load(
        client,
        &format!("http://{VIP}/"),
        &["--requests", "200", "--concurrency", "4"],
    );
    assert_eq!(
        r["ok"], 200,
        "every request after the detection window succeeds: {r}"
    );
    assert!(
        r["per_backend"].get("b2").is_none(),
        "no new connection to the dead backend: {r}"
    );
    ctl.assert_no_openflow_errors();
}

/// A backend that exports Prometheus metrics is scraped, and its figures appear per
/// backend in `GET /api/v1/services`: the response time there is the backends' own (30 ms
/// of service time), not the health probe's round trip (well under a millisecond).
#[test]
fn ovs_backend_metrics_are_scraped() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(p) = setup("ovs_backend_metrics_are_scraped") else {
        return;
    };
    let t = topo::single(&TopoOptions::new(p.as_str()), 3).expect("topology");
    let _leg =
        RootLeg::create(p.as_str(), "leg", "10.0.0.250/24", &t.bridges[0]).expect("root leg");
    let backends: Vec<_> = t.hosts[1..].iter().map(|h| h.ip()).collect();
    let cfg = format!(
        "{LISTEN_ANY}[[service]]\nname = \"web\"\nvip = \"{VIP}\"\nport = 80\nalgorithm = \"round-robin\"\n[service.health]\nkind = \"tcp\"\n[service.metrics]\ninterval_ms = 250\n{}",
        backend_entries(&backends, true)
    );
    let ctl = Ctl::start("scrape", &cfg);
    ctl.control(&t.bridges[..1]);
    let _servers = [
        httpd(&t.hosts[1], "b2", &["--delay-ms", "30", "--metrics"]),
        httpd(&t.hosts[2], "b3", &["--delay-ms", "30", "--metrics"]),
    ];
    ctl.wait_backends_ready(Duration::from_secs(20));
    // Read the API while the load runs: a request rate is a rate over the last scrape.
    let url = format!("http://{VIP}/");
    let running = t.hosts[0]
        .command(&[
            FLOWGATE,
            "load",
            "--url",
            &url,
            "--rate",
            "40",
            "--requests",
            "200",
            "--json",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("load");
    std::thread::sleep(Duration::from_millis(3000));
    let services = ctl.get_json("/api/v1/services");
    let out = running.wait_with_output().expect("load finishes");
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("report");
    assert_eq!(r["ok"], 200, "{r}");
    for b in services[0]["backends"].as_array().expect("backends") {
        let rt = b["response_time_ms"].as_f64().unwrap_or(0.0);
        let rps = b["rps"].as_f64().unwrap_or(0.0);
        assert!(
            (25.0..200.0).contains(&rt),
            "response time from the backend's own histogram: {b}"
        );
        assert!(
            rps > 2.0,
            "request rate from the backend's own counter: {b}"
        );
    }
    ctl.assert_no_openflow_errors();
}
