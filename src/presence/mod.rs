//! Presence: who is connected to a scope, across every relay, for the
//! scopes `presence.scopes` names.
//!
//! A stream that opens in such a scope joins its subscriber here (unless
//! its token says `presence: false`), and leaves when it ends. A task per
//! relay ([`run`]) writes this relay's members to Postgres every
//! `presence.batch_ms`, reads every relay's changes since the last version
//! it saw, merges them ([`PresenceView`]), and hands each scope's change
//! to its hub, which sends it to the scope's streams as an
//! `event: presence` frame. A stream's first such frame, right after
//! `ready`, is the scope's snapshot, taken by its hub when it attaches.
//!
//! The state lives in a table that every relay reads by version, rather
//! than in notifications: a relay that starts (or whose listener
//! reconnects) reads it whole and misses nothing, and the table works the
//! same in both wake-up modes and for relays decoding on standbys (the
//! reads go through the pool, to the primary).

mod store;
mod view;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

pub use store::{PresenceStore, ReadPoint};
pub use view::{Member, PresenceView, ScopeChange};

use crate::actors::HubDirectory;
use crate::actors::hub::PublishEphemeral;
use crate::store::Database;

/// Largest `presence_info` a token may carry, as JSON.
pub const MAX_INFO_BYTES: usize = 1024;

/// The `[presence]` settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PresenceConfig {
    /// Scope patterns with presence: an exact key, `prefix*`, or `*`.
    pub scopes: Vec<String>,
    /// How long after a relay's last heartbeat its members leave.
    pub expire_secs: u64,
    /// How often each relay writes its joins and leaves and reads the
    /// others'; a scope's changes within one round go out as one frame.
    pub batch_ms: u64,
    /// Past this many members, a scope's streams get counts only.
    pub max_members: usize,
}

impl Default for PresenceConfig {
    fn default() -> Self {
        PresenceConfig {
            scopes: Vec::new(),
            expire_secs: 30,
            batch_ms: 100,
            max_members: 1000,
        }
    }
}

impl PresenceConfig {
    /// Whether `scope_key` has presence.
    pub fn covers(&self, scope_key: &str) -> bool {
        self.scopes
            .iter()
            .any(|pattern| match pattern.strip_suffix('*') {
                Some(prefix) => scope_key.starts_with(prefix),
                None => pattern == scope_key,
            })
    }

    /// Checks the settings; the error names the one at fault.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        for pattern in &self.scopes {
            let bare = pattern.strip_suffix('*').unwrap_or(pattern);
            if bare.contains('*') || (pattern.is_empty()) || pattern.chars().any(char::is_control) {
                return Err((
                    "presence.scopes",
                    format!("{pattern:?} is not an exact scope key, `prefix*` or `*`"),
                ));
            }
        }
        if self.expire_secs < 3 {
            return Err(("presence.expire_secs", "must be at least 3".to_owned()));
        }
        if self.batch_ms == 0 || self.batch_ms > 10_000 {
            return Err(("presence.batch_ms", "must be from 1 to 10000".to_owned()));
        }
        if self.max_members == 0 {
            return Err(("presence.max_members", "must be at least 1".to_owned()));
        }
        Ok(())
    }
}

/// What a subscriber's credentials say about its presence.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PresenceClaims {
    /// `presence: false`: sees the others, is not listed itself.
    pub hidden: bool,
    /// `presence_info`: shown to the scope's streams with the member.
    pub info: Option<Value>,
}

impl PresenceClaims {
    /// Reads the two claims; an info object over [`MAX_INFO_BYTES`], or
    /// one that is not an object, is refused with a message naming it.
    pub fn from_claims(presence: Option<&Value>, info: Option<&Value>) -> Result<Self, String> {
        let hidden = matches!(presence, Some(Value::Bool(false)));
        let info = match info {
            None | Some(Value::Null) => None,
            Some(object @ Value::Object(_)) => {
                let size = object.to_string().len();
                if size > MAX_INFO_BYTES {
                    return Err(format!(
                        "presence_info is {size} bytes of JSON; the limit is {MAX_INFO_BYTES}"
                    ));
                }
                Some(object.clone())
            }
            Some(_) => return Err("presence_info must be a JSON object".to_owned()),
        };
        Ok(PresenceClaims { hidden, info })
    }
}

/// One change of this relay's own members.
enum Local {
    Join {
        scope_key: String,
        subscriber_id: String,
        info: Option<Value>,
    },
    Leave {
        scope_key: String,
        subscriber_id: String,
    },
    /// Leave everything now (the relay is stopping), then answer.
    Stop(oneshot::Sender<()>),
}

/// This relay's presence: cheap to clone; off when no scope has presence.
#[derive(Clone)]
pub struct Presence {
    config: Arc<PresenceConfig>,
    local: Option<mpsc::UnboundedSender<Local>>,
    view: Arc<PresenceView>,
}

impl Presence {
    /// Presence for no scope.
    pub fn off() -> Presence {
        Presence {
            config: Arc::new(PresenceConfig::default()),
            local: None,
            view: Arc::new(PresenceView::new(usize::MAX)),
        }
    }

    /// Whether streams of `scope_key` take part.
    pub fn covers(&self, scope_key: &str) -> bool {
        self.local.is_some() && self.config.covers(scope_key)
    }

    /// The merged state of every relay, as this relay last read it.
    pub fn view(&self) -> &Arc<PresenceView> {
        &self.view
    }

    /// Joins a stream's subscriber; it leaves when the guard drops.
    pub fn join(&self, scope_key: &str, subscriber_id: &str, info: Option<Value>) -> PresenceGuard {
        let local = self.local.clone();
        if let Some(local) = &local {
            let _ = local.send(Local::Join {
                scope_key: scope_key.to_owned(),
                subscriber_id: subscriber_id.to_owned(),
                info,
            });
        }
        PresenceGuard {
            local,
            scope_key: scope_key.to_owned(),
            subscriber_id: subscriber_id.to_owned(),
        }
    }

    /// Takes this relay's members out now, so the others see them leave
    /// at once rather than when the heartbeat expires; bounded by `wait`.
    pub async fn stop(&self, wait: Duration) {
        if let Some(local) = &self.local {
            let (done, stopped) = oneshot::channel();
            if local.send(Local::Stop(done)).is_ok() {
                let _ = tokio::time::timeout(wait, stopped).await;
            }
        }
    }
}

/// A stream's membership: dropping it leaves.
pub struct PresenceGuard {
    local: Option<mpsc::UnboundedSender<Local>>,
    scope_key: String,
    subscriber_id: String,
}

impl PresenceGuard {
    /// The scope the subscriber is a member of.
    pub fn scope_key(&self) -> &str {
        &self.scope_key
    }
}

impl Drop for PresenceGuard {
    fn drop(&mut self) {
        if let Some(local) = &self.local {
            let _ = local.send(Local::Leave {
                scope_key: std::mem::take(&mut self.scope_key),
                subscriber_id: std::mem::take(&mut self.subscriber_id),
            });
        }
    }
}

/// Starts presence for `config`: the handle, and the task to spawn (none
/// when no scope has presence).
pub fn start(
    config: &PresenceConfig,
    db: Database,
    store: PresenceStore,
    relay_id: String,
    hubs: HubDirectory,
) -> (Presence, Option<impl Future<Output = ()> + use<>>) {
    let view = Arc::new(PresenceView::new(config.max_members));
    if config.scopes.is_empty() {
        return (
            Presence {
                config: Arc::new(config.clone()),
                local: None,
                view,
            },
            None,
        );
    }
    let (local, changes) = mpsc::unbounded_channel();
    let presence = Presence {
        config: Arc::new(config.clone()),
        local: Some(local),
        view: Arc::clone(&view),
    };
    let task = Runner {
        config: config.clone(),
        db,
        store,
        relay_id,
        hubs,
        view,
        changes,
        members: HashMap::new(),
        dirty: HashMap::new(),
    };
    (presence, Some(task.run()))
}

/// The per-relay task: batches, writes, reads, merges, hands on.
struct Runner {
    config: PresenceConfig,
    db: Database,
    store: PresenceStore,
    relay_id: String,
    hubs: HubDirectory,
    view: Arc<PresenceView>,
    changes: mpsc::UnboundedReceiver<Local>,
    /// This relay's members: streams held, and the info of the last join.
    members: HashMap<(String, String), (i32, Option<Value>)>,
    /// Members whose row must be written this round.
    dirty: HashMap<(String, String), ()>,
}

impl Runner {
    async fn run(mut self) {
        let mut ticks = tokio::time::interval(Duration::from_millis(self.config.batch_ms));
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let heartbeat_every = Duration::from_secs(self.config.expire_secs) / 3;
        let mut last_heartbeat: Option<tokio::time::Instant> = None;
        let mut since = ReadPoint::default();
        loop {
            ticks.tick().await;
            while let Ok(change) = self.changes.try_recv() {
                if let Local::Stop(done) = change {
                    self.leave_everything().await;
                    let _ = done.send(());
                    return;
                }
                self.take(change);
            }
            let heartbeat_due = last_heartbeat.is_none_or(|at| at.elapsed() >= heartbeat_every);
            match self.round(since, heartbeat_due).await {
                Ok(next) => {
                    since = next;
                    if heartbeat_due {
                        last_heartbeat = Some(tokio::time::Instant::now());
                    }
                }
                Err(error) => {
                    tracing::warn!(%error, "presence could not be written or read; will retry")
                }
            }
        }
    }

    fn take(&mut self, change: Local) {
        match change {
            Local::Join {
                scope_key,
                subscriber_id,
                info,
            } => {
                let key = (scope_key, subscriber_id);
                let entry = self.members.entry(key.clone()).or_insert((0, None));
                entry.0 += 1;
                if info.is_some() {
                    entry.1 = info;
                }
                self.dirty.insert(key, ());
            }
            Local::Leave {
                scope_key,
                subscriber_id,
            } => {
                let key = (scope_key, subscriber_id);
                if let Some(entry) = self.members.get_mut(&key) {
                    entry.0 -= 1;
                    self.dirty.insert(key, ());
                }
            }
            Local::Stop(_) => {}
        }
    }

    /// One round: this relay's changes out, everyone's in; answers where
    /// the next read starts.
    async fn round(
        &mut self,
        since: ReadPoint,
        heartbeat: bool,
    ) -> Result<ReadPoint, crate::store::StoreError> {
        let client = self.db.get().await?;
        if heartbeat {
            self.store
                .heartbeat(&*client, &self.relay_id, self.config.expire_secs)
                .await?;
        }
        if !self.dirty.is_empty() {
            let rows: Vec<(String, String, i32, Option<Value>)> = self
                .dirty
                .drain()
                .map(|((scope, subscriber), ())| {
                    let (streams, info) = self
                        .members
                        .get(&(scope.clone(), subscriber.clone()))
                        .cloned()
                        .unwrap_or((0, None));
                    (scope, subscriber, streams.max(0), info)
                })
                .collect();
            self.store.write(&*client, &self.relay_id, &rows).await?;
            self.members.retain(|_, (streams, _)| *streams > 0);
        }
        let (changed, next) = self.store.changed_since(&*client, since).await?;
        let live = self
            .store
            .live_relays(&*client, self.config.expire_secs)
            .await?;
        drop(client);
        for change in self.view.apply(changed, live) {
            if let Some(hub) = self.hubs.get(&change.scope_key) {
                hub.publish_ephemeral(PublishEphemeral {
                    event: Arc::new(change.frame()),
                    heard_at: None,
                });
            }
        }
        Ok(next)
    }

    async fn leave_everything(&mut self) {
        match self.db.get().await {
            Ok(client) => {
                if let Err(error) = self.store.remove_relay(&*client, &self.relay_id).await {
                    tracing::warn!(%error, "could not take this relay's presence out");
                }
            }
            Err(error) => tracing::warn!(%error, "could not take this relay's presence out"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn patterns_cover_exact_keys_prefixes_and_everything() {
        let config = PresenceConfig {
            scopes: vec!["doc-*".into(), "org-1".into()],
            ..PresenceConfig::default()
        };
        assert!(config.covers("doc-7"));
        assert!(config.covers("org-1"));
        assert!(!config.covers("org-10"));
        let all = PresenceConfig {
            scopes: vec!["*".into()],
            ..PresenceConfig::default()
        };
        assert!(all.covers("anything"));
        assert!(!PresenceConfig::default().covers("org-1"));
        for bad in ["a*b", "", "**"] {
            let config = PresenceConfig {
                scopes: vec![bad.into()],
                ..PresenceConfig::default()
            };
            assert_eq!(config.check().unwrap_err().0, "presence.scopes", "{bad}");
        }
    }

    #[test]
    fn claims_hide_and_carry_bounded_info() {
        let hidden = PresenceClaims::from_claims(Some(&json!(false)), None).unwrap();
        assert!(hidden.hidden);
        let shown =
            PresenceClaims::from_claims(Some(&json!(true)), Some(&json!({"name": "Ada"}))).unwrap();
        assert_eq!(shown.info, Some(json!({"name": "Ada"})));
        assert!(!shown.hidden);
        let big = json!({"bio": "x".repeat(MAX_INFO_BYTES)});
        assert!(PresenceClaims::from_claims(None, Some(&big)).is_err());
        assert!(PresenceClaims::from_claims(None, Some(&json!("ada"))).is_err());
    }
}
