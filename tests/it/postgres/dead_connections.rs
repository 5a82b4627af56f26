//! Dead connections found and replaced: a proxy between the relay and
//! Postgres stops forwarding without closing anything, as a NAT gateway
//! does to a flow it dropped. The relay must notice within its health
//! interval, say so on `/readyz`, and lose nothing once the path is back.

use std::time::{Duration, Instant};

use crate::support::freezer::{Freezer, postgres_addr};
use crate::support::receiver::Receiver;
use crate::support::server::{TestServer, token};
use crate::support::{DEADLINE, TestDb, eventually_within};
use eventrelay::publisher::NewEvent;
use eventrelay::webhooks::NewSubscription;
use serde_json::{Value, json};

const HEALTH_SECS: u64 = 2;

async fn readyz(server: &TestServer) -> (u16, Value) {
    let response = reqwest::get(server.url("/readyz")).await.unwrap();
    (
        response.status().as_u16(),
        response.json().await.unwrap_or(Value::Null),
    )
}

/// Waits until `/readyz` answers `status`, at most `limit`.
async fn wait_ready_status(server: &TestServer, status: u16, limit: Duration) -> Value {
    eventually_within(&format!("/readyz answers {status}"), limit, async || {
        let (now, body) = readyz(server).await;
        (now == status).then_some(body)
    })
    .await
}

async fn emit(db: &TestDb, event_type: &str) -> String {
    db.emit(NewEvent::durable(event_type, "org-1", json!({})))
        .await
        .id
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silently_dropped_listen_connection_is_found_and_nothing_is_lost() {
    let db = TestDb::new().await;
    let proxy = Freezer::start(postgres_addr()).await;
    let receiver = Receiver::start([]);
    let listen_url = proxy.url_for(&db);
    let hook = receiver.url.clone();
    let server = TestServer::start(&db, move |c| {
        c.database.listen_url = Some(listen_url.into());
        c.database.listen_health_secs = HEALTH_SECS;
        c.webhooks.allow_private_networks = true;
        c.webhooks.subscriptions = vec![NewSubscription {
            id: "receiver".into(),
            url: hook,
            secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".into(),
            types: vec!["*".into()],
            scope_key: None,
            max_per_second: None,
            ordering: Default::default(),
            ordering_max_block_secs: None,
        }];
    });
    server.ready().await;
    let (mut stream, _) = server
        .subscribe(&token("alice", "org-1", json!({})), None, "")
        .await;
    let before = emit(&db, "before").await;
    assert_eq!(stream.next_event().await.json()["id"], before);
    receiver.wait_for(1).await;

    proxy.freeze();
    let frozen_at = Instant::now();
    let body = wait_ready_status(&server, 503, Duration::from_secs(2 * HEALTH_SECS)).await;
    assert!(
        body["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("LISTEN"),
        "{body}"
    );
    eprintln!("found dead after {:?}", frozen_at.elapsed());
    assert!(
        server
            .metric("eventrelay_database_connections_dead_total")
            .await
            >= 1.0
    );

    let mut missed = Vec::new();
    for n in 0..3 {
        missed.push(emit(&db, &format!("while.frozen.{n}")).await);
    }
    // Webhooks do not wait for the LISTEN connection.
    receiver.wait_for(4).await;

    proxy.restore();
    let mut received = Vec::new();
    while received.len() < missed.len() {
        let frame = stream.next_event().await;
        received.push(frame.json()["id"].as_str().unwrap().to_owned());
    }
    assert_eq!(received, missed);
    wait_ready_status(&server, 200, DEADLINE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_behind_a_dropped_path_recovers_without_losing_anything() {
    let db = TestDb::new().await;
    let proxy = Freezer::start(postgres_addr()).await;
    let url = proxy.url_for(&db);
    let server = TestServer::start(&db, move |c| {
        c.database.url = Some(url.into());
        c.database.migrate = false;
        c.database.pool_size = 2;
        c.database.listen_health_secs = HEALTH_SECS;
        c.webhooks.enabled = false;
    });
    server.ready().await;
    let (mut stream, _) = server
        .subscribe(&token("alice", "org-1", json!({})), None, "")
        .await;
    let (status, _) = server
        .publish(json!({"type": "before", "scopeKey": "org-1", "lane": "durable", "data": {}}))
        .await;
    assert_eq!(status, 200);
    stream.next_event().await;

    proxy.freeze();
    wait_ready_status(&server, 503, Duration::from_secs(2 * HEALTH_SECS)).await;
    let missed = emit(&db, "while.frozen").await;

    proxy.restore();
    let frame = stream.next_event().await;
    assert_eq!(frame.json()["id"], missed);
    // Pooled connections from before the freeze are dead; the pool checks
    // each before handing it out and replaces it.
    let (status, body) = server
        .publish(json!({"type": "after", "scopeKey": "org-1", "lane": "durable", "data": {}}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(stream.next_event().await.json()["type"], "after");
    wait_ready_status(&server, 200, DEADLINE).await;
}

/// The last statement the backend `pid` ran, as Postgres reports it.
async fn last_statement_of(db: &TestDb, pid: i32) -> String {
    db.connect()
        .await
        .query_one("SELECT query FROM pg_stat_activity WHERE pid = $1", &[&pid])
        .await
        .unwrap()
        .get(0)
}

#[tokio::test]
async fn a_connection_used_moments_ago_goes_out_unchecked_and_an_idle_one_is_checked() {
    let db = TestDb::new().await;
    let options = eventrelay::publisher::PgConnectOptions::parse(&db.url).unwrap();
    let pool = eventrelay::store::Database::pool(&options, 1, Duration::from_secs(5)).unwrap();
    let conn = pool.get().await.unwrap();
    let pid: i32 = conn
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    drop(conn);

    // Checked out again at once: it answered moments ago, no check query.
    drop(pool.get().await.unwrap());
    assert_eq!(last_statement_of(&db, pid).await, "SELECT pg_backend_pid()");

    // Idle past the one-second window: the pool's check query (an empty
    // statement) runs before it is handed out.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let conn = pool.get().await.unwrap();
    assert_eq!(last_statement_of(&db, pid).await, "");
    drop(conn);
}
