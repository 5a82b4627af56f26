//! The webhook store: the SQL behind subscriptions, and the deliveries table
//! that is both the delivery log and the dispatch queue.
//!
//! Deliveries are written by a trigger on the outbox (see
//! `migrations/0001_schema.sql`), so every way of emitting a durable event
//! writes them in the event's own transaction. Claiming takes a due row with
//! `FOR UPDATE SKIP LOCKED` and leases it; recording an attempt only counts
//! when the lease was still ours, so two workers never both settle one
//! attempt.
//!
//! Statuses and outcomes are bound as parameters, typed by
//! [`DeliveryStatus`] and [`AttemptOutcome`], except where a partial index
//! needs the status in the statement's text (see `pending_literal`).

use std::time::Duration;

use chrono::{DateTime, Utc};
use eventrelay_publisher::{Identifier, PgExecutor};
use tokio_postgres::Row;
use tokio_postgres::types::{ToSql, Type};

use super::model::{
    Attempt, AttemptOutcome, AttemptRecord, Claimed, Delivery, DeliveryFilter, DeliveryOrder,
    DeliveryStatus, MAX_PAGE, NewSubscription, PauseRule, Recorded, Subscription,
    SubscriptionHealth, SubscriptionPatch, SubscriptionWithHealth, TEST_EVENT_TYPE,
};
use crate::store::StoreError;

#[derive(Debug, Clone)]
pub struct WebhookStore {
    schema: Identifier,
}

const DELIVERY_COLUMNS: &str = "id, subscription_id, event_seq, event_id, event_type, scope_key, status, \
     attempts, next_attempt_at, last_status, last_error, created_at, updated_at, order_skipped";
const SUBSCRIPTION_COLUMNS: &str = "id, url, secret, previous_secret, previous_secret_expires_at, types, \
     scope_key, source, paused_at, paused_reason, max_per_second, ordering, ordering_max_block_secs, \
     created_at, updated_at";

/// The condition that keeps a paused subscription's deliveries (alias `d`)
/// out of the queue: out of claiming, of the next due time the dispatcher
/// sleeps until, and of the backlog it reports.
const NOT_PAUSED: &str = "NOT EXISTS (SELECT 1 FROM {schema}.webhook_subscriptions s
                        WHERE s.id = d.subscription_id AND s.paused_at IS NOT NULL)";

/// The condition that keeps a delivery (alias `d`) from being claimed
/// while its subscription's pace (`max_per_second`) has no room: its
/// schedule (`paced_until`, see `webhook_subscriptions` in the schema) is ahead of
/// now.
const PACED_NOW: &str = "NOT EXISTS (SELECT 1 FROM {schema}.webhook_subscriptions s
                        WHERE s.id = d.subscription_id AND s.paused_at IS NULL
                          AND s.max_per_second IS NOT NULL AND s.paced_until > now())";

/// The condition that holds a delivery (alias `d`) of an ordered
/// subscription back until its turn (see `webhook_subscriptions` in the schema): no
/// transaction that could still commit a lower seq of its key is running,
/// and it is its key's head (the key's pending delivery with the lowest
/// seq, found once per statement from the ordering index, so that a long
/// queue costs a hash lookup per row, not a probe), or every delivery of
/// its key ahead of it has held the key back past the subscription's
/// `ordering_max_block_secs` ([`WAITING_AHEAD`]).
const IN_ITS_TURN: &str = "(d.ordering_key IS NULL OR (
                            pg_snapshot_xmin(pg_current_snapshot()) >= d.ordered_after
                            AND (d.id IN (SELECT DISTINCT ON (h.subscription_id, h.ordering_key) h.id
                                          FROM {schema}.webhook_deliveries h
                                          WHERE h.status = 'pending' AND h.ordering_key IS NOT NULL
                                          ORDER BY h.subscription_id, h.ordering_key, h.event_seq)
                                 OR (EXISTS (SELECT 1 FROM {schema}.webhook_subscriptions s
                                             WHERE s.id = d.subscription_id
                                               AND s.ordering_max_block_secs IS NOT NULL)
                                     AND NOT EXISTS (SELECT 1 FROM {schema}.webhook_deliveries e
                                                     WHERE {WAITING_AHEAD})))))";

/// [`IN_ITS_TURN`] with [`WAITING_AHEAD`] in it.
fn in_its_turn() -> String {
    IN_ITS_TURN.replace("{WAITING_AHEAD}", WAITING_AHEAD)
}

/// A pending delivery `e` of `d`'s key, with a lower seq, that still holds
/// the key back: it has not been pending longer than the subscription's
/// `ordering_max_block_secs`.
const WAITING_AHEAD: &str = "e.subscription_id = d.subscription_id
                             AND e.ordering_key = d.ordering_key
                             AND e.status = 'pending' AND e.event_seq < d.event_seq
                             AND NOT coalesce(e.created_at < now() - interval '1 second' *
                                 (SELECT s.ordering_max_block_secs
                                  FROM {schema}.webhook_subscriptions s
                                  WHERE s.id = e.subscription_id), false)";

/// [`DeliveryStatus::Pending`] as an SQL literal, for the statements that
/// select due or finished deliveries. The schema's partial indexes on those
/// rows are conditioned on this status written as a literal, and serve only
/// a query that names it in its text too: for `status = $1` the generic
/// plan of a prepared statement cannot prove the index's condition, and
/// sorts every row of the status instead.
fn pending_literal() -> String {
    format!("'{}'", DeliveryStatus::Pending)
}

impl WebhookStore {
    pub fn new(schema: &Identifier) -> Self {
        WebhookStore {
            schema: schema.clone(),
        }
    }

    async fn rows(
        &self,
        db: &impl PgExecutor,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Vec<Row>, StoreError> {
        let sql = sql.replace("{schema}", self.schema.as_str());
        Ok(db.query_typed(&sql, params).await?)
    }

    /// Writes each configured subscription (creating or updating it) and
    /// removes none. In a rolling deploy a replica still running an older
    /// configuration must not delete what a newer one added, with its
    /// pending deliveries; removal is the explicit
    /// [`WebhookStore::remove_unlisted_config_subscriptions`].
    pub async fn sync_config_subscriptions(
        &self,
        db: &impl PgExecutor,
        subscriptions: &[NewSubscription],
    ) -> Result<(), StoreError> {
        for s in subscriptions {
            self.rows(
                db,
                "INSERT INTO {schema}.webhook_subscriptions
                     (id, url, secret, types, scope_key, max_per_second, ordering,
                      ordering_max_block_secs, source)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'config')
                 ON CONFLICT (id) DO UPDATE SET url = EXCLUDED.url, secret = EXCLUDED.secret,
                     types = EXCLUDED.types, scope_key = EXCLUDED.scope_key,
                     max_per_second = EXCLUDED.max_per_second, ordering = EXCLUDED.ordering,
                     ordering_max_block_secs = EXCLUDED.ordering_max_block_secs,
                     source = 'config', updated_at = now()",
                &[
                    (&s.id, Type::TEXT),
                    (&s.url, Type::TEXT),
                    (&s.secret.expose(), Type::TEXT),
                    (&s.types, Type::TEXT_ARRAY),
                    (&s.scope_key, Type::TEXT),
                    (&s.max_per_second, Type::INT4),
                    (&s.ordering.as_str(), Type::TEXT),
                    (&s.ordering_max_block_secs, Type::INT4),
                ],
            )
            .await?;
        }
        Ok(())
    }

    /// Deletes the `config` subscriptions not in `keep` and returns their
    /// ids. Their pending deliveries give up ([`AttemptOutcome::Gone`]) at
    /// their next attempt, so this is run once no replica's configuration
    /// lists them.
    pub async fn remove_unlisted_config_subscriptions(
        &self,
        db: &impl PgExecutor,
        keep: &[&str],
    ) -> Result<Vec<String>, StoreError> {
        let keep: Vec<&str> = keep.to_vec();
        let rows = self
            .rows(
                db,
                "DELETE FROM {schema}.webhook_subscriptions
                 WHERE source = 'config' AND NOT (id = ANY($1))
                 RETURNING id",
                &[(&keep, Type::TEXT_ARRAY)],
            )
            .await?;
        let mut removed: Vec<String> = rows.iter().map(|row| row.get(0)).collect();
        removed.sort();
        Ok(removed)
    }

    /// Creates a subscription; `None` when the id is taken.
    pub async fn create_subscription(
        &self,
        db: &impl PgExecutor,
        s: &NewSubscription,
    ) -> Result<Option<Subscription>, StoreError> {
        let rows = self
            .rows(
                db,
                &format!(
                    "INSERT INTO {{schema}}.webhook_subscriptions
                         (id, url, secret, types, scope_key, max_per_second, ordering,
                          ordering_max_block_secs)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (id) DO NOTHING
                     RETURNING {SUBSCRIPTION_COLUMNS}"
                ),
                &[
                    (&s.id, Type::TEXT),
                    (&s.url, Type::TEXT),
                    (&s.secret.expose(), Type::TEXT),
                    (&s.types, Type::TEXT_ARRAY),
                    (&s.scope_key, Type::TEXT),
                    (&s.max_per_second, Type::INT4),
                    (&s.ordering.as_str(), Type::TEXT),
                    (&s.ordering_max_block_secs, Type::INT4),
                ],
            )
            .await?;
        Ok(rows.first().map(subscription_from_row))
    }

    pub async fn list_subscriptions(
        &self,
        db: &impl PgExecutor,
    ) -> Result<Vec<Subscription>, StoreError> {
        let rows = self
            .rows(
                db,
                &format!("SELECT {SUBSCRIPTION_COLUMNS} FROM {{schema}}.webhook_subscriptions ORDER BY id"),
                &[],
            )
            .await?;
        Ok(rows.iter().map(subscription_from_row).collect())
    }

    /// Every subscription with its health, in one statement. Each figure
    /// reads an index: the last success is that of the subscription's newest
    /// delivered delivery, the failures are found by attempts' start time,
    /// and the pending deliveries by subscription.
    pub async fn list_subscriptions_with_health(
        &self,
        db: &impl PgExecutor,
    ) -> Result<Vec<SubscriptionWithHealth>, StoreError> {
        let rows = self
            .rows(
                db,
                &format!(
                    "SELECT {SUBSCRIPTION_COLUMNS},
                        (SELECT max(a.started_at) FROM {{schema}}.webhook_attempts a
                          WHERE a.outcome = $1
                            AND a.delivery_id = (SELECT max(id) FROM {{schema}}.webhook_deliveries
                                                  WHERE subscription_id = s.id AND status = $1)
                        ) AS last_success_at,
                        (SELECT count(*) FROM {{schema}}.webhook_attempts a
                           JOIN {{schema}}.webhook_deliveries d ON d.id = a.delivery_id
                          WHERE a.started_at > now() - interval '1 hour'
                            AND d.subscription_id = s.id AND a.outcome <> $1) AS failures_last_hour,
                        pending.oldest_due_at, pending.count AS pending
                     FROM {{schema}}.webhook_subscriptions s,
                     LATERAL (SELECT min(next_attempt_at) AS oldest_due_at, count(*) AS count
                                FROM {{schema}}.webhook_deliveries
                               WHERE subscription_id = s.id AND status = {pending}) pending
                     ORDER BY id",
                    pending = pending_literal()
                ),
                &[(&AttemptOutcome::Delivered, Type::TEXT)],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|row| SubscriptionWithHealth {
                subscription: subscription_from_row(row),
                health: SubscriptionHealth {
                    last_success_at: row.get("last_success_at"),
                    failures_last_hour: row.get("failures_last_hour"),
                    oldest_due_at: row.get("oldest_due_at"),
                    pending: row.get("pending"),
                },
            })
            .collect())
    }

    /// Pauses (`true`) or resumes a subscription; `None` when there is no
    /// such subscription. Pausing again keeps the first pause's time (and
    /// reason). Resuming clears the reason and the failures counted
    /// towards pausing it, so it starts over.
    pub async fn set_paused(
        &self,
        db: &impl PgExecutor,
        id: &str,
        paused: bool,
    ) -> Result<Option<Subscription>, StoreError> {
        let rows = self
            .rows(
                db,
                &format!(
                    "UPDATE {{schema}}.webhook_subscriptions
                     SET paused_at = CASE WHEN $2 THEN coalesce(paused_at, now()) END,
                         paused_reason = CASE WHEN $2 THEN paused_reason END,
                         failing_since = CASE WHEN $2 THEN failing_since END,
                         failures_since = CASE WHEN $2 THEN failures_since ELSE 0 END,
                         updated_at = now()
                     WHERE id = $1 RETURNING {SUBSCRIPTION_COLUMNS}"
                ),
                &[(&id, Type::TEXT), (&paused, Type::BOOL)],
            )
            .await?;
        Ok(rows.first().map(subscription_from_row))
    }

    pub async fn get_subscription(
        &self,
        db: &impl PgExecutor,
        id: &str,
    ) -> Result<Option<Subscription>, StoreError> {
        let rows = self
            .rows(
                db,
                &format!("SELECT {SUBSCRIPTION_COLUMNS} FROM {{schema}}.webhook_subscriptions WHERE id = $1"),
                &[(&id, Type::TEXT)],
            )
            .await?;
        Ok(rows.first().map(subscription_from_row))
    }

    pub async fn update_subscription(
        &self,
        db: &impl PgExecutor,
        id: &str,
        patch: &SubscriptionPatch,
    ) -> Result<Option<Subscription>, StoreError> {
        let clear_scope = matches!(patch.scope_key, Some(None));
        let scope_key = patch.scope_key.clone().flatten();
        let unlimited = matches!(patch.max_per_second, Some(None));
        let max_per_second = patch.max_per_second.flatten();
        let ordering = patch.ordering.map(DeliveryOrder::as_str);
        let unblocked = matches!(patch.ordering_max_block_secs, Some(None));
        let max_block = patch.ordering_max_block_secs.flatten();
        let rows = self
            .rows(
                db,
                &format!(
                    "UPDATE {{schema}}.webhook_subscriptions SET
                         url = coalesce($2, url),
                         types = coalesce($3, types),
                         scope_key = CASE WHEN $4 THEN NULL ELSE coalesce($5, scope_key) END,
                         max_per_second =
                             CASE WHEN $6 THEN NULL ELSE coalesce($7, max_per_second) END,
                         ordering = coalesce($8, ordering),
                         ordering_max_block_secs = CASE WHEN $9 THEN NULL
                                                       ELSE coalesce($10, ordering_max_block_secs) END,
                         updated_at = now()
                     WHERE id = $1 RETURNING {SUBSCRIPTION_COLUMNS}"
                ),
                &[
                    (&id, Type::TEXT),
                    (&patch.url, Type::TEXT),
                    (&patch.types, Type::TEXT_ARRAY),
                    (&clear_scope, Type::BOOL),
                    (&scope_key, Type::TEXT),
                    (&unlimited, Type::BOOL),
                    (&max_per_second, Type::INT4),
                    (&ordering, Type::TEXT),
                    (&unblocked, Type::BOOL),
                    (&max_block, Type::INT4),
                ],
            )
            .await?;
        Ok(rows.first().map(subscription_from_row))
    }

    /// Deletes a subscription; its pending deliveries give up on their next
    /// attempt.
    pub async fn delete_subscription(
        &self,
        db: &impl PgExecutor,
        id: &str,
    ) -> Result<bool, StoreError> {
        let rows = self
            .rows(
                db,
                "DELETE FROM {schema}.webhook_subscriptions WHERE id = $1 RETURNING id",
                &[(&id, Type::TEXT)],
            )
            .await?;
        Ok(!rows.is_empty())
    }

    /// Replaces the secret; the old one keeps signing for `grace`.
    pub async fn rotate_secret(
        &self,
        db: &impl PgExecutor,
        id: &str,
        new_secret: &str,
        grace: Duration,
    ) -> Result<Option<Subscription>, StoreError> {
        let until = Utc::now() + chrono::Duration::from_std(grace).unwrap_or_default();
        let rows = self
            .rows(
                db,
                &format!(
                    "UPDATE {{schema}}.webhook_subscriptions SET
                         previous_secret = secret, previous_secret_expires_at = $3,
                         secret = $2, updated_at = now()
                     WHERE id = $1 RETURNING {SUBSCRIPTION_COLUMNS}"
                ),
                &[
                    (&id, Type::TEXT),
                    (&new_secret, Type::TEXT),
                    (&until, Type::TIMESTAMPTZ),
                ],
            )
            .await?;
        Ok(rows.first().map(subscription_from_row))
    }

    /// Leases the most overdue pending delivery, if any is due.
    pub async fn claim(
        &self,
        db: &impl PgExecutor,
        lease: Duration,
    ) -> Result<Option<Claimed>, StoreError> {
        let lease_ms = lease.as_millis() as i64;
        let rows = self
            .rows(
                db,
                &format!(
                    "WITH due AS (
                         SELECT id, subscription_id FROM {{schema}}.webhook_deliveries d
                         WHERE status = {pending} AND next_attempt_at <= now()
                           AND (lease_expires_at IS NULL OR lease_expires_at <= now())
                           AND {NOT_PAUSED} AND {PACED_NOW} AND {in_its_turn}
                         -- Among deliveries due together, the oldest events
                         -- first: each key's head before the rest of it.
                         ORDER BY next_attempt_at, event_seq
                         LIMIT 1
                         FOR UPDATE SKIP LOCKED
                     ), paced AS (
                         UPDATE {{schema}}.webhook_subscriptions s
                         SET paced_until = greatest(s.paced_until, now())
                                           + interval '1 second' / s.max_per_second
                         FROM due
                         WHERE s.id = due.subscription_id AND s.max_per_second IS NOT NULL
                     )
                     UPDATE {{schema}}.webhook_deliveries d
                     SET lease_expires_at = now() + $1 * interval '1 millisecond',
                         attempts = d.attempts + 1, updated_at = now(),
                         order_skipped = d.order_skipped OR (d.ordering_key IS NOT NULL
                             AND EXISTS (SELECT 1 FROM {{schema}}.webhook_deliveries e
                                         WHERE e.subscription_id = d.subscription_id
                                           AND e.ordering_key = d.ordering_key
                                           AND e.status = 'pending'
                                           AND e.event_seq < d.event_seq))
                     FROM due WHERE d.id = due.id
                     RETURNING d.id, d.subscription_id, d.event_id, d.payload, d.attempts,
                               d.order_skipped AND d.attempts = 1 AND d.ordering_key IS NOT NULL,
                               d.traceparent",
                    pending = pending_literal(),
                    in_its_turn = in_its_turn(),
                ),
                &[(&lease_ms, Type::INT8)],
            )
            .await?;
        Ok(rows.first().map(|row| Claimed {
            id: row.get(0),
            subscription_id: row.get(1),
            event_id: row.get(2),
            payload: row.get(3),
            attempt: row.get(4),
            skipped_ahead: row.get(5),
            traceparent: row.get(6),
        }))
    }

    /// Records an attempt and settles the delivery. Returns false when the
    /// lease was lost meanwhile (another worker owns the delivery now).
    ///
    /// In the same statement the subscription's standing is kept: a
    /// success clears its failures, a failure counts (a 410 or a vanished
    /// subscription does neither), and a failure that makes every attempt
    /// failed for `rule.after`, `rule.attempts` of them at least, pauses it
    /// with the reason `failing` and, with `rule.events_scope`, writes the
    /// `eventrelay.subscription.paused` event to the outbox. One statement,
    /// so two relays recording at once cannot both pause it or both tell.
    pub async fn record(
        &self,
        db: &impl PgExecutor,
        claimed: &Claimed,
        record: &AttemptRecord,
        rule: &PauseRule,
    ) -> Result<Recorded, StoreError> {
        let status = record.outcome.delivery_status();
        let next = record.next_attempt_at.unwrap_or_else(Utc::now);
        let succeeded = record.outcome == AttemptOutcome::Delivered;
        let counts = record.outcome != AttemptOutcome::Gone;
        let after_secs = rule.after.as_secs_f64();
        let rows = self
            .rows(
                db,
                "WITH settled AS (
                     UPDATE {schema}.webhook_deliveries
                     SET status = $3, next_attempt_at = $4, lease_expires_at = NULL,
                         last_status = $5, last_error = $6, updated_at = now()
                     WHERE id = $1 AND attempts = $2 AND status = $10
                       AND lease_expires_at > now()
                     RETURNING id
                 ), attempt AS (
                     INSERT INTO {schema}.webhook_attempts
                         (delivery_id, attempt, started_at, duration_ms, status_code, error,
                          response, outcome)
                     SELECT id, $2, $7, $8, $5, $6, $11, $9 FROM settled
                     RETURNING delivery_id
                 ), standing AS (
                     UPDATE {schema}.webhook_subscriptions s SET
                         failing_since = CASE WHEN $12 THEN NULL
                                              ELSE coalesce(s.failing_since, $7) END,
                         failures_since = CASE WHEN $12 THEN 0 ELSE s.failures_since + 1 END,
                         paused_at = CASE WHEN {pausing} THEN now() ELSE s.paused_at END,
                         paused_reason = CASE WHEN {pausing} THEN 'failing'
                                              ELSE s.paused_reason END
                     FROM settled
                     WHERE s.id = $14 AND $13
                       AND (NOT $12 OR s.failing_since IS NOT NULL OR s.failures_since > 0)
                     RETURNING s.paused_reason = 'failing' AND s.paused_at = now() AS paused_now,
                               s.failing_since, s.failures_since
                 ), told AS (
                     INSERT INTO {schema}.outbox (id, type, scope_key, data, system)
                     SELECT gen_random_uuid(), 'eventrelay.subscription.paused', $17,
                            jsonb_build_object('subscriptionId', $14::text, 'reason', 'failing',
                                               'pausedAt', now(),
                                               'failingSince', standing.failing_since,
                                               'failures', standing.failures_since),
                            true
                     FROM standing WHERE standing.paused_now AND $17::text IS NOT NULL
                 )
                 SELECT (SELECT count(*) FROM attempt) > 0,
                        coalesce((SELECT bool_or(paused_now) FROM standing), false)"
                    .replace(
                        "{pausing}",
                        "(NOT $12 AND s.paused_at IS NULL
                          AND coalesce(s.failing_since, $7) <= now() - $15 * interval '1 second'
                          AND s.failures_since + 1 >= $16)",
                    )
                    .as_str(),
                &[
                    (&claimed.id, Type::INT8),
                    (&claimed.attempt, Type::INT4),
                    (&status, Type::TEXT),
                    (&next, Type::TIMESTAMPTZ),
                    (&record.status_code, Type::INT4),
                    (&record.error, Type::TEXT),
                    (&record.started_at, Type::TIMESTAMPTZ),
                    (&record.duration_ms, Type::INT4),
                    (&record.outcome, Type::TEXT),
                    (&DeliveryStatus::Pending, Type::TEXT),
                    (&record.response, Type::TEXT),
                    (&succeeded, Type::BOOL),
                    (&counts, Type::BOOL),
                    (&claimed.subscription_id, Type::TEXT),
                    (&after_secs, Type::FLOAT8),
                    (&rule.attempts, Type::INT4),
                    (&rule.events_scope, Type::TEXT),
                ],
            )
            .await?;
        let row = rows.first();
        Ok(Recorded {
            settled: row.is_some_and(|row| row.get(0)),
            paused: row.is_some_and(|row| row.get(1)),
        })
    }

    /// When the next pending delivery falls due (or its lease runs out, or
    /// its subscription's pace has room for it).
    pub async fn next_due(
        &self,
        db: &impl PgExecutor,
    ) -> Result<Option<DateTime<Utc>>, StoreError> {
        let rows = self
            .rows(
                db,
                &format!(
                    "SELECT min(greatest(d.next_attempt_at,
                                         coalesce(d.lease_expires_at, d.next_attempt_at),
                                         coalesce(s.paced_until, d.next_attempt_at),
                                         -- A key's head waiting for the transactions
                                         -- that could still commit ahead of it: look
                                         -- again shortly.
                                         CASE WHEN d.ordering_key IS NOT NULL
                                               AND pg_snapshot_xmin(pg_current_snapshot())
                                                   < d.ordered_after
                                              THEN now() + interval '50 milliseconds' END))
                     FROM (
                         SELECT * FROM {{schema}}.webhook_deliveries
                         WHERE status = {pending} AND ordering_key IS NULL
                         UNION ALL
                         -- Of an ordered key, only its head can be due.
                         (SELECT DISTINCT ON (subscription_id, ordering_key) *
                          FROM {{schema}}.webhook_deliveries
                          WHERE status = {pending} AND ordering_key IS NOT NULL
                          ORDER BY subscription_id, ordering_key, event_seq)
                     ) d
                     LEFT JOIN {{schema}}.webhook_subscriptions s
                       ON s.id = d.subscription_id AND s.max_per_second IS NOT NULL
                     WHERE {NOT_PAUSED}",
                    pending = pending_literal()
                ),
                &[],
            )
            .await?;
        Ok(rows.first().and_then(|row| row.get(0)))
    }

    /// Pending deliveries that are due and not leased to a worker, and
    /// how many seconds the oldest of them has been due (0 when none is).
    pub async fn due_backlog(&self, db: &impl PgExecutor) -> Result<(i64, f64), StoreError> {
        let rows = self
            .rows(
                db,
                &format!(
                    "SELECT count(*),
                            coalesce(extract(epoch FROM now() - min(next_attempt_at))::float8, 0)
                     FROM {{schema}}.webhook_deliveries d
                     WHERE status = {pending} AND next_attempt_at <= now()
                       AND (lease_expires_at IS NULL OR lease_expires_at <= now())
                       AND {NOT_PAUSED}",
                    pending = pending_literal()
                ),
                &[],
            )
            .await?;
        Ok(rows
            .first()
            .map(|row| (row.get(0), row.get(1)))
            .unwrap_or((0, 0.0)))
    }

    pub async fn list_deliveries(
        &self,
        db: &impl PgExecutor,
        filter: &DeliveryFilter,
    ) -> Result<Vec<Delivery>, StoreError> {
        let limit = filter.limit.unwrap_or(100).clamp(1, MAX_PAGE);
        let rows = self
            .rows(
                db,
                &format!(
                    "SELECT {DELIVERY_COLUMNS} FROM {{schema}}.webhook_deliveries
                     WHERE ($1::text IS NULL OR scope_key = $1)
                       AND ($2::text IS NULL OR status = $2)
                       AND ($3::uuid IS NULL OR event_id = $3)
                       AND ($4::text IS NULL OR subscription_id = $4)
                       AND ($5::bigint IS NULL OR id < $5)
                       AND ($7::text IS NULL OR event_type = $7)
                       AND ($8::timestamptz IS NULL OR created_at >= $8)
                       AND ($9::timestamptz IS NULL OR created_at < $9)
                       AND ($10::text IS NULL OR subscription_id IN (
                           SELECT s.id FROM {{schema}}.webhook_subscriptions s
                           WHERE s.scope_key = $10))
                     ORDER BY id DESC
                     LIMIT $6"
                ),
                &[
                    (&filter.scope_key, Type::TEXT),
                    (&filter.status, Type::TEXT),
                    (&filter.event_id, Type::UUID),
                    (&filter.subscription_id, Type::TEXT),
                    (&filter.before, Type::INT8),
                    (&limit, Type::INT8),
                    (&filter.event_type, Type::TEXT),
                    (&filter.since, Type::TIMESTAMPTZ),
                    (&filter.until, Type::TIMESTAMPTZ),
                    (&filter.subscriptions_of_scope, Type::TEXT),
                ],
            )
            .await?;
        Ok(rows
            .iter()
            .map(delivery_from_row)
            .collect::<Result<_, _>>()?)
    }

    /// One delivery with its attempts, oldest first.
    pub async fn get_delivery(
        &self,
        db: &impl PgExecutor,
        id: i64,
    ) -> Result<Option<(Delivery, Vec<Attempt>)>, StoreError> {
        let rows = self
            .rows(
                db,
                &format!(
                    "SELECT {DELIVERY_COLUMNS} FROM {{schema}}.webhook_deliveries WHERE id = $1"
                ),
                &[(&id, Type::INT8)],
            )
            .await?;
        let Some(delivery) = rows.first().map(delivery_from_row).transpose()? else {
            return Ok(None);
        };
        let attempts = self
            .rows(
                db,
                "SELECT attempt, started_at, duration_ms, status_code, error, outcome, response
                 FROM {schema}.webhook_attempts WHERE delivery_id = $1 ORDER BY id",
                &[(&id, Type::INT8)],
            )
            .await?
            .iter()
            .map(|row| {
                Ok(Attempt {
                    attempt: row.get(0),
                    started_at: row.get(1),
                    duration_ms: row.get(2),
                    status_code: row.get(3),
                    error: row.get(4),
                    outcome: row.try_get::<_, AttemptOutcome>(5)?,
                    response: row.get(6),
                })
            })
            .collect::<Result<_, tokio_postgres::Error>>()?;
        Ok(Some((delivery, attempts)))
    }

    /// Queues an `eventrelay.test` event to one subscription only: a
    /// delivery of its own, with seq 0 (no outbox row stands behind it),
    /// due now. Answers the delivery's id.
    pub async fn send_test(
        &self,
        db: &impl PgExecutor,
        subscription: &Subscription,
        scope_key: &str,
    ) -> Result<i64, StoreError> {
        let event_id = uuid::Uuid::now_v7();
        let payload = serde_json::json!({
            "id": event_id,
            "type": TEST_EVENT_TYPE,
            "scopeKey": scope_key,
            "lane": "ephemeral",
            "data": {"message": "a test event, sent on request to this endpoint only"},
            "resources": [],
            "occurredAt": Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
        });
        let rows = self
            .rows(
                db,
                "INSERT INTO {schema}.webhook_deliveries
                     (subscription_id, event_seq, event_id, event_type, scope_key, payload)
                 VALUES ($1, 0, $2, $3, $4, $5) RETURNING id",
                &[
                    (&subscription.id, Type::TEXT),
                    (&event_id, Type::UUID),
                    (&TEST_EVENT_TYPE, Type::TEXT),
                    (&scope_key, Type::TEXT),
                    (&payload, Type::JSONB),
                ],
            )
            .await?;
        rows.first()
            .map(|row| row.get(0))
            .ok_or(StoreError::NoRow("INSERT INTO webhook_deliveries"))
    }

    /// Puts a delivery back in the queue with a fresh schedule.
    pub async fn redeliver(&self, db: &impl PgExecutor, id: i64) -> Result<bool, StoreError> {
        let rows = self
            .rows(
                db,
                "UPDATE {schema}.webhook_deliveries
                 SET status = $2, attempts = 0, next_attempt_at = now(),
                     lease_expires_at = NULL, ordering_key = NULL, updated_at = now()
                 WHERE id = $1 RETURNING id",
                &[(&id, Type::INT8), (&DeliveryStatus::Pending, Type::TEXT)],
            )
            .await?;
        Ok(!rows.is_empty())
    }

    /// Puts a subscription's dead deliveries created since `since` back in
    /// the queue, each with a fresh schedule, and says how many.
    pub async fn redeliver_failed(
        &self,
        db: &impl PgExecutor,
        subscription_id: &str,
        since: DateTime<Utc>,
    ) -> Result<u64, StoreError> {
        let rows = self
            .rows(
                db,
                "WITH again AS (
                     UPDATE {schema}.webhook_deliveries
                     SET status = $3, attempts = 0, next_attempt_at = now(),
                         lease_expires_at = NULL, ordering_key = NULL, updated_at = now()
                     WHERE subscription_id = $1 AND created_at >= $2 AND status = $4
                     RETURNING 1
                 ) SELECT count(*) FROM again",
                &[
                    (&subscription_id, Type::TEXT),
                    (&since, Type::TIMESTAMPTZ),
                    (&DeliveryStatus::Pending, Type::TEXT),
                    (&DeliveryStatus::Dead, Type::TEXT),
                ],
            )
            .await?;
        Ok(rows
            .first()
            .map(|row| row.get::<_, i64>(0) as u64)
            .unwrap_or(0))
    }

    /// Deletes at most `limit` finished deliveries past their retention,
    /// with their attempts: delivered and gone ones last changed before
    /// `finished_before`, dead ones before `dead_before`. The oldest go
    /// first; rows another session holds are skipped, so a batch never
    /// waits on a lock, and a small batch holds its own locks briefly.
    pub async fn prune_past_retention(
        &self,
        db: &impl PgExecutor,
        finished_before: DateTime<Utc>,
        dead_before: DateTime<Utc>,
        limit: i64,
    ) -> Result<u64, StoreError> {
        let rows = self
            .rows(
                db,
                "WITH doomed AS (
                     SELECT id FROM {schema}.webhook_deliveries
                     WHERE status <> 'pending'
                       AND updated_at < greatest($1, $2)
                       AND updated_at < CASE WHEN status = 'dead' THEN $2 ELSE $1 END
                     ORDER BY updated_at
                     LIMIT $3
                     FOR UPDATE SKIP LOCKED
                 ), gone AS (
                     DELETE FROM {schema}.webhook_deliveries d USING doomed
                     WHERE d.id = doomed.id RETURNING 1
                 ) SELECT count(*) FROM gone",
                &[
                    (&finished_before, Type::TIMESTAMPTZ),
                    (&dead_before, Type::TIMESTAMPTZ),
                    (&limit, Type::INT8),
                ],
            )
            .await?;
        Ok(rows
            .first()
            .map(|row| row.get::<_, i64>(0) as u64)
            .unwrap_or(0))
    }

    /// Deletes finished deliveries (and their attempts) last changed before
    /// `before`; pending ones are kept.
    pub async fn prune_deliveries(
        &self,
        db: &impl PgExecutor,
        before: DateTime<Utc>,
    ) -> Result<u64, StoreError> {
        let rows = self
            .rows(
                db,
                &format!(
                    "WITH gone AS (
                         DELETE FROM {{schema}}.webhook_deliveries
                         WHERE status <> {pending} AND updated_at < $1 RETURNING 1
                     ) SELECT count(*) FROM gone",
                    pending = pending_literal()
                ),
                &[(&before, Type::TIMESTAMPTZ)],
            )
            .await?;
        Ok(rows
            .first()
            .map(|row| row.get::<_, i64>(0) as u64)
            .unwrap_or(0))
    }
}

fn subscription_from_row(row: &Row) -> Subscription {
    Subscription {
        id: row.get("id"),
        url: row.get("url"),
        secret: row.get("secret"),
        previous_secret: row.get("previous_secret"),
        previous_secret_expires_at: row.get("previous_secret_expires_at"),
        types: row.get("types"),
        scope_key: row.get("scope_key"),
        source: row.get("source"),
        paused_at: row.get("paused_at"),
        paused_reason: row.get("paused_reason"),
        max_per_second: row.get("max_per_second"),
        ordering: row.get::<_, &str>("ordering").parse().unwrap_or_default(),
        ordering_max_block_secs: row.get("ordering_max_block_secs"),
        created_at: row.get("created_at"),
        updated_at: row.get("updated_at"),
    }
}

/// A delivery row; an error only for a status no [`DeliveryStatus`] names
/// (which the schema's CHECK constraint keeps out).
fn delivery_from_row(row: &Row) -> Result<Delivery, tokio_postgres::Error> {
    Ok(Delivery {
        id: row.get("id"),
        subscription_id: row.get("subscription_id"),
        event_seq: row.get("event_seq"),
        event_id: row.get("event_id"),
        event_type: row.get("event_type"),
        scope_key: row.get("scope_key"),
        status: row.try_get("status")?,
        attempts: row.get("attempts"),
        next_attempt_at: row.get("next_attempt_at"),
        last_status: row.get("last_status"),
        last_error: row.get("last_error"),
        created_at: row.get("created_at"),
        updated_at: row.get("updated_at"),
        order_skipped: row.get("order_skipped"),
    })
}
