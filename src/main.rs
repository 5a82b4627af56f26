//! The `eventrelay` command line.

use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use eventrelay::publisher::{
    Audience, DEFAULT_SCHEMA, Identifier, IdentifierError, NewEvent, PublishError, Publisher,
};
use eventrelay::store::{MigrateError, migrate};
use serde_json::Value;

/// Live events from Postgres to browsers and webhooks.
#[derive(Parser)]
#[command(name = "eventrelay", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create or upgrade eventrelay's tables and SQL functions.
    Migrate(Database),
    /// Emit one event (for trying things out and for scripts).
    Emit(EmitArgs),
}

#[derive(Args)]
struct Database {
    /// Postgres connection URL.
    #[arg(long, env = "DATABASE_URL")]
    database_url: String,
    /// Schema holding eventrelay's tables.
    #[arg(long, env = "EVENTRELAY_SCHEMA", default_value = DEFAULT_SCHEMA)]
    schema: String,
    /// Notification channel relays LISTEN on.
    #[arg(long, env = "EVENTRELAY_CHANNEL", default_value = "eventrelay")]
    channel: String,
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

#[tokio::main]
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
        Command::Migrate(database) => {
            let schema = Identifier::new(&database.schema)?;
            let channel = Identifier::new(&database.channel)?;
            let mut client = eventrelay::connect(&database.database_url)
                .await
                .map_err(CliError::Connect)?;
            let report = migrate(&mut client, &schema, &channel).await?;
            println!(
                "schema {schema}: applied {:?}, {} already in place; notifications on channel {channel}",
                report.applied, report.already_applied
            );
        }
        Command::Emit(args) => {
            let event = args.to_event()?;
            let publisher = Publisher::new(&args.database.schema)?;
            let client = eventrelay::connect(&args.database.database_url)
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
