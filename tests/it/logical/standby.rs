//! Relays that decode on a physical standby (Postgres 16 and later): the
//! pool writes to the primary, `database.listen_url` points the
//! replication stream at the standby, so the primary carries writes and
//! WAL shipping only. Durable events and ephemeral ones (logical messages,
//! emitted on the primary and decoded from the standby's WAL) both arrive.
//! A standby that cannot decode, or could lose the slot, is refused.

use std::process::Command;

use serde_json::json;

use crate::support::cluster::Cluster;
use crate::support::process::free_port;
use crate::support::server::{TestServer, token};
use crate::support::{TestDb, eventually};
use eventrelay::publisher::NewEvent;

/// The eventrelay slots on the server at `url`.
async fn relay_slots(url: &str) -> i64 {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
        .query_one(
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'eventrelay_%'",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

#[tokio::test]
async fn a_relay_decoding_on_a_standby_delivers_durable_and_ephemeral_events() {
    let primary = Cluster::start_logical_16("");
    let standby = Cluster::start_cold_standby_of(&primary, "-c hot_standby_feedback=on");
    let db = TestDb::logical_on(&primary.url()).await;
    let stream_url = standby.url();
    let server = TestServer::start(&db, |c| c.database.listen_url = Some(stream_url.into()));
    server.ready().await;
    let (mut stream, _) = server
        .subscribe(&token("alice", "org-1", json!({})), None, "")
        .await;

    let durable = db
        .emit(NewEvent::durable("order.created", "org-1", json!({"n": 1})))
        .await;
    assert_eq!(
        stream.next_event().await.json()["id"],
        durable.id.to_string()
    );
    let ephemeral = db
        .emit(NewEvent::ephemeral(
            "cursor.moved",
            "org-1",
            json!({"x": 3}),
        ))
        .await;
    let frame = stream.next_event().await;
    assert_eq!(frame.json()["id"], ephemeral.id.to_string());
    assert_eq!(frame.json()["data"], json!({"x": 3}));

    // The decoding happens on the standby: its slot is there, none is on
    // the primary.
    assert_eq!(relay_slots(&standby.url()).await, 1);
    assert_eq!(relay_slots(&primary.url()).await, 0);
    drop(server);
    eventually(
        "the standby's temporary slot goes with the relay",
        async || (relay_slots(&standby.url()).await == 0).then_some(()),
    )
    .await;
}

/// `eventrelay serve` in logical mode with the stream on `listen_url`;
/// its exit status and stderr, once it exits (a refused start).
fn serve_refused(db: &TestDb, listen_url: &str) -> String {
    let mut run = Command::new(env!("CARGO_BIN_EXE_eventrelay"));
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("EVENTRELAY_") {
            run.env_remove(name);
        }
    }
    let output = run
        .arg("serve")
        .env("DATABASE_URL", &db.url)
        .env("EVENTRELAY_DATABASE__LISTEN_URL", listen_url)
        .env("EVENTRELAY_DATABASE__SCHEMA", db.schema.as_str())
        .env("EVENTRELAY_DATABASE__CHANNEL", db.channel.as_str())
        .env("EVENTRELAY_DATABASE__WAKEUP", "logical")
        .env(
            "EVENTRELAY_HTTP__BIND",
            format!("127.0.0.1:{}", free_port()),
        )
        .output()
        .unwrap();
    assert!(!output.status.success(), "the relay must refuse to start");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[tokio::test]
async fn a_standby_without_feedback_or_older_than_16_is_refused_by_name() {
    let primary = Cluster::start_logical_16("");
    let no_feedback = Cluster::start_cold_standby_of(&primary, "-c hot_standby_feedback=off");
    let db = TestDb::logical_on(&primary.url()).await;
    let stderr = serve_refused(&db, &no_feedback.url());
    assert!(stderr.contains("hot_standby_feedback"), "{stderr}");
    drop(db);

    // The machine's own server binaries, when older than 16.
    let old = Cluster::start_logical().expect("Postgres server binaries");
    let old_standby = Cluster::start_standby_of(&old);
    let db = TestDb::logical_on(&old.url()).await;
    let version: i32 = db
        .connect()
        .await
        .query_one("SELECT current_setting('server_version_num')::int", &[])
        .await
        .unwrap()
        .get(0);
    if version < 160_000 {
        let stderr = serve_refused(&db, &old_standby.url());
        assert!(stderr.contains("Postgres 16 or later"), "{stderr}");
    }
}
