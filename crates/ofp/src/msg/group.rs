//! OFPT_GROUP_MOD (§7.3.4.2) and buckets.

use bytes::{BufMut, BytesMut};

use crate::action::{Actions, decode_actions, encode_actions};
use crate::error::{DecodeError, EncodeError};
use crate::wire::{LenMark, Reader};
use crate::{group, port};

value_enum!(/// `enum ofp_group_mod_command`.
GroupModCommand: u16 {
    /// OFPGC_ADD.
    Add = 0,
    /// OFPGC_MODIFY.
    Modify = 1,
    /// OFPGC_DELETE.
    Delete = 2,
});

value_enum!(/// `enum ofp_group_type`.
GroupType: u8 {
    /// OFPGT_ALL.
    All = 0,
    /// OFPGT_SELECT.
    Select = 1,
    /// OFPGT_INDIRECT.
    Indirect = 2,
    /// OFPGT_FF (fast failover).
    FastFailover = 3,
});

/// `struct ofp_bucket`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Bucket {
    /// Relative weight (select groups).
    pub weight: u16,
    /// Liveness port (fast failover), or ANY.
    pub watch_port: u32,
    /// Liveness group (fast failover), or ANY.
    pub watch_group: u32,
    /// Actions.
    pub actions: Actions,
}

impl Bucket {
    /// A bucket with these actions, weight 0, no watch port/group.
    pub fn new(actions: Actions) -> Self {
        Bucket {
            weight: 0,
            watch_port: port::ANY,
            watch_group: group::ANY,
            actions,
        }
    }
    /// A select-group bucket.
    pub fn weighted(weight: u16, actions: Actions) -> Self {
        Bucket {
            weight,
            ..Bucket::new(actions)
        }
    }

    pub(crate) fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let len = usize::from(r.peek_u16(0)?);
        if len < 16 {
            return Err(DecodeError::BadLength);
        }
        let mut b = r.sub(len)?;
        b.skip(2)?;
        let weight = b.u16()?;
        let watch_port = b.u32()?;
        let watch_group = b.u32()?;
        b.skip(4)?;
        Ok(Bucket {
            weight,
            watch_port,
            watch_group,
            actions: decode_actions(b)?,
        })
    }
    pub(crate) fn encode(&self, out: &mut BytesMut) -> Result<(), EncodeError> {
        let start = out.len();
        let m = LenMark::at(out, start);
        out.put_u16(self.weight);
        out.put_u32(self.watch_port);
        out.put_u32(self.watch_group);
        out.put_u32(0);
        encode_actions(&self.actions, out)?;
        m.finish(out, "bucket")?;
        Ok(())
    }
}

pub(crate) fn decode_buckets(mut r: Reader<'_>) -> Result<Vec<Bucket>, DecodeError> {
    let mut v = Vec::new();
    while !r.is_empty() {
        v.push(Bucket::decode(&mut r)?);
    }
    Ok(v)
}

pub(crate) fn encode_buckets(b: &[Bucket], out: &mut BytesMut) -> Result<(), EncodeError> {
    for x in b {
        x.encode(out)?;
    }
    Ok(())
}

/// OFPT_GROUP_MOD.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct GroupMod {
    /// Command.
    pub command: GroupModCommand,
    /// Group type.
    pub group_type: GroupType,
    /// Group id.
    pub group_id: u32,
    /// Buckets.
    pub buckets: Vec<Bucket>,
}

impl GroupMod {
    pub(crate) fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let command = GroupModCommand::from_raw(r.u16()?);
        let group_type = GroupType::from_raw(r.u8()?);
        r.skip(1)?;
        let group_id = r.u32()?;
        let n = r.remaining();
        Ok(GroupMod {
            command,
            group_type,
            group_id,
            buckets: decode_buckets(r.sub(n)?)?,
        })
    }
    pub(crate) fn encode(&self, out: &mut BytesMut) -> Result<(), EncodeError> {
        out.put_u16(self.command.to_raw());
        out.put_u8(self.group_type.to_raw());
        out.put_u8(0);
        out.put_u32(self.group_id);
        encode_buckets(&self.buckets, out)
    }
}
