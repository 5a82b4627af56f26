//! Live reload: every setting that can change while the relay runs does,
//! observed on a running relay, without dropping the streams already open;
//! a configuration that fails validation is refused whole; changed
//! restart-only settings are named; SIGHUP reloads the real binary.

use crate::support::process::{RelayProcess, relay_config};
use crate::support::server::{TestServer, token};
use crate::support::{TestDb, eventually};
use eventrelay::publisher::NewEvent;
use serde_json::json;

#[tokio::test]
async fn sse_settings_apply_to_new_connections_and_open_ones_stay() {
    let db = TestDb::new().await;
    let (server, reloadable) = TestServer::start_reloadable(&db, |_| {});
    server.ready().await;
    let alice = token("alice", "org-1", json!({}));
    let (mut open, _) = server.subscribe(&alice, None, "").await;

    reloadable.change(|c| {
        c.sse.max_connections_per_subscriber = 1;
        c.sse.heartbeat_secs = 1;
        c.sse.max_age_secs = 2;
        c.log.level = "eventrelay=debug".into();
    });
    let (status, report) = server.reload().await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(
        report["applied"],
        json!([
            "log.level",
            "sse.heartbeat_secs",
            "sse.max_age_secs",
            "sse.max_connections_per_subscriber"
        ])
    );
    assert_eq!(report["needsRestart"], json!([]));
    assert_eq!(reloadable.log_levels(), ["eventrelay=debug"]);
    assert_eq!(
        server
            .metric("eventrelay_config_reloads_total{result=\"applied\"}")
            .await,
        1.0
    );

    // The stream opened before the reload still delivers.
    let event = db
        .emit(NewEvent::durable("after.reload", "org-1", json!({})))
        .await;
    assert_eq!(open.next_event().await.json()["id"], event.id.to_string());

    // The cap is now 1, and alice already holds a stream.
    let Err((status, _)) = server.connect(Some(&alice), None, "").await else {
        panic!("a second stream was accepted under a cap of 1");
    };
    assert_eq!(status, 429);
    drop(open);
    server
        .wait_for_metric("eventrelay_sse_connections", |v| v == 0.0)
        .await;

    // A new stream gets the new heartbeat and the new age cap.
    let mut fresh = server.connect(Some(&alice), None, "").await.unwrap();
    let heartbeat = loop {
        let frame = fresh.next_frame().await.unwrap();
        if frame.comment.is_some() {
            break frame;
        }
    };
    assert_eq!(heartbeat.comment.as_deref(), Some("hb"));
    // Each frame is awaited for at most the tests' deadline: under the
    // old age cap (minutes) the stream would not end in time.
    assert!(fresh.ends().await);
}

#[tokio::test]
async fn tail_bounds_and_queue_capacity_change_live() {
    let db = TestDb::new().await;
    let (server, reloadable) = TestServer::start_reloadable(&db, |c| c.sse.replay_lookback = 0);
    server.ready().await;
    let alice = token("alice", "org-1", json!({}));
    reloadable.change(|c| {
        c.hub.tail_events = 2;
        c.sse.queue_capacity = 16;
    });
    assert_eq!(server.reload().await.0, 200);

    // The scope's tail now keeps 2 events: a replay from further back
    // reads the outbox.
    let (mut live, _) = server.subscribe(&alice, None, "").await;
    let mut emitted = Vec::new();
    for n in 0..5 {
        emitted.push(
            db.emit(NewEvent::durable("n", "org-1", json!({"n": n})))
                .await,
        );
    }
    live.events(5).await;
    let after = emitted[0].seq.unwrap().to_string();
    let (replayed, _) = server.subscribe(&alice, Some(&after), "").await;
    assert_eq!(replayed.replayed.len(), 4);
    assert_eq!(
        server
            .metric("eventrelay_replays_total{source=\"outbox\"}")
            .await,
        1.0
    );
    drop(replayed);
    drop(live);

    // New sessions get 16-frame queues: a subscriber that reads nothing is
    // dropped with its 16 queued frames and the one that did not fit.
    let (_never_reads, _) = server
        .subscribe(&token("slow", "org-1", json!({})), None, "")
        .await;
    server
        .flood_until_a_slow_subscriber_is_dropped(&db, "org-1", None)
        .await;
    assert_eq!(server.metric("eventrelay_frames_dropped_total").await, 17.0);
}

#[tokio::test]
async fn webhook_workers_and_subscriptions_change_live() {
    let db = TestDb::new().await;
    // Accepts connections and never answers: each worker stays busy with
    // one delivery.
    let stalled = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/hook", stalled.local_addr().unwrap());
    let subscription = |id: &str| eventrelay::webhooks::NewSubscription {
        id: id.into(),
        url: url.clone(),
        secret: eventrelay::webhooks::generate_secret().into(),
        types: vec!["*".into()],
        scope_key: None,
        max_per_second: None,
        ordering: Default::default(),
        ordering_max_block_secs: None,
    };
    let first = subscription("first");
    let (server, reloadable) = TestServer::start_reloadable(&db, |c| {
        c.webhooks.workers = 1;
        c.webhooks.allow_private_networks = true;
        c.webhooks.subscriptions = vec![first.clone()];
    });
    server.ready().await;
    for n in 0..4 {
        db.emit(NewEvent::durable("n", "org-1", json!({"n": n})))
            .await;
    }
    server
        .wait_for_metric("eventrelay_webhook_workers_busy", |v| v == 1.0)
        .await;

    let second = subscription("second");
    reloadable.change(|c| {
        c.webhooks.workers = 3;
        c.webhooks.subscriptions = vec![first.clone(), second.clone()];
    });
    let (status, report) = server.reload().await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(
        report["applied"],
        json!(["webhooks.subscriptions", "webhooks.workers"])
    );
    server
        .wait_for_metric("eventrelay_webhook_workers_busy", |v| v == 3.0)
        .await;
    let added = reqwest::Client::new()
        .get(server.url("/v1/admin/subscriptions/second"))
        .bearer_auth(crate::support::server::ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(added.status(), 200);

    reloadable.change(|c| c.webhooks.workers = 1);
    assert_eq!(server.reload().await.0, 200);
    // The two surplus workers end once their stalled deliveries time out;
    // meanwhile no fourth worker starts.
    assert!(server.metric("eventrelay_webhook_workers_busy").await <= 3.0);
}

#[tokio::test]
async fn an_invalid_configuration_is_refused_whole_and_restart_only_changes_are_named() {
    let db = TestDb::new().await;
    let (server, reloadable) = TestServer::start_reloadable(&db, |_| {});
    server.ready().await;
    reloadable.change(|c| {
        c.sse.max_connections_per_subscriber = 1;
        c.sse.queue_capacity = 1;
    });
    let (status, answer) = server.reload().await;
    assert_eq!(status, 422, "{answer}");
    assert_eq!(answer["error"]["code"], "invalid_config");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("sse.queue_capacity"),
        "{answer}"
    );
    assert_eq!(
        server
            .metric("eventrelay_config_reloads_total{result=\"failed\"}")
            .await,
        1.0
    );
    // Nothing of it applied: the cap is still 5.
    let alice = token("alice", "org-1", json!({}));
    let (_one, _) = server.subscribe(&alice, None, "").await;
    let (_two, _) = server.subscribe(&alice, None, "").await;

    reloadable.change(|c| {
        c.sse.queue_capacity = 1024;
        c.sse.max_connections_per_subscriber = 5;
        c.http.max_body_bytes = 4096;
        c.database.pool_size = 8;
    });
    let (status, report) = server.reload().await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(report["applied"], json!([]));
    assert_eq!(
        report["needsRestart"],
        json!(["database.pool_size", "http.max_body_bytes"])
    );
}

#[tokio::test]
async fn sighup_reloads_the_running_binary() {
    let db = TestDb::new().await;
    let port = crate::support::process::free_port();
    let relay = RelayProcess::spawn(&relay_config(&db, port, ""));
    relay.ready().await;
    // The relay logs at `warn`; the reload turns `info` on, so its own
    // "configuration reloaded" line shows that the log filter changed.
    let reloaded = relay_config(&db, port, "[sse]\nmax_connections_per_subscriber = 1\n")
        .replace("level = \"warn\"", "level = \"info\"");
    relay.rewrite_config(&reloaded);
    relay.signal("HUP");
    eventually("a reload after SIGHUP", async || {
        let applied = relay
            .metric("eventrelay_config_reloads_total{result=\"applied\"}")
            .await;
        (applied >= 1.0).then_some(())
    })
    .await;
    let alice = token("alice", "org-1", json!({}));
    let open = |relay: &RelayProcess| {
        reqwest::Client::new()
            .get(format!("{}/v1/events", relay.base))
            .bearer_auth(&alice)
            .send()
    };
    let first = open(&relay).await.unwrap();
    assert_eq!(first.status(), 200);
    let second = open(&relay).await.unwrap();
    assert_eq!(second.status(), 429);
    eventually("the reloaded log.level takes effect", async || {
        relay.log().contains("configuration reloaded").then_some(())
    })
    .await;
    relay.kill();
}
