//! `eventrelay migrate` and `emit`: preparing a database, and emitting one
//! event into it.

use clap::Args;
use eventrelay::publisher::Identifier;
use eventrelay::publisher::{Audience, NewEvent, Publisher};
use eventrelay::store::migrate_for as apply_migrations;
use eventrelay::store::roles::{RoleNames, grants_sql};

use super::{CliError, Database, Target, parse_json};

#[derive(Args)]
pub struct MigrateArgs {
    #[command(flatten)]
    pub database: Database,
    /// Drop the schema and everything in it (events, deliveries,
    /// subscriptions) first, then create it again: for a development
    /// database left by an earlier build.
    #[arg(long)]
    reset: bool,
    /// Print the SQL that creates the relay's and the emitters' roles and
    /// grants them what they need in the schema, and do nothing else (no
    /// database is needed). Run it as the schema's owner after migrating.
    #[arg(long, conflicts_with = "reset")]
    print_grants: bool,
    /// With --print-grants: the relay's role.
    #[arg(long, default_value = "eventrelay_relay", requires = "print_grants")]
    relay_role: String,
    /// With --print-grants: the role applications that emit are granted.
    #[arg(long, default_value = "eventrelay_emitter", requires = "print_grants")]
    emitter_role: String,
}

#[derive(Args)]
pub struct EmitArgs {
    #[command(flatten)]
    pub database: Database,
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

/// Applies the migrations (after dropping the schema, with `--reset`) and
/// reports what was applied.
pub async fn migrate(args: MigrateArgs) -> Result<(), CliError> {
    if args.print_grants {
        let name = |flag: &str, value: &str| {
            Identifier::new(value).map_err(|error| CliError::Usage(format!("{flag}: {error}")))
        };
        let roles = RoleNames {
            relay: name("--relay-role", &args.relay_role)?,
            emitter: name("--emitter-role", &args.emitter_role)?,
        };
        print!("{}", grants_sql(&args.database.resolve_schema()?, &roles));
        return Ok(());
    }
    let Target {
        url,
        schema,
        channel,
        wakeup,
    } = args.database.resolve()?;
    let mut client = eventrelay::connect(&url).await?;
    let report = if args.reset {
        let report =
            eventrelay::store::migrate::reset(&mut client, &schema, &channel, wakeup).await?;
        println!("schema {schema}: dropped with everything in it, and created again");
        report
    } else {
        apply_migrations(&mut client, &schema, &channel, wakeup).await?
    };
    println!(
        "schema {schema}: applied {:?}, {} already in place; relays woken by {wakeup} on channel {channel}",
        report.applied, report.already_applied
    );
    if wakeup == eventrelay::store::WakeupMode::Logical {
        // The schema is ready; say now if this server is not.
        if let Err(error) = eventrelay::store::wakeup::check_logical_server(&client).await {
            println!("warning: {error}");
        }
    }
    Ok(())
}

/// Emits one event and prints its envelope as JSON.
pub async fn emit(args: EmitArgs) -> Result<(), CliError> {
    let event = args.to_event()?;
    let target = args.database.resolve()?;
    let publisher = Publisher::new(target.schema.as_str())?;
    let client = eventrelay::connect(&target.url).await?;
    let envelope = publisher.emit(&client, event).await?;
    println!("{}", serde_json::json!(envelope));
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
