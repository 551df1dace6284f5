//! Open connections follow the network: a host that moves, a link that comes or goes.
//!
//! A connection's rules name the ports of its path, switch by switch, worked out when it
//! was decided. Two things make those ports wrong while the connection is open:
//! - Its backend or its client turns up at another port. A virtual machine migrated to
//!   another hypervisor keeps its MAC and address, and announces itself with a gratuitous
//!   ARP.
//! - A link of its path goes (the switch reports the port down, or LLDP stops seeing it),
//!   or a new one gives it a shorter path.
//!
//! The rules then send its packets to a port where nobody answers, and each
//! retransmission resets their idle timeout, so the connection never recovers. So either
//! change starts a walk of the connection table. Each installed connection whose endpoint
//! moved, or whose path by the next hops before the change crossed a link that is gone or
//! is not its path now, gets its rules again along its paths now, under a new tag. An ADD
//! with the same match and priority replaces a rule in place (OpenFlow 1.3 §6.4). A rule
//! left on a switch the new path avoids sees no more packets and expires, and with the old
//! tag its end is not taken for the connection's.
//!
//! The walk runs a slice at a time, so that a change under a million connections does not
//! stall the PACKET_IN path: on the tick, and between ticks in steps the runtime takes
//! every [`WALK_STEP`] while a walk is under way (`Controller::handle_reroute_step`), each
//! with the budget of the time since the last. Changes during a walk wait for the next one
//! (the moved MACs queued here, the next hops kept by the topology).
//!
//! One case is missed: links that change and change back while a walk runs. A connection
//! decided in between follows neither the next hops the next walk compares with nor, when
//! they are the same, the ones it compares against.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use ahash::RandomState;
use smallvec::SmallVec;

use flowgate_packet::MacAddr;

use super::{Controller, Outbox};
use crate::conntrack::{Conn, ConnKey};
use crate::topology::{Dpid, EarlierPath, NextHops};

/// Connections looked at per second (each a read of its entry, and with links changed,
/// its paths worked out twice).
const CHECKED_PER_SEC: f64 = 500_000.0;
/// Connections given new rules per second, at most (each two to a few rules per switch of
/// its path): a move of a busy backend re-routes all its connections, and Open vSwitch
/// takes some tens of thousands of rules a second.
const REROUTED_PER_SEC: f64 = 20_000.0;
/// How often the runtime steps a walk between ticks. With a million connections, a
/// tick's budget of 10 ms taken at once held the PACKET_IN path for 50–111 µs
/// re-routing a moved backend's connections, and a step holds it 5.0–6.3 µs (`cargo bench
/// -p flowgate-core --features testkit --bench packet_in -- tick`); the walk goes as
/// fast.
pub const WALK_STEP: Duration = Duration::from_millis(1);
/// The most time one step's budget covers: a step after a long pause (a tick every
/// second, and no runtime stepping between) does not take seconds' worth at once.
const MAX_STEP_BUDGET: Duration = Duration::from_millis(10);

/// The walk in progress, and the moves that wait for the next.
#[derive(Debug, Default)]
pub(crate) struct Reroute {
    /// MACs whose connections the current walk re-routes.
    moved: SmallVec<[MacAddr; 4]>,
    /// The next hops before the links changed, if they did: connections whose paths they
    /// give are not the paths now are re-routed.
    before: Option<NextHops>,
    /// Position of the next entry to look at, plus one (the walk goes down; 0: no walk).
    cursor: usize,
    /// Moves seen since the current walk started: the entries it already passed were not
    /// checked for them.
    pending: SmallVec<[MacAddr; 4]>,
    /// When the last slice was walked (or the last step found no walk).
    last_step: Option<Instant>,
    /// A connection's paths by `before`.
    old_fwd: Vec<(Dpid, u32)>,
    old_rev: Vec<(Dpid, u32)>,
    /// Of this walk, the pairs of switches between which every path by `before` is the
    /// path now ([`crate::topology::Topology::paths_hold`]): the paths of a connection
    /// between them are not worked out.
    holds: HashMap<(Dpid, Dpid), bool, RandomState>,
}

impl Controller {
    /// Host `mac` turned up at another port.
    pub(crate) fn host_moved(&mut self, mac: MacAddr) {
        if !self.reroute.pending.contains(&mac) {
            self.reroute.pending.push(mac);
        }
    }

    /// Whether a walk of the connection table is under way.
    pub fn rerouting(&self) -> bool {
        self.reroute.cursor > 0
    }

    /// A step of the walk between ticks (see the module's notes): one slice, with the
    /// budget of the time since the last. Returns whether the walk goes on.
    pub fn handle_reroute_step(&mut self, now: Instant, out: &mut Outbox) -> bool {
        if self.rerouting() {
            self.reroute_step(now, out);
        }
        self.rerouting()
    }

    /// Walk one slice of the connection table (starting a walk if hosts moved or links
    /// changed since the last one).
    pub(crate) fn reroute_step(&mut self, now: Instant, out: &mut Outbox) {
        // The budgets are per second, for the time since the last step (the tick's
        // interval, when nothing stepped between), at least one connection a step.
        let mut since = self
            .reroute
            .last_step
            .map_or(self.cfg.refresh_interval, |t| {
                now.saturating_duration_since(t)
            })
            .min(MAX_STEP_BUDGET)
            .as_secs_f64();
        self.reroute.last_step = Some(now);
        if self.reroute.cursor == 0 {
            let r = &mut self.reroute;
            r.moved = std::mem::take(&mut r.pending);
            // A change of the links that left every earlier next hop as it was changed
            // no connection's path: no walk for it. Else a switch with no links whose
            // session dropped and came back had the whole table walked, each tick's
            // slice a stall of the PACKET_IN path: with a million connections, 428 µs a
            // tick for two seconds, against 2.2 µs now (`cargo bench -p flowgate-core
            // --features testkit --bench packet_in -- tick/switch-joins`).
            let before = self.topo.take_next_hops_before();
            r.before = before.filter(|b| !self.topo.next_hops_hold(b));
            if r.moved.is_empty() && r.before.is_none() {
                return;
            }
            r.holds.clear();
            r.cursor = self.conns.len();
            // A walk that starts has had no time yet: its first slice is one step's.
            since = since.min(WALK_STEP.as_secs_f64());
        }
        let checks = ((CHECKED_PER_SEC * since) as usize).max(1);
        let reroutes = ((REROUTED_PER_SEC * since) as usize).max(1);
        let (mut checked, mut rerouted) = (0, 0);
        while self.reroute.cursor > 0 && checked < checks && rerouted < reroutes {
            self.reroute.cursor -= 1;
            checked += 1;
            self.counters.reroute_checked += 1;
            let Some((&key, &conn)) = self.conns.at(self.reroute.cursor) else {
                continue;
            };
            // A connection with no path now keeps its rules as they are, as a connection
            // decided while a path was missing gets none.
            if conn.installed && self.must_reroute(&key, &conn) && self.reroute_conn(&key, out) {
                rerouted += 1;
                self.counters.connections_rerouted += 1;
            }
        }
    }

    /// Whether every path from switch `from` to switch `to` by the next hops before the
    /// change is the path now, asked of the topology once a walk.
    fn paths_held(&mut self, from: Dpid, to: Dpid) -> bool {
        let Reroute {
            before: Some(before),
            holds,
            ..
        } = &mut self.reroute
        else {
            return false;
        };
        *holds
            .entry((from, to))
            .or_insert_with(|| self.topo.paths_hold(before, from, to))
    }

    /// Whether connection `key`'s rules may follow ports it no longer has.
    fn must_reroute(&mut self, key: &ConnKey, conn: &Conn) -> bool {
        let moved = &self.reroute.moved;
        let backend = self
            .services
            .get(usize::from(conn.service))
            .and_then(|s| s.destination(conn.backend))
            .and_then(|(_, mac)| mac);
        if backend.is_some_and(|m| moved.contains(&m))
            || self
                .topo
                .mac_by_id(conn.client_mac)
                .is_some_and(|m| moved.contains(&m))
        {
            return true;
        }
        if self.reroute.before.is_none() {
            return false;
        }
        let Some(p) = self.placement(key, *conn) else {
            return false;
        };
        // Most connections of a large network cross no switch whose next hops changed:
        // their paths are not worked out. With a million connections, a step that looked
        // at 500 and worked out all their paths took 45–48 µs, and takes 16.4–16.5 µs
        // (`cargo bench -p flowgate-core --features testkit --bench packet_in --
        // tick/link-elsewhere-step`).
        let (a, b) = (p.client_at.dpid, p.backend_at.dpid);
        if self.paths_held(a, b) && self.paths_held(b, a) {
            return false;
        }
        let Reroute {
            before: Some(before),
            old_fwd,
            old_rev,
            ..
        } = &mut self.reroute
        else {
            return false;
        };
        let old = (
            self.topo.path_before(
                before,
                p.client_at.dpid,
                p.backend_at,
                Some(p.flow),
                old_fwd,
            ),
            self.topo.path_before(
                before,
                p.backend_at.dpid,
                p.client_at,
                Some(p.flow),
                old_rev,
            ),
        );
        match old {
            // Into a link that is gone: its rules lead nowhere now.
            (EarlierPath::LinkGone, _) | (_, EarlierPath::LinkGone) => true,
            // Both paths as they were: re-routed if either is another now.
            (EarlierPath::Found, EarlierPath::Found) => {
                self.compute_paths(&p) == (true, true)
                    && (self.reroute.old_fwd != self.scratch_path
                        || self.reroute.old_rev != self.scratch_rev)
            }
            // No route then (a restarted controller had not found the links yet): its
            // rules were not written by those next hops, and are left as they are.
            _ => false,
        }
    }
}
