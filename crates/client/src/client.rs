//! The reconnecting subscriber: one background task per client that
//! connects to `GET /v1/events`, parses the stream, de-duplicates envelopes,
//! and reconnects with full-jitter backoff from a durable-only watermark.
//!
//! The application sees three things: events on a bounded channel (so a slow
//! consumer applies backpressure to the connection instead of growing
//! memory), the connection state on a `watch` channel (a current value, not
//! a log), and a resync callback.
//!
//! With a token provider, a stream whose token expires is replaced without
//! a gap: at the relay's `reauth` warning the next stream opens with a fresh
//! token while the current one still delivers, both are read until the new
//! one is `ready` (the seen ids drop what both deliver), and then the old
//! one is closed.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use eventrelay_wire::sse::{PRESENCE_EVENT, READY_EVENT, REAUTH_EVENT, REVOKED_EVENT};
use eventrelay_wire::{EventEnvelope, is_control_event_type};
use reqwest::StatusCode;
use reqwest::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderValue};
use serde::Deserialize;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use crate::backoff::Backoff;
use crate::error::{BoxError, ClientError};
use crate::presence::{Presence, PresenceChange, Presences};
use crate::seen::SeenIds;
use crate::sse::{SseEvent, SseItem, SseParser};

/// What the request builder returns: a request, built fresh for every
/// connection attempt.
pub type RequestFuture =
    Pin<Box<dyn Future<Output = Result<reqwest::RequestBuilder, BoxError>> + Send>>;
type BuildRequest = Arc<dyn Fn(reqwest::Client) -> RequestFuture + Send + Sync>;
type Refresh =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Result<(), BoxError>> + Send>> + Send + Sync>;
type OnResync = Arc<dyn Fn() + Send + Sync>;
type OnScopeResync = Arc<dyn Fn(&str) + Send + Sync>;
type OnPresence = Arc<dyn Fn(&Presence, &PresenceChange) + Send + Sync>;
/// What the token provider returns: a fresh bearer token.
type TokenFuture = Pin<Box<dyn Future<Output = Result<String, BoxError>> + Send>>;
type TokenProvider = Arc<dyn Fn() -> TokenFuture + Send + Sync>;

/// The connection state, as the browser client names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum State {
    /// The first connection attempt is under way.
    Connecting,
    /// The relay said `ready`: the stream is live.
    Connected,
    /// The stream was lost; reconnecting with backoff.
    Reconnecting,
    /// Reconnecting, after enough consecutive failures that the application
    /// should fall back to polling until the state is `Connected` again.
    Degraded,
    /// Finished: stopped by the application, or a terminal error (see
    /// [`Status::last_error`]).
    Stopped,
}

/// The value on the state channel.
#[derive(Debug, Clone)]
pub struct Status {
    pub state: State,
    /// Connection attempts in a row that did not reach `ready`.
    pub consecutive_failures: u32,
    /// Why the last attempt failed, or why the client stopped. Cleared when
    /// a connection becomes ready.
    pub last_error: Option<Arc<ClientError>>,
}

/// One event for the application.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// The decoded `data:` line.
    pub envelope: EventEnvelope,
    /// The frame's `event:` (the envelope's type, as the relay sends it).
    pub event_type: String,
    /// The frame's `id:` (the seq as text), on durable events only. An
    /// application that persists its position stores this and passes it to
    /// [`ClientBuilder::last_event_id`] next time.
    pub sse_id: Option<String>,
}

/// Configures and starts a client.
pub struct ClientBuilder {
    build_request: BuildRequest,
    http: Option<reqwest::Client>,
    refresh: Option<Refresh>,
    token_provider: Option<TokenProvider>,
    on_resync: Option<OnResync>,
    on_scope_resync: Option<OnScopeResync>,
    on_presence: Option<OnPresence>,
    last_event_id: Option<String>,
    scopes: Vec<String>,
    initial_delay: Duration,
    max_delay: Duration,
    degraded_after: u32,
    dedupe_capacity: usize,
    channel_capacity: usize,
    idle_timeout: Option<Duration>,
}

impl ClientBuilder {
    /// A client whose request is built by `build_request` on every connect,
    /// so headers such as `Authorization` are read fresh each time. The
    /// client adds `Accept` and `Last-Event-ID` itself.
    ///
    /// ```no_run
    /// # async fn demo(token: String) {
    /// let (handle, mut events) = eventrelay_client::ClientBuilder::new(move |http| {
    ///     http.get("http://127.0.0.1:8080/v1/events").bearer_auth(&token)
    /// })
    /// .start();
    /// # }
    /// ```
    pub fn new<F>(build_request: F) -> Self
    where
        F: Fn(&reqwest::Client) -> reqwest::RequestBuilder + Send + Sync + 'static,
    {
        Self::with_build_request(Arc::new(move |http: reqwest::Client| {
            let request = build_request(&http);
            Box::pin(async move { Ok(request) }) as RequestFuture
        }))
    }

    /// Like [`new`](Self::new), for a builder that must await something,
    /// such as a token from a credential store. Its error counts as a failed
    /// connection attempt (retried with backoff).
    pub fn new_async<F, Fut, E>(build_request: F) -> Self
    where
        F: Fn(reqwest::Client) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<reqwest::RequestBuilder, E>> + Send + 'static,
        E: Into<BoxError>,
    {
        Self::with_build_request(Arc::new(move |http: reqwest::Client| {
            let future = build_request(http);
            Box::pin(async move { future.await.map_err(Into::into) }) as RequestFuture
        }))
    }

    fn with_build_request(build_request: BuildRequest) -> Self {
        ClientBuilder {
            build_request,
            http: None,
            refresh: None,
            token_provider: None,
            on_resync: None,
            on_scope_resync: None,
            on_presence: None,
            scopes: Vec::new(),
            last_event_id: None,
            initial_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(30),
            degraded_after: 3,
            dedupe_capacity: 1024,
            channel_capacity: 256,
            idle_timeout: Some(Duration::from_secs(60)),
        }
    }

    /// The HTTP client to connect with (default: one with a 10 s connect
    /// timeout and no overall timeout, which a stream must not have).
    pub fn http_client(mut self, http: reqwest::Client) -> Self {
        self.http = Some(http);
        self
    }

    /// Called when the relay's `ready` frame says `{"resync": true}`: on
    /// every connection without a `Last-Event-ID`, and when the watermark is
    /// older than the outbox still holds. Events committed before the
    /// subscription may not have been delivered, so re-read the state the
    /// application shows. Runs on the client's task: keep it short.
    pub fn on_resync<F>(mut self, on_resync: F) -> Self
    where
        F: Fn() + Send + Sync + 'static,
    {
        self.on_resync = Some(Arc::new(on_resync));
        self
    }

    /// The scopes the stream carries, added to the request as `scope=`
    /// parameters (sorted, without repeats). Several scopes share one
    /// connection; the credentials must grant each. Without any, the stream
    /// carries what the request asks for, or every scope the credentials
    /// grant.
    pub fn scopes<I, S>(mut self, scopes: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.scopes = scopes.into_iter().map(Into::into).collect();
        self.scopes.sort_unstable();
        self.scopes.dedup();
        self
    }

    /// On a stream of several scopes, called once for each scope `ready`
    /// says must resync (its events were pruned, or the watermark had no
    /// position in it), with the scope's key: re-read that scope's state
    /// only. Without this hook, [`on_resync`](Self::on_resync) is called
    /// once for them all. Runs on the client's task: keep it short.
    pub fn on_scope_resync<F>(mut self, on_scope_resync: F) -> Self
    where
        F: Fn(&str) + Send + Sync + 'static,
    {
        self.on_scope_resync = Some(Arc::new(on_scope_resync));
        self
    }

    /// Called with the scope's members and what changed, at each of the
    /// relay's `presence` frames (in a scope the relay has presence for):
    /// the first, after each connection's `ready`, is a snapshot. The
    /// members are also at [`ClientHandle::presence`]. Runs on the
    /// client's task: keep it short.
    pub fn on_presence<F>(mut self, on_presence: F) -> Self
    where
        F: Fn(&Presence, &PresenceChange) + Send + Sync + 'static,
    {
        self.on_presence = Some(Arc::new(on_presence));
        self
    }

    /// Called when the relay answers 401 or 403, to refresh credentials the
    /// request builder reads. The client then retries once at once; a second
    /// refusal in a row (or an error from the hook) stops it. The chance is
    /// given again after each successful connection, so a token that expires
    /// every few minutes is refreshed every few minutes, never in a loop.
    /// Without this hook, 401 and 403 stop the client.
    pub fn on_unauthorized<F, Fut, E>(mut self, refresh: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: Into<BoxError>,
    {
        self.refresh = Some(Arc::new(move || {
            let future = refresh();
            Box::pin(async move { future.await.map_err(Into::into) })
        }));
        self
    }

    /// Where the bearer token comes from, for tokens that expire: the client
    /// sends the token it returns as `Authorization: Bearer <token>` (in
    /// place of any the request builder sets). It is called for the first
    /// connection, after the relay refuses a token (401 or 403, one retry at
    /// once per successful connection, as with
    /// [`on_unauthorized`](Self::on_unauthorized), which runs first if set),
    /// after a stream ends before `ready` (a token just past its expiry is
    /// accepted within the relay's clock leeway, and its stream ends at
    /// once), and when the relay warns that the stream's token is about to
    /// expire (`event: reauth`). Then the client opens the next stream with
    /// the new token and the watermark while the current one still
    /// delivers, reads both, and closes the old one once the new one is
    /// `ready`: no event is lost, none is delivered twice, and the state
    /// stays [`State::Connected`]. Between calls the token is reused for
    /// reconnects. An error (or a token that is not a valid header value)
    /// counts as a failed attempt, retried with backoff.
    ///
    /// ```no_run
    /// # async fn fetch_token() -> Result<String, std::io::Error> { Ok(String::new()) }
    /// let (handle, mut events) = eventrelay_client::ClientBuilder::new(|http| {
    ///     http.get("http://127.0.0.1:8080/v1/events")
    /// })
    /// .token_provider(|| async { fetch_token().await })
    /// .start();
    /// ```
    pub fn token_provider<F, Fut, E>(mut self, provider: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<String, E>> + Send + 'static,
        E: Into<BoxError>,
    {
        self.token_provider = Some(Arc::new(move || {
            let future = provider();
            Box::pin(async move { future.await.map_err(Into::into) }) as TokenFuture
        }));
        self
    }

    /// Resume from a watermark saved earlier (an [`Event::sse_id`]): the
    /// first connection sends it as `Last-Event-ID`.
    pub fn last_event_id(mut self, id: impl Into<String>) -> Self {
        self.last_event_id = Some(id.into());
        self
    }

    /// The reconnect backoff: full jitter below a ceiling that starts at
    /// `initial` and doubles up to `max`. Once the relay sends `retry:`, that
    /// replaces `initial`.
    pub fn backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.initial_delay = initial;
        self.max_delay = max;
        self
    }

    /// After this many consecutive failed attempts (at least 1) the state is
    /// [`State::Degraded`] instead of [`State::Reconnecting`]. Default 3.
    pub fn degraded_after(mut self, failures: u32) -> Self {
        self.degraded_after = failures.max(1);
        self
    }

    /// How many envelope ids are remembered for de-duplication (default
    /// 1024; 0 turns it off).
    pub fn dedupe_capacity(mut self, capacity: usize) -> Self {
        self.dedupe_capacity = capacity;
        self
    }

    /// How many events may wait in the channel before the client stops
    /// reading the connection (default 256, at least 1).
    pub fn channel_capacity(mut self, capacity: usize) -> Self {
        self.channel_capacity = capacity.max(1);
        self
    }

    /// Reconnect when nothing, not even a heartbeat, arrives for this long
    /// (default 60 s, three relay heartbeats). `None` waits forever, which a
    /// half-open TCP connection would make literal.
    pub fn idle_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.idle_timeout = timeout;
        self
    }

    /// Spawns the client on the current tokio runtime (panics outside one).
    /// Events arrive on the returned receiver; dropping it stops the client.
    /// Dropping the handle does not: call [`ClientHandle::stop`].
    pub fn start(self) -> (ClientHandle, mpsc::Receiver<Event>) {
        let http = self.http.unwrap_or_else(|| {
            reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(10))
                .build()
                .unwrap_or_default()
        });
        let (events, receiver) = mpsc::channel(self.channel_capacity);
        let (status, status_receiver) = watch::channel(Status {
            state: State::Connecting,
            consecutive_failures: 0,
            last_error: None,
        });
        let (stop, stop_requested) = oneshot::channel();
        let presence = Arc::new(Mutex::new(Presences::default()));
        let mut runner = Runner {
            presence: Arc::clone(&presence),
            on_presence: self.on_presence,
            connector: Connector {
                http,
                build_request: self.build_request,
                scopes: self.scopes.into(),
                token_provider: self.token_provider,
                idle_timeout: self.idle_timeout,
            },
            refresh: self.refresh,
            on_resync: self.on_resync,
            on_scope_resync: self.on_scope_resync,
            degraded_after: self.degraded_after,
            token: None,
            events,
            status,
            backoff: Backoff::new(self.initial_delay, self.max_delay),
            seen: SeenIds::new(self.dedupe_capacity),
            watermark: self.last_event_id,
            failures: 0,
            refreshed: false,
            ready: false,
        };
        let task = tokio::spawn(async move {
            let receiver_gone = runner.events.clone();
            let result = tokio::select! {
                result = runner.run() => result,
                () = stop_signal(stop_requested) => Ok(()),
                () = receiver_gone.closed() => Ok(()),
            };
            // The run future, and with it the response, is dropped here,
            // which closes the connection.
            runner.finish(result)
        });
        let handle = ClientHandle {
            stop: Some(stop),
            task,
            status: status_receiver,
            presence,
        };
        (handle, receiver)
    }
}

/// Resolves when the handle asks to stop; a dropped handle never does.
async fn stop_signal(stop: oneshot::Receiver<()>) {
    if stop.await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Controls a running client.
#[derive(Debug)]
pub struct ClientHandle {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), Arc<ClientError>>>,
    status: watch::Receiver<Status>,
    presence: Arc<Mutex<Presences>>,
}

impl ClientHandle {
    /// Who is connected to the stream's scope, as the relay's `presence`
    /// frames last said; empty in a scope without presence. On a stream of
    /// several scopes, the first scope with presence (by key): see
    /// [`presence_of`](Self::presence_of).
    pub fn presence(&self) -> Presence {
        self.presences().first().unwrap_or_default()
    }

    /// Who is connected to `scope_key`, one of the stream's scopes with
    /// presence; `None` before its first snapshot.
    pub fn presence_of(&self, scope_key: &str) -> Option<Presence> {
        self.presences().get(scope_key)
    }

    fn presences(&self) -> Presences {
        self.presence
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The current status.
    pub fn status(&self) -> Status {
        self.status.borrow().clone()
    }

    /// The current state.
    pub fn state(&self) -> State {
        self.status.borrow().state
    }

    /// A receiver for state changes, e.g. to switch to polling while
    /// degraded: `receiver.wait_for(|s| s.state == State::Degraded)`.
    pub fn subscribe(&self) -> watch::Receiver<Status> {
        self.status.clone()
    }

    /// Ends the task and closes the connection, then returns how the client
    /// finished: `Ok` for this stop, the error if it had already stopped on
    /// a terminal one.
    pub async fn stop(mut self) -> Result<(), Arc<ClientError>> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.join().await
    }

    /// Waits until the client finishes by itself: a terminal error, or the
    /// event receiver dropped.
    pub async fn join(mut self) -> Result<(), Arc<ClientError>> {
        match (&mut self.task).await {
            Ok(result) => result,
            Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
            // Cancelled: the runtime is shutting down.
            Err(_) => Ok(()),
        }
    }
}

/// The `ready` frame's data. Other keys are ignored, so the relay may add
/// some.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ReadyData {
    resync: bool,
    /// On a stream of several scopes: those to resync.
    #[serde(default)]
    resync_scopes: Option<Vec<String>>,
}

/// How the streams of one [`Runner::follow`] ended.
enum End {
    /// The stream ended after `ready`.
    Closed,
    Failed(ClientError),
    ReceiverGone,
}

/// The application dropped the event receiver.
struct ReceiverGone;

/// What a frame means for the connection loop, beyond any event it
/// delivered.
enum Control {
    Nothing,
    /// The relay's `ready`, with what it says to resync.
    Ready(ReadyData),
    /// The relay's warning that the stream's token expires soon.
    Reauth,
}

/// What opening a stream needs, kept apart from the runner so that the next
/// stream can open while the runner reads the current one.
#[derive(Clone)]
struct Connector {
    http: reqwest::Client,
    build_request: BuildRequest,
    /// Added to every request as `scope=` parameters.
    scopes: Arc<[String]>,
    token_provider: Option<TokenProvider>,
    idle_timeout: Option<Duration>,
}

/// A stream on its way.
type Opening = Pin<Box<dyn Future<Output = Opened> + Send>>;

/// How opening a stream went, with the token its request carried (or would
/// have), so the runner knows whether to keep that token.
struct Opened {
    token: Option<String>,
    stream: Result<Box<Stream>, ClientError>,
}

impl Connector {
    /// Opens a stream resuming after `watermark`, with `token`, or with a
    /// fresh one from the provider when there is none.
    fn open(&self, token: Option<String>, watermark: Option<String>) -> Opening {
        let connector = self.clone();
        Box::pin(async move {
            let token = match (token, &connector.token_provider) {
                (None, Some(provider)) => match provider().await {
                    Ok(token) => Some(token),
                    Err(error) => {
                        return Opened {
                            token: None,
                            stream: Err(ClientError::Token(error)),
                        };
                    }
                },
                (token, _) => token,
            };
            let stream = connector.send(token.as_deref(), watermark.as_deref()).await;
            Opened { token, stream }
        })
    }

    /// Sends the request and checks that the answer is an event stream.
    async fn send(
        &self,
        token: Option<&str>,
        watermark: Option<&str>,
    ) -> Result<Box<Stream>, ClientError> {
        let mut request = (self.build_request)(self.http.clone())
            .await
            .map_err(ClientError::BuildRequest)?
            .header(ACCEPT, "text/event-stream");
        if !self.scopes.is_empty() {
            let scopes: Vec<(&str, &str)> = self
                .scopes
                .iter()
                .map(|scope| ("scope", scope.as_str()))
                .collect();
            request = request.query(&scopes);
        }
        if let Some(id) = watermark {
            request = request.header("last-event-id", id);
        }
        let (http, request) = request.build_split();
        // An invalid URL or header: no retry can fix it.
        let mut request = request.map_err(ClientError::InvalidRequest)?;
        if let Some(token) = token {
            let mut value = HeaderValue::try_from(format!("Bearer {token}"))
                .map_err(|error| ClientError::Token(error.into()))?;
            value.set_sensitive(true);
            // In place of any the request builder set.
            request.headers_mut().insert(AUTHORIZATION, value);
        }
        let response = match idle(self.idle_timeout, http.execute(request)).await? {
            Ok(response) => response,
            Err(error) if error.is_builder() => return Err(ClientError::InvalidRequest(error)),
            Err(error) => return Err(error.into()),
        };
        if !response.status().is_success() {
            return Err(refusal(response).await);
        }
        let content_type = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        if !content_type
            .to_ascii_lowercase()
            .starts_with("text/event-stream")
        {
            return Err(ClientError::NotEventStream(content_type));
        }
        Ok(Box::new(Stream::new(
            response,
            token.map(str::to_owned),
            self.idle_timeout,
        )))
    }
}

/// One open stream: its response, and what was read of it.
struct Stream {
    response: reqwest::Response,
    parser: SseParser,
    /// The relay sent `ready` on it.
    ready: bool,
    /// The bearer token it was opened with.
    token: Option<String>,
    idle_timeout: Option<Duration>,
    /// When it counts as silent (with an idle timeout): every chunk moves it.
    silent_at: tokio::time::Instant,
}

impl Stream {
    fn new(
        response: reqwest::Response,
        token: Option<String>,
        idle_timeout: Option<Duration>,
    ) -> Self {
        Stream {
            response,
            parser: SseParser::new(),
            ready: false,
            token,
            idle_timeout,
            silent_at: tokio::time::Instant::now() + idle_timeout.unwrap_or_default(),
        }
    }

    /// The items the next chunk completes; `None` once the stream ended.
    /// Cancel-safe: a chunk is taken whole or not at all.
    async fn next_items(&mut self) -> Result<Option<Vec<SseItem>>, ClientError> {
        let chunk = match self.idle_timeout {
            Some(limit) => tokio::time::timeout_at(self.silent_at, self.response.chunk())
                .await
                .map_err(|_| ClientError::Idle(limit))?,
            None => self.response.chunk().await,
        }?;
        let Some(chunk) = chunk else {
            return Ok(None);
        };
        if let Some(limit) = self.idle_timeout {
            self.silent_at = tokio::time::Instant::now() + limit;
        }
        Ok(Some(self.parser.feed(&chunk)))
    }
}

/// The stream opened to replace one whose token expires.
enum Successor {
    Opening(Opening),
    /// Open and replaying, not yet `ready`.
    Open(Box<Stream>),
}

/// What the successor did next.
enum SuccessorStep {
    Opened(Opened),
    Read(Result<Option<Vec<SseItem>>, ClientError>),
}

impl Successor {
    /// The next step of the successor, if any; never resolves without one.
    async fn step(successor: &mut Option<Successor>) -> SuccessorStep {
        match successor {
            None => std::future::pending().await,
            Some(Successor::Opening(opening)) => SuccessorStep::Opened(opening.await),
            Some(Successor::Open(stream)) => SuccessorStep::Read(stream.next_items().await),
        }
    }

    /// Its opening, to follow it as the stream itself once the old one ended.
    fn into_opening(self) -> Opening {
        match self {
            Successor::Opening(opening) => opening,
            Successor::Open(stream) => Box::pin(std::future::ready(Opened {
                token: stream.token.clone(),
                stream: Ok(stream),
            })),
        }
    }
}

struct Runner {
    connector: Connector,
    refresh: Option<Refresh>,
    on_resync: Option<OnResync>,
    on_scope_resync: Option<OnScopeResync>,
    /// The members, shared with the handle, and the hook.
    presence: Arc<Mutex<Presences>>,
    on_presence: Option<OnPresence>,
    degraded_after: u32,
    /// The provider's token, reused until the relay refuses it, a stream
    /// opened with it ends before `ready`, or the relay warns it expires.
    token: Option<String>,
    events: mpsc::Sender<Event>,
    status: watch::Sender<Status>,
    backoff: Backoff,
    seen: SeenIds,
    /// The last `id:` received on the stream being read: moved by durable
    /// events only, because only they carry one.
    watermark: Option<String>,
    failures: u32,
    /// The refresh hook or the token provider was used after a refusal
    /// since the last successful connection.
    refreshed: bool,
    /// The stream being read reached `ready`.
    ready: bool,
}

impl Runner {
    async fn run(&mut self) -> Result<(), ClientError> {
        let mut next = None;
        loop {
            self.ready = false;
            let opening = next.take().unwrap_or_else(|| {
                self.connector
                    .open(self.token.clone(), self.watermark.clone())
            });
            let (end, successor) = self.follow(opening).await;
            let error = match end {
                End::ReceiverGone => return Ok(()),
                End::Closed => None,
                End::Failed(error) => Some(error),
            };
            if let Some(successor) = successor {
                // It ended before the stream opened to replace it was
                // ready: that one is on its way, so no wait.
                tracing::debug!("event stream ended while the next one was opening");
                self.set_status(State::Reconnecting, error.map(Arc::new));
                next = Some(successor);
                continue;
            }
            if let Some(ClientError::Unauthorized { status, .. }) = &error {
                let can_refresh = self.refresh.is_some() || self.connector.token_provider.is_some();
                if can_refresh && !self.refreshed {
                    tracing::info!(status, "credentials refused; refreshing them once");
                    self.refreshed = true;
                    self.set_status(State::Reconnecting, error.map(Arc::new));
                    if let Some(refresh) = self.refresh.clone() {
                        refresh().await.map_err(ClientError::Refresh)?;
                    }
                    // The refused token was dropped: the provider, if any,
                    // is asked for a fresh one.
                    continue;
                }
            }
            if let Some(error) = error {
                if error.is_terminal() {
                    return Err(error);
                }
                tracing::warn!(%error, "event stream failed");
                if !self.ready {
                    self.failures += 1;
                }
                self.after_failure(Some(Arc::new(error)));
            } else {
                tracing::debug!("event stream ended; reconnecting");
                self.after_failure(None);
            }
            tokio::time::sleep(self.backoff.next_delay()).await;
        }
    }

    /// Reads a stream from its opening to its end. When the relay warns
    /// that its token expires, and a token provider can supply the next,
    /// the next stream opens alongside and both are read: the seen ids drop
    /// what both deliver. Once the new one is `ready` it is the stream read,
    /// and the old one is dropped, which closes it. Answers how the stream
    /// read last ended, and the next one if it was still on its way then.
    async fn follow(&mut self, opening: Opening) -> (End, Option<Opening>) {
        let mut current = match self.opened(opening.await) {
            Ok(stream) => stream,
            Err(error) => return (End::Failed(error), None),
        };
        let mut successor = None;
        loop {
            tokio::select! {
                read = current.next_items() => {
                    let items = match read {
                        Ok(Some(items)) => items,
                        Ok(None) if current.ready => {
                            return (End::Closed, successor.map(Successor::into_opening));
                        }
                        Ok(None) => {
                            self.ended_early(&current);
                            let next = successor.map(Successor::into_opening);
                            return (End::Failed(ClientError::EndedEarly), next);
                        }
                        Err(error) => {
                            return (End::Failed(error), successor.map(Successor::into_opening));
                        }
                    };
                    for item in items {
                        match self.item(item, true).await {
                            Err(ReceiverGone) => return (End::ReceiverGone, None),
                            Ok(Control::Ready(ready)) => {
                                current.ready = true;
                                self.on_ready(ready);
                            }
                            Ok(Control::Reauth) if successor.is_none() => {
                                successor = self.renew(&current);
                            }
                            Ok(_) => {}
                        }
                    }
                }
                step = Successor::step(&mut successor) => match step {
                    SuccessorStep::Opened(opened) => match self.opened(opened) {
                        Ok(stream) => successor = Some(Successor::Open(stream)),
                        Err(error) => {
                            tracing::warn!(%error, "the next stream did not open; the current one goes on");
                            successor = None;
                        }
                    },
                    SuccessorStep::Read(Ok(Some(items))) => {
                        // Its frames are the current stream's from its `ready` on.
                        let mut promoted = false;
                        for item in items {
                            match self.item(item, promoted).await {
                                Err(ReceiverGone) => return (End::ReceiverGone, None),
                                Ok(Control::Ready(ready)) if !promoted => {
                                    if let Some(Successor::Open(next)) = successor.take() {
                                        tracing::debug!("the next stream is ready; closing the old one");
                                        current = next;
                                        current.ready = true;
                                        promoted = true;
                                        self.on_ready(ready);
                                    }
                                }
                                Ok(Control::Reauth) if promoted && successor.is_none() => {
                                    successor = self.renew(&current);
                                }
                                Ok(_) => {}
                            }
                        }
                    }
                    SuccessorStep::Read(ended) => {
                        if let Some(Successor::Open(stream)) = &successor {
                            if matches!(ended, Ok(None)) {
                                self.ended_early(stream);
                            }
                        }
                        let error = ended.err().unwrap_or(ClientError::EndedEarly);
                        tracing::warn!(%error, "the next stream ended before it was ready; the current one goes on");
                        successor = None;
                    }
                },
            }
        }
    }

    /// Opens the stream to replace `current`, whose token expires soon,
    /// when a token provider can give the fresh token it needs.
    fn renew(&mut self, current: &Stream) -> Option<Successor> {
        self.connector.token_provider.as_ref()?;
        // The token in hand is the one expiring: no later stream may use it.
        if self.token == current.token {
            self.token = None;
        }
        tracing::debug!("the stream's token expires soon; opening the next stream");
        let opening = self.connector.open(None, self.watermark.clone());
        Some(Successor::Opening(opening))
    }

    /// Keeps the token an opening used, unless the relay refused it, and
    /// answers its stream.
    fn opened(&mut self, opened: Opened) -> Result<Box<Stream>, ClientError> {
        self.token = match &opened.stream {
            Err(ClientError::Unauthorized { .. }) => None,
            _ => opened.token,
        };
        opened.stream
    }

    /// A stream that ended before `ready`: a token past its expiry but
    /// within the relay's clock leeway is accepted and its stream ends at
    /// once, so its token is not sent again.
    fn ended_early(&mut self, stream: &Stream) {
        if self.token.is_some() && self.token == stream.token {
            self.token = None;
        }
    }

    fn after_failure(&mut self, error: Option<Arc<ClientError>>) {
        let state = if self.failures >= self.degraded_after {
            State::Degraded
        } else {
            State::Reconnecting
        };
        self.set_status(state, error);
    }

    fn set_status(&self, state: State, last_error: Option<Arc<ClientError>>) {
        self.status.send_replace(Status {
            state,
            consecutive_failures: self.failures,
            last_error,
        });
    }

    fn finish(self, result: Result<(), ClientError>) -> Result<(), Arc<ClientError>> {
        let result = result.map_err(Arc::new);
        if let Err(error) = &result {
            tracing::warn!(%error, "event stream client stopped");
        }
        self.set_status(State::Stopped, result.clone().err());
        result
    }

    async fn item(&mut self, item: SseItem, on_current: bool) -> Result<Control, ReceiverGone> {
        match item {
            SseItem::Retry(delay) => {
                self.backoff.set_base(delay);
                Ok(Control::Nothing)
            }
            SseItem::Event(frame) => self.handle(frame, on_current).await,
            // This client's parser drops comments; heartbeats need no answer.
            SseItem::Comment(_) => Ok(Control::Nothing),
        }
    }

    /// One dispatched frame: an event goes to the application (once), a
    /// control frame back to the connection loop. Only frames of the stream
    /// being read (`on_current`) move the watermark: while the next one
    /// replays, the watermark stays where the current one has it.
    async fn handle(&mut self, frame: SseEvent, on_current: bool) -> Result<Control, ReceiverGone> {
        // The relay refuses application events under reserved names, so a
        // `ready` frame is the control frame, unless it carries an `id:`,
        // which only durable application events have.
        if frame.event_type == READY_EVENT && frame.id.is_none() {
            return Ok(match serde_json::from_str::<ReadyData>(&frame.data) {
                Ok(ready) => Control::Ready(ready),
                Err(error) => {
                    tracing::warn!(%error, "skipping a malformed `ready` frame");
                    Control::Nothing
                }
            });
        }
        if frame.event_type == REAUTH_EVENT && frame.id.is_none() {
            // The stream's credentials expire soon, and it ends then.
            return Ok(Control::Reauth);
        }
        if frame.event_type == PRESENCE_EVENT && frame.id.is_none() {
            let mut presence = self
                .presence
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            match presence.apply(&frame.data) {
                Some((scope, change)) => {
                    if let Some(on_presence) = &self.on_presence {
                        on_presence(scope, &change);
                    }
                }
                None => tracing::warn!("skipping a malformed `presence` frame"),
            }
            return Ok(Control::Nothing);
        }
        if frame.event_type == REVOKED_EVENT && frame.id.is_none() {
            // With a scope: an operator took that scope out of the stream,
            // which goes on with the others. Without: the subscriber was
            // disconnected; the stream ends now, and the client reconnects
            // as after any end (refused while the operator's denial lasts).
            let data = serde_json::from_str::<serde_json::Value>(&frame.data).ok();
            match data.as_ref().and_then(|data| data["scope"].as_str()) {
                Some(scope) => tracing::warn!(
                    scope,
                    "an operator took a scope out of this stream; the others go on"
                ),
                None => tracing::warn!("an operator disconnected this subscriber; the stream ends"),
            }
            return Ok(Control::Nothing);
        }
        if is_control_event_type(&frame.event_type) {
            // Never handed to the application: a reserved name is a control
            // frame this version does not know, or an event that an older
            // relay let through under a control frame's name.
            tracing::warn!(
                event_type = frame.event_type,
                "skipping a frame with a reserved event type"
            );
            return Ok(Control::Nothing);
        }
        match serde_json::from_str::<EventEnvelope>(&frame.data) {
            Ok(envelope) if self.seen.insert(envelope.id) => {
                let event = Event {
                    envelope,
                    event_type: frame.event_type,
                    sse_id: frame.id.clone(),
                };
                self.events.send(event).await.map_err(|_| ReceiverGone)?;
            }
            Ok(envelope) => tracing::debug!(id = %envelope.id, "duplicate event dropped"),
            Err(error) => tracing::warn!(
                event_type = frame.event_type,
                %error,
                "skipping a frame whose data is not an event envelope"
            ),
        }
        // Moved only after the event is handed over, so a reconnect never
        // skips an event the application has not received.
        if let Some(id) = frame.id.filter(|_| on_current) {
            // As in a browser, an empty `id:` forgets the watermark.
            self.watermark = (!id.is_empty()).then_some(id);
        }
        Ok(Control::Nothing)
    }

    fn on_ready(&mut self, ready: ReadyData) {
        let resync = ready.resync;
        tracing::debug!(resync, "event stream ready");
        self.ready = true;
        self.failures = 0;
        self.refreshed = false;
        self.backoff.reset();
        // A stream that replaces a live one changes nothing the application
        // watches: no notification then.
        self.status.send_if_modified(|status| {
            let changed = status.state != State::Connected
                || status.consecutive_failures != 0
                || status.last_error.is_some();
            *status = Status {
                state: State::Connected,
                consecutive_failures: 0,
                last_error: None,
            };
            changed
        });
        if !resync {
            return;
        }
        match (&self.on_scope_resync, ready.resync_scopes) {
            (Some(on_scope_resync), Some(scopes)) => {
                for scope in &scopes {
                    on_scope_resync(scope);
                }
            }
            _ => {
                if let Some(on_resync) = &self.on_resync {
                    on_resync();
                }
            }
        }
    }
}

/// `future`, or [`ClientError::Idle`] when it takes longer than `limit`.
async fn idle<F: Future>(limit: Option<Duration>, future: F) -> Result<F::Output, ClientError> {
    match limit {
        Some(limit) => tokio::time::timeout(limit, future)
            .await
            .map_err(|_| ClientError::Idle(limit)),
        None => Ok(future.await),
    }
}

/// The error for a non-2xx answer, with the relay's error `code` when the
/// body has one.
async fn refusal(response: reqwest::Response) -> ClientError {
    let status = response.status();
    let code = response
        .bytes()
        .await
        .ok()
        .and_then(|body| serde_json::from_slice::<serde_json::Value>(&body).ok())
        .and_then(|body| body["error"]["code"].as_str().map(str::to_owned));
    let status_code = status.as_u16();
    match status {
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => ClientError::Unauthorized {
            status: status_code,
            code,
        },
        StatusCode::REQUEST_TIMEOUT | StatusCode::TOO_MANY_REQUESTS => ClientError::Unavailable {
            status: status_code,
            code,
        },
        _ if status.is_client_error() => ClientError::Rejected {
            status: status_code,
            code,
        },
        _ => ClientError::Unavailable {
            status: status_code,
            code,
        },
    }
}
