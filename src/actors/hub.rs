//! The hub: one actor per active scope, holding the scope's subscribers and
//! its bounded tail. Each event arrives encoded once; the hub filters it per
//! subscriber with the audience predicate and queues the shared frame. A
//! subscriber whose queue is full is dropped on the spot (it reconnects and
//! replays), so one slow reader never stalls the others.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::{Actor, AsyncContext, Context, Handler, Message, MessageResult};
use chrono::Utc;
use eventrelay_wire::Subscriber;
use tokio::sync::mpsc::{self, error::TrySendError};

use super::encoded::EncodedEvent;
use super::tail::{Bound, Tail};
use super::tail_budget::{ShrinkTail, TailBudget};
use crate::latency::Stage;
use crate::metrics::{ActorKind, Handling, Metrics};
use crate::store::Snapshot;
use prometheus_client::metrics::counter::Counter;
use std::sync::atomic::AtomicU64;

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

pub struct Hub {
    scope_key: String,
    tail: Tail,
    budget: Arc<TailBudget>,
    members: HashMap<u64, Member>,
    metrics: Arc<Metrics>,
    /// The arbiter this hub runs on, for its load metrics.
    arbiter: usize,
    /// That arbiter's busy time, taken once rather than per message.
    busy: Counter<f64, AtomicU64>,
    /// When the last fan-out ended, to tell an event after a rest from
    /// one of a flood.
    last_fan_out: Option<Instant>,
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

impl Hub {
    pub fn new(
        scope_key: String,
        max_events: Bound,
        max_bytes: Bound,
        budget: Arc<TailBudget>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Hub {
            scope_key,
            tail: Tail::new(max_events, max_bytes),
            budget,
            members: HashMap::new(),
            busy: metrics.arbiter_busy(0),
            metrics,
            arbiter: 0,
            last_fan_out: None,
        }
    }

    /// Runs on hub arbiter `arbiter` (for the per-arbiter load metrics).
    pub fn on_arbiter(mut self, arbiter: usize) -> Self {
        self.arbiter = arbiter;
        self.busy = self.metrics.arbiter_busy(arbiter);
        self
    }

    /// Times one message's handling, as this kind's and this arbiter's load.
    fn handling(&self) -> Handling {
        self.metrics
            .actor(ActorKind::Hub)
            .handling()
            .on_arbiter(&self.busy)
    }

    fn fan_out(&mut self, event: &Arc<EncodedEvent>) {
        let started = Instant::now();
        event.fan_out_started.set(started);
        let yield_after = yield_after(self.last_fan_out, started);
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
        self.last_fan_out = Some(ended);
        metrics.stages.observe(Stage::FanOut, ended - started);
        let latency = (Utc::now() - event.occurred_at())
            .to_std()
            .unwrap_or_default();
        self.metrics
            .commit_to_send_seconds
            .observe(latency.as_secs_f64());
        self.metrics.events_relayed.inc();
    }
}

/// After how many queued subscribers a fan-out starting at `now` yields
/// (see [`YIELD_AFTER`]): never when the last one ended less than
/// [`IDLE_BEFORE_YIELD`] ago.
fn yield_after(last_fan_out: Option<Instant>, now: Instant) -> u64 {
    let rested = last_fan_out.is_none_or(|ended| now.duration_since(ended) >= IDLE_BEFORE_YIELD);
    if rested { YIELD_AFTER } else { u64::MAX }
}

impl Hub {
    /// Runs `work`; if it panics, restarts the hub in place: every
    /// subscriber's queue is dropped, so each stream ends cleanly and its
    /// client reconnects and replays (nothing durable is lost), and the
    /// tail, which may be half updated, is forgotten.
    fn supervised(&mut self, work: impl FnOnce(&mut Hub)) {
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

impl Actor for Hub {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let lease = self.budget.join(ctx.address().downgrade().recipient());
        self.tail.join_budget(lease);
        self.metrics.arbiter_hubs(self.arbiter).inc();
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        self.metrics.arbiter_hubs(self.arbiter).dec();
    }
}

impl Handler<ShrinkTail> for Hub {
    type Result = ();

    fn handle(&mut self, _: ShrinkTail, _: &mut Context<Self>) {
        self.tail.empty();
        self.metrics.tails_shrunk.inc();
    }
}

/// Durable events read from the outbox after `read_after`, new to this hub,
/// in seq order.
#[derive(Message)]
#[rtype(result = "()")]
pub struct PublishDurable {
    pub read_after: i64,
    pub events: Vec<Arc<EncodedEvent>>,
    /// When the listener heard them; `None` for rows read back from the
    /// outbox.
    pub heard_at: Option<Instant>,
}

impl Handler<PublishDurable> for Hub {
    type Result = ();

    fn handle(&mut self, msg: PublishDurable, _: &mut Context<Self>) {
        let _handling = self.handling();
        if let Some(heard_at) = msg.heard_at {
            self.metrics.stages.since(Stage::Relay, heard_at);
        }
        self.supervised(|hub| {
            hub.tail.publish(msg.read_after, &msg.events);
            for event in &msg.events {
                hub.fan_out(event);
            }
        });
    }
}

/// An ephemeral event: fanned out, never kept.
#[derive(Message)]
#[rtype(result = "()")]
pub struct PublishEphemeral {
    pub event: Arc<EncodedEvent>,
    /// When the listener heard it, or when this relay's publish API
    /// parsed it (see `DeliveredHere`), for the `relay` stage.
    pub heard_at: Option<Instant>,
}

impl Handler<PublishEphemeral> for Hub {
    type Result = ();

    fn handle(&mut self, msg: PublishEphemeral, _: &mut Context<Self>) {
        let _handling = self.handling();
        if let Some(heard_at) = msg.heard_at {
            self.metrics.stages.since(Stage::Relay, heard_at);
        }
        self.supervised(|hub| hub.fan_out(&msg.event));
    }
}

/// Adds a subscriber. With `replay_after`, answers the events after it from the tail
/// (already filtered for this subscriber), or `None` when the tail does not
/// reach back that far. Registration and the tail snapshot happen in one
/// step, so replay and live neither overlap nor leave a gap.
#[derive(Message)]
#[rtype(result = "Option<Vec<Arc<EncodedEvent>>>")]
pub struct Attach {
    pub session: u64,
    pub subscriber: Subscriber,
    pub queue: FrameSender,
    pub replay_after: Option<i64>,
    pub hide_committed_before: Option<Arc<Snapshot>>,
}

impl Handler<Attach> for Hub {
    type Result = MessageResult<Attach>;

    fn handle(&mut self, msg: Attach, _: &mut Context<Self>) -> Self::Result {
        let _handling = self.handling();
        let replay = msg
            .replay_after
            .and_then(|after| self.tail.recent(after))
            .map(|events| {
                events
                    .into_iter()
                    .filter(|event| event.is_permitted_for(&msg.subscriber))
                    .collect()
            });
        self.members.insert(
            msg.session,
            Member {
                subscriber: msg.subscriber,
                queue: msg.queue,
                hide_committed_before: msg.hide_committed_before,
            },
        );
        MessageResult(replay)
    }
}

#[derive(Message)]
#[rtype(result = "()")]
pub struct Detach {
    pub session: u64,
}

impl Handler<Detach> for Hub {
    type Result = ();

    fn handle(&mut self, msg: Detach, _: &mut Context<Self>) {
        let _handling = self.handling();
        self.members.remove(&msg.session);
    }
}

/// Makes the hub fail, to test its supervision.
#[cfg(feature = "fault-injection")]
#[derive(Message)]
#[rtype(result = "()")]
pub struct InjectFault;

#[cfg(feature = "fault-injection")]
impl Handler<InjectFault> for Hub {
    type Result = ();

    fn handle(&mut self, _: InjectFault, _: &mut Context<Self>) {
        let _handling = self.handling();
        self.supervised(|_| panic!("fault injected into a hub"));
    }
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
