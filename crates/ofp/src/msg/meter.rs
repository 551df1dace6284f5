//! OFPT_METER_MOD (§7.3.4.4) and meter bands.

use bytes::{BufMut, Bytes, BytesMut};

use crate::error::{DecodeError, EncodeError};
use crate::wire::{LenMark, Reader};

value_enum!(/// `enum ofp_meter_mod_command`.
MeterModCommand: u16 {
    /// OFPMC_ADD.
    Add = 0,
    /// OFPMC_MODIFY.
    Modify = 1,
    /// OFPMC_DELETE.
    Delete = 2,
});

flags!(/// `enum ofp_meter_flags`.
MeterFlags: u16 {
    /// OFPMF_KBPS: rate in kb/s.
    KBPS = 1,
    /// OFPMF_PKTPS: rate in packets/s.
    PKTPS = 2,
    /// OFPMF_BURST: use burst_size.
    BURST = 4,
    /// OFPMF_STATS: collect statistics.
    STATS = 8,
});

/// A meter band (`struct ofp_meter_band_*`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum MeterBand {
    /// OFPMBT_DROP.
    Drop {
        /// Rate.
        rate: u32,
        /// Burst size.
        burst_size: u32,
    },
    /// OFPMBT_DSCP_REMARK.
    DscpRemark {
        /// Rate.
        rate: u32,
        /// Burst size.
        burst_size: u32,
        /// Drop precedence increase.
        prec_level: u8,
    },
    /// OFPMBT_EXPERIMENTER, body after the experimenter id kept opaque.
    Experimenter {
        /// Rate.
        rate: u32,
        /// Burst size.
        burst_size: u32,
        /// Experimenter id.
        experimenter: u32,
        /// Raw body after the experimenter id.
        data: Bytes,
    },
    /// Undefined band type, body after burst_size kept raw.
    Unknown {
        /// Band type.
        typ: u16,
        /// Rate.
        rate: u32,
        /// Burst size.
        burst_size: u32,
        /// Raw body.
        data: Bytes,
    },
}

impl MeterBand {
    pub(crate) fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let typ = r.peek_u16(0)?;
        let len = usize::from(r.peek_u16(2)?);
        if len < 12 {
            return Err(DecodeError::BadLength);
        }
        let mut b = r.sub(len)?;
        b.skip(4)?;
        let rate = b.u32()?;
        let burst_size = b.u32()?;
        let fixed = |want: usize| {
            if len == want {
                Ok(())
            } else {
                Err(DecodeError::BadLength)
            }
        };
        Ok(match typ {
            1 => {
                fixed(16)?;
                MeterBand::Drop { rate, burst_size }
            }
            2 => {
                fixed(16)?;
                MeterBand::DscpRemark {
                    rate,
                    burst_size,
                    prec_level: b.u8()?,
                }
            }
            0xffff => {
                let experimenter = b.u32()?;
                MeterBand::Experimenter {
                    rate,
                    burst_size,
                    experimenter,
                    data: b.rest(),
                }
            }
            _ => MeterBand::Unknown {
                typ,
                rate,
                burst_size,
                data: b.rest(),
            },
        })
    }
    pub(crate) fn encode(&self, out: &mut BytesMut) -> Result<(), EncodeError> {
        let start = out.len();
        let (typ, rate, burst) = match self {
            MeterBand::Drop { rate, burst_size } => (1, rate, burst_size),
            MeterBand::DscpRemark {
                rate, burst_size, ..
            } => (2, rate, burst_size),
            MeterBand::Experimenter {
                rate, burst_size, ..
            } => (0xffff, rate, burst_size),
            MeterBand::Unknown {
                typ,
                rate,
                burst_size,
                ..
            } => (*typ, rate, burst_size),
        };
        out.put_u16(typ);
        let m = LenMark::at(out, start);
        out.put_u32(*rate);
        out.put_u32(*burst);
        match self {
            MeterBand::Drop { .. } => out.put_u32(0),
            MeterBand::DscpRemark { prec_level, .. } => out.put_slice(&[*prec_level, 0, 0, 0]),
            MeterBand::Experimenter {
                experimenter, data, ..
            } => {
                out.put_u32(*experimenter);
                out.put_slice(data);
            }
            MeterBand::Unknown { data, .. } => out.put_slice(data),
        }
        m.finish(out, "meter band")?;
        Ok(())
    }
}

pub(crate) fn decode_bands(mut r: Reader<'_>) -> Result<Vec<MeterBand>, DecodeError> {
    let mut v = Vec::new();
    while !r.is_empty() {
        v.push(MeterBand::decode(&mut r)?);
    }
    Ok(v)
}

pub(crate) fn encode_bands(b: &[MeterBand], out: &mut BytesMut) -> Result<(), EncodeError> {
    for x in b {
        x.encode(out)?;
    }
    Ok(())
}

/// OFPT_METER_MOD.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct MeterMod {
    /// Command.
    pub command: MeterModCommand,
    /// Flags.
    pub flags: MeterFlags,
    /// Meter id.
    pub meter_id: u32,
    /// Bands.
    pub bands: Vec<MeterBand>,
}

impl MeterMod {
    pub(crate) fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let command = MeterModCommand::from_raw(r.u16()?);
        let flags = MeterFlags(r.u16()?);
        let meter_id = r.u32()?;
        let n = r.remaining();
        Ok(MeterMod {
            command,
            flags,
            meter_id,
            bands: decode_bands(r.sub(n)?)?,
        })
    }
    pub(crate) fn encode(&self, out: &mut BytesMut) -> Result<(), EncodeError> {
        out.put_u16(self.command.to_raw());
        out.put_u16(self.flags.0);
        out.put_u32(self.meter_id);
        encode_bands(&self.bands, out)
    }
}
