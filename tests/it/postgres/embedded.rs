//! The embedded database end to end: no Postgres configured, events
//! published over HTTP reach a subscriber, and survive a restart.

#![cfg(feature = "embedded")]

use crate::support::TestDb;
use crate::support::server::{TestServer, token};
use serde_json::json;

#[tokio::test]
async fn the_relay_runs_on_the_embedded_database() {
    let names = TestDb::unmigrated();
    let dir = std::env::temp_dir().join(format!("eventrelay-embedded-{}", names.schema));
    let data_dir = dir.to_string_lossy().into_owned();
    let embedded = |c: &mut eventrelay::config::Config| {
        c.database.url = None;
        c.database.embedded_dir = data_dir.clone();
    };

    let server = TestServer::start(&names, embedded);
    server.ready().await;
    let alice = token("alice", "org-1", json!({}));
    let (mut stream, resync) = server.subscribe(&alice, None, "").await;
    assert!(resync);
    let (status, body) = server
        .publish(json!([
            {"type": "order.created", "scopeKey": "org-1", "lane": "durable", "data": {"orderId": 1}},
            {"type": "sync.progress", "scopeKey": "org-1", "lane": "ephemeral"}
        ]))
        .await;
    assert_eq!(status, 200, "{body}");
    let seq = body["events"][0]["seq"].as_i64().unwrap();
    // The lanes are not ordered relative to each other: the ephemeral event
    // goes straight to the hub, the durable one is read from the outbox.
    let mut frames = stream.events(2).await;
    frames.sort_by_key(|f| f.event.clone());
    assert_eq!(frames[0].event.as_deref(), Some("order.created"));
    assert_eq!(frames[0].seq(), Some(seq));
    assert_eq!(frames[1].event.as_deref(), Some("sync.progress"));
    assert_eq!(frames[1].id, None);
    drop(stream);
    drop(server);

    // The folder keeps the outbox: a client replays across a restart.
    let server = TestServer::start(&names, embedded);
    server.ready().await;
    let (status, _) = server
        .publish(json!({"type": "order.paid", "scopeKey": "org-1", "lane": "durable"}))
        .await;
    assert_eq!(status, 200);
    let (replay, resync) = server
        .subscribe(&alice, Some(&(seq - 1).to_string()), "")
        .await;
    assert!(!resync);
    let types: Vec<String> = replay
        .replayed
        .iter()
        .map(|f| f.event.clone().unwrap())
        .collect();
    assert_eq!(types, ["order.created", "order.paid"]);
    drop(replay);
    drop(server);
    let _ = std::fs::remove_dir_all(dir);
}
