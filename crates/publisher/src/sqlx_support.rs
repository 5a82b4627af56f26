//! Emitting through sqlx: the same SQL function as the tokio-postgres path,
//! with values bound as text so no sqlx type features are needed.

use eventrelay_wire::{EventEnvelope, Lane, NewEvent, encode_inline_within};

use crate::publisher::{PublishError, Publisher};

impl Publisher {
    /// Emits `event` on a sqlx connection; pass `&mut *tx` for a transaction.
    ///
    /// Behaves exactly like [`Publisher::emit`].
    pub async fn emit_sqlx(
        &self,
        conn: &mut sqlx::PgConnection,
        event: NewEvent,
    ) -> Result<EventEnvelope, PublishError> {
        let mut envelope = self.prepare(event)?;
        let (emit_sql, notify_sql) = self.sqlx_statements();
        match envelope.lane {
            Lane::Durable => {
                let audience = envelope
                    .audience
                    .as_ref()
                    .map(|a| serde_json::to_string(a).unwrap_or_default());
                let seq: i64 = sqlx::query_scalar(emit_sql)
                    .bind(&envelope.event_type)
                    .bind(&envelope.scope_key)
                    .bind(envelope.data.to_string())
                    .bind(audience)
                    .bind(&envelope.resources)
                    .bind(envelope.id.to_string())
                    .bind(envelope.occurred_at.to_rfc3339())
                    .bind(&envelope.traceparent)
                    .fetch_one(conn)
                    .await?;
                envelope.seq = Some(seq);
            }
            Lane::Ephemeral => {
                let payload = encode_inline_within(&envelope, self.ephemeral_max_bytes())?;
                sqlx::query(notify_sql).bind(payload).execute(conn).await?;
            }
        }
        Ok(envelope)
    }
}
