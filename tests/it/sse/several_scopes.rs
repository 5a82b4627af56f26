//! One stream, several scopes: `?scope=` repeated (or every scope the
//! credentials grant) carries each scope's events with its own audience
//! rule, under a compound `id:` from which each scope resumes exactly,
//! on the same relay (the tail) or another (the outbox); a scope too old
//! to resume resyncs alone; an operator can take one scope out; a stream
//! one scope's hub drops as too slow ends; and bad input is refused with
//! stable codes.

use std::collections::{BTreeMap, HashSet, VecDeque};

use eventrelay::store::WakeupMode;
use eventrelay::wire::{Audience, LastEventId, NewEvent};
use serde_json::{Value, json};

use crate::support::server::{
    ADMIN_TOKEN, Frame, SseStream, TestServer, read_until_closed, token, token_for_scopes,
};
use crate::support::{TestDb, test_in_both_wakeup_modes};

const SCOPES: [&str; 3] = ["doc-7", "org-1", "user-alice"];
const QUERY: &str = "?scope=org-1&scope=doc-7&scope=user-alice";
const TEN_MINUTES: std::time::Duration = std::time::Duration::from_secs(600);

fn alice() -> String {
    token_for_scopes(
        "alice",
        &["org-1", "doc-7", "user-alice", "org-2"],
        json!({"orders": ["read"]}),
        TEN_MINUTES,
    )
}

/// The events of `frames` by scope: (type, id) in the order received.
fn by_scope(frames: &[Frame]) -> BTreeMap<String, Vec<(String, String)>> {
    let mut scopes: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    for frame in frames {
        let envelope = frame.json();
        scopes
            .entry(envelope["scopeKey"].as_str().unwrap().to_owned())
            .or_default()
            .push((
                frame.event.clone().unwrap(),
                envelope["id"].as_str().unwrap().to_owned(),
            ));
    }
    scopes
}

/// Emits, in each scope, one event for everyone, one for alice only, one
/// needing `orders:read`, one for bob only; and one in a scope the stream
/// does not carry. Returns what alice's stream must receive, by scope.
async fn emit_round(db: &TestDb, round: &str) -> BTreeMap<String, Vec<(String, String)>> {
    let mut expected: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    for scope in SCOPES {
        let events = [
            (
                NewEvent::durable(format!("{round}.all"), scope, json!({})),
                true,
            ),
            (
                NewEvent::durable(format!("{round}.alice"), scope, json!({}))
                    .with_audience(Audience::users(["alice"])),
                true,
            ),
            (
                NewEvent::durable(format!("{round}.readers"), scope, json!({}))
                    .with_audience(Audience::permission(json!({"orders": ["read"]}))),
                true,
            ),
            (
                NewEvent::durable(format!("{round}.bob"), scope, json!({}))
                    .with_audience(Audience::users(["bob"])),
                false,
            ),
        ];
        for (event, for_alice) in events {
            let event_type = event.event_type.clone();
            let envelope = db.emit(event).await;
            if for_alice {
                expected
                    .entry(scope.to_owned())
                    .or_default()
                    .push((event_type, envelope.id.to_string()));
            }
        }
    }
    db.emit(NewEvent::durable(
        format!("{round}.other"),
        "org-2",
        json!({}),
    ))
    .await;
    expected
}

/// Reads `expected` events not in `seen` (the replay first), adding them
/// to it. A resume may send again what was sent just before the stream
/// went away (written at or above its cursor's horizon); clients drop
/// those by envelope id, and so does this. A new event twice fails.
async fn read_round(
    stream: &mut SseStream,
    seen: &mut HashSet<String>,
    expected: usize,
) -> Vec<Frame> {
    let mut pending: VecDeque<Frame> = std::mem::take(&mut stream.replayed).into();
    let mut frames = Vec::new();
    let mut new_ids = HashSet::new();
    while frames.len() < expected {
        let frame = match pending.pop_front() {
            Some(frame) => frame,
            None => stream.next_event().await,
        };
        let id = frame.json()["id"].as_str().unwrap().to_owned();
        if seen.contains(&id) {
            continue;
        }
        assert!(new_ids.insert(id), "sent twice: {frame:?}");
        frames.push(frame);
    }
    seen.extend(new_ids);
    frames
}

/// The seq of a durable event's frame, from its envelope.
fn seq_of(frame: &Frame) -> i64 {
    frame.json()["seq"].as_i64().unwrap()
}

fn count(expected: &BTreeMap<String, Vec<(String, String)>>) -> usize {
    expected.values().map(Vec::len).sum()
}

test_in_both_wakeup_modes!(three_scopes_with_audiences_resume_exactly_from_the_compound_id);

async fn three_scopes_with_audiences_resume_exactly_from_the_compound_id(mode: WakeupMode) {
    let (db, _cluster) = TestDb::for_mode(mode).await;
    let server = TestServer::start(&db, |_| {});
    server.ready().await;
    let (mut stream, resync) = server.subscribe(&alice(), None, QUERY).await;
    assert!(resync, "a first connection re-reads its state");
    assert_eq!(
        stream.ready_data,
        json!({"resync": true, "scopes": SCOPES, "resyncScopes": SCOPES})
    );

    let mut seen = HashSet::new();
    let first = emit_round(&db, "first").await;
    let frames = read_round(&mut stream, &mut seen, count(&first)).await;
    assert_eq!(by_scope(&frames), first, "each scope's events, in order");
    let last_id = frames.last().unwrap().id.clone().unwrap();
    let LastEventId::Scopes(compound) = last_id.parse().unwrap() else {
        panic!("a stream of several scopes has compound ids: {last_id}");
    };
    assert_eq!(compound.entries().len(), 3, "{last_id}");
    drop(stream);

    // Away: each scope moves on. Resumed on the same relay (the hubs are
    // gone with the stream, so from the outbox), then on a relay that
    // started meanwhile.
    let second = emit_round(&db, "second").await;
    let (mut resumed, resync) = server.subscribe(&alice(), Some(&last_id), QUERY).await;
    assert!(!resync, "{}", resumed.ready_data);
    assert_eq!(resumed.ready_data["resyncScopes"], json!([]));
    let frames = read_round(&mut resumed, &mut seen, count(&second)).await;
    assert_eq!(by_scope(&frames), second, "nothing lost, nothing twice");
    let after_second = frames.last().unwrap().id.clone().unwrap();
    drop(resumed);

    let third = emit_round(&db, "third").await;
    let other = TestServer::start(&db, |_| {});
    other.ready().await;
    let (mut elsewhere, resync) = other.subscribe(&alice(), Some(&after_second), QUERY).await;
    assert!(!resync, "{}", elsewhere.ready_data);
    let frames = read_round(&mut elsewhere, &mut seen, count(&third)).await;
    assert_eq!(by_scope(&frames), third);

    // Live on the same stream: a fourth round, interleaved by scope.
    let fourth = emit_round(&db, "fourth").await;
    let frames = read_round(&mut elsewhere, &mut seen, count(&fourth)).await;
    assert_eq!(by_scope(&frames), fourth);
}

test_in_both_wakeup_modes!(a_scope_too_old_to_resume_resyncs_alone);

async fn a_scope_too_old_to_resume_resyncs_alone(mode: WakeupMode) {
    let (db, _cluster) = TestDb::for_mode(mode).await;
    let server = TestServer::start(&db, |_| {});
    server.ready().await;
    let (mut stream, _) = server.subscribe(&alice(), None, QUERY).await;
    let mut seen = HashSet::new();
    // doc-7 hears once, early; the others keep going.
    db.emit(NewEvent::durable("early", "doc-7", json!({})))
        .await;
    let early = read_round(&mut stream, &mut seen, 1).await.remove(0);
    let mut last = None;
    for n in 0..10 {
        for scope in ["org-1", "user-alice"] {
            db.emit(NewEvent::durable("busy", scope, json!({ "n": n })))
                .await;
            last = read_round(&mut stream, &mut seen, 1).await.pop();
        }
    }
    let last = last.unwrap();
    let last_id = last.id.clone().unwrap();
    drop(stream);
    // doc-7 moved on while away, and the outbox lost everything up to just
    // below the newest events: what doc-7 was owed is gone.
    db.emit(NewEvent::durable("missed", "doc-7", json!({})))
        .await;
    let after = db
        .emit(NewEvent::durable("after", "org-1", json!({})))
        .await;
    let keep_from = seq_of(&last) - 1;
    assert!(seq_of(&early) < keep_from);
    db.connect()
        .await
        .execute(
            &format!(
                "DELETE FROM {}.outbox WHERE seq < $1 OR type = 'missed'",
                db.schema
            ),
            &[&keep_from],
        )
        .await
        .unwrap();

    let (resumed, resync) = server.subscribe(&alice(), Some(&last_id), QUERY).await;
    assert!(resync);
    assert_eq!(
        resumed.ready_data["resyncScopes"],
        json!(["doc-7"]),
        "only the scope whose events are gone: {}",
        resumed.ready_data
    );
    let new: Vec<Value> = resumed
        .replayed
        .iter()
        .map(|frame| frame.json()["id"].clone())
        .filter(|id| !seen.contains(id.as_str().unwrap()))
        .collect();
    assert_eq!(
        new,
        [json!(after.id.to_string())],
        "the others resume exactly: only what came since"
    );
}

#[tokio::test]
async fn every_granted_scope_without_a_parameter_and_one_scope_taken_out() {
    let db = TestDb::new().await;
    let server = TestServer::start(&db, |c| c.admin.token = Some(ADMIN_TOKEN.into()));
    server.ready().await;
    let two = token_for_scopes("alice", &["org-1", "doc-7"], json!({}), TEN_MINUTES);
    let (mut stream, _) = server.subscribe(&two, None, "").await;
    assert_eq!(stream.ready_data["scopes"], json!(["doc-7", "org-1"]));
    // One granted scope keeps a stream of one scope, with its plain ids.
    let (mut single, _) = server.subscribe(&two, None, "?scope=org-1").await;
    assert!(single.ready_data.get("scopes").is_none());
    let event = db.emit(NewEvent::durable("one", "org-1", json!({}))).await;
    let id = single.next_event().await.id.unwrap();
    assert!(matches!(id.parse(), Ok(LastEventId::Scope(_))), "{id}");
    assert_eq!(stream.next_event().await.json()["id"], event.id.to_string());

    let (status, answer) = server
        .admin(
            ADMIN_TOKEN,
            reqwest::Method::POST,
            "/v1/admin/subscribers/alice/disconnect?scope=doc-7",
            None,
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    let revoked = stream.next_event().await;
    assert_eq!(revoked.event.as_deref(), Some("revoked"));
    assert_eq!(
        revoked.json(),
        json!({"reason": "disconnected", "scope": "doc-7"})
    );
    // doc-7's events no longer come; org-1's still do, on the same stream.
    db.emit(NewEvent::durable("gone", "doc-7", json!({}))).await;
    let kept = db.emit(NewEvent::durable("kept", "org-1", json!({}))).await;
    let next = stream.next_event().await;
    assert_eq!(next.json()["id"], kept.id.to_string());
    assert_eq!(single.next_event().await.json()["id"], kept.id.to_string());
    // Its last scope taken out, the stream ends.
    server
        .admin(
            ADMIN_TOKEN,
            reqwest::Method::POST,
            "/v1/admin/subscribers/alice/disconnect?scope=org-1",
            None,
        )
        .await;
    assert_eq!(stream.last_event().await.as_deref(), Some("revoked"));
}

test_in_both_wakeup_modes!(bad_scopes_and_bad_compound_ids_are_refused_with_stable_codes);

async fn bad_scopes_and_bad_compound_ids_are_refused_with_stable_codes(mode: WakeupMode) {
    let (db, _cluster) = TestDb::for_mode(mode).await;
    let server = TestServer::start(&db, |c| {
        c.sse.max_scopes_per_stream = 3;
        c.sse.max_connections_per_subscriber = 1;
    });
    server.ready().await;
    let refusal = async |token: &str, id: Option<&str>, query: &str| -> (u16, Value) {
        let (status, body) = server
            .connect(Some(token), id, query)
            .await
            .err()
            .unwrap_or_else(|| panic!("{query} {id:?} is accepted"));
        (status, body["error"].clone())
    };
    let (status, error) = refusal(&alice(), None, "?scope=org-1&scope=org-9").await;
    assert_eq!(
        (status, error["code"].as_str()),
        (403, Some("scope_not_granted"))
    );
    assert!(
        error["message"].as_str().unwrap().contains("org-9"),
        "{error}"
    );
    let (status, error) = refusal(
        &alice(),
        None,
        "?scope=org-1&scope=doc-7&scope=user-alice&scope=org-2",
    )
    .await;
    assert_eq!(
        (status, error["code"].as_str()),
        (400, Some("too_many_scopes"))
    );
    let (status, error) = refusal(&alice(), None, "?scope=").await;
    assert_eq!(
        (status, error["code"].as_str()),
        (400, Some("invalid_query"))
    );
    for bad in [
        "1.2~",
        "1.2~0a1b~",
        "zz.1~0a1b!",
        "1.2.3~0a1b.",
        "-1.2~0a1b",
    ] {
        let (status, error) = refusal(&alice(), Some(bad), QUERY).await;
        assert_eq!(
            (status, error["code"].as_str()),
            (400, Some("invalid_last_event_id")),
            "{bad}"
        );
    }
    // A single scope's token: another scope is not granted either.
    let (status, _) = refusal(&token("bob", "org-1", json!({})), None, "?scope=doc-7").await;
    assert_eq!(status, 403);
    // An id naming none of the stream's scopes resumes nothing: each
    // scope resyncs, and the stream works.
    let (_stream, resync) = server.subscribe(&alice(), Some("5.9~0a1b"), QUERY).await;
    assert!(resync);
    // It counts once toward the subscriber's cap of one.
    let (status, error) = refusal(&alice(), None, "?scope=org-2").await;
    assert_eq!(
        (status, error["code"].as_str()),
        (429, Some("too_many_connections"))
    );
}

/// One scope's hub drops a stream of several that reads too slowly; the
/// others' hubs still hold the stream's queue open, so the stream must see
/// that one let go and end (the client then resumes from its id), rather
/// than go on without that scope's events.
#[tokio::test]
async fn a_stream_one_scope_drops_as_too_slow_ends() {
    let db = TestDb::new().await;
    let server = TestServer::start(&db, |c| c.sse.queue_capacity = 64);
    server.ready().await;
    // A small receive window, so the relay's writes back up quickly.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let address = server.base.trim_start_matches("http://").parse().unwrap();
    let connected = socket.connect(address).await.unwrap();
    let both = token_for_scopes("slow", &["org-1", "org-2"], json!({}), TEN_MINUTES);
    let (mut never_reads, status) = server.open_raw_stream_on(connected, &both).await;
    assert_eq!(status, "HTTP/1.1 200 OK");
    let (mut reader, _) = server
        .subscribe(&token("fast", "org-1", json!({})), None, "")
        .await;
    server
        .flood_until_a_slow_subscriber_is_dropped(&db, "org-1", Some(&mut reader))
        .await;
    // org-2's hub never dropped it; the stream ends all the same once it
    // has written what it had queued.
    read_until_closed(&mut never_reads).await;
    server
        .wait_for_metric("eventrelay_sse_connections", |open| open == 1.0)
        .await;
}
