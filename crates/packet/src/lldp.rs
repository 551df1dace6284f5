//! LLDP (IEEE 802.1AB) TLVs: just enough to read back our own topology probes and to step
//! over anyone else's.
//!
//! An LLDPDU is a chain of TLVs, each with a 16-bit header: 7 bits of type, 9 bits of
//! length. 802.1AB §8.2 makes Chassis ID (type 1), Port ID (2) and TTL (3) mandatory, in
//! that order, and ends the chain with End Of LLDPDU (0). We do not insist on any of
//! that: a foreign or malformed LLDPDU yields an [`Lldp`] with `None` fields, never an
//! error, because the controller's only question is "is this one of our probes?".

/// An LLDP data unit, reduced to what our own probes carry (see [`crate::lldp_probe`]).
/// Foreign LLDP (from hosts or other controllers) parses too, with the fields it does not
/// carry in our format left `None`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Lldp {
    /// The datapath id from a Chassis ID TLV of subtype 7 (locally assigned) reading
    /// `dpid:<hex>`.
    pub chassis_dpid: Option<u64>,
    /// The port number from a Port ID TLV of subtype 2 (port component) or 7 (locally
    /// assigned) holding either a 4-byte big-endian number or ASCII decimal.
    pub port_no: Option<u32>,
    /// The Time To Live TLV, in seconds; 0 if absent.
    pub ttl: u16,
}

/// TLV type: End Of LLDPDU.
pub(crate) const TLV_END: u8 = 0;
/// TLV type: Chassis ID.
pub(crate) const TLV_CHASSIS_ID: u8 = 1;
/// TLV type: Port ID.
pub(crate) const TLV_PORT_ID: u8 = 2;
/// TLV type: Time To Live.
pub(crate) const TLV_TTL: u8 = 3;
/// Chassis ID subtype 7: locally assigned (802.1AB Table 8-2).
pub(crate) const CHASSIS_SUBTYPE_LOCAL: u8 = 7;
/// Port ID subtype 2: port component (802.1AB Table 8-3).
pub(crate) const PORT_SUBTYPE_COMPONENT: u8 = 2;
/// Port ID subtype 7: locally assigned.
pub(crate) const PORT_SUBTYPE_LOCAL: u8 = 7;
/// The prefix of our chassis id string, `dpid:%016x` (as Ryu and Faucet write it).
pub(crate) const DPID_PREFIX: &[u8] = b"dpid:";

/// Reads the TLV chain after the LLDP EtherType. Stops at End, at a TLV that overruns
/// the data, or at the end of the data.
pub(crate) fn parse(mut data: &[u8]) -> Lldp {
    let mut out = Lldp::default();
    while data.len() >= 2 {
        let header = u16::from_be_bytes([data[0], data[1]]);
        let typ = (header >> 9) as u8;
        let len = usize::from(header & 0x01ff);
        let Some(value) = data.get(2..2 + len) else {
            break;
        };
        data = &data[2 + len..];
        match typ {
            TLV_END => break,
            TLV_CHASSIS_ID => out.chassis_dpid = chassis_dpid(value),
            TLV_PORT_ID => out.port_no = port_no(value),
            TLV_TTL if value.len() >= 2 => out.ttl = u16::from_be_bytes([value[0], value[1]]),
            _ => {}
        }
    }
    out
}

fn chassis_dpid(value: &[u8]) -> Option<u64> {
    let (&subtype, id) = value.split_first()?;
    if subtype != CHASSIS_SUBTYPE_LOCAL {
        return None;
    }
    let hex = id.strip_prefix(DPID_PREFIX)?;
    if hex.is_empty() || hex.len() > 16 {
        return None;
    }
    let s = std::str::from_utf8(hex).ok()?;
    if !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(s, 16).ok()
}

fn port_no(value: &[u8]) -> Option<u32> {
    let (&subtype, id) = value.split_first()?;
    if subtype != PORT_SUBTYPE_COMPONENT && subtype != PORT_SUBTYPE_LOCAL {
        return None;
    }
    if let Ok(b) = <[u8; 4]>::try_from(id) {
        return Some(u32::from_be_bytes(b));
    }
    // Some implementations write the number as text.
    if id.is_empty() || id.len() > 10 || !id.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(id).ok()?.parse().ok()
}

/// Appends one TLV to `out`. `value` must be at most 511 bytes (the 9-bit length);
/// callers in this crate only pass short values.
pub(crate) fn push_tlv(out: &mut Vec<u8>, typ: u8, value: &[u8]) {
    let len = value.len().min(0x01ff);
    let header = (u16::from(typ & 0x7f) << 9) | len as u16;
    out.extend_from_slice(&header.to_be_bytes());
    out.extend_from_slice(&value[..len]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ascii_port_and_foreign_chassis() {
        let mut d = Vec::new();
        push_tlv(&mut d, TLV_CHASSIS_ID, &[4, 0, 1, 2, 3, 4, 5]); // subtype 4: MAC
        push_tlv(&mut d, TLV_PORT_ID, b"\x0712");
        push_tlv(&mut d, TLV_TTL, &[0, 120]);
        push_tlv(&mut d, TLV_END, &[]);
        assert_eq!(
            parse(&d),
            Lldp {
                chassis_dpid: None,
                port_no: Some(12),
                ttl: 120
            }
        );
    }

    #[test]
    fn overrunning_tlv_stops_quietly() {
        let mut d = Vec::new();
        push_tlv(&mut d, TLV_TTL, &[0, 30]);
        d.extend_from_slice(&[0x02, 0xff, 7]); // Port ID claiming 255 bytes
        assert_eq!(
            parse(&d),
            Lldp {
                chassis_dpid: None,
                port_no: None,
                ttl: 30
            }
        );
    }

    #[test]
    fn bad_dpid_strings() {
        for v in [
            &b"\x07dpid:"[..],
            b"\x07dpid:0123456789abcdef0",
            b"\x07dpid:xyz",
            b"\x07dp",
            b"\x01dpid:1",
            b"",
        ] {
            assert_eq!(chassis_dpid(v), None, "{v:?}");
        }
        assert_eq!(chassis_dpid(b"\x07dpid:00000000000000aB"), Some(0xab));
    }
}
