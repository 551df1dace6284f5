//! OFPT_MULTIPART_REQUEST / OFPT_MULTIPART_REPLY (§7.3.5) and reassembly of replies split
//! with OFPMPF_REPLY_MORE.

use std::collections::HashMap;

use bytes::{BufMut, Bytes, BytesMut};

use crate::error::{DecodeError, EncodeError};
use crate::instruction::{Instructions, decode_instructions, encode_instructions};
use crate::msg::flow::FlowModFlags;
use crate::msg::group::{Bucket, GroupType, decode_buckets, encode_buckets};
use crate::msg::meter::{MeterBand, MeterFlags, decode_bands, encode_bands};
use crate::msg::port::PortDesc;
use crate::oxm::Match;
use crate::strings::{DescStr, ShortStr};
use crate::wire::{LenMark, Reader, pad8};
use crate::{group, port, table};

/// `OFPMPF_REQ_MORE` / `OFPMPF_REPLY_MORE`: more parts follow (§7.3.5).
pub const MULTIPART_MORE: u16 = 1;

/// `enum ofp_multipart_type` values.
#[allow(missing_docs)]
pub mod multipart_type {
    pub const DESC: u16 = 0;
    pub const FLOW: u16 = 1;
    pub const AGGREGATE: u16 = 2;
    pub const TABLE: u16 = 3;
    pub const PORT_STATS: u16 = 4;
    pub const QUEUE: u16 = 5;
    pub const GROUP: u16 = 6;
    pub const GROUP_DESC: u16 = 7;
    pub const GROUP_FEATURES: u16 = 8;
    pub const METER: u16 = 9;
    pub const METER_CONFIG: u16 = 10;
    pub const METER_FEATURES: u16 = 11;
    pub const TABLE_FEATURES: u16 = 12;
    pub const PORT_DESC: u16 = 13;
    pub const EXPERIMENTER: u16 = 0xffff;
}
use multipart_type as mt;

/// `struct ofp_flow_stats_request` (also the aggregate request).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct FlowStatsRequest {
    /// Table, or OFPTT_ALL.
    pub table_id: u8,
    /// Filter on output port (ANY = none).
    pub out_port: u32,
    /// Filter on output group (ANY = none).
    pub out_group: u32,
    /// Cookie to match under `cookie_mask`.
    pub cookie: u64,
    /// Cookie bits that must match (0 = no restriction).
    pub cookie_mask: u64,
    /// Fields to match.
    #[cfg_attr(feature = "serde", serde(rename = "match"))]
    pub match_: Match,
}

impl Default for FlowStatsRequest {
    /// All flows in all tables.
    fn default() -> Self {
        FlowStatsRequest {
            table_id: table::ALL,
            out_port: port::ANY,
            out_group: group::ANY,
            cookie: 0,
            cookie_mask: 0,
            match_: Match::new(),
        }
    }
}

impl FlowStatsRequest {
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let table_id = r.u8()?;
        r.skip(3)?;
        let out_port = r.u32()?;
        let out_group = r.u32()?;
        r.skip(4)?;
        let cookie = r.u64()?;
        let cookie_mask = r.u64()?;
        let match_ = Match::decode(r)?;
        Ok(FlowStatsRequest {
            table_id,
            out_port,
            out_group,
            cookie,
            cookie_mask,
            match_,
        })
    }
    fn encode(&self, out: &mut BytesMut) -> Result<(), EncodeError> {
        out.put_u8(self.table_id);
        out.put_bytes(0, 3);
        out.put_u32(self.out_port);
        out.put_u32(self.out_group);
        out.put_u32(0);
        out.put_u64(self.cookie);
        out.put_u64(self.cookie_mask);
        self.match_.encode(out)
    }
}

/// A table-features property (§7.3.5.5.2): type and body (without padding) kept raw, so
/// unknown properties round-trip; typed views via the accessor methods.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct TableFeatureProp {
    /// `enum ofp_table_feature_prop_type` (0 INSTRUCTIONS .. 15 APPLY_SETFIELD_MISS,
    /// 0xfffe EXPERIMENTER, 0xffff EXPERIMENTER_MISS).
    pub typ: u16,
    /// Body after type and length, without the padding to 8.
    pub data: Bytes,
}

impl TableFeatureProp {
    /// For NEXT_TABLES(_MISS) (2, 3): the table ids.
    pub fn next_tables(&self) -> Option<&[u8]> {
        matches!(self.typ, 2 | 3).then_some(&self.data[..])
    }
    /// For MATCH, WILDCARDS, (WRITE|APPLY)_SETFIELD(_MISS) (8, 10, 12..15): the OXM headers.
    pub fn oxm_ids(&self) -> Option<Vec<u32>> {
        if !matches!(self.typ, 8 | 10 | 12..=15) {
            return None;
        }
        Some(
            self.data
                .chunks_exact(4)
                .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        )
    }
    /// For INSTRUCTIONS(_MISS) and (WRITE|APPLY)_ACTIONS(_MISS) (0, 1, 4..7): the type ids
    /// (experimenter entries are longer; their type is listed).
    pub fn type_ids(&self) -> Option<Vec<u16>> {
        if !matches!(self.typ, 0 | 1 | 4..=7) {
            return None;
        }
        let mut v = Vec::new();
        let mut rest = &self.data[..];
        while rest.len() >= 4 {
            let t = u16::from_be_bytes([rest[0], rest[1]]);
            let l = usize::from(u16::from_be_bytes([rest[2], rest[3]])).max(4);
            v.push(t);
            rest = rest.get(l..).unwrap_or(&[]);
        }
        Some(v)
    }
}

/// `struct ofp_table_features`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct TableFeatures {
    /// Table.
    pub table_id: u8,
    /// Name (32 raw bytes).
    pub name: ShortStr,
    /// Metadata bits the table can match.
    pub metadata_match: u64,
    /// Metadata bits the table can write.
    pub metadata_write: u64,
    /// `ofp_table_config` bits.
    pub config: u32,
    /// Max entries.
    pub max_entries: u32,
    /// Properties.
    pub properties: Vec<TableFeatureProp>,
}

impl TableFeatures {
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let len = usize::from(r.peek_u16(0)?);
        if len < 64 {
            return Err(DecodeError::BadLength);
        }
        let mut b = r.sub(len)?;
        b.skip(2)?;
        let table_id = b.u8()?;
        b.skip(5)?;
        let name = ShortStr::from_raw(b.array()?);
        let metadata_match = b.u64()?;
        let metadata_write = b.u64()?;
        let config = b.u32()?;
        let max_entries = b.u32()?;
        let mut properties = Vec::new();
        while !b.is_empty() {
            let typ = b.peek_u16(0)?;
            let plen = usize::from(b.peek_u16(2)?);
            if plen < 4 {
                return Err(DecodeError::BadLength);
            }
            let mut p = b.sub(plen)?;
            p.skip(4)?;
            // Properties are padded to 8; the padding is not in `length` (§7.3.5.5.2).
            let pad = (8 - plen % 8) % 8;
            b.skip(pad)?;
            properties.push(TableFeatureProp {
                typ,
                data: p.rest(),
            });
        }
        Ok(TableFeatures {
            table_id,
            name,
            metadata_match,
            metadata_write,
            config,
            max_entries,
            properties,
        })
    }
    fn encode(&self, out: &mut BytesMut) -> Result<(), EncodeError> {
        let start = out.len();
        let m = LenMark::at(out, start);
        out.put_u8(self.table_id);
        out.put_bytes(0, 5);
        out.put_slice(&self.name.0);
        out.put_u64(self.metadata_match);
        out.put_u64(self.metadata_write);
        out.put_u32(self.config);
        out.put_u32(self.max_entries);
        for p in &self.properties {
            let ps = out.len();
            out.put_u16(p.typ);
            let pm = LenMark::at(out, ps);
            out.put_slice(&p.data);
            pm.finish(out, "table feature property")?;
            pad8(out, ps);
        }
        m.finish(out, "table features")?;
        Ok(())
    }
}

impl ShortStr {
    fn from_raw(a: [u8; 32]) -> Self {
        crate::strings::FixedStr(a)
    }
}

/// Body of a multipart request.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum MultipartRequestBody {
    /// OFPMP_DESC.
    Desc,
    /// OFPMP_FLOW.
    Flow(FlowStatsRequest),
    /// OFPMP_AGGREGATE.
    Aggregate(FlowStatsRequest),
    /// OFPMP_TABLE.
    Table,
    /// OFPMP_PORT_STATS (port or ANY).
    PortStats {
        /// Port.
        port_no: u32,
    },
    /// OFPMP_QUEUE.
    Queue {
        /// Port or ANY.
        port_no: u32,
        /// Queue or OFPQ_ALL.
        queue_id: u32,
    },
    /// OFPMP_GROUP (group or ALL).
    Group {
        /// Group.
        group_id: u32,
    },
    /// OFPMP_GROUP_DESC.
    GroupDesc,
    /// OFPMP_GROUP_FEATURES.
    GroupFeatures,
    /// OFPMP_METER (meter or OFPM_ALL).
    Meter {
        /// Meter.
        meter_id: u32,
    },
    /// OFPMP_METER_CONFIG.
    MeterConfig {
        /// Meter.
        meter_id: u32,
    },
    /// OFPMP_METER_FEATURES.
    MeterFeatures,
    /// OFPMP_TABLE_FEATURES (empty = query).
    TableFeatures(Vec<TableFeatures>),
    /// OFPMP_PORT_DESC.
    PortDesc,
    /// OFPMP_EXPERIMENTER.
    Experimenter {
        /// Experimenter id.
        experimenter: u32,
        /// Experimenter type.
        exp_type: u32,
        /// Body.
        data: Bytes,
    },
    /// An undefined multipart type, body kept raw.
    Unknown {
        /// Type.
        typ: u16,
        /// Body.
        data: Bytes,
    },
}

/// OFPT_MULTIPART_REQUEST.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct MultipartRequest {
    /// OFPMPF_REQ_MORE.
    pub flags: u16,
    /// Body.
    pub body: MultipartRequestBody,
}

impl MultipartRequest {
    /// A single-part request.
    pub fn new(body: MultipartRequestBody) -> Self {
        MultipartRequest { flags: 0, body }
    }
    /// The multipart type on the wire.
    pub fn mp_type(&self) -> u16 {
        use MultipartRequestBody as B;
        match &self.body {
            B::Desc => mt::DESC,
            B::Flow(_) => mt::FLOW,
            B::Aggregate(_) => mt::AGGREGATE,
            B::Table => mt::TABLE,
            B::PortStats { .. } => mt::PORT_STATS,
            B::Queue { .. } => mt::QUEUE,
            B::Group { .. } => mt::GROUP,
            B::GroupDesc => mt::GROUP_DESC,
            B::GroupFeatures => mt::GROUP_FEATURES,
            B::Meter { .. } => mt::METER,
            B::MeterConfig { .. } => mt::METER_CONFIG,
            B::MeterFeatures => mt::METER_FEATURES,
            B::TableFeatures(_) => mt::TABLE_FEATURES,
            B::PortDesc => mt::PORT_DESC,
            B::Experimenter { .. } => mt::EXPERIMENTER,
            B::Unknown { typ, .. } => *typ,
        }
    }
    /// OFPMPF_REQ_MORE is set.
    pub fn more(&self) -> bool {
        self.flags & MULTIPART_MORE != 0
    }

    pub(crate) fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        use MultipartRequestBody as B;
        let (typ, flags) = decode_header(r)?;
        let u32_pad = |r: &mut Reader<'_>| -> Result<u32, DecodeError> {
            let v = r.u32()?;
            r.skip(4)?;
            Ok(v)
        };
        let body = match typ {
            mt::DESC => B::Desc,
            mt::FLOW => B::Flow(FlowStatsRequest::decode(r)?),
            mt::AGGREGATE => B::Aggregate(FlowStatsRequest::decode(r)?),
            mt::TABLE => B::Table,
            mt::PORT_STATS => B::PortStats {
                port_no: u32_pad(r)?,
            },
            mt::QUEUE => B::Queue {
                port_no: r.u32()?,
                queue_id: r.u32()?,
            },
            mt::GROUP => B::Group {
                group_id: u32_pad(r)?,
            },
            mt::GROUP_DESC => B::GroupDesc,
            mt::GROUP_FEATURES => B::GroupFeatures,
            mt::METER => B::Meter {
                meter_id: u32_pad(r)?,
            },
            mt::METER_CONFIG => B::MeterConfig {
                meter_id: u32_pad(r)?,
            },
            mt::METER_FEATURES => B::MeterFeatures,
            mt::TABLE_FEATURES => B::TableFeatures(list(r, TableFeatures::decode)?),
            mt::PORT_DESC => B::PortDesc,
            mt::EXPERIMENTER => {
                let (experimenter, exp_type, data) = decode_experimenter(r)?;
                B::Experimenter {
                    experimenter,
                    exp_type,
                    data,
                }
            }
            _ => B::Unknown {
                typ,
                data: r.rest(),
            },
        };
        Ok(MultipartRequest { flags, body })
    }

    pub(crate) fn encode(&self, out: &mut BytesMut) -> Result<(), EncodeError> {
        use MultipartRequestBody as B;
        encode_header(out, self.mp_type(), self.flags);
        match &self.body {
            B::Desc
            | B::Table
            | B::GroupDesc
            | B::GroupFeatures
            | B::MeterFeatures
            | B::PortDesc => {}
            B::Flow(f) | B::Aggregate(f) => f.encode(out)?,
            B::PortStats { port_no: v }
            | B::Group { group_id: v }
            | B::Meter { meter_id: v }
            | B::MeterConfig { meter_id: v } => {
                out.put_u32(*v);
                out.put_u32(0);
            }
            B::Queue { port_no, queue_id } => {
                out.put_u32(*port_no);
                out.put_u32(*queue_id);
            }
            B::TableFeatures(v) => {
                for t in v {
                    t.encode(out)?;
                }
            }
            B::Experimenter {
                experimenter,
                exp_type,
                data,
            } => encode_experimenter(out, *experimenter, *exp_type, data),
            B::Unknown { data, .. } => out.put_slice(data),
        }
        Ok(())
    }
}

/// `struct ofp_desc`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Desc {
    /// Manufacturer.
    pub mfr_desc: DescStr,
    /// Hardware.
    pub hw_desc: DescStr,
    /// Software.
    pub sw_desc: DescStr,
    /// Serial number (32 bytes).
    pub serial_num: ShortStr,
    /// Datapath description.
    pub dp_desc: DescStr,
}

/// `struct ofp_flow_stats`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct FlowStats {
    /// Table.
    pub table_id: u8,
    /// Age, seconds.
    pub duration_sec: u32,
    /// Age, extra nanoseconds.
    pub duration_nsec: u32,
    /// Priority.
    pub priority: u16,
    /// Idle timeout.
    pub idle_timeout: u16,
    /// Hard timeout.
    pub hard_timeout: u16,
    /// Flags.
    pub flags: FlowModFlags,
    /// Cookie.
    pub cookie: u64,
    /// Packets.
    pub packet_count: u64,
    /// Bytes.
    pub byte_count: u64,
    /// Match.
    #[cfg_attr(feature = "serde", serde(rename = "match"))]
    pub match_: Match,
    /// Instructions.
    pub instructions: Instructions,
}

impl FlowStats {
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let len = usize::from(r.peek_u16(0)?);
        if len < 56 {
            return Err(DecodeError::BadLength);
        }
        let mut b = r.sub(len)?;
        b.skip(2)?;
        let table_id = b.u8()?;
        b.skip(1)?;
        let duration_sec = b.u32()?;
        let duration_nsec = b.u32()?;
        let priority = b.u16()?;
        let idle_timeout = b.u16()?;
        let hard_timeout = b.u16()?;
        let flags = FlowModFlags(b.u16()?);
        b.skip(4)?;
        let cookie = b.u64()?;
        let packet_count = b.u64()?;
        let byte_count = b.u64()?;
        let match_ = Match::decode(&mut b)?;
        let instructions = decode_instructions(b)?;
        Ok(FlowStats {
            table_id,
            duration_sec,
            duration_nsec,
            priority,
            idle_timeout,
            hard_timeout,
            flags,
            cookie,
            packet_count,
            byte_count,
            match_,
            instructions,
        })
    }
    fn encode(&self, out: &mut BytesMut) -> Result<(), EncodeError> {
        let start = out.len();
        let m = LenMark::at(out, start);
        out.put_u8(self.table_id);
        out.put_u8(0);
        out.put_u32(self.duration_sec);
        out.put_u32(self.duration_nsec);
        out.put_u16(self.priority);
        out.put_u16(self.idle_timeout);
        out.put_u16(self.hard_timeout);
        out.put_u16(self.flags.0);
        out.put_u32(0);
        out.put_u64(self.cookie);
        out.put_u64(self.packet_count);
        out.put_u64(self.byte_count);
        self.match_.encode(out)?;
        encode_instructions(&self.instructions, out)?;
        m.finish(out, "flow stats")?;
        Ok(())
    }
}

/// `struct ofp_aggregate_stats_reply`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct AggregateStats {
    /// Packets.
    pub packet_count: u64,
    /// Bytes.
    pub byte_count: u64,
    /// Flows.
    pub flow_count: u32,
}

/// `struct ofp_table_stats`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct TableStats {
    /// Table.
    pub table_id: u8,
    /// Active entries.
    pub active_count: u32,
    /// Lookups.
    pub lookup_count: u64,
    /// Hits.
    pub matched_count: u64,
}

/// `struct ofp_port_stats`.
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct PortStats {
    pub port_no: u32,
    pub rx_packets: u64,
    pub tx_packets: u64,
    pub rx_bytes: u64,
    pub tx_bytes: u64,
    pub rx_dropped: u64,
    pub tx_dropped: u64,
    pub rx_errors: u64,
    pub tx_errors: u64,
    pub rx_frame_err: u64,
    pub rx_over_err: u64,
    pub rx_crc_err: u64,
    pub collisions: u64,
    pub duration_sec: u32,
    pub duration_nsec: u32,
}

/// `struct ofp_queue_stats`.
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct QueueStats {
    pub port_no: u32,
    pub queue_id: u32,
    pub tx_bytes: u64,
    pub tx_packets: u64,
    pub tx_errors: u64,
    pub duration_sec: u32,
    pub duration_nsec: u32,
}

/// `struct ofp_bucket_counter`.
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct BucketCounter {
    pub packet_count: u64,
    pub byte_count: u64,
}

/// `struct ofp_group_stats`.
#[allow(missing_docs)]
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct GroupStats {
    pub group_id: u32,
    pub ref_count: u32,
    pub packet_count: u64,
    pub byte_count: u64,
    pub duration_sec: u32,
    pub duration_nsec: u32,
    pub bucket_stats: Vec<BucketCounter>,
}

/// `struct ofp_group_desc`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct GroupDesc {
    /// Group type.
    pub group_type: GroupType,
    /// Group id.
    pub group_id: u32,
    /// Buckets.
    pub buckets: Vec<Bucket>,
}

/// `struct ofp_group_features`.
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct GroupFeatures {
    /// Bitmap of OFPGT_* supported.
    pub types: u32,
    /// OFPGFC_* capabilities.
    pub capabilities: u32,
    /// Max groups per type.
    pub max_groups: [u32; 4],
    /// OFPAT_* bitmaps per type.
    pub actions: [u32; 4],
}

/// `struct ofp_meter_band_stats`.
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct MeterBandStats {
    pub packet_band_count: u64,
    pub byte_band_count: u64,
}

/// `struct ofp_meter_stats`.
#[allow(missing_docs)]
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct MeterStats {
    pub meter_id: u32,
    pub flow_count: u32,
    pub packet_in_count: u64,
    pub byte_in_count: u64,
    pub duration_sec: u32,
    pub duration_nsec: u32,
    pub band_stats: Vec<MeterBandStats>,
}

/// `struct ofp_meter_config`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct MeterConfig {
    /// Flags.
    pub flags: MeterFlags,
    /// Meter id.
    pub meter_id: u32,
    /// Bands.
    pub bands: Vec<MeterBand>,
}

/// `struct ofp_meter_features`.
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct MeterFeatures {
    pub max_meter: u32,
    pub band_types: u32,
    pub capabilities: u32,
    pub max_bands: u8,
    pub max_color: u8,
}

/// Body of a multipart reply.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum MultipartReplyBody {
    /// OFPMP_DESC.
    Desc(Box<Desc>),
    /// OFPMP_FLOW.
    Flow(Vec<FlowStats>),
    /// OFPMP_AGGREGATE.
    Aggregate(AggregateStats),
    /// OFPMP_TABLE.
    Table(Vec<TableStats>),
    /// OFPMP_PORT_STATS.
    PortStats(Vec<PortStats>),
    /// OFPMP_PORT_DESC.
    PortDesc(Vec<PortDesc>),
    /// OFPMP_QUEUE.
    Queue(Vec<QueueStats>),
    /// OFPMP_GROUP.
    Group(Vec<GroupStats>),
    /// OFPMP_GROUP_DESC.
    GroupDesc(Vec<GroupDesc>),
    /// OFPMP_GROUP_FEATURES.
    GroupFeatures(GroupFeatures),
    /// OFPMP_METER.
    Meter(Vec<MeterStats>),
    /// OFPMP_METER_CONFIG.
    MeterConfig(Vec<MeterConfig>),
    /// OFPMP_METER_FEATURES.
    MeterFeatures(MeterFeatures),
    /// OFPMP_TABLE_FEATURES.
    TableFeatures(Vec<TableFeatures>),
    /// OFPMP_EXPERIMENTER.
    Experimenter {
        /// Experimenter id.
        experimenter: u32,
        /// Experimenter type.
        exp_type: u32,
        /// Body.
        data: Bytes,
    },
    /// An undefined multipart type, body kept raw.
    Unknown {
        /// Type.
        typ: u16,
        /// Body.
        data: Bytes,
    },
}

/// OFPT_MULTIPART_REPLY.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct MultipartReply {
    /// OFPMPF_REPLY_MORE.
    pub flags: u16,
    /// Body.
    pub body: MultipartReplyBody,
}

/// The multipart header after the OpenFlow header, the same in requests and replies
/// (§7.3.5): type, flags, 4 bytes of padding.
fn decode_header(r: &mut Reader<'_>) -> Result<(u16, u16), DecodeError> {
    let typ = r.u16()?;
    let flags = r.u16()?;
    r.skip(4)?;
    Ok((typ, flags))
}

fn encode_header(out: &mut BytesMut, typ: u16, flags: u16) {
    out.put_u16(typ);
    out.put_u16(flags);
    out.put_u32(0);
}

/// OFPMP_EXPERIMENTER's body, the same in requests and replies (§7.3.5.15): experimenter
/// id, experimenter type, then data kept raw.
fn decode_experimenter(r: &mut Reader<'_>) -> Result<(u32, u32, Bytes), DecodeError> {
    Ok((r.u32()?, r.u32()?, r.rest()))
}

fn encode_experimenter(out: &mut BytesMut, experimenter: u32, exp_type: u32, data: &[u8]) {
    out.put_u32(experimenter);
    out.put_u32(exp_type);
    out.put_slice(data);
}

/// Entries decoded with `f` until the body ends.
fn list<T>(
    r: &mut Reader<'_>,
    f: impl Fn(&mut Reader<'_>) -> Result<T, DecodeError>,
) -> Result<Vec<T>, DecodeError> {
    let mut v = Vec::new();
    while !r.is_empty() {
        v.push(f(r)?);
    }
    Ok(v)
}

impl MultipartReply {
    /// A single-part reply.
    pub fn new(body: MultipartReplyBody) -> Self {
        MultipartReply { flags: 0, body }
    }
    /// OFPMPF_REPLY_MORE is set: more parts with the same xid follow.
    pub fn more(&self) -> bool {
        self.flags & MULTIPART_MORE != 0
    }
    /// The multipart type on the wire.
    pub fn mp_type(&self) -> u16 {
        use MultipartReplyBody as B;
        match &self.body {
            B::Desc(_) => mt::DESC,
            B::Flow(_) => mt::FLOW,
            B::Aggregate(_) => mt::AGGREGATE,
            B::Table(_) => mt::TABLE,
            B::PortStats(_) => mt::PORT_STATS,
            B::PortDesc(_) => mt::PORT_DESC,
            B::Queue(_) => mt::QUEUE,
            B::Group(_) => mt::GROUP,
            B::GroupDesc(_) => mt::GROUP_DESC,
            B::GroupFeatures(_) => mt::GROUP_FEATURES,
            B::Meter(_) => mt::METER,
            B::MeterConfig(_) => mt::METER_CONFIG,
            B::MeterFeatures(_) => mt::METER_FEATURES,
            B::TableFeatures(_) => mt::TABLE_FEATURES,
            B::Experimenter { .. } => mt::EXPERIMENTER,
            B::Unknown { typ, .. } => *typ,
        }
    }

    pub(crate) fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        use MultipartReplyBody as B;
        let (typ, flags) = decode_header(r)?;
        let body = match typ {
            mt::DESC => B::Desc(Box::new(Desc {
                mfr_desc: crate::strings::FixedStr(r.array()?),
                hw_desc: crate::strings::FixedStr(r.array()?),
                sw_desc: crate::strings::FixedStr(r.array()?),
                serial_num: crate::strings::FixedStr(r.array()?),
                dp_desc: crate::strings::FixedStr(r.array()?),
            })),
            mt::FLOW => B::Flow(list(r, FlowStats::decode)?),
            mt::AGGREGATE => {
                let a = AggregateStats {
                    packet_count: r.u64()?,
                    byte_count: r.u64()?,
                    flow_count: r.u32()?,
                };
                r.skip(4)?;
                B::Aggregate(a)
            }
            mt::TABLE => B::Table(list(r, |r| {
                let table_id = r.u8()?;
                r.skip(3)?;
                Ok(TableStats {
                    table_id,
                    active_count: r.u32()?,
                    lookup_count: r.u64()?,
                    matched_count: r.u64()?,
                })
            })?),
            mt::PORT_STATS => B::PortStats(list(r, |r| {
                let port_no = r.u32()?;
                r.skip(4)?;
                Ok(PortStats {
                    port_no,
                    rx_packets: r.u64()?,
                    tx_packets: r.u64()?,
                    rx_bytes: r.u64()?,
                    tx_bytes: r.u64()?,
                    rx_dropped: r.u64()?,
                    tx_dropped: r.u64()?,
                    rx_errors: r.u64()?,
                    tx_errors: r.u64()?,
                    rx_frame_err: r.u64()?,
                    rx_over_err: r.u64()?,
                    rx_crc_err: r.u64()?,
                    collisions: r.u64()?,
                    duration_sec: r.u32()?,
                    duration_nsec: r.u32()?,
                })
            })?),
            mt::PORT_DESC => B::PortDesc(list(r, PortDesc::decode)?),
            mt::QUEUE => B::Queue(list(r, |r| {
                Ok(QueueStats {
                    port_no: r.u32()?,
                    queue_id: r.u32()?,
                    tx_bytes: r.u64()?,
                    tx_packets: r.u64()?,
                    tx_errors: r.u64()?,
                    duration_sec: r.u32()?,
                    duration_nsec: r.u32()?,
                })
            })?),
            mt::GROUP => B::Group(list(r, |r| {
                let len = usize::from(r.peek_u16(0)?);
                if len < 40 || (len - 40) % 16 != 0 {
                    return Err(DecodeError::BadLength);
                }
                let mut b = r.sub(len)?;
                b.skip(4)?;
                let group_id = b.u32()?;
                let ref_count = b.u32()?;
                b.skip(4)?;
                let packet_count = b.u64()?;
                let byte_count = b.u64()?;
                let duration_sec = b.u32()?;
                let duration_nsec = b.u32()?;
                let bucket_stats = list(&mut b, |b| {
                    Ok(BucketCounter {
                        packet_count: b.u64()?,
                        byte_count: b.u64()?,
                    })
                })?;
                Ok(GroupStats {
                    group_id,
                    ref_count,
                    packet_count,
                    byte_count,
                    duration_sec,
                    duration_nsec,
                    bucket_stats,
                })
            })?),
            mt::GROUP_DESC => B::GroupDesc(list(r, |r| {
                let len = usize::from(r.peek_u16(0)?);
                if len < 8 {
                    return Err(DecodeError::BadLength);
                }
                let mut b = r.sub(len)?;
                b.skip(2)?;
                let group_type = GroupType::from_raw(b.u8()?);
                b.skip(1)?;
                let group_id = b.u32()?;
                Ok(GroupDesc {
                    group_type,
                    group_id,
                    buckets: decode_buckets(b)?,
                })
            })?),
            mt::GROUP_FEATURES => B::GroupFeatures(GroupFeatures {
                types: r.u32()?,
                capabilities: r.u32()?,
                max_groups: [r.u32()?, r.u32()?, r.u32()?, r.u32()?],
                actions: [r.u32()?, r.u32()?, r.u32()?, r.u32()?],
            }),
            mt::METER => B::Meter(list(r, |r| {
                let meter_id = r.u32()?;
                let len = usize::from(r.u16()?);
                if len < 40 || (len - 40) % 16 != 0 {
                    return Err(DecodeError::BadLength);
                }
                let mut b = r.sub(len - 6)?;
                b.skip(6)?;
                let flow_count = b.u32()?;
                let packet_in_count = b.u64()?;
                let byte_in_count = b.u64()?;
                let duration_sec = b.u32()?;
                let duration_nsec = b.u32()?;
                let band_stats = list(&mut b, |b| {
                    Ok(MeterBandStats {
                        packet_band_count: b.u64()?,
                        byte_band_count: b.u64()?,
                    })
                })?;
                Ok(MeterStats {
                    meter_id,
                    flow_count,
                    packet_in_count,
                    byte_in_count,
                    duration_sec,
                    duration_nsec,
                    band_stats,
                })
            })?),
            mt::METER_CONFIG => B::MeterConfig(list(r, |r| {
                let len = usize::from(r.peek_u16(0)?);
                if len < 8 {
                    return Err(DecodeError::BadLength);
                }
                let mut b = r.sub(len)?;
                b.skip(2)?;
                let flags = MeterFlags(b.u16()?);
                let meter_id = b.u32()?;
                Ok(MeterConfig {
                    flags,
                    meter_id,
                    bands: decode_bands(b)?,
                })
            })?),
            mt::METER_FEATURES => {
                let f = MeterFeatures {
                    max_meter: r.u32()?,
                    band_types: r.u32()?,
                    capabilities: r.u32()?,
                    max_bands: r.u8()?,
                    max_color: r.u8()?,
                };
                r.skip(2)?;
                B::MeterFeatures(f)
            }
            mt::TABLE_FEATURES => B::TableFeatures(list(r, TableFeatures::decode)?),
            mt::EXPERIMENTER => {
                let (experimenter, exp_type, data) = decode_experimenter(r)?;
                B::Experimenter {
                    experimenter,
                    exp_type,
                    data,
                }
            }
            _ => B::Unknown {
                typ,
                data: r.rest(),
            },
        };
        Ok(MultipartReply { flags, body })
    }

    pub(crate) fn encode(&self, out: &mut BytesMut) -> Result<(), EncodeError> {
        use MultipartReplyBody as B;
        encode_header(out, self.mp_type(), self.flags);
        match &self.body {
            B::Desc(d) => {
                out.put_slice(&d.mfr_desc.0);
                out.put_slice(&d.hw_desc.0);
                out.put_slice(&d.sw_desc.0);
                out.put_slice(&d.serial_num.0);
                out.put_slice(&d.dp_desc.0);
            }
            B::Flow(v) => {
                for f in v {
                    f.encode(out)?;
                }
            }
            B::Aggregate(a) => {
                out.put_u64(a.packet_count);
                out.put_u64(a.byte_count);
                out.put_u32(a.flow_count);
                out.put_u32(0);
            }
            B::Table(v) => {
                for t in v {
                    out.put_u8(t.table_id);
                    out.put_bytes(0, 3);
                    out.put_u32(t.active_count);
                    out.put_u64(t.lookup_count);
                    out.put_u64(t.matched_count);
                }
            }
            B::PortStats(v) => {
                for p in v {
                    out.put_u32(p.port_no);
                    out.put_u32(0);
                    for c in [
                        p.rx_packets,
                        p.tx_packets,
                        p.rx_bytes,
                        p.tx_bytes,
                        p.rx_dropped,
                        p.tx_dropped,
                        p.rx_errors,
                        p.tx_errors,
                        p.rx_frame_err,
                        p.rx_over_err,
                        p.rx_crc_err,
                        p.collisions,
                    ] {
                        out.put_u64(c);
                    }
                    out.put_u32(p.duration_sec);
                    out.put_u32(p.duration_nsec);
                }
            }
            B::PortDesc(v) => {
                for p in v {
                    p.encode(out);
                }
            }
            B::Queue(v) => {
                for q in v {
                    out.put_u32(q.port_no);
                    out.put_u32(q.queue_id);
                    out.put_u64(q.tx_bytes);
                    out.put_u64(q.tx_packets);
                    out.put_u64(q.tx_errors);
                    out.put_u32(q.duration_sec);
                    out.put_u32(q.duration_nsec);
                }
            }
            B::Group(v) => {
                for g in v {
                    let start = out.len();
                    let m = LenMark::at(out, start);
                    out.put_u16(0);
                    out.put_u32(g.group_id);
                    out.put_u32(g.ref_count);
                    out.put_u32(0);
                    out.put_u64(g.packet_count);
                    out.put_u64(g.byte_count);
                    out.put_u32(g.duration_sec);
                    out.put_u32(g.duration_nsec);
                    for b in &g.bucket_stats {
                        out.put_u64(b.packet_count);
                        out.put_u64(b.byte_count);
                    }
                    m.finish(out, "group stats")?;
                }
            }
            B::GroupDesc(v) => {
                for g in v {
                    let start = out.len();
                    let m = LenMark::at(out, start);
                    out.put_u8(g.group_type.to_raw());
                    out.put_u8(0);
                    out.put_u32(g.group_id);
                    encode_buckets(&g.buckets, out)?;
                    m.finish(out, "group desc")?;
                }
            }
            B::GroupFeatures(g) => {
                out.put_u32(g.types);
                out.put_u32(g.capabilities);
                for v in g.max_groups.iter().chain(&g.actions) {
                    out.put_u32(*v);
                }
            }
            B::Meter(v) => {
                for s in v {
                    let start = out.len();
                    out.put_u32(s.meter_id);
                    let m = LenMark::at(out, start);
                    out.put_bytes(0, 6);
                    out.put_u32(s.flow_count);
                    out.put_u64(s.packet_in_count);
                    out.put_u64(s.byte_in_count);
                    out.put_u32(s.duration_sec);
                    out.put_u32(s.duration_nsec);
                    for b in &s.band_stats {
                        out.put_u64(b.packet_band_count);
                        out.put_u64(b.byte_band_count);
                    }
                    m.finish(out, "meter stats")?;
                }
            }
            B::MeterConfig(v) => {
                for c in v {
                    let start = out.len();
                    let m = LenMark::at(out, start);
                    out.put_u16(c.flags.0);
                    out.put_u32(c.meter_id);
                    encode_bands(&c.bands, out)?;
                    m.finish(out, "meter config")?;
                }
            }
            B::MeterFeatures(f) => {
                out.put_u32(f.max_meter);
                out.put_u32(f.band_types);
                out.put_u32(f.capabilities);
                out.put_u8(f.max_bands);
                out.put_u8(f.max_color);
                out.put_u16(0);
            }
            B::TableFeatures(v) => {
                for t in v {
                    t.encode(out)?;
                }
            }
            B::Experimenter {
                experimenter,
                exp_type,
                data,
            } => encode_experimenter(out, *experimenter, *exp_type, data),
            B::Unknown { data, .. } => out.put_slice(data),
        }
        Ok(())
    }
}

impl MultipartReplyBody {
    /// Append the entries of a later part of the same reply (§7.3.5: a reply may be split
    /// over several messages with OFPMPF_REPLY_MORE). Returns `false` (and leaves `self`
    /// unchanged) if the bodies are of different types or a type that cannot be split.
    pub fn extend(&mut self, next: MultipartReplyBody) -> bool {
        use MultipartReplyBody as B;
        match (self, next) {
            (B::Flow(a), B::Flow(b)) => a.extend(b),
            (B::Table(a), B::Table(b)) => a.extend(b),
            (B::PortStats(a), B::PortStats(b)) => a.extend(b),
            (B::PortDesc(a), B::PortDesc(b)) => a.extend(b),
            (B::Queue(a), B::Queue(b)) => a.extend(b),
            (B::Group(a), B::Group(b)) => a.extend(b),
            (B::GroupDesc(a), B::GroupDesc(b)) => a.extend(b),
            (B::Meter(a), B::Meter(b)) => a.extend(b),
            (B::MeterConfig(a), B::MeterConfig(b)) => a.extend(b),
            (B::TableFeatures(a), B::TableFeatures(b)) => a.extend(b),
            (
                B::Experimenter {
                    experimenter: e1,
                    exp_type: t1,
                    data: d1,
                },
                B::Experimenter {
                    experimenter,
                    exp_type,
                    data,
                },
            ) if *e1 == experimenter && *t1 == exp_type => {
                // In place when `d1` is the only handle on its buffer (as it is after the
                // first join), so that joining n parts copies each once, not the whole
                // body again for each.
                let mut v = BytesMut::from(std::mem::take(d1));
                v.extend_from_slice(&data);
                *d1 = v.freeze();
            }
            _ => return false,
        }
        true
    }
}

/// Why a multipart part could not be merged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ReassemblyError {
    /// A later part has a different multipart type than the first.
    #[error("multipart part of a different type for xid {0}")]
    TypeMismatch(u32),
    /// Too many replies are open at once.
    #[error("too many pending multipart replies")]
    TooManyPending,
    /// One reply grew past its bound in parts or bytes; what it had is dropped.
    #[error("multipart reply for xid {0} is too large")]
    TooLarge(u32),
}

/// Parts one reply may have by default ([`MultipartAssembler::new`]).
pub const DEFAULT_MAX_REPLY_PARTS: u32 = 4096;
/// Bytes one reply may have by default, its parts' bodies as encoded: a flow-stats reply
/// of a few hundred thousand rules.
pub const DEFAULT_MAX_REPLY_BYTES: usize = 64 << 20;

/// Reassembles multipart replies split over several messages (OFPMPF_REPLY_MORE), keyed by
/// xid. Feed every MULTIPART_REPLY; a whole reply comes out when its last part arrives.
///
/// Bounded: at most `max_pending` replies open at once, each of at most `max_parts` parts
/// and `max_bytes` bytes, so a misbehaving switch (an endless REPLY_MORE) costs at most
/// `max_pending × max_bytes`.
#[derive(Debug)]
pub struct MultipartAssembler {
    pending: HashMap<u32, Partial>,
    max_pending: usize,
    max_parts: u32,
    max_bytes: usize,
    /// Where a part is encoded to measure it (reused).
    scratch: BytesMut,
}

/// A reply still waiting for parts, and what it holds so far.
#[derive(Debug)]
struct Partial {
    reply: MultipartReply,
    parts: u32,
    bytes: usize,
}

impl Default for MultipartAssembler {
    fn default() -> Self {
        MultipartAssembler::new(1)
    }
}

impl MultipartAssembler {
    /// At most `max_pending` replies open at once, each within the default bounds
    /// ([`DEFAULT_MAX_REPLY_PARTS`], [`DEFAULT_MAX_REPLY_BYTES`]).
    pub fn new(max_pending: usize) -> Self {
        Self::with_limits(
            max_pending,
            DEFAULT_MAX_REPLY_PARTS,
            DEFAULT_MAX_REPLY_BYTES,
        )
    }
    /// At most `max_pending` replies open at once, each of at most `max_parts` parts and
    /// `max_bytes` bytes of bodies.
    pub fn with_limits(max_pending: usize, max_parts: u32, max_bytes: usize) -> Self {
        MultipartAssembler {
            pending: HashMap::new(),
            max_pending: max_pending.max(1),
            max_parts: max_parts.max(1),
            max_bytes,
            scratch: BytesMut::new(),
        }
    }
    /// Add a part. `Ok(Some(reply))` when the reply is complete (its `flags` cleared of
    /// REPLY_MORE), `Ok(None)` while more parts are expected. On an error, what the reply
    /// held so far is dropped.
    pub fn push(
        &mut self,
        xid: u32,
        part: MultipartReply,
    ) -> Result<Option<MultipartReply>, ReassemblyError> {
        let more = part.more();
        let bytes = self.measure(&part);
        let merged = match self.pending.remove(&xid) {
            Some(mut acc) => {
                acc.parts += 1;
                acc.bytes = acc.bytes.saturating_add(bytes);
                if acc.parts > self.max_parts || acc.bytes > self.max_bytes {
                    return Err(ReassemblyError::TooLarge(xid));
                }
                if !acc.reply.body.extend(part.body) {
                    return Err(ReassemblyError::TypeMismatch(xid));
                }
                acc
            }
            None if bytes > self.max_bytes => return Err(ReassemblyError::TooLarge(xid)),
            None => Partial {
                reply: part,
                parts: 1,
                bytes,
            },
        };
        if more {
            if self.pending.len() >= self.max_pending {
                return Err(ReassemblyError::TooManyPending);
            }
            self.pending.insert(xid, merged);
            Ok(None)
        } else {
            let mut m = merged.reply;
            m.flags &= !MULTIPART_MORE;
            Ok(Some(m))
        }
    }
    /// A part's body as encoded: about its length on the wire (one part, at most 64 KiB).
    fn measure(&mut self, part: &MultipartReply) -> usize {
        self.scratch.clear();
        match part.encode(&mut self.scratch) {
            Ok(()) => self.scratch.len(),
            // Not a part any switch could have sent: over every bound.
            Err(_) => usize::MAX,
        }
    }
    /// Drop a pending reply (e.g. on timeout or error for that xid).
    pub fn abandon(&mut self, xid: u32) -> bool {
        self.pending.remove(&xid).is_some()
    }
    /// Number of replies waiting for more parts.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn experimenter(more: bool, data: &[u8]) -> MultipartReply {
        MultipartReply {
            flags: if more { MULTIPART_MORE } else { 0 },
            body: MultipartReplyBody::Experimenter {
                experimenter: 0x2320,
                exp_type: 7,
                data: Bytes::copy_from_slice(data),
            },
        }
    }

    /// Experimenter parts are joined in order, whatever their number.
    #[test]
    fn experimenter_parts_are_joined_in_order() {
        let mut asm = MultipartAssembler::new(4);
        let mut want = Vec::new();
        for i in 0..200u8 {
            assert_eq!(asm.push(3, experimenter(true, &[i; 100])), Ok(None));
            want.extend_from_slice(&[i; 100]);
        }
        let done = asm
            .push(3, experimenter(false, b"end"))
            .expect("within the bounds")
            .expect("complete");
        want.extend_from_slice(b"end");
        let MultipartReplyBody::Experimenter { data, .. } = done.body else {
            panic!("an experimenter body: {done:?}");
        };
        assert_eq!(&data[..], &want[..]);
        assert_eq!(asm.pending(), 0);
    }

    /// One reply cannot grow without bound: past its parts or its bytes it is an error,
    /// and dropped; other replies are unaffected.
    #[test]
    fn one_reply_is_bounded_in_parts_and_bytes() {
        let mut asm = MultipartAssembler::with_limits(4, 3, 1 << 20);
        assert_eq!(asm.push(1, experimenter(true, b"a")), Ok(None));
        assert_eq!(asm.push(2, experimenter(true, b"x")), Ok(None));
        assert_eq!(asm.push(1, experimenter(true, b"b")), Ok(None));
        assert_eq!(asm.push(1, experimenter(true, b"c")), Ok(None));
        assert_eq!(
            asm.push(1, experimenter(true, b"d")),
            Err(ReassemblyError::TooLarge(1))
        );
        assert_eq!(asm.pending(), 1, "the reply that grew too long is dropped");
        assert!(
            asm.push(2, experimenter(false, b"y"))
                .expect("ok")
                .is_some()
        );

        let mut asm = MultipartAssembler::with_limits(4, 1000, 10_000);
        let part = || experimenter(true, &[0; 3000]);
        for _ in 0..3 {
            assert_eq!(asm.push(5, part()), Ok(None));
        }
        assert_eq!(asm.push(5, part()), Err(ReassemblyError::TooLarge(5)));
        assert_eq!(asm.pending(), 0);
        // A single part over the bound is refused at once.
        assert_eq!(
            asm.push(6, experimenter(true, &[0; 20_000])),
            Err(ReassemblyError::TooLarge(6))
        );
    }
}
