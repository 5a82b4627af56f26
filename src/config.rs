//! Service configuration: defaults < TOML file < `EVENTRELAY_*` environment,
//! validated once at start with errors that name the setting.
//!
//! Nested keys use a double underscore in the environment:
//! `EVENTRELAY_SSE__HEARTBEAT_SECS=10` sets `sse.heartbeat_secs`.
//! `DATABASE_URL` is honoured as `database.url` when the latter is unset.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use eventrelay_publisher::{
    ConnectError, DEFAULT_SCHEMA, Identifier, PgConnectOptions, TcpSettings,
};
use eventrelay_wire::MAX_NOTIFY_PAYLOAD_BYTES;
use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::{Deserialize, Serialize};

pub use crate::store::WakeupMode;

pub mod origins;

/// The largest `publish.ephemeral_max_bytes` accepted: a logical message
/// has no size limit of its own, but every relay holds a transaction's
/// messages in memory until its commit is read.
pub const MAX_LOGICAL_MESSAGE_BYTES: usize = 1024 * 1024;

use crate::auth::AuthConfig;
pub use crate::presence::PresenceConfig;
use crate::secret::{DatabaseUrl, Secret};
pub use crate::telemetry::TelemetryConfig;
pub use crate::webhooks::WebhooksConfig;

/// Everything the service reads at start.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub database: DatabaseConfig,
    pub http: HttpConfig,
    pub sse: SseConfig,
    pub hub: HubConfig,
    /// How subscribers authenticate; see `docs/src/auth.md`.
    #[serde(skip_serializing)]
    pub auth: Option<AuthConfig>,
    pub publish: PublishConfig,
    pub outbox: OutboxConfig,
    pub webhooks: WebhooksConfig,
    pub admin: AdminConfig,
    pub log: LogConfig,
    /// Traces over OTLP; see `docs/src/operations.md`.
    pub telemetry: TelemetryConfig,
    /// The customer portal; see `docs/src/portal.md`.
    pub portal: PortalConfig,
    /// Who is connected, per scope; see `docs/src/subscribing.md`.
    pub presence: PresenceConfig,
    /// The throwaway HMAC secret of development mode (no `[auth]`), which
    /// lets the inspector mint tokens. Never read from configuration.
    #[serde(skip)]
    pub development_secret: Option<Secret>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    /// Bearer token for `/v1/admin/*`; the admin API is off without one.
    pub token: Option<Secret>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DatabaseConfig {
    /// Postgres URL for the pool (reads, publish API, migrations).
    pub url: Option<DatabaseUrl>,
    /// URL for the dedicated LISTEN connection; defaults to `url`. Point it
    /// past any transaction-mode pooler: such poolers drop LISTEN.
    pub listen_url: Option<DatabaseUrl>,
    pub schema: String,
    pub channel: String,
    pub pool_size: usize,
    /// Apply migrations at start.
    pub migrate: bool,
    /// Data folder of the embedded database, used when no `url` is set.
    pub embedded_dir: String,
    /// After this much silence the LISTEN connection must answer a query
    /// within half of it, or it is replaced and every active scope re-read:
    /// a flow that a NAT or load balancer dropped never reports an error.
    pub listen_health_secs: u64,
    /// Idle seconds before TCP keepalive probes start, on every connection.
    pub tcp_keepalive_secs: u64,
    /// Seconds sent data may stay unacknowledged before the kernel drops
    /// the connection (`TCP_USER_TIMEOUT`), on every connection.
    pub tcp_user_timeout_secs: u64,
    /// How relays learn of commits: `notify` (a pointer NOTIFY at commit)
    /// or `logical` (decoding the WAL on a temporary replication slot, so
    /// emitting takes no cluster-wide lock). Recorded in the schema by
    /// `migrate`; every relay of a schema runs in the recorded mode.
    pub wakeup: WakeupMode,
    /// Keep the pool's statements prepared on each connection, so Postgres
    /// parses and plans each once per connection rather than on every
    /// call. Turn off behind a transaction-mode pooler that does not track
    /// prepared statements (PgBouncer before 1.21, or without
    /// `max_prepared_statements`).
    pub prepared_statements: bool,
    /// The largest message the logical replication stream may hand the
    /// relay, in bytes. A larger one is refused by its declared length
    /// before any of it is read: the stream is replaced on a new slot (past
    /// it) and every active scope re-read from the outbox, so an outbox row
    /// that large still arrives while a huge logical message from any role
    /// that can log in costs the relay no memory.
    pub replication_max_message_bytes: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    pub bind: SocketAddr,
    /// Worker threads for HTTP; 0 means one per core.
    pub workers: usize,
    /// Largest accepted request body (publish API), in bytes.
    pub max_body_bytes: usize,
    /// Serve the inspector page at `/inspector` (a development aid).
    pub inspector: bool,
    /// Serve the operator console at `/console` while an admin token is
    /// configured. The page itself holds nothing secret: it signs in with
    /// the admin token and acts through the admin API.
    pub console: bool,
    /// Origins whose pages may read `/v1/events` from a browser (CORS):
    /// exact origins such as `https://app.example.com`, subdomain patterns
    /// such as `https://*.example.com`, or `*` alone. Empty: same-origin only.
    pub allowed_origins: Vec<String>,
    /// Let allowed origins send cookies (`Access-Control-Allow-Credentials`),
    /// which forward auth behind a session cookie needs. Refused with `*`:
    /// any site could then read a user's events with the user's cookies.
    pub allow_credentials: bool,
    /// Also answer cross-origin preflights for `POST /v1/events`, for pages
    /// that publish with the publish token themselves.
    pub cors_publish: bool,
    /// Serve HTTPS (and HTTP/2) directly instead of plain HTTP/1.1.
    pub tls: TlsConfig,
    /// How long a connection has to send a request's headers: a new
    /// connection its first bytes from its start (closed) and its headers
    /// from those bytes (answered 408 and closed), a kept-alive one from
    /// the end of its previous response (closed). A client that
    /// never finishes them holds a socket for no longer than this. Generous
    /// enough for the moments after a deploy, when every client reconnects
    /// at once and the relay reads thousands of requests together.
    pub header_timeout_secs: u64,
    /// How long a request's body may take to arrive once the relay starts
    /// reading it (publish API, admin API, the inspector's token form);
    /// a slower one is answered 408 `request_timeout` and its connection
    /// closed.
    pub body_timeout_secs: u64,
    /// How long a response in flight may go without the client taking any
    /// of it: a socket that accepts no byte, or (HTTP/2) a stream whose
    /// flow-control window stays shut. Past it the connection is closed,
    /// event streams included (a reader that stopped is a slow consumer).
    pub write_timeout_secs: u64,
    /// Connections the kernel queues for the relay to accept (the `listen`
    /// backlog, capped by `net.core.somaxconn`). A reconnect storm arrives
    /// faster than any accept loop; a short queue drops the excess, and
    /// those clients wait a second or more to retry their handshake.
    pub listen_backlog: u32,
    /// Plain connections each HTTP worker reads a first request of at
    /// once; the rest wait, their bytes in the kernel's socket buffers.
    /// Each request being read costs about 8 KiB while it is served, and
    /// what thousands of them free together stays resident between the
    /// streams that remain, so a surge is taken a few hundred at a time.
    pub opening_per_worker: usize,
    /// How long a connection waits for one of those places before it is
    /// read anyway: a few clients that trickle their headers can hold the
    /// places, and must not hold up everyone else for longer than this.
    pub opening_wait_ms: u64,
}

/// `[http.tls]`: both files or neither. The files are read at start and
/// again whenever they change, so a renewed certificate needs no restart.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TlsConfig {
    /// PEM certificate chain, the server's certificate first.
    pub cert_file: Option<std::path::PathBuf>,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1) matching the certificate.
    pub key_file: Option<std::path::PathBuf>,
}

impl TlsConfig {
    /// Whether TLS is configured (validation makes it both files or neither).
    pub fn enabled(&self) -> bool {
        self.cert_file.is_some() && self.key_file.is_some()
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SseConfig {
    pub heartbeat_secs: u64,
    /// Streams end after this long (minus up to 10% jitter), so credentials
    /// are re-checked on reconnect and replay is exercised routinely.
    pub max_age_secs: u64,
    /// A stream whose credentials expire sends `event: reauth` this long
    /// before they do (at most half their remaining lifetime at connect),
    /// so its client opens the next stream in time; 0 sends none.
    pub reauth_lead_secs: u64,
    pub max_connections_per_subscriber: usize,
    /// The most scopes one stream may carry (`?scope=` repeated, or every
    /// scope the credentials grant); at most 64.
    pub max_scopes_per_stream: usize,
    pub retry_ms: u64,
    /// How far before `Last-Event-ID` replay starts, to catch events that
    /// committed late with a lower seq.
    pub replay_lookback: i64,
    /// Frames a subscriber may have queued before it counts as too slow and
    /// is disconnected.
    pub queue_capacity: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HubConfig {
    /// Threads the per-scope hubs are spread over.
    pub arbiters: usize,
    pub tail_events: usize,
    pub tail_bytes: usize,
    /// Encoded bytes all tails together may hold; past it the least
    /// recently used tails are emptied and their readers use the outbox.
    pub tails_max_bytes: usize,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PublishConfig {
    /// Bearer token for `POST /v1/events`; the endpoint is off without one.
    pub token: Option<Secret>,
    /// Directory of `<event type>.json` JSON Schemas; when set, only those
    /// types may be published, and their data must match.
    pub schemas_dir: Option<String>,
    /// Most events in one publish request.
    pub max_batch: usize,
    /// Concurrent publish requests share one transaction: while requests
    /// arrive concurrently, the committer waits this long for more before
    /// writing a group. 0 turns group commit off (one transaction per
    /// request).
    pub group_commit_ms: u64,
    /// Most events written in one group.
    pub group_max_events: usize,
    /// Most groups written at once, each on its own database connection
    /// (never more than `database.pool_size`).
    pub group_commit_writers: usize,
    /// Largest encoded ephemeral event. NOTIFY refuses 8000 bytes or more
    /// and sealing takes a quarter of that, so above 5934 needs
    /// `database.wakeup = "logical"`, where ephemeral events travel as
    /// logical replication messages.
    pub ephemeral_max_bytes: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OutboxConfig {
    pub retention_secs: u64,
    pub prune_interval_secs: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PortalConfig {
    /// The origins whose pages may frame `/portal` (its CSP's
    /// `frame-ancestors`), such as `https://app.example.com`; empty: none.
    pub allowed_frame_origins: Vec<String>,
    /// The longest session the admin API mints.
    pub max_session_secs: u32,
    /// The relay's address as customers' browsers reach it, for the `url`
    /// of a minted session; unset: the address the minting request used.
    pub base_url: Option<String>,
}

impl Default for PortalConfig {
    fn default() -> Self {
        PortalConfig {
            allowed_frame_origins: Vec::new(),
            max_session_secs: 86_400,
            base_url: None,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// `text` or `json`.
    pub format: String,
    /// A tracing filter such as `info` or `eventrelay=debug`.
    pub level: String,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            database: DatabaseConfig::default(),
            http: HttpConfig::default(),
            sse: SseConfig::default(),
            hub: HubConfig::default(),
            auth: None,
            publish: PublishConfig {
                max_batch: 100,
                group_commit_ms: 2,
                group_max_events: 2000,
                group_commit_writers: 2,
                ephemeral_max_bytes: MAX_NOTIFY_PAYLOAD_BYTES,
                ..PublishConfig::default()
            },
            outbox: OutboxConfig::default(),
            webhooks: WebhooksConfig::default(),
            admin: AdminConfig::default(),
            log: LogConfig::default(),
            telemetry: TelemetryConfig::default(),
            portal: PortalConfig::default(),
            presence: PresenceConfig::default(),
            development_secret: None,
        }
    }
}

impl Default for DatabaseConfig {
    fn default() -> Self {
        DatabaseConfig {
            url: None,
            listen_url: None,
            listen_health_secs: 10,
            tcp_keepalive_secs: 15,
            tcp_user_timeout_secs: 30,
            schema: DEFAULT_SCHEMA.to_owned(),
            channel: "eventrelay".to_owned(),
            pool_size: 16,
            migrate: true,
            embedded_dir: ".eventrelay/pgdata".to_owned(),
            wakeup: WakeupMode::Notify,
            prepared_statements: true,
            replication_max_message_bytes: 16 * 1024 * 1024,
        }
    }
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            bind: SocketAddr::from(([127, 0, 0, 1], 8080)),
            workers: 0,
            max_body_bytes: 1024 * 1024,
            inspector: true,
            console: true,
            allowed_origins: Vec::new(),
            allow_credentials: true,
            cors_publish: false,
            tls: TlsConfig::default(),
            header_timeout_secs: 10,
            body_timeout_secs: 10,
            write_timeout_secs: 30,
            listen_backlog: 4096,
            opening_per_worker: 256,
            opening_wait_ms: 2000,
        }
    }
}

impl Default for SseConfig {
    fn default() -> Self {
        SseConfig {
            heartbeat_secs: 20,
            max_age_secs: 300,
            reauth_lead_secs: 30,
            max_connections_per_subscriber: 5,
            max_scopes_per_stream: 16,
            retry_ms: 3000,
            replay_lookback: 100,
            queue_capacity: 1024,
        }
    }
}

impl Default for HubConfig {
    fn default() -> Self {
        HubConfig {
            arbiters: 2,
            tail_events: 128,
            tail_bytes: 4 * 1024 * 1024,
            tails_max_bytes: 256 * 1024 * 1024,
        }
    }
}

impl Default for OutboxConfig {
    fn default() -> Self {
        OutboxConfig {
            retention_secs: 24 * 60 * 60,
            prune_interval_secs: 60,
        }
    }
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            format: "text".to_owned(),
            level: "info".to_owned(),
        }
    }
}

/// Why the configuration cannot be used; every variant names the setting.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config file {} does not exist", .0.display())]
    NoFile(std::path::PathBuf),
    #[error("cannot read configuration: {0}")]
    Load(#[source] Box<figment::Error>),
    #[error("{setting}: {message}")]
    Invalid {
        setting: &'static str,
        message: String,
    },
}

fn invalid(setting: &'static str, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        setting,
        message: message.into(),
    }
}

impl Config {
    /// Loads defaults, then `file` (if given), then the environment.
    pub fn load(file: Option<&Path>) -> Result<Config, ConfigError> {
        let mut figment = Figment::from(Serialized::defaults(Config::default()));
        if let Some(file) = file {
            if !file.exists() {
                return Err(ConfigError::NoFile(file.to_path_buf()));
            }
            figment = figment.merge(Toml::file(file));
        }
        // EVENTRELAY_CONFIG names the file itself; it is not a setting.
        figment = figment.merge(Env::prefixed("EVENTRELAY_").ignore(&["config"]).split("__"));
        let mut config: Config = figment
            .extract()
            .map_err(|e| ConfigError::Load(Box::new(e)))?;
        if config.database.url.is_none() {
            config.database.url = std::env::var("DATABASE_URL").ok().map(DatabaseUrl::from);
        }
        config.validate()?;
        Ok(config)
    }

    /// Checks every value that could otherwise fail later, or silently.
    /// Whether subscribers' tokens are signed with a local throwaway secret:
    /// no `[auth]`, or `auth.mode = "development"`.
    pub fn development_mode(&self) -> bool {
        matches!(self.auth, None | Some(AuthConfig::Development(_)))
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        // Without [auth], anyone who reaches the relay can mint a token for
        // any scope: fine on a laptop, never by accident on a network.
        if self.auth.is_none() && self.database.url.is_some() && !self.http.bind.ip().is_loopback()
        {
            return Err(invalid(
                "auth",
                format!(
                    "no [auth] is configured and http.bind = {} is not a loopback address: \
                     configure [auth] (mode = \"jwt\" or \"forward\"), bind to 127.0.0.1, or \
                     ask for development mode by name with auth.mode = \"development\" \
                     (anyone who reaches the relay can then mint tokens for any scope)",
                    self.http.bind
                ),
            ));
        }
        Identifier::new(&self.database.schema)
            .map_err(|e| invalid("database.schema", e.to_string()))?;
        Identifier::new(&self.database.channel)
            .map_err(|e| invalid("database.channel", e.to_string()))?;
        if self.database.pool_size == 0 {
            return Err(invalid("database.pool_size", "must be at least 1"));
        }
        for (setting, url) in [
            ("database.url", &self.database.url),
            ("database.listen_url", &self.database.listen_url),
        ] {
            if let Some(url) = url {
                // Building the TLS configuration reads every certificate
                // file named, so a missing or unreadable one fails here.
                PgConnectOptions::parse(url)
                    .and_then(|options| options.tls().map(drop))
                    .map_err(|e| invalid(setting, e.to_string()))?;
            }
        }
        if self.database.wakeup == WakeupMode::Logical && self.database.url.is_none() {
            return Err(invalid(
                "database.wakeup",
                "logical needs database.url: the embedded database has no replication; use notify",
            ));
        }
        let ephemeral_max = self.publish.ephemeral_max_bytes;
        if ephemeral_max == 0 || ephemeral_max > MAX_LOGICAL_MESSAGE_BYTES {
            return Err(invalid(
                "publish.ephemeral_max_bytes",
                format!("must be 1 to {MAX_LOGICAL_MESSAGE_BYTES}"),
            ));
        }
        if ephemeral_max > MAX_NOTIFY_PAYLOAD_BYTES && self.database.wakeup == WakeupMode::Notify {
            return Err(invalid(
                "publish.ephemeral_max_bytes",
                format!(
                    "above {MAX_NOTIFY_PAYLOAD_BYTES} needs database.wakeup = \"logical\" \
                     (Postgres refuses larger NOTIFY payloads)"
                ),
            ));
        }
        // An ephemeral event's logical message carries its channel prefix
        // and a few framing bytes beyond the payload.
        let replication_floor = ephemeral_max + 1024;
        if self.database.replication_max_message_bytes < replication_floor {
            return Err(invalid(
                "database.replication_max_message_bytes",
                format!(
                    "must be at least {replication_floor} (publish.ephemeral_max_bytes and the \
                     message's framing)"
                ),
            ));
        }
        if self.database.listen_health_secs == 0 {
            return Err(invalid("database.listen_health_secs", "must be at least 1"));
        }
        if self.database.tcp_keepalive_secs == 0 {
            return Err(invalid("database.tcp_keepalive_secs", "must be at least 1"));
        }
        if self.database.tcp_user_timeout_secs == 0 {
            return Err(invalid(
                "database.tcp_user_timeout_secs",
                "must be at least 1",
            ));
        }
        self.validate_http()?;
        let sse = &self.sse;
        if sse.heartbeat_secs == 0 {
            return Err(invalid("sse.heartbeat_secs", "must be at least 1"));
        }
        if sse.max_age_secs == 0 {
            return Err(invalid("sse.max_age_secs", "must be at least 1"));
        }
        if sse.max_connections_per_subscriber == 0 {
            return Err(invalid(
                "sse.max_connections_per_subscriber",
                "must be at least 1",
            ));
        }
        if !(1..=eventrelay_wire::MAX_COMPOUND_SCOPES).contains(&sse.max_scopes_per_stream) {
            return Err(invalid(
                "sse.max_scopes_per_stream",
                format!(
                    "must be between 1 and {}",
                    eventrelay_wire::MAX_COMPOUND_SCOPES
                ),
            ));
        }
        if sse.replay_lookback < 0 {
            return Err(invalid("sse.replay_lookback", "must not be negative"));
        }
        if sse.queue_capacity < 16 {
            return Err(invalid("sse.queue_capacity", "must be at least 16"));
        }
        if self.hub.arbiters == 0 {
            return Err(invalid("hub.arbiters", "must be at least 1"));
        }
        if self.hub.tail_events == 0 {
            return Err(invalid("hub.tail_events", "must be at least 1"));
        }
        if self.hub.tails_max_bytes == 0 {
            return Err(invalid("hub.tails_max_bytes", "must be at least 1"));
        }
        if self.publish.max_batch == 0 {
            return Err(invalid("publish.max_batch", "must be at least 1"));
        }
        if self.publish.group_max_events < self.publish.max_batch {
            return Err(invalid(
                "publish.group_max_events",
                "must be at least publish.max_batch, so a whole request fits a group",
            ));
        }
        if self.publish.group_commit_writers == 0 {
            return Err(invalid(
                "publish.group_commit_writers",
                "must be at least 1",
            ));
        }
        if self.publish.group_commit_ms > 1000 {
            return Err(invalid(
                "publish.group_commit_ms",
                "must be at most 1000: every publish in a group waits for it",
            ));
        }
        if self.publish.token.as_deref().is_some_and(|t| t.len() < 16) {
            return Err(invalid(
                "publish.token",
                "must be at least 16 characters; use a long random value",
            ));
        }
        if self.outbox.retention_secs < 60 {
            return Err(invalid("outbox.retention_secs", "must be at least 60"));
        }
        if self.outbox.prune_interval_secs == 0 {
            return Err(invalid("outbox.prune_interval_secs", "must be at least 1"));
        }
        let webhooks = &self.webhooks;
        if webhooks.workers == 0 {
            return Err(invalid("webhooks.workers", "must be at least 1"));
        }
        if webhooks.retention_secs == 0 {
            return Err(invalid("webhooks.retention_secs", "must be at least 1"));
        }
        if webhooks.dead_retention_secs == 0 {
            return Err(invalid(
                "webhooks.dead_retention_secs",
                "must be at least 1",
            ));
        }
        if webhooks.disable_after_secs == 0 {
            return Err(invalid("webhooks.disable_after_secs", "must be at least 1"));
        }
        if webhooks.disable_after_attempts == 0 || webhooks.disable_after_attempts > 1_000_000 {
            return Err(invalid(
                "webhooks.disable_after_attempts",
                "must be 1 to 1000000",
            ));
        }
        if let Some(scope) = &webhooks.events_scope {
            eventrelay_wire::validate_scope_key(scope)
                .map_err(|e| invalid("webhooks.events_scope", e.to_string()))?;
        }
        if webhooks.request_timeout_ms == 0 {
            return Err(invalid("webhooks.request_timeout_ms", "must be at least 1"));
        }
        if webhooks.lease_ms <= webhooks.request_timeout_ms {
            return Err(invalid(
                "webhooks.lease_ms",
                format!(
                    "must be longer than webhooks.request_timeout_ms ({} ms), or a slow request could be sent twice at once",
                    webhooks.request_timeout_ms
                ),
            ));
        }
        let floor = crate::webhooks::MIN_RETRY_AFTER.as_millis() as u64;
        if webhooks.max_retry_after_ms < floor {
            return Err(invalid(
                "webhooks.max_retry_after_ms",
                format!("must be at least {floor} (the shortest Retry-After honoured)"),
            ));
        }
        for subscription in &webhooks.subscriptions {
            crate::webhooks::validate_subscription(
                Some(&subscription.id),
                Some(&subscription.url),
                Some(&subscription.types),
            )
            .and_then(|()| {
                crate::webhooks::validate_subscription_fields(
                    Some(&subscription.url),
                    Some(&subscription.types),
                    subscription.scope_key.as_deref(),
                    Some(&subscription.secret),
                )
            })
            .and_then(|()| crate::webhooks::check_max_per_second(subscription.max_per_second))
            .map_err(|e| {
                invalid(
                    "webhooks.subscriptions",
                    format!("{}: {e}", subscription.id),
                )
            })?;
        }
        if self.admin.token.as_deref().is_some_and(|t| t.len() < 16) {
            return Err(invalid(
                "admin.token",
                "must be at least 16 characters; use a long random value",
            ));
        }
        if !matches!(self.log.format.as_str(), "text" | "json") {
            return Err(invalid("log.format", "must be `text` or `json`"));
        }
        if let Err(error) = tracing_subscriber::EnvFilter::try_new(&self.log.level) {
            return Err(invalid(
                "log.level",
                format!("not a tracing filter such as `info` or `eventrelay=debug`: {error}"),
            ));
        }
        if let Err((setting, message)) = self.telemetry.check() {
            return Err(invalid(setting, message));
        }
        self.validate_portal()?;
        if let Err((setting, message)) = self.presence.check() {
            return Err(invalid(setting, message));
        }
        Ok(())
    }

    /// The `[portal]` checks: each frame origin is a bare origin (it goes
    /// into a header), and the session bound is one the database takes.
    fn validate_portal(&self) -> Result<(), ConfigError> {
        let portal = &self.portal;
        for origin in &portal.allowed_frame_origins {
            let bare = reqwest::Url::parse(origin).ok().filter(|url| {
                matches!(url.scheme(), "http" | "https")
                    && url.host_str().is_some()
                    && url.path() == "/"
                    && url.query().is_none()
                    && !origin.ends_with('/')
            });
            if bare.is_none() {
                return Err(invalid(
                    "portal.allowed_frame_origins",
                    format!("{origin:?} is not an origin such as https://app.example.com"),
                ));
            }
        }
        if portal.max_session_secs == 0 || portal.max_session_secs > crate::portal::MAX_SESSION_SECS
        {
            return Err(invalid(
                "portal.max_session_secs",
                format!(
                    "must be from 1 to {} (a week)",
                    crate::portal::MAX_SESSION_SECS
                ),
            ));
        }
        if let Some(base) = &portal.base_url
            && reqwest::Url::parse(base).is_err()
        {
            return Err(invalid(
                "portal.base_url",
                format!("{base:?} is not a URL such as https://relay.example.com"),
            ));
        }
        Ok(())
    }

    /// The `[http]` checks: origin patterns, `*` without credentials, TLS
    /// files given in pairs. The files themselves are read at start.
    fn validate_http(&self) -> Result<(), ConfigError> {
        let http = &self.http;
        if http.header_timeout_secs == 0 {
            return Err(invalid("http.header_timeout_secs", "must be at least 1"));
        }
        if http.body_timeout_secs == 0 {
            return Err(invalid("http.body_timeout_secs", "must be at least 1"));
        }
        if http.write_timeout_secs == 0 {
            return Err(invalid("http.write_timeout_secs", "must be at least 1"));
        }
        if http.listen_backlog == 0 {
            return Err(invalid("http.listen_backlog", "must be at least 1"));
        }
        if http.opening_per_worker == 0 {
            return Err(invalid("http.opening_per_worker", "must be at least 1"));
        }
        origins::OriginRules::parse(&http.allowed_origins, http.allow_credentials)
            .map_err(|e| invalid("http.allowed_origins", e.to_string()))?;
        let tls = &http.tls;
        let blank = |path: &Option<std::path::PathBuf>| {
            path.as_ref().is_some_and(|p| p.as_os_str().is_empty())
        };
        if blank(&tls.cert_file) {
            return Err(invalid("http.tls.cert_file", "must not be empty"));
        }
        if blank(&tls.key_file) {
            return Err(invalid("http.tls.key_file", "must not be empty"));
        }
        match (&tls.cert_file, &tls.key_file) {
            (Some(_), None) => Err(invalid(
                "http.tls.key_file",
                "is required with http.tls.cert_file",
            )),
            (None, Some(_)) => Err(invalid(
                "http.tls.cert_file",
                "is required with http.tls.key_file",
            )),
            _ => Ok(()),
        }
    }

    /// The schema's name. Call on a validated configuration: [`Config::load`]
    /// and the server's start both validate it.
    pub fn schema(&self) -> Identifier {
        #[allow(
            clippy::expect_used,
            reason = "validate() refuses a schema that is not an identifier, and every Config is validated before use"
        )]
        Identifier::new(&self.database.schema).expect("validated at load")
    }

    /// The channel's name, on a validated configuration like [`Config::schema`].
    pub fn channel(&self) -> Identifier {
        #[allow(
            clippy::expect_used,
            reason = "validate() refuses a channel that is not an identifier, and every Config is validated before use"
        )]
        Identifier::new(&self.database.channel).expect("validated at load")
    }

    /// Connection settings for `url`, with the configured TCP keepalives.
    pub fn connect_options(&self, url: &str) -> Result<PgConnectOptions, ConnectError> {
        Ok(PgConnectOptions::parse(url)?.with_tcp(TcpSettings {
            keepalive_idle: Duration::from_secs(self.database.tcp_keepalive_secs),
            user_timeout: Duration::from_secs(self.database.tcp_user_timeout_secs),
            // A path that swallows packets holds a connection attempt until
            // this runs out; the health interval is the patience the
            // operator chose for such paths.
            connect_timeout: self
                .listen_health()
                .clamp(Duration::from_secs(1), Duration::from_secs(10)),
        }))
    }

    /// How long the LISTEN connection may stay silent before it is probed.
    pub fn listen_health(&self) -> Duration {
        Duration::from_secs(self.database.listen_health_secs)
    }

    /// The URL for the LISTEN connection.
    pub fn listen_url(&self) -> Option<&str> {
        self.database
            .listen_url
            .as_deref()
            .or(self.database.url.as_deref())
    }
}

impl SseConfig {
    pub fn heartbeat(&self) -> Duration {
        Duration::from_secs(self.heartbeat_secs)
    }

    pub fn max_age(&self) -> Duration {
        Duration::from_secs(self.max_age_secs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_the_design() {
        let config = Config::default();
        assert_eq!(config.sse.heartbeat_secs, 20);
        assert_eq!(config.sse.max_age_secs, 300);
        assert_eq!(config.sse.max_connections_per_subscriber, 5);
        assert_eq!(config.sse.retry_ms, 3000);
        assert_eq!(config.sse.replay_lookback, 100);
        assert_eq!(config.hub.tail_events, 128);
        assert_eq!(config.hub.tail_bytes, 4 * 1024 * 1024);
        assert_eq!(config.outbox.retention_secs, 86_400);
        config.validate().unwrap();
    }

    #[test]
    fn errors_name_the_setting() {
        let refused_for = |setting: &str, change: fn(&mut Config)| {
            let mut config = Config::default();
            change(&mut config);
            let error = config.validate().unwrap_err().to_string();
            assert!(error.starts_with(&format!("{setting}:")), "{error}");
        };
        refused_for("database.schema", |c| c.database.schema = "Bad-Name".into());
        refused_for("sse.heartbeat_secs", |c| c.sse.heartbeat_secs = 0);
        refused_for("database.wakeup", |c| {
            c.database.url = None;
            c.database.wakeup = WakeupMode::Logical;
        });
        refused_for("publish.ephemeral_max_bytes", |c| {
            c.publish.ephemeral_max_bytes = 8000;
        });
        refused_for("publish.ephemeral_max_bytes", |c| {
            c.database.url = Some("postgres://db/app".into());
            c.database.wakeup = WakeupMode::Logical;
            c.publish.ephemeral_max_bytes = MAX_LOGICAL_MESSAGE_BYTES + 1;
        });
        refused_for("publish.group_commit_writers", |c| {
            c.publish.group_commit_writers = 0
        });
        refused_for("database.url", |c| {
            c.database.url = Some("not a url at all".into())
        });
    }

    #[test]
    fn development_mode_runs_on_a_network_address_only_when_asked_for_by_name() {
        let with = |bind: &str, url: Option<&str>, auth: Option<AuthConfig>| {
            let mut config = Config::default();
            config.http.bind = bind.parse().unwrap();
            config.database.url = url.map(Into::into);
            config.auth = auth;
            config.validate()
        };
        let error = with("0.0.0.0:8080", Some("postgres://db/app"), None)
            .unwrap_err()
            .to_string();
        assert!(error.starts_with("auth:"), "{error}");
        assert!(error.contains("auth.mode = \"development\""), "{error}");
        assert!(with("[::]:8080", Some("postgres://db/app"), None).is_err());
        // A laptop: loopback, or the embedded database.
        assert!(with("127.0.0.1:8080", Some("postgres://db/app"), None).is_ok());
        assert!(with("[::1]:8080", Some("postgres://db/app"), None).is_ok());
        assert!(with("0.0.0.0:8080", None, None).is_ok());
        // Asked for by name.
        let development = Some(AuthConfig::Development(Default::default()));
        assert!(with("0.0.0.0:8080", Some("postgres://db/app"), development).is_ok());
        let asked = Config {
            auth: Some(AuthConfig::Development(Default::default())),
            ..Config::default()
        };
        assert!(asked.development_mode());
        assert!(Config::default().development_mode());
    }

    #[test]
    fn a_lease_no_longer_than_the_request_timeout_is_refused() {
        let mut config = Config::default();
        config.webhooks.lease_ms = config.webhooks.request_timeout_ms;
        let error = config.validate().unwrap_err().to_string();
        assert!(error.starts_with("webhooks.lease_ms:"), "{error}");
    }

    #[test]
    fn a_configured_subscription_gets_the_same_field_checks_as_the_api() {
        let mut config = Config::default();
        config.webhooks.subscriptions = vec![crate::webhooks::NewSubscription {
            id: "hostless".into(),
            url: "https://".into(),
            secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".into(),
            types: vec!["*".into()],
            scope_key: None,
            max_per_second: None,
            ordering: Default::default(),
            ordering_max_block_secs: None,
        }];
        let error = config.validate().unwrap_err().to_string();
        assert!(error.contains("hostless: url:"), "{error}");
    }

    #[test]
    fn a_log_level_that_is_not_a_filter_is_refused() {
        let mut config = Config::default();
        config.log.level = "eventrelay=loud".into();
        let error = config.validate().unwrap_err().to_string();
        assert!(error.starts_with("log.level:"), "{error}");
    }

    #[test]
    fn a_retry_after_ceiling_below_the_floor_is_refused() {
        let mut config = Config::default();
        config.webhooks.max_retry_after_ms = 100;
        let error = config.validate().unwrap_err().to_string();
        assert!(error.starts_with("webhooks.max_retry_after_ms:"), "{error}");
    }

    #[test]
    // figment's Jail returns its own large error type; it is only a test.
    #[allow(clippy::result_large_err)]
    fn file_then_environment_override_defaults() {
        let dir = std::env::temp_dir().join(format!("eventrelay-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("eventrelay.toml");
        std::fs::write(&file, "[sse]\nheartbeat_secs = 7\nretry_ms = 100\n").unwrap();
        figment::Jail::expect_with(|jail| {
            jail.set_env("EVENTRELAY_SSE__RETRY_MS", "250");
            let config = Config::load(Some(&file)).unwrap();
            assert_eq!(config.sse.heartbeat_secs, 7);
            assert_eq!(config.sse.retry_ms, 250);
            assert_eq!(config.sse.max_age_secs, 300);
            Ok(())
        });
        std::fs::write(&file, "[sse]\nheartbeat = 7\n").unwrap();
        let error = Config::load(Some(&file)).unwrap_err().to_string();
        assert!(error.contains("heartbeat"), "{error}");
    }

    /// The configuration reference (docs/src/configuration.md) names each
    /// setting's variable as `EVENTRELAY_` and its path in upper case with
    /// `__` between the parts, at any depth.
    #[test]
    // figment's Jail returns its own large error type; it is only a test.
    #[allow(clippy::result_large_err)]
    fn nested_settings_take_their_variable_at_any_depth() {
        figment::Jail::expect_with(|jail| {
            jail.set_env("EVENTRELAY_SSE__HEARTBEAT_SECS", "7");
            jail.set_env("EVENTRELAY_HTTP__TLS__CERT_FILE", "/etc/cert.pem");
            jail.set_env("EVENTRELAY_HTTP__TLS__KEY_FILE", "/etc/key.pem");
            jail.set_env("EVENTRELAY_AUTH__MODE", "forward");
            jail.set_env("EVENTRELAY_AUTH__URL", "http://app.internal/auth");
            let config = Config::load(None).unwrap();
            assert_eq!(config.sse.heartbeat_secs, 7);
            assert_eq!(
                config.http.tls.cert_file.as_deref(),
                Some(Path::new("/etc/cert.pem"))
            );
            assert!(matches!(config.auth, Some(AuthConfig::Forward(_))));
            Ok(())
        });
    }
}
