//! Ports: `struct ofp_port` (§7.2.1), OFPT_PORT_STATUS (§7.4.3), OFPT_PORT_MOD (§7.3.4.3).

use bytes::{BufMut, BytesMut};

use crate::error::DecodeError;
use crate::strings::PortName;
use crate::wire::Reader;

/// `enum ofp_port_config` bits.
#[allow(missing_docs)]
pub mod port_config {
    pub const PORT_DOWN: u32 = 1 << 0;
    pub const NO_RECV: u32 = 1 << 2;
    pub const NO_FWD: u32 = 1 << 5;
    pub const NO_PACKET_IN: u32 = 1 << 6;
}

/// `enum ofp_port_state` bits.
#[allow(missing_docs)]
pub mod port_state {
    pub const LINK_DOWN: u32 = 1 << 0;
    pub const BLOCKED: u32 = 1 << 1;
    pub const LIVE: u32 = 1 << 2;
}

/// `struct ofp_port` (64 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct PortDesc {
    /// Port number.
    pub port_no: u32,
    /// MAC address.
    pub hw_addr: [u8; 6],
    /// Name (16 raw bytes).
    pub name: PortName,
    /// `ofp_port_config` bits.
    pub config: u32,
    /// `ofp_port_state` bits.
    pub state: u32,
    /// Current features.
    pub curr: u32,
    /// Advertised features.
    pub advertised: u32,
    /// Supported features.
    pub supported: u32,
    /// Peer's advertised features.
    pub peer: u32,
    /// Current bit rate, kb/s.
    pub curr_speed: u32,
    /// Max bit rate, kb/s.
    pub max_speed: u32,
}

impl PortDesc {
    /// Wire size.
    pub const LEN: usize = 64;
    pub(crate) fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let port_no = r.u32()?;
        r.skip(4)?;
        let hw_addr = r.array()?;
        r.skip(2)?;
        Ok(PortDesc {
            port_no,
            hw_addr,
            name: crate::strings::FixedStr(r.array()?),
            config: r.u32()?,
            state: r.u32()?,
            curr: r.u32()?,
            advertised: r.u32()?,
            supported: r.u32()?,
            peer: r.u32()?,
            curr_speed: r.u32()?,
            max_speed: r.u32()?,
        })
    }
    pub(crate) fn encode(&self, out: &mut BytesMut) {
        out.put_u32(self.port_no);
        out.put_u32(0);
        out.put_slice(&self.hw_addr);
        out.put_u16(0);
        out.put_slice(&self.name.0);
        for v in [
            self.config,
            self.state,
            self.curr,
            self.advertised,
            self.supported,
            self.peer,
            self.curr_speed,
            self.max_speed,
        ] {
            out.put_u32(v);
        }
    }
}

value_enum!(/// `enum ofp_port_reason`.
PortReason: u8 {
    /// OFPPR_ADD.
    Add = 0,
    /// OFPPR_DELETE.
    Delete = 1,
    /// OFPPR_MODIFY.
    Modify = 2,
});

/// OFPT_PORT_STATUS.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct PortStatus {
    /// Reason.
    pub reason: PortReason,
    /// The port.
    pub desc: PortDesc,
}

impl PortStatus {
    pub(crate) fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let reason = PortReason::from_raw(r.u8()?);
        r.skip(7)?;
        Ok(PortStatus {
            reason,
            desc: PortDesc::decode(r)?,
        })
    }
    pub(crate) fn encode(&self, out: &mut BytesMut) {
        out.put_u8(self.reason.to_raw());
        out.put_bytes(0, 7);
        self.desc.encode(out);
    }
}

/// OFPT_PORT_MOD.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct PortMod {
    /// Port number.
    pub port_no: u32,
    /// Must match the port's address (§7.3.4.3).
    pub hw_addr: [u8; 6],
    /// Config bits.
    pub config: u32,
    /// Which config bits to change.
    pub mask: u32,
    /// Features to advertise (0 = unchanged).
    pub advertise: u32,
}

impl PortMod {
    pub(crate) fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let port_no = r.u32()?;
        r.skip(4)?;
        let hw_addr = r.array()?;
        r.skip(2)?;
        let config = r.u32()?;
        let mask = r.u32()?;
        let advertise = r.u32()?;
        r.skip(4)?;
        Ok(PortMod {
            port_no,
            hw_addr,
            config,
            mask,
            advertise,
        })
    }
    pub(crate) fn encode(&self, out: &mut BytesMut) {
        out.put_u32(self.port_no);
        out.put_u32(0);
        out.put_slice(&self.hw_addr);
        out.put_u16(0);
        out.put_u32(self.config);
        out.put_u32(self.mask);
        out.put_u32(self.advertise);
        out.put_u32(0);
    }
}
