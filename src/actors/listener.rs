//! The listener: one dedicated Postgres connection that LISTENs on the
//! channel and forwards what it hears to the relay.
//!
//! The connection is never taken from the pool (a pooled connection is reset
//! between checkouts, dropping the LISTEN) and must bypass transaction-mode
//! poolers, hence its own URL setting. Every payload goes through the wire
//! codec; one that does not decode is dropped with a warning and counted.
//! When the connection fails it reconnects with full-jitter backoff, and
//! after every (re)connect tells the relay, which re-reads what it may have
//! missed.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use actix::{Actor, ActorFutureExt, Addr, AsyncContext, Context, WrapFuture};
use eventrelay_publisher::Identifier;
use eventrelay_publisher::backoff::Backoff;
use eventrelay_wire::{EventNotification, decode_notification};
use futures_util::StreamExt;
use tokio::sync::mpsc;
use tokio_postgres::{AsyncMessage, NoTls};

use super::relay::{Ephemeral, ListenerConnected, Pointer, Relay};
use crate::metrics::Metrics;

const BACKOFF_BASE: Duration = Duration::from_millis(100);
const BACKOFF_CAP: Duration = Duration::from_secs(10);

/// Where notifications come from.
pub enum NotificationSource {
    /// A dedicated connection to a Postgres server that LISTENs on `channel`.
    Dedicated { url: String, channel: Identifier },
    /// Payloads handed over by whoever owns the connection (the embedded
    /// database's single session, which already LISTENs).
    Feed(mpsc::UnboundedReceiver<String>),
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
            Some(NotificationSource::Dedicated { url, channel }) => {
                let run = listen_forever(url, channel, relay, connected, metrics);
                ctx.spawn(run.into_actor(self).map(|_, _, _| ()));
            }
            Some(NotificationSource::Feed(payloads)) => {
                let run = follow_feed(payloads, relay, connected, metrics);
                ctx.spawn(run.into_actor(self).map(|_, _, _| ()));
            }
            None => {}
        }
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        self.connected.store(false, Ordering::Relaxed);
    }
}

async fn listen_forever(
    url: String,
    channel: Identifier,
    relay: Addr<Relay>,
    connected: Arc<AtomicBool>,
    metrics: Arc<Metrics>,
) {
    let mut backoff = Backoff::new(BACKOFF_BASE, BACKOFF_CAP);
    let mut first = true;
    loop {
        match listen_once(&url, &channel, &relay, &connected, &metrics, first).await {
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

/// One connection's life: connect, LISTEN, forward until it ends.
async fn listen_once(
    url: &str,
    channel: &Identifier,
    relay: &Addr<Relay>,
    connected: &AtomicBool,
    metrics: &Metrics,
    first: bool,
) -> Result<(), tokio_postgres::Error> {
    let (client, mut connection) = tokio_postgres::connect(url, NoTls).await?;
    let (sender, mut messages) = mpsc::unbounded_channel();
    let driver = tokio::spawn(async move {
        let mut stream = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(message) = stream.next().await {
            match message {
                Ok(message) => {
                    if sender.send(Ok(message)).is_err() {
                        return;
                    }
                }
                Err(error) => {
                    let _ = sender.send(Err(error));
                    return;
                }
            }
        }
    });
    let result = async {
        client.batch_execute(&format!("LISTEN {channel}")).await?;
        connected.store(true, Ordering::Relaxed);
        if !first {
            metrics.listener_reconnects.inc();
        }
        tracing::info!(%channel, "listening for notifications");
        relay.do_send(ListenerConnected);
        while let Some(message) = messages.recv().await {
            if let AsyncMessage::Notification(notification) = message? {
                forward(notification.payload(), relay, metrics);
            }
        }
        Ok(())
    }
    .await;
    driver.abort();
    result
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
    relay.do_send(ListenerConnected);
    while let Some(payload) = payloads.recv().await {
        forward(&payload, &relay, &metrics);
    }
    connected.store(false, Ordering::Relaxed);
    tracing::warn!("the embedded database's notification feed ended");
}

fn forward(payload: &str, relay: &Addr<Relay>, metrics: &Metrics) {
    match decode_notification(payload.as_bytes()) {
        Ok(EventNotification::Pointer { scope_key, seq }) => {
            relay.do_send(Pointer { scope_key, seq });
        }
        Ok(EventNotification::Inline { envelope }) => relay.do_send(Ephemeral(envelope)),
        Err(error) => {
            metrics.notifications_malformed.inc();
            let shown: String = payload.chars().take(120).collect();
            tracing::warn!(%error, payload = %shown, "dropping malformed notification");
        }
    }
}
