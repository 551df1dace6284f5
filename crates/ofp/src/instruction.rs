//! Instructions (§7.2.4).

use bytes::{BufMut, Bytes, BytesMut};
use smallvec::SmallVec;

use crate::action::{
    Actions, decode_actions_into, encode_actions, encode_raw_tlv, fixed_len, take_tlv8,
};
use crate::error::{DecodeError, EncodeError};
use crate::wire::{LenMark, Reader};

/// A list of instructions; up to 2 inline without heap allocation.
pub type Instructions = SmallVec<[Instruction; 2]>;

/// `enum ofp_instruction_type` values.
#[allow(missing_docs)]
pub mod instruction_type {
    pub const GOTO_TABLE: u16 = 1;
    pub const WRITE_METADATA: u16 = 2;
    pub const WRITE_ACTIONS: u16 = 3;
    pub const APPLY_ACTIONS: u16 = 4;
    pub const CLEAR_ACTIONS: u16 = 5;
    pub const METER: u16 = 6;
    pub const EXPERIMENTER: u16 = 0xffff;
}

/// One instruction (§7.2.4).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum Instruction {
    /// OFPIT_GOTO_TABLE.
    GotoTable(u8),
    /// OFPIT_WRITE_METADATA.
    WriteMetadata {
        /// Value.
        metadata: u64,
        /// Which bits to write.
        mask: u64,
    },
    /// OFPIT_WRITE_ACTIONS.
    WriteActions(Actions),
    /// OFPIT_APPLY_ACTIONS.
    ApplyActions(Actions),
    /// OFPIT_CLEAR_ACTIONS.
    ClearActions,
    /// OFPIT_METER.
    Meter(u32),
    /// OFPIT_EXPERIMENTER, body after the experimenter id kept raw.
    Experimenter {
        /// Experimenter id.
        experimenter: u32,
        /// Raw body.
        data: Bytes,
    },
    /// An undefined instruction type, body kept raw.
    Unknown {
        /// Instruction type.
        typ: u16,
        /// Raw body after type and length.
        data: Bytes,
    },
}

impl Instruction {
    /// Apply-actions from anything that makes actions.
    #[inline]
    pub fn apply<I: IntoIterator<Item = crate::Action>>(actions: I) -> Self {
        Instruction::ApplyActions(actions.into_iter().collect())
    }

    pub(crate) fn decode(r: &mut Reader<'_>) -> Result<Instruction, DecodeError> {
        use instruction_type::*;
        // §7.2.4: instructions are at least 8 bytes, padded to 8.
        let (typ, len, mut b) = take_tlv8(r)?;
        let fixed = |want: usize| fixed_len(len, want);
        Ok(match typ {
            GOTO_TABLE => {
                fixed(8)?;
                Instruction::GotoTable(b.u8()?)
            }
            WRITE_METADATA => {
                fixed(24)?;
                b.skip(4)?;
                Instruction::WriteMetadata {
                    metadata: b.u64()?,
                    mask: b.u64()?,
                }
            }
            WRITE_ACTIONS | APPLY_ACTIONS => {
                b.skip(4)?;
                // Decoded in place: an `Actions` is 200 bytes.
                let mut i = if typ == WRITE_ACTIONS {
                    Instruction::WriteActions(Actions::new())
                } else {
                    Instruction::ApplyActions(Actions::new())
                };
                if let Instruction::WriteActions(a) | Instruction::ApplyActions(a) = &mut i {
                    decode_actions_into(b, a)?;
                }
                i
            }
            CLEAR_ACTIONS => {
                fixed(8)?;
                Instruction::ClearActions
            }
            METER => {
                fixed(8)?;
                Instruction::Meter(b.u32()?)
            }
            EXPERIMENTER => {
                let experimenter = b.u32()?;
                Instruction::Experimenter {
                    experimenter,
                    data: b.rest(),
                }
            }
            _ => Instruction::Unknown {
                typ,
                data: b.rest(),
            },
        })
    }

    pub(crate) fn encode(&self, out: &mut BytesMut) -> Result<(), EncodeError> {
        use instruction_type::*;
        let start = out.len();
        match self {
            Instruction::GotoTable(t) => {
                out.put_u16(GOTO_TABLE);
                out.put_u16(8);
                out.put_slice(&[*t, 0, 0, 0]);
            }
            Instruction::WriteMetadata { metadata, mask } => {
                out.put_u16(WRITE_METADATA);
                out.put_u16(24);
                out.put_u32(0);
                out.put_u64(*metadata);
                out.put_u64(*mask);
            }
            Instruction::WriteActions(a) => encode_actions_instruction(WRITE_ACTIONS, a, out)?,
            Instruction::ApplyActions(a) => encode_actions_instruction(APPLY_ACTIONS, a, out)?,
            Instruction::ClearActions => {
                out.put_u16(CLEAR_ACTIONS);
                out.put_u16(8);
                out.put_u32(0);
            }
            Instruction::Meter(m) => {
                out.put_u16(METER);
                out.put_u16(8);
                out.put_u32(*m);
            }
            Instruction::Experimenter { experimenter, data } => encode_raw_tlv(
                out,
                start,
                EXPERIMENTER,
                Some(*experimenter),
                data,
                "instruction",
            )?,
            Instruction::Unknown { typ, data } => {
                encode_raw_tlv(out, start, *typ, None, data, "instruction")?
            }
        }
        Ok(())
    }
}

/// OFPIT_WRITE_ACTIONS or OFPIT_APPLY_ACTIONS (`typ`) with `actions` (§7.2.4: type,
/// length, 4 bytes of padding, the actions).
pub(crate) fn encode_actions_instruction(
    typ: u16,
    actions: &[crate::Action],
    out: &mut BytesMut,
) -> Result<(), EncodeError> {
    let start = out.len();
    out.put_u16(typ);
    let mark = LenMark::at(out, start);
    out.put_u32(0);
    encode_actions(actions, out)?;
    mark.finish(out, "instruction")?;
    Ok(())
}

pub(crate) fn decode_instructions(r: Reader<'_>) -> Result<Instructions, DecodeError> {
    let mut v = Instructions::new();
    decode_instructions_into(r, &mut v)?;
    Ok(v)
}

/// Append the instructions in `r` to `v`.
pub(crate) fn decode_instructions_into(
    mut r: Reader<'_>,
    v: &mut Instructions,
) -> Result<(), DecodeError> {
    while !r.is_empty() {
        v.push(Instruction::decode(&mut r)?);
    }
    Ok(())
}

pub(crate) fn encode_instructions(
    ins: &[Instruction],
    out: &mut BytesMut,
) -> Result<(), EncodeError> {
    for i in ins {
        i.encode(out)?;
    }
    Ok(())
}
