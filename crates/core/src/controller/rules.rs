//! Builders for the FLOW_MODs and PACKET_OUTs the controller sends. One place decides
//! priorities and cookies, so the pipeline can be read here in one go:
//!
//! | priority | rule | cookie kind |
//! | --- | --- | --- |
//! | 500 | LLDP to the controller | `Lldp` |
//! | 300 | one direction of one client connection, exact 5-tuple | `Conn` |
//! | 250 | overload OFF period: drop new connections to a service address | `Gap` |
//! | 200 | new connections to a service address, to the controller | `Intercept` |
//! | 160 | a backend's SYN-ACK that no connection rule took, to the controller (switches with clients) | `Intercept` |
//! | 150 | while rules wait for handshakes: a backend's replies, to the controller | `Gap` |
//! | 100 | L2: to a learned host's MAC, toward it | `L2` |
//! | 0 | table-miss, to the controller | `TableMiss` |

use std::net::Ipv4Addr;

use flowgate_packet::{ETH_TYPE_IPV4, ETH_TYPE_LLDP, IP_PROTO_TCP, MacAddr};
use ofp::{
    Action, Actions, Bytes, FlowMod, FlowModCommand, Instruction, Match, Message, Oxm, PacketOut,
};

use crate::cookie::{self, RuleKind};

pub(crate) const PRIO_LLDP: u16 = 500;
pub(crate) const PRIO_CONN: u16 = 300;
pub(crate) const PRIO_GAP: u16 = 250;
pub(crate) const PRIO_INTERCEPT: u16 = 200;
pub(crate) const PRIO_SYN_ACK_CATCH: u16 = 160;
pub(crate) const PRIO_REPLY_CATCH: u16 = 150;
pub(crate) const PRIO_L2: u16 = 100;
pub(crate) const PRIO_TABLE_MISS: u16 = 0;

/// OFPTT_ALL: "wildcard table used for table config, flow stats and flow deletes" (§7.3.4.1).
pub(crate) const TABLE_ALL: u8 = 0xff;

pub(crate) fn to_controller() -> Actions {
    let mut a = Actions::new();
    // OFPCML_NO_BUFFER: send the whole packet, buffer nothing (§7.2.5), so the packet
    // can be sent on with PACKET_OUT whatever the switch's buffering.
    a.push(Action::Output {
        port: ofp::port::CONTROLLER,
        max_len: ofp::CONTROLLER_MAX_LEN_NO_BUFFER,
    });
    a
}

// Inlined, so the FlowMod (792 bytes, with its inline match and instructions) is built
// where its caller puts it instead of being moved through each builder step (memmove
// was 10 % of the controller's profile).
#[inline(always)]
fn flow(kind: RuleKind, low: u64, priority: u16, m: Match, actions: Actions) -> FlowMod {
    let mut fm = FlowMod::add(m);
    fm.cookie = cookie::cookie(kind, low);
    fm.priority = priority;
    fm.instructions.push(Instruction::ApplyActions(actions));
    fm
}

/// The OpenFlow 1.3 table-miss entry: "§5.4: every flow table must support a table-miss
/// flow entry ... (priority 0, all fields wildcarded)". Without it OF1.3 drops misses.
pub(crate) fn table_miss() -> Message {
    Message::FlowMod(flow(
        RuleKind::TableMiss,
        0,
        PRIO_TABLE_MISS,
        Match::new(),
        to_controller(),
    ))
}

pub(crate) fn lldp_to_controller() -> Message {
    Message::FlowMod(flow(
        RuleKind::Lldp,
        0,
        PRIO_LLDP,
        Match::new().with(Oxm::EthType(ETH_TYPE_LLDP)),
        to_controller(),
    ))
}

/// Delete every rule of one kind in every table, whatever its match (non-strict delete
/// filtered by cookie, §6.4 and §7.3.4.1).
pub(crate) fn delete_kind(kind: RuleKind) -> Message {
    let mut fm = FlowMod::delete(Match::new());
    fm.table_id = TABLE_ALL;
    fm.cookie = kind.base();
    fm.cookie_mask = cookie::KIND_MASK;
    Message::FlowMod(fm)
}

/// New TCP connections to `addr:port` go up to the controller. Connection rules
/// (higher priority) take everything after the first packets. `slot`, here and below:
/// the service's (`ServiceState::slot`), in the cookie.
pub(crate) fn intercept(slot: u16, addr: Ipv4Addr, port: u16) -> Message {
    let m = tcp_match(None, Some(addr), None, Some(port));
    Message::FlowMod(flow(
        RuleKind::Intercept,
        u64::from(slot),
        PRIO_INTERCEPT,
        m,
        to_controller(),
    ))
}

/// Cookie bit of a [`syn_ack_catch`] rule among the `Intercept` rules.
const SYN_ACK_CATCH_BIT: u64 = 1 << 16;

/// A backend's SYN-ACK from its service port goes up to the controller when no connection
/// rule (priority 300) takes it. A connection's reverse rule goes out before its SYN, so
/// the SYN-ACK normally meets it; but Open vSwitch first looks a packet up in its
/// datapath's cache of earlier lookups (megaflows), which revalidator threads bring up to
/// date only after a rule change, and a megaflow cached from the backend's earlier packets
/// to the client (a ping, say) before any rule told TCP apart carries the SYN-ACK by the
/// L2 rule, unrewritten, and the client drops it and sends its SYN again a second later
/// (seen in the lab with packet captures: the first connection of each domain of Case C).
/// With this rule in the table every lookup of a backend's packets tells a SYN-ACK apart,
/// so no megaflow of other packets carries one; and one that comes up is sent on
/// rewritten by the controller, as a segment that raced its rules is. A SYN-ACK of a
/// connection made to the backend directly comes up too, and goes on by L2. Sent only to
/// the switches where clients are (`Controller::syn_ack_catches` says why).
///
/// `syn_ack` is the match of the backend's segments ([`tcp_match`] of its address and
/// port) with `tcp_flags=+syn+ack`, which the connection rules' builder writes
/// (`conn_rule::Syn::AndAck`).
pub(crate) fn syn_ack_catch(slot: u16, syn_ack: Match) -> Message {
    Message::FlowMod(flow(
        RuleKind::Intercept,
        u64::from(slot) | SYN_ACK_CATCH_BIT,
        PRIO_SYN_ACK_CATCH,
        syn_ack,
        to_controller(),
    ))
}

/// An OFF period of a service's gap: new connections to `addr:port` are dropped at the
/// switch until `hard_timeout` seconds have passed (§6.5: the switch removes the entry
/// itself). Connection rules (priority 300) are above it: established flows never see it.
pub(crate) fn gap_drop(slot: u16, addr: Ipv4Addr, port: u16, hard_timeout: u16) -> Message {
    let m = tcp_match(None, Some(addr), None, Some(port));
    // An empty instruction set drops (§5.10: no output action, no forwarding).
    let mut fm = FlowMod::add(m);
    fm.cookie = cookie::cookie(RuleKind::Gap, u64::from(slot));
    fm.priority = PRIO_GAP;
    fm.hard_timeout = hard_timeout;
    Message::FlowMod(fm)
}

/// Cookie bit of a [`reply_catch`] rule among a service's `Gap` rules ([`gap_delete`],
/// which matches the whole cookie, leaves it alone).
const REPLY_CATCH_BIT: u64 = 1 << 16;

/// While a service's connection rules wait for the client's ACK (`handshake`), the
/// backend's SYN-ACK must come up to be rewritten to the service address; without this it
/// would follow the L2 rules to the client unrewritten. Connections with rules have their
/// own reverse rule above it (priority 300). It ends by itself after `hard_timeout`
/// seconds (§6.5), and is sent again while deferring goes on (an identical ADD restarts
/// it, §6.4).
pub(crate) fn reply_catch(slot: u16, backend: Ipv4Addr, port: u16, hard_timeout: u16) -> Message {
    let m = tcp_match(Some(backend), None, Some(port), None);
    let mut fm = flow(
        RuleKind::Gap,
        u64::from(slot) | REPLY_CATCH_BIT,
        PRIO_REPLY_CATCH,
        m,
        to_controller(),
    );
    fm.hard_timeout = hard_timeout;
    Message::FlowMod(fm)
}

/// Withdraw a service's OFF-period rules (cookie-masked delete, §7.3.4.1).
pub(crate) fn gap_delete(slot: u16) -> Message {
    let mut fm = FlowMod::delete(Match::new());
    fm.table_id = TABLE_ALL;
    fm.cookie = cookie::cookie(RuleKind::Gap, u64::from(slot));
    fm.cookie_mask = u64::MAX;
    Message::FlowMod(fm)
}

/// Withdraw every `Gap` rule of a slot, its reply catches too (a service that went).
pub(crate) fn gap_delete_slot(slot: u16) -> Message {
    let mut fm = FlowMod::delete(Match::new());
    fm.table_id = TABLE_ALL;
    fm.cookie = cookie::cookie(RuleKind::Gap, u64::from(slot));
    fm.cookie_mask = cookie::KIND_MASK | 0xffff;
    Message::FlowMod(fm)
}

/// Frames to `mac` out of `port`, its cookie carrying generation bit `gen`
/// ([`cookie::l2::GEN`]).
pub(crate) fn l2_forward(mac: MacAddr, port: u32, gen_bit: bool) -> Message {
    let low = mac_bits(mac) | l2_gen(gen_bit);
    let m = Match::new().with(Oxm::EthDst {
        value: mac.0,
        mask: None,
    });
    Message::FlowMod(flow(RuleKind::L2, low, PRIO_L2, m, output(port)))
}

/// The L2 rule for `mac`, of either generation.
pub(crate) fn l2_delete(mac: MacAddr) -> Message {
    let mut fm = FlowMod::delete(Match::new().with(Oxm::EthDst {
        value: mac.0,
        mask: None,
    }));
    fm.command = FlowModCommand::DeleteStrict;
    fm.priority = PRIO_L2;
    fm.cookie = cookie::cookie(RuleKind::L2, mac_bits(mac));
    fm.cookie_mask = !cookie::l2::GEN;
    Message::FlowMod(fm)
}

/// Every L2 rule carrying generation bit `gen_bit` (§6.4: a cookie-masked delete).
pub(crate) fn l2_delete_generation(gen_bit: bool) -> Message {
    let mut fm = FlowMod::delete(Match::new());
    fm.table_id = TABLE_ALL;
    fm.cookie = cookie::cookie(RuleKind::L2, l2_gen(gen_bit));
    fm.cookie_mask = cookie::KIND_MASK | cookie::l2::GEN;
    Message::FlowMod(fm)
}

fn l2_gen(gen_bit: bool) -> u64 {
    if gen_bit { cookie::l2::GEN } else { 0 }
}

fn mac_bits(mac: MacAddr) -> u64 {
    mac.0.iter().fold(0u64, |acc, b| (acc << 8) | u64::from(*b))
}

pub(crate) fn output(port: u32) -> Actions {
    let mut a = Actions::new();
    a.push(Action::output(port));
    a
}

/// An exact match on an IPv4 TCP segment's addresses and ports (any of them may be left
/// out). Prerequisites per §7.2.3.8: `ipv4_*` needs `eth_type=0x0800`, `tcp_*` needs
/// `ip_proto=6`.
pub(crate) fn tcp_match(
    src: Option<Ipv4Addr>,
    dst: Option<Ipv4Addr>,
    sport: Option<u16>,
    dport: Option<u16>,
) -> Match {
    let mut m = Match::new();
    m.push(Oxm::EthType(ETH_TYPE_IPV4));
    m.push(Oxm::IpProto(IP_PROTO_TCP));
    if let Some(a) = src {
        m.push(Oxm::Ipv4Src {
            value: a,
            mask: None,
        });
    }
    if let Some(a) = dst {
        m.push(Oxm::Ipv4Dst {
            value: a,
            mask: None,
        });
    }
    if let Some(p) = sport {
        m.push(Oxm::TcpSrc(p));
    }
    if let Some(p) = dport {
        m.push(Oxm::TcpDst(p));
    }
    m
}

/// Bits 32..46 of a connection rule's cookie: a tag of the decision the rule carries
/// (below [`cookie::conn::OUTCOME`], above the `(service, backend)` indexes), so the
/// FLOW_REMOVED of an earlier connection on the same 4-tuple, replaced or expired late,
/// is not taken for the current one's end.
pub(crate) const CONN_TAG_SHIFT: u32 = 32;
pub(crate) const CONN_TAG_MASK: u16 = 0x3fff;

/// The cookie bits carrying `tag`.
pub(crate) const fn conn_tag_bits(tag: u16) -> u64 {
    ((tag & CONN_TAG_MASK) as u64) << CONN_TAG_SHIFT
}

/// The tag a connection rule's cookie carries.
pub(crate) const fn conn_tag_of(cookie: u64) -> u16 {
    ((cookie >> CONN_TAG_SHIFT) as u16) & CONN_TAG_MASK
}

/// Remove exactly one connection rule (same match, same priority), whatever its cookie
/// (OFPFC_DELETE_STRICT, §6.4).
pub(crate) fn conn_delete_strict(m: Match) -> Message {
    let mut fm = FlowMod::delete_strict(m);
    fm.priority = PRIO_CONN;
    fm.cookie = RuleKind::Conn.base();
    fm.cookie_mask = cookie::KIND_MASK;
    Message::FlowMod(fm)
}

/// Nicira's experimenter id (Open vSwitch extensions).
pub(crate) const NX_VENDOR_ID: u32 = 0x0000_2320;
/// `NXAST_FIN_TIMEOUT`: on a TCP FIN or RST, lower the rule's idle/hard timeouts.
const NXAST_FIN_TIMEOUT: u16 = 19;

/// Open vSwitch's `fin_timeout(idle_timeout=N)`: once the switch sees the connection's FIN
/// or RST, its rule idles out after `idle` seconds instead of the full idle timeout, and the
/// FLOW_REMOVED that follows ends the connection's accounting promptly.
/// Wire form (`struct nx_action_fin_timeout`, 16 bytes): subtype, fin_idle_timeout,
/// fin_hard_timeout, 2 bytes of padding, after the experimenter header.
///
/// `body` is [`fin_timeout_body`]'s: the action is built in place for each rule, which
/// the profile preferred to cloning a built one (a call per connection rule).
#[inline]
pub(crate) fn fin_timeout_of(body: &'static [u8]) -> Action {
    Action::Experimenter {
        experimenter: NX_VENDOR_ID,
        data: Bytes::from_static(body),
    }
}

/// The body of a `fin_timeout(idle_timeout=idle)` action, one per distinct `idle` for the
/// life of the process. Static, so that each connection rule's action refers to it with no
/// reference count: a `Bytes` built at run time shares one, and two runtime threads
/// incrementing and decrementing it for every rule bounced its cache line between the
/// cores (7 % of the controller's CPU in the 16-switch bench profile). What this leaks is
/// bounded: 8 bytes per distinct value the configuration ever held.
pub(crate) fn fin_timeout_body(idle: u16) -> &'static [u8] {
    static BODIES: std::sync::Mutex<Vec<(u16, &'static [u8])>> = std::sync::Mutex::new(Vec::new());
    // A poisoned lock still holds valid entries (each is pushed whole).
    let mut bodies = BODIES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(&(_, body)) = bodies.iter().find(|(v, _)| *v == idle) {
        return body;
    }
    let [a, b] = NXAST_FIN_TIMEOUT.to_be_bytes();
    let [i, j] = idle.to_be_bytes();
    let body: &'static [u8] = Box::leak(Box::new([a, b, i, j, 0, 0, 0, 0]));
    bodies.push((idle, body));
    body
}

/// Send `data` out with `actions`, as if it had entered at `in_port`.
pub(crate) fn packet_out(in_port: u32, actions: Actions, data: Bytes) -> Message {
    Message::PacketOut(PacketOut {
        buffer_id: ofp::NO_BUFFER,
        in_port,
        actions,
        data,
    })
}

/// Every rule of `kind` the switch holds (§7.3.5.2, filtered by cookie): the connection
/// rules, to rebuild the connection table after a restart, and others.
pub(crate) fn flow_stats_request(kind: RuleKind) -> Message {
    flow_stats_by_cookie(kind.base(), cookie::KIND_MASK)
}

/// Every rule whose cookie, masked with `cookie_mask`, is `cookie` (§7.3.5.2).
pub(crate) fn flow_stats_by_cookie(cookie: u64, cookie_mask: u64) -> Message {
    ofp::Message::MultipartRequest(ofp::MultipartRequest {
        flags: 0,
        body: ofp::MultipartRequestBody::Flow(ofp::FlowStatsRequest {
            table_id: TABLE_ALL,
            out_port: ofp::port::ANY,
            out_group: ofp::group::ANY,
            cookie,
            cookie_mask,
            match_: Match::new(),
        }),
    })
}

pub(crate) fn port_desc_request() -> Message {
    ofp::Message::MultipartRequest(ofp::MultipartRequest {
        flags: 0,
        body: ofp::MultipartRequestBody::PortDesc,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `fin_timeout` body is built once per value and reads as Open vSwitch expects.
    #[test]
    fn fin_timeout_bodies_are_shared_per_value() {
        let body = |idle| match fin_timeout_of(fin_timeout_body(idle)) {
            Action::Experimenter { experimenter, data } => {
                assert_eq!(experimenter, NX_VENDOR_ID);
                data
            }
            other => panic!("not an experimenter action: {other:?}"),
        };
        let (a, b, c) = (body(7), body(7), body(300));
        assert_eq!(&a[..], &[0, 19, 0, 7, 0, 0, 0, 0]);
        assert_eq!(&c[..], &[0, 19, 1, 44, 0, 0, 0, 0]);
        assert_eq!(a.as_ptr(), b.as_ptr());
    }
}
