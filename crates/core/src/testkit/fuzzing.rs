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
use crate::topology::PortRef;
use crate::{Config, Controller, Outbox};

/// The configurations the target picks from (its first byte): between them, every
/// balancing mode, the overload gates, ISSLM, and tight host limits. (Also seeds for the
/// `config` target's mutations.)
pub const CONFIGS: [&str; 4] = [
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
    // A domain controller of the distributed mode: its uplink toward the other domains on
    // switch 3, and backends of other domains placed behind it (as the global controller's
    // spill decisions, read from etcd, place them).
    r#"
[cluster]
role = "domain"
name = "fuzz"
instance = "d1a"
domain = "d1"
dpids = ["0000000000000001", "0000000000000002", "0000000000000003"]
uplink = "0000000000000003:4"
etcd = ["memory:"]
[[service]]
name = "web"
vip = "10.0.0.100"
port = 80
algorithm = "weighted-round-robin"
threshold_rps = 10
[service.health]
kind = "none"
[[service.backend]]
address = "10.0.0.2"
[[service.backend]]
address = "10.0.0.3"
[[service.backend]]
address = "10.0.0.20"
weight = 0
[[service.backend]]
address = "10.0.0.21"
weight = 0
"#,
];

/// Switches 1..=SWITCHES, each with ports 1..=PORTS, in a line: port 5 of switch 1 to
/// port 5 of switch 2, port 6 of switch 2 to port 6 of switch 3.
const SWITCHES: u64 = 3;
const PORTS: u32 = 6;
const LINKS: [((u64, u32), (u64, u32)); 2] = [((1, 5), (2, 5)), ((2, 6), (3, 6))];

fn link_peer(dpid: u64, port: u32) -> Option<(u64, u32)> {
    LINKS.iter().find_map(|&(a, b)| match () {
        _ if a == (dpid, port) => Some(b),
        _ if b == (dpid, port) => Some(a),
        _ => None,
    })
}
/// Steps one input may run: bounds the time an input takes, not what it can reach.
const MAX_STEPS: usize = 256;

/// How deep one program went: what the stable driver checks its random programs reach,
/// so that a driver that never gets past the first checks fails rather than passes.
#[derive(Debug, Clone, Copy, Default)]
pub struct Reached {
    /// The most connections the controller held at once.
    pub connections: usize,
    /// FLOW_REMOVEDs the controller took.
    pub rules_ended: u64,
    /// TCP resets it sent (a packet of a connection it does not know).
    pub resets: u64,
    /// Links between switches it discovered.
    pub links: usize,
}

/// Runs `data` as a program against a fresh controller. Panics on a defect.
pub fn controller_target(data: &[u8]) -> Reached {
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
    let mut reached = Reached::default();
    for _ in 0..MAX_STEPS {
        if input.is_empty() {
            break;
        }
        world.step(&mut input);
        let c = &world.c;
        reached.connections = reached.connections.max(c.connections().len());
        reached.links = reached.links.max(c.topology().links().count());
    }
    reached.rules_ended = world.c.counters().flow_removed;
    reached.resets = world.c.counters().resets_sent;
    reached
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
    /// PACKET_INs of frames that crossed a link, for the switch at its far end.
    crossed: Vec<(u64, Bytes)>,
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
            crossed: Vec::new(),
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
                let f = HostFrame::read(input);
                let bytes = encode(&Message::PacketIn(PacketIn::table_miss(
                    f.in_port(),
                    f.frame(),
                )));
                // The frame (from byte 42, after the match's in_port), not the PACKET_IN's
                // own fields: the raw messages above cover those.
                let bytes = mutate(input, bytes, 42);
                self.switch_sends(dpid, bytes);
            }
            4 => {
                // The end of a rule the controller installed (or of a made-up one).
                let removed = self.removed_rule(input, dpid);
                let bytes = mutate(input, encode(&Message::FlowRemoved(removed)), 8);
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
                let bytes = mutate(input, encode(&reply), 16);
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

    /// Switch `dpid` sends a message, and the controller's answers are carried out.
    fn switch_sends(&mut self, dpid: u64, bytes: Bytes) {
        self.dispatch(dpid, bytes);
        self.settle();
    }

    /// What a session does with one message from a switch whose handshake is done
    /// (`flowgate::runtime::session`): PACKET_IN and FLOW_REMOVED read in place, anything
    /// else decoded. A message that does not read ends the session there; the core
    /// never sees it.
    fn dispatch(&mut self, dpid: u64, bytes: Bytes) {
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
    }

    /// Carry out what the controller sent, answering the requests a switch answers,
    /// until it sends nothing more.
    fn settle(&mut self) {
        for _ in 0..64 {
            let sent: Vec<(u64, Message)> = self.out.drain().collect();
            let crossed = std::mem::take(&mut self.crossed);
            if sent.is_empty() && crossed.is_empty() {
                return;
            }
            for (dpid, msg) in sent {
                self.at_switch(dpid, msg);
            }
            for (dpid, bytes) in crossed {
                self.dispatch(dpid, bytes);
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
                let trace = match table.packet_out(po) {
                    Ok(t) => t,
                    Err(e) => panic!("switch {dpid} would refuse the PACKET_OUT: {e} for {po:?}"),
                };
                // The controller's LLDP probes cross the links and come up at the far end.
                let lldp = matches!(
                    packet::parse(&po.data).map(|f| f.l3),
                    Ok(packet::L3::Lldp(_))
                );
                for (port, _) in trace.outputs.iter().filter(|_| lldp) {
                    if let Some((peer, peer_port)) = link_peer(dpid, *port) {
                        let up = PacketIn::table_miss(peer_port, po.data.clone());
                        self.crossed.push((peer, encode(&Message::PacketIn(up))));
                    }
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
        // A fixed layout (9 bytes), so that a [`Program`] can write one.
        let reason = match input.u8() % 4 {
            0 => FlowRemovedReason::IdleTimeout,
            1 => FlowRemovedReason::HardTimeout,
            2 => FlowRemovedReason::Delete,
            _ => FlowRemovedReason::GroupDelete,
        };
        let packet_count = u64::from(input.u8());
        let pick = usize::from(input.u16());
        let duration_sec = u32::from(input.u8());
        let cookie = u64::from(input.u32()) << 32 | u64::from(input.u16());
        let Some(table) = self.tables.get_mut(&dpid) else {
            unreachable!("the world's switches are 1..=SWITCHES");
        };
        let n = table.flow_count();
        let chosen = match n {
            0 => None,
            _ if pick == 0xffff => None,
            _ => table.flows().nth(pick % n).map(flow_stats_of),
        };
        let Some(f) = chosen else {
            return FlowRemoved {
                cookie,
                priority: 0,
                reason,
                table_id: 0,
                duration_sec,
                duration_nsec: 0,
                idle_timeout: 0,
                hard_timeout: 0,
                packet_count,
                byte_count: 0,
                match_: ofp::Match::new(),
            };
        };
        let gone = ofp::FlowMod::delete_strict(f.match_.clone())
            .table(f.table_id)
            .priority(f.priority);
        if let Err(e) = table.flow_mod(&gone) {
            panic!("the fake switch refused to remove its own rule: {e}");
        }
        FlowRemoved {
            cookie: f.cookie,
            priority: f.priority,
            reason,
            table_id: f.table_id,
            duration_sec,
            duration_nsec: 0,
            idle_timeout: f.idle_timeout,
            hard_timeout: f.hard_timeout,
            packet_count,
            byte_count: packet_count * 60,
            match_: f.match_,
        }
    }

    /// A probe's outcome, a probe's round trip, a spill decision, or a metrics scrape's
    /// text, for a service and backend that may not exist.
    fn backend_figure(&mut self, input: &mut Input<'_>) {
        let service = input.pick(3);
        let backend = input.pick(5);
        match input.u8() % 4 {
            0 => {
                let result =
                    [ProbeResult::Ok, ProbeResult::Failed, ProbeResult::Refused][input.pick(3)];
                self.c.handle_probe(self.now, service, backend, result);
            }
            1 => {
                let ms = f64::from(input.u16()) / 16.0;
                self.c.handle_response_time(service, backend, ms);
            }
            2 => {
                // A spill decision of the distributed mode: a backend of another domain,
                // with the MAC its domain reported, behind the uplink (or, from a
                // confused decision, any port), and the weight the spill gives it.
                let (ip, mac) = (Endpoint::addr(input.u8()), Endpoint::mac(input.u8()));
                let at = match input.u8() {
                    0..=239 => PortRef::new(3, 4),
                    b => PortRef::new(1 + u64::from(b % 3), u32::from(b % 8)),
                };
                self.c.place_remote_backend(self.now, ip, mac, at);
                self.c.set_weight(service, backend, input.u32());
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
/// worth mutating stay as built), the length field kept true. Reads one byte, and three
/// more per change.
fn mutate(input: &mut Input<'_>, bytes: Bytes, from: usize) -> Bytes {
    let n = input.u8() % 4;
    if n == 0 || bytes.len() <= from {
        return bytes;
    }
    let mut b = bytes.to_vec();
    for _ in 0..n {
        let at = from + usize::from(input.u16()) % (b.len() - from);
        b[at] = input.u8();
    }
    Bytes::from(b)
}

/// A host's frame, as a fixed-size record of the input (19 bytes), so that a [`Program`]
/// can write one: TCP to a VIP, to a backend or back from one; ARP about anyone; LLDP
/// claiming any switch and port; UDP.
#[derive(Debug, Clone, Copy, Default)]
pub struct HostFrame {
    /// 0–2: TCP, 3: ARP, 4: LLDP, 5: UDP (modulo 6).
    pub kind: u8,
    /// Who sends and to whom: an [`Endpoint`] code.
    pub from: u8,
    pub to: u8,
    /// The Ethernet destination: 0 the `to` host's MAC, 1 and 2 the first and second
    /// services' virtual MACs, 3 broadcast (modulo 4).
    pub eth: u8,
    /// 0xff: tagged with VLAN 7.
    pub vlan: u8,
    /// TCP flags; for ARP, bit 0 makes it a reply.
    pub flags: u8,
    /// TCP or UDP ports (LLDP: `sport` is the TTL, and the claimed switch and port are
    /// `from % 5` and `to % 9`).
    pub sport: u16,
    pub dport: u16,
    pub seq: u32,
    pub ack: u32,
    /// Under 240: port `1 + in_port % PORTS`; else port 0, a port the switch does not
    /// have, LOCAL, CONTROLLER or ANY.
    pub in_port: u8,
}

/// Endpoint codes of [`HostFrame`]: under 0xf0, host `1 + code % 32` (`10.0.0.n`, MAC
/// `00:00:00:00:00:n`); from 0xf0, an address that is no host's.
pub struct Endpoint;

impl Endpoint {
    /// Host `n` (1..=32).
    pub const fn host(n: u8) -> u8 {
        n - 1
    }
    /// The first service's VIP (10.0.0.100).
    pub const VIP: u8 = 0xf0;
    /// The second service's VIP (10.0.0.101).
    pub const VIP2: u8 = 0xf1;

    fn addr(code: u8) -> Ipv4Addr {
        match code {
            0..0xf0 => Ipv4Addr::new(10, 0, 0, 1 + code % 32),
            _ => [
                Ipv4Addr::new(10, 0, 0, 100),
                Ipv4Addr::new(10, 0, 0, 101),
                Ipv4Addr::new(192, 168, 7, 9),
                Ipv4Addr::new(10, 0, 0, 0),
                Ipv4Addr::BROADCAST,
            ][usize::from(code & 0x0f) % 5],
        }
    }

    fn mac(code: u8) -> MacAddr {
        match code {
            0..0xf0 => MacAddr([0, 0, 0, 0, 0, 1 + code % 32]),
            _ => MacAddr([0, 0, 0, 0, 1, code]),
        }
    }
}

impl HostFrame {
    fn read(input: &mut Input<'_>) -> HostFrame {
        HostFrame {
            kind: input.u8(),
            from: input.u8(),
            to: input.u8(),
            eth: input.u8(),
            vlan: input.u8(),
            flags: input.u8(),
            sport: input.u16(),
            dport: input.u16(),
            seq: input.u32(),
            ack: input.u32(),
            in_port: input.u8(),
        }
    }

    fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&[
            self.kind, self.from, self.to, self.eth, self.vlan, self.flags,
        ]);
        out.extend_from_slice(&self.sport.to_be_bytes());
        out.extend_from_slice(&self.dport.to_be_bytes());
        out.extend_from_slice(&self.seq.to_be_bytes());
        out.extend_from_slice(&self.ack.to_be_bytes());
        out.push(self.in_port);
    }

    /// A TCP segment from `from` to `to`, with the Ethernet destination `eth`.
    pub fn tcp(from: u8, to: u8, eth: u8, flags: TcpFlags, sport: u16, dport: u16) -> Self {
        HostFrame {
            from,
            to,
            eth,
            flags: flags.0,
            sport,
            dport,
            seq: 1000,
            ..HostFrame::default()
        }
    }

    /// `from` asks who has `about`'s address.
    pub fn arp_request(from: u8, about: u8) -> Self {
        HostFrame {
            kind: 3,
            from,
            to: about,
            eth: 3,
            ..HostFrame::default()
        }
    }

    /// Arriving at port `1 + port % PORTS`.
    pub fn at(self, port: u8) -> Self {
        HostFrame {
            in_port: port.wrapping_sub(1) % 240,
            ..self
        }
    }

    fn in_port(&self) -> u32 {
        match self.in_port {
            0..240 => 1 + u32::from(self.in_port) % PORTS,
            b => [
                0,
                PORTS + 1,
                ofp::port::LOCAL,
                ofp::port::CONTROLLER,
                ofp::port::ANY,
            ][usize::from(b) % 5],
        }
    }

    fn frame(&self) -> Bytes {
        let (from, to) = (Endpoint::mac(self.from), Endpoint::addr(self.to));
        let src = Endpoint::addr(self.from);
        let eth_dst = match self.eth % 4 {
            0 => Endpoint::mac(self.to),
            1 => MacAddr([0x02, 0x66, 0x67, 0, 0, 1]),
            2 => MacAddr([0x02, 0x66, 0x67, 0, 0, 2]),
            _ => MacAddr::BROADCAST,
        };
        match self.kind % 6 {
            0..=2 => packet::ipv4_tcp(&TcpSegment {
                eth_src: from,
                eth_dst,
                vlan: (self.vlan == 0xff).then_some(7),
                ip_src: src,
                ip_dst: to,
                src_port: self.sport,
                dst_port: self.dport,
                seq: self.seq,
                ack: self.ack,
                flags: TcpFlags(self.flags),
                ..TcpSegment::default()
            }),
            3 if self.flags & 1 == 0 => packet::arp_request(from, src, to),
            3 => {
                let req = packet::Arp {
                    op: packet::ARP_OP_REQUEST,
                    sha: Endpoint::mac(self.to),
                    spa: to,
                    tha: MacAddr::ZERO,
                    tpa: src,
                };
                packet::arp_reply(&req, from)
            }
            4 => packet::lldp_probe(
                MacAddr([0x0a, 0, 0, 0, 0, 1]),
                u64::from(self.from % 5),
                u32::from(self.to % 9),
                self.sport,
            ),
            _ => {
                let src = std::net::SocketAddrV4::new(src, self.sport);
                let dst = std::net::SocketAddrV4::new(to, self.dport);
                packet::ipv4_udp(from, eth_dst, src, dst, b"fuzz")
            }
        }
    }
}

/// Writes programs for [`controller_target`]. The stable driver starts from programs
/// written with it, since the decisions need a backend announced and then a SYN to a VIP
/// with its MAC and port, which uniform random bytes almost never give.
#[derive(Debug, Clone)]
pub struct Program(Vec<u8>);

impl Program {
    /// A program against configuration `config` (an index into [`CONFIGS`]).
    pub fn new(config: u8) -> Program {
        Program(vec![config])
    }

    fn op(mut self, dpid: u64, op: u8) -> Program {
        self.0.push((dpid.wrapping_sub(1) % SWITCHES) as u8);
        self.0.push(op);
        self
    }

    /// A host's frame reaches switch `dpid` and goes up as a PACKET_IN, unchanged.
    pub fn frame(self, dpid: u64, f: HostFrame) -> Program {
        let mut p = self.op(dpid, 1);
        f.write(&mut p.0);
        p.0.push(0);
        p
    }

    /// Switch `dpid` reports that its rule number `pick` (of those it holds) ended.
    pub fn rule_ended(self, dpid: u64, pick: u16) -> Program {
        let mut p = self.op(dpid, 4);
        p.0.extend_from_slice(&[0, 3]);
        p.0.extend_from_slice(&pick.to_be_bytes());
        p.0.extend_from_slice(&[30, 0, 0, 0, 0, 0, 0, 0]);
        p
    }

    /// Switch `dpid` sends the flow stats of every rule it holds.
    pub fn flow_stats(self, dpid: u64) -> Program {
        let mut p = self.op(dpid, 5);
        p.0.extend_from_slice(&[0, 0]);
        p
    }

    /// `ms` pass.
    pub fn tick(self, ms: u16) -> Program {
        let mut p = self.op(1, 8);
        p.0.extend_from_slice(&ms.to_be_bytes());
        p.0.push(0);
        p
    }

    /// The distributed mode's global controller spills: host `host` (an [`Endpoint`]
    /// code) is the first service's backend number `backend`, in another domain behind
    /// the uplink, with `weight`.
    pub fn remote_backend(self, backend: u8, host: u8, weight: u32) -> Program {
        let mut p = self.op(1, 10);
        p.0.extend_from_slice(&[0, backend, 2, host, host, 0]);
        p.0.extend_from_slice(&weight.to_be_bytes());
        p
    }

    /// Switch `dpid` leaves, or comes back.
    pub fn toggle(self, dpid: u64) -> Program {
        self.op(dpid, 9)
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.0
    }
}

/// Programs that reach the decisions under each configuration: backends and clients
/// announce themselves on three linked switches, clients open connections to the VIPs
/// and to an addressed backend, a stray segment is reset, rules end, a switch leaves and
/// comes back, and time passes.
pub fn seed_programs() -> Vec<Vec<u8>> {
    let (vip, vip2) = (Endpoint::VIP, Endpoint::VIP2);
    let h = Endpoint::host;
    let mut seeds = Vec::new();
    for config in 0..CONFIGS.len() as u8 {
        let mut p = Program::new(config);
        // Backends 2..=6 and clients 7..=9, spread over the three switches.
        for (host, dpid, port) in [
            (2, 1, 1),
            (3, 1, 2),
            (4, 2, 1),
            (5, 3, 1),
            (6, 3, 2),
            (7, 1, 3),
            (8, 2, 2),
            (9, 3, 3),
        ] {
            p = p.frame(dpid, HostFrame::arp_request(h(host), h(1)).at(port));
        }
        // The LLDP round finds the links; in the distributed mode, two backends of another
        // domain come in behind the uplink and take a share.
        p = p.tick(1100);
        if config == 3 {
            p = p.remote_backend(2, Endpoint::host(20), 300).remote_backend(
                3,
                Endpoint::host(21),
                100,
            );
        }
        let syn = TcpFlags::SYN;
        p = p
            .frame(1, HostFrame::tcp(h(7), vip, 1, syn, 40_000, 80).at(3))
            .frame(2, HostFrame::tcp(h(8), vip, 1, syn, 40_002, 80).at(2))
            .frame(3, HostFrame::tcp(h(9), vip2, 2, syn, 40_004, 80).at(3))
            .frame(3, HostFrame::tcp(h(9), h(5), 0, syn, 40_006, 8080).at(3))
            // A segment of no connection the controller knows: reset (or dropped).
            .frame(
                1,
                HostFrame::tcp(h(7), vip, 1, TcpFlags::ACK, 41_000, 80).at(3),
            )
            .rule_ended(1, 0)
            .rule_ended(2, 7)
            .tick(31_000)
            .toggle(2)
            .tick(200)
            .toggle(2)
            .flow_stats(2)
            .frame(2, HostFrame::tcp(h(8), vip, 1, syn, 40_008, 80).at(2))
            .tick(5_000);
        seeds.push(p.into_bytes());
    }
    seeds
}

/// A small deterministic generator (xorshift64*) for the stable drivers of the targets.
#[derive(Debug, Clone)]
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform enough in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
}
