//! Server-Sent Events framing.
//!
//! Frames are text: `id:` (durable events only, the [`ResumeCursor`] a
//! client sends back as `Last-Event-ID`), `event:`, one `data:` line per line of the
//! payload, and a blank line. Every field is written so that no value can end
//! a frame early or inject a field: line breaks inside `data` become separate
//! `data:` lines (which a client joins back with `\n`), and line breaks in
//! single-line fields are replaced with spaces.

use std::fmt::Write as _;

use crate::cursor::ResumeCursor;
use crate::envelope::EventEnvelope;

/// The heartbeat comment frame.
pub const HEARTBEAT_FRAME: &str = ": hb\n\n";

/// The event type of the frame sent once a subscription is live.
pub const READY_EVENT: &str = "ready";

/// The event type of the frame that warns a stream's credentials expire
/// soon: fetch a new token and open the next stream before this one ends.
pub const REAUTH_EVENT: &str = "reauth";

/// Encodes an envelope as one frame, its `id:` the plain seq. Only durable
/// events get an `id:` line, because an ephemeral id would point at nothing
/// in the outbox.
pub fn event_frame(envelope: &EventEnvelope) -> String {
    let id = envelope.seq.map(ResumeCursor::plain);
    event_frame_at(envelope, id)
}

/// Encodes an envelope as one frame whose `id:` is `cursor` (durable events
/// only; an ephemeral event never gets one).
pub fn event_frame_at(envelope: &EventEnvelope, cursor: Option<ResumeCursor>) -> String {
    let data = serde_json::to_string(envelope).unwrap_or_else(|_| "{}".to_owned());
    let id = if envelope.is_durable() { cursor } else { None };
    frame(id, Some(&envelope.event_type), &data)
}

/// Encodes a frame from its parts.
pub fn frame(id: Option<ResumeCursor>, event: Option<&str>, data: &str) -> String {
    let mut out = String::with_capacity(data.len() + 48);
    if let Some(id) = id {
        let _ = writeln!(out, "id: {id}");
    }
    if let Some(event) = event {
        out.push_str("event: ");
        push_single_line(&mut out, event);
        out.push('\n');
    }
    for line in split_lines(data) {
        out.push_str("data: ");
        out.push_str(line);
        out.push('\n');
    }
    out.push('\n');
    out
}

/// The `ready` frame: sent after any replay, once the subscription is live.
/// `resync` tells the client to re-read what it shows, because events may
/// have happened that it will never be sent.
pub fn ready_frame(resync: bool) -> String {
    let data = if resync {
        r#"{"resync":true}"#
    } else {
        r#"{"resync":false}"#
    };
    frame(None, Some(READY_EVENT), data)
}

/// The `ready` frame of a stream carrying several scopes: the scopes it
/// carries, and those whose state the client must re-read (`resync` is
/// true when there is one, so a client that knows only that field
/// re-reads everything).
pub fn ready_frame_for_scopes(scopes: &[&str], resync_scopes: &[&str]) -> String {
    let data = serde_json::json!({
        "resync": !resync_scopes.is_empty(),
        "scopes": scopes,
        "resyncScopes": resync_scopes,
    });
    frame(None, Some(READY_EVENT), &data.to_string())
}

/// The `reauth` frame: the stream's credentials expire in
/// `expires_in_secs` seconds, and the stream ends then.
pub fn reauth_frame(expires_in_secs: u64) -> String {
    frame(
        None,
        Some(REAUTH_EVENT),
        &format!(r#"{{"expiresIn":{expires_in_secs}}}"#),
    )
}

/// The event type of the last frame of a stream an operator ended.
pub const REVOKED_EVENT: &str = "revoked";

/// The event type of a stream's presence frames: who else is connected to
/// its scope (see the wire-format chapter).
pub const PRESENCE_EVENT: &str = "presence";

/// The `revoked` frame: an operator disconnected this subscriber, and the
/// stream ends now. A client should not reconnect with the same
/// credentials.
pub fn revoked_frame() -> String {
    frame(None, Some(REVOKED_EVENT), r#"{"reason":"disconnected"}"#)
}

/// The `revoked` frame of one scope an operator took out of a stream that
/// carries several: the stream goes on with the others.
pub fn revoked_scope_frame(scope_key: &str) -> String {
    let data = serde_json::json!({ "reason": "disconnected", "scope": scope_key });
    frame(None, Some(REVOKED_EVENT), &data.to_string())
}

/// The `retry:` frame telling a client how long to wait before reconnecting.
pub fn retry_frame(milliseconds: u64) -> String {
    format!("retry: {milliseconds}\n\n")
}

/// A comment frame; every line of `text` becomes its own comment line.
pub fn comment_frame(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 4);
    for line in split_lines(text) {
        out.push(':');
        if !line.is_empty() {
            out.push(' ');
            out.push_str(line);
        }
        out.push('\n');
    }
    out.push('\n');
    out
}

/// Splits on every line ending an SSE parser honours: CRLF, CR and LF.
fn split_lines(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = Some(text);
    std::iter::from_fn(move || {
        let current = rest?;
        match current.find(['\r', '\n']) {
            Some(at) => {
                let skip = if current[at..].starts_with("\r\n") {
                    2
                } else {
                    1
                };
                rest = Some(&current[at + skip..]);
                Some(&current[..at])
            }
            None => {
                rest = None;
                Some(current)
            }
        }
    })
}

fn push_single_line(out: &mut String, value: &str) {
    for c in value.chars() {
        out.push(if c == '\r' || c == '\n' { ' ' } else { c });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envelope::NewEvent;
    use chrono::Utc;
    use serde_json::json;

    #[test]
    fn durable_frames_carry_an_id() {
        let mut envelope =
            NewEvent::durable("order.created", "s", json!({"a": 1})).into_envelope(Utc::now());
        envelope.seq = Some(17);
        let frame = event_frame(&envelope);
        assert!(frame.starts_with("id: 17\nevent: order.created\ndata: {"));
        assert!(frame.ends_with("}\n\n"));
        assert_eq!(frame.matches('\n').count(), 4);
    }

    #[test]
    fn ephemeral_frames_carry_no_id() {
        let envelope = NewEvent::ephemeral("tick", "s", json!(1)).into_envelope(Utc::now());
        let frame = event_frame(&envelope);
        assert!(frame.starts_with("event: tick\ndata: {"));
        assert!(!frame.contains("\nid:"));
    }

    #[test]
    fn multi_line_data_becomes_several_data_lines() {
        assert_eq!(
            frame(None, None, "a\nb\r\nc\rd"),
            "data: a\ndata: b\ndata: c\ndata: d\n\n"
        );
        assert_eq!(frame(None, None, ""), "data: \n\n");
        assert_eq!(frame(None, None, "x\n"), "data: x\ndata: \n\n");
    }

    #[test]
    fn a_newline_in_the_event_type_cannot_break_framing() {
        let text = frame(
            Some(ResumeCursor::plain(1)),
            Some("evil\n\ndata: forged\r"),
            "{}",
        );
        assert_eq!(text, "id: 1\nevent: evil  data: forged \ndata: {}\n\n");
    }

    #[test]
    fn control_frames() {
        assert_eq!(retry_frame(3000), "retry: 3000\n\n");
        assert_eq!(comment_frame("hb"), HEARTBEAT_FRAME);
        assert_eq!(comment_frame("a\nb"), ": a\n: b\n\n");
        assert_eq!(
            ready_frame(true),
            "event: ready\ndata: {\"resync\":true}\n\n"
        );
        assert_eq!(
            ready_frame(false),
            "event: ready\ndata: {\"resync\":false}\n\n"
        );
    }
}
