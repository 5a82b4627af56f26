//! Every SSE frame the wire crate writes reads back exactly through this
//! crate's parser, which follows the EventSource parsing rules: the relay's
//! writer and the clients' reader agree on generated inputs.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a panic is the test failing"
)]

use eventrelay_client::sse::{SseEvent, SseItem, SseParser};
use eventrelay_wire::ResumeCursor;
use eventrelay_wire::sse::frame;
use proptest::prelude::*;

/// The one event `text` holds; fails if it holds anything else or ends
/// early (a second blank line would dispatch twice).
fn read_one(text: &str) -> SseEvent {
    let items = SseParser::new().feed(text.as_bytes());
    match items.as_slice() {
        [SseItem::Event(event)] => event.clone(),
        other => panic!("{text:?} read as {other:?}, not one event"),
    }
}

proptest! {
    #[test]
    fn sse_frames_read_back_exactly(
        id in prop::option::of((1i64..i64::MAX, prop::option::of((any::<u64>(), prop::option::of(0u32..0x100_0000))))),
        event in "[^\r\n]{1,20}",
        data in "(.|\r|\n){0,60}",
    ) {
        let id = id.map(|(seq, horizon)| ResumeCursor {
            seq,
            horizon: horizon.map(|(horizon, _)| horizon),
            check: horizon.and_then(|(_, check)| check),
        });
        let read = read_one(&frame(id, Some(&event), &data));
        prop_assert_eq!(read.id.map(|i| i.parse::<ResumeCursor>().unwrap()), id);
        prop_assert_eq!(read.event_type, event);
        prop_assert_eq!(read.data, data.replace("\r\n", "\n").replace('\r', "\n"));
    }

    #[test]
    fn event_fields_with_line_breaks_stay_one_field(event in "(.|\r|\n){1,30}", data in "[^\r\n]{0,10}") {
        let read = read_one(&frame(Some(ResumeCursor::at(1, 2)), Some(&event), &data));
        // Each line break became a space: the type is one field, whole.
        prop_assert_eq!(read.event_type, event.replace(['\r', '\n'], " "));
        prop_assert_eq!(read.data, data);
    }
}
