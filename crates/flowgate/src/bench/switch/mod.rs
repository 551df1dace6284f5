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
//!
//! A setup's latency runs from the write that handed the last of its probe to the kernel
//! to when the kernel stamped the arrival of the answer's last part (`stamped`): what the
//! bench's one thread adds on either side, reading and checking sixteen switches' answers
//! in turn, is not the controller's. Each run also keeps the latency counted to the
//! bench's read.
//!
//! `check`: what each part of an answer must say; `probe`: the PACKET_INs it sends,
//! written straight into its buffer; `open_loop`: the schedule of `Pace::Rate`;
//! `outstanding`: the probes awaiting their answers; `stamped`: reads with the kernel's
//! receive stamp.

use std::collections::VecDeque;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use flowgate_packet::{self as packet, L3, MacAddr};
use hdrhistogram::Histogram;
use ofp::{
    FlowModCommand, FlowModView, Message, MsgType, MultipartReply, MultipartReplyBody,
    MultipartRequestBody, PacketOutView,
};
mod check;
mod open_loop;
mod outstanding;
mod probe;
mod stamped;

use super::bursts;
use check::{Acts, check_forward, check_packet_out, connection_of};
pub use open_loop::OpenLoop;
use open_loop::probes_due;
use outstanding::{Outstanding, Pending, Verdict};
use probe::{SynTemplate, put_flow_removed, put_packet_in};
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
    /// ([`OpenLoop`], whatever the answers do); latency counts from the send (see the
    /// module's documentation).
    Rate(f64),
}

impl Pace {
    /// Are the slow setups kept, for [`bursts`]? Not with a window of many outstanding:
    /// each setup's latency is then its place in the window, and every one may be slow.
    pub fn keeps_slow(&self) -> bool {
        !matches!(self, Pace::Window(w) if *w > 1)
    }
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
    /// and ACKs). The queue is bounded (`SEND_QUEUE_LIMIT`), so over a run this is what
    /// the controller read, within a queue's worth.
    pub packet_ins: AtomicU64,
    pub valid: AtomicU64,
    pub invalid: AtomicU64,
    pub lost: AtomicU64,
    /// Open loop: probes due while the switch's queue to the controller was full, never
    /// sent (see `SEND_QUEUE_LIMIT`).
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

/// The first invalid answers, kept for the report.
pub type Samples = Vec<String>;

pub struct SwitchResult {
    /// Setup latencies in µs: from a probe's send to its answer's arrival in the
    /// switch's socket (the kernel's receive stamp; see `stamped`).
    pub hist: Histogram<u64>,
    /// The same, counted to when the bench read the answer (what stop 40 and before
    /// reported): it adds the bench's own delays in reading and checking.
    pub hist_at_read: Histogram<u64>,
    /// The kernel stamped this switch's answers as they arrived (`hist` counts to the
    /// read where it did not).
    pub arrival_stamped: bool,
    /// When the setups over [`bursts::SLOW`] were sent (the first
    /// [`bursts::KEEP_PER_SWITCH`]), and whether there were more.
    pub slow: Vec<Instant>,
    pub slow_capped: bool,
    /// Open loop: slow setups whose probe went out over [`bursts::SENT_LATE`] behind the
    /// schedule.
    pub slow_sent_late: u64,
    /// Open loop, over the measured loops: how late each batch of probes was sent
    /// against the schedule, in µs (see `OpenLoop::lag`).
    pub send_lag: Histogram<u64>,
    /// Open loop: the setups' latencies counted from when the schedule had each probe
    /// fall due, not from its send (wrk2's correction for coordinated omission), in µs.
    pub hist_from_due: Histogram<u64>,
    pub samples: Samples,
    pub error: Option<String>,
    /// Per backend of the plan (by index): complete VIP answers naming it, and when the
    /// first one completed (`bench cluster` times a spill by it).
    pub by_backend: Vec<(u64, Option<Instant>)>,
}

/// A histogram of microseconds, 1 µs to 60 s at 3 significant digits: every latency and
/// lag the bench keeps.
pub fn micros_hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("constant bounds are valid")
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
    /// Probes before this number went out whole; those from it up to `in_out` are in
    /// the buffer being written.
    written: u64,
    in_out: u64,
    pending: Outstanding,
    /// L2 mode: when each outstanding probe was sent and fell due, oldest first.
    fifo: VecDeque<(Instant, Instant)>,
    vip_mac: MacAddr,
    hist: Histogram<u64>,
    /// The same latencies counted to when the bench read each answer.
    hist_at_read: Histogram<u64>,
    /// When the bench read the answers being checked.
    read_at: Instant,
    /// `SO_TIMESTAMPING` took, and every read of the measured loops carried a stamp.
    arrival_stamped: bool,
    slow: Vec<Instant>,
    slow_capped: bool,
    /// Slow setups whose probe went out over [`bursts::SENT_LATE`] behind the schedule.
    slow_sent_late: u64,
    send_lag: Histogram<u64>,
    hist_from_due: Histogram<u64>,
    /// Open loop: the probes this switch took from the schedule so far (sent or not).
    scheduled: u64,
    samples: Samples,
    /// Open loop: the schedule and this switch's place in it.
    open: Option<(Arc<OpenLoop>, usize)>,
    hello_seen: bool,
    /// A probe without a complete answer after this long is lost.
    timeout: Duration,
    /// Connections end: once more than this many are live, the oldest one's rules idle
    /// out and FLOW_REMOVED is sent for those that asked for it (0 = never).
    expire_after: usize,
    /// The live connections' FLOW_REMOVEDs, oldest first (`live_lens`: each one's bytes).
    live: BytesMut,
    live_lens: VecDeque<usize>,
    by_backend: Vec<(u64, Option<Instant>)>,
    /// The queue to the controller is full: open-loop probes are not sent.
    backlogged: bool,
    /// The probe PACKET_IN, patched per probe.
    syn: SynTemplate,
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
    let driver = open.as_ref().map(|o| o.spawn(run.flags.clone(), false));
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
    let controller = run.controller;
    let mut sw = Sw::new(run, open);
    let error = sw.run(controller).await.err();
    SwitchResult {
        hist: sw.hist,
        hist_at_read: sw.hist_at_read,
        arrival_stamped: sw.arrival_stamped,
        slow: sw.slow,
        slow_capped: sw.slow_capped,
        slow_sent_late: sw.slow_sent_late,
        send_lag: sw.send_lag,
        hist_from_due: sw.hist_from_due,
        samples: sw.samples,
        error,
        by_backend: sw.by_backend,
    }
}

impl Sw {
    fn new(run: SwitchRun, open: Option<(Arc<OpenLoop>, usize)>) -> Sw {
        let SwitchRun {
            controller: _,
            plan,
            check,
            pace,
            timeout,
            expire_after,
            counters,
            flags,
        } = run;
        let by_backend = vec![(0, None); plan.backends.len()];
        let syn = SynTemplate::new(&plan);
        let pending = Outstanding::new(plan.client_base);
        Sw {
            plan,
            check,
            pace,
            counters,
            flags,
            wbuf: BytesMut::with_capacity(256 * 1024),
            xid: 1,
            next_probe: 0,
            written: 0,
            in_out: 0,
            pending,
            fifo: VecDeque::new(),
            vip_mac: MacAddr([0x02, 0x66, 0x67, 0, 0, 1]),
            hist: micros_hist(),
            hist_at_read: micros_hist(),
            read_at: Instant::now(),
            arrival_stamped: false,
            slow: Vec::new(),
            slow_capped: false,
            slow_sent_late: 0,
            send_lag: micros_hist(),
            hist_from_due: micros_hist(),
            scheduled: 0,
            samples: Vec::new(),
            open,
            hello_seen: false,
            timeout,
            expire_after,
            live: BytesMut::new(),
            live_lens: VecDeque::new(),
            by_backend,
            backlogged: false,
            syn,
        }
    }

    async fn run(&mut self, controller: SocketAddr) -> Result<(), String> {
        let stream = TcpStream::connect(controller)
            .await
            .map_err(|e| format!("connect {controller}: {e}"))?;
        let _ = stream.set_nodelay(true);
        // Without the kernel's stamps, an answer arrives when the bench reads it.
        self.arrival_stamped = stamped::enable(&stream).is_ok();
        // Read into `rbuf[end..]`; the frames not yet checked are `rbuf[start..end]`. An
        // OpenFlow message is at most 64 KiB, so a partial one always fits once moved to
        // the front.
        let mut rbuf = vec![0u8; 256 * 1024];
        let (mut start, mut end) = (0usize, 0usize);
        self.send(&Message::Hello(ofp::Hello::ours()));
        // Probes go out on answers (windows) or on the open-loop schedule's wake-ups: the
        // tick only starts windows, notices `stop` and times out the lost.
        let mut tick = tokio::time::interval(Duration::from_millis(10));
        let open = self.open.clone();
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut last_sweep = Instant::now();
        // What is being written now; new messages go to `wbuf` meanwhile. Reading and
        // writing race each other: a switch that stopped reading while its own writes are
        // held back (the controller's socket full) would queue the controller's answers
        // and measure its own I/O, not the controller.
        let mut out = BytesMut::with_capacity(256 * 1024);
        loop {
            if out.is_empty() {
                std::mem::swap(&mut out, &mut self.wbuf);
                self.in_out = self.next_probe;
            }
            if self.flags.stop.load(Ordering::Relaxed) {
                return Ok(());
            }
            if rbuf.len() - end < 64 * 1024 {
                rbuf.copy_within(start..end, 0);
                (start, end) = (0, end - start);
            }
            tokio::select! {
                w = stream.writable(), if !out.is_empty() => {
                    w.map_err(|e| format!("write: {e}"))?;
                    let at = Instant::now();
                    match stream.try_write(&out) {
                        Ok(n) => {
                            out.advance(n);
                            if out.is_empty() {
                                self.sent_whole(at);
                            }
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                        Err(e) => return Err(format!("write: {e}")),
                    }
                    continue;
                }
                r = stream.readable() => {
                    r.map_err(|e| format!("read: {e}"))?;
                    let read = stream.try_io(tokio::io::Interest::READABLE, || {
                        stamped::recv(&stream, rbuf.get_mut(end..).unwrap_or_default())
                    });
                    let (n, stamp) = match read {
                        Ok(r) => r,
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                        Err(e) => return Err(format!("read: {e}")),
                    };
                    if n == 0 {
                        return Err("the controller closed the connection".into());
                    }
                    end += n;
                    let now = Instant::now();
                    self.read_at = now;
                    let arrived = match stamp {
                        Some(s) => stamped::arrival(s, now, std::time::SystemTime::now()),
                        None => {
                            // (Bytes that came before the option took carry none.)
                            if self.flags.measuring.load(Ordering::Relaxed) {
                                self.arrival_stamped = false;
                            }
                            now
                        }
                    };
                    // Whole frames are checked in place, then dropped from the buffer at
                    // once: no `Bytes` per frame.
                    let unread = rbuf.get(start..end).unwrap_or_default();
                    let mut at = 0;
                    while let Some(head) = unread.get(at..at + ofp::HEADER_LEN) {
                        let len = match ofp::HeaderView::new_checked(head) {
                            Ok(h) => usize::from(h.length()),
                            Err(_) => {
                                let l = u16::from_be_bytes([head[2], head[3]]);
                                return Err(format!("framing: {}", ofp::FrameError::BadLength(l)));
                            }
                        };
                        let Some(frame) = unread.get(at..at + len) else {
                            break;
                        };
                        self.on_frame(arrived, frame)?;
                        at += len;
                    }
                    start += at;
                    if start == end {
                        (start, end) = (0, 0);
                    }
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

    /// Send encoded FLOW_REMOVEDs (xid 0), each with the switch's next xid.
    fn send_removals(&mut self, frames: &[u8]) {
        let framer = ofp::Framer::new();
        let mut rest = frames;
        while let Ok(Some(len)) = framer.frame_len(rest) {
            let frame = &rest[..len];
            self.xid = self.xid.wrapping_add(1);
            let at = self.wbuf.len();
            self.wbuf.extend_from_slice(frame);
            if let Some(x) = self.wbuf.get_mut(at + 4..at + 8) {
                x.copy_from_slice(&self.xid.to_be_bytes());
            }
            rest = &rest[len..];
        }
    }

    fn reply(&mut self, xid: u32, msg: &Message) {
        let _ = ofp::encode(xid, msg, &mut self.wbuf);
    }

    fn packet_in(&mut self, in_port: u32, data: &[u8]) {
        self.counters.packet_ins.fetch_add(1, Ordering::Relaxed);
        self.xid = self.xid.wrapping_add(1);
        put_packet_in(&mut self.wbuf, self.xid, in_port, data);
    }

    /// One whole frame from the controller. FLOW_MOD and PACKET_OUT, one of each per
    /// probe and more, are checked through borrowed views (no decoding into a 792-byte
    /// `Message`, no allocation); the rest is decoded.
    fn on_frame(&mut self, now: Instant, frame: &[u8]) -> Result<(), String> {
        let version = frame.first().copied().unwrap_or(0);
        if version != ofp::OFP_VERSION && self.hello_seen {
            return Err(format!(
                "the controller speaks wire version {version}, not OpenFlow 1.3"
            ));
        }
        let undecodable = |e: ofp::DecodeError| format!("undecodable message: {e}");
        match frame.get(1).copied().and_then(MsgType::from_u8) {
            Some(MsgType::FlowMod) => {
                let fm = FlowModView::new(frame).map_err(undecodable)?;
                self.on_flow_mod(now, &fm);
            }
            Some(MsgType::PacketOut) => {
                let po = PacketOutView::new(frame).map_err(undecodable)?;
                self.on_packet_out(now, &po);
            }
            _ => {
                let (xid, msg) = ofp::decode(Bytes::copy_from_slice(frame)).map_err(undecodable)?;
                // By reference: a `Message` is 792 bytes.
                self.on_message(xid, &msg);
            }
        }
        Ok(())
    }

    /// cbench's `-L`: the hosts announce themselves, and the client asks for the VIP.
    fn announce_hosts(&mut self) {
        let plan = self.plan.clone();
        for &(ip, mac, port) in &plan.backends {
            // Gratuitous: who-has its own address, from itself.
            let garp = packet::arp_request(mac, ip, ip);
            self.packet_in(port, &garp);
        }
        let (cip, _) = plan.client_of(0);
        let ask = packet::arp_request(plan.client_mac, cip, plan.vip);
        self.packet_in(plan.client_port, &ask);
        self.counters.ready.store(true, Ordering::Relaxed);
    }

    fn on_message(&mut self, xid: u32, msg: &Message) {
        match msg {
            Message::Hello(_) => self.hello_seen = true,
            Message::FeaturesRequest => {
                self.reply(
                    xid,
                    &Message::FeaturesReply(ofp::SwitchFeatures {
                        capabilities: 0x4f,
                        ..ofp::SwitchFeatures::emulated(self.plan.dpid)
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
                    self.packet_in(self.plan.client_port, &ask);
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
            // FLOW_MOD and PACKET_OUT go through `on_frame`'s views.
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

    /// Probe `k`'s client MAC (a learning switch learns a new one per probe, cbench's
    /// -M) and the MAC its SYN is sent to.
    fn probe_macs(&self, k: u64) -> (MacAddr, MacAddr) {
        match self.check {
            CheckMode::Vip => (self.plan.client_mac, self.vip_mac),
            CheckMode::L2 => {
                let h = k % 100_000;
                let src = MacAddr([
                    0x02,
                    0xcc,
                    self.plan.dpid as u8,
                    (h >> 16) as u8,
                    (h >> 8) as u8,
                    h as u8,
                ]);
                (src, self.plan.backends[0].1)
            }
        }
    }

    /// The controller sent probe `key`'s SYN to backend `b` without rules: play the
    /// backend's SYN-ACK, which must come back rewritten to the VIP.
    fn answer_syn(&mut self, key: (Ipv4Addr, u16), b: usize, isn: u32) {
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
        self.packet_in(bport, &syn_ack);
    }

    /// The SYN-ACK of a deferred probe came back through the controller: check it, and
    /// play the client's ACK.
    fn answer_syn_ack(&mut self, key: (Ipv4Addr, u16), acts: &Acts, seq: u32) {
        let Some(isn) = self.pending.get(&key).filter(|p| p.deferred).map(|p| p.isn) else {
            return;
        };
        let (set_src, out) = (acts.set_src, acts.output);
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
        self.packet_in(self.plan.client_port, &ack);
    }

    /// Send the next probe at `sent`, which fell due at `due` (open loop; else `sent`).
    fn send_probe(&mut self, sent: Instant, due: Instant) {
        let k = self.next_probe;
        self.next_probe += 1;
        let client = self.plan.client_of(k);
        let isn = probe_isn(k);
        match self.check {
            CheckMode::Vip => {
                self.pending.insert(
                    k,
                    Pending {
                        sent,
                        due,
                        fwd: None,
                        rev: false,
                        out: None,
                        deferred: false,
                        isn,
                        removals: Default::default(),
                    },
                );
            }
            CheckMode::L2 => self.fifo.push_back((sent, due)),
        }
        let (src_mac, dst_mac) = self.probe_macs(k);
        self.counters.packet_ins.fetch_add(1, Ordering::Relaxed);
        self.xid = self.xid.wrapping_add(1);
        self.syn
            .put(&mut self.wbuf, self.xid, src_mac, dst_mac, client, isn);
        self.counters.sent.fetch_add(1, Ordering::Relaxed);
    }

    /// The buffer being written went out whole with the write that began at `at`: its
    /// probes' latencies count from then, not from when they were queued (the bench may
    /// have read and checked answers in between).
    fn sent_whole(&mut self, at: Instant) {
        let (from, to) = (self.written, self.in_out);
        self.written = to;
        match self.check {
            CheckMode::Vip => self.pending.sent_at(from, to, at),
            CheckMode::L2 => {
                // The fifo holds probes `next_probe - len .. next_probe`, oldest first.
                let first = self.next_probe - self.fifo.len() as u64;
                for k in from.max(first)..to {
                    if let Some(e) = self.fifo.get_mut((k - first) as usize) {
                        e.0 = at;
                    }
                }
            }
        }
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
                    self.send_probe(now, now);
                }
            }
            Pace::Rate(_) => {
                if self.flags.measuring.load(Ordering::Relaxed)
                    && let Some(lag) = self.open.as_ref().and_then(|(o, i)| o.lag(*i, now))
                {
                    let _ = self.send_lag.record((lag.as_micros() as u64).max(1));
                }
                let Some((open, i)) = self.open.clone() else {
                    return;
                };
                for _ in 0..open.take(i, now) {
                    let due = open.due_at(i, self.scheduled).unwrap_or(now);
                    self.scheduled += 1;
                    if self.backlogged {
                        self.counters.not_sent.fetch_add(1, Ordering::Relaxed);
                    } else {
                        self.send_probe(now, due);
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
                .expire(|p| now.saturating_duration_since(p.sent) >= timeout),
            CheckMode::L2 => {
                while self
                    .fifo
                    .front()
                    .is_some_and(|(t, _)| now.saturating_duration_since(*t) >= timeout)
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

    fn record(&mut self, now: Instant, sent: Instant, due: Instant) {
        self.counters.valid.fetch_add(1, Ordering::Relaxed);
        if self.flags.measuring.load(Ordering::Relaxed) {
            let took = now.saturating_duration_since(sent);
            let _ = self.hist.record((took.as_micros() as u64).max(1));
            let at_read = self.read_at.saturating_duration_since(sent);
            let _ = self
                .hist_at_read
                .record((at_read.as_micros() as u64).max(1));
            if self.open.is_some() {
                let since_due = now.saturating_duration_since(due);
                let _ = self
                    .hist_from_due
                    .record((since_due.as_micros() as u64).max(1));
            }
            if took > bursts::SLOW
                && self.open.is_some()
                && sent.saturating_duration_since(due) > bursts::SENT_LATE
            {
                self.slow_sent_late += 1;
            }
            if took > bursts::SLOW && self.pace.keeps_slow() {
                if self.slow.len() < bursts::KEEP_PER_SWITCH {
                    self.slow.push(sent);
                } else {
                    self.slow_capped = true;
                }
            }
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
        if let Some((sent, due)) = self.fifo.pop_front() {
            self.record(now, sent, due);
        }
    }

    fn on_flow_mod(&mut self, now: Instant, fm: &FlowModView<'_>) {
        if !matches!(
            fm.command(),
            FlowModCommand::Add | FlowModCommand::ModifyStrict
        ) {
            return;
        }
        if self.check == CheckMode::L2 {
            self.l2_response(now);
            return;
        }
        let Some((src, dst, sport, dport)) = connection_of(fm) else {
            return; // Not a connection rule (table-miss, L2, intercept...).
        };
        let acts = Acts::of(fm.actions());
        if dst == self.plan.vip && dport == self.plan.vport {
            // Forward: client → VIP, rewritten to a backend.
            let key = (src, sport);
            let Some(p) = self.pending.get_mut(&key) else {
                return;
            };
            let verdict = match check_forward(&self.plan, fm, &acts, key) {
                Ok(b) => {
                    p.fwd = Some(b);
                    if sends_removal(self.expire_after, fm) {
                        put_flow_removed(&mut p.removals, fm);
                    }
                    p.verdict(key, Some(b))
                }
                Err(why) => Verdict::Invalid(why),
            };
            self.conclude(now, key, verdict);
        } else if sport == self.plan.vport {
            // Reverse: backend → client, rewritten back to the VIP.
            let Some(b) = self.plan.backend_by_ip(src) else {
                return;
            };
            let key = (dst, dport);
            let Some(p) = self.pending.get_mut(&key) else {
                return;
            };
            let (set_src, out) = (acts.set_src, acts.output);
            let verdict = if set_src != Some(self.plan.vip) || out != Some(self.plan.client_port) {
                Verdict::Invalid(format!(
                    "reverse rule for {key:?}: set ipv4_src {set_src:?}, output {out:?}"
                ))
            } else {
                p.rev = true;
                if sends_removal(self.expire_after, fm) {
                    put_flow_removed(&mut p.removals, fm);
                }
                p.verdict(key, Some(b))
            };
            self.conclude(now, key, verdict);
        }
    }

    fn on_packet_out(&mut self, now: Instant, po: &PacketOutView<'_>) {
        let Ok(frame) = packet::parse(po.data()) else {
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
                    if let Some(&(_, mac, port)) =
                        self.plan.backends.iter().find(|b| b.0 == arp.tpa)
                    {
                        let reply = packet::arp_reply(arp, mac);
                        self.packet_in(port, &reply);
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
                if ip.dst == self.plan.vip && tcp.dst_port == self.plan.vport {
                    let key = (ip.src, tcp.src_port);
                    let Some(p) = self.pending.get_mut(&key) else {
                        return;
                    };
                    let acts = Acts::of(po.actions());
                    let mut deferred = None;
                    let verdict = match check_packet_out(&self.plan, &acts, key) {
                        Err(why) => Verdict::Invalid(why),
                        Ok(b) => match (tcp.flags.is_initial_syn(), p.deferred) {
                            // Rules first, then the SYN: the usual answer. The SYN alone:
                            // rules deferred to the client's ACK.
                            (true, false) if p.fwd.is_none() && !p.rev => {
                                p.deferred = true;
                                deferred = Some((b, p.isn));
                                Verdict::Open
                            }
                            (true, false) | (false, true) => {
                                p.out = Some(b);
                                p.verdict(key, Some(b))
                            }
                            // A retransmission: the switch sends none.
                            (true, true) => Verdict::Open,
                            (false, false) => {
                                Verdict::Invalid(format!("PACKET_OUT of {key:?} is not the SYN"))
                            }
                        },
                    };
                    if let Some((b, isn)) = deferred {
                        self.answer_syn(key, b, isn);
                    }
                    self.conclude(now, key, verdict);
                } else if self.plan.backend_by_ip(ip.src).is_some()
                    && tcp.src_port == self.plan.vport
                    && tcp.flags.syn()
                    && tcp.flags.ack()
                {
                    let acts = Acts::of(po.actions());
                    self.answer_syn_ack((ip.dst, tcp.dst_port), &acts, tcp.seq);
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

    /// Act on what one part of probe `key`'s answer made of it.
    fn conclude(&mut self, now: Instant, key: (Ipv4Addr, u16), verdict: Verdict) {
        match verdict {
            Verdict::Open => {}
            Verdict::Invalid(why) => self.invalid(Some(key), why),
            Verdict::Complete => {
                let Some(p) = self.pending.remove(&key) else {
                    return;
                };
                if let Some(e) = p.fwd.and_then(|b| self.by_backend.get_mut(b)) {
                    e.0 += 1;
                    e.1.get_or_insert(now);
                }
                self.record(now, p.sent, p.due);
                if self.expire_after > 0 {
                    self.live.extend_from_slice(&p.removals);
                    self.live_lens.push_back(p.removals.len());
                    while self.live_lens.len() > self.expire_after {
                        let n = self.live_lens.pop_front().unwrap_or(0);
                        let ended = self.live.split_to(n.min(self.live.len()));
                        self.send_removals(&ended);
                    }
                }
            }
        }
    }
}

/// Probe `k`'s client ISN.
fn probe_isn(k: u64) -> u32 {
    (k as u32).wrapping_mul(2_654_435_761)
}

/// Does the switch send a FLOW_REMOVED when this rule idles out: the rule asked for one,
/// and connections end in this run (`--expire-after`)?
fn sends_removal(expire_after: usize, fm: &FlowModView<'_>) -> bool {
    expire_after > 0 && fm.flags().contains(ofp::FlowModFlags::SEND_FLOW_REM)
}

#[cfg(test)]
mod tests;
