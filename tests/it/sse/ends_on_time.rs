//! A stream ends at its age cap or its token's expiry, whichever comes
//! first, while it replays too: a slow reader over a large backlog is not
//! fed page after page past the end, and gets nothing committed after it.
//! A reader that stalls the replay has its connection cut just after the
//! end, since a stream that cannot write cannot end itself.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::support::TestDb;
use crate::support::server::{TestServer, token, token_for};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpSocket;
use tokio::time::Instant;

/// Rows in the backlog, and the bytes of padding each carries: about 12 MB,
/// more than the socket buffers on both ends hold, so a replay that stops
/// at the end cannot have sent it all.
const BACKLOG_ROWS: i64 = 12_000;
const ROW_PADDING: i64 = 1_000;

/// Writes the backlog (before any token is minted: under load this takes
/// seconds).
async fn emit_backlog(db: &TestDb) {
    db.connect()
        .await
        .batch_execute(&format!(
            "SELECT {schema}.emit('backlog', 'org-1', jsonb_build_object('pad', repeat('x', {ROW_PADDING})))
             FROM generate_series(1, {BACKLOG_ROWS})",
            schema = db.schema
        ))
        .await
        .unwrap();
}

/// Replays the whole backlog to a slow reader on a stream with `bearer`,
/// and emits one event once `end` has passed. Answers how long the relay
/// kept the stream open, and everything the stream sent.
async fn slow_replay(
    db: &TestDb,
    server: &TestServer,
    bearer: &str,
    end: Duration,
) -> (Duration, String) {
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let address = server.base.trim_start_matches("http://");
    let mut stream = socket.connect(address.parse().unwrap()).await.unwrap();
    stream
        .write_all(
            format!(
                "GET /v1/events HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer {bearer}\r\n\
                 Accept: text/event-stream\r\nLast-Event-ID: 0\r\n\r\n"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let started = Instant::now();
    // The client reads 4 KiB every 100 ms until told to hurry, then takes
    // in what is left up to the response's last chunk.
    let hurry = Arc::new(AtomicBool::new(false));
    let reader = tokio::spawn({
        let hurry = Arc::clone(&hurry);
        async move {
            let mut seen = Vec::new();
            let mut buffer = vec![0u8; 4096];
            loop {
                match tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buffer)).await
                {
                    Ok(Ok(0)) | Ok(Err(_)) => return seen,
                    Ok(Ok(read)) => seen.extend_from_slice(&buffer[..read]),
                    Err(_) => panic!("no byte for 10 s and no end"),
                }
                if seen.ends_with(b"\r\n0\r\n\r\n") {
                    return seen;
                }
                if !hurry.load(Ordering::Relaxed) {
                    // The pace of a slow client, not a wait for something.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    });
    server
        .wait_for_metric("eventrelay_sse_connections", |open| open == 1.0)
        .await;
    tokio::time::sleep_until(started + end + Duration::from_millis(300)).await;
    db.emit_sql("after.the.end", "org-1", json!({})).await;
    server
        .wait_for_metric("eventrelay_sse_connections", |open| open == 0.0)
        .await;
    let open_for = started.elapsed();
    hurry.store(true, Ordering::Relaxed);
    let sent = tokio::time::timeout(Duration::from_secs(30), reader)
        .await
        .expect("the rest of the stream arrives")
        .unwrap();
    (open_for, String::from_utf8_lossy(&sent).into_owned())
}

/// What every stream ended on time must show: fewer rows than the backlog
/// (no page was read after the end) and nothing committed after the end.
/// A reader this slow stalls the stream, so the relay cuts the connection
/// rather than finish the response.
fn ended_mid_replay(sent: &str) {
    let rows = sent.matches("event: backlog").count();
    assert!(
        rows < BACKLOG_ROWS as usize,
        "the whole backlog of {rows} rows was sent"
    );
    assert!(
        !sent.contains("after.the.end"),
        "an event committed after the end was sent"
    );
    assert!(
        !sent.contains("event: ready"),
        "the replay cannot have finished"
    );
}

#[tokio::test]
async fn a_slow_replay_ends_at_the_age_cap() {
    let db = TestDb::new().await;
    let server = TestServer::start(&db, |c| c.sse.max_age_secs = 2);
    server.ready().await;
    emit_backlog(&db).await;
    let bearer = token("alice", "org-1", json!({}));
    let (open_for, sent) = slow_replay(&db, &server, &bearer, Duration::from_secs(2)).await;
    // The age cap is 2 s less up to 10% jitter; a stalled replay is cut
    // half a second after it.
    assert!(
        open_for < Duration::from_secs(4),
        "the stream stayed open {open_for:?}"
    );
    ended_mid_replay(&sent);
}

#[tokio::test]
async fn a_slow_replay_ends_when_the_token_expires() {
    let db = TestDb::new().await;
    let server = TestServer::start(&db, |_| {});
    server.ready().await;
    emit_backlog(&db).await;
    let bearer = token_for("alice", "org-1", json!({}), Duration::from_secs(3));
    let (open_for, sent) = slow_replay(&db, &server, &bearer, Duration::from_secs(3)).await;
    assert!(
        open_for < Duration::from_secs(5),
        "the stream stayed open {open_for:?}"
    );
    ended_mid_replay(&sent);
}
