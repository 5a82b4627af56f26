//! W3C trace context as an event carries it: the `traceparent` given at
//! publish, stored with the outbox row, and continued by the relay's spans
//! and the webhook request.
//!
//! A `traceparent` comes from the application, which may send anything, so
//! it is parsed leniently in one sense only: a malformed value is ignored
//! (the event simply has no parent trace), never an error that could lose
//! the event.

use std::fmt;

/// The length of a version-00 `traceparent`: `00-<32 hex>-<16 hex>-<2 hex>`.
pub const TRACEPARENT_LEN: usize = 55;

/// A valid W3C `traceparent`: the trace, the parent span in it, and the
/// flags (bit 0: sampled).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TraceParent {
    pub trace_id: u128,
    pub parent_id: u64,
    pub flags: u8,
}

impl TraceParent {
    /// Parses a `traceparent` header value; `None` when it is malformed.
    ///
    /// Follows the W3C rules: lowercase hex, version `ff` refused, an
    /// all-zero trace or parent id refused, and a later version read by
    /// its first 55 characters when a `-` follows them.
    pub fn parse(text: &str) -> Option<TraceParent> {
        let text = text.trim();
        let bytes = text.as_bytes();
        // ASCII first, so the slices below fall on character boundaries.
        if bytes.len() < TRACEPARENT_LEN || !bytes[..TRACEPARENT_LEN].is_ascii() {
            return None;
        }
        let version = hex_field(&text[0..2])? as u8;
        match (version, bytes.len()) {
            (0xff, _) => return None,
            (0, TRACEPARENT_LEN) => {}
            (0, _) => return None,
            (_, TRACEPARENT_LEN) => {}
            (_, _) if bytes[TRACEPARENT_LEN] == b'-' => {}
            _ => return None,
        }
        if bytes[2] != b'-' || bytes[35] != b'-' || bytes[52] != b'-' {
            return None;
        }
        let trace_id = hex_field(&text[3..35])?;
        let parent_id = hex_field(&text[36..52])? as u64;
        let flags = hex_field(&text[53..55])? as u8;
        if trace_id == 0 || parent_id == 0 {
            return None;
        }
        Some(TraceParent {
            trace_id,
            parent_id,
            flags,
        })
    }

    /// Parses an optional value, ignoring a malformed one.
    pub fn parse_optional(text: Option<&str>) -> Option<TraceParent> {
        text.and_then(TraceParent::parse)
    }

    /// Whether the caller recorded the trace (flag bit 0).
    pub fn sampled(&self) -> bool {
        self.flags & 1 == 1
    }
}

/// Always written as version 00, the version this crate understands.
impl fmt::Display for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "00-{:032x}-{:016x}-{:02x}",
            self.trace_id, self.parent_id, self.flags
        )
    }
}

/// Lowercase hex digits only (`u128::from_str_radix` would also take a
/// sign and uppercase).
fn hex_field(text: &str) -> Option<u128> {
    if text.is_empty()
        || !text
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return None;
    }
    u128::from_str_radix(text, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_value_round_trips() {
        let parent = TraceParent::parse(VALID).unwrap();
        assert_eq!(parent.trace_id, 0x4bf92f3577b34da6a3ce929d0e0e4736);
        assert_eq!(parent.parent_id, 0x00f067aa0ba902b7);
        assert!(parent.sampled());
        assert_eq!(parent.to_string(), VALID);
        let unsampled = TraceParent::parse(&VALID.replace("-01", "-00")).unwrap();
        assert!(!unsampled.sampled());
    }

    #[test]
    fn malformed_values_are_ignored() {
        for broken in [
            "",
            "00",
            "garbage",
            &VALID.to_uppercase(),
            &VALID.replace("00-4bf", "ff-4bf"),
            &format!("{VALID}-extra"),
            &VALID.replace("4bf92f3577b34da6a3ce929d0e0e4736", &"0".repeat(32)),
            &VALID.replace("00f067aa0ba902b7", &"0".repeat(16)),
            &VALID.replace("-00f0", "+00f0"),
            &VALID.replace("4bf9", "+bf9"),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",
            "é0-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceParent::parse(broken), None, "{broken:?}");
        }
        assert_eq!(TraceParent::parse_optional(None), None);
    }

    #[test]
    fn a_later_version_is_read_by_its_known_fields() {
        let later = format!("{}-more", VALID.replacen("00", "01", 1));
        let parent = TraceParent::parse(&later).unwrap();
        assert_eq!(parent.trace_id, 0x4bf92f3577b34da6a3ce929d0e0e4736);
        assert_eq!(parent.to_string(), VALID, "written back as version 00");
    }
}
