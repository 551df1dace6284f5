//! The network as the controller knows it: switches and their ports, the links between
//! switches (found by LLDP), where each host is, and the paths derived from them.
//!
//! Paths are shortest paths (BFS over switch hops, ties broken by the lower datapath id so
//! every run derives the same paths), and flooding follows one spanning tree, so a
//! broadcast never loops whatever the wiring.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use ahash::RandomState;
use flowgate_packet::MacAddr;
use smallvec::SmallVec;

/// An OpenFlow datapath id.
pub type Dpid = u64;

/// One port of one switch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PortRef {
    pub dpid: Dpid,
    pub port: u32,
}

impl PortRef {
    pub const fn new(dpid: Dpid, port: u32) -> Self {
        PortRef { dpid, port }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortInfo {
    pub name: String,
    pub hw_addr: MacAddr,
    pub up: bool,
}

#[derive(Debug, Clone, Default)]
pub struct SwitchInfo {
    pub ports: BTreeMap<u32, PortInfo>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostInfo {
    pub at: PortRef,
    /// The address it last claimed (see [`Topology::learn_address`]).
    pub ip: Option<Ipv4Addr>,
    /// When a frame of its own last came up to the controller.
    pub last_seen: Instant,
    /// ARP probes sent to it since then (see `Controller::age_hosts`).
    pub probes: u8,
    /// How many addresses map to it in the address table.
    addresses: u32,
}

/// A host's MAC address by number, as a connection keeps it (4 bytes, not 6: the table
/// holds one per live connection). It is the MAC its client's packets came from: the
/// client's own, or the router's for clients behind one, which is why a connection keeps
/// it rather than the controller learning each client address's MAC (one entry per
/// client address ever seen, never forgotten, and a map whose growths stalled the
/// PACKET_IN path: 22 ms at a million clients).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MacId(u32);

impl MacId {
    /// Not known: a connection rebuilt from a switch's rules, whose packets were never seen.
    pub const UNKNOWN: MacId = MacId(u32::MAX);
}

/// The most MACs numbered (bounding the numbering under a flood of forged source MACs):
/// past it, new ones are [`MacId::UNKNOWN`], and their connections are placed only if
/// ARP taught the client address's MAC (refused otherwise, as unroutable).
const MAX_MAC_IDS: usize = 1 << 20;

/// Forgotten hosts remembered, for telling a host that moved from one that is new.
const MAX_FORGOTTEN: usize = 4096;

/// The most ports recorded per switch, so that a switch's PORT_STATUS and PORT_DESC
/// messages cannot grow its table (and its LLDP, one probe per up port) without bound.
/// Far above a real switch's few hundred; new ports beyond it are refused.
pub const MAX_PORTS_PER_SWITCH: usize = 4096;

/// What learning a host's source address changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostChange {
    /// Seen for the first time.
    New,
    /// Seen at a different port than before.
    Moved,
    /// Nothing new about its location (its IP may have been recorded).
    Same,
    /// Seen for the first time with the host table full (`max_hosts`): not learned.
    Refused,
    /// Seen for the first time at a port that has `max_hosts_per_port` hosts already:
    /// not learned.
    PortFull,
}

impl HostChange {
    /// Whether the host's location changed (it needs its L2 rules).
    pub fn placed(self) -> bool {
        matches!(self, HostChange::New | HostChange::Moved)
    }

    /// Whether the host is in the table after it (known before, or learned now).
    pub fn known(self) -> bool {
        matches!(self, HostChange::New | HostChange::Moved | HostChange::Same)
    }
}

/// What learning that a known host claims an address changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressChange {
    /// The address maps to this host now (it was unknown, or another host's).
    Learned,
    /// It mapped to this host already.
    Same,
    /// Not learned: the address table is full (`max_hosts`).
    Refused,
    /// Not learned: the host's port has `max_hosts_per_port` addresses already.
    PortFull,
    /// Not learned: the host is not in the table, or the address is 0.0.0.0.
    Ignored,
}

/// What one port holds of the host table.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PortShare {
    pub hosts: u32,
    /// The addresses of those hosts.
    pub addresses: u32,
}

/// Switches, links and hosts as discovered.
///
/// Its maps are looked up several times per PACKET_IN (the sender's host entry, its port,
/// the path): keyed ahash, not std's SipHash (2-3 % of the controller's CPU).
#[derive(Debug, Default)]
pub struct Topology {
    switches: BTreeMap<Dpid, SwitchInfo>,
    /// Both ends of every link, each mapping to the other end and when it was last seen.
    links: HashMap<PortRef, (PortRef, Instant), RandomState>,
    hosts: HashMap<MacAddr, HostInfo, RandomState>,
    /// Learned from ARP, and from the IPv4 packets of backends (see `learn_host`).
    mac_by_ip: HashMap<Ipv4Addr, MacAddr, RandomState>,
    /// Every MAC numbered by [`Topology::mac_id`], and its number. Never shrinks: a
    /// connection may hold any number until it ends (bounded by `MAX_MAC_IDS`).
    mac_ids: HashMap<MacAddr, MacId, RandomState>,
    macs: Vec<MacAddr>,
    /// `(from, to) ->` the ports of `from` leading one hop closer to `to`: every one of a
    /// shortest path (equal cost), the first the one the L2 rules use.
    next_hop: HopMap,
    /// The next hops before the first change of the links since they were last taken
    /// (see [`Topology::take_next_hops_before`]).
    next_hop_before: Option<HopMap>,
    /// Hosts forgotten because their port or switch went, and where they were (the last
    /// `MAX_FORGOTTEN` or fewer): one that turns up at another port has moved.
    forgotten: HashMap<MacAddr, PortRef, RandomState>,
    /// Link ports on the flooding spanning tree.
    tree_ports: BTreeSet<PortRef>,
    /// Bumped whenever paths may have changed, so derived rules can be recomputed.
    generation: u64,
    /// The most hosts (and addresses in `mac_by_ip`) kept; `None`: no bound. Each host
    /// costs an entry here and an L2 rule on every switch, and forged source MACs cost
    /// nothing to send.
    max_hosts: Option<usize>,
    /// The most hosts learned at one port (`None`: no bound), so that one port sending
    /// forged source MACs cannot fill the table for every other (forged MACs with no
    /// address never age, `controller::ageing`). A host that moves is not refused:
    /// a move adds no entry.
    max_hosts_per_port: Option<u32>,
    /// A port the per-port bound does not apply to: a domain's uplink, behind which the
    /// other domains' hosts are seen.
    unbounded_port: Option<PortRef>,
    /// The hosts and addresses learned at each port that has any.
    share_at: HashMap<PortRef, PortShare, RandomState>,
}

/// One host, with its `addresses`, fewer at `at`.
fn count_out(share_at: &mut HashMap<PortRef, PortShare, RandomState>, at: PortRef, addresses: u32) {
    if let Some(n) = share_at.get_mut(&at) {
        n.hosts = n.hosts.saturating_sub(1);
        n.addresses = n.addresses.saturating_sub(addresses);
        if n.hosts == 0 {
            share_at.remove(&at);
        }
    }
}

/// The equal-cost next hops toward each switch (see `Topology::next_hop`).
type HopMap = HashMap<(Dpid, Dpid), SmallVec<[u32; 4]>, RandomState>;

/// [`Topology::egress_toward`] by the next hops `next_hop`: with `flow`, the next hop of
/// that flow among the equal-cost ones ([`pick_hop`]); without, the first.
fn egress_with(next_hop: &HopMap, dpid: Dpid, dst: PortRef, flow: Option<u64>) -> Option<u32> {
    if dpid == dst.dpid {
        return Some(dst.port);
    }
    let hops = next_hop.get(&(dpid, dst.dpid))?;
    match flow {
        Some(f) if hops.len() > 1 => pick_hop(hops, f, dpid),
        _ => hops.first().copied(),
    }
}

/// The next hop of flow `flow` at switch `dpid` among equal-cost `hops`, by rendezvous
/// (highest random weight) hashing, as ECMP spreads flows: each flow keeps its hop while
/// hops come and go, but for the flows of a hop that went, and the share a new hop takes
/// (a modulo over the hops would move most flows whenever their number changed, and with
/// them their rules).
fn pick_hop(hops: &[u32], flow: u64, dpid: Dpid) -> Option<u32> {
    hops.iter()
        .copied()
        .max_by_key(|&port| mix64(flow ^ mix64(dpid) ^ u64::from(port).rotate_left(32)))
}

/// SplitMix64's finalizer: every input bit moves every output bit.
pub fn mix64(mut x: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// What the earlier next hops made of a path ([`Topology::path_before`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EarlierPath {
    /// A path, in the `out` vector.
    Found,
    /// They had no route (the links were not known yet, as when the controller starts,
    /// or the switches were apart).
    NoRoute,
    /// It crossed a link that is gone now.
    LinkGone,
}

/// Next hops of an earlier state of the links (see [`Topology::take_next_hops_before`]).
#[derive(Debug, Default)]
pub struct NextHops(HopMap);

impl Topology {
    pub fn new() -> Self {
        Self::default()
    }

    /// A topology that learns at most `max_hosts` hosts, and at most `per_port` of
    /// them at any one port.
    pub fn with_host_bounds(max_hosts: usize, per_port: u32) -> Self {
        Self {
            max_hosts: Some(max_hosts),
            max_hosts_per_port: Some(per_port),
            ..Self::default()
        }
    }

    /// New bounds (a reload). Hosts already learned beyond them stay until they go (a
    /// port, a switch, ageing): the bounds refuse new ones, they evict no one.
    pub fn set_host_bounds(&mut self, max_hosts: usize, per_port: u32) {
        self.max_hosts = Some(max_hosts);
        self.max_hosts_per_port = Some(per_port);
    }

    /// Learn any number of hosts at `port` (within the table's bound): a domain's
    /// uplink, where the hosts of every other domain are seen.
    pub fn unbound_port(&mut self, port: PortRef) {
        self.unbounded_port = Some(port);
    }

    fn full(&self, n: usize) -> bool {
        self.max_hosts.is_some_and(|m| n >= m)
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    pub fn switches(&self) -> impl Iterator<Item = (&Dpid, &SwitchInfo)> {
        self.switches.iter()
    }

    pub fn switch(&self, dpid: Dpid) -> Option<&SwitchInfo> {
        self.switches.get(&dpid)
    }

    pub fn has_switch(&self, dpid: Dpid) -> bool {
        self.switches.contains_key(&dpid)
    }

    /// A switch joined (or rejoined): record it with no ports yet.
    pub fn add_switch(&mut self, dpid: Dpid) {
        self.switches.entry(dpid).or_default();
        self.recompute();
    }

    /// A switch left: forget it, its links and the hosts behind it.
    pub fn remove_switch(&mut self, dpid: Dpid) {
        self.switches.remove(&dpid);
        self.links
            .retain(|a, (b, _)| a.dpid != dpid && b.dpid != dpid);
        self.forget_hosts_where(|at| at.dpid == dpid);
        self.recompute();
    }

    /// Record or update one port. A port that goes down takes its link and hosts with it.
    /// Returns false, recording nothing, for a new port of a switch that has
    /// [`MAX_PORTS_PER_SWITCH`] already.
    pub fn set_port(&mut self, dpid: Dpid, port: u32, info: PortInfo) -> bool {
        let up = info.up;
        let mut recorded = true;
        if let Some(sw) = self.switches.get_mut(&dpid) {
            let full = sw.ports.len() >= MAX_PORTS_PER_SWITCH;
            match sw.ports.entry(port) {
                Entry::Occupied(mut e) => {
                    e.insert(info);
                }
                Entry::Vacant(e) if !full => {
                    e.insert(info);
                }
                Entry::Vacant(_) => recorded = false,
            }
        }
        if !up {
            self.port_gone(PortRef::new(dpid, port));
        }
        recorded
    }

    pub fn remove_port(&mut self, dpid: Dpid, port: u32) {
        if let Some(sw) = self.switches.get_mut(&dpid) {
            sw.ports.remove(&port);
        }
        self.port_gone(PortRef::new(dpid, port));
    }

    fn port_gone(&mut self, p: PortRef) {
        let had_link = self
            .links
            .remove(&p)
            .map(|(peer, _)| self.links.remove(&peer));
        self.forget_hosts_where(|at| at == p);
        if had_link.is_some() {
            self.recompute();
        }
    }

    /// An LLDP probe sent out of `from` arrived at `to`. Returns true when the link is new.
    pub fn link_seen(&mut self, now: Instant, from: PortRef, to: PortRef) -> bool {
        if from == to
            || !self.switches.contains_key(&from.dpid)
            || !self.switches.contains_key(&to.dpid)
        {
            return false;
        }
        let new = self.links.get(&to).map(|(peer, _)| *peer) != Some(from);
        self.links.insert(to, (from, now));
        self.links.insert(from, (to, now));
        if new {
            // Hosts "learned" on a port that turns out to be a link were flooded copies.
            self.forget_hosts_where(|at| at == from || at == to);
            self.recompute();
        }
        new
    }

    /// Drop links not seen for `max_age`. Returns true when any was dropped.
    pub fn expire_links(&mut self, now: Instant, max_age: Duration) -> bool {
        let before = self.links.len();
        self.links
            .retain(|_, (_, seen)| now.saturating_duration_since(*seen) <= max_age);
        let changed = self.links.len() != before;
        if changed {
            // Keep the map symmetric: drop half-links whose other half expired.
            let ends: Vec<PortRef> = self.links.keys().copied().collect();
            for a in ends {
                if let Some((b, _)) = self.links.get(&a).copied()
                    && !self.links.contains_key(&b)
                {
                    self.links.remove(&a);
                }
            }
            self.recompute();
        }
        changed
    }

    pub fn is_link_port(&self, p: PortRef) -> bool {
        self.links.contains_key(&p)
    }

    /// Whether a link port is on the flooding spanning tree.
    pub fn is_tree_port(&self, p: PortRef) -> bool {
        self.tree_ports.contains(&p)
    }

    pub fn links(&self) -> impl Iterator<Item = (PortRef, PortRef)> + '_ {
        self.links
            .iter()
            .filter(|(a, (b, _))| a < &b)
            .map(|(a, (b, _))| (*a, *b))
    }

    /// Learn that `mac` sent a packet that entered at `at`.
    /// Packets entering on inter-switch links teach nothing about location.
    pub fn learn_host(&mut self, now: Instant, mac: MacAddr, at: PortRef) -> HostChange {
        if mac.is_multicast()
            || mac == MacAddr::ZERO
            || self.is_link_port(at)
            || !(1..=ofp::port::MAX).contains(&at.port)
        {
            return HostChange::Same;
        }
        // A known host, the common case on the PACKET_IN path: one lookup.
        if let Some(h) = self.hosts.get_mut(&mac) {
            h.last_seen = now;
            h.probes = 0;
            if h.at == at {
                return HostChange::Same;
            }
            let from = std::mem::replace(&mut h.at, at);
            let addresses = h.addresses;
            count_out(&mut self.share_at, from, addresses);
            let share = self.share_at.entry(at).or_default();
            share.hosts += 1;
            share.addresses += addresses;
            return HostChange::Moved;
        }
        if self.full(self.hosts.len()) {
            return HostChange::Refused;
        }
        if self.port_full(at, |s| s.hosts) {
            return HostChange::PortFull;
        }
        self.hosts.insert(
            mac,
            HostInfo {
                at,
                ip: None,
                last_seen: now,
                probes: 0,
                addresses: 0,
            },
        );
        self.share_at.entry(at).or_default().hosts += 1;
        // A host forgotten with its port (unplugged, its switch gone) that comes back
        // elsewhere moved: what was routed to it must follow.
        match self.forgotten.remove(&mac) {
            Some(was) if was != at => HostChange::Moved,
            _ => HostChange::New,
        }
    }

    /// Learn that the known host `mac` claims `ip` (by ARP, or as a backend's source).
    ///
    /// Addresses are bounded as hosts are: `max_hosts` in all, and `max_hosts_per_port`
    /// at the host's port, so that one MAC answering ARP for forged sender addresses
    /// fills its own port's share, not the table a new backend's address must go in.
    pub fn learn_address(&mut self, mac: MacAddr, ip: Ipv4Addr) -> AddressChange {
        let Some(at) = self.hosts.get(&mac).map(|h| h.at) else {
            return AddressChange::Ignored;
        };
        if ip.is_unspecified() {
            return AddressChange::Ignored;
        }
        let before = self.mac_by_ip.get(&ip).copied();
        if before == Some(mac) {
            if let Some(h) = self.hosts.get_mut(&mac) {
                h.ip = Some(ip);
            }
            return AddressChange::Same;
        }
        if before.is_none() && self.full(self.mac_by_ip.len()) {
            return AddressChange::Refused;
        }
        if self.port_full(at, |s| s.addresses) {
            return AddressChange::PortFull;
        }
        if let Some(old) = before.and_then(|m| self.hosts.get_mut(&m)) {
            old.addresses = old.addresses.saturating_sub(1);
            if old.ip == Some(ip) {
                old.ip = None;
            }
            if let Some(s) = self.share_at.get_mut(&old.at) {
                s.addresses = s.addresses.saturating_sub(1);
            }
        }
        self.mac_by_ip.insert(ip, mac);
        if let Some(h) = self.hosts.get_mut(&mac) {
            h.addresses += 1;
            h.ip = Some(ip);
        }
        self.share_at.entry(at).or_default().addresses += 1;
        AddressChange::Learned
    }

    /// The hosts and addresses learned at `at`, and whether either is at the port's
    /// bound (`max_hosts_per_port`), so that new ones there are refused.
    pub fn share_of(&self, at: PortRef) -> (PortShare, bool) {
        let share = self.share_at.get(&at).copied().unwrap_or_default();
        let full = self.port_full(at, |s| s.hosts) || self.port_full(at, |s| s.addresses);
        (share, full)
    }

    /// Whether port `at` has its share of what `count` counts (not for the uplink).
    fn port_full(&self, at: PortRef, count: impl Fn(&PortShare) -> u32) -> bool {
        let here = self.share_at.get(&at).map(count).unwrap_or(0);
        self.max_hosts_per_port.is_some_and(|m| here >= m) && self.unbounded_port != Some(at)
    }

    /// The number of `mac`, numbering it if it is new.
    pub fn mac_id(&mut self, mac: MacAddr) -> MacId {
        if let Some(&id) = self.mac_ids.get(&mac) {
            return id;
        }
        if self.macs.len() >= MAX_MAC_IDS {
            return MacId::UNKNOWN;
        }
        let id = MacId(self.macs.len() as u32);
        self.macs.push(mac);
        self.mac_ids.insert(mac, id);
        id
    }

    /// The MAC numbered `id` (`None` for [`MacId::UNKNOWN`]).
    pub fn mac_by_id(&self, id: MacId) -> Option<MacAddr> {
        self.macs.get(id.0 as usize).copied()
    }

    pub fn host(&self, mac: MacAddr) -> Option<&HostInfo> {
        self.hosts.get(&mac)
    }

    pub fn host_count(&self) -> usize {
        self.hosts.len()
    }

    pub fn hosts(&self) -> impl Iterator<Item = (&MacAddr, &HostInfo)> {
        self.hosts.iter()
    }

    pub fn mac_of(&self, ip: Ipv4Addr) -> Option<MacAddr> {
        self.mac_by_ip.get(&ip).copied()
    }

    /// Where the host with this IP is, if known.
    pub fn locate_ip(&self, ip: Ipv4Addr) -> Option<(MacAddr, PortRef)> {
        let mac = self.mac_of(ip)?;
        Some((mac, self.hosts.get(&mac)?.at))
    }

    /// An ARP probe was sent to `mac`, which has not been heard from since.
    pub fn note_probe(&mut self, mac: MacAddr) {
        if let Some(h) = self.hosts.get_mut(&mac) {
            h.probes = h.probes.saturating_add(1);
        }
    }

    /// Forget the hosts `gone` says (their share of their port, their addresses), as
    /// hosts whose port went are: one seen again at another port has moved. One pass
    /// over the address table, whatever their number.
    pub fn forget_hosts(&mut self, gone: impl Fn(&MacAddr, &HostInfo) -> bool) {
        let gone: HashSet<MacAddr, RandomState> = self
            .hosts
            .iter()
            .filter(|(m, h)| gone(m, h))
            .map(|(m, _)| *m)
            .collect();
        if gone.is_empty() {
            return;
        }
        for m in &gone {
            if let Some(h) = self.hosts.remove(m) {
                count_out(&mut self.share_at, h.at, h.addresses);
                if self.forgotten.len() >= MAX_FORGOTTEN {
                    // Most never come back: start over rather than stop remembering.
                    self.forgotten.clear();
                }
                self.forgotten.insert(*m, h.at);
            }
        }
        self.mac_by_ip.retain(|_, v| !gone.contains(v));
    }

    fn forget_hosts_where(&mut self, pred: impl Fn(PortRef) -> bool) {
        self.forget_hosts(|_, h| pred(h.at));
    }

    /// Whether `at` is the port the per-port bound does not apply to (a domain's uplink).
    pub fn is_unbounded_port(&self, at: PortRef) -> bool {
        self.unbounded_port == Some(at)
    }

    /// The egress port at `dpid` for traffic to a host at `dst`: the host's own port when
    /// it is on this switch, else the next hop toward its switch.
    pub fn egress_toward(&self, dpid: Dpid, dst: PortRef) -> Option<u32> {
        egress_with(&self.next_hop, dpid, dst, None)
    }

    /// The egress port at `dpid` of flow `flow` to a host at `dst`: as
    /// [`Topology::egress_toward`], the flow's own among equal-cost next hops.
    pub fn flow_egress_toward(&self, dpid: Dpid, dst: PortRef, flow: u64) -> Option<u32> {
        egress_with(&self.next_hop, dpid, dst, Some(flow))
    }

    /// The switches a packet crosses from `from` to the host at `dst`, each with its egress
    /// port, in order. None when there is no path. Of equal-cost paths, the one the L2
    /// rules follow.
    pub fn path(&self, from: Dpid, dst: PortRef, out: &mut Vec<(Dpid, u32)>) -> Option<()> {
        self.path_with(&self.next_hop, from, dst, None, out)
    }

    /// As [`Topology::path`], for flow `flow` (a connection's hash, see
    /// `ConnKey::flow_hash`): of equal-cost paths, the flow's own, hop by hop, so the
    /// connections between two switches spread over every shortest path between them.
    pub fn flow_path(
        &self,
        from: Dpid,
        dst: PortRef,
        flow: u64,
        out: &mut Vec<(Dpid, u32)>,
    ) -> Option<()> {
        self.path_with(&self.next_hop, from, dst, Some(flow), out)
    }

    /// The path [`Topology::flow_path`] (or, without `flow`, [`Topology::path`]) gave
    /// before the links last changed (`before`, from
    /// [`Topology::take_next_hops_before`]), to the host where it is now, into `out`.
    pub fn path_before(
        &self,
        before: &NextHops,
        from: Dpid,
        dst: PortRef,
        flow: Option<u64>,
        out: &mut Vec<(Dpid, u32)>,
    ) -> EarlierPath {
        match self.path_with(&before.0, from, dst, flow, out) {
            Some(()) => EarlierPath::Found,
            // The walk stopped at a hop the earlier next hops gave and the links have no
            // more: it crossed a link that is gone.
            None if out.last().is_some_and(|&(d, p)| {
                d != dst.dpid && !self.links.contains_key(&PortRef::new(d, p))
            }) =>
            {
                EarlierPath::LinkGone
            }
            None => EarlierPath::NoRoute,
        }
    }

    /// The next hops as they were before the first change of the links since the last
    /// call (`None`: no change since). The paths of what was routed before that change
    /// are worked out again with them, to see which changed.
    pub fn take_next_hops_before(&mut self) -> Option<NextHops> {
        self.next_hop_before.take().map(NextHops)
    }

    /// Whether every next hop of `before` is still one now, the same: then a path found by
    /// `before` is the one found now, hop by hop (each hop `before` gives is one a link
    /// still carries), and no path changed. So it is when a switch with no links joins or
    /// leaves, as every switch does when its session drops and comes back.
    pub fn next_hops_hold(&self, before: &NextHops) -> bool {
        before
            .0
            .iter()
            .all(|(k, hops)| self.next_hop.get(k) == Some(hops))
    }

    /// Whether every path from switch `from` to switch `to` that `before` gave, for any
    /// flow, is the path now: each switch that the earlier next hops toward `to` reach from
    /// `from` (through any of equal-cost ones) has the same next hops toward `to` now, and
    /// so makes the same choice for every flow. A walk of the connections after a change
    /// of the links asks it once per pair of switches, and works out the paths of a
    /// connection only between switches where it is false.
    pub fn paths_hold(&self, before: &NextHops, from: Dpid, to: Dpid) -> bool {
        let mut seen: SmallVec<[Dpid; 16]> = SmallVec::new();
        let mut stack: SmallVec<[Dpid; 16]> = SmallVec::new();
        stack.push(from);
        while let Some(at) = stack.pop() {
            if at == to || seen.contains(&at) {
                continue;
            }
            seen.push(at);
            let hops = before.0.get(&(at, to));
            if hops != self.next_hop.get(&(at, to)) {
                return false;
            }
            for &port in hops.into_iter().flatten() {
                match self.links.get(&PortRef::new(at, port)) {
                    Some((peer, _)) => stack.push(peer.dpid),
                    None => return false,
                }
            }
        }
        true
    }

    fn path_with(
        &self,
        next_hop: &HopMap,
        from: Dpid,
        dst: PortRef,
        flow: Option<u64>,
        out: &mut Vec<(Dpid, u32)>,
    ) -> Option<()> {
        out.clear();
        let mut at = from;
        for _ in 0..=self.switches.len() {
            let port = egress_with(next_hop, at, dst, flow)?;
            out.push((at, port));
            if at == dst.dpid {
                return Some(());
            }
            let (peer, _) = self.links.get(&PortRef::new(at, port))?;
            at = peer.dpid;
        }
        None
    }

    /// Ports of `dpid` to flood a packet that entered at `in_port` on: every up port that is
    /// not a link, plus the link ports on the spanning tree, never the ingress port.
    pub fn flood_ports(&self, dpid: Dpid, in_port: u32, out: &mut Vec<u32>) {
        out.clear();
        let Some(sw) = self.switches.get(&dpid) else {
            return;
        };
        for (&no, info) in &sw.ports {
            if no == in_port || !info.up || no > ofp::port::MAX {
                continue;
            }
            let p = PortRef::new(dpid, no);
            if !self.is_link_port(p) || self.tree_ports.contains(&p) {
                out.push(no);
            }
        }
    }

    /// Ports of `dpid` facing hosts (up, not links): where LLDP and ARP probes go.
    pub fn edge_ports(&self, dpid: Dpid, out: &mut Vec<u32>) {
        self.flood_ports(dpid, ofp::port::ANY, out);
        out.retain(|&p| !self.is_link_port(PortRef::new(dpid, p)));
    }

    /// Recompute next hops (BFS from every switch) and the flooding tree (BFS from the
    /// lowest dpid of each connected component).
    fn recompute(&mut self) {
        self.generation += 1;
        if self.next_hop_before.is_none() {
            self.next_hop_before = Some(std::mem::take(&mut self.next_hop));
        } else {
            self.next_hop.clear();
        }
        self.tree_ports.clear();
        // Adjacency in a deterministic order.
        let mut adj: BTreeMap<Dpid, Vec<(u32, PortRef)>> = BTreeMap::new();
        for (&a, &(b, _)) in &self.links {
            adj.entry(a.dpid).or_default().push((a.port, b));
        }
        for v in adj.values_mut() {
            v.sort_by_key(|(port, peer)| (peer.dpid, *port));
        }
        let dpids: Vec<Dpid> = self.switches.keys().copied().collect();
        for &dst in &dpids {
            // BFS from dst: every neighbour one hop closer to dst is a next hop toward it
            // (peer reaches u through the link end at peer.port), the first found first.
            let mut dist = BTreeMap::from([(dst, 0u32)]);
            let mut q = VecDeque::from([dst]);
            while let Some(u) = q.pop_front() {
                let du = dist.get(&u).copied().unwrap_or(0);
                for &(_, peer) in adj.get(&u).map(Vec::as_slice).unwrap_or(&[]) {
                    let closer = match dist.get(&peer.dpid) {
                        None => {
                            dist.insert(peer.dpid, du + 1);
                            q.push_back(peer.dpid);
                            true
                        }
                        Some(&d) => d == du + 1,
                    };
                    if closer {
                        self.next_hop
                            .entry((peer.dpid, dst))
                            .or_default()
                            .push(peer.port);
                    }
                }
            }
        }
        let mut in_tree = BTreeSet::new();
        for &root in &dpids {
            if !in_tree.insert(root) {
                continue;
            }
            let mut q = VecDeque::from([root]);
            while let Some(u) = q.pop_front() {
                for &(port, peer) in adj.get(&u).map(Vec::as_slice).unwrap_or(&[]) {
                    if in_tree.insert(peer.dpid) {
                        self.tree_ports.insert(PortRef::new(u, port));
                        self.tree_ports.insert(peer);
                        q.push_back(peer.dpid);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_host_table_refuses_new_hosts_and_keeps_the_known_ones_moving() {
        let now = Instant::now();
        let mut t = Topology::with_host_bounds(2, 2);
        t.add_switch(1);
        let mac = |i: u8| MacAddr([2, 0, 0, 0, 0, i]);
        let ip = |i: u8| Ipv4Addr::new(10, 0, 0, i);
        let at = |p: u32| PortRef::new(1, p);
        assert_eq!(t.learn_host(now, mac(1), at(1)), HostChange::New);
        assert_eq!(t.learn_address(mac(1), ip(1)), AddressChange::Learned);
        assert_eq!(t.learn_host(now, mac(2), at(2)), HostChange::New);
        assert_eq!(t.learn_address(mac(2), ip(2)), AddressChange::Learned);
        assert_eq!(t.learn_host(now, mac(3), at(3)), HostChange::Refused);
        assert!(!HostChange::Refused.placed() && !HostChange::Refused.known());
        assert_eq!(t.learn_address(mac(3), ip(3)), AddressChange::Ignored);
        assert_eq!((t.host_count(), t.mac_of(ip(3))), (2, None));
        // Known hosts still move, and keep their addresses.
        assert_eq!(t.learn_host(now, mac(2), at(4)), HostChange::Moved);
        assert_eq!(t.learn_address(mac(2), ip(2)), AddressChange::Same);
        assert_eq!(t.mac_of(ip(2)), Some(mac(2)));
        // The address table is bounded too: a known host claiming more addresses (ARP
        // from a forged sender address) adds none past the bound.
        assert_eq!(t.learn_address(mac(1), ip(9)), AddressChange::Refused);
        assert_eq!(t.mac_of(ip(9)), None);
        // An address another host claims now is not a new entry, and is no longer the
        // host's that claimed it before.
        assert_eq!(t.learn_address(mac(1), ip(2)), AddressChange::Learned);
        assert_eq!(t.locate_ip(ip(2)), Some((mac(1), at(1))));
        assert_eq!(t.host(mac(2)).map(|h| h.ip), Some(None));
        assert_eq!(t.host(mac(1)).map(|h| h.ip), Some(Some(ip(2))));
    }

    /// One MAC claiming address after address (ARP with forged sender addresses) fills
    /// its port's share of the address table, not the table: a backend's address at
    /// another port is still learned. The share follows the host when it moves, and
    /// comes back when an address is claimed by another port's host or the port goes.
    #[test]
    fn a_port_learns_at_most_its_share_of_addresses() {
        let now = Instant::now();
        let mut t = Topology::with_host_bounds(100, 3);
        t.add_switch(1);
        let mac = |i: u8| MacAddr([2, 0, 0, 0, 0, i]);
        let ip = |i: u8| Ipv4Addr::new(10, 0, 0, i);
        let at = |p: u32| PortRef::new(1, p);
        assert_eq!(t.learn_host(now, mac(1), at(1)), HostChange::New);
        for i in 1..=3 {
            assert_eq!(t.learn_address(mac(1), ip(i)), AddressChange::Learned);
        }
        for i in 4..=50 {
            assert_eq!(t.learn_address(mac(1), ip(i)), AddressChange::PortFull);
            assert_eq!(t.mac_of(ip(i)), None);
        }
        let share = |hosts, addresses| PortShare { hosts, addresses };
        assert_eq!(t.share_of(at(1)), (share(1, 3), true));
        assert_eq!(t.share_of(at(2)), (share(0, 0), false));
        // Another host at the same port shares the port's bound; one elsewhere does not.
        assert_eq!(t.learn_host(now, mac(2), at(1)), HostChange::New);
        assert_eq!(t.learn_address(mac(2), ip(60)), AddressChange::PortFull);
        assert_eq!(t.learn_host(now, mac(3), at(2)), HostChange::New);
        assert_eq!(t.learn_address(mac(3), ip(61)), AddressChange::Learned);
        // What it holds already is not refused.
        assert_eq!(t.learn_address(mac(1), ip(2)), AddressChange::Same);
        // An address claimed by port 2's host leaves port 1's share.
        assert_eq!(t.learn_address(mac(3), ip(3)), AddressChange::Learned);
        assert_eq!(t.learn_address(mac(2), ip(60)), AddressChange::Learned);
        // A host that moves takes its addresses' share with it (and is not refused).
        assert_eq!(t.learn_host(now, mac(1), at(2)), HostChange::Moved);
        assert_eq!(t.learn_address(mac(2), ip(62)), AddressChange::Learned);
        assert_eq!(t.learn_address(mac(3), ip(63)), AddressChange::PortFull);
        assert_eq!(t.share_of(at(1)), (share(1, 2), false));
        assert_eq!(t.share_of(at(2)), (share(2, 4), true));
        // A port that goes takes its hosts' addresses, and its share is whole again.
        t.remove_port(1, 2);
        assert_eq!(t.mac_of(ip(1)), None);
        assert_eq!(t.learn_host(now, mac(4), at(2)), HostChange::New);
        for i in 70..=72 {
            assert_eq!(t.learn_address(mac(4), ip(i)), AddressChange::Learned);
        }
        // The uplink is not bounded.
        t.unbound_port(at(5));
        assert_eq!(t.learn_host(now, mac(5), at(5)), HostChange::New);
        for i in 80..=90 {
            assert_eq!(t.learn_address(mac(5), ip(i)), AddressChange::Learned);
        }
        assert_eq!(
            t.learn_address(mac(5), Ipv4Addr::UNSPECIFIED),
            AddressChange::Ignored
        );
    }

    /// One port sending forged source MACs fills its own share of the host table, not
    /// the table: hosts at other ports are still learned. Its share comes back as its
    /// hosts move away or are forgotten.
    #[test]
    fn a_port_learns_at_most_its_share_of_hosts() {
        let now = Instant::now();
        let mut t = Topology::with_host_bounds(100, 3);
        t.add_switch(1);
        let mac = |i: u8| MacAddr([2, 0, 0, 0, 0, i]);
        let at = |p: u32| PortRef::new(1, p);
        for i in 1..=3 {
            assert_eq!(t.learn_host(now, mac(i), at(1)), HostChange::New);
        }
        for i in 4..=50 {
            assert_eq!(t.learn_host(now, mac(i), at(1)), HostChange::PortFull);
        }
        assert!(!HostChange::PortFull.placed());
        assert_eq!(t.host_count(), 3);
        // Another port's hosts are learned.
        assert_eq!(t.learn_host(now, mac(60), at(2)), HostChange::New);
        // A known host seen again where it is is not refused; one that moves away frees
        // a place, and one that moves in is not refused (a move adds no entry).
        assert_eq!(t.learn_host(now, mac(1), at(1)), HostChange::Same);
        assert_eq!(t.learn_host(now, mac(1), at(3)), HostChange::Moved);
        assert_eq!(t.learn_host(now, mac(4), at(1)), HostChange::New);
        assert_eq!(t.learn_host(now, mac(60), at(1)), HostChange::Moved);
        assert_eq!(t.learn_host(now, mac(5), at(1)), HostChange::PortFull);
        // The port goes: its hosts are forgotten, and its share is whole again.
        t.remove_port(1, 1);
        assert_eq!(t.host_count(), 1, "mac(1), at port 3");
        for i in 20..=22 {
            assert_eq!(t.learn_host(now, mac(i), at(1)), HostChange::New);
        }
        assert_eq!(t.learn_host(now, mac(23), at(1)), HostChange::PortFull);
        // A domain's uplink is not bounded.
        t.unbound_port(at(5));
        for i in 30..=40 {
            assert_eq!(t.learn_host(now, mac(i), at(5)), HostChange::New);
        }
    }

    /// A host whose port went (unplugged) and that turns up elsewhere moved; one that
    /// comes back where it was (its switch reconnected) is simply new again.
    #[test]
    fn a_host_forgotten_with_its_port_and_seen_elsewhere_has_moved() {
        let now = Instant::now();
        let mut t = Topology::new();
        t.add_switch(1);
        let m = MacAddr([2, 0, 0, 0, 0, 7]);
        let at = |p: u32| PortRef::new(1, p);
        assert_eq!(t.learn_host(now, m, at(3)), HostChange::New);
        t.remove_port(1, 3);
        assert!(t.host(m).is_none(), "forgotten with its port");
        assert_eq!(t.learn_host(now, m, at(4)), HostChange::Moved);
        t.remove_port(1, 4);
        assert_eq!(t.learn_host(now, m, at(4)), HostChange::New);
        assert_eq!(t.learn_host(now, m, at(4)), HostChange::Same);
    }

    fn port(name: &str) -> PortInfo {
        PortInfo {
            name: name.into(),
            hw_addr: MacAddr([2, 0, 0, 0, 0, 1]),
            up: true,
        }
    }

    /// A ring of three switches, each with host port 1 and links on ports 2 and 3.
    fn ring() -> (Topology, Instant) {
        let now = Instant::now();
        let mut t = Topology::new();
        for d in 1..=3 {
            t.add_switch(d);
            for p in 1..=3 {
                t.set_port(d, p, port("p"));
            }
        }
        t.link_seen(now, PortRef::new(1, 2), PortRef::new(2, 3));
        t.link_seen(now, PortRef::new(2, 2), PortRef::new(3, 3));
        t.link_seen(now, PortRef::new(3, 2), PortRef::new(1, 3));
        (t, now)
    }

    #[test]
    fn flooding_follows_a_tree_so_a_ring_does_not_loop() {
        let (t, _) = ring();
        let mut tree_link_ends = 0;
        let mut out = Vec::new();
        for d in 1..=3 {
            t.flood_ports(d, 1, &mut out);
            assert!(!out.contains(&1));
            tree_link_ends += out.iter().filter(|&&p| p != 1).count();
        }
        // A spanning tree of 3 switches has 2 links = 4 link ends.
        assert_eq!(tree_link_ends, 4);
    }

    #[test]
    fn paths_are_shortest_and_end_at_the_host_port() {
        let (t, _) = ring();
        let mut path = Vec::new();
        t.path(1, PortRef::new(3, 1), &mut path).expect("reachable");
        assert_eq!(path, vec![(1, 3), (3, 1)]);
        t.path(2, PortRef::new(2, 1), &mut path).expect("local");
        assert_eq!(path, vec![(2, 1)]);
    }

    /// Two leaves (1, 2) under three spines (11, 12, 13): leaf port `s` to spine `10 + s`,
    /// spine port `l` to leaf `l`; hosts on the leaves' port 9.
    fn leaf_spine() -> (Topology, Instant) {
        let now = Instant::now();
        let mut t = Topology::new();
        for d in [1, 2, 11, 12, 13] {
            t.add_switch(d);
            for p in 1..=9 {
                t.set_port(d, p, port("p"));
            }
        }
        for leaf in [1u64, 2] {
            for s in 1..=3u32 {
                t.link_seen(
                    now,
                    PortRef::new(leaf, s),
                    PortRef::new(10 + u64::from(s), leaf as u32),
                );
            }
        }
        (t, now)
    }

    /// The spine each of `n` flows from leaf 1 to leaf 2's host takes.
    fn spines_of(t: &Topology, n: u64) -> Vec<u64> {
        let mut path = Vec::new();
        (0..n)
            .map(|f| {
                t.flow_path(1, PortRef::new(2, 9), mix64(f), &mut path)
                    .expect("reachable");
                assert_eq!(path.len(), 3, "leaf, spine, leaf: {path:?}");
                assert_eq!(path[2], (2, 9));
                path[1].0
            })
            .collect()
    }

    /// Connections between two leaves spread over every spine (each flow its own
    /// equal-cost path, ECMP), while the L2 rules keep one. When a spine goes, only its
    /// flows move; the others keep their paths, and their rules.
    #[test]
    fn flows_spread_over_equal_cost_paths_and_keep_them_when_one_goes() {
        let (mut t, _) = leaf_spine();
        let before = spines_of(&t, 3000);
        for spine in [11, 12, 13] {
            let n = before.iter().filter(|&&s| s == spine).count();
            assert!((850..=1150).contains(&n), "spine {spine}: {n} of 3000");
        }
        let mut path = Vec::new();
        t.path(1, PortRef::new(2, 9), &mut path).expect("reachable");
        assert_eq!(path, [(1, 1), (11, 2), (2, 9)], "the first, for L2");
        // A flow's path is the same every time, and the reverse direction spreads too.
        assert_eq!(spines_of(&t, 3000), before);
        let mut back = BTreeSet::new();
        for f in 0..300 {
            t.flow_path(2, PortRef::new(1, 9), mix64(f), &mut path)
                .expect("reachable");
            assert_eq!(path.len(), 3);
            back.insert(path[1].0);
        }
        assert_eq!(back, BTreeSet::from([11, 12, 13]));
        // Spine 12 goes (its port down at leaf 1 takes the link).
        t.set_port(
            1,
            2,
            PortInfo {
                up: false,
                ..port("p")
            },
        );
        let after = spines_of(&t, 3000);
        for (b, a) in before.iter().zip(&after) {
            if *b == 12 {
                assert_ne!(*a, 12);
            } else {
                assert_eq!(a, b, "a flow off the lost spine kept its path");
            }
        }
    }

    #[test]
    fn hosts_are_not_learned_on_links_and_a_new_link_forgets_them() {
        let now = Instant::now();
        let mut t = Topology::new();
        t.add_switch(1);
        t.add_switch(2);
        let mac = MacAddr([2, 0, 0, 0, 0, 9]);
        assert_eq!(t.learn_host(now, mac, PortRef::new(1, 2)), HostChange::New);
        t.link_seen(now, PortRef::new(1, 2), PortRef::new(2, 2));
        assert!(t.host(mac).is_none());
        assert_eq!(t.learn_host(now, mac, PortRef::new(1, 2)), HostChange::Same);
        assert!(t.host(mac).is_none());
    }

    #[test]
    fn links_expire_and_a_down_port_takes_its_link() {
        let (mut t, now) = ring();
        assert!(t.is_link_port(PortRef::new(1, 2)));
        t.set_port(
            1,
            2,
            PortInfo {
                up: false,
                ..port("p")
            },
        );
        assert!(!t.is_link_port(PortRef::new(1, 2)));
        assert!(!t.is_link_port(PortRef::new(2, 3)));
        assert!(t.expire_links(now + Duration::from_secs(10), Duration::from_secs(3)));
        assert_eq!(t.links().count(), 0);
    }

    #[test]
    fn next_hops_hold_while_a_switch_without_links_comes_and_goes() {
        let (mut t, _) = ring();
        let _ = t.take_next_hops_before();
        t.add_switch(9);
        t.remove_switch(9);
        let before = t
            .take_next_hops_before()
            .expect("the links were worked out again");
        assert!(t.next_hops_hold(&before));
        // A link of the ring goes: the next hops across it are others now.
        t.remove_port(1, 2);
        let before = t.take_next_hops_before().expect("a link went");
        assert!(!t.next_hops_hold(&before));
    }

    /// The ring's s2–s3 link goes: the paths between s2 and s3 go round by s1 now, and
    /// those that start or end at s1 are as they were, though s3's next hop toward s2 (and
    /// s2's toward s3) changed.
    #[test]
    fn paths_hold_between_the_switches_whose_paths_avoid_a_lost_link() {
        let (mut t, _) = ring();
        let _ = t.take_next_hops_before();
        t.remove_port(2, 2);
        let before = t.take_next_hops_before().expect("a link went");
        assert!(!t.next_hops_hold(&before), "next hops changed");
        for (from, to) in [(1, 2), (2, 1), (1, 3), (3, 1), (1, 1)] {
            assert!(t.paths_hold(&before, from, to), "{from} to {to}");
        }
        for (from, to) in [(2, 3), (3, 2)] {
            assert!(!t.paths_hold(&before, from, to), "{from} to {to}");
        }
        // The link back: s2 and s3 are next to each other again.
        t.set_port(2, 2, port("p"));
        t.link_seen(Instant::now(), PortRef::new(2, 2), PortRef::new(3, 3));
        let before = t.take_next_hops_before().expect("a link came");
        assert!(!t.paths_hold(&before, 3, 2));
        assert!(t.paths_hold(&before, 1, 2));
    }
}
