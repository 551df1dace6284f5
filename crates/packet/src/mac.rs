//! Ethernet MAC addresses.

use std::fmt;
use std::str::FromStr;

/// A 48-bit IEEE 802 MAC address.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct MacAddr(pub [u8; 6]);

/// Hashed as one `u64` (equal addresses, equal numbers): the derived hash feeds the
/// hasher the array's length and then its six bytes as a slice, two rounds where one
/// does, on maps the PACKET_IN path looks up several times a packet.
impl std::hash::Hash for MacAddr {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u64(self.to_u64());
    }
}

impl MacAddr {
    /// `ff:ff:ff:ff:ff:ff`.
    pub const BROADCAST: MacAddr = MacAddr([0xff; 6]);
    /// `00:00:00:00:00:00`.
    pub const ZERO: MacAddr = MacAddr([0; 6]);

    /// The six octets.
    pub const fn octets(self) -> [u8; 6] {
        self.0
    }

    /// True for group addresses (I/G bit, the least significant bit of the first octet,
    /// set), which includes broadcast.
    pub const fn is_multicast(self) -> bool {
        self.0[0] & 0x01 != 0
    }

    /// True for `ff:ff:ff:ff:ff:ff`.
    pub const fn is_broadcast(self) -> bool {
        matches!(self.0, [0xff, 0xff, 0xff, 0xff, 0xff, 0xff])
    }

    /// True for individual (non-multicast) addresses.
    pub const fn is_unicast(self) -> bool {
        !self.is_multicast()
    }

    /// True for locally administered addresses (U/L bit set).
    pub const fn is_local(self) -> bool {
        self.0[0] & 0x02 != 0
    }

    /// True for `00:00:00:00:00:00`.
    pub const fn is_zero(self) -> bool {
        matches!(self.0, [0, 0, 0, 0, 0, 0])
    }

    /// The address as the low 48 bits of a `u64` (handy for OXM values and hashing).
    pub const fn to_u64(self) -> u64 {
        let o = self.0;
        u64::from_be_bytes([0, 0, o[0], o[1], o[2], o[3], o[4], o[5]])
    }

    /// The address held in the low 48 bits of `v` (the high 16 bits are ignored).
    pub const fn from_u64(v: u64) -> MacAddr {
        let b = v.to_be_bytes();
        MacAddr([b[2], b[3], b[4], b[5], b[6], b[7]])
    }
}

impl From<[u8; 6]> for MacAddr {
    fn from(o: [u8; 6]) -> Self {
        MacAddr(o)
    }
}

impl From<MacAddr> for [u8; 6] {
    fn from(m: MacAddr) -> Self {
        m.0
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let o = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            o[0], o[1], o[2], o[3], o[4], o[5]
        )
    }
}

impl fmt::Debug for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MacAddr({self})")
    }
}

/// A string that is not six colon- (or dash-) separated hex octets.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid MAC address (expected six hex octets like aa:bb:cc:dd:ee:ff)")]
pub struct MacParseError;

impl FromStr for MacAddr {
    type Err = MacParseError;

    /// Accepts `aa:bb:cc:dd:ee:ff` and `aa-bb-cc-dd-ee-ff`, either case; each octet is
    /// one or two hex digits.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let sep = if s.contains('-') { '-' } else { ':' };
        let mut out = [0u8; 6];
        let mut parts = s.split(sep);
        for slot in &mut out {
            let part = parts.next().ok_or(MacParseError)?;
            if part.is_empty() || part.len() > 2 || !part.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(MacParseError);
            }
            *slot = u8::from_str_radix(part, 16).map_err(|_| MacParseError)?;
        }
        if parts.next().is_some() {
            return Err(MacParseError);
        }
        Ok(MacAddr(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_and_parse_round_trip() {
        let m = MacAddr([0x00, 0x1b, 0x21, 0xab, 0xcd, 0xef]);
        assert_eq!(m.to_string(), "00:1b:21:ab:cd:ef");
        assert_eq!("00:1b:21:ab:cd:ef".parse::<MacAddr>(), Ok(m));
        assert_eq!("00-1B-21-AB-CD-EF".parse::<MacAddr>(), Ok(m));
        assert_eq!("0:1b:21:ab:cd:ef".parse::<MacAddr>(), Ok(m));
        assert_eq!(format!("{m:?}"), "MacAddr(00:1b:21:ab:cd:ef)");
    }

    #[test]
    fn rejects_bad_strings() {
        for s in [
            "",
            "00:11:22:33:44",
            "00:11:22:33:44:55:66",
            "00:11:22:33:44:5g",
            "000:11:22:33:44:55",
            "00:11:22:33:44:",
            "+0:11:22:33:44:55",
            "00:11-22:33:44:55",
        ] {
            assert_eq!(s.parse::<MacAddr>(), Err(MacParseError), "{s:?}");
        }
    }

    #[test]
    fn classification() {
        assert!(MacAddr::BROADCAST.is_broadcast());
        assert!(MacAddr::BROADCAST.is_multicast());
        assert!(MacAddr([0x01, 0x80, 0xc2, 0, 0, 0x0e]).is_multicast());
        assert!(!MacAddr([0x01, 0x80, 0xc2, 0, 0, 0x0e]).is_broadcast());
        assert!(MacAddr([0x02, 0, 0, 0, 0, 1]).is_unicast());
        assert!(MacAddr([0x02, 0, 0, 0, 0, 1]).is_local());
        assert!(MacAddr::ZERO.is_zero());
        let m = MacAddr([1, 2, 3, 4, 5, 6]);
        assert_eq!(m.to_u64(), 0x0102_0304_0506);
        assert_eq!(MacAddr::from_u64(0xffff_0102_0304_0506), m);
    }
}
