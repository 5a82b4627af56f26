//! Emit cost (`--only emit`): committed transactions per second of a small
//! write alone, with an emit through the publisher crate, and with the SQL
//! `emit(...)` function in the same transaction, at 1, 8 and 32 writers.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use eventrelay_publisher::{NewEvent, Publisher};
use serde_json::json;

use crate::report::{Table, target_if, verdict};
use crate::{BenchResult, context::Context};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteKind {
    Plain,
    WithPublisherEmit,
    WithSqlEmit,
}

pub async fn prepare(database_url: &str, schema: &str) -> BenchResult<()> {
    let client = eventrelay::connect(database_url).await?;
    let create = format!(
        "CREATE TABLE IF NOT EXISTS {schema}.bench_writes (
             id bigserial PRIMARY KEY, amount integer NOT NULL, note text NOT NULL)"
    );
    Ok(client.batch_execute(&create).await?)
}

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
    let (stop, started) = (Arc::new(AtomicBool::new(false)), Instant::now());
    let mut tasks = Vec::new();
    for client in clients {
        let (stop, schema) = (Arc::clone(&stop), schema.to_owned());
        let task = async move { write_until(client, &schema, kind, &stop).await };
        tasks.push(tokio::spawn(task));
    }
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
    let insert = format!("INSERT INTO {schema}.bench_writes (amount, note) VALUES ($1, $2)");
    let insert = client.prepare(&insert).await?;
    let sql_emit =
        format!("SELECT {schema}.emit('bench.write'::text, 'emit-cost'::text, $1::jsonb)");
    let sql_emit = client.prepare(&sql_emit).await?;
    let (publisher, note) = (Publisher::new(schema)?, "a small write");
    let mut committed = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let amount = committed as i32;
        let transaction = client.transaction().await?;
        transaction.execute(&insert, &[&amount, &note]).await?;
        match kind {
            WriteKind::Plain => {}
            WriteKind::WithPublisherEmit => {
                let data = json!({ "amount": amount });
                let event = NewEvent::durable("bench.write", "emit-cost", data);
                publisher.emit(&transaction, event).await?;
            }
            WriteKind::WithSqlEmit => {
                let data = json!({ "amount": amount });
                transaction.execute(&sql_emit, &[&data]).await?;
            }
        }
        transaction.commit().await?;
        committed += 1;
    }
    Ok(committed)
}

pub async fn rows(cx: &Context, table: &mut Table) -> BenchResult<()> {
    let (db, schema) = (cx.db(), cx.schema.as_str());
    prepare(db, schema).await?;
    for writers in [1, 8, 32] {
        eprintln!("emit cost, {writers} writers");
        let mut tps = Vec::new();
        use WriteKind::*;
        for kind in [Plain, WithPublisherEmit, WithSqlEmit] {
            tps.push(measure(db, schema, kind, writers, cx.scale.emit_run).await?);
        }
        let (plain, publisher, sql) = (tps[0], tps[1], tps[2]);
        let (ratio, sql_ratio) = (publisher / plain, sql / plain);
        let met = verdict(ratio >= 0.8 && sql_ratio >= 0.8);
        let target = target_if(writers == 8, format!("≥ 0.8× plain at 8 writers: {met}"));
        table.add(
            format!("emit cost, {writers} writer(s)"),
            format!(
                "plain {plain:.0} tx/s · with publisher emit {publisher:.0} tx/s ({ratio:.2}×) · with SQL emit() {sql:.0} tx/s ({sql_ratio:.2}×)"
            ),
            target,
        );
    }
    Ok(())
}
