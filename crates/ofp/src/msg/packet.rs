//! OFPT_PACKET_IN (§7.4.1) and OFPT_PACKET_OUT (§7.3.7).

use bytes::{BufMut, Bytes, BytesMut};

use crate::action::{Actions, decode_actions, encode_actions};
use crate::error::{DecodeError, EncodeError};
use crate::oxm::Match;
use crate::wire::Reader;

value_enum!(/// `enum ofp_packet_in_reason`.
PacketInReason: u8 {
    /// OFPR_NO_MATCH (table miss).
    NoMatch = 0,
    /// OFPR_ACTION (output to controller).
    Action = 1,
    /// OFPR_INVALID_TTL.
    InvalidTtl = 2,
});

/// OFPT_PACKET_IN.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct PacketIn {
    /// Buffer id, or NO_BUFFER.
    pub buffer_id: u32,
    /// Full length of the frame.
    pub total_len: u16,
    /// Why it was sent.
    pub reason: PacketInReason,
    /// Table that was looked up.
    pub table_id: u8,
    /// Cookie of the flow entry that sent it (all ones on a miss).
    pub cookie: u64,
    /// Packet metadata (in_port etc.).
    #[cfg_attr(feature = "serde", serde(rename = "match"))]
    pub match_: Match,
    /// The frame (or its first bytes).
    pub data: Bytes,
}

impl PacketIn {
    /// A whole frame `data` that missed every rule, from `in_port`, not buffered: what a
    /// switch sends for a table-miss entry whose action is OUTPUT:CONTROLLER (§7.4.1; the
    /// cookie is all ones when it belongs to no particular entry).
    pub fn table_miss(in_port: u32, data: Bytes) -> Self {
        PacketIn {
            buffer_id: crate::NO_BUFFER,
            total_len: data.len() as u16,
            reason: PacketInReason::NoMatch,
            table_id: 0,
            cookie: u64::MAX,
            match_: Match::new().with(crate::Oxm::InPort(in_port)),
            data,
        }
    }

    /// `in_port` from the match (§7.4.1: it is always present).
    #[inline]
    pub fn in_port(&self) -> Option<u32> {
        self.match_.in_port()
    }
    /// An empty PACKET_IN to decode into.
    #[inline]
    pub(crate) fn empty() -> Self {
        PacketIn {
            buffer_id: 0,
            total_len: 0,
            reason: PacketInReason::NoMatch,
            table_id: 0,
            cookie: 0,
            match_: Match::new(),
            data: Bytes::new(),
        }
    }
    /// Decode in place (the message is built where it will live: no copies of the inline
    /// match on the hot path).
    #[inline]
    pub(crate) fn decode_into(&mut self, r: &mut Reader<'_>) -> Result<(), DecodeError> {
        self.buffer_id = r.u32()?;
        self.total_len = r.u16()?;
        self.reason = PacketInReason::from_raw(r.u8()?);
        self.table_id = r.u8()?;
        self.cookie = r.u64()?;
        // `decode_into` appends: a reused PACKET_IN drops its earlier match first.
        self.match_.clear();
        self.match_.decode_into(r)?;
        r.skip(2)?;
        self.data = r.rest();
        Ok(())
    }
    pub(crate) fn encode(&self, out: &mut BytesMut) -> Result<(), EncodeError> {
        out.put_u32(self.buffer_id);
        out.put_u16(self.total_len);
        out.put_u8(self.reason.to_raw());
        out.put_u8(self.table_id);
        out.put_u64(self.cookie);
        self.match_.encode(out)?;
        out.put_u16(0);
        out.put_slice(&self.data);
        Ok(())
    }
}

/// OFPT_PACKET_OUT.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct PacketOut {
    /// Buffer id, or NO_BUFFER (then `data` is the frame).
    pub buffer_id: u32,
    /// Ingress port for the actions (CONTROLLER if none).
    pub in_port: u32,
    /// Actions.
    pub actions: Actions,
    /// The frame when `buffer_id` is NO_BUFFER.
    pub data: Bytes,
}

impl PacketOut {
    pub(crate) fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let buffer_id = r.u32()?;
        let in_port = r.u32()?;
        let actions_len = usize::from(r.u16()?);
        r.skip(6)?;
        let actions = decode_actions(r.sub(actions_len)?)?;
        Ok(PacketOut {
            buffer_id,
            in_port,
            actions,
            data: r.rest(),
        })
    }
    pub(crate) fn encode(&self, out: &mut BytesMut) -> Result<(), EncodeError> {
        out.put_u32(self.buffer_id);
        out.put_u32(self.in_port);
        let len_at = out.len();
        out.put_u16(0);
        out.put_bytes(0, 6);
        let start = out.len();
        encode_actions(&self.actions, out)?;
        let n = u16::try_from(out.len() - start)
            .map_err(|_| EncodeError::FieldTooLong { what: "actions" })?;
        if let Some(s) = out.get_mut(len_at..len_at + 2) {
            s.copy_from_slice(&n.to_be_bytes());
        }
        out.put_slice(&self.data);
        Ok(())
    }
}
