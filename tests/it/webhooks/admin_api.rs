//! The admin API (`/v1/admin/*`) and the `eventrelay deliveries` command,
//! against a real server and Postgres. Deliveries are made the way
//! production makes them: by emitting durable events, which the outbox
//! trigger turns into one delivery per matching subscription. The
//! dispatcher is switched off so nothing changes a delivery behind a test's
//! back.

use crate::support::TestDb;
use crate::support::server::{PUBLISH_TOKEN, TestServer};
use chrono::{DateTime, Utc};
use eventrelay::publisher::{NewEvent, PgExecutor, Publisher, WebhookSecret};
use eventrelay::webhooks::NewSubscription;
use eventrelay::webhooks::WebhookStore;
use reqwest::Method;
use serde_json::{Value, json};
use uuid::Uuid;

const ADMIN_TOKEN: &str = "admin-token-for-tests-123";
const GRACE_SECS: u64 = 3600;

fn start(db: &TestDb) -> TestServer {
    TestServer::start(db, |config| {
        config.admin.token = Some(ADMIN_TOKEN.into());
        config.webhooks.enabled = false;
        config.webhooks.rotation_grace_secs = GRACE_SECS;
    })
}

/// Calls the admin API with the right token unless told otherwise.
async fn call(
    server: &TestServer,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    call_as(server, Some(ADMIN_TOKEN), method, path, body).await
}

async fn call_as(
    server: &TestServer,
    token: Option<&str>,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut request = reqwest::Client::new().request(method, server.url(path));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    let body = if text.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: not JSON ({e}): {text}"))
    };
    (status, body)
}

async fn create(server: &TestServer, body: Value) -> Value {
    let (status, created) = call(server, Method::POST, "/v1/admin/subscriptions", Some(body)).await;
    assert_eq!(status, 201, "{created}");
    created
}

async fn emit(db: &TestDb, client: &impl PgExecutor, event_type: &str, scope: &str) -> Uuid {
    db.emit_in(client, NewEvent::durable(event_type, scope, json!({})))
        .await
        .id
}

/// The subscriptions that got a delivery for `event`, sorted.
async fn delivered_to(server: &TestServer, event: Uuid) -> Vec<String> {
    let (status, body) = call(
        server,
        Method::GET,
        &format!("/v1/admin/deliveries?eventId={event}"),
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let mut ids: Vec<String> = body["deliveries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["subscriptionId"].as_str().unwrap().to_owned())
        .collect();
    ids.sort();
    ids
}

fn delivery_ids(body: &Value) -> Vec<i64> {
    body["deliveries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["id"].as_i64().unwrap())
        .collect()
}

fn assert_error(status: u16, body: &Value, expected_status: u16, code: &str) {
    assert_eq!(status, expected_status, "{body}");
    assert_eq!(body["error"]["code"], code, "{body}");
}

/// A query-string value with the characters a time carries escaped.
fn urlencoding(value: &str) -> String {
    value.replace('+', "%2B").replace(':', "%3A")
}

/// No secret (current or previous) in a subscription as shown.
fn assert_no_secret(subscription: &Value) {
    let keys: Vec<&String> = subscription.as_object().unwrap().keys().collect();
    assert!(
        !keys
            .iter()
            .any(|k| *k == "secret" || *k == "previousSecret"),
        "{subscription}"
    );
}

#[tokio::test]
async fn the_admin_api_is_off_without_a_token_and_refuses_wrong_ones() {
    let db = TestDb::new().await;
    let off = TestServer::start(&db, |config| config.webhooks.enabled = false);
    off.ready().await;
    for path in ["/v1/admin/subscriptions", "/v1/admin/deliveries"] {
        let (status, body) = call(&off, Method::GET, path, None).await;
        assert_error(status, &body, 403, "admin_disabled");
    }
    drop(off);

    let server = start(&db);
    server.ready().await;
    let path = "/v1/admin/subscriptions";
    let response = reqwest::get(server.url(path)).await.unwrap();
    assert_eq!(response.status(), 401);
    assert_eq!(response.headers()["www-authenticate"], "Bearer");
    for token in [None, Some("wrong-token-wrong-token"), Some(PUBLISH_TOKEN)] {
        let (status, body) = call_as(&server, token, Method::GET, path, None).await;
        assert_error(status, &body, 401, "unauthorized");
    }
    // The token is checked before the body is read.
    let (status, body) = call_as(&server, None, Method::POST, path, Some(json!("junk"))).await;
    assert_error(status, &body, 401, "unauthorized");
    let (status, body) = call(&server, Method::GET, path, None).await;
    assert_eq!((status, body), (200, json!({"subscriptions": []})));
}

#[tokio::test]
async fn subscriptions_are_created_read_changed_rotated_and_deleted() {
    let db = TestDb::new().await;
    let server = start(&db);
    server.ready().await;

    // Without a secret, one is generated and shown once.
    let created = create(
        &server,
        json!({"id": "billing", "url": "https://example.com/hooks"}),
    )
    .await;
    let generated = created["secret"].as_str().unwrap().to_owned();
    assert!(generated.starts_with("whsec_"), "{generated}");
    let subscription = &created["subscription"];
    assert_no_secret(subscription);
    assert_eq!(subscription["id"], "billing");
    assert_eq!(subscription["types"], json!(["*"]));
    assert_eq!(subscription["scopeKey"], Value::Null);
    assert_eq!(subscription["source"], "api");
    assert_eq!(subscription["previousSecretExpiresAt"], Value::Null);

    let given = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let created = create(
        &server,
        json!({"id": "audit", "url": "http://example.com/a", "secret": given,
               "types": ["order.*", "invoice.paid"], "scopeKey": "org-1"}),
    )
    .await;
    assert_eq!(created["secret"], given);
    assert_eq!(
        created["subscription"]["types"],
        json!(["order.*", "invoice.paid"])
    );
    assert_eq!(created["subscription"]["scopeKey"], "org-1");

    let (status, body) = call(
        &server,
        Method::POST,
        "/v1/admin/subscriptions",
        Some(json!({"id": "audit", "url": "https://example.com/other"})),
    )
    .await;
    assert_error(status, &body, 409, "conflict");

    // Listing and reading never show a secret.
    let (status, list) = call(&server, Method::GET, "/v1/admin/subscriptions", None).await;
    assert_eq!(status, 200);
    let ids: Vec<&str> = list["subscriptions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["audit", "billing"]);
    list["subscriptions"]
        .as_array()
        .unwrap()
        .iter()
        .for_each(assert_no_secret);
    assert!(!list.to_string().contains("whsec_"), "{list}");
    let (status, one) = call(
        &server,
        Method::GET,
        "/v1/admin/subscriptions/billing",
        None,
    )
    .await;
    assert_eq!(status, 200);
    assert_no_secret(&one["subscription"]);
    assert!(!one.to_string().contains(&generated));
    let (status, body) = call(&server, Method::GET, "/v1/admin/subscriptions/nope", None).await;
    assert_error(status, &body, 404, "not_found");

    // Patching changes only what is given; a null scope key clears it.
    let (status, patched) = call(
        &server,
        Method::PATCH,
        "/v1/admin/subscriptions/audit",
        Some(json!({"url": "https://example.com/b", "types": ["order.created"]})),
    )
    .await;
    assert_eq!(status, 200, "{patched}");
    assert_eq!(patched["subscription"]["url"], "https://example.com/b");
    assert_eq!(patched["subscription"]["types"], json!(["order.created"]));
    assert_eq!(patched["subscription"]["scopeKey"], "org-1");
    assert_no_secret(&patched["subscription"]);
    let (status, patched) = call(
        &server,
        Method::PATCH,
        "/v1/admin/subscriptions/audit",
        Some(json!({"scopeKey": null})),
    )
    .await;
    assert_eq!(status, 200, "{patched}");
    assert_eq!(patched["subscription"]["scopeKey"], Value::Null);
    assert_eq!(patched["subscription"]["url"], "https://example.com/b");
    let (status, body) = call(
        &server,
        Method::PATCH,
        "/v1/admin/subscriptions/nope",
        Some(json!({"url": "https://example.com/c"})),
    )
    .await;
    assert_error(status, &body, 404, "not_found");

    // Rotation: a new secret, shown once; the old one keeps signing for the
    // grace window.
    let before_rotation = Utc::now();
    let (status, rotated) = call(
        &server,
        Method::POST,
        "/v1/admin/subscriptions/billing/rotate-secret",
        None,
    )
    .await;
    assert_eq!(status, 200, "{rotated}");
    let new_secret = rotated["secret"].as_str().unwrap();
    assert!(new_secret.starts_with("whsec_") && new_secret != generated);
    assert_no_secret(&rotated["subscription"]);
    let expires: DateTime<Utc> = rotated["previousSecretExpiresAt"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let grace = chrono::Duration::seconds(GRACE_SECS as i64);
    assert!(expires >= before_rotation + grace && expires <= Utc::now() + grace);
    assert_eq!(
        rotated["subscription"]["previousSecretExpiresAt"],
        rotated["previousSecretExpiresAt"]
    );
    let stored = WebhookStore::new(&db.schema)
        .get_subscription(&db.connect().await, "billing")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.signing_secrets(Utc::now()), [new_secret, &generated]);
    let (status, body) = call(
        &server,
        Method::POST,
        "/v1/admin/subscriptions/nope/rotate-secret",
        None,
    )
    .await;
    assert_error(status, &body, 404, "not_found");

    let (status, body) = call(
        &server,
        Method::DELETE,
        "/v1/admin/subscriptions/billing",
        None,
    )
    .await;
    assert_eq!((status, body), (204, Value::Null));
    let (status, body) = call(
        &server,
        Method::GET,
        "/v1/admin/subscriptions/billing",
        None,
    )
    .await;
    assert_error(status, &body, 404, "not_found");
    let (status, body) = call(
        &server,
        Method::DELETE,
        "/v1/admin/subscriptions/billing",
        None,
    )
    .await;
    assert_error(status, &body, 404, "not_found");
}

#[tokio::test]
async fn malformed_subscriptions_are_refused_with_the_field_named() {
    let db = TestDb::new().await;
    let server = start(&db);
    server.ready().await;
    let url = "https://example.com/hooks";
    for (body, field) in [
        (json!({"id": "bad id!", "url": url}), "id:"),
        (json!({"id": "ok", "url": "ftp://example.com"}), "url:"),
        (json!({"id": "ok", "url": url, "types": []}), "types:"),
        (json!({"id": "ok", "url": url, "types": ["a*b"]}), "types:"),
        (
            json!({"id": "ok", "url": url, "secret": "whsec_!!!"}),
            "secret:",
        ),
        (json!({"id": "ok", "url": url, "scopeKey": ""}), "scopeKey:"),
        (json!({"id": "ok", "url": url, "colour": "red"}), "colour"),
        (json!({"url": url}), "id"),
        (json!([1, 2]), "invalid body"),
    ] {
        let (status, error) = call(
            &server,
            Method::POST,
            "/v1/admin/subscriptions",
            Some(body.clone()),
        )
        .await;
        assert_error(status, &error, 400, "invalid_body");
        let message = error["error"]["message"].as_str().unwrap();
        assert!(message.contains(field), "{body}: {message}");
    }
    create(&server, json!({"id": "ok", "url": url})).await;
    for patch in [
        json!({"types": ["*x"]}),
        json!({"url": "mailto:a@b"}),
        json!({"secret": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}),
        json!({"scopeKey": ""}),
    ] {
        let (status, error) = call(
            &server,
            Method::PATCH,
            "/v1/admin/subscriptions/ok",
            Some(patch.clone()),
        )
        .await;
        assert_error(status, &error, 400, "invalid_body");
    }
    let (_, list) = call(&server, Method::GET, "/v1/admin/subscriptions", None).await;
    assert_eq!(list["subscriptions"].as_array().unwrap().len(), 1);
}

/// Secrets of `bytes` bytes in both forms: UTF-8 text, and `whsec_` with
/// that many bytes once decoded; not one byte repeated, which is refused
/// whatever its length.
fn secrets_of(bytes: usize) -> [String; 2] {
    let varied: Vec<u8> = (0..bytes).map(|n| b'a' + (n % 26) as u8).collect();
    [
        String::from_utf8(varied.clone()).unwrap(),
        WebhookSecret::from_bytes(varied).to_whsec(),
    ]
}

#[tokio::test]
async fn a_secret_shorter_than_24_bytes_is_refused_wherever_it_is_given() {
    let db = TestDb::new().await;
    let server = start(&db);
    server.ready().await;
    let url = "https://example.com/hooks";

    for (n, short) in secrets_of(23).iter().enumerate() {
        let body = json!({"id": format!("short-{n}"), "url": url, "secret": short});
        let (status, error) =
            call(&server, Method::POST, "/v1/admin/subscriptions", Some(body)).await;
        assert_error(status, &error, 400, "weak_secret");
        let message = error["error"]["message"].as_str().unwrap();
        assert!(
            message.starts_with("secret:") && message.contains("23 bytes"),
            "{short}: {message}"
        );
    }
    for (n, enough) in secrets_of(24).iter().enumerate() {
        let created = create(
            &server,
            json!({"id": format!("enough-{n}"), "url": url, "secret": enough}),
        )
        .await;
        assert_eq!(&created["secret"], enough);
    }

    // The command line, with the same rule.
    let sub = |args: &[&str]| run(&db, "subscriptions", args);
    for (n, short) in secrets_of(23).iter().enumerate() {
        let id = format!("cli-short-{n}");
        let (code, stdout, stderr) = sub(&["create", "--id", &id, "--url", url, "--secret", short]);
        assert_eq!((code, stdout.as_str()), (1, ""), "{short}: {stderr}");
        assert!(stderr.contains("at least 24"), "{short}: {stderr}");
    }
    for (n, enough) in secrets_of(24).iter().enumerate() {
        let id = format!("cli-enough-{n}");
        let (code, stdout, stderr) =
            sub(&["create", "--id", &id, "--url", url, "--secret", enough]);
        assert_eq!(code, 0, "{enough}: {stderr}");
        assert_eq!(&json_lines(&stdout)[0]["secret"], enough);
    }
    let (_, stdout, _) = sub(&["list"]);
    let mut ids: Vec<String> = json_lines(&stdout)
        .iter()
        .map(|s| s["id"].as_str().unwrap().to_owned())
        .collect();
    ids.sort();
    assert_eq!(
        ids,
        ["cli-enough-0", "cli-enough-1", "enough-0", "enough-1"],
        "nothing refused was written"
    );

    // The configuration: `check-config` refuses it, naming the setting.
    let dir = std::env::temp_dir().join(format!("{}-secrets", db.schema));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("eventrelay.toml");
    for (short, enough) in secrets_of(23).iter().zip(&secrets_of(24)) {
        for (secret, valid) in [(short, false), (enough, true)] {
            std::fs::write(
                &file,
                format!(
                    "[[webhooks.subscriptions]]\nid = \"configured\"\nurl = \"{url}\"\n\
                     secret = \"{secret}\"\n"
                ),
            )
            .unwrap();
            let (code, _, stderr) = run(&db, "check-config", &["--config", file.to_str().unwrap()]);
            if valid {
                assert_eq!(code, 0, "{secret}: {stderr}");
            } else {
                assert_ne!(code, 0, "{secret} was accepted");
                assert!(
                    stderr.contains("webhooks.subscriptions")
                        && stderr.contains("configured: secret:")
                        && stderr.contains("at least 24"),
                    "{secret}: {stderr}"
                );
            }
        }
    }
    std::fs::remove_dir_all(dir).ok();
}

#[tokio::test]
async fn configured_subscriptions_can_be_read_but_not_changed() {
    let db = TestDb::new().await;
    let configured = NewSubscription {
        id: "from-config".into(),
        url: "https://example.com/configured".into(),
        secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".into(),
        types: vec!["order.*".into()],
        scope_key: None,
        max_per_second: None,
        ordering: Default::default(),
        ordering_max_block_secs: None,
    };
    let in_config = configured.clone();
    let server = TestServer::start(&db, move |config| {
        config.admin.token = Some(ADMIN_TOKEN.into());
        config.webhooks.enabled = false;
        config.webhooks.subscriptions = vec![in_config];
    });
    server.ready().await;
    // Whether or not the server has synced its configuration yet, the row
    // is there once this returns.
    WebhookStore::new(&db.schema)
        .sync_config_subscriptions(&db.connect().await, &[configured])
        .await
        .unwrap();

    let path = "/v1/admin/subscriptions/from-config";
    let (status, body) = call(&server, Method::GET, path, None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["subscription"]["source"], "config");
    assert_no_secret(&body["subscription"]);
    let refusals = [
        (
            Method::PATCH,
            path.to_owned(),
            Some(json!({"url": "https://example.com/x"})),
        ),
        (Method::DELETE, path.to_owned(), None),
        (Method::POST, format!("{path}/rotate-secret"), None),
        (
            Method::POST,
            "/v1/admin/subscriptions".to_owned(),
            Some(json!({"id": "from-config", "url": "https://example.com/x"})),
        ),
    ];
    for (method, path, body) in refusals {
        let (status, error) = call(&server, method.clone(), &path, body).await;
        assert_error(status, &error, 409, "conflict");
        if method != Method::POST || path.ends_with("rotate-secret") {
            let message = error["error"]["message"].as_str().unwrap();
            assert!(message.contains("edit the configuration"), "{message}");
        }
    }
    let (_, after) = call(&server, Method::GET, path, None).await;
    assert_eq!(after, body, "nothing changed");
}

#[tokio::test]
async fn patterns_scopes_lanes_and_rollbacks_decide_which_deliveries_exist() {
    let db = TestDb::new().await;
    let server = start(&db);
    server.ready().await;
    let url = "https://example.com/hooks";
    for (id, types, scope) in [
        ("exact", json!(["order.created"]), Value::Null),
        ("prefix", json!(["order.*"]), Value::Null),
        ("all", json!(["*"]), Value::Null),
        ("scoped", json!(["*"]), json!("org-2")),
        ("other", json!(["invoice.paid"]), Value::Null),
    ] {
        create(
            &server,
            json!({"id": id, "url": url, "types": types, "scopeKey": scope}),
        )
        .await;
    }
    let mut client = db.connect().await;

    let created = emit(&db, &client, "order.created", "org-1").await;
    assert_eq!(
        delivered_to(&server, created).await,
        ["all", "exact", "prefix"]
    );
    let shipped = emit(&db, &client, "order.shipped", "org-2").await;
    assert_eq!(
        delivered_to(&server, shipped).await,
        ["all", "prefix", "scoped"]
    );
    // `order.*` is a prefix up to the dot, not any string starting `order`.
    let orders = emit(&db, &client, "orders.created", "org-1").await;
    assert_eq!(delivered_to(&server, orders).await, ["all"]);
    let invoice = emit(&db, &client, "invoice.paid", "org-3").await;
    assert_eq!(delivered_to(&server, invoice).await, ["all", "other"]);

    // Ephemeral events are never delivered by webhook.
    let ephemeral = Publisher::new(db.schema.as_str())
        .unwrap()
        .emit(
            &client,
            NewEvent::ephemeral("order.created", "org-1", json!({})),
        )
        .await
        .unwrap();
    assert!(delivered_to(&server, ephemeral.id).await.is_empty());

    // A rolled-back transaction takes its deliveries with it.
    let tx = client.transaction().await.unwrap();
    let rolled_back = emit(&db, &tx, "order.created", "org-1").await;
    tx.rollback().await.unwrap();
    assert!(delivered_to(&server, rolled_back).await.is_empty());

    let (_, all) = call(&server, Method::GET, "/v1/admin/deliveries", None).await;
    assert_eq!(delivery_ids(&all).len(), 3 + 3 + 1 + 2);
}

#[tokio::test]
async fn deliveries_are_listed_newest_first_with_filters_and_pages() {
    let db = TestDb::new().await;
    let server = start(&db);
    server.ready().await;
    let url = "https://example.com/hooks";
    create(&server, json!({"id": "a", "url": url})).await;
    create(
        &server,
        json!({"id": "b", "url": url, "types": ["order.*"], "scopeKey": "org-1"}),
    )
    .await;
    let client = db.connect().await;
    let mut events = Vec::new();
    for (scope, event_type) in [
        ("org-1", "order.created"),
        ("org-1", "order.created"),
        ("org-1", "order.paid"),
        ("org-2", "order.created"),
        ("org-2", "order.created"),
    ] {
        events.push(emit(&db, &client, event_type, scope).await);
    }

    let (status, all) = call(&server, Method::GET, "/v1/admin/deliveries", None).await;
    assert_eq!(status, 200, "{all}");
    let ids = delivery_ids(&all);
    assert_eq!(ids.len(), 8);
    assert!(ids.windows(2).all(|w| w[0] > w[1]), "newest first: {ids:?}");
    assert_eq!(all["nextBefore"], Value::Null);
    let first = &all["deliveries"][0];
    for field in [
        "subscriptionId",
        "eventSeq",
        "eventId",
        "eventType",
        "scopeKey",
        "status",
        "attempts",
        "nextAttemptAt",
        "lastStatus",
        "lastError",
        "createdAt",
        "updatedAt",
    ] {
        assert!(first.get(field).is_some(), "{field} missing: {first}");
    }

    let count = |query: String| {
        let server = &server;
        async move {
            let (status, body) = call(
                server,
                Method::GET,
                &format!("/v1/admin/deliveries?{query}"),
                None,
            )
            .await;
            assert_eq!(status, 200, "{query}: {body}");
            body["deliveries"].as_array().unwrap().clone()
        }
    };
    let org2 = count("scopeKey=org-2".into()).await;
    assert_eq!(org2.len(), 2);
    assert!(
        org2.iter()
            .all(|d| d["scopeKey"] == "org-2" && d["subscriptionId"] == "a")
    );
    assert_eq!(count("subscriptionId=b".into()).await.len(), 3);
    assert_eq!(count(format!("eventId={}", events[0])).await.len(), 2);
    assert_eq!(
        count("subscriptionId=b&scopeKey=org-2".into()).await.len(),
        0
    );
    assert_eq!(count(format!("before={}", ids[5])).await.len(), 2);
    let paid = count("eventType=order.paid".into()).await;
    assert_eq!(paid.len(), 2);
    assert!(paid.iter().all(|d| d["eventId"] == events[2].to_string()));
    assert_eq!(count("eventType=order.*".into()).await.len(), 0, "exact");
    // Times bound `createdAt`: since is inclusive, until exclusive.
    let created = all["deliveries"][0]["createdAt"].as_str().unwrap();
    let created: chrono::DateTime<Utc> = created.parse().unwrap();
    let at = |t: chrono::DateTime<Utc>| urlencoding(&t.to_rfc3339());
    let second = chrono::Duration::seconds(1);
    assert_eq!(
        count(format!("since={}", at(created + second))).await.len(),
        0
    );
    assert_eq!(
        count(format!("until={}", at(created - second * 60)))
            .await
            .len(),
        0
    );
    assert_eq!(
        count(format!(
            "since={}&until={}",
            at(created - second * 60),
            at(created + second)
        ))
        .await
        .len(),
        8
    );
    // Empty parameters are no filter at all.
    assert_eq!(
        count(
            "scopeKey=&status=&eventId=&subscriptionId=&eventType=&since=&until=&before=&limit="
                .into()
        )
        .await
        .len(),
        8
    );

    assert_eq!(count("status=pending".into()).await.len(), 8);
    db.connect()
        .await
        .execute(
            &format!(
                "UPDATE {}.webhook_deliveries SET status = 'dead' WHERE id = $1",
                db.schema
            ),
            &[&ids[2]],
        )
        .await
        .unwrap();
    let dead = count("status=dead".into()).await;
    assert_eq!((dead.len(), &dead[0]["id"]), (1, &json!(ids[2])));
    assert_eq!(count("status=delivered".into()).await.len(), 0);

    let (status, body) = call(
        &server,
        Method::GET,
        "/v1/admin/deliveries?status=lost",
        None,
    )
    .await;
    assert_error(status, &body, 400, "invalid_query");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("pending, delivered, dead, gone"),
        "{message}"
    );
    for bad in [
        "limit=0",
        "limit=501",
        "limit=x",
        "before=x",
        "eventId=x",
        "color=red",
        "since=yesterday",
        "until=2026-13-01T00:00:00Z",
    ] {
        let (status, body) = call(
            &server,
            Method::GET,
            &format!("/v1/admin/deliveries?{bad}"),
            None,
        )
        .await;
        assert_error(status, &body, 400, "invalid_query");
    }

    // Paging: follow nextBefore until it is null; every delivery once, in order.
    for limit in [3, 4] {
        let mut seen: Vec<i64> = Vec::new();
        let mut before: Option<i64> = None;
        let mut pages = 0;
        loop {
            let cursor = before.map(|b| format!("&before={b}")).unwrap_or_default();
            let (status, page) = call(
                &server,
                Method::GET,
                &format!("/v1/admin/deliveries?limit={limit}{cursor}"),
                None,
            )
            .await;
            assert_eq!(status, 200, "{page}");
            let page_ids = delivery_ids(&page);
            pages += 1;
            assert!(page_ids.len() <= limit);
            seen.extend(&page_ids);
            match page["nextBefore"].as_i64() {
                Some(next) => {
                    assert_eq!(page_ids.len(), limit, "only a full page has a cursor");
                    assert_eq!(Some(&next), page_ids.last());
                    before = Some(next);
                }
                None => break,
            }
            assert!(pages < 10, "paging does not end");
        }
        assert_eq!(seen, ids, "limit {limit}");
        // 8 in pages of 3: 3+3+2; in pages of 4: 4+4 and an empty last page.
        assert_eq!(pages, 3, "limit {limit}");
    }
}

#[tokio::test]
async fn a_delivery_shows_its_attempts_and_redelivery_starts_it_over() {
    let db = TestDb::new().await;
    let server = start(&db);
    server.ready().await;
    create(
        &server,
        json!({"id": "a", "url": "https://example.com/hooks"}),
    )
    .await;
    let client = db.connect().await;
    let event = emit(&db, &client, "order.created", "org-1").await;
    let (_, list) = call(&server, Method::GET, "/v1/admin/deliveries", None).await;
    let id = delivery_ids(&list)[0];
    let path = format!("/v1/admin/deliveries/{id}");

    let (status, fresh) = call(&server, Method::GET, &path, None).await;
    assert_eq!(status, 200, "{fresh}");
    assert_eq!(fresh["delivery"]["id"], id);
    assert_eq!(fresh["delivery"]["eventId"], event.to_string());
    assert_eq!(fresh["delivery"]["status"], "pending");
    assert_eq!(fresh["delivery"]["attempts"], 0);
    assert_eq!(fresh["attempts"], json!([]));

    // Two failed attempts, the second giving up, as the dispatcher records them.
    let schema = &db.schema;
    client
        .batch_execute(&format!(
            "INSERT INTO {schema}.webhook_attempts
                 (delivery_id, attempt, started_at, duration_ms, status_code, error, outcome)
             VALUES ({id}, 1, now() - interval '1 hour', 120, 500, 'HTTP 500', 'retry'),
                    ({id}, 2, now() - interval '1 minute', 80, NULL, 'connection refused', 'dead');
             UPDATE {schema}.webhook_deliveries
             SET status = 'dead', attempts = 2, last_error = 'connection refused',
                 next_attempt_at = now() + interval '1 day'
             WHERE id = {id}"
        ))
        .await
        .unwrap();
    let (status, dead) = call(&server, Method::GET, &path, None).await;
    assert_eq!(status, 200);
    assert_eq!(dead["delivery"]["status"], "dead");
    assert_eq!(dead["delivery"]["attempts"], 2);
    assert_eq!(dead["delivery"]["lastError"], "connection refused");
    let attempts = dead["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2);
    assert_eq!(attempts[0]["attempt"], 1);
    assert_eq!(attempts[0]["statusCode"], 500);
    assert_eq!(attempts[0]["durationMs"], 120);
    assert_eq!(attempts[0]["outcome"], "retry");
    assert_eq!(attempts[1]["statusCode"], Value::Null);
    assert_eq!(attempts[1]["error"], "connection refused");
    assert_eq!(attempts[1]["outcome"], "dead");
    assert!(attempts[0]["startedAt"].is_string());

    let (status, redelivered) =
        call(&server, Method::POST, &format!("{path}/redeliver"), None).await;
    assert_eq!(status, 200, "{redelivered}");
    assert_eq!(redelivered["delivery"]["status"], "pending");
    assert_eq!(redelivered["delivery"]["attempts"], 0);
    let next: DateTime<Utc> = redelivered["delivery"]["nextAttemptAt"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let now: DateTime<Utc> = client.query_one("SELECT now()", &[]).await.unwrap().get(0);
    assert!(next <= now, "due at once: {next} vs {now}");
    // The log of earlier attempts is kept.
    assert_eq!(redelivered["attempts"].as_array().unwrap().len(), 2);

    for missing in ["999999999", "abc"] {
        let (status, body) = call(
            &server,
            Method::GET,
            &format!("/v1/admin/deliveries/{missing}"),
            None,
        )
        .await;
        assert_error(status, &body, 404, "not_found");
        let (status, body) = call(
            &server,
            Method::POST,
            &format!("/v1/admin/deliveries/{missing}/redeliver"),
            None,
        )
        .await;
        assert_error(status, &body, 404, "not_found");
    }
}

#[tokio::test]
async fn pruning_deletes_only_finished_deliveries_older_than_the_cutoff() {
    let db = TestDb::new().await;
    let server = start(&db);
    server.ready().await;
    create(
        &server,
        json!({"id": "a", "url": "https://example.com/hooks"}),
    )
    .await;
    let client = db.connect().await;
    for _ in 0..5 {
        emit(&db, &client, "order.created", "org-1").await;
    }
    let (_, list) = call(&server, Method::GET, "/v1/admin/deliveries", None).await;
    let ids = delivery_ids(&list);
    let schema = &db.schema;
    // Old: delivered, dead, gone, pending. Recent: delivered.
    client
        .batch_execute(&format!(
            "UPDATE {schema}.webhook_deliveries SET updated_at = now() - interval '10 days',
                 status = CASE id WHEN {} THEN 'delivered' WHEN {} THEN 'dead' WHEN {} THEN 'gone' ELSE 'pending' END
             WHERE id IN ({}, {}, {}, {});
             UPDATE {schema}.webhook_deliveries SET status = 'delivered' WHERE id = {};
             INSERT INTO {schema}.webhook_attempts (delivery_id, attempt, started_at, duration_ms, status_code, outcome)
             VALUES ({}, 1, now() - interval '10 days', 5, 200, 'delivered')",
            ids[0], ids[1], ids[2], ids[0], ids[1], ids[2], ids[3], ids[4], ids[0]
        ))
        .await
        .unwrap();

    let cutoff = (Utc::now() - chrono::Duration::days(1)).to_rfc3339();
    let (status, body) = call(
        &server,
        Method::POST,
        "/v1/admin/deliveries/prune",
        Some(json!({"before": cutoff})),
    )
    .await;
    assert_eq!((status, body), (200, json!({"pruned": 3})));
    let (_, list) = call(&server, Method::GET, "/v1/admin/deliveries", None).await;
    assert_eq!(delivery_ids(&list), [ids[3], ids[4]]);
    let attempts: i64 = client
        .query_one(
            &format!("SELECT count(*) FROM {schema}.webhook_attempts"),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(attempts, 0, "attempts go with their delivery");

    for bad in [
        json!({"before": "yesterday"}),
        json!({}),
        json!({"before": cutoff, "all": true}),
    ] {
        let (status, body) = call(
            &server,
            Method::POST,
            "/v1/admin/deliveries/prune",
            Some(bad),
        )
        .await;
        assert_error(status, &body, 400, "invalid_body");
    }
}

#[tokio::test]
async fn the_openapi_document_lists_every_admin_endpoint() {
    let db = TestDb::new().await;
    let server = start(&db);
    server.ready().await;
    let document: Value = reqwest::get(server.url("/openapi.json"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let expected = [
        ("/v1/admin/subscriptions", "get"),
        ("/v1/admin/subscriptions", "post"),
        ("/v1/admin/subscriptions/{id}", "get"),
        ("/v1/admin/subscriptions/{id}", "patch"),
        ("/v1/admin/subscriptions/{id}", "delete"),
        ("/v1/admin/subscriptions/{id}/rotate-secret", "post"),
        ("/v1/admin/subscriptions/{id}/pause", "post"),
        ("/v1/admin/subscriptions/{id}/resume", "post"),
        ("/v1/admin/subscriptions/{id}/redeliver-failed", "post"),
        ("/v1/admin/scopes", "get"),
        ("/v1/admin/deliveries", "get"),
        ("/v1/admin/deliveries/{id}", "get"),
        ("/v1/admin/deliveries/{id}/redeliver", "post"),
        ("/v1/admin/deliveries/prune", "post"),
        ("/v1/admin/reload", "post"),
        ("/v1/admin/subscribers", "get"),
        ("/v1/admin/subscribers/{subscriber}/disconnect", "post"),
    ];
    for (path, method) in expected {
        assert!(
            document["paths"][path][method].is_object(),
            "{method} {path} is not documented"
        );
        // Routed: without a token every admin endpoint says 401, not 404.
        let concrete = path.replace("{id}", "1").replace("{subscriber}", "alice");
        let (status, body) = call_as(
            &server,
            None,
            method.to_uppercase().parse().unwrap(),
            &concrete,
            None,
        )
        .await;
        assert_eq!(
            (status, &body["error"]["code"]),
            (401, &json!("unauthorized")),
            "{method} {path}"
        );
    }
    let codes = &document["components"]["schemas"]["Error"]["properties"]["error"]["properties"]["code"]
        ["enum"];
    for code in [
        "admin_disabled",
        "conflict",
        "not_found",
        "invalid_query",
        "invalid_body",
    ] {
        assert!(codes.as_array().unwrap().contains(&json!(code)), "{code}");
    }
}

/// Runs `eventrelay deliveries ...` against the test's schema.
fn cli(db: &TestDb, args: &[&str]) -> (i32, String, String) {
    run(db, "deliveries", args)
}

/// Runs `eventrelay <command> ...` against the test's schema: the database
/// comes from the environment, as in a deployment.
fn run(db: &TestDb, command: &str, args: &[&str]) -> (i32, String, String) {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_eventrelay"))
        .arg(command)
        .args(args)
        .env("DATABASE_URL", &db.url)
        .env("EVENTRELAY_DATABASE__SCHEMA", db.schema.as_str())
        .env_remove("EVENTRELAY_CONFIG")
        .env_remove("EVENTRELAY_DATABASE__URL")
        .output()
        .expect("the eventrelay binary runs");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8(output.stdout).unwrap(),
        String::from_utf8(output.stderr).unwrap(),
    )
}

fn json_lines(stdout: &str) -> Vec<Value> {
    stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect()
}

#[tokio::test]
async fn the_deliveries_command_lists_shows_redelivers_and_prunes() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    let store = WebhookStore::new(&db.schema);
    for (id, scope) in [("a", None), ("b", Some("org-2".to_owned()))] {
        store
            .create_subscription(
                &client,
                &NewSubscription {
                    id: id.into(),
                    url: "https://example.com/hooks".into(),
                    secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".into(),
                    types: vec!["*".into()],
                    scope_key: scope,
                    max_per_second: None,
                    ordering: Default::default(),
                    ordering_max_block_secs: None,
                },
            )
            .await
            .unwrap()
            .unwrap();
    }
    let first = emit(&db, &client, "order.created", "org-1").await;
    emit(&db, &client, "order.created", "org-2").await;

    let (code, stdout, stderr) = cli(&db, &["list"]);
    assert_eq!(code, 0, "{stderr}");
    let all = json_lines(&stdout);
    assert_eq!(all.len(), 3);
    let ids: Vec<i64> = all.iter().map(|d| d["id"].as_i64().unwrap()).collect();
    assert!(ids.windows(2).all(|w| w[0] > w[1]), "{ids:?}");

    let (code, stdout, _) = cli(&db, &["list", "--scope", "org-2", "--subscription", "b"]);
    assert_eq!(code, 0);
    assert_eq!(json_lines(&stdout).len(), 1);
    let (code, stdout, _) = cli(&db, &["list", "--event-id", &first.to_string()]);
    assert_eq!((code, json_lines(&stdout).len()), (0, 1));
    let (code, stdout, stderr) = cli(&db, &["list", "--limit", "2"]);
    assert_eq!((code, json_lines(&stdout).len()), (0, 2));
    assert!(stderr.contains(&format!("--before {}", ids[1])), "{stderr}");
    let (code, stdout, _) = cli(&db, &["list", "--before", &ids[1].to_string()]);
    assert_eq!((code, json_lines(&stdout).len()), (0, 1));
    let (code, stdout, _) = cli(&db, &["list", "--status", "dead"]);
    assert_eq!((code, stdout.as_str()), (0, ""));
    let (code, _, stderr) = cli(&db, &["list", "--status", "lost"]);
    assert_eq!(code, 2, "a usage error");
    assert!(stderr.contains("pending"), "{stderr}");

    let (code, stdout, stderr) = cli(&db, &["show", &ids[0].to_string()]);
    assert_eq!(code, 0, "{stderr}");
    let shown = json_lines(&stdout);
    assert_eq!(shown.len(), 1);
    assert_eq!(shown[0]["delivery"]["id"], ids[0]);
    assert_eq!(shown[0]["attempts"], json!([]));
    let (code, stdout, stderr) = cli(&db, &["show", "999999999"]);
    assert_eq!((code, stdout.as_str()), (1, ""));
    assert!(stderr.contains("no delivery 999999999"), "{stderr}");

    let schema = &db.schema;
    client
        .batch_execute(&format!(
            "UPDATE {schema}.webhook_deliveries SET status = 'dead', attempts = 7 WHERE id = {};
             UPDATE {schema}.webhook_deliveries SET status = 'delivered',
                 updated_at = now() - interval '8 days' WHERE id = {}",
            ids[0], ids[2]
        ))
        .await
        .unwrap();
    let (code, stdout, stderr) = cli(&db, &["redeliver", &ids[0].to_string()]);
    assert_eq!(code, 0, "{stderr}");
    let redelivered = &json_lines(&stdout)[0]["delivery"];
    assert_eq!(
        (&redelivered["status"], &redelivered["attempts"]),
        (&json!("pending"), &json!(0))
    );
    let (code, _, stderr) = cli(&db, &["redeliver", "999999999"]);
    assert_eq!(code, 1);
    assert!(stderr.contains("no delivery 999999999"), "{stderr}");

    let (code, _, stderr) = cli(&db, &["prune", "--older-than", "soon"]);
    assert_eq!(code, 1);
    assert!(stderr.contains("--older-than"), "{stderr}");
    let (code, stdout, stderr) = cli(&db, &["prune", "--older-than", "7d"]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(json_lines(&stdout)[0]["pruned"], 1);
    let (code, stdout, _) = cli(&db, &["prune", "--older-than", "2000-01-01T00:00:00Z"]);
    assert_eq!((code, &json_lines(&stdout)[0]["pruned"]), (0, &json!(0)));
    let (_, stdout, _) = cli(&db, &["list"]);
    assert_eq!(json_lines(&stdout).len(), 2);
}

#[tokio::test]
async fn the_subscriptions_command_follows_the_api_rules() {
    let db = TestDb::new().await;
    let sub = |args: &[&str]| run(&db, "subscriptions", args);

    let (code, stdout, stderr) = sub(&[
        "create",
        "--id",
        "billing",
        "--url",
        "https://example.com/hooks",
        "--type",
        "order.*",
        "--type",
        "invoice.paid",
        "--scope",
        "org-1",
    ]);
    assert_eq!(code, 0, "{stderr}");
    let created = &json_lines(&stdout)[0];
    let secret = created["secret"].as_str().unwrap().to_owned();
    assert!(secret.starts_with("whsec_"), "{created}");
    assert_eq!(
        created["subscription"]["types"],
        json!(["order.*", "invoice.paid"])
    );
    assert_eq!(created["subscription"]["scopeKey"], "org-1");
    assert_no_secret(&created["subscription"]);

    let (code, _, stderr) = sub(&[
        "create",
        "--id",
        "billing",
        "--url",
        "https://example.com/x",
    ]);
    assert_eq!(code, 1);
    assert!(stderr.contains("already exists"), "{stderr}");
    let (code, _, stderr) = sub(&["create", "--id", "x", "--url", "ftp://example.com"]);
    assert_eq!(code, 1);
    assert!(stderr.contains("url:"), "{stderr}");

    let (code, stdout, _) = sub(&["list"]);
    assert_eq!(code, 0);
    let listed = json_lines(&stdout);
    assert_eq!(listed.len(), 1);
    assert_no_secret(&listed[0]);
    assert!(!stdout.contains(&secret));
    let (code, stdout, _) = sub(&["show", "billing"]);
    assert_eq!(
        (code, &json_lines(&stdout)[0]["subscription"]["id"]),
        (0, &json!("billing"))
    );
    let (code, _, stderr) = sub(&["show", "nope"]);
    assert_eq!(code, 1);
    assert!(stderr.contains("no subscription \"nope\""), "{stderr}");

    let (code, stdout, stderr) = sub(&["rotate-secret", "billing"]);
    assert_eq!(code, 0, "{stderr}");
    let rotated = &json_lines(&stdout)[0];
    let new_secret = rotated["secret"].as_str().unwrap();
    assert!(new_secret.starts_with("whsec_") && new_secret != secret);
    assert!(rotated["previousSecretExpiresAt"].is_string(), "{rotated}");

    WebhookStore::new(&db.schema)
        .sync_config_subscriptions(
            &db.connect().await,
            &[NewSubscription {
                id: "from-config".into(),
                url: "https://example.com/configured".into(),
                secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".into(),
                types: vec!["*".into()],
                scope_key: None,
                max_per_second: None,
                ordering: Default::default(),
                ordering_max_block_secs: None,
            }],
        )
        .await
        .unwrap();
    for command in ["delete", "rotate-secret"] {
        let (code, _, stderr) = sub(&[command, "from-config"]);
        assert_eq!(code, 1, "{command}");
        assert!(
            stderr.contains("edit the configuration"),
            "{command}: {stderr}"
        );
    }

    let (code, stdout, _) = sub(&["delete", "billing"]);
    assert_eq!(
        (code, &json_lines(&stdout)[0]),
        (0, &json!({"deleted": "billing"}))
    );
    let (code, _, _) = sub(&["delete", "billing"]);
    assert_eq!(code, 1);
    let (_, stdout, _) = sub(&["list"]);
    assert_eq!(
        json_lines(&stdout).len(),
        1,
        "only the configured one is left"
    );
}

#[tokio::test]
async fn a_replica_with_an_older_configuration_removes_no_subscription() {
    let db = TestDb::new().await;
    let configured = |id: &str| NewSubscription {
        id: id.into(),
        url: format!("https://example.com/{id}"),
        secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".into(),
        types: vec!["*".into()],
        scope_key: None,
        max_per_second: None,
        ordering: Default::default(),
        ordering_max_block_secs: None,
    };
    // The new configuration adds `added`; an event gives it a delivery.
    let (old, new) = (
        vec![configured("kept")],
        vec![configured("kept"), configured("added")],
    );
    let newer = TestServer::start(&db, move |c| {
        c.webhooks.enabled = false;
        c.webhooks.subscriptions = new;
    });
    newer.ready().await;
    let client = db.connect().await;
    let event = emit(&db, &client, "order.created", "org-1").await;
    // A replica still on the old configuration starts afterwards.
    let older = TestServer::start(&db, move |c| {
        c.database.migrate = false;
        c.webhooks.enabled = false;
        c.webhooks.subscriptions = old;
    });
    older.ready().await;
    let store = WebhookStore::new(&db.schema);
    let ids: Vec<String> = store
        .list_subscriptions(&client)
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.id)
        .collect();
    assert_eq!(ids, ["added", "kept"]);
    let pending = client
        .query_one(
            &format!(
                "SELECT count(*) FROM {}.webhook_deliveries
                 WHERE subscription_id = 'added' AND event_id = $1 AND status = 'pending'",
                db.schema
            ),
            &[&event],
        )
        .await
        .unwrap()
        .get::<_, i64>(0);
    assert_eq!(pending, 1, "the added subscription keeps its delivery");

    // Removal is an explicit step, with the configuration that no longer
    // lists it.
    let dir = std::env::temp_dir().join(format!("{}-config", db.schema));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("eventrelay.toml");
    std::fs::write(
        &file,
        "[[webhooks.subscriptions]]\nid = \"kept\"\nurl = \"https://example.com/kept\"\n\
         secret = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"\n",
    )
    .unwrap();
    let (code, stdout, stderr) = run(
        &db,
        "subscriptions",
        &["remove-unlisted", "--config", file.to_str().unwrap()],
    );
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(json_lines(&stdout)[0], json!({"removed": ["added"]}));
    let ids: Vec<String> = store
        .list_subscriptions(&client)
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.id)
        .collect();
    assert_eq!(ids, ["kept"]);
    std::fs::remove_dir_all(dir).ok();
}
