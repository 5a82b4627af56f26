//! One SSE connection's stream: `retry:`, the replay, the `ready` frame, then
//! live frames with heartbeats, until the age cap, the credentials' expiry,
//! an `until` event, or a full queue ends it.
//!
//! The session is the response body itself rather than a separate actor: it
//! already is the one task per connection, so it owns the bounded queue the
//! hub fills, the timers and the de-duplication, with no second hop.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use actix::Addr;
use bytes::{Bytes, BytesMut};
use eventrelay_wire::{ResumeCursor, Subscriber, sse};
use tokio::sync::{mpsc, oneshot};
use tokio::time::{Instant, Sleep};

use super::peer::{PEEK_EVERY, PeerSocket};
use super::registry::{End, Ticket};
use super::scopes::SeveralScopes;
use super::shared_reads::{SharedReads, Stamp};
use crate::actors::EncodedEvent;
use crate::actors::mailbox::Counted;
use crate::actors::relay::{Relay, Unsubscribe};
use crate::latency::Stage;
use crate::metrics::{Metrics, SourceLabel};
use crate::store::{StoreError, Window};

/// Replayed seqs remembered to drop their live duplicates.
pub(super) const SENT_MEMORY: usize = 16_384;
/// Frames gathered into one write when several are queued.
const MAX_FRAMES_PER_CHUNK: usize = 64;
/// One live write in this many records the queue's fill ratio. The
/// histogram takes a lock shared by every connection, and a write per
/// subscriber per event is the hottest path there is; a uniform sample
/// keeps the distribution (and the first write of each stream is in it).
const FILL_SAMPLE_EVERY: u32 = 32;

/// How much of a replay may wait for its reader in the kernel before the
/// next chunk is written. A replay is read far faster than a slow reader
/// takes it; unpaced, megabytes would queue in the socket, and whatever is
/// written after them (the `reauth` warning above all) would reach the
/// reader only once it had read through them, after its token expired.
/// Held to this, a warning written on time is this far behind at most
/// (besides the HTTP layer's buffer and the reader's own).
const REPLAY_AHEAD_BYTES: usize = 128 * 1024;
/// How often a replay held back looks whether its reader caught up.
const READER_CHECK_EVERY: Duration = Duration::from_millis(20);

/// Why a stream was cut short rather than ended.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    #[error("event stream unavailable: the replay could not be read: {0}")]
    ReplayFailed(#[source] Arc<StoreError>),
}

/// Where the replay comes from.
pub enum Replay {
    Nothing,
    FromTail(Vec<Arc<EncodedEvent>>),
    /// Read page by page, through reads shared with the other streams
    /// resuming from the same point. Boxed: a live stream keeps its
    /// `Replay` (as `Nothing`) for its whole life.
    FromOutbox(Box<OutboxReplay>),
}

/// A replay that reads the outbox: first the late commits below the
/// client's cursor, then what follows it.
pub struct OutboxReplay {
    pub reads: SharedReads,
    /// Below a cursor with a horizon: the rows its seq passed over whose
    /// transactions were at or above its horizon, committed since.
    pub late: Option<LateCommits>,
    pub then: AfterCursor,
    /// The horizon the events after the cursor go out under: the xmin of
    /// the replay's first snapshot, once read.
    pub stamp: Option<u64>,
}

/// The late commits still to read below a cursor.
pub struct LateCommits {
    pub cursor: ResumeCursor,
    /// The highest seq read so far.
    pub after: i64,
}

/// What a replay sends after the cursor.
pub enum AfterCursor {
    Nothing,
    /// The hub's tail covered it.
    Tail(Vec<Arc<EncodedEvent>>),
    /// Pages from the outbox after this seq.
    Outbox(i64),
}

impl OutboxReplay {
    /// The next page for `subscriber`; `None` once the replay is over.
    async fn next_page(
        &mut self,
        subscriber: &Subscriber,
    ) -> Result<Option<Vec<Arc<EncodedEvent>>>, Arc<StoreError>> {
        let scope = subscriber.scope_key.as_str();
        if let Some(late) = &mut self.late {
            let horizon = late.cursor.horizon;
            // Below the cursor's seq: the cursor's own event was sent.
            let window = Window {
                after: late.after,
                since_txid: horizon,
                through: Some(late.cursor.seq - 1),
            };
            let page = self
                .reads
                .replay_page(scope, window, Stamp::Fixed(late.cursor))
                .await?;
            self.stamp.get_or_insert(page.snapshot_xmin);
            match page.last_seq {
                Some(last) if page.full => late.after = last,
                _ => self.late = None,
            }
            return Ok(Some(page.permitted_for(subscriber)));
        }
        match &mut self.then {
            AfterCursor::Nothing => Ok(None),
            AfterCursor::Tail(events) => {
                let events = std::mem::take(events);
                self.then = AfterCursor::Nothing;
                Ok(Some(events))
            }
            AfterCursor::Outbox(after) => {
                let page = self
                    .reads
                    .replay_page(scope, Window::after(*after), Stamp::Horizon(self.stamp))
                    .await?;
                self.stamp.get_or_insert(page.snapshot_xmin);
                match page.last_seq {
                    Some(last) if page.full => *after = last,
                    _ => self.then = AfterCursor::Nothing,
                }
                Ok(Some(page.permitted_for(subscriber)))
            }
        }
    }
}

pub struct SessionParams {
    pub retry_ms: u64,
    pub heartbeat: Duration,
    /// When the stream ends regardless (age cap, credentials' expiry).
    pub ends_at: Instant,
    /// When to warn that the credentials expire, and how many seconds
    /// they have left then: only for a stream its credentials end.
    pub reauth: Option<(Instant, u64)>,
    /// The stream's place among this relay's streams; its `end` tells the
    /// stream when an operator disconnects the subscriber or the relay
    /// shuts down.
    pub ticket: Ticket,
    pub until: Option<String>,
    /// Of a stream of one scope (a stream of several keeps it per scope).
    pub resync: bool,
    /// The first scope's replay.
    pub replay: Replay,
    /// A stream of several scopes: the others' replays, each scope's
    /// position, and its `ready`.
    pub several: Option<Box<SeveralScopes>>,
    /// The connection's socket, peeked to notice a client that closed it.
    pub peer: Option<PeerSocket>,
    /// Whether the connection carries this stream alone (HTTP/1.x), so it
    /// may be cut when a replay stalls past the stream's end.
    pub own_connection: bool,
    /// `http.write_timeout_secs`: how long a replay holds back for a
    /// reader that takes nothing (see [`REPLAY_AHEAD_BYTES`]).
    pub write_timeout: Duration,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Retry,
    Replay,
    Ready,
    Live,
    Finished,
}

pub struct Session {
    params: SessionParams,
    subscriber: Subscriber,
    queue: mpsc::Receiver<Arc<EncodedEvent>>,
    phase: Phase,
    sent: SentSeqs,
    /// Frames taken from the queue for one write; kept to reuse its buffer.
    live_batch: Vec<Arc<EncodedEvent>>,
    /// What is left of the replay page being sent.
    replay_left: Vec<Arc<EncodedEvent>>,
    /// Held while replaying: dropping it stands down the watch that cuts a
    /// replay stalled past the stream's end (see [`watch_stalled_replay`]).
    replaying: Option<oneshot::Sender<()>>,
    /// The live stream's one timer, set to the earliest of the stream's
    /// end, the reauth warning, the next heartbeat and the next peek: one
    /// timer entry per idle stream rather than four. Writes do not re-arm
    /// it (a timer reset takes the runtime's timer lock, once per
    /// subscriber per event); when it fires, a recent write postpones the
    /// heartbeat and the peek.
    timer: Pin<Box<Sleep>>,
    /// Due a heartbeat an interval after the last write.
    next_heartbeat: Instant,
    /// When the stream next peeks at its socket on its timer, if it does;
    /// like the heartbeat, due an interval after the last write, since a
    /// write to a closed peer fails by itself. An HTTP/2 stream peeks on
    /// this timer alone; an HTTP/1.x stream peeks whenever its connection
    /// wakes it for something else than an event (see
    /// [`Session::poll_live`]), and once more a moment later.
    next_peek: Option<Instant>,
    last_write: Instant,
    /// Live writes so far, for sampling the queue's fill ratio.
    live_writes: u32,
    /// Whether the live phase last returned while waiting, so that its
    /// next poll is a wake-up: it goes straight back to the waits, and a
    /// wake that brought neither an event nor the end was the connection.
    waiting: bool,
    /// A stream carrying several scopes (see [`SeveralScopes`]).
    several: Option<Box<SeveralScopes>>,
    registration: Registration,
}

/// Undoes a session's registrations when its stream is dropped, however it
/// ends (client gone, age cap, error).
pub struct Registration {
    pub relay: Counted<Addr<Relay>>,
    /// Each scope the stream is subscribed to, with the relay's session
    /// id there.
    subscriptions: Vec<(String, u64)>,
    pub metrics: Arc<Metrics>,
    /// Held for the stream's life: shutdown waits until every stream has
    /// dropped its hold (see [`crate::state::OpenStreams`]).
    _open: Option<tokio::sync::mpsc::Sender<()>>,
    /// In each scope with presence: its subscriber leaves when its guard
    /// drops.
    pub presence: Vec<crate::presence::PresenceGuard>,
}

impl Registration {
    /// Counts the connection as it registers, so the gauge goes up exactly
    /// when the matching `Drop` will bring it down, however the stream ends
    /// (even before a session is built).
    /// `scopes`: how many scopes the stream will subscribe to (sized
    /// exactly: every idle stream keeps this list).
    pub fn new(
        relay: Counted<Addr<Relay>>,
        metrics: Arc<Metrics>,
        open: Option<tokio::sync::mpsc::Sender<()>>,
        scopes: usize,
    ) -> Registration {
        metrics.connections.inc();
        Registration {
            relay,
            subscriptions: Vec::with_capacity(scopes),
            metrics,
            _open: open,
            presence: Vec::new(),
        }
    }

    /// Records a subscription, to be undone with the others.
    pub fn subscribed(&mut self, scope_key: &str, session: u64) {
        self.subscriptions.push((scope_key.to_owned(), session));
    }

    /// Undoes the subscription to `scope_key` now (and its presence), for
    /// a scope taken out of a stream that goes on.
    pub fn unsubscribe(&mut self, scope_key: &str) {
        self.presence.retain(|guard| guard.scope_key() != scope_key);
        if let Some(at) = self
            .subscriptions
            .iter()
            .position(|(subscribed, _)| subscribed == scope_key)
        {
            let (scope_key, session) = self.subscriptions.swap_remove(at);
            self.relay.do_send(Unsubscribe { scope_key, session });
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        for (scope_key, session) in self.subscriptions.drain(..) {
            self.relay.do_send(Unsubscribe { scope_key, session });
        }
        self.metrics.connections.dec();
    }
}

impl Session {
    pub fn new(
        mut params: SessionParams,
        subscriber: Subscriber,
        queue: mpsc::Receiver<Arc<EncodedEvent>>,
        registration: Registration,
    ) -> Self {
        let several = params.several.take();
        let now = Instant::now();
        let next_heartbeat = now + params.heartbeat;
        let next_peek = (!params.own_connection).then(|| now + PEEK_EVERY);
        let timer = Box::pin(tokio::time::sleep_until(params.ends_at));
        Session {
            params,
            subscriber,
            queue,
            phase: Phase::Retry,
            sent: SentSeqs::new(SENT_MEMORY),
            live_batch: Vec::new(),
            replay_left: Vec::new(),
            replaying: None,
            timer,
            next_heartbeat,
            next_peek,
            last_write: now,
            live_writes: 0,
            waiting: false,
            several,
            registration,
        }
    }

    /// The response body (see [`SessionBody`]).
    pub fn into_stream(self) -> SessionBody {
        SessionBody {
            state: BodyState::Idle(Box::new(self)),
        }
    }

    async fn next_chunk(&mut self) -> Option<Result<Bytes, StreamError>> {
        // While the replay waits for its reader: the unacknowledged bytes
        // last seen, and since when they have not shrunk.
        let mut held_back: Option<(usize, Instant)> = None;
        loop {
            // The end holds in every phase: a replay to a slow reader must
            // not outlive the token or the age cap.
            if let Some(step) = self.due_now(Instant::now()) {
                return step.map(Ok);
            }
            match self.phase {
                Phase::Retry => {
                    self.phase = Phase::Replay;
                    let replays = !matches!(self.params.replay, Replay::Nothing)
                        || self.several.as_ref().is_some_and(|s| s.replays_pending());
                    if let (Some(peer), true) = (self.params.peer, self.params.own_connection)
                        && replays
                    {
                        self.replaying = Some(watch_stalled_replay(peer, self.params.ends_at));
                    }
                    return Some(Ok(Bytes::from(sse::retry_frame(self.params.retry_ms))));
                }
                // A page goes out a few frames at a time, so a reader that
                // drains it slowly still sees the stream end on time.
                Phase::Replay if !self.replay_left.is_empty() => {
                    if let Some(queued) = self.reader_behind() {
                        let now = Instant::now();
                        let since = match held_back {
                            Some((before, since)) if queued >= before => since,
                            _ => now,
                        };
                        held_back = Some((queued, since));
                        // A reader that takes nothing for the write timeout
                        // is held back for no longer: the socket fills, and
                        // the connection's write deadline closes it.
                        if now - since < self.params.write_timeout {
                            tokio::time::sleep(READER_CHECK_EVERY).await;
                            continue;
                        }
                    }
                    let take = self.replay_left.len().min(MAX_FRAMES_PER_CHUNK);
                    let mut batch: Vec<_> = self.replay_left.drain(..take).collect();
                    if let Some(chunk) = self.frames(&mut batch, Source::Replay) {
                        return Some(Ok(chunk));
                    }
                }
                // Boxed, and so allocated only while a page is read: inline,
                // the database read's state would stay in every live
                // stream's body, idle or not.
                Phase::Replay => match Box::pin(tokio::time::timeout_at(
                    self.params.ends_at,
                    replay_page(
                        &mut self.params.replay,
                        match &self.several {
                            Some(several) => several.replaying_subscriber(),
                            None => &self.subscriber,
                        },
                    ),
                ))
                .await
                .unwrap_or(Ok(None))
                {
                    // A page still being read at the end is dropped: the
                    // stream ends on the check above.
                    Ok(None) if Instant::now() >= self.params.ends_at => {
                        self.phase = Phase::Finished;
                    }
                    Ok(Some(batch)) => self.replay_left = batch,
                    Ok(None) => match self.several.as_mut().and_then(|s| s.next_replay()) {
                        Some(next) => self.params.replay = next,
                        None => self.phase = Phase::Ready,
                    },
                    Err(error) => {
                        // An error, not a clean end: the connection is cut
                        // without its closing chunk, so no client can take
                        // it for the age cap and both count a failure.
                        tracing::warn!(%error, "replay failed; aborting the stream so the client retries");
                        self.phase = Phase::Finished;
                        return Some(Err(StreamError::ReplayFailed(error)));
                    }
                },
                Phase::Ready => {
                    self.phase = Phase::Live;
                    self.replaying = None;
                    return Some(Ok(match &self.several {
                        Some(several) => several.ready_frame(),
                        None => Bytes::from(sse::ready_frame(self.params.resync)),
                    }));
                }
                // The body polls this phase itself (see [`SessionBody`]).
                Phase::Live => return std::future::poll_fn(|cx| self.poll_live(cx)).await.map(Ok),
                Phase::Finished => return None,
            }
        }
    }

    /// How many bytes the reader has yet to acknowledge, when that is more
    /// than a replay may write ahead of it.
    fn reader_behind(&self) -> Option<usize> {
        let queued = self.params.peer?.unacknowledged()?;
        (queued > REPLAY_AHEAD_BYTES).then_some(queued)
    }

    /// What is due at `now` in every phase, checked before every chunk:
    /// the stream's end (`Some(None)`), its revocation (the last frame),
    /// or the `reauth` warning, once and not before the `retry:` frame.
    fn due_now(&mut self, now: Instant) -> Option<Option<Bytes>> {
        if self.phase == Phase::Finished {
            return None;
        }
        if now >= self.params.ends_at {
            self.phase = Phase::Finished;
            return Some(None);
        }
        if self.params.ticket.end.is_revoked() {
            self.phase = Phase::Finished;
            return Some(Some(Bytes::from(sse::revoked_frame())));
        }
        if let Some(several) = &mut self.several {
            // A scope an operator took out: its last frame, then nothing
            // more of it.
            if let Some(scope_key) = several.take_removed(self.params.ticket.end.removed_scopes()) {
                self.registration.unsubscribe(&scope_key);
                return Some(Some(Bytes::from(sse::revoked_scope_frame(&scope_key))));
            }
            if self.queue.sender_strong_count() < several.senders() {
                tracing::info!("a scope's hub dropped the stream as too slow; ending it");
                self.phase = Phase::Finished;
                return Some(None);
            }
        }
        match self.params.reauth {
            Some((at, expires_in)) if self.phase != Phase::Retry && now >= at => {
                self.params.reauth = None;
                Some(Some(Bytes::from(sse::reauth_frame(expires_in))))
            }
            _ => None,
        }
    }

    /// The next live chunk: a heartbeat, a warning or the end when one is
    /// due, else the frames queued so far, else it waits for the first of
    /// the stream's end, its queue, its connection and its timer, in that
    /// order. Polled by hand rather than as a `select!` in a loop, since
    /// this runs twice per subscriber and event (once to take the frame,
    /// once to find the queue empty): a poll that finds it waiting goes
    /// straight back to the waits, without redoing the checks.
    fn poll_live(&mut self, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
        let peer = self.params.peer;
        // Only an HTTP/1.x connection's reads wake its stream: a client
        // that closes or resets it wakes the stream at once.
        let peeks_when_woken = peer.is_some() && self.params.own_connection;
        loop {
            if !self.waiting
                && let Some(step) = self.live_checks()
            {
                return Poll::Ready(step);
            }
            if let Poll::Ready(end) = self.params.ticket.end.poll_ended(cx) {
                self.waiting = false;
                self.phase = Phase::Finished;
                return Poll::Ready(match end {
                    End::Revoked => Some(Bytes::from(sse::revoked_frame())),
                    End::Closing => None,
                });
            }
            // Woken for a scope taken out of the stream: the checks send
            // its frame.
            if self.waiting
                && let Some(several) = &self.several
                && several.removal_due(self.params.ticket.end.removed_scopes())
            {
                self.waiting = false;
                continue;
            }
            match self.queue.poll_recv(cx) {
                Poll::Ready(Some(first)) => {
                    self.waiting = false;
                    if let Some(chunk) = self.take_live(first) {
                        return Poll::Ready(Some(chunk));
                    }
                    continue;
                }
                Poll::Ready(None) => {
                    // The hub dropped us (queue full) or shut down.
                    self.waiting = false;
                    self.phase = Phase::Finished;
                    return Poll::Ready(None);
                }
                Poll::Pending => {}
            }
            // Woken while waiting, for neither an event nor the end: the
            // connection was (the client sent something, closed or reset
            // it).
            if std::mem::take(&mut self.waiting) && peeks_when_woken {
                if peer.is_some_and(PeerSocket::is_closed) {
                    self.phase = Phase::Finished;
                    return Poll::Ready(None);
                }
                // A TLS client's closing alert may come a moment before
                // its TCP end, which then wakes nobody: one more look
                // shortly.
                let again = Instant::now() + PEEK_EVERY;
                self.next_peek = Some(self.next_peek.map_or(again, |at| at.min(again)));
                continue;
            }
            // Whatever came due is handled by the checks.
            if self.timer.as_mut().poll(cx).is_ready() {
                continue;
            }
            self.waiting = true;
            return Poll::Pending;
        }
    }

    /// What the live phase checks before it waits: the stream's end, the
    /// reauth warning, the peek at the socket and the heartbeat, each when
    /// due; then it sets the timer to the earliest of them. `Some` is the
    /// step to take now (a frame, or `None` to end).
    fn live_checks(&mut self) -> Option<Option<Bytes>> {
        let ends_at = self.params.ends_at;
        let peer = self.params.peer;
        let own_connection = self.params.own_connection;
        let now = Instant::now();
        if let Some(step) = self.due_now(now) {
            return Some(step);
        }
        if let Some(peer) = peer
            && self.next_peek.is_some_and(|at| now >= at)
        {
            // A second look after a wake, on a connection of its own, is
            // the last one: its reads wake the stream again.
            let again = (!own_connection).then_some(now + PEEK_EVERY);
            if let Some(due) = still_waiting(self.last_write, PEEK_EVERY) {
                self.next_peek = again.map(|_| due);
            } else if peer.is_closed() {
                // Nobody is reading: end now, releasing the permit, the
                // hub's place and the queue.
                self.phase = Phase::Finished;
                return Some(None);
            } else {
                self.next_peek = again;
            }
        }
        if now >= self.next_heartbeat {
            if let Some(due) = still_waiting(self.last_write, self.params.heartbeat) {
                self.next_heartbeat = due;
            } else {
                self.last_write = now;
                self.next_heartbeat = now + self.params.heartbeat;
                return Some(Some(Bytes::from_static(sse::HEARTBEAT_FRAME.as_bytes())));
            }
        }
        let mut due = ends_at.min(self.next_heartbeat);
        if let Some((at, _)) = self.params.reauth {
            due = due.min(at);
        }
        if let (Some(_), Some(at)) = (peer, self.next_peek) {
            due = due.min(at);
        }
        if self.timer.deadline() != due {
            self.timer.as_mut().reset(due);
        }
        None
    }

    /// The frames queued from `first` on, up to a chunk's worth, not yet
    /// sent; `None` when the replay sent them all already.
    fn take_live(&mut self, first: Arc<EncodedEvent>) -> Option<Bytes> {
        let fan_out_started = first.fan_out_started.get();
        let mut batch = std::mem::take(&mut self.live_batch);
        batch.push(first);
        // How full the queue was when this write began: near 1, the
        // subscriber is about to be dropped as too slow.
        if self.live_writes.is_multiple_of(FILL_SAMPLE_EVERY) {
            let metrics = &self.registration.metrics;
            let fill = (self.queue.len() + 1) as f64 / self.queue.max_capacity() as f64;
            metrics.session_queue_fill_ratio.observe(fill);
            if let Some(started) = fan_out_started {
                metrics.stages.since(Stage::Session, started);
            }
        }
        self.live_writes = self.live_writes.wrapping_add(1);
        while batch.len() < MAX_FRAMES_PER_CHUNK {
            match self.queue.try_recv() {
                Ok(event) => batch.push(event),
                Err(_) => break,
            }
        }
        let chunk = self.frames(&mut batch, Source::Live);
        self.live_batch = batch;
        chunk
    }

    /// The frames of `batch` not yet sent, as one chunk (see
    /// [`join_frames`]); a write also postpones the heartbeat and the peek.
    fn frames(&mut self, batch: &mut Vec<Arc<EncodedEvent>>, source: Source) -> Option<Bytes> {
        let (chunk, until_reached) = join_frames(
            &mut self.sent,
            source,
            self.params.until.as_deref(),
            self.several.as_deref_mut(),
            batch,
        );
        if until_reached {
            self.phase = Phase::Finished;
        }
        let chunk = chunk?;
        self.last_write = Instant::now();
        Some(chunk)
    }
}

/// A session as its response body. The live phase, which every event of
/// every subscriber goes through, is polled directly on the session; the
/// phases before it (the `retry:` frame, the replay, the `ready` frame),
/// which wait on the database, run as a future that holds the session
/// until it hands it back with each chunk. The session is boxed either way,
/// so a body is a pointer and a tag.
pub struct SessionBody {
    state: BodyState,
}

/// Where a body stands between polls.
enum BodyState {
    Idle(Box<Session>),
    Working(Pin<Box<dyn Future<Output = NextChunk>>>),
    Done,
}

/// A chunk from the phases before the live one, and the session back.
type NextChunk = (Option<Result<Bytes, StreamError>>, Box<Session>);

impl futures_util::Stream for SessionBody {
    type Item = Result<Bytes, StreamError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let state = &mut self.get_mut().state;
        loop {
            match state {
                BodyState::Idle(session) if session.phase == Phase::Live => {
                    let polled = session.poll_live(cx);
                    if let Poll::Ready(None) = polled {
                        *state = BodyState::Done;
                    }
                    return polled.map(|chunk| chunk.map(Ok));
                }
                BodyState::Idle(_) => {
                    if let BodyState::Idle(mut session) = std::mem::replace(state, BodyState::Done)
                    {
                        *state = BodyState::Working(Box::pin(async move {
                            let chunk = session.next_chunk().await;
                            (chunk, session)
                        }));
                    }
                }
                BodyState::Working(work) => {
                    let Poll::Ready((chunk, session)) = work.as_mut().poll(cx) else {
                        return Poll::Pending;
                    };
                    *state = if chunk.is_some() {
                        BodyState::Idle(session)
                    } else {
                        BodyState::Done
                    };
                    return Poll::Ready(chunk);
                }
                BodyState::Done => return Poll::Ready(None),
            }
        }
    }
}

/// How long past its end a replay stalled on its reader may keep its
/// connection.
const STALLED_REPLAY_GRACE: Duration = Duration::from_millis(500);

/// Cuts the connection of a replay still stalled a moment after the
/// stream's end, unless the session drops the returned sender first (it
/// went live, or ended). Only replays need this: a live stream that stops
/// draining fills its queue and is dropped by its hub.
fn watch_stalled_replay(peer: PeerSocket, ends_at: Instant) -> oneshot::Sender<()> {
    let (replaying, stood_down) = oneshot::channel::<()>();
    actix_web::rt::spawn(async move {
        tokio::select! {
            // First, so a session that moved on is never cut: the sender
            // is dropped on this same thread, and with it the connection
            // is known open until then.
            biased;
            _ = stood_down => {}
            _ = tokio::time::sleep_until(ends_at + STALLED_REPLAY_GRACE) => {
                tracing::debug!("a replay stalled past the stream's end; cutting its connection");
                peer.cut();
            }
        }
    });
    replaying
}

/// When a timer of period `every` that fired should really fire, if a write
/// since `last_write` postponed it; `None` when it is due now.
fn still_waiting(last_write: Instant, every: Duration) -> Option<Instant> {
    let due = last_write + every;
    (due > Instant::now()).then_some(due)
}

/// The next page of a replay, filtered for `subscriber`; `None` once the
/// replay is over.
pub(super) async fn replay_page(
    replay: &mut Replay,
    subscriber: &Subscriber,
) -> Result<Option<Vec<Arc<EncodedEvent>>>, Arc<StoreError>> {
    match replay {
        Replay::Nothing => Ok(None),
        Replay::FromTail(events) => {
            let events = std::mem::take(events);
            *replay = Replay::Nothing;
            Ok(Some(events))
        }
        Replay::FromOutbox(outbox) => match outbox.next_page(subscriber).await? {
            Some(events) => Ok(Some(events)),
            None => {
                *replay = Replay::Nothing;
                Ok(None)
            }
        },
    }
}

/// Where a batch of frames comes from, which decides what is remembered of
/// it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Source {
    /// A replay page: its seqs are remembered, since the same events may
    /// also be queued live (they committed while the replay was read).
    Replay,
    /// The hub's queue: checked against the replay, not remembered. The
    /// relay hands each scope's events on once (see `actors::scope`), so
    /// the only duplicates a live event can have are replayed ones.
    /// Remembering every live seq would cost a long-lived stream a ring of
    /// `SENT_MEMORY` seqs (128 KiB) and a write to it per event.
    Live,
}

/// The frames of `batch` not yet sent, as one chunk, and whether an
/// `until` event was among them (the frames after it are dropped). Leaves
/// `batch` empty. A lone frame is shared with every other subscriber rather
/// than copied; a stream of `several` scopes writes its own `id:` lines.
pub(super) fn join_frames(
    sent: &mut SentSeqs,
    source: Source,
    until: Option<&str>,
    mut several: Option<&mut SeveralScopes>,
    batch: &mut Vec<Arc<EncodedEvent>>,
) -> (Option<Bytes>, bool) {
    let mut single: Option<Bytes> = None;
    let mut joined: Option<BytesMut> = None;
    let mut until_reached = false;
    for event in batch.drain(..) {
        if let Some(seq) = event.seq() {
            let new = match source {
                Source::Replay => sent.insert(seq),
                Source::Live => !sent.contains(seq),
            };
            if !new {
                continue;
            }
        }
        let frame = match several.as_deref_mut() {
            None => event.frame.clone(),
            Some(several) => match several.frame(&event) {
                Some(frame) => frame,
                None => continue,
            },
        };
        if let (Source::Live, Some(trace)) = (source, event.trace()) {
            trace.written();
        }
        match (&mut joined, single.take()) {
            (Some(chunk), _) => chunk.extend_from_slice(&frame),
            (None, None) => single = Some(frame),
            (None, Some(first)) => {
                let mut chunk = BytesMut::with_capacity(first.len() + frame.len());
                chunk.extend_from_slice(&first);
                chunk.extend_from_slice(&frame);
                joined = Some(chunk);
            }
        }
        if until.is_some_and(|until| until == event.event_type()) {
            until_reached = true;
            break;
        }
    }
    (joined.map(BytesMut::freeze).or(single), until_reached)
}

/// Counts a replay by where it was served from.
pub fn count_replay(metrics: &Metrics, source: &'static str) {
    metrics.replays.get_or_create(&SourceLabel { source }).inc();
}

/// The seqs a stream has replayed, remembered to drop an event delivered
/// twice (once by replay and again live). At most `capacity` are kept; the
/// lowest are forgotten first.
///
/// Kept sorted in a ring rather than a tree: replayed seqs arrive in
/// ascending order, so recording one is a push at the back and forgetting
/// one a pop at the front. Only a seq older than the newest (a late commit)
/// pays for a search and an insert in place; a live seq above the newest
/// is told apart without one.
pub(super) struct SentSeqs {
    seqs: VecDeque<i64>,
    capacity: usize,
}

impl SentSeqs {
    pub(super) fn new(capacity: usize) -> Self {
        SentSeqs {
            seqs: VecDeque::new(),
            capacity,
        }
    }

    /// Records `seq`; false when it was sent already.
    pub(super) fn insert(&mut self, seq: i64) -> bool {
        let position = match self.seqs.back() {
            Some(&newest) if seq <= newest => match self.seqs.binary_search(&seq) {
                Ok(_) => return false,
                Err(position) => position,
            },
            _ => self.seqs.len(),
        };
        // Full: the lowest goes first, or `seq` itself when it is lower
        // still. Making room before inserting keeps the ring within its
        // capacity (one more would double its allocation).
        if self.seqs.len() >= self.capacity {
            if position == 0 {
                return true;
            }
            self.seqs.pop_front();
            self.seqs.insert(position - 1, seq);
        } else {
            self.seqs.insert(position, seq);
        }
        true
    }

    /// Whether `seq` was recorded (and not forgotten since).
    pub(super) fn contains(&self, seq: i64) -> bool {
        match self.seqs.back() {
            Some(&newest) if seq <= newest => self.seqs.binary_search(&seq).is_ok(),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::Instant;

    use std::sync::Arc;

    use chrono::Utc;
    use eventrelay_wire::NewEvent;
    use serde_json::json;

    use super::{SENT_MEMORY, SentSeqs, Source, join_frames, still_waiting};
    use crate::actors::EncodedEvent;

    fn durable(seq: i64) -> Arc<EncodedEvent> {
        let mut envelope =
            NewEvent::durable("t", "s", json!({ "marker": seq })).into_envelope(Utc::now());
        envelope.seq = Some(seq);
        let cursor = eventrelay_wire::ResumeCursor::at(seq, 200);
        Arc::new(EncodedEvent::written_by(envelope, 200, cursor))
    }

    /// The seqs whose frames `chunk` holds.
    fn seqs_in(chunk: Option<bytes::Bytes>) -> Vec<i64> {
        let text = chunk.map(|c| String::from_utf8(c.to_vec()).unwrap());
        let text = text.unwrap_or_default();
        text.match_indices("\"marker\":")
            .map(|(at, tag)| {
                let digits: String = text[at + tag.len()..]
                    .chars()
                    .take_while(char::is_ascii_digit)
                    .collect();
                digits.parse().unwrap()
            })
            .collect()
    }

    #[test]
    fn a_recent_write_postpones_a_timer_to_an_interval_after_it() {
        let every = Duration::from_secs(20);
        let written = Instant::now() - Duration::from_secs(5);
        assert_eq!(still_waiting(written, every), Some(written + every));
        let long_ago = Instant::now() - Duration::from_secs(21);
        assert_eq!(still_waiting(long_ago, every), None);
    }

    #[test]
    fn a_seq_is_sent_once_in_order_or_late() {
        let mut sent = SentSeqs::new(8);
        assert!(sent.insert(5));
        assert!(sent.insert(7));
        assert!(!sent.insert(7));
        // A late commit with a lower seq is new, then a duplicate.
        assert!(sent.insert(6));
        assert!(!sent.insert(6));
        assert!(!sent.insert(5));
        assert!(sent.insert(1));
        assert_eq!(Vec::from(sent.seqs.clone()), [1, 5, 6, 7]);
    }

    #[test]
    fn live_frames_are_checked_against_the_replay_and_not_remembered() {
        let mut sent = SentSeqs::new(SENT_MEMORY);
        let (chunk, _) = join_frames(
            &mut sent,
            Source::Replay,
            None,
            None,
            &mut vec![durable(1), durable(2)],
        );
        assert_eq!(seqs_in(chunk), [1, 2]);
        // Seq 2 committed while the replay was read: queued live too.
        let (chunk, _) = join_frames(
            &mut sent,
            Source::Live,
            None,
            None,
            &mut vec![durable(2), durable(3), durable(4)],
        );
        assert_eq!(seqs_in(chunk), [3, 4], "the replayed one is dropped");
        // A late commit below the replay's newest that was not replayed.
        let (chunk, _) = join_frames(&mut sent, Source::Live, None, None, &mut vec![durable(0)]);
        assert_eq!(seqs_in(chunk), [0]);
        assert_eq!(
            Vec::from(sent.seqs.clone()),
            [1, 2],
            "only replayed seqs are kept"
        );
    }

    #[test]
    fn a_full_ring_keeps_its_allocation() {
        let mut sent = SentSeqs::new(SENT_MEMORY);
        for seq in 0..(SENT_MEMORY as i64 + 100) {
            assert!(sent.insert(seq));
        }
        assert_eq!(sent.seqs.len(), SENT_MEMORY);
        assert!(
            sent.seqs.capacity() <= SENT_MEMORY,
            "{} slots for {SENT_MEMORY} seqs",
            sent.seqs.capacity()
        );
        assert!(sent.contains(SENT_MEMORY as i64 + 99));
        assert!(!sent.contains(99), "the lowest were forgotten");
        // A late one lower than everything kept is forgotten at once.
        assert!(sent.insert(50));
        assert!(!sent.contains(50));
    }

    #[test]
    fn the_lowest_seqs_are_forgotten_past_the_capacity() {
        let mut sent = SentSeqs::new(3);
        for seq in [10, 11, 12, 13] {
            assert!(sent.insert(seq));
        }
        assert_eq!(Vec::from(sent.seqs.clone()), [11, 12, 13]);
        // Forgotten, so no longer recognised; and older than everything kept,
        // so it is forgotten again at once.
        assert!(sent.insert(10));
        assert_eq!(Vec::from(sent.seqs.clone()), [11, 12, 13]);
        assert!(!sent.insert(12));
    }
}
