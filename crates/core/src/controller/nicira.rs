//! Open vSwitch (Nicira) extensions the proactive mode needs, built byte-exact as
//! OpenFlow 1.3 experimenter actions (`OFPAT_EXPERIMENTER`, experimenter 0x00002320) and
//! as an OXM of the `NXM_1` class. Layouts are Open vSwitch's
//! (`include/openflow/nicira-ext.h`, `lib/ofp-actions.c`, `lib/meta-flow.xml`); the unit
//! tests compare whole FLOW_MODs with what `ovs-ofctl -O OpenFlow13 parse-flow` encodes
//! for the same text (OVS 3.1.0).
//!
//! * `ct(...)`: `struct nx_action_conntrack` (NXAST_CT = 35), 24 bytes plus nested actions:
//!   subtype, flags (`NX_CT_F_COMMIT` = 1), zone_src (0: immediate zone), zone (u16),
//!   recirc_table (0xff = none), 3 pad, alg (0).
//! * `nat(...)`: `struct nx_action_nat` (NXAST_NAT = 36), nested in ct: subtype, 2 pad,
//!   flags (`NX_NAT_F_DST` = 2), range_present (`IPV4_MIN` = 1, `PROTO_MIN` = 0x10), then
//!   the present range fields in order (ipv4_min, proto_min), padded to 8.
//! * `resubmit(,T)`: `struct nx_action_resubmit` (NXAST_RESUBMIT_TABLE = 14): in_port
//!   (OFPP_IN_PORT = 0xfff8, i.e. "unchanged"), table, 3 pad.
//! * `ct_state`: `NXM_NX_CT_STATE`, class `NXM_1` (0x0001), field 105, 32 bits, maskable.

use std::net::Ipv4Addr;

use ofp::{Action, Bytes, Oxm, RawOxm};

use super::rules::NX_VENDOR_ID;

const NXAST_RESUBMIT_TABLE: u16 = 14;
const NXAST_CT: u16 = 35;
const NXAST_NAT: u16 = 36;

/// `NX_CT_F_COMMIT`: commit the connection to the connection tracker.
pub(crate) const CT_COMMIT: u16 = 1 << 0;
/// `NX_CT_RECIRC_NONE`.
const CT_RECIRC_NONE: u8 = 0xff;

const NAT_F_DST: u16 = 1 << 1;
const NAT_RANGE_IPV4_MIN: u16 = 1 << 0;
const NAT_RANGE_PROTO_MIN: u16 = 1 << 4;

/// `OFPP_IN_PORT` in OpenFlow 1.0 numbering, as `nx_action_resubmit` carries it.
const OFPP10_IN_PORT: u16 = 0xfff8;

/// `ct_state` bits (`CS_*`).
#[allow(dead_code)]
pub(crate) mod ct_state {
    pub(crate) const NEW: u32 = 0x01;
    pub(crate) const EST: u32 = 0x02;
    pub(crate) const REL: u32 = 0x04;
    pub(crate) const RPL: u32 = 0x08;
    pub(crate) const INV: u32 = 0x10;
    pub(crate) const TRK: u32 = 0x20;
    /// The packet's destination was rewritten by this pass's NAT (`OVS_CS_F_DST_NAT`).
    pub(crate) const DNAT: u32 = 0x80;
}

/// `NXM_NX_CT_STATE` field number in the `NXM_1` class.
const NXM_NX_CT_STATE: u8 = 105;

/// Match `ct_state`: the bits of `mask` must equal those of `value`
/// (`ct_state=+new+trk` is value = mask = NEW|TRK; `-trk` is value 0, mask TRK).
pub(crate) fn ct_state_match(value: u32, mask: u32) -> Oxm {
    let mut p = [0u8; 8];
    p[..4].copy_from_slice(&value.to_be_bytes());
    p[4..].copy_from_slice(&mask.to_be_bytes());
    Oxm::Raw(RawOxm {
        class: ofp::oxm::class::NXM_1,
        field: NXM_NX_CT_STATE,
        hasmask: true,
        payload: Bytes::copy_from_slice(&p),
    })
}

/// A whole nested Nicira action (header included), as it sits inside `ct(...)`.
fn nested(subtype: u16, body: &[u8]) -> Vec<u8> {
    let mut len = 10 + body.len();
    len = len.div_ceil(8) * 8;
    let mut v = Vec::with_capacity(len);
    v.extend_from_slice(&0xffffu16.to_be_bytes());
    v.extend_from_slice(&(len as u16).to_be_bytes());
    v.extend_from_slice(&NX_VENDOR_ID.to_be_bytes());
    v.extend_from_slice(&subtype.to_be_bytes());
    v.extend_from_slice(body);
    v.resize(len, 0);
    v
}

/// `nat` inside `ct`: with `dst`, destination NAT to exactly `ip:port`; without, apply the
/// NAT the connection already has (un-NAT on the reply path).
pub(crate) fn nat(dst: Option<(Ipv4Addr, u16)>) -> Vec<u8> {
    let mut body = vec![0, 0];
    match dst {
        None => {
            body.extend_from_slice(&0u16.to_be_bytes());
            body.extend_from_slice(&0u16.to_be_bytes());
        }
        Some((ip, port)) => {
            body.extend_from_slice(&NAT_F_DST.to_be_bytes());
            body.extend_from_slice(&(NAT_RANGE_IPV4_MIN | NAT_RANGE_PROTO_MIN).to_be_bytes());
            body.extend_from_slice(&ip.octets());
            body.extend_from_slice(&port.to_be_bytes());
        }
    }
    nested(NXAST_NAT, &body)
}

/// `ct(flags, zone=zone, table=recirc, <nested>)`: send the packet through the connection
/// tracker in `zone`; with `recirc`, continue in that table with `ct_state` set.
pub(crate) fn ct(flags: u16, zone: u16, recirc: Option<u8>, nested_actions: &[u8]) -> Action {
    let mut d = Vec::with_capacity(16 + nested_actions.len());
    d.extend_from_slice(&NXAST_CT.to_be_bytes());
    d.extend_from_slice(&flags.to_be_bytes());
    d.extend_from_slice(&0u32.to_be_bytes()); // zone_src: 0 = immediate
    d.extend_from_slice(&zone.to_be_bytes());
    d.push(recirc.unwrap_or(CT_RECIRC_NONE));
    d.extend_from_slice(&[0, 0, 0]);
    d.extend_from_slice(&0u16.to_be_bytes()); // alg
    d.extend_from_slice(nested_actions);
    Action::Experimenter {
        experimenter: NX_VENDOR_ID,
        data: Bytes::from(d),
    }
}

/// `resubmit(,table)`: look the packet up again in `table` (any table, earlier ones too),
/// then carry on with the rest of this rule's actions.
pub(crate) fn resubmit_table(table: u8) -> Action {
    let mut d = Vec::with_capacity(8);
    d.extend_from_slice(&NXAST_RESUBMIT_TABLE.to_be_bytes());
    d.extend_from_slice(&OFPP10_IN_PORT.to_be_bytes());
    d.push(table);
    d.extend_from_slice(&[0, 0, 0]);
    Action::Experimenter {
        experimenter: NX_VENDOR_ID,
        data: Bytes::from(d),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ofp::{Actions, FlowMod, Instruction, Match, Message};

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    fn unhex(s: &str) -> Vec<u8> {
        let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    fn action_bytes(a: Action) -> Vec<u8> {
        let mut fm = FlowMod::add(Match::new());
        let mut acts = Actions::new();
        acts.push(a);
        fm.instructions.push(Instruction::ApplyActions(acts));
        let mut bytes = bytes::BytesMut::new();
        ofp::encode(1, &Message::FlowMod(fm), &mut bytes).unwrap();
        // header 8 + flow_mod fixed 40 + empty match 8 + instruction header 8.
        bytes[64..].to_vec()
    }

    // Expected bytes: `ovs-ofctl -O OpenFlow13 --verbose=vconn:dbg add-flow` of the
    // same text to an OVS 3.1 bridge, the action part of the logged FLOW_MOD (and
    // `ovs-ofctl ofp-print` of these bytes gives the text back).

    #[test]
    fn ct_commit_dnat_recirculate() {
        // ct(commit,zone=4097,nat(dst=10.0.0.2:80),table=1)
        let a = ct(
            CT_COMMIT,
            4097,
            Some(1),
            &nat(Some(("10.0.0.2".parse().unwrap(), 80))),
        );
        assert_eq!(
            action_bytes(a),
            unhex(
                "ffff0030 00002320 0023 0001 00000000 1001 01 000000 0000
                 ffff0018 00002320 0024 0000 0002 0011 0a000002 0050 0000"
            )
        );
    }

    #[test]
    fn ct_nat_recirculate() {
        // ct(zone=4097,nat,table=1)
        let a = ct(0, 4097, Some(1), &nat(None));
        assert_eq!(
            action_bytes(a),
            unhex(
                "ffff0028 00002320 0023 0000 00000000 1001 01 000000 0000
                 ffff0010 00002320 0024 0000 0000 0000"
            )
        );
    }

    #[test]
    fn resubmit_to_table_0() {
        assert_eq!(
            action_bytes(resubmit_table(0)),
            unhex("ffff0010 00002320 000e fff8 00 000000")
        );
    }

    #[test]
    fn ct_state_oxm() {
        let m = Match::new().with(ct_state_match(
            ct_state::NEW | ct_state::TRK,
            ct_state::NEW | ct_state::TRK,
        ));
        let fm = FlowMod::add(m);
        let mut bytes = bytes::BytesMut::new();
        ofp::encode(1, &Message::FlowMod(fm), &mut bytes).unwrap();
        // ofp_match: type 1, length 4 + 12, the TLV, padding to 8.
        assert_eq!(
            hex(&bytes[48..48 + 16]),
            "00010010".to_string() + "0001d308" + "00000021" + "00000021"
        );
    }

    /// A whole FLOW_MOD with all three actions and the `ct_state` match; `ovs-ofctl
    /// ofp-print` (OVS 3.1.0) of these bytes reads: `OFPT_FLOW_MOD (OF1.3) (xid=0x1): ADD
    /// table:1 ct_state=+new+trk,tcp actions=ct(commit,table=1,zone=26215,
    /// nat(dst=10.0.0.2:80)),ct(table=1,zone=26215,nat),resubmit(,0)`.
    #[test]
    fn whole_flow_mod_as_ovs_prints_it() {
        let mut fm = FlowMod::add(
            Match::new()
                .with(Oxm::EthType(0x0800))
                .with(Oxm::IpProto(6))
                .with(ct_state_match(
                    ct_state::NEW | ct_state::TRK,
                    ct_state::NEW | ct_state::TRK,
                )),
        );
        fm.table_id = 1;
        let mut a = Actions::new();
        a.push(ct(
            CT_COMMIT,
            0x6667,
            Some(1),
            &nat(Some(("10.0.0.2".parse().unwrap(), 80))),
        ));
        a.push(ct(0, 0x6667, Some(1), &nat(None)));
        a.push(resubmit_table(0));
        fm.instructions.push(Instruction::ApplyActions(a));
        let mut b = bytes::BytesMut::new();
        ofp::encode(1, &Message::FlowMod(fm.clone()), &mut b).unwrap();
        assert_eq!(
            hex(&b),
            "040e00c000000001000000000000000000000000000000000100000000008000\
             ffffffffffffffffffffffff000000000001001b80000a020800800014010600\
             01d308000000210000002100000000000004007000000000ffff003000002320\
             00230001000000006667010000000000ffff0018000023200024000000020011\
             0a00000200500000ffff00280000232000230000000000006667010000000000\
             ffff0010000023200024000000000000ffff001000002320000efff800000000"
        );
        // And the codec reads it back unchanged (experimenter actions and the NXM_1 TLV
        // stay opaque).
        let (_, back) = ofp::decode(b.freeze()).unwrap();
        assert_eq!(back, Message::FlowMod(fm));
    }
}
