//! How a hub's frames reach its streams: one inbox per HTTP worker thread.
//!
//! A stream's task lives on the HTTP worker that accepted its connection,
//! and a hub runs on an arbiter of its own. Waking each stream from the
//! hub's thread costs a cross-thread hand-over per subscriber and event (a
//! locked push onto the worker's run queue, a locked pop off it, and cache
//! lines that bounce between the cores), all while the hub holds a core
//! the workers need for writing. So a hub instead posts each worker a
//! batch per event (the event and the ids of that worker's queues that get
//! it, up to [`BATCH_QUEUES`] at a time) and rings it; a task on the worker
//! pushes the frame into each queue and wakes its stream there, where a
//! wake is a plain push onto the worker's own run queue.
//!
//! A stream's queue is bounded: a subscriber whose queue is full is
//! dropped on the spot (it reconnects and replays), so one slow reader
//! never stalls the others. The hub holds a [`QueueHandle`] per member;
//! dropping it closes the queue, as dropping a channel's sender would, so
//! a hub that restarts or stops ends its streams cleanly.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::future::poll_fn;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use futures_util::task::AtomicWaker;

use super::encoded::EncodedEvent;
use crate::metrics::Metrics;

/// Frames' room an empty queue may keep.
const IDLE_ROOM: usize = 16;

/// What a hub tells a worker.
enum Post {
    /// `event` for each of these queues.
    Frames {
        event: Arc<EncodedEvent>,
        queues: Vec<u64>,
        hub: Arc<HubLabel>,
    },
    /// No more frames for this queue: its stream ends once it has sent
    /// what is queued.
    Close(u64),
}

/// Who posted a batch, for the slow-subscriber count and its log line.
pub struct HubLabel {
    pub scope_key: String,
    pub metrics: Arc<Metrics>,
}

/// A worker's inbox, shared with every hub that has a member on it.
pub struct Inbox {
    posts: Mutex<Vec<Post>>,
    bell: AtomicWaker,
}

impl Inbox {
    fn post(&self, post: Post) {
        self.posts
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(post);
        self.bell.wake();
    }

    fn take(&self) -> Vec<Post> {
        std::mem::take(
            &mut *self
                .posts
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        )
    }
}

/// The hub's end of a stream's queue. Dropping it closes the queue.
pub struct QueueHandle {
    inbox: Arc<Inbox>,
    id: u64,
}

impl QueueHandle {
    fn inbox(&self) -> &Arc<Inbox> {
        &self.inbox
    }
}

impl Drop for QueueHandle {
    fn drop(&mut self) {
        self.inbox.post(Post::Close(self.id));
    }
}

/// Queues per batch: a hub posts a worker's batch as soon as it has this
/// many, so with thousands of subscribers the workers start writing while
/// the hub is still filtering, as they did when it woke each stream itself.
const BATCH_QUEUES: usize = 128;

/// One event's batches, one per worker at a time, as a hub gathers them.
pub struct Batches<'a> {
    event: &'a Arc<EncodedEvent>,
    hub: &'a Arc<HubLabel>,
    batches: Vec<(Arc<Inbox>, Vec<u64>)>,
}

impl<'a> Batches<'a> {
    pub fn new(event: &'a Arc<EncodedEvent>, hub: &'a Arc<HubLabel>) -> Self {
        Batches {
            event,
            hub,
            batches: Vec::new(),
        }
    }

    /// Adds `queue` to its worker's batch, posting the batch once full.
    pub fn add(&mut self, queue: &QueueHandle) {
        let inbox = queue.inbox();
        let at = match self
            .batches
            .iter()
            .position(|(of, _)| Arc::ptr_eq(of, inbox))
        {
            Some(at) => at,
            None => {
                let queues = Vec::with_capacity(BATCH_QUEUES);
                self.batches.push((Arc::clone(inbox), queues));
                self.batches.len() - 1
            }
        };
        let (inbox, queues) = &mut self.batches[at];
        queues.push(queue.id);
        if queues.len() == BATCH_QUEUES {
            let full = std::mem::replace(queues, Vec::with_capacity(BATCH_QUEUES));
            post_frames(inbox, self.event, self.hub, full);
        }
    }
}

fn post_frames(inbox: &Inbox, event: &Arc<EncodedEvent>, hub: &Arc<HubLabel>, queues: Vec<u64>) {
    inbox.post(Post::Frames {
        event: Arc::clone(event),
        queues,
        hub: Arc::clone(hub),
    });
}

impl Drop for Batches<'_> {
    /// Posts what is left of each worker's batch.
    fn drop(&mut self) {
        for (inbox, queues) in std::mem::take(&mut self.batches) {
            if !queues.is_empty() {
                post_frames(&inbox, self.event, self.hub, queues);
            }
        }
    }
}

/// A stream's queue as the worker holds it.
struct QueueState {
    frames: RefCell<VecDeque<Arc<EncodedEvent>>>,
    capacity: usize,
    closed: Cell<bool>,
    waker: RefCell<Option<Waker>>,
}

impl QueueState {
    fn wake(&self) {
        if let Some(waker) = self.waker.borrow_mut().take() {
            waker.wake();
        }
    }
}

/// This thread's inbox, its queues, and whether its delivering task runs.
struct Worker {
    inbox: Arc<Inbox>,
    queues: RefCell<HashMap<u64, Rc<QueueState>>>,
    next_id: Cell<u64>,
    delivering: Cell<bool>,
}

thread_local! {
    static WORKER: Rc<Worker> = Rc::new(Worker {
        inbox: Arc::new(Inbox {
            posts: Mutex::new(Vec::new()),
            bell: AtomicWaker::new(),
        }),
        queues: RefCell::new(HashMap::new()),
        next_id: Cell::new(0),
        delivering: Cell::new(false),
    });
}

impl Worker {
    /// Starts this thread's delivering task if none runs (the first queue
    /// opened here, or a new runtime on a thread whose last one stopped).
    fn ensure_delivering(self: &Rc<Self>) {
        if self.delivering.replace(true) {
            return;
        }
        let worker = Rc::clone(self);
        tokio::task::spawn_local(async move {
            let _running = Running(Rc::clone(&worker));
            loop {
                // Everything posted so far goes out in one round, then the
                // streams it woke write before the next round: under load
                // a stream finds several frames and writes them at once.
                let posts = poll_fn(|cx| worker.next_posts(cx)).await;
                for post in posts {
                    worker.deliver(post);
                }
                tokio::task::yield_now().await;
            }
        });
    }

    fn next_posts(&self, cx: &mut Context<'_>) -> Poll<Vec<Post>> {
        // Registered before looking, so a post made in between still rings.
        self.inbox.bell.register(cx.waker());
        let posts = self.inbox.take();
        if posts.is_empty() {
            Poll::Pending
        } else {
            Poll::Ready(posts)
        }
    }

    fn queue(&self, id: u64) -> Option<Rc<QueueState>> {
        self.queues.borrow().get(&id).cloned()
    }

    fn deliver(&self, post: Post) {
        match post {
            Post::Frames { event, queues, hub } => {
                // Counted locally and added once per batch.
                let mut pushed = 0u64;
                for id in queues {
                    let Some(queue) = self.queue(id) else {
                        continue;
                    };
                    if queue.closed.get() {
                        continue;
                    }
                    let queued = queue.frames.borrow().len();
                    if queued >= queue.capacity {
                        queue.closed.set(true);
                        hub.metrics.slow_subscribers_dropped.inc();
                        // Its queued frames go with it, and this one.
                        hub.metrics.frames_dropped.inc_by(queued as u64 + 1);
                        tracing::info!(
                            scope_key = hub.scope_key,
                            "subscriber too slow for its queue; disconnecting"
                        );
                    } else {
                        queue.frames.borrow_mut().push_back(Arc::clone(&event));
                        pushed += 1;
                    }
                    queue.wake();
                }
                hub.metrics.events_delivered.inc_by(pushed);
            }
            Post::Close(id) => {
                if let Some(queue) = self.queue(id) {
                    queue.closed.set(true);
                    queue.wake();
                }
            }
        }
    }
}

/// Marks the delivering task stopped when its runtime drops it.
struct Running(Rc<Worker>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.delivering.set(false);
    }
}

/// A stream's end of its queue. It lives on the thread that opened it:
/// the HTTP worker running the stream.
pub struct FrameQueue {
    state: Rc<QueueState>,
    worker: Rc<Worker>,
    id: u64,
}

impl FrameQueue {
    /// Opens a queue of `capacity` frames on this thread's worker, and the
    /// handle its hub posts to. Must run inside a `LocalSet` (as every
    /// HTTP worker does).
    pub fn open(capacity: usize) -> (QueueHandle, FrameQueue) {
        let worker = WORKER.with(Rc::clone);
        worker.ensure_delivering();
        let id = worker.next_id.get();
        worker.next_id.set(id + 1);
        let state = Rc::new(QueueState {
            frames: RefCell::new(VecDeque::new()),
            capacity,
            closed: Cell::new(false),
            waker: RefCell::new(None),
        });
        worker.queues.borrow_mut().insert(id, Rc::clone(&state));
        let handle = QueueHandle {
            inbox: Arc::clone(&worker.inbox),
            id,
        };
        (handle, FrameQueue { state, worker, id })
    }

    /// The next frame; `None` once the queue is closed and drained.
    pub async fn recv(&mut self) -> Option<Arc<EncodedEvent>> {
        poll_fn(|cx| self.poll_recv(cx)).await
    }

    fn poll_recv(&self, cx: &mut Context<'_>) -> Poll<Option<Arc<EncodedEvent>>> {
        if let Some(frame) = self.try_recv() {
            return Poll::Ready(Some(frame));
        }
        if self.state.closed.get() {
            return Poll::Ready(None);
        }
        // A burst grew the buffer; an idle stream gives the room back.
        let mut frames = self.state.frames.borrow_mut();
        if frames.capacity() > IDLE_ROOM {
            *frames = VecDeque::new();
        }
        drop(frames);
        let mut waker = self.state.waker.borrow_mut();
        if !waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            *waker = Some(cx.waker().clone());
        }
        Poll::Pending
    }

    /// A frame already queued, if any.
    pub fn try_recv(&self) -> Option<Arc<EncodedEvent>> {
        self.state.frames.borrow_mut().pop_front()
    }

    /// Frames queued now.
    pub fn len(&self) -> usize {
        self.state.frames.borrow().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn capacity(&self) -> usize {
        self.state.capacity
    }
}

impl Drop for FrameQueue {
    fn drop(&mut self) {
        self.worker.queues.borrow_mut().remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Utc;
    use eventrelay_wire::NewEvent;
    use std::time::Duration;

    fn event(n: i64) -> Arc<EncodedEvent> {
        let mut envelope =
            NewEvent::durable("t", "s", serde_json::json!({ "n": n })).into_envelope(Utc::now());
        envelope.seq = Some(n);
        Arc::new(EncodedEvent::new(envelope))
    }

    fn label() -> Arc<HubLabel> {
        Arc::new(HubLabel {
            scope_key: "s".into(),
            metrics: Arc::new(Metrics::new()),
        })
    }

    /// Posts `event` to `queues` from another thread, as a hub does.
    fn post_from_afar(event: Arc<EncodedEvent>, queues: Vec<Arc<QueueHandle>>, hub: Arc<HubLabel>) {
        std::thread::spawn(move || {
            let mut batches = Batches::new(&event, &hub);
            for queue in &queues {
                batches.add(queue);
            }
        })
        .join()
        .unwrap();
    }

    async fn next(queue: &mut FrameQueue) -> Option<Arc<EncodedEvent>> {
        tokio::time::timeout(Duration::from_secs(5), queue.recv())
            .await
            .expect("a frame or the end within the deadline")
    }

    #[actix::test]
    async fn a_post_from_another_thread_reaches_each_queue_in_order() {
        let (a, mut queue_a) = FrameQueue::open(16);
        let (b, mut queue_b) = FrameQueue::open(16);
        let (a, b) = (Arc::new(a), Arc::new(b));
        let hub = label();
        post_from_afar(
            event(1),
            vec![Arc::clone(&a), Arc::clone(&b)],
            Arc::clone(&hub),
        );
        post_from_afar(event(2), vec![Arc::clone(&a)], Arc::clone(&hub));
        assert_eq!(next(&mut queue_a).await.unwrap().seq(), Some(1));
        assert_eq!(next(&mut queue_a).await.unwrap().seq(), Some(2));
        assert_eq!(next(&mut queue_b).await.unwrap().seq(), Some(1));
        assert!(
            queue_b.try_recv().is_none(),
            "b was not in the second batch"
        );
    }

    #[actix::test]
    async fn dropping_the_handle_ends_the_stream_after_what_is_queued() {
        let (handle, mut queue) = FrameQueue::open(16);
        let handle = Arc::new(handle);
        post_from_afar(event(1), vec![Arc::clone(&handle)], label());
        std::thread::spawn(move || drop(handle)).join().unwrap();
        assert_eq!(next(&mut queue).await.unwrap().seq(), Some(1));
        assert!(next(&mut queue).await.is_none(), "closed once drained");
    }

    #[actix::test]
    async fn a_full_queue_is_closed_and_counted_while_the_others_get_the_frame() {
        let (slow, mut slow_queue) = FrameQueue::open(2);
        let (fast, mut fast_queue) = FrameQueue::open(16);
        let (slow, fast) = (Arc::new(slow), Arc::new(fast));
        let hub = label();
        for n in 1..=3 {
            post_from_afar(
                event(n),
                vec![Arc::clone(&slow), Arc::clone(&fast)],
                Arc::clone(&hub),
            );
            assert_eq!(next(&mut fast_queue).await.unwrap().seq(), Some(n));
        }
        assert_eq!(hub.metrics.slow_subscribers_dropped.get(), 1);
        assert_eq!(
            hub.metrics.events_delivered.get(),
            5,
            "three to one, two to the other"
        );
        assert_eq!(hub.metrics.frames_dropped.get(), 3);
        // What was queued before it filled still goes out, then the end.
        assert_eq!(next(&mut slow_queue).await.unwrap().seq(), Some(1));
        assert_eq!(next(&mut slow_queue).await.unwrap().seq(), Some(2));
        assert!(next(&mut slow_queue).await.is_none());
    }

    #[actix::test]
    async fn a_post_for_a_queue_that_ended_reaches_no_other() {
        let (old, old_queue) = FrameQueue::open(16);
        drop(old_queue);
        let (_new, new_queue) = FrameQueue::open(16);
        post_from_afar(event(1), vec![Arc::new(old)], label());
        // Posted after the stale one, so delivered after it.
        let (probe, mut probe_queue) = FrameQueue::open(16);
        post_from_afar(event(2), vec![Arc::new(probe)], label());
        assert_eq!(next(&mut probe_queue).await.unwrap().seq(), Some(2));
        assert!(new_queue.try_recv().is_none());
    }

    #[actix::test]
    async fn an_idle_queue_gives_back_the_room_a_burst_took() {
        let (handle, mut queue) = FrameQueue::open(2048);
        let handle = Arc::new(handle);
        let hub = label();
        for n in 0..1000 {
            post_from_afar(event(n), vec![Arc::clone(&handle)], Arc::clone(&hub));
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while queue.len() < 1000 {
            assert!(tokio::time::Instant::now() < deadline, "the burst arrived");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert!(queue.state.frames.borrow().capacity() >= 1000);
        for n in 0..1000 {
            assert_eq!(next(&mut queue).await.unwrap().seq(), Some(n));
        }
        let waiting = tokio::time::timeout(Duration::from_millis(10), queue.recv()).await;
        assert!(waiting.is_err(), "nothing more was posted");
        assert!(queue.state.frames.borrow().capacity() <= IDLE_ROOM);
    }

    #[actix::test]
    async fn more_queues_than_a_batch_holds_all_get_the_frame() {
        let count = BATCH_QUEUES * 2 + 7;
        let (handles, mut queues): (Vec<_>, Vec<_>) =
            (0..count).map(|_| FrameQueue::open(4)).unzip();
        let handles: Vec<_> = handles.into_iter().map(Arc::new).collect();
        let hub = label();
        post_from_afar(event(1), handles.clone(), Arc::clone(&hub));
        for queue in &mut queues {
            assert_eq!(next(queue).await.unwrap().seq(), Some(1));
        }
        assert_eq!(hub.metrics.events_delivered.get(), count as u64);
    }

    #[actix::test]
    async fn what_arrived_meanwhile_is_handed_out_in_one_round() {
        let (handle, mut queue) = FrameQueue::open(64);
        let handle = Arc::new(handle);
        let hub = label();
        for n in 1..=10 {
            post_from_afar(event(n), vec![Arc::clone(&handle)], Arc::clone(&hub));
        }
        // Woken once for all ten: a stream that finds several frames writes
        // them in one chunk, which is what keeps up under load.
        assert_eq!(next(&mut queue).await.unwrap().seq(), Some(1));
        assert_eq!(queue.len(), 9);
    }
}
