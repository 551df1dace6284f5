//! Fixed-size, NUL-padded string fields kept as raw bytes, so decode→encode is lossless.

/// A fixed-size NUL-padded string field (`char name[N]`), raw bytes kept.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct FixedStr<const N: usize>(pub [u8; N]);

/// `char name[OFP_MAX_PORT_NAME_LEN]` (16 bytes).
pub type PortName = FixedStr<16>;
/// `char [DESC_STR_LEN]` (256 bytes).
pub type DescStr = FixedStr<256>;
/// `char [SERIAL_NUM_LEN]` / `char name[OFP_MAX_TABLE_NAME_LEN]` (32 bytes).
pub type ShortStr = FixedStr<32>;

impl<const N: usize> FixedStr<N> {
    /// From a string, truncated to `N - 1` bytes so a NUL terminator remains.
    pub fn new(s: &str) -> Self {
        let mut a = [0u8; N];
        let n = s.len().min(N.saturating_sub(1));
        if let (Some(dst), Some(src)) = (a.get_mut(..n), s.as_bytes().get(..n)) {
            dst.copy_from_slice(src);
        }
        FixedStr(a)
    }
    /// The text up to the first NUL (the valid UTF-8 prefix of it).
    pub fn as_str(&self) -> &str {
        let end = self.0.iter().position(|&b| b == 0).unwrap_or(N);
        let b = self.0.get(..end).unwrap_or(&[]);
        match std::str::from_utf8(b) {
            Ok(s) => s,
            Err(e) => std::str::from_utf8(b.get(..e.valid_up_to()).unwrap_or(&[])).unwrap_or(""),
        }
    }
    /// The raw bytes.
    pub fn as_bytes(&self) -> &[u8; N] {
        &self.0
    }
}

impl<const N: usize> Default for FixedStr<N> {
    fn default() -> Self {
        FixedStr([0u8; N])
    }
}

impl<const N: usize> std::fmt::Debug for FixedStr<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self.as_str(), f)
    }
}

impl<const N: usize> std::fmt::Display for FixedStr<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl<const N: usize> From<&str> for FixedStr<N> {
    fn from(s: &str) -> Self {
        Self::new(s)
    }
}

#[cfg(feature = "serde")]
impl<const N: usize> serde::Serialize for FixedStr<N> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}
