//! The dedicated `LISTEN` connection behind a subscription, and its
//! reconnect loop.
//!
//! The connection is opened from a URL, never taken from a pool: a pooler in
//! transaction mode hands each statement to whichever server connection is
//! free, so a `LISTEN` would be registered on a connection this process no
//! longer holds. Notifications sent while the connection is down are gone;
//! the loop reports each reconnect so the subscription can say so. The
//! connection itself, with its health check, is the shared
//! [`ListenConnection`].

use std::time::Duration;

use tokio_postgres::Config;

use super::source::{DEFAULT_CONNECT_TIMEOUT, Event, Source, SubscribeError};
use crate::backoff::Backoff;
use crate::connect::ConnectError;
use crate::identifier::Identifier;
use crate::listen::{HealthCheck, ListenConnection, ListenError};

pub use crate::listen::ListenTls;

/// How long a stopping subscription waits for the server to acknowledge
/// the end of the session before dropping the socket.
const CLOSE_GRACE: Duration = Duration::from_secs(2);

/// Why the listening connection was given up.
#[derive(Debug, thiserror::Error)]
pub(super) enum Lost {
    #[error("{0}")]
    Database(#[source] tokio_postgres::Error),
    #[error("the server closed the connection")]
    Closed,
    #[error("no answer from the server within {0:?}")]
    Unresponsive(Duration),
    /// The connector could not be used; not a reason to retry at start.
    #[error(transparent)]
    Setup(ConnectError),
    #[error(transparent)]
    Pump(ListenError),
}

impl From<ListenError> for Lost {
    fn from(error: ListenError) -> Self {
        match error {
            ListenError::Connect(
                ConnectError::Connect(error)
                | ConnectError::ServerWithoutTls(error)
                | ConnectError::CertificateRejected(error),
            ) => Lost::Database(error),
            ListenError::Connect(ConnectError::Timeout(limit)) => Lost::Unresponsive(limit),
            ListenError::Connect(other) => Lost::Setup(other),
            ListenError::Postgres(error) => Lost::Database(error),
            ListenError::Closed => Lost::Closed,
            ListenError::Unresponsive(limit) => Lost::Unresponsive(limit),
            pump @ ListenError::Pump(_) => Lost::Pump(pump),
        }
    }
}

impl From<Lost> for SubscribeError {
    fn from(lost: Lost) -> Self {
        match lost {
            Lost::Database(error) => SubscribeError::Connect(error),
            Lost::Closed | Lost::Pump(_) => SubscribeError::Closed,
            Lost::Unresponsive(limit) => SubscribeError::Timeout(limit),
            Lost::Setup(error) => SubscribeError::InvalidUrl(error),
        }
    }
}

/// A [`Source`] of notification payloads from a dedicated connection, which
/// reconnects with backoff for as long as the subscription runs.
pub(super) struct PgListener<T> {
    config: Config,
    tls: T,
    channel: Identifier,
    backoff: Backoff,
    /// After this much silence the server must answer within the same time.
    health_check: Option<Duration>,
    live: Option<ListenConnection>,
}

impl<T: ListenTls> PgListener<T> {
    /// Connects and listens once; a failure here is the caller's, so it is
    /// returned rather than retried.
    pub(super) async fn open(
        config: Config,
        tls: T,
        channel: Identifier,
        backoff: Backoff,
        health_check: Option<Duration>,
    ) -> Result<Self, SubscribeError> {
        let mut listener = PgListener {
            config,
            tls,
            channel,
            backoff,
            health_check,
            live: None,
        };
        listener.live = Some(listener.listen().await.map_err(Lost::from)?);
        tracing::debug!(channel = %listener.channel, "broadcast subscription listening");
        Ok(listener)
    }

    /// One connection that has run `LISTEN`. The start-up is bounded by
    /// the configured connect timeout, the `LISTEN` by the health check.
    async fn listen(&self) -> Result<ListenConnection, ListenError> {
        let startup = self
            .config
            .get_connect_timeout()
            .copied()
            .unwrap_or(DEFAULT_CONNECT_TIMEOUT);
        let live = ListenConnection::connect(&self.config, self.tls.clone(), startup).await?;
        live.listen(&self.channel, self.health_check).await?;
        Ok(live)
    }

    async fn reconnect(&mut self) -> ListenConnection {
        loop {
            let delay = self.backoff.next_delay();
            tokio::time::sleep(delay).await;
            match self.listen().await {
                Ok(live) => {
                    self.backoff.reset();
                    return live;
                }
                Err(error) => tracing::warn!(
                    channel = %self.channel,
                    attempt = self.backoff.attempt(),
                    error = %Lost::from(error),
                    "broadcast subscription could not reconnect; retrying"
                ),
            }
        }
    }
}

impl<T: ListenTls> Source for PgListener<T> {
    async fn next(&mut self) -> Option<Event> {
        let health = self
            .health_check
            .map(|interval| HealthCheck::new(interval, interval));
        loop {
            match &mut self.live {
                Some(live) => match live.next(health).await {
                    Ok(notification) => {
                        return Some(Event::Payload(notification.payload().to_owned()));
                    }
                    Err(error) => {
                        tracing::warn!(
                            channel = %self.channel,
                            error = %Lost::from(error),
                            "broadcast subscription lost its connection; reconnecting"
                        );
                        self.live = None;
                    }
                },
                None => {
                    self.live = Some(self.reconnect().await);
                    return Some(Event::Reconnected);
                }
            }
        }
    }

    async fn close(mut self) {
        if let Some(live) = self.live.take() {
            live.close(CLOSE_GRACE).await;
        }
    }
}
