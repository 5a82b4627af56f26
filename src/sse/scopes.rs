//! The scopes one stream carries: which a request asks for and may have
//! ([`choose_scopes`]), and, for a stream of several, what each scope keeps
//! apart ([`SeveralScopes`]): its subscriber, its position in the stream's
//! compound `id:` ([`eventrelay_wire::CompoundCursor`]), whether it must
//! resync, and whether an operator took it out.
//!
//! A stream of one scope needs none of this: its frames go out as its hub
//! encoded them, shared with every other stream of the scope. A stream of
//! several writes each durable frame's `id:` itself, since the id holds the
//! positions of all its scopes.

use std::collections::VecDeque;

use actix_web::http::StatusCode;
use actix_web::web;
use bytes::{Bytes, BytesMut};
use eventrelay_wire::{CompoundCursor, ResumeCursor, ScopeTag, Subscriber, sse};

use super::session::Replay;
use crate::actors::EncodedEvent;
use crate::api_error::{ApiError, ErrorCode};
use crate::auth::ResolvedSubscriber;

/// The scopes a request names with `scope=` (the parameter repeats),
/// sorted and without repeats; empty when it names none.
pub fn requested_scopes(query: &str) -> Result<Vec<String>, ApiError> {
    let invalid = |message: String| ApiError::bad_request(ErrorCode::InvalidQuery, message);
    let pairs = web::Query::<Vec<(String, String)>>::from_query(query)
        .map_err(|error| invalid(format!("the query string cannot be read: {error}")))?;
    let mut scopes = Vec::new();
    for (name, value) in pairs.into_inner() {
        if name == "scope" {
            eventrelay_wire::validate_scope_key(&value)
                .map_err(|error| invalid(format!("scope {value:?}: {error}")))?;
            scopes.push(value);
        }
    }
    scopes.sort_unstable();
    scopes.dedup();
    Ok(scopes)
}

/// The scopes a stream carries, sorted: those `requested`, each of which
/// the credentials must grant (403 `scope_not_granted` naming the first
/// that is not), at most `max` (400 `too_many_scopes`); or, when none is
/// requested, the first `max` scopes the credentials grant.
pub fn choose_scopes(
    resolved: &ResolvedSubscriber,
    requested: Vec<String>,
    max: usize,
) -> Result<Vec<String>, ApiError> {
    if requested.is_empty() {
        let mut granted: Vec<String> = resolved
            .granted_scopes()
            .take(max)
            .map(str::to_owned)
            .collect();
        granted.sort_unstable();
        return Ok(granted);
    }
    if requested.len() > max {
        return Err(ApiError::bad_request(
            ErrorCode::TooManyScopes,
            format!(
                "{} scopes asked for; a stream carries at most {max} (sse.max_scopes_per_stream)",
                requested.len()
            ),
        ));
    }
    if let Some(missing) = requested.iter().find(|scope| !resolved.grants_scope(scope)) {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            ErrorCode::ScopeNotGranted,
            format!("these credentials do not grant scope {missing:?}"),
        ));
    }
    Ok(requested)
}

/// One scope of a stream that carries several.
pub struct ScopeLane {
    /// The stream's subscriber in this scope: the audience rule applies
    /// to each scope's events with the same grants.
    pub subscriber: Subscriber,
    tag: ScopeTag,
    /// The cursor of the last durable frame of this scope sent (or the
    /// one the client resumed from); `None` before either.
    position: Option<ResumeCursor>,
    /// Whether the client must re-read this scope's state.
    resync: bool,
}

impl ScopeLane {
    pub fn new(subscriber: Subscriber, position: Option<ResumeCursor>, resync: bool) -> Self {
        ScopeLane {
            tag: ScopeTag::of(&subscriber.scope_key),
            subscriber,
            position,
            resync,
        }
    }

    fn scope_key(&self) -> &str {
        &self.subscriber.scope_key
    }
}

/// What a stream of several scopes keeps beside a single scope's session.
pub struct SeveralScopes {
    /// In the stream's order (sorted by key).
    lanes: Vec<ScopeLane>,
    /// The replays still to run after the current one, by lane. Scopes
    /// replay one after another, each before the stream's `ready`.
    pending: VecDeque<(usize, Replay)>,
    /// The lane whose replay runs now.
    replaying: usize,
    /// The lanes taken out of the stream (one bit each, by place), as far
    /// as the stream has handled the operator's removals.
    removed: u64,
    /// The compound `id:` text, kept to reuse its buffer.
    id: String,
}

impl SeveralScopes {
    /// The stream's scopes, the first of which replays `first` (which the
    /// session holds); each other lane replays what `pending` gives it.
    pub fn new(lanes: Vec<ScopeLane>, pending: Vec<(usize, Replay)>) -> Self {
        SeveralScopes {
            lanes,
            pending: pending.into(),
            replaying: 0,
            removed: 0,
            id: String::new(),
        }
    }

    /// Whether a scope has a replay still to run.
    pub fn replays_pending(&self) -> bool {
        self.pending
            .iter()
            .any(|(_, replay)| !matches!(replay, Replay::Nothing))
    }

    /// The next scope's replay, once the current one is over; a scope
    /// taken out of the stream meanwhile is not read.
    pub fn next_replay(&mut self) -> Option<Replay> {
        while let Some((lane, replay)) = self.pending.pop_front() {
            if !self.is_removed(lane) {
                self.replaying = lane;
                return Some(replay);
            }
        }
        None
    }

    /// The subscriber the running replay is filtered for.
    pub fn replaying_subscriber(&self) -> &Subscriber {
        &self.lanes[self.replaying].subscriber
    }

    /// How many senders the stream's queue should have: one per hub of a
    /// scope still carried. Fewer means a hub dropped the stream for
    /// reading too slowly, and the stream must end, as a single scope's
    /// does when its queue closes: the others' senders keep the queue open.
    pub fn senders(&self) -> usize {
        self.lanes.len() - self.removed.count_ones() as usize
    }

    fn is_removed(&self, lane: usize) -> bool {
        self.removed & (1 << lane) != 0
    }

    /// The `ready` frame: the scopes carried, and those to resync.
    pub fn ready_frame(&self) -> Bytes {
        let carried: Vec<&str> = self.carried().map(|lane| lane.scope_key()).collect();
        let resync: Vec<&str> = self
            .carried()
            .filter(|lane| lane.resync)
            .map(|lane| lane.scope_key())
            .collect();
        Bytes::from(sse::ready_frame_for_scopes(&carried, &resync))
    }

    fn carried(&self) -> impl Iterator<Item = &ScopeLane> {
        (0..self.lanes.len())
            .filter(|lane| !self.is_removed(*lane))
            .map(|lane| &self.lanes[lane])
    }

    /// Whether `removed` (the stream's removed-scope bits) holds one not
    /// handled yet.
    pub fn removal_due(&self, removed: u64) -> bool {
        removed & !self.removed != 0
    }

    /// The next scope `removed` takes out that was not handled yet: marked
    /// removed, its events dropped from now on. Returns its key.
    pub fn take_removed(&mut self, removed: u64) -> Option<String> {
        let new = removed & !self.removed;
        if new == 0 {
            return None;
        }
        let index = new.trailing_zeros() as usize;
        let lane = self.lanes.get(index)?;
        self.removed |= 1 << index;
        Some(lane.scope_key().to_owned())
    }

    /// `event`'s frame on this stream: a durable frame with the stream's
    /// compound `id:` in place of its own, the scope's position moved to
    /// it; any other frame as it is. `None` for an event of a scope taken
    /// out of the stream.
    pub fn frame(&mut self, event: &EncodedEvent) -> Option<Bytes> {
        let index = self
            .lanes
            .iter()
            .position(|lane| lane.scope_key() == event.scope_key())?;
        if self.is_removed(index) {
            return None;
        }
        let Some((cursor, rest)) = event.frame_cursor() else {
            return Some(event.frame.clone());
        };
        self.lanes[index].position = Some(cursor);
        let positions = self
            .lanes
            .iter()
            .filter_map(|lane| Some((lane.tag, lane.position?)));
        CompoundCursor::write_positions(&mut self.id, positions);
        let mut frame = BytesMut::with_capacity(self.id.len() + rest.len() + 5);
        frame.extend_from_slice(b"id: ");
        frame.extend_from_slice(self.id.as_bytes());
        frame.extend_from_slice(b"\n");
        frame.extend_from_slice(rest);
        Some(frame.freeze())
    }
}

#[cfg(test)]
mod tests {
    use chrono::Utc;
    use eventrelay_wire::{LastEventId, NewEvent};
    use serde_json::json;

    use super::*;

    fn durable(scope: &str, seq: i64, horizon: u64) -> EncodedEvent {
        let mut envelope = NewEvent::durable("t", scope, json!({})).into_envelope(Utc::now());
        envelope.seq = Some(seq);
        EncodedEvent::written_by(envelope, horizon, ResumeCursor::at(seq, horizon))
    }

    fn id_of(frame: &Bytes) -> CompoundCursor {
        let text = std::str::from_utf8(frame).unwrap();
        let line = text.lines().next().unwrap();
        match line.strip_prefix("id: ").unwrap().parse().unwrap() {
            LastEventId::Scopes(cursor) => cursor,
            LastEventId::Scope(_) => panic!("a single-scope id: {line}"),
        }
    }

    fn ready_data(stream: &SeveralScopes) -> serde_json::Value {
        let frame = String::from_utf8(stream.ready_frame().to_vec()).unwrap();
        let data = frame.lines().find_map(|line| line.strip_prefix("data: "));
        serde_json::from_str(data.unwrap()).unwrap()
    }

    fn lanes(keys: &[&str]) -> SeveralScopes {
        SeveralScopes::new(
            keys.iter()
                .map(|key| ScopeLane::new(Subscriber::new(*key, "alice"), None, true))
                .collect(),
            Vec::new(),
        )
    }

    #[test]
    fn each_durable_frame_carries_every_scope_position() {
        let mut stream = lanes(&["a", "b", "c"]);
        let first = stream.frame(&durable("b", 10, 100)).unwrap();
        assert_eq!(
            id_of(&first).position(ScopeTag::of("b")),
            Some(ResumeCursor::at(10, 100))
        );
        assert_eq!(id_of(&first).position(ScopeTag::of("a")), None);
        let event = durable("a", 12, 101);
        let second = stream.frame(&event).unwrap();
        let id = id_of(&second);
        assert_eq!(
            id.position(ScopeTag::of("a")),
            Some(ResumeCursor::at(12, 101))
        );
        assert_eq!(
            id.position(ScopeTag::of("b")),
            Some(ResumeCursor::at(10, 100))
        );
        // The frame after the id is the hub's, byte for byte.
        let (_, rest) = event.frame_cursor().unwrap();
        assert!(second.ends_with(rest));
        assert!(stream.frame(&durable("elsewhere", 13, 1)).is_none());
    }

    #[test]
    fn a_removed_scope_sends_nothing_more_and_keeps_its_position() {
        let mut stream = lanes(&["a", "b"]);
        stream.pending.push_back((1, Replay::Nothing));
        stream.frame(&durable("a", 5, 50)).unwrap();
        assert!(!stream.removal_due(0));
        assert!(stream.removal_due(0b01));
        assert_eq!(stream.take_removed(0b01).as_deref(), Some("a"));
        assert_eq!(stream.take_removed(0b01), None, "once");
        assert!(stream.next_replay().is_some(), "b still replays");
        stream.pending.push_back((0, Replay::Nothing));
        assert!(stream.next_replay().is_none(), "a, taken out, does not");
        assert_eq!(stream.senders(), 1);
        assert!(stream.frame(&durable("a", 6, 50)).is_none());
        let frame = stream.frame(&durable("b", 7, 51)).unwrap();
        assert_eq!(
            id_of(&frame).position(ScopeTag::of("a")),
            Some(ResumeCursor::at(5, 50)),
            "its place in the id stays, for a later stream"
        );
        assert_eq!(ready_data(&stream)["scopes"], json!(["b"]));
    }

    #[test]
    fn ready_lists_the_scopes_that_must_resync() {
        let stream = SeveralScopes::new(
            vec![
                ScopeLane::new(Subscriber::new("a", "alice"), None, false),
                ScopeLane::new(Subscriber::new("b", "alice"), None, true),
            ],
            Vec::new(),
        );
        assert_eq!(
            ready_data(&stream),
            json!({"resync": true, "scopes": ["a", "b"], "resyncScopes": ["b"]})
        );
    }
}
