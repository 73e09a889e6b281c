//! Builders of transact operations (RFC 7047 §5.2), for [`Session::transact`].
//!
//! A map column's empty value is [`Datum::empty_map`] (`["map", []]`): ovsdb-server refuses
//! `["set", []]` for a map.
//!
//! [`Session::transact`]: crate::Session::transact

use serde_json::{json, Map, Value};

use crate::datum::{Datum, Row};
use crate::uuid::Uuid;

/// `where _uuid == uuid`.
pub fn where_uuid(uuid: Uuid) -> Value {
    json!([["_uuid", "==", ["uuid", uuid.to_string()]]])
}

/// A row as a JSON object of column → datum.
pub fn row_json(row: &Row) -> Value {
    Value::Object(
        row.iter()
            .map(|(c, d)| (c.clone(), d.to_json()))
            .collect::<Map<_, _>>(),
    )
}

/// Inserts `row` into `table`; `uuid_name` lets later operations of the same transaction
/// refer to it as `["named-uuid", name]`.
pub fn insert(table: &str, row: &Row, uuid_name: Option<&str>) -> Value {
    let mut op = json!({"op": "insert", "table": table, "row": row_json(row)});
    if let Some(name) = uuid_name {
        op["uuid-name"] = json!(name);
    }
    op
}

/// Sets the columns of `row` in the row `uuid` of `table`.
pub fn update(table: &str, uuid: Uuid, row: &Row) -> Value {
    json!({"op": "update", "table": table, "where": where_uuid(uuid), "row": row_json(row)})
}

/// Mutates the row `uuid` of `table`: each mutation is (column, mutator, value), the mutator
/// one of `"+="`, `"-="`, `"*="`, `"/="`, `"%="`, `"insert"`, `"delete"`.
pub fn mutate(table: &str, uuid: Uuid, mutations: Vec<(String, &str, Datum)>) -> Value {
    let mutations: Vec<Value> = mutations
        .into_iter()
        .map(|(c, m, d)| json!([c, m, d.to_json()]))
        .collect();
    json!({"op": "mutate", "table": table, "where": where_uuid(uuid), "mutations": mutations})
}

/// Deletes the row `uuid` of `table`.
pub fn delete(table: &str, uuid: Uuid) -> Value {
    json!({"op": "delete", "table": table, "where": where_uuid(uuid)})
}

/// Waits (at most `timeout_ms`; 0 checks once) until the row `uuid` of `table` has the
/// values of `columns`; the transaction fails with "timed out" otherwise. Placed first, it
/// makes the transaction conditional on what the caller last read.
pub fn wait_until_equal(table: &str, uuid: Uuid, columns: &Row, timeout_ms: u64) -> Value {
    json!({
        "op": "wait",
        "table": table,
        "where": where_uuid(uuid),
        "columns": columns.keys().collect::<Vec<_>>(),
        "until": "==",
        "rows": [row_json(columns)],
        "timeout": timeout_ms,
    })
}

/// A comment, written to the database log with the transaction.
pub fn comment(text: &str) -> Value {
    json!({"op": "comment", "comment": text})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes() {
        let u: Uuid = "01234567-89ab-cdef-0123-456789abcdef".parse().unwrap();
        let mut row = Row::new();
        row.insert("name".into(), Datum::string("br0"));
        row.insert("ports".into(), Datum::empty());
        assert_eq!(
            insert("Bridge", &row, Some("br")),
            json!({"op": "insert", "table": "Bridge", "uuid-name": "br",
                   "row": {"name": "br0", "ports": ["set", []]}})
        );
        assert_eq!(insert("Bridge", &row, None).get("uuid-name"), None);
        let w = json!([[
            "_uuid",
            "==",
            ["uuid", "01234567-89ab-cdef-0123-456789abcdef"]
        ]]);
        assert_eq!(
            update("Bridge", u, &row),
            json!({"op": "update", "table": "Bridge", "where": w, "row": {"name": "br0", "ports": ["set", []]}})
        );
        assert_eq!(
            mutate(
                "Bridge",
                u,
                vec![("ports".into(), "insert", Datum::uuid(u))]
            ),
            json!({"op": "mutate", "table": "Bridge", "where": w,
                   "mutations": [["ports", "insert", ["uuid", u.to_string()]]]})
        );
        assert_eq!(
            delete("Bridge", u),
            json!({"op": "delete", "table": "Bridge", "where": w})
        );
        assert_eq!(
            wait_until_equal("Bridge", u, &row, 0),
            json!({"op": "wait", "table": "Bridge", "where": w, "columns": ["name", "ports"],
                   "until": "==", "rows": [{"name": "br0", "ports": ["set", []]}], "timeout": 0})
        );
        assert_eq!(comment("hi"), json!({"op": "comment", "comment": "hi"}));
    }
}
