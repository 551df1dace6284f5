//! The 8-byte OpenFlow header (§7.1): version, type, length, xid.

use bytes::{BufMut, BytesMut};

use crate::error::DecodeError;

/// Length of `struct ofp_header`.
pub const HEADER_LEN: usize = 8;
/// The largest message OpenFlow's 16-bit length field can describe (§7.1).
pub const MAX_MESSAGE_LEN: usize = 65_535;

/// OpenFlow 1.3 message types, `enum ofp_type` (§7.1).
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[repr(u8)]
pub enum MsgType {
    Hello = 0,
    Error = 1,
    EchoRequest = 2,
    EchoReply = 3,
    Experimenter = 4,
    FeaturesRequest = 5,
    FeaturesReply = 6,
    GetConfigRequest = 7,
    GetConfigReply = 8,
    SetConfig = 9,
    PacketIn = 10,
    FlowRemoved = 11,
    PortStatus = 12,
    PacketOut = 13,
    FlowMod = 14,
    GroupMod = 15,
    PortMod = 16,
    TableMod = 17,
    MultipartRequest = 18,
    MultipartReply = 19,
    BarrierRequest = 20,
    BarrierReply = 21,
    QueueGetConfigRequest = 22,
    QueueGetConfigReply = 23,
    RoleRequest = 24,
    RoleReply = 25,
    GetAsyncRequest = 26,
    GetAsyncReply = 27,
    SetAsync = 28,
    MeterMod = 29,
}

impl MsgType {
    /// The type for a wire value, if OpenFlow 1.3 defines it.
    pub fn from_u8(v: u8) -> Option<Self> {
        use MsgType::*;
        const ALL: [MsgType; 30] = [
            Hello,
            Error,
            EchoRequest,
            EchoReply,
            Experimenter,
            FeaturesRequest,
            FeaturesReply,
            GetConfigRequest,
            GetConfigReply,
            SetConfig,
            PacketIn,
            FlowRemoved,
            PortStatus,
            PacketOut,
            FlowMod,
            GroupMod,
            PortMod,
            TableMod,
            MultipartRequest,
            MultipartReply,
            BarrierRequest,
            BarrierReply,
            QueueGetConfigRequest,
            QueueGetConfigReply,
            RoleRequest,
            RoleReply,
            GetAsyncRequest,
            GetAsyncReply,
            SetAsync,
            MeterMod,
        ];
        ALL.get(usize::from(v)).copied()
    }
    /// The OpenFlow name, e.g. `OFPT_FLOW_MOD`.
    pub fn name(self) -> &'static str {
        use MsgType::*;
        match self {
            Hello => "OFPT_HELLO",
            Error => "OFPT_ERROR",
            EchoRequest => "OFPT_ECHO_REQUEST",
            EchoReply => "OFPT_ECHO_REPLY",
            Experimenter => "OFPT_EXPERIMENTER",
            FeaturesRequest => "OFPT_FEATURES_REQUEST",
            FeaturesReply => "OFPT_FEATURES_REPLY",
            GetConfigRequest => "OFPT_GET_CONFIG_REQUEST",
            GetConfigReply => "OFPT_GET_CONFIG_REPLY",
            SetConfig => "OFPT_SET_CONFIG",
            PacketIn => "OFPT_PACKET_IN",
            FlowRemoved => "OFPT_FLOW_REMOVED",
            PortStatus => "OFPT_PORT_STATUS",
            PacketOut => "OFPT_PACKET_OUT",
            FlowMod => "OFPT_FLOW_MOD",
            GroupMod => "OFPT_GROUP_MOD",
            PortMod => "OFPT_PORT_MOD",
            TableMod => "OFPT_TABLE_MOD",
            MultipartRequest => "OFPT_MULTIPART_REQUEST",
            MultipartReply => "OFPT_MULTIPART_REPLY",
            BarrierRequest => "OFPT_BARRIER_REQUEST",
            BarrierReply => "OFPT_BARRIER_REPLY",
            QueueGetConfigRequest => "OFPT_QUEUE_GET_CONFIG_REQUEST",
            QueueGetConfigReply => "OFPT_QUEUE_GET_CONFIG_REPLY",
            RoleRequest => "OFPT_ROLE_REQUEST",
            RoleReply => "OFPT_ROLE_REPLY",
            GetAsyncRequest => "OFPT_GET_ASYNC_REQUEST",
            GetAsyncReply => "OFPT_GET_ASYNC_REPLY",
            SetAsync => "OFPT_SET_ASYNC",
            MeterMod => "OFPT_METER_MOD",
        }
    }
}

/// `struct ofp_header` as plain values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Header {
    /// Wire version (0x04 for OpenFlow 1.3).
    pub version: u8,
    /// Raw message type.
    pub msg_type: u8,
    /// Length of the whole message including this header.
    pub length: u16,
    /// Transaction id.
    pub xid: u32,
}

impl Header {
    /// Parse the first 8 bytes. Checks only that 8 bytes exist and `length >= 8` (§7.1).
    pub fn parse(buf: &[u8]) -> Result<Header, DecodeError> {
        let v = HeaderView::new_checked(buf)?;
        Ok(Header {
            version: v.version(),
            msg_type: v.msg_type(),
            length: v.length(),
            xid: v.xid(),
        })
    }
    /// Append the 8 header bytes.
    pub fn write(&self, out: &mut BytesMut) {
        out.put_u8(self.version);
        out.put_u8(self.msg_type);
        out.put_u16(self.length);
        out.put_u32(self.xid);
    }
}

/// A typed view over the header bytes of a buffer (smoltcp `Packet<T>` style): accessors
/// read the wire directly.
#[derive(Debug, Clone, Copy)]
pub struct HeaderView<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> HeaderView<T> {
    /// Wrap a buffer that holds at least 8 bytes and whose length field is at least 8.
    pub fn new_checked(buffer: T) -> Result<Self, DecodeError> {
        let b = buffer.as_ref();
        if b.len() < HEADER_LEN {
            return Err(DecodeError::Truncated);
        }
        let v = HeaderView { buffer };
        if usize::from(v.length()) < HEADER_LEN {
            return Err(DecodeError::BadLength);
        }
        Ok(v)
    }
    fn byte(&self, i: usize) -> u8 {
        self.buffer.as_ref().get(i).copied().unwrap_or(0)
    }
    /// `version`.
    pub fn version(&self) -> u8 {
        self.byte(0)
    }
    /// `type`.
    pub fn msg_type(&self) -> u8 {
        self.byte(1)
    }
    /// `length`.
    pub fn length(&self) -> u16 {
        u16::from_be_bytes([self.byte(2), self.byte(3)])
    }
    /// `xid`.
    pub fn xid(&self) -> u32 {
        u32::from_be_bytes([self.byte(4), self.byte(5), self.byte(6), self.byte(7)])
    }
    /// The bytes after the header, up to `length` (or the end of the buffer if shorter).
    pub fn payload(&self) -> &[u8] {
        let b = self.buffer.as_ref();
        let end = usize::from(self.length()).min(b.len());
        b.get(HEADER_LEN..end).unwrap_or(&[])
    }
    /// The wrapped buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }
}
