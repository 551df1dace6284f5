//! Builders: round trips through parse(), checksums, and the RFC 9293 reset rules.

use std::net::{Ipv4Addr, SocketAddrV4};

use etherparse::{Ipv4HeaderSlice, Ipv6HeaderSlice, TcpHeaderSlice, UdpHeaderSlice};
use flowgate_packet::*;

const CLIENT_MAC: MacAddr = MacAddr([0x02, 0x00, 0x00, 0x00, 0x00, 0x01]);
const VIP_MAC: MacAddr = MacAddr([0x0e, 0x00, 0x00, 0x00, 0x00, 0x01]);
const CLIENT: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const VIP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 100);

/// RFC 1071: the one's-complement sum over a correct header, checksum included, is
/// 0xffff. An implementation independent of etherparse's.
fn ones_complement_sum(data: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    for chunk in data.chunks(2) {
        let word = u16::from_be_bytes([chunk[0], *chunk.get(1).unwrap_or(&0)]);
        sum += u32::from(word);
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

/// Checks the IPv4 header checksum and the TCP checksum (with the pseudo-header) of an
/// Ethernet/IPv4/TCP frame, both with etherparse and by hand.
fn assert_ipv4_tcp_checksums(frame: &[u8]) {
    let l3 = if frame[12..14] == [0x81, 0x00] {
        &frame[18..]
    } else {
        &frame[14..]
    };
    let ip = Ipv4HeaderSlice::from_slice(l3).expect("ipv4 header");
    assert_eq!(ip.header_checksum(), ip.to_header().calc_header_checksum());
    assert_eq!(
        ones_complement_sum(ip.slice()),
        0xffff,
        "IPv4 header checksum"
    );
    let seg = &l3[ip.slice().len()..usize::from(ip.total_len())];
    let tcp = TcpHeaderSlice::from_slice(seg).expect("tcp header");
    let payload = &seg[tcp.slice().len()..];
    assert_eq!(
        tcp.checksum(),
        tcp.calc_checksum_ipv4(&ip, payload).expect("length fits"),
        "TCP checksum (etherparse)"
    );
    let mut pseudo = Vec::new();
    pseudo.extend_from_slice(&ip.source());
    pseudo.extend_from_slice(&ip.destination());
    pseudo.extend_from_slice(&[0, IP_PROTO_TCP]);
    pseudo.extend_from_slice(&(seg.len() as u16).to_be_bytes());
    pseudo.extend_from_slice(seg);
    assert_eq!(
        ones_complement_sum(&pseudo),
        0xffff,
        "TCP checksum (RFC 1071)"
    );
}

#[test]
fn arp_reply_round_trip() {
    let req = Arp {
        op: ARP_OP_REQUEST,
        sha: CLIENT_MAC,
        spa: CLIENT,
        tha: MacAddr::ZERO,
        tpa: VIP,
    };
    let data = arp_reply(&req, VIP_MAC);
    assert_eq!(data.len(), ETH_MIN_FRAME_LEN);
    let f = parse(&data).expect("parses");
    assert_eq!((f.eth_src, f.eth_dst, f.vlan), (VIP_MAC, CLIENT_MAC, None));
    assert_eq!(
        f.arp(),
        Some(&Arp {
            op: ARP_OP_REPLY,
            sha: VIP_MAC,
            spa: VIP,
            tha: CLIENT_MAC,
            tpa: CLIENT
        })
    );
}

#[test]
fn arp_request_round_trip() {
    let data = arp_request(VIP_MAC, VIP, Ipv4Addr::new(10, 0, 1, 5));
    let f = parse(&data).expect("parses");
    assert_eq!((f.eth_src, f.eth_dst), (VIP_MAC, MacAddr::BROADCAST));
    assert_eq!(
        f.arp(),
        Some(&Arp {
            op: ARP_OP_REQUEST,
            sha: VIP_MAC,
            spa: VIP,
            tha: MacAddr::ZERO,
            tpa: Ipv4Addr::new(10, 0, 1, 5),
        })
    );
    let tagged = arp_frame(VIP_MAC, CLIENT_MAC, Some(42), f.arp().expect("arp"));
    let g = parse(&tagged).expect("parses");
    assert_eq!((g.vlan, g.arp()), (Some(42), f.arp()));
}

const KEY: LldpKey = LldpKey([0x0123_4567_89ab_cdef, 0xfedc_ba98_7654_3210]);

/// A tag names its switch, port and key: change any and it changes.
#[test]
fn lldp_tags_differ_by_switch_port_and_key() {
    let t = lldp_tag(&KEY, 1, 2);
    assert_ne!(t, lldp_tag(&KEY, 1, 3));
    assert_ne!(t, lldp_tag(&KEY, 2, 2));
    assert_ne!(t, lldp_tag(&LldpKey([1, 2]), 1, 2));
    assert_eq!(t, lldp_tag(&KEY, 1, 2));
}

#[test]
fn lldp_probe_round_trip() {
    for (dpid, port) in [
        (1u64, 1u32),
        (0x0000_0242_ac11_0002, 65534),
        (u64::MAX, u32::MAX - 1),
        (0, 0),
    ] {
        let data = lldp_probe(MacAddr([0x0e, 0, 0, 0, 0, 9]), dpid, port, 120, &KEY);
        let f = parse(&data).expect("parses");
        assert_eq!(f.eth_dst, LLDP_MULTICAST);
        assert_eq!(f.ethertype, ETH_TYPE_LLDP);
        assert_eq!(
            f.lldp(),
            Some(&Lldp {
                chassis_dpid: Some(dpid),
                port_no: Some(port),
                ttl: 120,
                tag: Some(lldp_tag(&KEY, dpid, port)),
            })
        );
    }
    // The chassis id is the Ryu/Faucet text form.
    let data = lldp_probe(VIP_MAC, 0xab, 3, 5, &KEY);
    let text = b"dpid:00000000000000ab";
    assert!(data.windows(text.len()).any(|w| w == text));
}

#[test]
fn tcp_segment_round_trip_and_checksums() {
    for vlan in [None, Some(10)] {
        for payload in [
            &b""[..],
            b"GET / HTTP/1.1\r\nHost: a\r\n\r\n",
            &[0xabu8; 1001][..],
        ] {
            let seg = TcpSegment {
                eth_src: CLIENT_MAC,
                eth_dst: VIP_MAC,
                vlan,
                ip_src: CLIENT,
                ip_dst: VIP,
                ttl: 17,
                src_port: 40000,
                dst_port: 80,
                seq: 0xffff_fff0,
                ack: 77,
                flags: TcpFlags::ACK | TcpFlags::PSH,
                window: 512,
                payload,
            };
            let data = ipv4_tcp(&seg);
            assert_ipv4_tcp_checksums(&data);
            let f = parse(&data).expect("parses");
            assert_eq!((f.eth_src, f.eth_dst, f.vlan), (CLIENT_MAC, VIP_MAC, vlan));
            let ip = f.ipv4().expect("ipv4");
            assert_eq!(
                (ip.src, ip.dst, ip.ttl, ip.protocol),
                (CLIENT, VIP, 17, IP_PROTO_TCP)
            );
            let t = f.tcp().expect("tcp");
            assert_eq!(
                *t,
                Tcp {
                    src_port: 40000,
                    dst_port: 80,
                    seq: 0xffff_fff0,
                    ack: 77,
                    flags: seg.flags,
                    payload
                }
            );
        }
    }
}

#[test]
fn tcp_syn_builder() {
    let data = tcp_syn(
        CLIENT_MAC,
        VIP_MAC,
        SocketAddrV4::new(CLIENT, 33000),
        SocketAddrV4::new(VIP, 80),
        1234,
    );
    assert_ipv4_tcp_checksums(&data);
    let t = *parse(&data).expect("parses").tcp().expect("tcp");
    assert!(t.flags.is_initial_syn());
    assert_eq!((t.src_port, t.dst_port, t.seq), (33000, 80, 1234));
}

#[test]
fn udp_checksum() {
    let data = ipv4_udp(
        CLIENT_MAC,
        VIP_MAC,
        SocketAddrV4::new(CLIENT, 1000),
        SocketAddrV4::new(VIP, 2000),
        b"abc",
    );
    let ip = Ipv4HeaderSlice::from_slice(&data[14..]).expect("ip");
    assert_eq!(ones_complement_sum(ip.slice()), 0xffff);
    let udp = UdpHeaderSlice::from_slice(&data[34..]).expect("udp");
    let expect = udp
        .to_header()
        .calc_checksum_ipv4(&ip.to_header(), b"abc")
        .expect("fits");
    assert_eq!(udp.checksum(), expect);
}

fn segment(flags: TcpFlags, seq: u32, ack: u32, payload: &[u8], vlan: Option<u16>) -> bytes::Bytes {
    ipv4_tcp(&TcpSegment {
        eth_src: CLIENT_MAC,
        eth_dst: VIP_MAC,
        vlan,
        ip_src: CLIENT,
        ip_dst: VIP,
        src_port: 40000,
        dst_port: 80,
        seq,
        ack,
        flags,
        payload,
        ..TcpSegment::default()
    })
}

/// Parses a reset and checks what every reset must have: swapped addresses and ports,
/// RST set, valid checksums, no data.
fn parse_rst(data: &[u8], vlan: Option<u16>) -> Tcp<'_> {
    assert_ipv4_tcp_checksums(data);
    let f = parse(data).expect("parses");
    assert_eq!((f.eth_src, f.eth_dst, f.vlan), (VIP_MAC, CLIENT_MAC, vlan));
    let ip = f.ipv4().expect("ipv4");
    assert_eq!((ip.src, ip.dst), (VIP, CLIENT));
    let t = *f.tcp().expect("tcp");
    assert_eq!((t.src_port, t.dst_port), (80, 40000));
    assert!(t.flags.rst());
    assert!(t.payload.is_empty());
    t
}

#[test]
fn rst_for_syn_acks_seq_plus_one() {
    // "If the ACK bit is off, <SEQ=0><ACK=SEG.SEQ+SEG.LEN><CTL=RST,ACK>"; a SYN counts 1.
    let syn = segment(TcpFlags::SYN, 1000, 0, b"", None);
    let rst = tcp_rst(&parse(&syn).expect("parses")).expect("a reset");
    let t = parse_rst(&rst, None);
    assert_eq!(
        (t.seq, t.ack, t.flags),
        (0, 1001, TcpFlags::RST | TcpFlags::ACK)
    );
}

#[test]
fn rst_for_ack_takes_seq_from_ack() {
    // "If the ACK bit is on, <SEQ=SEG.ACK><CTL=RST>".
    let seg = segment(
        TcpFlags::ACK | TcpFlags::PSH,
        5000,
        0xdead_beef,
        b"GET /",
        Some(7),
    );
    let rst = tcp_rst(&parse(&seg).expect("parses")).expect("a reset");
    let t = parse_rst(&rst, Some(7));
    assert_eq!((t.seq, t.ack, t.flags), (0xdead_beef, 0, TcpFlags::RST));
}

#[test]
fn rst_counts_data_syn_and_fin_and_wraps() {
    // Data without ACK (unusual but legal): SEG.LEN = data + SYN + FIN.
    let seg = segment(
        TcpFlags::SYN | TcpFlags::FIN,
        u32::MAX - 2,
        0,
        b"hello",
        None,
    );
    let rst = tcp_rst(&parse(&seg).expect("parses")).expect("reset");
    let t = parse_rst(&rst, None);
    assert_eq!(t.ack, (u32::MAX - 2).wrapping_add(7));
    assert_eq!(t.flags, TcpFlags::RST | TcpFlags::ACK);
    // Padding is not data: a 1-byte segment in a padded 60-byte frame.
    let seg = segment(TcpFlags::NONE, 10, 0, b"x", None);
    assert_eq!(seg.len(), ETH_MIN_FRAME_LEN);
    let rst = tcp_rst(&parse(&seg).expect("parses")).expect("reset");
    let t = parse_rst(&rst, None);
    assert_eq!(t.ack, 11);
}

#[test]
fn never_answer_a_rst_or_non_tcp() {
    for flags in [TcpFlags::RST, TcpFlags::RST | TcpFlags::ACK] {
        let seg = segment(flags, 1, 2, b"", None);
        assert_eq!(tcp_rst(&parse(&seg).expect("parses")), None);
    }
    let arp = arp_request(CLIENT_MAC, CLIENT, VIP);
    assert_eq!(tcp_rst(&parse(&arp).expect("parses")), None);
    let udp = ipv4_udp(
        CLIENT_MAC,
        VIP_MAC,
        SocketAddrV4::new(CLIENT, 1),
        SocketAddrV4::new(VIP, 2),
        b"",
    );
    assert_eq!(tcp_rst(&parse(&udp).expect("parses")), None);
    // A truncated TCP header gives no reset either.
    let syn = segment(TcpFlags::SYN, 1, 0, b"", None);
    assert_eq!(tcp_rst(&parse(&syn[..40]).expect("parses")), None);
}

/// The reset built in place is the general builder's frame, byte for byte, for every
/// kind of IPv4 segment a controller answers (tagged or not, with or without ACK, data,
/// FIN, sequence numbers that wrap), and nothing where the general one sends nothing.
#[test]
fn rst_v4_is_the_general_reset_without_allocating() {
    let mut n = 0;
    for vlan in [None, Some(7), Some(0x0fff)] {
        for flags in [
            TcpFlags::SYN,
            TcpFlags::ACK,
            TcpFlags::ACK | TcpFlags::PSH,
            TcpFlags::FIN | TcpFlags::ACK,
            TcpFlags::SYN | TcpFlags::FIN,
            TcpFlags::NONE,
            TcpFlags::RST,
            TcpFlags::RST | TcpFlags::ACK,
        ] {
            for (seq, ack) in [(0, 0), (1000, 0xdead_beef), (u32::MAX - 2, u32::MAX)] {
                for payload in [&b""[..], b"x", b"GET / HTTP/1.1"] {
                    let seg = segment(flags, seq, ack, payload, vlan);
                    let f = parse(&seg).expect("parses");
                    let general = tcp_rst(&f);
                    assert_eq!(
                        tcp_rst_v4(&f).map(|b| b.to_vec()),
                        general.as_ref().map(|b| b.to_vec()),
                        "{flags:?} seq {seq} ack {ack} vlan {vlan:?} {} bytes",
                        payload.len()
                    );
                    if let Some(rst) = general {
                        assert_ipv4_tcp_checksums(&rst);
                        n += 1;
                    }
                }
            }
        }
    }
    assert_eq!(n, 3 * 6 * 3 * 3, "every segment but the resets answered");
    // Not over IPv4: none here, the general builder's.
    let arp = arp_request(CLIENT_MAC, CLIENT, VIP);
    assert_eq!(tcp_rst_v4(&parse(&arp).expect("parses")), None);
}

#[test]
fn rst_over_ipv6() {
    // SYN [fe80::1]:40000 -> [fe80::2]:443.
    let mut syn = vec![0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 1, 0x86, 0xdd];
    syn.extend_from_slice(&[0x60, 0, 0, 0, 0, 20, IP_PROTO_TCP, 64]);
    syn.extend_from_slice(&"fe80::1".parse::<std::net::Ipv6Addr>().expect("a").octets());
    syn.extend_from_slice(&"fe80::2".parse::<std::net::Ipv6Addr>().expect("a").octets());
    syn.extend_from_slice(&[
        0x9c, 0x40, 0x01, 0xbb, 0, 0, 0, 9, 0, 0, 0, 0, 0x50, 0x02, 0xff, 0xff, 0, 0, 0, 0,
    ]);
    assert_eq!(tcp_rst_v4(&parse(&syn).expect("parses")), None, "IPv6");
    let rst = tcp_rst(&parse(&syn).expect("parses")).expect("reset");
    let f = parse(&rst).expect("parses");
    let ip = f.ipv6().expect("ipv6");
    assert_eq!(ip.src, "fe80::2".parse::<std::net::Ipv6Addr>().expect("a"));
    let t = f.tcp().expect("tcp");
    assert_eq!((t.src_port, t.dst_port, t.seq, t.ack), (443, 40000, 0, 10));
    assert_eq!(t.flags, TcpFlags::RST | TcpFlags::ACK);
    let h = Ipv6HeaderSlice::from_slice(&rst[14..]).expect("ipv6");
    let tcp = TcpHeaderSlice::from_slice(&rst[54..]).expect("tcp");
    assert_eq!(
        tcp.checksum(),
        tcp.calc_checksum_ipv6(&h, &[]).expect("fits")
    );
}
