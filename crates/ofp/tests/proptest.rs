//! Property tests: decode(encode(m)) == m for generated messages, encode(decode(b)) == b
//! for what we encoded, and the framer is independent of how a stream is chunked.

#![allow(clippy::unwrap_used)]

use std::net::{Ipv4Addr, Ipv6Addr};

use bytes::{Bytes, BytesMut};
use ofp::errmsg::ErrorKind;
use ofp::*;
use proptest::collection::vec;
use proptest::prelude::*;

fn bytes_len(range: std::ops::Range<usize>) -> impl Strategy<Value = Bytes> {
    vec(any::<u8>(), range).prop_map(Bytes::from)
}
/// Bytes whose length is `k (mod 8)`.
fn bytes_mod8(k: usize, max8: usize) -> impl Strategy<Value = Bytes> {
    (0..max8).prop_flat_map(move |n| bytes_len(n * 8 + k..n * 8 + k + 1))
}
fn mac() -> impl Strategy<Value = [u8; 6]> {
    any::<[u8; 6]>()
}
fn v4() -> impl Strategy<Value = Ipv4Addr> {
    any::<u32>().prop_map(Ipv4Addr::from)
}
fn v6() -> impl Strategy<Value = Ipv6Addr> {
    any::<u128>().prop_map(Ipv6Addr::from)
}

fn arb_oxm_unmasked() -> impl Strategy<Value = Oxm> {
    prop_oneof![
        any::<u32>().prop_map(Oxm::InPort),
        any::<u32>().prop_map(Oxm::InPhyPort),
        any::<u64>().prop_map(Oxm::metadata),
        mac().prop_map(Oxm::eth_dst),
        mac().prop_map(Oxm::eth_src),
        any::<u16>().prop_map(Oxm::EthType),
        any::<u16>().prop_map(|v| Oxm::VlanVid {
            value: v,
            mask: None
        }),
        any::<u8>().prop_map(Oxm::VlanPcp),
        any::<u8>().prop_map(Oxm::IpDscp),
        any::<u8>().prop_map(Oxm::IpEcn),
        any::<u8>().prop_map(Oxm::IpProto),
        v4().prop_map(Oxm::ipv4_src),
        v4().prop_map(Oxm::ipv4_dst),
        any::<u16>().prop_map(Oxm::TcpSrc),
        any::<u16>().prop_map(Oxm::TcpDst),
        any::<u16>().prop_map(Oxm::UdpSrc),
        any::<u16>().prop_map(Oxm::UdpDst),
        any::<u16>().prop_map(Oxm::SctpSrc),
        any::<u16>().prop_map(Oxm::SctpDst),
        any::<u8>().prop_map(Oxm::Icmpv4Type),
        any::<u8>().prop_map(Oxm::Icmpv4Code),
        any::<u16>().prop_map(Oxm::ArpOp),
        v4().prop_map(Oxm::arp_spa),
        v4().prop_map(Oxm::arp_tpa),
        mac().prop_map(|m| Oxm::ArpSha {
            value: m,
            mask: None
        }),
        mac().prop_map(|m| Oxm::ArpTha {
            value: m,
            mask: None
        }),
        v6().prop_map(Oxm::ipv6_src),
        v6().prop_map(Oxm::ipv6_dst),
        any::<u32>().prop_map(|v| Oxm::Ipv6Flabel {
            value: v,
            mask: None
        }),
        any::<u8>().prop_map(Oxm::Icmpv6Type),
        any::<u8>().prop_map(Oxm::Icmpv6Code),
        v6().prop_map(Oxm::Ipv6NdTarget),
        mac().prop_map(Oxm::Ipv6NdSll),
        mac().prop_map(Oxm::Ipv6NdTll),
        any::<u32>().prop_map(Oxm::MplsLabel),
        any::<u8>().prop_map(Oxm::MplsTc),
        any::<u8>().prop_map(Oxm::MplsBos),
        (0u32..0x0100_0000).prop_map(|v| Oxm::PbbIsid {
            value: v,
            mask: None
        }),
        any::<u64>().prop_map(Oxm::tunnel_id),
        any::<u16>().prop_map(|v| Oxm::Ipv6Exthdr {
            value: v,
            mask: None
        }),
        // Nicira NXM_NX_* (class 0x0001) and experimenter (0xffff) stay opaque.
        (
            prop_oneof![Just(0u16), Just(1u16), Just(0xffffu16), 2u16..0x7fff],
            0u8..128,
            bytes_len(0..24)
        )
            .prop_map(|(class, field, payload)| Oxm::Raw(RawOxm {
                class,
                field,
                hasmask: false,
                payload
            })),
    ]
}

fn arb_oxm() -> impl Strategy<Value = Oxm> {
    prop_oneof![
        3 => arb_oxm_unmasked(),
        1 => (any::<u64>(), any::<u64>()).prop_map(|(v, m)| Oxm::Metadata { value: v, mask: Some(m) }),
        1 => (mac(), mac()).prop_map(|(v, m)| Oxm::EthDst { value: v, mask: Some(m) }),
        1 => (v4(), v4()).prop_map(|(v, m)| Oxm::Ipv4Src { value: v, mask: Some(m) }),
        1 => (v6(), v6()).prop_map(|(v, m)| Oxm::Ipv6Dst { value: v, mask: Some(m) }),
        1 => (any::<u16>(), any::<u16>()).prop_map(|(v, m)| Oxm::VlanVid { value: v, mask: Some(m) }),
        1 => (0u32..0x0100_0000, 0u32..0x0100_0000).prop_map(|(v, m)| Oxm::PbbIsid { value: v, mask: Some(m) }),
        1 => (0u8..128, bytes_len(0..16)).prop_map(|(field, payload)| Oxm::Raw(RawOxm { class: 1, field, hasmask: true, payload })),
    ]
}

fn arb_match() -> impl Strategy<Value = Match> {
    vec(arb_oxm(), 0..12).prop_map(|v| v.into_iter().collect())
}

fn arb_action() -> impl Strategy<Value = Action> {
    prop_oneof![
        (any::<u32>(), any::<u16>()).prop_map(|(port, max_len)| Action::Output { port, max_len }),
        Just(Action::CopyTtlOut),
        Just(Action::CopyTtlIn),
        any::<u8>().prop_map(Action::SetMplsTtl),
        Just(Action::DecMplsTtl),
        any::<u16>().prop_map(Action::PushVlan),
        Just(Action::PopVlan),
        any::<u16>().prop_map(Action::PushMpls),
        any::<u16>().prop_map(Action::PopMpls),
        any::<u32>().prop_map(Action::SetQueue),
        any::<u32>().prop_map(Action::Group),
        any::<u8>().prop_map(Action::SetNwTtl),
        Just(Action::DecNwTtl),
        arb_oxm_unmasked().prop_map(Action::SetField),
        any::<u16>().prop_map(Action::PushPbb),
        Just(Action::PopPbb),
        (any::<u32>(), bytes_mod8(0, 4))
            .prop_map(|(experimenter, data)| Action::Experimenter { experimenter, data }),
        (28u16..0xfffe, bytes_mod8(4, 3)).prop_map(|(typ, data)| Action::Unknown { typ, data }),
    ]
}

fn arb_actions() -> impl Strategy<Value = Actions> {
    vec(arb_action(), 0..7).prop_map(|v| v.into_iter().collect())
}

fn arb_instruction() -> impl Strategy<Value = Instruction> {
    prop_oneof![
        any::<u8>().prop_map(Instruction::GotoTable),
        (any::<u64>(), any::<u64>())
            .prop_map(|(metadata, mask)| Instruction::WriteMetadata { metadata, mask }),
        arb_actions().prop_map(Instruction::WriteActions),
        arb_actions().prop_map(Instruction::ApplyActions),
        Just(Instruction::ClearActions),
        any::<u32>().prop_map(Instruction::Meter),
        (any::<u32>(), bytes_mod8(0, 3))
            .prop_map(|(experimenter, data)| Instruction::Experimenter { experimenter, data }),
    ]
}

fn arb_instructions() -> impl Strategy<Value = Instructions> {
    vec(arb_instruction(), 0..4).prop_map(|v| v.into_iter().collect())
}

prop_compose! {
    fn arb_flow_mod()(cookie in any::<u64>(), cookie_mask in any::<u64>(), table_id in any::<u8>(), command in any::<u8>(),
        idle in any::<u16>(), hard in any::<u16>(), priority in any::<u16>(), buffer_id in any::<u32>(),
        out_port in any::<u32>(), out_group in any::<u32>(), flags in any::<u16>(), m in arb_match(),
        ins in arb_instructions()) -> FlowMod {
        FlowMod { cookie, cookie_mask, table_id, command: FlowModCommand::from_raw(command), idle_timeout: idle,
            hard_timeout: hard, priority, buffer_id, out_port, out_group, flags: FlowModFlags(flags), match_: m,
            instructions: ins }
    }
}

prop_compose! {
    fn arb_flow_stats()(table_id in any::<u8>(), ds in any::<u32>(), dn in any::<u32>(), priority in any::<u16>(),
        idle in any::<u16>(), hard in any::<u16>(), flags in any::<u16>(), cookie in any::<u64>(), pc in any::<u64>(),
        bc in any::<u64>(), m in arb_match(), ins in arb_instructions()) -> FlowStats {
        FlowStats { table_id, duration_sec: ds, duration_nsec: dn, priority, idle_timeout: idle, hard_timeout: hard,
            flags: FlowModFlags(flags), cookie, packet_count: pc, byte_count: bc, match_: m, instructions: ins }
    }
}

fn arb_band() -> impl Strategy<Value = MeterBand> {
    prop_oneof![
        (any::<u32>(), any::<u32>())
            .prop_map(|(rate, burst_size)| MeterBand::Drop { rate, burst_size }),
        (any::<u32>(), any::<u32>(), any::<u8>()).prop_map(|(rate, burst_size, prec_level)| {
            MeterBand::DscpRemark {
                rate,
                burst_size,
                prec_level,
            }
        }),
        (any::<u32>(), any::<u32>(), any::<u32>(), bytes_len(0..16)).prop_map(
            |(rate, burst_size, experimenter, data)| {
                MeterBand::Experimenter {
                    rate,
                    burst_size,
                    experimenter,
                    data,
                }
            }
        ),
    ]
}

fn arb_error() -> impl Strategy<Value = ErrorMsg> {
    prop_oneof![
        (0u16..20, any::<u16>(), bytes_len(0..80)).prop_map(|(t, c, data)| ErrorMsg {
            kind: ErrorKind::from_type_code(t, c),
            data
        }),
        (any::<u16>(), any::<u32>(), bytes_len(0..80)).prop_map(
            |(exp_type, experimenter, data)| ErrorMsg {
                kind: ErrorKind::Experimenter {
                    exp_type,
                    experimenter
                },
                data
            }
        ),
    ]
}

fn arb_hello() -> impl Strategy<Value = Hello> {
    let el = prop_oneof![
        vec(any::<u32>(), 0..4).prop_map(HelloElement::VersionBitmap),
        (2u16..100, bytes_len(0..12)).prop_map(|(typ, data)| HelloElement::Unknown { typ, data }),
    ];
    vec(el, 0..3).prop_map(|elements| Hello { elements })
}

fn arb_message() -> impl Strategy<Value = Message> {
    prop_oneof![
        arb_flow_mod().prop_map(Message::FlowMod),
        arb_packet_in(),
        (any::<u32>(), any::<u32>(), arb_actions(), bytes_len(0..200)).prop_map(
            |(buffer_id, in_port, actions, data)| Message::PacketOut(PacketOut {
                buffer_id,
                in_port,
                actions,
                data
            })
        ),
        arb_flow_removed(arb_match()),
        (
            any::<u16>(),
            any::<u8>(),
            any::<u32>(),
            vec(
                (any::<u16>(), any::<u32>(), any::<u32>(), arb_actions()),
                0..4
            )
        )
            .prop_map(|(cmd, t, group_id, b)| Message::GroupMod(GroupMod {
                command: GroupModCommand::from_raw(cmd),
                group_type: GroupType::from_raw(t),
                group_id,
                buckets: b
                    .into_iter()
                    .map(|(weight, watch_port, watch_group, actions)| Bucket {
                        weight,
                        watch_port,
                        watch_group,
                        actions
                    })
                    .collect()
            })),
        (
            any::<u16>(),
            any::<u16>(),
            any::<u32>(),
            vec(arb_band(), 0..4)
        )
            .prop_map(|(c, f, meter_id, bands)| {
                Message::MeterMod(MeterMod {
                    command: MeterModCommand::from_raw(c),
                    flags: MeterFlags(f),
                    meter_id,
                    bands,
                })
            }),
        (any::<u32>(), any::<u64>()).prop_map(|(r, g)| Message::RoleRequest(RoleMsg {
            role: ControllerRole::from_raw(r),
            generation_id: g
        })),
        (
            any::<u16>(),
            any::<u8>(),
            any::<[u32; 2]>(),
            any::<[u64; 2]>(),
            arb_match()
        )
            .prop_map(|(flags, table_id, p, c, match_)| {
                Message::MultipartRequest(MultipartRequest {
                    flags,
                    body: MultipartRequestBody::Flow(FlowStatsRequest {
                        table_id,
                        out_port: p[0],
                        out_group: p[1],
                        cookie: c[0],
                        cookie_mask: c[1],
                        match_,
                    }),
                })
            }),
        (any::<u16>(), vec(arb_flow_stats(), 0..4)).prop_map(|(flags, v)| Message::MultipartReply(
            MultipartReply {
                flags,
                body: MultipartReplyBody::Flow(v)
            }
        )),
        arb_error().prop_map(Message::Error),
        arb_hello().prop_map(Message::Hello),
        bytes_len(0..64).prop_map(Message::EchoRequest),
        Just(Message::BarrierRequest),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn decode_encode_roundtrip(xid in any::<u32>(), msg in arb_message()) {
        let mut out = BytesMut::new();
        encode(xid, &msg, &mut out).expect("encode");
        let bytes = out.freeze();
        let (x2, m2) = decode(bytes.clone()).expect("decode");
        prop_assert_eq!(x2, xid);
        prop_assert_eq!(&m2, &msg);
        let mut again = BytesMut::new();
        encode(x2, &m2, &mut again).expect("re-encode");
        prop_assert_eq!(&again[..], &bytes[..]);
    }

    /// The fixed fields' bytes (what connection rules are written with) are the owned
    /// FLOW_MOD's bytes 8..48, whatever the fields; the FLOW_MOD rebuilt from them is the
    /// same.
    #[test]
    fn flow_mod_fixed_bytes_are_the_flow_mod_s(xid in any::<u32>(), fm in arb_flow_mod()) {
        let mut a = BytesMut::new();
        encode(xid, &Message::FlowMod(fm.clone()), &mut a).expect("encode");
        prop_assert_eq!(a.get(8..48), Some(&fm.fixed().to_bytes()[..]));
        let rebuilt = FlowMod::from_fixed(fm.fixed(), fm.match_.clone(), fm.instructions.clone());
        prop_assert_eq!(rebuilt, fm);
    }

    #[test]
    fn framer_is_independent_of_chunking(msgs in vec((any::<u32>(), arb_message()), 1..6), cuts in vec(1usize..200, 1..20)) {
        let mut stream = BytesMut::new();
        let mut lens = Vec::new();
        for (xid, m) in &msgs {
            let before = stream.len();
            encode(*xid, m, &mut stream).expect("encode");
            lens.push(stream.len() - before);
        }
        let stream = stream.freeze();
        let mut framer = Framer::new();
        let mut buf = BytesMut::new();
        let mut got = Vec::new();
        let mut pos = 0;
        let mut i = 0;
        while pos < stream.len() {
            let n = cuts[i % cuts.len()].min(stream.len() - pos);
            i += 1;
            buf.extend_from_slice(&stream[pos..pos + n]);
            pos += n;
            while let Some(f) = framer.next_frame(&mut buf).expect("frame") {
                got.push(f);
            }
        }
        prop_assert!(buf.is_empty());
        prop_assert_eq!(got.iter().map(|f| f.len()).collect::<Vec<_>>(), lens);
        for (f, (xid, m)) in got.into_iter().zip(&msgs) {
            prop_assert_eq!(decode(f).expect("decode"), (*xid, m.clone()));
        }
    }
}

/// Basic-class TLVs of any field, mask bit and length: typed by `decode` or kept raw.
fn arb_odd_raw_oxm() -> impl Strategy<Value = RawOxm> {
    (0u8..45, any::<bool>(), bytes_len(0..20)).prop_map(|(field, hasmask, payload)| RawOxm {
        class: 0x8000,
        field,
        hasmask,
        payload,
    })
}
fn arb_odd_oxm() -> impl Strategy<Value = Oxm> {
    arb_odd_raw_oxm().prop_map(Oxm::Raw)
}

/// Actions and instructions of known types written as raw TLVs of any length that is a
/// multiple of 8: each is either what `decode` expects or a wrong length.
fn arb_odd_action() -> impl Strategy<Value = Action> {
    prop_oneof![
        arb_action(),
        (0u16..30, bytes_mod8(4, 3)).prop_map(|(typ, data)| Action::Unknown { typ, data }),
        arb_odd_oxm().prop_map(Action::SetField),
        // SET_FIELD padded beyond the next multiple of 8, or not: `extra` 8-byte blocks.
        (arb_odd_raw_oxm(), 0usize..3).prop_map(|(r, extra)| {
            let mut data = vec![
                0x80,
                0x00,
                (r.field << 1) | u8::from(r.hasmask),
                r.payload.len() as u8,
            ];
            data.extend_from_slice(&r.payload);
            data.resize((4 + data.len()).div_ceil(8) * 8 - 4 + 8 * extra, 0);
            Action::Unknown {
                typ: 25,
                data: data.into(),
            }
        }),
    ]
}

fn arb_odd_flow_mod() -> impl Strategy<Value = Message> {
    let ins = prop_oneof![
        arb_instruction(),
        vec(arb_odd_action(), 0..5)
            .prop_map(|a| Instruction::ApplyActions(a.into_iter().collect())),
        (0u16..8, bytes_mod8(4, 4)).prop_map(|(typ, data)| Instruction::Unknown { typ, data }),
    ];
    (
        arb_flow_mod(),
        vec(prop_oneof![arb_oxm(), arb_odd_oxm()], 0..10),
        vec(ins, 0..4),
    )
        .prop_map(|(fm, fields, ins)| {
            Message::FlowMod(FlowMod {
                match_: fields.into_iter().collect(),
                instructions: ins.into_iter().collect(),
                ..fm
            })
        })
}

fn arb_odd_packet_out() -> impl Strategy<Value = Message> {
    (any::<u32>(), vec(arb_odd_action(), 0..5), bytes_len(0..60)).prop_map(
        |(in_port, actions, data)| {
            Message::PacketOut(PacketOut {
                buffer_id: NO_BUFFER,
                in_port,
                actions: actions.into_iter().collect(),
                data,
            })
        },
    )
}

/// A FLOW_REMOVED with a match from `match_`.
fn arb_flow_removed(match_: impl Strategy<Value = Match>) -> impl Strategy<Value = Message> {
    (
        any::<[u64; 3]>(),
        any::<u16>(),
        any::<u8>(),
        any::<u8>(),
        any::<[u32; 2]>(),
        any::<[u16; 2]>(),
        match_,
    )
        .prop_map(|(c, priority, reason, table_id, d, t, match_)| {
            Message::FlowRemoved(FlowRemoved {
                cookie: c[0],
                priority,
                reason: FlowRemovedReason::from_raw(reason),
                table_id,
                duration_sec: d[0],
                duration_nsec: d[1],
                idle_timeout: t[0],
                hard_timeout: t[1],
                packet_count: c[1],
                byte_count: c[2],
                match_,
            })
        })
}

fn arb_packet_in() -> impl Strategy<Value = Message> {
    (
        any::<u32>(),
        any::<u16>(),
        any::<u8>(),
        any::<u8>(),
        any::<u64>(),
        arb_match(),
        bytes_len(0..200),
    )
        .prop_map(
            |(buffer_id, total_len, reason, table_id, cookie, match_, data)| {
                Message::PacketIn(PacketIn {
                    buffer_id,
                    total_len,
                    reason: PacketInReason::from_raw(reason),
                    table_id,
                    cookie,
                    match_,
                    data,
                })
            },
        )
}

fn arb_viewed() -> impl Strategy<Value = Message> {
    prop_oneof![
        arb_flow_removed(
            vec(prop_oneof![arb_oxm(), arb_odd_oxm()], 0..8).prop_map(|f| f.into_iter().collect())
        ),
        arb_flow_mod().prop_map(Message::FlowMod),
        arb_packet_in(),
        (any::<u32>(), any::<u32>(), arb_actions(), bytes_len(0..100)).prop_map(
            |(buffer_id, in_port, actions, data)| Message::PacketOut(PacketOut {
                buffer_id,
                in_port,
                actions,
                data
            })
        ),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// The borrowed views of an encoded FLOW_MOD, PACKET_OUT, FLOW_REMOVED or PACKET_IN yield exactly what `decode`
    /// yields (`fuzzing::view_target` compares every field, TLV and accessor).
    #[test]
    fn views_yield_what_decode_yields(xid in any::<u32>(), msg in arb_viewed()) {
        let mut out = BytesMut::new();
        encode(xid, &msg, &mut out).expect("encode");
        match &msg {
            Message::FlowMod(_) => prop_assert!(FlowModView::new(&out).is_ok()),
            Message::FlowRemoved(_) => prop_assert!(FlowRemovedView::new(&out).is_ok()),
            Message::PacketIn(_) => prop_assert!(PacketInView::new(&out).is_ok()),
            _ => prop_assert!(PacketOutView::new(&out).is_ok()),
        }
        ofp::fuzzing::view_target(&out);
    }

    /// Damaged frames (TLVs of known types with wrong lengths, OXMs of any length, random
    /// bytes, cut or extended frames): the views never panic and fail exactly when
    /// `decode` fails, with the same error, and otherwise agree with it. Byte 1 (the type)
    /// is kept; the length field is fixed up or not.
    #[test]
    fn views_fail_exactly_when_decode_fails(
        xid in any::<u32>(),
        msg in prop_oneof![arb_viewed(), arb_odd_flow_mod(), arb_odd_packet_out()],
        edits in vec((any::<usize>(), any::<u8>()), 0..3),
        resize in prop_oneof![Just(None), (0usize..400).prop_map(Some)],
        fix_length in any::<bool>(),
    ) {
        let mut out = BytesMut::new();
        encode(xid, &msg, &mut out).expect("encode");
        let mut frame = out.to_vec();
        for (at, b) in edits {
            let at = 2 + at % (frame.len() - 2);
            frame[at] = b;
        }
        if let Some(n) = resize {
            frame.resize(n.max(2), 0);
        }
        if fix_length && frame.len() >= 4 && frame.len() <= 0xffff {
            let n = (frame.len() as u16).to_be_bytes();
            frame[2..4].copy_from_slice(&n);
        }
        ofp::fuzzing::view_target(&frame);
    }

    /// Arbitrary bodies behind a FLOW_MOD, PACKET_OUT, FLOW_REMOVED or PACKET_IN header of
    /// the right length.
    #[test]
    fn views_never_panic_on_arbitrary_bodies(typ in prop_oneof![Just(13u8), Just(14u8), Just(11u8), Just(10u8)], body in vec(any::<u8>(), 0..200)) {
        let mut frame = vec![OFP_VERSION, typ, 0, 0, 0, 0, 0, 1];
        frame.extend_from_slice(&body);
        let n = (frame.len() as u16).to_be_bytes();
        frame[2..4].copy_from_slice(&n);
        ofp::fuzzing::view_target(&frame);
    }
}

#[test]
fn framer_rejects_short_length_and_waits_for_bytes() {
    let mut f = Framer::new();
    let mut b = BytesMut::from(&[4u8, 0, 0, 7, 0, 0, 0, 1][..]);
    assert_eq!(f.next_frame(&mut b), Err(FrameError::BadLength(7)));
    // A header announcing 65,535 bytes reserves nothing up front.
    let mut b = BytesMut::from(&[4u8, 0, 0xff, 0xff, 0, 0, 0, 1][..]);
    let cap = b.capacity();
    assert_eq!(f.next_frame(&mut b), Ok(None));
    assert_eq!(b.capacity(), cap);
    // In place: the same answers, and nothing taken.
    assert_eq!(
        f.frame_len(&[4, 0, 0, 7, 0, 0, 0, 1]),
        Err(FrameError::BadLength(7))
    );
    assert_eq!(f.frame_len(&b), Ok(None));
    assert_eq!(f.frame_len(&[4, 0, 0, 8, 0, 0]), Ok(None));
    assert_eq!(f.frame_len(&[4, 0, 0, 8, 0, 0, 0, 1, 4]), Ok(Some(8)));
}

#[test]
fn match_prerequisites() {
    let ip = Ipv4Addr::new(10, 0, 0, 1);
    assert!(matches!(
        Match::build([Oxm::ipv4_src(ip)]),
        Err(MatchError::MissingPrerequisite {
            field: "ipv4_src",
            ..
        })
    ));
    assert!(Match::build([Oxm::EthType(0x0800), Oxm::ipv4_src(ip)]).is_ok());
    assert!(matches!(
        Match::build([Oxm::EthType(0x0800), Oxm::TcpDst(80)]),
        Err(MatchError::MissingPrerequisite {
            field: "tcp_dst",
            ..
        })
    ));
    assert!(Match::build([Oxm::EthType(0x0800), Oxm::IpProto(6), Oxm::TcpDst(80)]).is_ok());
    assert!(Match::build([Oxm::EthType(0x0800), Oxm::IpProto(17), Oxm::TcpDst(80)]).is_err());
    assert!(
        Match::build([
            Oxm::EthType(0x86dd),
            Oxm::IpProto(58),
            Oxm::Icmpv6Type(135),
            Oxm::Ipv6NdSll([1; 6])
        ])
        .is_ok()
    );
    assert!(
        Match::build([
            Oxm::EthType(0x86dd),
            Oxm::IpProto(58),
            Oxm::Icmpv6Type(136),
            Oxm::Ipv6NdSll([1; 6])
        ])
        .is_err()
    );
    assert!(Match::build([Oxm::EthType(0x0806), Oxm::ArpOp(1)]).is_ok());
    assert_eq!(
        Match::build([Oxm::EthType(1), Oxm::EthType(2)]),
        Err(MatchError::Duplicate("eth_type"))
    );
    assert_eq!(
        Match::build([Oxm::VlanPcp(3)]).map(|_| ()).unwrap_err(),
        MatchError::MissingPrerequisite {
            field: "vlan_pcp",
            needs: "vlan_vid != OFPVID_NONE"
        }
    );
    assert!(Match::build([Oxm::vlan(10), Oxm::VlanPcp(3)]).is_ok());
    assert_eq!(
        Match::build([
            Oxm::EthType(0x0800),
            Oxm::Ipv4Src {
                value: Ipv4Addr::new(10, 0, 0, 1),
                mask: Some(Ipv4Addr::new(255, 0, 0, 0))
            }
        ]),
        Err(MatchError::BadWildcards("ipv4_src"))
    );
}

#[test]
fn masked_set_field_is_never_encoded() {
    let po = PacketOut {
        buffer_id: NO_BUFFER,
        in_port: port::CONTROLLER,
        actions: [Action::SetField(Oxm::Ipv4Dst {
            value: Ipv4Addr::new(1, 2, 3, 4),
            mask: Some(Ipv4Addr::BROADCAST),
        })]
        .into_iter()
        .collect(),
        data: Bytes::new(),
    };
    let mut out = BytesMut::new();
    assert_eq!(encode(1, &po, &mut out), Err(EncodeError::MaskedSetField));
    assert!(out.is_empty());
    // The constructor drops the mask.
    let a = Action::set_field(Oxm::Ipv4Dst {
        value: Ipv4Addr::new(1, 2, 3, 4),
        mask: Some(Ipv4Addr::BROADCAST),
    });
    assert_eq!(
        a,
        Action::SetField(Oxm::ipv4_dst(Ipv4Addr::new(1, 2, 3, 4)))
    );
    assert_eq!(
        Action::output(port::CONTROLLER),
        Action::Output {
            port: port::CONTROLLER,
            max_len: 0xffff
        }
    );
}

#[test]
fn negotiation_and_reassembly() {
    assert_eq!(negotiate_version(4, &Hello::ours()), Ok(4));
    assert_eq!(negotiate_version(6, &Hello::default()), Ok(4));
    let e = negotiate_version(1, &Hello::default()).unwrap_err();
    assert_eq!(
        e.kind,
        ErrorKind::HelloFailed(errmsg::HelloFailedCode::Incompatible)
    );
    let only10 = Hello {
        elements: vec![HelloElement::VersionBitmap(vec![1 << 1])],
    };
    assert!(negotiate_version(6, &only10).is_err());
    // Decoding a HELLO of another version works (for negotiation), anything else is BadVersion.
    assert!(matches!(
        decode(Bytes::from_static(&[1, 0, 0, 8, 0, 0, 0, 1])),
        Ok((1, Message::Hello(_)))
    ));
    assert_eq!(
        decode(Bytes::from_static(&[1, 2, 0, 8, 0, 0, 0, 1])),
        Err(DecodeError::BadVersion(1))
    );
    assert_eq!(
        decode(Bytes::from_static(&[4, 99, 0, 8, 0, 0, 0, 1])),
        Err(DecodeError::UnknownType(99))
    );

    let part = |more: bool, n: u32| MultipartReply {
        flags: if more { MULTIPART_MORE } else { 0 },
        body: MultipartReplyBody::PortDesc(vec![PortDesc {
            port_no: n,
            ..PortDesc::default()
        }]),
    };
    let mut asm = MultipartAssembler::new(16);
    assert_eq!(asm.push(9, part(true, 1)), Ok(None));
    assert_eq!(asm.push(9, part(true, 2)), Ok(None));
    let done = asm.push(9, part(false, 3)).expect("ok").expect("complete");
    assert!(!done.more());
    let MultipartReplyBody::PortDesc(v) = done.body else {
        panic!()
    };
    assert_eq!(
        v.iter().map(|p| p.port_no).collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
    assert_eq!(asm.pending(), 0);
}

#[test]
fn too_long_is_an_error_and_appends_nothing() {
    let mut out = BytesMut::from(&b"xy"[..]);
    let r = encode(
        1,
        &Message::EchoRequest(Bytes::from(vec![0u8; 70_000])),
        &mut out,
    );
    assert!(matches!(r, Err(EncodeError::TooLong(_))));
    assert_eq!(&out[..], b"xy");
}
