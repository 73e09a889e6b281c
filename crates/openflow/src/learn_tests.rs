//! `NXAST_LEARN`/`NXAST_LEARN2` against Open vSwitch's own encodings (its
//! `tests/ofp-actions.at`; their first item's `NXM_OF_VLAN_TCI` is `NXM_NX_REG0` here:
//! ferrovs's key has no NXM vlan_tci), and every refusal with OVS's code.

use crate::action::{decode_actions, encode_actions, Action};
use crate::error::bac;
use crate::learn::{flags, LearnDst, LearnSrc, NxLearn};
use crate::oxm::Field;

fn unhex(s: &str) -> Vec<u8> {
    let s: String = s.split_whitespace().collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// `learn(table=2,idle_timeout=10,hard_timeout=20,fin_idle_timeout=2,fin_hard_timeout=4,
/// priority=80,cookie=0x123456789abcdef0,NXM_NX_REG0[0..11],
/// NXM_OF_ETH_DST[]=NXM_OF_ETH_SRC[],output:NXM_OF_IN_PORT[])`
const LEARN: &str = "ffff 0048 00002320 0010 000a 0014 0050 123456789abcdef0 0000 02 00 0002 0004
    000c 00010004 0000 00010004 0000
    0030 00000406 0000 00000206 0000
    1010 00000002 0000
    00000000";

/// The same with `limit=1`: NXAST_LEARN2.
const LEARN2: &str = "ffff 0050 00002320 002d 000a 0014 0050 123456789abcdef0 0000 02 00 0002 0004
    00000001 0000 0000
    000c 00010004 0000 00010004 0000
    0030 00000406 0000 00000206 0000
    1010 00000002 0000
    00000000";

/// LEARN2 with `result_dst=NXM_NX_REG0[8]` (not supported).
const LEARN2_RESULT: &str =
    "ffff 0050 00002320 002d 000a 0014 0050 123456789abcdef0 0004 02 00 0002 0004
    00000001 0008 0000 00010004
    000c 00010004 0000 00010004 0000
    0030 00000406 0000 00000206 0000
    1010 00000002 0000";

fn one(bytes: &[u8]) -> NxLearn {
    match &decode_actions(bytes).unwrap_or_else(|e| panic!("{e}"))[..] {
        [Action::Learn(l)] => (**l).clone(),
        other => panic!("{other:?}"),
    }
}

fn reencoded(l: &NxLearn) -> Vec<u8> {
    let mut out = Vec::new();
    encode_actions(&[Action::Learn(Box::new(l.clone()))], &mut out);
    out
}

#[test]
fn ovs_learn_decodes_and_encodes_byte_for_byte() {
    let bytes = unhex(LEARN);
    let l = one(&bytes);
    assert_eq!(
        (
            l.table_id,
            l.idle_timeout,
            l.hard_timeout,
            l.priority,
            l.cookie
        ),
        (2, 10, 20, 80, 0x1234_5678_9abc_def0)
    );
    assert_eq!(
        (l.fin_idle_timeout, l.fin_hard_timeout, l.limit, l.v2),
        (2, 4, 0, false)
    );
    assert_eq!(l.specs.len(), 3);
    assert_eq!(l.specs[0].n_bits, 12);
    assert_eq!(
        l.specs[1].src,
        LearnSrc::Field {
            field: Field::NxmEthSrc,
            ofs: 0
        }
    );
    assert_eq!(
        l.specs[1].dst,
        LearnDst::Match {
            field: Field::NxmEthDst,
            ofs: 0
        }
    );
    assert_eq!(l.specs[2].dst, LearnDst::Output);
    assert_eq!(reencoded(&l), bytes);

    let bytes2 = unhex(LEARN2);
    let l2 = one(&bytes2);
    assert_eq!((l2.limit, l2.v2), (1, true));
    assert_eq!(l2.specs, l.specs);
    assert_eq!(reencoded(&l2), bytes2);
}

#[test]
fn an_immediate_is_right_aligned_in_16_bit_units() {
    // load:0x1->NXM_NX_REG10[7] (1 bit: one 16-bit unit, value in its low byte).
    let mut l = one(&unhex(LEARN));
    l.specs.truncate(0);
    l.specs.push(crate::learn::LearnSpecItem {
        n_bits: 1,
        src: LearnSrc::Imm(vec![1]),
        dst: LearnDst::Load {
            field: Field::REGS[10],
            ofs: 7,
        },
    });
    let bytes = reencoded(&l);
    // header 0x2801 (immediate, load, 1 bit), 0x0001, NXM_NX_REG10, ofs 7.
    assert_eq!(&bytes[32..42], &unhex("2801 0001 00011404 0007")[..]);
    assert_eq!(one(&bytes), l);
}

#[test]
fn hostile_learn_actions_are_refused_with_ovs_codes() {
    let base = unhex(LEARN);
    let code = |b: &[u8]| decode_actions(b).unwrap_err().code;
    // result_dst (LEARN2's write_result): not supported.
    assert_eq!(code(&unhex(LEARN2_RESULT)), bac::BAD_ARGUMENT);
    // The pad byte after table_id.
    let mut b = base.clone();
    b[27] = 1;
    assert_eq!(code(&b), bac::BAD_ARGUMENT);
    // Table 255.
    let mut b = base.clone();
    b[26] = 0xff;
    assert_eq!(code(&b), bac::BAD_ARGUMENT);
    // An unknown flag.
    let mut b = base.clone();
    b[25] = 0x08;
    assert_eq!(code(&b), bac::BAD_ARGUMENT);
    // write_result in a LEARN (not LEARN2).
    let mut b = base.clone();
    b[25] = flags::WRITE_RESULT as u8;
    assert_eq!(code(&b), bac::BAD_ARGUMENT);
    // A spec header with a reserved bit, and an output from an immediate.
    let mut b = base.clone();
    b[32] |= 0x80;
    assert_eq!(code(&b), bac::BAD_ARGUMENT);
    let mut b = base.clone();
    b[60] = 0x30; // 0x3010: immediate source, output destination
    assert_eq!(code(&b), bac::BAD_ARGUMENT);
    // 13 bits of reg0 from bit 20: beyond it.
    let mut b = base.clone();
    b[33] = 0x0d;
    b[38..40].copy_from_slice(&[0, 20]);
    assert_eq!(code(&b), bac::BAD_SET_LEN);
    // An unknown field.
    let mut b = base.clone();
    b[34..38].copy_from_slice(&unhex("7fff0804"));
    assert_eq!(code(&b), bac::BAD_SET_TYPE);
    // Non-zero bytes after the specs.
    let mut b = base.clone();
    let n = b.len();
    b[n - 1] = 1;
    assert_eq!(code(&b), bac::BAD_ARGUMENT);
    // A spec running past the action (the last spec's header with a longer source).
    let mut b = base.clone();
    b[60..62].copy_from_slice(&unhex("0010")); // match: needs 12 bytes, 10 remain
    assert_eq!(code(&b), bac::BAD_LEN);
    // A load into a read-only field (eth_type).
    let mut b = base.clone();
    b[32..34].copy_from_slice(&unhex("0810"));
    b[40..44].copy_from_slice(&unhex("00000602"));
    assert_eq!(code(&b), bac::BAD_SET_ARGUMENT);
    // Shorter than its header.
    let mut b = unhex("ffff 0018 00002320 0010 000a 0014 0050 123456789abcdef0");
    b.truncate(24);
    assert_eq!(code(&b), bac::BAD_LEN);
    // Every truncation and every single-byte change: an error or an action, never a panic.
    for i in 0..base.len() {
        for v in [0u8, 1, 0x7f, 0xff] {
            let mut b = base.clone();
            b[i] = v;
            let _ = decode_actions(&b);
        }
    }
}
