//! The `eventrelay` command line: the commands, their shared arguments and
//! errors, and the dispatch to one file per command family.
//!
//! - `serve.rs`: `serve`, `check-config`, `health`
//! - `token.rs`: `token`
//! - `migrate.rs`: `migrate`, `emit`
//! - `deliveries.rs`: `deliveries ...`
//! - `subscriptions.rs`: `subscriptions ...`
//! - `subscribers.rs`: `subscribers ...` (through the admin API)
//!
//! The commands print their results on stdout (JSON lines where a program
//! reads them) and everything else on stderr.

mod deliveries;
mod migrate;
mod serve;
mod subscribers;
mod subscriptions;
mod token;

use std::io::Write as _;
use std::path::{Path, PathBuf};

use clap::{Args, Parser, Subcommand};
use eventrelay::auth::{AuthConfigError, MintError};
use eventrelay::config::{Config, ConfigError, LogConfig};
use eventrelay::publisher::{Identifier, IdentifierError, PublishError};
use eventrelay::secret::Secret;
use eventrelay::server::ServeError;
use eventrelay::store::MigrateError;
use eventrelay::webhooks::{StoreError, WebhookStore};
use serde_json::Value;
use tracing_subscriber::EnvFilter;

pub use deliveries::DeliveriesCommand;
pub use migrate::{EmitArgs, MigrateArgs};
pub use serve::{HealthArgs, ReloadArgs};
pub use subscriptions::SubscriptionsCommand;
pub use token::TokenArgs;

/// Where development mode keeps its generated secrets.
const DEV_DIR: &str = ".eventrelay";

/// Live events from Postgres to browsers and webhooks.
#[derive(Parser)]
#[command(name = "eventrelay", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Run the relay: SSE stream, publish API, metrics.
    Serve(ConfigArgs),
    /// Load and validate the configuration, then print it.
    CheckConfig(ConfigArgs),
    /// Mint a development token for the configured HMAC secret.
    Token(TokenArgs),
    /// Ask a running relay to re-read its configuration (also done on SIGHUP).
    Reload(ReloadArgs),
    /// Exit 0 when the relay at --url answers 200 (for container health checks).
    Health(HealthArgs),
    /// Create or upgrade eventrelay's tables and SQL functions.
    Migrate(MigrateArgs),
    /// Emit one event (for trying things out and for scripts).
    Emit(EmitArgs),
    /// Inspect the webhook delivery log, redeliver, prune. Prints JSON lines.
    #[command(subcommand)]
    Deliveries(DeliveriesCommand),
    /// Manage webhook subscriptions. Prints JSON lines.
    #[command(subcommand)]
    Subscriptions(SubscriptionsCommand),
    /// List who is connected, and end a subscriber's streams on every relay.
    #[command(subcommand)]
    Subscribers(subscribers::SubscribersCommand),
}

/// Database settings: the configuration (file and environment), with these
/// flags taking precedence.
#[derive(Args)]
pub struct Database {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Postgres connection URL (database.url, or DATABASE_URL).
    #[arg(long)]
    database_url: Option<String>,
    /// Schema holding eventrelay's tables (database.schema).
    #[arg(long)]
    schema: Option<String>,
    /// Notification channel relays LISTEN on (database.channel).
    #[arg(long)]
    channel: Option<String>,
    /// How relays are woken, `notify` or `logical` (database.wakeup);
    /// `migrate` records it in the schema.
    #[arg(long)]
    wakeup: Option<eventrelay::store::WakeupMode>,
}

/// The database settings a one-off command runs with.
pub struct Target {
    pub url: String,
    pub schema: Identifier,
    pub channel: Identifier,
    pub wakeup: eventrelay::store::WakeupMode,
}

impl Database {
    /// The schema alone, for commands that need no database.
    pub fn resolve_schema(&self) -> Result<Identifier, CliError> {
        let mut config = Config::load(self.config.config.as_deref())?;
        if let Some(schema) = &self.schema {
            config.database.schema = schema.clone();
        }
        Ok(config.schema())
    }

    pub fn resolve(&self) -> Result<Target, CliError> {
        let mut config = Config::load(self.config.config.as_deref())?;
        if let Some(url) = &self.database_url {
            config.database.url = Some(url.as_str().into());
        }
        if let Some(schema) = &self.schema {
            config.database.schema = schema.clone();
        }
        if let Some(channel) = &self.channel {
            config.database.channel = channel.clone();
        }
        if let Some(wakeup) = self.wakeup {
            config.database.wakeup = wakeup;
        }
        config.validate()?;
        let url = config
            .database
            .url
            .as_ref()
            .map(|url| url.expose().to_owned())
            .ok_or_else(|| {
                CliError::Usage("no database: pass --database-url or set DATABASE_URL".into())
            })?;
        Ok(Target {
            url,
            schema: config.schema(),
            channel: config.channel(),
            wakeup: config.database.wakeup,
        })
    }

    /// Connects for a webhook command, resolving the database like the
    /// other one-off commands.
    pub async fn webhook_store(&self) -> Result<(tokio_postgres::Client, WebhookStore), CliError> {
        let target = self.resolve()?;
        let client = eventrelay::connect(&target.url).await?;
        Ok((client, WebhookStore::new(&target.schema)))
    }
}

#[derive(Args)]
pub struct ConfigArgs {
    /// TOML configuration file.
    #[arg(long, env = "EVENTRELAY_CONFIG")]
    pub config: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Auth(#[from] AuthConfigError),
    #[error(transparent)]
    Serve(#[from] ServeError),
    #[error("cannot mint a token: {0}")]
    Mint(#[from] MintError),
    #[error("{0}")]
    Usage(String),
    #[error("{url}: {source}")]
    Unreachable { url: String, source: reqwest::Error },
    #[error("{url} answered {status}")]
    Unhealthy {
        url: String,
        status: reqwest::StatusCode,
    },
    #[error(transparent)]
    Tls(#[from] eventrelay::http::tls::TlsError),
    #[error("{url} refused ({status}): {message}")]
    Refused {
        url: String,
        status: reqwest::StatusCode,
        message: String,
    },
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Connect(#[from] eventrelay_publisher::ConnectError),
    #[error(transparent)]
    Name(#[from] IdentifierError),
    #[error(transparent)]
    Migrate(#[from] MigrateError),
    #[error(transparent)]
    Wakeup(#[from] eventrelay::store::WakeupError),
    #[error(transparent)]
    Publish(#[from] PublishError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("no delivery {0}")]
    NoDelivery(i64),
    #[error(transparent)]
    InvalidSubscription(#[from] eventrelay::webhooks::InvalidSubscription),
    #[error(transparent)]
    Configured(#[from] eventrelay::webhooks::ConfiguredSubscription),
    #[error("no subscription {0:?}")]
    NoSubscription(String),
    #[error("--{flag} is not valid JSON: {error}")]
    Json {
        flag: &'static str,
        error: serde_json::Error,
    },
}

/// Runs one command to its end.
pub async fn run(cli: Cli) -> Result<(), CliError> {
    match cli.command {
        Command::Serve(args) => serve::serve(args).await,
        Command::Reload(args) => serve::reload(args).await,
        Command::Health(args) => serve::health(args).await,
        Command::CheckConfig(args) => serve::check_config(args).await,
        Command::Token(args) => token::token(args),
        Command::Migrate(args) => migrate::migrate(args).await,
        Command::Emit(args) => migrate::emit(args).await,
        Command::Deliveries(command) => deliveries::run(command).await,
        Command::Subscriptions(command) => subscriptions::run(command).await,
        Command::Subscribers(command) => subscribers::run(command).await,
    }
}

fn parse_json(flag: &'static str, text: &str) -> Result<Value, CliError> {
    serde_json::from_str(text).map_err(|error| CliError::Json { flag, error })
}

/// Reads (or creates) a random development secret under `dir`.
/// A development secret kept in `dir/name`, created on first use readable
/// by its owner only.
fn dev_secret(dir: &Path, name: &str) -> Result<Secret, CliError> {
    let path = dir.join(name);
    if let Ok(secret) = std::fs::read_to_string(&path) {
        return Ok(secret.trim().into());
    }
    std::fs::create_dir_all(dir)?;
    let secret = format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    );
    let mut file = owner_only(&path)?;
    file.write_all(secret.as_bytes())?;
    Ok(secret.into())
}

/// Creates `path` (or truncates it) with mode 0600 on Unix.
fn owner_only(path: &Path) -> std::io::Result<std::fs::File> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    options.open(path)
}

/// Logs to stderr with `log.level` as the filter (`RUST_LOG`, when set,
/// overrides it) in `log.format`, text or JSON lines.
///
/// Returns a handle that swaps the filter, for a reloaded `log.level`.
pub fn init_logging(log: &LogConfig) -> LogFilter {
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;

    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&log.level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let (filter, handle) = tracing_subscriber::reload::Layer::new(filter);
    let output = if log.format == "json" {
        tracing_subscriber::fmt::layer()
            .json()
            .with_writer(std::io::stderr)
            .boxed()
    } else {
        tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .boxed()
    };
    tracing_subscriber::registry()
        .with(filter)
        .with(output)
        .init();
    LogFilter(handle)
}

/// Swaps the log filter of a running process.
pub struct LogFilter(tracing_subscriber::reload::Handle<EnvFilter, tracing_subscriber::Registry>);

impl LogFilter {
    /// Puts `level` (a tracing filter such as `info` or `eventrelay=debug`)
    /// in force.
    pub fn set(&self, level: &str) -> Result<(), eventrelay::reload::BoxError> {
        let filter = EnvFilter::try_new(level)?;
        self.0.reload(filter)?;
        Ok(())
    }
}

/// One call of a running relay's admin API, with the configured
/// `admin.token`.
pub struct AdminCall {
    base: String,
    token: eventrelay::secret::Secret,
}

impl AdminCall {
    pub fn new(config: &ConfigArgs, base: &str) -> Result<AdminCall, CliError> {
        let config = Config::load(config.config.as_deref())?;
        let token = config.admin.token.ok_or_else(|| {
            CliError::Usage(
                "admin.token is not set: this command uses the relay's admin API".into(),
            )
        })?;
        Ok(AdminCall {
            base: base.trim_end_matches('/').to_owned(),
            token,
        })
    }

    /// Sends the request and answers the JSON body of a success; a refusal
    /// is an error carrying the API's message.
    pub async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
    ) -> Result<serde_json::Value, CliError> {
        let url = format!("{}{path}", self.base);
        let unreachable = |source| CliError::Unreachable {
            url: url.clone(),
            source,
        };
        let response = reqwest::Client::new()
            .request(method, &url)
            .bearer_auth(self.token.expose())
            .timeout(std::time::Duration::from_secs(30))
            .send()
            .await
            .map_err(unreachable)?;
        let status = response.status();
        let body: serde_json::Value = response.json().await.map_err(unreachable)?;
        if !status.is_success() {
            return Err(CliError::Refused {
                url,
                status,
                message: body["error"]["message"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            });
        }
        Ok(body)
    }
}
