//! The controller driven through a fake network (Faucet's method): every message it sends
//! is applied to fake flow tables or traced as a PACKET_OUT, every packet that misses goes
//! back to it as a PACKET_IN, and the tests assert where packets end up.

use std::collections::BTreeMap;
use std::time::Duration;

use flowgate_packet as packet;
use ofp::{Message, MultipartReply, MultipartReplyBody};

use super::*;
use crate::cookie;
use crate::service::LeftBackend;
use crate::testkit::sim::*;
use crate::testkit::{FlowEntry, PacketFields};

fn service_config(algorithm: &str, backends: &[u8]) -> String {
    let mut c = format!(
        "[[service]]\nname = \"web\"\nvip = \"{VIP}\"\nport = 80\nalgorithm = \"{algorithm}\"\n[service.health]\nkind = \"none\"\n"
    );
    for b in backends {
        c += &format!("[[service.backend]]\naddress = \"{}\"\n", ip(*b));
    }
    c
}

/// One switch with h1 (client) and h2..h4 (backends) on ports 1..4; every host has said
/// something so the controller knows where it is.
fn single_switch(algorithm: &str) -> Sim {
    one_switch(&service_config(algorithm, &[2, 3, 4]))
}

/// [`single_switch`]'s network under any configuration.
fn one_switch(config: &str) -> Sim {
    let hosts = [("h1", 1, 1), ("h2", 1, 2), ("h3", 1, 3), ("h4", 1, 4)];
    let mut sim = Sim::new(config, &[(1, 4)], &[], &hosts);
    for i in 1..=4u8 {
        sim.send(&format!("h{i}"), &arp_request(i, ip(9)));
    }
    sim
}

#[test]
fn arp_for_the_vip_is_answered_with_the_virtual_mac() {
    let mut sim = single_switch("round-robin");
    let got = sim.send("h1", &arp_request(1, VIP));
    let (who, reply) = got
        .iter()
        .find(|(h, _)| h == "h1")
        .expect("h1 gets an answer");
    assert_eq!(who, "h1");
    assert_eq!(reply.arp_op, Some(packet::ARP_OP_REPLY));
    assert_eq!(reply.arp_sha, Some(VMAC));
    assert_eq!(reply.arp_spa, Some(VIP));
    assert!(
        got.iter().all(|(h, _)| h == "h1"),
        "nobody else hears about the VIP: {got:?}"
    );
}

/// A frame from a service's virtual MAC (one the controller sent as the VIP, come back up
/// through a switch) teaches nothing: that MAC is the controller's, and learning it at a
/// port would send the service's traffic there. Every service's, not only the first's.
#[test]
fn frames_from_any_services_virtual_mac_teach_no_host() {
    let vmac2 = packet::MacAddr([0x02, 0x66, 0x67, 0, 1, 1]);
    let vip2 = Ipv4Addr::new(10, 0, 1, 100);
    let config = format!(
        "{}[[service]]\nname = \"api\"\nvip = \"{vip2}\"\nport = 80\nvirtual_mac = \"{vmac2}\"\nalgorithm = \"round-robin\"\n[service.health]\nkind = \"none\"\n[[service.backend]]\naddress = \"{}\"\n",
        service_config("round-robin", &[2, 3]),
        ip(4)
    );
    let mut sim = one_switch(&config);
    let hosts = sim.c.topo.host_count();
    for (from, vip) in [(VMAC, VIP), (vmac2, vip2)] {
        sim.packet_in(1, 4, tcp(from, mac(1), (vip, 80), (ip(1), 40000), ACK));
        assert!(sim.c.topo.host(from).is_none(), "{from} learned");
    }
    assert_eq!(sim.c.topo.host_count(), hosts);
    // The same frame from a host's MAC is learned: the check above can fail.
    let stranger = mac(7);
    sim.packet_in(
        1,
        4,
        tcp(stranger, mac(1), (ip(7), 80), (ip(1), 40000), ACK),
    );
    assert!(sim.c.topo.host(stranger).is_some());
}

#[test]
fn arp_between_hosts_is_flooded_then_unicast_is_carried_by_rules() {
    let mut sim = single_switch("round-robin");
    let got = sim.send("h1", &arp_request(1, ip(3)));
    let names: Vec<&str> = got.iter().map(|(h, _)| h.as_str()).collect();
    assert_eq!(
        names,
        ["h2", "h3", "h4"],
        "a broadcast reaches every other host once"
    );
    let before = sim.packet_ins;
    // h3 is known, so its MAC has an L2 rule: a unicast frame to it needs no controller.
    let got = sim.send("h1", &tcp(mac(1), mac(3), (ip(1), 5555), (ip(3), 22), SYN));
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].0, "h3");
    assert_eq!(sim.packet_ins, before, "carried by the switch alone");
}

#[test]
fn a_new_connection_is_rewritten_both_ways_and_stays_with_its_backend() {
    let mut sim = single_switch("round-robin");
    let client = (ip(1), 40000);
    let got = sim.send("h1", &tcp(mac(1), VMAC, client, (VIP, 80), SYN));
    assert_eq!(got.len(), 1, "the SYN reaches exactly one backend: {got:?}");
    let (backend, seen) = &got[0];
    let b: u8 = backend[1..].parse().unwrap();
    assert_eq!(
        seen.ipv4_dst,
        Some(ip(b)),
        "destination rewritten to the backend"
    );
    assert_eq!(seen.eth_dst, mac(b));

    // Every later packet of the connection, in either direction, is carried by the rules.
    let before = sim.packet_ins;
    let again = sim.send("h1", &tcp(mac(1), VMAC, client, (VIP, 80), ACK));
    assert_eq!(
        again.iter().map(|(h, _)| h.as_str()).collect::<Vec<_>>(),
        [backend.as_str()]
    );
    let reply = sim.send(backend, &tcp(mac(b), mac(1), (ip(b), 80), client, SYN_ACK));
    assert_eq!(reply.len(), 1);
    assert_eq!(reply[0].0, "h1");
    assert_eq!(
        reply[0].1.ipv4_src,
        Some(VIP),
        "the client only ever sees the VIP"
    );
    assert_eq!(reply[0].1.eth_src, VMAC);
    assert_eq!(sim.packet_ins, before, "no PACKET_IN once the rules are in");
}

#[test]
fn packets_that_race_the_rules_get_the_same_decision() {
    // OVS's userspace datapath applies rules a little after accepting them: the SYN's
    // retransmission and the backend's SYN-ACK may still come up. Simulate it by deleting
    // the rules from the fake switch and sending them as PACKET_INs directly.
    let mut sim = single_switch("round-robin");
    let client = (ip(1), 40001);
    let first = sim.send("h1", &tcp(mac(1), VMAC, client, (VIP, 80), SYN));
    let chosen = first[0].0.clone();
    let b: u8 = chosen[1..].parse().unwrap();
    for _ in 0..3 {
        sim.received.clear();
        sim.packet_in(1, 1, tcp(mac(1), VMAC, client, (VIP, 80), SYN));
        let got = std::mem::take(&mut sim.received);
        assert_eq!(got.len(), 1);
        assert_eq!(
            got[0].0, chosen,
            "a retransmitted SYN goes to the same backend"
        );
    }
    sim.received.clear();
    sim.packet_in(
        1,
        u32::from(b),
        tcp(mac(b), mac(1), (ip(b), 80), client, SYN_ACK),
    );
    let got = std::mem::take(&mut sim.received);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].0, "h1");
    assert_eq!(
        got[0].1.ipv4_src,
        Some(VIP),
        "the backend's early reply is rewritten too"
    );
    assert_eq!(
        sim.c.services()[0].counters.connections_total,
        1,
        "one decision for the connection"
    );
}

/// Open vSwitch looks a packet up in its datapath's cache of earlier lookups before its
/// tables, and brings the cache up to date with a rule change only some time after it: a
/// backend's SYN-ACK can meet a cached lookup from before its connection's reverse rule
/// (here: no connection rule in the table at all) and be carried by the L2 rule to the
/// client unrewritten, which drops it (seen in the lab). The SYN-ACK catch takes every
/// SYN-ACK from a backend's service port that no connection rule takes up to the
/// controller, which sends it on as the VIP; the backend's other segments, and a SYN-ACK
/// of a connection made to the backend directly, go on as they are.
#[test]
fn a_backends_syn_ack_that_misses_its_connection_rule_goes_back_as_the_vip() {
    let mut sim = single_switch("round-robin");
    let client = (ip(1), 40002);
    // The connection's rules not in force, as in a stale datapath cache.
    let (b, before, reply) = syn_ack_without_its_rule(&mut sim, client, 1);
    assert_eq!(sim.packet_ins, before + 1, "the SYN-ACK came up");
    assert_eq!(reply.len(), 1, "{reply:?}");
    assert_eq!(reply[0].0, "h1");
    assert_eq!(reply[0].1.ipv4_src, Some(VIP), "rewritten to the VIP");
    assert_eq!(reply[0].1.eth_src, VMAC);

    // Not a SYN-ACK: carried by the L2 rule, not brought up.
    let direct = (ip(1), 40003);
    let before = sim.packet_ins;
    let seg = sim.send(
        &format!("h{b}"),
        &tcp(mac(b), mac(1), (ip(b), 80), direct, ACK),
    );
    assert_eq!(sim.packet_ins, before, "no PACKET_IN for a plain segment");
    assert_eq!(seg.len(), 1);
    assert_eq!(seg[0].1.ipv4_src, Some(ip(b)));
    // A SYN-ACK of no connection of ours (the client addressed the backend): it comes
    // up and goes on unchanged.
    let direct_reply = sim.send(
        &format!("h{b}"),
        &tcp(mac(b), mac(1), (ip(b), 80), direct, SYN_ACK),
    );
    assert_eq!(sim.packet_ins, before + 1);
    assert_eq!(direct_reply.len(), 1, "{direct_reply:?}");
    assert_eq!(direct_reply[0].0, "h1");
    assert_eq!(direct_reply[0].1.ipv4_src, Some(ip(b)), "not rewritten");
}

/// h1 opens a connection to the VIP from `client`; switch `dpid` then loses its
/// connection rules, and the chosen backend answers with its SYN-ACK. Returns the backend's
/// host number, the PACKET_IN count before the SYN-ACK, and where the SYN-ACK went.
fn syn_ack_without_its_rule(
    sim: &mut Sim,
    client: (Ipv4Addr, u16),
    dpid: u64,
) -> (u8, usize, Vec<(String, PacketFields)>) {
    let first = sim.send("h1", &tcp(mac(1), VMAC, client, (VIP, 80), SYN));
    let b: u8 = first[0].0[1..].parse().unwrap();
    sim.carry_out(dpid, rules::delete_kind(RuleKind::Conn));
    let before = sim.packet_ins;
    let reply = sim.send(
        &format!("h{b}"),
        &tcp(mac(b), mac(1), (ip(b), 80), client, SYN_ACK),
    );
    (b, before, reply)
}

/// Switch `dpid`'s SYN-ACK catch rules.
fn syn_ack_catches(sim: &Sim, dpid: u64) -> Vec<&FlowEntry> {
    let sw = sim.net.switch(dpid).expect("the switch");
    let catches = sw
        .flows()
        .filter(|f| f.priority == rules::PRIO_SYN_ACK_CATCH);
    catches.collect()
}

/// The SYN-ACK catch is one rule per backend address and port, on a switch with a client
/// attached.
#[test]
fn the_syn_ack_catch_covers_each_backend_once() {
    let shared = format!(
        "{}[[service]]\nname = \"api\"\nvip = \"{}\"\nport = 80\n[service.health]\nkind = \"none\"\n[[service.backend]]\naddress = \"{}\"\n",
        service_config("round-robin", &[2, 3, 4]),
        ip(200),
        ip(2),
    );
    let sim = one_switch(&shared);
    let catches = syn_ack_catches(&sim, 1);
    assert_eq!(catches.len(), 3, "h2 (in both services), h3, h4");
    for f in catches {
        assert!(f.outputs_to(ofp::port::CONTROLLER), "{f:?}");
        assert_eq!(f.cookie & cookie::KIND_MASK, RuleKind::Intercept.base());
    }
}

/// The SYN-ACK catch only where clients are: on the linear network's first switch, not on
/// the transit switch nor on the backends' switch, where a SYN-ACK that beats its
/// connection's rule goes on by the L2 rule, as the rule would send it, and costs the
/// controller nothing. A reload puts back the catch where it was, and only there.
#[test]
fn the_syn_ack_catch_is_only_on_switches_with_clients() {
    let mut sim = linear();
    let catches = |sim: &Sim, d: u64| syn_ack_catches(sim, d).len();
    assert_eq!(
        (catches(&sim, 1), catches(&sim, 2), catches(&sim, 3)),
        (2, 0, 0)
    );
    let client = (ip(1), 40004);
    // The backends' switch has not taken the connection's rule yet.
    let (_, before, reply) = syn_ack_without_its_rule(&mut sim, client, 3);
    assert_eq!(
        sim.packet_ins, before,
        "carried by L2 to s1, not brought up"
    );
    assert_eq!(reply.len(), 1, "{reply:?}");
    assert_eq!(
        reply[0].1.ipv4_src,
        Some(VIP),
        "rewritten at the client's edge"
    );

    reload(&mut sim, &service_config("least-connections", &[5, 6]));
    assert_eq!(
        (catches(&sim, 1), catches(&sim, 2), catches(&sim, 3)),
        (2, 0, 0)
    );
}

#[test]
fn round_robin_spreads_connections_and_counts_them() {
    let mut sim = single_switch("round-robin");
    let mut counts = BTreeMap::new();
    for port in 0..30u16 {
        let got = sim.send(
            "h1",
            &tcp(mac(1), VMAC, (ip(1), 41000 + port), (VIP, 80), SYN),
        );
        *counts.entry(got[0].0.clone()).or_insert(0) += 1;
    }
    assert_eq!(
        counts.values().copied().collect::<Vec<_>>(),
        [10, 10, 10],
        "{counts:?}"
    );
    let active: u32 = sim.c.services()[0]
        .backends
        .iter()
        .map(|b| b.active_connections)
        .sum();
    assert_eq!(active, 30);
}

/// One switch, a client (h1) and three backends (h2..h4) the controller has not located
/// yet (it has just connected: started, restarted, promoted), in its reconnect grace.
fn unlocated_backends() -> Sim {
    let hosts = [("h1", 1, 1), ("h2", 1, 2), ("h3", 1, 3), ("h4", 1, 4)];
    Sim::new(
        &service_config("round-robin", &[2, 3, 4]),
        &[(1, 4)],
        &[],
        &hosts,
    )
}

/// (SYNs held, connections refused) of the one service.
fn held_and_refused(sim: &Sim) -> (u64, u64) {
    let c = &sim.c.services()[0].counters;
    (c.held_settling, c.refused_no_backend)
}

/// What the controller asked for by ARP (out of every edge port).
fn arp_asks(got: &[(String, crate::testkit::PacketFields)]) -> Vec<Ipv4Addr> {
    let mut asked: Vec<_> = got
        .iter()
        .filter(|(_, f)| f.arp_op == Some(packet::ARP_OP_REQUEST))
        .filter_map(|(_, f)| f.arp_tpa)
        .collect();
    asked.sort();
    asked.dedup();
    asked
}

fn is_rst(f: &crate::testkit::PacketFields) -> bool {
    f.tcp_flags.is_some_and(|f| f & 0x04 != 0)
}

/// A SYN that comes before any backend is found is held, not refused, and answered
/// within a tick of a backend answering the controller's ARP: its client does not wait
/// a second to send it again.
#[test]
fn a_syn_held_before_any_backend_is_located_is_answered_once_one_is() {
    let mut sim = unlocated_backends();
    let syn = |port: u16| tcp(mac(1), VMAC, (ip(1), port), (VIP, 80), SYN);
    sim.tick(Duration::from_millis(200));
    let got = sim.send("h1", &syn(41000));
    assert!(
        got.iter().all(|(_, f)| f.tcp_flags.is_none()),
        "no RST, and nothing to a backend: {got:?}"
    );
    assert_eq!(held_and_refused(&sim), (1, 0));
    assert_eq!(
        arp_asks(&got),
        [ip(2), ip(3), ip(4)],
        "the backends are asked for at once"
    );
    // Within 100 ms of that probe, a second held SYN asks nothing more.
    let got = sim.send("h1", &syn(41001));
    assert!(got.is_empty(), "held, nothing asked: {got:?}");
    assert_eq!(held_and_refused(&sim), (2, 0));
    assert_eq!(sim.c.syns_held(), 2);
    // A tick that changes nothing sends nothing; 100 ms on, the backends are asked for
    // again (a switch promoted since the last ask carries this one).
    sim.received.clear();
    sim.tick(Duration::from_millis(10));
    assert!(sim.received.is_empty(), "{:?}", sim.received);
    assert_eq!(sim.c.syns_held(), 2);
    sim.tick(Duration::from_millis(100));
    assert_eq!(arp_asks(&sim.received), [ip(2), ip(3), ip(4)]);
    assert_eq!(sim.c.syns_held(), 2);

    // A backend answers: at the next tick both SYNs go to it, as they were sent.
    sim.send("h3", &arp_request(3, ip(9)));
    sim.received.clear();
    sim.tick(Duration::from_millis(10));
    let mut to_h3: Vec<_> = sim
        .received
        .iter()
        .filter(|(h, f)| h == "h3" && f.tcp_flags == Some(u16::from(SYN)))
        .map(|(_, f)| (f.ipv4_dst, f.tcp_src))
        .collect();
    to_h3.sort();
    assert_eq!(
        to_h3,
        [(Some(ip(3)), Some(41000)), (Some(ip(3)), Some(41001))],
        "{:?}",
        sim.received
    );
    assert_eq!(sim.c.services()[0].counters.connections_total, 2);
    assert_eq!(sim.c.syns_held(), 0);
    assert_eq!(held_and_refused(&sim), (2, 0), "counted once each");
    assert_eq!(sim.c.services()[0].counters.held_answered, 2);
    // The connections have their rules: the client's next segment goes by the switch.
    let before = sim.packet_ins;
    let got = sim.send("h1", &tcp(mac(1), VMAC, (ip(1), 41000), (VIP, 80), ACK));
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].0, "h3");
    assert_eq!(sim.packet_ins, before, "no PACKET_IN");
}

/// A held SYN whose client sent it again, and was served, meanwhile is let go: its
/// backend does not get the SYN a second time.
#[test]
fn a_held_syn_served_by_its_retransmission_is_not_sent_again() {
    let mut sim = unlocated_backends();
    let syn = tcp(mac(1), VMAC, (ip(1), 41000), (VIP, 80), SYN);
    sim.tick(Duration::from_millis(200));
    sim.send("h1", &syn);
    assert_eq!(sim.c.syns_held(), 1);
    // A backend answers, and before the next tick the client's retransmission comes.
    sim.send("h3", &arp_request(3, ip(9)));
    let got = sim.send("h1", &syn);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].0, "h3");
    sim.received.clear();
    sim.tick(Duration::from_millis(10));
    assert!(
        sim.received.iter().all(|(_, f)| f.tcp_flags.is_none()),
        "{:?}",
        sim.received
    );
    assert_eq!(sim.c.syns_held(), 0);
    let c = &sim.c.services()[0].counters;
    assert_eq!((c.connections_total, c.held_answered), (1, 0));
}

/// Past the reconnect grace, a SYN still held is refused with a RST, as a SYN no backend
/// can take is from then on; a SYN held longer than the client's initial RTO is dropped
/// (the client has sent it again, and its new copy is held instead).
#[test]
fn a_syn_held_through_the_grace_is_refused_when_it_ends() {
    let mut sim = unlocated_backends();
    let grace = sim.c.config().reconnect_grace;
    assert!(grace >= Duration::from_secs(2), "{grace:?}");
    let syn = |port: u16| tcp(mac(1), VMAC, (ip(1), port), (VIP, 80), SYN);
    sim.tick(Duration::from_millis(200));
    sim.send("h1", &syn(41000));
    // Its client's RTO passes: dropped.
    sim.tick(Duration::from_millis(1000));
    assert_eq!(sim.c.syns_held(), 0);
    // Held nearer the grace's end, until it.
    sim.tick(grace.saturating_sub(Duration::from_millis(1500)));
    sim.send("h1", &syn(41001));
    assert_eq!(sim.c.syns_held(), 1);
    assert_eq!(held_and_refused(&sim), (2, 0));
    sim.received.clear();
    sim.tick(Duration::from_millis(500));
    let rsts: Vec<_> = sim
        .received
        .iter()
        .filter(|(h, f)| h == "h1" && is_rst(f))
        .map(|(_, f)| f.tcp_dst)
        .collect();
    assert_eq!(rsts, [Some(41001)], "{:?}", sim.received);
    assert_eq!(held_and_refused(&sim), (2, 1));
    assert_eq!(sim.c.syns_held(), 0);
    assert_eq!(sim.c.services()[0].counters.held_answered, 0);

    // From then on, a SYN no backend can take is refused at once.
    let got = sim.send("h1", &syn(41002));
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].0, "h1");
    assert!(is_rst(&got[0].1), "a RST: {got:?}");
    assert_eq!(held_and_refused(&sim), (2, 2));

    // Once a backend answers, a client's SYN sent again is served.
    sim.send("h3", &arp_request(3, ip(9)));
    let got = sim.send("h1", &syn(41000));
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].0, "h3");
    assert_eq!(sim.c.services()[0].counters.connections_total, 1);
}

#[test]
fn an_unknown_non_syn_segment_is_reset_not_forwarded() {
    let mut sim = single_switch("round-robin");
    let got = sim.send("h1", &tcp(mac(1), VMAC, (ip(1), 42000), (VIP, 80), ACK));
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].0, "h1", "only the client hears back");
    assert_eq!(
        got[0].1.tcp_flags.map(|f| f & 0x04 != 0),
        Some(true),
        "it is a RST"
    );
    assert_eq!(got[0].1.ipv4_src, Some(VIP));
    assert_eq!(sim.c.services()[0].counters.unknown_flow_packets, 1);
    assert_eq!(sim.c.services()[0].counters.connections_total, 0);
}

/// A SYN no backend takes is refused with the RST its service would send, and the
/// runtime's encoding outbox sends the very bytes of the general PACKET_OUT: the reset
/// built in place (`packet::tcp_rst_v4`) is the general builder's.
#[test]
fn a_refused_syns_reset_encodes_as_its_general_packet_out() {
    let config = format!(
        "[controller]\nreconnect_grace_ms = 0\n\n{}",
        service_config("round-robin", &[2, 3, 4])
    );
    let mut sim = one_switch(&config);
    for b in 0..3 {
        assert!(sim.c.set_admin(sim.now, 0, b, AdminState::Draining));
    }
    let syn = tcp(mac(1), VMAC, (ip(1), 45000), (VIP, 80), SYN);
    let mut pi = bytes::BytesMut::new();
    ofp::encode(
        7,
        &Message::PacketIn(ofp::PacketIn::table_miss(1, syn.clone())),
        &mut pi,
    )
    .expect("a PACKET_IN encodes");
    let mut general = Outbox::new();
    sim.c
        .handle_packet_in_frame(sim.now, 1, &pi, &mut general)
        .expect("handled");
    let msgs: Vec<(u64, Message)> = general.drain().collect();
    let [(1, Message::PacketOut(po))] = &msgs[..] else {
        panic!("one PACKET_OUT to the switch: {msgs:?}");
    };
    let rst = packet::tcp_rst(&packet::parse(&syn).expect("parses")).expect("a reset");
    assert_eq!((po.in_port, &po.data), (ofp::port::CONTROLLER, &rst));
    assert_eq!(
        po.actions,
        rules::output(1),
        "back out of the client's port"
    );
    let mut want = bytes::BytesMut::new();
    ofp::encode(0, &msgs[0].1, &mut want).expect("a PACKET_OUT encodes");

    let mut encoding = Outbox::encoding();
    sim.c
        .handle_packet_in_frame(sim.now, 1, &pi, &mut encoding)
        .expect("handled");
    let enc = encoding.encoded_mut().expect("an encoding outbox");
    let got: Vec<(u64, Vec<u8>)> = enc.iter().map(|(d, _, b)| (d, b.to_vec())).collect();
    assert_eq!(got, vec![(1, want.to_vec())]);
    assert_eq!(sim.c.counters().resets_sent, 2);
    assert_eq!(sim.c.services()[0].counters.refused_no_backend, 2);
    assert_eq!(sim.c.connections().len(), 0, "nothing tracked");
}

#[test]
fn a_drained_backend_takes_no_new_connections_and_keeps_its_old_ones() {
    let mut sim = single_switch("round-robin");
    let first = sim.send("h1", &tcp(mac(1), VMAC, (ip(1), 43000), (VIP, 80), SYN));
    let drained = first[0].0.clone();
    let bi = sim.c.services()[0]
        .backend_index(ip(drained[1..].parse().unwrap()))
        .unwrap();
    assert!(sim.c.set_admin(sim.now, 0, bi, AdminState::Draining));
    for port in 1..=20u16 {
        let got = sim.send(
            "h1",
            &tcp(mac(1), VMAC, (ip(1), 43000 + port), (VIP, 80), SYN),
        );
        assert_ne!(got[0].0, drained, "no new connection to a draining backend");
    }
    // The existing connection still flows to it.
    let got = sim.send("h1", &tcp(mac(1), VMAC, (ip(1), 43000), (VIP, 80), ACK));
    assert_eq!(got[0].0, drained);
}

#[test]
fn flow_removed_ends_the_connection_and_its_count() {
    // Decoded into a message (tests, tools), or read from the frame (the runtime).
    for from_frame in [false, true] {
        let mut sim = single_switch("least-connections");
        sim.send("h1", &tcp(mac(1), VMAC, (ip(1), 44000), (VIP, 80), SYN));
        assert_eq!(sim.c.connections().len(), 1);
        let (key, _) = sim
            .c
            .connections()
            .iter()
            .next()
            .map(|(k, c)| (*k, *c))
            .unwrap();
        let m = rules::tcp_match(
            Some(key.client),
            Some(key.service_addr),
            Some(key.client_port),
            Some(key.service_port),
        );
        let fr = ofp::FlowRemoved {
            cookie: cookie::cookie(RuleKind::Conn, cookie::conn::ACCOUNTING),
            priority: rules::PRIO_CONN,
            reason: ofp::FlowRemovedReason::IdleTimeout,
            table_id: 0,
            duration_sec: 31,
            duration_nsec: 0,
            idle_timeout: 30,
            hard_timeout: 0,
            packet_count: 10,
            byte_count: 1000,
            match_: m,
        };
        let before = sim.c.counters().flow_removed;
        if from_frame {
            let mut frame = bytes::BytesMut::new();
            ofp::encode(9, &Message::FlowRemoved(fr), &mut frame).unwrap();
            let v = ofp::FlowRemovedView::new(&frame).unwrap();
            sim.c
                .handle_rule_ended(sim.now, 1, &RuleEnded::of_view(&v), &mut sim.out);
        } else {
            sim.c
                .handle_message(sim.now, 1, &Message::FlowRemoved(fr), &mut sim.out);
        }
        assert_eq!(sim.c.connections().len(), 0, "from the frame: {from_frame}");
        assert_eq!(sim.c.counters().flow_removed, before + 1);
        let active: u32 = sim.c.services()[0]
            .backends
            .iter()
            .map(|b| b.active_connections)
            .sum();
        assert_eq!(active, 0, "from the frame: {from_frame}");
    }
}

/// Three switches in a line (s1 - s2 - s3), the client h1 on s1 and the backends h5 and h6
/// on s3; every host has said something.
fn linear() -> Sim {
    let links = [((1, 2), (2, 2)), ((2, 3), (3, 2))];
    let hosts = [("h1", 1, 1), ("h5", 3, 1), ("h6", 3, 3)];
    let cfg = service_config("round-robin", &[5, 6]);
    let mut sim = Sim::new(&cfg, &[(1, 2), (2, 3), (3, 3)], &links, &hosts);
    for (h, i) in [("h1", 1), ("h5", 5), ("h6", 6)] {
        sim.send(h, &arp_request(i, ip(9)));
    }
    sim
}

/// The linear network: LLDP finds the links, and a connection gets rules on all three
/// switches.
#[test]
fn linear_topology_paths_cross_every_switch() {
    let mut sim = linear();
    assert_eq!(sim.c.topology().links().count(), 2, "LLDP found both links");
    let got = sim.send("h1", &tcp(mac(1), VMAC, (ip(1), 45000), (VIP, 80), SYN));
    assert_eq!(got.len(), 1);
    let backend = got[0].0.clone();
    let b: u8 = backend[1..].parse().unwrap();
    let before = sim.packet_ins;
    let fwd = sim.send("h1", &tcp(mac(1), VMAC, (ip(1), 45000), (VIP, 80), ACK));
    assert_eq!(fwd[0].0, backend);
    let back = sim.send(
        &backend,
        &tcp(mac(b), mac(1), (ip(b), 80), (ip(1), 45000), ACK),
    );
    assert_eq!(back[0].0, "h1");
    assert_eq!(back[0].1.ipv4_src, Some(VIP));
    assert_eq!(
        sim.packet_ins, before,
        "both directions carried by rules on every switch"
    );
    for d in 1..=3 {
        let conn_rules = sim
            .net
            .switch(d)
            .unwrap()
            .flows()
            .filter(|f| cookie::kind_of(f.cookie) == Some(RuleKind::Conn))
            .count();
        assert_eq!(
            conn_rules, 2,
            "switch {d} holds the forward and the reverse rule"
        );
    }
}

/// A backend migrates (a virtual machine moved to another hypervisor, addresses kept)
/// while a client's connection to it is open. Once it announces itself at its new port (a
/// gratuitous ARP, as a migrated VM sends), the connection's packets follow it, both ways,
/// carried by the switches' rules.
#[test]
fn an_open_connection_follows_its_backend_when_the_backend_moves() {
    let mut sim = linear();
    let client = (ip(1), 45100);
    let got = sim.send("h1", &tcp(mac(1), VMAC, client, (VIP, 80), SYN));
    move_and_follow(&mut sim, &got[0].0, client);
}

/// On [`linear`]: `backend` moves from s3 to s2 port 1 (s2's ports 2 and 3 are its links)
/// and announces itself there; `client`'s open connection to it follows it, both ways,
/// carried by the switches' rules, re-routed once.
fn move_and_follow(sim: &mut Sim, backend: &str, client: (std::net::Ipv4Addr, u16)) {
    let b: u8 = backend[1..].parse().unwrap();
    sim.net.move_host(backend, (2, 1));
    sim.send(backend, &arp_request(b, ip(b)));
    sim.tick(Duration::from_millis(10));
    let before = sim.packet_ins;
    let fwd = sim.send("h1", &tcp(mac(1), VMAC, client, (VIP, 80), ACK));
    assert_eq!(
        fwd.iter().map(|(h, _)| h.as_str()).collect::<Vec<_>>(),
        [backend],
        "the client's segment reaches the backend where it is now"
    );
    let back = sim.send(backend, &tcp(mac(b), mac(1), (ip(b), 80), client, ACK));
    assert_eq!(back.len(), 1, "{back:?}");
    assert_eq!(back[0].0, "h1");
    assert_eq!(back[0].1.ipv4_src, Some(VIP));
    assert_eq!(sim.packet_ins, before, "carried by rules, both ways");
    assert_eq!(sim.c.counters().connections_rerouted, 1);
}

/// A backend that leaves the pool takes no open connection with it: the connection stays
/// in the table, in no backend's count, and still goes to it, re-routed when the backend
/// moves, until its rule ends. (Its removal once dropped it from the table, which was
/// walked under the lock the PACKET_IN path waits for; the connection was then left on
/// its rules' old path when the backend moved.)
#[test]
fn a_removed_backends_open_connection_follows_it_until_it_ends() {
    let mut sim = linear();
    let client = (ip(1), 45200);
    let got = sim.send("h1", &tcp(mac(1), VMAC, client, (VIP, 80), SYN));
    let backend = got[0].0.clone();
    let b: u8 = backend[1..].parse().unwrap();
    let other = sim.send("h1", &tcp(mac(1), VMAC, (ip(1), 45201), (VIP, 80), SYN));
    assert_ne!(other[0].0, backend, "round-robin: one connection each");
    let s = &sim.c.services()[0];
    let position = s.backend_index(ip(b)).expect("in the pool");
    let id = s.backends[position].id;
    let now = sim.now;
    sim.c
        .remove_backend(now, 0, position, &mut sim.out)
        .expect("removed");
    sim.pump();
    let s = &sim.c.services()[0];
    assert_eq!(sim.c.connections().len(), 2, "no connection dropped");
    assert_eq!(s.position(id), None, "out of the pool");
    assert_eq!(s.destination(id).map(|(a, _)| a), Some(ip(b)));
    let left = |sim: &Sim| sim.c.services()[0].left_backends();
    assert_eq!(
        left(&sim),
        [LeftBackend {
            address: ip(b),
            open_connections: 1
        }]
    );
    assert_eq!(
        s.backends
            .iter()
            .map(|b| (b.address, b.active_connections))
            .collect::<Vec<_>>(),
        [(ip(if b == 5 { 6 } else { 5 }), 1)],
        "the backend that stays counts its own connection"
    );
    // It moves: the connection follows it.
    move_and_follow(&mut sim, &backend, client);

    // Its rule at the client's edge ends: so does the connection, and no count changes.
    end_at_the_edge(&mut sim, client);
    assert_eq!(sim.c.connections().len(), 1, "it ended");
    assert_eq!(active(&sim), 1, "the other connection is still counted");
    assert_eq!(left(&sim), [], "none left open to the removed backend");
}

/// The switch at `client`'s edge (s1) reports the end of the connection's accounting
/// rule, as it would at its idle timeout.
fn end_at_the_edge(sim: &mut Sim, client: (Ipv4Addr, u16)) {
    let ending: Vec<_> = sim
        .net
        .switch(1)
        .unwrap()
        .flows()
        .filter(|f| {
            cookie::kind_of(f.cookie) == Some(RuleKind::Conn)
                && f.cookie & cookie::conn::ACCOUNTING != 0
                && f.match_.tcp_src() == Some(client.1)
        })
        .cloned()
        .collect();
    assert_eq!(ending.len(), 1, "one accounting rule for the connection");
    let now = sim.now;
    sim.c
        .handle_message(now, 1, &flow_removed_of(&ending[0]), &mut sim.out);
}

/// Add a backend at `address` to the first service, as the API does; its position.
fn add_backend(sim: &mut Sim, address: Ipv4Addr) -> Result<usize, String> {
    let cfg = crate::config::BackendConfig {
        address,
        weight: 1,
        metrics: None,
        mac: None,
        capacity_rps: None,
    };
    let now = sim.now;
    let position = sim.c.add_backend(now, 0, cfg, &mut sim.out);
    sim.pump();
    position
}

/// Have the first service give all the backend numbers it has left.
fn spend_all_numbers(sim: &mut Sim) {
    let given = sim.c.services[0].numbers_given();
    sim.c.services[0].spend_numbers(crate::service::BACKEND_IDS - given);
}

/// A backend removed while connections to it are open, then added back (a removal
/// undone): it takes its number back, and counts those connections as its own again
/// until they end, instead of listing them under a removed backend beside itself.
#[test]
fn a_backend_added_back_takes_its_open_connections_back() {
    let mut sim = single_switch("round-robin");
    let client = (ip(1), 47000);
    let got = sim.send("h1", &tcp(mac(1), VMAC, client, (VIP, 80), SYN));
    let b: u8 = got[0].0[1..].parse().unwrap();
    let s = &sim.c.services()[0];
    let position = s.backend_index(ip(b)).expect("in the pool");
    let id = s.backends[position].id;
    let given = s.numbers_given();
    let now = sim.now;
    sim.c
        .remove_backend(now, 0, position, &mut sim.out)
        .expect("removed");
    sim.pump();
    assert_eq!(sim.c.services()[0].left_backends().len(), 1);
    let back = add_backend(&mut sim, ip(b)).expect("added back");
    let s = &sim.c.services()[0];
    assert_eq!(s.backends[back].id, id, "its number again");
    assert_eq!(s.numbers_given(), given, "no number spent");
    assert_eq!(s.backends[back].active_connections, 1);
    assert_eq!(s.left_backends(), [], "not listed as removed beside itself");
    // Its connection's end is counted off it.
    end_at_the_edge(&mut sim, client);
    assert_eq!(sim.c.connections().len(), 0, "it ended");
    assert_eq!(sim.c.services()[0].backends[back].active_connections, 0);
}

/// A service that has given all its numbers takes a backend back without numbering its
/// pool afresh: the backend has its own number, and the renumbering would forget the
/// connections still open to it.
#[test]
fn a_backend_added_back_to_a_service_out_of_numbers_keeps_its_connections() {
    let mut sim = single_switch("round-robin");
    spread(&mut sim, 48000, 6);
    let now = sim.now;
    sim.c
        .remove_backend(now, 0, 0, &mut sim.out)
        .expect("h2 removed");
    sim.pump();
    spend_all_numbers(&mut sim);
    let back = add_backend(&mut sim, ip(2)).expect("h2 back");
    let s = &sim.c.services()[0];
    assert_eq!(s.numbers_given(), crate::service::BACKEND_IDS, "not afresh");
    assert_eq!(sim.c.connections().len(), 6, "h2's two kept");
    assert_eq!(s.backends[back].active_connections, 2);
}

/// A service that has given all its backend numbers numbers its pool afresh when the
/// next backend joins: its connections take their backends' new numbers, and those of
/// backends that left are forgotten (one pass over the table, once every 65,535 joins).
#[test]
fn a_service_out_of_backend_numbers_numbers_its_pool_afresh() {
    // h2 and h3 in the pool; h4, on the network, joins later.
    let mut sim = one_switch(&service_config("round-robin", &[2, 3]));
    spread(&mut sim, 52000, 6);
    let now = sim.now;
    sim.c
        .remove_backend(now, 0, 0, &mut sim.out)
        .expect("h2 removed");
    sim.pump();
    assert_eq!(sim.c.connections().len(), 6, "h2's three stay");
    spend_all_numbers(&mut sim);
    let position = add_backend(&mut sim, ip(4)).expect("h4 joins");
    let s = &sim.c.services()[0];
    assert_eq!(s.numbers_given(), 2, "numbered afresh");
    assert_eq!(position, 1);
    assert_eq!(
        sim.c.connections().len(),
        3,
        "h2's old connections forgotten"
    );
    let numbers: BTreeMap<_, _> = s.backends.iter().map(|b| (b.id, b.address)).collect();
    assert_eq!(numbers.len(), 2, "one number each");
    let mut counted = BTreeMap::new();
    for (_, c) in sim.c.connections().iter() {
        *counted.entry(numbers[&c.backend]).or_insert(0u32) += 1;
    }
    assert_eq!(counted, BTreeMap::from([(ip(3), 3)]));
    for b in &s.backends {
        assert_eq!(
            b.active_connections,
            counted.get(&b.address).copied().unwrap_or(0),
            "{}",
            b.address
        );
    }
    assert_eq!(
        spread(&mut sim, 52100, 6),
        BTreeMap::from([("h3".into(), 3), ("h4".into(), 3)]),
        "the pool takes connections as before"
    );
}

/// A reload that drops a backend from the file leaves the table as it is: the dropped
/// backend's connections keep its number (no other backend gets it; the same address,
/// added back, takes it back with them), the others keep theirs and their counts.
#[test]
fn a_reload_keeps_the_connections_and_numbers_of_the_backends() {
    let mut sim = single_switch("round-robin");
    spread(&mut sim, 53000, 6);
    let h2 = sim.c.services()[0].backends[0].id;
    reload(&mut sim, &service_config("round-robin", &[3, 4]));
    let s = &sim.c.services()[0];
    let h2_left = [LeftBackend {
        address: ip(2),
        open_connections: 2,
    }];
    assert_eq!(sim.c.connections().len(), 6, "no connection dropped");
    assert_eq!(s.position(h2), None);
    assert_eq!(s.destination(h2).map(|(a, _)| a), Some(ip(2)));
    assert_eq!(s.left_backends(), h2_left);
    assert_eq!(
        s.backends
            .iter()
            .map(|b| b.active_connections)
            .collect::<Vec<_>>(),
        [2, 2]
    );
    let given = s.numbers_given();
    // h2 comes back, last in the file: it takes its number back, and its two connections
    // are counted as its own again.
    reload(&mut sim, &service_config("round-robin", &[3, 4, 2]));
    let s = &sim.c.services()[0];
    assert_eq!(s.backends[2].id, h2, "h2 back with its number");
    assert_eq!(s.position(h2), Some(2));
    assert_eq!(s.backends[2].active_connections, 2);
    assert_eq!(s.left_backends(), [], "none left out of the pool");
    assert_eq!(s.numbers_given(), given, "no number spent");
    assert_eq!(sim.c.connections().len(), 6);
    // A service that goes takes its connections out of the table.
    let other = "[[service]]\nname = \"other\"\nvip = \"10.0.0.200\"\nport = 80\n\
                 [service.health]\nkind = \"none\"\n[[service.backend]]\naddress = \"10.0.0.3\"\n";
    reload(&mut sim, other);
    assert_eq!(sim.c.connections().len(), 0);
}

/// The client moves to another switch: its connection's rules are written at its new
/// edge, under a new tag, so the end of the rule it left at its old edge (no packet
/// reaches it now) is not taken for the connection's end.
#[test]
fn an_open_connection_follows_its_client_to_another_switch() {
    let mut sim = linear();
    let client = (ip(1), 45200);
    let got = sim.send("h1", &tcp(mac(1), VMAC, client, (VIP, 80), SYN));
    let backend = got[0].0.clone();
    let b: u8 = backend[1..].parse().unwrap();
    let old_edge = conn_flows(&sim, cookie::conn::ACCOUNTING);
    assert_eq!(old_edge.len(), 1, "the accounting rule at s1");
    sim.net.move_host("h1", (2, 1));
    sim.send("h1", &arp_request(1, ip(1)));
    sim.tick(Duration::from_millis(10));
    assert_eq!(sim.c.counters().connections_rerouted, 1);
    let before = sim.packet_ins;
    let fwd = sim.send("h1", &tcp(mac(1), VMAC, client, (VIP, 80), ACK));
    assert_eq!(
        fwd.iter().map(|(h, _)| h.as_str()).collect::<Vec<_>>(),
        [backend.as_str()]
    );
    assert_eq!(fwd[0].1.ipv4_dst, Some(ip(b)), "rewritten at the new edge");
    let back = sim.send(&backend, &tcp(mac(b), mac(1), (ip(b), 80), client, ACK));
    assert_eq!(back.len(), 1, "{back:?}");
    assert_eq!(back[0].0, "h1");
    assert_eq!(back[0].1.ipv4_src, Some(VIP));
    assert_eq!(sim.packet_ins, before, "carried by rules, both ways");
    // The rule left at s1 expires: the connection goes on.
    let active_before = active(&sim);
    sim.c
        .handle_message(sim.now, 1, &flow_removed_of(&old_edge[0]), &mut sim.out);
    assert_eq!(sim.c.connections().len(), 1, "still open");
    assert_eq!(active(&sim), active_before);
}

/// A restarted controller rebuilds its connections from the switches' rules and finds the
/// links again: that is no change of their paths, and re-routes none of them.
#[test]
fn a_restarted_controller_does_not_reroute_the_connections_it_rebuilt() {
    let mut sim = linear();
    let client = (ip(1), 45400);
    let got = sim.send("h1", &tcp(mac(1), VMAC, client, (VIP, 80), SYN));
    let backend = got[0].0.clone();
    sim.restart(&service_config("round-robin", &[5, 6]));
    assert_eq!(sim.c.connections().len(), 1, "rebuilt from the rules");
    for (h, i) in [("h1", 1), ("h5", 5), ("h6", 6)] {
        sim.send(h, &arp_request(i, ip(9)));
    }
    sim.tick(Duration::from_millis(10));
    sim.tick(Duration::from_millis(10));
    assert_eq!(sim.c.counters().connections_rerouted, 0);
    let before = sim.packet_ins;
    let fwd = sim.send("h1", &tcp(mac(1), VMAC, client, (VIP, 80), ACK));
    assert_eq!(fwd.len(), 1, "{fwd:?}");
    assert_eq!(fwd[0].0, backend);
    assert_eq!(sim.packet_ins, before, "still carried by its rules");
}

/// A ring of three switches (s1–s2 on ports 2 and 3, s2–s3 on 2 and 3, s3–s1 on 2 and 3),
/// h1..h3 on port 1 of each, h2 the service's one backend.
fn ring() -> Sim {
    let links = [((1, 2), (2, 3)), ((2, 2), (3, 3)), ((3, 2), (1, 3))];
    let hosts = [("h1", 1, 1), ("h2", 2, 1), ("h3", 3, 1)];
    Sim::new(
        &service_config("round-robin", &[2]),
        &[(1, 3), (2, 3), (3, 3)],
        &links,
        &hosts,
    )
}

/// The ring's s1–s2 link goes down: both ends report it.
fn cut_ring_link(sim: &mut Sim) {
    sim.set_link(((1, 2), (2, 3)), false);
}

/// A ring of three switches, the client on s1 and the backend on s2: an open connection
/// goes over the s1–s2 link. When that link goes down (the switches report the ports
/// down), its rules are written again around the ring, s1–s3–s2, and it carries on.
#[test]
fn an_open_connection_goes_around_a_link_that_went_down() {
    let mut sim = ring();
    for (h, i) in [("h1", 1), ("h2", 2), ("h3", 3)] {
        sim.send(h, &arp_request(i, ip(9)));
    }
    let client = (ip(1), 45300);
    let got = sim.send("h1", &tcp(mac(1), VMAC, client, (VIP, 80), SYN));
    assert_eq!(got[0].0, "h2");
    let on_s3 = |sim: &Sim| {
        sim.net
            .switch(3)
            .unwrap()
            .flows()
            .filter(|f| cookie::kind_of(f.cookie) == Some(RuleKind::Conn))
            .count()
    };
    assert_eq!(on_s3(&sim), 0, "the short way, s1–s2");
    cut_ring_link(&mut sim);
    sim.tick(Duration::from_millis(10));
    assert_eq!(sim.c.counters().connections_rerouted, 1);
    assert_eq!(on_s3(&sim), 2, "both directions by s3 now");
    let before = sim.packet_ins;
    let fwd = sim.send("h1", &tcp(mac(1), VMAC, client, (VIP, 80), ACK));
    assert_eq!(
        fwd.iter().map(|(h, _)| h.as_str()).collect::<Vec<_>>(),
        ["h2"]
    );
    let back = sim.send("h2", &tcp(mac(2), mac(1), (ip(2), 80), client, ACK));
    assert_eq!(back.len(), 1, "{back:?}");
    assert_eq!(back[0].0, "h1");
    assert_eq!(back[0].1.ipv4_src, Some(VIP));
    assert_eq!(sim.packet_ins, before, "carried by rules, both ways");
    // Nothing else moved: a later topology change with the same paths re-routes nothing.
    sim.send("h3", &arp_request(3, ip(9)));
    sim.tick(Duration::from_millis(10));
    assert_eq!(sim.c.counters().connections_rerouted, 1);
}

/// A walk goes on between ticks in steps, each with the budget of the time since the last
/// (20,000 re-routed a second): 20 connections in its first slice (one step's budget, on
/// the tick that starts it), 20 more in a step a millisecond later, 200 on a tick 10 ms
/// after that. The PACKET_IN path waits for no slice longer than the time allows.
#[test]
fn a_walk_goes_on_between_ticks_a_steps_budget_at_a_time() {
    let mut sim = ring();
    for (h, i) in [("h1", 1), ("h2", 2), ("h3", 3)] {
        sim.send(h, &arp_request(i, ip(9)));
    }
    for port in 0..300 {
        sim.send(
            "h1",
            &tcp(mac(1), VMAC, (ip(1), 40000 + port), (VIP, 80), SYN),
        );
    }
    assert_eq!(sim.c.connections().len(), 300);
    sim.tick(Duration::from_millis(10));
    assert!(!sim.c.rerouting());
    cut_ring_link(&mut sim);
    sim.tick(Duration::from_millis(10));
    assert_eq!(sim.c.counters().connections_rerouted, 20);
    assert!(sim.c.rerouting());
    sim.now += WALK_STEP;
    assert!(sim.c.handle_reroute_step(sim.now, &mut sim.out));
    sim.pump();
    assert_eq!(sim.c.counters().connections_rerouted, 40);
    sim.tick(Duration::from_millis(10));
    assert_eq!(sim.c.counters().connections_rerouted, 240);
    // Until the walk ends, every connection re-routed once.
    while sim.c.rerouting() {
        sim.now += WALK_STEP;
        sim.c.handle_reroute_step(sim.now, &mut sim.out);
        sim.pump();
    }
    assert_eq!(sim.c.counters().connections_rerouted, 300);
    assert!(!sim.c.handle_reroute_step(sim.now, &mut sim.out));
}

/// A switch with no links that joins, or leaves, changes no path between the others: no
/// walk of the connection table follows. (A switch whose session drops and comes back
/// does both; with a million connections each walk took two seconds of ticks, each tick's
/// slice stalling the PACKET_IN path for hundreds of microseconds.) A link that goes still
/// starts one.
#[test]
fn a_switch_without_links_that_joins_or_leaves_starts_no_walk() {
    let mut sim = ring();
    for (h, i) in [("h1", 1), ("h2", 2), ("h3", 3)] {
        sim.send(h, &arp_request(i, ip(9)));
    }
    for port in [45600, 45601, 45602] {
        sim.send("h1", &tcp(mac(1), VMAC, (ip(1), port), (VIP, 80), SYN));
    }
    assert_eq!(sim.c.connections().len(), 3);
    sim.tick(Duration::from_millis(10));
    let checked = sim.c.counters().reroute_checked;
    sim.net.add_switch(9, crate::testkit::FakeTable::new());
    sim.ports.insert(9, vec![1]);
    let features = ofp::SwitchFeatures::emulated(9);
    sim.c.handle_switch_up(sim.now, features, &mut sim.out);
    sim.pump();
    sim.tick(Duration::from_millis(10));
    sim.c.handle_switch_down(sim.now, 9, &mut sim.out);
    sim.pump();
    sim.tick(Duration::from_millis(10));
    assert_eq!(
        sim.c.counters().reroute_checked,
        checked,
        "no connection looked at"
    );
    // The s1–s2 link goes: every connection is looked at, and re-routed around the ring.
    cut_ring_link(&mut sim);
    sim.tick(Duration::from_millis(10));
    assert_eq!(sim.c.counters().reroute_checked, checked + 3);
    assert_eq!(sim.c.counters().connections_rerouted, 3);
}

/// Two leaves (1, 2) under two spines (11, 12), leaf port `s` to spine `10 + s`: the
/// client h1 on leaf 1 (port 3), the backends h2-h4 on leaf 2 (ports 3-5).
fn leaf_spine() -> Sim {
    let links = [
        ((1, 1), (11, 1)),
        ((1, 2), (12, 1)),
        ((2, 1), (11, 2)),
        ((2, 2), (12, 2)),
    ];
    let hosts = [("h1", 1, 3), ("h2", 2, 3), ("h3", 2, 4), ("h4", 2, 5)];
    let mut sim = Sim::new(
        &service_config("round-robin", &[2, 3, 4]),
        &[(1, 5), (2, 5), (11, 2), (12, 2)],
        &links,
        &hosts,
    );
    for i in 1..=4u8 {
        sim.send(&format!("h{i}"), &arp_request(i, ip(9)));
    }
    sim
}

/// Connections between two leaves spread over both spines, each along its own
/// equal-cost path both ways, and each is carried by its rules in both directions.
#[test]
fn connections_spread_over_the_spines_and_are_carried_both_ways() {
    let mut sim = leaf_spine();
    let conn_rules = |sim: &Sim, d: u64| {
        sim.net
            .switch(d)
            .unwrap()
            .flows()
            .filter(|f| cookie::kind_of(f.cookie) == Some(RuleKind::Conn))
            .count()
    };
    for i in 0..40u16 {
        let client = (ip(1), 41000 + i);
        let got = sim.send("h1", &tcp(mac(1), VMAC, client, (VIP, 80), SYN));
        assert_eq!(got.len(), 1, "{got:?}");
        let (backend, f) = &got[0];
        let b: u8 = backend[1..].parse().expect("h<n>");
        assert_eq!(f.ipv4_dst, Some(ip(b)));
        // The client's ACK and the backend's answer go by rules alone.
        let before = sim.packet_ins;
        let fwd = sim.send("h1", &tcp(mac(1), VMAC, client, (VIP, 80), ACK));
        assert_eq!(fwd.len(), 1);
        assert_eq!(&fwd[0].0, backend);
        let back = sim.send(backend, &tcp(mac(b), mac(1), (ip(b), 80), client, ACK));
        assert_eq!(back.len(), 1, "{back:?}");
        assert_eq!((back[0].0.as_str(), back[0].1.ipv4_src), ("h1", Some(VIP)));
        assert_eq!(sim.packet_ins, before, "carried by rules, both ways");
    }
    // Each connection has one forward and one reverse rule on the spine(s) it crosses.
    let (a, b) = (conn_rules(&sim, 11), conn_rules(&sim, 12));
    assert_eq!(a + b, 80, "{a} + {b}");
    assert!(
        a >= 16 && b >= 16,
        "both spines carry connections: {a} and {b}"
    );
}

/// A ring of three switches: broadcasts follow the spanning tree and never loop.
#[test]
fn a_ring_floods_along_a_tree() {
    let mut sim = ring();
    let got = sim.send("h1", &arp_request(1, ip(3)));
    let mut names: Vec<&str> = got.iter().map(|(h, _)| h.as_str()).collect();
    names.sort();
    assert_eq!(
        names,
        ["h2", "h3"],
        "each other host hears the broadcast exactly once"
    );
}

/// Switch 1's connection rules as its flow-stats reply gives them, 5 s old.
fn conn_rules_as_flow_stats(sim: &Sim) -> Vec<ofp::FlowStats> {
    sim.net
        .switch(1)
        .expect("switch 1")
        .flows()
        .filter(|f| cookie::kind_of(f.cookie) == Some(RuleKind::Conn))
        .map(|f| ofp::FlowStats {
            duration_sec: 5,
            packet_count: 1,
            byte_count: 60,
            ..flow_stats_of(f)
        })
        .collect()
}

#[test]
fn a_restarted_controller_rebuilds_connections_from_flow_stats() {
    let mut sim = single_switch("round-robin");
    sim.send("h1", &tcp(mac(1), VMAC, (ip(1), 46000), (VIP, 80), SYN));
    let flows = conn_rules_as_flow_stats(&sim);
    let cfg = Config::from_toml(&service_config("round-robin", &[2, 3, 4]), &|_| None).unwrap();
    let mut fresh = Controller::new(&cfg);
    let mut out = Outbox::new();
    let reply = Message::MultipartReply(MultipartReply {
        flags: 0,
        body: MultipartReplyBody::Flow(flows),
    });
    fresh.handle_message(sim.now, 1, &reply, &mut out);
    assert_eq!(fresh.connections().len(), 1);
    let active: u32 = fresh.services()[0]
        .backends
        .iter()
        .map(|b| b.active_connections)
        .sum();
    assert_eq!(active, 1);
}

/// The hosts switch `dpid`'s L2 rules carry frames to, by their last MAC byte.
fn l2_hosts(sim: &Sim, dpid: u64) -> Vec<u8> {
    let mut v: Vec<u8> = sim
        .net
        .switch(dpid)
        .expect("switch")
        .flows()
        .filter(|f| cookie::kind_of(f.cookie) == Some(RuleKind::L2))
        .map(|f| (f.cookie & 0xff) as u8)
        .collect();
    v.sort_unstable();
    v
}

/// A restarted controller (or the peer taking over) knows no host: the switches keep
/// carrying frames by the L2 rules they hold until their reconnect grace ends. By then the
/// hosts heard from again are relearned; the silent ones are adopted where the switches'
/// own rules say they are; a rule that places its host nowhere (only toward a link) goes.
#[test]
fn a_restarted_controller_keeps_the_switches_l2_rules_and_adopts_silent_hosts() {
    let mut sim = linear();
    sim.tick(sim.c.config().reconnect_grace);
    // A host that left while no controller watched: only s1's rule, toward s2, remains.
    sim.carry_out(1, rules::l2_forward(mac(9), 2, false));
    assert_eq!(l2_hosts(&sim, 1), [1, 5, 6, 9]);
    let carried = |sim: &mut Sim, to: u8| {
        let before = sim.packet_ins;
        let got = sim.send(
            "h1",
            &tcp(mac(1), mac(to), (ip(1), 5555), (ip(to), 22), SYN),
        );
        let names: Vec<String> = got.into_iter().map(|(h, _)| h).collect();
        names == [format!("h{to}")] && sim.packet_ins == before
    };
    assert!(carried(&mut sim, 6));

    sim.restart(&service_config("round-robin", &[5, 6]));
    let grace = sim.c.config().reconnect_grace;
    assert_eq!(sim.c.topology().hosts().count(), 0, "a fresh controller");
    assert_eq!(
        l2_hosts(&sim, 1),
        [1, 5, 6, 9],
        "nothing deleted on reconnection"
    );
    // Every switch reported its L2 rules; one that reconnects replaces its report.
    let reported = sim.c.l2_reported.len();
    assert_eq!(reported, 4 + 3 + 3, "{:?}", sim.c.l2_reported);
    let features = sim.c.switches[&1].features;
    sim.c.handle_switch_up(sim.now, features, &mut sim.out);
    sim.pump();
    assert_eq!(sim.c.l2_reported.len(), reported);
    assert!(carried(&mut sim, 6), "carried by the switches alone");
    // h1 and h5 speak again within the grace; h6 stays silent.
    sim.tick(grace / 2);
    for (h, i) in [("h1", 1), ("h5", 5)] {
        sim.send(h, &arp_request(i, ip(9)));
    }
    assert!(carried(&mut sim, 6));
    assert_eq!(l2_hosts(&sim, 1), [1, 5, 6, 9]);
    // The grace ends.
    sim.tick(grace / 2 + Duration::from_millis(10));
    assert_eq!(
        sim.c.topology().host(mac(6)).map(|h| h.at),
        Some(PortRef::new(3, 3)),
        "the silent h6 adopted at its edge port"
    );
    assert_eq!(sim.c.topology().host(mac(9)), None);
    for d in 1..=3 {
        assert_eq!(l2_hosts(&sim, d), [1, 5, 6], "switch {d}");
    }
    assert!(
        carried(&mut sim, 6),
        "h6 still carried without the controller"
    );
    assert!(sim.c.l2_reported.is_empty(), "the reports are let go");
}

#[test]
fn forged_source_macs_fill_the_host_table_not_the_switches() {
    let cfg = format!(
        "{}[controller]\nmax_hosts = 6\n",
        service_config("round-robin", &[2, 3, 4])
    );
    let mut sim = one_switch(&cfg);
    // Twenty frames from h1's port, each from another made-up MAC.
    for i in 0..20u8 {
        sim.send("h1", &arp_request(100 + i, ip(9)));
    }
    assert_eq!(sim.c.topology().host_count(), 6);
    assert_eq!(sim.c.counters().hosts_refused, 18);
    assert_eq!(l2_hosts(&sim, 1), [1, 2, 3, 4, 100, 101]);
    // The hosts known before still get their frames from the switch alone.
    let before = sim.packet_ins;
    let got = sim.send("h1", &tcp(mac(1), mac(3), (ip(1), 5555), (ip(3), 22), SYN));
    assert_eq!((got.len(), sim.packet_ins), (1, before));
}

/// A port sending forged source MACs takes its share of the host table
/// (`max_hosts_per_port`), and the hosts that come later at other ports are still
/// learned, and carried by the switch.
#[test]
fn forged_source_macs_at_one_port_leave_the_table_to_the_others() {
    let mut sim = small_host_tables();
    for i in 0..200u8 {
        sim.send("h1", &arp_request(50 + i, ip(9)));
    }
    assert_eq!(sim.c.counters().hosts_refused_port_full, 198);
    assert_eq!(sim.c.counters().hosts_refused, 0);
    assert_eq!(l2_hosts(&sim, 1), [1, 50, 51]);
    // The backends, heard from afterwards, are learned, and their frames carried.
    for i in 2..=4u8 {
        sim.send(&format!("h{i}"), &arp_request(i, ip(9)));
    }
    assert_eq!(l2_hosts(&sim, 1), [1, 2, 3, 4, 50, 51]);
    let before = sim.packet_ins;
    let got = sim.send("h1", &tcp(mac(1), mac(3), (ip(1), 5555), (ip(3), 22), SYN));
    assert_eq!((got.len(), sim.packet_ins), (1, before));
    // And the service works.
    assert_a_backend_takes_a_connection(&mut sim);
}

/// One MAC claiming address after address by ARP (forged sender addresses) takes its
/// port's share of the address table, not the table: the backends' addresses, claimed
/// afterwards at other ports, are still learned, and the service places connections on
/// them. Without the port's bound the 200 claims would fill the table (`max_hosts`
/// 100), and the backends would stay unlocated.
#[test]
fn forged_sender_addresses_at_one_port_leave_the_table_to_the_others() {
    let mut sim = small_host_tables();
    for i in 0..200u8 {
        let forged = Ipv4Addr::new(10, 0, 1, i);
        sim.send("h1", &packet::arp_request(mac(1), forged, ip(9)));
    }
    assert_eq!(sim.c.counters().addresses_refused_port_full, 198);
    assert_eq!(sim.c.counters().addresses_refused, 0);
    assert_eq!(
        sim.c.topology().mac_of(Ipv4Addr::new(10, 0, 1, 1)),
        Some(mac(1))
    );
    assert_eq!(sim.c.topology().mac_of(Ipv4Addr::new(10, 0, 1, 2)), None);
    for i in 2..=4u8 {
        sim.send(&format!("h{i}"), &arp_request(i, ip(9)));
        assert_eq!(sim.c.topology().mac_of(ip(i)), Some(mac(i)));
    }
    assert_a_backend_takes_a_connection(&mut sim);
}

/// One switch, the client h1 at port 1 (heard from once) and the service's backends h2-h4
/// at ports 2-4 (not yet), with host tables of 100 in all and 3 per port.
fn small_host_tables() -> Sim {
    let cfg = format!(
        "{}[controller]\nmax_hosts = 100\nmax_hosts_per_port = 3\n",
        service_config("round-robin", &[2, 3, 4])
    );
    let hosts = [("h1", 1, 1), ("h2", 1, 2), ("h3", 1, 3), ("h4", 1, 4)];
    let mut sim = Sim::new(&cfg, &[(1, 4)], &[], &hosts);
    sim.send("h1", &arp_request(1, ip(9)));
    sim
}

/// A reload's host-table bounds apply at once (the topology kept the bounds it was built
/// with, while the controller's config said otherwise).
#[test]
fn a_reload_applies_new_host_table_bounds() {
    let mut sim = small_host_tables();
    let at_port_1 = |sim: &Sim| {
        sim.c
            .topology()
            .hosts()
            .filter(|(_, h)| h.at == PortRef::new(1, 1))
            .count()
    };
    let forge = |sim: &mut Sim, from: u8| {
        for m in from..from + 8 {
            let frame = packet::arp_request(mac(m), Ipv4Addr::new(10, 0, 2, m), ip(9));
            sim.packet_in(1, 1, frame);
        }
    };
    forge(&mut sim, 50);
    assert_eq!(at_port_1(&sim), 3, "three at a port");
    let cfg = Config::from_toml(
        &format!(
            "{}[controller]\nmax_hosts = 100\nmax_hosts_per_port = 6\n",
            service_config("round-robin", &[2, 3, 4])
        ),
        &|_| None,
    )
    .expect("valid config");
    let now = sim.now;
    sim.c.reload(now, &cfg, &mut sim.out);
    sim.pump();
    forge(&mut sim, 70);
    assert_eq!(at_port_1(&sim), 6, "six at a port after the reload");
}

/// A new connection from h1 to the VIP goes to one of the backends h2-h4.
fn assert_a_backend_takes_a_connection(sim: &mut Sim) {
    let got = sim.send("h1", &tcp(mac(1), VMAC, (ip(1), 40000), (VIP, 80), SYN));
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(["h2", "h3", "h4"].contains(&got[0].0.as_str()), "{got:?}");
}

#[test]
fn a_host_is_adopted_only_where_one_rule_places_it() {
    let mut sim = single_switch("round-robin");
    let mut out = Outbox::new();
    // Two switches' rules would put mac(7) at an edge port each (a link not found yet):
    // neither is taken. mac(8) has one.
    sim.c.l2_reported = vec![
        (mac(7), PortRef::new(1, 2)),
        (mac(8), PortRef::new(1, 3)),
        (mac(7), PortRef::new(1, 4)),
    ];
    sim.c.adopt_reported_hosts(sim.now, &mut out);
    assert_eq!(sim.c.topology().host(mac(7)), None);
    assert_eq!(
        sim.c.topology().host(mac(8)).map(|h| h.at),
        Some(PortRef::new(1, 3))
    );
}

#[test]
fn recomputed_l2_rules_are_added_before_the_old_ones_are_deleted() {
    let mut sim = single_switch("round-robin");
    sim.tick(sim.c.config().reconnect_grace);
    // A topology change: every host's rule again.
    sim.c.l2_generation = 0;
    let mut out = Outbox::new();
    sim.c.handle_tick(sim.now, &mut out);
    let msgs: Vec<Message> = out.drain().map(|(_, m)| m).collect();
    let l2 = |m: &Message, cmd: ofp::FlowModCommand| {
        matches!(m, Message::FlowMod(fm)
            if fm.command == cmd && cookie::kind_of(fm.cookie) == Some(RuleKind::L2))
    };
    let adds: Vec<usize> = (0..msgs.len())
        .filter(|&i| l2(&msgs[i], ofp::FlowModCommand::Add))
        .collect();
    let deletes: Vec<usize> = (0..msgs.len())
        .filter(|&i| l2(&msgs[i], ofp::FlowModCommand::Delete))
        .collect();
    assert_eq!(adds.len(), 4, "{msgs:?}");
    assert_eq!(deletes.len(), 1, "{msgs:?}");
    assert!(deletes[0] > adds[3]);
    assert!(matches!(msgs[deletes[0] - 1], Message::BarrierRequest));
    let Message::FlowMod(del) = &msgs[deletes[0]] else {
        unreachable!()
    };
    let Message::FlowMod(add) = &msgs[adds[0]] else {
        unreachable!()
    };
    assert_eq!(del.cookie_mask, cookie::KIND_MASK | cookie::l2::GEN);
    let new_gen = add.cookie & cookie::l2::GEN;
    assert_ne!(
        del.cookie & cookie::l2::GEN,
        new_gen,
        "the delete takes the other generation only"
    );
    // Carried out, the switch holds one rule per host, all of the new generation.
    for m in msgs {
        sim.carry_out(1, m);
    }
    assert_eq!(l2_hosts(&sim, 1), [1, 2, 3, 4]);
    assert!(
        sim.net
            .switch(1)
            .unwrap()
            .flows()
            .filter(|f| cookie::kind_of(f.cookie) == Some(RuleKind::L2))
            .all(|f| f.cookie & cookie::l2::GEN == new_gen)
    );
}

/// Opens five round-robin connections from h1 to each backend of the pool (h2..h4) and
/// reports the five of host `b` ended unanswered, one by one; `before_each` runs before
/// each report, given the connection's client port.
fn five_unanswered_connections_to(
    sim: &mut Sim,
    b: u8,
    first_port: u16,
    before_each: impl FnMut(&mut Sim, usize, u16),
) {
    let syn = |port| tcp(mac(1), VMAC, (ip(1), port), (VIP, 80), SYN);
    five_unanswered_connections(sim, b, syn, first_port, before_each);
}

/// [`five_unanswered_connections_to`], h1's SYNs built by `syn` from its port.
fn five_unanswered_connections(
    sim: &mut Sim,
    b: u8,
    syn: impl Fn(u16) -> ofp::Bytes,
    first_port: u16,
    mut before_each: impl FnMut(&mut Sim, usize, u16),
) {
    let pool = sim.c.services()[0].backends.len() as u16;
    for port in first_port..first_port + 5 * pool {
        sim.send("h1", &syn(port));
    }
    let outcome_rules: Vec<(u64, ofp::Match)> = sim
        .net
        .switch(1)
        .unwrap()
        .flows()
        .filter(|f| f.cookie & cookie::conn::OUTCOME != 0)
        .filter(|f| {
            f.match_
                .iter()
                .any(|o| matches!(o, ofp::Oxm::Ipv4Src { value, .. } if *value == ip(b)))
        })
        .map(|f| (f.cookie, f.match_.clone()))
        .collect();
    assert_eq!(
        outcome_rules.len(),
        5,
        "one outcome rule per connection to h{b}"
    );
    for (i, (cookie, m)) in outcome_rules.into_iter().enumerate() {
        let cport = m
            .iter()
            .find_map(|o| match o {
                ofp::Oxm::TcpDst(p) => Some(*p),
                _ => None,
            })
            .expect("the outcome rule matches the client's port");
        before_each(sim, i, cport);
        rule_idled_out(sim, cookie, m);
    }
}

/// The switch reports connection `cport`'s forward rule (its accounting rule) gone,
/// having carried nothing.
fn end_forward_rule(sim: &mut Sim, cport: u16) {
    end_conn_rule(sim, cookie::conn::ACCOUNTING, ofp::Oxm::TcpSrc(cport), 0);
}

/// The switch reports h1's connection rule with cookie bit `bit` and match field `field`
/// gone after 30 s idle, having carried `packets`.
fn end_conn_rule(sim: &mut Sim, bit: u64, field: ofp::Oxm, packets: u64) {
    let (cookie, m) = sim
        .net
        .switch(1)
        .unwrap()
        .flows()
        .filter(|f| f.cookie & bit != 0)
        .find(|f| f.match_.iter().any(|o| *o == field))
        .map(|f| (f.cookie, f.match_.clone()))
        .expect("the connection's rule");
    rule_ended(sim, cookie, m, packets);
}

/// The switch reports the connection rule `cookie` matching `m` gone after 30 s idle,
/// having carried nothing.
fn rule_idled_out(sim: &mut Sim, cookie: u64, m: ofp::Match) {
    rule_ended(sim, cookie, m, 0);
}

/// [`rule_idled_out`], the rule having carried `packets`.
fn rule_ended(sim: &mut Sim, cookie: u64, m: ofp::Match, packets: u64) {
    let fr = ofp::FlowRemoved {
        cookie,
        priority: rules::PRIO_CONN,
        reason: ofp::FlowRemovedReason::IdleTimeout,
        table_id: 0,
        duration_sec: 30,
        duration_nsec: 0,
        idle_timeout: 30,
        hard_timeout: 0,
        packet_count: packets,
        byte_count: packets * 100,
        match_: m,
    };
    sim.c
        .handle_message(sim.now, 1, &Message::FlowRemoved(fr), &mut sim.out);
}

/// A connection nothing answered idles its two rules out together, and Open vSwitch
/// reports the forward rule first: its end must not take the verdict with it (on OVS no
/// silent backend was ejected before, `ovs_a_lone_ejected_backend_...`).
#[test]
fn an_unanswered_connection_counts_when_its_forward_rule_ends_first() {
    let mut sim = single_switch("round-robin");
    five_unanswered_connections_to(&mut sim, 2, 46000, |sim, _, cport| {
        end_forward_rule(sim, cport);
    });
    let s = &sim.c.services()[0];
    assert!(
        s.backends[0].ejected,
        "ejected after five unanswered connections"
    );
    assert_eq!(s.backends[0].active_connections, 0, "each ended once");
}

/// A switch whose control channel is behind is not trusted to say that a backend did not
/// answer (full Case C's healthy servers were ejected by lagging switches): the silences
/// of connections decided before or during a reading over `outlier_max_channel_rtt_ms`
/// are excused. A reading under it, or a limit of 0, excuses nothing.
#[test]
fn a_lagging_switch_excuses_its_connections_silences() {
    let ms = Duration::from_millis;
    for (limit, reading, judged) in [
        ("", ms(200), true),
        ("", ms(900), false),
        ("outlier_max_channel_rtt_ms = 0\n", ms(900), true),
    ] {
        let config = format!(
            "[controller]\n{limit}{}",
            service_config("round-robin", &[2, 3, 4])
        );
        let mut sim = one_switch(&config);
        five_unanswered_connections_to(&mut sim, 2, 48000, |sim, i, _| {
            // Read after every connection was decided, before the first is judged.
            if i == 0 {
                sim.tick(ms(1));
                sim.c.note_channel_rtt(sim.now, 1, reading);
            }
        });
        let case = format!("limit {limit:?}, reading {reading:?}");
        assert_eq!(sim.c.services()[0].backends[0].ejected, judged, "{case}");
        let excused = if judged { 0 } else { 5 };
        assert_eq!(sim.c.counters().silences_excused_lag, excused, "{case}");
        assert_eq!(sim.c.counters().lag_spells, u64::from(!judged), "{case}");
        assert_eq!(
            sim.c.switch_view(1).and_then(|v| v.channel_rtt),
            Some(reading),
            "{case}: the reading is shown"
        );
    }
}

/// The lag excuses only the connections it could have touched: once the switch has caught
/// up, connections decided after it are judged again.
#[test]
fn silences_after_the_lag_are_judged() {
    let ms = Duration::from_millis;
    let mut sim = single_switch("round-robin");
    sim.c.note_channel_rtt(sim.now, 1, ms(900));
    sim.tick(ms(5));
    sim.c.note_channel_rtt(sim.now, 1, ms(1));
    sim.tick(ms(5));
    five_unanswered_connections_to(&mut sim, 2, 49000, |_, _, _| {});
    assert!(sim.c.services()[0].backends[0].ejected);
    assert_eq!(sim.c.counters().silences_excused_lag, 0);
    assert_eq!(sim.c.counters().lag_spells, 1);
}

/// Probes turned off by a reload: the last reading is forgotten, not shown as the round
/// trip now, and the switch is no longer marked behind (a reading over the limit once the
/// probes are back starts a new spell). The connections decided while it was behind are
/// still excused.
#[test]
fn forgotten_round_trips_are_not_shown_and_the_lag_they_saw_still_excuses() {
    let ms = Duration::from_millis;
    let mut sim = single_switch("round-robin");
    five_unanswered_connections_to(&mut sim, 2, 51000, |sim, i, _| {
        if i == 0 {
            sim.tick(ms(1));
            sim.c.note_channel_rtt(sim.now, 1, ms(900));
            sim.c.forget_channel_rtts();
            assert_eq!(sim.c.switch_view(1).and_then(|v| v.channel_rtt), None);
        }
    });
    assert_eq!(sim.c.counters().silences_excused_lag, 5);
    assert_eq!(sim.c.counters().lag_spells, 1);
    sim.c.note_channel_rtt(sim.now, 1, ms(900));
    assert_eq!(
        sim.c.switch_view(1).and_then(|v| v.channel_rtt),
        Some(ms(900))
    );
    assert_eq!(sim.c.counters().lag_spells, 2, "a new spell");
}

/// The backend's own switch behind excuses its silences too: its answers cross it first.
#[test]
fn a_lagging_switch_at_the_backend_excuses_its_silences() {
    let mut sim = ring();
    for i in 1..=3u8 {
        sim.send(&format!("h{i}"), &arp_request(i, ip(9)));
    }
    five_unanswered_connections_to(&mut sim, 2, 50000, |sim, i, _| {
        if i == 0 {
            sim.tick(Duration::from_millis(1));
            // s2, the backend's; s1 reports the connections' ends.
            sim.c.note_channel_rtt(sim.now, 2, Duration::from_secs(2));
        }
    });
    assert_eq!(sim.c.counters().silences_excused_lag, 5);
    assert_eq!(sim.c.services()[0].counters.ejections, 0);
}

/// The same without a VIP (the lab's Cases A, B and D): the connection is remembered by
/// the backend its client addressed (h2), which the reverse rule of a connection placed on
/// h3 does not name. Before, such a connection got no verdict.
#[test]
fn an_unanswered_connection_counts_when_its_forward_rule_ends_first_without_a_vip() {
    let mut sim = no_vip();
    let syn = |port: u16| syn_to_h2(port, 5000 + u32::from(port));
    five_unanswered_connections(&mut sim, 3, syn, 46200, |sim, _, cport| {
        end_forward_rule(sim, cport);
    });
    let s = &sim.c.services()[0];
    assert!(
        s.backends[1].ejected,
        "h3 ejected after five unanswered connections"
    );
    assert!(!s.backends[0].ejected && !s.backends[2].ejected);
    assert_eq!(s.backends[1].active_connections, 0, "each ended once");
}

/// A silence is reported when its rule idles out, an answered connection about a second
/// after it closes: a backend that answered a connection decided after five silent ones
/// was there after them, and their silence is the path's. Counted in the order the
/// connections were made, they are no five failures in a row: no verdict. The answer is
/// known from the client's rule (its ACK and request went through it) or from the
/// backend's (packets came back through it). Five silences decided after the last answer
/// still eject.
#[test]
fn silences_before_an_answered_connection_are_no_verdict() {
    for (via, port) in [("client's rule", 51000), ("backend's rule", 52000)] {
        let mut sim = single_switch("round-robin");
        let answered = port + 100;
        five_unanswered_connections_to(&mut sim, 2, port, |sim, i, _| {
            if i > 0 {
                return;
            }
            // Decided after the five (round robin: h2's turn again), answered, and over
            // before the first silence is reported.
            sim.tick(Duration::from_millis(5));
            let got = sim.send("h1", &tcp(mac(1), VMAC, (ip(1), answered), (VIP, 80), SYN));
            assert_eq!(got[0].0, "h2", "{via}");
            match via {
                "client's rule" => {
                    end_conn_rule(sim, cookie::conn::ACCOUNTING, ofp::Oxm::TcpSrc(answered), 4)
                }
                _ => end_conn_rule(sim, cookie::conn::OUTCOME, ofp::Oxm::TcpDst(answered), 3),
            }
        });
        let s = &sim.c.services()[0];
        assert!(!s.backends[0].ejected, "{via}");
        assert_eq!(s.counters.ejections, 0, "{via}");
        assert_eq!(sim.c.counters().silences_excused_answered, 5, "{via}");

        // The reported rules are gone from the switch too.
        sim.carry_out(1, rules::delete_kind(RuleKind::Conn));
        sim.tick(Duration::from_millis(5));
        five_unanswered_connections_to(&mut sim, 2, port + 200, |_, _, _| {});
        assert!(
            sim.c.services()[0].backends[0].ejected,
            "{via}: five silences after the last answer"
        );
        assert_eq!(sim.c.counters().silences_excused_answered, 5, "{via}");
    }
}

/// A backend that answers half its connections and drops the others (a full accept
/// queue) never fails five in a row, and its silences are excused from the consecutive
/// detector (it answered later connections); the success-rate detector, at the end of
/// its interval, sees its rate far under the pool's and ejects it, and the pool's other
/// four backends, answering everything, stay in.
#[test]
fn a_backend_that_drops_half_its_connections_is_ejected_by_its_success_rate() {
    let mut config = service_config("round-robin", &[2, 3, 4, 5, 6]);
    config += "[service.outlier]\nsuccess_rate_request_volume = 20\n";
    let hosts: Vec<(String, u64, u32)> = (1..=6u8)
        .map(|i| (format!("h{i}"), 1, u32::from(i)))
        .collect();
    let hosts: Vec<(&str, u64, u32)> = hosts.iter().map(|(n, d, p)| (n.as_str(), *d, *p)).collect();
    let mut sim = Sim::new(&config, &[(1, 6)], &[], &hosts);
    for i in 1..=6u8 {
        sim.send(&format!("h{i}"), &arp_request(i, ip(9)));
    }
    sim.tick(Duration::from_millis(10));
    for port in 40000..40100u16 {
        sim.tick(Duration::from_millis(2));
        sim.send("h1", &tcp(mac(1), VMAC, (ip(1), port), (VIP, 80), SYN));
    }
    let mut outcome_rules: Vec<(u16, u64, ofp::Match, bool)> = sim
        .net
        .switch(1)
        .unwrap()
        .flows()
        .filter(|f| f.cookie & cookie::conn::OUTCOME != 0)
        .map(|f| {
            let from_h6 = f
                .match_
                .iter()
                .any(|o| matches!(o, ofp::Oxm::Ipv4Src { value, .. } if *value == ip(6)));
            let client_port = f.match_.iter().find_map(|o| match o {
                ofp::Oxm::TcpDst(p) => Some(*p),
                _ => None,
            });
            (
                client_port.unwrap_or(0),
                f.cookie,
                f.match_.clone(),
                from_h6,
            )
        })
        .collect();
    assert_eq!(outcome_rules.len(), 100, "one outcome rule per connection");
    // In the order they were decided: h6 drops every other connection it is given.
    outcome_rules.sort_by_key(|r| r.0);
    let mut h6_turn = 0;
    let (mut silent, mut answered) = (Vec::new(), Vec::new());
    for (_, cookie, m, from_h6) in outcome_rules {
        if from_h6 {
            h6_turn += 1;
            if h6_turn % 2 == 1 {
                silent.push((cookie, m));
                continue;
            }
        }
        answered.push((cookie, m));
    }
    // The answers are reported first (a connection's end, a second after it closes),
    // then the silences (their rules idle out): h6's every silence is followed, in the
    // order of the decisions, by an answered connection of its own.
    for (cookie, m) in answered {
        rule_ended(&mut sim, cookie, m, 3);
    }
    for (cookie, m) in silent {
        rule_idled_out(&mut sim, cookie, m);
    }
    let s = &sim.c.services()[0];
    assert_eq!(s.counters.ejections, 0, "no five in a row");
    assert_eq!(sim.c.counters().silences_excused_answered, 10);
    // The interval (10 s) ends: h6 answered 10 of 20, the others 20 of 20.
    sim.tick(Duration::from_secs(10));
    let s = &sim.c.services()[0];
    let ejected: Vec<bool> = s.backends.iter().map(|b| b.ejected).collect();
    assert_eq!(ejected, [false, false, false, false, true]);
    assert_eq!(s.counters.ejections, 1);
    assert_eq!(s.counters.ejections_by.success_rate, 1);
    assert_eq!(
        s.outliers.host(4).and_then(|h| h.ejected_by()),
        Some(Detector::SuccessRate)
    );
    let stats = s
        .outliers
        .success_rate_stats()
        .expect("five backends judged");
    assert_eq!((stats.hosts, stats.mean), (5, 90.0));
    let outcomes: Vec<(u64, u64)> = s
        .backends
        .iter()
        .map(|b| (b.outcomes_answered, b.outcomes_unanswered))
        .collect();
    assert_eq!(outcomes, [(20, 0), (20, 0), (20, 0), (20, 0), (10, 10)]);
    assert!(
        sim.c
            .events()
            .any(|e| e.kind == "ejected" && e.detail.contains("success_rate"))
    );
    for port in 41000..41020u16 {
        let got = sim.send("h1", &tcp(mac(1), VMAC, (ip(1), port), (VIP, 80), SYN));
        assert_ne!(got[0].0, "h6", "an ejected backend takes no new connection");
    }
}

/// An outcome rule that ends with no verdict is counted, by why: a connection no longer
/// known whose rule carried under two packets, or one whose rule carried nothing and
/// lived under a second.
#[test]
fn outcome_rules_ending_without_a_verdict_are_counted_by_reason() {
    let mut sim = single_switch("round-robin");
    for port in [43000u16, 43001] {
        sim.send("h1", &tcp(mac(1), VMAC, (ip(1), port), (VIP, 80), SYN));
    }
    let outcome = |sim: &Sim, port: u16| {
        sim.net
            .switch(1)
            .unwrap()
            .flows()
            .filter(|f| f.cookie & cookie::conn::OUTCOME != 0)
            .find(|f| f.match_.iter().any(|o| *o == ofp::Oxm::TcpDst(port)))
            .map(|f| (f.cookie, f.match_.clone()))
            .expect("the connection's outcome rule")
    };
    let (first, second) = (outcome(&sim, 43000), outcome(&sim, 43001));
    // The first connection's accounting ends after its handshake (its client's rule
    // carried its ACK and request): no longer known, and not remembered as aborted.
    end_conn_rule(
        &mut sim,
        cookie::conn::ACCOUNTING,
        ofp::Oxm::TcpSrc(43000),
        3,
    );
    rule_ended(&mut sim, first.0, first.1, 1);
    // The second is known, but its rule went within the second, having carried nothing.
    let fr = ofp::FlowRemoved {
        cookie: second.0,
        priority: rules::PRIO_CONN,
        reason: ofp::FlowRemovedReason::Delete,
        table_id: 0,
        duration_sec: 0,
        duration_nsec: 300_000_000,
        idle_timeout: 30,
        hard_timeout: 0,
        packet_count: 0,
        byte_count: 0,
        match_: second.1,
    };
    sim.c
        .handle_message(sim.now, 1, &Message::FlowRemoved(fr), &mut sim.out);
    let c = sim.c.counters();
    assert_eq!(
        (c.outcomes_unjudged_unknown, c.outcomes_unjudged_short),
        (1, 1)
    );
    let judged: u64 = sim.c.services()[0]
        .backends
        .iter()
        .map(|b| b.outcomes_answered + b.outcomes_unanswered)
        .sum();
    assert_eq!(judged, 0);
}

/// The silences of connections decided before a backend's ejection, reported after it
/// ended (an idle timeout outlasts a base ejection), are no verdict: the ejection answered
/// for them. Before, they ejected the backend again at once, for twice as long, though it
/// might have recovered meanwhile. Silences of connections decided after still eject it.
#[test]
fn silences_from_before_an_ejection_do_not_eject_the_backend_again() {
    let mut sim = single_switch("round-robin");
    let pool = sim.c.services()[0].backends.len() as u16;
    // h2's outcome rules of the connections from client ports `from..`, decided now.
    let h2_connections = |sim: &mut Sim, from: u16, n: u16| -> Vec<(u64, ofp::Match)> {
        for port in from..from + n * pool {
            sim.send("h1", &tcp(mac(1), VMAC, (ip(1), port), (VIP, 80), SYN));
        }
        sim.net
            .switch(1)
            .unwrap()
            .flows()
            .filter(|f| f.cookie & cookie::conn::OUTCOME != 0)
            .filter(|f| {
                let m = &f.match_;
                m.iter()
                    .any(|o| matches!(o, ofp::Oxm::Ipv4Src { value, .. } if *value == ip(2)))
                    && m.iter()
                        .any(|o| matches!(o, ofp::Oxm::TcpDst(p) if *p >= from))
            })
            .map(|f| (f.cookie, f.match_.clone()))
            .collect()
    };
    let h2_outcome_rules = h2_connections(&mut sim, 48000, 10);
    assert_eq!(h2_outcome_rules.len(), 10);
    let (first, rest) = h2_outcome_rules.split_at(5);
    sim.tick(Duration::from_secs(1));
    for (cookie, m) in first {
        rule_idled_out(&mut sim, *cookie, m.clone());
    }
    let ejected = |sim: &Sim| sim.c.services()[0].backends[0].ejected;
    assert!(ejected(&sim), "five silences in a row eject h2");
    // The ejection ends (30 s); the other five connections' silences come after it.
    sim.tick(Duration::from_secs(31));
    assert!(!ejected(&sim));
    for (cookie, m) in rest {
        rule_idled_out(&mut sim, *cookie, m.clone());
    }
    assert!(!ejected(&sim), "no new verdict on h2 since its ejection");
    let c = sim.c.counters();
    assert_eq!(c.outcomes_unjudged_before_ejection, 5);
    let b = &sim.c.services()[0].backends[0];
    assert_eq!((b.outcomes_answered, b.outcomes_unanswered), (0, 5));
    // Five connections decided since, unanswered: h2 is ejected again.
    sim.tick(Duration::from_secs(1));
    let since = h2_connections(&mut sim, 49000, 5);
    assert_eq!(since.len(), 5);
    for (cookie, m) in since {
        rule_idled_out(&mut sim, cookie, m);
    }
    assert!(ejected(&sim), "new silences eject h2 again");
    assert_eq!(sim.c.counters().outcomes_unjudged_before_ejection, 5);
}

/// [`single_switch`]'s network, its service not redispatching: a silent connection stays
/// on its backend.
fn single_switch_without_redispatch() -> Sim {
    one_switch(&service_config("round-robin", &[2, 3, 4]).replacen(
        "[service.health]",
        "redispatch = false\n[service.health]",
        1,
    ))
}

/// A connection's client that sends its SYN again 2.5 s or more after the decision heard
/// no SYN-ACK: the connection is judged silent then, once, and not again when its rules
/// idle out 30 s later. A first retransmission, at 1 s, is no verdict. (Without
/// redispatch, so that every SYN goes to the one backend.)
#[test]
fn a_syn_sent_again_after_its_backend_stayed_silent_is_a_verdict_at_once() {
    let mut sim = single_switch_without_redispatch();
    let syn = tcp(mac(1), VMAC, (ip(1), 45000), (VIP, 80), SYN);
    let first = sim.send("h1", &syn);
    let backend = first[0].0.clone();
    let unanswered = |sim: &Sim| -> u64 {
        sim.c.services()[0]
            .backends
            .iter()
            .map(|b| b.outcomes_unanswered)
            .sum()
    };
    sim.tick(Duration::from_secs(1));
    // The first retransmission goes to the same backend, and is no verdict yet.
    assert_eq!(sim.send("h1", &syn)[0].0, backend);
    assert_eq!(
        (unanswered(&sim), sim.c.counters().silences_at_syn_retry),
        (0, 0)
    );
    sim.tick(Duration::from_secs(2));
    assert_eq!(sim.send("h1", &syn)[0].0, backend);
    assert_eq!(
        (unanswered(&sim), sim.c.counters().silences_at_syn_retry),
        (1, 1)
    );
    // A third retransmission is not judged again, nor the rules' end.
    sim.tick(Duration::from_secs(4));
    sim.send("h1", &syn);
    let outcome = sim
        .net
        .switch(1)
        .unwrap()
        .flows()
        .find(|f| f.cookie & cookie::conn::OUTCOME != 0)
        .map(|f| (f.cookie, f.match_.clone()))
        .expect("the connection's outcome rule");
    rule_idled_out(&mut sim, outcome.0, outcome.1);
    assert_eq!(
        (unanswered(&sim), sim.c.counters().silences_at_syn_retry),
        (1, 1)
    );
}

/// A connection whose backend stayed silent goes to another backend at its client's SYN
/// 2.5 s or more after the decision (`redispatch`, on by default), and that SYN on to it:
/// the client's ACK then takes the replaced forward rule to the new backend, whose
/// answers reach the client as the VIP's; the old backend's late SYN-ACK does not (its
/// reverse rule is gone), so the client resets it. The backends' open connections follow.
#[test]
fn a_silent_backends_connection_goes_to_another_at_its_clients_syn() {
    let mut sim = single_switch("round-robin");
    let syn = tcp(mac(1), VMAC, (ip(1), 45000), (VIP, 80), SYN);
    let first = sim.send("h1", &syn);
    let old = first[0].0.clone();
    sim.tick(Duration::from_secs(1));
    assert_eq!(sim.send("h1", &syn)[0].0, old, "not before 2.5 s");
    sim.tick(Duration::from_secs(2));
    let got = sim.send("h1", &syn);
    assert_eq!(got.len(), 1, "{got:?}");
    let (new, seg) = &got[0];
    assert_ne!(*new, old, "the third SYN goes to another backend");
    let n = |h: &str| h[1..].parse::<u8>().expect("a host's number");
    assert_eq!(
        seg.ipv4_dst,
        Some(ip(n(new))),
        "rewritten to the new backend"
    );
    assert_eq!(seg.eth_dst, mac(n(new)));
    let s = &sim.c.services()[0];
    assert_eq!(s.counters.redispatched, 1);
    let active = |sim: &Sim, h: &str| {
        sim.c.services()[0]
            .backends
            .iter()
            .find(|b| b.address == ip(n(h)))
            .map(|b| b.active_connections)
    };
    assert_eq!((active(&sim, &old), active(&sim, new)), (Some(0), Some(1)));
    let b_old = s.backends.iter().find(|b| b.address == ip(n(&old)));
    assert_eq!(
        b_old.map(|b| b.outcomes_unanswered),
        Some(1),
        "judged silent"
    );
    // The client's ACK of the new backend's SYN-ACK follows the rules to it.
    let ack = tcp(mac(1), VMAC, (ip(1), 45000), (VIP, 80), ACK);
    let got = sim.send("h1", &ack);
    assert_eq!(
        got.iter().map(|(h, _)| h.as_str()).collect::<Vec<_>>(),
        [new.as_str()]
    );
    // The new backend's answer reaches the client from the VIP.
    let from_new = tcp(
        mac(n(new)),
        mac(1),
        (ip(n(new)), 80),
        (ip(1), 45000),
        SYN_ACK,
    );
    let got = sim.send(new, &from_new);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!((got[0].0.as_str(), got[0].1.ipv4_src), ("h1", Some(VIP)));
    // The old one's late SYN-ACK is not rewritten to the VIP.
    let from_old = tcp(
        mac(n(&old)),
        mac(1),
        (ip(n(&old)), 80),
        (ip(1), 45000),
        SYN_ACK,
    );
    let got = sim.send(&old, &from_old);
    assert!(
        got.iter().all(|(_, f)| f.ipv4_src != Some(VIP)),
        "the old backend's answer is not the service's: {got:?}"
    );
    // Another SYN soon after goes to the new backend: judged only 2.5 s after the move.
    sim.tick(Duration::from_secs(1));
    assert_eq!(sim.send("h1", &syn)[0].0, *new);
    assert_eq!(sim.c.services()[0].counters.redispatched, 1);
}

/// A silence the lagging switch explains moves nothing: the connection's SYN goes on to
/// its backend, as without redispatch, while the switch has been behind since the
/// decision; a connection decided once it has caught up moves as before.
#[test]
fn a_silence_behind_a_lagging_switch_is_not_redispatched() {
    let ms = Duration::from_millis;
    let mut sim = single_switch("round-robin");
    let syn = tcp(mac(1), VMAC, (ip(1), 45100), (VIP, 80), SYN);
    let old = sim.send("h1", &syn)[0].0.clone();
    sim.tick(ms(10));
    sim.c.note_channel_rtt(sim.now, 1, ms(900));
    sim.tick(Duration::from_secs(3));
    let got = sim.send("h1", &syn);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].0, old, "the SYN goes on to the same backend");
    assert_eq!(sim.c.services()[0].counters.redispatched, 0);
    assert_eq!(sim.c.counters().silences_excused_lag, 1);
    // Caught up: a connection decided after that is moved at its client's third SYN.
    sim.c.note_channel_rtt(sim.now, 1, ms(1));
    sim.tick(ms(10));
    let syn = tcp(mac(1), VMAC, (ip(1), 45101), (VIP, 80), SYN);
    let first = sim.send("h1", &syn)[0].0.clone();
    sim.tick(Duration::from_secs(3));
    assert_ne!(sim.send("h1", &syn)[0].0, first, "moved");
    assert_eq!(sim.c.services()[0].counters.redispatched, 1);
}

/// A connection moved off a silent backend across a ring of three switches (the client on
/// s1, the backends on s2 and s3) leaves none of its old path's rules behind: every rule
/// that named the old backend's address goes with the move, on every switch; the new
/// path's rules carry it.
#[test]
fn a_redispatched_connection_leaves_no_rule_of_its_old_path() {
    let links = [((1, 2), (2, 3)), ((2, 2), (3, 3)), ((3, 2), (1, 3))];
    let hosts = [("h1", 1, 1), ("h2", 2, 1), ("h3", 3, 1)];
    let mut sim = Sim::new(
        &service_config("round-robin", &[2, 3]),
        &[(1, 3), (2, 3), (3, 3)],
        &links,
        &hosts,
    );
    for (h, i) in [("h1", 1), ("h2", 2), ("h3", 3)] {
        sim.send(h, &arp_request(i, ip(9)));
    }
    let syn = tcp(mac(1), VMAC, (ip(1), 45400), (VIP, 80), SYN);
    let old = sim.send("h1", &syn)[0].0.clone();
    let n = |h: &str| h[1..].parse::<u8>().expect("a host's number");
    let naming = |sim: &Sim, a: Ipv4Addr| -> Vec<(u64, ofp::Match)> {
        (1..=3)
            .flat_map(|d| {
                sim.net
                    .switch(d)
                    .into_iter()
                    .flat_map(|s| s.flows())
                    .filter(|f| cookie::kind_of(f.cookie) == Some(cookie::RuleKind::Conn))
                    .filter(|f| {
                        f.match_.iter().any(|o| {
                            matches!(o, ofp::Oxm::Ipv4Src { value, .. } | ofp::Oxm::Ipv4Dst { value, .. } if *value == a)
                        })
                    })
                    .map(|f| (d, f.match_.clone()))
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    let before = naming(&sim, ip(n(&old)));
    assert!(before.len() >= 2, "the old path's rules: {before:?}");
    sim.tick(Duration::from_secs(3));
    let got = sim.send("h1", &syn);
    let new = got[0].0.clone();
    assert_ne!(new, old);
    assert_eq!(sim.c.services()[0].counters.redispatched, 1);
    assert_eq!(
        naming(&sim, ip(n(&old))),
        [],
        "none of the old path's rules stays"
    );
    assert!(naming(&sim, ip(n(&new))).len() >= 2, "the new path's");
    // The client's ACK reaches the new backend along them.
    let ack = tcp(mac(1), VMAC, (ip(1), 45400), (VIP, 80), ACK);
    let got = sim.send("h1", &ack);
    assert_eq!(
        got.iter().map(|(h, _)| h.as_str()).collect::<Vec<_>>(),
        [new.as_str()]
    );
}

/// A silent connection stays on its backend when no other can take it (the others
/// drained here) or the service's `redispatch` is off: its SYN goes on there again.
#[test]
fn a_silent_connection_stays_when_no_other_backend_can_take_it() {
    for off in [false, true] {
        let mut sim = if off {
            single_switch_without_redispatch()
        } else {
            single_switch("round-robin")
        };
        let syn = tcp(mac(1), VMAC, (ip(1), 45000), (VIP, 80), SYN);
        let old = sim.send("h1", &syn)[0].0.clone();
        if !off {
            let at = usize::from(old[1..].parse::<u8>().expect("a host's number") - 2);
            for b in (0..3).filter(|&b| b != at) {
                assert!(sim.c.set_admin(sim.now, 0, b, AdminState::Draining));
            }
        }
        sim.tick(Duration::from_secs(3));
        let got = sim.send("h1", &syn);
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[0].0, old, "off: {off}");
        let s = &sim.c.services()[0];
        assert_eq!(s.counters.redispatched, 0);
        assert_eq!(
            sim.c.counters().silences_at_syn_retry,
            1,
            "judged all the same"
        );
    }
}

/// A backend that answers nothing is ejected 3 s after its first connections, at its
/// clients' second SYNs, not when their rules idle out.
#[test]
fn a_dead_backend_is_ejected_at_its_clients_second_syns() {
    let mut sim = single_switch("round-robin");
    let pool = sim.c.services()[0].backends.len() as u16;
    let syn = |port| tcp(mac(1), VMAC, (ip(1), port), (VIP, 80), SYN);
    let mut to_h2 = Vec::new();
    for port in 46000..46000 + 5 * pool {
        if sim.send("h1", &syn(port))[0].0 == "h2" {
            to_h2.push(port);
        }
    }
    assert_eq!(to_h2.len(), 5);
    sim.tick(Duration::from_secs(3));
    for (i, &port) in to_h2.iter().enumerate() {
        assert!(
            !sim.c.services()[0].backends[0].ejected,
            "not before the fifth ({i})"
        );
        sim.send("h1", &syn(port));
    }
    let b = &sim.c.services()[0].backends[0];
    assert!(b.ejected, "five silences in a row eject h2");
    assert_eq!(
        sim.c.services()[0]
            .outliers
            .host(0)
            .and_then(|h| h.ejected_by()),
        Some(crate::health::Detector::Consecutive)
    );
    assert_eq!(b.outcomes_unanswered, 5);
    assert_eq!(sim.c.counters().silences_at_syn_retry, 5);
}

/// Which hosts `n` new connections from h1 reach, and how many each.
fn spread(sim: &mut Sim, first_port: u16, n: u16) -> BTreeMap<String, u32> {
    let mut seen = BTreeMap::new();
    for port in first_port..first_port + n {
        let got = sim.send("h1", &tcp(mac(1), VMAC, (ip(1), port), (VIP, 80), SYN));
        *seen.entry(got[0].0.clone()).or_insert(0) += 1;
    }
    seen
}

/// Passive outlier detection: connections that a backend never answered (the switch
/// reports their reverse rule gone with no packets) eject it after five in a row.
#[test]
fn unanswered_connections_eject_a_backend() {
    let mut sim = single_switch("round-robin");
    five_unanswered_connections_to(&mut sim, 2, 47000, |sim, i, _| {
        assert!(
            !sim.c.services()[0].backends[0].ejected,
            "not ejected before the fifth failure ({i})"
        );
    });
    assert!(
        sim.c.services()[0].backends[0].ejected,
        "ejected after five unanswered connections"
    );
    assert!(
        !sim.c.services()[0].in_panic(),
        "two of three backends are available: no panic"
    );
    for port in 100..120u16 {
        let got = sim.send(
            "h1",
            &tcp(mac(1), VMAC, (ip(1), 47000 + port), (VIP, 80), SYN),
        );
        assert_ne!(got[0].0, "h2", "an ejected backend takes no new connection");
    }
    assert!(sim.c.events().any(|e| e.kind == "ejected"));
    // The ejection ends after its base time (30 s), and h2 takes connections again.
    sim.tick(Duration::from_secs(31));
    let mut seen = false;
    for port in 200..206u16 {
        seen |= sim.send(
            "h1",
            &tcp(mac(1), VMAC, (ip(1), 47000 + port), (VIP, 80), SYN),
        )[0]
        .0 == "h2";
    }
    assert!(seen, "h2 is back after its ejection time");
}

/// A one-backend pool whose backend is ejected goes into panic: the backend keeps taking
/// new connections (Envoy's panic threshold), where with `panic_threshold_percent = 0`
/// the controller refuses them until the ejection ends.
#[test]
fn an_ejection_does_not_empty_a_one_backend_pool_unless_told_to() {
    for (health, waived) in [("", true), ("panic_threshold_percent = 0\n", false)] {
        let config = service_config("round-robin", &[2])
            .replace("kind = \"none\"\n", &format!("kind = \"none\"\n{health}"));
        let mut sim = one_switch(&config);
        five_unanswered_connections_to(&mut sim, 2, 47000, |_, _, _| {});
        let s = &sim.c.services()[0];
        assert!(s.backends[0].ejected, "h2 ejected ({health:?})");
        assert_eq!(s.in_panic(), waived, "{health:?}");
        assert_eq!(
            sim.c.events().any(|e| e.kind == "panic"),
            waived,
            "{health:?}"
        );
        let turned_away = |sim: &Sim| {
            let c = &sim.c.services()[0].counters;
            c.refused_no_backend + c.held_settling
        };
        let before = turned_away(&sim);
        let mut to_h2 = 0;
        for port in 100..110u16 {
            let got = sim.send(
                "h1",
                &tcp(mac(1), VMAC, (ip(1), 47000 + port), (VIP, 80), SYN),
            );
            to_h2 += got.iter().filter(|(h, _)| h == "h2").count();
        }
        let turned = turned_away(&sim) - before;
        if waived {
            assert_eq!((to_h2, turned), (10, 0), "h2 takes every new connection");
            // The ejection ends after 30 s, and the panic with it.
            sim.tick(Duration::from_secs(31));
            assert!(!sim.c.services()[0].in_panic());
            assert!(sim.c.events().any(|e| e.kind == "panic over"));
        } else {
            assert_eq!((to_h2, turned), (0, 10), "every new connection turned away");
        }
    }
}

/// A reload leaves a pool in panic as it was: still in panic (its backend still
/// ejected), not counted or logged as a second one.
#[test]
fn a_reload_keeps_a_pool_in_panic_without_a_second_one() {
    let config = service_config("round-robin", &[2]);
    let mut sim = one_switch(&config);
    five_unanswered_connections_to(&mut sim, 2, 45000, |_, _, _| {});
    sim.tick(Duration::from_millis(100));
    let cfg = Config::from_toml(&config, &|_| None).expect("valid config");
    let now = sim.now;
    sim.c.reload(now, &cfg, &mut sim.out);
    sim.pump();
    sim.tick(Duration::from_secs(1));
    let s = &sim.c.services()[0];
    assert!(s.in_panic() && s.backends[0].ejected && s.backends[0].eligible());
    assert_eq!((s.counters.ejections, s.counters.panics), (1, 1));
    assert_eq!(sim.c.events().filter(|e| e.kind == "panic").count(), 1);
}

/// A reload that changes `[service.outlier]` applies the new settings to the backends
/// that stay, which keep their ejection and their interval's outcomes: an ejected backend
/// is not let back in by a reload, and the interval does not start over.
#[test]
fn a_reload_applies_new_outlier_settings_and_keeps_each_backends_state() {
    let config = service_config("round-robin", &[2, 3, 4]);
    let mut sim = one_switch(&config);
    sim.tick(Duration::from_millis(10));
    five_unanswered_connections_to(&mut sim, 2, 45000, |_, _, _| {});
    assert!(sim.c.services()[0].backends[0].ejected);
    sim.tick(Duration::from_secs(6));
    let reloaded = format!(
        "{config}[service.outlier]\nfailure_percentage_threshold = 50\nconsecutive_failures = 3\n"
    );
    let cfg = Config::from_toml(&reloaded, &|_| None).expect("valid config");
    let now = sim.now;
    sim.c.reload(now, &cfg, &mut sim.out);
    sim.pump();
    let s = &sim.c.services()[0];
    let o = s.outliers.config();
    assert_eq!(o.consecutive_failures, 3);
    assert_eq!(o.failure_percentage.map(|f| f.threshold), Some(50));
    assert!(s.backends[0].ejected, "still ejected after the reload");
    assert_eq!(
        s.outliers
            .host(0)
            .map(|h| (h.ejected_by(), h.config().consecutive_failures)),
        Some((Some(Detector::Consecutive), 3)),
        "its state kept, under the new settings"
    );
    assert_eq!(s.counters.ejections, 1);
    // The interval that began before the reload ends on time, 10 s after it began: the
    // five silences are in its last window.
    sim.tick(Duration::from_millis(4100));
    let s = &sim.c.services()[0];
    assert_eq!(
        s.outliers.host(0).map(|h| h.last_window().failures),
        Some(5),
        "{:?}",
        s.outliers.host(0)
    );
}

/// A backend removed through the API takes its outlier state with it: the later backends
/// shift down with theirs. (The detector's state once shifted by truncation, so the
/// ejection of h3 passed to h4 when h2 left, and h3 was back in the pool.)
#[test]
fn a_removed_backend_takes_its_ejection_with_it_and_leaves_the_others_theirs() {
    let mut sim = single_switch("round-robin");
    five_unanswered_connections_to(&mut sim, 3, 48000, |_, _, _| {});
    assert!(sim.c.services()[0].backends[1].ejected, "h3 ejected");
    let now = sim.now;
    sim.c
        .remove_backend(now, 0, 0, &mut sim.out)
        .expect("h2 removed");
    sim.pump();
    // A refresh reads the detector into the pool.
    sim.tick(Duration::from_secs(1));
    let seen = spread(&mut sim, 48100, 20);
    assert_eq!(
        seen.into_iter().collect::<Vec<_>>(),
        [("h4".to_string(), 20)],
        "h3 is still ejected, h4 is not"
    );
}

/// A reload keeps the backends that stay, with their ejections (a reload once started the
/// detector afresh, and an ejected backend took connections again at the next refresh).
#[test]
fn a_reload_keeps_an_ejected_backend_out_until_its_time() {
    let mut sim = single_switch("round-robin");
    five_unanswered_connections_to(&mut sim, 2, 49000, |_, _, _| {});
    let cfg = Config::from_toml(&service_config("round-robin", &[2, 3, 4]), &|_| None)
        .expect("valid config");
    let now = sim.now;
    sim.c.reload(now, &cfg, &mut sim.out);
    sim.pump();
    sim.tick(Duration::from_secs(1));
    let seen = spread(&mut sim, 49100, 20);
    assert!(!seen.contains_key("h2"), "h2 stays ejected: {seen:?}");
    sim.tick(Duration::from_secs(30));
    let seen = spread(&mut sim, 49200, 6);
    assert!(seen.contains_key("h2"), "h2 is back after 30 s: {seen:?}");
}

/// One switch, h1 the client, h2..h4 the backends of a round-robin service checked by
/// `health` (a `[service.health]` body), h2 with a metrics endpoint if `h2_metrics`.
fn checked_service(health: &str, h2_metrics: bool) -> String {
    let mut c = format!(
        "[[service]]\nname = \"web\"\nvip = \"{VIP}\"\nport = 80\nalgorithm = \"round-robin\"\n[service.health]\n{health}\n"
    );
    for b in [2, 3, 4] {
        c += &format!("[[service.backend]]\naddress = \"{}\"\n", ip(b));
        if b == 2 && h2_metrics {
            c += &format!("metrics = \"http://{}:9100/metrics\"\n", ip(b));
        }
    }
    c
}

fn reload(sim: &mut Sim, config: &str) {
    let cfg = Config::from_toml(config, &|_| None).expect("valid config");
    let now = sim.now;
    sim.c.reload(now, &cfg, &mut sim.out);
    sim.pump();
    sim.tick(Duration::from_millis(100));
}

/// A reload that turns a service's checks off brings back the backends they took down:
/// nothing else would (no check runs to see them up), and a reload that kept them down
/// once left an operator who disabled broken checks with the pool they broke.
#[test]
fn a_reload_without_checks_brings_back_a_backend_they_took_down() {
    let http = "kind = \"http\"\npath = \"/\"";
    let mut sim = one_switch(&checked_service(http, false));
    let now = sim.now;
    sim.c.handle_probe(now, 0, 0, ProbeResult::Refused);
    assert!(!spread(&mut sim, 51000, 9).contains_key("h2"), "h2 is down");
    reload(&mut sim, &checked_service("kind = \"none\"", false));
    assert!(sim.c.services()[0].backends[0].healthy);
    assert!(
        spread(&mut sim, 51100, 9).contains_key("h2"),
        "h2 is back in the pool"
    );
}

/// A reload's new `rise` and `fall` apply to the backends that stay (they kept the
/// thresholds they were built with).
#[test]
fn a_reload_applies_new_rise_and_fall_to_the_backends_that_stay() {
    let mut sim = one_switch(&checked_service(
        "kind = \"http\"\npath = \"/\"\nrise = 2\nfall = 3",
        false,
    ));
    let now = sim.now;
    sim.c.handle_probe(now, 0, 1, ProbeResult::Ok);
    reload(
        &mut sim,
        &checked_service("kind = \"http\"\npath = \"/\"\nrise = 2\nfall = 1", false),
    );
    let now = sim.now;
    sim.c.handle_probe(now, 0, 1, ProbeResult::Failed);
    assert!(
        !sim.c.services()[0].backends[1].healthy,
        "one failure takes h3 down with fall = 1"
    );
}

/// A reload that takes a backend's metrics endpoint away forgets what it said: the
/// controller's own counts are its figures again. (Its last report stayed: the rate
/// ISSLM reads froze at the reported value, and once the report aged the backend counted
/// as stale for good, with nothing left to freshen it.)
#[test]
fn a_reload_that_drops_a_backends_metrics_forgets_what_they_said() {
    let none = "kind = \"none\"";
    let mut sim = one_switch(&checked_service(none, true));
    let now = sim.now;
    let report = crate::metrics_text::LoadSample {
        rps: Some(500.0),
        active: Some(40.0),
        response_time_ms: Some(250.0),
        cpu: Some(0.9),
    };
    sim.c.handle_backend_load(now, 0, 0, report);
    sim.tick(Duration::from_millis(100));
    assert_eq!(sim.c.services()[0].loads[0].rps, 500.0, "the report counts");
    reload(&mut sim, &checked_service(none, false));
    // Long past the age at which a report is stale.
    sim.tick(Duration::from_secs(60));
    let s = &sim.c.services()[0];
    let (b, l) = (&s.backends[0], &s.loads[0]);
    assert!(l.metrics_fresh, "its own counts are always fresh");
    assert!(l.rps < 1.0, "the rate is the controller's count: {}", l.rps);
    assert_eq!((b.cpu, b.response_time_ms), (None, None));
}

/// A backend's report counts while it is fresh. Once it is stale, the controller's own
/// counts replace it where the controller sees every connection (a reactive service):
/// the rate the balancer reads and the connections the overload control sums no longer
/// freeze at the last report's figures for as long as the endpoint stays silent.
#[test]
fn a_stale_report_gives_way_to_the_controllers_own_counts() {
    let mut sim = one_switch(&checked_service("kind = \"none\"", true));
    let now = sim.now;
    let report = crate::metrics_text::LoadSample {
        rps: Some(500.0),
        active: Some(40.0),
        response_time_ms: None,
        cpu: None,
    };
    sim.c.handle_backend_load(now, 0, 0, report);
    sim.tick(Duration::from_millis(100));
    let cfg = crate::overload::OverloadConfig {
        max_active_connections: Some(10),
        ..Default::default()
    };
    let load = |sim: &Sim| super::overload::service_load(&sim.c.services()[0], &cfg, 0.0);
    assert_eq!(sim.c.services()[0].loads[0].rps, 500.0, "the report counts");
    assert_eq!(load(&sim), 4.0, "40 reported against 10");
    // No report since, long past the age at which one is stale.
    sim.tick(Duration::from_secs(60));
    let l = &sim.c.services()[0].loads[0];
    assert!(!l.metrics_fresh);
    assert!(l.rps < 1.0, "the controller's own rate: {}", l.rps);
    assert_eq!(load(&sim), 0.0, "no connection is open");
}

/// ISSLM's moves are counted by the search that found the target: here the first
/// (least request load), away from a backend that reports itself over the threshold.
#[test]
fn isslm_moves_are_counted_by_the_search_that_found_the_target() {
    let config = checked_service("kind = \"none\"", true).replace(
        "algorithm = \"round-robin\"\n",
        "algorithm = \"isslm\"\nthreshold_rps = 100\n",
    );
    let mut sim = one_switch(&config);
    let now = sim.now;
    let report = crate::metrics_text::LoadSample {
        rps: Some(500.0),
        active: None,
        response_time_ms: None,
        cpu: None,
    };
    sim.c.handle_backend_load(now, 0, 0, report);
    sim.tick(Duration::from_millis(10));
    // Round robin proposes h2 first: over, so the connection moves.
    let got = sim.send("h1", &tcp(mac(1), VMAC, (ip(1), 40000), (VIP, 80), SYN));
    let to: Vec<_> = got.iter().map(|(h, _)| h.as_str()).collect();
    assert!(
        !to.contains(&"h2") && !to.is_empty(),
        "moved from h2: {to:?}"
    );
    let c = &sim.c.services()[0].counters;
    let want = crate::service::IsslmMoves {
        request_load: 1,
        ..Default::default()
    };
    assert_eq!(c.isslm_moves, want);
    assert_eq!(c.no_optimal_server, 0);
}

/// Slow start ramps a backend that comes back from a drain, not one an operator (or a
/// script that re-asserts the state it wants) "undrains" while it is active: that once
/// cut an active backend's weight to the ramp's floor.
#[test]
fn undraining_an_active_backend_does_not_restart_its_slow_start() {
    let cfg = service_config("round-robin", &[2, 3, 4])
        .replace("port = 80\n", "port = 80\nslow_start_secs = 30\n")
        .replace(
            "address = \"10.0.0.2\"\n",
            "address = \"10.0.0.2\"\nweight = 100\n",
        );
    let mut sim = one_switch(&cfg);
    sim.tick(Duration::from_secs(31));
    // The weight the balancer applies: the configured one times the ramp's fraction.
    let weight = |sim: &Sim| sim.c.services()[0].effective_weight(0);
    assert_eq!(weight(&sim), Some(100.0), "ramped up");
    let now = sim.now;
    sim.c.set_admin(now, 0, 0, AdminState::Active);
    sim.tick(Duration::from_millis(100));
    assert_eq!(weight(&sim), Some(100.0), "still at full weight");
    // A real return from a drain ramps again.
    let now = sim.now;
    sim.c.set_admin(now, 0, 0, AdminState::Draining);
    sim.c.set_admin(now, 0, 0, AdminState::Active);
    assert_eq!(sim.c.services()[0].backends[0].since, Some(now));
    sim.tick(Duration::from_millis(100));
    assert!(weight(&sim).is_some_and(|w| w < 100.0), "ramping again");
}

/// The API changes a service's algorithm through `set_algorithm`, held to the file's
/// rules: the proactive and partitioned modes cannot run the algorithms that decide per
/// connection (they were once accepted there).
#[test]
fn an_algorithm_change_obeys_the_rules_of_the_services_mode() {
    for mode in ["proactive", "partitioned"] {
        let text = service_config("round-robin", &[2, 3])
            .replace("port = 80\n", &format!("port = 80\nmode = \"{mode}\"\n"));
        let cfg = Config::from_toml(&text, &|_| None).expect("valid config");
        let mut c = Controller::new(&cfg);
        let now = std::time::Instant::now();
        let isslm = AlgorithmParams {
            threshold_rps: Some(10.0),
            ..AlgorithmParams::default()
        };
        for (kind, params) in [
            (AlgorithmKind::Isslm, isslm),
            (AlgorithmKind::None, AlgorithmParams::default()),
        ] {
            let e = c
                .set_algorithm(now, 0, kind, params.clone())
                .expect_err("refused");
            assert!(e.contains("reactive"), "{mode}, {kind}: {e}");
            // A file with it is refused for the same reason.
            let file = text
                .replace("round-robin", kind.as_str())
                .replace("port = 80\n", "port = 80\nthreshold_rps = 10.0\n");
            let refused = Config::from_toml(&file, &|_| None)
                .expect_err("refused")
                .to_string();
            assert!(refused.contains(&e), "{file}: {refused}");
        }
        assert_eq!(c.services()[0].algorithm(), AlgorithmKind::RoundRobin);
        c.set_algorithm(
            now,
            0,
            AlgorithmKind::LeastConnections,
            AlgorithmParams::default(),
        )
        .expect("a load-weighted algorithm is fine");
    }
}

/// Case A's configured server (`none_target`) is named by address and kept by index: the
/// index follows its server when another backend leaves, and goes with it.
#[test]
fn the_none_algorithm_keeps_its_server_when_the_pool_changes() {
    let cfg = format!(
        "[[service]]\nname = \"web\"\nvip = \"{VIP}\"\nport = 80\nalgorithm = \"none\"\nnone_target = \"{}\"\n\
         [service.health]\nkind = \"none\"\n{}",
        ip(4),
        [2, 3, 4]
            .map(|b| format!("[[service.backend]]\naddress = \"{}\"\n", ip(b)))
            .concat()
    );
    let mut sim = one_switch(&cfg);
    let only = |seen: BTreeMap<String, u32>| seen.into_keys().collect::<Vec<_>>();
    assert_eq!(only(spread(&mut sim, 50000, 5)), ["h4"]);
    let now = sim.now;
    for (index, left, port, why) in [
        (
            0,
            ["h4"],
            50100,
            "h4 is still the one server when h2 leaves",
        ),
        (1, ["h3"], 50200, "without its server, the first usable one"),
    ] {
        sim.c
            .remove_backend(now, 0, index, &mut sim.out)
            .expect("removed");
        sim.pump();
        assert_eq!(only(spread(&mut sim, port, 5)), left, "{why}");
    }
    assert_eq!(sim.c.services()[0].cfg.params.none_target, None);
}

/// A SYN from `client` to the VIP with initial sequence number `isn`.
fn syn_isn(client: (std::net::Ipv4Addr, u16), isn: u32) -> ofp::Bytes {
    packet::ipv4_tcp(&packet::TcpSegment {
        eth_src: mac(1),
        eth_dst: VMAC,
        ip_src: client.0,
        ip_dst: VIP,
        src_port: client.1,
        dst_port: 80,
        seq: isn,
        flags: packet::TcpFlags(SYN),
        ..packet::TcpSegment::default()
    })
}

/// A FLOW_REMOVED for the switch's rule with this cookie bit (as the switch would send it
/// once the rule went).
fn flow_removed_of(f: &crate::testkit::FlowEntry) -> Message {
    flow_removed_after(f, 5)
}

/// [`flow_removed_of`] for a rule that carried `packets` packets.
fn flow_removed_after(f: &crate::testkit::FlowEntry, packets: u64) -> Message {
    Message::FlowRemoved(ofp::FlowRemoved {
        cookie: f.cookie,
        priority: f.priority,
        reason: ofp::FlowRemovedReason::IdleTimeout,
        table_id: 0,
        duration_sec: 2,
        duration_nsec: 0,
        idle_timeout: 1,
        hard_timeout: 0,
        packet_count: packets,
        byte_count: 80 * packets,
        match_: f.match_.clone(),
    })
}

fn conn_flows(sim: &Sim, flag: u64) -> Vec<crate::testkit::FlowEntry> {
    sim.net
        .switch(1)
        .unwrap()
        .flows()
        .filter(|f| cookie::kind_of(f.cookie) == Some(RuleKind::Conn) && f.cookie & flag != 0)
        .cloned()
        .collect()
}

fn active(sim: &Sim) -> u32 {
    sim.c.services()[0]
        .backends
        .iter()
        .map(|b| b.active_connections)
        .sum()
}

/// A client may open a new connection on the 4-tuple of one that is over while its rules
/// are still in the switch (closed connections' rules linger about a second after the FIN,
/// and the kernel picks source ports at random: seen on OVS as responses from backends the
/// controller had not chosen for those ports). The new SYN must not ride the old rule to
/// the old backend undecided: it comes up, is decided and counted, and keeps the old
/// connection's backend, whose rules it replaces with identical ones.
#[test]
fn a_new_connection_on_a_reused_four_tuple_is_decided_and_counted() {
    let mut sim = single_switch("round-robin");
    let client = (ip(1), 48000);
    let first = sim.send("h1", &syn_isn(client, 1000));
    assert_eq!(first.len(), 1);
    let old = first[0].0.clone();
    let b: u8 = old[1..].parse().unwrap();
    let old_accounting = conn_flows(&sim, cookie::conn::ACCOUNTING);
    assert_eq!(old_accounting.len(), 1);

    // The old connection is over; its rules are still in the switch. Same 4-tuple, new ISN.
    let before = sim.packet_ins;
    let second = sim.send("h1", &syn_isn(client, 777_000));
    assert_eq!(
        sim.packet_ins,
        before + 1,
        "the new SYN comes up to the controller"
    );
    assert_eq!(second.len(), 1, "exactly one backend gets it: {second:?}");
    assert_eq!(second[0].0, old, "the 4-tuple keeps its backend");
    assert_eq!(second[0].1.ipv4_dst, Some(ip(b)));
    assert_eq!(
        sim.c.services()[0].counters.connections_total,
        2,
        "both connections counted"
    );
    assert_eq!(sim.c.counters().connections_reopened, 1);
    assert_eq!(active(&sim), 1, "the old connection's accounting ended");
    assert!(
        conn_flows(&sim, cookie::conn::OUTCOME)[0]
            .flags
            .contains(ofp::FlowModFlags::RESET_COUNTS),
        "the replacing reverse rule counts the new connection's packets only"
    );

    // The rest of the new connection is carried by the switch.
    let before = sim.packet_ins;
    let ack = sim.send("h1", &tcp(mac(1), VMAC, client, (VIP, 80), ACK));
    assert_eq!(ack.len(), 1);
    assert_eq!(ack[0].0, old);
    let back = sim.send(&old, &tcp(mac(b), mac(1), (ip(b), 80), client, ACK));
    assert_eq!(back[0].0, "h1");
    assert_eq!(back[0].1.ipv4_src, Some(VIP));
    assert_eq!(sim.packet_ins, before, "both directions carried by rules");

    // The old accounting rule's FLOW_REMOVED (a switch may send one for the replaced rule,
    // or the rule expired just as the SYN came up) does not end the new connection.
    sim.c.handle_message(
        sim.now,
        1,
        &flow_removed_of(&old_accounting[0]),
        &mut sim.out,
    );
    assert_eq!(sim.c.connections().len(), 1, "the new connection stays");
    assert_eq!(active(&sim), 1);
    // Its own does.
    let new_accounting = conn_flows(&sim, cookie::conn::ACCOUNTING);
    assert_eq!(new_accounting.len(), 1);
    assert_ne!(new_accounting[0].cookie, old_accounting[0].cookie);
    sim.c.handle_message(
        sim.now,
        1,
        &flow_removed_of(&new_accounting[0]),
        &mut sim.out,
    );
    assert_eq!(sim.c.connections().len(), 0);
    assert_eq!(active(&sim), 0);
}

/// When the reused 4-tuple's backend can take no new connection, the new one goes
/// elsewhere: its SYN is held until the client sends it again, so that no packet of it
/// meets the old rule on its way to the old backend, and nothing the old backend still
/// sends is passed off as the service's.
#[test]
fn a_reused_four_tuple_whose_backend_is_drained_moves_once_the_rules_are_in() {
    let mut sim = single_switch("round-robin");
    let client = (ip(1), 48200);
    let first = sim.send("h1", &syn_isn(client, 1000));
    let old = first[0].0.clone();
    let old_b: u8 = old[1..].parse().unwrap();
    let bi = sim.c.services()[0].backend_index(ip(old_b)).unwrap();
    assert!(sim.c.set_admin(sim.now, 0, bi, AdminState::Draining));

    let held = sim.send("h1", &syn_isn(client, 555_000));
    assert!(
        held.is_empty(),
        "the SYN is held while the rules change: {held:?}"
    );
    assert_eq!(sim.c.services()[0].counters.connections_total, 2);
    assert_eq!(active(&sim), 1);
    // The client's retransmission (same ISN) goes to the new backend.
    let again = sim.send("h1", &syn_isn(client, 555_000));
    assert_eq!(again.len(), 1);
    let new = again[0].0.clone();
    let new_b: u8 = new[1..].parse().unwrap();
    assert_ne!(new, old, "a drained backend takes no new connection");
    assert_eq!(again[0].1.ipv4_dst, Some(ip(new_b)));
    assert_eq!(
        sim.c.services()[0].counters.connections_total,
        2,
        "the retransmission is the same connection"
    );
    let ack = sim.send("h1", &tcp(mac(1), VMAC, client, (VIP, 80), ACK));
    assert_eq!(ack[0].0, new, "the old forward rule was replaced");
    let late = sim.send(
        &old,
        &tcp(mac(old_b), mac(1), (ip(old_b), 80), client, 0x04),
    );
    assert!(
        late.iter().all(|(_, f)| f.ipv4_src != Some(VIP)),
        "a late RST of the old backend is not passed off as the VIP's: {late:?}"
    );
}

/// A retransmitted SYN (same ISN) after the rules are in is still the same connection:
/// same backend, one decision.
#[test]
fn a_retransmitted_syn_keeps_its_backend_and_is_counted_once() {
    let mut sim = single_switch("round-robin");
    let client = (ip(1), 48100);
    let first = sim.send("h1", &syn_isn(client, 4242));
    for _ in 0..3 {
        let again = sim.send("h1", &syn_isn(client, 4242));
        assert_eq!(again.len(), 1);
        assert_eq!(
            again[0].0, first[0].0,
            "the retransmission follows the first"
        );
    }
    assert_eq!(sim.c.services()[0].counters.connections_total, 1);
    assert_eq!(sim.c.counters().connections_reopened, 0);
}

/// A retransmitted SYN sends the connection's rules again: if the first ones never took
/// effect (lost in a failover's window, a switch that reconnected), the backend's answer
/// is still rewritten by a rule, not carried to the client with the backend's address.
#[test]
fn a_retransmitted_syn_restores_lost_rules() {
    let mut sim = single_switch("round-robin");
    let client = (ip(1), 48200);
    let first = sim.send("h1", &syn_isn(client, 777));
    let backend = first[0].0.clone();
    let b: u8 = backend[1..].parse().expect("a host name");
    // The rules vanish from the switch, as if they had never reached it.
    sim.carry_out(1, rules::delete_kind(RuleKind::Conn));
    let conn_rules = |sim: &Sim| {
        let table = sim.net.switch(1).expect("switch 1");
        table
            .flows()
            .filter(|f| cookie::kind_of(f.cookie) == Some(RuleKind::Conn))
            .count()
    };
    assert_eq!(conn_rules(&sim), 0);
    let again = sim.send("h1", &syn_isn(client, 777));
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].0, backend, "the retransmission follows the first");
    let before = sim.packet_ins;
    let reply = sim.send(&backend, &tcp(mac(b), mac(1), (ip(b), 80), client, SYN_ACK));
    assert_eq!(reply.len(), 1);
    assert_eq!(reply[0].0, "h1");
    assert_eq!(reply[0].1.ipv4_src, Some(VIP), "the reverse rule is back");
    assert_eq!(sim.packet_ins, before, "carried by the rules");
    assert!(conn_rules(&sim) >= 2, "forward and reverse rules again");
    assert_eq!(sim.c.services()[0].counters.connections_total, 1);
}

/// Clients behind a router: every client address comes from the router's MAC and never
/// ARPs. Each connection keeps that MAC, so its rules can be placed again later (here, by
/// a retransmitted SYN after its rules were lost) without the controller learning an entry
/// per client address, which grew without bound (one per client ever seen).
#[test]
fn clients_behind_a_router_are_placed_without_learning_their_addresses() {
    let mut sim = single_switch("round-robin");
    let router = mac(1);
    let clients: Vec<(std::net::Ipv4Addr, u16)> = (0..50u32)
        .map(|i| (std::net::Ipv4Addr::from(0x0b00_0000 + i), 40000))
        .collect();
    let mut backend_of = Vec::new();
    for &c in &clients {
        let got = sim.send("h1", &tcp(router, VMAC, c, (VIP, 80), SYN));
        assert_eq!(
            got.len(),
            1,
            "the SYN from {c:?} reaches one backend: {got:?}"
        );
        backend_of.push(got[0].0.clone());
    }
    for (&c, backend) in clients.iter().zip(&backend_of) {
        assert_eq!(sim.c.topo.mac_of(c.0), None, "{c:?} was not learned");
        let b: u8 = backend[1..].parse().expect("a host name");
        let reply = sim.send(backend, &tcp(mac(b), router, (ip(b), 80), c, SYN_ACK));
        assert_eq!(reply.len(), 1);
        assert_eq!(reply[0].0, "h1", "the answer goes back through the router");
        assert_eq!(reply[0].1.ipv4_src, Some(VIP));
    }
    // The rules vanish; a retransmitted SYN places the connection again from the MAC it
    // kept, and the backend's answer is rewritten by a rule once more.
    sim.carry_out(1, rules::delete_kind(RuleKind::Conn));
    let c = clients[7];
    let again = sim.send("h1", &tcp(router, VMAC, c, (VIP, 80), SYN));
    assert_eq!(again.len(), 1);
    assert_eq!(
        again[0].0, backend_of[7],
        "the retransmission follows the first"
    );
    let b: u8 = backend_of[7][1..].parse().expect("a host name");
    let before = sim.packet_ins;
    let reply = sim.send(
        &backend_of[7],
        &tcp(mac(b), router, (ip(b), 80), c, SYN_ACK),
    );
    assert_eq!(reply.len(), 1);
    assert_eq!(reply[0].1.ipv4_src, Some(VIP), "the reverse rule is back");
    assert_eq!(sim.packet_ins, before, "carried by the rules");
}

/// A connection rebuilt from a switch's rules after a restart does not know its client's
/// MAC (its rules do not say, and client addresses are not learned): the first packet of
/// it that comes up tells it, and it is carried to its backend from then on.
#[test]
fn a_rebuilt_connection_learns_its_clients_mac_from_its_next_packet() {
    let mut sim = single_switch("round-robin");
    let router = mac(1);
    let client = (std::net::Ipv4Addr::new(11, 0, 0, 7), 41000);
    let first = sim.send("h1", &tcp(router, VMAC, client, (VIP, 80), SYN));
    let backend = first[0].0.clone();
    let flows = conn_rules_as_flow_stats(&sim);
    // The controller restarts: the switch comes back to a fresh one, which learns the
    // backends again and rebuilds the connection from the switch's rules.
    sim.restart(&service_config("round-robin", &[2, 3, 4]));
    for i in 2..=4u8 {
        sim.send(&format!("h{i}"), &arp_request(i, ip(9)));
    }
    let reply = Message::MultipartReply(MultipartReply {
        flags: 0,
        body: MultipartReplyBody::Flow(flows),
    });
    sim.c.handle_message(sim.now, 1, &reply, &mut sim.out);
    sim.pump();
    assert_eq!(sim.c.connections().len(), 1, "rebuilt");
    assert_eq!(sim.c.topo.mac_of(client.0), None);
    // A segment of it races up (its rules were lost too): it goes to its backend.
    sim.carry_out(1, rules::delete_kind(RuleKind::Conn));
    let got = sim.send("h1", &tcp(router, VMAC, client, (VIP, 80), ACK));
    assert_eq!(
        got.iter().map(|(h, _)| h.as_str()).collect::<Vec<_>>(),
        [backend.as_str()],
        "carried to the backend it had before the restart"
    );
    assert_eq!(
        got[0].1.ipv4_dst,
        Some(ip(backend[1..].parse().expect("a host name")))
    );
}

/// The sessions hand the core PACKET_INs as their bytes (`handle_packet_in_frame`): it
/// must do exactly what the decoded message does, and fail as `decode` fails, handling
/// nothing.
#[test]
fn a_packet_in_read_in_place_is_handled_as_the_decoded_one() {
    let (mut framed, mut decoded) = (single_switch("round-robin"), single_switch("round-robin"));
    // Each switch's own PACKET_IN count, as operators see it.
    let per_switch = |c: &Controller| c.switch_view(1).map_or(0, |v| v.packet_in);
    let before = per_switch(&framed.c);
    for (i, frame) in [
        tcp(mac(1), VMAC, (ip(1), 40100), (VIP, 80), SYN),
        arp_request(1, VIP),
        tcp(mac(1), mac(3), (ip(1), 40101), (ip(3), 22), SYN),
    ]
    .into_iter()
    .enumerate()
    {
        let pi = Message::PacketIn(ofp::PacketIn::table_miss(1, frame));
        let mut bytes = bytes::BytesMut::new();
        ofp::encode(i as u32, &pi, &mut bytes).expect("encodes");
        let bytes = bytes.freeze();
        framed
            .c
            .handle_packet_in_frame(framed.now, 1, &bytes, &mut framed.out)
            .expect("a good PACKET_IN");
        decoded
            .c
            .handle_message(decoded.now, 1, &pi, &mut decoded.out);
        let a: Vec<_> = framed.out.drain().collect();
        let b: Vec<_> = decoded.out.drain().collect();
        assert!(!a.is_empty(), "case {i}: answered");
        assert_eq!(a, b, "case {i}");
    }
    assert_eq!(
        framed.c.counters().packet_in,
        decoded.c.counters().packet_in
    );
    let counted = per_switch(&framed.c);
    assert_eq!(counted, before + 3);
    assert_eq!(counted, per_switch(&decoded.c));

    // Cut short inside its match: the error `decode` gives, and nothing handled.
    let mut bytes = bytes::BytesMut::new();
    let pi = Message::PacketIn(ofp::PacketIn::table_miss(1, ofp::Bytes::new()));
    ofp::encode(9, &pi, &mut bytes).expect("encodes");
    let mut cut = bytes[..30].to_vec();
    cut[2..4].copy_from_slice(&30u16.to_be_bytes());
    let cut = ofp::Bytes::from(cut);
    let handled = framed.c.counters().packet_in;
    let err = framed
        .c
        .handle_packet_in_frame(framed.now, 1, &cut, &mut framed.out)
        .expect_err("cut short");
    assert_eq!(Some(err), ofp::decode(cut.clone()).err());
    assert_eq!(framed.c.counters().packet_in, handled);
    assert_eq!(per_switch(&framed.c), counted, "nothing counted");
    assert!(framed.out.is_empty());
}

/// One switch: h1 the client at port 1, the backends h2-h4 at ports 2-4, h5 another host
/// at port 5, all heard from by ARP; hosts age after 60 s of silence, and a port takes
/// at most 2 hosts.
fn ageing_hosts() -> Sim {
    let cfg = format!(
        "{}[controller]\nhost_timeout_secs = 60\nmax_hosts_per_port = 2\n",
        service_config("round-robin", &[2, 3, 4])
    );
    let hosts = [
        ("h1", 1, 1),
        ("h2", 1, 2),
        ("h3", 1, 3),
        ("h4", 1, 4),
        ("h5", 1, 5),
    ];
    let mut sim = Sim::new(&cfg, &[(1, 5)], &[], &hosts);
    for i in 1..=5u8 {
        sim.send(&format!("h{i}"), &arp_request(i, ip(9)));
    }
    sim
}

/// Advance the clock a second at a time, `secs` times; what the hosts received.
fn seconds(sim: &mut Sim, secs: u32) -> Vec<(String, PacketFields)> {
    sim.received.clear();
    for _ in 0..secs {
        sim.tick(Duration::from_secs(1));
    }
    std::mem::take(&mut sim.received)
}

/// The ARP probes among `got`: to whom, for which address, in that order.
fn probes(got: &[(String, PacketFields)]) -> Vec<(String, Ipv4Addr)> {
    let mut asked: Vec<(String, Ipv4Addr)> = got
        .iter()
        .filter(|(_, f)| f.arp_sha == Some(ageing::PROBE_MAC))
        .map(|(h, f)| {
            // RFC 5227's probe: no sender address, sent to the host's own MAC.
            assert_eq!(f.arp_op, Some(packet::ARP_OP_REQUEST));
            assert_eq!(f.arp_spa, Some(Ipv4Addr::UNSPECIFIED));
            assert_eq!(f.eth_src, ageing::PROBE_MAC);
            (h.clone(), f.arp_tpa.expect("an ARP target"))
        })
        .collect();
    asked.sort();
    asked
}

/// Host `i`'s answer to a probe for its address.
fn probe_answer(i: u8) -> ofp::Bytes {
    let reply = packet::Arp {
        op: packet::ARP_OP_REPLY,
        sha: mac(i),
        spa: ip(i),
        tha: ageing::PROBE_MAC,
        tpa: Ipv4Addr::UNSPECIFIED,
    };
    packet::arp_frame(mac(i), ageing::PROBE_MAC, None, &reply)
}

/// A host silent for `host_timeout` is asked by ARP, at its own port, whether it is still
/// there: one that answers is kept (and asked again only after another timeout of
/// silence), one that does not answer three probes is forgotten, its L2 rule deleted; when
/// it speaks again it is learned again. The backends are never asked.
#[test]
fn a_silent_host_is_asked_by_arp_and_forgotten_when_it_does_not_answer() {
    let mut sim = ageing_hosts();
    assert!(probes(&seconds(&mut sim, 59)).is_empty());
    // Sixty seconds of silence: the two hosts that are not backends are asked, each at
    // its own port and nowhere else.
    assert_eq!(
        probes(&seconds(&mut sim, 1)),
        [("h1".to_string(), ip(1)), ("h5".to_string(), ip(5))]
    );
    // h1 answers; the answer goes up (nothing carries frames to the probe MAC) and no
    // host hears it.
    let before = sim.packet_ins;
    assert!(sim.send("h1", &probe_answer(1)).is_empty());
    assert_eq!(sim.packet_ins, before + 1);
    // h5 does not: asked twice more, a second apart, then forgotten.
    assert_eq!(
        probes(&seconds(&mut sim, 2)),
        [("h5".to_string(), ip(5)), ("h5".to_string(), ip(5))]
    );
    assert_eq!(l2_hosts(&sim, 1), [1, 2, 3, 4, 5]);
    assert!(probes(&seconds(&mut sim, 1)).is_empty());
    assert_eq!(sim.c.topology().host(mac(5)), None);
    assert_eq!(sim.c.topology().mac_of(ip(5)), None);
    assert_eq!(l2_hosts(&sim, 1), [1, 2, 3, 4]);
    assert_eq!(
        (
            sim.c.counters().host_probes_sent,
            sim.c.counters().hosts_aged
        ),
        (4, 1)
    );
    assert!(
        sim.c
            .events()
            .any(|e| e.kind == "host-aged"
                && e.detail.starts_with(&format!("{} ({})", mac(5), ip(5))))
    );
    // h1, heard from at 60 s, is still known and carried by the switch; it is not asked
    // again before 120 s.
    assert!(sim.c.topology().host(mac(1)).is_some());
    assert!(probes(&seconds(&mut sim, 55)).is_empty());
    assert_eq!(probes(&seconds(&mut sim, 2)), [("h1".to_string(), ip(1))]);
    // A frame to the forgotten h5 goes up and is flooded, as to any unknown MAC; when h5
    // speaks again it is learned again, and its frames are carried by a rule.
    let got = sim.send("h1", &tcp(mac(1), mac(5), (ip(1), 5555), (ip(5), 22), SYN));
    assert!(got.iter().any(|(h, _)| h == "h5"), "{got:?}");
    sim.send("h5", &arp_request(5, ip(9)));
    assert_eq!(l2_hosts(&sim, 1), [1, 2, 3, 4, 5]);
    let before = sim.packet_ins;
    let got = sim.send("h1", &tcp(mac(1), mac(5), (ip(1), 5555), (ip(5), 22), SYN));
    assert_eq!((got.len(), sim.packet_ins), (1, before));
    // The backends were never asked, and are all still known.
    for i in 2..=4u8 {
        assert_eq!(sim.c.topology().mac_of(ip(i)), Some(mac(i)));
    }
}

/// A port whose hosts come and go (virtual machines behind a hypervisor's uplink) gets its
/// share of the host table back as they go: a host refused while the port was full is
/// learned once the departed ones have aged out.
#[test]
fn a_port_whose_hosts_left_gets_its_share_back() {
    let mut sim = ageing_hosts();
    // h5's port (share 2) gets a second host, then a third is refused.
    sim.send("h5", &arp_request(50, ip(9)));
    sim.send("h5", &arp_request(51, ip(9)));
    assert_eq!(sim.c.counters().hosts_refused_port_full, 1);
    assert_eq!(sim.c.topology().host(mac(51)), None);
    // Nobody at port 5 answers: after the timeout and three probes each, both are gone.
    let asked = probes(&seconds(&mut sim, 63));
    assert_eq!(asked.iter().filter(|(_, a)| *a == ip(5)).count(), 3);
    assert_eq!(asked.iter().filter(|(_, a)| *a == ip(50)).count(), 3);
    assert_eq!(sim.c.counters().hosts_aged, 3, "h1, h5 and 50");
    assert_eq!(
        sim.c.topology().share_of(PortRef::new(1, 5)).0,
        Default::default()
    );
    // The newcomer is learned now, with its rule.
    sim.send("h5", &arp_request(51, ip(9)));
    assert_eq!(
        sim.c.topology().host(mac(51)).map(|h| h.at),
        Some(PortRef::new(1, 5))
    );
    assert_eq!(l2_hosts(&sim, 1), [2, 3, 4, 51]);
}

/// What cannot be asked is not aged: a host whose address is not known (its frames came
/// up, but no ARP of its own), and backends. With `host_timeout_secs = 0` nothing is.
#[test]
fn hosts_without_an_address_and_backends_are_not_aged() {
    let mut sim = ageing_hosts();
    // mac(6) at h5's port sends IPv4 to an unknown MAC: learned, with no address.
    sim.send("h5", &tcp(mac(6), mac(9), (ip(6), 5555), (ip(9), 22), SYN));
    assert_eq!(sim.c.topology().host(mac(6)).and_then(|h| h.ip), None);
    let asked = probes(&seconds(&mut sim, 70));
    assert!(
        asked.iter().all(|(h, _)| h == "h1" || h == "h5"),
        "{asked:?}"
    );
    assert!(sim.c.topology().host(mac(6)).is_some());
    for i in 2..=4u8 {
        assert!(sim.c.topology().host(mac(i)).is_some());
    }
    // Off: nobody is ever asked.
    let mut sim = Sim::new(
        &format!(
            "{}[controller]\nhost_timeout_secs = 0\n",
            service_config("round-robin", &[2, 3, 4])
        ),
        &[(1, 5)],
        &[],
        &[("h1", 1, 1), ("h5", 1, 5)],
    );
    sim.send("h1", &arp_request(1, ip(9)));
    assert!(probes(&seconds(&mut sim, 400)).is_empty());
    assert_eq!(sim.c.counters().host_probes_sent, 0);
    assert!(sim.c.topology().host(mac(1)).is_some());
}

/// A backend that left the pool while a connection to it is open is not aged until that
/// connection ends: the connection follows the backend when it moves, which needs its
/// location. Then it is asked and forgotten as any silent host is.
#[test]
fn a_removed_backend_is_not_aged_while_a_connection_to_it_is_open() {
    let mut sim = ageing_hosts();
    let client = (ip(1), 46000);
    let got = sim.send("h1", &tcp(mac(1), VMAC, client, (VIP, 80), SYN));
    let b: u8 = got[0].0[1..].parse().unwrap();
    let position = sim.c.services()[0]
        .backend_index(ip(b))
        .expect("in the pool");
    let now = sim.now;
    sim.c
        .remove_backend(now, 0, position, &mut sim.out)
        .expect("removed");
    sim.pump();
    // Past the timeout, h1 and h5 are asked; the removed backend is not, and stays known.
    let asked = probes(&seconds(&mut sim, 63));
    assert!(asked.iter().any(|(h, _)| h == "h5"), "{asked:?}");
    assert!(asked.iter().all(|(_, a)| *a != ip(b)), "{asked:?}");
    assert!(sim.c.topology().host(mac(b)).is_some());
    // Its last connection ends: asked three times, then forgotten.
    end_at_the_edge(&mut sim, client);
    let asked = probes(&seconds(&mut sim, 4));
    assert_eq!(
        asked.iter().filter(|(_, a)| *a == ip(b)).count(),
        3,
        "{asked:?}"
    );
    assert_eq!(sim.c.topology().host(mac(b)), None);
    // The backends still in the pool were never asked.
    for i in (2..=4u8).filter(|&i| i != b) {
        assert!(sim.c.topology().host(mac(i)).is_some());
    }
}

#[test]
fn frames_that_came_in_by_no_real_port_teach_nothing() {
    // Found by the `controller` fuzz target: a host "learned" at port 0 got an L2 rule
    // whose output OVS refuses (OFPBAC_BAD_OUT_PORT).
    let mut sim = single_switch("round-robin");
    let ports = [0, ofp::port::IN_PORT, ofp::port::CONTROLLER, ofp::port::ANY];
    for port in ports {
        sim.packet_in(1, port, arp_request(9, ip(2)));
    }
    assert!(sim.c.topology().host(mac(9)).is_none());
    assert_eq!(sim.c.counters().packet_in_bad_port, ports.len() as u64);
    // The switch's local port is one a frame comes in by: handled (h2 hears the ARP
    // request), though no host is learned behind it.
    sim.received.clear();
    sim.packet_in(1, ofp::port::LOCAL, arp_request(9, ip(2)));
    let heard = std::mem::take(&mut sim.received);
    assert!(heard.iter().any(|(h, _)| h == "h2"), "{heard:?}");
    assert_eq!(sim.c.counters().packet_in_bad_port, ports.len() as u64);
}

#[test]
fn lldp_naming_a_port_its_switch_does_not_have_makes_no_link() {
    let mut sim = single_switch("round-robin");
    let from = packet::MacAddr([0x0a, 0, 0, 0, 1, 3]);
    // Ports the switch does not have, or that no probe of ours leaves by.
    for port in [0, 9, ofp::port::LOCAL] {
        sim.packet_in(1, 2, sim.c.lldp_probe(from, 1, port, 120));
    }
    // A switch that is not ours (another domain's, over an uplink): no link, not bad.
    sim.packet_in(1, 2, sim.c.lldp_probe(from, 77, 3, 120));
    assert_eq!(sim.c.topology().links().count(), 0);
    assert_eq!(sim.c.counters().packet_in_bad_port, 3);
    // A probe of ours, out of port 3 and back in by port 2 (a looped cable), is a link.
    sim.packet_in(1, 2, sim.c.lldp_probe(from, 1, 3, 120));
    let links: Vec<_> = sim.c.topology().links().collect();
    assert_eq!(links, [(PortRef::new(1, 2), PortRef::new(1, 3))]);
}

/// A host learns its switch's id and port numbers from the probes it receives, and could
/// write its own naming any of them: a probe without this controller's tag makes no link
/// (a forged one once made the port it named a link port, whose hosts were forgotten and
/// never learned again), whatever its names.
#[test]
fn a_forged_lldp_probe_makes_no_link() {
    let mut sim = single_switch("round-robin");
    let from = packet::MacAddr([0x0a, 0, 0, 0, 1, 3]);
    let other = packet::LldpKey([1, 2]);
    // From h1's port 1, naming s1's port 3, where h3 is.
    sim.packet_in(1, 1, packet::lldp_probe(from, 1, 3, 120, &other));
    assert_eq!(sim.c.topology().links().count(), 0);
    assert_eq!(sim.c.counters().lldp_forged, 1);
    assert!(sim.c.topology().host(mac(3)).is_some(), "h3 is still known");
    // Under another key (a controller restarted with a new one), ours is a link again.
    sim.c.set_lldp_key(other);
    sim.packet_in(1, 1, packet::lldp_probe(from, 1, 3, 120, &other));
    assert_eq!(sim.c.topology().links().count(), 1);
    assert_eq!(sim.c.counters().lldp_forged, 1);
}

#[test]
fn a_port_numbered_zero_is_not_recorded() {
    let mut sim = single_switch("round-robin");
    let status = Message::PortStatus(ofp::PortStatus {
        reason: ofp::PortReason::Add,
        desc: port_desc(1, 0),
    });
    sim.c.handle_message(sim.now, 1, &status, &mut sim.out);
    sim.pump();
    let ports: Vec<u32> = sim
        .c
        .topology()
        .switch(1)
        .map_or(Vec::new(), |s| s.ports.keys().copied().collect());
    assert_eq!(ports, [1, 2, 3, 4]);
}

/// A reload goes on with a service's balancer when it would be built as before: the
/// same algorithm and parameters, the backends that stay in their order, new ones after
/// them. Here SRT's response-time averages: kept through a reload of the same file, a
/// removal and an addition; started afresh by a new parameter or a new order. A reload
/// of another service's settings once restarted every balancer (ISSLM's latches, MRBS's
/// model and its warm-up of 50 samples with them).
#[test]
fn a_reload_goes_on_with_the_balancer_while_it_would_be_built_the_same() {
    let mut sim = single_switch("srt");
    for (round, base) in [(0, 10.0), (1, 30.0)] {
        for b in 0..3 {
            sim.c
                .handle_response_time(0, b, base + 10.0 * b as f64 + round as f64);
        }
        sim.tick(Duration::from_secs(1));
    }
    let rt = |sim: &Sim| -> Vec<Option<f64>> {
        let b = &sim.c.services()[0].balancer;
        (0..b.n_backends()).map(|i| b.srt_rt_ms(i)).collect()
    };
    let before = rt(&sim);
    assert!(before.iter().all(Option::is_some), "{before:?}");
    let reload_now = |sim: &mut Sim, text: &str| {
        let cfg = Config::from_toml(text, &|_| None).expect("valid config");
        let now = sim.now;
        sim.c.reload(now, &cfg, &mut sim.out);
        sim.pump();
    };
    reload_now(&mut sim, &service_config("srt", &[2, 3, 4]));
    assert_eq!(rt(&sim), before, "the same file");
    reload_now(&mut sim, &service_config("srt", &[2, 4]));
    assert_eq!(rt(&sim), [before[0], before[2]], "h3 removed");
    reload_now(&mut sim, &service_config("srt", &[2, 4, 3]));
    assert_eq!(
        rt(&sim),
        [before[0], before[2], None],
        "h3 back, after them"
    );
    reload_now(&mut sim, &service_config("srt", &[4, 2, 3]));
    assert_eq!(rt(&sim), [None, None, None], "a new order");
    sim.c.handle_response_time(0, 0, 50.0);
    sim.tick(Duration::from_secs(1));
    assert!(rt(&sim)[0].is_some());
    let hysteresis = service_config("srt", &[4, 2, 3]).replace(
        "algorithm = \"srt\"\n",
        "algorithm = \"srt\"\nhysteresis = 0.2\n",
    );
    reload_now(&mut sim, &hysteresis);
    assert_eq!(rt(&sim)[0], None, "a new parameter");
}

/// A reload keeps each service's handshake figures (exported as counters, which must not
/// go back) and what it learned of its clients, as it keeps the other counters.
#[test]
fn a_reload_keeps_the_handshake_figures() {
    let mut sim = single_switch("round-robin");
    let h = &mut sim.c.services[0].handshakes;
    for _ in 0..handshake::WINDOW {
        assert!(
            h.defer(true),
            "a gapping episode defers every admission at first"
        );
        h.outcome(true);
    }
    h.outcome(false);
    let before = *h;
    assert!(before.clients_complete);
    assert_eq!(
        (before.deferred, before.completed, before.abandoned),
        (
            u64::from(handshake::WINDOW),
            u64::from(handshake::WINDOW),
            1
        )
    );
    reload(&mut sim, &service_config("round-robin", &[2, 4, 3]));
    let after = sim.c.services()[0].handshakes;
    assert_eq!(
        (
            after.deferred,
            after.completed,
            after.abandoned,
            after.clients_complete
        ),
        (before.deferred, before.completed, before.abandoned, true)
    );
}

/// A switch cannot grow its port table without bound: numbers above OFPP_MAX are reserved
/// (§7.2.1; LOCAL among them, no data port) and never recorded, and a switch's new ports
/// beyond `MAX_PORTS_PER_SWITCH` are refused and counted, whether a PORT_DESC reply or
/// PORT_STATUS brings them. Its known ports still change, and a deleted one frees a place.
#[test]
fn a_switch_cannot_grow_its_port_table_without_bound() {
    use crate::topology::MAX_PORTS_PER_SWITCH;
    let mut sim = single_switch("round-robin");
    let ports = |sim: &Sim| {
        sim.c.topology().switch(1).map_or(Vec::new(), |s| {
            s.ports.keys().copied().collect::<Vec<u32>>()
        })
    };
    let status = |sim: &mut Sim, reason, desc| {
        let m = Message::PortStatus(ofp::PortStatus { reason, desc });
        sim.c.handle_message(sim.now, 1, &m, &mut sim.out);
        sim.pump();
    };
    for p in [ofp::port::MAX + 1, ofp::port::LOCAL, u32::MAX] {
        status(&mut sim, ofp::PortReason::Add, port_desc(1, p));
    }
    assert_eq!(ports(&sim), [1, 2, 3, 4], "reserved numbers");
    assert_eq!(sim.c.counters().ports_refused, 0);

    let extra = 10;
    let descs: Vec<_> = (5..=(MAX_PORTS_PER_SWITCH + extra) as u32)
        .map(|p| port_desc(1, p))
        .collect();
    let reply = Message::MultipartReply(MultipartReply {
        flags: 0,
        body: MultipartReplyBody::PortDesc(descs),
    });
    sim.c.handle_message(sim.now, 1, &reply, &mut sim.out);
    sim.pump();
    assert_eq!(ports(&sim).len(), MAX_PORTS_PER_SWITCH);
    assert_eq!(sim.c.counters().ports_refused, extra as u64);
    let next = (MAX_PORTS_PER_SWITCH + extra + 1) as u32;
    status(&mut sim, ofp::PortReason::Add, port_desc(1, next));
    assert_eq!(sim.c.counters().ports_refused, extra as u64 + 1);
    assert!(!ports(&sim).contains(&next));

    // A known port still changes; a deleted one makes room for a new one.
    let mut down = port_desc(1, 3);
    down.state |= 1;
    status(&mut sim, ofp::PortReason::Modify, down);
    let up = |sim: &Sim, p: u32| {
        sim.c
            .topology()
            .switch(1)
            .and_then(|s| s.ports.get(&p))
            .map(|i| i.up)
    };
    assert_eq!(up(&sim, 3), Some(false));
    status(&mut sim, ofp::PortReason::Delete, port_desc(1, 5));
    status(&mut sim, ofp::PortReason::Add, port_desc(1, next));
    assert_eq!(up(&sim, next), Some(true));
    assert_eq!(ports(&sim).len(), MAX_PORTS_PER_SWITCH);
    assert_eq!(sim.c.counters().ports_refused, extra as u64 + 1);
}

/// A host (h5) claims the only backend's address with a gratuitous ARP from its own MAC.
/// Unpinned, the controller takes that for the backend having moved (as a migrated VM
/// announces itself) and sends the next connection to h5. With the backend's `mac`
/// pinned, the claim is refused and counted, and connections keep reaching h2.
#[test]
fn a_pinned_backend_address_cannot_be_claimed_by_another_host() {
    let hosts = [("h1", 1, 1), ("h2", 1, 2), ("h5", 1, 5)];
    let reached_by_new_connection = |pin: &str| {
        let config = service_config("round-robin", &[2]).replace(
            "address = \"10.0.0.2\"\n",
            &format!("address = \"10.0.0.2\"\n{pin}"),
        );
        let mut sim = Sim::new(&config, &[(1, 5)], &[], &hosts);
        for h in ["h1", "h2", "h5"] {
            let i = h[1..].parse().unwrap();
            sim.send(h, &arp_request(i, ip(9)));
        }
        let first = sim.send("h1", &tcp(mac(1), VMAC, (ip(1), 45000), (VIP, 80), SYN));
        assert_eq!(first[0].0, "h2", "before the claim: {first:?}");
        // "I am 10.0.0.2", from h5's MAC.
        sim.send("h5", &packet::arp_request(mac(5), ip(2), ip(2)));
        sim.tick(Duration::from_millis(10));
        let next = sim.send("h1", &tcp(mac(1), VMAC, (ip(1), 45001), (VIP, 80), SYN));
        let refused = sim.c.counters().address_claims_refused;
        (next.first().map(|(h, _)| h.clone()), refused)
    };
    assert_eq!(
        reached_by_new_connection(""),
        (Some("h5".to_string()), 0),
        "unpinned: the claim moves the backend"
    );
    assert_eq!(
        reached_by_new_connection("mac = \"00:00:00:00:00:02\"\n"),
        (Some("h2".to_string()), 1),
        "pinned: the claim is refused"
    );
}

/// The lab's service: no VIP, so the clients address a backend (h2) and every backend
/// address is intercepted. One switch: h1 the client, h2..h4 the backends.
fn no_vip() -> Sim {
    one_switch(
        &service_config("round-robin", &[2, 3, 4]).replace(&format!("vip = \"{VIP}\"\n"), ""),
    )
}

/// h1's SYN from `port` with `isn`, to h2's address.
fn syn_to_h2(port: u16, isn: u32) -> ofp::Bytes {
    packet::ipv4_tcp(&packet::TcpSegment {
        eth_src: mac(1),
        eth_dst: mac(2),
        ip_src: ip(1),
        ip_dst: ip(2),
        src_port: port,
        dst_port: 80,
        seq: isn,
        flags: packet::TcpFlags(SYN),
        ..packet::TcpSegment::default()
    })
}

/// The connection's forward rule at the client's edge goes, as Open vSwitch ends it a
/// second after the client's RST passed it (`fin_timeout`): it carried that one packet.
fn forward_rule_ends_after_a_rst(sim: &mut Sim) {
    let fwd = conn_flows(sim, cookie::conn::ACCOUNTING);
    assert_eq!(fwd.len(), 1, "one forward rule at the edge");
    sim.carry_out(1, rules::delete_kind(RuleKind::Conn));
    let now = sim.now;
    sim.c
        .handle_message(now, 1, &flow_removed_after(&fwd[0], 1), &mut sim.out);
    sim.pump();
}

/// A client's SYN is decided; its connection's rule ends before the handshake completed
/// through it (the client reset an unexpected answer, and `fin_timeout` ended the rule a
/// second later); the client sends the same SYN again (same ISN). That is its one
/// connection attempt: decided and counted once, and it keeps its backend. Found in the
/// lab's full runs, where such SYNs were decided twice (more picks than requests).
#[test]
fn a_syn_retransmitted_after_its_rule_ended_in_the_handshake_is_counted_once() {
    let mut sim = no_vip();
    let first = sim.send("h1", &syn_to_h2(41000, 9001));
    assert_eq!(first.len(), 1, "the SYN reaches a backend: {first:?}");
    assert_eq!(sim.c.services()[0].counters.connections_total, 1);
    forward_rule_ends_after_a_rst(&mut sim);
    assert_eq!(
        sim.c.connections().len(),
        0,
        "the connection's accounting ended"
    );
    assert_eq!(active(&sim), 0);

    sim.tick(Duration::from_millis(100));
    let again = sim.send("h1", &syn_to_h2(41000, 9001));
    let s = &sim.c.services()[0];
    assert_eq!(
        s.counters.connections_total, 1,
        "one client connection, one decision"
    );
    assert_eq!(again.len(), 1, "the retransmission goes on: {again:?}");
    assert_eq!(again[0].0, first[0].0, "to the backend decided for it");
    assert_eq!(
        s.backends.iter().map(|b| b.connections_total).sum::<u64>(),
        1,
        "the per-backend picks too"
    );
    assert_eq!(active(&sim), 1, "open again");
    assert_eq!(sim.c.connections().len(), 1);

    // A SYN with another ISN on the 4-tuple is a new connection, counted.
    forward_rule_ends_after_a_rst(&mut sim);
    sim.tick(Duration::from_millis(100));
    sim.send("h1", &syn_to_h2(41000, 777_777));
    assert_eq!(sim.c.services()[0].counters.connections_total, 2);
}

/// The memory of a connection ended in its handshake is bounded in time: a SYN with its
/// ISN long after (no client retransmits that late) is decided as a new one.
#[test]
fn a_connection_ended_in_its_handshake_is_forgotten_after_a_while() {
    let mut sim = no_vip();
    sim.send("h1", &syn_to_h2(41001, 4040));
    forward_rule_ends_after_a_rst(&mut sim);
    for _ in 0..9 {
        sim.tick(Duration::from_secs(1));
    }
    sim.send("h1", &syn_to_h2(41001, 4040));
    assert_eq!(sim.c.services()[0].counters.connections_total, 2);
}
