//! Micro-benchmarks of the wire crate's per-event work on the relay's live
//! path: encoding a frame (once per event and stream cursor), opening a
//! sealed notification (once per notification), and evaluating an audience
//! (once per event and subscriber). `cargo bench -p eventrelay-wire`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "benchmark set-up: a panic is a broken benchmark"
)]

use chrono::{TimeZone, Utc};
use divan::{Bencher, black_box};
use eventrelay_wire::sse::event_frame_at;
use eventrelay_wire::{
    Audience, EventEnvelope, Lane, Origin, ResumeCursor, SealKey, Subscriber, is_envelope_permitted,
};
use serde_json::{Value, json};
use uuid::Uuid;

fn main() {
    divan::main();
}

/// A durable event of about 300 bytes encoded, the size the bench's tail
/// rows use.
fn envelope(audience: Option<Audience>) -> EventEnvelope {
    EventEnvelope {
        id: Uuid::from_u128(0x0193_0000_0000_7000_8000_0000_0000_0001),
        event_type: "order.paid".into(),
        scope_key: "org-1".into(),
        lane: Lane::Durable,
        seq: Some(1_234_567),
        data: json!({"orderId": "ord_8f2a", "total": 4200, "currency": "EUR", "note": "x".repeat(80)}),
        audience,
        resources: vec!["order:8f2a".into()],
        occurred_at: Utc.timestamp_micros(1_765_000_000_000_000).unwrap(),
        traceparent: None,
    }
}

#[divan::bench]
fn encode_frame(bencher: Bencher) {
    let event = envelope(None);
    let cursor = Some(ResumeCursor::at(1_234_567, 1_234_560));
    bencher.bench(|| event_frame_at(black_box(&event), black_box(cursor)));
}

/// Notification sizes: a bare pointer, one with rows carried, and the
/// largest plaintext a sealed notification may hold.
#[divan::bench(args = [64, 1_024, eventrelay_wire::MAX_SEALED_PLAINTEXT_BYTES])]
fn open_seal(bencher: Bencher, plaintext_bytes: usize) {
    let key = SealKey::new(&[7u8; eventrelay_wire::seal::SEAL_KEY_BYTES]).unwrap();
    let sealed = key.seal(Origin::Rows, &"p".repeat(plaintext_bytes), [9u8; 16]);
    bencher.bench(|| key.open(black_box(&sealed)).unwrap());
}

/// A subscriber whose grants map resources to actions, as a token's
/// `grants` claim does.
fn granted_subscriber() -> Subscriber {
    Subscriber::new("org-1", "alice").with_evaluator(|permission: &Value| {
        let resource = permission["resource"].as_str().unwrap_or_default();
        let action = permission["action"].as_str().unwrap_or_default();
        resource == "orders" && (action == "read" || action == "*")
    })
}

#[divan::bench(args = ["none", "users", "permission"])]
fn evaluate_audience(bencher: Bencher, kind: &str) {
    let audience = match kind {
        "users" => Some(Audience::users(
            (0..20)
                .map(|n| format!("user-{n}"))
                .chain(["alice".to_owned()]),
        )),
        "permission" => Some(Audience {
            users: None,
            permission: Some(json!({"resource": "orders", "action": "read"})),
        }),
        _ => None,
    };
    let event = envelope(audience);
    let subscriber = granted_subscriber();
    bencher.bench(|| {
        assert!(is_envelope_permitted(
            black_box(&event),
            black_box(&subscriber)
        ));
    });
}
