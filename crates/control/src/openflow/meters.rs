//! OpenFlow 1.3 meters mapped onto a bridge's meters ([`MeterSpec`], ovs-ofctl's syntax):
//! METER_MOD into a checked [`MeterSpec`] with the errors OVS's userspace (netdev) datapath
//! gives, a meter back into `ofp_meter_config`, and the features it reports. Pure functions;
//! the daemon (`daemon/meters.rs`) applies the result, for OpenFlow and the CLI alike.
//!
//! What OVS 3.1's netdev bridge does, and so this does (checked by `tests/e2e/tests/meters.rs`
//! against a real one):
//! * add/modify: meter id 0 or above `OFPM_MAX` → `OFPMMFC_INVALID_METER`; more than 8
//!   bands → `OFPMMFC_OUT_OF_BANDS`; neither or both of KBPS and PKTPS → `OFPMMFC_BAD_FLAGS`;
//!   add of an existing id → `OFPMMFC_METER_EXISTS`; modify of a missing one →
//!   `OFPMMFC_UNKNOWN_METER`; the table full ([`MAX_METERS`]) → `OFPMMFC_OUT_OF_METERS`; a
//!   band other than drop (DSCP_REMARK) → `OFPMMFC_BAD_BAND`; a rate of 0 →
//!   `OFPMMFC_BAD_RATE`. (OVS never answers `BAD_BURST` or `BAD_BAND_VALUE`: a band without a
//!   burst size gets one second's worth.)
//! * delete: a missing meter is no error; `OFPM_ALL` deletes every meter; the rules that use
//!   a deleted meter are deleted with it.
//! * a FLOW_MOD whose meter instruction names a missing meter → `OFPMMFC_INVALID_METER`.

use ferrovs_datapath::meter::{MAX_BANDS, MAX_METERS};
use ferrovs_flow::meter::{self as fm, BandKind, BandSpec, MeterSpec};
use ferrovs_openflow::error::{et, mmfc};
use ferrovs_openflow::message::meter;
use ferrovs_openflow::multipart::MeterFeatures;
use ferrovs_openflow::{Instruction, MeterBand, MeterMod, OfError};

const fn err(code: u16, reason: &'static str) -> OfError {
    OfError::new(et::METER_MOD_FAILED, code, reason)
}

/// The meter a METER_MOD add or modify describes, checked as OVS checks it (`exists`:
/// whether the bridge has the meter, `count`: how many it has).
pub fn meter_from_of(mm: &MeterMod, exists: bool, count: usize) -> Result<MeterSpec, OfError> {
    let spec = MeterSpec {
        id: mm.meter_id,
        flags: mm.flags,
        bands: mm
            .bands
            .iter()
            .map(|b| match *b {
                MeterBand::Drop { rate, burst_size } => BandSpec {
                    kind: BandKind::Drop,
                    rate,
                    burst_size,
                },
                MeterBand::DscpRemark {
                    rate,
                    burst_size,
                    prec_level,
                } => BandSpec {
                    kind: BandKind::DscpRemark { prec_level },
                    rate,
                    burst_size,
                },
            })
            .collect(),
    };
    check_meter(&spec, mm.command == meter::MODIFY, exists, count)?;
    Ok(spec)
}

/// The checks of an add (`modify` false) or modify of `spec`, in OVS's order.
pub fn check_meter(
    spec: &MeterSpec,
    modify: bool,
    exists: bool,
    count: usize,
) -> Result<(), OfError> {
    if spec.id == 0 || spec.id > fm::MAX_METER_ID {
        return Err(err(mmfc::INVALID_METER, "meter id 0 or beyond OFPM_MAX"));
    }
    if spec.bands.len() > MAX_BANDS {
        return Err(err(mmfc::OUT_OF_BANDS, "more than 8 bands"));
    }
    let unit = spec.flags & (fm::KBPS | fm::PKTPS);
    if unit == 0 || unit == fm::KBPS | fm::PKTPS {
        return Err(err(
            mmfc::BAD_FLAGS,
            "a meter has exactly one of KBPS and PKTPS",
        ));
    }
    if modify && !exists {
        return Err(err(mmfc::UNKNOWN_METER, "no such meter"));
    }
    if !modify && exists {
        return Err(err(mmfc::METER_EXISTS, "the meter exists"));
    }
    if !modify && count >= MAX_METERS {
        return Err(err(mmfc::OUT_OF_METERS, "the meter table is full"));
    }
    if spec.bands.iter().any(|b| !matches!(b.kind, BandKind::Drop)) {
        return Err(err(
            mmfc::BAD_BAND,
            "only drop bands are supported (as OVS's userspace datapath)",
        ));
    }
    if spec.bands.iter().any(|b| b.rate == 0) {
        return Err(err(mmfc::BAD_RATE, "a band's rate is 0"));
    }
    Ok(())
}

/// A meter as `ofp_meter_config`'s bands.
pub fn bands_to_of(spec: &MeterSpec) -> Vec<MeterBand> {
    spec.bands
        .iter()
        .map(|b| match b.kind {
            BandKind::Drop => MeterBand::Drop {
                rate: b.rate,
                burst_size: b.burst_size,
            },
            BandKind::DscpRemark { prec_level } => MeterBand::DscpRemark {
                rate: b.rate,
                burst_size: b.burst_size,
                prec_level,
            },
        })
        .collect()
}

/// What the meter table supports (as OVS's netdev datapath reports it).
pub fn features() -> MeterFeatures {
    MeterFeatures {
        max_meter: MAX_METERS as u32,
        band_types: 1 << meter::BAND_DROP,
        capabilities: u32::from(meter::KBPS | meter::PKTPS | meter::BURST | meter::STATS),
        max_bands: MAX_BANDS as u8,
        max_color: 0,
    }
}

/// The meter a FLOW_MOD's instructions name, if any.
pub fn flow_mod_meter(instructions: &[Instruction]) -> Option<u32> {
    instructions.iter().find_map(|i| match i {
        Instruction::Meter(m) => Some(*m),
        _ => None,
    })
}

/// A FLOW_MOD naming meter `id`, which the bridge lacks.
pub fn missing_meter() -> OfError {
    err(mmfc::INVALID_METER, "the rule's meter does not exist")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mm(command: u16, flags: u16, id: u32, bands: Vec<MeterBand>) -> MeterMod {
        MeterMod {
            command,
            flags,
            meter_id: id,
            bands,
        }
    }

    const DROP: MeterBand = MeterBand::Drop {
        rate: 10,
        burst_size: 0,
    };

    #[test]
    fn meter_mods_are_checked_as_ovs_checks_them() {
        let kb = meter::KBPS;
        let code =
            |m: &MeterMod, exists, count| meter_from_of(m, exists, count).map_err(|e| e.code);
        assert!(code(&mm(meter::ADD, kb, 1, vec![DROP]), false, 0).is_ok());
        assert_eq!(
            code(&mm(meter::ADD, kb, 0, vec![DROP]), false, 0),
            Err(mmfc::INVALID_METER)
        );
        assert_eq!(
            code(&mm(meter::ADD, kb, 0xffff_0001, vec![DROP]), false, 0),
            Err(mmfc::INVALID_METER)
        );
        assert_eq!(
            code(&mm(meter::ADD, kb, 1, vec![DROP; 9]), false, 0),
            Err(mmfc::OUT_OF_BANDS)
        );
        assert_eq!(
            code(&mm(meter::ADD, kb | meter::PKTPS, 1, vec![DROP]), false, 0),
            Err(mmfc::BAD_FLAGS)
        );
        assert_eq!(
            code(&mm(meter::ADD, meter::BURST, 1, vec![DROP]), false, 0),
            Err(mmfc::BAD_FLAGS)
        );
        assert_eq!(
            code(&mm(meter::ADD, kb, 1, vec![DROP]), true, 1),
            Err(mmfc::METER_EXISTS)
        );
        assert_eq!(
            code(&mm(meter::MODIFY, kb, 1, vec![DROP]), false, 0),
            Err(mmfc::UNKNOWN_METER)
        );
        assert!(code(&mm(meter::MODIFY, kb, 1, vec![DROP]), true, 1).is_ok());
        assert_eq!(
            code(&mm(meter::ADD, kb, 1, vec![DROP]), false, MAX_METERS),
            Err(mmfc::OUT_OF_METERS)
        );
        let remark = MeterBand::DscpRemark {
            rate: 5,
            burst_size: 0,
            prec_level: 1,
        };
        assert_eq!(
            code(&mm(meter::ADD, kb, 1, vec![remark]), false, 0),
            Err(mmfc::BAD_BAND)
        );
        let zero = MeterBand::Drop {
            rate: 0,
            burst_size: 0,
        };
        assert_eq!(
            code(&mm(meter::ADD, kb, 1, vec![zero]), false, 0),
            Err(mmfc::BAD_RATE)
        );
    }

    #[test]
    fn a_meter_round_trips_through_its_config() {
        let m = mm(
            meter::ADD,
            meter::PKTPS | meter::BURST | meter::STATS,
            7,
            vec![MeterBand::Drop {
                rate: 10,
                burst_size: 20,
            }],
        );
        let spec = meter_from_of(&m, false, 0).unwrap();
        assert_eq!(
            spec.to_string(),
            "meter=7,pktps,burst,stats,bands=type=drop,rate=10,burst_size=20"
        );
        assert_eq!(bands_to_of(&spec), m.bands);
    }
}
