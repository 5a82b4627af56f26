//! The janitor: prunes the outbox past its retention.

use std::sync::Arc;
use std::time::Duration;

use crate::metrics::Metrics;
use crate::store::{Database, Outbox};

/// The janitor: removes outbox rows older than the retention, on an interval.
pub(super) async fn prune_forever(
    db: Database,
    outbox: Outbox,
    retention: Duration,
    interval: Duration,
    metrics: Arc<Metrics>,
) {
    let mut ticks = tokio::time::interval(interval);
    loop {
        ticks.tick().await;
        let cutoff = chrono::Utc::now()
            - chrono::Duration::from_std(retention).unwrap_or(chrono::Duration::days(1));
        let pruned: Result<_, crate::store::StoreError> = async {
            let client = db.get().await?;
            outbox.prune_before(&*client, cutoff).await
        }
        .await;
        match pruned {
            Ok(0) => {}
            Ok(rows) => {
                metrics.outbox_rows_pruned.inc_by(rows);
                tracing::info!(rows, "pruned outbox rows past retention");
            }
            Err(error) => tracing::warn!(%error, "outbox pruning failed; will retry"),
        }
    }
}
