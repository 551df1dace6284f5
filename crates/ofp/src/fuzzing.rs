//! Bodies of the fuzz targets, shared by `fuzz/` (cargo-fuzz, nightly) and
//! `tests/fuzz_smoke.rs` (stable). Not part of the stable API.

use bytes::{Bytes, BytesMut};

use std::net::Ipv4Addr;

use crate::framing::Framer;
use crate::msg::{Message, decode, encode};
use crate::oxm::ofb;
use crate::view::{ActionRef, FlowModView, FlowRemovedView, OxmRef, PacketInView, PacketOutView};
use crate::{Action, FlowMod, FlowRemoved, Instruction, MsgType, Oxm};

/// Decode arbitrary bytes; if that succeeds, encoding must succeed, decoding the encoding
/// must give the same message, and encoding that again the same bytes (a fixpoint). The
/// input itself may differ from the encoding only in bytes that carry nothing: padding
/// that a peer left non-zero (conformance tests check byte identity on real messages).
pub fn decode_target(data: &[u8]) {
    view_target(data);
    let (xid, msg) = match decode(Bytes::copy_from_slice(data)) {
        Ok(m) => m,
        Err(e) => return answer_agrees(data, e),
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

/// The answer to bytes that do not decode (§7.4.4): none for an OFPT_ERROR, else the
/// message's own xid and its first 64 bytes at most, in an OFPT_ERROR that itself encodes
/// and decodes back to the same.
fn answer_agrees(data: &[u8], e: crate::DecodeError) {
    let Some((xid, err)) = crate::ErrorMsg::answering(data, e) else {
        assert_eq!(
            data.get(1).copied(),
            Some(MsgType::Error as u8),
            "unanswered: {e:?}"
        );
        return;
    };
    if let Some(x) = data.get(4..8) {
        assert_eq!(xid.to_be_bytes(), x, "the answer's xid is the message's");
    }
    assert!(err.data.len() <= crate::errmsg::FAILED_REQUEST_BYTES);
    assert!(
        data.starts_with(&err.data),
        "the answer's data is the message's start"
    );
    let mut out = BytesMut::new();
    let answer = Message::Error(err);
    if let Err(e) = encode(xid, &answer, &mut out) {
        panic!("the answer does not encode: {e:?}");
    }
    assert_eq!(
        decode(out.freeze()),
        Ok((xid, answer)),
        "the answer re-decodes"
    );
}

/// A FLOW_MOD, PACKET_OUT, FLOW_REMOVED or PACKET_IN view of `data` fails exactly when
/// `decode` fails, with the same error, and otherwise yields what `decode` yields: the
/// fixed fields, the match's TLVs, the instructions and actions in order, and the typed
/// accessors' values.
pub fn view_target(data: &[u8]) {
    let decoded = decode(Bytes::copy_from_slice(data));
    match data.get(1).copied() {
        Some(t) if t == MsgType::FlowMod as u8 => {
            let view = FlowModView::new(data);
            match (&view, &decoded) {
                (Ok(v), Ok((xid, Message::FlowMod(fm)))) => {
                    assert_eq!(v.xid(), *xid);
                    flow_mod_agrees(v, fm);
                }
                (Err(a), Err(b)) => assert_eq!(a, b, "view and decode fail differently"),
                _ => panic!("view {view:?} but decode {decoded:?}"),
            }
        }
        Some(t) if t == MsgType::PacketOut as u8 => {
            let view = PacketOutView::new(data);
            match (&view, &decoded) {
                (Ok(v), Ok((xid, Message::PacketOut(po)))) => {
                    assert_eq!(v.xid(), *xid);
                    assert_eq!(v.buffer_id(), po.buffer_id);
                    assert_eq!(v.in_port(), po.in_port);
                    assert_eq!(v.data(), &po.data[..]);
                    actions_agree(v.actions(), &po.actions);
                }
                (Err(a), Err(b)) => assert_eq!(a, b, "view and decode fail differently"),
                _ => panic!("view {view:?} but decode {decoded:?}"),
            }
        }
        Some(t) if t == MsgType::FlowRemoved as u8 => {
            let view = FlowRemovedView::new(data);
            match (&view, &decoded) {
                (Ok(v), Ok((xid, Message::FlowRemoved(fr)))) => {
                    assert_eq!(v.xid(), *xid);
                    flow_removed_agrees(v, fr);
                }
                (Err(a), Err(b)) => assert_eq!(a, b, "view and decode fail differently"),
                _ => panic!("view {view:?} but decode {decoded:?}"),
            }
        }
        Some(t) if t == MsgType::PacketIn as u8 => {
            let view = PacketInView::new(data);
            match (&view, &decoded) {
                (Ok(v), Ok((xid, Message::PacketIn(pi)))) => {
                    assert_eq!(v.xid(), *xid);
                    let fixed = (v.buffer_id(), v.total_len(), v.reason(), v.table_id());
                    let want = (pi.buffer_id, pi.total_len, pi.reason, pi.table_id);
                    assert_eq!(fixed, want);
                    assert_eq!(v.cookie(), pi.cookie);
                    assert_eq!(v.in_port(), pi.in_port());
                    assert_eq!(v.data(), &pi.data[..]);
                    let fields: Vec<OxmRef<'_>> = v.match_fields().collect();
                    assert_eq!(fields.len(), pi.match_.len());
                    for (o, want) in fields.iter().zip(pi.match_.iter()) {
                        oxm_agrees(o, want, false);
                    }
                }
                (Err(a), Err(b)) => assert_eq!(a, b, "view and decode fail differently"),
                _ => panic!("view {view:?} but decode {decoded:?}"),
            }
        }
        // Another type: the views refuse it, whether `decode` takes it or not.
        _ => {
            assert!(FlowModView::new(data).is_err());
            assert!(PacketOutView::new(data).is_err());
            assert!(FlowRemovedView::new(data).is_err());
            assert!(PacketInView::new(data).is_err());
        }
    }
}

fn flow_removed_agrees(v: &FlowRemovedView<'_>, fr: &FlowRemoved) {
    let fixed = (
        v.cookie(),
        v.priority(),
        v.reason(),
        v.table_id(),
        (v.duration_sec(), v.duration_nsec()),
        (v.idle_timeout(), v.hard_timeout()),
        (v.packet_count(), v.byte_count()),
    );
    let want = (
        fr.cookie,
        fr.priority,
        fr.reason,
        fr.table_id,
        (fr.duration_sec, fr.duration_nsec),
        (fr.idle_timeout, fr.hard_timeout),
        (fr.packet_count, fr.byte_count),
    );
    assert_eq!(fixed, want);
    let fields: Vec<OxmRef<'_>> = v.match_fields().collect();
    assert_eq!(fields.len(), fr.match_.len());
    for (o, want) in fields.iter().zip(fr.match_.iter()) {
        oxm_agrees(o, want, false);
    }
}

fn flow_mod_agrees(v: &FlowModView<'_>, fm: &FlowMod) {
    assert_eq!(v.fixed(), fm.fixed());
    let fields: Vec<OxmRef<'_>> = v.match_fields().collect();
    assert_eq!(fields.len(), fm.match_.len());
    for (o, want) in fields.iter().zip(fm.match_.iter()) {
        oxm_agrees(o, want, false);
    }
    let ins: Vec<Instruction> = v
        .instructions()
        .map(|i| i.to_instruction())
        .collect::<Result<_, _>>()
        .expect("checked instruction decodes");
    assert_eq!(&ins[..], &fm.instructions[..]);
    let joined: Vec<Action> = fm
        .instructions
        .iter()
        .flat_map(|i| match i {
            Instruction::ApplyActions(a) | Instruction::WriteActions(a) => a.as_slice(),
            _ => &[],
        })
        .cloned()
        .collect();
    actions_agree(v.actions(), &joined);
}

fn actions_agree<'a>(view: impl Iterator<Item = ActionRef<'a>>, want: &[Action]) {
    let got: Vec<ActionRef<'a>> = view.collect();
    assert_eq!(got.len(), want.len());
    for (a, w) in got.iter().zip(want) {
        assert_eq!(&a.to_action().expect("checked action decodes"), w);
        let output = match w {
            Action::Output { port, max_len } => Some((*port, *max_len)),
            _ => None,
        };
        assert_eq!(a.output(), output);
        let set = |field| a.set_field_basic::<4>(field).map(Ipv4Addr::from);
        let (src, dst) = match w {
            Action::SetField(Oxm::Ipv4Src { value, mask: None }) => (Some(*value), None),
            Action::SetField(Oxm::Ipv4Dst { value, mask: None }) => (None, Some(*value)),
            _ => (None, None),
        };
        assert_eq!((set(ofb::IPV4_SRC), set(ofb::IPV4_DST)), (src, dst));
        let eth_dst = match w {
            Action::SetField(Oxm::EthDst { value, mask: None }) => Some(*value),
            _ => None,
        };
        assert_eq!(a.set_field_basic::<6>(ofb::ETH_DST), eth_dst);
        match (a.set_field(), w) {
            (Some(o), Action::SetField(oxm)) => oxm_agrees(&o, oxm, true),
            (None, Action::SetField(_)) => panic!("set_field missing"),
            _ => {}
        }
    }
}

/// `o` is what `decode` made `want` of, in a match or (`set_field`) in a SET_FIELD action.
fn oxm_agrees(o: &OxmRef<'_>, want: &Oxm, set_field: bool) {
    let id = want.id();
    assert_eq!((o.class(), o.field()), (id.class, id.field));
    assert_eq!(o.has_mask(), want.has_mask());
    // SET_FIELD keeps a masked typed OXM raw (§7.2.5); a match keeps it typed.
    let raw = !o.is_typed() || (set_field && o.has_mask());
    assert_eq!(raw, matches!(want, Oxm::Raw(_)));
    if !set_field {
        assert_eq!(&o.to_oxm().expect("checked OXM decodes"), want);
    }
    let v4 = |v: &Ipv4Addr, m: &Option<Ipv4Addr>| (v.octets(), m.map(|m| m.octets()));
    let typed = match want {
        Oxm::Ipv4Src { value, mask } => o.basic::<4>(ofb::IPV4_SRC) == Some(v4(value, mask)),
        Oxm::Ipv4Dst { value, mask } => o.basic::<4>(ofb::IPV4_DST) == Some(v4(value, mask)),
        Oxm::EthSrc { value, mask } => o.basic::<6>(ofb::ETH_SRC) == Some((*value, *mask)),
        Oxm::EthDst { value, mask } => o.basic::<6>(ofb::ETH_DST) == Some((*value, *mask)),
        Oxm::InPort(p) => o.basic::<4>(ofb::IN_PORT) == Some((p.to_be_bytes(), None)),
        Oxm::EthType(t) => o.basic::<2>(ofb::ETH_TYPE) == Some((t.to_be_bytes(), None)),
        Oxm::IpProto(p) => o.basic::<1>(ofb::IP_PROTO) == Some(([*p], None)),
        Oxm::TcpSrc(p) => o.basic::<2>(ofb::TCP_SRC) == Some((p.to_be_bytes(), None)),
        Oxm::TcpDst(p) => o.basic::<2>(ofb::TCP_DST) == Some((p.to_be_bytes(), None)),
        // A TLV `decode` keeps raw in a match has no typed value.
        Oxm::Raw(_) if !set_field => {
            o.basic::<4>(o.field()).is_none() && o.basic::<6>(o.field()).is_none()
        }
        _ => true,
    };
    assert!(typed, "typed accessor disagrees with {want:?}");
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
