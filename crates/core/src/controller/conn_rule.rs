//! A connection's rules and the packets the controller sends on for it, typed, and
//! encoded straight to their bytes.
//!
//! Every rule a connection gets has one shape: an exact TCP match on the 4-tuple (perhaps
//! on the SYN bit too), then some of a destination rewrite, a source rewrite, a
//! `fin_timeout`, and one output. Two or three such FLOW_MODs go out for each new
//! connection, and built from the general [`ofp::Match`] and [`ofp::Actions`] they cost a
//! quarter of the controller's CPU per setup in the 16-switch bench profile: a call, a
//! jump through each enum's table and a length written back for every field. Typed, the
//! whole message's length is known before its first byte, and it is written in one pass.
//! [`ConnRule::flow_mod`] is the same rule as a general FLOW_MOD (for outboxes that keep
//! messages whole, and to check this encoder: the tests compare the bytes).
//!
//! The PACKET_OUT of a connection's packet has the same actions (a rewrite and an output)
//! and goes out once per new connection too: [`ConnPacketOut`], the same way.

use std::net::Ipv4Addr;

use bytes::{Bytes, BytesMut};
use flowgate_packet::{ETH_TYPE_IPV4, IP_PROTO_TCP, MacAddr};
use ofp::oxm::{class, ofb};
use ofp::{Action, Actions, FlowMod, FlowModFixed, FlowModFlags, Match, Oxm, RawOxm};

use super::rules;
use crate::cookie::{self, RuleKind};

/// `NXM_NX_TCP_FLAGS` field number in the `NXM_1` class (Open vSwitch's `tcp_flags`,
/// 16 bits, maskable; usable in OpenFlow 1.3 matches as an OXM of that class).
const NXM_NX_TCP_FLAGS: u8 = 34;
/// The SYN bit of `tcp_flags`.
const TCP_FLAG_SYN: u16 = 0x002;
/// The ACK bit of `tcp_flags`.
const TCP_FLAG_ACK: u16 = 0x010;

/// What a rule asks of the SYN bit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Syn {
    /// Nothing: any segment.
    Any,
    /// `tcp_flags=-syn`: the segment is not a SYN. On a connection's forward rule at the
    /// client's edge it makes every SYN miss the rule and go up through the intercept: a
    /// client that reuses a closed connection's 4-tuple (the kernel picks ports at random,
    /// and another client's connections to the same address advance its counter) gets a
    /// decision of its own, instead of riding the old connection's rule (or Open vSwitch's
    /// cached megaflow of it) to the old backend with none. Prerequisite `ip_proto=6`, as
    /// for `tcp_*` (§7.2.3.8); the fields of other classes are the switch's (§7.2.3.2).
    Not,
    /// `tcp_flags=+syn`: the segment is a SYN (with or without ACK). On a partitioned
    /// service's connection, beside its forward rule at the client's edge, it sends a SYN
    /// on the connection's 4-tuple up to the controller: [`Syn::Not`] keeps SYNs off the
    /// forward rule, and there they would follow the partition's wildcard rule rather than
    /// the intercept (see `vip::Controller::emit_rules`).
    Only,
    /// `tcp_flags=+syn+ack`: the segment is a SYN-ACK. Table 1's pass of a SYN-ACK that
    /// conntrack calls invalid (`proactive`), never on a connection rule.
    AndAck,
}

impl Syn {
    /// The `tcp_flags` value and mask, or `None` for [`Syn::Any`].
    const fn value_mask(self) -> Option<[u8; 4]> {
        let m = TCP_FLAG_SYN.to_be_bytes();
        match self {
            Syn::Any => None,
            Syn::Not => Some([0, 0, m[0], m[1]]),
            Syn::Only => Some([m[0], m[1], m[0], m[1]]),
            Syn::AndAck => {
                let b = (TCP_FLAG_SYN | TCP_FLAG_ACK).to_be_bytes();
                Some([b[0], b[1], b[0], b[1]])
            }
        }
    }

    /// `m` with this requirement of the SYN bit (unchanged for [`Syn::Any`]).
    pub(crate) fn on(self, m: Match) -> Match {
        match self.oxm() {
            Some(o) => m.with(o),
            None => m,
        }
    }

    /// The match field, for the general FLOW_MOD (static bytes: no allocation).
    pub(crate) fn oxm(self) -> Option<Oxm> {
        const NOT: [u8; 4] = match Syn::Not.value_mask() {
            Some(v) => v,
            None => [0; 4],
        };
        const ONLY: [u8; 4] = match Syn::Only.value_mask() {
            Some(v) => v,
            None => [0; 4],
        };
        const SYN_ACK: [u8; 4] = match Syn::AndAck.value_mask() {
            Some(v) => v,
            None => [0; 4],
        };
        let payload: &'static [u8] = match self {
            Syn::Any => return None,
            Syn::Not => &NOT,
            Syn::Only => &ONLY,
            Syn::AndAck => &SYN_ACK,
        };
        Some(Oxm::Raw(RawOxm {
            class: class::NXM_1,
            field: NXM_NX_TCP_FLAGS,
            hasmask: true,
            payload: bytes::Bytes::from_static(payload),
        }))
    }
}

/// Where a rule sends what it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Out {
    Port(u32),
    /// The whole packet to the controller (OFPCML_NO_BUFFER, §7.2.5).
    Controller,
}

/// One connection rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ConnRule {
    /// The cookie's bits below its kind (always [`RuleKind::Conn`]).
    pub(crate) cookie_low: u64,
    pub(crate) idle_timeout: u16,
    pub(crate) src: Ipv4Addr,
    pub(crate) dst: Ipv4Addr,
    pub(crate) sport: u16,
    pub(crate) dport: u16,
    pub(crate) syn: Syn,
    pub(crate) rewrite: Rewrite,
    /// A `fin_timeout` action's body ([`rules::fin_timeout_body`]).
    pub(crate) fin: Option<&'static [u8]>,
    pub(crate) out: Out,
}

/// The header fields a connection's packets are rewritten in: each `Some` is an
/// OFPAT_SET_FIELD, in this order, without a mask (Open vSwitch rejects a masked
/// SET_FIELD in OpenFlow 1.3: OFPBAC_BAD_SET_MASK).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Rewrite {
    pub(crate) eth_dst: Option<MacAddr>,
    pub(crate) ipv4_dst: Option<Ipv4Addr>,
    pub(crate) eth_src: Option<MacAddr>,
    pub(crate) ipv4_src: Option<Ipv4Addr>,
}

impl Rewrite {
    /// The destination, to a backend (`ipv4: None` rewrites only the MAC).
    pub(crate) fn dst(mac: MacAddr, ipv4: Option<Ipv4Addr>) -> Rewrite {
        Rewrite {
            eth_dst: Some(mac),
            ipv4_dst: ipv4,
            ..Rewrite::default()
        }
    }

    /// The source, back to the service (`ipv4: None` rewrites only the MAC).
    pub(crate) fn src(mac: MacAddr, ipv4: Option<Ipv4Addr>) -> Rewrite {
        Rewrite {
            eth_src: Some(mac),
            ipv4_src: ipv4,
            ..Rewrite::default()
        }
    }

    /// Which fields it sets, one bit each in the order of its actions: the 16 shapes of
    /// a rewrite.
    #[inline]
    fn sets(&self) -> usize {
        usize::from(self.eth_dst.is_some())
            | usize::from(self.ipv4_dst.is_some()) << 1
            | usize::from(self.eth_src.is_some()) << 2
            | usize::from(self.ipv4_src.is_some()) << 3
    }

    /// The rewrite of shape `sets` with every value zeroed: a template's.
    fn zeroed(sets: usize) -> Rewrite {
        let bit = |i: usize| sets & (1 << i) != 0;
        Rewrite {
            eth_dst: bit(0).then_some(MacAddr::ZERO),
            ipv4_dst: bit(1).then_some(Ipv4Addr::UNSPECIFIED),
            eth_src: bit(2).then_some(MacAddr::ZERO),
            ipv4_src: bit(3).then_some(Ipv4Addr::UNSPECIFIED),
        }
    }

    /// Its values written over a template's SET_FIELD actions, the first of which has its
    /// value at `at` (after its action header and its OXM header, 4 + 4). Returns where
    /// the value of the action after them would be: 8 bytes into that action.
    #[inline(always)]
    fn put_values(&self, b: &mut [u8], mut at: usize) -> usize {
        if let Some(mac) = self.eth_dst {
            put(b, at, &mac.0);
            at += SET_FIELD_LEN;
        }
        if let Some(ip) = self.ipv4_dst {
            put(b, at, &ip.octets());
            at += SET_FIELD_LEN;
        }
        if let Some(mac) = self.eth_src {
            put(b, at, &mac.0);
            at += SET_FIELD_LEN;
        }
        if let Some(ip) = self.ipv4_src {
            put(b, at, &ip.octets());
            at += SET_FIELD_LEN;
        }
        at
    }

    /// The SET_FIELD actions' length.
    #[inline]
    fn len(&self) -> usize {
        let sets = usize::from(self.eth_dst.is_some())
            + usize::from(self.ipv4_dst.is_some())
            + usize::from(self.eth_src.is_some())
            + usize::from(self.ipv4_src.is_some());
        sets * SET_FIELD_LEN
    }

    #[inline(always)]
    fn write(&self, w: &mut Writer<'_>) {
        if let Some(mac) = self.eth_dst {
            w.set_field(ofb::ETH_DST, &mac.0);
        }
        if let Some(ip) = self.ipv4_dst {
            w.set_field(ofb::IPV4_DST, &ip.octets());
        }
        if let Some(mac) = self.eth_src {
            w.set_field(ofb::ETH_SRC, &mac.0);
        }
        if let Some(ip) = self.ipv4_src {
            w.set_field(ofb::IPV4_SRC, &ip.octets());
        }
    }

    /// The same actions, general.
    fn push_actions(&self, a: &mut Actions) {
        let sets = [
            self.eth_dst.map(|m| Oxm::eth_dst(m.0)),
            self.ipv4_dst.map(Oxm::ipv4_dst),
            self.eth_src.map(|m| Oxm::eth_src(m.0)),
            self.ipv4_src.map(Oxm::ipv4_src),
        ];
        for f in sets.into_iter().flatten() {
            a.push(Action::SetField(f));
        }
    }
}

/// OFPT_FLOW_MOD's type (§7.3.4.1).
const OFPT_FLOW_MOD: u8 = 14;
/// OFPT_PACKET_OUT's type (§7.3.7).
const OFPT_PACKET_OUT: u8 = 13;
/// `ofp_packet_out` before its actions: header, buffer_id, in_port, actions_len, 6 bytes of
/// padding (§7.3.7).
const PACKET_OUT_FIXED_LEN: usize = 24;
/// Header (8) and the fixed fields (40) before the match.
const FIXED_LEN: usize = 48;
/// `ofp_match` header and the six OXMs of the 4-tuple: eth_type (4+2), ip_proto (4+1),
/// ipv4_src and ipv4_dst (4+4 each), tcp_src and tcp_dst (4+2 each).
const TUPLE_MATCH_LEN: usize = 4 + 6 + 5 + 8 + 8 + 6 + 6;
/// The masked `tcp_flags` OXM (4+2+2).
const SYN_OXM_LEN: usize = 8;
/// OFPAT_SET_FIELD of a MAC (4 + 4+6, padded to 8) or an IPv4 address (4 + 4+4).
const SET_FIELD_LEN: usize = 16;
/// OFPAT_OUTPUT (§7.2.5).
const OUTPUT_LEN: usize = 16;
/// OFPIT_APPLY_ACTIONS' header (§7.2.4).
const INSTRUCTION_LEN: usize = 8;

/// The longest rule [`ConnRule::encode`] writes in one pass: 48 + 56 of match + 8 +
/// 4 × 16 of SET_FIELD + 16 of `fin_timeout` + 16 of OUTPUT is 208.
const MAX_LEN: usize = 256;

/// The body of a `fin_timeout` action as [`rules::fin_timeout_body`] makes it.
const FIN_BODY_LEN: usize = 8;

/// Where a connection rule's values lie (§7.3.4.1, §7.2.3): the cookie after the 8-byte
/// header, the idle timeout after the cookie, its mask, the table id and the command
/// (8 + 8 + 8 + 1 + 1), and the 4-tuple's values in its OXMs (each after a 4-byte header):
/// the match starts at [`FIXED_LEN`] with 4 bytes of its own header, then eth_type (4+2)
/// and ip_proto (4+1).
const COOKIE_AT: usize = 8;
const IDLE_TIMEOUT_AT: usize = 26;
const IPV4_SRC_AT: usize = FIXED_LEN + 4 + 6 + 5 + 4;
const IPV4_DST_AT: usize = IPV4_SRC_AT + 8;
const TCP_SRC_AT: usize = IPV4_DST_AT + 8;
const TCP_DST_AT: usize = TCP_SRC_AT + 6;

/// The shapes a connection rule takes ([`ConnRule::shape`]): 4 SYN requirements × 16
/// rewrites × with or without `fin_timeout` × to a port or to the controller.
const SHAPES: usize = 256;

/// A shape's rule with its values zeroed, and where its actions start.
struct Template {
    bytes: Vec<u8>,
    actions: usize,
}

/// Every shape's template, made once (`encode_fields` of [`ConnRule::of_shape`]); 45 KB.
fn templates() -> &'static [Template] {
    static TEMPLATES: std::sync::OnceLock<Vec<Template>> = std::sync::OnceLock::new();
    TEMPLATES.get_or_init(|| {
        (0..SHAPES)
            .map(|s| {
                let r = ConnRule::of_shape(s);
                let mut b = BytesMut::new();
                r.encode_fields(&mut b);
                let match_len = TUPLE_MATCH_LEN + if r.syn == Syn::Any { 0 } else { SYN_OXM_LEN };
                Template {
                    bytes: b.to_vec(),
                    actions: FIXED_LEN + match_len.next_multiple_of(8) + INSTRUCTION_LEN,
                }
            })
            .collect()
    })
}

/// Where a PACKET_OUT's `in_port` lies: after its header and its `buffer_id` (§7.3.7).
const PACKET_OUT_IN_PORT_AT: usize = 12;

/// A connection's PACKET_OUT without its packet, for each of the 16 rewrites
/// ([`Rewrite::sets`]), its values zeroed: header, fixed fields and actions.
fn packet_out_templates() -> &'static [Vec<u8>] {
    static TEMPLATES: std::sync::OnceLock<Vec<Vec<u8>>> = std::sync::OnceLock::new();
    TEMPLATES.get_or_init(|| {
        (0..16)
            .map(|sets| {
                let mut b = BytesMut::new();
                ConnPacketOut {
                    in_port: 0,
                    rewrite: Rewrite::zeroed(sets),
                    out_port: 0,
                    data: &[],
                }
                .encode_fields(&mut b);
                b.to_vec()
            })
            .collect()
    })
}

/// `v` written over `b` at `at` (nothing if it does not fit: a template is always long
/// enough for its shape's values).
#[inline(always)]
fn put<const N: usize>(b: &mut [u8], at: usize, v: &[u8; N]) {
    if let Some(d) = b.get_mut(at..at + N) {
        d.copy_from_slice(v);
    }
}

/// A cursor over the zeroed bytes a message will fill. Writes past their end are dropped
/// (none can be: `encode` sizes them first). It borrows the bytes rather than holding
/// them, so that the cursor is a small value that stays in a register: inside a struct
/// with a buffer, it was loaded, advanced and stored back for every field, each waiting
/// on the last (a third of the rule's encoding time).
struct Writer<'a> {
    b: &'a mut [u8],
    n: usize,
}

impl Writer<'_> {
    #[inline(always)]
    fn put(&mut self, v: &[u8]) {
        if let Some(d) = self.b.get_mut(self.n..self.n + v.len()) {
            d.copy_from_slice(v);
        }
        self.n += v.len();
    }

    /// Zeros (padding): already there.
    #[inline(always)]
    fn skip(&mut self, n: usize) {
        self.n += n;
    }

    #[inline(always)]
    fn u16(&mut self, v: u16) {
        self.put(&v.to_be_bytes());
    }

    #[inline(always)]
    fn u32(&mut self, v: u32) {
        self.put(&v.to_be_bytes());
    }

    /// An OXM (§7.2.3.2): class, field, hasmask, payload length, payload.
    #[inline(always)]
    fn oxm(&mut self, class: u16, field: u8, hasmask: bool, payload: &[u8]) {
        self.u32(
            (u32::from(class) << 16)
                | (u32::from(field & 0x7f) << 9)
                | (u32::from(hasmask) << 8)
                | payload.len() as u32,
        );
        self.put(payload);
    }

    /// OFPAT_SET_FIELD (§7.2.5): type, length, the OXM, zeros to [`SET_FIELD_LEN`].
    #[inline(always)]
    fn set_field(&mut self, field: u8, value: &[u8]) {
        let end = self.n + SET_FIELD_LEN;
        self.u16(ofp::action::action_type::SET_FIELD);
        self.u16(SET_FIELD_LEN as u16);
        self.oxm(class::OPENFLOW_BASIC, field, false, value);
        self.n = end;
    }

    /// OFPAT_OUTPUT (§7.2.5): type, length, port, max_len, 6 bytes of padding.
    #[inline(always)]
    fn output(&mut self, port: u32, max_len: u16) {
        self.u16(ofp::action::action_type::OUTPUT);
        self.u16(OUTPUT_LEN as u16);
        self.u32(port);
        self.u16(max_len);
        self.skip(6);
    }
}

/// `len` zeroed bytes added to `out`, to be written over in place: the length is known, so
/// the bytes are added once, and each field is a store, not a `BytesMut` put that checks
/// the capacity (twice as slow over ~40 fields). Over a stack buffer copied to `out` at
/// the end, that copy was 4 % of the controller's CPU.
#[inline(always)]
fn zeroed_tail(out: &mut BytesMut, len: usize) -> Writer<'_> {
    let at = out.len();
    out.resize(at + len, 0);
    Writer {
        b: out.get_mut(at..).unwrap_or_default(),
        n: 0,
    }
}

/// OFPAT_EXPERIMENTER with `body`: 8 bytes of header, padded to 8 (§7.2.5).
#[inline]
fn experimenter_len(body: &[u8]) -> usize {
    (8 + body.len()).next_multiple_of(8)
}

impl ConnRule {
    /// Every field but the match and the instructions.
    #[inline]
    fn fixed(&self) -> FlowModFixed {
        FlowModFixed {
            cookie: cookie::cookie(RuleKind::Conn, self.cookie_low),
            priority: rules::PRIO_CONN,
            idle_timeout: self.idle_timeout,
            // RESET_COUNTS: a rule that replaces an earlier connection's on the same
            // 4-tuple starts from zero ("§6.4: ... otherwise they should be copied from
            // the replaced flow entry"), so its packet count tells about this connection
            // only.
            flags: FlowModFlags::SEND_FLOW_REM | FlowModFlags::RESET_COUNTS,
            ..FlowModFixed::add()
        }
    }

    fn actions_len(&self) -> usize {
        self.rewrite.len() + self.fin.map_or(0, experimenter_len) + OUTPUT_LEN
    }

    /// Which of the [`SHAPES`] this rule has: what it asks of the SYN bit, which header
    /// fields it rewrites, whether it has a `fin_timeout` and where it outputs. `None` for
    /// a `fin_timeout` body of another length than [`rules::fin_timeout_body`]'s.
    #[inline]
    fn shape(&self) -> Option<usize> {
        let syn = match self.syn {
            Syn::Any => 0,
            Syn::Not => 1,
            Syn::Only => 2,
            Syn::AndAck => 3,
        };
        let sets = self.rewrite.sets();
        let fin = match self.fin {
            None => 0,
            Some(b) if b.len() == FIN_BODY_LEN => 1,
            Some(_) => return None,
        };
        let to_controller = usize::from(self.out == Out::Controller);
        Some(syn | sets << 2 | fin << 6 | to_controller << 7)
    }

    /// The rule of shape `shape` with every value zeroed: the template's source.
    fn of_shape(shape: usize) -> ConnRule {
        const ZERO_BODY: [u8; FIN_BODY_LEN] = [0; FIN_BODY_LEN];
        let bit = |i: usize| shape & (1 << i) != 0;
        ConnRule {
            cookie_low: 0,
            idle_timeout: 0,
            src: Ipv4Addr::UNSPECIFIED,
            dst: Ipv4Addr::UNSPECIFIED,
            sport: 0,
            dport: 0,
            syn: match shape & 3 {
                0 => Syn::Any,
                1 => Syn::Not,
                2 => Syn::Only,
                _ => Syn::AndAck,
            },
            rewrite: Rewrite::zeroed((shape >> 2) & 0xf),
            fin: bit(6).then_some(&ZERO_BODY[..]),
            out: if bit(7) {
                Out::Controller
            } else {
                Out::Port(0)
            },
        }
    }

    /// Append the whole FLOW_MOD, header included, with xid 0 (the runtime gives each
    /// message its switch's next one). The same bytes as `ofp::encode(0, &flow_mod())`.
    ///
    /// Copied from its shape's template, then its values written in: a dozen stores where
    /// writing it field by field ([`ConnRule::encode_fields`]) is some forty, each with its
    /// bounds check (under callgrind, 194 instructions a rule against 334).
    pub(crate) fn encode(&self, out: &mut BytesMut) {
        let Some(t) = self.shape().and_then(|s| templates().get(s)) else {
            return self.encode_fields(out);
        };
        let at = out.len();
        out.extend_from_slice(&t.bytes);
        let Some(b) = out.get_mut(at..) else {
            return;
        };
        put(
            b,
            COOKIE_AT,
            &cookie::cookie(RuleKind::Conn, self.cookie_low).to_be_bytes(),
        );
        put(b, IDLE_TIMEOUT_AT, &self.idle_timeout.to_be_bytes());
        put(b, IPV4_SRC_AT, &self.src.octets());
        put(b, IPV4_DST_AT, &self.dst.octets());
        put(b, TCP_SRC_AT, &self.sport.to_be_bytes());
        put(b, TCP_DST_AT, &self.dport.to_be_bytes());
        // Each SET_FIELD's value follows its action header and its OXM header (4 + 4).
        let mut a = self.rewrite.put_values(b, t.actions + 8);
        // The experimenter action's body follows its type, length and experimenter id.
        if let Some(body) = self
            .fin
            .and_then(|f| <&[u8; FIN_BODY_LEN]>::try_from(f).ok())
        {
            put(b, a, body);
            a += experimenter_len(body);
        }
        // OFPAT_OUTPUT's port follows its type and length (`a` is 8 into the action).
        if let Out::Port(p) = self.out {
            put(b, a - 4, &p.to_be_bytes());
        }
    }

    /// [`ConnRule::encode`] field by field: for the templates, and for a rule of no shape.
    fn encode_fields(&self, out: &mut BytesMut) {
        let match_len = TUPLE_MATCH_LEN + if self.syn == Syn::Any { 0 } else { SYN_OXM_LEN };
        let match_padded = match_len.next_multiple_of(8);
        let instruction_len = INSTRUCTION_LEN + self.actions_len();
        let total = FIXED_LEN + match_padded + instruction_len;
        if total > MAX_LEN {
            // Only a fin_timeout body longer than any `rules::fin_timeout_body`.
            if let Err(e) = ofp::encode(0, &ofp::Message::FlowMod(self.flow_mod()), out) {
                tracing::error!(error = %e, "cannot encode a connection rule");
            }
            return;
        }
        let mut w = zeroed_tail(out, total);
        // Header (§7.1): version, type, length, xid 0.
        w.put(&[ofp::OFP_VERSION, OFPT_FLOW_MOD]);
        w.u16(total as u16);
        w.skip(4);
        // The fixed fields (§7.3.4.1).
        w.put(&self.fixed().to_bytes());

        // The match (§7.2.3): OFPMT_OXM, its length before padding, the OXMs, zeros.
        w.u16(ofp::oxm::OFPMT_OXM);
        w.u16(match_len as u16);
        w.oxm(
            class::OPENFLOW_BASIC,
            ofb::ETH_TYPE,
            false,
            &ETH_TYPE_IPV4.to_be_bytes(),
        );
        w.oxm(class::OPENFLOW_BASIC, ofb::IP_PROTO, false, &[IP_PROTO_TCP]);
        w.oxm(
            class::OPENFLOW_BASIC,
            ofb::IPV4_SRC,
            false,
            &self.src.octets(),
        );
        w.oxm(
            class::OPENFLOW_BASIC,
            ofb::IPV4_DST,
            false,
            &self.dst.octets(),
        );
        w.oxm(
            class::OPENFLOW_BASIC,
            ofb::TCP_SRC,
            false,
            &self.sport.to_be_bytes(),
        );
        w.oxm(
            class::OPENFLOW_BASIC,
            ofb::TCP_DST,
            false,
            &self.dport.to_be_bytes(),
        );
        if let Some(vm) = self.syn.value_mask() {
            w.oxm(class::NXM_1, NXM_NX_TCP_FLAGS, true, &vm);
        }
        w.skip(match_padded - match_len);

        // One OFPIT_APPLY_ACTIONS (§7.2.4): type, length, 4 bytes of padding.
        w.u16(ofp::instruction::instruction_type::APPLY_ACTIONS);
        w.u16(instruction_len as u16);
        w.skip(4);
        self.rewrite.write(&mut w);
        if let Some(body) = self.fin {
            // OFPAT_EXPERIMENTER (§7.2.5): type, length, experimenter, body, padding.
            let len = experimenter_len(body);
            w.u16(ofp::action::action_type::EXPERIMENTER);
            w.u16(len as u16);
            w.u32(rules::NX_VENDOR_ID);
            // The usual body's length as a constant: a copy of a length known only at run
            // time is a call to `memcpy` (3 % of the controller's CPU, for 8 bytes).
            match <&[u8; FIN_BODY_LEN]>::try_from(body) {
                Ok(b) => w.put(b),
                Err(_) => w.put(body),
            }
            w.skip(len - 8 - body.len());
        }
        let (port, max_len) = match self.out {
            Out::Port(p) => (p, 0),
            Out::Controller => (ofp::port::CONTROLLER, ofp::CONTROLLER_MAX_LEN_NO_BUFFER),
        };
        w.output(port, max_len);
        debug_assert_eq!(w.n, total, "the rule's length as computed");
    }

    /// The same rule as a general FLOW_MOD.
    pub(crate) fn flow_mod(&self) -> FlowMod {
        let mut m = rules::tcp_match(
            Some(self.src),
            Some(self.dst),
            Some(self.sport),
            Some(self.dport),
        );
        if let Some(f) = self.syn.oxm() {
            m.push(f);
        }
        let mut a = Actions::new();
        self.rewrite.push_actions(&mut a);
        if let Some(body) = self.fin {
            a.push(rules::fin_timeout_of(body));
        }
        a.push(match self.out {
            Out::Port(p) => Action::output(p),
            Out::Controller => Action::output(ofp::port::CONTROLLER),
        });
        let mut instructions = ofp::Instructions::new();
        instructions.push(ofp::Instruction::ApplyActions(a));
        FlowMod::from_fixed(self.fixed(), m, instructions)
    }
}

/// A connection's packet, sent on by the controller (OFPT_PACKET_OUT, §7.3.7, with no
/// buffer: the packet is in `data`) with its rewrite, out of one port.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConnPacketOut<'a> {
    pub(crate) in_port: u32,
    pub(crate) rewrite: Rewrite,
    pub(crate) out_port: u32,
    pub(crate) data: &'a [u8],
}

impl ConnPacketOut<'_> {
    fn actions_len(&self) -> usize {
        self.rewrite.len() + OUTPUT_LEN
    }

    /// Append the whole PACKET_OUT with xid 0, as [`ConnRule::encode`] does; the same bytes
    /// as `ofp::encode(0, &message())`. The packet is copied from `data`, so no reference
    /// to it is taken (a `Bytes` clone and drop were two atomic operations per setup).
    ///
    /// Copied from its rewrite's template, then its values written in, as a rule is
    /// (under callgrind, 75 instructions a PACKET_OUT against 215 field by field).
    pub(crate) fn encode(&self, out: &mut BytesMut) {
        let total = PACKET_OUT_FIXED_LEN + self.actions_len() + self.data.len();
        let (Ok(total16), Some(t)) = (
            u16::try_from(total),
            packet_out_templates().get(self.rewrite.sets()),
        ) else {
            return self.encode_fields(out);
        };
        let at = out.len();
        out.reserve(total);
        out.extend_from_slice(t);
        out.extend_from_slice(self.data);
        let Some(b) = out.get_mut(at..) else {
            return;
        };
        put(b, 2, &total16.to_be_bytes());
        put(b, PACKET_OUT_IN_PORT_AT, &self.in_port.to_be_bytes());
        let a = self.rewrite.put_values(b, PACKET_OUT_FIXED_LEN + 8);
        // OFPAT_OUTPUT's port follows its type and length (`a` is 8 into the action).
        put(b, a - 4, &self.out_port.to_be_bytes());
    }

    /// [`ConnPacketOut::encode`] field by field: for the templates, and for a packet too
    /// long for one message (which the general encoder refuses).
    fn encode_fields(&self, out: &mut BytesMut) {
        let actions_len = self.actions_len();
        let total = PACKET_OUT_FIXED_LEN + actions_len + self.data.len();
        let Ok(total16) = u16::try_from(total) else {
            // A packet too long for one message: the general encoder reports it.
            if let Err(e) = ofp::encode(0, &self.message(), out) {
                tracing::error!(error = %e, "cannot encode a connection's PACKET_OUT");
            }
            return;
        };
        let mut w = zeroed_tail(out, total);
        // Header (§7.1): version, type, length, xid 0.
        w.put(&[ofp::OFP_VERSION, OFPT_PACKET_OUT]);
        w.u16(total16);
        w.skip(4);
        w.u32(ofp::NO_BUFFER);
        w.u32(self.in_port);
        w.u16(actions_len as u16);
        w.skip(6);
        self.rewrite.write(&mut w);
        w.output(self.out_port, 0);
        w.put(self.data);
        debug_assert_eq!(w.n, total, "the PACKET_OUT's length as computed");
    }

    /// The same PACKET_OUT, general.
    pub(crate) fn message(&self) -> ofp::Message {
        let mut a = Actions::new();
        self.rewrite.push_actions(&mut a);
        a.push(Action::output(self.out_port));
        rules::packet_out(self.in_port, a, Bytes::copy_from_slice(self.data))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One of the 16 rewrites: bit 0 the destination MAC, 1 its address, 2 the source
    /// MAC, 3 its address.
    fn rewrite_of(sets: u8) -> Rewrite {
        let bit = |i: u8| sets & (1 << i) != 0;
        Rewrite {
            eth_dst: bit(0).then_some(MacAddr([2, 0, 0, 0, 0, 2])),
            ipv4_dst: bit(1).then_some(Ipv4Addr::new(10, 0, 0, 2)),
            eth_src: bit(2).then_some(MacAddr([2, 0, 0, 0, 0, 3])),
            ipv4_src: bit(3).then_some(Ipv4Addr::new(10, 0, 0, 3)),
        }
    }

    /// Every shape a connection's PACKET_OUT takes encodes to the bytes of its general
    /// message, which decode back to it; a packet too long for one message is not sent.
    #[test]
    fn packet_outs_encode_as_their_general_message() {
        let mut n = 0;
        for sets in 0u8..16 {
            for len in [0, 1, 60, 74, 1514] {
                let data = Bytes::from((0..len).map(|i| i as u8).collect::<Vec<u8>>());
                let po = ConnPacketOut {
                    in_port: 3,
                    rewrite: rewrite_of(sets),
                    out_port: 9,
                    data: &data,
                };
                let msg = po.message();
                let mut want = BytesMut::new();
                ofp::encode(0, &msg, &mut want).expect("a PACKET_OUT encodes");
                let mut got = BytesMut::from(&b"before"[..]);
                po.encode(&mut got);
                assert_eq!(&got[..6], b"before");
                assert_eq!(&got[6..], &want[..], "{po:?}");
                let (xid, back) =
                    ofp::decode(got.split_off(6).freeze()).expect("the PACKET_OUT decodes");
                assert_eq!(xid, 0);
                assert_eq!(back, msg);
                n += 1;
            }
        }
        assert_eq!(n, 16 * 5);
        let huge = Bytes::from(vec![0u8; 70_000]);
        let mut got = BytesMut::new();
        ConnPacketOut {
            in_port: 3,
            rewrite: Rewrite::default(),
            out_port: 9,
            data: &huge,
        }
        .encode(&mut got);
        assert!(got.is_empty(), "over 64 KiB: nothing appended");
    }

    /// Each rewrite's PACKET_OUT template is the field-by-field encoding of its zeroed
    /// rewrite, and its length the header, fixed fields and actions of that shape.
    #[test]
    fn every_rewrite_has_its_packet_out_template() {
        assert_eq!(packet_out_templates().len(), 16);
        for sets in 0..16 {
            let r = Rewrite::zeroed(sets);
            assert_eq!(r.sets(), sets);
            assert_eq!(
                packet_out_templates()[sets].len(),
                PACKET_OUT_FIXED_LEN + r.len() + OUTPUT_LEN
            );
            assert_eq!(rewrite_of(sets as u8).sets(), sets);
        }
    }

    /// An encoding outbox frames only what was appended: a PACKET_OUT too long to encode
    /// leaves no (empty) frame, whose xid the runtime would write over the next message.
    #[test]
    fn an_unencodable_packet_out_leaves_no_frame() {
        let mut out = crate::controller::Outbox::encoding();
        let huge = Bytes::from(vec![0u8; 70_000]);
        let small = Bytes::from_static(b"frame");
        let po = |data| ConnPacketOut {
            in_port: 3,
            rewrite: Rewrite::default(),
            out_port: 9,
            data,
        };
        out.push_conn_packet_out(1, &po(&huge));
        assert!(out.is_empty());
        out.push_conn_packet_out(1, &po(&small));
        let enc = out.encoded_mut().expect("an encoding outbox");
        let frames: Vec<(u64, ofp::MsgType, usize)> =
            enc.iter().map(|(d, t, b)| (d, t, b.len())).collect();
        assert_eq!(frames, vec![(1, ofp::MsgType::PacketOut, 24 + 16 + 5)]);
    }

    /// Every shape a connection rule takes encodes to the bytes of its general FLOW_MOD,
    /// which decode back to it: from its template (every value of the rule differs from
    /// the template's zeros, so a value not written in shows), and field by field for a
    /// `fin_timeout` body of another length.
    #[test]
    fn encodes_as_its_general_flow_mod() {
        const LONGER_BODY: [u8; 16] = [0, 19, 0, 5, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8];
        let mut n = 0;
        for syn in [Syn::Any, Syn::Not, Syn::Only, Syn::AndAck] {
            for sets in 0u8..16 {
                for fin in [
                    None,
                    Some(rules::fin_timeout_body(5)),
                    Some(&LONGER_BODY[..]),
                ] {
                    for out in [Out::Port(7), Out::Controller] {
                        let r = ConnRule {
                            cookie_low: 0x1234_0001_0002 | u64::from(sets),
                            idle_timeout: 30,
                            src: Ipv4Addr::new(10, 0, 0, 1),
                            dst: Ipv4Addr::new(10, 0, 0, 100),
                            sport: 40000,
                            dport: 80,
                            syn,
                            rewrite: rewrite_of(sets),
                            fin,
                            out,
                        };
                        let fm = r.flow_mod();
                        let mut want = BytesMut::new();
                        ofp::encode(0, &ofp::Message::FlowMod(fm.clone()), &mut want)
                            .expect("a connection rule encodes");
                        let mut got = BytesMut::from(&b"before"[..]);
                        r.encode(&mut got);
                        assert_eq!(&got[..6], b"before");
                        assert_eq!(&got[6..], &want[..], "{r:?}");
                        let (xid, back) = ofp::decode(got.split_off(6).freeze())
                            .expect("the encoded rule decodes");
                        assert_eq!(xid, 0);
                        assert_eq!(back, ofp::Message::FlowMod(fm));
                        n += 1;
                    }
                }
            }
        }
        assert_eq!(n, 4 * 16 * 3 * 2);
    }

    /// Each template is its own shape's, and the shapes cover every rule of a usual body.
    #[test]
    fn every_shape_has_its_template() {
        assert_eq!(templates().len(), SHAPES);
        for s in 0..SHAPES {
            let r = ConnRule::of_shape(s);
            assert_eq!(r.shape(), Some(s));
            let mut b = BytesMut::new();
            r.encode_fields(&mut b);
            assert_eq!(templates()[s].bytes, &b[..]);
        }
    }

    /// An encoding outbox sends a connection rule as the bytes of its FLOW_MOD, and keeps
    /// the order and the switch of everything pushed around it.
    #[test]
    fn an_encoding_outbox_keeps_rules_in_order() {
        let mut out = crate::controller::Outbox::encoding();
        let mut want: Vec<(u64, Vec<u8>)> = Vec::new();
        for dpid in 1..=4u64 {
            let r = ConnRule {
                cookie_low: dpid,
                idle_timeout: 30,
                src: Ipv4Addr::new(10, 0, 0, 1),
                dst: Ipv4Addr::new(10, 0, 0, 100),
                sport: 40000 + dpid as u16,
                dport: 80,
                syn: if dpid % 2 == 0 { Syn::Not } else { Syn::Any },
                rewrite: Rewrite::dst(MacAddr([2, 0, 0, 0, 0, 2]), None),
                fin: Some(rules::fin_timeout_body(5)),
                out: Out::Port(dpid as u32),
            };
            let mut b = BytesMut::new();
            ofp::encode(0, &ofp::Message::FlowMod(r.flow_mod()), &mut b)
                .expect("a connection rule encodes");
            want.push((dpid, b.to_vec()));
            out.push_conn_rule(dpid, &r);
            // A whole message between two rules, to another switch.
            let other = rules::packet_out(1, rules::output(2), bytes::Bytes::from_static(b"frame"));
            let mut b = BytesMut::new();
            ofp::encode(0, &other, &mut b).expect("a PACKET_OUT encodes");
            want.push((dpid + 100, b.to_vec()));
            out.push(dpid + 100, other);
        }
        assert!(out.msgs.is_empty());
        assert_eq!(out.len(), want.len());
        let enc = out.encoded_mut().expect("an encoding outbox");
        let got: Vec<(u64, Vec<u8>)> = enc.iter().map(|(d, _, b)| (d, b.to_vec())).collect();
        assert_eq!(got, want);
        let types: Vec<ofp::MsgType> = enc.iter().map(|(_, t, _)| t).collect();
        assert_eq!(types[0], ofp::MsgType::FlowMod);
        assert_eq!(types[1], ofp::MsgType::PacketOut);
        enc.clear();
        assert!(out.is_empty());
    }
}
