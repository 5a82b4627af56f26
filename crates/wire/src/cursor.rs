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
//! The cursor also names its event: the last six hex digits of the event's
//! id (its `check`). A relay resuming from a cursor whose seq holds another
//! event, or none it could have pruned, knows the cursor comes from a
//! history this database no longer has (a failover that lost the old
//! primary's last commits) and tells the client to re-read its state.
//!
//! The text form is `<seq>.<horizon>.<check>`: two unsigned decimal integers
//! and six lowercase hex digits, for example `152.88410.3fa2c1`. The forms
//! without the check, `<seq>.<horizon>`, and without either, `<seq>` (from
//! before cursors had them), are still read; a plain seq replays from a
//! fixed look-back below it, which is a guess. To a client the id is
//! opaque: a native `EventSource` sends it back unchanged.

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
    /// The last 24 bits of the id of the event at `seq`, when known.
    pub check: Option<u32>,
}

/// Why a `Last-Event-ID` is not a cursor.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "Last-Event-ID must be the `id:` of a durable event (`<seq>.<horizon>.<check>`, or a \
     stream's compound `<seq>.<horizon>.<check>~<scope>…` in base 36), got {0:?}"
)]
pub struct CursorParseError(String);

impl CursorParseError {
    /// The error for `text`, cut to a readable length.
    pub(crate) fn new(text: &str) -> Self {
        CursorParseError(text.chars().take(MAX_CURSOR_LEN + 4).collect())
    }
}

/// The longest cursor text accepted: two 20-digit integers, the check and
/// the dots.
const MAX_CURSOR_LEN: usize = 48;
/// The check's digits.
const CHECK_DIGITS: usize = 6;

impl ResumeCursor {
    /// A cursor with a horizon.
    pub fn at(seq: i64, horizon: u64) -> Self {
        ResumeCursor {
            seq,
            horizon: Some(horizon),
            check: None,
        }
    }

    /// A plain seq, the form without a horizon.
    pub fn plain(seq: i64) -> Self {
        ResumeCursor {
            seq,
            horizon: None,
            check: None,
        }
    }

    /// This cursor, naming the event with id `event` as the one at its seq.
    pub fn naming(mut self, event: &uuid::Uuid) -> Self {
        self.check = Some(Self::check_of(event));
        self
    }

    /// The check a cursor at the event with id `event` carries.
    pub fn check_of(event: &uuid::Uuid) -> u32 {
        (event.as_u128() & 0xff_ffff) as u32
    }
}

impl fmt::Display for ResumeCursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.seq)?;
        if let Some(horizon) = self.horizon {
            write!(f, ".{horizon}")?;
            if let Some(check) = self.check {
                write!(f, ".{check:06x}")?;
            }
        }
        Ok(())
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
        let invalid = || CursorParseError::new(text);
        let trimmed = text.trim();
        if trimmed.len() > MAX_CURSOR_LEN {
            return Err(invalid());
        }
        let mut parts = trimmed.split('.');
        let seq = parts.next().and_then(unsigned::<i64>).ok_or_else(invalid)?;
        let horizon = match parts.next() {
            None => None,
            Some(horizon) => Some(unsigned::<u64>(horizon).ok_or_else(invalid)?),
        };
        let check = match parts.next() {
            None => None,
            Some(check) => {
                let hex = check.len() == CHECK_DIGITS
                    && check
                        .bytes()
                        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
                Some(
                    hex.then(|| u32::from_str_radix(check, 16).ok())
                        .flatten()
                        .ok_or_else(invalid)?,
                )
            }
        };
        if parts.next().is_some() {
            return Err(invalid());
        }
        Ok(ResumeCursor {
            seq,
            horizon,
            check,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_forms_read_back_as_written() {
        let event = uuid::Uuid::from_u128(0x0123_4567_89ab_cdef_0011_2233_443f_a2c1);
        for cursor in [
            ResumeCursor::at(152, 88_410),
            ResumeCursor::at(152, 88_410).naming(&event),
            ResumeCursor::at(0, 0).naming(&uuid::Uuid::nil()),
            ResumeCursor::at(i64::MAX, u64::MAX).naming(&uuid::Uuid::max()),
            ResumeCursor::plain(42),
        ] {
            assert_eq!(cursor.to_string().parse::<ResumeCursor>(), Ok(cursor));
        }
        assert_eq!(ResumeCursor::at(152, 88_410).to_string(), "152.88410");
        assert_eq!(
            ResumeCursor::at(152, 88_410).naming(&event).to_string(),
            "152.88410.3fa2c1"
        );
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
            "1.2.3",
            "1.2.3fa2c",
            "1.2.3FA2C1",
            "1.2.3fa2c1.4",
            "1.2.gggggg",
            "1.2.+3fa2c",
        ] {
            assert!(bad.parse::<ResumeCursor>().is_err(), "{bad:?}");
        }
    }
}
