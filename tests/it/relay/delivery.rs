//! The relay end to end: a real Postgres, the real server on port 0, and a
//! real SSE reader over TCP.

use std::collections::HashSet;
use std::time::Duration;

use crate::support::server::{Frame, TestServer, token, token_for};
use crate::support::{DEADLINE, TestDb, eventually, test_in_both_wakeup_modes};
use eventrelay::publisher::{Audience, NewEvent};
use eventrelay::store::WakeupMode;
use serde_json::{Value, json};

fn durable(event_type: &str, scope: &str) -> NewEvent {
    NewEvent::durable(event_type, scope, json!({}))
}

fn ids(frames: &[Frame]) -> Vec<String> {
    frames
        .iter()
        .map(|f| f.json()["id"].as_str().unwrap().to_owned())
        .collect()
}

test_in_both_wakeup_modes!(a_commit_reaches_the_subscriber_and_a_rollback_never_does);

async fn a_commit_reaches_the_subscriber_and_a_rollback_never_does(mode: WakeupMode) {
    let (db, _cluster) = TestDb::for_mode(mode).await;
    let server = TestServer::start(&db, |_| {});
    server.ready().await;
    let (mut stream, resync) = server
        .subscribe(&token("alice", "org-1", json!({})), None, "")
        .await;
    assert!(resync, "a first connection must resync");

    let mut client = db.connect().await;
    let tx = client.transaction().await.unwrap();
    db.publisher()
        .emit(&tx, durable("order.rolled_back", "org-1"))
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    let committed = db.emit(durable("order.created", "org-1")).await;

    let frame = stream.next_event().await;
    assert_eq!(frame.event.as_deref(), Some("order.created"));
    assert_eq!(frame.seq(), committed.seq);
    assert_eq!(frame.json()["id"], committed.id.to_string());
}

#[tokio::test]
async fn the_stream_has_the_documented_framing_and_headers() {
    let db = TestDb::new().await;
    let server = TestServer::start(&db, |c| c.sse.heartbeat_secs = 1);
    server.ready().await;
    let response = reqwest::Client::new()
        .get(server.url("/v1/events"))
        .bearer_auth(token("alice", "org-1", json!({})))
        .send()
        .await
        .unwrap();
    let headers = response.headers().clone();
    assert_eq!(headers["content-type"], "text/event-stream");
    assert_eq!(headers["cache-control"], "no-store");
    assert_eq!(headers["x-accel-buffering"], "no");
    drop(response);

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
    db.emit(NewEvent::ephemeral("tick", "org-1", json!({"n": 1})))
        .await;
    let tick = stream.next_event().await;
    assert_eq!(tick.id, None, "ephemeral frames carry no id");
    assert_eq!(tick.json()["lane"], "ephemeral");
    let heartbeat = loop {
        let frame = stream.next_frame().await.unwrap();
        if frame.comment.is_some() {
            break frame;
        }
    };
    assert_eq!(heartbeat.comment.as_deref(), Some("hb"));
}

test_in_both_wakeup_modes!(audience_by_users_and_permission_fails_closed);

async fn audience_by_users_and_permission_fails_closed(mode: WakeupMode) {
    let (db, _cluster) = TestDb::for_mode(mode).await;
    let server = TestServer::start(&db, |_| {});
    server.ready().await;
    let (mut alice, _) = server
        .subscribe(
            &token("alice", "org-1", json!({"orders": ["read"]})),
            None,
            "",
        )
        .await;
    let (mut bob, _) = server
        .subscribe(&token("bob", "org-1", json!({})), None, "")
        .await;
    let (mut carol, _) = server
        .subscribe(
            &token("carol", "org-1", json!({"orders": ["write"]})),
            None,
            "",
        )
        .await;
    let (mut other_scope, _) = server
        .subscribe(
            &token("alice", "org-2", json!({"orders": ["read"]})),
            None,
            "",
        )
        .await;

    db.emit(durable("for.alice", "org-1").with_audience(Audience::users(["alice"])))
        .await;
    db.emit(
        durable("needs.orders.read", "org-1")
            .with_audience(Audience::permission(json!({"orders": ["read"]}))),
    )
    .await;
    db.emit(durable("strange.permission", "org-1").with_audience(Audience::permission(json!(42))))
        .await;
    db.emit(durable("everyone", "org-1")).await;
    db.emit(durable("everyone", "org-2")).await;

    let types = |frames: Vec<Frame>| -> Vec<String> {
        frames.into_iter().map(|f| f.event.unwrap()).collect()
    };
    assert_eq!(
        types(alice.events(3).await),
        ["for.alice", "needs.orders.read", "everyone"]
    );
    assert_eq!(types(bob.events(1).await), ["everyone"]);
    assert_eq!(types(carol.events(1).await), ["everyone"]);
    let frame = other_scope.next_event().await;
    assert_eq!(frame.event.as_deref(), Some("everyone"));
    assert_eq!(frame.json()["scopeKey"], "org-2");
    assert!(server.metric("eventrelay_events_filtered_total").await >= 5.0);
}

#[tokio::test]
async fn refusals_are_401_429_and_400_with_stable_codes() {
    let db = TestDb::new().await;
    let server = TestServer::start(&db, |c| {
        c.sse.max_connections_per_subscriber = 2;
        // A closed client is noticed at the next write.
        c.sse.heartbeat_secs = 1;
    });
    server.ready().await;

    let (status, body) = server.connect(None, None, "").await.err().unwrap();
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (401, Some("unauthorized"))
    );
    let (status, _) = server
        .connect(Some("not.a.token"), None, "")
        .await
        .err()
        .unwrap();
    assert_eq!(status, 401);
    // A token that expires in a second is refused once it has.
    let expiring = token_for("alice", "org-1", json!({}), Duration::from_secs(1));
    // Anything else (a 429 while a dropped stream's place is given back)
    // is tried again.
    let refused = eventually("the token expires", async || {
        match server.connect(Some(&expiring), None, "").await {
            Err((401, body)) => Some(body),
            _ => None,
        }
    })
    .await;
    assert_eq!(refused["error"]["code"], "unauthorized");

    let alice = token("alice", "org-1", json!({}));
    let (status, body) = server
        .connect(Some(&alice), Some("12abc"), "")
        .await
        .err()
        .unwrap();
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("invalid_last_event_id"))
    );
    let (status, _) = server
        .connect(Some(&alice), None, "?lastEventId=-4")
        .await
        .err()
        .unwrap();
    assert_eq!(status, 400);

    let first = server.connect(Some(&alice), None, "").await.unwrap();
    let _second = server.connect(Some(&alice), None, "").await.unwrap();
    let (status, body) = server.connect(Some(&alice), None, "").await.err().unwrap();
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (429, Some("too_many_connections"))
    );
    let _bob = server
        .connect(Some(&token("bob", "org-1", json!({}))), None, "")
        .await
        .unwrap();
    drop(first);
    eventually("a closed stream frees its slot", async || {
        server.connect(Some(&alice), None, "").await.ok()
    })
    .await;
}

test_in_both_wakeup_modes!(replay_from_memory_and_from_the_outbox_agree);

async fn replay_from_memory_and_from_the_outbox_agree(mode: WakeupMode) {
    let (db, _cluster) = TestDb::for_mode(mode).await;
    let server = TestServer::start(&db, |c| {
        c.sse.replay_lookback = 0;
        // A closed client is noticed at the next write.
        c.sse.heartbeat_secs = 1;
    });
    server.ready().await;
    let alice = token("alice", "org-1", json!({"orders": ["read"]}));

    let (mut live, _) = server.subscribe(&alice, None, "").await;
    let mut emitted = Vec::new();
    for n in 0..12 {
        let mut event = NewEvent::durable("n", "org-1", json!({"n": n}));
        if n % 4 == 1 {
            event = event.with_audience(Audience::users(["bob"]));
        }
        emitted.push(db.emit(event).await);
        db.emit(durable("elsewhere", "org-2")).await;
    }
    let visible: Vec<String> = emitted
        .iter()
        .filter(|e| e.audience.is_none())
        .map(|e| e.id.to_string())
        .collect();
    assert_eq!(ids(&live.events(visible.len()).await), visible);

    let after = emitted[3].seq.unwrap().to_string();
    let expected: Vec<String> = emitted[4..]
        .iter()
        .filter(|e| e.audience.is_none())
        .map(|e| e.id.to_string())
        .collect();

    let (from_memory, resync) = server.subscribe(&alice, Some(&after), "").await;
    assert!(!resync);
    assert_eq!(ids(&from_memory.replayed), expected);
    assert_eq!(
        server
            .metric("eventrelay_replays_total{source=\"memory\"}")
            .await,
        1.0
    );
    drop(from_memory);
    drop(live);

    // With no stream open the scope's hub goes away, and its tail with it.
    server
        .wait_for_metric("eventrelay_active_scopes", |n| n == 0.0)
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

/// Streams resuming from one `Last-Event-ID` at once share the outbox reads
/// of their replay and their join; what each receives is still filtered for
/// its own subscriber.
#[tokio::test]
async fn streams_resuming_together_each_get_only_their_own_events() {
    let db = TestDb::new().await;
    let server = TestServer::start(&db, |c| {
        c.sse.replay_lookback = 0;
        c.sse.max_connections_per_subscriber = 10;
    });
    server.ready().await;
    let first = db.emit(durable("before", "org-1")).await;
    // Each event with the one user it is for, or none for everyone.
    let mut emitted = Vec::new();
    for n in 0..9 {
        let only = [Some("alice"), Some("bob"), None][n % 3];
        let mut event = NewEvent::durable("n", "org-1", json!({"n": n}));
        if let Some(user) = only {
            event = event.with_audience(Audience::users([user]));
        }
        emitted.push((only, db.emit(event).await.id.to_string()));
    }
    let after = first.seq.unwrap().to_string();
    let expected = |user: &str| -> Vec<String> {
        emitted
            .iter()
            .filter(|(only, _)| only.is_none_or(|only| only == user))
            .map(|(_, id)| id.clone())
            .collect()
    };
    let users = ["alice", "bob", "carol"];
    let streams = futures_util::future::join_all((0..30).map(|n| {
        let user = users[n % users.len()];
        let server = &server;
        let after = after.clone();
        async move {
            let (stream, resync) = server
                .subscribe(&token(user, "org-1", json!({})), Some(&after), "")
                .await;
            (user, stream, resync)
        }
    }))
    .await;
    for (user, stream, resync) in &streams {
        assert!(!resync, "{user}");
        assert_eq!(ids(&stream.replayed), expected(user), "{user}");
    }
    assert_eq!(expected("carol").len(), 3);
}

test_in_both_wakeup_modes!(replay_joins_live_without_gap_or_duplicate);

async fn replay_joins_live_without_gap_or_duplicate(mode: WakeupMode) {
    let (db, _cluster) = TestDb::for_mode(mode).await;
    let server = TestServer::start(&db, |c| c.sse.replay_lookback = 0);
    server.ready().await;
    let alice = token("alice", "org-1", json!({}));
    let first = db.emit(durable("a", "org-1")).await;
    for _ in 0..5 {
        db.emit(durable("b", "org-1")).await;
    }
    let (mut stream, _) = server
        .subscribe(&alice, Some(&first.seq.unwrap().to_string()), "")
        .await;
    let mut seen: Vec<String> = ids(&stream.replayed);
    for _ in 0..5 {
        db.emit(durable("c", "org-1")).await;
    }
    while seen.len() < 10 {
        seen.extend(ids(&[stream.next_event().await]));
    }
    let unique: HashSet<&String> = seen.iter().collect();
    assert_eq!(unique.len(), 10, "no duplicates: {seen:?}");
}

#[tokio::test]
async fn a_last_event_id_older_than_the_outbox_asks_for_a_resync() {
    let db = TestDb::new().await;
    let server = TestServer::start(&db, |_| {});
    server.ready().await;
    for _ in 0..3 {
        db.emit(durable("old", "org-1")).await;
    }
    let client = db.connect().await;
    client
        .execute(
            &format!("DELETE FROM {}.outbox WHERE seq < 3", db.schema),
            &[],
        )
        .await
        .unwrap();
    let alice = token("alice", "org-1", json!({}));
    let (_, resync) = server.subscribe(&alice, Some("1"), "").await;
    assert!(resync, "events after 1 were pruned");
    let (_, resync) = server.subscribe(&alice, Some("2"), "").await;
    assert!(!resync, "everything after 2 is still held");
}

test_in_both_wakeup_modes!(a_transaction_of_many_events_arrives_whole_from_one_wake_up);

async fn a_transaction_of_many_events_arrives_whole_from_one_wake_up(mode: WakeupMode) {
    let (db, _cluster) = TestDb::for_mode(mode).await;
    let server = TestServer::start(&db, |_| {});
    server.ready().await;
    let (mut stream, _) = server
        .subscribe(&token("alice", "org-1", json!({})), None, "")
        .await;
    let mut client = db.connect().await;
    let tx = client.transaction().await.unwrap();
    let mut expected = Vec::new();
    for _ in 0..25 {
        let envelope = db
            .publisher()
            .emit(&tx, durable("bulk", "org-1"))
            .await
            .unwrap();
        expected.push(envelope.id.to_string());
    }
    tx.commit().await.unwrap();
    assert_eq!(ids(&stream.events(25).await), expected);
}

test_in_both_wakeup_modes!(transactions_committing_out_of_seq_order_both_arrive);

async fn transactions_committing_out_of_seq_order_both_arrive(mode: WakeupMode) {
    let (db, _cluster) = TestDb::for_mode(mode).await;
    let server = TestServer::start(&db, |_| {});
    server.ready().await;
    let (mut stream, _) = server
        .subscribe(&token("alice", "org-1", json!({})), None, "")
        .await;
    let mut first = db.connect().await;
    let mut second = db.connect().await;
    let tx1 = first.transaction().await.unwrap();
    let low = db
        .publisher()
        .emit(&tx1, durable("low", "org-1"))
        .await
        .unwrap();
    let tx2 = second.transaction().await.unwrap();
    let high = db
        .publisher()
        .emit(&tx2, durable("high", "org-1"))
        .await
        .unwrap();
    assert!(low.seq < high.seq);
    tx2.commit().await.unwrap();
    assert_eq!(stream.next_event().await.event.as_deref(), Some("high"));
    tx1.commit().await.unwrap();
    assert_eq!(stream.next_event().await.event.as_deref(), Some("low"));
}

#[tokio::test]
async fn rows_that_travel_with_their_pointer_reach_subscribers_without_an_outbox_read() {
    let db = TestDb::new().await;
    let server = TestServer::start(&db, |_| {});
    server.ready().await;
    let (mut stream, _) = server
        .subscribe(&token("alice", "org-1", json!({})), None, "")
        .await;
    const READS: &str = "eventrelay_outbox_read_seconds_count";
    const MALFORMED: &str = "eventrelay_notifications_malformed_total";
    // The scope's one read, at activation (it finds what committed while
    // the scope was being activated).
    let reads = server.wait_for_metric(READS, |n| n >= 1.0).await;

    // One event, then three in one transaction.
    let mut emitted = vec![db.emit(durable("one", "org-1")).await.id.to_string()];
    let mut client = db.connect().await;
    let tx = client.transaction().await.unwrap();
    for n in 0..3 {
        let event = NewEvent::durable("many", "org-1", json!({"n": n}));
        emitted.push(
            db.publisher()
                .emit(&tx, event)
                .await
                .unwrap()
                .id
                .to_string(),
        );
    }
    tx.commit().await.unwrap();
    assert_eq!(ids(&stream.events(4).await), emitted);
    assert_eq!(
        server.metric(READS).await,
        reads,
        "rows that travel with their pointer are not read back"
    );

    // A row too large for a notification is read back.
    let big = NewEvent::durable("big", "org-1", json!({"pad": "x".repeat(9_000)}));
    let big = db.emit(big).await;
    let frame = stream.next_event().await;
    assert_eq!(frame.json()["id"], big.id.to_string());
    assert_eq!(
        frame.json()["data"]["pad"].as_str().map(str::len),
        Some(9_000)
    );
    assert!(
        server.metric(READS).await > reads,
        "the big row was read back"
    );

    // A sound pointer whose rows are unreadable is counted, and its row is
    // read back rather than lost.
    let malformed = server.metric(MALFORMED).await;
    let toggle = |on: bool| {
        format!(
            "ALTER TABLE {}.outbox {} TRIGGER outbox_notify",
            db.schema,
            if on { "ENABLE" } else { "DISABLE" }
        )
    };
    // The row and its pointer go out at one commit, as the trigger would
    // send them: a horizon mark never falls between the two.
    let mut writer = db.connect().await;
    let tx = writer.transaction().await.unwrap();
    tx.batch_execute(&toggle(false)).await.unwrap();
    let unannounced = db.emit_in(&tx, durable("unannounced", "org-1")).await;
    tx.batch_execute(&toggle(true)).await.unwrap();
    let forged = format!(
        r#"{{"k":"ptr","s":"org-1","q":{},"x":1,"r":[{{"id":"not an event"}}]}}"#,
        unannounced.seq.unwrap()
    );
    tx.execute(
        &format!("SELECT pg_notify($1, {}.seal('P', $2))", db.schema),
        &[&db.channel.as_str(), &forged],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let frame = stream.next_event().await;
    assert_eq!(frame.json()["id"], unannounced.id.to_string());
    assert_eq!(server.metric(MALFORMED).await, malformed + 1.0);
}

test_in_both_wakeup_modes!(the_listener_losing_its_connection_loses_no_event);

async fn the_listener_losing_its_connection_loses_no_event(mode: WakeupMode) {
    let (db, _cluster) = TestDb::for_mode(mode).await;
    let listener_tag = format!("{}_listener", db.schema);
    let listen_url = db.url.replace(db.schema.as_str(), &listener_tag);
    let server = TestServer::start(&db, |c| c.database.listen_url = Some(listen_url.into()));
    server.ready().await;
    let (mut stream, _) = server
        .subscribe(&token("alice", "org-1", json!({})), None, "")
        .await;
    let control = db.connect().await;
    let mut expected = HashSet::new();
    for round in 0..30 {
        expected.insert(
            db.emit(NewEvent::durable("n", "org-1", json!({"n": round})))
                .await
                .id
                .to_string(),
        );
        if round % 10 == 5 {
            control
                .execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
                    &[&listener_tag],
                )
                .await
                .unwrap();
        }
    }
    let mut received = HashSet::new();
    while received.len() < expected.len() {
        let frame = stream.next_event().await;
        received.insert(frame.json()["id"].as_str().unwrap().to_owned());
    }
    assert_eq!(received, expected);
    let reconnects = match mode {
        WakeupMode::Notify => "eventrelay_listener_reconnects_total",
        WakeupMode::Logical => "eventrelay_replication_reconnects_total",
    };
    assert!(server.metric(reconnects).await >= 1.0);
}

test_in_both_wakeup_modes!(two_relays_on_one_database_both_deliver);

async fn two_relays_on_one_database_both_deliver(mode: WakeupMode) {
    let (db, _cluster) = TestDb::for_mode(mode).await;
    let one = TestServer::start(&db, |c| c.database.migrate = false);
    let two = TestServer::start(&db, |c| c.database.migrate = false);
    one.ready().await;
    two.ready().await;
    let alice = token("alice", "org-1", json!({}));
    let (mut a, _) = one.subscribe(&alice, None, "").await;
    let (mut b, _) = two.subscribe(&alice, None, "").await;
    let event = db.emit(durable("shared", "org-1")).await;
    for stream in [&mut a, &mut b] {
        assert_eq!(stream.next_event().await.json()["id"], event.id.to_string());
    }
}

#[tokio::test]
async fn until_ends_the_stream_right_after_the_matching_event() {
    let db = TestDb::new().await;
    let server = TestServer::start(&db, |_| {});
    server.ready().await;
    let (mut stream, _) = server
        .subscribe(&token("alice", "org-1", json!({})), None, "?until=job.done")
        .await;
    db.emit(durable("job.progress", "org-1")).await;
    db.emit(durable("job.done", "org-1")).await;
    db.emit(durable("job.after", "org-1")).await;
    assert_eq!(
        stream.next_event().await.event.as_deref(),
        Some("job.progress")
    );
    assert_eq!(stream.next_event().await.event.as_deref(), Some("job.done"));
    assert!(stream.ends().await);
}

#[tokio::test]
async fn the_age_cap_and_token_expiry_end_streams_cleanly() {
    let db = TestDb::new().await;
    let server = TestServer::start(&db, |c| c.sse.max_age_secs = 2);
    server.ready().await;
    let (mut aged, _) = server
        .subscribe(&token("alice", "org-1", json!({})), None, "")
        .await;
    let short = token_for("bob", "org-1", json!({}), Duration::from_secs(2));
    let (mut expiring, _) = TestServer::subscribe(&server, &short, None, "").await;
    assert!(aged.ends().await);
    assert!(expiring.ends().await);
}

#[tokio::test]
async fn a_subscriber_too_slow_for_its_queue_is_disconnected() {
    let db = TestDb::new().await;
    let server = TestServer::start(&db, |c| c.sse.queue_capacity = 64);
    server.ready().await;
    let (_never_reads, _) = server
        .subscribe(&token("slow", "org-1", json!({})), None, "")
        .await;
    let (mut reader, _) = server
        .subscribe(&token("fast", "org-1", json!({})), None, "")
        .await;
    server
        .flood_until_a_slow_subscriber_is_dropped(&db, "org-1", Some(&mut reader))
        .await;
    assert_eq!(
        server
            .metric("eventrelay_slow_subscribers_dropped_total")
            .await,
        1.0
    );
}

test_in_both_wakeup_modes!(the_publish_api_writes_durable_and_ephemeral_events);

async fn the_publish_api_writes_durable_and_ephemeral_events(mode: WakeupMode) {
    let (db, _cluster) = TestDb::for_mode(mode).await;
    let server = TestServer::start(&db, |_| {});
    server.ready().await;
    let (mut stream, _) = server
        .subscribe(&token("alice", "org-1", json!({})), None, "")
        .await;
    let (status, body) = server
        .publish(json!([
            {"type": "order.created", "scopeKey": "org-1", "lane": "durable", "data": {"orderId": 1}},
            {"type": "sync.progress", "scopeKey": "org-1", "lane": "ephemeral", "data": {"done": 1}}
        ]))
        .await;
    assert_eq!(status, 200, "{body}");
    assert!(body["events"][0]["seq"].as_i64().is_some());
    let frames = stream.events(2).await;
    let types: HashSet<String> = frames.into_iter().map(|f| f.event.unwrap()).collect();
    assert_eq!(
        types,
        HashSet::from(["order.created".to_owned(), "sync.progress".to_owned()])
    );
    assert_eq!(db.outbox_count().await, 1);

    let (status, body) = server
        .publish(json!({"type": "bad\ntype", "scopeKey": "org-1", "lane": "durable"}))
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("invalid_event"))
    );
    let unauthorized = reqwest::Client::new()
        .post(server.url("/v1/events"))
        .bearer_auth("wrong-token-wrong-token")
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(unauthorized.status(), 401);
    let (status, body) = server
        .publish(json!([
            {"type": "ok", "scopeKey": "org-1", "lane": "durable"},
            {"type": "big", "scopeKey": "org-1", "lane": "ephemeral", "data": {"pad": "x".repeat(9000)}}
        ]))
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (413, Some("event_too_large"))
    );
    assert_eq!(db.outbox_count().await, 1, "a refused batch writes nothing");
    let _: Value = body;
}

/// An embedding application's own resolver: `Authorization: Club <name>`,
/// with a permission closure no configuration could express.
struct ClubResolver;

impl eventrelay::auth::SubscriberResolver for ClubResolver {
    fn resolve<'a>(
        &'a self,
        credentials: &'a eventrelay::auth::Credentials,
    ) -> futures_util::future::BoxFuture<
        'a,
        Result<eventrelay::auth::ResolvedSubscriber, eventrelay::auth::AuthError>,
    > {
        Box::pin(async move {
            let name = credentials
                .authorization
                .as_deref()
                .and_then(|h| h.strip_prefix("Club "))
                .ok_or(eventrelay::auth::AuthError::MissingCredentials)?
                .to_owned();
            let member = name.starts_with("vip-");
            let subscriber = eventrelay::wire::Subscriber::new("club", name)
                .with_evaluator(move |permission: &Value| member && permission == "vip-room");
            Ok(eventrelay::auth::ResolvedSubscriber {
                subscriber,
                more_scopes: Vec::new(),
                expires_at: None,
                presence: Default::default(),
            })
        })
    }
}

#[tokio::test]
async fn an_embedding_application_supplies_its_own_resolver() {
    let db = TestDb::new().await;
    let server = TestServer::start_with(&db, |_| {}, Some(std::sync::Arc::new(ClubResolver)));
    server.ready().await;
    let (status, _) = server.connect(None, None, "").await.err().unwrap();
    assert_eq!(status, 401);
    let (mut vip, _) = server.subscribe_with_header("Club vip-ann").await;
    let (mut guest, _) = server.subscribe_with_header("Club bob").await;
    db.emit(durable("party", "club").with_audience(Audience::permission(json!("vip-room"))))
        .await;
    db.emit(durable("lobby", "club")).await;
    assert_eq!(vip.next_event().await.event.as_deref(), Some("party"));
    assert_eq!(vip.next_event().await.event.as_deref(), Some("lobby"));
    assert_eq!(guest.next_event().await.event.as_deref(), Some("lobby"));
}

#[tokio::test]
async fn malformed_notifications_are_dropped_counted_and_harmless() {
    let db = TestDb::new().await;
    let server = TestServer::start(&db, |_| {});
    server.ready().await;
    let (mut stream, _) = server
        .subscribe(&token("alice", "org-1", json!({})), None, "")
        .await;
    let garbage = [
        "not json",
        "{\"k\":\"ptr\",\"s\":\"org-1\"}",
        "{\"k\":\"evt\",\"e\":{\"type\":\"x\"}}",
        "{\"k\":\"zip\"}",
    ];
    // Sealed by the schema's own function (so only the owner or the
    // relay's role could have sent them): they open, and do not decode.
    for payload in garbage {
        db.notify_sealed(payload).await;
    }
    // Sent as they are, as any role could: they do not even open.
    for payload in garbage {
        db.notify_raw(payload).await;
    }
    let event = db.emit(durable("after.garbage", "org-1")).await;
    let frame = stream.next_event().await;
    assert_eq!(frame.json()["id"], event.id.to_string());
    assert_eq!(
        server
            .metric("eventrelay_notifications_malformed_total")
            .await,
        4.0
    );
    assert_eq!(
        server
            .metric("eventrelay_notifications_rejected_total{reason=\"not_sealed\"}")
            .await,
        4.0
    );
}

/// Terminates the relay's LISTEN connection and waits until it is back.
async fn cut_the_listener(db: &TestDb, server: &TestServer, tag: &str) {
    let before = server.metric("eventrelay_listener_reconnects_total").await;
    db.connect()
        .await
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
            &[&tag],
        )
        .await
        .unwrap();
    server
        .wait_for_metric("eventrelay_listener_reconnects_total", |n| n > before)
        .await;
}

#[tokio::test]
async fn no_history_after_a_listener_reconnect_yet_late_commits_arrive() {
    let db = TestDb::new().await;
    let listener_tag = format!("{}_listener", db.schema);
    let listen_url = db.url.replace(db.schema.as_str(), &listener_tag);
    let server = TestServer::start(&db, |c| c.database.listen_url = Some(listen_url.into()));
    server.ready().await;
    // History, with a transaction still open whose seq sits among it.
    for n in 0..5 {
        db.emit(NewEvent::durable("history", "org-1", json!({"n": n})))
            .await;
    }
    let mut late_writer = db.connect().await;
    let late_tx = late_writer.transaction().await.unwrap();
    let late = db
        .publisher()
        .emit(&late_tx, durable("late", "org-1"))
        .await
        .unwrap();
    for n in 5..8 {
        db.emit(NewEvent::durable("history", "org-1", json!({"n": n})))
            .await;
    }

    let (mut stream, _) = server
        .subscribe(&token("alice", "org-1", json!({})), None, "")
        .await;
    let live = db.emit(durable("live", "org-1")).await;
    assert_eq!(stream.next_event().await.json()["id"], live.id.to_string());
    // Committed after the subscriber joined, with a seq below history's.
    late_tx.commit().await.unwrap();
    let frame = stream.next_event().await;
    assert_eq!(frame.json()["id"], late.id.to_string(), "{frame:?}");

    // The reconnect re-reads far below the watermark; none of the history
    // may come out of it.
    cut_the_listener(&db, &server, &listener_tag).await;
    let after = db.emit(durable("after", "org-1")).await;
    let frame = stream.next_event().await;
    assert_eq!(
        frame.json()["id"],
        after.id.to_string(),
        "expected the next live event, got {frame:?}"
    );
}

#[tokio::test]
async fn a_subscriber_joining_an_active_scope_never_gets_what_committed_before() {
    let db = TestDb::new().await;
    let server = TestServer::start(&db, |_| {});
    server.ready().await;
    let (mut first, _) = server
        .subscribe(&token("alice", "org-1", json!({})), None, "")
        .await;
    for round in 0..20 {
        // Committed just before the second subscriber connects: its
        // notification may reach the scope after the subscriber is in.
        let before = db.emit(durable("before", "org-1")).await;
        let (mut second, _) = server
            .subscribe(&token("bob", "org-1", json!({})), None, "")
            .await;
        let after = db.emit(durable("after", "org-1")).await;
        assert_eq!(
            ids(&first.events(2).await),
            [before.id.to_string(), after.id.to_string()]
        );
        let frame = second.next_event().await;
        assert_eq!(
            frame.json()["id"],
            after.id.to_string(),
            "round {round}: the second subscriber got an event from before it joined"
        );
    }
}

#[tokio::test]
async fn a_watermark_from_the_future_asks_for_a_resync() {
    let db = TestDb::new().await;
    let server = TestServer::start(&db, |_| {});
    server.ready().await;
    let mut newest = 0;
    for _ in 0..3 {
        newest = db.emit(durable("n", "org-1")).await.seq.unwrap();
    }
    let alice = token("alice", "org-1", json!({}));
    let (_, resync) = server
        .subscribe(&alice, Some(&newest.to_string()), "")
        .await;
    assert!(!resync, "a current watermark needs no resync");
    // With a subscriber in place the tail answers replays too; both paths
    // must notice an id the outbox never assigned.
    let (_, resync) = server.subscribe(&alice, Some("999999"), "").await;
    assert!(resync, "an id above every seq is from another database");
    let (_, resync) = server
        .subscribe(&alice, Some(&(newest + 1).to_string()), "")
        .await;
    assert!(resync);
    let (_, resync) = server
        .subscribe(&token("bob", "org-2", json!({})), Some("999999"), "")
        .await;
    assert!(resync, "from the outbox path too");
}

#[tokio::test]
async fn a_replay_that_fails_midway_ends_as_an_error_not_a_clean_end() {
    let db = TestDb::new().await;
    let server = TestServer::start(&db, |_| {});
    server.ready().await;
    // Many pages of large rows: the stream cannot send them all at once, so
    // the replay is still reading when the outbox becomes unreadable.
    let client = db.connect().await;
    client
        .batch_execute(&format!(
            "INSERT INTO {s}.outbox (id, type, scope_key, data)
             SELECT gen_random_uuid(), 'bulk', 'org-1', jsonb_build_object('pad', repeat('x', 10000))
             FROM generate_series(1, 3000)",
            s = db.schema
        ))
        .await
        .unwrap();
    let response = reqwest::Client::new()
        .get(server.url("/v1/events"))
        .bearer_auth(token("alice", "org-1", json!({})))
        .header("last-event-id", "0")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut body = Box::pin(response.bytes_stream());
    use futures_util::StreamExt;
    let first = tokio::time::timeout(DEADLINE, body.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(!first.is_empty());
    client
        .batch_execute(&format!(
            "ALTER TABLE {s}.outbox RENAME TO outbox_gone",
            s = db.schema
        ))
        .await
        .unwrap();
    let mut seen = String::from_utf8_lossy(&first).into_owned();
    let ending = loop {
        match tokio::time::timeout(DEADLINE, body.next()).await.unwrap() {
            Some(Ok(chunk)) => seen.push_str(&String::from_utf8_lossy(&chunk)),
            Some(Err(error)) => break Ok(error),
            None => break Err(()),
        }
    };
    assert!(
        ending.is_ok(),
        "the stream ended cleanly, which looks like the age cap"
    );
    assert!(
        !seen.contains("event: ready"),
        "no ready after a failed replay"
    );
}

#[tokio::test]
async fn a_batch_emit_writes_one_statement_and_shares_ephemeral_notifications() {
    let db = TestDb::new().await;
    let server = TestServer::start(&db, |_| {});
    server.ready().await;
    let (mut stream, _) = server
        .subscribe(&token("alice", "org-1", json!({})), None, "")
        .await;
    let mut listener = db.listen().await;
    let client = db.connect().await;
    let mut events = Vec::new();
    for n in 0..6 {
        events.push(NewEvent::durable("order.created", "org-1", json!({"n": n})));
        events.push(NewEvent::ephemeral(
            "order.typing",
            "org-1",
            json!({"n": n}),
        ));
    }
    let emitted = db.publisher().emit_batch(&client, events).await.unwrap();
    let seqs: Vec<i64> = emitted.iter().filter_map(|e| e.seq).collect();
    assert_eq!(seqs.len(), 6);
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    // Six ephemeral events, one notification; one pointer for the scope.
    let payloads = listener.drain(&db).await;
    let batches: Vec<&String> = payloads
        .iter()
        .filter(|p| p.contains(r#""k":"evts""#))
        .collect();
    assert_eq!(batches.len(), 1, "{payloads:?}");
    // Every event reaches the subscriber.
    let mut expected: HashSet<String> = emitted.iter().map(|e| e.id.to_string()).collect();
    while !expected.is_empty() {
        let frame = stream.next_event().await;
        assert!(
            expected.remove(frame.json()["id"].as_str().unwrap()),
            "{frame:?}"
        );
    }
}

#[tokio::test]
async fn a_stopped_relay_leaves_no_listener_behind() {
    let db = TestDb::new().await;
    let listener_tag = format!("{}_stopping", db.schema);
    let listen_url = db.url.replace(db.schema.as_str(), &listener_tag);
    let mut server = TestServer::start(&db, |c| c.database.listen_url = Some(listen_url.into()));
    server.ready().await;
    let control = db.connect().await;
    async fn listening(control: &tokio_postgres::Client, tag: &str) -> i64 {
        control
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
                &[&tag],
            )
            .await
            .unwrap()
            .get(0)
    }
    assert_eq!(listening(&control, &listener_tag).await, 1);
    // The relay runs inside this process, as in an embedding application
    // whose runtime goes on; stopping the relay must stop its listener too,
    // not only drop its address.
    server.stop_keeping_the_runtime();
    eventually("the LISTEN connection goes with the relay", async || {
        (listening(&control, &listener_tag).await == 0).then_some(())
    })
    .await;
    drop(server);
}
