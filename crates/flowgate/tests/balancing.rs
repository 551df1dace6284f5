//! Server load management on real Open vSwitch with real HTTP servers: the paper's Cases A
//! and B in small, backends of unequal capacity, and a backend killed mid-run.

mod support;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use flowgate_testbed::topo::{self, TopoOptions};
use support::*;

const VIP: &str = "10.0.0.100";
const TOKEN: &str = "balancing-test-token-0123";

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

/// Backends of unequal capacity (one four times slower) under the same closed-loop load:
/// `p2c` gives the slow backend a smaller share of the connections than `round-robin`, and
/// so a much lower p99. The other algorithms are measured beside them and printed.
///
/// 16 clients, three backends of four workers. Round robin gives the slow one its third
/// whatever its queue, so most clients end up waiting there (p99 about four slow service
/// times); p2c prefers the one with fewer requests in progress, so the slow one's queue
/// stays short (p99 about two). The service times are long (200 and 50 ms) so that these
/// queues, not the machine, set the pace: with 40 and 10 ms a loaded 2-core machine was
/// the bottleneck itself, round robin's queue vanished and the two p99s met. Round robin
/// and p2c run in alternating rounds on one controller (switched through the API) and are
/// compared by their median round, so a burst of load elsewhere that spoils one round
/// cannot decide the outcome.
#[test]
fn ovs_unequal_capacity() {
    const ROUNDS: usize = 3;
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(p) = setup("ovs_unequal_capacity") else {
        return;
    };
    let t = topo::single(&TopoOptions::new(p.as_str()), 4).expect("topology");
    let leg = root_leg(&p, &t.bridges[0]);
    let backends: Vec<_> = t.hosts[1..].iter().map(|h| h.ip()).collect();
    let _servers = [
        // Four workers each: the slow one serves 20 requests/s, the fast ones 80.
        httpd(
            &t.hosts[1],
            "slow",
            &["--delay-ms", "200", "--concurrency", "4", "--metrics"],
        ),
        httpd(
            &t.hosts[2],
            "fast1",
            &["--delay-ms", "50", "--concurrency", "4", "--metrics"],
        ),
        httpd(
            &t.hosts[3],
            "fast2",
            &["--delay-ms", "50", "--concurrency", "4", "--metrics"],
        ),
    ];
    let client = &t.hosts[0];
    // A token, so that the algorithm can be changed through the API.
    let listen = LISTEN_ANY.replacen("[api]\n", &format!("[api]\ntoken = \"{TOKEN}\"\n"), 1);
    let cfg = format!(
        "{listen}[[service]]\nname = \"web\"\nvip = \"{VIP}\"\nport = 80\nalgorithm = \"round-robin\"\n[service.health]\nkind = \"http\"\npath = \"/health\"\ninterval_ms = 200\n[service.metrics]\ninterval_ms = 20\n{}",
        backend_entries(&backends, true)
    );
    let ctl = Ctl::start("unequal", &cfg);
    ctl.control(&t.bridges[..1]);
    announce_leg(&leg, "10.0.0.2");
    ctl.wait_backends_ready(Duration::from_secs(20));

    let mut order = Vec::new();
    for _ in 0..ROUNDS {
        order.extend(["round-robin", "p2c"]);
    }
    order.extend(["least-connections", "isslm", "srt", "dwrs", "mrbs", "amlob"]);
    let (mut rr, mut p2c) = (Vec::new(), Vec::new());
    for algorithm in order {
        // ISSLM's threshold: 60% of the slow backend's capacity.
        let change = if algorithm == "isslm" {
            serde_json::json!({ "algorithm": algorithm, "threshold_rps": 12 })
        } else {
            serde_json::json!({ "algorithm": algorithm })
        };
        set_algorithm(&ctl, &change);
        let r = measure(client, algorithm);
        if algorithm == "round-robin" || algorithm == "p2c" {
            assert_eq!(
                r.failed, 0,
                "{algorithm}: every request succeeds: {}",
                r.report
            );
        }
        match algorithm {
            "round-robin" => rr.push(r),
            "p2c" => p2c.push(r),
            _ => {}
        }
    }
    ctl.assert_no_openflow_errors();

    for r in &rr {
        // A third of 300, within a tenth.
        assert!(
            (90..=110).contains(&r.slow),
            "round robin gives the slow backend its third: {}",
            r.slow
        );
    }
    let rr_slow: u64 = rr.iter().map(|r| r.slow).sum();
    let p2c_slow: u64 = p2c.iter().map(|r| r.slow).sum();
    assert!(
        p2c_slow * 10 < rr_slow * 8,
        "p2c gives the slow backend a smaller share: {p2c_slow} vs {rr_slow} over {ROUNDS} rounds"
    );
    let (rr_p99, p2c_p99) = (median_p99(&rr), median_p99(&p2c));
    assert!(
        p2c_p99 < rr_p99 * 0.8,
        "p2c's p99 is much lower (median rounds): {p2c_p99} vs {rr_p99}"
    );
}

/// One round of [`ovs_unequal_capacity`].
struct Round {
    /// Requests answered by the slow backend.
    slow: u64,
    failed: u64,
    p99: f64,
    report: serde_json::Value,
}

/// Change the `web` service's algorithm through the API.
fn set_algorithm(ctl: &Ctl, change: &serde_json::Value) {
    let auth = format!("Bearer {TOKEN}");
    let (status, body) = http_request(
        ctl.api,
        "PUT",
        "/api/v1/services/web/algorithm",
        &[
            ("Content-Type", "application/json"),
            ("Authorization", &auth),
        ],
        &change.to_string(),
    );
    assert_eq!(status, 200, "PUT algorithm {change}: {body}");
}

/// A warm-up for the load figures, then 300 requests from 16 concurrent clients.
fn measure(client: &flowgate_testbed::Host, algorithm: &str) -> Round {
    let url = format!("http://{VIP}/");
    let _ = load(client, &url, &["--requests", "50", "--concurrency", "16"]);
    let r = load(client, &url, &["--requests", "300", "--concurrency", "16"]);
    let round = Round {
        slow: r["per_backend"]["slow"].as_u64().unwrap_or(0),
        failed: r["failed"].as_u64().unwrap_or(u64::MAX),
        p99: r["latency_ms"]["p99"].as_f64().unwrap_or(f64::MAX),
        report: r,
    };
    println!(
        "{algorithm:>20}: slow share {:5.1}%  p99 {:7.1} ms  {:7.1} req/s  failed {}",
        round.slow as f64 / 3.0,
        round.p99,
        round.report["achieved_rate"].as_f64().unwrap_or(0.0),
        round.failed
    );
    round
}

/// The median round's p99.
fn median_p99(rounds: &[Round]) -> f64 {
    let mut v: Vec<f64> = rounds.iter().map(|r| r.p99).collect();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
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
    let leg = root_leg(&p, &t.bridges[0]);
    let backends: Vec<_> = t.hosts[1..].iter().map(|h| h.ip()).collect();
    let listen = LISTEN_ANY.replacen("[api]\n", &format!("[api]\ntoken = \"{TOKEN}\"\n"), 1);
    let cfg = format!(
        "{listen}[[service]]\nname = \"web\"\nvip = \"{VIP}\"\nport = 80\nalgorithm = \"round-robin\"\n{}",
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
    let _leg = root_leg(&p, &t.bridges[0]);
    let backends: Vec<_> = t.hosts[1..].iter().map(|h| h.ip()).collect();
    let listen = LISTEN_ANY.replacen("[api]\n", &format!("[api]\ntoken = \"{TOKEN}\"\n"), 1);
    let cfg = format!(
        "{listen}[[service]]\nname = \"web\"\nvip = \"{VIP}\"\nport = 80\nalgorithm = \"round-robin\"\n[service.health]\nkind = \"tcp\"\n[service.metrics]\ninterval_ms = 250\n{}",
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

/// Three `flowgate httpd` backends behind the VIP on one switch, by round robin with
/// `extra` in the config, and a client: the controller started as `name`, its backends
/// ready. The topology and the servers last as long as the value; its fields drop in
/// order, the controller first and the topology last, as a test's locals would.
struct ThreeBackends {
    ctl: Ctl,
    _servers: Vec<flowgate_testbed::ProcGuard>,
    t: flowgate_testbed::topo::Topology,
}

impl ThreeBackends {
    fn start(prefix: &str, name: &str, extra: &str) -> ThreeBackends {
        let t = topo::single(&TopoOptions::new(prefix), 4).expect("topology");
        let (ctl, _servers) = serve(&t, name, extra);
        ThreeBackends { ctl, _servers, t }
    }

    /// The API's service once backend `i` is ejected (within 20 s; `what` names the
    /// wait in its failure).
    fn once_ejected(&self, i: usize, what: &str) -> serde_json::Value {
        let services = || self.ctl.get_json("/api/v1/services")[0].clone();
        wait_until_explained(
            what,
            Duration::from_secs(20),
            || services()["backends"][i]["ejected"] == true,
            || format!("{}\n{}", services(), self.ctl.log()),
        );
        services()
    }

    /// The client's 30 requests to `url`, six at a time, each given up after `timeout_ms`:
    /// the load's report.
    fn thirty_requests(&self, url: &str, timeout_ms: u64) -> serde_json::Value {
        let timeout = timeout_ms.to_string();
        load(
            &self.t.hosts[0],
            url,
            &[
                "--requests",
                "30",
                "--concurrency",
                "6",
                "--timeout-ms",
                &timeout,
            ],
        )
    }

    /// Backend `i` answers nothing (see [`silence`]).
    fn silence(&self, i: usize) {
        silence(&self.t.hosts[i + 1], &self.t.hosts[0]);
    }

    /// The two backends still in (the third ejected) serve 30 new requests, every one.
    fn the_others_serve_all(&self, url: &str) {
        let r = load(
            &self.t.hosts[0],
            url,
            &["--requests", "30", "--concurrency", "3"],
        );
        assert_eq!(
            r["ok"], 30,
            "the two answering backends serve them all: {r}"
        );
        self.ctl.assert_no_openflow_errors();
    }
}

/// A web server on each of `t`'s hosts but the first (the client), and a controller of
/// every bridge, balancing them round robin behind [`VIP`] (`extra`: the service's
/// further settings), once it has found them.
fn serve(t: &topo::Topology, name: &str, extra: &str) -> (Ctl, Vec<flowgate_testbed::ProcGuard>) {
    let backends = &t.hosts[1..];
    let ips: Vec<_> = backends.iter().map(|h| h.ip()).collect();
    let servers = backends
        .iter()
        .enumerate()
        .map(|(i, h)| httpd(h, &format!("b{i}"), &[]))
        .collect();
    let ctl = Ctl::start(name, &vip_config(VIP, "round-robin", &ips, extra));
    ctl.control(&t.bridges);
    ctl.wait_backends_ready(Duration::from_secs(20));
    (ctl, servers)
}

/// `backend` answers nothing to `client`: a blackhole route to the client in its
/// namespace loses its SYN-ACKs.
fn silence(backend: &flowgate_testbed::Host, client: &flowgate_testbed::Host) {
    backend
        .exec_checked(&[
            "ip",
            "route",
            "add",
            "blackhole",
            &format!("{}/32", client.ip()),
        ])
        .expect("blackhole route");
}

/// A backend that drops some of its connections and answers the others (an nftables rule
/// in its namespace drops every packet it sends to a client port with bit 1 set: about
/// half the clients' connections, SYN-ACK and its retransmissions alike) never fails five
/// in a row in the order the connections were made: its silences are excused as
/// answered later. The failure-percentage detector judges its share of unanswered
/// connections instead, at the end of an interval, and ejects it; the two backends that
/// answer everything stay in and serve every request after. The consecutive detector is
/// off here, so that a run of five silences at the load's end (no later connection
/// answered) cannot eject it first.
#[test]
fn ovs_a_backend_that_drops_half_its_connections_is_ejected_by_its_failure_share() {
    let Some(p) =
        setup("ovs_a_backend_that_drops_half_its_connections_is_ejected_by_its_failure_share")
    else {
        return;
    };
    let outlier = "idle_timeout_secs = 2\n[service.outlier]\nconsecutive_failures = 0\n\
                   interval_ms = 3000\nfailure_percentage_threshold = 30\n\
                   failure_percentage_minimum_hosts = 3\nfailure_percentage_request_volume = 5\n";
    let three = ThreeBackends::start(p.as_str(), "drop-half", outlier);
    let (client, ctl) = (&three.t.hosts[0], &three.ctl);
    let dropper = &three.t.hosts[3];
    for argv in [
        &["nft", "add", "table", "inet", "drop_half"][..],
        &[
            "nft",
            "add",
            "chain",
            "inet",
            "drop_half",
            "out",
            "{ type filter hook output priority 0; policy accept; }",
        ],
        &[
            "nft",
            "add",
            "rule",
            "inet",
            "drop_half",
            "out",
            "tcp",
            "sport",
            "80",
            "tcp",
            "dport",
            "&",
            "2",
            "==",
            "2",
            "drop",
        ],
    ] {
        dropper
            .exec_checked(argv)
            .expect("nft rule in the backend's namespace");
    }
    let url = format!("http://{VIP}/");
    let r = load(
        client,
        &url,
        &[
            "--requests",
            "90",
            "--concurrency",
            "3",
            "--timeout-ms",
            "700",
        ],
    );
    let failed = 90 - r["ok"].as_u64().unwrap_or(0);
    assert!(
        failed >= 5,
        "the dropping backend lost some connections: {r}"
    );
    let s = three.once_ejected(2, "the dropping backend's ejection");
    assert_eq!(s["backends"][2]["ejected_by"], "failure_percentage", "{s}");
    for b in &s["backends"].as_array().expect("backends")[..2] {
        assert_eq!(b["ejected"], false, "it answers every connection: {s}");
        assert_eq!(b["connections_unanswered_total"], 0, "{s}");
        assert!(b["connections_answered_total"].as_u64() > Some(0), "{s}");
    }
    let dropper_judged = &s["backends"][2];
    assert!(
        dropper_judged["connections_unanswered_total"].as_u64() >= Some(5),
        "{s}"
    );
    assert_eq!(
        s["counters"]["ejections_by"]["failure_percentage"], 1,
        "{s}"
    );
    assert_eq!(s["counters"]["ejections_by"]["consecutive"], 0, "{s}");
    let (_, body) = ctl.get("/metrics");
    let by = |d: &str| {
        metric_labelled(
            &body,
            "flowgate_service_ejections_by_detector_total",
            &format!("service=\"web\",detector=\"{d}\""),
        )
    };
    assert_eq!(by("failure_percentage"), Some(1.0), "{body}");
    // Its silences came between its answers: the consecutive detector, were it on,
    // would have excused them.
    let excused = metric_labelled(
        &body,
        "flowgate_outlier_silences_excused_total",
        "reason=\"answered_later\"",
    );
    assert!(excused.is_some_and(|n| n >= 1.0), "{body}");
    // Ejected, it takes no new connection: every request is answered.
    three.the_others_serve_all(&url);
}

/// A backend whose answers are all lost (a blackhole route to the client in its
/// namespace) is ejected at its clients' second retransmitted SYNs, 3 s after their first,
/// which Open vSwitch sends up to the controller (the connection's forward rule matches no
/// SYN): long before the rules of its silent connections idle out (60 s here), which was
/// the first that passive outlier detection heard of them before stop 59.
#[test]
fn ovs_a_silent_backend_is_ejected_at_its_clients_second_syns() {
    let Some(p) = setup("ovs_a_silent_backend_is_ejected_at_its_clients_second_syns") else {
        return;
    };
    // Without redispatch, so that the silent backend's clients time out.
    let three = ThreeBackends::start(
        p.as_str(),
        "silent-syn",
        "idle_timeout_secs = 60\nredispatch = false\n",
    );
    let ctl = &three.ctl;
    three.silence(1);
    let url = format!("http://{VIP}/");
    let started = std::time::Instant::now();
    // Each of the silent backend's connections waits 4 s: its client's SYN goes again
    // after 1 s and 3 s.
    let r = three.thirty_requests(&url, 4000);
    assert!(
        r["ok"].as_u64() < Some(30),
        "the silent backend lost some: {r}"
    );
    let s = three.once_ejected(1, "the silent backend's ejection");
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(45),
        "ejected before any rule idled out: {took:?}"
    );
    assert_eq!(s["backends"][1]["ejected_by"], "consecutive", "{s}");
    for i in [0, 2] {
        assert_eq!(s["backends"][i]["ejected"], false, "{s}");
        assert_eq!(s["backends"][i]["connections_unanswered_total"], 0, "{s}");
    }
    let (_, body) = ctl.get("/metrics");
    let early = metric(&body, "flowgate_outlier_silences_at_syn_retry_total");
    assert!(early.is_some_and(|n| n >= 5.0), "{body}");
    // Ejected, it takes no new connection: every request is answered.
    three.the_others_serve_all(&url);
}

/// A backend that answers nothing (a blackhole route to the client in its namespace), its
/// connections redispatched: each of its clients' SYNs sent again 3 s after the first
/// goes to another backend, which answers, so every request is served, the silent
/// backend's in about 3 s. Outlier detection is off, so the silent backend keeps its
/// turn, and every connection it got is moved.
#[test]
fn ovs_a_silent_backends_connections_are_redispatched_and_served() {
    let Some(p) = setup("ovs_a_silent_backends_connections_are_redispatched_and_served") else {
        return;
    };
    let three = ThreeBackends::start(
        p.as_str(),
        "redispatch",
        "idle_timeout_secs = 60\n[service.outlier]\nconsecutive_failures = 0\nsuccess_rate = false\n",
    );
    let ctl = &three.ctl;
    three.silence(1);
    let url = format!("http://{VIP}/");
    let r = three.thirty_requests(&url, 6000);
    assert_eq!(r["ok"], 30, "every request served: {r}");
    let s = ctl.get_json("/api/v1/services")[0].clone();
    let moved = s["counters"]["redispatched"].as_u64().unwrap_or(0);
    assert!(moved >= 5, "{s}");
    assert_eq!(
        Some(moved),
        s["backends"][1]["connections_total"].as_u64(),
        "each of the silent backend's connections moved: {s}"
    );
    assert_eq!(s["backends"][1]["ejected"], false, "{s}");
    let (_, body) = ctl.get("/metrics");
    assert_eq!(
        metric(
            &body,
            "flowgate_service_redispatched_total{service=\"web\"}"
        ),
        Some(moved as f64),
        "{body}"
    );
    ctl.assert_no_openflow_errors();
}

/// Redispatch across three switches in a line (the client on the first, the backends on
/// the second and the third, the third silent): every request is served, and no
/// connection rule on any switch names the silent backend after the load, though the
/// rules idle out only after 60 s: each move removed its old path's rules, on the
/// switches past the client's too.
#[test]
fn ovs_a_redispatched_connection_leaves_no_rule_of_its_old_path() {
    let Some(p) = setup("ovs_a_redispatched_connection_leaves_no_rule_of_its_old_path") else {
        return;
    };
    let t = topo::linear(&TopoOptions::new(p.as_str()), 3, 1).expect("topology");
    let (client, silent) = (&t.hosts[0], &t.hosts[2]);
    let (ctl, _servers) = serve(
        &t,
        "redispatch-line",
        "idle_timeout_secs = 60\n[service.outlier]\nconsecutive_failures = 0\nsuccess_rate = false\n",
    );
    silence(silent, client);
    let r = load(
        client,
        &format!("http://{VIP}/"),
        &[
            "--requests",
            "10",
            "--concurrency",
            "2",
            "--timeout-ms",
            "6000",
        ],
    );
    assert_eq!(r["ok"], 10, "every request served: {r}");
    let s = ctl.get_json("/api/v1/services")[0].clone();
    let moved = s["counters"]["redispatched"].as_u64().unwrap_or(0);
    assert!(moved >= 3, "{s}");
    let flows: String = t
        .bridges
        .iter()
        .map(|b| b.dump_flows().unwrap_or_default())
        .collect();
    let ip = silent.ip();
    let naming: Vec<&str> = flows
        .lines()
        .filter(|l| l.contains("priority=300,"))
        .filter(|l| l.contains(&format!("nw_src={ip},")) || l.contains(&format!("nw_dst={ip},")))
        .collect();
    assert!(naming.is_empty(), "rules of old paths left: {naming:#?}");
    let serving = t.hosts[1].ip();
    assert!(
        flows
            .lines()
            .any(|l| l.contains(&format!("nw_dst={serving},"))),
        "the new paths' rules are there: {flows}"
    );
    ctl.assert_no_openflow_errors();
}

/// A service's one backend is ejected by passive outlier detection after five
/// connections whose answers were lost (a blackhole route in the backend's namespace:
/// its SYN-ACKs never reach the switch, as those a switch that falls behind loses). With
/// the default panic threshold the pool is then in panic and the backend still takes new
/// connections, so the service answers as soon as the answers get through again; with
/// `panic_threshold_percent = 0` the controller turns every new connection away for the
/// ejection's 30 s, the backend answering or not.
#[test]
fn ovs_a_lone_ejected_backend_serves_as_soon_as_it_is_back() {
    let Some(p) = setup("ovs_a_lone_ejected_backend_serves_as_soon_as_it_is_back") else {
        return;
    };
    let t = topo::single(&TopoOptions::new(p.as_str()), 2).expect("topology");
    let (client, backend) = (&t.hosts[0], &t.hosts[1]);
    let to_client = format!("{}/32", client.ip());
    let answers = |on: bool| {
        let verb = if on { "del" } else { "add" };
        backend
            .exec_checked(&["ip", "route", verb, "blackhole", &to_client])
            .expect("blackhole route");
    };
    let url = format!("http://{VIP}/");
    let _server = httpd(backend, "b", &[]);
    for (extra, panics) in [("", true), ("panic_threshold_percent = 0\n", false)] {
        // Unanswered connections' reverse rules go after 2 s idle, each a verdict.
        let cfg = vip_config(VIP, "round-robin", &[backend.ip()], "idle_timeout_secs = 2")
            .replacen("kind = \"none\"\n", &format!("kind = \"none\"\n{extra}"), 1);
        let ctl = Ctl::start(if panics { "lone" } else { "lone-no-panic" }, &cfg);
        ctl.control(&t.bridges[..1]);
        ctl.wait_backends_ready(Duration::from_secs(20));
        answers(false);
        let r = load(
            client,
            &url,
            &[
                "--requests",
                "5",
                "--concurrency",
                "5",
                "--timeout-ms",
                "1500",
            ],
        );
        assert_eq!(r["ok"], 0, "the backend's answers are lost: {r}");
        let lone = |ctl: &Ctl| ctl.get_json("/api/v1/services")[0].clone();
        wait_until_explained(
            "the backend's ejection",
            Duration::from_secs(15),
            || lone(&ctl)["backends"][0]["ejected"] == true,
            || format!("{}\n{}", lone(&ctl), ctl.log()),
        );
        answers(true);
        let s = lone(&ctl);
        assert_eq!(s["panic"], panics, "{extra:?}: {s}");
        assert_eq!(s["backends"][0]["eligible"], panics, "{extra:?}: {s}");
        let r = load(client, &url, &["--requests", "20", "--concurrency", "2"]);
        let served = if panics { 20 } else { 0 };
        assert_eq!(
            r["ok"], served,
            "{extra:?}: the answers get through again: {r}"
        );
        let (_, body) = ctl.get("/metrics");
        let web = |name: &str| metric_labelled(&body, name, "service=\"web\"");
        assert_eq!(web("flowgate_service_ejections_total"), Some(1.0), "{body}");
        let panicked = if panics { 1.0 } else { 0.0 };
        assert_eq!(web("flowgate_service_panics_total"), Some(panicked));
        assert_eq!(web("flowgate_service_panic"), Some(panicked));
        // The five silences were judged: the switch was never behind, and the backend
        // answered nothing decided after them.
        for reason in ["switch_behind", "answered_later"] {
            let label = format!("reason=\"{reason}\"");
            assert_eq!(
                metric_labelled(&body, "flowgate_outlier_silences_excused_total", &label),
                Some(0.0),
                "{reason}: {body}"
            );
        }
        // The switch's control channel is probed (every 125 ms, for those verdicts), and
        // an idle Open vSwitch answers far inside the limit.
        let switches = ctl.get_json("/api/v1/switches");
        let rtt = switches[0]["channel_rtt_ms"].as_f64();
        assert!(rtt.is_some_and(|ms| ms > 0.0 && ms < 250.0), "{switches}");
        ctl.assert_no_openflow_errors();
    }
}
