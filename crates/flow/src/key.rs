//! The flow key: every header field a rule can match, extracted once per packet into
//! thirty-one 64-bit words, so masking, hashing and comparing are word operations.
//!
//! Layout (fixed; [`Field::layout`]): w0 in_port·eth_type·vlan_tci, w1 eth_dst·ip_proto·
//! ip_tos, w2 eth_src·ip_ttl·ip_frag, w3 ipv4_src·ipv4_dst (ARP spa/tpa too), w4-w5
//! ipv6_src, w6-w7 ipv6_dst, w8 tp_src·tp_dst·arp_op (ICMP type/code in tp_src/tp_dst, as
//! OVS), w9 tun_id, w10 tun_src·tun_dst, w11 metadata (OpenFlow's pipeline register: 0 in
//! every extracted key, written only by `write_metadata` during a translation), w12-w13
//! nd_target (ICMPv6 neighbour solicitation/advertisement), w14 bits 0..48 arp_sha (also
//! ND's source link-layer address option, nd_sll, as OVS), w15 bits 0..48 arp_tha (also
//! nd_tll), w16 bits 0..20 ipv6_label (flow label). ip_ecn is IpTos's low two bits.
//! Connection tracking (0 in every extracted key, set by a `ct()` action for the
//! recirculated pass, see `ct.rs`): w8 bits 48..64 recirc_id, w16 bits 40..48 ct_state and
//! 48..64 ct_zone, w15 bits 48..56 ct_nw_proto, w17 ct_mark·ct_tp_src·ct_tp_dst, w18
//! ct_nw_src·ct_nw_dst, w19-w20 ct_label.
//! Registers (OVS's `reg0`..`reg15`, 32 bits each; 0 in every extracted key, written only
//! during a translation, like metadata, and carried to a recirculated pass): w21..w28, word
//! `21 + i` holding `xreg i` (64 bits) = `reg(2i)` in bits 32..64 and `reg(2i+1)` in bits
//! 0..32, so `xxreg j` (128 bits) is words `21 + 2j` (high) and `22 + 2j` (low), `reg(4j)`
//! its most significant 32 bits — the views overlap exactly as in OVS.
//! Tunnel options (Geneve TLVs mapped by the bridge's [`crate::tlv::TlvMap`], 0 unless a
//! tunnel port received the option or a `set_field` wrote it): w29 bits 32..64
//! tun_metadata0, bits 0..32 tun_metadata1, w30 bits 32..64 tun_metadata2, bits 0..32
//! tun_metadata3 (32 bits each: options of at most 4 bytes).
//! Addresses are integers of their big-endian value.
//!
//! MPLS (w14 bits 48..60 mpls_ttl·mpls_tc·mpls_bos, bits 60..62 the internal mpls payload
//! kind; w16 bits 20..40 mpls_label): the top label stack entry of an Ethertype 0x8847/0x8848
//! frame (after an optional VLAN tag). When that entry is also the bottom of the stack,
//! extraction *parses through* into the payload: first nibble 4 → the IPv4 (and L4) fields,
//! 6 → IPv6, anything else → ARP, exactly as for a frame of that Ethertype, while
//! `eth_type` stays MPLS; [`Field::MplsPayload`] records which of the three was used. No
//! rule can see those fields while `eth_type` is MPLS (OpenFlow's prerequisites); after
//! `pop_mpls` a translation makes them visible (see `pipeline.rs`), where OVS recirculates.
//!
//! [`FlowKey::extract`] reads an untrusted frame with bounds-checked accessors only: a
//! truncated or malformed header leaves the fields it could not read at 0.

use std::net::Ipv4Addr;

/// Words in a key.
pub const KEY_WORDS: usize = 31;

/// The first register word (`xreg0`).
pub const REG_WORD: usize = 21;

/// How many `tun_metadataN` fields the key holds.
pub const TUN_METADATA: usize = 4;

/// A packet's (or a mask's) match fields.
#[derive(Clone, Copy, Eq, Default, Debug)]
pub struct FlowKey(pub [u64; KEY_WORDS]);

/// Word-wise, branch-free: the exact-match cache compares a key per packet, and the derived
/// impl compiled to a call to `bcmp` for the 96 bytes.
impl PartialEq for FlowKey {
    #[inline]
    fn eq(&self, other: &FlowKey) -> bool {
        self.0
            .iter()
            .zip(&other.0)
            .fold(0u64, |d, (a, b)| d | (a ^ b))
            == 0
    }
}

/// Hash maps hash a key as one word, [`FlowKey::hash`]: the derived impl would feed the
/// hasher the key's 96 bytes one by one.
impl std::hash::Hash for FlowKey {
    #[inline]
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u64(FlowKey::hash(self));
    }
}

/// Tunnel metadata of a packet that arrived through a tunnel port: the VNI, the outer
/// addresses and the options the bridge's TLV map maps to `tun_metadataN` (bit N of
/// `present`: option N was in the header; an absent one reads 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TunnelKey {
    pub id: u64,
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    pub meta: [u32; TUN_METADATA],
    pub present: u8,
}

impl Default for TunnelKey {
    fn default() -> Self {
        TunnelKey {
            id: 0,
            src: Ipv4Addr::UNSPECIFIED,
            dst: Ipv4Addr::UNSPECIFIED,
            meta: [0; TUN_METADATA],
            present: 0,
        }
    }
}

impl TunnelKey {
    /// The tunnel fields of `k` (a packet's key as the pipeline left it): what a flow-based
    /// tunnel port encapsulates with. A non-zero `tun_metadataN` counts as present.
    pub fn from_key(k: &FlowKey) -> TunnelKey {
        let mut t = TunnelKey {
            id: k.get(Field::TunId) as u64,
            src: Ipv4Addr::from(k.get(Field::TunSrc) as u32),
            dst: Ipv4Addr::from(k.get(Field::TunDst) as u32),
            ..TunnelKey::default()
        };
        for (n, f) in Field::TUN_METADATA.iter().enumerate() {
            t.meta[n] = k.get(*f) as u32;
            if t.meta[n] != 0 {
                t.present |= 1 << n;
            }
        }
        t
    }
}

/// A match field.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Field {
    InPort,
    EthType,
    VlanTci,
    EthDst,
    IpProto,
    IpTos,
    EthSrc,
    IpTtl,
    IpFrag,
    Ipv4Src,
    Ipv4Dst,
    Ipv6Src,
    Ipv6Dst,
    TpSrc,
    TpDst,
    ArpOp,
    TunId,
    TunSrc,
    TunDst,
    /// OpenFlow metadata: pipeline-internal, 0 on input.
    Metadata,
    /// ICMPv6 ND target address (types 135 and 136).
    NdTarget,
    /// ARP sender hardware address; in ICMPv6 NS the source link-layer address (nd_sll).
    ArpSha,
    /// ARP target hardware address; in ICMPv6 NA the target link-layer address (nd_tll).
    ArpTha,
    /// IPv6 flow label.
    Ipv6Flabel,
    /// MPLS: the top label stack entry's TTL, traffic class, bottom-of-stack bit.
    MplsTtl,
    MplsTc,
    MplsBos,
    /// Internal, not matchable: how the payload under a bottom-of-stack entry was parsed
    /// ([`MPLS_PAYLOAD_IPV4`], [`MPLS_PAYLOAD_IPV6`], [`MPLS_PAYLOAD_ARP`]; 0: not at all).
    MplsPayload,
    MplsLabel,
    /// Internal, not matchable by a rule: 0 on the first pass, `T + 1` when the packet
    /// resumes in table T after `ct(table=T)` ([`crate::ct::recirc_id`]).
    RecircId,
    /// Connection tracking (set by a `ct()` action before a recirculation, 0 on input):
    /// the state bits ([`crate::ct::state`]), zone, mark, label and the connection's
    /// original-direction tuple (IPv4 addresses only: `ct_ipv6_*` are not in the key).
    CtState,
    CtZone,
    CtMark,
    CtLabel,
    CtNwSrc,
    CtNwDst,
    CtNwProto,
    CtTpSrc,
    CtTpDst,
    /// Registers `reg0`..`reg15` (32 bits; pipeline-internal, 0 on input, see the module
    /// doc).
    Reg0,
    Reg1,
    Reg2,
    Reg3,
    Reg4,
    Reg5,
    Reg6,
    Reg7,
    Reg8,
    Reg9,
    Reg10,
    Reg11,
    Reg12,
    Reg13,
    Reg14,
    Reg15,
    /// `xreg0`..`xreg7` (64 bits): views of two registers each, not in [`Field::ALL`].
    Xreg0,
    Xreg1,
    Xreg2,
    Xreg3,
    Xreg4,
    Xreg5,
    Xreg6,
    Xreg7,
    /// `xxreg0`..`xxreg3` (128 bits): views of four registers each, not in [`Field::ALL`].
    Xxreg0,
    Xxreg1,
    Xxreg2,
    Xxreg3,
    /// Tunnel options as the bridge's TLV map names them (`NXM_NX_TUN_METADATA0..3`, 32
    /// bits each here; see the module doc).
    TunMetadata0,
    TunMetadata1,
    TunMetadata2,
    TunMetadata3,
}

impl Field {
    /// `reg0`..`reg15`.
    pub const REGS: [Field; 16] = [
        Field::Reg0,
        Field::Reg1,
        Field::Reg2,
        Field::Reg3,
        Field::Reg4,
        Field::Reg5,
        Field::Reg6,
        Field::Reg7,
        Field::Reg8,
        Field::Reg9,
        Field::Reg10,
        Field::Reg11,
        Field::Reg12,
        Field::Reg13,
        Field::Reg14,
        Field::Reg15,
    ];
    /// `xreg0`..`xreg7`.
    pub const XREGS: [Field; 8] = [
        Field::Xreg0,
        Field::Xreg1,
        Field::Xreg2,
        Field::Xreg3,
        Field::Xreg4,
        Field::Xreg5,
        Field::Xreg6,
        Field::Xreg7,
    ];
    /// `xxreg0`..`xxreg3`.
    pub const XXREGS: [Field; 4] = [Field::Xxreg0, Field::Xxreg1, Field::Xxreg2, Field::Xxreg3];

    /// Whether `self` is a register or a view of registers (pipeline-internal state, not a
    /// packet field).
    pub const fn is_register(self) -> bool {
        let w = self.layout().0;
        w >= REG_WORD && w < REG_WORD + 8
    }

    /// Every field that has its own bits (the register views `xreg`/`xxreg` left out: they
    /// are `reg`s).
    pub const ALL: [Field; 59] = [
        Field::InPort,
        Field::EthType,
        Field::VlanTci,
        Field::EthDst,
        Field::IpProto,
        Field::IpTos,
        Field::EthSrc,
        Field::IpTtl,
        Field::IpFrag,
        Field::Ipv4Src,
        Field::Ipv4Dst,
        Field::Ipv6Src,
        Field::Ipv6Dst,
        Field::TpSrc,
        Field::TpDst,
        Field::ArpOp,
        Field::TunId,
        Field::TunSrc,
        Field::TunDst,
        Field::Metadata,
        Field::NdTarget,
        Field::ArpSha,
        Field::ArpTha,
        Field::Ipv6Flabel,
        Field::MplsTtl,
        Field::MplsTc,
        Field::MplsBos,
        Field::MplsPayload,
        Field::MplsLabel,
        Field::RecircId,
        Field::CtState,
        Field::CtZone,
        Field::CtMark,
        Field::CtLabel,
        Field::CtNwSrc,
        Field::CtNwDst,
        Field::CtNwProto,
        Field::CtTpSrc,
        Field::CtTpDst,
        Field::Reg0,
        Field::Reg1,
        Field::Reg2,
        Field::Reg3,
        Field::Reg4,
        Field::Reg5,
        Field::Reg6,
        Field::Reg7,
        Field::Reg8,
        Field::Reg9,
        Field::Reg10,
        Field::Reg11,
        Field::Reg12,
        Field::Reg13,
        Field::Reg14,
        Field::Reg15,
        Field::TunMetadata0,
        Field::TunMetadata1,
        Field::TunMetadata2,
        Field::TunMetadata3,
    ];

    /// `tun_metadata0..3`, by index.
    pub const TUN_METADATA: [Field; TUN_METADATA] = [
        Field::TunMetadata0,
        Field::TunMetadata1,
        Field::TunMetadata2,
        Field::TunMetadata3,
    ];

    /// `Some(N)` for `tun_metadataN`.
    #[inline]
    pub const fn tun_metadata_index(self) -> Option<usize> {
        match self {
            Field::TunMetadata0 => Some(0),
            Field::TunMetadata1 => Some(1),
            Field::TunMetadata2 => Some(2),
            Field::TunMetadata3 => Some(3),
            _ => None,
        }
    }

    /// (word, shift, bits). 128-bit fields take words `word` (high half) and `word + 1`.
    #[inline]
    pub const fn layout(self) -> (usize, u32, u32) {
        match self {
            Field::InPort => (0, 0, 32),
            Field::EthType => (0, 32, 16),
            Field::VlanTci => (0, 48, 16),
            Field::EthDst => (1, 0, 48),
            Field::IpProto => (1, 48, 8),
            Field::IpTos => (1, 56, 8),
            Field::EthSrc => (2, 0, 48),
            Field::IpTtl => (2, 48, 8),
            Field::IpFrag => (2, 56, 8),
            Field::Ipv4Src => (3, 0, 32),
            Field::Ipv4Dst => (3, 32, 32),
            Field::Ipv6Src => (4, 0, 128),
            Field::Ipv6Dst => (6, 0, 128),
            Field::TpSrc => (8, 0, 16),
            Field::TpDst => (8, 16, 16),
            Field::ArpOp => (8, 32, 16),
            Field::TunId => (9, 0, 64),
            Field::TunSrc => (10, 0, 32),
            Field::TunDst => (10, 32, 32),
            Field::Metadata => (11, 0, 64),
            Field::NdTarget => (12, 0, 128),
            Field::ArpSha => (14, 0, 48),
            Field::ArpTha => (15, 0, 48),
            Field::Ipv6Flabel => (16, 0, 20),
            Field::MplsTtl => (14, 48, 8),
            Field::MplsTc => (14, 56, 3),
            Field::MplsBos => (14, 59, 1),
            Field::MplsPayload => (14, 60, 2),
            Field::MplsLabel => (16, 20, 20),
            Field::RecircId => (8, 48, 16),
            Field::CtState => (16, 40, 8),
            Field::CtZone => (16, 48, 16),
            Field::CtNwProto => (15, 48, 8),
            Field::CtMark => (17, 0, 32),
            Field::CtTpSrc => (17, 32, 16),
            Field::CtTpDst => (17, 48, 16),
            Field::CtNwSrc => (18, 0, 32),
            Field::CtNwDst => (18, 32, 32),
            Field::CtLabel => (19, 0, 128),
            Field::Reg0 => (REG_WORD, 32, 32),
            Field::Reg1 => (REG_WORD, 0, 32),
            Field::Reg2 => (REG_WORD + 1, 32, 32),
            Field::Reg3 => (REG_WORD + 1, 0, 32),
            Field::Reg4 => (REG_WORD + 2, 32, 32),
            Field::Reg5 => (REG_WORD + 2, 0, 32),
            Field::Reg6 => (REG_WORD + 3, 32, 32),
            Field::Reg7 => (REG_WORD + 3, 0, 32),
            Field::Reg8 => (REG_WORD + 4, 32, 32),
            Field::Reg9 => (REG_WORD + 4, 0, 32),
            Field::Reg10 => (REG_WORD + 5, 32, 32),
            Field::Reg11 => (REG_WORD + 5, 0, 32),
            Field::Reg12 => (REG_WORD + 6, 32, 32),
            Field::Reg13 => (REG_WORD + 6, 0, 32),
            Field::Reg14 => (REG_WORD + 7, 32, 32),
            Field::Reg15 => (REG_WORD + 7, 0, 32),
            Field::Xreg0 => (REG_WORD, 0, 64),
            Field::Xreg1 => (REG_WORD + 1, 0, 64),
            Field::Xreg2 => (REG_WORD + 2, 0, 64),
            Field::Xreg3 => (REG_WORD + 3, 0, 64),
            Field::Xreg4 => (REG_WORD + 4, 0, 64),
            Field::Xreg5 => (REG_WORD + 5, 0, 64),
            Field::Xreg6 => (REG_WORD + 6, 0, 64),
            Field::Xreg7 => (REG_WORD + 7, 0, 64),
            Field::Xxreg0 => (REG_WORD, 0, 128),
            Field::Xxreg1 => (REG_WORD + 2, 0, 128),
            Field::Xxreg2 => (REG_WORD + 4, 0, 128),
            Field::Xxreg3 => (REG_WORD + 6, 0, 128),
            Field::TunMetadata0 => (29, 32, 32),
            Field::TunMetadata1 => (29, 0, 32),
            Field::TunMetadata2 => (30, 32, 32),
            Field::TunMetadata3 => (30, 0, 32),
        }
    }

    /// Width in bits.
    pub const fn bits(self) -> u32 {
        self.layout().2
    }

    /// All of the field's bits set.
    pub const fn full(self) -> u128 {
        match self.bits() {
            128 => u128::MAX,
            b => (1u128 << b) - 1,
        }
    }
}

/// Bits `ofs..ofs + nbits` of a field: OVS's subfield `FIELD[a..b]` (the source or
/// destination of `move`, `load`, `output:FIELD[]`, a `ct` zone). Invariant (kept by
/// [`SubField::new`]): `1 <= nbits` and `ofs + nbits <= field.bits()`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SubField {
    pub field: Field,
    pub ofs: u16,
    pub nbits: u16,
}

impl SubField {
    /// Bits `ofs..ofs + nbits` of `field`, if they are within it.
    pub fn new(field: Field, ofs: u16, nbits: u16) -> Option<SubField> {
        (nbits >= 1 && u32::from(ofs) + u32::from(nbits) <= field.bits()).then_some(SubField {
            field,
            ofs,
            nbits,
        })
    }

    /// Every bit of `field`.
    pub fn whole(field: Field) -> SubField {
        SubField {
            field,
            ofs: 0,
            nbits: field.bits() as u16,
        }
    }

    /// Whether it is every bit of its field.
    pub fn is_whole(&self) -> bool {
        self.ofs == 0 && u32::from(self.nbits) == self.field.bits()
    }

    /// The low `nbits` bits set.
    pub fn ones(&self) -> u128 {
        if self.nbits >= 128 {
            u128::MAX
        } else {
            (1u128 << self.nbits) - 1
        }
    }

    /// Its bits within the field's value.
    pub fn mask(&self) -> u128 {
        self.ones() << self.ofs
    }

    /// Its value in `k` (shifted down to bit 0).
    #[inline]
    pub fn get(&self, k: &FlowKey) -> u128 {
        (k.get(self.field) >> self.ofs) & self.ones()
    }

    /// Writes `v`'s low `nbits` bits into its bits of `k` (the field's others kept).
    #[inline]
    pub fn set(&self, k: &mut FlowKey, v: u128) {
        let m = self.mask();
        let old = k.get(self.field);
        k.set(self.field, (old & !m) | ((v << self.ofs) & m));
    }
}

/// `ip_frag` bits.
pub const FRAG_ANY: u8 = 1;
pub const FRAG_LATER: u8 = 2;

pub const ETH_IPV4: u16 = 0x0800;
pub const ETH_IPV6: u16 = 0x86dd;
pub const ETH_ARP: u16 = 0x0806;
/// RARP: ARP's layout (OVS extracts and matches ARP's fields in it, `rarp,arp_op=3`).
pub const ETH_RARP: u16 = 0x8035;
pub const ETH_VLAN: u16 = 0x8100;
pub const ETH_MPLS: u16 = 0x8847;
pub const ETH_MPLS_MCAST: u16 = 0x8848;
/// [`Field::MplsPayload`] values.
pub const MPLS_PAYLOAD_IPV4: u8 = 1;
pub const MPLS_PAYLOAD_IPV6: u8 = 2;
pub const MPLS_PAYLOAD_ARP: u8 = 3;

/// Whether `ty` is an MPLS Ethertype (unicast or multicast).
#[inline]
pub const fn is_mpls(ty: u16) -> bool {
    ty == ETH_MPLS || ty == ETH_MPLS_MCAST
}
pub const IP_ICMP: u8 = 1;
pub const IP_TCP: u8 = 6;
pub const IP_UDP: u8 = 17;
pub const IP_SCTP: u8 = 132;
pub const IP_ICMPV6: u8 = 58;
/// The OpenFlow VLAN TCI bit meaning "the frame carries a tag".
pub const VLAN_CFI: u16 = 0x1000;

#[inline]
fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

#[inline]
fn be32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

#[inline]
fn be48(b: &[u8], at: usize) -> Option<u64> {
    let s = b.get(at..at + 6)?;
    Some(s.iter().fold(0u64, |a, &x| (a << 8) | u64::from(x)))
}

#[inline]
fn be128(b: &[u8], at: usize) -> Option<u128> {
    Some(u128::from_be_bytes(b.get(at..at + 16)?.try_into().ok()?))
}

impl FlowKey {
    /// Reads field `f`.
    #[inline]
    pub fn get(&self, f: Field) -> u128 {
        let (w, s, b) = f.layout();
        if b == 128 {
            (u128::from(self.0[w]) << 64) | u128::from(self.0[w + 1])
        } else if b == 64 {
            u128::from(self.0[w])
        } else {
            u128::from((self.0[w] >> s) & ((1u64 << b) - 1))
        }
    }

    /// Writes field `f` (bits beyond its width are ignored).
    #[inline]
    pub fn set(&mut self, f: Field, v: u128) {
        let (w, s, b) = f.layout();
        if b == 128 {
            self.0[w] = (v >> 64) as u64;
            self.0[w + 1] = v as u64;
        } else if b == 64 {
            self.0[w] = v as u64;
        } else {
            let m = ((1u64 << b) - 1) << s;
            self.0[w] = (self.0[w] & !m) | (((v as u64) << s) & m);
        }
    }

    /// ORs `v` into field `f` (accumulating a mask).
    #[inline]
    pub fn or_field(&mut self, f: Field, v: u128) {
        let old = self.get(f);
        self.set(f, old | v);
    }

    /// Word-wise AND.
    #[inline]
    pub fn masked(&self, mask: &FlowKey) -> FlowKey {
        let mut k = *self;
        for (a, m) in k.0.iter_mut().zip(&mask.0) {
            *a &= m;
        }
        k
    }

    /// Word-wise OR (accumulating masks).
    #[inline]
    pub fn union(&mut self, other: &FlowKey) {
        for (a, m) in self.0.iter_mut().zip(&other.0) {
            *a |= m;
        }
    }

    /// Whether every bit of `self` is in `other`.
    #[inline]
    pub fn is_subset_of(&self, other: &FlowKey) -> bool {
        self.0.iter().zip(&other.0).all(|(a, b)| a & !b == 0)
    }

    /// A fast hash of the key: multiply-xorshift per word, in two independent chains over the
    /// words every Ethernet/IPv4 key uses (in_port to IPv4 addresses, L4 ports), and a third
    /// over the IPv6, tunnel, metadata, ND/ARP-address and flow-label words only when one of
    /// them is not zero (an IPv4 packet's hash costs five multiplications instead of sixteen in
    /// a row). Equal keys hash equal, since it is a function of the key's words alone.
    #[inline]
    pub fn hash(&self) -> u64 {
        #[inline(always)]
        fn step(h: u64, w: u64) -> u64 {
            let h = (h ^ w).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            h ^ (h >> 29)
        }
        let w = &self.0;
        let a = step(step(step(0x243f_6a88_85a3_08d3, w[0]), w[2]), w[8]);
        let mut b = step(step(0x1319_8a2e_0370_7344, w[1]), w[3]);
        let rest = w[12] | w[13] | w[14] | w[15] | w[16];
        if w[4] | w[5] | w[6] | w[7] | w[9] | w[10] | w[11] | rest != 0 {
            let mut c = step(
                step(step(step(0xa409_3822_299f_31d0, w[4]), w[5]), w[9]),
                w[11],
            );
            let mut d = step(step(step(0x082e_fa98_ec4e_6c89, w[6]), w[7]), w[10]);
            if rest != 0 {
                c = step(step(step(c, w[12]), w[14]), w[16]);
                d = step(step(d, w[13]), w[15]);
            }
            b ^= c.rotate_left(17) ^ d.rotate_left(41);
        }
        // The words after the first twelve (ND, ARP hardware addresses, MPLS, flow label).
        if w[12..].iter().any(|&x| x != 0) {
            let e = w[12..]
                .iter()
                .fold(0x4528_21e6_38d0_1377u64, |h, &x| step(h, x));
            b ^= e.rotate_left(7);
        }
        let h = (a ^ b.rotate_left(32)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        h ^ (h >> 31)
    }

    pub fn in_port(&self) -> u32 {
        self.get(Field::InPort) as u32
    }
    pub fn eth_type(&self) -> u16 {
        self.get(Field::EthType) as u16
    }
    pub fn vlan_tci(&self) -> u16 {
        self.get(Field::VlanTci) as u16
    }
    pub fn ip_proto(&self) -> u8 {
        self.get(Field::IpProto) as u8
    }
    pub fn tp_src(&self) -> u16 {
        self.get(Field::TpSrc) as u16
    }
    pub fn tp_dst(&self) -> u16 {
        self.get(Field::TpDst) as u16
    }
    pub fn eth_src(&self) -> [u8; 6] {
        mac_bytes(self.get(Field::EthSrc) as u64)
    }
    pub fn eth_dst(&self) -> [u8; 6] {
        mac_bytes(self.get(Field::EthDst) as u64)
    }

    /// Extracts the key of `frame` received on `in_port` (through a tunnel: `tun`).
    ///
    /// The common shape, Ethernet (untagged or one 802.1Q tag) carrying an unfragmented IPv4
    /// header without options and TCP, UDP, SCTP or ICMP, takes a specialised path
    /// ([`FlowKey::extract_ipv4_fast`]) that checks the frame's length once and writes the five
    /// words such a key has directly; everything else (and every frame the fast path declines)
    /// goes through [`FlowKey::extract_generic`]. Both give the same key for every frame (tested
    /// against each other, and fuzzed).
    #[inline]
    pub fn extract(frame: &[u8], in_port: u32, tun: Option<&TunnelKey>) -> FlowKey {
        let mut k = FlowKey::default();
        k.extract_into(frame, in_port, tun);
        k
    }

    /// [`FlowKey::extract`] into `self` (a burst's key array: the words are stored once, where
    /// they stay, rather than built on the stack and copied, whose wide reloads of just-made
    /// narrow stores stall).
    #[inline]
    pub fn extract_into(&mut self, frame: &[u8], in_port: u32, tun: Option<&TunnelKey>) {
        if tun.is_some() || !self.extract_ipv4_fast_into(frame, in_port) {
            *self = FlowKey::extract_generic(frame, in_port, tun);
        }
    }

    /// The specialised path of [`FlowKey::extract`]: `None` unless `frame` has the common
    /// shape (see there) in full; then exactly the key [`FlowKey::extract_generic`] gives.
    pub fn extract_ipv4_fast(frame: &[u8], in_port: u32) -> Option<FlowKey> {
        let mut k = FlowKey::default();
        k.extract_ipv4_fast_into(frame, in_port).then_some(k)
    }

    /// [`FlowKey::extract_ipv4_fast`] into `self`: false (and `self` untouched) when the frame
    /// does not have the shape.
    #[inline]
    pub fn extract_ipv4_fast_into(&mut self, frame: &[u8], in_port: u32) -> bool {
        let Some(ty) = be16(frame, 12) else {
            return false;
        };
        let w = match ty {
            ETH_IPV4 => ipv4_fast::<14>(frame, in_port, 0),
            ETH_VLAN if be16(frame, 16) == Some(ETH_IPV4) => match be16(frame, 14) {
                Some(tci) => ipv4_fast::<18>(frame, in_port, tci | VLAN_CFI),
                None => None,
            },
            _ => None,
        };
        match w {
            Some([w0, w1, w2, w3, w8]) => {
                self.0 = [0; KEY_WORDS];
                (self.0[0], self.0[1], self.0[2], self.0[3], self.0[8]) = (w0, w1, w2, w3, w8);
                true
            }
            None => false,
        }
    }

    /// Extracts every field the general way (any Ethertype, VLAN, IPv4 options and fragments,
    /// IPv6 extension headers, ARP, tunnel metadata), field by field with bounds-checked reads.
    pub fn extract_generic(frame: &[u8], in_port: u32, tun: Option<&TunnelKey>) -> FlowKey {
        let mut k = FlowKey::default();
        k.set(Field::InPort, u128::from(in_port));
        if let Some(t) = tun {
            k.set(Field::TunId, u128::from(t.id));
            k.set(Field::TunSrc, u128::from(u32::from(t.src)));
            k.set(Field::TunDst, u128::from(u32::from(t.dst)));
            if t.present != 0 {
                for (f, v) in Field::TUN_METADATA.iter().zip(t.meta) {
                    k.set(*f, u128::from(v));
                }
            }
        }
        let (Some(dst), Some(src), Some(mut ty)) =
            (be48(frame, 0), be48(frame, 6), be16(frame, 12))
        else {
            return k;
        };
        k.set(Field::EthDst, u128::from(dst));
        k.set(Field::EthSrc, u128::from(src));
        let mut l3 = 14;
        if ty == ETH_VLAN {
            let Some(tci) = be16(frame, 14) else {
                return k;
            };
            k.set(Field::VlanTci, u128::from(tci | VLAN_CFI));
            let Some(inner) = be16(frame, 16) else {
                return k;
            };
            ty = inner;
            l3 = 18;
        }
        k.set(Field::EthType, u128::from(ty));
        match ty {
            ETH_IPV4 => extract_ipv4(&mut k, frame, l3),
            ETH_IPV6 => extract_ipv6(&mut k, frame, l3),
            ETH_ARP | ETH_RARP => extract_arp(&mut k, frame, l3),
            ETH_MPLS | ETH_MPLS_MCAST => extract_mpls(&mut k, frame, l3),
            _ => {}
        }
        k
    }
}

/// The fast path of [`FlowKey::extract`] for IPv4 at offset `L3` (14 untagged, 18 tagged with
/// `tci`, already with [`VLAN_CFI`]): one length check for the Ethernet, IPv4 and first four
/// L4 bytes, then reads at constant offsets (no further bounds checks) straight into words.
/// Returns the key's words 0, 1, 2, 3 and 8 (the others are 0).
#[inline(always)]
fn ipv4_fast<const L3: usize>(frame: &[u8], in_port: u32, tci: u16) -> Option<[u64; 5]> {
    let h = frame.get(..L3 + 24)?;
    // Version 4, a 20-byte header (no options); not a fragment (offset 0, MF clear).
    if h[L3] != 0x45 || (u16::from(h[L3 + 6]) << 8 | u16::from(h[L3 + 7])) & 0x3fff != 0 {
        return None;
    }
    let proto = h[L3 + 9];
    let l4 = L3 + 20;
    let ports = match proto {
        IP_TCP | IP_UDP | IP_SCTP => {
            u64::from(u16::from_be_bytes([h[l4], h[l4 + 1]]))
                | u64::from(u16::from_be_bytes([h[l4 + 2], h[l4 + 3]])) << 16
        }
        IP_ICMP => u64::from(h[l4]) | u64::from(h[l4 + 1]) << 16,
        _ => 0,
    };
    let mac = |o: usize| {
        u64::from_be_bytes([0, 0, h[o], h[o + 1], h[o + 2], h[o + 3], h[o + 4], h[o + 5]])
    };
    let be32 = |o: usize| u64::from(u32::from_be_bytes([h[o], h[o + 1], h[o + 2], h[o + 3]]));
    // Layout as in the module doc ([`Field::layout`]); ip_frag is 0.
    Some([
        u64::from(in_port) | u64::from(ETH_IPV4) << 32 | u64::from(tci) << 48,
        mac(0) | u64::from(proto) << 48 | u64::from(h[L3 + 1]) << 56,
        mac(6) | u64::from(h[L3 + 8]) << 48,
        be32(L3 + 12) | be32(L3 + 16) << 32,
        ports,
    ])
}

/// The top MPLS label stack entry at `l3` and, when it is the bottom of the stack, the
/// payload under it (see the module doc). A truncated entry leaves every MPLS field 0.
fn extract_mpls(k: &mut FlowKey, f: &[u8], l3: usize) {
    let Some(lse) = be32(f, l3) else { return };
    k.set(Field::MplsLabel, u128::from(lse >> 12));
    k.set(Field::MplsTc, u128::from((lse >> 9) & 7));
    k.set(Field::MplsBos, u128::from((lse >> 8) & 1));
    k.set(Field::MplsTtl, u128::from(lse & 0xff));
    if lse & 0x100 == 0 {
        return;
    }
    let inner = l3 + 4;
    // Nothing after the stack: nothing to parse, the payload kind stays 0.
    let Some(&first) = f.get(inner) else { return };
    // The payload's fields are written as a frame of the inferred Ethertype would have
    // them; the MPLS words are not touched by these.
    let kind = match first >> 4 {
        4 => {
            extract_ipv4(k, f, inner);
            MPLS_PAYLOAD_IPV4
        }
        6 => {
            extract_ipv6(k, f, inner);
            MPLS_PAYLOAD_IPV6
        }
        _ => {
            extract_arp(k, f, inner);
            MPLS_PAYLOAD_ARP
        }
    };
    k.set(Field::MplsPayload, u128::from(kind));
}

/// The ARP fields of the header at `l3` (all or none).
fn extract_arp(k: &mut FlowKey, f: &[u8], l3: usize) {
    if let (Some(op), Some(sha), Some(spa), Some(tha), Some(tpa)) = (
        be16(f, l3 + 6),
        be48(f, l3 + 8),
        be32(f, l3 + 14),
        be48(f, l3 + 18),
        be32(f, l3 + 24),
    ) {
        k.set(Field::ArpOp, u128::from(op));
        k.set(Field::ArpSha, u128::from(sha));
        k.set(Field::Ipv4Src, u128::from(spa));
        k.set(Field::ArpTha, u128::from(tha));
        k.set(Field::Ipv4Dst, u128::from(tpa));
    }
}

/// The 6 bytes of a MAC stored as an integer.
pub fn mac_bytes(m: u64) -> [u8; 6] {
    let b = m.to_be_bytes();
    [b[2], b[3], b[4], b[5], b[6], b[7]]
}

fn extract_ipv4(k: &mut FlowKey, f: &[u8], l3: usize) {
    let Some(&vihl) = f.get(l3) else { return };
    let ihl = usize::from(vihl & 0x0f) * 4;
    if vihl >> 4 != 4 || ihl < 20 || f.len() < l3 + ihl {
        return;
    }
    let (Some(&tos), Some(frag), Some(&ttl), Some(&proto), Some(src), Some(dst)) = (
        f.get(l3 + 1),
        be16(f, l3 + 6),
        f.get(l3 + 8),
        f.get(l3 + 9),
        be32(f, l3 + 12),
        be32(f, l3 + 16),
    ) else {
        return;
    };
    k.set(Field::IpTos, u128::from(tos));
    k.set(Field::IpTtl, u128::from(ttl));
    k.set(Field::IpProto, u128::from(proto));
    k.set(Field::Ipv4Src, u128::from(src));
    k.set(Field::Ipv4Dst, u128::from(dst));
    let offset = frag & 0x1fff;
    let more = frag & 0x2000 != 0;
    if offset != 0 || more {
        let bits = FRAG_ANY | if offset != 0 { FRAG_LATER } else { 0 };
        k.set(Field::IpFrag, u128::from(bits));
        if offset != 0 {
            return;
        }
    }
    extract_l4(k, f, l3 + ihl, proto, IP_ICMP);
}

fn extract_ipv6(k: &mut FlowKey, f: &[u8], l3: usize) {
    let (Some(vtc), Some(flabel), Some(&next), Some(&hlim), Some(src), Some(dst)) = (
        be16(f, l3),
        be32(f, l3),
        f.get(l3 + 6),
        f.get(l3 + 7),
        be128(f, l3 + 8),
        be128(f, l3 + 24),
    ) else {
        return;
    };
    if vtc >> 12 != 6 {
        return;
    }
    k.set(Field::IpTos, u128::from((vtc >> 4) as u8));
    k.set(Field::Ipv6Flabel, u128::from(flabel & 0x000f_ffff));
    k.set(Field::IpTtl, u128::from(hlim));
    k.set(Field::Ipv6Src, src);
    k.set(Field::Ipv6Dst, dst);
    // Skip extension headers (hop-by-hop, routing, destination options, fragment).
    let (mut proto, mut off) = (next, l3 + 40);
    for _ in 0..8 {
        match proto {
            0 | 43 | 60 => {
                let (Some(&n), Some(&len)) = (f.get(off), f.get(off + 1)) else {
                    return;
                };
                proto = n;
                off += (usize::from(len) + 1) * 8;
            }
            44 => {
                let (Some(&n), Some(fo)) = (f.get(off), be16(f, off + 2)) else {
                    return;
                };
                let later = fo & 0xfff8 != 0;
                k.set(
                    Field::IpFrag,
                    u128::from(FRAG_ANY | if later { FRAG_LATER } else { 0 }),
                );
                proto = n;
                off += 8;
                if later {
                    k.set(Field::IpProto, u128::from(proto));
                    return;
                }
            }
            _ => break,
        }
    }
    k.set(Field::IpProto, u128::from(proto));
    extract_l4(k, f, off, proto, IP_ICMPV6);
}

fn extract_l4(k: &mut FlowKey, f: &[u8], l4: usize, proto: u8, icmp: u8) {
    match proto {
        IP_TCP | IP_UDP | IP_SCTP => {
            if let (Some(s), Some(d)) = (be16(f, l4), be16(f, l4 + 2)) {
                k.set(Field::TpSrc, u128::from(s));
                k.set(Field::TpDst, u128::from(d));
            }
        }
        p if p == icmp => {
            if let (Some(&t), Some(&c)) = (f.get(l4), f.get(l4 + 1)) {
                k.set(Field::TpSrc, u128::from(t));
                k.set(Field::TpDst, u128::from(c));
                if icmp == IP_ICMPV6 && matches!(t, ND_NS | ND_NA) {
                    extract_nd(k, f, l4);
                }
            }
        }
        _ => {}
    }
}

/// ICMPv6 neighbour solicitation (135) and advertisement (136).
pub const ND_NS: u8 = 135;
pub const ND_NA: u8 = 136;

/// The ND fields of an NS/NA with code 0 at `l4`, as OVS's flow extraction: the target
/// address, then the options walked by their length (units of 8 bytes): a source link-layer
/// address option (type 1) gives arp_sha (nd_sll), a target one (type 2) arp_tha (nd_tll),
/// whichever of the two messages carries it. A zero-length option or one that runs past the
/// frame ends the walk (what was found stays); the same address option twice makes the
/// message malformed: every ND field 0. A truncated target leaves them all 0.
fn extract_nd(k: &mut FlowKey, f: &[u8], l4: usize) {
    if f.get(l4 + 1) != Some(&0) {
        return;
    }
    let Some(target) = be128(f, l4 + 8) else {
        return;
    };
    let (mut sll, mut tll) = (0u64, 0u64);
    let mut off = l4 + 24;
    // At most (MTU-sized frames) a few hundred options; the bound keeps a hostile frame's
    // walk short.
    for _ in 0..256 {
        if f.len() < off + 8 {
            break;
        }
        let (opt, len) = (f[off], usize::from(f[off + 1]) * 8);
        if len == 0 || len > f.len() - off {
            break;
        }
        if len == 8 && (opt == 1 || opt == 2) {
            let slot = if opt == 1 { &mut sll } else { &mut tll };
            if *slot != 0 {
                return;
            }
            *slot = be48(f, off + 2).unwrap_or(0);
        }
        off += len;
    }
    k.set(Field::NdTarget, target);
    k.set(Field::ArpSha, u128::from(sll));
    k.set(Field::ArpTha, u128::from(tll));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn udp4(vlan: Option<u16>) -> Vec<u8> {
        let mut f = vec![0u8; 64];
        f[0..6].copy_from_slice(&[2, 0, 0, 0, 0, 2]);
        f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
        let mut at = 12;
        if let Some(v) = vlan {
            f.splice(12..12, [0x81, 0x00, (v >> 8) as u8, v as u8]);
            at = 16;
        }
        f[at..at + 2].copy_from_slice(&[0x08, 0x00]);
        let ip = at + 2;
        f[ip] = 0x45;
        f[ip + 1] = 0x10;
        f[ip + 8] = 64;
        f[ip + 9] = 17;
        f[ip + 12..ip + 16].copy_from_slice(&[10, 0, 0, 1]);
        f[ip + 16..ip + 20].copy_from_slice(&[10, 0, 0, 2]);
        f[ip + 20..ip + 22].copy_from_slice(&1234u16.to_be_bytes());
        f[ip + 22..ip + 24].copy_from_slice(&53u16.to_be_bytes());
        f
    }

    #[test]
    fn extracts_ipv4_udp_with_and_without_a_tag() {
        for vlan in [None, Some(0x2064)] {
            let k = FlowKey::extract(&udp4(vlan), 7, None);
            assert_eq!(k.in_port(), 7);
            assert_eq!(k.eth_dst(), [2, 0, 0, 0, 0, 2]);
            assert_eq!(k.eth_src(), [2, 0, 0, 0, 0, 1]);
            assert_eq!(k.eth_type(), ETH_IPV4);
            assert_eq!(k.vlan_tci(), vlan.map_or(0, |v| v | VLAN_CFI));
            assert_eq!(k.ip_proto(), 17);
            assert_eq!(k.get(Field::IpTos), 0x10);
            assert_eq!(k.get(Field::IpTtl), 64);
            assert_eq!(k.get(Field::Ipv4Src), 0x0a00_0001);
            assert_eq!(k.get(Field::Ipv4Dst), 0x0a00_0002);
            assert_eq!((k.tp_src(), k.tp_dst()), (1234, 53));
        }
    }

    #[test]
    fn later_fragments_have_no_ports() {
        let mut f = udp4(None);
        f[20..22].copy_from_slice(&0x0010u16.to_be_bytes()); // offset 16*8
        let k = FlowKey::extract(&f, 1, None);
        assert_eq!(k.get(Field::IpFrag), u128::from(FRAG_ANY | FRAG_LATER));
        assert_eq!((k.tp_src(), k.tp_dst()), (0, 0));
        f[20..22].copy_from_slice(&0x2000u16.to_be_bytes()); // first fragment
        let k = FlowKey::extract(&f, 1, None);
        assert_eq!(k.get(Field::IpFrag), u128::from(FRAG_ANY));
        assert_eq!(k.tp_dst(), 53);
    }

    #[test]
    fn ipv6_tcp_through_an_extension_header() {
        let mut f = vec![0u8; 14 + 40 + 8 + 20];
        f[12..14].copy_from_slice(&[0x86, 0xdd]);
        f[14] = 0x60;
        f[20] = 0; // hop-by-hop
        f[21] = 255;
        f[22..38].copy_from_slice(&[0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        f[38..54].copy_from_slice(&[0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
        f[54] = 6; // next: TCP
        f[62..64].copy_from_slice(&443u16.to_be_bytes());
        f[64..66].copy_from_slice(&80u16.to_be_bytes());
        let k = FlowKey::extract(&f, 3, None);
        assert_eq!(k.eth_type(), ETH_IPV6);
        assert_eq!(k.ip_proto(), 6);
        assert_eq!(k.get(Field::Ipv6Dst) & 0xff, 2);
        assert_eq!((k.tp_src(), k.tp_dst()), (443, 80));
    }

    /// An ARP frame: op 1, sha 02:..:11, spa 10.0.0.1, tha 02:..:22, tpa 10.0.0.2.
    pub(crate) fn arp() -> Vec<u8> {
        let mut f = vec![0u8; 42];
        f[12..14].copy_from_slice(&ETH_ARP.to_be_bytes());
        f[14..22].copy_from_slice(&[0, 1, 8, 0, 6, 4, 0, 1]);
        f[22..28].copy_from_slice(&[2, 0, 0, 0, 0, 0x11]);
        f[28..32].copy_from_slice(&[10, 0, 0, 1]);
        f[32..38].copy_from_slice(&[2, 0, 0, 0, 0, 0x22]);
        f[38..42].copy_from_slice(&[10, 0, 0, 2]);
        f
    }

    /// An ICMPv6 NS (135) or NA (136) with flow label 0xabcde, target 2001:db8::7 and the
    /// given link-layer address options `(type, mac)`.
    pub(crate) fn nd(ty: u8, opts: &[(u8, [u8; 6])]) -> Vec<u8> {
        let plen = 24 + 8 * opts.len();
        let mut f = vec![0u8; 14 + 40 + plen];
        f[12..14].copy_from_slice(&ETH_IPV6.to_be_bytes());
        f[14..18].copy_from_slice(&(0x6000_0000u32 | 0xabcde).to_be_bytes());
        f[18..20].copy_from_slice(&(plen as u16).to_be_bytes());
        f[20] = IP_ICMPV6;
        f[21] = 255;
        f[22..38].copy_from_slice(&[0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        f[38..54].copy_from_slice(&[0xff, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0xff, 0, 0, 7]);
        f[54] = ty;
        f[62..78].copy_from_slice(&[0x20, 1, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7]);
        for (i, (t, mac)) in opts.iter().enumerate() {
            let o = 78 + 8 * i;
            f[o] = *t;
            f[o + 1] = 1;
            f[o + 2..o + 8].copy_from_slice(mac);
        }
        f
    }

    #[test]
    fn arp_hardware_addresses() {
        let k = FlowKey::extract(&arp(), 1, None);
        assert_eq!(k.get(Field::ArpOp), 1);
        assert_eq!(k.get(Field::ArpSha), 0x0200_0000_0011);
        assert_eq!(k.get(Field::ArpTha), 0x0200_0000_0022);
        assert_eq!(k.get(Field::Ipv4Src), 0x0a00_0001);
        assert_eq!(k.get(Field::Ipv4Dst), 0x0a00_0002);
        // Truncated: no ARP field at all.
        let k = FlowKey::extract(&arp()[..41], 1, None);
        assert_eq!((k.get(Field::ArpSha), k.get(Field::ArpOp)), (0, 0));
    }

    #[test]
    fn neighbour_discovery_fields_and_flow_label() {
        const TARGET: u128 = 0x2001_0db8_0000_0000_0000_0000_0000_0007;
        let a = [2, 0, 0, 0, 0, 0xaa];
        let b = [2, 0, 0, 0, 0, 0xbb];
        let k = FlowKey::extract(&nd(ND_NS, &[(1, a)]), 1, None);
        assert_eq!(k.get(Field::Ipv6Flabel), 0xabcde);
        assert_eq!((k.tp_src(), k.tp_dst()), (135, 0));
        assert_eq!(k.get(Field::NdTarget), TARGET);
        assert_eq!(k.get(Field::ArpSha), 0x0200_0000_00aa);
        assert_eq!(k.get(Field::ArpTha), 0);
        let k = FlowKey::extract(&nd(ND_NA, &[(2, b)]), 1, None);
        assert_eq!(k.get(Field::NdTarget), TARGET);
        assert_eq!(
            (k.get(Field::ArpSha), k.get(Field::ArpTha)),
            (0, 0x0200_0000_00bb)
        );
        // An unknown option is skipped; both address options are read (as OVS).
        let k = FlowKey::extract(&nd(ND_NS, &[(14, b), (2, b), (1, a)]), 1, None);
        assert_eq!(k.get(Field::ArpSha), 0x0200_0000_00aa);
        assert_eq!(k.get(Field::ArpTha), 0x0200_0000_00bb);
        // The same option twice: malformed, no ND field.
        let k = FlowKey::extract(&nd(ND_NS, &[(1, a), (1, b)]), 1, None);
        assert_eq!((k.get(Field::NdTarget), k.get(Field::ArpSha)), (0, 0));
        // A zero-length option ends the walk.
        let mut f = nd(ND_NS, &[(3, a), (1, a)]);
        f[79] = 0;
        let k = FlowKey::extract(&f, 1, None);
        assert_eq!((k.get(Field::NdTarget), k.get(Field::ArpSha)), (TARGET, 0));
        // Code not 0, or another type: no ND field.
        let mut f = nd(ND_NS, &[(1, a)]);
        f[55] = 1;
        assert_eq!(FlowKey::extract(&f, 1, None).get(Field::NdTarget), 0);
        let mut f = nd(ND_NS, &[(1, a)]);
        f[54] = 128;
        let k = FlowKey::extract(&f, 1, None);
        assert_eq!((k.get(Field::NdTarget), k.get(Field::ArpSha)), (0, 0));
        // Truncation anywhere: never a panic; a cut target gives no ND field, a cut option
        // no address.
        let full = nd(ND_NA, &[(2, b)]);
        for n in 0..full.len() {
            let k = FlowKey::extract(&full[..n], 1, None);
            if n < 78 {
                assert_eq!(k.get(Field::NdTarget), 0, "{n}");
            }
            if n < 86 {
                assert_eq!(k.get(Field::ArpTha), 0, "{n}");
            }
        }
        // An IPv4 key has none of the new words.
        let k = FlowKey::extract(&udp4(None), 1, None);
        assert_eq!(k.0[12..], [0; KEY_WORDS - 12]);
    }

    #[test]
    fn fields_round_trip_and_stay_in_their_bits() {
        let mut k = FlowKey::default();
        for (i, f) in Field::ALL.iter().enumerate() {
            let mut one = FlowKey::default();
            one.set(*f, u128::MAX);
            assert_eq!(one.get(*f), f.full(), "{f:?}");
            let bits: u32 = one.0.iter().map(|w| w.count_ones()).sum();
            assert_eq!(bits, f.bits(), "{f:?} leaked into another field");
            one.set(*f, 0);
            assert_eq!(one, FlowKey::default());
            k.set(*f, (i as u128 + 1) & f.full());
        }
        for (i, f) in Field::ALL.iter().enumerate() {
            assert_eq!(k.get(*f), (i as u128 + 1) & f.full(), "{f:?}");
        }
    }

    /// The fast path against the generic extraction: on frames of the shape it takes (IPv4
    /// TCP/UDP/SCTP/ICMP/other, tagged or not, every length), on mutations of them that it
    /// must decline (options, fragments, other versions, double tags, truncation), and on
    /// random bytes, `extract` equals `extract_generic`, and the fast path either declines or
    /// gives the same key.
    #[test]
    fn fast_extraction_equals_the_generic_one() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let (mut fast, mut total) = (0u32, 0u32);
        for round in 0..60_000u32 {
            let r = rnd();
            let mut f = udp4(if r & 1 == 0 {
                None
            } else {
                Some((r >> 8) as u16)
            });
            let ip = if r & 1 == 0 { 14 } else { 18 };
            // Random header contents, then a shape.
            for b in f.iter_mut() {
                if rnd() % 3 == 0 {
                    *b = rnd() as u8;
                }
            }
            f[ip - 2..ip].copy_from_slice(&ETH_IPV4.to_be_bytes());
            if r & 1 != 0 {
                f[12..14].copy_from_slice(&ETH_VLAN.to_be_bytes());
            }
            f[ip] = 0x45;
            f[ip + 9] = [IP_TCP, IP_UDP, IP_SCTP, IP_ICMP, 47, 0][(r >> 24) as usize % 6];
            if (r >> 32) % 2 == 0 {
                f[ip + 6] &= 0x40; // DF only: not a fragment
            }
            match (r >> 36) % 12 {
                0 => f[ip] = 0x46,                                       // options
                1 => f[ip] = 0x65,                                       // not version 4
                2 => f[ip + 7] |= 1,                                     // a later fragment
                3 => f[ip + 6] |= 0x20,                                  // more fragments
                4 => f[12..14].copy_from_slice(&ETH_IPV6.to_be_bytes()), // another Ethertype
                5 if r & 1 != 0 => f[16..18].copy_from_slice(&ETH_VLAN.to_be_bytes()),
                _ => {}
            }
            let len = if (r >> 40) % 4 == 0 {
                (rnd() % f.len() as u64) as usize
            } else {
                f.len()
            };
            let f = &f[..len];
            let port = (rnd() as u32) >> (round % 32);
            let generic = FlowKey::extract_generic(f, port, None);
            if let Some(k) = FlowKey::extract_ipv4_fast(f, port) {
                assert_eq!(k, generic, "frame {f:02x?}");
                fast += 1;
            }
            assert_eq!(FlowKey::extract(f, port, None), generic, "frame {f:02x?}");
            total += 1;
        }
        // Both paths were exercised.
        assert!(
            fast > total / 4 && fast < total * 3 / 4,
            "{fast} of {total}"
        );
        // Tunnel metadata always takes the generic path.
        let t = TunnelKey {
            id: 5,
            src: Ipv4Addr::new(1, 2, 3, 4),
            dst: Ipv4Addr::new(5, 6, 7, 8),
            meta: [0x1_0002, 0, 0, 7],
            present: 0b1001,
        };
        let f = udp4(None);
        let k = FlowKey::extract(&f, 1, Some(&t));
        assert_eq!(k.get(Field::TunId), 5);
        assert_eq!(k.get(Field::TunMetadata0), 0x1_0002);
        assert_eq!(k.get(Field::TunMetadata3), 7);
        // The key gives the tunnel metadata back (what a flow-based tunnel port sends).
        assert_eq!(TunnelKey::from_key(&k), t);
    }

    /// `udp4`'s frame with `lses` (label, bos) pushed under its Ethernet header (TC 5,
    /// TTL 9 + index).
    fn mpls_over(inner: &[u8], lses: &[(u32, bool)]) -> Vec<u8> {
        let mut f = inner[..12].to_vec();
        f.extend_from_slice(&ETH_MPLS.to_be_bytes());
        for (i, &(label, bos)) in lses.iter().enumerate() {
            let lse = label << 12 | 5 << 9 | u32::from(bos) << 8 | (9 + i as u32);
            f.extend_from_slice(&lse.to_be_bytes());
        }
        f.extend_from_slice(&inner[14..]);
        f
    }

    #[test]
    fn mpls_top_entry_and_parse_through_of_the_bottom_one() {
        let ip = udp4(None);
        let plain = FlowKey::extract(&ip, 3, None);
        let k = FlowKey::extract(&mpls_over(&ip, &[(0xabcde, true)]), 3, None);
        assert_eq!(k.eth_type(), ETH_MPLS);
        assert_eq!(k.get(Field::MplsLabel), 0xabcde);
        assert_eq!(k.get(Field::MplsTc), 5);
        assert_eq!(k.get(Field::MplsBos), 1);
        assert_eq!(k.get(Field::MplsTtl), 9);
        assert_eq!(k.get(Field::MplsPayload), u128::from(MPLS_PAYLOAD_IPV4));
        // The payload's fields are those of the plain IPv4 frame.
        for f in [
            Field::IpProto,
            Field::IpTos,
            Field::IpTtl,
            Field::Ipv4Src,
            Field::Ipv4Dst,
            Field::TpSrc,
            Field::TpDst,
        ] {
            assert_eq!(k.get(f), plain.get(f), "{f:?}");
        }
        // Two labels: only the top one, nothing under it.
        let k = FlowKey::extract(&mpls_over(&ip, &[(7, false), (8, true)]), 3, None);
        assert_eq!((k.get(Field::MplsLabel), k.get(Field::MplsBos)), (7, 0));
        assert_eq!(k.get(Field::MplsPayload), 0);
        assert_eq!((k.get(Field::Ipv4Src), k.tp_dst()), (0, 0));
        // Under a VLAN tag, and an ARP payload (first nibble 0).
        let mut arp = vec![0u8; 42];
        arp[12..14].copy_from_slice(&ETH_ARP.to_be_bytes());
        arp[14..16].copy_from_slice(&1u16.to_be_bytes());
        arp[20..22].copy_from_slice(&2u16.to_be_bytes());
        arp[28..32].copy_from_slice(&[10, 0, 0, 1]);
        arp[38..42].copy_from_slice(&[10, 0, 0, 2]);
        let mut f = mpls_over(&arp, &[(3, true)]);
        f.splice(12..12, [0x81, 0x00, 0x00, 0x05]);
        let k = FlowKey::extract(&f, 1, None);
        assert_eq!(k.vlan_tci(), 5 | VLAN_CFI);
        assert_eq!(k.eth_type(), ETH_MPLS);
        assert_eq!(k.get(Field::MplsLabel), 3);
        assert_eq!(k.get(Field::MplsPayload), u128::from(MPLS_PAYLOAD_ARP));
        assert_eq!(k.get(Field::ArpOp), 2);
        assert_eq!(k.get(Field::Ipv4Dst), 0x0a00_0002);
        // IPv6 under the label (nibble 6).
        let mut v6 = vec![0u8; 14 + 40 + 8];
        v6[12..14].copy_from_slice(&ETH_IPV6.to_be_bytes());
        v6[14] = 0x60;
        v6[20] = IP_UDP;
        v6[21] = 33;
        v6[54..56].copy_from_slice(&7u16.to_be_bytes());
        let k = FlowKey::extract(&mpls_over(&v6, &[(1, true)]), 1, None);
        assert_eq!(k.get(Field::MplsPayload), u128::from(MPLS_PAYLOAD_IPV6));
        assert_eq!(
            (k.get(Field::IpTtl), k.ip_proto(), k.tp_src()),
            (33, IP_UDP, 7)
        );
    }

    #[test]
    fn truncated_and_malformed_mpls_stacks() {
        let f = mpls_over(&udp4(None), &[(0xabcde, true)]);
        for n in 0..f.len() {
            let k = FlowKey::extract(&f[..n], 0, None);
            assert_eq!(k, FlowKey::extract_generic(&f[..n], 0, None));
            if n < 18 {
                // The entry is cut: no MPLS field at all.
                assert_eq!(k.get(Field::MplsLabel), 0, "{n}");
                assert_eq!(k.get(Field::MplsTtl), 0, "{n}");
            } else {
                assert_eq!(k.get(Field::MplsLabel), 0xabcde, "{n}");
            }
            if n == 18 {
                assert_eq!(k.get(Field::MplsPayload), 0);
            }
        }
        // A bad IPv4 header under the label: the entry, no IP fields (as for a plain
        // frame of that header).
        let mut f = mpls_over(&udp4(None), &[(1, true)]);
        f[18] = 0x42; // version 4, IHL 2
        let k = FlowKey::extract(&f, 0, None);
        assert_eq!(k.get(Field::MplsLabel), 1);
        assert_eq!(k.get(Field::Ipv4Src), 0);
        // Random bytes after an MPLS Ethertype never panic.
        let mut x = 0x0bad_5eed_u64;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = (x % 90) as usize;
            let mut f: Vec<u8> = (0..len).map(|i| (x >> (i % 57)) as u8).collect();
            if len > 14 {
                f[12..14].copy_from_slice(&ETH_MPLS.to_be_bytes());
            }
            if len > 18 && x & 1 == 0 {
                f[16] |= 1; // bottom of stack: parse through
            }
            let _ = FlowKey::extract(&f, 0, None);
        }
    }

    #[test]
    fn equal_keys_hash_equal_and_words_matter() {
        let base = FlowKey::extract(&udp4(None), 3, None);
        assert_eq!(base.hash(), FlowKey::extract(&udp4(None), 3, None).hash());
        // Every word, IPv4 ones and the rest, changes the hash.
        for w in 0..KEY_WORDS {
            for bit in [0, 17, 33, 63] {
                let mut k = base;
                k.0[w] ^= 1 << bit;
                assert_ne!(k, base);
                assert_ne!(k.hash(), base.hash(), "word {w} bit {bit}");
            }
        }
    }

    #[test]
    fn truncated_and_random_frames_never_panic() {
        let full = udp4(Some(5));
        for n in 0..full.len() {
            let _ = FlowKey::extract(&full[..n], 0, None);
        }
        let mut x = 0x1234_5678_9abc_def0u64;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = (x % 120) as usize;
            let mut f: Vec<u8> = (0..len).map(|i| (x >> (i % 56)) as u8).collect();
            if len > 14 && x & 1 == 0 {
                f[12..14].copy_from_slice(&[0x86, 0xdd]);
            } else if len > 14 && x & 2 == 0 {
                f[12..14].copy_from_slice(&[0x08, 0x00]);
            }
            assert_eq!(
                FlowKey::extract(&f, 0, None),
                FlowKey::extract_generic(&f, 0, None)
            );
        }
    }
}
