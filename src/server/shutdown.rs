//! The shutdown, in the order clients need: stop accepting, end every
//! stream with its closing chunk, stop the HTTP server, then the
//! background tasks, the actors, the arbiters, the last spans and the
//! embedded database, each step bounded so that one that hangs cannot hold
//! up the rest.

use std::time::Duration;

use actix::{Addr, Arbiter};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::actors::listener::StopListener;
use crate::actors::mailbox::Counted;
use crate::actors::relay::StopRelay;
use crate::actors::{Listener, Relay};
use crate::sse::registry::StreamRegistry;
use crate::webhooks::{Dispatcher, StopDispatcher};

/// How long open connections get to finish when the service stops.
pub(super) const HTTP_SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// Everything a running service stops.
pub(super) struct Running {
    pub http: actix_server::ServerHandle,
    /// The HTTP server's own task, which ends when it has stopped.
    pub http_stopped: JoinHandle<std::io::Result<()>>,
    /// A second handle on the listening socket (see [`stop_listening`]).
    pub listening: std::net::TcpListener,
    pub streams: StreamRegistry,
    /// The service's own hold on the open-streams channel (see
    /// [`crate::state::OpenStreams`]), and the channel's receiver.
    pub streams_open: mpsc::Sender<()>,
    pub streams_ended: mpsc::Receiver<()>,
    /// The janitor, the disconnection poller, the memory trimmer and the
    /// reload loop: aborted, as they hold nothing that must be finished.
    pub tasks: Vec<JoinHandle<()>>,
    pub listener: Addr<Listener>,
    pub dispatcher: Option<Counted<Addr<Dispatcher>>>,
    pub relay: Counted<Addr<Relay>>,
    /// Closes once every long-lived actor has stopped.
    pub actors_stopped: mpsc::Receiver<()>,
    pub arbiters: Vec<Arbiter>,
    /// Sends its last spans once everything that makes them has stopped.
    pub tracing: crate::telemetry::Tracing,
    /// Takes this relay's members out of presence before its task stops.
    pub presence: crate::presence::Presence,
    #[cfg(feature = "embedded")]
    pub embedded: Option<crate::store::embedded::EmbeddedDatabase>,
}

impl Running {
    /// Stops everything; the HTTP server's error, if it had one.
    pub async fn stop(mut self) -> std::io::Result<()> {
        tracing::info!("shutting down");
        // The order matters to clients: first nothing new is accepted, then
        // every stream ends with its closing chunk. A client reconnecting at
        // once is refused here and goes to another replica (or retries until
        // the next process listens), instead of landing on this one while it
        // winds down or being reset from its accept queue.
        self.http.pause().await;
        // Let the accept thread take the pause before the socket stops
        // listening under it; otherwise it reports a failed accept.
        tokio::task::yield_now().await;
        stop_listening(&self.listening);
        // Every stream ends cleanly, so its client reconnects (to another
        // replica) at once.
        self.streams.close_all();
        // Every stream holds a sender; the channel closes when the last ends.
        // Streams whose clients stopped reading get the grace period, no more.
        drop(self.streams_open);
        let _ = tokio::time::timeout(HTTP_SHUTDOWN_GRACE, self.streams_ended.recv()).await;
        // Only now is the server stopped. Its workers may drop their
        // connections at once rather than gracefully (a stopped accept thread
        // can end a worker before the worker reads its own stop), so every
        // stream must have written its closing chunk before this point.
        let http_stopping = self.http.stop(true);
        // Bounded: the rest of the shutdown (actors, arbiters, the embedded
        // database) must run even if the HTTP server never reports back.
        let http_stopped = async {
            http_stopping.await;
            self.http_stopped.await.unwrap_or(Ok(()))
        };
        let result = match tokio::time::timeout(HTTP_SHUTDOWN_GRACE * 3, http_stopped).await {
            Ok(result) => result,
            Err(_) => {
                tracing::warn!(
                    "the HTTP server did not report stopping within {:?}; stopping the rest",
                    HTTP_SHUTDOWN_GRACE * 3
                );
                Ok(())
            }
        };
        self.presence.stop(HTTP_SHUTDOWN_GRACE).await;
        for task in self.tasks {
            task.abort();
        }
        self.listener.do_send(StopListener);
        if let Some(dispatcher) = self.dispatcher {
            dispatcher.addr().do_send(StopDispatcher);
        }
        self.relay.addr().do_send(StopRelay);
        drop(self.relay);
        // Each of these actors drops its sender when it has stopped.
        if tokio::time::timeout(HTTP_SHUTDOWN_GRACE, self.actors_stopped.recv())
            .await
            .is_err()
        {
            tracing::warn!(
                "an actor did not stop within {HTTP_SHUTDOWN_GRACE:?}; stopping the rest"
            );
        }
        for arbiter in self.arbiters {
            arbiter.stop();
        }
        // The export blocks (up to its timeout) on the exporter's thread.
        let tracing = self.tracing;
        let _ = tokio::task::spawn_blocking(move || tracing.shutdown()).await;
        #[cfg(feature = "embedded")]
        if let Some(embedded) = self.embedded {
            embedded.shutdown().await;
        }
        result
    }
}

/// Makes the listening socket refuse new connections now, rather than when
/// the HTTP server's accept thread gets round to closing it: a shut-down
/// read side takes a TCP socket out of the listening state at once (Linux).
fn stop_listening(listening: &std::net::TcpListener) {
    if let Err(error) = socket2::SockRef::from(listening).shutdown(std::net::Shutdown::Read) {
        tracing::debug!(%error, "could not stop listening early; the server stops it");
    }
}
