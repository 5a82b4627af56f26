//! What the relay knows about one active scope, and every decision it takes
//! from that: what the next outbox read takes, whether one is already
//! running, which rows read are new, and how far delivery has got.
//!
//! It does no I/O and knows nothing of actors, so those decisions can be
//! tested on their own; the relay only reads, sends, and asks this.
//!
//! A seq is taken at INSERT and becomes visible at COMMIT, and seqs are
//! shared by every scope, so how far below the watermark a late commit
//! lies says nothing: a transaction can hold seq 1 open for seconds while
//! thousands of others commit. So the scope keeps a *horizon* instead: a
//! transaction id below which every transaction has finished and every row
//! it wrote here has been handed on (or is history, committed before the
//! scope was activated). Every read takes the rows written at or above the
//! horizon, whatever their seqs, so it finds every late commit. The horizon
//! rises at the end of each whole read, to the oldest transaction still
//! running when it began, and on a horizon mark heard while no read is
//! outstanding (see `listener::horizon`). Every event handed on carries the
//! horizon it went out under in its `id:`, which is what lets a client
//! resume exactly (see [`eventrelay_wire::ResumeCursor`]).
//!
//! Reading finds rows already handed on, which are remembered while they
//! are at or above the horizon and dropped, and history, which the
//! activation snapshot drops. So no read hands a subscriber an event twice
//! or one from before it subscribed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use eventrelay_wire::ResumeCursor;

use super::encoded::EncodedEvent;
use crate::store::{Snapshot, StoredEvent};

/// Seqs handed on recently, remembered so that a pointer to one of them
/// (sent again, or replayed by whoever recorded it) costs no read.
const RECENT_MEMORY: usize = 4096;
/// Rows handed on at or above the horizon, remembered so a read that finds
/// them again drops them. They are forgotten as the horizon passes them;
/// past this many (a transaction held open for minutes in a busy scope)
/// the lowest seqs go first, and a re-read could hand one on again.
const ABOVE_HORIZON_MEMORY: usize = 65_536;
/// Rows heard while a read runs, kept to hand on when it ends. Past this
/// many (a read that takes seconds in a busy scope) the rest go out as they
/// are heard, ahead of what the read finds: out of seq order, but never
/// lost, and the read's copies are dropped as already handed on.
const HEARD_WHILE_READING_MEMORY: usize = 4096;

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

/// What one outbox read takes: the rows of the scope written at or above
/// `since_txid` with a seq above `after`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadPlan {
    pub since_txid: u64,
    pub after: i64,
    /// Where the tail may claim the read's rows follow on from.
    read_after: i64,
    /// For a read that carries on one that stopped at its bound: the
    /// snapshot of that read's first page, whose xmin the horizon rises to
    /// once the whole read is done.
    carries_on_from: Option<SnapshotBounds>,
}

/// The bounds of the snapshot a read's first page was read in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotBounds {
    /// The oldest transaction still running (`xmax` when none was).
    pub xmin: u64,
    /// The first transaction id not yet assigned.
    pub xmax: u64,
}

impl SnapshotBounds {
    /// Whether some transaction was still running.
    fn had_running(&self) -> bool {
        self.xmin < self.xmax
    }
}

/// How a read ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadEnd {
    /// Every matching row was read.
    Whole { first: SnapshotBounds },
    /// The read stopped at its bound after seq `after`, with rows left.
    Stopped { after: i64, first: SnapshotBounds },
}

/// A read asked for while another ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pending {
    /// Everything at or above the horizon, from the start.
    Whole,
    /// The rest of a read that stopped at its bound.
    CarryOn { after: i64, first: SnapshotBounds },
}

/// Whether the scope owes one more whole read for what was heard before it
/// was active here. A row heard while the scope had no subscriber on this
/// relay is dropped, and a commit is heard on the replication stream a
/// moment before other sessions' snapshots see it (longer when it waits
/// for a synchronous standby): such a row is neither history (the join's
/// snapshot did not see it) nor found by the scope's first read. Its
/// transaction was still running in that read's snapshot, so once a mark
/// shows every such transaction finished, one more read finds it; until
/// then no mark raises the horizon past it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Recheck {
    /// The first read has not ended yet.
    FirstRead,
    /// Transactions were running at the first read: read again at the
    /// first mark whose xmin is at least `after` (that read's xmax).
    Once { after: u64 },
    /// Nothing is owed.
    Settled,
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
    /// The highest seq handed on, starting from the newest at activation.
    watermark: i64,
    /// Every row of the scope written below this transaction id has been
    /// handed on or is history.
    horizon: u64,
    /// Reads for one scope never overlap, or their deliveries could race.
    reading: bool,
    /// The read to start once the running one ends.
    pending: Option<Pending>,
    /// Whether a second read is owed for rows heard before activation.
    recheck: Recheck,
    /// Rows heard while a read runs, as heard (one entry per transaction
    /// or notification), handed on after what the read finds. They are not
    /// left to a later read: a commit can reach the replication stream
    /// before it is visible to other sessions' snapshots, so a read started
    /// at once may not see it, and a mark heard next would raise the
    /// horizon past it. Empty whenever no read runs or carries on.
    heard_while_reading: Vec<Vec<StoredEvent>>,
    /// How many rows `heard_while_reading` holds.
    heard_rows: usize,
    /// Rows handed on at or above the horizon: seq to txid.
    above_horizon: BTreeMap<i64, u64>,
    /// The newest seqs handed on, whatever their transaction.
    recent: BTreeSet<i64>,
}

impl ScopeState {
    /// A scope activated with `history`, its first read pending: rows
    /// committed between the snapshot and the activation were announced
    /// while nobody here listened, and only a whole read finds them. Until
    /// it is done no mark raises the horizon. The caller starts it at once
    /// ([`ScopeState::take_pending`]).
    ///
    /// `heard_before_visible`: whether rows can reach the relay before
    /// other sessions' snapshots see them (the replication stream; a
    /// notification is only delivered once its transaction is visible),
    /// in which case the first read may owe a second ([`Recheck`]).
    pub fn new(history: History, heard_before_visible: bool) -> Self {
        ScopeState {
            watermark: history.newest,
            horizon: history.snapshot.xmin(),
            history,
            reading: false,
            pending: Some(Pending::Whole),
            recheck: match heard_before_visible {
                true => Recheck::FirstRead,
                false => Recheck::Settled,
            },
            heard_while_reading: Vec::new(),
            heard_rows: 0,
            above_horizon: BTreeMap::new(),
            recent: BTreeSet::new(),
        }
    }

    pub fn watermark(&self) -> i64 {
        self.watermark
    }

    pub fn horizon(&self) -> u64 {
        self.horizon
    }

    pub fn is_reading(&self) -> bool {
        self.reading
    }

    /// Whether a bare pointer to `seq` may announce something new: not when
    /// `seq` was handed on recently, so a pointer sent again costs no read.
    pub fn pointer_needs_read(&self, seq: i64) -> bool {
        !self.recent.contains(&seq) && !self.above_horizon.contains_key(&seq)
    }

    /// Asks for a read of everything at or above the horizon: after
    /// activation, for a bare pointer, after the listener reconnects.
    /// Returns the read to start now, or `None` when one is running: it
    /// then follows that one.
    pub fn whole_read(&mut self) -> Option<ReadPlan> {
        self.start(Pending::Whole)
    }

    fn start(&mut self, wanted: Pending) -> Option<ReadPlan> {
        if self.reading {
            self.pending = Some(match (self.pending, wanted) {
                // A whole read finds everything the rest of one would.
                (Some(Pending::Whole), _) | (_, Pending::Whole) => Pending::Whole,
                (_, carry_on) => carry_on,
            });
            return None;
        }
        self.reading = true;
        Some(match wanted {
            Pending::Whole => ReadPlan {
                since_txid: self.horizon,
                after: 0,
                read_after: self.watermark.max(self.history.newest),
                carries_on_from: None,
            },
            Pending::CarryOn { after, first } => ReadPlan {
                since_txid: self.horizon,
                after,
                read_after: after.max(self.history.newest),
                carries_on_from: Some(first),
            },
        })
    }

    /// Ends the running read, which failed: it stays owed, as the pending
    /// read, so no mark raises the horizon past what it was to find. The
    /// caller starts it again later ([`ScopeState::take_pending`]). What
    /// was heard while it ran goes out now, rather than waiting for the
    /// retry; the retry drops it as already handed on.
    pub fn read_failed(&mut self, plan: ReadPlan, batch: usize) -> Vec<Batch> {
        self.reading = false;
        let again = match plan.carries_on_from {
            Some(first) => Pending::CarryOn {
                after: plan.after,
                first,
            },
            None => Pending::Whole,
        };
        self.pending = Some(match self.pending {
            Some(Pending::Whole) => Pending::Whole,
            _ => again,
        });
        self.hand_on_heard_while_reading(batch)
    }

    /// Ends the running read and returns what in `rows` is new, in batches
    /// of at most `batch` events. A whole read raises the horizon.
    pub fn read_done(
        &mut self,
        plan: ReadPlan,
        rows: Vec<StoredEvent>,
        end: ReadEnd,
        batch: usize,
    ) -> Vec<Batch> {
        self.reading = false;
        match end {
            ReadEnd::Whole { first } => {
                // Every transaction below the first page's xmin had
                // finished before the read began, so each row it wrote here
                // is in this read or was handed on before: the events go
                // out under the raised horizon.
                let first = plan.carries_on_from.unwrap_or(first);
                self.settle_recheck(first);
                let raised = first.xmin.max(self.horizon);
                let mut batches = self.accept(plan.read_after, rows, batch, raised);
                self.raise_horizon(raised);
                // Then what was heard meanwhile and the read did not find
                // (committed after its snapshot, or not yet visible to it).
                // What it did find is dropped as handed on; a row below
                // the raised horizon had finished before the read began,
                // so the read found it.
                batches.extend(self.hand_on_heard_while_reading(batch));
                batches
            }
            ReadEnd::Stopped { after, first } => {
                let first = plan.carries_on_from.unwrap_or(first);
                let carry_on = Pending::CarryOn { after, first };
                self.pending = Some(match self.pending {
                    Some(Pending::Whole) => Pending::Whole,
                    _ => carry_on,
                });
                self.accept(plan.read_after, rows, batch, self.horizon)
            }
        }
    }

    /// Committed rows that reached the relay with their notification (or
    /// from the replication stream), in commit order: what is new, as a
    /// read would hand it on. While a read runs they are kept and handed
    /// on when it ends, after what it finds, which keeps one scope's
    /// deliveries in the order reads give them.
    pub fn decoded(&mut self, rows: Vec<StoredEvent>, batch: usize) -> Vec<Batch> {
        if rows.is_empty() {
            return Vec::new();
        }
        if self.reading && self.heard_rows + rows.len() <= HEARD_WHILE_READING_MEMORY {
            self.heard_rows += rows.len();
            self.heard_while_reading.push(rows);
            return Vec::new();
        }
        self.hand_on_heard(rows, batch)
    }

    fn hand_on_heard_while_reading(&mut self, batch: usize) -> Vec<Batch> {
        self.heard_rows = 0;
        let mut batches = Vec::new();
        for rows in std::mem::take(&mut self.heard_while_reading) {
            batches.extend(self.hand_on_heard(rows, batch));
        }
        batches
    }

    fn hand_on_heard(&mut self, mut rows: Vec<StoredEvent>, batch: usize) -> Vec<Batch> {
        let Some(lowest) = rows.iter().filter_map(|row| row.envelope.seq).min() else {
            return Vec::new();
        };
        rows.sort_by_key(|row| row.envelope.seq);
        let read_after = self.watermark.min(lowest - 1).max(self.history.newest);
        self.accept(read_after, rows, batch, self.horizon)
    }

    /// A horizon mark: every transaction below `xmin` had finished when it
    /// was sent, and everything they announced was heard before it. With
    /// no read outstanding, all of that has been handed on.
    ///
    /// Returns the read to start instead, once: the first mark after the
    /// transactions running at the scope's first read have all finished
    /// (see [`Recheck`]).
    pub fn horizon_heard(&mut self, xmin: u64) -> Option<ReadPlan> {
        if self.reading || self.pending.is_some() {
            return None;
        }
        match self.recheck {
            Recheck::FirstRead => None,
            Recheck::Once { after } if xmin < after => None,
            Recheck::Once { .. } => {
                self.recheck = Recheck::Settled;
                self.start(Pending::Whole)
            }
            Recheck::Settled => {
                if xmin > self.horizon {
                    self.raise_horizon(xmin);
                }
                None
            }
        }
    }

    /// After a whole read whose first page was read in `first`: the first
    /// one decides whether a second is owed; a later one that began after
    /// every transaction the first saw running had finished is that second.
    fn settle_recheck(&mut self, first: SnapshotBounds) {
        self.recheck = match self.recheck {
            Recheck::FirstRead if first.had_running() => Recheck::Once { after: first.xmax },
            Recheck::FirstRead => Recheck::Settled,
            Recheck::Once { after } if first.xmin >= after => Recheck::Settled,
            unchanged => unchanged,
        };
    }

    /// The read asked for while the last one ran, to start once it ended.
    pub fn take_pending(&mut self) -> Option<ReadPlan> {
        let pending = self.pending.take()?;
        self.start(pending)
    }

    fn raise_horizon(&mut self, horizon: u64) {
        if horizon > self.horizon {
            self.horizon = horizon;
            self.above_horizon.retain(|_, txid| *txid >= horizon);
        }
    }

    fn accept(
        &mut self,
        read_after: i64,
        rows: Vec<StoredEvent>,
        batch: usize,
        stamp: u64,
    ) -> Vec<Batch> {
        let mut fresh = Vec::new();
        for StoredEvent { envelope, txid } in rows {
            let Some(seq) = envelope.seq else { continue };
            // Below the horizon everything was handed on already.
            if txid < self.horizon || self.history.contains(seq, txid) {
                continue;
            }
            if self.above_horizon.insert(seq, txid).is_some() {
                continue;
            }
            self.recent.insert(seq);
            self.watermark = self.watermark.max(seq);
            let cursor = ResumeCursor::at(seq, stamp).naming(&envelope.id);
            fresh.push(Arc::new(EncodedEvent::written_by(envelope, txid, cursor)));
        }
        while self.above_horizon.len() > ABOVE_HORIZON_MEMORY {
            self.above_horizon.pop_first();
        }
        while self.recent.len() > RECENT_MEMORY {
            self.recent.pop_first();
        }
        let mut read_after = read_after;
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Utc;
    use eventrelay_wire::NewEvent;
    use serde_json::json;

    /// Seqs 1..=`newest` had committed at activation, except those written
    /// by transaction 103, which was still running: the horizon starts at
    /// 103. The first read found nothing new.
    fn activated_at(newest: i64) -> ScopeState {
        let mut state = ScopeState::new(
            History::new(Arc::new(Snapshot::parse("103:106:103").unwrap()), newest),
            true,
        );
        let first = state.take_pending().expect("a new scope reads first");
        state.read_done(first, Vec::new(), ReadEnd::Whole { first: idle(103) }, 500);
        state
    }

    #[test]
    fn a_new_scope_reads_first_and_takes_no_mark_until_then() {
        let mut state = ScopeState::new(
            History::new(Arc::new(Snapshot::parse("103:106:103").unwrap()), 5),
            true,
        );
        state.horizon_heard(500);
        assert_eq!(
            state.horizon(),
            103,
            "rows announced before activation may be unread"
        );
        let first = state.take_pending().expect("a whole read");
        assert_eq!((first.since_txid, first.after), (103, 0));
        state.horizon_heard(500);
        assert_eq!(state.horizon(), 103);
        let found = state.read_done(
            first,
            vec![row(6, 104)],
            ReadEnd::Whole { first: idle(400) },
            500,
        );
        assert_eq!(handed_on(&found), vec![(5, vec!["6.400".into()])]);
        state.horizon_heard(500);
        assert_eq!(state.horizon(), 500);
    }

    /// A first page's snapshot with no transaction running.
    fn idle(xmin: u64) -> SnapshotBounds {
        SnapshotBounds { xmin, xmax: xmin }
    }

    fn row(seq: i64, txid: u64) -> StoredEvent {
        let mut envelope =
            NewEvent::durable("t", "s", json!({"seq": seq})).into_envelope(Utc::now());
        envelope.seq = Some(seq);
        StoredEvent { envelope, txid }
    }

    /// Rows by transaction 200, which started after activation.
    fn rows(seqs: &[i64]) -> Vec<StoredEvent> {
        seqs.iter().map(|&seq| row(seq, 200)).collect()
    }

    /// Each batch as its `read_after` and its events' `id:` cursors (their
    /// seqs and horizons).
    fn handed_on(batches: &[Batch]) -> Vec<(i64, Vec<String>)> {
        batches
            .iter()
            .map(|b| {
                let ids = b
                    .events
                    .iter()
                    .map(|e| {
                        let frame = std::str::from_utf8(&e.frame).unwrap();
                        let id = frame.lines().next().unwrap().trim_start_matches("id: ");
                        let cursor: ResumeCursor = id.parse().unwrap();
                        assert!(cursor.check.is_some(), "{id} names its event");
                        format!("{}.{}", cursor.seq, cursor.horizon.unwrap())
                    })
                    .collect();
                (b.read_after, ids)
            })
            .collect()
    }

    /// Runs one whole read that returns `rows`, its first page read when the
    /// oldest running transaction was `xmin`.
    fn whole(state: &mut ScopeState, xmin: u64, rows: Vec<StoredEvent>) -> Vec<(i64, Vec<String>)> {
        let plan = state.whole_read().expect("no read was running");
        assert_eq!(plan.since_txid, state.horizon(), "reads from the horizon");
        assert_eq!(plan.after, 0, "whatever the seq");
        handed_on(&state.read_done(plan, rows, ReadEnd::Whole { first: idle(xmin) }, 500))
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
    fn history_is_never_handed_on_and_the_horizon_starts_at_activation() {
        let mut state = activated_at(5);
        assert_eq!(state.horizon(), 103, "the activation snapshot's xmin");
        let read_back = vec![row(3, 103), row(4, 105), row(5, 104), row(6, 200)];
        assert_eq!(
            whole(&mut state, 150, read_back),
            vec![(5, vec!["3.150".into(), "6.150".into()])],
            "only the late commit and what came after activation, under \
             the horizon the read raised"
        );
        assert_eq!(state.watermark(), 6);
        assert_eq!(state.horizon(), 150);
    }

    #[test]
    fn a_late_commit_far_below_the_watermark_is_found_and_handed_on_once() {
        let mut state = activated_at(0);
        // Transaction 300 holds seq 1 open while 5,000 seqs commit, most
        // of them in other scopes.
        state.decoded(vec![row(5_000, 301)], 500);
        state.horizon_heard(300);
        assert_eq!(state.horizon(), 300, "300 is still running");
        assert_eq!(
            handed_on(&state.decoded(vec![row(5_001, 302)], 500)),
            vec![(5_000, vec!["5001.300".into()])]
        );
        // Its pointer carried no rows: the read takes everything written
        // at or above the horizon, so seq 1 is found, and 5,000 and 5,001
        // are not handed on again.
        assert!(state.pointer_needs_read(1));
        assert_eq!(
            whole(
                &mut state,
                303,
                vec![row(1, 300), row(5_000, 301), row(5_001, 302)]
            ),
            vec![(5_001, vec!["1.303".into()])]
        );
        assert_eq!(state.watermark(), 5_001, "a lower seq delivered late");
        assert_eq!(state.horizon(), 303);
        assert!(state.above_horizon.is_empty(), "forgotten once passed");
        assert!(
            handed_on(&state.decoded(vec![row(1, 300)], 500)).is_empty(),
            "below the horizon: handed on already"
        );
    }

    #[test]
    fn marks_raise_the_horizon_only_with_no_read_outstanding() {
        let mut state = activated_at(10);
        state.horizon_heard(120);
        assert_eq!(state.horizon(), 120);
        state.horizon_heard(110);
        assert_eq!(state.horizon(), 120, "never goes back");
        let plan = state.whole_read().unwrap();
        state.horizon_heard(130);
        assert_eq!(
            state.horizon(),
            120,
            "a read may still hand on rows below 130"
        );
        assert!(state.whole_read().is_none(), "one read at a time");
        state.read_done(plan, Vec::new(), ReadEnd::Whole { first: idle(125) }, 500);
        assert_eq!(state.horizon(), 125, "the read's own snapshot");
        state.horizon_heard(140);
        assert_eq!(
            state.horizon(),
            125,
            "the pending read is still outstanding"
        );
        let next = state.take_pending().unwrap();
        assert_eq!(next.since_txid, 125);
        state.read_done(next, Vec::new(), ReadEnd::Whole { first: idle(135) }, 500);
        state.horizon_heard(140);
        assert_eq!(state.horizon(), 140);
    }

    #[test]
    fn a_read_stopped_at_its_bound_carries_on_and_raises_the_horizon_at_its_end() {
        let mut state = activated_at(10);
        let plan = state.whole_read().unwrap();
        let first = state.read_done(
            plan,
            rows(&[11, 12]),
            ReadEnd::Stopped {
                after: 12,
                first: idle(150),
            },
            500,
        );
        assert_eq!(
            handed_on(&first),
            vec![(10, vec!["11.103".into(), "12.103".into()])],
            "under the horizon it started with"
        );
        assert_eq!(state.horizon(), 103);
        let rest = state.take_pending().expect("the rest follows");
        assert_eq!((rest.after, rest.since_txid), (12, 103));
        let second = state.read_done(rest, rows(&[13]), ReadEnd::Whole { first: idle(170) }, 500);
        assert_eq!(handed_on(&second), vec![(12, vec!["13.150".into()])]);
        assert_eq!(
            state.horizon(),
            150,
            "the first page's xmin, not the last's"
        );
    }

    #[test]
    fn a_row_read_twice_is_handed_on_once() {
        let mut state = activated_at(0);
        assert_eq!(whole(&mut state, 103, rows(&[1, 2])).len(), 1);
        assert_eq!(
            whole(&mut state, 103, rows(&[1, 2, 3])),
            vec![(2, vec!["3.103".into()])]
        );
        assert_eq!(
            whole(&mut state, 103, rows(&[4, 4])),
            vec![(3, vec!["4.103".into()])],
            "even twice in one read"
        );
    }

    #[test]
    fn pointers_to_recent_seqs_cost_no_read() {
        let mut state = activated_at(0);
        whole(&mut state, 250, rows(&[5_000, 5_001]));
        assert!(state.above_horizon.is_empty(), "written below the horizon");
        assert!(!state.pointer_needs_read(5_001), "handed on recently");
        assert!(state.pointer_needs_read(4_999), "may be a late commit");
        assert!(state.pointer_needs_read(5_002));
    }

    #[test]
    fn reads_asked_for_while_one_runs_follow_it_once() {
        let mut state = activated_at(2_000);
        let plan = state.whole_read().unwrap();
        assert!(state.whole_read().is_none());
        assert!(state.whole_read().is_none());
        assert!(state.is_reading());
        state.read_done(
            plan,
            rows(&[2_001]),
            ReadEnd::Whole { first: idle(103) },
            500,
        );
        assert!(!state.is_reading());
        let next = state.take_pending().expect("asked for");
        assert!(state.take_pending().is_none(), "asked for once");
        assert_eq!(next.after, 0);
        assert_eq!(
            handed_on(&state.read_done(
                next,
                rows(&[2_001, 2_005]),
                ReadEnd::Whole { first: idle(103) },
                500
            )),
            vec![(2_001, vec!["2005.103".into()])]
        );
    }

    #[test]
    fn rows_heard_while_a_read_runs_go_out_after_it_even_when_it_did_not_see_them() {
        // A commit reaches the replication stream before other sessions'
        // snapshots see it: the read running misses seq 2_003 (its
        // transaction, 210, still counts as running there), and a mark
        // heard next says 210 has finished.
        let mut state = activated_at(2_000);
        let plan = state.whole_read().unwrap();
        assert!(state.decoded(vec![row(2_002, 205)], 500).is_empty());
        assert!(state.decoded(vec![row(2_003, 210)], 500).is_empty());
        assert_eq!(
            handed_on(&state.read_done(
                plan,
                vec![row(2_001, 200), row(2_002, 205)],
                ReadEnd::Whole { first: idle(210) },
                500
            )),
            vec![
                (2_000, vec!["2001.210".into(), "2002.210".into()]),
                (2_002, vec!["2003.210".into()]),
            ],
            "in seq order, each once"
        );
        assert!(state.take_pending().is_none(), "no read is owed for them");
        state.horizon_heard(211);
        assert_eq!(state.horizon(), 211);
        assert!(
            state.decoded(vec![row(2_003, 210)], 500).is_empty(),
            "already handed on"
        );
    }

    /// A scope whose first read found nothing while transaction 107 (on
    /// the stream before anyone here followed the scope, so its row was
    /// dropped) was still running in the snapshots of the join and of the
    /// read; heard on the replication stream, or as a notification.
    fn first_read_with_107_running(heard_before_visible: bool) -> ScopeState {
        let mut state = ScopeState::new(
            History::new(Arc::new(Snapshot::parse("103:110:103,107").unwrap()), 5),
            heard_before_visible,
        );
        let first = state.take_pending().unwrap();
        let running = SnapshotBounds {
            xmin: 107,
            xmax: 110,
        };
        state.read_done(first, Vec::new(), ReadEnd::Whole { first: running }, 500);
        state
    }

    #[test]
    fn a_row_heard_before_activation_and_not_yet_visible_is_found_by_one_more_read() {
        let mut state = first_read_with_107_running(true);
        assert_eq!(state.horizon(), 107);
        assert!(state.horizon_heard(109).is_none());
        assert_eq!(
            state.horizon(),
            107,
            "not past what that read could not see"
        );
        let again = state.horizon_heard(110).expect("one more read");
        assert_eq!((again.since_txid, again.after), (107, 0));
        assert_eq!(
            handed_on(&state.read_done(
                again,
                vec![row(6, 107)],
                ReadEnd::Whole { first: idle(111) },
                500
            )),
            vec![(5, vec!["6.111".into()])]
        );
        assert!(state.horizon_heard(200).is_none(), "owed once");
        assert_eq!(state.horizon(), 200);
    }

    #[test]
    fn a_later_read_begun_after_those_transactions_ended_settles_the_recheck() {
        let mut state = activated_at(5);
        let mut fresh = first_read_with_107_running(true);
        let reconnect = fresh.whole_read().unwrap();
        fresh.read_done(
            reconnect,
            Vec::new(),
            ReadEnd::Whole { first: idle(112) },
            500,
        );
        assert!(fresh.horizon_heard(300).is_none(), "nothing owed");
        assert_eq!(fresh.horizon(), 300);
        // A scope whose first read saw nothing running owes nothing either.
        assert!(state.horizon_heard(300).is_none());
        assert_eq!(state.horizon(), 300);
        // Nor one fed by notifications: a notification arrives only once
        // its transaction is visible, so the join's snapshot saw 107.
        let mut notified = first_read_with_107_running(false);
        assert!(notified.horizon_heard(300).is_none());
        assert_eq!(notified.horizon(), 300);
    }

    #[test]
    fn past_the_memory_rows_heard_while_a_read_runs_go_out_at_once() {
        let mut state = activated_at(0);
        let plan = state.whole_read().unwrap();
        let kept: Vec<i64> = (1..=HEARD_WHILE_READING_MEMORY as i64).collect();
        assert!(state.decoded(rows(&kept), 500).is_empty());
        let beyond = HEARD_WHILE_READING_MEMORY as i64 + 1;
        assert_eq!(
            handed_on(&state.decoded(rows(&[beyond]), 500)),
            vec![(0, vec![format!("{beyond}.103")])]
        );
        let mut everything = kept.clone();
        everything.push(beyond);
        let found = state.read_done(
            plan,
            rows(&everything),
            ReadEnd::Whole { first: idle(103) },
            500,
        );
        let seqs: Vec<i64> = found
            .iter()
            .flat_map(|b| b.events.iter().filter_map(|e| e.seq()))
            .collect();
        assert_eq!(seqs, kept, "the one handed on early is not sent again");
    }

    #[test]
    fn a_failed_read_hands_on_what_was_heard_while_it_ran() {
        let mut state = activated_at(10);
        let plan = state.whole_read().unwrap();
        assert!(state.decoded(rows(&[12]), 500).is_empty());
        assert_eq!(
            handed_on(&state.read_failed(plan, 500)),
            vec![(10, vec!["12.103".into()])]
        );
        assert!(
            state.decoded(rows(&[13]), 500).len() == 1,
            "no read runs until the retry"
        );
        let retry = state.take_pending().expect("still owed");
        assert_eq!(
            handed_on(&state.read_done(
                retry,
                rows(&[11, 12, 13]),
                ReadEnd::Whole { first: idle(150) },
                500
            )),
            vec![(13, vec!["11.150".into()])]
        );
    }

    #[test]
    fn a_failed_read_stays_owed_and_holds_the_horizon_until_it_is_done() {
        let mut state = activated_at(10);
        let plan = state.whole_read().unwrap();
        assert!(state.read_failed(plan, 500).is_empty());
        assert!(!state.is_reading());
        state.horizon_heard(500);
        assert_eq!(
            state.horizon(),
            103,
            "what the read was to find is not handed on yet"
        );
        let retry = state.take_pending().unwrap();
        assert_eq!(retry, plan);
        assert!(state.whole_read().is_none(), "one read at a time");
        state.read_done(retry, rows(&[11]), ReadEnd::Whole { first: idle(150) }, 500);
        let next = state.take_pending().expect("the read asked for meanwhile");
        state.read_done(next, Vec::new(), ReadEnd::Whole { first: idle(160) }, 500);
        state.horizon_heard(500);
        assert_eq!(state.horizon(), 500);
    }

    #[test]
    fn each_batch_follows_on_from_the_previous_one() {
        let mut state = activated_at(10);
        let plan = state.whole_read().unwrap();
        let batches = state.read_done(
            plan,
            rows(&[11, 12, 13, 14, 15]),
            ReadEnd::Whole { first: idle(103) },
            2,
        );
        let after: Vec<i64> = batches.iter().map(|b| b.read_after).collect();
        assert_eq!(after, vec![10, 12, 14]);
    }

    #[test]
    fn decoded_rows_are_handed_on_once_in_commit_order_and_late_commits_slot_in() {
        let mut state = activated_at(10);
        // Seq 12's transaction commits before seq 11's.
        assert_eq!(
            handed_on(&state.decoded(rows(&[12]), 500)),
            vec![(10, vec!["12.103".into()])]
        );
        assert_eq!(
            handed_on(&state.decoded(rows(&[11]), 500)),
            vec![(10, vec!["11.103".into()])]
        );
        assert_eq!(state.watermark(), 12);
        assert!(
            state.decoded(rows(&[11, 12]), 500).is_empty(),
            "already delivered"
        );
        assert!(!state.is_reading(), "decoding never starts a read");
        assert!(
            state.decoded(vec![row(4, 104)], 500).is_empty(),
            "history is never handed on"
        );
    }
}
