//! The webhook domain's values: subscriptions, deliveries and attempts as
//! stored and shown, and the rules a subscription must follow wherever it
//! comes from (the admin API, the command line or the configuration file).
//!
//! It also owns the names of a delivery's statuses ([`DeliveryStatus`]) and
//! of an attempt's outcomes ([`AttemptOutcome`]): the database's text
//! columns, the API's JSON, the command line's filter and the metrics'
//! labels all take them from these enums, so no other module spells one.

use std::fmt;
use std::str::FromStr;

use bytes::BytesMut;
use chrono::{DateTime, Utc};
use eventrelay_wire::webhook::{SecretError, WebhookSecret};
use serde::{Deserialize, Serialize};
use strum::IntoEnumIterator;
use tokio_postgres::types::{FromSql, IsNull, ToSql, Type, accepts, to_sql_checked};
use uuid::Uuid;

use crate::secret::{Secret, redact_url};

/// A subscription field that breaks a rule; the message names the field as
/// the API spells it (`scopeKey`, not `scope_key`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct InvalidSubscription {
    pub field: &'static str,
    pub message: String,
    /// Set when the fault is a secret shorter than
    /// [`MIN_SECRET_BYTES`](eventrelay_wire::webhook::MIN_SECRET_BYTES),
    /// which the admin API answers with a code of its own.
    pub weak_secret: bool,
}

fn invalid(field: &'static str, message: impl Into<String>) -> InvalidSubscription {
    InvalidSubscription {
        field,
        message: message.into(),
        weak_secret: false,
    }
}

/// A webhook subscription as stored. The secrets are only for signing and
/// are never shown by listings, nor is a password in the URL.
#[derive(Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Subscription {
    pub id: String,
    #[serde(serialize_with = "url_as_shown")]
    pub url: String,
    #[serde(skip)]
    pub secret: String,
    #[serde(skip)]
    pub previous_secret: Option<String>,
    pub previous_secret_expires_at: Option<DateTime<Utc>>,
    pub types: Vec<String>,
    pub scope_key: Option<String>,
    pub source: String,
    /// When it was paused; its deliveries wait until it resumes.
    pub paused_at: Option<DateTime<Utc>>,
    /// `failing` when it paused itself (its receiver kept failing for
    /// `webhooks.disable_after_secs`); none when an operator paused it.
    pub paused_reason: Option<String>,
    /// At most this many attempts a second, across every relay.
    pub max_per_second: Option<i32>,
    pub ordering: DeliveryOrder,
    /// How long a key's oldest pending delivery may hold the key back.
    pub ordering_max_block_secs: Option<i32>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// How a subscription's deliveries are going, for an operator deciding
/// whether its receiver is down.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SubscriptionHealth {
    /// The last attempt the receiver answered with a 2xx.
    pub last_success_at: Option<DateTime<Utc>>,
    /// Attempts that did not deliver, started in the last hour.
    pub failures_last_hour: i64,
    /// When the oldest pending delivery fell (or falls) due.
    pub oldest_due_at: Option<DateTime<Utc>>,
    /// Deliveries waiting for an attempt.
    pub pending: i64,
}

/// A subscription with its health, as the listing shows it on request.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SubscriptionWithHealth {
    #[serde(flatten)]
    pub subscription: Subscription,
    pub health: SubscriptionHealth,
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

/// Which of a subscription's deliveries go in seq order, one at a time.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    Serialize,
    Deserialize,
    clap::ValueEnum,
    strum::IntoStaticStr,
    strum::EnumString,
)]
#[serde(rename_all = "lowercase")]
#[strum(serialize_all = "lowercase")]
pub enum DeliveryOrder {
    /// Every delivery as soon as a worker takes it.
    #[default]
    None,
    /// Each scope's events in order.
    Scope,
    /// Each event's first resource in order (its scope when it has none).
    Resource,
}

impl DeliveryOrder {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// A subscription to create (from configuration or the admin API).
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NewSubscription {
    pub id: String,
    pub url: String,
    pub secret: Secret,
    #[serde(default = "all_types")]
    pub types: Vec<String>,
    #[serde(default, alias = "scope_key")]
    pub scope_key: Option<String>,
    /// At most this many attempts a second, across every relay.
    #[serde(default, alias = "max_per_second")]
    pub max_per_second: Option<i32>,
    #[serde(default)]
    pub ordering: DeliveryOrder,
    /// How long a key's oldest pending delivery may hold the key back.
    #[serde(default, alias = "ordering_max_block_secs")]
    pub ordering_max_block_secs: Option<i32>,
}

/// A webhook URL as every listing shows it: a password in its userinfo
/// (`https://user:pw@host/`) or its query is printed as `***`.
fn url_as_shown<S: serde::Serializer>(url: &str, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&redact_url(url))
}

impl fmt::Debug for Subscription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subscription")
            .field("id", &self.id)
            .field("url", &redact_url(&self.url))
            .field("types", &self.types)
            .field("scope_key", &self.scope_key)
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for NewSubscription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NewSubscription")
            .field("id", &self.id)
            .field("url", &redact_url(&self.url))
            .field("secret", &self.secret)
            .field("types", &self.types)
            .field("scope_key", &self.scope_key)
            .field("max_per_second", &self.max_per_second)
            .finish()
    }
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
    /// `Some(None)` lifts the rate limit.
    #[serde(default, with = "double_option")]
    pub max_per_second: Option<Option<i32>>,
    pub ordering: Option<DeliveryOrder>,
    /// `Some(None)` lets a key be held back for as long as its head waits.
    #[serde(default, with = "double_option")]
    pub ordering_max_block_secs: Option<Option<i32>>,
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

/// A key may be held back for at least a second, if at all.
pub fn check_ordering_max_block(secs: Option<i32>) -> Result<(), InvalidSubscription> {
    match secs {
        Some(secs) if secs < 1 => Err(invalid(
            "orderingMaxBlockSecs",
            format!(
                "must be at least 1 (leave it out, or null, to hold a key back until its head is delivered or dead); got {secs}"
            ),
        )),
        _ => Ok(()),
    }
}

/// The most a subscription's `maxPerSecond` may say.
pub const MAX_PER_SECOND: i32 = 100_000;

/// A rate limit must let something through, and stay within what the
/// schema's CHECK takes.
pub fn check_max_per_second(max_per_second: Option<i32>) -> Result<(), InvalidSubscription> {
    match max_per_second {
        Some(rate) if !(1..=MAX_PER_SECOND).contains(&rate) => Err(invalid(
            "maxPerSecond",
            format!(
                "must be 1 to {MAX_PER_SECOND} attempts a second (leave it out, or null, for no limit); got {rate}"
            ),
        )),
        _ => Ok(()),
    }
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
/// refused here. A secret must also be one to sign with: valid base64 after
/// a `whsec_` prefix, and at least
/// [`MIN_SECRET_BYTES`](eventrelay_wire::webhook::MIN_SECRET_BYTES) long
/// (decoded for `whsec_`, UTF-8 otherwise). The admin API, the command line
/// and the configuration file all apply it.
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
    if let Some(secret) = secret {
        if secret.chars().any(char::is_control) {
            return Err(invalid("secret", "must not contain control characters"));
        }
        WebhookSecret::parse_for_subscription(secret).map_err(|error| InvalidSubscription {
            weak_secret: matches!(error, SecretError::TooShort { .. } | SecretError::Uniform),
            ..invalid("secret", error.to_string())
        })?;
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
    pub status: DeliveryStatus,
    pub attempts: i32,
    pub next_attempt_at: DateTime<Utc>,
    pub last_status: Option<i32>,
    pub last_error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// Claimed while an older delivery of its key was still pending, the
    /// subscription's `orderingMaxBlockSecs` past.
    pub order_skipped: bool,
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
    pub outcome: AttemptOutcome,
    /// The start of the receiver's answer, when it answered.
    pub response: Option<String>,
}

/// Where a delivery stands: `webhook_deliveries.status`, a delivery's
/// `status` in the admin API and the command line's output, and the status
/// both of them filter the log by.
///
/// The declaration order is the order the documentation and error messages
/// list the statuses in.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    clap::ValueEnum,
    strum::EnumIter,
    strum::IntoStaticStr,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum DeliveryStatus {
    /// Waiting for an attempt; the only status the dispatcher claims.
    Pending,
    /// The receiver answered 2xx.
    Delivered,
    /// The retry schedule ran out.
    Dead,
    /// The receiver answered 410, or the subscription no longer exists.
    Gone,
}

/// What one attempt led to: `webhook_attempts.outcome`, an attempt's
/// `outcome` in the admin API, and the `outcome` label of the attempts
/// counter.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    strum::EnumIter,
    strum::IntoStaticStr,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum AttemptOutcome {
    /// The receiver answered 2xx.
    Delivered,
    /// The attempt failed and the retry schedule has another one.
    Retry,
    /// The attempt failed and the retry schedule ran out.
    Dead,
    /// The receiver answered 410, or the subscription no longer exists.
    Gone,
}

impl AttemptOutcome {
    /// The status the attempt leaves its delivery in. A retry waits as
    /// pending; every other outcome ends the delivery.
    pub fn delivery_status(self) -> DeliveryStatus {
        match self {
            AttemptOutcome::Delivered => DeliveryStatus::Delivered,
            AttemptOutcome::Retry => DeliveryStatus::Pending,
            AttemptOutcome::Dead => DeliveryStatus::Dead,
            AttemptOutcome::Gone => DeliveryStatus::Gone,
        }
    }
}

/// Text that names none of an enum's values. The message lists the values
/// it could have named, so a caller who mistyped one learns the right
/// spelling from the refusal.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{given:?} is not one of {allowed}")]
pub struct UnknownName {
    pub given: String,
    /// The valid names, comma-separated, in declaration order.
    pub allowed: String,
}

/// The text conversions of an enum whose values are stored and sent as
/// their names: `as_str`, `Display`, `FromStr` (exact, case-sensitive), and
/// Postgres `text`/`varchar` in both directions. The names themselves come
/// from the enum's `strum` attributes, so they are written nowhere else.
macro_rules! named_values {
    ($name:ident) => {
        impl $name {
            /// The name as stored in the database and sent on the wire.
            pub fn as_str(self) -> &'static str {
                self.into()
            }

            /// Every name, comma-separated, in declaration order.
            pub fn names() -> String {
                Self::iter()
                    .map(Self::as_str)
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $name {
            type Err = UnknownName;

            fn from_str(text: &str) -> Result<Self, UnknownName> {
                Self::iter()
                    .find(|value| value.as_str() == text)
                    .ok_or_else(|| UnknownName {
                        given: text.to_owned(),
                        allowed: Self::names(),
                    })
            }
        }

        impl ToSql for $name {
            fn to_sql(
                &self,
                ty: &Type,
                out: &mut BytesMut,
            ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
                self.as_str().to_sql(ty, out)
            }

            accepts!(TEXT, VARCHAR);
            to_sql_checked!();
        }

        impl<'a> FromSql<'a> for $name {
            fn from_sql(
                ty: &Type,
                raw: &'a [u8],
            ) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
                Ok(<&str as FromSql>::from_sql(ty, raw)?.parse()?)
            }

            accepts!(TEXT, VARCHAR);
        }
    };
}

named_values!(DeliveryStatus);
named_values!(AttemptOutcome);

/// Which deliveries to list; newest first, `before` is the paging cursor.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeliveryFilter {
    pub scope_key: Option<String>,
    pub status: Option<DeliveryStatus>,
    pub event_id: Option<Uuid>,
    pub subscription_id: Option<String>,
    /// An exact event type.
    pub event_type: Option<String>,
    /// Deliveries created at or after this time.
    pub since: Option<DateTime<Utc>>,
    /// Deliveries created before this time.
    pub until: Option<DateTime<Utc>>,
    pub before: Option<i64>,
    pub limit: Option<i64>,
    /// Only deliveries of subscriptions bound to this scope (`scopeKey` is
    /// the event's scope, which a subscription for every scope shares).
    #[serde(skip)]
    pub subscriptions_of_scope: Option<String>,
}

/// How much of a receiver's answer an attempt keeps: enough to read an
/// error page's message, little enough that a chatty receiver does not fill
/// the log.
pub const MAX_RESPONSE_BYTES: usize = 1024;

/// The type of the test event a portal sends to one endpoint on request.
/// It never passes through the outbox, so no stream sees it.
pub const TEST_EVENT_TYPE: &str = "eventrelay.test";

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
    /// Its first attempt, taken while an older delivery of its key was
    /// still pending, past the subscription's `orderingMaxBlockSecs`.
    pub skipped_ahead: bool,
    /// The event's trace context as stored with it.
    pub traceparent: Option<String>,
}

/// When a subscription whose receiver keeps failing pauses itself, and
/// where the relay tells of it.
#[derive(Debug, Clone)]
pub struct PauseRule {
    /// Every attempt failed for at least this long...
    pub after: std::time::Duration,
    /// ...and at least this many did.
    pub attempts: i32,
    /// The scope of the `eventrelay.subscription.paused` event, if any.
    pub events_scope: Option<String>,
}

/// What recording an attempt did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recorded {
    /// False when the lease ran out first (another worker owns the
    /// delivery now) and nothing was recorded.
    pub settled: bool,
    /// The attempt paused its subscription under the [`PauseRule`].
    pub paused: bool,
}

/// How an attempt ended, and what happens next.
#[derive(Debug, Clone, PartialEq)]
pub struct AttemptRecord {
    pub started_at: DateTime<Utc>,
    pub duration_ms: i32,
    pub status_code: Option<i32>,
    pub error: Option<String>,
    /// The start of the receiver's answer (see [`MAX_RESPONSE_BYTES`]).
    pub response: Option<String>,
    pub outcome: AttemptOutcome,
    /// For [`AttemptOutcome::Retry`]: when to try again.
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
    fn a_secret_shorter_than_24_bytes_is_refused_in_either_form() {
        let check = |secret: &str| validate_subscription_fields(None, None, None, Some(secret));
        let varied = |n: usize| (0..n).map(|i| char::from(b'a' + (i % 26) as u8)).collect();
        let whsec =
            |n: usize| WebhookSecret::from_bytes((0..n as u8).collect::<Vec<_>>()).to_whsec();
        for short in [varied(23), whsec(23)] {
            let error = check(&short).unwrap_err();
            assert_eq!(
                (error.field, error.weak_secret),
                ("secret", true),
                "{short}"
            );
            assert!(error.message.contains("at least 24"), "{}", error.message);
        }
        for enough in [varied(24), whsec(24)] {
            check(&enough).unwrap();
        }
        let error = check(&"s".repeat(40)).unwrap_err();
        assert_eq!((error.field, error.weak_secret), ("secret", true));
        let error = check("whsec_not base64!").unwrap_err();
        assert_eq!((error.field, error.weak_secret), ("secret", false));
        let error = check("a-secret-long-enough-but-\u{0}").unwrap_err();
        assert_eq!((error.field, error.weak_secret), ("secret", false));
    }

    /// Every representation of a status or outcome (serde, `as_str`,
    /// `FromStr`, and the command line's for statuses) spells it the same.
    #[test]
    fn every_representation_of_a_name_agrees() {
        use clap::ValueEnum;

        for status in DeliveryStatus::iter() {
            let name = status.as_str();
            assert_eq!(serde_json::to_value(status).unwrap(), name);
            assert_eq!(
                serde_json::from_value::<DeliveryStatus>(name.into()).unwrap(),
                status
            );
            assert_eq!(name.parse::<DeliveryStatus>(), Ok(status));
            assert_eq!(status.to_string(), name);
            let cli = status.to_possible_value().unwrap();
            assert_eq!(cli.get_name(), name);
        }
        for outcome in AttemptOutcome::iter() {
            let name = outcome.as_str();
            assert_eq!(serde_json::to_value(outcome).unwrap(), name);
            assert_eq!(name.parse::<AttemptOutcome>(), Ok(outcome));
            assert_eq!(outcome.to_string(), name);
        }
    }

    #[test]
    fn the_names_are_those_on_the_wire() {
        assert_eq!(DeliveryStatus::names(), "pending, delivered, dead, gone");
        assert_eq!(AttemptOutcome::names(), "delivered, retry, dead, gone");
    }

    #[test]
    fn an_unknown_name_is_refused_with_the_valid_ones() {
        let error = "DEAD".parse::<DeliveryStatus>().unwrap_err();
        assert_eq!(
            error.to_string(),
            r#""DEAD" is not one of pending, delivered, dead, gone"#
        );
        assert!("".parse::<AttemptOutcome>().is_err());
    }

    #[test]
    fn a_retry_leaves_the_delivery_pending_and_every_other_outcome_ends_it() {
        for outcome in AttemptOutcome::iter() {
            let status = outcome.delivery_status();
            match outcome {
                AttemptOutcome::Retry => assert_eq!(status, DeliveryStatus::Pending),
                _ => assert_eq!(status.as_str(), outcome.as_str()),
            }
        }
    }

    /// The database refuses any status the schema's CHECK constraint does
    /// not list; the enum must list the same ones, or a status would be
    /// written that the table refuses (or read that no variant names).
    #[test]
    fn the_schema_allows_exactly_the_delivery_statuses() {
        let schema = include_str!("../../migrations/0001_schema.sql");
        let check = schema
            .split("webhook_deliveries_status_valid CHECK (status IN (")
            .nth(1)
            .and_then(|rest| rest.split("))").next())
            .unwrap();
        let allowed: Vec<&str> = check
            .split(',')
            .map(|name| name.trim().trim_matches('\''))
            .collect();
        let statuses: Vec<&str> = DeliveryStatus::iter().map(DeliveryStatus::as_str).collect();
        assert_eq!(allowed, statuses);
    }

    #[test]
    fn statuses_and_outcomes_travel_to_and_from_postgres_as_text() {
        let mut out = BytesMut::new();
        DeliveryStatus::Gone.to_sql(&Type::TEXT, &mut out).unwrap();
        assert_eq!(&out[..], b"gone");
        assert_eq!(
            AttemptOutcome::from_sql(&Type::TEXT, b"retry").unwrap(),
            AttemptOutcome::Retry
        );
        assert!(DeliveryStatus::from_sql(&Type::VARCHAR, b"lost").is_err());
        assert!(<DeliveryStatus as ToSql>::accepts(&Type::TEXT));
        assert!(!<DeliveryStatus as ToSql>::accepts(&Type::INT4));
    }

    #[test]
    fn the_previous_secret_signs_only_during_its_grace_window() {
        let now = Utc::now();
        let mut subscription = Subscription {
            id: "s".into(),
            url: "https://x".into(),
            secret: "the-new-signing-secret-of-the-hook".into(),
            previous_secret: Some("the-old-signing-secret-of-the-hook".into()),
            previous_secret_expires_at: Some(now + chrono::Duration::minutes(1)),
            types: vec!["*".into()],
            scope_key: None,
            source: "api".into(),
            paused_at: None,
            paused_reason: None,
            max_per_second: None,
            ordering: DeliveryOrder::None,
            ordering_max_block_secs: None,
            created_at: now,
            updated_at: now,
        };
        let (new, old) = (
            "the-new-signing-secret-of-the-hook",
            "the-old-signing-secret-of-the-hook",
        );
        assert_eq!(subscription.signing_secrets(now), [new, old]);
        subscription.previous_secret_expires_at = Some(now - chrono::Duration::minutes(1));
        assert_eq!(subscription.signing_secrets(now), [new]);
    }

    #[test]
    fn a_password_in_a_webhook_url_is_never_shown() {
        let new = NewSubscription {
            id: "hook".into(),
            url: "https://user:hunter2@hooks.example.com/in?password=also".into(),
            secret: Secret::from("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
            types: vec!["*".into()],
            scope_key: None,
            max_per_second: None,
            ordering: Default::default(),
            ordering_max_block_secs: None,
        };
        let shown = format!("{new:?}");
        assert!(
            !shown.contains("hunter2") && !shown.contains("also"),
            "{shown}"
        );
        assert!(shown.contains("https://user:***@hooks.example.com/in?password=***"));
        let stored = Subscription {
            id: new.id.clone(),
            url: new.url.clone(),
            secret: "the-signing-secret".into(),
            previous_secret: None,
            previous_secret_expires_at: None,
            types: new.types.clone(),
            scope_key: None,
            source: "api".into(),
            paused_at: None,
            paused_reason: None,
            max_per_second: None,
            ordering: DeliveryOrder::None,
            ordering_max_block_secs: None,
            created_at: Utc::now(),
            updated_at: Utc::now(),
        };
        for shown in [
            format!("{stored:?}"),
            serde_json::to_string(&stored).unwrap(),
        ] {
            assert!(
                !shown.contains("hunter2") && !shown.contains("the-signing-secret"),
                "{shown}"
            );
        }
    }
}
