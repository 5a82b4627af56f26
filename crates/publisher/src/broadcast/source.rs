//! Where a subscription's payloads come from: a listening connection
//! ([`super::listener`]) or any stream of payload strings, behind one
//! trait, and the errors of starting one.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use futures_util::{Stream, StreamExt};

/// Why a subscription could not start. Only the first connection reports
/// errors: once running, a subscription reconnects on its own.
#[derive(Debug, thiserror::Error)]
pub enum SubscribeError {
    #[error(transparent)]
    InvalidUrl(crate::connect::ConnectError),
    #[error("cannot connect and LISTEN: {0}")]
    Connect(#[source] tokio_postgres::Error),
    #[error("the server closed the connection before LISTEN completed")]
    Closed,
    #[error("no answer from the server within {0:?}")]
    Timeout(Duration),
}

/// Used when the URL sets no `connect_timeout`, so a reconnect to an
/// unreachable host cannot hang for the operating system's minutes.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// One thing the subscription task reacts to.
pub(super) enum Event {
    Payload(String),
    /// A new connection is listening after a gap; anything sent in the gap
    /// was lost.
    Reconnected,
}

/// Where a subscription's payloads come from: a listening connection, or
/// any stream of payload strings.
pub(super) trait Source: Send + 'static {
    /// The next event, or `None` when there will be no more.
    fn next(&mut self) -> impl Future<Output = Option<Event>> + Send;
    fn close(self) -> impl Future<Output = ()> + Send;
}

pub(super) struct StreamSource(pub(super) Pin<Box<dyn Stream<Item = String> + Send>>);

impl Source for StreamSource {
    async fn next(&mut self) -> Option<Event> {
        self.0.next().await.map(Event::Payload)
    }

    async fn close(self) {}
}
