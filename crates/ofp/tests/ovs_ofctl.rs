//! Independent decoders agree with our encoder: every kind of message the controller sends
//! is encoded and given to `ovs-ofctl ofp-print` (Open vSwitch 3.x's own parser) and to
//! tshark's `openflow_v4` dissector (through a hand-written pcap). Missing tools fail the
//! test when `CI` is set and skip it otherwise.

use std::net::Ipv4Addr;
use std::process::Command;

use bytes::{Bytes, BytesMut};
use ofp::*;

fn tool(name: &str, args: &[&str]) -> bool {
    let ok = Command::new(name)
        .args(args)
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        let msg = format!("{name} is not installed (Debian: openvswitch-common / tshark)");
        if std::env::var_os("CI").is_some() {
            panic!("{msg}; it is required in CI");
        }
        eprintln!("SKIP: {msg}");
    }
    ok
}

fn tcp_syn_frame() -> Bytes {
    let mut f = vec![2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2, 8, 0];
    f.extend_from_slice(&[
        0x45, 0, 0, 40, 0, 1, 0x40, 0, 64, 6, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
    ]);
    f.extend_from_slice(&[
        0x9c, 0x40, 0, 80, 0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x02, 0xff, 0xff, 0, 0, 0, 0,
    ]);
    f.resize(60, 0);
    Bytes::from(f)
}

/// Every kind of message the controller sends, with a label.
fn messages() -> Vec<(&'static str, Message)> {
    let ip = |a, b, c, d| Ipv4Addr::new(a, b, c, d);
    let five_tuple = Match::build([
        Oxm::InPort(1),
        Oxm::EthType(0x0800),
        Oxm::IpProto(6),
        Oxm::ipv4_src(ip(10, 0, 0, 1)),
        Oxm::ipv4_dst(ip(10, 0, 0, 100)),
        Oxm::TcpSrc(40000),
        Oxm::TcpDst(80),
    ])
    .expect("valid match");
    let nat = |port| -> Actions {
        [
            Action::set_field(Oxm::eth_dst([2, 0, 0, 0, 1, 7])),
            Action::set_field(Oxm::ipv4_dst(ip(10, 0, 1, 7))),
            Action::output(port),
        ]
        .into_iter()
        .collect()
    };
    let add = FlowMod::add(five_tuple.clone())
        .table(1)
        .priority(1000)
        .cookie(0x0300_0000_0000_0001)
        .timeouts(60, 0)
        .flags(FlowModFlags::SEND_FLOW_REM | FlowModFlags::CHECK_OVERLAP)
        .instruction(Instruction::Meter(1))
        .instruction(Instruction::ApplyActions(nat(7)))
        .instruction(Instruction::WriteMetadata {
            metadata: 0x10,
            mask: 0xff,
        })
        .instruction(Instruction::GotoTable(2));
    let to_group = FlowMod::add(
        Match::build([
            Oxm::EthType(0x0800),
            Oxm::Ipv4Dst {
                value: ip(10, 0, 0, 100),
                mask: Some(ip(255, 255, 255, 255)),
            },
        ])
        .expect("m"),
    )
    .priority(500)
    .apply([Action::Group(1)]);
    let arp_to_ctl = FlowMod::add(
        Match::build([
            Oxm::EthType(0x0806),
            Oxm::ArpOp(1),
            Oxm::arp_tpa(ip(10, 0, 0, 100)),
        ])
        .expect("m"),
    )
    .priority(2000)
    .apply([Action::output(port::CONTROLLER)]);
    let table_miss = FlowMod::add(Match::new())
        .priority(0)
        .apply([Action::output(port::CONTROLLER)]);
    let vlan = FlowMod::add(
        Match::build([
            Oxm::vlan(10),
            Oxm::VlanPcp(3),
            Oxm::EthType(0x86dd),
            Oxm::ipv6_dst("fe80::1".parse().expect("v6")),
        ])
        .expect("m"),
    )
    .apply([Action::PopVlan, Action::output(2)]);
    let modify = FlowMod {
        command: FlowModCommand::Modify,
        ..FlowMod::add(five_tuple.clone()).apply([Action::output(3)])
    };
    let delete_by_cookie =
        FlowMod::delete(Match::new()).cookie_masked(0x0200_0000_0000_0000, 0xff00_0000_0000_0000);
    let delete_strict = FlowMod::delete_strict(five_tuple.clone())
        .table(1)
        .priority(1000);
    let packet_out = PacketOut {
        buffer_id: NO_BUFFER,
        in_port: port::CONTROLLER,
        actions: nat(7),
        data: tcp_syn_frame(),
    };
    let group = GroupMod {
        command: GroupModCommand::Add,
        group_type: GroupType::Select,
        group_id: 1,
        buckets: vec![Bucket::weighted(70, nat(7)), Bucket::weighted(30, nat(8))],
    };
    let ff = GroupMod {
        command: GroupModCommand::Add,
        group_type: GroupType::FastFailover,
        group_id: 2,
        buckets: vec![
            Bucket {
                watch_port: 7,
                ..Bucket::new([Action::output(7)].into_iter().collect())
            },
            Bucket {
                watch_port: 8,
                ..Bucket::new([Action::output(8)].into_iter().collect())
            },
        ],
    };
    let meter = MeterMod {
        command: MeterModCommand::Add,
        flags: MeterFlags::PKTPS | MeterFlags::BURST | MeterFlags::STATS,
        meter_id: 1,
        bands: vec![MeterBand::Drop {
            rate: 1000,
            burst_size: 100,
        }],
    };
    let mp = |b| Message::MultipartRequest(MultipartRequest::new(b));
    use MultipartRequestBody as B;
    vec![
        ("hello", Message::Hello(Hello::ours())),
        ("features_request", Message::FeaturesRequest),
        (
            "set_config",
            Message::SetConfig(SwitchConfig {
                flags: 0,
                miss_send_len: CONTROLLER_MAX_LEN_NO_BUFFER,
            }),
        ),
        ("get_config_request", Message::GetConfigRequest),
        (
            "echo_request",
            Message::EchoRequest(Bytes::from_static(b"ping")),
        ),
        (
            "echo_reply",
            Message::EchoReply(Bytes::from_static(b"ping")),
        ),
        ("barrier_request", Message::BarrierRequest),
        ("flow_mod_add", Message::FlowMod(add)),
        ("flow_mod_add_group", Message::FlowMod(to_group)),
        ("flow_mod_add_arp", Message::FlowMod(arp_to_ctl)),
        ("flow_mod_table_miss", Message::FlowMod(table_miss)),
        ("flow_mod_vlan_ipv6", Message::FlowMod(vlan)),
        ("flow_mod_modify", Message::FlowMod(modify)),
        ("flow_mod_delete_cookie", Message::FlowMod(delete_by_cookie)),
        ("flow_mod_delete_strict", Message::FlowMod(delete_strict)),
        ("packet_out", Message::PacketOut(packet_out)),
        ("group_mod_select", Message::GroupMod(group)),
        ("group_mod_ff", Message::GroupMod(ff)),
        ("meter_mod_drop", Message::MeterMod(meter)),
        (
            "role_master",
            Message::RoleRequest(RoleMsg {
                role: ControllerRole::Master,
                generation_id: 7,
            }),
        ),
        (
            "role_slave",
            Message::RoleRequest(RoleMsg {
                role: ControllerRole::Slave,
                generation_id: 8,
            }),
        ),
        ("mp_desc", mp(B::Desc)),
        (
            "mp_flow",
            mp(B::Flow(FlowStatsRequest {
                table_id: 1,
                cookie: 0x0300_0000_0000_0000,
                cookie_mask: 0xff00_0000_0000_0000,
                ..FlowStatsRequest::default()
            })),
        ),
        (
            "mp_aggregate",
            mp(B::Aggregate(FlowStatsRequest::default())),
        ),
        ("mp_port_desc", mp(B::PortDesc)),
        ("mp_port_stats", mp(B::PortStats { port_no: port::ANY })),
        (
            "mp_meter",
            mp(B::Meter {
                meter_id: meter::ALL,
            }),
        ),
        (
            "mp_meter_config",
            mp(B::MeterConfig {
                meter_id: meter::ALL,
            }),
        ),
        (
            "mp_group",
            mp(B::Group {
                group_id: group::ALL,
            }),
        ),
        ("mp_group_desc", mp(B::GroupDesc)),
        ("mp_table", mp(B::Table)),
        (
            "set_async",
            Message::SetAsync(AsyncConfig {
                packet_in_mask: [0b111, 0],
                port_status_mask: [0b111, 0b111],
                flow_removed_mask: [0b1111, 0],
            }),
        ),
        ("get_async_request", Message::GetAsyncRequest),
    ]
}

fn encoded() -> Vec<(&'static str, Bytes)> {
    messages()
        .into_iter()
        .enumerate()
        .map(|(i, (name, m))| {
            let mut b = BytesMut::new();
            encode(100 + i as u32, &m, &mut b).unwrap_or_else(|e| panic!("{name}: {e}"));
            (name, b.freeze())
        })
        .collect()
}

#[test]
fn ovs_ofctl_ofp_print_accepts_everything_we_send() {
    if !tool("ovs-ofctl", &["--version"]) {
        return;
    }
    let mut bad = Vec::new();
    for (name, bytes) in encoded() {
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        let out = Command::new("ovs-ofctl")
            .args(["ofp-print", &hex])
            .output()
            .expect("run ovs-ofctl");
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        let lower = text.to_lowercase();
        let markers = [
            "***",
            "decode error",
            "bad",
            "truncated",
            "too short",
            "(***",
            "unknown",
        ];
        println!("--- {name}\n{}", text.trim_end());
        if !out.status.success()
            || markers.iter().any(|m| lower.contains(m))
            || !text.contains("(OF1.3)")
        {
            bad.push(format!("{name}: {}", text.trim()));
        }
    }
    assert!(bad.is_empty(), "ovs-ofctl objects to:\n{}", bad.join("\n"));
}

/// A libpcap file: Ethernet/IPv4/TCP frames from port 40000 to 6653, one message each,
/// with consecutive sequence numbers so the stream is contiguous.
fn pcap(msgs: &[(&str, Bytes)]) -> Vec<u8> {
    let mut p = Vec::new();
    p.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
    p.extend_from_slice(&2u16.to_le_bytes());
    p.extend_from_slice(&4u16.to_le_bytes());
    p.extend_from_slice(&[0; 8]);
    p.extend_from_slice(&65_535u32.to_le_bytes());
    p.extend_from_slice(&1u32.to_le_bytes()); // LINKTYPE_ETHERNET
    let mut seq = 1000u32;
    for (i, (_, m)) in msgs.iter().enumerate() {
        let mut f = vec![2, 0, 0, 0, 0, 0xa, 2, 0, 0, 0, 0, 0xb, 8, 0];
        let ip_len = (20 + 20 + m.len()) as u16;
        let mut iph = vec![0x45, 0];
        iph.extend_from_slice(&ip_len.to_be_bytes());
        iph.extend_from_slice(&[0, 1, 0x40, 0, 64, 6, 0, 0, 127, 0, 0, 1, 127, 0, 0, 2]);
        let mut sum = 0u32;
        for c in iph.chunks(2) {
            sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
        }
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        let ck = !(sum as u16);
        iph[10..12].copy_from_slice(&ck.to_be_bytes());
        f.extend_from_slice(&iph);
        f.extend_from_slice(&40000u16.to_be_bytes());
        f.extend_from_slice(&6653u16.to_be_bytes());
        f.extend_from_slice(&seq.to_be_bytes());
        f.extend_from_slice(&1u32.to_be_bytes());
        f.extend_from_slice(&[0x50, 0x18, 0xff, 0xff, 0, 0, 0, 0]); // PSH|ACK, checksum unchecked
        f.extend_from_slice(m);
        seq = seq.wrapping_add(m.len() as u32);
        p.extend_from_slice(&(i as u32 + 1).to_le_bytes());
        p.extend_from_slice(&0u32.to_le_bytes());
        p.extend_from_slice(&(f.len() as u32).to_le_bytes());
        p.extend_from_slice(&(f.len() as u32).to_le_bytes());
        p.extend_from_slice(&f);
    }
    p
}

#[test]
fn tshark_openflow_v4_dissects_everything_we_send() {
    if !tool("tshark", &["--version"]) {
        return;
    }
    let msgs = encoded();
    let path = std::env::temp_dir().join(format!("flowgate-ofp-{}.pcap", std::process::id()));
    std::fs::write(&path, pcap(&msgs)).expect("write pcap");
    let out = Command::new("tshark")
        .args(["-r"])
        .arg(&path)
        .args([
            "-d",
            "tcp.port==6653,openflow",
            "-V",
            "-o",
            "tcp.desegment_tcp_streams:TRUE",
        ])
        .output()
        .expect("run tshark");
    let _ = std::fs::remove_file(&path);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "tshark failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let frames = text.matches("\nOpenFlow 1.3\n").count();
    for marker in ["Malformed", "Expert Info (Error"] {
        if let Some(at) = text.find(marker) {
            let from = text[..at].rfind("\nFrame ").unwrap_or(0);
            panic!(
                "tshark reports {marker}:\n{}",
                &text[from..(at + 400).min(text.len())]
            );
        }
    }
    println!(
        "tshark dissected {frames} OpenFlow 1.3 messages of {}",
        msgs.len()
    );
    assert_eq!(
        frames,
        msgs.len(),
        "tshark did not dissect every message as OpenFlow 1.3"
    );
}
