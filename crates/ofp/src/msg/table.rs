//! OFPT_TABLE_MOD (§7.3.3).

use bytes::{BufMut, BytesMut};

use crate::error::DecodeError;
use crate::wire::Reader;

/// OFPT_TABLE_MOD.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct TableMod {
    /// Table, or OFPTT_ALL.
    pub table_id: u8,
    /// `ofp_table_config` bits (deprecated in 1.3; 0).
    pub config: u32,
}

impl TableMod {
    pub(crate) fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let table_id = r.u8()?;
        r.skip(3)?;
        Ok(TableMod {
            table_id,
            config: r.u32()?,
        })
    }
    pub(crate) fn encode(&self, out: &mut BytesMut) {
        out.put_u8(self.table_id);
        out.put_bytes(0, 3);
        out.put_u32(self.config);
    }
}
