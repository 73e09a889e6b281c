//! OVSDB values (RFC 7047 §5.1): atoms, and datums (sets and maps of atoms).
//!
//! A datum is a set or a map; a scalar column holds a one-element set and an optional column
//! that is absent holds the empty set. Sets and maps built here are *canonical*: sorted by
//! [`Atom`]'s total order, without duplicates (keys, for a map), so that two datums with the
//! same contents compare equal whatever order the server sent them in.

use std::cmp::Ordering;
use std::collections::BTreeMap;

use serde_json::{json, Value};

use crate::uuid::Uuid;

/// A row: its columns' values by column name (without `_uuid`, which is the row's key).
pub type Row = BTreeMap<String, Datum>;

/// One value of an atomic type.
///
/// Equality and order are total (reals by `f64::total_cmp`): integers < reals < booleans <
/// strings < uuids < named uuids, then by value.
#[derive(Debug, Clone)]
pub enum Atom {
    /// A 64-bit signed integer.
    Integer(i64),
    /// A real number (never NaN when read from JSON).
    Real(f64),
    /// A boolean.
    Boolean(bool),
    /// A string.
    String(String),
    /// A reference to a row: `["uuid", "…"]`.
    Uuid(Uuid),
    /// A row inserted earlier in the same transaction: `["named-uuid", "name"]`.
    NamedUuid(String),
}

/// A set or a map of atoms.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Datum {
    /// A set; a scalar is a one-element set, an absent optional value the empty set.
    Set(Vec<Atom>),
    /// A map, as key/value pairs.
    Map(Vec<(Atom, Atom)>),
}

/// A JSON value that is not a datum in RFC 7047 notation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DatumError {
    /// Neither an atom nor `["set", …]` / `["map", …]`.
    #[error("not an atom, set or map: {0}")]
    NotADatum(String),
    /// A value where an atom must be.
    #[error("not an atom: {0}")]
    NotAnAtom(String),
    /// `["uuid", …]` with something else than a UUID.
    #[error("bad uuid atom: {0}")]
    BadUuid(String),
    /// `["set", x]` where x is not an array of atoms.
    #[error("malformed set: {0}")]
    BadSet(String),
    /// `["map", x]` where x is not an array of `[key, value]` pairs.
    #[error("malformed map: {0}")]
    BadMap(String),
    /// The same element (or map key) twice.
    #[error("duplicate element {0}")]
    Duplicate(String),
    /// An atom of another type than the column's.
    #[error("expected {expected}, found {found}")]
    WrongType {
        /// The column's atomic type.
        expected: &'static str,
        /// The value found (abbreviated).
        found: String,
    },
    /// A set where the column holds a map, or the reverse.
    #[error("expected a {expected}, found {found}")]
    WrongKind {
        /// "map" or "set".
        expected: &'static str,
        /// The value found (abbreviated).
        found: String,
    },
    /// More or fewer elements than the column's type allows.
    #[error("{n} elements, the column allows {min} to {max}")]
    Size {
        /// The number of elements.
        n: usize,
        /// The column's minimum.
        min: usize,
        /// The column's maximum ("unlimited" as usize::MAX).
        max: usize,
    },
}

/// A value's text for an error message, cut to a readable length.
pub(crate) fn abbrev(v: &Value) -> String {
    let s = v.to_string();
    if s.len() <= 80 {
        return s;
    }
    let mut end = 77;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

impl Atom {
    fn rank(&self) -> u8 {
        match self {
            Atom::Integer(_) => 0,
            Atom::Real(_) => 1,
            Atom::Boolean(_) => 2,
            Atom::String(_) => 3,
            Atom::Uuid(_) => 4,
            Atom::NamedUuid(_) => 5,
        }
    }

    /// Reads an atom in RFC 7047 notation without a schema: a JSON integer is an
    /// [`Atom::Integer`], any other number an [`Atom::Real`].
    pub fn from_json(v: &Value) -> Result<Atom, DatumError> {
        match v {
            Value::Bool(b) => Ok(Atom::Boolean(*b)),
            Value::String(s) => Ok(Atom::String(s.clone())),
            Value::Number(n) => match n.as_i64() {
                Some(i) => Ok(Atom::Integer(i)),
                None => n
                    .as_f64()
                    .map(Atom::Real)
                    .ok_or_else(|| DatumError::NotAnAtom(abbrev(v))),
            },
            Value::Array(a) => match (a.first().and_then(Value::as_str), a.get(1), a.len()) {
                (Some("uuid"), Some(Value::String(s)), 2) => s
                    .parse()
                    .map(Atom::Uuid)
                    .map_err(|_| DatumError::BadUuid(abbrev(v))),
                (Some("named-uuid"), Some(Value::String(s)), 2) => Ok(Atom::NamedUuid(s.clone())),
                (Some("uuid"), _, _) => Err(DatumError::BadUuid(abbrev(v))),
                _ => Err(DatumError::NotAnAtom(abbrev(v))),
            },
            _ => Err(DatumError::NotAnAtom(abbrev(v))),
        }
    }

    /// The atom in RFC 7047 notation (a non-finite real, which JSON cannot hold, as `null`).
    pub fn to_json(&self) -> Value {
        match self {
            Atom::Integer(i) => json!(i),
            Atom::Real(r) => serde_json::Number::from_f64(*r)
                .map(Value::Number)
                .unwrap_or(Value::Null),
            Atom::Boolean(b) => json!(b),
            Atom::String(s) => json!(s),
            Atom::Uuid(u) => json!(["uuid", u.to_string()]),
            Atom::NamedUuid(n) => json!(["named-uuid", n]),
        }
    }

    /// The string, if this is a string atom.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Atom::String(s) => Some(s),
            _ => None,
        }
    }

    /// The integer, if this is an integer atom.
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Atom::Integer(i) => Some(*i),
            _ => None,
        }
    }

    /// The number, if this is a real or an integer atom.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Atom::Real(r) => Some(*r),
            Atom::Integer(i) => Some(*i as f64),
            _ => None,
        }
    }

    /// The boolean, if this is a boolean atom.
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Atom::Boolean(b) => Some(*b),
            _ => None,
        }
    }

    /// The UUID, if this is a uuid atom.
    pub fn as_uuid(&self) -> Option<Uuid> {
        match self {
            Atom::Uuid(u) => Some(*u),
            _ => None,
        }
    }
}

impl Ord for Atom {
    fn cmp(&self, other: &Atom) -> Ordering {
        match (self, other) {
            (Atom::Integer(a), Atom::Integer(b)) => a.cmp(b),
            (Atom::Real(a), Atom::Real(b)) => a.total_cmp(b),
            (Atom::Boolean(a), Atom::Boolean(b)) => a.cmp(b),
            (Atom::String(a), Atom::String(b)) => a.cmp(b),
            (Atom::Uuid(a), Atom::Uuid(b)) => a.cmp(b),
            (Atom::NamedUuid(a), Atom::NamedUuid(b)) => a.cmp(b),
            _ => self.rank().cmp(&other.rank()),
        }
    }
}

impl PartialOrd for Atom {
    fn partial_cmp(&self, other: &Atom) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Atom {
    fn eq(&self, other: &Atom) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Atom {}

impl std::hash::Hash for Atom {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.rank().hash(state);
        match self {
            Atom::Integer(i) => i.hash(state),
            Atom::Real(r) => r.to_bits().hash(state),
            Atom::Boolean(b) => b.hash(state),
            Atom::String(s) | Atom::NamedUuid(s) => s.hash(state),
            Atom::Uuid(u) => u.hash(state),
        }
    }
}

impl From<&str> for Atom {
    fn from(s: &str) -> Atom {
        Atom::String(s.to_owned())
    }
}

impl From<String> for Atom {
    fn from(s: String) -> Atom {
        Atom::String(s)
    }
}

impl From<i64> for Atom {
    fn from(i: i64) -> Atom {
        Atom::Integer(i)
    }
}

impl From<bool> for Atom {
    fn from(b: bool) -> Atom {
        Atom::Boolean(b)
    }
}

impl From<Uuid> for Atom {
    fn from(u: Uuid) -> Atom {
        Atom::Uuid(u)
    }
}

/// Sorts `atoms` and rejects a duplicate.
pub(crate) fn canonical_set(mut atoms: Vec<Atom>) -> Result<Vec<Atom>, DatumError> {
    atoms.sort();
    if let Some(w) = atoms.windows(2).find(|w| w[0] == w[1]) {
        return Err(DatumError::Duplicate(abbrev(&w[0].to_json())));
    }
    Ok(atoms)
}

/// Sorts `pairs` by key and rejects a duplicate key.
pub(crate) fn canonical_map(mut pairs: Vec<(Atom, Atom)>) -> Result<Vec<(Atom, Atom)>, DatumError> {
    pairs.sort_by(|a, b| a.0.cmp(&b.0));
    if let Some(w) = pairs.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(DatumError::Duplicate(abbrev(&w[0].0.to_json())));
    }
    Ok(pairs)
}

/// The elements of `["set", [..]]`, or of a bare atom, each read by `atom`.
pub(crate) fn parse_set(
    v: &Value,
    atom: impl Fn(&Value) -> Result<Atom, DatumError>,
) -> Result<Vec<Atom>, DatumError> {
    if let Value::Array(a) = v {
        if a.first().and_then(Value::as_str) == Some("set") {
            let [_, Value::Array(elems)] = a.as_slice() else {
                return Err(DatumError::BadSet(abbrev(v)));
            };
            return canonical_set(elems.iter().map(atom).collect::<Result<_, _>>()?);
        }
        if a.first().and_then(Value::as_str) == Some("map") {
            return Err(DatumError::WrongKind {
                expected: "set",
                found: abbrev(v),
            });
        }
    }
    Ok(vec![atom(v)?])
}

/// The pairs of `["map", [[k, v], ..]]`, read by `key` and `value`.
pub(crate) fn parse_map(
    v: &Value,
    key: impl Fn(&Value) -> Result<Atom, DatumError>,
    value: impl Fn(&Value) -> Result<Atom, DatumError>,
) -> Result<Vec<(Atom, Atom)>, DatumError> {
    let Value::Array(a) = v else {
        return Err(DatumError::WrongKind {
            expected: "map",
            found: abbrev(v),
        });
    };
    if a.first().and_then(Value::as_str) != Some("map") {
        return Err(DatumError::WrongKind {
            expected: "map",
            found: abbrev(v),
        });
    }
    let [_, Value::Array(pairs)] = a.as_slice() else {
        return Err(DatumError::BadMap(abbrev(v)));
    };
    let pairs = pairs
        .iter()
        .map(|p| match p.as_array().map(Vec::as_slice) {
            Some([k, v]) => Ok((key(k)?, value(v)?)),
            _ => Err(DatumError::BadMap(abbrev(p))),
        })
        .collect::<Result<Vec<_>, _>>()?;
    canonical_map(pairs)
}

impl Datum {
    /// Reads a datum in RFC 7047 §5.1 notation without a schema: an atom (a one-element
    /// set), `["set", [atoms]]`, `["map", [[key, value], ..]]`, `["uuid", "…"]`,
    /// `["named-uuid", "…"]`. The result is canonical (sorted); duplicates are an error.
    pub fn from_json(v: &Value) -> Result<Datum, DatumError> {
        if let Value::Array(a) = v {
            if a.first().and_then(Value::as_str) == Some("map") {
                return parse_map(v, Atom::from_json, Atom::from_json).map(Datum::Map);
            }
        }
        parse_set(v, Atom::from_json)
            .map(Datum::Set)
            .map_err(|e| match e {
                DatumError::NotAnAtom(_) => DatumError::NotADatum(abbrev(v)),
                e => e,
            })
    }

    /// The datum in the same notation: a one-element set as the bare atom.
    pub fn to_json(&self) -> Value {
        match self {
            Datum::Set(s) if s.len() == 1 => s[0].to_json(),
            Datum::Set(s) => json!(["set", s.iter().map(Atom::to_json).collect::<Vec<_>>()]),
            Datum::Map(m) => json!([
                "map",
                m.iter()
                    .map(|(k, v)| json!([k.to_json(), v.to_json()]))
                    .collect::<Vec<_>>()
            ]),
        }
    }

    /// The only element of a one-element set.
    pub fn as_atom(&self) -> Option<&Atom> {
        match self {
            Datum::Set(s) if s.len() == 1 => Some(&s[0]),
            _ => None,
        }
    }

    /// The string of a one-element set of a string.
    pub fn as_str(&self) -> Option<&str> {
        self.as_atom().and_then(Atom::as_str)
    }

    /// The integer of a one-element set of an integer.
    pub fn as_i64(&self) -> Option<i64> {
        self.as_atom().and_then(Atom::as_i64)
    }

    /// The number of a one-element set of a real or an integer.
    pub fn as_f64(&self) -> Option<f64> {
        self.as_atom().and_then(Atom::as_f64)
    }

    /// The boolean of a one-element set of a boolean.
    pub fn as_bool(&self) -> Option<bool> {
        self.as_atom().and_then(Atom::as_bool)
    }

    /// The UUID of a one-element set of a uuid.
    pub fn as_uuid(&self) -> Option<Uuid> {
        self.as_atom().and_then(Atom::as_uuid)
    }

    /// The elements of a set (empty for a map).
    pub fn atoms(&self) -> &[Atom] {
        match self {
            Datum::Set(s) => s,
            Datum::Map(_) => &[],
        }
    }

    /// The string elements of a set (other elements skipped; empty for a map).
    pub fn strings(&self) -> Vec<&str> {
        self.atoms().iter().filter_map(Atom::as_str).collect()
    }

    /// The integer elements of a set (other elements skipped; empty for a map).
    pub fn integers(&self) -> Vec<i64> {
        self.atoms().iter().filter_map(Atom::as_i64).collect()
    }

    /// The uuid elements of a set (other elements skipped; empty for a map).
    pub fn uuids(&self) -> Vec<Uuid> {
        self.atoms().iter().filter_map(Atom::as_uuid).collect()
    }

    /// The value of string key `key` in a map (None for a set or a missing key).
    pub fn get(&self, key: &str) -> Option<&Atom> {
        match self {
            Datum::Map(m) => m
                .iter()
                .find(|(k, _)| k.as_str() == Some(key))
                .map(|(_, v)| v),
            Datum::Set(_) => None,
        }
    }

    /// A map's string-to-string entries (other entries skipped; empty for a set).
    pub fn str_map(&self) -> BTreeMap<&str, &str> {
        match self {
            Datum::Map(m) => m
                .iter()
                .filter_map(|(k, v)| Some((k.as_str()?, v.as_str()?)))
                .collect(),
            Datum::Set(_) => BTreeMap::new(),
        }
    }

    /// The number of elements (pairs, for a map).
    pub fn len(&self) -> usize {
        match self {
            Datum::Set(s) => s.len(),
            Datum::Map(m) => m.len(),
        }
    }

    /// Whether the datum has no element: an absent optional value, or an empty set or map.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A one-element set of a string.
    pub fn string(s: impl Into<String>) -> Datum {
        Datum::Set(vec![Atom::String(s.into())])
    }

    /// A one-element set of an integer.
    pub fn integer(i: i64) -> Datum {
        Datum::Set(vec![Atom::Integer(i)])
    }

    /// A one-element set of a real.
    pub fn real(r: f64) -> Datum {
        Datum::Set(vec![Atom::Real(r)])
    }

    /// A one-element set of a boolean.
    pub fn boolean(b: bool) -> Datum {
        Datum::Set(vec![Atom::Boolean(b)])
    }

    /// A one-element set of a uuid.
    pub fn uuid(u: Uuid) -> Datum {
        Datum::Set(vec![Atom::Uuid(u)])
    }

    /// A one-element set of a named uuid (a row inserted in the same transaction).
    pub fn named_uuid(name: impl Into<String>) -> Datum {
        Datum::Set(vec![Atom::NamedUuid(name.into())])
    }

    /// The empty set: an absent optional value, or no elements.
    pub fn empty() -> Datum {
        Datum::Set(Vec::new())
    }

    /// The empty map.
    pub fn empty_map() -> Datum {
        Datum::Map(Vec::new())
    }

    /// A canonical set of `atoms` (duplicates dropped).
    pub fn set(atoms: impl IntoIterator<Item = Atom>) -> Datum {
        let mut v: Vec<Atom> = atoms.into_iter().collect();
        v.sort();
        v.dedup();
        Datum::Set(v)
    }

    /// A canonical map of `pairs` (a repeated key keeps its last value).
    pub fn map(pairs: impl IntoIterator<Item = (Atom, Atom)>) -> Datum {
        let m: BTreeMap<Atom, Atom> = pairs.into_iter().collect();
        Datum::Map(m.into_iter().collect())
    }

    /// A canonical string-to-string map (a repeated key keeps its last value).
    pub fn strings_map<K: Into<String>, V: Into<String>>(
        it: impl IntoIterator<Item = (K, V)>,
    ) -> Datum {
        Datum::map(
            it.into_iter()
                .map(|(k, v)| (Atom::String(k.into()), Atom::String(v.into()))),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rt(v: Value) -> Datum {
        let d = Datum::from_json(&v).unwrap_or_else(|e| panic!("{v}: {e}"));
        assert_eq!(d.to_json(), v, "round trip");
        assert_eq!(Datum::from_json(&d.to_json()).unwrap(), d);
        d
    }

    const U: &str = "01234567-89ab-cdef-0123-456789abcdef";

    #[test]
    fn round_trips() {
        assert_eq!(rt(json!(5)).as_i64(), Some(5));
        assert_eq!(
            rt(json!(-9_223_372_036_854_775_808i64)).as_i64(),
            Some(i64::MIN)
        );
        assert_eq!(rt(json!(2.5)).as_f64(), Some(2.5));
        assert_eq!(rt(json!(true)).as_bool(), Some(true));
        assert_eq!(rt(json!("br0")).as_str(), Some("br0"));
        assert_eq!(rt(json!(["uuid", U])).as_uuid(), Some(U.parse().unwrap()));
        assert_eq!(rt(json!(["named-uuid", "row1"])), Datum::named_uuid("row1"));
        assert!(rt(json!(["set", []])).is_empty());
        assert_eq!(rt(json!(["set", [1, 2, 3]])).integers(), vec![1, 2, 3]);
        assert_eq!(rt(json!(["set", ["a", "b"]])).strings(), vec!["a", "b"]);
        assert_eq!(
            rt(json!([
                "set",
                [
                    ["uuid", U],
                    ["uuid", "11111111-89ab-cdef-0123-456789abcdef"]
                ]
            ]))
            .uuids()
            .len(),
            2
        );
        assert_eq!(rt(json!(["map", []])), Datum::empty_map());
        let m = rt(json!(["map", [["a", "1"], ["b", "2"]]]));
        assert_eq!(m.get("b").and_then(Atom::as_str), Some("2"));
        assert_eq!(m.str_map().get("a"), Some(&"1"));
        assert_eq!(m, Datum::strings_map([("b", "2"), ("a", "1")]));
        let m = rt(json!(["map", [[1, ["uuid", U]], [2, ["named-uuid", "x"]]]]));
        assert_eq!(m.len(), 2);
        // A one-element set reads as the bare atom.
        assert_eq!(
            Datum::from_json(&json!(["set", ["x"]])).unwrap().to_json(),
            json!("x")
        );
    }

    #[test]
    fn canonical_order() {
        let a = Datum::from_json(&json!(["set", ["b", "a", "c"]])).unwrap();
        assert_eq!(a.strings(), vec!["a", "b", "c"]);
        let m = Datum::from_json(&json!(["map", [["z", 1], ["a", 2]]])).unwrap();
        assert_eq!(m.to_json(), json!(["map", [["a", 2], ["z", 1]]]));
        assert_eq!(
            Datum::set([Atom::from("b"), "a".into(), "b".into()]).len(),
            2
        );
    }

    #[test]
    fn rejects() {
        for bad in [
            json!(null),
            json!({}),
            json!([]),
            json!(["set"]),
            json!(["set", 1]),
            json!(["set", [1], 2]),
            json!(["set", [["set", [1]]]]),
            json!(["set", [1, 1]]),
            json!(["map"]),
            json!(["map", [1]]),
            json!(["map", [[1]]]),
            json!(["map", [[1, 2, 3]]]),
            json!(["map", [["a", 1], ["a", 2]]]),
            json!(["map", [[["set", []], 1]]]),
            json!(["uuid", "nope"]),
            json!(["uuid", 5]),
            json!(["uuid", U, U]),
            json!(["named-uuid", 5]),
            json!(["bogus", 1]),
            json!([1, 2]),
        ] {
            assert!(Datum::from_json(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn accessors_on_wrong_shapes() {
        let s = Datum::from_json(&json!(["set", ["a", 1]])).unwrap();
        assert_eq!(s.as_str(), None);
        assert_eq!(s.strings(), vec!["a"]);
        assert_eq!(s.integers(), vec![1]);
        assert_eq!(s.get("a"), None);
        assert!(s.str_map().is_empty());
        let m = Datum::from_json(&json!(["map", [["a", 1]]])).unwrap();
        assert!(m.strings().is_empty());
        assert_eq!(m.as_i64(), None);
        assert!(m.str_map().is_empty());
        assert_eq!(m.get("a").and_then(Atom::as_i64), Some(1));
    }

    #[test]
    fn atom_order_is_total() {
        let mut v = [
            Atom::NamedUuid("x".into()),
            Atom::String("s".into()),
            Atom::Real(-0.0),
            Atom::Real(0.0),
            Atom::Integer(3),
            Atom::Boolean(false),
            Atom::Uuid(Uuid(1)),
        ];
        v.sort();
        assert_eq!(v[0], Atom::Integer(3));
        assert_ne!(Atom::Real(-0.0), Atom::Real(0.0));
        assert_ne!(Atom::Integer(1), Atom::Real(1.0));
    }
}
