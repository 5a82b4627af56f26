//! `GET /v1/events`: the Server-Sent Events stream.
//!
//! Per connection: resolve the credentials (401 without valid ones), choose
//! the scopes the stream carries (403 for one not granted, 400 past the
//! maximum), take a connection permit (429 past the cap), parse
//! `Last-Event-ID` (400 when malformed), subscribe to each scope through
//! the relay, and stream the session.

use std::sync::Arc;
use std::time::Duration;

use actix_web::http::{StatusCode, header};
use actix_web::{HttpRequest, HttpResponse, web};
use chrono::Utc;
use serde::Deserialize;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::credentials::{resolve_subscriber, subscriber_credentials};
use super::peer::PeerSocket;
use super::registry::Refusal;
use super::scopes::{ScopeLane, SeveralScopes, choose_scopes, requested_scopes};
use super::session::{
    AfterCursor, LateCommits, OutboxReplay, Registration, Replay, Session, SessionParams,
    count_replay,
};
use crate::actors::hub::FrameSender;
use crate::actors::relay::{JoinPoint, Subscribe, SubscribeError};
use crate::api_error::{ApiError, ErrorCode};
use crate::metrics::{Metrics, ReasonLabel};
use crate::presence::PresenceClaims;
use crate::state::AppState;
use crate::store::JoinView;
use eventrelay_wire::{LastEventId, ResumeCursor, ScopeTag, Subscriber};

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StreamQuery {
    /// Replay start for a first connection, when no header can be set.
    last_event_id: Option<String>,
    /// End the stream right after delivering an event of this type.
    until: Option<String>,
}

/// Parses a `Last-Event-ID`: a [`ResumeCursor`] (`<seq>.<horizon>.<check>`,
/// `<seq>.<horizon>` or a plain `<seq>`), or a stream's compound cursor.
pub fn parse_last_event_id(value: &str) -> Result<LastEventId, ApiError> {
    value
        .parse()
        .map_err(|error: eventrelay_wire::CursorParseError| {
            ApiError::bad_request(ErrorCode::InvalidLastEventId, error.to_string())
        })
}

fn header_text(
    request: &HttpRequest,
    name: header::HeaderName,
) -> Result<Option<String>, ApiError> {
    match request.headers().get(&name) {
        None => Ok(None),
        Some(value) => value.to_str().map(|s| Some(s.to_owned())).map_err(|_| {
            ApiError::bad_request(
                ErrorCode::InvalidHeader,
                format!("{name} is not visible ASCII"),
            )
        }),
    }
}

pub async fn stream_events(
    request: HttpRequest,
    query: web::Query<StreamQuery>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    // Read once: a reload meanwhile applies to the next connection.
    let config = state.config();
    let credentials = subscriber_credentials(&request, &config)?;
    let last_event_id =
        match header_text(&request, header::HeaderName::from_static("last-event-id"))? {
            Some(value) => Some(parse_last_event_id(&value)?),
            None => query
                .last_event_id
                .as_deref()
                .map(parse_last_event_id)
                .transpose()?,
        };
    if let Some(until) = &query.until {
        eventrelay_wire::validate_event_type(until)
            .map_err(|e| ApiError::bad_request(ErrorCode::InvalidQuery, format!("until: {e}")))?;
    }
    let requested = requested_scopes(request.query_string())?;

    let resolved = resolve_subscriber(&state, &credentials).await?;
    // A token inside its verification leeway past `exp` is still accepted,
    // but a stream on it would end at once: refuse it as expired, so the
    // client fetches a new one instead of reconnecting in a loop.
    if resolved.expires_at.is_some_and(|at| at <= Utc::now()) {
        return Err(ApiError::unauthorized("the token has expired"));
    }
    let sse = &config.sse;
    let scopes = choose_scopes(&resolved, requested, sse.max_scopes_per_stream)?;
    let Some((first_scope, more_scopes)) = scopes.split_first() else {
        return Err(ApiError::bad_request(
            ErrorCode::InvalidQuery,
            "the stream would carry no scope",
        ));
    };

    // Before anything is read or attached: a subscriber at its cap, or one
    // an operator disconnected, costs no query.
    let ticket = state
        .streams
        .open_scopes(
            &resolved.subscriber.subscriber_id,
            first_scope,
            more_scopes,
            sse.max_connections_per_subscriber,
        )
        .map_err(|refusal| match refusal {
            Refusal::TooManyStreams(_) => ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                ErrorCode::TooManyConnections,
                refusal.to_string(),
            ),
            Refusal::Denied(_) => ApiError::new(
                StatusCode::FORBIDDEN,
                ErrorCode::SubscriberDisconnected,
                refusal.to_string(),
            ),
        })?;
    let positions = scope_positions(last_event_id.as_ref(), &scopes);
    // Taken before the subscriptions exist, so whatever each saw committed
    // is history to this subscriber and everything after it is live. The
    // read is shared with the streams of the scope opening at the same
    // moment (see `shared_reads`).
    //
    // Each step that waits is boxed, so this handler's own state stays
    // small: inline, the read and the relay's answer made it kilobytes,
    // held by every request in flight. When thousands of clients connect
    // at once, that is what they hold while they wait, and what it leaves
    // behind between the streams' live blocks stays resident after them.
    let mut views = Vec::with_capacity(scopes.len());
    for scope in &scopes {
        let view = Box::pin(state.reads.join_view(scope))
            .await
            .map_err(|error| {
                ApiError::failed("the stream could not start (the database failed)", &*error)
            })?;
        views.push(view);
    }
    // Whether the id comes from a history this database does not have: its
    // newest position names another event (or one pruning could not have
    // deleted), or a position lies beyond what this database assigned.
    // Then no position of it holds, and every scope resyncs.
    let rewritten = names_another_event(&state, last_event_id.as_ref(), &views[0]).await?
        || positions
            .iter()
            .zip(&views)
            .any(|(position, view)| position.is_some_and(|cursor| from_elsewhere(view, cursor)));

    let (queue, receiver) = mpsc::channel(sse.queue_capacity);
    let mut registration = Registration::new(
        state.relay.clone(),
        Arc::clone(&state.metrics),
        state.open_streams.hold(),
        scopes.len(),
    );
    let mut opened = Vec::with_capacity(scopes.len());
    for ((scope, view), position) in scopes.iter().zip(&views).zip(positions) {
        let subscriber = Subscriber {
            scope_key: scope.clone(),
            ..resolved.subscriber.clone()
        };
        let joining = Joining {
            subscriber,
            view,
            position,
            rewritten,
            queue: queue.clone(),
        };
        opened.push(open_scope(&state, joining, &resolved.presence, &mut registration).await?);
    }
    // The hubs hold the queue's senders now: when the last lets go, the
    // stream ends.
    drop(queue);

    let jitter = sse.max_age().mul_f64(fastrand::f64() * 0.1);
    let now = Instant::now();
    let aged_at = now + sse.max_age() - jitter;
    let mut ends_at = aged_at;
    let mut reauth = None;
    if let Some(expires_at) = resolved.expires_at {
        let left = (expires_at - Utc::now()).to_std().unwrap_or(Duration::ZERO);
        if now + left < aged_at {
            ends_at = now + left;
            reauth = reauth_warning(now, left, Duration::from_secs(sse.reauth_lead_secs));
        }
    }
    let several = (opened.len() > 1).then(|| {
        let lanes = opened
            .iter()
            .map(|scope| ScopeLane::new(scope.subscriber.clone(), scope.position, scope.resync))
            .collect();
        let pending = opened
            .iter_mut()
            .enumerate()
            .skip(1)
            .map(|(lane, scope)| (lane, std::mem::replace(&mut scope.replay, Replay::Nothing)))
            .collect();
        Box::new(SeveralScopes::new(lanes, pending))
    });
    let first = opened.swap_remove(0);
    let params = SessionParams {
        retry_ms: sse.retry_ms,
        heartbeat: sse.heartbeat(),
        ends_at,
        reauth,
        ticket,
        until: query.until.clone(),
        resync: first.resync,
        replay: first.replay,
        several,
        peer: request.conn_data::<PeerSocket>().copied(),
        own_connection: request.version() < actix_web::http::Version::HTTP_2,
        write_timeout: Duration::from_secs(config.http.write_timeout_secs),
    };
    let body = Session::new(params, first.subscriber, receiver, registration).into_stream();
    Ok(HttpResponse::Ok()
        .insert_header((header::CONTENT_TYPE, "text/event-stream"))
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .insert_header(("x-accel-buffering", "no"))
        .insert_header((header::CONTENT_ENCODING, "identity"))
        .streaming(body))
}

/// Where each of `scopes` resumes from, by the client's `Last-Event-ID`: a
/// single scope's cursor for a stream of that one scope; a compound
/// cursor's entry for each scope it has one for. A single scope's cursor
/// names no scope among several, so each of them then starts afresh (and
/// resyncs).
fn scope_positions(
    last_event_id: Option<&LastEventId>,
    scopes: &[String],
) -> Vec<Option<ResumeCursor>> {
    match last_event_id {
        Some(LastEventId::Scope(cursor)) if scopes.len() == 1 => vec![Some(*cursor)],
        Some(LastEventId::Scopes(compound)) => scopes
            .iter()
            .map(|scope| compound.position(ScopeTag::of(scope)))
            .collect(),
        Some(LastEventId::Scope(_)) | None => vec![None; scopes.len()],
    }
}

/// Whether the newest position of `last_event_id` names an event this
/// database does not hold at its seq: another one, or none when pruning
/// could not have deleted it. Then the id comes from a history this
/// database no longer has.
async fn names_another_event(
    state: &AppState,
    last_event_id: Option<&LastEventId>,
    view: &JoinView,
) -> Result<bool, ApiError> {
    let newest = match last_event_id {
        Some(LastEventId::Scope(cursor)) => Some(*cursor),
        Some(LastEventId::Scopes(compound)) => compound.newest(),
        None => None,
    };
    let Some((seq, check)) = newest.and_then(|cursor| Some((cursor.seq, cursor.check?))) else {
        return Ok(false);
    };
    match Box::pin(state.reads.event_at(seq)).await {
        Ok(Some(id)) => Ok(ResumeCursor::check_of(&id) != check),
        Ok(None) => Ok(seq > view.pruned_through),
        Err(error) => Err(ApiError::failed(
            "the stream could not start (the database failed)",
            &error,
        )),
    }
}

/// One scope of a stream being opened.
struct Joining<'a> {
    /// The stream's subscriber in this scope.
    subscriber: Subscriber,
    view: &'a JoinView,
    /// Where the client stands in this scope, if it said.
    position: Option<ResumeCursor>,
    /// Whether the client's id comes from another history.
    rewritten: bool,
    queue: FrameSender,
}

/// One scope of a stream, subscribed: what its session sends first.
struct OpenedScope {
    subscriber: Subscriber,
    position: Option<ResumeCursor>,
    replay: Replay,
    resync: bool,
}

/// Subscribes the stream to one scope through the relay, joins its
/// presence, and works out its replay and whether it must resync.
async fn open_scope(
    state: &AppState,
    joining: Joining<'_>,
    presence: &PresenceClaims,
    registration: &mut Registration,
) -> Result<OpenedScope, ApiError> {
    let Joining {
        subscriber,
        view,
        position,
        rewritten,
        queue,
    } = joining;
    let lookback = state.config().sse.replay_lookback;
    // Where the tail or the outbox replays from. A cursor with a horizon is
    // exact: after its seq, with its late commits read apart. A plain seq
    // can only be trusted so far: the look-back below it is a guess.
    let replay_from = position.map(|cursor| match cursor.horizon {
        Some(_) => cursor.seq,
        None => (cursor.seq - lookback).max(0),
    });
    let scope_key = subscriber.scope_key.clone();
    let with_presence = state.presence.covers(&scope_key);
    let attached = Box::pin(state.relay.send(Subscribe {
        subscriber: subscriber.clone(),
        queue,
        replay_after: replay_from,
        joined: JoinPoint {
            snapshot: Arc::clone(&view.snapshot),
            scope_newest: view.scope_newest,
        },
        presence: with_presence.then(|| Arc::clone(state.presence.view())),
    }))
    .await
    .map_err(|_| ApiError::unavailable("the relay is shutting down"))?
    .map_err(|refused| match refused {
        SubscribeError::Stopping => ApiError::unavailable("the relay is shutting down"),
    })?;
    registration.subscribed(&scope_key, attached.session);
    if with_presence && !presence.hidden {
        registration.presence.push(state.presence.join(
            &scope_key,
            &subscriber.subscriber_id,
            presence.info.clone(),
        ));
    }

    // Read after the subscription exists, so a late commit either is in
    // the read or reaches the stream live.
    let late = position
        .filter(|cursor| cursor.horizon.is_some())
        .map(|cursor| LateCommits { cursor, after: 0 });
    let outbox_replay = |late, then| {
        Replay::FromOutbox(Box::new(OutboxReplay {
            reads: state.reads.clone(),
            late,
            then,
            stamp: None,
        }))
    };
    let metrics = &state.metrics;
    let (replay, resync) = match (position, replay_from, attached.from_tail) {
        (Some(cursor), Some(_), Some(events)) => {
            count_replay(metrics, "memory");
            // The tail holds every event after the cursor's seq: nothing
            // was pruned from under it, but the cursor may still be from
            // the future.
            let replay = match late {
                Some(late) => outbox_replay(Some(late), AfterCursor::Tail(events)),
                None => Replay::FromTail(events),
            };
            let gap = if rewritten {
                Some("unknown_cursor")
            } else {
                late_commits_pruned(view, cursor).then_some("pruned")
            };
            (replay, counted_resync(metrics, gap))
        }
        (Some(cursor), Some(from), None) => {
            count_replay(metrics, "outbox");
            let gap = match rewritten {
                true => Some("unknown_cursor"),
                false => gap_before(view, cursor),
            };
            (
                outbox_replay(late, AfterCursor::Outbox(from)),
                counted_resync(metrics, gap),
            )
        }
        _ => (Replay::Nothing, true),
    };
    Ok(OpenedScope {
        subscriber,
        position,
        replay,
        resync,
    })
}

/// When a stream its credentials end, `left` from `now`, warns its client:
/// `lead` before the end, or halfway when the credentials have less than
/// twice that left; with the whole seconds left then (at least 1).
fn reauth_warning(now: Instant, left: Duration, lead: Duration) -> Option<(Instant, u64)> {
    if lead.is_zero() || left.is_zero() {
        return None;
    }
    let lead = lead.min(left / 2);
    Some((now + left - lead, lead.as_secs().max(1)))
}

/// Why a client replaying after `after` may have missed events and must
/// re-read its state, if it may: some were pruned (`pruned`), or its
/// cursor is above every seq this outbox ever assigned, so it comes from
/// another database (a restore, a reset sequence) and replaying "after" it
/// finds nothing (`unknown_cursor`).
fn gap_before(view: &JoinView, cursor: ResumeCursor) -> Option<&'static str> {
    if from_elsewhere(view, cursor) {
        return Some("unknown_cursor");
    }
    let after = cursor.seq;
    let pruned = after < view.pruned_through || late_commits_pruned(view, cursor);
    // Rows pruned before the highest pruned seq was recorded leave only the
    // oldest seq held to go by.
    let below_oldest = view.horizon.is_none_or(|oldest| oldest > after + 1);
    (pruned || (below_oldest && after < view.outbox_newest)).then_some("pruned")
}

/// Whether a late commit `cursor` is owed may have been pruned: its late
/// commits are the rows written at or above its horizon, and pruning
/// deleted such a row.
fn late_commits_pruned(view: &JoinView, cursor: ResumeCursor) -> bool {
    cursor
        .horizon
        .is_some_and(|horizon| horizon <= view.pruned_txid)
}

/// Whether `cursor` cannot come from this database as it is: its seq is
/// above every seq the outbox assigned, or its horizon above every
/// transaction id the server assigned (a restore, or a failover to a
/// standby that had not received everything the old primary committed).
fn from_elsewhere(view: &JoinView, cursor: ResumeCursor) -> bool {
    cursor.seq > view.outbox_newest
        || cursor
            .horizon
            .is_some_and(|horizon| horizon > view.snapshot.xmax())
}

/// Whether to tell the stream to resync: when there is a gap, counted by
/// its reason.
fn counted_resync(metrics: &Metrics, gap: Option<&'static str>) -> bool {
    if let Some(reason) = gap {
        metrics.resyncs.get_or_create(&ReasonLabel { reason }).inc();
    }
    gap.is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reauth_comes_its_lead_before_the_end_or_halfway_through_a_short_token() {
        let now = Instant::now();
        let secs = Duration::from_secs;
        // A long token: the lead before its end, with the lead's seconds.
        assert_eq!(
            reauth_warning(now, secs(600), secs(30)),
            Some((now + secs(570), 30))
        );
        // Less than twice the lead left: halfway.
        assert_eq!(
            reauth_warning(now, secs(40), secs(30)),
            Some((now + secs(20), 20))
        );
        // Under two seconds left: halfway, and at least one second said.
        assert_eq!(
            reauth_warning(now, Duration::from_millis(1_200), secs(30)),
            Some((now + Duration::from_millis(600), 1))
        );
        // No lead, or nothing left: no warning.
        assert_eq!(reauth_warning(now, secs(600), Duration::ZERO), None);
        assert_eq!(reauth_warning(now, Duration::ZERO, secs(30)), None);
    }

    #[test]
    fn last_event_id_must_be_a_cursor() {
        let plain = |seq| LastEventId::Scope(ResumeCursor::plain(seq));
        assert_eq!(parse_last_event_id("42").unwrap(), plain(42));
        assert_eq!(parse_last_event_id(" 7 ").unwrap(), plain(7));
        assert_eq!(parse_last_event_id("0").unwrap(), plain(0));
        assert_eq!(
            parse_last_event_id("152.8841").unwrap(),
            LastEventId::Scope(ResumeCursor::at(152, 8841))
        );
        assert!(matches!(
            parse_last_event_id("4c.7~0a1b~0c2d3.1").unwrap(),
            LastEventId::Scopes(_)
        ));
        for bad in [
            "",
            "-1",
            "abc",
            "1.-5",
            "+3",
            "99999999999999999999",
            "1.2.3",
            "1.2~",
            "1.2~ab",
            "1.2~0a1b~",
        ] {
            let error = parse_last_event_id(bad).unwrap_err();
            assert_eq!(error.code, "invalid_last_event_id", "{bad}");
        }
    }
}
