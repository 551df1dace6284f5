//! The controller's hot path, shared by tests/no_alloc.rs and benches/roundtrip.rs:
//! decode a PACKET_IN carrying a TCP SYN, answer with two FLOW_MODs (forward and reverse
//! NAT rules) and a PACKET_OUT of the same frame.
#![allow(dead_code, unreachable_pub)]

use std::net::Ipv4Addr;

use bytes::{Bytes, BytesMut};
use ofp::{
    Action, FlowMod, FlowModFlags, Instruction, Match, Message, Oxm, PacketIn, PacketInReason, PacketOut, decode, encode,
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
    u16::from_be_bytes([d.get(at).copied().unwrap_or(0), d.get(at + 1).copied().unwrap_or(0)])
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
    let Ok((xid, Message::PacketIn(pi))) = decode(frame.clone()) else { panic!("not a packet-in") };
    let in_port = pi.in_port().unwrap_or(0);
    let d = &pi.data[..];
    let (client_mac, client_ip, vip) = (mac(d, 6), ip(d, 26), ip(d, 30));
    let (sport, dport) = (be16(d, 34), be16(d, 36));
    let backend_port = 7;

    let fwd = FlowMod::add(
        Match::new()
            .with(Oxm::InPort(in_port))
            .with(Oxm::EthType(0x0800))
            .with(Oxm::IpProto(6))
            .with(Oxm::ipv4_src(client_ip))
            .with(Oxm::ipv4_dst(vip))
            .with(Oxm::TcpSrc(sport))
            .with(Oxm::TcpDst(dport)),
    )
    .table(1)
    .priority(1000)
    .cookie(0x0300_0000_0000_0001)
    .timeouts(60, 0)
    .flags(FlowModFlags::SEND_FLOW_REM)
    .instruction(Instruction::ApplyActions(
        [Action::SetField(Oxm::eth_dst(BACKEND_MAC)), Action::SetField(Oxm::ipv4_dst(BACKEND)), Action::output(backend_port)]
            .into_iter()
            .collect(),
    ));
    encode(xid, &fwd, out).expect("encode fwd");

    let rev = FlowMod::add(
        Match::new()
            .with(Oxm::InPort(backend_port))
            .with(Oxm::EthType(0x0800))
            .with(Oxm::IpProto(6))
            .with(Oxm::ipv4_src(BACKEND))
            .with(Oxm::ipv4_dst(client_ip))
            .with(Oxm::TcpSrc(dport))
            .with(Oxm::TcpDst(sport)),
    )
    .table(1)
    .priority(1000)
    .cookie(0x0300_0000_0000_0002)
    .timeouts(60, 0)
    .instruction(Instruction::ApplyActions(
        [Action::SetField(Oxm::eth_src(VIP_MAC)), Action::SetField(Oxm::ipv4_src(vip)), Action::output(in_port)]
            .into_iter()
            .collect(),
    ));
    let _ = client_mac;
    encode(xid.wrapping_add(1), &rev, out).expect("encode rev");

    let po = PacketOut {
        buffer_id: pi.buffer_id,
        in_port,
        actions: [Action::SetField(Oxm::eth_dst(BACKEND_MAC)), Action::SetField(Oxm::ipv4_dst(BACKEND)), Action::output(backend_port)]
            .into_iter()
            .collect(),
        data: pi.data,
    };
    encode(xid.wrapping_add(2), &po, out).expect("encode packet-out");
    out.len()
}
