//! The checked-in JSON Schemas match the Rust types, and what the codec
//! encodes validates against them (checked with a JSON Schema validator, not
//! with serde).
//!
//! Run with `EVENTRELAY_UPDATE_SCHEMAS=1` to rewrite the files after changing
//! a wire type.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    reason = "test code: a panic is the test failing, and figures are printed for the reader"
)]

use std::path::PathBuf;

use chrono::Utc;
use eventrelay_wire::schema::{
    ENVELOPE_SCHEMA_FILE, NOTIFICATION_SCHEMA_FILE, envelope_schema, notification_schema,
    to_file_text,
};
use eventrelay_wire::{Audience, NewEvent, encode_inline, encode_pointer, encode_pointer_carrying};
use serde_json::{Value, json};

fn repo_file(relative: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(relative)
}

fn check_file(relative: &str, generated: &Value) {
    let path = repo_file(relative);
    let expected = to_file_text(generated);
    if std::env::var_os("EVENTRELAY_UPDATE_SCHEMAS").is_some() {
        std::fs::write(&path, &expected).unwrap();
        return;
    }
    let actual = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    assert!(
        actual == expected,
        "{relative} is out of date with the Rust types; run \
         `EVENTRELAY_UPDATE_SCHEMAS=1 cargo test -p eventrelay-wire --test schemas` and commit the result"
    );
}

fn validator(relative: &str) -> jsonschema::Validator {
    let text = std::fs::read_to_string(repo_file(relative)).unwrap();
    let schema: Value = serde_json::from_str(&text).unwrap();
    jsonschema::draft202012::new(&schema).expect("schema compiles")
}

fn assert_valid(validator: &jsonschema::Validator, instance: &Value) {
    let errors: Vec<String> = validator
        .iter_errors(instance)
        .map(|e| e.to_string())
        .collect();
    assert!(errors.is_empty(), "{instance} is invalid: {errors:?}");
}

#[test]
fn checked_in_envelope_schema_is_current() {
    check_file(ENVELOPE_SCHEMA_FILE, &envelope_schema());
}

#[test]
fn checked_in_notification_schema_is_current() {
    check_file(NOTIFICATION_SCHEMA_FILE, &notification_schema());
}

#[test]
fn schemas_declare_draft_2020_12() {
    for schema in [envelope_schema(), notification_schema()] {
        assert_eq!(
            schema["$schema"],
            "https://json-schema.org/draft/2020-12/schema"
        );
    }
}

#[test]
fn encoded_notifications_validate() {
    let notifications = validator(NOTIFICATION_SCHEMA_FILE);
    let pointer: Value = serde_json::from_str(&encode_pointer("org-1", 5).unwrap()).unwrap();
    assert_valid(&notifications, &pointer);

    let mut row = NewEvent::durable("order.created", "org-1", json!({"orderId": 1}))
        .with_audience(Audience::users(["u1"]))
        .into_envelope(Utc::now());
    row.seq = Some(5);
    let carrying: Value =
        serde_json::from_str(&encode_pointer_carrying(812, &[row]).unwrap()).unwrap();
    assert_valid(&notifications, &carrying);

    let envelope = NewEvent::ephemeral("sync.progress", "org-1", json!({"done": 1}))
        .with_audience(Audience::users(["u1"]))
        .with_resources(["job:1"])
        .into_envelope(Utc::now());
    let inline: Value = serde_json::from_str(&encode_inline(&envelope).unwrap()).unwrap();
    assert_valid(&notifications, &inline);
}

#[test]
fn envelopes_validate_and_bad_ones_do_not() {
    let envelopes = validator(ENVELOPE_SCHEMA_FILE);
    let mut durable = NewEvent::durable("order.created", "org-1", json!({"orderId": 1}))
        .with_audience(Audience::permission(json!({"orders": ["read"]})))
        .into_envelope(Utc::now());
    durable.seq = Some(12);
    assert_valid(&envelopes, &serde_json::to_value(&durable).unwrap());

    let mut missing_type = serde_json::to_value(&durable).unwrap();
    missing_type.as_object_mut().unwrap().remove("type");
    assert!(!envelopes.is_valid(&missing_type));

    let mut bad_lane = serde_json::to_value(&durable).unwrap();
    bad_lane["lane"] = json!("sometimes");
    assert!(!envelopes.is_valid(&bad_lane));

    let mut bad_audience = serde_json::to_value(&durable).unwrap();
    bad_audience["audience"] = json!({"roles": ["admin"]});
    assert!(!envelopes.is_valid(&bad_audience));
}

#[test]
fn malformed_notifications_do_not_validate() {
    let notifications = validator(NOTIFICATION_SCHEMA_FILE);
    for bad in [
        json!({"k": "ptr", "s": "org"}),
        json!({"k": "ptr", "s": "org", "q": 0}),
        json!({"k": "zip"}),
        json!({"k": "evt"}),
        json!({"k": "ptr", "s": "org", "q": 1, "x": 5, "r": []}),
        json!({"k": "ptr", "s": "org", "q": 1, "x": 5}),
        json!({"k": "ptr", "s": "org", "q": 1, "x": "5", "r": [{"id": "nope"}]}),
    ] {
        assert!(!notifications.is_valid(&bad), "{bad} should be invalid");
    }
}
