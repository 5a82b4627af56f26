//! The publisher against a real Postgres: what a commit, a rollback and a
//! refused event leave behind, on every kind of client it accepts.

use crate::support::TestDb;
use eventrelay::publisher::{
    Audience, EventEnvelope, NewEvent, PublishError, Publisher, SchemaError, SchemaRegistry,
};
use eventrelay::store::Outbox;
use eventrelay::wire::{CarriedRows, EncodeError, EventNotification, decode_notification};
use serde_json::{Value, json};

fn publisher(db: &TestDb) -> Publisher {
    Publisher::new(db.schema.as_str()).unwrap()
}

fn order_created() -> NewEvent {
    NewEvent::durable("order.created", "org-1", json!({"orderId": 42}))
        .with_audience(Audience::permission(json!({"orders": ["read"]})))
        .with_resources(["order:42"])
}

async fn read_all(db: &TestDb, scope: &str) -> Vec<EventEnvelope> {
    let client = db.connect().await;
    Outbox::new(&db.schema)
        .read_since(&client, scope, 0, 1000)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_committed_emit_leaves_the_row_and_notifies_only_at_commit() {
    let db = TestDb::new().await;
    let mut listener = db.listen().await;
    let mut client = db.connect().await;

    let tx = client.transaction().await.unwrap();
    let envelope = publisher(&db).emit(&tx, order_created()).await.unwrap();
    let seq = envelope.seq.expect("durable events get a seq");
    assert!(
        listener.drain(&db).await.is_empty(),
        "nothing may be announced before COMMIT"
    );
    assert_eq!(
        db.outbox_count().await,
        0,
        "the row is invisible before COMMIT"
    );

    tx.commit().await.unwrap();
    let payload = listener.next().await;
    let txid = txid_of(&db, seq).await;
    assert_eq!(
        decode_notification(payload.as_bytes()).unwrap(),
        EventNotification::Pointer {
            scope_key: "org-1".into(),
            seq,
            carried: Some(CarriedRows {
                txid,
                events: vec![envelope.clone()],
            }),
        },
        "the pointer carries the row exactly as a read gives it"
    );
    assert_eq!(read_all(&db, "org-1").await, vec![envelope]);
}

/// The transaction that wrote the outbox row at `seq`.
async fn txid_of(db: &TestDb, seq: i64) -> u64 {
    let client = db.connect().await;
    let txid: String = client
        .query_one(
            &format!("SELECT txid::text FROM {}.outbox WHERE seq = $1", db.schema),
            &[&seq],
        )
        .await
        .unwrap()
        .get(0);
    txid.parse().unwrap()
}

/// Every notification as (scope, pointer seq, carried seqs); `None` for a
/// bare pointer.
fn pointers(payloads: &[String]) -> Vec<(String, i64, Option<Vec<i64>>)> {
    payloads
        .iter()
        .map(
            |payload| match decode_notification(payload.as_bytes()).unwrap() {
                EventNotification::Pointer {
                    scope_key,
                    seq,
                    carried,
                } => (
                    scope_key,
                    seq,
                    carried.map(|rows| rows.events.iter().map(|e| e.seq.unwrap()).collect()),
                ),
                other => panic!("expected a pointer, got {other:?}"),
            },
        )
        .collect()
}

#[tokio::test]
async fn many_emits_in_one_transaction_carry_every_committed_row_once() {
    let db = TestDb::new().await;
    let mut listener = db.listen().await;
    let mut client = db.connect().await;
    let publisher = publisher(&db);

    let mut tx = client.transaction().await.unwrap();
    let mut committed: Vec<(String, i64)> = Vec::new();
    for n in 0..30 {
        let scope = ["org-1", "org-2", "org-1;org-2"][n % 3];
        let envelope = publisher
            .emit(&tx, NewEvent::durable("bulk.item", scope, json!({"n": n})))
            .await
            .unwrap();
        committed.push((scope.to_owned(), envelope.seq.unwrap()));
    }
    // A savepoint rolled back takes its pointer with it.
    let savepoint = tx.savepoint("undone").await.unwrap();
    publisher
        .emit(&savepoint, NewEvent::durable("undone", "org-3", json!({})))
        .await
        .unwrap();
    savepoint.rollback().await.unwrap();
    let kept = publisher
        .emit(&tx, NewEvent::durable("kept", "org-3", json!({})))
        .await
        .unwrap();
    committed.push(("org-3".to_owned(), kept.seq.unwrap()));
    tx.commit().await.unwrap();

    let mut carried: Vec<(String, i64)> = Vec::new();
    for (scope, seq, rows) in pointers(&listener.drain(&db).await) {
        let rows = rows.expect("small rows travel with their pointer");
        assert_eq!(
            Some(&seq),
            rows.iter().min(),
            "the pointer names its lowest seq"
        );
        carried.extend(rows.into_iter().map(|row| (scope.clone(), row)));
    }
    carried.sort();
    committed.sort();
    assert_eq!(
        carried, committed,
        "every committed row exactly once, none from the rolled-back savepoint"
    );
}

#[tokio::test]
async fn rows_too_large_to_travel_wake_relays_with_a_bare_pointer_each() {
    let db = TestDb::new().await;
    let mut listener = db.listen().await;
    let mut client = db.connect().await;
    let publisher = publisher(&db);
    let big = |n: usize| json!({"n": n, "pad": "x".repeat(9_000)});

    let mut tx = client.transaction().await.unwrap();
    let mut first = None;
    for n in 0..3 {
        let envelope = publisher
            .emit(&tx, NewEvent::durable("big", "org-1", big(n)))
            .await
            .unwrap();
        first.get_or_insert(envelope.seq.unwrap());
    }
    // A small row after them travels as it would alone.
    let small = publisher
        .emit(&tx, NewEvent::durable("small", "org-1", json!({})))
        .await
        .unwrap();
    // A bare pointer rolled back with its savepoint is not sent.
    let savepoint = tx.savepoint("undone").await.unwrap();
    publisher
        .emit(&savepoint, NewEvent::durable("undone", "org-2", big(9)))
        .await
        .unwrap();
    savepoint.rollback().await.unwrap();
    let kept = publisher
        .emit(&tx, NewEvent::durable("kept", "org-2", big(10)))
        .await
        .unwrap();
    tx.commit().await.unwrap();

    let mut seen = pointers(&listener.drain(&db).await);
    seen.sort();
    let first = first.unwrap();
    let small = small.seq.unwrap();
    assert_eq!(
        seen,
        vec![
            ("org-1".to_owned(), first, None),
            ("org-1".to_owned(), first + 1, None),
            ("org-1".to_owned(), first + 2, None),
            ("org-1".to_owned(), small, Some(vec![small])),
            ("org-2".to_owned(), kept.seq.unwrap(), None),
        ],
        "a bare pointer per row too large, the rest carried"
    );

    // A batch that does not fit in one payload is split, in order.
    let batch: Vec<NewEvent> = (0..12)
        .map(|n| NewEvent::durable("mid", "org-5", json!({"n": n, "pad": "y".repeat(1_500)})))
        .collect();
    let written = publisher.emit_batch(&client, batch).await.unwrap();
    let seen = pointers(&listener.drain(&db).await);
    assert!(seen.len() > 1, "{seen:?}");
    let carried: Vec<i64> = seen
        .into_iter()
        .flat_map(|(_, _, rows)| rows.expect("each fits"))
        .collect();
    let expected: Vec<i64> = written.iter().map(|e| e.seq.unwrap()).collect();
    assert_eq!(carried, expected);
}

#[tokio::test]
async fn one_statement_cuts_each_scope_into_payloads_under_the_limit_in_seq_order() {
    let db = TestDb::new().await;
    let mut listener = db.listen().await;
    let client = db.connect().await;
    // The relay's publish path: the statement announces its own rows.
    let publisher = publisher(&db).announcing_rows();
    let pad = |bytes: usize| "p".repeat(bytes);
    // One statement writing three scopes, interleaved: one that fits in a
    // single payload, one (a publish group's worth) that needs several,
    // and one with a row too large to travel in the middle.
    let mut batch = Vec::new();
    for n in 0..60 {
        batch.push(NewEvent::durable(
            "group.item",
            "group",
            json!({"n": n, "pad": pad(200)}),
        ));
        if n < 20 {
            batch.push(NewEvent::durable("small.item", "fits", json!({"n": n})));
        }
        if n < 5 {
            let size = if n == 3 { 9_000 } else { 100 };
            batch.push(NewEvent::durable(
                "mixed.item",
                "mixed",
                json!({"n": n, "pad": pad(size)}),
            ));
        }
    }
    let written = publisher.emit_batch(&client, batch).await.unwrap();
    let payloads = listener.drain(&db).await;
    for payload in &payloads {
        assert!(
            payload.len() <= eventrelay::wire::MAX_NOTIFY_PAYLOAD_BYTES,
            "a payload of {} bytes",
            payload.len()
        );
    }
    let seqs_of = |scope: &str| -> Vec<i64> {
        written
            .iter()
            .filter(|e| e.scope_key == scope)
            .map(|e| e.seq.unwrap())
            .collect()
    };
    let seen = pointers(&payloads);
    let of = |scope: &str| -> Vec<(i64, Option<Vec<i64>>)> {
        seen.iter()
            .filter(|(s, _, _)| s == scope)
            .map(|(_, q, rows)| (*q, rows.clone()))
            .collect()
    };

    assert_eq!(
        of("fits"),
        vec![(seqs_of("fits")[0], Some(seqs_of("fits")))],
        "one pointer"
    );

    let group = of("group");
    assert!((3..=6).contains(&group.len()), "{group:?}");
    let mut carried = Vec::new();
    for (q, rows) in group {
        let rows = rows.expect("small rows travel");
        assert_eq!(Some(q), rows.first().copied());
        carried.extend(rows);
    }
    assert_eq!(carried, seqs_of("group"), "every row once, in seq order");

    let mixed = seqs_of("mixed");
    assert_eq!(
        of("mixed"),
        vec![(mixed[0], Some(mixed[..3].to_vec())), (mixed[3], None)],
        "the rows before the large one travel; a bare pointer names it, and its read finds the rest"
    );
}

/// The rows every pointer in `payloads` carries, in the order they travel.
fn carried_rows(payloads: &[String]) -> Vec<CarriedRows> {
    payloads
        .iter()
        .map(
            |payload| match decode_notification(payload.as_bytes()).unwrap() {
                EventNotification::Pointer {
                    carried: Some(rows),
                    ..
                } => rows,
                other => panic!("expected a carrying pointer, got {other:?}"),
            },
        )
        .collect()
}

#[tokio::test]
async fn a_batch_announces_its_own_rows_exactly_as_the_trigger_would() {
    let db = TestDb::new().await;
    let mut listener = db.listen().await;
    let client = db.connect().await;
    // The relay's publish path: the statement announces its own rows.
    let publisher = publisher(&db).announcing_rows();
    // Two scopes interleaved, one needing several payloads, every row
    // small enough to travel: the statement announces them itself.
    let mut batch = Vec::new();
    for n in 0..60 {
        batch.push(
            NewEvent::durable(
                "group.item",
                "group",
                json!({"n": n, "pad": "p".repeat(200)}),
            )
            .with_resources([format!("item:{n}")]),
        );
        if n < 20 {
            batch.push(
                NewEvent::durable("small.item", "fits \"quoted\"", json!({"n": n}))
                    .with_audience(Audience::users(["u1"])),
            );
        }
    }
    let written = publisher.emit_batch(&client, batch).await.unwrap();
    let payloads = listener.drain(&db).await;
    for payload in &payloads {
        assert!(
            payload.len() <= eventrelay::wire::MAX_NOTIFY_PAYLOAD_BYTES,
            "a payload of {} bytes",
            payload.len()
        );
    }
    let seen = pointers(&payloads);
    let scopes: Vec<&str> = seen.iter().map(|(scope, _, _)| scope.as_str()).collect();
    assert_eq!(
        scopes.iter().filter(|s| **s == "fits \"quoted\"").count(),
        1
    );
    assert!(
        (3..=6).contains(&scopes.iter().filter(|s| **s == "group").count()),
        "{seen:?}"
    );
    // Pointers in order of their lowest seqs, each naming its first row.
    let firsts: Vec<i64> = seen.iter().map(|(_, q, _)| *q).collect();
    assert!(firsts.windows(2).all(|w| w[0] < w[1]), "{firsts:?}");
    for (_, q, rows) in &seen {
        assert_eq!(rows.as_ref().and_then(|r| r.first()), Some(q));
    }

    // Each row travels once, and as the outbox holds it.
    let carried = carried_rows(&payloads);
    let mut travelled: Vec<EventEnvelope> = carried
        .iter()
        .flat_map(|rows| rows.events.clone())
        .collect();
    travelled.sort_by_key(|e| e.seq);
    let mut stored = read_all(&db, "group").await;
    stored.extend(read_all(&db, "fits \"quoted\"").await);
    stored.sort_by_key(|e| e.seq);
    assert_eq!(travelled, stored);
    let mut answered = written.clone();
    answered.sort_by_key(|e| e.seq);
    assert_eq!(travelled, answered);
    let txid = txid_of(&db, written[0].seq.unwrap()).await;
    for rows in &carried {
        assert_eq!(rows.txid, txid);
    }
}

#[tokio::test]
async fn a_statement_that_announced_itself_leaves_the_next_to_the_trigger() {
    let db = TestDb::new().await;
    let mut listener = db.listen().await;
    let mut client = db.connect().await;
    let publisher = publisher(&db);
    let tx = client.transaction().await.unwrap();
    // A bare pointer first; the batch announces its own rows, that scope's
    // included (a relay that read past them ignores the pointer).
    let big = publisher
        .emit(
            &tx,
            NewEvent::durable("big", "bare", json!({"pad": "x".repeat(9_000)})),
        )
        .await
        .unwrap();
    let batch = publisher
        .clone()
        .announcing_rows()
        .emit_batch(
            &tx,
            vec![
                NewEvent::durable("after.bare", "bare", json!({})),
                NewEvent::durable("batched", "org-1", json!({"n": 1})),
            ],
        )
        .await
        .unwrap();
    // The next statement, in the same transaction, is the trigger's again.
    let later = publisher
        .emit(&tx, NewEvent::durable("later", "org-2", json!({"n": 2})))
        .await
        .unwrap();
    tx.commit().await.unwrap();

    let mut seen = pointers(&listener.drain(&db).await);
    seen.sort();
    assert_eq!(
        seen,
        vec![
            ("bare".to_owned(), big.seq.unwrap(), None),
            (
                "bare".to_owned(),
                batch[0].seq.unwrap(),
                Some(vec![batch[0].seq.unwrap()])
            ),
            (
                "org-1".to_owned(),
                batch[1].seq.unwrap(),
                Some(vec![batch[1].seq.unwrap()])
            ),
            (
                "org-2".to_owned(),
                later.seq.unwrap(),
                Some(vec![later.seq.unwrap()])
            ),
        ]
    );
}

#[tokio::test]
async fn a_rolled_back_emit_leaves_no_row_and_no_notification() {
    let db = TestDb::new().await;
    let mut listener = db.listen().await;
    let mut client = db.connect().await;

    let tx = client.transaction().await.unwrap();
    let publisher = publisher(&db);
    publisher.emit(&tx, order_created()).await.unwrap();
    publisher
        .emit(
            &tx,
            NewEvent::ephemeral("sync.progress", "org-1", json!({"done": 1})),
        )
        .await
        .unwrap();
    tx.rollback().await.unwrap();

    assert!(listener.drain(&db).await.is_empty());
    assert_eq!(db.outbox_count().await, 0);
}

#[tokio::test]
async fn an_ephemeral_event_travels_inline_and_is_never_stored() {
    let db = TestDb::new().await;
    let mut listener = db.listen().await;
    let client = db.connect().await;
    let envelope = publisher(&db)
        .emit(
            &client,
            NewEvent::ephemeral("sync.progress", "org-1", json!({"done": 3, "total": 9})),
        )
        .await
        .unwrap();
    assert_eq!(envelope.seq, None);
    assert_eq!(
        decode_notification(listener.next().await.as_bytes()).unwrap(),
        EventNotification::Inline { envelope }
    );
    assert_eq!(db.outbox_count().await, 0);
}

#[tokio::test]
async fn an_oversized_ephemeral_event_is_refused_and_nothing_is_sent() {
    let db = TestDb::new().await;
    let mut listener = db.listen().await;
    let client = db.connect().await;
    let error = publisher(&db)
        .emit(
            &client,
            NewEvent::ephemeral("big", "org-1", json!({"blob": "x".repeat(8_000)})),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(error, PublishError::Encode(EncodeError::TooLarge { .. })),
        "{error}"
    );
    assert!(error.to_string().contains(&format!(
        "at most {}",
        eventrelay::wire::MAX_NOTIFY_PAYLOAD_BYTES
    )));
    assert!(listener.drain(&db).await.is_empty());
}

#[tokio::test]
async fn a_typed_emit_that_fails_its_schema_writes_nothing() {
    let db = TestDb::new().await;
    let mut listener = db.listen().await;
    let registry = SchemaRegistry::new()
        .with(
            "order.created",
            &json!({
                "type": "object",
                "properties": {"orderId": {"type": "integer"}},
                "required": ["orderId"]
            }),
        )
        .unwrap();
    let publisher = publisher(&db).with_registry(registry);
    let client = db.connect().await;

    let bad = NewEvent::durable("order.created", "org-1", json!({"orderId": "42"}));
    assert!(matches!(
        publisher.emit(&client, bad).await,
        Err(PublishError::Schema(SchemaError::Invalid { .. }))
    ));
    let unregistered = NewEvent::durable("order.deleted", "org-1", json!({}));
    assert!(matches!(
        publisher.emit(&client, unregistered).await,
        Err(PublishError::Schema(SchemaError::Unregistered(_)))
    ));
    let ephemeral_bad = NewEvent::ephemeral("order.created", "org-1", json!({}));
    assert!(matches!(
        publisher.emit(&client, ephemeral_bad).await,
        Err(PublishError::Schema(SchemaError::Invalid { .. }))
    ));
    assert_eq!(db.outbox_count().await, 0);
    assert!(listener.drain(&db).await.is_empty());

    publisher.emit(&client, order_created()).await.unwrap();
    assert_eq!(db.outbox_count().await, 1);
}

#[tokio::test]
async fn an_invalid_event_type_is_refused_before_the_database() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    let error = publisher(&db)
        .emit(
            &client,
            NewEvent::durable("a\nevent: forged", "org-1", json!({})),
        )
        .await
        .unwrap_err();
    assert!(matches!(error, PublishError::InvalidEvent(_)), "{error}");
    assert_eq!(db.outbox_count().await, 0);
}

#[tokio::test]
async fn the_sql_function_and_the_rust_publisher_write_identical_rows() {
    let db = TestDb::new().await;
    let mut listener = db.listen().await;
    let client = db.connect().await;

    let from_rust = publisher(&db).emit(&client, order_created()).await.unwrap();
    let sql_seq: i64 = client
        .query_one(
            &format!(
                "SELECT {}.emit('order.created', 'org-1', '{{\"orderId\": 42}}', \
                 '{{\"permission\": {{\"orders\": [\"read\"]}}}}', ARRAY['order:42'])",
                db.schema
            ),
            &[],
        )
        .await
        .unwrap()
        .get(0);

    let rows = read_all(&db, "org-1").await;
    assert_eq!(rows.len(), 2);
    let from_sql = rows[1].clone();
    assert_eq!(from_sql.seq, Some(sql_seq));
    let comparable = |e: &EventEnvelope| {
        let mut value = serde_json::to_value(e).unwrap();
        let object = value.as_object_mut().unwrap();
        for key in ["id", "seq", "occurredAt"] {
            object.remove(key);
        }
        value
    };
    assert_eq!(comparable(&rows[0]), comparable(&from_rust));
    assert_eq!(comparable(&from_sql), comparable(&from_rust));

    // Both notifications carry their row exactly as a read gives it.
    for envelope in [&rows[0], &from_sql] {
        assert_eq!(
            decode_notification(listener.next().await.as_bytes()).unwrap(),
            carrying(&db, envelope).await
        );
    }
}

/// The pointer the outbox trigger sends for a transaction that wrote only
/// `envelope` in its scope.
async fn carrying(db: &TestDb, envelope: &EventEnvelope) -> EventNotification {
    let seq = envelope.seq.unwrap();
    EventNotification::Pointer {
        scope_key: envelope.scope_key.clone(),
        seq,
        carried: Some(CarriedRows {
            txid: txid_of(db, seq).await,
            events: vec![envelope.clone()],
        }),
    }
}

#[tokio::test]
async fn notifications_sent_by_sql_validate_against_the_published_schema() {
    let db = TestDb::new().await;
    let mut listener = db.listen().await;
    let client = db.connect().await;
    client
        .execute(
            &format!(
                "SELECT {}.emit('a.b', 'scope \"quoted\" é', '{{}}')",
                db.schema
            ),
            &[],
        )
        .await
        .unwrap();
    let schema_text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("schema/event-notification.schema.json"),
    )
    .unwrap();
    let validator =
        jsonschema::validator_for(&serde_json::from_str::<Value>(&schema_text).unwrap()).unwrap();
    let payload: Value = serde_json::from_str(&listener.next().await).unwrap();
    assert!(validator.is_valid(&payload), "{payload}");
    assert_eq!(payload["s"], "scope \"quoted\" é");
}

#[tokio::test]
async fn deadpool_clients_and_transactions_are_accepted() {
    let db = TestDb::new().await;
    let config: tokio_postgres::Config = db.url.parse().unwrap();
    let manager = deadpool_postgres::Manager::new(config, tokio_postgres::NoTls);
    let pool = deadpool_postgres::Pool::builder(manager)
        .max_size(2)
        .build()
        .unwrap();
    let publisher = publisher(&db);

    let client = pool.get().await.unwrap();
    publisher.emit(&client, order_created()).await.unwrap();

    let mut client = pool.get().await.unwrap();
    let tx = client.transaction().await.unwrap();
    publisher.emit(&tx, order_created()).await.unwrap();
    tx.rollback().await.unwrap();
    let tx = client.transaction().await.unwrap();
    publisher.emit(&tx, order_created()).await.unwrap();
    tx.commit().await.unwrap();

    assert_eq!(db.outbox_count().await, 2);
}

#[cfg(feature = "sqlx")]
#[tokio::test]
async fn sqlx_transactions_are_accepted() {
    use sqlx::Connection;

    let db = TestDb::new().await;
    let mut listener = db.listen().await;
    let publisher = publisher(&db);
    let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();

    let mut tx = conn.begin().await.unwrap();
    publisher.emit_sqlx(&mut tx, order_created()).await.unwrap();
    tx.rollback().await.unwrap();
    assert!(listener.drain(&db).await.is_empty());

    let mut tx = conn.begin().await.unwrap();
    let envelope = publisher.emit_sqlx(&mut tx, order_created()).await.unwrap();
    let ephemeral = publisher
        .emit_sqlx(&mut tx, NewEvent::ephemeral("tick", "org-1", json!(1)))
        .await
        .unwrap();
    tx.commit().await.unwrap();

    assert_eq!(read_all(&db, "org-1").await, vec![envelope.clone()]);
    assert_eq!(
        decode_notification(listener.next().await.as_bytes()).unwrap(),
        carrying(&db, &envelope).await
    );
    assert_eq!(
        decode_notification(listener.next().await.as_bytes()).unwrap(),
        EventNotification::Inline {
            envelope: ephemeral
        }
    );
}

#[tokio::test]
async fn reserved_event_types_are_refused_before_anything_is_written() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    for (reserved, lane) in [
        (
            "ready",
            NewEvent::durable("ready", "org-1", json!({"resync": false})),
        ),
        ("open", NewEvent::ephemeral("open", "org-1", json!({}))),
        (
            "eventrelay.x",
            NewEvent::durable("eventrelay.x", "org-1", json!({})),
        ),
    ] {
        let error = publisher(&db).emit(&client, lane).await.unwrap_err();
        assert!(
            matches!(
                error,
                eventrelay::publisher::PublishError::InvalidEvent(
                    eventrelay::wire::EnvelopeError::ReservedType(_)
                )
            ),
            "{reserved}: {error}"
        );
        assert!(error.to_string().contains("reserved"), "{error}");
    }
    assert!(read_all(&db, "org-1").await.is_empty());
}

/// A real client that notes the order in which its statements are sent
/// (each is sent when its future is first polled) and, when asked to, what
/// `synchronous_commit` the open transaction has just before its `COMMIT`:
/// whether the commit will wait for the WAL flush.
struct SendOrder<'a> {
    client: &'a tokio_postgres::Client,
    sent: std::sync::Mutex<Vec<String>>,
    flush_at_commit: Option<std::sync::Mutex<Option<String>>>,
}

impl<'a> SendOrder<'a> {
    fn new(client: &'a tokio_postgres::Client) -> Self {
        SendOrder {
            client,
            sent: std::sync::Mutex::new(Vec::new()),
            flush_at_commit: None,
        }
    }

    fn asking_flush(client: &'a tokio_postgres::Client) -> Self {
        SendOrder {
            flush_at_commit: Some(std::sync::Mutex::new(None)),
            ..Self::new(client)
        }
    }
}

impl eventrelay::publisher::PgExecutor for SendOrder<'_> {
    async fn query_typed(
        &self,
        sql: &str,
        params: &[(
            &(dyn tokio_postgres::types::ToSql + Sync),
            tokio_postgres::types::Type,
        )],
    ) -> Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
        let word = sql.split_whitespace().next().unwrap_or_default().to_owned();
        if let (Some(flush), "COMMIT") = (&self.flush_at_commit, word.as_str()) {
            let row = self
                .client
                .query_one("SHOW synchronous_commit", &[])
                .await?;
            *flush.lock().unwrap() = Some(row.get(0));
        }
        self.sent.lock().unwrap().push(word);
        self.client.query_typed(sql, params).await
    }
}

/// Whether the session is inside a transaction block: only there does a
/// savepoint succeed (outside one, Postgres refuses it).
async fn in_open_transaction(client: &tokio_postgres::Client) -> bool {
    client.batch_execute("SAVEPOINT probe").await.is_ok()
}

#[tokio::test]
async fn a_committed_batch_sends_begin_its_statements_and_commit_together_in_order() {
    let db = TestDb::new().await;
    let mut listener = db.listen().await;
    let client = db.connect().await;
    let sender = SendOrder::new(&client);
    let written = publisher(&db)
        .announcing_rows()
        .emit_batch_committed(
            &sender,
            vec![
                NewEvent::durable("a", "org-1", json!({"n": 1})),
                NewEvent::ephemeral("typing", "org-1", json!({"n": 2})),
                NewEvent::durable("a", "org-1", json!({"n": 3})),
            ],
        )
        .await
        .unwrap();
    assert_eq!(
        *sender.sent.lock().unwrap(),
        // The durable rows' INSERT (announcing its own rows), then the
        // ephemeral event's notification.
        ["BEGIN", "WITH", "SELECT", "COMMIT"],
        "the transaction's statements, in order"
    );
    assert!(!in_open_transaction(&client).await, "nothing left open");
    let stored = read_all(&db, "org-1").await;
    let seqs: Vec<Option<i64>> = stored.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, [written[0].seq, written[2].seq]);
    // The durable rows are one transaction's.
    let xmins: i64 = client
        .query_one(
            &format!(
                "SELECT count(DISTINCT xmin::text) FROM {}.outbox",
                db.schema
            ),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(xmins, 1);
    let kinds: Vec<String> = listener
        .drain(&db)
        .await
        .iter()
        .map(
            |payload| match decode_notification(payload.as_bytes()).unwrap() {
                EventNotification::Pointer { .. } => "pointer".to_owned(),
                EventNotification::Inline { .. } => "inline".to_owned(),
                EventNotification::InlineBatch { envelopes, .. } => {
                    format!("inline {}", envelopes.len())
                }
                other => format!("{other:?}"),
            },
        )
        .collect();
    assert_eq!(kinds, ["pointer", "inline"]);
}

#[tokio::test]
async fn a_committed_batch_the_database_refuses_writes_nothing_and_leaves_no_transaction_open() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    let taken = publisher(&db)
        .emit(&client, NewEvent::durable("a", "org-1", json!({})))
        .await
        .unwrap();
    let mut listener = db.listen().await;
    let refused = publisher(&db)
        .emit_batch_committed(
            &client,
            vec![
                NewEvent::durable("a", "org-1", json!({"fresh": true})),
                NewEvent::durable("a", "org-1", json!({})).with_id(taken.id),
            ],
        )
        .await
        .expect_err("the id is already used");
    match &refused.error {
        PublishError::Database(error) => assert_eq!(
            error.code(),
            Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION),
            "{error:?}"
        ),
        other => panic!("not the database's refusal: {other}"),
    }
    assert!(
        !in_open_transaction(&client).await,
        "rolled back, not left open"
    );
    assert_eq!(
        read_all(&db, "org-1").await.len(),
        1,
        "the fresh event is not written either"
    );
    assert!(listener.drain(&db).await.is_empty());
    // The connection is usable as before.
    publisher(&db)
        .emit_batch_committed(&client, vec![NewEvent::durable("a", "org-1", json!({}))])
        .await
        .unwrap();
    assert_eq!(read_all(&db, "org-1").await.len(), 2);
}

#[tokio::test]
async fn only_a_batch_of_ephemeral_events_commits_without_waiting_for_the_flush() {
    let db = TestDb::new().await;
    let mut listener = db.listen().await;
    let client = db.connect().await;
    let typing = || NewEvent::ephemeral("typing", "org-1", json!({}));
    let unflushed = publisher(&db).unflushed_ephemeral_commits();
    let cases = [
        (&unflushed, vec![typing(), typing()], "off"),
        (&unflushed, vec![typing(), order_created()], "on"),
        (&unflushed, vec![order_created()], "on"),
        (&publisher(&db), vec![typing()], "on"),
    ];
    for (publisher, events, expected) in cases {
        let sees = SendOrder::asking_flush(&client);
        publisher.emit_batch_committed(&sees, events).await.unwrap();
        let flush = sees.flush_at_commit.as_ref().unwrap();
        assert_eq!(
            flush.lock().unwrap().as_deref(),
            Some(expected),
            "synchronous_commit at COMMIT"
        );
        assert!(!in_open_transaction(&client).await, "nothing left open");
    }
    // The setting was the transaction's own: the session keeps its default.
    let after: String = client
        .query_one("SHOW synchronous_commit", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(after, "on");
    // Every ephemeral event was still announced.
    let inline: usize = listener
        .drain(&db)
        .await
        .iter()
        .map(
            |payload| match decode_notification(payload.as_bytes()).unwrap() {
                EventNotification::Inline { .. } => 1,
                EventNotification::InlineBatch { envelopes, .. } => envelopes.len(),
                _ => 0,
            },
        )
        .sum();
    assert_eq!(inline, 4);
}

/// The outbox trigger reads no setting a session can change: the marks it
/// once trusted, set by hand (as a mistaken code path on a pooled
/// connection would), keep no event from being announced.
#[tokio::test]
async fn settings_an_emitter_can_change_keep_no_event_from_being_announced() {
    let db = TestDb::new().await;
    let mut listener = db.listen().await;
    let client = db.connect().await;
    // Session-wide, as `SET` would leave them.
    client
        .execute(
            "SELECT set_config('eventrelay.rows_announced', $1, false),
                    set_config('eventrelay.announced_scopes', $1 || '/' || md5('org-1') || ';', false)",
            &[&db.schema.as_str()],
        )
        .await
        .unwrap();
    let seq: i64 = client
        .query_one(
            &format!("SELECT {}.emit('order.created', 'org-1')", db.schema),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let seen = pointers(&listener.drain(&db).await);
    assert_eq!(
        seen,
        vec![("org-1".to_owned(), seq, Some(vec![seq]))],
        "the event is announced whatever the session's settings say"
    );
}
