//! The relay: turns notifications into hub deliveries.
//!
//! It owns a hub and a [`ScopeState`] for every scope with a subscriber on
//! this replica, and ignores every other scope. On a bare pointer it reads
//! the scope's outbox; after the listener reconnects it re-reads every
//! active scope, because notifications sent meanwhile are gone; on a
//! horizon mark it tells every scope how far everything has been heard.
//! What each read takes, whether it may start yet, and which rows it found
//! are new is the scope state's to decide; the relay does the reading and
//! the sending.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::{
    Actor, ActorContext, ArbiterHandle, AsyncContext, Context, Handler, Message, ResponseFuture,
};
use eventrelay_wire::{DeferredPointer, EventEnvelope, Subscriber};

use super::directory::HubDirectory;
use super::encoded::EncodedEvent;
use super::hub::{Attach, FrameSender, Hub, HubHandle, Joining, PublishDurable, PublishEphemeral};
use super::mailbox::Counted;
use super::scope::{History, ReadEnd, ReadPlan, ScopeState, SnapshotBounds};
use super::tail::Bound;
use super::tail_budget::TailBudget;
use crate::metrics::{ActorKind, Metrics};
use crate::store::{Database, Outbox, Snapshot, StoreError, StoredEvent, Window, Witness};

/// Rows per outbox read, and events per hub message.
const PAGE: i64 = 500;
/// The most one read takes, in rows and in stored bytes of `data`, before
/// it hands on what it found and the next read carries on: what any one
/// notification can cost, whatever it points at.
const READ_MAX_ROWS: usize = 4 * PAGE as usize;
const READ_MAX_BYTES: i64 = 8 << 20;
/// Ephemeral events remembered as delivered before their commit: far more
/// than are ever between a publish and its notification's return, so only
/// an event whose transaction failed (its notification never comes) is
/// forgotten, by being pushed out.
const DELIVERED_HERE: usize = 16_384;
/// Wait before retrying a failed outbox read.
const READ_RETRY: Duration = Duration::from_secs(1);
/// The newest rows read, checked after the listener reconnects: a history
/// rewound under the relay loses its newest commits first.
const WITNESSES: usize = 32;

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
    scopes: HashMap<String, ActiveScope>,
    /// The same hubs, for the publish handlers (see [`HubDirectory`]).
    directory: HubDirectory,
    next_session: u64,
    /// Ephemeral events this relay delivered before their commit, whose
    /// notification is still to come back.
    delivered_here: RecentIds,
    /// The rows read most recently (see [`WITNESSES`]).
    witnesses: VecDeque<Witness>,
    /// The whole reads a reconnect owes every scope, taken at once (so
    /// each scope holds what the listener hands it meanwhile, and no
    /// horizon mark passes what they are to find) and started once the
    /// history is known to hold (see [`HistoryChecked`]).
    owed_reads: Vec<(String, ReadPlan)>,
    /// History checks that failed in a row since the last that answered.
    failed_checks: u32,
    /// Whether rows can be heard before they are visible (the replication
    /// stream): each scope's first read may then owe a second.
    heard_before_visible: bool,
    /// Dropped with the relay once it has stopped: shutdown waits for that.
    _running: tokio::sync::mpsc::Sender<()>,
}

struct ActiveScope {
    hub: HubHandle,
    /// The sessions subscribed here: an unsubscribe from a session this
    /// scope never had (its scope was dropped by a restart) changes nothing.
    sessions: std::collections::HashSet<u64>,
    state: ScopeState,
}

impl Relay {
    pub fn new(
        db: Database,
        outbox: Outbox,
        arbiters: Vec<ArbiterHandle>,
        tails: TailSettings,
        metrics: Arc<Metrics>,
        directory: HubDirectory,
        running: tokio::sync::mpsc::Sender<()>,
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
            scopes: HashMap::new(),
            directory,
            next_session: 0,
            delivered_here: RecentIds::new(DELIVERED_HERE),
            witnesses: VecDeque::with_capacity(WITNESSES),
            owed_reads: Vec::new(),
            failed_checks: 0,
            heard_before_visible: false,
            _running: running,
        }
    }

    /// Rows reach this relay on the replication stream, where a commit can
    /// arrive before other sessions' snapshots see it (the logical wake-up
    /// mode); see [`ScopeState::new`].
    pub fn hearing_before_visible(mut self, heard_before_visible: bool) -> Self {
        self.heard_before_visible = heard_before_visible;
        self
    }

    /// The scope's state, activating it if needed, and for a new scope
    /// its first read, for the caller to start (see [`ScopeState::new`]).
    fn activate(
        &mut self,
        scope_key: &str,
        joined: &JoinPoint,
    ) -> (&mut ActiveScope, Option<ReadPlan>) {
        let active = self.scopes.len();
        match self.scopes.entry(scope_key.to_owned()) {
            Entry::Occupied(entry) => (entry.into_mut(), None),
            Entry::Vacant(entry) => {
                let arbiter = arbiter_for(&self.arbiters, scope_key);
                let hub = Hub::new(
                    scope_key.to_owned(),
                    Arc::clone(&self.tails.max_events),
                    Arc::clone(&self.tails.max_bytes),
                    Arc::clone(&self.tails.budget),
                    Arc::clone(&self.metrics),
                )
                .on_arbiter(arbiter);
                let hub = hub.start_on(&self.arbiters[arbiter]);
                self.directory.insert(scope_key, &hub);
                self.metrics.active_scopes.set(active as i64 + 1);
                let scope = entry.insert(ActiveScope {
                    hub,
                    sessions: std::collections::HashSet::new(),
                    state: ScopeState::new(
                        History::new(Arc::clone(&joined.snapshot), joined.scope_newest),
                        self.heard_before_visible,
                    ),
                });
                let first_read = scope.state.take_pending();
                (scope, first_read)
            }
        }
    }

    /// Runs `work`; if it panics, restarts the relay in place: every scope
    /// is dropped, so its hub stops and its streams end cleanly; their
    /// clients reconnect and replay from their `Last-Event-ID`, so nothing
    /// durable is lost.
    fn supervised(&mut self, work: impl FnOnce(&mut Relay)) {
        let failed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work(self)));
        if failed.is_err() {
            self.metrics.restarted(ActorKind::Relay);
            tracing::error!(
                scopes = self.scopes.len(),
                "the relay failed; restarting it: every stream ends and its client reconnects"
            );
            self.drop_every_scope();
        }
    }

    /// Drops every scope: its hub stops and its streams end cleanly, and
    /// their clients resume from their `Last-Event-ID`.
    fn drop_every_scope(&mut self) {
        self.owed_reads.clear();
        self.scopes.clear();
        self.directory.clear();
        self.metrics.active_scopes.set(0);
    }

    /// After a reconnect: every scope owes a whole read, which starts once
    /// the database is known to still hold what this relay read (see
    /// [`HistoryChecked`]).
    fn reconnected(&mut self, ctx: &mut Context<Self>) {
        for (scope_key, scope) in &mut self.scopes {
            if let Some(plan) = scope.state.whole_read() {
                self.owed_reads.push((scope_key.clone(), plan));
            }
        }
        self.check_history(ctx);
    }

    fn check_history(&mut self, ctx: &mut Context<Self>) {
        if self.witnesses.is_empty() {
            self.start_owed_reads(ctx);
            return;
        }
        let witnesses: Vec<Witness> = self.witnesses.iter().copied().collect();
        let (db, outbox) = (self.db.clone(), self.outbox.clone());
        let relay = Counted::new(ctx.address(), self.metrics.actor(ActorKind::Relay).clone());
        actix::spawn(async move {
            let result = async {
                let client = db.get().await?;
                outbox.still_holds(&client, &witnesses).await
            }
            .await;
            relay.do_send(HistoryChecked { result });
        });
    }

    fn start_owed_reads(&mut self, ctx: &mut Context<Self>) {
        // A scope dropped meanwhile took its owed read with it.
        for (scope_key, plan) in std::mem::take(&mut self.owed_reads) {
            self.spawn_read(&scope_key, plan, ctx);
        }
    }

    /// A scope's outbox read finished: hand its new events to the hub.
    fn read_done(&mut self, msg: ReadDone, ctx: &mut Context<Self>) {
        let Some(scope) = self.scopes.get_mut(&msg.scope_key) else {
            return;
        };
        let failed = msg.result.is_err();
        let batches = match msg.result {
            Ok(read) => {
                // The last row of a read is as new as any it found.
                let last = read.rows.len().saturating_sub(1);
                remember_witnesses(&mut self.witnesses, &read.rows[last..]);
                scope
                    .state
                    .read_done(msg.plan, read.rows, read.end, PAGE as usize)
            }
            Err(error) => {
                tracing::warn!(scope_key = %msg.scope_key, %error, "outbox read failed; retrying");
                scope.state.read_failed(msg.plan, PAGE as usize)
            }
        };
        for batch in batches {
            scope.hub.publish_durable(PublishDurable {
                read_after: batch.read_after,
                events: batch.events,
                heard_at: None,
            });
        }
        if failed {
            let scope_key = msg.scope_key.clone();
            ctx.run_later(READ_RETRY, move |relay, ctx| {
                let retry = relay
                    .scopes
                    .get_mut(&scope_key)
                    .and_then(|scope| scope.state.take_pending());
                if let Some(plan) = retry {
                    relay.spawn_read(&scope_key, plan, ctx);
                }
            });
            return;
        }
        if let Some(next) = self
            .scopes
            .get_mut(&msg.scope_key)
            .and_then(|scope| scope.state.take_pending())
        {
            self.spawn_read(&msg.scope_key, next, ctx);
        }
    }

    /// Asks `scope_key` for a whole read, and starts it unless one runs.
    fn schedule_whole_read(&mut self, scope_key: &str, ctx: &mut Context<Self>) {
        let plan = self
            .scopes
            .get_mut(scope_key)
            .and_then(|scope| scope.state.whole_read());
        if let Some(plan) = plan {
            self.spawn_read(scope_key, plan, ctx);
        }
    }

    fn spawn_read(&mut self, scope_key: &str, plan: ReadPlan, ctx: &mut Context<Self>) {
        let db = self.db.clone();
        let outbox = self.outbox.clone();
        let relay = Counted::new(ctx.address(), self.metrics.actor(ActorKind::Relay).clone());
        let scope_key = scope_key.to_owned();
        let metrics = Arc::clone(&self.metrics);
        actix::spawn(async move {
            let started = std::time::Instant::now();
            let result = read_plan(&db, &outbox, &scope_key, plan).await;
            metrics
                .outbox_read_seconds
                .observe(started.elapsed().as_secs_f64());
            if let Ok(read) = &result {
                metrics.outbox_read_rows.observe(read.rows.len() as f64);
            }
            relay.do_send(ReadDone {
                scope_key,
                plan,
                result,
            });
        });
    }
}

/// Keeps the newest of `rows` as witnesses of the history, at most
/// [`WITNESSES`] in all.
fn remember_witnesses(witnesses: &mut VecDeque<Witness>, rows: &[StoredEvent]) {
    for row in rows.iter().rev().take(WITNESSES).rev() {
        let Some(seq) = row.envelope.seq else {
            continue;
        };
        if witnesses.len() == WITNESSES {
            witnesses.pop_front();
        }
        witnesses.push_back(Witness {
            seq,
            id: row.envelope.id,
            txid: row.txid,
        });
    }
}

/// A set of event ids that forgets its oldest past a capacity.
struct RecentIds {
    ids: HashSet<uuid::Uuid>,
    order: VecDeque<uuid::Uuid>,
    capacity: usize,
}

impl RecentIds {
    fn new(capacity: usize) -> Self {
        RecentIds {
            ids: HashSet::new(),
            order: VecDeque::new(),
            capacity,
        }
    }

    fn insert(&mut self, id: uuid::Uuid) {
        if !self.ids.insert(id) {
            return;
        }
        self.order.push_back(id);
        while self.order.len() > self.capacity {
            if let Some(oldest) = self.order.pop_front() {
                self.ids.remove(&oldest);
            }
        }
    }

    /// Whether `id` was there; it is not any more. (Its place in the
    /// order goes when it reaches the front.)
    fn remove(&mut self, id: &uuid::Uuid) -> bool {
        self.ids.remove(id)
    }
}

/// Where a subscriber joined: the snapshot taken then, and the scope's
/// newest seq in it.
#[derive(Debug, Clone)]
pub struct JoinPoint {
    pub snapshot: Arc<Snapshot>,
    pub scope_newest: i64,
}

/// The hub arbiter for a scope, by index: always the same one, spreading
/// scopes evenly.
fn arbiter_for(arbiters: &[ArbiterHandle], scope_key: &str) -> usize {
    let mut hasher = DefaultHasher::new();
    scope_key.hash(&mut hasher);
    hasher.finish() as usize % arbiters.len()
}

/// What one read found, and how it ended.
struct ReadRows {
    rows: Vec<StoredEvent>,
    end: ReadEnd,
}

/// Reads what `plan` takes, page by page, up to [`READ_MAX_ROWS`] rows or
/// [`READ_MAX_BYTES`].
async fn read_plan(
    db: &Database,
    outbox: &Outbox,
    scope_key: &str,
    plan: ReadPlan,
) -> Result<ReadRows, StoreError> {
    let client = db.get().await?;
    let mut events = Vec::new();
    let mut bytes = 0;
    let mut first = None;
    let mut window = Window {
        after: plan.after,
        since_txid: Some(plan.since_txid),
        through: None,
    };
    loop {
        let page = outbox.read_window(&client, scope_key, window, PAGE).await?;
        let first = *first.get_or_insert(SnapshotBounds {
            xmin: page.snapshot_xmin,
            xmax: page.snapshot_xmax,
        });
        let done = (page.returned as i64) < PAGE;
        if let Some(last) = page.last_seq {
            window.after = last;
        }
        events.extend(page.rows);
        bytes += page.data_bytes;
        if done {
            return Ok(ReadRows {
                rows: events,
                end: ReadEnd::Whole { first },
            });
        }
        if events.len() >= READ_MAX_ROWS || bytes >= READ_MAX_BYTES {
            return Ok(ReadRows {
                rows: events,
                end: ReadEnd::Stopped {
                    after: window.after,
                    first,
                },
            });
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
    /// The rows themselves, when they travelled with the pointer: handed on
    /// as decoded rows are, with no read of the outbox. They are decoded
    /// here, once the scope is known to have subscribers, not by the
    /// listener: a relay drops the rows of every other scope unread.
    pub carried: Option<DeferredPointer>,
    /// When the listener heard it, for the latency stages.
    pub heard_at: Instant,
}

impl Handler<Pointer> for Relay {
    type Result = ();

    fn handle(&mut self, msg: Pointer, ctx: &mut Context<Self>) {
        let _handling = self.metrics.actor(ActorKind::Relay).handling();
        let Some(scope) = self.scopes.get(&msg.scope_key) else {
            return;
        };
        match msg.carried.map(|pointer| pointer.decode_rows()) {
            Some(Ok(rows)) => {
                let txid = rows.txid;
                let stored: Vec<StoredEvent> = rows
                    .events
                    .into_iter()
                    .map(|envelope| StoredEvent { envelope, txid })
                    .collect();
                if let Some(first) = stored.first() {
                    self.metrics.stages.heard(first.envelope.id, msg.heard_at);
                }
                self.supervised(|relay| relay.decoded(stored, msg.heard_at));
            }
            unread => {
                if let Some(Err(reason)) = unread {
                    count_unreadable_rows(&self.metrics, &msg.scope_key, msg.seq, &reason);
                }
                if scope.state.pointer_needs_read(msg.seq) {
                    self.schedule_whole_read(&msg.scope_key, ctx);
                } else {
                    self.metrics.pointers_ignored.inc();
                }
            }
        }
    }
}

/// Rows that travelled with a sound pointer but do not decode: counted
/// and logged as malformed; the caller reads them back from the outbox.
pub(super) fn count_unreadable_rows(metrics: &Metrics, scope_key: &str, seq: i64, reason: &str) {
    metrics.notifications_malformed.inc();
    tracing::warn!(%scope_key, seq, %reason,
        "rows carried by a pointer are unreadable; reading them from the outbox");
}

/// Committed outbox rows of one transaction, decoded from the replication
/// stream (logical wake-up mode): the whole events, so nothing is read back.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Decoded {
    pub rows: Vec<StoredEvent>,
    /// When the listener read the transaction's commit.
    pub heard_at: Instant,
}

impl Handler<Decoded> for Relay {
    type Result = ();

    fn handle(&mut self, msg: Decoded, _: &mut Context<Self>) {
        let _handling = self.metrics.actor(ActorKind::Relay).handling();
        if let Some(first) = msg.rows.first() {
            self.metrics.stages.heard(first.envelope.id, msg.heard_at);
        }
        self.supervised(|relay| relay.decoded(msg.rows, msg.heard_at));
    }
}

impl Relay {
    /// Hands each active scope its new rows. A scope whose read is running
    /// keeps them and hands them on when the read ends.
    fn decoded(&mut self, rows: Vec<StoredEvent>, heard_at: Instant) {
        remember_witnesses(&mut self.witnesses, &rows);
        let mut by_scope: HashMap<String, Vec<StoredEvent>> = HashMap::new();
        for row in rows {
            if self.scopes.contains_key(&row.envelope.scope_key) {
                by_scope
                    .entry(row.envelope.scope_key.clone())
                    .or_default()
                    .push(row);
            }
        }
        for (scope_key, rows) in by_scope {
            let Some(scope) = self.scopes.get_mut(&scope_key) else {
                continue;
            };
            for batch in scope.state.decoded(rows, PAGE as usize) {
                scope.hub.publish_durable(PublishDurable {
                    read_after: batch.read_after,
                    events: batch.events,
                    heard_at: Some(heard_at),
                });
            }
        }
    }
}

/// An ephemeral event from the channel.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Ephemeral {
    pub envelope: EventEnvelope,
    /// When the listener heard it, for the latency stages.
    pub heard_at: Instant,
}

impl Handler<Ephemeral> for Relay {
    type Result = ();

    fn handle(&mut self, msg: Ephemeral, _: &mut Context<Self>) {
        let _handling = self.metrics.actor(ActorKind::Relay).handling();
        self.metrics.stages.heard(msg.envelope.id, msg.heard_at);
        if self.delivered_here.remove(&msg.envelope.id) {
            // Published here and delivered before its commit.
            return;
        }
        if let Some(scope) = self.scopes.get(&msg.envelope.scope_key) {
            scope.hub.publish_ephemeral(PublishEphemeral {
                event: Arc::new(EncodedEvent::new(msg.envelope)),
                heard_at: Some(msg.heard_at),
            });
        }
    }
}

/// Ephemeral events published through this relay's own HTTP API, which the
/// publish handler has handed straight to their hubs before their
/// transaction commits. Their notification (or logical message) comes back
/// to this relay after the commit and is then skipped: this message is sent
/// before the transaction starts, so it is always handled first.
#[derive(Message)]
#[rtype(result = "()")]
pub struct DeliveredHere {
    pub ids: Vec<uuid::Uuid>,
}

impl Handler<DeliveredHere> for Relay {
    type Result = ();

    fn handle(&mut self, msg: DeliveredHere, _: &mut Context<Self>) {
        let _handling = self.metrics.actor(ActorKind::Relay).handling();
        for id in msg.ids {
            self.delivered_here.insert(id);
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
        let _handling = self.metrics.actor(ActorKind::Relay).handling();
        self.reconnected(ctx);
    }
}

/// Whether the database, once the listener reconnected, still holds the
/// rows this relay read most recently. When it does not, its history was
/// rewound (a standby promoted without the last commits, a restore): seqs
/// and transaction ids this relay sent may now name other events, and its
/// scopes' positions mean nothing there. Every scope is dropped, so every
/// stream ends; each client resumes with its cursor, which the resume
/// checks against the new history and answers with a resync where it no
/// longer holds (see `docs/src/reliability.md`).
#[derive(Message)]
#[rtype(result = "()")]
struct HistoryChecked {
    result: Result<bool, StoreError>,
}

impl Handler<HistoryChecked> for Relay {
    type Result = ();

    fn handle(&mut self, msg: HistoryChecked, ctx: &mut Context<Self>) {
        let _handling = self.metrics.actor(ActorKind::Relay).handling();
        if msg.result.is_ok() {
            self.failed_checks = 0;
        }
        match msg.result {
            Ok(true) => self.start_owed_reads(ctx),
            Ok(false) => {
                self.metrics.history_rewinds.inc();
                tracing::error!(
                    scopes = self.scopes.len(),
                    "the database no longer holds events this relay read: its history was \
                     rewound (a failover that lost commits, or a restore); every stream ends \
                     and resumes against the new history"
                );
                self.witnesses.clear();
                self.drop_every_scope();
            }
            Err(error) => {
                // Soon at first: a pool that kept connections from before
                // the reconnect drops one dead connection per failed
                // checkout, and the reads wait on this check.
                let wait = (Duration::from_millis(100) * 2u32.pow(self.failed_checks.min(4)))
                    .min(READ_RETRY);
                self.failed_checks += 1;
                tracing::warn!(%error, ?wait, "checking the history after a reconnect failed; retrying");
                ctx.run_later(wait, |relay, ctx| relay.check_history(ctx));
            }
        }
    }
}

/// A horizon mark heard on the channel (or the replication stream): every
/// transaction below `xmin` had finished before it was sent.
#[derive(Message)]
#[rtype(result = "()")]
pub struct HorizonHeard {
    pub xmin: u64,
}

impl Handler<HorizonHeard> for Relay {
    type Result = ();

    fn handle(&mut self, msg: HorizonHeard, ctx: &mut Context<Self>) {
        let _handling = self.metrics.actor(ActorKind::Relay).handling();
        let mut owed = Vec::new();
        for (scope_key, scope) in &mut self.scopes {
            if let Some(plan) = scope.state.horizon_heard(msg.xmin) {
                owed.push((scope_key.clone(), plan));
            }
        }
        for (scope_key, plan) in owed {
            self.spawn_read(&scope_key, plan, ctx);
        }
    }
}

#[derive(Message)]
#[rtype(result = "()")]
struct ReadDone {
    scope_key: String,
    plan: ReadPlan,
    result: Result<ReadRows, StoreError>,
}

impl Handler<ReadDone> for Relay {
    type Result = ();

    fn handle(&mut self, msg: ReadDone, ctx: &mut Context<Self>) {
        let _handling = self.metrics.actor(ActorKind::Relay).handling();
        self.supervised(|relay| relay.read_done(msg, ctx));
    }
}

/// What a new session gets back.
pub struct Attached {
    pub session: u64,
    /// Replay from the hub's tail, when it covered the request.
    pub from_tail: Option<Vec<Arc<EncodedEvent>>>,
}

/// Why a session was not subscribed.
#[derive(Debug, thiserror::Error)]
pub enum SubscribeError {
    /// The scope's hub is gone: the relay is stopping.
    #[error("the relay is stopping")]
    Stopping,
}

/// Subscribes a session to its scope, activating the scope if needed.
#[derive(Message)]
#[rtype(result = "Result<Attached, SubscribeError>")]
pub struct Subscribe {
    pub subscriber: Subscriber,
    pub queue: FrameSender,
    pub replay_after: Option<i64>,
    /// Where the subscriber joined. A subscriber that asked for no replay
    /// is never sent an event its snapshot already saw committed.
    pub joined: JoinPoint,
    /// In a scope with presence: the view its first presence frame is
    /// taken from.
    pub presence: Option<Arc<crate::presence::PresenceView>>,
}

impl Handler<Subscribe> for Relay {
    type Result = ResponseFuture<Result<Attached, SubscribeError>>;

    fn handle(&mut self, msg: Subscribe, ctx: &mut Context<Self>) -> Self::Result {
        let _handling = self.metrics.actor(ActorKind::Relay).handling();
        self.next_session += 1;
        let session = self.next_session;
        let relay = Counted::new(ctx.address(), self.metrics.actor(ActorKind::Relay).clone());
        let scope_key = msg.subscriber.scope_key.clone();
        let (scope, first_read) = self.activate(&msg.subscriber.scope_key, &msg.joined);
        scope.sessions.insert(session);
        let hide_committed_before = msg
            .replay_after
            .is_none()
            .then(|| Arc::clone(&msg.joined.snapshot));
        let attach = scope.hub.attach(Attach(Joining {
            session,
            subscriber: msg.subscriber,
            queue: msg.queue,
            replay_after: msg.replay_after,
            hide_committed_before,
            presence: msg.presence,
        }));
        // After the attach is on its way, so the hub has the new
        // subscriber before anything the read finds.
        if let Some(plan) = first_read {
            self.spawn_read(&scope_key, plan, ctx);
        }
        Box::pin(async move {
            let refused = match attach.await {
                Ok(from_tail) => return Ok(Attached { session, from_tail }),
                Err(_) => SubscribeError::Stopping,
            };
            // Counted above, but no session will ever unsubscribe: undo
            // it, or the scope stays active for ever.
            relay.do_send(Unsubscribe { scope_key, session });
            Err(refused)
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
        let _handling = self.metrics.actor(ActorKind::Relay).handling();
        let Some(scope) = self.scopes.get_mut(&msg.scope_key) else {
            return;
        };
        if !scope.sessions.remove(&msg.session) {
            return;
        }
        scope.hub.detach(msg.session);
        if scope.sessions.is_empty() {
            // Dropping the last address stops the hub once its mailbox drains.
            self.scopes.remove(&msg.scope_key);
            self.owed_reads
                .retain(|(scope_key, _)| *scope_key != msg.scope_key);
            self.directory.remove(&msg.scope_key);
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

/// Makes the relay, or one scope's hub, fail, to test their supervision.
#[cfg(feature = "fault-injection")]
#[derive(Message)]
#[rtype(result = "()")]
pub enum InjectFault {
    Relay,
    Hub(String),
}

#[cfg(feature = "fault-injection")]
impl Handler<InjectFault> for Relay {
    type Result = ();

    fn handle(&mut self, msg: InjectFault, _: &mut Context<Self>) {
        let _handling = self.metrics.actor(ActorKind::Relay).handling();
        match msg {
            InjectFault::Relay => self.supervised(|_| panic!("fault injected into the relay")),
            InjectFault::Hub(scope_key) => {
                if let Some(scope) = self.scopes.get(&scope_key) {
                    scope.hub.inject_fault();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recent_ids_forget_the_oldest_past_their_capacity() {
        let ids: Vec<uuid::Uuid> = (0..4).map(|_| uuid::Uuid::new_v4()).collect();
        let mut recent = RecentIds::new(2);
        for id in &ids[..3] {
            recent.insert(*id);
        }
        assert!(!recent.remove(&ids[0]), "pushed out by the third");
        assert!(recent.remove(&ids[1]));
        assert!(!recent.remove(&ids[1]), "removed once");
        assert!(recent.remove(&ids[2]));
        assert!(!recent.remove(&ids[3]), "never inserted");
    }
}
