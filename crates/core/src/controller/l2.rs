//! PACKET_IN dispatch, and everything that is not a service connection: link discovery,
//! host learning, ARP (answered for the VIPs, forwarded otherwise), L2 forwarding along
//! shortest paths and flooding along the spanning tree.

use std::net::Ipv4Addr;
use std::time::Instant;

use flowgate_packet::{self as packet, ARP_OP_REPLY, ARP_OP_REQUEST, Frame, L3, MacAddr};
use ofp::{Action, Actions, Bytes, Message};

use super::{Controller, Outbox, rules};
use crate::topology::{AddressChange, Dpid, HostChange, PortRef};

impl Controller {
    /// The PACKET_IN path. It allocates nothing for a packet of a known connection or a new
    /// connection to a service (the messages it emits own their buffers, which the outbox
    /// reuses).
    pub(crate) fn handle_packet_in(
        &mut self,
        now: Instant,
        dpid: Dpid,
        (in_port, cookie): (Option<u32>, u64),
        data: &[u8],
        out: &mut Outbox,
    ) {
        self.counters.packet_in += 1;
        if let Some(s) = self.switches.get_mut(&dpid) {
            s.packet_in += 1;
        }
        let Some(in_port) = in_port else {
            // §7.4.1: the match of a PACKET_IN always carries OXM_OF_IN_PORT.
            self.counters.packet_in_unparsable += 1;
            return;
        };
        // A frame arrives on a physical port or the local one (§7.2.1); any other in_port
        // (0, OFPP_CONTROLLER, OFPP_ANY...) would teach a host or link "behind" a port
        // that no rule may output to.
        if !is_ingress_port(in_port) {
            self.counters.packet_in_bad_port += 1;
            return;
        }
        // Matched by reference: the frame's view is read where `parse` left it, not moved
        // out of the `Result` (a copy of the whole view, 1 % of a PACKET_IN's instructions).
        let parsed = packet::parse(data);
        let frame = match &parsed {
            Ok(f) => f,
            Err(_) => {
                self.counters.packet_in_unparsable += 1;
                return;
            }
        };
        if let L3::Lldp(l) = &frame.l3 {
            self.counters.lldp_received += 1;
            if let (Some(chassis), Some(port)) = (l.chassis_dpid, l.port_no) {
                // Our probes leave only by the up ports their switch reported: a probe
                // that names another port, or the local one, was not sent by us.
                // (A probe from a switch we do not control, as another domain's over an
                // uplink, is no link of ours either, and not a bad one: `link_seen`
                // ignores it.)
                let ours = self.topo.switch(chassis).map(|s| s.ports.get(&port));
                if let Some(named) = ours
                    && !(named.is_some_and(|p| p.up)
                        && port <= ofp::port::MAX
                        && in_port <= ofp::port::MAX)
                {
                    self.counters.packet_in_bad_port += 1;
                    return;
                }
                // A probe that names one of our switches must carry our tag: the names
                // are plain text that any host learns from the probes it receives.
                if ours.is_some() && l.tag != Some(packet::lldp_tag(&self.lldp_key, chassis, port))
                {
                    self.counters.lldp_forged += 1;
                    return;
                }
                if self.topo.link_seen(
                    now,
                    PortRef::new(chassis, port),
                    PortRef::new(dpid, in_port),
                ) {
                    self.event(
                        now,
                        "link-up",
                        format!("{chassis:016x}:{port} - {dpid:016x}:{in_port}"),
                    );
                    self.maybe_recompute_l2(out);
                }
            }
            return;
        }
        self.learn(now, dpid, in_port, frame, out);
        match &frame.l3 {
            L3::Arp(arp) if self.handle_arp(now, dpid, in_port, frame, arp, out) => return,
            L3::Ipv4(ip) => {
                if let Some(tcp) = frame.tcp() {
                    let at = super::vip::Arrival {
                        dpid,
                        in_port,
                        cookie,
                        frame,
                        tcp,
                        data,
                    };
                    if self.handle_tcp(now, &at, ip.src, ip.dst, out) {
                        return;
                    }
                }
            }
            _ => {}
        }
        self.forward_l2(dpid, in_port, frame.eth_dst, data, out);
    }

    fn learn(
        &mut self,
        now: Instant,
        dpid: Dpid,
        in_port: u32,
        frame: &Frame<'_>,
        out: &mut Outbox,
    ) {
        // An address's MAC is learned from ARP, and from IPv4 only for backends (whose
        // MACs place their connections). A client's is not: behind a router, every
        // client address has the router's MAC, and an entry per client address ever seen
        // would grow without bound; each connection keeps its client's MAC instead
        // (`Conn::client_mac`).
        let ip = match &frame.l3 {
            L3::Arp(a) => Some(a.spa),
            L3::Ipv4(ip) if self.backend_index.contains_key(&ip.src) => Some(ip.src),
            _ => None,
        }
        // A service address is the controller's, never a host's: a partitioned service's
        // backends answer from it (direct return), and must not become "the VIP's host".
        .filter(|a| !self.service_addrs.contains(a))
        // A pinned backend address is its pinned MAC's alone.
        .filter(|&a| self.may_claim(frame.eth_src, a));
        // Frames we sent ourselves as a VIP must not teach anything.
        if self.is_virtual_mac(frame.eth_src) {
            return;
        }
        let change = self
            .topo
            .learn_host(now, frame.eth_src, PortRef::new(dpid, in_port));
        match change {
            HostChange::Refused => self.counters.hosts_refused += 1,
            HostChange::PortFull => self.counters.hosts_refused_port_full += 1,
            HostChange::Moved => self.host_moved(frame.eth_src),
            _ => {}
        }
        // A backend's frames that come up carry its address (its ARP, or IPv4 from it).
        let is_backend = ip.is_some_and(|ip| self.backend_index.contains_key(&ip));
        if change.placed() {
            self.install_l2_for(frame.eth_src, out);
            if !is_backend {
                self.client_placed_at(dpid, out);
            }
        }
        let address = match ip {
            Some(ip) if change.known() => self.learn_address(frame.eth_src, ip),
            _ => AddressChange::Ignored,
        };
        // The backends' locations are worth re-reading only when this packet told us
        // something new about a backend: not on every backend packet that comes up, which
        // on the PACKET_IN path would be a scan of every pool.
        if is_backend
            && (address == AddressChange::Learned
                || (change.placed() && address == AddressChange::Same))
        {
            self.sync_backend_locations(now);
        }
    }

    /// The known host `mac` claims `ip`: learned within the address table's bounds, and
    /// counted when refused.
    pub(crate) fn learn_address(&mut self, mac: MacAddr, ip: Ipv4Addr) -> AddressChange {
        let change = self.topo.learn_address(mac, ip);
        match change {
            AddressChange::Refused => self.counters.addresses_refused += 1,
            AddressChange::PortFull => self.counters.addresses_refused_port_full += 1,
            _ => {}
        }
        change
    }

    /// Whether `mac` may claim `ip`: any may, unless `ip` is a backend pinned to another
    /// MAC; that claim is counted. One hash lookup, in a map that is empty unless the
    /// config pins a MAC.
    pub(crate) fn may_claim(&mut self, mac: MacAddr, ip: Ipv4Addr) -> bool {
        if self.pinned_macs.is_empty() {
            return true;
        }
        match self.pinned_macs.get(&ip) {
            Some(&pinned) if pinned != mac => {
                self.counters.address_claims_refused += 1;
                false
            }
            _ => true,
        }
    }

    pub(crate) fn is_virtual_mac(&self, mac: MacAddr) -> bool {
        self.virtual_macs.contains(&mac)
    }

    /// Returns true when the ARP packet was consumed.
    fn handle_arp(
        &mut self,
        now: Instant,
        dpid: Dpid,
        in_port: u32,
        frame: &Frame<'_>,
        arp: &packet::Arp,
        out: &mut Outbox,
    ) -> bool {
        if arp.op == ARP_OP_REQUEST
            && let Some(mac) = self.vip_mac(arp.tpa)
        {
            // The VIP is an address of its own: the controller answers for it.
            let reply = packet::arp_reply(arp, mac);
            out.push(
                dpid,
                rules::packet_out(ofp::port::CONTROLLER, rules::output(in_port), reply),
            );
            self.counters.arp_replies_sent += 1;
            return true;
        }
        if arp.op == ARP_OP_REPLY && self.is_virtual_mac(frame.eth_dst) {
            // An answer to our own probe for a backend or a silent host: learning (hearing)
            // its sender was the point.
            let _ = now;
            return true;
        }
        false
    }

    pub(crate) fn vip_mac(&self, ip: Ipv4Addr) -> Option<MacAddr> {
        self.services
            .iter()
            .find(|s| s.cfg.vip == Some(ip))
            .map(|s| s.cfg.virtual_mac)
    }

    /// Send a packet on toward its destination MAC, or flood it along the tree.
    pub(crate) fn forward_l2(
        &mut self,
        dpid: Dpid,
        in_port: u32,
        dst: MacAddr,
        data: &[u8],
        out: &mut Outbox,
    ) {
        let mut actions = Actions::new();
        match self.topo.host(dst).map(|h| h.at) {
            Some(at) if !dst.is_multicast() => {
                let Some(port) = self.topo.egress_toward(dpid, at) else {
                    return;
                };
                if port == in_port {
                    return;
                }
                actions.push(Action::output(port));
            }
            _ => {
                // A flood that arrives on a link off the tree is a copy we did not send
                // that way: dropping it is what keeps a meshed network loop-free.
                let p = PortRef::new(dpid, in_port);
                if self.topo.is_link_port(p) && !self.topo.is_tree_port(p) {
                    return;
                }
                let mut ports = std::mem::take(&mut self.scratch_ports);
                self.topo.flood_ports(dpid, in_port, &mut ports);
                for &port in &ports {
                    actions.push(Action::output(port));
                }
                self.scratch_ports = ports;
                if actions.is_empty() {
                    return;
                }
            }
        }
        out.push(
            dpid,
            rules::packet_out(in_port, actions, Bytes::copy_from_slice(data)),
        );
    }

    /// Install, on every switch, the rule carrying traffic for `mac` toward it.
    fn install_l2_for(&mut self, mac: MacAddr, out: &mut Outbox) {
        let Some(at) = self.topo.host(mac).map(|h| h.at) else {
            return;
        };
        let dpids: Vec<Dpid> = self.switch_ids().collect();
        for d in dpids {
            match self.topo.egress_toward(d, at) {
                Some(port) => out.push(d, rules::l2_forward(mac, port, self.l2_gen)),
                None => out.push(d, rules::l2_delete(mac)),
            }
        }
    }

    /// After the topology changed, recompute every host's L2 rules on every switch, make
    /// before break: each switch gets every rule again with the other generation bit (an
    /// ADD with the same match and priority replaces a rule in place, §6.4), then the rules
    /// still carrying the old bit, which no host's path uses now, are deleted. A switch in
    /// its reconnect grace keeps those (they may be its earlier controller's, for hosts
    /// not relearned yet) until [`Self::l2_settle`].
    pub(crate) fn maybe_recompute_l2(&mut self, out: &mut Outbox) {
        let generation = self.topo.generation();
        if generation == self.l2_generation {
            return;
        }
        self.l2_generation = generation;
        self.l2_gen = !self.l2_gen;
        let dpids: Vec<Dpid> = self.switch_ids().collect();
        for d in dpids {
            self.l2_sync(d, self.l2_gen, !self.in_grace(d), out);
        }
    }

    /// A rule from a switch's flow stats: if it is one of our L2 rules on a switch in its
    /// reconnect grace, note where it sends its MAC's frames.
    pub(crate) fn note_l2_rule(&mut self, dpid: Dpid, fs: &ofp::FlowStats) {
        if crate::cookie::kind_of(fs.cookie) != Some(crate::cookie::RuleKind::L2)
            || !self.in_grace(dpid)
        {
            return;
        }
        let mac = fs.match_.iter().find_map(|o| match o {
            ofp::Oxm::EthDst { value, mask: None } => Some(MacAddr(*value)),
            _ => None,
        });
        let port = fs.instructions.iter().find_map(|i| match i {
            ofp::Instruction::ApplyActions(a) => a.iter().find_map(|a| match a {
                Action::Output { port, .. } => Some(*port),
                _ => None,
            }),
            _ => None,
        });
        if let (Some(mac), Some(port)) = (mac, port) {
            self.l2_reported.push((mac, PortRef::new(dpid, port)));
        }
    }

    /// Hosts the switches' L2 rules still carry frames to, that this controller has not
    /// heard from since they connected: a host whose traffic all goes to known MACs sends
    /// nothing up, so without this a restarted controller would never learn it again and
    /// its frames would be flooded through the controller. Each is adopted where the rule
    /// of its edge switch sends it: the one port, of all the rules for its MAC, without a
    /// link (by now LLDP has found them). A MAC with two such ports (a link not found yet)
    /// is left to be learned when it speaks.
    pub(crate) fn adopt_reported_hosts(&mut self, now: Instant, out: &mut Outbox) {
        let mut reported = std::mem::take(&mut self.l2_reported);
        reported.sort_unstable_by_key(|&(mac, at)| (mac.0, at.dpid, at.port));
        for run in reported.chunk_by(|a, b| a.0 == b.0) {
            let mac = run[0].0;
            if self.topo.host(mac).is_some() || self.is_virtual_mac(mac) {
                continue;
            }
            let mut edges = run
                .iter()
                .map(|r| r.1)
                .filter(|&at| !self.topo.is_link_port(at));
            let (Some(at), None) = (edges.next(), edges.next()) else {
                continue;
            };
            if self.topo.learn_host(now, mac, at).placed() {
                self.install_l2_for(mac, out);
            }
        }
        self.l2_reported = reported;
    }

    /// A switch's reconnect grace ended: whatever L2 rules it held from before are
    /// replaced or deleted now. Its rules may carry either generation bit, so two passes,
    /// ending on the current one.
    pub(crate) fn l2_settle(&mut self, dpid: Dpid, out: &mut Outbox) {
        self.l2_sync(dpid, !self.l2_gen, true, out);
        self.l2_sync(dpid, self.l2_gen, true, out);
    }

    /// Every known host's rule on switch `d` with generation bit `gen_bit`; then, with
    /// `delete_other`, a barrier (§6.2: the adds land first) and the delete of `d`'s L2
    /// rules of the other generation.
    fn l2_sync(&self, d: Dpid, gen_bit: bool, delete_other: bool, out: &mut Outbox) {
        for (mac, h) in self.topo.hosts() {
            if let Some(port) = self.topo.egress_toward(d, h.at) {
                out.push(d, rules::l2_forward(*mac, port, gen_bit));
            }
        }
        if delete_other {
            out.push(d, Message::BarrierRequest);
            out.push(d, rules::l2_delete_generation(!gen_bit));
        }
    }

    /// LLDP out of every port of one switch, each naming the switch and the port.
    pub(crate) fn send_lldp(&mut self, dpid: Dpid, out: &mut Outbox) {
        let Some(sw) = self.topo.switch(dpid) else {
            return;
        };
        let ports: Vec<(u32, MacAddr)> = sw
            .ports
            .iter()
            .filter(|(no, p)| p.up && **no <= ofp::port::MAX)
            .map(|(no, p)| (*no, p.hw_addr))
            .collect();
        let ttl = (self.config().lldp_interval.as_secs() * 4).clamp(1, 65_535) as u16;
        for (port, mac) in ports {
            let frame = self.lldp_probe(mac, dpid, port, ttl);
            out.push(
                dpid,
                rules::packet_out(ofp::port::CONTROLLER, rules::output(port), frame),
            );
        }
    }

    /// Backends are found on the network, not from a port map: ask for the ones not yet
    /// located with an ARP request out of every edge port.
    pub(crate) fn probe_unlocated_backends(&mut self, out: &mut Outbox) {
        let mut asks: Vec<(MacAddr, Ipv4Addr, Ipv4Addr)> = Vec::new();
        for s in &self.services {
            // Ask as the service: its VIP, or no address at all (an RFC 5227 probe). A
            // partitioned service's backends hold its VIP and drop a request that claims
            // to come from their own address: no address for them either.
            let spa = match (s.cfg.mode, s.cfg.vip) {
                (crate::config::ServiceMode::Partitioned, _) | (_, None) => Ipv4Addr::UNSPECIFIED,
                (_, Some(vip)) => vip,
            };
            for b in &s.backends {
                if b.mac.is_none() && !asks.iter().any(|(_, _, t)| *t == b.address) {
                    asks.push((s.cfg.virtual_mac, spa, b.address));
                }
            }
        }
        if asks.is_empty() {
            return;
        }
        let dpids: Vec<Dpid> = self.switch_ids().collect();
        let mut ports = Vec::new();
        for d in dpids {
            self.topo.edge_ports(d, &mut ports);
            if ports.is_empty() {
                continue;
            }
            for (sha, spa, tpa) in &asks {
                let frame = packet::arp_request(*sha, *spa, *tpa);
                let mut actions = Actions::new();
                for &p in &ports {
                    actions.push(Action::output(p));
                }
                out.push(d, rules::packet_out(ofp::port::CONTROLLER, actions, frame));
            }
        }
    }
}

/// A port a frame can come in by (§7.2.1): a physical port, up to OFPP_MAX, or the
/// switch's local port.
fn is_ingress_port(port: u32) -> bool {
    (1..=ofp::port::MAX).contains(&port) || port == ofp::port::LOCAL
}
