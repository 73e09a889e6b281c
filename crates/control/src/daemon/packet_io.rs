//! The asynchronous OpenFlow messages: PACKET_IN (from the datapath's packet-in queue),
//! PACKET_OUT (to the datapath's packet-out queue), and which connection receives which
//! asynchronous message (SET_CONFIG's `miss_send_len`, SET_ASYNC / GET_ASYNC).
//!
//! Invariants:
//! * The PMDs never wait for this thread: packet-ins reach it through the bounded
//!   [`PacketInQueue`] (its eventfd is in the daemon's epoll set), packet-outs leave through
//!   the bounded packet-out queue the PMDs drain ([`dp::packet_io`]). A full queue drops
//!   and counts; a peer whose replies wait unread past the backlog misses packet-ins
//!   (counted), as OVS's connection manager drops them when a controller's queue is full.
//! * Which connection gets an asynchronous message is OVS's rule
//!   (`ofconn_receives_async_msg`): a service connection (the management socket) gets none
//!   until it sets a non-zero `miss_send_len` (how `ovs-ofctl monitor … 65535` asks for
//!   them); then the message's reason must be in the connection's async mask for its role
//!   (master and equal: one mask, slave: the other) — [`OfConn::receives_async`].
//! * A PACKET_OUT is decoded and checked whole before it is queued: a buffer id (this
//!   switch buffers nothing) is `OFPBRC_BUFFER_UNKNOWN`, an input port the bridge does not
//!   have is `OFPBRC_BAD_PORT`, an output port it does not have is `OFPBAC_BAD_OUT_PORT`,
//!   `OFPP_TABLE` beside other actions is `OFPBAC_BAD_OUT_PORT`, a group is refused as a
//!   FLOW_MOD's is. Its actions become datapath actions through a one-rule pipeline, so a
//!   packet-out's `output`, `set_field` or `push_vlan` does exactly what a rule's does.

use ferrovs_datapath::packet_io::{
    controller_port, PacketIn as DpPacketIn, PacketInQueue, PacketOut, PacketOutActions,
    CONTROLLER_PORT,
};
use ferrovs_flow::{ActionSpec, FlowKey, FlowSpec, Match};

use crate::flows::StoredRule;
use ferrovs_openflow::error::{bac, brc, et};
use ferrovs_openflow::message::OFP_NO_BUFFER;

use crate::controller::Role;
use ferrovs_openflow::port::{OFPP_ANY, OFPP_CONTROLLER, OFPP_LOCAL, OFPP_MAX, OFPP_TABLE};
use ferrovs_openflow::{
    Action, AsyncConfig, Field as Of, Instruction, Match as OfMatch, Message, OfError, Oxm,
};

use std::collections::BTreeSet;

use super::openflow::{flush, OfConn, OUT_BACKLOG};
use super::*;

/// The kinds of asynchronous messages (the index into [`AsyncConfig`]'s masks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AsyncKind {
    PacketIn,
    PortStatus,
    FlowRemoved,
}

/// A rule's OpenFlow identity (what a strict FLOW_MOD names): table, priority, input port
/// and match.
pub(super) type RuleId = (u8, u16, Option<String>, Match);

fn rule_id(s: &FlowSpec) -> RuleId {
    (s.table, s.priority, s.in_port.clone(), s.m)
}

/// The pipeline fields of a packet-in's match, as OVS's `flow_get_metadata` puts them:
/// in_port; the tunnel id when the packet came with one; metadata and each register when
/// not 0 (OVN's pinctrl reads its logical ports and datapath there); the ct fields when
/// the packet was tracked.
pub(super) fn packet_in_metadata(
    in_port: u32,
    tun_id: u64,
    state: Option<&ferrovs_flow::PacketInState>,
) -> Vec<Oxm> {
    let mut fields = vec![Oxm::exact(Of::InPort, u128::from(in_port))];
    if tun_id != 0 {
        fields.push(Oxm::exact(Of::TunnelId, u128::from(tun_id)));
    }
    let Some(s) = state else {
        return fields;
    };
    if s.metadata != 0 {
        fields.push(Oxm::exact(Of::Metadata, u128::from(s.metadata)));
    }
    for (i, x) in s.regs.iter().enumerate() {
        for (half, v) in [(0, x >> 32), (1, x & 0xffff_ffff)] {
            if v != 0 {
                fields.push(Oxm::exact(Of::REGS[2 * i + half], u128::from(v)));
            }
        }
    }
    if s.ct_state != 0 {
        fields.push(Oxm::exact(Of::CtState, u128::from(s.ct_state)));
        if s.ct_zone != 0 {
            fields.push(Oxm::exact(Of::CtZone, u128::from(s.ct_zone)));
        }
        if s.ct_mark != 0 {
            fields.push(Oxm::exact(Of::CtMark, u128::from(s.ct_mark)));
        }
        if s.ct_label != 0 {
            fields.push(Oxm::exact(Of::CtLabel, s.ct_label));
        }
    }
    fields
}

/// `OFPRR_*`: why a rule was removed.
const OFPRR_IDLE_TIMEOUT: u8 = 0;
const OFPRR_HARD_TIMEOUT: u8 = 1;
const OFPRR_DELETE: u8 = 2;

/// OVS's default async configuration (`ofputil_async_cfg_default` for OpenFlow 1.3):
/// master/equal get packet-ins of no-match and action, every port status and every
/// flow-removed; slaves get port status only.
pub(super) const DEFAULT_ASYNC: AsyncConfig = AsyncConfig {
    packet_in_mask: [(1 << 0) | (1 << 1), 0],
    port_status_mask: [0x7, 0x7],
    flow_removed_mask: [0x7, 0],
};

/// `OFP_DEFAULT_MISS_SEND_LEN`: a controller connection's `miss_send_len` until it sets one
/// (a service connection's is 0: no asynchronous messages).
#[allow(dead_code)] // for controller connections
pub(super) const DEFAULT_MISS_SEND_LEN: u16 = 128;

impl OfConn {
    /// Whether this connection gets an asynchronous message of `kind` with `reason` (see the
    /// module doc).
    pub(super) fn receives_async(&self, kind: AsyncKind, reason: u8) -> bool {
        if !self.negotiated || self.closing || reason >= 32 {
            return false;
        }
        if self.service && self.miss_send_len == 0 {
            return false;
        }
        let i = usize::from(self.role == Role::Slave);
        let m = match kind {
            AsyncKind::PacketIn => self.async_cfg.packet_in_mask,
            AsyncKind::PortStatus => self.async_cfg.port_status_mask,
            AsyncKind::FlowRemoved => self.async_cfg.flow_removed_mask,
        };
        m[i] & (1 << reason) != 0
    }
}

impl Daemon {
    /// The packet-in queue the bridges' controller actions use, created (and its eventfd
    /// added to the epoll set) on first use; `None` if no eventfd could be made (controller
    /// actions then drop, counted by the datapath as flow drops).
    pub(super) fn packet_in_queue(&mut self) -> Option<Arc<PacketInQueue>> {
        if let Some(q) = &self.openflow.packet_in {
            return Some(q.clone());
        }
        let q = match PacketInQueue::new() {
            Ok(q) => Arc::new(q),
            Err(e) => {
                limited!(
                    self.logs,
                    Warn,
                    "",
                    "packet-in",
                    "packet-in queue: no eventfd: {e}"
                );
                return None;
            }
        };
        let t = self.token(Source::PacketIn, "");
        if self.epoll.add(q.fd(), t, false).is_err() {
            self.tokens.remove(&t);
            return None;
        }
        self.openflow.packet_in = Some(q.clone());
        Some(q)
    }

    /// The packet-in queue's eventfd fired: every waiting packet-in to the connections of
    /// its bridge that receive it. Each connection's output is written (and its epoll
    /// interest updated) once for the whole batch, not once per packet-in.
    pub(super) fn on_packet_in(&mut self) {
        let Some(q) = self.openflow.packet_in.clone() else {
            return;
        };
        let mut touched = BTreeSet::new();
        let mut batch = std::mem::take(&mut self.openflow.packet_in_buf);
        q.take_into(&mut batch);
        for p in batch.drain(..) {
            self.of_packet_in(p, &mut touched);
        }
        self.openflow.packet_in_buf = batch;
        for t in touched {
            if let Some(c) = self.openflow.conns.get_mut(&t) {
                let _ = flush(c);
            }
            self.of_rearm(t);
        }
    }

    /// Appends the PACKET_IN of `p` to the output of every connection that receives it
    /// (their tokens into `touched`).
    fn of_packet_in(&mut self, p: DpPacketIn, touched: &mut BTreeSet<u64>) {
        let Some((bridge, _)) = self.bridges.iter().find(|(_, b)| b.id == p.bridge) else {
            return;
        };
        let bridge = bridge.clone();
        let in_port = if p.in_port == CONTROLLER_PORT {
            OFPP_CONTROLLER
        } else {
            let Some(x) = self
                .ports
                .values()
                .find(|x| x.id == p.in_port && x.bridge == bridge)
            else {
                return;
            };
            if x.cfg.name == bridge {
                OFPP_LOCAL
            } else {
                u32::from(x.ofport)
            }
        };
        // OVS's connmgr: a controller action's id must be the connection's own (both 0 by
        // default).
        let receives = |c: &OfConn| {
            c.bridge == bridge
                && c.controller_id == p.action.controller_id
                && c.receives_async(AsyncKind::PacketIn, p.action.reason)
        };
        if !self.openflow.conns.values().any(receives) {
            return;
        }
        let state = p.action.at.as_deref();
        let fields = packet_in_metadata(in_port, p.tun_id, state);
        let continuation = self.continuation_of(&bridge, state, &p.data, p.in_port);
        let mut msg = super::openflow::Fanout::packet_in(
            Message::PacketIn(ferrovs_openflow::PacketIn {
                buffer_id: OFP_NO_BUFFER,
                total_len: p.total_len,
                reason: p.action.reason,
                table_id: p.action.table_id,
                cookie: p.action.cookie,
                match_: OfMatch { fields },
                data: p.data,
            }),
            p.action.userdata.as_deref().map(<[u8]>::to_vec),
            continuation,
        );
        for (t, c) in self.openflow.conns.iter_mut() {
            if !receives(c) {
                continue;
            }
            if c.out.len() >= OUT_BACKLOG {
                self.openflow.counters.packet_ins_unsent += 1;
                continue;
            }
            if msg.continues(c) {
                self.openflow.counters.continuations_sent += 1;
            }
            let bytes = msg.bytes(c);
            c.out.extend_from_slice(bytes);
            self.openflow.counters.packet_ins_sent += 1;
            touched.insert(*t);
        }
    }

    /// A PACKET_OUT from a peer of `bridge`: checked, then queued for a PMD.
    pub(super) fn of_packet_out(
        &mut self,
        bridge: &str,
        po: &ferrovs_openflow::PacketOut,
    ) -> Result<(), OfError> {
        self.openflow.counters.packet_outs += 1;
        if !po.metadata.is_empty() {
            // OpenFlow 1.5 packet-outs may start the pipeline with metadata or tunnel
            // fields set; the packet-out path starts from in_port alone.
            return Err(OfError::new(
                et::BAD_REQUEST,
                brc::PIPELINE_FIELDS_ONLY,
                "packet-out: pipeline fields other than in_port are not supported yet",
            ));
        }
        if po.buffer_id != OFP_NO_BUFFER {
            return Err(OfError::new(
                et::BAD_REQUEST,
                brc::BUFFER_UNKNOWN,
                "packet-out: this switch buffers no packets (use buffer_id NO_BUFFER)",
            ));
        }
        let ports = self.of_ports(bridge);
        let Some(b) = self.bridges.get(bridge) else {
            return Ok(());
        };
        let bridge_id = b.id;
        let inp: Arc<Port> = match po.in_port {
            OFPP_CONTROLLER | OFPP_ANY => Arc::new(controller_port(bridge_id)),
            n if n < OFPP_MAX || n == OFPP_LOCAL => {
                match ports.name(n).and_then(|name| self.ports.get(name)) {
                    Some(p) => p.port.clone(),
                    None if n == OFPP_LOCAL => Arc::new(controller_port(bridge_id)),
                    None => {
                        return Err(OfError::new(
                            et::BAD_REQUEST,
                            brc::BAD_PORT,
                            "packet-out: in_port is not a port of this bridge",
                        ))
                    }
                }
            }
            _ => {
                return Err(OfError::new(
                    et::BAD_REQUEST,
                    brc::BAD_PORT,
                    "packet-out: in_port must be a port, LOCAL or CONTROLLER",
                ))
            }
        };
        let table = po.actions.iter().any(|a| {
            matches!(
                a,
                Action::Output {
                    port: OFPP_TABLE,
                    ..
                }
            )
        });
        let actions = if table {
            if po.actions.len() != 1 {
                return Err(OfError::new(
                    et::BAD_ACTION,
                    bac::BAD_OUT_PORT,
                    "packet-out: output to TABLE must be the only action",
                ));
            }
            PacketOutActions::Table
        } else {
            let specs = crate::openflow::actions_from_of(
                &[Instruction::ApplyActions(po.actions.clone())],
                &ports,
            )?;
            PacketOutActions::Actions(self.packet_out_actions(bridge, specs, &po.data, &inp)?)
        };
        if po.data.len() < 14 {
            // Not even an Ethernet header: nothing a port could send.
            self.openflow.counters.packet_outs_dropped += 1;
            return Ok(());
        }
        let queued = self.datapath.packet_out().push(PacketOut {
            bridge: bridge_id,
            inp,
            data: po.data.clone(),
            actions,
        });
        match queued {
            Ok(()) => {
                for p in &self.pmds {
                    p.wake();
                }
            }
            Err(e) => {
                self.openflow.counters.packet_outs_dropped += 1;
                limited!(self.logs, Warn, bridge, "packet-out", "packet-out: {e}");
            }
        }
        Ok(())
    }

    /// The datapath actions of a packet-out's `specs` on `data` received on `inp`: their
    /// translation as a rule's actions through the bridge's tables (`resubmit` and
    /// `goto_table` look them up, as OVS). Its groups are the bridge's: one it lacks →
    /// `OFPBAC_BAD_OUT_GROUP` (as OVS).
    fn packet_out_actions(
        &self,
        bridge: &str,
        specs: Vec<ActionSpec>,
        data: &[u8],
        inp: &Port,
    ) -> Result<Vec<ferrovs_flow::DpAction>, OfError> {
        let spec = FlowSpec {
            table: 0,
            priority: 1,
            cookie: 0,
            idle_timeout: 0,
            hard_timeout: 0,
            in_port: None,
            m: Match::catchall(),
            actions: specs,
        };
        // A rule may name a port the bridge does not have yet (OVS accepts it: it does
        // nothing until the port comes); a packet-out is executed now, and its output to
        // a port that is not there is refused, as OVS refuses it.
        if spec.actions.iter().any(|a| {
            matches!(a, ActionSpec::Output(n) if self.ports.get(n).is_none_or(|p| p.bridge != bridge))
        }) {
            return Err(OfError::new(
                et::BAD_ACTION,
                bac::BAD_OUT_PORT,
                "packet-out: an output to a port this bridge does not have",
            ));
        }
        let rules = &self.bridges[bridge].rules;
        if rules.missing_group(&spec).is_some() {
            return Err(OfError::new(
                et::BAD_ACTION,
                bac::BAD_OUT_GROUP,
                "packet-out: a group this bridge does not have",
            ));
        }
        let resolve = |name: &str| self.ports.get(name).map(|p| p.id);
        // A fast_failover bucket of a packet-out's group watches live ports as the
        // pipeline's do.
        let live = |id: u32| self.ports.values().any(|p| p.id == id && self.port_live(p));
        let mut key = FlowKey::default();
        key.extract_into(data, inp.id, None);
        // The bridge's published tables (a `resubmit` goes into them, as OVS), or, for a
        // bridge that switches as plain NORMAL, just its groups.
        let p = match &self.bridges[bridge].pipeline {
            Some(p) => p.clone(),
            None => Arc::new(Pipeline::build_with_groups(
                std::iter::empty(),
                rules.groups().values().map(|g| (&g.spec, g.stats.clone())),
                &resolve,
                &live,
            )),
        };
        Ok(p.translate_actions(&key, &spec.actions, &resolve).actions)
    }

    /// Before a FLOW_MOD: the rules a delete may remove that asked for a FLOW_REMOVED
    /// (nothing to copy unless some did).
    pub(super) fn of_flow_rem_candidates(
        &self,
        bridge: &str,
        fm: &ferrovs_openflow::FlowMod,
    ) -> Vec<StoredRule> {
        use ferrovs_openflow::message::fc;
        if !matches!(fm.command, fc::DELETE | fc::DELETE_STRICT) {
            return Vec::new();
        }
        let Some(set) = self
            .openflow
            .send_flow_rem
            .get(bridge)
            .filter(|s| !s.is_empty())
        else {
            return Vec::new();
        };
        let Some(b) = self.bridges.get(bridge) else {
            return Vec::new();
        };
        b.cache.push_stats();
        b.rules
            .rules()
            .iter()
            .filter(|r| set.contains(&rule_id(&r.spec)))
            .cloned()
            .collect()
    }

    /// After a FLOW_MOD was applied: an add notes whether the rule wants a FLOW_REMOVED;
    /// a delete sends one (`OFPRR_DELETE`) for each rule of `before` that is gone.
    pub(super) fn of_flow_mod_applied(
        &mut self,
        bridge: &str,
        fm: &ferrovs_openflow::FlowMod,
        before: Vec<StoredRule>,
    ) {
        use ferrovs_openflow::message::{fc, ff};
        if fm.command == fc::ADD {
            let ports = self.of_ports(bridge);
            let Ok(spec) = crate::openflow::rule_from_flow_mod(fm, &ports) else {
                return;
            };
            let set = self
                .openflow
                .send_flow_rem
                .entry(bridge.to_string())
                .or_default();
            if fm.flags & ff::SEND_FLOW_REM != 0 {
                set.insert(rule_id(&spec));
            } else {
                set.remove(&rule_id(&spec));
            }
            return;
        }
        if before.is_empty() {
            return;
        }
        let Some(b) = self.bridges.get(bridge) else {
            return;
        };
        let left: std::collections::HashSet<RuleId> =
            b.rules.rules().iter().map(|r| rule_id(&r.spec)).collect();
        for r in before {
            if !left.contains(&rule_id(&r.spec)) {
                self.of_flow_removed(bridge, &r, OFPRR_DELETE);
            }
        }
    }

    /// `OFPFF_SEND_FLOW_REM` if `spec` was added with it, else 0 (flow stats' flags).
    pub(super) fn of_flow_rem_flag(&self, bridge: &str, spec: &FlowSpec) -> u16 {
        let asked = self
            .openflow
            .send_flow_rem
            .get(bridge)
            .is_some_and(|s| !s.is_empty() && s.contains(&rule_id(spec)));
        if asked {
            ferrovs_openflow::message::ff::SEND_FLOW_REM
        } else {
            0
        }
    }

    /// The revalidator removed `gone` (timeouts): FLOW_REMOVED for those that asked.
    pub(super) fn of_rules_expired(
        &mut self,
        bridge: &str,
        gone: &[(StoredRule, crate::flows::Expiry)],
    ) {
        if self
            .openflow
            .send_flow_rem
            .get(bridge)
            .is_none_or(|s| s.is_empty())
        {
            return;
        }
        for (r, why) in gone {
            let reason = match why {
                crate::flows::Expiry::Idle => OFPRR_IDLE_TIMEOUT,
                crate::flows::Expiry::Hard => OFPRR_HARD_TIMEOUT,
            };
            self.of_flow_removed(bridge, r, reason);
        }
    }

    /// FLOW_REMOVED of `r` (if it asked for one) to the connections of `bridge` that
    /// receive it; the rule is forgotten.
    fn of_flow_removed(&mut self, bridge: &str, r: &StoredRule, reason: u8) {
        let id = rule_id(&r.spec);
        let asked = self
            .openflow
            .send_flow_rem
            .get_mut(bridge)
            .is_some_and(|s| s.remove(&id));
        if !asked {
            return;
        }
        let ports = self.of_ports(bridge);
        let age = r.installed.elapsed();
        let s = &r.spec;
        let mut msg =
            super::openflow::Fanout::new(Message::FlowRemoved(ferrovs_openflow::FlowRemoved {
                cookie: s.cookie,
                priority: s.priority,
                reason,
                table_id: s.table,
                duration_sec: age.as_secs() as u32,
                duration_nsec: age.subsec_nanos(),
                idle_timeout: s.idle_timeout,
                hard_timeout: s.hard_timeout,
                packet_count: r.stats.packets.load(Ordering::Relaxed),
                byte_count: r.stats.bytes.load(Ordering::Relaxed),
                match_: crate::openflow::match_to_of(&s.m, s.in_port.as_deref(), &ports),
            }));
        let tokens: Vec<u64> = self
            .openflow
            .conns
            .iter()
            .filter(|(_, c)| c.bridge == bridge && c.receives_async(AsyncKind::FlowRemoved, reason))
            .map(|(t, _)| *t)
            .collect();
        for t in tokens {
            if let Some(c) = self.openflow.conns.get_mut(&t) {
                if c.out.len() >= OUT_BACKLOG {
                    continue;
                }
                let bytes = msg.bytes(c);
                c.out.extend_from_slice(bytes);
                self.openflow.counters.flow_removed_sent += 1;
                let _ = flush(c);
            }
            self.of_rearm(t);
        }
    }

    /// The counters `ferrovs show --json` reports (`None` before any packet-in queue or
    /// packet-out existed).
    pub(super) fn packet_io_status(&self) -> Option<ferrovs_proto::reply::PacketIoStatus> {
        let c = &self.openflow.counters;
        if self.openflow.packet_in.is_none() && c.packet_outs == 0 {
            return None;
        }
        let pin = self
            .openflow
            .packet_in
            .as_ref()
            .map(|q| q.counters())
            .unwrap_or_default();
        let pout = self.datapath.packet_out().counters();
        Some(ferrovs_proto::reply::PacketIoStatus {
            packet_ins_queued: pin.queued,
            packet_ins_dropped: pin.dropped,
            packet_ins_sent: c.packet_ins_sent,
            packet_ins_unsent: c.packet_ins_unsent,
            packet_outs: c.packet_outs,
            packet_outs_executed: pout.executed,
            packet_outs_dropped: c.packet_outs_dropped,
            resumes: c.resumes,
            resumes_refused: c.resumes_refused,
            continuations_sent: c.continuations_sent,
        })
    }

    /// SET_ASYNC, GET_ASYNC_REQUEST, GET_CONFIG_REQUEST and SET_CONFIG of a connection:
    /// the reply, if any.
    pub(super) fn of_async_config(c: &mut OfConn, m: &Message) -> Option<Message> {
        match m {
            Message::SetAsync(a) => {
                c.async_cfg = *a;
                None
            }
            Message::GetAsyncRequest => Some(Message::GetAsyncReply(c.async_cfg)),
            Message::GetConfigRequest => {
                Some(Message::GetConfigReply(ferrovs_openflow::SwitchConfig {
                    flags: 0,
                    miss_send_len: c.miss_send_len,
                }))
            }
            Message::SetConfig(s) => {
                // Fragments are treated normally whatever the flags say.
                c.miss_send_len = s.miss_send_len;
                None
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_async_config_is_ovss() {
        // master/equal: packet-in no_match|action, port-status add|delete|modify,
        // flow-removed idle|hard|delete; slave: port-status only.
        assert_eq!(DEFAULT_ASYNC.packet_in_mask, [3, 0]);
        assert_eq!(DEFAULT_ASYNC.port_status_mask, [7, 7]);
        assert_eq!(DEFAULT_ASYNC.flow_removed_mask, [7, 0]);
    }
}
