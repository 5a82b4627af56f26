//! What an operator does when a receiver has trouble, through the admin
//! API against a running dispatcher and a real local receiver: read a
//! subscription's health, hold its deliveries back and let them go, read
//! what the receiver answered, and send again what failed since a time.

use chrono::{DateTime, Utc};
use reqwest::Method;
use serde_json::{Value, json};

use crate::support::receiver::{Receiver, Reply};
use crate::support::server::TestServer;
use crate::support::{TestDb, eventually};
use eventrelay::config::Config;
use eventrelay::publisher::NewEvent;
use eventrelay::webhooks::NewSubscription;

const ADMIN_TOKEN: &str = "admin-token-for-webhook-operations";
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// A relay whose configuration subscribes each `(id, path)` to the
/// receiver's `path`, retrying failures once after 50 ms.
fn relay(db: &TestDb, receiver: &Receiver, subscriptions: &[(&str, &str)]) -> TestServer {
    let subscriptions: Vec<NewSubscription> = subscriptions
        .iter()
        .map(|(id, path)| NewSubscription {
            id: (*id).into(),
            url: format!("{}/{path}", receiver.url),
            secret: SECRET.into(),
            types: vec!["order.*".into()],
            scope_key: None,
            max_per_second: None,
            ordering: Default::default(),
            ordering_max_block_secs: None,
        })
        .collect();
    TestServer::start(db, move |config: &mut Config| {
        config.admin.token = Some(ADMIN_TOKEN.into());
        config.webhooks.allow_private_networks = true;
        config.webhooks.retry_schedule_ms = vec![50];
        config.webhooks.subscriptions = subscriptions;
    })
}

async fn admin(server: &TestServer, method: Method, path: &str, body: Option<Value>) -> Value {
    let (status, answer) = server.admin(ADMIN_TOKEN, method, path, body).await;
    assert!((200..300).contains(&status), "{path}: {status} {answer}");
    answer
}

/// The subscription `id` as the listing with health shows it.
async fn subscription(server: &TestServer, id: &str) -> Value {
    let listing = admin(
        server,
        Method::GET,
        "/v1/admin/subscriptions?health=true",
        None,
    )
    .await;
    listing["subscriptions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == id)
        .cloned()
        .unwrap_or_else(|| panic!("no subscription {id}: {listing}"))
}

/// The deliveries of `subscription`, newest first.
async fn deliveries(server: &TestServer, subscription: &str) -> Vec<Value> {
    let path = format!("/v1/admin/deliveries?subscriptionId={subscription}");
    let answer = admin(server, Method::GET, &path, None).await;
    answer["deliveries"].as_array().unwrap().clone()
}

/// Waits until `subscription`'s newest delivery has `status`.
async fn newest_becomes(server: &TestServer, subscription: &str, status: &str) -> Value {
    eventually(
        &format!("{subscription}'s delivery is {status}"),
        async || {
            let newest = deliveries(server, subscription).await.first().cloned()?;
            (newest["status"] == status).then_some(newest)
        },
    )
    .await
}

fn paths(receiver: &Receiver) -> Vec<String> {
    receiver.received().into_iter().map(|r| r.path).collect()
}

#[tokio::test]
async fn a_paused_subscription_queues_its_deliveries_and_sends_them_when_resumed() {
    let db = TestDb::new().await;
    let receiver = Receiver::start([]);
    let server = relay(&db, &receiver, &[("held", "held"), ("flowing", "flowing")]);
    server.ready().await;

    // Subscriptions from the configuration can be paused: a pause is an
    // operator's state, not configuration.
    let paused = admin(
        &server,
        Method::POST,
        "/v1/admin/subscriptions/held/pause",
        None,
    )
    .await;
    let paused_at = paused["subscription"]["pausedAt"].as_str().unwrap();
    assert_eq!(paused["subscription"]["source"], "config");
    let again = admin(
        &server,
        Method::POST,
        "/v1/admin/subscriptions/held/pause",
        None,
    )
    .await;
    assert_eq!(
        again["subscription"]["pausedAt"], paused_at,
        "pausing again keeps the first pause's time"
    );

    db.emit(NewEvent::durable("order.created", "org-1", json!({})))
        .await;
    // The dispatcher takes the most overdue delivery first, and both were
    // queued together: once the other subscription's is delivered, the
    // paused one's would have been sent too.
    newest_becomes(&server, "flowing", "delivered").await;
    let held = newest_becomes(&server, "held", "pending").await;
    assert_eq!(held["attempts"], 0, "{held}");
    assert_eq!(paths(&receiver), ["/hook/flowing"]);
    let health = &subscription(&server, "held").await["health"];
    assert_eq!(health["pending"], 1, "{health}");
    assert!(health["oldestDueAt"].is_string(), "{health}");

    let resumed = admin(
        &server,
        Method::POST,
        "/v1/admin/subscriptions/held/resume",
        None,
    )
    .await;
    assert_eq!(resumed["subscription"]["pausedAt"], Value::Null);
    newest_becomes(&server, "held", "delivered").await;
    assert_eq!(paths(&receiver), ["/hook/flowing", "/hook/held"]);
    let health = &subscription(&server, "held").await["health"];
    assert_eq!(health["pending"], 0, "{health}");
    assert_eq!(health["oldestDueAt"], Value::Null, "{health}");

    let (status, answer) = server
        .admin(
            ADMIN_TOKEN,
            Method::POST,
            "/v1/admin/subscriptions/nobody/pause",
            None,
        )
        .await;
    assert_eq!(
        (status, &answer["error"]["code"]),
        (404, &json!("not_found"))
    );
}

#[tokio::test]
async fn health_counts_the_last_hours_failures_and_the_last_success() {
    let db = TestDb::new().await;
    let receiver = Receiver::start([Reply::Status(500), Reply::Status(503)]);
    let server = relay(&db, &receiver, &[("hook", "hook")]);
    server.ready().await;
    let before = Utc::now();

    db.emit(NewEvent::durable("order.created", "org-1", json!({})))
        .await;
    newest_becomes(&server, "hook", "dead").await;
    let health = &subscription(&server, "hook").await["health"];
    assert_eq!(health["failuresLastHour"], 2, "{health}");
    assert_eq!(health["lastSuccessAt"], Value::Null, "{health}");

    db.emit(NewEvent::durable("order.paid", "org-1", json!({})))
        .await;
    newest_becomes(&server, "hook", "delivered").await;
    let health = &subscription(&server, "hook").await["health"];
    assert_eq!(health["failuresLastHour"], 2, "{health}");
    let last_success: DateTime<Utc> = health["lastSuccessAt"].as_str().unwrap().parse().unwrap();
    assert!(last_success > before, "{health}");
    assert_eq!(health["pending"], 0, "{health}");

    let plain = admin(&server, Method::GET, "/v1/admin/subscriptions", None).await;
    assert!(
        plain["subscriptions"][0].get("health").is_none(),
        "health only on request: {plain}"
    );
}

#[tokio::test]
async fn failed_deliveries_since_a_time_are_sent_again_and_the_receivers_answer_is_kept() {
    let db = TestDb::new().await;
    // A body longer than what is kept, cut in the middle of a character,
    // then a short one.
    let long = format!("a{}", "é".repeat(1_000));
    let receiver = Receiver::start([
        Reply::WithBody(500, long.clone()),
        Reply::WithBody(502, "receiver down: disk full".into()),
    ]);
    let server = relay(&db, &receiver, &[("hook", "hook")]);
    server.ready().await;

    db.emit(NewEvent::durable("order.created", "org-1", json!({})))
        .await;
    let dead = newest_becomes(&server, "hook", "dead").await;
    let id = dead["id"].as_i64().unwrap();
    let detail = admin(
        &server,
        Method::GET,
        &format!("/v1/admin/deliveries/{id}"),
        None,
    )
    .await;
    let answers: Vec<&str> = detail["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["response"].as_str().unwrap())
        .collect();
    assert_eq!(
        answers,
        [&long[..1023], "receiver down: disk full"],
        "1 KiB at most, cut back to whole characters"
    );

    let created: DateTime<Utc> = dead["createdAt"].as_str().unwrap().parse().unwrap();
    let since = |at: DateTime<Utc>| json!({ "since": at.to_rfc3339() });
    let path = "/v1/admin/subscriptions/hook/redeliver-failed";
    let later = admin(
        &server,
        Method::POST,
        path,
        Some(since(created + chrono::Duration::seconds(1))),
    )
    .await;
    assert_eq!(later["redelivered"], 0, "created before that time");
    let sent = admin(&server, Method::POST, path, Some(since(created))).await;
    assert_eq!(sent["redelivered"], 1);
    let delivered = newest_becomes(&server, "hook", "delivered").await;
    assert_eq!(delivered["id"], id);
    assert_eq!(receiver.received().len(), 3);
    let again = admin(&server, Method::POST, path, Some(since(created))).await;
    assert_eq!(again["redelivered"], 0, "only what failed");

    for (path, body, status, code) in [
        (path, json!({"since": "yesterday"}), 400, "invalid_body"),
        (path, json!({}), 400, "invalid_body"),
        (
            "/v1/admin/subscriptions/nobody/redeliver-failed",
            json!({"since": "2026-01-01T00:00:00Z"}),
            404,
            "not_found",
        ),
    ] {
        let (got, answer) = server
            .admin(ADMIN_TOKEN, Method::POST, path, Some(body.clone()))
            .await;
        assert_eq!(
            (got, &answer["error"]["code"]),
            (status, &json!(code)),
            "{body}: {answer}"
        );
    }
    let (_, answer) = server
        .admin(
            ADMIN_TOKEN,
            Method::POST,
            path,
            Some(json!({"since": "yesterday"})),
        )
        .await;
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("since: "),
        "the field is named: {message}"
    );
}

#[tokio::test]
async fn the_janitor_prunes_finished_deliveries_past_their_retention_and_keeps_the_rest() {
    let db = TestDb::new().await;
    let receiver = Receiver::start([]);
    let subscriptions = vec![NewSubscription {
        id: "kept-short".into(),
        url: format!("{}/kept-short", receiver.url),
        secret: SECRET.into(),
        types: vec!["order.*".into()],
        scope_key: None,
        max_per_second: None,
        ordering: Default::default(),
        ordering_max_block_secs: None,
    }];
    let server = TestServer::start(&db, move |config: &mut Config| {
        config.admin.token = Some(ADMIN_TOKEN.into());
        config.webhooks.allow_private_networks = true;
        config.webhooks.subscriptions = subscriptions;
        config.webhooks.retention_secs = 3_600;
        config.webhooks.dead_retention_secs = 7_200;
        config.outbox.prune_interval_secs = 1;
    });
    server.ready().await;
    for n in 0..6 {
        db.emit(NewEvent::durable("order.created", "org-1", json!({"n": n})))
            .await;
    }
    eventually("six deliveries delivered", async || {
        let all = deliveries(&server, "kept-short").await;
        (all.len() == 6 && all.iter().all(|d| d["status"] == "delivered")).then_some(())
    })
    .await;

    // The clock cannot be moved, so the rows are aged instead: (status,
    // finished this long ago, whether it outlived its retention).
    let ages = [
        ("delivered", "2 hours", true),
        ("delivered", "30 minutes", false),
        ("gone", "2 hours", true),
        ("dead", "90 minutes", false),
        ("dead", "3 hours", true),
        ("pending", "10 hours", false),
    ];
    let client = db.connect().await;
    let ids: Vec<i64> = db
        .column("SELECT id FROM {schema}.webhook_deliveries ORDER BY event_seq")
        .await;
    for (id, (status, age, _)) in ids.iter().zip(ages) {
        client
            .execute(
                &format!(
                    "UPDATE {}.webhook_deliveries
                     SET status = $2, updated_at = now() - $3::text::interval,
                         next_attempt_at = now() + interval '1 day'
                     WHERE id = $1",
                    db.schema
                ),
                &[id, &status, &age],
            )
            .await
            .unwrap();
    }
    server
        .wait_for_metric("eventrelay_webhook_deliveries_pruned_total", |n| n >= 3.0)
        .await;

    let kept: Vec<(i64, i64)> = client
        .query(
            &format!(
                "SELECT d.id, (SELECT count(*) FROM {schema}.webhook_attempts a
                               WHERE a.delivery_id = d.id)
                 FROM {schema}.webhook_deliveries d ORDER BY d.event_seq",
                schema = db.schema
            ),
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    let expected: Vec<i64> = ids
        .iter()
        .zip(ages)
        .filter(|(_, (_, _, outlived))| !outlived)
        .map(|(id, _)| *id)
        .collect();
    assert_eq!(
        kept.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
        expected,
        "pending deliveries, and finished ones within their retention, stay"
    );
    assert!(
        kept.iter().all(|(_, attempts)| *attempts == 1),
        "the kept keep their attempts: {kept:?}"
    );
    let orphans: i64 = client
        .query_one(
            &format!(
                "SELECT count(*) FROM {schema}.webhook_attempts a
                 WHERE NOT EXISTS (SELECT 1 FROM {schema}.webhook_deliveries d
                                   WHERE d.id = a.delivery_id)",
                schema = db.schema
            ),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(orphans, 0, "the pruned went with their attempts");
    assert_eq!(
        server
            .metric("eventrelay_webhook_deliveries_pruned_total")
            .await,
        3.0
    );
}

/// Two relays on `db` with `configure`'s settings, once both are ready.
async fn two_relays(db: &TestDb, configure: impl Fn(&mut Config) + Clone) -> [TestServer; 2] {
    let relays = [
        TestServer::start(db, configure.clone()),
        TestServer::start(db, configure),
    ];
    for relay in &relays {
        relay.ready().await;
    }
    relays
}

/// `count` `order.created` events emitted by one SQL statement, in one
/// transaction; `scope` is an SQL expression of `n`, the event's number.
async fn emit_in_one_statement(db: &TestDb, scope: &str, count: i64) {
    db.connect()
        .await
        .execute(
            &format!(
                "SELECT {}.emit('order.created', {scope}, jsonb_build_object('n', n))
                 FROM generate_series(1, {count}) n",
                db.schema
            ),
            &[],
        )
        .await
        .unwrap();
}

/// Two relays, each with its workers, share one subscription's pace: no
/// second of arrivals holds more than the rate and the few claims that can
/// race for one slot, and the backlog is worked through at that rate.
#[tokio::test]
async fn two_relays_keep_a_subscription_to_its_pace() {
    const RATE: usize = 10;
    const EVENTS: usize = 40;
    let db = TestDb::new().await;
    let receiver = Receiver::start([]);
    let url = format!("{}/paced", receiver.url);
    let configure = |config: &mut Config| {
        config.webhooks.allow_private_networks = true;
        config.webhooks.workers = 4;
        config.webhooks.subscriptions = vec![NewSubscription {
            id: "paced".into(),
            url: url.clone(),
            secret: SECRET.into(),
            types: vec!["order.*".into()],
            scope_key: None,
            max_per_second: Some(RATE as i32),
            ordering: Default::default(),
            ordering_max_block_secs: None,
        }];
    };
    let _relays = two_relays(&db, configure).await;
    emit_in_one_statement(&db, "'org-1'", EVENTS as i64).await;
    let received = receiver.wait_for(EVENTS).await;
    assert_eq!(received.len(), EVENTS, "each delivered once");
    let times: Vec<std::time::Instant> = received.iter().map(|r| r.at).collect();
    // At most one claim per worker of both relays can race for a slot.
    let burst = 2 * 4;
    let busiest = times
        .iter()
        .map(|&from| {
            times
                .iter()
                .filter(|&&t| t >= from && t < from + std::time::Duration::from_secs(1))
                .count()
        })
        .max()
        .unwrap();
    assert!(
        busiest <= RATE + burst,
        "{busiest} attempts in one second at a pace of {RATE} a second"
    );
    let took = *times.iter().max().unwrap() - *times.iter().min().unwrap();
    let least = std::time::Duration::from_secs_f64((EVENTS - burst) as f64 / RATE as f64 * 0.9);
    assert!(
        took >= least,
        "{EVENTS} attempts in {took:?}: faster than {RATE} a second"
    );
}

#[tokio::test]
async fn a_rate_limit_is_set_changed_and_lifted_and_a_bad_one_refused_by_name() {
    let db = TestDb::new().await;
    let receiver = Receiver::start([]);
    let server = relay(&db, &receiver, &[]);
    server.ready().await;
    for (field, bad) in [
        ("ordering", json!("random")),
        ("orderingMaxBlockSecs", json!(0)),
    ] {
        let mut body = json!({"id": "hook", "url": "https://hooks.example.com/in"});
        body[field] = bad.clone();
        let (status, answer) = server
            .admin(
                ADMIN_TOKEN,
                Method::POST,
                "/v1/admin/subscriptions",
                Some(body),
            )
            .await;
        assert_eq!(status, 400, "{field} {bad}: {answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(field) || message.contains("random"),
            "{message}"
        );
    }
    for bad in [json!(0), json!(-5), json!(100_001)] {
        let (status, answer) = server
            .admin(
                ADMIN_TOKEN,
                Method::POST,
                "/v1/admin/subscriptions",
                Some(json!({"id": "hook", "url": "https://hooks.example.com/in", "maxPerSecond": bad})),
            )
            .await;
        assert_eq!(status, 400, "{bad}: {answer}");
        assert!(
            answer["error"]["message"]
                .as_str()
                .unwrap()
                .contains("maxPerSecond"),
            "{answer}"
        );
    }
    let created = admin(
        &server,
        Method::POST,
        "/v1/admin/subscriptions",
        Some(json!({"id": "hook", "url": "https://hooks.example.com/in", "maxPerSecond": 50})),
    )
    .await;
    assert_eq!(created["subscription"]["maxPerSecond"], 50);
    let changed = admin(
        &server,
        Method::PATCH,
        "/v1/admin/subscriptions/hook",
        Some(json!({"maxPerSecond": 5})),
    )
    .await;
    assert_eq!(changed["subscription"]["maxPerSecond"], 5);
    let (status, _) = server
        .admin(
            ADMIN_TOKEN,
            Method::PATCH,
            "/v1/admin/subscriptions/hook",
            Some(json!({"maxPerSecond": -1})),
        )
        .await;
    assert_eq!(status, 400);
    let lifted = admin(
        &server,
        Method::PATCH,
        "/v1/admin/subscriptions/hook",
        Some(json!({"maxPerSecond": null})),
    )
    .await;
    assert_eq!(lifted["subscription"]["maxPerSecond"], Value::Null);
}

#[tokio::test]
async fn a_subscription_whose_receiver_keeps_failing_pauses_itself_and_the_app_hears_of_it() {
    let db = TestDb::new().await;
    let failing = Receiver::start(std::iter::repeat_n(Reply::Status(500), 1_000));
    let watching = Receiver::start([]);
    let subscriptions = vec![
        NewSubscription {
            id: "failing".into(),
            url: format!("{}/failing", failing.url),
            secret: SECRET.into(),
            types: vec!["order.*".into()],
            scope_key: None,
            max_per_second: None,
            ordering: Default::default(),
            ordering_max_block_secs: None,
        },
        // The app's own receiver of what the relay says about itself.
        NewSubscription {
            id: "watching".into(),
            url: format!("{}/watching", watching.url),
            secret: SECRET.into(),
            types: vec!["*".into()],
            scope_key: Some("ops".into()),
            max_per_second: None,
            ordering: Default::default(),
            ordering_max_block_secs: None,
        },
    ];
    let server = TestServer::start(&db, move |config: &mut Config| {
        config.admin.token = Some(ADMIN_TOKEN.into());
        config.webhooks.allow_private_networks = true;
        config.webhooks.retry_schedule_ms = vec![50; 40];
        config.webhooks.disable_after_secs = 1;
        config.webhooks.disable_after_attempts = 4;
        config.webhooks.events_scope = Some("ops".into());
        config.webhooks.subscriptions = subscriptions;
    });
    server.ready().await;
    let (mut ops, _) = server
        .subscribe(
            &crate::support::server::token("operator", "ops", json!({})),
            None,
            "",
        )
        .await;
    db.emit(NewEvent::durable("order.created", "org-1", json!({})))
        .await;

    let paused = eventually("the failing subscription pauses itself", async || {
        let failing = subscription(&server, "failing").await;
        (failing["pausedReason"] == "failing").then_some(failing)
    })
    .await;
    assert!(paused["pausedAt"].is_string(), "{paused}");
    let told = ops.next_event().await;
    assert_eq!(
        told.event.as_deref(),
        Some("eventrelay.subscription.paused")
    );
    let data = &told.json()["data"];
    assert_eq!(data["subscriptionId"], "failing", "{data}");
    assert_eq!(data["reason"], "failing", "{data}");
    assert!(data["failures"].as_i64().unwrap() >= 4, "{data}");
    let heard = watching.wait_for(1).await;
    assert_eq!(heard[0].path, "/hook/watching");
    let body: Value = serde_json::from_slice(&heard[0].body).unwrap();
    assert_eq!(body["type"], "eventrelay.subscription.paused", "{body}");
    assert_eq!(
        server
            .metric("eventrelay_webhook_subscriptions_paused_total")
            .await,
        1.0
    );
    // Paused, its receiver is left alone.
    let attempts_then = paths(&failing).len();
    let pending = newest_becomes(&server, "failing", "pending").await;
    assert_eq!(paths(&failing).len(), attempts_then, "{pending}");

    let resumed = admin(
        &server,
        Method::POST,
        "/v1/admin/subscriptions/failing/resume",
        None,
    )
    .await;
    assert_eq!(resumed["subscription"]["pausedReason"], Value::Null);
    assert_eq!(resumed["subscription"]["pausedAt"], Value::Null);
}

/// A subscription ordered by scope on `receiver`'s `path`, from the
/// configuration of every relay `configure` starts.
fn ordered(
    receiver: &Receiver,
    path: &str,
    max_block: Option<i32>,
) -> impl Fn(&mut Config) + Clone {
    let subscription = NewSubscription {
        id: "ordered".into(),
        url: format!("{}/{path}", receiver.url),
        secret: SECRET.into(),
        types: vec!["order.*".into()],
        scope_key: None,
        max_per_second: None,
        ordering: eventrelay::webhooks::DeliveryOrder::Scope,
        ordering_max_block_secs: max_block,
    };
    move |config: &mut Config| {
        config.admin.token = Some(ADMIN_TOKEN.into());
        config.webhooks.allow_private_networks = true;
        config.webhooks.workers = 4;
        config.webhooks.retry_schedule_ms = vec![30; 40];
        config.webhooks.subscriptions = vec![subscription.clone()];
    }
}

/// Each key goes in seq order over two relays, one delivery at a time,
/// to a receiver that fails at random for a while; every event arrives.
#[tokio::test]
async fn an_ordered_subscription_sends_each_key_in_seq_order_over_two_relays() {
    const KEYS: i64 = 5;
    const PER_KEY: i64 = 12;
    let db = TestDb::new().await;
    // About a third of the first 80 answers fail, in a fixed pseudo-random
    // pattern.
    let mut state = 0x2545_f491_u32;
    let replies = (0..80).map(|_| {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        Reply::Status(if state.is_multiple_of(3) { 500 } else { 200 })
    });
    let receiver = Receiver::start(replies.collect::<Vec<_>>());
    let configure = ordered(&receiver, "ordered", None);
    let _relays = two_relays(&db, configure).await;
    // Interleaved across the keys, in one transaction and in many.
    emit_in_one_statement(&db, &format!("'org-' || (n % {KEYS})"), KEYS * PER_KEY / 2).await;
    for n in 0..KEYS * PER_KEY / 2 {
        db.emit(NewEvent::durable(
            "order.created",
            format!("org-{}", n % KEYS),
            json!({"n": n}),
        ))
        .await;
    }
    let total = usize::try_from(KEYS * PER_KEY).unwrap();
    let delivered = eventually("every event delivered", async || {
        let ok: Vec<_> = receiver
            .received()
            .into_iter()
            .filter(|r| r.status == 200)
            .collect();
        (ok.len() >= total).then_some(ok)
    })
    .await;
    let mut by_key: std::collections::BTreeMap<String, Vec<i64>> = Default::default();
    let mut arrivals = delivered.clone();
    arrivals.sort_by_key(|r| r.at);
    for received in &arrivals {
        let body: Value = serde_json::from_slice(&received.body).unwrap();
        let key = body["scopeKey"].as_str().unwrap().to_owned();
        by_key
            .entry(key)
            .or_default()
            .push(body["seq"].as_i64().unwrap());
    }
    assert_eq!(by_key.len(), usize::try_from(KEYS).unwrap());
    for (key, seqs) in &by_key {
        assert_eq!(
            seqs.len(),
            usize::try_from(PER_KEY).unwrap(),
            "{key}: {seqs:?}"
        );
        assert!(
            seqs.windows(2).all(|pair| pair[0] < pair[1]),
            "{key} was delivered out of seq order: {seqs:?}"
        );
    }
    assert!(
        receiver.received().iter().any(|r| r.status == 500),
        "the receiver failed along the way"
    );
}

#[tokio::test]
async fn a_key_held_back_too_long_moves_on_and_the_skip_is_recorded() {
    let db = TestDb::new().await;
    let receiver = Receiver::start(std::iter::repeat_n(Reply::Status(500), 1_000));
    let server = TestServer::start(&db, ordered(&receiver, "held", Some(1)));
    server.ready().await;
    for n in 0..2 {
        db.emit(NewEvent::durable("order.created", "org-1", json!({"n": n})))
            .await;
    }
    let skipped = eventually(
        "the second delivery goes past the failing head",
        async || {
            let all = deliveries(&server, "ordered").await;
            let second = all.first()?.clone();
            (all.len() == 2 && second["attempts"].as_i64()? >= 1).then_some(second)
        },
    )
    .await;
    assert_eq!(skipped["orderSkipped"], true, "{skipped}");
    assert!(server.metric("eventrelay_webhook_order_skips_total").await >= 1.0);
    // Not before the head had been pending its second.
    let head = deliveries(&server, "ordered").await[1].clone();
    let path = format!("/v1/admin/deliveries/{}", skipped["id"]);
    let attempts = admin(&server, Method::GET, &path, None).await["attempts"].clone();
    let time = |value: &Value| value.as_str().unwrap().parse::<DateTime<Utc>>().unwrap();
    let waited = time(&attempts[0]["startedAt"]) - time(&head["createdAt"]);
    assert!(
        waited >= chrono::Duration::milliseconds(950),
        "the key moved on after {waited}: {head} {attempts}"
    );
}
