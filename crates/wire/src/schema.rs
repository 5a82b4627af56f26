//! JSON Schemas (draft 2020-12) of the two JSON documents on the wire,
//! generated from the Rust types so they cannot drift from the code. The
//! checked-in copies under `schema/` are compared against these by a test.

use schemars::{JsonSchema, Schema, generate::SchemaSettings};
use serde_json::Value;

use crate::{EventEnvelope, EventNotification};

/// Where the published copies live, relative to the repository root.
pub const ENVELOPE_SCHEMA_FILE: &str = "schema/event-envelope.schema.json";
/// Where the published copy of the notification schema lives.
pub const NOTIFICATION_SCHEMA_FILE: &str = "schema/event-notification.schema.json";

const ID_BASE: &str = "https://eventrelay.dev/schema/";

/// The schema of [`EventEnvelope`].
pub fn envelope_schema() -> Value {
    generate::<EventEnvelope>("event-envelope.schema.json")
}

/// The schema of [`EventNotification`].
pub fn notification_schema() -> Value {
    generate::<EventNotification>("event-notification.schema.json")
}

/// The schema as the checked-in file holds it: pretty JSON, trailing newline.
pub fn to_file_text(schema: &Value) -> String {
    #[allow(
        clippy::expect_used,
        reason = "a serde_json Value always serialises: its map keys are strings"
    )]
    let mut text = serde_json::to_string_pretty(schema).expect("a schema is always JSON");
    text.push('\n');
    text
}

fn generate<T: JsonSchema>(file: &str) -> Value {
    let generator = SchemaSettings::draft2020_12().into_generator();
    let schema: Schema = generator.into_root_schema_for::<T>();
    let mut value = schema.to_value();
    if let Value::Object(object) = &mut value {
        object.insert("$id".into(), Value::String(format!("{ID_BASE}{file}")));
    }
    value
}
