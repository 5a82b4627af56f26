//! Live reload: reading the configuration again while the relay runs,
//! applying at once every setting that can change without dropping a
//! connection, and naming the ones that wait for a restart.
//!
//! A reload is asked for on SIGHUP or through `POST /v1/admin/reload`
//! (`eventrelay reload`). A configuration that fails validation is refused
//! whole: the one in force stays, the error is logged and returned, and
//! `eventrelay_config_reloads_total{result="failed"}` counts it. The
//! relay's live configuration is the one it started with, with the live
//! settings of the last applied reload: a changed restart-only setting is
//! reported, never half applied.

use std::sync::Arc;

use serde::Serialize;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot, watch};

use crate::config::{Config, ConfigError};

/// The settings a reload applies at once. The tail bounds are read on
/// every publish; the connection cap, heartbeat, age cap and queue
/// capacity by every new connection (open ones keep theirs); the log
/// filter, the webhook workers and the configured subscriptions are
/// changed in place.
pub const LIVE_SETTINGS: [&str; 9] = [
    "hub.tail_events",
    "hub.tail_bytes",
    "sse.max_connections_per_subscriber",
    "sse.heartbeat_secs",
    "sse.max_age_secs",
    "sse.queue_capacity",
    "log.level",
    "webhooks.workers",
    "webhooks.subscriptions",
];

/// What a reload changed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReloadReport {
    /// Live settings whose new values are in force.
    pub applied: Vec<String>,
    /// Changed settings that take effect at the next start.
    pub needs_restart: Vec<String>,
}

/// An error from applying a new log filter.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why a reload was refused; the configuration in force stays.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("log.level: {0}")]
    LogLevel(#[source] BoxError),
    #[error("webhooks.subscriptions: {0}")]
    Subscriptions(#[source] crate::store::StoreError),
    #[error("the relay cannot reload: it was started without a configuration source")]
    NotSetUp,
    #[error("the relay is stopping")]
    Stopping,
}

type Reply = oneshot::Sender<Result<ReloadReport, Arc<ReloadError>>>;

/// Asks a running relay to reload. Cheap to clone.
#[derive(Clone)]
pub struct ReloadHandle(mpsc::Sender<Reply>);

impl ReloadHandle {
    /// Reloads and waits for the outcome.
    pub async fn reload(&self) -> Result<ReloadReport, Arc<ReloadError>> {
        let (reply, answer) = oneshot::channel();
        self.0
            .send(reply)
            .await
            .map_err(|_| Arc::new(ReloadError::Stopping))?;
        answer.await.map_err(|_| Arc::new(ReloadError::Stopping))?
    }
}

/// Where reload requests arrive; the relay takes it at start.
pub struct ReloadRequests {
    handle: ReloadHandle,
    requests: mpsc::Receiver<Reply>,
}

/// A handle for asking and the requests it sends, as a pair.
pub fn channel() -> (ReloadHandle, ReloadRequests) {
    let (sender, requests) = mpsc::channel(8);
    let handle = ReloadHandle(sender);
    (handle.clone(), ReloadRequests { handle, requests })
}

impl ReloadRequests {
    /// A handle that sends to these requests (the admin API's).
    pub fn handle(&self) -> ReloadHandle {
        self.handle.clone()
    }

    pub(crate) async fn next(&mut self) -> Option<Reply> {
        self.requests.recv().await
    }
}

/// Reads and validates the configuration.
pub type LoadConfig = Box<dyn Fn() -> Result<Config, ConfigError> + Send>;
/// Swaps the log filter.
pub type SetLogLevel = Box<dyn Fn(&str) -> Result<(), BoxError> + Send>;

/// How a relay re-reads its configuration, given to
/// [`crate::server::run_with`].
pub struct Reloading {
    /// Reads the configuration again (the same file and environment as at
    /// start) and validates it.
    pub load: LoadConfig,
    /// Puts a new `log.level` filter in force.
    pub set_log_level: SetLogLevel,
    pub requests: ReloadRequests,
}

/// The live configuration, as every part that reads settings per request
/// or per connection sees it.
pub type LiveConfig = watch::Receiver<Arc<Config>>;

/// Splits `new` into the configuration to put in force (`current` with
/// `new`'s live settings) and a report of what changed.
pub fn merge(current: &Config, new: &Config) -> (Config, ReloadReport) {
    let mut merged = current.clone();
    merged.hub.tail_events = new.hub.tail_events;
    merged.hub.tail_bytes = new.hub.tail_bytes;
    merged.sse.max_connections_per_subscriber = new.sse.max_connections_per_subscriber;
    merged.sse.heartbeat_secs = new.sse.heartbeat_secs;
    merged.sse.max_age_secs = new.sse.max_age_secs;
    merged.sse.queue_capacity = new.sse.queue_capacity;
    merged.log.level = new.log.level.clone();
    merged.webhooks.workers = new.webhooks.workers;
    merged.webhooks.subscriptions = new.webhooks.subscriptions.clone();
    let report = ReloadReport {
        applied: differences(current, &merged),
        needs_restart: differences(&merged, new),
    };
    (merged, report)
}

/// The dotted names of the settings that differ, such as `sse.heartbeat_secs`.
fn differences(a: &Config, b: &Config) -> Vec<String> {
    let (Ok(a), Ok(b)) = (serde_json::to_value(a), serde_json::to_value(b)) else {
        return Vec::new();
    };
    let mut changed = Vec::new();
    collect_differences("", &a, &b, &mut changed);
    changed
}

fn collect_differences(prefix: &str, a: &Value, b: &Value, changed: &mut Vec<String>) {
    match (a, b) {
        (Value::Object(a), Value::Object(b))
            if prefix.split('.').count() < 2 || prefix.is_empty() =>
        {
            let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
            keys.sort();
            keys.dedup();
            for key in keys {
                let name = if prefix.is_empty() {
                    key.clone()
                } else {
                    format!("{prefix}.{key}")
                };
                collect_differences(
                    &name,
                    a.get(key).unwrap_or(&Value::Null),
                    b.get(key).unwrap_or(&Value::Null),
                    changed,
                );
            }
        }
        _ if a != b => changed.push(prefix.to_owned()),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_settings_apply_and_the_rest_waits_for_a_restart() {
        let current = Config::default();
        let mut new = Config::default();
        new.sse.heartbeat_secs = 5;
        new.hub.tail_events = 16;
        new.http.workers = 3;
        new.database.pool_size = 32;
        let (merged, report) = merge(&current, &new);
        assert_eq!(merged.sse.heartbeat_secs, 5);
        assert_eq!(merged.hub.tail_events, 16);
        assert_eq!(merged.http.workers, current.http.workers);
        assert_eq!(merged.database.pool_size, current.database.pool_size);
        assert_eq!(report.applied, ["hub.tail_events", "sse.heartbeat_secs"]);
        assert_eq!(report.needs_restart, ["database.pool_size", "http.workers"]);
    }

    #[test]
    fn every_live_setting_is_merged() {
        let current = Config::default();
        let mut new = Config::default();
        new.hub.tail_events += 1;
        new.hub.tail_bytes += 1;
        new.sse.max_connections_per_subscriber += 1;
        new.sse.heartbeat_secs += 1;
        new.sse.max_age_secs += 1;
        new.sse.queue_capacity += 1;
        new.log.level = "debug".into();
        new.webhooks.workers += 1;
        new.webhooks.subscriptions = vec![crate::webhooks::NewSubscription {
            id: "s".into(),
            url: "https://example.com/hook".into(),
            secret: crate::webhooks::generate_secret().into(),
            types: vec!["*".into()],
            scope_key: None,
            max_per_second: None,
            ordering: Default::default(),
            ordering_max_block_secs: None,
        }];
        let (_, report) = merge(&current, &new);
        let mut live = LIVE_SETTINGS.to_vec();
        live.sort_unstable();
        assert_eq!(report.applied, live);
        assert!(report.needs_restart.is_empty(), "{report:?}");
    }
}
