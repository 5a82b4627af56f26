//! What the relay sets on the connections it accepts: Nagle's algorithm
//! off, so a frame leaves when it is written instead of waiting for the
//! client to acknowledge the one before.

use crate::support::server::{TestServer, token};
use crate::support::sockets::{accepted_nodelay, address_of};
use crate::support::{TestDb, eventually};
use eventrelay::publisher::NewEvent;
use serde_json::json;

#[tokio::test]
async fn plain_connections_are_sent_on_without_waiting_for_acknowledgements() {
    let db = TestDb::new().await;
    let server = TestServer::start(&db, |_| {});
    server.ready().await;
    let (mut stream, _) = server
        .subscribe(&token("alice", "org-1", json!({})), None, "")
        .await;

    // The stream is live, so the relay holds its connection (and maybe the
    // readiness check's): each one has TCP_NODELAY.
    let accepted = eventually("the relay's side of the stream", async || {
        let found = accepted_nodelay(address_of(&server.base));
        (!found.is_empty()).then_some(found)
    })
    .await;
    assert!(
        accepted.iter().all(|nodelay| *nodelay),
        "connections without TCP_NODELAY: {accepted:?}"
    );

    db.emit(NewEvent::durable("order.created", "org-1", json!({})))
        .await;
    assert_eq!(
        stream.events(1).await[0].event.as_deref(),
        Some("order.created")
    );
}
