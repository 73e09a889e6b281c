//! OpenFlow 1.4/1.5 bundles: `OFPT_BUNDLE_CONTROL` (33) and `OFPT_BUNDLE_ADD_MESSAGE` (34).
//!
//! `ofp14_bundle_ctrl_msg` (8 bytes after the header): `bundle_id` u32, `type` u16
//! (`OFPBCT_*`), `flags` u16 (`OFPBF_ATOMIC` 1, `OFPBF_ORDERED` 2, 1.5's `OFPBF_TIME` 4),
//! then properties. `OFPT_BUNDLE_ADD_MESSAGE`: `bundle_id` u32, 2 pad, `flags` u16, then a
//! whole OpenFlow message (header included), then properties from the next multiple of 8.
//!
//! The codec checks what OVS's `ofputil_decode_bundle_add` checks of the inner message:
//! its length fits (`OFPBFC_MSG_BAD_LEN`), its version is the outer one
//! (`OFPBFC_BAD_VERSION`, a Nicira experimenter error), its xid is the outer one
//! (`OFPBFC_MSG_BAD_XID`) and its type is one a bundle may carry: FLOW_MOD, GROUP_MOD,
//! PORT_MOD, PACKET_OUT (`OFPBFC_MSG_UNSUP` otherwise). The inner message itself is decoded
//! by the caller, who answers its own errors. An unknown control type is `OFPBFC_BAD_TYPE`,
//! unknown flags `OFPBFC_BAD_FLAGS`. Properties (only experimenter ones exist) are kept
//! as bytes.

use crate::error::{et, OfError};
use crate::message::{ty, Header};
use crate::wire::{pad8, Put, Reader};

/// `OFPBCT_*`: bundle control types.
pub mod bct {
    pub const OPEN_REQUEST: u16 = 0;
    pub const OPEN_REPLY: u16 = 1;
    pub const CLOSE_REQUEST: u16 = 2;
    pub const CLOSE_REPLY: u16 = 3;
    pub const COMMIT_REQUEST: u16 = 4;
    pub const COMMIT_REPLY: u16 = 5;
    pub const DISCARD_REQUEST: u16 = 6;
    pub const DISCARD_REPLY: u16 = 7;
}

/// `OFPBF_*`: bundle flags.
pub mod bf {
    pub const ATOMIC: u16 = 1;
    pub const ORDERED: u16 = 2;
    /// OpenFlow 1.5's scheduled commit (not supported: `OFPBFC_SCHED_NOT_SUPPORTED`).
    pub const TIME: u16 = 4;
}

/// `OFPBFC_*`: codes of `OFPET_BUNDLE_FAILED` (17).
pub mod bfc {
    pub const UNKNOWN: u16 = 0;
    pub const EPERM: u16 = 1;
    pub const BAD_ID: u16 = 2;
    pub const BUNDLE_EXIST: u16 = 3;
    pub const BUNDLE_CLOSED: u16 = 4;
    pub const OUT_OF_BUNDLES: u16 = 5;
    pub const BAD_TYPE: u16 = 6;
    pub const BAD_FLAGS: u16 = 7;
    pub const MSG_BAD_LEN: u16 = 8;
    pub const MSG_BAD_XID: u16 = 9;
    pub const MSG_UNSUP: u16 = 10;
    pub const MSG_CONFLICT: u16 = 11;
    pub const MSG_TOO_MANY: u16 = 12;
    pub const MSG_FAILED: u16 = 13;
    pub const TIMEOUT: u16 = 14;
    pub const BUNDLE_IN_PROGRESS: u16 = 15;
    pub const SCHED_NOT_SUPPORTED: u16 = 16;
}

/// Nicira's experimenter code for an inner message of another version
/// (`OFPBFC_BAD_VERSION`, NX1.4-1.5(22)).
pub const NX_BFC_BAD_VERSION: u16 = 22;

/// An `OFPET_BUNDLE_FAILED` error.
pub fn bundle_error(code: u16, reason: &'static str) -> OfError {
    OfError::new(et::BUNDLE_FAILED, code, reason)
}

/// `OFPT_BUNDLE_CONTROL`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BundleCtrl {
    /// The bundle.
    pub bundle_id: u32,
    /// `OFPBCT_*`.
    pub type_: u16,
    /// `OFPBF_*`.
    pub flags: u16,
    /// Properties, as bytes.
    pub properties: Vec<u8>,
}

/// `OFPT_BUNDLE_ADD_MESSAGE`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BundleAdd {
    /// The bundle.
    pub bundle_id: u32,
    /// `OFPBF_*` (must be the bundle's).
    pub flags: u16,
    /// The inner message, header included (its type, version and xid checked).
    pub message: Vec<u8>,
    /// Properties, as bytes (after the inner message padded to 8).
    pub properties: Vec<u8>,
}

impl BundleCtrl {
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        out.put_u32(self.bundle_id);
        out.put_u16(self.type_);
        out.put_u16(self.flags);
        out.extend_from_slice(&self.properties);
    }

    pub(crate) fn decode(r: &mut Reader<'_>) -> Result<BundleCtrl, OfError> {
        let c = BundleCtrl {
            bundle_id: r.u32()?,
            type_: r.u16()?,
            flags: r.u16()?,
            properties: r.rest().to_vec(),
        };
        if c.type_ > bct::DISCARD_REPLY {
            return Err(bundle_error(bfc::BAD_TYPE, "unknown bundle control type"));
        }
        if c.flags & !(bf::ATOMIC | bf::ORDERED | bf::TIME) != 0 {
            return Err(bundle_error(bfc::BAD_FLAGS, "unknown bundle flags"));
        }
        check_props(&c.properties)?;
        Ok(c)
    }
}

impl BundleAdd {
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.put_u32(self.bundle_id);
        out.put_u16(0);
        out.put_u16(self.flags);
        out.extend_from_slice(&self.message);
        if !self.properties.is_empty() {
            // Properties start at a multiple of 8 from the message's start (8-byte header
            // plus the 8 bytes above: the same as from `start`).
            out.pad8_from(start);
            out.extend_from_slice(&self.properties);
        }
    }

    pub(crate) fn decode(outer: &Header, r: &mut Reader<'_>) -> Result<BundleAdd, OfError> {
        let bundle_id = r.u32()?;
        r.skip(2)?;
        let flags = r.u16()?;
        let rest = r.rest();
        let inner = Header::parse(rest).ok_or(bundle_error(
            bfc::MSG_BAD_LEN,
            "bundled message shorter than its header",
        ))?;
        let len = usize::from(inner.length);
        if len < crate::HEADER_LEN || len > rest.len() {
            return Err(bundle_error(
                bfc::MSG_BAD_LEN,
                "bundled message length does not fit",
            ));
        }
        if inner.version != outer.version {
            return Err(OfError::new(
                et::EXPERIMENTER,
                NX_BFC_BAD_VERSION,
                "bundled message of another version",
            ));
        }
        if inner.xid != outer.xid {
            return Err(bundle_error(
                bfc::MSG_BAD_XID,
                "bundled message xid differs from the bundle message's",
            ));
        }
        if !matches!(
            inner.type_,
            ty::FLOW_MOD | ty::GROUP_MOD | ty::PORT_MOD | ty::PACKET_OUT
        ) {
            return Err(bundle_error(
                bfc::MSG_UNSUP,
                "message type not allowed in a bundle",
            ));
        }
        let after = &rest[len..];
        let properties = if after.is_empty() {
            Vec::new()
        } else {
            // Padding up to a multiple of 8 of the whole message, then properties.
            let pad = pad8(16 + len) - (16 + len);
            if after.len() < pad || after[..pad].iter().any(|&b| b != 0) {
                return Err(bundle_error(
                    bfc::MSG_BAD_LEN,
                    "bytes after the bundled message are not padding and properties",
                ));
            }
            let p = after[pad..].to_vec();
            check_props(&p)?;
            p
        };
        Ok(BundleAdd {
            bundle_id,
            flags,
            message: rest[..len].to_vec(),
            properties,
        })
    }
}

/// Properties must tile their bytes (type, length ≥ 4, padded to 8).
fn check_props(mut p: &[u8]) -> Result<(), OfError> {
    let bad = OfError::new(
        et::BAD_PROPERTY,
        crate::error::bpc::BAD_LEN,
        "bundle property length wrong",
    );
    while !p.is_empty() {
        let mut r = Reader::new(p, bad);
        r.skip(2)?;
        let len = usize::from(r.u16()?);
        if len < 4 || pad8(len) > p.len() {
            return Err(bad);
        }
        p = &p[pad8(len)..];
    }
    Ok(())
}
