//! What sealing the notification channel costs, side by side with the two
//! alternatives: the same schema with `seal` returning its payload as it is
//! (open, as every notification was before sealing), and sealed pointers
//! that carry no rows (each durable event read back from the outbox).
//!
//! Three figures: the emitting transaction's rate with SQL `emit()` (the
//! database seals in the commit path), commit-to-rows-in-hand latency for a
//! listener that opens each payload and, for bare pointers, reads the row
//! back as a relay would, and the time the relay spends opening one
//! payload.

use crate::context::Context;
use crate::report::{Table, median, ms};
use std::time::{Duration, Instant};

use eventrelay_publisher::Identifier;
use eventrelay_wire::{Origin, SealKey};
use futures_util::StreamExt as _;
use serde_json::json;
use tokio_postgres::AsyncMessage;

use crate::BenchResult;
use crate::scenarios::emit_cost::{self, WriteKind};

/// How notifications travel in one variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// As shipped: sealed, rows carried.
    Sealed,
    /// `seal` replaced by the identity: what an unsealed channel costs.
    Open,
    /// Sealed, with no room for rows: every pointer bare, every row read back.
    SealedBare,
}

impl Variant {
    pub const ALL: [Variant; 3] = [Variant::Sealed, Variant::Open, Variant::SealedBare];

    pub fn name(self) -> &'static str {
        match self {
            Variant::Sealed => "sealed, rows carried",
            Variant::Open => "open (unsealed)",
            Variant::SealedBare => "sealed, bare pointers (read back)",
        }
    }
}

/// The figures of one variant.
#[derive(Debug, Clone, Default)]
pub struct SealFigures {
    /// Emitting transactions per second per writer count, one per round.
    pub tps: Vec<Vec<f64>>,
    /// Commit to rows in hand, nanoseconds, every sample.
    pub latency_ns: Vec<u64>,
}

/// Switches `schema` to `variant`: the sealing function and the payload
/// size the trigger plans with.
async fn switch(
    client: &tokio_postgres::Client,
    schema: &str,
    variant: Variant,
    sealing_sql: &str,
) -> BenchResult<()> {
    let (seal, max_payload) = match variant {
        Variant::Sealed => (
            sealing_sql.to_owned(),
            eventrelay_wire::MAX_NOTIFY_PAYLOAD_BYTES,
        ),
        Variant::SealedBare => (sealing_sql.to_owned(), 100),
        Variant::Open => (
            format!(
                "CREATE OR REPLACE FUNCTION {schema}.seal(origin text, payload text) RETURNS text
                 LANGUAGE sql IMMUTABLE AS $seal$ SELECT payload $seal$"
            ),
            eventrelay_wire::MAX_NOTIFY_PAYLOAD_BYTES,
        ),
    };
    client.batch_execute(&seal).await?;
    client
        .execute(
            &format!("UPDATE {schema}.settings SET max_notify_payload = $1"),
            &[&(max_payload as i32)],
        )
        .await?;
    Ok(())
}

/// The schema's own sealing function, to restore after the open variant.
async fn sealing_function(client: &tokio_postgres::Client, schema: &str) -> BenchResult<String> {
    let row = client
        .query_one(
            "SELECT pg_get_functiondef(p.oid) FROM pg_proc p
             JOIN pg_namespace n ON n.oid = p.pronamespace
             WHERE n.nspname = $1 AND p.proname = 'seal'",
            &[&schema],
        )
        .await?;
    Ok(row.get(0))
}

/// Runs `rounds` rounds; in each, every variant in turn (reversed every
/// other round) measures emit throughput at each of `writers` and then
/// `samples` single-event latencies.
pub async fn run(
    database_url: &str,
    schema: &str,
    writers: &[usize],
    rounds: usize,
    run_for: Duration,
    samples: usize,
) -> BenchResult<Vec<(Variant, SealFigures)>> {
    let client = eventrelay::connect(database_url).await?;
    let sealing_sql = sealing_function(&client, schema).await?;
    emit_cost::prepare(database_url, schema).await?;
    let mut figures: Vec<(Variant, SealFigures)> = Variant::ALL
        .iter()
        .map(|v| {
            (
                *v,
                SealFigures {
                    tps: vec![Vec::new(); writers.len()],
                    latency_ns: Vec::new(),
                },
            )
        })
        .collect();
    let outcome = async {
        for round in 0..rounds {
            let mut order: Vec<usize> = (0..Variant::ALL.len()).collect();
            if round % 2 == 1 {
                order.reverse();
            }
            for index in order {
                let variant = Variant::ALL[index];
                switch(&client, schema, variant, &sealing_sql).await?;
                for (w, &n) in writers.iter().enumerate() {
                    eprintln!(
                        "sealing: {}, {n} writers, round {}",
                        variant.name(),
                        round + 1
                    );
                    let tps = emit_cost::measure(
                        database_url,
                        schema,
                        WriteKind::WithSqlEmit,
                        n,
                        run_for,
                    )
                    .await?;
                    figures[index].1.tps[w].push(tps);
                }
                let mut latencies = latency(database_url, schema, variant, samples).await?;
                figures[index].1.latency_ns.append(&mut latencies);
            }
        }
        BenchResult::Ok(())
    }
    .await;
    // Leave the schema sealed, whatever happened.
    switch(&client, schema, Variant::Sealed, &sealing_sql).await?;
    outcome?;
    Ok(figures)
}

/// Commit to rows in hand, one event at a time: a listener opens each
/// payload as a relay does and, for a bare pointer, reads the row back.
async fn latency(
    database_url: &str,
    schema: &str,
    variant: Variant,
    samples: usize,
) -> BenchResult<Vec<u64>> {
    let name = Identifier::new(schema)?;
    let emitter = eventrelay::connect(database_url).await?;
    let key = eventrelay::store::sealing::notification_key(&emitter, &name).await?;
    let reader = eventrelay::connect(database_url).await?;
    let (listener, mut connection) =
        tokio_postgres::connect(database_url, tokio_postgres::NoTls).await?;
    let (sender, mut heard) = tokio::sync::mpsc::unbounded_channel();
    let pump = tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(Ok(message)) = messages.next().await {
            if let AsyncMessage::Notification(n) = message
                && sender
                    .send((Instant::now(), n.payload().to_owned()))
                    .is_err()
            {
                break;
            }
        }
    });
    let channel: String = emitter
        .query_one(&format!("SELECT channel FROM {schema}.settings"), &[])
        .await?
        .get(0);
    listener
        .batch_execute(&format!("LISTEN \"{channel}\""))
        .await?;
    let emit = emitter
        .prepare(&format!(
            "SELECT {schema}.emit('bench.seal'::text, 'seal-cost'::text, $1::jsonb)"
        ))
        .await?;
    let read_back = reader
        .prepare(&format!(
            "SELECT seq, data FROM {schema}.outbox WHERE scope_key = 'seal-cost' AND seq > $1 ORDER BY seq LIMIT 500"
        ))
        .await?;
    let mut latencies = Vec::with_capacity(samples);
    for n in 0..samples {
        let sent = Instant::now();
        emitter
            .execute(&emit, &[&json!({"n": n, "pad": "p".repeat(200)})])
            .await?;
        let (_, payload) = tokio::time::timeout(Duration::from_secs(10), heard.recv())
            .await?
            .ok_or("the listener ended")?;
        let text = match variant {
            Variant::Open => payload,
            _ => key.open(&payload)?.1,
        };
        if variant == Variant::SealedBare {
            let seq = serde_json::from_str::<serde_json::Value>(&text)?["q"]
                .as_i64()
                .ok_or("a pointer without a seq")?;
            let rows = reader.query(&read_back, &[&(seq - 1)]).await?;
            if rows.is_empty() {
                return Err("a bare pointer's row was not there".into());
            }
        }
        latencies.push(sent.elapsed().as_nanos() as u64);
    }
    pump.abort();
    Ok(latencies)
}

/// Microseconds the relay spends opening one sealed payload of `len`
/// bytes (before sealing), measured over many.
pub fn open_micros(len: usize) -> BenchResult<f64> {
    let key = SealKey::new(&[7; 64])?;
    let notification = "x".repeat(len);
    let sealed = key.seal(Origin::Rows, &notification, [3; 16]);
    let rounds = 20_000;
    let started = Instant::now();
    for _ in 0..rounds {
        std::hint::black_box(key.open(std::hint::black_box(&sealed))?);
    }
    Ok(started.elapsed().as_secs_f64() * 1e6 / rounds as f64)
}
/// What sealing the channel costs, side by side with an open channel and
/// with sealed pointers that carry no rows (see `seal_cost`).
pub async fn rows(cx: &Context, table: &mut Table) -> BenchResult<()> {
    let schema = cx.schema.as_str();
    const WRITERS: [usize; 2] = [1, 8];
    let (rounds, run_for, samples) = if cx.args.quick {
        (2, Duration::from_secs(2), 200)
    } else {
        (3, Duration::from_secs(4), 1_000)
    };
    let figures = run(cx.db(), schema, &WRITERS, rounds, run_for, samples).await?;
    let sealed = &figures[0].1;
    for (w, writers) in WRITERS.iter().enumerate() {
        let base = median(&sealed.tps[w]);
        let cells: Vec<String> = figures
            .iter()
            .map(|(variant, f)| {
                let tps = median(&f.tps[w]);
                format!("{} {tps:.0} tx/s ({:.2}×)", variant.name(), tps / base)
            })
            .collect();
        table.add(
            format!("sealing: SQL emit(), {writers} writer(s), medians of {rounds} rounds"),
            cells.join(" · "),
            "–",
        );
    }
    let cells: Vec<String> = figures
        .iter()
        .map(|(variant, f)| {
            let mut samples = f.latency_ns.clone();
            let p = crate::clock::Percentiles::of(&mut samples);
            format!("{} p50 {} · p99 {}", variant.name(), ms(p.p50), ms(p.p99))
        })
        .collect();
    table.add(
        format!(
            "sealing: emit+commit to rows in hand, 1 writer, {} events each",
            samples * rounds
        ),
        cells.join(" · "),
        "–",
    );
    table.add(
        "sealing: the relay opening one payload",
        format!(
            "{:.1} µs for a 300-byte pointer · {:.1} µs at the {}-byte limit",
            open_micros(300)?,
            open_micros(eventrelay_wire::MAX_NOTIFY_PAYLOAD_BYTES)?,
            eventrelay_wire::MAX_NOTIFY_PAYLOAD_BYTES
        ),
        "–",
    );
    Ok(())
}
