//! The checks of an answer's parts: what a VIP balancer's forward rule, reverse rule and
//! PACKET_OUT must say for a probe, read from the views over the received frames. Each
//! failure names what was wrong (built only on failure: the valid path allocates nothing).

use std::net::Ipv4Addr;

use flowgate_packet as packet;
use ofp::oxm::ofb;
use ofp::{ActionRef, FlowModView};

use super::SwitchPlan;

/// What the checks read of a rule's or a PACKET_OUT's actions, in one pass: the first
/// SET_FIELD of `ipv4_src` and of `ipv4_dst`, the first output, and enough of the
/// SET_FIELDs of `eth_dst` to name the first one that is not a given MAC
/// ([`Acts::eth_dst_not`]). SET_FIELDs count as the owned decoder types them: unmasked,
/// of the spec's length.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Acts {
    pub(super) set_src: Option<Ipv4Addr>,
    pub(super) set_dst: Option<Ipv4Addr>,
    pub(super) output: Option<u32>,
    /// The first `eth_dst` set, and the first one after it with another value.
    eth_dst: [Option<[u8; 6]>; 2],
}

impl Acts {
    pub(super) fn of<'a>(actions: impl Iterator<Item = ActionRef<'a>>) -> Acts {
        let mut s = Acts::default();
        for a in actions {
            if let Some((port, _)) = a.output() {
                s.output.get_or_insert(port);
                continue;
            }
            let Some(o) = a.set_field() else {
                continue;
            };
            // A masked SET_FIELD is kept raw by the decoder, as is one of another length.
            let ip = |f| match o.basic::<4>(f) {
                Some((v, None)) => Some(Ipv4Addr::from(v)),
                _ => None,
            };
            match o.field() {
                ofb::IPV4_SRC if s.set_src.is_none() => s.set_src = ip(ofb::IPV4_SRC),
                ofb::IPV4_DST if s.set_dst.is_none() => s.set_dst = ip(ofb::IPV4_DST),
                ofb::ETH_DST => {
                    if let Some((v, None)) = o.basic::<6>(ofb::ETH_DST) {
                        match s.eth_dst {
                            [None, _] => s.eth_dst[0] = Some(v),
                            [Some(first), None] if first != v => s.eth_dst[1] = Some(v),
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
        }
        s
    }

    /// The first `eth_dst` set, in order, that is not `mac`: the first one if it is not,
    /// else the first that differs from it.
    pub(super) fn eth_dst_not(&self, mac: [u8; 6]) -> Option<[u8; 6]> {
        match self.eth_dst {
            [Some(first), _] if first != mac => Some(first),
            [_, other] => other,
        }
    }
}

/// The rule's 5-tuple fields: the first unmasked `ipv4_src`, `ipv4_dst`, `tcp_src` and
/// `tcp_dst` of its match, if it has all four.
pub(super) fn connection_of(fm: &FlowModView<'_>) -> Option<(Ipv4Addr, Ipv4Addr, u16, u16)> {
    let (mut src, mut dst, mut sport, mut dport) = (None, None, None, None);
    let ip = |o: &ofp::OxmRef<'_>, f| match o.basic::<4>(f) {
        Some((v, None)) => Some(Ipv4Addr::from(v)),
        _ => None,
    };
    let port = |o: &ofp::OxmRef<'_>, f| o.basic::<2>(f).map(|(v, _)| u16::from_be_bytes(v));
    for o in fm.match_fields() {
        match o.field() {
            ofb::IPV4_SRC if src.is_none() => src = ip(&o, ofb::IPV4_SRC),
            ofb::IPV4_DST if dst.is_none() => dst = ip(&o, ofb::IPV4_DST),
            ofb::TCP_SRC if sport.is_none() => sport = port(&o, ofb::TCP_SRC),
            ofb::TCP_DST if dport.is_none() => dport = port(&o, ofb::TCP_DST),
            _ => {}
        }
    }
    Some((src?, dst?, sport?, dport?))
}

/// A forward rule for probe `key`: every match field fits the SYN (in_port, eth_type,
/// ip_proto, eth_src; no masked address), it sets `ipv4_dst` to a backend (returned) and
/// rewrites to and outputs toward that backend.
pub(super) fn check_forward(
    plan: &SwitchPlan,
    fm: &FlowModView<'_>,
    acts: &Acts,
    key: (Ipv4Addr, u16),
) -> Result<usize, String> {
    for o in fm.match_fields() {
        let ok = match o.field() {
            ofb::IN_PORT => o
                .basic::<4>(ofb::IN_PORT)
                .is_none_or(|(v, _)| u32::from_be_bytes(v) == plan.client_port),
            ofb::ETH_TYPE => o
                .basic::<2>(ofb::ETH_TYPE)
                .is_none_or(|(v, _)| u16::from_be_bytes(v) == packet::ETH_TYPE_IPV4),
            ofb::IP_PROTO => o
                .basic::<1>(ofb::IP_PROTO)
                .is_none_or(|(v, _)| v[0] == packet::IP_PROTO_TCP),
            ofb::ETH_SRC => match o.basic::<6>(ofb::ETH_SRC) {
                Some((v, None)) => v == plan.client_mac.0,
                _ => true,
            },
            f @ (ofb::IPV4_SRC | ofb::IPV4_DST) => !matches!(o.basic::<4>(f), Some((_, Some(_)))),
            _ => true,
        };
        if !ok {
            let field = o
                .to_oxm()
                .map_or_else(|e| format!("{o:?} ({e})"), |x| format!("{x:?}"));
            return Err(format!(
                "forward rule for {key:?}: match field {field} does not fit the SYN"
            ));
        }
    }
    to_backend(plan, acts).map_err(|e| format!("forward rule for {key:?}: {e}"))
}

/// The PACKET_OUT of probe `key`'s SYN: it sets `ipv4_dst` to a backend (returned) and
/// rewrites to and outputs toward that backend.
pub(super) fn check_packet_out(
    plan: &SwitchPlan,
    acts: &Acts,
    key: (Ipv4Addr, u16),
) -> Result<usize, String> {
    to_backend(plan, acts).map_err(|e| format!("PACKET_OUT of {key:?}: {e}"))
}

/// Actions that send to a backend: `ipv4_dst` set to one (returned), every `eth_dst` set
/// to its MAC, the first output its port.
fn to_backend(plan: &SwitchPlan, acts: &Acts) -> Result<usize, String> {
    let dst = acts.set_dst;
    let Some(b) = dst.and_then(|d| plan.backend_by_ip(d)) else {
        return Err(format!("set ipv4_dst {dst:?} is no backend"));
    };
    check_backend_actions(plan, acts, b)?;
    Ok(b)
}

/// Every `eth_dst` set is backend `b`'s MAC, and the first output is its port.
fn check_backend_actions(plan: &SwitchPlan, acts: &Acts, b: usize) -> Result<(), String> {
    let (_, mac, port) = plan.backends[b];
    if let Some(value) = acts.eth_dst_not(mac.0) {
        return Err(format!("set eth_dst {value:02x?} is not backend {b}'s MAC"));
    }
    match acts.output {
        Some(p) if p == port => Ok(()),
        other => Err(format!("output {other:?}, backend {b} is on port {port}")),
    }
}
