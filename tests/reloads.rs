//! A client that closes its stream is released at once, not at the next
//! heartbeat: page reloads never lock a user out, and the connections
//! gauge follows closes within a second.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    reason = "test code: a panic is the test failing, and figures are printed for the reader"
)]

mod common;

use std::time::{Duration, Instant};

use common::TestDb;
use common::server::{TestServer, token};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Opens a stream over raw TCP and reads until its `ready` frame; answers
/// the status line.
async fn open_stream(server: &TestServer, bearer: &str) -> (TcpStream, String) {
    let address = server.base.trim_start_matches("http://");
    let mut socket = TcpStream::connect(address).await.unwrap();
    let request = format!(
        "GET /v1/events HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer {bearer}\r\nAccept: text/event-stream\r\n\r\n"
    );
    socket.write_all(request.as_bytes()).await.unwrap();
    let mut seen = Vec::new();
    let mut buffer = [0u8; 4096];
    let deadline = Instant::now() + common::DEADLINE;
    loop {
        let text = String::from_utf8_lossy(&seen).into_owned();
        if text.contains("event: ready")
            || (text.contains("\r\n\r\n") && !text.starts_with("HTTP/1.1 200"))
        {
            let status = text.lines().next().unwrap_or_default().to_owned();
            return (socket, status);
        }
        assert!(Instant::now() < deadline, "no ready frame: {text}");
        let read = tokio::time::timeout(common::DEADLINE, socket.read(&mut buffer))
            .await
            .unwrap()
            .unwrap();
        assert!(read > 0, "the relay closed the stream early: {text}");
        seen.extend_from_slice(&buffer[..read]);
    }
}

#[tokio::test]
async fn reloads_never_hit_the_connection_cap_and_closes_free_their_slot_at_once() {
    let db = TestDb::new().await;
    // The default cap of 5 and the default 20 s heartbeat.
    let server = TestServer::start(&db, |c| {
        assert_eq!(c.sse.max_connections_per_subscriber, 5);
        assert_eq!(c.sse.heartbeat_secs, 20);
    });
    server.ready().await;
    let bearer = token("alice", "org-1", json!({}));
    // 20 reloads in 10 s: each page closes its stream and opens a new one.
    let mut previous: Option<TcpStream> = None;
    for reload in 0..20 {
        let (socket, status) = open_stream(&server, &bearer).await;
        assert_eq!(status, "HTTP/1.1 200 OK", "reload {reload}");
        drop(previous.replace(socket));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    drop(previous);
    let closed_at = Instant::now();
    loop {
        let open = server.metric("eventrelay_sse_connections").await;
        if open == 0.0 {
            break;
        }
        assert!(
            closed_at.elapsed() < Duration::from_secs(1),
            "{open} streams still counted a second after the last client closed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_stream_the_relay_ends_still_closes_the_connection() {
    // The watcher holds a second handle to each socket; it must let go when
    // the relay is done with the connection, or the client never sees the
    // close.
    let db = TestDb::new().await;
    let server = TestServer::start(&db, |c| c.sse.max_age_secs = 1);
    server.ready().await;
    let (mut socket, status) = open_stream(&server, &token("alice", "org-1", json!({}))).await;
    assert_eq!(status, "HTTP/1.1 200 OK");
    // The age cap ends the stream; then the idle connection is closed by
    // the HTTP layer's keep-alive timeout, and the client must see EOF.
    let mut buffer = [0u8; 4096];
    let deadline = Instant::now() + common::DEADLINE;
    loop {
        assert!(Instant::now() < deadline, "the connection was never closed");
        match tokio::time::timeout(common::DEADLINE, socket.read(&mut buffer)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(_)) => continue,
            Err(_) => panic!("the connection was never closed"),
        }
    }
}
