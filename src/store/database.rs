//! Where the service gets its Postgres connections: a pool for a real
//! server, or one shared connection for the embedded single-session
//! database. Either hands out something that derefs to a
//! `tokio_postgres::Client`, so the rest of the service does not care which.

use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime, Timeouts};
use eventrelay_publisher::{ConnectError, PgConnectOptions};
use tokio::sync::{Mutex, OwnedMutexGuard};
use tokio_postgres::Client;

/// Why no connection could be had.
#[derive(Debug, thiserror::Error)]
pub enum DatabaseError {
    #[error(transparent)]
    Connect(#[from] ConnectError),
    #[error("cannot build the connection pool: {0}")]
    Build(#[source] deadpool_postgres::BuildError),
    #[error("no database connection available: {0}")]
    Unavailable(#[source] deadpool_postgres::PoolError),
}

#[derive(Clone)]
pub enum Database {
    /// A pool of connections to a Postgres server.
    Pool(Pool),
    /// The one session of an embedded database, taken in turn.
    Single(Arc<Mutex<Client>>),
}

/// A connection checked out of a [`Database`].
pub enum Connection {
    /// Boxed: a pooled client is far larger than a guard.
    Pooled(Box<deadpool_postgres::Client>),
    Single(OwnedMutexGuard<Client>),
}

impl Database {
    /// A pool of `size` connections. Each is checked with a query before
    /// it is handed out again, and one that cannot answer within
    /// `check_within` is dead (a flow a NAT dropped answers never): it is
    /// replaced instead of failing its next user.
    pub fn pool(
        options: &PgConnectOptions,
        size: usize,
        check_within: Duration,
    ) -> Result<Self, DatabaseError> {
        let manager = Manager::from_config(
            options.config().clone(),
            options.tls()?,
            ManagerConfig {
                recycling_method: RecyclingMethod::Verified,
            },
        );
        Pool::builder(manager)
            .max_size(size)
            .runtime(Runtime::Tokio1)
            .timeouts(Timeouts {
                wait: None,
                create: options.config().get_connect_timeout().copied(),
                recycle: Some(check_within),
            })
            .build()
            .map(Database::Pool)
            .map_err(DatabaseError::Build)
    }

    /// Shares one connection; callers take turns.
    pub fn single(client: Client) -> Self {
        Database::Single(Arc::new(Mutex::new(client)))
    }

    pub async fn get(&self) -> Result<Connection, DatabaseError> {
        match self {
            Database::Pool(pool) => pool
                .get()
                .await
                .map(|client| Connection::Pooled(Box::new(client)))
                .map_err(DatabaseError::Unavailable),
            Database::Single(client) => {
                Ok(Connection::Single(Arc::clone(client).lock_owned().await))
            }
        }
    }
}

impl Deref for Connection {
    type Target = Client;

    fn deref(&self) -> &Client {
        match self {
            Connection::Pooled(client) => client,
            Connection::Single(client) => client,
        }
    }
}

impl DerefMut for Connection {
    fn deref_mut(&mut self) -> &mut Client {
        match self {
            Connection::Pooled(client) => client,
            Connection::Single(client) => client,
        }
    }
}
