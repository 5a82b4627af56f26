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
    // Never early; when exactly is `reauth_warning`'s unit test.
    assert!(
        warned >= Duration::from_millis(1_400),
        "warned {warned:?} after connecting, before halfway"
    );
    // The stream goes on until the token expires, events included.
    let event = db
        .emit(NewEvent::durable("after.warning", "org-1", json!({})))
        .await;
    assert_eq!(stream.next_event().await.json()["id"], event.id.to_string());
    assert!(stream.ends().await);
    let ended = connected.elapsed();
    // Not before the expiry; each frame is awaited for at most the tests'
    // deadline, so a stream that outlived its token fails above.
    assert!(
        ended >= Duration::from_millis(2_900),
        "ended {ended:?} after connecting, before the token expired"
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

/// A reader far slower than its replay still gets `reauth` before its
/// token expires: the stream keeps little of the replay queued ahead of
/// the reader, so the warning is not stuck behind megabytes of it.
#[tokio::test]
async fn a_slow_reader_behind_a_long_replay_is_warned_before_its_token_expires() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let db = TestDb::new().await;
    let server = TestServer::start(&db, |c| c.sse.reauth_lead_secs = 4);
    server.ready().await;
    let (mut first, _) = server
        .subscribe(&token("alice", "org-1", json!({})), None, "")
        .await;
    db.emit(NewEvent::durable("doc.mark", "org-1", json!({})))
        .await;
    let cursor = first
        .next_event()
        .await
        .id
        .expect("a durable frame has an id");
    drop(first);
    // About 3.2 MB of replay: far more than the reader takes before the
    // token expires.
    db.connect()
        .await
        .execute(
            &format!(
                "SELECT {}.emit('doc.big', 'org-1', jsonb_build_object('pad', repeat('p', 1600))) \
                 FROM generate_series(1, 2000)",
                db.schema
            ),
            &[],
        )
        .await
        .unwrap();

    // `exp` has whole seconds: 9 to 10 s left at connect.
    let bearer = token_for("alice", "org-1", json!({}), Duration::from_secs(10));
    let connected = Instant::now();
    let expires = connected + Duration::from_secs(9);
    let mut socket = tokio::net::TcpStream::connect(server.base.trim_start_matches("http://"))
        .await
        .unwrap();
    socket
        .write_all(
            format!(
                "GET /v1/events HTTP/1.1\r\nHost: relay\r\nAuthorization: Bearer {bearer}\r\n\
                 Last-Event-ID: {cursor}\r\n\r\n"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    // 160 KB/s: 8 KiB every 50 ms.
    let mut seen = Vec::new();
    let mut chunk = vec![0u8; 8 * 1024];
    let warned = loop {
        assert!(
            Instant::now() < expires,
            "no reauth before the token expired; {} bytes read",
            seen.len()
        );
        let read = socket.read(&mut chunk).await.unwrap();
        assert!(read > 0, "the stream ended before its warning");
        seen.extend_from_slice(&chunk[..read]);
        let tail = &seen[seen.len().saturating_sub(read + 16)..];
        if tail.windows(13).any(|w| w == b"event: reauth") {
            break Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        warned < expires,
        "the warning arrived {:?} after connecting, past the expiry",
        warned - connected
    );
    assert!(
        seen.len() < 2_000 * 1_600,
        "the reader had taken the whole replay ({} bytes) before the warning",
        seen.len()
    );
}
