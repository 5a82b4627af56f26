//! A client that closes its stream is released at once, not at the next
//! heartbeat: page reloads never lock a user out, and the connections
//! gauge follows closes within a second.

use std::time::Duration;

use crate::support::server::{TestServer, token};
use crate::support::{TestDb, eventually};
use serde_json::json;
use tokio::net::TcpStream;

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
        let (socket, status) = server.open_raw_stream(&bearer).await;
        assert_eq!(status, "HTTP/1.1 200 OK", "reload {reload}");
        drop(previous.replace(socket));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    drop(previous);
    // Within the deadline, half the 20 s heartbeat: the peek noticed the
    // closes, not a failed heartbeat write.
    eventually("every closed stream is released", async || {
        (server.metric("eventrelay_sse_connections").await == 0.0).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_stream_the_relay_ends_still_closes_the_connection() {
    // The watcher holds a second handle to each socket; it must let go when
    // the relay is done with the connection, or the client never sees the
    // close.
    let db = TestDb::new().await;
    let server = TestServer::start(&db, |c| c.sse.max_age_secs = 1);
    server.ready().await;
    let (mut socket, status) = server
        .open_raw_stream(&token("alice", "org-1", json!({})))
        .await;
    assert_eq!(status, "HTTP/1.1 200 OK");
    // The age cap ends the stream; then the idle connection is closed by
    // the HTTP layer's keep-alive timeout, and the client must see EOF.
    crate::support::server::read_until_closed(&mut socket).await;
}
