//! The resume cursor: what a durable frame's `id:` says, and what a client
//! sends back as `Last-Event-ID` to resume exactly where it stopped.
//!
//! A seq alone cannot say that. Seqs are taken at INSERT and become visible
//! at COMMIT, and they are shared by every scope, so a transaction that
//! held seq 1 for a few seconds commits after seq 152 was delivered, and a
//! client resuming "after 152" would never see it. So the cursor also
//! carries a *horizon*: a transaction id below which every transaction had
//! finished, and every event it wrote in the scope had been sent, when the
//! frame went out. Resuming from `seq.horizon` replays every event with a
//! higher seq **and** every event written by a transaction at or above the
//! horizon, whatever its seq: nothing that committed late is left out.
//!
//! The text form is `<seq>.<horizon>`, both unsigned decimal integers, for
//! example `152.88410`. A plain `<seq>` (the form before horizons) is still
//! read; a relay then replays from a fixed look-back below it, which is a
//! guess. To a client the id is opaque: a native `EventSource` sends it back
//! unchanged.

use std::fmt;
use std::str::FromStr;

/// Where a stream stood when a durable frame was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ResumeCursor {
    /// The frame's event's seq (or, for an event replayed from below the
    /// client's own cursor, that cursor's seq).
    pub seq: i64,
    /// Every event of the scope written by a transaction below this id had
    /// been sent; `None` for the plain-seq form.
    pub horizon: Option<u64>,
}

/// Why a `Last-Event-ID` is not a cursor.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "Last-Event-ID must be the `id:` of a durable event (`<seq>` or `<seq>.<horizon>`, unsigned \
     integers), got {0:?}"
)]
pub struct CursorParseError(String);

/// The longest cursor text accepted: two 20-digit integers and the dot.
const MAX_CURSOR_LEN: usize = 41;

impl ResumeCursor {
    /// A cursor with a horizon.
    pub fn at(seq: i64, horizon: u64) -> Self {
        ResumeCursor {
            seq,
            horizon: Some(horizon),
        }
    }
}

impl fmt::Display for ResumeCursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.horizon {
            Some(horizon) => write!(f, "{}.{}", self.seq, horizon),
            None => write!(f, "{}", self.seq),
        }
    }
}

/// Digits only: `str::parse` would also take a sign.
fn unsigned<T: FromStr>(text: &str) -> Option<T> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

impl FromStr for ResumeCursor {
    type Err = CursorParseError;

    /// Reads either form; surrounding whitespace is ignored.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let invalid = || CursorParseError(text.chars().take(MAX_CURSOR_LEN + 4).collect());
        let trimmed = text.trim();
        if trimmed.len() > MAX_CURSOR_LEN {
            return Err(invalid());
        }
        let (seq, horizon) = match trimmed.split_once('.') {
            Some((seq, horizon)) => (seq, Some(unsigned::<u64>(horizon).ok_or_else(invalid)?)),
            None => (trimmed, None),
        };
        let seq = unsigned::<i64>(seq).ok_or_else(invalid)?;
        Ok(ResumeCursor { seq, horizon })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_forms_read_back_as_written() {
        for cursor in [
            ResumeCursor::at(152, 88_410),
            ResumeCursor::at(0, 0),
            ResumeCursor::at(i64::MAX, u64::MAX),
            ResumeCursor {
                seq: 42,
                horizon: None,
            },
        ] {
            assert_eq!(cursor.to_string().parse::<ResumeCursor>(), Ok(cursor));
        }
        assert_eq!(ResumeCursor::at(152, 88_410).to_string(), "152.88410");
        assert_eq!(" 7 ".parse::<ResumeCursor>().unwrap().seq, 7);
    }

    #[test]
    fn anything_else_is_refused() {
        for bad in [
            "",
            ".",
            "-1",
            "+3",
            "abc",
            "1.5.6",
            "1.",
            ".5",
            "1.-5",
            "1.+5",
            "1. 5",
            "99999999999999999999",
            "1.99999999999999999999",
            "1,5",
            "1e3",
        ] {
            assert!(bad.parse::<ResumeCursor>().is_err(), "{bad:?}");
        }
    }
}
