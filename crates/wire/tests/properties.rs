//! Property tests: the codec round-trips, decoding arbitrary input never
//! panics, a pointer read without its rows agrees with the full decode,
//! and SSE frames read back exactly as written by a reader that
//! follows the EventSource parsing rules.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    reason = "test code: a panic is the test failing, and figures are printed for the reader"
)]

use chrono::{TimeZone, Utc};
use eventrelay_wire::ResumeCursor;
use eventrelay_wire::sse::frame;
use eventrelay_wire::{
    Audience, DecodeError, EventEnvelope, EventNotification, Lane, MAX_NOTIFY_PAYLOAD_BYTES,
    decode_notification, defer_carried_rows, encode_inline, encode_pointer,
};
use proptest::prelude::*;
use serde_json::{Value, json};
use uuid::Uuid;

fn scope_key() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9:_\\-./ é]{1,40}"
}

fn json_leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        ".{0,20}".prop_map(Value::String),
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    json_leaf().prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[a-z]{1,6}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn audience() -> impl Strategy<Value = Option<Audience>> {
    prop::option::of(
        (
            prop::option::of(prop::collection::vec("[a-z0-9]{1,8}", 0..3)),
            prop::option::of(json_leaf().prop_filter("null means absent", |v| !v.is_null())),
        )
            .prop_map(|(users, permission)| Audience { users, permission }),
    )
}

prop_compose! {
    fn ephemeral_envelope()(
        id in any::<u128>(),
        event_type in "[a-z]{1,10}(\\.[a-z]{1,10}){0,2}",
        scope in scope_key(),
        data in json_value(),
        audience in audience(),
        resources in prop::collection::vec("[a-z]{1,5}:[0-9]{1,4}", 0..3),
        micros in 0i64..4_000_000_000_000_000,
    ) -> EventEnvelope {
        EventEnvelope {
            id: Uuid::from_u128(id),
            event_type,
            scope_key: scope,
            lane: Lane::Ephemeral,
            seq: None,
            data,
            audience,
            resources,
            occurred_at: Utc.timestamp_micros(micros).unwrap(),
        }
    }
}

/// A minimal reader of one frame following the EventSource rules: lines end
/// at CRLF, CR or LF; `field: value` strips one leading space; `data` lines
/// join with `\n`.
fn read_frame(text: &str) -> (Option<String>, Option<String>, String) {
    let mut id = None;
    let mut event = None;
    let mut data: Vec<String> = Vec::new();
    let normalized = text.replace("\r\n", "\n").replace('\r', "\n");
    let body = normalized
        .strip_suffix("\n\n")
        .expect("a frame ends with a blank line");
    assert!(!body.contains("\n\n"), "frame ended early: {text:?}");
    for line in body.split('\n') {
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value).to_owned();
        match field {
            "id" => id = Some(value),
            "event" => event = Some(value),
            "data" => data.push(value),
            other => panic!("unexpected field {other:?} in {text:?}"),
        }
    }
    (id, event, data.join("\n"))
}

proptest! {
    #[test]
    fn pointers_round_trip(scope in scope_key(), seq in 1i64..i64::MAX) {
        let payload = encode_pointer(&scope, seq).unwrap();
        prop_assert_eq!(
            decode_notification(payload.as_bytes()).unwrap(),
            EventNotification::Pointer { scope_key: scope, seq, carried: None }
        );
    }

    #[test]
    fn inline_events_round_trip(envelope in ephemeral_envelope()) {
        let payload = encode_inline(&envelope).unwrap();
        prop_assert_eq!(
            decode_notification(payload.as_bytes()).unwrap(),
            EventNotification::Inline { envelope }
        );
    }

    #[test]
    fn decoding_arbitrary_bytes_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode_notification(&bytes);
    }

    #[test]
    fn decoding_json_like_text_never_panics(text in r#"\{("[a-z]{1,2}":("[a-z]*"|[0-9\-\.e]{1,8}|null|\{\}|\[\]|true),?){0,5}\}"#) {
        let _ = decode_notification(text.as_bytes());
    }

    #[test]
    fn a_deferred_pointer_agrees_with_the_full_decode(
        text in r#"\{"k":"(ptr|ptr|evt)","s":"(org-1|org-1|org\\n1)","q":(7|7|0|7\.5),"x":(9|9|null|-1),"r":(\[\]|\[1\]|\[\{\}\]|"a"|null)\}"#
    ) {
        let _ = defer_carried_rows(&text, text.len().saturating_sub(1));
        if let Some(deferred) = defer_carried_rows(&text, MAX_NOTIFY_PAYLOAD_BYTES) {
            match decode_notification(text.as_bytes()) {
                Ok(EventNotification::Pointer { scope_key, seq, carried: Some(rows) }) => {
                    prop_assert_eq!((scope_key, seq), (deferred.scope_key.clone(), deferred.seq));
                    prop_assert_eq!(deferred.decode_rows(), Ok(rows));
                }
                Err(DecodeError::UnreadableCarriedRows { scope_key, seq, reason }) => {
                    prop_assert_eq!((scope_key, seq), (deferred.scope_key.clone(), deferred.seq));
                    prop_assert_eq!(deferred.decode_rows(), Err(reason));
                }
                other => prop_assert!(false, "{} was deferred but decodes as {:?}", text, other),
            }
        }
    }

    #[test]
    fn sse_frames_read_back_exactly(
        id in prop::option::of((1i64..i64::MAX, prop::option::of((any::<u64>(), prop::option::of(0u32..0x100_0000))))),
        event in "[^\r\n]{1,20}",
        data in "(.|\r|\n){0,60}",
    ) {
        let id = id.map(|(seq, horizon)| ResumeCursor {
            seq,
            horizon: horizon.map(|(horizon, _)| horizon),
            check: horizon.and_then(|(_, check)| check),
        });
        let text = frame(id, Some(&event), &data);
        let (read_id, read_event, read_data) = read_frame(&text);
        prop_assert_eq!(read_id.map(|i| i.parse::<ResumeCursor>().unwrap()), id);
        prop_assert_eq!(read_event, Some(event));
        let expected_data = data.replace("\r\n", "\n").replace('\r', "\n");
        prop_assert_eq!(read_data, expected_data);
    }

    #[test]
    fn event_fields_with_line_breaks_stay_one_field(event in "(.|\r|\n){1,30}", data in "[^\r\n]{0,10}") {
        let text = frame(Some(ResumeCursor::at(1, 2)), Some(&event), &data);
        let (_, read_event, read_data) = read_frame(&text);
        prop_assert!(read_event.is_some());
        prop_assert_eq!(read_data, data);
    }
}
