//! The two reads every stream opening from the outbox makes, shared by the
//! streams that need the same one at the same time.
//!
//! Opening a stream reads the scope's join view, and a stream that resumes
//! from a `Last-Event-ID` the scope's tail cannot serve reads the outbox
//! after it. One stream at a time, that is two short queries. When a relay
//! restarts, every client it held comes back within seconds, nearly all
//! with the same few scopes and the same `Last-Event-ID`s: tens of
//! thousands of identical queries queued for a pool of a few connections,
//! and the queue, not the database, decided how long the storm lasted.
//!
//! So each read goes through a [`Coalescer`]: requests for the same key
//! that arrive while a read of that key is running wait for the next one,
//! and that one read answers all of them. A request is only ever answered
//! by a read that started after it arrived, so what it sees is as fresh as
//! a read of its own would have been: a join view still shows every commit
//! before the stream asked, and a replay page every row committed then.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::future::Future;
use std::hash::Hash;
use std::sync::{Arc, Mutex};

use eventrelay_wire::{ResumeCursor, Subscriber};
use tokio::sync::oneshot;

use crate::actors::encoded::EncodedEvent;
use crate::store::{Database, JoinView, Outbox, StoreError, Window};

/// Events a replay reads per page.
pub const REPLAY_PAGE: i64 = 500;

/// What one read gave every request it answered.
pub type Shared<V> = Result<Arc<V>, Arc<StoreError>>;

/// What a replayed frame's `id:` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stamp {
    /// The same cursor on every frame: for late commits replayed from
    /// below a client's cursor, after which it still stands where it stood.
    Fixed(ResumeCursor),
    /// Each frame's own seq with this horizon, or, when `None`, with the
    /// xmin of the snapshot the page was read in.
    Horizon(Option<u64>),
}

/// One page of a scope's outbox, encoded once for every stream that asked
/// for it.
#[derive(Debug)]
pub struct ReplayPage {
    pub events: Vec<Arc<EncodedEvent>>,
    /// The highest seq on the page, where the next page starts.
    pub last_seq: Option<i64>,
    /// Whether the page was full, so more rows may follow.
    pub full: bool,
    /// The xmin of the snapshot the page was read in.
    pub snapshot_xmin: u64,
}

impl ReplayPage {
    /// The events on the page `subscriber` may see.
    pub fn permitted_for(&self, subscriber: &Subscriber) -> Vec<Arc<EncodedEvent>> {
        self.events
            .iter()
            .filter(|event| event.is_permitted_for(subscriber))
            .cloned()
            .collect()
    }
}

/// Reads of one kind, keyed by what they read; see the module docs.
pub struct Coalescer<K, V> {
    /// Per key with a read running: who waits for the next read.
    waiting: Mutex<HashMap<K, Vec<oneshot::Sender<Shared<V>>>>>,
}

impl<K, V> Default for Coalescer<K, V> {
    fn default() -> Self {
        Coalescer {
            waiting: Mutex::new(HashMap::new()),
        }
    }
}

impl<K, V> Coalescer<K, V>
where
    K: Eq + Hash + Clone + 'static,
    V: 'static,
{
    /// The result of a read of `key` that starts after this call. The first
    /// request for a key starts a task that reads with `read` for as long
    /// as requests keep arriving; it runs apart from the request, so a
    /// client that leaves never strands the others waiting on the read.
    pub async fn read<F, Fut>(self: &Arc<Self>, key: K, read: F) -> Shared<V>
    where
        F: Fn(K) -> Fut + 'static,
        Fut: Future<Output = Result<V, StoreError>> + 'static,
    {
        let (answer, answered) = oneshot::channel();
        let start = match self.lock().entry(key.clone()) {
            Entry::Occupied(mut waiting) => {
                waiting.get_mut().push(answer);
                false
            }
            Entry::Vacant(vacant) => {
                vacant.insert(vec![answer]);
                true
            }
        };
        if start {
            let this = Arc::clone(self);
            actix_web::rt::spawn(async move { this.run(key, read).await });
        }
        answered.await.unwrap_or_else(|_| {
            // The reading task ended without answering: only a panic in
            // `read` does that.
            Err(Arc::new(StoreError::Abandoned))
        })
    }

    /// Reads `key` for each batch of requests that gathered during the
    /// previous read, until a read ends with none waiting.
    async fn run<F, Fut>(&self, key: K, read: F)
    where
        F: Fn(K) -> Fut,
        Fut: Future<Output = Result<V, StoreError>>,
    {
        loop {
            let batch = {
                let mut waiting = self.lock();
                match waiting.get_mut(&key) {
                    Some(batch) if !batch.is_empty() => std::mem::take(batch),
                    _ => {
                        waiting.remove(&key);
                        return;
                    }
                }
            };
            let result = read(key.clone()).await.map(Arc::new).map_err(Arc::new);
            for answer in batch {
                let _ = answer.send(result.clone());
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<K, Vec<oneshot::Sender<Shared<V>>>>> {
        // Nothing panics while holding the lock; a poisoned map is still
        // consistent.
        self.waiting
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// What a replay page is read by: its scope, its window of the outbox, and
/// how its frames are stamped.
type PageKey = (Arc<str>, Window, Stamp);

/// The join views and replay pages of this relay's opening streams.
#[derive(Clone)]
pub struct SharedReads {
    db: Database,
    outbox: Outbox,
    joins: Arc<Coalescer<Arc<str>, JoinView>>,
    pages: Arc<Coalescer<PageKey, ReplayPage>>,
}

impl SharedReads {
    pub fn new(db: Database, outbox: Outbox) -> Self {
        SharedReads {
            db,
            outbox,
            joins: Arc::default(),
            pages: Arc::default(),
        }
    }

    /// The scope's join view, read after this call.
    pub async fn join_view(&self, scope_key: &str) -> Shared<JoinView> {
        let (db, outbox) = (self.db.clone(), self.outbox.clone());
        self.joins
            .read(Arc::from(scope_key), move |scope: Arc<str>| {
                let (db, outbox) = (db.clone(), outbox.clone());
                async move {
                    let client = db.get().await?;
                    outbox.join_view(&client, &scope).await
                }
            })
            .await
    }

    /// The id of the event at `seq`, if the outbox holds one: what a
    /// resume cursor's check is compared with.
    pub async fn event_at(&self, seq: i64) -> Result<Option<uuid::Uuid>, StoreError> {
        let client = self.db.get().await?;
        self.outbox.event_at(&client, seq).await
    }

    /// The page of the scope's outbox in `window`, its frames stamped as
    /// `stamp` says, read after this call.
    pub async fn replay_page(
        &self,
        scope_key: &str,
        window: Window,
        stamp: Stamp,
    ) -> Shared<ReplayPage> {
        let (db, outbox) = (self.db.clone(), self.outbox.clone());
        self.pages
            .read(
                (Arc::from(scope_key), window, stamp),
                move |(scope, window, stamp): (Arc<str>, Window, Stamp)| {
                    let (db, outbox) = (db.clone(), outbox.clone());
                    async move {
                        let client = db.get().await?;
                        let page = outbox
                            .read_window(&client, &scope, window, REPLAY_PAGE)
                            .await?;
                        let snapshot_xmin = page.snapshot_xmin;
                        let cursor = |seq: i64, id: &uuid::Uuid| match stamp {
                            Stamp::Fixed(cursor) => cursor,
                            Stamp::Horizon(horizon) => {
                                ResumeCursor::at(seq, horizon.unwrap_or(snapshot_xmin)).naming(id)
                            }
                        };
                        Ok(ReplayPage {
                            full: page.returned as i64 == REPLAY_PAGE,
                            last_seq: page.last_seq,
                            snapshot_xmin,
                            events: page
                                .rows
                                .into_iter()
                                .map(|row| {
                                    let seq = row.envelope.seq.unwrap_or_default();
                                    let cursor = cursor(seq, &row.envelope.id);
                                    Arc::new(EncodedEvent::replayed(row.envelope, cursor))
                                })
                                .collect(),
                        })
                    }
                },
            )
            .await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use tokio::sync::watch;

    use super::*;

    /// A read that counts itself and, while `held` is true, waits.
    fn gated(
        reads: &Arc<AtomicUsize>,
        held: &watch::Receiver<bool>,
    ) -> impl Fn(&'static str) -> std::pin::Pin<Box<dyn Future<Output = Result<usize, StoreError>>>>
    + use<> {
        let (reads, held) = (Arc::clone(reads), held.clone());
        move |_key| {
            let n = reads.fetch_add(1, Ordering::SeqCst) + 1;
            let mut held = held.clone();
            Box::pin(async move {
                held.wait_for(|held| !held).await.unwrap();
                Ok(n)
            })
        }
    }

    async fn until_reads(reads: &AtomicUsize, n: usize) {
        tokio::time::timeout(Duration::from_secs(10), async {
            while reads.load(Ordering::SeqCst) < n {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the reads start");
    }

    #[actix_web::test]
    async fn requests_arriving_during_a_read_share_the_next_one() {
        let coalescer = Arc::new(Coalescer::<&'static str, usize>::default());
        let reads = Arc::new(AtomicUsize::new(0));
        let (hold, held) = watch::channel(true);
        let first = actix_web::rt::spawn({
            let (coalescer, read) = (Arc::clone(&coalescer), gated(&reads, &held));
            async move { coalescer.read("scope", read).await }
        });
        until_reads(&reads, 1).await;
        let later: Vec<_> = (0..5)
            .map(|_| {
                let (coalescer, read) = (Arc::clone(&coalescer), gated(&reads, &held));
                actix_web::rt::spawn(async move { coalescer.read("scope", read).await })
            })
            .collect();
        // Let every later request register before the first read ends.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        hold.send(false).unwrap();
        // The first request saw the first read; every later one the second,
        // which started after they all arrived.
        assert_eq!(*first.await.unwrap().unwrap(), 1);
        for request in later {
            assert_eq!(*request.await.unwrap().unwrap(), 2);
        }
        assert_eq!(reads.load(Ordering::SeqCst), 2);
        assert!(coalescer.lock().is_empty(), "nothing left waiting");
    }

    #[actix_web::test]
    async fn different_keys_are_read_apart() {
        let coalescer = Arc::new(Coalescer::<&'static str, usize>::default());
        let reads = Arc::new(AtomicUsize::new(0));
        let (_hold, held) = watch::channel(false);
        let (a, b) = tokio::join!(
            coalescer.read("a", gated(&reads, &held)),
            coalescer.read("b", gated(&reads, &held))
        );
        let mut seen = [*a.unwrap(), *b.unwrap()];
        seen.sort();
        assert_eq!(seen, [1, 2]);
    }

    #[actix_web::test]
    async fn a_request_that_leaves_strands_no_one() {
        let coalescer = Arc::new(Coalescer::<&'static str, usize>::default());
        let reads = Arc::new(AtomicUsize::new(0));
        let (hold, held) = watch::channel(true);
        let leaving = actix_web::rt::spawn({
            let (coalescer, read) = (Arc::clone(&coalescer), gated(&reads, &held));
            async move { coalescer.read("scope", read).await }
        });
        until_reads(&reads, 1).await;
        let staying = actix_web::rt::spawn({
            let (coalescer, read) = (Arc::clone(&coalescer), gated(&reads, &held));
            async move { coalescer.read("scope", read).await }
        });
        tokio::task::yield_now().await;
        leaving.abort();
        hold.send(false).unwrap();
        assert_eq!(*staying.await.unwrap().unwrap(), 2);
    }

    #[actix_web::test]
    async fn a_failed_read_answers_every_request_with_its_error() {
        let coalescer = Arc::new(Coalescer::<&'static str, usize>::default());
        let (a, b) = tokio::join!(
            coalescer.read("scope", |_| async { Err(StoreError::NoRow("test")) }),
            coalescer.read("scope", |_| async { Err(StoreError::NoRow("test")) })
        );
        for answer in [a, b] {
            assert!(matches!(*answer.unwrap_err(), StoreError::NoRow("test")));
        }
    }
}
