//! The gaps through the controller and a fake network (the harness pattern of
//! `controller/tests.rs`): meters on the intercept and table-miss rules, refusals
//! answered with RSTs, OFF-period rules installed and withdrawn, established connections
//! untouched.

use std::time::Duration;

use super::{Mode, SERVICE_METER_BASE, TABLE_MISS_METER};
use crate::cookie::{self, RuleKind};
use crate::testkit::FakeTable;
use crate::testkit::PacketFields;
use crate::testkit::sim::{self, ACK, Sim, VIP, VMAC, arp_request, client_segment, ip, mac, tcp};

/// One switch, h1 the client on port 1, backends h2, h3 on ports 2, 3, with the given
/// `[service.overload]` and `[controller.overload]` sections.
fn overload_sim(overload: &str, controller_overload: &str) -> Sim {
    let mut text = format!(
        "[controller.overload]\n{controller_overload}\n\
         [[service]]\nname = \"web\"\nvip = \"{VIP}\"\nport = 80\n\
         [service.health]\nkind = \"none\"\n[service.overload]\n{overload}\n"
    );
    for b in [2, 3] {
        text += &format!("[[service.backend]]\naddress = \"{}\"\n", ip(b));
    }
    let hosts = [("h1", 1, 1), ("h2", 1, 2), ("h3", 1, 3)];
    let mut s = Sim::new(&text, &[(1, 3)], &[], &hosts);
    for i in 1..=3u8 {
        s.send(&format!("h{i}"), &arp_request(i, ip(9)));
    }
    s
}

/// h1 opens a connection from `port`: returns what h1 and the backends received.
fn syn(s: &mut Sim, port: u16) -> Vec<(String, PacketFields)> {
    s.send("h1", &tcp(mac(1), VMAC, (ip(1), port), (VIP, 80), sim::SYN))
}

fn table(s: &Sim) -> &FakeTable {
    s.net.switch(1).expect("switch")
}

fn intercept_meter(t: &FakeTable) -> Option<u32> {
    t.flows()
        .find(|e| cookie::kind_of(e.cookie) == Some(RuleKind::Intercept))
        .and_then(|e| e.meter())
}

fn meter_rate(t: &FakeTable, id: u32) -> Option<u32> {
    t.meters().get(&id).and_then(|m| match m.bands.first() {
        Some(ofp::MeterBand::Drop { rate, .. }) => Some(*rate),
        _ => None,
    })
}

/// Tell an RST from a forwarded SYN among what a host received.
fn is_rst(f: &PacketFields) -> bool {
    f.tcp_flags.is_some_and(|fl| fl & 0x04 != 0)
}

#[test]
fn off_mode_installs_no_meter() {
    let sim = overload_sim("mode = \"off\"", "mode = \"off\"");
    assert!(table(&sim).meters().is_empty());
    assert_eq!(intercept_meter(table(&sim)), None);
}

#[test]
fn the_intercept_and_table_miss_rules_carry_their_meters() {
    let sim = overload_sim(
        "mode = \"adaptive\"\ncapacity_rps = 50",
        "mode = \"adaptive\"",
    );
    let t = table(&sim);
    let id = SERVICE_METER_BASE;
    assert_eq!(intercept_meter(t), Some(id), "meter on the intercept rule");
    let miss = t
        .flows()
        .find(|e| cookie::kind_of(e.cookie) == Some(RuleKind::TableMiss))
        .expect("table-miss");
    assert_eq!(miss.meter(), Some(TABLE_MISS_METER));
    let m = &t.meters()[&id];
    assert_eq!(m.flags.0 & 0x6, 0x6, "PKTPS|BURST: {m:?}");
    assert!(
        matches!(m.bands.as_slice(), [ofp::MeterBand::Drop { .. }]),
        "one DROP band"
    );
    // §5.9: the meter instruction comes before apply-actions.
    let e = t
        .flows()
        .find(|e| cookie::kind_of(e.cookie) == Some(RuleKind::Intercept))
        .expect("intercept");
    assert!(matches!(
        e.instructions.first(),
        Some(ofp::Instruction::Meter(_))
    ));
}

/// 3× overload: the controller refuses beyond the admitted rate with RSTs, the meter
/// follows the gap (backstop above the admitted rate), the API view shows it, and the
/// admitted connections are carried by their own rules whatever the gap.
#[test]
fn overload_is_refused_with_rsts_and_the_meter_follows_the_gap() {
    let mut sim = overload_sim("mode = \"adaptive\"\ncapacity_rps = 100", "mode = \"off\"");
    let open = meter_rate(table(&sim), SERVICE_METER_BASE).expect("meter");
    let (mut rsts, mut forwarded, mut port) = (0, 0, 10_000u16);
    let mut first_admitted = None;
    // 300 SYN/s for 4 s (one every 10/3 ms).
    for k in 0..1200u32 {
        if k % 3 == 0 {
            sim.tick(Duration::from_millis(10));
        }
        port += 1;
        let got = syn(&mut sim, port);
        if got.iter().any(|(h, f)| h == "h1" && is_rst(f)) {
            rsts += 1;
        } else if got.iter().any(|(h, _)| h == "h2" || h == "h3") {
            forwarded += 1;
            first_admitted.get_or_insert(port);
        }
    }
    let v = sim.c.gap_view(0).expect("view");
    assert_eq!(v.mode, Mode::Adaptive);
    assert!(v.gapping, "{v:?}");
    let limit = v.admitted_rate_limit.expect("limit");
    assert!(
        (60.0..=150.0).contains(&limit),
        "admitted rate limit {limit}: {v:?}"
    );
    assert!(
        (70.0..=100.0).contains(&v.admitted_rate),
        "admitted rate: {v:?}"
    );
    assert_eq!(v.refused_total, rsts, "every refusal was a RST: {v:?}");
    assert!(
        rsts > 500 && forwarded > 250,
        "rsts {rsts} forwarded {forwarded}"
    );
    let rate = meter_rate(table(&sim), SERVICE_METER_BASE).expect("meter");
    assert!(
        rate <= open,
        "the meter did not loosen under overload: {rate} > {open}"
    );
    assert!(
        f64::from(rate) >= 3.0 * limit && f64::from(rate) <= 5.0 * limit,
        "backstop ≈ 4× the admitted rate: meter {rate}, limit {limit}"
    );
    // An admitted connection's next packets are carried by its rules (priority 300), not
    // by the gapped intercept.
    let p = first_admitted.expect("one admitted");
    let ack = tcp(mac(1), VMAC, (ip(1), p), (VIP, 80), 0x10);
    let d = sim.net.deliver_frame("h1", &ack).expect("deliver");
    assert!(
        d.to_controller.is_empty(),
        "no PACKET_IN for an admitted connection"
    );
    assert_eq!(d.hosts.len(), 1, "delivered to its backend: {:?}", d.hosts);
}

/// Through the controller: with the ceiling (the default) an idle service's gate and meter
/// already hold `capacity × 0.95`, and a burst beyond it is refused with RSTs; with
/// `ceiling = false` nothing is limited before the law has measured an overload (no limit
/// in the API view, an open meter), and the same burst is forwarded in full.
#[test]
fn without_the_ceiling_an_idle_service_is_not_limited() {
    let burst = |overload: &str| {
        let mut sim = overload_sim(overload, "mode = \"off\"");
        sim.tick(Duration::from_millis(200));
        let v = sim.c.gap_view(0).expect("view");
        let meter = meter_rate(table(&sim), SERVICE_METER_BASE).expect("meter");
        // 40 SYNs within 40 ms: 1,000/s, far beyond 50/s, too short for the law to measure.
        let (mut rsts, mut forwarded) = (0, 0);
        for port in 20_000..20_040u16 {
            sim.tick(Duration::from_millis(1));
            let got = syn(&mut sim, port);
            if got.iter().any(|(h, f)| h == "h1" && is_rst(f)) {
                rsts += 1;
            } else if got.iter().any(|(h, _)| h == "h2" || h == "h3") {
                forwarded += 1;
            }
        }
        (v, meter, rsts, forwarded)
    };
    let (v, meter, rsts, forwarded) = burst("mode = \"adaptive\"\ncapacity_rps = 50");
    assert_eq!(v.admitted_rate_limit, Some(50.0 * 0.95), "{v:?}");
    assert_eq!(
        meter,
        super::quantize_rate(4.0 * 50.0 * 0.95),
        "backstop of the ceiling"
    );
    assert!(
        rsts > 20 && forwarded < 20,
        "the ceiling refuses the burst: {rsts} RSTs, {forwarded} forwarded"
    );
    let (v, meter, rsts, forwarded) =
        burst("mode = \"adaptive\"\ncapacity_rps = 50\nceiling = false");
    assert_eq!(v.admitted_rate_limit, None, "{v:?}");
    assert!(!v.gapping, "{v:?}");
    assert_eq!(meter, super::OPEN_METER_RATE, "an open meter");
    assert_eq!(
        (rsts, forwarded),
        (0, 40),
        "the law alone lets the burst through until it measures it"
    );
}

/// A gap of seconds becomes OFF-period drop rules (priority 250, hard timeout), which
/// are withdrawn once the gap relaxes; established connections stay above them.
#[test]
fn off_period_rules_are_installed_and_withdrawn() {
    let mut sim = overload_sim(
        "mode = \"adaptive\"\ncapacity_rps = 0.5\nmin_rate = 0.25\noff_rule_min_gap_ms = 2000",
        "mode = \"off\"",
    );
    let gap_rules = |t: &FakeTable| {
        t.flows()
            .filter(|e| cookie::kind_of(e.cookie) == Some(RuleKind::Gap))
            .map(|e| (e.priority, e.hard_timeout))
            .collect::<Vec<_>>()
    };
    let mut port = 20_000u16;
    let mut saw_rule = None;
    // 20 SYN/s until the gap reaches seconds.
    for _ in 0..400 {
        sim.tick(Duration::from_millis(50));
        port += 1;
        syn(&mut sim, port);
        if let Some(r) = gap_rules(table(&sim)).first() {
            saw_rule = Some(*r);
            break;
        }
    }
    let (prio, hard) = saw_rule.expect("an OFF-period rule was installed");
    assert_eq!(prio, 250);
    assert!(hard >= 2, "hard_timeout {hard}");
    let v = sim.c.gap_view(0).expect("view");
    assert!(v.gap_ms.is_some_and(|g| g >= 2000.0), "{v:?}");
    // The load goes away: the gap relaxes and the OFF rule is withdrawn (before its
    // hard timeout: the fake switch's clock does not move).
    for _ in 0..400 {
        sim.tick(Duration::from_millis(50));
        if gap_rules(table(&sim)).is_empty() {
            break;
        }
    }
    assert!(gap_rules(table(&sim)).is_empty(), "OFF rule withdrawn");
    for _ in 0..100 {
        sim.tick(Duration::from_millis(50));
    }
    assert!(!sim.c.gap_view(0).expect("view").gapping, "gap lifted");
}

/// The controller's own gap: its measured load (from the runtime) tightens the table-miss
/// and intercept meters to its admitted PACKET_IN rate.
#[test]
fn controller_load_tightens_the_controller_meters() {
    let mut sim = overload_sim("mode = \"off\"", "mode = \"adaptive\"");
    let open = meter_rate(table(&sim), TABLE_MISS_METER).expect("meter");
    saturate(&mut sim, 30);
    let v = sim.c.controller_gap_view();
    assert!(v.gap.gapping, "{v:?}");
    let miss = meter_rate(table(&sim), TABLE_MISS_METER).expect("meter");
    let icpt = meter_rate(table(&sim), SERVICE_METER_BASE).expect("meter");
    assert!(miss < open && miss <= 2_200, "table-miss meter {miss}");
    assert_eq!(
        icpt, miss,
        "the intercept meter is capped by the controller's share"
    );
    assert!(v.max_handled_rate >= 1_900.0, "{v:?}");
}

fn meter_stats(id: u32, dropped: u64) -> ofp::Message {
    ofp::Message::MultipartReply(ofp::MultipartReply {
        flags: 0,
        body: ofp::MultipartReplyBody::Meter(vec![ofp::MeterStats {
            meter_id: id,
            flow_count: 1,
            packet_in_count: dropped * 2,
            byte_in_count: 0,
            duration_sec: 1,
            duration_nsec: 0,
            band_stats: vec![ofp::MeterBandStats {
                packet_band_count: dropped,
                byte_band_count: dropped * 60,
            }],
        }]),
    })
}

/// METER_STATS feedback: the band drops since the last reply are offered demand (the law's
/// λ and the switch's), shown in the views; a count that went down means the meter was
/// replaced (OVS restarts the counts on OFPMC_MODIFY), so all of it is new.
#[test]
fn meter_stats_drops_are_counted_as_offered_demand() {
    let mut sim = overload_sim(
        "mode = \"adaptive\"\ncapacity_rps = 100",
        "mode = \"adaptive\"",
    );
    sim.tick(Duration::from_millis(100));
    let before = sim.c.gap_view(0).expect("view").offered_total;
    for (count, total) in [(500, 500), (800, 800), (100, 900)] {
        let (now, mut out) = (sim.now, crate::controller::Outbox::new());
        sim.c
            .handle_message(now, 1, &meter_stats(SERVICE_METER_BASE, count), &mut out);
        let v = sim.c.gap_view(0).expect("view");
        assert_eq!(v.meter_dropped_total, total, "{v:?}");
        assert_eq!(v.offered_total, before + total, "{v:?}");
        assert_eq!(
            v.refused_total, 0,
            "meter drops are not the gate's refusals"
        );
    }
    sim.tick(Duration::from_millis(100));
    let v = sim.c.gap_view(0).expect("view");
    let sw = v.switches.first().expect("per-switch view");
    assert_eq!(sw.dpid, "0000000000000001");
    assert_eq!(sw.meter_dropped_total, 900);
    assert!(sw.offered_rate > 0.0, "{sw:?}");
    assert!(sw.meter_rate.is_some(), "{sw:?}");
    // The controller counts every meter's drops as PACKET_IN demand.
    let c = sim.c.controller_gap_view();
    assert_eq!(c.gap.meter_dropped_total, 900, "{c:?}");
    assert_eq!(
        c.gap.switches.first().map(|s| s.meter_dropped_total),
        Some(900)
    );
    // The table-miss meter's drops are the controller's alone.
    let (now, mut out) = (sim.now, crate::controller::Outbox::new());
    sim.c
        .handle_message(now, 1, &meter_stats(TABLE_MISS_METER, 40), &mut out);
    assert_eq!(sim.c.controller_gap_view().gap.meter_dropped_total, 940);
    assert_eq!(sim.c.gap_view(0).expect("view").meter_dropped_total, 900);
}

/// Two switches bring one service's new flows, offered 3:1: the admitted rate is split
/// 3:1 between their gates and meters; when one goes idle the other gets its share within
/// a few control intervals.
#[test]
fn the_service_rate_is_split_across_switches_by_demand() {
    let text = format!(
        "[[service]]\nname = \"web\"\nvip = \"{VIP}\"\nport = 80\n\
         [service.health]\nkind = \"none\"\n[service.overload]\nmode = \"adaptive\"\n\
         capacity_rps = 40\ninterval_ms = 50\n\
         [[service.backend]]\naddress = \"{}\"\n[[service.backend]]\naddress = \"{}\"\n",
        ip(2),
        ip(3)
    );
    let hosts = [("h1", 1, 1), ("h2", 1, 2), ("h3", 1, 3), ("h4", 2, 1)];
    let mut s = Sim::new(&text, &[(1, 4), (2, 2)], &[((1, 4), (2, 2))], &hosts);
    for i in 1..=4u8 {
        s.send(&format!("h{i}"), &arp_request(i, ip(9)));
    }
    let mut port = 10_000u16;
    let mut syn_from = |s: &mut Sim, h: u8| {
        port = port.wrapping_add(1).max(1024);
        let frame = tcp(mac(h), VMAC, (ip(h), port), (VIP, 80), sim::SYN);
        let got = s.send(&format!("h{h}"), &frame);
        got.iter().any(|(name, _)| name == "h2" || name == "h3")
    };
    // 3 s: h1 (switch 1) offers 120/s, h4 (switch 2) 40/s, in 10 ms steps.
    let mut admitted = [0u32; 2];
    for k in 0..300u32 {
        s.tick(Duration::from_millis(10));
        for _ in 0..((k * 12 + 12) / 10 - (k * 12) / 10) {
            if syn_from(&mut s, 1) && k >= 200 {
                admitted[0] += 1;
            }
        }
        if k % 5 < 2 && syn_from(&mut s, 4) && k >= 200 {
            admitted[1] += 1;
        }
    }
    let v = s.c.gap_view(0).expect("view");
    let share = |v: &GapViewT, d: &str| {
        v.switches
            .iter()
            .find(|x| x.dpid.ends_with(d))
            .and_then(|x| x.admitted_rate_limit)
            .expect("share")
    };
    let (s1, s2) = (share(&v, "1"), share(&v, "2"));
    assert!(
        (s1 / s2 - 3.0).abs() < 0.5,
        "shares {s1:.1} : {s2:.1}: {v:?}"
    );
    let limit = v.admitted_rate_limit.expect("limit");
    assert!(((s1 + s2) - limit).abs() < 1e-6, "shares sum to the limit");
    // What the gates admitted in the last second follows the shares.
    let ratio = f64::from(admitted[0]) / f64::from(admitted[1].max(1));
    assert!((2.0..=4.5).contains(&ratio), "admitted {admitted:?}: {v:?}");
    // Switch 2 goes idle: within 4 control intervals switch 1 holds ≥ 85% of the rate.
    for k in 0..20u32 {
        s.tick(Duration::from_millis(10));
        for _ in 0..((k * 12 + 12) / 10 - (k * 12) / 10) {
            syn_from(&mut s, 1);
        }
    }
    let v = s.c.gap_view(0).expect("view");
    let (s1, limit) = (share(&v, "1"), v.admitted_rate_limit.expect("limit"));
    assert!(s1 >= 0.85 * limit, "switch 1: {s1:.1} of {limit:.1}: {v:?}");
}

type GapViewT = super::GapView;

/// Saturate the controller's own law for `rounds` ticks of 100 ms, so that it gaps:
/// 100 % busy handling 200 PACKET_INs per 100 ms, with a queue.
fn saturate(sim: &mut Sim, rounds: usize) {
    for _ in 0..rounds {
        sim.c.record_packet_in_work(saturated());
        sim.tick(Duration::from_millis(100));
    }
}

/// 100 ms of PACKET_IN work with the controller busy all of it, and a queue.
fn saturated() -> super::WorkSample {
    super::WorkSample {
        packet_ins: 200,
        busy: Duration::from_millis(100),
        queueing: Duration::from_millis(20),
        backlog: 500,
        switch: 1,
        ..super::WorkSample::default()
    }
}

/// h1's ACK from `port`, acknowledging `ack`.
fn client_ack(port: u16, ack: u32) -> ofp::Bytes {
    client_segment(port, 1001, ack, ACK)
}

fn conn_rules(s: &Sim) -> usize {
    table(s)
        .flows()
        .filter(|e| cookie::kind_of(e.cookie) == Some(RuleKind::Conn))
        .count()
}

/// While the controller gaps itself, a SYN is decided and sent on without rules; the
/// client's ACK installs them; a client that never answers, or answers the SYN-ACK with
/// a RST, leaves nothing behind (see `controller::handshake`).
#[test]
fn while_gapping_rules_wait_for_the_clients_ack() {
    let mut sim = overload_sim("mode = \"off\"", "mode = \"adaptive\"");
    // Before any gapping: rules at once.
    let got = syn(&mut sim, 4000);
    assert!(
        got.iter().any(|(h, _)| h != "h1"),
        "the SYN reached a backend"
    );
    assert_eq!(conn_rules(&sim), 2, "rules with the SYN when not gapping");
    saturate(&mut sim, 30);
    assert!(sim.c.controller_gap_view().gap.gapping);

    // A client that completes: SYN (no rules), SYN-ACK back through the controller, ACK.
    let got = syn(&mut sim, 5000);
    let (backend, _) = got
        .iter()
        .find(|(h, f)| h != "h1" && !is_rst(f))
        .cloned()
        .expect("the SYN reached a backend without waiting for rules");
    assert_eq!(conn_rules(&sim), 2, "no rules for the SYN");
    let key = crate::conntrack::ConnKey {
        client: ip(1),
        client_port: 5000,
        service_addr: VIP,
        service_port: 80,
    };
    let c = *sim.c.connections().get(&key).expect("decided");
    assert!(!c.installed);
    let b: u8 = backend[1..].parse().expect("backend host");
    let back = sim.send(
        &backend,
        &tcp(mac(b), mac(1), (ip(b), 80), (ip(1), 5000), sim::SYN_ACK),
    );
    let (h, f) = back.first().expect("the SYN-ACK went back");
    assert_eq!((h.as_str(), f.ipv4_src), ("h1", Some(VIP)), "as the VIP");
    assert_eq!(conn_rules(&sim), 2, "no rules for the SYN-ACK");
    // An ACK that does not acknowledge the backend's SYN-ACK (seq 1000 in this harness)
    // is blind: dropped, no rules.
    let got = sim.send("h1", &client_ack(5000, 7777));
    assert!(got.is_empty(), "a blind ACK goes nowhere: {got:?}");
    assert_eq!(conn_rules(&sim), 2, "and installs nothing");
    let got = sim.send("h1", &client_ack(5000, 1001));
    assert!(
        got.iter().any(|(h, _)| *h == backend),
        "the ACK reached {backend}"
    );
    assert_eq!(conn_rules(&sim), 4, "the ACK installed both rules");
    assert!(sim.c.connections().get(&key).expect("kept").installed);
    // Its later packets follow the rules, not the controller.
    let before = sim.packet_ins;
    let got = sim.send("h1", &client_ack(5000, 1001));
    assert!(got.iter().any(|(h, _)| *h == backend));
    assert_eq!(sim.packet_ins, before, "carried by the switch");

    let gone = |sim: &Sim, port| {
        sim.c
            .connections()
            .get(&crate::conntrack::ConnKey {
                client_port: port,
                ..key
            })
            .is_none()
    };
    // A client that answers the SYN-ACK with a RST (a spoofed source): forgotten at once,
    // the RST passed on to the backend.
    saturate(&mut sim, 1);
    let got = syn(&mut sim, 5001);
    let (backend, _) = got.iter().find(|(h, _)| h != "h1").cloned().expect("sent");
    let rst = |seq| {
        flowgate_packet::ipv4_tcp(&flowgate_packet::TcpSegment {
            eth_src: mac(1),
            eth_dst: VMAC,
            ip_src: ip(1),
            ip_dst: VIP,
            src_port: 5001,
            dst_port: 80,
            seq,
            flags: flowgate_packet::TcpFlags(0x04),
            ..Default::default()
        })
    };
    let got = sim.send("h1", &rst(12345));
    assert!(
        got.is_empty(),
        "a RST out of the window is ignored: {got:?}"
    );
    assert!(!gone(&sim, 5001));
    let got = sim.send("h1", &rst(1001));
    assert!(
        got.iter().any(|(h, f)| *h == backend && is_rst(f)),
        "{got:?}"
    );
    assert!(gone(&sim, 5001), "reset: forgotten");

    // A client that never answers: forgotten after the timeout, no rules ever.
    saturate(&mut sim, 1); // (the gate's tokens refill)
    syn(&mut sim, 5002);
    assert!(!gone(&sim, 5002));
    let ms = super::super::controller::handshake::HANDSHAKE_TIMEOUT_MS;
    saturate(&mut sim, (ms / 100) as usize + 1);
    assert!(gone(&sim, 5002), "timed out: forgotten");
    assert_eq!(conn_rules(&sim), 4, "nothing left in the switch");
    let s = &sim.c.services()[0];
    assert_eq!(
        (
            s.handshakes.deferred,
            s.handshakes.completed,
            s.handshakes.abandoned
        ),
        (3, 1, 2)
    );
    let active: u32 = s.backends.iter().map(|b| b.active_connections).sum();
    assert_eq!(active, 2, "the two completed connections");
}

/// Beside a flood, a quiet service keeps rules at the SYN: while the controller gaps itself
/// and holds the flooded service below its demand, the quiet one (its max-min fair share is
/// all it asks) is not gapped, and its connections cost one PACKET_IN, not three. The
/// flooded service's SYNs still wait for their clients' ACKs.
#[test]
fn beside_a_flood_a_quiet_service_keeps_rules_at_the_syn() {
    let (mut sim, mut port) = flooded_beside_quiet();
    let web_deferred = sim.c.services()[0].handshakes.deferred;
    assert!(web_deferred > 0, "the flooded service defers its rules");

    // A quiet connection to "api": rules with its SYN.
    let rules_for = |sim: &Sim, cport: u16| {
        table(sim)
            .flows()
            .filter(|e| cookie::kind_of(e.cookie) == Some(RuleKind::Conn))
            .filter(|e| {
                let m = &e.match_;
                m.tcp_src() == Some(cport) || m.tcp_dst() == Some(cport)
            })
            .count()
    };
    let got = sim.send(
        "h1",
        &tcp(mac(1), QUIET_MAC, (ip(1), 7000), (QUIET, 80), sim::SYN),
    );
    assert!(
        got.iter().any(|(h, _)| h == "h3"),
        "the quiet service's SYN reached its backend: {got:?}"
    );
    assert_eq!(rules_for(&sim, 7000), 2, "its rules went out with the SYN");
    assert_eq!(
        sim.c.services()[1].handshakes.deferred,
        0,
        "nothing deferred for it"
    );

    // The flood's next SYN that passes the gate waits for its client's ACK.
    saturate(&mut sim, 1);
    let before = sim.c.services()[0].handshakes.deferred;
    for _ in 0..50 {
        port += 1;
        syn(&mut sim, port);
    }
    assert!(
        sim.c.services()[0].handshakes.deferred > before,
        "the flooded service still defers"
    );
}

/// Beside a flood, a quiet service's SYNs that reach the controller together (held up on
/// their way, as by a switch short of CPU) all pass the controller's gate: it holds each
/// service to the fair level, the share of the flooded one, not to what the quiet one
/// asked, with a control interval's worth of the level in its bucket. Gated at its own
/// share, the quiet service's bucket of two took two of them and the rest were dropped
/// without a word (seen on OVS: their clients waited out a SYN retransmission). So do its
/// SYNs when it asks for more than before, but far less than the flood gets.
#[test]
fn beside_a_flood_a_quiet_services_syns_that_come_together_all_pass() {
    let (mut sim, _) = flooded_beside_quiet();
    let web = sim.c.gap_view(0).expect("web");
    assert!(
        web.controller_refused_total.unwrap_or(0) > 0,
        "the flood meets the controller's gate: {web:?}"
    );

    // Six of api's SYNs at one instant.
    let mut passed = 0;
    for cport in 7000..7006u16 {
        let got = sim.send(
            "h1",
            &tcp(mac(1), QUIET_MAC, (ip(1), cport), (QUIET, 80), sim::SYN),
        );
        passed += usize::from(got.iter().any(|(h, f)| h != "h1" && !is_rst(f)));
    }
    let api = sim.c.gap_view(1).expect("api");
    assert_eq!(api.controller_refused_total, Some(0), "{api:?}");
    assert_eq!(passed, 6, "each SYN went on to a backend");

    // The flood goes on, and api asks for a new connection every 20 ms: more than it had
    // asked for, far less than the flood gets.
    let (mut port, mut cport, mut passed) = (20_000u16, 8000u16, 0);
    for _ in 0..10 {
        for _ in 0..250 {
            port += 1;
            syn(&mut sim, port);
        }
        sim.c.record_packet_in_work(saturated());
        for _ in 0..5 {
            cport += 1;
            let got = sim.send(
                "h1",
                &tcp(mac(1), QUIET_MAC, (ip(1), cport), (QUIET, 80), sim::SYN),
            );
            passed += usize::from(got.iter().any(|(h, f)| h != "h1" && !is_rst(f)));
            sim.tick(Duration::from_millis(20));
        }
    }
    let view = sim.c.controller_gap_view();
    assert!(
        view.gap.gapping,
        "the controller still gaps itself: {view:?}"
    );
    let api = sim.c.gap_view(1).expect("api");
    assert_eq!(api.controller_refused_total, Some(0), "{api:?}");
    assert_eq!(passed, 50, "each SYN went on to a backend");
}

/// The quiet service of [`flooded_beside_quiet`]: its VIP and virtual MAC.
const QUIET: std::net::Ipv4Addr = std::net::Ipv4Addr::new(10, 0, 0, 101);
const QUIET_MAC: flowgate_packet::MacAddr = flowgate_packet::MacAddr([0x02, 0x66, 0x67, 0, 0, 2]);

/// "web" (the sim's VIP, backend h2) flooded with ~2,500 SYNs a second until the
/// controller, saturated, gaps itself, beside "api" ([`QUIET`], backend h3), which was
/// quiet meanwhile; neither has a gap of its own. Returns the sim and the flood's last
/// client port.
fn flooded_beside_quiet() -> (Sim, u16) {
    let mut text = format!(
        "[controller.overload]\nmode = \"adaptive\"\n\
         [[service]]\nname = \"web\"\nvip = \"{VIP}\"\nport = 80\n\
         [service.health]\nkind = \"none\"\n\
         [[service.backend]]\naddress = \"{}\"\n\
         [[service]]\nname = \"api\"\nvip = \"{QUIET}\"\nport = 80\n\
         virtual_mac = \"{QUIET_MAC}\"\n\
         [service.health]\nkind = \"none\"\n",
        ip(2)
    );
    text += &format!("[[service.backend]]\naddress = \"{}\"\n", ip(3));
    let hosts = [("h1", 1, 1), ("h2", 1, 2), ("h3", 1, 3)];
    let mut sim = Sim::new(&text, &[(1, 3)], &[], &hosts);
    for i in 1..=3u8 {
        sim.send(&format!("h{i}"), &arp_request(i, ip(9)));
    }
    let mut port = 10_000u16;
    for _ in 0..30 {
        for _ in 0..250 {
            port += 1;
            syn(&mut sim, port);
        }
        saturate(&mut sim, 1);
    }
    let view = sim.c.controller_gap_view();
    assert!(view.gap.gapping, "the controller gaps itself: {view:?}");
    (sim, port)
}

/// Two services on one switch, "web" (the sim's VIP) with `web` as its overload section
/// and "api" (10.0.0.101, wide open), in the given order.
fn two_services(web_first: bool, web: &str) -> String {
    let backends = format!(
        "[[service.backend]]\naddress = \"{}\"\n[[service.backend]]\naddress = \"{}\"\n",
        ip(2),
        ip(3)
    );
    let web = format!(
        "[[service]]\nname = \"web\"\nvip = \"{VIP}\"\nport = 80\n\
         [service.health]\nkind = \"none\"\n[service.overload]\n{web}\n{backends}"
    );
    let api = format!(
        "[[service]]\nname = \"api\"\nvip = \"{}\"\nport = 80\n\
         [service.health]\nkind = \"none\"\n[service.overload]\n\
         mode = \"adaptive\"\ncapacity_rps = 100000\n{backends}",
        API
    );
    if web_first { web + &api } else { api + &web }
}

const API: std::net::Ipv4Addr = std::net::Ipv4Addr::new(10, 0, 0, 101);

fn two_service_sim(web: &str) -> Sim {
    let hosts = [("h1", 1, 1), ("h2", 1, 2), ("h3", 1, 3)];
    let mut s = Sim::new(&two_services(true, web), &[(1, 3)], &[], &hosts);
    for i in 1..=3u8 {
        s.send(&format!("h{i}"), &arp_request(i, ip(9)));
    }
    s
}

fn reload(sim: &mut Sim, text: &str) {
    let cfg = crate::config::Config::from_toml(text, &|_| None).expect("valid config");
    let now = sim.now;
    sim.c.reload(now, &cfg, &mut sim.out);
    sim.pump();
}

/// The meter the intercept rule of `vip` names on the switch, and that meter's rate.
fn intercept_meter_of(t: &FakeTable, vip: std::net::Ipv4Addr) -> Option<(u32, Option<u32>)> {
    let e = t.flows().find(|e| {
        cookie::kind_of(e.cookie) == Some(RuleKind::Intercept)
            && e.match_
                .iter()
                .any(|o| matches!(o, ofp::Oxm::Ipv4Dst { value, .. } if *value == vip))
    })?;
    let id = e.meter()?;
    Some((id, meter_rate(t, id)))
}

/// A reload that only reorders the services leaves each on its own meter: the meter is
/// named by the service's slot, not its place in the file. Named by place, the gapped
/// service's intercept rule named the open service's meter after the reload (and the
/// open one the gapped one's) until the next meter change was due; a service that goes
/// takes its meter off the switch.
#[test]
fn a_reordering_reload_keeps_each_service_on_its_own_meter() {
    let web = "mode = \"adaptive\"\ncapacity_rps = 100\nmeter_hold_ms = 60000";
    let mut sim = two_service_sim(web);
    let mut port = 10_000u16;
    // 300 SYN/s at web for 4 s: it gaps, its meter tightens.
    for k in 0..1200u32 {
        if k % 3 == 0 {
            sim.tick(Duration::from_millis(10));
        }
        port += 1;
        syn(&mut sim, port);
    }
    assert!(sim.c.gap_view(0).expect("web").gapping);
    let (web_meter, web_rate) = intercept_meter_of(table(&sim), VIP).expect("web's meter");
    let (api_meter, api_rate) = intercept_meter_of(table(&sim), API).expect("api's meter");
    assert!(
        web_rate < api_rate,
        "web's meter {web_rate:?} is under api's {api_rate:?}"
    );

    reload(&mut sim, &two_services(false, web));
    let t = table(&sim);
    assert_eq!(
        intercept_meter_of(t, VIP),
        Some((web_meter, web_rate)),
        "web keeps its meter and its band"
    );
    assert_eq!(intercept_meter_of(t, API), Some((api_meter, api_rate)));
    // Its gap goes on, under the new order.
    assert!(sim.c.gap_view(1).expect("web").gapping);
    let refused = sim.c.gap_view(1).expect("web").refused_total;
    for k in 0..300u32 {
        if k % 3 == 0 {
            sim.tick(Duration::from_millis(10));
        }
        port += 1;
        syn(&mut sim, port);
    }
    assert!(sim.c.gap_view(1).expect("web").refused_total > refused);
    assert_eq!(
        intercept_meter_of(table(&sim), VIP).map(|m| m.0),
        Some(web_meter)
    );

    // api goes: its meter leaves the switch; web keeps its own.
    let web_only = two_services(false, web);
    let web_only = &web_only[web_only.find("[[service]]\nname = \"web\"").expect("web")..];
    reload(&mut sim, web_only);
    let t = table(&sim);
    assert!(!t.meters().contains_key(&api_meter), "{:?}", t.meters());
    assert_eq!(intercept_meter_of(t, VIP).map(|m| m.0), Some(web_meter));
}

/// A service's OFF-period rules are withdrawn when its gap relaxes after a reload that
/// moved it in the file: they carry its slot, which the withdrawal names. By place, the
/// withdrawal named the other service's cookie and the rules stayed to their hard timeout.
#[test]
fn off_period_rules_are_withdrawn_after_a_reordering_reload() {
    let web =
        "mode = \"adaptive\"\ncapacity_rps = 0.5\nmin_rate = 0.25\noff_rule_min_gap_ms = 2000";
    let mut sim = two_service_sim(web);
    let gap_rules = |t: &FakeTable| {
        t.flows()
            .filter(|e| cookie::kind_of(e.cookie) == Some(RuleKind::Gap))
            .count()
    };
    let mut port = 20_000u16;
    for _ in 0..400 {
        sim.tick(Duration::from_millis(50));
        port += 1;
        syn(&mut sim, port);
        if gap_rules(table(&sim)) > 0 {
            break;
        }
    }
    assert!(
        gap_rules(table(&sim)) > 0,
        "an OFF-period rule was installed"
    );
    reload(&mut sim, &two_services(false, web));
    for _ in 0..400 {
        sim.tick(Duration::from_millis(50));
        if gap_rules(table(&sim)) == 0 {
            break;
        }
    }
    assert_eq!(gap_rules(table(&sim)), 0, "OFF rule withdrawn");
    for _ in 0..100 {
        sim.tick(Duration::from_millis(50));
    }
    assert!(!sim.c.gap_view(1).expect("web").gapping, "gap lifted");
    assert_eq!(gap_rules(table(&sim)), 0);
}

/// A switch that holds meters from an earlier run of the controller, which started
/// without gapping (so it cleared none when the switch connected), gets its meters when
/// a reload turns gapping on: each is deleted before it is added. An OFPMC_ADD alone was
/// refused (OFPMMFC_METER_EXISTS), the old band staying in force; the controller fuzz
/// target found it once its programs could reload.
#[test]
fn a_reload_that_turns_gapping_on_replaces_meters_an_earlier_run_left() {
    let on = "mode = \"adaptive\"\ncapacity_rps = 100";
    let mut sim = overload_sim(on, "mode = \"adaptive\"");
    assert!(table(&sim).meters().contains_key(&SERVICE_METER_BASE));
    let off = |s: &str| {
        s.replace(on, "mode = \"off\"")
            .replace("\"adaptive\"", "\"off\"")
    };
    let text = |overload: &str| {
        format!(
            "[controller.overload]\nmode = \"adaptive\"\n\
             [[service]]\nname = \"web\"\nvip = \"{VIP}\"\nport = 80\n\
             [service.health]\nkind = \"none\"\n[service.overload]\n{overload}\n\
             [[service.backend]]\naddress = \"{}\"\n[[service.backend]]\naddress = \"{}\"\n",
            ip(2),
            ip(3)
        )
    };
    // The controller restarts without gapping: the switch keeps its meters.
    sim.restart(&off(&text(on)));
    assert!(table(&sim).meters().contains_key(&SERVICE_METER_BASE));
    assert_eq!(intercept_meter(table(&sim)), None);
    // Gapping comes back by a reload: the pump panics on any OpenFlow error.
    reload(&mut sim, &text(on));
    assert_eq!(intercept_meter(table(&sim)), Some(SERVICE_METER_BASE));
    let band = sim
        .c
        .installed_meter(1, SERVICE_METER_BASE)
        .expect("installed");
    assert_eq!(meter_rate(table(&sim), SERVICE_METER_BASE), Some(band.rate));
}
