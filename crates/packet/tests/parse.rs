//! parse() against byte fixtures.

use std::net::{Ipv4Addr, Ipv6Addr};

use flowgate_packet::*;

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.split_whitespace().collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("fixture hex"))
        .collect()
}

/// An ARP request as it comes off the wire (Wireshark's arp-storm sample): 24.166.172.1
/// asks who has 24.166.173.159, with the non-zero padding some NICs leave.
const ARP_REQUEST: &str = "ffffffffffff 00070daff454 0806 0001 0800 06 04 0001
    00070daff454 18a6ac01 000000000000 18a6ad9f
    060104000000000201000302000005010301";

/// A Linux client's SYN (MSS, SACK-permitted, timestamps, window scale) from
/// 10.0.0.1:54321 to 10.0.0.100:80.
const TCP_SYN: &str = "525400123456 0242ac110002 0800
    4500003c1c46400040060a120a0000010a000064
    d43100503ade68b100000000a002faf0de570000020405b40402080a0001e2400000000001030307";

#[test]
fn captured_arp_request() {
    let data = hex(ARP_REQUEST);
    let f = parse(&data).expect("parses");
    assert_eq!(f.eth_dst, MacAddr::BROADCAST);
    assert_eq!(f.eth_src, "00:07:0d:af:f4:54".parse().expect("mac"));
    assert_eq!(f.vlan, None);
    assert_eq!(f.ethertype, ETH_TYPE_ARP);
    assert_eq!(
        f.l3,
        L3::Arp(Arp {
            op: ARP_OP_REQUEST,
            sha: MacAddr([0x00, 0x07, 0x0d, 0xaf, 0xf4, 0x54]),
            spa: Ipv4Addr::new(24, 166, 172, 1),
            tha: MacAddr::ZERO,
            tpa: Ipv4Addr::new(24, 166, 173, 159),
        })
    );
}

#[test]
fn captured_tcp_syn() {
    let data = hex(TCP_SYN);
    let f = parse(&data).expect("parses");
    assert_eq!(f.eth_dst, MacAddr([0x52, 0x54, 0, 0x12, 0x34, 0x56]));
    assert_eq!(f.ethertype, ETH_TYPE_IPV4);
    let ip = f.ipv4().expect("ipv4");
    assert_eq!(ip.src, Ipv4Addr::new(10, 0, 0, 1));
    assert_eq!(ip.dst, Ipv4Addr::new(10, 0, 0, 100));
    assert_eq!(ip.protocol, IP_PROTO_TCP);
    assert_eq!(ip.ttl, 64);
    let L4::Tcp(t) = ip.l4 else {
        panic!("not TCP: {:?}", ip.l4)
    };
    assert_eq!((t.src_port, t.dst_port), (54321, 80));
    assert_eq!(t.seq, 0x3ade_68b1);
    assert_eq!(t.flags, TcpFlags::SYN);
    assert!(t.flags.is_initial_syn());
    assert!(t.payload.is_empty(), "options are not payload");
}

#[test]
fn vlan_tagged_frames() {
    // The SYN again, with an 802.1Q tag (PCP 5, VID 100) inserted after the MACs.
    let mut data = hex(TCP_SYN);
    data.splice(12..12, [0x81, 0x00, 0xa0, 0x64]);
    let f = parse(&data).expect("parses");
    assert_eq!(f.vlan, Some(100));
    assert_eq!(f.ethertype, ETH_TYPE_IPV4);
    assert_eq!(f.tcp().map(|t| t.dst_port), Some(80));

    // Q-in-Q: 802.1ad outer VID 7, 802.1Q inner VID 100; the outer one is reported.
    let mut qinq = data.clone();
    qinq.splice(12..12, [0x88, 0xa8, 0x00, 0x07]);
    let f = parse(&qinq).expect("parses");
    assert_eq!(f.vlan, Some(7));
    assert_eq!(f.ethertype, ETH_TYPE_IPV4);
    assert!(f.tcp().is_some());

    // A tag cut short.
    assert_eq!(parse(&data[..16]), Err(ParseError::Truncated(Layer::Vlan)));
    // A tagged ARP.
    let mut arp = hex(ARP_REQUEST);
    arp.splice(12..12, [0x81, 0x00, 0x0f, 0xff]);
    let f = parse(&arp).expect("parses");
    assert_eq!((f.vlan, f.ethertype), (Some(0xfff), ETH_TYPE_ARP));
    assert!(f.arp().is_some());
}

#[test]
fn truncated_packet_in_keeps_addresses() {
    // A PACKET_IN cut at max_len: the IP total length promises more than is there.
    let data = hex(TCP_SYN);
    let f = parse(&data[..14 + 20 + 10]).expect("parses");
    let ip = f.ipv4().expect("ipv4");
    assert_eq!(ip.dst, Ipv4Addr::new(10, 0, 0, 100));
    assert_eq!(ip.l4, L4::Truncated);
    // Header complete but options cut: still truncated (data offset says 40 bytes).
    let f = parse(&data[..14 + 20 + 30]).expect("parses");
    assert_eq!(f.l4(), Some(&L4::Truncated));
    // Cut inside the IPv4 header.
    assert_eq!(
        parse(&data[..14 + 19]),
        Err(ParseError::Truncated(Layer::Ipv4))
    );
    assert_eq!(
        parse(&data[..13]),
        Err(ParseError::Truncated(Layer::Ethernet))
    );
    // Cut inside the ARP packet.
    assert_eq!(
        parse(&hex(ARP_REQUEST)[..30]),
        Err(ParseError::Truncated(Layer::Arp))
    );
}

#[test]
fn ethernet_padding_is_not_payload() {
    let seg = TcpSegment {
        flags: TcpFlags::ACK,
        payload: b"hi",
        ..TcpSegment::default()
    };
    let data = ipv4_tcp(&seg);
    assert_eq!(data.len(), ETH_MIN_FRAME_LEN, "short frame padded");
    let f = parse(&data).expect("parses");
    assert_eq!(f.tcp().map(|t| t.payload), Some(&b"hi"[..]));
}

#[test]
fn malformed_ipv4() {
    let mut data = hex(TCP_SYN);
    data[14] = 0x65; // version 6 in an IPv4 EtherType
    assert_eq!(parse(&data), Err(ParseError::Malformed(Layer::Ipv4)));
    data[14] = 0x44; // IHL 4
    assert_eq!(parse(&data), Err(ParseError::Malformed(Layer::Ipv4)));
    let mut data = hex(TCP_SYN);
    data[16..18].copy_from_slice(&10u16.to_be_bytes()); // total length < header
    assert_eq!(parse(&data), Err(ParseError::Malformed(Layer::Ipv4)));
    let mut data = hex(TCP_SYN);
    data[14 + 20 + 12] = 0x40; // TCP data offset 4
    assert!(matches!(
        parse(&data).expect("parses").l4(),
        Some(L4::Other(_))
    ));
}

#[test]
fn non_first_fragment_has_no_ports() {
    let mut data = hex(TCP_SYN);
    data[20..22].copy_from_slice(&0x0010u16.to_be_bytes()); // offset 16 * 8 bytes
    let f = parse(&data).expect("parses");
    assert!(matches!(f.l4(), Some(L4::Other(_))));
}

#[test]
fn udp_and_icmp() {
    let data = ipv4_udp(
        MacAddr([2, 0, 0, 0, 0, 1]),
        MacAddr([2, 0, 0, 0, 0, 2]),
        "10.0.0.1:5353".parse().expect("addr"),
        "10.0.0.2:53".parse().expect("addr"),
        b"query",
    );
    let f = parse(&data).expect("parses");
    assert_eq!(f.ipv4().map(|ip| ip.protocol), Some(IP_PROTO_UDP));
    assert_eq!(
        f.l4(),
        Some(&L4::Udp {
            src_port: 5353,
            dst_port: 53
        })
    );

    // ICMP echo request 10.0.0.1 -> 10.0.0.2.
    let icmp = hex("020000000002 020000000001 0800
         45000054000040004001 26a5 0a000001 0a000002
         0800f7ff00000000 00000000");
    let f = parse(&icmp).expect("parses");
    assert_eq!(f.l4(), Some(&L4::Icmp { typ: 8, code: 0 }));
}

#[test]
fn ipv6_tcp_and_icmpv6() {
    // IPv6 TCP SYN fe80::1 -> fe80::2, port 40000 -> 443, through a hop-by-hop header.
    let data = hex("333300000001 020000000001 86dd
         6000000000200000 fe800000000000000000000000000001 fe800000000000000000000000000002
         0600000000000000
         9c4001bb0000000100000000 5002ffff00000000");
    // payload_length above is 0x20 = 8 (hop-by-hop) + 20 (TCP) + 4 extra; fix it to 28.
    let mut data = data;
    data[18..20].copy_from_slice(&28u16.to_be_bytes());
    let f = parse(&data).expect("parses");
    let ip = f.ipv6().expect("ipv6");
    assert_eq!(ip.src, "fe80::1".parse::<Ipv6Addr>().expect("addr"));
    assert_eq!(ip.next_header, IP_PROTO_TCP, "extension header skipped");
    let t = f.tcp().expect("tcp");
    assert_eq!((t.src_port, t.dst_port, t.seq), (40000, 443, 1));
    assert!(t.flags.is_initial_syn());

    // ICMPv6 neighbour solicitation (type 135).
    let ns = hex("3333ff000002 020000000001 86dd
         6000000000083aff fe800000000000000000000000000001 ff0200000000000000000001ff000002
         8700000000000000");
    let f = parse(&ns).expect("parses");
    assert_eq!(f.ipv6().map(|ip| ip.next_header), Some(IP_PROTO_ICMPV6));
    assert_eq!(f.l4(), Some(&L4::Icmp { typ: 135, code: 0 }));
    assert_eq!(parse(&ns[..40]), Err(ParseError::Truncated(Layer::Ipv6)));
}

#[test]
fn foreign_lldp_is_tolerated() {
    // An LLDPDU from a Linux host running lldpd: chassis id subtype 4 (MAC), port id
    // subtype 3 (MAC), TTL 120, system name, end.
    let data = hex("0180c200000e 525400aabbcc 88cc
         0207 04525400aabbcc
         0407 03525400aabbcc
         0602 0078
         0a04 686f7374
         0000");
    let f = parse(&data).expect("parses");
    assert_eq!(
        f.lldp(),
        Some(&Lldp {
            chassis_dpid: None,
            port_no: None,
            ttl: 120,
            tag: None
        })
    );
    // Garbage after the EtherType still parses as an (empty) LLDP.
    let mut junk = data[..14].to_vec();
    junk.extend_from_slice(&[0xff, 0xff, 0x01]);
    assert_eq!(parse(&junk).expect("parses").lldp(), Some(&Lldp::default()));
}

#[test]
fn non_ethernet_arp_and_unknown_ethertypes_are_other() {
    let mut data = hex(ARP_REQUEST);
    data[14..16].copy_from_slice(&6u16.to_be_bytes()); // hardware type IEEE 802
    assert!(matches!(parse(&data).expect("parses").l3, L3::Other(_)));
    let mut data = hex(ARP_REQUEST);
    data[12..14].copy_from_slice(&0x88b5u16.to_be_bytes()); // local experimental
    let f = parse(&data).expect("parses");
    assert_eq!(f.ethertype, 0x88b5);
    assert_eq!(f.l3, L3::Other(&data[14..]));
}

#[test]
fn tcp_flags() {
    let f = TcpFlags::SYN | TcpFlags::ACK;
    assert!(f.syn() && f.ack() && !f.rst() && !f.fin());
    assert!(!f.is_initial_syn());
    assert!(TcpFlags::SYN.is_initial_syn());
    assert_eq!(format!("{f:?}"), "TcpFlags(SYN|ACK)");
    assert_eq!(
        TcpFlags(0x3f).0,
        (TcpFlags::FIN
            | TcpFlags::SYN
            | TcpFlags::RST
            | TcpFlags::PSH
            | TcpFlags::ACK
            | TcpFlags::URG)
            .0
    );
}
