//! OVSDB row identifiers: 128-bit UUIDs in their canonical text form.

use std::fmt;
use std::str::FromStr;

/// A UUID, as OVSDB names rows (`_uuid`) and refers to them (`["uuid", "…"]`).
///
/// `Display` writes the canonical 8-4-4-4-12 lowercase form; `FromStr` reads it (either case).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Uuid(pub u128);

/// A string that is not a UUID in its 8-4-4-4-12 form.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not a UUID (8-4-4-4-12 hex digits)")]
pub struct UuidError {
    /// The rejected text (at most its first 64 characters).
    pub text: String,
}

impl Uuid {
    /// The all-zero UUID (OVSDB's default value of a uuid column).
    pub const NIL: Uuid = Uuid(0);

    /// The UUID as a 128-bit number, first hex digit most significant.
    pub fn as_u128(self) -> u128 {
        self.0
    }
}

impl fmt::Display for Uuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v = self.0;
        write!(
            f,
            "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
            (v >> 96) as u32,
            (v >> 80) as u16,
            (v >> 64) as u16,
            (v >> 48) as u16,
            v & 0xffff_ffff_ffff
        )
    }
}

impl fmt::Debug for Uuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Uuid({self})")
    }
}

impl FromStr for Uuid {
    type Err = UuidError;

    fn from_str(s: &str) -> Result<Uuid, UuidError> {
        let err = || UuidError {
            text: s.chars().take(64).collect(),
        };
        let b = s.as_bytes();
        if b.len() != 36 {
            return Err(err());
        }
        let mut v: u128 = 0;
        for (i, &c) in b.iter().enumerate() {
            if matches!(i, 8 | 13 | 18 | 23) {
                if c != b'-' {
                    return Err(err());
                }
                continue;
            }
            let d = (c as char).to_digit(16).ok_or_else(err)?;
            v = (v << 4) | u128::from(d);
        }
        Ok(Uuid(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let s = "0123abcd-4567-89ef-0a1b-2c3d4e5f6789";
        let u: Uuid = s.parse().unwrap();
        assert_eq!(u.to_string(), s);
        let up: Uuid = s.to_uppercase().parse().unwrap();
        assert_eq!(u, up);
        assert_eq!(
            Uuid::NIL.to_string(),
            "00000000-0000-0000-0000-000000000000"
        );
        assert_eq!(
            Uuid(u128::MAX).to_string(),
            "ffffffff-ffff-ffff-ffff-ffffffffffff"
        );
    }

    #[test]
    fn rejects() {
        for bad in [
            "",
            "0123abcd-4567-89ef-0a1b-2c3d4e5f678",
            "0123abcd-4567-89ef-0a1b-2c3d4e5f67890",
            "0123abcd+4567-89ef-0a1b-2c3d4e5f6789",
            "0123abcg-4567-89ef-0a1b-2c3d4e5f6789",
            "0123abcd-4567-89ef-0a1b-2c3d4e5f678é",
            "+123abcd-4567-89ef-0a1b-2c3d4e5f6789",
        ] {
            assert!(bad.parse::<Uuid>().is_err(), "{bad}");
        }
    }
}
