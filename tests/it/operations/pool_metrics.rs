//! The pool metrics an operator sizes the relay with: actor mailboxes and
//! handling time, hub arbiters, the database pool, outbox reads, session
//! queues and the webhook dispatcher, observed on a real relay under a
//! little load.

use crate::support::TestDb;
use crate::support::server::{TestServer, token};
use eventrelay::publisher::{NewEvent, Publisher};
use serde_json::json;

#[tokio::test]
async fn every_pool_reports_its_load() {
    let db = TestDb::new().await;
    let server = TestServer::start(&db, |c| {
        c.hub.arbiters = 2;
        c.database.pool_size = 4;
    });
    server.ready().await;
    let (mut stream, _) = server
        .subscribe(&token("alice", "org-1", json!({})), None, "")
        .await;
    let client = db.connect().await;
    let publisher = Publisher::new(db.schema.as_str()).unwrap();
    // Rows travel with their pointers, except the last one, too large for
    // a notification, which the relay reads from the outbox.
    for n in 0..20 {
        let pad = if n == 19 { 9_000 } else { 0 };
        let data = json!({"n": n, "pad": "x".repeat(pad)});
        publisher
            .emit(&client, NewEvent::durable("n", "org-1", data))
            .await
            .unwrap();
    }
    stream.events(20).await;

    // One notification each for the listener and the relay; the hub gets
    // the attach and the events in batches.
    for (actor, least) in [("listener", 20.0), ("relay", 20.0), ("hub", 2.0)] {
        let handled = server
            .metric(&format!(
                "eventrelay_actor_handling_seconds_count{{actor=\"{actor}\"}}"
            ))
            .await;
        assert!(handled >= least, "{actor} handled {handled} messages");
    }
    // Every message counted into a mailbox is counted out: the depths
    // settle at exactly zero, never below.
    for actor in ["listener", "relay", "hub", "dispatcher"] {
        server
            .wait_for_metric(
                &format!("eventrelay_actor_mailbox_depth{{actor=\"{actor}\"}}"),
                |depth| depth == 0.0,
            )
            .await;
    }
    let mut hubs = 0.0;
    for arbiter in [0, 1] {
        hubs += server
            .metric(&format!("eventrelay_arbiter_hubs{{arbiter=\"{arbiter}\"}}"))
            .await;
    }
    assert_eq!(hubs, 1.0, "one active scope, one hub");
    let busy: f64 = server
        .metric("eventrelay_arbiter_busy_seconds_total{arbiter=\"0\"}")
        .await
        + server
            .metric("eventrelay_arbiter_busy_seconds_total{arbiter=\"1\"}")
            .await;
    assert!(busy > 0.0, "the hub's arbiter was never busy");

    assert!(server.metric("eventrelay_database_pool_size").await >= 1.0);
    assert!(server.metric("eventrelay_database_pool_size").await <= 4.0);
    assert!(
        server
            .metric("eventrelay_database_pool_wait_seconds_count")
            .await
            >= 1.0
    );
    assert!(server.metric("eventrelay_outbox_read_seconds_count").await >= 1.0);
    assert!(server.metric("eventrelay_outbox_read_rows_sum").await >= 1.0);
    assert!(
        server
            .metric("eventrelay_session_queue_fill_ratio_count")
            .await
            >= 1.0
    );
    assert_eq!(server.metric("eventrelay_listener_connected").await, 1.0);

    // The scope's hub goes away with its last subscriber.
    drop(stream);
    server
        .wait_for_metric("eventrelay_active_scopes", |n| n == 0.0)
        .await;
    for arbiter in [0, 1] {
        server
            .wait_for_metric(
                &format!("eventrelay_arbiter_hubs{{arbiter=\"{arbiter}\"}}"),
                |n| n == 0.0,
            )
            .await;
    }
}

#[tokio::test]
async fn a_dropped_slow_subscriber_counts_its_frames() {
    let db = TestDb::new().await;
    let server = TestServer::start(&db, |c| c.sse.queue_capacity = 64);
    server.ready().await;
    let (_never_reads, _) = server
        .subscribe(&token("slow", "org-1", json!({})), None, "")
        .await;
    server
        .flood_until_a_slow_subscriber_is_dropped(&db, "org-1", None)
        .await;
    // The full queue (64 frames) and the frame that did not fit.
    assert_eq!(server.metric("eventrelay_frames_dropped_total").await, 65.0);
}

#[tokio::test]
async fn the_webhook_backlog_shows_deliveries_waiting_for_a_worker() {
    let db = TestDb::new().await;
    // A receiver that accepts connections and never answers: the one
    // worker stays busy with the first delivery, the others wait.
    let stalled = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/hook", stalled.local_addr().unwrap());
    let server = TestServer::start(&db, |c| {
        c.webhooks.workers = 1;
        c.webhooks.allow_private_networks = true;
        c.webhooks.subscriptions = vec![eventrelay::webhooks::NewSubscription {
            id: "stalled".into(),
            url,
            secret: eventrelay::webhooks::generate_secret().into(),
            types: vec!["*".into()],
            scope_key: None,
            max_per_second: None,
            ordering: Default::default(),
            ordering_max_block_secs: None,
        }];
    });
    server.ready().await;
    let client = db.connect().await;
    let publisher = Publisher::new(db.schema.as_str()).unwrap();
    for n in 0..3 {
        publisher
            .emit(&client, NewEvent::durable("n", "org-1", json!({"n": n})))
            .await
            .unwrap();
    }
    server
        .wait_for_metric("eventrelay_webhook_workers_busy", |n| n == 1.0)
        .await;
    server
        .wait_for_metric("eventrelay_webhook_due_backlog", |n| n == 2.0)
        .await;
    server
        .wait_for_metric("eventrelay_webhook_oldest_due_age_seconds", |age| age > 0.0)
        .await;
}
