//! VIP load balancing end to end: the real controller binary, real Open vSwitch
//! (userspace datapath), real HTTP servers and clients in network namespaces.

mod support;

use std::time::Duration;

use flowgate_testbed::topo::{self, TopoOptions};
use support::*;

const VIP: &str = "10.0.0.100";

/// One switch, a client and three backends: the client finds the VIP by ARP (no static
/// entry), 300 separate HTTP requests all succeed, round robin gives each backend its
/// third within ±10%, and the switch holds the rewrite rules.
#[test]
fn ovs_single_switch_round_robin() {
    let Some(p) = setup("ovs_single_switch_round_robin") else {
        return;
    };
    let topo0 = topo::single(&TopoOptions::new(p.as_str()), 4).expect("topology");
    let backends: Vec<_> = topo0.hosts[1..].iter().map(|h| h.ip()).collect();
    let ctl = Ctl::start("single", &vip_config(VIP, "round-robin", &backends, ""));
    ctl.control(&topo0.bridges[..1]);
    let _servers: Vec<_> = topo0.hosts[1..]
        .iter()
        .enumerate()
        .map(|(i, h)| httpd(h, &format!("b{}", i + 2), &[]))
        .collect();
    ctl.wait_backends_ready(Duration::from_secs(15));

    let client = &topo0.hosts[0];
    let conn_log = ctl.dir.join("load-connections.txt");
    let report = load(
        client,
        &format!("http://{VIP}/"),
        &[
            "--requests",
            "300",
            "--concurrency",
            "4",
            "--conn-log",
            conn_log.to_str().expect("utf-8 temp path"),
        ],
    );
    // Every response traced to the controller's decision for its client port, before
    // the totals, so a mismatch names the connections and what the switch held.
    let names: Vec<(String, std::net::Ipv4Addr)> = topo0.hosts[1..]
        .iter()
        .enumerate()
        .map(|(i, h)| (format!("b{}", i + 2), h.ip()))
        .collect();
    let untraced = untraced_responses(&ctl, &conn_log, &names);
    assert!(
        untraced.is_empty(),
        "responses without a decision (port, answered by, answers, decisions):\n{untraced:?}\n\
         flows:\n{}\ndatapath:\n{}",
        topo0.bridges[0].dump_flows().unwrap_or_default(),
        dpctl_flows()
    );
    assert_eq!(report["ok"], 300, "every request succeeds: {report}");
    let shares = shares(&report);
    assert_eq!(shares.len(), 3, "all three backends served: {shares:?}");
    for (name, n) in &shares {
        assert!(
            (90..=110).contains(n),
            "{name} served {n}, not 100 ± 10%: {shares:?}"
        );
    }

    // The client resolved the VIP to the virtual MAC by ARP, with no static entry.
    let neigh = client
        .exec_checked(&["ip", "neigh", "show", VIP])
        .expect("ip neigh");
    assert!(
        neigh.contains("02:66:67:00:00:01"),
        "ARP for the VIP answered with the virtual MAC: {neigh}"
    );

    let flows = topo0.bridges[0].dump_flows().expect("dump-flows");
    assert!(
        flows.contains(&format!("nw_dst={VIP},tp_src=")),
        "forward rules match the client's connection:\n{flows}"
    );
    assert!(
        flows.contains("set_field:10.0.0.2->ip_dst"),
        "forward rewrite to a backend:\n{flows}"
    );
    assert!(
        flows.contains(&format!("set_field:{VIP}->ip_src")),
        "reverse rewrite back to the VIP:\n{flows}"
    );
    // A rule shows the configured idle timeout until its connection's FIN, then the
    // fin_timeout's 1 s (OVS rewrites the rule's idle_timeout): by the time the load is
    // over, every rule may be a closed connection's.
    assert!(
        (flows.contains("idle_timeout=30") || flows.contains("idle_timeout=1,"))
            && flows.contains("fin_timeout(idle_timeout=1)")
            && flows.contains("send_flow_rem"),
        "idle timeout, fin timeout and flow-removed:\n{flows}"
    );

    let services = ctl.get_json("/api/v1/services");
    let total: u64 = services[0]["backends"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["connections_total"].as_u64().unwrap())
        .sum();
    assert_eq!(total, 300, "one decision per connection: {services}");
    ctl.assert_no_openflow_errors();
}

/// The responses in a `flowgate load --conn-log` file that the controller's log does not
/// account for: `(client port, backend that answered, times it answered on that port,
/// times the controller chose it for that port)`, where it answered more often than it was
/// chosen. Counted per port, so a port the client reused for several connections is fine
/// as long as each of them was decided for the backend that answered it.
fn untraced_responses(
    ctl: &Ctl,
    conn_log: &std::path::Path,
    names: &[(String, std::net::Ipv4Addr)],
) -> Vec<(u16, String, u64, u64)> {
    use std::collections::BTreeMap;
    let log = ctl.log_plain();
    let mut decided: BTreeMap<(u16, std::net::Ipv4Addr), u64> = BTreeMap::new();
    for line in log
        .lines()
        .filter(|l| l.contains("new connection service="))
    {
        let field = |k: &str| line.split_whitespace().find_map(|w| w.strip_prefix(k));
        if let (Some(Ok(p)), Some(Ok(b))) = (
            field("cport=").map(str::parse::<u16>),
            field("backend=").map(str::parse),
        ) {
            *decided.entry((p, b)).or_default() += 1;
        }
    }
    let text = std::fs::read_to_string(conn_log).expect("connection log");
    let mut answered: BTreeMap<(u16, String), u64> = BTreeMap::new();
    for line in text.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        // `-`: no response (the failures are the load report's to show).
        if let (Some(Ok(port)), Some(backend)) = (w.first().map(|p| p.parse::<u16>()), w.get(1))
            && *backend != "-"
        {
            *answered.entry((port, backend.to_string())).or_default() += 1;
        }
    }
    answered
        .into_iter()
        .filter_map(|((port, backend), n)| {
            let ip = names.iter().find(|(b, _)| *b == backend).map(|(_, ip)| *ip);
            let d = ip.map_or(0, |ip| decided.get(&(port, ip)).copied().unwrap_or(0));
            (n > d).then_some((port, backend, n, d))
        })
        .collect()
}

/// The userspace datapath's megaflows (what OVS forwards without asking the rules).
fn dpctl_flows() -> String {
    flowgate_testbed::ovs::appctl(&["dpctl/dump-flows", "-m"]).unwrap_or_default()
}

/// A client that reuses its source ports (a 256-port ephemeral range for 300 connections;
/// the kernel also does it on its own when other connections from the same address to the
/// same service advance its port counter, as in CI): every connection on a reused 4-tuple
/// is decided and counted, and answered by the backend decided for it, never carried
/// undecided by the previous connection's rule (or its megaflow) to its backend.
#[test]
fn ovs_reused_client_ports_are_each_decided() {
    let Some(p) = setup("ovs_reused_client_ports_are_each_decided") else {
        return;
    };
    let t = topo::single(&TopoOptions::new(p.as_str()), 4).expect("topology");
    let backends: Vec<_> = t.hosts[1..].iter().map(|h| h.ip()).collect();
    let ctl = Ctl::start("reuse", &vip_config(VIP, "round-robin", &backends, ""));
    ctl.control(&t.bridges[..1]);
    let _servers: Vec<_> = t.hosts[1..]
        .iter()
        .enumerate()
        .map(|(i, h)| httpd(h, &format!("b{}", i + 2), &[]))
        .collect();
    ctl.wait_backends_ready(Duration::from_secs(15));

    let client = &t.hosts[0];
    // The client often closes first and keeps the port in TIME_WAIT: let it reuse such a
    // port (after a second), as busy clients are set up to (both sysctls are per netns).
    for kv in [
        "net.ipv4.ip_local_port_range=40000 40255",
        "net.ipv4.tcp_tw_reuse=1",
    ] {
        client
            .exec_checked(&["sysctl", "-w", kv])
            .expect("client sysctl");
    }
    let conn_log = ctl.dir.join("load-connections.txt");
    let report = load(
        client,
        &format!("http://{VIP}/"),
        &[
            "--requests",
            "300",
            "--concurrency",
            "4",
            "--conn-log",
            conn_log.to_str().expect("utf-8 temp path"),
        ],
    );
    let names: Vec<(String, std::net::Ipv4Addr)> = t.hosts[1..]
        .iter()
        .enumerate()
        .map(|(i, h)| (format!("b{}", i + 2), h.ip()))
        .collect();
    let ports: std::collections::BTreeSet<String> = std::fs::read_to_string(&conn_log)
        .expect("connection log")
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .filter(|p| p != "-")
        .collect();
    assert!(
        ports.len() <= 256,
        "the client used its narrow range: {ports:?}"
    );
    let untraced = untraced_responses(&ctl, &conn_log, &names);
    assert!(
        untraced.is_empty(),
        "responses without a decision (port, answered by, answers, decisions):\n{untraced:?}\n\
         flows:\n{}\ndatapath:\n{}",
        t.bridges[0].dump_flows().unwrap_or_default(),
        dpctl_flows()
    );
    assert_eq!(report["ok"], 300, "every request succeeds: {report}");
    let services = ctl.get_json("/api/v1/services");
    let total: u64 = services[0]["backends"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["connections_total"].as_u64().unwrap())
        .sum();
    assert_eq!(total, 300, "one decision per connection: {services}");
    // A reused 4-tuple keeps its backend, so the shares are round robin's only roughly.
    assert_eq!(shares(&report).len(), 3, "all three backends served");
    ctl.assert_no_openflow_errors();
}

/// The first connection after a quiet spell (no connection rule in the switch) is answered
/// at once. Open vSwitch's datapath keeps flows cached from earlier lookups, here of the
/// backend's echo replies to the client, made while no rule told TCP apart; a rule added
/// later takes effect for them only when its revalidators come round. The backend's
/// SYN-ACK, sent a few microseconds after its connection's reverse rule was added, rode
/// such a flow to the client unrewritten, and the client sent its SYN again a second later
/// (found in the lab: the first connection of every domain of Case C took a second). Each
/// round here pings the backend from the client, then makes one connection to the VIP,
/// then waits for the connection's rules to go; the client retransmits no SYN.
#[test]
fn ovs_a_first_connection_after_a_quiet_spell_is_answered_at_once() {
    let Some(p) = setup("ovs_a_first_connection_after_a_quiet_spell_is_answered_at_once") else {
        return;
    };
    let t = topo::single(&TopoOptions::new(p.as_str()), 2).expect("topology");
    first_connections_after_quiet_spells(&t, 0, 1);
}

/// [`ovs_a_first_connection_after_a_quiet_spell_is_answered_at_once`] with the client and
/// the backend two switches apart: the SYN-ACK is rewritten at the client's switch, the
/// only one with the SYN-ACK catch.
#[test]
fn ovs_a_first_connection_after_a_quiet_spell_is_answered_at_once_across_switches() {
    let Some(p) = setup("ovs_first_connection_quiet_across") else {
        return;
    };
    let t = topo::linear(&TopoOptions::new(p.as_str()), 3, 1).expect("topology");
    first_connections_after_quiet_spells(&t, 0, 2);
}

/// Three rounds of: wait for no connection rule in any switch, ping host `backend` from
/// host `client`, one connection to the VIP (served by `backend`); no SYN retransmitted.
fn first_connections_after_quiet_spells(t: &topo::Topology, client: usize, backend: usize) {
    let (client, backend) = (&t.hosts[client], &t.hosts[backend]);
    let ctl = Ctl::start(
        "quiet",
        &vip_config(VIP, "round-robin", &[backend.ip()], "idle_timeout_secs = 1"),
    );
    ctl.control(&t.bridges);
    let _server = httpd(backend, "b", &[]);
    ctl.wait_backends_ready(Duration::from_secs(15));
    let syn_retransmits = || -> u64 {
        let text = client
            .exec_checked(&["cat", "/proc/net/netstat"])
            .expect("client's TCP counters");
        flowgate_testbed::load::tcp_ext(&text, "TCPSynRetrans").expect("TcpExt TCPSynRetrans")
    };
    let flows = || -> String {
        t.bridges
            .iter()
            .map(|b| b.dump_flows().unwrap_or_default())
            .collect()
    };
    for round in 0..3 {
        wait_until(
            "the connection rules to end",
            Duration::from_secs(10),
            || !flows().contains("priority=300"),
        );
        assert!(
            client.ping(backend.ip(), 2).expect("ping"),
            "round {round}: ping"
        );
        let before = syn_retransmits();
        let report = load(client, &format!("http://{VIP}/"), &["--requests", "1"]);
        assert_eq!(report["ok"], 1, "round {round}: {report}");
        assert_eq!(
            syn_retransmits() - before,
            0,
            "round {round}: the client sent its SYN again\nflows:\n{}\ndatapath:\n{}",
            flows(),
            dpctl_flows()
        );
    }
    ctl.assert_no_openflow_errors();
}

/// Three switches in a line, the client on the first and the backends on the others:
/// rules on every switch of each path, and the same guarantees.
#[test]
fn ovs_linear_three_switches() {
    let Some(p) = setup("ovs_linear_three_switches") else {
        return;
    };
    // h1 on s1, h2 on s2, h3 on s3 (Mininet's linear,3).
    let t = topo::linear(&TopoOptions::new(p.as_str()), 3, 1).expect("topology");
    let ctl = Ctl::start(
        "linear",
        &vip_config(VIP, "round-robin", &[t.hosts[1].ip(), t.hosts[2].ip()], ""),
    );
    ctl.control(&t.bridges);
    let _s2 = httpd(&t.hosts[1], "b2", &[]);
    let _s3 = httpd(&t.hosts[2], "b3", &[]);
    ctl.wait_backends_ready(Duration::from_secs(20));
    // Plain L2 between hosts on different switches works too.
    assert!(
        t.hosts[0]
            .ping_until(t.hosts[2].ip(), Duration::from_secs(10))
            .expect("ping"),
        "h1 reaches h3 across two links"
    );

    let report = load(
        &t.hosts[0],
        &format!("http://{VIP}/"),
        &["--requests", "300", "--concurrency", "4"],
    );
    assert_eq!(report["ok"], 300, "every request succeeds: {report}");
    for (name, n) in shares(&report) {
        assert!((135..=165).contains(&n), "{name} served {n}, not 150 ± 10%");
    }
    // The middle switch carries every connection: it holds rules for both directions.
    let s2 = t.bridges[1].dump_flows().expect("dump-flows s2");
    assert!(
        s2.contains("priority=300,tcp,nw_src=10.0.0.1,nw_dst=10.0.0.3"),
        "s2 forwards toward b3:\n{s2}"
    );
    assert!(
        s2.contains("priority=300,tcp,nw_src=10.0.0.3,nw_dst=10.0.0.1"),
        "s2 carries b3's replies:\n{s2}"
    );
    ctl.assert_no_openflow_errors();
}

/// A backend migrates while clients hold keep-alive connections to it: its port moves
/// from s3 to s2, as a virtual machine's moves to another hypervisor, addresses and open
/// sockets kept. Once it speaks from its new port, the controller gives its open
/// connections rules along their new path, and no request on them fails. Before, their
/// rules kept sending the client's packets to the old port, and every retransmission kept
/// those rules alive.
#[test]
fn ovs_open_connections_follow_a_migrated_backend() {
    let Some(p) = setup("ovs_open_connections_follow_a_migrated_backend") else {
        return;
    };
    let mut t = topo::linear(&TopoOptions::new(p.as_str()), 3, 1).expect("topology");
    let ctl = Ctl::start(
        "migrate",
        &vip_config(VIP, "round-robin", &[t.hosts[1].ip(), t.hosts[2].ip()], ""),
    );
    ctl.control(&t.bridges);
    let _s2 = httpd(&t.hosts[1], "b2", &[]);
    let _s3 = httpd(&t.hosts[2], "b3", &[]);
    ctl.wait_backends_ready(Duration::from_secs(20));
    let url = format!("http://{VIP}/");
    let (left, right) = t.hosts.split_at_mut(2);
    let (client, b3) = (&left[0], &mut right[0]);
    let s2 = &t.bridges[1];
    let report = std::thread::scope(|s| {
        // Four keep-alive connections, two on each backend (round robin), used back to
        // back across the move.
        let kept = s.spawn(|| keepalive_load(client, &url, 4, 6, 10000));
        std::thread::sleep(Duration::from_secs(2));
        let port = b3.move_to(s2).expect("h3 moves to s2");
        // A migrated VM announces itself (a gratuitous ARP); here its first frame from the
        // new port is an ARP request for an address nobody has.
        let _ = b3.exec(&["ping", "-c", "1", "-W", "1", "10.0.0.250"]);
        eprintln!("h3 moved to s2 port {port}");
        kept.join().expect("the load")
    });
    let rerouted = metric(
        &ctl.get("/metrics").1,
        "flowgate_connections_rerouted_total",
    );
    eprintln!("MEASURE across the backend's move: {report}; connections re-routed: {rerouted:?}");
    assert!(
        report["failed"] == 0 && report["ok"] == report["sent"],
        "every request on the kept connections served: {report}"
    );
    assert_eq!(shares(&report).len(), 2, "both backends served: {report}");
    assert_eq!(rerouted, Some(2.0), "h3's two connections re-routed");
    // New connections reach it at its new place too.
    let again = load(client, &url, &["--requests", "40", "--concurrency", "2"]);
    assert_eq!(again["ok"], 40, "{again}");
    assert_eq!(shares(&again).len(), 2, "{again}");
    ctl.assert_no_openflow_errors();
}

/// Killing the controller in the middle of a long download through the VIP does not break
/// the download; the restarted controller rebuilds its connections from the switch's flow
/// table and balances new connections again.
#[test]
fn ovs_controller_restart_keeps_connections() {
    let Some(p) = setup("ovs_controller_restart_keeps_connections") else {
        return;
    };
    let t = topo::single(&TopoOptions::new(p.as_str()), 3).expect("topology");
    let mut ctl = Ctl::start(
        "restart",
        &vip_config(VIP, "round-robin", &[t.hosts[1].ip(), t.hosts[2].ip()], ""),
    );
    ctl.control(&t.bridges[..1]);
    let _servers = [
        httpd(&t.hosts[1], "b2", &["--rate-bytes-per-sec", "1000000"]),
        httpd(&t.hosts[2], "b3", &["--rate-bytes-per-sec", "1000000"]),
    ];
    ctl.wait_backends_ready(Duration::from_secs(15));

    // A 6 MB download at 1 MB/s: six seconds on the wire.
    let client = &t.hosts[0];
    let url = format!("http://{VIP}/bytes/6000000");
    let dl = Download::start(client, &url);
    std::thread::sleep(Duration::from_millis(1500));
    ctl.restart();
    t.bridges[0]
        .wait_connected(Duration::from_secs(15))
        .expect("switch reconnects");
    // The restarted controller rebuilds the download's connection from the switch's flow
    // stats. Read while the download runs: a second after it ends (its FIN, then
    // `fin_timeout`) the switch removes its rules and the count with them, so a read
    // after curl returned raced that second.
    let rebuilt = |services: &serde_json::Value| -> u64 {
        services[0]["backends"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["active_connections"].as_u64().unwrap())
            .sum()
    };
    wait_until_explained(
        "connections rebuilt from flow stats",
        Duration::from_secs(10),
        || rebuilt(&ctl.get_json("/api/v1/services")) >= 1,
        || ctl.get_json("/api/v1/services").to_string(),
    );
    dl.finishes(6_000_000, "the download through the restart");

    ctl.wait_backends_ready(Duration::from_secs(15));
    let report = load(
        client,
        &format!("http://{VIP}/"),
        &["--requests", "40", "--concurrency", "2"],
    );
    assert_eq!(
        report["ok"], 40,
        "new connections are served after the restart: {report}"
    );
    for (name, n) in shares(&report) {
        assert_eq!(n, 20, "{name}: round robin again after the restart");
    }
    ctl.assert_no_openflow_errors();
}

/// A non-SYN segment of a connection the controller never saw is answered with a RST and
/// counted, never sent to an arbitrary backend.
#[test]
fn ovs_unknown_connection_is_reset() {
    let Some(p) = setup("ovs_unknown_connection_is_reset") else {
        return;
    };
    let t = topo::single(&TopoOptions::new(p.as_str()), 2).expect("topology");
    let ctl = Ctl::start(
        "unknown",
        &vip_config(VIP, "round-robin", &[t.hosts[1].ip()], ""),
    );
    ctl.control(&t.bridges[..1]);
    let _s = httpd(&t.hosts[1], "b2", &[]);
    ctl.wait_backends_ready(Duration::from_secs(15));
    let client = &t.hosts[0];
    // Resolve the VIP first, then send a bare ACK to it from a port no connection uses.
    assert!(
        client
            .ping_until(t.hosts[1].ip(), Duration::from_secs(5))
            .expect("ping")
    );
    let script = format!(
        "import socket,struct\n\
s=socket.socket(socket.AF_INET,socket.SOCK_RAW,socket.IPPROTO_TCP)\n\
src='{src}';dst='{VIP}'\n\
def csum(b):\n  b=b+(b'\\0' if len(b)%2 else b'')\n  s=sum(struct.unpack('!%dH'%(len(b)//2),b));s=(s>>16)+(s&0xffff);s+=s>>16;return ~s&0xffff\n\
tcp=struct.pack('!HHIIBBHHH',40001,80,1000,2000,5<<4,0x10,65535,0,0)\n\
ph=socket.inet_aton(src)+socket.inet_aton(dst)+struct.pack('!BBH',0,6,len(tcp))\n\
tcp=tcp[:16]+struct.pack('!H',csum(ph+tcp))+tcp[18:]\n\
s.settimeout(3)\n\
s.sendto(tcp,(dst,0))\n\
while True:\n  d,a=s.recvfrom(100)\n  if a[0]==dst:\n    f=d[20+13]\n    print('flags',f);break\n",
        src = client.ip()
    );
    // Make sure the client knows the VIP's MAC: a first real connection does that.
    let r = load(client, &format!("http://{VIP}/"), &["--requests", "1"]);
    assert_eq!(r["ok"], 1);
    let out = client.exec(&["python3", "-c", &script]).expect("python");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("flags 4") || text.contains("flags 20"),
        "a RST came back: {text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let services = ctl.get_json("/api/v1/services");
    assert!(
        services[0]["counters"]["unknown_flow_packets"]
            .as_u64()
            .unwrap()
            >= 1,
        "{services}"
    );
    ctl.assert_no_openflow_errors();
}
