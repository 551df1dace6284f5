//! The controller state machine.
//!
//! [`Controller`] takes events with the time they happened — a switch connected, a message
//! from a switch, a timer tick, a health-probe result, an operator's command — and appends
//! the OpenFlow messages they call for to an [`Outbox`], each addressed to a switch. It does
//! no I/O and reads no clock. The runtime owns the sockets and the timers; tests, the
//! benchmark and the simulator drive the same state machine directly.

pub mod ageing;
mod conn_rule;
mod departing;
mod ended;
pub use ended::{RuleEnded, SILENT_AFTER_MS};
pub mod handshake;
mod held;
mod l2;
mod nicira;
pub(crate) mod overload;
mod partition;
pub use partition::PartitionView;
mod proactive;
mod reroute;
pub use reroute::WALK_STEP;
pub(crate) mod rules;
mod vip;

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use ahash::RandomState;
use bytes::BytesMut;
use ofp::{Message, MultipartReplyBody, PortDesc, PortReason, SwitchFeatures};
use serde::Serialize;
use smallvec::SmallVec;

use crate::balance::{AlgorithmKind, AlgorithmParams};
use crate::config::{BackendConfig, Config, ControllerConfig, ServiceConfig};
use crate::conntrack::ConnTable;
use crate::cookie::RuleKind;
use crate::health::Detector;
use crate::service::{AdminState, BackendId, BackendState, ServiceState};
use crate::topology::{Dpid, HostChange, PortInfo, PortRef, Topology};

/// Messages for switches, produced by one or more calls into the [`Controller`].
/// The runtime drains it after each call; reusing one keeps the hot path allocation-free.
///
/// Two modes. [`Outbox::new`] keeps each message as a [`Message`] in `msgs`, for tests and
/// tools that read them. [`Outbox::encoding`] (the runtime's) encodes each one as it is
/// pushed, into [`Encoded`], and `msgs` stays empty: a FLOW_MOD is a 792-byte value, and
/// memmove of such values was 10–13 % of the controller's CPU in the 16-switch bench
/// profile, where a connection rule's ~170 encoded bytes are cheap to copy.
#[derive(Debug, Default)]
pub struct Outbox {
    pub msgs: Vec<(Dpid, Message)>,
    encoded: Option<Encoded>,
}

/// Messages already encoded, in the order they were pushed, all with xid 0 (the runtime
/// gives each its switch's next one).
#[derive(Debug, Default)]
pub struct Encoded {
    pub bytes: BytesMut,
    /// Each message's switch, type and end in `bytes` (it starts where the one before
    /// ends).
    pub frames: Vec<EncodedFrame>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EncodedFrame {
    pub dpid: Dpid,
    pub msg_type: ofp::MsgType,
    pub end: usize,
}

impl Encoded {
    /// Each message's switch, type and bytes, in order.
    pub fn iter(&self) -> impl Iterator<Item = (Dpid, ofp::MsgType, &[u8])> {
        let mut start = 0;
        self.frames.iter().map(move |f| {
            let b = self.bytes.get(start..f.end).unwrap_or_default();
            start = f.end;
            (f.dpid, f.msg_type, b)
        })
    }

    pub fn clear(&mut self) {
        self.bytes.clear();
        self.frames.clear();
    }

    /// One message that `encode` appends (whole, or nothing when it cannot), framed only
    /// if it did: an empty frame would have the runtime write its xid over the next one's.
    #[inline]
    fn push_with(
        &mut self,
        dpid: Dpid,
        msg_type: ofp::MsgType,
        encode: impl FnOnce(&mut BytesMut),
    ) {
        let before = self.bytes.len();
        encode(&mut self.bytes);
        if self.bytes.len() != before {
            self.frames.push(EncodedFrame {
                dpid,
                msg_type,
                end: self.bytes.len(),
            });
        }
    }

    fn push(&mut self, dpid: Dpid, msg: &(impl ofp::Encode + ?Sized)) {
        match ofp::encode(0, msg, &mut self.bytes) {
            // `encode` appends nothing when it fails.
            Ok(()) => self.frames.push(EncodedFrame {
                dpid,
                msg_type: msg.msg_type(),
                end: self.bytes.len(),
            }),
            Err(e) => {
                tracing::error!(dpid = format_args!("{dpid:016x}"), error = %e, "cannot encode a message for the switch");
            }
        }
    }
}

impl Outbox {
    pub fn new() -> Self {
        Self::default()
    }

    /// An outbox that encodes what is pushed (see [`Outbox`]).
    pub fn encoding() -> Self {
        Outbox {
            msgs: Vec::new(),
            encoded: Some(Encoded {
                bytes: BytesMut::with_capacity(64 * 1024),
                frames: Vec::with_capacity(256),
            }),
        }
    }

    #[inline]
    pub fn push(&mut self, dpid: Dpid, msg: Message) {
        match &mut self.encoded {
            Some(e) => e.push(dpid, &msg),
            None => self.msgs.push((dpid, msg)),
        }
    }

    /// A connection rule: encoded straight from its fields when encoding, without
    /// building the FLOW_MOD (the same bytes: `conn_rule::tests`).
    #[inline]
    pub(crate) fn push_conn_rule(&mut self, dpid: Dpid, rule: &conn_rule::ConnRule) {
        match &mut self.encoded {
            Some(e) => e.push_with(dpid, ofp::MsgType::FlowMod, |b| rule.encode(b)),
            None => self.msgs.push((dpid, Message::FlowMod(rule.flow_mod()))),
        }
    }

    /// A connection's PACKET_OUT, likewise.
    #[inline]
    pub(crate) fn push_conn_packet_out(&mut self, dpid: Dpid, po: &conn_rule::ConnPacketOut<'_>) {
        match &mut self.encoded {
            Some(e) => e.push_with(dpid, ofp::MsgType::PacketOut, |b| po.encode(b)),
            None => self.msgs.push((dpid, po.message())),
        }
    }

    pub fn drain(&mut self) -> std::vec::Drain<'_, (Dpid, Message)> {
        self.msgs.drain(..)
    }

    /// What an encoding outbox holds (`None` for one made by [`Outbox::new`]).
    pub fn encoded_mut(&mut self) -> Option<&mut Encoded> {
        self.encoded.as_mut()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn len(&self) -> usize {
        self.msgs.len() + self.encoded.as_ref().map_or(0, |e| e.frames.len())
    }
}

/// Controller-wide counters.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Counters {
    pub packet_in: u64,
    pub packet_in_unparsable: u64,
    /// PACKET_INs whose in_port is no port a frame can arrive on (§7.2.1: a physical
    /// port up to OFPP_MAX, or OFPP_LOCAL), and LLDP probes naming such a port or one
    /// the claimed switch does not have: nothing is learned from them.
    pub packet_in_bad_port: u64,
    /// Ports a switch reported beyond [`crate::topology::MAX_PORTS_PER_SWITCH`]: not
    /// recorded.
    pub ports_refused: u64,
    pub flow_removed: u64,
    pub of_errors: u64,
    pub lldp_received: u64,
    /// LLDP probes naming one of our switches whose tag is not ours: forged (or from
    /// another controller of the same switch), no link made.
    pub lldp_forged: u64,
    pub arp_replies_sent: u64,
    pub resets_sent: u64,
    pub connections_rebuilt: u64,
    /// New connections on the 4-tuple of an earlier one still in the table (a SYN with
    /// another ISN): decided afresh, the earlier one's accounting ended.
    pub connections_reopened: u64,
    /// Source MACs not learned because the host table was full (`max_hosts`).
    pub hosts_refused: u64,
    /// Source MACs not learned because their port had `max_hosts_per_port` hosts.
    pub hosts_refused_port_full: u64,
    /// Addresses (ARP senders, backends' sources) not learned because the address table
    /// was full (`max_hosts`).
    pub addresses_refused: u64,
    /// Addresses not learned because their host's port had `max_hosts_per_port` of them.
    pub addresses_refused_port_full: u64,
    /// Claims of a pinned backend address (a backend's `mac`) by another MAC, by ARP or
    /// as an IPv4 source: refused, so the backend keeps its connections.
    pub address_claims_refused: u64,
    /// ARP probes sent to hosts silent for `host_timeout` (see [`ageing`]).
    pub host_probes_sent: u64,
    /// Hosts forgotten because they were silent and did not answer the probes.
    pub hosts_aged: u64,
    /// Open connections given rules along new paths because their backend or client
    /// moved, or a link of their path changed (see `reroute`).
    pub connections_rerouted: u64,
    /// Open connections looked at by those walks (each a read of its entry, and after a
    /// change of the links, its paths worked out twice): the walks' work on the tick.
    pub reroute_checked: u64,
    /// Connections whose backend never answered that passive outlier detection did not
    /// count against it, because the backend answered a connection decided after them.
    pub silences_excused_answered: u64,
    /// ... or because a switch on their way was behind meanwhile (its control channel's
    /// round trip over `outlier_max_channel_rtt_ms`).
    pub silences_excused_lag: u64,
    /// Connections found unanswered when their client sent its SYN again
    /// [`SILENT_AFTER_MS`] or more after the decision, rather than when their rules idled
    /// out (then judged, or excused, as any silence).
    pub silences_at_syn_retry: u64,
    /// Spells of such lag, all switches: each began with a reading over the limit.
    pub lag_spells: u64,
    /// Connections whose outcome rule ended without a verdict: the connection was no
    /// longer known (its accounting had ended and its memory as an aborted handshake had
    /// lapsed, or it predates this controller) and the rule carried fewer than two
    /// packets.
    pub outcomes_unjudged_unknown: u64,
    /// ... or the connection was known but its rule carried nothing and lived under a
    /// second (it may have been over before its rules settled).
    pub outcomes_unjudged_short: u64,
    /// ... or the connection was decided before its backend's last ejection started:
    /// that ejection answered for it.
    pub outcomes_unjudged_before_ejection: u64,
}

/// Something that happened, kept in a short ring for operators.
#[derive(Debug, Clone, Serialize)]
pub struct Event {
    /// Milliseconds since the controller started.
    pub at_ms: u64,
    pub kind: &'static str,
    pub detail: String,
}

const EVENT_RING: usize = 256;

#[derive(Debug, Clone)]
struct SwitchState {
    features: SwitchFeatures,
    connected_at: Instant,
    packet_in: u64,
    /// An OpenFlow ERROR from this switch, the last one, for operators.
    last_error: Option<String>,
    /// Until then the L2, proactive and partition rules the switch held when it connected
    /// are left beside the new ones (`reconnect_grace_ms`); `None` once they are settled.
    grace_until: Option<Instant>,
    /// A host that is not a backend has been placed here since the switch connected, so
    /// the SYN-ACK catch is in its table (`Controller::syn_ack_catches`).
    catches_syn_acks: bool,
    /// Its control channel's round trip, as last read by the runtime (an ECHO's wait);
    /// `None` until one is measured.
    channel_rtt: Option<Duration>,
    /// The last time that round trip was over `outlier_max_channel_rtt_ms`, in
    /// controller-relative milliseconds ([`Controller::note_channel_rtt`]).
    lagged_ms: Option<u64>,
    /// Whether the last reading was over it: a spell of lag, logged as it starts.
    lagging: bool,
}

/// What an address:port on the network means to the controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Listener {
    pub(crate) service: u16,
    /// For services without a VIP: the backend the client addressed.
    pub(crate) requested: Option<u16>,
}

pub struct Controller {
    cfg: ControllerConfig,
    epoch: Option<Instant>,
    /// The last `now` asked of [`Controller::ms_since_start`] and
    /// [`Controller::since_refresh`], with their answers: a batch's PACKET_INs share one
    /// `now`, and a new connection asks several times (`Instant` subtractions were 2.4 %
    /// of the controller's samples at its peak, most of them these).
    ms_memo: Option<(Instant, u64)>,
    refresh_memo: Option<(Instant, Duration)>,
    pub(crate) topo: Topology,
    switches: BTreeMap<Dpid, SwitchState>,
    pub(crate) services: Vec<ServiceState>,
    /// One past the highest slot any service has held (`ServiceState::slot`): the range
    /// of group ids a resync clears of stale groups.
    pub(crate) slot_bound: u32,
    /// `(address, port)` that new connections are intercepted on.
    pub(crate) listeners: HashMap<(Ipv4Addr, u16), Listener, RandomState>,
    /// Every service's address and every service's virtual MAC (and the MAC of the host
    /// probes, [`ageing::PROBE_MAC`]): the controller's own, never a host's. Looked up for
    /// every PACKET_IN, so hashed: a scan cost each PACKET_IN a compare per service (over
    /// the services themselves, 4 % of the controller's CPU with 16 services; over a
    /// dense list, still 153 of the core's 3,047 instructions a PACKET_IN, and the set
    /// takes 114 off: callgrind, `flowgate bench controller`, 16 services).
    pub(crate) service_addrs: HashSet<Ipv4Addr, RandomState>,
    pub(crate) virtual_macs: HashSet<flowgate_packet::MacAddr, RandomState>,
    /// Backend address to every `(service, backend)` it serves.
    pub(crate) backend_index: HashMap<Ipv4Addr, SmallVec<[(u16, u16); 2]>, RandomState>,
    /// Backend addresses pinned to a MAC (`mac` in the config): only that MAC may claim
    /// them.
    pub(crate) pinned_macs: HashMap<Ipv4Addr, flowgate_packet::MacAddr, RandomState>,
    pub(crate) conns: ConnTable,
    pub(crate) counters: Counters,
    events: VecDeque<Event>,
    seed: u64,
    /// The key of our LLDP probes' tags ([`flowgate_packet::lldp_tag`]): a probe whose tag does
    /// not match was not sent by this controller, and makes no link.
    lldp_key: flowgate_packet::LldpKey,
    last_refresh: Option<Instant>,
    last_lldp: Option<Instant>,
    last_arp_probe: Option<Instant>,
    /// When the host table was last scanned for silent hosts ([`ageing`]).
    last_host_scan: Option<Instant>,
    /// When a decision was last sampled into the event ring (ms since start).
    pub(crate) last_decision_sample_ms: u64,
    /// The tag of the next decision, in its rules' cookies (wraps; see `rules::conn_tag_bits`).
    pub(crate) next_conn_tag: u16,
    /// Where switches in their reconnect grace have L2 rules sending frames (the
    /// destination MAC and the port), from their flow stats; cleared once every grace
    /// has ended.
    pub(crate) l2_reported: Vec<(flowgate_packet::MacAddr, PortRef)>,
    /// Topology generation the L2 rules were last computed for.
    l2_generation: u64,
    /// The generation bit of the L2 rules last computed ([`crate::cookie::l2::GEN`]).
    l2_gen: bool,
    /// The body of the `fin_timeout` action added to connection rules (built once, static:
    /// each rule's action refers to it, no allocation and no shared reference count).
    pub(crate) fin_timeout_body: Option<&'static [u8]>,
    /// Overload control: the gaps of the services and of the controller itself.
    pub(crate) overload: overload::Overload,
    /// Connections admitted without rules, waiting for their client's ACK.
    pub(crate) handshakes: handshake::Handshakes,
    /// Scratch buffers, reused so the PACKET_IN path does not allocate.
    pub(crate) scratch_path: Vec<(Dpid, u32)>,
    /// The reverse path of the connection being installed.
    pub(crate) scratch_rev: Vec<(Dpid, u32)>,
    pub(crate) scratch_ports: Vec<u32>,
    /// What the switches hold for the proactive services (`mode = "proactive"`).
    pub(crate) proactive: proactive::ProactiveState,
    /// The partitioned services' partitions (`mode = "partitioned"`).
    pub(crate) partitions: partition::PartitionState,
    /// Partitioned VIPs that a reload took to the reactive mode: where their old
    /// partitions' connections go (`departing`).
    pub(crate) departed: Vec<departing::Departed>,
    /// The walk that gives open connections rules along their new paths when a host
    /// moves or the links change.
    pub(crate) reroute: reroute::Reroute,
    /// SYNs held while the controller finds the network again.
    pub(crate) held: held::Held,
}

/// The balancer weighs a backend's measured `rps` over `rps_window` (default: the 10 ms
/// refresh interval) against the picks made since. `BackendState::rps` is an average over
/// [`crate::service::RATE_TIME_CONSTANT`] (1 s), so that is its window; with 10 ms each
/// new pick added 100 req/s to a backend's apparent rate and ISSLM saw every server over
/// any realistic threshold (found in the lab, `docs/lab.md`).
fn rate_window(mut cfg: crate::config::ServiceConfig) -> crate::config::ServiceConfig {
    cfg.params
        .rps_window
        .get_or_insert(crate::service::RATE_TIME_CONSTANT);
    cfg
}

/// The LLDP key a controller starts with, from its config's seed: the core stays
/// deterministic, and the runtime replaces it with a secret one
/// ([`Controller::set_lldp_key`]), as the seed is in the config.
pub fn lldp_key_of_seed(seed: u64) -> flowgate_packet::LldpKey {
    flowgate_packet::LldpKey([
        seed ^ 0x6c6c_6470_6b65_7930,
        seed.rotate_left(32) ^ 0x6c6c_6470_6b65_7931,
    ])
}

impl Controller {
    pub fn new(config: &Config) -> Self {
        let seed = config.controller.seed;
        let mut c = Controller {
            cfg: config.controller.clone(),
            epoch: None,
            ms_memo: None,
            refresh_memo: None,
            topo: Topology::with_host_bounds(
                config.controller.max_hosts,
                config.controller.max_hosts_per_port,
            ),
            switches: BTreeMap::new(),
            services: Vec::new(),
            listeners: HashMap::default(),
            service_addrs: HashSet::default(),
            virtual_macs: HashSet::default(),
            backend_index: HashMap::default(),
            pinned_macs: HashMap::default(),
            conns: ConnTable::with_capacity(config.controller.preallocate_connections),
            counters: Counters::default(),
            events: VecDeque::with_capacity(EVENT_RING),
            seed,
            lldp_key: lldp_key_of_seed(seed),
            last_refresh: None,
            last_lldp: None,
            last_arp_probe: None,
            last_host_scan: None,
            last_decision_sample_ms: 0,
            next_conn_tag: 0,
            l2_reported: Vec::new(),
            l2_generation: 0,
            l2_gen: false,
            fin_timeout_body: (config.controller.fin_timeout_secs > 0)
                .then(|| rules::fin_timeout_body(config.controller.fin_timeout_secs)),
            slot_bound: 0,
            overload: overload::Overload::new(config),
            handshakes: handshake::Handshakes::default(),
            scratch_path: Vec::with_capacity(16),
            scratch_rev: Vec::with_capacity(16),
            scratch_ports: Vec::with_capacity(64),
            proactive: proactive::ProactiveState::default(),
            partitions: partition::PartitionState::default(),
            departed: Vec::new(),
            reroute: reroute::Reroute::default(),
            held: held::Held::default(),
        };
        if let Some((dpid, port)) = config.cluster.uplink {
            c.topo.unbound_port(PortRef::new(dpid, port));
        }
        for (i, s) in config.services.iter().enumerate() {
            // At most `MAX_SERVICES` (config validation): the index fits.
            let slot = i as u16;
            c.services.push(ServiceState::new(
                rate_window(s.clone()),
                slot,
                seed.wrapping_add(u64::from(slot)),
            ));
        }
        c.slot_bound = c.services.len() as u32;
        c.reindex();
        c
    }

    pub fn config(&self) -> &ControllerConfig {
        &self.cfg
    }

    /// Sets the key of the LLDP probes' tags: a secret (random) one, so that a host
    /// cannot forge a probe (the default comes from the config's seed).
    pub fn set_lldp_key(&mut self, key: flowgate_packet::LldpKey) {
        self.lldp_key = key;
    }

    /// An LLDP probe out of port `port` of switch `dpid`, tagged as this controller
    /// tags its own.
    pub fn lldp_probe(
        &self,
        src_mac: flowgate_packet::MacAddr,
        dpid: Dpid,
        port: u32,
        ttl: u16,
    ) -> ofp::Bytes {
        flowgate_packet::lldp_probe(src_mac, dpid, port, ttl, &self.lldp_key)
    }

    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    pub fn topology(&self) -> &Topology {
        &self.topo
    }

    pub fn services(&self) -> &[ServiceState] {
        &self.services
    }

    pub fn connections(&self) -> &ConnTable {
        &self.conns
    }

    pub fn events(&self) -> impl Iterator<Item = &Event> {
        self.events.iter()
    }

    pub(crate) fn ms_since_start(&mut self, now: Instant) -> u64 {
        if let Some((at, ms)) = self.ms_memo
            && at == now
        {
            return ms;
        }
        let epoch = *self.epoch.get_or_insert(now);
        let ms = now.saturating_duration_since(epoch).as_millis() as u64;
        self.ms_memo = Some((now, ms));
        ms
    }

    /// How long since the services' loads were last refreshed (zero before the first).
    pub(crate) fn since_refresh(&mut self, now: Instant) -> Duration {
        if let Some((at, d)) = self.refresh_memo
            && at == now
        {
            return d;
        }
        let d = self
            .last_refresh
            .map(|t| now.saturating_duration_since(t))
            .unwrap_or_default();
        self.refresh_memo = Some((now, d));
        d
    }

    pub(crate) fn event(&mut self, now: Instant, kind: &'static str, detail: String) {
        let at_ms = self.ms_since_start(now);
        if self.events.len() == EVENT_RING {
            self.events.pop_front();
        }
        self.events.push_back(Event {
            at_ms,
            kind,
            detail,
        });
    }

    /// Rebuild the address indexes after the services or their pools changed.
    fn reindex(&mut self) {
        self.listeners.clear();
        self.backend_index.clear();
        self.service_addrs = self.services.iter().filter_map(|s| s.cfg.vip).collect();
        self.virtual_macs = self.services.iter().map(|s| s.cfg.virtual_mac).collect();
        self.virtual_macs.insert(ageing::PROBE_MAC);
        for (si, s) in self.services.iter().enumerate() {
            let si = si as u16;
            match s.cfg.vip {
                Some(vip) => {
                    self.listeners.insert(
                        (vip, s.cfg.port),
                        Listener {
                            service: si,
                            requested: None,
                        },
                    );
                }
                None => {
                    for (bi, b) in s.backends.iter().enumerate() {
                        self.listeners.insert(
                            (b.address, s.cfg.port),
                            Listener {
                                service: si,
                                requested: Some(bi as u16),
                            },
                        );
                    }
                }
            }
            for (bi, b) in s.backends.iter().enumerate() {
                self.backend_index
                    .entry(b.address)
                    .or_default()
                    .push((si, bi as u16));
            }
        }
        let pins = self.services.iter().flat_map(|s| &s.cfg.backends);
        self.pinned_macs = pins.filter_map(|b| Some((b.address, b.mac?))).collect();
        // A pin given now takes the address back from whoever claimed it before, if the
        // pinned host is known; else the pinned host's next frame does.
        let taken: Vec<_> = (self.pinned_macs.iter())
            .filter(|&(&ip, &mac)| self.topo.mac_of(ip).is_some_and(|m| m != mac))
            .map(|(&ip, &mac)| (ip, mac))
            .collect();
        for (ip, mac) in taken {
            self.learn_address(mac, ip);
        }
    }

    /// The addresses the controller intercepts new connections on, with their service.
    fn intercept_rules(&self) -> Vec<Message> {
        let mut v: Vec<(&(Ipv4Addr, u16), &Listener)> = self.listeners.iter().collect();
        v.sort_by_key(|(k, _)| **k);
        v.into_iter()
            // A proactive service's connections go through conntrack and its select
            // group instead (`proactive.rs`).
            .filter(|(_, l)| !self.is_proactive(usize::from(l.service)))
            .filter_map(|(&(addr, port), l)| {
                let slot = self.services.get(usize::from(l.service))?.slot;
                Some(self.overload_intercept(l.service, rules::intercept(slot, addr, port)))
            })
            .collect()
    }

    /// The backends' SYN-ACKs that no connection rule takes, to the controller
    /// (`rules::syn_ack_catch`), under the table-miss's meter: like it, they are packets no
    /// rule asked for. Not a partitioned service's (its backends answer from the VIP, and
    /// no rule rewrites their replies) nor a proactive one's (conntrack places its
    /// replies).
    ///
    /// Only on a switch where a client is attached ([`SwitchState::catches_syn_acks`]):
    /// there a connection's reverse rule rewrites the SYN-ACK, and a cached lookup from
    /// before it would deliver it unrewritten. On a switch of backends only, or a
    /// transit switch, the L2 rule carries a SYN-ACK that beats its connection's rule
    /// exactly where that rule would, so nothing is lost there; caught there, every
    /// SYN-ACK that beat its rule (one whose switch's session lags under load, when the
    /// controller can least afford it) would cost a PACKET_IN for nothing. A client whose
    /// first frame to come up is its SYN (static ARP, and its earlier traffic carried by
    /// L2 rules) brings the catch with that SYN's rules, too late for a lookup cached
    /// before: its first SYN-ACK can still be lost.
    fn syn_ack_catches(&self) -> Vec<Message> {
        let mut caught: Vec<(Ipv4Addr, u16, u16)> = Vec::new();
        for (si, s) in self.services.iter().enumerate() {
            if self.is_proactive(si) || s.cfg.mode == crate::config::ServiceMode::Partitioned {
                continue;
            }
            for b in &s.backends {
                caught.push((b.address, s.cfg.port, s.slot));
            }
        }
        caught.sort_unstable();
        // One rule per address and port, whichever services share it.
        caught.dedup_by_key(|(a, p, _)| (*a, *p));
        caught
            .into_iter()
            .map(|(addr, port, slot)| {
                let m = rules::tcp_match(Some(addr), None, Some(port), None);
                let syn_ack = conn_rule::Syn::AndAck.on(m);
                self.overload_table_miss(rules::syn_ack_catch(slot, syn_ack))
            })
            .collect()
    }

    /// A host that is not a backend was placed on switch `dpid`: the switch gets the
    /// SYN-ACK catch, once per session. Before the host's traffic to a backend can leave
    /// a cached lookup in the switch: the host is placed by its first frame that comes up.
    pub(crate) fn client_placed_at(&mut self, dpid: Dpid, out: &mut Outbox) {
        let Some(s) = self.switches.get_mut(&dpid) else {
            return;
        };
        if s.catches_syn_acks {
            return;
        }
        s.catches_syn_acks = true;
        for m in self.syn_ack_catches() {
            out.push(dpid, m);
        }
    }

    // ----- switch lifecycle -------------------------------------------------------------

    /// A switch finished the handshake (HELLO, FEATURES). Resync it: remove stale proactive
    /// rules, install the current ones, and ask for its ports and its connection rules.
    /// Connection rules are left alone: the connections they carry survive a controller
    /// restart or a switch reconnect, and their flow stats rebuild the table. L2 rules, a
    /// proactive service's rules and group, and partition rules are left alone too, for the
    /// switch's reconnect grace (`reconnect_grace_ms`): a restarted controller (or the peer
    /// that took over) knows no host, no backend's place and no partition's owner yet, and
    /// until it has relearned them the switch keeps carrying established traffic by what it
    /// holds. New rules are added beside them meanwhile; the grace's end deletes the ones
    /// not re-added.
    pub fn handle_switch_up(&mut self, now: Instant, features: SwitchFeatures, out: &mut Outbox) {
        let dpid = features.datapath_id;
        // Its resync deletes every `Gap` rule: the reply-catch rules go out again with the
        // next deferred connection.
        for s in &mut self.services {
            s.handshakes.catch_lost();
        }
        self.ms_since_start(now);
        self.switches.insert(
            dpid,
            SwitchState {
                features,
                connected_at: now,
                packet_in: 0,
                last_error: None,
                grace_until: (!self.cfg.reconnect_grace.is_zero())
                    .then(|| now + self.cfg.reconnect_grace),
                // Its hosts were forgotten with its last session: placed again, a client
                // brings the catch back.
                catches_syn_acks: false,
                channel_rtt: None,
                lagged_ms: None,
                lagging: false,
            },
        );
        self.topo.add_switch(dpid);
        self.event(now, "switch-up", format!("{dpid:016x}"));
        // Full packets to the controller, nothing buffered (§7.3.2 miss_send_len).
        out.push(
            dpid,
            Message::SetConfig(ofp::SwitchConfig {
                flags: 0,
                miss_send_len: ofp::CONTROLLER_MAX_LEN_NO_BUFFER,
            }),
        );
        for kind in RuleKind::PROACTIVE {
            out.push(dpid, rules::delete_kind(kind));
        }
        self.overload_switch_reset(dpid, out);
        // §6.2: without a barrier the switch may reorder; the deletes must be done before
        // the new rules land, or they would delete them.
        out.push(dpid, Message::BarrierRequest);
        self.overload_ensure_meters(now, dpid, out);
        out.push(dpid, self.overload_table_miss(rules::table_miss()));
        out.push(dpid, rules::lldp_to_controller());
        for m in self.intercept_rules() {
            out.push(dpid, m);
        }
        self.proactive_switch_up(dpid, out);
        self.partition_switch_up(dpid, out);
        out.push(dpid, rules::port_desc_request());
        out.push(dpid, rules::flow_stats_request(RuleKind::Conn));
        // Where the switch's L2 rules say hosts are: the ones not heard from again by the
        // grace's end are adopted from them (`adopt_reported_hosts`). A report from an
        // earlier session of the switch is replaced, so one that flaps adds nothing.
        self.l2_reported.retain(|(_, at)| at.dpid != dpid);
        if self.in_grace(dpid) {
            out.push(dpid, rules::flow_stats_request(RuleKind::L2));
        }
        out.push(dpid, Message::BarrierRequest);
        // L2 rules for the hosts already known are sent when paths are recomputed.
        self.l2_generation = 0;
        if !self.in_grace(dpid) {
            self.l2_settle(dpid, out);
        }
    }

    /// A switch's session ended. Its rules stay in the switch (fail-secure); only our view
    /// of the topology forgets it.
    pub fn handle_switch_down(&mut self, now: Instant, dpid: Dpid, out: &mut Outbox) {
        if self.switches.remove(&dpid).is_some() {
            self.overload_switch_down(dpid);
            self.topo.remove_switch(dpid);
            self.event(now, "switch-down", format!("{dpid:016x}"));
            self.sync_backend_locations(now);
            self.maybe_recompute_l2(out);
        }
    }

    /// A PACKET_IN from a switch whose handshake is complete, as the switch sent it (the
    /// whole message), read in place through [`ofp::PacketInView`] rather than decoded
    /// into a [`Message`]: what the sessions do on the PACKET_IN path. It fails as
    /// [`ofp::decode`] would, with the same error, and handles nothing then.
    ///
    /// The frame is borrowed, not a `Bytes`: the sessions read it where it lies in their
    /// read buffer (a handle per frame was a split, a slice and two drops, four atomic
    /// operations per PACKET_IN), and what the core keeps or sends whole of a packet it
    /// copies (a held SYN, an L2 PACKET_OUT), so no read buffer outlives its batch.
    pub fn handle_packet_in_frame(
        &mut self,
        now: Instant,
        dpid: Dpid,
        frame: &[u8],
        out: &mut Outbox,
    ) -> Result<(), ofp::DecodeError> {
        let v = ofp::PacketInView::new(frame)?;
        self.handle_packet_in(now, dpid, (v.in_port(), v.cookie()), v.data(), out);
        Ok(())
    }

    /// A message from a switch whose handshake is complete.
    pub fn handle_message(&mut self, now: Instant, dpid: Dpid, msg: &Message, out: &mut Outbox) {
        match msg {
            Message::PacketIn(pi) => {
                self.handle_packet_in(now, dpid, (pi.in_port(), pi.cookie), &pi.data, out)
            }
            Message::FlowRemoved(fr) => {
                self.handle_rule_ended(now, dpid, &RuleEnded::of_message(fr), out)
            }
            Message::PortStatus(ps) => {
                match ps.reason {
                    PortReason::Delete => self.topo.remove_port(dpid, ps.desc.port_no),
                    _ => self.set_port(dpid, &ps.desc),
                }
                self.sync_backend_locations(now);
                self.maybe_recompute_l2(out);
            }
            Message::MultipartReply(r) => match &r.body {
                MultipartReplyBody::PortDesc(ports) => {
                    for p in ports {
                        self.set_port(dpid, p);
                    }
                    // Discover links at once rather than at the next LLDP tick.
                    self.send_lldp(dpid, out);
                    self.maybe_recompute_l2(out);
                }
                MultipartReplyBody::Flow(stats) => {
                    for fs in stats {
                        self.rebuild_conn(now, fs);
                        self.note_l2_rule(dpid, fs);
                        self.note_partition_rule(dpid, fs);
                        self.note_proactive_rule(dpid, fs);
                    }
                    if !r.more() {
                        // The switch answers its requests in order: the first reply to end
                        // after switch-up is the report of its proactive rules.
                        self.proactive_reported(dpid, out);
                    }
                }
                MultipartReplyBody::Meter(stats) => {
                    self.overload_meter_stats(dpid, stats, r.more());
                }
                _ => {}
            },
            Message::Error(e) => {
                self.counters.of_errors += 1;
                let text = format!("{:?}", e.kind);
                if let Some(s) = self.switches.get_mut(&dpid) {
                    s.last_error = Some(text.clone());
                }
                self.event(now, "openflow-error", format!("{dpid:016x}: {text}"));
            }
            _ => {}
        }
    }

    fn set_port(&mut self, dpid: Dpid, p: &PortDesc) {
        // §7.2.1: ports are numbered from 1 to OFPP_MAX; a port 0 is no port a rule could
        // output to, and numbers above are reserved (LOCAL is no data port: no LLDP, no
        // hosts learned at it).
        if !(1..=ofp::port::MAX).contains(&p.port_no) {
            return;
        }
        // OFPPS_LINK_DOWN = 1, OFPPC_PORT_DOWN = 1 (§7.2.1).
        let up = p.state & 1 == 0 && p.config & 1 == 0;
        let info = PortInfo {
            name: p.name.as_str().to_string(),
            hw_addr: flowgate_packet::MacAddr(p.hw_addr),
            up,
        };
        if !self.topo.set_port(dpid, p.port_no, info) {
            self.counters.ports_refused += 1;
        }
    }

    /// Count one connection's outcome toward its backend's outlier state.
    pub(crate) fn count_outcome(&mut self, now: Instant, si: u16, id: BackendId, answered: bool) {
        let Some(s) = self.services.get_mut(usize::from(si)) else {
            return;
        };
        // A backend that left the pool is judged no more.
        let Some(bi) = s.position(id) else {
            return;
        };
        let Some(address) = s.backends.get(bi).map(|b| b.address) else {
            return;
        };
        let name = s.cfg.name.clone();
        if let Some(until) = s.record_outcome(now, bi, answered) {
            self.note_ejection(now, &name, address, until, Detector::Consecutive);
        }
        // Only this service's pool can have changed: not a walk of every service per
        // FLOW_REMOVED.
        self.note_panic(now, usize::from(si));
    }

    /// Logs an ejection, and records it as an event.
    fn note_ejection(
        &mut self,
        now: Instant,
        service: &str,
        backend: Ipv4Addr,
        until: Instant,
        by: Detector,
    ) {
        let secs = until.saturating_duration_since(now).as_secs();
        let why = match by {
            Detector::Consecutive => "consecutive connections it never answered",
            Detector::SuccessRate => "its share of answered connections far under the pool's",
            Detector::FailurePercentage => "its share of unanswered connections over the threshold",
        };
        tracing::info!(service, backend = %backend, secs, detector = by.as_str(), "backend ejected: {why}");
        self.event(
            now,
            "ejected",
            format!("{service}/{backend} for {secs}s ({})", by.as_str()),
        );
    }

    /// Runs each service's rate detectors (success rate, failure percentage) as their
    /// interval comes due.
    fn sweep_outliers(&mut self, now: Instant) {
        for i in 0..self.services.len() {
            let Some(s) = self.services.get_mut(i) else {
                continue;
            };
            let ejected = s.sweep_outliers(now);
            if ejected.is_empty() {
                continue;
            }
            let name = s.cfg.name.clone();
            let ejected: Vec<(Ipv4Addr, Instant, Detector)> = ejected
                .into_iter()
                .filter_map(|(b, until, by)| Some((s.backends.get(b)?.address, until, by)))
                .collect();
            for (address, until, by) in ejected {
                self.note_ejection(now, &name, address, until, by);
            }
            self.note_panic(now, i);
        }
    }

    /// Logs service `i`'s pool going into or out of panic (`ServiceState::in_panic`), if
    /// it did since the last call.
    fn note_panic(&mut self, now: Instant, i: usize) {
        let Some(s) = self.services.get_mut(i) else {
            return;
        };
        let Some((panic, available, counted)) = s.panic_change() else {
            return;
        };
        let name = s.cfg.name.clone();
        if panic {
            tracing::warn!(service = %name, available, counted, "pool in panic: too few backends available, ejections waived");
            self.event(
                now,
                "panic",
                format!("{name}: {available} of {counted} available, ejections waived"),
            );
        } else {
            tracing::info!(service = %name, "pool out of panic: ejections in force again");
            self.event(now, "panic over", format!("{name}: ejections in force"));
        }
    }

    // ----- timers -----------------------------------------------------------------------

    /// Run whatever is due: load refresh, LLDP probes, link expiry, locating backends,
    /// ageing hosts.
    /// Call it at least every `refresh_interval`.
    pub fn handle_tick(&mut self, now: Instant, out: &mut Outbox) {
        self.ms_since_start(now);
        let due = |last: Option<Instant>, every: Duration| {
            last.is_none_or(|t| now.saturating_duration_since(t) >= every)
        };
        if due(self.last_refresh, self.cfg.refresh_interval) {
            self.last_refresh = Some(now);
            self.refresh_memo = None;
            let stale = self.cfg.refresh_interval * 50 + Duration::from_secs(1);
            for s in &mut self.services {
                s.refresh(now, stale);
            }
            for i in 0..self.services.len() {
                self.note_panic(now, i);
            }
            self.proactive_tick(now, out);
            self.partition_tick(now, out);
        }
        if due(self.last_lldp, self.cfg.lldp_interval) {
            self.last_lldp = Some(now);
            let dpids: Vec<Dpid> = self.switches.keys().copied().collect();
            for d in dpids {
                self.send_lldp(d, out);
            }
            if self.topo.expire_links(now, self.cfg.lldp_interval * 7 / 2) {
                self.event(now, "links-expired", String::new());
            }
        }
        if due(self.last_arp_probe, Duration::from_secs(1)) {
            self.last_arp_probe = Some(now);
            self.probe_unlocated_backends(out);
        }
        self.sweep_outliers(now);
        self.age_hosts(now, out);
        self.expire_handshakes(now);
        self.overload_tick(now, out);
        self.maybe_recompute_l2(out);
        self.end_graces(now, out);
        self.retry_held(now, out);
        self.reroute_step(now, out);
    }

    /// Whether switch `dpid` is in its reconnect grace: the rules it held when it
    /// connected are not deleted yet.
    pub(crate) fn in_grace(&self, dpid: Dpid) -> bool {
        self.switches
            .get(&dpid)
            .is_some_and(|s| s.grace_until.is_some())
    }

    /// Whether any switch is in its reconnect grace (the controller's view of the network
    /// is still being rebuilt).
    pub(crate) fn any_in_grace(&self) -> bool {
        self.switches.values().any(|s| s.grace_until.is_some())
    }

    /// Settle the switches whose reconnect grace is over: their earlier L2, proactive and
    /// partition rules not re-added by now are stale, and deleted.
    fn end_graces(&mut self, now: Instant, out: &mut Outbox) {
        let mut ended = SmallVec::<[Dpid; 4]>::new();
        for (&d, s) in &mut self.switches {
            if s.grace_until.is_some_and(|t| now >= t) {
                s.grace_until = None;
                ended.push(d);
            }
        }
        if ended.is_empty() {
            return;
        }
        self.adopt_reported_hosts(now, out);
        for d in ended {
            // Logged: the deletes that follow change the switch's tables under live
            // traffic, and a stall right after a failover is then placed in time.
            tracing::info!(
                dpid = format_args!("{d:016x}"),
                "reconnect grace over: rules not re-added are deleted"
            );
            self.l2_settle(d, out);
            self.proactive_settle(d, out);
            self.partition_settle(d, out);
        }
        if !self.any_in_grace() {
            self.l2_reported = Vec::new();
            self.partitions.reported = Vec::new();
        }
    }

    // ----- operator commands ------------------------------------------------------------

    pub fn service_index(&self, name: &str) -> Option<usize> {
        self.services.iter().position(|s| s.cfg.name == name)
    }

    /// Stop (or resume) giving new connections to a backend; existing ones are untouched.
    pub fn set_admin(
        &mut self,
        now: Instant,
        service: usize,
        backend: usize,
        admin: AdminState,
    ) -> bool {
        let Some(s) = self.services.get_mut(service) else {
            return false;
        };
        let Some(b) = s.backends.get_mut(backend) else {
            return false;
        };
        // Slow start (re)starts when a drained backend comes back, not when an operator
        // (or a reconciling script) re-asserts the state it is already in.
        if admin == AdminState::Active && b.admin != AdminState::Active {
            b.since = Some(now);
        }
        b.admin = admin;
        let detail = format!("{}/{} {:?}", s.cfg.name, b.address, admin);
        s.sync_eligibility();
        self.event(now, "admin", detail);
        true
    }

    /// The operator's weight for a backend (the API's, as a file's `weight`). It is also
    /// the base a domain controller's spill scales ([`Controller::set_spill_weight`]), so
    /// the next spill decision keeps it (it once put the file's weight back).
    pub fn set_weight(&mut self, service: usize, backend: usize, weight: u32) -> bool {
        let Some(s) = self.services.get_mut(service) else {
            return false;
        };
        let (Some(b), Some(cfg)) = (s.backends.get_mut(backend), s.cfg.backends.get_mut(backend))
        else {
            return false;
        };
        b.weight = weight;
        cfg.weight = weight;
        true
    }

    /// The weight a backend takes new connections by, leaving the operator's as it is:
    /// a domain controller's spill decision, which scales the operator's weights of its
    /// own backends and weighs the other domains' (`remote`) behind its uplink. The
    /// change takes effect at the next refresh.
    pub fn set_spill_weight(
        &mut self,
        service: usize,
        backend: usize,
        weight: u32,
        remote: bool,
    ) -> bool {
        let Some(b) = self
            .services
            .get_mut(service)
            .and_then(|s| s.backends.get_mut(backend))
        else {
            return false;
        };
        b.weight = weight;
        b.remote = remote;
        true
    }

    pub fn set_algorithm(
        &mut self,
        now: Instant,
        service: usize,
        kind: AlgorithmKind,
        params: AlgorithmParams,
    ) -> Result<(), String> {
        params.validate(kind)?;
        let seed = self.seed;
        let s = self.services.get_mut(service).ok_or("no such service")?;
        if let Some(why) = crate::config::mode_algorithm_conflict(s.cfg.mode, kind) {
            return Err(why);
        }
        let mut params = params;
        params
            .rps_window
            .get_or_insert(crate::service::RATE_TIME_CONSTANT);
        s.set_algorithm(kind, params, seed.wrapping_add(u64::from(s.slot)));
        let detail = format!("{} -> {kind}", s.cfg.name);
        self.event(now, "algorithm", detail);
        Ok(())
    }

    /// Add a backend to a service's pool. Returns its index.
    pub fn add_backend(
        &mut self,
        now: Instant,
        service: usize,
        cfg: BackendConfig,
        out: &mut Outbox,
    ) -> Result<usize, String> {
        let cfgs: Vec<&ServiceConfig> = self.services.iter().map(|s| &s.cfg).collect();
        if let Some(why) = crate::config::backend_conflict(&cfgs, service, cfg.address) {
            return Err(why);
        }
        // Numbered afresh only when it must be: a backend added back takes its own
        // number, and the renumbering would forget its open connections.
        if self
            .services
            .get(service)
            .is_some_and(|s| s.out_of_numbers_for(cfg.address))
        {
            self.renumber_backends(service);
        }
        let s = self.services.get_mut(service).ok_or("no such service")?;
        let mut b = BackendState::new(&cfg);
        b.since = Some(now);
        // A pool holds fewer than `MAX_BACKENDS` here (`backend_conflict`): numbered
        // afresh, it has numbers to give.
        let idx = s
            .join(b, cfg)
            .ok_or("the service has no backend number left")?;
        s.pool_changed(now);
        self.reindex();
        self.sync_backend_locations(now);
        self.reinstall_intercepts(out);
        self.probe_unlocated_backends(out);
        Ok(idx)
    }

    /// Remove a backend. Its open connections keep their rules, and their way to it,
    /// until they end, uncounted (no connection is broken by a pool change). The table is
    /// left as it is: they keep their backend's number ([`BackendId`]).
    pub fn remove_backend(
        &mut self,
        now: Instant,
        service: usize,
        backend: usize,
        out: &mut Outbox,
    ) -> Result<(), String> {
        let s = self.services.get_mut(service).ok_or("no such service")?;
        if !s.remove_backend(now, backend) {
            return Err("no such backend".into());
        }
        self.reindex();
        self.reinstall_intercepts(out);
        Ok(())
    }

    /// Number service `si`'s pool afresh ([`ServiceState::renumber`]): its connections
    /// take their backends' new numbers, and those of backends that left the pool are
    /// forgotten (their rules stay until idle, uncounted). A pass over the table, once
    /// every 65,535 backends that joined the service.
    fn renumber_backends(&mut self, si: usize) {
        let Some(s) = self.services.get_mut(si) else {
            return;
        };
        let map = s.renumber();
        let mut fates: Vec<Fate> = (0..self.services.len() as u16).map(Fate::Stays).collect();
        if let Some(f) = fates.get_mut(si) {
            *f = Fate::Renumbered(si as u16, map);
        }
        self.move_connections(&fates);
    }

    /// Take each service's connections where `fates` (by the service's position) says,
    /// in one pass over the table; none if every service stays where it is, its numbers
    /// holding.
    fn move_connections(&mut self, fates: &[Fate]) {
        let moved = fates
            .iter()
            .enumerate()
            .any(|(oi, f)| !matches!(f, Fate::Stays(ni) if usize::from(*ni) == oi));
        if !moved {
            return;
        }
        self.conns
            .retain(|_, c| match fates.get(usize::from(c.service)) {
                Some(Fate::Stays(ni)) => {
                    c.service = *ni;
                    true
                }
                Some(Fate::Renumbered(ni, map)) => {
                    match map.get(usize::from(c.backend.0)).copied().flatten() {
                        Some(id) => {
                            c.service = *ni;
                            c.backend = id;
                            true
                        }
                        None => false,
                    }
                }
                Some(Fate::Gone) | None => false,
            });
    }

    fn reinstall_intercepts(&mut self, out: &mut Outbox) {
        let msgs = self.intercept_rules();
        let dpids: Vec<Dpid> = self.switches.keys().copied().collect();
        for &dpid in &dpids {
            let now = self.switches[&dpid].connected_at;
            self.overload_ensure_meters(now, dpid, out);
        }
        // Pools or modes may have changed: the proactive services' groups and rules too
        // (make before break: they are not among the intercepts' deletes). First: a VIP
        // that leaves the proactive mode has its retiring rule (above the intercept) before
        // its intercept comes, so that its old connections' segments never meet the
        // intercept beside its proactive rule of the same priority (OpenFlow leaves which
        // one matches undefined, §6.4), where a revalidator could cache the intercept's
        // answer for them.
        self.proactive_resync(out);
        let catches = self.syn_ack_catches();
        for (&dpid, s) in &self.switches {
            out.push(dpid, rules::delete_kind(RuleKind::Intercept));
            out.push(dpid, Message::BarrierRequest);
            for m in &msgs {
                out.push(dpid, m.clone());
            }
            if s.catches_syn_acks {
                for m in &catches {
                    out.push(dpid, m.clone());
                }
            }
        }
        self.partition_resync(out);
    }

    /// Replace the services with a new configuration's, keeping every live connection and
    /// every backend's learned state where the backend stays.
    pub fn reload(&mut self, now: Instant, config: &Config, out: &mut Outbox) {
        self.seed = config.controller.seed;
        let mut old: Vec<ServiceState> = std::mem::take(&mut self.services);
        // Each service that stays (by name) keeps its slot; a new one takes the lowest
        // slot no service held before this reload, so no meter, group or cookie changes
        // hands while rules that name it may still be on a switch.
        let prev_index: Vec<Option<usize>> = config
            .services
            .iter()
            .map(|scfg| old.iter().position(|o| o.cfg.name == scfg.name))
            .collect();
        let mut taken: HashSet<u16> = old.iter().map(|o| o.slot).collect();
        let mut free = (0..=u16::MAX).filter(|n| !taken.contains(n));
        let slots: Vec<u16> = prev_index
            .iter()
            .map(|p| match p {
                Some(p) => old[*p].slot,
                // At most `MAX_SERVICES` old and new: a free slot exists.
                None => free.next().unwrap_or(u16::MAX),
            })
            .collect();
        taken.clear();
        taken.extend(slots.iter().copied());
        let freed: Vec<u16> = old
            .iter()
            .map(|o| o.slot)
            .filter(|n| !taken.contains(n))
            .collect();
        let mut kept_numbers = Vec::with_capacity(config.services.len());
        for ((scfg, prev), &slot) in config.services.iter().zip(&prev_index).zip(&slots) {
            let seed = self.seed.wrapping_add(u64::from(slot));
            let mut s = ServiceState::new(rate_window(scfg.clone()), slot, seed);
            kept_numbers.push(match prev.and_then(|p| old.get_mut(p)) {
                Some(prev) => carry_over(now, prev, &mut s),
                None => true,
            });
            self.services.push(s);
        }
        self.slot_bound = slots
            .iter()
            .map(|&n| u32::from(n) + 1)
            .fold(self.slot_bound, u32::max);
        self.proactive.reorder(&prev_index);
        self.partition_depart(now, &old, out);
        // Where each old service's connections go: to the service's new place (by name),
        // each with its backend's number, which the reload kept, unless the service had
        // given all its numbers and numbered its pool afresh (then by address). Those of
        // a service that went are forgotten, their rules left until idle, uncounted;
        // those of a backend that left the pool keep its number, and their way. A reload
        // that moves no service leaves the table alone, however its pools changed: a pass
        // over it, under the lock the PACKET_IN path waits for, took 67–89 ms with 2.8
        // million connections (`docs/benchmarks.md`, stop 46).
        let fates: Vec<Fate> = old
            .iter()
            .map(|o| {
                let Some((ni, s)) = self
                    .services
                    .iter()
                    .enumerate()
                    .find(|(_, s)| s.cfg.name == o.cfg.name)
                else {
                    return Fate::Gone;
                };
                if kept_numbers.get(ni).copied().unwrap_or(true) {
                    return Fate::Stays(ni as u16);
                }
                let mut map = vec![None; o.numbers_given()];
                for b in &o.backends {
                    if let Some(m) = map.get_mut(usize::from(b.id.0)) {
                        *m = s.backend_index(b.address).and_then(|p| s.id_at(p));
                    }
                }
                Fate::Renumbered(ni as u16, map)
            })
            .collect();
        self.move_connections(&fates);
        self.cfg = config.controller.clone();
        self.topo
            .set_host_bounds(self.cfg.max_hosts, self.cfg.max_hosts_per_port);
        self.overload.reload(config, &slots);
        self.reindex();
        self.sync_backend_locations(now);
        self.reinstall_intercepts(out);
        self.overload_release(&freed, out);
        self.event(now, "reload", format!("{} services", self.services.len()));
    }

    // ----- introspection ----------------------------------------------------------------

    pub fn switch_ids(&self) -> impl Iterator<Item = Dpid> + '_ {
        self.switches.keys().copied()
    }

    /// Per-switch figures for operators.
    pub fn switch_view(&self, dpid: Dpid) -> Option<SwitchView> {
        let s = self.switches.get(&dpid)?;
        let ports = self.topo.switch(dpid).map(|sw| sw.ports.len()).unwrap_or(0);
        Some(SwitchView {
            dpid,
            n_tables: s.features.n_tables,
            ports,
            packet_in: s.packet_in,
            connected_at: s.connected_at,
            last_error: s.last_error.clone(),
            channel_rtt: s.channel_rtt,
        })
    }

    /// Backends get their location (MAC) from the hosts learned on the network.
    pub(crate) fn sync_backend_locations(&mut self, now: Instant) {
        for s in &mut self.services {
            let mut changed = false;
            for b in &mut s.backends {
                let mac = self.topo.locate_ip(b.address).map(|(m, _)| m);
                if mac != b.mac {
                    changed = true;
                    if b.mac.is_none() {
                        b.since.get_or_insert(now);
                    }
                    b.mac = mac;
                }
            }
            if changed {
                s.sync_eligibility();
            }
        }
    }

    /// Cluster mode: a backend of another domain, reached through `at` (this domain's
    /// uplink), with the MAC its own domain reported. Its weight decides whether it takes
    /// new connections (the global controller's spill weights). False for an address that
    /// is no backend here.
    pub fn place_remote_backend(
        &mut self,
        now: Instant,
        ip: Ipv4Addr,
        mac: flowgate_packet::MacAddr,
        at: PortRef,
    ) -> bool {
        if !self.backend_index.contains_key(&ip) {
            return false;
        }
        if !self.may_claim(mac, ip) {
            return true;
        }
        if self.topo.locate_ip(ip) != Some((mac, at)) {
            let change = self.topo.learn_host(now, mac, at);
            if change == HostChange::Moved {
                self.host_moved(mac);
            }
            if change.known() {
                self.learn_address(mac, ip);
            }
            self.sync_backend_locations(now);
        }
        true
    }

    /// Feed one active probe result; the backend's rise/fall state decides its health.
    pub fn handle_probe(
        &mut self,
        now: Instant,
        service: usize,
        backend: usize,
        result: ProbeResult,
    ) {
        let Some(b) = self
            .services
            .get_mut(service)
            .and_then(|s| s.backends.get_mut(backend))
        else {
            return;
        };
        let transition = match result {
            ProbeResult::Ok => b.health.on_probe(true),
            ProbeResult::Failed => b.health.on_probe(false),
            // A refused connection is the backend's own kernel saying nothing listens:
            // no reason to wait for `fall` more probes (Envoy treats a bad HTTP status so).
            ProbeResult::Refused => b.health.force_down(),
        };
        match transition {
            Some(crate::health::HealthTransition::Up) => {
                self.handle_health(now, service, backend, true)
            }
            Some(crate::health::HealthTransition::Down) => {
                self.handle_health(now, service, backend, false)
            }
            None => {}
        }
    }

    /// Set a backend's health (from the probes, or an operator).
    pub fn handle_health(&mut self, now: Instant, service: usize, backend: usize, healthy: bool) {
        let Some(s) = self.services.get_mut(service) else {
            return;
        };
        let Some(b) = s.backends.get_mut(backend) else {
            return;
        };
        if b.healthy != healthy {
            b.healthy = healthy;
            if healthy {
                b.since = Some(now);
            }
            let detail = format!(
                "{}/{} {}",
                s.cfg.name,
                b.address,
                if healthy { "up" } else { "down" }
            );
            s.sync_eligibility();
            self.event(now, "health", detail);
        }
    }

    /// Load figures read from a backend's own metrics endpoint.
    pub fn handle_backend_load(
        &mut self,
        now: Instant,
        service: usize,
        backend: usize,
        load: crate::metrics_text::LoadSample,
    ) {
        let Some(b) = self
            .services
            .get_mut(service)
            .and_then(|s| s.backends.get_mut(backend))
        else {
            return;
        };
        b.metrics_at = Some(now);
        b.picks_since_metrics = 0;
        if load.rps.is_some() {
            b.reported_rps = load.rps;
        }
        if load.cpu.is_some() {
            b.cpu = load.cpu;
        }
        b.reported_active = load.active;
        if let Some(ms) = load.response_time_ms {
            // The backend's own latency figure replaces the probes' round trip: the two
            // measure different things and must not share one average.
            if !b.rt_from_metrics {
                b.response_time_ms = None;
                b.rt_from_metrics = true;
            }
            self.record_response_time(service, backend, ms);
        }
    }

    /// A probe's round trip (ms) to a backend: its response time, unless the backend
    /// reports its own.
    pub fn handle_response_time(&mut self, service: usize, backend: usize, ms: f64) {
        if self
            .services
            .get(service)
            .and_then(|s| s.backends.get(backend))
            .is_some_and(|b| b.rt_from_metrics)
        {
            return;
        }
        self.record_response_time(service, backend, ms);
    }

    fn record_response_time(&mut self, service: usize, backend: usize, ms: f64) {
        if let Some(b) = self
            .services
            .get_mut(service)
            .and_then(|s| s.backends.get_mut(backend))
        {
            // EWMA with α = 0.2 (load-balancing-anchors §1.4): the one smoothing of a
            // response time; every balancer, SRT included, reads it as is.
            b.response_time_ms = Some(match b.response_time_ms {
                Some(prev) => prev + 0.2 * (ms - prev),
                None => ms,
            });
        }
    }
}

/// Where a reload takes an old service's connections.
enum Fate {
    /// To the service's new place; their backends' numbers hold.
    Stays(u16),
    /// To the service's new place, which numbered its pool afresh: each old number's new
    /// one (by the old number as index; `None`: its backend is gone).
    Renumbered(u16, Vec<Option<BackendId>>),
    /// Nowhere: the service is gone.
    Gone,
}

/// `next` is `prev` reconfigured by a reload: it keeps what was learned of the backends
/// that stay, and their numbers. False if it had to number its pool afresh
/// ([`ServiceState::number_after`]).
fn carry_over(now: Instant, prev: &mut ServiceState, next: &mut ServiceState) -> bool {
    let health = &next.cfg.health;
    for (j, b) in next.backends.iter_mut().enumerate() {
        if let Some(i) = prev.backends.iter().position(|p| p.address == b.address) {
            *b = prev.backends[i].reconfigured(b, health, now);
            // An ejected backend stays ejected (the next refresh reads the detector).
            if let Some(h) = prev.outliers.host(i) {
                next.outliers.keep(j, h);
            }
        }
    }
    next.outliers.keep_sweep(&prev.outliers);
    next.counters = prev.counters.clone();
    // The handshake figures are counters too (`…_handshakes_deferred_total`), and whether
    // the service's clients complete is theirs, not the file's. The backends' reply-catch
    // rules go out again at the next deferral: the pool may have changed.
    next.handshakes = prev.handshakes;
    next.handshakes.catch_lost();
    next.keep_balancer(prev);
    // A pool in panic stays in it across a reload unless the reload changes that: not
    // counted or logged again as a new panic.
    next.keep_panic(prev);
    next.sync_eligibility();
    next.number_after(prev)
}

/// The outcome of one active health probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeResult {
    /// Connected (and, for HTTP, a 2xx/3xx answer).
    Ok,
    /// Timed out, reset mid-way, or a bad HTTP status: counts toward `fall`.
    Failed,
    /// Connection refused: the backend is down now.
    Refused,
}

/// Per-switch figures for operators.
#[derive(Debug, Clone)]
pub struct SwitchView {
    pub dpid: Dpid,
    pub n_tables: u8,
    pub ports: usize,
    pub packet_in: u64,
    pub connected_at: Instant,
    pub last_error: Option<String>,
    /// The control channel's round trip as last measured (`None`: not probed).
    pub channel_rtt: Option<Duration>,
}

#[cfg(test)]
mod tests;
