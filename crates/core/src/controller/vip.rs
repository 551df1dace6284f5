//! Service connections: the decision for a new connection, the two rules that carry it
//! (forward rewrite to the backend, reverse rewrite back to the service address) on every
//! switch of its path, and the same decision applied to every later packet of it that
//! still reaches the controller, in both directions. While the controller gaps a service,
//! the rules may wait for the client's ACK (`handshake`).

use std::hash::{BuildHasher, Hasher};
use std::net::Ipv4Addr;
use std::time::Instant;

use flowgate_packet::{self as packet, Frame, MacAddr, Tcp};
use ofp::{Action, Instruction, Oxm};

use super::conn_rule::{ConnPacketOut, ConnRule, Out, Rewrite, Syn};
use super::ended::Tuple;
use super::{Controller, Listener, Outbox, rules};
use crate::balance::{Outcome, SelectRequest, Selection};
use crate::config::{ServiceMode, UnknownFlowPolicy};
use crate::conntrack::{Conn, ConnKey, Reply};
use crate::cookie::{self, RuleKind};
use crate::service::{BackendId, ServiceState};
use crate::topology::{Dpid, MacId, PortRef};

/// Minimum time between two decisions sampled into the event ring.
const DECISION_SAMPLE_MS: u64 = 250;

/// Which way a packet of a known connection travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dir {
    /// Client to backend.
    Forward,
    /// Backend to client.
    Reverse,
}

/// Everything needed to place one connection's rules.
#[derive(Debug, Clone, Copy)]
pub(super) struct Placement {
    pub(super) client_at: PortRef,
    backend_ip: Ipv4Addr,
    backend_mac: MacAddr,
    pub(super) backend_at: PortRef,
    /// The address the client believes it talks to, and its MAC.
    service_mac: MacAddr,
    /// Which of equal-cost paths the connection takes ([`ConnKey::flow_hash`]).
    pub(super) flow: u64,
}

/// A TCP segment that reached the controller, and where it came in.
#[derive(Clone, Copy)]
pub(crate) struct Arrival<'a> {
    pub(crate) dpid: Dpid,
    pub(crate) in_port: u32,
    /// The cookie of the rule that sent it up (§7.4.1; all ones for a table miss).
    pub(crate) cookie: u64,
    pub(crate) frame: &'a Frame<'a>,
    pub(crate) tcp: &'a Tcp<'a>,
    /// The packet, as the PACKET_IN carried it.
    pub(crate) data: &'a [u8],
}

impl Arrival<'_> {
    /// The client's ACK of a handshake (or any later segment of it): neither a SYN nor
    /// a RST. Only such a segment installs a deferred connection's rules.
    fn completes_handshake(&self) -> bool {
        !self.tcp.flags.syn() && !self.tcp.flags.rst()
    }
}

impl Controller {
    /// Start loading what the connection table reads first for this PACKET_IN (its
    /// 4-tuple's index line), without waiting for it. The session calls it for every
    /// PACKET_IN of a batch before handling the batch: the table lives in DRAM, and the
    /// lines then come in together instead of one stall per decision. Costs a parse of
    /// the headers; anything that is not TCP over IPv4 is left alone.
    #[inline]
    pub fn prefetch_packet_in(&self, frame: &[u8]) {
        // The 4-tuple read at its offsets (a whole parse here cost as much as the one
        // that handles the PACKET_IN); a wrong one only loads a line for nothing.
        let Some((client, service_addr, client_port, service_port)) =
            ofp::view::packet_in_data(frame).and_then(packet::ipv4_tcp_tuple)
        else {
            return;
        };
        self.conns.prefetch(&ConnKey {
            client,
            client_port,
            service_addr,
            service_port,
        });
    }

    /// Returns true when the segment belonged to a service and was dealt with.
    pub(crate) fn handle_tcp(
        &mut self,
        now: Instant,
        at: &Arrival<'_>,
        src: Ipv4Addr,
        dst: Ipv4Addr,
        out: &mut Outbox,
    ) -> bool {
        let tcp = at.tcp;
        if let Some(&l) = self.listeners.get(&(dst, tcp.dst_port)) {
            let key = ConnKey::of_client_segment(src, dst, tcp);
            if let Some(mut conn) = self.conns.get(&key).copied() {
                if conn.client_mac == MacId::UNKNOWN {
                    // Rebuilt from a switch's rules: its client's MAC is known from now.
                    conn.client_mac = self.topo.mac_id(at.frame.eth_src);
                    if let Some(c) = self.conns.get_mut(&key) {
                        c.client_mac = conn.client_mac;
                    }
                }
                if tcp.flags.is_initial_syn() && !conn.is_own_syn(tcp.seq) {
                    self.reopen(now, at, key, conn, l, out);
                } else if !conn.installed && tcp.flags.rst() {
                    // The client refused the backend's SYN-ACK (it never sent the SYN: a
                    // spoofed source): send the RST on, so the backend drops its half-open
                    // connection, and forget the connection. Only a RST in the window
                    // (the SYN-ACK acknowledged the ISN: SEG.SEQ = ISN + 1), not a blind
                    // one aimed at a real client's handshake.
                    if conn
                        .isn
                        .is_some_and(|isn| tcp.seq == isn.get().wrapping_add(1))
                    {
                        self.send_known(at, &key, conn, Dir::Forward, dst, out);
                        self.abandon(&key, conn, true);
                    }
                } else {
                    // A retransmitted SYN, a segment that raced the rules, or the client's
                    // ACK of a deferred handshake. A retransmitted SYN means the client
                    // heard no SYN-ACK for a second or more: the rules go out again, in
                    // case the first ones never took effect (sent in a failover's window,
                    // or to a switch that reconnected since); an identical ADD replaces a
                    // rule in place (§6.4), so where they did, nothing changes.
                    if conn.installed && tcp.flags.is_initial_syn() {
                        if self.note_syn_again(now, at.dpid, &key, conn)
                            && self.redispatch(now, at, key, conn, l, out)
                        {
                            return true;
                        }
                        self.install(&key, out);
                    }
                    self.send_known(at, &key, conn, Dir::Forward, dst, out);
                }
            } else if let Some((key, conn)) =
                self.find_by_backend(dst, tcp.dst_port, src, tcp.src_port)
            {
                // Without a VIP every backend address is a listener: a packet of a
                // connection addressed to another backend and already rewritten to this
                // one (at a switch further along, before its rule took effect) is that
                // connection's, not a new one (found in the lab: redirected connections
                // were decided twice, or reset).
                self.send_known(at, &key, conn, Dir::Forward, dst, out);
            } else if tcp.flags.is_initial_syn() {
                // A retransmission of a SYN decided before, whose connection ended during
                // its handshake, is that connection again: its client's one attempt.
                let resumed = self.handshakes.take_aborted(&key, tcp.seq);
                self.new_connection(now, at, key, l, resumed.map(Earlier::Resumed), out);
            } else if self.departed_segment(now, at, &key, out) {
                // An old partition's connection, to its owner.
            } else if !self.adopt(now, at, key, l, out) {
                self.unknown_flow(l.service, at, out);
            }
            return true;
        }
        // A packet of a known connection, already rewritten, at a switch further along.
        if let Some((key, conn)) = self.find_by_backend(dst, tcp.dst_port, src, tcp.src_port) {
            self.send_known(at, &key, conn, Dir::Forward, dst, out);
            return true;
        }
        // The backend's answer (its SYN-ACK, often) before the reverse rule took effect,
        // or while the connection waits for its client's ACK.
        if let Some((key, conn)) = self.find_by_backend(src, tcp.src_port, dst, tcp.dst_port) {
            if conn.installed {
                self.note_reply(now, &key, conn, tcp.flags.rst());
            } else if tcp.flags.syn() && tcp.flags.ack() {
                self.handshakes.syn_acks.insert(key, tcp.seq);
            }
            self.send_known(at, &key, conn, Dir::Reverse, dst, out);
            if !conn.installed && tcp.flags.rst() {
                // The backend reset a handshake the client has not completed: under a
                // flood, usually its answer to the flooder's segments (a new SYN on the
                // 4-tuple of its half-open connection), so no verdict on the backend
                // (counted, a flood ejected the backend in `ovs_overload_packet_in_flood`).
                self.abandon(&key, conn, false);
            }
            return true;
        }
        false
    }

    /// The backend's side of a connection reached the controller: remember that it
    /// answered, or count a RST as a failed connection at once.
    fn note_reply(&mut self, now: Instant, key: &ConnKey, conn: Conn, rst: bool) {
        if conn.reply != Reply::Unseen {
            return;
        }
        if let Some(c) = self.conns.get_mut(key) {
            c.reply = if rst { Reply::Reset } else { Reply::Answered };
        }
        if rst {
            self.count_outcome(now, conn.service, conn.backend, false);
        }
    }

    /// The connection between `client:cport` and backend `backend:bport`, if one exists.
    pub(crate) fn find_by_backend(
        &self,
        backend: Ipv4Addr,
        bport: u16,
        client: Ipv4Addr,
        cport: u16,
    ) -> Option<(ConnKey, Conn)> {
        for &(si, bi) in self.backend_index.get(&backend)? {
            let s = self.services.get(usize::from(si))?;
            if s.cfg.port != bport {
                continue;
            }
            let Some(id) = s.id_at(usize::from(bi)) else {
                continue;
            };
            let try_addr = |service_addr: Ipv4Addr| {
                let key = ConnKey {
                    client,
                    client_port: cport,
                    service_addr,
                    service_port: bport,
                };
                self.conns
                    .get(&key)
                    .filter(|c| c.service == si && c.backend == id)
                    .map(|c| (key, *c))
            };
            match s.cfg.vip {
                Some(vip) => {
                    if let Some(found) = try_addr(vip) {
                        return Some(found);
                    }
                }
                None => {
                    for b in &s.backends {
                        if let Some(found) = try_addr(b.address) {
                            return Some(found);
                        }
                    }
                }
            }
        }
        None
    }

    /// A SYN with a new ISN on the 4-tuple of a connection still in the table: the client
    /// opened a new connection on it, so the old one is over (a client cannot hold two on
    /// one 4-tuple). Like conntrack, which reopens a connection on a SYN in TIME_WAIT, and
    /// Katran, which looks up no connection table for a SYN, it is a new connection,
    /// decided and counted as such (keeping the old backend if it can take it, see
    /// [`Self::new_connection`]): the old one's accounting ends here, and the new rules
    /// replace the old ones that have the same match (§6.4: an OFPFC_ADD with identical
    /// match and priority replaces the entry). A late FLOW_REMOVED of the old rules is
    /// told apart by the decision tag in their cookie.
    fn reopen(
        &mut self,
        now: Instant,
        at: &Arrival<'_>,
        key: ConnKey,
        old: Conn,
        l: Listener,
        out: &mut Outbox,
    ) {
        self.counters.connections_reopened += 1;
        tracing::debug!(client = %key.client, cport = key.client_port, "new connection on the 4-tuple of an earlier one");
        let old_reverse = self
            .placement(&key, old)
            .map(|p| (p.client_at.dpid, p.backend_ip));
        if self.conns.remove(&key).is_some()
            && let Some(s) = self.services.get_mut(usize::from(old.service))
        {
            s.record_end(old.backend);
        }
        self.handshakes.syn_acks.remove(&key);
        self.new_connection(now, at, key, l, Some(Earlier::Reopened(old)), out);
        // The old backend's reverse rule at the client's edge has another match than the
        // new one's, so nothing replaced it: remove it, so that a late segment of the old
        // backend (a RST for the new connection's packets that reached it before the new
        // rules took effect) is not rewritten to the service address and delivered into
        // the new connection.
        let new_backend = self
            .conns
            .get(&key)
            .and_then(|c| self.placement(&key, *c))
            .map(|p| p.backend_ip);
        if let Some((edge, old_ip)) = old_reverse {
            // (A deferred connection never had rules.)
            if new_backend != Some(old_ip) && old.installed {
                delete_reverse_rule(&key, edge, old_ip, out);
            }
        }
    }

    /// The client of connection `key` sent its SYN again, and its backend is judged
    /// silent (`note_syn_again`): the connection goes to another backend if its service
    /// redispatches and one can take it, and this SYN on to that one. Returns false,
    /// changing nothing, when it stays where it is.
    ///
    /// TCP allows the move: a client that sends its SYN again holds no SYN-ACK, so of the
    /// connection there is at most a half-open one at the old backend. Should that one's
    /// SYN-ACK come late, it reaches the client as the old backend's, not the service's
    /// (its reverse rule at the client's edge goes), and the client resets it. The
    /// forward rule at the client's edge is replaced in place (§6.4: same match and
    /// priority). No packet of the connection ever took that rule (it matches no SYN), so
    /// Open vSwitch holds no cached flow of it that could carry the client's ACK to the
    /// old backend, as it may for a reopened connection's (`new_connection` holds that
    /// SYN): this one goes on at once. The old path's other rules go too
    /// ([`Self::delete_old_path`]). It is not admitted again: the client's one attempt
    /// was, when it came.
    ///
    /// A silence the path explains stays where it is: when a switch on the way has been
    /// behind its controller since the decision ([`Self::path_lagged_since`], which
    /// excuses the verdict too), the SYN may not have reached the backend yet, and a move
    /// would add a path's FLOW_MODs to a channel already behind. In the lab's `faults`
    /// scenario at full size that fed on itself: healthy servers' connections judged
    /// silent behind the lagging switch were moved too, and the heavy phase served 8,721
    /// to 19,999 of 20,000 requests in four runs, against 14,961–15,000 with no
    /// redispatch (docs/results.md, stop 61).
    fn redispatch(
        &mut self,
        now: Instant,
        at: &Arrival<'_>,
        key: ConnKey,
        old: Conn,
        l: Listener,
        out: &mut Outbox,
    ) -> bool {
        let si = usize::from(old.service);
        if !self.services.get(si).is_some_and(|s| s.cfg.redispatch) {
            return false;
        }
        let old_placed = self.placement(&key, old);
        if old_placed.is_some_and(|p| self.path_lagged_since(at.dpid, p.backend_ip, old.created_ms))
        {
            return false;
        }
        let req = SelectRequest {
            requested: l.requested.map(usize::from),
            flow_hash: flow_hash(&key),
            since_refresh: self.since_refresh(now),
        };
        let created_ms = self.ms_since_start(now);
        let Some(s) = self.services.get_mut(si) else {
            return false;
        };
        let sel = match s.position(old.backend) {
            Some(avoid) => s.select_avoiding(&req, avoid),
            // It left the pool since: any backend will do.
            None => s.balancer.select(&req, &s.loads),
        };
        let Some((b, id)) = picked(s, &sel, key.client) else {
            return false;
        };
        let conn = Conn {
            backend: id,
            created_ms,
            reply: Reply::Unseen,
            tag: self.next_conn_tag & rules::CONN_TAG_MASK,
            ..old
        };
        let Some(p) = self.placement(&key, conn) else {
            return false;
        };
        if self.compute_paths(&p) != (true, true) {
            return false;
        }
        self.next_conn_tag = self.next_conn_tag.wrapping_add(1);
        if let Some(s) = self.services.get_mut(si) {
            s.record_end(old.backend);
            s.record_pick(b);
            s.counters.redispatched += 1;
            tracing::debug!(service = %s.cfg.name, client = %key.client, cport = key.client_port, backend = %s.backends[b].address, "connection redispatched: its backend stayed silent");
        }
        self.conns.insert(key, conn);
        self.emit_rules(&key, conn, &p, (true, true), false, out);
        self.send_placed(at, &key, &p, Dir::Forward, key.service_addr, out);
        if let Some(o) = old_placed.filter(|o| o.backend_ip != p.backend_ip) {
            self.delete_old_path(&key, &o, out);
        }
        true
    }

    /// Remove the rules of connection `key` placed as `old` (its backend since changed),
    /// but the forward rule at the client's edge, which the new one replaced: the forward
    /// rules past it and every reverse rule match the old backend's address, so nothing
    /// replaced them. The reverse rule at the client's edge must go (see
    /// [`delete_reverse_rule`]); the others only hold their switches' tables until they
    /// idle out (`idle_timeout_secs`), as the simulator counted. Along the paths the old
    /// placement has now: a rule on a path since changed idles out.
    fn delete_old_path(&mut self, key: &ConnKey, old: &Placement, out: &mut Outbox) {
        let (fwd, rev) = self.compute_paths(old);
        if fwd {
            for &(d, _) in self.scratch_path.iter().skip(1) {
                let m = rules::tcp_match(
                    Some(key.client),
                    Some(old.backend_ip),
                    Some(key.client_port),
                    Some(key.service_port),
                );
                out.push(d, rules::conn_delete_strict(m));
            }
        }
        if rev {
            for &(d, _) in &self.scratch_rev {
                delete_reverse_rule(key, d, old.backend_ip, out);
            }
        } else {
            delete_reverse_rule(key, old.client_at.dpid, old.backend_ip, out);
        }
    }

    /// `at` is the client's SYN; `earlier`, the connection on the same 4-tuple it
    /// follows, if any (see [`Earlier`]).
    fn new_connection(
        &mut self,
        now: Instant,
        at: &Arrival<'_>,
        key: ConnKey,
        l: Listener,
        earlier: Option<Earlier>,
        out: &mut Outbox,
    ) {
        let resumed = matches!(earlier, Some(Earlier::Resumed(_)));
        let dpid = at.dpid;
        let since_refresh = self.since_refresh(now);
        let created_ms = self.ms_since_start(now);
        let flow_hash = flow_hash(&key);
        let si = usize::from(l.service);
        // Overload control: the service's gap refuses it, with a RST so the client learns
        // at once (or silently, if so configured).
        // (A held SYN tried again was admitted when it came.)
        if self.held.retrying.is_none() && !resumed && !self.overload_admit(now, dpid, si, out) {
            if self.overload_refusal_resets(si) {
                self.reset(at, out);
            }
            return;
        }
        // While the controller gaps this service, its rules may wait for the client's
        // ACK (see `handshake`): a flood's SYNs then leave nothing in the switch. Not
        // while the service's own OFF-period rule is out: it drops every segment to the
        // service address that no connection rule takes, the ACK included.
        let gapping = self.overload_controller_gapping(si) && !self.overload_off_rules_out(si);
        // A partitioned service's SYN that reached the controller (its partition is moving,
        // or has no rule yet) goes where the partition's rule will send the next ones.
        let partition_owner = self.partition_backend(si, key.client_port, true);
        let settling = self.partition_settling(si, key.client_port, created_ms);
        let Some(s) = self.services.get_mut(si) else {
            return;
        };
        let req = SelectRequest {
            requested: l.requested.map(usize::from),
            flow_hash,
            since_refresh,
        };
        // A new connection on the 4-tuple of an earlier one keeps that one's backend while
        // it can take connections (as a consistent hash gives a reused 5-tuple the same
        // backend in Maglev or Katran): its new rules then have the old ones' actions, so
        // a packet that still meets the old rule, or Open vSwitch's cached megaflow of it,
        // before the replacement takes effect goes to the right backend anyway. Seen on OVS
        // when the backend changed: the client's ACK, 50 µs after the new backend's
        // SYN-ACK, followed the old megaflow to the old backend, which reset it.
        //
        // Not in a partitioned service: there the switch may also hold flows cached from
        // the partition's rule, and once the old connection's rule has expired they can
        // cover this 4-tuple (seen on OVS: a reopened connection kept its old backend, and
        // its ACK followed the partition's rule to the owner, which reset it). Its SYN goes
        // where the partition's rule sends them, and when that is not the old backend, it
        // is held (below) until the switch has caught up with the new rules. Even when the
        // owner can no longer take connections (drained, or failed, since the last
        // refresh): until the refresh moves the partition its rule sends every other SYN
        // there, and the switch may send this connection's ACK there by a flow it cached
        // from that rule (seen on OVS: a SYN caught by an earlier connection's rules just
        // after a drain went to the balancer's pick, its ACK to the drained owner).
        let eligible = |b: &usize| s.loads.get(*b).is_some_and(|l| l.eligible);
        let kept = earlier
            .map(Earlier::conn)
            .filter(|o| o.service == l.service)
            .and_then(|o| s.position(o.backend))
            .filter(eligible);
        let sticky = match (settling, partition_owner) {
            // The partition has just started moving: the switch may still carry this
            // connection's next segments to the old owner by flows it cached from the old
            // partition rule (see `partition::SETTLE`), so the connection goes there too.
            // When that one can no longer take it, the SYN is held: the client sends it
            // again a second later, when the switch has caught up.
            (Some(from), _) => match from.filter(eligible) {
                Some(b) => Some(b),
                None => {
                    tracing::debug!(service = %s.cfg.name, client = %key.client, cport = key.client_port, "SYN held while its partition's move settles");
                    return;
                }
            },
            (None, Some(owner)) => Some(owner),
            (None, None) => kept,
        };
        let sel = match sticky {
            Some(b) => crate::balance::Selection {
                backend: Some(b),
                outcome: Outcome::Requested,
            },
            None => s.balancer.select(&req, &s.loads),
        };
        let Some((b, id)) = picked(s, &sel, key.client) else {
            tracing::debug!(service = %s.cfg.name, client = %key.client, "no backend can take the connection");
            self.refuse_or_hold(now, si, at, out);
            return;
        };
        // A connection we cannot route (client or backend unreachable from each other)
        // is refused before it is counted: a phantom entry would never see FLOW_REMOVED.
        let conn = Conn {
            service: l.service,
            backend: id,
            created_ms,
            installed: true,
            reply: Reply::Unseen,
            isn: Conn::isn_of(at.tcp.seq),
            tag: self.next_conn_tag & rules::CONN_TAG_MASK,
            client_mac: self.topo.mac_id(at.frame.eth_src),
        };
        // Placement and both paths are worked out once here and reused for the rules and
        // the PACKET_OUT (each costs several hash lookups on the PACKET_IN path).
        let placed = self.placement(&key, conn);
        let routed = placed.is_some_and(|p| self.compute_paths(&p) == (true, true));
        let (true, Some(p)) = (routed, placed) else {
            self.refuse_or_hold(now, si, at, out);
            return;
        };
        let Some(s) = self.services.get_mut(si) else {
            return;
        };
        // On its old backend, the client's one attempt, counted when it was decided; on
        // another (the old one can take no more), a decision of its own.
        if let Some(Earlier::Resumed(r)) = earlier
            && s.position(r.backend) == Some(b)
        {
            s.record_resumed(b);
        } else {
            s.record_pick(b);
        }
        if self.held.retrying.is_some() {
            s.counters.held_answered += 1;
        }
        // Not on the 4-tuple of a connection that has rules: its forward rule would carry
        // the client's ACK past the controller.
        let installed = matches!(earlier, Some(Earlier::Reopened(o)) if o.installed);
        let defer = !installed && s.handshakes.defer(gapping);
        self.next_conn_tag = self.next_conn_tag.wrapping_add(1);
        tracing::debug!(service = %s.cfg.name, client = %key.client, cport = key.client_port, backend = %s.backends[b].address, outcome = ?sel.outcome, "new connection");
        // A sample of decisions for operators: at most four a second, so the event ring
        // shows what the balancer does without costing the PACKET_IN path anything.
        if created_ms.saturating_sub(self.last_decision_sample_ms) >= DECISION_SAMPLE_MS
            || self.last_decision_sample_ms == 0
        {
            self.last_decision_sample_ms = created_ms.max(1);
            let detail = format!(
                "{} {}:{} -> {} ({:?})",
                s.cfg.name, key.client, key.client_port, s.backends[b].address, sel.outcome
            );
            self.event(now, "decision", detail);
        }
        if defer {
            // No rules yet: the SYN goes on alone, and the client's ACK installs them.
            self.send_reply_catch(si, created_ms, out);
            let conn = Conn {
                installed: false,
                ..conn
            };
            self.conns.insert(key, conn);
            self.handshakes.wait(created_ms, key, conn.tag);
            self.send_placed(at, &key, &p, Dir::Forward, key.service_addr, out);
            return;
        }
        self.conns.insert(key, conn);
        self.emit_rules(&key, conn, &p, (true, true), false, out);
        if let Some(Earlier::Reopened(o)) = earlier
            && (o.service, o.backend) != (conn.service, conn.backend)
        {
            // The earlier connection's backend can no longer take it (or the partition's
            // rule names another): the rules change backend, and packets that meet the
            // old rule or its megaflow before the replacement takes effect would reach the
            // old backend (which resets them).
            // Hold the SYN: the client sends it again (same ISN) a second later, when the
            // new rules are in force, and that copy goes on to the new backend.
            return;
        }
        self.send_placed(at, &key, &p, Dir::Forward, key.service_addr, out);
    }

    /// Where the client and the backend of a connection are, if both are known.
    pub(super) fn placement(&self, key: &ConnKey, conn: Conn) -> Option<Placement> {
        let s = self.services.get(usize::from(conn.service))?;
        // A backend that left the pool still carries its open connections.
        let (backend_addr, backend_mac) = s.destination(conn.backend)?;
        let backend_mac = backend_mac?;
        let backend_at = self.topo.host(backend_mac)?.at;
        let client_mac = match self.topo.mac_by_id(conn.client_mac) {
            Some(mac) => mac,
            None => self.topo.mac_of(key.client)?,
        };
        let client_at = self.topo.host(client_mac)?.at;
        let service_mac = match s.cfg.vip {
            Some(_) => s.cfg.virtual_mac,
            // The client asked for this backend by its own address: answer as it.
            None => self.topo.mac_of(key.service_addr)?,
        };
        // A partitioned service's backends hold the VIP and answer from it (direct
        // return, see `partition`): its connections' rules keep the VIP and lead to the
        // backend's MAC, as its partition rules do.
        let backend_ip = match (s.cfg.mode, s.cfg.vip) {
            (ServiceMode::Partitioned, Some(vip)) => vip,
            _ => backend_addr,
        };
        Some(Placement {
            client_at,
            backend_ip,
            backend_mac,
            backend_at,
            service_mac,
            flow: key.flow_hash(),
        })
    }

    /// Both paths of a placed connection, client → backend into `scratch_path` and
    /// backend → client into `scratch_rev`; whether each exists. Of equal-cost paths, the
    /// connection's own ([`Placement::flow`]): a leaf-spine fabric's connections spread
    /// over its spines, and so do their rules.
    pub(super) fn compute_paths(&mut self, p: &Placement) -> (bool, bool) {
        let fwd = self
            .topo
            .flow_path(
                p.client_at.dpid,
                p.backend_at,
                p.flow,
                &mut self.scratch_path,
            )
            .is_some();
        let rev = self
            .topo
            .flow_path(
                p.backend_at.dpid,
                p.client_at,
                p.flow,
                &mut self.scratch_rev,
            )
            .is_some();
        (fwd, rev)
    }

    /// Connection `key` as it is placed now, its paths in the scratch vectors; `None` when
    /// it cannot be placed, or has no path either way.
    fn routed(&mut self, key: &ConnKey) -> Option<(Conn, Placement)> {
        let conn = self.conns.get(key).copied()?;
        let p = self.placement(key, conn)?;
        (self.compute_paths(&p) == (true, true)).then_some((conn, p))
    }

    /// Install the connection's rules on every switch of its path, both directions.
    /// Returns false, installing nothing, when the connection can no longer be placed or
    /// routed (a path broke since it was decided): without its forward rule nothing would
    /// ever report its end.
    fn install(&mut self, key: &ConnKey, out: &mut Outbox) -> bool {
        let Some((conn, p)) = self.routed(key) else {
            return false;
        };
        self.emit_rules(key, conn, &p, (true, true), false, out);
        if let Some(c) = self.conns.get_mut(key) {
            c.installed = true;
        }
        true
    }

    /// Give connection `key` its rules again along the paths it has now, under a new tag
    /// (see `reroute`). False, changing nothing, when it cannot be placed or routed now.
    pub(super) fn reroute_conn(&mut self, key: &ConnKey, out: &mut Outbox) -> bool {
        let Some((mut conn, p)) = self.routed(key) else {
            return false;
        };
        conn.tag = self.next_conn_tag & rules::CONN_TAG_MASK;
        self.next_conn_tag = self.next_conn_tag.wrapping_add(1);
        if let Some(c) = self.conns.get_mut(key) {
            c.tag = conn.tag;
        }
        self.emit_rules(key, conn, &p, (true, true), false, out);
        true
    }

    /// The rules of a placed connection along the paths [`Self::compute_paths`] found
    /// (`found`: whether the forward and the reverse one exist). `closing`: the connection's
    /// FIN or RST went by the controller, so the rules get the idle timeout their
    /// `fin_timeout` would have set had they seen it.
    fn emit_rules(
        &mut self,
        key: &ConnKey,
        conn: Conn,
        p: &Placement,
        found: (bool, bool),
        closing: bool,
        out: &mut Outbox,
    ) {
        let service_idle = self
            .services
            .get(usize::from(conn.service))
            .map_or(self.config().idle_timeout_secs, |s| s.cfg.idle_timeout_secs);
        let fin_secs = self.config().fin_timeout_secs;
        let idle = if closing && fin_secs > 0 {
            fin_secs
        } else {
            service_idle
        };
        let catch_syn = self.is_partitioned(usize::from(conn.service));
        let low = (u64::from(conn.service) << 16)
            | u64::from(conn.backend.0)
            | rules::conn_tag_bits(conn.tag);
        let rewrite = key.service_addr != p.backend_ip;
        let fin = self.fin_timeout_body;

        if found.0 {
            for (i, &(d, port)) in self.scratch_path.iter().enumerate() {
                let first = i == 0;
                let mut rule = ConnRule {
                    cookie_low: if first {
                        low | cookie::conn::ACCOUNTING
                    } else {
                        low
                    },
                    idle_timeout: idle,
                    src: key.client,
                    dst: if first {
                        key.service_addr
                    } else {
                        p.backend_ip
                    },
                    sport: key.client_port,
                    dport: key.service_port,
                    // Every SYN comes up to be decided, even on a 4-tuple this rule holds.
                    syn: if first { Syn::Not } else { Syn::Any },
                    rewrite: if first && (rewrite || p.service_mac != p.backend_mac) {
                        Rewrite::dst(p.backend_mac, rewrite.then_some(p.backend_ip))
                    } else {
                        Rewrite::default()
                    },
                    fin,
                    out: Out::Port(port),
                };
                out.push_conn_rule(d, &rule);
                if first && catch_syn {
                    // A partitioned service's SYNs follow the partition's rule, not the
                    // intercept: a client that reuses this 4-tuple while the forward rule
                    // is still here (its FIN went by the controller, or the connection was
                    // adopted after it, or the FIN timeout has not run out) would send its
                    // SYN to the partition's owner and its ACK by this rule to the
                    // connection's backend. Seen on OVS with ports reused within 1.3 s: a
                    // RST, or a 5 s timeout against the old backend's TIME_WAIT. This rule
                    // brings such a SYN up to be decided (`reopen`). Not an accounting
                    // rule: its end says nothing about the connection's.
                    rule.syn = Syn::Only;
                    rule.rewrite = Rewrite::default();
                    rule.fin = None;
                    rule.out = Out::Controller;
                    rule.cookie_low = low;
                    rule.idle_timeout = service_idle;
                    out.push_conn_rule(d, &rule);
                }
            }
        }
        if found.1 {
            let last = self.scratch_rev.len().saturating_sub(1);
            for (i, &(d, port)) in self.scratch_rev.iter().enumerate() {
                let is_last = i == last;
                let rule = ConnRule {
                    cookie_low: low
                        | cookie::conn::REVERSE
                        | if is_last { cookie::conn::OUTCOME } else { 0 },
                    idle_timeout: idle,
                    src: p.backend_ip,
                    dst: key.client,
                    sport: key.service_port,
                    dport: key.client_port,
                    syn: Syn::Any,
                    rewrite: if is_last && (rewrite || p.service_mac != p.backend_mac) {
                        Rewrite::src(p.service_mac, rewrite.then_some(key.service_addr))
                    } else {
                        Rewrite::default()
                    },
                    fin,
                    out: Out::Port(port),
                };
                out.push_conn_rule(d, &rule);
            }
        }
    }

    /// Send one packet of a known connection on, with the rewrite its position calls for.
    /// A deferred connection's rules go out first when this is its client's ACK.
    fn send_known(
        &mut self,
        at: &Arrival<'_>,
        key: &ConnKey,
        conn: Conn,
        dir: Dir,
        pkt_dst: Ipv4Addr,
        out: &mut Outbox,
    ) {
        if !conn.installed && dir == Dir::Forward && at.completes_handshake() {
            let backend_isn = self.handshakes.syn_acks.get(key).copied();
            if !at.tcp.flags.ack() || backend_isn != Some(at.tcp.ack.wrapping_sub(1)) {
                // Not an answer to the SYN-ACK the controller passed on (a blind ACK, or
                // one whose SYN-ACK it never saw): dropped, the rules still wait.
                return;
            }
            self.handshakes.syn_acks.remove(key);
            if !self.install(key, out) {
                self.abandon(key, conn, false);
                return;
            }
            if let Some(s) = self.services.get_mut(usize::from(conn.service)) {
                s.handshakes.outcome(true);
            }
        }
        let Some(p) = self.placement(key, conn) else {
            return;
        };
        self.send_placed(at, key, &p, dir, pkt_dst, out);
        if dir == Dir::Forward && conn.installed && closes(at.tcp) {
            // The client's FIN or RST came here, not through the connection's rule (Open
            // vSwitch still held a cached flow to the controller from before the rule, or
            // the rule had not taken effect): the rule's fin_timeout never fired, and the
            // rule would outlive the connection by its whole idle timeout. In a partitioned
            // service that is what breaks the next connection on the 4-tuple (its SYN
            // follows the partition's rule, its ACK this one, to another backend); and the
            // connection's accounting would last as long. Shorten the rule as the switch
            // would have.
            let found = self.compute_paths(&p);
            self.emit_rules(key, conn, &p, (found.0, false), true, out);
        }
    }

    /// A deferred connection that will not complete: its accounting ends, and nothing is
    /// left in the switch (it never had rules). `client`: its client abandoned it (counted
    /// toward whether clients complete), rather than its backend or its path.
    fn abandon(&mut self, key: &ConnKey, conn: Conn, client: bool) {
        if self.conns.remove(key).is_none() {
            return;
        }
        self.handshakes.syn_acks.remove(key);
        if let Some(s) = self.services.get_mut(usize::from(conn.service)) {
            s.record_end(conn.backend);
            if client {
                s.handshakes.outcome(false);
            }
        }
    }

    /// Forget the deferred connections whose client's ACK did not come in time.
    pub(crate) fn expire_handshakes(&mut self, now: Instant) {
        let now_ms = self.ms_since_start(now);
        self.handshakes.expire_aborted(now_ms);
        while let Some(w) = self.handshakes.next_due(now_ms) {
            // Still the same connection, still waiting (not completed, reset or reopened).
            if let Some(conn) = self
                .conns
                .get(&w.key)
                .copied()
                .filter(|c| c.tag == w.tag && !c.installed)
            {
                self.abandon(&w.key, conn, true);
            }
        }
    }

    /// Service `si` defers its rules: make sure its backends' replies come up, so the
    /// SYN-ACK can be rewritten to the service address (`rules::reply_catch`), sent before
    /// the SYN goes on and again while deferrals go on; they end by themselves after.
    ///
    /// They carry no meter: the backends answer only SYNs the controller admitted, so its
    /// gate already bounds what they bring up; behind the table-miss meter a flood's
    /// SYN-ACKs crowded out a quiet service's (3 of 90 new connections timed out in
    /// `ovs_overload_packet_in_flood`, their SYN-ACKs dropped).
    fn send_reply_catch(&mut self, si: usize, now_ms: u64, out: &mut Outbox) {
        let Some(s) = self.services.get_mut(si) else {
            return;
        };
        if !s.handshakes.catch_due(now_ms) {
            return;
        }
        let s = &self.services[si];
        for d in self.switch_ids() {
            for b in &s.backends {
                out.push(
                    d,
                    rules::reply_catch(
                        s.slot,
                        b.address,
                        s.cfg.port,
                        super::handshake::CATCH_HARD_TIMEOUT_S,
                    ),
                );
            }
        }
    }

    /// [`Self::send_known`] with the connection's placement already worked out.
    fn send_placed(
        &mut self,
        at: &Arrival<'_>,
        key: &ConnKey,
        p: &Placement,
        dir: Dir,
        pkt_dst: Ipv4Addr,
        out: &mut Outbox,
    ) {
        let dpid = at.dpid;
        let readdressed = key.service_addr != p.backend_ip;
        let (rewrite, toward) = match dir {
            Dir::Forward if pkt_dst == key.service_addr => (
                Rewrite::dst(p.backend_mac, readdressed.then_some(p.backend_ip)),
                p.backend_at,
            ),
            Dir::Forward => (Rewrite::default(), p.backend_at),
            Dir::Reverse if dpid == p.client_at.dpid => (
                Rewrite::src(p.service_mac, readdressed.then_some(key.service_addr)),
                p.client_at,
            ),
            Dir::Reverse => (Rewrite::default(), p.client_at),
        };
        let Some(out_port) = self.topo.flow_egress_toward(dpid, toward, p.flow) else {
            return;
        };
        out.push_conn_packet_out(
            dpid,
            &ConnPacketOut {
                in_port: at.in_port,
                rewrite,
                out_port,
                data: at.data,
            },
        );
    }

    /// A non-SYN segment, to a partitioned service, of a connection the controller never
    /// saw: one its partition's wildcard rule placed, now at the controller because the
    /// partition moves (or its rules are being rewritten). It belongs to the backend the
    /// partition is moving from, or else to its owner: give it its own rules to that
    /// backend, so it stays there whatever the partition's rule becomes. Returns false
    /// when the service is not partitioned or the backend cannot be placed.
    fn adopt(
        &mut self,
        now: Instant,
        at: &Arrival<'_>,
        key: ConnKey,
        l: Listener,
        out: &mut Outbox,
    ) -> bool {
        let si = usize::from(l.service);
        let Some(b) = self.partition_backend(si, key.client_port, false) else {
            return false;
        };
        let Some(id) = self.services.get(si).and_then(|s| s.id_at(b)) else {
            return false;
        };
        let conn = Conn {
            service: l.service,
            backend: id,
            created_ms: self.ms_since_start(now),
            installed: true,
            // Established: the backend answered it long ago.
            reply: Reply::Answered,
            isn: None,
            tag: self.next_conn_tag & rules::CONN_TAG_MASK,
            client_mac: self.topo.mac_id(at.frame.eth_src),
        };
        let Some(p) = self.placement(&key, conn) else {
            return false;
        };
        let found = self.compute_paths(&p);
        if found != (true, true) {
            return false;
        }
        self.next_conn_tag = self.next_conn_tag.wrapping_add(1);
        if let Some(s) = self.services.get_mut(si) {
            s.record_adopted(b);
            tracing::debug!(service = %s.cfg.name, client = %key.client, cport = key.client_port, backend = b, "connection adopted from its partition");
        }
        self.conns.insert(key, conn);
        // Adopted on its FIN or RST: its rules will not see that segment.
        self.emit_rules(&key, conn, &p, found, closes(at.tcp), out);
        self.send_placed(at, &key, &p, Dir::Forward, key.service_addr, out);
        true
    }

    /// A non-SYN segment of a connection nobody decided: never send it to an arbitrary
    /// backend (that backend would reset it anyway, after a round trip).
    fn unknown_flow(&mut self, service: u16, at: &Arrival<'_>, out: &mut Outbox) {
        if let Some(s) = self.services.get_mut(usize::from(service)) {
            s.counters.unknown_flow_packets += 1;
        }
        // A proactive service's connections live in the switch's conntrack, not in our
        // table: a packet of one that strays here (a switch still resyncing) is dropped,
        // never reset, so a live connection only loses a segment it will retransmit.
        if self.is_proactive(usize::from(service)) {
            return;
        }
        if self.config().unknown_flow == UnknownFlowPolicy::Reset {
            self.reset(at, out);
        }
    }

    /// Answer a segment with the RST its destination would send (RFC 9293 §3.10.7.1).
    /// Over IPv4 the reset is built on the stack and encoded in place, as a placed
    /// connection's PACKET_OUT is: a controller shedding load refuses SYNs at its peak
    /// rate, and a refusal should cost less than the placement it saves.
    pub(super) fn reset(&mut self, at: &Arrival<'_>, out: &mut Outbox) {
        if let Some(rst) = packet::tcp_rst_v4(at.frame) {
            self.counters.resets_sent += 1;
            let po = ConnPacketOut {
                in_port: ofp::port::CONTROLLER,
                rewrite: Rewrite::default(),
                out_port: at.in_port,
                data: &rst,
            };
            out.push_conn_packet_out(at.dpid, &po);
        } else if let Some(rst) = packet::tcp_rst(at.frame) {
            self.counters.resets_sent += 1;
            out.push(
                at.dpid,
                rules::packet_out(ofp::port::CONTROLLER, rules::output(at.in_port), rst),
            );
        }
    }

    /// After a restart or a reconnect: a connection rule the switch still holds becomes a
    /// connection in the table again, with the backend its rewrite names.
    pub(crate) fn rebuild_conn(&mut self, now: Instant, fs: &ofp::FlowStats) {
        if cookie::kind_of(fs.cookie) != Some(RuleKind::Conn)
            || fs.cookie & cookie::conn::ACCOUNTING == 0
        {
            return;
        }
        let Some(key) = Tuple::of_match(&fs.match_).forward_key() else {
            return;
        };
        if self.conns.get(&key).is_some() {
            return;
        }
        let Some(&l) = self.listeners.get(&(key.service_addr, key.service_port)) else {
            return;
        };
        let backend_ip = rewritten_ipv4_dst(&fs.instructions).unwrap_or(key.service_addr);
        let Some(s) = self.services.get_mut(usize::from(l.service)) else {
            return;
        };
        let Some(bi) = s.backend_index(backend_ip) else {
            return;
        };
        let Some(b) = s.backends.get_mut(bi) else {
            return;
        };
        b.active_connections += 1;
        let id = b.id;
        if let Some(load) = s.loads.get_mut(bi) {
            load.active_connections += 1;
        }
        let created_ms = self
            .ms_since_start(now)
            .saturating_sub(u64::from(fs.duration_sec) * 1000);
        self.conns.insert(
            key,
            Conn {
                service: l.service,
                backend: id,
                created_ms,
                installed: true,
                reply: Reply::Unseen,
                isn: None,
                tag: rules::conn_tag_of(fs.cookie),
                // Its rules do not say; the client address's learned MAC stands in.
                client_mac: MacId::UNKNOWN,
            },
        );
        self.counters.connections_rebuilt += 1;
    }
}

/// The address a rule's actions rewrite the destination to (its backend's), if any.
fn rewritten_ipv4_dst(instructions: &ofp::Instructions) -> Option<Ipv4Addr> {
    instructions.iter().find_map(|i| match i {
        Instruction::ApplyActions(actions) | Instruction::WriteActions(actions) => {
            actions.iter().find_map(|a| match a {
                Action::SetField(Oxm::Ipv4Dst { value, .. }) => Some(*value),
                _ => None,
            })
        }
        _ => None,
    })
}

/// Whether a segment ends its sender's side of the connection (what `fin_timeout` acts on).
fn closes(tcp: &Tcp<'_>) -> bool {
    tcp.flags.fin() || tcp.flags.rst()
}

/// The connection on a SYN's 4-tuple that the new one follows.
#[derive(Debug, Clone, Copy)]
enum Earlier {
    /// A connection still in the table, which the client opened again with another ISN
    /// ([`Controller::reopen`]): its accounting ended, the new one decided and counted.
    Reopened(Conn),
    /// The connection this very SYN was decided for, ended during its handshake
    /// (`Handshakes::take_aborted`): placed again, on its backend if it can still take
    /// it, admitted and counted once already.
    Resumed(Conn),
}

impl Earlier {
    fn conn(self) -> Conn {
        match self {
            Earlier::Reopened(c) | Earlier::Resumed(c) => c,
        }
    }
}

/// The backend `sel` picked in service `s` (its position and number), if it is located
/// (its MAC known); the selection's outcome goes to the service's counters either way
/// (`client`: the connection's, for the log).
fn picked(s: &mut ServiceState, sel: &Selection, client: Ipv4Addr) -> Option<(usize, BackendId)> {
    match sel.outcome {
        Outcome::NoOptimalServer => {
            s.counters.no_optimal_server += 1;
            tracing::debug!(service = %s.cfg.name, %client, "the optimal server was not found");
        }
        Outcome::Moved {
            search: Some(search),
            ..
        } => s.counters.isslm_moves.count(search),
        _ => {}
    }
    let b = sel.backend?;
    let backend = s.backends.get(b).filter(|b| b.mac.is_some())?;
    Some((b, backend.id))
}

/// Remove the reverse rule of connection `key`'s old backend `old_ip` at switch `dpid`.
/// The new backend's reverse rules have another match, so nothing replaced them. At the
/// client's edge, where the old backend's answers are rewritten to the service's
/// address, this one must go: a late segment of the old backend must not be delivered
/// into the connection as the service's.
fn delete_reverse_rule(key: &ConnKey, dpid: Dpid, old_ip: Ipv4Addr, out: &mut Outbox) {
    let m = rules::tcp_match(
        Some(old_ip),
        Some(key.client),
        Some(key.service_port),
        Some(key.client_port),
    );
    out.push(dpid, rules::conn_delete_strict(m));
}

/// A per-process keyed hash of the connection, for algorithms that hash.
fn flow_hash(key: &ConnKey) -> u64 {
    let mut h = ahash::RandomState::with_seeds(0x666c, 0x6f77, 0x6761, 0x7465).build_hasher();
    h.write_u32(u32::from(key.client));
    h.write_u16(key.client_port);
    h.write_u32(u32::from(key.service_addr));
    h.write_u16(key.service_port);
    h.finish()
}
