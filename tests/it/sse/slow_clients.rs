//! Clients that misbehave on the connection itself: one whose request
//! headers never finish is answered 408 and closed after
//! `http.header_timeout_secs`, and one that never reads its stream is
//! dropped as a slow subscriber once its queue is full, its connection
//! closed. Neither disturbs the well-behaved stream beside it.

use std::time::{Duration, Instant};

use crate::support::TestDb;
use crate::support::server::{TestServer, read_until_closed, token};
use eventrelay::publisher::NewEvent;
use serde_json::json;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpSocket, TcpStream};

#[tokio::test]
async fn headers_that_never_finish_are_answered_408_after_the_timeout() {
    let db = TestDb::new().await;
    let server = TestServer::start(&db, |c| c.http.header_timeout_secs = 1);
    server.ready().await;
    let (mut stream, _) = server
        .subscribe(&token("alice", "org-1", json!({})), None, "")
        .await;

    let address = server.base.trim_start_matches("http://");
    let mut lingering = TcpStream::connect(address).await.unwrap();
    let started = Instant::now();
    lingering
        .write_all(b"GET /v1/events HTTP/1.1\r\nHost: relay\r\nAccept: text/event-stream\r\n")
        .await
        .unwrap();
    let answer = read_until_closed(&mut lingering).await;
    let waited = started.elapsed();
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.starts_with("HTTP/1.1 408"),
        "unfinished headers were answered: {answer:?}"
    );
    // actix-http counts the deadline from a clock it refreshes every
    // 500 ms, so the timeout may end up to half a second early; any sooner
    // would be something other than the header timeout closing it.
    assert!(
        waited >= Duration::from_millis(450),
        "closed after {waited:?}, well before the 1 s header timeout"
    );
    assert!(
        waited < Duration::from_secs(5),
        "closed after {waited:?}: the configured 1 s was not applied"
    );

    // The stream beside it was never disturbed.
    db.emit(NewEvent::durable("after.timeout", "org-1", json!({"n": 1})))
        .await;
    let frames = stream.events(1).await;
    assert_eq!(frames[0].event.as_deref(), Some("after.timeout"));
}

/// A connection is only handed to the HTTP layer once its first bytes are
/// there; one that sends nothing at all is closed at the same timeout.
#[tokio::test]
async fn a_connection_that_sends_nothing_is_closed_after_the_timeout() {
    let db = TestDb::new().await;
    let server = TestServer::start(&db, |c| c.http.header_timeout_secs = 1);
    server.ready().await;
    let address = server.base.trim_start_matches("http://");
    let mut silent = TcpStream::connect(address).await.unwrap();
    let started = Instant::now();
    let answer = read_until_closed(&mut silent).await;
    let waited = started.elapsed();
    assert!(
        answer.is_empty(),
        "a silent connection was answered: {answer:?}"
    );
    assert!(
        waited >= Duration::from_millis(900),
        "closed after {waited:?}, before the 1 s header timeout"
    );
    assert!(
        waited < Duration::from_secs(5),
        "closed after {waited:?}: the configured 1 s was not applied"
    );
}

#[tokio::test]
async fn a_client_that_never_reads_is_dropped_and_its_connection_closed() {
    let db = TestDb::new().await;
    let server = TestServer::start(&db, |c| c.sse.queue_capacity = 64);
    server.ready().await;
    // A small receive window, so the relay's writes back up quickly.
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let address = server.base.trim_start_matches("http://").parse().unwrap();
    let connected = socket.connect(address).await.unwrap();
    let (mut never_reads, status) = server
        .open_raw_stream_on(connected, &token("idle-tab", "org-1", json!({})))
        .await;
    assert_eq!(status, "HTTP/1.1 200 OK");
    let (mut reader, _) = server
        .subscribe(&token("fast", "org-1", json!({})), None, "")
        .await;
    assert_eq!(server.metric("eventrelay_sse_connections").await, 2.0);

    server
        .flood_until_a_slow_subscriber_is_dropped(&db, "org-1", Some(&mut reader))
        .await;
    assert_eq!(
        server
            .metric("eventrelay_slow_subscribers_dropped_total")
            .await,
        1.0
    );
    // Dropped means gone: the relay closes the connection (the client sees
    // the end once it drains what was sent) and stops counting it.
    read_until_closed(&mut never_reads).await;
    server
        .wait_for_metric("eventrelay_sse_connections", |open| open == 1.0)
        .await;
    // The reader kept receiving throughout and still does.
    db.emit(NewEvent::durable("after.drop", "org-1", json!({"n": 1})))
        .await;
    // Flood events may still be ahead of it; `next_event` has a deadline.
    while reader.next_event().await.event.as_deref() != Some("after.drop") {}
}
