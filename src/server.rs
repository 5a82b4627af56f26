//! Starting and stopping the service: the pool, the migrations, the actors,
//! the janitor and the HTTP server, wired from one `Config` value.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use actix::{Actor, Arbiter};
use actix_web::{App, HttpServer, web};
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use eventrelay_publisher::{Publisher, SchemaRegistry};
use tokio_postgres::NoTls;

use crate::actors::relay::StopRelay;
use crate::actors::{Listener, Relay};
use crate::auth::SubscriberResolver;
use crate::config::Config;
use crate::http::{AppState, routes};
use crate::limiter::ConnectionLimiter;
use crate::metrics::Metrics;
use crate::store::{MigrateError, Outbox, migrate};

/// Why the service could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("database.url is not set (or DATABASE_URL): the relay needs a Postgres to serve from")]
    NoDatabase,
    #[error("cannot connect to Postgres: {0}")]
    Connect(tokio_postgres::Error),
    #[error("cannot build the connection pool: {0}")]
    Pool(String),
    #[error(transparent)]
    Migrate(#[from] MigrateError),
    #[error("publish.schemas_dir: {0}")]
    Schemas(String),
    #[error("HTTP server failed: {0}")]
    Http(#[from] std::io::Error),
}

/// Builds the Postgres pool the relay, the replays and the publish API share.
pub fn build_pool(url: &str, size: usize) -> Result<Pool, ServeError> {
    let pg_config: tokio_postgres::Config = url
        .parse()
        .map_err(|e: tokio_postgres::Error| ServeError::Pool(e.to_string()))?;
    let manager = Manager::from_config(
        pg_config,
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(size)
        .build()
        .map_err(|e| ServeError::Pool(e.to_string()))
}

/// Loads `<event type>.json` schemas from a directory.
pub fn load_schemas(dir: &Path) -> Result<SchemaRegistry, ServeError> {
    let mut registry = SchemaRegistry::new();
    let entries = std::fs::read_dir(dir)
        .map_err(|e| ServeError::Schemas(format!("cannot read {}: {e}", dir.display())))?;
    for entry in entries {
        let path = entry
            .map_err(|e| ServeError::Schemas(e.to_string()))?
            .path();
        let Some(event_type) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".json"))
        else {
            continue;
        };
        let text = std::fs::read_to_string(&path)
            .map_err(|e| ServeError::Schemas(format!("{}: {e}", path.display())))?;
        let schema = serde_json::from_str(&text)
            .map_err(|e| ServeError::Schemas(format!("{}: {e}", path.display())))?;
        registry
            .register(event_type, &schema)
            .map_err(|e| ServeError::Schemas(e.to_string()))?;
    }
    Ok(registry)
}

/// Runs the service on `listener` until `shutdown` resolves. Must be called
/// inside an actix system (`#[actix_web::main]` or `actix_web::rt::System`).
pub async fn run(
    config: Config,
    resolver: Arc<dyn SubscriberResolver>,
    listener: std::net::TcpListener,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let config = Arc::new(config);
    let url = config.database.url.clone().ok_or(ServeError::NoDatabase)?;
    let schema = config.schema();
    if config.database.migrate {
        let mut client = crate::connect(&url).await.map_err(ServeError::Connect)?;
        let report = migrate(&mut client, &schema, &config.channel()).await?;
        if !report.applied.is_empty() {
            tracing::info!(applied = ?report.applied, %schema, "migrations applied");
        }
    }
    let pool = build_pool(&url, config.database.pool_size)?;
    let mut publisher = Publisher::new(schema.as_str()).expect("validated schema name");
    if let Some(dir) = &config.publish.schemas_dir {
        publisher = publisher.with_registry(load_schemas(Path::new(dir))?);
    }
    let metrics = Arc::new(Metrics::new());
    let outbox = Outbox::new(&schema);

    let arbiters: Vec<Arbiter> = (0..config.hub.arbiters).map(|_| Arbiter::new()).collect();
    let tail_events = config.hub.tail_events;
    let tail_bytes = config.hub.tail_bytes;
    let relay = Relay::new(
        pool.clone(),
        outbox.clone(),
        arbiters.iter().map(Arbiter::handle).collect(),
        Arc::new(move || tail_events),
        Arc::new(move || tail_bytes),
        Arc::clone(&metrics),
    )
    .start();
    let listener_connected = Arc::new(AtomicBool::new(false));
    let listen_url = config.listen_url().unwrap_or(&url).to_owned();
    let listener_actor = Listener::new(
        listen_url,
        config.channel(),
        relay.clone(),
        Arc::clone(&listener_connected),
        Arc::clone(&metrics),
    )
    .start();
    let janitor = actix::spawn(prune_forever(
        pool.clone(),
        outbox.clone(),
        Duration::from_secs(config.outbox.retention_secs),
        Duration::from_secs(config.outbox.prune_interval_secs),
        Arc::clone(&metrics),
    ));

    let state = web::Data::new(AppState {
        config: Arc::clone(&config),
        relay: relay.clone(),
        resolver,
        limiter: ConnectionLimiter::new(config.sse.max_connections_per_subscriber),
        pool,
        outbox,
        publisher,
        metrics,
        listener_connected,
    });
    let mut server = HttpServer::new(move || App::new().app_data(state.clone()).configure(routes))
        .disable_signals()
        .shutdown_timeout(2);
    if config.http.workers > 0 {
        server = server.workers(config.http.workers);
    }
    let server = server.listen(listener)?.run();
    let handle = server.handle();
    let stopped = actix::spawn(server);
    shutdown.await;
    tracing::info!("shutting down");
    handle.stop(true).await;
    let result = stopped.await.unwrap_or(Ok(()));
    janitor.abort();
    drop(listener_actor);
    relay.do_send(StopRelay);
    for arbiter in arbiters {
        arbiter.stop();
    }
    result.map_err(ServeError::Http)
}

/// The janitor: removes outbox rows older than the retention, on an interval.
async fn prune_forever(
    pool: Pool,
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
        let pruned = match pool.get().await {
            Ok(client) => outbox
                .prune_before(&client, cutoff)
                .await
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
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
