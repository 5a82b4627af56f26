//! The listener: one dedicated Postgres connection that LISTENs on the
//! channel and forwards what it hears to the relay.
//!
//! The connection is never taken from the pool (a pooled connection is reset
//! between checkouts, dropping the LISTEN) and must bypass transaction-mode
//! poolers, hence its own URL setting. Every payload goes through the wire
//! codec; one that does not decode is dropped with a warning and counted.
//! The rows a pointer carries are the exception: the listener reads only
//! the pointer, and the relay decodes the rows if the scope has
//! subscribers (rows no one is watching are dropped unread, so unreadable
//! ones are counted only where someone watches).
//! When the connection fails it reconnects with full-jitter backoff, and
//! after every (re)connect tells the relay, which re-reads what it may have
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

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use actix::{Actor, ActorContext, ActorFutureExt, Addr, AsyncContext, Context, WrapFuture};
use eventrelay_publisher::Identifier;
use eventrelay_publisher::backoff::Backoff;
use eventrelay_publisher::listen::{self, HealthCheck, ListenConnection};
use eventrelay_publisher::{ConnectError, PgConnectOptions};
use eventrelay_wire::{
    DecodeError, EventNotification, MAX_NOTIFY_PAYLOAD_BYTES, decode_notification_within,
    defer_carried_rows,
};
use tokio::sync::mpsc;

use super::relay::{
    DeliveriesQueued, Ephemeral, ListenerConnected, Pointer, Relay, count_unreadable_rows,
};
use super::wal_stream::{LogicalSource, stream_forever};
use crate::metrics::{ActorKind, Metrics};
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

/// Where notifications come from.
pub enum NotificationSource {
    /// A dedicated connection to a Postgres server that LISTENs on
    /// `channel`, probed after `health` of silence.
    Dedicated {
        /// Boxed: the settings are far larger than the other variant.
        options: Box<PgConnectOptions>,
        channel: Identifier,
        health: Duration,
        /// Another connection's way in, to prove notifications from other
        /// sessions reach the LISTEN connection.
        probe_via: Database,
    },
    /// Payloads handed over by whoever owns the connection (the embedded
    /// database's single session, which already LISTENs).
    Feed(mpsc::UnboundedReceiver<String>),
    /// No notifications at all: committed rows and ephemeral messages read
    /// from a logical replication stream (`database.wakeup = "logical"`).
    Logical(LogicalSource),
}

pub struct Listener {
    source: Option<NotificationSource>,
    relay: Addr<Relay>,
    connected: Arc<AtomicBool>,
    metrics: Arc<Metrics>,
}

impl Listener {
    pub fn new(
        source: NotificationSource,
        relay: Addr<Relay>,
        connected: Arc<AtomicBool>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Listener {
            source: Some(source),
            relay,
            connected,
            metrics,
        }
    }
}

impl Actor for Listener {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let relay = self.relay.clone();
        let connected = Arc::clone(&self.connected);
        let metrics = Arc::clone(&self.metrics);
        match self.source.take() {
            Some(NotificationSource::Dedicated {
                options,
                channel,
                health,
                probe_via,
            }) => {
                let run = listen_forever(
                    *options, channel, health, probe_via, relay, connected, metrics,
                );
                ctx.spawn(run.into_actor(self).map(|_, _, _| ()));
            }
            Some(NotificationSource::Feed(payloads)) => {
                let run = follow_feed(payloads, relay, connected, metrics);
                ctx.spawn(run.into_actor(self).map(|_, _, _| ()));
            }
            Some(NotificationSource::Logical(source)) => {
                let run = stream_forever(source, relay, connected, metrics);
                ctx.spawn(run.into_actor(self).map(|_, _, _| ()));
            }
            None => {}
        }
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        self.connected.store(false, Ordering::Relaxed);
    }
}

/// Stops the listener and closes its connection. Dropping its address is
/// not enough: an actor with a running future outlives its addresses.
#[derive(actix::Message)]
#[rtype(result = "()")]
pub struct StopListener;

impl actix::Handler<StopListener> for Listener {
    type Result = ();

    fn handle(&mut self, _: StopListener, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}

async fn listen_forever(
    mut options: PgConnectOptions,
    channel: Identifier,
    health: Duration,
    probe_via: Database,
    relay: Addr<Relay>,
    connected: Arc<AtomicBool>,
    metrics: Arc<Metrics>,
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
            relay: &relay,
            connected: &connected,
            metrics: &metrics,
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
    relay: &'a Addr<Relay>,
    connected: &'a AtomicBool,
    metrics: &'a Metrics,
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
            relay,
            connected,
            metrics,
        } = *self;
        let limit = options
            .config()
            .get_connect_timeout()
            .copied()
            .unwrap_or(health);
        let mut connection = ListenConnection::connect_options(options, limit).await?;
        connection.listen(channel, None).await?;
        prove_delivery(&mut connection, probe_via, health, relay, metrics).await?;
        connected.store(true, Ordering::Relaxed);
        if !first {
            metrics.listener_reconnects.inc();
        }
        tracing::info!(%channel, "listening for notifications");
        metrics.actor(ActorKind::Relay).queued();
        relay.do_send(ListenerConnected);
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
                && !supervised_forward(
                    notification.payload(),
                    MAX_NOTIFY_PAYLOAD_BYTES,
                    relay,
                    metrics,
                )
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
/// the events' channel that arrive meanwhile are forwarded as usual.
async fn prove_delivery(
    connection: &mut ListenConnection,
    probe_via: &Database,
    health: Duration,
    relay: &Addr<Relay>,
    metrics: &Metrics,
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
                    relay,
                    metrics,
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
async fn follow_feed(
    mut payloads: mpsc::UnboundedReceiver<String>,
    relay: Addr<Relay>,
    connected: Arc<AtomicBool>,
    metrics: Arc<Metrics>,
) {
    connected.store(true, Ordering::Relaxed);
    metrics.actor(ActorKind::Relay).queued();
    relay.do_send(ListenerConnected);
    while let Some(payload) = payloads.recv().await {
        // The feed is not the listener's to reopen: after a failure it
        // just goes on with the next payload.
        supervised_forward(&payload, MAX_NOTIFY_PAYLOAD_BYTES, &relay, &metrics);
        metrics
            .actor(ActorKind::Listener)
            .set_waiting(payloads.len());
    }
    connected.store(false, Ordering::Relaxed);
    tracing::warn!("the embedded database's notification feed ended");
}

/// [`forward`] under supervision: false when it panicked, after which the
/// listener restarts (a new connection, and the relay re-reads every active
/// scope), which is counted. Payloads longer than `limit` bytes are
/// malformed.
pub(super) fn supervised_forward(
    payload: &str,
    limit: usize,
    relay: &Addr<Relay>,
    metrics: &Metrics,
) -> bool {
    let forwarded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        forward(payload, limit, relay, metrics);
    }));
    if forwarded.is_err() {
        metrics.restarted(ActorKind::Listener);
        tracing::error!("the listener failed on a notification; restarting it");
    }
    forwarded.is_ok()
}

/// The prefix of the test suite's fault notifications (with the
/// `fault-injection` feature only).
#[cfg(feature = "fault-injection")]
const FAULT_PREFIX: &str = "eventrelay-fault:";

/// Decodes one notification and hands it to the relay: the listener's
/// unit of work, timed as its handling.
fn forward(payload: &str, limit: usize, relay: &Addr<Relay>, metrics: &Metrics) {
    let _handling = metrics.actor(ActorKind::Listener).timed();
    #[cfg(feature = "fault-injection")]
    if let Some(target) = payload.strip_prefix(FAULT_PREFIX) {
        use super::relay::InjectFault;
        match target {
            "listener" => panic!("fault injected into the listener"),
            "relay" => {
                metrics.actor(ActorKind::Relay).queued();
                relay.do_send(InjectFault::Relay);
            }
            _ => {
                if let Some(scope_key) = target.strip_prefix("hub:") {
                    metrics.actor(ActorKind::Relay).queued();
                    relay.do_send(InjectFault::Hub(scope_key.to_owned()));
                }
            }
        }
        return;
    }
    let to_relay = metrics.actor(ActorKind::Relay);
    // Most payloads under load are pointers carrying rows: the relay
    // decodes those rows only for a scope with subscribers.
    if let Some(pointer) = defer_carried_rows(payload, limit) {
        to_relay.queued();
        relay.do_send(Pointer {
            scope_key: pointer.scope_key.clone(),
            seq: pointer.seq,
            carried: Some(pointer),
        });
        return;
    }
    match decode_notification_within(payload.as_bytes(), limit) {
        Ok(EventNotification::Pointer { scope_key, seq, .. }) => {
            // A bare pointer, or rows in a form the deferred reading leaves
            // alone (a field given twice): those rows are read back.
            to_relay.queued();
            relay.do_send(Pointer {
                scope_key,
                seq,
                carried: None,
            });
        }
        Ok(EventNotification::Inline { envelope }) => {
            to_relay.queued();
            relay.do_send(Ephemeral(envelope));
        }
        Ok(EventNotification::InlineBatch { envelopes, .. }) => {
            for envelope in envelopes {
                to_relay.queued();
                relay.do_send(Ephemeral(envelope));
            }
        }
        Ok(EventNotification::DeliveriesQueued) => {
            to_relay.queued();
            relay.do_send(DeliveriesQueued);
        }
        Err(DecodeError::UnreadableCarriedRows {
            scope_key,
            seq,
            reason,
        }) => {
            // The pointer is sound: its rows are read back instead.
            count_unreadable_rows(metrics, &scope_key, seq, &reason);
            to_relay.queued();
            relay.do_send(Pointer {
                scope_key,
                seq,
                carried: None,
            });
        }
        Err(error) => {
            metrics.notifications_malformed.inc();
            let shown: String = payload.chars().take(120).collect();
            tracing::warn!(%error, payload = %shown, "dropping malformed notification");
        }
    }
}
