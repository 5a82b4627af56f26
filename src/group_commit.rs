//! Group commit for the publish API: concurrent publish requests share one
//! transaction, so they share one commit flush (and, in notify mode, one
//! turn at the cluster-wide notification lock) instead of paying for one
//! each.
//!
//! Committer tasks take requests in arrival order, one of them gathering at
//! a time. The gatherer takes everything queued (up to a bound on events),
//! so the group size follows the load with no timer: a lone publisher's
//! request is written at once, as before. When fewer requests are queued
//! than the last group held (some publishers of a steady set are still on
//! their way), it also waits up to `publish.group_commit_ms` for them, and
//! no longer than until that many have come. It then writes and commits its group while the next committer gathers
//! the requests that arrive meanwhile, so up to
//! `publish.group_commit_writers` groups are written at once, each on its
//! own connection: a group's commit flush no longer holds up the next.
//! Groups written at once may commit out of seq order, which readers
//! already handle, as for any two concurrent transactions.
//!
//! A group is one `INSERT` for all its durable events, in request order, so
//! each request's events keep their order and are not interleaved with
//! another request's. Its `BEGIN`, statements and `COMMIT` are pipelined:
//! sent together and answered together, one round trip to the server
//! instead of three (a lone request is written the same way). Every
//! request is answered only after the transaction holding its events
//! committed. A request's own fault (an invalid event,
//! an id already used) must not fail the others: the group is then rolled
//! back and each of its requests written alone, as without grouping, so
//! exactly the faulty one fails. A database failure (a lost connection, a
//! failed commit) answers every request of the group with it, and none of
//! them was written.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use eventrelay_publisher::{
    BatchError, EventEnvelope, NewEvent, PreparedBatch, PublishError, Publisher,
};
use tokio::sync::{mpsc, oneshot};

use crate::latency::Stage;
use crate::metrics::Metrics;
use crate::store::{Database, StatementKey, StoreError};

/// Why a publish request was not written.
#[derive(Debug, thiserror::Error)]
pub enum GroupError {
    /// The event at `index` of the request was refused; nothing of the
    /// request was written.
    #[error("event {index}: {error}")]
    Refused {
        index: usize,
        #[source]
        error: PublishError,
    },
    /// The database failed; nothing of the request was written. Shared:
    /// one failure answers every request of its group.
    #[error("the database failed: {0}")]
    Unavailable(#[source] Arc<StoreError>),
    /// The service is stopping and takes no more requests.
    #[error("the service is stopping")]
    Stopping,
}

fn unavailable(error: impl Into<StoreError>) -> GroupError {
    GroupError::Unavailable(Arc::new(error.into()))
}

/// Where the publish API hands its requests.
#[derive(Clone)]
pub struct Publishing {
    writer: Arc<Writer>,
    /// `None` when group commit is off: each request is its own transaction.
    committer: Option<mpsc::Sender<Job>>,
}

struct Job {
    events: PreparedBatch,
    reply: oneshot::Sender<Result<Vec<EventEnvelope>, GroupError>>,
    /// When it was handed over, for its `group_wait` stage.
    queued: Instant,
}

/// How groups are formed.
#[derive(Debug, Clone, Copy)]
pub struct GroupSettings {
    /// Extra wait for more requests while they arrive concurrently; zero
    /// turns group commit off.
    pub window: Duration,
    /// Most events in one group.
    pub max_events: usize,
    /// Most groups written at once.
    pub writers: usize,
}

impl Publishing {
    /// Starts the committer task (when `settings.window` is not zero) on
    /// the current runtime.
    pub fn start(
        db: Database,
        publisher: Publisher,
        settings: GroupSettings,
        metrics: std::sync::Arc<Metrics>,
    ) -> Publishing {
        let writer = Arc::new(Writer {
            db,
            publisher,
            known_statements: std::sync::Mutex::new(Vec::new()),
            metrics: Arc::clone(&metrics),
        });
        let committer = (!settings.window.is_zero()).then(|| {
            let (jobs, queue) = mpsc::channel(4096);
            let queue = Arc::new(tokio::sync::Mutex::new(queue));
            let committer = Arc::new(Committer {
                last_group: AtomicUsize::new(0),
                writer: Arc::clone(&writer),
                settings,
                metrics,
            });
            for _ in 0..settings.writers.max(1) {
                actix::spawn(Arc::clone(&committer).run(Arc::clone(&queue)));
            }
            jobs
        });
        Publishing { writer, committer }
    }

    /// Validates `events` and gives each its id and time: what a request
    /// is refused for before anything is written.
    pub fn prepare(&self, events: Vec<NewEvent>) -> Result<PreparedBatch, GroupError> {
        self.writer
            .publisher
            .prepare_batch(events)
            .map_err(|BatchError { index, error }| GroupError::Refused { index, error })
    }

    /// Writes `events` atomically and answers once they are committed.
    pub async fn publish(&self, events: PreparedBatch) -> Result<Vec<EventEnvelope>, GroupError> {
        let Some(committer) = &self.committer else {
            return self.writer.publish_alone(events).await;
        };
        let (reply, answer) = oneshot::channel();
        committer
            .send(Job {
                events,
                reply,
                queued: Instant::now(),
            })
            .await
            .map_err(|_| GroupError::Stopping)?;
        answer.await.map_err(|_| GroupError::Stopping)?
    }
}

/// Writes requests to the database: alone, or a group in one transaction.
struct Writer {
    db: Database,
    publisher: Publisher,
    /// The statements requests are written with, prepared on each
    /// connection before its pipeline (learnt from the first writes).
    known_statements: std::sync::Mutex<Vec<StatementKey>>,
    /// For the `commit` stage, and the marks that time `notify`.
    metrics: Arc<Metrics>,
}

impl Writer {
    /// One request in its own transaction, its durable events in one
    /// statement. When the database refuses one of them, the statement
    /// cannot say which, so the request is written again one event at a
    /// time to name it.
    async fn publish_alone(&self, events: PreparedBatch) -> Result<Vec<EventEnvelope>, GroupError> {
        match self.write_committed(|| events.clone()).await {
            Ok(envelopes) => Ok(envelopes),
            Err(Together::Refused { index, error }) => Err(GroupError::Refused { index, error }),
            Err(Together::Unavailable(error)) => Err(GroupError::Unavailable(error)),
            Err(Together::SomeRequestRefused) => self.publish_one_by_one(events).await,
        }
    }

    /// One request in its own transaction, one statement per event; errors
    /// name the exact event.
    async fn publish_one_by_one(
        &self,
        events: PreparedBatch,
    ) -> Result<Vec<EventEnvelope>, GroupError> {
        let mut client = self.db.get().await.map_err(unavailable)?;
        let tx = client.begin().await.map_err(unavailable)?;
        let mut envelopes = Vec::with_capacity(events.len());
        for (index, event) in events.split().enumerate() {
            let written = self
                .publisher
                .emit_prepared(&tx, event)
                .await
                .map_err(|BatchError { error, .. }| GroupError::Refused { index, error })?;
            envelopes.extend(written);
        }
        tx.commit().await.map_err(unavailable)?;
        Ok(envelopes)
    }

    /// Writes the events `events()` gives in one transaction whose
    /// `BEGIN`, statements and `COMMIT` travel together: one round trip to
    /// the server, not three. A statement that went stale (a migration
    /// changed its table, or a pooler moved the connection) only rolled the
    /// transaction back, so it is sent once more, prepared afresh, with the
    /// events asked for again (the caller keeps its own copy for the
    /// one-by-one fallback, so the events are copied once per attempt).
    async fn write_committed(
        &self,
        events: impl Fn() -> PreparedBatch,
    ) -> Result<Vec<EventEnvelope>, Together> {
        let writing = Instant::now();
        let written = self.write_committed_untimed(events).await;
        if let Ok(envelopes) = &written {
            let committed = Instant::now();
            let stages = &self.metrics.stages;
            stages.observe(Stage::Commit, committed - writing);
            stages.committed(envelopes.iter().map(|envelope| envelope.id), committed);
        }
        written
    }

    async fn write_committed_untimed(
        &self,
        events: impl Fn() -> PreparedBatch,
    ) -> Result<Vec<EventEnvelope>, Together> {
        let client = self.db.get().await.map_err(Together::unavailable)?;
        let mut retried = false;
        loop {
            let known = self.known().clone();
            let pipeline = client
                .pipeline(&known)
                .await
                .map_err(Together::unavailable)?;
            let written = self
                .publisher
                .emit_prepared_committed(&pipeline, events())
                .await;
            self.learn(pipeline.unprepared());
            match written {
                Err(BatchError {
                    error: PublishError::Database(error),
                    ..
                }) if !retried && pipeline.forget_stale(&error) => retried = true,
                other => return other.map_err(Together::from_batch),
            }
        }
    }

    /// The statements learnt so far (a list of a few keys, whatever a
    /// panicking holder left in it).
    fn known(&self) -> std::sync::MutexGuard<'_, Vec<StatementKey>> {
        match self.known_statements.lock() {
            Ok(known) => known,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    fn learn(&self, unprepared: Vec<StatementKey>) {
        if unprepared.is_empty() {
            return;
        }
        let mut known = self.known();
        for key in unprepared {
            if !known.contains(&key) {
                known.push(key);
            }
        }
    }
}

struct Committer {
    /// How many requests the last group held.
    last_group: AtomicUsize,
    writer: Arc<Writer>,
    settings: GroupSettings,
    metrics: std::sync::Arc<Metrics>,
}

impl Committer {
    /// Gathers a group while holding the queue, then writes it with the
    /// queue released, so another committer gathers meanwhile.
    async fn run(self: Arc<Self>, queue: Arc<tokio::sync::Mutex<mpsc::Receiver<Job>>>) {
        loop {
            let group = {
                let mut queue = queue.lock().await;
                match self.gather(&mut queue).await {
                    Some(group) => group,
                    None => return,
                }
            };
            self.metrics
                .publish_group_requests
                .observe(group.len() as f64);
            let writing = Instant::now();
            for job in &group {
                self.metrics
                    .stages
                    .observe(Stage::GroupWait, writing - job.queued);
            }
            self.commit(group).await;
        }
    }

    /// The next group: the first request to come, everything queued behind
    /// it and, when that is more than one but fewer than the last group
    /// held, what arrives within the window, up to the last group's size.
    /// `None` once the service has stopped taking requests.
    async fn gather(&self, queue: &mut mpsc::Receiver<Job>) -> Option<Vec<Job>> {
        let first = queue.recv().await?;
        let mut events = first.events.len();
        let mut group = vec![first];
        while events < self.settings.max_events {
            match queue.try_recv() {
                Ok(job) => {
                    events += job.events.len();
                    group.push(job);
                }
                Err(_) => break,
            }
        }
        // Fewer requests waiting than the last group held means some of
        // those publishers are still on their way (their answers just went
        // out): a short wait gathers them, but no more than came last time,
        // so a steady load is never held up by the timer.
        let expected = self.last_group.load(Ordering::Relaxed);
        if group.len() > 1 && group.len() < expected {
            let until = tokio::time::Instant::now() + self.settings.window;
            while events < self.settings.max_events && group.len() < expected {
                match tokio::time::timeout_at(until, queue.recv()).await {
                    Ok(Some(job)) => {
                        events += job.events.len();
                        group.push(job);
                    }
                    _ => break,
                }
            }
        }
        self.last_group.store(group.len(), Ordering::Relaxed);
        Some(group)
    }

    /// Writes one group and answers each of its requests.
    async fn commit(&self, group: Vec<Job>) {
        if group.len() == 1 {
            let mut group = group;
            let job = group.remove(0);
            let result = self.writer.publish_alone(job.events).await;
            let _ = job.reply.send(result);
            return;
        }
        let all = || PreparedBatch::concat(group.iter().map(|job| &job.events));
        match self.writer.write_committed(all).await {
            Ok(mut envelopes) => {
                for job in group {
                    let rest = envelopes.split_off(job.events.len());
                    let _ = job.reply.send(Ok(std::mem::replace(&mut envelopes, rest)));
                }
            }
            Err(Together::Unavailable(error)) => {
                for job in group {
                    let _ = job
                        .reply
                        .send(Err(GroupError::Unavailable(Arc::clone(&error))));
                }
            }
            Err(Together::SomeRequestRefused | Together::Refused { .. }) => {
                // Written again one by one, so only the faulty request fails.
                for job in group {
                    let result = self.writer.publish_alone(job.events).await;
                    let _ = job.reply.send(result);
                }
            }
        }
    }
}

/// How writing a whole group failed.
enum Together {
    /// Not the requests' fault: every request gets it.
    Unavailable(Arc<StoreError>),
    /// Some event was refused by the database: find which request (and
    /// which event), by writing them alone.
    SomeRequestRefused,
    /// The event at `index` (of all the events written together) was
    /// refused before anything was sent.
    Refused { index: usize, error: PublishError },
}

impl Together {
    fn unavailable(error: impl Into<StoreError>) -> Together {
        Together::Unavailable(Arc::new(error.into()))
    }

    fn from_batch(batch: BatchError) -> Together {
        match batch.error {
            PublishError::Database(error) => {
                // Data and constraint errors (classes 22 and 23) are an
                // event's fault; anything else is the database's.
                let class = error.code().map(|c| &c.code()[..2]);
                if matches!(class, Some("22" | "23")) {
                    Together::SomeRequestRefused
                } else {
                    Together::unavailable(error)
                }
            }
            error => Together::Refused {
                index: batch.index,
                error,
            },
        }
    }
}
