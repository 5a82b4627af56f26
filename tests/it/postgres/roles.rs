//! Database roles and the notification channel as trust boundaries: a role
//! that can only log in learns nothing from the channel and cannot forge
//! on it; an emitter with only the grants `migrate --print-grants` gives
//! emits and can do nothing else; a relay running with the relay's grants
//! serves; pointers to what was delivered cost no read.

use crate::support::server::{TestServer, token};
use crate::support::{TestDb, block_on_own_thread, eventually};
use eventrelay::publisher::Identifier;
use eventrelay::publisher::{Audience, NewEvent};
use eventrelay::store::roles::{RoleNames, grants_sql};
use serde_json::json;
use tokio_postgres::Client;

/// Roles made for one test, dropped with it (roles belong to the whole
/// server, not to the test's schema).
struct TestRoles {
    db_url: String,
    names: Vec<String>,
}

impl TestRoles {
    /// Creates `<schema>_<suffix>` for each suffix, as a role that can log
    /// in and has no privilege beyond the database's defaults.
    async fn create(db: &TestDb, suffixes: &[&str]) -> TestRoles {
        let client = db.connect().await;
        let mut names = Vec::new();
        for suffix in suffixes {
            let name = format!("{}_{suffix}", db.schema);
            client
                .batch_execute(&format!("CREATE ROLE {name} LOGIN"))
                .await
                .unwrap();
            names.push(name);
        }
        TestRoles {
            db_url: db.url.clone(),
            names,
        }
    }
}

impl Drop for TestRoles {
    fn drop(&mut self) {
        let url = self.db_url.clone();
        let names = std::mem::take(&mut self.names);
        block_on_own_thread(async move {
            if let Ok(client) = eventrelay::connect(&url).await {
                for name in names {
                    let _ = client
                        .batch_execute(&format!(
                            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                               WHERE usename = '{name}';
                             DROP OWNED BY {name}; DROP ROLE {name}"
                        ))
                        .await;
                }
            }
        });
    }
}

/// The test database's URL, logging in as `role`.
fn url_as(db: &TestDb, role: &str) -> String {
    let mut url = reqwest::Url::parse(&db.url).unwrap();
    url.set_username(role).unwrap();
    url.set_password(None).unwrap();
    url.to_string()
}

async fn connect_as(db: &TestDb, role: &str) -> Client {
    eventrelay::connect(&url_as(db, role)).await.unwrap()
}

/// The SQLSTATE of a statement that must fail.
async fn refused(client: &Client, sql: &str) -> String {
    let error = client
        .batch_execute(sql)
        .await
        .expect_err("the statement is refused");
    error
        .code()
        .map(|c| c.code().to_owned())
        .unwrap_or_default()
}

const INSUFFICIENT_PRIVILEGE: &str = "42501";

/// Creates `<schema>_relay`, `<schema>_emitter` and a login role
/// `<schema>_<login>`, runs what `migrate --print-grants` prints, and
/// grants the login role `granted(&names)`.
async fn with_grants(
    db: &TestDb,
    login: &str,
    granted: impl Fn(&RoleNames) -> &Identifier,
) -> (TestRoles, RoleNames) {
    let roles = TestRoles::create(db, &["relay", "emitter", login]).await;
    let names = RoleNames {
        relay: Identifier::new(&roles.names[0]).unwrap(),
        emitter: Identifier::new(&roles.names[1]).unwrap(),
    };
    let owner = db.connect().await;
    owner
        .batch_execute(&grants_sql(&db.schema, &names))
        .await
        .unwrap();
    owner
        .batch_execute(&format!("GRANT {} TO {}", granted(&names), roles.names[2]))
        .await
        .unwrap();
    (roles, names)
}

#[tokio::test]
async fn a_role_that_can_only_log_in_reads_nothing_from_the_channel_and_forges_nothing() {
    let db = TestDb::new().await;
    let roles = TestRoles::create(&db, &["stranger"]).await;
    let stranger = connect_as(&db, &roles.names[0]).await;
    let server = TestServer::start(&db, |_| {});
    server.ready().await;
    let (mut stream, _) = server
        .subscribe(&token("alice", "org-1", json!({})), None, "")
        .await;

    // It can LISTEN (any role can), but what arrives is sealed.
    let (payloads, mut heard) = tokio::sync::mpsc::unbounded_channel();
    let (listener, mut connection) =
        tokio_postgres::connect(&url_as(&db, &roles.names[0]), tokio_postgres::NoTls)
            .await
            .unwrap();
    tokio::spawn(async move {
        use futures_util::StreamExt as _;
        let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(Ok(message)) = messages.next().await {
            if let tokio_postgres::AsyncMessage::Notification(n) = message {
                let _ = payloads.send(n.payload().to_owned());
            }
        }
    });
    listener
        .batch_execute(&format!("LISTEN {}", db.channel))
        .await
        .unwrap();
    db.emit(
        NewEvent::durable(
            "payroll.changed",
            "org-1",
            json!({"salary": "SECRET-SALARY"}),
        )
        .with_audience(Audience {
            users: None,
            permission: Some(json!("hr")),
        }),
    )
    .await;
    db.emit(NewEvent::ephemeral(
        "cursor.moved",
        "org-1",
        json!({"note": "SECRET-EPHEMERAL"}),
    ))
    .await;
    for _ in 0..2 {
        let payload = tokio::time::timeout(crate::support::DEADLINE, heard.recv())
            .await
            .expect("a notification arrives")
            .unwrap();
        for secret in ["SECRET", "payroll", "cursor", "org-1", "salary", "\"k\""] {
            assert!(
                !payload.contains(secret),
                "{secret:?} readable on the channel: {payload}"
            );
        }
    }

    // It can read no table, call no function, and not read the key.
    for sql in [
        format!("SELECT * FROM {}.outbox", db.schema),
        format!("SELECT * FROM {}.notify_key", db.schema),
        format!("SELECT {}.seal('P', '{{}}')", db.schema),
        format!("SELECT {}.emit('x', 'org-1')", db.schema),
    ] {
        assert_eq!(
            refused(&stranger, &sql).await,
            INSUFFICIENT_PRIVILEGE,
            "{sql}"
        );
    }

    // Whatever it sends on the channel is dropped and counted: an event, a
    // batch, a bare pointer, a pointer carrying invented rows, `due`.
    let forged_event = json!({"id": uuid::Uuid::new_v4(), "type": "forged", "scopeKey": "org-1",
        "lane": "ephemeral", "data": {}, "resources": [], "occurredAt": "2024-01-01T00:00:00Z"});
    let mut forged_row = forged_event.clone();
    forged_row["lane"] = json!("durable");
    forged_row["seq"] = json!(9_000_000);
    let forgeries = [
        json!({"k": "evt", "e": forged_event}).to_string(),
        json!({"k": "evts", "v": 1, "e": [forged_event]}).to_string(),
        json!({"k": "ptr", "s": "org-1", "q": 1}).to_string(),
        json!({"k": "ptr", "s": "org-1", "q": 9_000_000, "x": 99_999_999, "r": [forged_row]})
            .to_string(),
        json!({"k": "due"}).to_string(),
    ];
    for forged in &forgeries {
        stranger
            .execute("SELECT pg_notify($1, $2)", &[&db.channel.as_str(), forged])
            .await
            .unwrap();
    }
    let after = db
        .emit(NewEvent::durable("after.forgeries", "org-1", json!({})))
        .await;
    let frames = stream.events(2).await;
    assert_eq!(frames[0].json()["type"], "cursor.moved");
    assert_eq!(
        frames[1].json()["id"],
        after.id.to_string(),
        "no forgery was delivered"
    );
    let rejected = "eventrelay_notifications_rejected_total{reason=\"not_sealed\"}";
    assert_eq!(server.metric(rejected).await, forgeries.len() as f64);
}

#[tokio::test]
async fn an_emitter_with_only_its_grants_emits_and_can_do_nothing_else() {
    let db = TestDb::new().await;
    let (roles, _) = with_grants(&db, "app", |names| &names.emitter).await;
    let server = TestServer::start(&db, |_| {});
    server.ready().await;
    let (mut stream, _) = server
        .subscribe(&token("alice", "org-1", json!({})), None, "")
        .await;
    let app = connect_as(&db, &roles.names[2]).await;

    // The SQL function, the publisher crate's single and batch emits and
    // an ephemeral event all work with EXECUTE alone.
    app.execute(
        &format!("SELECT {}.emit('by.sql', 'org-1', '{{}}')", db.schema),
        &[],
    )
    .await
    .unwrap();
    let publisher = db.publisher();
    publisher
        .emit(&app, NewEvent::durable("by.crate", "org-1", json!({})))
        .await
        .unwrap();
    publisher
        .emit_batch(
            &app,
            vec![
                NewEvent::durable("by.batch", "org-1", json!({"n": 1})),
                NewEvent::durable("by.batch", "org-1", json!({"n": 2})),
            ],
        )
        .await
        .unwrap();
    publisher
        .emit(
            &app,
            NewEvent::ephemeral("by.ephemeral", "org-1", json!({})),
        )
        .await
        .unwrap();
    let types: Vec<String> = stream
        .events(5)
        .await
        .iter()
        .map(|f| f.json()["type"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        types,
        ["by.sql", "by.crate", "by.batch", "by.batch", "by.ephemeral"]
    );

    // Nothing else: no webhook tables, no secrets, no key, no seal, no
    // outbox of its own choosing.
    for sql in [
        format!(
            "INSERT INTO {}.webhook_deliveries (subscription_id, event_seq, event_id, event_type,
                 scope_key, payload) VALUES ('s', 1, gen_random_uuid(), 't', 'org-1', '{{}}')",
            db.schema
        ),
        format!("SELECT secret FROM {}.webhook_subscriptions", db.schema),
        format!("SELECT key FROM {}.notify_key", db.schema),
        format!("SELECT {}.seal('P', '{{\"k\":\"due\"}}')", db.schema),
        format!(
            "INSERT INTO {}.outbox (id, type, scope_key) VALUES (gen_random_uuid(), 'x', 'org-1')",
            db.schema
        ),
        format!(
            "SELECT {}.outbox_announce_rows('{{}}', '{{}}', '{{}}', '{{}}', '{{}}', '{{}}', '{{}}')",
            db.schema
        ),
    ] {
        assert_eq!(refused(&app, &sql).await, INSUFFICIENT_PRIVILEGE, "{sql}");
    }

    // What it may send inline is sealed as an emitter's: a pointer or a
    // `due` sent that way is dropped, never taken for the relay's own.
    for forged in [
        json!({"k": "due"}).to_string(),
        json!({"k": "ptr", "s": "org-1", "q": 9_000_000}).to_string(),
    ] {
        app.execute(
            &format!("SELECT {}.notify_inline($1)", db.schema),
            &[&forged],
        )
        .await
        .unwrap();
    }
    let after = db
        .emit(NewEvent::durable("after", "org-1", json!({})))
        .await;
    assert_eq!(stream.next_event().await.json()["id"], after.id.to_string());
    let rejected = "eventrelay_notifications_rejected_total{reason=\"emitter_kind\"}";
    assert_eq!(server.metric(rejected).await, 2.0);
}

#[tokio::test]
async fn a_relay_with_only_the_relay_grants_serves_publishes_prunes_and_disconnects() {
    let db = TestDb::new().await;
    let (roles, _) = with_grants(&db, "relay_login", |names| &names.relay).await;
    let url = url_as(&db, &roles.names[2]);
    let server = TestServer::start(&db, |c| {
        c.database.url = Some(url.into());
        c.database.migrate = false;
        c.outbox.prune_interval_secs = 1;
        c.admin.token = Some("admin-token-for-the-relay-role".into());
    });
    server.ready().await;
    let (mut stream, _) = server
        .subscribe(&token("alice", "org-1", json!({})), None, "")
        .await;
    let (status, answer) = server
        .publish(json!([
            {"type": "published", "scopeKey": "org-1", "lane": "durable", "data": {}},
            {"type": "published.now", "scopeKey": "org-1", "lane": "ephemeral", "data": {}}
        ]))
        .await;
    assert_eq!(status, 200, "{answer}");
    let emitted = db
        .emit(NewEvent::durable("emitted", "org-1", json!({})))
        .await;
    let frames = stream.events(3).await;
    assert_eq!(frames[0].json()["type"], "published");
    assert_eq!(frames[1].json()["type"], "published.now");
    assert_eq!(frames[2].json()["id"], emitted.id.to_string());

    // It prunes: rows past retention go.
    db.connect()
        .await
        .batch_execute(&format!(
            "UPDATE {}.outbox SET written_at = now() - interval '30 days'",
            db.schema
        ))
        .await
        .unwrap();
    server
        .wait_for_metric("eventrelay_outbox_rows_pruned_total", |n| n >= 2.0)
        .await;
    // It records and applies disconnections.
    let response = reqwest::Client::new()
        .post(server.url("/v1/admin/subscribers/alice/disconnect"))
        .bearer_auth("admin-token-for-the-relay-role")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(stream.last_event().await.as_deref(), Some("revoked"));
}

#[tokio::test]
async fn pointers_to_delivered_or_old_rows_cost_no_read() {
    const READS: &str = "eventrelay_outbox_read_seconds_count";
    const IGNORED: &str = "eventrelay_pointers_ignored_total";
    let db = TestDb::new().await;
    let server = TestServer::start(&db, |_| {});
    server.ready().await;
    let (mut stream, _) = server
        .subscribe(&token("alice", "org-1", json!({})), None, "")
        .await;
    let first = db.emit(NewEvent::durable("n", "org-1", json!({}))).await;
    assert_eq!(stream.next_event().await.json()["id"], first.id.to_string());
    // The scope's one read, at activation.
    let reads = server.wait_for_metric(READS, |n| n >= 1.0).await;
    // Even sealed (as only the owner or the relay's role could), a pointer
    // to what was delivered announces nothing new.
    for _ in 0..10 {
        let pointer = json!({"k": "ptr", "s": "org-1", "q": first.seq.unwrap()});
        db.notify_sealed(&pointer.to_string()).await;
    }
    eventually("every pointer was weighed", async || {
        (server.metric(IGNORED).await >= 10.0).then_some(())
    })
    .await;
    let next = db.emit(NewEvent::durable("n", "org-1", json!({}))).await;
    assert_eq!(stream.next_event().await.json()["id"], next.id.to_string());
    assert_eq!(server.metric(IGNORED).await, 10.0);
    assert_eq!(server.metric(READS).await, reads, "no read for any of them");
}
