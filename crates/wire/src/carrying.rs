//! Carrying pointers planned before the seqs exist.
//!
//! A writer that holds the envelopes of the durable rows it is about to
//! insert (the publish API, the publisher crate's batch emit) can send the
//! pointers that carry them itself, in the same statement as the INSERT,
//! instead of leaving the outbox trigger to build every envelope again in
//! SQL. Only the seqs are missing until the INSERT runs, so each envelope
//! is handed to the database as its JSON text in two parts, before and
//! after the seq, and the rows are assigned to pointers here, measured as
//! if every seq were as long as a seq can print. The database joins the
//! parts around the seqs and sends one pointer per assigned group, in the
//! order given; the result is what [`encode_pointer_carrying`] would
//! produce, field order aside.
//!
//! [`encode_pointer_carrying`]: crate::notification::encode_pointer_carrying

use std::collections::HashMap;

use crate::envelope::EventEnvelope;
use crate::notification::{EncodeError, MAX_NOTIFY_PAYLOAD_BYTES};

/// The longest a seq prints (`i64::MAX`): a row's size is reckoned with it.
const SEQ_DIGITS_AT_MOST: usize = 19;

/// What a carrying pointer adds around its rows and its scope key: the
/// kind, `q` and `x` at their longest, and the brackets. The outbox
/// trigger reads the same figure from the schema's `settings` row
/// (`pointer_overhead`); a database test fails when the two differ.
pub const POINTER_OVERHEAD: usize = 80;

/// A durable row's envelope as JSON text, split where its seq goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvelopeAroundSeq {
    /// Everything up to and including `"seq":`.
    pub head: String,
    /// Everything after the seq's digits.
    pub tail: String,
}

impl EnvelopeAroundSeq {
    /// Splits `envelope`'s JSON around its seq. The envelope is borrowed
    /// mutably only to serialise it with a placeholder seq without copying
    /// its data; its own seq is put back before this returns.
    pub fn of(envelope: &mut EventEnvelope) -> Result<EnvelopeAroundSeq, EncodeError> {
        // A placeholder no scope key, type or id can hold: those are JSON
        // strings, where a quote is always escaped. `seq` is serialised
        // before `data`, the only field that could hold the same text.
        const PLACEHOLDER: i64 = i64::MAX;
        const FIELD: &str = "\"seq\":9223372036854775807";
        let own_seq = envelope.seq.replace(PLACEHOLDER);
        let json = serde_json::to_string(&*envelope);
        envelope.seq = own_seq;
        let json = json.map_err(|e| EncodeError::Json(e.to_string()))?;
        let at = json
            .find(FIELD)
            .ok_or_else(|| EncodeError::Json("the serialised envelope has no seq".into()))?;
        let digits_at = at + FIELD.len() - SEQ_DIGITS_AT_MOST;
        Ok(EnvelopeAroundSeq {
            head: json[..digits_at].to_owned(),
            tail: json[at + FIELD.len()..].to_owned(),
        })
    }

    /// The envelope's length once its seq is in, at the longest.
    pub fn len_at_most(&self) -> usize {
        self.head.len() + SEQ_DIGITS_AT_MOST + self.tail.len()
    }
}

/// Assigns rows, given in seq order as `(scope key, length at most)`, to
/// carrying pointers: rows of one scope share a pointer while it stays
/// under the NOTIFY limit. Pointers are numbered from 0 in the order they
/// open, which is the order of their lowest seqs. `None` when some row is
/// too large to travel in any pointer; the caller then leaves announcing
/// to the outbox trigger, which sends a bare pointer for such a row.
pub fn assign_to_pointers<'a>(
    rows: impl IntoIterator<Item = (&'a str, usize)>,
) -> Option<Vec<i32>> {
    /// The pointer open for a scope: its number and its rows' bytes so far.
    struct Open {
        number: i32,
        bytes: usize,
    }
    let mut open: HashMap<&str, Open> = HashMap::new();
    let mut scope_json_lengths: HashMap<&str, usize> = HashMap::new();
    let mut next_number = 0;
    let mut assigned = Vec::new();
    for (scope_key, len) in rows {
        let scope_json = *scope_json_lengths.entry(scope_key).or_insert_with(|| {
            serde_json::to_string(scope_key).map_or(usize::MAX / 4, |s| s.len())
        });
        let room = MAX_NOTIFY_PAYLOAD_BYTES.checked_sub(scope_json + POINTER_OVERHEAD)?;
        if len > room {
            return None;
        }
        let fits = |pointer: &Open| pointer.bytes + 1 + len <= room;
        match open.get_mut(scope_key) {
            Some(pointer) if fits(pointer) => {
                pointer.bytes += 1 + len;
                assigned.push(pointer.number);
            }
            _ => {
                open.insert(
                    scope_key,
                    Open {
                        number: next_number,
                        bytes: len,
                    },
                );
                assigned.push(next_number);
                next_number += 1;
            }
        }
    }
    Some(assigned)
}

#[cfg(test)]
mod tests {
    use chrono::Utc;
    use serde_json::json;

    use super::*;
    use crate::envelope::NewEvent;
    use crate::notification::{EventNotification, decode_notification};

    fn durable(scope: &str, data: serde_json::Value) -> EventEnvelope {
        NewEvent::durable("order.created", scope, data).into_envelope(Utc::now())
    }

    #[test]
    fn the_parts_around_any_seq_are_the_envelope_with_that_seq() {
        // Data that holds the placeholder's own text must not be split.
        let hostile =
            json!({"seq": 9223372036854775807_i64, "note": "\"seq\":9223372036854775807"});
        for data in [json!({"orderId": 42}), hostile] {
            let mut envelope = durable("org-1", data);
            let parts = EnvelopeAroundSeq::of(&mut envelope).unwrap();
            assert_eq!(envelope.seq, None, "the envelope's own seq is put back");
            for seq in [1_i64, 42, 9_007_199_254_740_993] {
                let joined = format!("{}{seq}{}", parts.head, parts.tail);
                envelope.seq = Some(seq);
                assert_eq!(
                    serde_json::from_str::<EventEnvelope>(&joined).unwrap(),
                    envelope
                );
                assert!(joined.len() <= parts.len_at_most());
            }
        }
    }

    #[test]
    fn rows_fill_a_pointer_per_scope_in_order_of_their_first_rows() {
        let rows = [
            ("a", 2200),
            ("b", 10),
            ("a", 2200),
            ("a", 2200),
            ("b", 10),
            ("a", 10),
        ];
        // The third row of `a` does not fit beside the first two: a new
        // pointer opens (number 2, after `b`'s), and takes `a`'s last row.
        assert_eq!(assign_to_pointers(rows), Some(vec![0, 1, 0, 2, 1, 2]));
    }

    #[test]
    fn a_row_too_large_for_any_pointer_leaves_announcing_to_the_trigger() {
        assert_eq!(assign_to_pointers([("a", 10), ("a", 7990)]), None);
    }

    #[test]
    fn every_assigned_pointer_decodes_and_stays_under_the_limit() {
        let big = "x".repeat(900);
        let mut envelopes: Vec<EventEnvelope> = (0..40)
            .map(|n| {
                durable(
                    if n % 3 == 0 { "a" } else { "b\"quoted" },
                    json!({"n": n, "pad": big}),
                )
            })
            .collect();
        let parts: Vec<EnvelopeAroundSeq> = envelopes
            .iter_mut()
            .map(|e| EnvelopeAroundSeq::of(e).unwrap())
            .collect();
        let numbers = assign_to_pointers(
            envelopes
                .iter()
                .zip(&parts)
                .map(|(e, p)| (e.scope_key.as_str(), p.len_at_most())),
        )
        .unwrap();
        let pointers = numbers.iter().max().map_or(0, |n| n + 1);
        for number in 0..pointers {
            // Seqs as long as they print, as the database would join them.
            let rows: Vec<String> = (0..envelopes.len())
                .filter(|&i| numbers[i] == number)
                .map(|i| {
                    format!(
                        "{}{}{}",
                        parts[i].head,
                        i64::MAX - 40 + i as i64,
                        parts[i].tail
                    )
                })
                .collect();
            let first = numbers.iter().position(|&n| n == number).unwrap();
            let payload = format!(
                r#"{{"k":"ptr","s":{},"q":{},"x":{},"r":[{}]}}"#,
                serde_json::to_string(&envelopes[first].scope_key).unwrap(),
                i64::MAX - 40 + first as i64,
                u64::MAX,
                rows.join(",")
            );
            assert!(
                payload.len() <= MAX_NOTIFY_PAYLOAD_BYTES,
                "{} bytes",
                payload.len()
            );
            match decode_notification(payload.as_bytes()).unwrap() {
                EventNotification::Pointer {
                    carried: Some(carried),
                    ..
                } => {
                    assert_eq!(carried.events.len(), rows.len());
                }
                other => panic!("not a carrying pointer: {other:?}"),
            }
        }
    }
}
