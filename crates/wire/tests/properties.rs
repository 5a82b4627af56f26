//! Property tests: the codec round-trips, decoding arbitrary input never
//! panics, and a pointer read without its rows agrees with the full decode.
//! (SSE frames are read back by the client crate's parser in its own tests.)

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    reason = "test code: a panic is the test failing, and figures are printed for the reader"
)]

use chrono::{TimeZone, Utc};
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
            traceparent: None,
        }
    }
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
}
