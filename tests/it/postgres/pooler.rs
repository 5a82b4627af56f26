//! The relay with its pool behind a real PgBouncer in transaction mode (the
//! operating system's package) and its LISTEN connection direct: publish,
//! live and replayed streams, webhook claims and records, the janitor and
//! the admin API all work through it, and `eventrelay migrate` works
//! through it too.
//!
//! The pooler shares a few server connections round robin among all
//! clients (see `crate::support::pgbouncer`), so a statement prepared in one
//! transaction and used in the next would land on another server
//! connection; the first test shows that this setup does catch that.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::support::pgbouncer::PgBouncer;
use crate::support::receiver::Receiver;
use crate::support::server::{TestServer, token};
use crate::support::{TestDb, eventually};
use eventrelay::store::MIGRATIONS;
use serde_json::{Value, json};
use tokio_postgres::NoTls;
use tokio_postgres::types::Type;

const ADMIN_TOKEN: &str = "admin-token-for-pgbouncer-tests";

async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.unwrap();
    tokio::spawn(connection);
    client
}

async fn admin(
    server: &TestServer,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut request = reqwest::Client::new()
        .request(method, server.url(path))
        .bearer_auth(ADMIN_TOKEN);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// The seqs the publish API assigned, in order.
fn seqs(published: &Value) -> Vec<i64> {
    published["events"]
        .as_array()
        .unwrap_or_else(|| panic!("not a publish answer: {published}"))
        .iter()
        .map(|event| event["seq"].as_i64().unwrap())
        .collect()
}

/// (status, attempts, outcome of the last attempt) of every delivery.
async fn deliveries(db: &TestDb) -> Vec<(String, i32, Option<String>)> {
    db.connect()
        .await
        .query(
            &format!(
                "SELECT d.status, d.attempts,
                        (SELECT a.outcome FROM {schema}.webhook_attempts a
                         WHERE a.delivery_id = d.id ORDER BY a.id DESC LIMIT 1)
                 FROM {schema}.webhook_deliveries d ORDER BY d.id",
                schema = db.schema
            ),
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1), row.get(2)))
        .collect()
}

#[tokio::test]
async fn a_named_statement_used_in_a_later_transaction_is_lost_behind_this_pooler() {
    let bouncer = PgBouncer::start().await;
    let client = connect(&bouncer.url("pgbouncer-control")).await;
    // `query` prepares a named statement in one round trip and runs it in
    // the next; between them the pooler hands the server connection on.
    let error = client
        .query("SELECT $1::int4", &[&1i32])
        .await
        .expect_err("a prepared statement must not survive the switch of server connection");
    let message = error
        .as_db_error()
        .map(|db| db.message().to_owned())
        .unwrap_or_else(|| error.to_string());
    assert!(
        message.contains("prepared statement"),
        "unexpected error: {message}"
    );
    // `query_typed` parses, binds and runs an unnamed statement in one go.
    for i in 0..10i32 {
        let rows = client
            .query_typed("SELECT $1::int4", &[(&i, Type::INT4)])
            .await
            .unwrap();
        assert_eq!(rows[0].get::<_, i32>(0), i);
    }
}

#[tokio::test]
async fn the_relay_serves_with_its_pool_behind_a_transaction_pooler() {
    let db = TestDb::new().await;
    let bouncer = PgBouncer::start().await;
    let receiver = Receiver::start([]);
    let pooled = bouncer.url(db.schema.as_str());
    let direct = db.url.clone();
    let transactions_before = bouncer.transactions().await;
    let server = TestServer::start(&db, move |config| {
        config.database.url = Some(pooled.into());
        config.database.listen_url = Some(direct.into());
        config.database.migrate = false;
        config.database.pool_size = 6;
        config.database.prepared_statements = false;
        config.admin.token = Some(ADMIN_TOKEN.into());
        config.webhooks.allow_private_networks = true;
        config.webhooks.workers = 3;
        config.webhooks.request_timeout_ms = 2_000;
        config.webhooks.lease_ms = 3_000;
        config.webhooks.retry_schedule_ms = vec![100, 100, 100];
        config.outbox.retention_secs = 3600;
        config.outbox.prune_interval_secs = 1;
        // Replays start right after Last-Event-ID, so what one holds is exact.
        config.sse.replay_lookback = 0;
    });
    server.ready().await;

    // The admin API: create a subscription, then find it listed.
    let (status, created) = admin(
        &server,
        reqwest::Method::POST,
        "/v1/admin/subscriptions",
        Some(json!({"id": "receiver", "url": receiver.url, "types": ["order.*"]})),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let (status, listed) = admin(
        &server,
        reqwest::Method::GET,
        "/v1/admin/subscriptions",
        None,
    )
    .await;
    assert_eq!(status, 200, "{listed}");
    assert_eq!(listed["subscriptions"][0]["id"], "receiver", "{listed}");

    // Publish through the HTTP API; a live subscriber gets the event.
    let (mut live, resync) = server
        .subscribe(&token("alice", "org-1", json!({})), None, "")
        .await;
    assert!(resync);
    let (status, published) = server
        .publish(json!({"type": "order.created", "scopeKey": "org-1", "lane": "durable", "data": {"n": 0}}))
        .await;
    assert_eq!(status, 200, "{published}");
    let first = seqs(&published)[0];
    let frame = live.next_event().await;
    assert_eq!(frame.event.as_deref(), Some("order.created"));
    assert_eq!(frame.seq(), Some(first));

    // The webhook: claimed, sent, and recorded as delivered.
    let sent = receiver.wait_for(1).await;
    assert_eq!(
        serde_json::from_slice::<Value>(&sent[0].body).unwrap()["seq"],
        first
    );
    let settled = eventually("the delivery was never recorded", || async {
        let all = deliveries(&db).await;
        (all.len() == 1 && all[0].0 != "pending").then_some(all)
    })
    .await;
    assert_eq!(
        settled,
        [("delivered".to_owned(), 1, Some("delivered".to_owned()))]
    );

    // Many requests at once share the pooler's few server connections:
    // every publish succeeds, the subscriber gets every event, and every
    // delivery is claimed and recorded once.
    let publishes = (1..=12).map(|n| {
        server.publish(json!({"type": "order.updated", "scopeKey": "org-1", "lane": "durable", "data": {"n": n}}))
    });
    let listings =
        (0..6).map(|_| admin(&server, reqwest::Method::GET, "/v1/admin/deliveries", None));
    let (published, listed) = tokio::join!(
        futures_util::future::join_all(publishes),
        futures_util::future::join_all(listings)
    );
    let mut expected = BTreeSet::new();
    for (status, body) in published {
        assert_eq!(status, 200, "{body}");
        expected.extend(seqs(&body));
    }
    for (status, body) in listed {
        assert_eq!(status, 200, "{body}");
    }
    let received: BTreeSet<i64> = live
        .events(expected.len())
        .await
        .iter()
        .map(|frame| frame.seq().unwrap())
        .collect();
    assert_eq!(received, expected);
    let settled = eventually("the deliveries never settled", || async {
        let all = deliveries(&db).await;
        (all.len() == 13 && all.iter().all(|d| d.0 != "pending")).then_some(all)
    })
    .await;
    assert!(
        settled
            .iter()
            .all(|d| *d == ("delivered".to_owned(), 1, Some("delivered".to_owned()))),
        "{settled:?}"
    );
    let (status, body) = admin(
        &server,
        reqwest::Method::GET,
        "/v1/admin/deliveries?status=delivered&limit=100",
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["deliveries"].as_array().unwrap().len(), 13, "{body}");

    // A replay from the outbox: a scope nobody watches has no tail here, so
    // a reconnect with Last-Event-ID is read from the table.
    let (status, published) = server
        .publish(json!([
            {"type": "note.added", "scopeKey": "org-cold", "lane": "durable", "data": {"n": 1}},
            {"type": "note.added", "scopeKey": "org-cold", "lane": "durable", "data": {"n": 2}},
            {"type": "note.added", "scopeKey": "org-cold", "lane": "durable", "data": {"n": 3}}
        ]))
        .await;
    assert_eq!(status, 200, "{published}");
    let cold = seqs(&published);
    let from_outbox = server
        .metric("eventrelay_replays_total{source=\"outbox\"}")
        .await;
    let (replay, resync) = server
        .subscribe(
            &token("bob", "org-cold", json!({})),
            Some(&cold[0].to_string()),
            "",
        )
        .await;
    assert!(!resync);
    let replayed_ids: Vec<i64> = replay
        .replayed
        .iter()
        .map(|frame| frame.seq().unwrap())
        .collect();
    assert_eq!(replayed_ids, cold[1..]);
    assert!(
        server
            .metric("eventrelay_replays_total{source=\"outbox\"}")
            .await
            > from_outbox,
        "the replay should have been read from the outbox"
    );

    // The janitor: rows written two hours ago go, the rest stay.
    let (status, published) = server
        .publish(json!([
            {"type": "note.added", "scopeKey": "org-old", "lane": "durable"},
            {"type": "note.added", "scopeKey": "org-old", "lane": "durable"}
        ]))
        .await;
    assert_eq!(status, 200, "{published}");
    let old_top = *seqs(&published).last().unwrap();
    let direct_client = db.connect().await;
    let kept = db.outbox_count().await - 2;
    direct_client
        .execute(
            &format!(
                "UPDATE {}.outbox SET written_at = now() - interval '2 hours' WHERE scope_key = 'org-old'",
                db.schema
            ),
            &[],
        )
        .await
        .unwrap();
    eventually("the janitor never pruned the old rows", || async {
        (db.outbox_count().await == kept).then_some(())
    })
    .await;
    let pruned_through: i64 = direct_client
        .query_one(
            &format!("SELECT pruned_through FROM {}.settings", db.schema),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(pruned_through, old_top);
    eventually("pruning was never counted", || async {
        (server.metric("eventrelay_outbox_rows_pruned_total").await >= 2.0).then_some(())
    })
    .await;

    // All of it went through the pooler, and the relay never lost a
    // connection on the way.
    let passed = bouncer.transactions().await - transactions_before;
    assert!(
        passed >= 20,
        "only {passed} transactions went through pgbouncer"
    );
    assert_eq!(
        server
            .metric("eventrelay_database_connections_dead_total")
            .await,
        0.0
    );
    let ready = reqwest::get(server.url("/readyz")).await.unwrap();
    assert_eq!(ready.status(), 200);
}

/// Runs `eventrelay migrate` on `url` with nothing else configured.
fn migrate(url: &str, db: &TestDb) -> (i32, String, String) {
    let output = crate::support::process::eventrelay_command()
        .args(["migrate", "--database-url", url])
        .args(["--schema", db.schema.as_str()])
        .args(["--channel", db.channel.as_str()])
        .output()
        .expect("the eventrelay binary runs");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8(output.stdout).unwrap(),
        String::from_utf8(output.stderr).unwrap(),
    )
}

#[tokio::test]
async fn migrate_runs_through_a_transaction_pooler() {
    let db = TestDb::unmigrated();
    let bouncer = PgBouncer::start().await;
    let pooled = bouncer.url(db.schema.as_str());
    let every: Vec<i32> = MIGRATIONS.iter().map(|m| m.version).collect();

    // Two processes at once on a fresh schema: the advisory lock is held
    // for the migration's transaction, which the pooler keeps on one server
    // connection, so one applies everything and the other finds it done.
    let (first, second) = std::thread::scope(|scope| {
        let one = scope.spawn(|| migrate(&pooled, &db));
        let two = scope.spawn(|| migrate(&pooled, &db));
        (one.join().unwrap(), two.join().unwrap())
    });
    let mut reports = Vec::new();
    for (code, stdout, stderr) in [first, second] {
        assert_eq!(
            code, 0,
            "migrate through pgbouncer failed:\n{stdout}{stderr}"
        );
        reports.push(stdout);
    }
    reports.sort_by_key(|stdout| stdout.contains("applied []"));
    assert!(
        reports[0].contains(&format!("applied {every:?}, 0 already")),
        "{reports:?}"
    );
    assert!(
        reports[1].contains(&format!("applied [], {} already in place", every.len())),
        "{reports:?}"
    );

    let direct = db.connect().await;
    let versions: Vec<i32> = db
        .column("SELECT version FROM {schema}.schema_migrations ORDER BY version")
        .await;
    assert_eq!(versions, every);
    let channel: String = direct
        .query_one(&format!("SELECT channel FROM {}.settings", db.schema), &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(channel, db.channel.as_str());
}

#[tokio::test]
async fn a_listen_url_through_a_transaction_pooler_is_refused_by_name() {
    let db = TestDb::new().await;
    let bouncer = PgBouncer::start().await;
    let pooled = bouncer.url(db.schema.as_str());
    let server = TestServer::start(&db, move |config| {
        // The mistake: LISTEN through the pooler (listen_url defaults to url).
        config.database.url = Some(pooled.into());
        config.database.migrate = false;
        config.database.listen_health_secs = 2;
        config.webhooks.enabled = false;
    });
    // The relay serves, but says it is not ready and why: a LISTEN that
    // succeeds yet never delivers is caught by the listener's own probe.
    let readyz = async || {
        let response = reqwest::get(server.url("/readyz")).await.unwrap();
        let status = response.status().as_u16();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        assert_ne!(status, 200, "ready with a deaf listener: {body}");
        (status, body)
    };
    let body = eventually("/readyz names the deaf listener", async || {
        let (_, body) = readyz().await;
        (body["listener"] == json!(false) && body["database"] == json!(true)).then_some(body)
    })
    .await;
    assert!(
        body["reason"].as_str().unwrap().contains("LISTEN"),
        "{body}"
    );
    // And it stays not ready over several probe rounds.
    let watching = std::time::Instant::now();
    while watching.elapsed() < Duration::from_secs(3) {
        let (status, body) = readyz().await;
        assert_eq!(status, 503, "{body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn prepared_statements_left_on_behind_the_pooler_cost_at_most_a_few_requests() {
    let db = TestDb::new().await;
    let bouncer = PgBouncer::start().await;
    let pooled = bouncer.url(db.schema.as_str());
    let direct = db.url.clone();
    let server = TestServer::start(&db, move |config| {
        // The mistake: the default (prepared statements on) kept behind a
        // pooler that does not track them.
        config.database.url = Some(pooled.into());
        config.database.listen_url = Some(direct.into());
        config.database.migrate = false;
        config.database.pool_size = 4;
        config.webhooks.enabled = false;
    });
    server.ready().await;
    let mut failed = 0;
    let mut written = Vec::new();
    for n in 0..40 {
        let (status, published) = server
            .publish(json!({"type": "t", "scopeKey": "org-1", "lane": "durable", "data": {"n": n}}))
            .await;
        if status == 200 {
            written.extend(seqs(&published));
        } else {
            assert_eq!(status, 503, "{published}");
            assert!(n < 10, "request {n} still failed: {published}");
            failed += 1;
        }
    }
    assert!(failed <= 4, "{failed} of 40 requests failed");
    assert_eq!(written.len(), 40 - failed);
    assert_eq!(db.outbox_count().await, written.len() as i64);
    // Reads through the pooler work too: the relay reads a live event back.
    let (mut live, _) = server
        .subscribe(&token("alice", "org-1", json!({})), None, "")
        .await;
    let (status, published) = server
        .publish(json!({"type": "t", "scopeKey": "org-1", "lane": "durable", "data": {}}))
        .await;
    assert_eq!(status, 200, "{published}");
    assert_eq!(live.next_event().await.seq(), Some(seqs(&published)[0]));
}
