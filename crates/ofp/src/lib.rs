//! # flowgate-ofp: the OpenFlow 1.3 wire codec
//!
//! Bytes in, typed messages out, and back again, losslessly; no I/O, no clock.
//! The reference is the OpenFlow Switch Specification 1.3.5; comments quote its sections
//! where a rule is enforced.
//!
//! - [`decode`] one whole message from a [`Bytes`] frame, [`encode`] a [`Message`] into a
//!   [`bytes::BytesMut`] (appending, length fixed up).
//! - [`Framer`] splits a TCP stream into frames (wrap it in a tokio-util `Decoder`).
//! - [`Match`] / [`Oxm`] with prerequisite checks ([`Match::validate`]); unknown OXM
//!   classes, experimenter actions/instructions and unknown properties are kept opaque so
//!   `encode(decode(x)) == x`.
//! - [`FlowModView`] / [`PacketOutView`] / [`FlowRemovedView`]: borrowed, allocation-free
//!   views over a received FLOW_MOD, PACKET_OUT or FLOW_REMOVED frame, checked as
//!   [`decode`] checks it, for readers that look at a few fields of many messages.
//! - [`negotiate_version`] for the HELLO exchange, [`MultipartAssembler`] for replies split
//!   with OFPMPF_REPLY_MORE, [`decode_file_bytes`] for files of concatenated messages.
//!
//! The PACKET_IN → FLOW_MOD/PACKET_OUT path allocates nothing: matches hold up to 8 OXMs
//! inline, action lists 4, instruction lists 2, and packet data is a slice of the frame.
//! No input makes it panic (it is fuzzed).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

#[macro_use]
mod macros;

pub mod action;
pub mod display;
pub mod errmsg;
pub mod error;
pub mod framing;
pub mod header;
pub mod instruction;
pub mod msg;
pub mod oxm;
pub mod strings;
pub mod view;
mod wire;

#[doc(hidden)]
pub mod fuzzing;

pub use bytes::Bytes;

pub use action::{Action, Actions};
pub use errmsg::{ErrorKind, ErrorMsg};
pub use error::{DecodeError, EncodeError};
pub use framing::{FrameError, Framer, decode_file_bytes};
pub use header::{HEADER_LEN, Header, HeaderView, MAX_MESSAGE_LEN, MsgType};
pub use instruction::{Instruction, Instructions};
pub use msg::async_config::AsyncConfig;
pub use msg::flow::{
    FlowMod, FlowModCommand, FlowModFixed, FlowModFlags, FlowRemoved, FlowRemovedReason,
};
pub use msg::group::{Bucket, GroupMod, GroupModCommand, GroupType};
pub use msg::hello::{Hello, HelloElement, negotiate_version};
pub use msg::meter::{MeterBand, MeterFlags, MeterMod, MeterModCommand};
pub use msg::multipart::{
    AggregateStats, BucketCounter, Desc, FlowStats, FlowStatsRequest, GroupDesc, GroupFeatures,
    GroupStats, MULTIPART_MORE, MeterBandStats, MeterConfig, MeterFeatures, MeterStats,
    MultipartAssembler, MultipartReply, MultipartReplyBody, MultipartRequest, MultipartRequestBody,
    PortStats, QueueStats, ReassemblyError, TableFeatureProp, TableFeatures, TableStats,
};
pub use msg::packet::{PacketIn, PacketInReason, PacketOut};
pub use msg::port::{PortDesc, PortMod, PortReason, PortStatus};
pub use msg::queue::{PacketQueue, QueueGetConfigReply, QueueGetConfigRequest, QueueProp};
pub use msg::role::{ControllerRole, RoleMsg};
pub use msg::switch::{Experimenter, SwitchConfig, SwitchFeatures};
pub use msg::table::TableMod;
pub use msg::{Encode, Message, decode, decode_into, encode};
pub use oxm::{Match, MatchError, Oxm, OxmId, RawOxm};
pub use strings::{FixedStr, PortName};
pub use view::{ActionRef, FlowModView, FlowRemovedView, OxmRef, PacketInView, PacketOutView};

/// Wire version of OpenFlow 1.3.
pub const OFP_VERSION: u8 = 0x04;
/// `OFP_NO_BUFFER`: the packet is not buffered on the switch.
pub const NO_BUFFER: u32 = 0xffff_ffff;
/// `OFPCML_NO_BUFFER`: send the whole packet to the controller, do not buffer it.
pub const CONTROLLER_MAX_LEN_NO_BUFFER: u16 = 0xffff;
/// `OFPCML_MAX`: the largest max_len that still asks for buffering.
pub const CONTROLLER_MAX_LEN_MAX: u16 = 0xffe5;

/// Port numbers (`enum ofp_port_no`, §7.2.1).
pub mod port {
    /// OFPP_MAX: last usable physical port.
    pub const MAX: u32 = 0xffff_ff00;
    /// OFPP_IN_PORT.
    pub const IN_PORT: u32 = 0xffff_fff8;
    /// OFPP_TABLE (PACKET_OUT only).
    pub const TABLE: u32 = 0xffff_fff9;
    /// OFPP_NORMAL.
    pub const NORMAL: u32 = 0xffff_fffa;
    /// OFPP_FLOOD.
    pub const FLOOD: u32 = 0xffff_fffb;
    /// OFPP_ALL.
    pub const ALL: u32 = 0xffff_fffc;
    /// OFPP_CONTROLLER.
    pub const CONTROLLER: u32 = 0xffff_fffd;
    /// OFPP_LOCAL.
    pub const LOCAL: u32 = 0xffff_fffe;
    /// OFPP_ANY (wildcard).
    pub const ANY: u32 = 0xffff_ffff;
}

/// Group numbers (`enum ofp_group`, §7.3.4.2).
pub mod group {
    /// OFPG_MAX.
    pub const MAX: u32 = 0xffff_ff00;
    /// OFPG_ALL (delete / stats of all groups).
    pub const ALL: u32 = 0xffff_fffc;
    /// OFPG_ANY (wildcard).
    pub const ANY: u32 = 0xffff_ffff;
}

/// Meter numbers (`enum ofp_meter`, §7.3.4.4).
pub mod meter {
    /// OFPM_MAX.
    pub const MAX: u32 = 0xffff_0000;
    /// OFPM_SLOWPATH.
    pub const SLOWPATH: u32 = 0xffff_fffd;
    /// OFPM_CONTROLLER.
    pub const CONTROLLER: u32 = 0xffff_fffe;
    /// OFPM_ALL.
    pub const ALL: u32 = 0xffff_ffff;
}

/// Table numbers (`enum ofp_table`, §7.3.3).
pub mod table {
    /// OFPTT_MAX.
    pub const MAX: u8 = 0xfe;
    /// OFPTT_ALL.
    pub const ALL: u8 = 0xff;
}

/// Queue numbers.
pub mod queue {
    /// OFPQ_ALL.
    pub const ALL: u32 = 0xffff_ffff;
}
