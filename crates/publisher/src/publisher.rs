//! Emitting events inside the caller's transaction.
//!
//! A durable emit calls the `emit` SQL function the migrations install: it
//! inserts the outbox row and its trigger queues the pointer notification,
//! all on the caller's connection, so COMMIT publishes both and ROLLBACK
//! discards both. Errors are returned, never swallowed: inside a transaction
//! an error must reach the caller so it rolls back.
//!
//! A batch is one call of the `emit_batch` SQL function for all its
//! durable rows. Both functions run as the schema's owner, so an emitting
//! role needs only EXECUTE on them.
//!
//! The relay's own publish API, whose role may write the outbox, goes
//! further ([`Publisher::announcing_rows`]): one `INSERT` whose statement
//! announces its rows itself. The envelopes are built here, split around
//! the seq the database has yet to assign, and the statement joins them to
//! the seqs and sends the carrying pointers, so the trigger, which would
//! build every envelope again in SQL, has nothing left to do for it.

use std::sync::Arc;

use chrono::Utc;
use eventrelay_wire::{
    EncodeError, EnvelopeAroundSeq, EnvelopeError, EventEnvelope, Lane, MAX_NOTIFY_PAYLOAD_BYTES,
    NewEvent, assign_to_pointers, encode_inline_batch_within, encode_inline_within,
};
use tokio_postgres::types::{ToSql, Type};

use crate::executor::PgExecutor;
use crate::identifier::{Identifier, IdentifierError};
use crate::registry::{SchemaError, SchemaRegistry};

/// The schema eventrelay's tables live in unless configured otherwise.
pub const DEFAULT_SCHEMA: &str = "eventrelay";

/// Why an emit did not happen. Nothing was written in every case.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("invalid event: {0}")]
    InvalidEvent(#[from] EnvelopeError),
    #[error(transparent)]
    Schema(#[from] SchemaError),
    #[error("cannot send the event: {0}")]
    Encode(#[from] EncodeError),
    #[error("database error while emitting: {0}")]
    Database(#[from] tokio_postgres::Error),
    #[cfg(feature = "sqlx")]
    #[error("database error while emitting: {0}")]
    Sqlx(#[from] sqlx::Error),
    #[error("invalid schema name: {0}")]
    SchemaName(#[from] IdentifierError),
    #[error("the database answered no row to {0}")]
    NoRow(&'static str),
}

/// Why [`Publisher::emit_batch`] wrote nothing: the event at `index` was
/// refused (for a database error on the shared statement, `index` is 0 and
/// the error says which row, when the database does).
#[derive(Debug, thiserror::Error)]
#[error("event {index}: {error}")]
pub struct BatchError {
    pub index: usize,
    #[source]
    pub error: PublishError,
}

/// Emits events into one eventrelay schema.
///
/// Cheap to clone; build one at start and share it.
#[derive(Debug, Clone)]
pub struct Publisher {
    schema: Identifier,
    registry: Option<Arc<SchemaRegistry>>,
    emit_sql: Arc<str>,
    emit_batch_sql: Arc<str>,
    emit_batch_announced_sql: Arc<str>,
    /// Whether batches announce their own rows (see [`Self::announcing_rows`]).
    announce_rows: bool,
    notify_sql: Arc<str>,
    /// The same, also turning the flush at COMMIT off for the transaction
    /// (see [`Self::unflushed_ephemeral_commits`]).
    notify_unflushed_sql: Arc<str>,
    /// Whether a batch of nothing but ephemeral events commits without
    /// waiting for its WAL to reach disk.
    unflushed_ephemeral: bool,
    /// Largest encoded ephemeral payload: under the NOTIFY limit unless the
    /// schema's relays are woken by logical decoding.
    ephemeral_max_bytes: usize,
    /// sqlx binds everything as text, so its statement casts explicitly.
    #[cfg(feature = "sqlx")]
    sqlx_emit_sql: Arc<str>,
}

impl Publisher {
    /// A publisher for the tables in `schema` (see [`DEFAULT_SCHEMA`]).
    pub fn new(schema: &str) -> Result<Self, PublishError> {
        let schema = Identifier::new(schema)?;
        // One statement for a whole batch. Resources travel as JSON arrays
        // because SQL arrays of arrays must not be ragged.
        // Its rows are marked `announced`, so the outbox trigger leaves
        // them to the statement's own pointers. The transaction takes its
        // id before the rows their seqs (`id_first`), as `emit` does, which
        // ordered webhook delivery relies on.
        let insert = format!(
            "INSERT INTO {schema}.outbox (id, type, scope_key, data, audience, resources, occurred_at,
                                          traceparent, announced)
             SELECT e.id, e.type, e.scope_key, e.data, e.audience,
                    ARRAY(SELECT jsonb_array_elements_text(e.resources)), e.occurred_at,
                    e.traceparent, true
             FROM (SELECT pg_current_xact_id()) AS id_first,
                  unnest($1::uuid[], $2::text[], $3::text[], $4::jsonb[], $5::jsonb[],
                         $6::jsonb[], $7::timestamptz[], $8::text[])
                  WITH ORDINALITY AS e(id, type, scope_key, data, audience, resources, occurred_at,
                                       traceparent, n)
             ORDER BY e.n"
        );
        Ok(Publisher {
            emit_sql: format!("SELECT {schema}.emit($1, $2, $3, $4, $5, $6, $7, $8)").into(),
            emit_batch_sql: format!(
                "SELECT id, seq FROM {schema}.emit_batch($1, $2, $3, $4, $5, $6, $7, $8)"
            )
            .into(),
            announce_rows: false,
            // The same INSERT, its rows announced by the statement itself
            // from envelope parts built here ($9 to $11); the database
            // only joins them around the seqs (see `outbox_announce_rows`).
            emit_batch_announced_sql: format!(
                "WITH written AS ({insert} RETURNING id, seq),
                 announced AS MATERIALIZED (
                     SELECT {schema}.outbox_announce_rows(array_agg(id), array_agg(seq),
                                                          $1, $3, $9, $10, $11)
                     FROM written)
                 SELECT written.id, written.seq FROM written, announced"
            )
            .into(),
            notify_sql: format!("SELECT {schema}.notify_inline($1)").into(),
            // `synchronous_commit` is read at COMMIT, so setting it anywhere
            // in the transaction applies; in the same statement it costs
            // nothing more on the wire.
            notify_unflushed_sql: format!(
                "SELECT {schema}.notify_inline($1), \
                 set_config('synchronous_commit', 'off', true)"
            )
            .into(),
            unflushed_ephemeral: false,
            #[cfg(feature = "sqlx")]
            sqlx_emit_sql: format!(
                "SELECT {schema}.emit($1, $2, $3::text::jsonb, $4::text::jsonb, $5, \
                 $6::text::uuid, $7::text::timestamptz, $8)"
            )
            .into(),
            schema,
            registry: None,
            ephemeral_max_bytes: MAX_NOTIFY_PAYLOAD_BYTES,
        })
    }

    /// Makes batches one `INSERT` that announces its own rows from
    /// envelopes built here, instead of a call of `emit_batch` whose trigger
    /// builds them again in SQL: less work for the database per event. Only
    /// for a role trusted with the outbox, such as the relay's: it needs
    /// INSERT on `outbox` and EXECUTE on `outbox_announce_rows`, which let
    /// it announce rows as anything it likes.
    pub fn announcing_rows(mut self) -> Self {
        self.announce_rows = true;
        self
    }

    /// Makes [`emit_batch_committed`](Self::emit_batch_committed) commit a
    /// batch of nothing but ephemeral events without waiting for the
    /// commit's WAL flush (`synchronous_commit = off` for that transaction
    /// only). Such a transaction writes nothing that must outlive a crash,
    /// and its notifications are delivered at COMMIT either way, so the
    /// flush only added its time to every ephemeral event. Only for the
    /// notify wake-up mode: in logical mode relays read a message once its
    /// WAL is flushed, which an unflushed commit leaves to the WAL writer's
    /// next round (up to `wal_writer_delay`).
    pub fn unflushed_ephemeral_commits(mut self) -> Self {
        self.unflushed_ephemeral = true;
        self
    }

    /// Raises (or lowers) the cap on an encoded ephemeral event, which is
    /// just under 8000 bytes by default because `NOTIFY` refuses more.
    /// Raise it only for a schema migrated for the logical wake-up mode,
    /// where ephemeral events travel as logical replication messages; in
    /// notify mode Postgres refuses larger payloads at emit.
    pub fn with_ephemeral_max_bytes(mut self, max: usize) -> Self {
        self.ephemeral_max_bytes = max;
        self
    }

    /// The cap on an encoded ephemeral event (see
    /// [`with_ephemeral_max_bytes`](Self::with_ephemeral_max_bytes)).
    pub fn ephemeral_max_bytes(&self) -> usize {
        self.ephemeral_max_bytes
    }

    /// Makes emit typed: only event types in `registry` are accepted, and
    /// their data must match their schema.
    pub fn with_registry(mut self, registry: SchemaRegistry) -> Self {
        self.registry = Some(Arc::new(registry));
        self
    }

    /// The schema this publisher writes to.
    pub fn schema(&self) -> &Identifier {
        &self.schema
    }

    /// Emits `event` on `client`, which should be the transaction of the
    /// write the event announces.
    ///
    /// Durable events become an outbox row plus a pointer notification;
    /// ephemeral events become one inline notification and no row. Either is
    /// delivered at COMMIT when `client` is a transaction, and at once when it
    /// is a plain connection. Returns the envelope as subscribers will see it.
    pub async fn emit<C: PgExecutor>(
        &self,
        client: &C,
        event: NewEvent,
    ) -> Result<EventEnvelope, PublishError> {
        let mut envelope = self.prepare(event)?;
        match envelope.lane {
            Lane::Durable => {
                let row = DurableRow::of(&envelope);
                let rows = client.query_typed(&self.emit_sql, &row.params()).await?;
                envelope.seq = rows.first().and_then(|row| row.get::<_, Option<i64>>(0));
            }
            Lane::Ephemeral => {
                let payload = encode_inline_within(&envelope, self.ephemeral_max_bytes)?;
                client
                    .query_typed(&self.notify_sql, &[(&payload, Type::TEXT)])
                    .await?;
            }
        }
        Ok(envelope)
    }

    /// Emits many events on `client` with one statement for all durable
    /// ones, in order: far fewer round trips than one [`emit`](Self::emit)
    /// per event, for bulk producers and batched publishing. Every event is
    /// validated before anything is written; the first invalid one fails
    /// the whole call with its index. Ephemeral events are sent inline, as
    /// by `emit`.
    pub async fn emit_batch<C: PgExecutor>(
        &self,
        client: &C,
        events: Vec<NewEvent>,
    ) -> Result<Vec<EventEnvelope>, BatchError> {
        let prepared = self.prepare_batch(events)?;
        self.emit_prepared(client, prepared).await
    }

    /// Like [`emit_batch`](Self::emit_batch), in a transaction of its own
    /// on `client`, a connection outside any transaction: `BEGIN`, the
    /// batch's statements and `COMMIT` go to the server together, so the
    /// whole batch costs one round trip instead of three. Returns once the
    /// transaction has committed; on any error nothing was written (a
    /// failed statement turns the `COMMIT` into a rollback).
    ///
    /// This relies on `client` sending each statement when its future is
    /// first polled, as tokio-postgres does (see [`PgExecutor`]).
    pub async fn emit_batch_committed<C: PgExecutor>(
        &self,
        client: &C,
        events: Vec<NewEvent>,
    ) -> Result<Vec<EventEnvelope>, BatchError> {
        let prepared = self.prepare_batch(events)?;
        self.emit_prepared_committed(client, prepared).await
    }

    /// Validates `events` and gives each its id and time, without writing
    /// anything: what [`emit_batch`](Self::emit_batch) does first. The
    /// envelopes are final, so a caller may act on them (deliver them to
    /// its own subscribers, say) before it writes them with
    /// [`emit_prepared`](Self::emit_prepared) or
    /// [`emit_prepared_committed`](Self::emit_prepared_committed). The
    /// first invalid event fails the whole call with its index.
    pub fn prepare_batch(&self, events: Vec<NewEvent>) -> Result<PreparedBatch, BatchError> {
        let mut envelopes = Vec::with_capacity(events.len());
        for (index, event) in events.into_iter().enumerate() {
            envelopes.push(
                self.prepare(event)
                    .map_err(|error| BatchError { index, error })?,
            );
        }
        Ok(PreparedBatch { envelopes })
    }

    /// [`emit_batch`](Self::emit_batch) for a prepared batch, on `client`'s
    /// transaction.
    pub async fn emit_prepared<C: PgExecutor>(
        &self,
        client: &C,
        prepared: PreparedBatch,
    ) -> Result<Vec<EventEnvelope>, BatchError> {
        let batch = self.batch(prepared)?;
        self.write(client, batch, false).await
    }

    /// [`emit_batch_committed`](Self::emit_batch_committed) for a prepared
    /// batch.
    pub async fn emit_prepared_committed<C: PgExecutor>(
        &self,
        client: &C,
        prepared: PreparedBatch,
    ) -> Result<Vec<EventEnvelope>, BatchError> {
        let batch = self.batch(prepared)?;
        let unflushed = self.unflushed_ephemeral && batch.envelopes.iter().all(|e| !e.is_durable());
        let database = |error: tokio_postgres::Error| BatchError {
            index: 0,
            error: error.into(),
        };
        // `join3` polls its futures in this order, every time.
        let (begun, written, committed) = futures_util::future::join3(
            client.query_typed("BEGIN", &[]),
            self.write(client, batch, unflushed),
            client.query_typed("COMMIT", &[]),
        )
        .await;
        begun.map_err(database)?;
        let envelopes = written?;
        committed.map_err(database)?;
        Ok(envelopes)
    }

    /// Validates and encodes a batch: everything that can fail before the
    /// database is involved.
    fn batch(&self, prepared: PreparedBatch) -> Result<Batch, BatchError> {
        let PreparedBatch { envelopes } = prepared;
        // Ephemeral events share notifications, as many to a payload as fit.
        let first_ephemeral = envelopes
            .iter()
            .position(|e| e.lane == Lane::Ephemeral)
            .unwrap_or(0);
        let ephemeral = envelopes.iter().filter(|e| e.lane == Lane::Ephemeral);
        let payloads =
            encode_inline_batch_within(ephemeral, self.ephemeral_max_bytes).map_err(|error| {
                BatchError {
                    index: first_ephemeral,
                    error: error.into(),
                }
            })?;
        Ok(Batch {
            envelopes,
            payloads,
            first_ephemeral,
        })
    }

    /// Sends a batch's statements (the durable events' one `INSERT`, then
    /// the ephemeral events' notifications) all at once, in that order, and
    /// fills in the seqs the database assigned.
    ///
    /// With `unflushed`, the first notification also turns the commit's
    /// flush off: only for a transaction of the publisher's own holding
    /// nothing durable.
    async fn write<C: PgExecutor>(
        &self,
        client: &C,
        batch: Batch,
        unflushed: bool,
    ) -> Result<Vec<EventEnvelope>, BatchError> {
        let Batch {
            mut envelopes,
            payloads,
            first_ephemeral,
        } = batch;
        let announced = if self.announce_rows {
            announced_rows(&mut envelopes)
        } else {
            None
        };
        let durable: Vec<&EventEnvelope> = envelopes.iter().filter(|e| e.is_durable()).collect();
        let ids: Vec<uuid::Uuid> = durable.iter().map(|e| e.id).collect();
        let types: Vec<&str> = durable.iter().map(|e| e.event_type.as_str()).collect();
        let scopes: Vec<&str> = durable.iter().map(|e| e.scope_key.as_str()).collect();
        let data: Vec<&serde_json::Value> = durable.iter().map(|e| &e.data).collect();
        let audiences: Vec<Option<serde_json::Value>> =
            durable.iter().map(|e| DurableRow::of(e).audience).collect();
        let resources: Vec<serde_json::Value> = durable
            .iter()
            .map(|e| serde_json::Value::from(e.resources.clone()))
            .collect();
        let times: Vec<chrono::DateTime<Utc>> = durable.iter().map(|e| e.occurred_at).collect();
        let traceparents: Vec<Option<&str>> =
            durable.iter().map(|e| e.traceparent.as_deref()).collect();
        let insert_params: [(&(dyn ToSql + Sync), Type); 8] = [
            (&ids, Type::UUID_ARRAY),
            (&types, Type::TEXT_ARRAY),
            (&scopes, Type::TEXT_ARRAY),
            (&data, Type::JSONB_ARRAY),
            (&audiences, Type::JSONB_ARRAY),
            (&resources, Type::JSONB_ARRAY),
            (&times, Type::TIMESTAMPTZ_ARRAY),
            (&traceparents, Type::TEXT_ARRAY),
        ];
        let notify_params: Vec<[(&(dyn ToSql + Sync), Type); 1]> = payloads
            .iter()
            .map(|payload| [(payload as &(dyn ToSql + Sync), Type::TEXT)])
            .collect();
        let announced_params = announced.as_ref().map(|rows| {
            let mut params = insert_params.to_vec();
            params.extend([
                (&rows.pointers as &(dyn ToSql + Sync), Type::INT4_ARRAY),
                (&rows.heads, Type::TEXT_ARRAY),
                (&rows.tails, Type::TEXT_ARRAY),
            ]);
            params
        });
        let mut statements = Vec::with_capacity(1 + payloads.len());
        if !durable.is_empty() {
            statements.push(match &announced_params {
                Some(params) => client.query_typed(&self.emit_batch_announced_sql, params),
                None => client.query_typed(&self.emit_batch_sql, &insert_params),
            });
        }
        for (index, params) in notify_params.iter().enumerate() {
            let sql = if unflushed && index == 0 {
                &self.notify_unflushed_sql
            } else {
                &self.notify_sql
            };
            statements.push(client.query_typed(sql, params));
        }
        let mut results = in_order(statements).await.into_iter();
        let inserted = if durable.is_empty() {
            Vec::new()
        } else {
            results
                .next()
                .transpose()
                .map_err(|error| BatchError {
                    index: 0,
                    error: error.into(),
                })?
                .unwrap_or_default()
        };
        for result in results {
            result.map_err(|error| BatchError {
                index: first_ephemeral,
                error: error.into(),
            })?;
        }
        let seqs: std::collections::HashMap<uuid::Uuid, i64> = inserted
            .iter()
            .map(|row| (row.get::<_, uuid::Uuid>(0), row.get::<_, i64>(1)))
            .collect();
        for envelope in envelopes.iter_mut().filter(|e| e.is_durable()) {
            envelope.seq = seqs.get(&envelope.id).copied();
        }
        Ok(envelopes)
    }

    /// Validates `event` (and checks it against the registry when there is
    /// one) and assigns its id and time.
    pub(crate) fn prepare(&self, event: NewEvent) -> Result<EventEnvelope, PublishError> {
        event.validate()?;
        if let Some(registry) = &self.registry {
            registry.check(&event.event_type, &event.data)?;
        }
        #[cfg(feature = "tracing-opentelemetry")]
        let event = crate::trace_context::from_current_span(event);
        let envelope = event.into_envelope(Utc::now());
        if envelope.lane == Lane::Ephemeral {
            // Size-check before touching the database.
            encode_inline_within(&envelope, self.ephemeral_max_bytes)?;
        }
        Ok(envelope)
    }

    #[cfg(feature = "sqlx")]
    pub(crate) fn sqlx_statements(&self) -> (&str, &str) {
        (&self.sqlx_emit_sql, &self.notify_sql)
    }
}

/// A validated, encoded batch, ready to be written.
/// Events validated and given their ids and times by
/// [`Publisher::prepare_batch`], not yet written. Only that method makes
/// one, so whatever is written from it was validated.
#[derive(Debug, Clone, Default)]
pub struct PreparedBatch {
    envelopes: Vec<EventEnvelope>,
}

impl PreparedBatch {
    /// The events as they will be written (durable ones without a seq yet).
    pub fn envelopes(&self) -> &[EventEnvelope] {
        &self.envelopes
    }

    pub fn len(&self) -> usize {
        self.envelopes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.envelopes.is_empty()
    }

    /// The batches' events one after the other, in order.
    pub fn concat<'a>(batches: impl IntoIterator<Item = &'a PreparedBatch>) -> PreparedBatch {
        PreparedBatch {
            envelopes: batches
                .into_iter()
                .flat_map(|batch| batch.envelopes.iter().cloned())
                .collect(),
        }
    }

    /// Each event as a batch of its own, in order.
    pub fn split(self) -> impl Iterator<Item = PreparedBatch> {
        self.envelopes.into_iter().map(|envelope| PreparedBatch {
            envelopes: vec![envelope],
        })
    }
}

struct Batch {
    envelopes: Vec<EventEnvelope>,
    /// The ephemeral events' notification payloads.
    payloads: Vec<String>,
    /// Where a failed notification is reported.
    first_ephemeral: usize,
}

/// Drives `futures` to completion, always polling them in their order, so
/// each is first polled after every one before it. Statements that are sent
/// when first polled therefore reach the server in this order, pipelined on
/// one connection, and their transaction keeps its statement order.
async fn in_order<F: Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut pending: Vec<Option<std::pin::Pin<Box<F>>>> =
        futures.into_iter().map(|f| Some(Box::pin(f))).collect();
    let mut outputs: Vec<Option<F::Output>> = pending.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut all_done = true;
        for (slot, output) in pending.iter_mut().zip(outputs.iter_mut()) {
            if let Some(future) = slot {
                match future.as_mut().poll(cx) {
                    std::task::Poll::Ready(value) => {
                        *output = Some(value);
                        *slot = None;
                    }
                    std::task::Poll::Pending => all_done = false,
                }
            }
        }
        if all_done {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
    outputs.into_iter().flatten().collect()
}

/// The `emit` function's arguments for one envelope.
struct DurableRow<'a> {
    envelope: &'a EventEnvelope,
    audience: Option<serde_json::Value>,
}

impl<'a> DurableRow<'a> {
    fn of(envelope: &'a EventEnvelope) -> Self {
        let audience = envelope
            .audience
            .as_ref()
            .and_then(|a| serde_json::to_value(a).ok());
        DurableRow { envelope, audience }
    }

    fn params(&self) -> [(&(dyn ToSql + Sync), Type); 8] {
        let e = self.envelope;
        [
            (&e.event_type, Type::TEXT),
            (&e.scope_key, Type::TEXT),
            (&e.data, Type::JSONB),
            (&self.audience, Type::JSONB),
            (&e.resources, Type::TEXT_ARRAY),
            (&e.id, Type::UUID),
            (&e.occurred_at, Type::TIMESTAMPTZ),
            (&e.traceparent, Type::TEXT),
        ]
    }
}

/// The envelope parts and pointer numbers with which a batch's INSERT
/// announces its own rows (see `outbox_announce_rows` in the migrations).
struct AnnouncedRows {
    pointers: Vec<i32>,
    heads: Vec<String>,
    tails: Vec<String>,
}

/// Prepares a batch's durable rows (in insert order) to be announced by
/// their own statement: this saves the database building every envelope
/// again in the outbox trigger. `None` when there are none, or when a row
/// is too large to travel with a pointer: the trigger then announces the
/// batch, with a bare pointer for that row.
fn announced_rows(envelopes: &mut [EventEnvelope]) -> Option<AnnouncedRows> {
    let mut heads = Vec::new();
    let mut tails = Vec::new();
    let mut lengths = Vec::new();
    for envelope in envelopes.iter_mut().filter(|e| e.is_durable()) {
        let parts = EnvelopeAroundSeq::of(envelope).ok()?;
        lengths.push(parts.len_at_most());
        heads.push(parts.head);
        tails.push(parts.tail);
    }
    if heads.is_empty() {
        return None;
    }
    let scopes = envelopes
        .iter()
        .filter(|e| e.is_durable())
        .map(|e| e.scope_key.as_str());
    let pointers = assign_to_pointers(scopes.zip(lengths))?;
    Some(AnnouncedRows {
        pointers,
        heads,
        tails,
    })
}
