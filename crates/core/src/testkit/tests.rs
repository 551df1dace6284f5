//! Tests of the fakes themselves.

use std::net::{Ipv4Addr, SocketAddrV4};

use flowgate_packet::{ETH_TYPE_ARP, ETH_TYPE_IPV4, IP_PROTO_TCP, MacAddr, TcpFlags};
use ofp::{
    Action, Bucket, FlowMod, FlowModFlags, GroupMod, GroupModCommand, GroupType, Instruction,
    Match, Message, MeterMod, MeterModCommand, Oxm, PacketOut, RawOxm, port,
};

use super::*;

const CLIENT_MAC: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 0x01]);
const VIP_MAC: MacAddr = MacAddr([0x0e, 0, 0, 0, 0, 0x01]);
const B1_MAC: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 0xb1]);
const CLIENT: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const VIP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 100);
const B1: Ipv4Addr = Ipv4Addr::new(10, 0, 1, 1);

fn add(table: u8, prio: u16, cookie: u64, m: Match, actions: Vec<Action>) -> Message {
    Message::FlowMod(
        FlowMod::add(m)
            .table(table)
            .priority(prio)
            .cookie(cookie)
            .apply(actions),
    )
}

fn tcp_match() -> Match {
    Match::new()
        .with(Oxm::EthType(ETH_TYPE_IPV4))
        .with(Oxm::IpProto(IP_PROTO_TCP))
}

fn syn(in_port: u32, src_port: u16) -> PacketFields {
    let data = flowgate_packet::tcp_syn(
        CLIENT_MAC,
        VIP_MAC,
        SocketAddrV4::new(CLIENT, src_port),
        SocketAddrV4::new(VIP, 80),
        7,
    );
    PacketFields::from_frame(in_port, &data).expect("parses")
}

fn ok(t: &mut FakeTable, m: &Message) {
    if let Err(e) = t.apply(m) {
        panic!("refused: {e} for {m:?}");
    }
}

/// Adds a flow in table 0 with cookie 0 (what most tests need), which must be accepted.
fn ok_add(t: &mut FakeTable, prio: u16, m: Match, actions: Vec<Action>) {
    ok(t, &add(0, prio, 0, m, actions));
}

#[test]
fn from_frame_fills_fields() {
    let p = syn(3, 40000);
    assert_eq!(p.in_port, 3);
    assert_eq!(
        (p.eth_src, p.eth_dst, p.eth_type),
        (CLIENT_MAC, VIP_MAC, ETH_TYPE_IPV4)
    );
    assert_eq!((p.ipv4_src, p.ipv4_dst), (Some(CLIENT), Some(VIP)));
    assert_eq!(
        (p.tcp_src, p.tcp_dst, p.udp_src),
        (Some(40000), Some(80), None)
    );
    assert_eq!(p.tcp_flags, Some(u16::from(TcpFlags::SYN.0)));
    let arp = flowgate_packet::arp_request(CLIENT_MAC, CLIENT, VIP);
    let p = PacketFields::from_frame(1, &arp).expect("parses");
    assert_eq!(
        (p.eth_type, p.arp_op, p.arp_tpa),
        (ETH_TYPE_ARP, Some(1), Some(VIP))
    );
    assert_eq!(p.ip_proto, None);
}

#[test]
fn highest_priority_wins_and_miss_drops() {
    let mut t = FakeTable::new();
    ok(
        &mut t,
        &add(
            0,
            10,
            0xa,
            Match::new(),
            vec![Action::output(port::CONTROLLER)],
        ),
    );
    ok(
        &mut t,
        &add(
            0,
            100,
            0xb,
            tcp_match().with(Oxm::TcpDst(80)),
            vec![Action::output(2)],
        ),
    );
    ok(
        &mut t,
        &add(0, 50, 0xc, tcp_match(), vec![Action::output(3)]),
    );
    let tr = t.lookup(&syn(1, 1000));
    assert_eq!(tr.ports(), vec![2]);
    assert_eq!(tr.cookies(), vec![0xb]);
    assert!(!tr.sent_to_controller());
    let arp = PacketFields::from_frame(1, &flowgate_packet::arp_request(CLIENT_MAC, CLIENT, VIP))
        .expect("parses");
    let tr = t.lookup(&arp);
    assert!(tr.sent_to_controller() && tr.outputs.is_empty());
    assert_eq!(tr.cookies(), vec![0xa]);

    // No table-miss entry: dropped (§5.4).
    let empty = FakeTable::new();
    let tr = empty.lookup(&arp);
    assert!(tr.dropped());
    assert_eq!(tr.miss, Some(0));
}

#[test]
fn identical_match_and_priority_replaces() {
    let mut t = FakeTable::new();
    let m1 = tcp_match().with(Oxm::ipv4_dst(VIP));
    // Same fields, another order: still identical.
    let m2 = Match::new()
        .with(Oxm::ipv4_dst(VIP))
        .with(Oxm::IpProto(IP_PROTO_TCP))
        .with(Oxm::EthType(ETH_TYPE_IPV4));
    ok(&mut t, &add(0, 100, 1, m1.clone(), vec![Action::output(2)]));
    t.process(&syn(1, 1));
    ok(&mut t, &add(0, 100, 2, m2, vec![Action::output(3)]));
    assert_eq!(t.flow_count(), 1);
    let e = &t.table(0)[0];
    assert_eq!(
        (e.cookie, e.packet_count),
        (2, 1),
        "counters copied without RESET_COUNTS"
    );
    assert_eq!(t.lookup(&syn(1, 1)).ports(), vec![3]);
    // Another priority is another entry.
    ok(&mut t, &add(0, 101, 3, m1.clone(), vec![Action::output(4)]));
    assert_eq!(t.flow_count(), 2);
    // RESET_COUNTS clears them.
    let reset = FlowMod::add(m1)
        .priority(101)
        .flags(FlowModFlags::RESET_COUNTS)
        .apply([Action::output(4)]);
    t.process(&syn(1, 1));
    ok(&mut t, &Message::FlowMod(reset));
    assert!(
        t.table(0)
            .iter()
            .all(|e| e.priority != 101 || e.packet_count == 0)
    );
}

#[test]
fn check_overlap() {
    let mut t = FakeTable::new();
    ok_add(
        &mut t,
        100,
        tcp_match().with(Oxm::TcpDst(80)),
        vec![Action::output(2)],
    );
    let overlapping = FlowMod::add(tcp_match().with(Oxm::ipv4_dst(VIP)))
        .priority(100)
        .flags(FlowModFlags::CHECK_OVERLAP)
        .apply([Action::output(3)]);
    assert_eq!(
        t.apply(&Message::FlowMod(overlapping.clone())),
        Err(FakeTableError::Overlap)
    );
    // Disjoint (another tcp_dst) is fine; so is another priority.
    let disjoint = FlowMod::add(tcp_match().with(Oxm::TcpDst(443)))
        .priority(100)
        .flags(FlowModFlags::CHECK_OVERLAP)
        .apply([Action::output(3)]);
    ok(&mut t, &Message::FlowMod(disjoint));
    ok(&mut t, &Message::FlowMod(overlapping.priority(99)));
}

#[test]
fn strict_and_non_strict_delete() {
    let mut t = FakeTable::new();
    ok_add(
        &mut t,
        100,
        tcp_match().with(Oxm::TcpDst(80)),
        vec![Action::output(2)],
    );
    ok_add(
        &mut t,
        200,
        tcp_match().with(Oxm::TcpDst(80)),
        vec![Action::output(2)],
    );
    ok_add(&mut t, 100, tcp_match(), vec![Action::output(3)]);
    ok(
        &mut t,
        &add(1, 100, 0, tcp_match(), vec![Action::output(3)]),
    );
    ok_add(
        &mut t,
        5,
        Match::new().with(Oxm::EthType(ETH_TYPE_ARP)),
        vec![],
    );

    // Strict: exact match and priority, one table.
    let strict = FlowMod::delete_strict(tcp_match()).priority(100);
    ok(&mut t, &Message::FlowMod(strict.clone()));
    assert_eq!(t.flow_count(), 4);
    assert!(
        t.table(0)
            .iter()
            .all(|e| !(e.priority == 100 && e.match_.len() == 2))
    );
    ok(&mut t, &Message::FlowMod(strict));
    assert_eq!(t.flow_count(), 4, "nothing left to delete strictly");

    // Non-strict: everything at least as specific, any priority, all tables (OFPTT_ALL).
    ok(&mut t, &Message::FlowMod(FlowMod::delete(tcp_match())));
    assert_eq!(t.flow_count(), 1);
    assert_eq!(t.table(0)[0].priority, 5);
    assert_eq!(t.take_removed().len(), 4);

    // Delete all.
    ok(&mut t, &Message::FlowMod(FlowMod::delete(Match::new())));
    assert_eq!(t.flow_count(), 0);
}

#[test]
fn delete_by_cookie_mask_keeps_other_kinds() {
    // Top byte of the cookie = kind of rule (docs/architecture.md "Cookies").
    let mut t = FakeTable::new();
    ok(
        &mut t,
        &add(
            0,
            10,
            0x0100_0000_0000_0001,
            Match::new().with(Oxm::EthType(ETH_TYPE_ARP)),
            vec![],
        ),
    );
    ok(
        &mut t,
        &add(0, 20, 0x0100_0000_0000_0002, tcp_match(), vec![]),
    );
    ok(
        &mut t,
        &add(
            0,
            30,
            0x0200_0000_0000_0007,
            tcp_match().with(Oxm::TcpSrc(5)),
            vec![],
        ),
    );
    let del =
        FlowMod::delete(Match::new()).cookie_masked(0x0100_0000_0000_0000, 0xff00_0000_0000_0000);
    ok(&mut t, &Message::FlowMod(del));
    let left: Vec<u64> = t.flows().map(|e| e.cookie).collect();
    assert_eq!(left, vec![0x0200_0000_0000_0007]);
    // cookie_mask 0: no cookie filter.
    let del = FlowMod::delete(Match::new()).cookie_masked(0x1234, 0);
    ok(&mut t, &Message::FlowMod(del));
    assert_eq!(t.flow_count(), 0);
}

#[test]
fn delete_filtered_by_out_port_and_out_group() {
    let mut t = FakeTable::new();
    ok(
        &mut t,
        &group(
            9,
            GroupType::All,
            vec![Bucket::new([Action::output(5)].into_iter().collect())],
        ),
    );
    ok_add(
        &mut t,
        1,
        tcp_match().with(Oxm::TcpDst(1)),
        vec![Action::output(2)],
    );
    ok_add(
        &mut t,
        1,
        tcp_match().with(Oxm::TcpDst(2)),
        vec![Action::output(3)],
    );
    ok_add(
        &mut t,
        1,
        tcp_match().with(Oxm::TcpDst(3)),
        vec![Action::Group(9)],
    );
    let mut del = FlowMod::delete(Match::new());
    del.out_port = 3;
    ok(&mut t, &Message::FlowMod(del));
    assert_eq!(t.flow_count(), 2);
    let mut del = FlowMod::delete(Match::new());
    del.out_group = 9;
    ok(&mut t, &Message::FlowMod(del));
    assert_eq!(t.flow_count(), 1);
    assert!(t.table(0)[0].outputs_to(2));
}

#[test]
fn modify_and_modify_strict() {
    let mut t = FakeTable::new();
    ok(
        &mut t,
        &add(
            0,
            100,
            1,
            tcp_match().with(Oxm::TcpDst(80)),
            vec![Action::output(2)],
        ),
    );
    ok(&mut t, &add(0, 90, 2, tcp_match(), vec![Action::output(2)]));
    // Strict with the wrong priority: nothing changes, no error (§6.4).
    let m = FlowMod::modify_strict(tcp_match())
        .priority(100)
        .apply([Action::output(7)]);
    ok(&mut t, &Message::FlowMod(m));
    assert!(t.flows().all(|e| e.outputs_to(2)));
    let m = FlowMod::modify_strict(tcp_match())
        .priority(90)
        .apply([Action::output(7)]);
    ok(&mut t, &Message::FlowMod(m));
    assert_eq!(t.flows().filter(|e| e.outputs_to(7)).count(), 1);
    // Non-strict modifies both, keeps cookies.
    let m = FlowMod::modify(tcp_match()).apply([Action::output(8)]);
    ok(&mut t, &Message::FlowMod(m));
    assert!(t.flows().all(|e| e.outputs_to(8)));
    assert_eq!(t.flows().map(|e| e.cookie).collect::<Vec<_>>(), vec![1, 2]);
    // Modify of a match with no entry adds nothing.
    let m = FlowMod::modify(tcp_match().with(Oxm::TcpDst(9))).apply([Action::output(8)]);
    ok(&mut t, &Message::FlowMod(m));
    assert_eq!(t.flow_count(), 2);
}

#[test]
fn set_field_rewrites_in_order() {
    let mut t = FakeTable::new();
    let m = tcp_match().with(Oxm::ipv4_dst(VIP)).with(Oxm::TcpDst(80));
    ok_add(
        &mut t,
        100,
        m,
        vec![
            Action::output(9), // before the rewrite
            Action::SetField(Oxm::eth_dst(B1_MAC.0)),
            Action::SetField(Oxm::ipv4_dst(B1)),
            Action::SetField(Oxm::TcpDst(8080)),
            Action::output(2),
        ],
    );
    let tr = t.lookup(&syn(1, 40000));
    assert_eq!(tr.ports(), vec![9, 2]);
    let before = tr.output_on(9).expect("out 9");
    assert_eq!((before.ipv4_dst, before.tcp_dst), (Some(VIP), Some(80)));
    let after = tr.output_on(2).expect("out 2");
    assert_eq!(
        (after.eth_dst, after.ipv4_dst, after.tcp_dst),
        (B1_MAC, Some(B1), Some(8080))
    );
    assert_eq!((after.ipv4_src, after.tcp_src), (Some(CLIENT), Some(40000)));
}

#[test]
fn refuses_what_ovs_refuses() {
    let mut t = FakeTable::new();
    // Masked set_field (OVS: OFPBAC_BAD_SET_MASK).
    let masked = Oxm::Ipv4Dst {
        value: B1,
        mask: Some(Ipv4Addr::new(255, 255, 255, 0)),
    };
    let e = t.apply(&add(0, 1, 0, tcp_match(), vec![Action::SetField(masked)]));
    assert!(matches!(e, Err(FakeTableError::BadSetMask(_))), "{e:?}");
    let raw_masked = Oxm::Raw(RawOxm {
        class: 0x8000,
        field: 12,
        hasmask: true,
        payload: ofp::Bytes::from_static(&[10, 0, 1, 1, 255, 255, 255, 0]),
    });
    assert!(matches!(
        t.apply(&add(
            0,
            1,
            0,
            tcp_match(),
            vec![Action::SetField(raw_masked)]
        )),
        Err(FakeTableError::BadSetMask(_))
    ));
    // Match prerequisites (§7.2.3.6): ipv4_dst without eth_type.
    let e = t.apply(&add(0, 1, 0, Match::new().with(Oxm::ipv4_dst(VIP)), vec![]));
    assert!(matches!(e, Err(FakeTableError::BadMatch(_))), "{e:?}");
    assert_eq!(
        e.expect_err("refused").error_kind().code_name(),
        Some("OFPBMC_BAD_PREREQ")
    );
    // tcp_dst without ip_proto=6.
    let e = t.apply(&add(
        0,
        1,
        0,
        Match::new()
            .with(Oxm::EthType(ETH_TYPE_IPV4))
            .with(Oxm::TcpDst(80)),
        vec![],
    ));
    assert!(matches!(e, Err(FakeTableError::BadMatch(_))));
    // set_field ipv4_dst on a flow that does not match IPv4.
    let e = t.apply(&add(
        0,
        1,
        0,
        Match::new().with(Oxm::InPort(1)),
        vec![Action::SetField(Oxm::ipv4_dst(B1))],
    ));
    assert!(
        matches!(e, Err(FakeTableError::SetFieldPrerequisite { .. })),
        "{e:?}"
    );
    // Not writable.
    let e = t.apply(&add(
        0,
        1,
        0,
        tcp_match(),
        vec![Action::SetField(Oxm::EthType(0x86dd))],
    ));
    assert!(matches!(e, Err(FakeTableError::BadSetType(_))));
    // Output to OFPP_ANY, to TABLE in a flow, to an unknown group; an unknown meter.
    for a in [
        Action::output(port::ANY),
        Action::output(port::TABLE),
        Action::Group(77),
    ] {
        assert!(t.apply(&add(0, 1, 0, tcp_match(), vec![a])).is_err());
    }
    let with_meter = FlowMod::add(tcp_match()).instruction(Instruction::Meter(3));
    assert_eq!(
        t.apply(&Message::FlowMod(with_meter)),
        Err(FakeTableError::UnknownMeter(3))
    );
    // Nothing got in.
    assert_eq!(t.flow_count(), 0);
}

#[test]
fn goto_table_and_metadata() {
    let mut t = FakeTable::new();
    let m = Message::FlowMod(
        FlowMod::add(Match::new().with(Oxm::InPort(1)))
            .priority(10)
            .cookie(1)
            .instruction(Instruction::WriteMetadata {
                metadata: 0x42,
                mask: 0xff,
            })
            .instruction(Instruction::GotoTable(3))
            .apply([Action::SetField(Oxm::eth_src(VIP_MAC.0))]),
    );
    ok(&mut t, &m);
    ok(
        &mut t,
        &add(
            3,
            10,
            2,
            Match::new().with(Oxm::metadata(0x42)),
            vec![Action::output(4)],
        ),
    );
    ok(&mut t, &add(3, 5, 3, Match::new(), vec![Action::output(5)]));
    let tr = t.lookup(&syn(1, 1));
    assert_eq!(tr.cookies(), vec![1, 2]);
    let out = tr.output_on(4).expect("out 4");
    assert_eq!((out.metadata, out.eth_src), (0x42, VIP_MAC));
    // From port 2 table 0 misses.
    assert_eq!(t.lookup(&syn(2, 1)).miss, Some(0));
    // Backward goto refused (§5.1).
    let back = FlowMod::add(Match::new())
        .table(3)
        .instruction(Instruction::GotoTable(1));
    assert_eq!(
        t.apply(&Message::FlowMod(back)),
        Err(FakeTableError::BadGotoTable { from: 3, to: 1 })
    );
}

#[test]
fn write_actions_run_at_pipeline_end() {
    let mut t = FakeTable::new();
    let m = FlowMod::add(Match::new())
        .instruction(Instruction::WriteActions(
            [Action::output(6)].into_iter().collect(),
        ))
        .instruction(Instruction::GotoTable(1))
        .apply([Action::SetField(Oxm::eth_dst(B1_MAC.0))]);
    ok(&mut t, &Message::FlowMod(m));
    ok(&mut t, &add(1, 1, 0, Match::new(), vec![]));
    let tr = t.lookup(&syn(1, 1));
    assert_eq!(tr.ports(), vec![6]);
    assert_eq!(tr.outputs[0].1.eth_dst, B1_MAC);
    // Clear-actions in the next table empties the set.
    let clear = FlowMod::add(Match::new())
        .table(1)
        .priority(2)
        .instruction(Instruction::ClearActions);
    ok(&mut t, &Message::FlowMod(clear));
    assert!(t.lookup(&syn(1, 1)).dropped());
}

fn group(id: u32, typ: GroupType, buckets: Vec<Bucket>) -> Message {
    Message::GroupMod(GroupMod {
        command: GroupModCommand::Add,
        group_type: typ,
        group_id: id,
        buckets,
    })
}

fn backend_bucket(port: u32, last: u8) -> Bucket {
    Bucket::weighted(
        1,
        [
            Action::SetField(Oxm::ipv4_dst(Ipv4Addr::new(10, 0, 1, last))),
            Action::output(port),
        ]
        .into_iter()
        .collect(),
    )
}

#[test]
fn select_group_hash_and_first() {
    let mut t = FakeTable::new();
    ok(
        &mut t,
        &group(
            1,
            GroupType::Select,
            vec![
                backend_bucket(11, 1),
                backend_bucket(12, 2),
                backend_bucket(13, 3),
            ],
        ),
    );
    ok_add(&mut t, 1, tcp_match(), vec![Action::Group(1)]);
    let mut seen = std::collections::BTreeSet::new();
    for sport in 1000..1100 {
        let tr = t.lookup(&syn(1, sport));
        assert_eq!(tr.groups, vec![1]);
        assert_eq!(tr.outputs.len(), 1);
        let (p, f) = tr.outputs[0];
        assert_eq!(f.ipv4_dst, Some(Ipv4Addr::new(10, 0, 1, (p - 10) as u8)));
        // Same flow, same bucket.
        assert_eq!(t.lookup(&syn(1, sport)).ports(), vec![p]);
        seen.insert(p);
    }
    assert_eq!(seen.len(), 3, "the hash spreads flows over all buckets");
    t.set_select_policy(SelectPolicy::First);
    assert_eq!(t.lookup(&syn(1, 5)).ports(), vec![11]);
    // A dead watch port takes its bucket out.
    let mut b = backend_bucket(11, 1);
    b.watch_port = 11;
    let m = GroupMod {
        command: GroupModCommand::Modify,
        group_type: GroupType::Select,
        group_id: 1,
        buckets: vec![b, backend_bucket(12, 2)],
    };
    ok(&mut t, &Message::GroupMod(m));
    t.set_port_down(11, true);
    assert_eq!(t.lookup(&syn(1, 5)).ports(), vec![12]);
}

#[test]
fn all_and_fast_failover_groups_and_group_delete() {
    let mut t = FakeTable::new();
    ok(
        &mut t,
        &group(
            1,
            GroupType::All,
            vec![backend_bucket(11, 1), backend_bucket(12, 2)],
        ),
    );
    let mut primary = backend_bucket(21, 1);
    primary.watch_port = 21;
    let mut backup = backend_bucket(22, 2);
    backup.watch_port = 22;
    ok(
        &mut t,
        &group(2, GroupType::FastFailover, vec![primary, backup]),
    );
    ok_add(
        &mut t,
        1,
        tcp_match().with(Oxm::TcpSrc(1)),
        vec![Action::Group(1)],
    );
    ok_add(
        &mut t,
        1,
        tcp_match().with(Oxm::TcpSrc(2)),
        vec![Action::Group(2)],
    );
    assert_eq!(t.lookup(&syn(1, 1)).ports(), vec![11, 12]);
    assert_eq!(t.lookup(&syn(1, 2)).ports(), vec![21]);
    t.set_port_down(21, true);
    assert_eq!(t.lookup(&syn(1, 2)).ports(), vec![22]);
    assert_eq!(
        t.apply(&group(1, GroupType::All, vec![])),
        Err(FakeTableError::GroupExists(1))
    );
    // Deleting a group removes the flows that use it (§6.5).
    let del = GroupMod {
        command: GroupModCommand::Delete,
        group_type: GroupType::All,
        group_id: 1,
        buckets: vec![],
    };
    ok(&mut t, &Message::GroupMod(del));
    assert_eq!(t.flow_count(), 1);
    let removed = t.take_removed();
    assert_eq!(removed.len(), 1);
    assert_eq!(removed[0].reason, RemovalReason::GroupDelete);
}

#[test]
fn meters_are_recorded() {
    let mut t = FakeTable::new();
    let mm = MeterMod {
        command: MeterModCommand::Add,
        flags: ofp::MeterFlags::PKTPS,
        meter_id: 3,
        bands: vec![],
    };
    ok(&mut t, &Message::MeterMod(mm.clone()));
    assert_eq!(
        t.apply(&Message::MeterMod(mm.clone())),
        Err(FakeTableError::MeterExists(3))
    );
    ok(
        &mut t,
        &Message::FlowMod(
            FlowMod::add(tcp_match())
                .instruction(Instruction::Meter(3))
                .apply([Action::output(2)]),
        ),
    );
    assert_eq!(t.lookup(&syn(1, 1)).ports(), vec![2]);
    ok(
        &mut t,
        &Message::MeterMod(MeterMod {
            command: MeterModCommand::Delete,
            ..mm
        }),
    );
    assert_eq!(t.flow_count(), 0);
}

#[test]
fn timeouts() {
    let mut t = FakeTable::new();
    t.set_now(100);
    let idle = FlowMod::add(tcp_match().with(Oxm::TcpSrc(1)))
        .timeouts(10, 0)
        .flags(FlowModFlags::SEND_FLOW_REM)
        .apply([Action::output(2)]);
    let hard = FlowMod::add(tcp_match().with(Oxm::TcpSrc(2)))
        .timeouts(0, 15)
        .apply([Action::output(2)]);
    ok(&mut t, &Message::FlowMod(idle));
    ok(&mut t, &Message::FlowMod(hard));
    assert!(t.expire(109).is_empty());
    t.process(&syn(1, 1)); // refreshes the idle timer at 109
    t.process(&syn(1, 2)); // does not extend a hard timeout
    let gone = t.expire(115);
    assert_eq!(gone.len(), 1);
    assert_eq!(gone[0].reason, RemovalReason::HardTimeout);
    let gone = t.expire(119);
    assert_eq!(gone.len(), 1);
    assert_eq!(gone[0].reason, RemovalReason::IdleTimeout);
    assert!(gone[0].entry.flags.contains(FlowModFlags::SEND_FLOW_REM));
    assert_eq!(gone[0].entry.packet_count, 1);
    assert_eq!(t.flow_count(), 0);
}

#[test]
fn flood_in_port_and_packet_out() {
    let mut t = FakeTable::new().with_ports([1, 2, 3, 4]);
    t.set_port_down(4, true);
    ok_add(
        &mut t,
        1,
        Match::new().with(Oxm::EthType(ETH_TYPE_ARP)),
        vec![Action::output(port::FLOOD)],
    );
    ok_add(
        &mut t,
        1,
        tcp_match(),
        vec![Action::output(1), Action::output(port::IN_PORT)],
    );
    let arp = PacketFields::from_frame(2, &flowgate_packet::arp_request(CLIENT_MAC, CLIENT, VIP))
        .expect("arp");
    assert_eq!(t.lookup(&arp).ports(), vec![1, 3]);
    // Output to the input port by number is dropped; IN_PORT sends it back.
    assert_eq!(t.lookup(&syn(1, 1)).ports(), vec![1]);
    // PACKET_OUT: output to TABLE goes through the pipeline.
    let po = PacketOut {
        buffer_id: ofp::NO_BUFFER,
        in_port: 2,
        actions: [Action::output(port::TABLE)].into_iter().collect(),
        data: flowgate_packet::arp_request(CLIENT_MAC, CLIENT, VIP),
    };
    assert_eq!(t.packet_out(&po).expect("valid").ports(), vec![1, 3]);
    let po = PacketOut {
        actions: [Action::output(4)].into_iter().collect(),
        ..po
    };
    assert_eq!(t.packet_out(&po).expect("valid").ports(), vec![4]);
}

#[test]
fn onf_tcp_flags_match() {
    let mut t = FakeTable::new();
    let mut payload = vec![0x4f, 0x4e, 0x46, 0x00];
    payload.extend_from_slice(&u16::from(TcpFlags::SYN.0).to_be_bytes());
    payload.extend_from_slice(&u16::from((TcpFlags::SYN | TcpFlags::ACK).0).to_be_bytes());
    let syn_only = Oxm::Raw(RawOxm {
        class: 0xffff,
        field: 42,
        hasmask: true,
        payload: payload.into(),
    });
    ok_add(
        &mut t,
        10,
        tcp_match().with(syn_only),
        vec![Action::output(port::CONTROLLER)],
    );
    ok_add(&mut t, 1, tcp_match(), vec![Action::output(2)]);
    assert!(t.lookup(&syn(1, 1)).sent_to_controller());
    let mut synack = syn(1, 1);
    synack.tcp_flags = Some(u16::from((TcpFlags::SYN | TcpFlags::ACK).0));
    assert_eq!(t.lookup(&synack).ports(), vec![2]);
}

#[test]
fn vlan_match_and_push_pop() {
    let mut t = FakeTable::new();
    ok_add(
        &mut t,
        10,
        Match::new().with(Oxm::vlan(100)),
        vec![Action::PopVlan, Action::output(2)],
    );
    ok_add(
        &mut t,
        5,
        Match::new().with(Oxm::VlanVid {
            value: 0,
            mask: None,
        }),
        vec![
            Action::PushVlan(0x8100),
            Action::SetField(Oxm::vlan(200)),
            Action::output(3),
        ],
    );
    let mut tagged = syn(1, 1);
    tagged.vlan = Some(100);
    let tr = t.lookup(&tagged);
    assert_eq!(tr.ports(), vec![2]);
    assert_eq!(tr.outputs[0].1.vlan, None);
    let tr = t.lookup(&syn(1, 1));
    assert_eq!(tr.ports(), vec![3]);
    assert_eq!(tr.outputs[0].1.vlan, Some(200));
}

// --- FakeNetwork -------------------------------------------------------------------------

/// Two switches: host a on 1/1, host b on 2/1, link 1/2 <-> 2/2.
fn two_switches() -> FakeNetwork {
    let mut n = FakeNetwork::new();
    n.add_switch(1, FakeTable::new());
    n.add_switch(2, FakeTable::new());
    n.add_link((1, 2), (2, 2));
    n.add_host("a", (1, 1));
    n.add_host("b", (2, 1));
    n
}

#[test]
fn network_delivers_hop_by_hop() {
    let mut n = two_switches();
    let msgs = vec![
        (
            1,
            add(
                0,
                10,
                0x11,
                tcp_match(),
                vec![Action::SetField(Oxm::ipv4_dst(B1)), Action::output(2)],
            ),
        ),
        (2, add(0, 10, 0x22, tcp_match(), vec![Action::output(1)])),
    ];
    n.apply_all(&msgs).expect("accepted");
    let d = n.deliver("a", syn(0, 5)).expect("delivers");
    assert_eq!(d.host_names(), vec!["b"]);
    let got = d.received_by("b").expect("b");
    assert_eq!((got.ipv4_dst, got.in_port), (Some(B1), 2));
    assert_eq!(d.cookies(), vec![0x11, 0x22]);
    assert_eq!(d.hops.len(), 2);
    // From b, switch 2 sends it back out port 1 = in_port: dropped.
    let d = n.deliver("b", syn(0, 5)).expect("delivers");
    assert!(d.dropped());
    // Errors from a switch name the switch.
    let bad = add(0, 1, 0, Match::new().with(Oxm::TcpDst(1)), vec![]);
    assert!(matches!(
        n.apply(2, &bad),
        Err(NetworkApplyError::Refused { dpid: 2, .. })
    ));
    assert!(matches!(
        n.deliver("nobody", syn(0, 1)),
        Err(NetworkError::UnknownHost(_))
    ));
}

#[test]
fn network_to_controller_and_lost() {
    let mut n = two_switches();
    n.apply(
        1,
        &add(
            0,
            1,
            0,
            Match::new(),
            vec![Action::output(port::CONTROLLER), Action::output(9)],
        ),
    )
    .expect("ok");
    let d = n.deliver("a", syn(0, 1)).expect("delivers");
    assert_eq!(d.to_controller.len(), 1);
    assert_eq!(d.to_controller[0].0, 1);
    assert_eq!(d.lost.len(), 1);
    assert_eq!(d.lost[0].0, (1, 9));
}

#[test]
fn network_detects_loops() {
    // A triangle flooding broadcasts: the classic loop.
    let mut n = FakeNetwork::new();
    for dpid in 1..=3 {
        n.add_switch(dpid, FakeTable::new().with_ports([1, 2, 3]));
        n.apply(
            dpid,
            &add(0, 1, 0, Match::new(), vec![Action::output(port::FLOOD)]),
        )
        .expect("ok");
    }
    n.add_link((1, 2), (2, 3));
    n.add_link((2, 2), (3, 3));
    n.add_link((3, 2), (1, 3));
    n.add_host("h", (1, 1));
    let bcast = PacketFields::from_frame(0, &flowgate_packet::arp_request(CLIENT_MAC, CLIENT, VIP))
        .expect("arp");
    let e = n.deliver("h", bcast).expect_err("loops");
    assert!(matches!(e, NetworkError::Loop { .. }), "{e:?}");

    // Without the third link, flooding is a tree: everybody once, no error.
    n.remove_link((3, 2));
    n.add_host("h2", (2, 1));
    n.add_host("h3", (3, 1));
    let d = n.deliver("h", bcast).expect("no loop");
    let mut names = d.host_names();
    names.sort();
    assert_eq!(names, vec!["h2", "h3"]);

    // Ping-pong between 1/2 and 2/2 with an unchanged packet.
    let mut n = two_switches();
    n.apply(
        1,
        &add(
            0,
            1,
            0,
            Match::new().with(Oxm::InPort(1)),
            vec![Action::output(2)],
        ),
    )
    .expect("ok");
    n.apply(
        1,
        &add(
            0,
            1,
            0,
            Match::new().with(Oxm::InPort(2)),
            vec![Action::output(port::IN_PORT)],
        ),
    )
    .expect("ok");
    n.apply(
        2,
        &add(0, 1, 0, tcp_match(), vec![Action::output(port::IN_PORT)]),
    )
    .expect("ok");
    let e = n.deliver("a", syn(0, 1)).expect_err("loops");
    assert_eq!(
        e,
        NetworkError::Loop {
            dpid: 2,
            port: 2,
            hops: 3
        }
    );
}

#[test]
fn network_bounds_hops() {
    // A line of 12 switches, each forwarding port 1 -> port 2.
    let mut n = FakeNetwork::new();
    for dpid in 1..=12u64 {
        n.add_switch(dpid, FakeTable::new());
        n.apply(dpid, &add(0, 1, 0, Match::new(), vec![Action::output(2)]))
            .expect("ok");
        if dpid > 1 {
            n.add_link((dpid - 1, 2), (dpid, 1));
        }
    }
    n.add_host("first", (1, 1));
    n.add_host("last", (12, 2));
    assert_eq!(
        n.deliver("first", syn(0, 1)).expect("12 hops").host_names(),
        vec!["last"]
    );
    n.set_max_hops(10);
    assert_eq!(
        n.deliver("first", syn(0, 1)),
        Err(NetworkError::TooManyHops(10))
    );
}
