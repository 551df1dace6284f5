//! A partitioned service's departure: its live connections keep their backend when a
//! reload takes its VIP out of the partitioned mode (to the reactive or the proactive
//! mode), gives it another partition count, or removes the service (a new VIP or port is
//! the old one's removal).
//!
//! A partitioned connection has no state anywhere but in its partition's wildcard rule
//! (`partition`): the rule is deleted with the mode, and the connection's next segment
//! went to the intercept (to the controller, which knows nothing of it) or, proactive,
//! through conntrack, which picks a connection up mid-stream as new, to the group and
//! a backend at random. Either way the backend that got it answered with a reset (on OVS
//! a download stopped at 100 kB and 200 kB).
//!
//! So before the partition rules go, each partition's rule is written again for the
//! segments that are not SYNs (`tcp_flags=-syn`), with the service's idle timeout. A SYN
//! is a new connection and passes them for the new mode. What they do with the rest
//! depends on that mode:
//!
//! | new mode | table | prio | match | actions |
//! | --- | --- | --- | --- | --- |
//! | none (the service went) | 0 | [`PRIO_DEPARTING`] | the partition's, `tcp_flags=-syn` | `eth_dst:=MAC(owner)`, output toward it |
//! | reactive | 0 | [`PRIO_DEPARTING`] | the same | to the controller |
//! | partitioned, another count | 0 | [`PRIO_DEPARTING`] | the partition's, every segment, for `transition_secs` (hard timeout) | to the controller |
//! | proactive | 0 | [`PRIO_DEPARTING_AFTER_CT`] | the same | `eth_dst:=MAC(owner)`, output toward it |
//! | proactive | 1 | [`PRIO_DEPARTING_CT_PASS`] | `tcp, ip_dst=V, tcp_dst=P, tcp_flags=-syn, ct_state=+trk-est` | `resubmit(,0)` |
//!
//! **Reactive**, the rule sits above the gap rules (250) that drop a gapped service's
//! packets and below the connection rules (300), and sends what it takes to the
//! controller: an old connection's segment gets an exact rule of its own to its old owner
//! (the VIP kept, as its partition rule had it) and goes on there
//! ([`Controller::departed_segment`]); a new connection's is the new mode's, which knows
//! it. Sent straight to the owner, a new connection's ACK could go there too: Open
//! vSwitch's datapath carries packets by flows it cached from the rules, and one cached
//! from an old connection's segment while no connection rule of that client existed
//! covers every port of the partition, until its revalidators catch up with the new
//! connection's rules (seen on OVS: 1 new connection in 20 reset by the old owner).
//!
//! **Proactive**, every packet to the VIP meets the service's conntrack rule (200) first,
//! so the departing rule sits below it, where the packet comes back tracked; in table 1 a
//! segment conntrack does not know as established (new where it picks connections up
//! mid-stream, as Open vSwitch's does; invalid where it does not) and that is no SYN goes
//! back to table 0 rather than to the group. The new mode's connections are NATed away
//! from the VIP there and never meet the rule, which so carries the old connections only.
//!
//! **Another partition count** is a move of every partition at once, as the partitioned
//! mode moves one (`partition`, Gone Wild's transition): the new partition rules would
//! take the new connections' segments after their SYN below a departing rule that sends
//! those to the old owner, so for `transition_secs` the old partitions' every segment
//! comes up. A SYN is a new connection, placed with its new partition's owner and given
//! rules before its ACK can come; any other segment nobody decided is an old connection's
//! and gets its exact rule to the old owner. Then the departing rules end by their hard
//! timeout and the new partitions carry new connections by themselves; an old connection
//! that sent nothing for the whole transition moves with its port's new partition (Gone
//! Wild's soft deadline).
//!
//! The other rules end when the connections they carry have been idle for the timeout
//! (§6.5).

use std::net::Ipv4Addr;
use std::time::Instant;

use flowgate_packet::MacAddr;
use ofp::{Action, Actions, Bytes, FlowMod, Instruction, Match, Message, Oxm};

use super::conn_rule::Syn;
use super::nicira::{self, ct_state};
use super::vip::Arrival;
use super::{Controller, Outbox, proactive, rules};
use crate::config::ServiceMode;
use crate::conntrack::ConnKey;
use crate::cookie::{self, RuleKind};
use crate::service::ServiceState;
use crate::topology::Dpid;

/// Above the gap rules (`rules::PRIO_GAP`), below the connection rules.
pub(crate) const PRIO_DEPARTING: u16 = rules::PRIO_GAP + 10;
/// Below a proactive VIP's conntrack rule (`rules::PRIO_INTERCEPT`), which every untracked
/// packet to the VIP meets first.
pub(crate) const PRIO_DEPARTING_AFTER_CT: u16 = rules::PRIO_INTERCEPT - 1;
/// Above the proactive group's rule for new connections (30).
pub(crate) const PRIO_DEPARTING_CT_PASS: u16 = 31;
const _: () = assert!(
    rules::PRIO_GAP < PRIO_DEPARTING
        && PRIO_DEPARTING < rules::PRIO_CONN
        && PRIO_DEPARTING_AFTER_CT < rules::PRIO_INTERCEPT
);

/// A partitioned VIP a reload took to the reactive mode, or to another partition count:
/// its old partitions' owners.
#[derive(Debug, Clone)]
pub(crate) struct Departed {
    vip: Ipv4Addr,
    port: u16,
    bits: u8,
    /// Each partition's owner's MAC, where it was known.
    owners: Vec<Option<MacAddr>>,
    idle: u16,
    /// A reshape's transition ends then (its departing rules' hard timeout); after it,
    /// a segment nobody decided is no old partition's any more.
    until: Option<Instant>,
}

impl Controller {
    /// A reload replaced the services `old` (as they were, with the partition state still
    /// indexed like them): write the departing rules of each partitioned VIP that no
    /// partitioned service holds now, before `partition_resync` deletes its partitions.
    pub(crate) fn partition_depart(
        &mut self,
        now: Instant,
        old: &[ServiceState],
        out: &mut Outbox,
    ) {
        // A VIP partitioned again is no longer the earlier departure's (a reshape's is
        // added again below); nor is a reshape's past its transition.
        let partitioned_now: Vec<(Ipv4Addr, u16)> = (0..self.services.len())
            .filter(|&i| self.is_partitioned(i))
            .filter_map(|i| Some((self.services[i].cfg.vip?, self.services[i].cfg.port)))
            .collect();
        self.departed.retain(|d| {
            !partitioned_now.contains(&(d.vip, d.port)) && d.until.is_none_or(|t| now < t)
        });
        // Table 0's rules, each with its owner's MAC (or `None`: to the controller), and
        // table 1's.
        let mut rules0: Vec<(Option<MacAddr>, FlowMod)> = Vec::new();
        let mut ct_pass: Vec<FlowMod> = Vec::new();
        for (i, o) in old.iter().enumerate() {
            let (Some(vip), port) = (o.cfg.vip, o.cfg.port) else {
                continue;
            };
            let Some(Some(st)) = self.partitions.services.get(i) else {
                continue;
            };
            if o.cfg.mode != ServiceMode::Partitioned {
                continue;
            }
            let now_cfg = self
                .services
                .iter()
                .find(|s| s.cfg.vip == Some(vip) && s.cfg.port == port)
                .map(|s| &s.cfg);
            let now_mode = now_cfg.map(|c| c.mode);
            // Partitioned again with another partition count: the transition of a move
            // for every partition, through the controller, SYNs included.
            let reshape = now_cfg
                .filter(|c| c.mode == ServiceMode::Partitioned && c.partitions.bits != st.bits)
                .map(|c| c.partitions.transition);
            let idle = o.cfg.idle_timeout_secs.max(1);
            let owners: Vec<Option<MacAddr>> = st
                .owner
                .iter()
                .map(|owner| {
                    owner
                        .and_then(|a| o.backends.iter().find(|b| b.address == a))
                        .and_then(|b| b.mac)
                })
                .collect();
            let (prio, via_controller) = match now_mode {
                Some(ServiceMode::Partitioned) if reshape.is_none() => continue,
                Some(ServiceMode::Proactive) => (PRIO_DEPARTING_AFTER_CT, false),
                Some(ServiceMode::Reactive | ServiceMode::Partitioned) => (PRIO_DEPARTING, true),
                None => (PRIO_DEPARTING, false),
            };
            let hard = reshape.map(|t| u16::try_from(t.as_secs()).unwrap_or(u16::MAX).max(1));
            for (p, owner) in owners.iter().enumerate() {
                let Some(mac) = owner else { continue };
                let m = super::partition::partition_match(vip, port, p, st.bits);
                let fm = match hard {
                    // Every segment, for the transition: a new connection's SYN comes up
                    // and gets its own rules before its ACK can come.
                    Some(secs) => {
                        let mut fm = departing(0, 0, prio, m, Actions::new());
                        fm.hard_timeout = secs;
                        fm
                    }
                    None => departing(idle, 0, prio, Syn::Not.on(m), Actions::new()),
                };
                rules0.push(((!via_controller).then_some(*mac), fm));
            }
            if via_controller {
                self.departed.retain(|d| (d.vip, d.port) != (vip, port));
                self.departed.push(Departed {
                    vip,
                    port,
                    bits: st.bits,
                    owners,
                    idle,
                    until: reshape.map(|t| now + t),
                });
            }
            if now_mode == Some(ServiceMode::Proactive) {
                let m = rules::tcp_match(None, Some(vip), None, Some(port));
                let m = Syn::Not.on(m).with(nicira::ct_state_match(
                    ct_state::TRK,
                    ct_state::TRK | ct_state::EST,
                ));
                let mut a = Actions::new();
                a.push(nicira::resubmit_table(0));
                ct_pass.push(departing(
                    idle,
                    proactive::TABLE_CT,
                    PRIO_DEPARTING_CT_PASS,
                    m,
                    a,
                ));
            }
        }
        if rules0.is_empty() && ct_pass.is_empty() {
            return;
        }
        let dpids: Vec<Dpid> = self.switch_ids().collect();
        for d in dpids {
            for fm in &ct_pass {
                out.push(d, Message::FlowMod(fm.clone()));
            }
            for (owner, fm) in &rules0 {
                let actions = match owner {
                    None => rules::to_controller(),
                    Some(mac) => match self.toward(d, *mac) {
                        Some(a) => a,
                        None => continue,
                    },
                };
                let mut fm = fm.clone();
                fm.instructions.push(Instruction::ApplyActions(actions));
                out.push(d, Message::FlowMod(fm));
            }
            // §6.2: in force before the partition rules are deleted.
            out.push(d, Message::BarrierRequest);
        }
    }

    /// `eth_dst := mac`, output toward it from switch `dpid` (as a partition rule sends).
    fn toward(&self, dpid: Dpid, mac: MacAddr) -> Option<Actions> {
        let at = self.topo.host(mac)?.at;
        let port = self.topo.egress_toward(dpid, at)?;
        let mut a = Actions::new();
        a.push(Action::SetField(Oxm::EthDst {
            value: mac.0,
            mask: None,
        }));
        a.push(Action::output(port));
        Some(a)
    }

    /// A segment that is not a SYN, of a connection the controller never decided, that a
    /// departing rule sent up (the VIP left the partitioned mode for the reactive one, or
    /// changed its partition count): it is an old partition's connection. It gets an exact rule to that partition's owner, the VIP kept, where
    /// it came up, and goes on there. Returns false when the VIP did not depart so.
    pub(crate) fn departed_segment(
        &mut self,
        now: Instant,
        at: &Arrival<'_>,
        key: &ConnKey,
        out: &mut Outbox,
    ) -> bool {
        // Only what a departing rule sent: a segment that came up another way (the
        // intercept, a table miss) after those rules ended is no old partition's, and a
        // stray one must not buy itself a rule.
        if at.tcp.flags.syn() || cookie::kind_of(at.cookie) != Some(RuleKind::Departing) {
            return false;
        }
        let Some(d) = self.departed.iter().find(|d| {
            (d.vip, d.port) == (key.service_addr, key.service_port)
                && d.until.is_none_or(|t| now < t)
        }) else {
            return false;
        };
        let p = usize::from((key.client_port & super::partition::port_mask(d.bits)) >> 1);
        let (Some(Some(mac)), idle) = (d.owners.get(p).copied(), d.idle) else {
            return false;
        };
        let Some(actions) = self.toward(at.dpid, mac) else {
            return false;
        };
        let m = rules::tcp_match(
            Some(key.client),
            Some(key.service_addr),
            Some(key.client_port),
            Some(key.service_port),
        );
        let mut fm = departing(idle, 0, rules::PRIO_CONN, Syn::Not.on(m), Actions::new());
        fm.instructions
            .push(Instruction::ApplyActions(actions.clone()));
        out.push(at.dpid, Message::FlowMod(fm));
        out.push(
            at.dpid,
            rules::packet_out(at.in_port, actions, Bytes::copy_from_slice(at.data)),
        );
        true
    }
}

/// A departing rule; table 0's get their actions per switch.
fn departing(idle: u16, table: u8, priority: u16, m: Match, actions: Actions) -> FlowMod {
    let mut fm = FlowMod::add(m);
    fm.cookie = cookie::cookie(RuleKind::Departing, 0);
    fm.table_id = table;
    fm.priority = priority;
    fm.idle_timeout = idle;
    if !actions.is_empty() {
        fm.instructions.push(Instruction::ApplyActions(actions));
    }
    fm
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::config::Config;
    use crate::testkit::sim::{self, ACK, SYN, Sim, VIP, VMAC, ip, mac};

    fn config(mode: &str) -> String {
        let mut c = format!(
            "[[service]]\nname = \"web\"\nvip = \"{VIP}\"\nport = 80\nalgorithm = \"round-robin\"\n\
             {mode}idle_timeout_secs = 5\n[service.health]\nkind = \"none\"\n"
        );
        for b in 2..=4 {
            c += &format!("[[service.backend]]\naddress = \"{}\"\n", ip(b));
        }
        c
    }

    const PARTITIONED: &str = "mode = \"partitioned\"\npartition_bits = 3\ntransition_secs = 2\n";

    /// One switch, client h1 on port 1, backends h2..h4 (holding the VIP) on 2..4.
    fn partitioned() -> Sim {
        let hosts = [("h1", 1, 1), ("h2", 1, 2), ("h3", 1, 3), ("h4", 1, 4)];
        let mut sim = Sim::new(&config(PARTITIONED), &[(1, 4)], &[], &hosts);
        for i in 1..=4u8 {
            sim.send(&format!("h{i}"), &sim::arp_request(i, ip(9)));
        }
        sim.tick(Duration::from_millis(10));
        sim
    }

    /// Where h1's segment from `port` to the VIP goes: the host and the address it is for.
    fn send(sim: &mut Sim, port: u16, flags: u8) -> Vec<(String, Option<std::net::Ipv4Addr>)> {
        sim.send(
            "h1",
            &sim::tcp(mac(1), VMAC, (ip(1), port), (VIP, 80), flags),
        )
        .into_iter()
        .map(|(who, seen)| (who, seen.ipv4_dst))
        .collect()
    }

    /// A connection from h1 in each of the 8 partitions: its port and the backend that
    /// got its SYN.
    fn connect_one_per_partition(sim: &mut Sim) -> Vec<(u16, String)> {
        (0..8u16)
            .map(|i| {
                let port = 40_000 + 2 * i;
                let got = send(sim, port, SYN);
                assert_eq!(got.len(), 1, "{got:?}");
                (port, got[0].0.clone())
            })
            .collect()
    }

    /// A reload to the service with `mode` (its lines); what it sends is left in the
    /// outbox.
    fn reload(sim: &mut Sim, mode: &str) {
        let cfg = Config::from_toml(&config(mode), &|_| None).expect("valid");
        let now = sim.now;
        sim.c.reload(now, &cfg, &mut sim.out);
    }

    /// Switch 1's rules of `kind`: (priority, idle timeout, hard timeout) of each.
    fn rules(sim: &Sim, kind: RuleKind) -> Vec<(u16, u16, u16)> {
        sim.net
            .switch(1)
            .expect("switch 1")
            .flows()
            .filter(|f| cookie::kind_of(f.cookie) == Some(kind))
            .map(|f| (f.priority, f.idle_timeout, f.hard_timeout))
            .collect()
    }

    /// Partitioned to reactive: a live connection's segments go on to its backend, VIP
    /// kept (the first through the controller, which gives it a rule of its own); a new
    /// connection's SYN goes up and is placed there; the departing rules take only
    /// segments that are not SYNs and end by idle timeout.
    #[test]
    fn partitioned_to_reactive_keeps_the_partitions_connections() {
        let mut sim = partitioned();
        let live = connect_one_per_partition(&mut sim);
        reload(&mut sim, "");
        sim.pump();
        let departing: Vec<(u16, u16)> = rules(&sim, RuleKind::Departing)
            .iter()
            .map(|&(prio, idle, _)| (prio, idle))
            .collect();
        assert_eq!(departing, [(PRIO_DEPARTING, 5); 8]);
        assert!(
            rules(&sim, RuleKind::Partition).is_empty(),
            "the partition rules are gone"
        );

        // Each live connection's first segment comes up once and gets its own rule to
        // its owner, the VIP kept; the next go by that rule.
        for round in 0..2 {
            let before = sim.packet_ins;
            for (port, owner) in &live {
                let got = send(&mut sim, *port, ACK);
                assert_eq!(got, [(owner.clone(), Some(VIP))], "port {port}");
            }
            let up = if round == 0 { live.len() } else { 0 };
            assert_eq!(sim.packet_ins, before + up, "round {round}");
        }
        let before = sim.packet_ins;

        // A new connection is the reactive mode's: up, and rewritten to its backend.
        let got = send(&mut sim, 41_000, SYN);
        assert_eq!(sim.packet_ins, before + 1);
        assert_eq!(got.len(), 1, "{got:?}");
        assert_ne!(
            got[0].1,
            Some(VIP),
            "placed by the controller, NATed: {got:?}"
        );
        // Its ACK, brought up as a flow the datapath cached from a departing rule would:
        // it goes to the backend the controller chose, never to the partition's owner.
        let got_syn = got[0].clone();
        sim.received.clear();
        let ack = sim::tcp(mac(1), VMAC, (ip(1), 41_000), (VIP, 80), ACK);
        sim.packet_in(1, 1, ack);
        let got: Vec<_> = std::mem::take(&mut sim.received)
            .into_iter()
            .map(|(who, seen)| (who, seen.ipv4_dst))
            .collect();
        assert_eq!(got, [got_syn], "as its SYN went");

        // A segment nobody decided that came up another way (here a table miss) is no
        // old partition's: it buys itself no rule.
        let before = rules(&sim, RuleKind::Departing).len();
        let stray = sim::tcp(mac(1), VMAC, (ip(1), 45_000), (VIP, 80), ACK);
        sim.packet_in(1, 1, stray);
        assert_eq!(rules(&sim, RuleKind::Departing).len(), before);
    }

    /// Partitioned with another partition count: for the transition every segment of
    /// the old partitions comes up (the departing rules' hard timeout), so a new
    /// connection is placed with its new partition's owner before its ACK can come, and a
    /// live connection keeps its old owner with a rule of its own; after it, the new
    /// partition rules carry new connections without the controller.
    #[test]
    fn a_new_partition_count_keeps_the_old_partitions_connections() {
        let mut sim = partitioned();
        let live = connect_one_per_partition(&mut sim);
        let two_bits = PARTITIONED.replace("partition_bits = 3", "partition_bits = 2");
        reload(&mut sim, &two_bits);
        sim.pump();
        sim.tick(Duration::from_millis(10));
        let departing: Vec<(u16, u16)> = rules(&sim, RuleKind::Departing)
            .iter()
            .map(|&(prio, _, hard)| (prio, hard))
            .collect();
        assert_eq!(departing, [(PRIO_DEPARTING, 2); 8]);
        let before = sim.packet_ins;
        assert_eq!(
            rules(&sim, RuleKind::Partition).len(),
            4,
            "the new partitions"
        );

        for (port, owner) in &live {
            let got = send(&mut sim, *port, ACK);
            assert_eq!(got, [(owner.clone(), Some(VIP))], "port {port}");
        }
        assert_eq!(sim.packet_ins, before + live.len(), "each came up once");
        // A new connection: up, and to its new partition's owner, as its ACK.
        let before = sim.packet_ins;
        let got = send(&mut sim, 41_002, SYN);
        assert_eq!(sim.packet_ins, before + 1, "the SYN comes up");
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].1, Some(VIP), "the partitioned mode keeps the VIP");
        let ack = send(&mut sim, 41_002, ACK);
        assert_eq!(ack, got, "its ACK follows it");

        // Past the transition the departing rules are gone, and the partitions place
        // new connections by themselves.
        sim.tick(Duration::from_secs(3));
        let later = sim.net.switch(1).expect("switch 1").now() + 3;
        sim.net.expire(later);
        // (The old connections' own rules stay, by their idle timeout.)
        let wildcard = rules(&sim, RuleKind::Departing)
            .into_iter()
            .filter(|&(prio, _, _)| prio == PRIO_DEPARTING)
            .count();
        assert_eq!(wildcard, 0);
        let before = sim.packet_ins;
        let got = send(&mut sim, 41_010, SYN);
        assert_eq!((got.len(), sim.packet_ins), (1, before));
    }

    /// Partitioned to proactive: the departing rule sits below the VIP's conntrack rule,
    /// and table 1 sends a segment that is no SYN and not established back to it.
    #[test]
    fn partitioned_to_proactive_departs_below_conntrack() {
        let mut sim = partitioned();
        reload(&mut sim, "mode = \"proactive\"\n");
        let msgs: Vec<FlowMod> = sim
            .out
            .drain()
            .filter_map(|(_, m)| match m {
                Message::FlowMod(fm) if cookie::kind_of(fm.cookie) == Some(RuleKind::Departing) => {
                    Some(fm)
                }
                _ => None,
            })
            .collect();
        let at: Vec<(u8, u16)> = msgs.iter().map(|f| (f.table_id, f.priority)).collect();
        let mut want = vec![(proactive::TABLE_CT, PRIO_DEPARTING_CT_PASS)];
        want.extend([(0, PRIO_DEPARTING_AFTER_CT); 8]);
        assert_eq!(at, want);
        let pass = &msgs[0];
        let not_syn = Syn::Not.oxm().expect("a field");
        assert!(pass.match_.iter().any(|o| *o == not_syn));
        assert!(
            msgs[1..]
                .iter()
                .all(|f| f.match_.iter().any(|o| *o == not_syn))
        );
    }
}
