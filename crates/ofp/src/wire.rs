//! Bounds-checked reading and length-patching writing. Every read checks its bounds and
//! returns [`DecodeError::Truncated`] instead of panicking.

use bytes::{BufMut, Bytes, BytesMut};

use crate::error::{DecodeError, EncodeError};

/// A cursor over a window `[pos, end)` of a shared frame. Taking bytes out (`bytes`) slices
/// the frame: no copy, no allocation.
#[derive(Clone, Copy)]
pub(crate) struct Reader<'a> {
    buf: &'a Bytes,
    pos: usize,
    end: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a Bytes) -> Self {
        Reader {
            buf,
            pos: 0,
            end: buf.len(),
        }
    }

    #[inline]
    pub(crate) fn remaining(&self) -> usize {
        self.end.saturating_sub(self.pos)
    }

    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.remaining() == 0
    }

    #[inline]
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if n > self.remaining() {
            return Err(DecodeError::Truncated);
        }
        let s = self
            .buf
            .get(self.pos..self.pos + n)
            .ok_or(DecodeError::Truncated)?;
        self.pos += n;
        Ok(s)
    }

    #[inline]
    pub(crate) fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let s = self.take(N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    #[inline]
    pub(crate) fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.array::<1>()?[0])
    }
    #[inline]
    pub(crate) fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_be_bytes(self.array()?))
    }
    #[inline]
    pub(crate) fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_be_bytes(self.array()?))
    }
    #[inline]
    pub(crate) fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_be_bytes(self.array()?))
    }
    #[inline]
    pub(crate) fn skip(&mut self, n: usize) -> Result<(), DecodeError> {
        self.take(n).map(|_| ())
    }
    /// `n` bytes as a zero-copy slice of the frame.
    #[inline]
    pub(crate) fn bytes(&mut self, n: usize) -> Result<Bytes, DecodeError> {
        if n > self.remaining() {
            return Err(DecodeError::Truncated);
        }
        let b = if n == 0 {
            Bytes::new()
        } else {
            self.buf.slice(self.pos..self.pos + n)
        };
        self.pos += n;
        Ok(b)
    }
    /// Everything left, zero-copy.
    #[inline]
    pub(crate) fn rest(&mut self) -> Bytes {
        let n = self.remaining();
        self.bytes(n).unwrap_or_default()
    }
    /// A reader over the next `n` bytes; this reader moves past them.
    #[inline]
    pub(crate) fn sub(&mut self, n: usize) -> Result<Reader<'a>, DecodeError> {
        if n > self.remaining() {
            return Err(DecodeError::Truncated);
        }
        let r = Reader {
            buf: self.buf,
            pos: self.pos,
            end: self.pos + n,
        };
        self.pos += n;
        Ok(r)
    }
    /// Peek a big-endian u16 at `off` bytes ahead without moving.
    #[inline]
    pub(crate) fn peek_u16(&self, off: usize) -> Result<u16, DecodeError> {
        let mut r = *self;
        r.skip(off)?;
        r.u16()
    }
}

/// Remember where a 16-bit length field is, fill it in once the element is written.
#[derive(Clone, Copy)]
pub(crate) struct LenMark {
    start: usize,
    field: usize,
}

impl LenMark {
    /// `start`: where the element starts; a u16 placeholder is written now.
    #[inline]
    pub(crate) fn at(out: &mut BytesMut, start: usize) -> Self {
        let field = out.len();
        out.put_u16(0);
        LenMark { start, field }
    }
    /// Write the element length (current end - start) into the placeholder.
    #[inline]
    pub(crate) fn finish(
        self,
        out: &mut BytesMut,
        what: &'static str,
    ) -> Result<usize, EncodeError> {
        let len = out.len() - self.start;
        let v = u16::try_from(len).map_err(|_| EncodeError::FieldTooLong { what })?;
        if let Some(s) = out.get_mut(self.field..self.field + 2) {
            s.copy_from_slice(&v.to_be_bytes());
        }
        Ok(len)
    }
}

/// Zero bytes up to the next multiple of 8 counted from `start`.
#[inline]
pub(crate) fn pad8(out: &mut BytesMut, start: usize) {
    let len = out.len() - start;
    let pad = (8 - len % 8) % 8;
    out.put_bytes(0, pad);
}

#[inline]
pub(crate) fn padded8(n: usize) -> usize {
    n.div_ceil(8) * 8
}
