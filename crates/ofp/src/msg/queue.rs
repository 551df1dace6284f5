//! OFPT_QUEUE_GET_CONFIG_REQUEST / REPLY (§7.3.6) and queue properties (§7.2.2).

use bytes::{BufMut, Bytes, BytesMut};

use crate::error::{DecodeError, EncodeError};
use crate::wire::{LenMark, Reader};

/// OFPT_QUEUE_GET_CONFIG_REQUEST.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct QueueGetConfigRequest {
    /// Port (or OFPP_ANY).
    pub port: u32,
}

/// A queue property.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum QueueProp {
    /// OFPQT_MIN_RATE, in 1/10 of a percent.
    MinRate(u16),
    /// OFPQT_MAX_RATE, in 1/10 of a percent.
    MaxRate(u16),
    /// OFPQT_EXPERIMENTER; body after experimenter id and pad kept raw.
    Experimenter {
        /// Experimenter id.
        experimenter: u32,
        /// Raw body.
        data: Bytes,
    },
    /// Undefined property; body after the 8-byte header kept raw.
    Unknown {
        /// Property type.
        typ: u16,
        /// Raw body.
        data: Bytes,
    },
}

/// `struct ofp_packet_queue`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct PacketQueue {
    /// Queue id.
    pub queue_id: u32,
    /// Port.
    pub port: u32,
    /// Properties.
    pub properties: Vec<QueueProp>,
}

/// OFPT_QUEUE_GET_CONFIG_REPLY.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct QueueGetConfigReply {
    /// Port.
    pub port: u32,
    /// Queues.
    pub queues: Vec<PacketQueue>,
}

impl QueueGetConfigRequest {
    pub(crate) fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let port = r.u32()?;
        r.skip(4)?;
        Ok(QueueGetConfigRequest { port })
    }
    pub(crate) fn encode(&self, out: &mut BytesMut) {
        out.put_u32(self.port);
        out.put_u32(0);
    }
}

impl QueueProp {
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let typ = r.peek_u16(0)?;
        let len = usize::from(r.peek_u16(2)?);
        if len < 8 {
            return Err(DecodeError::BadLength);
        }
        let mut b = r.sub(len)?;
        b.skip(8)?;
        let fixed = |want: usize| {
            if len == want {
                Ok(())
            } else {
                Err(DecodeError::BadLength)
            }
        };
        Ok(match typ {
            1 => {
                fixed(16)?;
                QueueProp::MinRate(b.u16()?)
            }
            2 => {
                fixed(16)?;
                QueueProp::MaxRate(b.u16()?)
            }
            0xffff => {
                let experimenter = b.u32()?;
                b.skip(4)?;
                QueueProp::Experimenter {
                    experimenter,
                    data: b.rest(),
                }
            }
            _ => QueueProp::Unknown {
                typ,
                data: b.rest(),
            },
        })
    }
    fn encode(&self, out: &mut BytesMut) -> Result<(), EncodeError> {
        let start = out.len();
        let typ = match self {
            QueueProp::MinRate(_) => 1,
            QueueProp::MaxRate(_) => 2,
            QueueProp::Experimenter { .. } => 0xffff,
            QueueProp::Unknown { typ, .. } => *typ,
        };
        out.put_u16(typ);
        let m = LenMark::at(out, start);
        out.put_u32(0);
        match self {
            QueueProp::MinRate(v) | QueueProp::MaxRate(v) => {
                out.put_u16(*v);
                out.put_bytes(0, 6);
            }
            QueueProp::Experimenter { experimenter, data } => {
                out.put_u32(*experimenter);
                out.put_u32(0);
                out.put_slice(data);
            }
            QueueProp::Unknown { data, .. } => out.put_slice(data),
        }
        m.finish(out, "queue property")?;
        Ok(())
    }
}

impl PacketQueue {
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let queue_id = r.u32()?;
        let port = r.u32()?;
        let len = usize::from(r.u16()?);
        r.skip(6)?;
        if len < 16 {
            return Err(DecodeError::BadLength);
        }
        let mut p = r.sub(len - 16)?;
        let mut properties = Vec::new();
        while !p.is_empty() {
            properties.push(QueueProp::decode(&mut p)?);
        }
        Ok(PacketQueue {
            queue_id,
            port,
            properties,
        })
    }
    fn encode(&self, out: &mut BytesMut) -> Result<(), EncodeError> {
        let start = out.len();
        out.put_u32(self.queue_id);
        out.put_u32(self.port);
        let m = LenMark::at(out, start);
        out.put_bytes(0, 6);
        for p in &self.properties {
            p.encode(out)?;
        }
        m.finish(out, "queue")?;
        Ok(())
    }
}

impl QueueGetConfigReply {
    pub(crate) fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let port = r.u32()?;
        r.skip(4)?;
        let mut queues = Vec::new();
        while !r.is_empty() {
            queues.push(PacketQueue::decode(r)?);
        }
        Ok(QueueGetConfigReply { port, queues })
    }
    pub(crate) fn encode(&self, out: &mut BytesMut) -> Result<(), EncodeError> {
        out.put_u32(self.port);
        out.put_u32(0);
        for q in &self.queues {
            q.encode(out)?;
        }
        Ok(())
    }
}
