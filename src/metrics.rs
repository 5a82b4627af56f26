//! Prometheus metrics: one registry per service instance, passed to the parts
//! that count. Counters are atomics, so counting never takes a lock.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    /// `delivered`, `retry`, `dead` or `gone`.
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceLabel {
    /// `memory` (the hub's tail) or `outbox`.
    pub source: &'static str,
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
    pub listener_reconnects: Counter,
    pub database_connections_dead: Counter,
    pub notifications_malformed: Counter,
    pub slow_subscribers_dropped: Counter,
    pub tails_bytes: Gauge,
    pub tails_shrunk: Counter,
    pub commit_to_send_seconds: Histogram,
    pub events_published: Counter,
    pub publish_group_requests: Histogram,
    pub outbox_rows_pruned: Counter,
    pub webhook_deliveries: Family<OutcomeLabel, Counter>,
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("eventrelay");
        let metrics = Metrics {
            connections: Gauge::default(),
            active_scopes: Gauge::default(),
            events_relayed: Counter::default(),
            events_delivered: Counter::default(),
            events_filtered: Counter::default(),
            replays: Family::default(),
            listener_reconnects: Counter::default(),
            database_connections_dead: Counter::default(),
            notifications_malformed: Counter::default(),
            slow_subscribers_dropped: Counter::default(),
            tails_bytes: Gauge::default(),
            tails_shrunk: Counter::default(),
            commit_to_send_seconds: Histogram::new([
                0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
            ]),
            events_published: Counter::default(),
            publish_group_requests: Histogram::new([
                1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0,
            ]),
            outbox_rows_pruned: Counter::default(),
            webhook_deliveries: Family::default(),
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
        registry.register(
            "replays",
            "Replays served, by source",
            metrics.replays.clone(),
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
            "webhook_deliveries",
            "Webhook attempts, by outcome",
            metrics.webhook_deliveries.clone(),
        );
        Metrics {
            registry,
            ..metrics
        }
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
