//! The embedded database: a PGlite Postgres kept in a local folder, for
//! trying eventrelay and for single-process apps, never for production.
//!
//! PGlite serves one session. The service therefore holds exactly one
//! connection, shared in turn by every part through [`Database::Single`],
//! and LISTENs on that same session: Postgres delivers a session's own
//! notifications to it at COMMIT, so the connection's notification stream
//! feeds the listener directly. No other process can connect while the
//! relay runs; publish through the HTTP API.

use std::path::{Path, PathBuf};

use eventrelay_publisher::Identifier;
use futures_util::StreamExt;
use pglite_oxide::PgliteServer;
use tokio::sync::mpsc;
use tokio_postgres::{AsyncMessage, NoTls};

use super::database::Database;
use super::migrate::{MigrateError, migrate};

/// Why the embedded database did not start.
#[derive(Debug, thiserror::Error)]
pub enum EmbeddedError {
    #[error("cannot start the embedded database in {dir}: {message}")]
    Start { dir: PathBuf, message: String },
    #[error("cannot connect to the embedded database: {0}")]
    Connect(tokio_postgres::Error),
    #[error(transparent)]
    Migrate(#[from] MigrateError),
}

pub struct EmbeddedDatabase {
    server: Option<PgliteServer>,
    /// Drives the one connection; aborting it closes the session, which the
    /// server waits for before it can stop.
    driver: tokio::task::JoinHandle<()>,
    handles: Option<(Database, mpsc::UnboundedReceiver<String>)>,
    url: String,
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
            message: e.to_string(),
        })?;
        let path = dir.clone();
        let server =
            tokio::task::spawn_blocking(move || PgliteServer::builder().path(path).start())
                .await
                .map_err(|e| EmbeddedError::Start {
                    dir: dir.clone(),
                    message: e.to_string(),
                })?
                .map_err(|e| EmbeddedError::Start {
                    dir: dir.clone(),
                    message: format!("{e:#}"),
                })?;
        let url = server.database_url();
        let (mut client, mut connection) = tokio_postgres::connect(&url, NoTls)
            .await
            .map_err(EmbeddedError::Connect)?;
        let (sender, notifications) = mpsc::unbounded_channel();
        let driver = tokio::spawn(async move {
            let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(message) = messages.next().await {
                match message {
                    Ok(AsyncMessage::Notification(n)) => {
                        if sender.send(n.payload().to_owned()).is_err() {
                            return;
                        }
                    }
                    Ok(_) => {}
                    Err(error) => {
                        tracing::error!(%error, "the embedded database connection failed");
                        return;
                    }
                }
            }
        });
        migrate(&mut client, schema, channel).await?;
        client
            .batch_execute(&format!("LISTEN {channel}"))
            .await
            .map_err(EmbeddedError::Connect)?;
        tracing::info!(dir = %dir.display(), "embedded database ready (single session; not for production)");
        Ok(EmbeddedDatabase {
            server: Some(server),
            driver,
            handles: Some((Database::single(client), notifications)),
            url,
        })
    }

    /// The shared connection and the notification feed (taken once).
    pub fn take_handles(&mut self) -> (Database, mpsc::UnboundedReceiver<String>) {
        self.handles.take().expect("handles are taken once")
    }

    /// Where the embedded server listens (only one session at a time).
    pub fn url(&self) -> &str {
        &self.url
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
