//! The Rust client's SSE parser on arbitrary bytes: it never panics, and how
//! the stream is cut into chunks does not change what it produces. The first
//! four input bytes are two split positions (u16 LE each, taken modulo the
//! stream length + 1); the rest is the stream. The stream is parsed whole,
//! split at one position, split at both, and one byte at a time.
#![no_main]

use eventrelay_client::sse::{SseItem, SseParser};
use libfuzzer_sys::fuzz_target;

fn parse_chunks<'a>(chunks: impl IntoIterator<Item = &'a [u8]>) -> (Vec<SseItem>, String) {
    let mut parser = SseParser::new();
    let mut items = Vec::new();
    for chunk in chunks {
        parser.feed_into(chunk, &mut items);
    }
    (items, parser.last_event_id().to_owned())
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 4 {
        return;
    }
    let (header, stream) = data.split_at(4);
    let at = |i: usize| usize::from(u16::from_le_bytes([header[i], header[i + 1]])) % (stream.len() + 1);
    let (mut first, mut second) = (at(0), at(2));
    if first > second {
        std::mem::swap(&mut first, &mut second);
    }

    let mut parser = SseParser::new();
    let whole = parser.feed(stream);
    let whole_last = parser.last_event_id().to_owned();

    for item in &whole {
        if let SseItem::Event(event) = item {
            assert!(!event.event_type.is_empty());
            assert!(!event.event_type.contains(['\r', '\n']), "{event:?}");
            assert!(!event.data.contains('\r'), "{event:?}");
            if let Some(id) = &event.id {
                assert!(!id.contains(['\r', '\n', '\0']), "{event:?}");
            }
            assert!(!event.last_event_id.contains(['\r', '\n', '\0']), "{event:?}");
        }
    }

    let one_split = parse_chunks([&stream[..first], &stream[first..]]);
    assert_eq!(
        (&one_split.0, &one_split.1),
        (&whole, &whole_last),
        "split at {first} changed the result"
    );

    let two_splits = parse_chunks([
        &stream[..first],
        &stream[first..second],
        &[][..],
        &stream[second..],
    ]);
    assert_eq!(
        (&two_splits.0, &two_splits.1),
        (&whole, &whole_last),
        "split at {first} and {second} changed the result"
    );

    let bytewise = parse_chunks(stream.chunks(1));
    assert_eq!(
        (&bytewise.0, &bytewise.1),
        (&whole, &whole_last),
        "byte-at-a-time changed the result"
    );
});
