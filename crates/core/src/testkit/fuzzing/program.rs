//! What a program's host frames are, and [`Program`], which writes programs: the seeds
//! that reach the controller's decisions.

use std::net::Ipv4Addr;

use bytes::Bytes;
use flowgate_packet::{self as packet, MacAddr, TcpFlags, TcpSegment};

use super::input::Input;
use super::{CONFIGS, PORTS, SWITCHES};

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

    pub(super) fn addr(code: u8) -> Ipv4Addr {
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

    pub(super) fn mac(code: u8) -> MacAddr {
        match code {
            0..0xf0 => MacAddr([0, 0, 0, 0, 0, 1 + code % 32]),
            _ => MacAddr([0, 0, 0, 0, 1, code]),
        }
    }
}

impl HostFrame {
    pub(super) fn read(input: &mut Input<'_>) -> HostFrame {
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

    pub(super) fn write(&self, out: &mut Vec<u8>) {
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

    pub(super) fn in_port(&self) -> u32 {
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

    pub(super) fn frame(&self) -> Bytes {
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
            // Tagged with the key of the configs' seed, or (flag 2) forged.
            4 => packet::lldp_probe(
                MacAddr([0x0a, 0, 0, 0, 0, 1]),
                u64::from(self.from % 5),
                u32::from(self.to % 9),
                self.sport,
                &if self.flags & 2 == 0 {
                    crate::controller::lldp_key_of_seed(crate::config::DEFAULT_SEED)
                } else {
                    packet::LldpKey([1, 2])
                },
            ),
            _ => {
                let src = std::net::SocketAddrV4::new(src, self.sport);
                let dst = std::net::SocketAddrV4::new(to, self.dport);
                packet::ipv4_udp(from, eth_dst, src, dst, b"fuzz")
            }
        }
    }
}

/// Writes programs for [`controller_target`](super::controller_target). The stable driver starts from programs
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

    /// A reload to configuration `config` (an index into [`CONFIGS`]), its services as
    /// written (`order` 0), reversed (1) or rotated by one (2).
    pub fn reload(self, config: u8, order: u8) -> Program {
        let mut p = self.op(1, 12);
        p.0.extend_from_slice(&[config, order]);
        p
    }

    /// An operator's action on backend `backend` of service `service` (see
    /// `World::operator`): 0 drain (`args` `[1]`) or undrain (`[0]`), 1 a weight (two
    /// bytes), 2 add a backend (its endpoint code and weight), 3 remove it, 4 an algorithm
    /// (its index and threshold), 5 a health verdict (`[0]` up).
    pub fn operator(self, service: u8, backend: u8, action: u8, args: &[u8]) -> Program {
        let mut p = self.op(1, 13);
        p.0.extend_from_slice(&[service, backend, action]);
        p.0.extend_from_slice(args);
        p
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.0
    }
}

/// Programs that reach the decisions under each configuration: backends and clients
/// announce themselves on three linked switches, clients open connections to the VIPs
/// and to an addressed backend, a stray segment is reset, rules end, the services are
/// reloaded in reverse order, an operator removes a backend and drains another, a switch
/// leaves and comes back, and time passes.
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
            // The services move in the file: each keeps its meter, group and rules.
            .reload(config, 1)
            .frame(1, HostFrame::tcp(h(7), vip, 1, syn, 40_010, 80).at(3))
            // An operator removes a backend of the (now) first service and drains another.
            .operator(0, 0, 3, &[])
            .operator(0, 1, 0, &[1])
            .frame(2, HostFrame::tcp(h(8), vip, 1, syn, 40_012, 80).at(2))
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
