//! Starting the service: the database, the migrations, the actors, the
//! background tasks and the HTTP server, wired from one `Config` value;
//! its parts, and the shutdown, live in the submodules.

mod backend;
mod disconnections;
mod janitor;
mod reloader;
mod schemas;
mod shutdown;

pub use schemas::{SchemaLoadError, load_schemas};

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use actix::{Actor, Arbiter};
use actix_web::{App, web};
use eventrelay_publisher::Publisher;
use tokio::sync::watch;

use crate::actors::listener::{HorizonMarks, NotificationSource, Targets};
use crate::actors::mailbox::Counted;
use crate::actors::relay::TailSettings;
use crate::actors::tail_budget::TailBudget;
use crate::actors::{HubDirectory, Listener, Relay};
use crate::auth::SubscriberResolver;
use crate::config::Config;
use crate::group_commit::{GroupSettings, Publishing};
use crate::metrics::{ActorKind, Metrics};
use crate::reload::Reloading;
use crate::state::{AppState, OpenStreams};
use crate::store::disconnections::Disconnections;
use crate::store::{DatabaseError, MigrateError, Outbox, WakeupError, WakeupMode};
use crate::webhooks::{Dispatcher, WebhookStore};

/// Why the service could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(
        "database.url is not set (or DATABASE_URL), and this build has no embedded database \
         (the `embedded` feature): the relay needs a Postgres to serve from"
    )]
    NoDatabase,
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error(transparent)]
    Publisher(#[from] eventrelay_publisher::PublishError),
    #[error(transparent)]
    Wakeup(#[from] WakeupError),
    #[error(transparent)]
    Sealing(#[from] crate::store::sealing::SealingError),
    #[error(transparent)]
    Connect(#[from] eventrelay_publisher::ConnectError),
    #[error(transparent)]
    Database(#[from] DatabaseError),
    #[error(transparent)]
    Migrate(#[from] MigrateError),
    #[cfg(feature = "embedded")]
    #[error(transparent)]
    Embedded(#[from] crate::store::embedded::EmbeddedError),
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error(transparent)]
    Schemas(#[from] SchemaLoadError),
    #[error("HTTP server failed: {0}")]
    Http(#[from] std::io::Error),
    #[error("cannot build the webhook dispatcher's HTTP client: {0}")]
    WebhookClient(#[source] reqwest::Error),
    #[error(transparent)]
    Tls(#[from] crate::http::tls::TlsError),
    #[error(transparent)]
    Telemetry(#[from] crate::telemetry::TelemetryError),
    #[error("http.allowed_origins: {0}")]
    Origins(#[from] crate::http::cors::OriginPatternError),
    #[error(transparent)]
    StreamServer(#[from] crate::actors::listener::logical::UnsuitableServer),
}

/// Runs the service on `listener` (see [`bind`]) until `shutdown` resolves.
/// Must be called inside an actix system (`#[actix_web::main]` or
/// `actix_web::rt::System`).
/// Its configuration stays as given; see [`run_with`] for live reload.
pub async fn run(
    config: Config,
    resolver: Arc<dyn SubscriberResolver>,
    listener: std::net::TcpListener,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    run_with(config, resolver, listener, shutdown, None).await
}

/// As [`run`], reloading the configuration on each request `reloading`
/// receives (see [`crate::reload`]).
pub async fn run_with(
    config: Config,
    resolver: Arc<dyn SubscriberResolver>,
    listener: std::net::TcpListener,
    shutdown: impl Future<Output = ()>,
    reloading: Option<Reloading>,
) -> Result<(), ServeError> {
    // A library caller may build its Config by hand: checked here as
    // `Config::load` checks a file.
    config.validate()?;
    let config = Arc::new(config);
    let schema = config.schema();
    // Before the database: a bad certificate or origin list stops the
    // start at once, naming the setting.
    let tls = match config.http.tls.enabled() {
        true => Some(crate::http::tls::server_config(&config.http.tls)?),
        false => None,
    };
    let cors = Arc::new(crate::http::cors::CorsPolicy::new(&config.http)?);
    if cors.allows_any_origin() {
        tracing::warn!(
            "http.allowed_origins = [\"*\"]: pages of any origin may read /v1/events, \
             without cookies (http.allow_credentials is off); bearer and query tokens still work"
        );
    }
    let tracing = crate::telemetry::Tracing::start(&config.telemetry)?;
    let backend = backend::open_backend(&config).await?;
    let metrics = Arc::new(Metrics::new().tracing_to(tracing.clone()));
    let db = backend
        .db
        .clone()
        .with_wait_histogram(metrics.database_pool_wait_seconds.clone());
    // The relay's role may write the outbox, so the publish API's batches
    // announce their own rows.
    let mut publisher = Publisher::new(schema.as_str())?
        .announcing_rows()
        .with_ephemeral_max_bytes(config.publish.ephemeral_max_bytes);
    if config.database.wakeup == WakeupMode::Notify {
        // A publish request of ephemeral events only writes nothing
        // durable: its notifications need no flush to be delivered.
        publisher = publisher.unflushed_ephemeral_commits();
    }
    let mut catalog = crate::catalog::EventCatalog::default();
    if let Some(dir) = &config.publish.schemas_dir {
        let (registry, types) = load_schemas(Path::new(dir))?;
        publisher = publisher.with_registry(registry);
        catalog = types;
    }
    let outbox = Outbox::new(&schema);

    let arbiters: Vec<Arbiter> = (0..config.hub.arbiters).map(|_| Arbiter::new()).collect();
    // What reloads change; read where each setting is used.
    let (live_config, live) = watch::channel(Arc::clone(&config));
    let (events_bound, bytes_bound) = (live.clone(), live.clone());
    let webhooks = WebhookStore::new(&schema);
    {
        let conn = db.get().await?;
        webhooks
            .sync_config_subscriptions(&*conn, &config.webhooks.subscriptions)
            .await?;
    }
    let listener_connected = Arc::new(AtomicBool::new(false));
    // Each long-lived actor holds a sender of this channel until it has
    // stopped; shutdown waits for the channel to close.
    let (actors_running, actors_stopped) = tokio::sync::mpsc::channel::<()>(1);
    let dispatcher = if config.webhooks.enabled {
        let dispatcher = Dispatcher::new(
            db.clone(),
            webhooks.clone(),
            config.webhooks.clone(),
            Arc::clone(&listener_connected),
            Arc::clone(&metrics),
            actors_running.clone(),
        )
        .map_err(ServeError::WebhookClient)?
        .start();
        Some(Counted::new(
            dispatcher,
            metrics.actor(ActorKind::Dispatcher).clone(),
        ))
    } else {
        None
    };
    let hubs = HubDirectory::default();
    // Unique across restarts: a process id may come back.
    let presence_relay = format!(
        "{}/{}",
        relay_name(),
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let (presence, presence_task) = crate::presence::start(
        &config.presence,
        db.clone(),
        crate::presence::PresenceStore::new(&schema),
        presence_relay,
        hubs.clone(),
    );
    let presence_task = presence_task.map(actix::spawn);
    // The embedded database only ever notifies.
    let wakeup = match backend.notifications {
        NotificationSource::Logical(_) => WakeupMode::Logical,
        _ => WakeupMode::Notify,
    };
    let relay = Relay::new(
        db.clone(),
        outbox.clone(),
        arbiters.iter().map(Arbiter::handle).collect(),
        TailSettings {
            max_events: Arc::new(move || events_bound.borrow().hub.tail_events),
            max_bytes: Arc::new(move || bytes_bound.borrow().hub.tail_bytes),
            budget: TailBudget::new(config.hub.tails_max_bytes, metrics.tails_bytes.clone()),
        },
        Arc::clone(&metrics),
        hubs.clone(),
        actors_running.clone(),
    )
    .hearing_before_visible(wakeup == WakeupMode::Logical)
    .start();
    let relay = Counted::new(relay, metrics.actor(ActorKind::Relay).clone());
    let listener_actor = Listener::new(
        backend.notifications,
        HorizonMarks {
            db: db.clone(),
            channel: config.channel(),
            wakeup,
            seal: backend.seal.clone(),
            metrics: Arc::clone(&metrics),
        },
        Targets {
            relay: relay.clone(),
            deliveries_due: dispatcher.as_ref().map(Counted::recipient),
            metrics: Arc::clone(&metrics),
            seal: backend.seal.clone(),
        },
        Arc::clone(&listener_connected),
        actors_running,
    )
    .start();
    let janitor = actix::spawn(
        janitor::Janitor {
            db: db.clone(),
            outbox: outbox.clone(),
            webhooks: webhooks.clone(),
            portal: crate::portal::PortalStore::new(&schema),
            outbox_retention: Duration::from_secs(config.outbox.retention_secs),
            finished_retention: Duration::from_secs(config.webhooks.retention_secs),
            dead_retention: Duration::from_secs(config.webhooks.dead_retention_secs),
            interval: Duration::from_secs(config.outbox.prune_interval_secs),
            metrics: Arc::clone(&metrics),
        }
        .prune_forever(),
    );

    // Disconnections recorded through any relay: denials in force now,
    // then every new one within a second.
    let streams = crate::sse::registry::StreamRegistry::default();
    let disconnections = Disconnections::new(&schema);
    let follower = actix::spawn(disconnections::follow_disconnections(
        db.clone(),
        disconnections.clone(),
        streams.clone(),
    ));
    let closing_streams = streams.clone();

    let publishing = Publishing::start(
        db.clone(),
        publisher,
        GroupSettings {
            window: Duration::from_millis(config.publish.group_commit_ms),
            max_events: config.publish.group_max_events,
            writers: config
                .publish
                .group_commit_writers
                .min(config.database.pool_size),
        },
        Arc::clone(&metrics),
    );
    let reload_handle = reloading.as_ref().map(|r| r.requests.handle());
    let reloader = reloading.map(|reloading| {
        actix::spawn(reloader::reload_forever(
            reloading,
            live_config,
            reloader::Reloaders {
                db: db.clone(),
                webhooks: webhooks.clone(),
                dispatcher: dispatcher.clone(),
                metrics: Arc::clone(&metrics),
            },
        ))
    });
    let trimmer = actix::spawn(crate::memory::trim_after_surges(
        metrics.connections.clone(),
    ));
    let (open_streams, streams_open, streams_ended) = OpenStreams::channel();
    let connections_closed = Arc::new(metrics.connections_closed_counters());
    let state = web::Data::new(AppState {
        config: live,
        reload: reload_handle,
        relay: relay.clone(),
        hubs,
        resolver,
        reads: crate::sse::shared_reads::SharedReads::new(db.clone(), outbox.clone()),
        db,
        outbox,
        publishing,
        metrics,
        listener_connected,
        webhooks: webhooks.clone(),
        dispatcher: dispatcher.clone(),
        development_secret: config.development_secret.clone(),
        cors,
        open_streams,
        streams,
        disconnections,
        catalog: Arc::new(catalog),
        portal: crate::portal::PortalStore::new(&schema),
        presence: presence.clone(),
        relay_name: relay_name(),
    });
    let pages = crate::http::Pages {
        inspector: config.http.inspector,
        console: config.http.console,
    };
    // A second handle on the listening socket, to stop listening at once
    // when shutting down (see `stop_listening`).
    let listening = listener.try_clone()?;
    let server = crate::http::serve::server(
        move || {
            App::new()
                .app_data(state.clone())
                .configure(|c| crate::http::routes(c, pages))
                // Outermost: a request counts as in flight from the moment
                // it reaches the application (see `http::deadline`).
                .wrap(actix_web::middleware::from_fn(crate::http::deadline::track))
        },
        listener,
        tls,
        crate::http::serve::Settings {
            workers: config.http.workers,
            limits: crate::http::deadline::Limits {
                headers: Duration::from_secs(config.http.header_timeout_secs),
                writes: Duration::from_secs(config.http.write_timeout_secs),
            },
            closed: connections_closed,
            shutdown_timeout: shutdown::HTTP_SHUTDOWN_GRACE,
            opening_per_worker: config.http.opening_per_worker,
            opening_wait: Duration::from_millis(config.http.opening_wait_ms),
            on_connect: crate::sse::peer::on_connect,
        },
    )?;
    let handle = server.handle();
    let stopped = actix::spawn(server);
    shutdown.await;
    shutdown::Running {
        http: handle,
        http_stopped: stopped,
        listening,
        streams: closing_streams,
        streams_open,
        streams_ended,
        tasks: [
            Some(janitor),
            Some(follower),
            Some(trimmer),
            reloader,
            presence_task,
        ]
        .into_iter()
        .flatten()
        .collect(),
        listener: listener_actor,
        dispatcher,
        relay,
        actors_stopped,
        arbiters,
        tracing,
        presence,
        #[cfg(feature = "embedded")]
        embedded: backend.embedded,
    }
    .stop()
    .await
    .map_err(ServeError::Http)
}

/// Binds the relay's HTTP address with the configured accept queue
/// (`http.listen_backlog`); the standard library's is 128.
pub fn bind(http: &crate::config::HttpConfig) -> std::io::Result<std::net::TcpListener> {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::for_address(http.bind), Type::STREAM, None)?;
    // A restarted relay takes its port back while the old process's
    // connections are still in TIME_WAIT.
    socket.set_reuse_address(true)?;
    socket.bind(&http.bind.into())?;
    socket.listen(i32::try_from(http.listen_backlog).unwrap_or(i32::MAX))?;
    Ok(socket.into())
}

/// This relay's name in the admin API: its host and process id.
fn relay_name() -> String {
    let mut buffer = [0u8; 256];
    // SAFETY: the buffer is valid for its length, and gethostname writes at
    // most that many bytes.
    let host = if unsafe { libc::gethostname(buffer.as_mut_ptr().cast(), buffer.len()) } == 0 {
        let end = buffer.iter().position(|&b| b == 0).unwrap_or(buffer.len());
        String::from_utf8_lossy(&buffer[..end]).into_owned()
    } else {
        "unknown-host".to_owned()
    };
    format!("{host}/{}", std::process::id())
}
