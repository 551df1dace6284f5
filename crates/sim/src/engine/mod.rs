//! The event loop: arrivals, SYNs at the leaves, the controller's queue, servers,
//! connection ends, and the controller's ticks, in time order.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use ahash::RandomState;
use flowgate_core::config::Config;
use flowgate_core::controller::{Controller, Outbox};
use flowgate_core::cookie::{self, RuleKind};
use flowgate_core::metrics_text::LoadSample;
use flowgate_core::overload::WorkSample;
use flowgate_packet::{self as packet, L3, MacAddr, TcpFlags};
use hdrhistogram::Histogram;
use ofp::{
    Action, Bytes, FlowMod, FlowModCommand, FlowModFlags, FlowRemoved, FlowRemovedReason, Match,
    Message, MeterBandStats, MeterStats, MultipartReply, MultipartReplyBody, MultipartRequestBody,
    Oxm, PacketIn, PortDesc, SwitchFeatures,
};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::Scenario;
use crate::fabric::{Attach, Host};
use crate::server::{Admit, Server};
use crate::switch::Switch;

mod openflow;
mod stats;

use openflow::{is_new_syn, places_a_connection};
pub use stats::{Ejection, Outcome, PhaseStats, Sample};

/// The service's address and port.
pub const VIP: Ipv4Addr = Ipv4Addr::new(10, 255, 0, 1);
pub const VPORT: u16 = 80;
/// The service's virtual MAC (the config's default for the first service).
const VMAC: MacAddr = MacAddr([0x02, 0x66, 0x67, 0x00, 0x00, 0x01]);

const MS: u64 = 1_000_000;
const SEC: u64 = 1_000_000_000;
/// Before the first request: links found, hosts learned, loads reported.
const WARM_UP: u64 = SEC;
/// After the last request: every connection reaches its outcome (a SYN dropped three
/// times is given up 7 s after the first). With faulty servers, their silent
/// connections' rules idle out `idle_timeout_secs` after that ([`Engine::drain`]).
const DRAIN: u64 = 8 * SEC;
/// A client sends a SYN at most this many times.
const SYN_TRIES: u8 = 3;
/// Time series resolution.
const SAMPLE: u64 = 100 * MS;
/// PACKET_INs one switch holds for the controller at most, waiting to be handled: Open
/// vSwitch queues 100 a controller connection (`connmgr`'s `rconn_send_with_limit`) and
/// drops past them; the socket's buffers hold about as many again.
pub const SWITCH_QUEUE: u32 = 256;

#[derive(Debug, Clone)]
enum Ev {
    Arrival,
    SynTimer(u64, u8),
    /// A PACKET_IN reaches the controller's queue.
    Up(Attach, Bytes),
    /// The controller takes the next PACKET_IN of its queue.
    Handle,
    AtServer(u64),
    Done(u64),
    RulesEnd(u64),
    Tick,
}

struct Queued {
    t: u64,
    seq: u64,
    ev: Ev,
}

impl PartialEq for Queued {
    fn eq(&self, o: &Self) -> bool {
        (self.t, self.seq) == (o.t, o.seq)
    }
}
impl Eq for Queued {}
impl PartialOrd for Queued {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Queued {
    // Earliest first from a max-heap.
    fn cmp(&self, o: &Self) -> Ordering {
        (o.t, o.seq).cmp(&(self.t, self.seq))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Connecting,
    AtServer,
    Ended,
}

/// A connection rule as installed, for its FLOW_REMOVED.
#[derive(Debug, Clone)]
struct Rule {
    dpid: u64,
    cookie: u64,
    priority: u16,
    match_: Match,
    idle_timeout: u16,
    flow_rem: bool,
    at: u64,
}

#[derive(Debug)]
struct Conn {
    client: u32,
    port: u16,
    first: u64,
    phase: usize,
    tries: u8,
    backend: Option<u16>,
    rules: Vec<Rule>,
    synack_played: bool,
    state: State,
    at_server: u64,
    /// Its server is faulty and drops it: nothing answers any of its SYNs.
    silenced: bool,
}

struct Engine<'s> {
    sc: &'s Scenario,
    c: Controller,
    out: Outbox,
    base: Instant,
    now: u64,
    seq: u64,
    events: BinaryHeap<Queued>,
    switches: HashMap<u64, Switch, RandomState>,
    servers: Vec<Server>,
    server_hosts: Vec<Host>,
    backend_by_ip: HashMap<Ipv4Addr, u16, RandomState>,
    clients: Vec<Host>,
    next_port: Vec<u16>,
    conns: HashMap<u64, Conn, RandomState>,
    by_key: HashMap<(Ipv4Addr, u16), u64, RandomState>,
    next_conn: u64,
    arrivals: SmallRng,
    service: SmallRng,
    /// PACKET_INs waiting for the controller, in arrival order: when each arrived, and
    /// from where.
    ctl_queue: std::collections::VecDeque<(u64, Attach, Bytes)>,
    /// The controller is handling one (an `Ev::Handle` is due).
    ctl_busy: bool,
    /// PACKET_INs of each switch waiting at the controller.
    pin_queued: HashMap<u64, u32, RandomState>,
    fin_timeout: u64,
    /// Work since the last tick, for the controller's own gap.
    work: WorkSample,
    shed_seen: u64,
    start: u64,
    end: u64,
    phases: Vec<PhaseStats>,
    /// Per phase: the servers' busy worker-ns and the controller's busy ns at its start.
    phase_marks: Vec<(Vec<f64>, f64)>,
    ctl_busy_ns: f64,
    series: Vec<Sample>,
    series_counts: (u64, u64, u64),
    series_busy: Vec<f64>,
    packet_ins: u64,
    deferred: u64,
    /// Of each server: whether it is faulty ([`Scenario::is_faulty`]), and the end of the
    /// last ejection seen at a tick.
    faulty: Vec<bool>,
    ejected: Vec<Option<Instant>>,
    ejections: Vec<Ejection>,
}

/// The initial sequence number of connection `id`'s client (any fixed function will do:
/// the controller only echoes it, and the SYN-ACK and ACK must agree with it).
fn client_isn(id: u64) -> u32 {
    (id as u32).wrapping_mul(2_654_435_761)
}

/// Run one scenario.
pub fn run(sc: &Scenario) -> anyhow::Result<Outcome> {
    sc.check().map_err(|e| anyhow::anyhow!("scenario: {e}"))?;
    let wall = Instant::now();
    let mut e = Engine::new(sc)?;
    e.boot();
    e.run_until(e.end + e.drain());
    e.finish_phases();
    let t = e.c.topology();
    Ok(Outcome {
        algorithm: sc.algorithm.clone(),
        overload: sc.overload.clone(),
        outlier: sc.outlier.clone(),
        redispatch: sc.redispatch,
        faulty: (0..sc.shape.servers())
            .filter(|&i| sc.is_faulty(i))
            .collect(),
        ejections: e.ejections,
        capacity: sc.capacity(),
        links_found: t.links().count(),
        hosts_learned: t.host_count(),
        packet_ins: e.packet_ins,
        max_conn_rules: e
            .switches
            .values()
            .map(|s| s.max_conn_rules)
            .max()
            .unwrap_or(0),
        spines_used: e
            .switches
            .iter()
            .filter(|(d, s)| **d > crate::fabric::SPINE_BASE && s.max_conn_rules > 0)
            .count(),
        conn_rules_left: e.switches.values().map(|s| s.conn_rules).sum(),
        deferred: e.deferred,
        phases: e.phases,
        series: e.series,
        wall_secs: wall.elapsed().as_secs_f64(),
    })
}

/// How long a run goes on after the last arrival, in seconds: every connection reaches
/// its outcome, and every rule ends and is reported.
pub fn drain_secs(sc: &Scenario) -> u64 {
    if sc.faulty == 0 {
        return DRAIN / SEC;
    }
    DRAIN / SEC + u64::from(sc.idle_timeout_secs)
}

/// The controller's configuration for a scenario: one service at [`VIP`] over every
/// server, weighted by capacity, ACCM as the scenario says (`adaptive-no-ceiling`:
/// `adaptive`, the service's without its ceiling).
pub fn controller_config(sc: &Scenario) -> String {
    let (mode, ceiling) = match sc.overload.as_str() {
        "adaptive-no-ceiling" => ("adaptive", "ceiling = false\n"),
        m => (m, ""),
    };
    let controller_mode = if mode == "adaptive" {
        "adaptive"
    } else {
        "off"
    };
    // ISSLM's threshold: one number for the pool, a fraction of a server's mean capacity.
    let threshold = if sc.algorithm == "isslm" {
        let mean = sc.capacity() / sc.shape.servers().max(1) as f64;
        format!("threshold_rps = {:.1}\n", sc.isslm_threshold * mean)
    } else {
        String::new()
    };
    let outlier = match sc.outlier.as_str() {
        "off" => "consecutive_failures = 0\nsuccess_rate = false\n".to_string(),
        "consecutive" => "success_rate = false\n".to_string(),
        "success-rate" => "consecutive_failures = 0\n".to_string(),
        "failure-percentage" => format!(
            "consecutive_failures = 0\nsuccess_rate = false\nfailure_percentage_threshold = {}\n",
            crate::FAILURE_PERCENTAGE_THRESHOLD
        ),
        _ => String::new(),
    };
    let mut cfg = format!(
        "[controller]\nseed = {seed}\nidle_timeout_secs = {idle}\n# Simulated hosts do not answer ARP probes.\nhost_timeout_secs = 0\n\
         [controller.overload]\nmode = \"{controller_mode}\"\n\
         [[service]]\nname = \"web\"\nvip = \"{VIP}\"\nport = {VPORT}\nalgorithm = \"{alg}\"\n{threshold}\
         redispatch = {redispatch}\n[service.health]\nkind = \"none\"\n\
         [service.outlier]\n{outlier}\
         [service.overload]\nmode = \"{mode}\"\ncapacity_rps = {cap:.0}\n{ceiling}",
        seed = sc.seed,
        idle = sc.idle_timeout_secs,
        redispatch = sc.redispatch,
        alg = sc.algorithm,
        cap = sc.capacity(),
    );
    for i in 0..sc.shape.servers() {
        let weight = (sc.speed(i) * f64::from(sc.workers)).round().max(1.0) as u32;
        cfg += &format!(
            "[[service.backend]]\naddress = \"{}\"\nweight = {weight}\n",
            sc.shape.server(i).ip
        );
    }
    cfg
}

impl<'s> Engine<'s> {
    fn new(sc: &'s Scenario) -> anyhow::Result<Self> {
        let text = controller_config(sc);
        let cfg = Config::from_toml(&text, &|_| None)
            .map_err(|errs| anyhow::anyhow!("the controller's config: {errs}"))?;
        let fin_timeout = match cfg.controller.fin_timeout_secs {
            0 => u64::from(cfg.controller.idle_timeout_secs) * SEC,
            s => u64::from(s) * SEC,
        };
        let servers = (0..sc.shape.servers())
            .map(|i| {
                Server::new(
                    sc.workers,
                    sc.service.as_nanos() as f64 / sc.speed(i),
                    sc.backlog,
                )
            })
            .collect::<Vec<_>>();
        let server_hosts: Vec<Host> = (0..sc.shape.servers())
            .map(|i| sc.shape.server(i))
            .collect();
        let clients: Vec<Host> = (0..sc.shape.clients())
            .map(|i| sc.shape.client(i))
            .collect();
        let end = WARM_UP + sc.phase.as_nanos() as u64 * sc.loads.len() as u64;
        let n = servers.len();
        Ok(Engine {
            sc,
            c: Controller::new(&cfg),
            out: Outbox::new(),
            base: Instant::now(),
            now: 0,
            seq: 0,
            events: BinaryHeap::new(),
            switches: sc
                .shape
                .switches()
                .into_iter()
                .map(|(d, _)| (d, Switch::default()))
                .collect(),
            backend_by_ip: server_hosts
                .iter()
                .enumerate()
                .map(|(i, h)| (h.ip, i as u16))
                .collect(),
            servers,
            server_hosts,
            next_port: vec![1024; clients.len()],
            clients,
            conns: HashMap::default(),
            by_key: HashMap::default(),
            next_conn: 0,
            arrivals: SmallRng::seed_from_u64(sc.seed ^ 0xa771_7a15),
            service: SmallRng::seed_from_u64(sc.seed ^ 0x5e7_71ce),
            ctl_queue: std::collections::VecDeque::new(),
            ctl_busy: false,
            pin_queued: HashMap::default(),
            fin_timeout,
            work: WorkSample::default(),
            shed_seen: 0,
            start: WARM_UP,
            end,
            phases: sc
                .loads
                .iter()
                .map(|&load| PhaseStats {
                    load,
                    offered: 0,
                    served: 0,
                    reset: 0,
                    server_refused: 0,
                    timed_out: 0,
                    to_faulty: 0,
                    dropped_by_server: 0,
                    redispatched: 0,
                    syn_drops: 0,
                    lost: 0,
                    rt: Histogram::new(3).expect("3 significant figures"),
                    rt_p50_ms: 0.0,
                    rt_p99_ms: 0.0,
                    utilization: Vec::new(),
                    util_mean: 0.0,
                    util_max: 0.0,
                    util_cov: 0.0,
                    controller_util: 0.0,
                })
                .collect(),
            phase_marks: Vec::new(),
            ctl_busy_ns: 0.0,
            series: Vec::new(),
            series_counts: (0, 0, 0),
            series_busy: vec![0.0; n],
            packet_ins: 0,
            deferred: 0,
            faulty: (0..n).map(|i| sc.is_faulty(i)).collect(),
            ejected: vec![None; n],
            ejections: Vec::new(),
        })
    }

    fn drain(&self) -> u64 {
        drain_secs(self.sc) * SEC
    }

    fn at(&self, t: u64) -> Instant {
        self.base + Duration::from_nanos(t)
    }

    fn push(&mut self, t: u64, ev: Ev) {
        self.seq += 1;
        self.events.push(Queued {
            t,
            seq: self.seq,
            ev,
        });
    }

    /// Every switch connects; every host says who it is (a gratuitous ARP); the first
    /// tick and the first arrival are scheduled.
    fn boot(&mut self) {
        for (dpid, _) in self.sc.shape.switches() {
            let features = SwitchFeatures::emulated(dpid);
            self.c.handle_switch_up(self.at(0), features, &mut self.out);
            self.apply(0);
        }
        let hosts: Vec<Host> = self
            .server_hosts
            .iter()
            .chain(self.clients.iter())
            .copied()
            .collect();
        for (i, h) in hosts.iter().enumerate() {
            let frame = packet::arp_request(h.mac, h.ip, h.ip);
            self.send_up(10 * MS + i as u64 * 1000, h.at, frame);
        }
        self.push(self.c.config().refresh_interval.as_nanos() as u64, Ev::Tick);
        self.push(self.start, Ev::Arrival);
    }

    fn run_until(&mut self, until: u64) {
        while let Some(q) = self.events.pop() {
            if q.t > until {
                break;
            }
            self.now = q.t;
            match q.ev {
                Ev::Arrival => self.arrival(),
                Ev::SynTimer(id, try_) => self.syn_timer(id, try_),
                Ev::Up(at, data) => self.up(at, data),
                Ev::Handle => self.handle(),
                Ev::AtServer(id) => self.at_server(id),
                Ev::Done(id) => self.done(id),
                Ev::RulesEnd(id) => self.rules_end(id),
                Ev::Tick => self.tick(),
            }
        }
    }

    fn phase_of(&self, t: u64) -> usize {
        let p = t.saturating_sub(self.start) / self.sc.phase.as_nanos().max(1) as u64;
        (p as usize).min(self.sc.loads.len() - 1)
    }

    /// A new connection from a random client, and the next arrival (Poisson, at the rate
    /// of the phase it falls in).
    fn arrival(&mut self) {
        if self.now >= self.end {
            return;
        }
        let phase = self.phase_of(self.now);
        let client = self.arrivals.gen_range(0..self.clients.len()) as u32;
        let port = {
            let p = &mut self.next_port[client as usize];
            let port = *p;
            *p = if *p == u16::MAX { 1024 } else { *p + 1 };
            port
        };
        let id = self.next_conn;
        self.next_conn += 1;
        let ip = self.clients[client as usize].ip;
        if let Some(old) = self.by_key.insert((ip, port), id) {
            // The client reuses a port whose connection is not over: the old one is let go.
            self.conns.remove(&old);
        }
        self.conns.insert(
            id,
            Conn {
                client,
                port,
                first: self.now,
                phase,
                tries: 0,
                backend: None,
                rules: Vec::new(),
                synack_played: false,
                state: State::Connecting,
                at_server: 0,
                silenced: false,
            },
        );
        self.phases[phase].offered += 1;
        self.series_counts.0 += 1;
        self.syn(id);
        // The next arrival: exponential at this phase's rate; one that would fall in the
        // next phase is drawn again from its start at that phase's rate (memoryless).
        let mut t = self.now;
        loop {
            let p = self.phase_of(t);
            let rate = self.sc.loads[p] * self.sc.capacity();
            let u: f64 = self.arrivals.r#gen::<f64>().max(1e-12);
            let next = t + (-u.ln() / rate * 1e9) as u64;
            let boundary = self.start + (p as u64 + 1) * self.sc.phase.as_nanos() as u64;
            if next < boundary || p + 1 >= self.sc.loads.len() {
                self.push(next.max(self.now + 1), Ev::Arrival);
                return;
            }
            t = boundary;
        }
    }

    /// A SYN (try `tries + 1`) of connection `id` enters its client's leaf, unless the
    /// connection was placed meanwhile.
    fn syn(&mut self, id: u64) {
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        if conn.state != State::Connecting || conn.backend.is_some() {
            return;
        }
        self.send_syn(id);
    }

    /// The SYN (try `tries + 1`) of connection `id` enters its client's leaf, and its
    /// client's timer to send it again starts.
    fn send_syn(&mut self, id: u64) {
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        conn.tries += 1;
        let try_ = conn.tries;
        let client = self.clients[conn.client as usize];
        let port = conn.port;
        let phase = conn.phase;
        // Linux: 1 s, then twice as long each time.
        let rto = SEC << (try_ - 1);
        self.push(self.now + rto, Ev::SynTimer(id, try_));
        // Dropped at the switch (a gap rule, a meter) or at its full queue to the
        // controller: the client sends it again when its timer fires.
        let admitted = self
            .switches
            .entry(client.at.dpid)
            .or_default()
            .admits_syn(self.now, VIP);
        let sent = admitted && {
            let frame = packet::ipv4_tcp(&packet::TcpSegment {
                eth_src: client.mac,
                eth_dst: VMAC,
                ip_src: client.ip,
                ip_dst: VIP,
                src_port: port,
                dst_port: VPORT,
                seq: client_isn(id),
                flags: TcpFlags::SYN,
                ..packet::TcpSegment::default()
            });
            self.send_syn_up(self.now, client.at, frame)
        };
        if !sent {
            self.phases[phase].syn_drops += 1;
        }
    }

    fn syn_timer(&mut self, id: u64, try_: u8) {
        let Some(conn) = self.conns.get(&id) else {
            return;
        };
        if conn.silenced {
            // Its SYN reached a server that dropped it: the client sends it again (the
            // controller sends it on to the same backend, the connection's, or once it
            // judges the connection silent to another: `packet_out`), then gives up.
            if conn.tries != try_ || conn.state == State::Ended {
                return;
            }
            if try_ < SYN_TRIES {
                self.send_syn(id);
            } else {
                self.give_up_silenced(id);
            }
            return;
        }
        if conn.state != State::Connecting || conn.backend.is_some() || conn.tries != try_ {
            return;
        }
        if try_ < SYN_TRIES {
            self.syn(id);
        } else {
            let phase = conn.phase;
            self.phases[phase].timed_out += 1;
            self.series_counts.2 += 1;
            self.end_conn(id);
        }
    }

    /// A new connection's SYN goes up from `at` at `t`, unless the switch's queue to the
    /// controller is full ([`SWITCH_QUEUE`]): then it is dropped (false).
    fn send_syn_up(&mut self, t: u64, at: Attach, data: Bytes) -> bool {
        let q = self.pin_queued.entry(at.dpid).or_default();
        if *q >= SWITCH_QUEUE {
            return false;
        }
        self.send_up(t, at, data);
        true
    }

    /// A packet goes up from `at` at `t`: queued at the controller, handled in order.
    /// Only SYNs are ever dropped for a full queue (`send_syn_up`): the
    /// handshakes' later segments are retransmitted by real hosts, not modelled here.
    fn send_up(&mut self, t: u64, at: Attach, data: Bytes) {
        *self.pin_queued.entry(at.dpid).or_default() += 1;
        self.push(t, Ev::Up(at, data));
    }

    fn up(&mut self, at: Attach, data: Bytes) {
        self.ctl_queue.push_back((self.now, at, data));
        if !self.ctl_busy {
            self.ctl_busy = true;
            self.push(self.now, Ev::Handle);
        }
    }

    /// The controller handles the next PACKET_IN: it costs `controller_cost`, or
    /// `refusal_share` of that for a new connection's SYN it did not place (refused with a RST, or
    /// dropped by its gate), and its answer leaves when the work is done.
    fn handle(&mut self) {
        let Some((arrived, at, data)) = self.ctl_queue.pop_front() else {
            self.ctl_busy = false;
            return;
        };
        if let Some(q) = self.pin_queued.get_mut(&at.dpid) {
            *q = q.saturating_sub(1);
        }
        let syn = is_new_syn(&data);
        let pi = PacketIn::table_miss(at.port, data);
        let now = self.at(self.now);
        self.c
            .handle_message(now, at.dpid, &Message::PacketIn(pi), &mut self.out);
        let msgs: Vec<(u64, Message)> = self.out.drain().collect();
        let cost = if syn && !msgs.iter().any(|(_, m)| places_a_connection(m)) {
            self.sc.refusal_cost()
        } else {
            self.sc.controller_cost
        };
        self.packet_ins += 1;
        self.work.packet_ins += 1;
        self.work.busy += cost;
        self.ctl_busy_ns += cost.as_nanos() as f64;
        self.work.queueing = self
            .work
            .queueing
            .max(Duration::from_nanos(self.now - arrived));
        let done = self.now + cost.as_nanos() as u64;
        self.apply_msgs(done, msgs);
        self.push(done, Ev::Handle);
    }

    fn at_server(&mut self, id: u64) {
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        let Some(b) = conn.backend else { return };
        conn.at_server = self.now;
        let phase = conn.phase;
        if self.faulty[usize::from(b)] {
            self.phases[phase].to_faulty += 1;
            let recovered = self
                .sc
                .recover_at
                .is_some_and(|r| self.now >= self.start + r.as_nanos() as u64);
            if !recovered && drops(self.sc.seed, id, self.sc.drop_share) {
                // Nothing answers: the client's SYN timer runs on (`syn_timer`).
                conn.silenced = true;
                return;
            }
        }
        let s = &mut self.servers[usize::from(b)];
        match s.arrive(self.now, id) {
            Admit::Started => {
                let d = self.service_time(usize::from(b));
                self.push(self.now + d, Ev::Done(id));
            }
            Admit::Queued => {}
            Admit::Refused => {
                self.phases[phase].server_refused += 1;
                self.series_counts.2 += 1;
                self.close(id);
            }
        }
    }

    fn service_time(&mut self, b: usize) -> u64 {
        let u: f64 = self.service.r#gen::<f64>().max(1e-12);
        (-u.ln() * self.servers[b].mean_service_ns) as u64
    }

    fn done(&mut self, id: u64) {
        let Some(conn) = self.conns.get(&id) else {
            return;
        };
        let (Some(b), at, first, phase) = (conn.backend, conn.at_server, conn.first, conn.phase)
        else {
            return;
        };
        let b = usize::from(b);
        if let Some(next) = self.servers[b].complete(self.now, at) {
            let d = self.service_time(b);
            self.push(self.now + d, Ev::Done(next));
        }
        let half = self.sc.rtt.as_nanos() as u64 / 2;
        let rt_us = (self.now + half - first) / 1000;
        let p = &mut self.phases[phase];
        p.served += 1;
        let _ = p.rt.record(rt_us.max(1));
        self.series_counts.1 += 1;
        self.close(id);
    }

    /// The client of a connection its server dropped gives up (its third SYN unanswered):
    /// its rules, which no packet ever passed, idle out `idle_timeout` after the last was
    /// installed, and their FLOW_REMOVEDs report no packet (the controller judged the
    /// connection silent at its client's third SYN already).
    fn give_up_silenced(&mut self, id: u64) {
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        conn.state = State::Ended;
        let phase = conn.phase;
        let ends = conn
            .rules
            .iter()
            .map(|r| r.at + u64::from(r.idle_timeout) * SEC)
            .max();
        self.phases[phase].dropped_by_server += 1;
        self.series_counts.2 += 1;
        match ends {
            Some(t) => self.push(t.max(self.now), Ev::RulesEnd(id)),
            // Deferred to the client's ACK, which never came: no rules to end.
            None => {
                self.end_conn(id);
            }
        }
    }

    /// The connection is over (its response sent, or refused by its server): its rules
    /// go `fin_timeout` after the FIN (or RST) passes.
    fn close(&mut self, id: u64) {
        if let Some(conn) = self.conns.get_mut(&id) {
            conn.state = State::Ended;
        }
        self.push(self.now + self.fin_timeout, Ev::RulesEnd(id));
    }

    fn rules_end(&mut self, id: u64) {
        let Some(conn) = self.end_conn(id) else {
            return;
        };
        let now = self.at(self.now);
        let packets = if conn.silenced { 0 } else { 8 };
        for r in conn.rules {
            if let Some(sw) = self.switches.get_mut(&r.dpid) {
                sw.conn_rule_gone();
            }
            if !r.flow_rem {
                continue;
            }
            let age = self.now.saturating_sub(r.at);
            let fr = FlowRemoved {
                cookie: r.cookie,
                priority: r.priority,
                reason: FlowRemovedReason::IdleTimeout,
                table_id: 0,
                duration_sec: (age / SEC) as u32,
                duration_nsec: (age % SEC) as u32,
                idle_timeout: r.idle_timeout,
                hard_timeout: 0,
                // The controller reads only whether a rule saw packets: at the client's
                // edge the reverse rule's count says whether the backend answered. Every
                // connection here got an answer (its response, or a full queue's RST),
                // but those a faulty server dropped.
                packet_count: packets,
                byte_count: packets * 256,
                match_: r.match_,
            };
            self.c
                .handle_message(now, r.dpid, &Message::FlowRemoved(fr), &mut self.out);
        }
        self.apply(self.now);
    }

    /// The connection leaves the tables; returned, if it was there.
    fn end_conn(&mut self, id: u64) -> Option<Conn> {
        let conn = self.conns.remove(&id)?;
        let key = (self.clients[conn.client as usize].ip, conn.port);
        if self.by_key.get(&key) == Some(&id) {
            self.by_key.remove(&key);
        }
        Some(conn)
    }

    fn tick(&mut self) {
        let every = self.c.config().refresh_interval.as_nanos() as u64;
        let report = self.sc.report_every.as_nanos() as u64;
        let now = self.at(self.now);
        if self.now % report < every {
            for (i, s) in self.servers.iter_mut().enumerate() {
                s.report(self.now);
                let load = LoadSample {
                    rps: Some(s.rps),
                    active: Some(f64::from(s.active())),
                    response_time_ms: s.rt_ms,
                    cpu: Some(s.cpu),
                };
                self.c.handle_backend_load(now, 0, i, load);
            }
        }
        // The controller's own work since the last tick, as the runtime measures it.
        let shed = self.c.shed_total();
        let shed_n = shed.saturating_sub(self.shed_seen);
        self.shed_seen = shed;
        let mut work = std::mem::take(&mut self.work);
        work.shed = self.sc.refusal_cost() * shed_n as u32;
        if work.packet_ins > 0 {
            self.c.record_packet_in_work(work);
        }
        self.c.handle_tick(now, &mut self.out);
        self.apply(self.now);
        self.watch_ejections(now);
        self.mark_phase();
        if self.now % SAMPLE < every {
            self.sample();
        }
        if self.now < self.end + self.drain() {
            self.push(self.now + every, Ev::Tick);
        }
    }

    /// Each ejection the controller's outlier detection made, as it starts: a new end of
    /// ejection, in force (one that starts as the last ends, within a tick, too).
    fn watch_ejections(&mut self, now: Instant) {
        let Some(s) = self.c.services().first() else {
            return;
        };
        for (i, seen) in self.ejected.iter_mut().enumerate() {
            let Some(h) = s.outliers.host(i) else {
                continue;
            };
            let until = h.ejected_until().filter(|_| h.is_ejected(now));
            if until.is_some() && until != *seen {
                *seen = until;
                self.ejections.push(Ejection {
                    server: i,
                    faulty: self.faulty.get(i).copied().unwrap_or(false),
                    at_s: self.now.saturating_sub(self.start) as f64 / 1e9,
                    detector: h.ejected_by().map_or("", |d| d.as_str()),
                });
            }
        }
    }
}

/// Whether a faulty server drops connection `id`: a fixed draw of the connection's, so its
/// retransmitted SYNs meet the same fate, with probability `share`.
fn drops(seed: u64, id: u64, share: f64) -> bool {
    // SplitMix64's finalizer: a well-mixed 64-bit value of the id.
    let mut z = id ^ seed.rotate_left(17) ^ 0x9e37_79b9_7f4a_7c15;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    ((z >> 11) as f64 / (1u64 << 53) as f64) < share
}
