//! The customer portal's API: sessions minted by the admin API or the
//! publisher crate, a one-time code exchanged once for a token bound to
//! one scope, and every `/v1/portal` route confined to that scope (another
//! scope's objects answer 404, as missing ones do). The deliveries go to a
//! real receiver.

use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};

use crate::support::TestDb;
use crate::support::eventually;
use crate::support::receiver::{Receiver, Reply};
use crate::support::server::{ADMIN_TOKEN, TestServer};
use eventrelay::config::Config;
use eventrelay::publisher::{NewEvent, PortalTheme};

fn with_admin(config: &mut Config) {
    config.admin.token = Some(ADMIN_TOKEN.into());
    config.webhooks.allow_private_networks = true;
    config.webhooks.retry_schedule_ms = vec![50];
    config.webhooks.request_timeout_ms = 2_000;
    config.webhooks.lease_ms = 3_000;
}

/// Mints a session of `scope` and exchanges its code: the portal token.
async fn portal_token(server: &TestServer, scope: &str) -> String {
    let (status, minted) = server
        .admin(
            ADMIN_TOKEN,
            Method::POST,
            "/v1/admin/portal-sessions",
            Some(json!({"scopeKey": scope, "expiresInSecs": 600})),
        )
        .await;
    assert_eq!(status, 201, "{minted}");
    let code = minted["code"].as_str().unwrap();
    assert!(
        minted["url"]
            .as_str()
            .unwrap()
            .ends_with(&format!("/portal#code={code}"))
    );
    let (status, exchanged) = exchange(server, code).await;
    assert_eq!(status, 200, "{exchanged}");
    assert_eq!(exchanged["session"]["scopeKey"], scope);
    exchanged["token"].as_str().unwrap().to_owned()
}

async fn exchange(server: &TestServer, code: &str) -> (u16, Value) {
    server
        .admin(
            "",
            Method::POST,
            "/v1/portal/exchange",
            Some(json!({"code": code})),
        )
        .await
}

/// A portal call with `token`.
async fn call(
    server: &TestServer,
    token: &str,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    server.admin(token, method, path, body).await
}

/// An endpoint created through the portal: its id and its secret.
async fn create_endpoint(server: &TestServer, token: &str, url: &str) -> (String, String) {
    let (status, created) = call(
        server,
        token,
        Method::POST,
        "/v1/portal/subscriptions",
        Some(json!({"url": url, "types": ["order.*"]})),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    (
        created["subscription"]["id"].as_str().unwrap().to_owned(),
        created["secret"].as_str().unwrap().to_owned(),
    )
}

#[tokio::test]
async fn a_code_is_exchanged_once_and_only_before_it_expires() {
    let db = TestDb::new().await;
    let server = TestServer::start(&db, with_admin);
    server.ready().await;
    let (status, _) = server
        .admin(
            "wrong-token",
            Method::POST,
            "/v1/admin/portal-sessions",
            Some(json!({"scopeKey": "org-a"})),
        )
        .await;
    assert_eq!(status, 401, "minting takes the admin token");

    let (_, minted) = server
        .admin(
            ADMIN_TOKEN,
            Method::POST,
            "/v1/admin/portal-sessions",
            Some(json!({"scopeKey": "org-a", "theme": {"accent": "#0a7", "font": "Inter, sans-serif"}})),
        )
        .await;
    let code = minted["code"].as_str().unwrap();
    let (status, exchanged) = exchange(&server, code).await;
    assert_eq!(status, 200);
    assert_eq!(exchanged["session"]["theme"]["accent"], "#0a7");
    let (status, again) = exchange(&server, code).await;
    assert_eq!(
        (status, again["error"]["code"].as_str()),
        (401, Some("unauthorized"))
    );
    assert_eq!(exchange(&server, "not-a-code").await.0, 401);
    let token = exchanged["token"].as_str().unwrap();
    let (status, session) = call(&server, token, Method::GET, "/v1/portal/session", None).await;
    assert_eq!(
        (status, session["session"]["scopeKey"].as_str()),
        (200, Some("org-a"))
    );
    assert_eq!(
        call(
            &server,
            "not-a-token",
            Method::GET,
            "/v1/portal/session",
            None
        )
        .await
        .0,
        401
    );

    // A one-second session: its code and its token both stop working.
    let (_, short) = server
        .admin(
            ADMIN_TOKEN,
            Method::POST,
            "/v1/admin/portal-sessions",
            Some(json!({"scopeKey": "org-a", "expiresInSecs": 1})),
        )
        .await;
    let (_, early) = exchange(&server, short["code"].as_str().unwrap()).await;
    let token = early["token"].as_str().unwrap().to_owned();
    let ends: chrono::DateTime<chrono::Utc> = short["expiresAt"].as_str().unwrap().parse().unwrap();
    eventually("the short session ends", async || {
        (chrono::Utc::now() > ends).then_some(())
    })
    .await;
    let (status, ended) = call(&server, &token, Method::GET, "/v1/portal/session", None).await;
    assert_eq!(status, 401, "{ended}");

    for (body, wrong) in [
        (
            json!({"scopeKey": "org-a", "theme": {"accent": "red;}"}}),
            "theme.accent",
        ),
        (
            json!({"scopeKey": "org-a", "theme": {"font": "x}body{"}}),
            "theme.font",
        ),
        (
            json!({"scopeKey": "org-a", "expiresInSecs": 999_999}),
            "expiresInSecs",
        ),
        (json!({"scopeKey": ""}), "scopeKey"),
    ] {
        let (status, refused) = server
            .admin(
                ADMIN_TOKEN,
                Method::POST,
                "/v1/admin/portal-sessions",
                Some(body),
            )
            .await;
        assert_eq!(status, 400, "{refused}");
        assert!(
            refused["error"]["message"]
                .as_str()
                .unwrap()
                .contains(wrong),
            "{refused}"
        );
    }
}

/// Every portal route, with scope A's session, against scope B's objects:
/// 404 everywhere, and nothing of B's changes or shows.
#[tokio::test]
async fn a_session_sees_and_touches_nothing_of_another_scope() {
    let db = TestDb::new().await;
    let receiver = Receiver::start([]);
    let server = TestServer::start(&db, with_admin);
    server.ready().await;
    let token_a = portal_token(&server, "org-a").await;
    let token_b = portal_token(&server, "org-b").await;
    let (b_endpoint, _) = create_endpoint(&server, &token_b, &receiver.url).await;
    // An operator's subscription to every scope: its deliveries of A's
    // events are not A's to see either.
    let (status, _) = server
        .admin(
            ADMIN_TOKEN,
            Method::POST,
            "/v1/admin/subscriptions",
            Some(json!({"id": "operator-wide", "url": receiver.url, "types": ["*"]})),
        )
        .await;
    assert_eq!(status, 201);
    db.emit(NewEvent::durable("order.created", "org-b", json!({})))
        .await;
    db.emit(NewEvent::durable("order.created", "org-a", json!({})))
        .await;
    receiver.wait_for(3).await;
    let (_, listed) = server
        .admin(ADMIN_TOKEN, Method::GET, "/v1/admin/deliveries", None)
        .await;
    let b_delivery = listed["deliveries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["subscriptionId"] == b_endpoint.as_str())
        .unwrap()["id"]
        .to_string();

    let sub = format!("/v1/portal/subscriptions/{b_endpoint}");
    let delivery = format!("/v1/portal/deliveries/{b_delivery}");
    let since = json!({"since": "2000-01-01T00:00:00Z"});
    for (method, path, body) in [
        (Method::GET, sub.clone(), None),
        (
            Method::PATCH,
            sub.clone(),
            Some(json!({"url": "https://example.com/x"})),
        ),
        (Method::DELETE, sub.clone(), None),
        (Method::POST, format!("{sub}/rotate-secret"), None),
        (Method::POST, format!("{sub}/pause"), None),
        (Method::POST, format!("{sub}/resume"), None),
        (
            Method::POST,
            format!("{sub}/redeliver-failed"),
            Some(since.clone()),
        ),
        (Method::POST, format!("{sub}/test"), None),
        (Method::GET, delivery.clone(), None),
        (Method::POST, format!("{delivery}/redeliver"), None),
        (
            Method::GET,
            "/v1/portal/subscriptions/operator-wide".into(),
            None,
        ),
    ] {
        let (status, answer) = call(&server, &token_a, method.clone(), &path, body).await;
        assert_eq!(status, 404, "{method} {path}: {answer}");
        assert_eq!(answer["error"]["code"], "not_found", "{method} {path}");
    }
    let (_, mine) = call(
        &server,
        &token_a,
        Method::GET,
        "/v1/portal/subscriptions",
        None,
    )
    .await;
    assert_eq!(mine["subscriptions"], json!([]), "A has no endpoint");
    let (_, deliveries) = call(
        &server,
        &token_a,
        Method::GET,
        "/v1/portal/deliveries",
        None,
    )
    .await;
    assert_eq!(
        deliveries["deliveries"],
        json!([]),
        "nor any delivery: {deliveries}"
    );
    let (_, filtered) = call(
        &server,
        &token_a,
        Method::GET,
        &format!("/v1/portal/deliveries?subscriptionId={b_endpoint}&scopeKey=org-b"),
        None,
    )
    .await;
    assert_eq!(
        filtered["deliveries"],
        json!([]),
        "no filter reaches across"
    );

    // B's endpoint is as it was: not paused, deleted, or given a test.
    let (status, b_view) = call(&server, &token_b, Method::GET, &sub, None).await;
    assert_eq!(status, 200);
    assert_eq!(b_view["subscription"]["pausedAt"], Value::Null);
    assert_eq!(b_view["subscription"]["url"], receiver.url.as_str());
    let (_, b_deliveries) = call(
        &server,
        &token_b,
        Method::GET,
        "/v1/portal/deliveries",
        None,
    )
    .await;
    assert_eq!(b_deliveries["deliveries"].as_array().unwrap().len(), 1);

    // The scope cannot be chosen, nor the id.
    for body in [
        json!({"url": receiver.url, "scopeKey": "org-b"}),
        json!({"url": receiver.url, "id": "mine"}),
    ] {
        let (status, refused) = call(
            &server,
            &token_a,
            Method::POST,
            "/v1/portal/subscriptions",
            Some(body),
        )
        .await;
        assert_eq!(status, 400, "{refused}");
    }
    let (status, refused) = call(
        &server,
        &token_b,
        Method::PATCH,
        &sub,
        Some(json!({"scopeKey": "org-a"})),
    )
    .await;
    assert_eq!(status, 400, "{refused}");
}

/// A customer's round: an endpoint created, its test event received, a
/// failure shown with the receiver's answer, redelivered, the secret
/// rotated, paused and resumed, deleted.
#[tokio::test]
async fn a_customer_manages_an_endpoint_from_test_event_to_redelivery() {
    let db = TestDb::new().await;
    let receiver = Receiver::start([
        Reply::Status(200),
        Reply::WithBody(500, "database down, try later".into()),
        Reply::WithBody(500, "still down".into()),
    ]);
    let server = TestServer::start(&db, with_admin);
    server.ready().await;
    let token = portal_token(&server, "org-a").await;
    let (id, secret) = create_endpoint(&server, &token, &receiver.url).await;
    assert!(secret.starts_with("whsec_"));
    let (_, listed) = call(
        &server,
        &token,
        Method::GET,
        "/v1/portal/subscriptions",
        None,
    )
    .await;
    assert_eq!(
        listed["subscriptions"][0]["scopeKey"], "org-a",
        "bound to the session's scope"
    );

    let (status, sent) = call(
        &server,
        &token,
        Method::POST,
        &format!("/v1/portal/subscriptions/{id}/test"),
        None,
    )
    .await;
    assert_eq!(status, 202, "{sent}");
    let test = receiver.wait_for(1).await.remove(0);
    let body: Value = serde_json::from_slice(&test.body).unwrap();
    assert_eq!(body["type"], "eventrelay.test");
    assert_eq!(body["scopeKey"], "org-a");

    db.emit(NewEvent::durable("order.created", "org-a", json!({"n": 1})))
        .await;
    let failed = eventually("the order's delivery is dead", async || {
        let (_, page) = call(
            &server,
            &token,
            Method::GET,
            "/v1/portal/deliveries?status=dead",
            None,
        )
        .await;
        page["deliveries"].as_array()?.first().cloned()
    })
    .await;
    let path = format!("/v1/portal/deliveries/{}", failed["id"]);
    let (_, detail) = call(&server, &token, Method::GET, &path, None).await;
    assert_eq!(
        detail["attempts"][0]["response"],
        "database down, try later"
    );
    let (status, _) = call(
        &server,
        &token,
        Method::POST,
        &format!("{path}/redeliver"),
        None,
    )
    .await;
    assert_eq!(status, 200);
    eventually("the redelivery is delivered", async || {
        let (_, detail) = call(&server, &token, Method::GET, &path, None).await;
        (detail["delivery"]["status"] == "delivered").then_some(())
    })
    .await;

    let sub = format!("/v1/portal/subscriptions/{id}");
    let (_, rotated) = call(
        &server,
        &token,
        Method::POST,
        &format!("{sub}/rotate-secret"),
        None,
    )
    .await;
    assert_ne!(rotated["secret"], secret.as_str());
    let (_, paused) = call(&server, &token, Method::POST, &format!("{sub}/pause"), None).await;
    assert!(paused["subscription"]["pausedAt"].is_string());
    let (_, resumed) = call(
        &server,
        &token,
        Method::POST,
        &format!("{sub}/resume"),
        None,
    )
    .await;
    assert_eq!(resumed["subscription"]["pausedAt"], Value::Null);
    let (_, changed) = call(
        &server,
        &token,
        Method::PATCH,
        &sub,
        Some(json!({"types": ["order.created", "invoice.*"]})),
    )
    .await;
    assert_eq!(
        changed["subscription"]["types"],
        json!(["order.created", "invoice.*"])
    );
    let (status, refused) = call(
        &server,
        &token,
        Method::PATCH,
        &sub,
        Some(json!({"url": "ftp://example.com"})),
    )
    .await;
    assert_eq!(status, 400, "the admin API's rules apply: {refused}");
    assert_eq!(
        call(&server, &token, Method::DELETE, &sub, None).await.0,
        204
    );
    assert_eq!(call(&server, &token, Method::GET, &sub, None).await.0, 404);
}

#[tokio::test]
async fn a_private_address_is_refused_at_sending_as_for_the_admin_api() {
    let db = TestDb::new().await;
    let receiver = Receiver::start([]);
    let server = TestServer::start(&db, |config: &mut Config| {
        with_admin(config);
        config.webhooks.allow_private_networks = false;
    });
    server.ready().await;
    let token = portal_token(&server, "org-a").await;
    let (id, _) = create_endpoint(&server, &token, &receiver.url).await;
    let (_, sent) = call(
        &server,
        &token,
        Method::POST,
        &format!("/v1/portal/subscriptions/{id}/test"),
        None,
    )
    .await;
    let path = format!("/v1/portal/deliveries/{}", sent["delivery"]["id"]);
    let error = eventually("the attempt is refused", async || {
        let (_, detail) = call(&server, &token, Method::GET, &path, None).await;
        detail["attempts"][0]["error"].as_str().map(str::to_owned)
    })
    .await;
    assert!(
        error.contains("private") || error.contains("internal"),
        "{error}"
    );
    assert!(
        receiver.received().is_empty(),
        "nothing reached the receiver"
    );
}

#[tokio::test]
async fn the_page_is_framed_only_by_the_allowed_origins_and_the_publisher_mints_sessions() {
    let db = TestDb::new().await;
    let server = TestServer::start(&db, |config: &mut Config| {
        with_admin(config);
        config.portal.allowed_frame_origins = vec!["https://app.example.com".into()];
    });
    server.ready().await;
    for path in [
        "/portal",
        "/portal/portal.js",
        "/portal/ui.js",
        "/portal/portal.css",
    ] {
        let response = reqwest::get(server.url(path)).await.unwrap();
        assert_eq!(response.status(), 200, "{path}");
        let policy = response.headers()["content-security-policy"]
            .to_str()
            .unwrap();
        assert!(
            policy.ends_with("frame-ancestors https://app.example.com"),
            "{path}: {policy}"
        );
        assert!(!policy.contains("unsafe-inline"), "{policy}");
    }
    let plain = TestServer::start(&db, with_admin);
    plain.ready().await;
    let response = reqwest::get(plain.url("/portal")).await.unwrap();
    let policy = response.headers()["content-security-policy"]
        .to_str()
        .unwrap();
    assert!(policy.ends_with("frame-ancestors 'none'"), "{policy}");

    // The application mints a session in its own database connection.
    let client = db.connect().await;
    let theme = PortalTheme {
        accent: Some("#aa3300".into()),
        font: None,
    };
    let minted = db
        .publisher()
        .portal_session(&client, "org-c", Duration::from_secs(60), Some(&theme))
        .await
        .unwrap();
    assert!(
        minted
            .url("https://relay.example.com/")
            .starts_with("https://relay.example.com/portal#code=")
    );
    let (status, exchanged) = exchange(&server, &minted.code).await;
    assert_eq!(status, 200, "{exchanged}");
    assert_eq!(exchanged["session"]["scopeKey"], "org-c");
    assert_eq!(exchanged["session"]["theme"]["accent"], "#aa3300");
}
