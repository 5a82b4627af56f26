//! Clients that misbehave on the connection itself: one whose request
//! headers never finish is answered 408 and closed after
//! `http.header_timeout_secs`, and one that never reads its stream is
//! dropped as a slow subscriber once its queue is full, its connection
//! closed. Neither disturbs the well-behaved stream beside it.

use std::time::{Duration, Instant};

use crate::support::server::{TestServer, read_until_closed, token};
use crate::support::{DEADLINE, TestDb};
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

/// A worker reads the first request of a bounded number of connections
/// at once; a connection gives its place back as soon as its request is
/// answered, though its stream goes on.
#[tokio::test]
async fn an_answered_stream_gives_its_opening_place_back() {
    let db = TestDb::new().await;
    let server = TestServer::start(&db, |c| {
        c.http.workers = 1;
        c.http.opening_per_worker = 1;
        // Far beyond the deadline below: the second stream opens only if
        // the first gave its place back.
        c.http.opening_wait_ms = 600_000;
    });
    server.ready().await;
    let alice = token("alice", "org-1", json!({}));
    let opened = tokio::time::timeout(DEADLINE, async {
        let first = server.subscribe(&alice, None, "").await;
        let second = server.subscribe(&alice, None, "").await;
        (first, second)
    })
    .await;
    let ((mut first, _), (mut second, _)) = opened.expect("the second stream opened");
    db.emit(NewEvent::durable("both", "org-1", json!({}))).await;
    for stream in [&mut first, &mut second] {
        assert_eq!(stream.events(1).await[0].event.as_deref(), Some("both"));
    }
}

/// Clients that trickle their headers can hold every opening place, but
/// the others wait for one no longer than `http.opening_wait_ms`.
#[tokio::test]
async fn clients_holding_the_opening_places_delay_others_only_briefly() {
    let db = TestDb::new().await;
    let server = TestServer::start(&db, |c| {
        c.http.workers = 1;
        c.http.opening_per_worker = 1;
        c.http.opening_wait_ms = 500;
        // The trickling client keeps its place for the whole test.
        c.http.header_timeout_secs = 60;
    });
    server.ready().await;
    let address = server.base.trim_start_matches("http://");
    let mut trickling = TcpStream::connect(address).await.unwrap();
    trickling
        .write_all(b"GET /v1/events HTTP/1.1\r\nHost: relay\r\n")
        .await
        .unwrap();
    let started = Instant::now();
    let (mut stream, _) = tokio::time::timeout(
        DEADLINE,
        server.subscribe(&token("alice", "org-1", json!({})), None, ""),
    )
    .await
    .expect("a well-behaved client is served while the place is held");
    // It did wait for the place: the trickling client held it.
    assert!(
        started.elapsed() >= Duration::from_millis(450),
        "served after {:?}: the trickling client held no place",
        started.elapsed()
    );
    db.emit(NewEvent::durable("served", "org-1", json!({})))
        .await;
    assert_eq!(stream.events(1).await[0].event.as_deref(), Some("served"));
    drop(trickling);
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
