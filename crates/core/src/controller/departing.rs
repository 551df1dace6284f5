//! A partitioned service's departure: its live connections keep their backend when a
//! reload takes its VIP out of the partitioned mode (to the reactive or the proactive
//! mode) or removes the service.
//!
//! A partitioned connection has no state anywhere but in its partition's wildcard rule
//! (`partition`): the rule is deleted with the mode, and the connection's next segment
//! went to the intercept (to the controller, which knows nothing of it) or, proactive,
//! through conntrack, which picks a connection up mid-stream as new, to the group and
//! a backend at random. Either way the backend that got it answered with a reset.
//!
//! So before the partition rules go, each partition's rule is written again, for the
//! segments that are not SYNs (`tcp_flags=-syn`), to the same owner, with the service's
//! idle timeout. A SYN is a new connection and passes them for the new mode; the new
//! mode's connections never meet them (their segments after the SYN have rules of their
//! own above, or are NATed away from the VIP), so they carry only the old connections,
//! and the switch removes them once those have been idle for the timeout (§6.5).
//!
//! | new mode | table | prio | match | actions |
//! | --- | --- | --- | --- | --- |
//! | reactive, none | 0 | [`PRIO_DEPARTING`] | the partition's, `tcp_flags=-syn` | `eth_dst:=MAC(owner)`, output toward it |
//! | proactive | 0 | [`PRIO_DEPARTING_AFTER_CT`] | the same | the same |
//! | proactive | 1 | [`PRIO_DEPARTING_CT_PASS`] | `tcp, ip_dst=V, tcp_dst=P, tcp_flags=-syn, ct_state=+trk-est` | `resubmit(,0)` |
//!
//! Reactive, the rule sits above the gap rules (250) that drop a gapped service's packets
//! and below the connection rules (300). Proactive, every packet to the VIP meets the
//! service's conntrack rule (200) first, so the departing rule sits below it, where the
//! packet comes back tracked; in table 1 a segment conntrack does not know as
//! established (new where it picks connections up mid-stream, as Open vSwitch's does;
//! invalid where it does not) and that is no SYN goes back to table 0 rather than to the
//! group. A proactive connection's own segments are NATed to their backend there and do
//! not match the VIP.
//!
//! A partitioned service that stays partitioned with another partition count, VIP or
//! port is not covered: its new partition rules and the departing ones would both match
//! the new connections' segments.

use flowgate_packet::{ETH_TYPE_IPV4, IP_PROTO_TCP, MacAddr};
use ofp::{Action, Actions, FlowMod, Instruction, Match, Message, Oxm};

use super::conn_rule::Syn;
use super::nicira::{self, ct_state};
use super::{Controller, Outbox, proactive, rules};
use crate::config::ServiceMode;
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

impl Controller {
    /// A reload replaced the services `old` (as they were, with the partition state still
    /// indexed like them): write the departing rules of each partitioned VIP that no
    /// partitioned service holds now, before `partition_resync` deletes its partitions.
    pub(crate) fn partition_depart(&mut self, old: &[ServiceState], out: &mut Outbox) {
        // Table 0's rules, each with its owner's MAC (the output is per switch), and
        // table 1's.
        let mut to_owner: Vec<(MacAddr, FlowMod)> = Vec::new();
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
            let now_mode = self
                .services
                .iter()
                .find(|s| s.cfg.vip == Some(vip) && s.cfg.port == port)
                .map(|s| s.cfg.mode);
            let proactive = match now_mode {
                Some(ServiceMode::Partitioned) => continue,
                Some(ServiceMode::Proactive) => true,
                _ => false,
            };
            let idle = o.cfg.idle_timeout_secs.max(1);
            let prio = if proactive {
                PRIO_DEPARTING_AFTER_CT
            } else {
                PRIO_DEPARTING
            };
            for (p, owner) in st.owner.iter().enumerate() {
                let Some(mac) = owner
                    .and_then(|a| o.backends.iter().find(|b| b.address == a))
                    .and_then(|b| b.mac)
                else {
                    continue;
                };
                let m = super::partition::partition_match(vip, port, p, st.bits);
                to_owner.push((
                    mac,
                    departing(idle, 0, prio, with_not_syn(m), Actions::new()),
                ));
            }
            if proactive {
                let m = Match::new()
                    .with(Oxm::EthType(ETH_TYPE_IPV4))
                    .with(Oxm::IpProto(IP_PROTO_TCP))
                    .with(Oxm::Ipv4Dst {
                        value: vip,
                        mask: None,
                    })
                    .with(Oxm::TcpDst(port));
                let m = with_not_syn(m).with(nicira::ct_state_match(
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
        if to_owner.is_empty() && ct_pass.is_empty() {
            return;
        }
        let dpids: Vec<Dpid> = self.switch_ids().collect();
        for d in dpids {
            for fm in &ct_pass {
                out.push(d, Message::FlowMod(fm.clone()));
            }
            for (mac, fm) in &to_owner {
                // Toward the owner from this switch, as its partition rule sent it.
                let Some(at) = self.topo.host(*mac).map(|h| h.at) else {
                    continue;
                };
                let Some(port) = self.topo.egress_toward(d, at) else {
                    continue;
                };
                let mut a = Actions::new();
                a.push(Action::SetField(Oxm::EthDst {
                    value: mac.0,
                    mask: None,
                }));
                a.push(Action::output(port));
                let mut fm = fm.clone();
                fm.instructions.push(Instruction::ApplyActions(a));
                out.push(d, Message::FlowMod(fm));
            }
            // §6.2: in force before the partition rules are deleted.
            out.push(d, Message::BarrierRequest);
        }
    }
}

fn with_not_syn(m: Match) -> Match {
    match Syn::Not.oxm() {
        Some(o) => m.with(o),
        None => m,
    }
}

/// A departing rule without instructions yet (table 0's are per switch).
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

    /// Partitioned to reactive: a live connection's segments go on to its backend, VIP
    /// kept, without the controller; a new connection's SYN goes up and is placed there;
    /// the departing rules carry only segments that are not SYNs and end by idle timeout.
    #[test]
    fn partitioned_to_reactive_keeps_the_partitions_connections() {
        let mut sim = partitioned();
        let live: Vec<(u16, String)> = (0..8u16)
            .map(|i| {
                let port = 40_000 + 2 * i;
                let got = send(&mut sim, port, SYN);
                assert_eq!(got.len(), 1, "{got:?}");
                (port, got[0].0.clone())
            })
            .collect();
        let cfg = Config::from_toml(&config(""), &|_| None).expect("valid");
        let now = sim.now;
        sim.c.reload(now, &cfg, &mut sim.out);
        sim.pump();
        let departing: Vec<_> = sim
            .net
            .switch(1)
            .expect("switch 1")
            .flows()
            .filter(|f| cookie::kind_of(f.cookie) == Some(RuleKind::Departing))
            .map(|f| (f.priority, f.idle_timeout))
            .collect();
        assert_eq!(departing, [(PRIO_DEPARTING, 5); 8]);
        assert!(
            !sim.net
                .switch(1)
                .expect("switch 1")
                .flows()
                .any(|f| cookie::kind_of(f.cookie) == Some(RuleKind::Partition)),
            "the partition rules are gone"
        );

        let before = sim.packet_ins;
        for (port, owner) in &live {
            let got = send(&mut sim, *port, ACK);
            assert_eq!(got, [(owner.clone(), Some(VIP))], "port {port}");
        }
        assert_eq!(sim.packet_ins, before, "no live connection comes up");

        // A new connection is the reactive mode's: up, and rewritten to its backend.
        let got = send(&mut sim, 41_000, SYN);
        assert_eq!(sim.packet_ins, before + 1);
        assert_eq!(got.len(), 1, "{got:?}");
        assert_ne!(
            got[0].1,
            Some(VIP),
            "placed by the controller, NATed: {got:?}"
        );
    }

    /// Partitioned to proactive: the departing rule sits below the VIP's conntrack rule,
    /// and table 1 sends a segment that is no SYN and not established back to it.
    #[test]
    fn partitioned_to_proactive_departs_below_conntrack() {
        let mut sim = partitioned();
        let cfg = Config::from_toml(&config("mode = \"proactive\"\n"), &|_| None).expect("valid");
        let now = sim.now;
        sim.c.reload(now, &cfg, &mut sim.out);
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
