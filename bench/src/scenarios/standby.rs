//! Relays decoding on a physical standby against relays decoding on the
//! primary: a Postgres 16+ primary and its streaming standby (bench/run
//! starts both), N logical-mode relays whose pools write to the primary and
//! whose replication streams read either the primary or the standby, and
//! durable events committed at a fixed rate. Measures the CPU the relays
//! cost the primary per 1,000 commits (its WAL senders, the relays' pooled
//! connections, the postmaster and background processes; the writers' own
//! backends do the same work either way and are left out), and
//! commit-to-receive latency for a subscriber of the first relay.

use crate::context::Context;
use crate::report::{Table, verdict};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::BenchResult;
use crate::database::{create_schema_for, drop_schema, unique_schema};
use crate::publish::{Pace, Source};
use crate::relay_process::{RelayProcess, RelaySettings};
use crate::scenarios::fanout::{self, FanoutFigures, FanoutPlan, Server};
use eventrelay::store::WakeupMode;

/// The primary and its standby.
pub struct Pair {
    pub primary_url: String,
    pub standby_url: String,
    /// The primary's data directory: its `postmaster.pid` names the
    /// process whose children are the primary's work.
    pub primary_data: PathBuf,
}

/// Where the relays' replication streams read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    Primary,
    Standby,
}

impl Placement {
    pub fn as_str(self) -> &'static str {
        match self {
            Placement::Primary => "primary",
            Placement::Standby => "standby",
        }
    }
}

pub struct Run<'a> {
    pub relay_bin: &'a Path,
    pub work_dir: &'a Path,
    pub pair: &'a Pair,
    pub relays: usize,
    pub placement: Placement,
    pub per_second: f64,
    pub duration: Duration,
}

/// The postmaster and its children now: every process of the primary.
fn primary_processes(data: &Path) -> BenchResult<Vec<u32>> {
    let pid_file = std::fs::read_to_string(data.join("postmaster.pid"))
        .map_err(|e| format!("cannot read the primary's postmaster.pid: {e}"))?;
    let postmaster: u32 = pid_file
        .lines()
        .next()
        .and_then(|line| line.trim().parse().ok())
        .ok_or("postmaster.pid names no process")?;
    let mut pids = vec![postmaster];
    pids.extend(crate::proc_stats::children_of(postmaster));
    Ok(pids)
}

/// Waits until the standby has replayed the schema's creation, so a relay
/// reading it finds the publication.
async fn replayed(standby_url: &str, schema: &str) -> BenchResult<()> {
    let (client, connection) = tokio_postgres::connect(standby_url, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    for _ in 0..500 {
        let found = client
            .query_opt("SELECT 1 FROM pg_namespace WHERE nspname = $1", &[&schema])
            .await?;
        if found.is_some() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Err(format!("the standby never replayed schema {schema}").into())
}

pub async fn run(run: &Run<'_>) -> BenchResult<FanoutFigures> {
    let pair = run.pair;
    let schema = unique_schema("standby");
    create_schema_for(&pair.primary_url, &schema, WakeupMode::Logical).await?;
    let outcome = async {
        replayed(&pair.standby_url, &schema).await?;
        let mut settings = RelaySettings::new(&pair.primary_url, &schema);
        settings.wakeup = "logical";
        settings.pool_size = 2;
        settings.listen_url = Some(match run.placement {
            Placement::Primary => pair.primary_url.clone(),
            Placement::Standby => pair.standby_url.clone(),
        });
        let mut relays = Vec::new();
        for _ in 0..run.relays {
            relays.push(RelayProcess::start(run.relay_bin, run.work_dir, &settings).await?);
        }
        // Every relay is streaming by now (each is ready only then); the
        // processes counted are the primary's at this point.
        let server = Server::Eventrelay {
            address: relays[0].address(),
            pids: primary_processes(&pair.primary_data)?,
        };
        let plan = FanoutPlan {
            subscribers: 1,
            scopes: 1,
            scope_prefix: format!("standby-{}-{}", run.placement.as_str(), run.relays),
            pace: Pace::PerSecond(run.per_second),
            duration: run.duration,
            writers: 2,
            source: Source::Emit {
                database_url: pair.primary_url.clone(),
                schema: schema.clone(),
            },
        };
        let figures = fanout::run(&plan, &server).await;
        for relay in &mut relays {
            relay.terminate(Duration::from_secs(10)).await?;
        }
        figures
    }
    .await;
    drop_schema(&pair.primary_url, &schema).await;
    outcome
}
/// Relays decoding on the primary against relays decoding on its standby,
/// 1, 5 and 10 of them, alternating placements at each count.
pub async fn rows(cx: &Context, table: &mut Table) -> BenchResult<()> {
    let (Some(primary_url), Some(standby_url), Some(primary_data)) = (
        cx.args.standby_primary_url.clone(),
        cx.args.standby_url.clone(),
        cx.args.standby_primary_data.clone(),
    ) else {
        eprintln!(
            "standby: no --standby-primary-url/--standby-url/--standby-primary-data, skipped"
        );
        return Ok(());
    };
    let pair = Pair {
        primary_url,
        standby_url,
        primary_data,
    };
    const PER_SECOND: f64 = 200.0;
    for relays in [1, 5, 10] {
        let mut cpu = Vec::new();
        for placement in [Placement::Primary, Placement::Standby] {
            eprintln!(
                "standby: {relays} relay(s) decoding on the {}",
                placement.as_str()
            );
            let f = run(&Run {
                relay_bin: &cx.args.relay_bin,
                work_dir: &cx.args.work_dir,
                pair: &pair,
                relays,
                placement,
                per_second: PER_SECOND,
                duration: cx.scale.fixed_run,
            })
            .await?;
            cpu.push(f.cpu_seconds_per_1000);
            table.add(
                format!(
                    "{relays} logical relay(s) decoding on the {}, {PER_SECOND} commits/s, emit (commit-to-receive, 1 subscriber)",
                    placement.as_str()
                ),
                format!(
                    "primary CPU {:.1} ms per 1,000 commits · {} · {} of {} received",
                    f.cpu_seconds_per_1000 * 1000.0,
                    f.latency.summary(),
                    f.delivered,
                    f.expected
                ),
                match placement {
                    Placement::Primary => "–".to_owned(),
                    Placement::Standby => format!(
                        "standby takes the decoding off the primary: {}",
                        verdict(cpu[1] < cpu[0])
                    ),
                },
            );
        }
    }
    Ok(())
}
