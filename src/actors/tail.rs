//! The bounded tail of a scope's recent durable events.
//!
//! The tail answers "everything after seq N" from memory when it can, and
//! says so when it cannot (the reader is behind and pages from the outbox).
//! It is bounded by an event count and by encoded bytes, both read on every
//! publish so operators can change them at run time. It stays contiguous: it
//! only claims to cover seqs after `covers_after`, and a batch that does not
//! follow on from what it holds resets that claim.
//!
//! Nobody waits on the tail: the hub pushes each new event into its
//! subscribers' queues, and the tail only serves catching up at join.

use std::collections::VecDeque;
use std::sync::Arc;

use super::encoded::EncodedEvent;
use super::tail_budget::TailLease;

/// Reads a bound; called on every publish.
pub type Bound = Arc<dyn Fn() -> usize + Send + Sync>;

pub struct Tail {
    entries: VecDeque<Arc<EncodedEvent>>,
    bytes: usize,
    /// The tail holds every event of its scope with a seq above this, as far
    /// as the relay has seen them. `None` until the first batch arrives.
    covers_after: Option<i64>,
    max_events: Bound,
    max_bytes: Bound,
    /// This tail's share of the budget across all tails, when there is one.
    lease: Option<TailLease>,
}

impl Tail {
    pub fn new(max_events: Bound, max_bytes: Bound) -> Self {
        Tail {
            entries: VecDeque::new(),
            bytes: 0,
            covers_after: None,
            max_events,
            max_bytes,
            lease: None,
        }
    }

    /// Counts this tail against a budget shared with other tails.
    pub fn join_budget(&mut self, lease: TailLease) {
        lease.record(self.bytes);
        self.lease = Some(lease);
    }

    /// Drops every entry while still covering everything after the newest
    /// one, so a reader that was caught up keeps reading from memory and an
    /// older one reads the outbox.
    pub fn empty(&mut self) {
        if let Some(newest) = self.entries.back().and_then(|e| e.seq()) {
            self.covers_after = Some(newest);
        }
        self.entries.clear();
        self.bytes = 0;
        if let Some(lease) = &self.lease {
            lease.shrunk(0);
        }
    }

    /// Drops everything and claims to cover nothing, for a hub restarted
    /// after a failure: what it held may be half updated.
    pub fn forget(&mut self) {
        self.entries.clear();
        self.bytes = 0;
        self.covers_after = None;
        if let Some(lease) = &self.lease {
            lease.shrunk(0);
        }
    }

    /// Adds a batch read from the outbox after `read_after`, in seq order.
    pub fn publish(&mut self, read_after: i64, batch: &[Arc<EncodedEvent>]) {
        let last_known = self
            .entries
            .back()
            .and_then(|e| e.seq())
            .or(self.covers_after);
        match last_known {
            // A batch that starts past what we hold would leave a hole.
            Some(last) if read_after <= last => {}
            _ => self.reset(read_after),
        }
        let covers_after = self.covers_after.unwrap_or(read_after);
        for event in batch {
            let Some(seq) = event.seq() else { continue };
            if seq <= covers_after {
                continue;
            }
            // Usually appends; a late commit with a lower seq slots in place.
            let position = self.entries.partition_point(|e| e.seq() < Some(seq));
            if self.entries.get(position).and_then(|e| e.seq()) == Some(seq) {
                continue;
            }
            self.bytes += event.encoded_len();
            self.entries.insert(position, Arc::clone(event));
        }
        self.enforce_bounds();
        if let Some(lease) = &self.lease
            && lease.record(self.bytes)
        {
            self.empty();
        }
    }

    fn reset(&mut self, covers_after: i64) {
        self.entries.clear();
        self.bytes = 0;
        self.covers_after = Some(covers_after);
    }

    fn enforce_bounds(&mut self) {
        let max_events = (self.max_events)();
        let max_bytes = (self.max_bytes)();
        while self.entries.len() > max_events || self.bytes > max_bytes {
            let Some(oldest) = self.entries.pop_front() else {
                break;
            };
            self.bytes -= oldest.encoded_len();
            self.covers_after = oldest.seq();
        }
    }

    /// Events after `after`, or `None` when the tail does not reach back
    /// that far and the reader must page from the outbox.
    pub fn recent(&self, after: i64) -> Option<Vec<Arc<EncodedEvent>>> {
        if let Some(lease) = &self.lease {
            lease.touch();
        }
        let covers_after = self.covers_after?;
        if after < covers_after {
            return None;
        }
        let start = self.entries.partition_point(|e| e.seq() <= Some(after));
        Some(self.entries.range(start..).cloned().collect())
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Encoded bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Utc;
    use eventrelay_wire::NewEvent;
    use serde_json::json;

    fn event(seq: i64, size: usize) -> Arc<EncodedEvent> {
        let mut envelope =
            NewEvent::durable("t", "s", json!({"pad": "x".repeat(size)})).into_envelope(Utc::now());
        envelope.seq = Some(seq);
        Arc::new(EncodedEvent::new(envelope))
    }

    fn tail(events: usize, bytes: usize) -> Tail {
        Tail::new(Arc::new(move || events), Arc::new(move || bytes))
    }

    fn seqs(events: &[Arc<EncodedEvent>]) -> Vec<i64> {
        events.iter().filter_map(|e| e.seq()).collect()
    }

    #[test]
    fn answers_from_memory_inside_the_tail_and_refuses_behind_it() {
        let mut tail = tail(3, usize::MAX);
        assert!(tail.recent(0).is_none(), "an empty new tail covers nothing");
        tail.publish(10, &[event(11, 1), event(12, 1)]);
        assert_eq!(seqs(&tail.recent(10).unwrap()), vec![11, 12]);
        assert_eq!(seqs(&tail.recent(11).unwrap()), vec![12]);
        assert_eq!(seqs(&tail.recent(12).unwrap()), Vec::<i64>::new());
        assert!(tail.recent(9).is_none());
        tail.publish(12, &[event(13, 1), event(15, 1)]);
        assert_eq!(tail.len(), 3);
        assert!(
            tail.recent(10).is_none(),
            "11 was evicted by the count bound"
        );
        assert_eq!(seqs(&tail.recent(11).unwrap()), vec![12, 13, 15]);
        assert_eq!(seqs(&tail.recent(12).unwrap()), vec![13, 15]);
    }

    #[test]
    fn a_batch_that_does_not_follow_on_clears_the_tail() {
        let mut tail = tail(10, usize::MAX);
        tail.publish(0, &[event(1, 1), event(2, 1)]);
        tail.publish(5, &[event(6, 1)]);
        assert_eq!(tail.len(), 1);
        assert!(tail.recent(2).is_none());
        assert_eq!(seqs(&tail.recent(5).unwrap()), vec![6]);
    }

    #[test]
    fn late_commits_slot_in_by_seq_and_duplicates_are_ignored() {
        let mut tail = tail(10, usize::MAX);
        tail.publish(0, &[event(1, 1), event(3, 1)]);
        tail.publish(1, &[event(2, 1), event(3, 1)]);
        assert_eq!(seqs(&tail.recent(0).unwrap()), vec![1, 2, 3]);
    }

    #[test]
    fn the_byte_bound_evicts_oldest_first_and_one_huge_event_empties_it() {
        let one = event(1, 100).encoded_len();
        let mut tail = tail(100, one * 2 + 10);
        tail.publish(0, &[event(1, 100), event(2, 100), event(3, 100)]);
        assert_eq!(seqs(&tail.recent(1).unwrap()), vec![2, 3]);
        assert!(tail.bytes() <= one * 2 + 10);
        tail.publish(3, &[event(4, 10_000)]);
        assert!(tail.is_empty());
        assert_eq!(tail.bytes(), 0);
        assert_eq!(
            tail.recent(4).unwrap().len(),
            0,
            "covers everything after the huge event"
        );
        assert!(tail.recent(3).is_none());
    }

    #[test]
    fn bounds_are_read_on_every_publish() {
        let limit = Arc::new(std::sync::atomic::AtomicUsize::new(5));
        let read = Arc::clone(&limit);
        let mut tail = Tail::new(
            Arc::new(move || read.load(std::sync::atomic::Ordering::Relaxed)),
            Arc::new(|| usize::MAX),
        );
        tail.publish(0, &(1..=5).map(|s| event(s, 1)).collect::<Vec<_>>());
        assert_eq!(tail.len(), 5);
        limit.store(2, std::sync::atomic::Ordering::Relaxed);
        tail.publish(5, &[event(6, 1)]);
        assert_eq!(seqs(&tail.recent(4).unwrap()), vec![5, 6]);
    }
}
