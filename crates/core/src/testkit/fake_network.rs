//! Several fake switches joined by links, with hosts on their edge ports: Faucet's
//! `FakeOFNetwork`. A packet sent by a host is traced hop by hop, switch to switch, until
//! it reaches hosts, the controller, or nowhere.

use std::collections::{BTreeMap, HashSet, VecDeque};

use ofp::Message;

use super::fake_table::{FakeTable, FakeTableError, PacketFields, Trace};

/// A switch port: `(dpid, port_no)`.
pub type PortRef = (u64, u32);

/// Why a delivery could not be traced.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NetworkError {
    /// No host of that name.
    #[error("no host named {0:?}")]
    UnknownHost(String),
    /// A port refers to a switch that was not added.
    #[error("no switch with dpid {0:#x}")]
    UnknownSwitch(u64),
    /// The same packet arrived twice on the same port: a forwarding loop.
    #[error("forwarding loop: the packet came back to {dpid:#x} port {port} after {hops} hops")]
    Loop {
        /// Switch.
        dpid: u64,
        /// Port it arrived on again.
        port: u32,
        /// Hops travelled.
        hops: usize,
    },
    /// More hops than [`FakeNetwork::set_max_hops`] allows.
    #[error("more than {0} hops")]
    TooManyHops(usize),
}

/// One switch's part in a delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hop {
    /// Switch.
    pub dpid: u64,
    /// Port the packet arrived on.
    pub in_port: u32,
    /// What the switch did with it.
    pub trace: Trace,
}

/// Where a packet ended up.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Delivery {
    /// Hosts reached, with the packet as they received it, in order of arrival.
    pub hosts: Vec<(String, PacketFields)>,
    /// PACKET_INs: the switch, the packet as sent to the controller, and the cookie of
    /// the rule that sent it.
    pub to_controller: Vec<(u64, PacketFields, u64)>,
    /// Outputs to ports with neither link nor host (or to NORMAL/LOCAL/unexpanded FLOOD).
    pub lost: Vec<(PortRef, PacketFields)>,
    /// Every switch traversal, in order.
    pub hops: Vec<Hop>,
}

impl Delivery {
    /// The names of the hosts reached, in order (a host reached twice appears twice).
    pub fn host_names(&self) -> Vec<&str> {
        self.hosts.iter().map(|(h, _)| h.as_str()).collect()
    }
    /// The packet as host `name` received it (first copy).
    pub fn received_by(&self, name: &str) -> Option<&PacketFields> {
        self.hosts.iter().find(|(h, _)| h == name).map(|(_, p)| p)
    }
    /// Reached no host and no controller.
    pub fn dropped(&self) -> bool {
        self.hosts.is_empty() && self.to_controller.is_empty()
    }
    /// The cookies of every entry hit, switch by switch.
    pub fn cookies(&self) -> Vec<u64> {
        self.hops.iter().flat_map(|h| h.trace.cookies()).collect()
    }
}

/// Switches, links and hosts. See the module docs.
#[derive(Debug, Clone)]
pub struct FakeNetwork {
    switches: BTreeMap<u64, FakeTable>,
    links: BTreeMap<PortRef, PortRef>,
    hosts: BTreeMap<PortRef, String>,
    host_ports: BTreeMap<String, PortRef>,
    max_hops: usize,
}

impl Default for FakeNetwork {
    fn default() -> Self {
        Self::new()
    }
}

impl FakeNetwork {
    /// An empty network; at most 64 switch traversals per delivery.
    pub fn new() -> Self {
        FakeNetwork {
            switches: BTreeMap::new(),
            links: BTreeMap::new(),
            hosts: BTreeMap::new(),
            host_ports: BTreeMap::new(),
            max_hops: 64,
        }
    }

    /// Bounds the number of switch traversals of one delivery.
    pub fn set_max_hops(&mut self, n: usize) {
        self.max_hops = n;
    }

    /// Adds (or replaces) switch `dpid`.
    pub fn add_switch(&mut self, dpid: u64, table: FakeTable) -> &mut FakeTable {
        self.switches.insert(dpid, table);
        self.switches.entry(dpid).or_default()
    }

    /// Switch `dpid`.
    pub fn switch(&self, dpid: u64) -> Option<&FakeTable> {
        self.switches.get(&dpid)
    }

    /// Switch `dpid`, mutably.
    pub fn switch_mut(&mut self, dpid: u64) -> Option<&mut FakeTable> {
        self.switches.get_mut(&dpid)
    }

    /// The dpids, in order.
    pub fn dpids(&self) -> impl Iterator<Item = u64> + '_ {
        self.switches.keys().copied()
    }

    /// A bidirectional link between two switch ports.
    pub fn add_link(&mut self, a: PortRef, b: PortRef) {
        self.links.insert(a, b);
        self.links.insert(b, a);
    }

    /// Removes the link at `a` (both directions).
    pub fn remove_link(&mut self, a: PortRef) {
        if let Some(b) = self.links.remove(&a) {
            self.links.remove(&b);
        }
    }

    /// The far end of the link at `at`.
    pub fn peer(&self, at: PortRef) -> Option<PortRef> {
        self.links.get(&at).copied()
    }

    /// Host `name` on switch port `at`.
    pub fn add_host(&mut self, name: &str, at: PortRef) {
        self.hosts.insert(at, name.to_string());
        self.host_ports.insert(name.to_string(), at);
    }

    /// Host `name` is unplugged from where it was and plugged in at `at` (a virtual
    /// machine migrated to another hypervisor, keeping its addresses).
    pub fn move_host(&mut self, name: &str, at: PortRef) {
        if let Some(old) = self.host_ports.remove(name) {
            self.hosts.remove(&old);
        }
        self.add_host(name, at);
    }

    /// The host attached at `at`, if any.
    pub fn host_at(&self, at: PortRef) -> Option<&str> {
        self.hosts.get(&at).map(String::as_str)
    }

    /// Where host `name` is attached.
    pub fn host_port(&self, name: &str) -> Option<PortRef> {
        self.host_ports.get(name).copied()
    }

    /// Applies a message to switch `dpid`.
    pub fn apply(&mut self, dpid: u64, msg: &Message) -> Result<(), NetworkApplyError> {
        self.switches
            .get_mut(&dpid)
            .ok_or(NetworkApplyError::UnknownSwitch(dpid))?
            .apply(msg)
            .map_err(|e| NetworkApplyError::Refused { dpid, error: e })
    }

    /// Applies messages addressed to switches, in order, stopping at the first refusal.
    pub fn apply_all<'m, I>(&mut self, msgs: I) -> Result<(), NetworkApplyError>
    where
        I: IntoIterator<Item = &'m (u64, Message)>,
    {
        for (dpid, m) in msgs {
            self.apply(*dpid, m)?;
        }
        Ok(())
    }

    /// Advances every switch's clock, expiring timed-out entries.
    pub fn expire(&mut self, now_secs: u64) {
        for t in self.switches.values_mut() {
            t.expire(now_secs);
        }
    }

    /// Host `from_host` sends a packet with these fields (its `in_port` is replaced by
    /// the host's port); follows it through switches and links (read-only: counters are
    /// not touched). Fails on a loop (the same packet arriving twice on the same port) or
    /// after too many hops.
    pub fn deliver(&self, from_host: &str, pkt: PacketFields) -> Result<Delivery, NetworkError> {
        let (dpid, port) = self
            .host_port(from_host)
            .ok_or_else(|| NetworkError::UnknownHost(from_host.to_string()))?;
        self.inject((dpid, port), pkt)
    }

    /// As [`FakeNetwork::deliver`], from a raw frame.
    pub fn deliver_frame(&self, from_host: &str, data: &[u8]) -> Result<Delivery, NetworkError> {
        // Unparseable frames are described by their (absent) fields: all defaults.
        let pkt = PacketFields::from_frame(0, data).unwrap_or_default();
        self.deliver(from_host, pkt)
    }

    /// A packet arriving on switch port `at` (from a host, or sent by the controller).
    pub fn inject(&self, at: PortRef, pkt: PacketFields) -> Result<Delivery, NetworkError> {
        let mut out = Delivery::default();
        let mut seen: HashSet<(u64, PacketFields)> = HashSet::new();
        let mut queue = VecDeque::from([(at.0, at.1, pkt)]);
        while let Some((dpid, in_port, mut pkt)) = queue.pop_front() {
            if out.hops.len() >= self.max_hops {
                return Err(NetworkError::TooManyHops(self.max_hops));
            }
            pkt.in_port = in_port;
            // Metadata is pipeline state; it does not travel.
            pkt.metadata = 0;
            if !seen.insert((dpid, pkt)) {
                return Err(NetworkError::Loop {
                    dpid,
                    port: in_port,
                    hops: out.hops.len(),
                });
            }
            let sw = self
                .switches
                .get(&dpid)
                .ok_or(NetworkError::UnknownSwitch(dpid))?;
            let trace = sw.lookup(&pkt);
            for &(p, cookie) in &trace.to_controller {
                out.to_controller.push((dpid, p, cookie));
            }
            for (port, p) in &trace.outputs {
                let here = (dpid, *port);
                if let Some(name) = self.hosts.get(&here) {
                    out.hosts.push((name.clone(), *p));
                } else if let Some(&(peer, peer_port)) = self.links.get(&here) {
                    queue.push_back((peer, peer_port, *p));
                } else {
                    out.lost.push((here, *p));
                }
            }
            out.hops.push(Hop {
                dpid,
                in_port,
                trace,
            });
        }
        Ok(out)
    }
}

/// Why [`FakeNetwork::apply`] failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NetworkApplyError {
    /// No such switch.
    #[error("no switch with dpid {0:#x}")]
    UnknownSwitch(u64),
    /// The switch refused the message.
    #[error("switch {dpid:#x} refused: {error}")]
    Refused {
        /// Switch.
        dpid: u64,
        /// Its error.
        error: FakeTableError,
    },
}
