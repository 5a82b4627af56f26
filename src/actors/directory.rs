//! Which hub serves which scope, readable from any thread: the relay
//! writes it as it starts and drops hubs, and the publish handlers read it
//! to hand an ephemeral event straight to its scope's hub. Going through
//! the relay actor instead would cost one more thread to wake before the
//! first subscriber's write.
//!
//! It holds weak handles, so it never keeps a hub running: a hub stops
//! when the relay drops its scope, whatever the directory still says.

use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock};

use super::hub::{HubHandle, WeakHub};

#[derive(Clone, Default)]
pub struct HubDirectory {
    hubs: Arc<RwLock<HashMap<String, WeakHub>>>,
}

impl HubDirectory {
    /// The running hub of `scope_key`, if this relay has one.
    pub fn get(&self, scope_key: &str) -> Option<HubHandle> {
        self.hubs
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(scope_key)
            .and_then(WeakHub::upgrade)
    }

    pub(super) fn insert(&self, scope_key: &str, hub: &HubHandle) {
        self.hubs
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(scope_key.to_owned(), hub.downgrade());
    }

    pub(super) fn remove(&self, scope_key: &str) {
        self.hubs
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(scope_key);
    }

    pub(super) fn clear(&self) {
        self.hubs
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    /// Scopes listed, for tests.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.hubs
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::actors::hub::Hub;
    use crate::actors::tail::Bound;
    use crate::actors::tail_budget::TailBudget;
    use crate::metrics::Metrics;

    fn hub() -> HubHandle {
        let metrics = Arc::new(Metrics::default());
        let max_events: Bound = Arc::new(|| 16);
        let max_bytes: Bound = Arc::new(|| 1 << 20);
        let budget = TailBudget::new(1 << 20, Default::default());
        Hub::new("s".into(), max_events, max_bytes, budget, metrics)
            .start_on(&actix::Arbiter::current())
    }

    #[actix::test]
    async fn a_listed_hub_is_found_until_it_is_removed() {
        let directory = HubDirectory::default();
        let addr = hub();
        directory.insert("s", &addr);
        assert!(directory.get("s").is_some());
        assert!(directory.get("other").is_none());
        directory.remove("s");
        assert!(directory.get("s").is_none());
        assert_eq!(directory.len(), 0);
    }

    #[actix::test]
    async fn the_directory_does_not_keep_a_hub_alive() {
        let directory = HubDirectory::default();
        let addr = hub();
        directory.insert("s", &addr);
        let weak = addr.downgrade();
        drop(addr);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while weak.upgrade().is_some_and(|a| a.connected()) {
            assert!(std::time::Instant::now() < deadline, "the hub did not stop");
            actix::clock::sleep(std::time::Duration::from_millis(5)).await;
        }
        assert!(directory.get("s").is_none_or(|a| !a.connected()));
    }
}
