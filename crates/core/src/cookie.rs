//! Flow cookies: what kind of rule a flow is, so a returning switch can be resynced.
//!
//! The top byte of every cookie flowgate sets names the rule's kind. The OpenFlow 1.3
//! cookie mask ("§7.3.4.1: restrict the modification/deletion to flows whose cookie
//! matches `cookie` under `cookie_mask`") then lets the controller delete all stale
//! proactive rules of one kind with one FLOW_MOD, while leaving the per-connection rules —
//! and the connections they carry — untouched.

/// Mask selecting the kind byte.
pub const KIND_MASK: u64 = 0xff00_0000_0000_0000;
const KIND_SHIFT: u32 = 56;

/// The kinds of rule flowgate installs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum RuleKind {
    /// Priority-0 table-miss entry sending unmatched packets to the controller.
    TableMiss = 0x01,
    /// LLDP to the controller, for link discovery.
    Lldp = 0x02,
    /// Proactive L2 forwarding towards a learned host.
    L2 = 0x03,
    /// Sends new connections to a service address up to the controller.
    Intercept = 0x04,
    /// One direction of one client connection.
    Conn = 0x05,
    /// A gap (overload control) rule.
    Gap = 0x06,
    /// A proactive service's conntrack/group rules. Not in [`RuleKind::PROACTIVE`]: they are
    /// replaced make-before-break by their own generation bit (`controller::proactive`),
    /// never deleted wholesale.
    Proactive = 0x07,
    /// A partitioned service's wildcard and moving rules (`controller::partition`).
    Partition = 0x08,
    /// A departed partitioned service's partitions, for its old connections' segments
    /// until they are idle (`controller::departing`).
    Departing = 0x09,
}

impl RuleKind {
    /// Proactive kinds: deleted and re-installed from controller state on every
    /// (re)connection. Not [`RuleKind::L2`] nor [`RuleKind::Partition`]: a switch keeps
    /// carrying its hosts' traffic and its partitions' connections by its earlier rules
    /// while a restarted controller relearns them, and the stale ones go when the
    /// switch's reconnect grace ends.
    pub const PROACTIVE: [RuleKind; 4] = [
        RuleKind::TableMiss,
        RuleKind::Lldp,
        RuleKind::Intercept,
        RuleKind::Gap,
    ];

    /// The cookie value with only the kind byte set (for cookie-masked deletes).
    pub const fn base(self) -> u64 {
        (self as u64) << KIND_SHIFT
    }
}

/// A cookie of `kind` carrying `low` (the low 56 bits) as detail.
pub const fn cookie(kind: RuleKind, low: u64) -> u64 {
    kind.base() | (low & !KIND_MASK)
}

/// The kind named by a cookie, if it is one of ours.
pub fn kind_of(cookie: u64) -> Option<RuleKind> {
    Some(match (cookie >> KIND_SHIFT) as u8 {
        0x01 => RuleKind::TableMiss,
        0x02 => RuleKind::Lldp,
        0x03 => RuleKind::L2,
        0x04 => RuleKind::Intercept,
        0x05 => RuleKind::Conn,
        0x06 => RuleKind::Gap,
        0x07 => RuleKind::Proactive,
        0x08 => RuleKind::Partition,
        0x09 => RuleKind::Departing,
        _ => return None,
    })
}

/// Detail bits of an L2 rule's cookie (the low 48 are the destination MAC).
pub mod l2 {
    /// The generation bit: each recomputation of the L2 rules re-adds them all with the
    /// other value, then deletes the rules still carrying the old one (make before break).
    pub const GEN: u64 = 1 << 48;
}

/// Detail bits of a connection rule's cookie.
pub mod conn {
    /// Set on the forward rule at the client's edge switch: the one whose FLOW_REMOVED
    /// ends the connection's accounting (the others expire on their own).
    pub const ACCOUNTING: u64 = 1 << 48;
    /// Set on reverse-direction rules.
    pub const REVERSE: u64 = 1 << 47;
    /// Set on the reverse rule at the client's edge switch: its FLOW_REMOVED packet count
    /// tells whether the backend answered the connection (passive outlier detection).
    pub const OUTCOME: u64 = 1 << 46;
    /// What a connection rule's cookie carries of its connection: its service's position
    /// and its backend's number in the service (`service::BackendId`), both as they were
    /// when the rule was made.
    pub const fn indexes(cookie: u64) -> (u16, u16) {
        (((cookie >> 16) & 0xffff) as u16, (cookie & 0xffff) as u16)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_round_trip_and_stay_in_the_top_byte() {
        for k in RuleKind::PROACTIVE.into_iter().chain([
            RuleKind::L2,
            RuleKind::Partition,
            RuleKind::Departing,
            RuleKind::Conn,
        ]) {
            let c = cookie(k, 0x00ff_ffff_ffff_ffff);
            assert_eq!(kind_of(c), Some(k));
            assert_eq!(c & KIND_MASK, k.base());
        }
        assert_eq!(kind_of(0), None);
        assert_eq!(
            cookie(RuleKind::Conn, u64::MAX) & KIND_MASK,
            RuleKind::Conn.base()
        );
    }
}
