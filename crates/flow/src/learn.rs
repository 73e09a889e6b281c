//! The `learn(...)` action (OVS's `NXAST_LEARN`): a rule that, when a packet's translation
//! reaches it, adds (or replaces) a rule in a table, built from the packet's fields.
//!
//! ```text
//! learn(table=69,delete_learned,cookie=0x1,OXM_OF_METADATA[],eth_type=0x800,
//!       NXM_OF_IP_SRC[],ip_dst=10.0.0.100,nw_proto=6,NXM_OF_TCP_SRC[]=NXM_OF_TCP_DST[],
//!       load:0x1->NXM_NX_REG10[7])
//! ```
//! (OVN's hairpin-reply learning, one line). Each item of the list is one flow_mod_spec:
//! a source (bits of the packet's key, or an immediate value) and a destination (bits the
//! new rule matches, a `load` among its actions, or an `output` to the port number the
//! source holds).
//!
//! **When it runs.** As in OVS 2.4+, learning happens when a packet is translated (on an
//! upcall: the slow path), and what is learned is not visible to lookups later in the same
//! translation. The translation does not touch the tables: it lists what it learned in
//! [`crate::Translation::learned`]; the datapath hands that list to the control plane,
//! which adds the rules (`docs/openflow.md`, learn). A cached megaflow does not learn again
//! until it is translated again (OVS relearns on revalidation, which also refreshes a
//! learned rule's idle timeout: ferrovs's learned rules age from when they were learned).
//!
//! **Megaflows.** Every source bit joins the translation's mask (OVS's `learn_mask`):
//! packets that would learn a different rule never share a megaflow.
//!
//! Pure data and functions, no I/O; parsing and printing in ovs-ofctl's syntax are in
//! `spec::learn`.

use crate::key::{Field, FlowKey, SubField};
use crate::matching::Match;

/// `NX_LEARN_F_SEND_FLOW_REM`: the learned rule has `send_flow_rem`.
pub const F_SEND_FLOW_REM: u16 = 1;
/// `NX_LEARN_F_DELETE_LEARNED`: deleting the learning rule deletes what it learned.
pub const F_DELETE_LEARNED: u16 = 2;

/// Most items in one `learn` (a bound on the per-packet work; OVN uses seven).
pub const MAX_ITEMS: usize = 64;

/// Where an item's value comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LearnSrc {
    /// Bits of the packet's key as the translation has it at the action.
    Field(SubField),
    /// A constant (in its low bits; as wide as the destination).
    Imm(u128),
}

/// Where an item's value goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LearnDst {
    /// The learned rule matches these bits on the value.
    Match(SubField),
    /// The learned rule loads the value into these bits (`load:...->DST`).
    Load(SubField),
    /// The learned rule outputs to the port number the value is (`output:SRC`).
    Output,
}

/// One flow_mod_spec. Invariant (kept by the parsers): the source is as wide as the
/// destination (`Output`: a field source of at most 32 bits), and an immediate has no bit
/// above that width.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LearnItem {
    pub src: LearnSrc,
    pub dst: LearnDst,
}

impl LearnItem {
    /// Its width in bits (`n_bits` on the wire).
    pub fn nbits(&self) -> u16 {
        match (self.src, self.dst) {
            (_, LearnDst::Match(d) | LearnDst::Load(d)) => d.nbits,
            (LearnSrc::Field(s), LearnDst::Output) => s.nbits,
            (LearnSrc::Imm(_), LearnDst::Output) => 16,
        }
    }
}

/// `learn(...)` as written.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LearnSpec {
    /// The table the learned rule goes into (0..=254).
    pub table: u8,
    pub idle_timeout: u16,
    pub hard_timeout: u16,
    pub fin_idle_timeout: u16,
    pub fin_hard_timeout: u16,
    pub priority: u16,
    pub cookie: u64,
    /// `F_*` bits.
    pub flags: u16,
    /// `NXAST_LEARN2`'s limit on the rules this action learned (0: none).
    pub limit: u32,
    pub items: Vec<LearnItem>,
}

impl Default for LearnSpec {
    /// ovs-ofctl's defaults: table 1, permanent, priority 32768.
    fn default() -> LearnSpec {
        LearnSpec {
            table: 1,
            idle_timeout: 0,
            hard_timeout: 0,
            fin_idle_timeout: 0,
            fin_hard_timeout: 0,
            priority: crate::spec::DEFAULT_PRIORITY,
            cookie: 0,
            flags: 0,
            limit: 0,
            items: Vec::new(),
        }
    }
}

/// A rule a translation learned: what the control plane adds (as OVS: a strict modify,
/// adding when absent, replacing the actions of the rule with the same match and priority
/// when present).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Learned {
    pub table: u8,
    pub priority: u16,
    pub idle_timeout: u16,
    pub hard_timeout: u16,
    pub cookie: u64,
    pub flags: u16,
    pub m: Match,
    /// The learned rule's loads: (field, value, mask), in item order.
    pub loads: Vec<(Field, u128, u128)>,
    /// The learned rule's outputs (OpenFlow port numbers), in item order after the loads.
    pub outputs: Vec<u32>,
    /// The learning rule (table, priority, match): what `delete_learned` deletes by.
    pub origin: Option<(u8, u16, Match)>,
}

/// A rule's `learn` as the pipeline holds it: the spec and the rule it belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedLearn {
    pub spec: LearnSpec,
    /// (table, priority, match) of the learning rule; `None` in a group's bucket.
    pub origin: Option<(u8, u16, Match)>,
}

impl LearnSpec {
    /// ORs every source bit into `mask` (the decision depends on them).
    pub fn mask_sources(&self, mask: &mut FlowKey) {
        for it in &self.items {
            if let LearnSrc::Field(s) = it.src {
                mask.or_field(s.field, s.mask());
            }
        }
    }

    /// The rule this action learns from key `k` (the translation's key at the action,
    /// in_port as its OpenFlow port number `in_port_no`).
    pub fn learn(&self, k: &FlowKey, in_port_no: u32) -> Learned {
        let mut m = Match::catchall();
        let mut loads = Vec::new();
        let mut outputs = Vec::new();
        for it in &self.items {
            let v = match it.src {
                LearnSrc::Field(s) if s.field == Field::InPort => {
                    (u128::from(in_port_no) >> s.ofs) & s.ones()
                }
                LearnSrc::Field(s) => s.get(k),
                LearnSrc::Imm(v) => v,
            };
            match it.dst {
                LearnDst::Match(d) => m.set(d.field, v << d.ofs, d.mask()),
                LearnDst::Load(d) => loads.push((d.field, (v << d.ofs) & d.mask(), d.mask())),
                LearnDst::Output => {
                    // OVS: a port that fits 16 bits, an ordinary or a few reserved ones.
                    if let Ok(p) = u16::try_from(v) {
                        outputs.push(crate::learn::port_from_16(p));
                    }
                }
            }
        }
        Learned {
            table: self.table,
            priority: self.priority,
            idle_timeout: self.idle_timeout,
            hard_timeout: self.hard_timeout,
            cookie: self.cookie,
            flags: self.flags,
            m,
            loads,
            outputs,
            origin: None,
        }
    }
}

/// The 32-bit port number of a 16-bit one (reserved ports move to the top).
pub fn port_from_16(p: u16) -> u32 {
    if p >= 0xff00 {
        0xffff_0000 | u32::from(p)
    } else {
        u32::from(p)
    }
}
