//! Broadcast channels: typed, at-most-once hints on a Postgres `NOTIFY`
//! channel of their own.
//!
//! This module owns the channel (its name, optional JSON Schema and payload
//! cap), the two publish paths, and subscriptions with their reconnect loop.
//! It shares nothing with events: no envelope, no outbox, no replay, no
//! audience filtering. A message sent while a subscriber is disconnected is
//! gone, so whatever a hint invalidates needs its own backstop, such as a TTL.
//!
//! ```no_run
//! # async fn demo(client: &tokio_postgres::Client) -> Result<(), Box<dyn std::error::Error>> {
//! use eventrelay_publisher::broadcast::BroadcastChannel;
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize)]
//! struct Invalidate {
//!     key: String,
//! }
//!
//! let channel = BroadcastChannel::<Invalidate>::new("cache_invalidation")?;
//! let subscription = channel
//!     .subscribe(
//!         "postgres://app@db.internal/app",
//!         |hint: Invalidate| println!("drop {}", hint.key),
//!         || println!("messages may have been lost: drop everything"),
//!     )
//!     .await?;
//! channel.publish(client, &Invalidate { key: "config".into() }).await?;
//! # drop(subscription);
//! # Ok(()) }
//! ```

mod client;
mod listener;
mod source;
mod subscription;

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;

use eventrelay_wire::POSTGRES_NOTIFY_LIMIT_BYTES;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio_postgres::types::Type;

use crate::identifier::{Identifier, IdentifierError};

pub use client::{InTransaction, PlainClient};
pub use listener::ListenTls;
pub use source::{DEFAULT_CONNECT_TIMEOUT, SubscribeError};
pub use subscription::{
    DEFAULT_HEALTH_CHECK, HandlerOutcome, Subscription, SubscriptionBuilder, SubscriptionStats,
};

/// One statement, one round trip; `pg_notify` takes the channel as a value,
/// so nothing is spliced into the SQL.
const NOTIFY_SQL: &str = "SELECT pg_notify($1, $2)";

/// Most schema violations reported for one message.
const MAX_REPORTED_ERRORS: usize = 5;

/// Why a channel could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ChannelError {
    #[error("invalid broadcast channel name: {0}")]
    Name(#[from] IdentifierError),
    #[error("the broadcast channel's schema is not a valid JSON Schema: {0}")]
    Schema(String),
    #[error("a payload cap of {requested} bytes is out of range: use 1 to {max}")]
    PayloadCap { requested: usize, max: usize },
}

/// Why a message was refused. Nothing reached the database.
///
/// On the publish side these are programming errors at the call site; on the
/// subscribe side they are why a payload was dropped.
#[derive(Debug, thiserror::Error)]
pub enum MessageError {
    #[error("the message is not valid JSON for this channel's message type: {0}")]
    Json(#[from] serde_json::Error),
    #[error("the message does not match the channel's schema: {}", .0.join("; "))]
    Schema(Vec<String>),
    #[error(
        "the encoded message is {size} bytes, over this channel's cap of {max} (Postgres refuses NOTIFY payloads of 8000 bytes or more)"
    )]
    TooLarge { size: usize, max: usize },
}

/// Why [`BroadcastChannel::publish_in_tx`] failed.
#[derive(Debug, thiserror::Error)]
pub enum BroadcastError {
    #[error(transparent)]
    Message(#[from] MessageError),
    /// The statement failed, which has aborted the transaction: roll it back.
    #[error("database error while broadcasting: {0}")]
    Database(#[from] tokio_postgres::Error),
}

/// A typed broadcast channel: messages of type `M`, sent as JSON on one
/// Postgres notification channel.
///
/// Cheap to clone; build one per channel at start and share it between the
/// publishing code and the subscription.
pub struct BroadcastChannel<M> {
    inner: Arc<Inner>,
    // `fn() -> M` keeps the channel Send and Sync whatever `M` is: it never
    // holds an `M`.
    _message: PhantomData<fn() -> M>,
}

struct Inner {
    name: Identifier,
    schema: Option<jsonschema::Validator>,
    max_payload_bytes: usize,
}

impl<M> Clone for BroadcastChannel<M> {
    fn clone(&self) -> Self {
        BroadcastChannel {
            inner: Arc::clone(&self.inner),
            _message: PhantomData,
        }
    }
}

impl<M> fmt::Debug for BroadcastChannel<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BroadcastChannel")
            .field("name", &self.inner.name)
            .field("schema", &self.inner.schema.is_some())
            .field("max_payload_bytes", &self.inner.max_payload_bytes)
            .finish()
    }
}

impl<M> BroadcastChannel<M>
where
    M: Serialize + DeserializeOwned + Send + 'static,
{
    /// A channel named `name`, without a schema, capped at
    /// [`POSTGRES_NOTIFY_LIMIT_BYTES`].
    ///
    /// The name must be an [`Identifier`] so that `LISTEN` needs no quoting
    /// and reads the same as the `pg_notify` argument.
    pub fn new(name: &str) -> Result<Self, ChannelError> {
        Ok(BroadcastChannel {
            inner: Arc::new(Inner {
                name: Identifier::new(name)?,
                schema: None,
                max_payload_bytes: POSTGRES_NOTIFY_LIMIT_BYTES,
            }),
            _message: PhantomData,
        })
    }

    /// Checks every message against `schema` on both sides: publish refuses
    /// a message that fails it, and a subscription drops a payload that fails
    /// it, so a process on an older or newer message shape cannot feed bad
    /// hints to the others. The schema's `$schema` picks the draft; draft
    /// 2020-12 when absent.
    pub fn with_schema(self, schema: &Value) -> Result<Self, ChannelError> {
        let validator =
            jsonschema::validator_for(schema).map_err(|e| ChannelError::Schema(e.to_string()))?;
        Ok(self.map_inner(|inner| inner.schema = Some(validator)))
    }

    /// Lowers the cap on an encoded message, in bytes. It cannot be raised:
    /// Postgres refuses larger payloads.
    pub fn with_max_payload_bytes(self, max: usize) -> Result<Self, ChannelError> {
        if max == 0 || max > POSTGRES_NOTIFY_LIMIT_BYTES {
            return Err(ChannelError::PayloadCap {
                requested: max,
                max: POSTGRES_NOTIFY_LIMIT_BYTES,
            });
        }
        Ok(self.map_inner(|inner| inner.max_payload_bytes = max))
    }

    fn map_inner(self, change: impl FnOnce(&mut Inner)) -> Self {
        let mut inner = Arc::try_unwrap(self.inner).unwrap_or_else(|shared| Inner {
            name: shared.name.clone(),
            schema: shared.schema.clone(),
            max_payload_bytes: shared.max_payload_bytes,
        });
        change(&mut inner);
        BroadcastChannel {
            inner: Arc::new(inner),
            _message: PhantomData,
        }
    }

    pub fn name(&self) -> &Identifier {
        &self.inner.name
    }

    pub fn max_payload_bytes(&self) -> usize {
        self.inner.max_payload_bytes
    }

    /// Sends a best-effort hint on a plain (pooled) connection; it is
    /// delivered at once.
    ///
    /// A database failure is logged with `tracing::warn!` and swallowed: the
    /// hint is lost and the subscribers' backstop covers it, so a cache
    /// invalidation can never fail the request that made it. A message that
    /// fails the schema or the size cap is still an error, because that is
    /// a bug at the call site. The message is checked and encoded when this
    /// is called, before the returned future is first polled.
    ///
    /// Only connections are accepted. A transaction is refused at compile
    /// time, because an error inside a transaction has aborted it and must
    /// reach the caller; use [`publish_in_tx`](Self::publish_in_tx) there:
    ///
    /// ```compile_fail,E0277
    /// # async fn demo(client: &mut tokio_postgres::Client) {
    /// # let channel = eventrelay_publisher::broadcast::BroadcastChannel::<String>::new("hints").unwrap();
    /// let tx = client.transaction().await.unwrap();
    /// let _ = channel.publish(&tx, &"hint".to_owned()).await; // not a PlainClient
    /// # }
    /// ```
    pub fn publish<'a, C: PlainClient>(
        &'a self,
        client: &'a C,
        message: &M,
    ) -> impl Future<Output = Result<(), MessageError>> + Send + 'a {
        let encoded = self.encode(message);
        async move {
            let payload = encoded?;
            if let Err(error) = self.notify(client, &payload).await {
                tracing::warn!(
                    channel = %self.inner.name,
                    %error,
                    "broadcast message lost: NOTIFY failed"
                );
            }
            Ok(())
        }
    }

    /// Sends a hint inside the caller's transaction: Postgres delivers it at
    /// COMMIT and drops it on ROLLBACK, so it can never announce a write that
    /// did not happen.
    ///
    /// Every failure is returned. A failed statement has aborted the
    /// transaction, and the caller's rollback handling must see it. Like
    /// [`publish`](Self::publish), the message is checked when this is called.
    ///
    /// ```no_run
    /// # async fn demo(client: &mut tokio_postgres::Client) -> Result<(), Box<dyn std::error::Error>> {
    /// # let channel = eventrelay_publisher::broadcast::BroadcastChannel::<String>::new("hints")?;
    /// let tx = client.transaction().await?;
    /// tx.execute("UPDATE settings SET value = 'dark' WHERE key = 'theme'", &[]).await?;
    /// channel.publish_in_tx(&tx, &"settings".to_owned()).await?;
    /// tx.commit().await?; // the hint goes out now, or never
    /// # Ok(()) }
    /// ```
    pub fn publish_in_tx<'a, T: InTransaction>(
        &'a self,
        tx: &'a T,
        message: &M,
    ) -> impl Future<Output = Result<(), BroadcastError>> + Send + 'a {
        let encoded = self.encode(message);
        async move {
            let payload = encoded?;
            self.notify(tx, &payload).await?;
            Ok(())
        }
    }

    async fn notify<C: crate::PgExecutor>(
        &self,
        client: &C,
        payload: &str,
    ) -> Result<(), tokio_postgres::Error> {
        let name = self.inner.name.as_str();
        client
            .query_typed(NOTIFY_SQL, &[(&name, Type::TEXT), (&payload, Type::TEXT)])
            .await?;
        Ok(())
    }

    /// The payload [`publish`](Self::publish) would send for `message`.
    ///
    /// For sending through something this crate does not drive, such as an
    /// embedded database: call `pg_notify(channel, payload)` with it there.
    pub fn encode(&self, message: &M) -> Result<String, MessageError> {
        let value = serde_json::to_value(message)?;
        self.check_schema(&value)?;
        let payload = serde_json::to_string(&value)?;
        if payload.len() > self.inner.max_payload_bytes {
            return Err(MessageError::TooLarge {
                size: payload.len(),
                max: self.inner.max_payload_bytes,
            });
        }
        Ok(payload)
    }

    /// Reads a payload the way a subscription does: JSON, then the schema,
    /// then the message type.
    pub fn decode(&self, payload: &str) -> Result<M, MessageError> {
        let value: Value = serde_json::from_str(payload)?;
        self.check_schema(&value)?;
        Ok(serde_json::from_value(value)?)
    }

    fn check_schema(&self, value: &Value) -> Result<(), MessageError> {
        let Some(schema) = &self.inner.schema else {
            return Ok(());
        };
        let errors: Vec<String> = schema
            .iter_errors(value)
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
            Err(MessageError::Schema(errors))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use serde_json::json;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Hint {
        key: String,
    }

    fn channel() -> BroadcastChannel<Hint> {
        BroadcastChannel::new("hints")
            .unwrap()
            .with_schema(&json!({
                "type": "object",
                "properties": {"key": {"type": "string", "minLength": 1}},
                "required": ["key"]
            }))
            .unwrap()
    }

    #[test]
    fn encodes_and_decodes_through_the_schema() {
        let channel = channel();
        let payload = channel.encode(&Hint { key: "a".into() }).unwrap();
        assert_eq!(payload, r#"{"key":"a"}"#);
        assert_eq!(channel.decode(&payload).unwrap(), Hint { key: "a".into() });
        assert!(matches!(
            channel.encode(&Hint { key: String::new() }),
            Err(MessageError::Schema(errors)) if errors[0].contains("/key")
        ));
        assert!(matches!(
            channel.decode(r#"{"key":""}"#),
            Err(MessageError::Schema(_))
        ));
        assert!(matches!(channel.decode("nope"), Err(MessageError::Json(_))));
    }

    #[test]
    fn without_a_schema_the_type_still_decides() {
        let channel = BroadcastChannel::<Hint>::new("hints").unwrap();
        assert!(matches!(
            channel.decode(r#"{"key":5}"#),
            Err(MessageError::Json(_))
        ));
    }

    #[test]
    fn the_cap_defaults_to_the_notify_limit_and_cannot_exceed_it() {
        let channel = channel();
        assert_eq!(channel.max_payload_bytes(), POSTGRES_NOTIFY_LIMIT_BYTES);
        let at_limit = Hint {
            key: "x".repeat(POSTGRES_NOTIFY_LIMIT_BYTES - r#"{"key":""}"#.len()),
        };
        assert_eq!(
            channel.encode(&at_limit).unwrap().len(),
            POSTGRES_NOTIFY_LIMIT_BYTES
        );
        let over = Hint {
            key: format!("{}y", at_limit.key),
        };
        assert!(matches!(
            channel.encode(&over),
            Err(MessageError::TooLarge {
                size: 8000,
                max: 7999
            })
        ));
        for bad in [0, POSTGRES_NOTIFY_LIMIT_BYTES + 1] {
            assert!(matches!(
                channel.clone().with_max_payload_bytes(bad),
                Err(ChannelError::PayloadCap { .. })
            ));
        }
        let small = channel.with_max_payload_bytes(12).unwrap();
        assert!(small.encode(&Hint { key: "ab".into() }).is_ok());
        assert!(matches!(
            small.encode(&Hint { key: "abc".into() }),
            Err(MessageError::TooLarge { size: 13, max: 12 })
        ));
    }

    #[test]
    fn refuses_bad_names_and_bad_schemas() {
        for bad in ["", "Hints", "cache-invalidation", "a b", "x;drop"] {
            assert!(matches!(
                BroadcastChannel::<Hint>::new(bad),
                Err(ChannelError::Name(_))
            ));
        }
        assert!(matches!(
            BroadcastChannel::<Hint>::new("ok")
                .unwrap()
                .with_schema(&json!({"type": "no-such-type"})),
            Err(ChannelError::Schema(_))
        ));
    }

    #[test]
    fn clones_share_the_configuration() {
        let channel = channel().with_max_payload_bytes(100).unwrap();
        let clone = channel.clone();
        assert_eq!(clone.name().as_str(), "hints");
        assert_eq!(clone.max_payload_bytes(), 100);
        // Changing a clone leaves the original alone.
        let smaller = clone.with_max_payload_bytes(50).unwrap();
        assert_eq!(smaller.max_payload_bytes(), 50);
        assert_eq!(channel.max_payload_bytes(), 100);
    }
}
