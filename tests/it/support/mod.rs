//! Test harness: every test gets its own schema and notification channel on
//! the real Postgres named by `DATABASE_URL` (default: the local server), so
//! tests run in parallel without seeing each other. The schema is dropped
//! when the `TestDb` goes out of scope.
#![allow(dead_code)]

pub mod certs;
pub mod cluster;
pub mod flaky_receiver;
pub mod freezer;
pub mod pgbouncer;
pub mod process;
pub mod raw_http;
pub mod receiver;
pub mod server;
pub mod sockets;
pub mod tls;

use std::time::Duration;

use eventrelay::publisher::{EventEnvelope, Identifier, NewEvent, PgExecutor, Publisher};
use eventrelay::store::{WakeupMode, migrate, migrate_for};
use futures_util::StreamExt;
use tokio::sync::mpsc;
use tokio_postgres::{AsyncMessage, Client, NoTls};

/// Runs one test body in both wake-up modes. Given `async fn name(mode:
/// WakeupMode)`, `test_in_both_wakeup_modes!(name)` makes the tests
/// `name::notify` and `name::logical` (the latter on a throwaway cluster
/// with `wal_level = logical`, see [`TestDb::for_mode`]); tokio's test
/// options may follow the name.
macro_rules! test_in_both_wakeup_modes {
    ($body:ident $(, $($option:tt)+)?) => {
        mod $body {
            #[tokio::test$(($($option)+))?]
            async fn notify() {
                super::$body(eventrelay::store::WakeupMode::Notify).await;
            }

            #[tokio::test$(($($option)+))?]
            async fn logical() {
                super::$body(eventrelay::store::WakeupMode::Logical).await;
            }
        }
    };
}
pub(crate) use test_in_both_wakeup_modes;

pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";
/// Longest any test waits for something that should happen.
pub const DEADLINE: Duration = Duration::from_secs(10);

/// Asks `check` every 20 ms until it answers `Some`, and returns that
/// answer; fails the test after [`DEADLINE`], naming `what` never happened.
/// The one way tests wait for a condition: no test sleeps and hopes.
pub async fn eventually<T>(what: &str, check: impl AsyncFnMut() -> Option<T>) -> T {
    eventually_within(what, DEADLINE, check).await
}

/// [`eventually`] with a deadline of `limit`: for what waits on something
/// slower than [`DEADLINE`] by design, such as a failover.
pub async fn eventually_within<T>(
    what: &str,
    limit: Duration,
    mut check: impl AsyncFnMut() -> Option<T>,
) -> T {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Some(answer) = check().await {
            return answer;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until the relay at `base` says on `/readyz` that its database and
/// listener are up.
pub async fn wait_ready(base: &str) {
    let client = reqwest::Client::new();
    eventually("the relay becomes ready", async || {
        let response = client.get(format!("{base}/readyz")).send().await.ok()?;
        (response.status() == 200).then_some(())
    })
    .await;
}

/// A metric's value from the relay's `/metrics`. A labelled series not
/// yet created reads 0 (its family is declared, with no such child); a
/// name whose family the relay does not declare at all fails the test,
/// so a renamed metric cannot pass as a zero.
pub async fn metric(base: &str, name: &str) -> f64 {
    metric_with(&reqwest::Client::new(), base, name).await
}

/// Like [`metric`], through `client` (one that trusts a test CA, say).
pub async fn metric_with(client: &reqwest::Client, base: &str, name: &str) -> f64 {
    let text = client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    series_value(&text, name)
}

/// `name`'s value in a Prometheus text exposition (see [`metric`]).
pub fn series_value(exposition: &str, name: &str) -> f64 {
    if let Some(value) = exposition.lines().find_map(|line| {
        let (key, value) = line.rsplit_once(' ')?;
        (key == name).then(|| value.parse().ok())?
    }) {
        return value;
    }
    let series = name.split('{').next().unwrap_or(name);
    let declared = exposition.lines().any(|line| {
        let Some(family) = line
            .strip_prefix("# TYPE ")
            .and_then(|rest| rest.split(' ').next())
        else {
            return false;
        };
        series.strip_prefix(family).is_some_and(|suffix| {
            [
                "", "_total", "_bucket", "_sum", "_count", "_created", "_info",
            ]
            .contains(&suffix)
        })
    });
    assert!(
        declared,
        "the relay declares no metric {series} (asked for {name})"
    );
    0.0
}

pub fn database_url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| DEFAULT_DATABASE_URL.to_owned())
}

pub struct TestDb {
    pub url: String,
    pub schema: Identifier,
    pub channel: Identifier,
    /// The wake-up mode the schema is migrated for; test relays run in it.
    pub wakeup: WakeupMode,
}

impl TestDb {
    /// A fresh, migrated schema with its own channel.
    pub async fn new() -> Self {
        Self::new_on(&database_url()).await
    }

    /// A fresh, migrated schema on the server at `base` (a Postgres URL).
    pub async fn new_on(base: &str) -> Self {
        let db = Self::unmigrated_on(base);
        let mut client = db.connect().await;
        migrate(&mut client, &db.schema, &db.channel)
            .await
            .expect("migrations apply");
        db
    }

    /// A fresh schema migrated for `mode`: on the shared server for
    /// notify, on a throwaway cluster with `wal_level = logical` (returned,
    /// to be kept alive as long as the schema) for logical.
    pub async fn for_mode(mode: WakeupMode) -> (Self, Option<cluster::Cluster>) {
        match mode {
            WakeupMode::Notify => (Self::new().await, None),
            WakeupMode::Logical => {
                let Some(cluster) = cluster::Cluster::start_logical() else {
                    panic!(
                        "no Postgres server binaries (initdb, pg_ctl): install them or set PG_BINDIR"
                    );
                };
                let db = Self::logical_on(&cluster.url()).await;
                (db, Some(cluster))
            }
        }
    }

    /// A fresh schema migrated for the logical wake-up mode on the server
    /// at `base`, which must have `wal_level = logical`.
    pub async fn logical_on(base: &str) -> Self {
        let mut db = Self::unmigrated_on(base);
        db.wakeup = WakeupMode::Logical;
        let mut client = db.connect().await;
        migrate_for(&mut client, &db.schema, &db.channel, WakeupMode::Logical)
            .await
            .expect("migrations apply");
        db
    }

    /// Fresh names, nothing created yet.
    pub fn unmigrated() -> Self {
        Self::unmigrated_on(&database_url())
    }

    fn unmigrated_on(base: &str) -> Self {
        let suffix = uuid::Uuid::new_v4().simple().to_string();
        let schema = Identifier::new(&format!("ert_{}", &suffix[..20])).unwrap();
        // Every connection a test opens is tagged with its schema name, so
        // cleanup can end sessions the test left behind.
        let separator = if base.contains('?') { '&' } else { '?' };
        TestDb {
            url: format!("{base}{separator}application_name={schema}"),
            channel: Identifier::new(&format!("erc_{}", &suffix[..20])).unwrap(),
            schema,
            wakeup: WakeupMode::Notify,
        }
    }

    /// The publisher crate's handle on this schema.
    pub fn publisher(&self) -> Publisher {
        Publisher::new(self.schema.as_str()).unwrap()
    }

    /// Emits one event with the publisher crate, in its own transaction.
    pub async fn emit(&self, event: NewEvent) -> EventEnvelope {
        let client = self.connect().await;
        self.emit_in(&client, event).await
    }

    /// Emits one event with the publisher crate in the caller's connection
    /// or transaction.
    pub async fn emit_in(&self, client: &impl PgExecutor, event: NewEvent) -> EventEnvelope {
        self.publisher().emit(client, event).await.unwrap()
    }

    /// Emits one durable event through the SQL function `emit()`, as an
    /// application in another language would; answers its seq.
    pub async fn emit_sql(&self, event_type: &str, scope: &str, data: serde_json::Value) -> i64 {
        let client = self.connect().await;
        client
            .query_one(
                &format!("SELECT {}.emit($1, $2, $3)", self.schema),
                &[&event_type, &scope, &data],
            )
            .await
            .unwrap()
            .get(0)
    }

    /// The first column of every row `sql` returns, in order; `{schema}`
    /// in it names this test's schema.
    pub async fn column<T>(&self, sql: &str) -> Vec<T>
    where
        T: for<'a> tokio_postgres::types::FromSql<'a>,
    {
        let sql = sql.replace("{schema}", self.schema.as_str());
        self.connect()
            .await
            .query(&sql, &[])
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
            .iter()
            .map(|row| row.get(0))
            .collect()
    }

    pub async fn connect(&self) -> Client {
        eventrelay::connect(&self.url).await.unwrap_or_else(|e| {
            panic!(
                "cannot reach Postgres at {} ({e}); set DATABASE_URL or run scripts/test",
                self.url
            )
        })
    }

    /// A separate connection LISTENing on this test's channel. Relays'
    /// horizon marks (`{"k":"hz",...}`) are left out: they come every
    /// quarter of a second from every relay running.
    pub async fn listen(&self) -> Notifications {
        let (client, mut connection) = tokio_postgres::connect(&self.url, NoTls).await.unwrap();
        let (sender, receiver) = mpsc::unbounded_channel();
        let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        // Payloads are opened as a relay opens them; what does not open
        // (the sentinels) is passed on as it came.
        let key = self.seal_key().await;
        tokio::spawn(async move {
            while let Some(Ok(message)) = messages.next().await {
                if let AsyncMessage::Notification(n) = message {
                    let payload = match key.as_ref().map(|k| k.open(n.payload())) {
                        Some(Ok((_, opened))) => opened,
                        _ => n.payload().to_owned(),
                    };
                    if payload.starts_with(r#"{"k":"hz","#) {
                        continue;
                    }
                    if sender.send(payload).is_err() {
                        break;
                    }
                }
            }
        });
        client
            .batch_execute(&format!("LISTEN {}", self.channel))
            .await
            .unwrap();
        Notifications {
            receiver,
            _client: client,
            sentinel: 0,
        }
    }

    /// The schema's notification key (`None` for a schema not sealed).
    pub async fn seal_key(&self) -> Option<eventrelay::wire::SealKey> {
        let client = self.connect().await;
        eventrelay::store::sealing::notification_key(&client, &self.schema)
            .await
            .ok()
    }

    /// Sends `payload` on the channel sealed by the schema's own `seal`,
    /// as eventrelay's functions send what they write from rows: what only
    /// the owner and the relay's role can do.
    pub async fn notify_sealed(&self, payload: &str) {
        self.connect()
            .await
            .execute(
                &format!("SELECT pg_notify($1, {}.seal('P', $2))", self.schema),
                &[&self.channel.as_str(), &payload],
            )
            .await
            .unwrap();
    }

    /// Sends `payload` on the channel as it is, as any role that can log in
    /// may.
    pub async fn notify_raw(&self, payload: &str) {
        self.connect()
            .await
            .execute(
                "SELECT pg_notify($1, $2)",
                &[&self.channel.as_str(), &payload],
            )
            .await
            .unwrap();
    }

    /// Number of rows in this test's outbox.
    pub async fn outbox_count(&self) -> i64 {
        let client = self.connect().await;
        client
            .query_one(&format!("SELECT count(*) FROM {}.outbox", self.schema), &[])
            .await
            .unwrap()
            .get(0)
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let url = self.url.clone();
        let schema = self.schema.clone();
        // End the test's sessions first (a connection whose task cannot run
        // now may still hold locks).
        block_on_own_thread(async move {
            if let Ok((client, connection)) = tokio_postgres::connect(&url, NoTls).await {
                tokio::spawn(connection);
                let _ = client
                    .execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                             WHERE application_name = $1 AND pid <> pg_backend_pid()",
                        &[&schema.as_str()],
                    )
                    .await;
                let _ = client
                    .batch_execute(&format!(
                        "SET lock_timeout = '10s'; DROP SCHEMA IF EXISTS {schema} CASCADE"
                    ))
                    .await;
            }
        });
    }
}

/// Runs `work` to its end on a thread with a runtime of its own: for
/// cleanup in `Drop`, which runs inside the test's runtime, blocked while
/// this waits.
pub fn block_on_own_thread(work: impl Future<Output = ()> + Send + 'static) {
    let _ = std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(work)
    })
    .join();
}

/// Notifications received by a LISTEN connection, in commit order.
pub struct Notifications {
    receiver: mpsc::UnboundedReceiver<String>,
    _client: Client,
    sentinel: u64,
}

impl Notifications {
    /// The next payload, or a panic after the deadline.
    pub async fn next(&mut self) -> String {
        tokio::time::timeout(DEADLINE, self.receiver.recv())
            .await
            .expect("a notification arrives before the deadline")
            .expect("listener still running")
    }

    /// Everything delivered so far: sends a sentinel notification from
    /// another connection and collects what arrives before it. Postgres
    /// delivers notifications in commit order, so anything committed before
    /// the sentinel is in the result, and nothing needs a sleep.
    pub async fn drain(&mut self, db: &TestDb) -> Vec<String> {
        self.sentinel += 1;
        let marker = format!("sentinel-{}", self.sentinel);
        db.connect()
            .await
            .execute("SELECT pg_notify($1, $2)", &[&db.channel.as_str(), &marker])
            .await
            .unwrap();
        let mut seen = Vec::new();
        loop {
            let payload = self.next().await;
            if payload == marker {
                return seen;
            }
            seen.push(payload);
        }
    }
}
