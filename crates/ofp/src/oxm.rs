//! OXM TLVs and the flow match (§7.2.3).
//!
//! A [`Match`] is an ordered list of [`Oxm`] kept inline (no heap) for up to 8 fields. Every
//! OpenFlow-basic field of 1.3 (`OFPXMT_OFB_*` 0..=39) is typed; any other class (Nicira
//! NXM 0x0000/0x0001, experimenter 0xffff, ...) and any basic field whose mask or length
//! the spec does not allow is kept as an opaque [`RawOxm`], so decode→encode is
//! byte-identical.

use std::net::{Ipv4Addr, Ipv6Addr};

use bytes::{BufMut, Bytes, BytesMut};
use smallvec::SmallVec;

use crate::error::{DecodeError, EncodeError};
use crate::wire::{LenMark, Reader, pad8};

/// OXM classes (§7.2.3.2, `enum ofp_oxm_class`).
pub mod class {
    /// Backward compatibility with NXM (Nicira).
    pub const NXM_0: u16 = 0x0000;
    /// Backward compatibility with NXM (Nicira `NXM_NX_*`).
    pub const NXM_1: u16 = 0x0001;
    /// Basic class for OpenFlow.
    pub const OPENFLOW_BASIC: u16 = 0x8000;
    /// Experimenter class.
    pub const EXPERIMENTER: u16 = 0xffff;
}

/// `OFPVID_PRESENT`: set in `vlan_vid` when a VLAN tag is present (§7.2.3.8).
pub const VID_PRESENT: u16 = 0x1000;
/// `OFPVID_NONE`: no VLAN tag.
pub const VID_NONE: u16 = 0x0000;

/// An OXM TLV that is kept opaque: its class, field, mask bit and payload (value followed
/// by mask when `hasmask`, experimenter id first for class 0xffff) exactly as on the wire.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct RawOxm {
    /// `oxm_class`.
    pub class: u16,
    /// `oxm_field` (7 bits).
    pub field: u8,
    /// `oxm_hasmask`.
    pub hasmask: bool,
    /// The payload (`oxm_length` bytes).
    pub payload: Bytes,
}

/// One OXM TLV (§7.2.3.7). Field names follow `OFPXMT_OFB_*` (and Ryu's names).
#[allow(missing_docs)]
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum Oxm {
    InPort(u32),
    InPhyPort(u32),
    Metadata {
        value: u64,
        mask: Option<u64>,
    },
    EthDst {
        value: [u8; 6],
        mask: Option<[u8; 6]>,
    },
    EthSrc {
        value: [u8; 6],
        mask: Option<[u8; 6]>,
    },
    EthType(u16),
    /// Raw wire value: `OFPVID_PRESENT | vid`, or `OFPVID_NONE`.
    VlanVid {
        value: u16,
        mask: Option<u16>,
    },
    VlanPcp(u8),
    IpDscp(u8),
    IpEcn(u8),
    IpProto(u8),
    Ipv4Src {
        value: Ipv4Addr,
        mask: Option<Ipv4Addr>,
    },
    Ipv4Dst {
        value: Ipv4Addr,
        mask: Option<Ipv4Addr>,
    },
    TcpSrc(u16),
    TcpDst(u16),
    UdpSrc(u16),
    UdpDst(u16),
    SctpSrc(u16),
    SctpDst(u16),
    Icmpv4Type(u8),
    Icmpv4Code(u8),
    ArpOp(u16),
    ArpSpa {
        value: Ipv4Addr,
        mask: Option<Ipv4Addr>,
    },
    ArpTpa {
        value: Ipv4Addr,
        mask: Option<Ipv4Addr>,
    },
    ArpSha {
        value: [u8; 6],
        mask: Option<[u8; 6]>,
    },
    ArpTha {
        value: [u8; 6],
        mask: Option<[u8; 6]>,
    },
    Ipv6Src {
        value: Ipv6Addr,
        mask: Option<Ipv6Addr>,
    },
    Ipv6Dst {
        value: Ipv6Addr,
        mask: Option<Ipv6Addr>,
    },
    Ipv6Flabel {
        value: u32,
        mask: Option<u32>,
    },
    Icmpv6Type(u8),
    Icmpv6Code(u8),
    Ipv6NdTarget(Ipv6Addr),
    Ipv6NdSll([u8; 6]),
    Ipv6NdTll([u8; 6]),
    MplsLabel(u32),
    MplsTc(u8),
    MplsBos(u8),
    /// 24-bit I-SID.
    PbbIsid {
        value: u32,
        mask: Option<u32>,
    },
    TunnelId {
        value: u64,
        mask: Option<u64>,
    },
    Ipv6Exthdr {
        value: u16,
        mask: Option<u16>,
    },
    /// Any other class, or a basic field with a length/mask the spec does not allow.
    Raw(RawOxm),
}

/// Identifies an OXM field: class and field number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct OxmId {
    /// `oxm_class`.
    pub class: u16,
    /// `oxm_field`.
    pub field: u8,
}

/// `OFPXMT_OFB_*` field numbers (§7.2.3.7).
#[allow(missing_docs)]
pub mod ofb {
    pub const IN_PORT: u8 = 0;
    pub const IN_PHY_PORT: u8 = 1;
    pub const METADATA: u8 = 2;
    pub const ETH_DST: u8 = 3;
    pub const ETH_SRC: u8 = 4;
    pub const ETH_TYPE: u8 = 5;
    pub const VLAN_VID: u8 = 6;
    pub const VLAN_PCP: u8 = 7;
    pub const IP_DSCP: u8 = 8;
    pub const IP_ECN: u8 = 9;
    pub const IP_PROTO: u8 = 10;
    pub const IPV4_SRC: u8 = 11;
    pub const IPV4_DST: u8 = 12;
    pub const TCP_SRC: u8 = 13;
    pub const TCP_DST: u8 = 14;
    pub const UDP_SRC: u8 = 15;
    pub const UDP_DST: u8 = 16;
    pub const SCTP_SRC: u8 = 17;
    pub const SCTP_DST: u8 = 18;
    pub const ICMPV4_TYPE: u8 = 19;
    pub const ICMPV4_CODE: u8 = 20;
    pub const ARP_OP: u8 = 21;
    pub const ARP_SPA: u8 = 22;
    pub const ARP_TPA: u8 = 23;
    pub const ARP_SHA: u8 = 24;
    pub const ARP_THA: u8 = 25;
    pub const IPV6_SRC: u8 = 26;
    pub const IPV6_DST: u8 = 27;
    pub const IPV6_FLABEL: u8 = 28;
    pub const ICMPV6_TYPE: u8 = 29;
    pub const ICMPV6_CODE: u8 = 30;
    pub const IPV6_ND_TARGET: u8 = 31;
    pub const IPV6_ND_SLL: u8 = 32;
    pub const IPV6_ND_TLL: u8 = 33;
    pub const MPLS_LABEL: u8 = 34;
    pub const MPLS_TC: u8 = 35;
    pub const MPLS_BOS: u8 = 36;
    pub const PBB_ISID: u8 = 37;
    pub const TUNNEL_ID: u8 = 38;
    pub const IPV6_EXTHDR: u8 = 39;
}

const OFB_NAMES: [&str; 40] = [
    "in_port",
    "in_phy_port",
    "metadata",
    "eth_dst",
    "eth_src",
    "eth_type",
    "vlan_vid",
    "vlan_pcp",
    "ip_dscp",
    "ip_ecn",
    "ip_proto",
    "ipv4_src",
    "ipv4_dst",
    "tcp_src",
    "tcp_dst",
    "udp_src",
    "udp_dst",
    "sctp_src",
    "sctp_dst",
    "icmpv4_type",
    "icmpv4_code",
    "arp_op",
    "arp_spa",
    "arp_tpa",
    "arp_sha",
    "arp_tha",
    "ipv6_src",
    "ipv6_dst",
    "ipv6_flabel",
    "icmpv6_type",
    "icmpv6_code",
    "ipv6_nd_target",
    "ipv6_nd_sll",
    "ipv6_nd_tll",
    "mpls_label",
    "mpls_tc",
    "mpls_bos",
    "pbb_isid",
    "tunnel_id",
    "ipv6_exthdr",
];

/// The lower-case name of an OpenFlow-basic field (`"eth_dst"`), as Ryu and ovs-ofctl say.
pub fn ofb_name(field: u8) -> Option<&'static str> {
    OFB_NAMES.get(usize::from(field)).copied()
}

#[inline]
fn ip4(a: [u8; 4]) -> Ipv4Addr {
    Ipv4Addr::from(a)
}
#[inline]
fn ip6(a: [u8; 16]) -> Ipv6Addr {
    Ipv6Addr::from(a)
}

impl Oxm {
    /// Unmasked `eth_dst`.
    #[inline]
    pub fn eth_dst(mac: [u8; 6]) -> Self {
        Oxm::EthDst {
            value: mac,
            mask: None,
        }
    }
    /// Unmasked `eth_src`.
    #[inline]
    pub fn eth_src(mac: [u8; 6]) -> Self {
        Oxm::EthSrc {
            value: mac,
            mask: None,
        }
    }
    /// Unmasked `ipv4_src`.
    #[inline]
    pub fn ipv4_src(ip: Ipv4Addr) -> Self {
        Oxm::Ipv4Src {
            value: ip,
            mask: None,
        }
    }
    /// Unmasked `ipv4_dst`.
    #[inline]
    pub fn ipv4_dst(ip: Ipv4Addr) -> Self {
        Oxm::Ipv4Dst {
            value: ip,
            mask: None,
        }
    }
    /// Unmasked `ipv6_src`.
    #[inline]
    pub fn ipv6_src(ip: Ipv6Addr) -> Self {
        Oxm::Ipv6Src {
            value: ip,
            mask: None,
        }
    }
    /// Unmasked `ipv6_dst`.
    #[inline]
    pub fn ipv6_dst(ip: Ipv6Addr) -> Self {
        Oxm::Ipv6Dst {
            value: ip,
            mask: None,
        }
    }
    /// Unmasked `metadata`.
    #[inline]
    pub fn metadata(v: u64) -> Self {
        Oxm::Metadata {
            value: v,
            mask: None,
        }
    }
    /// Unmasked `tunnel_id`.
    #[inline]
    pub fn tunnel_id(v: u64) -> Self {
        Oxm::TunnelId {
            value: v,
            mask: None,
        }
    }
    /// `vlan_vid` for a tagged frame with this VLAN id (sets `OFPVID_PRESENT`).
    #[inline]
    pub fn vlan(vid: u16) -> Self {
        Oxm::VlanVid {
            value: VID_PRESENT | (vid & 0x0fff),
            mask: None,
        }
    }
    /// `arp_spa`, unmasked.
    #[inline]
    pub fn arp_spa(ip: Ipv4Addr) -> Self {
        Oxm::ArpSpa {
            value: ip,
            mask: None,
        }
    }
    /// `arp_tpa`, unmasked.
    #[inline]
    pub fn arp_tpa(ip: Ipv4Addr) -> Self {
        Oxm::ArpTpa {
            value: ip,
            mask: None,
        }
    }

    /// Class and field of this TLV.
    pub fn id(&self) -> OxmId {
        let field = match self {
            Oxm::Raw(r) => {
                return OxmId {
                    class: r.class,
                    field: r.field,
                };
            }
            Oxm::InPort(_) => ofb::IN_PORT,
            Oxm::InPhyPort(_) => ofb::IN_PHY_PORT,
            Oxm::Metadata { .. } => ofb::METADATA,
            Oxm::EthDst { .. } => ofb::ETH_DST,
            Oxm::EthSrc { .. } => ofb::ETH_SRC,
            Oxm::EthType(_) => ofb::ETH_TYPE,
            Oxm::VlanVid { .. } => ofb::VLAN_VID,
            Oxm::VlanPcp(_) => ofb::VLAN_PCP,
            Oxm::IpDscp(_) => ofb::IP_DSCP,
            Oxm::IpEcn(_) => ofb::IP_ECN,
            Oxm::IpProto(_) => ofb::IP_PROTO,
            Oxm::Ipv4Src { .. } => ofb::IPV4_SRC,
            Oxm::Ipv4Dst { .. } => ofb::IPV4_DST,
            Oxm::TcpSrc(_) => ofb::TCP_SRC,
            Oxm::TcpDst(_) => ofb::TCP_DST,
            Oxm::UdpSrc(_) => ofb::UDP_SRC,
            Oxm::UdpDst(_) => ofb::UDP_DST,
            Oxm::SctpSrc(_) => ofb::SCTP_SRC,
            Oxm::SctpDst(_) => ofb::SCTP_DST,
            Oxm::Icmpv4Type(_) => ofb::ICMPV4_TYPE,
            Oxm::Icmpv4Code(_) => ofb::ICMPV4_CODE,
            Oxm::ArpOp(_) => ofb::ARP_OP,
            Oxm::ArpSpa { .. } => ofb::ARP_SPA,
            Oxm::ArpTpa { .. } => ofb::ARP_TPA,
            Oxm::ArpSha { .. } => ofb::ARP_SHA,
            Oxm::ArpTha { .. } => ofb::ARP_THA,
            Oxm::Ipv6Src { .. } => ofb::IPV6_SRC,
            Oxm::Ipv6Dst { .. } => ofb::IPV6_DST,
            Oxm::Ipv6Flabel { .. } => ofb::IPV6_FLABEL,
            Oxm::Icmpv6Type(_) => ofb::ICMPV6_TYPE,
            Oxm::Icmpv6Code(_) => ofb::ICMPV6_CODE,
            Oxm::Ipv6NdTarget(_) => ofb::IPV6_ND_TARGET,
            Oxm::Ipv6NdSll(_) => ofb::IPV6_ND_SLL,
            Oxm::Ipv6NdTll(_) => ofb::IPV6_ND_TLL,
            Oxm::MplsLabel(_) => ofb::MPLS_LABEL,
            Oxm::MplsTc(_) => ofb::MPLS_TC,
            Oxm::MplsBos(_) => ofb::MPLS_BOS,
            Oxm::PbbIsid { .. } => ofb::PBB_ISID,
            Oxm::TunnelId { .. } => ofb::TUNNEL_ID,
            Oxm::Ipv6Exthdr { .. } => ofb::IPV6_EXTHDR,
        };
        OxmId {
            class: class::OPENFLOW_BASIC,
            field,
        }
    }

    /// The field's name (`"ipv4_src"`), or `None` for a [`RawOxm`] of another class.
    pub fn name(&self) -> Option<&'static str> {
        let id = self.id();
        if id.class == class::OPENFLOW_BASIC {
            ofb_name(id.field)
        } else {
            None
        }
    }

    /// Whether this TLV carries a mask.
    pub fn has_mask(&self) -> bool {
        match self {
            Oxm::Raw(r) => r.hasmask,
            Oxm::Metadata { mask, .. } | Oxm::TunnelId { mask, .. } => mask.is_some(),
            Oxm::EthDst { mask, .. }
            | Oxm::EthSrc { mask, .. }
            | Oxm::ArpSha { mask, .. }
            | Oxm::ArpTha { mask, .. } => mask.is_some(),
            Oxm::VlanVid { mask, .. } | Oxm::Ipv6Exthdr { mask, .. } => mask.is_some(),
            Oxm::Ipv4Src { mask, .. }
            | Oxm::Ipv4Dst { mask, .. }
            | Oxm::ArpSpa { mask, .. }
            | Oxm::ArpTpa { mask, .. } => mask.is_some(),
            Oxm::Ipv6Src { mask, .. } | Oxm::Ipv6Dst { mask, .. } => mask.is_some(),
            Oxm::Ipv6Flabel { mask, .. } | Oxm::PbbIsid { mask, .. } => mask.is_some(),
            _ => false,
        }
    }

    /// The same field without its mask (for SET_FIELD, which takes no mask, §7.2.5).
    pub fn without_mask(&self) -> Oxm {
        let mut o = self.clone();
        match &mut o {
            Oxm::Metadata { mask, .. } | Oxm::TunnelId { mask, .. } => *mask = None,
            Oxm::EthDst { mask, .. }
            | Oxm::EthSrc { mask, .. }
            | Oxm::ArpSha { mask, .. }
            | Oxm::ArpTha { mask, .. } => *mask = None,
            Oxm::VlanVid { mask, .. } | Oxm::Ipv6Exthdr { mask, .. } => *mask = None,
            Oxm::Ipv4Src { mask, .. }
            | Oxm::Ipv4Dst { mask, .. }
            | Oxm::ArpSpa { mask, .. }
            | Oxm::ArpTpa { mask, .. } => *mask = None,
            Oxm::Ipv6Src { mask, .. } | Oxm::Ipv6Dst { mask, .. } => *mask = None,
            Oxm::Ipv6Flabel { mask, .. } | Oxm::PbbIsid { mask, .. } => *mask = None,
            _ => {}
        }
        o
    }

    /// Decode one TLV (header + payload).
    pub(crate) fn decode(r: &mut Reader<'_>) -> Result<Oxm, DecodeError> {
        let header = r.u32()?;
        let class = (header >> 16) as u16;
        let field = ((header >> 9) & 0x7f) as u8;
        let hasmask = header & 0x100 != 0;
        let len = (header & 0xff) as usize;
        let mut p = r.sub(len)?;
        if class == class::OPENFLOW_BASIC {
            let save = p;
            if let Some(o) = decode_basic(&mut p, field, hasmask, len)? {
                return Ok(o);
            }
            p = save;
        }
        Ok(Oxm::Raw(RawOxm {
            class,
            field,
            hasmask,
            payload: p.rest(),
        }))
    }

    /// The encoded length of this TLV (4-byte header + payload).
    pub fn wire_len(&self) -> usize {
        4 + self.payload_len()
    }

    fn payload_len(&self) -> usize {
        let (n, m) = match self {
            Oxm::Raw(r) => return r.payload.len(),
            Oxm::InPort(_) | Oxm::InPhyPort(_) | Oxm::MplsLabel(_) => (4, false),
            Oxm::Metadata { mask, .. } | Oxm::TunnelId { mask, .. } => (8, mask.is_some()),
            Oxm::EthDst { mask, .. }
            | Oxm::EthSrc { mask, .. }
            | Oxm::ArpSha { mask, .. }
            | Oxm::ArpTha { mask, .. } => (6, mask.is_some()),
            Oxm::EthType(_)
            | Oxm::TcpSrc(_)
            | Oxm::TcpDst(_)
            | Oxm::UdpSrc(_)
            | Oxm::UdpDst(_)
            | Oxm::SctpSrc(_)
            | Oxm::SctpDst(_)
            | Oxm::ArpOp(_) => (2, false),
            Oxm::VlanVid { mask, .. } | Oxm::Ipv6Exthdr { mask, .. } => (2, mask.is_some()),
            Oxm::VlanPcp(_)
            | Oxm::IpDscp(_)
            | Oxm::IpEcn(_)
            | Oxm::IpProto(_)
            | Oxm::Icmpv4Type(_)
            | Oxm::Icmpv4Code(_)
            | Oxm::Icmpv6Type(_)
            | Oxm::Icmpv6Code(_)
            | Oxm::MplsTc(_)
            | Oxm::MplsBos(_) => (1, false),
            Oxm::Ipv4Src { mask, .. }
            | Oxm::Ipv4Dst { mask, .. }
            | Oxm::ArpSpa { mask, .. }
            | Oxm::ArpTpa { mask, .. } => (4, mask.is_some()),
            Oxm::Ipv6Src { mask, .. } | Oxm::Ipv6Dst { mask, .. } => (16, mask.is_some()),
            Oxm::Ipv6Flabel { mask, .. } => (4, mask.is_some()),
            Oxm::Ipv6NdTarget(_) => (16, false),
            Oxm::Ipv6NdSll(_) | Oxm::Ipv6NdTll(_) => (6, false),
            Oxm::PbbIsid { mask, .. } => (3, mask.is_some()),
        };
        if m { 2 * n } else { n }
    }

    /// Append this TLV. One match writes header and payload.
    pub(crate) fn encode(&self, out: &mut BytesMut) -> Result<(), EncodeError> {
        #[inline(always)]
        fn hdr(out: &mut BytesMut, field: u8, hasmask: bool, len: u8) {
            out.put_u32(
                (u32::from(class::OPENFLOW_BASIC) << 16)
                    | (u32::from(field) << 9)
                    | (u32::from(hasmask) << 8)
                    | u32::from(len),
            );
        }
        macro_rules! masked {
            ($f:expr, $n:expr, $value:expr, $mask:expr, $put:expr) => {{
                hdr(
                    out,
                    $f,
                    $mask.is_some(),
                    if $mask.is_some() { 2 * $n } else { $n },
                );
                $put(&mut *out, $value);
                if let Some(m) = $mask {
                    $put(&mut *out, m);
                }
            }};
        }
        let p16 = |o: &mut BytesMut, v: &u16| o.put_u16(*v);
        let p32 = |o: &mut BytesMut, v: &u32| o.put_u32(*v);
        let p64 = |o: &mut BytesMut, v: &u64| o.put_u64(*v);
        let pmac = |o: &mut BytesMut, v: &[u8; 6]| o.put_slice(v);
        let pip4 = |o: &mut BytesMut, v: &Ipv4Addr| o.put_slice(&v.octets());
        let pip6 = |o: &mut BytesMut, v: &Ipv6Addr| o.put_slice(&v.octets());
        match self {
            Oxm::Raw(r) => {
                let len = u8::try_from(r.payload.len())
                    .map_err(|_| EncodeError::FieldTooLong { what: "oxm" })?;
                out.put_u32(
                    (u32::from(r.class) << 16)
                        | (u32::from(r.field & 0x7f) << 9)
                        | (u32::from(r.hasmask) << 8)
                        | u32::from(len),
                );
                out.put_slice(&r.payload);
            }
            Oxm::InPort(v) => {
                hdr(out, ofb::IN_PORT, false, 4);
                out.put_u32(*v)
            }
            Oxm::InPhyPort(v) => {
                hdr(out, ofb::IN_PHY_PORT, false, 4);
                out.put_u32(*v)
            }
            Oxm::MplsLabel(v) => {
                hdr(out, ofb::MPLS_LABEL, false, 4);
                out.put_u32(*v)
            }
            Oxm::Metadata { value, mask } => masked!(ofb::METADATA, 8, value, mask, p64),
            Oxm::TunnelId { value, mask } => masked!(ofb::TUNNEL_ID, 8, value, mask, p64),
            Oxm::EthDst { value, mask } => masked!(ofb::ETH_DST, 6, value, mask, pmac),
            Oxm::EthSrc { value, mask } => masked!(ofb::ETH_SRC, 6, value, mask, pmac),
            Oxm::ArpSha { value, mask } => masked!(ofb::ARP_SHA, 6, value, mask, pmac),
            Oxm::ArpTha { value, mask } => masked!(ofb::ARP_THA, 6, value, mask, pmac),
            Oxm::EthType(v)
            | Oxm::TcpSrc(v)
            | Oxm::TcpDst(v)
            | Oxm::UdpSrc(v)
            | Oxm::UdpDst(v)
            | Oxm::SctpSrc(v)
            | Oxm::SctpDst(v)
            | Oxm::ArpOp(v) => {
                hdr(out, self.id().field, false, 2);
                out.put_u16(*v)
            }
            Oxm::VlanVid { value, mask } => masked!(ofb::VLAN_VID, 2, value, mask, p16),
            Oxm::Ipv6Exthdr { value, mask } => masked!(ofb::IPV6_EXTHDR, 2, value, mask, p16),
            Oxm::VlanPcp(v)
            | Oxm::IpDscp(v)
            | Oxm::IpEcn(v)
            | Oxm::IpProto(v)
            | Oxm::Icmpv4Type(v)
            | Oxm::Icmpv4Code(v)
            | Oxm::Icmpv6Type(v)
            | Oxm::Icmpv6Code(v)
            | Oxm::MplsTc(v)
            | Oxm::MplsBos(v) => {
                hdr(out, self.id().field, false, 1);
                out.put_u8(*v)
            }
            Oxm::Ipv4Src { value, mask } => masked!(ofb::IPV4_SRC, 4, value, mask, pip4),
            Oxm::Ipv4Dst { value, mask } => masked!(ofb::IPV4_DST, 4, value, mask, pip4),
            Oxm::ArpSpa { value, mask } => masked!(ofb::ARP_SPA, 4, value, mask, pip4),
            Oxm::ArpTpa { value, mask } => masked!(ofb::ARP_TPA, 4, value, mask, pip4),
            Oxm::Ipv6Src { value, mask } => masked!(ofb::IPV6_SRC, 16, value, mask, pip6),
            Oxm::Ipv6Dst { value, mask } => masked!(ofb::IPV6_DST, 16, value, mask, pip6),
            Oxm::Ipv6Flabel { value, mask } => masked!(ofb::IPV6_FLABEL, 4, value, mask, p32),
            Oxm::Ipv6NdTarget(a) => {
                hdr(out, ofb::IPV6_ND_TARGET, false, 16);
                out.put_slice(&a.octets())
            }
            Oxm::Ipv6NdSll(m) => {
                hdr(out, ofb::IPV6_ND_SLL, false, 6);
                out.put_slice(m)
            }
            Oxm::Ipv6NdTll(m) => {
                hdr(out, ofb::IPV6_ND_TLL, false, 6);
                out.put_slice(m)
            }
            Oxm::PbbIsid { value, mask } => {
                // OXM_OF_PBB_ISID is 24 bits on the wire (§7.2.3.7).
                if *value > 0x00ff_ffff || mask.is_some_and(|m| m > 0x00ff_ffff) {
                    return Err(EncodeError::BadValue { what: "pbb_isid" });
                }
                let p24 = |o: &mut BytesMut, v: &u32| o.put_slice(&v.to_be_bytes()[1..]);
                masked!(ofb::PBB_ISID, 3, value, mask, p24)
            }
        }
        Ok(())
    }
}

/// The value size and whether a mask is allowed, per §7.2.3.7 table 11, of a basic-class
/// field this codec types; `None` for fields it keeps raw.
#[inline]
pub(crate) fn basic_shape(field: u8) -> Option<(usize, bool)> {
    Some(match field {
        ofb::IN_PORT | ofb::IN_PHY_PORT | ofb::MPLS_LABEL => (4, false),
        ofb::METADATA | ofb::TUNNEL_ID => (8, true),
        ofb::ETH_DST | ofb::ETH_SRC | ofb::ARP_SHA | ofb::ARP_THA => (6, true),
        ofb::ETH_TYPE
        | ofb::TCP_SRC
        | ofb::TCP_DST
        | ofb::UDP_SRC
        | ofb::UDP_DST
        | ofb::SCTP_SRC
        | ofb::SCTP_DST
        | ofb::ARP_OP => (2, false),
        ofb::VLAN_VID | ofb::IPV6_EXTHDR => (2, true),
        ofb::VLAN_PCP
        | ofb::IP_DSCP
        | ofb::IP_ECN
        | ofb::IP_PROTO
        | ofb::ICMPV4_TYPE
        | ofb::ICMPV4_CODE
        | ofb::ICMPV6_TYPE
        | ofb::ICMPV6_CODE
        | ofb::MPLS_TC
        | ofb::MPLS_BOS => (1, false),
        ofb::IPV4_SRC | ofb::IPV4_DST | ofb::ARP_SPA | ofb::ARP_TPA => (4, true),
        ofb::IPV6_SRC | ofb::IPV6_DST => (16, true),
        ofb::IPV6_FLABEL => (4, true),
        ofb::IPV6_ND_TARGET => (16, false),
        ofb::IPV6_ND_SLL | ofb::IPV6_ND_TLL => (6, false),
        ofb::PBB_ISID => (3, true),
        _ => return None,
    })
}

/// Typed decode of a basic-class field; `None` if the length/mask is not the spec's, in
/// which case the caller keeps it raw.
fn decode_basic(
    p: &mut Reader<'_>,
    field: u8,
    hasmask: bool,
    len: usize,
) -> Result<Option<Oxm>, DecodeError> {
    let Some((n, maskable)) = basic_shape(field) else {
        return Ok(None);
    };
    if hasmask && !maskable {
        return Ok(None);
    }
    if len != if hasmask { 2 * n } else { n } {
        return Ok(None);
    }
    macro_rules! masked {
        ($read:expr, $variant:ident) => {{
            let value = $read;
            let mask = if hasmask { Some($read) } else { None };
            Oxm::$variant { value, mask }
        }};
    }
    let o = match field {
        ofb::IN_PORT => Oxm::InPort(p.u32()?),
        ofb::IN_PHY_PORT => Oxm::InPhyPort(p.u32()?),
        ofb::METADATA => masked!(p.u64()?, Metadata),
        ofb::ETH_DST => masked!(p.array::<6>()?, EthDst),
        ofb::ETH_SRC => masked!(p.array::<6>()?, EthSrc),
        ofb::ETH_TYPE => Oxm::EthType(p.u16()?),
        ofb::VLAN_VID => masked!(p.u16()?, VlanVid),
        ofb::VLAN_PCP => Oxm::VlanPcp(p.u8()?),
        ofb::IP_DSCP => Oxm::IpDscp(p.u8()?),
        ofb::IP_ECN => Oxm::IpEcn(p.u8()?),
        ofb::IP_PROTO => Oxm::IpProto(p.u8()?),
        ofb::IPV4_SRC => masked!(ip4(p.array()?), Ipv4Src),
        ofb::IPV4_DST => masked!(ip4(p.array()?), Ipv4Dst),
        ofb::TCP_SRC => Oxm::TcpSrc(p.u16()?),
        ofb::TCP_DST => Oxm::TcpDst(p.u16()?),
        ofb::UDP_SRC => Oxm::UdpSrc(p.u16()?),
        ofb::UDP_DST => Oxm::UdpDst(p.u16()?),
        ofb::SCTP_SRC => Oxm::SctpSrc(p.u16()?),
        ofb::SCTP_DST => Oxm::SctpDst(p.u16()?),
        ofb::ICMPV4_TYPE => Oxm::Icmpv4Type(p.u8()?),
        ofb::ICMPV4_CODE => Oxm::Icmpv4Code(p.u8()?),
        ofb::ARP_OP => Oxm::ArpOp(p.u16()?),
        ofb::ARP_SPA => masked!(ip4(p.array()?), ArpSpa),
        ofb::ARP_TPA => masked!(ip4(p.array()?), ArpTpa),
        ofb::ARP_SHA => masked!(p.array::<6>()?, ArpSha),
        ofb::ARP_THA => masked!(p.array::<6>()?, ArpTha),
        ofb::IPV6_SRC => masked!(ip6(p.array()?), Ipv6Src),
        ofb::IPV6_DST => masked!(ip6(p.array()?), Ipv6Dst),
        ofb::IPV6_FLABEL => masked!(p.u32()?, Ipv6Flabel),
        ofb::ICMPV6_TYPE => Oxm::Icmpv6Type(p.u8()?),
        ofb::ICMPV6_CODE => Oxm::Icmpv6Code(p.u8()?),
        ofb::IPV6_ND_TARGET => Oxm::Ipv6NdTarget(ip6(p.array()?)),
        ofb::IPV6_ND_SLL => Oxm::Ipv6NdSll(p.array()?),
        ofb::IPV6_ND_TLL => Oxm::Ipv6NdTll(p.array()?),
        ofb::MPLS_LABEL => Oxm::MplsLabel(p.u32()?),
        ofb::MPLS_TC => Oxm::MplsTc(p.u8()?),
        ofb::MPLS_BOS => Oxm::MplsBos(p.u8()?),
        ofb::PBB_ISID => {
            let rd = |p: &mut Reader<'_>| -> Result<u32, DecodeError> {
                let a = p.array::<3>()?;
                Ok(u32::from_be_bytes([0, a[0], a[1], a[2]]))
            };
            masked!(rd(p)?, PbbIsid)
        }
        ofb::TUNNEL_ID => masked!(p.u64()?, TunnelId),
        ofb::IPV6_EXTHDR => masked!(p.u16()?, Ipv6Exthdr),
        _ => return Ok(None),
    };
    Ok(Some(o))
}

/// Why a match is not valid (§7.2.3.6 prerequisites, §7.2.3.5 masks, §7.2.3.7 ranges).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum MatchError {
    /// A field's prerequisite is missing (§7.2.3.6, table 12), e.g. `ipv4_src` without
    /// `eth_type=0x0800`.
    #[error("{field} needs {needs}")]
    MissingPrerequisite {
        /// The field that needs it.
        field: &'static str,
        /// What it needs.
        needs: &'static str,
    },
    /// A field appears more than once (§7.2.3.6: "an OXM TLV ... must not appear more than
    /// once", OFPBMC_DUP_FIELD).
    #[error("duplicate field {0}")]
    Duplicate(&'static str),
    /// A value is out of its range (e.g. `vlan_pcp` > 7), OFPBMC_BAD_VALUE.
    #[error("value out of range for {0}")]
    BadValue(&'static str),
    /// The value has 1-bits where the mask has 0-bits (§7.2.3.5, OFPBMC_BADWILDCARDS).
    #[error("value bits outside the mask for {0}")]
    BadWildcards(&'static str),
}

/// Inline capacity of a [`Match`].
pub const MATCH_INLINE: usize = 8;

/// A flow match (`struct ofp_match` of type OFPMT_OXM, §7.2.3.1): an ordered list of OXM
/// TLVs. Up to 8 fields are stored inline, without heap allocation.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(transparent))]
pub struct Match {
    fields: SmallVec<[Oxm; MATCH_INLINE]>,
}

/// `OFPMT_OXM`.
pub const OFPMT_OXM: u16 = 1;

impl Match {
    /// An empty match (matches everything).
    #[inline]
    pub fn new() -> Self {
        Match {
            fields: SmallVec::new(),
        }
    }
    /// Append a field (no checks; see [`Match::validate`] and [`Match::try_with`]).
    #[inline]
    pub fn push(&mut self, oxm: Oxm) {
        self.fields.push(oxm);
    }
    /// Remove every field (a match reused for another rule keeps its place).
    #[inline]
    pub fn clear(&mut self) {
        self.fields.clear();
    }
    /// Append a field, builder style.
    #[inline]
    pub fn with(mut self, oxm: Oxm) -> Self {
        self.fields.push(oxm);
        self
    }
    /// Append a field and check the whole match.
    pub fn try_with(self, oxm: Oxm) -> Result<Self, MatchError> {
        let m = self.with(oxm);
        m.validate()?;
        Ok(m)
    }
    /// Build from fields and check prerequisites.
    pub fn build<I: IntoIterator<Item = Oxm>>(fields: I) -> Result<Self, MatchError> {
        let m = Match {
            fields: fields.into_iter().collect(),
        };
        m.validate()?;
        Ok(m)
    }
    /// The fields in order.
    #[inline]
    pub fn iter(&self) -> std::slice::Iter<'_, Oxm> {
        self.fields.iter()
    }
    /// The fields as a slice.
    #[inline]
    pub fn as_slice(&self) -> &[Oxm] {
        &self.fields
    }
    /// Number of fields.
    #[inline]
    pub fn len(&self) -> usize {
        self.fields.len()
    }
    /// No fields.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.fields.is_empty()
    }
    /// The first field with this id.
    pub fn get(&self, id: OxmId) -> Option<&Oxm> {
        self.fields.iter().find(|o| o.id() == id)
    }
    /// The first OpenFlow-basic field with this `OFPXMT_OFB_*` number.
    pub fn get_ofb(&self, field: u8) -> Option<&Oxm> {
        self.get(OxmId {
            class: class::OPENFLOW_BASIC,
            field,
        })
    }
    /// `in_port`.
    #[inline]
    pub fn in_port(&self) -> Option<u32> {
        self.fields.iter().find_map(|o| {
            if let Oxm::InPort(v) = o {
                Some(*v)
            } else {
                None
            }
        })
    }
    /// `eth_type`.
    #[inline]
    pub fn eth_type(&self) -> Option<u16> {
        self.fields.iter().find_map(|o| {
            if let Oxm::EthType(v) = o {
                Some(*v)
            } else {
                None
            }
        })
    }
    /// `ip_proto`.
    #[inline]
    pub fn ip_proto(&self) -> Option<u8> {
        self.fields.iter().find_map(|o| {
            if let Oxm::IpProto(v) = o {
                Some(*v)
            } else {
                None
            }
        })
    }
    /// Unmasked `ipv4_src`.
    #[inline]
    pub fn ipv4_src(&self) -> Option<Ipv4Addr> {
        self.fields.iter().find_map(|o| match o {
            Oxm::Ipv4Src { value, mask: None } => Some(*value),
            _ => None,
        })
    }
    /// Unmasked `ipv4_dst`.
    #[inline]
    pub fn ipv4_dst(&self) -> Option<Ipv4Addr> {
        self.fields.iter().find_map(|o| match o {
            Oxm::Ipv4Dst { value, mask: None } => Some(*value),
            _ => None,
        })
    }
    /// `tcp_src`.
    #[inline]
    pub fn tcp_src(&self) -> Option<u16> {
        self.fields.iter().find_map(|o| {
            if let Oxm::TcpSrc(v) = o {
                Some(*v)
            } else {
                None
            }
        })
    }
    /// `tcp_dst`.
    #[inline]
    pub fn tcp_dst(&self) -> Option<u16> {
        self.fields.iter().find_map(|o| {
            if let Oxm::TcpDst(v) = o {
                Some(*v)
            } else {
                None
            }
        })
    }
    /// Unmasked `metadata`.
    #[inline]
    pub fn metadata(&self) -> Option<u64> {
        self.fields.iter().find_map(|o| match o {
            Oxm::Metadata { value, mask: None } => Some(*value),
            _ => None,
        })
    }

    /// Check §7.2.3.6 prerequisites (table 12), duplicates, value ranges (§7.2.3.7) and that
    /// masked values have no bits outside their mask (§7.2.3.5). Raw TLVs are not checked.
    pub fn validate(&self) -> Result<(), MatchError> {
        // Duplicates (§7.2.3.6). Quadratic but the list is tiny.
        for (i, a) in self.fields.iter().enumerate() {
            if matches!(a, Oxm::Raw(_)) {
                continue;
            }
            let id = a.id();
            if self.fields.iter().skip(i + 1).any(|b| b.id() == id) {
                return Err(MatchError::Duplicate(a.name().unwrap_or("oxm")));
            }
        }
        let eth = self.eth_type();
        let proto = self.ip_proto();
        let icmp6 = self.fields.iter().find_map(|o| {
            if let Oxm::Icmpv6Type(v) = o {
                Some(*v)
            } else {
                None
            }
        });
        let need = |ok: bool, field: &'static str, needs: &'static str| {
            if ok {
                Ok(())
            } else {
                Err(MatchError::MissingPrerequisite { field, needs })
            }
        };
        let is_ip = matches!(eth, Some(0x0800) | Some(0x86dd));
        for o in &self.fields {
            let name = o.name().unwrap_or("oxm");
            match o {
                Oxm::InPhyPort(_) => need(self.in_port().is_some(), name, "in_port")?,
                Oxm::VlanVid { value, mask } => {
                    if *value > 0x1fff || mask.is_some_and(|m| m > 0x1fff) {
                        return Err(MatchError::BadValue(name));
                    }
                    check_mask(name, u64::from(*value), mask.map(u64::from))?;
                }
                Oxm::VlanPcp(v) => {
                    if *v > 7 {
                        return Err(MatchError::BadValue(name));
                    }
                    let tagged = self.fields.iter().any(|x| match x {
                        Oxm::VlanVid { value, mask: None } => *value != VID_NONE,
                        Oxm::VlanVid { mask: Some(_), .. } => true,
                        _ => false,
                    });
                    need(tagged, name, "vlan_vid != OFPVID_NONE")?
                }
                Oxm::IpDscp(v) => {
                    if *v > 63 {
                        return Err(MatchError::BadValue(name));
                    }
                    need(is_ip, name, "eth_type=0x0800 or 0x86dd")?
                }
                Oxm::IpEcn(v) => {
                    if *v > 3 {
                        return Err(MatchError::BadValue(name));
                    }
                    need(is_ip, name, "eth_type=0x0800 or 0x86dd")?
                }
                Oxm::IpProto(_) => need(is_ip, name, "eth_type=0x0800 or 0x86dd")?,
                Oxm::Ipv4Src { value, mask } | Oxm::Ipv4Dst { value, mask } => {
                    check_mask(
                        name,
                        u64::from(u32::from(*value)),
                        mask.map(|m| u64::from(u32::from(m))),
                    )?;
                    need(eth == Some(0x0800), name, "eth_type=0x0800")?
                }
                Oxm::TcpSrc(_) | Oxm::TcpDst(_) => {
                    need(proto == Some(6) && is_ip, name, "ip_proto=6")?
                }
                Oxm::UdpSrc(_) | Oxm::UdpDst(_) => {
                    need(proto == Some(17) && is_ip, name, "ip_proto=17")?
                }
                Oxm::SctpSrc(_) | Oxm::SctpDst(_) => {
                    need(proto == Some(132) && is_ip, name, "ip_proto=132")?
                }
                Oxm::Icmpv4Type(_) | Oxm::Icmpv4Code(_) => need(
                    proto == Some(1) && eth == Some(0x0800),
                    name,
                    "ip_proto=1, eth_type=0x0800",
                )?,
                Oxm::ArpOp(_)
                | Oxm::ArpSpa { .. }
                | Oxm::ArpTpa { .. }
                | Oxm::ArpSha { .. }
                | Oxm::ArpTha { .. } => {
                    if let Oxm::ArpSpa { value, mask } | Oxm::ArpTpa { value, mask } = o {
                        check_mask(
                            name,
                            u64::from(u32::from(*value)),
                            mask.map(|m| u64::from(u32::from(m))),
                        )?;
                    }
                    need(eth == Some(0x0806), name, "eth_type=0x0806")?
                }
                Oxm::Ipv6Src { value, mask } | Oxm::Ipv6Dst { value, mask } => {
                    if let Some(m) = mask
                        && u128::from(*value) & !u128::from(*m) != 0
                    {
                        return Err(MatchError::BadWildcards(name));
                    }
                    need(eth == Some(0x86dd), name, "eth_type=0x86dd")?
                }
                Oxm::Ipv6Flabel { value, mask } => {
                    if *value > 0xfffff || mask.is_some_and(|m| m > 0xfffff) {
                        return Err(MatchError::BadValue(name));
                    }
                    check_mask(name, u64::from(*value), mask.map(u64::from))?;
                    need(eth == Some(0x86dd), name, "eth_type=0x86dd")?
                }
                Oxm::Icmpv6Type(_) | Oxm::Icmpv6Code(_) => need(
                    proto == Some(58) && eth == Some(0x86dd),
                    name,
                    "ip_proto=58, eth_type=0x86dd",
                )?,
                Oxm::Ipv6NdTarget(_) => need(
                    matches!(icmp6, Some(135) | Some(136)),
                    name,
                    "icmpv6_type=135 or 136",
                )?,
                Oxm::Ipv6NdSll(_) => need(icmp6 == Some(135), name, "icmpv6_type=135")?,
                Oxm::Ipv6NdTll(_) => need(icmp6 == Some(136), name, "icmpv6_type=136")?,
                Oxm::MplsLabel(_) | Oxm::MplsTc(_) | Oxm::MplsBos(_) => {
                    let bad = match o {
                        Oxm::MplsLabel(v) => *v > 0xfffff,
                        Oxm::MplsTc(v) => *v > 7,
                        Oxm::MplsBos(v) => *v > 1,
                        _ => false,
                    };
                    if bad {
                        return Err(MatchError::BadValue(name));
                    }
                    need(
                        matches!(eth, Some(0x8847) | Some(0x8848)),
                        name,
                        "eth_type=0x8847 or 0x8848",
                    )?
                }
                Oxm::PbbIsid { value, mask } => {
                    if *value > 0xffffff || mask.is_some_and(|m| m > 0xffffff) {
                        return Err(MatchError::BadValue(name));
                    }
                    check_mask(name, u64::from(*value), mask.map(u64::from))?;
                    need(eth == Some(0x88e7), name, "eth_type=0x88e7")?
                }
                Oxm::Ipv6Exthdr { value, mask } => {
                    if *value > 0x1ff || mask.is_some_and(|m| m > 0x1ff) {
                        return Err(MatchError::BadValue(name));
                    }
                    check_mask(name, u64::from(*value), mask.map(u64::from))?;
                    need(eth == Some(0x86dd), name, "eth_type=0x86dd")?
                }
                Oxm::Metadata { value, mask } | Oxm::TunnelId { value, mask } => {
                    check_mask(name, *value, *mask)?
                }
                Oxm::EthDst { value, mask } | Oxm::EthSrc { value, mask } => {
                    if let Some(m) = mask
                        && value.iter().zip(m.iter()).any(|(v, m)| v & !m != 0)
                    {
                        return Err(MatchError::BadWildcards(name));
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Decode `struct ofp_match` including its padding to 8 bytes (§7.2.3.1).
    pub(crate) fn decode(r: &mut Reader<'_>) -> Result<Match, DecodeError> {
        let mut m = Match::new();
        m.decode_into(r)?;
        Ok(m)
    }

    /// Decode into `self` (which must be empty), avoiding a move of the inline storage.
    #[inline]
    pub(crate) fn decode_into(&mut self, r: &mut Reader<'_>) -> Result<(), DecodeError> {
        let typ = r.u16()?;
        let len = usize::from(r.u16()?);
        if typ != OFPMT_OXM {
            return Err(DecodeError::BadValue { what: "match type" });
        }
        if len < 4 {
            return Err(DecodeError::BadLength);
        }
        let mut body = r.sub(len - 4)?;
        while !body.is_empty() {
            self.fields.push(Oxm::decode(&mut body)?);
        }
        let pad = (8 - len % 8) % 8;
        r.skip(pad)?;
        Ok(())
    }

    /// Encode `struct ofp_match` with padding.
    pub(crate) fn encode(&self, out: &mut BytesMut) -> Result<(), EncodeError> {
        let start = out.len();
        out.put_u16(OFPMT_OXM);
        let mark = LenMark::at(out, start);
        for f in &self.fields {
            f.encode(out)?;
        }
        mark.finish(out, "match")?;
        pad8(out, start);
        Ok(())
    }
}

fn check_mask(name: &'static str, value: u64, mask: Option<u64>) -> Result<(), MatchError> {
    match mask {
        Some(m) if value & !m != 0 => Err(MatchError::BadWildcards(name)),
        _ => Ok(()),
    }
}

impl FromIterator<Oxm> for Match {
    fn from_iter<I: IntoIterator<Item = Oxm>>(iter: I) -> Self {
        Match {
            fields: iter.into_iter().collect(),
        }
    }
}

impl<'a> IntoIterator for &'a Match {
    type Item = &'a Oxm;
    type IntoIter = std::slice::Iter<'a, Oxm>;
    fn into_iter(self) -> Self::IntoIter {
        self.fields.iter()
    }
}
