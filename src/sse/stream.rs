//! `GET /v1/events`: the Server-Sent Events stream.
//!
//! Per connection: resolve the credentials (401 without valid ones), take a
//! connection permit (429 past the cap), parse `Last-Event-ID` (400 when
//! malformed), subscribe through the relay, and stream the session.

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
use super::session::{
    AfterCursor, LateCommits, OutboxReplay, Registration, Replay, Session, SessionParams,
    count_replay,
};
use crate::actors::relay::{JoinPoint, Subscribe, SubscribeError};
use crate::api_error::{ApiError, ErrorCode};
use crate::metrics::{Metrics, ReasonLabel};
use crate::state::AppState;
use crate::store::JoinView;
use eventrelay_wire::ResumeCursor;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StreamQuery {
    /// Replay start for a first connection, when no header can be set.
    last_event_id: Option<String>,
    /// End the stream right after delivering an event of this type.
    until: Option<String>,
}

/// Parses a `Last-Event-ID`: a [`ResumeCursor`], `<seq>.<horizon>` or a
/// plain `<seq>`.
pub fn parse_last_event_id(value: &str) -> Result<ResumeCursor, ApiError> {
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

    let resolved = resolve_subscriber(&state, &credentials).await?;
    // A token inside its verification leeway past `exp` is still accepted,
    // but a stream on it would end at once: refuse it as expired, so the
    // client fetches a new one instead of reconnecting in a loop.
    if resolved.expires_at.is_some_and(|at| at <= Utc::now()) {
        return Err(ApiError::unauthorized("the token has expired"));
    }
    let subscriber = resolved.subscriber;
    let presence_claims = resolved.presence;

    let sse = &config.sse;
    // Before anything is read or attached: a subscriber at its cap, or one
    // an operator disconnected, costs no query.
    let ticket = state
        .streams
        .open(
            &subscriber.subscriber_id,
            &subscriber.scope_key,
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
    // Where the tail or the outbox replays from. A cursor with a horizon is
    // exact: after its seq, with its late commits read apart. A plain seq
    // can only be trusted so far: the look-back below it is a guess.
    let replay_from = last_event_id.map(|cursor| match cursor.horizon {
        Some(_) => cursor.seq,
        None => (cursor.seq - sse.replay_lookback).max(0),
    });
    // Taken before the subscription exists, so whatever it saw committed
    // is history to this subscriber and everything after it is live. The
    // read is shared with the streams of the scope opening at the same
    // moment (see `shared_reads`).
    //
    // Each step that waits is boxed, so this handler's own state stays
    // small: inline, the read and the relay's answer made it kilobytes,
    // held by every request in flight. When thousands of clients connect
    // at once, that is what they hold while they wait, and what it leaves
    // behind between the streams' live blocks stays resident after them.
    let view = Box::pin(state.reads.join_view(&subscriber.scope_key))
        .await
        .map_err(|error| {
            ApiError::failed("the stream could not start (the database failed)", &*error)
        })?;
    // A cursor that names its event must find that event at its seq, or
    // one pruning could have deleted: else it comes from a history this
    // database no longer has.
    let rewritten = match last_event_id.and_then(|cursor| Some((cursor.seq, cursor.check?))) {
        Some((seq, check)) => match Box::pin(state.reads.event_at(seq)).await {
            Ok(Some(id)) => ResumeCursor::check_of(&id) != check,
            Ok(None) => seq > view.pruned_through,
            Err(error) => {
                return Err(ApiError::failed(
                    "the stream could not start (the database failed)",
                    &error,
                ));
            }
        },
        None => false,
    };
    let (queue, receiver) = mpsc::channel(sse.queue_capacity);
    let with_presence = state.presence.covers(&subscriber.scope_key);
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
    let mut registration = Registration::new(
        state.relay.clone(),
        subscriber.scope_key.clone(),
        attached.session,
        Arc::clone(&state.metrics),
        state.open_streams.hold(),
    );
    if with_presence && !presence_claims.hidden {
        registration.presence = Some(state.presence.join(
            &subscriber.scope_key,
            &subscriber.subscriber_id,
            presence_claims.info,
        ));
    }

    // Read after the subscription exists, so a late commit either is in
    // the read or reaches the stream live.
    let late = last_event_id
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
    let (replay, resync) = match (last_event_id, replay_from, attached.from_tail) {
        (Some(cursor), Some(_), Some(events)) => {
            count_replay(&state.metrics, "memory");
            // The tail holds every event after the cursor's seq: nothing
            // was pruned from under it, but the cursor may still be from
            // the future.
            let replay = match late {
                Some(late) => outbox_replay(Some(late), AfterCursor::Tail(events)),
                None => Replay::FromTail(events),
            };
            let gap = if rewritten || from_elsewhere(&view, cursor) {
                Some("unknown_cursor")
            } else {
                late_commits_pruned(&view, cursor).then_some("pruned")
            };
            (replay, counted_resync(&state.metrics, gap))
        }
        (Some(cursor), Some(from), None) => {
            count_replay(&state.metrics, "outbox");
            let gap = match rewritten {
                true => Some("unknown_cursor"),
                false => gap_before(&view, cursor),
            };
            (
                outbox_replay(late, AfterCursor::Outbox(from)),
                counted_resync(&state.metrics, gap),
            )
        }
        _ => (Replay::Nothing, true),
    };

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
    let params = SessionParams {
        retry_ms: sse.retry_ms,
        heartbeat: sse.heartbeat(),
        ends_at,
        reauth,
        ticket,
        until: query.until.clone(),
        resync,
        replay,
        peer: request.conn_data::<PeerSocket>().copied(),
        own_connection: request.version() < actix_web::http::Version::HTTP_2,
        write_timeout: Duration::from_secs(config.http.write_timeout_secs),
    };
    let body = Session::new(params, subscriber, receiver, registration).into_stream();
    Ok(HttpResponse::Ok()
        .insert_header((header::CONTENT_TYPE, "text/event-stream"))
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .insert_header(("x-accel-buffering", "no"))
        .insert_header((header::CONTENT_ENCODING, "identity"))
        .streaming(body))
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
        let plain = ResumeCursor::plain;
        assert_eq!(parse_last_event_id("42").unwrap(), plain(42));
        assert_eq!(parse_last_event_id(" 7 ").unwrap(), plain(7));
        assert_eq!(parse_last_event_id("0").unwrap(), plain(0));
        assert_eq!(
            parse_last_event_id("152.8841").unwrap(),
            ResumeCursor::at(152, 8841)
        );
        for bad in [
            "",
            "-1",
            "abc",
            "1.-5",
            "+3",
            "99999999999999999999",
            "1.2.3",
        ] {
            let error = parse_last_event_id(bad).unwrap_err();
            assert_eq!(error.code, "invalid_last_event_id", "{bad}");
        }
    }
}
