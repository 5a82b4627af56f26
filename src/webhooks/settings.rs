//! The `[webhooks]` settings: how many deliveries run at once, how long
//! they may take, when they are retried, and the subscriptions kept in step
//! with the configuration file.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::model::NewSubscription;

/// The shortest `Retry-After` wait honoured, whatever the receiver asks.
pub const MIN_RETRY_AFTER: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WebhooksConfig {
    /// Run the dispatcher on this replica.
    pub enabled: bool,
    /// Concurrent deliveries per replica.
    pub workers: usize,
    /// How long a claimed delivery stays leased to its worker; must be longer
    /// than the request timeout so two workers never send one attempt.
    pub lease_ms: u64,
    pub request_timeout_ms: u64,
    /// Waits before each retry; after the last, the delivery is dead.
    pub retry_schedule_ms: Vec<u64>,
    /// Longest `Retry-After` honoured on a 429 or 503.
    pub max_retry_after_ms: u64,
    /// Send to loopback, private, link-local and other internal addresses.
    pub allow_private_networks: bool,
    /// How long a rotated-out secret keeps signing alongside the new one.
    pub rotation_grace_secs: u64,
    /// How long delivered and gone deliveries (and their attempts) are
    /// kept after they finished; the janitor prunes them then.
    pub retention_secs: u64,
    /// How long dead deliveries are kept: longer, since an operator may
    /// still redeliver them once the receiver is fixed.
    pub dead_retention_secs: u64,
    /// A subscription whose attempts have all failed for this long (and
    /// at least `disable_after_attempts` of them) pauses itself, with the
    /// reason `failing`, instead of retrying a dead receiver for ever.
    pub disable_after_secs: u64,
    pub disable_after_attempts: u32,
    /// The scope the relay's own events go to (`eventrelay.subscription.
    /// paused`), so the app hears of them on a stream or a webhook like any
    /// event; none are written without one.
    pub events_scope: Option<String>,
    /// Subscriptions kept in step with this file at every start.
    pub subscriptions: Vec<NewSubscription>,
}

impl Default for WebhooksConfig {
    fn default() -> Self {
        WebhooksConfig {
            enabled: true,
            workers: 4,
            lease_ms: 60_000,
            request_timeout_ms: 15_000,
            retry_schedule_ms: [5, 300, 1_800, 7_200, 18_000, 36_000, 36_000]
                .iter()
                .map(|secs| secs * 1000)
                .collect(),
            max_retry_after_ms: 3_600_000,
            allow_private_networks: false,
            rotation_grace_secs: 24 * 60 * 60,
            retention_secs: 7 * 24 * 60 * 60,
            dead_retention_secs: 30 * 24 * 60 * 60,
            disable_after_secs: 5 * 24 * 60 * 60,
            disable_after_attempts: 20,
            events_scope: None,
            subscriptions: Vec::new(),
        }
    }
}
