//! The frames inside OpenFlow PACKET_IN and PACKET_OUT messages.
//!
//! Two halves:
//!
//! * **Parse views** ([`parse`] → [`Frame`]). This runs on the controller's PACKET_IN hot
//!   path, so it never allocates: every view is `Copy` and borrows the message buffer. It
//!   never panics either: the bytes come from the network (via a switch), and any input,
//!   however short or garbled, yields either a [`Frame`] or a [`ParseError`]. IPv4, IPv6,
//!   ARP, TCP and UDP headers are sliced with `etherparse` (whose slicing API is zero-copy);
//!   Ethernet/802.1Q, ICMP and LLDP are small enough to read by hand.
//! * **Builders** ([`arp_reply`], [`arp_request`], [`tcp_rst`], [`lldp_probe`],
//!   [`ipv4_tcp`], [`tcp_syn`], [`ipv4_udp`]). They allocate (they are off the hot path) and
//!   return [`bytes::Bytes`] ready to be carried in a PACKET_OUT. Every checksum they write is
//!   correct, and whatever they build, [`parse`] reads back. One is on a hot path and does
//!   not allocate: [`tcp_rst_v4`], the RST of a SYN refused under load, built on the stack
//!   with the [`internet_checksum`] that also serves the bench's PACKET_INs.
//!
//! Parsing is deliberately lax about lengths in one direction. A PACKET_IN of a buffered
//! packet carries only its first `miss_send_len` / `max_len` bytes (OpenFlow 1.3.5
//! §7.4.1), so an IPv4 `total_length` larger than the bytes present is normal, and the payload views end where the data ends. A
//! `total_length` smaller than the bytes present is normal too (Ethernet pads short frames
//! to 60 bytes), and the views end at `total_length`, so padding never counts as payload.
//! Checksums are not verified on parse: the switch has already received the frame, and
//! verifying would cost the hot path for nothing the controller acts on.

#![forbid(unsafe_code)]

mod build;
mod checksum;
mod frame;
mod lldp;
mod mac;

pub use build::{
    ETH_MIN_FRAME_LEN, LLDP_MULTICAST, TCP_RST_V4_LEN, TcpSegment, arp_frame, arp_reply,
    arp_request, ipv4_tcp, ipv4_udp, lldp_probe, tcp_rst, tcp_rst_v4, tcp_syn,
};
pub use checksum::{internet_checksum, ones_complement_sum};
pub use frame::{
    Arp, Frame, Ipv4, Ipv6, L3, L4, Layer, ParseError, Tcp, TcpFlags, ipv4_tcp_tuple, parse,
};
pub use lldp::{Lldp, LldpKey, lldp_tag};
pub use mac::{MacAddr, MacParseError};

/// EtherType of IPv4.
pub const ETH_TYPE_IPV4: u16 = 0x0800;
/// EtherType of ARP.
pub const ETH_TYPE_ARP: u16 = 0x0806;
/// EtherType of IPv6.
pub const ETH_TYPE_IPV6: u16 = 0x86dd;
/// EtherType of LLDP (IEEE 802.1AB).
pub const ETH_TYPE_LLDP: u16 = 0x88cc;
/// EtherType (TPID) of an IEEE 802.1Q VLAN tag.
pub const ETH_TYPE_VLAN: u16 = 0x8100;
/// EtherType (TPID) of an IEEE 802.1ad service tag (outer tag of Q-in-Q).
pub const ETH_TYPE_QINQ: u16 = 0x88a8;

/// IP protocol number of ICMP.
pub const IP_PROTO_ICMP: u8 = 1;
/// IP protocol number of TCP.
pub const IP_PROTO_TCP: u8 = 6;
/// IP protocol number of UDP.
pub const IP_PROTO_UDP: u8 = 17;
/// IP protocol (IPv6 next header) number of ICMPv6.
pub const IP_PROTO_ICMPV6: u8 = 58;

/// ARP operation: request ("who-has").
pub const ARP_OP_REQUEST: u16 = 1;
/// ARP operation: reply ("is-at").
pub const ARP_OP_REPLY: u16 = 2;
