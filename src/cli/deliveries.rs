//! `eventrelay deliveries`: the webhook delivery log from the command line.

use chrono::{DateTime, Utc};
use clap::{Args, Subcommand};
use eventrelay::webhooks::{DeliveryFilter, DeliveryStatus, MAX_PAGE};
use serde_json::json;

use super::{CliError, Database};

/// The delivery log from the command line. Every command prints JSON, one
/// object per line, in the same shapes as the admin API, so output can be
/// piped to `jq` and read the same way as API answers.
#[derive(Subcommand)]
pub enum DeliveriesCommand {
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
pub struct ListDeliveriesArgs {
    #[command(flatten)]
    pub database: Database,
    /// Only this scope key.
    #[arg(long)]
    scope: Option<String>,
    /// Only this status.
    #[arg(long, value_enum)]
    status: Option<DeliveryStatus>,
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
pub struct DeliveryIdArgs {
    #[command(flatten)]
    pub database: Database,
    /// The delivery id.
    id: i64,
}

#[derive(Args)]
pub struct PruneArgs {
    #[command(flatten)]
    pub database: Database,
    /// An age such as 7d, 12h, 30m or 45s, or an RFC 3339 time.
    #[arg(long, value_name = "AGE_OR_TIME")]
    older_than: String,
}

/// Runs one `deliveries` command.
pub async fn run(command: DeliveriesCommand) -> Result<(), CliError> {
    match command {
        DeliveriesCommand::List(args) => {
            let (client, store) = args.database.webhook_store().await?;
            let filter = DeliveryFilter {
                scope_key: args.scope,
                status: args.status,
                event_id: args.event_id,
                subscription_id: args.subscription,
                event_type: None,
                since: None,
                until: None,
                before: args.before,
                limit: Some(args.limit),
                subscriptions_of_scope: None,
            };
            let deliveries = store.list_deliveries(&client, &filter).await?;
            for delivery in &deliveries {
                println!("{}", json!(delivery));
            }
            // Stdout stays pure JSON lines; the paging hint is for humans.
            if deliveries.len() as i64 == args.limit
                && let Some(last) = deliveries.last()
            {
                eprintln!("more may follow: add --before {}", last.id);
            }
        }
        DeliveriesCommand::Show(args) => {
            let (client, store) = args.database.webhook_store().await?;
            let (delivery, attempts) = store
                .get_delivery(&client, args.id)
                .await?
                .ok_or(CliError::NoDelivery(args.id))?;
            println!("{}", json!({"delivery": delivery, "attempts": attempts}));
        }
        DeliveriesCommand::Redeliver(args) => {
            let (client, store) = args.database.webhook_store().await?;
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
            let (client, store) = args.database.webhook_store().await?;
            let pruned = store.prune_deliveries(&client, before).await?;
            println!("{}", json!({"pruned": pruned, "before": before}));
        }
    }
    Ok(())
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
