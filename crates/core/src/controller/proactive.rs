//! The proactive mode (`mode = "proactive"` on a `[[service]]`): new connections to the
//! VIP never reach the controller. The switch (Open vSwitch, its connection tracker and
//! Nicira extensions) places them with a select group whose bucket weights the controller
//! keeps in step with live load; conntrack pins every connection to the backend it got, so
//! changing the weights (or draining a backend) never moves a live connection.
//!
//! Rules, for a service with VIP `V`, port `P`, group `G` (they replace the service's
//! intercept rule; cookie kind byte [`COOKIE_KIND`], outside `RuleKind`, so the reactive
//! resync's deletes by kind leave them alone):
//!
//! | table | prio | match | actions |
//! | --- | --- | --- | --- |
//! | 0 | 200 | `tcp, ip_dst=V, tcp_dst=P, ct_state=-trk` | `ct(zone=Z, nat, table=1)` |
//! | 0 | 200 | per backend B: `tcp, ip_src=B, tcp_src=P, ct_state=-trk` | `ct(zone=Z, nat, table=1)` |
//! | 0 | 200 | per backend B: `tcp, ip_dst=B, tcp_dst=P, ct_state=-trk` | `ct(zone=Z, nat, table=1)` |
//! | 1 | 30 | `tcp, ip_dst=V, tcp_dst=P, ct_state=+new+trk` | `group:G` |
//! | 1 | 25 | per backend B: `tcp, ip_dst=B, tcp_dst=P, ct_state=+new+trk-dnat` | `ct(commit, zone=Z, table=0)` |
//! | 1 | 20 | per located backend B: `tcp, ip_dst=B, tcp_dst=P, ct_state=+trk` | `eth_dst:=MAC(B), resubmit(,0)` |
//! | 1 | 20 | `tcp, ip_src=V, tcp_src=P, ct_state=+trk` (a reply, un-NATed) | `eth_src:=virtual MAC, resubmit(,0)` |
//! | 1 | 6 | `tcp, ct_state=+inv+trk, tcp_flags=+syn+ack` (a reactive service's deferred handshake, on a shared backend) | `resubmit(,0)` |
//! | 1 | 5 | `ct_state=+inv+trk` | drop |
//! | 1 | 1 | `ct_state=+trk` | `resubmit(,0)` |
//!
//! The backends' own addresses stay reachable (health checks, clients that address a
//! backend directly): their connections pass conntrack too, committed without NAT at
//! priority 25, so that their answers are known there and not dropped as invalid.
//!
//! Group `G` (select): one bucket per backend, `ct(commit, zone=Z, nat(dst=B:P), table=1)`,
//! weight from the balancer (below). Forwarding after the rewrite is table 0's own L2
//! rules (`resubmit(,0)`; the `-trk` in table 0's rules stops a second pass through
//! conntrack), so the proactive path works wherever L2 does and table 0's rules are the
//! same as for reactive services. One conntrack zone, [`CT_ZONE`], for every proactive
//! service: services may share backends (a backend's rules are the same for each, and
//! conntrack remembers which VIP a connection came to).
//!
//! **Resync, make before break.** A live connection must never meet a moment without its
//! rules (its packet would go to the controller, which would answer a non-SYN with a RST).
//! So the proactive rules are never deleted first: each sync re-adds every current rule
//! with the other value of a generation bit in its cookie (an ADD with the same match and
//! priority replaces the rule in place, OpenFlow §6.4), then, after a barrier, deletes the
//! rules of this kind still carrying the old bit (cookie-masked delete): only stale ones.
//! Groups are written with Open vSwitch's `OFPGC11_ADD_OR_MOD` (0x8000; `ovs-ofctl
//! --may-create mod-group`), never deleted while in use. A group is named by its service's
//! slot (`ServiceState::slot`), which a reload never hands to another service: a group id
//! named by the position in the file once gave a reordered service's live rules the other
//! service's buckets, until their own rules replaced them. Group ids of the range
//! `GROUP_BASE .. GROUP_BASE + max(GROUP_RANGE, slots)` that no proactive service uses
//! now are deleted (a delete of a group that does not exist is no error, §7.3.4.2; a stale
//! group takes its stale rules with it). A switch that (re)connects keeps what it holds
//! through its reconnect grace (`reconnect_grace_ms`): a restarted controller has not
//! located the backends yet, and its rules would lack their rewrites, so the current rules
//! and group are added only once every backend is located, and nothing is deleted. When
//! the grace ends, the switch's rules may carry either bit: the sync runs twice, once with
//! each bit.
//!
//! **A backend that leaves** every proactive pool keeps its rules while conntrack holds
//! connections to it: they are written again with a retiring cookie bit that no
//! generation's delete takes and the idle timeout of its services, and the switch removes
//! them once its connections have been idle that long (`retiring_flows`). So does a VIP
//! whose service goes or leaves the proactive mode: its table-0 rule is written again
//! above the reactive intercept and gap rules (251: a new connection's SYN passes
//! conntrack, finds no group, and goes on to the gap or the intercept, tracked), with its
//! reply rule. When no proactive service is left, table 1's catch-alls stay, out of every
//! generation, for good (`retiring_flows` says why). When the service is partitioned now,
//! the VIP's rule retires above the partition rules (241): a new partitioned connection
//! passes conntrack uncommitted on its way to them. A new connection's segments after the
//! SYN (a partitioned one's, or a reactive one's ACK that its deferred rules wait for) are
//! new to conntrack where it picks connections up mid-stream (Open vSwitch's own, Linux's
//! with `nf_conntrack_tcp_loose`), invalid where it does not, so table 1 sends on, rather
//! than drops, the invalid to the VIP (a known connection's invalid segment is still NATed
//! to its backend, does not match the VIP, and is dropped as before). Every new connection
//! meets the retiring VIP rule, which would so live for ever, and the pass for the invalid
//! sees hardly a packet where conntrack picks connections up, so would end too soon: the
//! life of both is their reply rule's instead. Only the old connections' answers pass
//! that one, which reports its end (`OFPFF_SEND_FLOW_REM`), and the controller then
//! deletes the VIP's retiring rules on that switch (`proactive_rule_ended`).
//!
//! **A switch that connects** is asked for its proactive rules (`retiring`): a retiring
//! VIP's rules whose reply rule ended unheard, while no controller was connected, go; and
//! a backend or a VIP that the rules of a generation serve and no proactive service has
//! now (removed while no controller was connected, or this one started with another
//! configuration) retires then, as if it had left now. The generation's delete at the
//! end of the switch's grace took their connections with it.
//!
//! **Weights.** Every refresh (10 ms) the controller asks the service's own balancer,
//! with the service's current view (eligibility, weights after slow start, active
//! connections, rates, response times), where the next [`WEIGHT_PICKS`] new connections
//! would go, each simulated pick counted as in flight (`picks_since_refresh` and
//! `active_connections` + 1) as a burst between two refreshes would be; a backend's
//! bucket weight is the number of those picks it got. So round robin gives equal weights,
//! weighted round robin the configured ratios, least connections fills each backend's
//! headroom (`weight / (active + 1)`), DWRS/SRT/MRBS/AMLOB their own preferences. An
//! ineligible backend (unhealthy, drained, ejected, not located) gets weight 0: no new
//! connections, while its conntrack entries keep their packets flowing (drain semantics).
//! A GROUP_MOD (modify) is sent when the set of zero-weight buckets changes at once, or
//! when at least [`RESEND_L1`] picks moved and [`RESEND_MIN`] passed since the last one.
//! ISSLM and `none` decide per connection and stay reactive-only (config rejects them).
//!
//! **Counting.** No per-connection rule exists, so there is no FLOW_REMOVED to count
//! active connections from: the balancer's active counts come from the backends'
//! reported metrics (`metrics = URL` on a backend) when configured, else they stay 0 and
//! least-connections degrades to weighted shares. Service `connections_total` counts only
//! connections that still reached the controller (none once the group is installed).

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use flowgate_packet::{ETH_TYPE_IPV4, IP_PROTO_TCP, MacAddr};
use ofp::{
    Action, Actions, Bucket, FlowMod, FlowModFlags, GroupMod, GroupModCommand, GroupType,
    Instruction, Match, Message, Oxm,
};

use super::conn_rule::Syn;
use super::nicira::{self, ct_state};
use super::{Controller, Outbox, rules};
use crate::balance::SelectRequest;
use crate::config::ServiceMode;
use crate::cookie;
use crate::topology::Dpid;

mod retiring;

/// The table of the proactive path (after conntrack).
pub(crate) const TABLE_CT: u8 = 1;
/// Group ids of proactive services: `GROUP_BASE + slot`.
pub(crate) const GROUP_BASE: u32 = 0x6667_0000;
/// On resync, group ids `GROUP_BASE .. GROUP_BASE + max(GROUP_RANGE, slots)` are
/// deleted first (a delete of a group that does not exist is no error, §7.3.4.2).
pub(crate) const GROUP_RANGE: u32 = 64;
/// The conntrack zone of every proactive service.
pub(crate) const CT_ZONE: u16 = 0x6667;
/// Simulated picks per weight computation (the sum of a service's bucket weights).
pub(crate) const WEIGHT_PICKS: u32 = 100;
/// Weight changes below this many picks (L1 distance) are not sent...
const RESEND_L1: u32 = 20;
/// ...nor more often than this (zero/non-zero changes are sent at once).
const RESEND_MIN: Duration = Duration::from_millis(250);

/// Kind byte of the proactive rules' cookies
/// ([`RuleKind::Proactive`](crate::cookie::RuleKind::Proactive), which the reactive
/// resync's deletes by kind never touch).
pub(crate) const COOKIE_KIND: u64 = crate::cookie::RuleKind::Proactive.base();
/// The generation bit of a proactive rule's cookie.
const COOKIE_GEN: u64 = 1 << 40;
/// The bit of a retiring backend's rules: no generation's delete takes them (they end by
/// their idle timeout).
const COOKIE_RETIRE: u64 = 1 << 41;
/// OVS's `OFPGC11_ADD_OR_MOD`: add the group, or replace it if it exists.
const OFPGC_ADD_OR_MOD: u16 = 0x8000;

/// A retiring VIP's table-0 rule: above a reactive intercept of the same address and port
/// (`rules::PRIO_INTERCEPT`), so that a proactive connection's packets still meet
/// conntrack first (a new connection's then go on to the intercept, tracked), and above
/// the reactive service's gap rules (`rules::PRIO_GAP`, which match no conntrack state):
/// below them, an OFF period dropped the old connections' segments with the new ones'
/// SYNs, and on Open vSwitch a download stalled for good. A new connection's SYN still
/// meets the gap, tracked, on its second pass through table 0.
const PRIO_RETIRING_VIP: u16 = rules::PRIO_GAP + 1;
/// ...and above a partitioned service's rules (the moving partitions' included), when the
/// VIP's service is partitioned now: below them, the old connections' packets went to a
/// partition's owner with the VIP as their destination, which answered with a reset.
const PRIO_RETIRING_VIP_PARTITIONED: u16 = super::partition::PRIO_MOVING + 1;
/// What conntrack calls invalid and must go on all the same (table 1), above the drop of
/// the invalid: a retiring VIP's segments, SYN-ACKs that conntrack never saw begin.
const PRIO_INV_PASS: u16 = PRIO_INV + 1;
const PRIO_NEW: u16 = 30;
const PRIO_DIRECT: u16 = 25;
const PRIO_EST: u16 = 20;
const PRIO_INV: u16 = 5;
const PRIO_TRK: u16 = 1;

/// What the switches were last given for one service.
#[derive(Debug, Clone, Default)]
pub(crate) struct Installed {
    /// The backends and where they are, as the rules were built.
    sig: Vec<(Ipv4Addr, Option<MacAddr>)>,
    pub(crate) weights: Vec<u16>,
    sent_at: Option<Instant>,
}

/// Per-service state of the proactive mode (indexed like `Controller::services`).
#[derive(Debug, Default)]
pub(crate) struct ProactiveState {
    pub(crate) services: Vec<Installed>,
    /// The generation bit of the rules last synced to every switch.
    gen_bit: bool,
    /// Some service was proactive at the last resync.
    synced_any: bool,
    /// The backends whose rules the last resync wrote, by `(address, port)`: where each
    /// was, and the longest idle timeout of the services it served.
    synced_backends: BTreeMap<(Ipv4Addr, u16), (Option<MacAddr>, u16)>,
    /// The proactive services' `(vip, port)` at the last resync: their virtual MAC and idle
    /// timeout.
    synced_vips: BTreeMap<(Ipv4Addr, u16), (MacAddr, u16)>,
    /// VIPs whose retiring table-0 rule may still be on the switches.
    retired_vips: BTreeSet<(Ipv4Addr, u16)>,
    /// What each connecting switch reports of its proactive rules, while it comes in.
    reports: BTreeMap<Dpid, retiring::Report>,
}

impl ProactiveState {
    /// A reload: `prev[i]` is where service `i` was before it, if it was there.
    pub(crate) fn reorder(&mut self, prev: &[Option<usize>]) {
        let mut old = std::mem::take(&mut self.services);
        self.services = prev
            .iter()
            .map(|p| {
                p.and_then(|p| old.get_mut(p))
                    .map(std::mem::take)
                    .unwrap_or_default()
            })
            .collect();
    }
}

pub(crate) fn group_id(slot: u16) -> u32 {
    GROUP_BASE + u32::from(slot)
}

fn cookie_of(gen_bit: bool, slot: u16) -> u64 {
    COOKIE_KIND | if gen_bit { COOKIE_GEN } else { 0 } | u64::from(slot)
}

/// An OFPFC_ADD of one proactive rule; no actions drop (§5.10: no instruction).
fn added(
    cookie: u64,
    idle_timeout: u16,
    table: u8,
    priority: u16,
    m: Match,
    actions: Actions,
) -> Message {
    let mut fm = FlowMod::add(m);
    fm.cookie = cookie;
    fm.table_id = table;
    fm.priority = priority;
    fm.idle_timeout = idle_timeout;
    if !actions.is_empty() {
        fm.instructions.push(Instruction::ApplyActions(actions));
    }
    Message::FlowMod(fm)
}

fn tcp() -> Match {
    Match::new()
        .with(Oxm::EthType(ETH_TYPE_IPV4))
        .with(Oxm::IpProto(IP_PROTO_TCP))
}

fn ip_dst(m: Match, a: Ipv4Addr) -> Match {
    m.with(Oxm::Ipv4Dst {
        value: a,
        mask: None,
    })
}

fn ip_src(m: Match, a: Ipv4Addr) -> Match {
    m.with(Oxm::Ipv4Src {
        value: a,
        mask: None,
    })
}

fn acts(v: impl IntoIterator<Item = Action>) -> Actions {
    let mut a = Actions::new();
    for x in v {
        a.push(x);
    }
    a
}

fn untracked() -> Oxm {
    nicira::ct_state_match(0, ct_state::TRK)
}

fn tracked() -> Oxm {
    nicira::ct_state_match(ct_state::TRK, ct_state::TRK)
}

fn to_ct() -> Actions {
    acts([nicira::ct(0, CT_ZONE, Some(TABLE_CT), &nicira::nat(None))])
}

/// Table 1's catch-alls, shared by every service: the invalid dropped (but a SYN-ACK), the
/// rest of what conntrack saw back to table 0.
fn catch_alls(cookie: u64, v: &mut Vec<Message>) {
    let invalid =
        nicira::ct_state_match(ct_state::INV | ct_state::TRK, ct_state::INV | ct_state::TRK);
    // A SYN-ACK that conntrack calls invalid is one of a connection it never saw begin: a
    // reactive service's on a backend that a proactive one shares (same address and
    // port), whose SYN the controller sent straight to the backend's port while its rules
    // wait for the client's ACK (`controller::handshake`). It goes on to table 0, tracked,
    // where the reactive service's reply catch takes it up to be rewritten; dropped with
    // the invalid, that handshake never completed. A proactive connection's SYN-ACK is
    // conntrack's own (the SYN made the entry), never invalid for this reason. One rule
    // for every backend, kept as long as the others here: per backend, it retired by its
    // own idle timer, unused, while the backend's other retiring rules lived on.
    v.push(added(
        cookie,
        0,
        TABLE_CT,
        PRIO_INV_PASS,
        Syn::AndAck.on(tcp().with(invalid.clone())),
        acts([nicira::resubmit_table(0)]),
    ));
    v.push(added(
        cookie,
        0,
        TABLE_CT,
        PRIO_INV,
        Match::new().with(invalid),
        Actions::new(),
    ));
    v.push(added(
        cookie,
        0,
        TABLE_CT,
        PRIO_TRK,
        Match::new().with(tracked()),
        acts([nicira::resubmit_table(0)]),
    ));
}

/// The match of a VIP's packets, `tcp, ip_dst=vip, tcp_dst=port`.
fn to_vip((vip, port): (Ipv4Addr, u16)) -> Match {
    ip_dst(tcp(), vip).with(Oxm::TcpDst(port))
}

/// A VIP's connections both ways through conntrack: its packets (table 0, at
/// `ct_priority`), and the replies' source MAC after the un-NAT (table 1), with
/// `reply_flags`.
fn vip_flows(
    cookie: u64,
    idle_timeout: u16,
    ct_priority: u16,
    (vip, port): (Ipv4Addr, u16),
    virtual_mac: MacAddr,
    reply_flags: FlowModFlags,
    v: &mut Vec<Message>,
) {
    v.push(added(
        cookie,
        idle_timeout,
        0,
        ct_priority,
        to_vip((vip, port)).with(untracked()),
        to_ct(),
    ));
    v.push(added(
        cookie,
        idle_timeout,
        TABLE_CT,
        PRIO_EST,
        ip_src(tcp(), vip).with(Oxm::TcpSrc(port)).with(tracked()),
        acts([
            Action::SetField(Oxm::EthSrc {
                value: virtual_mac.0,
                mask: None,
            }),
            nicira::resubmit_table(0),
        ]),
    ));
    if let Some(Message::FlowMod(reply)) = v.last_mut() {
        reply.flags = reply_flags;
    }
}

/// The rules of one backend `addr` on service port `port` (the same for every proactive
/// service it serves), with `cookie` and `idle_timeout` (0 but for retiring ones).
fn backend_flows(
    cookie: u64,
    idle_timeout: u16,
    addr: Ipv4Addr,
    port: u16,
    mac: Option<MacAddr>,
    v: &mut Vec<Message>,
) {
    let mut push = |table: u8, priority: u16, m: Match, actions: Actions| {
        v.push(added(cookie, idle_timeout, table, priority, m, actions));
    };
    // Table 0: its answers through conntrack (un-NAT)...
    push(
        0,
        rules::PRIO_INTERCEPT,
        ip_src(tcp(), addr)
            .with(Oxm::TcpSrc(port))
            .with(untracked()),
        to_ct(),
    );
    // ...and connections to its own address (health checks, direct clients), so that
    // conntrack knows them when their answers come back.
    push(
        0,
        rules::PRIO_INTERCEPT,
        ip_dst(tcp(), addr)
            .with(Oxm::TcpDst(port))
            .with(untracked()),
        to_ct(),
    );
    // A new connection that came to the backend's own address (`-dnat`: not one the group
    // placed, which is committed with its NAT) is committed, without NAT, then forwarded
    // as addressed (table 0 again, tracked): else its first answer, a SYN-ACK conntrack
    // never saw begin, is invalid and dropped, and no health check or direct client gets
    // through (seen on Open vSwitch). The commit recirculates: after a `ct` that does not,
    // the packet is untracked again, and table 0 would send it back here.
    push(
        TABLE_CT,
        PRIO_DIRECT,
        ip_dst(tcp(), addr)
            .with(Oxm::TcpDst(port))
            .with(nicira::ct_state_match(
                ct_state::NEW | ct_state::TRK,
                ct_state::NEW | ct_state::TRK | ct_state::DNAT,
            )),
        acts([nicira::ct(nicira::CT_COMMIT, CT_ZONE, Some(0), &[])]),
    );
    let Some(mac) = mac else { return };
    push(
        TABLE_CT,
        PRIO_EST,
        ip_dst(tcp(), addr).with(Oxm::TcpDst(port)).with(tracked()),
        acts([
            Action::SetField(Oxm::EthDst {
                value: mac.0,
                mask: None,
            }),
            nicira::resubmit_table(0),
        ]),
    );
}

impl Controller {
    pub(crate) fn is_proactive(&self, service: usize) -> bool {
        self.services
            .get(service)
            .is_some_and(|s| s.cfg.mode == ServiceMode::Proactive && s.cfg.vip.is_some())
    }

    fn installed(&self, service: usize) -> Option<&Installed> {
        self.proactive.services.get(service)
    }

    /// The select group of a proactive service, with the weights last computed. They are
    /// looked up by address: after a pool change the group goes out at once, before the
    /// next tick computes weights for the new pool, and by position a removal gave each
    /// later backend its neighbour's weight (a drained one's 0 to a live one).
    fn group_mod(&self, service: usize, command: GroupModCommand) -> Option<Message> {
        let s = self.services.get(service)?;
        let installed = self.installed(service);
        let buckets = s
            .backends
            .iter()
            .map(|b| {
                let last = installed.and_then(|st| {
                    let k = st.sig.iter().position(|(a, _)| *a == b.address)?;
                    st.weights.get(k).copied()
                });
                let w = match last {
                    _ if !b.eligible() => 0,
                    Some(w) => w,
                    None => 1,
                };
                Bucket::weighted(
                    w,
                    acts([nicira::ct(
                        nicira::CT_COMMIT,
                        CT_ZONE,
                        Some(TABLE_CT),
                        &nicira::nat(Some((b.address, s.cfg.port))),
                    )]),
                )
            })
            .collect();
        Some(Message::GroupMod(GroupMod {
            command,
            group_type: GroupType::Select,
            group_id: group_id(s.slot),
            buckets,
        }))
    }

    fn proactive_flows(&self, gen_bit: bool, service: usize, v: &mut Vec<Message>) {
        let Some(s) = self.services.get(service) else {
            return;
        };
        let Some(vip) = s.cfg.vip else {
            return;
        };
        let port = s.cfg.port;
        let cookie = cookie_of(gen_bit, s.slot);
        let at = rules::PRIO_INTERCEPT;
        vip_flows(
            cookie,
            0,
            at,
            (vip, port),
            s.cfg.virtual_mac,
            FlowModFlags::empty(),
            v,
        );
        // Table 1: new connections to the group, the rest pinned by conntrack.
        v.push(added(
            cookie,
            0,
            TABLE_CT,
            PRIO_NEW,
            ip_dst(tcp(), vip)
                .with(Oxm::TcpDst(port))
                .with(nicira::ct_state_match(
                    ct_state::NEW | ct_state::TRK,
                    ct_state::NEW | ct_state::TRK,
                )),
            acts([Action::Group(group_id(s.slot))]),
        ));
        for b in &s.backends {
            backend_flows(cookie, 0, b.address, port, b.mac, v);
        }
    }

    /// One make-before-break sync (see the module doc): stale groups deleted, current
    /// groups added or replaced, every current rule (re-)added with `gen_bit`, a barrier,
    /// then the rules of the other generation deleted. Without `deletes` (a switch in its
    /// reconnect grace), only the adds.
    fn sync_messages(&self, gen_bit: bool, deletes: bool, retiring: &[Message]) -> Vec<Message> {
        let mut v = Vec::new();
        let proactive: Vec<usize> = (0..self.services.len())
            .filter(|&i| self.is_proactive(i))
            .collect();
        let range = GROUP_RANGE.max(self.slot_bound);
        for id in GROUP_BASE..GROUP_BASE + range {
            if !deletes
                || proactive
                    .iter()
                    .any(|&i| group_id(self.services[i].slot) == id)
            {
                continue;
            }
            v.push(Message::GroupMod(GroupMod {
                command: GroupModCommand::Delete,
                group_type: GroupType::Select,
                group_id: id,
                buckets: Vec::new(),
            }));
        }
        for &i in &proactive {
            if let Some(m) = self.group_mod(i, GroupModCommand::Other(OFPGC_ADD_OR_MOD)) {
                v.push(m);
            }
        }
        for &i in &proactive {
            self.proactive_flows(gen_bit, i, &mut v);
        }
        if !proactive.is_empty() {
            // Shared catch-alls of table 1 (identical for every service: added once).
            catch_alls(cookie_of(gen_bit, 0xffff), &mut v);
        }
        v.extend_from_slice(retiring);
        if deletes {
            // §6.2: the adds must be done before the delete of the other generation.
            v.push(Message::BarrierRequest);
            let mut del = FlowMod::delete(Match::new());
            del.table_id = rules::TABLE_ALL;
            del.cookie = cookie_of(!gen_bit, 0);
            del.cookie_mask = cookie::KIND_MASK | COOKIE_GEN | COOKIE_RETIRE;
            v.push(Message::FlowMod(del));
        }
        v
    }

    /// Every backend of every proactive service is located: the rules and the group
    /// weights built now are complete.
    fn proactive_located(&self) -> bool {
        (0..self.services.len())
            .filter(|&i| self.is_proactive(i))
            .all(|i| self.services[i].backends.iter().all(|b| b.mac.is_some()))
    }

    /// Whether proactive rules and groups may be written to switch `d` now. In its
    /// reconnect grace, not before every backend is located: until then, what the switch
    /// holds from before (all backends placed, weights from live load) serves better than
    /// rules without the unlocated backends' rewrites and a group that gives them nothing.
    fn proactive_may_write(&self, d: Dpid) -> bool {
        !self.in_grace(d) || self.proactive_located()
    }

    /// A switch (re)connected. In its reconnect grace: the current rules are added once
    /// they are complete, and nothing is deleted (until [`Self::proactive_settle`]).
    /// Without a grace: settled at once.
    pub(crate) fn proactive_switch_up(&mut self, dpid: Dpid, out: &mut Outbox) {
        // What it holds: what retires (`retiring::proactive_reported`).
        self.proactive_report_request(dpid, out);
        self.proactive.synced_any |= (0..self.services.len()).any(|i| self.is_proactive(i));
        if !self.in_grace(dpid) {
            self.proactive_settle(dpid, out);
        } else if self.proactive_may_write(dpid) {
            for m in self.sync_messages(self.proactive.gen_bit, false, &[]) {
                out.push(dpid, m);
            }
        }
    }

    /// A switch's reconnect grace ended: its proactive rules may carry either generation
    /// bit, so sync twice, ending on the current one (stale groups and rules deleted).
    pub(crate) fn proactive_settle(&mut self, dpid: Dpid, out: &mut Outbox) {
        let g = self.proactive.gen_bit;
        for m in self
            .sync_messages(!g, true, &[])
            .into_iter()
            .chain(self.sync_messages(g, true, &[]))
        {
            out.push(dpid, m);
        }
    }

    /// The proactive services' pools, locations or modes changed: sync every switch (one
    /// in its reconnect grace without the deletes, and only once the rules are complete).
    pub(crate) fn proactive_resync(&mut self, out: &mut Outbox) {
        let any = (0..self.services.len()).any(|i| self.is_proactive(i));
        if !any && !self.proactive.synced_any {
            // Reactive only, now and since this controller started (a switch's leftovers
            // from an earlier run are removed when its grace ends).
            return;
        }
        self.proactive.synced_any = any;
        self.proactive.gen_bit = !self.proactive.gen_bit;
        let g = self.proactive.gen_bit;
        let retiring = self.retiring_flows();
        let full = self.sync_messages(g, true, &retiring);
        // Built only if some switch in its grace may be written now.
        let adds = (self.proactive_located() && self.switch_ids().any(|d| self.in_grace(d)))
            .then(|| self.sync_messages(g, false, &retiring));
        let dpids: Vec<Dpid> = self.switch_ids().collect();
        for d in dpids {
            let msgs = match (self.in_grace(d), &adds) {
                (false, _) => &full,
                (true, Some(adds)) => adds,
                (true, None) => continue,
            };
            for m in msgs {
                out.push(d, m.clone());
            }
        }
    }

    /// Bucket weights from the service's balancer (see the module doc); the partitioned
    /// mode's shares too.
    pub(crate) fn compute_weights(&mut self, now: Instant, service: usize) -> Vec<u16> {
        let since_refresh = self
            .last_refresh
            .map(|t| now.saturating_duration_since(t))
            .unwrap_or_default();
        let Some(s) = self.services.get_mut(service) else {
            return Vec::new();
        };
        let mut loads = s.loads.clone();
        let mut counts = vec![0u16; s.backends.len()];
        for k in 0..WEIGHT_PICKS {
            let req = SelectRequest {
                requested: None,
                flow_hash: u64::from(k).wrapping_mul(0x9e37_79b9_7f4a_7c15),
                since_refresh,
            };
            let sel = s.balancer.select(&req, &loads);
            let Some(b) = sel.backend else { break };
            if let (Some(c), Some(l)) = (counts.get_mut(b), loads.get_mut(b)) {
                *c += 1;
                l.picks_since_refresh += 1;
                l.active_connections += 1;
            }
        }
        for (c, b) in counts.iter_mut().zip(&s.backends) {
            if !b.eligible() {
                *c = 0;
            }
        }
        counts
    }

    /// On each tick: re-sync a proactive service whose pool or backend locations changed,
    /// and send new bucket weights when they moved enough.
    pub(crate) fn proactive_tick(&mut self, now: Instant, out: &mut Outbox) {
        let n = self.services.len();
        self.proactive.services.resize_with(n, Installed::default);
        let mut resync = false;
        let mut modify = Vec::new();
        for i in 0..n {
            if !self.is_proactive(i) {
                self.proactive.services[i] = Installed::default();
                continue;
            }
            let sig: Vec<(Ipv4Addr, Option<MacAddr>)> = self.services[i]
                .backends
                .iter()
                .map(|b| (b.address, b.mac))
                .collect();
            let weights = self.compute_weights(now, i);
            let st = &mut self.proactive.services[i];
            if st.sig != sig {
                st.sig = sig;
                st.weights = weights;
                st.sent_at = Some(now);
                resync = true;
                continue;
            }
            let zero_changed = st.weights.len() != weights.len()
                || st
                    .weights
                    .iter()
                    .zip(&weights)
                    .any(|(a, b)| (*a == 0) != (*b == 0));
            let l1: u32 = st
                .weights
                .iter()
                .zip(&weights)
                .map(|(a, b)| u32::from(a.abs_diff(*b)))
                .sum();
            let due = st
                .sent_at
                .is_none_or(|t| now.saturating_duration_since(t) >= RESEND_MIN);
            if zero_changed || (l1 >= RESEND_L1 && due) {
                st.weights = weights;
                st.sent_at = Some(now);
                modify.push(i);
            }
        }
        if resync {
            self.proactive_resync(out);
            return;
        }
        let dpids: Vec<Dpid> = self
            .switch_ids()
            .filter(|&d| self.proactive_may_write(d))
            .collect();
        for i in modify {
            if let Some(m) = self.group_mod(i, GroupModCommand::Other(OFPGC_ADD_OR_MOD)) {
                let detail = format!(
                    "{} weights {:?}",
                    self.services[i].cfg.name, self.proactive.services[i].weights
                );
                tracing::debug!(%detail, "proactive group weights");
                for &d in &dpids {
                    out.push(d, m.clone());
                }
            }
        }
    }

    /// The bucket weights last sent for a proactive service (for operators and tests).
    pub fn proactive_weights(&self, service: usize) -> Option<&[u16]> {
        self.is_proactive(service)
            .then(|| self.installed(service).map(|i| i.weights.as_slice()))
            .flatten()
    }
}

// The fake flow table (`testkit`) does not model conntrack, NAT or groups: these tests
// check the messages the controller sends; the data path is checked on real Open vSwitch
// (`crates/flowgate/tests/proactive.rs`).
#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::service::AdminState;
    use ofp::SwitchFeatures;
    use std::collections::BTreeMap;

    const VIP: &str = "10.0.0.100";

    fn switch_1() -> SwitchFeatures {
        SwitchFeatures::emulated(1)
    }

    fn controller(algorithm: &str, weights: &[u32]) -> (Controller, Instant) {
        let mut c = format!(
            "[[service]]\nname = \"web\"\nvip = \"{VIP}\"\nport = 80\nalgorithm = \"{algorithm}\"\nmode = \"proactive\"\n[service.health]\nkind = \"none\"\n"
        );
        for (i, w) in weights.iter().enumerate() {
            c += &format!(
                "[[service.backend]]\naddress = \"10.0.0.{}\"\nweight = {w}\n",
                i + 2
            );
        }
        let cfg = Config::from_toml(&c, &|_| None).expect("valid");
        let mut ctl = Controller::new(&cfg);
        let now = Instant::now();
        let mut out = Outbox::new();
        ctl.handle_switch_up(now, switch_1(), &mut out);
        // Locate the backends as ARP would.
        for (i, b) in ctl.services[0].backends.iter_mut().enumerate() {
            b.mac = Some(MacAddr([2, 0, 0, 0, 0, i as u8 + 2]));
        }
        ctl.services[0].sync_eligibility();
        (ctl, now)
    }

    /// [`controller`] by round robin once its switch's grace has ended: the time then, and
    /// what the grace's end sent.
    fn past_grace(weights: &[u32]) -> (Controller, Instant, Vec<Message>) {
        let (mut ctl, now) = controller("round-robin", weights);
        let mut out = Outbox::new();
        let t = now + ctl.config().reconnect_grace;
        ctl.handle_tick(t, &mut out);
        let sent = out.drain().map(|(_, m)| m).collect();
        (ctl, t, sent)
    }

    /// [`controller`]'s service, with `mode` (its lines) and the backends `10.0.0.{b}`.
    fn web(mode: &str, backends: &[u8]) -> Config {
        let mut c = format!(
            "[[service]]\nname = \"web\"\nvip = \"{VIP}\"\nport = 80\n{mode}\
             [service.health]\nkind = \"none\"\n"
        );
        for b in backends {
            c += &format!("[[service.backend]]\naddress = \"10.0.0.{b}\"\n");
        }
        Config::from_toml(&c, &|_| None).expect("valid")
    }

    fn groups(out: &mut Outbox) -> Vec<GroupMod> {
        out.drain()
            .filter_map(|(_, m)| match m {
                Message::GroupMod(g) if g.command != GroupModCommand::Delete => Some(g),
                _ => None,
            })
            .collect()
    }

    fn weights(g: &GroupMod) -> Vec<u16> {
        g.buckets.iter().map(|b| b.weight).collect()
    }

    fn is_group_delete(m: &Message) -> bool {
        matches!(m, Message::GroupMod(g) if g.command == GroupModCommand::Delete)
    }

    /// Positions of the cookie-masked deletes of proactive rules (by generation).
    fn generation_deletes(msgs: &[Message]) -> Vec<usize> {
        msgs.iter()
            .enumerate()
            .filter_map(|(i, m)| match m {
                Message::FlowMod(fm)
                    if fm.command == ofp::FlowModCommand::Delete
                        && fm.cookie & cookie::KIND_MASK == COOKIE_KIND =>
                {
                    assert_eq!(
                        fm.cookie_mask,
                        cookie::KIND_MASK | COOKIE_GEN | COOKIE_RETIRE
                    );
                    assert_eq!(fm.cookie & COOKIE_RETIRE, 0, "retiring rules stay");
                    Some(i)
                }
                _ => None,
            })
            .collect()
    }

    fn uses_group(m: &Message) -> bool {
        match m {
            Message::FlowMod(fm) => fm.instructions.iter().any(|i| match i {
                Instruction::ApplyActions(a) => a.iter().any(|a| matches!(a, Action::Group(_))),
                _ => false,
            }),
            _ => false,
        }
    }

    #[test]
    fn switch_up_sends_groups_before_the_flows_that_use_them_and_no_intercept() {
        let (mut ctl, now) = controller("round-robin", &[1, 1, 1]);
        let grace = ctl.config().reconnect_grace;
        assert!(!grace.is_zero());
        let mut out = Outbox::new();
        // The switch reconnects (the backends are located): in its grace, the current
        // group and rules are added, and nothing is deleted.
        ctl.handle_switch_up(now, switch_1(), &mut out);
        let msgs: Vec<Message> = out.drain().map(|(_, m)| m).collect();
        let pos = |f: &dyn Fn(&Message) -> bool| msgs.iter().position(f);
        let add = pos(&|m| {
            matches!(m, Message::GroupMod(g) if g.command == GroupModCommand::Other(OFPGC_ADD_OR_MOD) && g.group_id == group_id(0))
        })
        .expect("group added (or replaced)");
        let uses = pos(&uses_group).expect("a flow sends new connections to the group");
        assert!(add < uses);
        assert!(
            !msgs.iter().any(is_group_delete),
            "no group deleted in the grace"
        );
        assert!(
            generation_deletes(&msgs).is_empty(),
            "no rule deleted in the grace"
        );
        // No rule sends the VIP's new connections to the controller.
        let to_controller = msgs.iter().any(|m| match m {
            Message::FlowMod(fm) => {
                fm.match_.iter().any(|o| {
                    matches!(o, Oxm::Ipv4Dst { value, .. } if value.to_string() == VIP)
                }) && fm.instructions.iter().any(|i| match i {
                    Instruction::ApplyActions(a) => a
                        .iter()
                        .any(|a| matches!(a, Action::Output { port, .. } if *port == ofp::port::CONTROLLER)),
                    _ => false,
                })
            }
            _ => false,
        });
        assert!(!to_controller, "the intercept rule is replaced");
        let tables: Vec<u8> = msgs
            .iter()
            .filter_map(|m| match m {
                Message::FlowMod(fm) if fm.command == ofp::FlowModCommand::Add => Some(fm.table_id),
                _ => None,
            })
            .collect();
        assert!(tables.contains(&TABLE_CT) && tables.iter().all(|&t| t <= TABLE_CT));

        // The grace ends: two passes, one per generation bit, each adding before it deletes.
        ctl.handle_tick(now + grace, &mut out);
        let msgs: Vec<Message> = out
            .drain()
            .map(|(_, m)| m)
            .filter(|m| match m {
                Message::GroupMod(_) => true,
                Message::FlowMod(fm) => fm.cookie & cookie::KIND_MASK == COOKIE_KIND,
                _ => matches!(m, Message::BarrierRequest),
            })
            .collect();
        let pos = |f: &dyn Fn(&Message) -> bool| msgs.iter().position(f);
        let first_delete = pos(&|m| {
            matches!(m, Message::GroupMod(g) if g.command == GroupModCommand::Delete && g.group_id == GROUP_BASE + 1)
        })
        .expect("stale groups deleted by id range");
        // (The tick's own refresh may come first: a weight update, or the rules of the
        // backends' locations, found on this first tick. The settling passes follow.)
        let after = |from: usize, f: &dyn Fn(&Message) -> bool| {
            msgs[from..].iter().position(f).map(|i| from + i)
        };
        let add = after(first_delete, &|m| {
            matches!(m, Message::GroupMod(g) if g.command == GroupModCommand::Other(OFPGC_ADD_OR_MOD) && g.group_id == group_id(0))
        })
        .expect("group added (or replaced)");
        let uses = after(add, &uses_group).expect("a flow sends new connections to the group");
        // The group in use is never deleted; the rest of the range is, once per pass.
        let deletes: Vec<u32> = msgs
            .iter()
            .filter_map(|m| match m {
                Message::GroupMod(g) if g.command == GroupModCommand::Delete => Some(g.group_id),
                _ => None,
            })
            .collect();
        assert_eq!(deletes.len() as u32, 2 * (GROUP_RANGE - 1));
        assert!(!deletes.contains(&group_id(0)));
        // Make before break: no proactive rule is deleted before the rules of the new
        // generation are added, and the deletes take only the other generation.
        let gen_deletes = generation_deletes(&msgs);
        assert_eq!(gen_deletes.len(), 2, "one per pass");
        assert!(gen_deletes[0] > uses);
        assert!(matches!(msgs[gen_deletes[0] - 1], Message::BarrierRequest));
        let last_gen = match &msgs[gen_deletes[1]] {
            Message::FlowMod(fm) => fm.cookie & COOKIE_GEN,
            _ => unreachable!(),
        };
        let last_add = msgs[..gen_deletes[1]]
            .iter()
            .rev()
            .find_map(|m| match m {
                Message::FlowMod(fm) if fm.command == ofp::FlowModCommand::Add => Some(fm.cookie),
                _ => None,
            })
            .unwrap();
        assert_ne!(
            last_add & COOKIE_GEN,
            last_gen,
            "the pass keeps what it added"
        );
        // Settled once: the next tick sends no proactive deletes.
        ctl.handle_tick(now + grace * 2, &mut out);
        let later: Vec<Message> = out.drain().map(|(_, m)| m).collect();
        assert!(generation_deletes(&later).is_empty() && !later.iter().any(is_group_delete));
    }

    #[test]
    fn a_reconnected_switch_keeps_its_group_until_the_backends_are_located() {
        let (mut ctl, now) = controller("round-robin", &[1, 1, 1]);
        let mut out = Outbox::new();
        ctl.handle_tick(now, &mut out);
        out.drain().for_each(drop);
        // A restarted controller: nothing located when the switch connects.
        for b in &mut ctl.services[0].backends {
            b.mac = None;
        }
        ctl.services[0].sync_eligibility();
        ctl.handle_switch_down(now, 1, &mut out);
        ctl.handle_switch_up(now, switch_1(), &mut out);
        let proactive = |out: &mut Outbox| -> Vec<Message> {
            out.drain()
                .map(|(_, m)| m)
                .filter(|m| match m {
                    Message::GroupMod(_) => true,
                    Message::FlowMod(fm) => fm.cookie & cookie::KIND_MASK == COOKIE_KIND,
                    _ => false,
                })
                .collect()
        };
        assert_eq!(
            proactive(&mut out),
            [],
            "nothing proactive before the backends are placed"
        );
        // Two of three located: a group now would give the third nothing; still nothing.
        let t = now + Duration::from_millis(100);
        for (i, b) in ctl.services[0].backends.iter_mut().enumerate().take(2) {
            b.mac = Some(MacAddr([2, 0, 0, 0, 0, i as u8 + 2]));
        }
        ctl.services[0].sync_eligibility();
        ctl.handle_tick(t, &mut out);
        assert_eq!(proactive(&mut out), []);
        // All three: the group with a bucket weight for each, and the rules, added only.
        ctl.services[0].backends[2].mac = Some(MacAddr([2, 0, 0, 0, 0, 4]));
        ctl.services[0].sync_eligibility();
        ctl.handle_tick(t + Duration::from_millis(100), &mut out);
        let msgs = proactive(&mut out);
        let g: Vec<&GroupMod> = msgs
            .iter()
            .filter_map(|m| match m {
                Message::GroupMod(g) => Some(g),
                _ => None,
            })
            .collect();
        assert_eq!(g.len(), 1, "{g:?}");
        assert!(weights(g[0]).iter().all(|&w| w > 0), "{g:?}");
        assert!(msgs.iter().any(uses_group));
        assert!(generation_deletes(&msgs).is_empty());
    }

    #[test]
    fn weights_follow_the_algorithm_and_a_drain_zeroes_a_bucket_at_once() {
        let (mut ctl, now) = controller("weighted-round-robin", &[1, 2, 1]);
        let mut out = Outbox::new();
        // The first tick sees the backends located: a resync with the balancer's weights.
        ctl.handle_tick(now, &mut out);
        let g = groups(&mut out);
        assert_eq!(g.len(), 1, "{g:?}");
        assert_eq!(g[0].command, GroupModCommand::Other(OFPGC_ADD_OR_MOD));
        assert_eq!(weights(&g[0]), [25, 50, 25]);
        assert_eq!(ctl.proactive_weights(0), Some(&[25, 50, 25][..]));

        assert!(ctl.set_admin(now, 0, 1, AdminState::Draining));
        let t = now + Duration::from_millis(10);
        ctl.handle_tick(t, &mut out);
        let g = groups(&mut out);
        assert_eq!(g.len(), 1, "{g:?}");
        assert_eq!(g[0].command, GroupModCommand::Other(OFPGC_ADD_OR_MOD));
        assert_eq!(weights(&g[0]), [50, 0, 50]);
        // Nothing changes: nothing is sent.
        ctl.handle_tick(t + Duration::from_millis(10), &mut out);
        assert!(groups(&mut out).is_empty());
    }

    /// A backend's removal sends the group at once (before the next tick computes
    /// weights for the new pool): each backend that stays keeps its own last weight. By
    /// position, each later backend took its neighbour's: here the drained backend's 0
    /// went to a live one, and the removed one's 25 to the heavy one.
    #[test]
    fn a_removal_leaves_each_remaining_bucket_its_own_weight() {
        let (mut ctl, now) = controller("weighted-round-robin", &[1, 2, 1]);
        let mut out = Outbox::new();
        ctl.handle_tick(now, &mut out);
        assert_eq!(weights(&groups(&mut out)[0]), [25, 50, 25]);
        assert!(ctl.set_admin(now, 0, 1, AdminState::Draining));
        let t = now + Duration::from_millis(10);
        ctl.handle_tick(t, &mut out);
        assert_eq!(weights(&groups(&mut out)[0]), [50, 0, 50]);
        ctl.remove_backend(t, 0, 0, &mut out).expect("removed");
        let g = groups(&mut out);
        assert_eq!(g.len(), 1, "{g:?}");
        assert_eq!(
            weights(&g[0]),
            [0, 50],
            "10.0.0.3 drained, 10.0.0.4 as before"
        );
    }

    /// A backend removed from the pool keeps its rules for the connections conntrack
    /// holds to it: written again, before the other generation's delete (which spares
    /// them), with the retiring bit and the service's idle timeout; the backend that
    /// comes back has its rules written as before, without a timeout.
    #[test]
    fn a_removed_backend_retires_its_rules_by_idle_timeout() {
        let (mut ctl, now, _) = past_grace(&[1, 1, 1]);
        let mut out = Outbox::new();
        let idle = ctl.services[0].cfg.idle_timeout_secs;
        let gone: Ipv4Addr = "10.0.0.3".parse().expect("address");
        let names = |fm: &FlowMod, a: Ipv4Addr| {
            fm.match_.iter().any(|o| {
                matches!(o, Oxm::Ipv4Src { value, .. } | Oxm::Ipv4Dst { value, .. } if *value == a)
            })
        };
        let t = now;
        ctl.remove_backend(t, 0, 1, &mut out).expect("removed");
        let msgs: Vec<Message> = out.drain().map(|(_, m)| m).collect();
        let retiring: Vec<(usize, &FlowMod)> = msgs
            .iter()
            .enumerate()
            .filter_map(|(i, m)| match m {
                Message::FlowMod(fm) if fm.cookie & COOKIE_RETIRE != 0 => Some((i, fm)),
                _ => None,
            })
            .collect();
        assert_eq!(retiring.len(), 4, "its four rules: {retiring:?}");
        for (_, fm) in &retiring {
            assert_eq!(fm.command, ofp::FlowModCommand::Add);
            assert_eq!(fm.idle_timeout, idle);
            assert_eq!(fm.hard_timeout, 0);
            assert!(names(fm, gone), "{fm:?}");
        }
        let delete = generation_deletes(&msgs);
        assert_eq!(delete.len(), 1);
        assert!(
            retiring.iter().all(|(i, _)| *i < delete[0]),
            "retired before the delete"
        );
        // No rule of the new generation names it; the other backends' rules carry no timeout.
        let normal = |msgs: &[Message], a: Ipv4Addr| {
            msgs.iter()
                .filter(|m| match m {
                    Message::FlowMod(fm) => {
                        fm.command == ofp::FlowModCommand::Add
                            && fm.cookie & COOKIE_RETIRE == 0
                            && fm.idle_timeout == 0
                            && names(fm, a)
                    }
                    _ => false,
                })
                .count()
        };
        assert_eq!(normal(&msgs, gone), 0);
        assert_eq!(normal(&msgs, "10.0.0.2".parse().expect("address")), 4);
        // The next resync retires nothing more.
        ctl.handle_tick(t + Duration::from_millis(10), &mut out);
        let later: Vec<Message> = out.drain().map(|(_, m)| m).collect();
        assert!(
            !later
                .iter()
                .any(|m| matches!(m, Message::FlowMod(fm) if fm.cookie & COOKIE_RETIRE != 0))
        );
        // Back in the pool: its rules as before (they replace the retiring ones, §6.4).
        let cfg = crate::config::BackendConfig {
            address: gone,
            weight: 1,
            metrics: None,
            mac: None,
            capacity_rps: None,
        };
        ctl.add_backend(t, 0, cfg, &mut out).expect("added");
        out.drain().for_each(drop);
        // Located again (as ARP would find it): the next tick writes its rules.
        for b in &mut ctl.services[0].backends {
            b.mac.get_or_insert(MacAddr([2, 0, 0, 0, 0, 3]));
        }
        ctl.handle_tick(t + Duration::from_millis(20), &mut out);
        let msgs: Vec<Message> = out.drain().map(|(_, m)| m).collect();
        assert_eq!(normal(&msgs, gone), 4);
    }

    /// A service that leaves the proactive mode (here by a reload to the reactive mode)
    /// keeps its VIP's connections: the VIP's conntrack rule is written again a priority
    /// above the reactive intercept, with the retiring bit and the idle timeout, and so
    /// are its backends' rules. Proactive again, the retiring VIP rule is deleted.
    #[test]
    fn a_vip_that_leaves_the_proactive_mode_retires_its_rules() {
        let (mut ctl, now, _) = past_grace(&[1, 1]);
        let mut out = Outbox::new();
        let reload = |ctl: &mut Controller, mode: &str, out: &mut Outbox| -> Vec<Message> {
            ctl.reload(now, &web(mode, &[2, 3]), out);
            out.drain().map(|(_, m)| m).collect()
        };
        let msgs = reload(&mut ctl, "", &mut out);
        let vip: Ipv4Addr = VIP.parse().expect("address");
        let retiring: Vec<&FlowMod> = msgs
            .iter()
            .filter_map(|m| match m {
                Message::FlowMod(fm) if fm.cookie & COOKIE_RETIRE != 0 => Some(fm),
                _ => None,
            })
            .collect();
        let vip_rule = retiring
            .iter()
            .find(|fm| {
                fm.table_id == 0
                    && fm
                        .match_
                        .iter()
                        .any(|o| matches!(o, Oxm::Ipv4Dst { value, .. } if *value == vip))
            })
            .expect("the VIP's conntrack rule, retiring");
        // Above the gap rules, which are above the intercept.
        assert!(vip_rule.priority > rules::PRIO_GAP && rules::PRIO_GAP > rules::PRIO_INTERCEPT);
        assert!(vip_rule.priority < rules::PRIO_CONN);
        assert_eq!(vip_rule.idle_timeout, ctl.services[0].cfg.idle_timeout_secs);
        // Its reply rule and its pass for the invalid, each backend's four (both are
        // located), and table 1's three catch-alls (no proactive service is left).
        assert_eq!(retiring.len(), 3 + 2 * 4 + 3, "{retiring:#?}");
        // The reactive intercept is there, below it, and comes after it: the proactive
        // rule it shares a priority with is never the old connections' only rule.
        let at = |pred: &dyn Fn(&FlowMod) -> bool| {
            msgs.iter()
                .position(|m| matches!(m, Message::FlowMod(fm) if pred(fm)))
        };
        let intercept = at(&|fm| {
            fm.command == ofp::FlowModCommand::Add
                && fm.priority == rules::PRIO_INTERCEPT
                && fm.cookie & cookie::KIND_MASK == cookie::RuleKind::Intercept.base()
        })
        .expect("the reactive intercept");
        let retiring_at = at(&|fm| fm == *vip_rule).expect("the retiring VIP rule");
        assert!(retiring_at < intercept, "{msgs:#?}");

        let vip_rule = (*vip_rule).clone();
        let msgs = reload(&mut ctl, "mode = \"proactive\"\n", &mut out);
        let deleted = msgs.iter().any(|m| {
            matches!(m, Message::FlowMod(del)
            if del.command == ofp::FlowModCommand::Delete && deletes(del, &vip_rule))
        });
        assert!(
            deleted,
            "the retiring VIP rule goes when the VIP is proactive again"
        );
    }

    /// A service turned partitioned keeps its proactive connections. Its VIP's conntrack
    /// rule retires above every partition rule (below them the old connections' packets
    /// went to a partition's owner, VIP unchanged, which reset them), table 1 passes the
    /// VIP's invalid on (a new partitioned connection's segments after its SYN), and the
    /// reply rule, the only one the old connections' answers pass, reports its end. When
    /// it does, the switch that reported it deletes the VIP's retiring rules, in both
    /// tables, and nothing else.
    #[test]
    fn a_vip_turned_partitioned_retires_above_the_partitions_until_its_replies_end() {
        let (mut ctl, now, _) = past_grace(&[1, 1]);
        let mut out = Outbox::new();
        let partitioned = web("mode = \"partitioned\"\npartition_bits = 2\n", &[2, 3]);
        ctl.reload(now, &partitioned, &mut out);
        ctl.handle_tick(now + Duration::from_millis(20), &mut out);
        let sent: Vec<FlowMod> = out
            .drain()
            .filter_map(|(_, m)| match m {
                Message::FlowMod(fm) if fm.command == ofp::FlowModCommand::Add => Some(fm),
                _ => None,
            })
            .collect();

        let vip: Ipv4Addr = VIP.parse().expect("address");
        let names = |fm: &FlowMod, dst: bool| {
            fm.match_.iter().any(|o| match o {
                Oxm::Ipv4Dst { value, .. } => dst && *value == vip,
                Oxm::Ipv4Src { value, .. } => !dst && *value == vip,
                _ => false,
            })
        };
        let retiring: Vec<&FlowMod> = sent
            .iter()
            .filter(|f| f.cookie & COOKIE_RETIRE != 0)
            .collect();
        let of_vip = |table_id: u8, dst: bool| -> Vec<(u16, FlowModFlags)> {
            retiring
                .iter()
                .filter(|f| f.table_id == table_id && names(f, dst))
                .map(|f| (f.priority, f.flags))
                .collect()
        };
        let vip_rule = of_vip(0, true);
        assert_eq!(vip_rule.len(), 1, "{vip_rule:?}");
        // Above the partition rules, the moving ones the higher (the backends here are
        // not on a port, so none are written: the OVS test sees both).
        let partition = super::super::partition::PRIO_PARTITION;
        assert!(vip_rule[0].0 > partition.max(super::super::partition::PRIO_MOVING));
        assert_eq!(
            of_vip(TABLE_CT, true),
            [(PRIO_INV_PASS, FlowModFlags::empty())],
            "the invalid to the VIP go on, above their drop"
        );
        let pass_idle: Vec<u16> = retiring
            .iter()
            .filter(|f| f.table_id == TABLE_CT && names(f, true))
            .map(|f| f.idle_timeout)
            .collect();
        assert_eq!(
            pass_idle,
            [0],
            "the pass ends with the reply rule, not by itself"
        );
        assert_eq!(
            of_vip(TABLE_CT, false),
            [(PRIO_EST, FlowModFlags::SEND_FLOW_REM)]
        );
        assert_eq!(retiring.len(), 3 + 2 * 4 + 3, "VIP, backends, catch-alls");
        let catch_alls: Vec<u16> = retiring
            .iter()
            .filter(|f| {
                f.table_id == TABLE_CT
                    && !f
                        .match_
                        .iter()
                        .any(|o| matches!(o, Oxm::Ipv4Src { .. } | Oxm::Ipv4Dst { .. }))
            })
            .map(|f| f.idle_timeout)
            .collect();
        assert_eq!(catch_alls, [0, 0, 0], "table 1's catch-alls stay");

        // The reply rule ends: the switch that reported it is told to delete the VIP's
        // retiring rules, and the delete takes those and no other.
        let ended = ofp::FlowRemoved {
            cookie: COOKIE_KIND | COOKIE_RETIRE | 0xffff,
            priority: PRIO_EST,
            reason: ofp::FlowRemovedReason::IdleTimeout,
            table_id: TABLE_CT,
            duration_sec: 9,
            duration_nsec: 0,
            idle_timeout: 2,
            hard_timeout: 0,
            packet_count: 40,
            byte_count: 4000,
            match_: ip_src(tcp(), vip).with(Oxm::TcpSrc(80)).with(tracked()),
        };
        ctl.handle_message(now, 7, &Message::FlowRemoved(ended.clone()), &mut out);
        let answer: Vec<(Dpid, Message)> = out.drain().collect();
        let [(7, Message::FlowMod(del))] = &answer[..] else {
            panic!("one delete, to the switch that reported: {answer:?}");
        };
        let taken: Vec<(u8, u16)> = sent
            .iter()
            .filter(|f| deletes(del, f))
            .map(|f| (f.table_id, f.priority))
            .collect();
        assert_eq!(taken, [(0, vip_rule[0].0), (TABLE_CT, PRIO_INV_PASS)]);

        // Any other rule's end (here a table-0 one) deletes nothing.
        let other = ofp::FlowRemoved {
            table_id: 0,
            ..ended
        };
        ctl.handle_message(now, 7, &Message::FlowRemoved(other), &mut out);
        assert!(out.is_empty());
    }

    /// A switch that (re)connects reports its retiring rules; a retiring VIP rule whose
    /// reply rule ended while no controller heard it (here, a controller started since,
    /// with the service reactive) is deleted, and one whose reply rule is still there stays
    /// for it to report its end.
    #[test]
    fn a_connecting_switch_loses_a_retiring_vip_rule_that_outlived_its_reply_rule() {
        let (mut ctl, now, _) = past_grace(&[1, 1]);
        let mut out = Outbox::new();
        let cfg = web("", &[2, 3]);
        ctl.reload(now, &cfg, &mut out);
        // The switch's retiring rules, as its flow stats give them.
        let held: Vec<ofp::FlowStats> = out
            .drain()
            .filter_map(|(_, m)| match m {
                Message::FlowMod(fm) if fm.cookie & COOKIE_RETIRE != 0 => Some(as_stats(fm)),
                _ => None,
            })
            .collect();
        let vip_rule = held
            .iter()
            .find(|f| f.table_id == 0 && f.priority == PRIO_RETIRING_VIP)
            .expect("the VIP's retiring rule");
        let vip_rule = FlowMod {
            cookie: vip_rule.cookie,
            priority: vip_rule.priority,
            match_: vip_rule.match_.clone(),
            ..FlowMod::add(Match::new())
        };
        let is_reply = |f: &ofp::FlowStats| f.flags == FlowModFlags::SEND_FLOW_REM;
        assert_eq!(held.iter().filter(|f| is_reply(f)).count(), 1);

        let deletes_on_connect = |stats: Vec<ofp::FlowStats>| -> Vec<FlowMod> {
            reported_to_fresh(&cfg, now, stats)
                .into_iter()
                .filter(|fm| fm.command == ofp::FlowModCommand::Delete)
                .collect()
        };
        // The reply rule is still there: nothing goes.
        assert!(deletes_on_connect(held.clone()).is_empty());
        // It ended unheard: the VIP's retiring rules go (its conntrack rule and its pass for
        // the invalid), and no other.
        let without_reply: Vec<ofp::FlowStats> =
            held.iter().filter(|f| !is_reply(f)).cloned().collect();
        let dels = deletes_on_connect(without_reply.clone());
        assert_eq!(dels.len(), 1, "{dels:?}");
        let taken: Vec<(u8, u16)> = without_reply
            .iter()
            .map(|f| FlowMod {
                table_id: f.table_id,
                cookie: f.cookie,
                priority: f.priority,
                match_: f.match_.clone(),
                ..FlowMod::add(Match::new())
            })
            .filter(|fm| deletes(&dels[0], fm))
            .map(|fm| (fm.table_id, fm.priority))
            .collect();
        assert_eq!(taken, [(0, PRIO_RETIRING_VIP), (TABLE_CT, PRIO_INV_PASS)]);
        assert!(deletes(&dels[0], &vip_rule));
        // Only the pass is left (the VIP rule idled out too): it has no timeout, so it
        // goes the same way.
        let pass_only: Vec<ofp::FlowStats> = without_reply
            .iter()
            .filter(|f| f.table_id == TABLE_CT && f.priority == PRIO_INV_PASS)
            .filter(|f| f.match_.iter().any(|o| matches!(o, Oxm::Ipv4Dst { .. })))
            .cloned()
            .collect();
        assert_eq!(pass_only.len(), 1);
        let vip_delete = dels[0].clone();
        assert_eq!(deletes_on_connect(pass_only), [vip_delete]);
    }

    /// A rule as a switch's flow stats give it.
    fn as_stats(fm: FlowMod) -> ofp::FlowStats {
        ofp::FlowStats {
            table_id: fm.table_id,
            duration_sec: 30,
            duration_nsec: 0,
            priority: fm.priority,
            idle_timeout: fm.idle_timeout,
            hard_timeout: 0,
            flags: fm.flags,
            cookie: fm.cookie,
            packet_count: 9,
            byte_count: 900,
            match_: fm.match_,
            instructions: fm.instructions,
        }
    }

    /// The FLOW_MODs a controller just started with `cfg` sends switch 1 once the switch
    /// has reported `stats` as its proactive rules (after what it sends at switch-up).
    fn reported_to_fresh(cfg: &Config, now: Instant, stats: Vec<ofp::FlowStats>) -> Vec<FlowMod> {
        let mut fresh = Controller::new(cfg);
        let mut out = Outbox::new();
        fresh.handle_switch_up(now, switch_1(), &mut out);
        let asked = out.drain().any(|(_, m)| {
            matches!(m,
            Message::MultipartRequest(ofp::MultipartRequest {
                body: ofp::MultipartRequestBody::Flow(ref r), ..
            }) if r.cookie == COOKIE_KIND && r.cookie_mask == cookie::KIND_MASK)
        });
        assert!(asked, "the switch is asked for its proactive rules");
        let reply = Message::MultipartReply(ofp::MultipartReply {
            flags: 0,
            body: ofp::MultipartReplyBody::Flow(stats),
        });
        fresh.handle_message(now, 1, &reply, &mut out);
        out.drain()
            .filter_map(|(d, m)| match m {
                Message::FlowMod(fm) => {
                    assert_eq!(d, 1);
                    Some(fm)
                }
                _ => None,
            })
            .collect()
    }

    /// A controller started with another configuration than the one whose rules a switch
    /// holds (or whose backends left while none was connected) retires, when the switch
    /// reports them, the backends and VIPs those rules serve and no proactive service has
    /// now: the generation's delete at the end of the switch's grace took their
    /// connections with them.
    #[test]
    fn a_connecting_switch_retires_what_its_rules_serve_and_no_service_has_now() {
        let (_, now, sent) = past_grace(&[1, 1]);
        let held: Vec<ofp::FlowStats> = sent
            .into_iter()
            .filter_map(|m| match m {
                Message::FlowMod(fm)
                    if fm.command == ofp::FlowModCommand::Add
                        && fm.cookie & cookie::KIND_MASK == COOKIE_KIND =>
                {
                    Some(as_stats(fm))
                }
                _ => None,
            })
            .collect();
        let retiring = |cfg: &Config| -> Vec<FlowMod> {
            reported_to_fresh(cfg, now, held.clone())
                .into_iter()
                .filter(|fm| fm.cookie & COOKIE_RETIRE != 0)
                .collect()
        };
        let proactive = "mode = \"proactive\"\n";
        assert!(retiring(&web(proactive, &[2, 3])).is_empty(), "the same");

        // 10.0.0.3 left: its four rules retire (its MAC from table 1's rewrite), with the
        // idle timeout of the service.
        let gone: Ipv4Addr = "10.0.0.3".parse().expect("address");
        let rules = retiring(&web(proactive, &[2]));
        assert_eq!(rules.len(), 4, "{rules:#?}");
        let names = |fm: &FlowMod, a: Ipv4Addr| {
            fm.match_.iter().any(|o| {
                matches!(o, Oxm::Ipv4Src { value, .. } | Oxm::Ipv4Dst { value, .. } if *value == a)
            })
        };
        assert!(
            rules
                .iter()
                .all(|fm| names(fm, gone) && fm.idle_timeout == 30)
        );
        let mac = MacAddr([2, 0, 0, 0, 0, 3]);
        assert!(
            rules
                .iter()
                .any(|fm| fm.instructions.iter().any(|i| matches!(i,
            Instruction::ApplyActions(a) if a.iter().any(|a| matches!(a,
                Action::SetField(Oxm::EthDst { value, .. }) if *value == mac.0)))))
        );

        // Reactive now: the VIP retires above the intercept, with its reply rule (its
        // virtual MAC from the reply rule's rewrite) and its pass for the invalid, both
        // backends, and the catch-alls.
        let rules = retiring(&web("", &[2, 3]));
        let vip: Ipv4Addr = VIP.parse().expect("address");
        assert_eq!(rules.len(), 3 + 2 * 4 + 3, "{rules:#?}");
        assert!(
            rules
                .iter()
                .any(|fm| fm.table_id == 0 && fm.priority == PRIO_RETIRING_VIP && names(fm, vip))
        );
        assert!(
            rules
                .iter()
                .any(|fm| fm.flags == FlowModFlags::SEND_FLOW_REM && names(fm, vip))
        );
    }

    /// Whether the non-strict delete `del` takes the rule `fm` (§6.4: every field of the
    /// delete's match in the rule's, and the cookie filter; the tables and priorities
    /// here are all).
    fn deletes(del: &FlowMod, fm: &FlowMod) -> bool {
        assert_eq!(del.command, ofp::FlowModCommand::Delete);
        assert_eq!(del.table_id, rules::TABLE_ALL);
        fm.cookie & del.cookie_mask == del.cookie & del.cookie_mask
            && del.match_.iter().all(|o| fm.match_.iter().any(|f| f == o))
    }

    /// Two proactive services, each with its own port and backends.
    fn two_services(web_first: bool) -> String {
        let web = format!(
            "[[service]]\nname = \"web\"\nvip = \"{VIP}\"\nport = 80\nmode = \"proactive\"\n\
             [service.health]\nkind = \"none\"\n\
             [[service.backend]]\naddress = \"10.0.0.2\"\n[[service.backend]]\naddress = \"10.0.0.3\"\n"
        );
        let api = "[[service]]\nname = \"api\"\nvip = \"10.0.0.101\"\nport = 8080\nmode = \"proactive\"\n\
             [service.health]\nkind = \"none\"\n\
             [[service.backend]]\naddress = \"10.0.0.4\"\n[[service.backend]]\naddress = \"10.0.0.5\"\n";
        if web_first {
            web + api
        } else {
            api.to_string() + &web
        }
    }

    /// The group each service's rules name, from a sync's messages: VIP → group id.
    fn groups_named(msgs: &[Message]) -> BTreeMap<Ipv4Addr, u32> {
        let mut v = BTreeMap::new();
        for m in msgs {
            let Message::FlowMod(fm) = m else { continue };
            let vip = fm.match_.iter().find_map(|o| match o {
                Oxm::Ipv4Dst { value, .. } => Some(*value),
                _ => None,
            });
            for i in fm.instructions.iter() {
                if let Instruction::ApplyActions(a) = i {
                    for a in a.iter() {
                        if let (Action::Group(g), Some(vip)) = (a, vip) {
                            v.insert(vip, *g);
                        }
                    }
                }
            }
        }
        v
    }

    /// A reload that reorders proactive services leaves each its group: the group is
    /// named by the service's slot. By place, the first group written (ADD_OR_MOD) gave
    /// the other service's buckets, NAT to other backends on another port, to the rules
    /// still naming it, until their own replacement arrived: connections opened in that
    /// window were committed to the wrong service.
    #[test]
    fn a_reordering_reload_leaves_each_proactive_service_its_group() {
        let cfg = Config::from_toml(&two_services(true), &|_| None).expect("valid");
        let mut ctl = Controller::new(&cfg);
        let now = Instant::now();
        let mut out = Outbox::new();
        ctl.handle_switch_up(now, switch_1(), &mut out);
        for s in &mut ctl.services {
            for b in &mut s.backends {
                b.mac = Some(MacAddr([2, 0, 0, 0, 0, b.address.octets()[3]]));
            }
            s.sync_eligibility();
        }
        let grace = ctl.config().reconnect_grace;
        ctl.handle_tick(now + grace, &mut out);
        let before: Vec<Message> = out.drain().map(|(_, m)| m).collect();
        let named = groups_named(&before);
        assert_eq!(named.len(), 2, "{named:?}");
        // Where each group's buckets send a connection (their NAT actions).
        let buckets_of = |msgs: &[Message]| -> BTreeMap<u32, Vec<Actions>> {
            msgs.iter()
                .filter_map(|m| match m {
                    Message::GroupMod(g) if g.command != GroupModCommand::Delete => Some((
                        g.group_id,
                        g.buckets.iter().map(|b| b.actions.clone()).collect(),
                    )),
                    _ => None,
                })
                .collect()
        };
        let buckets = buckets_of(&before);

        let cfg = Config::from_toml(&two_services(false), &|_| None).expect("valid");
        ctl.reload(now + grace, &cfg, &mut out);
        let after: Vec<Message> = out.drain().map(|(_, m)| m).collect();
        assert_eq!(
            groups_named(&after),
            named,
            "each VIP names the group it named"
        );
        let rewritten = buckets_of(&after);
        assert!(!rewritten.is_empty());
        for (id, b) in &rewritten {
            assert_eq!(
                Some(b),
                buckets.get(id),
                "group {id:#x} keeps its service's buckets"
            );
        }
    }

    #[test]
    fn least_connections_weights_follow_reported_load() {
        let (mut ctl, now) = controller("least-connections", &[1, 1, 1]);
        let mut out = Outbox::new();
        ctl.handle_tick(now, &mut out);
        let g = groups(&mut out);
        let w = weights(&g[0]);
        assert!(w.iter().all(|&x| (33..=34).contains(&x)), "{w:?}");
        // Backend 0 reports 60 requests in progress, the others none.
        for (b, active) in [(0, 60.0), (1, 0.0), (2, 0.0)] {
            ctl.handle_backend_load(
                now,
                0,
                b,
                crate::metrics_text::LoadSample {
                    rps: None,
                    active: Some(active),
                    response_time_ms: None,
                    cpu: None,
                },
            );
        }
        let t = now + Duration::from_secs(1);
        ctl.handle_tick(t, &mut out);
        let g = groups(&mut out);
        assert_eq!(g.len(), 1);
        let w = weights(&g[0]);
        // Water-filling the headroom: each simulated pick counts as in flight (active and
        // recent pick, as a real pick does), so over (60, 0, 0) active the idle two take
        // the first 60 picks, then the three share the rest: [14, 43, 43].
        assert_eq!(w, [14, 43, 43]);
    }

    #[test]
    fn config_rejects_per_connection_algorithms_and_services_without_a_vip() {
        for alg in ["isslm", "none"] {
            let c = format!(
                "[[service]]\nname = \"web\"\nvip = \"{VIP}\"\nport = 80\nalgorithm = \"{alg}\"\nmode = \"proactive\"\nthreshold_rps = 10.0\n[[service.backend]]\naddress = \"10.0.0.2\"\n"
            );
            let e = Config::from_toml(&c, &|_| None).unwrap_err().to_string();
            assert!(
                e.contains("service[0].mode") && e.contains("reactive"),
                "{alg}: {e}"
            );
        }
        let c = "[[service]]\nname = \"web\"\nport = 80\nmode = \"proactive\"\n[[service.backend]]\naddress = \"10.0.0.2\"\n";
        let e = Config::from_toml(c, &|_| None).unwrap_err().to_string();
        assert!(e.contains("needs a vip"), "{e}");
        let c = "[[service]]\nname = \"web\"\nvip = \"10.0.0.100\"\nport = 80\nmode = \"sideways\"\n[[service.backend]]\naddress = \"10.0.0.2\"\n";
        let e = Config::from_toml(c, &|_| None).unwrap_err().to_string();
        assert!(e.contains("\"reactive\", \"proactive\""), "{e}");
        let c = "[[service]]\nname = \"web\"\nvip = \"10.0.0.100\"\nport = 80\n[[service.backend]]\naddress = \"10.0.0.2\"\n";
        let cfg = Config::from_toml(c, &|_| None).unwrap();
        assert_eq!(cfg.services[0].mode, ServiceMode::Reactive);
    }
}
