//! `NXAST_CONTROLLER` / `NXAST_CONTROLLER2` (`controller(userdata=…,pause)`): the bytes of
//! OVS's tests/ofp-actions.at and of ovs-ofctl 3.1 for OVN's actions, round trips, and every
//! refusal with OVS's code.

use crate::action::{decode_actions, decode_actions_15, encode_actions, Action};
use crate::error::{bac, bpc, et};
use crate::nicira::{NxController, NX_CTLR_NO_METER};

fn unhex(s: &str) -> Vec<u8> {
    let s: String = s.split_whitespace().collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn one(hex: &str) -> NxController {
    let bytes = unhex(hex);
    let a = decode_actions_15(&bytes).unwrap_or_else(|e| panic!("{hex}: {e}"));
    assert_eq!(decode_actions(&bytes).unwrap(), a, "1.3 reads it the same");
    let mut out = Vec::new();
    encode_actions(&a, &mut out);
    assert_eq!(out, bytes, "re-encoding differs");
    match &a[..] {
        [Action::Controller(c)] => (**c).clone(),
        other => panic!("{other:?}"),
    }
}

#[test]
fn ovs_ofp_actions_at_controller_encodings() {
    // actions=controller(reason=invalid_ttl,max_len=1234,id=5678)
    let c = one("ffff 0010 00002320 0014 04d2 162e 02 00");
    assert_eq!(
        c,
        NxController {
            max_len: 1234,
            controller_id: 5678,
            reason: 2,
            ..NxController::default()
        }
    );
    // actions=controller(reason=invalid_ttl,max_len=1234,id=5678,userdata=01.02.03.04.05,pause)
    let c = one("ffff 0040 00002320 0025 000000000000 \
         0000 0008 04d2 0000 \
         0001 0008 162e 0000 \
         0002 0005 02 000000 \
         0003 0009 0102030405 00000000000000 \
         0004 0004 00000000");
    assert_eq!(
        c,
        NxController {
            max_len: 1234,
            controller_id: 5678,
            reason: 2,
            userdata: vec![1, 2, 3, 4, 5],
            pause: true,
            meter_id: NX_CTLR_NO_METER,
            v2: true,
        }
    );
}

#[test]
fn a_controller2_without_extras_stays_a_controller2_and_a_meter_is_kept() {
    // ovs-ofctl writes what it decoded as NXAST_CONTROLLER2 back as one (`raw`).
    let c = one("ffff 0010 00002320 0025 000000000000");
    assert!(c.v2 && c.userdata.is_empty() && !c.pause);
    let c = one("ffff 0018 00002320 0025 000000000000 0005 0008 00000007");
    assert_eq!(c.meter_id, 7);
}

#[test]
fn controller2_refusals_are_ovss() {
    for (hex, type_, code) in [
        // Padding not zero: NXBRC_MUST_BE_ZERO in OVS.
        (
            "ffff 0010 00002320 0025 000000000001",
            et::BAD_ACTION,
            bac::BAD_ARGUMENT,
        ),
        // NXAST_CONTROLLER not 16 bytes.
        (
            "ffff 0018 00002320 0014 04d2 162e 02 00 0000000000000000",
            et::BAD_ACTION,
            bac::BAD_LEN,
        ),
        // A property running past the action.
        (
            "ffff 0018 00002320 0025 000000000000 0003 0010 01020304",
            et::BAD_PROPERTY,
            bpc::BAD_LEN,
        ),
        // A property shorter than its header.
        (
            "ffff 0018 00002320 0025 000000000000 0003 0002 00000000",
            et::BAD_PROPERTY,
            bpc::BAD_LEN,
        ),
        // A meter id of 2 bytes.
        (
            "ffff 0018 00002320 0025 000000000000 0005 0006 0007 0000",
            et::BAD_PROPERTY,
            bpc::BAD_LEN,
        ),
        // max_len of 1 byte.
        (
            "ffff 0018 00002320 0025 000000000000 0000 0005 07 000000",
            et::BAD_PROPERTY,
            bpc::BAD_LEN,
        ),
        // An unknown property.
        (
            "ffff 0018 00002320 0025 000000000000 0009 0004 00000000",
            et::BAD_PROPERTY,
            bpc::BAD_TYPE,
        ),
    ] {
        let e = decode_actions_15(&unhex(hex)).unwrap_err();
        assert_eq!((e.type_, e.code), (type_, code), "{hex}: {e}");
    }
    // Inside ct: OVS's ofpacts_verify_nested.
    let ct = unhex(
        "ffff 0028 00002320 0023 0001 00000000 0000 ff 000000 0000 \
         ffff 0010 00002320 0014 04d2 162e 02 00",
    );
    let e = decode_actions_15(&ct).unwrap_err();
    assert_eq!(
        (e.type_, e.code),
        (et::BAD_ACTION, bac::BAD_ARGUMENT),
        "{e}"
    );
}

#[test]
fn every_truncation_and_corruption_of_a_controller2_is_refused_or_round_trips() {
    let bytes = unhex(
        "ffff 0040 00002320 0025 000000000000 \
         0000 0008 04d2 0000 \
         0001 0008 162e 0000 \
         0002 0005 02 000000 \
         0003 0009 0102030405 00000000000000 \
         0004 0004 00000000",
    );
    let check = |b: &[u8]| {
        if let Ok(a) = decode_actions_15(b) {
            let mut out = Vec::new();
            encode_actions(&a, &mut out);
            assert_eq!(decode_actions_15(&out).unwrap(), a);
        }
    };
    for n in 0..bytes.len() {
        check(&bytes[..n]);
    }
    for i in 0..bytes.len() {
        for x in [0x01u8, 0x80, 0xff] {
            let mut b = bytes.clone();
            b[i] ^= x;
            check(&b);
        }
    }
}
