//! Emit cost: committed transactions per second of a small write alone, with
//! an emit through the publisher crate, and with the SQL `emit(...)` function
//! in the same transaction, at several numbers of concurrent writers.

use crate::context::Context;
use crate::report::{Table, verdict};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use eventrelay_publisher::{NewEvent, Publisher};
use serde_json::json;

use crate::BenchResult;

/// The transaction each writer repeats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteKind {
    Plain,
    WithPublisherEmit,
    WithSqlEmit,
}

#[derive(Debug, Clone)]
pub struct EmitCostFigures {
    pub writers: usize,
    pub plain_tps: f64,
    pub publisher_tps: f64,
    pub sql_tps: f64,
}

/// Creates the table the writers insert into.
pub async fn prepare(database_url: &str, schema: &str) -> BenchResult<()> {
    let client = eventrelay::connect(database_url).await?;
    client
        .batch_execute(&format!(
            "CREATE TABLE IF NOT EXISTS {schema}.bench_writes (
                 id bigserial PRIMARY KEY, amount integer NOT NULL, note text NOT NULL)"
        ))
        .await?;
    Ok(())
}

pub async fn run(
    database_url: &str,
    schema: &str,
    writers: usize,
    duration: Duration,
) -> BenchResult<EmitCostFigures> {
    let mut tps = Vec::new();
    for kind in [
        WriteKind::Plain,
        WriteKind::WithPublisherEmit,
        WriteKind::WithSqlEmit,
    ] {
        tps.push(measure(database_url, schema, kind, writers, duration).await?);
    }
    Ok(EmitCostFigures {
        writers,
        plain_tps: tps[0],
        publisher_tps: tps[1],
        sql_tps: tps[2],
    })
}

/// Committed transactions per second of `writers` concurrent writers each
/// repeating the `kind` transaction for `duration`.
pub async fn measure(
    database_url: &str,
    schema: &str,
    kind: WriteKind,
    writers: usize,
    duration: Duration,
) -> BenchResult<f64> {
    let mut clients = Vec::new();
    for _ in 0..writers {
        clients.push(eventrelay::connect(database_url).await?);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let tasks: Vec<_> = clients
        .into_iter()
        .map(|client| {
            let stop = Arc::clone(&stop);
            let schema = schema.to_owned();
            tokio::spawn(async move { write_until(client, &schema, kind, &stop).await })
        })
        .collect();
    tokio::time::sleep(duration).await;
    stop.store(true, Ordering::Relaxed);
    let mut committed = 0u64;
    for task in tasks {
        committed += task.await??;
    }
    Ok(committed as f64 / started.elapsed().as_secs_f64())
}

async fn write_until(
    mut client: tokio_postgres::Client,
    schema: &str,
    kind: WriteKind,
    stop: &AtomicBool,
) -> BenchResult<u64> {
    let insert = client
        .prepare(&format!(
            "INSERT INTO {schema}.bench_writes (amount, note) VALUES ($1, $2)"
        ))
        .await?;
    let sql_emit = client
        .prepare(&format!(
            "SELECT {schema}.emit('bench.write'::text, 'emit-cost'::text, $1::jsonb)"
        ))
        .await?;
    let publisher = Publisher::new(schema)?;
    let mut committed = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let amount = committed as i32;
        let transaction = client.transaction().await?;
        transaction
            .execute(&insert, &[&amount, &"a small write"])
            .await?;
        match kind {
            WriteKind::Plain => {}
            WriteKind::WithPublisherEmit => {
                publisher
                    .emit(
                        &transaction,
                        NewEvent::durable("bench.write", "emit-cost", json!({ "amount": amount })),
                    )
                    .await?;
            }
            WriteKind::WithSqlEmit => {
                transaction
                    .execute(&sql_emit, &[&json!({ "amount": amount })])
                    .await?;
            }
        }
        transaction.commit().await?;
        committed += 1;
    }
    Ok(committed)
}

/// Emit cost at 1, 8 and 32 writers, in notify mode.
pub async fn rows(cx: &Context, table: &mut Table) -> BenchResult<()> {
    let (db, schema) = (cx.db(), cx.schema.as_str());
    prepare(db, schema).await?;
    for writers in [1, 8, 32] {
        eprintln!("emit cost, {writers} writers");
        let f = run(db, schema, writers, cx.scale.emit_run).await?;
        let ratio = f.publisher_tps / f.plain_tps;
        let sql_ratio = f.sql_tps / f.plain_tps;
        let target = if writers == 8 {
            format!(
                "≥ 0.8× plain at 8 writers: {}",
                verdict(ratio >= 0.8 && sql_ratio >= 0.8)
            )
        } else {
            "–".to_owned()
        };
        table.add(
                format!("emit cost, {writers} writer(s)"),
                format!(
                    "plain {:.0} tx/s · with publisher emit {:.0} tx/s ({ratio:.2}×) · with SQL emit() {:.0} tx/s ({sql_ratio:.2}×)",
                    f.plain_tps, f.publisher_tps, f.sql_tps
                ),
                target,
            );
    }
    Ok(())
}
