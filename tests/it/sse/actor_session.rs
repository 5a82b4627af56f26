//! The actor session (`sse.session = "actor"`) speaks the same protocol as
//! the default stream session: framing, heartbeats, replay from memory and
//! from the outbox, `until`, the age cap, slow subscribers and clients that
//! close their connection.

use crate::support::TestDb;
use crate::support::server::{Frame, TestServer, token};
use eventrelay::config::{Config, SessionModel};
use eventrelay::publisher::NewEvent;
use serde_json::json;

fn actor_sessions(config: &mut Config) {
    config.sse.session = SessionModel::Actor;
}

fn durable(event_type: &str) -> NewEvent {
    NewEvent::durable(event_type, "org-1", json!({}))
}

fn ids(frames: &[Frame]) -> Vec<String> {
    frames
        .iter()
        .map(|f| f.json()["id"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn frames_events_and_heartbeats_like_the_stream_session() {
    let db = TestDb::new().await;
    let server = TestServer::start(&db, |c| {
        actor_sessions(c);
        c.sse.heartbeat_secs = 1;
    });
    server.ready().await;
    let mut stream = server
        .connect(Some(&token("alice", "org-1", json!({}))), None, "")
        .await
        .unwrap();
    assert_eq!(
        stream.next_frame().await.unwrap().retry.as_deref(),
        Some("3000")
    );
    assert_eq!(
        stream.next_frame().await.unwrap().event.as_deref(),
        Some("ready")
    );
    let committed = db.emit(durable("order.created")).await;
    let frame = stream.next_event().await;
    assert_eq!(frame.id, Some(committed.seq.unwrap().to_string()));
    assert_eq!(frame.json()["id"], committed.id.to_string());
    let heartbeat = loop {
        let frame = stream.next_frame().await.unwrap();
        if frame.comment.is_some() {
            break frame;
        }
    };
    assert_eq!(heartbeat.comment.as_deref(), Some("hb"));
}

#[tokio::test]
async fn replays_from_memory_and_from_the_outbox_then_goes_live() {
    let db = TestDb::new().await;
    let server = TestServer::start(&db, |c| {
        actor_sessions(c);
        c.sse.replay_lookback = 0;
    });
    server.ready().await;
    let alice = token("alice", "org-1", json!({}));
    let (mut live, _) = server.subscribe(&alice, None, "").await;
    let first = db.emit(durable("a")).await;
    let mut expected = Vec::new();
    for _ in 0..4 {
        expected.push(db.emit(durable("b")).await.id.to_string());
    }
    // Once the live subscriber has them all, so has the hub's tail.
    live.events(5).await;
    let after = first.seq.unwrap().to_string();
    let (mut from_memory, resync) = server.subscribe(&alice, Some(&after), "").await;
    assert!(!resync);
    assert_eq!(ids(&from_memory.replayed), expected);
    let next = db.emit(durable("c")).await;
    assert_eq!(
        from_memory.next_event().await.json()["id"],
        next.id.to_string()
    );
    expected.push(next.id.to_string());
    drop(from_memory);
    drop(live);

    server
        .wait_for_metric("eventrelay_active_scopes", |v| v == 0.0)
        .await;
    let (from_outbox, resync) = server.subscribe(&alice, Some(&after), "").await;
    assert!(!resync);
    assert_eq!(ids(&from_outbox.replayed), expected);
    assert_eq!(
        server
            .metric("eventrelay_replays_total{source=\"outbox\"}")
            .await,
        1.0
    );
}

#[tokio::test]
async fn until_and_the_age_cap_end_the_stream_cleanly() {
    let db = TestDb::new().await;
    let server = TestServer::start(&db, |c| {
        actor_sessions(c);
        c.sse.max_age_secs = 2;
    });
    server.ready().await;
    let (mut until, _) = server
        .subscribe(&token("alice", "org-1", json!({})), None, "?until=job.done")
        .await;
    let (mut aged, _) = server
        .subscribe(&token("bob", "org-2", json!({})), None, "")
        .await;
    db.emit(durable("job.progress")).await;
    db.emit(durable("job.done")).await;
    db.emit(durable("job.after")).await;
    assert_eq!(
        until.next_event().await.event.as_deref(),
        Some("job.progress")
    );
    assert_eq!(until.next_event().await.event.as_deref(), Some("job.done"));
    assert!(until.ends().await);
    assert!(aged.ends().await);
}

#[tokio::test]
async fn a_closed_client_is_released_and_a_slow_one_dropped() {
    let db = TestDb::new().await;
    let server = TestServer::start(&db, |c| {
        actor_sessions(c);
        c.sse.queue_capacity = 64;
    });
    server.ready().await;
    let (closing, _) = server
        .subscribe(&token("carol", "org-1", json!({})), None, "")
        .await;
    assert_eq!(server.metric("eventrelay_sse_connections").await, 1.0);
    drop(closing);
    // The default heartbeat is 20 s: only the peek can notice this soon.
    server
        .wait_for_metric("eventrelay_sse_connections", |v| v == 0.0)
        .await;

    let (_never_reads, _) = server
        .subscribe(&token("slow", "org-1", json!({})), None, "")
        .await;
    server
        .flood_until_a_slow_subscriber_is_dropped(&db, "org-1", None)
        .await;
    server
        .wait_for_metric("eventrelay_sse_connections", |v| v == 0.0)
        .await;
}
