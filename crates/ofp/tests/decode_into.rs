//! `decode_into` reads what `decode` reads, whatever the slot held before: a PACKET_IN
//! decoded in place over an earlier one keeps nothing of it.

#![allow(clippy::unwrap_used)]

use std::net::Ipv4Addr;

use bytes::{Bytes, BytesMut};
use ofp::*;
use proptest::collection::vec;
use proptest::prelude::*;

fn arb_match() -> impl Strategy<Value = Match> {
    (
        any::<u32>(),
        proptest::option::of(any::<u32>()),
        proptest::option::of(any::<[u8; 6]>()),
        proptest::option::of(any::<u64>()),
    )
        .prop_map(|(port, src, eth, meta)| {
            let mut m = Match::new().with(Oxm::InPort(port));
            if let Some(e) = eth {
                m.push(Oxm::eth_src(e));
            }
            if let Some(s) = src {
                m.push(Oxm::EthType(0x0800));
                m.push(Oxm::ipv4_src(Ipv4Addr::from(s)));
            }
            if let Some(v) = meta {
                m.push(Oxm::metadata(v));
            }
            m
        })
}

fn arb_packet_in() -> impl Strategy<Value = Message> {
    (
        any::<u32>(),
        any::<u16>(),
        any::<u8>(),
        any::<u64>(),
        arb_match(),
        vec(any::<u8>(), 0..80),
    )
        .prop_map(|(buffer_id, total_len, table_id, cookie, match_, data)| {
            Message::PacketIn(PacketIn {
                buffer_id,
                total_len,
                reason: PacketInReason::from_raw(table_id % 3),
                table_id,
                cookie,
                match_,
                data: Bytes::from(data),
            })
        })
}

fn arb_frame() -> impl Strategy<Value = Bytes> {
    prop_oneof![
        4 => (any::<u32>(), arb_packet_in()).prop_map(|(xid, m)| {
            let mut b = BytesMut::new();
            encode(xid, &m, &mut b).unwrap();
            b.freeze()
        }),
        1 => vec(any::<u8>(), 0..8).prop_map(|d| {
            let mut b = BytesMut::new();
            encode(7, &Message::EchoRequest(Bytes::from(d)), &mut b).unwrap();
            b.freeze()
        }),
        // A PACKET_IN cut short or with a byte flipped: the same error either way.
        1 => (arb_packet_in(), any::<usize>(), any::<u8>()).prop_map(|(m, at, x)| {
            let mut b = BytesMut::new();
            encode(1, &m, &mut b).unwrap();
            let at = 8 + at % (b.len() - 8);
            b[at] ^= x | 1;
            b.freeze()
        }),
    ]
}

proptest! {
    #[test]
    fn decode_into_reads_what_decode_reads(frames in vec(arb_frame(), 1..12)) {
        // One slot for the whole sequence, as a reader of a stream keeps it.
        let mut slot = Message::PacketIn(PacketIn {
            buffer_id: NO_BUFFER,
            total_len: 0,
            reason: PacketInReason::NoMatch,
            table_id: 0,
            cookie: 0,
            match_: Match::new(),
            data: Bytes::new(),
        });
        for f in frames {
            let expected = decode(f.clone());
            let got = decode_into(f, &mut slot);
            match expected {
                Ok((xid, m)) => {
                    prop_assert_eq!(got, Ok(xid));
                    prop_assert_eq!(&slot, &m);
                }
                Err(e) => prop_assert_eq!(got, Err(e)),
            }
        }
    }
}

proptest! {
    /// `view::packet_in_data` finds the data `decode` finds, in every PACKET_IN that
    /// decodes; on anything else it only ever returns a tail of the frame, or nothing.
    #[test]
    fn packet_in_data_is_decodes_data(f in arb_frame()) {
        let found = ofp::view::packet_in_data(&f);
        match decode(f.clone()) {
            Ok((_, Message::PacketIn(p))) => prop_assert_eq!(found, Some(&p.data[..])),
            Ok(_) => prop_assert_eq!(found, None),
            Err(_) => {
                if let Some(d) = found {
                    prop_assert!(f.ends_with(d));
                }
            }
        }
    }
}
