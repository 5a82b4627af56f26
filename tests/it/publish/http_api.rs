//! The HTTP surface as documented: every route in the OpenAPI document
//! exists, errors are JSON with stable codes, limits are enforced.

use crate::support::server::{PUBLISH_TOKEN, TestServer};
use crate::support::{TestDb, eventually};
use serde_json::{Value, json};

#[tokio::test]
async fn the_openapi_document_describes_routes_that_exist() {
    let db = TestDb::new().await;
    let server = TestServer::start(&db, |_| {});
    server.ready().await;
    let document: Value = reqwest::get(server.url("/openapi.json"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(document["openapi"], "3.1.0");
    let client = reqwest::Client::new();
    let mut checked = 0;
    for (path, operations) in document["paths"].as_object().unwrap() {
        let path = path.replace("{id}", "1").replace("{subscriber}", "alice");
        for method in operations.as_object().unwrap().keys() {
            let url = server.url(&path);
            let request = match method.as_str() {
                "get" => client.get(url),
                "post" => client.post(url),
                "patch" => client.patch(url),
                "delete" => client.delete(url),
                other => panic!("unexpected method {other}"),
            };
            let status = request.send().await.unwrap().status().as_u16();
            assert_ne!(status, 404, "{method} {path} is documented but not routed");
            checked += 1;
        }
    }
    assert_eq!(checked, 42);

    let missing = client.get(server.url("/v2/nothing")).send().await.unwrap();
    assert_eq!(missing.status(), 404);
    let body: Value = missing.json().await.unwrap();
    assert_eq!(body["error"]["code"], "not_found");
    let codes = &document["components"]["schemas"]["Error"]["properties"]["error"]["properties"]["code"]
        ["enum"];
    assert!(codes.as_array().unwrap().contains(&json!("not_found")));
}

#[tokio::test]
async fn an_oversized_publish_body_is_refused_with_a_named_error() {
    let db = TestDb::new().await;
    let server = TestServer::start(&db, |c| c.http.max_body_bytes = 1024);
    server.ready().await;
    let big =
        json!({"type": "a", "scopeKey": "s", "lane": "durable", "data": {"pad": "x".repeat(4096)}});
    let response = reqwest::Client::new()
        .post(server.url("/v1/events"))
        .bearer_auth(PUBLISH_TOKEN)
        .json(&big)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 413);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "payload_too_large");
    assert_eq!(db.outbox_count().await, 0);
}

#[tokio::test]
async fn integers_beyond_two_to_the_53_are_refused_and_nothing_is_written() {
    let db = TestDb::new().await;
    let server = TestServer::start(&db, |_| {});
    server.ready().await;
    let publish = async |body: &str| {
        let response = reqwest::Client::new()
            .post(server.url("/v1/events"))
            .bearer_auth(PUBLISH_TOKEN)
            .header("content-type", "application/json")
            .body(body.to_owned())
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json::<Value>().await.unwrap())
    };

    for body in [
        r#"{"type": "a", "scopeKey": "s", "lane": "durable", "data": {"n": 9007199254740993}}"#,
        r#"{"type": "a", "scopeKey": "s", "lane": "durable", "data": {"n": -9007199254740993}}"#,
        // In a batch, next to a fine event: the batch is refused whole.
        r#"[{"type": "a", "scopeKey": "s", "lane": "durable", "data": {}},
            {"type": "b", "scopeKey": "s", "lane": "durable", "data": [18446744073709551616]}]"#,
        r#"{"type": "a", "scopeKey": "s", "lane": "ephemeral", "data": {"id": 12345678901234567890}}"#,
    ] {
        let (status, answer) = publish(body).await;
        assert_eq!(status, 400, "{body}: {answer}");
        assert_eq!(answer["error"]["code"], "number_out_of_range", "{answer}");
        assert!(
            answer["error"]["message"]
                .as_str()
                .unwrap()
                .contains("9007199254740992"),
            "{answer}"
        );
    }
    assert_eq!(db.outbox_count().await, 0, "a refused body wrote nothing");

    let (status, answer) = publish(
        r#"[{"type": "a", "scopeKey": "s", "lane": "durable", "data": {"n": 9007199254740992}},
            {"type": "b", "scopeKey": "s", "lane": "durable",
             "data": {"n": -9007199254740992, "f": 9007199254740993.0, "s": "9007199254740993"}}]"#,
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    let events = answer["events"].as_array().unwrap();
    assert_eq!(events[0]["data"]["n"], json!(9_007_199_254_740_992_i64));
    assert_eq!(events[1]["data"]["n"], json!(-9_007_199_254_740_992_i64));
    assert_eq!(events[1]["data"]["s"], "9007199254740993");
    assert_eq!(db.outbox_count().await, 2);
}

#[tokio::test]
async fn publishing_with_a_schema_registry_refuses_unknown_types() {
    let db = TestDb::new().await;
    let dir = std::env::temp_dir().join(format!("eventrelay-schemas-{}", db.schema));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("order.created.json"),
        r#"{"type": "object", "required": ["orderId"]}"#,
    )
    .unwrap();
    let schemas_dir = dir.to_string_lossy().into_owned();
    let server = TestServer::start(&db, |c| c.publish.schemas_dir = Some(schemas_dir));
    server.ready().await;
    let (status, body) = server
        .publish(json!({"type": "order.deleted", "scopeKey": "s", "lane": "durable"}))
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (422, Some("schema_violation"))
    );
    let (status, _) = server
        .publish(json!({"type": "order.created", "scopeKey": "s", "lane": "durable", "data": {}}))
        .await;
    assert_eq!(status, 422);
    let (status, _) = server
        .publish(json!({"type": "order.created", "scopeKey": "s", "lane": "durable", "data": {"orderId": 1}}))
        .await;
    assert_eq!(status, 200);
    assert_eq!(db.outbox_count().await, 1);
    let _ = std::fs::remove_dir_all(dir);
}

/// `GET /v1/event-types` with `token` as the bearer: status and body.
async fn catalog(server: &TestServer, token: Option<&str>) -> (u16, Value) {
    let mut request = reqwest::Client::new().get(server.url("/v1/event-types"));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.unwrap();
    (response.status().as_u16(), response.json().await.unwrap())
}

#[tokio::test]
async fn the_event_catalog_lists_the_schemas_for_either_token() {
    let db = TestDb::new().await;
    let dir = std::env::temp_dir().join(format!("eventrelay-catalog-{}", db.schema));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("order.shipped.json"),
        r#"{"type": "object", "required": ["orderId"]}"#,
    )
    .unwrap();
    std::fs::write(
        dir.join("order.created.json"),
        r#"{"description": "An order was placed", "type": "object",
            "examples": [{"orderId": 42}]}"#,
    )
    .unwrap();
    std::fs::write(dir.join("README.md"), "not a schema").unwrap();
    let schemas_dir = dir.to_string_lossy().into_owned();
    let server = TestServer::start(&db, |c| {
        c.publish.schemas_dir = Some(schemas_dir);
        c.admin.token = Some("catalog-admin-token-long-enough".into());
    });
    server.ready().await;

    let (status, answer) = catalog(&server, Some(PUBLISH_TOKEN)).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer,
        json!({"eventTypes": [
            {"type": "order.created", "description": "An order was placed",
             "schema": {"description": "An order was placed", "type": "object",
                        "examples": [{"orderId": 42}]},
             "examples": [{"orderId": 42}]},
            {"type": "order.shipped",
             "schema": {"type": "object", "required": ["orderId"]}},
        ]})
    );
    let (status, by_admin) = catalog(&server, Some("catalog-admin-token-long-enough")).await;
    assert_eq!((status, &by_admin), (200, &answer));
    let (status, refused) = catalog(&server, Some("not-a-token")).await;
    assert_eq!(
        (status, refused["error"]["code"].as_str()),
        (401, Some("unauthorized"))
    );
    let (status, _) = catalog(&server, None).await;
    assert_eq!(status, 401);
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn without_a_schemas_directory_the_catalog_is_empty_and_without_tokens_off() {
    let db = TestDb::new().await;
    let server = TestServer::start(&db, |_| {});
    server.ready().await;
    let (status, answer) = catalog(&server, Some(PUBLISH_TOKEN)).await;
    assert_eq!((status, answer), (200, json!({"eventTypes": []})));

    let closed = TestServer::start(&db, |c| {
        c.publish.token = None;
        c.admin.token = None;
    });
    closed.ready().await;
    let (status, answer) = catalog(&closed, Some(PUBLISH_TOKEN)).await;
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (403, Some("catalog_disabled"))
    );
}

#[tokio::test]
async fn readiness_reports_the_database_and_the_listener() {
    let db = TestDb::new().await;
    let server = TestServer::start(&db, |_| {});
    server.ready().await;
    let body: Value = reqwest::get(server.url("/readyz"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(body, json!({"database": true, "listener": true}));
    let health = reqwest::get(server.url("/healthz")).await.unwrap();
    assert_eq!(health.status(), 200);
    let metrics = reqwest::get(server.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(metrics.contains("eventrelay_sse_connections"));
}

#[tokio::test]
async fn the_janitor_prunes_rows_past_the_retention() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    let old = chrono::Utc::now() - chrono::Duration::hours(2);
    for _ in 0..3 {
        client
            .execute(
                &format!(
                    "INSERT INTO {}.outbox (id, type, scope_key, written_at)
                     VALUES (gen_random_uuid(), 'old', 'org-1', $1)",
                    db.schema
                ),
                &[&old],
            )
            .await
            .unwrap();
    }
    // Backdated by its caller, but written now: retention counts from the
    // writing, so it stays.
    client
        .execute(
            &format!(
                "SELECT {}.emit('backdated', 'org-1', occurred_at => $1)",
                db.schema
            ),
            &[&old],
        )
        .await
        .unwrap();
    client
        .execute(&format!("SELECT {}.emit('fresh', 'org-1')", db.schema), &[])
        .await
        .unwrap();
    let server = TestServer::start(&db, |c| {
        c.outbox.retention_secs = 3600;
        c.outbox.prune_interval_secs = 1;
    });
    server.ready().await;
    eventually("old rows are pruned", async || {
        (db.outbox_count().await == 2).then_some(())
    })
    .await;
    server
        .wait_for_metric("eventrelay_outbox_rows_pruned_total", |n| n >= 3.0)
        .await;
}

#[tokio::test]
async fn an_oversized_admin_body_is_refused_with_a_named_error() {
    let db = TestDb::new().await;
    let server = TestServer::start(&db, |c| {
        c.http.max_body_bytes = 1024;
        c.admin.token = Some("admin-token-for-size-test".into());
        c.webhooks.enabled = false;
    });
    server.ready().await;
    let response = reqwest::Client::new()
        .post(server.url("/v1/admin/subscriptions"))
        .bearer_auth("admin-token-for-size-test")
        .json(&json!({"id": "big", "url": "https://example.com", "types": ["x".repeat(4096)]}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 413);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "payload_too_large");
}

/// A request of ephemeral events only goes to the publishing relay's own
/// subscribers before its commit, and to every other relay at the commit;
/// when its notification comes back to the publishing relay, it is not
/// delivered a second time.
#[tokio::test]
async fn ephemeral_events_reach_every_relay_and_the_publishing_one_only_once() {
    let db = TestDb::new().await;
    let publishing = TestServer::start(&db, |_| {});
    let other = TestServer::start(&db, |_| {});
    publishing.ready().await;
    other.ready().await;
    let alice = crate::support::server::token("alice", "org-1", json!({}));
    let (mut here, _) = publishing.subscribe(&alice, None, "").await;
    let (mut there, _) = other.subscribe(&alice, None, "").await;

    let typing = |n: u64| json!({"type": "typing", "scopeKey": "org-1", "lane": "ephemeral", "data": {"n": n}});
    let mut published = Vec::new();
    for batch in [vec![typing(1)], vec![typing(2), typing(3)]] {
        let (status, body) = publishing.publish(Value::Array(batch)).await;
        assert_eq!(status, 200, "{body}");
        for event in body["events"].as_array().unwrap() {
            published.push(event["id"].as_str().unwrap().to_owned());
        }
    }
    // A durable event after them: once it has arrived, any second copy of
    // an ephemeral one would have arrived before it (both relays deliver
    // their notifications in commit order).
    let (status, _) = publishing
        .publish(json!({"type": "marker", "scopeKey": "org-1", "lane": "durable"}))
        .await;
    assert_eq!(status, 200);
    for (name, stream) in [("publishing relay", &mut here), ("other relay", &mut there)] {
        let mut seen = Vec::new();
        loop {
            let frame = stream.next_event().await;
            if frame.event.as_deref() == Some("marker") {
                break;
            }
            assert_eq!(frame.event.as_deref(), Some("typing"), "{name}");
            seen.push(frame.json()["id"].as_str().unwrap().to_owned());
        }
        assert_eq!(
            seen, published,
            "{name}: each ephemeral event once, in order"
        );
    }
}
