//! The Rust client renewing its token against the real relay: tokens that
//! live 6 seconds, the relay's `reauth` warning 2 seconds before they end,
//! and a durable event every 100 ms for 20 seconds. Every event arrives
//! once and in order across the renewals, and the client never reconnects:
//! each next stream opens before the old one ends. The same holds for a
//! stream of two scopes, in each scope's order.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::server::{TestServer, token_for_scopes};
use crate::support::{DEADLINE, TestDb, eventually};
use eventrelay::publisher::NewEvent;
use eventrelay_client::{ClientBuilder, ClientError, State};
use serde_json::json;
use tokio::time::Instant;

const TOKEN_LIFETIME: Duration = Duration::from_secs(6);
const PUBLISH_FOR: Duration = Duration::from_secs(20);
const PUBLISH_EVERY: Duration = Duration::from_millis(100);

#[tokio::test]
async fn a_token_provider_renews_six_second_tokens_without_losing_or_doubling_an_event() {
    renews_without_a_gap(&["org-1"]).await;
}

#[tokio::test]
async fn a_stream_of_two_scopes_renews_its_token_without_a_gap_too() {
    renews_without_a_gap(&["org-1", "org-2"]).await;
}

async fn renews_without_a_gap(scopes: &'static [&'static str]) {
    let db = TestDb::new().await;
    let server = TestServer::start(&db, |c| c.sse.reauth_lead_secs = 2);
    server.ready().await;
    let url = server.url("/v1/events");
    let issued = Arc::new(AtomicUsize::new(0));
    let counted = issued.clone();
    let (handle, mut events) = ClientBuilder::new(move |http| http.get(&url))
        .backoff(Duration::from_millis(20), Duration::from_millis(200))
        .channel_capacity(1024)
        .scopes(scopes.iter().copied())
        .token_provider(move || {
            counted.fetch_add(1, Ordering::SeqCst);
            let token = token_for_scopes("alice", scopes, json!({}), TOKEN_LIFETIME);
            std::future::ready(Ok::<_, ClientError>(token))
        })
        .start();
    let mut status = handle.subscribe();
    tokio::time::timeout(DEADLINE, status.wait_for(|s| s.state == State::Connected))
        .await
        .expect("connected before the deadline")
        .unwrap();
    // Every state change from here on: a renewal that fell back to a
    // reconnect would show as one.
    let changes = Arc::new(Mutex::new(Vec::new()));
    let recorded = changes.clone();
    status.mark_unchanged();
    tokio::spawn(async move {
        while status.changed().await.is_ok() {
            let state = status.borrow_and_update().state;
            recorded.lock().unwrap().push(state);
        }
    });

    let client = db.connect().await;
    let mut emitted = Vec::new();
    let mut ticks = tokio::time::interval(PUBLISH_EVERY);
    let started = Instant::now();
    while started.elapsed() < PUBLISH_FOR {
        ticks.tick().await;
        let n = emitted.len();
        let scope = scopes[n % scopes.len()];
        let event = NewEvent::durable("tick.counted", scope, json!({"n": n}));
        emitted.push((scope, db.emit_in(&client, event).await.id));
    }

    let mut received = Vec::new();
    while received.len() < emitted.len() {
        let event = tokio::time::timeout(DEADLINE, events.recv())
            .await
            .unwrap_or_else(|_| panic!("only {} of {} events", received.len(), emitted.len()))
            .expect("client still running");
        received.push((
            scope_of(scopes, &event.envelope.scope_key),
            event.envelope.id,
        ));
    }
    // In each scope's order: events of two scopes may interleave otherwise
    // where a stream's replay meets the live events.
    for scope in scopes {
        let of = |events: &[(&str, uuid::Uuid)]| -> Vec<uuid::Uuid> {
            events
                .iter()
                .filter(|(s, _)| s == scope)
                .map(|(_, id)| *id)
                .collect()
        };
        assert_eq!(of(&received), of(&emitted), "every event once, in order");
    }
    let tokens = issued.load(Ordering::SeqCst);
    // The first token, then one per renewal.
    assert!(tokens >= 4, "{tokens} tokens in {PUBLISH_FOR:?}");
    assert_eq!(
        *changes.lock().unwrap(),
        Vec::<State>::new(),
        "the state never left Connected"
    );
    // The replaced streams are closed; only the last one is left.
    eventually("one stream left", async || {
        (server.metric("eventrelay_sse_connections").await == 1.0).then_some(())
    })
    .await;

    handle.stop().await.unwrap();
    let mut late = Vec::new();
    while let Some(event) = events.recv().await {
        late.push(event.envelope.id);
    }
    assert!(late.is_empty(), "delivered twice: {late:?}");
}

/// `scope` as one of `scopes`, whose lifetime the comparison needs.
fn scope_of(scopes: &[&'static str], scope: &str) -> &'static str {
    scopes
        .iter()
        .find(|s| **s == scope)
        .copied()
        .unwrap_or("elsewhere")
}
