//! Bodies of the fuzz targets, shared by `fuzz/` (cargo-fuzz, nightly) and
//! `tests/fuzz_smoke.rs` (stable). Not part of the stable API.

use bytes::{Bytes, BytesMut};

use crate::framing::Framer;
use crate::msg::{decode, encode};

/// Decode arbitrary bytes; if that succeeds, encoding must succeed, decoding the encoding
/// must give the same message, and encoding that again the same bytes (a fixpoint). The
/// input itself may differ from the encoding only in bytes that carry nothing: padding
/// that a peer left non-zero (conformance tests check byte identity on real messages).
pub fn decode_target(data: &[u8]) {
    let Ok((xid, msg)) = decode(Bytes::copy_from_slice(data)) else {
        return;
    };
    let mut out = BytesMut::new();
    if let Err(e) = encode(xid, &msg, &mut out) {
        panic!("decoded message does not encode: {e:?} {msg:?}");
    }
    let again = decode(out.clone().freeze());
    assert_eq!(again, Ok((xid, msg.clone())), "re-decode differs");
    let mut out2 = BytesMut::new();
    if let Err(e) = encode(xid, &msg, &mut out2) {
        panic!("re-encode failed: {e:?}");
    }
    assert_eq!(out, out2, "encoding is not a fixpoint");
    assert_eq!(out.len(), data.len(), "decode→encode changed the length");
}

/// Feed `data` to the framer in chunks whose sizes come from the first bytes, decoding
/// every frame; the frames must be the same as with one big read.
pub fn framer_target(data: &[u8]) {
    let (sizes, stream) = data.split_at(data.len().min(8));
    let whole = frames(stream, &[usize::MAX]);
    let sizes: Vec<usize> = sizes.iter().map(|&b| usize::from(b) + 1).collect();
    let chunked = frames(stream, if sizes.is_empty() { &[1] } else { &sizes });
    assert_eq!(
        whole, chunked,
        "framing depends on how the stream was split"
    );
    for f in whole.0 {
        let _ = decode(f);
    }
}

type Framed = (Vec<Bytes>, bool);

fn frames(stream: &[u8], sizes: &[usize]) -> Framed {
    let mut framer = Framer::new();
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    let mut rest = stream;
    let mut i = 0usize;
    loop {
        let n = sizes
            .get(i % sizes.len().max(1))
            .copied()
            .unwrap_or(1)
            .min(rest.len());
        i += 1;
        let (chunk, r) = rest.split_at(n);
        rest = r;
        buf.extend_from_slice(chunk);
        loop {
            match framer.next_frame(&mut buf) {
                Ok(Some(f)) => {
                    assert!(f.len() >= 8 && f.len() <= 65_535);
                    out.push(f)
                }
                Ok(None) => break,
                Err(_) => return (out, true),
            }
        }
        if rest.is_empty() {
            return (out, false);
        }
    }
}
