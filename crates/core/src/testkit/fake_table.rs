//! A fake OpenFlow 1.3 switch: the flow tables, group table and meter table of one
//! datapath, fed the controller's messages and asked where a packet goes.
//!
//! Faucet's `fakeoftable` in Rust. Controller tests apply the FLOW_MODs and GROUP_MODs the
//! core emits, then trace packets through the pipeline, so they can assert on behaviour
//! ("a SYN to the VIP reaches backend 2 with its destination rewritten") rather than on
//! the exact messages. Messages Open vSwitch would refuse are refused here with the error
//! OVS would send, so a test sees it as an OFPT_ERROR.
//!
//! What is modelled, with the spec's rules (OpenFlow Switch Specification 1.3.5):
//!
//! * FLOW_MOD add / modify / modify-strict / delete / delete-strict (§6.4), including
//!   replace-on-identical-match, `OFPFF_CHECK_OVERLAP`, `OFPFF_RESET_COUNTS`, the
//!   `cookie`/`cookie_mask` filter (§6.4, §7.3.4.1), and the `out_port`/`out_group`
//!   filters of deletes.
//! * Lookup: the highest-priority matching entry of each table (§5.3), instructions run in
//!   the order of §5.9 (meter, apply-actions, clear-actions, write-actions,
//!   write-metadata, goto-table), the action set run at the end of the pipeline in the order
//!   of §5.10, a table miss without a table-miss entry dropping the packet (§5.4).
//! * Groups (§5.6): all, select (first live bucket, or weighted by a hash of the flow),
//!   indirect, fast-failover (first bucket whose watch port is up); deleting a group
//!   removes the flows that use it.
//! * Meters are only recorded (a flow may not name a meter that does not exist).
//! * Timeouts, with an explicit clock: [`FakeTable::expire`].
//!
//! Not modelled: counters other than packets, TTLs, MPLS/PBB, queues, buffers.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, Ipv6Addr};

use flowgate_packet::{Frame, L3, L4, MacAddr, ParseError};
use ofp::{
    Action, Bucket, FlowMod, FlowModCommand, FlowModFlags, GroupMod, GroupModCommand, GroupType,
    Instruction, Match, MatchError, Message, MeterMod, MeterModCommand, Oxm, PacketOut,
};

use ofp::{group, port};

/// `OFPTT_ALL`: all tables (delete only).
const TABLE_ALL: u8 = ofp::table::ALL;

/// Why a message was refused, named after the OFPT_ERROR Open vSwitch would send.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FakeTableError {
    /// OFPET_BAD_MATCH: prerequisites (§7.2.3.6), duplicates, bad values or wildcards.
    #[error("bad match: {0}")]
    BadMatch(MatchError),
    /// OFPBMC_BAD_FIELD: a match field this fake does not model.
    #[error("match field {0} is not modelled by the fake table")]
    UnsupportedMatchField(String),
    /// OFPBAC_BAD_SET_MASK (OVS): a SET_FIELD carrying a mask. In OpenFlow 1.3 a
    /// SET_FIELD's OXM is unmasked (§7.2.5); OVS refuses a masked one.
    #[error("set_field with a masked {0}")]
    BadSetMask(String),
    /// OFPBAC_BAD_SET_TYPE: a SET_FIELD of a field that cannot be written (or that the fake
    /// does not model).
    #[error("set_field of {0} is not allowed")]
    BadSetType(String),
    /// OFPBAC_MATCH_INCONSISTENT: a SET_FIELD whose prerequisites the flow's match does not
    /// guarantee (OVS checks set_field against the match, e.g. ipv4_dst needs
    /// eth_type=0x0800).
    #[error("set_field of {field} needs {needs} in the match")]
    SetFieldPrerequisite {
        /// The field set.
        field: &'static str,
        /// The missing prerequisite.
        needs: &'static str,
    },
    /// OFPBAC_BAD_OUT_PORT: output to port 0, OFPP_ANY, or OFPP_TABLE outside a packet-out.
    #[error("bad output port {0:#x}")]
    BadOutPort(u32),
    /// OFPBAC_BAD_OUT_GROUP: an action names a group that does not exist.
    #[error("group {0} does not exist")]
    BadOutGroup(u32),
    /// OFPBAC_BAD_TYPE: an action this fake does not model (MPLS, PBB, experimenter...).
    #[error("action {0} is not modelled by the fake table")]
    UnsupportedAction(String),
    /// OFPBIC_UNSUP_INST: an instruction this fake does not model, or one given twice.
    #[error("instruction {0} is not supported")]
    UnsupportedInstruction(String),
    /// OFPBIC_BAD_TABLE_ID: goto-table must go forward to an existing table (§5.1:
    /// "pipeline processing can only go forward and not backward").
    #[error("goto_table {to} from table {from}")]
    BadGotoTable {
        /// The table of the flow.
        from: u8,
        /// The goto target.
        to: u8,
    },
    /// OFPFMFC_BAD_TABLE_ID.
    #[error("bad table id {0}")]
    BadTableId(u8),
    /// OFPFMFC_OVERLAP: `OFPFF_CHECK_OVERLAP` and an overlapping entry of the same priority
    /// exists (§6.4).
    #[error("flow overlaps an existing entry of the same priority")]
    Overlap,
    /// OFPFMFC_BAD_COMMAND / OFPGMFC_BAD_COMMAND / OFPMMFC_BAD_COMMAND.
    #[error("bad command {0}")]
    BadCommand(u16),
    /// OFPGMFC_GROUP_EXISTS.
    #[error("group {0} already exists")]
    GroupExists(u32),
    /// OFPGMFC_INVALID_GROUP: a group id above OFPG_MAX.
    #[error("invalid group id {0:#x}")]
    InvalidGroup(u32),
    /// OFPGMFC_UNKNOWN_GROUP: modify of a group that does not exist.
    #[error("unknown group {0}")]
    UnknownGroup(u32),
    /// OFPGMFC_BAD_TYPE.
    #[error("bad group type")]
    BadGroupType,
    /// OFPGMFC_BAD_BUCKET: e.g. an indirect group without exactly one bucket.
    #[error("bad bucket: {0}")]
    BadBucket(&'static str),
    /// OFPGMFC_LOOP: a group that chains to itself.
    #[error("group {0} loops")]
    GroupLoop(u32),
    /// OFPMMFC_METER_EXISTS.
    #[error("meter {0} already exists")]
    MeterExists(u32),
    /// OFPMMFC_UNKNOWN_METER: a meter modified, or used by a flow, that does not exist.
    #[error("unknown meter {0}")]
    UnknownMeter(u32),
    /// OFPMMFC_INVALID_METER.
    #[error("invalid meter id {0:#x}")]
    InvalidMeter(u32),
}

impl FakeTableError {
    /// The fake cannot judge the message: a match field or an action it does not model
    /// (Open vSwitch's Nicira extensions among them), not a refusal it knows a switch
    /// would send.
    pub fn is_unmodelled(&self) -> bool {
        matches!(
            self,
            FakeTableError::UnsupportedMatchField(_) | FakeTableError::UnsupportedAction(_)
        )
    }

    /// The OFPT_ERROR type and code a switch would answer with.
    pub fn error_kind(&self) -> ofp::ErrorKind {
        use FakeTableError::*;
        use ofp::ErrorKind as K;
        use ofp::errmsg::{
            BadActionCode as A, BadInstructionCode as I, BadMatchCode as M, FlowModFailedCode as F,
            GroupModFailedCode as G, MeterModFailedCode as Me,
        };
        match self {
            BadMatch(e) => K::BadMatch(match e {
                MatchError::MissingPrerequisite { .. } => M::BadPrereq,
                MatchError::Duplicate(_) => M::DupField,
                MatchError::BadValue(_) => M::BadValue,
                MatchError::BadWildcards(_) => M::BadWildcards,
            }),
            UnsupportedMatchField(_) => K::BadMatch(M::BadField),
            // OVS's OFPBAC_BAD_SET_MASK is an extension; the nearest 1.3 code.
            BadSetMask(_) => K::BadAction(A::BadSetArgument),
            BadSetType(_) => K::BadAction(A::BadSetType),
            SetFieldPrerequisite { .. } => K::BadAction(A::MatchInconsistent),
            BadOutPort(_) => K::BadAction(A::BadOutPort),
            BadOutGroup(_) => K::BadAction(A::BadOutGroup),
            UnsupportedAction(_) => K::BadAction(A::BadType),
            UnsupportedInstruction(_) => K::BadInstruction(I::UnsupInst),
            BadGotoTable { .. } => K::BadInstruction(I::BadTableId),
            BadTableId(_) => K::FlowModFailed(F::BadTableId),
            Overlap => K::FlowModFailed(F::Overlap),
            BadCommand(_) => K::FlowModFailed(F::BadCommand),
            GroupExists(_) => K::GroupModFailed(G::GroupExists),
            InvalidGroup(_) => K::GroupModFailed(G::InvalidGroup),
            UnknownGroup(_) => K::GroupModFailed(G::UnknownGroup),
            BadGroupType => K::GroupModFailed(G::BadType),
            BadBucket(_) => K::GroupModFailed(G::BadBucket),
            GroupLoop(_) => K::GroupModFailed(G::Loop),
            MeterExists(_) => K::MeterModFailed(Me::MeterExists),
            UnknownMeter(_) => K::MeterModFailed(Me::UnknownMeter),
            InvalidMeter(_) => K::MeterModFailed(Me::InvalidMeter),
        }
    }
}

/// The header fields of a packet that flows match on and actions rewrite.
///
/// Fields a packet does not have (no TCP header, not ARP, ...) are `None`, and a match on
/// them fails, as on a switch. `metadata` is pipeline state, zero on arrival.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct PacketFields {
    /// Ingress port.
    pub in_port: u32,
    /// Metadata register (§7.2.3.7 `OXM_OF_METADATA`), written by write-metadata.
    pub metadata: u64,
    /// Ethernet source.
    pub eth_src: MacAddr,
    /// Ethernet destination.
    pub eth_dst: MacAddr,
    /// EtherType after any VLAN tag.
    pub eth_type: u16,
    /// VLAN id of the outermost tag.
    pub vlan: Option<u16>,
    /// IP protocol (IPv4) or next header (IPv6).
    pub ip_proto: Option<u8>,
    /// IPv4 source.
    pub ipv4_src: Option<Ipv4Addr>,
    /// IPv4 destination.
    pub ipv4_dst: Option<Ipv4Addr>,
    /// IPv6 source.
    pub ipv6_src: Option<Ipv6Addr>,
    /// IPv6 destination.
    pub ipv6_dst: Option<Ipv6Addr>,
    /// TCP source port.
    pub tcp_src: Option<u16>,
    /// TCP destination port.
    pub tcp_dst: Option<u16>,
    /// TCP control bits (matchable through OVS's `tcp_flags` extension).
    pub tcp_flags: Option<u16>,
    /// TCP sequence number (not matchable; carried so a packet that goes up to the
    /// controller keeps it: a SYN's ISN tells a retransmission from a new connection).
    pub tcp_seq: Option<u32>,
    /// TCP acknowledgement number (not matchable; carried for the same reason: a
    /// deferred handshake's ACK must acknowledge the backend's ISN).
    pub tcp_ack: Option<u32>,
    /// UDP source port.
    pub udp_src: Option<u16>,
    /// UDP destination port.
    pub udp_dst: Option<u16>,
    /// ICMP (v4) type.
    pub icmpv4_type: Option<u8>,
    /// ICMP (v4) code.
    pub icmpv4_code: Option<u8>,
    /// ICMPv6 type.
    pub icmpv6_type: Option<u8>,
    /// ICMPv6 code.
    pub icmpv6_code: Option<u8>,
    /// ARP opcode.
    pub arp_op: Option<u16>,
    /// ARP sender protocol address.
    pub arp_spa: Option<Ipv4Addr>,
    /// ARP target protocol address.
    pub arp_tpa: Option<Ipv4Addr>,
    /// ARP sender hardware address.
    pub arp_sha: Option<MacAddr>,
    /// ARP target hardware address.
    pub arp_tha: Option<MacAddr>,
}

impl PacketFields {
    /// A packet with only an ingress port (and zero MACs, EtherType 0).
    pub fn new(in_port: u32) -> Self {
        PacketFields {
            in_port,
            ..PacketFields::default()
        }
    }

    /// The fields of a raw Ethernet frame arriving on `in_port`.
    pub fn from_frame(in_port: u32, data: &[u8]) -> Result<Self, ParseError> {
        Ok(Self::from_parsed(in_port, &flowgate_packet::parse(data)?))
    }

    /// The fields of a parsed frame arriving on `in_port`.
    pub fn from_parsed(in_port: u32, f: &Frame<'_>) -> Self {
        let mut p = PacketFields {
            in_port,
            eth_src: f.eth_src,
            eth_dst: f.eth_dst,
            eth_type: f.ethertype,
            vlan: f.vlan,
            ..PacketFields::default()
        };
        let (l4, icmp6) = match &f.l3 {
            L3::Arp(a) => {
                p.arp_op = Some(a.op);
                p.arp_spa = Some(a.spa);
                p.arp_tpa = Some(a.tpa);
                p.arp_sha = Some(a.sha);
                p.arp_tha = Some(a.tha);
                return p;
            }
            L3::Ipv4(ip) => {
                p.ip_proto = Some(ip.protocol);
                p.ipv4_src = Some(ip.src);
                p.ipv4_dst = Some(ip.dst);
                (&ip.l4, false)
            }
            L3::Ipv6(ip) => {
                p.ip_proto = Some(ip.next_header);
                p.ipv6_src = Some(ip.src);
                p.ipv6_dst = Some(ip.dst);
                (&ip.l4, true)
            }
            L3::Lldp(_) | L3::Other(_) => return p,
        };
        match *l4 {
            L4::Tcp(t) => {
                p.tcp_src = Some(t.src_port);
                p.tcp_dst = Some(t.dst_port);
                p.tcp_flags = Some(u16::from(t.flags.0));
                p.tcp_seq = Some(t.seq);
                p.tcp_ack = Some(t.ack);
            }
            L4::Udp { src_port, dst_port } => {
                p.udp_src = Some(src_port);
                p.udp_dst = Some(dst_port);
            }
            L4::Icmp { typ, code } if icmp6 => {
                p.icmpv6_type = Some(typ);
                p.icmpv6_code = Some(code);
            }
            L4::Icmp { typ, code } => {
                p.icmpv4_type = Some(typ);
                p.icmpv4_code = Some(code);
            }
            L4::Other(_) | L4::Truncated => {}
        }
        p
    }
}

// ---------------------------------------------------------------------------------------
// Canonical match terms.

/// A field the fake can match and (mostly) set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Field {
    InPort,
    Metadata,
    EthDst,
    EthSrc,
    EthType,
    VlanVid,
    IpProto,
    Ipv4Src,
    Ipv4Dst,
    TcpSrc,
    TcpDst,
    UdpSrc,
    UdpDst,
    Icmpv4Type,
    Icmpv4Code,
    ArpOp,
    ArpSpa,
    ArpTpa,
    ArpSha,
    ArpTha,
    Ipv6Src,
    Ipv6Dst,
    Icmpv6Type,
    Icmpv6Code,
    TcpFlags,
}

impl Field {
    fn bits(self) -> u32 {
        use Field::*;
        match self {
            InPort | Ipv4Src | Ipv4Dst | ArpSpa | ArpTpa => 32,
            Metadata => 64,
            EthDst | EthSrc | ArpSha | ArpTha => 48,
            EthType | TcpSrc | TcpDst | UdpSrc | UdpDst | ArpOp => 16,
            VlanVid => 13,
            TcpFlags => 12,
            IpProto | Icmpv4Type | Icmpv4Code | Icmpv6Type | Icmpv6Code => 8,
            Ipv6Src | Ipv6Dst => 128,
        }
    }

    fn full_mask(self) -> u128 {
        if self.bits() == 128 {
            u128::MAX
        } else {
            (1u128 << self.bits()) - 1
        }
    }

    /// The packet's value, `None` if it does not have this field.
    fn get(self, p: &PacketFields) -> Option<u128> {
        use Field::*;
        let mac = |m: MacAddr| u128::from(m.to_u64());
        Some(match self {
            InPort => u128::from(p.in_port),
            Metadata => u128::from(p.metadata),
            EthDst => mac(p.eth_dst),
            EthSrc => mac(p.eth_src),
            EthType => u128::from(p.eth_type),
            // §7.2.3.8: OFPVID_PRESENT | vid for a tagged packet, OFPVID_NONE untagged.
            VlanVid => u128::from(p.vlan.map_or(0, |v| 0x1000 | (v & 0x0fff))),
            IpProto => u128::from(p.ip_proto?),
            Ipv4Src => u128::from(u32::from(p.ipv4_src?)),
            Ipv4Dst => u128::from(u32::from(p.ipv4_dst?)),
            TcpSrc => u128::from(p.tcp_src?),
            TcpDst => u128::from(p.tcp_dst?),
            UdpSrc => u128::from(p.udp_src?),
            UdpDst => u128::from(p.udp_dst?),
            Icmpv4Type => u128::from(p.icmpv4_type?),
            Icmpv4Code => u128::from(p.icmpv4_code?),
            ArpOp => u128::from(p.arp_op?),
            ArpSpa => u128::from(u32::from(p.arp_spa?)),
            ArpTpa => u128::from(u32::from(p.arp_tpa?)),
            ArpSha => mac(p.arp_sha?),
            ArpTha => mac(p.arp_tha?),
            Ipv6Src => u128::from(p.ipv6_src?),
            Ipv6Dst => u128::from(p.ipv6_dst?),
            Icmpv6Type => u128::from(p.icmpv6_type?),
            Icmpv6Code => u128::from(p.icmpv6_code?),
            TcpFlags => u128::from(p.tcp_flags?),
        })
    }

    /// Writes `v` (already in range) into the packet.
    fn set(self, p: &mut PacketFields, v: u128) {
        use Field::*;
        let mac = |v: u128| MacAddr::from_u64(v as u64);
        let ip4 = |v: u128| Ipv4Addr::from(v as u32);
        match self {
            InPort => p.in_port = v as u32,
            Metadata => p.metadata = v as u64,
            EthDst => p.eth_dst = mac(v),
            EthSrc => p.eth_src = mac(v),
            EthType => p.eth_type = v as u16,
            VlanVid => {
                // Setting vlan_vid rewrites the tag's VID; on an untagged packet OVS does
                // nothing (the prerequisite is a tag, normally from a push_vlan).
                if p.vlan.is_some() {
                    p.vlan = Some((v as u16) & 0x0fff);
                }
            }
            IpProto => p.ip_proto = Some(v as u8),
            Ipv4Src => p.ipv4_src = Some(ip4(v)),
            Ipv4Dst => p.ipv4_dst = Some(ip4(v)),
            TcpSrc => p.tcp_src = Some(v as u16),
            TcpDst => p.tcp_dst = Some(v as u16),
            UdpSrc => p.udp_src = Some(v as u16),
            UdpDst => p.udp_dst = Some(v as u16),
            Icmpv4Type => p.icmpv4_type = Some(v as u8),
            Icmpv4Code => p.icmpv4_code = Some(v as u8),
            ArpOp => p.arp_op = Some(v as u16),
            ArpSpa => p.arp_spa = Some(ip4(v)),
            ArpTpa => p.arp_tpa = Some(ip4(v)),
            ArpSha => p.arp_sha = Some(mac(v)),
            ArpTha => p.arp_tha = Some(mac(v)),
            Ipv6Src => p.ipv6_src = Some(Ipv6Addr::from(v)),
            Ipv6Dst => p.ipv6_dst = Some(Ipv6Addr::from(v)),
            Icmpv6Type => p.icmpv6_type = Some(v as u8),
            Icmpv6Code => p.icmpv6_code = Some(v as u8),
            TcpFlags => p.tcp_flags = Some(v as u16),
        }
    }

    /// Whether SET_FIELD may write it (OVS refuses in_port, eth_type and ip_proto; the
    /// fake also refuses tcp_flags).
    fn writable(self) -> bool {
        !matches!(
            self,
            Field::InPort | Field::EthType | Field::IpProto | Field::TcpFlags
        )
    }
}

/// One match field in canonical form: value and mask as `u128`, the mask all ones for an
/// exact match, and the value already masked. Matching, overlap and "more specific" are
/// then bit operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Term {
    field: Field,
    value: u128,
    mask: u128,
}

/// OVS's ONF extension for `tcp_flags` in OpenFlow 1.3 (`ONFOXM_ET_TCP_FLAGS`).
const ONF_EXPERIMENTER: u32 = 0x4f4e_4600;
const ONF_TCP_FLAGS: u8 = 42;
/// Nicira's `NXM_NX_TCP_FLAGS` (class 0x0001, field 34).
const NXM_TCP_FLAGS: u8 = 34;

fn mac128(m: [u8; 6]) -> u128 {
    u128::from(MacAddr(m).to_u64())
}

fn term(oxm: &Oxm) -> Result<Term, FakeTableError> {
    use Field as F;
    let ip4 = |a: Ipv4Addr| u128::from(u32::from(a));
    let (field, value, mask): (Field, u128, Option<u128>) = match oxm {
        Oxm::InPort(v) => (F::InPort, u128::from(*v), None),
        Oxm::Metadata { value, mask } => (F::Metadata, u128::from(*value), mask.map(u128::from)),
        Oxm::EthDst { value, mask } => (F::EthDst, mac128(*value), mask.map(mac128)),
        Oxm::EthSrc { value, mask } => (F::EthSrc, mac128(*value), mask.map(mac128)),
        Oxm::EthType(v) => (F::EthType, u128::from(*v), None),
        Oxm::VlanVid { value, mask } => (F::VlanVid, u128::from(*value), mask.map(u128::from)),
        Oxm::IpProto(v) => (F::IpProto, u128::from(*v), None),
        Oxm::Ipv4Src { value, mask } => (F::Ipv4Src, ip4(*value), mask.map(ip4)),
        Oxm::Ipv4Dst { value, mask } => (F::Ipv4Dst, ip4(*value), mask.map(ip4)),
        Oxm::TcpSrc(v) => (F::TcpSrc, u128::from(*v), None),
        Oxm::TcpDst(v) => (F::TcpDst, u128::from(*v), None),
        Oxm::UdpSrc(v) => (F::UdpSrc, u128::from(*v), None),
        Oxm::UdpDst(v) => (F::UdpDst, u128::from(*v), None),
        Oxm::Icmpv4Type(v) => (F::Icmpv4Type, u128::from(*v), None),
        Oxm::Icmpv4Code(v) => (F::Icmpv4Code, u128::from(*v), None),
        Oxm::ArpOp(v) => (F::ArpOp, u128::from(*v), None),
        Oxm::ArpSpa { value, mask } => (F::ArpSpa, ip4(*value), mask.map(ip4)),
        Oxm::ArpTpa { value, mask } => (F::ArpTpa, ip4(*value), mask.map(ip4)),
        Oxm::ArpSha { value, mask } => (F::ArpSha, mac128(*value), mask.map(mac128)),
        Oxm::ArpTha { value, mask } => (F::ArpTha, mac128(*value), mask.map(mac128)),
        Oxm::Ipv6Src { value, mask } => (F::Ipv6Src, u128::from(*value), mask.map(u128::from)),
        Oxm::Ipv6Dst { value, mask } => (F::Ipv6Dst, u128::from(*value), mask.map(u128::from)),
        Oxm::Icmpv6Type(v) => (F::Icmpv6Type, u128::from(*v), None),
        Oxm::Icmpv6Code(v) => (F::Icmpv6Code, u128::from(*v), None),
        Oxm::Raw(r)
            if (r.class, r.field) == (ofp::oxm::class::OPENFLOW_BASIC, ofp::oxm::ofb::TCP_SRC) =>
        {
            // A masked tcp_src: unmaskable in OpenFlow 1.3 (§7.2.3.7), accepted by OVS.
            match (&r.payload[..], r.hasmask) {
                ([a, b, c, d], true) => (
                    F::TcpSrc,
                    u128::from(u16::from_be_bytes([*a, *b])),
                    Some(u128::from(u16::from_be_bytes([*c, *d]))),
                ),
                _ => {
                    return Err(FakeTableError::UnsupportedMatchField(
                        "raw tcp_src".to_string(),
                    ));
                }
            }
        }
        Oxm::Raw(r) => {
            // tcp_flags, as OVS accepts it in OpenFlow 1.3: ONF experimenter OXM or NXM.
            let p = &r.payload[..];
            let body = match (r.class, r.field) {
                (0xffff, ONF_TCP_FLAGS)
                    if p.len() >= 4 && p[..4] == ONF_EXPERIMENTER.to_be_bytes() =>
                {
                    Some(&p[4..])
                }
                (0x0001, NXM_TCP_FLAGS) => Some(p),
                _ => None,
            };
            match body {
                Some([a, b]) if !r.hasmask => {
                    (F::TcpFlags, u128::from(u16::from_be_bytes([*a, *b])), None)
                }
                Some([a, b, c, d]) if r.hasmask => (
                    F::TcpFlags,
                    u128::from(u16::from_be_bytes([*a, *b])),
                    Some(u128::from(u16::from_be_bytes([*c, *d]))),
                ),
                _ => {
                    return Err(FakeTableError::UnsupportedMatchField(format!(
                        "class {:#06x} field {}",
                        r.class, r.field
                    )));
                }
            }
        }
        other => {
            return Err(FakeTableError::UnsupportedMatchField(
                other.name().unwrap_or("?").to_string(),
            ));
        }
    };
    let full = field.full_mask();
    let mask = mask.unwrap_or(full) & full;
    Ok(Term {
        field,
        value: value & mask,
        mask,
    })
}

/// A match in canonical form: terms sorted by field, fully wildcarded terms dropped.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
struct Key(Vec<Term>);

impl Key {
    fn from_match(m: &Match) -> Result<Key, FakeTableError> {
        m.validate().map_err(FakeTableError::BadMatch)?;
        let mut terms = m.iter().map(term).collect::<Result<Vec<_>, _>>()?;
        terms.retain(|t| t.mask != 0);
        terms.sort();
        Ok(Key(terms))
    }

    fn matches(&self, p: &PacketFields) -> bool {
        self.0
            .iter()
            .all(|t| t.field.get(p).is_some_and(|v| v & t.mask == t.value))
    }

    /// True if some packet matches both (§6.4 "overlap").
    fn overlaps(&self, other: &Key) -> bool {
        self.0.iter().all(|a| {
            other
                .0
                .iter()
                .filter(|b| b.field == a.field)
                .all(|b| (a.value ^ b.value) & a.mask & b.mask == 0)
        })
    }

    /// True if every packet `self` matches is matched by `general`: `self` is "more
    /// specific or equal" (§6.4, non-strict modify and delete).
    fn within(&self, general: &Key) -> bool {
        general.0.iter().all(|g| {
            self.0
                .iter()
                .find(|s| s.field == g.field)
                .is_some_and(|s| s.mask & g.mask == g.mask && s.value & g.mask == g.value)
        })
    }
}

// ---------------------------------------------------------------------------------------
// Entries, traces, removals.

/// One installed flow entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowEntry {
    /// Unique per table instance, in installation order.
    pub id: u64,
    /// Table.
    pub table_id: u8,
    /// Priority.
    pub priority: u16,
    /// Cookie.
    pub cookie: u64,
    /// The match as sent.
    pub match_: Match,
    /// Instructions as sent (or as last modified).
    pub instructions: Vec<Instruction>,
    /// Idle timeout, seconds (0 = none).
    pub idle_timeout: u16,
    /// Hard timeout, seconds (0 = none).
    pub hard_timeout: u16,
    /// Flags.
    pub flags: FlowModFlags,
    /// Clock value when added.
    pub installed_at: u64,
    /// Clock value when last matched by [`FakeTable::process`] (or added).
    pub last_used: u64,
    /// Packets matched by [`FakeTable::process`].
    pub packet_count: u64,
    key: Key,
}

impl FlowEntry {
    /// True if the entry has an output action to `port` (in apply- or write-actions).
    pub fn outputs_to(&self, port: u32) -> bool {
        self.actions()
            .any(|a| matches!(a, Action::Output { port: p, .. } if *p == port))
    }

    /// True if the entry has a group action for `group`.
    pub fn uses_group(&self, group: u32) -> bool {
        self.actions()
            .any(|a| matches!(a, Action::Group(g) if *g == group))
    }

    /// The meter the entry uses, if any.
    pub fn meter(&self) -> Option<u32> {
        self.instructions.iter().find_map(|i| match i {
            Instruction::Meter(m) => Some(*m),
            _ => None,
        })
    }

    fn actions(&self) -> impl Iterator<Item = &Action> {
        self.instructions.iter().flat_map(|i| match i {
            Instruction::ApplyActions(a) | Instruction::WriteActions(a) => a.as_slice(),
            _ => &[],
        })
    }
}

/// Why an entry left the table (`enum ofp_flow_removed_reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RemovalReason {
    /// Idle timeout.
    IdleTimeout,
    /// Hard timeout.
    HardTimeout,
    /// A FLOW_MOD delete.
    Delete,
    /// Its group was deleted.
    GroupDelete,
    /// Its meter was deleted.
    MeterDelete,
}

/// An entry that left the table. Whether a FLOW_REMOVED would be sent is
/// `entry.flags.contains(FlowModFlags::SEND_FLOW_REM)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Removed {
    /// The entry.
    pub entry: FlowEntry,
    /// Why.
    pub reason: RemovalReason,
}

/// A flow entry a packet hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Hit {
    /// Table.
    pub table_id: u8,
    /// Priority.
    pub priority: u16,
    /// Cookie.
    pub cookie: u64,
    /// [`FlowEntry::id`].
    pub entry_id: u64,
}

/// Where a packet went through one switch.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Trace {
    /// Each output, with the packet as rewritten at that point; reserved ports other
    /// than CONTROLLER, IN_PORT, FLOOD and ALL (NORMAL, LOCAL) appear as themselves, and
    /// FLOOD/ALL too when the table was not told its ports.
    pub outputs: Vec<(u32, PacketFields)>,
    /// Each copy sent to the controller (PACKET_IN), as rewritten at that point, with the
    /// cookie of the entry that sent it (§7.4.1).
    pub to_controller: Vec<(PacketFields, u64)>,
    /// The entries hit, in pipeline order.
    pub hits: Vec<Hit>,
    /// The table where no entry matched (and the packet was dropped), if any.
    pub miss: Option<u8>,
    /// Groups executed, in order.
    pub groups: Vec<u32>,
}

impl Trace {
    /// Neither output nor sent to the controller.
    pub fn dropped(&self) -> bool {
        self.outputs.is_empty() && self.to_controller.is_empty()
    }
    /// At least one copy went to the controller.
    pub fn sent_to_controller(&self) -> bool {
        !self.to_controller.is_empty()
    }
    /// The cookies of the entries hit, in pipeline order.
    pub fn cookies(&self) -> Vec<u64> {
        self.hits.iter().map(|h| h.cookie).collect()
    }
    /// The output ports, in order.
    pub fn ports(&self) -> Vec<u32> {
        self.outputs.iter().map(|(p, _)| *p).collect()
    }
    /// The packet as output on `port` (the first such output).
    pub fn output_on(&self, port: u32) -> Option<&PacketFields> {
        self.outputs
            .iter()
            .find(|(p, _)| *p == port)
            .map(|(_, f)| f)
    }
}

/// How a select group picks its bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SelectPolicy {
    /// The first live bucket (of non-zero weight): fully predictable.
    First,
    /// Weighted by a hash of the packet's addresses and ports, as OVS does (with a
    /// different hash): the same flow always picks the same bucket.
    #[default]
    Hash,
}

/// A group table entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupEntry {
    /// Type.
    pub group_type: GroupType,
    /// Buckets.
    pub buckets: Vec<Bucket>,
}

/// Ordered set of what write-actions accumulated (§5.10: one action of each type).
#[derive(Debug, Clone, Default)]
struct ActionSet {
    pop_vlan: bool,
    push_vlan: bool,
    set_fields: BTreeMap<Field, u128>,
    group: Option<u32>,
    output: Option<u32>,
}

impl ActionSet {
    fn write(&mut self, actions: &[Action]) {
        for a in actions {
            match a {
                Action::PopVlan => self.pop_vlan = true,
                Action::PushVlan(_) => self.push_vlan = true,
                Action::SetField(o) => {
                    if let Ok(t) = term(o) {
                        self.set_fields.insert(t.field, t.value);
                    }
                }
                Action::Group(g) => self.group = Some(*g),
                Action::Output { port, .. } => self.output = Some(*port),
                _ => {}
            }
        }
    }
}

/// Bound on chained groups and packet-out recursion.
const MAX_GROUP_DEPTH: usize = 16;

// ---------------------------------------------------------------------------------------
// The table.

/// One switch's pipeline: flow tables, groups, meters. See the module docs.
#[derive(Debug, Clone)]
pub struct FakeTable {
    n_tables: u16,
    tables: BTreeMap<u8, Vec<FlowEntry>>,
    groups: BTreeMap<u32, GroupEntry>,
    meters: BTreeMap<u32, MeterMod>,
    ports: Option<BTreeSet<u32>>,
    ports_down: BTreeSet<u32>,
    select: SelectPolicy,
    now: u64,
    next_id: u64,
    removed: Vec<Removed>,
}

impl Default for FakeTable {
    fn default() -> Self {
        Self::new()
    }
}

impl FakeTable {
    /// A switch with 255 tables (0..=254), like Open vSwitch, and no flows.
    pub fn new() -> Self {
        Self::with_tables(255)
    }

    /// A switch with `n` tables (0..n).
    pub fn with_tables(n: u8) -> Self {
        FakeTable {
            n_tables: u16::from(n),
            tables: BTreeMap::new(),
            groups: BTreeMap::new(),
            meters: BTreeMap::new(),
            ports: None,
            ports_down: BTreeSet::new(),
            select: SelectPolicy::default(),
            now: 0,
            next_id: 0,
            removed: Vec::new(),
        }
    }

    /// Tells the switch its ports, so FLOOD and ALL expand to them.
    pub fn with_ports<I: IntoIterator<Item = u32>>(mut self, ports: I) -> Self {
        self.ports = Some(ports.into_iter().collect());
        self
    }

    /// Sets how select groups pick a bucket.
    pub fn set_select_policy(&mut self, policy: SelectPolicy) {
        self.select = policy;
    }

    /// Marks a port down or up: FLOOD skips it, and group buckets watching it are dead.
    pub fn set_port_down(&mut self, port: u32, down: bool) {
        if down {
            self.ports_down.insert(port);
        } else {
            self.ports_down.remove(&port);
        }
    }

    /// The clock (seconds) used for installation times and timeouts.
    pub fn now(&self) -> u64 {
        self.now
    }

    /// Sets the clock without expiring anything.
    pub fn set_now(&mut self, now_secs: u64) {
        self.now = now_secs;
    }

    /// All entries, by table then in installation order.
    pub fn flows(&self) -> impl Iterator<Item = &FlowEntry> {
        self.tables.values().flatten()
    }

    /// The entries of one table.
    pub fn table(&self, table_id: u8) -> &[FlowEntry] {
        self.tables.get(&table_id).map_or(&[], Vec::as_slice)
    }

    /// Number of entries in all tables.
    pub fn flow_count(&self) -> usize {
        self.tables.values().map(Vec::len).sum()
    }

    /// The group table.
    pub fn groups(&self) -> &BTreeMap<u32, GroupEntry> {
        &self.groups
    }

    /// The meter table (each as last added or modified).
    pub fn meters(&self) -> &BTreeMap<u32, MeterMod> {
        &self.meters
    }

    /// Entries removed since the last call (by delete, group/meter delete, or timeout).
    pub fn take_removed(&mut self) -> Vec<Removed> {
        std::mem::take(&mut self.removed)
    }

    /// Applies one message as the switch would. FLOW_MOD, GROUP_MOD and METER_MOD change
    /// state; PACKET_OUT and everything else are accepted and ignored (trace a packet-out
    /// with [`FakeTable::packet_out`]). On error nothing changes.
    pub fn apply(&mut self, msg: &Message) -> Result<(), FakeTableError> {
        match msg {
            Message::FlowMod(fm) => self.flow_mod(fm),
            Message::GroupMod(gm) => self.group_mod(gm),
            Message::MeterMod(mm) => self.meter_mod(mm),
            _ => Ok(()),
        }
    }

    /// Applies messages in order, stopping at the first error (returned with its index).
    pub fn apply_all<'m, I>(&mut self, msgs: I) -> Result<(), (usize, FakeTableError)>
    where
        I: IntoIterator<Item = &'m Message>,
    {
        for (i, m) in msgs.into_iter().enumerate() {
            self.apply(m).map_err(|e| (i, e))?;
        }
        Ok(())
    }

    // --- FLOW_MOD ------------------------------------------------------------------------

    /// Applies a FLOW_MOD (§6.4).
    pub fn flow_mod(&mut self, fm: &FlowMod) -> Result<(), FakeTableError> {
        match fm.command {
            FlowModCommand::Add => self.flow_add(fm),
            FlowModCommand::Modify => self.flow_modify(fm, false),
            FlowModCommand::ModifyStrict => self.flow_modify(fm, true),
            FlowModCommand::Delete => self.flow_delete(fm, false),
            FlowModCommand::DeleteStrict => self.flow_delete(fm, true),
            FlowModCommand::Other(c) => Err(FakeTableError::BadCommand(u16::from(c))),
        }
    }

    fn check_table(&self, table_id: u8) -> Result<(), FakeTableError> {
        if u16::from(table_id) < self.n_tables {
            Ok(())
        } else {
            Err(FakeTableError::BadTableId(table_id))
        }
    }

    fn check_instructions(
        &self,
        table_id: u8,
        m: &Match,
        instructions: &[Instruction],
    ) -> Result<(), FakeTableError> {
        let mut seen = BTreeSet::new();
        for ins in instructions {
            let kind = match ins {
                Instruction::GotoTable(to) => {
                    if *to <= table_id || u16::from(*to) >= self.n_tables {
                        return Err(FakeTableError::BadGotoTable {
                            from: table_id,
                            to: *to,
                        });
                    }
                    "goto_table"
                }
                Instruction::WriteMetadata { .. } => "write_metadata",
                Instruction::WriteActions(a) => {
                    self.check_actions(a, Some(m))?;
                    "write_actions"
                }
                Instruction::ApplyActions(a) => {
                    self.check_actions(a, Some(m))?;
                    "apply_actions"
                }
                Instruction::ClearActions => "clear_actions",
                Instruction::Meter(id) => {
                    if !self.meters.contains_key(id) {
                        return Err(FakeTableError::UnknownMeter(*id));
                    }
                    "meter"
                }
                other => {
                    return Err(FakeTableError::UnsupportedInstruction(format!("{other:?}")));
                }
            };
            // §5.9: "The instruction set associated with each flow entry can contain a
            // maximum of one instruction of each type."
            if !seen.insert(kind) {
                return Err(FakeTableError::UnsupportedInstruction(format!(
                    "duplicate {kind}"
                )));
            }
        }
        Ok(())
    }

    /// Checks actions; `m` is the flow's match (None for group buckets and packet-outs).
    fn check_actions(&self, actions: &[Action], m: Option<&Match>) -> Result<(), FakeTableError> {
        for a in actions {
            match a {
                Action::Output { port, .. } => {
                    if *port == 0 || *port == port::ANY || (m.is_some() && *port == port::TABLE) {
                        return Err(FakeTableError::BadOutPort(*port));
                    }
                }
                Action::Group(g) => {
                    if !self.groups.contains_key(g) {
                        return Err(FakeTableError::BadOutGroup(*g));
                    }
                }
                Action::SetField(oxm) => check_set_field(oxm, m)?,
                Action::PushVlan(_)
                | Action::PopVlan
                | Action::SetQueue(_)
                | Action::DecNwTtl
                | Action::SetNwTtl(_)
                | Action::CopyTtlIn
                | Action::CopyTtlOut => {}
                // Open vSwitch's fin_timeout (Nicira NXAST_FIN_TIMEOUT = 19, 16 bytes): it
                // only shortens the rule's timeouts on FIN/RST, forwarding is unchanged.
                Action::Experimenter {
                    experimenter: 0x2320,
                    data,
                } if data.len() == 8 && data[..2] == [0, 19] => {}
                other => return Err(FakeTableError::UnsupportedAction(format!("{other:?}"))),
            }
        }
        Ok(())
    }

    fn flow_add(&mut self, fm: &FlowMod) -> Result<(), FakeTableError> {
        self.check_table(fm.table_id)?;
        let key = Key::from_match(&fm.match_)?;
        self.check_instructions(fm.table_id, &fm.match_, &fm.instructions)?;
        let now = self.now;
        let id = self.next_id;
        let table = self.tables.entry(fm.table_id).or_default();
        // §6.4: "If the OFPFF_CHECK_OVERLAP flag is set, the switch must first check for
        // any overlapping flow entries in the requested table. Two flow entries overlap if
        // a single packet may match both, and both flow entries have the same priority."
        if fm.flags.contains(FlowModFlags::CHECK_OVERLAP)
            && table
                .iter()
                .any(|e| e.priority == fm.priority && e.key != key && e.key.overlaps(&key))
        {
            return Err(FakeTableError::Overlap);
        }
        let mut entry = FlowEntry {
            id,
            table_id: fm.table_id,
            priority: fm.priority,
            cookie: fm.cookie,
            match_: fm.match_.clone(),
            instructions: fm.instructions.iter().cloned().collect(),
            idle_timeout: fm.idle_timeout,
            hard_timeout: fm.hard_timeout,
            flags: fm.flags,
            installed_at: now,
            last_used: now,
            packet_count: 0,
            key,
        };
        // §6.4: "If a flow entry with identical match fields and priority already resides
        // in the requested table, then that entry, including its duration, must be
        // cleared from the table, and the new flow entry added to the table. If the
        // OFPFF_RESET_COUNTS flag is set ... the counters of the replaced flow entry are
        // cleared, otherwise they should be copied from the replaced flow entry."
        if let Some(i) = table
            .iter()
            .position(|e| e.priority == entry.priority && e.key == entry.key)
        {
            if !fm.flags.contains(FlowModFlags::RESET_COUNTS) {
                entry.packet_count = table[i].packet_count;
            }
            table.remove(i);
        }
        table.push(entry);
        self.next_id += 1;
        Ok(())
    }

    /// Whether `e` passes the `cookie`/`cookie_mask` filter (§6.4, §7.3.4.1): with a
    /// non-zero mask, only entries whose cookie equals the request's under the mask.
    fn cookie_ok(fm: &FlowMod, e: &FlowEntry) -> bool {
        fm.cookie_mask == 0 || (e.cookie & fm.cookie_mask) == (fm.cookie & fm.cookie_mask)
    }

    fn selects(fm: &FlowMod, key: &Key, strict: bool, e: &FlowEntry) -> bool {
        let by_match = if strict {
            // Strict (§6.4): every field, mask included, and the priority are compared.
            e.priority == fm.priority && e.key == *key
        } else {
            e.key.within(key)
        };
        by_match && Self::cookie_ok(fm, e)
    }

    fn flow_modify(&mut self, fm: &FlowMod, strict: bool) -> Result<(), FakeTableError> {
        self.check_table(fm.table_id)?;
        let key = Key::from_match(&fm.match_)?;
        // OVS checks the new actions against each entry's match; the request's match is
        // what they have in common, so check against that.
        self.check_instructions(fm.table_id, &fm.match_, &fm.instructions)?;
        // §6.4: a modify that matches no entry changes nothing and is not an error. The
        // out_port and out_group filters are ignored for modify.
        if let Some(table) = self.tables.get_mut(&fm.table_id) {
            for e in table
                .iter_mut()
                .filter(|e| Self::selects(fm, &key, strict, e))
            {
                e.instructions = fm.instructions.iter().cloned().collect();
                if fm.flags.contains(FlowModFlags::RESET_COUNTS) {
                    e.packet_count = 0;
                }
            }
        }
        Ok(())
    }

    fn flow_delete(&mut self, fm: &FlowMod, strict: bool) -> Result<(), FakeTableError> {
        if fm.table_id != TABLE_ALL {
            self.check_table(fm.table_id)?;
        }
        let key = Key::from_match(&fm.match_)?;
        for (&tid, table) in self.tables.iter_mut() {
            if fm.table_id != TABLE_ALL && tid != fm.table_id {
                continue;
            }
            let mut kept = Vec::with_capacity(table.len());
            for e in table.drain(..) {
                // §6.4: deletes may be filtered by out_port / out_group (unless ANY): the
                // entry must have an output action to that port / a group action for it.
                let hit = Self::selects(fm, &key, strict, &e)
                    && (fm.out_port == port::ANY || e.outputs_to(fm.out_port))
                    && (fm.out_group == group::ANY || e.uses_group(fm.out_group));
                if hit {
                    self.removed.push(Removed {
                        entry: e,
                        reason: RemovalReason::Delete,
                    });
                } else {
                    kept.push(e);
                }
            }
            *table = kept;
        }
        Ok(())
    }

    // --- GROUP_MOD / METER_MOD -------------------------------------------------------------

    /// Applies a GROUP_MOD (§6.5, §7.3.4.2).
    pub fn group_mod(&mut self, gm: &GroupMod) -> Result<(), FakeTableError> {
        match gm.command {
            // Open vSwitch's OFPGC11_ADD_OR_MOD (0x8000) extension: either, as needed.
            GroupModCommand::Add | GroupModCommand::Modify | GroupModCommand::Other(0x8000) => {
                let id = gm.group_id;
                if id > group::MAX {
                    return Err(FakeTableError::InvalidGroup(id));
                }
                let exists = self.groups.contains_key(&id);
                if gm.command == GroupModCommand::Add && exists {
                    return Err(FakeTableError::GroupExists(id));
                }
                if gm.command == GroupModCommand::Modify && !exists {
                    return Err(FakeTableError::UnknownGroup(id));
                }
                if matches!(gm.group_type, GroupType::Other(_)) {
                    return Err(FakeTableError::BadGroupType);
                }
                if gm.group_type == GroupType::Indirect && gm.buckets.len() != 1 {
                    return Err(FakeTableError::BadBucket(
                        "an indirect group has one bucket",
                    ));
                }
                for b in &gm.buckets {
                    if b.actions
                        .iter()
                        .any(|a| matches!(a, Action::Group(g) if *g == id))
                    {
                        return Err(FakeTableError::GroupLoop(id));
                    }
                    self.check_actions(&b.actions, None)?;
                }
                self.groups.insert(
                    id,
                    GroupEntry {
                        group_type: gm.group_type,
                        buckets: gm.buckets.clone(),
                    },
                );
                Ok(())
            }
            GroupModCommand::Delete => {
                // §6.5: "if no group entry with the specified number exists, no error is
                // recorded ... Otherwise, the group is removed, and all flow entries
                // containing this group in a Group action are also removed."
                let gone: Vec<u32> = if gm.group_id == group::ALL {
                    self.groups.keys().copied().collect()
                } else {
                    self.groups
                        .contains_key(&gm.group_id)
                        .then_some(gm.group_id)
                        .into_iter()
                        .collect()
                };
                for g in &gone {
                    self.groups.remove(g);
                }
                self.remove_where(RemovalReason::GroupDelete, |e| {
                    gone.iter().any(|g| e.uses_group(*g))
                });
                Ok(())
            }
            GroupModCommand::Other(c) => Err(FakeTableError::BadCommand(c)),
        }
    }

    /// Applies a METER_MOD: meters are recorded, not enforced.
    pub fn meter_mod(&mut self, mm: &MeterMod) -> Result<(), FakeTableError> {
        let id = mm.meter_id;
        match mm.command {
            MeterModCommand::Add | MeterModCommand::Modify => {
                if id == 0 || id > ofp::meter::MAX {
                    return Err(FakeTableError::InvalidMeter(id));
                }
                let exists = self.meters.contains_key(&id);
                if mm.command == MeterModCommand::Add && exists {
                    return Err(FakeTableError::MeterExists(id));
                }
                if mm.command == MeterModCommand::Modify && !exists {
                    return Err(FakeTableError::UnknownMeter(id));
                }
                self.meters.insert(id, mm.clone());
                Ok(())
            }
            MeterModCommand::Delete => {
                // Deleting a meter removes the flow entries that use it (as OVS does).
                let gone: Vec<u32> = if id == ofp::meter::ALL {
                    self.meters.keys().copied().collect()
                } else {
                    self.meters
                        .contains_key(&id)
                        .then_some(id)
                        .into_iter()
                        .collect()
                };
                for m in &gone {
                    self.meters.remove(m);
                }
                self.remove_where(RemovalReason::MeterDelete, |e| {
                    e.meter().is_some_and(|m| gone.contains(&m))
                });
                Ok(())
            }
            MeterModCommand::Other(c) => Err(FakeTableError::BadCommand(c)),
        }
    }

    fn remove_where(&mut self, reason: RemovalReason, pred: impl Fn(&FlowEntry) -> bool) {
        for table in self.tables.values_mut() {
            let mut kept = Vec::with_capacity(table.len());
            for e in table.drain(..) {
                if pred(&e) {
                    self.removed.push(Removed { entry: e, reason });
                } else {
                    kept.push(e);
                }
            }
            *table = kept;
        }
    }

    // --- Timeouts --------------------------------------------------------------------------

    /// Advances the clock to `now_secs` and removes the entries whose hard timeout
    /// (since installation) or idle timeout (since last match by [`FakeTable::process`])
    /// has passed (§5.5). Returns them (they are also in [`FakeTable::take_removed`]).
    pub fn expire(&mut self, now_secs: u64) -> Vec<Removed> {
        self.now = self.now.max(now_secs);
        let now = self.now;
        let mut out = Vec::new();
        for table in self.tables.values_mut() {
            let mut kept = Vec::with_capacity(table.len());
            for e in table.drain(..) {
                let reason = if e.hard_timeout != 0
                    && now >= e.installed_at + u64::from(e.hard_timeout)
                {
                    Some(RemovalReason::HardTimeout)
                } else if e.idle_timeout != 0 && now >= e.last_used + u64::from(e.idle_timeout) {
                    Some(RemovalReason::IdleTimeout)
                } else {
                    None
                };
                match reason {
                    Some(reason) => out.push(Removed { entry: e, reason }),
                    None => kept.push(e),
                }
            }
            *table = kept;
        }
        self.removed.extend(out.iter().cloned());
        out
    }

    // --- Lookup ----------------------------------------------------------------------------

    /// Runs `pkt` through the pipeline from table 0 without changing any state.
    pub fn lookup(&self, pkt: &PacketFields) -> Trace {
        let mut trace = Trace::default();
        self.pipeline(*pkt, 0, &mut trace, 0);
        trace
    }

    /// Like [`FakeTable::lookup`], and counts the packet on the entries it hit and
    /// refreshes their idle timers, as a switch does.
    pub fn process(&mut self, pkt: &PacketFields) -> Trace {
        let trace = self.lookup(pkt);
        let now = self.now;
        for h in &trace.hits {
            if let Some(e) = self
                .tables
                .get_mut(&h.table_id)
                .and_then(|t| t.iter_mut().find(|e| e.id == h.entry_id))
            {
                e.packet_count += 1;
                e.last_used = now;
            }
        }
        trace
    }

    /// The packet described by `data` arriving on `in_port`, processed.
    pub fn process_frame(&mut self, in_port: u32, data: &[u8]) -> Result<Trace, ParseError> {
        Ok(self.process(&PacketFields::from_frame(in_port, data)?))
    }

    /// Runs a PACKET_OUT's actions on its frame (an output to TABLE submits it to table 0,
    /// §7.3.7). Errors as the switch would refuse the PACKET_OUT.
    pub fn packet_out(&self, po: &PacketOut) -> Result<Trace, FakeTableError> {
        self.check_actions(&po.actions, None)?;
        let mut pkt = PacketFields::from_frame(po.in_port, &po.data)
            .unwrap_or_else(|_| PacketFields::new(po.in_port));
        pkt.in_port = po.in_port;
        let mut trace = Trace::default();
        self.apply_actions(&po.actions, &mut pkt, &mut trace, 0);
        Ok(trace)
    }

    fn best(&self, table_id: u8, pkt: &PacketFields) -> Option<&FlowEntry> {
        // §5.3: "Only the highest priority flow entry that matches the packet is
        // selected"; with equal priorities the choice is undefined, we take the oldest.
        let mut best: Option<&FlowEntry> = None;
        for e in self
            .tables
            .get(&table_id)?
            .iter()
            .filter(|e| e.key.matches(pkt))
        {
            if best.is_none_or(|b| e.priority > b.priority) {
                best = Some(e);
            }
        }
        best
    }

    fn pipeline(&self, mut pkt: PacketFields, start: u8, trace: &mut Trace, depth: usize) {
        let mut set = ActionSet::default();
        let mut table_id = start;
        loop {
            let Some(e) = self.best(table_id, &pkt) else {
                // §5.4: "If the table-miss flow entry does not exist, by default packets
                // unmatched by flow entries are dropped (discarded)."
                trace.miss = Some(table_id);
                return;
            };
            trace.hits.push(Hit {
                table_id,
                priority: e.priority,
                cookie: e.cookie,
                entry_id: e.id,
            });
            // §5.9: the instructions run in this order whatever their order in the entry.
            let find = |pred: fn(&Instruction) -> bool| e.instructions.iter().find(|i| pred(i));
            if let Some(Instruction::ApplyActions(a)) =
                find(|i| matches!(i, Instruction::ApplyActions(_)))
            {
                self.apply_actions(a, &mut pkt, trace, depth);
            }
            if find(|i| matches!(i, Instruction::ClearActions)).is_some() {
                set = ActionSet::default();
            }
            if let Some(Instruction::WriteActions(a)) =
                find(|i| matches!(i, Instruction::WriteActions(_)))
            {
                set.write(a);
            }
            if let Some(Instruction::WriteMetadata { metadata, mask }) =
                find(|i| matches!(i, Instruction::WriteMetadata { .. }))
            {
                pkt.metadata = (pkt.metadata & !mask) | (metadata & mask);
            }
            match find(|i| matches!(i, Instruction::GotoTable(_))) {
                Some(Instruction::GotoTable(t)) if *t > table_id => table_id = *t,
                _ => break,
            }
        }
        // §5.10: the action set runs in its fixed order (pop, push, set-field, group,
        // output), and the output action only if there is no group action.
        if set.pop_vlan {
            pkt.vlan = None;
        }
        if set.push_vlan {
            pkt.vlan = Some(pkt.vlan.unwrap_or(0));
        }
        for (f, v) in &set.set_fields {
            f.set(&mut pkt, *v);
        }
        if let Some(g) = set.group {
            self.run_group(g, &pkt, trace, depth);
        } else if let Some(p) = set.output {
            self.output(p, &pkt, trace, depth);
        }
    }

    fn apply_actions(
        &self,
        actions: &[Action],
        pkt: &mut PacketFields,
        trace: &mut Trace,
        depth: usize,
    ) {
        for a in actions {
            match a {
                Action::Output { port, .. } => self.output(*port, pkt, trace, depth),
                Action::SetField(o) => {
                    if let Ok(t) = term(o) {
                        t.field.set(pkt, t.value);
                    }
                }
                Action::Group(g) => self.run_group(*g, pkt, trace, depth),
                // Push-VLAN: the new tag's VID is copied from the existing outer tag, or
                // zero (§5.12, table of push/pop semantics).
                Action::PushVlan(_) => pkt.vlan = Some(pkt.vlan.unwrap_or(0)),
                Action::PopVlan => pkt.vlan = None,
                _ => {}
            }
        }
    }

    fn output(&self, port: u32, pkt: &PacketFields, trace: &mut Trace, depth: usize) {
        match port {
            port::CONTROLLER => {
                let cookie = trace.hits.last().map_or(u64::MAX, |h| h.cookie);
                trace.to_controller.push((*pkt, cookie));
            }
            port::IN_PORT => trace.outputs.push((pkt.in_port, *pkt)),
            port::TABLE => {
                if depth < MAX_GROUP_DEPTH {
                    self.pipeline(*pkt, 0, trace, depth + 1);
                }
            }
            port::FLOOD | port::ALL => match &self.ports {
                Some(ports) => {
                    for &p in ports {
                        if p != pkt.in_port
                            && !(port == port::FLOOD && self.ports_down.contains(&p))
                        {
                            trace.outputs.push((p, *pkt));
                        }
                    }
                }
                None => trace.outputs.push((port, *pkt)),
            },
            // §7.2.1: a packet is sent back out of its input port only through OFPP_IN_PORT;
            // OVS drops an output to the input port by number.
            p if p == pkt.in_port => {}
            p => trace.outputs.push((p, *pkt)),
        }
    }

    fn run_group(&self, id: u32, pkt: &PacketFields, trace: &mut Trace, depth: usize) {
        let Some(g) = self.groups.get(&id) else {
            return;
        };
        if depth >= MAX_GROUP_DEPTH {
            return;
        }
        trace.groups.push(id);
        let live =
            |b: &&Bucket| b.watch_port == port::ANY || !self.ports_down.contains(&b.watch_port);
        let run = |b: &Bucket, trace: &mut Trace| {
            // Each bucket works on its own copy of the packet (§5.6.1).
            let mut copy = *pkt;
            self.apply_actions(&b.actions, &mut copy, trace, depth + 1);
        };
        match g.group_type {
            GroupType::All => g.buckets.iter().for_each(|b| run(b, trace)),
            GroupType::Indirect => {
                if let Some(b) = g.buckets.first() {
                    run(b, trace);
                }
            }
            GroupType::FastFailover => {
                if let Some(b) = g.buckets.iter().find(live) {
                    run(b, trace);
                }
            }
            GroupType::Select => {
                if let Some(b) = self.pick_bucket(&g.buckets, pkt) {
                    run(b, trace);
                }
            }
            GroupType::Other(_) => {}
        }
    }

    fn pick_bucket<'g>(&self, buckets: &'g [Bucket], pkt: &PacketFields) -> Option<&'g Bucket> {
        let live: Vec<&Bucket> = buckets
            .iter()
            .filter(|b| b.weight > 0)
            .filter(|b| b.watch_port == port::ANY || !self.ports_down.contains(&b.watch_port))
            .collect();
        match self.select {
            SelectPolicy::First => live.first().copied(),
            SelectPolicy::Hash => {
                let total: u64 = live.iter().map(|b| u64::from(b.weight)).sum();
                if total == 0 {
                    return None;
                }
                let mut point = flow_hash(pkt) % total;
                for b in live {
                    let w = u64::from(b.weight);
                    if point < w {
                        return Some(b);
                    }
                    point -= w;
                }
                None
            }
        }
    }
}

/// FNV-1a over the fields that identify a flow: stable across runs and platforms.
fn flow_hash(p: &PacketFields) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for b in bytes {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    eat(&p.eth_src.0);
    eat(&p.eth_dst.0);
    eat(&p.eth_type.to_be_bytes());
    eat(&[p.ip_proto.unwrap_or(0)]);
    eat(&p.ipv4_src.map_or([0; 4], |a| a.octets()));
    eat(&p.ipv4_dst.map_or([0; 4], |a| a.octets()));
    eat(&p.ipv6_src.map_or([0; 16], |a| a.octets()));
    eat(&p.ipv6_dst.map_or([0; 16], |a| a.octets()));
    eat(&p.tcp_src.or(p.udp_src).unwrap_or(0).to_be_bytes());
    eat(&p.tcp_dst.or(p.udp_dst).unwrap_or(0).to_be_bytes());
    h
}

/// SET_FIELD checks: no mask (OVS OFPBAC_BAD_SET_MASK), a writable field, and — for a
/// flow — prerequisites guaranteed by the flow's match (OVS OFPBAC_MATCH_INCONSISTENT).
fn check_set_field(oxm: &Oxm, m: Option<&Match>) -> Result<(), FakeTableError> {
    let name = || oxm.name().unwrap_or("oxm").to_string();
    // A masked OXM decoded from the wire is kept as Raw with hasmask; both are refused.
    if oxm.has_mask() {
        return Err(FakeTableError::BadSetMask(name()));
    }
    let t = term(oxm).map_err(|_| FakeTableError::BadSetType(name()))?;
    if !t.field.writable() {
        return Err(FakeTableError::BadSetType(name()));
    }
    if let Some(m) = m {
        // The match with this field added (replacing any existing one) must satisfy the
        // field's prerequisites (§7.2.3.6).
        let id = oxm.id();
        let mut probe = Match::new();
        for o in m.iter().filter(|o| o.id() != id) {
            probe.push(o.clone());
        }
        probe.push(oxm.clone());
        if let Err(MatchError::MissingPrerequisite { field, needs }) = probe.validate() {
            return Err(FakeTableError::SetFieldPrerequisite { field, needs });
        }
    }
    Ok(())
}
