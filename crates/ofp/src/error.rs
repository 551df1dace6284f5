//! Decode and encode errors of the codec.

/// Why a byte string is not a valid OpenFlow 1.3 message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum DecodeError {
    /// Fewer bytes than the header's length field (or a fixed-size part) needs.
    #[error("message truncated")]
    Truncated,
    /// A length field is impossible: smaller than the fixed part, not a multiple of 8 where
    /// the spec demands it, or a frame longer than its header says.
    #[error("bad length field")]
    BadLength,
    /// The header's version is not 0x04 (OpenFlow 1.3); HELLO is exempt (§6.3.1).
    #[error("unsupported OpenFlow version {0:#04x}")]
    BadVersion(u8),
    /// The header's type is not an OpenFlow 1.3 message type.
    #[error("unknown message type {0}")]
    UnknownType(u8),
    /// A field holds a value that cannot be represented.
    #[error("bad value in {what}")]
    BadValue {
        /// Which field.
        what: &'static str,
    },
    /// Bytes left over after the last message (in [`crate::decode_file_bytes`]).
    #[error("trailing bytes after the last message")]
    TrailingBytes,
}

/// Why a message cannot be encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum EncodeError {
    /// The message would be longer than 65,535 bytes, the most OpenFlow's 16-bit length
    /// field can say (§7.1). Nothing is appended to the output.
    #[error("message too long ({0} bytes)")]
    TooLong(usize),
    /// A nested TLV (match, action, instruction, bucket, band, property) would be too long
    /// for its 16-bit length field.
    #[error("{what} too long")]
    FieldTooLong {
        /// Which element.
        what: &'static str,
    },
    /// A SET_FIELD action carries a masked typed OXM. OpenFlow 1.3 SET_FIELD has no mask
    /// (§7.2.5, "the field must not be masked"); Open vSwitch rejects it.
    #[error("masked OXM in set_field")]
    MaskedSetField,
    /// A value does not fit its field on the wire.
    #[error("bad value in {what}")]
    BadValue {
        /// Which field.
        what: &'static str,
    },
}
