//! One memory budget shared by every scope's tail.
//!
//! Each tail is bounded on its own (`hub.tail_events`, `hub.tail_bytes`),
//! but with thousands of active scopes those bounds add up without limit.
//! The budget (`hub.tails_max_bytes`) caps the sum. Every tail reports its
//! size and when it was last used; when a publish takes the sum over the
//! budget, the least recently used tails are asked to empty themselves.
//! An emptied tail covers nothing, so its next replay reads the outbox:
//! memory is traded for a database read, never for a lost event.
//!
//! Tails live in hubs on several threads, so the shrinking is a message to
//! the hub ([`ShrinkTail`]), and the bookkeeping is atomics plus one map
//! that is locked only when tails join, leave, or the budget is exceeded.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use actix::{Message, WeakRecipient};
use prometheus_client::metrics::gauge::Gauge;

/// Asks a hub to empty its tail, because the budget across tails ran out.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ShrinkTail;

/// The budget shared by every tail of a relay.
pub struct TailBudget {
    max_bytes: usize,
    used: AtomicUsize,
    /// `used`, exported.
    gauge: Gauge,
    /// A logical clock: bigger is more recent.
    clock: AtomicU64,
    next_id: AtomicU64,
    tails: Mutex<HashMap<u64, Registered>>,
}

/// What the budget knows of one tail, shared with the tail's lease.
struct Usage {
    bytes: AtomicUsize,
    last_used: AtomicU64,
    /// A shrink was asked for and not yet done: don't ask again.
    shrinking: AtomicBool,
}

struct Registered {
    usage: Arc<Usage>,
    /// Weak, so the budget never keeps a hub alive.
    shrink: WeakRecipient<ShrinkTail>,
}

impl TailBudget {
    pub fn new(max_bytes: usize, gauge: Gauge) -> Arc<TailBudget> {
        Arc::new(TailBudget {
            max_bytes,
            used: AtomicUsize::new(0),
            gauge,
            clock: AtomicU64::new(0),
            next_id: AtomicU64::new(0),
            tails: Mutex::new(HashMap::new()),
        })
    }

    /// Bytes held by all tails together.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    pub fn max_bytes(&self) -> usize {
        self.max_bytes
    }

    /// Registers a tail, which `shrink` reaches.
    pub fn join(self: &Arc<Self>, shrink: WeakRecipient<ShrinkTail>) -> TailLease {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let usage = Arc::new(Usage {
            bytes: AtomicUsize::new(0),
            last_used: AtomicU64::new(self.tick()),
            shrinking: AtomicBool::new(false),
        });
        self.lock().insert(
            id,
            Registered {
                usage: Arc::clone(&usage),
                shrink,
            },
        );
        TailLease {
            id,
            budget: Arc::clone(self),
            usage,
        }
    }

    fn add(&self, bytes: usize) {
        let used = self.used.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.gauge.set(used as i64);
    }

    fn sub(&self, bytes: usize) {
        let used = self
            .used
            .fetch_sub(bytes, Ordering::Relaxed)
            .saturating_sub(bytes);
        self.gauge.set(used as i64);
    }

    fn tick(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::Relaxed) + 1
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Registered>> {
        // The map holds plain bookkeeping; a panic elsewhere while it was
        // held leaves nothing half-written that matters.
        self.tails
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Asks the least recently used tails other than `except` to empty,
    /// until what they hold brings the sum an eighth below the budget. The
    /// margin means one reclaim makes room for many publishes, instead of
    /// one sort of every tail per publish once the budget is reached.
    fn reclaim(&self, except: u64) {
        let used = self.used();
        if used <= self.max_bytes {
            return;
        }
        let mut excess = used - (self.max_bytes - self.max_bytes / 8);
        let tails = self.lock();
        let mut candidates: Vec<(&u64, &Registered)> = tails
            .iter()
            .filter(|(id, t)| **id != except && t.usage.bytes.load(Ordering::Relaxed) > 0)
            .collect();
        candidates.sort_by_key(|(_, t)| t.usage.last_used.load(Ordering::Relaxed));
        for (_, tail) in candidates {
            let bytes = tail.usage.bytes.load(Ordering::Relaxed);
            // Already asked: its bytes are on their way out.
            if !tail.usage.shrinking.swap(true, Ordering::Relaxed)
                && let Some(shrink) = tail.shrink.upgrade()
            {
                shrink.do_send(ShrinkTail);
            }
            excess = excess.saturating_sub(bytes);
            if excess == 0 {
                break;
            }
        }
    }
}

/// One tail's place in the budget; leaving is dropping it.
pub struct TailLease {
    id: u64,
    budget: Arc<TailBudget>,
    usage: Arc<Usage>,
}

impl TailLease {
    /// Records the tail's new size and marks it used. When the budget is
    /// exceeded, colder tails are asked to shrink; a tail that alone holds
    /// more than the budget (its own bound is larger) is told so by the
    /// answer, `true` meaning "empty yourself too".
    pub fn record(&self, bytes: usize) -> bool {
        self.touch();
        let before = self.usage.bytes.swap(bytes, Ordering::Relaxed);
        if bytes >= before {
            self.budget.add(bytes - before);
        } else {
            self.budget.sub(before - bytes);
        }
        if self.budget.used() > self.budget.max_bytes {
            self.budget.reclaim(self.id);
        }
        bytes > self.budget.max_bytes
    }

    /// Marks the tail used (a replay read it).
    pub fn touch(&self) {
        self.usage
            .last_used
            .store(self.budget.tick(), Ordering::Relaxed);
    }

    /// A requested shrink is done.
    pub fn shrunk(&self, bytes: usize) {
        self.usage.shrinking.store(false, Ordering::Relaxed);
        let before = self.usage.bytes.swap(bytes, Ordering::Relaxed);
        self.budget.sub(before.saturating_sub(bytes));
    }
}

impl Drop for TailLease {
    fn drop(&mut self) {
        let bytes = self.usage.bytes.swap(0, Ordering::Relaxed);
        self.budget.sub(bytes);
        self.budget.lock().remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::actors::tail::Tail;
    use actix::{Actor, AsyncContext, Context, Handler};
    use std::time::Duration;

    /// A tail in an actor of its own, as hubs hold them.
    struct Holder(Tail);

    impl Actor for Holder {
        type Context = Context<Self>;
    }

    impl Handler<ShrinkTail> for Holder {
        type Result = ();
        fn handle(&mut self, _: ShrinkTail, _: &mut Context<Self>) {
            self.0.empty();
        }
    }

    #[derive(Message)]
    #[rtype(result = "(usize, usize)")]
    struct Publish(i64, usize);

    impl Handler<Publish> for Holder {
        type Result = actix::MessageResult<Publish>;
        /// Publishes one event, following on from the one before, and
        /// answers the tail's bytes and events.
        fn handle(&mut self, msg: Publish, _: &mut Context<Self>) -> Self::Result {
            let mut envelope = eventrelay_wire::NewEvent::durable(
                "t",
                "s",
                serde_json::json!({"pad": "x".repeat(msg.1)}),
            )
            .into_envelope(chrono::Utc::now());
            envelope.seq = Some(msg.0);
            let event = Arc::new(crate::actors::EncodedEvent::new(envelope));
            self.0.publish(msg.0 - 1, &[event]);
            actix::MessageResult((self.0.bytes(), self.0.len()))
        }
    }

    fn holder(budget: &Arc<TailBudget>) -> actix::Addr<Holder> {
        let unbounded: crate::actors::tail::Bound = Arc::new(|| usize::MAX);
        let budget = Arc::clone(budget);
        Holder::create(move |ctx| {
            let mut tail = Tail::new(Arc::clone(&unbounded), unbounded);
            tail.join_budget(budget.join(ctx.address().downgrade().recipient()));
            Holder(tail)
        })
    }

    async fn until(deadline: Duration, mut condition: impl FnMut() -> bool) {
        let start = std::time::Instant::now();
        while !condition() {
            assert!(start.elapsed() < deadline, "condition not met in time");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    #[actix::test]
    async fn the_least_recently_used_tails_empty_first_and_the_sum_holds() {
        let budget = TailBudget::new(11_000, Gauge::default());
        let tails: Vec<_> = (0..4).map(|_| holder(&budget)).collect();
        // Each tail takes about 3 KB, oldest use first; the reclaim aims an
        // eighth below the budget, which one emptied tail covers.
        for (n, tail) in tails.iter().enumerate() {
            tail.send(Publish(n as i64 + 1, 3_000)).await.unwrap();
        }
        until(Duration::from_secs(5), || budget.used() <= 11_000).await;
        // The first tail was the coldest: it was emptied, so it holds only
        // what came after.
        let (bytes, events) = tails[0].send(Publish(2, 10)).await.unwrap();
        assert_eq!(events, 1, "the coldest tail was emptied");
        assert!(bytes < 1_000, "{bytes}");
        // The others kept their events.
        for (n, tail) in tails.iter().enumerate().skip(1) {
            let (bytes, events) = tail.send(Publish(n as i64 + 2, 10)).await.unwrap();
            assert_eq!(events, 2, "tail {n} kept its event");
            assert!(bytes > 3_000);
        }
        drop(tails);
        until(Duration::from_secs(5), || budget.used() == 0).await;
    }

    #[actix::test]
    async fn a_tail_larger_than_the_whole_budget_empties_itself() {
        let budget = TailBudget::new(1_000, Gauge::default());
        let tail = holder(&budget);
        let (bytes, _) = tail.send(Publish(1, 5_000)).await.unwrap();
        assert_eq!(bytes, 0);
        assert_eq!(budget.used(), 0);
    }
}
