//! OpenFlow's error type/code pairs (`ofp_error_msg`) as one typed error, and the ERROR
//! reply built from it.
//!
//! Every refusal of the decoder is an [`OfError`] carrying the exact `OFPET_*` type and
//! code the OpenFlow 1.3 specification prescribes for it, and a reason for the log. The
//! caller answers the offending request with [`OfError::reply`], which carries the first 64
//! bytes of the request as the specification asks.

use crate::message::{ErrorMsg, Message};

/// A refusal: the `OFPET_*` type and its code, and what was wrong (for logs and tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{reason} (OpenFlow error type {type_}, code {code})")]
pub struct OfError {
    /// `OFPET_*`, see [`et`].
    pub type_: u16,
    /// The code within the type, see [`brc`], [`bac`], [`bic`], [`bmc`], ….
    pub code: u16,
    /// What was wrong, for the log line.
    pub reason: &'static str,
}

/// How many bytes of the offending request an ERROR message carries.
pub const ERROR_DATA_LEN: usize = 64;

impl OfError {
    /// An error of `type_` and `code`.
    pub const fn new(type_: u16, code: u16, reason: &'static str) -> Self {
        OfError {
            type_,
            code,
            reason,
        }
    }

    pub(crate) const fn request(code: u16, reason: &'static str) -> Self {
        Self::new(et::BAD_REQUEST, code, reason)
    }
    pub(crate) const fn action(code: u16, reason: &'static str) -> Self {
        Self::new(et::BAD_ACTION, code, reason)
    }
    pub(crate) const fn instruction(code: u16, reason: &'static str) -> Self {
        Self::new(et::BAD_INSTRUCTION, code, reason)
    }
    pub(crate) const fn matching(code: u16, reason: &'static str) -> Self {
        Self::new(et::BAD_MATCH, code, reason)
    }

    /// The code's name as the specification spells it (`"OFPBMC_BAD_PREREQ"`), for logs
    /// and counters; `None` for a pair this crate never produces.
    pub fn name(&self) -> Option<&'static str> {
        name(self.type_, self.code)
    }

    /// Whether this is `type_`/`code` (whatever the reason).
    pub fn is(&self, type_: u16, code: u16) -> bool {
        self.type_ == type_ && self.code == code
    }

    /// The ERROR message answering `request` (the offending message's bytes, header
    /// included): this error's type and code and the request's first 64 bytes.
    pub fn reply(&self, request: &[u8]) -> Message {
        let mut data = Vec::with_capacity(ERROR_DATA_LEN + 4);
        if self.type_ == et::EXPERIMENTER {
            data.extend_from_slice(&crate::nicira::NX_VENDOR_ID.to_be_bytes());
        }
        data.extend_from_slice(&request[..request.len().min(ERROR_DATA_LEN)]);
        Message::Error(ErrorMsg {
            type_: self.type_,
            code: self.code,
            data,
        })
    }

    /// [`reply`](Self::reply), encoded with the request's xid and version (so a peer that
    /// spoke a version we refuse can still read it).
    pub fn encode_reply(&self, request: &[u8]) -> Vec<u8> {
        let version = request.first().copied().unwrap_or(crate::VERSION_1_3);
        let xid = request
            .get(4..8)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
            .unwrap_or(0);
        crate::message::encode_with_version(&self.reply(request), version, xid)
    }
}

/// `OFPET_*`: error types.
pub mod et {
    pub const HELLO_FAILED: u16 = 0;
    pub const BAD_REQUEST: u16 = 1;
    pub const BAD_ACTION: u16 = 2;
    pub const BAD_INSTRUCTION: u16 = 3;
    pub const BAD_MATCH: u16 = 4;
    pub const FLOW_MOD_FAILED: u16 = 5;
    pub const GROUP_MOD_FAILED: u16 = 6;
    pub const PORT_MOD_FAILED: u16 = 7;
    pub const TABLE_MOD_FAILED: u16 = 8;
    pub const QUEUE_OP_FAILED: u16 = 9;
    pub const SWITCH_CONFIG_FAILED: u16 = 10;
    pub const ROLE_REQUEST_FAILED: u16 = 11;
    pub const METER_MOD_FAILED: u16 = 12;
    pub const TABLE_FEATURES_FAILED: u16 = 13;
    /// OpenFlow 1.4+.
    pub const BAD_PROPERTY: u16 = 14;
    /// OpenFlow 1.4+.
    pub const ASYNC_CONFIG_FAILED: u16 = 15;
    /// OpenFlow 1.4+.
    pub const BUNDLE_FAILED: u16 = 17;
    /// An experimenter's error: every one this crate produces is Nicira's
    /// ([`crate::nicira::NX_VENDOR_ID`]), whose id starts the ERROR's data.
    pub const EXPERIMENTER: u16 = 0xffff;
}

/// Nicira's `NXBAC_*` codes (sent as [`et::EXPERIMENTER`] errors, OpenFlow 1.2+ numbering).
pub mod nxbac {
    /// `NXBAC_BAD_CONJUNCTION`: a `conjunction` action with a bad clause or clause count,
    /// or with actions other than `conjunction`s.
    pub const BAD_CONJUNCTION: u16 = 15;
}

/// `OFPHFC_*`: codes of `OFPET_HELLO_FAILED`.
pub mod hfc {
    pub const INCOMPATIBLE: u16 = 0;
    pub const EPERM: u16 = 1;
}

/// `OFPBRC_*`: codes of `OFPET_BAD_REQUEST`.
pub mod brc {
    pub const BAD_VERSION: u16 = 0;
    pub const BAD_TYPE: u16 = 1;
    pub const BAD_MULTIPART: u16 = 2;
    pub const BAD_EXPERIMENTER: u16 = 3;
    pub const BAD_EXP_TYPE: u16 = 4;
    pub const EPERM: u16 = 5;
    pub const BAD_LEN: u16 = 6;
    pub const BUFFER_EMPTY: u16 = 7;
    pub const BUFFER_UNKNOWN: u16 = 8;
    pub const BAD_TABLE_ID: u16 = 9;
    pub const IS_SLAVE: u16 = 10;
    pub const BAD_PORT: u16 = 11;
    pub const BAD_PACKET: u16 = 12;
    pub const MULTIPART_BUFFER_OVERFLOW: u16 = 13;
    /// OpenFlow 1.5: a PACKET_OUT match with other than pipeline fields.
    pub const PIPELINE_FIELDS_ONLY: u16 = 17;
}

/// `OFPBPC_*`: codes of `OFPET_BAD_PROPERTY` (OpenFlow 1.4+).
pub mod bpc {
    pub const BAD_TYPE: u16 = 0;
    pub const BAD_LEN: u16 = 1;
    pub const BAD_VALUE: u16 = 2;
    pub const TOO_MANY: u16 = 3;
    pub const DUP_TYPE: u16 = 4;
    pub const BAD_EXPERIMENTER: u16 = 5;
    pub const BAD_EXP_TYPE: u16 = 6;
    pub const BAD_EXP_VALUE: u16 = 7;
    pub const EPERM: u16 = 8;
}

/// `OFPBAC_*`: codes of `OFPET_BAD_ACTION`.
pub mod bac {
    pub const BAD_TYPE: u16 = 0;
    pub const BAD_LEN: u16 = 1;
    pub const BAD_EXPERIMENTER: u16 = 2;
    pub const BAD_EXP_TYPE: u16 = 3;
    pub const BAD_OUT_PORT: u16 = 4;
    pub const BAD_ARGUMENT: u16 = 5;
    pub const EPERM: u16 = 6;
    pub const TOO_MANY: u16 = 7;
    pub const BAD_QUEUE: u16 = 8;
    pub const BAD_OUT_GROUP: u16 = 9;
    pub const MATCH_INCONSISTENT: u16 = 10;
    pub const UNSUPPORTED_ORDER: u16 = 11;
    pub const BAD_TAG: u16 = 12;
    pub const BAD_SET_TYPE: u16 = 13;
    pub const BAD_SET_LEN: u16 = 14;
    pub const BAD_SET_ARGUMENT: u16 = 15;
}

/// `OFPBIC_*`: codes of `OFPET_BAD_INSTRUCTION`.
pub mod bic {
    pub const UNKNOWN_INST: u16 = 0;
    pub const UNSUP_INST: u16 = 1;
    pub const BAD_TABLE_ID: u16 = 2;
    pub const UNSUP_METADATA: u16 = 3;
    pub const UNSUP_METADATA_MASK: u16 = 4;
    pub const BAD_EXPERIMENTER: u16 = 5;
    pub const BAD_EXP_TYPE: u16 = 6;
    pub const BAD_LEN: u16 = 7;
    pub const EPERM: u16 = 8;
}

/// `OFPBMC_*`: codes of `OFPET_BAD_MATCH`.
pub mod bmc {
    pub const BAD_TYPE: u16 = 0;
    pub const BAD_LEN: u16 = 1;
    pub const BAD_TAG: u16 = 2;
    pub const BAD_DL_ADDR_MASK: u16 = 3;
    pub const BAD_NW_ADDR_MASK: u16 = 4;
    pub const BAD_WILDCARDS: u16 = 5;
    pub const BAD_FIELD: u16 = 6;
    pub const BAD_VALUE: u16 = 7;
    pub const BAD_MASK: u16 = 8;
    pub const BAD_PREREQ: u16 = 9;
    pub const DUP_FIELD: u16 = 10;
    pub const EPERM: u16 = 11;
}

/// `OFPFMFC_*`: codes of `OFPET_FLOW_MOD_FAILED`.
pub mod fmfc {
    pub const UNKNOWN: u16 = 0;
    pub const TABLE_FULL: u16 = 1;
    pub const BAD_TABLE_ID: u16 = 2;
    pub const OVERLAP: u16 = 3;
    pub const EPERM: u16 = 4;
    pub const BAD_TIMEOUT: u16 = 5;
    pub const BAD_COMMAND: u16 = 6;
    pub const BAD_FLAGS: u16 = 7;
}

/// `OFPGMFC_*`: codes of `OFPET_GROUP_MOD_FAILED`.
pub mod gmfc {
    pub const GROUP_EXISTS: u16 = 0;
    pub const INVALID_GROUP: u16 = 1;
    pub const WEIGHT_UNSUPPORTED: u16 = 2;
    pub const OUT_OF_GROUPS: u16 = 3;
    pub const OUT_OF_BUCKETS: u16 = 4;
    pub const CHAINING_UNSUPPORTED: u16 = 5;
    pub const WATCH_UNSUPPORTED: u16 = 6;
    pub const LOOP: u16 = 7;
    pub const UNKNOWN_GROUP: u16 = 8;
    pub const CHAINED_GROUP: u16 = 9;
    pub const BAD_TYPE: u16 = 10;
    pub const BAD_COMMAND: u16 = 11;
    pub const BAD_BUCKET: u16 = 12;
    pub const BAD_WATCH: u16 = 13;
    pub const EPERM: u16 = 14;
}

/// `OFPPMFC_*`: codes of `OFPET_PORT_MOD_FAILED`.
pub mod pmfc {
    pub const BAD_PORT: u16 = 0;
    pub const BAD_HW_ADDR: u16 = 1;
    pub const BAD_CONFIG: u16 = 2;
    pub const BAD_ADVERTISE: u16 = 3;
    pub const EPERM: u16 = 4;
}

/// `OFPTMFC_*`: codes of `OFPET_TABLE_MOD_FAILED`.
pub mod tmfc {
    pub const BAD_TABLE: u16 = 0;
    pub const BAD_CONFIG: u16 = 1;
    pub const EPERM: u16 = 2;
}

/// `OFPSCFC_*`: codes of `OFPET_SWITCH_CONFIG_FAILED`.
pub mod scfc {
    pub const BAD_FLAGS: u16 = 0;
    pub const BAD_LEN: u16 = 1;
    pub const EPERM: u16 = 2;
}

/// `OFPRRFC_*`: codes of `OFPET_ROLE_REQUEST_FAILED`.
pub mod rrfc {
    pub const STALE: u16 = 0;
    pub const UNSUP: u16 = 1;
    pub const BAD_ROLE: u16 = 2;
}

/// `OFPMMFC_*`: codes of `OFPET_METER_MOD_FAILED`.
pub mod mmfc {
    pub const UNKNOWN: u16 = 0;
    pub const METER_EXISTS: u16 = 1;
    pub const INVALID_METER: u16 = 2;
    pub const UNKNOWN_METER: u16 = 3;
    pub const BAD_COMMAND: u16 = 4;
    pub const BAD_FLAGS: u16 = 5;
    pub const BAD_RATE: u16 = 6;
    pub const BAD_BURST: u16 = 7;
    pub const BAD_BAND: u16 = 8;
    pub const BAD_BAND_VALUE: u16 = 9;
    pub const OUT_OF_METERS: u16 = 10;
    pub const OUT_OF_BANDS: u16 = 11;
}

/// `OFPTFFC_*`: codes of `OFPET_TABLE_FEATURES_FAILED`.
pub mod tffc {
    pub const BAD_TABLE: u16 = 0;
    pub const BAD_METADATA: u16 = 1;
    pub const BAD_TYPE: u16 = 2;
    pub const BAD_LEN: u16 = 3;
    pub const BAD_ARGUMENT: u16 = 4;
    pub const EPERM: u16 = 5;
}

/// The name of every type/code pair this crate produces.
pub fn name(type_: u16, code: u16) -> Option<&'static str> {
    const NAMES: &[(u16, &[&str])] = &[
        (et::HELLO_FAILED, &["OFPHFC_INCOMPATIBLE", "OFPHFC_EPERM"]),
        (
            et::BAD_REQUEST,
            &[
                "OFPBRC_BAD_VERSION",
                "OFPBRC_BAD_TYPE",
                "OFPBRC_BAD_MULTIPART",
                "OFPBRC_BAD_EXPERIMENTER",
                "OFPBRC_BAD_EXP_TYPE",
                "OFPBRC_EPERM",
                "OFPBRC_BAD_LEN",
                "OFPBRC_BUFFER_EMPTY",
                "OFPBRC_BUFFER_UNKNOWN",
                "OFPBRC_BAD_TABLE_ID",
                "OFPBRC_IS_SLAVE",
                "OFPBRC_BAD_PORT",
                "OFPBRC_BAD_PACKET",
                "OFPBRC_MULTIPART_BUFFER_OVERFLOW",
                "OFPBRC_MULTIPART_REQUEST_TIMEOUT",
                "OFPBRC_MULTIPART_REPLY_TIMEOUT",
                "OFPBRC_MULTIPART_BAD_SCHED",
                "OFPBRC_PIPELINE_FIELDS_ONLY",
            ],
        ),
        (
            et::BAD_ACTION,
            &[
                "OFPBAC_BAD_TYPE",
                "OFPBAC_BAD_LEN",
                "OFPBAC_BAD_EXPERIMENTER",
                "OFPBAC_BAD_EXP_TYPE",
                "OFPBAC_BAD_OUT_PORT",
                "OFPBAC_BAD_ARGUMENT",
                "OFPBAC_EPERM",
                "OFPBAC_TOO_MANY",
                "OFPBAC_BAD_QUEUE",
                "OFPBAC_BAD_OUT_GROUP",
                "OFPBAC_MATCH_INCONSISTENT",
                "OFPBAC_UNSUPPORTED_ORDER",
                "OFPBAC_BAD_TAG",
                "OFPBAC_BAD_SET_TYPE",
                "OFPBAC_BAD_SET_LEN",
                "OFPBAC_BAD_SET_ARGUMENT",
            ],
        ),
        (
            et::BAD_INSTRUCTION,
            &[
                "OFPBIC_UNKNOWN_INST",
                "OFPBIC_UNSUP_INST",
                "OFPBIC_BAD_TABLE_ID",
                "OFPBIC_UNSUP_METADATA",
                "OFPBIC_UNSUP_METADATA_MASK",
                "OFPBIC_BAD_EXPERIMENTER",
                "OFPBIC_BAD_EXP_TYPE",
                "OFPBIC_BAD_LEN",
                "OFPBIC_EPERM",
            ],
        ),
        (
            et::BAD_MATCH,
            &[
                "OFPBMC_BAD_TYPE",
                "OFPBMC_BAD_LEN",
                "OFPBMC_BAD_TAG",
                "OFPBMC_BAD_DL_ADDR_MASK",
                "OFPBMC_BAD_NW_ADDR_MASK",
                "OFPBMC_BAD_WILDCARDS",
                "OFPBMC_BAD_FIELD",
                "OFPBMC_BAD_VALUE",
                "OFPBMC_BAD_MASK",
                "OFPBMC_BAD_PREREQ",
                "OFPBMC_DUP_FIELD",
                "OFPBMC_EPERM",
            ],
        ),
        (
            et::FLOW_MOD_FAILED,
            &[
                "OFPFMFC_UNKNOWN",
                "OFPFMFC_TABLE_FULL",
                "OFPFMFC_BAD_TABLE_ID",
                "OFPFMFC_OVERLAP",
                "OFPFMFC_EPERM",
                "OFPFMFC_BAD_TIMEOUT",
                "OFPFMFC_BAD_COMMAND",
                "OFPFMFC_BAD_FLAGS",
            ],
        ),
        (
            et::GROUP_MOD_FAILED,
            &[
                "OFPGMFC_GROUP_EXISTS",
                "OFPGMFC_INVALID_GROUP",
                "OFPGMFC_WEIGHT_UNSUPPORTED",
                "OFPGMFC_OUT_OF_GROUPS",
                "OFPGMFC_OUT_OF_BUCKETS",
                "OFPGMFC_CHAINING_UNSUPPORTED",
                "OFPGMFC_WATCH_UNSUPPORTED",
                "OFPGMFC_LOOP",
                "OFPGMFC_UNKNOWN_GROUP",
                "OFPGMFC_CHAINED_GROUP",
                "OFPGMFC_BAD_TYPE",
                "OFPGMFC_BAD_COMMAND",
                "OFPGMFC_BAD_BUCKET",
                "OFPGMFC_BAD_WATCH",
                "OFPGMFC_EPERM",
            ],
        ),
        (
            et::PORT_MOD_FAILED,
            &[
                "OFPPMFC_BAD_PORT",
                "OFPPMFC_BAD_HW_ADDR",
                "OFPPMFC_BAD_CONFIG",
                "OFPPMFC_BAD_ADVERTISE",
                "OFPPMFC_EPERM",
            ],
        ),
        (
            et::TABLE_MOD_FAILED,
            &["OFPTMFC_BAD_TABLE", "OFPTMFC_BAD_CONFIG", "OFPTMFC_EPERM"],
        ),
        (
            et::SWITCH_CONFIG_FAILED,
            &["OFPSCFC_BAD_FLAGS", "OFPSCFC_BAD_LEN", "OFPSCFC_EPERM"],
        ),
        (
            et::ROLE_REQUEST_FAILED,
            &["OFPRRFC_STALE", "OFPRRFC_UNSUP", "OFPRRFC_BAD_ROLE"],
        ),
        (
            et::METER_MOD_FAILED,
            &[
                "OFPMMFC_UNKNOWN",
                "OFPMMFC_METER_EXISTS",
                "OFPMMFC_INVALID_METER",
                "OFPMMFC_UNKNOWN_METER",
                "OFPMMFC_BAD_COMMAND",
                "OFPMMFC_BAD_FLAGS",
                "OFPMMFC_BAD_RATE",
                "OFPMMFC_BAD_BURST",
                "OFPMMFC_BAD_BAND",
                "OFPMMFC_BAD_BAND_VALUE",
                "OFPMMFC_OUT_OF_METERS",
                "OFPMMFC_OUT_OF_BANDS",
            ],
        ),
        (
            et::TABLE_FEATURES_FAILED,
            &[
                "OFPTFFC_BAD_TABLE",
                "OFPTFFC_BAD_METADATA",
                "OFPTFFC_BAD_TYPE",
                "OFPTFFC_BAD_LEN",
                "OFPTFFC_BAD_ARGUMENT",
                "OFPTFFC_EPERM",
            ],
        ),
        (
            et::BAD_PROPERTY,
            &[
                "OFPBPC_BAD_TYPE",
                "OFPBPC_BAD_LEN",
                "OFPBPC_BAD_VALUE",
                "OFPBPC_TOO_MANY",
                "OFPBPC_DUP_TYPE",
                "OFPBPC_BAD_EXPERIMENTER",
                "OFPBPC_BAD_EXP_TYPE",
                "OFPBPC_BAD_EXP_VALUE",
                "OFPBPC_EPERM",
            ],
        ),
        (
            et::ASYNC_CONFIG_FAILED,
            &["OFPACFC_INVALID", "OFPACFC_UNSUPPORTED", "OFPACFC_EPERM"],
        ),
        (
            et::BUNDLE_FAILED,
            &[
                "OFPBFC_UNKNOWN",
                "OFPBFC_EPERM",
                "OFPBFC_BAD_ID",
                "OFPBFC_BUNDLE_EXIST",
                "OFPBFC_BUNDLE_CLOSED",
                "OFPBFC_OUT_OF_BUNDLES",
                "OFPBFC_BAD_TYPE",
                "OFPBFC_BAD_FLAGS",
                "OFPBFC_MSG_BAD_LEN",
                "OFPBFC_MSG_BAD_XID",
                "OFPBFC_MSG_UNSUP",
                "OFPBFC_MSG_CONFLICT",
                "OFPBFC_MSG_TOO_MANY",
                "OFPBFC_MSG_FAILED",
                "OFPBFC_TIMEOUT",
                "OFPBFC_BUNDLE_IN_PROGRESS",
                "OFPBFC_SCHED_NOT_SUPPORTED",
            ],
        ),
    ];
    if type_ == et::EXPERIMENTER {
        // Nicira's codes (OpenFlow 1.2+ numbering), the ones this crate produces.
        return match code {
            15 => Some("NXBAC_BAD_CONJUNCTION"),
            16 => Some("NXTTMFC_BAD_COMMAND"),
            17 => Some("NXTTMFC_BAD_OPT_LEN"),
            18 => Some("NXTTMFC_BAD_FIELD_IDX"),
            19 => Some("NXTTMFC_TABLE_FULL"),
            20 => Some("NXTTMFC_ALREADY_MAPPED"),
            21 => Some("NXTTMFC_DUP_ENTRY"),
            22 => Some("OFPBFC_BAD_VERSION"),
            34 => Some("NXR_NOT_SUPPORTED"),
            35 => Some("NXR_STALE"),
            38 => Some("NXTTMFC_INVALID_TLV_DEL"),
            _ => None,
        };
    }
    NAMES
        .iter()
        .find(|(t, _)| *t == type_)
        .and_then(|(_, codes)| codes.get(usize::from(code)).copied())
}
