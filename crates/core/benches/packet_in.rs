//! The core's cost per new connection, without I/O: a TCP SYN to a VIP, as the bytes of
//! its PACKET_IN, to the encoded forward rule, reverse rule and PACKET_OUT. It is the
//! runtime's batch loop minus the sockets: the batch's connection-table lines are
//! prefetched, then each PACKET_IN is read in place and handled
//! (`Controller::handle_packet_in_frame`), and the outbox is encoded and cleared per batch
//! of 256.
//!
//! `cargo bench -p flowgate-core --features testkit --bench packet_in -- --warm-up-time 1 --measurement-time 3`
//!
//! * `syn/<algorithm>/<table>`: a SYN from a client never seen before, with `<table>`
//!   connections already tracked (the table keeps growing while it is measured, as it does
//!   under a SYN load; with 0, each batch starts from an empty table sized for one batch,
//!   so it stays in cache). One switch, one service, three backends.
//! * `syn-16-services/isslm/0`: the same, with the SYNs spread over 16 services (each its
//!   own VIP and virtual MAC, the same three backends), as in `flowgate bench
//!   controller`'s configuration: what the core pays per service configured. (With one
//!   service, a scan over the services' virtual MACs on every PACKET_IN went unseen here:
//!   with 16, 2,991.7 instructions a SYN against the hashed set's 2,876.3, which costs the
//!   same with one.)
//! * `decode/<table>`: the same PACKET_INs decoded only (`ofp::decode_into`, one reused
//!   slot): what a controller that decodes each message pays before it decides anything.
//! * `syn/refused/<table>`: the same SYNs to a service none of whose backends takes new
//!   connections (all draining): each answered with a RST, nothing tracked. What a SYN the
//!   controller refuses costs it, against one it places (the simulator's
//!   `refusal_cost`, docs/simulator.md).
//! * `churn/isslm/1000000`: connections that end, as under `flowgate bench controller
//!   --expire-after`: a million live, and each batch of 256 new ones' SYNs handled with
//!   the 512 FLOW_REMOVEDs (accounting and outcome rules) of the 256 oldest. Per
//!   connection set up and ended; against `syn/isslm/1000000`, what an ending costs.
//! * `tick/<case>/1000000`: one tick of the controller (every `refresh_interval`) with a
//!   million connections, which the PACKET_IN path waits for: `quiet` (nothing changed),
//!   `switch-joins` (a switch with no links joined and another left, no path changed) and
//!   `backend-moved` (a slice of the walk that re-routes a moved backend's connections,
//!   10 ms of its budget); `backend-moved-step`, the same walk's step between ticks, with
//!   the budget of one `WALK_STEP`; `link-changed-step`, a step of the walk after a link
//!   of a ring of three switches that two thirds of the connections cross went down or
//!   came back; `link-elsewhere-step`, the same for a link that none of them crosses.
//!
//! Wall-clock time on a shared machine: compare the two in one run (the ratio), not
//! absolute figures across runs.

use std::collections::VecDeque;
use std::hint::black_box;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{
    BenchmarkGroup, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main,
};
use flowgate_core::controller::WALK_STEP;
use flowgate_core::testkit::sim::{Sim, VIP, VMAC, arp_request, ip, mac};
use flowgate_core::{Outbox, RuleEnded};
use flowgate_packet::{self as packet, MacAddr, TcpFlags, TcpSegment};
use ofp::{Bytes, Message, PacketIn};

/// PACKET_INs handled between two flushes of the outbox (the runtime's batch).
const BATCH: usize = 256;
/// The client's switch port (h1's in the sim).
const CLIENT_PORT: u32 = 1;
const DPID: u64 = 1;

/// One switch; h1 the clients' router on port 1, backends h2..h4 on ports 2..4. Its
/// connection table is sized for `preallocate` connections (`[controller]
/// preallocate_connections`; 0 lets it grow as they come). No reconnect grace: the
/// bench's clock stands still, and a switch in its grace never leaves it, where a SYN no
/// backend can take is held rather than refused (`syn/refused` measured the hold).
fn controller(algorithm: &str, preallocate: usize) -> Sim {
    controller_of(algorithm, preallocate, 1)
}

/// [`controller`] with `services` services, service `i` at [`vip`]`(i)` and
/// [`vmac`]`(i)`, all on the same three backends.
fn controller_of(algorithm: &str, preallocate: usize, services: u8) -> Sim {
    controller_with(algorithm, preallocate, services, "")
}

/// [`controller_of`] with more of `[controller]`'s settings (`extra`, TOML lines).
fn controller_with(algorithm: &str, preallocate: usize, services: u8, extra: &str) -> Sim {
    let cfg = config(algorithm, preallocate, services, extra);
    let hosts = [
        ("h1", DPID, 1),
        ("h2", DPID, 2),
        ("h3", DPID, 3),
        ("h4", DPID, 4),
    ];
    let mut sim = Sim::new(&cfg, &[(DPID, 4)], &[], &hosts);
    for i in 1..=4u8 {
        sim.send(&format!("h{i}"), &arp_request(i, ip(9)));
    }
    sim
}

/// A ring of three switches (s1–s2 on ports 2 and 3, s2–s3 on 2 and 3, s3–s1 on 2 and 3)
/// and [`controller_with`]'s services: the clients' router h1 on s1 port 1, backends h2
/// and h3 on s2 (ports 1 and 4), h4 on s3 port 1. Two thirds of the connections cross
/// the s1–s2 link.
fn ring_with(algorithm: &str, extra: &str) -> Sim {
    let cfg = config(algorithm, 0, 1, extra);
    let links = [((1, 2), (2, 3)), ((2, 2), (3, 3)), ((3, 2), (1, 3))];
    let hosts = [("h1", 1, 1), ("h2", 2, 1), ("h3", 2, 4), ("h4", 3, 1)];
    let mut sim = Sim::new(&cfg, &[(1, 3), (2, 4), (3, 3)], &links, &hosts);
    for i in 1..=4u8 {
        sim.send(&format!("h{i}"), &arp_request(i, ip(9)));
    }
    sim
}

/// The ring's s1–s2 link (`S1_S2`, which two thirds of the connections cross) or s2–s3
/// link (`S2_S3`, which none crosses while s1–s2 is up).
const S1_S2: ((u64, u32), (u64, u32)) = ((1, 2), (2, 3));
const S2_S3: ((u64, u32), (u64, u32)) = ((2, 2), (3, 3));

/// The configuration of [`controller_with`].
fn config(algorithm: &str, preallocate: usize, services: u8, extra: &str) -> String {
    let mut cfg = format!(
        "[openflow]\npacket_in_rate = 100000000\n\n[controller]\npreallocate_connections = {preallocate}\nreconnect_grace_ms = 0\n{extra}"
    );
    for i in 0..services {
        cfg += &format!(
            "\n[[service]]\nname = \"web{i}\"\nvip = \"{}\"\nvirtual_mac = \"{}\"\nport = 80\nalgorithm = \"{algorithm}\"\nthreshold_rps = 1500\n[service.health]\nkind = \"none\"\n",
            vip(i),
            vmac(i)
        );
        for b in 2..=4u8 {
            cfg += &format!("[[service.backend]]\naddress = \"{}\"\n", ip(b));
        }
    }
    cfg
}

/// Service `i`'s address: 10.0.0.100 + i (service 0's is the sim's `VIP`).
fn vip(i: u8) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(VIP) + u32::from(i))
}

/// Service `i`'s virtual MAC: `02:66:67:00:ii:01` (service 0's is the sim's `VMAC`).
fn vmac(i: u8) -> MacAddr {
    let mut m = VMAC;
    m.0[4] = i;
    m
}

/// The PACKET_IN of client `k`'s SYN (a distinct address and port per `k`, behind h1), to
/// service `k mod services`.
fn syn_packet_in(k: u32, services: u8) -> Bytes {
    let client = Ipv4Addr::from(0x0a80_0000 | (k >> 14));
    let service = (k % u32::from(services.max(1))) as u8;
    let data = packet::ipv4_tcp(&TcpSegment {
        eth_src: mac(1),
        eth_dst: vmac(service),
        ip_src: client,
        ip_dst: vip(service),
        src_port: 1024 + (k & 0x3fff) as u16,
        dst_port: 80,
        seq: k,
        flags: TcpFlags(0x02),
        ..TcpSegment::default()
    });
    let pi = PacketIn::table_miss(CLIENT_PORT, data);
    let mut buf = bytes::BytesMut::new();
    ofp::encode(k, &Message::PacketIn(pi), &mut buf).expect("a SYN's PACKET_IN encodes");
    buf.freeze()
}

/// A source of never-seen clients, built a batch at a time outside the timed part.
struct Clients {
    next: u32,
    services: u8,
    batch: Vec<Bytes>,
}

impl Clients {
    fn new() -> Self {
        Self::to_services(1)
    }

    /// Clients of `services` services, in turn.
    fn to_services(services: u8) -> Self {
        Clients {
            next: 0,
            services,
            batch: Vec::with_capacity(BATCH),
        }
    }

    fn refill(&mut self) -> &[Bytes] {
        self.batch.clear();
        for _ in 0..BATCH {
            self.batch.push(syn_packet_in(self.next, self.services));
            self.next = self.next.wrapping_add(1);
        }
        &self.batch
    }
}

/// Handle one batch as the runtime does; returns how many messages the switch is sent.
fn handle_batch(sim: &mut Sim, out: &mut Outbox, frames: &[Bytes]) -> usize {
    for f in frames {
        sim.c.prefetch_packet_in(f);
    }
    for f in frames {
        // A frame that does not decode would send nothing: the caller's count catches it.
        let _ = sim.c.handle_packet_in_frame(sim.now, DPID, f, out);
    }
    let Some(enc) = out.encoded_mut() else {
        return 0;
    };
    let n = enc.iter().filter(|(_, _, b)| !b.is_empty()).count();
    enc.clear();
    n
}

/// Time `each` over fresh batches of never-seen clients, per PACKET_IN.
fn time_batches(
    b: &mut criterion::Bencher<'_>,
    clients: &mut Clients,
    mut each: impl FnMut(&[Bytes]),
) {
    b.iter_custom(|iters| {
        let mut took = Duration::ZERO;
        let mut done = 0;
        while done < iters {
            let frames = clients.refill().to_vec();
            let t = Instant::now();
            each(&frames);
            took += t.elapsed();
            done += BATCH as u64;
        }
        took.mul_f64(iters as f64 / done as f64)
    });
}

/// `<algorithm>/<table>` in `g`: never-seen clients' SYNs, spread over `services` services.
fn bench_syn(g: &mut BenchmarkGroup<'_, WallTime>, algorithm: &str, table: usize, services: u8) {
    // An empty table stays empty: each batch's connections are forgotten, in a table sized
    // for one batch. (Grown from nothing, each batch paid an index allocation for nearly
    // every SYN, one per shard, 7 % of the instructions, which a running controller pays
    // once per shard in its life.)
    let reset = table == 0;
    let size = if reset { BATCH } else { 0 };
    let mut sim = controller_of(algorithm, size, services);
    let mut out = Outbox::encoding();
    let mut clients = Clients::to_services(services);
    let (mut sent, mut answered) = (0usize, 0usize);
    let mut filled = false;
    g.bench_function(BenchmarkId::new(algorithm, table), |b| {
        // The table is filled here, when the bench runs, so that a run whose filter leaves
        // it out does not first wait for a million setups.
        if !std::mem::replace(&mut filled, true) {
            for _ in 0..table.div_ceil(BATCH) {
                let frames = clients.refill().to_vec();
                handle_batch(&mut sim, &mut out, &frames);
            }
        }
        b.iter_custom(|iters| {
            let mut took = Duration::ZERO;
            let mut done = 0;
            while done < iters {
                if reset {
                    sim = controller_of(algorithm, size, services);
                }
                let frames = clients.refill().to_vec();
                let t = Instant::now();
                answered += handle_batch(&mut sim, &mut out, &frames);
                took += t.elapsed();
                sent += BATCH;
                done += BATCH as u64;
            }
            took.mul_f64(iters as f64 / done as f64)
        })
    });
    // Every SYN was answered with its two rules and its PACKET_OUT, and tracked (a bench of
    // a controller that drops them would be measuring nothing).
    assert_eq!(answered, 3 * sent, "{algorithm}: three messages per SYN");
    assert!(sent == 0 || sim.c.connections().len() > table);
}

fn syn(c: &mut Criterion) {
    for table in [0usize, 1_000_000] {
        let mut g = c.benchmark_group("syn");
        g.throughput(Throughput::Elements(1));
        for algorithm in ["round-robin", "isslm"] {
            bench_syn(&mut g, algorithm, table, 1);
        }
        if table == 0 {
            let mut sim = controller("round-robin", 0);
            for b in 0..3 {
                sim.c
                    .set_admin(sim.now, 0, b, flowgate_core::service::AdminState::Draining);
            }
            let mut out = Outbox::encoding();
            let mut clients = Clients::new();
            let (mut sent, mut answered) = (0usize, 0usize);
            g.bench_function(BenchmarkId::new("refused", table), |b| {
                time_batches(b, &mut clients, |frames| {
                    answered += handle_batch(&mut sim, &mut out, frames);
                    sent += BATCH;
                })
            });
            // Every SYN was refused with one RST, and none tracked.
            assert_eq!(answered, sent, "refused: one RST per SYN");
            assert_eq!(sim.c.connections().len(), 0);
        }
        let mut slot = Message::EchoReply(Bytes::new());
        let mut clients = Clients::new();
        g.bench_function(BenchmarkId::new("decode", table), |b| {
            time_batches(b, &mut clients, |frames| {
                for f in frames {
                    let _ = black_box(ofp::decode_into(f.clone(), &mut slot));
                }
            })
        });
        g.finish();
    }
    let mut g = c.benchmark_group("syn-16-services");
    g.throughput(Throughput::Elements(1));
    bench_syn(&mut g, "isslm", 0, 16);
    g.finish();
}

/// The FLOW_REMOVEDs the switch would send for the rules of `enc` that ask for one
/// (OFPFF_SEND_FLOW_REM: a connection's accounting and outcome rules), as it would when
/// the connection ended.
fn removals_of(enc: &flowgate_core::Encoded, into: &mut VecDeque<Bytes>) {
    for (_, _, bytes) in enc.iter() {
        let Ok((_, Message::FlowMod(fm))) = ofp::decode(Bytes::copy_from_slice(bytes)) else {
            continue;
        };
        if !fm.flags.contains(ofp::FlowModFlags::SEND_FLOW_REM) {
            continue;
        }
        let fr = ofp::FlowRemoved::of_rule(&fm, ofp::FlowRemovedReason::IdleTimeout, 2, 9, 900);
        let mut buf = bytes::BytesMut::new();
        ofp::encode(0, &Message::FlowRemoved(fr), &mut buf).expect("a FLOW_REMOVED encodes");
        into.push_back(buf.freeze());
    }
}

/// Connections that end, as in `flowgate bench controller --expire-after`: a table of a
/// million live connections, where each batch of new ones' SYNs comes with the
/// FLOW_REMOVEDs of as many of the oldest (their accounting and outcome rules), all
/// handled in one batch as the runtime does (the batch's lines prefetched first). Per
/// connection: one set up, one ended.
fn churn(c: &mut Criterion) {
    const TABLE: usize = 1_000_000;
    let mut g = c.benchmark_group("churn");
    g.throughput(Throughput::Elements(1));
    let mut sim = controller("isslm", 0);
    let mut out = Outbox::encoding();
    let mut clients = Clients::new();
    let mut ended: VecDeque<Bytes> = VecDeque::with_capacity(2 * TABLE + 4 * BATCH);
    let handle = |sim: &mut Sim, out: &mut Outbox, syns: &[Bytes], removed: &[RuleEnded]| {
        for f in syns {
            sim.c.prefetch_packet_in(f);
        }
        for e in removed {
            sim.c.prefetch_rule_ended(e);
        }
        for e in removed {
            sim.c.handle_rule_ended(sim.now, DPID, e, out);
        }
        for f in syns {
            let _ = sim.c.handle_packet_in_frame(sim.now, DPID, f, out);
        }
    };
    let mut live_before = None;
    g.bench_function(BenchmarkId::new("isslm", TABLE), |b| {
        // Filled when the bench runs, not before (see `syn`).
        if live_before.is_none() {
            for _ in 0..TABLE.div_ceil(BATCH) {
                let frames = clients.refill().to_vec();
                handle(&mut sim, &mut out, &frames, &[]);
                if let Some(enc) = out.encoded_mut() {
                    removals_of(enc, &mut ended);
                    enc.clear();
                }
            }
            let per_conn = ended.len() / sim.c.connections().len().max(1);
            assert_eq!(
                per_conn, 2,
                "two rules of each connection send FLOW_REMOVED"
            );
            live_before = Some(sim.c.connections().len());
        }
        b.iter_custom(|iters| {
            let mut took = Duration::ZERO;
            let mut done = 0;
            while done < iters {
                let frames = clients.refill().to_vec();
                let removed: Vec<Bytes> = ended.drain(..2 * BATCH).collect();
                let removed: Vec<RuleEnded> = removed
                    .iter()
                    .filter_map(|b| ofp::FlowRemovedView::new(b).ok())
                    .map(|v| RuleEnded::of_view(&v))
                    .collect();
                let t = Instant::now();
                handle(&mut sim, &mut out, &frames, &removed);
                took += t.elapsed();
                if let Some(enc) = out.encoded_mut() {
                    removals_of(enc, &mut ended);
                    enc.clear();
                }
                done += BATCH as u64;
            }
            took.mul_f64(iters as f64 / done as f64)
        })
    });
    // Each batch ended as many connections as it set up: the table stayed at its size
    // (a bench whose removals missed would be measuring inserts alone).
    if let Some(before) = live_before {
        assert_eq!(sim.c.connections().len(), before, "as many ended as set up");
    }
    g.finish();
}

/// One tick (`Controller::handle_tick`, every `refresh_interval`, 10 ms by default) with
/// a million connections tracked: the PACKET_IN path waits while it runs.
fn tick(c: &mut Criterion) {
    const TABLE: usize = 1_000_000;
    let mut g = c.benchmark_group("tick");
    // Hosts never age out: the bench's clock runs ahead 10 ms a tick, and a backend
    // forgotten would leave its connections no path to be re-routed on.
    let mut sim = controller_with("isslm", 0, 1, "host_timeout_secs = 0\n");
    // Links are found again when they come back (`Sim::set_link`), not on the LLDP tick.
    let mut ring = ring_with("isslm", "host_timeout_secs = 0\nlldp_interval_ms = 60000\n");
    let mut out = Outbox::encoding();
    for sim in [&mut sim, &mut ring] {
        let mut clients = Clients::new();
        for _ in 0..TABLE.div_ceil(BATCH) {
            let frames = clients.refill().to_vec();
            handle_batch(sim, &mut out, &frames);
        }
        assert!(sim.c.connections().len() >= TABLE, "every SYN placed");
    }
    // Timed: one tick 10 ms after the last (or, `step`, one step of a walk a
    // `WALK_STEP` after the last, as the runtime takes them between ticks), `before` run
    // first outside the timing (its messages dropped).
    let mut time_ticks = |b: &mut criterion::Bencher<'_>,
                          sim: &mut Sim,
                          step: bool,
                          before: &mut dyn FnMut(&mut Sim, &mut Outbox)| {
        b.iter_custom(|iters| {
            let mut took = Duration::ZERO;
            for _ in 0..iters {
                before(sim, &mut out);
                let t = if step {
                    sim.now += WALK_STEP;
                    let t = Instant::now();
                    sim.c.handle_reroute_step(sim.now, &mut out);
                    t
                } else {
                    sim.now += Duration::from_millis(10);
                    let t = Instant::now();
                    sim.c.handle_tick(sim.now, &mut out);
                    t
                };
                took += t.elapsed();
                if let Some(enc) = out.encoded_mut() {
                    enc.clear();
                }
                sim.out.drain().for_each(drop);
            }
            took
        })
    };
    // Nothing changed since the last tick.
    g.bench_function(BenchmarkId::new("quiet", TABLE), |b| {
        time_ticks(b, &mut sim, false, &mut |_, _| {});
    });
    // A switch with no links joined (and the one before left), as when a switch's session
    // drops and comes back: no path changed.
    let mut dpid = 100;
    g.bench_function(BenchmarkId::new("switch-joins", TABLE), |b| {
        time_ticks(b, &mut sim, false, &mut |sim, out| {
            sim.c.handle_switch_down(sim.now, dpid, out);
            dpid += 1;
            sim.c
                .handle_switch_up(sim.now, ofp::SwitchFeatures::emulated(dpid), out);
        });
    });
    sim.c.handle_switch_down(sim.now, dpid, &mut sim.out);
    sim.out.drain().for_each(drop);
    // A slice of the walk that follows a backend's move (h2 between ports 2 and 3, a
    // move each time a walk ends): a third of the connections get new rules, at most
    // 20,000 a second. On the tick, with 10 ms of budget, and in a step between ticks.
    let mut port = 2;
    let mut move_when_done = |sim: &mut Sim, _: &mut Outbox| {
        if !sim.c.rerouting() {
            port = 5 - port;
            sim.packet_in(DPID, port, arp_request(2, ip(9)));
            // The walk starts on the tick.
            sim.now += WALK_STEP;
            sim.c.handle_tick(sim.now, &mut sim.out);
        }
    };
    // (A case that a filter left out does not run: only those that ran are checked.)
    let mut moved_ran = false;
    g.bench_function(BenchmarkId::new("backend-moved", TABLE), |b| {
        moved_ran = true;
        time_ticks(b, &mut sim, false, &mut move_when_done);
    });
    g.bench_function(BenchmarkId::new("backend-moved-step", TABLE), |b| {
        moved_ran = true;
        time_ticks(b, &mut sim, true, &mut move_when_done);
    });
    assert!(
        !moved_ran || sim.c.counters().connections_rerouted > 0,
        "the walks re-routed"
    );
    // A step of the walk that follows a change of the links, a link of the ring going
    // down, then back, each time a walk ends. `link-changed-step`: the s1–s2 link, two
    // thirds of the connections go another way (their paths worked out, at most 20,000
    // re-routed a second); `link-elsewhere-step`: the s2–s3 link, which changes next
    // hops but no connection's path (each looked at, none re-routed: 500,000 a second).
    for (name, link) in [("link-changed-step", S1_S2), ("link-elsewhere-step", S2_S3)] {
        let (mut up, mut walks) = (true, 0u32);
        let mut toggle_when_done = |sim: &mut Sim, _: &mut Outbox| {
            if !sim.c.rerouting() {
                up = !up;
                walks += 1;
                sim.set_link(link, up);
                sim.now += WALK_STEP;
                sim.c.handle_tick(sim.now, &mut sim.out);
                assert!(sim.c.rerouting(), "a change of the links starts a walk");
            }
        };
        let checked = ring.c.counters().reroute_checked;
        g.bench_function(BenchmarkId::new(name, TABLE), |b| {
            time_ticks(b, &mut ring, true, &mut toggle_when_done);
        });
        assert!(
            walks == 0 || ring.c.counters().reroute_checked > checked,
            "the walks looked at the connections"
        );
        // The link back and its walk done, for the next case.
        if !up {
            ring.set_link(link, true);
        }
        ring.c.handle_tick(ring.now, &mut ring.out);
        while ring.c.rerouting() {
            ring.now += WALK_STEP;
            ring.c.handle_reroute_step(ring.now, &mut ring.out);
            ring.out.drain().for_each(drop);
        }
    }
    g.finish();
}

criterion_group!(benches, syn, churn, tick);
criterion_main!(benches);
