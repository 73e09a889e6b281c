//! `ferrovs trace` (OVS's `ofproto/trace`): where a packet would go through a bridge's
//! current rules, and why. Runs on the control thread against the published pipeline with
//! the translation the datapath's upcall runs (`ferrovs_flow::trace`), the learning
//! bridge's decision without learning (`l2::predict`) and the recirculated key the datapath
//! builds (`set_ct_fields`) with the `ct_state` the user assumes (`--ct-next`). It changes
//! nothing: no MAC learned, no counter credited, no connection tracked or committed, no
//! learned rule added, no megaflow installed.

use ferrovs_flow::ct::{self as fct, CtAction};
use ferrovs_flow::trace::{self as ftrace, Pass, Step};
use ferrovs_flow::{DpAction, Field, FlowKey, XlateError};
use ferrovs_proto::reply::{Trace, TracePass, TraceStep};

use super::*;

/// Longest frame a trace takes (the largest a port receives).
const MAX_FRAME: usize = 65535;

/// `ct_state` a recirculating `ct()` is assumed to give past the `--ct-next` list (OVS's
/// default for `ofproto/trace`).
const DEFAULT_CT_NEXT: u8 = fct::state::TRK | fct::state::NEW;

/// Parses `trk,est` (also `+trk+est`, `trk|est`) into `ct_state` bits.
pub(crate) fn parse_ct_state(s: &str) -> Result<u8, String> {
    let mut bits = 0u8;
    for name in s
        .split([',', '|', '+'])
        .map(str::trim)
        .filter(|x| !x.is_empty())
    {
        let (b, _) = fct::state::NAMES
            .iter()
            .find(|(_, n)| n.eq_ignore_ascii_case(name))
            .ok_or_else(|| {
                format!(
                    "bad ct state '{name}' in '{s}' (one of new, est, rel, rpl, inv, trk, snat, dnat)"
                )
            })?;
        bits |= b;
    }
    if bits == 0 {
        return Err(format!("empty ct state '{s}'"));
    }
    Ok(bits)
}

/// `trk,new` for the bits.
fn ct_state_text(bits: u8) -> String {
    let v: Vec<&str> = fct::state::NAMES
        .iter()
        .filter(|(b, _)| bits & b != 0)
        .map(|(_, n)| *n)
        .collect();
    if v.is_empty() {
        "0".into()
    } else {
        v.join(",")
    }
}

/// Decodes a frame given in hex (spaces, colons and a `0x` prefix allowed).
pub(crate) fn decode_hex(s: &str) -> Result<Vec<u8>, String> {
    let s = s.trim();
    let s = s
        .strip_prefix("0x")
        .or_else(|| s.strip_prefix("0X"))
        .unwrap_or(s);
    let digits: Vec<(usize, u8)> = s
        .bytes()
        .enumerate()
        .filter(|(_, c)| !matches!(c, b' ' | b':' | b'\n' | b'\t' | b'\r'))
        .collect();
    if digits.is_empty() {
        return Err("empty packet".into());
    }
    if digits.len() > 2 * MAX_FRAME {
        return Err(format!("packet longer than {MAX_FRAME} bytes"));
    }
    if !digits.len().is_multiple_of(2) {
        return Err(format!(
            "odd number of hex digits ({}): a byte is two",
            digits.len()
        ));
    }
    let val = |(i, c): (usize, u8)| -> Result<u8, String> {
        (c as char)
            .to_digit(16)
            .map(|d| d as u8)
            .ok_or_else(|| format!("'{}' at offset {i} is not a hex digit", c as char))
    };
    digits
        .chunks(2)
        .map(|p| Ok(val(p[0])? << 4 | val(p[1])?))
        .collect()
}

/// The Ethernet header of the packet a key describes (what NORMAL reads: addresses,
/// outer VLAN tag, Ethertype), padded to a minimal frame.
fn frame_of(k: &FlowKey) -> Vec<u8> {
    let mut f = Vec::with_capacity(64);
    f.extend_from_slice(&(k.get(Field::EthDst) as u64).to_be_bytes()[2..]);
    f.extend_from_slice(&(k.get(Field::EthSrc) as u64).to_be_bytes()[2..]);
    let tci = k.get(Field::VlanTci) as u16;
    if tci & ferrovs_flow::key::VLAN_CFI != 0 {
        f.extend_from_slice(&0x8100u16.to_be_bytes());
        f.extend_from_slice(&(tci & !ferrovs_flow::key::VLAN_CFI).to_be_bytes());
    }
    f.extend_from_slice(&(k.get(Field::EthType) as u16).to_be_bytes());
    f.resize(60, 0);
    f
}

/// What a trace builds its reply from.
struct Ctx<'a> {
    names: HashMap<u32, &'a str>,
    snap: Arc<dp::Snapshot>,
    bridge_id: u32,
    in_port: u32,
}

impl Ctx<'_> {
    fn name(&self, id: u32) -> String {
        self.names
            .get(&id)
            .map_or_else(|| id.to_string(), |n| n.to_string())
    }

    /// Every port of the bridge but the input (a flood), as the datapath's snapshot has
    /// them, filtered by `keep`.
    fn flood(&self, keep: impl Fn(&dp::Port) -> bool) -> Vec<String> {
        let Some(b) = self.snap.bridge(self.bridge_id) else {
            return Vec::new();
        };
        b.ports
            .iter()
            .filter(|&&p| p != self.in_port)
            .filter(|&&p| self.snap.port(p).is_some_and(|x| keep(x)))
            .map(|&p| self.name(p))
            .collect()
    }

    /// NORMAL's decision for the packet `k` describes (see `l2::predict`): the words, the
    /// ports, and the drop reason.
    fn normal(&self, k: &FlowKey, now: u32) -> (String, Vec<String>, Option<String>) {
        let (Some(b), Some(inp)) = (
            self.snap.bridge(self.bridge_id),
            self.snap.port(self.in_port),
        ) else {
            return ("the bridge or port is gone".into(), Vec::new(), None);
        };
        let c = dp::l2::predict(&self.snap, b, inp, &frame_of(k), now);
        let dst = ferrovs_packet::mac_to_string(k.get(Field::EthDst) as u64);
        match c.decision {
            dp::l2::Decision::Unicast(p) => (
                format!("{dst} learned on {}, vlan {}", self.name(p), c.vlan),
                vec![self.name(p)],
                None,
            ),
            dp::l2::Decision::Flood => {
                let why = if ferrovs_packet::is_multicast(k.get(Field::EthDst) as u64) {
                    "multicast"
                } else {
                    "not learned"
                };
                (
                    format!("{dst} {why}: flood, vlan {}", c.vlan),
                    self.flood(|o| o.vlan.carries(c.vlan)),
                    None,
                )
            }
            dp::l2::Decision::Drop(r) => (
                format!("drop: {}", r.name()),
                Vec::new(),
                Some(format!("NORMAL: {}", r.name())),
            ),
        }
    }
}

impl Daemon {
    /// `ferrovs trace` (see the module doc).
    pub(super) fn trace(
        &self,
        bridge: &str,
        flow: Option<&str>,
        packet: Option<&str>,
        in_port: Option<&str>,
        ct_next: &[String],
    ) -> Result<Trace, ConfigError> {
        let bad = |m: String| ConfigError::Invalid(m);
        let b = self
            .bridges
            .get(bridge)
            .ok_or_else(|| bad(format!("no bridge named {bridge}")))?;
        let port_of = |name: &str| -> Result<&PortState, ConfigError> {
            self.ports
                .get(name)
                .filter(|p| p.bridge == bridge)
                .or_else(|| {
                    let no: u16 = name.parse().ok()?;
                    self.ports
                        .values()
                        .find(|p| p.bridge == bridge && p.ofport == no)
                })
                .ok_or_else(|| bad(format!("no port {name} on bridge {bridge}")))
        };
        let states: Vec<u8> = ct_next
            .iter()
            .map(|s| parse_ct_state(s))
            .collect::<Result<_, _>>()
            .map_err(|e| bad(format!("--ct-next: {e}")))?;
        let (key, inp, frame_len) = match (flow, packet) {
            (Some(f), None) => {
                let filter = ferrovs_flow::parse_filter(f)
                    .map_err(|e| bad(format!("bad flow '{f}': {e}")))?;
                if filter.table.is_some() || filter.priority.is_some() || filter.cookie.is_some() {
                    return Err(bad(format!(
                        "bad flow '{f}': a packet has no table, priority or cookie"
                    )));
                }
                let name = match (filter.in_port.as_deref(), in_port) {
                    (Some(a), Some(b)) if a != b => {
                        return Err(bad(format!(
                            "the flow's in_port={a} and --in-port {b} differ"
                        )))
                    }
                    (Some(a), _) | (None, Some(a)) => a,
                    (None, None) => {
                        return Err(bad("the flow needs in_port=PORT (or --in-port)".into()))
                    }
                };
                let inp = port_of(name)?;
                let mut k = filter.m.key;
                k.set(Field::InPort, u128::from(inp.id));
                (k, inp, None)
            }
            (None, Some(hex)) => {
                let bytes = decode_hex(hex).map_err(|e| bad(format!("bad packet: {e}")))?;
                if bytes.len() < 14 {
                    return Err(bad(format!(
                        "truncated packet: {} bytes, shorter than an Ethernet header (14)",
                        bytes.len()
                    )));
                }
                let name = in_port.ok_or_else(|| bad("a packet needs --in-port PORT".into()))?;
                let inp = port_of(name)?;
                let k = FlowKey::extract(&bytes, inp.id, None);
                // What check_pkt_larger compares: the frame without its VLAN tags.
                let mut tags = 0;
                while bytes
                    .get(12 + 4 * tags..14 + 4 * tags)
                    .is_some_and(|t| matches!(u16::from_be_bytes([t[0], t[1]]), 0x8100 | 0x88a8))
                {
                    tags += 1;
                }
                (k, inp, Some(bytes.len().saturating_sub(4 * tags)))
            }
            (Some(_), Some(_)) => return Err(bad("give a flow or a packet, not both".into())),
            (None, None) => return Err(bad("give a flow or a packet (--packet HEX)".into())),
        };
        let plain_l2 = b.pipeline.is_none();
        let pipeline = match &b.pipeline {
            Some(p) => p.clone(),
            None => {
                let resolve = |n: &str| {
                    self.ports
                        .get(n)
                        .filter(|p| p.bridge == bridge)
                        .map(|p| p.id)
                };
                Arc::new(b.rules.build(&resolve))
            }
        };
        let mut assumed = Vec::new();
        let passes = ftrace::trace(
            &pipeline,
            &key,
            dp::flow::input::MAX_PASSES,
            &mut |at, c, n| {
                let state = states.get(n - 1).copied().unwrap_or(DEFAULT_CT_NEXT);
                assumed.push(state);
                recirculated_key(at, c, key.in_port(), state)
            },
        );
        let ctx = Ctx {
            names: self
                .ports
                .values()
                .map(|p| (p.id, p.cfg.name.as_str()))
                .collect(),
            snap: self.datapath.load(),
            bridge_id: b.id,
            in_port: inp.id,
        };
        let now = self.clock.load(Ordering::Relaxed);
        let mut outputs: Vec<String> = Vec::new();
        let mut normal_drop = None;
        let mut out_passes = Vec::new();
        for (i, pass) in passes.iter().enumerate() {
            let (p, normals, drop) = self.trace_pass(b, &ctx, pass, now, plain_l2);
            if i > 0 {
                let mut p = p;
                p.ct_state = assumed.get(i - 1).map(|s| ct_state_text(*s));
                out_passes.push(p);
            } else {
                out_passes.push(p);
            }
            normal_drop = normal_drop.or(drop);
            let mut normals = normals.into_iter();
            collect_outputs(
                &ctx,
                &pass.translation.actions,
                frame_len,
                &mut normals,
                &mut outputs,
            );
        }
        let drop = if !outputs.is_empty() {
            None
        } else if let Some(e) = passes.iter().find_map(|p| p.translation.error) {
            Some(format!("translation failed: {}", xlate_error(e)))
        } else if passes.len() >= dp::flow::input::MAX_PASSES
            && passes.last().is_some_and(|p| p.recirculation().is_some())
        {
            Some(format!(
                "recirculation limit: more than {} passes",
                dp::flow::input::MAX_PASSES
            ))
        } else if let Some(d) = normal_drop {
            Some(d)
        } else {
            match passes.last().and_then(|p| p.steps.last()) {
                Some(Step::Lookup {
                    table,
                    depth: 0,
                    rule: None,
                    ..
                }) => Some(format!("no rule matched in table {table} (table miss)")),
                _ => Some("dropped by the rules (no output)".into()),
            }
        };
        Ok(Trace {
            bridge: bridge.into(),
            drop,
            flow: crate::flows::format_key(&key, &ctx.names),
            outputs,
            passes: out_passes,
            plain_l2,
        })
    }

    /// One pass as the reply shows it, with the NORMAL decisions (in the order of the
    /// pass's NORMAL actions) and a NORMAL drop's reason.
    fn trace_pass(
        &self,
        b: &BridgeState,
        ctx: &Ctx<'_>,
        pass: &Pass,
        now: u32,
        plain_l2: bool,
    ) -> (TracePass, Vec<Vec<String>>, Option<String>) {
        let mut steps = Vec::new();
        let mut normals = Vec::new();
        let mut drop = None;
        let mut depth_now = 0;
        for s in &pass.steps {
            match s {
                Step::Lookup {
                    table, depth, rule, ..
                } => {
                    depth_now = *depth;
                    let stored = rule.as_ref().and_then(|r| {
                        b.rules
                            .rules()
                            .iter()
                            .find(|s| Arc::ptr_eq(&s.stats, &r.stats))
                    });
                    let (matches, actions) = match stored {
                        Some(s) => {
                            let text = s.spec.to_string();
                            match text.split_once(" actions=") {
                                Some((m, a)) => (Some(m.to_string()), Some(a.to_string())),
                                None => (Some(text), None),
                            }
                        }
                        None => (None, None),
                    };
                    steps.push(TraceStep {
                        actions,
                        cookie: rule.as_ref().map(|r| format!("{:#x}", r.cookie)),
                        depth: *depth,
                        kind: if rule.is_some() { "rule" } else { "miss" }.into(),
                        matches,
                        normal: None,
                        ports: Vec::new(),
                        priority: rule.as_ref().map(|r| r.priority),
                        table: *table,
                    });
                }
                Step::Normal { key } => {
                    let (words, ports, d) = ctx.normal(key, now);
                    drop = drop.or(d);
                    normals.push(ports.clone());
                    steps.push(TraceStep {
                        actions: None,
                        cookie: None,
                        depth: depth_now,
                        kind: "normal".into(),
                        matches: None,
                        normal: Some(words),
                        ports,
                        priority: None,
                        table: steps.last().map_or(0, |s: &TraceStep| s.table),
                    });
                }
            }
        }
        let t = &pass.translation;
        let megaflow = if plain_l2 {
            "none: the bridge switches on the plain L2 path (no megaflow)".into()
        } else {
            let mut k = pass.key;
            for (w, m) in k.0.iter_mut().zip(t.mask.0.iter()) {
                *w &= m;
            }
            megaflow_text(&k, &t.mask, &ctx.names)
        };
        let p = TracePass {
            actions: crate::flows::format_dp_actions(&t.actions, &ctx.names),
            ct_state: None,
            error: t.error.map(xlate_error),
            megaflow,
            recirc_id: pass.key.get(Field::RecircId) as u16,
            steps,
        };
        (p, normals, drop)
    }
}

/// A megaflow as `dump-megaflows` prints its match, with the recirculation id first and
/// the connection-tracking fields it depends on (a recirculated pass's) after.
fn megaflow_text(k: &FlowKey, mask: &FlowKey, names: &HashMap<u32, &str>) -> String {
    let mut parts = vec![format!("recirc_id={:#x}", k.get(Field::RecircId))];
    let rest = crate::flows::format_megaflow(k, mask, names);
    if rest != "(any)" {
        parts.push(rest);
    }
    for (f, name) in [
        (Field::CtState, "ct_state"),
        (Field::CtZone, "ct_zone"),
        (Field::CtMark, "ct_mark"),
        (Field::CtLabel, "ct_label"),
        (Field::CtNwSrc, "ct_nw_src"),
        (Field::CtNwDst, "ct_nw_dst"),
        (Field::CtNwProto, "ct_nw_proto"),
        (Field::CtTpSrc, "ct_tp_src"),
        (Field::CtTpDst, "ct_tp_dst"),
    ] {
        let m = mask.get(f);
        if m == 0 {
            continue;
        }
        let v = k.get(f);
        let mut full = FlowKey::default();
        full.set(f, u128::MAX);
        if m == full.get(f) {
            parts.push(format!("{name}={v:#x}"));
        } else {
            parts.push(format!("{name}={v:#x}/{m:#x}"));
        }
    }
    parts.join(",")
}

fn xlate_error(e: XlateError) -> String {
    match e {
        XlateError::TooDeep => "resubmits nested too deep".into(),
        XlateError::TooManyResubmits => "too many resubmits".into(),
    }
}

/// The key the datapath looks a recirculated packet up with (see `set_ct_fields`), for a
/// tracker that answered `state`: the zone of the action, the mark and label it commits
/// (over those the packet had), and, for a tracked valid IPv4 packet, its own tuple as the
/// connection's original direction (reversed for a reply).
fn recirculated_key(at: &FlowKey, c: &CtAction, in_port: u32, state: u8) -> FlowKey {
    let mut k = *at;
    k.set(Field::InPort, u128::from(in_port));
    for f in [
        Field::CtNwSrc,
        Field::CtNwDst,
        Field::CtNwProto,
        Field::CtTpSrc,
        Field::CtTpDst,
    ] {
        k.set(f, 0);
    }
    let mut mark = at.get(Field::CtMark) as u32;
    let mut label = at.get(Field::CtLabel);
    if c.commit {
        if let Some((v, m)) = c.mark {
            mark = (mark & !m) | (v & m);
        }
        if let Some((v, m)) = c.label {
            label = (label & !m) | (v & m);
        }
    }
    let r = ferrovs_conntrack::CtResult {
        state: ferrovs_conntrack::CtState(state),
        zone: c.zone,
        mark,
        label,
        orig: None,
        tcp_state: None,
        committed: c.commit,
        malformed: None,
        nat_error: None,
    };
    dp::flow::input::set_ct_fields(&mut k, c, c.recirc.unwrap_or(0), &r);
    let v4 = at.get(Field::EthType) == u128::from(ferrovs_flow::key::ETH_IPV4);
    if v4 && state & fct::state::TRK != 0 && state & fct::state::INV == 0 {
        let rpl = state & fct::state::RPL != 0;
        let (s, d) = (at.get(Field::Ipv4Src), at.get(Field::Ipv4Dst));
        let (sp, dp_) = (at.get(Field::TpSrc), at.get(Field::TpDst));
        k.set(Field::CtNwProto, at.get(Field::IpProto));
        k.set(Field::CtNwSrc, if rpl { d } else { s });
        k.set(Field::CtNwDst, if rpl { s } else { d });
        k.set(Field::CtTpSrc, if rpl { dp_ } else { sp });
        k.set(Field::CtTpDst, if rpl { sp } else { dp_ });
    }
    k
}

/// The ports `actions` send to, appended to `out` (each once): a NORMAL's from the
/// decisions `normals` gives in order; a length check's branch by `frame_len` (a flow
/// without a packet: the `smaller` branch).
fn collect_outputs(
    ctx: &Ctx<'_>,
    actions: &[DpAction],
    frame_len: Option<usize>,
    normals: &mut dyn Iterator<Item = Vec<String>>,
    out: &mut Vec<String>,
) {
    let add = |out: &mut Vec<String>, n: String| {
        if !out.contains(&n) {
            out.push(n);
        }
    };
    let on_bridge = |p: u32| {
        ctx.snap
            .bridge(ctx.bridge_id)
            .is_some_and(|b| b.ports.contains(&p))
    };
    for a in actions {
        match a {
            DpAction::Output(p) if on_bridge(*p) && *p != ctx.in_port => add(out, ctx.name(*p)),
            DpAction::InPort => add(out, ctx.name(ctx.in_port)),
            DpAction::Flood => {
                for n in ctx.flood(|_| true) {
                    add(out, n);
                }
            }
            DpAction::Normal => {
                for n in normals.next().unwrap_or_default() {
                    add(out, n);
                }
            }
            DpAction::Controller(_) => add(out, "controller".into()),
            DpAction::CheckPktLen(c) => {
                let larger = frame_len.is_some_and(|l| l > usize::from(c.len));
                let branch = if larger { &c.larger } else { &c.smaller };
                collect_outputs(ctx, branch, frame_len, normals, out);
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_packets_and_ct_states_parse_or_say_why() {
        assert_eq!(decode_hex("0x0a0B ff").unwrap(), vec![0x0a, 0x0b, 0xff]);
        assert_eq!(decode_hex("0a:0b").unwrap(), vec![0x0a, 0x0b]);
        for (bad, why) in [
            ("", "empty packet"),
            ("abc", "odd number of hex digits (3): a byte is two"),
            ("zz", "'z' at offset 0 is not a hex digit"),
        ] {
            assert_eq!(decode_hex(bad).unwrap_err(), why, "{bad}");
        }
        assert!(decode_hex(&"00".repeat(MAX_FRAME + 1))
            .unwrap_err()
            .contains("longer than"));
        assert_eq!(
            parse_ct_state("trk,est").unwrap(),
            fct::state::TRK | fct::state::EST
        );
        assert_eq!(
            parse_ct_state("+trk+new").unwrap(),
            fct::state::TRK | fct::state::NEW
        );
        assert!(parse_ct_state("trk,bogus").unwrap_err().contains("bogus"));
        assert!(parse_ct_state("").is_err());
        assert_eq!(ct_state_text(fct::state::TRK | fct::state::EST), "est,trk");
    }

    #[test]
    fn a_recirculated_key_carries_the_assumed_state_and_the_frozen_registers() {
        let mut at = FlowKey::default();
        at.set(Field::EthType, u128::from(ferrovs_flow::key::ETH_IPV4));
        at.set(Field::IpProto, 6);
        at.set(Field::Ipv4Src, 0x0a00_0001);
        at.set(Field::Ipv4Dst, 0x0a00_0002);
        at.set(Field::TpDst, 80);
        at.set(Field::InPort, 9);
        let c = CtAction {
            zone: 4,
            commit: true,
            force: false,
            nat: Default::default(),
            mark: Some((0x5, 0xf)),
            label: None,
            recirc: Some(3),
            metadata: 0x77,
            regs: [1, 0, 0, 0, 0, 0, 0, 0],
        };
        let k = recirculated_key(&at, &c, 2, fct::state::TRK | fct::state::NEW);
        assert_eq!(k.get(Field::InPort), 2);
        assert_eq!(k.get(Field::RecircId), u128::from(fct::recirc_id(3)));
        assert_eq!(
            k.get(Field::CtState),
            u128::from(fct::state::TRK | fct::state::NEW)
        );
        assert_eq!(k.get(Field::CtZone), 4);
        assert_eq!(k.get(Field::CtMark), 5);
        assert_eq!(k.get(Field::Metadata), 0x77);
        assert_eq!(k.get(Field::CtNwSrc), 0x0a00_0001);
        assert_eq!(k.get(Field::CtTpDst), 80);
    }
}
