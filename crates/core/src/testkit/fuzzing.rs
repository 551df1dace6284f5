//! The bodies of the `controller` and `config` fuzz targets (`fuzz/fuzz_targets/`,
//! nightly), shared with their stable drivers (`crates/core/tests/fuzz_controller.rs`,
//! `fuzz_config.rs`). The first is a hostile or broken switch against the controller
//! core; the second, any text as a configuration ([`config_target`]).
//!
//! The codec's own targets (`ofp::fuzzing`) stop at "decodes or is refused". What a
//! switch sends that *does* decode then reaches the core, which must not panic on any of
//! it either, whatever order it comes in: a FLOW_REMOVED for a rule it never installed, a
//! flow-stats reply with another controller's rules, a SYN from a port that does not
//! exist, a frame cut short inside its TCP header, a switch that leaves mid-connection.
//! The input is a program: each step a switch message (raw bytes, or a near-valid one
//! built from what the controller has installed and then mutated), a timer tick, a switch
//! leaving or joining, or a backend figure (probe, metrics text, the runtime's work sample).
//!
//! Every message the core emits must encode, and every rule, group and meter it sends must
//! be one the switch (a [`FakeTable`], which refuses what Open vSwitch refuses) accepts:
//! a controller that a switch's messages can drive into sending invalid rules is as broken
//! as one that panics.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use flowgate_packet::{self as packet, MacAddr, TcpFlags, TcpSegment};
use ofp::{
    FlowRemoved, FlowRemovedReason, Message, MeterBandStats, MeterStats, MultipartReply,
    MultipartReplyBody, MultipartRequestBody, PacketIn, PortReason, PortStatus, SwitchFeatures,
};

use super::FakeTable;
use super::sim::{flow_stats_of, port_desc};
use crate::controller::{ProbeResult, RuleEnded};
use crate::metrics_text::{self, MetricNames};
use crate::overload::WorkSample;
use crate::{Config, Controller, Outbox};

/// The configurations the target picks from (its first byte): between them, every
/// balancing mode, the overload gates, ISSLM, and tight host limits. (Also seeds for the
/// `config` target's mutations.)
pub const CONFIGS: [&str; 3] = [
    // Reactive: a VIP service under ISSLM with its own gate, a VIP-less (addressed
    // backends) service under least connections, the controller's own gate, and host
    // limits small enough for a few forged MACs to reach them.
    r#"
[controller]
max_hosts = 12
max_hosts_per_port = 4
host_timeout_secs = 5
reconnect_grace_ms = 500
[controller.overload]
mode = "adaptive"
[[service]]
name = "web"
vip = "10.0.0.100"
port = 80
algorithm = "isslm"
threshold_rps = 5
[service.health]
kind = "none"
[service.overload]
mode = "adaptive"
capacity_rps = 20
[[service.backend]]
address = "10.0.0.2"
[[service.backend]]
address = "10.0.0.3"
weight = 3
[[service.backend]]
address = "10.0.0.4"
[[service]]
name = "direct"
port = 8080
algorithm = "least-connections"
[service.health]
kind = "none"
[[service.backend]]
address = "10.0.0.5"
[[service.backend]]
address = "10.0.0.6"
"#,
    // Partitioned and proactive services side by side.
    r#"
[controller]
reconnect_grace_ms = 500
[[service]]
name = "web"
vip = "10.0.0.100"
port = 80
algorithm = "round-robin"
mode = "partitioned"
partition_bits = 3
transition_secs = 2
[service.health]
kind = "none"
[[service.backend]]
address = "10.0.0.2"
[[service.backend]]
address = "10.0.0.3"
[[service]]
name = "pro"
vip = "10.0.0.101"
port = 80
algorithm = "least-connections"
mode = "proactive"
[service.health]
kind = "none"
[[service.backend]]
address = "10.0.0.4"
[[service.backend]]
address = "10.0.0.5"
"#,
    // Reactive with the unknown-flow policy "drop", the response-time balancer, and the
    // seed's "none" behind a VIP.
    r#"
[controller]
unknown_flow = "drop"
[[service]]
name = "web"
vip = "10.0.0.100"
port = 80
algorithm = "srt"
[service.health]
kind = "none"
[[service.backend]]
address = "10.0.0.2"
[[service.backend]]
address = "10.0.0.3"
[[service]]
name = "one"
vip = "10.0.0.101"
port = 80
algorithm = "none"
none_target = "10.0.0.4"
[service.health]
kind = "none"
[[service.backend]]
address = "10.0.0.4"
"#,
];

/// Switches 1..=SWITCHES, each with ports 1..=PORTS.
const SWITCHES: u64 = 3;
const PORTS: u32 = 6;
/// Steps one input may run: bounds the time an input takes, not what it can reach.
const MAX_STEPS: usize = 256;

/// Runs `data` as a program against a fresh controller. Panics on a defect.
pub fn controller_target(data: &[u8]) {
    // Parsed once: the TOML parser is not what is under test, and it would be a third of
    // each run's time.
    static PARSED: OnceLock<Vec<Config>> = OnceLock::new();
    let configs = PARSED.get_or_init(|| {
        CONFIGS
            .iter()
            .map(|text| match Config::from_toml(text, &|_| None) {
                Ok(c) => c,
                Err(e) => panic!("the target's own config is invalid: {e}"),
            })
            .collect()
    });
    let mut input = Input(data);
    let config = &configs[usize::from(input.u8()) % configs.len()];
    let mut world = World::new(config);
    for _ in 0..MAX_STEPS {
        if input.is_empty() {
            break;
        }
        world.step(&mut input);
    }
}

/// The body of the `config` fuzz target: any text as a configuration. A configuration is
/// an operator's file, a reload, or (in the distributed mode) a value read from etcd; none
/// may panic the parser. What it refuses it must explain: at least one error, each with a
/// message. What it accepts must build a controller that takes its switches and a tick.
pub fn config_target(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    match Config::from_toml(&text, &|_| None) {
        Ok(config) => {
            let mut world = World::new(&config);
            world.tick(Duration::from_millis(20));
        }
        Err(errors) => {
            assert!(
                !errors.0.is_empty(),
                "a configuration refused with no reason"
            );
            for e in &errors.0 {
                assert!(
                    !e.message.is_empty(),
                    "an error with no message at {:?}",
                    e.path
                );
            }
        }
    }
}

/// The fuzzer's bytes, read front to back; reads past the end give zeros.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }
    fn u16(&mut self) -> u16 {
        u16::from_be_bytes([self.u8(), self.u8()])
    }
    fn u32(&mut self) -> u32 {
        u32::from_be_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    fn bytes(&mut self, n: usize) -> &[u8] {
        let (head, rest) = self.0.split_at(n.min(self.0.len()));
        self.0 = rest;
        head
    }
    /// One of `n` choices.
    fn pick(&mut self, n: usize) -> usize {
        usize::from(self.u8()) % n.max(1)
    }
}

/// The controller, its switches' tables, and the clock.
struct World {
    c: Controller,
    tables: BTreeMap<u64, FakeTable>,
    up: BTreeMap<u64, bool>,
    now: Instant,
    out: Outbox,
    /// The last metrics scrape per backend, as the runtime's scraper keeps it.
    scrapes: BTreeMap<(usize, usize), (Instant, metrics_text::Totals)>,
}

impl World {
    fn new(config: &Config) -> World {
        let mut w = World {
            c: Controller::new(config),
            tables: (1..=SWITCHES)
                .map(|d| (d, FakeTable::new().with_ports(1..=PORTS)))
                .collect(),
            up: BTreeMap::new(),
            now: Instant::now(),
            out: Outbox::new(),
            scrapes: BTreeMap::new(),
        };
        for d in 1..=SWITCHES {
            w.switch_up(d);
        }
        w
    }

    fn step(&mut self, input: &mut Input<'_>) {
        let dpid = 1 + input.pick(SWITCHES as usize) as u64;
        match input.u8() % 12 {
            // Any bytes the framer would pass: a header with our version and the real
            // length (§7.1), the rest as the input has it.
            0 => {
                let n = usize::from(input.u16() % 600);
                let body = input.bytes(n).to_vec();
                self.switch_sends(dpid, frame_bytes(body));
            }
            1..=3 => {
                let frame = host_frame(input);
                let in_port = match input.u8() {
                    0..=239 => 1 + u32::from(input.u8()) % PORTS,
                    b => [
                        0,
                        PORTS + 1,
                        ofp::port::LOCAL,
                        ofp::port::CONTROLLER,
                        ofp::port::ANY,
                    ][usize::from(b) % 5],
                };
                let mut bytes = encode(&Message::PacketIn(PacketIn::table_miss(in_port, frame)));
                // The frame (from byte 42, after the match's in_port), not the PACKET_IN's
                // own fields: the raw messages above cover those.
                mutate(input, &mut bytes, 42);
                self.switch_sends(dpid, bytes);
            }
            4 => {
                // The end of a rule the controller installed (or of a made-up one).
                let removed = self.removed_rule(input, dpid);
                let mut bytes = encode(&Message::FlowRemoved(removed));
                mutate(input, &mut bytes, 8);
                self.switch_sends(dpid, bytes);
            }
            5 => {
                // Flow stats of what the switch holds, as after a controller restart.
                let stats = self.tables[&dpid].flows().map(flow_stats_of).collect();
                let flags = u16::from(input.u8() & 1);
                let reply = Message::MultipartReply(MultipartReply {
                    flags,
                    body: MultipartReplyBody::Flow(stats),
                });
                let mut bytes = encode(&reply);
                mutate(input, &mut bytes, 16);
                self.switch_sends(dpid, bytes);
            }
            6 => {
                let reason = match input.u8() % 3 {
                    0 => PortReason::Add,
                    1 => PortReason::Delete,
                    _ => PortReason::Modify,
                };
                // Ports the switch has, ones it does not, port 0 and the local port.
                let port = match input.u8() % 10 {
                    0 => 0,
                    9 => ofp::port::LOCAL,
                    k => u32::from(k),
                };
                let mut desc = port_desc(dpid, port);
                desc.state = u32::from(input.u8() & 1);
                desc.config = u32::from(input.u8() & 1);
                let msg = Message::PortStatus(PortStatus { reason, desc });
                self.switch_sends(dpid, encode(&msg));
            }
            7 => {
                let meters: Vec<u32> = self.tables[&dpid].meters().keys().copied().collect();
                let stats = meters
                    .iter()
                    .map(|&meter_id| MeterStats {
                        meter_id,
                        flow_count: 1,
                        packet_in_count: u64::from(input.u32()),
                        byte_in_count: 0,
                        duration_sec: u32::from(input.u8()),
                        duration_nsec: 0,
                        band_stats: vec![MeterBandStats {
                            packet_band_count: u64::from(input.u16()),
                            byte_band_count: 0,
                        }],
                    })
                    .collect();
                let reply = Message::MultipartReply(MultipartReply {
                    flags: 0,
                    body: MultipartReplyBody::Meter(stats),
                });
                self.switch_sends(dpid, encode(&reply));
            }
            8 => {
                // Time passes: up to 65 s, or up to 18 h in one step.
                let ms = u64::from(input.u16());
                let by = if input.u8() == 0xff { ms * 1000 } else { ms };
                self.tick(Duration::from_millis(by));
            }
            9 => {
                if self.up.get(&dpid).copied().unwrap_or(false) {
                    self.c.handle_switch_down(self.now, dpid, &mut self.out);
                    self.up.insert(dpid, false);
                    self.settle();
                } else {
                    self.switch_up(dpid);
                }
            }
            10 => self.backend_figure(input),
            _ => self.work_sample(input, dpid),
        }
    }

    fn switch_up(&mut self, dpid: u64) {
        let features = SwitchFeatures {
            datapath_id: dpid,
            n_buffers: 0,
            n_tables: 254,
            auxiliary_id: 0,
            capabilities: 0,
        };
        self.c.handle_switch_up(self.now, features, &mut self.out);
        self.up.insert(dpid, true);
        self.settle();
    }

    fn tick(&mut self, by: Duration) {
        self.now += by;
        self.c.handle_tick(self.now, &mut self.out);
        self.settle();
    }

    /// What a session does with one message from a switch whose handshake is done
    /// (`flowgate::runtime::session`): PACKET_IN and FLOW_REMOVED read in place, anything
    /// else decoded. A message that does not read ends the session there; the core
    /// never sees it.
    fn switch_sends(&mut self, dpid: u64, bytes: Bytes) {
        if !self.up.get(&dpid).copied().unwrap_or(false) {
            return;
        }
        match MsgKind::of(&bytes) {
            MsgKind::PacketIn => {
                self.c.prefetch_packet_in(&bytes);
                // A frame the view refuses is the session's decode error.
                let _ = self
                    .c
                    .handle_packet_in_frame(self.now, dpid, &bytes, &mut self.out);
            }
            MsgKind::FlowRemoved => {
                if let Ok(v) = ofp::FlowRemovedView::new(&bytes) {
                    let ended = RuleEnded::of_view(&v);
                    self.c.prefetch_rule_ended(&ended);
                    self.c.handle_rule_ended(self.now, &ended);
                }
            }
            MsgKind::Other => {
                if let Ok((_, msg)) = ofp::decode(bytes) {
                    self.c.handle_message(self.now, dpid, &msg, &mut self.out);
                }
            }
        }
        self.settle();
    }

    /// Carry out what the controller sent, answering the requests a switch answers,
    /// until it sends nothing more.
    fn settle(&mut self) {
        for _ in 0..64 {
            let sent: Vec<(u64, Message)> = self.out.drain().collect();
            if sent.is_empty() {
                return;
            }
            for (dpid, msg) in sent {
                self.at_switch(dpid, msg);
            }
        }
        panic!("the controller kept answering its own switches' answers");
    }

    fn at_switch(&mut self, dpid: u64, msg: Message) {
        let mut wire = BytesMut::new();
        if let Err(e) = ofp::encode(0, &msg, &mut wire) {
            panic!("the controller sent a message that does not encode: {e:?}: {msg:?}");
        }
        let Some(table) = self.tables.get_mut(&dpid) else {
            panic!("the controller sent to switch {dpid:#x}, which never connected: {msg:?}");
        };
        if !self.up.get(&dpid).copied().unwrap_or(false) {
            // Sent to a switch that has left: the session is gone and drops it.
            return;
        }
        match &msg {
            Message::FlowMod(_) | Message::GroupMod(_) | Message::MeterMod(_) => {
                match table.apply(&msg) {
                    Ok(()) => {}
                    // The proactive mode's conntrack actions and matches: the fake cannot
                    // judge the rule. A group still has to exist for the rules that use
                    // it, so it is kept with its buckets emptied; a rule is left out.
                    Err(e) if e.is_unmodelled() => {
                        if let Message::GroupMod(gm) = &msg {
                            let mut opaque = gm.clone();
                            for b in &mut opaque.buckets {
                                b.actions.clear();
                            }
                            if let Err(e) = table.group_mod(&opaque) {
                                panic!("switch {dpid} would refuse the group: {e} for {msg:?}");
                            }
                        }
                    }
                    Err(e) => {
                        panic!("switch {dpid} would answer with an OpenFlow ERROR: {e} for {msg:?}")
                    }
                }
            }
            Message::PacketOut(po) => {
                if let Err(e) = table.packet_out(po) {
                    panic!("switch {dpid} would refuse the PACKET_OUT: {e} for {po:?}");
                }
            }
            Message::MultipartRequest(r) => {
                let body = match &r.body {
                    MultipartRequestBody::PortDesc => MultipartReplyBody::PortDesc(
                        (1..=PORTS).map(|p| port_desc(dpid, p)).collect(),
                    ),
                    MultipartRequestBody::Flow(req) => MultipartReplyBody::Flow(
                        table
                            .flows()
                            .filter(|f| f.cookie & req.cookie_mask == req.cookie & req.cookie_mask)
                            .map(flow_stats_of)
                            .collect(),
                    ),
                    _ => return,
                };
                let reply = Message::MultipartReply(MultipartReply { flags: 0, body });
                self.c.handle_message(self.now, dpid, &reply, &mut self.out);
            }
            _ => {}
        }
    }

    /// A FLOW_REMOVED: of one of the switch's rules (taken out of its table, as the
    /// switch does), or with the input's own cookie and an empty match.
    fn removed_rule(&mut self, input: &mut Input<'_>, dpid: u64) -> FlowRemoved {
        let reason = match input.u8() % 4 {
            0 => FlowRemovedReason::IdleTimeout,
            1 => FlowRemovedReason::HardTimeout,
            2 => FlowRemovedReason::Delete,
            _ => FlowRemovedReason::GroupDelete,
        };
        let packet_count = u64::from(input.u8());
        let Some(table) = self.tables.get_mut(&dpid) else {
            unreachable!("the world's switches are 1..=SWITCHES");
        };
        let n = table.flow_count();
        let pick = usize::from(input.u16());
        let chosen = match n {
            0 => None,
            _ if pick == 0xffff => None,
            _ => table.flows().nth(pick % n).map(flow_stats_of),
        };
        if let Some(f) = &chosen {
            let gone = ofp::FlowMod::delete_strict(f.match_.clone())
                .table(f.table_id)
                .priority(f.priority);
            if let Err(e) = table.flow_mod(&gone) {
                panic!("the fake switch refused to remove its own rule: {e}");
            }
        }
        match chosen {
            Some(f) => FlowRemoved {
                cookie: f.cookie,
                priority: f.priority,
                reason,
                table_id: f.table_id,
                duration_sec: u32::from(input.u8()),
                duration_nsec: 0,
                idle_timeout: f.idle_timeout,
                hard_timeout: f.hard_timeout,
                packet_count,
                byte_count: packet_count * 60,
                match_: f.match_,
            },
            None => FlowRemoved {
                cookie: u64::from(input.u32()) << 32 | u64::from(input.u32()),
                priority: input.u16(),
                reason,
                table_id: 0,
                duration_sec: 0,
                duration_nsec: 0,
                idle_timeout: 0,
                hard_timeout: 0,
                packet_count,
                byte_count: 0,
                match_: ofp::Match::new(),
            },
        }
    }

    /// A probe's outcome, a probe's round trip, or a metrics scrape's text, for a service
    /// and backend that may not exist.
    fn backend_figure(&mut self, input: &mut Input<'_>) {
        let service = input.pick(3);
        let backend = input.pick(4);
        match input.u8() % 3 {
            0 => {
                let result =
                    [ProbeResult::Ok, ProbeResult::Failed, ProbeResult::Refused][input.pick(3)];
                self.c.handle_probe(self.now, service, backend, result);
            }
            1 => {
                let ms = f64::from(input.u16()) / 16.0;
                self.c.handle_response_time(service, backend, ms);
            }
            _ => {
                let n = usize::from(input.u8());
                let text = String::from_utf8_lossy(input.bytes(n)).into_owned();
                let totals = metrics_text::totals(&text, &MetricNames::default());
                let key = (service, backend);
                if let Some(prev) = self.scrapes.insert(key, (self.now, totals)) {
                    let load = metrics_text::derive(prev, (self.now, totals));
                    self.c.handle_backend_load(self.now, service, backend, load);
                }
            }
        }
        self.settle();
    }

    /// What the runtime measured of a batch: any figures, within what a clock can read.
    fn work_sample(&mut self, input: &mut Input<'_>, dpid: u64) {
        let us = |input: &mut Input<'_>| Duration::from_micros(u64::from(input.u16()) << 4);
        let busy = us(input);
        let sample = WorkSample {
            packet_ins: u64::from(input.u8()),
            budget_dropped: u64::from(input.u8()),
            shed: busy.mul_f64(f64::from(input.u8()) / 255.0),
            busy,
            queueing: us(input),
            backlog: u64::from(input.u16()),
            outflow: u64::from(input.u32()),
            outflow_delay: us(input),
            switch: dpid,
        };
        self.c.record_packet_in_work(sample);
    }
}

/// How a session reads a message, by its type byte (§7.1).
enum MsgKind {
    PacketIn,
    FlowRemoved,
    Other,
}

impl MsgKind {
    fn of(bytes: &[u8]) -> MsgKind {
        match bytes.get(1).copied() {
            Some(t) if t == ofp::MsgType::PacketIn as u8 => MsgKind::PacketIn,
            Some(t) if t == ofp::MsgType::FlowRemoved as u8 => MsgKind::FlowRemoved,
            _ => MsgKind::Other,
        }
    }
}

fn encode(msg: &Message) -> Bytes {
    let mut b = BytesMut::new();
    match ofp::encode(7, msg, &mut b) {
        Ok(()) => b.freeze(),
        Err(e) => panic!("the target built a message that does not encode: {e:?}"),
    }
}

/// `body` behind a header the framer passes: version 4, its length (§7.1).
fn frame_bytes(mut body: Vec<u8>) -> Bytes {
    body.resize(body.len().max(8), 0);
    body[0] = ofp::OFP_VERSION;
    let len = body.len() as u16;
    body[2..4].copy_from_slice(&len.to_be_bytes());
    Bytes::from(body)
}

/// Up to three byte changes at or after `from` (the header and what precedes the part
/// worth mutating stay as built), the length field kept true.
fn mutate(input: &mut Input<'_>, bytes: &mut Bytes, from: usize) {
    let n = input.u8() % 4;
    if n == 0 || bytes.len() <= from {
        return;
    }
    let mut b = bytes.to_vec();
    for _ in 0..n {
        let at = from + usize::from(input.u16()) % (b.len() - from);
        b[at] = input.u8();
    }
    *bytes = Bytes::from(b);
}

/// A frame a host might send: TCP to a VIP, to a backend or back from one; ARP about
/// anyone; LLDP claiming any switch and port; UDP.
fn host_frame(input: &mut Input<'_>) -> Bytes {
    // Hosts 1..=16: the backends are 2..=6, the others clients, 16 forged.
    let host = |b: u8| 1 + b % 16;
    let addr = |b: u8| match b % 8 {
        0 => Ipv4Addr::new(10, 0, 0, 100),
        1 => Ipv4Addr::new(10, 0, 0, 101),
        2 => Ipv4Addr::new(192, 168, 7, 9),
        _ => Ipv4Addr::new(10, 0, 0, host(b)),
    };
    let mac = |b: u8| MacAddr([0, 0, 0, 0, 0, host(b)]);
    let vmac = |b: u8| MacAddr([0x02, 0x66, 0x67, 0, 0, 1 + b % 2]);
    match input.u8() % 6 {
        0..=2 => {
            let (from, to) = (input.u8(), input.u8());
            let eth_dst = if input.u8() & 1 == 0 {
                vmac(to)
            } else {
                mac(to)
            };
            let flags = [
                TcpFlags::SYN.0,
                TcpFlags::SYN.0 | TcpFlags::ACK.0,
                TcpFlags::ACK.0,
                TcpFlags::FIN.0 | TcpFlags::ACK.0,
                TcpFlags::RST.0,
                input.u8(),
            ][input.pick(6)];
            let ports = [80, 8080, 443, input.u16()];
            packet::ipv4_tcp(&TcpSegment {
                eth_src: mac(from),
                eth_dst,
                vlan: (input.u8() == 0xff).then_some(7),
                ip_src: addr(from),
                ip_dst: addr(to),
                src_port: input.u16(),
                dst_port: ports[input.pick(4)],
                seq: input.u32(),
                ack: input.u32(),
                flags: TcpFlags(flags),
                ..TcpSegment::default()
            })
        }
        3 => {
            let (from, about) = (input.u8(), input.u8());
            if input.u8() & 1 == 0 {
                packet::arp_request(mac(from), addr(from), addr(about))
            } else {
                let req = packet::Arp {
                    op: packet::ARP_OP_REQUEST,
                    sha: mac(about),
                    spa: addr(about),
                    tha: MacAddr::ZERO,
                    tpa: addr(from),
                };
                packet::arp_reply(&req, mac(from))
            }
        }
        4 => packet::lldp_probe(
            MacAddr([0x0a, 0, 0, 0, 0, 1]),
            u64::from(input.u8() % 5),
            u32::from(input.u8() % 9),
            input.u16(),
        ),
        _ => {
            let (from, to) = (input.u8(), input.u8());
            let src = std::net::SocketAddrV4::new(addr(from), input.u16());
            let dst = std::net::SocketAddrV4::new(addr(to), 80);
            packet::ipv4_udp(mac(from), vmac(to), src, dst, b"fuzz")
        }
    }
}
