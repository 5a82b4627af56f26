//! Minting customer portal sessions from the application's own code: the
//! same SQL function the relay's admin API calls, so an application that
//! emits events can send a customer to `/portal` without the admin token.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio_postgres::types::Type;

use crate::{PgExecutor, PublishError, Publisher};

/// The page's look: CSS variables the relay applies. The database refuses
/// anything but a hex colour and a plain `font-family` list.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PortalTheme {
    /// A hex colour such as `#0a7` or `#00aa77`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub accent: Option<String>,
    /// A `font-family` list such as `"Inter", sans-serif`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub font: Option<String>,
}

/// A minted session: its one-time code (good for five minutes, or the
/// session's life if shorter) and when the session ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortalSession {
    pub code: String,
    pub expires_at: DateTime<Utc>,
}

impl PortalSession {
    /// The page's address on the relay at `relay_base` (as the customer's
    /// browser reaches it), with the code after `#`, which browsers never
    /// send to a server.
    pub fn url(&self, relay_base: &str) -> String {
        format!(
            "{}/portal#code={}",
            relay_base.trim_end_matches('/'),
            self.code
        )
    }
}

impl Publisher {
    /// Mints a portal session for the customer of `scope_key`, lasting
    /// `expires_in` (at most a week, whole seconds).
    pub async fn portal_session<C: PgExecutor>(
        &self,
        client: &C,
        scope_key: &str,
        expires_in: Duration,
        theme: Option<&PortalTheme>,
    ) -> Result<PortalSession, PublishError> {
        eventrelay_wire::validate_scope_key(scope_key)?;
        let secs = i32::try_from(expires_in.as_secs()).unwrap_or(i32::MAX);
        let theme = theme.map(|t| serde_json::to_value(t).unwrap_or_default());
        let sql = format!(
            "SELECT code, expires_at FROM {}.portal_session($1, $2, $3)",
            self.schema()
        );
        let rows = client
            .query_typed(
                &sql,
                &[
                    (&scope_key, Type::TEXT),
                    (&secs, Type::INT4),
                    (&theme, Type::JSONB),
                ],
            )
            .await?;
        let row = rows.first().ok_or(PublishError::NoRow("portal_session"))?;
        Ok(PortalSession {
            code: row.get(0),
            expires_at: row.get(1),
        })
    }
}
