//! The dedicated `LISTEN` connection behind a subscription, and its
//! reconnect loop.
//!
//! The connection is opened from a URL, never taken from a pool: a pooler in
//! transaction mode hands each statement to whichever server connection is
//! free, so a `LISTEN` would be registered on a connection this process no
//! longer holds. Notifications sent while the connection is down are gone;
//! the loop reports each reconnect so the subscription can say so.

use std::collections::VecDeque;
use std::pin::Pin;
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::{AsyncMessage, Client, Config, Socket};

use super::subscription::{Event, Source, SubscribeError};
use crate::backoff::Backoff;
use crate::identifier::Identifier;

/// TLS connectors a subscription can use: any tokio-postgres connector
/// whose connections can move between threads, such as `NoTls`,
/// `postgres-native-tls` or `tokio-postgres-rustls`.
pub trait ListenTls:
    MakeTlsConnect<
        Socket,
        Stream: Send + 'static,
        TlsConnect: Send + TlsConnect<Socket, Future: Send>,
    > + Clone
    + Send
    + Sync
    + 'static
{
}

impl<T> ListenTls for T where
    T: MakeTlsConnect<
            Socket,
            Stream: Send + 'static,
            TlsConnect: Send + TlsConnect<Socket, Future: Send>,
        > + Clone
        + Send
        + Sync
        + 'static
{
}

/// How long a stopping subscription waits for the server to acknowledge
/// the end of the session before dropping the socket.
const CLOSE_GRACE: Duration = Duration::from_secs(2);

/// Why the listening connection was given up.
#[derive(Debug, thiserror::Error)]
pub(super) enum Lost {
    #[error("{0}")]
    Database(#[from] tokio_postgres::Error),
    #[error("the server closed the connection")]
    Closed,
    #[error("no answer from the server within {0:?}")]
    Unresponsive(Duration),
}

impl From<Lost> for SubscribeError {
    fn from(lost: Lost) -> Self {
        match lost {
            Lost::Database(error) => SubscribeError::Connect(error),
            Lost::Closed => SubscribeError::Closed,
            Lost::Unresponsive(limit) => SubscribeError::Timeout(limit),
        }
    }
}

type Messages = Pin<Box<dyn Stream<Item = Result<AsyncMessage, tokio_postgres::Error>> + Send>>;

/// One open connection that has run `LISTEN`.
struct Live {
    client: Client,
    /// The connection itself, driven by polling for its messages.
    messages: Messages,
}

impl Live {
    async fn open<T: ListenTls>(
        config: &Config,
        tls: T,
        listen_sql: &str,
        limit: Option<Duration>,
        pending: &mut VecDeque<String>,
    ) -> Result<Live, Lost> {
        let (client, mut connection) = config.connect(tls).await?;
        let messages: Messages = Box::pin(futures_util::stream::poll_fn(move |cx| {
            connection.poll_message(cx)
        }));
        let mut live = Live { client, messages };
        live.run(listen_sql, limit, pending).await?;
        Ok(live)
    }

    /// Runs `sql` while driving the connection, keeping any notification
    /// that arrives meanwhile.
    async fn run(
        &mut self,
        sql: &str,
        limit: Option<Duration>,
        pending: &mut VecDeque<String>,
    ) -> Result<(), Lost> {
        let Live { client, messages } = self;
        let work = async {
            let query = client.batch_execute(sql);
            tokio::pin!(query);
            loop {
                tokio::select! {
                    result = &mut query => return result.map_err(Lost::from),
                    message = messages.next() => match message {
                        Some(Ok(AsyncMessage::Notification(n))) => {
                            pending.push_back(n.payload().to_owned());
                        }
                        Some(Ok(_notice)) => {}
                        Some(Err(error)) => return Err(Lost::from(error)),
                        None => return Err(Lost::Closed),
                    },
                }
            }
        };
        match limit {
            Some(limit) => tokio::time::timeout(limit, work)
                .await
                .map_err(|_| Lost::Unresponsive(limit))?,
            None => work.await,
        }
    }

    /// Waits until at least one notification is in `pending`.
    ///
    /// A connection can die without a word (a NAT or a load balancer
    /// forgetting it), which would leave the subscription deaf until TCP
    /// keepalives notice, hours later by default. So after each
    /// `health_check` of silence the server must answer a query within the
    /// same time.
    async fn wait(
        &mut self,
        health_check: Option<Duration>,
        pending: &mut VecDeque<String>,
    ) -> Result<(), Lost> {
        while pending.is_empty() {
            let message = match health_check {
                None => self.messages.next().await,
                Some(idle) => match tokio::time::timeout(idle, self.messages.next()).await {
                    Ok(message) => message,
                    Err(_silent) => {
                        self.run("SELECT 1", Some(idle), pending).await?;
                        continue;
                    }
                },
            };
            match message {
                Some(Ok(AsyncMessage::Notification(n))) => {
                    pending.push_back(n.payload().to_owned());
                }
                Some(Ok(_notice)) => {}
                Some(Err(error)) => return Err(Lost::from(error)),
                None => return Err(Lost::Closed),
            }
        }
        Ok(())
    }

    /// Ends the session politely: the connection sends `Terminate` once
    /// its client is gone, then finishes.
    async fn close(self) {
        let Live {
            client,
            mut messages,
        } = self;
        drop(client);
        let drain = async { while let Some(Ok(_)) = messages.next().await {} };
        let _ = tokio::time::timeout(CLOSE_GRACE, drain).await;
    }
}

/// A [`Source`] of notification payloads from a dedicated connection, which
/// reconnects with backoff for as long as the subscription runs.
pub(super) struct PgListener<T> {
    config: Config,
    tls: T,
    channel: Identifier,
    listen_sql: String,
    backoff: Backoff,
    health_check: Option<Duration>,
    live: Option<Live>,
    pending: VecDeque<String>,
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
        // The identifier's alphabet needs no quoting.
        let listen_sql = format!("LISTEN {channel}");
        let mut pending = VecDeque::new();
        let live = Live::open(
            &config,
            tls.clone(),
            &listen_sql,
            health_check,
            &mut pending,
        )
        .await?;
        tracing::debug!(%channel, "broadcast subscription listening");
        Ok(PgListener {
            config,
            tls,
            channel,
            listen_sql,
            backoff,
            health_check,
            live: Some(live),
            pending,
        })
    }

    async fn reconnect(&mut self) -> Live {
        loop {
            let delay = self.backoff.next_delay();
            tokio::time::sleep(delay).await;
            let opened = Live::open(
                &self.config,
                self.tls.clone(),
                &self.listen_sql,
                self.health_check,
                &mut self.pending,
            )
            .await;
            match opened {
                Ok(live) => {
                    self.backoff.reset();
                    return live;
                }
                Err(error) => tracing::warn!(
                    channel = %self.channel,
                    attempt = self.backoff.attempt(),
                    %error,
                    "broadcast subscription could not reconnect; retrying"
                ),
            }
        }
    }
}

impl<T: ListenTls> Source for PgListener<T> {
    async fn next(&mut self) -> Option<Event> {
        loop {
            if let Some(payload) = self.pending.pop_front() {
                return Some(Event::Payload(payload));
            }
            match &mut self.live {
                Some(live) => {
                    if let Err(error) = live.wait(self.health_check, &mut self.pending).await {
                        tracing::warn!(
                            channel = %self.channel,
                            %error,
                            "broadcast subscription lost its connection; reconnecting"
                        );
                        self.live = None;
                    }
                }
                None => {
                    self.live = Some(self.reconnect().await);
                    return Some(Event::Reconnected);
                }
            }
        }
    }

    async fn close(mut self) {
        if let Some(live) = self.live.take() {
            live.close().await;
        }
    }
}
