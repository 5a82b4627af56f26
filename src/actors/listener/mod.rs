//! The listener: hears about committed events and hands them on. In the
//! notify wake-up mode it LISTENs on the channel over a dedicated
//! connection (or follows the embedded database's feed: [`notify`]); in
//! the logical mode it reads the replication stream ([`logical`]). Either
//! way each payload is decoded and forwarded the same way ([`forward`]).
//! Beside it runs the relay's sender of horizon marks ([`horizon`]).

mod forward;
pub mod horizon;
pub mod logical;
mod notify;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use actix::{Actor, ActorContext, ActorFutureExt, AsyncContext, Context, WrapFuture};
use eventrelay_publisher::{Identifier, PgConnectOptions};
use tokio::sync::mpsc;

use crate::store::Database;
pub use forward::Targets;
pub use horizon::HorizonMarks;
pub use logical::LogicalSource;

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
    marks: Option<HorizonMarks>,
    targets: Targets,
    connected: Arc<AtomicBool>,
    /// Dropped with the listener once it has stopped: shutdown waits for
    /// that.
    _running: mpsc::Sender<()>,
}

impl Listener {
    pub fn new(
        source: NotificationSource,
        marks: HorizonMarks,
        targets: Targets,
        connected: Arc<AtomicBool>,
        running: mpsc::Sender<()>,
    ) -> Self {
        Listener {
            source: Some(source),
            marks: Some(marks),
            targets,
            connected,
            _running: running,
        }
    }
}

impl Actor for Listener {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let targets = self.targets.clone();
        let connected = Arc::clone(&self.connected);
        let Some(source) = self.source.take() else {
            return;
        };
        let run = async move {
            match source {
                NotificationSource::Dedicated {
                    options,
                    channel,
                    health,
                    probe_via,
                } => {
                    notify::listen_forever(
                        *options, channel, health, probe_via, targets, &connected,
                    )
                    .await;
                }
                NotificationSource::Feed(payloads) => {
                    notify::follow_feed(payloads, targets, &connected).await;
                }
                NotificationSource::Logical(source) => {
                    logical::stream_forever(source, targets, &connected).await;
                }
            }
        };
        ctx.spawn(run.into_actor(self).map(|_, _, _| ()));
        if let Some(marks) = self.marks.take() {
            ctx.spawn(marks.send_forever().into_actor(self));
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
