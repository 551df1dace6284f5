//! The tokio shell around the core: switch sessions, the tick that drives timers, health
//! probes, and the shared handle the API reads from.
//!
//! One [`flowgate_core::Controller`] sits behind a mutex. A switch session locks it for one
//! read's worth of messages, hands them over, and the messages the core answers with are
//! encoded straight into the per-switch write buffers before the lock is released. Nothing
//! blocking and nothing slow happens under the lock; sockets are written by each session's
//! own writer task.

mod buffers;
mod channel_rtt;
pub mod cluster;
pub mod latency;
mod per_backend;
mod probe;
pub mod reload;
mod scrape;
mod session;
pub mod spin;
mod tls;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use flowgate_core::topology::Dpid;
use flowgate_core::{Config, Controller, Outbox};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};

pub use session::{MAX_HANDSHAKES, SessionLimits};

/// Everything the core lock protects.
pub struct CoreCell {
    pub controller: Controller,
    outbox: Outbox,
    /// Buffers the writers gave back, encoded into again while still in cache.
    pool: Arc<buffers::BufferPool>,
    /// Looked up once per message in [`CoreCell::flush`]: ahash, not std's SipHash (about
    /// 2 % of the controller's CPU at full rate).
    sessions: HashMap<Dpid, SessionTx, ahash::RandomState>,
    /// Incremented per session so a replaced session does not unregister its successor.
    next_session_id: u64,
}

/// Bytes queued for one switch beyond which the switch is taken to have stopped reading
/// and its session is closed (rather than letting the queue grow without bound). Its own
/// PACKET_INs are dropped unhandled long before (`session::BEHIND_BYTES`); this bounds
/// what else the core sends it meanwhile (rules for other switches' flows, stats requests).
pub const MAX_QUEUED_BYTES: usize = 32 << 20;

/// The write side of one switch session, as the core sees it.
struct SessionTx {
    id: u64,
    xid: u32,
    buf: BytesMut,
    tx: mpsc::UnboundedSender<Chunk>,
    out: Arc<Outflow>,
    /// May the core change this switch? Always in single mode; in a cluster only once the
    /// switch confirmed us as MASTER (ROLE_REPLY) and until it demotes us
    /// (`cluster::is_write` lists what a SLAVE may not send).
    writable: bool,
}

/// Bytes for one switch's writer, and when they were queued.
pub(crate) type Chunk = (Instant, Bytes);

impl Outflow {
    /// How long the oldest unwritten chunk has waited (zero when nothing waits).
    pub(crate) fn head_age(&self, now: Instant) -> Duration {
        self.head_queued_at
            .lock()
            .ok()
            .and_then(|g| *g)
            .map_or(Duration::ZERO, |t| now.saturating_duration_since(t))
    }

    /// Count `len` bytes queued at `now` for the writer; returns the bytes now queued. The
    /// first chunk into an empty queue starts the head's clock here, not when the writer
    /// gets to it: a writer not yet scheduled is part of the outflow's delay (it was the
    /// whole of it under a PACKET_IN flood, before the session's reader yielded to it).
    pub(crate) fn queue(&self, len: usize, now: Instant) -> usize {
        let before = self.queued.fetch_add(len, Ordering::Relaxed);
        if before == 0
            && let Ok(mut g) = self.head_queued_at.lock()
            && g.is_none()
        {
            *g = Some(now);
        }
        before + len
    }

    /// Where the bytes just queued end in all bytes ever queued for the switch, given
    /// `queued`, what [`Outflow::queue`] returned: the bytes written so far and those
    /// waiting. Derived rather than counted (no second counter to update on the core's
    /// path): exact but for a chunk the writer is between its two counts of, or one the
    /// core queued at the same moment.
    pub(crate) fn stream_end(&self, queued: usize) -> u64 {
        self.written.load(Ordering::Relaxed) + queued as u64
    }

    /// The writer took the chunk queued at `at`: it is the oldest unwritten one.
    pub(crate) fn writing(&self, at: Instant) {
        if let Ok(mut g) = self.head_queued_at.lock() {
            *g = Some(at);
        }
    }

    /// The writer wrote `len` bytes. The head's clock stops only when nothing is left
    /// (checked under its lock, so a chunk queued meanwhile keeps it running).
    pub(crate) fn written(&self, len: usize) {
        let left = self
            .queued
            .fetch_sub(len, Ordering::Relaxed)
            .saturating_sub(len);
        self.written.fetch_add(len as u64, Ordering::Relaxed);
        if left == 0
            && let Ok(mut g) = self.head_queued_at.lock()
            && self.queued.load(Ordering::Relaxed) == 0
        {
            *g = None;
        }
    }
}

/// Shared between the core (which queues) and a session's writer (which drains).
#[derive(Default)]
pub(crate) struct Outflow {
    pub(crate) queued: AtomicUsize,
    /// When the chunk the writer is on now was queued (`None`: the writer is idle). It is
    /// the oldest unwritten one, so its age is how long the switch has kept the controller
    /// waiting: the control channel's queueing delay.
    pub(crate) head_queued_at: Mutex<Option<Instant>>,
    /// Set when the peer stopped reading; the session's read loop ends on seeing it.
    pub(crate) overflowed: AtomicBool,
    /// Set (under the core lock) when a newer session of the same switch replaced this
    /// one: the read loop ends on seeing it, and feeds the core nothing more.
    pub(crate) replaced: AtomicBool,
    /// Wakes the read loop's wait once `replaced` is set.
    pub(crate) closing: tokio::sync::Notify,
    /// Bytes the writer has handed to the socket so far: the switch's progress.
    pub(crate) written: AtomicU64,
}

impl CoreCell {
    fn new(controller: Controller) -> Self {
        CoreCell {
            controller,
            outbox: Outbox::encoding(),
            pool: Arc::default(),
            sessions: HashMap::default(),
            next_session_id: 1,
        }
    }

    /// Run one call into the controller and send what it produced.
    pub fn with<R>(&mut self, f: impl FnOnce(&mut Controller, &mut Outbox) -> R) -> R {
        let r = f(&mut self.controller, &mut self.outbox);
        self.flush();
        r
    }

    /// Encode every queued message into its switch's buffer, then hand each buffer to its
    /// writer. Messages for switches that are gone are dropped (they resync on return).
    fn flush(&mut self) {
        if self.outbox.is_empty() {
            return;
        }
        // The outbox encodes as the core pushes (`Outbox::encoding`): each message is
        // copied to its switch's buffer with the switch's next xid.
        if let Some(enc) = self.outbox.encoded_mut() {
            // The usual batch (one switch's PACKET_INs and the answers, all to it): its
            // xids are written in place and the bytes handed over whole, not copied.
            let one = enc.frames.first().map(|f| f.dpid).and_then(|dpid| {
                let s = self.sessions.get_mut(&dpid)?;
                let all = enc.frames.iter().all(|f| f.dpid == dpid);
                (all && s.writable && s.buf.is_empty()).then_some(s)
            });
            if let Some(s) = one {
                let mut start = 0;
                for f in &enc.frames {
                    s.xid = s.xid.wrapping_add(1);
                    // The header's xid field: bytes 4..8 (§7.1).
                    if let Some(x) = enc.bytes.get_mut(start + 4..start + 8) {
                        x.copy_from_slice(&s.xid.to_be_bytes());
                    }
                    start = f.end;
                }
                std::mem::swap(&mut s.buf, &mut enc.bytes);
                enc.clear();
                // Handed over whole below: the next batch goes to a warm buffer.
                enc.bytes = self.pool.take();
            }
            for (dpid, msg_type, bytes) in enc.iter() {
                let Some(s) = self.sessions.get_mut(&dpid) else {
                    continue;
                };
                if !s.writable && cluster::is_write_type(msg_type) {
                    continue;
                }
                s.xid = s.xid.wrapping_add(1);
                if s.buf.capacity() == 0 {
                    s.buf = self.pool.take();
                }
                let at = s.buf.len();
                s.buf.extend_from_slice(bytes);
                // The header's xid field: bytes 4..8 (§7.1).
                if let Some(x) = s.buf.get_mut(at + 4..at + 8) {
                    x.copy_from_slice(&s.xid.to_be_bytes());
                }
            }
            enc.clear();
        }
        // Messages kept whole (none while the outbox encodes), by reference, then cleared.
        for (dpid, msg) in &self.outbox.msgs {
            let Some(s) = self.sessions.get_mut(dpid) else {
                continue;
            };
            if !s.writable && cluster::is_write(msg) {
                continue;
            }
            s.xid = s.xid.wrapping_add(1);
            if s.buf.capacity() == 0 {
                s.buf = self.pool.take();
            }
            if let Err(e) = ofp::encode(s.xid, msg, &mut s.buf) {
                tracing::error!(dpid = format_args!("{dpid:016x}"), error = %e, "cannot encode a message for the switch");
            }
        }
        self.outbox.msgs.clear();
        for (dpid, s) in self.sessions.iter_mut() {
            if s.buf.is_empty() {
                continue;
            }
            // The whole buffer (not split off it: a part left here would keep the writer
            // from giving its memory back).
            let chunk = std::mem::take(&mut s.buf).freeze();
            let now = Instant::now();
            let queued = s.out.queue(chunk.len(), now);
            if queued > MAX_QUEUED_BYTES {
                if !s.out.overflowed.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        dpid = format_args!("{dpid:016x}"),
                        queued,
                        "switch is not reading its messages: closing the session"
                    );
                }
                continue;
            }
            let _ = s.tx.send((now, chunk));
        }
    }

    /// Make a session the switch's current one; returns its id and whether it replaced
    /// an older one.
    fn register(
        &mut self,
        dpid: Dpid,
        tx: mpsc::UnboundedSender<Chunk>,
        out: Arc<Outflow>,
        writable: bool,
    ) -> (u64, bool) {
        let id = self.next_session_id;
        self.next_session_id += 1;
        // A second session for the same datapath replaces the first (the switch
        // reconnected before we noticed the old one was dead). The old one is told to
        // close: its connection may be half-open, and what it still read would reach the
        // core as this switch's, answered on the new connection.
        let old = self.sessions.insert(
            dpid,
            SessionTx {
                id,
                xid: 0x1000,
                // Taken from the pool when the first message for the switch is (`flush`).
                buf: BytesMut::new(),
                tx,
                out,
                writable,
            },
        );
        if let Some(old) = &old {
            old.out.replaced.store(true, Ordering::Relaxed);
            old.out.closing.notify_one();
        }
        (id, old.is_some())
    }

    /// Where the session writers give their written buffers back.
    pub(crate) fn buffer_pool(&self) -> Arc<buffers::BufferPool> {
        self.pool.clone()
    }

    fn unregister(&mut self, dpid: Dpid, id: u64) -> bool {
        if self.sessions.get(&dpid).is_some_and(|s| s.id == id) {
            self.sessions.remove(&dpid);
            true
        } else {
            false
        }
    }
}

/// A cloneable handle on the running controller, for the API and tests.
#[derive(Clone)]
pub struct Handle {
    core: Arc<Mutex<CoreCell>>,
    pub started: Instant,
    pub config: Arc<Mutex<Config>>,
    /// The file the config came from, re-read on reload (SIGHUP or the API).
    pub config_path: Option<Arc<PathBuf>>,
    /// Held by a reload from before it reads the file until it has applied it, so that
    /// two (SIGHUP and the API) cannot apply an older file last. A reload never awaits: a
    /// plain mutex.
    pub(crate) reloads: Arc<Mutex<()>>,
    /// PACKET_INs dropped by the sessions' budgets (beyond `packet_in_rate`), all switches.
    pub packet_in_dropped: Arc<AtomicU64>,
    /// PACKET_INs read and dropped unhandled while their switch was behind
    /// (`session::BEHIND_BYTES`), all switches.
    pub packet_in_dropped_behind: Arc<AtomicU64>,
    /// Connections closed on arrival because [`session::MAX_HANDSHAKES`] others were in
    /// their handshake.
    pub handshakes_refused: Arc<AtomicU64>,
    /// Messages from switches that were framed whole but did not decode, each answered
    /// with an OFPT_ERROR (§7.4.4) unless it was one, all sessions and handshakes.
    pub openflow_undecodable: Arc<AtomicU64>,
    /// How each session probes its channel's round trip, as the running config says
    /// ([`channel_rtt::ProbePlan`], as its `bits`): set at start and on reload, read by
    /// the sessions at each turn of their loops.
    pub(crate) rtt_probe: Arc<AtomicU64>,
    /// Told when a reload changes `rtt_probe`: it wakes the sessions that wait idle
    /// (for bytes or the keep-alive), which read the interval only at their next turn
    /// and would otherwise start probing up to `echo_interval_ms` late.
    pub(crate) rtt_probe_changed: Arc<tokio::sync::Notify>,
    /// Time the core takes to handle one PACKET_IN (measured by the sessions).
    pub decision_latency: Arc<latency::LatencyHistogram>,
    /// What the sessions time each PACKET_IN with: the CPU's time-stamp counter where it
    /// is invariant (a read is a few nanoseconds), else the monotonic clock. A
    /// `clock_gettime` per PACKET_IN, and its `Instant` arithmetic, were 5 % of the
    /// controller's CPU at full rate.
    pub clock: quanta::Clock,
    /// Flow count per switch, from the periodic aggregate stats request (§7.3.5.3).
    pub flow_counts: Arc<Mutex<HashMap<Dpid, FlowCount>>>,
    /// This instance's place in the cluster (single mode: a fixed, empty view).
    pub cluster: Arc<cluster::ClusterState>,
    /// The workers' poll before they park (`[runtime] spin_before_park_us`), which
    /// watches every switch socket the sessions accept.
    pub park_spin: Option<Arc<spin::ParkSpin>>,
}

/// A switch's flow count as its last OFPMP_AGGREGATE reply said.
#[derive(Debug, Clone, Copy)]
pub struct FlowCount {
    pub flows: u32,
    pub at: Instant,
}

/// How often each switch is asked for its aggregate flow stats.
pub const FLOW_STATS_INTERVAL: Duration = Duration::from_secs(2);

impl Handle {
    /// A handle over a controller with no switch sessions (yet): what
    /// [`crate::server::run`] builds, and what in-process API tests use.
    pub fn new(controller: Controller, config: Config, config_path: Option<PathBuf>) -> Handle {
        let cluster = Arc::new(cluster::ClusterState::new(&config.cluster));
        let rtt_probe = Arc::new(AtomicU64::new(channel_rtt::ProbePlan::of(&config).bits()));
        Handle {
            core: Arc::new(Mutex::new(CoreCell::new(controller))),
            started: Instant::now(),
            config: Arc::new(Mutex::new(config)),
            config_path: config_path.map(Arc::new),
            reloads: Arc::default(),
            packet_in_dropped: Arc::new(AtomicU64::new(0)),
            packet_in_dropped_behind: Arc::new(AtomicU64::new(0)),
            handshakes_refused: Arc::new(AtomicU64::new(0)),
            openflow_undecodable: Arc::new(AtomicU64::new(0)),
            rtt_probe,
            rtt_probe_changed: Arc::default(),
            decision_latency: Arc::new(latency::LatencyHistogram::new()),
            clock: quanta::Clock::new(),
            flow_counts: Arc::new(Mutex::new(HashMap::new())),
            cluster,
            park_spin: None,
        }
    }

    /// The runtime's workers poll with `spin` before they park: the sessions have it
    /// watch their sockets.
    pub fn with_park_spin(mut self, spin: Option<Arc<spin::ParkSpin>>) -> Handle {
        self.park_spin = spin;
        self
    }

    pub(crate) fn record_flow_count(&self, dpid: Dpid, flows: u32) {
        let mut m = self.flow_counts.lock().unwrap_or_else(|e| e.into_inner());
        m.insert(
            dpid,
            FlowCount {
                flows,
                at: Instant::now(),
            },
        );
    }

    pub fn lock(&self) -> MutexGuard<'_, CoreCell> {
        // A panic under the lock is a bug; the state is still the best we have.
        self.core.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Start everything the controller runs besides the API: the OpenFlow listener and its
/// sessions, the tick, probes, scrapes, flow-stats polling, SIGHUP reloads and the cluster
/// tasks. They all end when `stop` turns true. (The binary's composition root,
/// [`crate::server`], adds the API beside them.)
pub fn spawn(
    handle: &Handle,
    openflow: TcpListener,
    tasks: &mut tokio::task::JoinSet<()>,
    stop_rx: &watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let config = handle
        .config
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let tls = match &config.openflow.tls {
        Some(t) => Some(tls::acceptor(t)?),
        None => None,
    };
    let limits = SessionLimits::from_config(&config);
    tracing::info!(listen = %openflow.local_addr()?, tls = tls.is_some(), "OpenFlow listener up");
    tasks.spawn(session::accept_loop(
        openflow,
        handle.clone(),
        tls,
        limits,
        stop_rx.clone(),
    ));
    tasks.spawn(tick_loop(
        handle.clone(),
        config.controller.refresh_interval,
        stop_rx.clone(),
    ));
    tasks.spawn(probe::probe_loop(handle.clone(), stop_rx.clone()));
    tasks.spawn(scrape::scrape_loop(handle.clone(), stop_rx.clone()));
    tasks.spawn(flow_stats_loop(handle.clone(), stop_rx.clone()));
    tasks.spawn(sighup_loop(handle.clone(), stop_rx.clone()));
    cluster::spawn(tasks, handle, stop_rx.clone());
    Ok(())
}

async fn tick_loop(handle: Handle, every: Duration, mut stop: watch::Receiver<bool>) {
    let mut interval = tokio::time::interval(every.max(Duration::from_millis(1)));
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // A walk of the connection table (hosts moved, links changed) also goes on between
    // ticks, a millisecond's slice at a time: the PACKET_IN path waits for each slice.
    let mut walking = false;
    loop {
        tokio::select! {
            _ = interval.tick() => {
                let now = Instant::now();
                walking = handle.lock().with(|c, out| {
                    c.handle_tick(now, out);
                    c.rerouting()
                });
            }
            () = tokio::time::sleep(flowgate_core::controller::WALK_STEP), if walking => {
                let now = Instant::now();
                walking = handle.lock().with(|c, out| c.handle_reroute_step(now, out));
            }
            _ = stop.changed() => return,
        }
    }
}

/// Ask every switch for its aggregate flow stats (all tables, all flows), for the API's
/// per-switch flow count. The replies are taken by the sessions ([`Handle::flow_counts`]).
async fn flow_stats_loop(handle: Handle, mut stop: watch::Receiver<bool>) {
    let mut interval = tokio::time::interval(FLOW_STATS_INTERVAL);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = interval.tick() => {
                let mut core = handle.lock();
                let dpids: Vec<Dpid> = core.sessions.keys().copied().collect();
                for dpid in dpids {
                    core.outbox.push(dpid, aggregate_request());
                }
                core.flush();
            }
            _ = stop.changed() => return,
        }
    }
}

fn aggregate_request() -> ofp::Message {
    // §7.3.5.3: table OFPTT_ALL, no port/group/cookie restriction, an empty match.
    ofp::Message::MultipartRequest(ofp::MultipartRequest {
        flags: 0,
        body: ofp::MultipartRequestBody::Aggregate(ofp::FlowStatsRequest {
            table_id: 0xff,
            out_port: ofp::port::ANY,
            out_group: ofp::group::ANY,
            cookie: 0,
            cookie_mask: 0,
            match_: ofp::Match::new(),
        }),
    })
}

/// Reload the config file on SIGHUP: validated first, a bad file changes nothing.
async fn sighup_loop(handle: Handle, mut stop: watch::Receiver<bool>) {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut hup) = signal(SignalKind::hangup()) else {
        return;
    };
    loop {
        tokio::select! {
            _ = hup.recv() => match reload::reload_from_file(&handle) {
                Ok(r) => tracing::info!(services = r.services, restart_needed = ?r.restart_needed, "SIGHUP: config reloaded"),
                Err(e) => tracing::error!(error = %e, "SIGHUP: config not reloaded"),
            },
            _ = stop.changed() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The outflow's delay is the age of the oldest chunk not yet written, counted from
    /// when it was queued, whether or not the writer has taken it yet.
    #[test]
    fn the_outflow_delay_counts_from_the_queueing_not_from_the_writer() {
        let o = Outflow::default();
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        assert_eq!(o.head_age(t0 + ms(5)), Duration::ZERO, "nothing queued");
        assert_eq!(o.queue(100, t0), 100);
        // Not taken by the writer yet (it has not been scheduled): the clock runs.
        assert_eq!(o.head_age(t0 + ms(7)), ms(7));
        // A second chunk does not restart it.
        assert_eq!(o.queue(50, t0 + ms(3)), 150);
        assert_eq!(o.head_age(t0 + ms(9)), ms(9));
        // The writer takes the first and writes it: the second is left, queued at 3 ms.
        o.writing(t0);
        o.written(100);
        assert_eq!(o.queued.load(Ordering::Relaxed), 50);
        o.writing(t0 + ms(3));
        assert_eq!(o.head_age(t0 + ms(10)), ms(7));
        // All written: nothing waits.
        o.written(50);
        assert_eq!(o.queued.load(Ordering::Relaxed), 0);
        assert_eq!(o.head_age(t0 + ms(20)), Duration::ZERO);
        assert_eq!(o.written.load(Ordering::Relaxed), 150);
        // The next chunk into the empty queue starts a new clock.
        let queued = o.queue(10, t0 + ms(30));
        assert_eq!(
            (queued, o.stream_end(queued)),
            (10, 160),
            "ends after all ever queued"
        );
        assert_eq!(o.head_age(t0 + ms(31)), ms(1));
    }
}
