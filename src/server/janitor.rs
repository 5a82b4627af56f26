//! The janitor: prunes what has outlived its retention, on an interval:
//! outbox rows past `outbox.retention_secs`, and finished webhook
//! deliveries (with their attempts) past `webhooks.retention_secs`, or
//! `webhooks.dead_retention_secs` for dead ones, and portal sessions a day
//! after they ended.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::metrics::Metrics;
use crate::portal::PortalStore;
use crate::store::{Database, Outbox, StoreError};
use crate::webhooks::WebhookStore;

/// Deliveries removed per statement: each batch's locks are held briefly,
/// and a backlog of millions is worked through batch by batch.
const DELIVERIES_PER_BATCH: i64 = 1_000;

/// What the janitor prunes, and when.
pub(super) struct Janitor {
    pub db: Database,
    pub outbox: Outbox,
    pub webhooks: WebhookStore,
    pub portal: PortalStore,
    pub outbox_retention: Duration,
    /// Delivered and gone deliveries.
    pub finished_retention: Duration,
    pub dead_retention: Duration,
    pub interval: Duration,
    pub metrics: Arc<Metrics>,
}

impl Janitor {
    pub(super) async fn prune_forever(self) {
        let mut ticks = tokio::time::interval(self.interval);
        loop {
            ticks.tick().await;
            match self.prune_outbox().await {
                Ok(0) => {}
                Ok(rows) => {
                    self.metrics.outbox_rows_pruned.inc_by(rows);
                    tracing::info!(rows, "pruned outbox rows past retention");
                }
                Err(error) => tracing::warn!(%error, "outbox pruning failed; will retry"),
            }
            match self.prune_deliveries().await {
                Ok(0) => {}
                Ok(deliveries) => {
                    tracing::info!(deliveries, "pruned webhook deliveries past retention");
                }
                Err(error) => tracing::warn!(%error, "delivery pruning failed; will retry"),
            }
            match self.prune_portal_sessions().await {
                Ok(0) => {}
                Ok(sessions) => tracing::info!(sessions, "pruned ended portal sessions"),
                Err(error) => tracing::warn!(%error, "portal session pruning failed; will retry"),
            }
        }
    }

    async fn prune_portal_sessions(&self) -> Result<u64, StoreError> {
        let client = self.db.get().await?;
        self.portal.prune(&*client).await
    }

    async fn prune_outbox(&self) -> Result<u64, StoreError> {
        let client = self.db.get().await?;
        self.outbox
            .prune_before(&*client, before(self.outbox_retention))
            .await
    }

    /// Batch after batch until one comes back short; each is counted as it
    /// goes, so a failure part-way loses no count.
    async fn prune_deliveries(&self) -> Result<u64, StoreError> {
        let client = self.db.get().await?;
        let (finished, dead) = (before(self.finished_retention), before(self.dead_retention));
        let mut total = 0;
        loop {
            let pruned = self
                .webhooks
                .prune_past_retention(&*client, finished, dead, DELIVERIES_PER_BATCH)
                .await?;
            self.metrics.webhook_deliveries_pruned.inc_by(pruned);
            total += pruned;
            if pruned < DELIVERIES_PER_BATCH as u64 {
                return Ok(total);
            }
        }
    }
}

/// The cutoff `retention` before now.
fn before(retention: Duration) -> DateTime<Utc> {
    Utc::now() - chrono::Duration::from_std(retention).unwrap_or(chrono::Duration::days(1))
}
