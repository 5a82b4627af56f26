//! The logical wake-up mode's ear: a replication stream that hands the
//! relay every committed outbox row, and every ephemeral event sent as a
//! logical message, in commit order.
//!
//! Each (re)connect opens a replication session, creates a **temporary**
//! slot of its own on it (so a relay that dies holds no WAL: the server
//! drops the slot with the session), and starts `pgoutput` in binary mode
//! on the schema's publication. Then, like a LISTEN reconnect, it tells the
//! relay to re-read every active scope from its watermark, since what
//! committed before the slot existed is not in the stream. The server
//! sends a transaction only once it has committed, so its rows are handed
//! over as soon as they are read (as a run, when several are already
//! waiting), and the live path reads nothing back from the outbox. After
//! each commit the slot is told how far the relay got, and the server may
//! recycle the WAL.
//!
//! A stream can die without an error (a dropped flow). After `health` of
//! silence the stream sends itself a probe, a non-transactional logical
//! message through the pool, and expects it back within half of `health`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use eventrelay_publisher::backoff::Backoff;
use eventrelay_publisher::{Identifier, PgConnectOptions, RootCert, SslMode};
use futures_util::FutureExt;
use pgwire_replication::{
    PgWireError, ReplicationClient, ReplicationConfig, ReplicationEvent, TlsConfig,
};
use tokio::time::Instant;
use tokio_postgres::config::Host;

use super::forward::{Targets, supervised_forward};
use crate::actors::relay::Decoded;
use crate::metrics::ReasonLabel;
use crate::store::pgoutput::{Change, OutboxDecoder, PgOutputError};
use crate::store::wakeup::publication_name;
use crate::store::{Database, StoredEvent};

const BACKOFF_BASE: Duration = Duration::from_millis(100);
const BACKOFF_CAP: Duration = Duration::from_secs(10);
/// The prefix of the liveness probes relays send themselves. Not a
/// channel name (those are identifiers, without dots), so never an event.
const PROBE_PREFIX: &str = "eventrelay.probe";
/// When a slot still being created is worth a log line.
const SLOT_NOTICE: Duration = Duration::from_secs(10);
/// How long a slot may take to create before the attempt starts over.
const SLOT_PATIENCE: Duration = Duration::from_secs(300);
/// Microseconds from the Unix epoch to Postgres's (2000-01-01).
const POSTGRES_EPOCH_MICROS: i64 = 946_684_800_000_000;

/// Where the stream comes from, and what it needs around it.
pub struct LogicalSource {
    /// Boxed: the settings are large.
    pub options: Box<PgConnectOptions>,
    pub schema: Identifier,
    /// The prefix of ephemeral events' logical messages.
    pub channel: Identifier,
    pub health: Duration,
    /// The pool, through which the liveness probe is sent.
    pub probe_via: Database,
    /// The largest ephemeral payload accepted from the stream.
    pub ephemeral_max_bytes: usize,
    /// The largest replication message read; a larger one ends the stream
    /// before it is buffered.
    pub max_message_bytes: usize,
}

/// Why one stream ended.
#[derive(Debug, thiserror::Error)]
enum StreamError {
    #[error("replication stream: {0}")]
    Replication(#[from] PgWireError),
    #[error("no answer from the server within {0:?}")]
    Timeout(Duration),
    #[error("cannot read a change: {0}")]
    Decode(#[from] PgOutputError),
    #[error("no probe came back within {0:?}; the stream is dead")]
    Dead(Duration),
    #[error("could not send the liveness probe through the pool; retrying")]
    ProbeNotSent,
    #[error("the relay failed on an ephemeral event; reconnecting")]
    Failed,
    #[error("the server ended the replication stream")]
    Ended,
    #[error("no server of the URL takes the replication stream: {0}")]
    NoServer(String),
    #[error(transparent)]
    Unsuitable(#[from] UnsuitableServer),
}

/// A server the replication stream must not read from, and why. Checked
/// at start (the relay refuses to start) and at every reconnect.
#[derive(Debug, thiserror::Error)]
pub enum UnsuitableServer {
    #[error(
        "{server} is a standby running Postgres {version}; decoding on a standby needs \
         Postgres 16 or later: point database.listen_url at the primary, or at a newer standby"
    )]
    StandbyTooOld { server: String, version: String },
    #[error(
        "{server} is a standby with hot_standby_feedback off: the primary could then remove \
         catalog rows the relay's slot still needs, and the standby would invalidate the slot \
         mid-stream. Set hot_standby_feedback = on on the standby"
    )]
    NoFeedback { server: String },
    #[error("cannot ask {server} what it is: {reason}")]
    Unreachable { server: String, reason: String },
}

/// What the stream's server is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerRole {
    Primary,
    /// A physical standby (Postgres 16+, with `hot_standby_feedback`): the
    /// slot waits for the primary to log the transactions running.
    Standby,
}

/// Streams until the actor that runs this stops.
pub(super) async fn stream_forever(
    source: LogicalSource,
    targets: Targets,
    connected: &AtomicBool,
) {
    let patience = (source.health / 2).max(Duration::from_millis(500));
    let mut backoff = Backoff::new(BACKOFF_BASE, BACKOFF_CAP.min(patience * 2));
    let mut first = true;
    // sslmode=prefer: TLS when the server offers it, as the pool does.
    let mut plain = source.options.ssl_mode() == SslMode::Disable;
    loop {
        let link = Link {
            source: &source,
            targets: &targets,
            connected,
        };
        match link.stream_once(first, plain).await {
            Ok(()) => {}
            Err(StreamError::Replication(PgWireError::Tls(error)))
                if source.options.ssl_mode() == SslMode::Prefer && !plain =>
            {
                tracing::info!(%error, "the server offers no TLS; the replication stream goes without (sslmode=prefer)");
                plain = true;
                continue;
            }
            Err(StreamError::Replication(PgWireError::MessageTooLarge {
                payload_bytes,
                limit_bytes,
            })) => {
                // Nothing of it was read. The new stream's slot starts past
                // it, and the reconnect re-reads every scope from the
                // outbox: an outbox row that large is delivered from there.
                tracing::warn!(
                    payload_bytes,
                    limit_bytes,
                    "refused a replication message larger than \
                     database.replication_max_message_bytes; reconnecting past it"
                );
                targets
                    .metrics
                    .notifications_rejected
                    .get_or_create(&ReasonLabel {
                        reason: "too_large",
                    })
                    .inc();
            }
            Err(error) => {
                tracing::warn!(%error, "replication stream failed; reconnecting");
            }
        }
        if connected.swap(false, Ordering::Relaxed) {
            backoff.reset();
            first = false;
        }
        tokio::time::sleep(backoff.next_delay()).await;
    }
}

/// What one stream's life needs.
struct Link<'a> {
    source: &'a LogicalSource,
    targets: &'a Targets,
    connected: &'a AtomicBool,
}

/// One change of the transaction being read.
enum Pending {
    Row(Box<StoredEvent>),
    Message(Bytes),
}

/// The transaction being read: its changes in order, and whether it queued
/// webhook deliveries.
#[derive(Default)]
struct OpenTransaction {
    /// Between a begin and its commit.
    begun: bool,
    changes: Vec<Pending>,
    deliveries_queued: bool,
}

impl Link<'_> {
    async fn stream_once(&self, first: bool, plain: bool) -> Result<(), StreamError> {
        let Link {
            source,
            targets,
            connected,
        } = *self;
        let metrics = &targets.metrics;
        let patience = (source.health / 2).max(Duration::from_millis(500));
        let slot = format!("eventrelay_{}", uuid::Uuid::new_v4().simple());
        let mut client = open_stream(source, &slot, plain, patience).await?;

        connected.store(true, Ordering::Relaxed);
        if !first {
            metrics.replication_reconnects.inc();
        }
        tracing::info!(%slot, publication = %publication_name(&source.schema), "reading committed events from the replication stream");
        targets.connected();

        let channel = source.channel.as_str();
        let mut decoder = OutboxDecoder::new();
        let mut open = OpenTransaction::default();
        let mut probe: Option<(String, Instant)> = None;
        // One timer for the whole stream, moved on only when it fires,
        // rather than a timer made and dropped for every message.
        let mut heard_at = Instant::now();
        let silence = tokio::time::sleep_until(heard_at + source.health);
        tokio::pin!(silence);
        loop {
            // pgoutput (protocol 1) sends a transaction only once it has
            // committed, so its rows go to the relay as soon as nothing
            // more of it is already waiting, not only at its commit
            // message, which the server sends after them.
            let ready = if open.changes.is_empty() {
                None
            } else {
                client.recv().now_or_never()
            };
            let event = match ready {
                Some(event) => event?,
                None => {
                    if !open.changes.is_empty() {
                        self.hand_over(std::mem::take(&mut open.changes), false)?;
                    }
                    tokio::select! {
                        event = client.recv() => event?,
                        () = &mut silence => {
                            let now = Instant::now();
                            if probe.is_some() {
                                metrics.database_connections_dead.inc();
                                return Err(StreamError::Dead(patience));
                            }
                            if heard_at + source.health > now {
                                silence.as_mut().reset(heard_at + source.health);
                                continue;
                            }
                            let token = send_probe(&source.probe_via, patience).await?;
                            probe = Some((token, now + patience));
                            silence.as_mut().reset(now + patience);
                            continue;
                        }
                    }
                }
            };
            heard_at = Instant::now();
            let Some(event) = event else {
                return Err(StreamError::Ended);
            };
            // Anything from the server proves the stream alive, except
            // that a probe in flight must come back itself.
            match event {
                ReplicationEvent::Begin { .. } => {
                    open = OpenTransaction {
                        begun: true,
                        ..OpenTransaction::default()
                    }
                }
                ReplicationEvent::XLogData {
                    wal_start,
                    wal_end,
                    data,
                    ..
                } => {
                    metrics
                        .replication_lag_bytes
                        .set(wal_end.as_u64().saturating_sub(wal_start.as_u64()) as i64);
                    match decoder.decode(&data)? {
                        Change::Insert(row) => {
                            if let Some(stored) = row.into_stored() {
                                open.changes.push(Pending::Row(Box::new(stored)));
                            }
                        }
                        Change::DeliveryQueued => open.deliveries_queued = true,
                        Change::Other => {}
                    }
                }
                ReplicationEvent::Message {
                    transactional,
                    prefix,
                    content,
                    ..
                } => {
                    if prefix == channel {
                        if transactional {
                            open.changes.push(Pending::Message(content));
                        } else if !self.forward_ephemeral(&content) {
                            return Err(StreamError::Failed);
                        }
                    } else if prefix == PROBE_PREFIX
                        && probe
                            .as_ref()
                            .is_some_and(|(token, _)| content.as_ref() == token.as_bytes())
                    {
                        probe = None;
                    }
                }
                ReplicationEvent::Commit {
                    end_lsn,
                    commit_time_micros,
                    ..
                } => {
                    let transaction = std::mem::take(&mut open);
                    self.hand_over(transaction.changes, transaction.deliveries_queued)?;
                    let committed_unix = commit_time_micros.saturating_add(POSTGRES_EPOCH_MICROS);
                    let now = chrono::Utc::now().timestamp_micros();
                    metrics
                        .replication_lag_seconds
                        .set(now.saturating_sub(committed_unix).max(0) as f64 / 1e6);
                    client.update_applied_lsn(end_lsn);
                }
                ReplicationEvent::KeepAlive { wal_end, .. } => {
                    // Everything before `wal_end` has been sent; with no
                    // transaction open, none of it is still unread here.
                    if !open.begun {
                        metrics.replication_lag_bytes.set(0);
                        client.update_applied_lsn(wal_end);
                    }
                }
                ReplicationEvent::StoppedAt { .. } => return Err(StreamError::Ended),
            }
        }
    }

    /// Hands changes of a committed transaction to the relay, in order:
    /// each run of rows as one message, each ephemeral payload as it came,
    /// and whether the transaction queued webhook deliveries (known at its
    /// commit) with the last message.
    fn hand_over(&self, changes: Vec<Pending>, deliveries_queued: bool) -> Result<(), StreamError> {
        let mut rows = Vec::new();
        for change in changes {
            match change {
                Pending::Row(row) => rows.push(*row),
                Pending::Message(content) => {
                    self.send_rows(std::mem::take(&mut rows), false);
                    if !self.forward_ephemeral(&content) {
                        return Err(StreamError::Failed);
                    }
                }
            }
        }
        self.send_rows(rows, deliveries_queued);
        Ok(())
    }

    fn send_rows(&self, rows: Vec<StoredEvent>, deliveries_queued: bool) {
        if rows.is_empty() && !deliveries_queued {
            return;
        }
        if deliveries_queued {
            self.targets.deliveries_queued();
        }
        if !rows.is_empty() {
            self.targets.relay.do_send(Decoded {
                rows,
                heard_at: std::time::Instant::now(),
            });
        }
    }

    /// An ephemeral event's payload, decoded as a notification's would be.
    fn forward_ephemeral(&self, content: &[u8]) -> bool {
        match std::str::from_utf8(content) {
            Ok(payload) => {
                supervised_forward(payload, self.source.ephemeral_max_bytes, self.targets)
            }
            Err(_) => {
                self.targets.metrics.notifications_malformed.inc();
                tracing::warn!("dropping an ephemeral message that is not UTF-8");
                true
            }
        }
    }
}

/// Connects, creates this relay's temporary slot on the connection, and
/// starts streaming from it.
async fn open_stream(
    source: &LogicalSource,
    slot: &str,
    plain: bool,
    patience: Duration,
) -> Result<ReplicationClient, StreamError> {
    let (server, role) = choose_server(&source.options, patience).await?;
    let config = replication_config(source, &server, slot, plain);
    let mut client = within(patience * 2, ReplicationClient::connect_gated(config)).await?;
    // Creating a slot waits for the transactions already running to end.
    // Giving up early would only start another WAL sender waiting behind the
    // same transactions, so this waits long, and says why.
    let sql =
        format!("CREATE_REPLICATION_SLOT {slot} TEMPORARY LOGICAL pgoutput NOEXPORT_SNAPSHOT");
    {
        let create = client.simple_query(&sql);
        tokio::pin!(create);
        // On a standby the slot also waits for the primary to log which
        // transactions are running, which it does on its own only every
        // 15 s; asking for it through the pool (on the primary) saves that.
        // Without the right to ask, the slot simply waits.
        let create = async {
            if role == ServerRole::Standby {
                let mut nudges = tokio::time::interval(Duration::from_millis(250));
                loop {
                    tokio::select! {
                        created = &mut create => return created,
                        _ = nudges.tick() => log_standby_snapshot(&source.probe_via).await,
                    }
                }
            }
            create.await
        };
        tokio::pin!(create);
        match tokio::time::timeout(SLOT_NOTICE, &mut create).await {
            Ok(created) => created?,
            Err(_) => {
                tracing::warn!(
                    %slot,
                    "the replication slot is waiting for transactions already running to end; \
                     a long transaction delays the stream (nothing is missed meanwhile)"
                );
                within(SLOT_PATIENCE - SLOT_NOTICE, create).await?
            }
        };
    }
    client.start().await?;
    within(patience * 2, client.wait_started()).await?;
    Ok(client)
}

/// The server to stream from. The replication client connects to one
/// host, so with several in the URL (a primary and its standbys) each is
/// tried in order, as libpq would, and the first to accept a connection
/// with the URL's `target_session_attrs` is taken: with `read-write`, the
/// primary, and after a failover the promoted standby, like every pooled
/// connection.
///
/// The server taken is then checked (see [`server_role`]): a standby must
/// be able to decode, and keep its slot.
async fn choose_server(
    options: &PgConnectOptions,
    patience: Duration,
) -> Result<(PgConnectOptions, ServerRole), StreamError> {
    let mut refusals = Vec::new();
    for one in options.each_host() {
        let host = server_name(&one);
        match tokio::time::timeout(patience * 2, one.connect()).await {
            Ok(Ok(client)) => {
                let role = server_role(&client, &host).await?;
                return Ok((one, role));
            }
            Ok(Err(error)) => refusals.push(format!("{host}: {error}")),
            Err(_) => refusals.push(format!("{host}: no answer within {:?}", patience * 2)),
        }
    }
    Err(StreamError::NoServer(refusals.join("; ")))
}

/// Whether `client`'s server is a primary or a standby the stream can read
/// from (Postgres 16 or later, `hot_standby_feedback` on).
pub async fn server_role(
    client: &tokio_postgres::Client,
    server: &str,
) -> Result<ServerRole, UnsuitableServer> {
    let row = client
        .query_one(
            "SELECT pg_is_in_recovery(), current_setting('server_version_num')::int,
                    current_setting('server_version'), current_setting('hot_standby_feedback')::bool",
            &[],
        )
        .await
        .map_err(|e| UnsuitableServer::Unreachable {
            server: server.to_owned(),
            reason: eventrelay_publisher::connect::describe(&e),
        })?;
    let (standby, version_num, version, feedback): (bool, i32, String, bool) =
        (row.get(0), row.get(1), row.get(2), row.get(3));
    match (standby, version_num >= 160_000, feedback) {
        (false, _, _) => Ok(ServerRole::Primary),
        (true, false, _) => Err(UnsuitableServer::StandbyTooOld {
            server: server.to_owned(),
            version,
        }),
        (true, true, false) => Err(UnsuitableServer::NoFeedback {
            server: server.to_owned(),
        }),
        (true, true, true) => Ok(ServerRole::Standby),
    }
}

/// Asks the primary to log the transactions running now, which a slot
/// being created on a standby waits for.
async fn log_standby_snapshot(pool: &Database) {
    if let Ok(client) = pool.get().await {
        let _ = client
            .execute("SELECT pg_log_standby_snapshot()", &[])
            .await;
    }
}

/// `host:port` (or the socket directory) of a one-host configuration.
fn server_name(server: &PgConnectOptions) -> String {
    let pg = server.config();
    let port = pg.get_ports().first().copied().unwrap_or(5432);
    match pg.get_hosts().first() {
        Some(Host::Tcp(host)) => format!("{host}:{port}"),
        #[cfg(unix)]
        Some(Host::Unix(dir)) => format!("{}:{port}", dir.display()),
        None => format!("localhost:{port}"),
    }
}

/// Sends a probe through the pool; returns its token.
async fn send_probe(pool: &Database, patience: Duration) -> Result<String, StreamError> {
    let token = uuid::Uuid::new_v4().simple().to_string();
    let sent = async {
        let client = pool.get().await.ok()?;
        client
            .execute(
                "SELECT pg_logical_emit_message(false, $1, $2)",
                &[&PROBE_PREFIX, &token],
            )
            .await
            .ok()
    };
    match tokio::time::timeout(patience, sent).await {
        Ok(Some(_)) => Ok(token),
        _ => Err(StreamError::ProbeNotSent),
    }
}

async fn within<T>(
    limit: Duration,
    work: impl std::future::Future<Output = Result<T, PgWireError>>,
) -> Result<T, StreamError> {
    tokio::time::timeout(limit, work)
        .await
        .map_err(|_| StreamError::Timeout(limit))?
        .map_err(StreamError::from)
}

/// The replication client's settings, from the same URL as every other
/// connection (`server`: the one host [`choose_server`] took): host, port,
/// credentials, database and TLS.
fn replication_config(
    source: &LogicalSource,
    server: &PgConnectOptions,
    slot: &str,
    plain: bool,
) -> ReplicationConfig {
    let options = server;
    let pg = options.config();
    let host = match pg.get_hosts().first() {
        Some(Host::Tcp(host)) => host.clone(),
        #[cfg(unix)]
        Some(Host::Unix(dir)) => dir.display().to_string(),
        None => "localhost".to_owned(),
    };
    let user = pg.get_user().unwrap_or("postgres").to_owned();
    let password = pg
        .get_password()
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .unwrap_or_default();
    let database = pg.get_dbname().unwrap_or(&user).to_owned();
    let mut config = ReplicationConfig::new(
        host,
        user,
        password,
        database,
        slot,
        publication_name(&source.schema),
    );
    config.port = pg.get_ports().first().copied().unwrap_or(5432);
    config.tls = tls_config(options, plain);
    config.binary = true;
    // How often the slot hears how far the relay got: the WAL it may free.
    config.status_interval = Duration::from_secs(1);
    config.idle_wakeup_interval = source.health;
    config.max_message_size = source.max_message_bytes;
    config.application_name = Some(pg.get_application_name().unwrap_or("eventrelay").to_owned());
    config
}

/// libpq's `sslmode` meanings, as the rest of the service applies them.
/// `sslrootcert=system` trusts the Mozilla roots the client carries.
fn tls_config(options: &PgConnectOptions, plain: bool) -> TlsConfig {
    let ca = match options.root_cert() {
        Some(RootCert::File(path)) => Some(path.clone()),
        _ => None,
    };
    let has_roots = options.root_cert().is_some();
    let tls = match options.ssl_mode() {
        _ if plain => TlsConfig::disabled(),
        SslMode::Disable => TlsConfig::disabled(),
        // `require` with a root certificate checks the chain, as libpq's.
        SslMode::Prefer | SslMode::Require if has_roots => TlsConfig::verify_ca(ca),
        SslMode::Prefer | SslMode::Require => TlsConfig::require(),
        SslMode::VerifyCa => TlsConfig::verify_ca(ca),
        SslMode::VerifyFull => TlsConfig::verify_full(ca),
    };
    match options.client_cert() {
        Some((cert, key)) if !plain => tls.with_client_cert(cert, key),
        _ => tls,
    }
}
