//! Pooled connections keep the service's statements prepared when
//! configured to, run them unnamed when not, and recover when the server
//! has lost a statement, against a real Postgres.

use std::time::Duration;

use crate::support::TestDb;
use eventrelay::publisher::{NewEvent, PgConnectOptions, PgExecutor, PublishError, Publisher};
use eventrelay::store::{Connection, Database, Outbox, StatementKey};
use serde_json::json;
use tokio_postgres::error::SqlState;

/// A pool of one connection, so every checkout is the same session.
fn pool_of_one(db: &TestDb, prepared: bool) -> Database {
    let options = PgConnectOptions::parse(&db.url).unwrap();
    Database::pool(&options, 1, Duration::from_secs(5))
        .unwrap()
        .with_prepared_statements(prepared)
}

/// Statements prepared on this session, by name (unnamed ones are not
/// listed).
async fn prepared_on(conn: &Connection) -> i64 {
    // Unnamed itself, so it does not count itself.
    tokio_postgres::Client::query_typed(conn, "SELECT count(*) FROM pg_prepared_statements", &[])
        .await
        .unwrap()[0]
        .get(0)
}

async fn emit_one(db: &TestDb, scope: &str) -> i64 {
    db.emit(NewEvent::durable("t", scope, json!({})))
        .await
        .seq
        .unwrap()
}

/// A schema holding one event in `org-a`, and a pool of one on it.
async fn one_event_and_a_pool(prepared: bool) -> (TestDb, Database, Outbox, i64) {
    let db = TestDb::new().await;
    let seq = emit_one(&db, "org-a").await;
    let pool = pool_of_one(&db, prepared);
    let outbox = Outbox::new(&db.schema);
    (db, pool, outbox, seq)
}

/// How many events `org-a` holds, read through `conn`.
async fn read(outbox: &Outbox, conn: &Connection) -> usize {
    outbox.read_rows(conn, "org-a", 0, 10).await.unwrap().len()
}

#[tokio::test]
async fn a_statement_is_prepared_once_per_connection_and_reused() {
    let (_db, pool, outbox, seq) = one_event_and_a_pool(true).await;
    let conn = pool.get().await.unwrap();
    assert_eq!(prepared_on(&conn).await, 0);
    for _ in 0..3 {
        let rows = outbox.read_rows(&conn, "org-a", 0, 10).await.unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].envelope.seq, Some(seq));
    }
    assert_eq!(prepared_on(&conn).await, 1, "three reads, one statement");
    drop(conn);
    // The next checkout is the same session with the statement still there.
    let conn = pool.get().await.unwrap();
    read(&outbox, &conn).await;
    assert_eq!(prepared_on(&conn).await, 1);
}

#[tokio::test]
async fn with_prepared_statements_off_nothing_is_left_on_the_connection() {
    let (_db, pool, outbox, _) = one_event_and_a_pool(false).await;
    let conn = pool.get().await.unwrap();
    for _ in 0..3 {
        assert_eq!(read(&outbox, &conn).await, 1);
    }
    assert_eq!(prepared_on(&conn).await, 0);
}

#[tokio::test]
async fn a_statement_the_server_lost_turns_preparing_off_for_the_pool() {
    let (_db, pool, outbox, _) = one_event_and_a_pool(true).await;
    let conn = pool.get().await.unwrap();
    read(&outbox, &conn).await;
    assert_eq!(prepared_on(&conn).await, 1);
    // What a pooler handing the next statement another server connection
    // looks like to the client.
    conn.batch_execute("DEALLOCATE ALL").await.unwrap();
    assert_eq!(read(&outbox, &conn).await, 1, "read again, unnamed");
    drop(conn);
    let conn = pool.get().await.unwrap();
    for _ in 0..3 {
        read(&outbox, &conn).await;
    }
    assert_eq!(prepared_on(&conn).await, 0, "nothing prepared any more");
}

#[tokio::test]
async fn in_a_transaction_a_lost_statement_fails_that_transaction_only() {
    let db = TestDb::new().await;
    let publisher = Publisher::new(db.schema.as_str()).unwrap();
    let pool = pool_of_one(&db, true);
    let mut conn = pool.get().await.unwrap();

    let tx = conn.begin().await.unwrap();
    publisher
        .emit_batch(&tx, vec![NewEvent::durable("t", "org-a", json!({"n": 1}))])
        .await
        .unwrap();
    tx.commit().await.unwrap();

    conn.batch_execute("DEALLOCATE ALL").await.unwrap();
    let tx = conn.begin().await.unwrap();
    let lost = publisher
        .emit_batch(&tx, vec![NewEvent::durable("t", "org-a", json!({"n": 2}))])
        .await
        .expect_err("the statement is gone from the server");
    match &lost.error {
        PublishError::Database(error) => assert_eq!(
            error.code(),
            Some(&SqlState::INVALID_SQL_STATEMENT_NAME),
            "{error:?}"
        ),
        other => panic!("not the database's error: {other}"),
    }
    drop(tx);

    // The next transaction sends its statements unnamed and succeeds.
    let tx = conn.begin().await.unwrap();
    let written = publisher
        .emit_batch(&tx, vec![NewEvent::durable("t", "org-a", json!({"n": 3}))])
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(prepared_on(&conn).await, 0);
    let outbox = Outbox::new(&db.schema);
    let rows = outbox.read_rows(&conn, "org-a", 0, 10).await.unwrap();
    let seqs: Vec<Option<i64>> = rows.iter().map(|row| row.envelope.seq).collect();
    assert_eq!(seqs.len(), 2, "the failed transaction wrote nothing");
    assert_eq!(seqs[1], written[0].seq);
}

#[tokio::test]
async fn a_statement_whose_tables_changed_is_prepared_again() {
    let (db, pool, outbox, _) = one_event_and_a_pool(true).await;
    let conn = pool.get().await.unwrap();
    read(&outbox, &conn).await;
    // A column the read returns changes type, as a migration might do:
    // the prepared plan no longer fits.
    conn.batch_execute(&format!(
        "ALTER TABLE {}.outbox ALTER COLUMN type TYPE varchar(200)",
        db.schema
    ))
    .await
    .unwrap();
    assert_eq!(read(&outbox, &conn).await, 1);
    assert!(
        prepared_on(&conn).await >= 1,
        "still preparing: a changed table is no sign of a pooler"
    );
}

#[tokio::test]
async fn the_connection_runs_any_statement_with_its_parameters() {
    let db = TestDb::new().await;
    let pool = pool_of_one(&db, true);
    let conn = pool.get().await.unwrap();
    let rows = conn
        .query_typed(
            "SELECT $1::text || '-' || $2::int8",
            &[
                (&"a", tokio_postgres::types::Type::TEXT),
                (&7_i64, tokio_postgres::types::Type::INT8),
            ],
        )
        .await
        .unwrap();
    assert_eq!(rows[0].get::<_, String>(0), "a-7");
}

/// Whether the session is inside a transaction block: only there does a
/// savepoint succeed (outside one, Postgres refuses it).
async fn in_open_transaction(conn: &Connection) -> bool {
    conn.batch_execute("SAVEPOINT probe").await.is_ok()
}

fn batch(n: i64) -> Vec<NewEvent> {
    vec![NewEvent::durable("t", "org-a", json!({"n": n}))]
}

/// Writes one event through a pipeline on `conn` that has nothing
/// prepared yet; answers the statements it noted.
async fn first_pipeline(publisher: &Publisher, conn: &Connection) -> Vec<StatementKey> {
    let first = conn.pipeline(&[]).await.unwrap();
    publisher
        .emit_batch_committed(&first, batch(1))
        .await
        .unwrap();
    first.unprepared()
}

#[tokio::test]
async fn a_pipeline_uses_only_statements_prepared_before_it_and_notes_the_others() {
    let db = TestDb::new().await;
    let publisher = Publisher::new(db.schema.as_str()).unwrap();
    let pool = pool_of_one(&db, true);
    let conn = pool.get().await.unwrap();

    let noted = first_pipeline(&publisher, &conn).await;
    assert_eq!(
        noted.len(),
        1,
        "the batch INSERT, not BEGIN or COMMIT: {noted:?}"
    );
    assert_eq!(prepared_on(&conn).await, 0, "sent unnamed");

    let second = conn.pipeline(&noted).await.unwrap();
    publisher
        .emit_batch_committed(&second, batch(2))
        .await
        .unwrap();
    assert!(second.unprepared().is_empty());
    assert_eq!(prepared_on(&conn).await, 1, "prepared before the pipeline");
    assert!(!in_open_transaction(&conn).await);
    assert_eq!(db.outbox_count().await, 2);
}

#[tokio::test]
async fn a_lost_statement_rolls_its_pipeline_back_and_is_forgotten() {
    let db = TestDb::new().await;
    let publisher = Publisher::new(db.schema.as_str()).unwrap();
    let pool = pool_of_one(&db, true);
    let conn = pool.get().await.unwrap();
    let known = first_pipeline(&publisher, &conn).await;

    let warm = conn.pipeline(&known).await.unwrap();
    conn.batch_execute("DEALLOCATE ALL").await.unwrap();
    let lost = publisher
        .emit_batch_committed(&warm, batch(2))
        .await
        .expect_err("the statement is gone from the server");
    let PublishError::Database(error) = &lost.error else {
        panic!("not the database's error: {}", lost.error);
    };
    assert_eq!(error.code(), Some(&SqlState::INVALID_SQL_STATEMENT_NAME));
    assert!(
        !in_open_transaction(&conn).await,
        "rolled back, not left open"
    );
    assert_eq!(
        db.outbox_count().await,
        1,
        "the failed pipeline wrote nothing"
    );
    assert!(warm.forget_stale(error), "a lost statement is stale");

    // Preparing is now off for the pool: the next pipeline sends unnamed.
    let next = conn.pipeline(&known).await.unwrap();
    publisher
        .emit_batch_committed(&next, batch(3))
        .await
        .unwrap();
    assert_eq!(prepared_on(&conn).await, 0);
    assert_eq!(db.outbox_count().await, 2);
}
