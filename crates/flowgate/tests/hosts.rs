//! The controller's host tables on real Open vSwitch: bounded per port against forged
//! source MACs and sender addresses, and aged (a host silent for `host_timeout_secs` is
//! asked by ARP, and forgotten when it does not answer).

mod support;

use std::time::Duration;

use flowgate_testbed::topo::{self, TopoOptions};
use flowgate_testbed::{Host, ProcGuard};
use support::*;

const VIP: &str = "10.0.0.100";

/// What each ARP of a flood forges.
#[derive(Clone, Copy)]
enum Forged {
    /// Its source MAC: another one each time.
    SourceMac,
    /// Its sender address: the host's own MAC claims another address each time.
    SenderAddress,
}

/// `n` gratuitous ARPs out of `host`'s eth0, 1 ms apart (a burst would overrun Open
/// vSwitch's queue of PACKET_INs, not the controller's tables).
fn send_forged_arps(host: &Host, n: usize, forged: Forged) {
    let (mac, ip) = match forged {
        Forged::SourceMac => ("bytes([2,0xfa,0,0,i>>8,i&255])", "bytes([10,0,9,i%250+1])"),
        Forged::SenderAddress => ("own", "bytes([10,99,i>>8,i&255])"),
    };
    let script = format!(
        "import socket,struct,time\n\
own=bytes.fromhex(open('/sys/class/net/eth0/address').read().strip().replace(':',''))\n\
s=socket.socket(socket.AF_PACKET,socket.SOCK_RAW)\n\
s.bind(('eth0',0))\n\
for i in range({n}):\n  mac={mac}\n  ip={ip}\n  arp=struct.pack('!HHBBH',1,0x0800,6,4,1)+mac+ip+bytes(6)+ip\n  s.send(b'\\xff'*6+mac+b'\\x08\\x06'+arp)\n  time.sleep(0.001)\n"
    );
    host.exec_checked(&["python3", "-c", &script])
        .expect("the forged ARPs");
}

/// Whether `ctl`'s service `web` has located its backend `addr`.
fn backend_located(ctl: &Ctl, addr: std::net::Ipv4Addr) -> bool {
    ctl.get_json("/api/v1/services/web")["backends"]
        .as_array()
        .is_some_and(|bs| {
            bs.iter()
                .any(|b| b["address"] == addr.to_string() && b["located"] == true)
        })
}

/// A controller of `t`'s bridge whose host tables are small (24 in all, 8 per port), its
/// service `web` on `backends` (the first, `t.hosts[1]`, serving as `b1` and located),
/// and 10 requests from `t.hosts[0]` served.
fn start_with_small_host_tables(
    t: &topo::Topology,
    name: &str,
    backends: &[std::net::Ipv4Addr],
) -> (Ctl, ProcGuard) {
    let cfg = vip_config(VIP, "round-robin", backends, "")
        + "\n[controller]\nmax_hosts = 24\nmax_hosts_per_port = 8\n";
    let ctl = Ctl::start(name, &cfg);
    ctl.control(&t.bridges[..1]);
    let b1 = httpd(&t.hosts[1], "b1", &[]);
    wait_until("b1 located", Duration::from_secs(15), || {
        backend_located(&ctl, t.hosts[1].ip())
    });
    let r = load(
        &t.hosts[0],
        &format!("http://{VIP}/"),
        &["--requests", "10"],
    );
    assert_eq!(r["ok"], 10, "{r}");
    (ctl, b1)
}

/// A host sending frames from forged source MACs (a MAC flood) takes its port's share of
/// the host table (`max_hosts_per_port`), not the table: a host heard from afterwards at
/// another port is still learned, and the VIP keeps serving.
#[test]
fn ovs_forged_source_macs_take_one_ports_share_of_hosts() {
    let Some(p) = setup("ovs_forged_source_macs_take_one_ports_share_of_hosts") else {
        return;
    };
    let t = topo::single(&TopoOptions::new(p.as_str()), 3).expect("topology");
    let (ctl, _b1) = start_with_small_host_tables(&t, "macflood", &[t.hosts[1].ip()]);
    let (client, late) = (&t.hosts[0], &t.hosts[2]);
    let m = |name: &str| metric(&ctl.get("/metrics").1, name).unwrap_or(-1.0);

    const FORGED: usize = 300;
    send_forged_arps(client, FORGED, Forged::SourceMac);
    wait_until(
        "the forged MACs past the port's share refused",
        Duration::from_secs(10),
        || m("flowgate_hosts_refused_port_full_total") >= (FORGED - 8) as f64,
    );
    let refused = m("flowgate_hosts_refused_port_full_total");
    let hosts = m("flowgate_hosts");
    eprintln!(
        "MEASURE {FORGED} forged source MACs at one port: {refused} refused, {hosts} hosts known"
    );
    assert!(
        hosts <= 10.0,
        "the client's port 8, the backend, at most one more: {hosts}"
    );
    assert_eq!(
        m("flowgate_hosts_refused_total"),
        0.0,
        "the table never filled"
    );
    // The API says which port is at its share, and of what.
    let port_of = |h: &Host| -> serde_json::Value {
        let switches = ctl.get_json("/api/v1/switches");
        switches[0]["ports"]
            .as_array()
            .and_then(|ps| ps.iter().find(|p| p["port_no"] == h.ofport()).cloned())
            .unwrap_or_else(|| panic!("no port {} in {switches}", h.ofport()))
    };
    let flooded = port_of(client);
    assert_eq!(
        (&flooded["hosts"], &flooded["full"], &flooded["link"]),
        (
            &serde_json::json!(8),
            &serde_json::json!(true),
            &serde_json::json!(false)
        ),
        "{flooded}"
    );
    assert_eq!(port_of(late)["full"], false);
    let out = std::process::Command::new(FLOWGATE)
        .args(["ctl", "--api", &format!("http://{}", ctl.api), "switches"])
        .output()
        .expect("flowgate ctl switches");
    let text = String::from_utf8_lossy(&out.stdout);
    let row: Vec<&str> = text
        .lines()
        .nth(1)
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    // The client's port's 8 and the backend, the late host maybe too.
    let listed: u64 = row.get(2).and_then(|n| n.parse().ok()).unwrap_or(0);
    assert!((9..=10).contains(&listed), "HOSTS:\n{text}");
    assert_eq!(
        row.last(),
        Some(&client.ofport().to_string().as_str()),
        "FULL PORTS:\n{text}"
    );

    // A host that speaks only now, at another port, is learned.
    assert!(
        late.ping_until(client.ip(), Duration::from_secs(5))
            .expect("ping")
    );
    wait_until("the late host learned", Duration::from_secs(5), || {
        m("flowgate_hosts") >= hosts + 1.0
    });
    assert_eq!(m("flowgate_hosts_refused_total"), 0.0);
    let r = load(client, &format!("http://{VIP}/"), &["--requests", "20"]);
    assert_eq!(r["ok"], 20, "{r}");
    ctl.assert_no_openflow_errors();
}

/// A host answering ARP for forged sender addresses from its own MAC takes its port's
/// share of the address table (`max_hosts_per_port`), not the table (`max_hosts`): a
/// backend address that comes up afterwards at another port is still located, and the
/// VIP places connections on it. Without the port's bound the claims fill the table and
/// that backend is never located.
#[test]
fn ovs_forged_sender_addresses_take_one_ports_share_of_addresses() {
    let Some(p) = setup("ovs_forged_sender_addresses_take_one_ports_share_of_addresses") else {
        return;
    };
    let t = topo::single(&TopoOptions::new(p.as_str()), 3).expect("topology");
    let (client, late) = (&t.hosts[0], &t.hosts[2]);
    // A backend address no host has yet: `late` takes it after the flood.
    let [a, b, c, _] = late.ip().octets();
    let added = std::net::Ipv4Addr::new(a, b, c, 200);
    let (ctl, _b1) = start_with_small_host_tables(&t, "arpflood", &[t.hosts[1].ip(), added]);
    let m = |name: &str| metric(&ctl.get("/metrics").1, name).unwrap_or(-1.0);

    const FORGED: usize = 300;
    send_forged_arps(client, FORGED, Forged::SenderAddress);
    wait_until(
        "the claims past the port's share refused",
        Duration::from_secs(10),
        || m("flowgate_addresses_refused_port_full_total") >= (FORGED - 8) as f64,
    );
    let refused = m("flowgate_addresses_refused_port_full_total");
    eprintln!("MEASURE {FORGED} forged sender addresses from one MAC: {refused} refused");
    assert_eq!(
        m("flowgate_addresses_refused_total"),
        0.0,
        "the address table never filled"
    );

    // The new backend address comes up at another port: it is located, and served.
    late.exec_checked(&[
        "ip",
        "addr",
        "add",
        &format!("{added}/{}", late.prefix_len()),
        "dev",
        "eth0",
    ])
    .expect("add the backend's address");
    let listen = format!("{added}:80");
    let _b2 = late
        .spawn(&[FLOWGATE, "httpd", "--listen", &listen, "--name", "b2"])
        .expect("spawn httpd");
    wait_until("the new backend located", Duration::from_secs(10), || {
        backend_located(&ctl, added)
    });
    assert_eq!(m("flowgate_addresses_refused_total"), 0.0);
    let r = load(client, &format!("http://{VIP}/"), &["--requests", "20"]);
    assert_eq!(r["ok"], 20, "{r}");
    let served = shares(&r);
    assert_eq!(served.len(), 2, "both backends: {served:?}");
    ctl.assert_no_openflow_errors();
}

/// A virtual machine replaced by another at the same port (its MAC changes) leaves a host
/// that never speaks again. With one host a port (`max_hosts_per_port = 1`) the newcomer
/// is refused at first; the departed host, silent for `host_timeout_secs` and not
/// answering three ARP probes, is forgotten and its L2 rule deleted; then the newcomer
/// is learned. The client, silent as long but alive, answers its probes (Linux answers an
/// RFC 5227 probe) and is kept; the backend is never asked; the VIP serves throughout.
#[test]
fn ovs_a_departed_host_ages_out_and_a_live_one_answers() {
    let Some(p) = setup("ovs_a_departed_host_ages_out_and_a_live_one_answers") else {
        return;
    };
    let t = topo::single(&TopoOptions::new(p.as_str()), 3).expect("topology");
    let (client, vm) = (&t.hosts[0], &t.hosts[2]);
    let cfg = vip_config(VIP, "round-robin", &[t.hosts[1].ip()], "")
        + "\n[controller]\nmax_hosts_per_port = 1\nhost_timeout_secs = 2\n";
    let ctl = Ctl::start("ageing", &cfg);
    ctl.control(&t.bridges[..1]);
    let _b1 = httpd(&t.hosts[1], "b1", &[]);
    wait_until("b1 located", Duration::from_secs(15), || {
        backend_located(&ctl, t.hosts[1].ip())
    });
    let m = |name: &str| metric(&ctl.get("/metrics").1, name).unwrap_or(-1.0);
    let vm_port = || -> serde_json::Value {
        let switches = ctl.get_json("/api/v1/switches");
        switches[0]["ports"]
            .as_array()
            .and_then(|ps| ps.iter().find(|p| p["port_no"] == vm.ofport()).cloned())
            .unwrap_or_else(|| panic!("no port {} in {switches}", vm.ofport()))
    };
    let l2_rule_for = |mac: &str| {
        t.bridges[0]
            .dump_flows()
            .expect("dump-flows")
            .lines()
            .any(|l| l.contains("priority=100") && l.contains(&format!("dl_dst={mac}")))
    };

    // The first VM speaks: learned, with its address, and a rule toward it.
    let old_mac = vm.mac().to_string();
    assert!(
        vm.ping_until(client.ip(), Duration::from_secs(5))
            .expect("ping")
    );
    wait_until("the first VM learned", Duration::from_secs(5), || {
        vm_port()["hosts"] == 1 && l2_rule_for(&old_mac)
    });
    // It goes; another takes its port (same namespace, another MAC) and speaks: refused,
    // the port has its one host.
    let new_mac = "02:a9:e0:00:00:02";
    vm.exec_checked(&["ip", "link", "set", "eth0", "address", new_mac])
        .expect("a new MAC");
    let refused = m("flowgate_hosts_refused_port_full_total");
    assert!(
        vm.ping_until(client.ip(), Duration::from_secs(5))
            .expect("ping")
    );
    assert!(m("flowgate_hosts_refused_port_full_total") > refused);
    assert!(!l2_rule_for(new_mac));

    // Two seconds of silence, three probes a second apart: the first VM is forgotten,
    // its rule deleted.
    let started = std::time::Instant::now();
    wait_until("the first VM aged out", Duration::from_secs(15), || {
        m("flowgate_hosts_aged_total") >= 1.0
    });
    let took = started.elapsed();
    assert!(
        !l2_rule_for(&old_mac),
        "{}",
        t.bridges[0].dump_flows().unwrap_or_default()
    );
    assert_eq!(vm_port()["hosts"], 0);
    // The newcomer is learned when a frame of its own comes up: its next ARP broadcast
    // (a booting machine's first frames; here its ARP cache is emptied first, as its frames
    // to the client go by the client's rule and teach nothing).
    vm.exec_checked(&["ip", "neigh", "flush", "dev", "eth0"])
        .expect("flush the ARP cache");
    assert!(
        vm.ping_until(client.ip(), Duration::from_secs(5))
            .expect("ping")
    );
    // Failed once in CI (a retry passed, six local runs did not fail): its timeout says
    // what the controller and the switch held then, and what the VM's ARP cache did.
    wait_until_explained(
        "the new VM learned",
        Duration::from_secs(5),
        || vm_port()["hosts"] == 1 && l2_rule_for(new_mac),
        || {
            format!(
                "port {}; refused (port full) {}, refused {}; VM's ARP cache: {}\n{}",
                vm_port(),
                m("flowgate_hosts_refused_port_full_total"),
                m("flowgate_hosts_refused_total"),
                vm.exec_checked(&["ip", "neigh", "show", "dev", "eth0"])
                    .unwrap_or_default(),
                t.bridges[0].dump_flows().unwrap_or_default()
            )
        },
    );

    // The client and the new VM stay silent for three timeouts and more: asked, they
    // answer, and are kept; nobody else is forgotten.
    let probes = m("flowgate_host_probes_total");
    std::thread::sleep(Duration::from_secs(8));
    let asked = m("flowgate_host_probes_total") - probes;
    let aged = m("flowgate_hosts_aged_total");
    eprintln!(
        "MEASURE the departed host forgotten {:.1} s after its successor was refused; then {asked} probes in 8 s, hosts aged {aged}",
        took.as_secs_f64()
    );
    assert!(asked >= 2.0, "the silent hosts were asked: {asked}");
    assert_eq!(aged, 1.0, "only the departed host");
    assert_eq!(vm_port()["hosts"], 1);
    assert!(l2_rule_for(new_mac));
    let r = load(client, &format!("http://{VIP}/"), &["--requests", "20"]);
    assert_eq!(r["ok"], 20, "{r}");
    ctl.assert_no_openflow_errors();
}
