//! Typed emit: a registry of JSON Schemas, one per event type.
//!
//! Opt-in. When a publisher has a registry it is authoritative: an event
//! type it does not list, or a payload its schema rejects, is an error and
//! nothing is written.

use std::collections::HashMap;
use std::fmt;

use serde_json::Value;

/// Why a payload or a schema was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchemaError {
    #[error(
        "event type {0:?} is not registered; a publisher with a schema registry only emits registered types"
    )]
    Unregistered(String),
    #[error("data for {event_type:?} does not match its schema: {}", .errors.join("; "))]
    Invalid {
        event_type: String,
        errors: Vec<String>,
    },
    #[error("the schema for {event_type:?} is not a valid JSON Schema: {message}")]
    BadSchema { event_type: String, message: String },
}

/// JSON Schemas for event payloads, keyed by event type.
#[derive(Default)]
pub struct SchemaRegistry {
    validators: HashMap<String, jsonschema::Validator>,
}

impl fmt::Debug for SchemaRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut types: Vec<&String> = self.validators.keys().collect();
        types.sort();
        f.debug_struct("SchemaRegistry")
            .field("types", &types)
            .finish()
    }
}

/// Most validation messages reported for one payload.
const MAX_REPORTED_ERRORS: usize = 5;

impl SchemaRegistry {
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers (or replaces) the schema for `event_type`. The schema's
    /// `$schema` picks the draft; draft 2020-12 when absent.
    pub fn register(&mut self, event_type: &str, schema: &Value) -> Result<(), SchemaError> {
        let validator = jsonschema::validator_for(schema).map_err(|e| SchemaError::BadSchema {
            event_type: event_type.to_owned(),
            message: e.to_string(),
        })?;
        self.validators.insert(event_type.to_owned(), validator);
        Ok(())
    }

    /// Builder form of [`register`](Self::register).
    pub fn with(mut self, event_type: &str, schema: &Value) -> Result<Self, SchemaError> {
        self.register(event_type, schema)?;
        Ok(self)
    }

    /// Whether `event_type` has a schema.
    pub fn contains(&self, event_type: &str) -> bool {
        self.validators.contains_key(event_type)
    }

    /// Checks a payload against its type's schema.
    pub fn check(&self, event_type: &str, data: &Value) -> Result<(), SchemaError> {
        let validator = self
            .validators
            .get(event_type)
            .ok_or_else(|| SchemaError::Unregistered(event_type.to_owned()))?;
        let errors: Vec<String> = validator
            .iter_errors(data)
            .take(MAX_REPORTED_ERRORS)
            .map(|e| {
                let path = e.instance_path().to_string();
                if path.is_empty() {
                    e.to_string()
                } else {
                    format!("at {path}: {e}")
                }
            })
            .collect();
        if errors.is_empty() {
            Ok(())
        } else {
            Err(SchemaError::Invalid {
                event_type: event_type.to_owned(),
                errors,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn registry() -> SchemaRegistry {
        SchemaRegistry::new()
            .with(
                "order.created",
                &json!({
                    "type": "object",
                    "properties": {"orderId": {"type": "integer"}},
                    "required": ["orderId"],
                    "additionalProperties": false
                }),
            )
            .unwrap()
    }

    #[test]
    fn accepts_matching_data() {
        assert_eq!(
            registry().check("order.created", &json!({"orderId": 4})),
            Ok(())
        );
    }

    #[test]
    fn refuses_unregistered_types_and_bad_data() {
        let registry = registry();
        assert_eq!(
            registry.check("order.deleted", &json!({})),
            Err(SchemaError::Unregistered("order.deleted".into()))
        );
        let err = registry
            .check("order.created", &json!({"orderId": "4"}))
            .unwrap_err();
        match err {
            SchemaError::Invalid { errors, .. } => assert!(errors[0].contains("/orderId")),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn refuses_a_broken_schema() {
        let err = SchemaRegistry::new()
            .with("x", &json!({"type": "no-such-type"}))
            .unwrap_err();
        assert!(matches!(err, SchemaError::BadSchema { .. }));
    }
}
