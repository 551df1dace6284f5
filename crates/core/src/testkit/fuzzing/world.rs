//! The world a program runs in: the controller, three fake switches in a line, the clock;
//! and the steps a program's bytes stand for.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use flowgate_packet as packet;
use ofp::{
    Action, FlowMod, FlowModCommand, FlowRemoved, FlowRemovedReason, FlowStats, GroupModCommand,
    Instruction, Message, MeterBandStats, MeterStats, MultipartReply, MultipartReplyBody,
    MultipartRequestBody, PacketIn, PortReason, PortStatus, SwitchFeatures,
};

use super::input::Input;
use super::program::{Endpoint, HostFrame};
use super::{PORTS, SWITCHES, link_peer};
use crate::balance::{AlgorithmKind, AlgorithmParams};
use crate::config::BackendConfig;
use crate::controller::{ProbeResult, RuleEnded};
use crate::metrics_text::{self, MetricNames};
use crate::overload::WorkSample;
use crate::service::AdminState;
use crate::testkit::FakeTable;
use crate::testkit::sim::{flow_stats_of, port_desc};
use crate::topology::PortRef;
use crate::{Config, Controller, Outbox};

/// The controller, its switches' tables, and the clock.
pub(super) struct World {
    pub(super) c: Controller,
    /// The configurations a reload step picks from.
    configs: &'static [Config],
    /// Reloads carried out.
    pub(super) reloads: u64,
    /// Operator actions carried out (whether the core took them or refused).
    pub(super) operations: u64,
    tables: BTreeMap<u64, FakeTable>,
    /// The switches connected now.
    up: BTreeSet<u64>,
    now: Instant,
    out: Outbox,
    /// The last metrics scrape per backend, as the runtime's scraper keeps it.
    scrapes: BTreeMap<(usize, usize), (Instant, metrics_text::Totals)>,
    /// PACKET_INs of frames that crossed a link, for the switch at its far end.
    crossed: Vec<(u64, Bytes)>,
    /// Per switch, the rules the fake table cannot model (conntrack's), kept as the
    /// switch would hold them: added, replaced, deleted and reported, never run.
    opaque: BTreeMap<u64, Vec<FlowStats>>,
    /// Opaque rules the switches reported in flow stats, and reported ended.
    pub(super) opaque_reported: u64,
    pub(super) opaque_ended: u64,
}

impl World {
    pub(super) fn new(config: &Config, configs: &'static [Config]) -> World {
        let mut w = World {
            c: Controller::new(config),
            configs,
            reloads: 0,
            operations: 0,
            tables: (1..=SWITCHES)
                .map(|d| (d, FakeTable::new().with_ports(1..=PORTS)))
                .collect(),
            up: BTreeSet::new(),
            now: Instant::now(),
            out: Outbox::new(),
            scrapes: BTreeMap::new(),
            crossed: Vec::new(),
            opaque: BTreeMap::new(),
            opaque_reported: 0,
            opaque_ended: 0,
        };
        for d in 1..=SWITCHES {
            w.switch_up(d);
        }
        w
    }

    pub(super) fn step(&mut self, input: &mut Input<'_>) {
        let dpid = 1 + input.pick(SWITCHES as usize) as u64;
        match input.u8() % 14 {
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
                if self.up.contains(&dpid) {
                    self.c.handle_switch_down(self.now, dpid, &mut self.out);
                    self.up.remove(&dpid);
                    self.settle();
                } else {
                    self.switch_up(dpid);
                }
            }
            10 => self.backend_figure(input),
            11 => self.work_sample(input, dpid),
            12 => self.reload(input),
            _ => self.operator(input),
        }
    }

    /// What an operator does through the API, to a service and backend that may not
    /// exist: drain or undrain, a weight (within the API's bound), a backend added or
    /// removed, an algorithm (the core's refusals are the API's 4xx), a health verdict.
    fn operator(&mut self, input: &mut Input<'_>) {
        let service = input.pick(3);
        let backend = input.pick(5);
        let now = self.now;
        match input.u8() % 6 {
            0 => {
                let admin = [AdminState::Active, AdminState::Draining][input.pick(2)];
                self.c.set_admin(now, service, backend, admin);
            }
            1 => {
                self.c
                    .set_weight(service, backend, u32::from(input.u16()) % 1001);
            }
            2 => {
                let cfg = BackendConfig {
                    address: Endpoint::addr(input.u8()),
                    weight: u32::from(input.u8()),
                    metrics: None,
                    // Sometimes pinned, perhaps to another endpoint's MAC: its claims
                    // must then be refused, never panic.
                    mac: (input.pick(2) == 0).then(|| Endpoint::mac(input.u8())),
                    capacity_rps: None,
                };
                let _ = self.c.add_backend(now, service, cfg, &mut self.out);
            }
            3 => {
                let _ = self.c.remove_backend(now, service, backend, &mut self.out);
            }
            4 => {
                let kind = AlgorithmKind::ALL[input.pick(AlgorithmKind::ALL.len())];
                let params = AlgorithmParams {
                    threshold_rps: Some(1.0 + f64::from(input.u8())),
                    ..AlgorithmParams::default()
                };
                let _ = self.c.set_algorithm(now, service, kind, params);
            }
            _ => self
                .c
                .handle_health(now, service, backend, input.u8() & 1 == 0),
        }
        self.operations += 1;
        self.settle();
    }

    /// A reload: one of the configurations, its services in the order the input picks
    /// (as written, reversed, or rotated), so that services come, go and move.
    fn reload(&mut self, input: &mut Input<'_>) {
        let Some(base) = self.configs.get(input.pick(self.configs.len())) else {
            return;
        };
        let mut config = base.clone();
        match input.u8() % 3 {
            0 => {}
            1 => config.services.reverse(),
            _ => config.services.rotate_left(1),
        }
        self.reload_to(&config);
    }

    pub(super) fn reload_to(&mut self, config: &Config) {
        self.c.reload(self.now, config, &mut self.out);
        self.reloads += 1;
        self.settle();
    }

    fn switch_up(&mut self, dpid: u64) {
        let features = SwitchFeatures::emulated(dpid);
        self.c.handle_switch_up(self.now, features, &mut self.out);
        self.up.insert(dpid);
        self.settle();
    }

    pub(super) fn tick(&mut self, by: Duration) {
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
        if !self.up.contains(&dpid) {
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
                    self.c
                        .handle_rule_ended(self.now, dpid, &ended, &mut self.out);
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
        if !self.up.contains(&dpid) {
            // Sent to a switch that has left: the session is gone and drops it.
            return;
        }
        let opaque = self.opaque.entry(dpid).or_default();
        match &msg {
            Message::FlowMod(fm) if fm.command != FlowModCommand::Add => opaque_delete(opaque, fm),
            Message::GroupMod(gm) if gm.command == GroupModCommand::Delete => {
                // §6.4: deleting a group deletes the rules that forward to it.
                let all = gm.group_id == ofp::group::ALL;
                opaque.retain(|f| !sends_to_group(f, |g| all || g == gm.group_id));
            }
            _ => {}
        }
        match &msg {
            Message::FlowMod(_) | Message::GroupMod(_) | Message::MeterMod(_) => {
                match table.apply(&msg) {
                    Ok(()) => {}
                    // The proactive mode's conntrack actions and matches: the fake cannot
                    // judge the rule. A group still has to exist for the rules that use
                    // it, so it is kept with its buckets emptied; a rule is left out.
                    Err(e) if e.is_unmodelled() => {
                        if let Message::FlowMod(fm) = &msg {
                            opaque_add(opaque, fm);
                        }
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
                    MultipartRequestBody::Flow(req) => {
                        let asked = |f: &FlowStats| {
                            f.cookie & req.cookie_mask == req.cookie & req.cookie_mask
                        };
                        let opaque: Vec<FlowStats> =
                            opaque.iter().filter(|f| asked(f)).cloned().collect();
                        self.opaque_reported += opaque.len() as u64;
                        let modelled = table.flows().map(flow_stats_of).filter(|f| asked(f));
                        MultipartReplyBody::Flow(modelled.chain(opaque).collect())
                    }
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
        let opaque = self.opaque.entry(dpid).or_default();
        let n = table.flow_count();
        let chosen = match n + opaque.len() {
            0 => None,
            _ if pick == 0xffff => None,
            all if pick % all >= n => {
                self.opaque_ended += 1;
                Some(opaque.remove(pick % all - n))
            }
            all => table.flows().nth(pick % all).map(flow_stats_of),
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
        // (An opaque rule was taken out above; the table has no such rule.)
        if let Err(e) = table.flow_mod(&gone)
            && !e.is_unmodelled()
        {
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
            session_dropped: u64::from(input.u8()),
            shed: busy.mul_f64(f64::from(input.u8()) / 255.0),
            busy,
            queueing: us(input),
            backlog: u64::from(input.u16()),
            outflow: u64::from(input.u32()),
            outflow_delay: us(input),
            channel_rtt: us(input),
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

/// An opaque rule added, as §6.4 has it: one with the same table, priority and match is
/// replaced.
fn opaque_add(rules: &mut Vec<FlowStats>, fm: &FlowMod) {
    rules.retain(|f| {
        !(f.table_id == fm.table_id && f.priority == fm.priority && f.match_ == fm.match_)
    });
    rules.push(FlowStats {
        table_id: fm.table_id,
        duration_sec: 0,
        duration_nsec: 0,
        priority: fm.priority,
        idle_timeout: fm.idle_timeout,
        hard_timeout: fm.hard_timeout,
        flags: fm.flags,
        cookie: fm.cookie,
        packet_count: 0,
        byte_count: 0,
        match_: fm.match_.clone(),
        instructions: fm.instructions.clone(),
    });
}

/// The opaque rules a delete (or modify, which the controller never sends them) takes:
/// §6.4's non-strict delete takes the rules whose match holds every field of the
/// delete's, a strict one the rule with its match and priority; both filtered by table
/// and cookie (§7.3.4.1).
fn opaque_delete(rules: &mut Vec<FlowStats>, fm: &FlowMod) {
    let strict = match fm.command {
        FlowModCommand::Delete => false,
        FlowModCommand::DeleteStrict => true,
        _ => return,
    };
    rules.retain(|f| {
        let table = fm.table_id == ofp::table::ALL || fm.table_id == f.table_id;
        let cookie = f.cookie & fm.cookie_mask == fm.cookie & fm.cookie_mask;
        let matched = if strict {
            f.priority == fm.priority && f.match_ == fm.match_
        } else {
            fm.match_.iter().all(|o| f.match_.iter().any(|r| r == o))
        };
        !(table && cookie && matched)
    });
}

/// Whether an opaque rule forwards to a group that `deleted` says is deleted.
fn sends_to_group(f: &FlowStats, deleted: impl Fn(u32) -> bool) -> bool {
    f.instructions.iter().any(|i| match i {
        Instruction::ApplyActions(a) => a
            .iter()
            .any(|a| matches!(a, Action::Group(g) if deleted(*g))),
        _ => false,
    })
}
