//! Horizon marks: how a relay learns that it has heard everything every
//! transaction below some id announced.
//!
//! Every [`MARK_EVERY`] the relay reads the oldest transaction still
//! running (`pg_snapshot_xmin(pg_current_snapshot())`), then sends that id,
//! sealed, the way durable events travel: a notification on the channel,
//! or a transactional logical message on the replication stream. Both are
//! heard in commit order, and every transaction below the id had finished
//! before the mark's own transaction began, so a relay that hears the mark
//! has heard every pointer or row those transactions sent. Its scopes
//! raise their horizons on it (see `actors::scope`), and the horizon is
//! what each frame's `id:` carries for an exact resume.
//!
//! Every relay hears every relay's marks, and each is as good as its own.
//! A mark that cannot go out is simply missed: a horizon that lags only
//! makes a resume replay more, never less.

use std::sync::Arc;
use std::time::Duration;

use eventrelay_publisher::Identifier;
use eventrelay_wire::{Origin, SealKey, encode_horizon};

use crate::metrics::Metrics;
use crate::store::{Database, StoreError, WakeupMode};

/// How often a relay sends a mark. Marks cost one notifying (or logical
/// message) commit each; the horizon lags the oldest open transaction by
/// at most about this much.
pub const MARK_EVERY: Duration = Duration::from_millis(250);

/// What a relay needs to send its marks.
pub struct HorizonMarks {
    pub db: Database,
    /// The events' channel, which is also the logical messages' prefix.
    pub channel: Identifier,
    pub wakeup: WakeupMode,
    /// `None` for the embedded database, whose notifications are not sealed.
    pub seal: Option<Arc<SealKey>>,
    pub metrics: Arc<Metrics>,
}

impl HorizonMarks {
    /// Sends a mark every [`MARK_EVERY`] until the listener stops.
    pub async fn send_forever(self) {
        let mut tick = tokio::time::interval(MARK_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing = false;
        loop {
            tick.tick().await;
            match self.send_one().await {
                Ok(()) => {
                    failing = false;
                    self.metrics.horizon_marks_sent.inc();
                }
                Err(error) if !failing => {
                    // Once per outage: the listener reports the outage itself.
                    failing = true;
                    tracing::debug!(%error, "could not send a horizon mark; trying again");
                }
                Err(_) => {}
            }
        }
    }

    async fn send_one(&self) -> Result<(), StoreError> {
        let client = self.db.get().await?;
        // Taken before the mark's own statement begins, so every
        // transaction below it finished before the mark commits.
        let row = client
            .query_one("SELECT pg_snapshot_xmin(pg_current_snapshot())::text", &[])
            .await?;
        let xmin: u64 = row
            .get::<_, String>(0)
            .parse()
            .map_err(|_| StoreError::NoRow("a readable snapshot xmin"))?;
        let mark = encode_horizon(xmin);
        let payload = match &self.seal {
            Some(key) => key.seal(Origin::Rows, &mark, uuid::Uuid::new_v4().into_bytes()),
            None => mark,
        };
        let send = match self.wakeup {
            WakeupMode::Notify => "SELECT pg_notify($1, $2)",
            WakeupMode::Logical => "SELECT pg_logical_emit_message(true, $1, $2)::text",
        };
        client
            .execute(send, &[&self.channel.as_str(), &payload])
            .await?;
        Ok(())
    }
}
