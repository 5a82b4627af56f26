//! The compound cursor: the `id:` of a stream that carries several scopes,
//! one [`ResumeCursor`] per scope in one short text.
//!
//! Each scope of such a stream keeps its own position, since each is read
//! and resumed on its own, with the exactness a single scope has. Written
//! out whole, sixteen positions would be some 350 characters on every
//! durable frame; but the positions of one stream lie close together (one
//! sequence and one transaction counter serve every scope), so the text
//! carries the highest seq and horizon once and each scope as the distance
//! below them, in base 36:
//!
//! ```text
//! <S>.<H>[.<C>]~<entry>~<entry>…      entry = <tag><dS>[.<dH>]
//! ```
//!
//! `S` is the highest seq of the positions, `H` the highest horizon, and `C`
//! the check of the event at `S` (see [`ResumeCursor`]): the newest event
//! the stream sent, whose loss a rewritten history shows first. Each entry
//! is a scope's [`ScopeTag`] (four characters), then `S - seq` and
//! `H - horizon`, each left out when zero. Numbers are lowercase base-36
//! digits. A scope the stream has sent nothing of has no entry, and resumes
//! with a resync.
//!
//! Entries name their scopes by tag rather than by place, so an id stays
//! good for a stream that asks for some of its scopes again, or for more:
//! a scope without an entry resyncs alone, and entries for scopes the
//! stream does not carry are passed over.

use std::fmt::{self, Write as _};
use std::str::FromStr;

use sha2::{Digest, Sha256};

use crate::cursor::{CursorParseError, ResumeCursor};

/// The longest compound cursor accepted: room for 64 scopes' entries at
/// full length.
pub const MAX_COMPOUND_LEN: usize = 2_048;
/// The most entries a compound cursor may hold.
pub const MAX_COMPOUND_SCOPES: usize = 64;
/// Between the head and the entries, and between entries. Never part of a
/// single-scope cursor, which tells the two forms apart.
const SEPARATOR: char = '~';
/// Characters in a [`ScopeTag`].
const TAG_LEN: usize = 4;
/// How many tags there are: 36 to the power of [`TAG_LEN`].
const TAG_SPACE: u64 = 36 * 36 * 36 * 36;

/// A scope's name in a compound cursor: four base-36 characters from the
/// SHA-256 of its key (its first eight bytes, big-endian, modulo 36⁴). Two
/// scopes of one stream share a tag about once in 14,000 streams of
/// sixteen scopes; their positions are then ambiguous, and both resync.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ScopeTag(u32);

impl ScopeTag {
    /// The tag of `scope_key`.
    pub fn of(scope_key: &str) -> ScopeTag {
        let digest = Sha256::digest(scope_key.as_bytes());
        let mut first = [0u8; 8];
        first.copy_from_slice(&digest[..8]);
        ScopeTag((u64::from_be_bytes(first) % TAG_SPACE) as u32)
    }

    fn write(self, out: &mut String) {
        let mut digits = [b'0'; TAG_LEN];
        let mut value = self.0;
        for digit in digits.iter_mut().rev() {
            *digit = DIGITS[(value % 36) as usize];
            value /= 36;
        }
        out.extend(digits.iter().map(|&b| b as char));
    }
}

/// A stream's position in several scopes, as its frames' `id:` says.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CompoundCursor {
    /// Each scope with a position, in the order written.
    entries: Vec<(ScopeTag, ResumeCursor)>,
}

impl CompoundCursor {
    /// The positions given, in their order; each needs a horizon (one
    /// without is left out: it cannot resume exactly).
    pub fn from_positions(positions: impl IntoIterator<Item = (ScopeTag, ResumeCursor)>) -> Self {
        CompoundCursor {
            entries: positions
                .into_iter()
                .filter(|(_, cursor)| cursor.horizon.is_some())
                .collect(),
        }
    }

    /// The position of the scope tagged `tag`: `None` when there is no
    /// entry for it, or more than one. Only the entry at the highest seq
    /// carries the check.
    pub fn position(&self, tag: ScopeTag) -> Option<ResumeCursor> {
        let mut found = self.entries.iter().filter(|(t, _)| *t == tag);
        let (_, cursor) = found.next()?;
        found.next().is_none().then_some(*cursor)
    }

    /// Every entry, in the order written.
    pub fn entries(&self) -> &[(ScopeTag, ResumeCursor)] {
        &self.entries
    }

    /// The entry with the highest seq, whose event the cursor's check names.
    pub fn newest(&self) -> Option<ResumeCursor> {
        self.entries
            .iter()
            .map(|(_, cursor)| *cursor)
            .max_by_key(|cursor| cursor.seq)
    }

    /// Writes the text form into `out` (cleared first); nothing when there
    /// is no position at all.
    pub fn write_into(&self, out: &mut String) {
        Self::write_positions(out, self.entries.iter().copied());
    }

    /// Writes the text form of `positions` into `out` (cleared first)
    /// without collecting them first: a stream of several scopes writes
    /// one per durable frame. Positions without a horizon are left out.
    pub fn write_positions<I>(out: &mut String, positions: I)
    where
        I: Iterator<Item = (ScopeTag, ResumeCursor)> + Clone,
    {
        out.clear();
        let entries = positions.filter(|(_, cursor)| cursor.horizon.is_some());
        let Some(newest) = entries
            .clone()
            .map(|(_, cursor)| cursor)
            .max_by_key(|cursor| cursor.seq)
        else {
            return;
        };
        let top_seq = newest.seq;
        let top_horizon = entries
            .clone()
            .filter_map(|(_, cursor)| cursor.horizon)
            .max()
            .unwrap_or(0);
        push_base36(out, top_seq as u64);
        out.push('.');
        push_base36(out, top_horizon);
        if let Some(check) = newest.check {
            out.push('.');
            push_base36(out, u64::from(check));
        }
        for (tag, cursor) in entries {
            out.push(SEPARATOR);
            tag.write(out);
            let below = (top_seq - cursor.seq) as u64;
            if below > 0 {
                push_base36(out, below);
            }
            let under = top_horizon - cursor.horizon.unwrap_or(top_horizon);
            if under > 0 {
                out.push('.');
                push_base36(out, under);
            }
        }
    }
}

impl fmt::Display for CompoundCursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = String::new();
        self.write_into(&mut out);
        f.write_str(&out)
    }
}

const DIGITS: &[u8; 36] = b"0123456789abcdefghijklmnopqrstuvwxyz";

fn push_base36(out: &mut String, mut value: u64) {
    let mut digits = [0u8; 13];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = DIGITS[(value % 36) as usize];
        value /= 36;
        if value == 0 {
            break;
        }
    }
    let _ = out.write_str(std::str::from_utf8(&digits[at..]).unwrap_or("0"));
}

/// Lowercase base-36 digits only, within `u64`; empty is not a number.
fn base36(text: &str) -> Option<u64> {
    if text.is_empty() || text.len() > 13 {
        return None;
    }
    text.bytes().try_fold(0u64, |value, b| {
        let digit = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'z' => b - b'a' + 10,
            _ => return None,
        };
        value.checked_mul(36)?.checked_add(u64::from(digit))
    })
}

/// An offset that may be left out (zero), else base-36 digits.
fn offset(text: Option<&str>) -> Option<u64> {
    match text {
        None => Some(0),
        Some(text) => base36(text),
    }
}

impl FromStr for CompoundCursor {
    type Err = CursorParseError;

    /// Reads the text form; surrounding whitespace is ignored.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let invalid = || CursorParseError::new(text);
        let trimmed = text.trim();
        if trimmed.len() > MAX_COMPOUND_LEN {
            return Err(invalid());
        }
        let mut parts = trimmed.split(SEPARATOR);
        let mut head = parts.next().ok_or_else(invalid)?.split('.');
        let top_seq = head.next().and_then(base36).ok_or_else(invalid)?;
        let top_seq = i64::try_from(top_seq).map_err(|_| invalid())?;
        let top_horizon = head.next().and_then(base36).ok_or_else(invalid)?;
        let check = match head.next() {
            None => None,
            Some(check) => Some(
                base36(check)
                    .filter(|check| *check <= 0xff_ffff)
                    .ok_or_else(invalid)? as u32,
            ),
        };
        if head.next().is_some() {
            return Err(invalid());
        }
        let mut entries = Vec::new();
        for entry in parts {
            if entries.len() == MAX_COMPOUND_SCOPES || entry.len() < TAG_LEN {
                return Err(invalid());
            }
            let (tag, rest) = entry.split_at_checked(TAG_LEN).ok_or_else(invalid)?;
            let tag = base36(tag).ok_or_else(invalid)? as u32;
            let mut offsets = rest.splitn(2, '.');
            let below = offsets.next().filter(|digits| !digits.is_empty());
            let below = offset(below).ok_or_else(invalid)?;
            let under = offset(offsets.next()).ok_or_else(invalid)?;
            let seq = i64::try_from(below)
                .ok()
                .and_then(|below| top_seq.checked_sub(below))
                .filter(|seq| *seq >= 0)
                .ok_or_else(invalid)?;
            let horizon = top_horizon.checked_sub(under).ok_or_else(invalid)?;
            let mut cursor = ResumeCursor::at(seq, horizon);
            if seq == top_seq {
                cursor.check = check;
            }
            entries.push((ScopeTag(tag), cursor));
        }
        if entries.is_empty() {
            return Err(invalid());
        }
        Ok(CompoundCursor { entries })
    }
}

/// What a `Last-Event-ID` holds: one scope's cursor, or a stream's
/// position in several.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LastEventId {
    Scope(ResumeCursor),
    Scopes(CompoundCursor),
}

impl FromStr for LastEventId {
    type Err = CursorParseError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text.contains(SEPARATOR) {
            text.parse().map(LastEventId::Scopes)
        } else {
            text.parse().map(LastEventId::Scope)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tag(scope: &str) -> ScopeTag {
        ScopeTag::of(scope)
    }

    #[test]
    fn positions_read_back_as_written() {
        let event = uuid::Uuid::from_u128(0x3fa2c1);
        let cursor = CompoundCursor::from_positions([
            (
                tag("org-1"),
                ResumeCursor::at(8_000_000, 2_000_000).naming(&event),
            ),
            (tag("user-7"), ResumeCursor::at(7_999_500, 1_999_990)),
            (tag("doc-3"), ResumeCursor::at(12, 40)),
        ]);
        let text = cursor.to_string();
        assert_eq!(text.parse::<CompoundCursor>(), Ok(cursor.clone()));
        assert_eq!(
            text.parse::<LastEventId>(),
            Ok(LastEventId::Scopes(cursor.clone()))
        );
        assert_eq!(
            cursor.position(tag("org-1")),
            Some(ResumeCursor::at(8_000_000, 2_000_000).naming(&event))
        );
        assert_eq!(
            cursor.position(tag("user-7")),
            Some(ResumeCursor::at(7_999_500, 1_999_990)),
            "only the newest carries the check"
        );
        assert_eq!(cursor.position(tag("absent")), None);
    }

    #[test]
    fn the_text_is_short() {
        let cursor = CompoundCursor::from_positions([
            (
                tag("a"),
                ResumeCursor::at(8_000_000, 2_000_000).naming(&uuid::Uuid::max()),
            ),
            (tag("b"), ResumeCursor::at(8_000_000 - 35, 2_000_000)),
            (tag("c"), ResumeCursor::at(8_000_000 - 36, 2_000_000 - 1)),
        ]);
        let text = cursor.to_string();
        let tags: Vec<String> = ["a", "b", "c"]
            .iter()
            .map(|scope| {
                let mut out = String::new();
                tag(scope).write(&mut out);
                out
            })
            .collect();
        assert_eq!(
            text,
            format!("4rgu8.16v7k.9zldr~{}~{}z~{}10.1", tags[0], tags[1], tags[2])
        );
    }

    #[test]
    fn a_single_scope_cursor_is_not_compound() {
        assert_eq!(
            "152.88410.3fa2c1".parse::<LastEventId>(),
            Ok(LastEventId::Scope(
                "152.88410.3fa2c1".parse::<ResumeCursor>().unwrap()
            ))
        );
    }

    #[test]
    fn a_tag_shared_by_two_entries_names_neither() {
        let cursor = CompoundCursor::from_positions([
            (tag("a"), ResumeCursor::at(5, 5)),
            (tag("a"), ResumeCursor::at(4, 5)),
            (tag("b"), ResumeCursor::at(3, 5)),
        ]);
        let back: CompoundCursor = cursor.to_string().parse().unwrap();
        assert_eq!(back.position(tag("a")), None);
        assert_eq!(back.position(tag("b")), Some(ResumeCursor::at(3, 5)));
    }

    #[test]
    fn anything_else_is_refused() {
        let long = format!("1.1~{}", vec!["0000"; 65].join("~"));
        for bad in [
            "~",
            "1~0000",
            "1.1",
            "1.1~",
            "1.1~000",
            "1.1~00!0",
            "1.1~0000~",
            "1.1~0000.",
            "1.1~00002",
            "1.1~0000.2",
            "A.1~0000",
            "1.1.zzzzzz~0000",
            "1.1.1.1~0000",
            "-1.1~0000",
            "1.-1~0000",
            "zzzzzzzzzzzzzz.1~0000",
            "1.1~0000 1",
            long.as_str(),
        ] {
            assert!(bad.parse::<CompoundCursor>().is_err(), "{bad:?}");
            if bad.contains('~') {
                assert!(bad.parse::<LastEventId>().is_err(), "{bad:?}");
            }
        }
    }
}
