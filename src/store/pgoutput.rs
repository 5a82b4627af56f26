//! Decoding the outbox rows of a `pgoutput` stream (logical wake-up mode).
//!
//! The replication client hands over each change message as bytes; this
//! module reads the two kinds the schema's publication produces: a
//! relation message, which says which columns a table has and of what
//! type, and an insert. An insert into the outbox is decoded into an outbox
//! row by its columns' names; an insert into `webhook_deliveries` (the
//! trigger queuing a webhook delivery) is only noted, so the dispatcher is
//! woken exactly when a transaction queued deliveries. The stream runs in binary mode, so every value goes
//! through the same `FromSql` decoding as a query's result. Other message
//! kinds (types, origins, truncates) carry nothing a relay needs and are
//! skipped. No I/O: the stream's owner feeds bytes in.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use tokio_postgres::types::{FromSql, Type};

use super::outbox::OutboxRow;

/// Why a change message could not be read. The stream's owner logs it and
/// reconnects, which re-reads every active scope from the outbox.
#[derive(Debug, thiserror::Error)]
pub enum PgOutputError {
    #[error("pgoutput message ends early (reading {0})")]
    Truncated(&'static str),
    #[error("insert into relation {0}, which no relation message described")]
    UnknownRelation(u32),
    #[error("outbox column {column}: {reason}")]
    Column { column: String, reason: String },
    #[error("outbox row has no {0} column")]
    Missing(&'static str),
    #[error("outbox column {0} arrived in text format; the stream must run in binary mode")]
    TextFormat(String),
}

/// The table whose inserts queue webhook deliveries.
const DELIVERIES_TABLE: &str = "webhook_deliveries";

/// A relation, as its relation message describes it.
#[derive(Debug, Clone)]
struct Relation {
    /// Inserts into it are webhook deliveries, not outbox rows.
    deliveries: bool,
    columns: Vec<Column>,
}

/// One column of a relation, as its relation message describes it.
#[derive(Debug, Clone)]
struct Column {
    name: String,
    type_oid: u32,
}

/// What one change message was.
#[derive(Debug)]
pub enum Change {
    /// A row inserted into the outbox.
    Insert(Box<OutboxRow>),
    /// A webhook delivery queued (by the outbox's trigger).
    DeliveryQueued,
    /// A message that says nothing to a relay (a relation, a type).
    Other,
}

/// Reads change messages, remembering relations between them.
#[derive(Debug, Default)]
pub struct OutboxDecoder {
    relations: HashMap<u32, Relation>,
}

impl OutboxDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Decodes one change message (the payload of an XLogData frame).
    pub fn decode(&mut self, message: &[u8]) -> Result<Change, PgOutputError> {
        let mut reader = Reader(message);
        match reader.u8("message kind")? {
            b'R' => {
                self.relation(&mut reader)?;
                Ok(Change::Other)
            }
            b'I' => self.insert(&mut reader),
            _ => Ok(Change::Other),
        }
    }

    fn relation(&mut self, reader: &mut Reader<'_>) -> Result<(), PgOutputError> {
        let id = reader.u32("relation id")?;
        reader.cstr("namespace")?;
        let deliveries = reader.cstr("relation name")? == DELIVERIES_TABLE;
        reader.u8("replica identity")?;
        let count = reader.u16("column count")?;
        let mut columns = Vec::with_capacity(usize::from(count));
        for _ in 0..count {
            reader.u8("column flags")?;
            let name = reader.cstr("column name")?.to_owned();
            let type_oid = reader.u32("column type")?;
            reader.u32("column type modifier")?;
            columns.push(Column { name, type_oid });
        }
        self.relations.insert(
            id,
            Relation {
                deliveries,
                columns,
            },
        );
        Ok(())
    }

    fn insert(&self, reader: &mut Reader<'_>) -> Result<Change, PgOutputError> {
        let id = reader.u32("relation id")?;
        let relation = self
            .relations
            .get(&id)
            .ok_or(PgOutputError::UnknownRelation(id))?;
        if relation.deliveries {
            return Ok(Change::DeliveryQueued);
        }
        let columns = &relation.columns;
        reader.u8("tuple marker")?;
        let count = reader.u16("tuple column count")?;
        let mut row = RowBuilder::default();
        for index in 0..usize::from(count) {
            let kind = reader.u8("column kind")?;
            let value = match kind {
                b'b' => {
                    let len = reader.u32("value length")? as usize;
                    Some(reader.take(len, "value")?)
                }
                b't' => {
                    let name = columns.get(index).map(|c| c.name.clone());
                    return Err(PgOutputError::TextFormat(name.unwrap_or_default()));
                }
                // 'n' (null) and 'u' (an unchanged TOAST value, which an
                // insert never has).
                _ => None,
            };
            if let Some(column) = columns.get(index) {
                row.set(column, value)?;
            }
        }
        row.finish().map(|row| Change::Insert(Box::new(row)))
    }
}

/// The outbox columns a relay uses, filled in as the tuple is read.
#[derive(Default)]
struct RowBuilder {
    seq: Option<i64>,
    id: Option<uuid::Uuid>,
    event_type: Option<String>,
    scope_key: Option<String>,
    data: Option<serde_json::Value>,
    audience: Option<serde_json::Value>,
    resources: Option<Vec<String>>,
    occurred_at: Option<DateTime<Utc>>,
    txid: Option<u64>,
    traceparent: Option<String>,
}

impl RowBuilder {
    fn set(&mut self, column: &Column, value: Option<&[u8]>) -> Result<(), PgOutputError> {
        let Some(raw) = value else {
            return Ok(());
        };
        match column.name.as_str() {
            "seq" => self.seq = Some(read(column, raw)?),
            "id" => self.id = Some(read(column, raw)?),
            "type" => self.event_type = Some(read(column, raw)?),
            "scope_key" => self.scope_key = Some(read(column, raw)?),
            "data" => self.data = Some(read(column, raw)?),
            "audience" => self.audience = Some(read(column, raw)?),
            "resources" => self.resources = Some(read(column, raw)?),
            "occurred_at" => self.occurred_at = Some(read(column, raw)?),
            "traceparent" => self.traceparent = Some(read(column, raw)?),
            // xid8 is sent as eight big-endian bytes.
            "txid" => {
                let bytes: [u8; 8] = raw.try_into().map_err(|_| PgOutputError::Column {
                    column: column.name.clone(),
                    reason: format!("{} bytes where an xid8 has 8", raw.len()),
                })?;
                self.txid = Some(u64::from_be_bytes(bytes));
            }
            _ => {}
        }
        Ok(())
    }

    fn finish(self) -> Result<OutboxRow, PgOutputError> {
        Ok(OutboxRow {
            seq: self.seq.ok_or(PgOutputError::Missing("seq"))?,
            id: self.id.ok_or(PgOutputError::Missing("id"))?,
            event_type: self.event_type.ok_or(PgOutputError::Missing("type"))?,
            scope_key: self.scope_key.ok_or(PgOutputError::Missing("scope_key"))?,
            data: self.data.ok_or(PgOutputError::Missing("data"))?,
            audience: self.audience,
            resources: self.resources.unwrap_or_default(),
            occurred_at: self
                .occurred_at
                .ok_or(PgOutputError::Missing("occurred_at"))?,
            txid: self.txid.ok_or(PgOutputError::Missing("txid"))?,
            traceparent: self.traceparent,
        })
    }
}

/// One value in binary format, read as its column's type.
fn read<'a, T: FromSql<'a>>(column: &Column, raw: &'a [u8]) -> Result<T, PgOutputError> {
    let ty = Type::from_oid(column.type_oid).unwrap_or(Type::UNKNOWN);
    let refused = |reason: String| PgOutputError::Column {
        column: column.name.clone(),
        reason,
    };
    if !T::accepts(&ty) {
        return Err(refused(format!("unexpected type {ty}")));
    }
    T::from_sql(&ty, raw).map_err(|error| refused(error.to_string()))
}

/// A cursor over one message.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, len: usize, what: &'static str) -> Result<&'a [u8], PgOutputError> {
        if self.0.len() < len {
            return Err(PgOutputError::Truncated(what));
        }
        let (head, rest) = self.0.split_at(len);
        self.0 = rest;
        Ok(head)
    }

    fn u8(&mut self, what: &'static str) -> Result<u8, PgOutputError> {
        Ok(self.take(1, what)?[0])
    }

    fn u16(&mut self, what: &'static str) -> Result<u16, PgOutputError> {
        let bytes = self.take(2, what)?;
        Ok(u16::from_be_bytes([bytes[0], bytes[1]]))
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, PgOutputError> {
        let bytes = self.take(4, what)?;
        Ok(u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
    }

    fn cstr(&mut self, what: &'static str) -> Result<&'a str, PgOutputError> {
        let end = self
            .0
            .iter()
            .position(|&b| b == 0)
            .ok_or(PgOutputError::Truncated(what))?;
        let text = std::str::from_utf8(&self.0[..end]).map_err(|_| PgOutputError::Column {
            column: what.to_owned(),
            reason: "not UTF-8".to_owned(),
        })?;
        self.0 = &self.0[end + 1..];
        Ok(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_postgres::types::ToSql;

    /// A relation message for an outbox-like table with these columns.
    fn relation(id: u32, columns: &[(&str, Type)]) -> Vec<u8> {
        relation_named(id, "outbox", columns)
    }

    fn relation_named(id: u32, name: &str, columns: &[(&str, Type)]) -> Vec<u8> {
        let mut out = vec![b'R'];
        out.extend(id.to_be_bytes());
        out.extend(b"app\0");
        out.extend(name.as_bytes());
        out.push(0);
        out.push(b'd');
        out.extend((columns.len() as u16).to_be_bytes());
        for (name, ty) in columns {
            out.push(0);
            out.extend(name.as_bytes());
            out.push(0);
            out.extend(ty.oid().to_be_bytes());
            out.extend((-1i32).to_be_bytes());
        }
        out
    }

    fn binary(value: &(dyn ToSql + Sync), ty: &Type) -> Vec<u8> {
        let mut buf = bytes::BytesMut::new();
        value.to_sql_checked(ty, &mut buf).unwrap();
        buf.to_vec()
    }

    fn insert(id: u32, values: &[Option<Vec<u8>>]) -> Vec<u8> {
        let mut out = vec![b'I'];
        out.extend(id.to_be_bytes());
        out.push(b'N');
        out.extend((values.len() as u16).to_be_bytes());
        for value in values {
            match value {
                None => out.push(b'n'),
                Some(raw) => {
                    out.push(b'b');
                    out.extend((raw.len() as u32).to_be_bytes());
                    out.extend(raw);
                }
            }
        }
        out
    }

    fn outbox_columns() -> Vec<(&'static str, Type)> {
        vec![
            ("seq", Type::INT8),
            ("id", Type::UUID),
            ("type", Type::TEXT),
            ("scope_key", Type::TEXT),
            ("lane", Type::TEXT),
            ("data", Type::JSONB),
            ("audience", Type::JSONB),
            ("resources", Type::TEXT_ARRAY),
            ("occurred_at", Type::TIMESTAMPTZ),
            ("txid", Type::from_oid(5069).unwrap_or(Type::UNKNOWN)),
        ]
    }

    #[test]
    fn an_insert_decodes_into_the_row_by_column_name() {
        let mut decoder = OutboxDecoder::new();
        assert!(matches!(
            decoder.decode(&relation(7, &outbox_columns())).unwrap(),
            Change::Other
        ));
        let id = uuid::Uuid::new_v4();
        let at = Utc::now();
        let data = serde_json::json!({"order": 42});
        let resources = vec!["order:42".to_owned(), "a \"quoted\", one".to_owned()];
        let values = vec![
            Some(binary(&17i64, &Type::INT8)),
            Some(binary(&id, &Type::UUID)),
            Some(binary(&"order.created", &Type::TEXT)),
            Some(binary(&"org-1", &Type::TEXT)),
            Some(binary(&"durable", &Type::TEXT)),
            Some(binary(&data, &Type::JSONB)),
            None,
            Some(binary(&resources, &Type::TEXT_ARRAY)),
            Some(binary(&at, &Type::TIMESTAMPTZ)),
            Some(991u64.to_be_bytes().to_vec()),
        ];
        let Change::Insert(row) = decoder.decode(&insert(7, &values)).unwrap() else {
            panic!("an insert");
        };
        assert_eq!(row.seq, 17);
        assert_eq!(row.id, id);
        assert_eq!(row.event_type, "order.created");
        assert_eq!(row.scope_key, "org-1");
        assert_eq!(row.data, data);
        assert_eq!(row.audience, None);
        assert_eq!(row.resources, resources);
        assert_eq!(row.occurred_at.timestamp_micros(), at.timestamp_micros());
        assert_eq!(row.txid, 991);
    }

    #[test]
    fn an_insert_into_the_deliveries_table_is_only_noted() {
        let mut decoder = OutboxDecoder::new();
        decoder
            .decode(&relation_named(
                8,
                "webhook_deliveries",
                &[("id", Type::INT8)],
            ))
            .unwrap();
        let queued = insert(8, &[Some(binary(&1i64, &Type::INT8))]);
        assert!(matches!(
            decoder.decode(&queued).unwrap(),
            Change::DeliveryQueued
        ));
    }

    #[test]
    fn broken_messages_are_errors_never_panics() {
        let mut decoder = OutboxDecoder::new();
        assert!(matches!(
            decoder.decode(&insert(9, &[])),
            Err(PgOutputError::UnknownRelation(9))
        ));
        let full = relation(7, &outbox_columns());
        for cut in 1..full.len() {
            assert!(decoder.decode(&full[..cut]).is_err(), "cut at {cut}");
        }
        decoder.decode(&full).unwrap();
        let wrong_type = vec![Some(binary(&"seventeen", &Type::TEXT))];
        assert!(matches!(
            decoder.decode(&insert(7, &wrong_type)),
            Err(PgOutputError::Column { .. })
        ));
        assert!(matches!(
            decoder.decode(&insert(7, &[])),
            Err(PgOutputError::Missing("seq"))
        ));
        assert!(matches!(
            decoder.decode(b"Yanything").unwrap(),
            Change::Other
        ));
        assert!(decoder.decode(b"").is_err());
    }
}
