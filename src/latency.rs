//! Where an event's time goes between a publish request and the
//! subscribers' sockets: one histogram per stage,
//! `eventrelay_latency_stage_seconds{stage}`, so an operator (and the
//! benchmark) can tell which step a slow delivery spent its time in.
//!
//! The stages, in the order an event passes them:
//!
//! | stage | from | to |
//! |---|---|---|
//! | `parse` | a publish request reaches its handler | its body is read and its events parsed |
//! | `group_wait` | parsed | its group's transaction is sent |
//! | `commit` | sent | the `COMMIT` is acknowledged (the flush included) |
//! | `notify` | acknowledged | the listener hears the event (its notification, or its decoded WAL) |
//! | `relay` | heard (an ephemeral-only publish here: parsed) | the scope's hub starts fanning it out |
//! | `fan_out` | the hub starts | the hub has queued it to every subscriber |
//! | `session` | the hub starts | a subscriber's stream hands it to the HTTP layer |
//!
//! The first three are timed in the publish path, per request. `notify`
//! joins two parts that never meet, the committer and the listener, so the
//! committer leaves a mark per event in a small table ([`CommitMarks`]) and
//! the relay takes it when the event arrives: only events published
//! through this relay's HTTP API are timed there (an application's own
//! commits are not seen). `relay` is timed for events whose rows travelled
//! with their notification (or their WAL), not for those read back from
//! the outbox, which `eventrelay_outbox_read_seconds` times. `session` is
//! sampled (the same writes as `eventrelay_session_queue_fill_ratio`) and
//! includes the hub's loop up to that subscriber.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;

/// A step of an event's way to its subscribers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    Parse,
    GroupWait,
    Commit,
    Notify,
    Relay,
    FanOut,
    Session,
}

impl Stage {
    pub const ALL: [Stage; 7] = [
        Stage::Parse,
        Stage::GroupWait,
        Stage::Commit,
        Stage::Notify,
        Stage::Relay,
        Stage::FanOut,
        Stage::Session,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Stage::Parse => "parse",
            Stage::GroupWait => "group_wait",
            Stage::Commit => "commit",
            Stage::Notify => "notify",
            Stage::Relay => "relay",
            Stage::FanOut => "fan_out",
            Stage::Session => "session",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StageLabel {
    /// A [`Stage`]'s label.
    pub stage: &'static str,
}

/// Fine enough below a millisecond, where most stages live on a quiet
/// machine, and up to seconds, where a saturated one goes.
fn stage_buckets() -> Histogram {
    Histogram::new([
        0.000_005, 0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5,
        0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    ])
}

/// The stage histograms, and the marks that time the `notify` stage.
pub struct Stages {
    family: Family<StageLabel, Histogram, fn() -> Histogram>,
    by_stage: Vec<Histogram>,
    marks: CommitMarks,
}

impl Default for Stages {
    fn default() -> Self {
        let family: Family<StageLabel, Histogram, fn() -> Histogram> =
            Family::new_with_constructor(stage_buckets);
        // Every stage from zero, and no lookup by label on the hot path.
        let by_stage = Stage::ALL
            .iter()
            .map(|stage| {
                family
                    .get_or_create(&StageLabel {
                        stage: stage.label(),
                    })
                    .clone()
            })
            .collect();
        Stages {
            family,
            by_stage,
            marks: CommitMarks::new(MARK_SLOTS),
        }
    }
}

impl Stages {
    /// The family, to register.
    pub fn family(&self) -> Family<StageLabel, Histogram, fn() -> Histogram> {
        self.family.clone()
    }

    pub fn observe(&self, stage: Stage, elapsed: Duration) {
        self.by_stage[stage as usize].observe(elapsed.as_secs_f64());
    }

    /// Observes the time from `start` to now.
    pub fn since(&self, stage: Stage, start: Instant) {
        self.observe(stage, start.elapsed());
    }

    /// Events with these ids committed at `at` (through the publish API).
    pub fn committed(&self, ids: impl IntoIterator<Item = uuid::Uuid>, at: Instant) {
        self.marks.mark(ids.into_iter().map(key_of), at);
    }

    /// The event `id` was heard at `heard_at`: when this relay committed
    /// it, that is its `notify` stage.
    pub fn heard(&self, id: uuid::Uuid, heard_at: Instant) {
        if let Some(committed) = self.marks.take(key_of(id)) {
            self.observe(Stage::Notify, heard_at.saturating_duration_since(committed));
        }
    }
}

/// An event id's low half is random (in a UUIDv7 as in a v4), so it
/// spreads over the slots.
fn key_of(id: uuid::Uuid) -> u64 {
    id.as_u64_pair().1
}

/// Slots in the commit marks: more than the events in flight between a
/// commit and its notification at any sane rate, so few marks are
/// overwritten before they are taken.
const MARK_SLOTS: usize = 4096;

/// When recently committed events committed, by id, in a table of fixed
/// size: a mark lands in the slot its key picks, replacing whatever was
/// there, so events that never come back (another relay's scopes, a
/// failed notification) cost nothing but the slot they held until
/// overwritten. A mark lost that way only leaves one sample out.
struct CommitMarks {
    slots: Mutex<Vec<Option<(u64, Instant)>>>,
}

impl CommitMarks {
    fn new(slots: usize) -> Self {
        CommitMarks {
            slots: Mutex::new(vec![None; slots]),
        }
    }

    fn mark(&self, keys: impl Iterator<Item = u64>, at: Instant) {
        let mut slots = self.lock();
        let len = slots.len();
        for key in keys {
            slots[key as usize % len] = Some((key, at));
        }
    }

    fn take(&self, key: u64) -> Option<Instant> {
        let mut slots = self.lock();
        let len = slots.len();
        let slot = &mut slots[key as usize % len];
        match *slot {
            Some((marked, at)) if marked == key => {
                *slot = None;
                Some(at)
            }
            _ => None,
        }
    }

    /// The table, whatever a panicking holder left in it (marks only).
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Option<(u64, Instant)>>> {
        self.slots
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// An instant kept in an atomic, for a moment several threads read after
/// one wrote it (when a hub started an event's fan-out): nanoseconds since
/// a fixed instant of this process, 0 for never.
#[derive(Debug, Default)]
pub struct Stamp(AtomicU64);

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

impl Stamp {
    pub fn set(&self, at: Instant) {
        let nanos = at.saturating_duration_since(epoch()).as_nanos();
        self.0.store(
            u64::try_from(nanos).unwrap_or(u64::MAX).max(1),
            Ordering::Relaxed,
        );
    }

    pub fn get(&self) -> Option<Instant> {
        match self.0.load(Ordering::Relaxed) {
            0 => None,
            nanos => Some(epoch() + Duration::from_nanos(nanos)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mark_is_taken_once_and_only_by_its_own_key() {
        let marks = CommitMarks::new(8);
        let at = Instant::now();
        marks.mark([3u64, 12].into_iter(), at);
        assert_eq!(marks.take(11), None, "another key in 3's slot");
        assert_eq!(marks.take(3), Some(at));
        assert_eq!(marks.take(3), None, "taken already");
        assert_eq!(marks.take(12), Some(at));
    }

    #[test]
    fn a_later_mark_in_the_same_slot_replaces_the_earlier() {
        let marks = CommitMarks::new(4);
        let first = Instant::now();
        let later = first + Duration::from_millis(5);
        marks.mark([1u64].into_iter(), first);
        marks.mark([5u64].into_iter(), later);
        assert_eq!(marks.take(1), None);
        assert_eq!(marks.take(5), Some(later));
    }

    #[test]
    fn the_notify_stage_is_timed_only_for_events_committed_here() {
        let stages = Stages::default();
        let ours = uuid::Uuid::new_v4();
        let committed = Instant::now();
        stages.committed([ours], committed);
        stages.heard(uuid::Uuid::new_v4(), committed + Duration::from_millis(1));
        stages.heard(ours, committed + Duration::from_millis(2));
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register("stage_seconds", "", stages.family());
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        let line = |name: &str| {
            text.lines()
                .find(|line| line.starts_with(&format!("{name}{{stage=\"notify\"}}")))
                .and_then(|line| line.rsplit_once(' '))
                .map(|(_, value)| value.parse::<f64>().unwrap())
        };
        assert_eq!(
            line("stage_seconds_count"),
            Some(1.0),
            "only the event committed here is timed:\n{text}"
        );
        let sum = line("stage_seconds_sum").unwrap();
        assert!((sum - 0.002).abs() < 1e-9, "{sum}");
    }

    #[test]
    fn a_stamp_keeps_its_instant_to_the_nanosecond() {
        let stamp = Stamp::default();
        assert_eq!(stamp.get(), None);
        let at = Instant::now() + Duration::from_micros(1500);
        stamp.set(at);
        let back = stamp.get().unwrap();
        assert!(
            back <= at && at - back < Duration::from_micros(1),
            "{back:?} {at:?}"
        );
    }
}
