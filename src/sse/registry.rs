//! Every stream open on this relay, by subscriber: what enforces the
//! per-subscriber connection cap across scopes, lists who is connected for
//! the admin API, and ends a subscriber's streams at once when it is
//! disconnected (here, or on another relay through the database), keeping
//! a deny-list until the disconnection's expiry.
//!
//! It is one mutex around small maps, touched when a stream opens or
//! closes and when an operator acts: never on the delivery path.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use chrono::{DateTime, Utc};
use futures_util::task::AtomicWaker;

use crate::store::disconnections::Disconnection;

/// Why a stream may not open.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("subscriber already has {0} open streams on this relay; close one first")]
    TooManyStreams(usize),
    #[error("subscriber was disconnected by an operator until {0}")]
    Denied(DateTime<Utc>),
}

/// One open stream, as the admin API lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenStream {
    pub id: u64,
    pub subscriber: String,
    /// Its first scope.
    pub scope_key: String,
    /// The stream's other scopes, when it carries several.
    pub more_scopes: Vec<String>,
    pub connected_at: DateTime<Utc>,
}

impl OpenStream {
    /// Every scope the stream carries, in the stream's order.
    pub fn scopes(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.scope_key.as_str()).chain(self.more_scopes.iter().map(String::as_str))
    }
}

/// A subscriber shut out until `until`, in one scope or in all.
#[derive(Debug, Clone)]
struct Denial {
    scope_key: Option<String>,
    until: DateTime<Utc>,
}

struct Entry {
    stream: OpenStream,
    /// Told when the stream is to end (revoked, or the relay closing).
    end: EndSignal,
}

/// Why a stream is told to end before its time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// An operator disconnected its subscriber: it ends with a `revoked`
    /// frame, so the client does not reconnect.
    Revoked,
    /// The relay is shutting down: it ends cleanly, and the client
    /// reconnects elsewhere.
    Closing,
}

/// Tells one stream to end. A flag word and one waker slot, touched only by
/// the stream's own task and by whoever ends it: a live stream checks it
/// beside its queue on every event, so it must cost no lock and share no
/// cache line with other streams. (A `Notify` takes a mutex to register
/// each wait, and one shared by every stream, as a shutdown `watch` is,
/// has every worker contend on it per delivered event.)
#[derive(Clone, Default)]
pub struct EndSignal(Arc<EndState>);

#[derive(Default)]
struct EndState {
    /// `REVOKED` and `CLOSING` bits.
    ends: AtomicU8,
    /// Of a stream carrying several scopes: one bit per scope (by its place
    /// in the stream) an operator took out of it.
    removed: AtomicU64,
    waker: AtomicWaker,
}

const REVOKED: u8 = 1;
const CLOSING: u8 = 2;

impl EndSignal {
    /// True once the stream is revoked.
    pub fn is_revoked(&self) -> bool {
        self.0.ends.load(Ordering::Acquire) & REVOKED != 0
    }

    /// Why the stream must end, if it must; a revocation outranks a
    /// shutdown, so its client learns not to come back.
    pub fn ended(&self) -> Option<End> {
        let ends = self.0.ends.load(Ordering::Acquire);
        if ends & REVOKED != 0 {
            Some(End::Revoked)
        } else if ends & CLOSING != 0 {
            Some(End::Closing)
        } else {
            None
        }
    }

    /// Ready once the stream must end. Only one task may wait on a signal
    /// (the stream's own): a second waiter takes the first one's place.
    pub fn poll_ended(&self, cx: &mut Context<'_>) -> Poll<End> {
        if let Some(end) = self.ended() {
            return Poll::Ready(end);
        }
        // Registered, then read again, so an end between the two still
        // wakes this task.
        self.0.waker.register(cx.waker());
        match self.ended() {
            Some(end) => Poll::Ready(end),
            None => Poll::Pending,
        }
    }

    /// Resolves once the stream must end (see [`Self::poll_ended`]).
    pub fn wait(&self) -> impl Future<Output = End> + '_ {
        std::future::poll_fn(|cx| self.poll_ended(cx))
    }

    /// The scopes (one bit each, by place) taken out of the stream.
    pub fn removed_scopes(&self) -> u64 {
        self.0.removed.load(Ordering::Acquire)
    }

    /// Takes the scope at `index` of a stream of `count` scopes out of it,
    /// or ends the stream as revoked when it was its last; false when that
    /// was done already.
    fn remove_scope(&self, index: usize, count: usize) -> bool {
        let bit = 1u64 << index;
        let before = self.0.removed.fetch_or(bit, Ordering::AcqRel);
        let every = if count >= 64 {
            u64::MAX
        } else {
            (1u64 << count) - 1
        };
        if (before | bit) & every == every {
            return self.end(End::Revoked);
        }
        self.0.waker.wake();
        before & bit == 0
    }

    /// Marks the stream's end; false when it was marked so already.
    fn end(&self, why: End) -> bool {
        let bit = match why {
            End::Revoked => REVOKED,
            End::Closing => CLOSING,
        };
        let first = self.0.ends.fetch_or(bit, Ordering::AcqRel) & bit == 0;
        self.0.waker.wake();
        first
    }
}

#[derive(Default)]
struct Inner {
    /// Disconnections applied by this relay when it recorded them, so the
    /// poll that reads them back from the database skips them.
    applied: std::collections::HashSet<i64>,
    next_id: u64,
    /// By id, so listings page in a stable order.
    streams: BTreeMap<u64, Entry>,
    per_subscriber: HashMap<String, usize>,
    /// Open streams per scope, for the busiest scopes without a pass over
    /// every stream.
    per_scope: HashMap<String, usize>,
    denials: HashMap<String, Vec<Denial>>,
    /// Set once the relay is shutting down: every stream, open or opening,
    /// is told to end.
    closing: bool,
}

/// The registry; cheap to clone (one shared map).
#[derive(Clone, Default)]
pub struct StreamRegistry {
    inner: Arc<Mutex<Inner>>,
}

/// A stream's place in the registry: dropping it removes the stream.
pub struct Ticket {
    registry: StreamRegistry,
    id: u64,
    /// Told when an operator disconnects the stream or the relay closes.
    pub end: EndSignal,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut inner = self.registry.lock();
        if let Some(entry) = inner.streams.remove(&self.id) {
            count_down(&mut inner.per_subscriber, &entry.stream.subscriber);
            for scope in entry.stream.scopes() {
                count_down(&mut inner.per_scope, scope);
            }
        }
    }
}

/// One stream fewer under `key`; a key with none left is removed, so the
/// maps hold only what is open.
fn count_down(counts: &mut HashMap<String, usize>, key: &str) {
    if let Some(count) = counts.get_mut(key) {
        *count -= 1;
        if *count == 0 {
            counts.remove(key);
        }
    }
}

impl StreamRegistry {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding it leaves plain maps behind: still usable.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Registers a stream of one scope (see [`Self::open_scopes`]).
    pub fn open(
        &self,
        subscriber: &str,
        scope_key: &str,
        max_streams: usize,
    ) -> Result<Ticket, Refusal> {
        self.open_scopes(subscriber, scope_key, &[], max_streams)
    }

    /// Registers a stream of `scope_key` and `more_scopes`, unless the
    /// subscriber is denied in one of them or already has `max_streams`
    /// open on this relay, in any scope. A stream counts once, however many
    /// scopes it carries.
    pub fn open_scopes(
        &self,
        subscriber: &str,
        scope_key: &str,
        more_scopes: &[String],
        max_streams: usize,
    ) -> Result<Ticket, Refusal> {
        let scopes = || std::iter::once(scope_key).chain(more_scopes.iter().map(String::as_str));
        let now = Utc::now();
        let mut inner = self.lock();
        if let Some(denials) = inner.denials.get_mut(subscriber) {
            denials.retain(|denial| denial.until > now);
            if let Some(denial) = denials.iter().find(|denial| {
                denial
                    .scope_key
                    .as_deref()
                    .is_none_or(|denied| scopes().any(|scope| scope == denied))
            }) {
                return Err(Refusal::Denied(denial.until));
            }
        }
        let open = inner.per_subscriber.get(subscriber).copied().unwrap_or(0);
        if open >= max_streams {
            return Err(Refusal::TooManyStreams(open));
        }
        inner.next_id += 1;
        let id = inner.next_id;
        let end = EndSignal::default();
        if inner.closing {
            end.end(End::Closing);
        }
        inner.streams.insert(
            id,
            Entry {
                stream: OpenStream {
                    id,
                    subscriber: subscriber.to_owned(),
                    scope_key: scope_key.to_owned(),
                    more_scopes: more_scopes.to_vec(),
                    connected_at: now,
                },
                end: end.clone(),
            },
        );
        *inner
            .per_subscriber
            .entry(subscriber.to_owned())
            .or_default() += 1;
        for scope in scopes() {
            *inner.per_scope.entry(scope.to_owned()).or_default() += 1;
        }
        Ok(Ticket {
            registry: self.clone(),
            id,
            end,
        })
    }

    /// Ends `subscriber`'s streams on this relay, and refuses new ones until
    /// `deny_until`. With `scope_key`, only that scope: it is taken out of a
    /// stream that carries others too, and a stream it was the last scope
    /// of ends. Returns how many streams it ended or took the scope out of.
    pub fn disconnect(
        &self,
        subscriber: &str,
        scope_key: Option<&str>,
        deny_until: Option<DateTime<Utc>>,
    ) -> usize {
        let mut inner = self.lock();
        if let Some(until) = deny_until.filter(|until| *until > Utc::now()) {
            inner
                .denials
                .entry(subscriber.to_owned())
                .or_default()
                .push(Denial {
                    scope_key: scope_key.map(str::to_owned),
                    until,
                });
        }
        let mut ended = 0;
        for entry in inner.streams.values() {
            let stream = &entry.stream;
            if stream.subscriber != subscriber {
                continue;
            }
            let acted = match scope_key {
                None => entry.end.end(End::Revoked),
                Some(scope) => match stream.scopes().position(|carried| carried == scope) {
                    Some(index) => entry.end.remove_scope(index, stream.more_scopes.len() + 1),
                    None => false,
                },
            };
            if acted {
                ended += 1;
            }
        }
        ended
    }

    /// Tells every stream, and every stream opened from now on, that the
    /// relay is shutting down: each ends cleanly at its next chance.
    pub fn close_all(&self) {
        let mut inner = self.lock();
        inner.closing = true;
        for entry in inner.streams.values() {
            entry.end.end(End::Closing);
        }
    }

    /// Applies a recorded disconnection (see [`Self::disconnect`]) unless
    /// this relay applied it already; answers how many streams it ended.
    pub fn apply(&self, disconnection: &Disconnection) -> usize {
        if self.lock().applied.remove(&disconnection.id) {
            return 0;
        }
        self.disconnect(
            &disconnection.subscriber_id,
            disconnection.scope_key.as_deref(),
            disconnection.deny_until,
        )
    }

    /// Applies a disconnection this relay has just recorded, so reading it
    /// back later does nothing.
    pub fn apply_recorded(&self, disconnection: &Disconnection) -> usize {
        self.lock().applied.insert(disconnection.id);
        self.disconnect(
            &disconnection.subscriber_id,
            disconnection.scope_key.as_deref(),
            disconnection.deny_until,
        )
    }

    /// Up to `limit` open streams with ids above `after`, in `scope_key`
    /// only when given, in the order they opened.
    pub fn list(&self, scope_key: Option<&str>, after: u64, limit: usize) -> Vec<OpenStream> {
        let inner = self.lock();
        inner
            .streams
            .range(after + 1..)
            .map(|(_, entry)| &entry.stream)
            .filter(|stream| scope_key.is_none_or(|scope| stream.scopes().any(|s| s == scope)))
            .take(limit)
            .cloned()
            .collect()
    }

    /// The `limit` scopes with the most open streams, busiest first (ties
    /// by scope key), and the number of open streams in all.
    pub fn busiest_scopes(&self, limit: usize) -> (Vec<(String, usize)>, usize) {
        let inner = self.lock();
        let mut scopes: Vec<(&String, usize)> = inner
            .per_scope
            .iter()
            .map(|(scope, count)| (scope, *count))
            .collect();
        let by_count =
            |a: &(&String, usize), b: &(&String, usize)| b.1.cmp(&a.1).then(a.0.cmp(b.0));
        if scopes.len() > limit {
            scopes.select_nth_unstable_by(limit, by_count);
            scopes.truncate(limit);
        }
        scopes.sort_unstable_by(by_count);
        let top = scopes
            .into_iter()
            .map(|(scope, count)| (scope.clone(), count))
            .collect();
        (top, inner.streams.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_busiest_scopes_come_first_and_closed_streams_leave() {
        let registry = StreamRegistry::default();
        let mut open = Vec::new();
        for (subscriber, scope) in [
            ("a", "org-1"),
            ("b", "org-2"),
            ("c", "org-2"),
            ("d", "org-3"),
        ] {
            open.push(registry.open(subscriber, scope, 5).unwrap());
        }
        let (top, total) = registry.busiest_scopes(2);
        assert_eq!(top, [("org-2".into(), 2), ("org-1".into(), 1)]);
        assert_eq!(total, 4);
        open.remove(1);
        open.remove(1);
        let (top, total) = registry.busiest_scopes(10);
        assert_eq!(top, [("org-1".into(), 1), ("org-3".into(), 1)]);
        assert_eq!(total, 2);
        assert_eq!(registry.busiest_scopes(0), (vec![], 2));
    }

    #[test]
    fn the_cap_counts_a_subscribers_streams_across_scopes() {
        let registry = StreamRegistry::default();
        let a = registry.open("alice", "org-1", 2).unwrap();
        let _b = registry.open("alice", "org-2", 2).unwrap();
        assert_eq!(
            registry.open("alice", "org-3", 2).err(),
            Some(Refusal::TooManyStreams(2))
        );
        assert!(registry.open("bob", "org-3", 2).is_ok(), "per subscriber");
        drop(a);
        assert!(
            registry.open("alice", "org-3", 2).is_ok(),
            "a closed stream frees its place"
        );
    }

    #[test]
    fn a_disconnection_ends_the_matching_streams_and_denies_until_its_expiry() {
        let registry = StreamRegistry::default();
        let one = registry.open("alice", "org-1", 9).unwrap();
        let two = registry.open("alice", "org-2", 9).unwrap();
        let other = registry.open("bob", "org-1", 9).unwrap();
        let until = Utc::now() + chrono::Duration::seconds(60);
        assert_eq!(registry.disconnect("alice", Some("org-1"), Some(until)), 1);
        assert!(one.end.is_revoked());
        assert!(!two.end.is_revoked() && !other.end.is_revoked());
        assert_eq!(
            registry.open("alice", "org-1", 9).err(),
            Some(Refusal::Denied(until))
        );
        let _three = registry
            .open("alice", "org-3", 9)
            .expect("other scopes stay open");
        assert_eq!(
            registry.disconnect("alice", None, None),
            2,
            "org-2 and org-3"
        );
        assert_eq!(
            registry.disconnect("alice", None, None),
            0,
            "already ending"
        );
        let past = Utc::now() - chrono::Duration::seconds(1);
        registry.disconnect("bob", None, Some(past));
        assert!(
            registry.open("bob", "org-1", 9).is_ok(),
            "an expired denial is no denial"
        );
    }

    #[test]
    fn a_stream_of_several_scopes_counts_once_and_loses_one_scope_at_a_time() {
        let registry = StreamRegistry::default();
        let scopes = |keys: &[&str]| keys.iter().map(|k| k.to_string()).collect::<Vec<_>>();
        let several = registry
            .open_scopes("alice", "doc-1", &scopes(&["org-1", "user-7"]), 2)
            .unwrap();
        let _other = registry.open("alice", "org-1", 2).unwrap();
        assert_eq!(
            registry.open("alice", "org-2", 2).err(),
            Some(Refusal::TooManyStreams(2)),
            "three scopes on one stream count once"
        );
        let (top, total) = registry.busiest_scopes(10);
        assert_eq!(top[0], ("org-1".into(), 2));
        assert_eq!((top.len(), total), (3, 2));
        assert_eq!(registry.list(Some("user-7"), 0, 10).len(), 1);

        assert_eq!(registry.disconnect("alice", Some("org-1"), None), 2);
        assert_eq!(several.end.removed_scopes(), 0b010);
        assert_eq!(several.end.ended(), None, "the other scopes go on");
        assert_eq!(registry.disconnect("alice", Some("org-1"), None), 0);
        registry.disconnect("alice", Some("doc-1"), None);
        assert_eq!(several.end.ended(), None);
        registry.disconnect("alice", Some("user-7"), None);
        assert_eq!(
            several.end.ended(),
            Some(End::Revoked),
            "its last scope gone, the stream ends"
        );

        let until = Utc::now() + chrono::Duration::seconds(60);
        registry.disconnect("bob", Some("doc-1"), Some(until));
        assert_eq!(
            registry
                .open_scopes("bob", "doc-1", &scopes(&["org-1"]), 9)
                .err(),
            Some(Refusal::Denied(until)),
            "a stream asking for a denied scope is refused"
        );
        assert!(
            registry
                .open_scopes("bob", "org-1", &scopes(&["org-2"]), 9)
                .is_ok()
        );
    }

    #[tokio::test]
    async fn closing_ends_every_stream_and_a_revocation_outranks_it() {
        let registry = StreamRegistry::default();
        let revoked = registry.open("alice", "org-1", 9).unwrap();
        let open = registry.open("bob", "org-1", 9).unwrap();
        assert_eq!(open.end.ended(), None);
        let waiting = tokio::spawn({
            let end = open.end.clone();
            async move { end.wait().await }
        });
        registry.disconnect("alice", None, None);
        registry.close_all();
        let woken = tokio::time::timeout(std::time::Duration::from_secs(5), waiting)
            .await
            .expect("the waiting stream is woken")
            .unwrap();
        assert_eq!(woken, End::Closing);
        assert_eq!(revoked.end.wait().await, End::Revoked);
        let late = registry.open("carol", "org-2", 9).unwrap();
        assert_eq!(
            late.end.ended(),
            Some(End::Closing),
            "a stream opened while closing is told at once"
        );
    }

    #[test]
    fn listings_page_in_opening_order_and_filter_by_scope() {
        let registry = StreamRegistry::default();
        let _tickets: Vec<_> = ["org-1", "org-2", "org-1", "org-1"]
            .iter()
            .enumerate()
            .map(|(n, scope)| registry.open(&format!("s{n}"), scope, 9).unwrap())
            .collect();
        let first = registry.list(Some("org-1"), 0, 2);
        assert_eq!(
            first
                .iter()
                .map(|s| s.subscriber.as_str())
                .collect::<Vec<_>>(),
            ["s0", "s2"]
        );
        let rest = registry.list(Some("org-1"), first[1].id, 2);
        assert_eq!(rest.len(), 1);
        assert_eq!(rest[0].subscriber, "s3");
        assert_eq!(registry.list(None, 0, 10).len(), 4);
    }
}
