//! Postgres transaction snapshots, read on the Rust side.
//!
//! A relay records `pg_current_snapshot()` when a subscriber joins. Every
//! outbox row records the transaction that wrote it (`txid`), so "did this
//! event commit before the subscriber joined?" is exactly "is its
//! transaction visible in that snapshot?". This is what tells history apart
//! from a late commit: both can have a seq below the newest one the
//! subscriber could see, but only the late commit was still running.

use std::fmt;

/// Why a snapshot's text form could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a Postgres snapshot (xmin:xmax:xip,...): {0:?}")]
pub struct SnapshotParseError(String);

/// The visible set of transactions at one moment, as `pg_snapshot` prints
/// it: every transaction below `xmin` had finished, none from `xmax` on had
/// started, and those listed in `in_progress` were still running.
#[derive(Clone, PartialEq, Eq)]
pub struct Snapshot {
    xmin: u64,
    xmax: u64,
    /// Sorted, for a binary search.
    in_progress: Vec<u64>,
}

impl Snapshot {
    /// Reads the text form `xmin:xmax:xip1,xip2,...`.
    pub fn parse(text: &str) -> Result<Snapshot, SnapshotParseError> {
        let invalid = || SnapshotParseError(text.chars().take(80).collect());
        let mut parts = text.trim().splitn(3, ':');
        let number =
            |part: Option<&str>| part.and_then(|p| p.parse::<u64>().ok()).ok_or_else(invalid);
        let xmin = number(parts.next())?;
        let xmax = number(parts.next())?;
        let mut in_progress = match parts.next() {
            None | Some("") => Vec::new(),
            Some(list) => list
                .split(',')
                .map(|xid| xid.parse::<u64>().map_err(|_| invalid()))
                .collect::<Result<Vec<_>, _>>()?,
        };
        if xmin > xmax || in_progress.iter().any(|&xid| xid < xmin || xid >= xmax) {
            return Err(invalid());
        }
        in_progress.sort_unstable();
        Ok(Snapshot {
            xmin,
            xmax,
            in_progress,
        })
    }

    /// The oldest transaction still running when the snapshot was taken:
    /// every one below it had finished.
    pub fn xmin(&self) -> u64 {
        self.xmin
    }

    /// The first transaction id not yet assigned when the snapshot was
    /// taken.
    pub fn xmax(&self) -> u64 {
        self.xmax
    }

    /// True when the transaction `txid` had committed when the snapshot was
    /// taken (Postgres's `pg_visible_in_snapshot`).
    pub fn is_visible(&self, txid: u64) -> bool {
        if txid < self.xmin {
            return true;
        }
        if txid >= self.xmax {
            return false;
        }
        self.in_progress.binary_search(&txid).is_err()
    }
}

impl fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:", self.xmin, self.xmax)?;
        for (i, xid) in self.in_progress.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{xid}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn visibility_follows_postgres_rules() {
        let snapshot = Snapshot::parse("100:105:103,101").unwrap();
        assert!(snapshot.is_visible(99), "finished before xmin");
        assert!(snapshot.is_visible(102), "committed between");
        assert!(snapshot.is_visible(104));
        assert!(!snapshot.is_visible(101), "still running");
        assert!(!snapshot.is_visible(103));
        assert!(!snapshot.is_visible(105), "started after");
        assert!(!snapshot.is_visible(9_000));
        assert_eq!(format!("{snapshot:?}"), "100:105:101,103");
    }

    #[test]
    fn an_empty_in_progress_list_and_garbage() {
        let snapshot = Snapshot::parse("7:7:").unwrap();
        assert!(snapshot.is_visible(6));
        assert!(!snapshot.is_visible(7));
        for bad in ["", "7", "7:x:", "9:7:", "7:9:10", "7:9:8,a", "-1:2:"] {
            assert!(Snapshot::parse(bad).is_err(), "{bad:?}");
        }
    }
}
