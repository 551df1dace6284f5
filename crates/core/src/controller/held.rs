//! SYNs held while the controller finds the network again.
//!
//! A controller that has just connected (started, restarted, promoted to master) knows no
//! backend until one answers its ARP, and no link until LLDP comes back. A SYN that comes
//! before then, which no backend or no path can take yet, is neither refused nor dropped
//! for the client to send again (RFC 6298's initial RTO is a second, then two more): it
//! is held here, and tried again at the first tick after anything that could place it
//! changed, so it is answered within a tick of its backend being found. Past the
//! reconnect grace, a SYN no backend can take is refused with a RST, as always, the held
//! ones included.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::Bytes;
use flowgate_packet as packet;

use super::vip::Arrival;
use super::{Controller, Outbox};
use crate::conntrack::ConnKey;
use crate::topology::Dpid;

/// SYNs held at most: a few thousand clients' first second (their copies take about
/// 100 bytes each). Beyond it a SYN is dropped, as it was before holding: its client
/// sends it again.
const MAX_HELD: usize = 4096;

/// How long a SYN is held: the client's initial retransmission timeout (RFC 6298 §2.1).
/// By then the client has sent it again, and its new copy is held in its place.
const HOLD_AT_MOST: Duration = Duration::from_secs(1);

/// How often a held SYN may ask for the backends not located yet (ARP out of every edge
/// port of every switch), rather than at the next second's probe.
const HELD_PROBE_EVERY: Duration = Duration::from_millis(100);

/// One held SYN: the packet as its PACKET_IN carried it, and where it came in.
#[derive(Debug)]
struct HeldSyn {
    dpid: Dpid,
    in_port: u32,
    data: Bytes,
    since: Instant,
}

#[derive(Debug, Default)]
pub(crate) struct Held {
    syns: VecDeque<HeldSyn>,
    /// While a held SYN is tried again: when it was first held. It goes back with that
    /// time if it cannot be taken yet, and is not counted or admitted again.
    pub(super) retrying: Option<Instant>,
    /// What could make a held SYN placeable (see [`Controller::placeable`]) when they
    /// were last tried: they are tried again only once it changed, or the grace ended.
    tried_with: u64,
}

impl Controller {
    /// SYNs held now.
    pub fn syns_held(&self) -> usize {
        self.held.syns.len()
    }

    /// A new connection no backend can take, or that has no path to its backend: refused
    /// with a RST, so the client learns at once. Except while a switch is in its
    /// reconnect grace (the controller is finding the backends and links again by ARP
    /// and LLDP): then the SYN is held and tried again on each tick (refused, it would
    /// fail a connection that only came in the controller's first second; seen on OVS: a
    /// standby started after the hosts were learned, promoted, refused a third of the
    /// SYNs of its first 2 s). The backends not located yet are asked for now, not at
    /// the next second's probe.
    pub(super) fn refuse_or_hold(
        &mut self,
        now: Instant,
        si: usize,
        at: &Arrival<'_>,
        out: &mut Outbox,
    ) {
        let settling = self.any_in_grace();
        if let (Some(since), true) = (self.held.retrying, settling) {
            // Tried again and still not placeable: back as it was.
            self.hold(since, at);
            return;
        }
        let Some(s) = self.services.get_mut(si) else {
            return;
        };
        if !settling {
            s.counters.refused_no_backend += 1;
            self.reset(at, out);
            return;
        }
        s.counters.held_settling += 1;
        self.hold(now, at);
        self.ask_for_backends(now, out);
    }

    /// While SYNs are held, the backends not located yet are asked for by ARP every
    /// [`HELD_PROBE_EVERY`], not only when a SYN comes: an ask that a switch did not carry
    /// (its session not writable yet: a standby promoted switch by switch) is repeated
    /// within 100 ms rather than at the next second's probe.
    fn ask_for_backends(&mut self, now: Instant, out: &mut Outbox) {
        if self
            .last_arp_probe
            .is_none_or(|t| now.saturating_duration_since(t) >= HELD_PROBE_EVERY)
        {
            self.last_arp_probe = Some(now);
            self.probe_unlocated_backends(out);
        }
    }

    fn hold(&mut self, since: Instant, at: &Arrival<'_>) {
        if self.held.syns.len() >= MAX_HELD {
            return;
        }
        self.held.syns.push_back(HeldSyn {
            dpid: at.dpid,
            in_port: at.in_port,
            // A copy: the packet lies in the session's read buffer, which is reused.
            data: Bytes::copy_from_slice(at.data),
            since,
        });
    }

    /// A digest of what decides whether a held SYN can be placed: which backends are
    /// located and eligible, and the links (the topology's generation).
    fn placeable(&self) -> u64 {
        let mut h = self.topo.generation();
        for s in &self.services {
            for (b, l) in s.backends.iter().zip(&s.loads) {
                let bits = u64::from(b.mac.is_some()) | u64::from(l.eligible) << 1;
                h = (h.rotate_left(5) ^ bits).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
            }
        }
        h
    }

    /// Try the held SYNs again (on each tick): each that a backend and a path can take
    /// now is answered as if it had just come, so its client hears from the backend now
    /// rather than after its retransmission; the others wait, for at most
    /// [`HOLD_AT_MOST`]. Once no switch is in its grace, those left are refused.
    pub(super) fn retry_held(&mut self, now: Instant, out: &mut Outbox) {
        // Oldest first: those held too long are dropped (their clients have sent them
        // again).
        while self
            .held
            .syns
            .front()
            .is_some_and(|h| now.saturating_duration_since(h.since) >= HOLD_AT_MOST)
        {
            self.held.syns.pop_front();
        }
        if self.held.syns.is_empty() {
            return;
        }
        if self.any_in_grace() {
            self.ask_for_backends(now, out);
        }
        // Nothing that could place one changed: trying would hold them all again (a tick
        // is 10 ms; thousands of SYNs tried each time would be the controller's whole CPU).
        let placeable = self.placeable();
        if placeable == self.held.tried_with && self.any_in_grace() {
            return;
        }
        self.held.tried_with = placeable;
        let held = std::mem::take(&mut self.held.syns);
        for h in held {
            if !self.switches.contains_key(&h.dpid) {
                continue;
            }
            // It parsed as an IPv4 TCP SYN when it was held.
            let Ok(frame) = packet::parse(&h.data) else {
                continue;
            };
            let (Some(ip), Some(tcp)) = (frame.ipv4(), frame.tcp()) else {
                continue;
            };
            // Its client's retransmission was served meanwhile: nothing left to do (tried
            // again, it would send the backend the SYN a second time).
            let key = ConnKey::of_client_segment(ip.src, ip.dst, tcp);
            if self.conns.get(&key).is_some_and(|c| c.is_own_syn(tcp.seq)) {
                continue;
            }
            let at = Arrival {
                dpid: h.dpid,
                in_port: h.in_port,
                // A held SYN is tried again as if the intercept had sent it.
                cookie: u64::MAX,
                frame: &frame,
                tcp,
                data: &h.data,
            };
            self.held.retrying = Some(h.since);
            self.handle_tcp(now, &at, ip.src, ip.dst, out);
            self.held.retrying = None;
        }
    }
}
