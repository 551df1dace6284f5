//! One OpenFlow session per switch: the handshake (§6.3.1: HELLO, version negotiation,
//! FEATURES), keep-alive with ECHO, and the read loop that feeds the core.
//!
//! Whatever a switch sends, the worst it can do is end its own session. A whole message
//! that does not decode (an unknown type, a wrong version, a bad length or value inside) is
//! answered with an OFPT_ERROR (§7.4.4) and counted, and the session goes on, up to
//! [`UNDECODABLE_BURST`] of them at once; a header whose length cannot be, a length that
//! never arrives, or a malformed message before the handshake is done closes that session
//! with a log line; a flood of PACKET_INs beyond the session's budget is dropped and
//! counted. Other switches, and the services, keep working.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use flowgate_core::{Config, RuleEnded};
use ofp::{Framer, Message};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::channel_rtt::{KEEPALIVE_XID, PROBE_XID, ProbePlan, RttProbe};
use super::{Handle, Outflow};

/// Per-session limits.
#[derive(Debug, Clone, Copy)]
pub struct SessionLimits {
    pub echo_interval: Duration,
    pub echo_timeout: Duration,
    /// PACKET_INs handled per second per switch; beyond it they are dropped and counted,
    /// so one switch cannot starve the others of the core.
    pub packet_in_rate: u32,
    /// The handshake must finish within this time.
    pub handshake_timeout: Duration,
}

impl SessionLimits {
    pub fn from_config(cfg: &Config) -> Self {
        SessionLimits {
            echo_interval: cfg.openflow.echo_interval,
            echo_timeout: cfg.openflow.echo_timeout,
            packet_in_rate: cfg.openflow.packet_in_rate,
            handshake_timeout: Duration::from_secs(10),
        }
    }
}

/// Connections in their handshake at once, at most: beyond it a new connection is closed
/// at once and counted (`Handle::handshakes_refused`). Peers that open connections and
/// never finish a handshake then hold at most this many tasks and read buffers, each for
/// the handshake's timeout, not as many as they open. A real switch's handshake takes a
/// few round trips; one refused retries (Open vSwitch after 1 s, backing off to 8 s).
pub const MAX_HANDSHAKES: usize = 256;

pub(super) async fn accept_loop(
    listener: TcpListener,
    handle: Handle,
    tls: Option<tokio_rustls::TlsAcceptor>,
    limits: SessionLimits,
    mut stop: watch::Receiver<bool>,
) {
    let handshakes = Arc::new(tokio::sync::Semaphore::new(MAX_HANDSHAKES));
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.changed() => return,
        };
        let (stream, peer) = match accepted {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(handshaking) = handshakes.clone().try_acquire_owned() else {
            let refused = handle.handshakes_refused.fetch_add(1, Ordering::Relaxed) + 1;
            if refused.is_power_of_two() {
                tracing::warn!(%peer, refused, "{MAX_HANDSHAKES} connections in their handshake: closing new ones");
            }
            continue;
        };
        let _ = stream.set_nodelay(true);
        // A bounded kernel send buffer: what the switch has not read then waits in our own
        // queue, where its age is measured (the controller's outflow delay), not in an
        // autotuned buffer of megabytes that would hide seconds of a slow switch's backlog.
        let sock = socket2::SockRef::from(&stream);
        let _ = sock.set_send_buffer_size(SWITCH_SEND_BUFFER);
        // And a bounded receive buffer: what the controller has not read yet waits at the
        // switch, which bounds its queue of PACKET_INs and drops beyond it (Open vSwitch
        // keeps 100 per connection), so what the controller reads is fresh. An autotuned
        // buffer grows to megabytes: under a flood, seconds of stale SYNs whose clients
        // have long retransmitted, each answered too late, and no answer ever in time.
        let _ = sock.set_recv_buffer_size(SWITCH_RECV_BUFFER);
        if let Some(spin) = &handle.park_spin
            && let Err(e) = spin.watch(&stream)
        {
            // The session runs as it would without the poller: woken by tokio alone.
            tracing::warn!(%peer, error = %e, "cannot watch the switch's socket before parking");
        }
        let handle = handle.clone();
        let stop = stop.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let result = match tls {
                Some(acceptor) => {
                    match tokio::time::timeout(limits.handshake_timeout, acceptor.accept(stream))
                        .await
                    {
                        Ok(Ok(s)) => run_session(s, peer, handle, limits, stop, handshaking).await,
                        Ok(Err(e)) => Err(SessionError::Tls(e.to_string())),
                        Err(_) => Err(SessionError::Timeout("TLS handshake")),
                    }
                }
                None => run_session(stream, peer, handle, limits, stop, handshaking).await,
            };
            match result {
                Ok(()) => tracing::info!(%peer, "switch session closed"),
                Err(e) => tracing::warn!(%peer, error = %e, "switch session ended"),
            }
        });
    }
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum SessionError {
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("bad framing from the switch: {0}")]
    Frame(String),
    #[error("undecodable message from the switch: {0}")]
    Decode(String),
    #[error(
        "{count} undecodable messages from the switch, more than {UNDECODABLE_BURST} at once or {UNDECODABLE_PER_SEC} a second; the last: {last}"
    )]
    TooManyUndecodable { count: u64, last: ofp::DecodeError },
    #[error("version negotiation failed: the switch offers no OpenFlow 1.3")]
    Version,
    #[error("timed out waiting for {0}")]
    Timeout(&'static str),
    #[error("TLS: {0}")]
    Tls(String),
    #[error("protocol: {0}")]
    Protocol(&'static str),
    #[error("the switch stopped reading its messages: {queued} bytes wait for it")]
    StoppedReading { queued: usize },
    #[error("a newer session of the same switch replaced this one")]
    Replaced,
}

/// Reads whole messages off a stream.
struct Reader<R> {
    io: R,
    buf: BytesMut,
    framer: Framer,
}

/// What a [`Reader::fill`] brought.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Filled {
    /// Bytes. `waited`: there were none at first, and the session waited for the switch
    /// (every other task of the worker had its turn meanwhile).
    Bytes { waited: bool },
    /// The switch closed the connection.
    Eof,
}

impl<R: AsyncRead + Unpin> Reader<R> {
    fn new(io: R) -> Self {
        Reader {
            io,
            buf: BytesMut::with_capacity(64 * 1024),
            framer: Framer::new(),
        }
    }

    /// Read what the stream holds, waiting for bytes if it holds none.
    async fn fill(&mut self) -> Result<Filled, SessionError> {
        self.buf.reserve(16 * 1024);
        let mut waited = false;
        let n = {
            let mut read = std::pin::pin!(self.io.read_buf(&mut self.buf));
            std::future::poll_fn(|cx| {
                let r = read.as_mut().poll(cx);
                waited |= r.is_pending();
                r
            })
            .await?
        };
        Ok(if n > 0 {
            Filled::Bytes { waited }
        } else {
            Filled::Eof
        })
    }

    /// A whole frame is buffered (or a framing error, which the next read of it reports).
    fn holds_frame(&self) -> bool {
        !matches!(self.peek_at(0), Ok(None))
    }

    fn next(&mut self) -> Result<Option<Bytes>, SessionError> {
        self.framer
            .next_frame(&mut self.buf)
            .map_err(|e| SessionError::Frame(e.to_string()))
    }

    /// The whole frame that starts `at` bytes into the buffer, in place: the batch reads
    /// its messages where they lie, then [`Reader::consume`]s them together. A `Bytes`
    /// handle per frame is a split and a reference count: 6 % of the controller's CPU with
    /// connections ending (two of every three frames FLOW_REMOVEDs), and for PACKET_INs a
    /// split, a slice and two drops, four atomic operations each.
    fn peek_at(&self, at: usize) -> Result<Option<&[u8]>, SessionError> {
        let rest = self.buf.get(at..).unwrap_or_default();
        let len = self
            .framer
            .frame_len(rest)
            .map_err(|e| SessionError::Frame(e.to_string()))?;
        Ok(len.and_then(|n| rest.get(..n)))
    }

    /// Drop the first `len` bytes: the frames a batch read in place.
    fn consume(&mut self, len: usize) {
        self.buf.advance(len.min(self.buf.len()));
    }
}

/// Queues a message of the session's own (an echo, or a reply to one) for the switch,
/// behind whatever waits already, and counted in the outflow as the core's messages are
/// (the writer subtracts every buffer it writes). Returns where the message ends in all
/// bytes ever queued for the switch ([`Outflow::stream_end`]).
fn queue_for_switch(
    outflow: &Outflow,
    tx: &mpsc::UnboundedSender<super::Chunk>,
    xid: u32,
    msg: &Message,
    now: Instant,
) -> u64 {
    let bytes = encode_one(xid, msg);
    let queued = outflow.queue(bytes.len(), now);
    let _ = tx.send((now, bytes));
    outflow.stream_end(queued)
}

fn encode_one(xid: u32, msg: &Message) -> Bytes {
    let mut b = BytesMut::with_capacity(64);
    // Messages built here (HELLO, FEATURES_REQUEST, ECHO, ERROR) always encode.
    if let Err(e) = ofp::encode(xid, msg, &mut b) {
        tracing::error!(error = %e, "cannot encode a session message");
    }
    b.freeze()
}

async fn run_session<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
    stream: S,
    peer: SocketAddr,
    handle: Handle,
    limits: SessionLimits,
    mut stop: watch::Receiver<bool>,
    handshaking: tokio::sync::OwnedSemaphorePermit,
) -> Result<(), SessionError> {
    let (rd, mut wr) = tokio::io::split(stream);
    let mut rd = Reader::new(rd);

    // The handshake and the session's opening, reads and writes, under one deadline: a
    // peer that sends but never reads (our HELLO, its echoes' replies) cannot hold the
    // task either.
    let opened = tokio::time::timeout(limits.handshake_timeout, async {
        let features = handshake(&mut rd, &mut wr, peer, &handle.openflow_undecodable).await?;
        // In a cluster, claim our role before anything else (the switch starts every
        // connection as EQUAL, which we never use): MASTER with our election's revision
        // as generation_id, or SLAVE. Until the switch confirms MASTER, the core only
        // reads.
        let opening = handle.cluster.session_opening();
        for m in &opening {
            wr.write_all(&encode_one(3, m)).await?;
        }
        Ok::<_, SessionError>((features, opening.is_empty()))
    })
    .await;
    // Out of its handshake, however it went: its place is the next connection's.
    drop(handshaking);
    let (features, writable) = match opened {
        Ok(r) => r?,
        Err(_) => return Err(SessionError::Timeout("the handshake")),
    };
    let dpid = features.datapath_id;
    let n_tables = features.n_tables;
    tracing::info!(%peer, dpid = format_args!("{dpid:016x}"), n_tables, "switch connected");

    let (tx, mut rx) = mpsc::unbounded_channel::<super::Chunk>();
    let outflow = Arc::new(Outflow::default());
    // Made before the core's lock is taken, so that on a panic under the lock, the lock
    // is released before the registration's end takes it again.
    let mut registration = Registration {
        handle: handle.clone(),
        peer,
        dpid,
        id: None,
        writer: None,
    };
    let (replaced, pool) = {
        let mut core = handle.lock();
        let (id, replaced) = core.register(dpid, tx.clone(), outflow.clone(), writable);
        registration.id = Some(id);
        if replaced {
            // §6.3.6: a role is the connection's. The old one's is void, and the new one
            // is not ours as MASTER until the switch confirms it.
            handle.cluster.switch_gone(dpid);
        }
        let now = Instant::now();
        core.with(|c, out| c.handle_switch_up(now, features, out));
        (replaced, core.buffer_pool())
    };
    if replaced {
        tracing::warn!(%peer, dpid = format_args!("{dpid:016x}"), "the switch connected again: its older session is closed");
    }

    // The writer: everything for this switch, in order.
    let flow = outflow.clone();
    registration.writer = Some(tokio::spawn(async move {
        while let Some((queued_at, buf)) = rx.recv().await {
            flow.writing(queued_at);
            if wr.write_all(&buf).await.is_err() {
                break;
            }
            let len = buf.len();
            pool.give_back(buf);
            // The next chunk, if one waits, is the head now; until it is received, its
            // predecessor's time stands in (an overestimate of microseconds).
            flow.written(len);
        }
        let _ = wr.shutdown().await;
    }));

    read_loop(
        &mut rd, &features, &handle, &tx, &outflow, limits, &mut stop,
    )
    .await
}

/// §6.3.1: each side sends HELLO at once; the version is the lower of the two, and a
/// bitmap lets each side say exactly which it supports. Then FEATURES_REQUEST, answered
/// with the switch's features.
async fn handshake<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    rd: &mut Reader<R>,
    wr: &mut W,
    peer: SocketAddr,
    undecodable: &std::sync::atomic::AtomicU64,
) -> Result<ofp::SwitchFeatures, SessionError> {
    wr.write_all(&encode_one(1, &Message::Hello(ofp::Hello::ours())))
        .await?;
    let mut got_hello = false;
    loop {
        let frame = loop {
            if let Some(f) = rd.next()? {
                break f;
            }
            // §6.3.1: the first message is a HELLO (type 0 in every version). Garbage whose
            // header announces a long length is refused now, not at the handshake timeout.
            if !got_hello && rd.buf.len() >= 8 && rd.buf.get(1).is_some_and(|&t| t != 0) {
                return Err(SessionError::Protocol("the first message was not HELLO"));
            }
            if rd.fill().await? == Filled::Eof {
                return Err(SessionError::Protocol("closed during the handshake"));
            }
        };
        let peer_version = frame.first().copied().unwrap_or(0);
        let (xid, msg) = match ofp::decode(frame.clone()) {
            Ok(m) => m,
            Err(e) => {
                // Answered as in the session (§7.4.4), but a peer that cannot send a whole
                // HELLO and FEATURES_REPLY is no switch of ours yet: closed.
                undecodable.fetch_add(1, Ordering::Relaxed);
                if let Some((xid, err)) = ofp::ErrorMsg::answering(&frame, e) {
                    let _ = wr.write_all(&encode_one(xid, &Message::Error(err))).await;
                }
                return Err(SessionError::Decode(e.to_string()));
            }
        };
        if !got_hello {
            let Message::Hello(hello) = &msg else {
                return Err(SessionError::Protocol("the first message was not HELLO"));
            };
            match ofp::negotiate_version(peer_version, hello) {
                Ok(_) => {
                    got_hello = true;
                    wr.write_all(&encode_one(2, &Message::FeaturesRequest))
                        .await?;
                    continue;
                }
                Err(err) => {
                    // §6.3.1: OFPET_HELLO_FAILED / OFPHFC_INCOMPATIBLE, then close.
                    let _ = wr.write_all(&encode_one(xid, &Message::Error(err))).await;
                    return Err(SessionError::Version);
                }
            }
        }
        match msg {
            Message::FeaturesReply(f) => return Ok(f),
            Message::EchoRequest(data) => {
                wr.write_all(&encode_one(xid, &Message::EchoReply(data)))
                    .await?
            }
            Message::Error(e) => {
                tracing::warn!(%peer, error = ?e.kind, "switch sent an error during the handshake");
            }
            _ => {}
        }
    }
}

/// A registered session's end, on every way out of [`run_session`], a panic included
/// (else the switch would stay registered to a dead session): the writer is stopped, and
/// the switch unregistered and taken down if this is still its current session.
struct Registration {
    handle: Handle,
    peer: SocketAddr,
    dpid: flowgate_core::topology::Dpid,
    /// The session's id once registered.
    id: Option<u64>,
    writer: Option<tokio::task::JoinHandle<()>>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Some(w) = &self.writer {
            w.abort();
        }
        let Some(id) = self.id else { return };
        let (dpid, peer) = (self.dpid, self.peer);
        let now = Instant::now();
        let mut core = self.handle.lock();
        // Only the switch's current session takes it down: a replaced one's end must not
        // undo its successor's state (its role in a cluster above all).
        if core.unregister(dpid, id) {
            self.handle.cluster.switch_gone(dpid);
            let mut down = || core.with(|c, out| c.handle_switch_down(now, dpid, out));
            if std::thread::panicking() {
                // A second panic while unwinding would abort the process: caught, it
                // leaves the switch as the core has it (its return resyncs it).
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(down));
            } else {
                down();
            }
        }
        drop(core);
        tracing::info!(%peer, dpid = format_args!("{dpid:016x}"), "switch disconnected");
    }
}

/// `SO_SNDBUF` of a switch connection: a few milliseconds of answers at full rate
/// (500k setups/s × 330 bytes is 165 MB/s), a fraction of a second of a switch that
/// installs a few thousand rules a second.
const SWITCH_SEND_BUFFER: usize = 256 * 1024;

/// `SO_RCVBUF` of a switch connection: about 2,000 PACKET_INs of a SYN, a few milliseconds
/// of work at full rate.
const SWITCH_RECV_BUFFER: usize = 256 * 1024;

/// Bytes queued for a switch beyond which it is behind: its session reads on, but drops
/// the PACKET_INs it reads, unhandled and counted, until the switch has taken all but
/// [`CAUGHT_UP_BYTES`]. Each PACKET_IN handled adds its answers to that queue: handling
/// them faster than the switch takes the answers serves no one sooner, and grows a backlog
/// whose answers come too late (the client sends its SYN again meanwhile).
///
/// The session never stops reading, though. Open vSwitch counts FLOW_REMOVED as a reply,
/// and stops reading a controller that leaves 100 replies unread (`OFCONN_REPLY_MAX` in its
/// connmgr.c), so a session that paused its reads while rules expired waited for a switch
/// that waited for it: the full lab runs' switch timed its controller out with "no response
/// to inactivity probe" and connected again, once per run.
///
/// Sixteen times the controller's default `target_outflow_bytes`, so that its overload
/// control acts first; this is what holds when a switch stalls faster than it can.
pub(crate) const BEHIND_BYTES: usize = 4 << 20;
pub(crate) const CAUGHT_UP_BYTES: usize = BEHIND_BYTES / 2;

/// A switch that is behind (see [`BEHIND_BYTES`]): watched for progress while it is.
struct Behind {
    /// The writer's count of bytes handed to the socket when it last moved, and when.
    progress: (u64, Instant),
}

impl Behind {
    fn new(outflow: &Outflow, now: Instant) -> Self {
        Behind {
            progress: (outflow.written.load(Ordering::Relaxed), now),
        }
    }

    /// Look again at `now`: `Err` once the switch has taken no byte for `stall` (the
    /// keep-alive's interval and timeout together: what the echo allows a silent peer).
    fn look(
        &mut self,
        outflow: &Outflow,
        now: Instant,
        stall: Duration,
    ) -> Result<(), SessionError> {
        let written = outflow.written.load(Ordering::Relaxed);
        if written != self.progress.0 {
            self.progress = (written, now);
        } else if now.saturating_duration_since(self.progress.1) >= stall {
            return Err(stopped_reading(outflow));
        }
        Ok(())
    }
}

fn stopped_reading(outflow: &Outflow) -> SessionError {
    SessionError::StoppedReading {
        queued: outflow.queued.load(Ordering::Relaxed),
    }
}

async fn read_loop<R: AsyncRead + Unpin>(
    rd: &mut Reader<R>,
    features: &ofp::SwitchFeatures,
    handle: &Handle,
    tx: &mpsc::UnboundedSender<super::Chunk>,
    outflow: &Outflow,
    limits: SessionLimits,
    stop: &mut watch::Receiver<bool>,
) -> Result<(), SessionError> {
    let mut last_heard = Instant::now();
    let mut filled_at = last_heard;
    // The writer's count of bytes taken by the switch, when the keep-alive last looked.
    let mut taken = outflow.written.load(Ordering::Relaxed);
    let mut echo_sent = false;
    let mut budget = TokenBucket::new(limits.packet_in_rate);
    let mut dropped_packet_ins: u64 = 0;
    let mut unreported_drops: u64 = 0;
    let mut batch: Vec<Pending> = Vec::with_capacity(256);
    let mut undecodable = Undecodable::new(Instant::now());
    // The batch's PACKET_INs the core found malformed, answered once it is done: where
    // they lie and why. Empty, and so never allocated, unless a switch sends one.
    let mut bad_packet_ins: Vec<(usize, usize, ofp::DecodeError)> = Vec::new();
    let mut latencies = super::latency::BatchHistogram::default();
    let dpid = features.datapath_id;
    // Set while the switch is behind (see `BEHIND_BYTES`); how many times it has been.
    let mut behind: Option<Behind> = None;
    let mut behind_spells: u64 = 0;
    let stall = limits.echo_interval + limits.echo_timeout;
    // A batch was handled and the session has not waited since.
    let mut handled_batch = false;
    let mut rtt = RttProbe::default();
    // The wait's deadline (keep-alive or probe). One timer, kept: moved earlier when the
    // deadline is, and otherwise left to fire early, once an interval, where a timer made
    // per wait cost every batch an entry in tokio's wheel, added and removed.
    let deadline = tokio::time::sleep(limits.echo_interval);
    tokio::pin!(deadline);
    loop {
        // The answers wait for this session's writer, a task of the same runtime. While
        // the switch keeps our socket full, every read is ready at once, and this loop ran
        // on (until tokio's cooperative budget ran out, 128 reads of up to 256 PACKET_INs)
        // before the writer did: in `ovs_overload_packet_in_flood` up to 950 KB waited in
        // our queue while `ss` showed the socket to the switch empty, the meter changes
        // reached the switch 3 s late, and the quiet service's new connections took
        // 233–1,034 ms at the median (53–73 ms since). So a batch is a turn, for its
        // writer and as much for the other switches' sessions and the tick task on this
        // worker (a flood its gate refuses leaves no bytes for the writer, but would hold
        // those back as long): before the next batch, a session that has not waited for
        // its switch since the last one yields. One that has waited gave the others their
        // turn then; its yield would only cost the worker a poll of its sockets and the
        // reader one more turn (at 850,000 setups/s, 1.6–1.8 `epoll_wait` per read with
        // it, 1.0 without).
        if handled_batch && rd.holds_frame() {
            handled_batch = false;
            tokio::task::yield_now().await;
        }
        if outflow.overflowed.load(Ordering::Relaxed) {
            return Err(stopped_reading(outflow));
        }
        if outflow.replaced.load(Ordering::Relaxed) {
            return Err(SessionError::Replaced);
        }
        // The turn's one clock read: for the backlog's look and the batch's start.
        let work_start = Instant::now();
        let queued = outflow.queued.load(Ordering::Relaxed);
        behind = match behind.take() {
            None if queued > BEHIND_BYTES => {
                behind_spells += 1;
                if behind_spells.is_power_of_two() {
                    tracing::warn!(
                        dpid = format_args!("{dpid:016x}"),
                        spells = behind_spells,
                        "the switch takes its messages slower than it sends PACKET_INs: dropping its PACKET_INs until it catches up"
                    );
                }
                Some(Behind::new(outflow, work_start))
            }
            Some(mut b) => {
                b.look(outflow, work_start, stall)?;
                (queued > CAUGHT_UP_BYTES).then_some(b)
            }
            None => None,
        };
        rtt.set_plan(
            ProbePlan::of_bits(handle.rtt_probe.load(Ordering::Relaxed)),
            work_start,
        );
        // Loaded only while a probe waits to be written: the writer's thread changes the
        // count with every buffer, so a load every turn would miss the cache every turn.
        if rtt.awaits_write() {
            rtt.observe_written(outflow.written.load(Ordering::Relaxed), work_start);
        }
        // An ECHO_REQUEST must be answered (§7.5.2). A switch that leaves the probe
        // unanswered as long as the keep-alive may wait is as dead as one that leaves the
        // keep-alive so, however much else it sends; kept on, its probe's age would read
        // as the channel's round trip and hold every switch's new flows to the least rate.
        // Only where the overload control reads it (see `ProbePlan`).
        if rtt.for_overload() && rtt.unanswered_for(work_start) > limits.echo_timeout {
            return Err(SessionError::Timeout(
                "an echo reply to the round-trip probe (dead peer)",
            ));
        }
        if rtt.due().is_some_and(|due| due <= work_start) {
            // Behind whatever is queued for the switch already, as a new flow's answer is.
            let echo = Message::EchoRequest(Bytes::new());
            let ends_at = queue_for_switch(outflow, tx, PROBE_XID, &echo, work_start);
            rtt.sent(work_start, ends_at);
        }
        // Take everything already buffered, then hand the batch to the core in one lock.
        batch.clear();
        // Refilled once a batch: every frame of it was already buffered at `work_start`.
        budget.refill(work_start);
        let mut packet_ins = 0u64;
        // The batch's frames stay in the read buffer until it is handled: `scanned` bytes
        // of it are the batch's.
        let mut scanned = 0;
        while let Some(peeked) = rd.peek_at(scanned)? {
            // The framer checked the header (§7.1): byte 1 is the type.
            let msg_type = peeked.get(1).copied().unwrap_or_default();
            let len = peeked.len();
            let at = scanned;
            scanned += len;
            if msg_type == ofp::MsgType::FlowRemoved as u8 {
                // Read in place, outside the lock, and never decoded (see `RuleEnded`). A
                // bad one is answered, as any message that does not decode is.
                let read = ofp::FlowRemovedView::new(peeked).map(|v| RuleEnded::of_view(&v));
                match read {
                    Ok(e) => batch.push(Pending::Ended(e)),
                    Err(e) => undecodable.answer(peeked, e, dpid, handle, outflow, tx)?,
                }
            } else if msg_type == ofp::MsgType::PacketIn as u8 {
                if super::cluster::standby_drops_packet_in(handle, features, peeked) {
                    // TCP on a standby's session: the master's (see `on_switch_message`).
                } else if behind.is_some() {
                    // Read and let go, unhandled (see `BEHIND_BYTES`). Offered to the
                    // controller all the same: reported with the next batch.
                    unreported_drops += 1;
                    handle
                        .packet_in_dropped_behind
                        .fetch_add(1, Ordering::Relaxed);
                } else if budget.take() {
                    packet_ins += 1;
                    batch.push(Pending::Frame { at, len });
                } else {
                    dropped_packet_ins += 1;
                    // Reported with the next batch that reaches the core.
                    unreported_drops += 1;
                    handle.packet_in_dropped.fetch_add(1, Ordering::Relaxed);
                    if dropped_packet_ins.is_power_of_two() {
                        tracing::warn!(
                            dpid = format_args!("{dpid:016x}"),
                            dropped = dropped_packet_ins,
                            "PACKET_IN flood: dropping beyond the session budget"
                        );
                    }
                }
            } else {
                // Rare (echoes, errors, replies): decoded from a copy of their own.
                let (xid, msg) = match ofp::decode(Bytes::copy_from_slice(peeked)) {
                    Ok(m) => m,
                    Err(e) => {
                        undecodable.answer(peeked, e, dpid, handle, outflow, tx)?;
                        continue;
                    }
                };
                match msg {
                    Message::EchoRequest(data) => {
                        let reply = Message::EchoReply(data);
                        queue_for_switch(outflow, tx, xid, &reply, Instant::now());
                    }
                    Message::EchoReply(_) => rtt.answered(xid, Instant::now()),
                    // Role replies, role-status and IS_SLAVE/STALE errors: the cluster layer.
                    ref m if super::cluster::on_switch_message(handle, features, m) => {}
                    Message::Error(ref e) => {
                        tracing::warn!(dpid = format_args!("{dpid:016x}"), xid, error = ?e.kind, "OpenFlow error from the switch");
                        batch.push(Pending::Decoded(Box::new(msg)));
                    }
                    // The runtime's own aggregate stats request (per-switch flow count, API).
                    Message::MultipartReply(ofp::MultipartReply {
                        body: ofp::MultipartReplyBody::Aggregate(a),
                        ..
                    }) => handle.record_flow_count(dpid, a.flow_count),
                    other => batch.push(Pending::Decoded(Box::new(other))),
                }
            }
            if batch.len() >= 256 {
                break;
            }
        }
        if batch.is_empty() {
            // Answered here (echoes), dropped, or the cluster layer's: done with.
            rd.consume(scanned);
        } else {
            let now = Instant::now();
            let mut core = handle.lock();
            // Set under this lock: nothing of a replaced session's reaches the core.
            if outflow.replaced.load(Ordering::Relaxed) {
                return Err(SessionError::Replaced);
            }
            let locked = Instant::now();
            let (mut shed_work, mut shed_n) = (Duration::ZERO, 0u32);
            bad_packet_ins.clear();
            let n = batch.len();
            let buf: &[u8] = &rd.buf;
            // A frame of the batch, where it lies (always there: `scanned` covers it).
            let frame = |at: usize, len: usize| buf.get(at..at + len).unwrap_or_default();
            core.with(|c, out| {
                // Before the batch's FLOW_REMOVEDs are judged: a switch this far behind
                // is not trusted to say that a backend did not answer.
                if let Some(reading) = rtt.report(now)
                    // Not a reading of probes a reload has turned off since this turn began
                    // (it forgot the readings, under this lock).
                    && rtt.follows(ProbePlan::of_bits(handle.rtt_probe.load(Ordering::Relaxed)))
                {
                    c.note_channel_rtt(now, dpid, reading);
                }
                // The batch's connection-table lines, loaded together (see the method).
                for p in &batch {
                    match *p {
                        Pending::Frame { at, len } => c.prefetch_packet_in(frame(at, len)),
                        Pending::Ended(ref e) => c.prefetch_rule_ended(e),
                        _ => {}
                    }
                }
                // One clock read per PACKET_IN: the end of one is the start of the next
                // (the clock was 2.7 % of the controller's CPU read twice each). `t` is
                // `None` after a message of another kind, whose time is not counted.
                let clock = &handle.clock;
                let mut t = Some(clock.raw());
                for p in batch.drain(..) {
                    match p {
                        // PACKET_INs are read in place, never decoded into a `Message`
                        // (792 bytes, and its packet's reference count): the core takes
                        // the frame through `ofp::PacketInView`.
                        Pending::Frame { at, len } => {
                            let shed_before = c.shed_total();
                            let start = t.unwrap_or_else(|| clock.raw());
                            let f = frame(at, len);
                            if let Err(e) = c.handle_packet_in_frame(now, dpid, f, out) {
                                // The rest of the batch is handled as ever; this one is
                                // answered after it, outside this closure.
                                bad_packet_ins.push((at, len, e));
                                t = None;
                                continue;
                            }
                            let end = clock.raw();
                            t = Some(end);
                            let took = clock.delta(start, end);
                            if c.shed_total() == shed_before {
                                // Decision latency: the core's whole handling of one
                                // PACKET_IN (into the shared histogram after the batch).
                                latencies.observe(took);
                            } else {
                                shed_work += took;
                                shed_n += 1;
                            }
                        }
                        Pending::Decoded(m) => {
                            c.handle_message(now, dpid, &m, out);
                            t = None;
                        }
                        Pending::Ended(e) => {
                            c.handle_rule_ended(now, dpid, &e, out);
                            t = None;
                        }
                    }
                }
            });
            handle.decision_latency.add(&mut latencies);
            // Still in the buffer until `consume` (rare: an answer each, not the core's work).
            for &(at, len, e) in &bad_packet_ins {
                let f = rd.buf.get(at..at + len).unwrap_or_default();
                undecodable.answer(f, e, dpid, handle, outflow, tx)?;
            }
            rd.consume(scanned);
            let done = Instant::now();
            // The shed PACKET_INs' part of reading and framing, pro rata.
            let decoding = now.saturating_duration_since(work_start);
            let shed = shed_work + decoding.mul_f64(f64::from(shed_n) / n as f64);
            // Overload control of the controller itself: its PACKET_IN work (framing, decode
            // and decisions, not the wait for the lock), how long the batch's bytes waited
            // since they were read, and what is still buffered behind it.
            core.controller
                .record_packet_in_work(flowgate_core::overload::WorkSample {
                    packet_ins,
                    session_dropped: std::mem::take(&mut unreported_drops),
                    shed,
                    busy: now.saturating_duration_since(work_start)
                        + done.saturating_duration_since(locked),
                    queueing: done.saturating_duration_since(filled_at),
                    backlog: rd.buf.len() as u64,
                    outflow: outflow.queued.load(Ordering::Relaxed) as u64,
                    outflow_delay: outflow.head_age(done),
                    // The overload control's, while adaptive; zero otherwise, as its
                    // view says (`channel_rtt_ms`: 0 while the control is off).
                    channel_rtt: if rtt.for_overload() {
                        rtt.reading(done)
                    } else {
                        Duration::ZERO
                    },
                    switch: dpid,
                });
            handled_batch = true;
            continue;
        }
        // Nothing buffered: wait for bytes, the keep-alive timer, or shutdown.
        let wait = if echo_sent {
            limits.echo_timeout
        } else {
            limits.echo_interval
        };
        let idle_for = last_heard.elapsed();
        let keepalive_left = wait.saturating_sub(idle_for);
        // Woken for the next probe too: it is sent at the top of the loop.
        let left = rtt.due().map_or(keepalive_left, |due| {
            keepalive_left.min(due.saturating_duration_since(Instant::now()))
        });
        // A reload that turns the probes on or off wakes the wait. Registered before the
        // interval is read again: a change after the read is then told to this waiter.
        let reloaded = handle.rtt_probe_changed.notified();
        if !rtt.follows(ProbePlan::of_bits(handle.rtt_probe.load(Ordering::Relaxed))) {
            continue;
        }
        let wake_at = tokio::time::Instant::now() + left;
        if deadline.is_elapsed() || deadline.deadline() > wake_at {
            deadline.as_mut().reset(wake_at);
        }
        tokio::select! {
            r = rd.fill() => match r {
                Ok(Filled::Bytes { waited }) => {
                    last_heard = Instant::now();
                    filled_at = last_heard;
                    echo_sent = false;
                    handled_batch &= !waited;
                }
                Ok(Filled::Eof) => return Ok(()),
                Err(e) => return Err(e),
            },
            () = &mut deadline => {
                // A switch that takes its bytes is as alive as one that sends some: one
                // behind on them is busy, not dead (the keep-alive's answer waits behind
                // what it has yet to take).
                let written = outflow.written.load(Ordering::Relaxed);
                if written != taken {
                    taken = written;
                    last_heard = Instant::now();
                }
                if last_heard.elapsed() < wait {
                    continue; // early (the deadline moved on), or the probe's turn
                }
                if echo_sent {
                    return Err(SessionError::Timeout("an echo reply (dead peer)"));
                }
                let echo = Message::EchoRequest(Bytes::new());
                queue_for_switch(outflow, tx, KEEPALIVE_XID, &echo, Instant::now());
                echo_sent = true;
                last_heard = Instant::now();
            }
            () = reloaded => {}
            () = outflow.closing.notified() => {}
            _ = stop.changed() => return Ok(()),
        }
    }
}

/// A message of a batch for the core: a PACKET_IN as where its bytes lie, which the core
/// reads in place (checked as it is handled: a bad one is answered after the batch); a
/// FLOW_REMOVED as the core reads it; the rest decoded already (boxed: they are rare, and a
/// `Message` is 792 bytes).
enum Pending {
    /// A PACKET_IN: where it lies in the read buffer.
    Frame {
        at: usize,
        len: usize,
    },
    /// A FLOW_REMOVED, as the core reads it.
    Ended(RuleEnded),
    Decoded(Box<Message>),
}

/// Undecodable messages a session answers at once before it is closed. A switch that
/// speaks OpenFlow 1.3 sends none; one whose codec disagrees with ours on some message
/// (a type or a field it sends that we do not read) sends one per such event, a few at a
/// time, and is answered so that its log shows why. A peer past this many in a row, or
/// past [`UNDECODABLE_PER_SEC`] on average, is sending garbage: each costs a decode, a
/// 76-byte answer and a warning, which it could otherwise keep up as long as it likes.
pub(crate) const UNDECODABLE_BURST: u32 = 64;
/// The rate at which a session's allowance of undecodable messages comes back.
pub(crate) const UNDECODABLE_PER_SEC: u32 = 1;

/// A session's messages that were framed whole (§7.1) but do not decode: each is answered
/// with an OFPT_ERROR (`ofp::ErrorMsg::answering`, §7.4.4: OFPET_BAD_REQUEST with the
/// offending xid and its first 64 bytes), counted, and the session goes on (Open vSwitch
/// does the same for the controller's), within a token bucket of [`UNDECODABLE_BURST`]
/// refilled at [`UNDECODABLE_PER_SEC`]. A wrong version on any message but HELLO is one of
/// them (OFPBRC_BAD_VERSION): the spec asks for the error, not for closing the connection.
struct Undecodable {
    /// In this session, for the log.
    count: u64,
    allowance: TokenBucket,
}

impl Undecodable {
    fn new(now: Instant) -> Self {
        Undecodable {
            count: 0,
            allowance: TokenBucket::with_burst(UNDECODABLE_PER_SEC, UNDECODABLE_BURST, now),
        }
    }

    /// Answer `frame`, which does not decode for `e`. `Err` once the session is past its
    /// bound: it is then closed.
    fn answer(
        &mut self,
        frame: &[u8],
        e: ofp::DecodeError,
        dpid: flowgate_core::topology::Dpid,
        handle: &Handle,
        outflow: &Outflow,
        tx: &mpsc::UnboundedSender<super::Chunk>,
    ) -> Result<(), SessionError> {
        let now = Instant::now();
        self.count += 1;
        handle.openflow_undecodable.fetch_add(1, Ordering::Relaxed);
        let answer = ofp::ErrorMsg::answering(frame, e);
        if self.count.is_power_of_two() {
            let code = answer.as_ref().and_then(|(_, m)| m.kind.code_name());
            tracing::warn!(
                dpid = format_args!("{dpid:016x}"),
                version = frame.first().copied().unwrap_or_default(),
                msg_type = frame.get(1).copied().unwrap_or_default(),
                len = frame.len(),
                error = %e,
                answer = code.unwrap_or("none (an OFPT_ERROR is not answered)"),
                undecodable = self.count,
                "a message from the switch does not decode: skipped, and answered with OFPT_ERROR unless it is one"
            );
        }
        if let Some((xid, err)) = answer {
            queue_for_switch(outflow, tx, xid, &Message::Error(err), now);
        }
        if !self.allow(now) {
            return Err(SessionError::TooManyUndecodable {
                count: self.count,
                last: e,
            });
        }
        Ok(())
    }

    /// One more within the bound? Takes one of the allowance, refilled since the last.
    fn allow(&mut self, now: Instant) -> bool {
        self.allowance.refill(now);
        self.allowance.take()
    }
}

/// A plain token bucket: `rate` per second, bursts of `burst`, full at the start.
struct TokenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// Bursts of one second's worth.
    fn new(rate: u32) -> Self {
        Self::with_burst(rate, rate, Instant::now())
    }

    fn with_burst(rate: u32, burst: u32, now: Instant) -> Self {
        TokenBucket {
            rate: f64::from(rate),
            burst: f64::from(burst),
            tokens: f64::from(burst),
            last: now,
        }
    }

    /// Add what has accrued since the last refill, up to `burst`.
    fn refill(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + dt * self.rate).min(self.burst);
    }

    /// Take one token, if there is one.
    fn take(&mut self) -> bool {
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
    }

    /// A session's end runs however its task ends, a panic included: the switch is
    /// unregistered (not left to a dead session) and the writer stopped.
    #[test]
    fn a_session_that_panics_is_unregistered() {
        runtime().block_on(async {
            let config = Config::from_toml("", &|_| None).expect("the default config");
            let handle = Handle::new(flowgate_core::Controller::new(&config), config, None);
            let (writer_gone_tx, writer_gone) = tokio::sync::oneshot::channel::<()>();
            let h = handle.clone();
            let task = tokio::spawn(async move {
                let mut reg = Registration {
                    handle: h.clone(),
                    peer: SocketAddr::from(([127, 0, 0, 1], 6653)),
                    dpid: 7,
                    id: None,
                    writer: Some(tokio::spawn(async move {
                        let _gone = writer_gone_tx;
                        std::future::pending::<()>().await
                    })),
                };
                let (tx, _rx) = mpsc::unbounded_channel();
                reg.id = Some(h.lock().register(7, tx, Arc::default(), true).0);
                // Across an await, as the session holds it.
                tokio::task::yield_now().await;
                panic!("a bug in the session");
            });
            assert!(task.await.is_err_and(|e| e.is_panic()));
            assert!(handle.lock().sessions.is_empty(), "still registered");
            assert!(writer_gone.await.is_err(), "the writer was stopped");
        });
    }

    /// A read of bytes already there did not wait; one that found none waited for the
    /// peer (the session then yields no turn before its next batch: it gave one).
    #[test]
    fn a_fill_tells_whether_it_waited_for_the_switch() {
        runtime().block_on(async {
            let (ours, mut theirs) = tokio::io::duplex(4096);
            let mut rd = Reader::new(ours);
            theirs.write_all(&[1, 2, 3]).await.expect("write");
            assert_eq!(
                rd.fill().await.expect("fill"),
                Filled::Bytes { waited: false },
                "the bytes were there"
            );

            let late = tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                theirs.write_all(&[4]).await.expect("write");
                theirs
            });
            assert_eq!(
                rd.fill().await.expect("fill"),
                Filled::Bytes { waited: true },
                "nothing was there: it waited for the write"
            );
            assert_eq!(&rd.buf[..], &[1, 2, 3, 4]);

            drop(late.await.expect("writer"));
            assert_eq!(rd.fill().await.expect("fill"), Filled::Eof);
        });
    }

    /// The PACKET_IN budget: a second's worth at first, then what accrues, never more
    /// than a second's worth.
    #[test]
    fn the_budget_allows_its_rate_with_bursts_of_a_second() {
        let mut b = TokenBucket::new(10);
        let t0 = b.last;
        let takes = |b: &mut TokenBucket| (0..100).take_while(|_| b.take()).count();
        assert_eq!(takes(&mut b), 10, "a second's worth at first");
        b.refill(t0 + Duration::from_millis(500));
        assert_eq!(takes(&mut b), 5, "half a second's worth");
        b.refill(t0 + Duration::from_secs(60));
        assert_eq!(takes(&mut b), 10, "never more than a second's worth");
        b.refill(t0 + Duration::from_secs(60));
        assert_eq!(takes(&mut b), 0, "nothing accrues in no time");
    }

    /// Undecodable messages: 64 at once, the 65th closes the session; then one a second
    /// comes back, never more than 64.
    #[test]
    fn undecodable_messages_are_allowed_64_at_once_then_one_a_second() {
        let t0 = Instant::now();
        let mut u = Undecodable::new(t0);
        let allowed =
            |u: &mut Undecodable, at: Instant| (0..1000).take_while(|_| u.allow(at)).count();
        assert_eq!(allowed(&mut u, t0), 64, "64 at once");
        assert_eq!(
            allowed(&mut u, t0 + Duration::from_secs(10)),
            10,
            "one a second"
        );
        assert_eq!(
            allowed(&mut u, t0 + Duration::from_secs(3600)),
            64,
            "never more than 64"
        );
    }

    /// Whether a whole message waits in the buffer: not for part of one, yes for one,
    /// and yes for a bad header (its read then ends the session).
    #[test]
    fn holds_frame_sees_whole_messages_only() {
        let echo = encode_one(7, &Message::EchoRequest(Bytes::new()));
        let mut rd = Reader::new(tokio::io::empty());
        assert!(!rd.holds_frame(), "empty");
        rd.buf.extend_from_slice(&echo[..5]);
        assert!(!rd.holds_frame(), "a header's first bytes");
        rd.buf.extend_from_slice(&echo[5..]);
        assert!(rd.holds_frame(), "a whole echo");
        rd.consume(echo.len());
        // Version 4, type 2, a length shorter than the header itself (§7.1).
        rd.buf.extend_from_slice(&[4, 2, 0, 4, 0, 0, 0, 1]);
        assert!(rd.holds_frame(), "a bad header is for the read to report");
        assert!(rd.peek_at(0).is_err());
    }
}
