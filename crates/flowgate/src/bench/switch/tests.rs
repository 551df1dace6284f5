//! Unit tests of the emulated switch: its probes, its checks of the answers, the ring of
//! outstanding probes and the open-loop schedule.

use std::net::SocketAddrV4;

use super::open_loop::Slot;
use super::*;
use ofp::{Action, FlowMod, Match, Oxm, PacketOut};

fn plan() -> SwitchPlan {
    let backend = |i: u8| {
        (
            Ipv4Addr::new(10, 0, 1, i),
            MacAddr([2, 0, 0, 0, 1, i]),
            1 + u32::from(i),
        )
    };
    SwitchPlan {
        dpid: 7,
        vip: Ipv4Addr::new(10, 0, 0, 100),
        vport: 80,
        backends: vec![backend(1), backend(2), backend(3)],
        client_mac: MacAddr([2, 0, 0, 0, 0, 9]),
        client_base: [172, 16],
        client_port: 1,
    }
}

fn switch(check: CheckMode) -> Sw {
    let run = SwitchRun {
        controller: SocketAddr::from(([127, 0, 0, 1], 6653)),
        plan: plan(),
        check,
        pace: Pace::Window(1),
        timeout: Duration::from_secs(5),
        expire_after: 0,
        counters: Arc::default(),
        flags: Arc::default(),
    };
    Sw::new(run, None)
}

/// The PACKET_IN `ofp::encode` writes for a table miss carrying `data`.
fn encoded_packet_in(xid: u32, in_port: u32, data: Bytes) -> BytesMut {
    let mut out = BytesMut::new();
    let msg = crate::bench::memory::packet_in(in_port, data);
    ofp::encode(xid, &msg, &mut out).expect("encodes");
    out
}

/// The probes patched from the template are byte for byte the PACKET_INs of the SYNs
/// `packet::tcp_syn` builds, `ofp::encode`d; so is any other PACKET_IN the switch writes.
#[test]
fn probe_packet_ins_are_the_encoded_messages() {
    for check in [CheckMode::Vip, CheckMode::L2] {
        let mut sw = switch(check);
        sw.vip_mac = MacAddr([2, 0x66, 0x67, 1, 2, 3]);
        for k in [0u64, 1, 2, 59_999, 60_000, 123_457, 4_000_001] {
            sw.next_probe = k;
            sw.pending = Outstanding::new(sw.plan.client_base);
            sw.wbuf.clear();
            let now = Instant::now();
            sw.send_probe(now, now);
            let (ip, port) = sw.plan.client_of(k);
            let (src_mac, dst_mac) = sw.probe_macs(k);
            let syn = packet::tcp_syn(
                src_mac,
                dst_mac,
                SocketAddrV4::new(ip, port),
                SocketAddrV4::new(sw.plan.vip, sw.plan.vport),
                probe_isn(k),
            );
            let want = encoded_packet_in(sw.xid, sw.plan.client_port, syn);
            assert_eq!(&sw.wbuf[..], &want[..], "{check:?} probe {k}");
        }
    }
    let arp = packet::arp_request(
        MacAddr([2, 0, 0, 0, 0, 9]),
        Ipv4Addr::new(1, 2, 3, 4),
        Ipv4Addr::new(5, 6, 7, 8),
    );
    let mut out = BytesMut::new();
    put_packet_in(&mut out, 42, 3, &arp);
    assert_eq!(&out[..], &encoded_packet_in(42, 3, arp)[..]);
}

/// Probes are found by their client address and port; answered or lost, they leave
/// the ring, the oldest first.
#[test]
fn outstanding_probes_are_found_by_client_and_leave_in_order() {
    let p = plan();
    let mut o = Outstanding::new(p.client_base);
    let pending = |ms: u64| Pending {
        sent: Instant::now() - Duration::from_millis(ms),
        due: Instant::now() - Duration::from_millis(ms),
        fwd: None,
        rev: false,
        out: None,
        deferred: false,
        isn: 0,
        removals: Default::default(),
    };
    let ks = [59_998u64, 59_999, 60_000, 60_001, 60_002];
    for (i, k) in ks.iter().enumerate() {
        o.insert(*k, pending(100 - 10 * i as u64));
    }
    for k in ks {
        assert_eq!(o.probe_of(&p.client_of(k)), Some(k));
        assert!(o.contains_key(&p.client_of(k)));
    }
    assert!(!o.contains_key(&p.client_of(60_003)));
    assert!(!o.contains_key(&(Ipv4Addr::new(10, 16, 0, 0), 1024)));
    assert!(o.remove(&p.client_of(60_000)).is_some());
    assert!(o.remove(&p.client_of(60_000)).is_none());
    assert!(o.remove(&p.client_of(59_998)).is_some());
    assert_eq!((o.len(), o.base), (3, 59_999));
    // Older than 75 ms: 59_999 (90 ms); 60_000 is gone already, 60_001 is 70 ms old.
    o.expire(|q| q.sent.elapsed() >= Duration::from_millis(75));
    assert_eq!((o.len(), o.base), (2, 60_001));
    assert!(o.get(&p.client_of(60_002)).is_some());
}

/// A probe's latency counts from the write that took the last of its buffer: the probes
/// queued before it, and only those, get that write's time; an answered one is gone.
#[test]
fn probes_count_from_the_write_that_took_their_buffer_whole() {
    for check in [CheckMode::Vip, CheckMode::L2] {
        let mut sw = switch(check);
        let queued = Instant::now();
        for _ in 0..3 {
            sw.send_probe(queued, queued);
        }
        // Probes 0..3 are in the buffer being written; 3 is queued after.
        sw.in_out = sw.next_probe;
        sw.send_probe(queued, queued);
        if check == CheckMode::Vip {
            assert!(sw.pending.remove(&sw.plan.client_of(1)).is_some());
        }
        let written = queued + Duration::from_micros(40);
        sw.sent_whole(written);
        let sent: Vec<Instant> = match check {
            CheckMode::Vip => [0, 2, 3]
                .iter()
                .map(|k| {
                    sw.pending
                        .get(&sw.plan.client_of(*k))
                        .expect("outstanding")
                        .sent
                })
                .collect(),
            CheckMode::L2 => sw.fifo.iter().map(|e| e.0).collect(),
        };
        let want = match check {
            CheckMode::Vip => vec![written, written, queued],
            CheckMode::L2 => vec![written, written, written, queued],
        };
        assert_eq!(sent, want, "{check:?}");
        assert_eq!(sw.written, 3);
        // The next buffer: probe 3 alone.
        sw.in_out = sw.next_probe;
        let later = written + Duration::from_micros(40);
        sw.sent_whole(later);
        let last = match check {
            CheckMode::Vip => {
                sw.pending
                    .get(&sw.plan.client_of(3))
                    .expect("outstanding")
                    .sent
            }
            CheckMode::L2 => sw.fifo.back().expect("queued").0,
        };
        assert_eq!(last, later, "{check:?}");
    }
}

/// A complete answer for probe 0 toward backend `b`: the forward and reverse rules and
/// the PACKET_OUT of the SYN.
struct Answer {
    fwd: FlowMod,
    rev: FlowMod,
    out: PacketOut,
}

fn to_backend(p: &SwitchPlan, b: usize) -> Vec<Action> {
    let (ip, mac, port) = p.backends[b];
    vec![
        Action::set_field(Oxm::eth_dst(mac.0)),
        Action::set_field(Oxm::ipv4_dst(ip)),
        Action::output(port),
    ]
}

fn answer(sw: &Sw, b: usize) -> Answer {
    answer_to(sw, 0, b)
}

/// The answer to probe `k`, to backend `b`.
fn answer_to(sw: &Sw, k: u64, b: usize) -> Answer {
    let p = &sw.plan;
    let (cip, cport) = p.client_of(k);
    let (bip, ..) = p.backends[b];
    let fwd = FlowMod::add(
        Match::new()
            .with(Oxm::InPort(p.client_port))
            .with(Oxm::eth_src(p.client_mac.0))
            .with(Oxm::EthType(packet::ETH_TYPE_IPV4))
            .with(Oxm::IpProto(packet::IP_PROTO_TCP))
            .with(Oxm::ipv4_src(cip))
            .with(Oxm::ipv4_dst(p.vip))
            .with(Oxm::TcpSrc(cport))
            .with(Oxm::TcpDst(p.vport)),
    )
    .apply(to_backend(p, b));
    let rev = FlowMod::add(
        Match::new()
            .with(Oxm::EthType(packet::ETH_TYPE_IPV4))
            .with(Oxm::IpProto(packet::IP_PROTO_TCP))
            .with(Oxm::ipv4_src(bip))
            .with(Oxm::ipv4_dst(cip))
            .with(Oxm::TcpSrc(p.vport))
            .with(Oxm::TcpDst(cport)),
    )
    .apply([
        Action::set_field(Oxm::ipv4_src(p.vip)),
        Action::output(p.client_port),
    ]);
    let syn = packet::tcp_syn(
        p.client_mac,
        sw.vip_mac,
        SocketAddrV4::new(cip, cport),
        SocketAddrV4::new(p.vip, p.vport),
        probe_isn(k),
    );
    let out = PacketOut {
        buffer_id: ofp::NO_BUFFER,
        in_port: p.client_port,
        actions: to_backend(p, b).into_iter().collect(),
        data: syn,
    };
    Answer { fwd, rev, out }
}

/// Send probe 0, feed the answer's three messages as the controller's frames, and
/// return the counts of valid and invalid answers and the first reason.
fn judge(edit: impl FnOnce(&Sw, &mut Answer)) -> (u64, u64, String) {
    let mut sw = switch(CheckMode::Vip);
    let now = Instant::now();
    sw.send_probe(now, now);
    let mut a = answer(&sw, 0);
    edit(&sw, &mut a);
    let msgs = [
        Message::FlowMod(a.fwd),
        Message::FlowMod(a.rev),
        Message::PacketOut(a.out),
    ];
    for m in &msgs {
        let mut frame = BytesMut::new();
        ofp::encode(9, m, &mut frame).expect("encodes");
        sw.on_frame(Instant::now(), &frame)
            .expect("a well-formed frame");
    }
    let c = &sw.counters;
    (
        c.valid.load(Ordering::Relaxed),
        c.invalid.load(Ordering::Relaxed),
        sw.samples.first().cloned().unwrap_or_default(),
    )
}

fn assert_invalid(edit: impl FnOnce(&Sw, &mut Answer), why: &str) {
    let (valid, invalid, sample) = judge(edit);
    assert_eq!((valid, invalid), (0, 1), "{sample}");
    assert!(sample.contains(why), "{sample:?} does not say {why:?}");
}

#[test]
fn a_correct_answer_is_valid() {
    let (valid, invalid, sample) = judge(|_, _| {});
    assert_eq!((valid, invalid), (1, 0), "{sample}");
}

#[test]
fn a_forward_rule_with_another_backend_s_mac_is_invalid() {
    assert_invalid(
        |sw, a| {
            let mac = sw.plan.backends[1].1;
            a.fwd.instructions[0] = ofp::Instruction::apply([
                Action::set_field(Oxm::eth_dst(mac.0)),
                Action::set_field(Oxm::ipv4_dst(sw.plan.backends[0].0)),
                Action::output(sw.plan.backends[0].2),
            ]);
        },
        "is not backend 0's MAC",
    );
    // The first eth_dst right, a later one wrong.
    assert_invalid(
        |sw, a| {
            let mut acts = to_backend(&sw.plan, 0);
            acts.insert(1, Action::set_field(Oxm::eth_dst(sw.plan.backends[2].1.0)));
            a.fwd.instructions[0] = ofp::Instruction::apply(acts);
        },
        "is not backend 0's MAC",
    );
}

#[test]
fn a_forward_rule_with_the_wrong_output_port_is_invalid() {
    assert_invalid(
        |sw, a| {
            let mut acts = to_backend(&sw.plan, 0);
            acts[2] = Action::output(sw.plan.backends[1].2);
            a.fwd.instructions[0] = ofp::Instruction::apply(acts);
        },
        "backend 0 is on port 2",
    );
}

#[test]
fn a_masked_ipv4_match_is_invalid() {
    let slash24 = Some(Ipv4Addr::new(255, 255, 255, 0));
    assert_invalid(
        |sw, a| {
            a.fwd.match_.push(Oxm::Ipv4Dst {
                value: sw.plan.vip,
                mask: slash24,
            })
        },
        "does not fit the SYN",
    );
    // A rule for the client's whole /24 only, no exact source: not this probe's rule,
    // so never a complete answer.
    let (valid, ..) = judge(|sw, a| {
        let fields = a.fwd.match_.iter().map(|o| match o {
            Oxm::Ipv4Src { .. } => Oxm::Ipv4Src {
                value: Ipv4Addr::new(sw.plan.client_base[0], sw.plan.client_base[1], 0, 0),
                mask: slash24,
            },
            o => o.clone(),
        });
        a.fwd.match_ = fields.collect();
    });
    assert_eq!(valid, 0);
}

#[test]
fn a_reverse_rule_not_restoring_the_vip_is_invalid() {
    assert_invalid(
        |sw, a| {
            a.rev.instructions[0] = ofp::Instruction::apply([
                Action::set_field(Oxm::ipv4_src(sw.plan.backends[0].0)),
                Action::output(sw.plan.client_port),
            ]);
        },
        "reverse rule",
    );
    assert_invalid(
        |sw, a| {
            a.rev.instructions[0] = ofp::Instruction::apply([Action::output(sw.plan.client_port)])
        },
        "set ipv4_src None",
    );
}

#[test]
fn a_packet_out_to_another_backend_than_the_rules_is_invalid() {
    assert_invalid(
        |sw, a| a.out.actions = to_backend(&sw.plan, 1).into_iter().collect(),
        "name different backends",
    );
}

#[test]
fn a_packet_out_toward_the_client_is_invalid() {
    assert_invalid(
        |sw, a| {
            let p = &sw.plan;
            let (cip, cport) = p.client_of(0);
            a.out.actions = [Action::output(p.client_port)].into_iter().collect();
            a.out.data = packet::ipv4_tcp(&packet::TcpSegment {
                eth_src: sw.vip_mac,
                eth_dst: p.client_mac,
                ip_src: p.vip,
                ip_dst: cip,
                src_port: p.vport,
                dst_port: cport,
                ack: probe_isn(0).wrapping_add(1),
                flags: packet::TcpFlags(packet::TcpFlags::RST.0 | packet::TcpFlags::ACK.0),
                ..packet::TcpSegment::default()
            });
        },
        "toward the client",
    );
}

/// The schedule hands out every batch that has started, in turn over the switches
/// (each within one batch of the others at every moment), and what a switch takes adds
/// up to what fell due (nothing twice, nothing skipped).
#[test]
fn the_open_loop_schedule_interleaves_the_switches_evenly() {
    for (switches, batch) in [(1usize, 1u64), (16, 1), (16, 16), (3, 5)] {
        let rate = 260_000.0;
        let open = OpenLoop {
            rate,
            batch,
            slots: (0..switches).map(|_| Slot::default()).collect(),
            start: std::sync::OnceLock::new(),
            done: AtomicBool::new(false),
        };
        let t0 = Instant::now();
        assert_eq!(open.due(0, t0), 0, "nothing is due before the start");
        assert!(open.start.set(t0).is_ok());
        let mut taken = vec![0u64; switches];
        for us in (0..20_000).step_by(7) {
            let now = t0 + Duration::from_micros(us);
            let due: Vec<u64> = (0..switches).map(|i| open.due(i, now)).collect();
            // Every batch that has started, the one of the last probe due included.
            let last = (Duration::from_micros(us).as_secs_f64() * rate) as u64;
            let all = (last / batch + 1) * batch;
            assert_eq!(
                due.iter().sum::<u64>(),
                all,
                "{switches} switches at {us} µs"
            );
            let (lo, hi) = (due.iter().min(), due.iter().max());
            assert!(
                hi.zip(lo).is_some_and(|(h, l)| h - l <= batch),
                "{switches} switches, batch {batch}, at {us} µs: {due:?}"
            );
            for (i, t) in taken.iter_mut().enumerate() {
                *t += open.take(i, now);
                assert_eq!(*t, due[i]);
            }
        }
    }
}

/// The send lag: how long the oldest batch a switch has not taken yet has been due (its
/// first probe's time on the schedule), and nothing once it took all that fell due.
#[test]
fn the_send_lag_is_how_long_the_oldest_batch_not_taken_has_been_due() {
    // A million probes a second in batches of 10: batch g falls due at g × 10 µs, and
    // with 4 switches, switch i's batches are i, i + 4, i + 8, ...
    let open = OpenLoop {
        rate: 1_000_000.0,
        batch: 10,
        slots: (0..4).map(|_| Slot::default()).collect(),
        start: std::sync::OnceLock::new(),
        done: AtomicBool::new(false),
    };
    let us = Duration::from_micros;
    let t0 = Instant::now();
    assert_eq!(open.lag(0, t0), None, "no schedule before the start");
    assert!(open.start.set(t0).is_ok());
    let close = |lag: Option<Duration>, want: u64| {
        let lag = lag.unwrap_or_else(|| panic!("a batch is due; want a lag of {want} µs"));
        assert!(lag.abs_diff(us(want)) <= us(1), "{lag:?}, want {want} µs");
    };
    close(open.lag(0, t0), 0);
    assert_eq!(
        open.lag(1, t0),
        None,
        "switch 1's first batch falls due at 10 µs"
    );
    close(open.lag(1, t0 + us(35)), 25);
    assert_eq!(open.take(1, t0 + us(35)), 10);
    assert_eq!(
        open.lag(1, t0 + us(35)),
        None,
        "taken: nothing due until 50 µs"
    );
    // Batches 5 (50 µs) and 9 (90 µs) are switch 1's: the oldest sets the lag.
    close(open.lag(1, t0 + us(95)), 45);
    assert_eq!(open.take(1, t0 + us(95)), 20);
    assert_eq!(open.lag(1, t0 + us(95)), None);
    // Each probe's own due time: that of its batch (the latencies "from the schedule").
    let since = |k: u64| open.due_at(1, k).map(|t| t.saturating_duration_since(t0));
    for (k, want) in [(0, 10), (9, 10), (10, 50), (19, 50), (20, 90), (29, 90)] {
        let at = since(k).unwrap_or_else(|| panic!("probe {k} has a due time"));
        assert!(
            at.abs_diff(us(want)) <= us(1),
            "probe {k}: {at:?}, want {want} µs"
        );
    }
}

/// Connections end (`--expire-after 1`): once probe 1 is answered, probe 0's two rules
/// "idle out", and the switch sends a FLOW_REMOVED for each, with its own next xids: the
/// messages `ofp::encode` writes for them, copied from the rules' matches.
#[test]
fn ended_connections_send_the_flow_removed_of_each_rule() {
    let mut sw = switch(CheckMode::Vip);
    sw.expire_after = 1;
    let removed_of = |fm: &FlowMod| {
        let reason = ofp::FlowRemovedReason::IdleTimeout;
        ofp::FlowRemoved::of_rule(fm, reason, u32::from(fm.idle_timeout), 3, 254)
    };
    let mut want = Vec::new();
    for k in 0..2u64 {
        let now = Instant::now();
        sw.send_probe(now, now);
        let mut a = answer_to(&sw, k, 1);
        for (fm, cookie) in [(&mut a.fwd, 0xc0de_0000 + k), (&mut a.rev, 0xbeef_0000 + k)] {
            fm.cookie = cookie;
            fm.idle_timeout = 7;
            fm.priority = 300;
            fm.flags = ofp::FlowModFlags::SEND_FLOW_REM;
        }
        if k == 0 {
            want = vec![removed_of(&a.fwd), removed_of(&a.rev)];
        }
        sw.wbuf.clear();
        for m in [
            Message::FlowMod(a.fwd),
            Message::FlowMod(a.rev),
            Message::PacketOut(a.out),
        ] {
            let mut frame = BytesMut::new();
            ofp::encode(9, &m, &mut frame).expect("encodes");
            sw.on_frame(Instant::now(), &frame)
                .expect("a well-formed frame");
        }
    }
    assert_eq!(
        sw.counters.valid.load(Ordering::Relaxed),
        2,
        "{:?}",
        sw.samples
    );
    // After probe 1's answer: probe 0's removals, and nothing else.
    let sent = ofp::decode_file_bytes(&sw.wbuf).expect("whole frames");
    let got: Vec<_> = sent.iter().map(|(_, m)| m.clone()).collect();
    assert_eq!(
        got,
        want.into_iter()
            .map(Message::FlowRemoved)
            .collect::<Vec<_>>()
    );
    let xids: Vec<u32> = sent.iter().map(|(x, _)| *x).collect();
    assert_eq!(xids, [sw.xid - 1, sw.xid], "the switch's next xids");
    // Byte for byte what `ofp::encode` writes.
    let mut encoded = BytesMut::new();
    for (x, m) in &sent {
        ofp::encode(*x, m, &mut encoded).expect("encodes");
    }
    assert_eq!(&encoded[..], &sw.wbuf[..]);
    assert_eq!(sw.live_lens.len(), 1, "probe 1's still live");
}
