//! The `eventrelay` command line.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use clap::{Args, Parser, Subcommand};
use eventrelay::auth::{
    Algorithm, AuthConfig, AuthConfigError, JwtConfig, MintError, MintOptions, SubscriberResolver,
    TokenSpec, build_resolver, mint_token,
};
use eventrelay::config::{Config, ConfigError, LogConfig};
use eventrelay::http::admin::{config_source_refusal, generate_secret, prepare_subscription};
use eventrelay::publisher::{
    Audience, Identifier, IdentifierError, NewEvent, PublishError, Publisher,
};
use eventrelay::secret::Secret;
use eventrelay::server::ServeError;
use eventrelay::store::webhooks::{DeliveryFilter, MAX_PAGE, Subscription};
use eventrelay::store::{MigrateError, StoreError, WebhookStore, migrate};
use serde_json::{Value, json};
use tracing_subscriber::EnvFilter;

/// Where development mode keeps its generated secrets.
const DEV_DIR: &str = ".eventrelay";

/// Live events from Postgres to browsers and webhooks.
#[derive(Parser)]
#[command(name = "eventrelay", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the relay: SSE stream, publish API, metrics.
    Serve(ConfigArgs),
    /// Load and validate the configuration, then print it.
    CheckConfig(ConfigArgs),
    /// Mint a development token for the configured HMAC secret.
    Token(TokenArgs),
    /// Exit 0 when the relay at --url answers 200 (for container health checks).
    Health(HealthArgs),
    /// Create or upgrade eventrelay's tables and SQL functions.
    Migrate(Database),
    /// Emit one event (for trying things out and for scripts).
    Emit(EmitArgs),
    /// Inspect the webhook delivery log, redeliver, prune. Prints JSON lines.
    #[command(subcommand)]
    Deliveries(DeliveriesCommand),
    /// Manage webhook subscriptions. Prints JSON lines.
    #[command(subcommand)]
    Subscriptions(SubscriptionsCommand),
}

/// Webhook subscriptions from the command line, with the admin API's rules
/// and answer shapes: secrets are printed only by `create` and
/// `rotate-secret`, and configured subscriptions are read-only.
#[derive(Subcommand)]
enum SubscriptionsCommand {
    /// List subscriptions by id; one per line, without secrets.
    List(Database),
    /// Show one subscription, without its secrets.
    Show(SubscriptionIdArgs),
    /// Create a subscription and print its secret (the only time it is shown).
    Create(CreateSubscriptionArgs),
    /// Delete a subscription; its pending deliveries give up.
    Delete(SubscriptionIdArgs),
    /// Replace the secret with a generated one and print it; the previous one
    /// keeps signing for webhooks.rotation_grace_secs.
    RotateSecret(SubscriptionIdArgs),
    /// Delete the configured subscriptions that the configuration no longer
    /// lists (relays only ever add or update them). Run it once every
    /// replica runs the new configuration; pending deliveries of the removed
    /// ones give up.
    RemoveUnlisted(Database),
}

#[derive(Args)]
struct SubscriptionIdArgs {
    #[command(flatten)]
    database: Database,
    /// The subscription id.
    id: String,
}

#[derive(Args)]
struct CreateSubscriptionArgs {
    #[command(flatten)]
    database: Database,
    /// Subscription id: letters, digits and `_.:-`.
    #[arg(long)]
    id: String,
    /// Where to POST events (http:// or https://).
    #[arg(long)]
    url: String,
    /// Signing secret (`whsec_<base64>`); generated when absent.
    #[arg(long)]
    secret: Option<String>,
    /// Event type pattern: an exact type, `prefix.*` or `*` (repeatable; default `*`).
    #[arg(long = "type")]
    types: Vec<String>,
    /// Only events of this scope key.
    #[arg(long)]
    scope: Option<String>,
}

/// The delivery log from the command line. Every command prints JSON, one
/// object per line, in the same shapes as the admin API, so output can be
/// piped to `jq` and read the same way as API answers.
#[derive(Subcommand)]
enum DeliveriesCommand {
    /// List deliveries, newest first; one delivery per line.
    List(ListDeliveriesArgs),
    /// Show one delivery and its attempts.
    Show(DeliveryIdArgs),
    /// Put a delivery back in the queue with a fresh schedule.
    Redeliver(DeliveryIdArgs),
    /// Delete finished (not pending) deliveries last changed before a time.
    Prune(PruneArgs),
}

#[derive(Args)]
struct ListDeliveriesArgs {
    #[command(flatten)]
    database: Database,
    /// Only this scope key.
    #[arg(long)]
    scope: Option<String>,
    /// Only this status.
    #[arg(long, value_parser = ["pending", "delivered", "dead", "gone"])]
    status: Option<String>,
    /// Only deliveries of this event.
    #[arg(long)]
    event_id: Option<uuid::Uuid>,
    /// Only this subscription.
    #[arg(long)]
    subscription: Option<String>,
    /// Only deliveries with a smaller id (the paging cursor).
    #[arg(long)]
    before: Option<i64>,
    /// Most deliveries to print.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(i64).range(1..=MAX_PAGE))]
    limit: i64,
}

#[derive(Args)]
struct DeliveryIdArgs {
    #[command(flatten)]
    database: Database,
    /// The delivery id.
    id: i64,
}

#[derive(Args)]
struct PruneArgs {
    #[command(flatten)]
    database: Database,
    /// An age such as 7d, 12h, 30m or 45s, or an RFC 3339 time.
    #[arg(long, value_name = "AGE_OR_TIME")]
    older_than: String,
}

/// Database settings: the configuration (file and environment), with these
/// flags taking precedence.
#[derive(Args)]
struct Database {
    #[command(flatten)]
    config: ConfigArgs,
    /// Postgres connection URL (database.url, or DATABASE_URL).
    #[arg(long)]
    database_url: Option<String>,
    /// Schema holding eventrelay's tables (database.schema).
    #[arg(long)]
    schema: Option<String>,
    /// Notification channel relays LISTEN on (database.channel).
    #[arg(long)]
    channel: Option<String>,
}

/// The database settings a one-off command runs with.
struct Target {
    url: String,
    schema: Identifier,
    channel: Identifier,
}

impl Database {
    fn resolve(&self) -> Result<Target, CliError> {
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
        })
    }
}

#[derive(Args)]
struct ConfigArgs {
    /// TOML configuration file.
    #[arg(long, env = "EVENTRELAY_CONFIG")]
    config: Option<PathBuf>,
}

#[derive(Args)]
struct HealthArgs {
    /// The endpoint to check.
    #[arg(long, default_value = "http://127.0.0.1:8080/readyz")]
    url: String,
}

#[derive(Args)]
struct TokenArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// Subscriber id (the `sub` claim by default).
    #[arg(long)]
    subscriber: String,
    /// Scope key the subscriber belongs to.
    #[arg(long)]
    scope: String,
    /// Grants as JSON, such as '{"orders":["read"]}'.
    #[arg(long, default_value = "{}")]
    grants: String,
    /// Lifetime in seconds.
    #[arg(long, default_value_t = 3600)]
    ttl_secs: u64,
}

#[derive(Args)]
struct EmitArgs {
    #[command(flatten)]
    database: Database,
    /// Event type, such as `order.created`.
    #[arg(long = "type")]
    event_type: String,
    /// Scope key (tenant, workspace) the event belongs to.
    #[arg(long)]
    scope: String,
    /// Event data as JSON.
    #[arg(long, default_value = "{}")]
    data: String,
    /// Send inline and never store (no replay).
    #[arg(long)]
    ephemeral: bool,
    /// Only these subscriber ids may see the event (comma-separated).
    #[arg(long, value_delimiter = ',')]
    users: Option<Vec<String>>,
    /// Opaque permission JSON subscribers must hold.
    #[arg(long)]
    permission: Option<String>,
    /// Resource names the event concerns (repeatable).
    #[arg(long = "resource")]
    resources: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
enum CliError {
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
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Connect(#[from] eventrelay_publisher::ConnectError),
    #[error(transparent)]
    Name(#[from] IdentifierError),
    #[error(transparent)]
    Migrate(#[from] MigrateError),
    #[error(transparent)]
    Publish(#[from] PublishError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("no delivery {0}")]
    NoDelivery(i64),
    #[error("no subscription {0:?}")]
    NoSubscription(String),
    #[error("--{flag} is not valid JSON: {error}")]
    Json {
        flag: &'static str,
        error: serde_json::Error,
    },
}

#[actix_web::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    // `serve` logs as its configuration says, so it starts logging once the
    // configuration is read; one-off commands log with the defaults.
    if !matches!(cli.command, Command::Serve(_)) {
        init_logging(&LogConfig::default());
    }
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<(), CliError> {
    match cli.command {
        Command::Serve(args) => serve(args).await?,
        Command::Health(args) => {
            let client = reqwest::Client::builder()
                .timeout(Duration::from_secs(3))
                .build()
                .map_err(|e| CliError::Usage(e.to_string()))?;
            let response = client
                .get(&args.url)
                .send()
                .await
                .map_err(|e| CliError::Usage(format!("{}: {e}", args.url)))?;
            if !response.status().is_success() {
                return Err(CliError::Usage(format!(
                    "{} answered {}",
                    args.url,
                    response.status()
                )));
            }
        }
        Command::CheckConfig(args) => {
            let config = Config::load(args.config.as_deref())?;
            if let Some(auth) = &config.auth {
                build_resolver(auth)?;
            }
            if config.http.tls.enabled() {
                // Reads and pairs the files, as the server does at start.
                eventrelay::http::tls::server_config(&config.http.tls)
                    .map_err(|e| CliError::Usage(e.to_string()))?;
            }
            println!("configuration is valid:");
            println!("{config:#?}");
        }
        Command::Token(args) => {
            let config = Config::load(args.config.config.as_deref())?;
            let (secret, jwt) = match &config.auth {
                Some(AuthConfig::Jwt(jwt)) => (
                    jwt.secret.clone().ok_or_else(|| {
                        CliError::Usage("auth.jwt.secret is not set: tokens can only be minted for HMAC secrets".into())
                    })?,
                    jwt.clone(),
                ),
                Some(AuthConfig::Forward(_)) => {
                    return Err(CliError::Usage(
                        "auth.mode is `forward`: the application issues credentials, not eventrelay".into(),
                    ));
                }
                None => (dev_secret(Path::new(DEV_DIR), "jwt-secret")?, JwtConfig::default()),
            };
            let grants = parse_json("grants", &args.grants)?;
            let token = mint_token(
                &secret,
                jwt.algorithm,
                &TokenSpec {
                    subscriber_id: args.subscriber,
                    scope_key: args.scope,
                    grants,
                    ttl: Duration::from_secs(args.ttl_secs),
                },
                &MintOptions::from_config(&jwt),
            )?;
            println!("{token}");
        }
        Command::Migrate(database) => {
            let Target {
                url,
                schema,
                channel,
            } = database.resolve()?;
            let mut client = eventrelay::connect(&url).await?;
            let report = migrate(&mut client, &schema, &channel).await?;
            println!(
                "schema {schema}: applied {:?}, {} already in place; notifications on channel {channel}",
                report.applied, report.already_applied
            );
        }
        Command::Emit(args) => {
            let event = args.to_event()?;
            let target = args.database.resolve()?;
            let publisher = Publisher::new(target.schema.as_str())?;
            let client = eventrelay::connect(&target.url).await?;
            let envelope = publisher.emit(&client, event).await?;
            println!(
                "{}",
                serde_json::to_string(&envelope).expect("an envelope is always JSON")
            );
        }
        Command::Deliveries(command) => deliveries(command).await?,
        Command::Subscriptions(command) => subscriptions(command).await?,
    }
    Ok(())
}

/// Connects for a deliveries command, resolving the database like the
/// other one-off commands.
async fn webhook_store(
    database: &Database,
) -> Result<(tokio_postgres::Client, WebhookStore), CliError> {
    let target = database.resolve()?;
    let client = eventrelay::connect(&target.url).await?;
    Ok((client, WebhookStore::new(&target.schema)))
}

async fn deliveries(command: DeliveriesCommand) -> Result<(), CliError> {
    match command {
        DeliveriesCommand::List(args) => {
            let (client, store) = webhook_store(&args.database).await?;
            let filter = DeliveryFilter {
                scope_key: args.scope,
                status: args.status,
                event_id: args.event_id,
                subscription_id: args.subscription,
                before: args.before,
                limit: Some(args.limit),
            };
            let deliveries = store.list_deliveries(&client, &filter).await?;
            for delivery in &deliveries {
                println!("{}", json!(delivery));
            }
            // Stdout stays pure JSON lines; the paging hint is for humans.
            if deliveries.len() as i64 == args.limit {
                if let Some(last) = deliveries.last() {
                    eprintln!("more may follow: add --before {}", last.id);
                }
            }
        }
        DeliveriesCommand::Show(args) => {
            let (client, store) = webhook_store(&args.database).await?;
            let (delivery, attempts) = store
                .get_delivery(&client, args.id)
                .await?
                .ok_or(CliError::NoDelivery(args.id))?;
            println!("{}", json!({"delivery": delivery, "attempts": attempts}));
        }
        DeliveriesCommand::Redeliver(args) => {
            let (client, store) = webhook_store(&args.database).await?;
            if !store.redeliver(&client, args.id).await? {
                return Err(CliError::NoDelivery(args.id));
            }
            let (delivery, attempts) = store
                .get_delivery(&client, args.id)
                .await?
                .ok_or(CliError::NoDelivery(args.id))?;
            println!("{}", json!({"delivery": delivery, "attempts": attempts}));
        }
        DeliveriesCommand::Prune(args) => {
            let before = older_than(&args.older_than, Utc::now()).map_err(CliError::Usage)?;
            let (client, store) = webhook_store(&args.database).await?;
            let pruned = store.prune_deliveries(&client, before).await?;
            println!("{}", json!({"pruned": pruned, "before": before}));
        }
    }
    Ok(())
}

async fn subscriptions(command: SubscriptionsCommand) -> Result<(), CliError> {
    match command {
        SubscriptionsCommand::List(database) => {
            let (client, store) = webhook_store(&database).await?;
            for subscription in store.list_subscriptions(&client).await? {
                println!("{}", json!(subscription));
            }
        }
        SubscriptionsCommand::Show(args) => {
            let (client, store) = webhook_store(&args.database).await?;
            let subscription = existing_subscription(&client, &store, &args.id).await?;
            println!("{}", json!({ "subscription": subscription }));
        }
        SubscriptionsCommand::Create(args) => {
            let types = (!args.types.is_empty()).then_some(args.types);
            let new = prepare_subscription(args.id, args.url, args.secret, types, args.scope)
                .map_err(CliError::Usage)?;
            let (client, store) = webhook_store(&args.database).await?;
            let created = store
                .create_subscription(&client, &new)
                .await?
                .ok_or_else(|| {
                    CliError::Usage(format!("a subscription {:?} already exists", new.id))
                })?;
            println!("{}", json!({"subscription": created, "secret": new.secret}));
        }
        SubscriptionsCommand::Delete(args) => {
            let (client, store) = webhook_store(&args.database).await?;
            changeable_subscription(&client, &store, &args.id).await?;
            if !store.delete_subscription(&client, &args.id).await? {
                return Err(CliError::NoSubscription(args.id));
            }
            println!("{}", json!({ "deleted": args.id }));
        }
        SubscriptionsCommand::RemoveUnlisted(database) => {
            let config = Config::load(database.config.config.as_deref())?;
            let keep: Vec<&str> = config
                .webhooks
                .subscriptions
                .iter()
                .map(|s| s.id.as_str())
                .collect();
            let (client, store) = webhook_store(&database).await?;
            let removed = store
                .remove_unlisted_config_subscriptions(&client, &keep)
                .await?;
            println!("{}", json!({ "removed": removed }));
        }
        SubscriptionsCommand::RotateSecret(args) => {
            let config = Config::load(args.database.config.config.as_deref())?;
            let grace = Duration::from_secs(config.webhooks.rotation_grace_secs);
            let (client, store) = webhook_store(&args.database).await?;
            changeable_subscription(&client, &store, &args.id).await?;
            let secret = generate_secret();
            let rotated = store
                .rotate_secret(&client, &args.id, &secret, grace)
                .await?
                .ok_or_else(|| CliError::NoSubscription(args.id.clone()))?;
            println!(
                "{}",
                json!({
                    "previousSecretExpiresAt": rotated.previous_secret_expires_at,
                    "subscription": rotated,
                    "secret": secret,
                })
            );
        }
    }
    Ok(())
}

async fn existing_subscription(
    client: &tokio_postgres::Client,
    store: &WebhookStore,
    id: &str,
) -> Result<Subscription, CliError> {
    store
        .get_subscription(client, id)
        .await?
        .ok_or_else(|| CliError::NoSubscription(id.to_owned()))
}

/// A subscription that exists and does not come from the configuration.
async fn changeable_subscription(
    client: &tokio_postgres::Client,
    store: &WebhookStore,
    id: &str,
) -> Result<Subscription, CliError> {
    let subscription = existing_subscription(client, store, id).await?;
    match config_source_refusal(&subscription) {
        Some(refusal) => Err(CliError::Usage(refusal)),
        None => Ok(subscription),
    }
}

/// Reads `--older-than`: an age back from `now` (`7d`, `12h`, `30m`, `45s`)
/// or an absolute RFC 3339 time.
fn older_than(text: &str, now: DateTime<Utc>) -> Result<DateTime<Utc>, String> {
    if let Ok(time) = DateTime::parse_from_rfc3339(text) {
        return Ok(time.with_timezone(&Utc));
    }
    let invalid = || {
        format!(
            "--older-than {text:?}: expected an age such as 7d, 12h, 30m or 45s, or an RFC 3339 time such as 2026-01-31T00:00:00Z"
        )
    };
    let split = text.len().checked_sub(1).ok_or_else(invalid)?;
    let (number, unit) = text.split_at(split);
    let number: i64 = number.parse().map_err(|_| invalid())?;
    let seconds = match unit {
        "d" => 86_400,
        "h" => 3_600,
        "m" => 60,
        "s" => 1,
        _ => return Err(invalid()),
    };
    number
        .checked_mul(seconds)
        .filter(|s| *s >= 0)
        .and_then(chrono::TimeDelta::try_seconds)
        .and_then(|age| now.checked_sub_signed(age))
        .ok_or_else(invalid)
}

impl EmitArgs {
    fn to_event(&self) -> Result<NewEvent, CliError> {
        let data = parse_json("data", &self.data)?;
        let event = if self.ephemeral {
            NewEvent::ephemeral(&self.event_type, &self.scope, data)
        } else {
            NewEvent::durable(&self.event_type, &self.scope, data)
        };
        let permission = self
            .permission
            .as_deref()
            .map(|text| parse_json("permission", text))
            .transpose()?;
        Ok(event
            .with_audience(Audience {
                users: self.users.clone(),
                permission,
            })
            .with_resources(self.resources.clone()))
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
fn init_logging(log: &LogConfig) {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&log.level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if log.format == "json" {
        subscriber.json().init();
    } else {
        subscriber.init();
    }
}

async fn serve(args: ConfigArgs) -> Result<(), CliError> {
    let mut config = Config::load(args.config.as_deref())?;
    init_logging(&config.log);
    raise_file_limit();
    let development = config.auth.is_none();
    let resolver: Arc<dyn SubscriberResolver> = match &config.auth {
        Some(auth) => build_resolver(auth)?,
        None => {
            let secret = dev_secret(Path::new(DEV_DIR), "jwt-secret")?;
            config.development_secret = Some(secret.clone());
            build_resolver(&AuthConfig::Jwt(JwtConfig {
                algorithm: Algorithm::HS256,
                secret: Some(secret),
                ..JwtConfig::default()
            }))?
        }
    };
    if development && config.publish.token.is_none() {
        config.publish.token = Some(dev_secret(Path::new(DEV_DIR), "publish-token")?);
    }
    let shutdown = shutdown_signal();
    let listener = std::net::TcpListener::bind(config.http.bind)?;
    // The banner is best effort: a closed stdout must not stop the service.
    let mut out = std::io::stdout();
    let address = listener.local_addr()?;
    let scheme = if config.http.tls.enabled() {
        "https"
    } else {
        "http"
    };
    let _ = writeln!(out, "eventrelay listening on {scheme}://{address}");
    let database = match &config.database.url {
        Some(url) => url.redacted(),
        None => format!(
            "embedded, in {} (single session; set DATABASE_URL for a real Postgres)",
            config.database.embedded_dir
        ),
    };
    let _ = writeln!(out, "  database: {database}");
    let _ = writeln!(
        out,
        "  stream:  GET  {scheme}://{address}/v1/events   (Authorization: Bearer <token>)"
    );
    let _ = writeln!(out, "  publish: POST {scheme}://{address}/v1/events");
    if development {
        let _ = writeln!(
            out,
            "development mode: no [auth] is configured, so tokens are signed with a secret in {DEV_DIR}/jwt-secret"
        );
        let _ = writeln!(
            out,
            "  subscriber token: eventrelay token --subscriber alice --scope org-1"
        );
        let _ = writeln!(out, "  publish token:    cat {DEV_DIR}/publish-token");
        if config.http.inspector {
            let _ = writeln!(out, "  inspector:        {scheme}://{address}/inspector");
        }
    }
    eventrelay::server::run(config, resolver, listener, shutdown).await?;
    Ok(())
}

/// Raises the soft limit on open files to the hard limit. Every SSE
/// connection holds a descriptor, and many runtimes start processes with a
/// soft limit of 1024 under a far higher hard limit, which would cap the
/// relay at about a thousand streams for no reason.
fn raise_file_limit() {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) => tracing::info!(limit, "open file limit"),
        Err(error) => tracing::warn!(%error, "cannot raise the open file limit"),
    }
}

/// Resolves on SIGINT or SIGTERM. The handlers are installed when this is
/// called, so a signal that arrives during start-up is not lost.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut interrupt = signal(SignalKind::interrupt()).expect("can install a SIGINT handler");
        let mut terminate = signal(SignalKind::terminate()).expect("can install a SIGTERM handler");
        async move {
            tokio::select! {
                _ = interrupt.recv() => {}
                _ = terminate.recv() => {}
            }
        }
    }
    #[cfg(not(unix))]
    async {
        let _ = tokio::signal::ctrl_c().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn older_than_takes_ages_and_times() {
        let now = DateTime::parse_from_rfc3339("2026-03-10T12:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let at = |text: &str| older_than(text, now).map(|t| t.to_rfc3339());
        assert_eq!(at("7d").unwrap(), "2026-03-03T12:00:00+00:00");
        assert_eq!(at("12h").unwrap(), "2026-03-10T00:00:00+00:00");
        assert_eq!(at("30m").unwrap(), "2026-03-10T11:30:00+00:00");
        assert_eq!(at("45s").unwrap(), "2026-03-10T11:59:15+00:00");
        assert_eq!(
            at("2026-01-31T00:00:00Z").unwrap(),
            "2026-01-31T00:00:00+00:00"
        );
        for bad in ["", "d", "7", "7w", "-1d", "1.5h", "yesterday"] {
            let error = at(bad).unwrap_err();
            assert!(error.starts_with("--older-than"), "{bad}: {error}");
        }
    }
}
