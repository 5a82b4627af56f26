//! Notify mode's ear: a dedicated Postgres connection that LISTENs on the
//! channel, and the embedded database's feed of the same payloads.
//!
//! The connection is never taken from the pool (a pooled connection is reset
//! between checkouts, dropping the LISTEN) and must bypass transaction-mode
//! poolers, hence its own URL setting; a probe notification sent through
//! the pool proves delivery before the listener counts as connected. When
//! the connection fails it reconnects with full-jitter backoff, and after
//! every (re)connect tells the relay, which re-reads what it may have
//! missed.
//!
//! A connection can also die without failing: a NAT or load balancer that
//! drops an idle flow sends no FIN and no RST, and a LISTEN connection only
//! ever reads, so nothing notices. After `health` of silence the listener
//! therefore sends `SELECT 1` and gives the answer half of `health`; no
//! answer means the connection is dead, and it is replaced like a failed
//! one. The connection, its TLS and that check are the publisher crate's
//! shared driver ([`ListenConnection`]); this module owns what the relay
//! adds around it: the delivery probe, the reconnect loop and the metrics.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use eventrelay_publisher::Identifier;
use eventrelay_publisher::backoff::Backoff;
use eventrelay_publisher::listen::{self, HealthCheck, ListenConnection};
use eventrelay_publisher::{ConnectError, PgConnectOptions};
use eventrelay_wire::MAX_NOTIFY_PAYLOAD_BYTES;
use tokio::sync::mpsc;

use super::forward::{Targets, supervised_forward};
use crate::metrics::ActorKind;
use crate::store::Database;

const BACKOFF_BASE: Duration = Duration::from_millis(100);
const BACKOFF_CAP: Duration = Duration::from_secs(10);

/// Why one LISTEN connection ended.
#[derive(Debug, thiserror::Error)]
enum ListenError {
    #[error(transparent)]
    Connect(#[from] ConnectError),
    #[error("database error: {0}")]
    Postgres(#[from] tokio_postgres::Error),
    #[error("no answer to a health check within {0:?}; the connection is dead")]
    Dead(Duration),
    #[error(
        "LISTEN succeeded but a notification sent to this connection never arrived: \
         database.listen_url must reach Postgres directly (or through a session-mode \
         pooler), never through a transaction-mode pooler"
    )]
    NotDelivered,
    #[error("the listener failed while forwarding a notification; reconnecting")]
    Failed,
    #[error("could not send the delivery probe through the pool; retrying")]
    ProbeNotSent,
    #[error(transparent)]
    Lost(listen::ListenError),
}

impl From<listen::ListenError> for ListenError {
    fn from(error: listen::ListenError) -> Self {
        match error {
            listen::ListenError::Connect(error) => ListenError::Connect(error),
            listen::ListenError::Postgres(error) => ListenError::Postgres(error),
            other => ListenError::Lost(other),
        }
    }
}

pub(super) async fn listen_forever(
    mut options: PgConnectOptions,
    channel: Identifier,
    health: Duration,
    probe_via: Database,
    targets: Targets,
    connected: &AtomicBool,
) {
    // Attempts through a path that swallows packets give up, and are
    // retried, within about `health`, so a restored path is found quickly.
    let patience = (health / 2).max(Duration::from_millis(500));
    options.config_mut().connect_timeout(patience);
    let mut backoff = Backoff::new(BACKOFF_BASE, BACKOFF_CAP.min(patience));
    let mut first = true;
    loop {
        let link = Link {
            channel: &channel,
            health,
            probe_via: &probe_via,
            targets: &targets,
            connected,
        };
        match link.listen_once(&options, first).await {
            Ok(()) => tracing::warn!(%channel, "LISTEN connection closed; reconnecting"),
            Err(error) => {
                tracing::warn!(%channel, %error, "LISTEN connection failed; reconnecting")
            }
        }
        if connected.swap(false, Ordering::Relaxed) {
            backoff.reset();
            first = false;
        }
        tokio::time::sleep(backoff.next_delay()).await;
    }
}

/// What one connection's life needs.
struct Link<'a> {
    channel: &'a Identifier,
    health: Duration,
    probe_via: &'a Database,
    targets: &'a Targets,
    connected: &'a AtomicBool,
}

impl Link<'_> {
    /// One connection's life: connect, LISTEN, forward until it ends or stops
    /// answering.
    async fn listen_once(
        &self,
        options: &PgConnectOptions,
        first: bool,
    ) -> Result<(), ListenError> {
        let Link {
            channel,
            health,
            probe_via,
            targets,
            connected,
        } = *self;
        let metrics = &targets.metrics;
        let limit = options
            .config()
            .get_connect_timeout()
            .copied()
            .unwrap_or(health);
        let mut connection = ListenConnection::connect_options(options, limit).await?;
        connection.listen(channel, None).await?;
        // The relay hears of the new connection before any notification
        // it brings, the probe's wait included: its re-read of every scope
        // is then running when the first one arrives, and rows carried by
        // notifications wait for that read instead of going out ahead of
        // older rows that only the read finds.
        targets.connected();
        prove_delivery(&mut connection, probe_via, health, targets).await?;
        connected.store(true, Ordering::Relaxed);
        if !first {
            metrics.listener_reconnects.inc();
        }
        tracing::info!(%channel, "listening for notifications");
        let check = HealthCheck::new(health, (health / 2).max(Duration::from_millis(100)));
        loop {
            let notification = match connection.next(Some(check)).await {
                Ok(notification) => notification,
                Err(listen::ListenError::Closed) => return Ok(()),
                Err(listen::ListenError::Unresponsive(deadline)) => {
                    metrics.database_connections_dead.inc();
                    return Err(ListenError::Dead(deadline));
                }
                Err(error) => return Err(error.into()),
            };
            // A probe from another relay, in the moment before the probe
            // channel was left, is not an event.
            if notification.channel() != PROBE_CHANNEL
                && !supervised_forward(notification.payload(), MAX_NOTIFY_PAYLOAD_BYTES, targets)
            {
                return Err(ListenError::Failed);
            }
            metrics
                .actor(ActorKind::Listener)
                .set_waiting(connection.backlog());
        }
    }
}

/// The channel a listener notifies itself on, to prove that notifications
/// reach it. Not the events' channel, so no relay takes a probe for an event.
const PROBE_CHANNEL: &str = "eventrelay_listener_probe";

/// Sends a notification from another connection (the pool's) and waits
/// for it on the LISTEN connection, as events will arrive. Through a
/// transaction-mode pooler a `LISTEN` succeeds but nothing is ever
/// delivered, which would leave the relay deaf while it looks healthy; the
/// probe turns that into an error that names the cause. Notifications of
/// the events' channel that arrive meanwhile are forwarded as usual (the
/// relay was told of the connection before the probe).
async fn prove_delivery(
    connection: &mut ListenConnection,
    probe_via: &Database,
    health: Duration,
    targets: &Targets,
) -> Result<(), ListenError> {
    let token = uuid::Uuid::new_v4().simple().to_string();
    let patience = (health / 2).max(Duration::from_millis(500));
    connection
        .client()
        .batch_execute(&format!("LISTEN {PROBE_CHANNEL}"))
        .await?;
    let sent = async {
        let sender = probe_via.get().await.ok()?;
        sender
            .batch_execute(&format!("NOTIFY {PROBE_CHANNEL}, '{token}'"))
            .await
            .ok()
    };
    if tokio::time::timeout(patience, sent)
        .await
        .ok()
        .flatten()
        .is_none()
    {
        return Err(ListenError::ProbeNotSent);
    }
    let deadline = tokio::time::Instant::now() + patience;
    loop {
        match tokio::time::timeout_at(deadline, connection.next(None)).await {
            Err(_) | Ok(Err(listen::ListenError::Closed)) => {
                return Err(ListenError::NotDelivered);
            }
            Ok(Err(error)) => return Err(error.into()),
            Ok(Ok(notification)) => {
                if notification.channel() == PROBE_CHANNEL {
                    if notification.payload() == token {
                        break;
                    }
                } else if !supervised_forward(
                    notification.payload(),
                    MAX_NOTIFY_PAYLOAD_BYTES,
                    targets,
                ) {
                    return Err(ListenError::Failed);
                }
            }
        }
    }
    connection
        .client()
        .batch_execute(&format!("UNLISTEN {PROBE_CHANNEL}"))
        .await?;
    Ok(())
}

/// Forwards payloads someone else receives; the feed is "connected" for as
/// long as it is open.
pub(super) async fn follow_feed(
    mut payloads: mpsc::UnboundedReceiver<String>,
    targets: Targets,
    connected: &AtomicBool,
) {
    connected.store(true, Ordering::Relaxed);
    targets.connected();
    while let Some(payload) = payloads.recv().await {
        // The feed is not the listener's to reopen: after a failure it
        // just goes on with the next payload.
        supervised_forward(&payload, MAX_NOTIFY_PAYLOAD_BYTES, &targets);
        targets
            .metrics
            .actor(ActorKind::Listener)
            .set_waiting(payloads.len());
    }
    connected.store(false, Ordering::Relaxed);
    tracing::warn!("the embedded database's notification feed ended");
}
