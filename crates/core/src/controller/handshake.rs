//! Rules after the handshake, while the controller gaps itself.
//!
//! Each connection the controller admits costs the switch two exact-match rules at its
//! edge (more along a path), held for the idle timeout; on Open vSwitch every flow-table
//! change also makes ovs-vswitchd revalidate its datapath flows. A SYN flood admitted at
//! the controller's rate fills the flow table with rules of connections that never
//! complete, and the switch slows for everyone: in `ovs_overload_packet_in_flood` the
//! PACKET_IN rate OVS delivered sank to a quarter, and a quiet service lost 9–36 % of its
//! new connections, when the controller's gate let its whole admitted rate through.
//!
//! So while the controller gaps a service's new flows, it may decide a SYN and send it
//! on (PACKET_OUT) *without* rules, as a SYN proxy defers its state: the backend's
//! SYN-ACK comes up and is sent back the same way, and the client's ACK, the proof that a
//! client is there and answered, installs the rules. A connection whose client never
//! answers is forgotten after [`HANDSHAKE_TIMEOUT_MS`] and leaves nothing in the switch; one
//! whose client answers the SYN-ACK with a RST (a spoofed source that is a real host) is
//! forgotten at once, the RST sent on so the backend drops its half-open connection.
//!
//! Deferring costs an admitted connection two more PACKET_INs, which real clients (a
//! flash crowd) would pay for nothing. The controller therefore measures who it serves:
//! each gapping episode starts deferring every admission, and after every
//! `WINDOW` outcomes (handshakes completed or abandoned) it defers all admissions only
//! while most clients abandon; otherwise one in `SAMPLE_EVERY`, to keep measuring.

use std::collections::{HashMap, VecDeque};

use crate::conntrack::{Conn, ConnKey};

/// How long a deferred connection waits for its client's ACK: a client retransmits its
/// SYN after 1 s and a backend its SYN-ACK after 1 s (Linux), so this outlasts one loss
/// of either, and the PACKET_INs a meter dropped.
pub const HANDSHAKE_TIMEOUT_MS: u64 = 3_000;

/// The reply-catch rules' hard timeout (seconds), and how often they are sent again.
pub const CATCH_HARD_TIMEOUT_S: u16 = 5;
const CATCH_REFRESH_MS: u64 = 2_000;

/// Outcomes per verdict on whether the clients complete.
pub(crate) const WINDOW: u32 = 16;

/// While the clients complete, one admission in this many is still deferred. Each costs
/// the controller two more PACKET_INs, at the time it is short of them: one in 8 took
/// a fifth of an overloaded controller's PACKET_INs in `flowgate sim` (12,448 of 67,001),
/// one in 32 about 8 % (5,092 of 61,670), and a flood that starts within an episode is still
/// found within `WINDOW × SAMPLE_EVERY` = 512 admissions (the gate bounds what it installs
/// meanwhile, and their rules idle out).
const SAMPLE_EVERY: u32 = 32;

/// One service's handshake state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct ServiceHandshakes {
    /// The last window of outcomes found most clients complete: only a sample of
    /// admissions is deferred.
    pub clients_complete: bool,
    /// Admissions since the last sampled one.
    #[serde(skip)]
    since_sample: u32,
    #[serde(skip)]
    window_completed: u32,
    #[serde(skip)]
    window_abandoned: u32,
    /// When the backends' reply-catch rules were last sent (`rules::reply_catch`).
    #[serde(skip)]
    catch_sent_ms: Option<u64>,
    /// Connections admitted without rules, ever.
    pub deferred: u64,
    /// Deferred connections whose client's ACK installed the rules.
    pub completed: u64,
    /// Deferred connections the client never completed (timed out or reset).
    pub abandoned: u64,
}

impl ServiceHandshakes {
    /// Whether the rules of a connection admitted now wait for the handshake. `gapping`:
    /// the controller is gapping this service's new flows.
    pub fn defer(&mut self, gapping: bool) -> bool {
        if !gapping {
            // The next episode starts distrusting again.
            self.clients_complete = false;
            self.since_sample = 0;
            self.window_completed = 0;
            self.window_abandoned = 0;
            return false;
        }
        let defer = if self.clients_complete {
            self.since_sample += 1;
            if self.since_sample >= SAMPLE_EVERY {
                self.since_sample = 0;
                true
            } else {
                false
            }
        } else {
            true
        };
        if defer {
            self.deferred += 1;
        }
        defer
    }

    /// A deferred connection's client completed the handshake (`true`) or never did.
    pub fn outcome(&mut self, completed: bool) {
        if completed {
            self.completed += 1;
            self.window_completed += 1;
        } else {
            self.abandoned += 1;
            self.window_abandoned += 1;
        }
        if self.window_completed + self.window_abandoned >= WINDOW {
            self.clients_complete = self.window_completed > self.window_abandoned;
            self.window_completed = 0;
            self.window_abandoned = 0;
        }
    }

    /// Whether the reply-catch rules are due at `now_ms`, as a connection is deferred: the
    /// first time, and again every `CATCH_REFRESH_MS` while deferrals go on (before
    /// they end by themselves).
    pub fn catch_due(&mut self, now_ms: u64) -> bool {
        if self
            .catch_sent_ms
            .is_some_and(|t| now_ms.saturating_sub(t) < CATCH_REFRESH_MS)
        {
            return false;
        }
        self.catch_sent_ms = Some(now_ms);
        true
    }

    /// A switch (re)connected and lost its rules: send them at the next deferral.
    pub fn catch_lost(&mut self) {
        self.catch_sent_ms = None;
    }
}

/// A connection admitted without rules, waiting for its client's ACK.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Waiting {
    pub(crate) due_ms: u64,
    pub(crate) key: ConnKey,
    pub(crate) tag: u16,
}

/// The deferred connections of all services, oldest first (they share one timeout, so
/// the queue is in deadline order and the expiry scan stops at the first not yet due).
#[derive(Debug, Default)]
pub(crate) struct Handshakes {
    pub(crate) waiting: VecDeque<Waiting>,
    /// The backend's initial sequence number of each deferred connection whose SYN-ACK
    /// passed through the controller: the client's ACK must acknowledge it (SEG.ACK =
    /// ISN + 1, RFC 9293 §3.10.7.3) to install the rules, so a blind ACK from a spoofed
    /// source (its sender knows its own 4-tuple, not the backend's ISN) installs nothing,
    /// as a SYN cookie must be echoed. Only deferred connections are here, and each
    /// leaves with its connection.
    pub(crate) syn_acks: HashMap<ConnKey, u32, ahash::RandomState>,
    /// Connections whose rule at the client's edge ended before their client completed the
    /// handshake through it, by 4-tuple (see [`Handshakes::remember_aborted`]).
    aborted: HashMap<ConnKey, Aborted, ahash::RandomState>,
    /// The same, oldest first, for their expiry (an entry whose key was remembered again
    /// since, or taken, is skipped).
    aborted_order: VecDeque<(u64, ConnKey)>,
}

/// How long a connection ended during its handshake is remembered: its client sends its
/// SYN again 1, 3 and 7 s after the first (Linux), so this covers the retransmissions
/// that follow the end of its rule.
pub const ABORTED_KEEP_MS: u64 = 8_000;

/// Such connections remembered at most: the oldest go first.
const MAX_ABORTED: usize = 65_536;

/// A connection ended during its handshake: what its client's retransmitted SYN needs.
#[derive(Debug, Clone, Copy)]
struct Aborted {
    conn: Conn,
    until_ms: u64,
}

impl Handshakes {
    pub(crate) fn wait(&mut self, created_ms: u64, key: ConnKey, tag: u16) {
        self.waiting.push_back(Waiting {
            due_ms: created_ms + HANDSHAKE_TIMEOUT_MS,
            key,
            tag,
        });
    }

    /// The next waiting connection whose time is up at `now_ms`.
    pub(crate) fn next_due(&mut self, now_ms: u64) -> Option<Waiting> {
        if self.waiting.front()?.due_ms <= now_ms {
            self.waiting.pop_front()
        } else {
            None
        }
    }

    /// Connection `key` ended at `now_ms` before its client completed the handshake
    /// through its rule (the rule carried at most the client's RST: Open vSwitch's
    /// `fin_timeout` then ends it a second later, about when the client sends its SYN
    /// again). Its SYN was decided and counted; a retransmission of that SYN (same ISN)
    /// is the same connection, not a new one (see [`Handshakes::take_aborted`]).
    pub(crate) fn remember_aborted(&mut self, now_ms: u64, key: ConnKey, conn: Conn) {
        if conn.isn.is_none() {
            return;
        }
        if self.aborted.len() >= MAX_ABORTED
            && let Some((_, oldest)) = self.aborted_order.pop_front()
        {
            self.aborted.remove(&oldest);
        }
        let until_ms = now_ms + ABORTED_KEEP_MS;
        self.aborted.insert(key, Aborted { conn, until_ms });
        self.aborted_order.push_back((until_ms, key));
    }

    /// The connection ended during its handshake on `key`, if `seq` is its client's ISN
    /// (a retransmission of its SYN). Forgotten either way: another ISN is a new
    /// connection on the 4-tuple.
    pub(crate) fn take_aborted(&mut self, key: &ConnKey, seq: u32) -> Option<Conn> {
        if self.aborted.is_empty() {
            return None;
        }
        let a = self.aborted.remove(key)?;
        a.conn.is_own_syn(seq).then_some(a.conn)
    }

    /// The connection ended during its handshake on `key`, if it is remembered still.
    pub(crate) fn aborted(&self, key: &ConnKey) -> Option<Conn> {
        self.aborted.get(key).map(|a| a.conn)
    }

    /// Forget the connections ended during their handshake longer ago than
    /// [`ABORTED_KEEP_MS`].
    pub(crate) fn expire_aborted(&mut self, now_ms: u64) {
        while let Some(&(until_ms, key)) = self.aborted_order.front() {
            if until_ms > now_ms {
                break;
            }
            self.aborted_order.pop_front();
            if self.aborted.get(&key).is_some_and(|a| a.until_ms <= now_ms) {
                self.aborted.remove(&key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_episode_defers_everything_until_clients_prove_themselves() {
        let mut h = ServiceHandshakes::default();
        assert!(!h.defer(false), "not gapping: rules at once");
        assert!((0..WINDOW).all(|_| h.defer(true)), "distrust at first");
        for _ in 0..WINDOW {
            h.outcome(true);
        }
        let deferred: usize = (0..8 * SAMPLE_EVERY).filter(|_| h.defer(true)).count();
        assert_eq!(deferred, 8, "then one in {SAMPLE_EVERY}");
        // A flood: the sampled clients abandon, and everything is deferred again.
        for _ in 0..WINDOW {
            h.outcome(false);
        }
        assert!(!h.clients_complete);
        assert!((0..100).all(|_| h.defer(true)));
        // A mixed window decides by majority; a tie keeps distrusting.
        for i in 0..WINDOW {
            h.outcome(i % 2 == 0);
        }
        assert!(!h.clients_complete);
        // The episode ends; the next one starts distrusting whatever the last window said.
        for _ in 0..WINDOW {
            h.outcome(true);
        }
        assert!(h.clients_complete);
        assert!(!h.defer(false));
        assert!(h.defer(true));
        assert_eq!(h.completed + h.abandoned, 4 * u64::from(WINDOW));
    }

    #[test]
    fn waiting_connections_come_due_in_order() {
        let mut w = Handshakes::default();
        let key = |p| ConnKey {
            client: [10, 0, 0, 1].into(),
            client_port: p,
            service_addr: [10, 0, 0, 100].into(),
            service_port: 80,
        };
        w.wait(0, key(1), 1);
        w.wait(10, key(2), 2);
        assert!(w.next_due(HANDSHAKE_TIMEOUT_MS - 1).is_none());
        assert_eq!(w.next_due(HANDSHAKE_TIMEOUT_MS).map(|x| x.tag), Some(1));
        assert!(w.next_due(HANDSHAKE_TIMEOUT_MS).is_none());
        assert_eq!(w.next_due(u64::MAX).map(|x| x.key), Some(key(2)));
    }
}
