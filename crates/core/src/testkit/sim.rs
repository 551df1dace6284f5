//! A controller wired to a fake network (Faucet's method), for the core's tests: every
//! message the controller sends is applied to fake flow tables or traced as a PACKET_OUT,
//! every packet that misses goes back to it as a PACKET_IN, and tests assert where packets
//! end up.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use flowgate_packet::{self as packet, Arp, L3, MacAddr, TcpFlags, TcpSegment};
use ofp::{Message, MultipartReply, MultipartReplyBody, PacketIn, PortDesc, SwitchFeatures};

use super::{Delivery, FakeNetwork, FakeTable, PacketFields};
use crate::{Config, Controller, Outbox};

/// The VIP the tests' services use, and its virtual MAC (the first service's default).
pub const VIP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 100);
pub const VMAC: MacAddr = MacAddr([0x02, 0x66, 0x67, 0, 0, 1]);

/// Host `i`'s MAC and address: `00:00:00:00:00:ii`, `10.0.0.i`.
pub fn mac(i: u8) -> MacAddr {
    MacAddr([0, 0, 0, 0, 0, i])
}

pub fn ip(i: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 0, 0, i)
}

pub const SYN: u8 = 0x02;
pub const ACK: u8 = 0x10;
pub const SYN_ACK: u8 = 0x12;
pub const FIN: u8 = 0x01;

/// A controller wired to a fake network.
pub struct Sim {
    pub c: Controller,
    pub net: FakeNetwork,
    pub now: Instant,
    pub out: Outbox,
    /// Ports per switch, for PORT_DESC replies.
    pub ports: BTreeMap<u64, Vec<u32>>,
    /// Packets hosts received during the last `send`.
    pub received: Vec<(String, PacketFields)>,
    pub packet_ins: usize,
}

impl Sim {
    /// Switches with `ports` each, `links` between them, hosts `(name, dpid, port)`.
    pub fn new(
        config: &str,
        switches: &[(u64, u32)],
        links: &[(super::PortRef, super::PortRef)],
        hosts: &[(&str, u64, u32)],
    ) -> Sim {
        let cfg = Config::from_toml(config, &|_| None).expect("valid config");
        let mut net = FakeNetwork::new();
        let mut ports = BTreeMap::new();
        for &(d, n) in switches {
            net.add_switch(d, FakeTable::new());
            ports.insert(d, (1..=n).collect());
        }
        for &(a, b) in links {
            net.add_link(a, b);
        }
        for &(h, d, p) in hosts {
            net.add_host(h, (d, p));
        }
        let mut sim = Sim {
            c: Controller::new(&cfg),
            net,
            now: Instant::now(),
            out: Outbox::new(),
            ports,
            received: Vec::new(),
            packet_ins: 0,
        };
        sim.switches_up();
        sim.tick(Duration::from_millis(10));
        sim
    }

    /// Every switch connects to the controller (what it asks for is carried out).
    fn switches_up(&mut self) {
        let dpids: Vec<u64> = self.ports.keys().copied().collect();
        for d in dpids {
            let features = SwitchFeatures::emulated(d);
            self.c.handle_switch_up(self.now, features, &mut self.out);
            self.pump();
        }
    }

    /// The controller restarts with `config`: a fresh one, to which every switch connects
    /// again, its flow tables as they were.
    pub fn restart(&mut self, config: &str) {
        let cfg = Config::from_toml(config, &|_| None).expect("valid config");
        self.c = Controller::new(&cfg);
        self.out = Outbox::new();
        self.switches_up();
    }

    pub fn tick(&mut self, by: Duration) {
        self.now += by;
        self.c.handle_tick(self.now, &mut self.out);
        self.pump();
    }

    /// Carry out everything the controller asked for, and everything that follows from it.
    pub fn pump(&mut self) {
        for _ in 0..10_000 {
            let msgs: Vec<(u64, Message)> = self.out.drain().collect();
            if msgs.is_empty() {
                return;
            }
            for (dpid, msg) in msgs {
                self.carry_out(dpid, msg);
            }
        }
        panic!("the controller and the network never settled");
    }

    pub fn carry_out(&mut self, dpid: u64, msg: Message) {
        match &msg {
            Message::FlowMod(_) | Message::GroupMod(_) | Message::MeterMod(_) => {
                if let Err(e) = self.net.apply(dpid, &msg) {
                    panic!("the switch would answer with an OpenFlow ERROR: {e} for {msg:?}");
                }
            }
            Message::PacketOut(po) => {
                let table = self.net.switch(dpid).expect("switch");
                let trace = table
                    .packet_out(po)
                    .unwrap_or_else(|e| panic!("PACKET_OUT refused: {e}"));
                let is_lldp = matches!(packet::parse(&po.data).map(|f| f.l3), Ok(L3::Lldp(_)));
                for (port, fields) in trace.outputs {
                    if is_lldp {
                        // LLDP is never forwarded: it arrives at the peer and goes up.
                        if let Some(peer) = self.net.peer((dpid, port)) {
                            self.packet_in(peer.0, peer.1, po.data.clone());
                        }
                        continue;
                    }
                    self.emit(dpid, port, fields);
                }
            }
            Message::MultipartRequest(r) => match &r.body {
                ofp::MultipartRequestBody::PortDesc => {
                    let ports = self.ports[&dpid]
                        .iter()
                        .map(|&p| port_desc(dpid, p))
                        .collect();
                    let reply = Message::MultipartReply(MultipartReply {
                        flags: 0,
                        body: MultipartReplyBody::PortDesc(ports),
                    });
                    self.c.handle_message(self.now, dpid, &reply, &mut self.out);
                }
                ofp::MultipartRequestBody::Flow(req) => {
                    // The rules the cookie filter selects (§7.3.5.2), as the switch holds them.
                    let table = self.net.switch(dpid).expect("switch");
                    let stats = table
                        .flows()
                        .filter(|f| (f.cookie & req.cookie_mask) == (req.cookie & req.cookie_mask))
                        .map(flow_stats_of)
                        .collect();
                    let reply = Message::MultipartReply(MultipartReply {
                        flags: 0,
                        body: MultipartReplyBody::Flow(stats),
                    });
                    self.c.handle_message(self.now, dpid, &reply, &mut self.out);
                }
                _ => {}
            },
            _ => {}
        }
    }

    /// A packet leaves switch `dpid` on `port`: over a link into the next switch, or to a host.
    pub fn emit(&mut self, dpid: u64, port: u32, fields: PacketFields) {
        if let Some(peer) = self.net.peer((dpid, port)) {
            let d = self.net.inject(peer, fields).expect("no loop");
            self.absorb(d);
        } else if let Some(h) = self.net.host_at((dpid, port)) {
            self.received.push((h.to_string(), fields));
        }
    }

    pub fn absorb(&mut self, d: Delivery) {
        self.received.extend(d.hosts);
        for (dpid, f, cookie) in d.to_controller {
            let frame = frame_of(&f);
            self.packet_in_by(dpid, f.in_port, frame, cookie);
        }
    }

    /// A PACKET_IN as a table miss would send it.
    pub fn packet_in(&mut self, dpid: u64, in_port: u32, data: ofp::Bytes) {
        self.packet_in_by(dpid, in_port, data, u64::MAX);
    }

    /// A PACKET_IN sent by the rule with `cookie` (§7.4.1).
    pub fn packet_in_by(&mut self, dpid: u64, in_port: u32, data: ofp::Bytes, cookie: u64) {
        self.packet_ins += 1;
        let mut pi = PacketIn::table_miss(in_port, data);
        pi.cookie = cookie;
        if cookie != u64::MAX {
            pi.reason = ofp::PacketInReason::Action;
        }
        self.c
            .handle_message(self.now, dpid, &Message::PacketIn(pi), &mut self.out);
        self.pump();
    }

    /// The link between ports `a` and `b` goes down (`up` false: both ends report their
    /// ports down, §7.4.3) or comes back (the ports up, and every switch asked for its
    /// ports, which the controller answers with LLDP on each: the link is found again at
    /// once, not at the next LLDP tick).
    pub fn set_link(&mut self, (a, b): ((u64, u32), (u64, u32)), up: bool) {
        if up {
            self.net.add_link(a, b);
        } else {
            self.net.remove_link(a);
        }
        for (d, p) in [a, b] {
            let mut desc = port_desc(d, p);
            desc.state = u32::from(!up); // OFPPS_LINK_DOWN (§7.2.1)
            let ps = Message::PortStatus(ofp::PortStatus {
                reason: ofp::PortReason::Modify,
                desc,
            });
            self.c.handle_message(self.now, d, &ps, &mut self.out);
            self.pump();
        }
        if up {
            let dpids: Vec<u64> = self.ports.keys().copied().collect();
            for d in dpids {
                let ask = Message::MultipartRequest(ofp::MultipartRequest {
                    flags: 0,
                    body: ofp::MultipartRequestBody::PortDesc,
                });
                self.carry_out(d, ask);
            }
            self.pump();
        }
    }

    /// Host `from` sends a frame; returns who received what.
    pub fn send(&mut self, from: &str, frame: &[u8]) -> Vec<(String, PacketFields)> {
        self.received.clear();
        let d = self.net.deliver_frame(from, frame).expect("no loop");
        self.absorb(d);
        std::mem::take(&mut self.received)
    }
}

/// A rule as a switch's flow stats report it (just installed: no time, no packets).
pub fn flow_stats_of(f: &super::FlowEntry) -> ofp::FlowStats {
    ofp::FlowStats {
        table_id: f.table_id,
        duration_sec: 0,
        duration_nsec: 0,
        priority: f.priority,
        idle_timeout: f.idle_timeout,
        hard_timeout: f.hard_timeout,
        flags: f.flags,
        cookie: f.cookie,
        packet_count: 0,
        byte_count: 0,
        match_: f.match_.clone(),
        instructions: f.instructions.iter().cloned().collect(),
    }
}

pub fn port_desc(dpid: u64, p: u32) -> PortDesc {
    PortDesc {
        port_no: p,
        hw_addr: [0x0a, 0, 0, 0, dpid as u8, p as u8],
        name: ofp::PortName::new(&format!("s{dpid}-eth{p}")),
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

/// A frame with these fields (TCP and ARP are what the tests send).
pub fn frame_of(f: &PacketFields) -> ofp::Bytes {
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
    let seg = TcpSegment {
        eth_src: f.eth_src,
        eth_dst: f.eth_dst,
        ip_src: f.ipv4_src.unwrap_or(Ipv4Addr::UNSPECIFIED),
        ip_dst: f.ipv4_dst.unwrap_or(Ipv4Addr::UNSPECIFIED),
        src_port: f.tcp_src.unwrap_or(0),
        dst_port: f.tcp_dst.unwrap_or(0),
        flags: TcpFlags(f.tcp_flags.unwrap_or(0) as u8),
        seq: f.tcp_seq.unwrap_or(0),
        ack: f.tcp_ack.unwrap_or(0),
        ..TcpSegment::default()
    };
    packet::ipv4_tcp(&seg)
}

pub fn arp_request(from: u8, target: Ipv4Addr) -> ofp::Bytes {
    packet::arp_request(mac(from), ip(from), target)
}

/// A segment from h1 (`mac(1)`, `ip(1)`) at `port` to the VIP's port 80.
pub fn client_segment(port: u16, seq: u32, ack: u32, flags: u8) -> ofp::Bytes {
    packet::ipv4_tcp(&TcpSegment {
        eth_src: mac(1),
        eth_dst: VMAC,
        ip_src: ip(1),
        ip_dst: VIP,
        src_port: port,
        dst_port: 80,
        seq,
        ack,
        flags: TcpFlags(flags),
        ..TcpSegment::default()
    })
}

pub fn tcp(
    from_mac: MacAddr,
    to_mac: MacAddr,
    src: (Ipv4Addr, u16),
    dst: (Ipv4Addr, u16),
    flags: u8,
) -> ofp::Bytes {
    packet::ipv4_tcp(&TcpSegment {
        eth_src: from_mac,
        eth_dst: to_mac,
        ip_src: src.0,
        ip_dst: dst.0,
        src_port: src.1,
        dst_port: dst.1,
        seq: 1000,
        flags: TcpFlags(flags),
        ..TcpSegment::default()
    })
}
