//! Where the service gets its Postgres connections: a pool for a real
//! server, or one shared connection for the embedded single-session
//! database. Either hands out something that derefs to a
//! `tokio_postgres::Client`, so the rest of the service does not care which.
//! Pooled connections may also keep the statements they run prepared (see
//! [`super::statements`]).

use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use std::time::Duration;

use deadpool::managed::{Metrics, RecycleError, RecycleResult};
use deadpool_postgres::{ClientWrapper, ManagerConfig, RecyclingMethod, Runtime, Timeouts};
use eventrelay_publisher::{ConnectError, PgConnectOptions};
use tokio::sync::{Mutex, OwnedMutexGuard};
use tokio_postgres::Client;

use super::statements::PreparedStatements;

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

/// The pool's connections.
pub type Pool = deadpool::managed::Pool<CheckedManager>;
/// A connection checked out of the pool.
pub type PooledClient = deadpool::managed::Object<CheckedManager>;

/// How long after its last checkout a connection is handed out again
/// without a check query: it answered moments ago, and a flow a NAT drops
/// is dropped after minutes of silence, not milliseconds.
const RECENTLY_USED: Duration = Duration::from_secs(1);

/// deadpool-postgres's manager, with a check query only for connections
/// that have not been used for a while. A busy pool hands the same
/// connections out hundreds of times a second; checking each of them
/// costs a round trip per checkout on the publish and read paths.
pub struct CheckedManager {
    inner: deadpool_postgres::Manager,
}

impl deadpool::managed::Manager for CheckedManager {
    type Type = ClientWrapper;
    type Error = tokio_postgres::Error;

    async fn create(&self) -> Result<ClientWrapper, tokio_postgres::Error> {
        self.inner.create().await
    }

    async fn recycle(
        &self,
        client: &mut ClientWrapper,
        metrics: &Metrics,
    ) -> RecycleResult<tokio_postgres::Error> {
        if metrics.last_used() < RECENTLY_USED {
            if client.is_closed() {
                return Err(RecycleError::message("Connection closed"));
            }
            return Ok(());
        }
        self.inner.recycle(client, metrics).await
    }

    fn detach(&self, client: &mut ClientWrapper) {
        self.inner.detach(client);
    }
}

#[derive(Clone)]
pub enum Database {
    /// A pool of connections to a Postgres server, where to record how
    /// long each checkout waited, and whether its connections keep the
    /// statements they run prepared.
    Pool(
        Pool,
        Option<prometheus_client::metrics::histogram::Histogram>,
        PreparedStatements,
    ),
    /// The one session of an embedded database, taken in turn.
    Single(Arc<Mutex<Client>>),
}

/// A snapshot of a [`Database`]'s connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolStatus {
    pub size: usize,
    pub in_use: usize,
    pub waiting: usize,
}

/// A connection checked out of a [`Database`].
pub enum Connection {
    /// Boxed: a pooled client is far larger than a guard. With the pool's
    /// switch for prepared statements.
    Pooled(Box<PooledClient>, PreparedStatements),
    Single(OwnedMutexGuard<Client>),
}

impl Database {
    /// A pool of `size` connections. Each that has not been used for a
    /// second is checked with a query before it is handed out again, and
    /// one that cannot answer within `check_within` is dead (a flow a NAT
    /// dropped answers never): it is replaced instead of failing its next
    /// user.
    pub fn pool(
        options: &PgConnectOptions,
        size: usize,
        check_within: Duration,
    ) -> Result<Self, DatabaseError> {
        let inner = deadpool_postgres::Manager::from_config(
            options.config().clone(),
            options.tls()?,
            ManagerConfig {
                recycling_method: RecyclingMethod::Verified,
            },
        );
        Pool::builder(CheckedManager { inner })
            .max_size(size)
            // The most recently returned connection goes out first, so a
            // light load keeps reusing a few connections (checked-free) and
            // the rest age until a check finds out whether they still work.
            .queue_mode(deadpool_postgres::QueueMode::Lifo)
            .runtime(Runtime::Tokio1)
            .timeouts(Timeouts {
                wait: None,
                create: options.config().get_connect_timeout().copied(),
                recycle: Some(check_within),
            })
            .build()
            .map(|pool| Database::Pool(pool, None, PreparedStatements::new(false)))
            .map_err(DatabaseError::Build)
    }

    /// Records every checkout's wait in `waits`.
    pub fn with_wait_histogram(
        self,
        waits: prometheus_client::metrics::histogram::Histogram,
    ) -> Self {
        match self {
            Database::Pool(pool, _, prepared) => Database::Pool(pool, Some(waits), prepared),
            single => single,
        }
    }

    /// Keeps the statements each pooled connection runs prepared, so
    /// Postgres parses and plans each of them once per connection instead
    /// of on every call. Off behind a transaction-mode pooler that does not
    /// track prepared statements: the next transaction may run on another
    /// server connection, where the statement does not exist. Left on
    /// there, it turns itself off at the first such failure.
    pub fn with_prepared_statements(self, prepared: bool) -> Self {
        match self {
            Database::Pool(pool, waits, _) => {
                Database::Pool(pool, waits, PreparedStatements::new(prepared))
            }
            single => single,
        }
    }

    /// The pool's size, connections in use, and tasks waiting for one. The
    /// embedded database's single connection counts as a pool of one.
    pub fn status(&self) -> PoolStatus {
        match self {
            Database::Pool(pool, _, _) => {
                let status = pool.status();
                PoolStatus {
                    size: status.size,
                    in_use: status.size.saturating_sub(status.available),
                    waiting: status.waiting,
                }
            }
            Database::Single(client) => PoolStatus {
                size: 1,
                in_use: usize::from(client.try_lock().is_err()),
                waiting: 0,
            },
        }
    }

    /// Shares one connection; callers take turns.
    pub fn single(client: Client) -> Self {
        Database::Single(Arc::new(Mutex::new(client)))
    }

    pub async fn get(&self) -> Result<Connection, DatabaseError> {
        match self {
            Database::Pool(pool, waits, prepared) => {
                let started = std::time::Instant::now();
                let client = pool.get().await;
                if let Some(waits) = waits {
                    waits.observe(started.elapsed().as_secs_f64());
                }
                client
                    .map(|client| Connection::Pooled(Box::new(client), prepared.clone()))
                    .map_err(DatabaseError::Unavailable)
            }
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
            Connection::Pooled(client, _) => client,
            Connection::Single(client) => client,
        }
    }
}

impl DerefMut for Connection {
    fn deref_mut(&mut self) -> &mut Client {
        match self {
            Connection::Pooled(client, _) => client,
            Connection::Single(client) => client,
        }
    }
}
