//! `http.header_timeout_secs` bounds every request's headers, not only the
//! first of a connection: a kept-alive connection whose next request stops
//! half-way through its headers is closed in time, over HTTP/1.1 (plain
//! and TLS) and HTTP/2. Complete requests and long responses are not
//! disturbed.

use std::time::Duration;

use crate::support::raw_http::{closed_within, h2, read_response};
use crate::support::server::{TestServer, token};
use crate::support::tls::{https, tls_server, wait_ready};
use crate::support::{DEADLINE, TestDb};
use eventrelay::config::Config;
use reqwest::Version;
use serde_json::json;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// The header timeout the relays of these tests run with.
const TIMEOUT: Duration = Duration::from_secs(1);
/// Well past it: a connection still open then was not closed by it.
const TOO_LATE: Duration = Duration::from_secs(5);

const HEALTHZ: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: relay\r\n\r\n";

/// Two complete requests on one connection are answered (it is kept
/// alive), then a third that stops inside its request line is closed
/// between (about) the timeout and [`TOO_LATE`], without an answer.
async fn a_stalled_third_request_is_closed<S: AsyncRead + AsyncWrite + Unpin>(stream: &mut S) {
    let mut buffer = Vec::new();
    for _ in 0..2 {
        stream.write_all(HEALTHZ).await.unwrap();
        let response = read_response(stream, &mut buffer).await;
        assert_eq!(response.status, 200, "{response:?}");
        assert_ne!(response.header("connection"), Some("close"));
    }
    stream.write_all(b"GET /he").await.unwrap();
    stream.flush().await.unwrap();
    let started = Instant::now();
    let answer = closed_within(stream, TOO_LATE).await;
    let waited = started.elapsed();
    assert!(
        answer.is_empty(),
        "the stalled request was answered: {:?}",
        String::from_utf8_lossy(&answer)
    );
    assert!(
        waited >= TIMEOUT / 2,
        "closed after {waited:?}, well before the {TIMEOUT:?} header timeout"
    );
}

#[tokio::test]
async fn a_kept_alive_connection_whose_next_headers_stall_is_closed() {
    let db = TestDb::new().await;
    let server = TestServer::start(&db, |c| c.http.header_timeout_secs = TIMEOUT.as_secs());
    server.ready().await;
    let mut socket = TcpStream::connect(server.base.trim_start_matches("http://"))
        .await
        .unwrap();
    a_stalled_third_request_is_closed(&mut socket).await;
}

#[tokio::test]
async fn over_tls_stalled_headers_are_closed_in_http1_and_http2() {
    let db = TestDb::new().await;
    let (server, ca, _folder) = tls_server(&db, |c| c.http.header_timeout_secs = TIMEOUT.as_secs());
    wait_ready(&ca.client(), &https(&server)).await;

    let mut http1 = ca.connect_raw(&server, b"http/1.1").await;
    a_stalled_third_request_is_closed(&mut http1).await;

    // HTTP/2: a complete request on stream 1 is answered; the HEADERS
    // frame of stream 3 then stops after its first bytes.
    let mut http2 = ca.connect_raw(&server, b"h2").await;
    http2.write_all(&h2::preface()).await.unwrap();
    http2
        .write_all(&h2::frame(
            h2::HEADERS,
            h2::END_HEADERS | h2::END_STREAM,
            1,
            &h2::get("/healthz"),
        ))
        .await
        .unwrap();
    let mut buffer = Vec::new();
    let mut status = None;
    loop {
        let (kind, flags, stream, payload) = h2::next_frame(&mut http2, &mut buffer).await;
        if stream != 1 {
            continue;
        }
        if kind == h2::HEADERS {
            // `:status: 200` is the static table's entry 8.
            status = Some(payload.first() == Some(&0x88));
        }
        if flags & h2::END_STREAM != 0 {
            break;
        }
    }
    assert_eq!(status, Some(true), "stream 1 was answered 200");
    let whole = h2::frame(
        h2::HEADERS,
        h2::END_HEADERS | h2::END_STREAM,
        3,
        &h2::get("/healthz"),
    );
    http2.write_all(&whole[..12]).await.unwrap();
    http2.flush().await.unwrap();
    let started = Instant::now();
    let frames = closed_within(&mut http2, TOO_LATE).await;
    let waited = started.elapsed();
    assert!(
        waited >= TIMEOUT / 2,
        "closed after {waited:?}, well before the {TIMEOUT:?} header timeout"
    );
    // Whatever came before the end (a ping, say) answered no request.
    let answered: Vec<h2::Frame> = h2::frames(&frames)
        .into_iter()
        .filter(|(_, _, stream, _)| *stream == 3)
        .collect();
    assert!(answered.is_empty(), "stream 3 was answered: {answered:?}");
}

/// Reads an event stream until `count` heartbeat comments have come, each
/// within [`DEADLINE`].
async fn heartbeats(mut stream: reqwest::Response, count: usize) {
    let mut text = String::new();
    while text.lines().filter(|line| line.starts_with(':')).count() < count {
        let chunk = tokio::time::timeout(DEADLINE, stream.chunk())
            .await
            .expect("a heartbeat before the deadline")
            .expect("the stream reads")
            .expect("the stream stays open");
        text.push_str(std::str::from_utf8(&chunk).unwrap());
    }
}

#[tokio::test]
async fn a_long_response_outlives_the_header_deadline() {
    let db = TestDb::new().await;
    let quick_heartbeats = |c: &mut Config| {
        c.http.header_timeout_secs = TIMEOUT.as_secs();
        c.sse.heartbeat_secs = 1;
    };
    let plain = TestServer::start(&db, quick_heartbeats);
    let (tls, ca, _folder) = tls_server(&db, quick_heartbeats);
    plain.ready().await;
    wait_ready(&ca.client(), &https(&tls)).await;
    let bearer = token("alice", "org-1", json!({}));
    // Three heartbeats each: the streams are open well past the header
    // timeout, while their clients send nothing.
    for (client, base, version) in [
        (reqwest::Client::new(), plain.base.clone(), Version::HTTP_11),
        (ca.client(), https(&tls), Version::HTTP_2),
    ] {
        let stream = client
            .get(format!("{base}/v1/events"))
            .bearer_auth(&bearer)
            .send()
            .await
            .unwrap();
        assert_eq!((stream.status().as_u16(), stream.version()), (200, version));
        heartbeats(stream, 3).await;
    }
}
