//! Rules that outlive their mode: a backend that leaves every proactive pool, and a VIP
//! that leaves the proactive mode, keep carrying the connections conntrack holds to them
//! (see the parent module's doc), and a switch that connects is checked for what an
//! earlier run, or an earlier session, left on it.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use flowgate_packet::MacAddr;
use ofp::{Action, FlowMod, FlowModFlags, Instruction, Message, Oxm};

use super::{
    COOKIE_KIND, COOKIE_RETIRE, PRIO_EST, PRIO_INV_PASS, PRIO_RETIRING_VIP,
    PRIO_RETIRING_VIP_PARTITIONED, TABLE_CT, acts, added, backend_flows, catch_alls, ct_state,
    nicira, to_vip, vip_flows,
};
use crate::config::{DEFAULT_IDLE_TIMEOUT_SECS, ServiceMode};
use crate::controller::ended::{RuleEnded, Tuple};
use crate::controller::{Controller, Outbox, rules};
use crate::cookie;
use crate::topology::Dpid;

/// The cookie of every retiring rule.
const RETIRING: u64 = COOKIE_KIND | COOKIE_RETIRE | 0xffff;

/// What a connecting switch reports of its proactive rules, while its report comes in.
#[derive(Debug, Default)]
pub(crate) struct Report {
    /// Retiring VIP rules, by which of them were seen.
    retiring_vips: BTreeMap<(Ipv4Addr, u16), RetiringVip>,
    /// The backends a generation's rules serve, with their MAC where table 1 names it.
    backends: BTreeMap<(Ipv4Addr, u16), Option<MacAddr>>,
    /// The VIPs a generation's rules serve, with their virtual MAC (the reply rule's).
    vips: BTreeMap<(Ipv4Addr, u16), MacAddr>,
}

/// Which of a retiring VIP's rules a connecting switch reports.
#[derive(Debug, Default, Clone, Copy)]
struct RetiringVip {
    /// Its conntrack rule in table 0.
    vip_rule: bool,
    /// Its reply rule, the one that reports its end.
    reply: bool,
    /// Its pass for the invalid in table 1.
    pass: bool,
}

/// Deletes a VIP's retiring rules, in both tables, and no other: its packets' conntrack
/// rule (at whichever priority it retired) and its pass for the invalid (a non-strict
/// delete takes every rule whose match holds this one's, §6.4, and the cookie filter only
/// retiring ones). Its reply rule (`ip_src`) is not taken: it is the one that ended, or a
/// live one replaced it.
pub(super) fn retiring_vip_delete(key: (Ipv4Addr, u16)) -> Message {
    let mut del = FlowMod::delete(to_vip(key));
    del.cookie = COOKIE_KIND | COOKIE_RETIRE;
    del.cookie_mask = cookie::KIND_MASK | COOKIE_RETIRE;
    Message::FlowMod(del)
}

/// The MAC address a rule's actions set (`eth_src` or `eth_dst`).
fn mac_set(fs: &ofp::FlowStats, src: bool) -> Option<MacAddr> {
    fs.instructions.iter().find_map(|i| match i {
        Instruction::ApplyActions(a) => a.iter().find_map(|a| match a {
            Action::SetField(Oxm::EthSrc { value, .. }) if src => Some(MacAddr(*value)),
            Action::SetField(Oxm::EthDst { value, .. }) if !src => Some(MacAddr(*value)),
            _ => None,
        }),
        _ => None,
    })
}

impl Controller {
    /// A backend that left every proactive pool, and a VIP that left the proactive mode,
    /// keep their rules for the connections conntrack still holds: they are written
    /// again, before the other generation's delete, with [`COOKIE_RETIRE`] (which no
    /// generation's delete takes) and the idle timeout of their services, and the switch
    /// removes them once none of their connections has sent a packet for that long
    /// (§6.5). Deleted with the rest, they took the live connections with them (on OVS a
    /// download stopped at 50 kB of 5 MB). Only a backend that left every pool: a rule it
    /// shares with a staying pool is written normally, and two rules with one match and
    /// priority are one rule (§6.4).
    pub(super) fn retiring_flows(&mut self) -> Vec<Message> {
        let mut now: BTreeMap<(Ipv4Addr, u16), (Option<MacAddr>, u16)> = BTreeMap::new();
        let mut vips: BTreeMap<(Ipv4Addr, u16), (MacAddr, u16)> = BTreeMap::new();
        for s in self
            .services
            .iter()
            .enumerate()
            .filter(|&(i, _)| self.is_proactive(i))
            .map(|(_, s)| s)
        {
            let idle = s.cfg.idle_timeout_secs;
            if let Some(vip) = s.cfg.vip {
                vips.insert((vip, s.cfg.port), (s.cfg.virtual_mac, idle));
            }
            for b in &s.backends {
                let e = now.entry((b.address, s.cfg.port)).or_insert((b.mac, idle));
                e.1 = e.1.max(idle);
            }
        }
        let mut v = Vec::new();
        let before = std::mem::replace(&mut self.proactive.synced_backends, now);
        for ((addr, port), (mac, idle)) in before {
            if !self.proactive.synced_backends.contains_key(&(addr, port)) {
                backend_flows(RETIRING, idle.max(1), addr, port, mac, &mut v);
            }
        }
        let before = std::mem::replace(&mut self.proactive.synced_vips, vips);
        for (key, (mac, idle)) in before {
            if !self.proactive.synced_vips.contains_key(&key) {
                self.retire_vip(key, mac, idle, &mut v);
            }
        }
        self.retiring_catch_alls(&mut v);
        // A VIP proactive again: its own rule takes over from the retiring one, which (a
        // priority above it) would otherwise shadow it until idle.
        let back: Vec<(Ipv4Addr, u16)> = self
            .proactive
            .retired_vips
            .iter()
            .filter(|k| self.proactive.synced_vips.contains_key(k))
            .copied()
            .collect();
        for key in back {
            self.proactive.retired_vips.remove(&key);
            v.push(retiring_vip_delete(key));
        }
        v
    }

    /// The retiring rules of a VIP that left the proactive mode: its conntrack rule a
    /// priority above what its service (if any) has now, its reply rule reporting its
    /// end, and the pass for the invalid. The pass has no timeout of its own: the reply
    /// rule's end takes it with the rest (`proactive_rule_ended`). Where conntrack picks
    /// up connections mid-stream (Open vSwitch's own) hardly a packet uses it, so by its
    /// own idle timer it ended while the VIP's other rules lived on, and after that, on a
    /// strict conntrack, a deferred reactive handshake's ACK to the VIP was dropped.
    fn retire_vip(
        &mut self,
        (vip, port): (Ipv4Addr, u16),
        mac: MacAddr,
        idle: u16,
        v: &mut Vec<Message>,
    ) {
        let partitioned = self.services.iter().any(|s| {
            s.cfg.vip == Some(vip) && s.cfg.port == port && s.cfg.mode == ServiceMode::Partitioned
        });
        let (idle, ends) = (idle.max(1), FlowModFlags::SEND_FLOW_REM);
        let at = if partitioned {
            PRIO_RETIRING_VIP_PARTITIONED
        } else {
            PRIO_RETIRING_VIP
        };
        vip_flows(RETIRING, idle, at, (vip, port), mac, ends, v);
        let invalid = ct_state::INV | ct_state::TRK;
        let m = to_vip((vip, port)).with(nicira::ct_state_match(invalid, invalid));
        let on = acts([nicira::resubmit_table(0)]);
        v.push(added(RETIRING, 0, TABLE_CT, PRIO_INV_PASS, m, on));
        self.proactive.retired_vips.insert((vip, port));
    }

    /// When something retires and no proactive service is left: table 1's catch-alls,
    /// which the retiring rules' packets pass (a new connection's through a retiring VIP
    /// rule, a backend's answers to a client of its own address), stay for good, out of
    /// every generation. Retired by their idle timeout, they went in a pause of new
    /// connections while an old download went on, and every later new connection met an
    /// empty table 1 and was dropped (seen on Open vSwitch). Nothing reaches table 1 once
    /// no retiring rule is left, and a proactive service's own catch-alls replace them
    /// (§6.4).
    fn retiring_catch_alls(&self, v: &mut Vec<Message>) {
        let any = (0..self.services.len()).any(|i| self.is_proactive(i));
        if !v.is_empty() && !any {
            catch_alls(RETIRING, v);
        }
    }

    /// A rule of ours the switch `dpid` reports gone: a retiring VIP's reply rule (the
    /// only proactive rule that reports its end) takes the VIP's retiring rules on that
    /// switch with it, as its old connections are over (see the module doc). Stateless, so
    /// that a controller started since the VIP retired does the same.
    pub(crate) fn proactive_rule_ended(&mut self, dpid: Dpid, e: &RuleEnded, out: &mut Outbox) {
        let retiring = COOKIE_KIND | COOKIE_RETIRE;
        if e.cookie & (cookie::KIND_MASK | COOKIE_RETIRE) != retiring || e.table_id != TABLE_CT {
            return;
        }
        if let (Some(vip), Some(port), None) = (e.tuple.src, e.tuple.sport, e.tuple.dst) {
            out.push(dpid, retiring_vip_delete((vip, port)));
        }
    }

    /// A switch connects: ask it for its proactive rules (`proactive_reported`).
    pub(super) fn proactive_report_request(&mut self, dpid: Dpid, out: &mut Outbox) {
        self.proactive.reports.insert(dpid, Report::default());
        out.push(dpid, rules::flow_stats_request(cookie::RuleKind::Proactive));
    }

    /// A proactive rule the connecting switch `dpid` reports (flow stats), while its
    /// report comes in.
    pub(crate) fn note_proactive_rule(&mut self, dpid: Dpid, fs: &ofp::FlowStats) {
        if fs.cookie & cookie::KIND_MASK != COOKIE_KIND {
            return;
        }
        let Some(r) = self.proactive.reports.get_mut(&dpid) else {
            return;
        };
        let t = Tuple::of_match(&fs.match_);
        let one_side =
            |a: Option<Ipv4Addr>, p: Option<u16>, other: Option<Ipv4Addr>| match (a, p, other) {
                (Some(a), Some(p), None) => Some((a, p)),
                _ => None,
            };
        let (from, to) = (
            one_side(t.src, t.sport, t.dst),
            one_side(t.dst, t.dport, t.src),
        );
        if fs.cookie & COOKIE_RETIRE != 0 {
            let vip_rule =
                [PRIO_RETIRING_VIP, PRIO_RETIRING_VIP_PARTITIONED].contains(&fs.priority);
            match (fs.table_id, from, to) {
                (0, None, Some(key)) if vip_rule => {
                    r.retiring_vips.entry(key).or_default().vip_rule = true
                }
                (TABLE_CT, Some(key), None) => r.retiring_vips.entry(key).or_default().reply = true,
                (TABLE_CT, None, Some(key)) if fs.priority == PRIO_INV_PASS => {
                    r.retiring_vips.entry(key).or_default().pass = true
                }
                _ => {}
            }
            return;
        }
        match (fs.table_id, fs.priority, from, to) {
            // A backend's answers through conntrack.
            (0, rules::PRIO_INTERCEPT, Some(key), None) => {
                r.backends.entry(key).or_default();
            }
            // Where a backend is.
            (TABLE_CT, PRIO_EST, None, Some(key)) => {
                *r.backends.entry(key).or_default() = mac_set(fs, false);
            }
            // A VIP's answers, with its virtual MAC.
            (TABLE_CT, PRIO_EST, Some(key), None) => {
                if let Some(mac) = mac_set(fs, true) {
                    r.vips.insert(key, mac);
                }
            }
            _ => {}
        }
    }

    /// The last part of a flow-stats reply from `dpid`; once it is the report of its
    /// proactive rules:
    ///
    /// - a retiring VIP's rules without its reply rule go. The reply rule's end
    ///   (`proactive_rule_ended`) reached no controller: the switch was not connected to
    ///   one then. Left, the VIP rule would send every new connection through conntrack
    ///   until the VIP is proactive again, and the pass for the invalid (which has no
    ///   timeout) would stay for good.
    /// - a backend or a VIP that a generation's rules serve and no proactive service has
    ///   now (it left while no controller was connected, or this one started with another
    ///   configuration) retires, as if it had left now: the generation's delete at the end
    ///   of the switch's grace would take its connections with it.
    pub(crate) fn proactive_reported(&mut self, dpid: Dpid, out: &mut Outbox) {
        let Some(r) = self.proactive.reports.remove(&dpid) else {
            return;
        };
        for (key, _) in r
            .retiring_vips
            .iter()
            .filter(|&(_, r)| (r.vip_rule || r.pass) && !r.reply)
        {
            out.push(dpid, retiring_vip_delete(*key));
        }
        let mut v = Vec::new();
        let serving = |c: &Controller, (addr, port): (Ipv4Addr, u16), vip: bool| {
            (0..c.services.len())
                .filter(|&i| c.is_proactive(i))
                .any(|i| {
                    let s = &c.services[i];
                    s.cfg.port == port
                        && if vip {
                            s.cfg.vip == Some(addr)
                        } else {
                            s.backends.iter().any(|b| b.address == addr)
                        }
                })
        };
        // The idle timeout of the services that have the address now, in any mode; else
        // of those on its port (a removed backend's service is not known); else the
        // default.
        let idle = |c: &Controller, (addr, port): (Ipv4Addr, u16)| {
            let on_port = || c.services.iter().filter(move |s| s.cfg.port == port);
            on_port()
                .filter(|s| s.cfg.vip == Some(addr) || s.backends.iter().any(|b| b.address == addr))
                .map(|s| s.cfg.idle_timeout_secs)
                .max()
                .or_else(|| on_port().map(|s| s.cfg.idle_timeout_secs).max())
                .unwrap_or(DEFAULT_IDLE_TIMEOUT_SECS as u16)
        };
        for (&key, &mac) in &r.backends {
            if !serving(self, key, false) {
                backend_flows(RETIRING, idle(self, key).max(1), key.0, key.1, mac, &mut v);
            }
        }
        for (&key, &mac) in &r.vips {
            if !serving(self, key, true) {
                let t = idle(self, key);
                self.retire_vip(key, mac, t, &mut v);
            }
        }
        self.retiring_catch_alls(&mut v);
        for m in v {
            out.push(dpid, m);
        }
    }
}
