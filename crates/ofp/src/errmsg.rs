//! OFPT_ERROR types and codes by name (§7.4.4). Unknown codes are kept numerically.

use bytes::{BufMut, Bytes, BytesMut};

use crate::error::{DecodeError, EncodeError};
use crate::wire::Reader;

macro_rules! codes {
    ($(#[$doc:meta])* $name:ident { $($variant:ident = $val:literal => $s:literal,)* }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[cfg_attr(feature = "serde", derive(serde::Serialize))]
        pub enum $name {
            $(
                #[doc = $s]
                $variant,
            )*
            /// A code this version does not name.
            Other(u16),
        }
        impl $name {
            /// From the wire value.
            pub fn from_u16(v: u16) -> Self {
                match v { $($val => Self::$variant,)* o => Self::Other(o) }
            }
            /// To the wire value.
            pub fn to_u16(self) -> u16 {
                match self { $(Self::$variant => $val,)* Self::Other(o) => o }
            }
            /// The spec's name, e.g. `OFPBRC_BAD_TYPE`.
            pub fn name(self) -> Option<&'static str> {
                match self { $(Self::$variant => Some($s),)* Self::Other(_) => None }
            }
        }
    };
}

codes!(/// OFPET_HELLO_FAILED codes.
HelloFailedCode { Incompatible = 0 => "OFPHFC_INCOMPATIBLE", Eperm = 1 => "OFPHFC_EPERM", });
codes!(/// OFPET_BAD_REQUEST codes.
BadRequestCode {
    BadVersion = 0 => "OFPBRC_BAD_VERSION", BadType = 1 => "OFPBRC_BAD_TYPE",
    BadMultipart = 2 => "OFPBRC_BAD_MULTIPART", BadExperimenter = 3 => "OFPBRC_BAD_EXPERIMENTER",
    BadExpType = 4 => "OFPBRC_BAD_EXP_TYPE", Eperm = 5 => "OFPBRC_EPERM", BadLen = 6 => "OFPBRC_BAD_LEN",
    BufferEmpty = 7 => "OFPBRC_BUFFER_EMPTY", BufferUnknown = 8 => "OFPBRC_BUFFER_UNKNOWN",
    BadTableId = 9 => "OFPBRC_BAD_TABLE_ID", IsSlave = 10 => "OFPBRC_IS_SLAVE", BadPort = 11 => "OFPBRC_BAD_PORT",
    BadPacket = 12 => "OFPBRC_BAD_PACKET", MultipartBufferOverflow = 13 => "OFPBRC_MULTIPART_BUFFER_OVERFLOW",
});
codes!(/// OFPET_BAD_ACTION codes.
BadActionCode {
    BadType = 0 => "OFPBAC_BAD_TYPE", BadLen = 1 => "OFPBAC_BAD_LEN", BadExperimenter = 2 => "OFPBAC_BAD_EXPERIMENTER",
    BadExpType = 3 => "OFPBAC_BAD_EXP_TYPE", BadOutPort = 4 => "OFPBAC_BAD_OUT_PORT", BadArgument = 5 => "OFPBAC_BAD_ARGUMENT",
    Eperm = 6 => "OFPBAC_EPERM", TooMany = 7 => "OFPBAC_TOO_MANY", BadQueue = 8 => "OFPBAC_BAD_QUEUE",
    BadOutGroup = 9 => "OFPBAC_BAD_OUT_GROUP", MatchInconsistent = 10 => "OFPBAC_MATCH_INCONSISTENT",
    UnsupportedOrder = 11 => "OFPBAC_UNSUPPORTED_ORDER", BadTag = 12 => "OFPBAC_BAD_TAG",
    BadSetType = 13 => "OFPBAC_BAD_SET_TYPE", BadSetLen = 14 => "OFPBAC_BAD_SET_LEN", BadSetArgument = 15 => "OFPBAC_BAD_SET_ARGUMENT",
});
codes!(/// OFPET_BAD_INSTRUCTION codes.
BadInstructionCode {
    UnknownInst = 0 => "OFPBIC_UNKNOWN_INST", UnsupInst = 1 => "OFPBIC_UNSUP_INST", BadTableId = 2 => "OFPBIC_BAD_TABLE_ID",
    UnsupMetadata = 3 => "OFPBIC_UNSUP_METADATA", UnsupMetadataMask = 4 => "OFPBIC_UNSUP_METADATA_MASK",
    BadExperimenter = 5 => "OFPBIC_BAD_EXPERIMENTER", BadExpType = 6 => "OFPBIC_BAD_EXP_TYPE", BadLen = 7 => "OFPBIC_BAD_LEN",
    Eperm = 8 => "OFPBIC_EPERM",
});
codes!(/// OFPET_BAD_MATCH codes.
BadMatchCode {
    BadType = 0 => "OFPBMC_BAD_TYPE", BadLen = 1 => "OFPBMC_BAD_LEN", BadTag = 2 => "OFPBMC_BAD_TAG",
    BadDlAddrMask = 3 => "OFPBMC_BAD_DL_ADDR_MASK", BadNwAddrMask = 4 => "OFPBMC_BAD_NW_ADDR_MASK",
    BadWildcards = 5 => "OFPBMC_BAD_WILDCARDS", BadField = 6 => "OFPBMC_BAD_FIELD", BadValue = 7 => "OFPBMC_BAD_VALUE",
    BadMask = 8 => "OFPBMC_BAD_MASK", BadPrereq = 9 => "OFPBMC_BAD_PREREQ", DupField = 10 => "OFPBMC_DUP_FIELD",
    Eperm = 11 => "OFPBMC_EPERM",
});
codes!(/// OFPET_FLOW_MOD_FAILED codes.
FlowModFailedCode {
    Unknown = 0 => "OFPFMFC_UNKNOWN", TableFull = 1 => "OFPFMFC_TABLE_FULL", BadTableId = 2 => "OFPFMFC_BAD_TABLE_ID",
    Overlap = 3 => "OFPFMFC_OVERLAP", Eperm = 4 => "OFPFMFC_EPERM", BadTimeout = 5 => "OFPFMFC_BAD_TIMEOUT",
    BadCommand = 6 => "OFPFMFC_BAD_COMMAND", BadFlags = 7 => "OFPFMFC_BAD_FLAGS",
});
codes!(/// OFPET_GROUP_MOD_FAILED codes.
GroupModFailedCode {
    GroupExists = 0 => "OFPGMFC_GROUP_EXISTS", InvalidGroup = 1 => "OFPGMFC_INVALID_GROUP",
    WeightUnsupported = 2 => "OFPGMFC_WEIGHT_UNSUPPORTED", OutOfGroups = 3 => "OFPGMFC_OUT_OF_GROUPS",
    OutOfBuckets = 4 => "OFPGMFC_OUT_OF_BUCKETS", ChainingUnsupported = 5 => "OFPGMFC_CHAINING_UNSUPPORTED",
    WatchUnsupported = 6 => "OFPGMFC_WATCH_UNSUPPORTED", Loop = 7 => "OFPGMFC_LOOP", UnknownGroup = 8 => "OFPGMFC_UNKNOWN_GROUP",
    ChainedGroup = 9 => "OFPGMFC_CHAINED_GROUP", BadType = 10 => "OFPGMFC_BAD_TYPE", BadCommand = 11 => "OFPGMFC_BAD_COMMAND",
    BadBucket = 12 => "OFPGMFC_BAD_BUCKET", BadWatch = 13 => "OFPGMFC_BAD_WATCH", Eperm = 14 => "OFPGMFC_EPERM",
});
codes!(/// OFPET_PORT_MOD_FAILED codes.
PortModFailedCode {
    BadPort = 0 => "OFPPMFC_BAD_PORT", BadHwAddr = 1 => "OFPPMFC_BAD_HW_ADDR", BadConfig = 2 => "OFPPMFC_BAD_CONFIG",
    BadAdvertise = 3 => "OFPPMFC_BAD_ADVERTISE", Eperm = 4 => "OFPPMFC_EPERM",
});
codes!(/// OFPET_TABLE_MOD_FAILED codes.
TableModFailedCode { BadTable = 0 => "OFPTMFC_BAD_TABLE", BadConfig = 1 => "OFPTMFC_BAD_CONFIG", Eperm = 2 => "OFPTMFC_EPERM", });
codes!(/// OFPET_QUEUE_OP_FAILED codes.
QueueOpFailedCode { BadPort = 0 => "OFPQOFC_BAD_PORT", BadQueue = 1 => "OFPQOFC_BAD_QUEUE", Eperm = 2 => "OFPQOFC_EPERM", });
codes!(/// OFPET_SWITCH_CONFIG_FAILED codes.
SwitchConfigFailedCode { BadFlags = 0 => "OFPSCFC_BAD_FLAGS", BadLen = 1 => "OFPSCFC_BAD_LEN", Eperm = 2 => "OFPSCFC_EPERM", });
codes!(/// OFPET_ROLE_REQUEST_FAILED codes.
RoleRequestFailedCode { Stale = 0 => "OFPRRFC_STALE", Unsup = 1 => "OFPRRFC_UNSUP", BadRole = 2 => "OFPRRFC_BAD_ROLE", });
codes!(/// OFPET_METER_MOD_FAILED codes.
MeterModFailedCode {
    Unknown = 0 => "OFPMMFC_UNKNOWN", MeterExists = 1 => "OFPMMFC_METER_EXISTS", InvalidMeter = 2 => "OFPMMFC_INVALID_METER",
    UnknownMeter = 3 => "OFPMMFC_UNKNOWN_METER", BadCommand = 4 => "OFPMMFC_BAD_COMMAND", BadFlags = 5 => "OFPMMFC_BAD_FLAGS",
    BadRate = 6 => "OFPMMFC_BAD_RATE", BadBurst = 7 => "OFPMMFC_BAD_BURST", BadBand = 8 => "OFPMMFC_BAD_BAND",
    BadBandValue = 9 => "OFPMMFC_BAD_BAND_VALUE", OutOfMeters = 10 => "OFPMMFC_OUT_OF_METERS", OutOfBands = 11 => "OFPMMFC_OUT_OF_BANDS",
});
codes!(/// OFPET_TABLE_FEATURES_FAILED codes.
TableFeaturesFailedCode {
    BadTable = 0 => "OFPTFFC_BAD_TABLE", BadMetadata = 1 => "OFPTFFC_BAD_METADATA", BadType = 2 => "OFPTFFC_BAD_TYPE",
    BadLen = 3 => "OFPTFFC_BAD_LEN", BadArgument = 4 => "OFPTFFC_BAD_ARGUMENT", Eperm = 5 => "OFPTFFC_EPERM",
});

/// `OFPET_EXPERIMENTER`.
pub const OFPET_EXPERIMENTER: u16 = 0xffff;

/// Error type and code (§7.4.4, `enum ofp_error_type`).
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum ErrorKind {
    HelloFailed(HelloFailedCode),
    BadRequest(BadRequestCode),
    BadAction(BadActionCode),
    BadInstruction(BadInstructionCode),
    BadMatch(BadMatchCode),
    FlowModFailed(FlowModFailedCode),
    GroupModFailed(GroupModFailedCode),
    PortModFailed(PortModFailedCode),
    TableModFailed(TableModFailedCode),
    QueueOpFailed(QueueOpFailedCode),
    SwitchConfigFailed(SwitchConfigFailedCode),
    RoleRequestFailed(RoleRequestFailedCode),
    MeterModFailed(MeterModFailedCode),
    TableFeaturesFailed(TableFeaturesFailedCode),
    /// OFPET_EXPERIMENTER (`struct ofp_error_experimenter_msg`).
    Experimenter {
        exp_type: u16,
        experimenter: u32,
    },
    /// A type this version does not define.
    Other {
        typ: u16,
        code: u16,
    },
}

impl ErrorKind {
    /// From wire type and code (not for OFPET_EXPERIMENTER).
    pub fn from_type_code(typ: u16, code: u16) -> Self {
        use ErrorKind::*;
        match typ {
            0 => HelloFailed(HelloFailedCode::from_u16(code)),
            1 => BadRequest(BadRequestCode::from_u16(code)),
            2 => BadAction(BadActionCode::from_u16(code)),
            3 => BadInstruction(BadInstructionCode::from_u16(code)),
            4 => BadMatch(BadMatchCode::from_u16(code)),
            5 => FlowModFailed(FlowModFailedCode::from_u16(code)),
            6 => GroupModFailed(GroupModFailedCode::from_u16(code)),
            7 => PortModFailed(PortModFailedCode::from_u16(code)),
            8 => TableModFailed(TableModFailedCode::from_u16(code)),
            9 => QueueOpFailed(QueueOpFailedCode::from_u16(code)),
            10 => SwitchConfigFailed(SwitchConfigFailedCode::from_u16(code)),
            11 => RoleRequestFailed(RoleRequestFailedCode::from_u16(code)),
            12 => MeterModFailed(MeterModFailedCode::from_u16(code)),
            13 => TableFeaturesFailed(TableFeaturesFailedCode::from_u16(code)),
            _ => Other { typ, code },
        }
    }
    /// Wire type and code (for Experimenter: 0xffff and exp_type).
    pub fn type_code(&self) -> (u16, u16) {
        use ErrorKind::*;
        match *self {
            HelloFailed(c) => (0, c.to_u16()),
            BadRequest(c) => (1, c.to_u16()),
            BadAction(c) => (2, c.to_u16()),
            BadInstruction(c) => (3, c.to_u16()),
            BadMatch(c) => (4, c.to_u16()),
            FlowModFailed(c) => (5, c.to_u16()),
            GroupModFailed(c) => (6, c.to_u16()),
            PortModFailed(c) => (7, c.to_u16()),
            TableModFailed(c) => (8, c.to_u16()),
            QueueOpFailed(c) => (9, c.to_u16()),
            SwitchConfigFailed(c) => (10, c.to_u16()),
            RoleRequestFailed(c) => (11, c.to_u16()),
            MeterModFailed(c) => (12, c.to_u16()),
            TableFeaturesFailed(c) => (13, c.to_u16()),
            Experimenter { exp_type, .. } => (OFPET_EXPERIMENTER, exp_type),
            Other { typ, code } => (typ, code),
        }
    }
    /// The spec's type name, e.g. `OFPET_BAD_MATCH`.
    pub fn type_name(&self) -> Option<&'static str> {
        const N: [&str; 14] = [
            "OFPET_HELLO_FAILED",
            "OFPET_BAD_REQUEST",
            "OFPET_BAD_ACTION",
            "OFPET_BAD_INSTRUCTION",
            "OFPET_BAD_MATCH",
            "OFPET_FLOW_MOD_FAILED",
            "OFPET_GROUP_MOD_FAILED",
            "OFPET_PORT_MOD_FAILED",
            "OFPET_TABLE_MOD_FAILED",
            "OFPET_QUEUE_OP_FAILED",
            "OFPET_SWITCH_CONFIG_FAILED",
            "OFPET_ROLE_REQUEST_FAILED",
            "OFPET_METER_MOD_FAILED",
            "OFPET_TABLE_FEATURES_FAILED",
        ];
        match self {
            ErrorKind::Experimenter { .. } => Some("OFPET_EXPERIMENTER"),
            ErrorKind::Other { .. } => None,
            _ => N.get(usize::from(self.type_code().0)).copied(),
        }
    }
    /// The spec's code name, e.g. `OFPBMC_BAD_PREREQ`.
    pub fn code_name(&self) -> Option<&'static str> {
        use ErrorKind::*;
        match *self {
            HelloFailed(c) => c.name(),
            BadRequest(c) => c.name(),
            BadAction(c) => c.name(),
            BadInstruction(c) => c.name(),
            BadMatch(c) => c.name(),
            FlowModFailed(c) => c.name(),
            GroupModFailed(c) => c.name(),
            PortModFailed(c) => c.name(),
            TableModFailed(c) => c.name(),
            QueueOpFailed(c) => c.name(),
            SwitchConfigFailed(c) => c.name(),
            RoleRequestFailed(c) => c.name(),
            MeterModFailed(c) => c.name(),
            TableFeaturesFailed(c) => c.name(),
            Experimenter { .. } | Other { .. } => None,
        }
    }
}

impl ErrorKind {
    /// The error that answers a message that does not decode (§7.4.4), by why it does not:
    ///
    /// - a version other than 0x04: OFPBRC_BAD_VERSION, "ofp_header.version not
    ///   supported";
    /// - a type OpenFlow 1.3 does not define: OFPBRC_BAD_TYPE, "ofp_header.type not
    ///   supported";
    /// - a length that does not fit the type (too short for its fixed part or a field,
    ///   not a multiple of 8 where it must be, bytes left over): OFPBRC_BAD_LEN, "Wrong
    ///   request length for type";
    /// - a match whose type is not OXM: OFPET_BAD_MATCH / OFPBMC_BAD_TYPE, "Unsupported
    ///   match type specified by the match";
    /// - a SET_FIELD's OXM that cannot be represented: OFPET_BAD_ACTION /
    ///   OFPBAC_BAD_SET_ARGUMENT, "Bad argument in SET_FIELD action";
    /// - a frame read as another type than its header's (a view given the wrong frame, not
    ///   the peer's fault, but the type is what does not fit): OFPBRC_BAD_TYPE;
    /// - any other bad value (none today; a fallback for one added later): OFPBRC_BAD_LEN,
    ///   since OFPET_BAD_REQUEST has no code for a bad value and "wrong length for type"
    ///   is the nearest to "does not parse as its type".
    ///
    /// No decode error means OFPBRC_BAD_MULTIPART or OFPBRC_BAD_EXPERIMENTER /
    /// BAD_EXP_TYPE: the codec keeps unknown multipart types and experimenter messages
    /// whole and opaque ([`crate::MultipartReplyBody::Unknown`], [`crate::Experimenter`]),
    /// so they decode; whether to refuse them is the reader's choice, not a decode error.
    pub fn of_decode_error(e: DecodeError) -> ErrorKind {
        match e {
            DecodeError::BadVersion(_) => ErrorKind::BadRequest(BadRequestCode::BadVersion),
            DecodeError::UnknownType(_) => ErrorKind::BadRequest(BadRequestCode::BadType),
            DecodeError::Truncated | DecodeError::BadLength | DecodeError::TrailingBytes => {
                ErrorKind::BadRequest(BadRequestCode::BadLen)
            }
            DecodeError::BadValue { what } => match what {
                MATCH_TYPE => ErrorKind::BadMatch(BadMatchCode::BadType),
                SET_FIELD_OXM => ErrorKind::BadAction(BadActionCode::BadSetArgument),
                MESSAGE_TYPE => ErrorKind::BadRequest(BadRequestCode::BadType),
                _ => ErrorKind::BadRequest(BadRequestCode::BadLen),
            },
        }
    }
}

// The `what`s of the codec's `DecodeError::BadValue`s (oxm.rs and view.rs, action.rs, view.rs),
// tied to them by the tests below, which decode real frames.
/// The `what` of [`DecodeError::BadValue`] for a match whose type is not OFPMT_OXM.
const MATCH_TYPE: &str = "match type";
/// The `what` of [`DecodeError::BadValue`] for a SET_FIELD OXM that does not re-encode.
const SET_FIELD_OXM: &str = "set_field oxm";
/// The `what` of [`DecodeError::BadValue`] for a view given a frame of another type.
const MESSAGE_TYPE: &str = "message type";

/// How much of a failed request an OFPT_ERROR carries (§7.4.4: "at least 64 bytes of the
/// failed request"): the least, so that an answer never grows with what it answers.
pub const FAILED_REQUEST_BYTES: usize = 64;

/// OFPT_ERROR (§7.4.4). `data` is at least 64 bytes of the failed request, or ASCII text
/// for HELLO_FAILED.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct ErrorMsg {
    /// Type and code.
    pub kind: ErrorKind,
    /// Data.
    pub data: Bytes,
}

impl ErrorMsg {
    /// HELLO_FAILED / INCOMPATIBLE with an ASCII explanation (§6.3.1).
    pub fn hello_incompatible(text: &str) -> Self {
        ErrorMsg {
            kind: ErrorKind::HelloFailed(HelloFailedCode::Incompatible),
            data: Bytes::copy_from_slice(text.as_bytes()),
        }
    }

    /// The answer to a message that was framed whole (§7.1: its header's length arrived)
    /// but does not decode: the xid to send it with (the offending message's, §7.4.4:
    /// "the xid field of the header must match that of the offending message") and the
    /// error, whose data is the message's first [`FAILED_REQUEST_BYTES`] bytes, or all of
    /// it if shorter ("at least 64 bytes of the failed request ... if the failed request
    /// is shorter than 64 bytes it should be the full request without any padding").
    ///
    /// `None` for an OFPT_ERROR (type 1 in every version): an error is never answered with
    /// an error, as ICMP is never answered with ICMP (RFC 1122 §3.2.2), else two peers that
    /// cannot read each other's errors trade them for ever.
    pub fn answering(frame: &[u8], e: DecodeError) -> Option<(u32, ErrorMsg)> {
        if frame.get(1) == Some(&(crate::MsgType::Error as u8)) {
            return None;
        }
        let xid = frame
            .get(4..8)
            .and_then(|x| x.try_into().ok())
            .map_or(0, u32::from_be_bytes);
        let data = frame.get(..FAILED_REQUEST_BYTES).unwrap_or(frame);
        Some((
            xid,
            ErrorMsg {
                kind: ErrorKind::of_decode_error(e),
                data: Bytes::copy_from_slice(data),
            },
        ))
    }

    pub(crate) fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let typ = r.u16()?;
        let code = r.u16()?;
        let kind = if typ == OFPET_EXPERIMENTER {
            ErrorKind::Experimenter {
                exp_type: code,
                experimenter: r.u32()?,
            }
        } else {
            ErrorKind::from_type_code(typ, code)
        };
        Ok(ErrorMsg {
            kind,
            data: r.rest(),
        })
    }

    pub(crate) fn encode(&self, out: &mut BytesMut) -> Result<(), EncodeError> {
        let (t, c) = self.kind.type_code();
        out.put_u16(t);
        out.put_u16(c);
        if let ErrorKind::Experimenter { experimenter, .. } = self.kind {
            out.put_u32(experimenter);
        }
        out.put_slice(&self.data);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{FlowRemovedView, Message, PacketInView};

    fn header(version: u8, typ: u8, len: u16, xid: u32) -> Vec<u8> {
        let mut v = vec![version, typ];
        v.extend_from_slice(&len.to_be_bytes());
        v.extend_from_slice(&xid.to_be_bytes());
        v
    }

    /// A PACKET_IN (§7.4.1) with `match_type` and an empty match, and `data`.
    fn packet_in(match_type: u16, xid: u32, data: &[u8]) -> Vec<u8> {
        let len = 8 + 16 + 8 + 2 + data.len();
        let mut v = header(4, 10, len as u16, xid);
        v.extend_from_slice(&crate::NO_BUFFER.to_be_bytes());
        v.extend_from_slice(&(data.len() as u16).to_be_bytes());
        v.extend_from_slice(&[0, 0]);
        v.extend_from_slice(&u64::MAX.to_be_bytes());
        v.extend_from_slice(&match_type.to_be_bytes());
        v.extend_from_slice(&[0, 4, 0, 0, 0, 0]);
        v.extend_from_slice(&[0, 0]);
        v.extend_from_slice(data);
        v
    }

    /// Decodes `frame` (it must not decode) and answers it.
    fn answer(frame: &[u8]) -> (u32, ErrorMsg) {
        let e = crate::decode(Bytes::copy_from_slice(frame)).expect_err("must not decode");
        ErrorMsg::answering(frame, e).expect("answered")
    }

    #[test]
    fn an_unknown_type_is_bad_type_with_its_xid_and_the_whole_short_message() {
        let mut frame = header(4, 200, 12, 0xabcd_0001);
        frame.extend_from_slice(&[1, 2, 3, 4]);
        let (xid, err) = answer(&frame);
        assert_eq!(xid, 0xabcd_0001);
        assert_eq!(err.kind, ErrorKind::BadRequest(BadRequestCode::BadType));
        assert_eq!(err.kind.type_code(), (1, 1));
        assert_eq!(
            &err.data[..],
            &frame[..],
            "shorter than 64 bytes: all of it"
        );
    }

    #[test]
    fn another_version_is_bad_version() {
        // An ECHO_REQUEST of OpenFlow 1.0: only HELLO may carry another version (§6.3.1).
        let frame = header(1, 2, 8, 7);
        let (xid, err) = answer(&frame);
        assert_eq!(xid, 7);
        assert_eq!(err.kind, ErrorKind::BadRequest(BadRequestCode::BadVersion));
        assert_eq!(err.kind.type_code(), (1, 0));
    }

    #[test]
    fn a_length_that_does_not_fit_the_type_is_bad_len() {
        // A PACKET_IN with a 4-byte body (its fixed part is 16 before the match).
        let mut short = header(4, 10, 12, 9);
        short.extend_from_slice(&[0, 0, 0, 1]);
        assert_eq!(
            answer(&short).1.kind,
            ErrorKind::BadRequest(BadRequestCode::BadLen)
        );
        // The session reads PACKET_INs and FLOW_REMOVEDs through views: the same answer.
        let e = PacketInView::new(&short).expect_err("short");
        assert_eq!(
            ErrorKind::of_decode_error(e),
            ErrorKind::BadRequest(BadRequestCode::BadLen)
        );
        let mut short = header(4, 11, 12, 9);
        short.extend_from_slice(&[0, 0, 0, 1]);
        let e = FlowRemovedView::new(&short).expect_err("short");
        assert_eq!(
            ErrorKind::of_decode_error(e),
            ErrorKind::BadRequest(BadRequestCode::BadLen)
        );
        // A FEATURES_REQUEST has no body: bytes after the header are a wrong length.
        let mut long = header(4, 5, 12, 9);
        long.extend_from_slice(&[0; 4]);
        assert_eq!(
            answer(&long).1.kind,
            ErrorKind::BadRequest(BadRequestCode::BadLen)
        );
    }

    #[test]
    fn a_match_that_is_not_oxm_is_bad_match_type() {
        let frame = packet_in(0, 3, &[0; 14]);
        assert!(crate::decode(Bytes::from(packet_in(1, 3, &[0; 14]))).is_ok());
        assert_eq!(
            answer(&frame).1.kind,
            ErrorKind::BadMatch(BadMatchCode::BadType)
        );
        let e = PacketInView::new(&frame).expect_err("match type 0");
        assert_eq!(
            ErrorKind::of_decode_error(e),
            ErrorKind::BadMatch(BadMatchCode::BadType)
        );
    }

    #[test]
    fn a_frame_read_as_another_type_is_bad_type() {
        let frame = packet_in(1, 3, &[0; 14]);
        let e = FlowRemovedView::new(&frame).expect_err("a PACKET_IN");
        assert_eq!(
            ErrorKind::of_decode_error(e),
            ErrorKind::BadRequest(BadRequestCode::BadType)
        );
    }

    #[test]
    fn the_other_values_have_their_codes() {
        let kind = |what| ErrorKind::of_decode_error(DecodeError::BadValue { what });
        assert_eq!(
            kind("set_field oxm"),
            ErrorKind::BadAction(BadActionCode::BadSetArgument)
        );
        assert_eq!(
            kind("something new"),
            ErrorKind::BadRequest(BadRequestCode::BadLen)
        );
        assert_eq!(
            ErrorKind::of_decode_error(DecodeError::Truncated),
            ErrorKind::BadRequest(BadRequestCode::BadLen)
        );
    }

    #[test]
    fn a_long_message_gives_its_first_64_bytes() {
        // A PACKET_IN of 200 bytes with a match of type 0.
        let frame = packet_in(0, 0x55, &[0xee; 166]);
        assert_eq!(frame.len(), 200);
        let (xid, err) = answer(&frame);
        assert_eq!(xid, 0x55);
        assert_eq!(&err.data[..], &frame[..FAILED_REQUEST_BYTES]);
    }

    #[test]
    fn an_error_is_never_answered_with_an_error() {
        // An OFPT_ERROR shorter than its type and code.
        let mut frame = header(4, 1, 10, 4);
        frame.extend_from_slice(&[0, 1]);
        let e = crate::decode(Bytes::copy_from_slice(&frame)).expect_err("short");
        assert_eq!(ErrorMsg::answering(&frame, e), None);
        // Of another version too (type 1 is OFPT_ERROR in every version).
        let frame = header(1, 1, 8, 4);
        let e = crate::decode(Bytes::copy_from_slice(&frame)).expect_err("1.0");
        assert_eq!(ErrorMsg::answering(&frame, e), None);
    }

    #[test]
    fn the_answer_encodes_as_ofpt_error() {
        let frame = header(4, 99, 8, 0x0102_0304);
        let (xid, err) = answer(&frame);
        let mut out = BytesMut::new();
        crate::encode(xid, &Message::Error(err), &mut out).expect("encodes");
        let expected: Vec<u8> = [
            &header(4, 1, 12 + 8, 0x0102_0304)[..],
            &[0, 1, 0, 1],
            &frame[..],
        ]
        .concat();
        assert_eq!(&out[..], &expected[..]);
    }
}
