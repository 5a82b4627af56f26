//! `http.write_timeout_secs` bounds a response in flight: a client that
//! takes none of it is closed, whether its socket stops taking bytes
//! (HTTP/1.1, pipelined answers or an event stream) or it keeps an HTTP/2
//! stream's window shut while the connection stays busy with pings. Each
//! close is counted by reason.

use std::time::Duration;

use crate::support::raw_http::{closed_within, h2};
use crate::support::server::{ADMIN_TOKEN, TestServer, token};
use crate::support::tls::{https, tls_server, wait_ready};
use crate::support::{DEADLINE, TestDb};
use eventrelay::publisher::NewEvent;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::Instant;

const WRITE_TIMEOUTS: &str = "eventrelay_connections_closed_total{reason=\"write_timeout\"}";

/// A connection to `server` whose receive buffer is small, so that a
/// client that stops reading stops the relay's writes soon.
async fn small_window(server: &TestServer) -> TcpStream {
    let address = server.base.trim_start_matches("http://").parse().unwrap();
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    socket.connect(address).await.unwrap()
}

/// A one-second write timeout, and the console on (its script is the
/// large answer asked for).
fn quick_writes(config: &mut eventrelay::config::Config) {
    config.http.write_timeout_secs = 1;
    config.admin.token = Some(ADMIN_TOKEN.into());
}

#[tokio::test]
async fn a_client_that_stops_reading_pipelined_answers_is_closed() {
    let db = TestDb::new().await;
    let server = TestServer::start(&db, quick_writes);
    server.ready().await;
    assert_eq!(server.metric(WRITE_TIMEOUTS).await, 0.0);
    let mut socket = small_window(&server).await;
    // 200 answers of about 40 KiB each: more than the kernel buffers.
    let request = b"GET /console/console.js HTTP/1.1\r\nHost: relay\r\n\r\n";
    socket.write_all(&request.repeat(200)).await.unwrap();
    server
        .wait_for_metric(WRITE_TIMEOUTS, |closed| closed >= 1.0)
        .await;
    let answered = closed_within(&mut socket, DEADLINE).await;
    assert!(
        answered.starts_with(b"HTTP/1.1 200"),
        "the first answers went out"
    );
    assert!(
        answered.len() < 200 * 40_000,
        "every answer went out ({} bytes): the client was not stalled",
        answered.len()
    );
}

#[tokio::test]
async fn an_event_stream_whose_reader_stops_is_closed() {
    let db = TestDb::new().await;
    let server = TestServer::start(&db, quick_writes);
    server.ready().await;
    let mut socket = small_window(&server).await;
    let bearer = token("alice", "org-1", json!({}));
    socket
        .write_all(
            format!(
                "GET /v1/events HTTP/1.1\r\nHost: relay\r\nAuthorization: Bearer {bearer}\r\n\r\n"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let mut head = [0u8; 12];
    socket.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");
    // Events of 32 KiB until the stalled stream is closed.
    let pad = "e".repeat(32 * 1024);
    let deadline = Instant::now() + DEADLINE;
    while server.metric(WRITE_TIMEOUTS).await < 1.0 {
        assert!(
            Instant::now() < deadline,
            "the stalled stream is still open"
        );
        for _ in 0..16 {
            db.emit(NewEvent::durable("doc.big", "org-1", json!({"pad": pad})))
                .await;
        }
    }
    closed_within(&mut socket, DEADLINE).await;
}

#[tokio::test]
async fn an_http2_stream_whose_window_stays_shut_closes_its_connection() {
    const PING: u8 = 0x6;
    let db = TestDb::new().await;
    let (server, ca, _folder) = tls_server(&db, quick_writes);
    wait_ready(&ca.client(), &https(&server)).await;
    let mut http2 = ca.connect_raw(&server, b"h2").await;
    // SETTINGS_INITIAL_WINDOW_SIZE (0x4) = 0: no stream may carry data.
    let mut opening = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    opening.extend(h2::frame(h2::SETTINGS, 0, 0, &[0, 4, 0, 0, 0, 0]));
    opening.extend(h2::frame(
        h2::HEADERS,
        h2::END_HEADERS | h2::END_STREAM,
        1,
        &h2::get("/console/console.js"),
    ));
    http2.write_all(&opening).await.unwrap();

    // The connection stays busy: a ping every 100 ms, every frame read.
    let started = Instant::now();
    let mut received = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    let mut pings = tokio::time::interval(Duration::from_millis(100));
    let mut acknowledged = false;
    loop {
        assert!(
            started.elapsed() < DEADLINE,
            "the connection was still open after {DEADLINE:?}"
        );
        tokio::select! {
            _ = pings.tick() => {
                if http2.write_all(&h2::frame(PING, 0, 0, &[7; 8])).await.is_err() {
                    break;
                }
            }
            read = http2.read(&mut chunk) => match read {
                Ok(0) | Err(_) => break,
                Ok(read) => received.extend_from_slice(&chunk[..read]),
            },
        }
        let frames = h2::frames(&received);
        if !acknowledged
            && frames
                .iter()
                .any(|f| f.0 == h2::SETTINGS && f.1 & h2::ACK == 0)
        {
            acknowledged = true;
            let _ = http2
                .write_all(&h2::frame(h2::SETTINGS, h2::ACK, 0, &[]))
                .await;
        }
    }
    let frames = h2::frames(&received);
    assert!(
        frames.iter().any(|f| f.0 == h2::HEADERS && f.2 == 1),
        "the answer's headers went out: {frames:?}"
    );
    assert!(
        !frames
            .iter()
            .any(|f| f.0 == h2::DATA && f.2 == 1 && !f.3.is_empty()),
        "no data went through a shut window"
    );
    assert!(
        frames.iter().filter(|f| f.0 == PING).count() >= 3,
        "the connection was busy with pings until it closed"
    );
    let metrics = ca
        .client()
        .get(format!("{}/metrics", https(&server)))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics
            .lines()
            .any(|line| line == format!("{WRITE_TIMEOUTS} 1")),
        "one close by the write timeout: {metrics}"
    );
}
