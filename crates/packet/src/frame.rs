//! Parse views: [`parse`] and the [`Frame`] it returns.
//!
//! Everything here borrows the input and is `Copy`; nothing allocates. See the crate
//! docs for how lengths are treated (truncated PACKET_IN data, Ethernet padding).

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};

use etherparse::{
    ArpHardwareId, ArpPacketSlice, EtherType, Ipv4HeaderSlice, Ipv6ExtensionsSlice,
    Ipv6HeaderSlice, TcpHeaderSlice, UdpHeaderSlice,
};

use crate::lldp::{self, Lldp};
use crate::mac::MacAddr;
use crate::{
    ETH_TYPE_ARP, ETH_TYPE_IPV4, ETH_TYPE_IPV6, ETH_TYPE_LLDP, ETH_TYPE_QINQ, ETH_TYPE_VLAN,
    IP_PROTO_ICMP, IP_PROTO_ICMPV6, IP_PROTO_TCP, IP_PROTO_UDP,
};

/// Length of an Ethernet II header (dst, src, EtherType).
const ETH_HEADER_LEN: usize = 14;
/// Length of one 802.1Q / 802.1ad tag (TCI + inner EtherType).
const VLAN_TAG_LEN: usize = 4;
/// Most tags we look through (802.1ad outer + 802.1Q inner).
const MAX_VLAN_TAGS: usize = 2;

/// A parsed Ethernet frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame<'a> {
    /// Ethernet source.
    pub eth_src: MacAddr,
    /// Ethernet destination.
    pub eth_dst: MacAddr,
    /// VLAN id (12 bits) of the outermost 802.1Q/802.1ad tag, if tagged. The outermost tag
    /// is the one `OXM_OF_VLAN_VID` matches (OpenFlow 1.3.5 §7.2.3.7).
    pub vlan: Option<u16>,
    /// The EtherType of the payload, after any VLAN tags.
    pub ethertype: u16,
    /// The payload.
    pub l3: L3<'a>,
}

impl<'a> Frame<'a> {
    /// The ARP packet, if this is one.
    pub fn arp(&self) -> Option<&Arp> {
        match &self.l3 {
            L3::Arp(a) => Some(a),
            _ => None,
        }
    }

    /// The IPv4 packet, if this is one.
    pub fn ipv4(&self) -> Option<&Ipv4<'a>> {
        match &self.l3 {
            L3::Ipv4(ip) => Some(ip),
            _ => None,
        }
    }

    /// The IPv6 packet, if this is one.
    pub fn ipv6(&self) -> Option<&Ipv6<'a>> {
        match &self.l3 {
            L3::Ipv6(ip) => Some(ip),
            _ => None,
        }
    }

    /// The LLDP data unit, if this is one.
    pub fn lldp(&self) -> Option<&Lldp> {
        match &self.l3 {
            L3::Lldp(l) => Some(l),
            _ => None,
        }
    }

    /// The L4 view of an IPv4 or IPv6 packet.
    pub fn l4(&self) -> Option<&L4<'a>> {
        match &self.l3 {
            L3::Ipv4(ip) => Some(&ip.l4),
            L3::Ipv6(ip) => Some(&ip.l4),
            _ => None,
        }
    }

    /// The TCP segment carried over IPv4 or IPv6, if any (and not truncated).
    pub fn tcp(&self) -> Option<&Tcp<'a>> {
        match self.l4() {
            Some(L4::Tcp(t)) => Some(t),
            _ => None,
        }
    }
}

/// The network-layer payload of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum L3<'a> {
    /// ARP for IPv4 over Ethernet.
    Arp(Arp),
    /// IPv4.
    Ipv4(Ipv4<'a>),
    /// IPv6.
    Ipv6(Ipv6<'a>),
    /// LLDP.
    Lldp(Lldp),
    /// Anything else (including ARP for other hardware/protocol types): the bytes after
    /// the EtherType.
    Other(&'a [u8]),
}

/// An ARP packet for IPv4 over Ethernet (RFC 826).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Arp {
    /// Operation: 1 request, 2 reply.
    pub op: u16,
    /// Sender hardware address.
    pub sha: MacAddr,
    /// Sender protocol address.
    pub spa: Ipv4Addr,
    /// Target hardware address.
    pub tha: MacAddr,
    /// Target protocol address.
    pub tpa: Ipv4Addr,
}

/// An IPv4 packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv4<'a> {
    /// Source address.
    pub src: Ipv4Addr,
    /// Destination address.
    pub dst: Ipv4Addr,
    /// Protocol number.
    pub protocol: u8,
    /// Time to live.
    pub ttl: u8,
    /// The transport payload. Non-first fragments are [`L4::Other`].
    pub l4: L4<'a>,
}

/// An IPv6 packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv6<'a> {
    /// Source address.
    pub src: Ipv6Addr,
    /// Destination address.
    pub dst: Ipv6Addr,
    /// The upper-layer protocol, after any extension headers (hop-by-hop, routing,
    /// destination options, fragment, authentication) have been skipped. If the
    /// extension chain is cut short, the Next Header of the fixed header.
    pub next_header: u8,
    /// The transport payload. Fragments are [`L4::Other`].
    pub l4: L4<'a>,
}

/// The transport payload of an IP packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum L4<'a> {
    /// TCP.
    Tcp(Tcp<'a>),
    /// UDP.
    Udp {
        /// Source port.
        src_port: u16,
        /// Destination port.
        dst_port: u16,
    },
    /// ICMP (over IPv4) or ICMPv6 (over IPv6).
    Icmp {
        /// Type.
        typ: u8,
        /// Code.
        code: u8,
    },
    /// Another protocol, a fragment that does not start the datagram, or a header we
    /// could not make sense of (e.g. a TCP data offset below 5): the IP payload.
    Other(&'a [u8]),
    /// The transport header is cut short (typically a PACKET_IN truncated to `max_len`).
    Truncated,
}

/// A TCP segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tcp<'a> {
    /// Source port.
    pub src_port: u16,
    /// Destination port.
    pub dst_port: u16,
    /// Sequence number.
    pub seq: u32,
    /// Acknowledgment number (meaningful if ACK is set).
    pub ack: u32,
    /// Control bits.
    pub flags: TcpFlags,
    /// The segment's data, after the header and options; ends at the IP length or at the
    /// end of the captured bytes, whichever comes first.
    pub payload: &'a [u8],
}

/// TCP control bits: the low byte of the flags field (CWR ECE URG ACK PSH RST SYN FIN).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct TcpFlags(pub u8);

impl TcpFlags {
    /// FIN.
    pub const FIN: TcpFlags = TcpFlags(0x01);
    /// SYN.
    pub const SYN: TcpFlags = TcpFlags(0x02);
    /// RST.
    pub const RST: TcpFlags = TcpFlags(0x04);
    /// PSH.
    pub const PSH: TcpFlags = TcpFlags(0x08);
    /// ACK.
    pub const ACK: TcpFlags = TcpFlags(0x10);
    /// URG.
    pub const URG: TcpFlags = TcpFlags(0x20);
    /// ECE.
    pub const ECE: TcpFlags = TcpFlags(0x40);
    /// CWR.
    pub const CWR: TcpFlags = TcpFlags(0x80);
    /// No bits.
    pub const NONE: TcpFlags = TcpFlags(0);

    /// True if every bit of `other` is set in `self`.
    pub const fn contains(self, other: TcpFlags) -> bool {
        self.0 & other.0 == other.0
    }
    /// SYN set.
    pub const fn syn(self) -> bool {
        self.contains(Self::SYN)
    }
    /// ACK set.
    pub const fn ack(self) -> bool {
        self.contains(Self::ACK)
    }
    /// RST set.
    pub const fn rst(self) -> bool {
        self.contains(Self::RST)
    }
    /// FIN set.
    pub const fn fin(self) -> bool {
        self.contains(Self::FIN)
    }
    /// PSH set.
    pub const fn psh(self) -> bool {
        self.contains(Self::PSH)
    }
    /// URG set.
    pub const fn urg(self) -> bool {
        self.contains(Self::URG)
    }
    /// The first segment of a three-way handshake: SYN without ACK (RFC 9293 §3.5).
    pub const fn is_initial_syn(self) -> bool {
        self.syn() && !self.ack()
    }
}

impl std::ops::BitOr for TcpFlags {
    type Output = TcpFlags;
    fn bitor(self, rhs: TcpFlags) -> TcpFlags {
        TcpFlags(self.0 | rhs.0)
    }
}

impl std::ops::BitOrAssign for TcpFlags {
    fn bitor_assign(&mut self, rhs: TcpFlags) {
        self.0 |= rhs.0;
    }
}

impl std::ops::BitAnd for TcpFlags {
    type Output = TcpFlags;
    fn bitand(self, rhs: TcpFlags) -> TcpFlags {
        TcpFlags(self.0 & rhs.0)
    }
}

impl fmt::Debug for TcpFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const NAMES: [&str; 8] = ["FIN", "SYN", "RST", "PSH", "ACK", "URG", "ECE", "CWR"];
        write!(f, "TcpFlags(")?;
        let mut first = true;
        for (bit, name) in NAMES.iter().enumerate() {
            if self.0 & (1 << bit) != 0 {
                if !first {
                    write!(f, "|")?;
                }
                write!(f, "{name}")?;
                first = false;
            }
        }
        write!(f, ")")
    }
}

/// Which header a [`ParseError`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Layer {
    /// Ethernet II header.
    Ethernet,
    /// 802.1Q / 802.1ad tag.
    Vlan,
    /// ARP.
    Arp,
    /// IPv4 header.
    Ipv4,
    /// IPv6 fixed header.
    Ipv6,
}

impl fmt::Display for Layer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Layer::Ethernet => "Ethernet",
            Layer::Vlan => "VLAN",
            Layer::Arp => "ARP",
            Layer::Ipv4 => "IPv4",
            Layer::Ipv6 => "IPv6",
        })
    }
}

/// Why a frame could not be parsed. Problems above the network layer are not errors:
/// they show up as [`L4::Truncated`] or [`L4::Other`], so the addresses stay usable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum ParseError {
    /// The data ends inside this header.
    #[error("frame truncated in the {0} header")]
    Truncated(Layer),
    /// This header is invalid (wrong IP version, IHL below 5, total length shorter than
    /// the header).
    #[error("malformed {0} header")]
    Malformed(Layer),
}

#[inline]
fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

#[inline]
fn mac_at(b: &[u8], at: usize) -> MacAddr {
    MacAddr([b[at], b[at + 1], b[at + 2], b[at + 3], b[at + 4], b[at + 5]])
}

/// Parses an Ethernet II frame (without FCS), as carried in PACKET_IN data.
///
/// Looks through up to two VLAN tags (802.1ad, 802.1Q). Never allocates, never panics.
pub fn parse(data: &[u8]) -> Result<Frame<'_>, ParseError> {
    if data.len() < ETH_HEADER_LEN {
        return Err(ParseError::Truncated(Layer::Ethernet));
    }
    let eth_dst = mac_at(data, 0);
    let eth_src = mac_at(data, 6);
    let mut ethertype = be16(data, 12);
    let mut rest = &data[ETH_HEADER_LEN..];
    let mut vlan = None;
    let mut tags = 0;
    while (ethertype == ETH_TYPE_VLAN || ethertype == ETH_TYPE_QINQ) && tags < MAX_VLAN_TAGS {
        if rest.len() < VLAN_TAG_LEN {
            return Err(ParseError::Truncated(Layer::Vlan));
        }
        let tci = be16(rest, 0);
        vlan.get_or_insert(tci & 0x0fff);
        ethertype = be16(rest, 2);
        rest = &rest[VLAN_TAG_LEN..];
        tags += 1;
    }
    let l3 = match ethertype {
        ETH_TYPE_ARP => parse_arp(rest)?,
        ETH_TYPE_IPV4 => L3::Ipv4(parse_ipv4(rest)?),
        ETH_TYPE_IPV6 => L3::Ipv6(parse_ipv6(rest)?),
        ETH_TYPE_LLDP => L3::Lldp(lldp::parse(rest)),
        _ => L3::Other(rest),
    };
    Ok(Frame {
        eth_src,
        eth_dst,
        vlan,
        ethertype,
        l3,
    })
}

/// The addresses and ports of an IPv4 TCP segment: `(src, dst, src_port, dst_port)`,
/// read at their offsets without checking the rest. For a hint, such as which line of a
/// table to prefetch, where a wrong answer costs a useless load and a whole [`parse`]
/// would be paid twice. Whenever [`parse`] finds an IPv4 TCP segment, this gives its
/// addresses and ports; it may give some for a frame [`parse`] refuses. Never panics.
#[inline]
pub fn ipv4_tcp_tuple(data: &[u8]) -> Option<(Ipv4Addr, Ipv4Addr, u16, u16)> {
    let be16_at = |b: &[u8], at: usize| b.get(at..at + 2).map(|x| u16::from_be_bytes([x[0], x[1]]));
    let mut ethertype = be16_at(data, 12)?;
    let mut at = ETH_HEADER_LEN;
    // The same tags as `parse` looks through.
    let mut tags = 0;
    while (ethertype == ETH_TYPE_VLAN || ethertype == ETH_TYPE_QINQ) && tags < MAX_VLAN_TAGS {
        ethertype = be16_at(data, at + 2)?;
        at += VLAN_TAG_LEN;
        tags += 1;
    }
    if ethertype != ETH_TYPE_IPV4 {
        return None;
    }
    let ip = data.get(at..)?;
    let header_len = usize::from(ip.first()? & 0x0f) * 4;
    // RFC 791: only the fragment with offset 0 carries the transport header.
    if ip.get(9) != Some(&IP_PROTO_TCP) || be16_at(ip, 6)? & 0x1fff != 0 {
        return None;
    }
    let addr = |at: usize| -> Option<Ipv4Addr> {
        let b: [u8; 4] = ip.get(at..at + 4)?.try_into().ok()?;
        Some(Ipv4Addr::from(b))
    };
    let tcp = ip.get(header_len..)?;
    Some((addr(12)?, addr(16)?, be16_at(tcp, 0)?, be16_at(tcp, 2)?))
}

fn parse_arp(data: &[u8]) -> Result<L3<'_>, ParseError> {
    let arp = ArpPacketSlice::from_slice(data).map_err(|_| ParseError::Truncated(Layer::Arp))?;
    // RFC 826 is generic over hardware and protocol; we only speak IPv4 over Ethernet.
    if arp.hw_addr_type() != ArpHardwareId::ETHERNET
        || arp.proto_addr_type() != EtherType::IPV4
        || arp.hw_addr_size() != 6
        || arp.proto_addr_size() != 4
    {
        return Ok(L3::Other(data));
    }
    let (sha, spa, tha, tpa) = (
        arp.sender_hw_addr(),
        arp.sender_protocol_addr(),
        arp.target_hw_addr(),
        arp.target_protocol_addr(),
    );
    Ok(L3::Arp(Arp {
        op: arp.operation().0,
        sha: mac_at(sha, 0),
        spa: Ipv4Addr::new(spa[0], spa[1], spa[2], spa[3]),
        tha: mac_at(tha, 0),
        tpa: Ipv4Addr::new(tpa[0], tpa[1], tpa[2], tpa[3]),
    }))
}

fn parse_ipv4(data: &[u8]) -> Result<Ipv4<'_>, ParseError> {
    use etherparse::err::ipv4::HeaderSliceError;
    let h = Ipv4HeaderSlice::from_slice(data).map_err(|e| match e {
        HeaderSliceError::Len(_) => ParseError::Truncated(Layer::Ipv4),
        HeaderSliceError::Content(_) => ParseError::Malformed(Layer::Ipv4),
    })?;
    let header_len = h.slice().len();
    let total_len = usize::from(h.total_len());
    if total_len < header_len {
        return Err(ParseError::Malformed(Layer::Ipv4));
    }
    // Shorter than total_len: truncated capture. Longer: Ethernet padding.
    let end = total_len.min(data.len());
    let payload = &data[header_len..end];
    let protocol = h.protocol().0;
    // RFC 791: only the fragment with offset 0 carries the transport header.
    let l4 = if h.fragments_offset().value() != 0 {
        L4::Other(payload)
    } else {
        parse_l4(protocol, IP_PROTO_ICMP, payload)
    };
    Ok(Ipv4 {
        src: h.source_addr(),
        dst: h.destination_addr(),
        protocol,
        ttl: h.ttl(),
        l4,
    })
}

fn parse_ipv6(data: &[u8]) -> Result<Ipv6<'_>, ParseError> {
    use etherparse::err::ipv6::HeaderSliceError;
    let h = Ipv6HeaderSlice::from_slice(data).map_err(|e| match e {
        HeaderSliceError::Len(_) => ParseError::Truncated(Layer::Ipv6),
        HeaderSliceError::Content(_) => ParseError::Malformed(Layer::Ipv6),
    })?;
    let header_len = h.header_len();
    let end = (header_len + usize::from(h.payload_length())).min(data.len());
    let payload = &data[header_len..end];
    let first = h.next_header();
    let (next_header, l4) = match Ipv6ExtensionsSlice::from_slice(first, payload) {
        Ok((exts, last, rest)) if exts.is_fragmenting_payload() => (last.0, L4::Other(rest)),
        Ok((_, last, rest)) => (last.0, parse_l4(last.0, IP_PROTO_ICMPV6, rest)),
        Err(etherparse::err::ipv6_exts::HeaderSliceError::Len(_)) => (first.0, L4::Truncated),
        Err(etherparse::err::ipv6_exts::HeaderSliceError::Content(_)) => {
            (first.0, L4::Other(payload))
        }
    };
    Ok(Ipv6 {
        src: h.source_addr(),
        dst: h.destination_addr(),
        next_header,
        l4,
    })
}

/// The transport header inside an IP payload; `icmp` is the ICMP protocol number of the
/// IP version at hand (1 for IPv4, 58 for IPv6).
fn parse_l4(protocol: u8, icmp: u8, payload: &[u8]) -> L4<'_> {
    match protocol {
        IP_PROTO_TCP => {
            use etherparse::err::tcp::HeaderSliceError;
            match TcpHeaderSlice::from_slice(payload) {
                Ok(t) => {
                    let hs = t.slice();
                    L4::Tcp(Tcp {
                        src_port: t.source_port(),
                        dst_port: t.destination_port(),
                        seq: t.sequence_number(),
                        ack: t.acknowledgment_number(),
                        flags: TcpFlags(hs[13]),
                        payload: &payload[hs.len()..],
                    })
                }
                Err(HeaderSliceError::Len(_)) => L4::Truncated,
                Err(HeaderSliceError::Content(_)) => L4::Other(payload),
            }
        }
        IP_PROTO_UDP => match UdpHeaderSlice::from_slice(payload) {
            Ok(u) => L4::Udp {
                src_port: u.source_port(),
                dst_port: u.destination_port(),
            },
            Err(_) => L4::Truncated,
        },
        p if p == icmp => {
            // Type, code, checksum: the 4 bytes every ICMP / ICMPv6 message starts with.
            if payload.len() < 4 {
                L4::Truncated
            } else {
                L4::Icmp {
                    typ: payload[0],
                    code: payload[1],
                }
            }
        }
        _ => L4::Other(payload),
    }
}
