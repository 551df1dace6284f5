//! The partitioned mode end to end (`mode = "partitioned"`, after Wang et al., "OpenFlow-Based
//! Server Load Balancing Gone Wild", 2011): the client-port space is split into
//! `2^partition_bits` partitions (bits 1..=b of the TCP source port), each owned by one
//! backend through a wildcard rule that hands the packets to it by MAC, the VIP left as
//! their destination; the backends hold the VIP on their loopback and answer the client
//! directly (DSR). When the load moves a partition, it goes through the controller for
//! `transition_secs` (SYN to the new owner, anything else to the old one), so a live
//! connection keeps its backend.

mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use flowgate_testbed::Host;
use flowgate_testbed::topo::{self, TopoOptions};
use support::*;

const VIP: &str = "10.0.0.100";
const TOKEN: &str = "partitioned-token-0123456789";
/// 32 partitions, not the default 64: the key is honoured, and a dump stays readable.
const BITS: u32 = 5;
const MASK: u16 = ((1 << BITS) - 1) << 1;
/// Long enough for a burst of new connections to land inside a transition.
const TRANSITION_SECS: u64 = 4;

/// Where a partition's rule sends its packets.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Owner {
    /// To this MAC (a backend's).
    Mac(String),
    /// To the controller (the partition is changing owner).
    Controller,
}

/// Where each partition's packets go by the VIP's partition rules in a `dump-flows` (the
/// highest-priority rule of the partition: a moving partition's trip to the controller
/// sits above its wildcard rule), by partition (`tp_src` value >> 1). Panics on a rule the
/// mode should not install: a mask other than bits 1..=BITS, two rules of one partition
/// at one priority, or actions that rewrite the IP destination (DSR leaves it alone).
fn partitions(flows: &str) -> BTreeMap<u16, Owner> {
    let mut m: BTreeMap<u16, (u16, Owner)> = BTreeMap::new();
    for line in flows.lines() {
        if !line.contains(&format!("nw_dst={VIP},")) || !line.contains("tp_dst=80") {
            continue;
        }
        // A wildcard rule carries `tp_src=0xV/0xM`; a per-connection one an exact port.
        let Some((value, mask)) = field(line, "tp_src=").and_then(|v| v.split_once('/')) else {
            continue;
        };
        let (value, mask) = (hex(value), hex(mask));
        assert_eq!(
            mask,
            Some(MASK),
            "partition mask is bits 1..={BITS}: {line}"
        );
        let value = value.unwrap_or_else(|| panic!("a partition value: {line}"));
        let prio: u16 = field(line, "priority=")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("a priority: {line}"));
        let actions = line.split_once(" actions=").map_or("", |(_, a)| a);
        assert!(
            !actions.contains("nw_dst") && !actions.contains("ip_dst"),
            "the VIP stays the destination (DSR): {line}"
        );
        let owner = if actions.contains("CONTROLLER") {
            Owner::Controller
        } else {
            // `set_field:MAC->eth_dst` (OpenFlow 1.3) or `mod_dl_dst:MAC`.
            let mac = actions
                .find("->eth_dst")
                .and_then(|i| actions.get(i.checked_sub(17)?..i))
                .or_else(|| field(actions, "mod_dl_dst:"))
                .unwrap_or_else(|| panic!("a partition rule sets the backend's MAC: {line}"));
            Owner::Mac(mac.to_string())
        };
        match m.get(&(value >> 1)) {
            Some((p, _)) if *p == prio => panic!("one rule per partition and priority: {line}"),
            Some((p, _)) if *p > prio => {}
            _ => {
                m.insert(value >> 1, (prio, owner));
            }
        }
    }
    m.into_iter().map(|(k, (_, o))| (k, o)).collect()
}

/// The value of `key` in a comma-separated `dump-flows` line (up to `,` or a space).
fn field<'a>(s: &'a str, key: &str) -> Option<&'a str> {
    let rest = &s[s.find(key)? + key.len()..];
    Some(rest.split([',', ' ']).next().unwrap_or(rest))
}

fn hex(s: &str) -> Option<u16> {
    u16::from_str_radix(s.strip_prefix("0x").unwrap_or(s), 16).ok()
}

/// Every partition has a rule to a backend (none in transition).
fn settled(p: &BTreeMap<u16, Owner>) -> bool {
    p.len() == 1 << BITS && p.values().all(|o| matches!(o, Owner::Mac(_)))
}

/// Polls the bridge's partition rules until `done` holds for them; returns them. On
/// timeout, panics with the rules and the whole table.
fn wait_partitions(
    br: &flowgate_testbed::Bridge,
    what: &str,
    timeout: Duration,
    mut done: impl FnMut(&BTreeMap<u16, Owner>) -> bool,
) -> BTreeMap<u16, Owner> {
    let deadline = Instant::now() + timeout;
    loop {
        let flows = br.dump_flows().unwrap_or_default();
        let m = partitions(&flows);
        if done(&m) {
            return m;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: partitions {m:?}\n{flows}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The service's `partitions` view in the API: `(moves_total, moving, owned)`.
fn partition_view(ctl: &Ctl) -> (u64, u64, Vec<u64>) {
    let v = ctl.get_json("/api/v1/services");
    let p = &v[0]["partitions"];
    let owned = p["owned"]
        .as_array()
        .map(|a| a.iter().filter_map(serde_json::Value::as_u64).collect())
        .unwrap_or_default();
    match (p["moves_total"].as_u64(), p["moving"].as_u64()) {
        (Some(total), Some(moving)) => (total, moving, owned),
        _ => panic!("a partitions view in the service: {v}"),
    }
}

/// `flowgate httpd` named `name` on every address of the host, the VIP on its loopback
/// included, with `extra` arguments.
fn dsr_httpd(host: &Host, name: &str, extra: &[&str]) -> flowgate_testbed::ProcGuard {
    let mut argv = vec![FLOWGATE, "httpd", "--listen", "0.0.0.0:80", "--name", name];
    argv.extend_from_slice(extra);
    let g = host.spawn(&argv).expect("spawn httpd");
    host.wait_http(
        &format!("http://{}/health", host.ip()),
        Duration::from_secs(10),
    )
    .expect("httpd up");
    g
}

/// `(local port, backend, outcome)` of each request in a `flowgate load --conn-log` file.
fn conn_log(path: &std::path::Path) -> Vec<(Option<u16>, String, String)> {
    std::fs::read_to_string(path)
        .expect("conn log")
        .lines()
        .map(|l| {
            let mut f = l.split_whitespace();
            let port = f.next().and_then(|p| p.parse().ok());
            let backend = f.next().unwrap_or("-").to_string();
            let outcome = f.next().unwrap_or("-").to_string();
            (port, backend, outcome)
        })
        .collect()
}

/// `flowgate load` on `concurrency` keep-alive connections for `secs`, each request
/// logged to `log`; its JSON report on stdout.
fn keep_alive_load(
    client: &Host,
    url: &str,
    concurrency: u32,
    secs: u64,
    log: &std::path::Path,
) -> std::process::Child {
    client
        .command(&[
            FLOWGATE,
            "load",
            "--url",
            url,
            "--json",
            "--new-connection-per-request",
            "false",
            "--concurrency",
            &concurrency.to_string(),
            "--requests",
            "1000000",
            "--duration-secs",
            &secs.to_string(),
            "--timeout-ms",
            "3000",
            "--conn-log",
            log.to_str().expect("utf-8 path"),
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("keep-alive load")
}

/// One bridge with the client h1 and three backends that hold the VIP (`flowgate httpd`
/// named b2..b4, with `server` arguments), under a controller that runs the VIP
/// partitioned by least connections with `keys`; returns once the backends are located.
struct DsrNet {
    t: flowgate_testbed::topo::Topology,
    ctl: Ctl,
    backends: Vec<std::net::Ipv4Addr>,
    _servers: Vec<flowgate_testbed::ProcGuard>,
}

fn dsr_net(p: &str, name: &str, keys: &str, server: &[&str]) -> DsrNet {
    let t = topo::single(&TopoOptions::new(p), 4).expect("topology");
    let backends: Vec<_> = t.hosts[1..].iter().map(|h| h.ip()).collect();
    let vip = VIP.parse().expect("vip");
    for h in &t.hosts[1..] {
        h.add_loopback_vip(vip).expect("VIP on lo");
    }
    let cfg = vip_config(
        VIP,
        "least-connections",
        &backends,
        &format!("mode = \"partitioned\"\n{keys}"),
    )
    .replacen("[api]\n", &format!("[api]\ntoken = \"{TOKEN}\"\n"), 1);
    let ctl = Ctl::start(name, &cfg);
    ctl.control(&t.bridges[..1]);
    let servers = t.hosts[1..]
        .iter()
        .enumerate()
        .map(|(i, h)| dsr_httpd(h, &format!("b{}", i + 2), server))
        .collect();
    // The controller finds the backends by ARP: they must answer it although they hold
    // the VIP (and drop any packet from it, an ARP request included).
    ctl.wait_backends_ready(Duration::from_secs(15));
    DsrNet {
        t,
        ctl,
        backends,
        _servers: servers,
    }
}

#[test]
fn ovs_partitioned_vip_serves_from_rules_and_moves_no_live_connection() {
    let Some(p) = setup("ovs_partitioned_vip_serves_from_rules_and_moves_no_live_connection")
    else {
        return;
    };
    // 20 ms per request paces the keep-alive client below to ~50 requests/s.
    let DsrNet {
        t,
        ctl,
        _servers: _keep,
        ..
    } = dsr_net(
        p.as_str(),
        "partitioned",
        &format!("partition_bits = {BITS}\ntransition_secs = {TRANSITION_SECS}\n"),
        &["--delay-ms", "20"],
    );
    let br = &t.bridges[0];
    let name_of_mac: BTreeMap<String, String> = t.hosts[1..]
        .iter()
        .enumerate()
        .map(|(i, h)| (h.mac().to_string(), format!("b{}", i + 2)))
        .collect();
    let client = &t.hosts[0];
    let url = format!("http://{VIP}/");

    // One rule per partition, every backend owning some. (The first backend located may
    // own them all for a while: the others' shares then arrive through a transition.)
    let owners = |m: &BTreeMap<u16, Owner>| -> BTreeMap<String, usize> {
        let mut n = BTreeMap::new();
        for o in m.values() {
            if let Owner::Mac(mac) = o {
                let name = name_of_mac
                    .get(mac)
                    .unwrap_or_else(|| panic!("partition owner {mac} is a backend's MAC"));
                *n.entry(name.clone()).or_insert(0) += 1;
            }
        }
        n
    };
    let map = wait_partitions(
        br,
        "the partitions spread over the three backends",
        Duration::from_secs(10 + TRANSITION_SECS),
        |m| settled(m) && owners(m).len() == 3,
    );
    let counts = owners(&map);
    eprintln!("partitions per backend: {counts:?}");
    assert_eq!(counts.len(), 3, "every backend owns partitions: {counts:?}");
    for (b, n) in &counts {
        assert!(
            *n >= (1 << BITS) / 6,
            "{b} owns only {n} of {} partitions: {counts:?}",
            1 << BITS
        );
    }

    // Warm up: the client's ARP for the VIP and L2 learning go through the controller.
    let warm = load(client, &url, &["--requests", "3", "--concurrency", "1"]);
    assert_eq!(warm["ok"], 3, "{warm}");

    let log = ctl.dir.join("steady.log");
    let (moves_before, moving, owned) = partition_view(&ctl);
    assert_eq!(moving, 0, "nothing moves once spread");
    assert_eq!(
        owned.iter().sum::<u64>(),
        1 << BITS,
        "the API counts every partition: {owned:?}"
    );
    let before = ctl.packet_ins();
    let report = load(
        client,
        &url,
        &[
            "--requests",
            "300",
            "--concurrency",
            "4",
            "--conn-log",
            log.to_str().expect("utf-8 path"),
        ],
    );
    let during = ctl.packet_ins() - before;
    assert_spread_off_controller("partitioned", &report, during, || {
        br.dump_flows().unwrap_or_default()
    });
    // Each request went to the owner of its source port's partition, by the rules as they
    // stand: a light load that never reaches the controller gives it no reason to move one.
    let after_map = partitions(&br.dump_flows().expect("dump-flows"));
    assert_eq!(after_map, map, "the partition map stayed put");
    let (moves_after, moving, _) = partition_view(&ctl);
    assert_eq!(
        (moves_after - moves_before, moving),
        (0, 0),
        "no partition moved under the steady load"
    );
    for (port, backend, outcome) in conn_log(&log) {
        let port = port.unwrap_or_else(|| panic!("a local port for {backend} {outcome}"));
        let Some(Owner::Mac(mac)) = map.get(&((port & MASK) >> 1)) else {
            panic!("partition of port {port} has a backend");
        };
        assert_eq!(
            Some(&backend),
            name_of_mac.get(mac),
            "port {port} (partition {}) served by its partition's owner",
            (port & MASK) >> 1
        );
    }

    // A keep-alive client (one connection, ~50 requests/s) across the drain of its backend
    // and the end of the transition.
    let ka_log = ctl.dir.join("keepalive.log");
    let ka_secs = TRANSITION_SECS + 6;
    let mut ka = keep_alive_load(client, &url, 1, ka_secs, &ka_log);
    // Its backend, and its local port (the key of its per-connection rule once its
    // partition moves).
    let mut carrier = None;
    wait_until("the keep-alive connection", Duration::from_secs(5), || {
        carrier = t.hosts[1..].iter().position(|h| {
            h.exec_checked(&["ss", "-Htn", "state", "established", "( sport = :80 )"])
                .is_ok_and(|o| !o.trim().is_empty())
        });
        carrier.is_some()
    });
    let carrier = carrier.expect("found above");
    let busy = &t.hosts[1 + carrier];
    let busy_name = format!("b{}", carrier + 2);
    let ss = client
        .exec_checked(&["ss", "-Htn", "state", "established", "( dport = :80 )"])
        .expect("ss");
    let ka_port: u16 = ss
        .split_whitespace()
        .find_map(|a| a.strip_prefix("10.0.0.1:"))
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("the keep-alive's local port in: {ss}"));
    let ka_partition = (ka_port & MASK) >> 1;
    eprintln!("keep-alive on {busy_name} from port {ka_port} (partition {ka_partition})");
    std::thread::sleep(Duration::from_millis(500));

    let auth = format!("Bearer {TOKEN}");
    let drained_at = Instant::now();
    let (st, body) = http_request(
        ctl.api,
        "POST",
        &format!("/api/v1/services/web/backends/{}/drain", busy.ip()),
        &[("Authorization", auth.as_str())],
        "",
    );
    assert_eq!(st, 200, "drain {}: {body}", busy.ip());

    // The drained backend's partitions go to the controller...
    let busy_mac = Owner::Mac(busy.mac().to_string());
    let in_transition = |m: &BTreeMap<u16, Owner>| -> Vec<u16> {
        (0..1u16 << BITS)
            .filter(|p| m.get(p).is_none_or(|o| *o == Owner::Controller))
            .collect()
    };
    let moving = in_transition(&wait_partitions(
        br,
        "a partition in transition",
        Duration::from_secs(3),
        |m| !in_transition(m).is_empty(),
    ));
    eprintln!(
        "partitions in transition {:?} after the drain: {moving:?}",
        drained_at.elapsed()
    );
    // ...where new connections meet their new owner, never the drained one.
    let log = ctl.dir.join("transition.log");
    let before = ctl.packet_ins();
    let during_t = load(
        client,
        &url,
        &[
            "--requests",
            "60",
            "--concurrency",
            "2",
            "--conn-log",
            log.to_str().expect("utf-8 path"),
        ],
    );
    let pis = ctl.packet_ins() - before;
    let still = in_transition(&partitions(&br.dump_flows().unwrap_or_default()));
    assert_eq!(during_t["ok"], 60, "{during_t}");
    let sh = shares(&during_t);
    let through_controller = conn_log(&log)
        .iter()
        .filter(|(port, _, _)| port.is_some_and(|p| still.contains(&((p & MASK) >> 1))))
        .count();
    eprintln!(
        "during the transition: {sh:?}, {pis} PACKET_INs, {through_controller} of 60 in \
         moving partitions, {still:?} still moving after {:?}",
        drained_at.elapsed()
    );
    assert!(
        through_controller > 0,
        "some of the burst's connections fell in partitions still moving after it"
    );
    assert!(
        sh.iter().all(|(n, _)| *n != busy_name),
        "new connections avoid the drained {busy_name} during the transition: {sh:?}"
    );
    assert!(
        pis > 0,
        "the drained backend's partitions went through the controller: no PACKET_IN"
    );

    // After transition_secs, not before, every partition has a rule again, none to the
    // drained backend; the keep-alive's connection keeps an exact rule to it.
    let map = wait_partitions(
        br,
        "the partitions' new owners",
        Duration::from_secs(TRANSITION_SECS + 5),
        |m| settled(m) && !m.values().any(|o| *o == busy_mac),
    );
    let moved_after = drained_at.elapsed();
    eprintln!(
        "partitions settled {moved_after:?} after the drain: {:?}",
        owners(&map)
    );
    assert!(
        moved_after >= Duration::from_secs(TRANSITION_SECS).mul_f64(0.9),
        "a moved partition's rule waits out transition_secs ({TRANSITION_SECS} s), not {moved_after:?}"
    );
    assert_eq!(owners(&map).len(), 2, "the two others own every partition");
    let flows = br.dump_flows().expect("dump-flows");
    assert!(
        flows
            .lines()
            .any(|l| l.contains(&format!("tp_src={ka_port},")) && l.contains(busy.mac())),
        "an exact rule keeps the keep-alive (port {ka_port}) on {busy_name}:\n{flows}"
    );
    assert!(
        ka.try_wait().expect("keep-alive status").is_none(),
        "the keep-alive client still runs past the end of the transition"
    );

    // Off the controller again, and away from the drained backend.
    let before = ctl.packet_ins();
    let after = load(client, &url, &["--requests", "120", "--concurrency", "4"]);
    let pis = ctl.packet_ins() - before;
    assert_eq!(after["ok"], 120, "{after}");
    let sh = shares(&after);
    eprintln!("after the transition: {sh:?}, {pis} PACKET_INs");
    assert!(
        sh.iter().all(|(n, _)| *n != busy_name),
        "new connections avoid the drained {busy_name}: {sh:?}"
    );
    assert_eq!(sh.len(), 2, "the two others serve: {sh:?}");
    assert!(
        pis <= 10,
        "{pis} PACKET_INs for 120 requests after the move"
    );

    // The keep-alive connection: one connection throughout, every answer from its backend.
    let out = ka.wait_with_output().expect("keep-alive load finishes");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "keep-alive load: {text}");
    let rep: serde_json::Value = serde_json::from_str(&text).expect("load report");
    let recs = conn_log(&ka_log);
    let ok = rep["ok"].as_u64().unwrap_or(0);
    eprintln!("keep-alive: {ok} requests, {}", rep["errors"]);
    assert!(
        ok as f64 >= 20.0 * ka_secs as f64,
        "the keep-alive kept going at ~50/s: {rep}"
    );
    assert_eq!(ok, recs.len() as u64, "no request failed: {rep}");
    for (port, backend, outcome) in &recs {
        assert_eq!(
            (*port, backend.as_str(), outcome.as_str()),
            (Some(ka_port), busy_name.as_str(), "200"),
            "every keep-alive request on the first connection to {busy_name}"
        );
    }
    ctl.assert_no_openflow_errors();

    // A controller restart under eight live keep-alive connections (eight partitions),
    // placed by the partition rules alone. The new controller knows neither the owners nor
    // the drain that placed them: it takes the owners from the switch's rules, so every
    // connection keeps its backend (and when it then gives the undrained backend its share
    // back, the moving partitions' connections keep theirs through the transition).
    let mut ctl = ctl;
    let many_log = ctl.dir.join("restart.log");
    let many_secs = 10;
    let many = keep_alive_load(client, &url, 8, many_secs, &many_log);
    std::thread::sleep(Duration::from_secs(2));
    let map_before = partitions(&br.dump_flows().expect("dump-flows"));
    ctl.restart();
    br.wait_connected(Duration::from_secs(10))
        .expect("switch reconnects");
    let out = many.wait_with_output().expect("keep-alive load finishes");
    let text = String::from_utf8_lossy(&out.stdout);
    let rep: serde_json::Value = serde_json::from_str(&text).expect("load report");
    let recs = conn_log(&many_log);
    let ok = rep["ok"].as_u64().unwrap_or(0);
    assert_eq!(ok, recs.len() as u64, "no request failed: {rep}");
    assert!(ok >= 1_000, "the eight kept going at ~50/s each: {rep}");
    let mut per_conn: BTreeMap<u16, BTreeMap<String, usize>> = BTreeMap::new();
    for (port, backend, outcome) in recs {
        let port = port.unwrap_or_else(|| panic!("a local port for {backend} {outcome}"));
        assert_eq!(outcome, "200", "port {port} ({backend}): {rep}");
        *per_conn
            .entry(port)
            .or_default()
            .entry(backend)
            .or_default() += 1;
    }
    eprintln!("across the restart, requests per connection and backend: {per_conn:?}; {rep}");
    assert_eq!(
        per_conn.len(),
        8,
        "eight connections, none replaced: {per_conn:?}"
    );
    for (port, by) in &per_conn {
        assert_eq!(by.len(), 1, "port {port} kept one backend: {by:?}");
        let Some(Owner::Mac(mac)) = map_before.get(&((port & MASK) >> 1)) else {
            panic!("partition of port {port} had a backend before the restart");
        };
        assert_eq!(
            by.keys().next(),
            name_of_mac.get(mac),
            "port {port} on its partition's owner from before the restart"
        );
    }
    ctl.assert_no_openflow_errors();
}

/// Under a load of thousands of new connections a second, the partitions settle after a
/// drain and an undrain instead of moving on and on: the connections a transition sends
/// through the controller must not feed back into more transitions.
#[test]
fn ovs_partitioned_partitions_settle_under_load() {
    let Some(p) = setup("ovs_partitioned_partitions_settle_under_load") else {
        return;
    };
    let transition = 1;
    let DsrNet {
        t,
        ctl,
        backends,
        _servers: _keep,
    } = dsr_net(
        p.as_str(),
        "partitioned-load",
        &format!("transition_secs = {transition}\n"),
        &[],
    );
    let spread = |(_, moving, owned): &(u64, u64, Vec<u64>)| {
        *moving == 0 && owned.len() == 3 && owned.iter().all(|&n| n > 0)
    };
    wait_until(
        "the partitions spread over the three backends",
        Duration::from_secs(10),
        || spread(&partition_view(&ctl)),
    );
    let client = &t.hosts[0];
    client
        .exec_checked(&["sysctl", "-qw", "net.ipv4.tcp_tw_reuse=1"])
        .expect("sysctl");
    let url = format!("http://{VIP}/");
    let warm = load(client, &url, &["--requests", "3", "--concurrency", "1"]);
    assert_eq!(warm["ok"], 3, "{warm}");

    let load_secs = 14;
    let bg = client
        .command(&[
            FLOWGATE,
            "load",
            "--url",
            &url,
            "--json",
            "--concurrency",
            "16",
            "--requests",
            "10000000",
            "--duration-secs",
            &load_secs.to_string(),
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("background load");
    let started = Instant::now();
    std::thread::sleep(Duration::from_secs(1));
    let auth = format!("Bearer {TOKEN}");
    let b2 = backends[0];
    for op in ["drain", "undrain"] {
        let (st, body) = http_request(
            ctl.api,
            "POST",
            &format!("/api/v1/services/web/backends/{b2}/{op}"),
            &[("Authorization", auth.as_str())],
            "",
        );
        assert_eq!(st, 200, "{op} {b2}: {body}");
        // Each settles within its transition and a few rebalances.
        let mut v = partition_view(&ctl);
        let settle = Instant::now();
        while !(v.1 == 0 && (op == "drain") == (v.2[0] == 0)) {
            assert!(
                settle.elapsed() < Duration::from_secs(transition + 5),
                "{op}: the partitions did not settle: {v:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
            v = partition_view(&ctl);
        }
        eprintln!("{op}: settled after {:?}: {v:?}", settle.elapsed());
    }
    // Then they stay put while the load goes on: at most one rebalance's worth of moves
    // (an eighth of the 64 partitions, the drift that triggers one).
    let (m0, _, _) = partition_view(&ctl);
    std::thread::sleep(Duration::from_secs(4));
    let v = partition_view(&ctl);
    assert!(
        started.elapsed() < Duration::from_secs(load_secs),
        "the load still ran while the partitions were watched"
    );
    let out = bg.wait_with_output().expect("load finishes");
    let text = String::from_utf8_lossy(&out.stdout);
    let rep: serde_json::Value = serde_json::from_str(&text).expect("load report");
    let (_, metrics) = ctl.get("/metrics");
    eprintln!(
        "load: {} ok, {:.0} requests/s, errors {}; partitions {v:?}; resets sent {:?}, unknown-flow packets {:?}, PACKET_INs {:?}",
        rep["ok"],
        rep["achieved_rate"],
        rep["errors"],
        metric(&metrics, "flowgate_resets_sent_total"),
        metrics
            .lines()
            .find(|l| l.starts_with("flowgate_service_unknown_flow_packets_total")),
        metric(&metrics, "flowgate_packet_in_total"),
    );
    assert!(
        spread(&v) && v.0 - m0 <= 64 / 8,
        "the partitions stayed put under the load: {} moves in 4 s, {v:?}",
        v.0 - m0
    );
    // Every request succeeds. Found here (client ports reused within 1.3 s, see
    // `partition`'s module doc), each a SYN and its ACK reaching two backends, the second
    // resetting it or holding it to a 5 s timeout from TIME_WAIT: connection rules that
    // outlived their connection (its FIN went by the controller, or it was adopted after
    // it) under a reused port whose SYN followed the partition's rule; and SYNs placed on
    // the new owner while Open vSwitch still carried their ACKs to the old one by flows
    // cached from the old partition rule. Before the fixes 0-6 of ~26,000 requests failed
    // per run; after, none in 10 runs (300,868 requests).
    let sent = rep["sent"].as_u64().unwrap_or(0);
    let failed = sent.saturating_sub(rep["ok"].as_u64().unwrap_or(0));
    assert!(
        sent > 5_000 && failed == 0,
        "{failed} of {sent} requests failed: {rep}"
    );
    ctl.assert_no_openflow_errors();
}

/// A reload that takes a partitioned service to `mode` (`""` for reactive) keeps the
/// download in flight on it: before its partition rules go, each is written again (for
/// the segments that are not SYNs, or for a transition) and lasts until those have been
/// idle for the service's idle timeout (2 s), new connections (placed by the new mode)
/// coming all along. `partitions` is how many partition rules the new mode has.
fn partitioned_departs(test: &str, name: &str, mode: &str, departing_prio: u16, partitions: usize) {
    let Some(p) = setup(test) else {
        return;
    };
    let DsrNet {
        t,
        ctl,
        _servers: _keep,
        ..
    } = dsr_net(
        p.as_str(),
        name,
        "partition_bits = 2\nidle_timeout_secs = 2\n",
        &["--rate-bytes-per-sec", "1000000"],
    );
    let br = &t.bridges[0];
    let client = &t.hosts[0];
    let url = format!("http://{VIP}/");
    let at = |flows: &str, prio: u16| rules_at(flows, prio, VIP);
    wait_until("the partition rules", Duration::from_secs(10), || {
        at(&br.dump_flows().unwrap_or_default(), 220) == 4
    });
    ctl.wait_past_grace();
    let dl = Download::start(client, &format!("http://{VIP}/bytes/5000000"));
    download_carrier(&t.hosts[1..]);

    let next = ctl
        .config_text()
        .replace("mode = \"partitioned\"\n", mode)
        .replace("partition_bits = 2\n", "");
    ctl.reload_with(&next);
    wait_until("the departing rules", Duration::from_secs(5), || {
        let flows = br.dump_flows().unwrap_or_default();
        at(&flows, departing_prio) == 4 && at(&flows, 220) == partitions
    });
    let after = load(client, &url, &["--requests", "20", "--concurrency", "2"]);
    assert_eq!(after["ok"], 20, "new connections, by the new mode: {after}");
    dl.finishes(5_000_000, "the download from before the reload");
    // New connections keep coming; the departing rules go all the same.
    let end = Duration::from_secs(15);
    wait_under_load("the departing rules' end", end, client, &url, br, |flows| {
        !flows.contains("cookie=0x9")
    });
    ctl.assert_no_openflow_errors();
}

#[test]
fn ovs_partitioned_to_reactive_keeps_live_connections() {
    partitioned_departs(
        "ovs_partitioned_to_reactive_keeps_live_connections",
        "partitioned-to-reactive",
        "",
        260,
        0,
    );
}

#[test]
fn ovs_partitioned_to_proactive_keeps_live_connections() {
    partitioned_departs(
        "ovs_partitioned_to_proactive_keeps_live_connections",
        "partitioned-to-proactive",
        "mode = \"proactive\"\n",
        199,
        0,
    );
}

/// Another partition count moves every partition at once: for the transition (3 s) every
/// segment of the old partitions comes up, the download's gets a rule of its own to its
/// owner, and new connections go to their new partitions' owners.
#[test]
fn ovs_partitioned_with_another_partition_count_keeps_live_connections() {
    partitioned_departs(
        "ovs_partitioned_with_another_partition_count_keeps_live_connections",
        "partitioned-reshape",
        "mode = \"partitioned\"\npartition_bits = 3\ntransition_secs = 3\n",
        260,
        8,
    );
}
