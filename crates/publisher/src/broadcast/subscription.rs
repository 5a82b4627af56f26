//! Subscriptions: the task that turns payloads into typed messages for a
//! handler, and the handle that observes and stops it.
//!
//! Whatever goes wrong with one payload (it is not JSON, fails the schema,
//! or the handler errs or panics) is logged, counted and skipped: a hint
//! that cannot be used is worth less than the hints behind it.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures_util::{FutureExt, Stream};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_postgres::Config;

use crate::connect::{PgConnectOptions, TcpSettings};

use super::BroadcastChannel;
use super::listener::{ListenTls, PgListener};
use super::source::{DEFAULT_CONNECT_TIMEOUT, Event, Source, StreamSource, SubscribeError};
use crate::backoff::Backoff;
use crate::identifier::Identifier;

/// What a message handler may return: nothing, or a `Result` whose error is
/// logged and counted as a handler failure.
pub trait HandlerOutcome {
    fn into_result(self) -> Result<(), String>;
}

impl HandlerOutcome for () {
    fn into_result(self) -> Result<(), String> {
        Ok(())
    }
}

impl<E: fmt::Display> HandlerOutcome for Result<(), E> {
    fn into_result(self) -> Result<(), String> {
        self.map_err(|e| e.to_string())
    }
}

/// How often an idle listening connection is checked, and how long the
/// server has to answer.
pub const DEFAULT_HEALTH_CHECK: Duration = Duration::from_secs(30);

/// How long [`Subscription::stop`] waits for the task to close its
/// connection before aborting it.
const STOP_GRACE: Duration = Duration::from_secs(5);

type HandlerFuture = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;

enum Handler<M> {
    Sync(Box<dyn FnMut(M) -> Result<(), String> + Send>),
    Async(Box<dyn FnMut(M) -> HandlerFuture + Send>),
}

enum Failure {
    Error(String),
    Panic(String),
}

impl<M> Handler<M> {
    /// Calls the handler so that neither an error nor a panic can escape
    /// (with `panic = "abort"` a panic still ends the process).
    async fn call(&mut self, message: M) -> Result<(), Failure> {
        match self {
            Handler::Sync(handle) => catch_unwind(AssertUnwindSafe(|| handle(message)))
                .map_err(panicked)?
                .map_err(Failure::Error),
            Handler::Async(handle) => {
                let future =
                    catch_unwind(AssertUnwindSafe(|| handle(message))).map_err(panicked)?;
                AssertUnwindSafe(future)
                    .catch_unwind()
                    .await
                    .map_err(panicked)?
                    .map_err(Failure::Error)
            }
        }
    }
}

fn panicked(payload: Box<dyn Any + Send>) -> Failure {
    Failure::Panic(panic_message(payload.as_ref()))
}

fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(text) = payload.downcast_ref::<&str>() {
        (*text).to_owned()
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text.clone()
    } else {
        "a panic without a message".to_owned()
    }
}

#[derive(Default)]
struct Counters {
    received: AtomicU64,
    dropped: AtomicU64,
    handler_failures: AtomicU64,
    reconnects: AtomicU64,
}

/// A snapshot of a subscription's counters, for metrics and health checks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SubscriptionStats {
    /// Every payload that arrived, usable or not.
    pub received: u64,
    /// Payloads that were not JSON, failed the schema, or did not fit the
    /// message type; they never reached the handler.
    pub dropped: u64,
    /// Messages whose handler returned an error or panicked.
    pub handler_failures: u64,
    /// Times the connection was re-established after a loss. Each is a gap
    /// in which messages may have been lost.
    pub reconnects: u64,
}

/// Configures a subscription before it starts; from
/// [`BroadcastChannel::on_message`] or
/// [`BroadcastChannel::on_message_async`].
#[must_use = "a subscription starts with connect, connect_with or attach"]
pub struct SubscriptionBuilder<M> {
    channel: BroadcastChannel<M>,
    handler: Handler<M>,
    on_reconnect: Option<Box<dyn FnMut() + Send>>,
    backoff: Backoff,
    health_check: Option<Duration>,
}

impl<M> fmt::Debug for SubscriptionBuilder<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SubscriptionBuilder")
            .field("channel", &self.channel)
            .field("on_reconnect", &self.on_reconnect.is_some())
            .field("backoff", &self.backoff)
            .field("health_check", &self.health_check)
            .finish_non_exhaustive()
    }
}

impl<M> BroadcastChannel<M>
where
    M: Serialize + DeserializeOwned + Send + 'static,
{
    /// Starts configuring a subscription whose `handler` runs for each
    /// message, one at a time and in the order they were committed.
    ///
    /// The handler runs on the subscription's task: keep it quick, since the
    /// next message waits for it.
    pub fn on_message<F, R>(&self, mut handler: F) -> SubscriptionBuilder<M>
    where
        F: FnMut(M) -> R + Send + 'static,
        R: HandlerOutcome,
    {
        self.builder(Handler::Sync(Box::new(move |message| {
            handler(message).into_result()
        })))
    }

    /// Like [`on_message`](Self::on_message), for a handler that needs to
    /// await. Messages are still handled one at a time.
    pub fn on_message_async<F, Fut>(&self, mut handler: F) -> SubscriptionBuilder<M>
    where
        F: FnMut(M) -> Fut + Send + 'static,
        Fut: Future<Output: HandlerOutcome> + Send + 'static,
    {
        self.builder(Handler::Async(Box::new(move |message| {
            let future = handler(message);
            Box::pin(async move { future.await.into_result() })
        })))
    }

    fn builder(&self, handler: Handler<M>) -> SubscriptionBuilder<M> {
        SubscriptionBuilder {
            channel: self.clone(),
            handler,
            on_reconnect: None,
            backoff: Backoff::default(),
            health_check: Some(DEFAULT_HEALTH_CHECK),
        }
    }

    /// Subscribes on a dedicated connection to `database_url` with the
    /// default settings; see [`SubscriptionBuilder::connect`].
    ///
    /// `on_reconnect` runs after every reconnect: messages sent while the
    /// connection was down are lost, so it should drop whatever the channel
    /// invalidates.
    pub async fn subscribe<F, R>(
        &self,
        database_url: &str,
        handler: F,
        on_reconnect: impl FnMut() + Send + 'static,
    ) -> Result<Subscription, SubscribeError>
    where
        F: FnMut(M) -> R + Send + 'static,
        R: HandlerOutcome,
    {
        self.on_message(handler)
            .on_reconnect(on_reconnect)
            .connect(database_url)
            .await
    }

    /// Subscribes to payloads from any stream, such as an embedded
    /// database's notification callback forwarded through a channel. They
    /// are decoded and checked exactly as from Postgres; the subscription
    /// finishes when the stream ends.
    ///
    /// # Panics
    ///
    /// Outside a Tokio runtime.
    pub fn subscribe_to_stream<S, F, R>(&self, payloads: S, handler: F) -> Subscription
    where
        S: Stream<Item = String> + Send + 'static,
        F: FnMut(M) -> R + Send + 'static,
        R: HandlerOutcome,
    {
        self.on_message(handler).attach(payloads)
    }
}

impl<M> SubscriptionBuilder<M>
where
    M: Serialize + DeserializeOwned + Send + 'static,
{
    /// Runs after every reconnect, because the messages sent while the
    /// connection was down are lost: drop whatever the channel invalidates.
    /// A panic here is caught and logged.
    pub fn on_reconnect(mut self, on_reconnect: impl FnMut() + Send + 'static) -> Self {
        self.on_reconnect = Some(Box::new(on_reconnect));
        self
    }

    /// The delays between reconnect attempts; [`Backoff::default`] unless set.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// After this much silence the connection must answer a query within the
    /// same time, or it is replaced ([`DEFAULT_HEALTH_CHECK`] unless set).
    /// `None` trusts TCP to report a dead connection.
    pub fn health_check(mut self, interval: Option<Duration>) -> Self {
        self.health_check = interval;
        self
    }

    /// Connects to `database_url`, `LISTEN`s, and runs the subscription on
    /// a spawned task. The URL's `sslmode`, `sslrootcert`, `sslcert` and
    /// `sslkey` have libpq's meanings (see [`PgConnectOptions`]), and TCP
    /// keepalives are on.
    ///
    /// The URL must reach Postgres directly (or through a session-mode
    /// pooler): a transaction-mode pooler loses the `LISTEN`. A failure of
    /// this first connection is returned, so a misconfiguration fails at
    /// start; later losses are retried with backoff.
    pub async fn connect(self, database_url: &str) -> Result<Subscription, SubscribeError> {
        let options = PgConnectOptions::parse(database_url)
            .map_err(SubscribeError::InvalidUrl)?
            .with_tcp(TcpSettings::default());
        let tls = options.tls().map_err(SubscribeError::InvalidUrl)?;
        self.connect_with(options.config().clone(), tls).await
    }

    /// [`connect`](Self::connect) with a parsed configuration and a TLS
    /// connector.
    ///
    /// Unless the configuration says otherwise, the connection is named
    /// `eventrelay broadcast <channel>` (to find it in `pg_stat_activity`)
    /// and uses a [`DEFAULT_CONNECT_TIMEOUT`].
    pub async fn connect_with<T: ListenTls>(
        self,
        mut config: Config,
        tls: T,
    ) -> Result<Subscription, SubscribeError> {
        let name = self.channel.name().clone();
        if config.get_application_name().is_none() {
            config.application_name(format!("eventrelay broadcast {name}"));
        }
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(DEFAULT_CONNECT_TIMEOUT);
        }
        let source =
            PgListener::open(config, tls, name, self.backoff.clone(), self.health_check).await?;
        Ok(self.spawn(source))
    }

    /// Runs the subscription on payloads from `payloads` instead of a
    /// database connection; see [`BroadcastChannel::subscribe_to_stream`].
    ///
    /// # Panics
    ///
    /// Outside a Tokio runtime.
    pub fn attach<S>(self, payloads: S) -> Subscription
    where
        S: Stream<Item = String> + Send + 'static,
    {
        self.spawn(StreamSource(Box::pin(payloads)))
    }

    fn spawn<S: Source>(self, source: S) -> Subscription {
        let counters = Arc::new(Counters::default());
        let (stop, stopped) = oneshot::channel();
        let channel = self.channel.name().clone();
        let dispatch = Dispatch {
            channel: self.channel,
            handler: self.handler,
            on_reconnect: self.on_reconnect,
            counters: Arc::clone(&counters),
        };
        let task = tokio::spawn(run(source, dispatch, stopped));
        Subscription {
            channel,
            counters,
            stop: Some(stop),
            task: Some(task),
        }
    }
}

/// The subscription task: events in, handler calls out, until stopped or
/// the source ends.
async fn run<S, M>(mut source: S, mut dispatch: Dispatch<M>, mut stopped: oneshot::Receiver<()>)
where
    S: Source,
    M: Serialize + DeserializeOwned + Send + 'static,
{
    loop {
        // A dropped sender counts as a stop, so dropping the handle is enough.
        let event = tokio::select! {
            biased;
            _ = &mut stopped => break,
            event = source.next() => event,
        };
        let Some(event) = event else {
            tracing::debug!(channel = %dispatch.channel.name(), "broadcast payload stream ended");
            break;
        };
        tokio::select! {
            biased;
            _ = &mut stopped => break,
            () = dispatch.handle(event) => {}
        }
    }
    source.close().await;
}

struct Dispatch<M> {
    channel: BroadcastChannel<M>,
    handler: Handler<M>,
    on_reconnect: Option<Box<dyn FnMut() + Send>>,
    counters: Arc<Counters>,
}

impl<M> Dispatch<M>
where
    M: Serialize + DeserializeOwned + Send + 'static,
{
    async fn handle(&mut self, event: Event) {
        match event {
            Event::Payload(payload) => self.deliver(&payload).await,
            Event::Reconnected => self.reconnected(),
        }
    }

    async fn deliver(&mut self, payload: &str) {
        self.counters.received.fetch_add(1, Ordering::Relaxed);
        let message = match self.channel.decode(payload) {
            Ok(message) => message,
            Err(error) => {
                self.counters.dropped.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    channel = %self.channel.name(),
                    bytes = payload.len(),
                    %error,
                    "dropped a broadcast payload"
                );
                return;
            }
        };
        match self.handler.call(message).await {
            Ok(()) => {}
            Err(Failure::Error(error)) => {
                self.counters
                    .handler_failures
                    .fetch_add(1, Ordering::Relaxed);
                tracing::warn!(channel = %self.channel.name(), %error, "broadcast handler failed");
            }
            Err(Failure::Panic(panic)) => {
                self.counters
                    .handler_failures
                    .fetch_add(1, Ordering::Relaxed);
                tracing::error!(channel = %self.channel.name(), %panic, "broadcast handler panicked");
            }
        }
    }

    fn reconnected(&mut self) {
        self.counters.reconnects.fetch_add(1, Ordering::Relaxed);
        tracing::info!(
            channel = %self.channel.name(),
            "broadcast subscription reconnected; messages sent while it was down are lost"
        );
        if let Some(on_reconnect) = &mut self.on_reconnect {
            if let Err(payload) = catch_unwind(AssertUnwindSafe(on_reconnect)) {
                let panic = panic_message(payload.as_ref());
                tracing::error!(channel = %self.channel.name(), %panic, "on_reconnect panicked");
            }
        }
    }
}

/// A running subscription. Dropping it stops the task and closes its
/// connection; [`stop`](Self::stop) does the same and waits for it.
#[must_use = "dropping a Subscription stops it"]
pub struct Subscription {
    channel: Identifier,
    counters: Arc<Counters>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl Subscription {
    pub fn channel(&self) -> &Identifier {
        &self.channel
    }

    pub fn stats(&self) -> SubscriptionStats {
        let c = &self.counters;
        SubscriptionStats {
            received: c.received.load(Ordering::Relaxed),
            dropped: c.dropped.load(Ordering::Relaxed),
            handler_failures: c.handler_failures.load(Ordering::Relaxed),
            reconnects: c.reconnects.load(Ordering::Relaxed),
        }
    }

    /// Whether the task has ended: after a stop, or when a stream
    /// subscription's stream ended. A database subscription never ends on
    /// its own.
    pub fn is_finished(&self) -> bool {
        self.task.as_ref().is_none_or(JoinHandle::is_finished)
    }

    /// Stops the task and waits (a few seconds at most) until its
    /// connection is closed.
    pub async fn stop(mut self) {
        drop(self.stop.take());
        if let Some(task) = self.task.take() {
            let abort = task.abort_handle();
            if tokio::time::timeout(STOP_GRACE, task).await.is_err() {
                abort.abort();
            }
        }
    }
}

impl fmt::Debug for Subscription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subscription")
            .field("channel", &self.channel)
            .field("stats", &self.stats())
            .field("finished", &self.is_finished())
            .finish()
    }
}
