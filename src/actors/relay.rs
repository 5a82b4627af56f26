//! The relay: turns notifications into hub deliveries.
//!
//! It keeps a watermark (the highest seq handed to the hub) for every scope
//! with a subscriber on this replica, and ignores every other scope. On a
//! pointer it reads the scope's outbox from `min(watermark, seq - 1)`, so an
//! event that committed after a higher seq was delivered is still found, and
//! drops what it already delivered. After the listener reconnects it re-reads
//! every active scope, because notifications sent meanwhile are gone. Reads
//! for one scope never overlap: a pointer that arrives mid-read widens the
//! next read instead.
//!
//! Reading below the watermark also finds history: events that committed
//! before the scope's first subscriber joined. The scope remembers the
//! snapshot taken when it was activated, and an event is passed on only if
//! its seq is above the newest seq that snapshot saw, or its transaction was
//! not yet visible in it (a late commit). So no read, however far back it
//! starts, hands a subscriber an event from before it subscribed.

use std::collections::{BTreeSet, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use actix::{
    Actor, ActorContext, Addr, ArbiterHandle, AsyncContext, Context, Handler, Message,
    ResponseFuture,
};
use eventrelay_wire::{EventEnvelope, Subscriber};

use super::encoded::EncodedEvent;
use super::hub::{Attach, Detach, FrameSender, Hub, PublishDurable, PublishEphemeral};
use super::tail::Bound;
use super::tail_budget::TailBudget;
use crate::metrics::Metrics;
use crate::store::{Database, Outbox, Snapshot, StoredEvent};

/// Rows per outbox read.
const PAGE: i64 = 500;
/// Delivered seqs remembered per scope for de-duplication.
const DELIVERED_MEMORY: usize = 4096;
/// How far below the watermark a post-reconnect read starts, for events that
/// committed late while no notification could arrive.
const RECONNECT_LOOKBACK: i64 = 1000;
/// Wait before retrying a failed outbox read.
const READ_RETRY: Duration = Duration::from_secs(1);

/// The bounds every scope's tail is created with.
pub struct TailSettings {
    /// Events per tail, read on every publish.
    pub max_events: Bound,
    /// Encoded bytes per tail, read on every publish.
    pub max_bytes: Bound,
    /// The budget all tails share.
    pub budget: Arc<TailBudget>,
}

pub struct Relay {
    db: Database,
    outbox: Outbox,
    arbiters: Vec<ArbiterHandle>,
    tails: TailSettings,
    metrics: Arc<Metrics>,
    /// Woken on every committed durable event: it may have deliveries.
    webhook_wake: Arc<tokio::sync::Notify>,
    scopes: HashMap<String, ScopeState>,
    next_session: u64,
}

struct ScopeState {
    hub: Addr<Hub>,
    subscribers: usize,
    /// What had committed when the scope was activated: never delivered.
    history: History,
    watermark: Option<i64>,
    reading: bool,
    /// Lowest start of a read requested while one was running.
    pending_from: Option<i64>,
    delivered: BTreeSet<i64>,
}

impl Relay {
    pub fn new(
        db: Database,
        outbox: Outbox,
        arbiters: Vec<ArbiterHandle>,
        tails: TailSettings,
        metrics: Arc<Metrics>,
        webhook_wake: Arc<tokio::sync::Notify>,
    ) -> Self {
        assert!(
            !arbiters.is_empty(),
            "the relay needs at least one hub arbiter"
        );
        Relay {
            db,
            outbox,
            arbiters,
            tails,
            metrics,
            webhook_wake,
            scopes: HashMap::new(),
            next_session: 0,
        }
    }

    fn arbiter_for(&self, scope_key: &str) -> &ArbiterHandle {
        let mut hasher = DefaultHasher::new();
        scope_key.hash(&mut hasher);
        &self.arbiters[hasher.finish() as usize % self.arbiters.len()]
    }

    fn activate(&mut self, scope_key: &str, joined: &JoinPoint) -> &mut ScopeState {
        if !self.scopes.contains_key(scope_key) {
            let hub = Hub::new(
                scope_key.to_owned(),
                Arc::clone(&self.tails.max_events),
                Arc::clone(&self.tails.max_bytes),
                Arc::clone(&self.tails.budget),
                Arc::clone(&self.metrics),
            );
            let hub = Hub::start_in_arbiter(self.arbiter_for(scope_key), |_| hub);
            self.scopes.insert(
                scope_key.to_owned(),
                ScopeState {
                    hub,
                    subscribers: 0,
                    history: History {
                        snapshot: Arc::clone(&joined.snapshot),
                        newest: joined.scope_newest,
                    },
                    // A listener reconnect re-reads from here.
                    watermark: Some(joined.scope_newest),
                    reading: false,
                    pending_from: None,
                    delivered: BTreeSet::new(),
                },
            );
            self.metrics.active_scopes.set(self.scopes.len() as i64);
        }
        self.scopes.get_mut(scope_key).expect("inserted above")
    }

    fn schedule_read(&mut self, scope_key: &str, from: i64, ctx: &mut Context<Self>) {
        let Some(state) = self.scopes.get_mut(scope_key) else {
            return;
        };
        if state.reading {
            state.pending_from = Some(state.pending_from.map_or(from, |p| p.min(from)));
            return;
        }
        state.reading = true;
        let db = self.db.clone();
        let outbox = self.outbox.clone();
        let relay = ctx.address();
        let scope_key = scope_key.to_owned();
        actix::spawn(async move {
            let result = read_all_after(&db, &outbox, &scope_key, from).await;
            relay.do_send(ReadDone {
                scope_key,
                from,
                result,
            });
        });
    }
}

/// Where a subscriber joined: the snapshot taken then, and the scope's
/// newest seq in it.
#[derive(Debug, Clone)]
pub struct JoinPoint {
    pub snapshot: Arc<Snapshot>,
    pub scope_newest: i64,
}

/// The events a scope had when it was activated.
struct History {
    snapshot: Arc<Snapshot>,
    newest: i64,
}

impl History {
    /// True for an event that had committed before activation. Everything
    /// above `newest` is new; below it, only a transaction that was still
    /// running (a late commit) is.
    fn contains(&self, seq: i64, txid: Option<u64>) -> bool {
        seq <= self.newest && self.snapshot.is_visible(txid)
    }
}

async fn read_all_after(
    db: &Database,
    outbox: &Outbox,
    scope_key: &str,
    from: i64,
) -> Result<Vec<StoredEvent>, String> {
    let client = db.get().await.map_err(|e| e.to_string())?;
    let mut events = Vec::new();
    let mut cursor = from;
    loop {
        let page = outbox
            .read_rows(&*client, scope_key, cursor, PAGE)
            .await
            .map_err(|e| e.to_string())?;
        let done = (page.len() as i64) < PAGE;
        if let Some(last) = page.last().and_then(|e| e.envelope.seq) {
            cursor = last;
        }
        events.extend(page);
        if done {
            return Ok(events);
        }
    }
}

impl Actor for Relay {
    type Context = Context<Self>;
}

/// A durable event committed at `seq` in `scope_key`.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Pointer {
    pub scope_key: String,
    pub seq: i64,
}

impl Handler<Pointer> for Relay {
    type Result = ();

    fn handle(&mut self, msg: Pointer, ctx: &mut Context<Self>) {
        self.webhook_wake.notify_waiters();
        let Some(state) = self.scopes.get(&msg.scope_key) else {
            return;
        };
        let before = msg.seq - 1;
        let from = state.watermark.map_or(before, |w| w.min(before));
        self.schedule_read(&msg.scope_key, from, ctx);
    }
}

/// An ephemeral event from the channel.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Ephemeral(pub EventEnvelope);

impl Handler<Ephemeral> for Relay {
    type Result = ();

    fn handle(&mut self, msg: Ephemeral, _: &mut Context<Self>) {
        if let Some(state) = self.scopes.get(&msg.0.scope_key) {
            state
                .hub
                .do_send(PublishEphemeral(Arc::new(EncodedEvent::new(msg.0))));
        }
    }
}

/// The listener (re)connected: notifications may have been missed.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ListenerConnected;

impl Handler<ListenerConnected> for Relay {
    type Result = ();

    fn handle(&mut self, _: ListenerConnected, ctx: &mut Context<Self>) {
        let reads: Vec<(String, i64)> = self
            .scopes
            .iter()
            .filter_map(|(scope, state)| {
                state
                    .watermark
                    .map(|w| (scope.clone(), (w - RECONNECT_LOOKBACK).max(0)))
            })
            .collect();
        for (scope, from) in reads {
            self.schedule_read(&scope, from, ctx);
        }
    }
}

#[derive(Message)]
#[rtype(result = "()")]
struct ReadDone {
    scope_key: String,
    from: i64,
    result: Result<Vec<StoredEvent>, String>,
}

impl Handler<ReadDone> for Relay {
    type Result = ();

    fn handle(&mut self, msg: ReadDone, ctx: &mut Context<Self>) {
        let Some(state) = self.scopes.get_mut(&msg.scope_key) else {
            return;
        };
        state.reading = false;
        match msg.result {
            Ok(rows) => {
                let mut fresh = Vec::new();
                for StoredEvent { envelope, txid } in rows {
                    let Some(seq) = envelope.seq else { continue };
                    if state.history.contains(seq, txid) {
                        continue;
                    }
                    if state.delivered.insert(seq) {
                        state.watermark = Some(state.watermark.map_or(seq, |w| w.max(seq)));
                        fresh.push(Arc::new(EncodedEvent::written_by(envelope, txid)));
                    }
                }
                while state.delivered.len() > DELIVERED_MEMORY {
                    state.delivered.pop_first();
                }
                // One message per page keeps each burst below a session's
                // queue capacity; each page follows on from the previous.
                // History was left out, and all of it is at or below
                // `newest`, so the tail may claim to cover only above that.
                let mut read_after = msg.from.max(state.history.newest);
                for page in fresh.chunks(PAGE as usize) {
                    state.hub.do_send(PublishDurable {
                        read_after,
                        events: page.to_vec(),
                    });
                    read_after = page.last().and_then(|e| e.seq()).unwrap_or(read_after);
                }
            }
            Err(error) => {
                tracing::warn!(scope_key = %msg.scope_key, %error, "outbox read failed; retrying");
                let scope_key = msg.scope_key.clone();
                let from = msg.from;
                ctx.run_later(READ_RETRY, move |relay, ctx| {
                    relay.schedule_read(&scope_key, from, ctx)
                });
            }
        }
        if let Some(next) = self
            .scopes
            .get_mut(&msg.scope_key)
            .and_then(|s| s.pending_from.take())
        {
            self.schedule_read(&msg.scope_key, next, ctx);
        }
    }
}

/// What a new session gets back.
pub struct Attached {
    pub session: u64,
    /// Replay from the hub's tail, when it covered the request.
    pub from_tail: Option<Vec<Arc<EncodedEvent>>>,
}

/// Subscribes a session to its scope, activating the scope if needed.
#[derive(Message)]
#[rtype(result = "Result<Attached, actix::MailboxError>")]
pub struct Subscribe {
    pub subscriber: Subscriber,
    pub queue: FrameSender,
    pub replay_after: Option<i64>,
    /// Where the subscriber joined. A subscriber that asked for no replay
    /// is never sent an event its snapshot already saw committed.
    pub joined: JoinPoint,
}

impl Handler<Subscribe> for Relay {
    type Result = ResponseFuture<Result<Attached, actix::MailboxError>>;

    fn handle(&mut self, msg: Subscribe, ctx: &mut Context<Self>) -> Self::Result {
        self.next_session += 1;
        let session = self.next_session;
        let relay = ctx.address();
        let scope_key = msg.subscriber.scope_key.clone();
        let state = self.activate(&msg.subscriber.scope_key, &msg.joined);
        state.subscribers += 1;
        let hide_committed_before = msg
            .replay_after
            .is_none()
            .then(|| Arc::clone(&msg.joined.snapshot));
        let attach = state.hub.send(Attach {
            session,
            subscriber: msg.subscriber,
            queue: msg.queue,
            replay_after: msg.replay_after,
            hide_committed_before,
        });
        Box::pin(async move {
            match attach.await {
                Ok(from_tail) => Ok(Attached { session, from_tail }),
                Err(error) => {
                    // Counted above, but no session will ever unsubscribe:
                    // undo it, or the scope stays active for ever.
                    relay.do_send(Unsubscribe { scope_key, session });
                    Err(error)
                }
            }
        })
    }
}

/// A session ended.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Unsubscribe {
    pub scope_key: String,
    pub session: u64,
}

impl Handler<Unsubscribe> for Relay {
    type Result = ();

    fn handle(&mut self, msg: Unsubscribe, _: &mut Context<Self>) {
        let Some(state) = self.scopes.get_mut(&msg.scope_key) else {
            return;
        };
        state.hub.do_send(Detach {
            session: msg.session,
        });
        state.subscribers = state.subscribers.saturating_sub(1);
        if state.subscribers == 0 {
            // Dropping the last address stops the hub once its mailbox drains.
            self.scopes.remove(&msg.scope_key);
            self.metrics.active_scopes.set(self.scopes.len() as i64);
        }
    }
}

/// Stops the relay (used at shutdown).
#[derive(Message)]
#[rtype(result = "()")]
pub struct StopRelay;

impl Handler<StopRelay> for Relay {
    type Result = ();

    fn handle(&mut self, _: StopRelay, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn history_is_what_had_committed_at_activation() {
        // Seqs 1..=5 existed; the transaction 103 that wrote seq 3 was
        // still running.
        let history = History {
            snapshot: Arc::new(Snapshot::parse("103:106:103").unwrap()),
            newest: 5,
        };
        assert!(history.contains(1, Some(100)));
        assert!(history.contains(4, Some(104)));
        assert!(history.contains(2, None), "rows from before txids");
        assert!(!history.contains(3, Some(103)), "a late commit is new");
        assert!(!history.contains(6, Some(99)), "above newest is always new");
        assert!(!history.contains(4, Some(106)), "started after activation");
    }
}
