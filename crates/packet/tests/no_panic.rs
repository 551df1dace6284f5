//! parse() must return, never panic, on any input: random bytes, and every truncation
//! and corruption of valid frames.

use std::net::{Ipv4Addr, SocketAddrV4};

use flowgate_packet::*;
use proptest::prelude::*;

fn valid_frames() -> Vec<Vec<u8>> {
    let a = MacAddr([2, 0, 0, 0, 0, 1]);
    let b = MacAddr([2, 0, 0, 0, 0, 2]);
    let ip1 = Ipv4Addr::new(10, 0, 0, 1);
    let ip2 = Ipv4Addr::new(10, 0, 0, 2);
    let req = Arp {
        op: 1,
        sha: a,
        spa: ip1,
        tha: MacAddr::ZERO,
        tpa: ip2,
    };
    vec![
        arp_request(a, ip1, ip2).to_vec(),
        arp_reply(&req, b).to_vec(),
        arp_frame(a, b, Some(3), &req).to_vec(),
        lldp_probe(a, 0x1234, 7, 120, &LldpKey([1, 2])).to_vec(),
        tcp_syn(
            a,
            b,
            SocketAddrV4::new(ip1, 1),
            SocketAddrV4::new(ip2, 80),
            9,
        )
        .to_vec(),
        ipv4_tcp(&TcpSegment {
            vlan: Some(5),
            flags: TcpFlags::ACK,
            payload: b"data",
            ..TcpSegment::default()
        })
        .to_vec(),
        ipv4_udp(
            a,
            b,
            SocketAddrV4::new(ip1, 1),
            SocketAddrV4::new(ip2, 2),
            b"udp",
        )
        .to_vec(),
    ]
}

/// Exercises everything a caller would touch, including the reset builder; and checks
/// that the fast read of an IPv4 TCP segment's ports agrees with `parse` wherever
/// `parse` finds one.
fn poke(data: &[u8]) {
    let fast = ipv4_tcp_tuple(data);
    if let Ok(f) = parse(data) {
        let _ = format!("{f:?}");
        let _ = tcp_rst(&f);
        if let (Some(ip), Some(tcp)) = (f.ipv4(), f.tcp()) {
            assert_eq!(
                fast,
                Some((ip.src, ip.dst, tcp.src_port, tcp.dst_port)),
                "{data:02x?}"
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes(data in proptest::collection::vec(any::<u8>(), 0..200)) {
        poke(&data);
    }

    #[test]
    fn random_bytes_behind_real_ethertypes(
        tpid in prop_oneof![Just(None), Just(Some(ETH_TYPE_VLAN)), Just(Some(ETH_TYPE_QINQ))],
        ethertype in prop_oneof![
            Just(ETH_TYPE_ARP), Just(ETH_TYPE_IPV4), Just(ETH_TYPE_IPV6), Just(ETH_TYPE_LLDP),
            Just(ETH_TYPE_VLAN), any::<u16>()
        ],
        body in proptest::collection::vec(any::<u8>(), 0..120),
    ) {
        let mut data = vec![0u8; 12];
        if let Some(t) = tpid {
            data.extend_from_slice(&t.to_be_bytes());
            data.extend_from_slice(&[0, 1]);
        }
        data.extend_from_slice(&ethertype.to_be_bytes());
        // Make IP-looking bodies likelier to get deep.
        let mut body = body;
        if ethertype == ETH_TYPE_IPV4 && !body.is_empty() { body[0] = 0x45; }
        if ethertype == ETH_TYPE_IPV6 && !body.is_empty() { body[0] = 0x60; }
        data.extend_from_slice(&body);
        poke(&data);
    }

    #[test]
    fn truncated_and_corrupted_valid_frames(
        which in 0usize..7,
        cut in 0usize..128,
        flips in proptest::collection::vec((0usize..128, any::<u8>()), 0..4),
    ) {
        let mut data = valid_frames()[which].clone();
        for (at, v) in flips {
            if let Some(b) = data.get_mut(at) { *b ^= v; }
        }
        let cut = cut.min(data.len());
        poke(&data[..cut]);
        poke(&data);
    }
}

#[test]
fn every_prefix_of_every_builder() {
    for frame in valid_frames() {
        for cut in 0..=frame.len() {
            poke(&frame[..cut]);
        }
    }
}
