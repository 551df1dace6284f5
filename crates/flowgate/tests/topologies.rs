//! Multi-switch topologies under flowgate's L2: a Mininet-style tree (LLDP discovery,
//! spanning-tree flooding, shortest paths, the VIP across switches), a ring, where a
//! flooded broadcast must not circulate, and a leaf-spine fabric, whose connections
//! spread over its equal-cost paths.

mod support;

use std::time::{Duration, Instant};

use flowgate_testbed::topo::{self, TopoOptions};
use flowgate_testbed::{Bridge, Host, HostOptions, Link, LinkKind};
use support::*;

const VIP: &str = "10.0.0.100";

/// Mininet's tree,2,2: s1 at the root, s2 (h1, h2) and s3 (h3, h4) below it. Every pair
/// of hosts pings, and a client on s2 reaches the VIP served by the backends on s3.
#[test]
fn ovs_tree_topology() {
    let Some(p) = setup("ovs_tree_topology") else {
        return;
    };
    let t = topo::tree(&TopoOptions::new(p.as_str()), 2, 2).expect("topology");
    assert_eq!(
        (t.bridges.len(), t.hosts.len()),
        (3, 4),
        "tree,2,2 has 3 switches and 4 hosts"
    );
    let ctl = Ctl::start(
        "tree",
        &vip_config(VIP, "round-robin", &[t.hosts[2].ip(), t.hosts[3].ip()], ""),
    );
    ctl.control(&t.bridges);
    let failed = t.ping_all().expect("ping all");
    assert!(
        failed.is_empty(),
        "all pairs ping through the controller's L2; failed: {failed:?}\n{}",
        ctl.log()
    );

    let _s3 = httpd(&t.hosts[2], "b3", &[]);
    let _s4 = httpd(&t.hosts[3], "b4", &[]);
    ctl.wait_backends_ready(Duration::from_secs(20));
    let report = load(
        &t.hosts[0],
        &format!("http://{VIP}/"),
        &["--requests", "100", "--concurrency", "2"],
    );
    assert_eq!(
        report["ok"], 100,
        "every request through the VIP across the tree succeeds: {report}"
    );
    // Round robin over both backends on the other leaf.
    let shares = shares(&report);
    assert_round_robin(&shares, 100, 2, reopened(&ctl));
    assert_eq!(shares[0].0, "b3");
    assert_eq!(shares[1].0, "b4");

    // The shortest path h1 → h3 is s2 → s1 → s3: the root switch carries the connections.
    let root = t.bridges[0].dump_flows().expect("dump-flows s1");
    assert!(
        root.contains("nw_src=10.0.0.1,nw_dst=10.0.0.3")
            || root.contains("nw_src=10.0.0.1,nw_dst=10.0.0.4"),
        "s1 carries the client's connections:\n{root}"
    );
    ctl.assert_no_openflow_errors();
}

/// Three switches in a ring, one host on each. A broadcast ARP flooded by the controller
/// around a ring would come back to it for ever; with link discovery and a spanning tree it
/// does not: hosts on different switches ping, and PACKET_INs stay few.
/// Three switches in a ring under `ctl`, each with one host (h1..h3, 10.0.0.1..3, on
/// port 1), linked s1–s2, s2–s3, s3–s1 by `kind`; returned once every switch is connected.
fn ring(p: &str, ctl: &Ctl, kind: LinkKind) -> (Vec<Bridge>, Vec<Host>, Vec<Link>) {
    fabric(
        p,
        ctl,
        3,
        &[(1, 0), (2, 1), (3, 2)],
        &[(0, 1), (1, 2), (2, 0)],
        kind,
    )
}

/// Switches s1..s`n` under `ctl`; hosts `(i, s)`: h`i` (10.0.0.`i`, MAC 00:..:`i`) on the
/// switch of index `s`, created first so their ports come first; then links `(a, b)`
/// between the switches of those indexes, by `kind`. Returned once every switch is
/// connected.
fn fabric(
    p: &str,
    ctl: &Ctl,
    n: u64,
    hosts: &[(usize, usize)],
    links: &[(usize, usize)],
    kind: LinkKind,
) -> (Vec<Bridge>, Vec<Host>, Vec<Link>) {
    let bridges: Vec<Bridge> = (1..=n)
        .map(|i| Bridge::create(&format!("{p}s{i}"), i, &[ctl.target()]).expect("bridge"))
        .collect();
    let hosts: Vec<Host> = hosts
        .iter()
        .map(|&(i, on)| {
            let opts = HostOptions {
                mac: Some(format!("00:00:00:00:00:{i:02x}")),
                ..HostOptions::default()
            };
            Host::create_with(
                p,
                &format!("h{i}"),
                &format!("10.0.0.{i}/24"),
                &bridges[on],
                &opts,
            )
            .expect("host")
        })
        .collect();
    let links: Vec<Link> = links
        .iter()
        .map(|&(a, b)| {
            Link::create(
                kind,
                &bridges[a],
                &format!("{p}p{}x{}", a + 1, b + 1),
                &bridges[b],
                &format!("{p}p{}x{}", b + 1, a + 1),
            )
            .expect("link")
        })
        .collect();
    for b in &bridges {
        b.wait_connected(Duration::from_secs(10))
            .expect("switch connects");
    }
    (bridges, hosts, links)
}

/// h1 reaches h2 and h3 across the switches (link discovery done), and the backends
/// are ready.
fn reach_and_serve(ctl: &Ctl, hosts: &[Host]) {
    for b in [1, 2] {
        assert!(
            hosts[0]
                .ping_until(hosts[b].ip(), Duration::from_secs(15))
                .expect("ping"),
            "h1 reaches h{} across the switches",
            b + 1
        );
    }
    ctl.wait_backends_ready(Duration::from_secs(20));
}

/// The connection rules (priority 300) a switch holds.
fn conn_rules(b: &Bridge) -> usize {
    b.dump_flows()
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("priority=300,tcp"))
        .count()
}

/// The ring, the client h1 on s1 and the backend h2 on s2: keep-alive connections through
/// the VIP go over the s1–s2 link. When that cable is pulled (one end of the veth pair
/// down: both switches report the link down), their rules are written again around the
/// ring, s1–s3–s2, and no request on them fails. Before, their rules kept sending them
/// into the dead link, and every retransmission kept those rules alive.
#[test]
fn ovs_open_connections_go_around_a_failed_link() {
    let Some(p) = setup("ovs_open_connections_go_around_a_failed_link") else {
        return;
    };
    let p = p.as_str();
    let ctl = Ctl::start(
        "ringfail",
        &vip_config(VIP, "round-robin", &["10.0.0.2".parse().expect("ip")], ""),
    );
    let (bridges, hosts, links) = ring(p, &ctl, LinkKind::Veth);
    let _b2 = httpd(&hosts[1], "b2", &[]);
    reach_and_serve(&ctl, &hosts);
    let url = format!("http://{VIP}/");
    let report = std::thread::scope(|s| {
        let kept = s.spawn(|| keepalive_load(&hosts[0], &url, 2, 6, 10000));
        std::thread::sleep(Duration::from_secs(2));
        assert_eq!(conn_rules(&bridges[2]), 0, "the short way, not by s3");
        links[0].set_up(false).expect("the s1–s2 cable pulled");
        kept.join().expect("the load")
    });
    let rerouted = metric(
        &ctl.get("/metrics").1,
        "flowgate_connections_rerouted_total",
    );
    eprintln!("MEASURE across the link failure: {report}; connections re-routed: {rerouted:?}");
    assert!(
        report["failed"] == 0 && report["ok"] == report["sent"],
        "every request on the kept connections served: {report}"
    );
    assert_eq!(rerouted, Some(2.0), "both connections re-routed");
    assert_eq!(
        conn_rules(&bridges[2]),
        4,
        "both connections, both ways, by s3"
    );
    let again = load(&hosts[0], &url, &["--requests", "20", "--concurrency", "2"]);
    assert_eq!(again["ok"], 20, "new connections go around too: {again}");
    ctl.assert_no_openflow_errors();
}

#[test]
fn ovs_ring_does_not_loop() {
    let Some(p) = setup("ovs_ring_does_not_loop") else {
        return;
    };
    let p = p.as_str();
    let ctl = Ctl::start(
        "ring",
        &vip_config(VIP, "round-robin", &["10.0.0.3".parse().expect("ip")], ""),
    );
    let (_bridges, hosts, _links) = ring(p, &ctl, LinkKind::Patch);
    let start_pi = ctl.packet_ins();

    // Warm-up: the first pings may need link discovery to finish.
    for (a, b) in [(0, 1), (1, 2), (2, 0)] {
        assert!(
            hosts[a]
                .ping_until(hosts[b].ip(), Duration::from_secs(15))
                .expect("ping"),
            "h{} reaches h{} across the ring\n{}",
            a + 1,
            b + 1,
            ctl.log()
        );
    }
    let warm_pi = ctl.packet_ins();
    assert!(
        warm_pi - start_pi < 2000,
        "{} PACKET_INs while the ring was discovered: a broadcast loop",
        warm_pi - start_pi
    );

    // Five seconds of pings, each after flushing the ARP cache: a broadcast ARP each time.
    let before = ctl.packet_ins();
    let deadline = Instant::now() + Duration::from_secs(5);
    let (mut ok, mut tries) = (0, 0);
    while Instant::now() < deadline {
        // Paced: at most ten rounds a second, so the bound below holds on a fast machine.
        let round = Instant::now();
        for (a, b) in [(0usize, 2usize), (1, 0), (2, 1)] {
            hosts[a]
                .exec(&["ip", "neigh", "flush", "all"])
                .expect("flush");
            tries += 1;
            if hosts[a].ping(hosts[b].ip(), 1).expect("ping") {
                ok += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(100).saturating_sub(round.elapsed()));
    }
    let during = ctl.packet_ins() - before;
    std::thread::sleep(Duration::from_secs(1));
    let after = ctl.packet_ins() - before;
    eprintln!("{ok}/{tries} pings, {during} PACKET_INs in 5 s, {after} a second later");
    assert!(
        tries >= 6 && ok * 10 >= tries * 9,
        "pings across the ring: {ok}/{tries} answered"
    );
    assert!(
        during < 2000,
        "{during} PACKET_INs over 5 s of pinging: a broadcast loop"
    );
    // A loop would keep going after the pings stop.
    assert!(
        after - during < 100,
        "PACKET_INs kept coming after the pings stopped ({during} → {after})"
    );
    // And the data plane carries no storm: the host ports saw few packets.
    for h in &hosts {
        let rx = h
            .exec_checked(&["cat", "/sys/class/net/eth0/statistics/rx_packets"])
            .expect("stats");
        let rx: u64 = rx.trim().parse().expect("number");
        assert!(
            rx < 5000,
            "{} received {rx} packets: a broadcast storm",
            h.name()
        );
    }
    ctl.assert_no_openflow_errors();
}

/// A leaf-spine fabric on Open vSwitch: leaves s1 and s2 each linked to spines s3 and
/// s4, the client h1 on s1, the backends h2 and h3 on s2. The connections between the
/// leaves, and their rules, take both spines (each connection its own equal-cost path),
/// and every request is served. Before, every connection crossed the first spine.
#[test]
fn ovs_leaf_spine_connections_take_both_spines() {
    let Some(p) = setup("ovs_leaf_spine_connections_take_both_spines") else {
        return;
    };
    let p = p.as_str();
    let backends: Vec<std::net::Ipv4Addr> = ["10.0.0.2", "10.0.0.3"]
        .iter()
        .map(|a| a.parse().expect("ip"))
        .collect();
    let ctl = Ctl::start("leafspine", &vip_config(VIP, "round-robin", &backends, ""));
    // Leaves s1, s2; spines s3, s4.
    let (bridges, hosts, _links) = fabric(
        p,
        &ctl,
        4,
        &[(1, 0), (2, 1), (3, 1)],
        &[(0, 2), (0, 3), (1, 2), (1, 3)],
        LinkKind::Patch,
    );
    let _servers: Vec<_> = hosts[1..]
        .iter()
        .enumerate()
        .map(|(i, h)| httpd(h, &format!("b{}", i + 2), &[]))
        .collect();
    reach_and_serve(&ctl, &hosts);
    // Keep-alive connections, so their rules are all there at once.
    let report = keepalive_load(&hosts[0], &format!("http://{VIP}/"), 16, 2, 10000);
    let (s3, s4) = (conn_rules(&bridges[2]), conn_rules(&bridges[3]));
    eprintln!("MEASURE 16 connections across two spines: {s3} rules on s3, {s4} on s4; {report}");
    assert!(
        report["failed"] == 0 && report["ok"] == report["sent"],
        "every request served: {report}"
    );
    assert_eq!(
        s3 + s4,
        32,
        "each connection's two rules on the spines it crosses"
    );
    assert!(
        s3 >= 4 && s4 >= 4,
        "both spines carry connections: {s3} and {s4}"
    );
    ctl.assert_no_openflow_errors();
}
