//! The embedded database: a PGlite Postgres kept in a local folder, for
//! trying eventrelay and for single-process apps, never for production.
//!
//! PGlite serves one session. The service therefore holds exactly one
//! connection, shared in turn by every part through [`Database::Single`],
//! and LISTENs on that same session: Postgres delivers a session's own
//! notifications to it at COMMIT, so the connection's notification stream
//! feeds the listener directly, through the shared message pump
//! ([`eventrelay_publisher::listen::pump`]). No other process can connect
//! while the relay runs; publish through the HTTP API.

use std::error::Error;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use eventrelay_publisher::{Identifier, listen};
use pglite_oxide::PgliteServer;
use tokio::sync::mpsc;
use tokio_postgres::{NoTls, Notification};

use super::database::Database;
use super::migrate::{MigrateError, Sealing, migrate_with};
use super::wakeup::WakeupMode;

/// Why the embedded database did not start.
#[derive(Debug, thiserror::Error)]
pub enum EmbeddedError {
    #[error("cannot start the embedded database in {dir}: {}", chain(source.as_ref()))]
    Start {
        dir: PathBuf,
        /// PGlite reports through `anyhow`, whose error is boxed to keep its
        /// chain of causes.
        #[source]
        source: Box<dyn Error + Send + Sync>,
    },
    #[error("cannot connect to the embedded database: {0}")]
    Connect(#[source] tokio_postgres::Error),
    #[error(transparent)]
    Migrate(#[from] MigrateError),
}

pub struct EmbeddedDatabase {
    server: Option<PgliteServer>,
    /// Drives the one connection; aborting it closes the session, which the
    /// server waits for before it can stop.
    driver: tokio::task::JoinHandle<()>,
    db: Database,
    feed: Option<mpsc::UnboundedReceiver<String>>,
}

/// An error and its causes on one line, as `anyhow` shows them with `{:#}`.
fn chain(error: &(dyn Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

impl EmbeddedDatabase {
    /// Starts (or reopens) the database in `dir`, applies the migrations and
    /// LISTENs on `channel`.
    pub async fn start(
        dir: &Path,
        schema: &Identifier,
        channel: &Identifier,
    ) -> Result<Self, EmbeddedError> {
        let dir = dir.to_path_buf();
        std::fs::create_dir_all(&dir).map_err(|e| EmbeddedError::Start {
            dir: dir.clone(),
            source: Box::new(e),
        })?;
        let path = dir.clone();
        let server =
            tokio::task::spawn_blocking(move || PgliteServer::builder().path(path).start())
                .await
                .map_err(|e| EmbeddedError::Start {
                    dir: dir.clone(),
                    source: Box::new(e),
                })?
                .map_err(|e| EmbeddedError::Start {
                    dir: dir.clone(),
                    source: e.into(),
                })?;
        let url = server.database_url();
        let (mut client, connection) = tokio_postgres::connect(&url, NoTls)
            .await
            .map_err(EmbeddedError::Connect)?;
        let (sender, notifications) = mpsc::unbounded_channel();
        // The shared pump drives the session; a feed nobody reads any more
        // stops it, which closes the session.
        let driver = tokio::spawn(async move {
            let deliver =
                |notification: Notification| match sender.send(notification.payload().to_owned()) {
                    Ok(()) => ControlFlow::Continue(()),
                    Err(_) => ControlFlow::Break(()),
                };
            if let Err(error) = listen::pump(connection, deliver).await {
                tracing::error!(%error, "the embedded database connection failed");
            }
        });
        // One in-process session: nothing else can listen or notify, so
        // notifications are not sealed.
        migrate_with(
            &mut client,
            schema,
            channel,
            WakeupMode::Notify,
            Sealing::Open,
        )
        .await?;
        client
            .batch_execute(&format!("LISTEN {channel}"))
            .await
            .map_err(EmbeddedError::Connect)?;
        tracing::info!(dir = %dir.display(), "embedded database ready (single session; not for production)");
        Ok(EmbeddedDatabase {
            server: Some(server),
            driver,
            db: Database::single(client),
            feed: Some(notifications),
        })
    }

    /// The shared connection and the notification feed. The feed has one
    /// reader: a later call gets a feed that has already ended.
    pub fn take_handles(&mut self) -> (Database, mpsc::UnboundedReceiver<String>) {
        let feed = self
            .feed
            .take()
            .unwrap_or_else(|| mpsc::unbounded_channel().1);
        (self.db.clone(), feed)
    }

    /// Stops the database, flushing it to its folder.
    pub async fn shutdown(mut self) {
        self.driver.abort();
        let _ = (&mut self.driver).await;
        if let Some(server) = self.server.take() {
            match tokio::task::spawn_blocking(move || server.shutdown()).await {
                Ok(Ok(())) => {}
                Ok(Err(error)) => {
                    tracing::warn!(error = %format!("{error:#}"), "embedded database shutdown failed")
                }
                Err(error) => tracing::warn!(%error, "embedded database shutdown failed"),
            }
        }
    }
}
