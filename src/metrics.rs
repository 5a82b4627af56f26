//! Prometheus metrics: one registry per service instance, passed to the parts
//! that count. Counters are atomics, so counting never takes a lock.
//!
//! Besides what flows through (connections, events, replays, latency), the
//! load on each pool an operator sizes: actor mailboxes and handling time
//! per actor kind, hubs and busy time per hub arbiter, the database pool,
//! outbox reads, session queues and the webhook dispatcher. No metric is
//! labelled by scope or subscriber, so their number stays bounded however
//! many scopes exist.

use std::sync::atomic::AtomicU64;
use std::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use strum::IntoEnumIterator;

use crate::latency::Stages;
use crate::telemetry::Tracing;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    /// An [`AttemptOutcome`](crate::webhooks::AttemptOutcome)'s name.
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceLabel {
    /// One of [`REPLAY_SOURCES`].
    pub source: &'static str,
}

/// Where a replay is served from: the hub's tail, or the outbox.
pub const REPLAY_SOURCES: [&str; 2] = ["memory", "outbox"];

/// Why a resuming stream was told to re-read its state (see
/// `sse::stream`): its cursor is older than what the outbox keeps, or is
/// not from this outbox at all.
pub const RESYNC_REASONS: [&str; 2] = ["pruned", "unknown_cursor"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// Why: `not_sealed`, `bad_tag`, `bad_ciphertext`, `emitter_kind`, ...
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    /// `applied` or `failed`.
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ActorLabel {
    /// `listener`, `relay`, `hub` or `dispatcher`.
    pub actor: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ArbiterLabel {
    /// The hub arbiter's index, from 0 to `hub.arbiters - 1`.
    pub arbiter: String,
}

/// The actor kinds whose load is measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActorKind {
    Listener,
    Relay,
    Hub,
    Dispatcher,
}

impl ActorKind {
    const ALL: [ActorKind; 4] = [
        ActorKind::Listener,
        ActorKind::Relay,
        ActorKind::Hub,
        ActorKind::Dispatcher,
    ];

    fn label(self) -> &'static str {
        match self {
            ActorKind::Listener => "listener",
            ActorKind::Relay => "relay",
            ActorKind::Hub => "hub",
            ActorKind::Dispatcher => "dispatcher",
        }
    }
}

/// One actor kind's load: messages waiting in its actors' mailboxes, and
/// the time their handlers take.
#[derive(Clone)]
pub struct ActorLoad {
    depth: Gauge,
    handling: Histogram,
}

impl ActorLoad {
    /// A message was sent to an actor of this kind. Every send of a
    /// message whose handler calls [`ActorLoad::handling`] must call this.
    pub fn queued(&self) {
        self.depth.inc();
    }

    /// A message left the mailbox and is being handled; the time is
    /// recorded when the returned guard is dropped.
    pub fn handling(&self) -> Handling {
        self.depth.dec();
        self.timed()
    }

    /// Times one unit of work that did not come through a mailbox.
    pub fn timed(&self) -> Handling {
        Handling {
            handling: self.handling.clone(),
            busy: None,
            started: Instant::now(),
        }
    }

    /// For an actor fed by a queue of its own rather than its mailbox
    /// (the listener's notifications): what is waiting there now.
    pub fn set_waiting(&self, waiting: usize) {
        self.depth.set(i64::try_from(waiting).unwrap_or(i64::MAX));
    }
}

/// Times one message's handling; see [`ActorLoad::handling`].
pub struct Handling {
    handling: Histogram,
    busy: Option<Counter<f64, AtomicU64>>,
    started: Instant,
}

impl Handling {
    /// Also counts the time as busy time of a hub arbiter.
    pub fn on_arbiter(mut self, busy: &Counter<f64, AtomicU64>) -> Handling {
        self.busy = Some(busy.clone());
        self
    }
}

impl Drop for Handling {
    fn drop(&mut self) {
        let seconds = self.started.elapsed().as_secs_f64();
        self.handling.observe(seconds);
        if let Some(busy) = &self.busy {
            busy.inc_by(seconds);
        }
    }
}

/// Every metric the relay exports.
pub struct Metrics {
    registry: Registry,
    pub connections: Gauge,
    pub active_scopes: Gauge,
    pub events_relayed: Counter,
    pub events_delivered: Counter,
    pub events_filtered: Counter,
    pub replays: Family<SourceLabel, Counter>,
    /// Resumes told to re-read their state (`ready` with `resync: true`)
    /// because events they were owed may be gone, by why.
    pub resyncs: Family<ReasonLabel, Counter>,
    pub listener_reconnects: Counter,
    pub database_connections_dead: Counter,
    pub notifications_malformed: Counter,
    /// Notifications that were not sealed by this schema's functions, or
    /// said what their sender may not say: dropped.
    pub notifications_rejected: Family<ReasonLabel, Counter>,
    /// HTTP connections at their end, by the deadline that closed them
    /// (see `http::deadline`).
    pub connections_closed: Family<ReasonLabel, Counter>,
    /// Horizon marks this relay sent (see `listener::horizon`).
    pub horizon_marks_sent: Counter,
    /// Pointers that announced nothing new (a seq already delivered, or
    /// older than any late commit): no read.
    pub pointers_ignored: Counter,
    /// Times the database's history was found rewound under the relay
    /// (see [`crate::store::Outbox::still_holds`]).
    pub history_rewinds: Counter,
    /// Logical wake-up mode: times the replication stream was re-established.
    pub replication_reconnects: Counter,
    /// Logical wake-up mode: WAL between the change last read and the
    /// server's end of WAL when it was sent.
    pub replication_lag_bytes: Gauge,
    /// Logical wake-up mode: from a transaction's commit on the server to
    /// the relay reading its commit record.
    pub replication_lag_seconds: Gauge<f64, AtomicU64>,
    pub slow_subscribers_dropped: Counter,
    pub tails_bytes: Gauge,
    pub tails_shrunk: Counter,
    pub commit_to_send_seconds: Histogram,
    /// Where an event's time goes, stage by stage (see [`crate::latency`]).
    pub stages: Stages,
    /// The same journey as traces, when `[telemetry]` exports them: held
    /// here because every part that stamps a stage holds the metrics.
    pub tracing: Tracing,
    pub events_published: Counter,
    pub publish_group_requests: Histogram,
    pub outbox_rows_pruned: Counter,
    /// Finished webhook deliveries the janitor removed past their
    /// retention, with their attempts.
    pub webhook_deliveries_pruned: Counter,
    /// Subscriptions that paused themselves, their receiver failing for
    /// `webhooks.disable_after_secs`.
    pub webhook_subscriptions_paused: Counter,
    /// Deliveries of ordered subscriptions sent while an older one of
    /// their key was still pending (`orderingMaxBlockSecs`).
    pub webhook_order_skips: Counter,
    pub webhook_deliveries: Family<OutcomeLabel, Counter>,
    /// 1 while the relay has a live LISTEN connection (or feed).
    pub listener_connected: Gauge,
    actor_mailbox_depth: Family<ActorLabel, Gauge>,
    actor_handling_seconds: Family<ActorLabel, Histogram, fn() -> Histogram>,
    actors: Vec<ActorLoad>,
    arbiter_hubs: Family<ArbiterLabel, Gauge>,
    arbiter_busy_seconds: Family<ArbiterLabel, Counter<f64, AtomicU64>>,
    pub database_pool_size: Gauge,
    pub database_pool_in_use: Gauge,
    pub database_pool_waiting: Gauge,
    pub database_pool_wait_seconds: Histogram,
    pub outbox_read_seconds: Histogram,
    pub outbox_read_rows: Histogram,
    pub session_queue_fill_ratio: Histogram,
    pub frames_dropped: Counter,
    pub webhook_workers_busy: Gauge,
    pub webhook_due_backlog: Gauge,
    pub webhook_oldest_due_age_seconds: Gauge<f64, AtomicU64>,
    actor_restarts: Family<ActorLabel, Counter>,
    /// Configuration reloads, applied or refused.
    pub config_reloads_applied: Counter,
    pub config_reloads_failed: Counter,
}

fn latency_buckets() -> Histogram {
    Histogram::new([
        0.000_01, 0.000_05, 0.000_1, 0.000_5, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0,
    ])
}

impl Metrics {
    /// The `connections_closed` counters, one per reason, for the HTTP
    /// server's connections to share.
    pub fn connections_closed_counters(&self) -> crate::http::deadline::ClosedCounters {
        let counter = |reason| {
            self.connections_closed
                .get_or_create(&ReasonLabel { reason })
                .clone()
        };
        crate::http::deadline::ClosedCounters {
            header_timeout: counter("header_timeout"),
            write_timeout: counter("write_timeout"),
            ended: counter("ended"),
        }
    }

    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("eventrelay");
        let metrics = Metrics {
            connections: Gauge::default(),
            active_scopes: Gauge::default(),
            events_relayed: Counter::default(),
            events_delivered: Counter::default(),
            events_filtered: Counter::default(),
            replays: Family::default(),
            resyncs: Family::default(),
            listener_reconnects: Counter::default(),
            database_connections_dead: Counter::default(),
            notifications_malformed: Counter::default(),
            notifications_rejected: Family::default(),
            connections_closed: Family::default(),
            pointers_ignored: Counter::default(),
            history_rewinds: Counter::default(),
            horizon_marks_sent: Counter::default(),
            replication_reconnects: Counter::default(),
            replication_lag_bytes: Gauge::default(),
            replication_lag_seconds: Gauge::default(),
            slow_subscribers_dropped: Counter::default(),
            tails_bytes: Gauge::default(),
            tails_shrunk: Counter::default(),
            commit_to_send_seconds: Histogram::new([
                0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
            ]),
            stages: Stages::default(),
            tracing: Tracing::default(),
            events_published: Counter::default(),
            publish_group_requests: Histogram::new([
                1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0,
            ]),
            outbox_rows_pruned: Counter::default(),
            webhook_deliveries_pruned: Counter::default(),
            webhook_subscriptions_paused: Counter::default(),
            webhook_order_skips: Counter::default(),
            webhook_deliveries: Family::default(),
            listener_connected: Gauge::default(),
            actor_mailbox_depth: Family::default(),
            actor_handling_seconds: Family::new_with_constructor(latency_buckets),
            actors: Vec::new(),
            arbiter_hubs: Family::default(),
            arbiter_busy_seconds: Family::default(),
            database_pool_size: Gauge::default(),
            database_pool_in_use: Gauge::default(),
            database_pool_waiting: Gauge::default(),
            database_pool_wait_seconds: latency_buckets(),
            outbox_read_seconds: latency_buckets(),
            outbox_read_rows: Histogram::new([
                0.0, 1.0, 2.0, 5.0, 10.0, 50.0, 100.0, 500.0, 1000.0, 5000.0,
            ]),
            session_queue_fill_ratio: Histogram::new([0.0, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0]),
            frames_dropped: Counter::default(),
            webhook_workers_busy: Gauge::default(),
            webhook_due_backlog: Gauge::default(),
            webhook_oldest_due_age_seconds: Gauge::default(),
            actor_restarts: Family::default(),
            config_reloads_applied: Counter::default(),
            config_reloads_failed: Counter::default(),
            registry: Registry::default(),
        };
        registry.register(
            "sse_connections",
            "Open SSE connections",
            metrics.connections.clone(),
        );
        registry.register(
            "active_scopes",
            "Scopes with at least one subscriber here",
            metrics.active_scopes.clone(),
        );
        registry.register(
            "events_relayed",
            "Events handed to hubs",
            metrics.events_relayed.clone(),
        );
        registry.register(
            "events_delivered",
            "Frames queued to subscribers",
            metrics.events_delivered.clone(),
        );
        registry.register(
            "events_filtered",
            "Events withheld from a subscriber by the audience rule",
            metrics.events_filtered.clone(),
        );
        // Every known label value from the start, at 0: a series that
        // appears only once it moves hides its first increase from rate().
        for source in REPLAY_SOURCES {
            let _ = metrics.replays.get_or_create(&SourceLabel { source });
        }
        registry.register(
            "replays",
            "Replays served, by source",
            metrics.replays.clone(),
        );
        for reason in RESYNC_REASONS {
            let _ = metrics.resyncs.get_or_create(&ReasonLabel { reason });
        }
        registry.register(
            "resyncs",
            "Resuming streams told to re-read their state because events they were owed may be gone, by reason",
            metrics.resyncs.clone(),
        );
        registry.register(
            "listener_reconnects",
            "Times the LISTEN connection was re-established",
            metrics.listener_reconnects.clone(),
        );
        registry.register(
            "database_connections_dead",
            "Connections that stopped answering without an error (a dropped flow) and were replaced",
            metrics.database_connections_dead.clone(),
        );
        registry.register(
            "notifications_malformed",
            "Notifications dropped because they did not decode",
            metrics.notifications_malformed.clone(),
        );
        // Every reason from zero, so a first rejection is an increase.
        for reason in [
            "not_sealed",
            "bad_tag",
            "bad_ciphertext",
            "too_large",
            "emitter_kind",
        ] {
            let _ = metrics
                .notifications_rejected
                .get_or_create(&ReasonLabel { reason });
        }
        registry.register(
            "connections_closed",
            "HTTP connections closed, by why: header_timeout, write_timeout (the client took none of a response within http.write_timeout_secs), or ended (by the client, keep-alive or shutdown)",
            metrics.connections_closed.clone(),
        );
        registry.register(
            "notifications_rejected",
            "Notifications dropped because they were not sealed with this schema's key, or said what their sender may not say",
            metrics.notifications_rejected.clone(),
        );
        registry.register(
            "horizon_marks_sent",
            "Horizon marks sent; while they fail, resumes replay more (never less)",
            metrics.horizon_marks_sent.clone(),
        );
        registry.register(
            "history_rewinds",
            "Times the database no longer held events this relay had read (a standby promoted without the last commits, a restore): every stream ended, to resume against the new history",
            metrics.history_rewinds.clone(),
        );
        registry.register(
            "pointers_ignored",
            "Pointers that announced nothing new (a seq already delivered, or older than any late commit), so read nothing",
            metrics.pointers_ignored.clone(),
        );
        registry.register(
            "replication_reconnects",
            "Times the logical replication stream was re-established (logical wake-up mode)",
            metrics.replication_reconnects.clone(),
        );
        registry.register(
            "replication_lag_bytes",
            "WAL bytes between the change last read and the server's end of WAL (logical wake-up mode)",
            metrics.replication_lag_bytes.clone(),
        );
        registry.register(
            "replication_lag_seconds",
            "Seconds from the last decoded transaction's commit to the relay reading it (logical wake-up mode)",
            metrics.replication_lag_seconds.clone(),
        );
        registry.register(
            "slow_subscribers_dropped",
            "Subscribers disconnected because their queue was full",
            metrics.slow_subscribers_dropped.clone(),
        );
        registry.register(
            "tails_bytes",
            "Encoded bytes held by all scopes' tails together",
            metrics.tails_bytes.clone(),
        );
        registry.register(
            "tails_shrunk",
            "Tails emptied because all tails together reached hub.tails_max_bytes",
            metrics.tails_shrunk.clone(),
        );
        registry.register(
            "commit_to_send_seconds",
            "Time from an event's emit to its fan-out",
            metrics.commit_to_send_seconds.clone(),
        );
        registry.register(
            "latency_stage_seconds",
            "Time events spend in each stage between a publish request and the subscribers' sockets",
            metrics.stages.family(),
        );
        registry.register(
            "events_published",
            "Events accepted by the HTTP publish API",
            metrics.events_published.clone(),
        );
        registry.register(
            "publish_group_requests",
            "Publish requests written together in one transaction",
            metrics.publish_group_requests.clone(),
        );
        registry.register(
            "outbox_rows_pruned",
            "Outbox rows removed by the janitor",
            metrics.outbox_rows_pruned.clone(),
        );
        registry.register(
            "webhook_deliveries_pruned",
            "Finished webhook deliveries removed with their attempts past webhooks.retention_secs (delivered, gone) or webhooks.dead_retention_secs (dead)",
            metrics.webhook_deliveries_pruned.clone(),
        );
        registry.register(
            "webhook_subscriptions_paused",
            "Webhook subscriptions that paused themselves because every attempt failed for webhooks.disable_after_secs (pausedReason failing)",
            metrics.webhook_subscriptions_paused.clone(),
        );
        registry.register(
            "webhook_order_skips",
            "Deliveries of ordered subscriptions sent while an older delivery of their key was still pending, past the subscription's orderingMaxBlockSecs",
            metrics.webhook_order_skips.clone(),
        );
        for outcome in crate::webhooks::AttemptOutcome::iter() {
            let _ = metrics.webhook_deliveries.get_or_create(&OutcomeLabel {
                outcome: outcome.as_str(),
            });
        }
        registry.register(
            "webhook_deliveries",
            "Webhook attempts, by outcome",
            metrics.webhook_deliveries.clone(),
        );
        let actors = ActorKind::ALL
            .iter()
            .map(|kind| {
                let label = ActorLabel {
                    actor: kind.label(),
                };
                ActorLoad {
                    depth: metrics.actor_mailbox_depth.get_or_create(&label).clone(),
                    handling: metrics.actor_handling_seconds.get_or_create(&label).clone(),
                }
            })
            .collect();
        registry.register(
            "listener_connected",
            "1 while the LISTEN connection (or the embedded feed) is live",
            metrics.listener_connected.clone(),
        );
        registry.register(
            "actor_mailbox_depth",
            "Messages waiting for actors of each kind",
            metrics.actor_mailbox_depth.clone(),
        );
        registry.register(
            "actor_handling_seconds",
            "Time actors of each kind take to handle one message",
            metrics.actor_handling_seconds.clone(),
        );
        registry.register(
            "arbiter_hubs",
            "Hubs (active scopes) held by each hub arbiter",
            metrics.arbiter_hubs.clone(),
        );
        registry.register(
            "arbiter_busy_seconds",
            "Time each hub arbiter spent handling hub messages; its rate is the arbiter's busy fraction",
            metrics.arbiter_busy_seconds.clone(),
        );
        registry.register(
            "database_pool_size",
            "Connections the database pool holds (database.pool_size at most)",
            metrics.database_pool_size.clone(),
        );
        registry.register(
            "database_pool_in_use",
            "Pool connections checked out",
            metrics.database_pool_in_use.clone(),
        );
        registry.register(
            "database_pool_waiting",
            "Tasks waiting for a pool connection",
            metrics.database_pool_waiting.clone(),
        );
        registry.register(
            "database_pool_wait_seconds",
            "Time taken to get a pool connection",
            metrics.database_pool_wait_seconds.clone(),
        );
        registry.register(
            "outbox_read_seconds",
            "Time the relay takes to read a scope's new outbox rows",
            metrics.outbox_read_seconds.clone(),
        );
        registry.register(
            "outbox_read_rows",
            "Rows per relay outbox read",
            metrics.outbox_read_rows.clone(),
        );
        registry.register(
            "session_queue_fill_ratio",
            "How full a session's queue is when it takes frames (1 is full: the next frame drops the subscriber)",
            metrics.session_queue_fill_ratio.clone(),
        );
        registry.register(
            "frames_dropped",
            "Frames discarded with subscribers dropped for being too slow",
            metrics.frames_dropped.clone(),
        );
        registry.register(
            "webhook_workers_busy",
            "Webhook workers sending a delivery",
            metrics.webhook_workers_busy.clone(),
        );
        registry.register(
            "webhook_due_backlog",
            "Pending webhook deliveries that are due",
            metrics.webhook_due_backlog.clone(),
        );
        registry.register(
            "webhook_oldest_due_age_seconds",
            "How long the oldest due webhook delivery has been due",
            metrics.webhook_oldest_due_age_seconds.clone(),
        );
        for kind in ActorKind::ALL {
            let _ = metrics.actor_restarts.get_or_create(&ActorLabel {
                actor: kind.label(),
            });
        }
        registry.register(
            "actor_restarts",
            "Actors that failed (panicked) and were restarted, by kind",
            metrics.actor_restarts.clone(),
        );
        // Both series exist from the start, so a rule on `failed` has a
        // series to watch before the first failure.
        let reloads = Family::<ResultLabel, Counter>::default();
        registry.register(
            "config_reloads",
            "Configuration reloads (SIGHUP, `eventrelay reload`), by result",
            reloads.clone(),
        );
        // One statement each: a family's guard must be gone before the
        // next series is created.
        let config_reloads_applied = reloads
            .get_or_create(&ResultLabel { result: "applied" })
            .clone();
        let config_reloads_failed = reloads
            .get_or_create(&ResultLabel { result: "failed" })
            .clone();
        Metrics {
            registry,
            actors,
            config_reloads_applied,
            config_reloads_failed,
            ..metrics
        }
    }

    /// The load of one actor kind.
    pub fn actor(&self, kind: ActorKind) -> &ActorLoad {
        let index = ActorKind::ALL
            .iter()
            .position(|k| *k == kind)
            .unwrap_or_default();
        &self.actors[index]
    }

    /// Counts a restart of a failed actor of this kind.
    pub fn restarted(&self, kind: ActorKind) {
        self.actor_restarts
            .get_or_create(&ActorLabel {
                actor: kind.label(),
            })
            .inc();
    }

    /// Hubs held by hub arbiter `arbiter`.
    pub fn arbiter_hubs(&self, arbiter: usize) -> Gauge {
        self.arbiter_hubs
            .get_or_create(&ArbiterLabel {
                arbiter: arbiter.to_string(),
            })
            .clone()
    }

    /// Busy time of hub arbiter `arbiter`.
    pub fn arbiter_busy(&self, arbiter: usize) -> Counter<f64, AtomicU64> {
        self.arbiter_busy_seconds
            .get_or_create(&ArbiterLabel {
                arbiter: arbiter.to_string(),
            })
            .clone()
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        #[allow(
            clippy::expect_used,
            reason = "encoding only fails when the writer does, and writing to a String cannot"
        )]
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// The metrics of a relay that exports traces through `tracing`.
    pub fn tracing_to(mut self, tracing: Tracing) -> Self {
        self.tracing = tracing;
        self
    }
}
