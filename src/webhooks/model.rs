//! The webhook domain's values: subscriptions, deliveries and attempts as
//! stored and shown, and the rules a subscription must follow wherever it
//! comes from (the admin API, the command line or the configuration file).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::secret::Secret;

/// A subscription field that breaks a rule; the message names the field as
/// the API spells it (`scopeKey`, not `scope_key`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct InvalidSubscription {
    pub field: &'static str,
    pub message: String,
}

fn invalid(field: &'static str, message: impl Into<String>) -> InvalidSubscription {
    InvalidSubscription {
        field,
        message: message.into(),
    }
}

/// A webhook subscription as stored. The secrets are only for signing and
/// are never shown by listings.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Subscription {
    pub id: String,
    pub url: String,
    #[serde(skip)]
    pub secret: String,
    #[serde(skip)]
    pub previous_secret: Option<String>,
    pub previous_secret_expires_at: Option<DateTime<Utc>>,
    pub types: Vec<String>,
    pub scope_key: Option<String>,
    pub source: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl Subscription {
    /// The secrets to sign with now: the current one, and the previous one
    /// while its grace window lasts.
    pub fn signing_secrets(&self, now: DateTime<Utc>) -> Vec<&str> {
        let mut secrets = vec![self.secret.as_str()];
        if let (Some(previous), Some(until)) =
            (&self.previous_secret, self.previous_secret_expires_at)
            && until > now
        {
            secrets.push(previous);
        }
        secrets
    }
}

/// A subscription to create (from configuration or the admin API).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NewSubscription {
    pub id: String,
    pub url: String,
    pub secret: Secret,
    #[serde(default = "all_types")]
    pub types: Vec<String>,
    #[serde(default, alias = "scope_key")]
    pub scope_key: Option<String>,
}

fn all_types() -> Vec<String> {
    vec!["*".to_owned()]
}

/// Changes to a subscription; absent fields stay as they are.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SubscriptionPatch {
    pub url: Option<String>,
    pub types: Option<Vec<String>>,
    /// `Some(None)` clears the scope filter.
    #[serde(default, with = "double_option")]
    pub scope_key: Option<Option<String>>,
}

mod double_option {
    use serde::{Deserialize, Deserializer};

    pub fn deserialize<'de, D, T>(deserializer: D) -> Result<Option<Option<T>>, D::Error>
    where
        D: Deserializer<'de>,
        T: Deserialize<'de>,
    {
        Option::<T>::deserialize(deserializer).map(Some)
    }
}

/// Checks what the database would refuse, with messages that name the field.
pub fn validate_subscription(
    id: Option<&str>,
    url: Option<&str>,
    types: Option<&[String]>,
) -> Result<(), InvalidSubscription> {
    if let Some(id) = id {
        let ok = !id.is_empty()
            && id.len() <= 100
            && id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_.:-".contains(c));
        if !ok {
            return Err(invalid("id", "1 to 100 letters, digits and `_.:-`"));
        }
    }
    if let Some(url) = url
        && !(url.starts_with("https://") || url.starts_with("http://"))
    {
        return Err(invalid("url", "must be an http:// or https:// URL"));
    }
    if let Some(types) = types {
        if types.is_empty() {
            return Err(invalid(
                "types",
                "at least one pattern (`*` for every event)",
            ));
        }
        for pattern in types {
            let body = pattern.strip_suffix(".*").unwrap_or(pattern);
            let ok = pattern == "*" || (!body.is_empty() && !body.contains('*'));
            if !ok {
                return Err(invalid(
                    "types",
                    format!("{pattern:?} is not an exact type, `prefix.*` or `*`"),
                ));
            }
        }
    }
    Ok(())
}

/// An empty scope key would match no event at all, which is never intended.
fn check_scope_key(scope_key: Option<&str>) -> Result<(), InvalidSubscription> {
    if scope_key.is_some_and(str::is_empty) {
        return Err(invalid(
            "scopeKey",
            "must not be empty; leave it out (or null) for every scope",
        ));
    }
    Ok(())
}

/// Checks what [`validate_subscription`] leaves to the database: a URL that
/// parses and names a host, type patterns and a non-empty scope key that
/// could match an event (no control characters, at most 200 bytes), and a
/// secret without control characters. Postgres text cannot hold NUL, so
/// without this such input would fail in the database instead of being
/// refused here. The admin API, the command line and the configuration file
/// all apply it.
pub fn validate_subscription_fields(
    url: Option<&str>,
    types: Option<&[String]>,
    scope_key: Option<&str>,
    secret: Option<&str>,
) -> Result<(), InvalidSubscription> {
    check_scope_key(scope_key)?;
    if let Some(url) = url {
        if url.chars().any(|c| c.is_control() || c.is_whitespace()) {
            return Err(invalid(
                "url",
                "must not contain whitespace or control characters",
            ));
        }
        let parsed =
            reqwest::Url::parse(url).map_err(|e| invalid("url", format!("not a URL: {e}")))?;
        if parsed.host_str().is_none_or(str::is_empty) {
            return Err(invalid("url", "has no host"));
        }
    }
    for pattern in types.unwrap_or_default() {
        let body = pattern.strip_suffix(".*").unwrap_or(pattern);
        if pattern != "*" {
            eventrelay_wire::validate_event_type(body)
                .map_err(|e| invalid("types", format!("{pattern:?}: {e}")))?;
        }
    }
    if let Some(scope_key) = scope_key {
        eventrelay_wire::validate_scope_key(scope_key)
            .map_err(|e| invalid("scopeKey", e.to_string()))?;
    }
    if secret.is_some_and(|secret| secret.chars().any(char::is_control)) {
        return Err(invalid("secret", "must not contain control characters"));
    }
    Ok(())
}

/// One delivery in the log.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Delivery {
    pub id: i64,
    pub subscription_id: String,
    pub event_seq: i64,
    pub event_id: Uuid,
    pub event_type: String,
    pub scope_key: String,
    pub status: String,
    pub attempts: i32,
    pub next_attempt_at: DateTime<Utc>,
    pub last_status: Option<i32>,
    pub last_error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// One attempt of a delivery.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Attempt {
    pub attempt: i32,
    pub started_at: DateTime<Utc>,
    pub duration_ms: i32,
    pub status_code: Option<i32>,
    pub error: Option<String>,
    pub outcome: String,
}

/// Which deliveries to list; newest first, `before` is the paging cursor.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeliveryFilter {
    pub scope_key: Option<String>,
    pub status: Option<String>,
    pub event_id: Option<Uuid>,
    pub subscription_id: Option<String>,
    pub before: Option<i64>,
    pub limit: Option<i64>,
}

/// Most deliveries one listing returns.
pub const MAX_PAGE: i64 = 500;

/// A delivery leased to one worker for one attempt.
#[derive(Debug, Clone)]
pub struct Claimed {
    pub id: i64,
    pub subscription_id: String,
    pub event_id: Uuid,
    pub payload: serde_json::Value,
    /// This attempt's number, starting at 1.
    pub attempt: i32,
}

/// How an attempt ended, and what happens next.
#[derive(Debug, Clone, PartialEq)]
pub struct AttemptRecord {
    pub started_at: DateTime<Utc>,
    pub duration_ms: i32,
    pub status_code: Option<i32>,
    pub error: Option<String>,
    /// `delivered`, `retry`, `dead` or `gone`.
    pub outcome: &'static str,
    /// For `retry`: when to try again.
    pub next_attempt_at: Option<DateTime<Utc>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subscription_fields_are_checked_with_named_errors() {
        assert!(
            validate_subscription(Some("tickets"), Some("https://x"), Some(&["a.*".into()]))
                .is_ok()
        );
        assert!(
            validate_subscription(Some("bad id!"), None, None)
                .unwrap_err()
                .to_string()
                .starts_with("id:")
        );
        assert!(
            validate_subscription(None, Some("ftp://x"), None)
                .unwrap_err()
                .to_string()
                .starts_with("url:")
        );
        for bad in ["", "a*b", ".*", "**"] {
            assert!(
                validate_subscription(None, None, Some(&[bad.into()])).is_err(),
                "{bad}"
            );
        }
        assert!(validate_subscription(None, None, Some(&[])).is_err());
        assert!(
            validate_subscription(None, None, Some(&["*".into(), "order.created".into()])).is_ok()
        );
    }

    #[test]
    fn the_previous_secret_signs_only_during_its_grace_window() {
        let now = Utc::now();
        let mut subscription = Subscription {
            id: "s".into(),
            url: "https://x".into(),
            secret: "new".into(),
            previous_secret: Some("old".into()),
            previous_secret_expires_at: Some(now + chrono::Duration::minutes(1)),
            types: vec!["*".into()],
            scope_key: None,
            source: "api".into(),
            created_at: now,
            updated_at: now,
        };
        assert_eq!(subscription.signing_secrets(now), ["new", "old"]);
        subscription.previous_secret_expires_at = Some(now - chrono::Duration::minutes(1));
        assert_eq!(subscription.signing_secrets(now), ["new"]);
    }
}
