//! The logical wake-up mode (`database.wakeup = "logical"`) on throwaway
//! clusters with `wal_level = logical`: what it sends and holds on the
//! server, what it refuses, and what it leaves behind when killed. The
//! relay's delivery scenarios run in both modes in `relay.rs` and
//! `faults.rs`.

use std::process::Command;

use crate::support::cluster::Cluster;
use crate::support::process::{RelayProcess, free_port, relay_config};
use crate::support::server::{SseStream, TestServer, token};
use crate::support::{TestDb, eventually};
use eventrelay::publisher::{NewEvent, Publisher};
use eventrelay::store::WakeupMode;
use serde_json::json;

fn logical_cluster() -> Cluster {
    Cluster::start_logical().unwrap_or_else(|| {
        panic!("no Postgres server binaries (initdb, pg_ctl): install them or set PG_BINDIR")
    })
}

/// The replication slots on the server: (temporary, active, plugin).
async fn slots(db: &TestDb) -> Vec<(bool, bool, String)> {
    db.connect()
        .await
        .query(
            "SELECT temporary, active, plugin::text FROM pg_replication_slots",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1), row.get(2)))
        .collect()
}

async fn wait_for_slots(db: &TestDb, count: usize) {
    eventually(&format!("{count} replication slots"), async || {
        (slots(db).await.len() == count).then_some(())
    })
    .await;
}

#[tokio::test]
async fn emitting_sends_no_notification_and_the_relay_reads_a_temporary_slot() {
    let (db, _cluster) = TestDb::for_mode(WakeupMode::Logical).await;
    let server = TestServer::start(&db, |_| {});
    server.ready().await;
    assert_eq!(
        slots(&db).await,
        vec![(true, true, "pgoutput".to_owned())],
        "one temporary pgoutput slot, in use"
    );
    let mut notifications = db.listen().await;
    let (mut stream, _) = server
        .subscribe(&token("alice", "org-1", json!({})), None, "")
        .await;

    let durable = db
        .emit(NewEvent::durable("order.created", "org-1", json!({"n": 1})))
        .await;
    let ephemeral = db
        .emit(NewEvent::ephemeral(
            "cursor.moved",
            "org-1",
            json!({"x": 3}),
        ))
        .await;
    let frames = stream.events(2).await;
    let mut got: Vec<String> = frames
        .iter()
        .map(|f| f.json()["id"].as_str().unwrap().to_owned())
        .collect();
    got.sort();
    let mut sent = vec![durable.id.to_string(), ephemeral.id.to_string()];
    sent.sort();
    assert_eq!(got, sent);
    assert_eq!(
        notifications.drain(&db).await,
        Vec::<String>::new(),
        "no NOTIFY in logical mode"
    );
    // The stream's lag: the commit time is read in Postgres's epoch, so a
    // wrong conversion shows as decades.
    let lag = server.metric("eventrelay_replication_lag_seconds").await;
    assert!(
        lag > 0.0 && lag < 10.0,
        "replication lag of a just-read commit: {lag} s"
    );
    let recorded: String = db
        .connect()
        .await
        .query_one(&format!("SELECT wakeup FROM {}.settings", db.schema), &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(recorded, "logical");
}

#[tokio::test]
async fn an_ephemeral_event_over_the_notify_limit_travels_when_the_cap_is_raised_and_forgeries_do_not()
 {
    let (db, _cluster) = TestDb::for_mode(WakeupMode::Logical).await;
    let server = TestServer::start(&db, |c| c.publish.ephemeral_max_bytes = 65_536);
    server.ready().await;
    let (mut stream, _) = server
        .subscribe(&token("alice", "org-1", json!({})), None, "")
        .await;
    let pad = "x".repeat(20_000);
    let (status, _) = server
        .publish(json!([
            {"type": "doc.snapshot", "scopeKey": "org-1", "lane": "ephemeral", "data": {"pad": pad}}
        ]))
        .await;
    assert_eq!(status, 200);
    let frame = stream.next_event().await;
    assert_eq!(frame.event.as_deref(), Some("doc.snapshot"));
    assert_eq!(frame.json()["data"]["pad"].as_str().unwrap().len(), 20_000);

    // The publisher crate follows the same cap, set by the application.
    let client = db.connect().await;
    let publisher = Publisher::new(db.schema.as_str())
        .unwrap()
        .with_ephemeral_max_bytes(65_536);
    publisher
        .emit(
            &client,
            NewEvent::ephemeral("doc.snapshot", "org-1", json!({"pad": "y".repeat(30_000)})),
        )
        .await
        .unwrap();
    let frame = stream.next_event().await;
    assert_eq!(frame.json()["data"]["pad"].as_str().unwrap().len(), 30_000);

    // Any role may write a logical message with any prefix: one the
    // schema's functions did not seal is dropped and counted.
    let forged = json!({"k": "evt", "e": {"id": uuid::Uuid::new_v4(), "type": "forged",
        "scopeKey": "org-1", "lane": "ephemeral", "data": {}, "resources": [],
        "occurredAt": "2024-01-01T00:00:00Z"}});
    client
        .execute(
            "SELECT pg_logical_emit_message(true, $1, $2::text)",
            &[&db.channel.as_str(), &forged.to_string()],
        )
        .await
        .unwrap();
    let after = db
        .emit(NewEvent::durable("after.forgery", "org-1", json!({})))
        .await;
    assert_eq!(stream.next_event().await.json()["id"], after.id.to_string());
    let rejected = "eventrelay_notifications_rejected_total{reason=\"not_sealed\"}";
    assert_eq!(server.metric(rejected).await, 1.0);
}

#[tokio::test]
async fn a_replication_message_over_the_limit_is_refused_and_its_row_still_arrives() {
    let (db, _cluster) = TestDb::for_mode(WakeupMode::Logical).await;
    let server = TestServer::start(&db, |c| {
        c.database.replication_max_message_bytes = 64 * 1024;
    });
    server.ready().await;
    let (mut stream, _) = server
        .subscribe(&token("alice", "org-1", json!({})), None, "")
        .await;
    let pad = "x".repeat(100_000);
    let big = db
        .emit(NewEvent::durable("doc.big", "org-1", json!({"pad": pad})))
        .await;
    // Its insert is too large for the stream, which reconnects past it;
    // the reconnect's re-read from the outbox delivers it.
    let frame = stream.next_event().await;
    assert_eq!(frame.json()["id"], big.id.to_string());
    assert_eq!(
        frame.json()["data"]["pad"].as_str().map(str::len),
        Some(100_000)
    );
    let refused = "eventrelay_notifications_rejected_total{reason=\"too_large\"}";
    server.wait_for_metric(refused, |count| count >= 1.0).await;
    let after = db
        .emit(NewEvent::durable("after.big", "org-1", json!({})))
        .await;
    assert_eq!(stream.next_event().await.json()["id"], after.id.to_string());
}

#[tokio::test]
async fn a_huge_logical_message_from_any_role_costs_the_relay_no_memory() {
    let (db, _cluster) = TestDb::for_mode(WakeupMode::Logical).await;
    let relay = RelayProcess::spawn(&relay_config(&db, free_port(), ""));
    relay.ready().await;
    let response = reqwest::Client::new()
        .get(format!("{}/v1/events", relay.base))
        .bearer_auth(token("alice", "org-1", json!({})))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut stream = SseStream::new(response);
    stream.ready().await;
    let first = db
        .emit(NewEvent::durable("before.huge", "org-1", json!({})))
        .await;
    assert_eq!(stream.next_event().await.json()["id"], first.id.to_string());
    let peak_before = relay.status_kib("VmHWM");

    // A role with no grant at all may write one.
    let admin = db.connect().await;
    admin
        .batch_execute("CREATE ROLE nobody_special LOGIN")
        .await
        .unwrap();
    let stranger = eventrelay::connect(&db.url.replace("postgres@", "nobody_special@"))
        .await
        .unwrap();
    stranger
        .execute(
            "SELECT pg_logical_emit_message(true, $1, repeat('A', 200 * 1024 * 1024))",
            &[&db.channel.as_str()],
        )
        .await
        .unwrap();
    let refused = "eventrelay_notifications_rejected_total{reason=\"too_large\"}";
    eventually("the relay refuses the 200 MiB message", async || {
        (relay.metric(refused).await >= 1.0).then_some(())
    })
    .await;
    let after = db
        .emit(NewEvent::durable("after.huge", "org-1", json!({})))
        .await;
    assert_eq!(stream.next_event().await.json()["id"], after.id.to_string());
    let grown_kib = relay.status_kib("VmHWM").saturating_sub(peak_before);
    assert!(
        grown_kib < 8 * 1024,
        "the relay's peak memory grew by {grown_kib} KiB for a 200 MiB message"
    );
}

#[tokio::test]
async fn a_relay_killed_with_sigkill_leaves_no_slot_behind() {
    let (db, _cluster) = TestDb::for_mode(WakeupMode::Logical).await;
    let relay = RelayProcess::spawn(&relay_config(&db, free_port(), ""));
    relay.ready().await;
    wait_for_slots(&db, 1).await;
    relay.kill();
    wait_for_slots(&db, 0).await;
}

/// `eventrelay check-config` (or, with `serve`, the start) for a relay in
/// logical mode on `url`; returns its exit status and stderr.
fn run_in_logical_mode(command: &str, db: &TestDb, url: &str, migrate: bool) -> (bool, String) {
    let mut run = Command::new(env!("CARGO_BIN_EXE_eventrelay"));
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("EVENTRELAY_") {
            run.env_remove(name);
        }
    }
    let output = run
        .arg(command)
        .env("DATABASE_URL", url)
        .env("EVENTRELAY_DATABASE__SCHEMA", db.schema.as_str())
        .env("EVENTRELAY_DATABASE__CHANNEL", db.channel.as_str())
        .env("EVENTRELAY_DATABASE__WAKEUP", "logical")
        .env("EVENTRELAY_DATABASE__MIGRATE", migrate.to_string())
        .env(
            "EVENTRELAY_HTTP__BIND",
            format!("127.0.0.1:{}", free_port()),
        )
        .output()
        .unwrap();
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test]
async fn logical_mode_is_refused_where_the_server_cannot_serve_it() {
    // The shared server runs with wal_level = replica.
    let db = TestDb::new().await;
    for command in ["check-config", "serve"] {
        let (ok, stderr) = run_in_logical_mode(command, &db, &db.url, true);
        assert!(!ok, "{command} must fail");
        assert!(
            stderr.contains("wal_level = logical"),
            "{command}: {stderr}"
        );
    }
    assert_eq!(
        db.connect()
            .await
            .query_one(&format!("SELECT wakeup FROM {}.settings", db.schema), &[])
            .await
            .unwrap()
            .get::<_, String>(0),
        "notify",
        "a refused start leaves the schema's mode alone"
    );

    let cluster = logical_cluster();
    let db = TestDb::new_on(&cluster.url()).await;
    let admin = db.connect().await;

    // Migrated for notify, and the relay may not migrate.
    let (ok, stderr) = run_in_logical_mode("check-config", &db, &db.url, false);
    assert!(!ok);
    assert!(
        stderr.contains("migrate --wakeup logical"),
        "mismatch: {stderr}"
    );

    // A role without the REPLICATION attribute.
    admin
        .batch_execute("CREATE ROLE plain_writer LOGIN")
        .await
        .unwrap();
    let as_plain = db.url.replace("postgres@", "plain_writer@");
    let (ok, stderr) = run_in_logical_mode("check-config", &db, &as_plain, true);
    assert!(!ok);
    assert!(
        stderr.contains("ALTER ROLE plain_writer REPLICATION"),
        "role: {stderr}"
    );

    // Every slot taken.
    let max: i64 = admin
        .query_one(
            "SELECT current_setting('max_replication_slots')::bigint",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    for n in 0..max {
        admin
            .execute(
                "SELECT pg_create_physical_replication_slot($1)",
                &[&format!("taken_{n}")],
            )
            .await
            .unwrap();
    }
    let (ok, stderr) = run_in_logical_mode("check-config", &db, &db.url, true);
    assert!(!ok);
    assert!(stderr.contains("max_replication_slots"), "slots: {stderr}");
}

#[tokio::test]
async fn readyz_follows_the_replication_stream() {
    let (db, _cluster) = TestDb::for_mode(WakeupMode::Logical).await;
    let admin = db.connect().await;
    admin
        .batch_execute("CREATE ROLE streamer LOGIN REPLICATION")
        .await
        .unwrap();
    // The stream connects through `listen_url`, as a role of its own with a
    // tag to find its WAL sender by.
    let tag = format!("{}_stream", db.schema);
    let listen_url = db
        .url
        .replace("postgres@", "streamer@")
        .replace(db.schema.as_str(), &tag);
    let server = TestServer::start(&db, |c| c.database.listen_url = Some(listen_url.into()));
    server.ready().await;

    admin
        .batch_execute("ALTER ROLE streamer NOREPLICATION")
        .await
        .unwrap();
    admin
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
            &[&tag],
        )
        .await
        .unwrap();
    let http = reqwest::Client::new();
    eventually("/readyz answers 503 without a stream", async || {
        let response = http.get(server.url("/readyz")).send().await.unwrap();
        (response.status() == 503).then_some(())
    })
    .await;

    admin
        .batch_execute("ALTER ROLE streamer REPLICATION")
        .await
        .unwrap();
    server.ready().await;
    let (mut stream, _) = server
        .subscribe(&token("alice", "org-1", json!({})), None, "")
        .await;
    let event = db
        .emit(NewEvent::durable("after.recovery", "org-1", json!({})))
        .await;
    assert_eq!(stream.next_event().await.json()["id"], event.id.to_string());
}

#[tokio::test]
async fn a_transaction_running_at_start_delays_the_stream_and_nothing_is_missed() {
    let (db, _cluster) = TestDb::for_mode(WakeupMode::Logical).await;
    let mut long = db.connect().await;
    let running = long.transaction().await.unwrap();
    let publisher = Publisher::new(db.schema.as_str()).unwrap();
    let late = publisher
        .emit(&running, NewEvent::durable("late", "org-1", json!({})))
        .await
        .unwrap();

    let server = TestServer::start(&db, |_| {});
    // The relay's slot waits for that transaction to end; meanwhile the
    // relay is not ready.
    let admin = db.connect().await;
    eventually(
        "a WAL sender waits for the running transaction",
        async || {
            let waiting: i64 = admin
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity
                 WHERE backend_type = 'walsender' AND wait_event_type = 'Lock'",
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            (waiting == 1).then_some(())
        },
    )
    .await;
    let status = reqwest::get(server.url("/readyz")).await.unwrap().status();
    assert_eq!(status, 503, "not ready while the slot waits");
    let (mut stream, _) = server
        .subscribe(&token("alice", "org-1", json!({})), None, "")
        .await;

    running.commit().await.unwrap();
    server.ready().await;
    let next = db.emit(NewEvent::durable("next", "org-1", json!({}))).await;
    let got: Vec<String> = stream
        .events(2)
        .await
        .iter()
        .map(|f| f.json()["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        got,
        [late.id.to_string(), next.id.to_string()],
        "the late commit is caught up by the re-read, then the stream takes over"
    );
}

#[tokio::test]
async fn a_relay_finding_no_free_wal_sender_is_refused_by_name() {
    let Some(cluster) = Cluster::start_logical_with(1, 5) else {
        panic!("no Postgres server binaries (initdb, pg_ctl): install them or set PG_BINDIR");
    };
    let db = TestDb::logical_on(&cluster.url()).await;
    // The one WAL sender goes to the first relay.
    let first = TestServer::start(&db, |_| {});
    first.ready().await;
    let (ok, stderr) = run_in_logical_mode("check-config", &db, &db.url, true);
    assert!(!ok);
    assert!(stderr.contains("max_wal_senders"), "senders: {stderr}");
}
