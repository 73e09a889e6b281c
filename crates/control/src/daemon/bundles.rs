//! OpenFlow 1.4/1.5 bundles on a connection: ovn-controller sends every flow and group
//! change as one bundle (open, add × N, commit, then a barrier).
//!
//! Invariants (OVS's `ofp_bundle_*` and `do_bundle_commit`):
//! * Bundles belong to the connection that opened them and die with it. A connection may
//!   hold [`MAX_BUNDLES`] bundles and [`MAX_BUNDLE_BYTES`] bytes of bundled messages
//!   (`OFPBFC_OUT_OF_BUNDLES`, `OFPBFC_MSG_TOO_MANY` beyond).
//! * An added message is decoded at once (its codec error answers the ADD and the bundle
//!   stays); FLOW_MOD and GROUP_MOD are kept, PORT_MOD and PACKET_OUT (which a commit
//!   could not take back) are `OFPBFC_MSG_UNSUP`.
//! * A commit applies the messages in order to the bridge's rules and groups, and is
//!   atomic whatever the flags (as OVS): on the first refusal the rules and groups are put
//!   back as they were, that message's error goes to the peer (with the message as its
//!   data), then `OFPBFC_MSG_FAILED` answers the commit. Success publishes once, like a
//!   batch of FLOW_MODs, and answers COMMIT_REPLY.

use ferrovs_openflow::bundle::{bct, bf, bfc, bundle_error, BundleAdd, BundleCtrl};
use ferrovs_openflow::{decode, Message, OfError};

use super::openflow::OfConn;
use super::*;

/// Bundles one connection may hold at once.
pub(super) const MAX_BUNDLES: usize = 64;
/// Bytes of bundled messages one connection may hold (every bundle together).
pub(super) const MAX_BUNDLE_BYTES: usize = 64 << 20;

/// An open (or closed, not yet committed) bundle.
#[derive(Debug, Default)]
pub(super) struct Bundle {
    pub(super) flags: u16,
    pub(super) closed: bool,
    /// The messages, decoded, with their bytes (for a commit's error).
    pub(super) msgs: Vec<(Message, Vec<u8>)>,
    pub(super) bytes: usize,
}

impl Daemon {
    /// OFPT_BUNDLE_CONTROL.
    pub(super) fn of_bundle_control(
        &mut self,
        c: &mut OfConn,
        b: BundleCtrl,
        xid: u32,
        msg: &[u8],
    ) {
        let reply = |c: &mut OfConn, type_: u16| {
            // As OVS: the request's id, no flags.
            let m = Message::BundleControl(BundleCtrl {
                bundle_id: b.bundle_id,
                type_,
                flags: 0,
                properties: Vec::new(),
            });
            let bytes = c.encode(&m, xid);
            c.out.extend_from_slice(&bytes);
        };
        if b.flags & bf::TIME != 0 {
            return self.of_refuse(
                c,
                bundle_error(
                    bfc::SCHED_NOT_SUPPORTED,
                    "scheduled bundle commits are not supported",
                ),
                msg,
            );
        }
        let result = match b.type_ {
            bct::OPEN_REQUEST => {
                if c.bundles.remove(&b.bundle_id).is_some() {
                    Err(bundle_error(bfc::BAD_ID, "the bundle id is already open"))
                } else if c.bundles.len() >= MAX_BUNDLES {
                    Err(bundle_error(bfc::OUT_OF_BUNDLES, "too many open bundles"))
                } else {
                    c.bundles.insert(
                        b.bundle_id,
                        Bundle {
                            flags: b.flags,
                            ..Bundle::default()
                        },
                    );
                    Ok(bct::OPEN_REPLY)
                }
            }
            bct::CLOSE_REQUEST => match c.bundles.get_mut(&b.bundle_id) {
                None => Err(bundle_error(bfc::BAD_ID, "no such bundle")),
                Some(x) if x.closed => {
                    c.bundles.remove(&b.bundle_id);
                    Err(bundle_error(bfc::BUNDLE_CLOSED, "the bundle is closed"))
                }
                Some(x) if x.flags != b.flags => {
                    c.bundles.remove(&b.bundle_id);
                    Err(bundle_error(
                        bfc::BAD_FLAGS,
                        "flags differ from the bundle's",
                    ))
                }
                Some(x) => {
                    x.closed = true;
                    Ok(bct::CLOSE_REPLY)
                }
            },
            bct::COMMIT_REQUEST => match c.bundles.remove(&b.bundle_id) {
                None => Err(bundle_error(bfc::BAD_ID, "no such bundle")),
                Some(x) if x.flags != b.flags => Err(bundle_error(
                    bfc::BAD_FLAGS,
                    "flags differ from the bundle's",
                )),
                Some(x) => self.of_bundle_commit(c, x).map(|()| bct::COMMIT_REPLY),
            },
            bct::DISCARD_REQUEST => match c.bundles.remove(&b.bundle_id) {
                None => Err(bundle_error(bfc::BAD_ID, "no such bundle")),
                Some(_) => Ok(bct::DISCARD_REPLY),
            },
            _ => Err(bundle_error(
                bfc::BAD_TYPE,
                "a bundle reply sent to the switch",
            )),
        };
        match result {
            Ok(t) => reply(c, t),
            Err(e) => self.of_refuse(c, e, msg),
        }
    }

    /// OFPT_BUNDLE_ADD_MESSAGE (a bundle that does not exist is opened, as OVS does).
    pub(super) fn of_bundle_add(&mut self, c: &mut OfConn, a: BundleAdd, msg: &[u8]) {
        // The inner message first (its error leaves the bundles as they are).
        let inner = match decode(&a.message) {
            Ok((_, m)) => m,
            Err(e) => return self.of_refuse(c, e, msg),
        };
        if !matches!(inner, Message::FlowMod(_) | Message::GroupMod(_)) {
            return self.of_refuse(
                c,
                bundle_error(
                    bfc::MSG_UNSUP,
                    "only FLOW_MOD and GROUP_MOD can be bundled here",
                ),
                msg,
            );
        }
        let total: usize = c.bundles.values().map(|b| b.bytes).sum();
        if !c.bundles.contains_key(&a.bundle_id) && c.bundles.len() >= MAX_BUNDLES {
            return self.of_refuse(
                c,
                bundle_error(bfc::OUT_OF_BUNDLES, "too many open bundles"),
                msg,
            );
        }
        let bundle = c.bundles.entry(a.bundle_id).or_insert_with(|| Bundle {
            flags: a.flags,
            ..Bundle::default()
        });
        let refusal = if bundle.closed {
            Some(bundle_error(bfc::BUNDLE_CLOSED, "the bundle is closed"))
        } else if bundle.flags != a.flags {
            Some(bundle_error(
                bfc::BAD_FLAGS,
                "flags differ from the bundle's",
            ))
        } else {
            None
        };
        if let Some(e) = refusal {
            c.bundles.remove(&a.bundle_id);
            return self.of_refuse(c, e, msg);
        }
        if total + a.message.len() > MAX_BUNDLE_BYTES {
            return self.of_refuse(
                c,
                bundle_error(bfc::MSG_TOO_MANY, "too many bundled bytes"),
                msg,
            );
        }
        if let Some(bundle) = c.bundles.get_mut(&a.bundle_id) {
            bundle.bytes += a.message.len();
            bundle.msgs.push((inner, a.message));
        }
    }

    /// Applies a bundle's messages, all or none.
    fn of_bundle_commit(&mut self, c: &mut OfConn, b: Bundle) -> Result<(), OfError> {
        let Some(saved) = self.bridges.get(&c.bridge).map(|x| x.rules.clone()) else {
            return Ok(());
        };
        let n = b.msgs.len();
        for (m, bytes) in &b.msgs {
            let r = match m {
                Message::FlowMod(fm) => {
                    self.openflow.counters.flow_mods += 1;
                    self.of_flow_mod(&c.bridge, fm)
                }
                Message::GroupMod(gm) => self.of_group_mod(&c.bridge, gm),
                _ => Ok(()),
            };
            if let Err(e) = r {
                if let Some(x) = self.bridges.get_mut(&c.bridge) {
                    x.rules = saved;
                }
                self.openflow.unpublished.insert(c.bridge.clone());
                self.openflow.unsaved.insert(c.bridge.clone());
                self.openflow.counters.bundles_failed += 1;
                self.of_refuse(c, e, bytes);
                limited!(
                    self.logs,
                    Info,
                    &c.bridge,
                    "mgmt",
                    "OpenFlow bundle of {n} messages not committed: one was refused"
                );
                return Err(bundle_error(
                    bfc::MSG_FAILED,
                    "a bundled message was refused",
                ));
            }
        }
        self.openflow.counters.bundles_committed += 1;
        self.openflow.counters.bundled_messages += n as u64;
        Ok(())
    }
}
