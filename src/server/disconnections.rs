//! The disconnection poller: applies to this relay's streams the
//! disconnections recorded through any relay.

use std::time::Duration;

use crate::sse::registry::StreamRegistry;
use crate::store::Database;
use crate::store::disconnections::Disconnections;

/// How often each relay reads the disconnections recorded meanwhile: a
/// disconnection through one relay ends the streams on every other within
/// about this long.
const DISCONNECTIONS_POLL: Duration = Duration::from_millis(500);

/// Reads the disconnections recorded through any relay and applies them to
/// this relay's streams; deletes old ones now and then. Starts with the
/// denials in force, so a relay that starts late refuses the same
/// subscribers as the others.
pub(super) async fn follow_disconnections(
    db: Database,
    disconnections: Disconnections,
    streams: StreamRegistry,
) {
    let mut read_after = None;
    let mut ticks = tokio::time::interval(DISCONNECTIONS_POLL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut polls: u64 = 0;
    loop {
        ticks.tick().await;
        polls += 1;
        let step: Result<(), crate::store::StoreError> = async {
            let client = db.get().await?;
            match read_after {
                None => {
                    let (denials, newest) = disconnections.at_start(&*client).await?;
                    for denial in &denials {
                        streams.apply(denial);
                    }
                    read_after = Some(newest);
                }
                Some(after) => {
                    for disconnection in disconnections.since(&*client, after).await? {
                        let ended = streams.apply(&disconnection);
                        if ended > 0 {
                            tracing::info!(
                                subscriber = %disconnection.subscriber_id,
                                ended,
                                "streams ended: the subscriber was disconnected through another relay"
                            );
                        }
                        read_after = Some(disconnection.id);
                    }
                }
            }
            // About once an hour.
            if polls.is_multiple_of(7_200) {
                disconnections.prune(&*client).await?;
            }
            Ok(())
        }
        .await;
        if let Err(error) = step {
            tracing::warn!(%error, "reading disconnections failed; will retry");
        }
    }
}
