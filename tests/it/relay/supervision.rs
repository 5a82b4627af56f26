//! Actors that fail are restarted: a hub, the relay or the listener that
//! panics (a fault injected through the `fault-injection` feature's test
//! hook) is restarted and counted; the affected streams end cleanly, their
//! clients reconnect and replay, and no durable event is lost.

#![cfg(feature = "fault-injection")]
use crate::support::TestDb;
use crate::support::server::{Frame, TestServer, token};
use eventrelay::publisher::NewEvent;
use serde_json::json;

async fn emit(db: &TestDb, n: usize) -> eventrelay::publisher::EventEnvelope {
    db.emit(NewEvent::durable("n", "org-1", json!({"n": n})))
        .await
}

async fn inject(db: &TestDb, target: &str) {
    db.connect()
        .await
        .execute(
            "SELECT pg_notify($1, $2)",
            &[&db.channel.as_str(), &format!("eventrelay-fault:{target}")],
        )
        .await
        .unwrap();
}

/// Subscribes, sees 3 events, lets `target` fail, checks the stream ends
/// cleanly, emits 3 more, and reconnects from the last id seen: all 6
/// events arrive, in order. (A resume may send again what the first stream
/// saw in its last moments; a client drops those by envelope id.)
async fn a_failure_loses_nothing(target: &str, actor: &str) {
    let db = TestDb::new().await;
    let server = TestServer::start(&db, |c| c.sse.replay_lookback = 0);
    server.ready().await;
    let alice = token("alice", "org-1", json!({}));
    let (mut stream, _) = server.subscribe(&alice, None, "").await;
    let mut expected = Vec::new();
    for n in 0..3 {
        expected.push(emit(&db, n).await.id.to_string());
    }
    let mut seen: Vec<String> = Vec::new();
    let mut last_id = None;
    for frame in stream.events(3).await {
        last_id = frame.id.clone();
        seen.push(frame.json()["id"].as_str().unwrap().to_owned());
    }

    inject(&db, target).await;
    server
        .wait_for_metric(
            &format!("eventrelay_actor_restarts_total{{actor=\"{actor}\"}}"),
            |v| v == 1.0,
        )
        .await;
    if actor != "listener" {
        assert!(stream.ends().await, "the stream must end cleanly");
    }
    drop(stream);

    for n in 3..6 {
        expected.push(emit(&db, n).await.id.to_string());
    }
    let (mut resumed, _) = server.subscribe(&alice, last_id.as_deref(), "").await;
    let take = |seen: &mut Vec<String>, frame: &Frame| {
        let id = frame.json()["id"].as_str().unwrap().to_owned();
        if !seen.contains(&id) {
            seen.push(id);
        }
    };
    for frame in &resumed.replayed {
        take(&mut seen, frame);
    }
    while seen.len() < expected.len() {
        take(&mut seen, &resumed.next_event().await);
    }
    assert_eq!(seen, expected);
}

#[tokio::test]
async fn a_failed_hub_is_restarted_and_its_subscribers_replay() {
    a_failure_loses_nothing("hub:org-1", "hub").await;
}

#[tokio::test]
async fn a_failed_relay_is_restarted_and_every_stream_replays() {
    a_failure_loses_nothing("relay", "relay").await;
}

#[tokio::test]
async fn a_failed_listener_reconnects_and_events_keep_flowing() {
    a_failure_loses_nothing("listener", "listener").await;
}
