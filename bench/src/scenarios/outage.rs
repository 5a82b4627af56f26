//! What a logical-mode relay that is down costs the primary: a relay
//! streams, is killed (SIGKILL, so nothing shuts down cleanly), and events
//! are committed at a fixed rate for the outage's length while the
//! replication slots, the WAL written and the size of `pg_wal` are sampled.
//! The relay's slot is temporary, so it ends with its session and nothing
//! holds WAL for the relay while it is away.

use crate::context::Context;
use crate::report::{Table, size, verdict};
use std::sync::Arc;
use std::time::Duration;

use crate::BenchResult;
use crate::clock::CommitLog;
use crate::database::{create_schema_for, drop_schema, unique_schema};
use crate::publish::{Pace, Source, publish_for};
use crate::relay_process::{RelayProcess, RelaySettings};
use eventrelay::store::WakeupMode;

/// One sample of the server during the outage.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    pub slots: i64,
    /// WAL the slots hold back: the furthest any slot's restart point is
    /// behind the current position (0 without slots).
    pub held_bytes: i64,
    pub wal_dir_bytes: i64,
}

#[derive(Debug, Clone)]
pub struct OutageFigures {
    /// Slots while the relay streamed.
    pub slots_before: i64,
    pub samples: Vec<Sample>,
    pub wal_written_bytes: i64,
    pub committed: usize,
}

async fn sample(client: &tokio_postgres::Client) -> BenchResult<Sample> {
    let row = client
        .query_one(
            "SELECT (SELECT count(*) FROM pg_replication_slots),
                    coalesce((SELECT max(pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn))::bigint
                              FROM pg_replication_slots), 0),
                    (SELECT sum(size)::bigint FROM pg_ls_waldir())",
            &[],
        )
        .await?;
    Ok(Sample {
        slots: row.get(0),
        held_bytes: row.get(1),
        wal_dir_bytes: row.get(2),
    })
}

pub async fn run(
    relay_bin: &std::path::Path,
    work_dir: &std::path::Path,
    database_url: &str,
    outage: Duration,
    per_second: f64,
) -> BenchResult<OutageFigures> {
    let schema = unique_schema("outage");
    create_schema_for(database_url, &schema, WakeupMode::Logical).await?;
    let (client, connection) = tokio_postgres::connect(database_url, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    let outcome = async {
        let mut settings = RelaySettings::new(database_url, &schema);
        settings.wakeup = "logical";
        let relay = RelayProcess::start(relay_bin, work_dir, &settings).await?;
        let slots_before = sample(&client).await?.slots;
        std::process::Command::new("kill")
            .args(["-KILL", &relay.pid().to_string()])
            .status()?;
        let start_lsn: String = client
            .query_one("SELECT pg_current_wal_lsn()::text", &[])
            .await?
            .get(0);

        let log = CommitLog::new((per_second * outage.as_secs_f64()).ceil() as usize + 1);
        let source = Source::Emit {
            database_url: database_url.to_owned(),
            schema: schema.clone(),
        };
        let publishing = tokio::spawn(async move {
            publish_for(
                &source,
                Arc::new(|_| "outage".to_owned()),
                Pace::PerSecond(per_second),
                outage,
                2,
                log,
            )
            .await
            .map_err(|e| e.to_string())
        });
        let mut samples = Vec::new();
        let every = outage / 6;
        for _ in 0..6 {
            tokio::time::sleep(every).await;
            samples.push(sample(&client).await?);
        }
        let committed = publishing.await.map_err(|e| e.to_string())??;
        let wal_written_bytes: i64 = client
            .query_one(
                "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::text::pg_lsn)::bigint",
                &[&start_lsn],
            )
            .await?
            .get(0);
        drop(relay);
        Ok(OutageFigures {
            slots_before,
            samples,
            wal_written_bytes,
            committed,
        })
    }
    .await;
    drop_schema(database_url, &schema).await;
    outcome
}
/// A logical relay down for 60 s (10 s with `--quick`) while events
/// commit: what its absence holds on the primary.
pub async fn rows(cx: &Context, table: &mut Table) -> BenchResult<()> {
    let Some(db) = cx.args.logical_database_url.as_deref() else {
        eprintln!("outage: no --logical-database-url, skipped");
        return Ok(());
    };
    let length = Duration::from_secs(if cx.args.quick { 10 } else { 60 });
    const PER_SECOND: f64 = 200.0;
    eprintln!("outage: a logical relay killed, {length:?} of commits");
    let f = run(
        &cx.args.relay_bin,
        &cx.args.work_dir,
        db,
        length,
        PER_SECOND,
    )
    .await?;
    let most_slots = f.samples.iter().map(|s| s.slots).max().unwrap_or(0);
    let most_held = f.samples.iter().map(|s| s.held_bytes).max().unwrap_or(0);
    let wal_dir: Vec<String> = f
        .samples
        .iter()
        .map(|s| size(s.wal_dir_bytes as f64))
        .collect();
    table.add(
        format!(
            "logical relay killed (SIGKILL), {}s outage, {PER_SECOND} commits/s, sampled every {}s",
            length.as_secs(),
            length.as_secs() / 6
        ),
        format!(
            "slots while streaming {} · slots during the outage at most {most_slots} · WAL held by slots at most {} · {} committed, {} of WAL written · pg_wal {}",
            f.slots_before,
            size(most_held as f64),
            f.committed,
            size(f.wal_written_bytes as f64),
            wal_dir.join(" → ")
        ),
        format!(
            "no slot and no WAL held while the relay is down: {}",
            verdict(most_slots == 0 && most_held == 0)
        ),
    );
    Ok(())
}
