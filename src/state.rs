//! The application state every request handler and every stream reaches:
//! the relay's actors, the database, the configuration in force, and the
//! registries of open streams. The HTTP layer and the SSE layer both use
//! it, so it belongs to neither.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use actix::Addr;

use crate::actors::Relay;
use crate::actors::mailbox::Counted;
use crate::auth::SubscriberResolver;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::store::{Database, Outbox};

/// What every handler can reach.
pub struct AppState {
    /// The configuration in force, with the live settings of the last
    /// reload; read it once per request with [`AppState::config`].
    pub config: crate::reload::LiveConfig,
    /// Asks the service to reload its configuration, when it can.
    pub reload: Option<crate::reload::ReloadHandle>,
    pub relay: Counted<Addr<Relay>>,
    /// Each scope's hub, for handing ephemeral events straight to it.
    pub hubs: crate::actors::HubDirectory,
    pub resolver: Arc<dyn SubscriberResolver>,
    pub db: Database,
    pub outbox: Outbox,
    /// The join views and replay pages streams opening at once share.
    pub reads: crate::sse::shared_reads::SharedReads,
    /// Writes publish requests, in groups when group commit is on.
    pub publishing: crate::group_commit::Publishing,
    pub metrics: Arc<Metrics>,
    pub listener_connected: Arc<AtomicBool>,
    /// The webhook subscriptions and delivery log, for the admin API.
    pub webhooks: crate::webhooks::WebhookStore,
    /// The webhook dispatcher, when it runs on this replica (a redelivery
    /// tells it that a delivery is due).
    pub dispatcher: Option<Counted<Addr<crate::webhooks::Dispatcher>>>,
    /// Set in development mode only, for the inspector's token minting.
    pub development_secret: Option<crate::secret::Secret>,
    /// Which other origins' pages may read `/v1/events`.
    pub cors: Arc<crate::http::cors::CorsPolicy>,
    /// Every stream holds one of these while it is open.
    pub open_streams: OpenStreams,
    /// This relay's open streams, by subscriber: the connection cap, the
    /// admin API's listing, and disconnections.
    pub streams: crate::sse::registry::StreamRegistry,
    /// Where disconnections are recorded for every relay to read.
    pub disconnections: crate::store::disconnections::Disconnections,
    /// This relay's name in the admin API's answers: host and process id.
    pub relay_name: String,
    /// The event types of `publish.schemas_dir`, read at start.
    pub catalog: Arc<crate::catalog::EventCatalog>,
    /// The customer portal's sessions.
    pub portal: crate::portal::PortalStore,
    /// Who is connected to the scopes with presence.
    pub presence: crate::presence::Presence,
}

/// What a shutdown waits for: each open stream holds a sender of one
/// channel, and the channel closes when the last is dropped. The state
/// keeps only a weak handle, so it never holds the channel open itself.
#[derive(Clone)]
pub struct OpenStreams(tokio::sync::mpsc::WeakSender<()>);

impl OpenStreams {
    /// The handle for the state, and the receiver whose `recv` answers
    /// `None` once the returned sender and every stream's hold are dropped.
    pub fn channel() -> (
        Self,
        tokio::sync::mpsc::Sender<()>,
        tokio::sync::mpsc::Receiver<()>,
    ) {
        let (sender, receiver) = tokio::sync::mpsc::channel(1);
        (OpenStreams(sender.downgrade()), sender, receiver)
    }

    /// A hold for one stream; `None` once the service is stopping and the
    /// channel has closed.
    pub fn hold(&self) -> Option<tokio::sync::mpsc::Sender<()>> {
        self.0.upgrade()
    }
}

impl AppState {
    /// The configuration in force now.
    pub fn config(&self) -> Arc<Config> {
        Arc::clone(&self.config.borrow())
    }
}
