//! Service connections through the fake network: a connection's decision against the
//! ends of its rules.

use flowgate_packet as packet;
use ofp::Message;

use super::super::rules;
use crate::cookie::{self, RuleKind};
use crate::testkit::sim::*;

/// The lab's service: no VIP, so the clients address a backend (h2) and every backend
/// address is intercepted. One switch: h1 the client, h2..h4 the backends.
fn no_vip() -> Sim {
    let mut config = "[[service]]\nname = \"web\"\nport = 80\nalgorithm = \"round-robin\"\n[service.health]\nkind = \"none\"\n".to_owned();
    for b in 2..=4 {
        config += &format!("[[service.backend]]\naddress = \"{}\"\n", ip(b));
    }
    let hosts = [("h1", 1, 1), ("h2", 1, 2), ("h3", 1, 3), ("h4", 1, 4)];
    let mut sim = Sim::new(&config, &[(1, 4)], &[], &hosts);
    for i in 1..=4u8 {
        sim.send(&format!("h{i}"), &arp_request(i, ip(9)));
    }
    sim
}

/// h1's SYN from `port` with `isn`, to h2's address.
fn syn(port: u16, isn: u32) -> ofp::Bytes {
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
    let fwd: Vec<_> = sim
        .net
        .switch(1)
        .expect("switch 1")
        .flows()
        .filter(|f| {
            cookie::kind_of(f.cookie) == Some(RuleKind::Conn)
                && f.cookie & cookie::conn::ACCOUNTING != 0
        })
        .cloned()
        .collect();
    assert_eq!(fwd.len(), 1, "one forward rule at the edge");
    sim.carry_out(1, rules::delete_kind(RuleKind::Conn));
    let fr = Message::FlowRemoved(ofp::FlowRemoved {
        cookie: fwd[0].cookie,
        priority: fwd[0].priority,
        reason: ofp::FlowRemovedReason::IdleTimeout,
        table_id: 0,
        duration_sec: 1,
        duration_nsec: 0,
        idle_timeout: 1,
        hard_timeout: 0,
        packet_count: 1,
        byte_count: 54,
        match_: fwd[0].match_.clone(),
    });
    sim.c.handle_message(sim.now, 1, &fr, &mut sim.out);
    sim.pump();
}

fn active(sim: &Sim) -> u32 {
    sim.c.services()[0]
        .backends
        .iter()
        .map(|b| b.active_connections)
        .sum()
}

/// A client's SYN is decided; its connection's rule ends before the handshake completed
/// through it (the client reset an unexpected answer, and `fin_timeout` ended the rule a
/// second later); the client sends the same SYN again (same ISN). That is its one
/// connection attempt: decided and counted once, and it keeps its backend. Found in the
/// lab's full runs, where such SYNs were decided twice (more picks than requests).
#[test]
fn a_syn_retransmitted_after_its_rule_ended_in_the_handshake_is_counted_once() {
    let mut sim = no_vip();
    let first = sim.send("h1", &syn(41000, 9001));
    assert_eq!(first.len(), 1, "the SYN reaches a backend: {first:?}");
    assert_eq!(sim.c.services()[0].counters.connections_total, 1);
    forward_rule_ends_after_a_rst(&mut sim);
    assert_eq!(
        sim.c.connections().len(),
        0,
        "the connection's accounting ended"
    );
    assert_eq!(active(&sim), 0);

    sim.tick(std::time::Duration::from_millis(100));
    let again = sim.send("h1", &syn(41000, 9001));
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
    sim.tick(std::time::Duration::from_millis(100));
    sim.send("h1", &syn(41000, 777_777));
    assert_eq!(sim.c.services()[0].counters.connections_total, 2);
}

/// The memory of a connection ended in its handshake is bounded in time: a SYN with its
/// ISN long after (no client retransmits that late) is decided as a new one.
#[test]
fn a_connection_ended_in_its_handshake_is_forgotten_after_a_while() {
    let mut sim = no_vip();
    sim.send("h1", &syn(41001, 4040));
    forward_rule_ends_after_a_rst(&mut sim);
    for _ in 0..9 {
        sim.tick(std::time::Duration::from_secs(1));
    }
    sim.send("h1", &syn(41001, 4040));
    assert_eq!(sim.c.services()[0].counters.connections_total, 2);
}
