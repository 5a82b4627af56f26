//! The one `LISTEN` driver: a dedicated connection's life (bounded start-up,
//! `LISTEN`, notifications, a health check after silence), and the message
//! pump that drives any open connection and hands over its notifications.
//!
//! Every listener in eventrelay goes through here: the service's relay
//! listener, the embedded database's single session, and the publisher's
//! broadcast subscriptions. What each does around a connection (probing
//! delivery, counting, reconnecting and reporting it) stays with it; what a
//! connection needs to be trusted stays here, so TLS and the dead-connection
//! check cannot drift apart between them.

use std::ops::ControlFlow;
use std::time::Duration;

use futures_util::StreamExt;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio::task::{JoinError, JoinHandle};
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::{AsyncMessage, Client, Config, Connection, Notification, Socket};

use crate::connect::{ConnectError, PgConnectOptions, explain};
use crate::identifier::Identifier;

/// TLS connectors a listening connection can use: any tokio-postgres
/// connector whose connections can move between threads, such as `NoTls`,
/// `postgres-native-tls` or `tokio-postgres-rustls` ([`PgTls`](crate::PgTls)).
///
/// The connection is driven on its own task, hence `Send` and `'static`.
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

/// Why a listening connection could not be opened or was given up.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    /// Opening the connection failed or did not finish in time.
    #[error(transparent)]
    Connect(#[from] ConnectError),
    #[error("database error: {0}")]
    Postgres(#[source] tokio_postgres::Error),
    #[error("the server closed the connection")]
    Closed,
    /// The server did not answer a statement (a health check, a `LISTEN`)
    /// in time: the path to it is most likely gone without a FIN or RST.
    #[error("no answer from the server within {0:?}; the connection is dead")]
    Unresponsive(Duration),
    /// The task driving the connection panicked or was cancelled.
    #[error("the task driving the connection ended abnormally")]
    Pump(#[source] JoinError),
}

/// When to doubt a silent connection, and how long it has to answer.
///
/// A `LISTEN` connection only ever reads, so a NAT or load balancer that
/// drops its flow without a FIN or RST leaves it waiting forever; a query
/// after a silence is what finds out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthCheck {
    /// Silence after which the server is asked `SELECT 1`.
    pub after: Duration,
    /// How long the answer may take before the connection counts as dead.
    pub answer_within: Duration,
}

impl HealthCheck {
    pub fn new(after: Duration, answer_within: Duration) -> Self {
        HealthCheck {
            after,
            answer_within,
        }
    }
}

/// Drives `connection` until it ends, handing each notification to
/// `deliver`; notices are dropped. `deliver` returning
/// [`ControlFlow::Break`] stops driving it, which closes the connection.
///
/// For a connection whose client is shared with other work (the embedded
/// database's one session): the caller keeps the client and spawns this.
/// `Ok` means the connection ended cleanly (every client dropped, or the
/// server closed it) or `deliver` stopped it.
pub async fn pump<S, T, F>(
    mut connection: Connection<S, T>,
    mut deliver: F,
) -> Result<(), tokio_postgres::Error>
where
    S: AsyncRead + AsyncWrite + Unpin,
    T: AsyncRead + AsyncWrite + Unpin,
    F: FnMut(Notification) -> ControlFlow<()>,
{
    let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
    while let Some(message) = messages.next().await {
        if let AsyncMessage::Notification(notification) = message? {
            if deliver(notification).is_break() {
                break;
            }
        }
    }
    Ok(())
}

/// The pump's task, aborted when its connection is dropped: a connection
/// given up as dead must not linger until TCP notices.
struct PumpTask(Option<JoinHandle<Result<(), tokio_postgres::Error>>>);

impl Drop for PumpTask {
    fn drop(&mut self) {
        if let Some(task) = &self.0 {
            task.abort();
        }
    }
}

/// One dedicated listening connection: its client, for statements, and
/// the notifications its pump received, in order.
///
/// Notifications that arrive while a statement runs are kept, not lost.
/// Dropping it closes the connection at once; [`close`](Self::close) ends
/// the session politely.
pub struct ListenConnection {
    client: Client,
    notifications: mpsc::UnboundedReceiver<Notification>,
    pump: PumpTask,
}

impl ListenConnection {
    /// Opens a connection. The whole start-up (TCP, TLS, authentication)
    /// must finish within `startup`: through a path that swallows packets,
    /// TCP may connect and TLS or authentication never answer.
    pub async fn connect<T: ListenTls>(
        config: &Config,
        tls: T,
        startup: Duration,
    ) -> Result<ListenConnection, ListenError> {
        let (client, connection) = tokio::time::timeout(startup, config.connect(tls))
            .await
            .map_err(|_| ConnectError::Timeout(startup))?
            .map_err(explain)?;
        Ok(ListenConnection::from_parts(client, connection))
    }

    /// [`connect`](Self::connect) with the TLS settings of `options`.
    pub async fn connect_options(
        options: &PgConnectOptions,
        startup: Duration,
    ) -> Result<ListenConnection, ListenError> {
        ListenConnection::connect(options.config(), options.tls()?, startup).await
    }

    /// Takes over a connection opened elsewhere and starts its pump.
    ///
    /// # Panics
    ///
    /// Outside a Tokio runtime.
    pub fn from_parts<S, T>(client: Client, connection: Connection<S, T>) -> ListenConnection
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
        T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let (sender, notifications) = mpsc::unbounded_channel();
        let task = tokio::spawn(pump(connection, move |notification| {
            match sender.send(notification) {
                Ok(()) => ControlFlow::Continue(()),
                Err(_) => ControlFlow::Break(()),
            }
        }));
        ListenConnection {
            client,
            notifications,
            pump: PumpTask(Some(task)),
        }
    }

    /// The connection's client, for statements of the caller's own.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// `LISTEN`s on `channel`; an identifier needs no quoting.
    pub async fn listen(
        &self,
        channel: &Identifier,
        answer_within: Option<Duration>,
    ) -> Result<(), ListenError> {
        self.execute(&format!("LISTEN {channel}"), answer_within)
            .await
    }

    /// Runs `sql` (simple query protocol), failing with
    /// [`ListenError::Unresponsive`] when there is no answer within
    /// `answer_within`.
    pub async fn execute(
        &self,
        sql: &str,
        answer_within: Option<Duration>,
    ) -> Result<(), ListenError> {
        let run = self.client.batch_execute(sql);
        let result = match answer_within {
            Some(limit) => tokio::time::timeout(limit, run)
                .await
                .map_err(|_| ListenError::Unresponsive(limit))?,
            None => run.await,
        };
        result.map_err(ListenError::Postgres)
    }

    /// Asks the server `SELECT 1`: a connection that cannot answer within
    /// `answer_within` is dead even if no error ever says so.
    pub async fn check(&self, answer_within: Duration) -> Result<(), ListenError> {
        self.execute("SELECT 1", Some(answer_within)).await
    }

    /// Notifications received and not yet taken with [`ListenConnection::next`]:
    /// a backlog that grows means the reader cannot keep up.
    pub fn backlog(&self) -> usize {
        self.notifications.len()
    }

    /// The next notification. With `health`, a silence of `health.after`
    /// is answered by a [`check`](Self::check), and the wait goes on if the
    /// server answers.
    ///
    /// Cancel-safe: nothing is lost when the returned future is dropped.
    /// See [`ListenConnection::backlog`] for what is already waiting.
    /// Once the connection has ended, every notification it received has
    /// been returned before the error.
    pub async fn next(&mut self, health: Option<HealthCheck>) -> Result<Notification, ListenError> {
        loop {
            let received = match health {
                None => self.notifications.recv().await,
                Some(health) => {
                    match tokio::time::timeout(health.after, self.notifications.recv()).await {
                        Ok(received) => received,
                        Err(_silent) => {
                            self.check(health.answer_within).await?;
                            continue;
                        }
                    }
                }
            };
            return match received {
                Some(notification) => Ok(notification),
                None => Err(self.ended().await),
            };
        }
    }

    /// Why the pump stopped; it has, since its sender is gone.
    async fn ended(&mut self) -> ListenError {
        let Some(task) = &mut self.pump.0 else {
            return ListenError::Closed;
        };
        let outcome = task.await;
        // A finished handle must not be polled again.
        self.pump.0 = None;
        match outcome {
            Ok(Ok(())) => ListenError::Closed,
            Ok(Err(error)) => ListenError::Postgres(error),
            Err(error) => ListenError::Pump(error),
        }
    }

    /// Ends the session politely, waiting at most `grace`: once its client
    /// is gone the connection sends `Terminate` and finishes, so the server
    /// does not log a dropped connection.
    pub async fn close(self, grace: Duration) {
        let ListenConnection {
            client,
            notifications,
            mut pump,
        } = self;
        drop(client);
        if let Some(task) = pump.0.as_mut() {
            // The receiver stays open meanwhile: the pump would otherwise stop
            // at the next notification, before saying goodbye.
            let _ = tokio::time::timeout(grace, task).await;
        }
        drop(notifications);
        // Dropping `pump` aborts it if the grace ran out.
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_their_cause() {
        let dead = ListenError::Unresponsive(Duration::from_millis(250));
        assert_eq!(
            dead.to_string(),
            "no answer from the server within 250ms; the connection is dead"
        );
        let timeout = ListenError::from(ConnectError::Timeout(Duration::from_secs(1)));
        assert!(
            timeout.to_string().contains("while connecting"),
            "{timeout}"
        );
    }
}
