//! An incremental `text/event-stream` parser that follows the WHATWG
//! EventSource parsing rules.
//!
//! It is fed the response body chunk by chunk as the network hands it over,
//! so nothing may depend on where a chunk ends: a line end, a CRLF pair or a
//! multi-byte UTF-8 character can all be split between two chunks. Bytes are
//! therefore buffered per line and decoded only once the line is complete
//! (CR and LF never occur inside a UTF-8 sequence, so splitting on them
//! first is safe).

use std::time::Duration;

const BOM: &[u8] = b"\xEF\xBB\xBF";

/// One dispatched event: what a browser's `MessageEvent` would carry, plus
/// whether this particular frame had an `id:` of its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field, or `"message"` when the frame had none.
    pub event_type: String,
    /// The `data:` lines joined with `\n`.
    pub data: String,
    /// The `id:` field of this frame, if it had one. The relay puts one on
    /// durable events only, so this is what a durable-only watermark follows.
    pub id: Option<String>,
    /// The stream's last event ID buffer at dispatch, which (as in a
    /// browser) persists across frames that carry no `id:`.
    pub last_event_id: String,
}

/// What the parser produces, in stream order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SseItem {
    /// A complete event with a non-empty data buffer.
    Event(SseEvent),
    /// A valid `retry:` field: the server's reconnection time.
    Retry(Duration),
    /// A comment line's text after the colon, leading space removed: the
    /// relay's heartbeats. Only a parser made with
    /// [`SseParser::keeping_comments`] produces these, for tools that watch
    /// the heartbeats themselves.
    Comment(String),
}

/// Parser state for one connection. Create a new one per connection: an
/// incomplete frame at the end of a stream must be discarded, not joined to
/// the next stream's first frame.
#[derive(Debug, Default)]
pub struct SseParser {
    /// Bytes of the current, not yet terminated line.
    line: Vec<u8>,
    /// The previous chunk ended with CR: an LF at the start of the next chunk
    /// belongs to the same line end.
    after_cr: bool,
    /// The first line has been seen, so a BOM is no longer stripped.
    started: bool,
    data: String,
    event_type: String,
    last_event_id: String,
    frame_id: Option<String>,
    /// Comment lines become [`SseItem::Comment`] instead of being dropped.
    keep_comments: bool,
}

impl SseParser {
    pub fn new() -> Self {
        Self::default()
    }

    /// A parser that also yields comment lines, in stream order.
    pub fn keeping_comments() -> Self {
        SseParser {
            keep_comments: true,
            ..Self::default()
        }
    }

    /// The last event ID buffer: the most recent valid `id:` value.
    pub fn last_event_id(&self) -> &str {
        &self.last_event_id
    }

    /// Parses `chunk` and returns the items it completed.
    pub fn feed(&mut self, chunk: &[u8]) -> Vec<SseItem> {
        let mut out = Vec::new();
        self.feed_into(chunk, &mut out);
        out
    }

    /// Parses `chunk`, appending the items it completed to `out`.
    pub fn feed_into(&mut self, chunk: &[u8], out: &mut Vec<SseItem>) {
        let mut rest = chunk;
        if self.after_cr && !rest.is_empty() {
            self.after_cr = false;
            if rest[0] == b'\n' {
                rest = &rest[1..];
            }
        }
        while let Some(end) = rest.iter().position(|&b| b == b'\r' || b == b'\n') {
            self.line.extend_from_slice(&rest[..end]);
            let was_cr = rest[end] == b'\r';
            rest = &rest[end + 1..];
            self.process_line(out);
            if was_cr {
                match rest.first() {
                    Some(b'\n') => rest = &rest[1..],
                    Some(_) => {}
                    None => self.after_cr = true,
                }
            }
        }
        self.line.extend_from_slice(rest);
    }

    fn process_line(&mut self, out: &mut Vec<SseItem>) {
        let raw = std::mem::take(&mut self.line);
        let mut bytes = raw.as_slice();
        if !self.started {
            self.started = true;
            bytes = bytes.strip_prefix(BOM).unwrap_or(bytes);
        }
        let line = String::from_utf8_lossy(bytes);
        if line.is_empty() {
            self.dispatch(out);
        } else if let Some(comment) = line.strip_prefix(':') {
            // The relay's heartbeats: nothing for an EventSource to do.
            if self.keep_comments {
                let text = comment.strip_prefix(' ').unwrap_or(comment);
                out.push(SseItem::Comment(text.to_owned()));
            }
        } else if let Some((field, value)) = line.split_once(':') {
            let value = value.strip_prefix(' ').unwrap_or(value);
            self.field(field, value, out);
        } else {
            self.field(&line, "", out);
        }
        // Keep the allocation for the next line.
        self.line = raw;
        self.line.clear();
    }

    fn field(&mut self, field: &str, value: &str, out: &mut Vec<SseItem>) {
        match field {
            "event" => value.clone_into(&mut self.event_type),
            "data" => {
                self.data.push_str(value);
                self.data.push('\n');
            }
            "id" if !value.contains('\0') => {
                value.clone_into(&mut self.last_event_id);
                self.frame_id = Some(value.to_owned());
            }
            "retry" if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) => {
                // Only digits, so the sole failure is overflow: saturate.
                let millis = value.parse().unwrap_or(u64::MAX);
                out.push(SseItem::Retry(Duration::from_millis(millis)));
            }
            _ => {}
        }
    }

    fn dispatch(&mut self, out: &mut Vec<SseItem>) {
        let id = self.frame_id.take();
        let event_type = std::mem::take(&mut self.event_type);
        if self.data.is_empty() {
            return;
        }
        let mut data = std::mem::take(&mut self.data);
        data.pop(); // the '\n' every data line appended
        out.push(SseItem::Event(SseEvent {
            event_type: if event_type.is_empty() {
                "message".to_owned()
            } else {
                event_type
            },
            data,
            id,
            last_event_id: self.last_event_id.clone(),
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(input: &[u8]) -> Vec<SseItem> {
        SseParser::new().feed(input)
    }

    fn events(input: &[u8]) -> Vec<SseEvent> {
        parse(input)
            .into_iter()
            .filter_map(|item| match item {
                SseItem::Event(event) => Some(event),
                SseItem::Retry(_) | SseItem::Comment(_) => None,
            })
            .collect()
    }

    fn event(event_type: &str, data: &str, id: Option<&str>, last: &str) -> SseEvent {
        SseEvent {
            event_type: event_type.into(),
            data: data.into(),
            id: id.map(Into::into),
            last_event_id: last.into(),
        }
    }

    #[test]
    fn lines_end_at_lf_crlf_and_cr() {
        for input in [
            &b"data: a\n\ndata: b\n\n"[..],
            b"data: a\r\n\r\ndata: b\r\n\r\n",
            b"data: a\r\rdata: b\r\r",
            b"data: a\r\n\rdata: b\n\r\n",
        ] {
            let got = events(input);
            assert_eq!(
                got,
                vec![
                    event("message", "a", None, ""),
                    event("message", "b", None, "")
                ],
                "{input:?}"
            );
        }
    }

    #[test]
    fn a_cr_ending_one_chunk_and_an_lf_starting_the_next_are_one_line_end() {
        let mut parser = SseParser::new();
        assert!(parser.feed(b"data: a\r").is_empty());
        // Were the LF a second line end, it would dispatch here.
        assert!(parser.feed(b"\n").is_empty());
        assert_eq!(
            parser.feed(b"\r\n"),
            vec![SseItem::Event(event("message", "a", None, ""))]
        );
        // An empty chunk in between does not forget the pending CR.
        let mut parser = SseParser::new();
        parser.feed(b"data: a\r");
        parser.feed(b"");
        assert!(parser.feed(b"\n").is_empty());
    }

    #[test]
    fn a_leading_bom_is_stripped_once() {
        assert_eq!(
            events(b"\xEF\xBB\xBFdata: a\n\n"),
            vec![event("message", "a", None, "")]
        );
        // A second BOM is part of the field name, which is then unknown.
        assert!(events(b"\xEF\xBB\xBF\xEF\xBB\xBFdata: a\n\n").is_empty());
        // A BOM later in the stream is not stripped either.
        assert_eq!(
            events(b"data: a\n\n\xEF\xBB\xBFdata: b\n\n"),
            vec![event("message", "a", None, "")]
        );
        // Split across chunks, it is still recognised.
        let mut parser = SseParser::new();
        parser.feed(b"\xEF");
        parser.feed(b"\xBB");
        assert_eq!(
            parser.feed(b"\xBFdata: a\n\n"),
            vec![SseItem::Event(event("message", "a", None, ""))]
        );
    }

    #[test]
    fn comments_are_ignored() {
        assert_eq!(
            events(b": hb\n\n:another\ndata: a\n: mid-frame\n\n"),
            vec![event("message", "a", None, "")]
        );
    }

    #[test]
    fn a_parser_keeping_comments_yields_them_in_stream_order() {
        let mut parser = SseParser::keeping_comments();
        assert_eq!(
            parser.feed(b": hb\n\n:another\ndata: a\n: mid\n\n"),
            vec![
                SseItem::Comment("hb".into()),
                SseItem::Comment("another".into()),
                SseItem::Comment("mid".into()),
                SseItem::Event(event("message", "a", None, "")),
            ]
        );
    }

    #[test]
    fn one_leading_space_is_stripped_from_the_value() {
        assert_eq!(
            events(b"data:a\n\ndata: b\n\ndata:  c\n\n"),
            vec![
                event("message", "a", None, ""),
                event("message", "b", None, ""),
                event("message", " c", None, ""),
            ]
        );
        // Only the first colon separates; the rest belong to the value.
        assert_eq!(
            events(b"data: {\"a\": 1}\n\n"),
            vec![event("message", "{\"a\": 1}", None, "")]
        );
    }

    #[test]
    fn data_lines_join_with_lf() {
        assert_eq!(
            events(b"data: one\ndata\ndata: three\n\n"),
            vec![event("message", "one\n\nthree", None, "")]
        );
        // A single empty data line is an event with empty data.
        assert_eq!(events(b"data\n\n"), vec![event("message", "", None, "")]);
    }

    #[test]
    fn an_empty_data_buffer_dispatches_nothing_and_resets_the_type() {
        assert!(events(b"event: ready\n\n\n\n").is_empty());
        assert_eq!(
            events(b"event: lost\n\ndata: a\n\n"),
            vec![event("message", "a", None, "")]
        );
    }

    #[test]
    fn the_event_type_applies_to_its_frame_only() {
        assert_eq!(
            events(b"event: order.created\ndata: a\n\ndata: b\n\n"),
            vec![
                event("order.created", "a", None, ""),
                event("message", "b", None, ""),
            ]
        );
    }

    #[test]
    fn ids_persist_but_only_the_frame_that_carries_one_reports_it() {
        assert_eq!(
            events(b"id: 7\ndata: a\n\ndata: b\n\nid\ndata: c\n\n"),
            vec![
                event("message", "a", Some("7"), "7"),
                event("message", "b", None, "7"),
                event("message", "c", Some(""), ""),
            ]
        );
    }

    #[test]
    fn an_id_containing_nul_is_ignored() {
        let mut parser = SseParser::new();
        let items = parser.feed(b"id: 1\ndata: a\n\nid: 2\0x\ndata: b\n\n");
        assert_eq!(
            items,
            vec![
                SseItem::Event(event("message", "a", Some("1"), "1")),
                SseItem::Event(event("message", "b", None, "1")),
            ]
        );
        assert_eq!(parser.last_event_id(), "1");
    }

    #[test]
    fn retry_is_honoured_only_with_ascii_digits() {
        assert_eq!(
            parse(b"retry: 3000\n"),
            vec![SseItem::Retry(Duration::from_millis(3000))]
        );
        for bad in [
            &b"retry: 30a\n"[..],
            b"retry: -1\n",
            b"retry: 1.5\n",
            b"retry: \n",
            b"retry\n",
            b"retry:  3000\n",
            "retry: \u{0663}\n".as_bytes(),
        ] {
            assert!(parse(bad).is_empty(), "{bad:?}");
        }
        assert_eq!(
            parse(b"retry: 99999999999999999999999\n"),
            vec![SseItem::Retry(Duration::from_millis(u64::MAX))]
        );
    }

    #[test]
    fn unknown_fields_are_ignored() {
        assert_eq!(
            events(b"foo: bar\nData: no\ndata: a\nDATA: no\n\n"),
            vec![event("message", "a", None, "")]
        );
    }

    #[test]
    fn a_line_without_a_colon_is_a_field_with_an_empty_value() {
        assert_eq!(
            events(b"event\ndata\n\n"),
            vec![event("message", "", None, "")]
        );
        let mut parser = SseParser::new();
        parser.feed(b"id: 3\ndata: a\n\nid\ndata: b\n\n");
        assert_eq!(parser.last_event_id(), "");
    }

    #[test]
    fn an_unterminated_frame_is_not_dispatched() {
        assert!(events(b"data: a\n").is_empty());
        assert!(events(b"data: a").is_empty());
    }

    #[test]
    fn invalid_utf8_is_replaced_not_fatal() {
        assert_eq!(
            events(b"data: a\xFFb\n\n"),
            vec![event("message", "a\u{FFFD}b", None, "")]
        );
    }

    /// A stream that exercises every rule at once, as the relay (and worse
    /// servers) might send it.
    const SAMPLE: &[u8] =
        b"\xEF\xBB\xBFretry: 3000\r\n\r\n: hb\n\nevent: ready\ndata: {\"resync\":true}\n\n\
id: 1\r\nevent: order.created\r\ndata: {\"n\": \"caf\xC3\xA9 \xF0\x9F\x8E\x89\"}\r\n\r\n\
event: tick\rdata: one\rdata:two\r\r\
id: 2\0\nid: 3\ndata\nfoo\nretry: x\n\n\
: trailing comment\r\ndata: last\n\n";

    fn sample_expected() -> Vec<SseItem> {
        vec![
            SseItem::Retry(Duration::from_millis(3000)),
            SseItem::Event(event("ready", "{\"resync\":true}", None, "")),
            SseItem::Event(event(
                "order.created",
                "{\"n\": \"caf\u{e9} \u{1F389}\"}",
                Some("1"),
                "1",
            )),
            SseItem::Event(event("tick", "one\ntwo", None, "1")),
            SseItem::Event(event("message", "", Some("3"), "3")),
            SseItem::Event(event("message", "last", None, "3")),
        ]
    }

    #[test]
    fn the_sample_parses_in_one_chunk() {
        assert_eq!(parse(SAMPLE), sample_expected());
    }

    #[test]
    fn the_sample_parses_the_same_split_at_every_byte_position() {
        for split in 0..=SAMPLE.len() {
            let mut parser = SseParser::new();
            let mut items = parser.feed(&SAMPLE[..split]);
            items.extend(parser.feed(&SAMPLE[split..]));
            assert_eq!(items, sample_expected(), "split at {split}");
        }
    }

    #[test]
    fn the_sample_parses_the_same_split_at_every_pair_of_positions() {
        for first in 0..=SAMPLE.len() {
            for second in first..=SAMPLE.len() {
                let mut parser = SseParser::new();
                let mut items = parser.feed(&SAMPLE[..first]);
                items.extend(parser.feed(&SAMPLE[first..second]));
                items.extend(parser.feed(&SAMPLE[second..]));
                assert_eq!(items, sample_expected(), "split at {first} and {second}");
            }
        }
    }

    #[test]
    fn the_sample_parses_the_same_one_byte_at_a_time() {
        let mut parser = SseParser::new();
        let items: Vec<_> = SAMPLE
            .iter()
            .flat_map(|byte| parser.feed(std::slice::from_ref(byte)))
            .collect();
        assert_eq!(items, sample_expected());
    }
}
