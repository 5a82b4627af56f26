//! The `eventrelay` command line.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use eventrelay::auth::{
    Algorithm, AuthConfig, AuthConfigError, JwtConfig, MintError, MintOptions, SubscriberResolver,
    TokenSpec, build_resolver, mint_token,
};
use eventrelay::config::{Config, ConfigError};
use eventrelay::publisher::{
    Audience, Identifier, IdentifierError, NewEvent, PublishError, Publisher,
};
use eventrelay::server::ServeError;
use eventrelay::store::{MigrateError, migrate};
use serde_json::Value;

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
            config.database.url = Some(url.clone());
        }
        if let Some(schema) = &self.schema {
            config.database.schema = schema.clone();
        }
        if let Some(channel) = &self.channel {
            config.database.channel = channel.clone();
        }
        config.validate()?;
        let url = config.database.url.clone().ok_or_else(|| {
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
    #[error("cannot connect to Postgres: {0}")]
    Connect(tokio_postgres::Error),
    #[error(transparent)]
    Name(#[from] IdentifierError),
    #[error(transparent)]
    Migrate(#[from] MigrateError),
    #[error(transparent)]
    Publish(#[from] PublishError),
    #[error("--{flag} is not valid JSON: {error}")]
    Json {
        flag: &'static str,
        error: serde_json::Error,
    },
}

#[actix_web::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match run(Cli::parse()).await {
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
            let mut client = eventrelay::connect(&url).await.map_err(CliError::Connect)?;
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
            let client = eventrelay::connect(&target.url)
                .await
                .map_err(CliError::Connect)?;
            let envelope = publisher.emit(&client, event).await?;
            println!(
                "{}",
                serde_json::to_string(&envelope).expect("an envelope is always JSON")
            );
        }
    }
    Ok(())
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
fn dev_secret(dir: &Path, name: &str) -> Result<String, CliError> {
    let path = dir.join(name);
    if let Ok(secret) = std::fs::read_to_string(&path) {
        return Ok(secret.trim().to_owned());
    }
    std::fs::create_dir_all(dir)?;
    let secret = format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    );
    std::fs::write(&path, &secret)?;
    Ok(secret)
}

async fn serve(args: ConfigArgs) -> Result<(), CliError> {
    let mut config = Config::load(args.config.as_deref())?;
    let development = config.auth.is_none();
    let resolver: Arc<dyn SubscriberResolver> = match &config.auth {
        Some(auth) => build_resolver(auth)?,
        None => {
            let secret = dev_secret(Path::new(DEV_DIR), "jwt-secret")?;
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
    let listener = std::net::TcpListener::bind(config.http.bind)?;
    let address = listener.local_addr()?;
    println!("eventrelay listening on http://{address}");
    match &config.database.url {
        Some(url) => println!("  database: {}", redact_password(url)),
        None => println!(
            "  database: embedded, in {} (single session; set DATABASE_URL for a real Postgres)",
            config.database.embedded_dir
        ),
    }
    println!("  stream:  GET  http://{address}/v1/events   (Authorization: Bearer <token>)");
    println!("  publish: POST http://{address}/v1/events");
    if development {
        println!(
            "development mode: no [auth] is configured, so tokens are signed with a secret in {DEV_DIR}/jwt-secret"
        );
        println!("  subscriber token: eventrelay token --subscriber alice --scope org-1");
        println!("  publish token:    cat {DEV_DIR}/publish-token");
    }
    eventrelay::server::run(config, resolver, listener, shutdown_signal()).await?;
    Ok(())
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut terminate =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                .expect("can install a SIGTERM handler");
        tokio::select! {
            _ = interrupt => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = interrupt.await;
}

/// A database URL fit for a log line: the password is left out.
fn redact_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "(configured)".to_owned();
    };
    match rest.split_once('@') {
        Some((credentials, host)) => {
            let user = credentials.split(':').next().unwrap_or_default();
            format!("{scheme}://{user}@{host}")
        }
        None => url.to_owned(),
    }
}
