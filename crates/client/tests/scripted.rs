//! The client against a scripted HTTP server on a local socket: each
//! connection gets the next canned answer, and every request's headers are
//! recorded, so reconnect behaviour is checked exactly and without a relay.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    reason = "test code: a panic is the test failing, and figures are printed for the reader"
)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use eventrelay_client::{ClientBuilder, ClientError, ClientHandle, Event, State, Status};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::{Notify, mpsc, watch};

const DEADLINE: Duration = Duration::from_secs(10);

#[derive(Clone)]
struct Reply {
    status: u16,
    content_type: &'static str,
    body: String,
    /// Keep the connection open after the body, until the client closes it.
    hold: bool,
    /// Wait this long before answering.
    delay: Duration,
    /// After the body, wait for this signal, then send the text and close.
    then: Option<(Arc<Notify>, String)>,
}

fn stream(body: impl Into<String>, hold: bool) -> Reply {
    Reply {
        status: 200,
        content_type: "text/event-stream",
        body: body.into(),
        hold,
        delay: Duration::ZERO,
        then: None,
    }
}

fn refusal(status: u16, code: &str) -> Reply {
    Reply {
        status,
        content_type: "application/json",
        body: json!({"error": {"code": code, "message": "no"}}).to_string(),
        hold: false,
        delay: Duration::ZERO,
        then: None,
    }
}

struct Scripted {
    url: String,
    /// The lower-cased request head of every connection, in order.
    requests: Arc<Mutex<Vec<String>>>,
    /// Receives the connection number when the client closes a held one.
    closed: mpsc::UnboundedReceiver<usize>,
}

impl Scripted {
    /// Serves `replies` in order, repeating the last one.
    async fn start(replies: Vec<Reply>) -> Scripted {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/v1/events", listener.local_addr().unwrap());
        let requests = Arc::new(Mutex::new(Vec::new()));
        let (closed_sender, closed) = mpsc::unbounded_channel();
        let recorded = requests.clone();
        tokio::spawn(async move {
            let mut number = 0;
            while let Ok((mut socket, _)) = listener.accept().await {
                let reply = replies[number.min(replies.len() - 1)].clone();
                let recorded = recorded.clone();
                let closed_sender = closed_sender.clone();
                let this = number;
                number += 1;
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buffer = [0u8; 1024];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match socket.read(&mut buffer).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buffer[..n]),
                        }
                    }
                    recorded
                        .lock()
                        .unwrap()
                        .push(String::from_utf8_lossy(&head).to_lowercase());
                    tokio::time::sleep(reply.delay).await;
                    let response = format!(
                        "HTTP/1.1 {} X\r\ncontent-type: {}\r\nconnection: close\r\n\r\n{}",
                        reply.status, reply.content_type, reply.body
                    );
                    if socket.write_all(response.as_bytes()).await.is_err() {
                        return;
                    }
                    if let Some((signal, text)) = &reply.then {
                        signal.notified().await;
                        let _ = socket.write_all(text.as_bytes()).await;
                        return;
                    }
                    if reply.hold {
                        // Reads return 0 once the client has closed.
                        while let Ok(n) = socket.read(&mut buffer).await {
                            if n == 0 {
                                break;
                            }
                        }
                        let _ = closed_sender.send(this);
                    }
                });
            }
        });
        Scripted {
            url,
            requests,
            closed,
        }
    }

    fn client(&self) -> ClientBuilder {
        let url = self.url.clone();
        ClientBuilder::new(move |http| http.get(&url))
    }

    fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }

    async fn wait_for_requests(&self, count: usize) -> Vec<String> {
        let deadline = tokio::time::Instant::now() + DEADLINE;
        loop {
            let requests = self.requests();
            if requests.len() >= count {
                return requests;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "only {} of {count} requests arrived",
                requests.len()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

fn envelope(id: u128, lane: &str, seq: Option<i64>) -> serde_json::Value {
    let mut envelope = json!({
        "id": uuid::Uuid::from_u128(id),
        "type": "order.created",
        "scopeKey": "org-1",
        "lane": lane,
        "data": {"n": id},
        "resources": [],
        "occurredAt": "2026-01-01T00:00:00Z",
    });
    if let Some(seq) = seq {
        envelope["seq"] = json!(seq);
    }
    envelope
}

fn durable(id: u128, seq: i64) -> String {
    format!(
        "id: {seq}\nevent: order.created\ndata: {}\n\n",
        envelope(id, "durable", Some(seq))
    )
}

fn ephemeral(id: u128) -> String {
    format!(
        "event: order.created\ndata: {}\n\n",
        envelope(id, "ephemeral", None)
    )
}

fn ready(resync: bool) -> String {
    format!("event: ready\ndata: {{\"resync\":{resync}}}\n\n")
}

async fn next(events: &mut mpsc::Receiver<Event>) -> Event {
    tokio::time::timeout(DEADLINE, events.recv())
        .await
        .expect("an event before the deadline")
        .expect("client still running")
}

async fn wait_for_state(handle: &ClientHandle, state: State) -> Status {
    let mut status = handle.subscribe();
    tokio::time::timeout(DEADLINE, status.wait_for(|s| s.state == state))
        .await
        .unwrap_or_else(|_| panic!("state {state:?} before the deadline"))
        .expect("status channel open")
        .clone()
}

fn last_event_id(request: &str) -> Option<&str> {
    request
        .lines()
        .find_map(|line| line.strip_prefix("last-event-id: "))
}

#[tokio::test]
async fn only_durable_frames_move_the_watermark_sent_on_reconnect() {
    let first = format!(
        "retry: 1\n\n{}{}{}{}",
        ready(true),
        durable(1, 41),
        durable(2, 42),
        ephemeral(3)
    );
    let server = Scripted::start(vec![
        stream(first, false),
        stream(format!("{}{}", durable(4, 43), ready(false)), true),
    ])
    .await;
    let (handle, mut events) = server
        .client()
        .backoff(Duration::from_secs(3600), Duration::from_secs(3600))
        .start();
    let mut ids = Vec::new();
    for _ in 0..4 {
        let event = next(&mut events).await;
        ids.push((event.envelope.id.as_u128(), event.sse_id));
    }
    assert_eq!(
        ids,
        [
            (1, Some("41".into())),
            (2, Some("42".into())),
            (3, None),
            (4, Some("43".into()))
        ]
    );
    let requests = server.requests();
    assert_eq!(last_event_id(&requests[0]), None);
    // The ephemeral event after 42 has no id, so 42 is the watermark; and the
    // initial backoff of an hour was replaced by the server's `retry: 1`.
    assert_eq!(last_event_id(&requests[1]), Some("42"));
    assert!(requests[0].contains("accept: text/event-stream"));
    handle.stop().await.unwrap();
}

#[tokio::test]
async fn a_saved_watermark_is_sent_on_the_first_connection() {
    let server = Scripted::start(vec![stream(ready(false), true)]).await;
    let (handle, _events) = server.client().last_event_id("17").start();
    wait_for_state(&handle, State::Connected).await;
    assert_eq!(last_event_id(&server.requests()[0]), Some("17"));
    handle.stop().await.unwrap();
}

#[tokio::test]
async fn duplicates_are_dropped_and_undecodable_frames_skipped() {
    let body = format!(
        "{}{}event: order.created\ndata: not json\n\nevent: order.created\ndata: {{\"id\": 5}}\n\n{}{}{}",
        ready(false),
        durable(1, 1),
        durable(1, 1),
        ephemeral(2),
        ephemeral(2),
    );
    let server = Scripted::start(vec![stream(body + &durable(3, 3), true)]).await;
    let (handle, mut events) = server.client().start();
    let received: Vec<u128> = [
        next(&mut events).await,
        next(&mut events).await,
        next(&mut events).await,
    ]
    .iter()
    .map(|event| event.envelope.id.as_u128())
    .collect();
    assert_eq!(received, [1, 2, 3]);
    handle.stop().await.unwrap();
}

#[tokio::test]
async fn reserved_types_never_reach_the_application_nor_the_control_path() {
    // A durable event named `ready` (which an older relay let through) has
    // an `id:`: it must neither mark the stream ready nor reach the
    // application. Nor may an unknown control frame under the reserved
    // prefix, or an `error` event.
    let mut named_ready = envelope(9, "durable", Some(9));
    named_ready["type"] = json!("ready");
    let mut named_error = envelope(10, "ephemeral", None);
    named_error["type"] = json!("error");
    let body = format!(
        "id: 9\nevent: ready\ndata: {named_ready}\n\nevent: error\ndata: {named_error}\n\nevent: eventrelay.future\ndata: {{}}\n\n{}{}",
        ready(false),
        durable(11, 11),
    );
    let server = Scripted::start(vec![stream(body, true)]).await;
    let (handle, mut events) = server.client().start();
    let mut status = handle.subscribe();
    let event = next(&mut events).await;
    assert_eq!(
        event.envelope.id.as_u128(),
        11,
        "only the application event"
    );
    assert_eq!(status.borrow_and_update().state, State::Connected);
    handle.stop().await.unwrap();
}

#[tokio::test]
async fn a_ready_frame_with_an_id_does_not_connect() {
    // Without the real control frame the stream never becomes ready, so
    // its end counts as a failure.
    let body = "id: 9\nevent: ready\ndata: {\"resync\":false}\n\n";
    let server = Scripted::start(vec![stream(body, false)]).await;
    let (handle, _events) = server
        .client()
        .backoff(Duration::from_millis(1), Duration::from_millis(5))
        .degraded_after(1)
        .start();
    let status = wait_for_state(&handle, State::Degraded).await;
    assert!(status.consecutive_failures >= 1);
    handle.stop().await.unwrap();
}

#[tokio::test]
async fn resync_fires_only_when_the_ready_frame_asks() {
    let server = Scripted::start(vec![
        stream(format!("retry: 1\n\n{}", ready(true)), false),
        stream(format!("retry: 1\n\n{}", ready(false)), false),
        stream(format!("retry: 1\n\n{}", ready(true)), true),
    ])
    .await;
    let (resyncs, mut resynced) = watch::channel(0usize);
    let (handle, _events) = server
        .client()
        .on_resync(move || {
            resyncs.send_modify(|n| *n += 1);
        })
        .start();
    server.wait_for_requests(3).await;
    wait_for_state(&handle, State::Connected).await;
    tokio::time::timeout(DEADLINE, resynced.wait_for(|n| *n == 2))
        .await
        .unwrap()
        .unwrap();
    handle.stop().await.unwrap();
    assert_eq!(*resynced.borrow(), 2);
}

#[tokio::test]
async fn a_refused_token_stops_the_client_after_one_request() {
    for status in [401, 403] {
        let server = Scripted::start(vec![refusal(status, "unauthorized")]).await;
        let (handle, _events) = server.client().start();
        let stopped = wait_for_state(&handle, State::Stopped).await;
        let error = stopped.last_error.expect("an error");
        assert!(
            matches!(&*error, ClientError::Unauthorized { status: s, code: Some(c) } if *s == status && c == "unauthorized"),
            "{error:?}"
        );
        let result = handle.join().await;
        assert!(matches!(result, Err(e) if e.status() == Some(status)));
        assert_eq!(server.requests().len(), 1);
    }
}

#[tokio::test]
async fn the_refresh_hook_gets_one_chance_then_the_client_stops() {
    let server = Scripted::start(vec![refusal(401, "unauthorized")]).await;
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let (handle, _events) = server
        .client()
        .on_unauthorized(move || {
            counted.fetch_add(1, Ordering::SeqCst);
            async { Ok::<(), ClientError>(()) }
        })
        .start();
    let result = handle.join().await;
    assert!(matches!(result, Err(e) if e.status() == Some(401)));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(server.requests().len(), 2);
}

#[tokio::test]
async fn the_refresh_chance_returns_after_a_successful_connection() {
    let server = Scripted::start(vec![
        refusal(401, "unauthorized"),
        stream(format!("retry: 1\n\n{}", ready(false)), false),
        refusal(401, "unauthorized"),
        stream(ready(false), true),
    ])
    .await;
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let (handle, _events) = server
        .client()
        .on_unauthorized(move || {
            counted.fetch_add(1, Ordering::SeqCst);
            async { Ok::<(), ClientError>(()) }
        })
        .start();
    server.wait_for_requests(4).await;
    wait_for_state(&handle, State::Connected).await;
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    handle.stop().await.unwrap();
}

#[tokio::test]
async fn a_failing_refresh_hook_stops_the_client() {
    let server = Scripted::start(vec![refusal(403, "forbidden")]).await;
    let (handle, _events) = server
        .client()
        .on_unauthorized(|| async { Err::<(), _>("the identity provider is down") })
        .start();
    let result = handle.join().await;
    assert!(
        matches!(
            result.as_ref().map_err(|e| &**e),
            Err(ClientError::Refresh(_))
        ),
        "{result:?}"
    );
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test]
async fn other_client_errors_are_terminal_and_server_errors_are_retried() {
    let server = Scripted::start(vec![refusal(400, "invalid_last_event_id")]).await;
    let (handle, _events) = server.client().start();
    let result = handle.join().await;
    assert!(matches!(
        result.as_ref().map_err(|e| &**e),
        Err(ClientError::Rejected { status: 400, .. })
    ));

    let server = Scripted::start(vec![
        refusal(503, "unavailable"),
        refusal(429, "too_many_connections"),
        stream(ready(false), true),
    ])
    .await;
    let (handle, _events) = server
        .client()
        .backoff(Duration::from_millis(1), Duration::from_millis(5))
        .start();
    let connected = wait_for_state(&handle, State::Connected).await;
    assert_eq!(connected.consecutive_failures, 0);
    assert_eq!(server.requests().len(), 3);
    handle.stop().await.unwrap();
}

#[tokio::test]
async fn degraded_after_the_configured_failures_and_back_on_success() {
    let mut replies = vec![refusal(503, "unavailable"); 3];
    // The fourth answer is slow, so the degraded state lasts long enough
    // to be seen on the watch channel (which keeps only the latest value).
    let mut recovered = stream(ready(false), true);
    recovered.delay = Duration::from_millis(500);
    replies.push(recovered);
    let server = Scripted::start(replies).await;
    let (handle, _events) = server
        .client()
        .backoff(Duration::from_millis(1), Duration::from_millis(5))
        .degraded_after(3)
        .start();
    let degraded = wait_for_state(&handle, State::Degraded).await;
    assert_eq!(degraded.consecutive_failures, 3);
    assert!(matches!(
        degraded.last_error.as_deref(),
        Some(ClientError::Unavailable { status: 503, .. })
    ));
    assert_eq!(server.requests().len(), 3);
    let connected = wait_for_state(&handle, State::Connected).await;
    assert_eq!(connected.consecutive_failures, 0);
    assert!(connected.last_error.is_none());
    handle.stop().await.unwrap();
}

#[tokio::test]
async fn a_body_that_is_not_an_event_stream_is_a_failure() {
    let server = Scripted::start(vec![Reply {
        status: 200,
        content_type: "text/html",
        body: "<html>login</html>".into(),
        hold: false,
        delay: Duration::ZERO,
        then: None,
    }])
    .await;
    let (handle, _events) = server
        .client()
        .backoff(Duration::from_millis(1), Duration::from_millis(5))
        .degraded_after(2)
        .start();
    let degraded = wait_for_state(&handle, State::Degraded).await;
    assert!(matches!(
        degraded.last_error.as_deref(),
        Some(ClientError::NotEventStream(_))
    ));
    handle.stop().await.unwrap();
}

#[tokio::test]
async fn the_request_builder_runs_on_every_connect() {
    let server =
        Scripted::start(vec![stream(format!("retry: 1\n\n{}", ready(false)), false)]).await;
    let built = Arc::new(AtomicUsize::new(0));
    let counter = built.clone();
    let url = server.url.clone();
    let (handle, _events) = ClientBuilder::new_async(move |http| {
        let n = counter.fetch_add(1, Ordering::SeqCst);
        let url = url.clone();
        async move { Ok::<_, ClientError>(http.get(url).bearer_auth(format!("token-{n}"))) }
    })
    .start();
    let requests = server.wait_for_requests(3).await;
    for (n, request) in requests.iter().take(3).enumerate() {
        assert!(
            request.contains(&format!("authorization: bearer token-{n}")),
            "{request}"
        );
    }
    handle.stop().await.unwrap();
    assert!(built.load(Ordering::SeqCst) >= 3);
}

#[tokio::test]
async fn stop_ends_the_task_and_closes_the_connection() {
    let mut server = Scripted::start(vec![stream(ready(false), true)]).await;
    let (handle, mut events) = server.client().start();
    let status = handle.subscribe();
    wait_for_state(&handle, State::Connected).await;
    handle.stop().await.unwrap();
    assert_eq!(status.borrow().state, State::Stopped);
    assert!(status.borrow().last_error.is_none());
    let closed = tokio::time::timeout(DEADLINE, server.closed.recv()).await;
    assert_eq!(closed.unwrap(), Some(0));
    assert!(events.recv().await.is_none(), "the event channel is closed");
}

#[tokio::test]
async fn dropping_the_receiver_stops_the_client() {
    let server = Scripted::start(vec![stream(ready(false), true)]).await;
    let (handle, events) = server.client().start();
    wait_for_state(&handle, State::Connected).await;
    drop(events);
    tokio::time::timeout(DEADLINE, handle.join())
        .await
        .expect("stopped before the deadline")
        .unwrap();
}

#[tokio::test]
async fn a_silent_connection_is_abandoned_after_the_idle_timeout() {
    let server = Scripted::start(vec![stream(format!("retry: 1\n\n{}", ready(false)), true)]).await;
    let (handle, _events) = server
        .client()
        .idle_timeout(Some(Duration::from_millis(200)))
        .start();
    server.wait_for_requests(2).await;
    handle.stop().await.unwrap();
}

// Token renewal: the token provider and the relay's `reauth` warning.

fn reauth() -> String {
    "event: reauth\ndata: {\"expiresIn\":2}\n\n".to_owned()
}

/// A token provider handing out token-0, token-1, …, and how many it gave.
fn numbered_tokens() -> (
    Arc<AtomicUsize>,
    impl Fn() -> std::future::Ready<Result<String, ClientError>> + Send + Sync + 'static,
) {
    let issued = Arc::new(AtomicUsize::new(0));
    let counter = issued.clone();
    let provider = move || {
        let n = counter.fetch_add(1, Ordering::SeqCst);
        std::future::ready(Ok(format!("token-{n}")))
    };
    (issued, provider)
}

fn authorization(request: &str) -> Option<&str> {
    request
        .lines()
        .find_map(|line| line.strip_prefix("authorization: "))
}

/// The next `count` events' ids, as the numbers the envelopes were made from.
async fn next_ids(events: &mut mpsc::Receiver<Event>, count: usize) -> Vec<u128> {
    let mut ids = Vec::new();
    for _ in 0..count {
        ids.push(next(events).await.envelope.id.as_u128());
    }
    ids
}

/// Stops the client and answers the events it had delivered but nobody read.
async fn stop_and_drain(handle: ClientHandle, mut events: mpsc::Receiver<Event>) -> Vec<u128> {
    handle.stop().await.unwrap();
    let mut rest = Vec::new();
    while let Some(event) = events.recv().await {
        rest.push(event.envelope.id.as_u128());
    }
    rest
}

#[tokio::test]
async fn on_reauth_the_next_stream_opens_with_a_fresh_token_and_the_old_one_closes_at_its_ready() {
    let mut server = Scripted::start(vec![
        // Held open: only the client can end it.
        stream(
            format!(
                "{}{}{}{}",
                ready(true),
                durable(1, 1),
                durable(2, 2),
                reauth()
            ),
            true,
        ),
        // The replay reaches back before the watermark, as the relay's
        // lookback does, then goes live.
        stream(
            format!(
                "{}{}{}{}",
                durable(2, 2),
                durable(3, 3),
                ready(false),
                durable(4, 4)
            ),
            true,
        ),
    ])
    .await;
    let (issued, provider) = numbered_tokens();
    let resyncs = Arc::new(AtomicUsize::new(0));
    let counted = resyncs.clone();
    let (handle, mut events) = server
        .client()
        .token_provider(provider)
        .on_resync(move || {
            counted.fetch_add(1, Ordering::SeqCst);
        })
        .start();
    let mut status = handle.subscribe();
    assert_eq!(next_ids(&mut events, 4).await, [1, 2, 3, 4]);
    let closed = tokio::time::timeout(DEADLINE, server.closed.recv()).await;
    assert_eq!(closed.unwrap(), Some(0), "the old stream is closed");

    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(authorization(&requests[0]), Some("bearer token-0"));
    assert_eq!(authorization(&requests[1]), Some("bearer token-1"));
    assert_eq!(last_event_id(&requests[1]), Some("2"));
    assert_eq!(issued.load(Ordering::SeqCst), 2);
    assert_eq!(resyncs.load(Ordering::SeqCst), 1, "the first stream only");
    // Connected since the first `ready`: the hand-over is no reconnect.
    assert_eq!(status.borrow_and_update().state, State::Connected);
    assert!(
        !status.has_changed().unwrap(),
        "no state change after connecting"
    );
    assert_eq!(stop_and_drain(handle, events).await, Vec::<u128>::new());
}

#[tokio::test]
async fn a_refused_renewal_leaves_the_old_stream_on_and_its_end_reconnects_with_another_token() {
    let release = Arc::new(Notify::new());
    let mut first = stream(
        format!("{}{}{}", ready(true), durable(1, 1), reauth()),
        false,
    );
    first.then = Some((release.clone(), durable(2, 2)));
    let server = Scripted::start(vec![
        first,
        refusal(401, "unauthorized"),
        stream(
            format!("{}{}{}", durable(2, 2), ready(false), durable(3, 3)),
            true,
        ),
    ])
    .await;
    let (issued, provider) = numbered_tokens();
    let (handle, mut events) = server
        .client()
        .backoff(Duration::from_millis(1), Duration::from_millis(5))
        .token_provider(provider)
        .start();
    assert_eq!(next_ids(&mut events, 1).await, [1]);
    server.wait_for_requests(2).await;
    // The old stream, still on, delivers and then ends.
    release.notify_one();
    assert_eq!(next_ids(&mut events, 2).await, [2, 3]);

    let requests = server.requests();
    let tokens: Vec<_> = requests.iter().map(|r| authorization(r)).collect();
    assert_eq!(
        tokens,
        [
            Some("bearer token-0"),
            Some("bearer token-1"),
            Some("bearer token-2")
        ],
        "the refused token is not sent again"
    );
    assert_eq!(last_event_id(&requests[2]), Some("2"));
    assert_eq!(issued.load(Ordering::SeqCst), 3);
    wait_for_state(&handle, State::Connected).await;
    assert_eq!(stop_and_drain(handle, events).await, Vec::<u128>::new());
}

#[tokio::test]
async fn when_the_old_stream_ends_before_the_new_one_is_ready_the_new_one_carries_on() {
    let mut next_stream = stream(
        format!(
            "{}{}{}{}",
            durable(1, 1),
            durable(2, 2),
            ready(false),
            durable(3, 3)
        ),
        true,
    );
    // Answers only after the old stream has ended.
    next_stream.delay = Duration::from_millis(300);
    let server = Scripted::start(vec![
        stream(
            format!("{}{}{}", ready(true), durable(1, 1), reauth()),
            false,
        ),
        next_stream,
    ])
    .await;
    let (issued, provider) = numbered_tokens();
    let (handle, mut events) = server.client().token_provider(provider).start();
    let reconnecting = wait_for_state(&handle, State::Reconnecting).await;
    assert!(reconnecting.last_error.is_none(), "{reconnecting:?}");
    assert_eq!(next_ids(&mut events, 3).await, [1, 2, 3]);
    wait_for_state(&handle, State::Connected).await;
    assert_eq!(server.requests().len(), 2, "no third connection");
    assert_eq!(issued.load(Ordering::SeqCst), 2);
    assert_eq!(stop_and_drain(handle, events).await, Vec::<u128>::new());
}

#[tokio::test]
async fn a_stream_that_ends_before_ready_drops_its_token() {
    // What the relay does with a token just past its expiry but within its
    // clock leeway: accepts it, and ends the stream at once.
    let server = Scripted::start(vec![
        stream(
            format!("retry: 1\n\n{}{}", ready(true), durable(1, 1)),
            false,
        ),
        stream("", false),
        stream(format!("{}{}", ready(false), durable(2, 2)), true),
    ])
    .await;
    let (issued, provider) = numbered_tokens();
    let (handle, mut events) = server.client().token_provider(provider).start();
    assert_eq!(next_ids(&mut events, 2).await, [1, 2]);
    let tokens: Vec<_> = server
        .requests()
        .iter()
        .map(|r| authorization(r).map(str::to_owned))
        .collect();
    let expected = ["bearer token-0", "bearer token-0", "bearer token-1"];
    assert_eq!(tokens, expected.map(|t| Some(t.to_owned())));
    assert_eq!(issued.load(Ordering::SeqCst), 2);
    handle.stop().await.unwrap();
}

#[tokio::test]
async fn a_refused_token_is_replaced_once_and_a_second_refusal_in_a_row_stops() {
    let server = Scripted::start(vec![
        refusal(401, "unauthorized"),
        stream(format!("retry: 1\n\n{}", ready(false)), false),
        refusal(401, "unauthorized"),
    ])
    .await;
    let (issued, provider) = numbered_tokens();
    let (handle, _events) = server.client().token_provider(provider).start();
    let result = handle.join().await;
    assert!(matches!(result, Err(e) if e.status() == Some(401)));
    let tokens: Vec<_> = server
        .requests()
        .iter()
        .map(|r| authorization(r).map(str::to_owned))
        .collect();
    // Refused, replaced and ready; the same token again after the clean
    // end (refused); replaced once more (refused): stop.
    let expected = [
        "bearer token-0",
        "bearer token-1",
        "bearer token-1",
        "bearer token-2",
    ];
    assert_eq!(tokens, expected.map(|t| Some(t.to_owned())));
    assert_eq!(issued.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn the_provider_token_replaces_the_builder_one_and_its_failure_is_retried() {
    let server = Scripted::start(vec![stream(ready(false), true)]).await;
    let url = server.url.clone();
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let (handle, _events) =
        ClientBuilder::new(move |http| http.get(&url).bearer_auth("from-the-builder"))
            .backoff(Duration::from_millis(1), Duration::from_millis(5))
            .token_provider(move || {
                let n = counted.fetch_add(1, Ordering::SeqCst);
                async move {
                    if n == 0 {
                        Err("the identity provider is down")
                    } else {
                        Ok("fresh".to_owned())
                    }
                }
            })
            .start();
    wait_for_state(&handle, State::Connected).await;
    let requests = server.requests();
    assert_eq!(requests.len(), 1, "no request without a token");
    assert_eq!(authorization(&requests[0]), Some("bearer fresh"));
    assert_eq!(
        requests[0].matches("authorization:").count(),
        1,
        "{}",
        requests[0]
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    handle.stop().await.unwrap();
}

#[tokio::test]
async fn a_warning_during_the_replay_renews_too() {
    // A short token and a long replay: the warning comes before `ready`.
    let mut server = Scripted::start(vec![
        stream(format!("{}{}", durable(1, 1), reauth()), true),
        stream(
            format!("{}{}{}", durable(1, 1), durable(2, 2), ready(false)),
            true,
        ),
    ])
    .await;
    let (issued, provider) = numbered_tokens();
    let (handle, mut events) = server
        .client()
        .last_event_id("0")
        .token_provider(provider)
        .start();
    assert_eq!(next_ids(&mut events, 2).await, [1, 2]);
    let closed = tokio::time::timeout(DEADLINE, server.closed.recv()).await;
    assert_eq!(closed.unwrap(), Some(0), "the old stream is closed");
    wait_for_state(&handle, State::Connected).await;
    assert_eq!(last_event_id(&server.requests()[1]), Some("1"));
    assert_eq!(issued.load(Ordering::SeqCst), 2);
    assert_eq!(stop_and_drain(handle, events).await, Vec::<u128>::new());
}
