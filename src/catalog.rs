//! The event catalog: the event types `publish.schemas_dir` defines, each
//! with its JSON Schema and what the schema says of itself (`description`,
//! `examples`), for the app's developers, its customers choosing what a
//! webhook subscribes to, and the console.

use serde::Serialize;
use serde_json::Value;

/// One event type of the catalog.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CatalogEntry {
    #[serde(rename = "type")]
    pub event_type: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    pub schema: Value,
    /// The schema's `examples`, when it has them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub examples: Option<Value>,
}

/// Every event type with a schema, sorted by type. Empty without a
/// schemas directory.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EventCatalog {
    pub event_types: Vec<CatalogEntry>,
}

impl EventCatalog {
    /// Adds `event_type`'s schema, keeping the catalog sorted.
    pub fn add(&mut self, event_type: &str, schema: &Value) {
        let entry = CatalogEntry {
            event_type: event_type.to_owned(),
            description: schema
                .get("description")
                .and_then(Value::as_str)
                .map(str::to_owned),
            schema: schema.clone(),
            examples: schema.get("examples").cloned(),
        };
        let at = self
            .event_types
            .partition_point(|known| known.event_type.as_str() < event_type);
        self.event_types.insert(at, entry);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn entries_are_sorted_and_carry_what_the_schema_says_of_itself() {
        let mut catalog = EventCatalog::default();
        catalog.add("order.shipped", &json!({"type": "object"}));
        catalog.add(
            "order.created",
            &json!({"description": "An order was placed", "examples": [{"orderId": 1}]}),
        );
        let answer = serde_json::to_value(&catalog).unwrap();
        assert_eq!(answer["eventTypes"][0]["type"], "order.created");
        assert_eq!(
            answer["eventTypes"][0]["description"],
            "An order was placed"
        );
        assert_eq!(answer["eventTypes"][0]["examples"], json!([{"orderId": 1}]));
        assert_eq!(answer["eventTypes"][1]["type"], "order.shipped");
        assert!(answer["eventTypes"][1].get("description").is_none());
        assert_eq!(answer["eventTypes"][1]["schema"], json!({"type": "object"}));
    }
}
