//! The per-subscriber connection cap. Taking a permit counts a connection;
//! dropping it (when the stream ends) gives it back.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Counts open streams per (scope, subscriber).
#[derive(Debug)]
pub struct ConnectionLimiter {
    max: usize,
    open: Mutex<HashMap<(String, String), usize>>,
}

/// One counted connection.
#[derive(Debug)]
pub struct ConnectionPermit {
    limiter: Arc<ConnectionLimiter>,
    key: (String, String),
}

impl ConnectionLimiter {
    pub fn new(max: usize) -> Arc<Self> {
        Arc::new(ConnectionLimiter {
            max,
            open: Mutex::new(HashMap::new()),
        })
    }

    /// A permit, or `None` when the subscriber already has `max` streams.
    pub fn acquire(
        self: &Arc<Self>,
        scope_key: &str,
        subscriber_id: &str,
    ) -> Option<ConnectionPermit> {
        let key = (scope_key.to_owned(), subscriber_id.to_owned());
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let count = open.entry(key.clone()).or_insert(0);
        if *count >= self.max {
            return None;
        }
        *count += 1;
        Some(ConnectionPermit {
            limiter: Arc::clone(self),
            key,
        })
    }

    /// Open streams for one subscriber.
    pub fn open(&self, scope_key: &str, subscriber_id: &str) -> usize {
        let open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        open.get(&(scope_key.to_owned(), subscriber_id.to_owned()))
            .copied()
            .unwrap_or(0)
    }
}

impl Drop for ConnectionPermit {
    fn drop(&mut self) {
        let mut open = self.limiter.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = open.get_mut(&self.key) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_per_subscriber_and_releases_on_drop() {
        let limiter = ConnectionLimiter::new(2);
        let a = limiter.acquire("s", "alice").unwrap();
        let _b = limiter.acquire("s", "alice").unwrap();
        assert!(limiter.acquire("s", "alice").is_none());
        assert!(limiter.acquire("s", "bob").is_some());
        assert!(limiter.acquire("other", "alice").is_some());
        drop(a);
        assert_eq!(limiter.open("s", "alice"), 1);
        assert!(limiter.acquire("s", "alice").is_some());
    }
}
