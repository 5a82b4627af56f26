//! eventrelay as a library: the Postgres side of the service (migrations and
//! the outbox read side). The relay, its HTTP API and the webhook dispatcher
//! build on these.

pub mod store;

pub use eventrelay_publisher as publisher;
pub use eventrelay_wire as wire;

/// Opens one Postgres connection and drives it on the current runtime.
pub async fn connect(database_url: &str) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let (client, connection) = tokio_postgres::connect(database_url, tokio_postgres::NoTls).await?;
    tokio::spawn(async move {
        if let Err(error) = connection.await {
            tracing::warn!(%error, "postgres connection closed with an error");
        }
    });
    Ok(client)
}
