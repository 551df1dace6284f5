//! Rules the switch reports gone (OFPT_FLOW_REMOVED, §7.4.2). A connection's forward rule
//! at the client's edge ends its accounting; its reverse rule there says whether the
//! backend answered (passive outlier detection). One or two per connection, as many as
//! there are new connections: the runtime reads them straight from the frame
//! ([`ofp::FlowRemovedView`]) and prefetches their table lines with the batch's PACKET_INs.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use ofp::oxm::ofb;

use super::{Controller, Outbox, rules};
use crate::conntrack::{Conn, ConnKey, Reply};
use crate::cookie::{self, RuleKind};
use crate::service::BackendId;
use crate::topology::Dpid;

/// How long after its decision a connection's client may send its SYN again before the
/// connection is judged silent (`Controller::note_syn_again`): past a first
/// retransmission at 1 s, short of Linux's second at 3 s.
pub const SILENT_AFTER_MS: u64 = 2_500;

/// What the controller reads of a FLOW_REMOVED: the cookie, the table, the counters, and
/// the rule's exact 4-tuple.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuleEnded {
    pub(crate) cookie: u64,
    pub(crate) table_id: u8,
    pub(crate) duration_sec: u32,
    pub(crate) packet_count: u64,
    pub(crate) tuple: Tuple,
}

/// The exact (unmasked) IPv4 addresses and TCP ports of a rule's match: the last of each
/// field where a match repeats one, as a decoded match's fields are read in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Tuple {
    pub(crate) src: Option<Ipv4Addr>,
    pub(crate) dst: Option<Ipv4Addr>,
    pub(crate) sport: Option<u16>,
    pub(crate) dport: Option<u16>,
}

impl Tuple {
    /// From a decoded match (a FLOW_REMOVED's, or a rule's in a flow-stats reply).
    pub(crate) fn of_match(m: &ofp::Match) -> Tuple {
        let mut t = Tuple::default();
        for o in m.iter() {
            match *o {
                ofp::Oxm::Ipv4Src { value, mask: None } => t.src = Some(value),
                ofp::Oxm::Ipv4Dst { value, mask: None } => t.dst = Some(value),
                ofp::Oxm::TcpSrc(p) => t.sport = Some(p),
                ofp::Oxm::TcpDst(p) => t.dport = Some(p),
                _ => {}
            }
        }
        t
    }

    /// From a match's TLVs on the wire: what [`Tuple::of_match`] reads of the same match,
    /// since `OxmRef::basic` types a TLV exactly as `decode` does (of the basic class
    /// only: §7.2.3.1, a field number means a field within its class). A TLV that is not a
    /// field's exact value is skipped, as there, and leaves an earlier exact one in place.
    fn of_fields<'a>(fields: impl Iterator<Item = ofp::OxmRef<'a>>) -> Tuple {
        let mut t = Tuple::default();
        for o in fields {
            match o.field() {
                ofb::IPV4_SRC => {
                    t.src = exact(o.basic::<4>(ofb::IPV4_SRC))
                        .map(Ipv4Addr::from)
                        .or(t.src)
                }
                ofb::IPV4_DST => {
                    t.dst = exact(o.basic::<4>(ofb::IPV4_DST))
                        .map(Ipv4Addr::from)
                        .or(t.dst)
                }
                ofb::TCP_SRC => {
                    t.sport = exact(o.basic::<2>(ofb::TCP_SRC))
                        .map(u16::from_be_bytes)
                        .or(t.sport)
                }
                ofb::TCP_DST => {
                    t.dport = exact(o.basic::<2>(ofb::TCP_DST))
                        .map(u16::from_be_bytes)
                        .or(t.dport)
                }
                _ => {}
            }
        }
        t
    }

    /// All four, source first.
    fn all(&self) -> Option<(Ipv4Addr, u16, Ipv4Addr, u16)> {
        Some((self.src?, self.sport?, self.dst?, self.dport?))
    }

    /// A forward rule's connection: the client is the source.
    pub(crate) fn forward_key(&self) -> Option<ConnKey> {
        let (client, client_port, service_addr, service_port) = self.all()?;
        Some(ConnKey {
            client,
            client_port,
            service_addr,
            service_port,
        })
    }
}

impl RuleEnded {
    /// From a decoded message (tests, tools, and any path that decoded it already).
    pub fn of_message(fr: &ofp::FlowRemoved) -> RuleEnded {
        RuleEnded {
            cookie: fr.cookie,
            table_id: fr.table_id,
            duration_sec: fr.duration_sec,
            packet_count: fr.packet_count,
            tuple: Tuple::of_match(&fr.match_),
        }
    }

    /// From the frame, without decoding it into a `Message` (792 bytes, and a `Match` of
    /// typed OXMs): decoding and moving them was 27 % of the controller's CPU in the bench
    /// with connections ending (`--expire-after`). Reads what [`RuleEnded::of_message`]
    /// reads of the same frame.
    pub fn of_view(v: &ofp::FlowRemovedView<'_>) -> RuleEnded {
        RuleEnded {
            cookie: v.cookie(),
            table_id: v.table_id(),
            duration_sec: v.duration_sec(),
            packet_count: v.packet_count(),
            tuple: Tuple::of_fields(v.match_fields()),
        }
    }
}

/// A typed, unmasked field's value. A TLV of the right field that is masked, or whose
/// length the spec does not allow, is not the rule's exact value (`decode` keeps it raw,
/// or typed with its mask), and is skipped as [`Tuple::of_match`] skips it.
fn exact<const N: usize>(field: Option<([u8; N], Option<[u8; N]>)>) -> Option<[u8; N]> {
    match field? {
        (v, None) => Some(v),
        (_, Some(_)) => None,
    }
}

impl Controller {
    /// Start loading the connection table's index line that handling `e` reads first
    /// (see [`Controller::prefetch_packet_in`]).
    #[inline]
    pub fn prefetch_rule_ended(&self, e: &RuleEnded) {
        if let Some(key) = self.ended_conn_key(e) {
            self.conns.prefetch(&key);
        }
    }

    /// The connection a FLOW_REMOVED is likely about: the forward rule's own 4-tuple, or
    /// for the reverse rule, the client's side of it towards the service's VIP.
    fn ended_conn_key(&self, e: &RuleEnded) -> Option<ConnKey> {
        if cookie::kind_of(e.cookie) != Some(RuleKind::Conn) {
            return None;
        }
        if e.cookie & cookie::conn::OUTCOME != 0 {
            let (si, _) = cookie::conn::indexes(e.cookie);
            let (_, bport, client, cport) = e.tuple.all()?;
            let vip = self.services.get(usize::from(si))?.cfg.vip?;
            return Some(ConnKey {
                client,
                client_port: cport,
                service_addr: vip,
                service_port: bport,
            });
        }
        (e.cookie & cookie::conn::ACCOUNTING != 0)
            .then(|| e.tuple.forward_key())
            .flatten()
    }

    /// The runtime's reading of switch `dpid`'s control channel round trip at `now`: an
    /// ECHO_REQUEST's wait for its reply (§7.5.2), or while one is unanswered its age (zero:
    /// not measured). Called before each batch of the switch's messages is handled.
    ///
    /// An echo waits behind everything queued either way: the controller's FLOW_MODs and
    /// PACKET_OUTs, and the PACKET_INs and FLOW_REMOVEDs the switch has yet to send. A
    /// switch that far behind is busy, and a busy Open vSwitch drops packets on its ports
    /// too (results.md: full Case C's healthy servers, ejected). So the silence of a
    /// connection decided before or while its channel was over `outlier_max_channel_rtt_ms`
    /// is no verdict on the backend (see `record_outcome`).
    pub fn note_channel_rtt(&mut self, now: Instant, dpid: Dpid, rtt: Duration) {
        if rtt.is_zero() {
            return;
        }
        let limit = self.cfg.outlier_max_channel_rtt;
        let over = !limit.is_zero() && rtt > limit;
        let now_ms = over.then(|| self.ms_since_start(now));
        let Some(s) = self.switches.get_mut(&dpid) else {
            return;
        };
        s.channel_rtt = Some(rtt);
        let started = over && !s.lagging;
        s.lagging = over;
        if let Some(ms) = now_ms {
            s.lagged_ms = Some(ms);
        }
        if started {
            self.counters.lag_spells += 1;
            // Logged at 1, 2, 4, ... spells: a switch that flaps about the limit under
            // load would otherwise fill the log.
            if self.counters.lag_spells.is_power_of_two() {
                tracing::warn!(
                    dpid = format_args!("{dpid:016x}"),
                    rtt_ms = rtt.as_millis() as u64,
                    spells = self.counters.lag_spells,
                    "switch behind (control channel round trip over outlier_max_channel_rtt_ms): its connections' silences are not held against their backends"
                );
            }
        }
    }

    /// The control channels are no longer probed (a reload turned the probes off): each
    /// switch's last reading goes, so that no view shows it as the round trip now, and no
    /// switch stays marked behind (its next reading over the limit, should the probes come
    /// back, starts a new spell). When each was last behind is kept: the silences of the
    /// connections decided before then are still excused.
    pub fn forget_channel_rtts(&mut self) {
        for s in self.switches.values_mut() {
            s.channel_rtt = None;
            s.lagging = false;
        }
    }

    /// Whether switch `dpid` was seen behind at or after `since_ms` (controller-relative).
    fn lagged_since(&self, dpid: Dpid, since_ms: u64) -> bool {
        self.switches
            .get(&dpid)
            .and_then(|s| s.lagged_ms)
            .is_some_and(|at| at >= since_ms)
    }

    /// A rule the switch `dpid` reports gone.
    pub fn handle_rule_ended(&mut self, now: Instant, dpid: Dpid, e: &RuleEnded, out: &mut Outbox) {
        self.counters.flow_removed += 1;
        match cookie::kind_of(e.cookie) {
            Some(RuleKind::Conn) => {}
            Some(RuleKind::Proactive) => return self.proactive_rule_ended(dpid, e, out),
            _ => return,
        }
        if e.cookie & cookie::conn::OUTCOME != 0 {
            self.record_outcome(now, dpid, e);
            return;
        }
        if e.cookie & cookie::conn::ACCOUNTING == 0 {
            return;
        }
        let Some(key) = e.tuple.forward_key() else {
            return;
        };
        // Only the rule of the connection in the table ends it: the rule of an earlier
        // connection on the same 4-tuple (replaced by this one's, or expired just as the
        // new SYN came up) was accounted for when the new one was decided.
        let tag = rules::conn_tag_of(e.cookie);
        let Some(conn) = self.conns.remove_if(&key, |c| c.tag == tag) else {
            return;
        };
        if let Some(s) = self.services.get_mut(usize::from(conn.service)) {
            s.record_end(conn.backend);
            // The rule matches no SYN: a client that sent two packets through it sent
            // its handshake's ACK, after its backend's SYN-ACK.
            if e.packet_count >= 2 {
                s.record_answered(conn.backend, conn.created_ms);
            }
        }
        // The rule carried at most one packet: every SYN passes it by (`Syn::Not`), so a
        // client that completed its handshake sent at least its ACK and its request
        // through it (or through the controller before it took effect, which is harmless
        // here). At most one, a RST (the client answered an unexpected ACK, such as a
        // backend's answer on a 4-tuple it still had open, or a SYN-ACK after it gave up)
        // made `fin_timeout` end the rule a second later, about when the client sends its
        // SYN again: that SYN was decided and counted already, and is no new connection
        // (`Handshakes::take_aborted`). Before, it was decided and counted again: the
        // lab's full runs counted 202-210 decisions for 200 requests, the extra ones on
        // servers the SYNs were redirected to, and some requests took 1 s more (a SYN's
        // retransmission).
        if e.packet_count <= 1 {
            let now_ms = self.ms_since_start(now);
            self.handshakes.remember_aborted(now_ms, key, conn);
        }
    }

    /// A connection's reverse rule at the client's edge ended: did its backend answer?
    ///
    /// Passive outlier detection (Envoy-style) from what the switch and the controller
    /// saw, erring on the side of no verdict: a connection counts as failed only when the
    /// backend never sent a packet through the rule, none reached the controller either,
    /// and the rule lived at least a second (a connection can be over before its rules
    /// settle, all of it through the controller); a RST from the backend is counted when
    /// it reaches the controller. Enough failures in a row eject the backend. A failure
    /// is excused, no verdict either way, when the backend is known to have answered a
    /// connection decided after it ([`crate::service::ServiceState::answered_after`]), or
    /// when the reporting switch `dpid`, or the backend's own, was behind since it was
    /// decided ([`Controller::note_channel_rtt`]).
    fn record_outcome(&mut self, now: Instant, dpid: Dpid, e: &RuleEnded) {
        let (si, bi) = cookie::conn::indexes(e.cookie);
        let Some((src, sport, dst, dport)) = e.tuple.all() else {
            return;
        };
        // The backend's number names a backend of the pool for as long as it is in it;
        // the service's, its position, which a reload may give another: trust them only if
        // the rule's source address is still that backend's.
        let bi = BackendId(bi);
        let Some(b) = self
            .services
            .get(usize::from(si))
            .and_then(|s| s.backend(bi))
        else {
            return;
        };
        if b.address != src {
            return;
        }
        let tag = rules::conn_tag_of(e.cookie);
        let current = self
            .find_by_backend(src, sport, dst, dport)
            .map(|(_, c)| c)
            .filter(|c| c.tag == tag)
            // Its forward rule ended first, the connection's handshake never completed
            // through it: remembered as such for a while. A connection nothing answered
            // idles both its rules out in the same sweep, and Open vSwitch reported the
            // forward rule first for each of five in `ovs_a_lone_ejected_backend_...`,
            // whose backend was never judged before this lookup.
            .or_else(|| self.aborted_on(si, bi, tag, (dst, dport), sport));
        let verdict = match current {
            Some(conn) => match conn.reply {
                // Counted when the RST reached the controller, or judged silent when the
                // client sent its SYN again (`note_syn_again`).
                Reply::Reset | Reply::Silent => None,
                Reply::Answered => Some(true),
                Reply::Unseen if e.packet_count > 0 => Some(true),
                Reply::Unseen if e.duration_sec >= 1 => Some(false),
                Reply::Unseen => {
                    self.counters.outcomes_unjudged_short += 1;
                    None
                }
            },
            // The connection's accounting already ended (or it predates this controller):
            // only a clear success is a verdict.
            None if e.packet_count >= 2 => Some(true),
            None => {
                self.counters.outcomes_unjudged_unknown += 1;
                None
            }
        };
        // A verdict on a connection decided before the backend's last ejection started
        // is no news: that ejection answered for the backend as it was then. A silence
        // its client did not tell of (`note_syn_again`) is known an idle timeout (30 s by
        // default) after its rules' last packet, as long as a base ejection, so such
        // silences of the connections that ejected a backend come after the ejection
        // ends, and would eject it again, for twice as long, though it recovered
        // meanwhile (docs/simulator.md, stop 59).
        if let (Some(_), Some(conn)) = (verdict, current)
            && self.decided_before_ejection(si, bi, conn.created_ms)
        {
            self.counters.outcomes_unjudged_before_ejection += 1;
            return;
        }
        match (verdict, current) {
            (Some(true), Some(conn)) => {
                if let Some(s) = self.services.get_mut(usize::from(si)) {
                    s.record_answered(bi, conn.created_ms);
                }
                self.count_outcome(now, si, bi, true);
            }
            (Some(false), Some(conn)) => self.record_silence(now, dpid, si, bi, src, &conn),
            (Some(answered), None) => self.count_outcome(now, si, bi, answered),
            (None, _) => {}
        }
    }

    /// A connection its backend `src` never answered, seen from switch `dpid`: a failure,
    /// unless the path explains it, or no failure in a row (but one in the rates) when the
    /// backend answered a connection decided after it.
    fn record_silence(
        &mut self,
        now: Instant,
        dpid: Dpid,
        si: u16,
        bi: BackendId,
        src: Ipv4Addr,
        conn: &Conn,
    ) {
        if self.path_lagged_since(dpid, src, conn.created_ms) {
            self.counters.silences_excused_lag += 1;
            return;
        }
        // Not one in a row, but a failure in the rates all the same: a backend that drops
        // some connections and answers the others shows there.
        if let Some(s) = self.services.get_mut(usize::from(si))
            && s.answered_after(bi, conn.created_ms)
        {
            s.record_failure_out_of_order(now, bi);
            self.counters.silences_excused_answered += 1;
            return;
        }
        self.count_outcome(now, si, bi, false);
    }

    /// The client of connection `key` (rules installed) sent its SYN again, as it came up
    /// at switch `dpid`: once [`SILENT_AFTER_MS`] have passed since the decision, no
    /// SYN-ACK reached the client in that time, and the connection is judged silent now
    /// rather than when its rules idle out, `idle_timeout_secs` (30 s) after their last
    /// packet. A client retransmits its SYN after 1 s and 3 s (Linux; Windows after 3 s):
    /// its second (Windows' first) is the verdict. Envoy counts a connect timeout (5 s by
    /// default) as a failure alike. Once per connection (`Reply::Silent`). Returns whether
    /// the connection is judged silent (now, or at an earlier SYN of its client).
    pub(super) fn note_syn_again(
        &mut self,
        now: Instant,
        dpid: Dpid,
        key: &ConnKey,
        conn: Conn,
    ) -> bool {
        if conn.reply != Reply::Unseen {
            return conn.reply == Reply::Silent;
        }
        let now_ms = self.ms_since_start(now);
        if now_ms < conn.created_ms.saturating_add(SILENT_AFTER_MS) {
            return false;
        }
        if let Some(c) = self.conns.get_mut(key) {
            c.reply = Reply::Silent;
        }
        let Some(src) = self
            .services
            .get(usize::from(conn.service))
            .and_then(|s| s.backend(conn.backend))
            .map(|b| b.address)
        else {
            return true;
        };
        self.counters.silences_at_syn_retry += 1;
        if self.decided_before_ejection(conn.service, conn.backend, conn.created_ms) {
            self.counters.outcomes_unjudged_before_ejection += 1;
            return true;
        }
        self.record_silence(now, dpid, conn.service, conn.backend, src, &conn);
        true
    }

    /// Whether a connection decided at `created_ms` (controller-relative) came before
    /// the start of service `si`'s backend `bi`'s last ejection.
    fn decided_before_ejection(&self, si: u16, bi: BackendId, created_ms: u64) -> bool {
        let Some(at) = self.services.get(usize::from(si)).and_then(|s| {
            let p = s.position(bi)?;
            s.outliers.host(p)?.ejected_at()
        }) else {
            return false;
        };
        let Some(epoch) = self.epoch else {
            return false;
        };
        // An ejected backend takes no new connection, so one decided in the ejection's
        // own millisecond was decided before it.
        created_ms <= at.saturating_duration_since(epoch).as_millis() as u64
    }

    /// The connection of service `si`'s backend `bi` with decision `tag`, from `client`
    /// to the service's port `port`, if remembered as ended in its handshake. Its key is
    /// the address the client used: the VIP, or for a service without one, the backend
    /// the client addressed, which the reverse rule does not name (it matches the backend
    /// that answers), so each of the pool's addresses is tried, as
    /// [`Controller::find_by_backend`] does for the live connections.
    fn aborted_on(
        &self,
        si: u16,
        bi: BackendId,
        tag: u16,
        (client, client_port): (Ipv4Addr, u16),
        port: u16,
    ) -> Option<Conn> {
        let s = self.services.get(usize::from(si))?;
        let remembered = |service_addr| {
            let key = ConnKey {
                client,
                client_port,
                service_addr,
                service_port: port,
            };
            self.handshakes
                .aborted(&key)
                .filter(|c| c.tag == tag && c.service == si && c.backend == bi)
        };
        match s.cfg.vip {
            Some(vip) => remembered(vip),
            None => s.backends.iter().find_map(|b| remembered(b.address)),
        }
    }

    /// Whether the switch that reported a connection's end, or the one its backend
    /// (`backend`) is attached to, was behind since `since_ms`.
    pub(super) fn path_lagged_since(&self, dpid: Dpid, backend: Ipv4Addr, since_ms: u64) -> bool {
        self.lagged_since(dpid, since_ms)
            || self
                .topo
                .locate_ip(backend)
                .is_some_and(|(_, at)| at.dpid != dpid && self.lagged_since(at.dpid, since_ms))
    }
}

#[cfg(test)]
mod tests {
    use bytes::{Bytes, BytesMut};
    use ofp::oxm::RawOxm;
    use ofp::{FlowRemoved, FlowRemovedReason, FlowRemovedView, Match, Message, Oxm};

    use super::*;

    fn frame(fields: Vec<Oxm>) -> (FlowRemoved, BytesMut) {
        let fr = FlowRemoved {
            cookie: 0x0123_4567_89ab_cdef,
            priority: 9,
            reason: FlowRemovedReason::IdleTimeout,
            table_id: 0,
            duration_sec: 3,
            duration_nsec: 5,
            idle_timeout: 2,
            hard_timeout: 0,
            packet_count: 7,
            byte_count: 700,
            match_: fields.into_iter().collect::<Match>(),
        };
        let mut out = BytesMut::new();
        ofp::encode(1, &Message::FlowRemoved(fr.clone()), &mut out).expect("encodes");
        (fr, out)
    }

    /// What the frame built by [`frame`] reads as, with this tuple.
    fn ended(tuple: Tuple) -> RuleEnded {
        RuleEnded {
            cookie: 0x0123_4567_89ab_cdef,
            table_id: 0,
            duration_sec: 3,
            packet_count: 7,
            tuple,
        }
    }

    fn ip(d: u8) -> Ipv4Addr {
        Ipv4Addr::new(10, 0, 0, d)
    }

    /// A basic-class TLV of `field` with this payload, as on the wire.
    fn raw(field: u8, payload: &[u8]) -> Oxm {
        raw_of(ofp::oxm::class::OPENFLOW_BASIC, field, payload)
    }

    /// A TLV of `class` and `field` with this payload, as on the wire.
    fn raw_of(class: u16, field: u8, payload: &[u8]) -> Oxm {
        Oxm::Raw(RawOxm {
            class,
            field,
            hasmask: false,
            payload: Bytes::copy_from_slice(payload),
        })
    }

    /// The frame and the decoded message say the same, whatever the match holds: the
    /// rule's own fields, masked ones, repeated ones, and TLVs of the right field with a
    /// length the spec does not allow (kept raw by `decode`).
    #[test]
    fn the_frame_reads_as_the_message_does() {
        let cases: Vec<(Vec<Oxm>, RuleEnded)> = vec![
            (
                vec![
                    Oxm::EthType(0x0800),
                    Oxm::IpProto(6),
                    Oxm::ipv4_src(ip(1)),
                    Oxm::ipv4_dst(ip(100)),
                    Oxm::TcpSrc(40000),
                    Oxm::TcpDst(80),
                ],
                ended(Tuple {
                    src: Some(ip(1)),
                    dst: Some(ip(100)),
                    sport: Some(40000),
                    dport: Some(80),
                }),
            ),
            (
                vec![
                    Oxm::Ipv4Src {
                        value: ip(1),
                        mask: Some(Ipv4Addr::new(255, 255, 255, 0)),
                    },
                    Oxm::ipv4_dst(ip(2)),
                    Oxm::ipv4_dst(ip(3)),
                    raw(ofp::oxm::ofb::TCP_SRC, &[1, 2, 3]),
                    raw(ofp::oxm::ofb::IPV4_SRC, &[1, 2]),
                    Oxm::TcpDst(443),
                ],
                ended(Tuple {
                    src: None,
                    dst: Some(ip(3)),
                    sport: None,
                    dport: Some(443),
                }),
            ),
            (Vec::new(), ended(Tuple::default())),
        ];
        for (fields, want) in cases {
            let (fr, bytes) = frame(fields);
            let v = FlowRemovedView::new(&bytes).expect("a valid frame");
            assert_eq!(RuleEnded::of_message(&fr), want);
            assert_eq!(RuleEnded::of_view(&v), want);
        }
    }

    /// A TLV that is not the field's exact value leaves an earlier exact one in place on
    /// both paths: a masked one of the same field, or one of another class (NXM) whose
    /// field number is a basic field's (§7.2.3.1: the field is read within its class).
    #[test]
    fn a_later_tlv_that_is_not_exact_leaves_the_exact_value() {
        let mask = Some(Ipv4Addr::new(255, 255, 0, 0));
        let fields = vec![
            Oxm::ipv4_src(ip(1)),
            Oxm::Ipv4Src { value: ip(9), mask },
            Oxm::ipv4_dst(ip(100)),
            raw_of(ofp::oxm::class::NXM_1, ofb::IPV4_DST, &[10, 0, 0, 9]),
            Oxm::TcpSrc(40000),
            raw_of(ofp::oxm::class::NXM_0, ofb::TCP_SRC, &[0, 9]),
            Oxm::TcpDst(80),
            raw_of(ofp::oxm::class::NXM_0, ofb::TCP_DST, &[0, 9]),
            raw_of(ofp::oxm::class::NXM_1, ofb::IPV4_SRC, &[10, 0, 0, 9]),
        ];
        let want = ended(Tuple {
            src: Some(ip(1)),
            dst: Some(ip(100)),
            sport: Some(40000),
            dport: Some(80),
        });
        let (fr, bytes) = frame(fields);
        let v = FlowRemovedView::new(&bytes).expect("a valid frame");
        assert_eq!(RuleEnded::of_message(&fr), want, "the decoded path");
        assert_eq!(RuleEnded::of_view(&v), want, "the frame path");
    }
}
