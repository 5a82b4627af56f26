//! A bounded set of envelope ids for at-least-once de-duplication.
//!
//! The relay delivers at least once (a replay after a reconnect may resend
//! events the client already has), so the client drops envelopes whose `id`
//! it has seen. Memory stays bounded: past the bound the oldest id is
//! forgotten, which is safe because replays only reach back a short way.

use std::collections::{HashSet, VecDeque};

use uuid::Uuid;

/// Remembers the most recent `capacity` ids in insertion order.
#[derive(Debug, Clone)]
pub struct SeenIds {
    capacity: usize,
    set: HashSet<Uuid>,
    order: VecDeque<Uuid>,
}

impl SeenIds {
    /// A set holding at most `capacity` ids; zero disables de-duplication.
    pub fn new(capacity: usize) -> Self {
        SeenIds {
            capacity,
            set: HashSet::with_capacity(capacity.min(4096)),
            order: VecDeque::with_capacity(capacity.min(4096)),
        }
    }

    /// Records `id`; returns false when it was already there (a duplicate).
    /// A duplicate does not refresh its position: eviction is by first
    /// sight, which is the order the stream delivered them in.
    pub fn insert(&mut self, id: Uuid) -> bool {
        if self.capacity == 0 {
            return true;
        }
        if !self.set.insert(id) {
            return false;
        }
        self.order.push_back(id);
        while self.order.len() > self.capacity {
            if let Some(oldest) = self.order.pop_front() {
                self.set.remove(&oldest);
            }
        }
        true
    }

    pub fn contains(&self, id: &Uuid) -> bool {
        self.set.contains(id)
    }

    pub fn len(&self) -> usize {
        self.order.len()
    }

    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u128) -> Uuid {
        Uuid::from_u128(n)
    }

    #[test]
    fn a_duplicate_is_reported_once_seen() {
        let mut seen = SeenIds::new(4);
        assert!(seen.insert(id(1)));
        assert!(!seen.insert(id(1)));
        assert!(seen.insert(id(2)));
        assert_eq!(seen.len(), 2);
    }

    #[test]
    fn the_oldest_is_evicted_past_the_bound() {
        let mut seen = SeenIds::new(3);
        for n in 1..=4 {
            assert!(seen.insert(id(n)));
        }
        assert_eq!(seen.len(), 3);
        assert!(!seen.contains(&id(1)));
        assert!(seen.contains(&id(2)) && seen.contains(&id(4)));
        // Forgotten, so accepted again (and it evicts 2 in turn).
        assert!(seen.insert(id(1)));
        assert!(!seen.contains(&id(2)));
    }

    #[test]
    fn a_duplicate_does_not_refresh_its_age() {
        let mut seen = SeenIds::new(2);
        seen.insert(id(1));
        seen.insert(id(2));
        assert!(!seen.insert(id(1)));
        seen.insert(id(3));
        assert!(!seen.contains(&id(1)));
        assert!(seen.contains(&id(2)));
    }

    #[test]
    fn zero_capacity_disables_deduplication() {
        let mut seen = SeenIds::new(0);
        assert!(seen.insert(id(1)));
        assert!(seen.insert(id(1)));
        assert!(seen.is_empty());
    }
}
