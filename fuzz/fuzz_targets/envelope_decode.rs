//! Any bytes to `EventEnvelope` with serde_json. Whatever parses gives an SSE
//! frame with exactly one blank line, at its end, and only `id:`, `event:`
//! and `data:` lines (no frame or field injection, valid or not). An envelope
//! that also passes `validate()` round-trips through JSON, and the Rust
//! client's SSE parser reads its frame back as exactly that one event.
#![no_main]

use eventrelay_client::sse::{SseItem, SseParser};
use eventrelay_wire::{EventEnvelope, sse::event_frame};
use libfuzzer_sys::fuzz_target;

/// The complete lines of `text`, split as an SSE parser does (CRLF, CR, LF),
/// and whatever follows the last line end.
fn sse_lines(text: &str) -> (Vec<&str>, &str) {
    let mut lines = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find(['\r', '\n']) {
        lines.push(&rest[..at]);
        let skip = if rest[at..].starts_with("\r\n") { 2 } else { 1 };
        rest = &rest[at + skip..];
    }
    (lines, rest)
}

fn check_framing(frame: &str) {
    let (lines, unterminated) = sse_lines(frame);
    assert!(
        unterminated.is_empty(),
        "frame ends inside a line: {frame:?}"
    );
    assert_eq!(lines.last(), Some(&""), "frame does not end with a blank line: {frame:?}");
    let blank = lines.iter().filter(|line| line.is_empty()).count();
    assert_eq!(blank, 1, "frame has {blank} blank lines: {frame:?}");
    assert!(frame.ends_with("\n\n"), "frame terminator is not LF LF: {frame:?}");
    for line in &lines[..lines.len() - 1] {
        assert!(
            line.starts_with("id: ") || line.starts_with("event: ") || line.starts_with("data: "),
            "frame has an unexpected line {line:?}: {frame:?}"
        );
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(envelope) = serde_json::from_slice::<EventEnvelope>(data) else {
        return;
    };
    let frame = event_frame(&envelope);
    check_framing(&frame);
    if envelope.validate().is_err() {
        return;
    }

    let json = serde_json::to_string(&envelope).expect("a valid envelope serialises");
    let again: EventEnvelope = serde_json::from_str(&json)
        .unwrap_or_else(|e| panic!("serialised envelope does not parse: {e}\njson: {json}"));
    assert_eq!(again, envelope, "JSON round trip changed the envelope\njson: {json}");
    assert_eq!(
        serde_json::to_string(&again).unwrap(),
        json,
        "serialisation is not stable"
    );
    assert!(again.validate().is_ok());

    let items = SseParser::new().feed(frame.as_bytes());
    let [SseItem::Event(event)] = items.as_slice() else {
        panic!("frame did not parse as exactly one event: {items:?}\nframe: {frame:?}");
    };
    assert_eq!(event.event_type, envelope.event_type, "frame: {frame:?}");
    assert_eq!(event.data, json, "frame: {frame:?}");
    let expected_id = if envelope.is_durable() {
        envelope.seq.map(|seq| seq.to_string())
    } else {
        None
    };
    assert_eq!(event.id, expected_id, "frame: {frame:?}");
});
