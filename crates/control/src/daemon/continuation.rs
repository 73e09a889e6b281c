//! Continuations: the switch's side of `controller(pause)` and `NXT_RESUME` (OVN's
//! pinctrl: DHCP, DNS, ARP/ND resolution, ICMP errors).
//!
//! A rule's `controller(pause)` freezes the translation ([`ferrovs_flow::Frozen`]: the rest
//! of every action list the pause was inside, innermost first, and the action set) and the
//! packet-in carries it to the controller as `NXPINT_CONTINUATION`, whose nested properties
//! are OVS's `NXCPT_*` ([`cpt`]), laid out as OVS writes them:
//!
//! * `NXCPT_BRIDGE` (16 bytes): our own token, versioned: `"FVC"`, the format version
//!   ([`VERSION`]), this process's random nonce (4 bytes), the bridge's datapath id.
//! * `NXCPT_CONNTRACKED` (a flag) when the packet had been through conntrack.
//! * per frame, innermost first: `NXCPT_TABLE_ID` and `NXCPT_COOKIE` when they differ from
//!   the previous frame's (each first assumed 0), then `NXCPT_ACTIONS` (nested: 4 zero
//!   bytes, then the frame's actions as an OpenFlow 1.5 action list);
//! * `NXCPT_ACTION_SET` (nested, the same) when the action set is not empty.
//!
//! The controller sends it back unchanged in `NXT_RESUME` with the packet (pinctrl rewrites
//! it: the DHCP reply) and the metadata match (pinctrl may set register bits there: the
//! result of `put_dhcp_opts`). The switch trusts none of it ([`decode`]): a token that is
//! not this process's for this bridge is `NXR_STALE` (OVS's answer after a restart: a
//! restart makes every outstanding continuation stale, as an OVS restart does; a hot upgrade
//! hands the nonce to the new daemon in the upgrade state, so its continuations stay good), a
//! property too short or running past its parent `OFPBPC_BAD_LEN`, an unknown one
//! `OFPBPC_BAD_TYPE`, more than [`MAX_FROZEN_FRAMES`] frames `OFPBPC_TOO_MANY`, a register
//! stack or mirrors (which this switch never freezes) `OFPBPC_BAD_VALUE`, a table beyond
//! the last `OFPBRC_BAD_TABLE_ID`, an action list that does not decode, or names a port or
//! group the bridge lacks, the error a FLOW_MOD with it would get. Every refusal is an
//! ERROR to the peer and counted (`openflow.refused` by name, `packet_io.resumes_refused`).
//! A resumed packet runs the frames through the bridge's tables as they are now and the
//! resulting actions are queued to the PMDs as a PACKET_OUT's are.

use std::sync::OnceLock;

use ferrovs_datapath::packet_io::{controller_port, PacketOut, PacketOutActions};
use ferrovs_flow::{
    resolve_frame, ActionSpec, Field, FlowKey, FlowSpec, Frozen, FrozenFrame, Match, PacketInState,
    Pipeline, ResolvedAction, MAX_FROZEN_FRAMES,
};
use ferrovs_openflow::action::{decode_actions_15, encode_action_list};
use ferrovs_openflow::error::{bpc, brc, et};
use ferrovs_openflow::nx_msg::{nx_error, nxerr, PacketIn2};
use ferrovs_openflow::port::{OFPP_ANY, OFPP_CONTROLLER, OFPP_LOCAL, OFPP_MAX};
use ferrovs_openflow::{Action, Field as Of, Instruction, OfError};

use crate::openflow::{PortMap, N_TABLES};

use super::*;

/// `NXCPT_*`: the continuation's properties (OVS's numbering).
pub mod cpt {
    pub const BRIDGE: u16 = 0x8000;
    pub const STACK: u16 = 0x8001;
    pub const MIRRORS: u16 = 0x8002;
    pub const CONNTRACKED: u16 = 0x8003;
    pub const TABLE_ID: u16 = 0x8004;
    pub const COOKIE: u16 = 0x8005;
    pub const ACTIONS: u16 = 0x8006;
    pub const ACTION_SET: u16 = 0x8007;
    pub const ODP_PORT: u16 = 0x8008;
}

/// The continuation format's version (in the bridge token).
pub const VERSION: u8 = 1;
const MAGIC: &[u8; 3] = b"FVC";

static NONCE: OnceLock<u32> = OnceLock::new();

/// The nonce of this process's bridge tokens (what a hot upgrade hands to the next daemon).
pub fn current_nonce() -> u32 {
    nonce()
}

/// Takes the previous daemon's nonce (a hot upgrade's new daemon, before its first
/// packet-in), so the continuations it sent are not stale; false if a nonce was already in
/// use.
pub fn adopt_nonce(n: u32) -> bool {
    NONCE.set(n).is_ok()
}

/// This process's nonce: a continuation from another process (before a restart, or from
/// a daemon older than the nonce's handover) is stale.
fn nonce() -> u32 {
    *NONCE.get_or_init(|| {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        h.finish() as u32
    })
}

/// The `NXCPT_BRIDGE` token of the bridge with datapath id `dpid`.
pub fn bridge_token(dpid: u64) -> [u8; 16] {
    let mut t = [0u8; 16];
    t[..3].copy_from_slice(MAGIC);
    t[3] = VERSION;
    t[4..8].copy_from_slice(&nonce().to_be_bytes());
    t[8..].copy_from_slice(&dpid.to_be_bytes());
    t
}

fn put_prop(out: &mut Vec<u8>, t: u16, value: &[u8]) {
    let start = out.len();
    out.extend_from_slice(&t.to_be_bytes());
    out.extend_from_slice(&((4 + value.len()) as u16).to_be_bytes());
    out.extend_from_slice(value);
    pad8_from(out, start);
}

fn pad8_from(out: &mut Vec<u8>, start: usize) {
    while !(out.len() - start).is_multiple_of(8) {
        out.push(0);
    }
}

/// A nested property: 4 zero bytes, then `actions` (OVS's `ofpprop_start_nested`).
fn put_actions(out: &mut Vec<u8>, t: u16, actions: &[Action]) {
    let start = out.len();
    out.extend_from_slice(&t.to_be_bytes());
    out.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
    encode_action_list(actions, out);
    let len = (out.len() - start) as u16;
    out[start + 2..start + 4].copy_from_slice(&len.to_be_bytes());
    pad8_from(out, start);
}

/// A frame's (or the action set's) actions on the wire, in the context of a packet whose
/// Ethertype and IP protocol `m` matches (which names a rewrite's field, as for a rule).
fn actions_to_of(
    actions: &[ResolvedAction],
    name: &dyn Fn(u32) -> Option<String>,
    ports: &PortMap,
    m: &Match,
) -> Vec<Action> {
    let spec = FlowSpec {
        table: 0,
        priority: 1,
        cookie: 0,
        idle_timeout: 0,
        hard_timeout: 0,
        in_port: None,
        m: *m,
        actions: actions.iter().filter_map(|a| a.to_spec(name)).collect(),
    };
    crate::openflow::instructions_to_of(&spec, ports)
        .into_iter()
        .flat_map(|i| match i {
            Instruction::ApplyActions(v) | Instruction::WriteActions(v) => v,
            _ => Vec::new(),
        })
        .collect()
}

/// The match that gives rewrites of `key`'s packet their OpenFlow field names.
fn proto_match(key: &FlowKey) -> Match {
    let mut m = Match::catchall();
    m.set(Field::EthType, u128::from(key.eth_type()), 0xffff);
    if matches!(key.eth_type(), 0x0800 | 0x86dd) {
        m.set(Field::IpProto, u128::from(key.ip_proto()), 0xff);
    }
    m
}

/// The `NXPINT_CONTINUATION` properties of `frozen` (see the module doc).
pub fn encode(
    token: [u8; 16],
    frozen: &Frozen,
    state: &PacketInState,
    key: &FlowKey,
    name: &dyn Fn(u32) -> Option<String>,
    ports: &PortMap,
) -> Vec<u8> {
    let m = proto_match(key);
    let mut out = Vec::new();
    put_prop(&mut out, cpt::BRIDGE, &token);
    if state.ct_state != 0 {
        put_prop(&mut out, cpt::CONNTRACKED, &[]);
    }
    let (mut table, mut cookie) = (0u8, 0u64);
    for f in &frozen.frames {
        let actions = actions_to_of(&f.actions, name, ports, &m);
        if actions.is_empty() {
            continue;
        }
        if f.table != table {
            put_prop(&mut out, cpt::TABLE_ID, &[f.table]);
            table = f.table;
        }
        if f.cookie != cookie {
            let mut v = vec![0u8; 4];
            v.extend_from_slice(&f.cookie.to_be_bytes());
            put_prop(&mut out, cpt::COOKIE, &v);
            cookie = f.cookie;
        }
        put_actions(&mut out, cpt::ACTIONS, &actions);
    }
    if !frozen.action_set.is_empty() {
        let set = actions_to_of(&frozen.action_set, name, ports, &m);
        put_actions(&mut out, cpt::ACTION_SET, &set);
    }
    out
}

/// A continuation back from a controller, checked: its frames and action set as OpenFlow
/// actions (still to be checked against the bridge, as a FLOW_MOD's).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Thawed {
    /// (table, cookie, actions), innermost first.
    pub frames: Vec<(u8, u64, Vec<Action>)>,
    pub action_set: Vec<Action>,
    pub conntracked: bool,
}

fn bad_len(why: &'static str) -> OfError {
    OfError::new(et::BAD_PROPERTY, bpc::BAD_LEN, why)
}

/// Decodes and checks the continuation `c` against this bridge's `token` (see the module
/// doc for every refusal).
pub fn decode(mut c: &[u8], token: [u8; 16]) -> Result<Thawed, OfError> {
    let stale = || nx_error(nxerr::R_STALE, "the continuation is not this switch's");
    let mut t = Thawed::default();
    let (mut table, mut cookie) = (0u8, 0u64);
    let mut bridge = false;
    while !c.is_empty() {
        if c.len() < 4 {
            return Err(bad_len("continuation property header cut"));
        }
        let ty = u16::from_be_bytes([c[0], c[1]]);
        let len = usize::from(u16::from_be_bytes([c[2], c[3]]));
        let padded = (len + 7) & !7;
        if len < 4 || padded > c.len() {
            return Err(bad_len(
                "continuation property length past the continuation",
            ));
        }
        let v = &c[4..len];
        let nested = || {
            if v.len() < 4 {
                return Err(bad_len("nested continuation property too short"));
            }
            decode_actions_15(&v[4..])
        };
        match ty {
            cpt::BRIDGE => {
                if v.len() != 16 {
                    return Err(bad_len("NXCPT_BRIDGE not 16 bytes"));
                }
                if v != token {
                    return Err(stale());
                }
                bridge = true;
            }
            cpt::STACK => {
                if v.len() > 128 {
                    return Err(bad_len("NXCPT_STACK entry longer than a field"));
                }
                return Err(OfError::new(
                    et::BAD_PROPERTY,
                    bpc::BAD_VALUE,
                    "a register stack in a continuation (this switch freezes none)",
                ));
            }
            cpt::MIRRORS => {
                if v.len() != 4 {
                    return Err(bad_len("NXCPT_MIRRORS not 4 bytes"));
                }
                if v != [0, 0, 0, 0] {
                    return Err(OfError::new(
                        et::BAD_PROPERTY,
                        bpc::BAD_VALUE,
                        "mirrors in a continuation (this switch freezes none)",
                    ));
                }
            }
            cpt::CONNTRACKED => t.conntracked = true,
            cpt::TABLE_ID => {
                table = *v.first().ok_or(bad_len("NXCPT_TABLE_ID without a value"))?;
                if table >= N_TABLES {
                    return Err(OfError::new(
                        et::BAD_REQUEST,
                        brc::BAD_TABLE_ID,
                        "continuation table beyond the last",
                    ));
                }
            }
            cpt::COOKIE => {
                if v.len() != 12 {
                    return Err(bad_len("NXCPT_COOKIE not 12 bytes"));
                }
                let mut b = [0u8; 8];
                b.copy_from_slice(&v[4..]);
                cookie = u64::from_be_bytes(b);
            }
            cpt::ACTIONS => {
                if t.frames.len() >= MAX_FROZEN_FRAMES {
                    return Err(OfError::new(
                        et::BAD_PROPERTY,
                        bpc::TOO_MANY,
                        "more continuation frames than nested resubmits can make",
                    ));
                }
                t.frames.push((table, cookie, nested()?));
            }
            cpt::ACTION_SET => t.action_set = nested()?,
            cpt::ODP_PORT => {
                if v.len() != 4 {
                    return Err(bad_len("NXCPT_ODP_PORT not 4 bytes"));
                }
            }
            _ => {
                return Err(OfError::new(
                    et::BAD_PROPERTY,
                    bpc::BAD_TYPE,
                    "unknown continuation property",
                ))
            }
        }
        c = &c[padded..];
    }
    if !bridge {
        return Err(stale());
    }
    Ok(t)
}

/// The key of a resumed packet: its frame's, with `in_port` (a datapath id), and the
/// pipeline fields of `metadata` (registers, metadata, tunnel id; the ct fields when
/// `conntracked`), masked values written under their masks.
pub fn resumed_key(
    data: &[u8],
    in_port: u32,
    metadata: &[ferrovs_openflow::Oxm],
    conntracked: bool,
) -> FlowKey {
    let mut key = FlowKey::default();
    key.extract_into(data, in_port, None);
    for o in metadata {
        let Some(f) = crate::openflow::regs::of_to_key(o.field) else {
            continue;
        };
        let ct = matches!(
            f,
            Field::CtState | Field::CtZone | Field::CtMark | Field::CtLabel
        );
        if !(f.is_register() || f == Field::Metadata || f == Field::TunId || (ct && conntracked)) {
            continue;
        }
        let mask = o.mask.as_ref().map_or(f.full(), |_| o.mask_u128()) & f.full();
        let old = key.get(f);
        key.set(f, (old & !mask) | (o.value_u128() & mask));
    }
    key
}

impl Daemon {
    /// The `NXPINT_CONTINUATION` of a packet-in from bridge `bridge` (id `bridge_id`) that
    /// paused with `state`, for `data`; `None` when it did not pause.
    pub(super) fn continuation_of(
        &self,
        bridge: &str,
        state: Option<&PacketInState>,
        data: &[u8],
        in_port: u32,
    ) -> Option<Vec<u8>> {
        let state = state?;
        let frozen = state.frozen.as_ref()?;
        let ports = self.of_ports(bridge);
        let name = |id: u32| {
            self.ports
                .values()
                .find(|p| p.id == id && p.bridge == bridge)
                .map(|p| p.cfg.name.clone())
        };
        let mut key = FlowKey::default();
        key.extract_into(data, in_port, None);
        let token = bridge_token(self.bridge_dpid(bridge));
        Some(encode(token, frozen, state, &key, &name, &ports))
    }

    /// `NXT_RESUME` from a peer of `bridge`: checked whole (see the module doc), then the
    /// rest of the frozen translation is run on its packet and queued for a PMD.
    pub(super) fn of_resume(&mut self, bridge: &str, body: &[u8]) -> Result<(), OfError> {
        self.openflow.counters.resumes += 1;
        let r = self.of_resume_checked(bridge, body);
        if r.is_err() {
            self.openflow.counters.resumes_refused += 1;
        }
        r
    }

    fn of_resume_checked(&mut self, bridge: &str, body: &[u8]) -> Result<(), OfError> {
        let pin = PacketIn2::decode(body)?;
        let stale = || nx_error(nxerr::R_STALE, "NXT_RESUME without a continuation");
        let cont = pin.continuation.as_deref().ok_or_else(stale)?;
        let Some(b) = self.bridges.get(bridge) else {
            return Err(stale());
        };
        let bridge_id = b.id;
        let thawed = decode(cont, bridge_token(self.bridge_dpid(bridge)))?;
        let ports = self.of_ports(bridge);
        // The input port, as a packet-out's (absent: the controller).
        let in_no = pin
            .metadata
            .iter()
            .find(|o| matches!(o.field, Of::InPort | Of::NxmInPort))
            .map_or(OFPP_CONTROLLER, |o| {
                let v = o.value_u128() as u32;
                if o.field == Of::NxmInPort {
                    ferrovs_openflow::nicira::port_from_16(v as u16)
                } else {
                    v
                }
            });
        let inp: Arc<Port> = match in_no {
            OFPP_CONTROLLER | OFPP_ANY => Arc::new(controller_port(bridge_id)),
            n if n < OFPP_MAX || n == OFPP_LOCAL => {
                match ports.name(n).and_then(|name| self.ports.get(name)) {
                    Some(p) => p.port.clone(),
                    None => Arc::new(controller_port(bridge_id)),
                }
            }
            _ => {
                return Err(OfError::new(
                    et::BAD_REQUEST,
                    brc::BAD_PORT,
                    "NXT_RESUME: in_port must be a port, LOCAL or CONTROLLER",
                ))
            }
        };
        let resolve = |name: &str| self.ports.get(name).map(|p| p.id);
        let rules = &self.bridges[bridge].rules;
        let mut frames = Vec::with_capacity(thawed.frames.len());
        for (table, cookie, actions) in &thawed.frames {
            let specs = specs_of(actions, &ports)?;
            if rules.missing_group(&spec_with(specs.clone())).is_some() {
                return Err(bad_group());
            }
            frames.push(FrozenFrame {
                table: *table,
                cookie: *cookie,
                actions: resolve_frame(&specs, *table, *cookie, &resolve),
            });
        }
        let set = specs_of(&thawed.action_set, &ports)?;
        if rules.missing_group(&spec_with(set.clone())).is_some() {
            return Err(bad_group());
        }
        let frozen = Frozen {
            frames,
            action_set: resolve_frame(&set, 0, 0, &resolve)
                .into_iter()
                .filter(|a| !matches!(a, ResolvedAction::Drop))
                .collect(),
        };
        if pin.packet.len() < 14 {
            // Not even an Ethernet header: nothing a port could send (as a packet-out).
            self.openflow.counters.packet_outs_dropped += 1;
            return Ok(());
        }
        let key = resumed_key(&pin.packet, inp.id, &pin.metadata, thawed.conntracked);
        let p = match &self.bridges[bridge].pipeline {
            Some(p) => p.clone(),
            None => Arc::new(Pipeline::default()),
        };
        let actions = p.resume(&key, &frozen).actions;
        let queued = self.datapath.packet_out().push(PacketOut {
            bridge: bridge_id,
            inp,
            data: pin.packet,
            actions: PacketOutActions::Actions(actions),
        });
        match queued {
            Ok(()) => {
                for p in &self.pmds {
                    p.wake();
                }
            }
            Err(e) => {
                self.openflow.counters.packet_outs_dropped += 1;
                limited!(self.logs, Warn, bridge, "resume", "NXT_RESUME: {e}");
            }
        }
        Ok(())
    }
}

/// A frame's OpenFlow actions as rule actions (checked as a FLOW_MOD's apply-actions).
fn specs_of(actions: &[Action], ports: &PortMap) -> Result<Vec<ActionSpec>, OfError> {
    crate::openflow::actions_from_of(&[Instruction::ApplyActions(actions.to_vec())], ports)
}

fn spec_with(actions: Vec<ActionSpec>) -> FlowSpec {
    FlowSpec {
        table: 0,
        priority: 1,
        cookie: 0,
        idle_timeout: 0,
        hard_timeout: 0,
        in_port: None,
        m: Match::catchall(),
        actions,
    }
}

fn bad_group() -> OfError {
    OfError::new(
        et::BAD_ACTION,
        ferrovs_openflow::error::bac::BAD_OUT_GROUP,
        "continuation: a group this bridge does not have",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ports() -> PortMap {
        PortMap::new("br0", [(1u16, "vm1"), (2, "vm2")])
    }

    fn name(id: u32) -> Option<String> {
        match id {
            10 => Some("vm1".into()),
            11 => Some("vm2".into()),
            _ => None,
        }
    }

    fn frozen() -> (Frozen, PacketInState) {
        let resolve = |n: &str| match n {
            "vm1" => Some(10),
            "vm2" => Some(11),
            _ => None,
        };
        let f = ferrovs_flow::parse_flow(
            "ip,actions=load:0x7->NXM_NX_REG2[],resubmit(,29),output:vm2,set_field:0x5/0xff->reg3",
        )
        .unwrap();
        let outer = ferrovs_flow::parse_flow("actions=output:vm1").unwrap();
        let fz = Frozen {
            frames: vec![
                FrozenFrame {
                    table: 28,
                    cookie: 0x05d3_ef89,
                    actions: resolve_frame(&f.actions, 28, 0x05d3_ef89, &resolve),
                },
                FrozenFrame {
                    table: 0,
                    cookie: 0,
                    actions: resolve_frame(&outer.actions, 0, 0, &resolve),
                },
            ],
            action_set: resolve_frame(&outer.actions, 0, 0, &resolve),
        };
        (fz, PacketInState::default())
    }

    fn udp_key() -> FlowKey {
        let mut k = FlowKey::default();
        k.set(Field::EthType, 0x0800);
        k.set(Field::IpProto, 17);
        k
    }

    #[test]
    fn a_continuation_round_trips_in_ovss_layout() {
        let (fz, st) = frozen();
        let token = bridge_token(0x1234);
        let c = encode(token, &fz, &st, &udp_key(), &name, &ports());
        // OVS's layout: the bridge first, then table id, cookie and actions per frame.
        assert_eq!(&c[..4], &[0x80, 0x00, 0x00, 0x14]);
        assert_eq!(&c[4..7], b"FVC");
        let t = decode(&c, token).unwrap();
        assert_eq!(t.frames.len(), 2);
        assert_eq!((t.frames[0].0, t.frames[0].1), (28, 0x05d3_ef89));
        assert_eq!((t.frames[1].0, t.frames[1].1), (0, 0));
        assert!(!t.conntracked);
        // Back to the same resolved frames.
        let resolve = |n: &str| match n {
            "vm1" => Some(10),
            "vm2" => Some(11),
            _ => None,
        };
        for (i, (table, cookie, actions)) in t.frames.iter().enumerate() {
            let specs = specs_of(actions, &ports()).unwrap();
            assert_eq!(
                resolve_frame(&specs, *table, *cookie, &resolve),
                fz.frames[i].actions,
                "frame {i}"
            );
        }
        let set = specs_of(&t.action_set, &ports()).unwrap();
        assert_eq!(resolve_frame(&set, 0, 0, &resolve), fz.action_set);
    }

    #[test]
    fn hostile_continuations_are_refused_with_ovss_codes() {
        let (fz, st) = frozen();
        let token = bridge_token(0x1234);
        let good = encode(token, &fz, &st, &udp_key(), &name, &ports());
        let code = |c: &[u8]| {
            let e = decode(c, token).unwrap_err();
            (e.type_, e.code)
        };
        let stale = (et::EXPERIMENTER, nxerr::R_STALE);
        // Another bridge, another process (nonce), another version, no bridge at all.
        assert_eq!(
            decode(&good, bridge_token(0x1235))
                .map(|_| ())
                .unwrap_err()
                .code,
            nxerr::R_STALE
        );
        for byte in [3usize + 4, 4 + 4, 15 + 4] {
            let mut c = good.clone();
            c[byte] ^= 1;
            assert_eq!(code(&c), stale, "byte {byte}");
        }
        assert_eq!(code(&good[24..]), stale);
        // Every truncation: refused (a cut property), never a panic.
        for n in 1..good.len() {
            if decode(&good[..n], token).is_ok() {
                // Cut at a property boundary: fewer frames, still ours.
                assert_eq!(n % 8, 0);
            }
        }
        assert_eq!(code(&good[..good.len() - 1]).1, bpc::BAD_LEN);
        // An action list that does not decode (an unknown action type).
        let mut c = good[..24].to_vec();
        c.extend_from_slice(&[
            0x80, 0x06, 0x00, 0x10, 0, 0, 0, 0, 0x00, 0x63, 0x00, 0x08, 0, 0, 0, 0,
        ]);
        assert_eq!(
            code(&c),
            (et::BAD_ACTION, ferrovs_openflow::error::bac::BAD_TYPE)
        );
        // A table beyond the last.
        let mut c = good[..24].to_vec();
        c.extend_from_slice(&[0x80, 0x04, 0x00, 0x05, 0xff, 0, 0, 0]);
        assert_eq!(code(&c), (et::BAD_REQUEST, brc::BAD_TABLE_ID));
        // A register stack; mirrors.
        let mut c = good[..24].to_vec();
        c.extend_from_slice(&[0x80, 0x01, 0x00, 0x08, 0, 0, 0, 1]);
        assert_eq!(code(&c), (et::BAD_PROPERTY, bpc::BAD_VALUE));
        let mut c = good[..24].to_vec();
        c.extend_from_slice(&[0x80, 0x02, 0x00, 0x08, 0, 0, 0, 1]);
        assert_eq!(code(&c), (et::BAD_PROPERTY, bpc::BAD_VALUE));
        // An unknown property.
        let mut c = good[..24].to_vec();
        c.extend_from_slice(&[0x80, 0x09, 0x00, 0x04, 0, 0, 0, 0]);
        assert_eq!(code(&c), (et::BAD_PROPERTY, bpc::BAD_TYPE));
        // Huge: more frames than nested resubmits can make.
        let mut c = good[..24].to_vec();
        for _ in 0..=MAX_FROZEN_FRAMES {
            // An empty action list.
            c.extend_from_slice(&[0x80, 0x06, 0x00, 0x08, 0, 0, 0, 0]);
        }
        assert_eq!(code(&c), (et::BAD_PROPERTY, bpc::TOO_MANY));
        // Every single-byte corruption is refused or decodes; none panics.
        for i in 0..good.len() {
            for x in [0x01u8, 0x80, 0xff] {
                let mut c = good.clone();
                c[i] ^= x;
                let _ = decode(&c, token);
            }
        }
    }

    #[test]
    fn a_resumed_key_takes_the_registers_and_metadata_of_the_message() {
        use ferrovs_openflow::Oxm;
        let frame = [0u8; 60];
        let md = vec![
            Oxm::exact(Of::InPort, 1),
            Oxm::exact(Of::Metadata, 3),
            Oxm::exact(Of::Reg14, 1),
            // pinctrl's put_dhcp_opts result: one bit of reg0, as OVS 1.5 writes it.
            Oxm::masked(Of::Xreg0, 1 << 35, 1 << 35),
            Oxm::exact(Of::CtState, 0x21),
        ];
        let k = resumed_key(&frame, 10, &md, false);
        assert_eq!(k.get(Field::Metadata), 3);
        assert_eq!(k.get(Field::REGS[14]), 1);
        assert_eq!(k.get(Field::REGS[0]), 8);
        assert_eq!(k.get(Field::CtState), 0, "not conntracked");
        assert_eq!(k.in_port(), 10);
        let k = resumed_key(&frame, 10, &md, true);
        assert_eq!(k.get(Field::CtState), 0x21);
    }
}
