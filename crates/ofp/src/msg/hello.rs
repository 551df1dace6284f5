//! OFPT_HELLO and version negotiation (§6.3.1, §7.5.1).

use bytes::{BufMut, Bytes, BytesMut};

use crate::OFP_VERSION;
use crate::errmsg::ErrorMsg;
use crate::error::{DecodeError, EncodeError};
use crate::wire::{LenMark, Reader, pad8};

/// `OFPHET_VERSIONBITMAP`.
pub const OFPHET_VERSIONBITMAP: u16 = 1;

/// One hello element (`struct ofp_hello_elem_header`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum HelloElement {
    /// OFPHET_VERSIONBITMAP: bit `n` of the bitmap set = wire version `n` supported.
    VersionBitmap(Vec<u32>),
    /// Any other element, body kept raw (without padding).
    Unknown {
        /// Element type.
        typ: u16,
        /// Body.
        data: Bytes,
    },
}

/// OFPT_HELLO.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Hello {
    /// Elements.
    pub elements: Vec<HelloElement>,
}

impl Hello {
    /// Our HELLO: a version bitmap with only OpenFlow 1.3 (wire 0x04).
    pub fn ours() -> Self {
        Hello {
            elements: vec![HelloElement::VersionBitmap(vec![1 << OFP_VERSION])],
        }
    }

    /// Whether the peer's bitmap (if any) has wire version `v`.
    pub fn bitmap_has(&self, v: u8) -> Option<bool> {
        let bitmaps: Vec<&Vec<u32>> = self
            .elements
            .iter()
            .filter_map(|e| {
                if let HelloElement::VersionBitmap(b) = e {
                    Some(b)
                } else {
                    None
                }
            })
            .collect();
        if bitmaps.is_empty() {
            return None;
        }
        let word = usize::from(v / 32);
        let bit = u32::from(v % 32);
        Some(
            bitmaps
                .iter()
                .any(|b| b.get(word).is_some_and(|w| w & (1 << bit) != 0)),
        )
    }

    pub(crate) fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let mut elements = Vec::new();
        while !r.is_empty() {
            let typ = r.peek_u16(0)?;
            let len = usize::from(r.peek_u16(2)?);
            if len < 4 {
                return Err(DecodeError::BadLength);
            }
            let mut e = r.sub(len)?;
            e.skip(4)?;
            // Elements are padded to 8 bytes; the padding is not in `length` (§7.5.1).
            let pad = (8 - len % 8) % 8;
            r.skip(pad)?;
            if typ == OFPHET_VERSIONBITMAP && (len - 4) % 4 == 0 {
                let mut v = Vec::with_capacity((len - 4) / 4);
                while !e.is_empty() {
                    v.push(e.u32()?);
                }
                elements.push(HelloElement::VersionBitmap(v));
            } else {
                elements.push(HelloElement::Unknown {
                    typ,
                    data: e.rest(),
                });
            }
        }
        Ok(Hello { elements })
    }

    pub(crate) fn encode(&self, out: &mut BytesMut) -> Result<(), EncodeError> {
        for e in &self.elements {
            let start = out.len();
            match e {
                HelloElement::VersionBitmap(b) => {
                    out.put_u16(OFPHET_VERSIONBITMAP);
                    let m = LenMark::at(out, start);
                    for w in b {
                        out.put_u32(*w);
                    }
                    m.finish(out, "hello element")?;
                }
                HelloElement::Unknown { typ, data } => {
                    out.put_u16(*typ);
                    let m = LenMark::at(out, start);
                    out.put_slice(data);
                    m.finish(out, "hello element")?;
                }
            }
            pad8(out, start);
        }
        Ok(())
    }
}

/// Decide the version after HELLOs are exchanged (§6.3.1). `peer_version` is the version in
/// the peer HELLO's header. If both sides sent a bitmap the highest common version wins,
/// otherwise the smaller of the two header versions. We speak only 1.3 (0x04); anything
/// else yields the OFPET_HELLO_FAILED / OFPHFC_INCOMPATIBLE error to send before closing.
pub fn negotiate_version(peer_version: u8, peer_hello: &Hello) -> Result<u8, ErrorMsg> {
    let ok = match peer_hello.bitmap_has(OFP_VERSION) {
        Some(has) => has,
        None => peer_version >= OFP_VERSION,
    };
    if ok {
        Ok(OFP_VERSION)
    } else {
        Err(ErrorMsg::hello_incompatible(&format!(
            "no common OpenFlow version: we support only 1.3 (0x04), peer sent 0x{peer_version:02x}"
        )))
    }
}
