//! OFPT_ROLE_REQUEST / OFPT_ROLE_REPLY (§7.3.9).

use bytes::{BufMut, BytesMut};

use crate::error::DecodeError;
use crate::wire::Reader;

value_enum!(/// `enum ofp_controller_role`.
ControllerRole: u32 {
    /// OFPCR_ROLE_NOCHANGE.
    NoChange = 0,
    /// OFPCR_ROLE_EQUAL.
    Equal = 1,
    /// OFPCR_ROLE_MASTER.
    Master = 2,
    /// OFPCR_ROLE_SLAVE.
    Slave = 3,
});

/// Role request or reply body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct RoleMsg {
    /// Role.
    pub role: ControllerRole,
    /// Master election generation id (§6.3.6); ignored for NoChange/Equal.
    pub generation_id: u64,
}

impl RoleMsg {
    pub(crate) fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let role = ControllerRole::from_raw(r.u32()?);
        r.skip(4)?;
        Ok(RoleMsg {
            role,
            generation_id: r.u64()?,
        })
    }
    pub(crate) fn encode(&self, out: &mut BytesMut) {
        out.put_u32(self.role.to_raw());
        out.put_u32(0);
        out.put_u64(self.generation_id);
    }
}
