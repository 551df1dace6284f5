//! What the emulated switch sends, written straight into its buffers: the table-miss
//! PACKET_IN of any frame, the probes' SYNs from a prebuilt template, and the FLOW_REMOVED
//! of a rule that idles out.

use std::net::{Ipv4Addr, SocketAddrV4};

use bytes::{BufMut, BytesMut};
use flowgate_packet::{self as packet, MacAddr};
use ofp::{FlowModView, FlowRemovedReason, MsgType, PacketInReason};

use super::SwitchPlan;

/// Bytes of a PACKET_IN before its data: header, the fixed fields, a match of `in_port`
/// alone (12 bytes, padded to 16, §7.2.2) and 2 bytes of padding (§7.4.1).
const PACKET_IN_HEAD: usize = ofp::HEADER_LEN + 16 + 16 + 2;

/// Append the OFPT_PACKET_IN of a table miss (no buffer, cookie all ones, table 0, match
/// `in_port`) carrying `data`: the bytes `ofp::encode` writes for that `Message::PacketIn`
/// (tested), without building one.
pub(super) fn put_packet_in(out: &mut BytesMut, xid: u32, in_port: u32, data: &[u8]) {
    let Ok(len) = u16::try_from(PACKET_IN_HEAD + data.len()) else {
        return; // Never: the switch's own frames are at most a few hundred bytes.
    };
    out.reserve(usize::from(len));
    out.put_u8(ofp::OFP_VERSION);
    out.put_u8(MsgType::PacketIn as u8);
    out.put_u16(len);
    out.put_u32(xid);
    out.put_u32(ofp::NO_BUFFER);
    out.put_u16(data.len() as u16);
    out.put_u8(PacketInReason::NoMatch.to_raw());
    out.put_u8(0);
    out.put_u64(u64::MAX);
    // OFPMT_OXM, length 12: one OXM, OFB_IN_PORT (class 0x8000, field 0, 4 bytes).
    out.put_u16(ofp::oxm::OFPMT_OXM);
    out.put_u16(12);
    out.put_u32(0x8000_0004);
    out.put_u32(in_port);
    out.put_bytes(0, 4 + 2);
    out.put_slice(data);
}

/// The FLOW_REMOVEDs of a probe's rules, encoded (two of ~110 bytes, inline: no
/// allocation per probe).
pub(super) type Removals = smallvec::SmallVec<[u8; 256]>;

/// Append the OFPT_FLOW_REMOVED (§7.4.2) a switch sends when the rule of `fm` idles out
/// (after one 74-byte packet, with xid 0): the bytes `ofp::encode` writes for that
/// `Message::FlowRemoved` (tested), copied from the FLOW_MOD's match rather than decoded
/// into one and encoded again (with `--expire-after`, `Oxm::decode` and `Oxm::encode` were
/// 13 % of the bench thread's samples, and the allocations around them 24 %).
pub(super) fn put_flow_removed(out: &mut Removals, fm: &FlowModView<'_>) {
    let fields: usize = fm.match_fields().map(|o| o.as_bytes().len()).sum();
    let match_len = 4 + fields;
    let pad = (8 - match_len % 8) % 8;
    let Ok(len) = u16::try_from(ofp::HEADER_LEN + 40 + match_len + pad) else {
        return; // Never: the FLOW_MOD that carried the match fit in 64 KiB with more.
    };
    let idle = fm.idle_timeout();
    let mut head = [0u8; ofp::HEADER_LEN + 44];
    head[0] = ofp::OFP_VERSION;
    head[1] = MsgType::FlowRemoved as u8;
    head[2..4].copy_from_slice(&len.to_be_bytes());
    // xid 0 (4..8); then cookie, priority, reason, table_id.
    head[8..16].copy_from_slice(&fm.cookie().to_be_bytes());
    head[16..18].copy_from_slice(&fm.priority().to_be_bytes());
    head[18] = FlowRemovedReason::IdleTimeout.to_raw();
    head[19] = fm.table_id();
    // duration_sec (the idle timeout it waited), duration_nsec 0, the timeouts.
    head[20..24].copy_from_slice(&u32::from(idle).to_be_bytes());
    head[28..30].copy_from_slice(&idle.to_be_bytes());
    head[30..32].copy_from_slice(&fm.hard_timeout().to_be_bytes());
    // packet_count 3, byte_count 254: a short connection's client ACK, request and FIN
    // (its SYN came up as a PACKET_IN). A rule that ends having carried one packet or none
    // is a connection ended in its handshake, which the controller remembers for the
    // client's retransmitted SYN (`Handshakes::remember_aborted`): not what this bench's
    // connections are.
    head[32..40].copy_from_slice(&3u64.to_be_bytes());
    head[40..48].copy_from_slice(&254u64.to_be_bytes());
    // ofp_match: OFPMT_OXM and its length without padding (§7.2.2).
    head[48..50].copy_from_slice(&ofp::oxm::OFPMT_OXM.to_be_bytes());
    head[50..52].copy_from_slice(&(match_len as u16).to_be_bytes());
    out.extend_from_slice(&head);
    for o in fm.match_fields() {
        out.extend_from_slice(o.as_bytes());
    }
    out.extend_from_slice(&[0u8; 8][..pad]);
}

/// A probe's PACKET_IN, built once: per probe only the xid, the MACs, the client's address
/// and port and the ISN change, and the two checksums are recomputed (40 bytes summed),
/// where building the SYN afresh took etherparse's header serialization and checksums.
pub(super) struct SynTemplate {
    msg: Vec<u8>,
}

/// Offsets in a probe's frame: Ethernet, IPv4 (20 bytes, no options), TCP (20 bytes).
const ETH_DST: usize = 0;
const ETH_SRC: usize = 6;
const IP: usize = 14;
const IP_CSUM: usize = IP + 10;
const IP_SRC: usize = IP + 12;
const TCP: usize = IP + 20;
const TCP_SPORT: usize = TCP;
const TCP_SEQ: usize = TCP + 4;
const TCP_CSUM: usize = TCP + 16;

impl SynTemplate {
    pub(super) fn new(plan: &SwitchPlan) -> SynTemplate {
        let syn = packet::tcp_syn(
            plan.client_mac,
            MacAddr::ZERO,
            SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0),
            SocketAddrV4::new(plan.vip, plan.vport),
            0,
        );
        let mut msg = BytesMut::new();
        put_packet_in(&mut msg, 0, plan.client_port, &syn);
        SynTemplate { msg: msg.to_vec() }
    }

    /// Append probe PACKET_IN `xid`: the SYN from `client` with sequence number `isn`.
    pub(super) fn put(
        &self,
        out: &mut BytesMut,
        xid: u32,
        src_mac: MacAddr,
        dst_mac: MacAddr,
        client: (Ipv4Addr, u16),
        isn: u32,
    ) {
        let at = out.len();
        out.extend_from_slice(&self.msg);
        let Some(m) = out.get_mut(at..) else {
            return;
        };
        m[4..8].copy_from_slice(&xid.to_be_bytes());
        let f = &mut m[PACKET_IN_HEAD..];
        f[ETH_DST..ETH_DST + 6].copy_from_slice(&dst_mac.0);
        f[ETH_SRC..ETH_SRC + 6].copy_from_slice(&src_mac.0);
        f[IP_SRC..IP_SRC + 4].copy_from_slice(&client.0.octets());
        f[TCP_SPORT..TCP_SPORT + 2].copy_from_slice(&client.1.to_be_bytes());
        f[TCP_SEQ..TCP_SEQ + 4].copy_from_slice(&isn.to_be_bytes());
        // RFC 791 / RFC 793 checksums: the IPv4 header; the TCP header (no payload) with
        // the pseudo-header (addresses, protocol, TCP length).
        f[IP_CSUM..IP_CSUM + 2].fill(0);
        let ip = packet::internet_checksum(packet::ones_complement_sum(0, &f[IP..TCP]));
        f[IP_CSUM..IP_CSUM + 2].copy_from_slice(&ip.to_be_bytes());
        f[TCP_CSUM..TCP_CSUM + 2].fill(0);
        let pseudo =
            packet::ones_complement_sum(u32::from(packet::IP_PROTO_TCP) + 20, &f[IP_SRC..TCP]);
        let tcp = packet::internet_checksum(packet::ones_complement_sum(pseudo, &f[TCP..TCP + 20]));
        f[TCP_CSUM..TCP_CSUM + 2].copy_from_slice(&tcp.to_be_bytes());
    }
}
