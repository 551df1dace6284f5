//! The partitioned mode (`mode = "partitioned"` on a `[[service]]`): new connections stay
//! in the switch without any per-connection state, as in "OpenFlow-Based Server Load
//! Balancing Gone Wild" (Wang, Butnariu, Rexford, Hot-ICE 2011).
//!
//! **Partitions.** The client-port space is split into `2^b` partitions (`partition_bits`):
//! partition `p` holds the source ports whose bits 1..=b equal `p`. Gone Wild splits client
//! addresses; ports split one client's connections too, and bit 0 is left out because
//! Linux's `connect()` allocates even ports in sequence (bits 1..=b cycle through every
//! value). Each partition is owned by one backend, and each switch holds one wildcard rule
//! per partition:
//!
//! | prio | match | actions |
//! | --- | --- | --- |
//! | [`PRIO_MOVING`] | `tcp, ip_dst=V, tcp_dst=P, tcp_src=p<<1/mask`, while `p` moves | to the controller |
//! | [`PRIO_PARTITION`] | `tcp, ip_dst=V, tcp_dst=P, tcp_src=p<<1/mask` | `eth_dst:=MAC(owner)`, output toward the owner |
//!
//! Both lie between the connection rules (300) and the service's intercept rule (200), which
//! stays as the fallback: a packet of a partition that has no rule (no owner located yet, a
//! switch being resynced) reaches the controller and is placed there with the partition's
//! owner, as an exact per-connection rule.
//!
//! **Direct return.** The rule rewrites only the Ethernet destination: the backends hold
//! the VIP themselves (on their loopback, not answering ARP for it, as in IPVS's direct
//! routing) and answer from it, so the reverse direction needs no rule at all and the
//! switch does per packet what it does for plain L2 forwarding. (A stateless reverse
//! rewrite would also rewrite the backend's answers to anyone reaching it directly, its
//! health probes included; conntrack is what tells them apart, and it is what the
//! `proactive` mode pays for.) Connections placed at the controller get the same shape:
//! their rules send to the backend's MAC with the VIP kept.
//!
//! **Live load.** Every refresh the service's own balancer gives the shares it would give
//! the next picks (the proactive mode's bucket weights, `proactive::compute_weights`), and
//! the partition counts follow their moving average (time constant [`SMOOTHING`]) by
//! largest remainders. When some backend's count is off by at least a sixteenth of the
//! partitions (two at least; at most once per [`REBALANCE_MIN`]), or a backend that owns
//! partitions can no longer take connections (unhealthy, drained, ejected: at once), the
//! fewest partitions that close the gap change owner. Both brakes matter: every move costs
//! a transition through the controller, and a weight that flips by one pick between
//! refreshes must not move a partition back and forth.
//!
//! **Transitions: no live connection moves.** A partition that changes owner first gets a
//! rule sending it to the controller ([`PRIO_MOVING`]), then, after a barrier, its wildcard
//! rule names the new owner. For `transition_secs` the controller places what arrives: a
//! SYN is a new connection, for the new owner; any other segment belongs to a connection
//! of the old owner, which keeps it (an exact rule each, so each connection costs one trip
//! to the controller). Then the moving rule is deleted. A connection idle for the whole
//! transition is moved with its partition (Gone Wild's soft deadline; its next segment
//! reaches the new owner, which resets it).
//!
//! **What the switch still caches.** A barrier covers Open vSwitch's flow table, not the
//! flows its datapath cached from it: each is brought up to date in its revalidators' next
//! round (up to 198 ms measured under load), and the SYN and the ACK of one connection can
//! be cached apart (connection rules match the SYN bit). So for [`SETTLE`] after a move
//! starts, a SYN that comes up goes to the old owner, where the rest of its connection may
//! still be carried (held, for the client to send again, when the old owner can no longer
//! take it). And every SYN on the 4-tuple of a connection rule must be decided where its
//! ACK will go: the client reuses ports within a second or two, and the partition's rule,
//! not the intercept, takes a SYN that misses the connection rules (`tcp_flags=-syn`). So a
//! partitioned connection's rules include one that brings such a SYN up
//! (`conn_rule::Syn::Only`); a connection rule whose FIN or RST went by the controller (so its
//! `fin_timeout` never fired) or was adopted on one is shortened as `fin_timeout` would
//! have; and a SYN that comes up goes where the partition's rule sends the partition's
//! packets, its owner's even if that one was drained since the last refresh, held when a
//! connection rule on its 4-tuple names another backend (`vip::new_connection`).

//!
//! **A restart.** A switch that connects keeps its partition rules through its reconnect
//! grace (`reconnect_grace_ms`), and is asked for them. A controller that has not placed
//! a partition yet (it just started, or took over) gives it to the owner the switch's rule
//! names, so the connections that rule carries keep their backend; while such an owner is
//! not located yet, no partition is placed by the balancer (until the last grace ends).
//! When a switch's grace ends, a partition rule on it that no service would write now is
//! stale, and the switch's partition rules are rewritten ([`Controller::partition_settle`]).

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use flowgate_packet::{ETH_TYPE_IPV4, IP_PROTO_TCP, MacAddr};
use ofp::{Action, Actions, FlowMod, Instruction, Match, Message, Oxm, RawOxm};

use super::{Controller, Outbox, rules};
use crate::config::ServiceMode;
use crate::cookie::{self, RuleKind};
use crate::topology::{Dpid, PortRef};

/// Above the intercept (200) and the gap rules (250 would be above, but a partitioned
/// service has no gap), below every connection's own rules (300).
pub(crate) const PRIO_PARTITION: u16 = 220;
/// A moving partition's trip to the controller, above its wildcard rule.
pub(crate) const PRIO_MOVING: u16 = 240;
/// Partition counts are not changed more often than this...
const REBALANCE_MIN: Duration = Duration::from_secs(1);
/// ...nor while no backend is off by `partitions / REBALANCE_DEVIATION_DIV` (at least 2).
const REBALANCE_DEVIATION_DIV: usize = 16;
/// The time constant of the weights' moving average.
const SMOOTHING: Duration = Duration::from_secs(1);
/// How long after a partition starts moving the switch may still forward its packets by
/// flows it cached from the old wildcard rule. A barrier covers the flow table, not Open
/// vSwitch's datapath: its revalidators bring each cached flow up to date in their next
/// round, which took up to 198 ms under `ovs_partitioned_partitions_settle_under_load`
/// (`ovs-appctl upcall/show`, ~8,000 datapath flows), and a change in the middle of a
/// round waits for the next one; 500 ms is also Open vSwitch's default `max-revalidator`.
/// Meanwhile a SYN placed by the controller on the new owner could have its ACK carried to
/// the old one by such a flow, which resets it (seen: up to 77 ms after the move).
const SETTLE: Duration = Duration::from_millis(500);

/// The partition of a client port, for a service with `bits` partition bits.
pub(crate) fn partition_of(client_port: u16, bits: u8) -> usize {
    usize::from((client_port >> 1) & ((1u16 << bits) - 1))
}

/// The client-port bits a partition rule matches.
pub(crate) fn port_mask(bits: u8) -> u16 {
    ((1u16 << bits) - 1) << 1
}

/// A partition changing owner: its connections of `from` keep `from` until `until_ms`;
/// until `settled_ms` its new connections do too (see [`SETTLE`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Move {
    pub(crate) from: Ipv4Addr,
    pub(crate) until_ms: u64,
    pub(crate) settled_ms: u64,
}

/// One partitioned service's partitions.
#[derive(Debug, Clone, Default)]
pub(crate) struct Partitions {
    /// The service's name (the state follows it across reloads).
    name: String,
    pub(crate) bits: u8,
    /// The owner of each partition, by address (indexes change on reloads).
    pub(crate) owner: Vec<Option<Ipv4Addr>>,
    pub(crate) moving: Vec<Option<Move>>,
    /// The backends, their MACs and where they are, as the rules were last built.
    sig: Vec<(Ipv4Addr, Option<MacAddr>, Option<PortRef>)>,
    /// The topology generation the rules were last built for.
    topo_generation: u64,
    rebalanced_at: Option<Instant>,
    /// The balancer's weights, averaged ([`SMOOTHING`]), and when last updated.
    smoothed: Vec<f64>,
    smoothed_at: Option<Instant>,
    /// Partitions that changed owner since the controller started.
    pub(crate) moves_total: u64,
}

impl Partitions {
    fn new(name: &str, bits: u8) -> Self {
        let n = 1usize << bits;
        Partitions {
            name: name.to_string(),
            bits,
            owner: vec![None; n],
            moving: vec![None; n],
            ..Partitions::default()
        }
    }

    /// Fold this refresh's weights into the moving average and return it, rounded. A
    /// backend whose weight goes to or from zero (it can no longer, or can again, take
    /// connections) resets the average: that change is acted on at once.
    fn smooth(&mut self, now: Instant, weights: &[u16]) -> Vec<u16> {
        let zeros_moved = self.smoothed.len() != weights.len()
            || self
                .smoothed
                .iter()
                .zip(weights)
                .any(|(&a, &w)| (a == 0.0) != (w == 0));
        match self.smoothed_at {
            Some(at) if !zeros_moved => {
                let dt = now.saturating_duration_since(at).as_secs_f64();
                let alpha = 1.0 - (-dt / SMOOTHING.as_secs_f64()).exp();
                for (a, &w) in self.smoothed.iter_mut().zip(weights) {
                    *a += alpha * (f64::from(w) - *a);
                }
            }
            _ => self.smoothed = weights.iter().map(|&w| f64::from(w)).collect(),
        }
        self.smoothed_at = Some(now);
        self.smoothed.iter().map(|&a| a.round() as u16).collect()
    }

    /// The backend a segment of this partition goes to: a SYN (a new connection) to the
    /// owner, anything else to the owner the partition is moving from, if it moves.
    fn backend_for(&self, client_port: u16, syn: bool) -> Option<Ipv4Addr> {
        let p = partition_of(client_port, self.bits);
        match self.moving.get(p).copied().flatten() {
            Some(m) if !syn => Some(m.from),
            _ => self.owner.get(p).copied().flatten(),
        }
    }

    /// The owner this partition is moving from, while the move settles ([`SETTLE`]).
    fn settling_from(&self, client_port: u16, now_ms: u64) -> Option<Ipv4Addr> {
        let p = partition_of(client_port, self.bits);
        self.moving
            .get(p)
            .copied()
            .flatten()
            .filter(|m| now_ms < m.settled_ms)
            .map(|m| m.from)
    }
}

/// Per-service state of the partitioned mode (indexed like `Controller::services`).
#[derive(Debug, Default)]
pub(crate) struct PartitionState {
    pub(crate) services: Vec<Option<Partitions>>,
    /// The `(vip, port, partition_bits)` of every partitioned service, as the switches'
    /// rules were last written for them (what decides whether a reload leaves stale ones).
    shapes: Vec<(Ipv4Addr, u16, u8)>,
    /// The partition rules switches in their reconnect grace hold, from their flow stats:
    /// a restarted controller takes the partitions' owners from them.
    pub(crate) reported: Vec<Reported>,
}

/// One partition rule a switch reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Reported {
    dpid: Dpid,
    priority: u16,
    vip: Ipv4Addr,
    port: u16,
    /// The client-port bits and mask it matches.
    value: u16,
    mask: u16,
    /// The owner's MAC it rewrites to (a wildcard rule; `None` for a moving one).
    mac: Option<MacAddr>,
}

impl Reported {
    /// A partition rule on switch `dpid` (as its flow stats report it, or as we write
    /// it); `None` if it is not one of the shapes `partition_rules` writes.
    fn of(
        dpid: Dpid,
        priority: u16,
        match_: &Match,
        instructions: &[Instruction],
    ) -> Option<Reported> {
        let (mut vip, mut port, mut bits) = (None, None, None);
        for o in match_.iter() {
            match o {
                Oxm::Ipv4Dst { value, mask: None } => vip = Some(*value),
                Oxm::TcpDst(p) => port = Some(*p),
                Oxm::Raw(r)
                    if r.class == ofp::oxm::class::OPENFLOW_BASIC
                        && r.field == ofp::oxm::ofb::TCP_SRC
                        && r.hasmask
                        && r.payload.len() == 4 =>
                {
                    let v = u16::from_be_bytes([r.payload[0], r.payload[1]]);
                    let m = u16::from_be_bytes([r.payload[2], r.payload[3]]);
                    bits = Some((v, m));
                }
                _ => {}
            }
        }
        let mac = instructions.iter().find_map(|i| match i {
            Instruction::ApplyActions(a) => a.iter().find_map(|a| match a {
                Action::SetField(Oxm::EthDst { value, mask: None }) => Some(MacAddr(*value)),
                _ => None,
            }),
            _ => None,
        });
        let (value, mask) = bits?;
        Some(Reported {
            dpid,
            priority,
            vip: vip?,
            port: port?,
            value,
            mask,
            mac,
        })
    }
}

/// Largest-remainder shares of `n` partitions by `weights` (all zero: all zero).
pub(crate) fn apportion(n: usize, weights: &[u16]) -> Vec<usize> {
    let total: u64 = weights.iter().map(|&w| u64::from(w)).sum();
    if total == 0 {
        return vec![0; weights.len()];
    }
    let n64 = n as u64;
    let mut counts: Vec<usize> = weights
        .iter()
        .map(|&w| (u64::from(w) * n64 / total) as usize)
        .collect();
    let mut left = n - counts.iter().sum::<usize>();
    // Remainders, largest first; ties to the lower index, so the result is stable.
    let mut order: Vec<usize> = (0..weights.len()).filter(|&i| weights[i] > 0).collect();
    order.sort_by_key(|&i| (std::cmp::Reverse(u64::from(weights[i]) * n64 % total), i));
    for i in order.into_iter().cycle() {
        if left == 0 {
            break;
        }
        counts[i] += 1;
        left -= 1;
    }
    counts
}

/// The fewest owner changes that bring the partitions to `target` counts (by backend
/// index into `backends`): partitions of over-served or unknown owners go, lowest first,
/// to backends short of their count. Partitions already moving stay put unless their owner
/// has a target of zero (it can no longer take connections). Returns `(partition, new)`.
pub(crate) fn rebalance(
    owner: &[Option<Ipv4Addr>],
    moving: &[Option<Move>],
    backends: &[Ipv4Addr],
    target: &[usize],
) -> Vec<(usize, Ipv4Addr)> {
    let index = |a: Ipv4Addr| backends.iter().position(|&b| b == a);
    let mut have = vec![0usize; backends.len()];
    for o in owner.iter().flatten() {
        if let Some(i) = index(*o) {
            have[i] += 1;
        }
    }
    let mut free = Vec::new();
    for (p, o) in owner.iter().enumerate() {
        match o.and_then(index) {
            None => free.push(p),
            Some(i) if target[i] == 0 => {
                have[i] -= 1;
                free.push(p);
            }
            Some(i) if have[i] > target[i] && moving[p].is_none() => {
                have[i] -= 1;
                free.push(p);
            }
            Some(_) => {}
        }
    }
    let mut moves = Vec::new();
    let mut free = free.into_iter();
    for (i, &b) in backends.iter().enumerate() {
        while have[i] < target[i] {
            let Some(p) = free.next() else {
                return moves;
            };
            have[i] += 1;
            if owner[p] != Some(b) {
                moves.push((p, b));
            }
        }
    }
    moves
}

/// The partition's match: TCP to `vip:port` from client ports of partition `p`. OpenFlow
/// 1.3 lists TCP_SRC as unmaskable (§7.2.3.7); Open vSwitch accepts a mask on it (as
/// `ovs-ofctl` writes `tp_src=value/mask`), so the masked OXM is written raw.
pub(crate) fn partition_match(vip: Ipv4Addr, port: u16, p: usize, bits: u8) -> Match {
    let value = ((p as u16) << 1) & port_mask(bits);
    let mut payload = Vec::with_capacity(4);
    payload.extend_from_slice(&value.to_be_bytes());
    payload.extend_from_slice(&port_mask(bits).to_be_bytes());
    Match::new()
        .with(Oxm::EthType(ETH_TYPE_IPV4))
        .with(Oxm::IpProto(IP_PROTO_TCP))
        .with(Oxm::Ipv4Dst {
            value: vip,
            mask: None,
        })
        .with(Oxm::TcpDst(port))
        .with(Oxm::Raw(RawOxm {
            class: ofp::oxm::class::OPENFLOW_BASIC,
            field: ofp::oxm::ofb::TCP_SRC,
            hasmask: true,
            payload: Bytes::from(payload),
        }))
}

/// The cookie of partition `p` of the service in `slot` (`ServiceState::slot`).
fn partition_cookie(slot: u16, p: usize) -> u64 {
    cookie::cookie(
        RuleKind::Partition,
        (u64::from(slot) << 16) | (p as u64 & 0xffff),
    )
}

fn rule(slot: u16, p: usize, priority: u16, m: Match, actions: Actions) -> Message {
    let mut fm = FlowMod::add(m);
    fm.cookie = partition_cookie(slot, p);
    fm.priority = priority;
    fm.instructions.push(Instruction::ApplyActions(actions));
    Message::FlowMod(fm)
}

fn moving_delete(m: Match) -> Message {
    let mut fm = FlowMod::delete_strict(m);
    fm.priority = PRIO_MOVING;
    fm.cookie = RuleKind::Partition.base();
    fm.cookie_mask = cookie::KIND_MASK;
    Message::FlowMod(fm)
}

/// A partitioned service's partitions, for operators (`/api/v1/services`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PartitionView {
    /// `2^partition_bits`.
    pub partitions: usize,
    /// Partitions each backend owns (by backend index).
    pub owned: Vec<usize>,
    /// Partitions now moving (their packets go through the controller).
    pub moving: usize,
    /// Owner changes since the controller started.
    pub moves_total: u64,
}

impl Controller {
    /// The partitions of a partitioned service, `None` for the other modes.
    pub fn partition_view(&self, service: usize) -> Option<PartitionView> {
        let st = self.partitions.services.get(service)?.as_ref()?;
        let s = self.services.get(service)?;
        Some(PartitionView {
            partitions: st.owner.len(),
            owned: s
                .backends
                .iter()
                .map(|b| st.owner.iter().filter(|&&o| o == Some(b.address)).count())
                .collect(),
            moving: st.moving.iter().flatten().count(),
            moves_total: st.moves_total,
        })
    }

    pub(crate) fn is_partitioned(&self, service: usize) -> bool {
        self.services
            .get(service)
            .is_some_and(|s| s.cfg.mode == ServiceMode::Partitioned && s.cfg.vip.is_some())
    }

    /// The backend (index) a segment of a partitioned service's connection goes to, by its
    /// partition (see [`Partitions::backend_for`]); `None` for other services, or when the
    /// partition has no owner that can be found in the pool.
    pub(crate) fn partition_backend(
        &self,
        service: usize,
        client_port: u16,
        syn: bool,
    ) -> Option<usize> {
        let st = self.partitions.services.get(service)?.as_ref()?;
        let addr = st.backend_for(client_port, syn)?;
        let s = self.services.get(service)?;
        s.backends.iter().position(|b| b.address == addr)
    }

    /// While the move of a partitioned service's partition settles ([`SETTLE`]): the
    /// backend (index) it moves from, `None` when that one left the pool. `None` outside.
    pub(crate) fn partition_settling(
        &self,
        service: usize,
        client_port: u16,
        now_ms: u64,
    ) -> Option<Option<usize>> {
        let st = self.partitions.services.get(service)?.as_ref()?;
        let addr = st.settling_from(client_port, now_ms)?;
        let s = self.services.get(service)?;
        Some(s.backends.iter().position(|b| b.address == addr))
    }

    /// The rules of one partition on one switch: the wildcard rule toward its owner, and
    /// the trip to the controller while it moves. Nothing when the owner is not located
    /// or not reachable from the switch (the intercept rule then takes the partition).
    fn partition_rules(&self, dpid: Dpid, service: usize, p: usize, v: &mut Vec<Message>) {
        let (Some(s), Some(Some(st))) = (
            self.services.get(service),
            self.partitions.services.get(service),
        ) else {
            return;
        };
        let Some(vip) = s.cfg.vip else { return };
        let m = partition_match(vip, s.cfg.port, p, st.bits);
        if st.moving.get(p).copied().flatten().is_some() {
            let mut a = Actions::new();
            // OFPCML_NO_BUFFER: the whole packet, so it can go on by PACKET_OUT (§7.2.5).
            a.push(Action::Output {
                port: ofp::port::CONTROLLER,
                max_len: ofp::CONTROLLER_MAX_LEN_NO_BUFFER,
            });
            v.push(rule(s.slot, p, PRIO_MOVING, m.clone(), a));
            // §6.2: the trip to the controller must be in force before the wildcard rule
            // names the new owner, or a moving connection's segment could reach it.
            v.push(Message::BarrierRequest);
        }
        let Some(owner) = st.owner.get(p).copied().flatten() else {
            return;
        };
        let Some(b) = s.backends.iter().find(|b| b.address == owner) else {
            return;
        };
        let Some(mac) = b.mac else { return };
        let Some(at) = self.topo.host(mac).map(|h| h.at) else {
            return;
        };
        let Some(port) = self.topo.egress_toward(dpid, at) else {
            return;
        };
        let mut a = Actions::new();
        a.push(Action::SetField(Oxm::EthDst {
            value: mac.0,
            mask: None,
        }));
        a.push(Action::output(port));
        v.push(rule(s.slot, p, PRIO_PARTITION, m, a));
    }

    /// Every partition rule of every partitioned service, for one switch.
    fn partition_switch_rules(&self, dpid: Dpid) -> Vec<Message> {
        let mut v = Vec::new();
        for (si, st) in self.partitions.services.iter().enumerate() {
            let Some(st) = st else { continue };
            for p in 0..st.owner.len() {
                self.partition_rules(dpid, si, p, &mut v);
            }
        }
        v
    }

    /// A switch (re)connected: install the current rules. Without a reconnect grace its
    /// `Partition` rules were deleted first; in one they are kept, and asked for: a
    /// restarted controller takes the owners from them ([`Self::partition_tick`]).
    pub(crate) fn partition_switch_up(&mut self, dpid: Dpid, out: &mut Outbox) {
        self.partitions.reported.retain(|r| r.dpid != dpid);
        if self.in_grace(dpid) {
            out.push(dpid, rules::flow_stats_request(RuleKind::Partition));
        } else {
            out.push(dpid, rules::delete_kind(RuleKind::Partition));
            out.push(dpid, Message::BarrierRequest);
        }
        for m in self.partition_switch_rules(dpid) {
            out.push(dpid, m);
        }
    }

    /// A rule from a switch's flow stats: note it if it is one of our partition rules on
    /// a switch in its reconnect grace.
    pub(crate) fn note_partition_rule(&mut self, dpid: Dpid, fs: &ofp::FlowStats) {
        if cookie::kind_of(fs.cookie) != Some(RuleKind::Partition) || !self.in_grace(dpid) {
            return;
        }
        if let Some(r) = Reported::of(dpid, fs.priority, &fs.match_, &fs.instructions) {
            self.partitions.reported.push(r);
        }
    }

    /// A switch's reconnect grace ended. A partition rule it holds that this controller
    /// would not write (a moving rule of a move it never knew, a shape no service has now)
    /// is stale: the switch's partition rules are deleted and the current ones written
    /// (the intercept rule takes the packets in between). Rules that only name another
    /// owner were replaced in place already.
    pub(crate) fn partition_settle(&mut self, dpid: Dpid, out: &mut Outbox) {
        let current = self.partition_switch_rules(dpid);
        let key = |priority: u16, vip: Ipv4Addr, port: u16, value: u16, mask: u16| {
            (priority, vip, port, value & mask, mask)
        };
        let written: Vec<_> = current
            .iter()
            .filter_map(|m| match m {
                Message::FlowMod(fm) => {
                    let r = Reported::of(dpid, fm.priority, &fm.match_, &fm.instructions)?;
                    Some(key(r.priority, r.vip, r.port, r.value, r.mask))
                }
                _ => None,
            })
            .collect();
        let stale = self
            .partitions
            .reported
            .iter()
            .filter(|r| r.dpid == dpid)
            .any(|r| !written.contains(&key(r.priority, r.vip, r.port, r.value, r.mask)));
        self.partitions.reported.retain(|r| r.dpid != dpid);
        if stale {
            out.push(dpid, rules::delete_kind(RuleKind::Partition));
            out.push(dpid, Message::BarrierRequest);
            for m in current {
                out.push(dpid, m);
            }
        }
    }

    /// The services were replaced (a reload): keep each partitioned service's owners by
    /// name, and rewrite every switch's partition rules. An ADD with the same match and
    /// priority replaces a rule in place (§6.4), so the rules are deleted first only when
    /// some would be left stale (a partitioned service gone, or its VIP, port or partition
    /// count changed); the intercept rule then takes the few packets that arrive in
    /// between, and the controller places them by their partition as the rules would.
    pub(crate) fn partition_resync(&mut self, out: &mut Outbox) {
        let mut old = std::mem::take(&mut self.partitions.services);
        let n = self.services.len();
        self.partitions.services = (0..n)
            .map(|i| {
                if !self.is_partitioned(i) {
                    return None;
                }
                let s = &self.services[i];
                let bits = s.cfg.partitions.bits;
                let kept = old
                    .iter_mut()
                    .find(|o| {
                        o.as_ref()
                            .is_some_and(|o| o.name == s.cfg.name && o.bits == bits)
                    })
                    .and_then(Option::take);
                let mut st = kept.unwrap_or_else(|| Partitions::new(&s.cfg.name, bits));
                // Rebuilt below for the new pool.
                st.sig.clear();
                Some(st)
            })
            .collect();
        let shapes: Vec<(Ipv4Addr, u16, u8)> = (0..n)
            .filter(|&i| self.is_partitioned(i))
            .filter_map(|i| {
                let c = &self.services[i].cfg;
                Some((c.vip?, c.port, c.partitions.bits))
            })
            .collect();
        let stale = self
            .partitions
            .shapes
            .iter()
            .any(|old| !shapes.contains(old));
        self.partitions.shapes = shapes;
        let dpids: Vec<Dpid> = self.switch_ids().collect();
        for d in dpids {
            if stale {
                out.push(
                    d,
                    crate::controller::rules::delete_kind(RuleKind::Partition),
                );
                out.push(d, Message::BarrierRequest);
            }
            for m in self.partition_switch_rules(d) {
                out.push(d, m);
            }
        }
    }

    /// On each refresh: rebuild a service's rules when its backends moved or the topology
    /// changed, end transitions that are due, and follow live load.
    pub(crate) fn partition_tick(&mut self, now: Instant, out: &mut Outbox) {
        let n = self.services.len();
        if self.partitions.services.len() != n {
            self.partitions.services.resize_with(n, || None);
        }
        let now_ms = self.ms_since_start(now);
        let generation = self.topo.generation();
        let any_grace = self.switch_ids().any(|d| self.in_grace(d));
        for si in 0..n {
            if !self.is_partitioned(si) {
                continue;
            }
            if self.partitions.services[si].is_none() {
                let c = &self.services[si].cfg;
                self.partitions.services[si] = Some(Partitions::new(&c.name, c.partitions.bits));
                if let Some(shape) = c.vip.map(|v| (v, c.port, c.partitions.bits))
                    && !self.partitions.shapes.contains(&shape)
                {
                    self.partitions.shapes.push(shape);
                }
            }
            let sig: Vec<(Ipv4Addr, Option<MacAddr>, Option<PortRef>)> = self.services[si]
                .backends
                .iter()
                .map(|b| {
                    let at = b.mac.and_then(|m| self.topo.host(m)).map(|h| h.at);
                    (b.address, b.mac, at)
                })
                .collect();
            let weights = self.compute_weights(now, si);
            let transition = self.services[si].cfg.partitions.transition;
            let (vip, port) = (self.services[si].cfg.vip, self.services[si].cfg.port);
            let Some(st) = self.partitions.services[si].as_mut() else {
                continue;
            };
            let mut changed: Vec<usize> = Vec::new();
            // A restarted controller: partitions it has not placed yet go where the
            // switches' rules send them, the connections there with them. One whose
            // owner is not located yet holds the placing of the rest until it is, or
            // until every switch's grace has ended.
            let mut unresolved = false;
            for p in 0..st.owner.len() {
                if st.owner[p].is_some() {
                    continue;
                }
                let mask = port_mask(st.bits);
                let value = ((p as u16) << 1) & mask;
                let Some(mac) = self.partitions.reported.iter().find_map(|r| {
                    (r.priority == PRIO_PARTITION
                        && Some(r.vip) == vip
                        && r.port == port
                        && r.mask == mask
                        && r.value & mask == value)
                        .then_some(r.mac)
                        .flatten()
                }) else {
                    continue;
                };
                match self.services[si]
                    .backends
                    .iter()
                    .find(|b| b.mac == Some(mac))
                {
                    Some(b) => {
                        st.owner[p] = Some(b.address);
                        changed.push(p);
                    }
                    None => unresolved = true,
                }
            }
            let hold = unresolved && any_grace;
            let mut ended: Vec<usize> = Vec::new();
            for (p, m) in st.moving.iter_mut().enumerate() {
                if m.is_some_and(|m| m.until_ms <= now_ms) {
                    *m = None;
                    ended.push(p);
                }
            }
            // Follow live load.
            let addrs: Vec<Ipv4Addr> = sig.iter().map(|s| s.0).collect();
            let smoothed = st.smooth(now, &weights);
            let target = apportion(st.owner.len(), &smoothed);
            let have = |a: Ipv4Addr| st.owner.iter().filter(|&&o| o == Some(a)).count();
            let deviation = addrs
                .iter()
                .zip(&target)
                .map(|(&a, &t)| have(a).abs_diff(t))
                .max()
                .unwrap_or(0);
            // A partition without an owner, or whose owner can take nothing now.
            let lost = st.owner.iter().any(|o| match o {
                None => true,
                Some(a) => addrs
                    .iter()
                    .position(|x| x == a)
                    .is_none_or(|i| target[i] == 0),
            });
            let due = st
                .rebalanced_at
                .is_none_or(|t| now.saturating_duration_since(t) >= REBALANCE_MIN);
            let enough = deviation >= (st.owner.len() / REBALANCE_DEVIATION_DIV).max(2);
            if !hold && target.iter().any(|&t| t > 0) && (lost || (enough && due)) {
                let moves = rebalance(&st.owner, &st.moving, &addrs, &target);
                if !moves.is_empty() {
                    st.rebalanced_at = Some(now);
                }
                for (p, to) in moves {
                    // A partition with no owner had no wildcard rule: nothing of it lives
                    // in the switch, so it needs no transition.
                    if let Some(from) = st.owner[p] {
                        // Moving again: its trip to the controller stayed in force, so the
                        // switch holds no flow of the previous owner to settle.
                        let (from, settled_ms) = st.moving[p]
                            .map_or((from, now_ms + SETTLE.as_millis() as u64), |m| {
                                (m.from, m.settled_ms)
                            });
                        st.moving[p] = Some(Move {
                            from,
                            until_ms: now_ms + transition.as_millis() as u64,
                            settled_ms,
                        });
                        st.moves_total += 1;
                    }
                    st.owner[p] = Some(to);
                    changed.push(p);
                }
            }
            // A partition that moved again as its transition ended keeps its moving rule.
            ended.retain(|&p| st.moving[p].is_none());
            let rebuild = st.sig != sig || st.topo_generation != generation;
            st.sig = sig;
            st.topo_generation = generation;
            let (bits, all) = (st.bits, st.owner.len());
            if ended.is_empty() && changed.is_empty() && !rebuild {
                continue;
            }
            let Some(vip) = self.services[si].cfg.vip else {
                continue;
            };
            let port = self.services[si].cfg.port;
            let dpids: Vec<Dpid> = self.switch_ids().collect();
            for &d in &dpids {
                let mut v = Vec::new();
                if rebuild {
                    for p in 0..all {
                        self.partition_rules(d, si, p, &mut v);
                    }
                } else {
                    for &p in &changed {
                        self.partition_rules(d, si, p, &mut v);
                    }
                }
                for &p in &ended {
                    v.push(moving_delete(partition_match(vip, port, p, bits)));
                }
                for m in v {
                    out.push(d, m);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::AdminState;
    use crate::testkit::sim::{self, ACK, FIN, SYN, Sim, VIP, VMAC, client_segment, ip, mac};

    fn a(n: u8) -> Ipv4Addr {
        Ipv4Addr::new(10, 0, 0, n)
    }

    #[test]
    fn partitions_split_client_ports_on_bits_one_and_up() {
        // Even ports in sequence (Linux connect()) visit every partition in turn.
        let seen: Vec<usize> = (0..8u16).map(|i| partition_of(40_000 + 2 * i, 3)).collect();
        let mut sorted = seen.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..8).collect::<Vec<_>>(), "{seen:?}");
        assert_eq!(partition_of(40_000, 3), partition_of(40_001, 3));
        assert_eq!(port_mask(6), 0x7e);
    }

    #[test]
    fn apportion_gives_every_partition_by_largest_remainder() {
        assert_eq!(apportion(64, &[1, 1, 1]), vec![22, 21, 21]);
        assert_eq!(apportion(8, &[3, 4, 1]), vec![3, 4, 1]);
        assert_eq!(apportion(64, &[0, 50, 50]), vec![0, 32, 32]);
        assert_eq!(apportion(16, &[0, 0]), vec![0, 0]);
        for w in [[7u16, 0, 3], [1, 99, 0], [33, 33, 34]] {
            assert_eq!(apportion(64, &w).iter().sum::<usize>(), 64, "{w:?}");
        }
    }

    #[test]
    fn rebalance_moves_only_what_the_new_counts_need() {
        let backends = [a(2), a(3), a(4)];
        let owner: Vec<Option<Ipv4Addr>> = (0..12).map(|p| Some(backends[p % 3])).collect();
        let moving = vec![None; 12];
        // 4/4/4 to 6/3/3: two partitions move, both to the first backend.
        let moves = rebalance(&owner, &moving, &backends, &[6, 3, 3]);
        assert_eq!(moves.len(), 2, "{moves:?}");
        assert!(
            moves
                .iter()
                .all(|&(p, to)| to == a(2) && owner[p] != Some(a(2)))
        );
        // A backend that can take nothing gives up all its partitions, moving or not.
        let mut moving = vec![None; 12];
        moving[1] = Some(Move {
            from: a(4),
            until_ms: 10,
            settled_ms: 5,
        });
        let moves = rebalance(&owner, &moving, &backends, &[6, 0, 6]);
        let from_b: Vec<usize> = (0..12).filter(|&p| owner[p] == Some(a(3))).collect();
        let moved: Vec<usize> = moves.iter().map(|&(p, _)| p).collect();
        assert_eq!(moved, from_b);
        // Unowned partitions are placed first.
        let none = vec![None; 4];
        let moves = rebalance(&none, &[None; 4], &backends, &[2, 1, 1]);
        assert_eq!(moves, vec![(0, a(2)), (1, a(2)), (2, a(3)), (3, a(4))]);
        // Counts already right: nothing moves.
        assert!(rebalance(&owner, &[None; 12], &backends, &[4, 4, 4]).is_empty());
    }

    /// One switch, client h1 on port 1, backends h2..h4 (holding the VIP) on ports 2..4;
    /// 8 partitions, transitions of 2 s.
    fn partitioned() -> Sim {
        partitioned_with("round-robin", 3)
    }

    fn partitioned_config(algorithm: &str, bits: u8) -> String {
        let mut c = format!(
            "[[service]]\nname = \"web\"\nvip = \"{VIP}\"\nport = 80\nalgorithm = \"{algorithm}\"\nmode = \"partitioned\"\npartition_bits = {bits}\ntransition_secs = 2\n[service.health]\nkind = \"none\"\n"
        );
        for b in 2..=4 {
            c += &format!("[[service.backend]]\naddress = \"{}\"\n", ip(b));
        }
        c
    }

    fn partitioned_with(algorithm: &str, bits: u8) -> Sim {
        let hosts = [("h1", 1, 1), ("h2", 1, 2), ("h3", 1, 3), ("h4", 1, 4)];
        let mut sim = Sim::new(&partitioned_config(algorithm, bits), &[(1, 4)], &[], &hosts);
        for i in 1..=4u8 {
            sim.send(&format!("h{i}"), &sim::arp_request(i, ip(9)));
        }
        sim.tick(Duration::from_millis(10));
        sim
    }

    /// Where a segment from h1's `port` to the VIP ends up, and whether it went to the
    /// controller.
    fn send(sim: &mut Sim, port: u16, flags: u8) -> (String, bool) {
        let before = sim.packet_ins;
        let got = sim.send(
            "h1",
            &sim::tcp(mac(1), VMAC, (ip(1), port), (VIP, 80), flags),
        );
        assert_eq!(got.len(), 1, "one backend gets it: {got:?}");
        let (who, seen) = &got[0];
        let b: u8 = who[1..].parse().expect("a host");
        assert_eq!(seen.ipv4_dst, Some(VIP), "direct return: the VIP is kept");
        assert_eq!(seen.eth_dst, mac(b));
        (who.clone(), sim.packet_ins != before)
    }

    #[test]
    fn partitions_carry_new_connections_without_the_controller() {
        let mut sim = partitioned();
        let mut per = std::collections::BTreeMap::new();
        for i in 0..8u16 {
            let (who, asked) = send(&mut sim, 40_000 + 2 * i, SYN);
            assert!(!asked, "port {}: no PACKET_IN", 40_000 + 2 * i);
            *per.entry(who).or_insert(0) += 1;
        }
        // Round robin: 8 partitions over three backends, 3/3/2.
        let mut counts: Vec<i32> = per.values().copied().collect();
        counts.sort_unstable();
        assert_eq!(counts, [2, 3, 3], "{per:?}");
        // The backend answers from the VIP, straight to the client: plain L2.
        let before = sim.packet_ins;
        let got = sim.send(
            "h2",
            &sim::tcp(mac(2), mac(1), (VIP, 80), (ip(1), 40_000), ACK),
        );
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].0.as_str(), got[0].1.ipv4_src), ("h1", Some(VIP)));
        assert_eq!(sim.packet_ins, before);
    }

    #[test]
    fn partitions_stay_put_while_the_load_does_not_change() {
        // Found on OVS: with least connections, 16 partitions moved about once a second
        // with no traffic at all (its weights flip by a pick between refreshes), and under
        // load the connections placed during transitions steered the weights into moving
        // every partition, again and again.
        for (algorithm, bits) in [
            ("least-connections", 4),
            ("least-connections", 6),
            ("p2c", 4),
        ] {
            let mut sim = partitioned_with(algorithm, bits);
            let placed = sim.c.partition_view(0).expect("partitioned");
            assert_eq!(placed.owned.iter().sum::<usize>(), 1 << bits);
            assert!(
                placed.owned.iter().all(|&n| n > 0),
                "{algorithm}: {placed:?}"
            );
            // Connections through moving partitions, then 20 s of refreshes.
            for i in 0..40u16 {
                send(&mut sim, 41_000 + 2 * i, SYN);
            }
            for _ in 0..2_000 {
                sim.tick(Duration::from_millis(10));
            }
            let view = sim.c.partition_view(0).expect("partitioned");
            assert_eq!(view.moves_total, 0, "{algorithm}, {bits} bits: {view:?}");
        }
    }

    #[test]
    fn a_backends_answer_from_the_vip_teaches_nothing_about_the_vip() {
        let mut sim = partitioned();
        // A direct-return answer that misses every rule comes up to the controller.
        sim.packet_in(
            1,
            2,
            sim::tcp(mac(2), mac(9), (VIP, 80), (ip(1), 40_000), ACK),
        );
        assert_eq!(sim.c.topo.mac_of(VIP), None);
        sim.tick(Duration::from_millis(10));
        let (_, asked) = send(&mut sim, 40_002, SYN);
        assert!(!asked, "the partition rules stay");
    }

    #[test]
    fn a_drained_backend_keeps_its_connections_while_its_partitions_move() {
        let mut sim = partitioned();
        // One live connection in every partition.
        let owners: Vec<String> = (0..8u16)
            .map(|i| send(&mut sim, 40_000 + 2 * i, SYN).0)
            .collect();
        let drained = owners[0].clone();
        let b: usize = drained[1..].parse::<usize>().unwrap() - 2;
        assert!(sim.c.set_admin(sim.now, 0, b, AdminState::Draining));
        sim.tick(Duration::from_millis(10));
        let moved: Vec<usize> = (0..8).filter(|&p| owners[p] == drained).collect();
        assert!(!moved.is_empty());
        // Past the moves' settling (new connections meanwhile: see below).
        sim.tick(SETTLE);
        for &p in &moved {
            let port = 40_000 + 2 * p as u16;
            // The live connection's next segment goes up once, and stays with its backend.
            let (who, asked) = send(&mut sim, port, ACK);
            assert_eq!(
                (who.as_str(), asked),
                (drained.as_str(), true),
                "partition {p}"
            );
            let (who, asked) = send(&mut sim, port, ACK);
            assert_eq!(
                (who.as_str(), asked),
                (drained.as_str(), false),
                "its own rule now"
            );
            // A new connection in the same partition (same bits 1..=3) avoids the drained
            // backend, placed by the controller for the transition.
            let (who, asked) = send(&mut sim, port + 16, SYN);
            assert!(asked && who != drained, "partition {p}: {who}");
        }
        // Partitions that did not move still need no controller.
        for p in (0..8).filter(|p| !moved.contains(p)) {
            let (who, asked) = send(&mut sim, 40_000 + 2 * p as u16, ACK);
            assert_eq!((who.as_str(), asked), (owners[p].as_str(), false));
        }
        // After the transition the moved partitions are the switch's again.
        sim.tick(Duration::from_millis(2_100));
        for &p in &moved {
            let (who, asked) = send(&mut sim, 40_000 + 2 * p as u16 + 32, SYN);
            assert!(!asked && who != drained, "partition {p}: {who}");
            // The connection kept through the transition still reaches its backend.
            let (who, _) = send(&mut sim, 40_000 + 2 * p as u16, ACK);
            assert_eq!(who, drained);
        }
        let st = sim.c.partitions.services[0].as_ref().expect("partitioned");
        assert_eq!(st.moves_total, moved.len() as u64);
        assert!(st.moving.iter().all(Option::is_none));
    }

    /// A restarted controller knows neither the partitions' owners nor why they are where
    /// they are (here a drain it has forgotten): it takes them from the switch's partition
    /// rules, so the connections those rules carry keep their backends.
    #[test]
    fn a_restarted_controller_takes_the_partitions_owners_from_the_switch() {
        let mut sim = partitioned();
        let before = drain_partition_0(&mut sim);
        sim.tick(Duration::from_millis(2_100));
        // A live connection in every partition, placed by the switch's rules alone.
        let owners: Vec<String> = (0..8u16)
            .map(|i| {
                let (who, asked) = send(&mut sim, 42_000 + 2 * i, SYN);
                assert!(!asked);
                who
            })
            .collect();
        assert_ne!(owners, before, "the drain moved partitions");
        sim.restart(&partitioned_config("round-robin", 3));
        // The controller locates the backends, one a while before the others (what their
        // partitions must not be given to meanwhile); the client speaks too.
        for i in 0..400 {
            if i == 0 || i == 50 {
                let hosts: &[u8] = if i == 0 { &[1, 2] } else { &[3, 4] };
                for &h in hosts {
                    sim.send(&format!("h{h}"), &sim::arp_request(h, ip(9)));
                }
            }
            sim.tick(Duration::from_millis(10));
            for (p, owner) in owners.iter().enumerate() {
                let (who, _) = send(&mut sim, 42_000 + 2 * p as u16, ACK);
                assert_eq!(&who, owner, "partition {p}'s connection, tick {i}");
            }
        }
        // Every partition has its owner.
        let view = sim.c.partition_view(0).expect("partitioned");
        assert_eq!(view.owned.iter().sum::<usize>(), 8, "{view:?}");
    }

    /// The partition rules switch 1 holds: (priority, client-port mask) of each.
    fn partition_rules_held(sim: &Sim) -> Vec<(u16, u16)> {
        sim.net
            .switch(1)
            .expect("switch 1")
            .flows()
            .filter(|f| cookie::kind_of(f.cookie) == Some(RuleKind::Partition))
            .map(|f| {
                let r = Reported::of(1, f.priority, &f.match_, &f.instructions).expect("ours");
                (r.priority, r.mask)
            })
            .collect()
    }

    #[test]
    fn partition_rules_no_service_would_write_go_when_the_grace_ends() {
        let mut sim = partitioned();
        assert_eq!(
            partition_rules_held(&sim),
            [(PRIO_PARTITION, port_mask(3)); 8]
        );
        // Restarted with 16 partitions instead of 8: the 8 old rules stay through the
        // grace, beside the new ones, then go.
        sim.restart(&partitioned_config("round-robin", 4));
        for h in 1..=4u8 {
            sim.send(&format!("h{h}"), &sim::arp_request(h, ip(9)));
        }
        sim.tick(Duration::from_millis(10));
        let held = partition_rules_held(&sim);
        assert_eq!(held.len(), 8 + 16, "{held:?}");
        sim.tick(sim.c.config().reconnect_grace);
        assert_eq!(
            partition_rules_held(&sim),
            [(PRIO_PARTITION, port_mask(4)); 16]
        );
        assert!(sim.c.partitions.reported.is_empty());
    }

    /// A SYN from h1's `port` with its own ISN (`sim::tcp` always sends 1000).
    fn syn_with_isn(port: u16, isn: u32) -> ofp::Bytes {
        client_segment(port, isn, 0, SYN)
    }

    /// The idle timeout of the forward (accounting) rule of h1's connection from `port`.
    fn forward_idle(sim: &Sim, port: u16) -> Option<u16> {
        sim.net
            .switch(1)
            .expect("switch 1")
            .flows()
            .find(|e| {
                cookie::kind_of(e.cookie) == Some(RuleKind::Conn)
                    && e.cookie & cookie::conn::ACCOUNTING != 0
                    && e.match_.iter().any(|o| *o == Oxm::TcpSrc(port))
            })
            .map(|e| e.idle_timeout)
    }

    /// Drains partition 0's owner; returns the owners of partitions 0..8 from before.
    fn drain_partition_0(sim: &mut Sim) -> Vec<String> {
        let owners: Vec<String> = (0..8u16)
            .map(|i| send(sim, 40_000 + 2 * i, SYN).0)
            .collect();
        let b = owners[0][1..].parse::<usize>().expect("a host") - 2;
        assert!(sim.c.set_admin(sim.now, 0, b, AdminState::Draining));
        sim.tick(Duration::from_millis(10));
        owners
    }

    #[test]
    fn a_syn_stays_off_the_new_owner_while_the_move_settles() {
        // Found on OVS: a SYN that came up in the first tens of milliseconds of a move went
        // to the new owner; the client's ACK, 10 µs after the SYN-ACK, followed the flow
        // Open vSwitch had cached from the old partition rule to the old owner, which
        // reset it. The fake switch has no such cache: this checks the decisions.
        let mut sim = partitioned();
        let owners = drain_partition_0(&mut sim);
        // The old owner is drained: the SYN is held, and its retransmission once the move
        // has settled goes to the new owner.
        let before = sim.packet_ins;
        let got = sim.send("h1", &syn_with_isn(40_016, 7));
        assert!(got.is_empty() && sim.packet_ins > before, "{got:?}");
        let key = crate::conntrack::ConnKey {
            client: ip(1),
            client_port: 40_016,
            service_addr: VIP,
            service_port: 80,
        };
        assert!(
            sim.c.conns.get(&key).is_none(),
            "nothing is kept of a held SYN"
        );
        sim.tick(SETTLE);
        let got = sim.send("h1", &syn_with_isn(40_016, 7));
        let got: Vec<&str> = got.iter().map(|(h, _)| h.as_str()).collect();
        assert!(got.len() == 1 && got[0] != owners[0], "{got:?}");
        // Back to the drained backend, which can take connections again: while that move
        // settles, a SYN goes where the switch may still send the rest of its connection.
        sim.tick(Duration::from_millis(2_100));
        let b = owners[0][1..].parse::<usize>().expect("a host") - 2;
        assert!(sim.c.set_admin(sim.now, 0, b, AdminState::Active));
        sim.tick(Duration::from_millis(10));
        let back: Vec<usize> = (0..8)
            .filter(|&p| {
                let st = sim.c.partitions.services[0].as_ref().expect("partitioned");
                st.moving[p].is_some()
            })
            .collect();
        assert!(!back.is_empty());
        for &p in &back {
            let st = sim.c.partitions.services[0].as_ref().expect("partitioned");
            let from = st.moving[p].expect("moving").from;
            let to = st.owner[p].expect("an owner");
            assert_ne!(from, to);
            let (who, asked) = send(&mut sim, 40_032 + 2 * p as u16, SYN);
            assert_eq!((who, asked), (format!("h{}", from.octets()[3]), true));
        }
        sim.tick(SETTLE);
        for &p in &back {
            let st = sim.c.partitions.services[0].as_ref().expect("partitioned");
            let to = st.owner[p].expect("an owner");
            let (who, asked) = send(&mut sim, 40_048 + 2 * p as u16, SYN);
            assert_eq!((who, asked), (format!("h{}", to.octets()[3]), true));
        }
        // Once the moves are over, the next connection on the 4-tuple of one placed while
        // they settled goes to the partition's owner (its SYN comes up by the connection's
        // rules): not at once, since until the switch has caught up the old backend may
        // get its ACK by the old rule, or the owner by the partition's.
        sim.tick(Duration::from_millis(2_000));
        for &p in &back {
            let st = sim.c.partitions.services[0].as_ref().expect("partitioned");
            let to = format!("h{}", st.owner[p].expect("an owner").octets()[3]);
            let port = 40_032 + 2 * p as u16;
            let got = sim.send("h1", &syn_with_isn(port, 9));
            assert!(got.is_empty(), "port {port}: {got:?}");
            let got = sim.send("h1", &syn_with_isn(port, 9));
            let got: Vec<&str> = got.iter().map(|(h, _)| h.as_str()).collect();
            assert_eq!(got, [to.as_str()], "port {port}");
            let (who, _) = send(&mut sim, port, ACK);
            assert_eq!(who, to, "port {port}");
        }
    }

    #[test]
    fn a_syn_at_the_controller_goes_where_its_partitions_rule_still_sends() {
        // Found on OVS: just after a drain, before the refresh that moves the drained
        // backend's partitions, a SYN that came up by an earlier connection's rules went to
        // the balancer's pick; its ACK followed the partition's rule to the drained owner,
        // which reset it.
        let mut sim = partitioned();
        let owners: Vec<String> = (0..8u16)
            .map(|i| send(&mut sim, 40_000 + 2 * i, SYN).0)
            .collect();
        let b = owners[0][1..].parse::<usize>().expect("a host") - 2;
        assert!(sim.c.set_admin(sim.now, 0, b, AdminState::Draining));
        // No refresh yet: partition 0's rule still names its owner...
        let (who, asked) = send(&mut sim, 40_016, SYN);
        assert_eq!((who.as_str(), asked), (owners[0].as_str(), false));
        // ...and so does the controller for a SYN of it that comes up.
        sim.received.clear();
        sim.packet_in(1, 1, syn_with_isn(40_032, 3));
        let got: Vec<&str> = sim.received.iter().map(|(h, _)| h.as_str()).collect();
        assert_eq!(got, [owners[0].as_str()]);
    }

    #[test]
    fn a_fin_that_went_by_the_controller_shortens_its_connections_rule() {
        // Found on OVS (`ovs_partitioned_partitions_settle_under_load`): a connection the
        // controller placed during a transition can live its whole life through Open
        // vSwitch's cached flow to the controller, FIN included; its rule never saw the
        // FIN and stayed for its whole idle timeout (n_packets=0 after 7 s in dump-flows).
        let mut sim = partitioned();
        let owners = drain_partition_0(&mut sim);
        sim.tick(SETTLE);
        let port = 40_000 + 16;
        let (placed_on, asked) = send(&mut sim, port, SYN);
        assert!(asked && placed_on != owners[0], "{placed_on}");
        assert_eq!(forward_idle(&sim, port), Some(30));
        sim.received.clear();
        sim.packet_in(
            1,
            1,
            sim::tcp(mac(1), VMAC, (ip(1), port), (VIP, 80), ACK | FIN),
        );
        let got: Vec<&str> = sim.received.iter().map(|(h, _)| h.as_str()).collect();
        assert_eq!(got, [placed_on.as_str()]);
        // What the rule's fin_timeout would have made of it had it seen the FIN.
        assert_eq!(forward_idle(&sim, port), Some(1));
        // A connection adopted on its FIN (its rule will not see that one either).
        let (who, asked) = send(&mut sim, 40_000, ACK | FIN);
        assert_eq!((who.as_str(), asked), (owners[0].as_str(), true));
        assert_eq!(forward_idle(&sim, 40_000), Some(1));
    }

    #[test]
    fn a_syn_on_the_4_tuple_of_a_connection_rule_is_decided_by_the_controller() {
        // Found on OVS (client ports reused within 1.3 s): a connection adopted on its
        // last ACK (its FIN had gone by the partition's rule) kept a rule to the old owner
        // for its idle timeout. The next connection on the port sent its SYN by the
        // partition's rule to the new owner, and its ACK by that rule to the old one, in
        // TIME_WAIT: a 5 s timeout.
        let mut sim = partitioned();
        let owners = drain_partition_0(&mut sim);
        // Two connections of partition 0, adopted (the balancer, round robin, would give
        // their successors one backend each).
        let ports = [40_000, 40_016];
        for port in ports {
            let (who, asked) = send(&mut sim, port, ACK);
            assert_eq!((who.as_str(), asked), (owners[0].as_str(), true));
        }
        // The transition ends; the adopted connections' rules stay.
        sim.tick(Duration::from_millis(2_100));
        let st = sim.c.partitions.services[0].as_ref().expect("partitioned");
        let owner = st.owner[0].expect("partition 0 has an owner");
        let owner = format!("h{}", owner.octets()[3]);
        assert_ne!(owner, owners[0]);
        for port in ports {
            assert_eq!(forward_idle(&sim, port), Some(30));
            // The new connection's SYN comes up: a new connection on the 4-tuple, for the
            // partition's owner (the old backend is drained), whose next SYNs go there by
            // the partition's rule. The rules change backend, so the SYN is held; its
            // retransmission comes up too, and goes on.
            let before = sim.packet_ins;
            let got = sim.send("h1", &syn_with_isn(port, 5_000));
            assert!(got.is_empty() && sim.packet_ins > before, "{got:?}");
            let got = sim.send("h1", &syn_with_isn(port, 5_000));
            let got: Vec<&str> = got.iter().map(|(h, _)| h.as_str()).collect();
            assert_eq!(got, [owner.as_str()], "port {port}");
            let (who, _) = send(&mut sim, port, ACK);
            assert_eq!(
                who, owner,
                "port {port}: the handshake's ACK follows its SYN"
            );
        }
    }

    /// Whether `msgs` hold a delete of every partition rule.
    fn deletes_partition_rules(msgs: &[(u64, ofp::Message)]) -> bool {
        msgs.iter().any(|(_, m)| {
            matches!(m, ofp::Message::FlowMod(fm)
                if fm.command == ofp::FlowModCommand::Delete
                    && fm.cookie == RuleKind::Partition.base()
                    && fm.cookie_mask == cookie::KIND_MASK)
        })
    }

    #[test]
    fn a_reload_deletes_partition_rules_only_when_some_would_be_stale() {
        let mut sim = partitioned();
        let cfg = |bits: u8| {
            format!(
                "[[service]]\nname = \"web\"\nvip = \"{VIP}\"\nport = 80\nalgorithm = \"round-robin\"\nmode = \"partitioned\"\npartition_bits = {bits}\ntransition_secs = 2\n[service.health]\nkind = \"none\"\n[[service.backend]]\naddress = \"{}\"\n[[service.backend]]\naddress = \"{}\"\n",
                ip(2),
                ip(3)
            )
        };
        let reload = |sim: &mut Sim, text: &str| {
            let c = crate::config::Config::from_toml(text, &|_| None).expect("valid");
            sim.c.reload(sim.now, &c, &mut sim.out);
            let msgs: Vec<(u64, ofp::Message)> = sim.out.drain().collect();
            deletes_partition_rules(&msgs)
        };
        // Same VIP, port and partitions (a backend fewer): the rules are replaced in place.
        assert!(!reload(&mut sim, &cfg(3)));
        // Another partition count: the old partitions' rules would stay behind.
        assert!(reload(&mut sim, &cfg(4)));
        // The service is reactive now: its partition rules go.
        let reactive = cfg(4).replace(
            "mode = \"partitioned\"\npartition_bits = 4\ntransition_secs = 2\n",
            "",
        );
        assert!(reload(&mut sim, &reactive));
    }

    #[test]
    fn config_checks_partition_keys() {
        use crate::config::Config;
        let base = format!("[[service]]\nname = \"web\"\nvip = \"{VIP}\"\nport = 80\n");
        let backend = "[[service.backend]]\naddress = \"10.0.0.2\"\n";
        let e = Config::from_toml(
            &format!(
                "{base}mode = \"partitioned\"\npartition_bits = 9\ntransition_secs = 0\n{backend}"
            ),
            &|_| None,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("service[0].partition_bits") && e.contains("service[0].transition_secs"),
            "{e}"
        );
        let e = Config::from_toml(&format!("{base}partition_bits = 4\n{backend}"), &|_| None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("only a mode = \"partitioned\""), "{e}");
        let e = Config::from_toml(
            &format!("{base}mode = \"partitioned\"\nalgorithm = \"isslm\"\nthreshold_rps = 5.0\n{backend}"),
            &|_| None,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("\"partitioned\" cannot run algorithm"), "{e}");
        let cfg = Config::from_toml(&format!("{base}mode = \"partitioned\"\n{backend}"), &|_| {
            None
        })
        .expect("valid");
        assert_eq!(
            cfg.services[0].partitions,
            crate::config::PartitionConfig::default()
        );
    }
}
