//! The distributed modes end to end: real etcd (started here, on free loopback ports, with
//! temporary data dirs; a three-member cluster for the failover tests), real `flowgate`
//! processes as domain and global controllers, real Open vSwitch for the domain tests.
//! docs/distributed.md describes the design these tests check.

mod support;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use flowgate_coord::process::{EtcdCluster, etcd_available};
use flowgate_coord::{Store, keys};
use flowgate_testbed::topo::{self, TopoOptions};
use flowgate_testbed::{Prefix, cleanup_stale, require_root_ovs};
use support::*;

const VIP: &str = "10.0.0.100";

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn need_etcd(test: &str) -> bool {
    if etcd_available() {
        return true;
    }
    eprintln!("SKIP {test}: no etcd binary (apt-get install etcd-server etcd-client)");
    false
}

fn cluster_section(
    role: &str,
    cluster: &str,
    instance: &str,
    domain: Option<(&str, &[u64])>,
    etcd: &EtcdCluster,
) -> String {
    let mut s = format!(
        "\n[cluster]\nrole = \"{role}\"\nname = \"{cluster}\"\ninstance = \"{instance}\"\netcd = {}\nlease_ttl_ms = 2000\nsummary_interval_ms = 200\n",
        etcd.toml_endpoints()
    );
    if let Some((d, dpids)) = domain {
        let list: Vec<String> = dpids.iter().map(|d| format!("\"{d:016x}\"")).collect();
        s += &format!("domain = \"{d}\"\ndpids = [{}]\n", list.join(", "));
    }
    s
}

fn cluster_view(ctl: &Ctl) -> serde_json::Value {
    ctl.get_json("/api/v1/cluster")
}

fn wait_mastership(ctl: &Ctl, want: &str, timeout: Duration) {
    wait_until(&format!("mastership {want}"), timeout, || {
        cluster_view(ctl)["mastership"] == want
    });
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

fn store(etcd: &EtcdCluster, rt: &tokio::runtime::Runtime) -> flowgate_coord::etcd::EtcdStore {
    rt.block_on(flowgate_coord::etcd::EtcdStore::connect(
        &etcd.endpoints(),
        Duration::from_secs(2),
    ))
    .expect("connect to etcd")
}

fn summary(load: f64, capacity: f64, healthy: u64, backends: &[&str]) -> String {
    serde_json::json!({
        "services": { "web": {
            "backends": healthy, "healthy": healthy, "load_rps": load,
            "active_connections": 0, "capacity_rps": capacity, "local_backends": backends,
        }}
    })
    .to_string()
}

/// Two global controllers: one active, one standby. The active one turns an overloaded
/// domain's summary into a spill decision (weighted by the others' spare capacity), and
/// when it is killed (SIGKILL) the standby takes over within 3 s and keeps deciding.
#[test]
fn global_active_standby_failover_and_spill() {
    if !need_etcd("global_active_standby_failover_and_spill") {
        return;
    }
    let etcd = EtcdCluster::start("global", 3).expect("etcd cluster");
    let base = "[openflow]\nlisten = \"127.0.0.1:0\"\n[api]\nlisten = \"127.0.0.1:0\"\n";
    let mut g1 = Ctl::start(
        "g1",
        &(base.to_string() + &cluster_section("global", "gt", "g1", None, &etcd)),
    );
    wait_mastership(&g1, "master", Duration::from_secs(10));
    let g2 = Ctl::start(
        "g2",
        &(base.to_string() + &cluster_section("global", "gt", "g2", None, &etcd)),
    );
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        cluster_view(&g2)["mastership"],
        "standby",
        "{}",
        cluster_view(&g2)
    );

    // Domain summaries as domain masters write them: d1 is overloaded, d2 and d3 are not.
    let rt = runtime();
    let st = store(&etcd, &rt);
    let put = |d: &str, v: String| {
        rt.block_on(st.put(keys::domain_summary("gt", d), v.into_bytes(), None))
            .expect("put summary");
    };
    put("d2", summary(20.0, 100.0, 1, &["10.0.0.12"]));
    put("d3", summary(60.0, 100.0, 1, &["10.0.0.13"]));
    let t0 = Instant::now();
    put("d1", summary(200.0, 100.0, 1, &["10.0.0.11"]));
    let spill_of = |d: &str| -> serde_json::Value {
        rt.block_on(st.get(keys::spill("gt", d)))
            .expect("get spill")
            .and_then(|kv| serde_json::from_slice(&kv.value).ok())
            .unwrap_or(serde_json::Value::Null)
    };
    wait_until("d1's spill decision", Duration::from_secs(5), || {
        !spill_of("d1")["services"]["web"].is_null()
    });
    let decided_in = t0.elapsed();
    let d1 = spill_of("d1");
    let web = &d1["services"]["web"];
    assert_eq!(web["fraction"], 0.5, "{d1}");
    assert_eq!(web["targets"]["d2"]["weight"], 0.667, "{d1}");
    assert_eq!(web["targets"]["d3"]["weight"], 0.333, "{d1}");
    assert!(
        spill_of("d2")["services"]
            .as_object()
            .is_some_and(|m| m.is_empty())
    );
    eprintln!("MEASURE global spill decision written {decided_in:?} after the overloaded summary");

    // Hysteresis: d1 falls below its threshold but not below the exit one (0.8): it keeps
    // spilling, at the minimum fraction.
    put("d1", summary(90.0, 100.0, 1, &["10.0.0.11"]));
    wait_until("d1 spills 10 %", Duration::from_secs(5), || {
        spill_of("d1")["services"]["web"]["fraction"] == 0.1
    });

    // Kill the active global controller; the standby takes over.
    let killed_at = unix_ms();
    let t = Instant::now();
    g1.kill();
    wait_mastership(&g2, "master", Duration::from_secs(10));
    let takeover = t.elapsed();
    let since = cluster_view(&g2)["leader_since_unix_ms"]
        .as_u64()
        .unwrap_or(0);
    eprintln!(
        "MEASURE global failover: standby active {} ms after SIGKILL (observed by polling in {takeover:?})",
        since.saturating_sub(killed_at)
    );
    assert!(
        since.saturating_sub(killed_at) < 3000,
        "took {} ms",
        since.saturating_sub(killed_at)
    );

    // It starts from the decisions in force: d1 (in the hysteresis band, where a fresh
    // decision would not start a spill) keeps spilling.
    std::thread::sleep(Duration::from_millis(1000));
    assert_eq!(
        spill_of("d1")["services"]["web"]["fraction"],
        0.1,
        "the failover reset d1's spill: {}",
        spill_of("d1")
    );

    // The new active controller decides: d3 becomes overloaded too, and d2 gains room.
    put("d2", summary(20.0, 400.0, 1, &["10.0.0.12"]));
    put("d3", summary(150.0, 100.0, 1, &["10.0.0.13"]));
    wait_until("d3's spill decision by g2", Duration::from_secs(5), || {
        !spill_of("d3")["services"]["web"].is_null()
    });
    let d1 = spill_of("d1");
    assert!(
        d1["services"]["web"]["targets"].get("d3").is_none(),
        "d3 is full now: {d1}"
    );
    // Both spill into d2, within its spare capacity (380 rps): accounted, not doubled.
    let d3 = spill_of("d3");
    let into_d2 = |d: &serde_json::Value, load: f64| {
        d["services"]["web"]["fraction"].as_f64().unwrap_or(0.0)
            * load
            * d["services"]["web"]["targets"]["d2"]["weight"]
                .as_f64()
                .unwrap_or(0.0)
    };
    let total = into_d2(&d1, 90.0) + into_d2(&d3, 150.0);
    assert!(
        total > 0.0 && total <= 381.0,
        "d2 gets {total} rps: {d1} {d3}"
    );
    wait_until("the API shows g2 active", Duration::from_secs(5), || {
        cluster_view(&g2)["cluster"]["global"]["active"] == "g2"
    });
}

/// Fences a stale leader at the store: a fenced write with a deposed leadership fails,
/// through the same etcd a domain would use (covered in detail by flowgate-coord's tests).
#[test]
fn etcd_fenced_write_of_a_stale_leader_fails() {
    if !need_etcd("etcd_fenced_write_of_a_stale_leader_fails") {
        return;
    }
    let etcd = EtcdCluster::start("fence", 1).expect("etcd");
    let rt = runtime();
    let st = store(&etcd, &rt);
    rt.block_on(async {
        flowgate_coord::conformance::run(&st, "/fence")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    });
}

struct Domain {
    topo: flowgate_testbed::topo::Topology,
    a: Ctl,
    b: Ctl,
    _servers: Vec<flowgate_testbed::ProcGuard>,
}

/// One domain of two switches (client h1 on s1, backends h2 and h3 on s2), two domain
/// controller instances: `a` elected first (master), `b` standby.
fn domain(test: &str, etcd: &EtcdCluster) -> Domain {
    let p = Prefix::for_test(test);
    cleanup_stale(p.as_str()).expect("clean leftovers");
    let t = topo::linear(&TopoOptions::new(p.as_str()), 2, 1).expect("topology");
    // A third host next to s2.
    let h3 = flowgate_testbed::Host::create(
        p.as_str(),
        "h3",
        "10.0.0.3/24",
        &t.bridges[1],
        Some("00:00:00:00:00:03"),
    )
    .expect("h3");
    let backends = [t.hosts[1].ip(), h3.ip()];
    let dpids = [t.bridges[0].dpid(), t.bridges[1].dpid()];
    let cfg = |inst: &str| {
        vip_config(VIP, "round-robin", &backends, "")
            + &cluster_section("domain", "dt", inst, Some(("d1", &dpids)), etcd)
    };
    let a = Ctl::start(&format!("{test}-a"), &cfg("d1a"));
    wait_mastership(&a, "master", Duration::from_secs(10));
    let b = Ctl::start(&format!("{test}-b"), &cfg("d1b"));
    for br in &t.bridges {
        br.set_controller(&[a.target(), b.target()])
            .expect("set controllers");
    }
    let all_roles = |c: &Ctl, role: &str| {
        let v = cluster_view(c);
        dpids
            .iter()
            .all(|d| v["switches"][format!("{d:016x}")]["role"] == role)
    };
    wait_until("a masters both switches", Duration::from_secs(15), || {
        all_roles(&a, "master")
    });
    wait_until(
        "b is slave on both switches",
        Duration::from_secs(15),
        || all_roles(&b, "slave"),
    );
    let mut servers = vec![httpd(&t.hosts[1], "b2", &[])];
    servers.push(httpd(&h3, "b3", &[]));
    a.wait_backends_ready(Duration::from_secs(20));
    let mut topo = t;
    topo.hosts.push(h3);
    Domain {
        topo,
        a,
        b,
        _servers: servers,
    }
}

/// A domain's master is killed (SIGKILL): the standby masters both switches within 3 s,
/// with a higher generation_id; established (keep-alive) connections carry on and new
/// connections are served throughout.
#[test]
fn ovs_domain_master_failover() {
    let test = "ovs_domain_master_failover";
    if !require_root_ovs(test) || !need_etcd(test) {
        return;
    }
    let etcd = EtcdCluster::start("domfail", 3).expect("etcd cluster");
    let mut d = domain(test, &etcd);
    let client = &d.topo.hosts[0];
    let warm = load(
        client,
        &format!("http://{VIP}/"),
        &["--requests", "50", "--concurrency", "2"],
    );
    assert_eq!(warm["ok"], 50, "{warm}");
    let gen_a = cluster_view(&d.a)["generation_id"].as_u64().unwrap_or(0);
    assert!(gen_a > 0);
    // The standby keeps a warm view: it knows the switches and their connections.
    let b_switches = d.b.get_json("/api/v1/switches");
    assert_eq!(b_switches.as_array().map(Vec::len), Some(2), "{b_switches}");

    // A standby that started after the hosts were learned (restarted here) has heard of
    // none of them: their traffic is carried by the switches' rules, and the TCP that
    // comes up to it is the master's. Promoted, it must still keep the switches' L2
    // rules through its reconnect grace (read back from the switches, and the silent
    // hosts adopted where the rules place them): every dump shows all of them.
    d.b.restart();
    let slave_on_both = |c: &Ctl| {
        cluster_view(c)["switches"]
            .as_object()
            .is_some_and(|m| m.len() == 2 && m.values().all(|s| s["role"] == "slave"))
    };
    wait_until(
        "the restarted standby is SLAVE on both switches",
        Duration::from_secs(15),
        || slave_on_both(&d.b),
    );
    let hosts_known = |c: &Ctl| metric(&c.get("/metrics").1, "flowgate_hosts").unwrap_or(-1.0);
    eprintln!(
        "MEASURE hosts known before the failover: master {}, restarted standby {}",
        hosts_known(&d.a),
        hosts_known(&d.b)
    );
    let l2 = |flows: &str| vec![l2_rules(flows)];
    let watches: Vec<_> = d
        .topo
        .bridges
        .iter()
        .map(|br| {
            let full = l2(&br.dump_flows().expect("dump-flows"));
            assert!(
                full[0] >= 3,
                "{}: the three hosts' L2 rules: {full:?}",
                br.name()
            );
            (
                br.name().to_string(),
                full.clone(),
                RuleWatch::start(br.name(), full, l2),
            )
        })
        .collect();

    let url = format!("http://{VIP}/");
    let (kept, fresh, killed_at) = std::thread::scope(|s| {
        // Established connections: two keep-alive connections (closed loop), opened
        // before the kill and used back to back across it.
        let kept = s.spawn(|| keepalive_load(client, &url, 2, 6, 8000));
        // New connections all along (a SYN lost in the failover window is retransmitted).
        let fresh = s.spawn(|| {
            load(
                client,
                &url,
                &[
                    "--concurrency",
                    "2",
                    "--rate",
                    "10",
                    "--requests",
                    "80",
                    "--duration-secs",
                    "8",
                    "--timeout-ms",
                    "9000",
                ],
            )
        });
        std::thread::sleep(Duration::from_millis(1500));
        let killed_at = unix_ms();
        d.a.kill();
        (
            kept.join().expect("kept"),
            fresh.join().expect("fresh"),
            killed_at,
        )
    });
    let v = cluster_view(&d.b);
    assert_eq!(v["mastership"], "master", "{v}");
    let mut worst = 0;
    for (dpid, s) in v["switches"].as_object().expect("switches") {
        assert_eq!(s["role"], "master", "{dpid}: {v}");
        let took = s["since_unix_ms"]
            .as_u64()
            .unwrap_or(u64::MAX)
            .saturating_sub(killed_at);
        worst = worst.max(took);
    }
    let gen_b = v["generation_id"].as_u64().unwrap_or(0);
    eprintln!(
        "MEASURE domain failover: standby MASTER on every switch {worst} ms after SIGKILL (generation {gen_a} -> {gen_b})"
    );
    assert!(worst < 3000, "failover took {worst} ms: {v}");
    assert!(
        gen_b > gen_a,
        "generation must increase: {gen_a} -> {gen_b}"
    );
    assert!(
        kept["failed"] == 0 && kept["ok"] == kept["sent"],
        "every request served: {kept}"
    );
    assert!(
        fresh["failed"] == 0 && fresh["ok"] == fresh["sent"],
        "new connections all served: {fresh}"
    );
    let (_, m) = d.b.get("/metrics");
    let of_web = |name: &str| metric_labelled(&m, name, "service=\"web\"").unwrap_or(-1.0);
    let (held, answered) = (
        of_web("flowgate_service_held_settling_total"),
        of_web("flowgate_service_held_answered_total"),
    );
    eprintln!(
        "MEASURE new master's SYNs held before it found the backends: {held}, answered once it had (not sent again): {answered}, refused: {}",
        of_web("flowgate_service_refused_total")
    );
    // A held SYN is answered once its backend is found, within its client's RTO (or,
    // rarely, the client's retransmission comes first and is served instead).
    assert!(
        answered <= held && (held == 0.0 || answered >= 1.0),
        "{held} held, {answered} answered without a retransmission"
    );
    eprintln!(
        "MEASURE during failover: {} + {} requests, 0 failed, worst latency {} ms / {} ms (a SYN lost in the window is retransmitted)",
        kept["ok"], fresh["ok"], kept["latency_ms"]["max"], fresh["latency_ms"]["max"]
    );
    // Past the grace (3 s by default) of the last switch b took over.
    let promoted = killed_at + worst;
    std::thread::sleep(Duration::from_millis(
        (promoted + 3500).saturating_sub(unix_ms()),
    ));
    for (bridge, full, watch) in watches {
        let w = watch.stop();
        eprintln!("MEASURE L2 rules of {bridge} across the failover, from {full:?}: {w:?}");
        assert!(
            w.dumps >= 20,
            "{bridge}: the watch dumped {} times",
            w.dumps
        );
        assert_eq!(
            w.fewest, full,
            "{bridge}: L2 rules in the fewest of {} dumps across the failover",
            w.dumps
        );
    }
    let after = load(client, &url, &["--requests", "50", "--concurrency", "2"]);
    assert_eq!(after["ok"], 50, "{after}");
    // The old master comes back (a new process, same ports): without the leadership it
    // is a standby, SLAVE at b's generation on both switches, and b stays master.
    d.a.restart();
    wait_until(
        "the old master rejoins as SLAVE",
        Duration::from_secs(15),
        || cluster_view(&d.a)["mastership"] == "standby" && slave_on_both(&d.a),
    );
    assert_eq!(cluster_view(&d.b)["mastership"], "master");
    let again = load(client, &url, &["--requests", "20", "--concurrency", "2"]);
    assert_eq!(again["ok"], 20, "{again}");
    d.b.assert_no_openflow_errors();
    d.a.assert_no_openflow_errors();
}

/// The old master, frozen (SIGSTOP) while the standby takes over, is thawed still
/// believing it leads: the switches refuse it (role-status / IS_SLAVE, the higher
/// generation_id fences it), the store refuses its fenced writes, it changes no flow and
/// rejoins as a standby.
#[test]
fn ovs_stale_master_is_fenced() {
    let test = "ovs_stale_master_is_fenced";
    if !require_root_ovs(test) || !need_etcd(test) {
        return;
    }
    let etcd = EtcdCluster::start("stale", 3).expect("etcd cluster");
    let d = domain(test, &etcd);
    let client = &d.topo.hosts[0];
    let url = format!("http://{VIP}/");
    assert_eq!(load(client, &url, &["--requests", "20"])["ok"], 20);
    let pid = d.a.pid();
    let stopped_at = unix_ms();
    signal(pid, "STOP");
    wait_until("b masters the domain", Duration::from_secs(8), || {
        let v = cluster_view(&d.b);
        v["switches"]
            .as_object()
            .is_some_and(|m| m.values().all(|s| s["role"] == "master"))
    });
    eprintln!(
        "MEASURE stale-master scenario: b MASTER {} ms after a froze",
        unix_ms() - stopped_at
    );
    assert_eq!(load(client, &url, &["--requests", "20"])["ok"], 20);
    signal(pid, "CONT");
    // a wakes up: its timers fire (LLDP packet-outs, ...) before it learns anything.
    wait_until(
        "a notices it is no longer master",
        Duration::from_secs(10),
        || {
            let v = cluster_view(&d.a);
            v["switches"]
                .as_object()
                .is_some_and(|m| m.values().all(|s| s["role"] != "master"))
        },
    );
    std::thread::sleep(Duration::from_millis(1500));
    let va = cluster_view(&d.a);
    eprintln!("stale master after thaw: {va}");
    assert!(
        va["counters"]["switch_refusals"].as_u64().unwrap_or(0) > 0
            || va["counters"]["demotions"].as_u64().unwrap_or(0) > 0,
        "the switches or the store told a it was deposed: {va}"
    );
    wait_mastership(&d.a, "standby", Duration::from_secs(10));
    // Every write a attempted after the thaw was refused by the switches (role-status /
    // IS_SLAVE) or never sent (its sessions stopped being writable at the first refusal).
    assert!(
        va["counters"]["switch_refusals"].as_u64().unwrap_or(0) > 0,
        "{va}"
    );
    let refusals: Vec<String> = va["switches"]
        .as_object()
        .map(|m| m.values().map(|s| s["last_refusal"].to_string()).collect())
        .unwrap_or_default();
    assert!(
        refusals
            .iter()
            .all(|r| r.contains("role-status") || r.contains("IS_SLAVE") || r.contains("STALE")),
        "each switch fenced a by generation: {refusals:?}"
    );
    let a_log = d.a.log_plain();
    assert!(
        a_log.contains("refused us as master"),
        "a logs the switches' refusal:\n{a_log}"
    );
    d.b.assert_no_openflow_errors();
    let vb = cluster_view(&d.b);
    assert_eq!(vb["mastership"], "master", "b still leads: {vb}");
    assert_eq!(load(client, &url, &["--requests", "20"])["ok"], 20);
    // a is a SLAVE again on both switches, with b's generation.
    wait_until("a is slave again", Duration::from_secs(10), || {
        let v = cluster_view(&d.a);
        v["switches"]
            .as_object()
            .is_some_and(|m| m.values().all(|s| s["role"] == "slave"))
    });
}

/// The switch itself fences a stale generation: a controller that asks for MASTER with a
/// generation_id below the current master's gets ROLE_REQUEST_FAILED/STALE, and a SLAVE's
/// FLOW_MOD gets BAD_REQUEST/IS_SLAVE (OVS 3.1, §6.3.6). Raw OpenFlow from the test.
#[test]
fn ovs_switch_refuses_stale_generation() {
    let test = "ovs_switch_refuses_stale_generation";
    if !require_root_ovs(test) || !need_etcd(test) {
        return;
    }
    let etcd = EtcdCluster::start("raw", 1).expect("etcd");
    let d = domain(test, &etcd);
    let gen_a = cluster_view(&d.a)["generation_id"]
        .as_u64()
        .expect("generation");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let raw = format!("tcp:{}", listener.local_addr().expect("addr"));
    let br = &d.topo.bridges[0];
    br.set_controller(&[d.a.target(), d.b.target(), raw])
        .expect("add the raw controller");
    let (sock, _) = listener.accept().expect("the switch connects");
    sock.set_read_timeout(Some(Duration::from_secs(5))).ok();
    let mut rx = RawOf::new(sock);
    rx.send(1, &ofp::Message::Hello(ofp::Hello::ours()));
    rx.send(2, &ofp::Message::FeaturesRequest);
    rx.until(|m| matches!(m, ofp::Message::FeaturesReply(_)));
    // A stale MASTER request.
    rx.send(
        3,
        &ofp::Message::RoleRequest(ofp::RoleMsg {
            role: ofp::ControllerRole::Master,
            generation_id: gen_a - 1,
        }),
    );
    let e = rx.until(|m| matches!(m, ofp::Message::Error(_) | ofp::Message::RoleReply(_)));
    assert!(
        format!("{e:?}").contains("Stale"),
        "stale MASTER refused: {e:?}"
    );
    // As a SLAVE at the current generation, a FLOW_MOD is refused.
    rx.send(
        4,
        &ofp::Message::RoleRequest(ofp::RoleMsg {
            role: ofp::ControllerRole::Slave,
            generation_id: gen_a,
        }),
    );
    let r = rx.until(|m| matches!(m, ofp::Message::Error(_) | ofp::Message::RoleReply(_)));
    assert!(
        matches!(r, ofp::Message::RoleReply(ref x) if x.role == ofp::ControllerRole::Slave),
        "{r:?}"
    );
    let fm = ofp::FlowMod::add(ofp::Match::new());
    rx.send(5, &ofp::Message::FlowMod(fm));
    rx.send(6, &ofp::Message::BarrierRequest);
    let e = rx.until(|m| matches!(m, ofp::Message::Error(_) | ofp::Message::BarrierReply));
    assert!(
        format!("{e:?}").contains("IsSlave"),
        "a SLAVE's FLOW_MOD is refused: {e:?}"
    );
    br.set_controller(&[d.a.target(), d.b.target()])
        .expect("restore");
}

struct RawOf {
    sock: std::net::TcpStream,
    buf: bytes::BytesMut,
    framer: ofp::Framer,
}

impl RawOf {
    fn new(sock: std::net::TcpStream) -> Self {
        RawOf {
            sock,
            buf: bytes::BytesMut::new(),
            framer: ofp::Framer::new(),
        }
    }
    fn send(&mut self, xid: u32, m: &ofp::Message) {
        use std::io::Write;
        let mut b = bytes::BytesMut::new();
        ofp::encode(xid, m, &mut b).expect("encode");
        self.sock.write_all(&b).expect("send");
    }
    /// Read messages (answering echoes) until one matches.
    fn until(&mut self, f: impl Fn(&ofp::Message) -> bool) -> ofp::Message {
        use std::io::Read;
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            while let Some(frame) = self.framer.next_frame(&mut self.buf).expect("framing") {
                let (xid, m) = ofp::decode(frame).expect("decode");
                if let ofp::Message::EchoRequest(d) = &m {
                    self.send(xid, &ofp::Message::EchoReply(d.clone()));
                    continue;
                }
                if f(&m) {
                    return m;
                }
            }
            assert!(
                Instant::now() < deadline,
                "no matching message from the switch"
            );
            let mut tmp = [0u8; 4096];
            let n = self.sock.read(&mut tmp).expect("read");
            assert!(n > 0, "the switch closed the connection");
            self.buf.extend_from_slice(&tmp[..n]);
        }
    }
}

/// The cost of the distributed mode on a domain's flow setup, in the same run: the same
/// new-connection load through the same two switches, first with a domain master (and a
/// standby, SLAVE), then with a single controller. Reported, and bounded loosely (the
/// store is never on the PACKET_IN path, so a setup's median latency should be close).
#[test]
fn ovs_flow_setup_domain_vs_single() {
    let test = "ovs_flow_setup_domain_vs_single";
    if !require_root_ovs(test) || !need_etcd(test) {
        return;
    }
    let etcd = EtcdCluster::start("setup", 1).expect("etcd");
    let mut d = domain(test, &etcd);
    let client = &d.topo.hosts[0];
    let url = format!("http://{VIP}/");
    let args = [
        "--requests",
        "1000",
        "--concurrency",
        "8",
        "--timeout-ms",
        "5000",
    ];
    let _ = load(client, &url, &["--requests", "50", "--concurrency", "4"]);
    let dom = load(client, &url, &args);
    // A loaded machine (2 cores shared with builds) makes the controller's own overload
    // control shed a few SYNs (retransmitted, or timed out): tolerated up to 2 %, reported.
    let few = |r: &serde_json::Value| r["failed"].as_u64().unwrap_or(u64::MAX) <= 20;
    assert!(few(&dom), "{dom}");
    // The same network under one single-mode controller.
    let backends = [d.topo.hosts[1].ip(), d.topo.hosts[2].ip()];
    let single = Ctl::start(
        &format!("{test}-single"),
        &vip_config(VIP, "round-robin", &backends, ""),
    );
    d.a.kill();
    d.b.kill();
    for br in &d.topo.bridges {
        br.set_controller(&[single.target()])
            .expect("set controller");
    }
    for br in &d.topo.bridges {
        br.wait_connected(Duration::from_secs(10))
            .expect("connects");
    }
    single.wait_backends_ready(Duration::from_secs(20));
    let _ = load(client, &url, &["--requests", "50", "--concurrency", "4"]);
    let one = load(client, &url, &args);
    assert!(few(&one), "{one}");
    let rate = |r: &serde_json::Value| r["achieved_rate"].as_f64().unwrap_or(0.0);
    eprintln!(
        "MEASURE flow setup (1000 new connections, 8 concurrent): domain master {:.0}/s p50 {} ms p99 {} ms ({} failed); single {:.0}/s p50 {} ms p99 {} ms ({} failed)",
        rate(&dom),
        dom["latency_ms"]["p50"],
        dom["latency_ms"]["p99"],
        dom["failed"],
        rate(&one),
        one["latency_ms"]["p50"],
        one["latency_ms"]["p99"],
        one["failed"]
    );
    // The bound is on the medians: a store on the PACKET_IN path would slow every setup,
    // where a few SYNs shed by a loaded machine's overload control (tolerated above) slow
    // only theirs, and each 5 s timeout among them took the 8-at-a-time rate down by half
    // (CI: 2 timeouts of 1,000, 120/s against 744/s, p50 9.4 against 9.0 ms).
    let p50 = |r: &serde_json::Value| r["latency_ms"]["p50"].as_f64().unwrap_or(f64::MAX);
    assert!(
        p50(&dom) <= 2.0 * p50(&one) + 5.0,
        "domain mode far slower: {dom} vs {one}"
    );
}

struct FourDomains {
    hosts: Vec<flowgate_testbed::Host>,
    _links: Vec<flowgate_testbed::Link>,
    bridges: Vec<flowgate_testbed::Bridge>,
    _fabric: flowgate_testbed::Bridge,
    /// (dpid, ofport) of each domain switch's port to the fabric.
    uplinks: Vec<(u64, u32)>,
}

/// Four domains, each one switch `sI` (dpid I) with a client `cI` (10.0.0.I) and a backend
/// `bI` (10.0.0.1I), joined by an inter-domain fabric: a plain L2 bridge (NORMAL) that
/// no controller manages, one uplink per domain switch.
fn four_domains(p: &Prefix) -> FourDomains {
    use flowgate_testbed::{Bridge, Host, Link, LinkKind};
    let px = p.as_str();
    let fabric = Bridge::create(&format!("{px}f0"), 0xf0, &[]).expect("fabric");
    fabric.add_flow("actions=NORMAL").expect("fabric NORMAL");
    let (mut hosts, mut links, mut bridges, mut uplinks) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for i in 1..=4u64 {
        let br = Bridge::create(&format!("{px}s{i}"), i, &[]).expect("switch");
        hosts.push(
            Host::create(
                px,
                &format!("c{i}"),
                &format!("10.0.0.{i}/24"),
                &br,
                Some(&format!("00:00:00:00:01:{i:02x}")),
            )
            .expect("client"),
        );
        hosts.push(
            Host::create(
                px,
                &format!("b{i}"),
                &format!("10.0.0.{}/24", 10 + i),
                &br,
                Some(&format!("00:00:00:00:02:{i:02x}")),
            )
            .expect("backend"),
        );
        let link = Link::create(
            LinkKind::Patch,
            &br,
            &format!("{px}u{i}"),
            &fabric,
            &format!("{px}f{i}"),
        )
        .expect("uplink");
        uplinks.push((i, link.a.ofport));
        links.push(link);
        bridges.push(br);
    }
    FourDomains {
        hosts,
        _links: links,
        bridges,
        _fabric: fabric,
        uplinks,
    }
}

fn located_and_weighted(ctl: &Ctl, addr: &str) -> bool {
    ctl.get_json("/api/v1/services")
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|s| s["backends"].as_array().cloned().unwrap_or_default())
        .any(|b| {
            b["address"] == addr
                && b["located"] == true
                && b["effective_weight"].as_f64().is_some_and(|w| w > 0.0)
        })
}

fn mean_ms(r: &serde_json::Value) -> f64 {
    r["latency_ms"]["mean"].as_f64().unwrap_or(f64::NAN)
}

/// Case C end to end: four domains (one switch, one client, one backend each), four domain
/// controllers and two global controllers, all separate processes, over one etcd. Every
/// domain serves its own clients locally. Domain 1's backend is slow and its clients
/// overload it: through the global controller, domain 1 spills part of its new
/// connections to the other domains' backends, across the inter-domain fabric, and its
/// clients' latency drops.
#[test]
fn ovs_four_domains_spill_through_global() {
    let test = "ovs_four_domains_spill_through_global";
    if !require_root_ovs(test) || !need_etcd(test) {
        return;
    }
    let p = Prefix::for_test(test);
    cleanup_stale(p.as_str()).expect("clean leftovers");
    let etcd = EtcdCluster::start("four", 1).expect("etcd");
    let net = four_domains(&p);
    let backends: Vec<std::net::Ipv4Addr> = (1..=4)
        .map(|i| format!("10.0.0.{}", 10 + i).parse().expect("ip"))
        .collect();
    let mut domains = Vec::new();
    for i in 1..=4u64 {
        let (dpid, port) = net.uplinks[(i - 1) as usize];
        let cfg = vip_config(
            VIP,
            "weighted-round-robin",
            &backends,
            "threshold_rps = 5.0\n",
        ) + &cluster_section(
            "domain",
            "ft",
            &format!("d{i}"),
            Some((&format!("d{i}"), &[i])),
            &etcd,
        ) + &format!("uplink = \"{dpid:016x}:{port}\"\n");
        let ctl = Ctl::start(&format!("{test}-d{i}"), &cfg);
        net.bridges[(i - 1) as usize]
            .set_controller(&[ctl.target()])
            .expect("set controller");
        domains.push(ctl);
    }
    for (i, d) in domains.iter().enumerate() {
        wait_until(
            &format!("d{} masters its switch", i + 1),
            Duration::from_secs(15),
            || cluster_view(d)["switches"][format!("{:016x}", i + 1)]["role"] == "master",
        );
    }
    let mut servers = Vec::new();
    for i in 1..=4usize {
        let b = &net.hosts[2 * i - 1];
        let extra: &[&str] = if i == 1 {
            &["--delay-ms", "50", "--concurrency", "1"]
        } else {
            &[]
        };
        servers.push(httpd(b, &format!("b{i}"), extra));
    }
    for (i, d) in domains.iter().enumerate() {
        let addr = format!("10.0.0.{}", 11 + i);
        // Located, and weighted as local: the domain sets its backends' weights on its
        // next work tick after locating them (until then a new connection finds no backend
        // with a weight, and is reset; seen in CI).
        wait_until(
            &format!("d{} locates and weights its backend", i + 1),
            Duration::from_secs(20),
            || located_and_weighted(d, &addr),
        );
    }
    let url = format!("http://{VIP}/");
    // Every domain serves its own clients, locally.
    for i in 1..=4usize {
        let r = load(
            &net.hosts[2 * i - 2],
            &url,
            &["--requests", "20", "--concurrency", "2"],
        );
        assert_eq!(r["ok"], 20, "d{i}: {r}");
        assert_eq!(
            shares(&r),
            vec![(format!("b{i}"), 20)],
            "d{i} stays local: {r}"
        );
    }
    let c1 = &net.hosts[0];
    let overload = [
        "--rate",
        "16",
        "--concurrency",
        "16",
        "--timeout-ms",
        "10000",
    ];
    // Overloaded, no global controller yet: everything queues at b1.
    let mut args = vec!["--requests", "64"];
    args.extend_from_slice(&overload);
    let before = load(c1, &url, &args);
    assert_eq!(before["failed"], 0, "{before}");
    assert_eq!(
        shares(&before).len(),
        1,
        "no spill without a global controller: {before}"
    );

    // The global controllers (active and standby). Let domain 1's demand decay first.
    let gbase = "[openflow]\nlisten = \"127.0.0.1:0\"\n[api]\nlisten = \"127.0.0.1:0\"\n";
    let mut g1 = Ctl::start(
        "four-g1",
        &(gbase.to_string() + &cluster_section("global", "ft", "g1", None, &etcd)),
    );
    wait_mastership(&g1, "master", Duration::from_secs(10));
    let g2 = Ctl::start(
        "four-g2",
        &(gbase.to_string() + &cluster_section("global", "ft", "g2", None, &etcd)),
    );
    // The active global controller may first see domain 1's decaying demand from the run
    // above and start a spill, which then ends through the exit threshold and the hold:
    // wait until it has (decision empty in the store, demand low, weights back to local).
    wait_until(
        "no spill while domain 1 is idle",
        Duration::from_secs(20),
        || {
            let d1 = &cluster_view(&g1)["cluster"]["domains"]["d1"];
            let idle = d1["summary"]["services"]["web"]["load_rps"]
                .as_f64()
                .is_some_and(|l| l < 1.0);
            let no_decision = d1["spill"]["services"]
                .as_object()
                .is_some_and(|m| m.is_empty());
            idle && no_decision && cluster_view(&domains[0])["spill_applied_unix_ms"].is_null()
        },
    );
    std::thread::sleep(Duration::from_secs(2));

    let started = unix_ms();
    let mut args = vec!["--requests", "48"];
    args.extend_from_slice(&overload);
    let ramp = load(c1, &url, &args);
    assert_eq!(ramp["failed"], 0, "{ramp}");
    let v1 = cluster_view(&domains[0]);
    let applied = v1["spill_applied_unix_ms"]
        .as_u64()
        .unwrap_or_else(|| panic!("domain 1 never spilled: {v1}"));
    let mut args = vec!["--requests", "96"];
    args.extend_from_slice(&overload);
    let after = load(c1, &url, &args);
    assert_eq!(after["failed"], 0, "{after}");
    let served = shares(&after);
    let remote: u64 = served
        .iter()
        .filter(|(b, _)| b != "b1")
        .map(|(_, n)| *n)
        .sum();
    eprintln!(
        "MEASURE spill: overload began at +0 ms, domain 1 applied the spill weights at +{} ms; \
         mean latency of domain 1's clients {:.1} ms before (no global) vs {:.1} ms spilling (p50 {} vs {} ms); \
         served {served:?} (decision {})",
        applied.saturating_sub(started),
        mean_ms(&before),
        mean_ms(&after),
        before["latency_ms"]["p50"],
        after["latency_ms"]["p50"],
        v1["spill"]
    );
    assert!(
        remote >= 30,
        "a good part of domain 1's connections went to other domains: {served:?}"
    );
    assert!(
        mean_ms(&after) < 0.7 * mean_ms(&before),
        "clients see the spill: {before} vs {after}"
    );
    // The active global controller dies (SIGKILL) while domain 1 spills: the decision
    // stays in force, the standby takes over, and domain 1's clients are all served.
    let killed_at = unix_ms();
    g1.kill();
    let mut args = vec!["--requests", "48"];
    args.extend_from_slice(&overload);
    let during = load(c1, &url, &args);
    wait_mastership(&g2, "master", Duration::from_secs(10));
    let took = cluster_view(&g2)["leader_since_unix_ms"]
        .as_u64()
        .unwrap_or(u64::MAX)
        .saturating_sub(killed_at);
    eprintln!("MEASURE Case C: global standby active {took} ms after SIGKILL, under load");
    assert!(took < 3000, "global failover took {took} ms");
    assert_eq!(during["failed"], 0, "{during}");
    assert!(
        shares(&during).iter().any(|(b, n)| b != "b1" && *n > 0),
        "still spilling while the global controller fails over: {during}"
    );
    // The other domains still serve their own clients (all succeed).
    for i in 2..=4usize {
        let r = load(
            &net.hosts[2 * i - 2],
            &url,
            &["--requests", "20", "--concurrency", "2"],
        );
        assert_eq!(r["ok"], 20, "d{i}: {r}");
    }
    // The API shows the whole cluster.
    wait_until("the cluster view", Duration::from_secs(5), || {
        let c = &cluster_view(&domains[1])["cluster"];
        c["global"]["active"] == "g2"
            && (1..=4).all(|i| c["domains"][format!("d{i}")]["master"] == format!("d{i}"))
    });
    for d in &domains {
        d.assert_no_openflow_errors();
    }
    drop(servers);
}

fn backend_count(ctl: &Ctl) -> usize {
    ctl.get_json("/api/v1/services")[0]["backends"]
        .as_array()
        .map(Vec::len)
        .unwrap_or(0)
}

/// An operator changes a pool once, in the store, and every domain applies it. When etcd
/// goes away, domain masters keep serving with what they have and say so (API, logs);
/// when it returns they carry on: nothing lost, later changes still arrive.
#[test]
fn shared_services_and_store_outage() {
    if !need_etcd("shared_services_and_store_outage") {
        return;
    }
    let mut etcd = EtcdCluster::start("shared", 1).expect("etcd");
    let one: Vec<std::net::Ipv4Addr> = vec!["10.0.0.2".parse().expect("ip")];
    let ctl = |i: u64| {
        Ctl::start(
            &format!("shared-d{i}"),
            &(vip_config(VIP, "round-robin", &one, "")
                + &cluster_section(
                    "domain",
                    "sh",
                    &format!("d{i}"),
                    Some((&format!("d{i}"), &[i])),
                    &etcd,
                )),
        )
    };
    let (d1, d2) = (ctl(1), ctl(2));
    wait_mastership(&d1, "master", Duration::from_secs(10));
    wait_mastership(&d2, "master", Duration::from_secs(10));
    assert_eq!(backend_count(&d1), 1);
    let rt = runtime();
    let st = store(&etcd, &rt);
    let pool = |n: usize| {
        let b: Vec<std::net::Ipv4Addr> = (0..n)
            .map(|i| format!("10.0.0.{}", 2 + i).parse().expect("ip"))
            .collect();
        vip_config(VIP, "round-robin", &b, "")
    };
    let t = Instant::now();
    rt.block_on(st.put(keys::services("sh"), pool(2).into_bytes(), None))
        .expect("put services");
    wait_until(
        "both domains apply the new pool",
        Duration::from_secs(5),
        || backend_count(&d1) == 2 && backend_count(&d2) == 2,
    );
    eprintln!(
        "MEASURE shared pool change applied by every domain within {:?}",
        t.elapsed()
    );

    // etcd goes away: the masters keep their role and serve; the API says the store is gone.
    etcd.kill(0);
    wait_until(
        "d1 reports the store unreachable",
        Duration::from_secs(10),
        || cluster_view(&d1)["store"]["reachable"] == false,
    );
    let v = cluster_view(&d1);
    assert_eq!(v["mastership"], "master", "{v}");
    assert!(v["store"]["error"].is_string(), "{v}");
    d1.wait_log("coordination store unreachable", Duration::from_secs(5));
    assert_eq!(backend_count(&d1), 2, "the last known pool stays");
    std::thread::sleep(Duration::from_secs(1));

    etcd.restart(0).expect("restart etcd");
    etcd.wait_writable(Duration::from_secs(20))
        .expect("etcd back");
    wait_until("d1 sees the store again", Duration::from_secs(15), || {
        let v = cluster_view(&d1);
        v["store"]["reachable"] == true && v["mastership"] == "master"
    });
    let st = store(&etcd, &rt);
    rt.block_on(st.put(keys::services("sh"), pool(3).into_bytes(), None))
        .expect("put services");
    wait_until(
        "both domains apply the change made after the outage",
        Duration::from_secs(10),
        || backend_count(&d1) == 3 && backend_count(&d2) == 3,
    );
    wait_until(
        "d1's summary is published again",
        Duration::from_secs(10),
        || {
            rt.block_on(st.get(keys::domain_summary("sh", "d1")))
                .ok()
                .flatten()
                .is_some()
        },
    );
}
