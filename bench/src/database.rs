//! The bench's own schema (and channel of the same name): created with the
//! relay's migrations before a run, dropped after it.

use eventrelay::publisher::Identifier;
use eventrelay::store::WakeupMode;

use crate::BenchResult;

pub async fn create_schema(database_url: &str, schema: &str) -> BenchResult<()> {
    create_schema_for(database_url, schema, WakeupMode::Notify).await
}

pub async fn create_schema_for(url: &str, schema: &str, wakeup: WakeupMode) -> BenchResult<()> {
    let mut client = eventrelay::connect(url).await?;
    let name = Identifier::new(schema)?;
    eventrelay::store::migrate_for(&mut client, &name, &name, wakeup).await?;
    Ok(())
}

pub async fn drop_schema(database_url: &str, schema: &str) {
    let sql =
        format!("DROP SCHEMA IF EXISTS {schema} CASCADE; DROP PUBLICATION IF EXISTS {schema}");
    let dropped = match eventrelay::connect(database_url).await {
        Ok(client) => client.batch_execute(&sql).await.map_err(|e| e.to_string()),
        Err(error) => Err(error.to_string()),
    };
    if let Err(error) = dropped {
        eprintln!("could not drop schema {schema}: {error}");
    }
}

pub fn test_database_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

pub fn unique_schema(prefix: &str) -> String {
    let nanos = crate::stream_client::realtime_ns() % 1_000_000_000;
    format!("{prefix}_{}_{nanos}", std::process::id())
}

pub async fn max_seq(database_url: &str, schema: &str) -> BenchResult<i64> {
    let client = eventrelay::connect(database_url).await?;
    let max = format!("SELECT coalesce(max(seq), 0) FROM {schema}.outbox");
    Ok(client.query_one(&max, &[]).await?.get(0))
}
