//! One emulated OpenFlow 1.3 switch, cbench's `fakeswitch` for 1.3: it answers the
//! handshake, makes its hosts "exist" (gratuitous ARP from the backends and the client),
//! asks for the VIP's MAC by ARP like a client would, then sends TCP SYN PACKET_INs and
//! checks each answer.
//!
//! A VIP answer is complete when three messages naming the probe's 5-tuple have arrived:
//! the forward FLOW_MOD (match on the SYN's 5-tuple, set `ipv4_dst` to a backend, output
//! to that backend's port), the reverse FLOW_MOD (match backend → client on the same ports,
//! set `ipv4_src` back to the VIP, output to the client's port) and the PACKET_OUT of the
//! SYN itself toward the same backend. Nothing about cookies or priorities is assumed, so
//! any OpenFlow 1.3 VIP balancer can be measured. In L2 mode (learning switches) every
//! FLOW_MOD ADD and every non-LLDP PACKET_OUT counts as one response, as in cbench.

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use flowgate_packet::{self as packet, L3, MacAddr};
use hdrhistogram::Histogram;
use ofp::{
    Action, FlowModCommand, Instruction, Match, Message, MultipartReply, MultipartReplyBody,
    MultipartRequestBody, Oxm, PacketIn, PacketInReason,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// What counts as an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
pub enum CheckMode {
    /// A VIP balancer's answer: forward rule, reverse rule, PACKET_OUT, all consistent.
    Vip,
    /// cbench's rule: any FLOW_MOD ADD or non-LLDP PACKET_OUT is one response.
    L2,
}

/// How probes are sent.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Pace {
    /// Keep this many probes outstanding per switch (1 = cbench's latency mode).
    Window(usize),
    /// Open loop: this many probes per second from this switch, on a fixed schedule
    /// ([`OpenLoop`], whatever the answers do); latency counts from the send.
    Rate(f64),
}

/// The open-loop schedule of a group of switches, whatever the answers do: probe `j` of
/// the group is due `j / rate` seconds after the start; probes go in batches of `batch`
/// consecutive ones (about [`STEP`]'s worth), batch `g` from switch `g mod n`, all of it
/// when its first probe falls due.
///
/// tokio's timers step in whole milliseconds, which sent every switch's millisecond of
/// probes at once (at 260,000/s, 260 at the controller together every millisecond: the
/// latency measured that burst). Here the switches take turns: at 260,000/s a batch of
/// 16 every 62 µs (16 switches: as many probes per write as before) (the controller's and the bench's
/// CPU per setup depend on it) but never more than one batch at once. Each switch sends
/// its batches as they fall due whenever it runs anyway (reading answers), and a thread
/// of its own wakes those that have a batch due and did not run, on a timerfd: exact to
/// microseconds where a timeout in tokio's reactor rounds to a millisecond.
pub struct OpenLoop {
    rate: f64,
    batch: u64,
    slots: Vec<Slot>,
    /// When probe 0 was due (set by the stepping thread at `RunFlags::go`).
    start: std::sync::OnceLock<Instant>,
    /// The switches are gone: stop stepping (as at `RunFlags::stop`).
    done: AtomicBool,
}

#[derive(Debug, Default)]
struct Slot {
    /// Probes of this switch sent (or dropped, its queue full) so far.
    taken: AtomicU64,
    wake: tokio::sync::Notify,
}

/// The schedule's step: a batch per step, of as many probes as fall due in it, one
/// probe at least (below 16,000/s, a probe per step at its exact time).
const STEP: Duration = Duration::from_micros(62);
/// The stepping thread's longest sleep: it notices the end of the run within this.
const MAX_STEP: Duration = Duration::from_millis(10);

impl OpenLoop {
    /// `rate` probes per second over `switches` switches.
    pub fn new(rate: f64, switches: usize) -> Arc<OpenLoop> {
        let rate = rate.max(1e-3);
        Arc::new(OpenLoop {
            rate,
            batch: (rate * STEP.as_secs_f64()).round().max(1.0) as u64,
            slots: (0..switches.max(1)).map(|_| Slot::default()).collect(),
            start: std::sync::OnceLock::new(),
            done: AtomicBool::new(false),
        })
    }

    /// Step the schedule from `flags.go` until `flags.stop` (or [`OpenLoop::finish`]), on
    /// a thread of its own (`spawn_blocking`).
    pub fn spawn(
        self: &Arc<Self>,
        flags: Arc<RunFlags>,
    ) -> tokio::task::JoinHandle<Result<(), String>> {
        let this = self.clone();
        tokio::task::spawn_blocking(move || this.drive(&flags))
    }

    /// The switches are done with the schedule.
    pub fn finish(&self) {
        self.done.store(true, Ordering::Relaxed);
    }

    fn over(&self, flags: &RunFlags) -> bool {
        flags.stop.load(Ordering::Relaxed) || self.done.load(Ordering::Relaxed)
    }

    /// Probes of switch `i` due by `now` since the start (all of them, sent or not).
    fn due(&self, i: usize, now: Instant) -> u64 {
        let Some(start) = self.start.get() else {
            return 0;
        };
        // Probe j is the last one due; batches 0..=j / batch have started.
        let j = (now.saturating_duration_since(*start).as_secs_f64() * self.rate) as u64;
        let (g, n, i) = (j / self.batch, self.slots.len() as u64, i as u64);
        // Batch g is switch g mod n's.
        let batches = if g >= i { (g - i) / n + 1 } else { 0 };
        batches * self.batch
    }

    fn drive(&self, flags: &RunFlags) -> Result<(), String> {
        while !flags.go.load(Ordering::Relaxed) {
            if self.over(flags) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let step = Duration::from_secs_f64(self.batch as f64 / self.rate).min(MAX_STEP);
        let timer = step_timer(step).map_err(|e| format!("open-loop timer: {e}"))?;
        let _ = self.start.set(Instant::now());
        // Per switch, the probes it was last woken for: no second wake-up for them.
        let mut woken = vec![0u64; self.slots.len()];
        let mut expirations = [0u8; 8];
        while !self.over(flags) {
            let now = Instant::now();
            for (i, (s, w)) in self.slots.iter().zip(&mut woken).enumerate() {
                let due = self.due(i, now);
                if due > s.taken.load(Ordering::Relaxed).max(*w) {
                    *w = due;
                    s.wake.notify_one();
                }
            }
            // Blocks until the next expiry; their count is not needed (the clock is read).
            rustix::io::read(&timer, &mut expirations[..])
                .map_err(|e| format!("open-loop timer: {e}"))?;
        }
        Ok(())
    }

    /// Switch `i` sends its probes due by `now`: how many (at most 100,000 at once, so a
    /// stalled bench catches up over several turns).
    fn take(&self, i: usize, now: Instant) -> u64 {
        let Some(s) = self.slots.get(i) else {
            return 0;
        };
        let taken = s.taken.load(Ordering::Relaxed);
        let k = self.due(i, now).saturating_sub(taken).min(100_000);
        s.taken.store(taken + k, Ordering::Relaxed);
        k
    }

    async fn woken(&self, i: usize) {
        match self.slots.get(i) {
            Some(s) => s.wake.notified().await,
            None => std::future::pending().await,
        }
    }
}

/// Wakes when the open-loop schedule has probes for this switch (never without one).
async fn probes_due(open: Option<&(Arc<OpenLoop>, usize)>) {
    match open {
        Some((o, i)) => o.woken(*i).await,
        None => std::future::pending().await,
    }
}

/// A periodic timerfd, read blocking: its expiries are exact (timer slack applies to
/// sleeps and timeouts, not to it).
fn step_timer(step: Duration) -> std::io::Result<std::os::fd::OwnedFd> {
    use rustix::time::{Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags};
    let fd = rustix::time::timerfd_create(TimerfdClockId::Monotonic, TimerfdFlags::CLOEXEC)?;
    let ts = rustix::time::Timespec::try_from(step)
        .map_err(|_| std::io::Error::other("step out of range"))?;
    rustix::time::timerfd_settime(
        &fd,
        TimerfdTimerFlags::empty(),
        &Itimerspec {
            it_interval: ts,
            it_value: ts,
        },
    )?;
    Ok(fd)
}

/// The addresses one switch's hosts use.
#[derive(Debug, Clone)]
pub struct SwitchPlan {
    pub dpid: u64,
    pub vip: Ipv4Addr,
    pub vport: u16,
    /// Backend IP, MAC and switch port (2, 3, 4, ...).
    pub backends: Vec<(Ipv4Addr, MacAddr, u32)>,
    pub client_mac: MacAddr,
    /// Clients are `client_base.a.b` with `a.b` varying (one /16 per switch).
    pub client_base: [u8; 2],
    pub client_port: u32,
}

impl SwitchPlan {
    fn client_of(&self, k: u64) -> (Ipv4Addr, u16) {
        // 60,000 source ports per client address, then the next address.
        let port = 1024 + (k % 60_000) as u16;
        let host = (k / 60_000) as u16;
        let ip = Ipv4Addr::new(
            self.client_base[0],
            self.client_base[1],
            (host >> 8) as u8,
            (host & 0xff) as u8,
        );
        (ip, port)
    }

    fn backend_by_ip(&self, ip: Ipv4Addr) -> Option<usize> {
        self.backends.iter().position(|b| b.0 == ip)
    }
}

/// Counters one switch shares with the measuring loop.
#[derive(Debug, Default)]
pub struct SwitchCounters {
    pub sent: AtomicU64,
    /// Every PACKET_IN queued for the controller (probes, and the handshakes' SYN-ACKs
    /// and ACKs). The queue is bounded ([`SEND_QUEUE_LIMIT`]), so over a run this is what
    /// the controller read, within a queue's worth.
    pub packet_ins: AtomicU64,
    pub valid: AtomicU64,
    pub invalid: AtomicU64,
    pub lost: AtomicU64,
    /// Open loop: probes due while the switch's queue to the controller was full, never
    /// sent (see [`SEND_QUEUE_LIMIT`]).
    pub not_sent: AtomicU64,
    /// Probes whose rules the controller deferred to the client's ACK (it sent the SYN
    /// on alone); the switch then plays the backend's SYN-ACK and the client's ACK.
    pub deferred: AtomicU64,
    /// Handshake done and hosts announced.
    pub ready: AtomicBool,
    /// The VIP's MAC was learned by ARP.
    pub vip_arp_answered: AtomicBool,
}

/// Shared run state.
#[derive(Debug, Default)]
pub struct RunFlags {
    /// Start sending probes.
    pub go: AtomicBool,
    /// Record latencies (after warm-up).
    pub measuring: AtomicBool,
    /// Stop.
    pub stop: AtomicBool,
}

#[derive(Debug, Clone)]
struct Pending {
    sent: Instant,
    fwd: Option<usize>,
    rev: bool,
    out: Option<usize>,
    /// The controller sent the SYN on without rules (`controller::handshake`): the
    /// probe completes with the rules and the PACKET_OUT of the client's ACK.
    deferred: bool,
    /// The client's SYN's sequence number.
    isn: u32,
    /// The rules that asked for OFPFF_SEND_FLOW_REM, to report when they "idle out".
    removals: Vec<ofp::FlowRemoved>,
}

/// The first invalid answers, kept for the report.
pub type Samples = Vec<String>;

pub struct SwitchResult {
    pub hist: Histogram<u64>,
    pub samples: Samples,
    pub error: Option<String>,
    /// Per backend of the plan (by index): complete VIP answers naming it, and when the
    /// first one completed (`bench cluster` times a spill by it).
    pub by_backend: Vec<(u64, Option<Instant>)>,
}

struct Sw {
    plan: SwitchPlan,
    check: CheckMode,
    pace: Pace,
    counters: Arc<SwitchCounters>,
    flags: Arc<RunFlags>,
    wbuf: BytesMut,
    xid: u32,
    next_probe: u64,
    pending: HashMap<(Ipv4Addr, u16), Pending, ahash::RandomState>,
    /// L2 mode: send times of outstanding probes, oldest first.
    fifo: VecDeque<Instant>,
    vip_mac: MacAddr,
    hist: Histogram<u64>,
    samples: Samples,
    /// Open loop: the schedule and this switch's place in it.
    open: Option<(Arc<OpenLoop>, usize)>,
    hello_seen: bool,
    /// A probe without a complete answer after this long is lost.
    timeout: Duration,
    /// Connections end: once more than this many are live, the oldest one's rules idle
    /// out and FLOW_REMOVED is sent for those that asked for it (0 = never).
    expire_after: usize,
    live: VecDeque<Vec<ofp::FlowRemoved>>,
    by_backend: Vec<(u64, Option<Instant>)>,
    /// The queue to the controller is full: open-loop probes are not sent.
    backlogged: bool,
}

/// Bytes an emulated switch holds for the controller beyond what the socket took; an
/// open-loop probe due while more is queued is dropped, not sent. A switch's queue of
/// PACKET_INs is bounded (Open vSwitch holds at most 100 per controller connection,
/// `rconn_send_with_limit` in `ofproto/connmgr.c`), so a flood beyond what the controller
/// reads is dropped at the switch rather than queued without end and timed out here.
const SEND_QUEUE_LIMIT: usize = 256 * 1024;

/// One emulated switch: what it connects to, sends, checks and counts.
pub struct SwitchRun {
    pub controller: SocketAddr,
    pub plan: SwitchPlan,
    pub check: CheckMode,
    pub pace: Pace,
    /// A probe without a complete answer after this long is lost.
    pub timeout: Duration,
    /// See `Sw::expire_after`.
    pub expire_after: usize,
    pub counters: Arc<SwitchCounters>,
    pub flags: Arc<RunFlags>,
}

/// Run one emulated switch until `flags.stop` (open loop: on a schedule of its own).
pub async fn run_switch(run: SwitchRun) -> SwitchResult {
    let open = match run.pace {
        Pace::Rate(r) => Some(OpenLoop::new(r, 1)),
        Pace::Window(_) => None,
    };
    let driver = open.as_ref().map(|o| o.spawn(run.flags.clone()));
    let mut r = run_switch_in(run, open.clone().map(|o| (o, 0))).await;
    if let (Some(d), Some(o)) = (driver, open) {
        o.finish();
        if let Ok(Err(e)) = d.await {
            r.error.get_or_insert(e);
        }
    }
    r
}

/// Run one emulated switch until `flags.stop`; open loop, as switch `i` of the schedule
/// `open` (driven by the caller, [`OpenLoop::spawn`]).
pub async fn run_switch_in(run: SwitchRun, open: Option<(Arc<OpenLoop>, usize)>) -> SwitchResult {
    let SwitchRun {
        controller,
        plan,
        check,
        pace,
        timeout,
        expire_after,
        counters,
        flags,
    } = run;
    let mut sw = Sw {
        plan,
        check,
        pace,
        counters,
        flags,
        wbuf: BytesMut::with_capacity(256 * 1024),
        xid: 1,
        next_probe: 0,
        pending: HashMap::default(),
        fifo: VecDeque::new(),
        vip_mac: MacAddr([0x02, 0x66, 0x67, 0, 0, 1]),
        hist: Histogram::new_with_bounds(1, 60_000_000, 3).expect("histogram bounds are valid"),
        samples: Vec::new(),
        open,
        hello_seen: false,
        timeout,
        expire_after,
        live: VecDeque::new(),
        by_backend: Vec::new(),
        backlogged: false,
    };
    sw.by_backend = vec![(0, None); sw.plan.backends.len()];
    let error = sw.run(controller).await.err();
    SwitchResult {
        hist: sw.hist,
        samples: sw.samples,
        error,
        by_backend: sw.by_backend,
    }
}

impl Sw {
    async fn run(&mut self, controller: SocketAddr) -> Result<(), String> {
        let mut stream = TcpStream::connect(controller)
            .await
            .map_err(|e| format!("connect {controller}: {e}"))?;
        let _ = stream.set_nodelay(true);
        let mut rbuf = BytesMut::with_capacity(256 * 1024);
        let mut framer = ofp::Framer::new();
        self.send(&Message::Hello(ofp::Hello::ours()));
        // Probes go out on answers (windows) or on the open-loop schedule's wake-ups: the
        // tick only starts windows, notices `stop` and times out the lost.
        let mut tick = tokio::time::interval(Duration::from_millis(10));
        let open = self.open.clone();
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut last_sweep = Instant::now();
        let (mut rd, mut wr) = stream.split();
        // What is being written now; new messages go to `wbuf` meanwhile. Reading and
        // writing race each other: a switch that stopped reading while its own writes are
        // held back (the controller's socket full) would queue the controller's answers
        // and measure its own I/O, not the controller.
        let mut out = BytesMut::with_capacity(256 * 1024);
        loop {
            if out.is_empty() {
                std::mem::swap(&mut out, &mut self.wbuf);
            }
            if self.flags.stop.load(Ordering::Relaxed) {
                return Ok(());
            }
            rbuf.reserve(64 * 1024);
            tokio::select! {
                r = rd.read_buf(&mut rbuf) => {
                    let n = r.map_err(|e| format!("read: {e}"))?;
                    if n == 0 {
                        return Err("the controller closed the connection".into());
                    }
                    let now = Instant::now();
                    while let Some(frame) = framer.next_frame(&mut rbuf).map_err(|e| format!("framing: {e}"))? {
                        let version = frame.first().copied().unwrap_or(0);
                        if version != ofp::OFP_VERSION && self.hello_seen {
                            return Err(format!("the controller speaks wire version {version}, not OpenFlow 1.3"));
                        }
                        match ofp::decode(frame) {
                            // By reference: a `Message` is 792 bytes.
                            Ok((xid, msg)) => self.on_message(now, xid, &msg),
                            Err(e) => return Err(format!("undecodable message: {e}")),
                        }
                    }
                }
                w = wr.write_buf(&mut out), if !out.is_empty() => {
                    w.map_err(|e| format!("write: {e}"))?;
                    continue;
                }
                _ = tick.tick() => {}
                () = probes_due(open.as_ref()) => {}
            }
            let now = Instant::now();
            self.backlogged = out.len() + self.wbuf.len() > SEND_QUEUE_LIMIT;
            if self.flags.go.load(Ordering::Relaxed) {
                self.pace_probes(now);
            }
            if now.duration_since(last_sweep) > Duration::from_millis(100) {
                last_sweep = now;
                self.sweep(now);
            }
        }
    }

    fn send(&mut self, msg: &Message) {
        self.xid = self.xid.wrapping_add(1);
        let _ = ofp::encode(self.xid, msg, &mut self.wbuf);
    }

    fn reply(&mut self, xid: u32, msg: &Message) {
        let _ = ofp::encode(xid, msg, &mut self.wbuf);
    }

    fn packet_in(&mut self, in_port: u32, data: Bytes) {
        self.counters.packet_ins.fetch_add(1, Ordering::Relaxed);
        let total_len = data.len() as u16;
        self.send(&Message::PacketIn(PacketIn {
            buffer_id: ofp::NO_BUFFER,
            total_len,
            reason: PacketInReason::NoMatch,
            table_id: 0,
            cookie: u64::MAX,
            match_: Match::new().with(Oxm::InPort(in_port)),
            data,
        }));
    }

    /// cbench's `-L`: the hosts announce themselves, and the client asks for the VIP.
    fn announce_hosts(&mut self) {
        let plan = self.plan.clone();
        for &(ip, mac, port) in &plan.backends {
            let garp = packet::arp_frame(
                mac,
                MacAddr::BROADCAST,
                None,
                &packet::Arp {
                    op: packet::ARP_OP_REQUEST,
                    sha: mac,
                    spa: ip,
                    tha: MacAddr::ZERO,
                    tpa: ip,
                },
            );
            self.packet_in(port, garp);
        }
        let (cip, _) = plan.client_of(0);
        let ask = packet::arp_request(plan.client_mac, cip, plan.vip);
        self.packet_in(plan.client_port, ask);
        self.counters.ready.store(true, Ordering::Relaxed);
    }

    fn on_message(&mut self, now: Instant, xid: u32, msg: &Message) {
        match msg {
            Message::Hello(_) => self.hello_seen = true,
            Message::FeaturesRequest => {
                self.reply(
                    xid,
                    &Message::FeaturesReply(ofp::SwitchFeatures {
                        datapath_id: self.plan.dpid,
                        n_buffers: 0,
                        n_tables: 254,
                        auxiliary_id: 0,
                        capabilities: 0x4f,
                    }),
                );
                self.announce_hosts();
            }
            Message::EchoRequest(d) => self.reply(xid, &Message::EchoReply(d.clone())),
            Message::BarrierRequest => self.reply(xid, &Message::BarrierReply),
            Message::GetConfigRequest => self.reply(
                xid,
                &Message::GetConfigReply(ofp::SwitchConfig {
                    flags: 0,
                    miss_send_len: ofp::CONTROLLER_MAX_LEN_NO_BUFFER,
                }),
            ),
            Message::RoleRequest(r) => {
                self.reply(xid, &Message::RoleReply(*r));
                // A cluster member writes only once the switch confirmed it MASTER, so its
                // answer to the client's first ARP may have been dropped: the client asks
                // again, as a real host retries.
                if r.role == ofp::ControllerRole::Master
                    && !self.counters.vip_arp_answered.load(Ordering::Relaxed)
                {
                    let (cip, _) = self.plan.client_of(0);
                    let ask = packet::arp_request(self.plan.client_mac, cip, self.plan.vip);
                    self.packet_in(self.plan.client_port, ask);
                }
            }
            Message::GetAsyncRequest => {}
            Message::MultipartRequest(req) => {
                let body = match &req.body {
                    MultipartRequestBody::Desc => MultipartReplyBody::Desc(Box::new(ofp::Desc {
                        mfr_desc: ofp::FixedStr::new("flowgate"),
                        hw_desc: ofp::FixedStr::new("emulated switch"),
                        sw_desc: ofp::FixedStr::new("flowgate bench controller"),
                        serial_num: ofp::FixedStr::new("0"),
                        dp_desc: ofp::FixedStr::new("bench"),
                    })),
                    MultipartRequestBody::PortDesc => MultipartReplyBody::PortDesc(self.ports()),
                    MultipartRequestBody::Flow(_) => MultipartReplyBody::Flow(Vec::new()),
                    _ => return,
                };
                self.reply(xid, &Message::MultipartReply(MultipartReply::new(body)));
            }
            Message::FlowMod(fm) => self.on_flow_mod(now, fm),
            Message::PacketOut(po) => self.on_packet_out(now, po),
            _ => {}
        }
    }

    fn ports(&self) -> Vec<ofp::PortDesc> {
        let mut ports = vec![self.plan.client_port];
        ports.extend(self.plan.backends.iter().map(|b| b.2));
        ports
            .into_iter()
            .map(|p| ofp::PortDesc {
                port_no: p,
                hw_addr: [0x02, 0xee, 0, (self.plan.dpid & 0xff) as u8, 0, p as u8],
                name: ofp::FixedStr::new(&format!("s{}-eth{p}", self.plan.dpid)),
                config: 0,
                state: 4, // OFPPS_LIVE
                curr: 0x2000 | 0x800,
                advertised: 0,
                supported: 0,
                peer: 0,
                curr_speed: 10_000_000,
                max_speed: 10_000_000,
            })
            .collect()
    }

    // ----- probes ------------------------------------------------------------------------

    fn probe_frame(&self, k: u64) -> (Ipv4Addr, u16, Bytes) {
        let (ip, port) = self.plan.client_of(k);
        let src_mac = match self.check {
            CheckMode::Vip => self.plan.client_mac,
            // A learning switch learns a new MAC per probe (cbench's -M).
            CheckMode::L2 => {
                let h = k % 100_000;
                MacAddr([
                    0x02,
                    0xcc,
                    self.plan.dpid as u8,
                    (h >> 16) as u8,
                    (h >> 8) as u8,
                    h as u8,
                ])
            }
        };
        let dst_mac = match self.check {
            CheckMode::Vip => self.vip_mac,
            CheckMode::L2 => self.plan.backends[0].1,
        };
        let data = packet::tcp_syn(
            src_mac,
            dst_mac,
            SocketAddrV4::new(ip, port),
            SocketAddrV4::new(self.plan.vip, self.plan.vport),
            probe_isn(k),
        );
        (ip, port, data)
    }

    /// The controller sent probe `key`'s SYN to backend `b` without rules: play the
    /// backend's SYN-ACK, which must come back rewritten to the VIP.
    fn answer_syn(&mut self, key: (Ipv4Addr, u16), b: usize) {
        let Some(p) = self.pending.get_mut(&key) else {
            return;
        };
        p.deferred = true;
        let isn = p.isn;
        self.counters.deferred.fetch_add(1, Ordering::Relaxed);
        let (bip, bmac, bport) = self.plan.backends[b];
        let syn_ack = packet::ipv4_tcp(&packet::TcpSegment {
            eth_src: bmac,
            eth_dst: self.plan.client_mac,
            ip_src: bip,
            ip_dst: key.0,
            src_port: self.plan.vport,
            dst_port: key.1,
            seq: isn ^ 0x5a5a_5a5a,
            ack: isn.wrapping_add(1),
            flags: packet::TcpFlags(0x12),
            ..packet::TcpSegment::default()
        });
        self.packet_in(bport, syn_ack);
    }

    /// The SYN-ACK of a deferred probe came back through the controller: check it, and
    /// play the client's ACK.
    fn answer_syn_ack(&mut self, key: (Ipv4Addr, u16), actions: &[Action], seq: u32) {
        let Some(isn) = self.pending.get(&key).filter(|p| p.deferred).map(|p| p.isn) else {
            return;
        };
        let set_src = actions.iter().find_map(|a| match a {
            Action::SetField(Oxm::Ipv4Src { value, .. }) => Some(*value),
            _ => None,
        });
        let out = output_port(actions);
        if set_src != Some(self.plan.vip) || out != Some(self.plan.client_port) {
            self.invalid(
                Some(key),
                format!("SYN-ACK of {key:?}: set ipv4_src {set_src:?}, output {out:?}"),
            );
            return;
        }
        let ack = packet::ipv4_tcp(&packet::TcpSegment {
            eth_src: self.plan.client_mac,
            eth_dst: self.vip_mac,
            ip_src: key.0,
            ip_dst: self.plan.vip,
            src_port: key.1,
            dst_port: self.plan.vport,
            seq: isn.wrapping_add(1),
            ack: seq.wrapping_add(1),
            flags: packet::TcpFlags::ACK,
            ..packet::TcpSegment::default()
        });
        self.packet_in(self.plan.client_port, ack);
    }

    fn send_probe(&mut self, sent: Instant) {
        let k = self.next_probe;
        self.next_probe += 1;
        let (ip, port, data) = self.probe_frame(k);
        match self.check {
            CheckMode::Vip => {
                self.pending.insert(
                    (ip, port),
                    Pending {
                        sent,
                        fwd: None,
                        rev: false,
                        out: None,
                        deferred: false,
                        isn: probe_isn(k),
                        removals: Vec::new(),
                    },
                );
            }
            CheckMode::L2 => self.fifo.push_back(sent),
        }
        self.packet_in(self.plan.client_port, data);
        self.counters.sent.fetch_add(1, Ordering::Relaxed);
    }

    fn outstanding(&self) -> usize {
        match self.check {
            CheckMode::Vip => self.pending.len(),
            CheckMode::L2 => self.fifo.len(),
        }
    }

    fn pace_probes(&mut self, now: Instant) {
        match self.pace {
            Pace::Window(w) => {
                while self.outstanding() < w {
                    self.send_probe(now);
                }
            }
            Pace::Rate(_) => {
                let due = self.open.as_ref().map_or(0, |(o, i)| o.take(*i, now));
                for _ in 0..due {
                    if self.backlogged {
                        self.counters.not_sent.fetch_add(1, Ordering::Relaxed);
                    } else {
                        self.send_probe(now);
                    }
                }
            }
        }
    }

    /// Probes that got no (complete) answer in time are lost.
    fn sweep(&mut self, now: Instant) {
        let before = self.outstanding();
        let timeout = self.timeout;
        match self.check {
            CheckMode::Vip => self
                .pending
                .retain(|_, p| now.saturating_duration_since(p.sent) < timeout),
            CheckMode::L2 => {
                while self
                    .fifo
                    .front()
                    .is_some_and(|t| now.saturating_duration_since(*t) >= timeout)
                {
                    self.fifo.pop_front();
                }
            }
        }
        let lost = before - self.outstanding();
        if lost > 0 {
            self.counters.lost.fetch_add(lost as u64, Ordering::Relaxed);
        }
    }

    fn record(&mut self, now: Instant, sent: Instant) {
        self.counters.valid.fetch_add(1, Ordering::Relaxed);
        if self.flags.measuring.load(Ordering::Relaxed) {
            let us = now.saturating_duration_since(sent).as_micros() as u64;
            let _ = self.hist.record(us.max(1));
        }
    }

    fn invalid(&mut self, key: Option<(Ipv4Addr, u16)>, why: String) {
        if let Some(k) = key {
            self.pending.remove(&k);
        }
        self.counters.invalid.fetch_add(1, Ordering::Relaxed);
        if self.samples.len() < 5 {
            self.samples.push(why);
        }
    }

    fn l2_response(&mut self, now: Instant) {
        if let Some(sent) = self.fifo.pop_front() {
            self.record(now, sent);
        }
    }

    fn on_flow_mod(&mut self, now: Instant, fm: &ofp::FlowMod) {
        if !matches!(
            fm.command,
            FlowModCommand::Add | FlowModCommand::ModifyStrict
        ) {
            return;
        }
        if self.check == CheckMode::L2 {
            self.l2_response(now);
            return;
        }
        let m = &fm.match_;
        let (Some(src), Some(dst), Some(sport), Some(dport)) =
            (m.ipv4_src(), m.ipv4_dst(), m.tcp_src(), m.tcp_dst())
        else {
            return; // Not a connection rule (table-miss, L2, intercept...).
        };
        let actions = apply_actions(&fm.instructions);
        if dst == self.plan.vip && dport == self.plan.vport {
            // Forward: client → VIP, rewritten to a backend.
            let key = (src, sport);
            if !self.pending.contains_key(&key) {
                return;
            }
            let removal = removal_of(self.expire_after, fm);
            match self.check_forward(m, &actions, key) {
                Ok(b) => self.part(
                    now,
                    key,
                    |p| {
                        p.fwd = Some(b);
                        p.removals.extend(removal);
                    },
                    Some(b),
                ),
                Err(why) => self.invalid(Some(key), why),
            }
        } else if sport == self.plan.vport && self.plan.backend_by_ip(src).is_some() {
            // Reverse: backend → client, rewritten back to the VIP.
            let key = (dst, dport);
            if !self.pending.contains_key(&key) {
                return;
            }
            let b = self.plan.backend_by_ip(src);
            let set_src = actions.iter().find_map(|a| match a {
                Action::SetField(Oxm::Ipv4Src { value, .. }) => Some(*value),
                _ => None,
            });
            let out = output_port(&actions);
            if set_src != Some(self.plan.vip) || out != Some(self.plan.client_port) {
                self.invalid(
                    Some(key),
                    format!("reverse rule for {key:?}: set ipv4_src {set_src:?}, output {out:?}"),
                );
                return;
            }
            let removal = removal_of(self.expire_after, fm);
            self.part(
                now,
                key,
                |p| {
                    p.rev = true;
                    p.removals.extend(removal);
                },
                b,
            );
        }
    }

    fn check_forward(
        &self,
        m: &Match,
        actions: &[Action],
        key: (Ipv4Addr, u16),
    ) -> Result<usize, String> {
        for oxm in m.iter() {
            let ok = match *oxm {
                Oxm::InPort(p) => p == self.plan.client_port,
                Oxm::EthType(t) => t == packet::ETH_TYPE_IPV4,
                Oxm::IpProto(p) => p == packet::IP_PROTO_TCP,
                Oxm::EthSrc { value, mask: None } => value == self.plan.client_mac.0,
                Oxm::Ipv4Src { mask: Some(_), .. } | Oxm::Ipv4Dst { mask: Some(_), .. } => false,
                _ => true,
            };
            if !ok {
                return Err(format!(
                    "forward rule for {key:?}: match field {oxm:?} does not fit the SYN"
                ));
            }
        }
        let dst = actions.iter().find_map(|a| match a {
            Action::SetField(Oxm::Ipv4Dst { value, .. }) => Some(*value),
            _ => None,
        });
        let Some(b) = dst.and_then(|d| self.plan.backend_by_ip(d)) else {
            return Err(format!(
                "forward rule for {key:?}: set ipv4_dst {dst:?} is no backend"
            ));
        };
        self.check_backend_actions(actions, b)
            .map_err(|e| format!("forward rule for {key:?}: {e}"))?;
        Ok(b)
    }

    fn check_backend_actions(&self, actions: &[Action], b: usize) -> Result<(), String> {
        let (_, mac, port) = self.plan.backends[b];
        for a in actions {
            if let Action::SetField(Oxm::EthDst { value, .. }) = a {
                if *value != mac.0 {
                    return Err(format!("set eth_dst {value:02x?} is not backend {b}'s MAC"));
                }
            }
        }
        match output_port(actions) {
            Some(p) if p == port => Ok(()),
            other => Err(format!("output {other:?}, backend {b} is on port {port}")),
        }
    }

    fn on_packet_out(&mut self, now: Instant, po: &ofp::PacketOut) {
        let Ok(frame) = packet::parse(&po.data) else {
            return;
        };
        match &frame.l3 {
            L3::Lldp(_) => {}
            L3::Arp(arp) => {
                if self.check == CheckMode::L2 {
                    self.l2_response(now);
                    return;
                }
                if arp.op == packet::ARP_OP_REPLY && arp.spa == self.plan.vip {
                    self.vip_mac = arp.sha;
                    self.counters
                        .vip_arp_answered
                        .store(true, Ordering::Relaxed);
                } else if arp.op == packet::ARP_OP_REQUEST {
                    // Answer for a backend, as the host itself would.
                    if let Some(&(ip, mac, port)) =
                        self.plan.backends.iter().find(|b| b.0 == arp.tpa)
                    {
                        let reply = packet::arp_reply(arp, mac);
                        let _ = ip;
                        self.packet_in(port, reply);
                    }
                }
            }
            L3::Ipv4(ip) => {
                if self.check == CheckMode::L2 {
                    self.l2_response(now);
                    return;
                }
                let Some(tcp) = frame.tcp() else {
                    return;
                };
                let actions: &[Action] = &po.actions;
                if ip.dst == self.plan.vip && tcp.dst_port == self.plan.vport {
                    let key = (ip.src, tcp.src_port);
                    if !self.pending.contains_key(&key) {
                        return;
                    }
                    let dst = actions.iter().find_map(|a| match a {
                        Action::SetField(Oxm::Ipv4Dst { value, .. }) => Some(*value),
                        _ => None,
                    });
                    let Some(b) = dst.and_then(|d| self.plan.backend_by_ip(d)) else {
                        self.invalid(
                            Some(key),
                            format!("PACKET_OUT of {key:?}: set ipv4_dst {dst:?} is no backend"),
                        );
                        return;
                    };
                    if let Err(e) = self.check_backend_actions(actions, b) {
                        self.invalid(Some(key), format!("PACKET_OUT of {key:?}: {e}"));
                        return;
                    }
                    let Some(p) = self.pending.get(&key) else {
                        return;
                    };
                    let syn = tcp.flags.is_initial_syn();
                    match (syn, p.deferred) {
                        // Rules first, then the SYN: the usual answer. The SYN alone: rules
                        // deferred to the client's ACK.
                        (true, false) if p.fwd.is_none() && !p.rev => self.answer_syn(key, b),
                        (true, false) | (false, true) => {
                            self.part(now, key, |p| p.out = Some(b), Some(b));
                        }
                        // A retransmission: the switch sends none.
                        (true, true) => {}
                        (false, false) => {
                            self.invalid(
                                Some(key),
                                format!("PACKET_OUT of {key:?} is not the SYN"),
                            );
                        }
                    }
                } else if self.plan.backend_by_ip(ip.src).is_some()
                    && tcp.src_port == self.plan.vport
                    && tcp.flags.syn()
                    && tcp.flags.ack()
                {
                    self.answer_syn_ack((ip.dst, tcp.dst_port), actions, tcp.seq);
                } else if ip.src == self.plan.vip || ip.dst != self.plan.vip {
                    // Something sent to a client instead (a RST, say): a wrong answer.
                    let key = (ip.dst, tcp.dst_port);
                    if self.pending.contains_key(&key) {
                        self.invalid(
                            Some(key),
                            format!("PACKET_OUT toward the client {key:?} (flags {:?}) instead of a backend", tcp.flags),
                        );
                    }
                }
            }
            _ => {}
        }
    }

    /// Record one part of a probe's answer; complete it when all three agree.
    fn part(
        &mut self,
        now: Instant,
        key: (Ipv4Addr, u16),
        set: impl FnOnce(&mut Pending),
        backend: Option<usize>,
    ) {
        let Some(p) = self.pending.get_mut(&key) else {
            return;
        };
        set(p);
        let (fwd, rev, out, sent) = (p.fwd, p.rev, p.out, p.sent);
        let agree = |x: Option<usize>| x.is_none() || x == fwd.or(out);
        if !agree(backend) || (fwd.is_some() && out.is_some() && fwd != out) {
            self.invalid(
                Some(key),
                format!("{key:?}: the rules and the PACKET_OUT name different backends"),
            );
            return;
        }
        if fwd.is_some() && rev && out.is_some() {
            if let Some(p) = self.pending.remove(&key) {
                if self.expire_after > 0 {
                    self.live.push_back(p.removals);
                    while self.live.len() > self.expire_after {
                        if let Some(rs) = self.live.pop_front() {
                            for r in rs {
                                self.send(&Message::FlowRemoved(r));
                            }
                        }
                    }
                }
            }
            if let Some(e) = fwd.and_then(|b| self.by_backend.get_mut(b)) {
                e.0 += 1;
                e.1.get_or_insert(now);
            }
            self.record(now, sent);
        }
    }
}

/// Probe `k`'s client ISN.
fn probe_isn(k: u64) -> u32 {
    (k as u32).wrapping_mul(2_654_435_761)
}

/// The FLOW_REMOVED a switch sends when this rule idles out, if the rule asked for one
/// and connections end in this run (`--expire-after`).
fn removal_of(expire_after: usize, fm: &ofp::FlowMod) -> Option<ofp::FlowRemoved> {
    if expire_after == 0 || !fm.flags.contains(ofp::FlowModFlags::SEND_FLOW_REM) {
        return None;
    }
    Some(ofp::FlowRemoved {
        cookie: fm.cookie,
        priority: fm.priority,
        reason: ofp::FlowRemovedReason::IdleTimeout,
        table_id: fm.table_id,
        duration_sec: u32::from(fm.idle_timeout),
        duration_nsec: 0,
        idle_timeout: fm.idle_timeout,
        hard_timeout: fm.hard_timeout,
        packet_count: 1,
        byte_count: 74,
        match_: fm.match_.clone(),
    })
}

/// The actions of the rule's apply- and write-actions instructions, in order; borrowed
/// when there is one list (the usual rule), copied only to join several.
fn apply_actions(instructions: &ofp::Instructions) -> Cow<'_, [Action]> {
    let mut lists = instructions.iter().filter_map(|i| match i {
        Instruction::ApplyActions(a) | Instruction::WriteActions(a) => Some(a.as_slice()),
        _ => None,
    });
    let Some(first) = lists.next() else {
        return Cow::Borrowed(&[]);
    };
    match lists.next() {
        None => Cow::Borrowed(first),
        Some(second) => {
            let mut v = first.to_vec();
            v.extend_from_slice(second);
            lists.for_each(|l| v.extend_from_slice(l));
            Cow::Owned(v)
        }
    }
}

fn output_port(actions: &[Action]) -> Option<u32> {
    actions.iter().find_map(|a| match a {
        Action::Output { port, .. } => Some(*port),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
