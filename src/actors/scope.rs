//! What the relay knows about one active scope, and every decision it takes
//! from that: where the next outbox read starts, whether one is already
//! running, which rows read are new, and how far delivery has got.
//!
//! It does no I/O and knows nothing of actors, so those decisions can be
//! tested on their own; the relay only reads, sends, and asks this.
//!
//! Reads go below the watermark on purpose. A transaction can take a seq and
//! commit after a higher seq was delivered (a late commit), so a pointer
//! reads from `min(watermark, seq - 1)`, and after a listener reconnect a
//! scope is re-read from some way below its watermark. Reading back finds
//! rows already delivered, which the delivered set drops, and history (rows
//! committed before the scope was activated), which the activation snapshot
//! drops. So no read, however far back it starts, hands a subscriber an
//! event twice or one from before it subscribed.

use std::collections::BTreeSet;
use std::sync::Arc;

use super::encoded::EncodedEvent;
use crate::store::{Snapshot, StoredEvent};

/// Delivered seqs remembered per scope for de-duplication.
const DELIVERED_MEMORY: usize = 4096;
/// How far below the watermark a post-reconnect read starts, for events that
/// committed late while no notification could arrive.
const RECONNECT_LOOKBACK: i64 = 1000;

/// The events a scope had when it was activated.
pub struct History {
    snapshot: Arc<Snapshot>,
    newest: i64,
}

impl History {
    pub fn new(snapshot: Arc<Snapshot>, newest: i64) -> Self {
        History { snapshot, newest }
    }

    /// True for an event that had committed before activation. Everything
    /// above `newest` is new; below it, only a transaction that was still
    /// running (a late commit) is.
    pub fn contains(&self, seq: i64, txid: u64) -> bool {
        seq <= self.newest && self.snapshot.is_visible(txid)
    }
}

/// Events new to the hub, in seq order, that follow on from `read_after`.
/// One batch is one hub message, which keeps each burst below a session's
/// queue capacity.
pub struct Batch {
    pub read_after: i64,
    pub events: Vec<Arc<EncodedEvent>>,
}

pub struct ScopeState {
    /// What had committed when the scope was activated: never delivered.
    history: History,
    /// The highest seq handed on, starting from the newest at activation so
    /// that a reconnect before any delivery still re-reads from somewhere.
    watermark: i64,
    /// Reads for one scope never overlap, or their deliveries could race.
    reading: bool,
    /// Lowest start of a read requested while one was running.
    pending_from: Option<i64>,
    delivered: BTreeSet<i64>,
}

impl ScopeState {
    pub fn new(history: History) -> Self {
        let watermark = history.newest;
        ScopeState {
            history,
            watermark,
            reading: false,
            pending_from: None,
            delivered: BTreeSet::new(),
        }
    }

    pub fn watermark(&self) -> i64 {
        self.watermark
    }

    pub fn is_reading(&self) -> bool {
        self.reading
    }

    /// Where to read for a pointer to `seq`: from the watermark, or from
    /// just below `seq` when that is lower, because `seq` may be a late
    /// commit below what was already delivered. `None` when the pointer
    /// cannot announce anything new: `seq` was delivered already, or lies
    /// further below the watermark than a late commit plausibly does (the
    /// same look-back a reconnect re-reads). So a pointer sent again, or
    /// one to an old seq, costs no read.
    pub fn read_from_for_pointer(&self, seq: i64) -> Option<i64> {
        if seq > self.watermark {
            return Some(self.watermark);
        }
        if self.delivered.contains(&seq) || seq <= self.watermark - RECONNECT_LOOKBACK {
            return None;
        }
        Some(self.floor_for(seq))
    }

    /// Where a read that must find `seq` starts.
    fn floor_for(&self, seq: i64) -> i64 {
        self.watermark.min(seq - 1)
    }

    /// Where to re-read after the listener reconnects: notifications sent
    /// meanwhile are gone, and some of what they announced may have
    /// committed below the watermark.
    pub fn read_from_after_reconnect(&self) -> i64 {
        (self.watermark - RECONNECT_LOOKBACK).max(0)
    }

    /// Asks for a read from `from`. Returns where to start one now, or
    /// `None` when one is running: the request then widens the read that
    /// follows it (see [`ScopeState::take_pending`]).
    pub fn start_read(&mut self, from: i64) -> Option<i64> {
        if self.reading {
            self.widen_pending(from);
            return None;
        }
        self.reading = true;
        Some(from)
    }

    /// Ends the running read, which failed; the caller retries it later.
    pub fn read_failed(&mut self) {
        self.reading = false;
    }

    /// Ends the running read, which started after `from`, and returns what
    /// in `rows` is new, in batches of at most `batch` events.
    pub fn read_done(&mut self, from: i64, rows: Vec<StoredEvent>, batch: usize) -> Vec<Batch> {
        self.reading = false;
        self.accept(from, rows, batch)
    }

    /// Committed rows decoded from the replication stream (logical wake-up
    /// mode), in commit order: what is new, as a read from just below them
    /// would hand it on. While a read runs they are left to the read that
    /// follows it instead (they have committed, so it finds them), which
    /// keeps one scope's deliveries in the order reads give them.
    pub fn decoded(&mut self, rows: Vec<StoredEvent>, batch: usize) -> Vec<Batch> {
        let Some(lowest) = rows.iter().filter_map(|row| row.envelope.seq).min() else {
            return Vec::new();
        };
        let from = self.floor_for(lowest);
        if self.reading {
            self.widen_pending(from);
            return Vec::new();
        }
        let mut rows = rows;
        rows.sort_by_key(|row| row.envelope.seq);
        self.accept(from, rows, batch)
    }

    fn accept(&mut self, from: i64, rows: Vec<StoredEvent>, batch: usize) -> Vec<Batch> {
        let mut fresh = Vec::new();
        for StoredEvent { envelope, txid } in rows {
            let Some(seq) = envelope.seq else { continue };
            if self.history.contains(seq, txid) {
                continue;
            }
            if self.delivered.insert(seq) {
                self.watermark = self.watermark.max(seq);
                fresh.push(Arc::new(EncodedEvent::written_by(envelope, txid)));
            }
        }
        while self.delivered.len() > DELIVERED_MEMORY {
            self.delivered.pop_first();
        }
        // History was left out, and all of it is at or below `newest`, so
        // the tail may claim to cover only above that. Each batch follows on
        // from the previous one.
        let mut read_after = from.max(self.history.newest);
        let mut batches = Vec::new();
        for events in fresh.chunks(batch.max(1)) {
            batches.push(Batch {
                read_after,
                events: events.to_vec(),
            });
            read_after = events.last().and_then(|e| e.seq()).unwrap_or(read_after);
        }
        batches
    }

    /// Makes the read that follows the running one start at `from` or below.
    pub fn widen_pending(&mut self, from: i64) {
        self.pending_from = Some(self.pending_from.map_or(from, |p| p.min(from)));
    }

    /// The read asked for while the last one ran, to start once it ended.
    pub fn take_pending(&mut self) -> Option<i64> {
        self.pending_from.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Utc;
    use eventrelay_wire::NewEvent;
    use serde_json::json;

    /// Seqs 1..=`newest` had committed at activation, except those written
    /// by transaction 103, which was still running.
    fn activated_at(newest: i64) -> ScopeState {
        ScopeState::new(History::new(
            Arc::new(Snapshot::parse("103:106:103").unwrap()),
            newest,
        ))
    }

    fn row(seq: i64, txid: u64) -> StoredEvent {
        let mut envelope =
            NewEvent::durable("t", "s", json!({"seq": seq})).into_envelope(Utc::now());
        envelope.seq = Some(seq);
        StoredEvent { envelope, txid }
    }

    /// Rows by transactions that started after activation.
    fn rows(seqs: &[i64]) -> Vec<StoredEvent> {
        seqs.iter().map(|&seq| row(seq, 200)).collect()
    }

    /// Each batch as its `read_after` and seqs.
    fn handed_on(batches: &[Batch]) -> Vec<(i64, Vec<i64>)> {
        batches
            .iter()
            .map(|b| {
                (
                    b.read_after,
                    b.events.iter().filter_map(|e| e.seq()).collect(),
                )
            })
            .collect()
    }

    /// Runs one read from `from` that returns `rows`.
    fn read(state: &mut ScopeState, from: i64, rows: Vec<StoredEvent>) -> Vec<(i64, Vec<i64>)> {
        assert_eq!(state.start_read(from), Some(from));
        handed_on(&state.read_done(from, rows, 500))
    }

    #[test]
    fn history_is_what_had_committed_at_activation() {
        // Seqs 1..=5 existed; the transaction 103 that wrote seq 3 was
        // still running.
        let history = History::new(Arc::new(Snapshot::parse("103:106:103").unwrap()), 5);
        assert!(history.contains(1, 100));
        assert!(history.contains(4, 104));
        assert!(!history.contains(3, 103), "a late commit is new");
        assert!(!history.contains(6, 99), "above newest is always new");
        assert!(!history.contains(4, 106), "started after activation");
    }

    #[test]
    fn history_is_never_handed_on_however_far_back_a_read_starts() {
        let mut state = activated_at(5);
        let read_back = vec![
            row(1, 100),
            row(2, 104),
            row(3, 103),
            row(4, 105),
            row(5, 102),
            row(6, 99),
        ];
        assert_eq!(
            read(&mut state, 0, read_back),
            vec![(5, vec![3, 6])],
            "only the late commit and what came after activation; the tail \
             may claim to cover only above the newest seq at activation"
        );
        assert_eq!(state.watermark(), 6);
    }

    #[test]
    fn the_watermark_advances_and_never_goes_back() {
        let mut state = activated_at(10);
        assert_eq!(state.watermark(), 10, "starts at the newest at activation");
        read(&mut state, 10, rows(&[11, 12]));
        assert_eq!(state.watermark(), 12);
        read(&mut state, 12, Vec::new());
        assert_eq!(state.watermark(), 12, "an empty read leaves it");
        assert_eq!(read(&mut state, 8, rows(&[9])), vec![(10, vec![9])]);
        assert_eq!(state.watermark(), 12, "a lower seq delivered late");
        read(&mut state, 12, rows(&[20]));
        assert_eq!(state.watermark(), 20);
    }

    #[test]
    fn a_late_commit_below_the_watermark_is_delivered_once() {
        let mut state = activated_at(10);
        // Seq 11's transaction is still running when 12 commits.
        let from = state.read_from_for_pointer(12).unwrap();
        assert_eq!(from, 10);
        assert_eq!(read(&mut state, from, rows(&[12])), vec![(10, vec![12])]);
        assert_eq!(state.watermark(), 12);

        // 11 commits: its pointer reads from below the watermark.
        let from = state.read_from_for_pointer(11).unwrap();
        assert_eq!(from, 10, "min(watermark, seq - 1)");
        assert_eq!(
            read(&mut state, from, rows(&[11, 12])),
            vec![(10, vec![11])]
        );
        assert_eq!(state.watermark(), 12);

        // Pointers above the watermark read from the watermark.
        assert_eq!(state.read_from_for_pointer(13), Some(12));
        assert_eq!(state.read_from_for_pointer(40), Some(12));
        // Pointers to what was delivered read nothing.
        assert_eq!(state.read_from_for_pointer(11), None);
        assert_eq!(state.read_from_for_pointer(12), None);
    }

    #[test]
    fn pointers_to_delivered_or_old_seqs_cost_no_read() {
        let mut state = activated_at(0);
        read(&mut state, 0, rows(&[5_000, 5_001]));
        assert_eq!(state.read_from_for_pointer(5_001), None, "delivered");
        assert_eq!(state.read_from_for_pointer(1), None, "far below");
        assert_eq!(
            state.read_from_for_pointer(4_001),
            None,
            "beyond the look-back"
        );
        assert_eq!(
            state.read_from_for_pointer(4_999),
            Some(4_998),
            "a plausible late commit"
        );
        assert_eq!(state.read_from_for_pointer(5_002), Some(5_001));
    }

    #[test]
    fn a_row_read_twice_is_handed_on_once() {
        let mut state = activated_at(0);
        assert_eq!(read(&mut state, 0, rows(&[1, 2])), vec![(0, vec![1, 2])]);
        assert_eq!(read(&mut state, 0, rows(&[1, 2, 3])), vec![(0, vec![3])]);
        assert_eq!(read(&mut state, 2, rows(&[3])), Vec::new());
        assert_eq!(
            read(&mut state, 3, rows(&[4, 4])),
            vec![(3, vec![4])],
            "even twice in one read"
        );
    }

    #[test]
    fn a_reconnect_rereads_every_scope_from_its_watermark() {
        let mut quiet = activated_at(5);
        let mut busy = activated_at(0);
        read(&mut busy, 0, rows(&[4_000, 4_500]));
        for (state, expected) in [(&mut quiet, 0), (&mut busy, 3_500)] {
            let from = state.read_from_after_reconnect();
            assert_eq!(from, expected, "a look-back below the watermark");
            assert_eq!(state.start_read(from), Some(from));
            assert!(state.is_reading());
        }
        assert_eq!(
            handed_on(&busy.read_done(3_500, rows(&[3_900, 4_000, 4_500]), 500)),
            vec![(3_500, vec![3_900])],
            "a late commit missed while disconnected; the rest was delivered"
        );
    }

    #[test]
    fn a_read_in_flight_is_followed_by_another() {
        let mut state = activated_at(2_000);
        assert_eq!(state.start_read(2_000), Some(2_000));
        // Meanwhile a pointer and a reconnect ask for reads.
        assert_eq!(
            state.start_read(state.read_from_for_pointer(2_001).unwrap()),
            None
        );
        assert_eq!(state.start_read(state.read_from_after_reconnect()), None);
        assert_eq!(state.start_read(1_500), None);
        assert!(state.is_reading());

        state.read_done(2_000, rows(&[2_001]), 500);
        assert!(!state.is_reading());
        let next = state.take_pending();
        assert_eq!(next, Some(1_000), "the lowest start asked for");
        assert_eq!(state.take_pending(), None, "asked for once");
        assert_eq!(state.start_read(1_000), Some(1_000));
        assert_eq!(
            handed_on(&state.read_done(1_000, rows(&[2_001]), 500)),
            Vec::new()
        );
        assert_eq!(state.take_pending(), None);
    }

    #[test]
    fn a_failed_read_ends_so_its_retry_can_start() {
        let mut state = activated_at(10);
        assert_eq!(state.start_read(10), Some(10));
        assert_eq!(state.start_read(7), None);
        state.read_failed();
        assert!(!state.is_reading());
        assert_eq!(state.take_pending(), Some(7));
        assert_eq!(state.start_read(7), Some(7));
        assert_eq!(state.start_read(10), None, "the retry waits its turn");
        assert_eq!(state.watermark(), 10);
    }

    #[test]
    fn each_batch_follows_on_from_the_previous_one() {
        let mut state = activated_at(10);
        assert_eq!(state.start_read(10), Some(10));
        let batches = state.read_done(10, rows(&[11, 12, 13, 14, 15]), 2);
        assert_eq!(
            handed_on(&batches),
            vec![(10, vec![11, 12]), (12, vec![13, 14]), (14, vec![15])]
        );
    }

    #[test]
    fn decoded_rows_are_handed_on_once_in_commit_order_and_late_commits_slot_in() {
        let mut state = activated_at(10);
        // Seq 12's transaction commits before seq 11's.
        assert_eq!(
            handed_on(&state.decoded(rows(&[12]), 500)),
            vec![(10, vec![12])]
        );
        assert_eq!(
            handed_on(&state.decoded(rows(&[11]), 500)),
            vec![(10, vec![11])]
        );
        assert_eq!(state.watermark(), 12);
        assert!(
            state.decoded(rows(&[11, 12]), 500).is_empty(),
            "already delivered"
        );
        assert!(!state.is_reading(), "decoding never starts a read");
        assert!(
            state.decoded(vec![row(4, 101)], 500).is_empty(),
            "history is never handed on"
        );
    }

    #[test]
    fn decoded_rows_during_a_read_are_left_to_the_read_after_it() {
        let mut state = activated_at(10);
        assert_eq!(state.start_read(10), Some(10));
        assert!(state.decoded(rows(&[13, 14]), 500).is_empty());
        assert_eq!(state.take_pending(), Some(10), "min(watermark, 13 - 1)");
        assert!(state.is_reading());
    }
}
