//! Actions (§7.2.5). Experimenter actions (e.g. Nicira's) and unknown types are kept as
//! their raw bodies, so decode→encode gives identical bytes.

use bytes::{BufMut, Bytes, BytesMut};
use smallvec::SmallVec;

use crate::error::{DecodeError, EncodeError};
use crate::oxm::Oxm;
use crate::wire::{LenMark, Reader, pad8};
use crate::{CONTROLLER_MAX_LEN_NO_BUFFER, port};

/// A list of actions; up to 4 stored inline without heap allocation.
pub type Actions = SmallVec<[Action; 4]>;

/// `enum ofp_action_type` values.
#[allow(missing_docs)]
pub mod action_type {
    pub const OUTPUT: u16 = 0;
    pub const COPY_TTL_OUT: u16 = 11;
    pub const COPY_TTL_IN: u16 = 12;
    pub const SET_MPLS_TTL: u16 = 15;
    pub const DEC_MPLS_TTL: u16 = 16;
    pub const PUSH_VLAN: u16 = 17;
    pub const POP_VLAN: u16 = 18;
    pub const PUSH_MPLS: u16 = 19;
    pub const POP_MPLS: u16 = 20;
    pub const SET_QUEUE: u16 = 21;
    pub const GROUP: u16 = 22;
    pub const SET_NW_TTL: u16 = 23;
    pub const DEC_NW_TTL: u16 = 24;
    pub const SET_FIELD: u16 = 25;
    pub const PUSH_PBB: u16 = 26;
    pub const POP_PBB: u16 = 27;
    pub const EXPERIMENTER: u16 = 0xffff;
}

/// One action (§7.2.5).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum Action {
    /// OFPAT_OUTPUT.
    Output {
        /// Output port.
        port: u32,
        /// Bytes to send to the controller (OFPCML_NO_BUFFER = whole packet).
        max_len: u16,
    },
    /// OFPAT_COPY_TTL_OUT.
    CopyTtlOut,
    /// OFPAT_COPY_TTL_IN.
    CopyTtlIn,
    /// OFPAT_SET_MPLS_TTL.
    SetMplsTtl(u8),
    /// OFPAT_DEC_MPLS_TTL.
    DecMplsTtl,
    /// OFPAT_PUSH_VLAN (ethertype).
    PushVlan(u16),
    /// OFPAT_POP_VLAN.
    PopVlan,
    /// OFPAT_PUSH_MPLS (ethertype).
    PushMpls(u16),
    /// OFPAT_POP_MPLS (ethertype of the payload).
    PopMpls(u16),
    /// OFPAT_SET_QUEUE.
    SetQueue(u32),
    /// OFPAT_GROUP.
    Group(u32),
    /// OFPAT_SET_NW_TTL.
    SetNwTtl(u8),
    /// OFPAT_DEC_NW_TTL.
    DecNwTtl,
    /// OFPAT_SET_FIELD. Typed OXMs must be unmasked; a masked one decoded from the wire is
    /// kept as [`Oxm::Raw`].
    SetField(Oxm),
    /// OFPAT_PUSH_PBB (ethertype).
    PushPbb(u16),
    /// OFPAT_POP_PBB.
    PopPbb,
    /// OFPAT_EXPERIMENTER: `data` is everything after the experimenter id, padding included.
    Experimenter {
        /// Experimenter id (0x00002320 for Nicira).
        experimenter: u32,
        /// Raw body after the experimenter id.
        data: Bytes,
    },
    /// A type OpenFlow 1.3 does not define, kept raw (`data` follows type and length).
    Unknown {
        /// Action type.
        typ: u16,
        /// Raw body.
        data: Bytes,
    },
}

impl Action {
    /// Output to `port`; to the controller the whole packet is sent (OFPCML_NO_BUFFER),
    /// otherwise `max_len` is 0.
    #[inline]
    pub fn output(port: u32) -> Self {
        let max_len = if port == port::CONTROLLER {
            CONTROLLER_MAX_LEN_NO_BUFFER
        } else {
            0
        };
        Action::Output { port, max_len }
    }
    /// SET_FIELD of a field; any mask is dropped, since SET_FIELD takes none (§7.2.5).
    #[inline]
    pub fn set_field(oxm: Oxm) -> Self {
        Action::SetField(oxm.without_mask())
    }

    pub(crate) fn decode(r: &mut Reader<'_>) -> Result<Action, DecodeError> {
        use action_type::*;
        // §7.2.5: every action is at least 8 bytes and a multiple of 8 long.
        let (typ, len, mut a) = take_tlv8(r)?;
        let fixed = |want: usize| fixed_len(len, want);
        let act = match typ {
            OUTPUT => {
                fixed(16)?;
                let port = a.u32()?;
                let max_len = a.u16()?;
                Action::Output { port, max_len }
            }
            COPY_TTL_OUT => {
                fixed(8)?;
                Action::CopyTtlOut
            }
            COPY_TTL_IN => {
                fixed(8)?;
                Action::CopyTtlIn
            }
            SET_MPLS_TTL => {
                fixed(8)?;
                Action::SetMplsTtl(a.u8()?)
            }
            DEC_MPLS_TTL => {
                fixed(8)?;
                Action::DecMplsTtl
            }
            PUSH_VLAN => {
                fixed(8)?;
                Action::PushVlan(a.u16()?)
            }
            POP_VLAN => {
                fixed(8)?;
                Action::PopVlan
            }
            PUSH_MPLS => {
                fixed(8)?;
                Action::PushMpls(a.u16()?)
            }
            POP_MPLS => {
                fixed(8)?;
                Action::PopMpls(a.u16()?)
            }
            SET_QUEUE => {
                fixed(8)?;
                Action::SetQueue(a.u32()?)
            }
            GROUP => {
                fixed(8)?;
                Action::Group(a.u32()?)
            }
            SET_NW_TTL => {
                fixed(8)?;
                Action::SetNwTtl(a.u8()?)
            }
            DEC_NW_TTL => {
                fixed(8)?;
                Action::DecNwTtl
            }
            SET_FIELD => {
                let oxm = Oxm::decode(&mut a)?;
                // The padding must make the action as short as possible (§7.2.5: "padded
                // to 8"); anything else would not re-encode identically.
                if crate::wire::padded8(4 + oxm.wire_len()) != len {
                    return Err(DecodeError::BadLength);
                }
                let oxm = if oxm.has_mask() {
                    match oxm {
                        Oxm::Raw(r) => Oxm::Raw(r),
                        typed => raw_of(&typed)?,
                    }
                } else {
                    oxm
                };
                Action::SetField(oxm)
            }
            PUSH_PBB => {
                fixed(8)?;
                Action::PushPbb(a.u16()?)
            }
            POP_PBB => {
                fixed(8)?;
                Action::PopPbb
            }
            EXPERIMENTER => {
                let experimenter = a.u32()?;
                Action::Experimenter {
                    experimenter,
                    data: a.rest(),
                }
            }
            _ => Action::Unknown {
                typ,
                data: a.rest(),
            },
        };
        Ok(act)
    }

    pub(crate) fn encode(&self, out: &mut BytesMut) -> Result<(), EncodeError> {
        use action_type::*;
        let start = out.len();
        macro_rules! simple {
            ($t:expr, $body:expr) => {{
                out.put_u16($t);
                out.put_u16(8);
                let b: [u8; 4] = $body;
                out.put_slice(&b);
            }};
        }
        let u16p = |v: u16| {
            let [a, b] = v.to_be_bytes();
            [a, b, 0, 0]
        };
        match self {
            Action::Output { port, max_len } => {
                out.put_u16(OUTPUT);
                out.put_u16(16);
                out.put_u32(*port);
                out.put_u16(*max_len);
                out.put_bytes(0, 6);
            }
            Action::CopyTtlOut => simple!(COPY_TTL_OUT, [0; 4]),
            Action::CopyTtlIn => simple!(COPY_TTL_IN, [0; 4]),
            Action::SetMplsTtl(t) => simple!(SET_MPLS_TTL, [*t, 0, 0, 0]),
            Action::DecMplsTtl => simple!(DEC_MPLS_TTL, [0; 4]),
            Action::PushVlan(e) => simple!(PUSH_VLAN, u16p(*e)),
            Action::PopVlan => simple!(POP_VLAN, [0; 4]),
            Action::PushMpls(e) => simple!(PUSH_MPLS, u16p(*e)),
            Action::PopMpls(e) => simple!(POP_MPLS, u16p(*e)),
            Action::SetQueue(q) => simple!(SET_QUEUE, q.to_be_bytes()),
            Action::Group(g) => simple!(GROUP, g.to_be_bytes()),
            Action::SetNwTtl(t) => simple!(SET_NW_TTL, [*t, 0, 0, 0]),
            Action::DecNwTtl => simple!(DEC_NW_TTL, [0; 4]),
            Action::PushPbb(e) => simple!(PUSH_PBB, u16p(*e)),
            Action::PopPbb => simple!(POP_PBB, [0; 4]),
            Action::SetField(oxm) => {
                // §7.2.5: OFPAT_SET_FIELD carries an unmasked OXM; Open vSwitch rejects a
                // masked one in 1.3. Only an opaque TLV taken from the wire may carry it.
                if oxm.has_mask() && !matches!(oxm, Oxm::Raw(_)) {
                    return Err(EncodeError::MaskedSetField);
                }
                out.put_u16(SET_FIELD);
                let mark = LenMark::at(out, start);
                oxm.encode(out)?;
                pad8(out, start);
                mark.finish(out, "set_field action")?;
            }
            Action::Experimenter { experimenter, data } => encode_raw_tlv(
                out,
                start,
                EXPERIMENTER,
                Some(*experimenter),
                data,
                "experimenter action",
            )?,
            Action::Unknown { typ, data } => {
                encode_raw_tlv(out, start, *typ, None, data, "action")?
            }
        }
        Ok(())
    }
}

/// Takes the next element of a list of actions (§7.2.5) or instructions (§7.2.4): type,
/// length (at least 8, a multiple of 8), and a reader over the body after those 4 bytes.
#[inline]
pub(crate) fn take_tlv8<'a>(r: &mut Reader<'a>) -> Result<(u16, usize, Reader<'a>), DecodeError> {
    let typ = r.peek_u16(0)?;
    let len = usize::from(r.peek_u16(2)?);
    if len < 8 || len % 8 != 0 {
        return Err(DecodeError::BadLength);
    }
    let mut body = r.sub(len)?;
    body.skip(4)?;
    Ok((typ, len, body))
}

/// An element whose type has a fixed size must have exactly that length.
#[inline]
pub(crate) fn fixed_len(len: usize, want: usize) -> Result<(), DecodeError> {
    if len == want {
        Ok(())
    } else {
        Err(DecodeError::BadLength)
    }
}

/// Writes an element kept raw (an experimenter or unknown action or instruction) so that
/// decode→encode gives identical bytes: type, length, the experimenter id if any, the body,
/// zeros to a multiple of 8 (§7.2.4, §7.2.5), then the length filled in.
pub(crate) fn encode_raw_tlv(
    out: &mut BytesMut,
    start: usize,
    typ: u16,
    experimenter: Option<u32>,
    data: &[u8],
    what: &'static str,
) -> Result<(), EncodeError> {
    out.put_u16(typ);
    let mark = LenMark::at(out, start);
    if let Some(e) = experimenter {
        out.put_u32(e);
    }
    out.put_slice(data);
    pad8(out, start);
    mark.finish(out, what).map(drop)
}

/// Re-encode a typed OXM as an opaque one (for masked SET_FIELD from the wire).
fn raw_of(oxm: &Oxm) -> Result<Oxm, DecodeError> {
    let mut b = BytesMut::with_capacity(oxm.wire_len());
    oxm.encode(&mut b).map_err(|_| DecodeError::BadValue {
        what: "set_field oxm",
    })?;
    let id = oxm.id();
    let payload = b.freeze().slice(4..);
    Ok(Oxm::Raw(crate::oxm::RawOxm {
        class: id.class,
        field: id.field,
        hasmask: true,
        payload,
    }))
}

/// Decode a list of actions filling the reader.
pub(crate) fn decode_actions(r: Reader<'_>) -> Result<Actions, DecodeError> {
    let mut v = Actions::new();
    decode_actions_into(r, &mut v)?;
    Ok(v)
}

/// Append the actions in `r` to `v`.
pub(crate) fn decode_actions_into(mut r: Reader<'_>, v: &mut Actions) -> Result<(), DecodeError> {
    while !r.is_empty() {
        v.push(Action::decode(&mut r)?);
    }
    Ok(())
}

pub(crate) fn encode_actions(actions: &[Action], out: &mut BytesMut) -> Result<(), EncodeError> {
    for a in actions {
        a.encode(out)?;
    }
    Ok(())
}
