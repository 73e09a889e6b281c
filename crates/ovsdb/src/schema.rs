//! The part of a database schema (RFC 7047 §3.2) that reading updates needs: each column's
//! type. Without it a one-element diff of a set column (elements to toggle) could not be told
//! from a new scalar value, nor a column left out of an `insert` be given its default.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::datum::{abbrev, parse_map, parse_set, Atom, Datum, DatumError};
use crate::uuid::Uuid;

/// The atomic types of RFC 7047 §3.2.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtomicType {
    /// `"integer"`
    Integer,
    /// `"real"`
    Real,
    /// `"boolean"`
    Boolean,
    /// `"string"`
    String,
    /// `"uuid"`
    Uuid,
}

impl AtomicType {
    fn parse(v: &Value) -> Result<AtomicType, String> {
        let name = match v {
            Value::String(s) => s.as_str(),
            Value::Object(o) => o
                .get("type")
                .and_then(Value::as_str)
                .ok_or_else(|| format!("base type without \"type\": {}", abbrev(v)))?,
            _ => return Err(format!("not a base type: {}", abbrev(v))),
        };
        Ok(match name {
            "integer" => AtomicType::Integer,
            "real" => AtomicType::Real,
            "boolean" => AtomicType::Boolean,
            "string" => AtomicType::String,
            "uuid" => AtomicType::Uuid,
            other => return Err(format!("unknown atomic type {other:?}")),
        })
    }

    fn name(self) -> &'static str {
        match self {
            AtomicType::Integer => "integer",
            AtomicType::Real => "real",
            AtomicType::Boolean => "boolean",
            AtomicType::String => "string",
            AtomicType::Uuid => "uuid",
        }
    }

    /// Reads an atom of this type (a real column accepts a JSON integer too).
    pub fn atom(self, v: &Value) -> Result<Atom, DatumError> {
        let wrong = || DatumError::WrongType {
            expected: self.name(),
            found: abbrev(v),
        };
        match self {
            AtomicType::Integer => v.as_i64().map(Atom::Integer).ok_or_else(wrong),
            AtomicType::Real => v
                .as_number()
                .and_then(serde_json::Number::as_f64)
                .map(Atom::Real)
                .ok_or_else(wrong),
            AtomicType::Boolean => v.as_bool().map(Atom::Boolean).ok_or_else(wrong),
            AtomicType::String => v
                .as_str()
                .map(|s| Atom::String(s.to_owned()))
                .ok_or_else(wrong),
            AtomicType::Uuid => match Atom::from_json(v) {
                Ok(a @ Atom::Uuid(_)) => Ok(a),
                Err(e @ DatumError::BadUuid(_)) => Err(e),
                _ => Err(wrong()),
            },
        }
    }

    /// The type's default atom: 0, 0.0, false, "" or the all-zero UUID.
    pub fn default_atom(self) -> Atom {
        match self {
            AtomicType::Integer => Atom::Integer(0),
            AtomicType::Real => Atom::Real(0.0),
            AtomicType::Boolean => Atom::Boolean(false),
            AtomicType::String => Atom::String(String::new()),
            AtomicType::Uuid => Atom::Uuid(Uuid::NIL),
        }
    }
}

/// A column's type: its key (and, for a map, value) type and how many elements it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnType {
    /// The type of the elements, or of a map's keys.
    pub key: AtomicType,
    /// A map's value type; None for a set (or scalar).
    pub value: Option<AtomicType>,
    /// The least number of elements.
    pub min: usize,
    /// The most (`usize::MAX` for "unlimited").
    pub max: usize,
}

impl ColumnType {
    /// Reads a column's `"type"` (RFC 7047 §3.2 `<type>`).
    pub fn parse(v: &Value) -> Result<ColumnType, String> {
        let Value::Object(o) = v else {
            return Ok(ColumnType {
                key: AtomicType::parse(v)?,
                value: None,
                min: 1,
                max: 1,
            });
        };
        let key = AtomicType::parse(o.get("key").ok_or("type without \"key\"")?)?;
        let value = o.get("value").map(AtomicType::parse).transpose()?;
        let min = match o.get("min") {
            None => 1,
            Some(m) => {
                m.as_u64()
                    .filter(|&m| m <= 1)
                    .ok_or_else(|| format!("bad \"min\": {}", abbrev(m)))? as usize
            }
        };
        let max = match o.get("max") {
            None => 1,
            Some(Value::String(s)) if s == "unlimited" => usize::MAX,
            Some(m) => m
                .as_u64()
                .filter(|&m| m >= 1)
                .and_then(|m| usize::try_from(m).ok())
                .ok_or_else(|| format!("bad \"max\": {}", abbrev(m)))?,
        };
        if min > max {
            return Err(format!("\"min\" {min} above \"max\" {max}"));
        }
        Ok(ColumnType {
            key,
            value,
            min,
            max,
        })
    }

    /// Whether the column holds a map.
    pub fn is_map(&self) -> bool {
        self.value.is_some()
    }

    /// Whether an update2 `modify` carries a diff (more than one element possible) rather
    /// than the new value (ovsdb-server's rule: `max > 1`).
    pub fn is_composite(&self) -> bool {
        self.max > 1
    }

    /// Reads a datum of this type, without checking its size.
    pub fn parse_unsized(&self, v: &Value) -> Result<Datum, DatumError> {
        match self.value {
            Some(vt) => parse_map(v, |k| self.key.atom(k), |x| vt.atom(x)).map(Datum::Map),
            None => parse_set(v, |a| self.key.atom(a)).map(Datum::Set),
        }
    }

    /// Reads a datum of this type and checks its number of elements.
    pub fn parse_datum(&self, v: &Value) -> Result<Datum, DatumError> {
        let d = self.parse_unsized(v)?;
        self.check_size(&d)?;
        Ok(d)
    }

    /// Checks that `d` has between `min` and `max` elements.
    pub fn check_size(&self, d: &Datum) -> Result<(), DatumError> {
        let n = d.len();
        if n < self.min || n > self.max {
            return Err(DatumError::Size {
                n,
                min: self.min,
                max: self.max,
            });
        }
        Ok(())
    }

    /// Whether `d` is of this type: kind, atoms' types, canonical order and size.
    pub fn admits(&self, d: &Datum) -> bool {
        let ok_atom = |t: AtomicType, a: &Atom| {
            matches!(
                (t, a),
                (AtomicType::Integer, Atom::Integer(_))
                    | (AtomicType::Real, Atom::Real(_))
                    | (AtomicType::Boolean, Atom::Boolean(_))
                    | (AtomicType::String, Atom::String(_))
                    | (AtomicType::Uuid, Atom::Uuid(_))
            )
        };
        let kind_ok = match (d, self.value) {
            (Datum::Set(s), None) => {
                s.iter().all(|a| ok_atom(self.key, a)) && s.windows(2).all(|w| w[0] < w[1])
            }
            (Datum::Map(m), Some(vt)) => {
                m.iter()
                    .all(|(k, v)| ok_atom(self.key, k) && ok_atom(vt, v))
                    && m.windows(2).all(|w| w[0].0 < w[1].0)
            }
            _ => false,
        };
        kind_ok && self.check_size(d).is_ok()
    }

    /// The column's default value: empty if `min` is 0, else `min` default atoms.
    pub fn default_datum(&self) -> Datum {
        match self.value {
            Some(vt) if self.min > 0 => {
                Datum::Map(vec![(self.key.default_atom(), vt.default_atom())])
            }
            Some(_) => Datum::Map(Vec::new()),
            None if self.min > 0 => Datum::Set(vec![self.key.default_atom()]),
            None => Datum::Set(Vec::new()),
        }
    }

    /// Applies an update2 `modify` entry to `old`: for a composite set, the elements to
    /// toggle; for a composite map, the pairs to delete (same value), insert (new key) or
    /// change (other value); otherwise the new value. The result's size is checked.
    pub fn apply_diff(&self, old: &Datum, diff: &Value) -> Result<Datum, DatumError> {
        if !self.is_composite() {
            return self.parse_datum(diff);
        }
        let new = match (old, self.parse_unsized(diff)?) {
            (Datum::Set(old), Datum::Set(diff)) => {
                let mut new = old.clone();
                for a in diff {
                    match new.binary_search(&a) {
                        Ok(i) => {
                            new.remove(i);
                        }
                        Err(i) => new.insert(i, a),
                    }
                }
                Datum::Set(new)
            }
            (Datum::Map(old), Datum::Map(diff)) => {
                let mut new = old.clone();
                for (k, v) in diff {
                    match new.binary_search_by(|(x, _)| x.cmp(&k)) {
                        Ok(i) if new[i].1 == v => {
                            new.remove(i);
                        }
                        Ok(i) => new[i].1 = v,
                        Err(i) => new.insert(i, (k, v)),
                    }
                }
                Datum::Map(new)
            }
            _ => {
                return Err(DatumError::WrongKind {
                    expected: if self.is_map() { "map" } else { "set" },
                    found: abbrev(diff),
                })
            }
        };
        self.check_size(&new)?;
        Ok(new)
    }
}

/// A database schema: each table's columns' types.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Schema {
    /// The schema's `name` (the database name).
    pub name: String,
    /// The schema's `version`, if it has one.
    pub version: Option<String>,
    /// Each table's columns' types.
    pub tables: BTreeMap<String, BTreeMap<String, ColumnType>>,
}

impl Schema {
    /// Reads a `<database-schema>` (the result of `get_schema`).
    pub fn parse(v: &Value) -> Result<Schema, String> {
        let name = v
            .get("name")
            .and_then(Value::as_str)
            .ok_or("schema without a \"name\"")?
            .to_owned();
        let version = v.get("version").and_then(Value::as_str).map(str::to_owned);
        let tables = v
            .get("tables")
            .and_then(Value::as_object)
            .ok_or("schema without \"tables\"")?;
        let mut out = BTreeMap::new();
        for (t, tv) in tables {
            let cols = tv
                .get("columns")
                .and_then(Value::as_object)
                .ok_or_else(|| format!("table {t} without \"columns\""))?;
            let mut types = BTreeMap::new();
            for (c, cv) in cols {
                let ty = cv
                    .get("type")
                    .ok_or_else(|| format!("column {t}.{c} without \"type\""))?;
                let ty = ColumnType::parse(ty).map_err(|e| format!("column {t}.{c}: {e}"))?;
                types.insert(c.clone(), ty);
            }
            out.insert(t.clone(), types);
        }
        Ok(Schema {
            name,
            version,
            tables: out,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ty(v: Value) -> ColumnType {
        ColumnType::parse(&v).unwrap()
    }

    #[test]
    fn types() {
        let t = ty(json!("string"));
        assert_eq!((t.min, t.max, t.is_map()), (1, 1, false));
        let t = ty(json!({"key": {"type": "integer", "minInteger": 1}, "min": 0, "max": 1}));
        assert_eq!((t.key, t.min, t.max), (AtomicType::Integer, 0, 1));
        let t = ty(json!({"key": "string", "value": "string", "min": 0, "max": "unlimited"}));
        assert!(t.is_map() && t.is_composite());
        assert_eq!(t.default_datum(), Datum::empty_map());
        for bad in [
            json!("int"),
            json!({"value": "string"}),
            json!({"key": "string", "max": 0}),
            json!({"key": "string", "min": 2, "max": 1}),
            json!({"key": "string", "max": "lots"}),
            json!(5),
        ] {
            assert!(ColumnType::parse(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn typed_atoms() {
        let real = ty(json!("real"));
        assert_eq!(real.parse_datum(&json!(3)).unwrap(), Datum::real(3.0));
        let int = ty(json!("integer"));
        assert!(int.parse_datum(&json!(3.5)).is_err());
        assert!(int.parse_datum(&json!("3")).is_err());
        assert!(int.parse_datum(&json!(["set", []])).is_err(), "min 1");
        let u =
            ty(json!({"key": {"type": "uuid", "refTable": "Port"}, "min": 0, "max": "unlimited"}));
        assert!(u.parse_datum(&json!(["named-uuid", "x"])).is_err());
        assert!(u.parse_datum(&json!(["map", []])).is_err());
        let m = ty(json!({"key": "string", "value": "integer", "min": 0, "max": "unlimited"}));
        assert!(m.parse_datum(&json!(["map", [["a", "b"]]])).is_err());
        assert!(m.parse_datum(&json!(["set", []])).is_err());
        let two = ty(json!({"key": "integer", "min": 0, "max": 2}));
        assert!(two.parse_datum(&json!(["set", [1, 2, 3]])).is_err());
    }

    #[test]
    fn diffs() {
        let set = ty(json!({"key": "integer", "min": 0, "max": "unlimited"}));
        let old = Datum::set([1.into(), 2.into(), 3.into()]);
        // Toggle: 2 leaves, 4 joins; a one-element diff is a bare atom.
        let new = set.apply_diff(&old, &json!(["set", [2, 4]])).unwrap();
        assert_eq!(new.integers(), vec![1, 3, 4]);
        assert_eq!(
            set.apply_diff(&new, &json!(4)).unwrap().integers(),
            vec![1, 3]
        );

        let map = ty(json!({"key": "string", "value": "string", "min": 0, "max": "unlimited"}));
        let old = Datum::strings_map([("a", "1"), ("b", "2"), ("c", "3")]);
        let diff = json!(["map", [["a", "1"], ["b", "20"], ["d", "4"]]]);
        let new = map.apply_diff(&old, &diff).unwrap();
        assert_eq!(
            new,
            Datum::strings_map([("b", "20"), ("c", "3"), ("d", "4")])
        );

        // Not composite: the new value (an optional cleared, a scalar replaced).
        let opt = ty(json!({"key": "integer", "min": 0, "max": 1}));
        let d = opt
            .apply_diff(&Datum::integer(5), &json!(["set", []]))
            .unwrap();
        assert!(d.is_empty());
        assert_eq!(
            opt.apply_diff(&Datum::integer(5), &json!(6)).unwrap(),
            Datum::integer(6)
        );
        let scalar = ty(json!("string"));
        assert_eq!(
            scalar.apply_diff(&Datum::string("a"), &json!("b")).unwrap(),
            Datum::string("b")
        );

        // A diff that breaks the type's size or kind is an error.
        let bounded = ty(json!({"key": "integer", "min": 1, "max": 2}));
        assert!(bounded.apply_diff(&Datum::integer(1), &json!(1)).is_err());
        assert!(bounded
            .apply_diff(&Datum::set([1.into(), 2.into()]), &json!(3))
            .is_err());
        assert!(map.apply_diff(&old, &json!("a")).is_err());
    }

    #[test]
    fn schema() {
        let s = Schema::parse(&json!({
            "name": "DB", "version": "1.0.0",
            "tables": {"T": {"columns": {"c": {"type": "string"}}}}
        }))
        .unwrap();
        assert_eq!(s.tables["T"]["c"], ty(json!("string")));
        assert!(Schema::parse(&json!({"name": "DB"})).is_err());
        assert!(Schema::parse(&json!({"name": "DB", "tables": {"T": {}}})).is_err());
    }
}
