//! The bench's own schema (and channel of the same name): created with the
//! relay's migrations before a run, dropped after it.

use eventrelay::publisher::Identifier;

use crate::BenchResult;

/// Creates and migrates `schema`, notifying on a channel of the same name.
pub async fn create_schema(database_url: &str, schema: &str) -> BenchResult<()> {
    let mut client = eventrelay::connect(database_url).await?;
    let name = Identifier::new(schema)?;
    eventrelay::store::migrate(&mut client, &name, &name).await?;
    Ok(())
}

/// Drops `schema` and everything in it; reports rather than fails.
pub async fn drop_schema(database_url: &str, schema: &str) {
    let dropped = match eventrelay::connect(database_url).await {
        Ok(client) => client
            .batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
            .await
            .map_err(|e| e.to_string()),
        Err(error) => Err(error.to_string()),
    };
    if let Err(error) = dropped {
        eprintln!("could not drop schema {schema}: {error}");
    }
}
