//! The Internet checksum (RFC 1071), for headers written in place: IPv4's, and TCP's with
//! its pseudo-header (RFC 9293 §3.1), which a caller adds in as a running sum.

/// `acc` plus the big-endian 16-bit words of `b`, unfolded; an odd last byte counts as
/// the high half of a word (RFC 1071 §4.1).
#[inline]
pub fn ones_complement_sum(acc: u32, b: &[u8]) -> u32 {
    let words = b.chunks_exact(2);
    let last = words.remainder().first().map_or(0, |&x| u32::from(x) << 8);
    words.fold(acc + last, |a, w| {
        a + u32::from(u16::from_be_bytes([w[0], w[1]]))
    })
}

/// The checksum of a sum from [`ones_complement_sum`]: folded to 16 bits with the
/// end-around carry, then complemented.
#[inline]
pub fn internet_checksum(mut sum: u32) -> u16 {
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 1071 §3's example: the sum of 00 01 f2 03 f4 f5 f6 f7 is 2ddf0, folded ddf2; a
    /// header with its checksum written in sums to ffff (checksum 0); an odd byte pads.
    #[test]
    fn the_rfc_1071_example() {
        let b = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(ones_complement_sum(0, &b), 0x2ddf0);
        assert_eq!(internet_checksum(ones_complement_sum(0, &b)), !0xddf2);
        let mut with = b.to_vec();
        with.extend_from_slice(&(!0xddf2u16).to_be_bytes());
        assert_eq!(internet_checksum(ones_complement_sum(0, &with)), 0);
        assert_eq!(ones_complement_sum(7, &[0x12]), 7 + 0x1200);
        assert_eq!(ones_complement_sum(0, &[0x12, 0x34, 0x56]), 0x1234 + 0x5600);
    }
}
