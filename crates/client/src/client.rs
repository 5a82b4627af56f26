//! The reconnecting subscriber: one background task per client that
//! connects to `GET /v1/events`, parses the stream, de-duplicates envelopes,
//! and reconnects with full-jitter backoff from a durable-only watermark.
//!
//! The application sees three things: events on a bounded channel (so a slow
//! consumer applies backpressure to the connection instead of growing
//! memory), the connection state on a `watch` channel (a current value, not
//! a log), and a resync callback.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use eventrelay_wire::sse::{READY_EVENT, REAUTH_EVENT};
use eventrelay_wire::{EventEnvelope, is_reserved_event_type};
use futures_util::StreamExt;
use reqwest::StatusCode;
use reqwest::header::{ACCEPT, CONTENT_TYPE};
use serde::Deserialize;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use crate::backoff::Backoff;
use crate::error::{BoxError, ClientError};
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
    on_resync: Option<OnResync>,
    last_event_id: Option<String>,
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
            on_resync: None,
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
        let mut runner = Runner {
            http,
            build_request: self.build_request,
            refresh: self.refresh,
            on_resync: self.on_resync,
            degraded_after: self.degraded_after,
            idle_timeout: self.idle_timeout,
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
}

impl ClientHandle {
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
struct ReadyData {
    resync: bool,
}

/// How one connection ended.
enum End {
    Closed,
    Failed(ClientError),
    ReceiverGone,
}

struct Runner {
    http: reqwest::Client,
    build_request: BuildRequest,
    refresh: Option<Refresh>,
    on_resync: Option<OnResync>,
    degraded_after: u32,
    idle_timeout: Option<Duration>,
    events: mpsc::Sender<Event>,
    status: watch::Sender<Status>,
    backoff: Backoff,
    seen: SeenIds,
    /// The last `id:` received: moved by durable events only, because only
    /// they carry one.
    watermark: Option<String>,
    failures: u32,
    /// The refresh hook was used since the last successful connection.
    refreshed: bool,
    /// The current connection reached `ready`.
    ready: bool,
}

impl Runner {
    async fn run(&mut self) -> Result<(), ClientError> {
        loop {
            self.ready = false;
            let error = match self.connect().await {
                End::ReceiverGone => return Ok(()),
                End::Closed => None,
                End::Failed(error) => Some(error),
            };
            if let Some(ClientError::Unauthorized { status, .. }) = &error {
                if let Some(refresh) = self.refresh.clone().filter(|_| !self.refreshed) {
                    tracing::info!(status, "credentials refused; refreshing them once");
                    self.refreshed = true;
                    self.set_status(State::Reconnecting, error.map(Arc::new));
                    refresh().await.map_err(ClientError::Refresh)?;
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

    /// One connection, from the request to the end of its stream.
    async fn connect(&mut self) -> End {
        let request = match (self.build_request)(self.http.clone()).await {
            Ok(request) => request,
            Err(error) => return End::Failed(ClientError::BuildRequest(error)),
        };
        let mut request = request.header(ACCEPT, "text/event-stream");
        if let Some(id) = &self.watermark {
            request = request.header("last-event-id", id.as_str());
        }
        let response = match idle(self.idle_timeout, request.send()).await {
            Ok(Ok(response)) => response,
            Ok(Err(error)) if error.is_builder() => {
                // An invalid URL or header: no retry can fix it.
                return End::Failed(ClientError::InvalidRequest(error));
            }
            Ok(Err(error)) => return End::Failed(error.into()),
            Err(error) => return End::Failed(error),
        };
        if !response.status().is_success() {
            return End::Failed(refusal(response).await);
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
            return End::Failed(ClientError::NotEventStream(content_type));
        }
        let mut body = response.bytes_stream();
        let mut parser = SseParser::new();
        let mut items = Vec::new();
        loop {
            let chunk = match idle(self.idle_timeout, body.next()).await {
                Ok(Some(Ok(chunk))) => chunk,
                Ok(Some(Err(error))) => return End::Failed(error.into()),
                Ok(None) if self.ready => return End::Closed,
                Ok(None) => return End::Failed(ClientError::EndedEarly),
                Err(error) => return End::Failed(error),
            };
            parser.feed_into(&chunk, &mut items);
            for item in items.drain(..) {
                match item {
                    SseItem::Retry(delay) => self.backoff.set_base(delay),
                    SseItem::Event(event) => {
                        if self.handle(event).await.is_err() {
                            return End::ReceiverGone;
                        }
                    }
                }
            }
        }
    }

    /// One dispatched frame. Errs only when the application dropped the
    /// event receiver.
    async fn handle(&mut self, frame: SseEvent) -> Result<(), ()> {
        // The relay refuses application events under reserved names, so a
        // `ready` frame is the control frame, unless it carries an `id:`,
        // which only durable application events have.
        if frame.event_type == READY_EVENT && frame.id.is_none() {
            match serde_json::from_str::<ReadyData>(&frame.data) {
                Ok(ready) => self.on_ready(ready.resync),
                Err(error) => tracing::warn!(%error, "skipping a malformed `ready` frame"),
            }
            return Ok(());
        }
        if frame.event_type == REAUTH_EVENT && frame.id.is_none() {
            // The stream's credentials expire soon; it ends then, and the
            // client reconnects as after any end.
            return Ok(());
        }
        if is_reserved_event_type(&frame.event_type) {
            // Never handed to the application: a reserved name is a control
            // frame this version does not know, or an event that an older
            // relay let through under a control frame's name.
            tracing::warn!(
                event_type = frame.event_type,
                "skipping a frame with a reserved event type"
            );
            return Ok(());
        }
        match serde_json::from_str::<EventEnvelope>(&frame.data) {
            Ok(envelope) if self.seen.insert(envelope.id) => {
                let event = Event {
                    envelope,
                    event_type: frame.event_type,
                    sse_id: frame.id.clone(),
                };
                self.events.send(event).await.map_err(|_| ())?;
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
        if let Some(id) = frame.id {
            // As in a browser, an empty `id:` forgets the watermark.
            self.watermark = (!id.is_empty()).then_some(id);
        }
        Ok(())
    }

    fn on_ready(&mut self, resync: bool) {
        tracing::debug!(resync, "event stream ready");
        self.ready = true;
        self.failures = 0;
        self.refreshed = false;
        self.backoff.reset();
        self.set_status(State::Connected, None);
        if resync {
            if let Some(on_resync) = &self.on_resync {
                on_resync();
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
