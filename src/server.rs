//! Starting and stopping the service: the database, the migrations, the actors,
//! the janitor and the HTTP server, wired from one `Config` value.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use actix::{Actor, Arbiter};
use actix_web::{App, web};
use eventrelay_publisher::{Publisher, SchemaRegistry};

use crate::actors::listener::{
    HorizonMarks, LogicalSource, NotificationSource, StopListener, Targets,
};
use crate::actors::mailbox::Counted;
use crate::actors::relay::{StopRelay, TailSettings};
use crate::actors::tail_budget::TailBudget;
use crate::actors::{HubDirectory, Listener, Relay};
use crate::auth::SubscriberResolver;
use crate::config::Config;
use crate::group_commit::{GroupSettings, Publishing};
use crate::http::{AppState, OpenStreams};
use crate::metrics::ActorKind;
use crate::metrics::Metrics;
use crate::reload::{ReloadError, ReloadReport, Reloading};
use crate::store::StoreError;
use crate::store::disconnections::Disconnections;
use crate::store::{
    Database, DatabaseError, MigrateError, Outbox, WakeupError, WakeupMode, check_schema,
    migrate_for,
};
use crate::webhooks::{Dispatcher, SetWorkers, StopDispatcher, WebhookStore};
use tokio::sync::watch;

/// How long open connections get to finish when the service stops.
const HTTP_SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

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
    #[error("http.allowed_origins: {0}")]
    Origins(#[from] crate::http::cors::OriginPatternError),
    #[error(transparent)]
    StreamServer(#[from] crate::actors::listener::logical::UnsuitableServer),
}

/// The database the service runs on, and where its notifications come from.
struct Backend {
    db: Database,
    notifications: NotificationSource,
    /// The key the schema's notifications are sealed with; `None` for the
    /// embedded database, whose are not.
    seal: Option<Arc<eventrelay_wire::SealKey>>,
    #[cfg(feature = "embedded")]
    embedded: Option<crate::store::embedded::EmbeddedDatabase>,
}

/// Connects to the configured Postgres, or starts the embedded one.
async fn open_backend(config: &Config) -> Result<Backend, ServeError> {
    let schema = config.schema();
    let channel = config.channel();
    let Some(url) = config.database.url.clone() else {
        #[cfg(feature = "embedded")]
        {
            let mut embedded = crate::store::embedded::EmbeddedDatabase::start(
                Path::new(&config.database.embedded_dir),
                &schema,
                &channel,
            )
            .await?;
            let (db, notifications) = embedded.take_handles();
            return Ok(Backend {
                db,
                notifications: NotificationSource::Feed(notifications),
                seal: None,
                embedded: Some(embedded),
            });
        }
        #[cfg(not(feature = "embedded"))]
        return Err(ServeError::NoDatabase);
    };
    let options = config.connect_options(&url)?;
    let listen_options = config.connect_options(config.listen_url().unwrap_or(&url))?;
    let wakeup = config.database.wakeup;
    let seal = {
        let mut client = options.connect().await?;
        if wakeup == WakeupMode::Logical {
            // Before migrating: a server that cannot serve the mode leaves
            // the schema as it was.
            crate::store::wakeup::check_logical_server(&client).await?;
        }
        if config.database.migrate {
            let report = migrate_for(&mut client, &schema, &channel, wakeup).await?;
            if !report.applied.is_empty() {
                tracing::info!(applied = ?report.applied, %schema, "migrations applied");
            }
        } else {
            check_schema(&client, &schema).await?;
        }
        crate::store::wakeup::check_ready(&client, &schema, wakeup).await?;
        if wakeup == WakeupMode::Logical && config.listen_url().is_some() {
            // The stream may read a standby: it must be able to decode,
            // and keep its slot. (At every reconnect too, see `logical`.)
            let stream_server = listen_options.connect().await?;
            crate::store::wakeup::check_logical_server(&stream_server).await?;
            crate::actors::listener::logical::server_role(&stream_server, "database.listen_url")
                .await?;
        }
        Arc::new(crate::store::sealing::notification_key(&client, &schema).await?)
    };
    let db = Database::pool(
        &options,
        config.database.pool_size,
        (config.listen_health() / 2).clamp(Duration::from_millis(500), Duration::from_secs(5)),
    )?
    .with_prepared_statements(config.database.prepared_statements);
    let notifications = match wakeup {
        WakeupMode::Notify => NotificationSource::Dedicated {
            options: Box::new(listen_options),
            channel,
            health: config.listen_health(),
            probe_via: db.clone(),
        },
        WakeupMode::Logical => NotificationSource::Logical(LogicalSource {
            options: Box::new(listen_options),
            schema,
            channel,
            health: config.listen_health(),
            probe_via: db.clone(),
            ephemeral_max_bytes: config.publish.ephemeral_max_bytes,
        }),
    };
    Ok(Backend {
        db: db.clone(),
        notifications,
        seal: Some(seal),
        #[cfg(feature = "embedded")]
        embedded: None,
    })
}

/// Why `publish.schemas_dir` could not be loaded; each names the file.
#[derive(Debug, thiserror::Error)]
pub enum SchemaLoadError {
    #[error("publish.schemas_dir: cannot read {}: {source}", .path.display())]
    Read {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("publish.schemas_dir: {} is not JSON: {source}", .path.display())]
    Json {
        path: std::path::PathBuf,
        source: serde_json::Error,
    },
    #[error("publish.schemas_dir: {}: {source}", .path.display())]
    Schema {
        path: std::path::PathBuf,
        source: eventrelay_publisher::SchemaError,
    },
}

/// Loads `<event type>.json` schemas from a directory.
pub fn load_schemas(dir: &Path) -> Result<SchemaRegistry, SchemaLoadError> {
    let mut registry = SchemaRegistry::new();
    let unreadable = |path: &Path| {
        let path = path.to_path_buf();
        move |source| SchemaLoadError::Read { path, source }
    };
    let entries = std::fs::read_dir(dir).map_err(unreadable(dir))?;
    for entry in entries {
        let path = entry.map_err(unreadable(dir))?.path();
        let Some(event_type) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".json"))
        else {
            continue;
        };
        let text = std::fs::read_to_string(&path).map_err(unreadable(&path))?;
        let schema = serde_json::from_str(&text).map_err(|source| SchemaLoadError::Json {
            path: path.clone(),
            source,
        })?;
        registry
            .register(event_type, &schema)
            .map_err(|source| SchemaLoadError::Schema {
                path: path.clone(),
                source,
            })?;
    }
    Ok(registry)
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
    let backend = open_backend(&config).await?;
    let metrics = Arc::new(Metrics::new());
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
    if let Some(dir) = &config.publish.schemas_dir {
        publisher = publisher.with_registry(load_schemas(Path::new(dir))?);
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
    let (actors_running, mut actors_stopped) = tokio::sync::mpsc::channel::<()>(1);
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
    .start();
    let relay = Counted::new(relay, metrics.actor(ActorKind::Relay).clone());
    // The embedded database only ever notifies.
    let wakeup = match backend.notifications {
        NotificationSource::Logical(_) => WakeupMode::Logical,
        _ => WakeupMode::Notify,
    };
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
    let janitor = actix::spawn(prune_forever(
        db.clone(),
        outbox.clone(),
        Duration::from_secs(config.outbox.retention_secs),
        Duration::from_secs(config.outbox.prune_interval_secs),
        Arc::clone(&metrics),
    ));

    // Disconnections recorded through any relay: denials in force now,
    // then every new one within a second.
    let streams = crate::sse::registry::StreamRegistry::default();
    let disconnections = Disconnections::new(&schema);
    let follower = actix::spawn(follow_disconnections(
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
        actix::spawn(reload_forever(
            reloading,
            live_config,
            Reloaders {
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
    let (open_streams, streams_open, mut streams_ended) = OpenStreams::channel();
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
            header_timeout: Duration::from_secs(config.http.header_timeout_secs),
            shutdown_timeout: HTTP_SHUTDOWN_GRACE,
            opening_per_worker: config.http.opening_per_worker,
            opening_wait: Duration::from_millis(config.http.opening_wait_ms),
            on_connect: crate::sse::peer::on_connect,
        },
    )?;
    let handle = server.handle();
    let stopped = actix::spawn(server);
    shutdown.await;
    tracing::info!("shutting down");
    // The order matters to clients: first nothing new is accepted, then
    // every stream ends with its closing chunk. A client reconnecting at
    // once is refused here and goes to another replica (or retries until
    // the next process listens), instead of landing on this one while it
    // winds down or being reset from its accept queue.
    handle.pause().await;
    // Let the accept thread take the pause before the socket stops
    // listening under it; otherwise it reports a failed accept.
    tokio::task::yield_now().await;
    stop_listening(&listening);
    // Every stream ends cleanly, so its client reconnects (to another
    // replica) at once.
    closing_streams.close_all();
    // Every stream holds a sender; the channel closes when the last ends.
    // Streams whose clients stopped reading get the grace period, no more.
    drop(streams_open);
    let _ = tokio::time::timeout(HTTP_SHUTDOWN_GRACE, streams_ended.recv()).await;
    // Only now is the server stopped. Its workers may drop their
    // connections at once rather than gracefully (a stopped accept thread
    // can end a worker before the worker reads its own stop), so every
    // stream must have written its closing chunk before this point.
    let http_stopping = handle.stop(true);
    // Bounded: the rest of the shutdown (actors, arbiters, the embedded
    // database) must run even if the HTTP server never reports back.
    let http_stopped = async {
        http_stopping.await;
        stopped.await.unwrap_or(Ok(()))
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
    janitor.abort();
    follower.abort();
    trimmer.abort();
    if let Some(reloader) = reloader {
        reloader.abort();
    }
    listener_actor.do_send(StopListener);
    if let Some(dispatcher) = dispatcher {
        dispatcher.addr().do_send(StopDispatcher);
    }
    relay.addr().do_send(StopRelay);
    drop(relay);
    // Each of these actors drops its sender when it has stopped.
    if tokio::time::timeout(HTTP_SHUTDOWN_GRACE, actors_stopped.recv())
        .await
        .is_err()
    {
        tracing::warn!("an actor did not stop within {HTTP_SHUTDOWN_GRACE:?}; stopping the rest");
    }
    for arbiter in arbiters {
        arbiter.stop();
    }
    #[cfg(feature = "embedded")]
    if let Some(embedded) = backend.embedded {
        embedded.shutdown().await;
    }
    result.map_err(ServeError::Http)
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

/// Makes the listening socket refuse new connections now, rather than when
/// the HTTP server's accept thread gets round to closing it: a shut-down
/// read side takes a TCP socket out of the listening state at once (Linux).
fn stop_listening(listening: &std::net::TcpListener) {
    if let Err(error) = socket2::SockRef::from(listening).shutdown(std::net::Shutdown::Read) {
        tracing::debug!(%error, "could not stop listening early; the server stops it");
    }
}

/// What a reload reaches beyond the live configuration.
struct Reloaders {
    db: Database,
    webhooks: WebhookStore,
    dispatcher: Option<Counted<actix::Addr<Dispatcher>>>,
    metrics: Arc<Metrics>,
}

/// Answers reload requests until the service stops.
async fn reload_forever(
    mut reloading: Reloading,
    live: watch::Sender<Arc<Config>>,
    reach: Reloaders,
) {
    while let Some(reply) = reloading.requests.next().await {
        let outcome = reload_once(&reloading, &live, &reach).await;
        match &outcome {
            Ok(report) => {
                reach.metrics.config_reloads_applied.inc();
                tracing::info!(applied = ?report.applied, "configuration reloaded");
                if !report.needs_restart.is_empty() {
                    tracing::warn!(
                        settings = ?report.needs_restart,
                        "changed settings take effect only after a restart"
                    );
                }
            }
            Err(error) => {
                reach.metrics.config_reloads_failed.inc();
                tracing::error!(%error, "configuration reload refused; the one in force stays");
            }
        }
        let _ = reply.send(outcome.map_err(Arc::new));
    }
}

/// Reads, checks and applies the configuration once.
async fn reload_once(
    reloading: &Reloading,
    live: &watch::Sender<Arc<Config>>,
    reach: &Reloaders,
) -> Result<ReloadReport, ReloadError> {
    let new = (reloading.load)()?;
    let current = Arc::clone(&live.borrow());
    let (merged, report) = crate::reload::merge(&current, &new);
    if merged.log.level != current.log.level {
        (reloading.set_log_level)(&merged.log.level).map_err(ReloadError::LogLevel)?;
    }
    if merged.webhooks.subscriptions != current.webhooks.subscriptions {
        // As at start: configured subscriptions are added or updated,
        // never removed (see `eventrelay subscriptions remove-unlisted`).
        let synced: Result<(), StoreError> = async {
            let conn = reach.db.get().await?;
            reach
                .webhooks
                .sync_config_subscriptions(&*conn, &merged.webhooks.subscriptions)
                .await
        }
        .await;
        synced.map_err(ReloadError::Subscriptions)?;
    }
    if merged.webhooks.workers != current.webhooks.workers
        && let Some(dispatcher) = &reach.dispatcher
    {
        dispatcher.do_send(SetWorkers(merged.webhooks.workers));
    }
    live.send_replace(Arc::new(merged));
    Ok(report)
}

/// How often each relay reads the disconnections recorded meanwhile: a
/// disconnection through one relay ends the streams on every other within
/// about this long.
const DISCONNECTIONS_POLL: Duration = Duration::from_millis(500);

/// Reads the disconnections recorded through any relay and applies them to
/// this relay's streams; deletes old ones now and then. Starts with the
/// denials in force, so a relay that starts late refuses the same
/// subscribers as the others.
async fn follow_disconnections(
    db: Database,
    disconnections: Disconnections,
    streams: crate::sse::registry::StreamRegistry,
) {
    let mut read_after = None;
    let mut ticks = tokio::time::interval(DISCONNECTIONS_POLL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut polls: u64 = 0;
    loop {
        ticks.tick().await;
        polls += 1;
        let step: Result<(), crate::store::StoreError> = async {
            let client = db.get().await?;
            match read_after {
                None => {
                    let (denials, newest) = disconnections.at_start(&*client).await?;
                    for denial in &denials {
                        streams.apply(denial);
                    }
                    read_after = Some(newest);
                }
                Some(after) => {
                    for disconnection in disconnections.since(&*client, after).await? {
                        let ended = streams.apply(&disconnection);
                        if ended > 0 {
                            tracing::info!(
                                subscriber = %disconnection.subscriber_id,
                                ended,
                                "streams ended: the subscriber was disconnected through another relay"
                            );
                        }
                        read_after = Some(disconnection.id);
                    }
                }
            }
            // About once an hour.
            if polls.is_multiple_of(7_200) {
                disconnections.prune(&*client).await?;
            }
            Ok(())
        }
        .await;
        if let Err(error) = step {
            tracing::warn!(%error, "reading disconnections failed; will retry");
        }
    }
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

/// The janitor: removes outbox rows older than the retention, on an interval.
async fn prune_forever(
    db: Database,
    outbox: Outbox,
    retention: Duration,
    interval: Duration,
    metrics: Arc<Metrics>,
) {
    let mut ticks = tokio::time::interval(interval);
    loop {
        ticks.tick().await;
        let cutoff = chrono::Utc::now()
            - chrono::Duration::from_std(retention).unwrap_or(chrono::Duration::days(1));
        let pruned: Result<_, crate::store::StoreError> = async {
            let client = db.get().await?;
            outbox.prune_before(&*client, cutoff).await
        }
        .await;
        match pruned {
            Ok(0) => {}
            Ok(rows) => {
                metrics.outbox_rows_pruned.inc_by(rows);
                tracing::info!(rows, "pruned outbox rows past retention");
            }
            Err(error) => tracing::warn!(%error, "outbox pruning failed; will retry"),
        }
    }
}
