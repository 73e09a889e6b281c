//! The Nicira messages ovn-controller sends at start (`NXT_SET_PACKET_IN_FORMAT`,
//! `NXT_SET_CONTROLLER_ID`, `NXT_TLV_TABLE_REQUEST`/`NXT_TLV_TABLE_MOD`,
//! `NXT_CT_FLUSH_ZONE`) and the per-bridge Geneve TLV table.
//!
//! Invariants:
//! * The TLV table is the bridge's, as OVS's is its ofproto's: every connection of the
//!   bridge sees the same mappings, a TLV_TABLE_MOD applies all its mappings or none, and
//!   the table lives as long as the daemon (it is not in the configuration; after a restart
//!   ovn-controller reconnects, finds its option missing and maps it again: see
//!   `docs/openflow.md`, "OpenFlow 1.4 and 1.5"). A hot upgrade carries it in the
//!   datapath's map and restores this table from it (`of_handover.rs`).
//! * `tun_metadataN` is the option the table maps to index N: a Geneve tunnel port matches
//!   or sets option (class, type) of length len as `tun_metadataN` (the Geneve datapath
//!   reads [`TlvTable::mappings`]).
//! * `NXT_RESUME` continues a translation `controller(pause)` froze (`continuation.rs`).
//! * What ferrovs cannot do (`NXT_CT_FLUSH` by tuple, the old
//!   `NXT_PACKET_IN` format) is answered with OVS's error for it and counted; the
//!   connection goes on.

use ferrovs_openflow::error::brc;
use ferrovs_openflow::nx_msg::{
    nx_error, nxerr, pif, ttmc, NxMessage, TlvMap, TlvTableReply, TLV_MAX_FIELDS,
    TLV_MAX_OPTION_SPACE,
};
use ferrovs_openflow::{Message, OfError};

use super::openflow::OfConn;
use super::*;
use crate::controller::Role;

/// A bridge's Geneve option ↔ `tun_metadataN` table (`NXT_TLV_TABLE_MOD`).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct TlvTable {
    /// By index, at most one mapping each.
    maps: BTreeMap<u16, TlvMap>,
}

impl TlvTable {
    /// The mappings, by index.
    pub(super) fn mappings(&self) -> Vec<TlvMap> {
        self.maps.values().copied().collect()
    }

    fn space(&self) -> u32 {
        self.maps.values().map(|m| u32::from(m.option_len)).sum()
    }

    /// Applies a TLV_TABLE_MOD: all or nothing, with OVS's errors
    /// (`tun_metadata_table_mod`): an index already mapped is `NXTTMFC_ALREADY_MAPPED`,
    /// an option (class, type) already mapped elsewhere `NXTTMFC_DUP_ENTRY`, more than 256
    /// option bytes in all `NXTTMFC_TABLE_FULL`. Deleting an unmapped index is no error.
    pub(super) fn apply(&mut self, command: u16, mappings: &[TlvMap]) -> Result<(), OfError> {
        let mut next = self.clone();
        match command {
            ttmc::ADD => {
                for m in mappings {
                    if next.maps.contains_key(&m.index) {
                        return Err(nx_error(
                            nxerr::TTMFC_ALREADY_MAPPED,
                            "TLV field index already mapped",
                        ));
                    }
                    if next
                        .maps
                        .values()
                        .any(|x| x.option_class == m.option_class && x.option_type == m.option_type)
                    {
                        return Err(nx_error(
                            nxerr::TTMFC_DUP_ENTRY,
                            "TLV option already mapped to another field",
                        ));
                    }
                    next.maps.insert(m.index, *m);
                    if next.space() > TLV_MAX_OPTION_SPACE {
                        return Err(nx_error(
                            nxerr::TTMFC_TABLE_FULL,
                            "TLV options exceed the switch's option space",
                        ));
                    }
                }
            }
            ttmc::DELETE => {
                for m in mappings {
                    next.maps.remove(&m.index);
                }
            }
            ttmc::CLEAR => next.maps.clear(),
            _ => {
                return Err(nx_error(
                    nxerr::TTMFC_BAD_COMMAND,
                    "TLV table mod command out of range",
                ))
            }
        }
        *self = next;
        Ok(())
    }

    fn reply(&self) -> TlvTableReply {
        TlvTableReply {
            max_option_space: TLV_MAX_OPTION_SPACE,
            max_fields: TLV_MAX_FIELDS,
            mappings: self.mappings(),
        }
    }
}

impl Daemon {
    /// A Nicira message from a peer of `c.bridge`; `msg` is its bytes (for errors).
    pub(super) fn of_nicira(&mut self, c: &mut OfConn, nx: NxMessage, xid: u32, msg: &[u8]) {
        self.openflow.counters.nx_messages += 1;
        match nx {
            NxMessage::SetPacketInFormat(f) => match f {
                pif::STANDARD | pif::NXT_PACKET_IN2 => c.packet_in_format = f,
                // OVS also has the older NXT_PACKET_IN; ovn-controller asks for
                // NXT_PACKET_IN2.
                pif::NXT_PACKET_IN => self.of_refuse(
                    c,
                    OfError::new(
                        ferrovs_openflow::error::et::BAD_REQUEST,
                        brc::EPERM,
                        "the NXT_PACKET_IN format is not supported (NXT_PACKET_IN2 is)",
                    ),
                    msg,
                ),
                _ => self.of_refuse(
                    c,
                    OfError::new(
                        ferrovs_openflow::error::et::BAD_REQUEST,
                        brc::EPERM,
                        "unknown packet-in format",
                    ),
                    msg,
                ),
            },
            NxMessage::SetControllerId(id) => c.controller_id = id,
            NxMessage::TlvTableRequest => {
                let r = self
                    .openflow
                    .tlv
                    .get(&c.bridge)
                    .map(TlvTable::reply)
                    .unwrap_or_else(|| TlvTable::default().reply());
                let m = Message::Experimenter(NxMessage::TlvTableReply(r));
                let bytes = c.encode(&m, xid);
                c.out.extend_from_slice(&bytes);
            }
            NxMessage::TlvTableMod { command, mappings } => {
                if c.controller.is_some() && c.role == Role::Slave {
                    return self.of_refuse(
                        c,
                        OfError::new(
                            ferrovs_openflow::error::et::BAD_REQUEST,
                            brc::IS_SLAVE,
                            "this controller is a slave",
                        ),
                        msg,
                    );
                }
                let table = self.openflow.tlv.entry(c.bridge.clone()).or_default();
                let mut next = table.clone();
                let applied = next
                    .apply(command, &mappings)
                    .and_then(|()| datapath_map(&next.mappings()));
                match applied {
                    Ok(map) => {
                        *table = next;
                        let now = table.mappings();
                        // The bridge's tunnel ports map options with it from now on.
                        self.set_tlv_map(&c.bridge, map);
                        limited!(
                            self.logs,
                            Info,
                            &c.bridge,
                            "tlv-table",
                            "bridge {}: Geneve TLV table now {}",
                            c.bridge,
                            if now.is_empty() {
                                "empty".to_string()
                            } else {
                                now.iter()
                                    .map(|m| {
                                        format!(
                                            "tun_metadata{}=class {:#x} type {:#x} len {}",
                                            m.index, m.option_class, m.option_type, m.option_len
                                        )
                                    })
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            }
                        );
                    }
                    Err(e) => self.of_refuse(c, e, msg),
                }
            }
            NxMessage::CtFlushZone(zone) => {
                self.flush_conntrack(Some(zone));
            }
            NxMessage::Resume(body) => {
                // The rest of a translation `controller(pause)` froze (continuation.rs).
                let bridge = c.bridge.clone();
                if let Err(e) = self.of_resume(&bridge, &body) {
                    self.of_refuse(c, e, msg);
                }
            }
            NxMessage::CtFlush(_) => self.of_refuse(
                c,
                OfError::new(
                    ferrovs_openflow::error::et::BAD_REQUEST,
                    brc::BAD_EXP_TYPE,
                    "NXT_CT_FLUSH (by tuple) is not supported",
                ),
                msg,
            ),
            // What only a switch sends.
            NxMessage::TlvTableReply(_) | NxMessage::PacketIn2(_) => self.of_refuse(
                c,
                OfError::new(
                    ferrovs_openflow::error::et::BAD_REQUEST,
                    brc::BAD_EXP_TYPE,
                    "a message only a switch sends",
                ),
                msg,
            ),
        }
    }

    /// `show --json`'s `openflow`.
    pub(super) fn openflow_status(&self) -> Option<ferrovs_proto::reply::OpenflowStatus> {
        let c = &self.openflow.counters;
        if c.accepted == 0 && self.openflow.conns.is_empty() && c.handover_refused == 0 {
            return None;
        }
        let name = |v: u8| format!("1.{}", v.saturating_sub(1));
        let mut connections = BTreeMap::new();
        for conn in self.openflow.conns.values().filter(|c| c.negotiated) {
            *connections.entry(name(conn.version)).or_default() += 1;
        }
        Some(ferrovs_proto::reply::OpenflowStatus {
            connections,
            negotiated: c
                .negotiated
                .iter()
                .enumerate()
                .filter(|(_, n)| **n > 0)
                .map(|(i, n)| (name(4 + i as u8), *n))
                .collect(),
            refused: c.refused.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            dropped: c.dropped,
            nx_messages: c.nx_messages,
            bundles_committed: c.bundles_committed,
            bundled_messages: c.bundled_messages,
            bundles_failed: c.bundles_failed,
            handed_over: c.handed_over,
            handover_refused: c.handover_refused,
            tlv_maps: self
                .openflow
                .tlv
                .iter()
                .map(|(b, t)| {
                    let v = t
                        .mappings()
                        .iter()
                        .map(|m| {
                            format!(
                                "tun_metadata{}={:#06x},{:#04x},{}",
                                m.index, m.option_class, m.option_type, m.option_len
                            )
                        })
                        .collect();
                    (b.clone(), v)
                })
                .collect(),
        })
    }

    /// The TLV table of `bridge` (for the Geneve datapath and tests).
    #[allow(dead_code)]
    pub(super) fn tlv_mappings(&self, bridge: &str) -> Vec<TlvMap> {
        self.openflow
            .tlv
            .get(bridge)
            .map(TlvTable::mappings)
            .unwrap_or_default()
    }
}

/// The datapath's option map of an OpenFlow TLV table: refused as OVS refuses what its
/// tunnel metadata cannot hold (`NXTTMFC_BAD_FIELD_IDX` beyond `tun_metadata3`,
/// `NXTTMFC_BAD_OPT_LEN` beyond the 4 bytes a key field keeps; see `ferrovs_flow::tlv`).
fn datapath_map(maps: &[TlvMap]) -> Result<ferrovs_flow::TlvMap, OfError> {
    use ferrovs_flow::{TlvEntry, TlvError};
    let entries = maps.iter().map(|m| TlvEntry {
        class: m.option_class,
        kind: m.option_type,
        len: m.option_len,
        index: u8::try_from(m.index).unwrap_or(u8::MAX),
    });
    ferrovs_flow::TlvMap::new(entries).map_err(|e| match e {
        TlvError::BadIndex(_) => nx_error(
            nxerr::TTMFC_BAD_FIELD_IDX,
            "this switch keeps tun_metadata0..3 only",
        ),
        TlvError::BadLen(_) => nx_error(
            nxerr::TTMFC_BAD_OPT_LEN,
            "this switch keeps options of 4 bytes (or none) only",
        ),
        TlvError::IndexTwice(_) => nx_error(
            nxerr::TTMFC_ALREADY_MAPPED,
            "tun_metadata index mapped twice",
        ),
        TlvError::OptionTwice(..) => nx_error(nxerr::TTMFC_DUP_ENTRY, "option mapped twice"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(index: u16, class: u16, t: u8, len: u8) -> TlvMap {
        TlvMap {
            option_class: class,
            option_type: t,
            option_len: len,
            index,
        }
    }

    #[test]
    fn tlv_table_follows_ovs() {
        let mut t = TlvTable::default();
        // OVN's option: class 0x0102, type 0x80, 4 bytes, at the lowest free index.
        t.apply(ttmc::ADD, &[map(0, 0x0102, 0x80, 4)]).unwrap();
        assert_eq!(t.mappings(), vec![map(0, 0x0102, 0x80, 4)]);
        let e = t.apply(ttmc::ADD, &[map(0, 0x0103, 1, 4)]).unwrap_err();
        assert_eq!((e.type_, e.code), (0xffff, nxerr::TTMFC_ALREADY_MAPPED));
        let e = t.apply(ttmc::ADD, &[map(1, 0x0102, 0x80, 8)]).unwrap_err();
        assert_eq!((e.type_, e.code), (0xffff, nxerr::TTMFC_DUP_ENTRY));
        // All or nothing: the first mapping of a refused mod is not kept.
        let e = t
            .apply(
                ttmc::ADD,
                &[map(1, 1, 1, 124), map(2, 1, 2, 124), map(3, 1, 3, 8)],
            )
            .unwrap_err();
        assert_eq!((e.type_, e.code), (0xffff, nxerr::TTMFC_TABLE_FULL));
        assert_eq!(t.mappings().len(), 1);
        t.apply(ttmc::DELETE, &[map(5, 0, 0, 0)]).unwrap();
        t.apply(ttmc::DELETE, &[map(0, 0, 0, 0)]).unwrap();
        assert!(t.mappings().is_empty());
        t.apply(ttmc::ADD, &[map(7, 1, 1, 4), map(9, 1, 2, 4)])
            .unwrap();
        t.apply(ttmc::CLEAR, &[]).unwrap();
        assert!(t.mappings().is_empty());
    }
}
