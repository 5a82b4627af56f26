//! `eventrelay subscriptions`: webhook subscriptions from the command line.

use std::time::Duration;

use clap::{Args, Subcommand};
use eventrelay::config::Config;
use eventrelay::webhooks::{
    DeliveryOrder, Subscription, SubscriptionRequest, WebhookStore, ensure_changeable,
    generate_secret, prepare_subscription,
};
use serde_json::json;

use super::{CliError, Database};

/// Webhook subscriptions from the command line, with the admin API's rules
/// and answer shapes: secrets are printed only by `create` and
/// `rotate-secret`, and configured subscriptions are read-only.
#[derive(Subcommand)]
pub enum SubscriptionsCommand {
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
pub struct SubscriptionIdArgs {
    #[command(flatten)]
    pub database: Database,
    /// The subscription id.
    id: String,
}

#[derive(Args)]
pub struct CreateSubscriptionArgs {
    #[command(flatten)]
    pub database: Database,
    /// Subscription id: letters, digits and `_.:-`.
    #[arg(long)]
    id: String,
    /// Where to POST events (http:// or https://).
    #[arg(long)]
    url: String,
    /// Signing secret of at least 24 bytes (`whsec_<base64>`, or text); generated when absent.
    #[arg(long)]
    secret: Option<String>,
    /// Event type pattern: an exact type, `prefix.*` or `*` (repeatable; default `*`).
    #[arg(long = "type")]
    types: Vec<String>,
    /// Only events of this scope key.
    #[arg(long)]
    scope: Option<String>,
    /// Most attempts a second, across every relay (no limit when absent).
    #[arg(long, value_name = "N")]
    max_per_second: Option<i32>,
    /// Deliveries in seq order per key: none, scope or resource.
    #[arg(
        long,
        value_enum,
        default_value_t,
        hide_possible_values = true,
        hide_default_value = true
    )]
    ordering: DeliveryOrder,
    /// How long a key's oldest pending delivery may hold the key back.
    #[arg(long, value_name = "SECS")]
    ordering_max_block_secs: Option<i32>,
}

/// Runs one `subscriptions` command.
pub async fn run(command: SubscriptionsCommand) -> Result<(), CliError> {
    match command {
        SubscriptionsCommand::List(database) => {
            let (client, store) = database.webhook_store().await?;
            for subscription in store.list_subscriptions(&client).await? {
                println!("{}", json!(subscription));
            }
        }
        SubscriptionsCommand::Show(args) => {
            let (client, store) = args.database.webhook_store().await?;
            let subscription = existing_subscription(&client, &store, &args.id).await?;
            println!("{}", json!({ "subscription": subscription }));
        }
        SubscriptionsCommand::Create(args) => {
            let types = (!args.types.is_empty()).then_some(args.types);
            let new = prepare_subscription(SubscriptionRequest {
                id: args.id,
                url: args.url,
                secret: args.secret,
                types,
                scope_key: args.scope,
                max_per_second: args.max_per_second,
                ordering: Some(args.ordering),
                ordering_max_block_secs: args.ordering_max_block_secs,
            })?;
            let (client, store) = args.database.webhook_store().await?;
            let created = store
                .create_subscription(&client, &new)
                .await?
                .ok_or_else(|| {
                    CliError::Usage(format!("a subscription {:?} already exists", new.id))
                })?;
            println!("{}", json!({"subscription": created, "secret": new.secret}));
        }
        SubscriptionsCommand::Delete(args) => {
            let (client, store) = args.database.webhook_store().await?;
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
            let (client, store) = database.webhook_store().await?;
            let removed = store
                .remove_unlisted_config_subscriptions(&client, &keep)
                .await?;
            println!("{}", json!({ "removed": removed }));
        }
        SubscriptionsCommand::RotateSecret(args) => {
            let config = Config::load(args.database.config.config.as_deref())?;
            let grace = Duration::from_secs(config.webhooks.rotation_grace_secs);
            let (client, store) = args.database.webhook_store().await?;
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
    ensure_changeable(&subscription)?;
    Ok(subscription)
}
