//! `http.body_timeout_secs` bounds every request body the relay reads (the
//! publish API, the admin API, the inspector's token form): a body that
//! arrives a byte at a time is answered 408 `request_timeout` in time and
//! its connection closed, over HTTP/1.1 and HTTP/2. Requests refused
//! before their body matters (no token, an endpoint that is off) are
//! answered at once, with the body still on its way.

use std::time::Duration;

use crate::support::DEADLINE;
use crate::support::TestDb;
use crate::support::raw_http::{Response, closed_within, drip, read_response};
use crate::support::server::{PUBLISH_TOKEN, TEST_SECRET, TestServer};
use crate::support::tls::{https, tls_server, wait_ready};
use futures_util::StreamExt;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::time::Instant;

const ADMIN_TOKEN: &str = "admin-token-for-deadline-tests";
/// The body timeout of the relays whose bodies time out.
const TIMEOUT: Duration = Duration::from_secs(1);
/// Far longer than any test waits: a relay with this body timeout that
/// answers within [`DEADLINE`] did not wait for the body.
const NEVER: u64 = 600;

/// A request of `path` announcing a 1000-byte JSON body, of which only the
/// first byte follows the headers.
fn request_head(path: &str, authorization: Option<&str>) -> Vec<u8> {
    let authorization = authorization
        .map(|value| format!("Authorization: {value}\r\n"))
        .unwrap_or_default();
    format!(
        "POST {path} HTTP/1.1\r\nHost: relay\r\n{authorization}\
         Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{"
    )
    .into_bytes()
}

/// Sends the head of a request to `server` and then its body one byte
/// every 200 ms; answers the response, how long after the head it came,
/// and the connection, for what follows.
async fn dripped(
    server: &TestServer,
    path: &str,
    authorization: Option<&str>,
) -> (Response, Duration, tokio::net::tcp::OwnedReadHalf) {
    let socket = TcpStream::connect(server.base.trim_start_matches("http://"))
        .await
        .unwrap();
    let (mut reader, mut writer) = socket.into_split();
    writer
        .write_all(&request_head(path, authorization))
        .await
        .unwrap();
    let started = Instant::now();
    let mut buffer = Vec::new();
    let response = tokio::select! {
        response = read_response(&mut reader, &mut buffer) => response,
        written = drip(&mut writer, &[b' '; 999], Duration::from_millis(200)) => {
            panic!("{path}: {written} bytes of body were taken and nothing answered")
        }
    };
    (response, started.elapsed(), reader)
}

#[tokio::test]
async fn a_body_dripped_slowly_is_answered_408_and_its_connection_closed() {
    let db = TestDb::new().await;
    let server = TestServer::start(&db, |c| {
        c.http.body_timeout_secs = TIMEOUT.as_secs();
        c.admin.token = Some(ADMIN_TOKEN.into());
        c.webhooks.enabled = false;
        // The inspector mints tokens, as in development mode.
        c.development_secret = Some(TEST_SECRET.into());
    });
    server.ready().await;
    let publish = format!("Bearer {PUBLISH_TOKEN}");
    let admin = format!("Bearer {ADMIN_TOKEN}");
    for (path, authorization) in [
        ("/v1/events", Some(publish.as_str())),
        ("/v1/admin/subscriptions", Some(admin.as_str())),
        ("/inspector/token", None),
    ] {
        let (response, waited, mut connection) = dripped(&server, path, authorization).await;
        assert_eq!(response.status, 408, "{path}: {response:?}");
        assert_eq!(
            response.json()["error"]["code"],
            "request_timeout",
            "{path}"
        );
        assert_eq!(response.header("connection"), Some("close"), "{path}");
        assert!(
            waited >= TIMEOUT * 8 / 10 && waited < DEADLINE,
            "{path}: answered after {waited:?} with a {TIMEOUT:?} body timeout"
        );
        closed_within(&mut connection, Duration::from_secs(5)).await;
    }
    assert_eq!(db.outbox_count().await, 0);
    let subscriptions = reqwest::Client::new()
        .get(server.url("/v1/admin/subscriptions"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap()
        .json::<serde_json::Value>()
        .await
        .unwrap();
    assert_eq!(subscriptions["subscriptions"], serde_json::json!([]));
}

#[tokio::test]
async fn refusals_are_answered_before_the_body_arrives() {
    let db = TestDb::new().await;
    // Not in development mode; no admin token. A handler that read the
    // body first would answer only after NEVER seconds.
    let server = TestServer::start(&db, |c| c.http.body_timeout_secs = NEVER);
    server.ready().await;
    for (path, authorization, status, code) in [
        ("/inspector/token", None, 403, "minting_disabled"),
        ("/v1/events", None, 401, "unauthorized"),
        (
            "/v1/events",
            Some("Bearer not-the-token"),
            401,
            "unauthorized",
        ),
        ("/v1/admin/subscriptions", None, 403, "admin_disabled"),
    ] {
        let (response, _, mut connection) = dripped(&server, path, authorization).await;
        assert_eq!(
            (response.status, &response.json()["error"]["code"]),
            (status, &serde_json::json!(code)),
            "{path}: {response:?}"
        );
        // The body was never read: the connection cannot carry another
        // request, and closes.
        closed_within(&mut connection, Duration::from_secs(5)).await;
    }
}

#[tokio::test]
async fn over_http2_a_dripped_body_is_answered_408() {
    let db = TestDb::new().await;
    let (server, ca, _folder) = tls_server(&db, |c| c.http.body_timeout_secs = TIMEOUT.as_secs());
    let client = ca.client();
    let base = https(&server);
    wait_ready(&client, &base).await;
    // The first byte of the body, then nothing, the stream left open.
    let body =
        futures_util::stream::once(async { Ok::<_, std::io::Error>(bytes::Bytes::from("{")) })
            .chain(futures_util::stream::pending());
    let started = Instant::now();
    let response = tokio::time::timeout(
        DEADLINE,
        client
            .post(format!("{base}/v1/events"))
            .bearer_auth(PUBLISH_TOKEN)
            .header("content-type", "application/json")
            .body(reqwest::Body::wrap_stream(body))
            .send(),
    )
    .await
    .expect("an answer before the deadline")
    .unwrap();
    let waited = started.elapsed();
    assert_eq!(response.version(), reqwest::Version::HTTP_2);
    assert_eq!(response.status(), 408);
    assert!(
        waited >= TIMEOUT * 8 / 10,
        "answered after {waited:?}, before the {TIMEOUT:?} body timeout"
    );
    let answer: serde_json::Value = response.json().await.unwrap();
    assert_eq!(answer["error"]["code"], "request_timeout");
    assert_eq!(db.outbox_count().await, 0);
}
