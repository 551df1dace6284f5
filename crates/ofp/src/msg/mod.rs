//! OpenFlow 1.3 messages (§7.3 controller-to-switch, §7.4 asynchronous, §7.5 symmetric).

use bytes::{BufMut, Bytes, BytesMut};

use crate::OFP_VERSION;
use crate::errmsg::ErrorMsg;
use crate::error::{DecodeError, EncodeError};
use crate::header::{HEADER_LEN, Header, MAX_MESSAGE_LEN, MsgType};
use crate::wire::Reader;

pub mod async_config;
pub mod flow;
pub mod group;
pub mod hello;
pub mod meter;
pub mod multipart;
pub mod packet;
pub mod port;
pub mod queue;
pub mod role;
pub mod switch;
pub mod table;

use crate::oxm::Match;
use async_config::AsyncConfig;
use flow::{FlowMod, FlowRemoved};
use group::GroupMod;
use hello::Hello;
use meter::MeterMod;
use multipart::{MultipartReply, MultipartRequest};
use packet::{PacketIn, PacketOut};
use port::{PortMod, PortStatus};
use queue::{QueueGetConfigReply, QueueGetConfigRequest};
use role::RoleMsg;
use switch::{Experimenter, SwitchConfig, SwitchFeatures};
use table::TableMod;

/// Every OpenFlow 1.3 message.
///
/// Large variants (FLOW_MOD with its inline match and instructions) are not boxed on
/// purpose: boxing would put a heap allocation on the PACKET_IN → FLOW_MOD path. Hot code
/// can also encode the body types directly (`encode(xid, &flow_mod, out)`, see [`Encode`]).
#[allow(missing_docs, clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum Message {
    Hello(Hello),
    Error(ErrorMsg),
    EchoRequest(Bytes),
    EchoReply(Bytes),
    Experimenter(Experimenter),
    FeaturesRequest,
    FeaturesReply(SwitchFeatures),
    GetConfigRequest,
    GetConfigReply(SwitchConfig),
    SetConfig(SwitchConfig),
    PacketIn(PacketIn),
    FlowRemoved(FlowRemoved),
    PortStatus(PortStatus),
    PacketOut(PacketOut),
    FlowMod(FlowMod),
    GroupMod(GroupMod),
    PortMod(PortMod),
    TableMod(TableMod),
    MultipartRequest(MultipartRequest),
    MultipartReply(MultipartReply),
    BarrierRequest,
    BarrierReply,
    QueueGetConfigRequest(QueueGetConfigRequest),
    QueueGetConfigReply(QueueGetConfigReply),
    RoleRequest(RoleMsg),
    RoleReply(RoleMsg),
    GetAsyncRequest,
    GetAsyncReply(AsyncConfig),
    SetAsync(AsyncConfig),
    MeterMod(MeterMod),
}

impl Message {
    /// The header type of this message.
    pub fn msg_type(&self) -> MsgType {
        use Message as M;
        match self {
            M::Hello(_) => MsgType::Hello,
            M::Error(_) => MsgType::Error,
            M::EchoRequest(_) => MsgType::EchoRequest,
            M::EchoReply(_) => MsgType::EchoReply,
            M::Experimenter(_) => MsgType::Experimenter,
            M::FeaturesRequest => MsgType::FeaturesRequest,
            M::FeaturesReply(_) => MsgType::FeaturesReply,
            M::GetConfigRequest => MsgType::GetConfigRequest,
            M::GetConfigReply(_) => MsgType::GetConfigReply,
            M::SetConfig(_) => MsgType::SetConfig,
            M::PacketIn(_) => MsgType::PacketIn,
            M::FlowRemoved(_) => MsgType::FlowRemoved,
            M::PortStatus(_) => MsgType::PortStatus,
            M::PacketOut(_) => MsgType::PacketOut,
            M::FlowMod(_) => MsgType::FlowMod,
            M::GroupMod(_) => MsgType::GroupMod,
            M::PortMod(_) => MsgType::PortMod,
            M::TableMod(_) => MsgType::TableMod,
            M::MultipartRequest(_) => MsgType::MultipartRequest,
            M::MultipartReply(_) => MsgType::MultipartReply,
            M::BarrierRequest => MsgType::BarrierRequest,
            M::BarrierReply => MsgType::BarrierReply,
            M::QueueGetConfigRequest(_) => MsgType::QueueGetConfigRequest,
            M::QueueGetConfigReply(_) => MsgType::QueueGetConfigReply,
            M::RoleRequest(_) => MsgType::RoleRequest,
            M::RoleReply(_) => MsgType::RoleReply,
            M::GetAsyncRequest => MsgType::GetAsyncRequest,
            M::GetAsyncReply(_) => MsgType::GetAsyncReply,
            M::SetAsync(_) => MsgType::SetAsync,
            M::MeterMod(_) => MsgType::MeterMod,
        }
    }
}

/// Decode one whole message (exactly one frame, as [`crate::Framer`] yields).
///
/// The frame must be exactly as long as its header says: shorter is
/// [`DecodeError::Truncated`], longer is [`DecodeError::BadLength`]. Any version but 0x04
/// is [`DecodeError::BadVersion`], except for HELLO, which every version may send
/// (§6.3.1; use [`crate::negotiate_version`]). Never panics. Variable-length data (packet
/// data, opaque TLVs) is sliced from `frame` without copying.
pub fn decode(frame: Bytes) -> Result<(u32, Message), DecodeError> {
    let (h, t) = check_frame(&frame)?;
    let mut r = Reader::new(&frame);
    r.skip(HEADER_LEN)?;
    let r = &mut r;
    use Message as M;
    let msg = match t {
        MsgType::Hello => M::Hello(Hello::decode(r)?),
        MsgType::Error => M::Error(ErrorMsg::decode(r)?),
        MsgType::EchoRequest => M::EchoRequest(r.rest()),
        MsgType::EchoReply => M::EchoReply(r.rest()),
        MsgType::Experimenter => M::Experimenter(Experimenter::decode(r)?),
        MsgType::FeaturesRequest => M::FeaturesRequest,
        MsgType::FeaturesReply => M::FeaturesReply(SwitchFeatures::decode(r)?),
        MsgType::GetConfigRequest => M::GetConfigRequest,
        MsgType::GetConfigReply => M::GetConfigReply(SwitchConfig::decode(r)?),
        MsgType::SetConfig => M::SetConfig(SwitchConfig::decode(r)?),
        MsgType::PacketIn => {
            let mut m = M::PacketIn(PacketIn::empty());
            if let M::PacketIn(p) = &mut m {
                p.decode_into(r)?;
            }
            m
        }
        MsgType::FlowRemoved => M::FlowRemoved(FlowRemoved::decode(r)?),
        MsgType::PortStatus => M::PortStatus(PortStatus::decode(r)?),
        MsgType::PacketOut => M::PacketOut(PacketOut::decode(r)?),
        MsgType::FlowMod => {
            let mut m = M::FlowMod(FlowMod::add(Match::new()));
            if let M::FlowMod(f) = &mut m {
                f.decode_into(r)?;
            }
            m
        }
        MsgType::GroupMod => M::GroupMod(GroupMod::decode(r)?),
        MsgType::PortMod => M::PortMod(PortMod::decode(r)?),
        MsgType::TableMod => M::TableMod(TableMod::decode(r)?),
        MsgType::MultipartRequest => M::MultipartRequest(MultipartRequest::decode(r)?),
        MsgType::MultipartReply => M::MultipartReply(MultipartReply::decode(r)?),
        MsgType::BarrierRequest => M::BarrierRequest,
        MsgType::BarrierReply => M::BarrierReply,
        MsgType::QueueGetConfigRequest => {
            M::QueueGetConfigRequest(QueueGetConfigRequest::decode(r)?)
        }
        MsgType::QueueGetConfigReply => M::QueueGetConfigReply(QueueGetConfigReply::decode(r)?),
        MsgType::RoleRequest => M::RoleRequest(RoleMsg::decode(r)?),
        MsgType::RoleReply => M::RoleReply(RoleMsg::decode(r)?),
        MsgType::GetAsyncRequest => M::GetAsyncRequest,
        MsgType::GetAsyncReply => M::GetAsyncReply(AsyncConfig::decode(r)?),
        MsgType::SetAsync => M::SetAsync(AsyncConfig::decode(r)?),
        MsgType::MeterMod => M::MeterMod(MeterMod::decode(r)?),
    };
    // Every byte the header claims must belong to the message: bytes left over mean a
    // length that disagrees with the body, which would not re-encode identically.
    if !r.is_empty() {
        return Err(DecodeError::BadLength);
    }
    Ok((h.xid, msg))
}

/// The header checks of [`decode`]: the frame's length, the version, a known type.
fn check_frame(frame: &[u8]) -> Result<(Header, MsgType), DecodeError> {
    let h = Header::parse(frame)?;
    let len = usize::from(h.length);
    if frame.len() < len {
        return Err(DecodeError::Truncated);
    }
    if frame.len() > len {
        return Err(DecodeError::BadLength);
    }
    let t = MsgType::from_u8(h.msg_type);
    if h.version != OFP_VERSION && t != Some(MsgType::Hello) {
        return Err(DecodeError::BadVersion(h.version));
    }
    let t = t.ok_or(DecodeError::UnknownType(h.msg_type))?;
    Ok((h, t))
}

/// [`decode`] into `slot`, returning the xid. A PACKET_IN read into a slot that holds a
/// PACKET_IN already is decoded in place: a reader of many of them (a controller's hot
/// path) keeps one `Message` and moves no 792 bytes per message. Any other message is
/// decoded as [`decode`] does and stored. The same checks and errors as [`decode`]; after
/// an error `slot` holds some valid message, which one is unspecified.
pub fn decode_into(frame: Bytes, slot: &mut Message) -> Result<u32, DecodeError> {
    if let Message::PacketIn(p) = slot {
        let (h, t) = check_frame(&frame)?;
        if t == MsgType::PacketIn {
            let mut r = Reader::new(&frame);
            r.skip(HEADER_LEN)?;
            p.decode_into(&mut r)?;
            if !r.is_empty() {
                return Err(DecodeError::BadLength);
            }
            return Ok(h.xid);
        }
    }
    let (xid, m) = decode(frame)?;
    *slot = m;
    Ok(xid)
}

/// A message body that can be encoded on its own: [`Message`], or directly one of the
/// body types (e.g. `encode(xid, &flow_mod, out)`), which saves wrapping a large struct in
/// [`Message`] on the hot path.
pub trait Encode {
    /// Header type.
    fn msg_type(&self) -> MsgType;
    /// Append the body (everything after the 8-byte header).
    fn encode_body(&self, out: &mut BytesMut) -> Result<(), EncodeError>;
}

macro_rules! encode_direct {
    ($($t:ty => $mt:ident),* $(,)?) => {$(
        impl Encode for $t {
            #[inline]
            fn msg_type(&self) -> MsgType { MsgType::$mt }
            #[inline]
            fn encode_body(&self, out: &mut BytesMut) -> Result<(), EncodeError> { self.encode(out) }
        }
    )*};
}
encode_direct!(FlowMod => FlowMod, PacketOut => PacketOut, PacketIn => PacketIn, FlowRemoved => FlowRemoved,
    GroupMod => GroupMod, MeterMod => MeterMod, MultipartRequest => MultipartRequest,
    MultipartReply => MultipartReply, Hello => Hello);

impl Encode for Message {
    fn msg_type(&self) -> MsgType {
        Message::msg_type(self)
    }
    fn encode_body(&self, out: &mut BytesMut) -> Result<(), EncodeError> {
        encode_message_body(self, out)
    }
}

/// Append `msg` with header (version 0x04, `xid`) to `out` and fix its length field.
/// On error nothing is appended. A message longer than 65,535 bytes is
/// [`EncodeError::TooLong`] (§7.1: `length` is 16 bits).
pub fn encode<M: Encode + ?Sized>(
    xid: u32,
    msg: &M,
    out: &mut BytesMut,
) -> Result<(), EncodeError> {
    let start = out.len();
    Header {
        version: OFP_VERSION,
        msg_type: msg.msg_type() as u8,
        length: 0,
        xid,
    }
    .write(out);
    let r = msg.encode_body(out).and_then(|()| {
        let len = out.len() - start;
        if len > MAX_MESSAGE_LEN {
            return Err(EncodeError::TooLong(len));
        }
        let v = (len as u16).to_be_bytes();
        if let Some(s) = out.get_mut(start + 2..start + 4) {
            s.copy_from_slice(&v);
        }
        Ok(())
    });
    if r.is_err() {
        out.truncate(start);
    }
    r
}

fn encode_message_body(msg: &Message, out: &mut BytesMut) -> Result<(), EncodeError> {
    use Message as M;
    match msg {
        M::Hello(h) => h.encode(out)?,
        M::Error(e) => e.encode(out)?,
        M::EchoRequest(d) | M::EchoReply(d) => out.put_slice(d),
        M::Experimenter(e) => e.encode(out),
        M::FeaturesRequest
        | M::GetConfigRequest
        | M::BarrierRequest
        | M::BarrierReply
        | M::GetAsyncRequest => {}
        M::FeaturesReply(f) => f.encode(out),
        M::GetConfigReply(c) | M::SetConfig(c) => c.encode(out),
        M::PacketIn(p) => p.encode(out)?,
        M::FlowRemoved(f) => f.encode(out)?,
        M::PortStatus(p) => p.encode(out),
        M::PacketOut(p) => p.encode(out)?,
        M::FlowMod(f) => f.encode(out)?,
        M::GroupMod(g) => g.encode(out)?,
        M::PortMod(p) => p.encode(out),
        M::TableMod(t) => t.encode(out),
        M::MultipartRequest(m) => m.encode(out)?,
        M::MultipartReply(m) => m.encode(out)?,
        M::QueueGetConfigRequest(q) => q.encode(out),
        M::QueueGetConfigReply(q) => q.encode(out)?,
        M::RoleRequest(r) | M::RoleReply(r) => r.encode(out),
        M::GetAsyncReply(a) | M::SetAsync(a) => a.encode(out),
        M::MeterMod(m) => m.encode(out)?,
    }
    Ok(())
}
