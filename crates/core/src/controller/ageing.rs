//! Host ageing: a host silent for `host_timeout` is asked by ARP whether it is still
//! there, and forgotten when it does not answer.
//!
//! Silence alone says nothing here. In this one-table pipeline a host whose peers are
//! known sends nothing up (its frames go by their L2 rules), so "not heard from for T"
//! would forget every healthy host, and a forgotten one is learned again only when a
//! frame of its own reaches the controller: until then every frame to it goes up and is
//! flooded. So silence only starts the question, as Linux's neighbour cache asks before
//! it forgets (three unicast probes, a second apart): an ARP request for the address the
//! host last claimed, out of its own port, to its own MAC, from [`PROBE_MAC`] with sender
//! address 0.0.0.0 (RFC 5227's probe, which the host answers without adding us to its ARP
//! cache). The answer is addressed to `PROBE_MAC`, which no rule carries, so it comes up,
//! and learning its sender hears the host (`Topology::learn_host` starts its silence
//! again). After [`HOST_PROBES`] unanswered probes the host is forgotten: its L2 rule
//! deleted on every switch, its share of its port's hosts and addresses freed, an event.
//! A port whose hosts come and go (virtual machines behind a hypervisor's uplink) thus
//! gets its `max_hosts_per_port` back as they go.
//!
//! Not aged:
//! - a host with no address known: there is nothing to ask, and forgetting a live one
//!   would have its frames flooded through the controller. They stay bounded by their
//!   port's share.
//! - backends: located by their own probes and judged by their health checks; their
//!   locations place every connection to them. So is a backend that left its pool while
//!   connections to it are open, until the last ends: they follow it when it moves
//!   (`ServiceState::connection_macs`), which needs its location.
//! - hosts behind a domain's uplink: the other domain's controller owns their answers
//!   (addressed to its own `PROBE_MAC`) and would take them.
//!
//! The scan runs once per [`PROBE_SPACING`] over the host table (about a tenth of a
//! millisecond at the default `max_hosts`), never on the PACKET_IN path.

use std::collections::HashSet;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use ahash::RandomState;
use flowgate_packet::{self as packet, MacAddr};

use super::{Controller, Outbox, rules};
use crate::topology::{Dpid, PortRef};

/// The controller's own MAC for its probes to hosts: locally administered, outside the
/// range of the services' default virtual MACs (`02:66:67:00:..`). Frames from it teach
/// nothing, and the answers to it are consumed (`Controller::is_virtual_mac`).
pub const PROBE_MAC: MacAddr = MacAddr([0x02, 0x66, 0x67, 0xff, 0x00, 0x01]);

/// Probes sent to a silent host before it is forgotten (Linux's `ucast_solicit`).
pub const HOST_PROBES: u8 = 3;

/// Between probes, and between scans of the host table (Linux's `retrans_time`).
pub const PROBE_SPACING: Duration = Duration::from_secs(1);

impl Controller {
    /// Ask the hosts silent for `host_timeout` whether they are still there, and forget
    /// those that did not answer [`HOST_PROBES`] probes.
    pub(crate) fn age_hosts(&mut self, now: Instant, out: &mut Outbox) {
        let Some(timeout) = self.cfg.host_timeout else {
            return;
        };
        if self
            .last_host_scan
            .is_some_and(|t| now.saturating_duration_since(t) < PROBE_SPACING)
        {
            return;
        }
        self.last_host_scan = Some(now);
        let backends: HashSet<MacAddr, RandomState> = self
            .services
            .iter()
            .flat_map(|s| s.connection_macs())
            .collect();
        let mut ask: Vec<(MacAddr, Ipv4Addr, PortRef)> = Vec::new();
        let mut gone: Vec<(MacAddr, Ipv4Addr, PortRef)> = Vec::new();
        for (&mac, h) in self.topo.hosts() {
            let Some(ip) = h.ip else { continue };
            if backends.contains(&mac) || self.topo.is_unbounded_port(h.at) {
                continue;
            }
            let silent = now.saturating_duration_since(h.last_seen);
            if silent < timeout + PROBE_SPACING * u32::from(h.probes) {
                continue;
            }
            if h.probes < HOST_PROBES {
                ask.push((mac, ip, h.at));
            } else {
                gone.push((mac, ip, h.at));
            }
        }
        for &(mac, ip, at) in &ask {
            let probe = packet::Arp {
                op: packet::ARP_OP_REQUEST,
                sha: PROBE_MAC,
                spa: Ipv4Addr::UNSPECIFIED,
                tha: MacAddr::ZERO,
                tpa: ip,
            };
            let data = packet::arp_frame(PROBE_MAC, mac, None, &probe);
            out.push(
                at.dpid,
                rules::packet_out(ofp::port::CONTROLLER, rules::output(at.port), data),
            );
            self.topo.note_probe(mac);
            self.counters.host_probes_sent += 1;
        }
        if gone.is_empty() {
            return;
        }
        let macs: HashSet<MacAddr, RandomState> = gone.iter().map(|g| g.0).collect();
        self.topo.forget_hosts(|m, _| macs.contains(m));
        let dpids: Vec<Dpid> = self.switch_ids().collect();
        for &(mac, ip, at) in &gone {
            for &d in &dpids {
                out.push(d, rules::l2_delete(mac));
            }
            self.counters.hosts_aged += 1;
            tracing::info!(%mac, %ip, dpid = at.dpid, port = at.port, "host forgotten: silent, and did not answer ARP");
            self.event(
                now,
                "host-aged",
                format!("{mac} ({ip}) at {:016x}:{}", at.dpid, at.port),
            );
        }
    }
}
