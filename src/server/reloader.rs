//! The reload loop: answers each reload request by reading, checking and
//! applying the configuration (see [`crate::reload`] for what may change
//! live).

use std::sync::Arc;

use tokio::sync::watch;

use crate::actors::mailbox::Counted;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::reload::{ReloadError, ReloadReport, Reloading};
use crate::store::{Database, StoreError};
use crate::webhooks::{Dispatcher, SetWorkers, WebhookStore};

/// What a reload reaches beyond the live configuration.
pub(super) struct Reloaders {
    pub db: Database,
    pub webhooks: WebhookStore,
    pub dispatcher: Option<Counted<actix::Addr<Dispatcher>>>,
    pub metrics: Arc<Metrics>,
}

/// Answers reload requests until the service stops.
pub(super) async fn reload_forever(
    mut reloading: Reloading,
    live: watch::Sender<Arc<Config>>,
    reach: Reloaders,
) {
    while let Some(reply) = reloading.requests.next().await {
        let outcome = reload_once(&reloading, &live, &reach).await;
        match &outcome {
            Ok(report) => {
                reach.metrics.config_reloads_applied.inc();
                tracing::info!(applied = ?report.applied, "configuration reloaded");
                if !report.needs_restart.is_empty() {
                    tracing::warn!(
                        settings = ?report.needs_restart,
                        "changed settings take effect only after a restart"
                    );
                }
            }
            Err(error) => {
                reach.metrics.config_reloads_failed.inc();
                tracing::error!(%error, "configuration reload refused; the one in force stays");
            }
        }
        let _ = reply.send(outcome.map_err(Arc::new));
    }
}

/// Reads, checks and applies the configuration once.
async fn reload_once(
    reloading: &Reloading,
    live: &watch::Sender<Arc<Config>>,
    reach: &Reloaders,
) -> Result<ReloadReport, ReloadError> {
    let new = (reloading.load)()?;
    let current = Arc::clone(&live.borrow());
    let (merged, report) = crate::reload::merge(&current, &new);
    if merged.log.level != current.log.level {
        (reloading.set_log_level)(&merged.log.level).map_err(ReloadError::LogLevel)?;
    }
    if merged.webhooks.subscriptions != current.webhooks.subscriptions {
        // As at start: configured subscriptions are added or updated,
        // never removed (see `eventrelay subscriptions remove-unlisted`).
        let synced: Result<(), StoreError> = async {
            let conn = reach.db.get().await?;
            reach
                .webhooks
                .sync_config_subscriptions(&*conn, &merged.webhooks.subscriptions)
                .await
        }
        .await;
        synced.map_err(ReloadError::Subscriptions)?;
    }
    if merged.webhooks.workers != current.webhooks.workers
        && let Some(dispatcher) = &reach.dispatcher
    {
        dispatcher.do_send(SetWorkers(merged.webhooks.workers));
    }
    live.send_replace(Arc::new(merged));
    Ok(report)
}
