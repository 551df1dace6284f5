//! The gaps through the controller and a fake network (the harness pattern of
//! `controller/tests.rs`): meters on the intercept and table-miss rules, refusals
//! answered with RSTs, OFF-period rules installed and withdrawn, established connections
//! untouched.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use flowgate_packet::{self as packet, Arp, MacAddr, TcpFlags, TcpSegment};
use ofp::{Message, MultipartReply, MultipartReplyBody, PacketIn, PacketInReason, PortDesc, SwitchFeatures};

use super::{Mode, SERVICE_METER_BASE, TABLE_MISS_METER};
use crate::cookie::{self, RuleKind};
use crate::testkit::{FakeNetwork, FakeTable, PacketFields};
use crate::{Config, Controller, Outbox};

const VIP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 100);
const VMAC: MacAddr = MacAddr([0x02, 0x66, 0x67, 0, 0, 1]);

fn mac(i: u8) -> MacAddr {
    MacAddr([0, 0, 0, 0, 0, i])
}
fn ip(i: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 0, 0, i)
}

struct Sim {
    c: Controller,
    net: FakeNetwork,
    now: Instant,
    out: Outbox,
    received: Vec<(String, PacketFields)>,
}

impl Sim {
    /// One switch, h1 the client on port 1, backends h2, h3 on ports 2, 3.
    fn new(overload: &str, controller_overload: &str) -> Sim {
        let mut text = format!(
            "[controller.overload]\n{controller_overload}\n\
             [[service]]\nname = \"web\"\nvip = \"{VIP}\"\nport = 80\n\
             [service.health]\nkind = \"none\"\n[service.overload]\n{overload}\n"
        );
        for b in [2, 3] {
            text += &format!("[[service.backend]]\naddress = \"{}\"\n", ip(b));
        }
        let cfg = Config::from_toml(&text, &|_| None).expect("valid config");
        let mut net = FakeNetwork::new();
        net.add_switch(1, FakeTable::new());
        for h in 1..=3u8 {
            net.add_host(&format!("h{h}"), (1, u32::from(h)));
        }
        let mut sim = Sim {
            c: Controller::new(&cfg),
            net,
            now: Instant::now(),
            out: Outbox::new(),
            received: Vec::new(),
        };
        let features = SwitchFeatures {
            datapath_id: 1,
            n_buffers: 0,
            n_tables: 254,
            auxiliary_id: 0,
            capabilities: 0,
        };
        sim.c.handle_switch_up(sim.now, features, &mut sim.out);
        sim.pump();
        sim.tick(Duration::from_millis(10));
        for i in 1..=3u8 {
            let arp = packet::arp_request(mac(i), ip(i), ip(9));
            sim.send(&format!("h{i}"), &arp);
        }
        sim
    }

    fn tick(&mut self, by: Duration) {
        self.now += by;
        self.c.handle_tick(self.now, &mut self.out);
        self.pump();
    }

    fn pump(&mut self) {
        for _ in 0..10_000 {
            let msgs: Vec<(u64, Message)> = self.out.drain().collect();
            if msgs.is_empty() {
                return;
            }
            for (dpid, msg) in msgs {
                self.carry_out(dpid, msg);
            }
        }
        panic!("never settled");
    }

    fn carry_out(&mut self, dpid: u64, msg: Message) {
        match &msg {
            Message::FlowMod(_) | Message::GroupMod(_) | Message::MeterMod(_) => {
                if let Err(e) = self.net.apply(dpid, &msg) {
                    panic!("the switch would answer with an OpenFlow ERROR: {e} for {msg:?}");
                }
            }
            Message::PacketOut(po) => {
                let trace = self
                    .net
                    .switch(dpid)
                    .expect("switch")
                    .packet_out(po)
                    .unwrap_or_else(|e| panic!("PACKET_OUT refused: {e}"));
                for (port, fields) in trace.outputs {
                    if let Some(h) = self.net.host_at((dpid, port)) {
                        self.received.push((h.to_string(), fields));
                    }
                }
            }
            Message::MultipartRequest(r) => {
                let body = match &r.body {
                    ofp::MultipartRequestBody::PortDesc => MultipartReplyBody::PortDesc(
                        (1..=3).map(port_desc).collect(),
                    ),
                    ofp::MultipartRequestBody::Flow(_) => MultipartReplyBody::Flow(Vec::new()),
                    _ => return,
                };
                let reply = Message::MultipartReply(MultipartReply { flags: 0, body });
                self.c.handle_message(self.now, dpid, &reply, &mut self.out);
            }
            _ => {}
        }
    }

    fn send(&mut self, from: &str, frame: &[u8]) -> Vec<(String, PacketFields)> {
        self.received.clear();
        let d = self.net.deliver_frame(from, frame).expect("no loop");
        self.received.extend(d.hosts);
        for (dpid, f) in d.to_controller {
            let data = frame_of(&f);
            let pi = PacketIn {
                buffer_id: ofp::NO_BUFFER,
                total_len: data.len() as u16,
                reason: PacketInReason::NoMatch,
                table_id: 0,
                cookie: 0,
                match_: ofp::Match::new().with(ofp::Oxm::InPort(f.in_port)),
                data,
            };
            self.c
                .handle_message(self.now, dpid, &Message::PacketIn(pi), &mut self.out);
            self.pump();
        }
        std::mem::take(&mut self.received)
    }

    /// h1 opens a connection from `port`: returns what h1 and the backends received.
    fn syn(&mut self, port: u16) -> Vec<(String, PacketFields)> {
        let f = tcp(mac(1), VMAC, (ip(1), port), (VIP, 80), 0x02);
        self.send("h1", &f)
    }

    fn table(&self) -> &FakeTable {
        self.net.switch(1).expect("switch")
    }
}

fn port_desc(p: u32) -> PortDesc {
    PortDesc {
        port_no: p,
        hw_addr: [0x0a, 0, 0, 0, 1, p as u8],
        name: ofp::PortName::new(&format!("s1-eth{p}")),
        config: 0,
        state: 0,
        curr: 0,
        advertised: 0,
        supported: 0,
        peer: 0,
        curr_speed: 0,
        max_speed: 0,
    }
}

fn frame_of(f: &PacketFields) -> ofp::Bytes {
    if let (Some(op), Some(spa), Some(tpa)) = (f.arp_op, f.arp_spa, f.arp_tpa) {
        let arp = Arp {
            op,
            sha: f.arp_sha.unwrap_or(f.eth_src),
            spa,
            tha: f.arp_tha.unwrap_or(MacAddr::ZERO),
            tpa,
        };
        return packet::arp_frame(f.eth_src, f.eth_dst, f.vlan, &arp);
    }
    packet::ipv4_tcp(&TcpSegment {
        eth_src: f.eth_src,
        eth_dst: f.eth_dst,
        ip_src: f.ipv4_src.unwrap_or(Ipv4Addr::UNSPECIFIED),
        ip_dst: f.ipv4_dst.unwrap_or(Ipv4Addr::UNSPECIFIED),
        src_port: f.tcp_src.unwrap_or(0),
        dst_port: f.tcp_dst.unwrap_or(0),
        flags: TcpFlags(f.tcp_flags.unwrap_or(0) as u8),
        ..TcpSegment::default()
    })
}

fn tcp(from: MacAddr, to: MacAddr, src: (Ipv4Addr, u16), dst: (Ipv4Addr, u16), flags: u8) -> ofp::Bytes {
    packet::ipv4_tcp(&TcpSegment {
        eth_src: from,
        eth_dst: to,
        ip_src: src.0,
        ip_dst: dst.0,
        src_port: src.1,
        dst_port: dst.1,
        seq: 1000,
        flags: TcpFlags(flags),
        ..TcpSegment::default()
    })
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
    let sim = Sim::new("mode = \"off\"", "mode = \"off\"");
    assert!(sim.table().meters().is_empty());
    assert_eq!(intercept_meter(sim.table()), None);
}

#[test]
fn the_intercept_and_table_miss_rules_carry_their_meters() {
    let sim = Sim::new(
        "mode = \"adaptive\"\ncapacity_rps = 50",
        "mode = \"adaptive\"",
    );
    let t = sim.table();
    let id = SERVICE_METER_BASE;
    assert_eq!(intercept_meter(t), Some(id), "meter on the intercept rule");
    let miss = t
        .flows()
        .find(|e| cookie::kind_of(e.cookie) == Some(RuleKind::TableMiss))
        .expect("table-miss");
    assert_eq!(miss.meter(), Some(TABLE_MISS_METER));
    let m = &t.meters()[&id];
    assert_eq!(m.flags.0 & 0x6, 0x6, "PKTPS|BURST: {m:?}");
    assert!(matches!(m.bands.as_slice(), [ofp::MeterBand::Drop { .. }]), "one DROP band");
    // §5.9: the meter instruction comes before apply-actions.
    let e = t
        .flows()
        .find(|e| cookie::kind_of(e.cookie) == Some(RuleKind::Intercept))
        .expect("intercept");
    assert!(matches!(e.instructions.first(), Some(ofp::Instruction::Meter(_))));
}

/// 3× overload: the controller refuses beyond the admitted rate with RSTs, the meter
/// follows the gap (backstop above the admitted rate), the API view shows it, and the
/// admitted connections are carried by their own rules whatever the gap.
#[test]
fn overload_is_refused_with_rsts_and_the_meter_follows_the_gap() {
    let mut sim = Sim::new("mode = \"adaptive\"\ncapacity_rps = 100", "mode = \"off\"");
    let open = meter_rate(sim.table(), SERVICE_METER_BASE).expect("meter");
    let (mut rsts, mut forwarded, mut port) = (0, 0, 10_000u16);
    let mut first_admitted = None;
    // 300 SYN/s for 4 s (one every 10/3 ms).
    for k in 0..1200u32 {
        if k % 3 == 0 {
            sim.tick(Duration::from_millis(10));
        }
        port += 1;
        let got = sim.syn(port);
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
    assert!((60.0..=150.0).contains(&limit), "admitted rate limit {limit}: {v:?}");
    assert!((70.0..=100.0).contains(&v.admitted_rate), "admitted rate: {v:?}");
    assert_eq!(v.refused_total, rsts, "every refusal was a RST: {v:?}");
    assert!(rsts > 500 && forwarded > 250, "rsts {rsts} forwarded {forwarded}");
    let rate = meter_rate(sim.table(), SERVICE_METER_BASE).expect("meter");
    assert!(rate <= open, "the meter did not loosen under overload: {rate} > {open}");
    assert!(
        f64::from(rate) >= 3.0 * limit && f64::from(rate) <= 5.0 * limit,
        "backstop ≈ 4× the admitted rate: meter {rate}, limit {limit}"
    );
    // An admitted connection's next packets are carried by its rules (priority 300), not
    // by the gapped intercept.
    let p = first_admitted.expect("one admitted");
    let ack = tcp(mac(1), VMAC, (ip(1), p), (VIP, 80), 0x10);
    let d = sim.net.deliver_frame("h1", &ack).expect("deliver");
    assert!(d.to_controller.is_empty(), "no PACKET_IN for an admitted connection");
    assert_eq!(d.hosts.len(), 1, "delivered to its backend: {:?}", d.hosts);
}

/// A gap of seconds becomes OFF-period drop rules (priority 250, hard timeout), which
/// are withdrawn once the gap relaxes; established connections stay above them.
#[test]
fn off_period_rules_are_installed_and_withdrawn() {
    let mut sim = Sim::new(
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
        sim.syn(port);
        if let Some(r) = gap_rules(sim.table()).first() {
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
        if gap_rules(sim.table()).is_empty() {
            break;
        }
    }
    assert!(gap_rules(sim.table()).is_empty(), "OFF rule withdrawn");
    for _ in 0..100 {
        sim.tick(Duration::from_millis(50));
    }
    assert!(!sim.c.gap_view(0).expect("view").gapping, "gap lifted");
}

/// The controller's own gap: its measured load (from the runtime) tightens the table-miss
/// and intercept meters to its admitted PACKET_IN rate.
#[test]
fn controller_load_tightens_the_controller_meters() {
    let mut sim = Sim::new("mode = \"off\"", "mode = \"adaptive\"");
    let open = meter_rate(sim.table(), TABLE_MISS_METER).expect("meter");
    for _ in 0..30 {
        // Saturated: 100% busy handling 2000 PACKET_INs per 100 ms.
        sim.c.record_packet_in_work(super::WorkSample {
            packet_ins: 200,
            busy: Duration::from_millis(100),
            queueing: Duration::from_millis(20),
            backlog: 500,
        });
        sim.tick(Duration::from_millis(100));
    }
    let v = sim.c.controller_gap_view();
    assert!(v.gap.gapping, "{v:?}");
    let miss = meter_rate(sim.table(), TABLE_MISS_METER).expect("meter");
    let icpt = meter_rate(sim.table(), SERVICE_METER_BASE).expect("meter");
    assert!(miss < open && miss <= 2_200, "table-miss meter {miss}");
    assert_eq!(icpt, miss, "the intercept meter is capped by the controller's share");
    assert!(v.max_handled_rate >= 1_900.0, "{v:?}");
}
