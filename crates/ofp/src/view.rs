//! Borrowed, zero-allocation views over a received OFPT_FLOW_MOD (§7.3.4.1),
//! OFPT_PACKET_OUT (§7.3.7), OFPT_FLOW_REMOVED (§7.4.2) or OFPT_PACKET_IN (§7.4.1) frame,
//! in the smoltcp `Packet<&[u8]>` style: the constructor checks every length against the
//! frame, then the accessors and iterators read the wire directly. For a reader that looks
//! at a few fields of each of many messages (the bench's emulated switches check every
//! answer; the controller reads every FLOW_REMOVED; the bench's floor answers every
//! PACKET_IN), where [`crate::decode`] would build the whole owned message.
//!
//! A constructor fails exactly when [`crate::decode`] fails on the same frame, with the
//! same [`DecodeError`] (the checks below mirror the decoders', in the same order), and in
//! one more case: a well-formed frame of another message type is
//! [`DecodeError::BadValue`] `{ what: "message type" }`. What a view yields is what
//! `decode` yields: the OXM TLVs of the match, the instructions and the actions in wire
//! order, each convertible to the owned type (`to_oxm`, `to_action`, `to_instruction`,
//! which allocate). The iterators never panic, on any input: after a constructor succeeded
//! they walk TLVs whose lengths were checked, and they stop at anything that does not fit.

use bytes::Bytes;

use crate::OFP_VERSION;
use crate::action::{Action, action_type};
use crate::error::DecodeError;
use crate::header::{HEADER_LEN, MsgType};
use crate::instruction::{Instruction, instruction_type};
use crate::msg::flow::{FlowModCommand, FlowModFixed, FlowModFlags, FlowRemovedReason};
use crate::msg::packet::PacketInReason;
use crate::oxm::{OFPMT_OXM, Oxm, basic_shape, class};
use crate::wire::{Reader, padded8};

#[inline]
fn be16(b: &[u8], at: usize) -> u16 {
    b.get(at..at + 2)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u16::from_be_bytes)
}
#[inline]
fn be32(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u32::from_be_bytes)
}
#[inline]
fn be64(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 8)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u64::from_be_bytes)
}

/// A cursor over a slice whose reads fail with [`DecodeError::Truncated`], as
/// [`Reader`]'s do.
struct Cur<'a>(&'a [u8]);

impl<'a> Cur<'a> {
    #[inline]
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if n > self.0.len() {
            return Err(DecodeError::Truncated);
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    #[inline]
    fn u16(&mut self) -> Result<u16, DecodeError> {
        self.take(2).map(|s| be16(s, 0))
    }
}

/// The body after the header of a frame of type `want`, with `decode`'s header checks
/// (length, version, type) in `decode`'s order.
#[inline]
fn body_of(frame: &[u8], want: MsgType) -> Result<&[u8], DecodeError> {
    if frame.len() < HEADER_LEN {
        return Err(DecodeError::Truncated);
    }
    let len = usize::from(be16(frame, 2));
    if len < HEADER_LEN {
        return Err(DecodeError::BadLength);
    }
    if frame.len() < len {
        return Err(DecodeError::Truncated);
    }
    if frame.len() > len {
        return Err(DecodeError::BadLength);
    }
    let (version, typ) = (frame.first().copied(), frame.get(1).copied());
    let (version, typ) = (version.unwrap_or(0), typ.unwrap_or(0));
    let t = MsgType::from_u8(typ);
    // HELLO, the one type any version may send, is not `want`: every other type must be
    // OpenFlow 1.3.
    if version != OFP_VERSION && t != Some(MsgType::Hello) {
        return Err(DecodeError::BadVersion(version));
    }
    match t {
        None => Err(DecodeError::UnknownType(typ)),
        Some(t) if t != want => Err(DecodeError::BadValue {
            what: "message type",
        }),
        Some(_) => Ok(frame.get(HEADER_LEN..).unwrap_or(&[])),
    }
}

/// `struct ofp_match` (§7.2.3.1, §7.2.2 padding): its OXM TLVs, each whole.
#[inline]
fn check_match<'a>(c: &mut Cur<'a>) -> Result<&'a [u8], DecodeError> {
    let typ = c.u16()?;
    let len = usize::from(c.u16()?);
    if typ != OFPMT_OXM {
        return Err(DecodeError::BadValue { what: "match type" });
    }
    if len < 4 {
        return Err(DecodeError::BadLength);
    }
    let fields = c.take(len - 4)?;
    let mut f = Cur(fields);
    while !f.0.is_empty() {
        let header = f.take(4)?;
        f.take(usize::from(header.get(3).copied().unwrap_or(0)))?;
    }
    c.take((8 - len % 8) % 8)?;
    Ok(fields)
}

/// A FLOW_MOD's or FLOW_REMOVED's body: 40 bytes of fixed fields, then a match (§7.3.4.1,
/// §7.4.2). Its OXM TLVs, and what follows the match.
#[inline]
fn fixed_then_match(frame: &[u8], want: MsgType) -> Result<(&[u8], &[u8]), DecodeError> {
    let mut c = Cur(body_of(frame, want)?);
    c.take(40)?;
    let fields = check_match(&mut c)?;
    Ok((fields, c.0))
}

/// The next action (§7.2.5) or instruction (§7.2.4): type and the whole TLV, at least 8
/// bytes and a multiple of 8.
#[inline]
fn take_tlv8<'a>(c: &mut Cur<'a>) -> Result<(u16, &'a [u8]), DecodeError> {
    if c.0.len() < 4 {
        return Err(DecodeError::Truncated);
    }
    let (typ, len) = (be16(c.0, 0), usize::from(be16(c.0, 2)));
    if len < 8 || len % 8 != 0 {
        return Err(DecodeError::BadLength);
    }
    Ok((typ, c.take(len)?))
}

#[inline]
fn fixed_len(tlv: &[u8], want: usize) -> Result<(), DecodeError> {
    if tlv.len() == want {
        Ok(())
    } else {
        Err(DecodeError::BadLength)
    }
}

/// A list of actions filling `list`, with `Action::decode`'s checks.
#[inline]
fn check_actions(list: &[u8]) -> Result<(), DecodeError> {
    use action_type::*;
    let mut c = Cur(list);
    while !c.0.is_empty() {
        let (typ, tlv) = take_tlv8(&mut c)?;
        match typ {
            OUTPUT => fixed_len(tlv, 16)?,
            COPY_TTL_OUT | COPY_TTL_IN | SET_MPLS_TTL | DEC_MPLS_TTL | PUSH_VLAN | POP_VLAN
            | PUSH_MPLS | POP_MPLS | SET_QUEUE | GROUP | SET_NW_TTL | DEC_NW_TTL | PUSH_PBB
            | POP_PBB => fixed_len(tlv, 8)?,
            SET_FIELD => {
                // One whole OXM after type and length, padded to 8 as short as possible.
                let oxm_len = usize::from(tlv.get(7).copied().unwrap_or(0));
                if 8 + oxm_len > tlv.len() {
                    return Err(DecodeError::Truncated);
                }
                if padded8(8 + oxm_len) != tlv.len() {
                    return Err(DecodeError::BadLength);
                }
            }
            // Experimenter (its id fits in any 8-byte TLV) and unknown types: raw bodies.
            _ => {}
        }
    }
    Ok(())
}

/// A list of instructions filling `list`, with `Instruction::decode`'s checks.
#[inline]
fn check_instructions(list: &[u8]) -> Result<(), DecodeError> {
    use instruction_type::*;
    let mut c = Cur(list);
    while !c.0.is_empty() {
        let (typ, tlv) = take_tlv8(&mut c)?;
        match typ {
            GOTO_TABLE | CLEAR_ACTIONS | METER => fixed_len(tlv, 8)?,
            WRITE_METADATA => fixed_len(tlv, 24)?,
            WRITE_ACTIONS | APPLY_ACTIONS => check_actions(tlv.get(8..).unwrap_or(&[]))?,
            _ => {}
        }
    }
    Ok(())
}

/// One OXM TLV of a checked frame: header and payload (§7.2.3.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OxmRef<'a> {
    tlv: &'a [u8],
}

impl<'a> OxmRef<'a> {
    /// `oxm_class`.
    #[inline]
    pub fn class(&self) -> u16 {
        be16(self.tlv, 0)
    }
    /// `oxm_field` (7 bits).
    #[inline]
    pub fn field(&self) -> u8 {
        self.tlv.get(2).copied().unwrap_or(0) >> 1
    }
    /// `oxm_hasmask`.
    #[inline]
    pub fn has_mask(&self) -> bool {
        self.tlv.get(2).copied().unwrap_or(0) & 1 != 0
    }
    /// The payload: the value, then the mask if `has_mask`.
    #[inline]
    pub fn payload(&self) -> &'a [u8] {
        self.tlv.get(4..).unwrap_or(&[])
    }
    /// The whole TLV as on the wire.
    #[inline]
    pub fn as_bytes(&self) -> &'a [u8] {
        self.tlv
    }
    /// Whether [`crate::decode`] gives this TLV a typed [`Oxm`] variant (a basic-class
    /// field with the length and mask §7.2.3.7 allows) rather than [`Oxm::Raw`].
    #[inline]
    pub fn is_typed(&self) -> bool {
        self.class() == class::OPENFLOW_BASIC
            && basic_shape(self.field()).is_some_and(|(n, maskable)| {
                let len = self.payload().len();
                if self.has_mask() {
                    maskable && len == 2 * n
                } else {
                    len == n
                }
            })
    }
    /// Value and mask of basic field `field` (`ofb::*`), `N` bytes each, when `decode`
    /// types this TLV as that field (so a TLV of the right field with a length the spec
    /// does not allow, which `decode` keeps raw, is `None`).
    #[inline]
    pub fn basic<const N: usize>(&self, field: u8) -> Option<([u8; N], Option<[u8; N]>)> {
        if self.field() != field || !self.is_typed() {
            return None;
        }
        let p = self.payload();
        let value = p.get(..N)?.try_into().ok()?;
        let mask = if self.has_mask() {
            Some(p.get(N..2 * N)?.try_into().ok()?)
        } else {
            None
        };
        Some((value, mask))
    }
    /// The owned OXM `decode` yields for this TLV (allocates: for tests and cold paths).
    #[inline]
    pub fn to_oxm(&self) -> Result<Oxm, DecodeError> {
        Oxm::decode(&mut Reader::new(&Bytes::copy_from_slice(self.tlv)))
    }
}

/// The OXM TLVs of a checked match, in order.
#[derive(Debug, Clone, Default)]
pub struct OxmIter<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for OxmIter<'a> {
    type Item = OxmRef<'a>;
    #[inline]
    fn next(&mut self) -> Option<OxmRef<'a>> {
        let len = 4 + usize::from(*self.rest.get(3)?);
        let Some(tlv) = self.rest.get(..len) else {
            self.rest = &[];
            return None;
        };
        self.rest = self.rest.get(len..).unwrap_or(&[]);
        Some(OxmRef { tlv })
    }
}

/// Splits the next 8-aligned TLV (action or instruction) off `rest`; stops on garbage.
#[inline]
fn next_tlv8<'a>(rest: &mut &'a [u8]) -> Option<&'a [u8]> {
    let len = usize::from(be16(rest, 2));
    match (len >= 8).then(|| rest.get(..len)).flatten() {
        Some(tlv) => {
            *rest = rest.get(len..).unwrap_or(&[]);
            Some(tlv)
        }
        None => {
            *rest = &[];
            None
        }
    }
}

/// One action of a checked frame (§7.2.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ActionRef<'a> {
    tlv: &'a [u8],
}

impl<'a> ActionRef<'a> {
    /// `type` (`action_type::*`).
    #[inline]
    pub fn typ(&self) -> u16 {
        be16(self.tlv, 0)
    }
    /// The whole TLV as on the wire.
    #[inline]
    pub fn as_bytes(&self) -> &'a [u8] {
        self.tlv
    }
    /// OFPAT_OUTPUT's port and max_len.
    #[inline]
    pub fn output(&self) -> Option<(u32, u16)> {
        (self.typ() == action_type::OUTPUT).then(|| (be32(self.tlv, 4), be16(self.tlv, 8)))
    }
    /// OFPAT_SET_FIELD's OXM, whatever it is.
    #[inline]
    pub fn set_field(&self) -> Option<OxmRef<'a>> {
        if self.typ() != action_type::SET_FIELD {
            return None;
        }
        let len = 4 + usize::from(*self.tlv.get(7)?);
        Some(OxmRef {
            tlv: self.tlv.get(4..4 + len)?,
        })
    }
    /// The value of a SET_FIELD of basic field `field` that `decode` types, i.e.
    /// `Action::SetField` of that typed field (a masked one is kept raw, §7.2.5).
    #[inline]
    pub fn set_field_basic<const N: usize>(&self, field: u8) -> Option<[u8; N]> {
        match self.set_field()?.basic::<N>(field)? {
            (v, None) => Some(v),
            (_, Some(_)) => None,
        }
    }
    /// The owned action `decode` yields (allocates: for tests and cold paths).
    #[inline]
    pub fn to_action(&self) -> Result<Action, DecodeError> {
        Action::decode(&mut Reader::new(&Bytes::copy_from_slice(self.tlv)))
    }
}

/// The actions of a checked list, in order.
#[derive(Debug, Clone, Default)]
pub struct ActionIter<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for ActionIter<'a> {
    type Item = ActionRef<'a>;
    #[inline]
    fn next(&mut self) -> Option<ActionRef<'a>> {
        next_tlv8(&mut self.rest).map(|tlv| ActionRef { tlv })
    }
}

/// One instruction of a checked FLOW_MOD (§7.2.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InstructionRef<'a> {
    tlv: &'a [u8],
}

impl<'a> InstructionRef<'a> {
    /// `type` (`instruction_type::*`).
    #[inline]
    pub fn typ(&self) -> u16 {
        be16(self.tlv, 0)
    }
    /// The whole TLV as on the wire.
    #[inline]
    pub fn as_bytes(&self) -> &'a [u8] {
        self.tlv
    }
    /// The actions of OFPIT_APPLY_ACTIONS or OFPIT_WRITE_ACTIONS.
    #[inline]
    pub fn actions(&self) -> Option<ActionIter<'a>> {
        matches!(
            self.typ(),
            instruction_type::APPLY_ACTIONS | instruction_type::WRITE_ACTIONS
        )
        .then(|| ActionIter {
            rest: self.tlv.get(8..).unwrap_or(&[]),
        })
    }
    /// The owned instruction `decode` yields (allocates: for tests and cold paths).
    #[inline]
    pub fn to_instruction(&self) -> Result<Instruction, DecodeError> {
        Instruction::decode(&mut Reader::new(&Bytes::copy_from_slice(self.tlv)))
    }
}

/// The instructions of a checked FLOW_MOD, in order.
#[derive(Debug, Clone, Default)]
pub struct InstructionIter<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for InstructionIter<'a> {
    type Item = InstructionRef<'a>;
    #[inline]
    fn next(&mut self) -> Option<InstructionRef<'a>> {
        next_tlv8(&mut self.rest).map(|tlv| InstructionRef { tlv })
    }
}

/// The actions of every apply- and write-actions instruction of a FLOW_MOD, in wire order.
#[derive(Debug, Clone, Default)]
pub struct RuleActions<'a> {
    instructions: InstructionIter<'a>,
    current: ActionIter<'a>,
}

impl<'a> Iterator for RuleActions<'a> {
    type Item = ActionRef<'a>;
    #[inline]
    fn next(&mut self) -> Option<ActionRef<'a>> {
        loop {
            if let Some(a) = self.current.next() {
                return Some(a);
            }
            self.current = self.instructions.next()?.actions().unwrap_or_default();
        }
    }
}

/// A checked OFPT_FLOW_MOD frame (§7.3.4.1).
#[derive(Debug, Clone, Copy)]
pub struct FlowModView<'a> {
    frame: &'a [u8],
    fields: &'a [u8],
    instructions: &'a [u8],
}

impl<'a> FlowModView<'a> {
    /// Check a whole frame (as [`crate::Framer`] yields) as [`crate::decode`] would.
    #[inline]
    pub fn new(frame: &'a [u8]) -> Result<Self, DecodeError> {
        let (fields, instructions) = fixed_then_match(frame, MsgType::FlowMod)?;
        check_instructions(instructions)?;
        Ok(FlowModView {
            frame,
            fields,
            instructions,
        })
    }
    /// The header's xid.
    #[inline]
    pub fn xid(&self) -> u32 {
        be32(self.frame, 4)
    }
    /// `cookie`.
    #[inline]
    pub fn cookie(&self) -> u64 {
        be64(self.frame, 8)
    }
    /// `cookie_mask`.
    #[inline]
    pub fn cookie_mask(&self) -> u64 {
        be64(self.frame, 16)
    }
    /// `table_id`.
    #[inline]
    pub fn table_id(&self) -> u8 {
        self.frame.get(24).copied().unwrap_or(0)
    }
    /// `command`.
    #[inline]
    pub fn command(&self) -> FlowModCommand {
        FlowModCommand::from_raw(self.frame.get(25).copied().unwrap_or(0))
    }
    /// `idle_timeout`.
    #[inline]
    pub fn idle_timeout(&self) -> u16 {
        be16(self.frame, 26)
    }
    /// `hard_timeout`.
    #[inline]
    pub fn hard_timeout(&self) -> u16 {
        be16(self.frame, 28)
    }
    /// `priority`.
    #[inline]
    pub fn priority(&self) -> u16 {
        be16(self.frame, 30)
    }
    /// `buffer_id`.
    #[inline]
    pub fn buffer_id(&self) -> u32 {
        be32(self.frame, 32)
    }
    /// `out_port`.
    #[inline]
    pub fn out_port(&self) -> u32 {
        be32(self.frame, 36)
    }
    /// `out_group`.
    #[inline]
    pub fn out_group(&self) -> u32 {
        be32(self.frame, 40)
    }
    /// `flags`.
    #[inline]
    pub fn flags(&self) -> FlowModFlags {
        FlowModFlags(be16(self.frame, 44))
    }
    /// Every field but the match and the instructions.
    #[inline]
    pub fn fixed(&self) -> FlowModFixed {
        FlowModFixed {
            cookie: self.cookie(),
            cookie_mask: self.cookie_mask(),
            table_id: self.table_id(),
            command: self.command(),
            idle_timeout: self.idle_timeout(),
            hard_timeout: self.hard_timeout(),
            priority: self.priority(),
            buffer_id: self.buffer_id(),
            out_port: self.out_port(),
            out_group: self.out_group(),
            flags: self.flags(),
        }
    }
    /// The match's OXM TLVs, in order.
    #[inline]
    pub fn match_fields(&self) -> OxmIter<'a> {
        OxmIter { rest: self.fields }
    }
    /// The instructions, in order.
    #[inline]
    pub fn instructions(&self) -> InstructionIter<'a> {
        InstructionIter {
            rest: self.instructions,
        }
    }
    /// The actions of the apply- and write-actions instructions, in wire order (a rule
    /// has usually one apply-actions list).
    #[inline]
    pub fn actions(&self) -> RuleActions<'a> {
        RuleActions {
            instructions: self.instructions(),
            current: ActionIter::default(),
        }
    }
}

/// A checked OFPT_PACKET_OUT frame (§7.3.7).
#[derive(Debug, Clone, Copy)]
pub struct PacketOutView<'a> {
    frame: &'a [u8],
    actions: &'a [u8],
    data: &'a [u8],
}

impl<'a> PacketOutView<'a> {
    /// Check a whole frame (as [`crate::Framer`] yields) as [`crate::decode`] would.
    #[inline]
    pub fn new(frame: &'a [u8]) -> Result<Self, DecodeError> {
        let mut c = Cur(body_of(frame, MsgType::PacketOut)?);
        // buffer_id, in_port, actions_len, 6 bytes of padding.
        let fixed = c.take(16)?;
        let actions = c.take(usize::from(be16(fixed, 8)))?;
        check_actions(actions)?;
        Ok(PacketOutView {
            frame,
            actions,
            data: c.0,
        })
    }
    /// The header's xid.
    #[inline]
    pub fn xid(&self) -> u32 {
        be32(self.frame, 4)
    }
    /// `buffer_id`.
    #[inline]
    pub fn buffer_id(&self) -> u32 {
        be32(self.frame, 8)
    }
    /// `in_port`.
    #[inline]
    pub fn in_port(&self) -> u32 {
        be32(self.frame, 12)
    }
    /// The actions, in order.
    #[inline]
    pub fn actions(&self) -> ActionIter<'a> {
        ActionIter { rest: self.actions }
    }
    /// The packet (when `buffer_id` is NO_BUFFER).
    #[inline]
    pub fn data(&self) -> &'a [u8] {
        self.data
    }
}

/// A checked OFPT_FLOW_REMOVED frame (§7.4.2): what a controller reads of each rule the
/// switch reports gone, one or two per connection, as often as connections start.
#[derive(Debug, Clone, Copy)]
pub struct FlowRemovedView<'a> {
    frame: &'a [u8],
    fields: &'a [u8],
}

impl<'a> FlowRemovedView<'a> {
    /// Check a whole frame (as [`crate::Framer`] yields) as [`crate::decode`] would.
    #[inline]
    pub fn new(frame: &'a [u8]) -> Result<Self, DecodeError> {
        let (fields, rest) = fixed_then_match(frame, MsgType::FlowRemoved)?;
        // `decode`: every byte the header claims belongs to the message.
        if !rest.is_empty() {
            return Err(DecodeError::BadLength);
        }
        Ok(FlowRemovedView { frame, fields })
    }
    /// The header's xid.
    #[inline]
    pub fn xid(&self) -> u32 {
        be32(self.frame, 4)
    }
    /// `cookie`.
    #[inline]
    pub fn cookie(&self) -> u64 {
        be64(self.frame, 8)
    }
    /// `priority`.
    #[inline]
    pub fn priority(&self) -> u16 {
        be16(self.frame, 16)
    }
    /// `reason`.
    #[inline]
    pub fn reason(&self) -> FlowRemovedReason {
        FlowRemovedReason::from_raw(self.frame.get(18).copied().unwrap_or(0))
    }
    /// `table_id`.
    #[inline]
    pub fn table_id(&self) -> u8 {
        self.frame.get(19).copied().unwrap_or(0)
    }
    /// `duration_sec`.
    #[inline]
    pub fn duration_sec(&self) -> u32 {
        be32(self.frame, 20)
    }
    /// `duration_nsec`.
    #[inline]
    pub fn duration_nsec(&self) -> u32 {
        be32(self.frame, 24)
    }
    /// `idle_timeout`.
    #[inline]
    pub fn idle_timeout(&self) -> u16 {
        be16(self.frame, 28)
    }
    /// `hard_timeout`.
    #[inline]
    pub fn hard_timeout(&self) -> u16 {
        be16(self.frame, 30)
    }
    /// `packet_count`.
    #[inline]
    pub fn packet_count(&self) -> u64 {
        be64(self.frame, 32)
    }
    /// `byte_count`.
    #[inline]
    pub fn byte_count(&self) -> u64 {
        be64(self.frame, 40)
    }
    /// The match's OXM TLVs, in order.
    #[inline]
    pub fn match_fields(&self) -> OxmIter<'a> {
        OxmIter { rest: self.fields }
    }
}

/// A checked OFPT_PACKET_IN frame (§7.4.1): what a controller reads of each packet a
/// switch sends up (for one that answers without building the owned message).
#[derive(Debug, Clone, Copy)]
pub struct PacketInView<'a> {
    frame: &'a [u8],
    fields: &'a [u8],
    data: &'a [u8],
}

impl<'a> PacketInView<'a> {
    /// Check a whole frame (as [`crate::Framer`] yields) as [`crate::decode`] would.
    #[inline]
    pub fn new(frame: &'a [u8]) -> Result<Self, DecodeError> {
        let mut c = Cur(body_of(frame, MsgType::PacketIn)?);
        // buffer_id, total_len, reason, table_id, cookie.
        c.take(16)?;
        let fields = check_match(&mut c)?;
        // Two bytes of padding, then the packet.
        c.take(2)?;
        Ok(PacketInView {
            frame,
            fields,
            data: c.0,
        })
    }
    /// The header's xid.
    #[inline]
    pub fn xid(&self) -> u32 {
        be32(self.frame, 4)
    }
    /// `buffer_id`.
    #[inline]
    pub fn buffer_id(&self) -> u32 {
        be32(self.frame, 8)
    }
    /// `total_len`.
    #[inline]
    pub fn total_len(&self) -> u16 {
        be16(self.frame, 12)
    }
    /// `reason`.
    #[inline]
    pub fn reason(&self) -> PacketInReason {
        PacketInReason::from_raw(self.frame.get(14).copied().unwrap_or(0))
    }
    /// `table_id`.
    #[inline]
    pub fn table_id(&self) -> u8 {
        self.frame.get(15).copied().unwrap_or(0)
    }
    /// `cookie`.
    #[inline]
    pub fn cookie(&self) -> u64 {
        be64(self.frame, 16)
    }
    /// The match's OXM TLVs, in wire order.
    #[inline]
    pub fn match_fields(&self) -> OxmIter<'a> {
        OxmIter { rest: self.fields }
    }
    /// `in_port`: the first unmasked OXM_OF_IN_PORT of the match (§7.4.1: always there;
    /// `None` from a switch that left it out), as [`crate::PacketIn::in_port`] reads it.
    #[inline]
    pub fn in_port(&self) -> Option<u32> {
        self.match_fields()
            .find_map(|o| match o.basic::<4>(crate::oxm::ofb::IN_PORT) {
                Some((v, None)) => Some(u32::from_be_bytes(v)),
                _ => None,
            })
    }
    /// The packet (all of it when `buffer_id` is NO_BUFFER).
    #[inline]
    pub fn data(&self) -> &'a [u8] {
        self.data
    }
}

/// The packet an OFPT_PACKET_IN carries, found without decoding the rest (§7.4.1: after the
/// header, eight bytes of fixed fields and the cookie, the match padded to 8, two bytes of
/// padding, then the data). For a reader that needs only the packet, ahead of the
/// message's decoding: the controller's prefetch of a batch. Unlike [`crate::decode`] it
/// checks neither the match's OXMs nor the version; `None` if `frame` is not a PACKET_IN
/// or ends before its data.
pub fn packet_in_data(frame: &[u8]) -> Option<&[u8]> {
    if frame.get(1).copied() != Some(MsgType::PacketIn as u8) {
        return None;
    }
    // Header, buffer_id, total_len, reason, table_id, cookie: the match starts at 24.
    const MATCH_AT: usize = HEADER_LEN + 16;
    let match_len = usize::from(be16(frame, MATCH_AT + 2));
    if match_len < 4 {
        return None;
    }
    frame.get(MATCH_AT + padded8(match_len) + 2..)
}
