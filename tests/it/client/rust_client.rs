//! The Rust client (`eventrelay-client`) against the real relay on a real
//! Postgres: delivery, replay across a relay restart, resync, refused
//! credentials, the degraded state and a clean stop.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::server::{TestServer, token};
use crate::support::{DEADLINE, TestDb, eventually};
use eventrelay::publisher::NewEvent;
use eventrelay_client::{ClientBuilder, ClientError, ClientHandle, Event, State, Status};
use serde_json::json;
use tokio::sync::mpsc;

fn durable(n: u32) -> NewEvent {
    NewEvent::durable("order.created", "org-1", json!({"n": n}))
}

/// Where the relay currently listens: a restarted relay gets a new port, and
/// the request builder reads this on every connect.
#[derive(Clone)]
struct Target {
    base: Arc<Mutex<String>>,
    token: Arc<Mutex<String>>,
}

impl Target {
    fn new(server: &TestServer, token: String) -> Target {
        Target {
            base: Arc::new(Mutex::new(server.base.clone())),
            token: Arc::new(Mutex::new(token)),
        }
    }

    fn point_at(&self, server: &TestServer) {
        *self.base.lock().unwrap() = server.base.clone();
    }

    fn client(&self) -> ClientBuilder {
        let target = self.clone();
        ClientBuilder::new(move |http| {
            let base = target.base.lock().unwrap().clone();
            let token = target.token.lock().unwrap().clone();
            http.get(format!("{base}/v1/events")).bearer_auth(token)
        })
        // Short delays: the tests wait for reconnects.
        .backoff(Duration::from_millis(20), Duration::from_millis(200))
    }
}

async fn next(events: &mut mpsc::Receiver<Event>) -> Event {
    tokio::time::timeout(DEADLINE, events.recv())
        .await
        .expect("an event before the deadline")
        .expect("client still running")
}

async fn wait_for_state(handle: &ClientHandle, state: State) -> Status {
    let mut status = handle.subscribe();
    tokio::time::timeout(DEADLINE, status.wait_for(|s| s.state == state))
        .await
        .unwrap_or_else(|_| panic!("state {state:?} before the deadline"))
        .expect("status channel open")
        .clone()
}

/// Polls the relay's open-connection gauge until it equals `expected`.
async fn wait_for_connections(server: &TestServer, expected: f64) {
    eventually("the relay has the expected connections", async || {
        (server.metric("eventrelay_sse_connections").await == expected).then_some(())
    })
    .await;
}

#[tokio::test]
async fn events_arrive_and_a_relay_restart_loses_no_durable_event() {
    let db = TestDb::new().await;
    let server = TestServer::start(&db, |_| {});
    server.ready().await;
    let target = Target::new(&server, token("alice", "org-1", json!({})));
    let resyncs = Arc::new(AtomicUsize::new(0));
    let counted = resyncs.clone();
    let (handle, mut events) = target
        .client()
        .on_resync(move || {
            counted.fetch_add(1, Ordering::SeqCst);
        })
        .start();
    wait_for_state(&handle, State::Connected).await;
    assert_eq!(
        resyncs.load(Ordering::SeqCst),
        1,
        "a first connection resyncs"
    );

    let first = db.emit(durable(1)).await;
    let tick = db
        .emit(NewEvent::ephemeral(
            "sync.progress",
            "org-1",
            json!({"done": 1}),
        ))
        .await;
    let received = next(&mut events).await;
    assert_eq!(received.envelope.id, first.id);
    assert_eq!(received.envelope.seq, first.seq);
    assert_eq!(received.event_type, "order.created");
    let cursor: eventrelay::wire::ResumeCursor =
        received.sse_id.as_deref().unwrap().parse().unwrap();
    assert_eq!(Some(cursor.seq), first.seq);
    assert!(
        cursor.horizon.is_some(),
        "a live frame's id carries its horizon"
    );
    let received = next(&mut events).await;
    assert_eq!(received.envelope.id, tick.id);
    assert_eq!(received.sse_id, None, "ephemeral frames carry no id");

    // The relay goes away; events committed meanwhile wait in the outbox.
    drop(server);
    let reconnecting = handle.subscribe();
    let missed = [db.emit(durable(2)).await, db.emit(durable(3)).await];
    let server = TestServer::start(&db, |_| {});
    target.point_at(&server);
    server.ready().await;
    assert_ne!(
        reconnecting.borrow().state,
        State::Stopped,
        "a lost relay is not terminal"
    );

    for expected in &missed {
        assert_eq!(next(&mut events).await.envelope.id, expected.id);
    }
    wait_for_state(&handle, State::Connected).await;
    let live = db.emit(durable(4)).await;
    // Exactly the live event next: nothing missed, nothing delivered twice.
    assert_eq!(next(&mut events).await.envelope.id, live.id);
    // The reconnect sent `Last-Event-ID`, so the relay did not ask for a
    // resync: the replay covered the gap.
    assert_eq!(resyncs.load(Ordering::SeqCst), 1);
    handle.stop().await.unwrap();
}

#[tokio::test]
async fn resync_fires_on_a_first_connection_but_not_when_resuming() {
    let db = TestDb::new().await;
    let server = TestServer::start(&db, |_| {});
    server.ready().await;
    let target = Target::new(&server, token("alice", "org-1", json!({})));
    let saved = db.emit(durable(1)).await;

    for (resume, expected) in [(None, 1), (Some(saved.seq.unwrap()), 0)] {
        let resyncs = Arc::new(AtomicUsize::new(0));
        let counted = resyncs.clone();
        let mut builder = target.client().on_resync(move || {
            counted.fetch_add(1, Ordering::SeqCst);
        });
        if let Some(seq) = resume {
            builder = builder.last_event_id(seq.to_string());
        }
        let (handle, _events) = builder.start();
        wait_for_state(&handle, State::Connected).await;
        assert_eq!(
            resyncs.load(Ordering::SeqCst),
            expected,
            "resume {resume:?}"
        );
        handle.stop().await.unwrap();
    }
}

#[tokio::test]
async fn a_refused_token_stops_the_client() {
    let db = TestDb::new().await;
    let server = TestServer::start(&db, |_| {});
    server.ready().await;
    let target = Target::new(&server, "not-a-token".into());
    let (handle, mut events) = target.client().start();
    let stopped = wait_for_state(&handle, State::Stopped).await;
    let error = stopped.last_error.expect("stopped with an error");
    assert!(
        matches!(&*error, ClientError::Unauthorized { status: 401, code: Some(code) } if code == "unauthorized"),
        "{error:?}"
    );
    assert!(events.recv().await.is_none());
    let result = handle.join().await;
    assert!(result.is_err_and(|e| e.status() == Some(401)));
}

#[tokio::test]
async fn a_refresh_hook_recovers_from_a_refused_token() {
    let db = TestDb::new().await;
    let server = TestServer::start(&db, |_| {});
    server.ready().await;
    let target = Target::new(&server, "expired".into());
    let refreshes = Arc::new(AtomicUsize::new(0));
    let (counted, token_slot) = (refreshes.clone(), target.token.clone());
    let (handle, mut events) = target
        .client()
        .on_unauthorized(move || {
            counted.fetch_add(1, Ordering::SeqCst);
            *token_slot.lock().unwrap() = token("alice", "org-1", json!({}));
            async { Ok::<(), ClientError>(()) }
        })
        .start();
    wait_for_state(&handle, State::Connected).await;
    assert_eq!(refreshes.load(Ordering::SeqCst), 1);
    let event = db.emit(durable(1)).await;
    assert_eq!(next(&mut events).await.envelope.id, event.id);
    handle.stop().await.unwrap();
}

#[tokio::test]
async fn degraded_when_the_relay_is_gone_and_connected_when_it_returns() {
    let db = TestDb::new().await;
    let server = TestServer::start(&db, |_| {});
    server.ready().await;
    let target = Target::new(&server, token("alice", "org-1", json!({})));
    let (handle, _events) = target.client().degraded_after(3).start();
    wait_for_state(&handle, State::Connected).await;

    drop(server);
    let degraded = wait_for_state(&handle, State::Degraded).await;
    assert!(degraded.consecutive_failures >= 3, "{degraded:?}");
    assert!(
        matches!(degraded.last_error.as_deref(), Some(ClientError::Http(_))),
        "{degraded:?}"
    );

    let server = TestServer::start(&db, |_| {});
    target.point_at(&server);
    let connected = wait_for_state(&handle, State::Connected).await;
    assert_eq!(connected.consecutive_failures, 0);
    handle.stop().await.unwrap();
    drop(server);
}

#[tokio::test]
async fn stop_ends_the_client_and_its_connection() {
    let db = TestDb::new().await;
    // The relay notices a closed connection when it next writes to it.
    let server = TestServer::start(&db, |c| c.sse.heartbeat_secs = 1);
    server.ready().await;
    let target = Target::new(&server, token("alice", "org-1", json!({})));
    let (handle, mut events) = target.client().start();
    let status = handle.subscribe();
    wait_for_state(&handle, State::Connected).await;
    wait_for_connections(&server, 1.0).await;

    handle.stop().await.unwrap();
    assert_eq!(status.borrow().state, State::Stopped);
    assert!(status.borrow().last_error.is_none());
    assert!(events.recv().await.is_none(), "the event channel is closed");
    wait_for_connections(&server, 0.0).await;
}

#[tokio::test]
async fn the_client_keeps_the_scopes_members_from_its_presence_frames() {
    let db = TestDb::new().await;
    let server = TestServer::start(&db, |config| {
        config.presence.scopes = vec!["org-*".into()];
        config.presence.batch_ms = 50;
    });
    server.ready().await;
    let changes = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&changes);
    let (handle, mut events) = Target::new(&server, token("ada", "org-1", json!({})))
        .client()
        .on_presence(move |_, _| {
            counted.fetch_add(1, Ordering::SeqCst);
        })
        .start();
    eventually("ada sees herself", async || {
        handle.presence().members.contains_key("ada").then_some(())
    })
    .await;
    let (bob, mut bob_events) = Target::new(&server, token("bob", "org-1", json!({})))
        .client()
        .start();
    eventually("ada sees bob join", async || {
        (handle.presence().count == 2).then_some(())
    })
    .await;
    bob.stop().await.unwrap();
    while bob_events.recv().await.is_some() {}
    eventually("ada sees bob leave", async || {
        let presence = handle.presence();
        (presence.count == 1 && !presence.members.contains_key("bob")).then_some(())
    })
    .await;
    assert!(
        changes.load(Ordering::SeqCst) >= 3,
        "a snapshot and two changes at least"
    );
    db.emit(durable(1)).await;
    assert_eq!(
        next(&mut events).await.envelope.event_type,
        "order.created",
        "presence never reaches the events"
    );
    handle.stop().await.unwrap();
}

#[tokio::test]
async fn several_scopes_share_one_stream_and_resync_one_by_one() {
    let db = TestDb::new().await;
    let server = TestServer::start(&db, |_| {});
    server.ready().await;
    let scopes = ["org-1", "doc-7", "user-alice"];
    let target = Target::new(
        &server,
        crate::support::server::token_for_scopes(
            "alice",
            &scopes,
            json!({}),
            Duration::from_secs(600),
        ),
    );
    let resynced = Arc::new(Mutex::new(Vec::new()));
    let noted = resynced.clone();
    let (handle, mut events) = target
        .client()
        .scopes(["user-alice", "org-1", "doc-7", "org-1"])
        .on_scope_resync(move |scope| noted.lock().unwrap().push(scope.to_owned()))
        .start();
    wait_for_state(&handle, State::Connected).await;
    assert_eq!(
        *resynced.lock().unwrap(),
        ["doc-7", "org-1", "user-alice"],
        "a first connection resyncs each scope once"
    );
    assert_eq!(server.metric("eventrelay_sse_connections").await, 1.0);
    let mut sent = Vec::new();
    for scope in scopes {
        sent.push(db.emit(NewEvent::durable("t", scope, json!({}))).await);
    }
    for expected in &sent {
        let event = next(&mut events).await;
        assert_eq!(event.envelope.id, expected.id);
    }

    // Across a relay restart, every scope resumes from the compound id:
    // nothing is missed and no scope resyncs.
    drop(server);
    let mut missed = Vec::new();
    for scope in scopes.iter().rev() {
        missed.push(db.emit(NewEvent::durable("t", *scope, json!({}))).await);
    }
    let server = TestServer::start(&db, |_| {});
    target.point_at(&server);
    server.ready().await;
    // Each scope replays in turn, so the order across scopes is the
    // relay's; the client hands each event on once.
    let mut received = std::collections::HashSet::new();
    while received.len() < missed.len() {
        let id = next(&mut events).await.envelope.id;
        assert!(received.insert(id), "{id} twice");
    }
    assert_eq!(
        received,
        missed
            .iter()
            .map(|event| event.id)
            .collect::<std::collections::HashSet<_>>()
    );
    wait_for_state(&handle, State::Connected).await;
    assert_eq!(resynced.lock().unwrap().len(), 3, "no scope resynced");
    handle.stop().await.unwrap();
}
