//! Splitting a byte stream into whole OpenFlow messages (§7.1: every message starts with an
//! 8-byte header whose 16-bit `length` covers the whole message).

use bytes::{Buf, Bytes, BytesMut};

use crate::error::DecodeError;
use crate::header::{HEADER_LEN, HeaderView};
use crate::msg::Message;

/// Why the stream cannot be framed. After an error the stream is out of sync: close it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// A header says its message is shorter than the 8-byte header itself.
    #[error("header length {0} is shorter than the header")]
    BadLength(u16),
}

/// Splits a stream into frames across partial reads, several messages per read.
///
/// It never reserves space because of a length field: the buffer grows only as bytes
/// arrive (the caller reads into it), and one message can be at most 65,535 bytes since the
/// length field has 16 bits. Wrap it in a `tokio_util::codec::Decoder` in the runtime.
#[derive(Debug, Clone, Copy, Default)]
pub struct Framer {
    _priv: (),
}

impl Framer {
    /// A new framer.
    pub fn new() -> Self {
        Framer { _priv: () }
    }

    /// Take the next whole message out of `buf`, or `Ok(None)` if more bytes are needed.
    pub fn next_frame(&mut self, buf: &mut BytesMut) -> Result<Option<Bytes>, FrameError> {
        Ok(self.frame_len(buf)?.map(|len| buf.split_to(len).freeze()))
    }

    /// The length of the whole message at the start of `buf`, or `Ok(None)` if more bytes
    /// are needed: for a reader that looks at the message in place and then drops it
    /// from its buffer (`advance`), with no `Bytes` handle of its own.
    pub fn frame_len(&self, buf: &[u8]) -> Result<Option<usize>, FrameError> {
        let Some(head) = buf.get(..HEADER_LEN) else {
            return Ok(None);
        };
        let len = match HeaderView::new_checked(head) {
            Ok(h) => usize::from(h.length()),
            Err(_) => {
                return Err(FrameError::BadLength(u16::from_be_bytes([
                    head[2], head[3],
                ])));
            }
        };
        Ok((buf.len() >= len).then_some(len))
    }
}

/// Decode a file (or any buffer) holding one or more whole concatenated messages.
/// Trailing bytes that do not form a whole message are an error.
pub fn decode_file_bytes(data: &[u8]) -> Result<Vec<(u32, Message)>, DecodeError> {
    let mut buf = BytesMut::from(data);
    let mut framer = Framer::new();
    let mut out = Vec::new();
    loop {
        match framer.next_frame(&mut buf) {
            Ok(Some(frame)) => out.push(crate::decode(frame)?),
            Ok(None) => break,
            Err(FrameError::BadLength(_)) => return Err(DecodeError::BadLength),
        }
    }
    if buf.has_remaining() {
        return Err(if out.is_empty() {
            DecodeError::Truncated
        } else {
            DecodeError::TrailingBytes
        });
    }
    Ok(out)
}
