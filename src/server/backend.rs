//! Where the service's data and notifications come from: the configured
//! Postgres (checked, migrated, its notification key read) or the
//! embedded database.

use std::sync::Arc;
use std::time::Duration;

use crate::actors::listener::{LogicalSource, NotificationSource};
use crate::config::Config;
use crate::store::{Database, WakeupMode, check_schema, migrate_for};

use super::ServeError;

/// The database the service runs on, and where its notifications come from.
pub(super) struct Backend {
    pub db: Database,
    pub notifications: NotificationSource,
    /// The key the schema's notifications are sealed with; `None` for the
    /// embedded database, whose are not.
    pub seal: Option<Arc<eventrelay_wire::SealKey>>,
    #[cfg(feature = "embedded")]
    pub embedded: Option<crate::store::embedded::EmbeddedDatabase>,
}

/// Connects to the configured Postgres, or starts the embedded one.
pub(super) async fn open_backend(config: &Config) -> Result<Backend, ServeError> {
    let schema = config.schema();
    let channel = config.channel();
    let Some(url) = config.database.url.clone() else {
        #[cfg(feature = "embedded")]
        {
            let mut embedded = crate::store::embedded::EmbeddedDatabase::start(
                std::path::Path::new(&config.database.embedded_dir),
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
            max_message_bytes: config.database.replication_max_message_bytes,
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
