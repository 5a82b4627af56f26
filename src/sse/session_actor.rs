//! The session as an actix actor (`sse.session = "actor"`): the same
//! protocol as [`Session`](super::session::Session), with an actor owning
//! the connection's queue, heartbeat, age cap and de-duplication, and
//! writing chunks into a channel the response body reads.
//!
//! The default is the stream session, where the response body itself owns
//! all of that. This variant exists to be measured against it: it costs a
//! mailbox, a second bounded channel and an actor context per connection,
//! and one more hop per event (`bench/run` shows both side by side, and
//! the README's design section records the figures).

use std::sync::Arc;
use std::time::Duration;

use actix::{
    Actor, ActorContext, ActorFutureExt, AsyncContext, Context, StreamHandler, WrapFuture,
};
use bytes::Bytes;
use eventrelay_wire::{Subscriber, sse};
use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TrySendError;
use tokio::time::Instant;

use super::peer::{PEEK_EVERY, PeerSocket};
use super::session::{
    Registration, SENT_MEMORY, SentSeqs, SessionParams, StreamError, join_frames, replay_page,
};
use crate::actors::EncodedEvent;
use crate::metrics::Metrics;

type Chunk = Result<Bytes, StreamError>;

pub struct SessionActor {
    params: Option<SessionParams>,
    subscriber: Subscriber,
    queue: Option<mpsc::Receiver<Arc<EncodedEvent>>>,
    /// What the response body reads; dropping it ends the response.
    body: mpsc::Sender<Chunk>,
    sent: SentSeqs,
    until: Option<String>,
    heartbeat: Duration,
    peer: Option<PeerSocket>,
    last_write: Instant,
    metrics: Arc<Metrics>,
    _registration: Registration,
}

impl SessionActor {
    /// Starts the actor on the current arbiter and returns the response
    /// body. `capacity` bounds the chunks waiting for the client.
    pub fn start(
        params: SessionParams,
        subscriber: Subscriber,
        queue: mpsc::Receiver<Arc<EncodedEvent>>,
        registration: Registration,
        capacity: usize,
        metrics: Arc<Metrics>,
    ) -> impl futures_util::Stream<Item = Chunk> {
        let (body, mut chunks) = mpsc::channel(capacity.max(1));
        let actor = SessionActor {
            until: params.until.clone(),
            heartbeat: params.heartbeat,
            peer: params.peer,
            params: Some(params),
            subscriber,
            queue: Some(queue),
            body,
            sent: SentSeqs::new(SENT_MEMORY),
            last_write: Instant::now(),
            metrics,
            _registration: registration,
        };
        actor.start();
        futures_util::stream::poll_fn(move |cx| chunks.poll_recv(cx))
    }

    /// Queues a chunk for the client; a client too slow to take it is
    /// dropped, as the hub drops a session whose queue is full.
    fn write(&mut self, chunk: Bytes, ctx: &mut Context<Self>) {
        match self.body.try_send(Ok(chunk)) {
            Ok(()) => self.last_write = Instant::now(),
            Err(TrySendError::Full(_)) => {
                self.metrics.slow_subscribers_dropped.inc();
                ctx.stop();
            }
            Err(TrySendError::Closed(_)) => ctx.stop(),
        }
    }

    /// After the replay: live events, the heartbeat, the peek and the caps.
    fn go_live(&mut self, params: SessionParams, ctx: &mut Context<Self>) {
        if let Some(queue) = self.queue.take() {
            ctx.add_stream(futures_util::stream::unfold(queue, |mut queue| async {
                queue.recv().await.map(|event| (event, queue))
            }));
        }
        ctx.run_interval(self.heartbeat, |actor, ctx| {
            if actor.last_write.elapsed() >= actor.heartbeat {
                actor.write(Bytes::from_static(sse::HEARTBEAT_FRAME.as_bytes()), ctx);
            }
        });
        if self.peer.is_some() {
            ctx.run_interval(PEEK_EVERY, |actor, ctx| {
                if actor.last_write.elapsed() >= PEEK_EVERY
                    && actor.peer.is_some_and(PeerSocket::is_closed)
                {
                    ctx.stop();
                }
            });
        }
        let left = params.ends_at.saturating_duration_since(Instant::now());
        ctx.run_later(left, |_, ctx| ctx.stop());
        let mut closing = params.closing;
        ctx.spawn(
            async move {
                let _ = closing.wait_for(|closing| *closing).await;
            }
            .into_actor(self)
            .map(|(), _, ctx| ctx.stop()),
        );
    }
}

impl Actor for SessionActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let Some(mut params) = self.params.take() else {
            ctx.stop();
            return;
        };
        let body = self.body.clone();
        let subscriber = self.subscriber.clone();
        let until = self.until.clone();
        let mut sent = SentSeqs::new(SENT_MEMORY);
        // The replay writes with back-pressure (it may be long); live
        // writes never wait.
        let replay = async move {
            let write = |chunk: Bytes| body.send(Ok(chunk));
            write(Bytes::from(sse::retry_frame(params.retry_ms)))
                .await
                .ok()?;
            loop {
                match replay_page(&mut params.replay, &subscriber).await {
                    Ok(Some(mut batch)) => {
                        let (chunk, until_reached) =
                            join_frames(&mut sent, until.as_deref(), &mut batch);
                        if let Some(chunk) = chunk {
                            write(chunk).await.ok()?;
                        }
                        if until_reached {
                            return None;
                        }
                    }
                    Ok(None) => break,
                    Err(error) => {
                        tracing::warn!(%error, "replay failed; aborting the stream so the client retries");
                        let _ = body.send(Err(StreamError::ReplayFailed(error))).await;
                        return None;
                    }
                }
            }
            write(Bytes::from(sse::ready_frame(params.resync)))
                .await
                .ok()?;
            Some((params, sent))
        };
        ctx.spawn(
            replay
                .into_actor(self)
                .map(|replayed, actor, ctx| match replayed {
                    Some((params, sent)) => {
                        actor.sent = sent;
                        actor.last_write = Instant::now();
                        actor.go_live(params, ctx);
                    }
                    None => ctx.stop(),
                }),
        );
    }
}

impl StreamHandler<Arc<EncodedEvent>> for SessionActor {
    fn handle(&mut self, event: Arc<EncodedEvent>, ctx: &mut Context<Self>) {
        let mut batch = vec![event];
        let (chunk, until_reached) = join_frames(&mut self.sent, self.until.as_deref(), &mut batch);
        if let Some(chunk) = chunk {
            self.write(chunk, ctx);
        }
        if until_reached {
            ctx.stop();
        }
    }

    /// The hub dropped the session (its queue was full) or stopped.
    fn finished(&mut self, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}
