//! A stream its token will end warns its client first: `event: reauth`
//! with the seconds left, `sse.reauth_lead_secs` before the end or halfway
//! through a shorter token. The stream still ends at the expiry, and one
//! that only the age cap ends sends no warning. A token already past its
//! expiry is refused, even inside the verification leeway.

use std::time::Duration;

use crate::support::TestDb;
use crate::support::server::{TestServer, token, token_for};
use eventrelay::publisher::NewEvent;
use serde_json::json;
use tokio::time::Instant;

#[tokio::test]
async fn a_stream_its_token_ends_warns_halfway_through_a_short_token_and_still_ends_on_time() {
    let db = TestDb::new().await;
    let server = TestServer::start(&db, |c| c.sse.reauth_lead_secs = 30);
    server.ready().await;
    // `exp` has whole seconds: the token has 3 to 4 s left at connect.
    let bearer = token_for("alice", "org-1", json!({}), Duration::from_secs(4));
    let connected = Instant::now();
    let (mut stream, _) = server.subscribe(&bearer, None, "").await;
    let warning = stream.next_event().await;
    let warned = connected.elapsed();
    assert_eq!(warning.event.as_deref(), Some("reauth"));
    assert!(warning.id.is_none(), "a control frame has no id");
    let expires_in = warning.json()["expiresIn"].as_u64().unwrap();
    assert!((1..=2).contains(&expires_in), "{expires_in}");
    assert!(
        warned >= Duration::from_millis(1_400) && warned <= Duration::from_millis(2_600),
        "warned {warned:?} after connecting, not halfway"
    );
    // The stream goes on until the token expires, events included.
    let event = db
        .emit(NewEvent::durable("after.warning", "org-1", json!({})))
        .await;
    assert_eq!(stream.next_event().await.json()["id"], event.id.to_string());
    assert!(stream.ends().await);
    let ended = connected.elapsed();
    assert!(
        ended >= Duration::from_millis(2_900) && ended <= Duration::from_millis(4_600),
        "ended {ended:?} after connecting"
    );
}

#[tokio::test]
async fn a_stream_the_age_cap_ends_sends_no_warning_and_zero_lead_turns_it_off() {
    let db = TestDb::new().await;
    let server = TestServer::start(&db, |c| {
        c.sse.max_age_secs = 2;
        c.sse.reauth_lead_secs = 30;
    });
    server.ready().await;
    let (mut stream, _) = server
        .subscribe(&token("alice", "org-1", json!({})), None, "")
        .await;
    while let Some(frame) = stream.next_frame().await {
        assert_ne!(frame.event.as_deref(), Some("reauth"), "{frame:?}");
    }

    let quiet = TestServer::start(&db, |c| c.sse.reauth_lead_secs = 0);
    quiet.ready().await;
    let bearer = token_for("bob", "org-1", json!({}), Duration::from_secs(3));
    let (mut stream, _) = quiet.subscribe(&bearer, None, "").await;
    while let Some(frame) = stream.next_frame().await {
        assert_ne!(frame.event.as_deref(), Some("reauth"), "{frame:?}");
    }
}

#[tokio::test]
async fn a_token_past_its_expiry_is_refused_even_inside_the_leeway() {
    let db = TestDb::new().await;
    let server = TestServer::start(&db, |c| {
        if let Some(eventrelay::auth::AuthConfig::Jwt(jwt)) = c.auth.as_mut() {
            jwt.leeway_secs = 30;
        }
    });
    server.ready().await;
    let bearer = token_for("alice", "org-1", json!({}), Duration::from_secs(1));
    // `exp` is in whole seconds: 2 s from now it has passed, whatever the
    // fraction of a second the token was minted in.
    tokio::time::sleep(Duration::from_secs(2)).await;
    // The verification leeway would accept it for 30 s more, but a stream
    // on it would end at once: the client is told to get a new token.
    let Err((status, body)) = server.connect(Some(&bearer), None, "").await else {
        panic!("a stream opened on an expired token");
    };
    assert_eq!(status, 401);
    assert_eq!(body["error"]["code"], "unauthorized");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("expired")
    );
}
