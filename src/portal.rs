//! The customer portal's sessions: one of the application's customers (a
//! scope) manages that scope's webhook subscriptions from `/portal`.
//!
//! The application mints a session (the SQL function `portal_session`,
//! which the admin API and the publisher crate both call) and gives the
//! customer's browser the one-time code it returns. The page exchanges the
//! code, once, for a bearer token bound to the scope until the session
//! ends. Both live in Postgres as SHA-256 hashes, so any relay takes any
//! session and a copy of the table lets no one in.

use chrono::{DateTime, Utc};
use eventrelay_publisher::{Identifier, PgExecutor};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio_postgres::types::Type;
use uuid::Uuid;

use crate::store::StoreError;

/// The longest session the SQL function mints: a week.
pub const MAX_SESSION_SECS: u32 = 604_800;

/// The page's look, given at minting: CSS variables, each checked against
/// a pattern that lets no CSS of its own through.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Theme {
    /// A hex colour: `#abc` or `#aabbcc`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accent: Option<String>,
    /// A `font-family` list: letters, digits, spaces, commas, quotes and
    /// hyphens, at most 100 characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub font: Option<String>,
}

impl Theme {
    /// The same rules as the table's constraint, with messages that name
    /// the field.
    pub fn check(&self) -> Result<(), String> {
        if let Some(accent) = &self.accent {
            let hex = accent.strip_prefix('#').unwrap_or("");
            if !matches!(hex.len(), 3 | 6) || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
                return Err(format!(
                    "theme.accent: {accent:?} is not a hex colour such as #0a7 or #00aa77"
                ));
            }
        }
        if let Some(font) = &self.font {
            let allowed = |c: char| c.is_ascii_alphanumeric() || " ,'\"-".contains(c);
            if font.is_empty() || font.len() > 100 || !font.chars().all(allowed) {
                return Err(format!(
                    "theme.font: {font:?} must be a font-family list of at most 100 letters, \
                     digits, spaces, commas, quotes and hyphens"
                ));
            }
        }
        Ok(())
    }
}

/// A session the page holds a token of.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PortalSession {
    pub scope_key: String,
    pub expires_at: DateTime<Utc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub theme: Option<Theme>,
}

/// A freshly minted session's one-time code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MintedSession {
    pub code: String,
    pub expires_at: DateTime<Utc>,
}

/// The portal's sessions in one schema.
#[derive(Debug, Clone)]
pub struct PortalStore {
    mint_sql: String,
    exchange_sql: String,
    session_sql: String,
    prune_sql: String,
}

impl PortalStore {
    pub fn new(schema: &Identifier) -> Self {
        PortalStore {
            mint_sql: format!("SELECT code, expires_at FROM {schema}.portal_session($1, $2, $3)"),
            exchange_sql: format!(
                "UPDATE {schema}.portal_sessions SET code_hash = NULL, token_hash = $2
                 WHERE code_hash = $1 AND code_expires_at > now() AND expires_at > now()
                 RETURNING scope_key, expires_at, theme"
            ),
            session_sql: format!(
                "SELECT scope_key, expires_at, theme FROM {schema}.portal_sessions
                 WHERE token_hash = $1 AND expires_at > now()"
            ),
            prune_sql: format!(
                "DELETE FROM {schema}.portal_sessions WHERE expires_at < now() - interval '1 day'
                 RETURNING id"
            ),
        }
    }

    /// Mints a session of `scope_key` for `expires_in_secs`.
    pub async fn mint(
        &self,
        db: &impl PgExecutor,
        scope_key: &str,
        expires_in_secs: u32,
        theme: Option<&Theme>,
    ) -> Result<MintedSession, StoreError> {
        let secs = i32::try_from(expires_in_secs).unwrap_or(i32::MAX);
        let theme = theme.map(|t| serde_json::to_value(t).unwrap_or_default());
        let rows = db
            .query_typed(
                &self.mint_sql,
                &[
                    (&scope_key, Type::TEXT),
                    (&secs, Type::INT4),
                    (&theme, Type::JSONB),
                ],
            )
            .await?;
        let row = rows
            .first()
            .ok_or(StoreError::NoRow("SELECT portal_session(...)"))?;
        Ok(MintedSession {
            code: row.get(0),
            expires_at: row.get(1),
        })
    }

    /// Exchanges a one-time code for a token, once; `None` when the code is
    /// unknown, used or expired.
    pub async fn exchange(
        &self,
        db: &impl PgExecutor,
        code: &str,
    ) -> Result<Option<(String, PortalSession)>, StoreError> {
        let token = new_token();
        let rows = db
            .query_typed(
                &self.exchange_sql,
                &[(&digest(code), Type::BYTEA), (&digest(&token), Type::BYTEA)],
            )
            .await?;
        Ok(rows.first().map(|row| (token, session_from_row(row))))
    }

    /// The live session a token belongs to.
    pub async fn session(
        &self,
        db: &impl PgExecutor,
        token: &str,
    ) -> Result<Option<PortalSession>, StoreError> {
        let rows = db
            .query_typed(&self.session_sql, &[(&digest(token), Type::BYTEA)])
            .await?;
        Ok(rows.first().map(session_from_row))
    }

    /// Deletes sessions a day past their end.
    pub async fn prune(&self, db: &impl PgExecutor) -> Result<u64, StoreError> {
        Ok(db.query_typed(&self.prune_sql, &[]).await?.len() as u64)
    }
}

fn session_from_row(row: &tokio_postgres::Row) -> PortalSession {
    let theme: Option<serde_json::Value> = row.get(2);
    PortalSession {
        scope_key: row.get(0),
        expires_at: row.get(1),
        theme: theme.and_then(|t| serde_json::from_value(t).ok()),
    }
}

/// A bearer token: 244 random bits (two v4 UUIDs, from the operating
/// system's random source), as hex.
fn new_token() -> String {
    format!("{}{}", Uuid::new_v4().simple(), Uuid::new_v4().simple())
}

fn digest(secret: &str) -> Vec<u8> {
    Sha256::digest(secret.as_bytes()).to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_theme_takes_colours_and_font_lists_only() {
        let theme = |accent: Option<&str>, font: Option<&str>| Theme {
            accent: accent.map(Into::into),
            font: font.map(Into::into),
        };
        assert!(
            theme(Some("#0a7"), Some("\"Inter\", sans-serif"))
                .check()
                .is_ok()
        );
        assert!(theme(Some("#00AA77"), None).check().is_ok());
        for bad in ["red", "#0a7;", "#12345", "#ggg", "0a7"] {
            assert!(theme(Some(bad), None).check().is_err(), "{bad}");
        }
        for bad in ["a;b", "x}body{color:red", "", &"a".repeat(101)] {
            assert!(theme(None, Some(bad)).check().is_err(), "{bad}");
        }
    }

    #[test]
    fn tokens_are_long_and_never_repeat() {
        let (a, b) = (new_token(), new_token());
        assert_eq!(a.len(), 64);
        assert_ne!(a, b);
        assert_ne!(digest(&a), digest(&b));
    }
}
