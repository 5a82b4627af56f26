//! A real relay on port 0 for tests, with its own actix system on its own
//! thread, and a small SSE reader over TCP.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use eventrelay::auth::{
    Algorithm, AuthConfig, JwtConfig, MintOptions, SubscriberResolver, TokenSpec, build_resolver,
    mint_token,
};
use eventrelay::config::Config;
use eventrelay_client::sse::{SseItem, SseParser};
use futures_util::StreamExt;
use serde_json::Value;
use tokio::sync::oneshot;

use super::{DEADLINE, TestDb, eventually};

pub const TEST_SECRET: &str = "test-secret-that-is-long-enough-for-hs256";
pub const PUBLISH_TOKEN: &str = "publish-token-for-tests";

pub struct TestServer {
    pub base: String,
    stop: Option<oneshot::Sender<()>>,
    /// Keeps the actix system running after the relay stopped, as an
    /// application embedding the relay would, until dropped.
    linger: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TestServer {
    /// Starts a relay on `db` with the test defaults, adjusted by `tweak`.
    pub fn start(db: &TestDb, tweak: impl FnOnce(&mut Config)) -> TestServer {
        Self::start_with(db, tweak, None)
    }

    /// Starts a relay whose subscribers are resolved by `resolver` (library
    /// mode) instead of the configured JWT auth.
    pub fn start_with(
        db: &TestDb,
        tweak: impl FnOnce(&mut Config),
        resolver: Option<Arc<dyn SubscriberResolver>>,
    ) -> TestServer {
        Self::start_inner(db, tweak, resolver, None)
    }

    /// Starts a relay that reloads on `POST /v1/admin/reload` (admin token
    /// [`ADMIN_TOKEN`]) from the configuration the returned handle holds.
    pub fn start_reloadable(
        db: &TestDb,
        tweak: impl FnOnce(&mut Config),
    ) -> (TestServer, Reloadable) {
        let next = Arc::new(std::sync::Mutex::new(None::<Config>));
        let levels = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let (_, requests) = eventrelay::reload::channel();
        let (load_from, record) = (Arc::clone(&next), Arc::clone(&levels));
        let reloading = eventrelay::reload::Reloading {
            load: Box::new(move || {
                let config = load_from.lock().unwrap().clone().unwrap();
                config.validate()?;
                Ok(config)
            }),
            set_log_level: Box::new(move |level| {
                record.lock().unwrap().push(level.to_owned());
                Ok(())
            }),
            requests,
        };
        let mut started = None;
        let server = Self::start_inner(
            db,
            |c| {
                c.admin.token = Some(ADMIN_TOKEN.into());
                tweak(c);
                started = Some(c.clone());
            },
            None,
            Some(reloading),
        );
        *next.lock().unwrap() = started;
        (server, Reloadable { next, levels })
    }

    fn start_inner(
        db: &TestDb,
        tweak: impl FnOnce(&mut Config),
        resolver: Option<Arc<dyn SubscriberResolver>>,
        reloading: Option<eventrelay::reload::Reloading>,
    ) -> TestServer {
        let mut config = Config::default();
        config.database.url = Some(db.url.clone().into());
        config.database.schema = db.schema.to_string();
        config.database.channel = db.channel.to_string();
        config.database.wakeup = db.wakeup;
        config.database.pool_size = 4;
        config.http.workers = 1;
        config.hub.arbiters = 1;
        config.publish.token = Some(PUBLISH_TOKEN.into());
        config.auth = Some(AuthConfig::Jwt(JwtConfig {
            algorithm: Algorithm::HS256,
            secret: Some(TEST_SECRET.into()),
            leeway_secs: 0,
            ..JwtConfig::default()
        }));
        tweak(&mut config);
        config.validate().expect("test config is valid");
        let resolver =
            resolver.unwrap_or_else(|| build_resolver(config.auth.as_ref().unwrap()).unwrap());
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = oneshot::channel::<()>();
        let (linger, lingered) = oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            actix_web::rt::System::new().block_on(async move {
                let shutdown = async move {
                    let _ = stopped.await;
                };
                if let Err(error) =
                    eventrelay::server::run_with(config, resolver, listener, shutdown, reloading)
                        .await
                {
                    panic!("relay failed: {error}");
                }
                let _ = lingered.await;
            });
        });
        TestServer {
            base,
            stop: Some(stop),
            linger: Some(linger),
            thread: Some(thread),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Waits until `/readyz` says the database and listener are up.
    pub async fn ready(&self) {
        super::wait_ready(&self.base).await
    }

    /// Calls the admin API with `token`; the status and the JSON answer
    /// (`null` for an empty one).
    pub async fn admin(
        &self,
        token: &str,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut request = reqwest::Client::new()
            .request(method, self.url(path))
            .bearer_auth(token);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        let body = match text.is_empty() {
            true => Value::Null,
            false => serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{path}: not JSON ({e}): {text}")),
        };
        (status, body)
    }

    /// A metric's value from `/metrics` (see [`super::metric`]).
    pub async fn metric(&self, name: &str) -> f64 {
        super::metric(&self.base, name).await
    }

    /// Connects to the stream; `Err` carries the refusal's status and body.
    pub async fn connect(
        &self,
        token: Option<&str>,
        last_event_id: Option<&str>,
        query: &str,
    ) -> Result<SseStream, (u16, Value)> {
        let mut request = reqwest::Client::new().get(self.url(&format!("/v1/events{query}")));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(id) = last_event_id {
            request = request.header("last-event-id", id);
        }
        let response = request.send().await.expect("relay answers");
        let status = response.status().as_u16();
        if status != 200 {
            let body = response.json().await.unwrap_or(Value::Null);
            return Err((status, body));
        }
        Ok(SseStream::new(response))
    }

    /// Like `subscribe`, with a raw `Authorization` header.
    pub async fn subscribe_with_header(&self, authorization: &str) -> (SseStream, bool) {
        let response = reqwest::Client::new()
            .get(self.url("/v1/events"))
            .header("authorization", authorization)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let mut stream = SseStream::new(response);
        let resync = stream.ready().await;
        (stream, resync)
    }

    /// Connects and reads through the `ready` frame; returns its `resync`.
    pub async fn subscribe(
        &self,
        token: &str,
        last_event_id: Option<&str>,
        query: &str,
    ) -> (SseStream, bool) {
        let mut stream = self
            .connect(Some(token), last_event_id, query)
            .await
            .unwrap_or_else(|e| panic!("connect refused: {e:?}"));
        let resync = stream.ready().await;
        (stream, resync)
    }

    pub async fn publish(&self, body: Value) -> (u16, Value) {
        let response = reqwest::Client::new()
            .post(self.url("/v1/events"))
            .bearer_auth(PUBLISH_TOKEN)
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }
}

impl TestServer {
    /// Emits 60 KB durable events in `scope` until the relay drops a
    /// subscriber too slow for its queue. Big frames fill a non-reading
    /// client's socket buffers quickly; after that its queue fills. A
    /// `reader` given here reads along, so it is never the one dropped.
    pub async fn flood_until_a_slow_subscriber_is_dropped(
        &self,
        db: &TestDb,
        scope: &str,
        mut reader: Option<&mut SseStream>,
    ) {
        use eventrelay::publisher::{NewEvent, Publisher};
        let payload = "x".repeat(60_000);
        let publisher = Publisher::new(db.schema.as_str()).unwrap();
        let client = db.connect().await;
        // Loopback sockets grow their buffers to megabytes before the
        // queue even starts to fill, and under a full parallel test run
        // each 60 KB emit is slow: the flood gets three times the usual
        // wait.
        let deadline = tokio::time::Instant::now() + 3 * DEADLINE;
        while self
            .metric("eventrelay_slow_subscribers_dropped_total")
            .await
            < 1.0
        {
            assert!(
                tokio::time::Instant::now() < deadline,
                "slow subscriber never dropped"
            );
            for _ in 0..16 {
                publisher
                    .emit(
                        &client,
                        NewEvent::durable("bulk", scope, serde_json::json!({"pad": payload})),
                    )
                    .await
                    .unwrap();
            }
            if let Some(reader) = reader.as_deref_mut() {
                reader.events(16).await;
            }
        }
    }
}

impl TestServer {
    /// Stops the relay but keeps its actix system running, as in an
    /// application that embeds the relay and goes on afterwards.
    pub fn stop_keeping_the_runtime(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

impl TestServer {
    /// Waits, up to the deadline, until metric `name` satisfies `wanted`;
    /// returns its value then.
    pub async fn wait_for_metric(&self, name: &str, wanted: impl Fn(f64) -> bool) -> f64 {
        eventually(&format!("{name} reaches the wanted value"), async || {
            let value = self.metric(name).await;
            wanted(value).then_some(value)
        })
        .await
    }
}

/// The admin token of a reloadable test relay.
pub const ADMIN_TOKEN: &str = "test-admin-token-long-enough";

/// The configuration a reloadable test relay reads on its next reload,
/// and the log filters it was asked to apply.
pub struct Reloadable {
    next: Arc<std::sync::Mutex<Option<Config>>>,
    levels: Arc<std::sync::Mutex<Vec<String>>>,
}

impl Reloadable {
    /// Changes what the next reload reads.
    pub fn change(&self, edit: impl FnOnce(&mut Config)) {
        let mut next = self.next.lock().unwrap();
        if let Some(config) = next.as_mut() {
            edit(config);
        }
    }

    /// The `log.level` filters applied so far.
    pub fn log_levels(&self) -> Vec<String> {
        self.levels.lock().unwrap().clone()
    }
}

impl TestServer {
    /// `POST /v1/admin/reload`: the status and the answer.
    pub async fn reload(&self) -> (u16, Value) {
        let response = reqwest::Client::new()
            .post(self.url("/v1/admin/reload"))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        drop(self.linger.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A development token for the test secret.
pub fn token(subscriber: &str, scope: &str, grants: Value) -> String {
    token_for(subscriber, scope, grants, Duration::from_secs(600))
}

pub fn token_for(subscriber: &str, scope: &str, grants: Value, ttl: Duration) -> String {
    mint_with(TEST_SECRET, subscriber, &[scope], grants, ttl)
}

/// A development token for the test secret granting several scopes (the
/// scope claim an array).
pub fn token_for_scopes(subscriber: &str, scopes: &[&str], grants: Value, ttl: Duration) -> String {
    mint_with(TEST_SECRET, subscriber, scopes, grants, ttl)
}

/// A token signed with `secret` instead of the test secret.
pub fn token_with_secret(secret: &str, subscriber: &str, scope: &str) -> String {
    mint_with(
        secret,
        subscriber,
        &[scope],
        Value::Object(Default::default()),
        Duration::from_secs(600),
    )
}

/// A token granting `scopes` (the first, and the rest as an array).
fn mint_with(
    secret: &str,
    subscriber: &str,
    scopes: &[&str],
    grants: Value,
    ttl: Duration,
) -> String {
    mint_token(
        secret,
        Algorithm::HS256,
        &TokenSpec {
            subscriber_id: subscriber.into(),
            scope_key: scopes[0].into(),
            more_scopes: scopes[1..].iter().map(|scope| scope.to_string()).collect(),
            grants,
            ttl,
        },
        &MintOptions::default(),
    )
    .unwrap()
}

/// One item of a stream as the client crate's parser reads it: an event, a
/// heartbeat comment or a `retry:` field.
#[derive(Debug, Clone, PartialEq)]
pub struct Frame {
    pub id: Option<String>,
    pub event: Option<String>,
    pub data: String,
    pub comment: Option<String>,
    pub retry: Option<String>,
}

impl From<SseItem> for Frame {
    fn from(item: SseItem) -> Frame {
        let mut frame = Frame {
            id: None,
            event: None,
            data: String::new(),
            comment: None,
            retry: None,
        };
        match item {
            SseItem::Event(event) => {
                frame.id = event.id;
                frame.event = Some(event.event_type);
                frame.data = event.data;
            }
            SseItem::Comment(text) => frame.comment = Some(text),
            SseItem::Retry(delay) => frame.retry = Some(delay.as_millis().to_string()),
        }
        frame
    }
}

impl Frame {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.data).unwrap()
    }

    /// The seq a durable frame's `id:` (a resume cursor, `<seq>.<horizon>`)
    /// names.
    pub fn seq(&self) -> Option<i64> {
        id_seq(self.id.as_deref()?)
    }
}

/// The seq a resume cursor names.
pub fn id_seq(id: &str) -> Option<i64> {
    id.split('.').next()?.parse().ok()
}

pub struct SseStream {
    body: std::pin::Pin<Box<dyn futures_util::Stream<Item = reqwest::Result<bytes::Bytes>> + Send>>,
    /// The client crate's parser, keeping comments for the heartbeat tests.
    parser: SseParser,
    /// Items parsed from a chunk and not yet handed out.
    parsed: VecDeque<SseItem>,
    /// Event frames received before `ready` (set by `TestServer::subscribe`).
    pub replayed: Vec<Frame>,
    /// The last `ready` frame's data.
    pub ready_data: Value,
}

impl SseStream {
    /// Reads the stream of an accepted `GET /v1/events`.
    pub fn new(response: reqwest::Response) -> Self {
        SseStream {
            body: Box::pin(response.bytes_stream()),
            parser: SseParser::keeping_comments(),
            parsed: VecDeque::new(),
            replayed: Vec::new(),
            ready_data: Value::Null,
        }
    }

    /// The next frame of any kind; `None` when the stream ended. Panics
    /// after the deadline.
    pub async fn next_frame(&mut self) -> Option<Frame> {
        tokio::time::timeout(DEADLINE, self.read_frame())
            .await
            .expect("a frame arrives before the deadline")
    }

    async fn read_frame(&mut self) -> Option<Frame> {
        loop {
            if let Some(item) = self.parsed.pop_front() {
                return Some(Frame::from(item));
            }
            match self.body.next().await {
                Some(Ok(chunk)) => {
                    let mut items = Vec::new();
                    self.parser.feed_into(&chunk, &mut items);
                    self.parsed.extend(items);
                }
                _ => return None,
            }
        }
    }

    /// Reads through the `ready` frame, keeping the event frames replayed
    /// before it in `replayed`; returns its `resync`.
    pub async fn ready(&mut self) -> bool {
        let mut replayed = Vec::new();
        loop {
            let frame = self.next_frame().await.expect("stream open until ready");
            if frame.event.as_deref() == Some("ready") {
                self.replayed = replayed;
                self.ready_data = frame.json();
                return self.ready_data["resync"].as_bool().unwrap();
            }
            if frame.event.is_some() {
                replayed.push(frame);
            }
        }
    }

    /// The next event frame, skipping comments and `retry:`.
    pub async fn next_event(&mut self) -> Frame {
        loop {
            let frame = self.next_frame().await.expect("stream still open");
            if frame.event.is_some() {
                return frame;
            }
        }
    }

    /// Collects `count` event frames.
    pub async fn events(&mut self, count: usize) -> Vec<Frame> {
        let mut events = Vec::with_capacity(count);
        while events.len() < count {
            events.push(self.next_event().await);
        }
        events
    }

    /// The event type of the stream's last frame (heartbeats aside), once
    /// it ends before the deadline.
    pub async fn last_event(&mut self) -> Option<String> {
        let mut last = None;
        while let Some(frame) = self.next_frame().await {
            if frame.comment.is_none() {
                last = frame.event;
            }
        }
        last
    }

    /// True when the stream ends (skipping heartbeats and `reauth`) before
    /// the deadline.
    pub async fn ends(&mut self) -> bool {
        loop {
            match self.next_frame().await {
                None => return true,
                Some(frame) if frame.comment.is_some() => continue,
                // The warning that the token expires comes before its end.
                Some(frame) if frame.event.as_deref() == Some("reauth") => continue,
                Some(frame) => panic!("expected the end of the stream, got {frame:?}"),
            }
        }
    }
}

impl SseStream {
    /// Whether the stream ends (skipping heartbeats) within `limit`: for
    /// ends that wait on something slower than [`DEADLINE`], such as a
    /// failover.
    pub async fn ends_within(&mut self, limit: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            match tokio::time::timeout_at(deadline, self.read_frame()).await {
                Err(_) => return false,
                Ok(None) => return true,
                Ok(Some(frame)) if frame.comment.is_some() => continue,
                Ok(Some(frame)) => panic!("expected the end of the stream, got {frame:?}"),
            }
        }
    }
}

impl TestServer {
    /// Opens a stream over raw TCP and reads until its `ready` frame (or a
    /// refusal's head); answers the socket and the status line.
    pub async fn open_raw_stream(&self, bearer: &str) -> (tokio::net::TcpStream, String) {
        let address = self.base.trim_start_matches("http://");
        let socket = tokio::net::TcpStream::connect(address).await.unwrap();
        self.open_raw_stream_on(socket, bearer).await
    }

    /// Like [`TestServer::open_raw_stream`], on a socket the test connected.
    pub async fn open_raw_stream_on(
        &self,
        mut socket: tokio::net::TcpStream,
        bearer: &str,
    ) -> (tokio::net::TcpStream, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let address = self.base.trim_start_matches("http://");
        let request = format!(
            "GET /v1/events HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer {bearer}\r\nAccept: text/event-stream\r\n\r\n"
        );
        socket.write_all(request.as_bytes()).await.unwrap();
        let mut seen = Vec::new();
        let mut buffer = [0u8; 4096];
        let deadline = tokio::time::Instant::now() + DEADLINE;
        loop {
            let text = String::from_utf8_lossy(&seen).into_owned();
            if text.contains("event: ready")
                || (text.contains("\r\n\r\n") && !text.starts_with("HTTP/1.1 200"))
            {
                let status = text.lines().next().unwrap_or_default().to_owned();
                return (socket, status);
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no ready frame: {text}"
            );
            let read = tokio::time::timeout(DEADLINE, socket.read(&mut buffer))
                .await
                .unwrap()
                .unwrap();
            assert!(read > 0, "the relay closed the stream early: {text}");
            seen.extend_from_slice(&buffer[..read]);
        }
    }
}

/// Reads until the relay closes the connection (EOF or reset), within the
/// deadline; answers everything read.
pub async fn read_until_closed(socket: &mut tokio::net::TcpStream) -> Vec<u8> {
    use tokio::io::AsyncReadExt;
    let mut seen = Vec::new();
    let mut buffer = [0u8; 16 * 1024];
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match tokio::time::timeout(left, socket.read(&mut buffer)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return seen,
            Ok(Ok(read)) => seen.extend_from_slice(&buffer[..read]),
            Err(_) => panic!("the connection was never closed"),
        }
    }
}
