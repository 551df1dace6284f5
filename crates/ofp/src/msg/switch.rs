//! FEATURES, GET/SET_CONFIG (§7.3.1, §7.3.2) and OFPT_EXPERIMENTER (§7.5.4).

use bytes::{BufMut, Bytes, BytesMut};

use crate::error::DecodeError;
use crate::wire::Reader;

/// OFPT_FEATURES_REPLY body (`struct ofp_switch_features`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct SwitchFeatures {
    /// Datapath id.
    pub datapath_id: u64,
    /// Packets the switch can buffer.
    pub n_buffers: u32,
    /// Tables.
    pub n_tables: u8,
    /// Auxiliary connection id (0 = main).
    pub auxiliary_id: u8,
    /// `ofp_capabilities` bitmap.
    pub capabilities: u32,
}

impl SwitchFeatures {
    /// The features of an emulated switch's main connection: 254 tables (as Open
    /// vSwitch reports them), no buffers, no capabilities. What the simulator, the
    /// benches and the tests' switches present.
    pub fn emulated(datapath_id: u64) -> Self {
        SwitchFeatures {
            datapath_id,
            n_buffers: 0,
            n_tables: 254,
            auxiliary_id: 0,
            capabilities: 0,
        }
    }
}

/// `enum ofp_capabilities` bits.
#[allow(missing_docs)]
pub mod capabilities {
    pub const FLOW_STATS: u32 = 1 << 0;
    pub const TABLE_STATS: u32 = 1 << 1;
    pub const PORT_STATS: u32 = 1 << 2;
    pub const GROUP_STATS: u32 = 1 << 3;
    pub const IP_REASM: u32 = 1 << 5;
    pub const QUEUE_STATS: u32 = 1 << 6;
    pub const PORT_BLOCKED: u32 = 1 << 8;
}

impl SwitchFeatures {
    pub(crate) fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let datapath_id = r.u64()?;
        let n_buffers = r.u32()?;
        let n_tables = r.u8()?;
        let auxiliary_id = r.u8()?;
        r.skip(2)?;
        let capabilities = r.u32()?;
        r.skip(4)?; // reserved
        Ok(SwitchFeatures {
            datapath_id,
            n_buffers,
            n_tables,
            auxiliary_id,
            capabilities,
        })
    }
    pub(crate) fn encode(&self, out: &mut BytesMut) {
        out.put_u64(self.datapath_id);
        out.put_u32(self.n_buffers);
        out.put_u8(self.n_tables);
        out.put_u8(self.auxiliary_id);
        out.put_u16(0);
        out.put_u32(self.capabilities);
        out.put_u32(0);
    }
}

/// `struct ofp_switch_config` (GET_CONFIG_REPLY, SET_CONFIG).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct SwitchConfig {
    /// `ofp_config_flags` (OFPC_FRAG_*).
    pub flags: u16,
    /// Bytes of a packet sent to the controller on a table miss (OFPCML_NO_BUFFER = all).
    pub miss_send_len: u16,
}

impl SwitchConfig {
    pub(crate) fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(SwitchConfig {
            flags: r.u16()?,
            miss_send_len: r.u16()?,
        })
    }
    pub(crate) fn encode(&self, out: &mut BytesMut) {
        out.put_u16(self.flags);
        out.put_u16(self.miss_send_len);
    }
}

/// OFPT_EXPERIMENTER (`struct ofp_experimenter_header`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Experimenter {
    /// Experimenter id.
    pub experimenter: u32,
    /// Experimenter-defined type.
    pub exp_type: u32,
    /// Body.
    pub data: Bytes,
}

impl Experimenter {
    pub(crate) fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(Experimenter {
            experimenter: r.u32()?,
            exp_type: r.u32()?,
            data: r.rest(),
        })
    }
    pub(crate) fn encode(&self, out: &mut BytesMut) {
        out.put_u32(self.experimenter);
        out.put_u32(self.exp_type);
        out.put_slice(&self.data);
    }
}
