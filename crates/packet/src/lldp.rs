//! LLDP (IEEE 802.1AB) TLVs: just enough to read back our own topology probes and to step
//! over anyone else's.
//!
//! An LLDPDU is a chain of TLVs, each with a 16-bit header: 7 bits of type, 9 bits of
//! length. 802.1AB §8.2 makes Chassis ID (type 1), Port ID (2) and TTL (3) mandatory, in
//! that order, and ends the chain with End Of LLDPDU (0). We do not insist on any of
//! that: a foreign or malformed LLDPDU yields an [`Lldp`] with `None` fields, never an
//! error, because the controller's only question is "is this one of our probes?".
//!
//! A probe's chassis and port are plain text any host can write, and LLDP goes out of
//! every port, edge ports included, so a host learns its switch's id from the probes it
//! receives. So that a host cannot forge a link (and have the controller forget the hosts
//! behind the port it names), our probes also carry a tag: an organizationally specific
//! TLV (802.1AB §8.6, type 127) holding SipHash-2-4 of the chassis and port under a key
//! only the controller holds ([`LldpKey`], [`lldp_tag`]), as ONOS signs its probes.

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
    /// The tag of our probes' organizationally specific TLV ([`lldp_tag`]), if present.
    pub tag: Option<u64>,
}

/// The controller's key for the tags of its LLDP probes (128 bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LldpKey(pub [u64; 2]);

/// The tag a probe from port `port_no` of switch `dpid` carries under `key`: SipHash-2-4
/// (Aumasson and Bernstein), a keyed hash made for short inputs, of the two numbers.
pub fn lldp_tag(key: &LldpKey, dpid: u64, port_no: u32) -> u64 {
    let mut m = [0u8; 12];
    m[..8].copy_from_slice(&dpid.to_be_bytes());
    m[8..].copy_from_slice(&port_no.to_be_bytes());
    siphash24(key.0, &m)
}

/// SipHash-2-4 of `data` under the key `(k0, k1)`.
fn siphash24([k0, k1]: [u64; 2], data: &[u8]) -> u64 {
    fn round(v: &mut [u64; 4]) {
        v[0] = v[0].wrapping_add(v[1]);
        v[1] = v[1].rotate_left(13) ^ v[0];
        v[0] = v[0].rotate_left(32);
        v[2] = v[2].wrapping_add(v[3]);
        v[3] = v[3].rotate_left(16) ^ v[2];
        v[0] = v[0].wrapping_add(v[3]);
        v[3] = v[3].rotate_left(21) ^ v[0];
        v[2] = v[2].wrapping_add(v[1]);
        v[1] = v[1].rotate_left(17) ^ v[2];
        v[2] = v[2].rotate_left(32);
    }
    let mut v = [
        k0 ^ 0x736f_6d65_7073_6575,
        k1 ^ 0x646f_7261_6e64_6f6d,
        k0 ^ 0x6c79_6765_6e65_7261,
        k1 ^ 0x7465_6462_7974_6573,
    ];
    let mut chunks = data.chunks_exact(8);
    for c in &mut chunks {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        let m = u64::from_le_bytes(w);
        v[3] ^= m;
        round(&mut v);
        round(&mut v);
        v[0] ^= m;
    }
    // The last word: the remaining bytes, and the length's low byte on top.
    let mut w = [0u8; 8];
    let rest = chunks.remainder();
    w[..rest.len()].copy_from_slice(rest);
    w[7] = data.len() as u8;
    let m = u64::from_le_bytes(w);
    v[3] ^= m;
    round(&mut v);
    round(&mut v);
    v[0] ^= m;
    v[2] ^= 0xff;
    for _ in 0..4 {
        round(&mut v);
    }
    v[0] ^ v[1] ^ v[2] ^ v[3]
}

/// TLV type: End Of LLDPDU.
pub(crate) const TLV_END: u8 = 0;
/// TLV type: Chassis ID.
pub(crate) const TLV_CHASSIS_ID: u8 = 1;
/// TLV type: Port ID.
pub(crate) const TLV_PORT_ID: u8 = 2;
/// TLV type: Time To Live.
pub(crate) const TLV_TTL: u8 = 3;
/// TLV type: organizationally specific (802.1AB §8.6): an OUI, a subtype, then its data.
pub(crate) const TLV_ORG: u8 = 127;
/// The organization of our tag TLV: `66:67:77` ("fgw"), with the subtype below. Not an
/// IEEE-assigned OUI: it only has to tell our probes' TLV from other organizations'.
pub(crate) const FLOWGATE_OUI: [u8; 3] = [0x66, 0x67, 0x77];
/// Subtype of the tag TLV.
pub(crate) const ORG_SUBTYPE_TAG: u8 = 1;
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
            TLV_ORG => {
                if let Some(tag) = tag(value) {
                    out.tag = Some(tag);
                }
            }
            _ => {}
        }
    }
    out
}

/// Our tag, from an organizationally specific TLV's value: OUI, subtype, 8 bytes.
fn tag(value: &[u8]) -> Option<u64> {
    let (head, tag) = value.split_first_chunk::<4>()?;
    let tag: [u8; 8] = tag.try_into().ok()?;
    (head[..3] == FLOWGATE_OUI && head[3] == ORG_SUBTYPE_TAG).then(|| u64::from_be_bytes(tag))
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
                ttl: 120,
                tag: None
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
                ttl: 30,
                tag: None
            }
        );
    }

    /// The reference vector of the SipHash paper (Appendix A): key 00..0f, message
    /// 00..0e.
    #[test]
    fn siphash24_matches_the_papers_vector() {
        let key = [
            u64::from_le_bytes([0, 1, 2, 3, 4, 5, 6, 7]),
            u64::from_le_bytes([8, 9, 10, 11, 12, 13, 14, 15]),
        ];
        let msg: Vec<u8> = (0..15).collect();
        assert_eq!(siphash24(key, &msg), 0xa129_ca61_49be_45e5);
        // The empty message, from the reference implementation's vectors.h.
        assert_eq!(siphash24(key, &[]), 0x726f_db47_dd0e_0e31);
    }

    #[test]
    fn a_tag_tlv_is_read_only_from_our_organization() {
        let mut d = Vec::new();
        push_tlv(
            &mut d,
            TLV_ORG,
            &[0x00, 0x80, 0xc2, 1, 0, 0, 0, 0, 0, 0, 0, 9],
        );
        push_tlv(
            &mut d,
            TLV_ORG,
            &[0x66, 0x67, 0x77, 2, 0, 0, 0, 0, 0, 0, 0, 9],
        );
        push_tlv(&mut d, TLV_ORG, &[0x66, 0x67, 0x77, 1, 0, 0, 0, 9]); // short
        assert_eq!(parse(&d).tag, None);
        push_tlv(
            &mut d,
            TLV_ORG,
            &[0x66, 0x67, 0x77, 1, 0, 0, 0, 0, 0, 0, 0, 9],
        );
        assert_eq!(parse(&d).tag, Some(9));
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
