//! What sealing notifications costs (`--only seal`), against the same
//! schema's `seal` returning its payload as is (open) and against sealed
//! pointers carrying no rows (each event read back): the SQL `emit()` rate,
//! HTTP publish at 64 publishers, each step of `seal`, commit to rows in hand
//! for a listener opening payloads as a relay does, and the relay's opening.

use std::time::{Duration, Instant};

use eventrelay_publisher::{Identifier, ListenConnection, PgConnectOptions};
use eventrelay_wire::{MAX_NOTIFY_PAYLOAD_BYTES, Origin, SealKey};
use serde_json::json;

use crate::BenchResult;
use crate::context::Context;
use crate::report::{Percentiles, Table, alternating, joined, median, verdict};
use crate::scenarios::emit_cost::{self, WriteKind};
use crate::scenarios::publish_throughput::http_publish;

const PATIENCE: Duration = Duration::from_secs(10);
const WRITERS: [usize; 2] = [1, 8];
const PUBLISHERS: usize = 64;

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

/// A schema whose notifications can be switched between the variants.
struct Sealing {
    client: tokio_postgres::Client,
    schema: String,
    /// The schema's own sealing function, to restore after the open variant.
    sealing_sql: String,
}

impl Sealing {
    async fn of(database_url: &str, schema: &str) -> BenchResult<Sealing> {
        let client = eventrelay::connect(database_url).await?;
        let definition = "SELECT pg_get_functiondef(p.oid) FROM pg_proc p
             JOIN pg_namespace n ON n.oid = p.pronamespace
             WHERE n.nspname = $1 AND p.proname = 'seal'";
        let sealing_sql = client.query_one(definition, &[&schema]).await?.get(0);
        let schema = schema.to_owned();
        Ok(Sealing {
            client,
            schema,
            sealing_sql,
        })
    }

    /// Switches the schema to `variant`: the sealing function and the
    /// payload size the trigger plans with.
    async fn switch(&self, variant: Variant) -> BenchResult<()> {
        let (client, schema) = (&self.client, &self.schema);
        let max = MAX_NOTIFY_PAYLOAD_BYTES;
        let (seal, max_payload) = match variant {
            Variant::Sealed => (self.sealing_sql.clone(), max),
            Variant::SealedBare => (self.sealing_sql.clone(), 100),
            Variant::Open => (
                format!(
                    "CREATE OR REPLACE FUNCTION {schema}.seal(origin text, payload text) RETURNS text
                     LANGUAGE sql IMMUTABLE AS $seal$ SELECT payload $seal$"
                ),
                max,
            ),
        };
        client.batch_execute(&seal).await?;
        let update = format!("UPDATE {schema}.settings SET max_notify_payload = $1");
        client.execute(&update, &[&(max_payload as i32)]).await?;
        Ok(())
    }
}

/// Per variant, per alternating round: emit throughput at each of
/// [`WRITERS`], then `samples` single-event latencies.
async fn emit_rounds(
    database_url: &str,
    schema: &str,
    rounds: usize,
    run_for: Duration,
    samples: usize,
) -> BenchResult<Vec<Vec<(Vec<f64>, Vec<u64>)>>> {
    let sealing = Sealing::of(database_url, schema).await?;
    emit_cost::prepare(database_url, schema).await?;
    let figures = alternating(rounds, Variant::ALL.len(), async |round, index| {
        let variant = Variant::ALL[index];
        sealing.switch(variant).await?;
        let mut tps = Vec::new();
        for n in WRITERS {
            let (name, round) = (variant.name(), round + 1);
            eprintln!("sealing: {name}, {n} writers, round {round}");
            let kind = WriteKind::WithSqlEmit;
            tps.push(emit_cost::measure(database_url, schema, kind, n, run_for).await?);
        }
        Ok((tps, latency(database_url, schema, variant, samples).await?))
    })
    .await;
    // Leave the schema sealed, whatever happened.
    sealing.switch(Variant::Sealed).await?;
    figures
}

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
    let options = PgConnectOptions::parse(database_url)?;
    let mut listener = ListenConnection::connect_options(&options, PATIENCE).await?;
    // The bench schema's channel has the schema's name.
    listener.listen(&name, Some(PATIENCE)).await?;
    let emit = format!("SELECT {schema}.emit('bench.seal'::text, 'seal-cost'::text, $1::jsonb)");
    let emit = emitter.prepare(&emit).await?;
    let read_back = format!(
        "SELECT seq, data FROM {schema}.outbox WHERE scope_key = 'seal-cost' AND seq > $1 ORDER BY seq LIMIT 500"
    );
    let read_back = reader.prepare(&read_back).await?;
    let mut latencies = Vec::with_capacity(samples);
    for n in 0..samples {
        let (sent, data) = (Instant::now(), json!({"n": n, "pad": "p".repeat(200)}));
        emitter.execute(&emit, &[&data]).await?;
        let heard = tokio::time::timeout(PATIENCE, listener.next(None)).await??;
        let text = match variant {
            Variant::Open => heard.payload().to_owned(),
            _ => key.open(heard.payload())?.1,
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
    Ok(latencies)
}

type HttpRounds = (Vec<f64>, Vec<f64>, f64);

/// HTTP publish rates at [`PUBLISHERS`], sealed and open in alternating
/// rounds, and the bytes of rows one group's pointer carries on average. The
/// channel points elsewhere meanwhile (the relay cannot take open payloads):
/// this is the publishing transaction's cost; `open_micros` is the relay's.
async fn http_rounds(cx: &Context, rounds: usize, run_for: Duration) -> BenchResult<HttpRounds> {
    let schema = cx.schema.as_str();
    let sealing = Sealing::of(cx.db(), schema).await?;
    let client = &sealing.client;
    let relay = cx.start_relay(cx.settings()).await?;
    let select = format!("SELECT channel FROM {schema}.settings");
    let channel: String = client.query_one(&select, &[]).await?.get(0);
    let set_channel = format!("UPDATE {schema}.settings SET channel = $1");
    let unheard = format!("{channel}_unheard");
    client.execute(&set_channel, &[&unheard]).await?;
    let outcome = async {
        let rates = alternating(rounds, 2, async |round, index| {
            let variant = Variant::ALL[index];
            sealing.switch(variant).await?;
            let (name, round) = (variant.name(), round + 1);
            eprintln!("sealing: HTTP publish, {PUBLISHERS} publishers, {name}, round {round}");
            let f = http_publish(relay.address(), PUBLISHERS, run_for).await?;
            Ok(f.events_per_second)
        })
        .await?;
        let metrics = relay.metrics().await;
        let [sum, count] =
            ["sum", "count"].map(|k| metrics.value(&format!("publish_group_requests_{k}")));
        let group = sum / count.max(1.0);
        // The envelopes' size as the relay writes them into its pointers.
        let written = eventrelay::store::Outbox::new(&Identifier::new(schema)?)
            .read_since(client, "publish-bench", 0, 200)
            .await?;
        let envelope = written
            .iter()
            .map(|e| serde_json::to_string(e).map_or(0, |text| text.len()))
            .sum::<usize>()
            / written.len().max(1);
        let [sealed, open] = [0, 1].map(|i| rates[i].clone());
        BenchResult::Ok((sealed, open, group * (envelope + 1) as f64))
    }
    .await;
    sealing.switch(Variant::Sealed).await?;
    client.execute(&set_channel, &[&channel]).await?;
    outcome
}

/// Microseconds each step of `seal` takes for a payload of `bytes`, over
/// `rounds` calls; each includes one PL/pgSQL statement, as `seal`'s do.
pub async fn steps(
    database_url: &str,
    schema: &str,
    bytes: usize,
    rounds: i32,
) -> BenchResult<Vec<(String, f64)>> {
    const ENCRYPT: &str = "body := iv || encrypt_iv(convert_to('P' || payload, 'UTF8'), \
                           substring(k FROM 1 FOR 32), iv, 'aes-cbc/pad:pkcs'::text)";
    const HMAC: &str = "tag := hmac(body, substring(k FROM 33 FOR 32), 'sha256'::text)";
    const BASE64: &str = "r := replace(encode(body || tag, 'base64'), E'\n', '')";
    let timed = [
        ("read the key", "SELECT n.key INTO k FROM notify_key n"),
        ("random IV", "iv := gen_random_bytes(16)"),
        ("AES-256-CBC", ENCRYPT),
        ("HMAC-SHA256", HMAC),
        ("base64", BASE64),
        ("seal, whole", "r := seal('P', payload)"),
    ];
    // Each step timed over `rounds` runs of its statement.
    let loops = timed.map(|(step, statement)| {
        format!(
            "t := clock_timestamp(); FOR i IN 1..rounds LOOP {statement}; END LOOP;
             step := '{step}'; micros := extract(epoch FROM clock_timestamp() - t) * 1e6 / rounds;
             RETURN NEXT;\n"
        )
    });
    let mut client = eventrelay::connect(database_url).await?;
    let tx = client.transaction().await?;
    // `seal`'s own search_path (pgcrypto's schema among it), for the steps.
    let path: String = tx
        .query_one(
            "SELECT substring(c FROM 'search_path=(.*)') FROM pg_proc p
             JOIN pg_namespace n ON n.oid = p.pronamespace, unnest(p.proconfig) c
             WHERE n.nspname = $1 AND p.proname = 'seal' AND c LIKE 'search_path=%'",
            &[&schema],
        )
        .await?
        .get(0);
    tx.execute("SELECT set_config('search_path', $1, true)", &[&path])
        .await?;
    tx.batch_execute(&format!(
        "CREATE FUNCTION pg_temp.seal_steps(payload text, rounds int)
         RETURNS TABLE (step text, micros float8) LANGUAGE plpgsql AS $steps$
         DECLARE
             k bytea; iv bytea; body bytea; tag bytea; r text; i int; t timestamptz;
         BEGIN
             SELECT n.key INTO k FROM notify_key n;
             iv := gen_random_bytes(16);
             {ENCRYPT};
             {}
         END
         $steps$",
        loops.concat()
    ))
    .await?;
    let rows = tx
        .query(
            "SELECT step, micros FROM pg_temp.seal_steps(repeat('x', $1), $2)",
            &[&(bytes as i32), &rounds],
        )
        .await?;
    tx.rollback().await?;
    Ok(rows.iter().map(|row| (row.get(0), row.get(1))).collect())
}

pub fn open_micros(len: usize) -> BenchResult<f64> {
    let key = SealKey::new(&[7; 64])?;
    let sealed = key.seal(Origin::Rows, &"x".repeat(len), [3; 16]);
    let (rounds, started) = (20_000, Instant::now());
    for _ in 0..rounds {
        std::hint::black_box(key.open(std::hint::black_box(&sealed))?);
    }
    Ok(started.elapsed().as_secs_f64() * 1e6 / rounds as f64)
}

pub async fn rows(cx: &Context, table: &mut Table) -> BenchResult<()> {
    let schema = cx.schema.as_str();
    let (rounds, run_for, samples) = if cx.args.quick {
        (2, Duration::from_secs(2), 200)
    } else {
        (5, Duration::from_secs(4), 600)
    };
    let figures = emit_rounds(cx.db(), schema, rounds, run_for, samples).await?;
    let tps = |variant: usize, w: usize| -> Vec<f64> {
        figures[variant].iter().map(|(tps, _)| tps[w]).collect()
    };
    for (w, writers) in WRITERS.iter().enumerate() {
        let base = median(&tps(0, w));
        let cells: Vec<String> = Variant::ALL
            .iter()
            .enumerate()
            .map(|(index, variant)| {
                let tps = median(&tps(index, w));
                format!("{} {tps:.0} tx/s ({:.2}×)", variant.name(), tps / base)
            })
            .collect();
        // Each round's sealed rate over its open one: neighbours in time
        // share the machine's state, which drifts by a tenth over a run.
        let (sealed, open) = (tps(0, w), tps(1, w));
        let paired: Vec<f64> = sealed.iter().zip(&open).map(|(s, o)| s / o).collect();
        let ratio = median(&paired);
        let (cells, paired) = (cells.join(" · "), joined(&paired, 3, " / "));
        table.add(
            format!("sealing: SQL emit(), {writers} writer(s), medians of {rounds} rounds"),
            format!("{cells} · sealed over open per round {paired} (median {ratio:.3}×)"),
            format!("sealed ≥ 0.95× open: {}", verdict(ratio >= 0.95)),
        );
    }
    let cells: Vec<String> = Variant::ALL
        .iter()
        .zip(&figures)
        .map(|(variant, rounds)| {
            let mut samples: Vec<u64> = rounds.iter().flat_map(|(_, l)| l.clone()).collect();
            let p = Percentiles::of(&mut samples);
            format!("{} {}", variant.name(), p.p50_p99())
        })
        .collect();
    let events = samples * rounds;
    table.note(
        format!("sealing: emit+commit to rows in hand, 1 writer, {events} events each"),
        cells.join(" · "),
    );
    // Throughput at saturation swings by a tenth from run to run here:
    // more and longer rounds, each judged against its own neighbour.
    let (http_rounds_n, http_seconds) = if cx.args.quick { (2, 2) } else { (5, 8) };
    let http_run_for = Duration::from_secs(http_seconds);
    let (sealed, open, group_rows) = http_rounds(cx, http_rounds_n, http_run_for).await?;
    let (sealed_rate, open_rate) = (median(&sealed), median(&open));
    let paired: Vec<f64> = sealed.iter().zip(&open).map(|(s, o)| s / o).collect();
    let ratio = median(&paired);
    let paired = joined(&paired, 3, " / ");
    let [sealed, open] = [sealed, open].map(|rates| joined(&rates, 0, " / "));
    table.add(
        format!("sealing: HTTP publish, {PUBLISHERS} publishers, {http_rounds_n} rounds of {http_seconds}s"),
        format!(
            "sealed {sealed_rate:.0} · open {open_rate:.0} events/s (medians) · sealed over open per round {paired} (median {ratio:.3}×) · rounds sealed {sealed} · open {open}"
        ),
        format!("sealed ≥ 0.95× open: {}", verdict(ratio >= 0.95)),
    );
    // One group's pointer: its events' envelopes, joined, in the
    // pointer's own fields (a larger group splits into several).
    let group_bytes = (group_rows as usize + 80).min(MAX_NOTIFY_PAYLOAD_BYTES);
    for (label, bytes) in [
        ("an average publish group", group_bytes),
        ("one SQL emit", 300),
    ] {
        let cell = |(step, micros): &(String, f64)| format!("{step} {micros:.1} µs");
        let steps = steps(cx.db(), schema, bytes, 2_000).await?;
        let cells: Vec<String> = steps.iter().map(cell).collect();
        table.note(
            format!("sealing: the steps of {label} ({bytes}-byte pointer)"),
            cells.join(" · "),
        );
    }
    let (small, limit) = (open_micros(300)?, open_micros(MAX_NOTIFY_PAYLOAD_BYTES)?);
    table.note(
        "sealing: the relay opening one payload",
        format!(
            "{small:.1} µs for a 300-byte pointer · {limit:.1} µs at the {MAX_NOTIFY_PAYLOAD_BYTES}-byte limit"
        ),
    );
    Ok(())
}
