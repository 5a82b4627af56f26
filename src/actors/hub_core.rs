//! What a hub holds, behind one lock: the scope's subscribers, its bounded
//! tail, and the fan-out loop over them. The hub actor runs the loop for
//! durable events and for events from other relays; a publish handler of
//! this relay runs it itself, on its own thread, for a small scope's
//! ephemeral events (see [`super::hub::HubHandle::publish_here`]). The lock
//! makes each fan-out whole, whichever thread runs it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use chrono::Utc;
use eventrelay_wire::Subscriber;
use opentelemetry::KeyValue;
use tokio::sync::mpsc::{self, error::TrySendError};

use super::encoded::EncodedEvent;
use super::tail::{Bound, Tail};
use crate::latency::Stage;
use crate::metrics::{ActorKind, Metrics};
use crate::store::Snapshot;
use crate::telemetry::EventTrace;

/// A subscriber's outgoing queue, as the hub sees it.
pub type FrameSender = mpsc::Sender<Arc<EncodedEvent>>;

/// After queuing an event to this many subscribers, a hub that had been
/// idle lets its thread's CPU go once. Those subscribers' streams have just
/// been woken, and an HTTP worker woken onto the hub's CPU would otherwise
/// wait for the whole loop (0.2–0.9 ms at 1,000 subscribers, about 10 ms
/// at 10,000) before writing the event's first frame. Smaller scopes never
/// get here, and when nothing else wants the CPU the yield returns at once.
const YIELD_AFTER: u64 = 64;

/// How long a hub must have had no event to fan out for its next one to
/// yield (see [`YIELD_AFTER`]). Events that come back to back are left to
/// queue up in the streams, which then write several in one chunk. Yielding
/// after every event handed the CPU, under a flood of publishes, to the
/// HTTP workers that also read the publish requests: they took events
/// faster than the streams could write them, and subscribers were dropped
/// as too slow.
const IDLE_BEFORE_YIELD: Duration = Duration::from_millis(1);

/// Which thread runs a fan-out, for whether it yields (see [`YIELD_AFTER`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Runner {
    /// The hub's own thread, which shares nothing with the streams.
    Hub,
    /// An HTTP worker that read the publish. Streams on the same worker
    /// wait for the loop whatever it does, and the others run on their own
    /// workers, so yielding would only delay them all.
    Publisher,
}

pub struct HubCore {
    scope_key: String,
    pub(super) tail: Tail,
    members: HashMap<u64, Member>,
    metrics: Arc<Metrics>,
    /// When the last fan-out ended, to tell an event after a rest from
    /// one of a flood.
    last_fan_out: Option<Instant>,
    /// Messages carrying events sent to the hub actor and not yet fanned
    /// out. While there are any, a publish handler queues behind them
    /// rather than overtake them, so every subscriber gets the scope's
    /// events in one order.
    pub(super) in_mailbox: usize,
}

struct Member {
    subscriber: Subscriber,
    queue: FrameSender,
    /// For a subscriber that asked for no replay: the snapshot taken when
    /// it joined. A durable event whose transaction it saw committed is
    /// history to this subscriber, though it may be new to the scope (its
    /// notification was lost and a re-read found it).
    hide_committed_before: Option<Arc<Snapshot>>,
}

impl Member {
    fn wants(&self, event: &EncodedEvent) -> bool {
        match (&self.hide_committed_before, event.txid()) {
            (Some(snapshot), Some(txid)) => !snapshot.is_visible(txid),
            _ => true,
        }
    }
}

/// A new subscriber, as [`HubCore::attach`] takes it.
pub struct Joining {
    pub session: u64,
    pub subscriber: Subscriber,
    pub queue: FrameSender,
    pub replay_after: Option<i64>,
    pub hide_committed_before: Option<Arc<Snapshot>>,
    /// In a scope with presence: where its snapshot comes from.
    pub presence: Option<Arc<crate::presence::PresenceView>>,
}

impl HubCore {
    pub fn new(
        scope_key: String,
        max_events: Bound,
        max_bytes: Bound,
        metrics: Arc<Metrics>,
    ) -> Self {
        HubCore {
            scope_key,
            tail: Tail::new(max_events, max_bytes),
            members: HashMap::new(),
            metrics,
            last_fan_out: None,
            in_mailbox: 0,
        }
    }

    pub fn scope_key(&self) -> &str {
        &self.scope_key
    }

    /// The latency stages, for the fan-out's callers.
    pub fn stages(&self) -> &crate::latency::Stages {
        &self.metrics.stages
    }

    /// The hub took one of the messages counted in `in_mailbox`.
    pub fn taken_from_mailbox(&mut self) {
        self.in_mailbox = self.in_mailbox.saturating_sub(1);
    }

    pub fn subscribers(&self) -> usize {
        self.members.len()
    }

    /// Adds a subscriber. With `replay_after`, answers the events after it
    /// from the tail (already filtered for this subscriber), or `None` when
    /// the tail does not reach back that far. Registration and the tail
    /// snapshot happen under one lock, so replay and live neither overlap
    /// nor leave a gap.
    pub fn attach(&mut self, joining: Joining) -> Option<Vec<Arc<EncodedEvent>>> {
        let replay = joining
            .replay_after
            .and_then(|after| self.tail.recent(after))
            .map(|events| {
                events
                    .into_iter()
                    .filter(|event| event.is_permitted_for(&joining.subscriber))
                    .collect()
            });
        // First in its queue, so it goes out right after `ready`; taken
        // here, on the hub's thread, so every change after it reaches the
        // stream as a later frame (a change already in it may come again,
        // which a client applies as the same state).
        if let Some(view) = &joining.presence {
            let _ = joining
                .queue
                .try_send(Arc::new(view.snapshot_frame(&self.scope_key)));
        }
        self.members.insert(
            joining.session,
            Member {
                subscriber: joining.subscriber,
                queue: joining.queue,
                hide_committed_before: joining.hide_committed_before,
            },
        );
        replay
    }

    pub fn detach(&mut self, session: u64) {
        self.members.remove(&session);
    }

    /// Durable events read after `read_after`, new to this hub, in seq
    /// order: kept in the tail, then fanned out.
    pub fn publish_durable(
        &mut self,
        read_after: i64,
        events: &[Arc<EncodedEvent>],
        heard_at: Option<Instant>,
    ) {
        self.tail.publish(read_after, events);
        for event in events {
            self.fan_out(event, Runner::Hub, heard_at);
        }
    }

    /// Queues `event` to every subscriber it is for. A subscriber whose
    /// queue is full is dropped on the spot (it reconnects and replays), so
    /// one slow reader never stalls the others. `heard_at` is when the
    /// listener heard it, if it did (for its trace).
    pub fn fan_out(
        &mut self,
        event: &Arc<EncodedEvent>,
        runner: Runner,
        heard_at: Option<Instant>,
    ) {
        let started = Instant::now();
        event.fan_out_started.set(started);
        let trace = self.trace(event, started, heard_at);
        let yield_after = match runner {
            Runner::Hub => yield_after(self.last_fan_out, started),
            Runner::Publisher => u64::MAX,
        };
        let metrics = &self.metrics;
        let scope_key = &self.scope_key;
        // Counted locally and added once: one atomic update per event, not
        // one per subscriber.
        let mut delivered = 0u64;
        let mut filtered = 0u64;
        self.members.retain(|id, member| {
            if !event.is_permitted_for(&member.subscriber) {
                filtered += 1;
                return true;
            }
            if !member.wants(event) {
                return true;
            }
            match member.queue.try_send(Arc::clone(event)) {
                Ok(()) => {
                    delivered += 1;
                    if delivered == yield_after {
                        std::thread::yield_now();
                    }
                    true
                }
                Err(TrySendError::Full(_)) => {
                    metrics.slow_subscribers_dropped.inc();
                    // Its queued frames go with it, and this one.
                    let queued = member.queue.max_capacity() - member.queue.capacity();
                    metrics.frames_dropped.inc_by(queued as u64 + 1);
                    tracing::info!(
                        scope_key,
                        session = id,
                        "subscriber too slow for its queue; disconnecting"
                    );
                    false
                }
                Err(TrySendError::Closed(_)) => false,
            }
        });
        metrics.events_delivered.inc_by(delivered);
        metrics.events_filtered.inc_by(filtered);
        let ended = Instant::now();
        if let Some((trace, started_at)) = trace {
            trace.fanned_out(started_at, delivered as usize);
        }
        self.last_fan_out = Some(ended);
        metrics.stages.observe(Stage::FanOut, ended - started);
        let latency = (Utc::now() - event.occurred_at())
            .to_std()
            .unwrap_or_default();
        metrics
            .commit_to_send_seconds
            .observe(latency.as_secs_f64());
        metrics.events_relayed.inc();
    }

    /// Starts `event`'s trace when this relay traces it (see
    /// [`crate::telemetry::EventTrace`]), with the wall-clock time its
    /// fan-out started.
    fn trace(
        &self,
        event: &EncodedEvent,
        started: Instant,
        heard_at: Option<Instant>,
    ) -> Option<(Arc<EventTrace>, SystemTime)> {
        let tracing = &self.metrics.tracing;
        if !tracing.is_on() {
            return None;
        }
        let now = SystemTime::now();
        let at = |instant: Instant| now - instant.elapsed();
        let attributes = || {
            vec![
                KeyValue::new("eventrelay.scope", self.scope_key.clone()),
                KeyValue::new("eventrelay.event_type", event.event_type().to_owned()),
                KeyValue::new("eventrelay.seq", event.seq().unwrap_or(0)),
            ]
        };
        let fan_out = at(started);
        let trace = tracing.event(event.trace_parent(), heard_at.map(at), fan_out, attributes)?;
        Some((Arc::clone(event.traced_by(trace)), fan_out))
    }

    /// Runs `work`; if it panics, restarts the hub in place: every
    /// subscriber's queue is dropped, so each stream ends cleanly and its
    /// client reconnects and replays (nothing durable is lost), and the
    /// tail, which may be half updated, is forgotten.
    pub fn supervised(&mut self, work: impl FnOnce(&mut HubCore)) {
        let failed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work(self)));
        if failed.is_err() {
            self.metrics.restarted(ActorKind::Hub);
            tracing::error!(
                scope_key = %self.scope_key,
                subscribers = self.members.len(),
                "a hub failed; restarting it: its streams end and their clients reconnect"
            );
            self.members.clear();
            self.tail.forget();
        }
    }
}

/// Locks a hub's core. A panic under the lock is caught by
/// [`HubCore::supervised`], which leaves the core consistent, so a
/// poisoned lock is taken as it is.
pub fn lock(core: &Mutex<HubCore>) -> MutexGuard<'_, HubCore> {
    core.lock().unwrap_or_else(PoisonError::into_inner)
}

/// After how many queued subscribers a fan-out starting at `now` yields
/// (see [`YIELD_AFTER`]): never when the last one ended less than
/// [`IDLE_BEFORE_YIELD`] ago.
fn yield_after(last_fan_out: Option<Instant>, now: Instant) -> u64 {
    let rested = last_fan_out.is_none_or(|ended| now.duration_since(ended) >= IDLE_BEFORE_YIELD);
    if rested { YIELD_AFTER } else { u64::MAX }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_fan_out_after_a_rest_yields() {
        let now = Instant::now() + Duration::from_secs(1);
        assert_eq!(yield_after(None, now), YIELD_AFTER);
        assert_eq!(
            yield_after(Some(now - Duration::from_millis(5)), now),
            YIELD_AFTER
        );
        assert_eq!(yield_after(Some(now - IDLE_BEFORE_YIELD), now), YIELD_AFTER);
        assert_eq!(
            yield_after(Some(now - Duration::from_micros(200)), now),
            u64::MAX
        );
        assert_eq!(yield_after(Some(now), now), u64::MAX);
    }
}
