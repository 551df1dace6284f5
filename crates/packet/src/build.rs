//! Builders for the frames the controller sends in PACKET_OUT: ARP replies and requests,
//! TCP resets, LLDP probes, and plain TCP/UDP segments for tests and benchmarks.
//!
//! These allocate (they are off the hot path). Frames shorter than the Ethernet minimum
//! are zero-padded to [`ETH_MIN_FRAME_LEN`] bytes, as a host's NIC would pad them; the IP
//! length fields keep the padding out of the datagram.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV4};

use bytes::Bytes;
use etherparse::{IpNumber, Ipv4Header, Ipv6Header, TcpHeader, UdpHeader};

use crate::checksum::{internet_checksum, ones_complement_sum};
use crate::frame::{Arp, Frame, L3, L4, Tcp, TcpFlags};
use crate::lldp::{
    CHASSIS_SUBTYPE_LOCAL, DPID_PREFIX, FLOWGATE_OUI, LldpKey, ORG_SUBTYPE_TAG,
    PORT_SUBTYPE_COMPONENT, TLV_CHASSIS_ID, TLV_END, TLV_ORG, TLV_PORT_ID, TLV_TTL, lldp_tag,
    push_tlv,
};
use crate::mac::MacAddr;
use crate::{
    ARP_OP_REPLY, ARP_OP_REQUEST, ETH_TYPE_ARP, ETH_TYPE_IPV4, ETH_TYPE_IPV6, ETH_TYPE_LLDP,
    ETH_TYPE_VLAN,
};

/// Minimum Ethernet frame length without the FCS (IEEE 802.3: 64 bytes with it).
pub const ETH_MIN_FRAME_LEN: usize = 60;

/// The nearest-bridge group address LLDP is sent to: `01:80:c2:00:00:0e` (802.1AB
/// §7.1). Bridges never forward it, so a probe crosses exactly one link.
pub const LLDP_MULTICAST: MacAddr = MacAddr([0x01, 0x80, 0xc2, 0x00, 0x00, 0x0e]);

/// TTL / hop limit of the IP packets we originate (RFC 1700's recommended default).
const DEFAULT_TTL: u8 = 64;

fn eth_header(out: &mut Vec<u8>, dst: MacAddr, src: MacAddr, vlan: Option<u16>, ethertype: u16) {
    out.extend_from_slice(&dst.0);
    out.extend_from_slice(&src.0);
    if let Some(vid) = vlan {
        out.extend_from_slice(&ETH_TYPE_VLAN.to_be_bytes());
        out.extend_from_slice(&(vid & 0x0fff).to_be_bytes());
    }
    out.extend_from_slice(&ethertype.to_be_bytes());
}

fn finish(mut out: Vec<u8>) -> Bytes {
    if out.len() < ETH_MIN_FRAME_LEN {
        out.resize(ETH_MIN_FRAME_LEN, 0);
    }
    Bytes::from(out)
}

/// An ARP packet for IPv4 over Ethernet (RFC 826) in an Ethernet frame, optionally
/// 802.1Q-tagged.
pub fn arp_frame(eth_src: MacAddr, eth_dst: MacAddr, vlan: Option<u16>, arp: &Arp) -> Bytes {
    let mut out = Vec::with_capacity(ETH_MIN_FRAME_LEN + 4);
    eth_header(&mut out, eth_dst, eth_src, vlan, ETH_TYPE_ARP);
    out.extend_from_slice(&1u16.to_be_bytes()); // hardware type: Ethernet
    out.extend_from_slice(&ETH_TYPE_IPV4.to_be_bytes()); // protocol type: IPv4
    out.extend_from_slice(&[6, 4]); // address lengths
    out.extend_from_slice(&arp.op.to_be_bytes());
    out.extend_from_slice(&arp.sha.0);
    out.extend_from_slice(&arp.spa.octets());
    out.extend_from_slice(&arp.tha.0);
    out.extend_from_slice(&arp.tpa.octets());
    finish(out)
}

/// The reply to an ARP request, saying `req.tpa` is at `answer_mac`.
///
/// RFC 826 ("Packet Reception"): swap the sender and target fields, put the local
/// hardware and protocol addresses in the sender fields, set the opcode to reply, and
/// send it to the old sender's hardware address. Ethernet source is `answer_mac`,
/// destination `req.sha`.
pub fn arp_reply(req: &Arp, answer_mac: MacAddr) -> Bytes {
    let reply = Arp {
        op: ARP_OP_REPLY,
        sha: answer_mac,
        spa: req.tpa,
        tha: req.sha,
        tpa: req.spa,
    };
    arp_frame(answer_mac, req.sha, None, &reply)
}

/// A broadcast "who-has `tpa`? tell `spa`" (target hardware address zero).
pub fn arp_request(sha: MacAddr, spa: Ipv4Addr, tpa: Ipv4Addr) -> Bytes {
    let req = Arp {
        op: ARP_OP_REQUEST,
        sha,
        spa,
        tha: MacAddr::ZERO,
        tpa,
    };
    arp_frame(sha, MacAddr::BROADCAST, None, &req)
}

/// A TCP segment over IPv4 in an Ethernet frame; see [`ipv4_tcp`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpSegment<'a> {
    /// Ethernet source.
    pub eth_src: MacAddr,
    /// Ethernet destination.
    pub eth_dst: MacAddr,
    /// 802.1Q VLAN id to tag the frame with.
    pub vlan: Option<u16>,
    /// IPv4 source.
    pub ip_src: Ipv4Addr,
    /// IPv4 destination.
    pub ip_dst: Ipv4Addr,
    /// IPv4 TTL.
    pub ttl: u8,
    /// TCP source port.
    pub src_port: u16,
    /// TCP destination port.
    pub dst_port: u16,
    /// Sequence number.
    pub seq: u32,
    /// Acknowledgment number (written whether or not ACK is set).
    pub ack: u32,
    /// Control bits.
    pub flags: TcpFlags,
    /// Receive window.
    pub window: u16,
    /// Data.
    pub payload: &'a [u8],
}

impl Default for TcpSegment<'_> {
    fn default() -> Self {
        TcpSegment {
            eth_src: MacAddr::ZERO,
            eth_dst: MacAddr::ZERO,
            vlan: None,
            ip_src: Ipv4Addr::UNSPECIFIED,
            ip_dst: Ipv4Addr::UNSPECIFIED,
            ttl: DEFAULT_TTL,
            src_port: 0,
            dst_port: 0,
            seq: 0,
            ack: 0,
            flags: TcpFlags::NONE,
            window: 64240,
            payload: &[],
        }
    }
}

fn tcp_header(seg: &Tcp<'_>, window: u16) -> TcpHeader {
    let mut h = TcpHeader::new(seg.src_port, seg.dst_port, seg.seq, window);
    h.acknowledgment_number = seg.ack;
    let f = seg.flags;
    h.fin = f.fin();
    h.syn = f.syn();
    h.rst = f.rst();
    h.psh = f.psh();
    h.ack = f.ack();
    h.urg = f.urg();
    h.ece = f.contains(TcpFlags::ECE);
    h.cwr = f.contains(TcpFlags::CWR);
    h
}

/// The IP layer of a TCP segment we build.
enum IpPair {
    V4 {
        src: Ipv4Addr,
        dst: Ipv4Addr,
        ttl: u8,
    },
    V6 {
        src: Ipv6Addr,
        dst: Ipv6Addr,
        hop_limit: u8,
    },
}

/// Largest TCP payload that fits one IPv4 datagram with option-less headers.
const MAX_TCP_PAYLOAD_V4: usize = u16::MAX as usize - Ipv4Header::MIN_LEN - TcpHeader::MIN_LEN;
/// Largest UDP payload that fits one IPv4 datagram.
const MAX_UDP_PAYLOAD_V4: usize = u16::MAX as usize - Ipv4Header::MIN_LEN - UdpHeader::LEN;

fn tcp_frame(
    eth_src: MacAddr,
    eth_dst: MacAddr,
    vlan: Option<u16>,
    ip: IpPair,
    mut tcp: TcpHeader,
    payload: &[u8],
) -> Bytes {
    // Callers keep payload within MAX_TCP_PAYLOAD_V4, so the length casts below are exact
    // and etherparse's length checks cannot fail; a failure would leave checksum 0.
    let seg_len = tcp.header_len() + payload.len();
    let mut out = Vec::with_capacity(18 + 40 + seg_len);
    match ip {
        IpPair::V4 { src, dst, ttl } => {
            eth_header(&mut out, eth_dst, eth_src, vlan, ETH_TYPE_IPV4);
            let mut h = Ipv4Header::new(
                seg_len as u16,
                ttl,
                IpNumber::TCP,
                src.octets(),
                dst.octets(),
            )
            .unwrap_or_else(|_| Ipv4Header {
                total_len: u16::MAX,
                ..Default::default()
            });
            h.header_checksum = h.calc_header_checksum();
            tcp.checksum = tcp.calc_checksum_ipv4(&h, payload).unwrap_or(0);
            out.extend_from_slice(&h.to_bytes());
        }
        IpPair::V6 {
            src,
            dst,
            hop_limit,
        } => {
            eth_header(&mut out, eth_dst, eth_src, vlan, ETH_TYPE_IPV6);
            let h = Ipv6Header {
                payload_length: seg_len as u16,
                next_header: IpNumber::TCP,
                hop_limit,
                source: src.octets(),
                destination: dst.octets(),
                ..Default::default()
            };
            tcp.checksum = tcp.calc_checksum_ipv6(&h, payload).unwrap_or(0);
            out.extend_from_slice(&h.to_bytes());
        }
    }
    out.extend_from_slice(&tcp.to_bytes());
    out.extend_from_slice(payload);
    finish(out)
}

/// An Ethernet / IPv4 / TCP frame (no IP or TCP options, DF set) with valid IPv4 header
/// and TCP checksums. For tests, benchmarks and the load generator.
///
/// # Panics
///
/// If `seg.payload` is longer than 65 495 bytes, which no IPv4 datagram can carry.
pub fn ipv4_tcp(seg: &TcpSegment<'_>) -> Bytes {
    assert!(
        seg.payload.len() <= MAX_TCP_PAYLOAD_V4,
        "TCP payload too large for IPv4"
    );
    let view = Tcp {
        src_port: seg.src_port,
        dst_port: seg.dst_port,
        seq: seg.seq,
        ack: seg.ack,
        flags: seg.flags,
        payload: seg.payload,
    };
    tcp_frame(
        seg.eth_src,
        seg.eth_dst,
        seg.vlan,
        IpPair::V4 {
            src: seg.ip_src,
            dst: seg.ip_dst,
            ttl: seg.ttl,
        },
        tcp_header(&view, seg.window),
        seg.payload,
    )
}

/// A client's opening SYN from `src` to `dst` (no options, window 64240, TTL 64).
pub fn tcp_syn(
    eth_src: MacAddr,
    eth_dst: MacAddr,
    src: SocketAddrV4,
    dst: SocketAddrV4,
    seq: u32,
) -> Bytes {
    ipv4_tcp(&TcpSegment {
        eth_src,
        eth_dst,
        ip_src: *src.ip(),
        ip_dst: *dst.ip(),
        src_port: src.port(),
        dst_port: dst.port(),
        seq,
        flags: TcpFlags::SYN,
        ..TcpSegment::default()
    })
}

/// An Ethernet / IPv4 / UDP frame with valid checksums (TTL 64).
///
/// # Panics
///
/// If `payload` is longer than 65 507 bytes.
pub fn ipv4_udp(
    eth_src: MacAddr,
    eth_dst: MacAddr,
    src: SocketAddrV4,
    dst: SocketAddrV4,
    payload: &[u8],
) -> Bytes {
    assert!(
        payload.len() <= MAX_UDP_PAYLOAD_V4,
        "UDP payload too large for IPv4"
    );
    let udp_len = UdpHeader::LEN + payload.len();
    let mut out = Vec::with_capacity(14 + 20 + udp_len);
    eth_header(&mut out, eth_dst, eth_src, None, ETH_TYPE_IPV4);
    let mut ip = Ipv4Header::new(
        udp_len as u16,
        DEFAULT_TTL,
        IpNumber::UDP,
        src.ip().octets(),
        dst.ip().octets(),
    )
    .unwrap_or_default();
    ip.header_checksum = ip.calc_header_checksum();
    let udp =
        UdpHeader::with_ipv4_checksum(src.port(), dst.port(), &ip, payload).unwrap_or_default();
    out.extend_from_slice(&ip.to_bytes());
    out.extend_from_slice(&udp.to_bytes());
    out.extend_from_slice(payload);
    finish(out)
}

/// The reset a host with no connection would send in answer to `frame`, or `None` if
/// `frame` is not a TCP segment (over IPv4 or IPv6) or is itself a reset.
///
/// RFC 9293 §3.10.7.1 (CLOSED state), after RFC 793 §3.4 "Reset Generation":
///
/// > An incoming segment containing a RST is discarded. An incoming segment not
/// > containing a RST causes a RST to be sent in response. [...] If the ACK bit is off,
/// > sequence number zero is used, `<SEQ=0><ACK=SEG.SEQ+SEG.LEN><CTL=RST,ACK>`. If the
/// > ACK bit is on, `<SEQ=SEG.ACK><CTL=RST>`.
///
/// SEG.LEN counts the data plus one for SYN and one for FIN (RFC 9293 §3.4). The data
/// length is that of `Tcp::payload`, so a frame cut short by the switch's `max_len`
/// understates it; the controller should pass whole frames (it does: it asks for
/// `OFPCML_NO_BUFFER`).
///
/// The reset goes back the way the segment came: MAC and IP addresses and ports
/// swapped, the same VLAN tag, window 0, TTL 64, valid checksums.
pub fn tcp_rst(frame: &Frame<'_>) -> Option<Bytes> {
    let (ip, tcp) = match &frame.l3 {
        L3::Ipv4(ip) => match &ip.l4 {
            L4::Tcp(t) => (
                IpPair::V4 {
                    src: ip.dst,
                    dst: ip.src,
                    ttl: DEFAULT_TTL,
                },
                t,
            ),
            _ => return None,
        },
        L3::Ipv6(ip) => match &ip.l4 {
            L4::Tcp(t) => (
                IpPair::V6 {
                    src: ip.dst,
                    dst: ip.src,
                    hop_limit: DEFAULT_TTL,
                },
                t,
            ),
            _ => return None,
        },
        _ => return None,
    };
    let (seq, ack, flags) = rst_numbers(tcp)?;
    let rst = Tcp {
        src_port: tcp.dst_port,
        dst_port: tcp.src_port,
        seq,
        ack,
        flags,
        payload: &[],
    };
    Some(tcp_frame(
        frame.eth_dst,
        frame.eth_src,
        frame.vlan,
        ip,
        tcp_header(&rst, 0),
        &[],
    ))
}

/// The sequence and acknowledgment numbers and the flags of the reset answering `tcp`,
/// or `None` for a segment that must not be answered.
fn rst_numbers(tcp: &Tcp<'_>) -> Option<(u32, u32, TcpFlags)> {
    if tcp.flags.rst() {
        // "An incoming segment containing a RST is discarded." (RFC 9293 §3.10.7.1)
        return None;
    }
    Some(if tcp.flags.ack() {
        (tcp.ack, 0, TcpFlags::RST)
    } else {
        let seg_len = (tcp.payload.len() as u32)
            .wrapping_add(u32::from(tcp.flags.syn()))
            .wrapping_add(u32::from(tcp.flags.fin()));
        (
            0,
            tcp.seq.wrapping_add(seg_len),
            TcpFlags::RST | TcpFlags::ACK,
        )
    })
}

/// The frame [`tcp_rst_v4`] builds: Ethernet (one VLAN tag at most), IPv4 and TCP
/// headers without options, 58 bytes at most, padded to [`ETH_MIN_FRAME_LEN`].
pub const TCP_RST_V4_LEN: usize = ETH_MIN_FRAME_LEN;

/// [`tcp_rst`] for a segment over IPv4, without allocating: the same bytes, or `None`
/// where `tcp_rst` would send none or the segment is not over IPv4 (an IPv6 reset goes
/// through `tcp_rst`). A controller that refuses SYNs to shed load sends one per SYN, so
/// this is on its overload path: etherparse's header types and the frame's allocation
/// were 40 % of the instructions of a refused SYN.
pub fn tcp_rst_v4(frame: &Frame<'_>) -> Option<[u8; TCP_RST_V4_LEN]> {
    let L3::Ipv4(ip) = &frame.l3 else {
        return None;
    };
    let L4::Tcp(tcp) = &ip.l4 else {
        return None;
    };
    let (seq, ack, flags) = rst_numbers(tcp)?;
    let mut out = [0u8; TCP_RST_V4_LEN];
    // Back the way the segment came: addresses and ports swapped.
    out[0..6].copy_from_slice(&frame.eth_src.0);
    out[6..12].copy_from_slice(&frame.eth_dst.0);
    let mut at = 12;
    if let Some(vid) = frame.vlan {
        out[12..14].copy_from_slice(&ETH_TYPE_VLAN.to_be_bytes());
        out[14..16].copy_from_slice(&(vid & 0x0fff).to_be_bytes());
        at = 16;
    }
    out[at..at + 2].copy_from_slice(&ETH_TYPE_IPV4.to_be_bytes());
    let (src, dst) = (ip.dst.octets(), ip.src.octets());
    // RFC 791: version 4, IHL 5; total length 40; identification 0; DF; no fragment.
    let ip_at = at + 2;
    let h = &mut out[ip_at..ip_at + 20];
    h[..10].copy_from_slice(&[0x45, 0, 0, 40, 0, 0, 0x40, 0, DEFAULT_TTL, 6]);
    h[12..16].copy_from_slice(&src);
    h[16..20].copy_from_slice(&dst);
    let csum = internet_checksum(ones_complement_sum(0, h));
    h[10..12].copy_from_slice(&csum.to_be_bytes());
    // RFC 9293 §3.1: data offset 5, window 0, no urgent pointer.
    let tcp_at = ip_at + 20;
    let t = &mut out[tcp_at..tcp_at + 20];
    t[0..2].copy_from_slice(&tcp.dst_port.to_be_bytes());
    t[2..4].copy_from_slice(&tcp.src_port.to_be_bytes());
    t[4..8].copy_from_slice(&seq.to_be_bytes());
    t[8..12].copy_from_slice(&ack.to_be_bytes());
    t[12] = 5 << 4;
    t[13] = flags.0;
    // The checksum covers the pseudo-header: addresses, protocol 6, TCP length 20.
    let pseudo = ones_complement_sum(ones_complement_sum(6 + 20, &src), &dst);
    let csum = internet_checksum(ones_complement_sum(pseudo, t));
    t[16..18].copy_from_slice(&csum.to_be_bytes());
    Some(out)
}

/// An LLDP topology probe from port `port_no` of switch `dpid`, sent from `src_mac` to
/// the nearest-bridge address [`LLDP_MULTICAST`].
///
/// Carries the three mandatory TLVs of 802.1AB §8.2 and End: Chassis ID subtype 7
/// (locally assigned) `dpid:%016x`, Port ID subtype 2 (port component) holding the port
/// number as 4 big-endian bytes, and TTL; then our tag under `key` ([`lldp_tag`]) in an
/// organizationally specific TLV. [`crate::parse`] reads them back into [`crate::Lldp`].
pub fn lldp_probe(src_mac: MacAddr, dpid: u64, port_no: u32, ttl: u16, key: &LldpKey) -> Bytes {
    let mut out = Vec::with_capacity(ETH_MIN_FRAME_LEN);
    eth_header(&mut out, LLDP_MULTICAST, src_mac, None, ETH_TYPE_LLDP);
    let mut chassis = [0u8; 1 + 5 + 16];
    chassis[0] = CHASSIS_SUBTYPE_LOCAL;
    chassis[1..6].copy_from_slice(DPID_PREFIX);
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for (i, slot) in chassis[6..].iter_mut().enumerate() {
        *slot = HEX[((dpid >> (60 - 4 * i)) & 0xf) as usize];
    }
    push_tlv(&mut out, TLV_CHASSIS_ID, &chassis);
    let mut port = [0u8; 5];
    port[0] = PORT_SUBTYPE_COMPONENT;
    port[1..].copy_from_slice(&port_no.to_be_bytes());
    push_tlv(&mut out, TLV_PORT_ID, &port);
    push_tlv(&mut out, TLV_TTL, &ttl.to_be_bytes());
    let mut org = [0u8; 3 + 1 + 8];
    org[..3].copy_from_slice(&FLOWGATE_OUI);
    org[3] = ORG_SUBTYPE_TAG;
    org[4..].copy_from_slice(&lldp_tag(key, dpid, port_no).to_be_bytes());
    push_tlv(&mut out, TLV_ORG, &org);
    push_tlv(&mut out, TLV_END, &[]);
    finish(out)
}
