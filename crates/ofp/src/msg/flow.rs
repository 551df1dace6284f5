//! OFPT_FLOW_MOD (§7.3.4.1) and OFPT_FLOW_REMOVED (§7.4.2).

use bytes::{BufMut, BytesMut};

use crate::action::Action;
use crate::error::{DecodeError, EncodeError};
use crate::instruction::{
    Instruction, Instructions, decode_instructions_into, encode_instructions,
};
use crate::oxm::Match;
use crate::wire::Reader;
use crate::{NO_BUFFER, group, port, table};

value_enum!(/// `enum ofp_flow_mod_command`.
FlowModCommand: u8 {
    /// OFPFC_ADD.
    Add = 0,
    /// OFPFC_MODIFY.
    Modify = 1,
    /// OFPFC_MODIFY_STRICT.
    ModifyStrict = 2,
    /// OFPFC_DELETE.
    Delete = 3,
    /// OFPFC_DELETE_STRICT.
    DeleteStrict = 4,
});

flags!(/// `enum ofp_flow_mod_flags`.
FlowModFlags: u16 {
    /// OFPFF_SEND_FLOW_REM.
    SEND_FLOW_REM = 1,
    /// OFPFF_CHECK_OVERLAP.
    CHECK_OVERLAP = 2,
    /// OFPFF_RESET_COUNTS.
    RESET_COUNTS = 4,
    /// OFPFF_NO_PKT_COUNTS.
    NO_PKT_COUNTS = 8,
    /// OFPFF_NO_BYT_COUNTS.
    NO_BYT_COUNTS = 16,
});

/// OFPT_FLOW_MOD.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct FlowMod {
    /// Opaque controller cookie.
    pub cookie: u64,
    /// For modify/delete: which cookie bits must match (§7.3.4.1).
    pub cookie_mask: u64,
    /// Table (OFPTT_ALL for delete in all tables).
    pub table_id: u8,
    /// Command.
    pub command: FlowModCommand,
    /// Idle timeout in seconds (0 = none).
    pub idle_timeout: u16,
    /// Hard timeout in seconds (0 = none).
    pub hard_timeout: u16,
    /// Priority.
    pub priority: u16,
    /// Buffered packet to apply to, or NO_BUFFER.
    pub buffer_id: u32,
    /// For delete: only flows that output to this port (ANY = no filter).
    pub out_port: u32,
    /// For delete: only flows that output to this group (ANY = no filter).
    pub out_group: u32,
    /// Flags.
    pub flags: FlowModFlags,
    /// Match.
    #[cfg_attr(feature = "serde", serde(rename = "match"))]
    pub match_: Match,
    /// Instructions.
    pub instructions: Instructions,
}

impl FlowMod {
    #[inline]
    fn base(command: FlowModCommand, table_id: u8, match_: Match) -> Self {
        Self::from_fixed(
            FlowModFixed::base(command, table_id),
            match_,
            Instructions::new(),
        )
    }

    /// A FLOW_MOD of these fixed fields, match and instructions.
    #[inline]
    pub fn from_fixed(f: FlowModFixed, match_: Match, instructions: Instructions) -> Self {
        FlowMod {
            cookie: f.cookie,
            cookie_mask: f.cookie_mask,
            table_id: f.table_id,
            command: f.command,
            idle_timeout: f.idle_timeout,
            hard_timeout: f.hard_timeout,
            priority: f.priority,
            buffer_id: f.buffer_id,
            out_port: f.out_port,
            out_group: f.out_group,
            flags: f.flags,
            match_,
            instructions,
        }
    }
    /// OFPFC_ADD in table 0, priority 0x8000, NO_BUFFER, no instructions.
    #[inline]
    pub fn add(match_: Match) -> Self {
        Self::base(FlowModCommand::Add, 0, match_)
    }
    /// OFPFC_MODIFY in table 0.
    #[inline]
    pub fn modify(match_: Match) -> Self {
        Self::base(FlowModCommand::Modify, 0, match_)
    }
    /// OFPFC_MODIFY_STRICT in table 0.
    #[inline]
    pub fn modify_strict(match_: Match) -> Self {
        Self::base(FlowModCommand::ModifyStrict, 0, match_)
    }
    /// OFPFC_DELETE in all tables (OFPTT_ALL), any out_port/out_group.
    #[inline]
    pub fn delete(match_: Match) -> Self {
        Self::base(FlowModCommand::Delete, table::ALL, match_)
    }
    /// OFPFC_DELETE_STRICT in table 0 (strict deletes name one table and priority).
    #[inline]
    pub fn delete_strict(match_: Match) -> Self {
        Self::base(FlowModCommand::DeleteStrict, 0, match_)
    }
    /// Set the table.
    #[inline]
    pub fn table(mut self, table_id: u8) -> Self {
        self.table_id = table_id;
        self
    }
    /// Set the priority.
    #[inline]
    pub fn priority(mut self, p: u16) -> Self {
        self.priority = p;
        self
    }
    /// Set the cookie.
    #[inline]
    pub fn cookie(mut self, c: u64) -> Self {
        self.cookie = c;
        self
    }
    /// Set cookie and cookie mask (modify/delete filter).
    #[inline]
    pub fn cookie_masked(mut self, c: u64, mask: u64) -> Self {
        self.cookie = c;
        self.cookie_mask = mask;
        self
    }
    /// Set idle and hard timeouts.
    #[inline]
    pub fn timeouts(mut self, idle: u16, hard: u16) -> Self {
        self.idle_timeout = idle;
        self.hard_timeout = hard;
        self
    }
    /// Set the flags.
    #[inline]
    pub fn flags(mut self, f: FlowModFlags) -> Self {
        self.flags = f;
        self
    }
    /// Set the buffer id.
    #[inline]
    pub fn buffer(mut self, id: u32) -> Self {
        self.buffer_id = id;
        self
    }
    /// Append an instruction.
    #[inline]
    pub fn instruction(mut self, i: Instruction) -> Self {
        self.instructions.push(i);
        self
    }
    /// Append an apply-actions instruction.
    #[inline]
    pub fn apply<I: IntoIterator<Item = Action>>(mut self, actions: I) -> Self {
        self.instructions
            .push(Instruction::ApplyActions(actions.into_iter().collect()));
        self
    }

    /// Decode into `self`, which must be empty ([`FlowMod::add`] of an empty match, no
    /// instructions): in place, since a `FlowMod` is 792 bytes and moving each decoded one
    /// through `decode`'s results was a quarter of the bench's CPU (it checks every answer).
    pub(crate) fn decode_into(&mut self, r: &mut Reader<'_>) -> Result<(), DecodeError> {
        let f = FlowModFixed::decode(r)?;
        self.cookie = f.cookie;
        self.cookie_mask = f.cookie_mask;
        self.table_id = f.table_id;
        self.command = f.command;
        self.idle_timeout = f.idle_timeout;
        self.hard_timeout = f.hard_timeout;
        self.priority = f.priority;
        self.buffer_id = f.buffer_id;
        self.out_port = f.out_port;
        self.out_group = f.out_group;
        self.flags = f.flags;
        self.match_.decode_into(r)?;
        let n = r.remaining();
        decode_instructions_into(r.sub(n)?, &mut self.instructions)
    }

    pub(crate) fn encode(&self, out: &mut BytesMut) -> Result<(), EncodeError> {
        self.fixed().encode(out);
        self.match_.encode(out)?;
        encode_instructions(&self.instructions, out)
    }

    /// Every field but the match and the instructions.
    #[inline]
    pub fn fixed(&self) -> FlowModFixed {
        FlowModFixed {
            cookie: self.cookie,
            cookie_mask: self.cookie_mask,
            table_id: self.table_id,
            command: self.command,
            idle_timeout: self.idle_timeout,
            hard_timeout: self.hard_timeout,
            priority: self.priority,
            buffer_id: self.buffer_id,
            out_port: self.out_port,
            out_group: self.out_group,
            flags: self.flags,
        }
    }
}

/// The fixed part of a FLOW_MOD: every field but the match and the instructions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowModFixed {
    /// Opaque controller cookie.
    pub cookie: u64,
    /// For modify/delete: which cookie bits must match (§7.3.4.1).
    pub cookie_mask: u64,
    /// Table.
    pub table_id: u8,
    /// Command.
    pub command: FlowModCommand,
    /// Idle timeout in seconds (0 = none).
    pub idle_timeout: u16,
    /// Hard timeout in seconds (0 = none).
    pub hard_timeout: u16,
    /// Priority.
    pub priority: u16,
    /// Buffered packet to apply to, or NO_BUFFER.
    pub buffer_id: u32,
    /// For delete: only flows that output to this port (ANY = no filter).
    pub out_port: u32,
    /// For delete: only flows that output to this group (ANY = no filter).
    pub out_group: u32,
    /// Flags.
    pub flags: FlowModFlags,
}

impl FlowModFixed {
    /// What [`FlowMod::add`] sets: OFPFC_ADD in table 0, priority 0x8000, NO_BUFFER, no
    /// cookie, no timeouts, no flags.
    #[inline]
    pub const fn add() -> Self {
        Self::base(FlowModCommand::Add, 0)
    }

    /// The defaults of every [`FlowMod`] constructor: no cookie, no timeouts, priority
    /// 0x8000, NO_BUFFER, any out_port/out_group, no flags.
    #[inline]
    const fn base(command: FlowModCommand, table_id: u8) -> Self {
        FlowModFixed {
            cookie: 0,
            cookie_mask: 0,
            table_id,
            command,
            idle_timeout: 0,
            hard_timeout: 0,
            priority: 0x8000, // OFP_DEFAULT_PRIORITY
            buffer_id: NO_BUFFER,
            out_port: port::ANY,
            out_group: group::ANY,
            flags: FlowModFlags::empty(),
        }
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let f = FlowModFixed {
            cookie: r.u64()?,
            cookie_mask: r.u64()?,
            table_id: r.u8()?,
            command: FlowModCommand::from_raw(r.u8()?),
            idle_timeout: r.u16()?,
            hard_timeout: r.u16()?,
            priority: r.u16()?,
            buffer_id: r.u32()?,
            out_port: r.u32()?,
            out_group: r.u32()?,
            flags: FlowModFlags(r.u16()?),
        };
        r.skip(2)?;
        Ok(f)
    }

    fn encode(&self, out: &mut BytesMut) {
        out.put_slice(&self.to_bytes());
    }

    /// These fields on the wire: the 40 bytes after the header, before the match
    /// (§7.3.4.1), padding included. Inlined: on the PACKET_IN path (each connection
    /// rule) an out-of-line call, then the copy of its result, was most of the rule's
    /// encoding time.
    #[inline]
    pub fn to_bytes(&self) -> [u8; 40] {
        let mut b = [0u8; 40];
        let mut at = 0;
        let mut put = |v: &[u8]| {
            if let Some(d) = b.get_mut(at..at + v.len()) {
                d.copy_from_slice(v);
            }
            at += v.len();
        };
        put(&self.cookie.to_be_bytes());
        put(&self.cookie_mask.to_be_bytes());
        put(&[self.table_id, self.command.to_raw()]);
        put(&self.idle_timeout.to_be_bytes());
        put(&self.hard_timeout.to_be_bytes());
        put(&self.priority.to_be_bytes());
        put(&self.buffer_id.to_be_bytes());
        put(&self.out_port.to_be_bytes());
        put(&self.out_group.to_be_bytes());
        put(&self.flags.0.to_be_bytes());
        // Two bytes of padding: zeros.
        b
    }
}

value_enum!(/// `enum ofp_flow_removed_reason`.
FlowRemovedReason: u8 {
    /// OFPRR_IDLE_TIMEOUT.
    IdleTimeout = 0,
    /// OFPRR_HARD_TIMEOUT.
    HardTimeout = 1,
    /// OFPRR_DELETE.
    Delete = 2,
    /// OFPRR_GROUP_DELETE.
    GroupDelete = 3,
    /// OFPRR_METER_DELETE (Open vSwitch and OpenFlow 1.4; seen from OVS on 1.3 too).
    MeterDelete = 4,
});

/// OFPT_FLOW_REMOVED.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct FlowRemoved {
    /// Cookie.
    pub cookie: u64,
    /// Priority.
    pub priority: u16,
    /// Reason.
    pub reason: FlowRemovedReason,
    /// Table.
    pub table_id: u8,
    /// Age, seconds.
    pub duration_sec: u32,
    /// Age, nanoseconds beyond `duration_sec`.
    pub duration_nsec: u32,
    /// Idle timeout of the flow.
    pub idle_timeout: u16,
    /// Hard timeout of the flow.
    pub hard_timeout: u16,
    /// Packets.
    pub packet_count: u64,
    /// Bytes.
    pub byte_count: u64,
    /// Match.
    #[cfg_attr(feature = "serde", serde(rename = "match"))]
    pub match_: Match,
}

impl FlowRemoved {
    /// What a switch reports (§7.4.2) when the rule `fm` added ends for `reason`, having
    /// lived `duration_sec` and counted `packet_count` packets of `byte_count` bytes: the
    /// rule's cookie, priority, table, timeouts and match.
    pub fn of_rule(
        fm: &FlowMod,
        reason: FlowRemovedReason,
        duration_sec: u32,
        packet_count: u64,
        byte_count: u64,
    ) -> Self {
        FlowRemoved {
            cookie: fm.cookie,
            priority: fm.priority,
            reason,
            table_id: fm.table_id,
            duration_sec,
            duration_nsec: 0,
            idle_timeout: fm.idle_timeout,
            hard_timeout: fm.hard_timeout,
            packet_count,
            byte_count,
            match_: fm.match_.clone(),
        }
    }

    pub(crate) fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(FlowRemoved {
            cookie: r.u64()?,
            priority: r.u16()?,
            reason: FlowRemovedReason::from_raw(r.u8()?),
            table_id: r.u8()?,
            duration_sec: r.u32()?,
            duration_nsec: r.u32()?,
            idle_timeout: r.u16()?,
            hard_timeout: r.u16()?,
            packet_count: r.u64()?,
            byte_count: r.u64()?,
            match_: Match::decode(r)?,
        })
    }
    pub(crate) fn encode(&self, out: &mut BytesMut) -> Result<(), EncodeError> {
        out.put_u64(self.cookie);
        out.put_u16(self.priority);
        out.put_u8(self.reason.to_raw());
        out.put_u8(self.table_id);
        out.put_u32(self.duration_sec);
        out.put_u32(self.duration_nsec);
        out.put_u16(self.idle_timeout);
        out.put_u16(self.hard_timeout);
        out.put_u64(self.packet_count);
        out.put_u64(self.byte_count);
        self.match_.encode(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_add_is_what_flow_mod_add_sets() {
        assert_eq!(FlowModFixed::add(), FlowMod::add(Match::new()).fixed());
    }
}
