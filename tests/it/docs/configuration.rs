//! `docs/src/configuration.md` lists every setting the service accepts, with
//! its default and its environment variable, and nothing else.

use std::collections::BTreeMap;

use eventrelay::auth::{ForwardConfig, JwtConfig};
use eventrelay::config::Config;
use serde_json::{Value, json};

const CHAPTER: &str = "docs/src/configuration.md";
const HEADER: [&str; 4] = ["setting", "default", "environment variable", "meaning"];

/// `a.b.c` for every leaf of `value`; arrays are leaves.
fn flatten(prefix: &str, value: &Value, out: &mut BTreeMap<String, Value>) {
    match value {
        Value::Object(map) => {
            for (key, value) in map {
                let key = if prefix.is_empty() {
                    key.clone()
                } else {
                    format!("{prefix}.{key}")
                };
                flatten(&key, value, out);
            }
        }
        leaf => {
            out.insert(prefix.to_owned(), leaf.clone());
        }
    }
}

/// The field names a `deny_unknown_fields` struct accepts, as its own error
/// message lists them.
fn accepted_fields<T: serde::de::DeserializeOwned>() -> Vec<String> {
    let Err(error) = serde_json::from_value::<T>(json!({"not a setting": 0})) else {
        panic!("an unknown field was accepted");
    };
    let message = error.to_string();
    let expected = message
        .split_once("expected")
        .unwrap_or_else(|| panic!("no field list in {message:?}"))
        .1;
    expected
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// Every setting with its default (`null` for none), from the code.
fn settings_in_code() -> BTreeMap<String, Value> {
    let mut settings = BTreeMap::new();
    flatten(
        "",
        &serde_json::to_value(Config::default()).unwrap(),
        &mut settings,
    );

    // `[auth]` is not serialized (it holds secrets) and has no default: no
    // table means development mode. Its keys depend on `mode`.
    settings.insert("auth.mode".into(), Value::Null);
    let jwt = JwtConfig::default();
    let jwt_defaults = BTreeMap::from([
        ("algorithm", json!(format!("{:?}", jwt.algorithm))),
        ("secret", json!(jwt.secret.as_ref().map(|_| "***"))),
        ("public_key_file", json!(jwt.public_key_file)),
        ("jwks_file", json!(jwt.jwks_file)),
        ("issuer", json!(jwt.issuer)),
        ("audience", json!(jwt.audience)),
        ("subscriber_claim", json!(jwt.subscriber_claim)),
        ("scope_claim", json!(jwt.scope_claim)),
        ("grants_claim", json!(jwt.grants_claim)),
        ("leeway_secs", json!(jwt.leeway_secs)),
        ("query_param", json!(jwt.query_param)),
    ]);
    let mut jwt_fields = accepted_fields::<JwtConfig>();
    jwt_fields.sort();
    let mut listed: Vec<String> = jwt_defaults.keys().map(|key| (*key).to_owned()).collect();
    listed.sort();
    assert_eq!(
        jwt_fields, listed,
        "JwtConfig's fields changed: update this test and {CHAPTER}"
    );

    let forward: ForwardConfig = serde_json::from_value(json!({"url": "http://app/auth"})).unwrap();
    let forward_defaults = BTreeMap::from([
        ("url", Value::Null),
        ("timeout_ms", json!(forward.timeout_ms)),
        ("cache_secs", json!(forward.cache_secs)),
        ("query_param", json!(forward.query_param)),
    ]);
    let mut forward_fields = accepted_fields::<ForwardConfig>();
    forward_fields.sort();
    let mut listed: Vec<String> = forward_defaults
        .keys()
        .map(|key| (*key).to_owned())
        .collect();
    listed.sort();
    assert_eq!(
        forward_fields, listed,
        "ForwardConfig's fields changed: update this test and {CHAPTER}"
    );

    for (key, default) in jwt_defaults.into_iter().chain(forward_defaults) {
        settings.insert(format!("auth.{key}"), default);
    }
    settings
}

/// The environment variable of a setting: figment's `EVENTRELAY_` prefix,
/// with `__` between nested keys (`Config::load` is checked to read them so
/// in `src/config.rs`'s tests, which may change the process's environment).
fn environment_variable(setting: &str) -> String {
    format!("EVENTRELAY_{}", setting.to_uppercase().replace('.', "__"))
}

struct Row {
    default: String,
    environment: String,
}

/// The rows of the reference tables: every table whose header is
/// `setting | default | environment variable | meaning`.
fn documented() -> BTreeMap<String, Row> {
    let chapter = super::read(CHAPTER);
    let mut rows = BTreeMap::new();
    let mut in_reference = false;
    for line in super::prose_lines(&chapter) {
        let Some(cells) = super::table_cells(line) else {
            in_reference = false;
            continue;
        };
        if cells == HEADER {
            in_reference = true;
            continue;
        }
        if !in_reference || cells.iter().all(|cell| cell.starts_with("---")) {
            continue;
        }
        assert_eq!(
            cells.len(),
            4,
            "{CHAPTER}: a reference row needs four cells: {line}"
        );
        let setting = cells[0].trim_matches('`').to_owned();
        let previous = rows.insert(
            setting.clone(),
            Row {
                default: cells[1].clone(),
                environment: cells[2].clone(),
            },
        );
        assert!(previous.is_none(), "{CHAPTER}: {setting} is listed twice");
    }
    rows
}

/// A default cell: `none`, or a JSON (and TOML) value in backticks.
fn parse_default(setting: &str, cell: &str) -> Value {
    if cell == "none" {
        return Value::Null;
    }
    let literal = cell
        .strip_prefix('`')
        .and_then(|cell| cell.strip_suffix('`'))
        .unwrap_or_else(|| {
            panic!("{CHAPTER}: {setting}: the default {cell:?} is neither none nor `value`")
        });
    serde_json::from_str(literal).unwrap_or_else(|e| {
        panic!("{CHAPTER}: {setting}: the default {literal} does not parse: {e}")
    })
}

#[test]
fn the_reference_lists_every_setting_with_its_default_and_variable() {
    let code = settings_in_code();
    let docs = documented();
    let missing: Vec<&String> = code.keys().filter(|key| !docs.contains_key(*key)).collect();
    assert!(
        missing.is_empty(),
        "settings missing from {CHAPTER}: {missing:?}"
    );
    let unknown: Vec<&String> = docs.keys().filter(|key| !code.contains_key(*key)).collect();
    assert!(
        unknown.is_empty(),
        "{CHAPTER} lists settings the code does not have: {unknown:?}"
    );
    for (setting, default) in &code {
        let row = &docs[setting];
        let documented = parse_default(setting, &row.default);
        assert_eq!(
            &documented, default,
            "{CHAPTER}: the default of {setting} is {documented}, the code's is {default}"
        );
        let variable = format!("`{}`", environment_variable(setting));
        assert!(
            row.environment.contains(&variable),
            "{CHAPTER}: {setting} should name {variable}, not {:?}",
            row.environment
        );
    }
}
