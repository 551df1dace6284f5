//! The controller's hot path, shared by tests/no_alloc.rs and benches/roundtrip.rs:
//! decode a PACKET_IN carrying a TCP SYN, answer with two FLOW_MODs (forward and reverse
//! NAT rules) and a PACKET_OUT of the same frame.
#![allow(dead_code, unreachable_pub)]

use std::net::Ipv4Addr;

use bytes::{Bytes, BytesMut};
use ofp::{
    Action, Actions, FlowMod, FlowModFlags, Instruction, Match, Message, Oxm, PacketIn,
    PacketInReason, PacketOut, decode, encode,
};

pub const VIP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 100);
pub const VIP_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x64];
pub const BACKEND: Ipv4Addr = Ipv4Addr::new(10, 0, 1, 7);
pub const BACKEND_MAC: [u8; 6] = [0x02, 0, 0, 0, 1, 7];

/// A 60-byte Ethernet/IPv4/TCP SYN frame (54 bytes + padding).
pub fn syn_frame() -> Vec<u8> {
    let mut f = Vec::with_capacity(60);
    f.extend_from_slice(&VIP_MAC); // dst
    f.extend_from_slice(&[0x02, 0, 0, 0, 2, 9]); // src
    f.extend_from_slice(&[0x08, 0x00]);
    // IPv4: ver/ihl, tos, len=40, id, flags, ttl=64, proto=6, csum, src, dst
    f.extend_from_slice(&[0x45, 0, 0, 40, 0x12, 0x34, 0x40, 0, 64, 6, 0, 0]);
    f.extend_from_slice(&[10, 0, 2, 9]);
    f.extend_from_slice(&VIP.octets());
    // TCP: sport 40000, dport 80, seq, ack, off=5, SYN, win
    f.extend_from_slice(&40000u16.to_be_bytes());
    f.extend_from_slice(&80u16.to_be_bytes());
    f.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x02, 0xff, 0xff, 0, 0, 0, 0]);
    f.resize(60, 0);
    f
}

/// The PACKET_IN as a switch sends it (table miss, in_port 3, NO_BUFFER).
pub fn packet_in_bytes() -> Bytes {
    let pi = PacketIn {
        buffer_id: ofp::NO_BUFFER,
        total_len: 60,
        reason: PacketInReason::NoMatch,
        table_id: 0,
        cookie: u64::MAX,
        match_: Match::new().with(Oxm::InPort(3)),
        data: Bytes::from(syn_frame()),
    };
    let mut b = BytesMut::with_capacity(256);
    encode(0x1234, &Message::PacketIn(pi), &mut b).expect("encode packet-in");
    b.freeze()
}

fn be16(d: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([
        d.get(at).copied().unwrap_or(0),
        d.get(at + 1).copied().unwrap_or(0),
    ])
}
fn ip(d: &[u8], at: usize) -> Ipv4Addr {
    let mut a = [0u8; 4];
    if let Some(s) = d.get(at..at + 4) {
        a.copy_from_slice(s);
    }
    Ipv4Addr::from(a)
}
fn mac(d: &[u8], at: usize) -> [u8; 6] {
    let mut a = [0u8; 6];
    if let Some(s) = d.get(at..at + 6) {
        a.copy_from_slice(s);
    }
    a
}

/// One round trip; returns the number of bytes written to `out`.
pub fn round_trip(frame: &Bytes, out: &mut BytesMut) -> usize {
    out.clear();
    let Ok((xid, Message::PacketIn(pi))) = decode(frame.clone()) else {
        panic!("not a packet-in")
    };
    let in_port = pi.in_port().unwrap_or(0);
    let d = &pi.data[..];
    let (client_mac, client_ip, vip) = (mac(d, 6), ip(d, 26), ip(d, 30));
    let (sport, dport) = (be16(d, 34), be16(d, 36));
    let backend_port = 7;

    // Built in place (push / field assignment) rather than by value-returning builder
    // chains: a FlowMod is ~800 bytes with its inline match and instructions, and every
    // by-value step would copy it.
    let mut fwd = FlowMod::add(Match::new());
    fwd.table_id = 1;
    fwd.priority = 1000;
    fwd.cookie = 0x0300_0000_0000_0001;
    fwd.idle_timeout = 60;
    fwd.flags = FlowModFlags::SEND_FLOW_REM;
    let m = &mut fwd.match_;
    m.push(Oxm::InPort(in_port));
    m.push(Oxm::EthType(0x0800));
    m.push(Oxm::IpProto(6));
    m.push(Oxm::ipv4_src(client_ip));
    m.push(Oxm::ipv4_dst(vip));
    m.push(Oxm::TcpSrc(sport));
    m.push(Oxm::TcpDst(dport));
    let mut acts = Actions::new();
    acts.push(Action::SetField(Oxm::eth_dst(BACKEND_MAC)));
    acts.push(Action::SetField(Oxm::ipv4_dst(BACKEND)));
    acts.push(Action::output(backend_port));
    fwd.instructions.push(Instruction::ApplyActions(acts));
    encode(xid, &fwd, out).expect("encode fwd");

    let mut rev = FlowMod::add(Match::new());
    rev.table_id = 1;
    rev.priority = 1000;
    rev.cookie = 0x0300_0000_0000_0002;
    rev.idle_timeout = 60;
    let m = &mut rev.match_;
    m.push(Oxm::InPort(backend_port));
    m.push(Oxm::EthType(0x0800));
    m.push(Oxm::IpProto(6));
    m.push(Oxm::ipv4_src(BACKEND));
    m.push(Oxm::ipv4_dst(client_ip));
    m.push(Oxm::TcpSrc(dport));
    m.push(Oxm::TcpDst(sport));
    let mut acts = Actions::new();
    acts.push(Action::SetField(Oxm::eth_src(VIP_MAC)));
    acts.push(Action::SetField(Oxm::ipv4_src(vip)));
    acts.push(Action::output(in_port));
    rev.instructions.push(Instruction::ApplyActions(acts));
    let _ = client_mac;
    encode(xid.wrapping_add(1), &rev, out).expect("encode rev");

    let mut actions = Actions::new();
    actions.push(Action::SetField(Oxm::eth_dst(BACKEND_MAC)));
    actions.push(Action::SetField(Oxm::ipv4_dst(BACKEND)));
    actions.push(Action::output(backend_port));
    let po = PacketOut {
        buffer_id: pi.buffer_id,
        in_port,
        actions,
        data: pi.data,
    };
    encode(xid.wrapping_add(2), &po, out).expect("encode packet-out");
    out.len()
}
