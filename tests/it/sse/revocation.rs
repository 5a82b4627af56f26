//! An operator ends a subscriber's streams now: on the relay asked, with a
//! last `event: revoked` frame, and through the database on every other
//! relay of the schema within a second; with a denial, new streams are
//! refused until it expires. The admin API lists who is connected, and the
//! connection cap counts a subscriber's streams across scopes.

use crate::support::server::{TestServer, token};
use crate::support::{TestDb, eventually};
use eventrelay::publisher::NewEvent;
use serde_json::{Value, json};

const ADMIN_TOKEN: &str = "admin-token-for-revocation";

fn relay(db: &TestDb) -> TestServer {
    TestServer::start(db, |c| c.admin.token = Some(ADMIN_TOKEN.into()))
}

async fn admin(server: &TestServer, method: reqwest::Method, path: &str) -> (u16, Value) {
    let response = reqwest::Client::new()
        .request(method, server.url(path))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

#[tokio::test]
async fn a_disconnection_ends_the_subscribers_streams_on_every_relay_within_a_second() {
    let db = TestDb::new().await;
    let (a, b) = (relay(&db), relay(&db));
    a.ready().await;
    b.ready().await;
    let alice = token("alice", "org-1", json!({}));
    let (mut on_a, _) = a.subscribe(&alice, None, "").await;
    let (mut on_b, _) = b.subscribe(&alice, None, "").await;
    let (mut bob, _) = a
        .subscribe(&token("bob", "org-1", json!({})), None, "")
        .await;

    let (status, answer) = admin(
        &a,
        reqwest::Method::POST,
        "/v1/admin/subscribers/alice/disconnect",
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["disconnected"], 1, "this relay's stream: {answer}");
    assert_eq!(on_a.last_event().await.as_deref(), Some("revoked"));
    // Within the tests' deadline for each frame: the other relay heard
    // the revocation through the database, not at its stream's age cap.
    assert_eq!(on_b.last_event().await.as_deref(), Some("revoked"));

    // Bob's stream goes on, and Alice may come back: no denial was asked.
    let event = db
        .emit(NewEvent::durable("after", "org-1", json!({})))
        .await;
    assert_eq!(bob.next_event().await.json()["id"], event.id.to_string());
    assert!(a.connect(Some(&alice), None, "").await.is_ok());
}

#[tokio::test]
async fn a_denial_refuses_new_streams_on_every_relay_in_its_scope_until_it_expires() {
    let db = TestDb::new().await;
    let (a, b) = (relay(&db), relay(&db));
    a.ready().await;
    b.ready().await;
    let (status, answer) = admin(
        &a,
        reqwest::Method::POST,
        "/v1/admin/subscribers/alice/disconnect?scope=org-1&denySecs=3",
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["disconnected"], 0);
    assert!(answer["denyUntil"].is_string());
    let refused = async |server: &TestServer| match server
        .connect(Some(&token("alice", "org-1", json!({}))), None, "")
        .await
    {
        Err((403, body)) => Some(body["error"]["code"].as_str().unwrap().to_owned()),
        _ => None,
    };
    assert_eq!(
        refused(&a).await.as_deref(),
        Some("subscriber_disconnected")
    );
    let on_b = eventually("the other relay refuses too", async || refused(&b).await).await;
    assert_eq!(on_b, "subscriber_disconnected");
    // Another scope is not denied.
    assert!(
        b.connect(Some(&token("alice", "org-2", json!({}))), None, "")
            .await
            .is_ok()
    );
    // And the denial ends.
    eventually("the denial expires", async || {
        a.connect(Some(&token("alice", "org-1", json!({}))), None, "")
            .await
            .ok()
    })
    .await;

    // A relay that starts while a denial is in force honours it.
    admin(
        &a,
        reqwest::Method::POST,
        "/v1/admin/subscribers/carol/disconnect?denySecs=60",
    )
    .await;
    let late = relay(&db);
    late.ready().await;
    let on_late = eventually("a relay started later refuses", async || {
        match late
            .connect(Some(&token("carol", "org-1", json!({}))), None, "")
            .await
        {
            Err((403, _)) => Some(()),
            _ => None,
        }
    })
    .await;
    assert_eq!(on_late, ());

    let (status, answer) = admin(
        &a,
        reqwest::Method::POST,
        "/v1/admin/subscribers/alice/disconnect?denySecs=-1",
    )
    .await;
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (400, Some("invalid_query"))
    );
}

#[tokio::test]
async fn the_listing_shows_who_is_connected_a_page_at_a_time() {
    let db = TestDb::new().await;
    let server = relay(&db);
    server.ready().await;
    let mut streams = Vec::new();
    for (subscriber, scope) in [("alice", "org-1"), ("bob", "org-2"), ("carol", "org-1")] {
        streams.push(
            server
                .subscribe(&token(subscriber, scope, json!({})), None, "")
                .await
                .0,
        );
    }
    let (status, page) = admin(
        &server,
        reqwest::Method::GET,
        "/v1/admin/subscribers?scope=org-1&limit=1",
    )
    .await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["streams"][0]["subscriber"], "alice");
    assert_eq!(page["streams"][0]["scopeKey"], "org-1");
    assert!(page["streams"][0]["connectedAt"].is_string());
    assert!(page["streams"][0]["relay"].as_str().unwrap().contains('/'));
    let next = page["next"].as_u64().expect("a next page");
    let (_, rest) = admin(
        &server,
        reqwest::Method::GET,
        &format!("/v1/admin/subscribers?scope=org-1&limit=1&after={next}"),
    )
    .await;
    assert_eq!(rest["streams"][0]["subscriber"], "carol");
    let (_, all) = admin(&server, reqwest::Method::GET, "/v1/admin/subscribers").await;
    assert_eq!(all["streams"].as_array().unwrap().len(), 3);
    let (_, empty) = admin(
        &server,
        reqwest::Method::GET,
        "/v1/admin/subscribers?scope=&after=",
    )
    .await;
    assert_eq!(
        empty["streams"], all["streams"],
        "empty parameters filter nothing"
    );
    assert!(all["next"].is_null());
    assert!(!all.to_string().contains("data"), "no event data: {all}");

    // Without the admin token: nothing.
    let response = reqwest::get(server.url("/v1/admin/subscribers"))
        .await
        .unwrap();
    assert_eq!(response.status(), 401);

    // The busiest scopes, and they follow streams as they close.
    let scopes = |limit: &str| {
        let path = format!("/v1/admin/scopes{limit}");
        let server = &server;
        async move { admin(server, reqwest::Method::GET, &path).await }
    };
    let (status, busiest) = scopes("").await;
    assert_eq!(status, 200, "{busiest}");
    assert_eq!(
        busiest["scopes"],
        json!([{"scopeKey": "org-1", "streams": 2}, {"scopeKey": "org-2", "streams": 1}])
    );
    assert_eq!(busiest["streams"], 3);
    let (_, top) = scopes("?limit=1").await;
    assert_eq!(top["scopes"], json!([{"scopeKey": "org-1", "streams": 2}]));
    drop(streams.remove(0));
    drop(streams.remove(0));
    eventually("closed streams leave the count", async || {
        let (_, busiest) = scopes("").await;
        (busiest["scopes"] == json!([{"scopeKey": "org-1", "streams": 1}])).then_some(())
    })
    .await;
    for bad in ["?limit=0", "?limit=501", "?limit=x", "?color=red"] {
        let (status, answer) = scopes(bad).await;
        assert_eq!(status, 400, "{bad}: {answer}");
        assert_eq!(answer["error"]["code"], "invalid_query", "{bad}");
    }
}

#[tokio::test]
async fn the_connection_cap_counts_a_subscribers_streams_across_scopes() {
    let db = TestDb::new().await;
    let server = TestServer::start(&db, |c| c.sse.max_connections_per_subscriber = 2);
    server.ready().await;
    let _one = server
        .subscribe(&token("alice", "org-1", json!({})), None, "")
        .await;
    let _two = server
        .subscribe(&token("alice", "org-2", json!({})), None, "")
        .await;
    match server
        .connect(Some(&token("alice", "org-3", json!({}))), None, "")
        .await
    {
        Err((429, body)) => assert_eq!(body["error"]["code"], "too_many_connections"),
        other => panic!("a third stream in a third scope: {:?}", other.map(|_| ())),
    }
    assert!(
        server
            .connect(Some(&token("bob", "org-3", json!({}))), None, "")
            .await
            .is_ok()
    );
}
