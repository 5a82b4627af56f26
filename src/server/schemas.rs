//! The publish API's event schemas, read from `publish.schemas_dir`: the
//! registry that checks payloads, and the catalog that shows them.

use std::path::Path;

use eventrelay_publisher::SchemaRegistry;

use crate::catalog::EventCatalog;

/// Why `publish.schemas_dir` could not be loaded; each names the file.
#[derive(Debug, thiserror::Error)]
pub enum SchemaLoadError {
    #[error("publish.schemas_dir: cannot read {}: {source}", .path.display())]
    Read {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("publish.schemas_dir: {} is not JSON: {source}", .path.display())]
    Json {
        path: std::path::PathBuf,
        source: serde_json::Error,
    },
    #[error("publish.schemas_dir: {}: {source}", .path.display())]
    Schema {
        path: std::path::PathBuf,
        source: eventrelay_publisher::SchemaError,
    },
}

/// Loads `<event type>.json` schemas from a directory.
pub fn load_schemas(dir: &Path) -> Result<(SchemaRegistry, EventCatalog), SchemaLoadError> {
    let mut registry = SchemaRegistry::new();
    let mut catalog = EventCatalog::default();
    let unreadable = |path: &Path| {
        let path = path.to_path_buf();
        move |source| SchemaLoadError::Read { path, source }
    };
    let entries = std::fs::read_dir(dir).map_err(unreadable(dir))?;
    for entry in entries {
        let path = entry.map_err(unreadable(dir))?.path();
        let Some(event_type) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".json"))
        else {
            continue;
        };
        let text = std::fs::read_to_string(&path).map_err(unreadable(&path))?;
        let schema = serde_json::from_str(&text).map_err(|source| SchemaLoadError::Json {
            path: path.clone(),
            source,
        })?;
        registry
            .register(event_type, &schema)
            .map_err(|source| SchemaLoadError::Schema {
                path: path.clone(),
                source,
            })?;
        catalog.add(event_type, &schema);
    }
    Ok((registry, catalog))
}
