//! OFPT_GET_ASYNC_REPLY / OFPT_SET_ASYNC (§7.3.10).

use bytes::{BufMut, BytesMut};

use crate::error::DecodeError;
use crate::wire::Reader;

/// `struct ofp_async_config`. Index 0 applies in master/equal role, index 1 in slave role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct AsyncConfig {
    /// Bitmasks of OFPR_* packet-in reasons.
    pub packet_in_mask: [u32; 2],
    /// Bitmasks of OFPPR_* port-status reasons.
    pub port_status_mask: [u32; 2],
    /// Bitmasks of OFPRR_* flow-removed reasons.
    pub flow_removed_mask: [u32; 2],
}

impl AsyncConfig {
    pub(crate) fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(AsyncConfig {
            packet_in_mask: [r.u32()?, r.u32()?],
            port_status_mask: [r.u32()?, r.u32()?],
            flow_removed_mask: [r.u32()?, r.u32()?],
        })
    }
    pub(crate) fn encode(&self, out: &mut BytesMut) {
        for v in self
            .packet_in_mask
            .iter()
            .chain(&self.port_status_mask)
            .chain(&self.flow_removed_mask)
        {
            out.put_u32(*v);
        }
    }
}
