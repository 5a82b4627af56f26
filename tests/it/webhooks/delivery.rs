//! Webhooks end to end: deliveries written with the event, sent signed to a
//! real local receiver, retried on the schedule, and never sent twice at
//! once by two dispatchers.

use std::collections::HashMap;
use std::time::Duration;

use crate::support::receiver::{Receiver, Reply};
use crate::support::server::TestServer;
use crate::support::{TestDb, eventually, test_in_both_wakeup_modes};
use eventrelay::config::Config;
use eventrelay::publisher::{Audience, NewEvent, Publisher, WebhookHeaders, WebhookSecret, verify};
use eventrelay::store::WakeupMode;
use eventrelay::webhooks::NewSubscription;
use eventrelay::webhooks::WebhookStore;
use serde_json::{Value, json};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

fn webhooks(url: &str, schedule_ms: &[u64]) -> impl Fn(&mut Config) + Clone {
    let url = url.to_owned();
    let schedule = schedule_ms.to_vec();
    move |config: &mut Config| {
        config.webhooks.allow_private_networks = true;
        config.webhooks.retry_schedule_ms = schedule.clone();
        config.webhooks.request_timeout_ms = 2_000;
        config.webhooks.lease_ms = 3_000;
        config.webhooks.subscriptions = vec![NewSubscription {
            id: "receiver".into(),
            url: url.clone(),
            secret: SECRET.into(),
            types: vec!["order.*".into()],
            scope_key: None,
            max_per_second: None,
            ordering: Default::default(),
            ordering_max_block_secs: None,
        }];
    }
}

/// (status, attempts) of every delivery, oldest first.
async fn deliveries(db: &TestDb) -> Vec<(String, i32)> {
    let client = db.connect().await;
    client
        .query(
            &format!(
                "SELECT status, attempts FROM {}.webhook_deliveries ORDER BY id",
                db.schema
            ),
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect()
}

/// Waits until every delivery has left `pending`.
async fn settled(db: &TestDb) -> Vec<(String, i32)> {
    eventually("every delivery leaves pending", async || {
        let all = deliveries(db).await;
        (!all.is_empty() && all.iter().all(|(status, _)| status != "pending")).then_some(all)
    })
    .await
}

test_in_both_wakeup_modes!(a_delivery_is_signed_and_carries_the_envelope_without_its_audience);

/// In logical mode the replication stream, not a notification, wakes the
/// dispatcher (well before its poll).
async fn a_delivery_is_signed_and_carries_the_envelope_without_its_audience(mode: WakeupMode) {
    let (db, _cluster) = TestDb::for_mode(mode).await;
    let receiver = Receiver::start([]);
    let server = TestServer::start(&db, webhooks(&receiver.url, &[50]));
    server.ready().await;
    let event = db
        .emit(
            NewEvent::durable("order.created", "org-1", json!({"orderId": 7}))
                .with_audience(Audience::users(["alice"])),
        )
        .await;
    db.emit(NewEvent::durable("user.created", "org-1", json!({})))
        .await;
    db.emit(NewEvent::ephemeral("order.progress", "org-1", json!({})))
        .await;

    let request = receiver.wait_for(1).await.remove(0);
    let secret = WebhookSecret::parse(SECRET).unwrap();
    verify(
        &secret,
        WebhookHeaders {
            id: &request.headers["webhook-id"],
            timestamp: &request.headers["webhook-timestamp"],
            signature: &request.headers["webhook-signature"],
        },
        &request.body,
    )
    .expect("the signature verifies");
    assert_eq!(request.headers["webhook-id"], event.id.to_string());
    assert_eq!(request.headers["content-type"], "application/json");
    let body: Value = serde_json::from_slice(&request.body).unwrap();
    assert_eq!(body["id"], event.id.to_string());
    assert_eq!(body["data"], json!({"orderId": 7}));
    assert_eq!(body["seq"], event.seq.unwrap());
    assert!(body.get("audience").is_none(), "the audience never leaves");
    assert_eq!(settled(&db).await, [("delivered".to_owned(), 1)]);
    assert_eq!(
        server
            .metric("eventrelay_webhook_deliveries_total{outcome=\"delivered\"}")
            .await,
        1.0
    );
}

#[tokio::test]
async fn failures_are_retried_on_the_schedule_and_then_the_delivery_is_dead() {
    let db = TestDb::new().await;
    let receiver = Receiver::start([Reply::Status(500), Reply::Status(502), Reply::Status(500)]);
    let server = TestServer::start(&db, webhooks(&receiver.url, &[50, 50]));
    server.ready().await;
    let event = db
        .emit(NewEvent::durable("order.created", "org-1", json!({})))
        .await;
    assert_eq!(settled(&db).await, [("dead".to_owned(), 3)]);
    let received = receiver.received();
    assert_eq!(received.len(), 3);
    assert!(
        received
            .iter()
            .all(|r| r.headers["webhook-id"] == event.id.to_string())
    );
    assert_eq!(
        server
            .metric("eventrelay_webhook_deliveries_total{outcome=\"retry\"}")
            .await,
        2.0
    );
    assert_eq!(
        server
            .metric("eventrelay_webhook_deliveries_total{outcome=\"dead\"}")
            .await,
        1.0
    );
}

#[tokio::test]
async fn a_retry_that_succeeds_is_delivered() {
    let db = TestDb::new().await;
    let receiver = Receiver::start([Reply::Status(503)]);
    let server = TestServer::start(&db, webhooks(&receiver.url, &[50, 50]));
    server.ready().await;
    db.emit(NewEvent::durable("order.created", "org-1", json!({})))
        .await;
    assert_eq!(settled(&db).await, [("delivered".to_owned(), 2)]);
}

#[tokio::test]
async fn gone_gives_up_at_once() {
    let db = TestDb::new().await;
    let receiver = Receiver::start([Reply::Status(410)]);
    let server = TestServer::start(&db, webhooks(&receiver.url, &[50, 50]));
    server.ready().await;
    db.emit(NewEvent::durable("order.created", "org-1", json!({})))
        .await;
    assert_eq!(settled(&db).await, [("gone".to_owned(), 1)]);
    assert_eq!(receiver.received().len(), 1);
}

#[tokio::test]
async fn a_redirect_is_never_followed() {
    let db = TestDb::new().await;
    let elsewhere = format!("{}/elsewhere", receiver_base(&Receiver::start([]).url));
    let receiver = Receiver::start([Reply::WithHeader(302, "location", elsewhere)]);
    let server = TestServer::start(&db, webhooks(&receiver.url, &[50]));
    server.ready().await;
    db.emit(NewEvent::durable("order.created", "org-1", json!({})))
        .await;
    assert_eq!(settled(&db).await, [("delivered".to_owned(), 2)]);
    assert!(receiver.received().iter().all(|r| r.path == "/hook"));
    let client = db.connect().await;
    let error: String = client
        .query_one(
            &format!(
                "SELECT error FROM {}.webhook_attempts WHERE attempt = 1",
                db.schema
            ),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(error.contains("redirect"), "{error}");
}

fn receiver_base(url: &str) -> String {
    url.trim_end_matches("/hook").to_owned()
}

#[tokio::test]
async fn a_timeout_is_retried() {
    let db = TestDb::new().await;
    let receiver = Receiver::start([Reply::Slow(Duration::from_millis(1500), 200)]);
    let url = receiver.url.clone();
    let server = TestServer::start(&db, move |config| {
        webhooks(&url, &[50])(config);
        config.webhooks.request_timeout_ms = 300;
        config.webhooks.lease_ms = 1_000;
    });
    server.ready().await;
    db.emit(NewEvent::durable("order.created", "org-1", json!({})))
        .await;
    assert_eq!(settled(&db).await, [("delivered".to_owned(), 2)]);
    let client = db.connect().await;
    let error: String = client
        .query_one(
            &format!(
                "SELECT error FROM {}.webhook_attempts WHERE attempt = 1",
                db.schema
            ),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(error, "timed out");
}

#[tokio::test]
async fn retry_after_is_honoured_over_the_schedule() {
    let db = TestDb::new().await;
    let receiver = Receiver::start([Reply::WithHeader(429, "retry-after", "1".into())]);
    // The schedule alone would wait a minute.
    let server = TestServer::start(&db, webhooks(&receiver.url, &[60_000]));
    server.ready().await;
    db.emit(NewEvent::durable("order.created", "org-1", json!({})))
        .await;
    assert_eq!(settled(&db).await, [("delivered".to_owned(), 2)]);
}

#[tokio::test]
async fn a_dispatcher_stopped_mid_request_has_its_delivery_sent_again() {
    let db = TestDb::new().await;
    let receiver = Receiver::start([Reply::Slow(Duration::from_secs(5), 200)]);
    let url = receiver.url.clone();
    let configure = move |config: &mut Config| {
        webhooks(&url, &[50])(config);
        config.webhooks.request_timeout_ms = 1_000;
        config.webhooks.lease_ms = 1_500;
    };
    let first = TestServer::start(&db, configure.clone());
    first.ready().await;
    let event = db
        .emit(NewEvent::durable("order.created", "org-1", json!({})))
        .await;
    receiver.wait_for(1).await;
    drop(first); // mid-request: the attempt is never recorded

    let second = TestServer::start(&db, configure);
    second.ready().await;
    let received = receiver.wait_for(2).await;
    assert!(
        received
            .iter()
            .all(|r| r.headers["webhook-id"] == event.id.to_string())
    );
    assert_eq!(settled(&db).await, [("delivered".to_owned(), 2)]);
}

#[tokio::test]
async fn two_dispatchers_never_both_send_one_attempt() {
    let db = TestDb::new().await;
    let receiver = Receiver::start([]);
    let configure = webhooks(&receiver.url, &[50]);
    let one = TestServer::start(&db, configure.clone());
    let two = TestServer::start(&db, configure);
    one.ready().await;
    two.ready().await;
    let client = db.connect().await;
    let publisher = Publisher::new(db.schema.as_str()).unwrap();
    for n in 0..40 {
        publisher
            .emit(
                &client,
                NewEvent::durable("order.created", "org-1", json!({"n": n})),
            )
            .await
            .unwrap();
    }
    let all = settled(&db).await;
    assert_eq!(all.len(), 40);
    assert!(
        all.iter()
            .all(|(status, attempts)| status == "delivered" && *attempts == 1)
    );
    let mut per_id: HashMap<String, usize> = HashMap::new();
    for request in receiver.received() {
        *per_id
            .entry(request.headers["webhook-id"].clone())
            .or_default() += 1;
    }
    assert_eq!(per_id.len(), 40);
    assert!(per_id.values().all(|count| *count == 1), "{per_id:?}");
}

#[tokio::test]
async fn a_rolled_back_event_leaves_no_delivery() {
    let db = TestDb::new().await;
    let receiver = Receiver::start([]);
    let server = TestServer::start(&db, webhooks(&receiver.url, &[50]));
    server.ready().await;
    let mut client = db.connect().await;
    let tx = client.transaction().await.unwrap();
    Publisher::new(db.schema.as_str())
        .unwrap()
        .emit(&tx, NewEvent::durable("order.created", "org-1", json!({})))
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    db.emit(NewEvent::durable("order.paid", "org-1", json!({})))
        .await;
    assert_eq!(settled(&db).await, [("delivered".to_owned(), 1)]);
    let body: Value = serde_json::from_slice(&receiver.received()[0].body).unwrap();
    assert_eq!(body["type"], "order.paid");
}

#[tokio::test]
async fn internal_addresses_are_refused_unless_allowed() {
    let db = TestDb::new().await;
    let receiver = Receiver::start([]);
    let url = receiver.url.clone();
    let server = TestServer::start(&db, move |config| {
        webhooks(&url, &[50])(config);
        config.webhooks.allow_private_networks = false;
    });
    server.ready().await;
    db.emit(NewEvent::durable("order.created", "org-1", json!({})))
        .await;
    assert_eq!(settled(&db).await, [("dead".to_owned(), 2)]);
    assert!(receiver.received().is_empty());
    let client = db.connect().await;
    let error: String = client
        .query_one(
            &format!("SELECT last_error FROM {}.webhook_deliveries", db.schema),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(error.contains("internal address"), "{error}");
}

/// A URL may carry a token in its query; a failed attempt's error, stored
/// and shown to operators, leaves it out.
#[tokio::test]
async fn a_delivery_error_does_not_show_the_urls_query() {
    let db = TestDb::new().await;
    let closed = format!(
        "http://127.0.0.1:{}/hook?password=hunter2&token=s3cr3t",
        crate::support::process::free_port()
    );
    let server = TestServer::start(&db, webhooks(&closed, &[50]));
    server.ready().await;
    db.emit(NewEvent::durable("order.created", "org-1", json!({})))
        .await;
    assert_eq!(settled(&db).await, [("dead".to_owned(), 2)]);
    let client = db.connect().await;
    let errors: Vec<String> = client
        .query(
            &format!(
                "SELECT last_error FROM {schema}.webhook_deliveries
                 UNION ALL SELECT error FROM {schema}.webhook_attempts",
                schema = db.schema
            ),
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get::<_, Option<String>>(0).unwrap_or_default())
        .collect();
    assert_eq!(errors.len(), 3, "{errors:?}");
    for error in errors {
        assert!(
            error.contains("127.0.0.1"),
            "the error names the host: {error}"
        );
        assert!(
            !error.contains("hunter2") && !error.contains("s3cr3t"),
            "{error}"
        );
    }
}

#[tokio::test]
async fn a_rotated_secret_keeps_signing_during_its_grace_window() {
    let db = TestDb::new().await;
    let receiver = Receiver::start([]);
    let url = receiver.url.clone();
    let server = TestServer::start(&db, move |config| {
        webhooks(&url, &[50])(config);
        config.webhooks.subscriptions.clear();
    });
    server.ready().await;
    let store = WebhookStore::new(&db.schema);
    let client = db.connect().await;
    store
        .create_subscription(
            &client,
            &NewSubscription {
                id: "rotating".into(),
                url: receiver.url.clone(),
                secret: "old-secret-old-secret-old".into(),
                types: vec!["*".into()],
                scope_key: None,
                max_per_second: None,
                ordering: Default::default(),
                ordering_max_block_secs: None,
            },
        )
        .await
        .unwrap();
    store
        .rotate_secret(
            &client,
            "rotating",
            "new-secret-new-secret-new",
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    db.emit(NewEvent::durable("anything", "org-1", json!({})))
        .await;
    let request = receiver.wait_for(1).await.remove(0);
    for secret in ["old-secret-old-secret-old", "new-secret-new-secret-new"] {
        verify(
            &WebhookSecret::parse(secret).unwrap(),
            WebhookHeaders {
                id: &request.headers["webhook-id"],
                timestamp: &request.headers["webhook-timestamp"],
                signature: &request.headers["webhook-signature"],
            },
            &request.body,
        )
        .unwrap_or_else(|e| panic!("{secret}: {e}"));
    }
}

#[tokio::test]
async fn a_vanished_subscription_gives_up_at_once() {
    let db = TestDb::new().await;
    let receiver = Receiver::start([Reply::Slow(Duration::from_millis(10), 500)]);
    let url = receiver.url.clone();
    let server = TestServer::start(&db, move |config| {
        webhooks(&url, &[300])(config);
    });
    server.ready().await;
    db.emit(NewEvent::durable("order.created", "org-1", json!({})))
        .await;
    receiver.wait_for(1).await;
    let client = db.connect().await;
    client
        .execute(
            &format!("DELETE FROM {}.webhook_subscriptions", db.schema),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(settled(&db).await, [("gone".to_owned(), 2)]);
    assert_eq!(receiver.received().len(), 1);
}

/// A subscription to `order.*` events, written straight to the store.
async fn subscribe_to_orders(db: &TestDb, url: &str) {
    let client = db.connect().await;
    WebhookStore::new(&db.schema)
        .create_subscription(
            &client,
            &NewSubscription {
                id: "orders".into(),
                url: url.to_owned(),
                secret: SECRET.into(),
                types: vec!["order.*".into()],
                scope_key: None,
                max_per_second: None,
                ordering: Default::default(),
                ordering_max_block_secs: None,
            },
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn only_a_statement_that_queues_deliveries_announces_them() {
    let db = TestDb::new().await;
    subscribe_to_orders(&db, "http://127.0.0.1:9/hooks").await;
    let mut notifications = db.listen().await;
    let publisher = Publisher::new(db.schema.as_str()).unwrap();
    let mut client = db.connect().await;

    // Three matching events in two statements, and one that matches nothing.
    let tx = client.transaction().await.unwrap();
    publisher
        .emit_batch(
            &tx,
            vec![
                NewEvent::durable("order.created", "org-1", json!({})),
                NewEvent::durable("order.paid", "org-2", json!({})),
                NewEvent::durable("user.created", "org-1", json!({})),
            ],
        )
        .await
        .unwrap();
    publisher
        .emit(&tx, NewEvent::durable("order.shipped", "org-1", json!({})))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let sent = notifications.drain(&db).await;
    let due: Vec<&String> = sent.iter().filter(|p| p.contains(r#""due""#)).collect();
    let queued = eventrelay::wire::DELIVERIES_QUEUED.to_owned();
    assert_eq!(due, [&queued, &queued], "one per statement: {sent:?}");

    // No setting a session can change keeps them from going out.
    client
        .execute(
            "SELECT set_config('eventrelay.due_sent', $1, false)",
            &[&db.schema.as_str()],
        )
        .await
        .unwrap();
    publisher
        .emit(
            &client,
            NewEvent::durable("order.refunded", "org-1", json!({})),
        )
        .await
        .unwrap();
    let sent = notifications.drain(&db).await;
    assert!(sent.contains(&queued), "{sent:?}");

    // Nothing queued: pointers only.
    db.emit(NewEvent::durable("user.deleted", "org-1", json!({})))
        .await;
    let sent = notifications.drain(&db).await;
    assert!(!sent.is_empty(), "the pointer still goes out");
    assert!(sent.iter().all(|p| !p.contains(r#""due""#)), "{sent:?}");

    // Rolled back: neither the deliveries nor their announcement.
    let tx = client.transaction().await.unwrap();
    publisher
        .emit(
            &tx,
            NewEvent::durable("order.cancelled", "org-1", json!({})),
        )
        .await
        .unwrap();
    drop(tx);
    assert_eq!(notifications.drain(&db).await, Vec::<String>::new());
}

#[tokio::test]
async fn events_without_deliveries_do_not_wake_the_webhook_workers() {
    let db = TestDb::new().await;
    let receiver = Receiver::start([]);
    let server = TestServer::start(&db, webhooks(&receiver.url, &[50]));
    server.ready().await;
    let woken = "eventrelay_actor_handling_seconds_count{actor=\"dispatcher\"}";
    let before = server.metric(woken).await;
    for n in 0..20 {
        db.emit(NewEvent::durable("user.created", "org-1", json!({"n": n})))
            .await;
    }
    let order = db
        .emit(NewEvent::durable("order.created", "org-1", json!({})))
        .await;
    // Commits reach the relay in order, so once the last one is delivered
    // the twenty before it have been through the relay too.
    let request = receiver.wait_for(1).await.remove(0);
    assert_eq!(request.headers["webhook-id"], order.id.to_string());
    let wakeups = server.metric(woken).await - before;
    assert!(
        (1.0..=3.0).contains(&wakeups),
        "{wakeups} wake-ups for one transaction with deliveries among 21"
    );
}
