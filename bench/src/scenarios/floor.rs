//! Latency at the floor: eventrelay's two lanes of HTTP publish (durable
//! and ephemeral) against nchan, an in-memory broker, at the same loads
//! and in rounds of alternating order (nchan's own figures swing from
//! run to run, so each side meets every stretch of the machine's time).
//! With the control, nchan runs twice per round, and its second run over
//! its first is the spread two runs of one server show on this machine.
//! Also measured in the same run: what one commit costs on this machine
//! (a one-row commit loop, with and without waiting for the flush, back to
//! back and at each load's pace), what the relay's own publishing
//! statement costs at each load's pace with no relay running (until its
//! commit is answered, and until a listening connection hears it: the
//! database's part of the durable lane, which no relay in the notify
//! wake-up mode can go under), and where eventrelay's time goes, stage by
//! stage, from the relay's `eventrelay_latency_stage_seconds` histograms.

use crate::context::Context;
use crate::report::{Table, median, ms, verdict};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use eventrelay::publisher::{
    Identifier, ListenConnection, NewEvent, PgConnectOptions, Publisher, TcpSettings,
};
use eventrelay::store::Database;

use crate::BenchResult;
use crate::clock::Percentiles;
use crate::metrics::Metrics;
use crate::publish::{Pace, Source, TICK_TYPE, event_data};
use crate::relay_process::{RelayProcess, RelaySettings};
use crate::scenarios::fanout::{self, FanoutFigures, FanoutPlan, Server};

/// One-row commits per measurement of the commit time.
const COMMITS: usize = 400;

/// One-row commits timed at a load's pace: about five seconds' worth,
/// and enough for a p99 even at the slowest load.
fn paced_commits(per_second: f64) -> usize {
    ((per_second * 5.0).round() as usize).clamp(20, 200)
}

/// The sides, in the order of the first round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    Nchan,
    Durable,
    Ephemeral,
    /// nchan once more in the same round (`--floor-control`): two runs of
    /// one unchanged server, whose quotient is how far apart two runs of a
    /// round land by the machine alone, the band inside which a lane's
    /// quotient over nchan's says nothing either way.
    NchanAgain,
}

impl Side {
    pub const ALL: [Side; 4] = [
        Side::Nchan,
        Side::Durable,
        Side::Ephemeral,
        Side::NchanAgain,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Side::Nchan => "nchan",
            Side::Durable => "eventrelay durable",
            Side::Ephemeral => "eventrelay ephemeral",
            Side::NchanAgain => "nchan again",
        }
    }
}

/// The sides of round `round`, each round starting one later than the one
/// before (N D E, D E N, E N D, ...).
///
/// With the control, nchan's two runs take turns with the lanes (D N E N',
/// E N D N', D N' E N, E N' D N, ...), so that every run of nchan comes
/// right after one of the relay's, as nchan's one run does without the
/// control: run right after itself, nchan's median was 1.5 times as long
/// with 10,000 subscribers at 2 events a second.
pub fn round_order(round: usize, control: bool) -> Vec<Side> {
    use Side::*;
    if !control {
        let mut order = vec![Nchan, Durable, Ephemeral];
        let turn = round % order.len();
        order.rotate_left(turn);
        return order;
    }
    let lanes = if round % 2 == 0 {
        [Durable, Ephemeral]
    } else {
        [Ephemeral, Durable]
    };
    let nchan = if round % 4 < 2 {
        [Nchan, NchanAgain]
    } else {
        [NchanAgain, Nchan]
    };
    vec![lanes[0], nchan[0], lanes[1], nchan[1]]
}

pub struct FloorPlan<'a> {
    pub relay_bin: &'a Path,
    pub work_dir: &'a Path,
    pub database_url: &'a str,
    pub schema: &'a str,
    /// nchan's subscriber side and its publisher URL; without them the
    /// rounds hold eventrelay's lanes only.
    pub nchan: Option<(Server, String)>,
    /// Subscribers and events per second of each load.
    pub loads: Vec<(usize, f64)>,
    pub duration: Duration,
    pub rounds: usize,
    /// Run nchan twice per round (needs nchan).
    pub control: bool,
}

/// One load's runs.
pub struct LoadFigures {
    pub subscribers: usize,
    pub per_second: f64,
    /// Each run's figures, by side, in round order.
    pub runs: Vec<(Side, FanoutFigures)>,
    /// The relay's stage histograms over all runs of a lane.
    pub stages: Vec<(Side, Stages)>,
    /// One-row commits (with the flush) made as often as this load's
    /// events, before its runs.
    pub paced_commit: Percentiles,
    /// The relay's publishing statement, as often as this load's events,
    /// before its runs.
    pub announced: AnnouncedCommit,
}

impl LoadFigures {
    /// The figures of one side's runs, in round order.
    pub fn of(&self, side: Side) -> Vec<&FanoutFigures> {
        self.runs
            .iter()
            .filter(|(s, _)| *s == side)
            .map(|(_, f)| f)
            .collect()
    }
}

/// One-row commits on this machine: the whole statement round trip with
/// the flush (`synchronous_commit = on`) and without it.
#[derive(Debug, Clone, Copy, Default)]
pub struct CommitTime {
    pub flushed: Percentiles,
    pub unflushed: Percentiles,
}

impl CommitTime {
    /// The flush's own share, at the median.
    pub fn flush_p50(&self) -> Duration {
        self.flushed.p50.saturating_sub(self.unflushed.p50)
    }
}

pub struct FloorFigures {
    /// Measured before the loads and after them.
    pub commit: [CommitTime; 2],
    pub loads: Vec<LoadFigures>,
}

pub async fn run(plan: &FloorPlan<'_>) -> BenchResult<FloorFigures> {
    let before = commit_time(plan.database_url, plan.schema).await?;
    let mut loads = Vec::new();
    for (index, &(subscribers, per_second)) in plan.loads.iter().enumerate() {
        loads.push(run_load(plan, index, subscribers, per_second).await?);
    }
    let after = commit_time(plan.database_url, plan.schema).await?;
    Ok(FloorFigures {
        commit: [before, after],
        loads,
    })
}

async fn run_load(
    plan: &FloorPlan<'_>,
    index: usize,
    subscribers: usize,
    per_second: f64,
) -> BenchResult<LoadFigures> {
    let paced_commit = paced_commit_time(
        plan.database_url,
        plan.schema,
        per_second,
        paced_commits(per_second),
    )
    .await?;
    let announced = announced_commit_time(
        plan.database_url,
        plan.schema,
        per_second,
        paced_commits(per_second),
    )
    .await?;
    // One relay serves both lanes; the stage histograms are read around
    // each run, so each lane's stages are its own.
    let relay = RelayProcess::start(
        plan.relay_bin,
        plan.work_dir,
        &RelaySettings::new(plan.database_url, plan.schema).in_own_session(),
    )
    .await?;
    let ours = Server::Eventrelay {
        address: relay.address(),
        pids: vec![relay.pid()],
    };
    let mut runs = Vec::new();
    let mut stages: Vec<(Side, Stages)> = vec![
        (Side::Durable, Stages::default()),
        (Side::Ephemeral, Stages::default()),
    ];
    for round in 0..plan.rounds {
        for side in round_order(round, plan.control) {
            let (server, source) = match side {
                Side::Nchan | Side::NchanAgain => match &plan.nchan {
                    Some((server, url)) => (server, Source::Nchan { url: url.clone() }),
                    None => continue,
                },
                Side::Durable => (
                    &ours,
                    Source::HttpPublish {
                        base: relay.base.clone(),
                    },
                ),
                Side::Ephemeral => (
                    &ours,
                    Source::HttpPublishEphemeral {
                        base: relay.base.clone(),
                    },
                ),
            };
            eprintln!(
                "floor: {subscribers} subs × {per_second} ev/s, round {}, {}",
                round + 1,
                side.label()
            );
            let before = Stages::parse(&relay.metrics().await);
            let fanout_plan = FanoutPlan {
                subscribers,
                scopes: 1,
                scope_prefix: format!("floor-{index}-{round}-{side:?}"),
                pace: Pace::PerSecond(per_second),
                duration: plan.duration,
                writers: 4,
                source,
            };
            let figures = fanout::run(&fanout_plan, server).await?;
            if let Some((_, total)) = stages.iter_mut().find(|(s, _)| *s == side) {
                let after = Stages::parse(&relay.metrics().await);
                total.add(&after.minus(&before));
            }
            runs.push((side, figures));
        }
    }
    Ok(LoadFigures {
        subscribers,
        per_second,
        runs,
        stages,
        paced_commit,
        announced,
    })
}

/// The scenario's rows: the commit time, each side's runs per load, the
/// targets, and eventrelay's stage breakdown per lane.
pub fn report(figures: &FloorFigures, table: &mut Table) {
    let [before, after] = figures.commit;
    table.add(
        "floor: one-row commit on this machine, before / after the loads",
        format!(
            "flushed p50 {} / {} · p99 {} / {} · without the flush p50 {} / {} · the flush p50 {} / {}",
            ms(before.flushed.p50),
            ms(after.flushed.p50),
            ms(before.flushed.p99),
            ms(after.flushed.p99),
            ms(before.unflushed.p50),
            ms(after.unflushed.p50),
            ms(before.flush_p50()),
            ms(after.flush_p50()),
        ),
        "–",
    );
    // The smaller of the two measurements: the stricter target.
    let commit_p50 = before.flushed.p50.min(after.flushed.p50);
    let commit_p99 = before.flushed.p99.min(after.flushed.p99);
    for load in &figures.loads {
        let name = format!(
            "{} subs × {:.0} ev/s",
            thousands(load.subscribers),
            load.per_second
        );
        table.add(
            format!("floor {name}: one-row commit at this load's pace"),
            format!(
                "p50 {} · p99 {}, {} commits {:.0} a second",
                ms(load.paced_commit.p50),
                ms(load.paced_commit.p99),
                paced_commits(load.per_second),
                load.per_second
            ),
            "–",
        );
        table.add(
            format!("floor {name}: the relay's publishing statement at this load's pace, no relay running"),
            format!(
                "committed p50 {} · p99 {} · heard through LISTEN p50 {} · p99 {}, {} transactions {:.0} a second",
                ms(load.announced.committed.p50),
                ms(load.announced.committed.p99),
                ms(load.announced.heard.p50),
                ms(load.announced.heard.p99),
                paced_commits(load.per_second),
                load.per_second
            ),
            "–",
        );
        let mut medians = Vec::new();
        for side in Side::ALL {
            let runs = load.of(side);
            if runs.is_empty() {
                continue;
            }
            let p50s: Vec<f64> = runs.iter().map(|f| millis(f.latency.p50)).collect();
            let p99s: Vec<f64> = runs.iter().map(|f| millis(f.latency.p99)).collect();
            // Seconds per 1,000 deliveries are milliseconds per delivery.
            let cpu: Vec<f64> = runs
                .iter()
                .map(|f| f.cpu_seconds_per_1000 * 1000.0)
                .collect();
            let system: Vec<f64> = runs
                .iter()
                .map(|f| f.system_seconds_per_1000 * 1000.0)
                .collect();
            let firsts: Vec<f64> = runs.iter().map(|f| millis(f.first_arrival.p50)).collect();
            let all = runs.iter().all(|f| f.delivered == f.expected);
            let (p50, p99) = (median(&p50s), median(&p99s));
            medians.push((side, p50, p99));
            table.add(
                format!("floor {name}, {} (send-to-receive), {} rounds", side.label(), runs.len()),
                format!(
                    "p50 {} ms (median {p50:.2}) · p99 {} ms (median {p99:.2}) · first subscriber p50 {} ms · CPU per delivery {:.2} µs, of it in the kernel {:.2} · {}",
                    joined(&p50s),
                    joined(&p99s),
                    joined(&firsts),
                    median(&cpu),
                    median(&system),
                    if all { "all received" } else { "some not received" }
                ),
                format!("all received: {}", verdict(all)),
            );
        }
        let of = |side| {
            medians
                .iter()
                .find(|(s, ..)| *s == side)
                .map(|&(_, p50, p99)| (p50, p99))
        };
        if let (Some(nchan), Some(durable), Some(ephemeral)) =
            (of(Side::Nchan), of(Side::Durable), of(Side::Ephemeral))
        {
            let large = load.subscribers >= 10_000;
            let ephemeral_met = ephemeral.1 <= nchan.1 && (large || ephemeral.0 <= nchan.0);
            let (commit50, commit99) = (millis(commit_p50), millis(commit_p99));
            let durable_met = durable.0 <= nchan.0 + commit50 && durable.1 <= nchan.1 + commit99;
            // For the reader: a commit made as seldom as this load's costs
            // more than one of a back-to-back loop (every process it
            // involves has gone idle in between). The verdict keeps the
            // back-to-back figure, the stricter one.
            let (paced50, paced99) = (millis(load.paced_commit.p50), millis(load.paced_commit.p99));
            let durable_met_at_pace =
                durable.0 <= nchan.0 + paced50 && durable.1 <= nchan.1 + paced99;
            // The durable lane's distance from nchan at the median, and how
            // much of it the database alone takes to announce a commit at
            // this pace: what is left is the relay's own.
            let heard50 = millis(load.announced.heard.p50);
            table.add(
                format!("floor {name}: targets on the medians"),
                format!(
                    "ephemeral p50 {:.2} / p99 {:.2} against nchan's {:.2} / {:.2} · durable {:.2} / {:.2} against nchan + one commit {:.2} / {:.2} (+ one commit at this pace {:.2} / {:.2}: {}) · durable p50 − nchan's {:.2}, of which the statement heard at this pace {:.2}",
                    ephemeral.0, ephemeral.1, nchan.0, nchan.1, durable.0, durable.1,
                    nchan.0 + commit50, nchan.1 + commit99,
                    nchan.0 + paced50, nchan.1 + paced99,
                    if durable_met_at_pace { "under" } else { "over" },
                    durable.0 - nchan.0,
                    heard50,
                ),
                format!(
                    "ephemeral {} nchan's: {} · durable ≤ nchan's + one commit: {}",
                    if large { "p99 ≤" } else { "p50 and p99 ≤" },
                    verdict(ephemeral_met),
                    verdict(durable_met)
                ),
            );
        }
        if let Some(row) = against_nchan_by_round(load) {
            table.add(
                format!("floor {name}: each round's p50 / p99 over nchan's of the same round"),
                row,
                "–",
            );
        }
        if let Some(row) = against_nchan_spread(load) {
            table.add(
                format!("floor {name}: each lane's median quotient against nchan's spread against itself"),
                row,
                "–",
            );
        }
        for (side, stages) in &load.stages {
            table.add(
                format!(
                    "floor {name}, {}: where the time goes (relay stages, p50 / mean)",
                    side.label()
                ),
                breakdown(stages),
                "–",
            );
        }
    }
}

/// Each lane's p50 and p99 divided by nchan's of the same round, per
/// round, with their medians: nchan's own figures swing from round to
/// round with the machine, and a round's three runs are minutes apart, so
/// these quotients move less between runs than the figures themselves.
/// With the control, nchan's second run of each round over its first
/// comes last: the spread two runs of one server show. `None` without
/// nchan.
fn against_nchan_by_round(load: &LoadFigures) -> Option<String> {
    let nchan = load.of(Side::Nchan);
    if nchan.is_empty() {
        return None;
    }
    let parts: Vec<String> = [Side::Ephemeral, Side::Durable, Side::NchanAgain]
        .into_iter()
        .filter(|side| !load.of(*side).is_empty())
        .map(|side| {
            let runs = load.of(side);
            let p50 = quotients(&runs, &nchan, |f| f.latency.p50);
            let p99 = quotients(&runs, &nchan, |f| f.latency.p99);
            format!(
                "{} p50 × {} (median {:.2}) · p99 × {} (median {:.2})",
                side.label(),
                joined(&p50),
                median(&p50),
                joined(&p99),
                median(&p99)
            )
        })
        .collect();
    Some(parts.join(" · "))
}

/// With the control: the range of nchan's second run over its first, at
/// the p50 and the p99, and where each lane's median quotient lies
/// against it (`under`, `inside` or `above`). A lane inside the range is
/// as far from nchan as nchan is from itself on this machine: the run
/// cannot tell the two apart. `None` without the control.
fn against_nchan_spread(load: &LoadFigures) -> Option<String> {
    let nchan = load.of(Side::Nchan);
    let again = load.of(Side::NchanAgain);
    let p50 = |runs: &[&FanoutFigures]| quotients(runs, &nchan, |f| f.latency.p50);
    let p99 = |runs: &[&FanoutFigures]| quotients(runs, &nchan, |f| f.latency.p99);
    let spread = [Spread::of(&p50(&again))?, Spread::of(&p99(&again))?];
    let mut parts = vec![format!(
        "nchan's second run over its first: p50 {} · p99 {}",
        spread[0], spread[1]
    )];
    for side in [Side::Ephemeral, Side::Durable] {
        let runs = load.of(side);
        if runs.is_empty() {
            continue;
        }
        let (ours50, ours99) = (median(&p50(&runs)), median(&p99(&runs)));
        parts.push(format!(
            "{} p50 {ours50:.2} ({}) · p99 {ours99:.2} ({})",
            side.label(),
            spread[0].place(ours50),
            spread[1].place(ours99)
        ));
    }
    Some(parts.join(" · "))
}

/// The lowest and highest of some quotients.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Spread {
    low: f64,
    high: f64,
}

impl Spread {
    fn of(values: &[f64]) -> Option<Spread> {
        let low = values.iter().copied().reduce(f64::min)?;
        let high = values.iter().copied().reduce(f64::max)?;
        Some(Spread { low, high })
    }

    fn place(self, value: f64) -> &'static str {
        if value < self.low {
            "under"
        } else if value > self.high {
            "above"
        } else {
            "inside"
        }
    }
}

impl std::fmt::Display for Spread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:.2}–{:.2}", self.low, self.high)
    }
}

/// `ours` over `theirs`, round by round, of the figure `of`; a round with
/// a zero figure on nchan's side is left out.
fn quotients(
    ours: &[&FanoutFigures],
    theirs: &[&FanoutFigures],
    of: impl Fn(&FanoutFigures) -> Duration,
) -> Vec<f64> {
    ours.iter()
        .zip(theirs)
        .filter(|(_, theirs)| !of(theirs).is_zero())
        .map(|(ours, theirs)| of(ours).as_secs_f64() / of(theirs).as_secs_f64())
        .collect()
}

/// Each stage's median and mean, in the order an event passes them.
fn breakdown(stages: &Stages) -> String {
    let parts: Vec<String> = STAGE_ORDER
        .iter()
        .filter_map(|name| {
            let stage = stages.stage(name)?;
            Some(format!(
                "{name} {:.3} / {:.3}",
                millis(stage.quantile(0.5)),
                millis(stage.mean())
            ))
        })
        .collect();
    if parts.is_empty() {
        return "no stage observed".to_owned();
    }
    format!("{} ms", parts.join(" · "))
}

fn millis(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

fn joined(values: &[f64]) -> String {
    let shown: Vec<String> = values.iter().map(|v| format!("{v:.2}")).collect();
    shown.join(", ")
}

fn thousands(n: usize) -> String {
    if n >= 1000 && n % 1000 == 0 {
        format!("{},000", n / 1000)
    } else {
        n.to_string()
    }
}

/// Times [`COMMITS`] one-row commits each way, back to back.
pub async fn commit_time(database_url: &str, schema: &str) -> BenchResult<CommitTime> {
    let client = commit_client(database_url, schema).await?;
    let flushed = timed_commits(&client, schema, "on", COMMITS, None).await?;
    let unflushed = timed_commits(&client, schema, "off", COMMITS, None).await?;
    Ok(CommitTime { flushed, unflushed })
}

/// Times `commits` one-row commits with the flush, one every
/// `1 / per_second` seconds: what a commit costs when it comes as seldom
/// as a load's events do.
pub async fn paced_commit_time(
    database_url: &str,
    schema: &str,
    per_second: f64,
    commits: usize,
) -> BenchResult<Percentiles> {
    let client = commit_client(database_url, schema).await?;
    let every = Duration::from_secs_f64(1.0 / per_second.max(0.001));
    timed_commits(&client, schema, "on", commits, Some(every)).await
}

/// The relay's publishing statement timed at a load's pace: from sending
/// its transaction to the answer to its `COMMIT`, and to a second
/// connection, `LISTEN`ing on the relay's channel, hearing its
/// notification.
#[derive(Debug, Clone, Copy, Default)]
pub struct AnnouncedCommit {
    pub committed: Percentiles,
    pub heard: Percentiles,
}

/// Writes `commits` durable events one at a time, one every
/// `1 / per_second` seconds, exactly as the relay writes a publish request
/// of one event: the relay's publisher, announcing its own rows, on a
/// connection of the relay's pool with its statements prepared, `BEGIN`,
/// the statement and `COMMIT` in one round trip. No relay runs meanwhile,
/// so the notification is heard by this connection only. The time until it
/// is heard is the least a relay in the notify wake-up mode can take from
/// a publish to its first write: everything after is the relay's own.
pub async fn announced_commit_time(
    database_url: &str,
    schema: &str,
    per_second: f64,
    commits: usize,
) -> BenchResult<AnnouncedCommit> {
    const STARTUP: Duration = Duration::from_secs(10);
    let options = PgConnectOptions::parse(database_url)?.with_tcp(TcpSettings::default());
    let db = Database::pool(&options, 1, STARTUP)?.with_prepared_statements(true);
    let publisher = Publisher::new(schema)?.announcing_rows();
    let mut listener = ListenConnection::connect_options(&options, STARTUP).await?;
    listener
        .listen(&Identifier::new(schema)?, Some(STARTUP))
        .await?;
    let connection = db.get().await?;
    let event = |number: usize| {
        publisher.prepare_batch(vec![NewEvent::durable(
            TICK_TYPE,
            "floor-announced",
            event_data(number),
        )])
    };
    // A first write teaches the pipeline its statements, prepared from
    // then on, as the relay's committers learn them.
    let pipeline = connection.pipeline(&[]).await?;
    publisher
        .emit_prepared_committed(&pipeline, event(0)?)
        .await?;
    let known = pipeline.unprepared();
    drop(pipeline);
    tokio::time::timeout(STARTUP, listener.next(None)).await??;

    let mut ticks = tokio::time::interval(Duration::from_secs_f64(1.0 / per_second.max(0.001)));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut committed = Vec::with_capacity(commits);
    let mut heard = Vec::with_capacity(commits);
    for number in 1..=commits {
        ticks.tick().await;
        let batch = event(number)?;
        let pipeline = connection.pipeline(&known).await?;
        let started = Instant::now();
        let write = async {
            let written = publisher.emit_prepared_committed(&pipeline, batch).await;
            written.map(|_| started.elapsed())
        };
        let hear = async {
            let notification = tokio::time::timeout(STARTUP, listener.next(None)).await;
            notification.map(|received| received.map(|_| started.elapsed()))
        };
        let (written, notified) = tokio::join!(write, hear);
        committed.push(written?.as_nanos() as u64);
        heard.push(notified??.as_nanos() as u64);
    }
    Ok(AnnouncedCommit {
        committed: Percentiles::of(&mut committed),
        heard: Percentiles::of(&mut heard),
    })
}

/// A connection with the commits' table in `schema`. Not a temporary
/// table: its changes are not written to the WAL, so its commits would
/// have nothing to flush.
async fn commit_client(database_url: &str, schema: &str) -> BenchResult<tokio_postgres::Client> {
    let client = eventrelay::connect(database_url).await?;
    client
        .batch_execute(&format!(
            "CREATE TABLE IF NOT EXISTS {schema}.floor_commits (n int)"
        ))
        .await?;
    Ok(client)
}

/// Times `commits` one-row commits under `synchronous_commit = setting`,
/// back to back or one every `every`.
async fn timed_commits(
    client: &tokio_postgres::Client,
    schema: &str,
    setting: &str,
    commits: usize,
    every: Option<Duration>,
) -> BenchResult<Percentiles> {
    client
        .batch_execute(&format!("SET synchronous_commit = {setting}"))
        .await?;
    let statement = client
        .prepare(&format!("INSERT INTO {schema}.floor_commits VALUES ($1)"))
        .await?;
    let mut ticks = every.map(|period| {
        let mut ticks = tokio::time::interval(period);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks
    });
    let mut samples = Vec::with_capacity(commits);
    for n in 0..commits as i32 {
        if let Some(ticks) = &mut ticks {
            ticks.tick().await;
        }
        let started = Instant::now();
        client.execute(&statement, &[&n]).await?;
        samples.push(started.elapsed().as_nanos() as u64);
    }
    Ok(Percentiles::of(&mut samples))
}

/// The stages of the relay's latency histograms, as `/metrics` serves
/// them (cumulative counts per bucket).
#[derive(Debug, Clone, Default)]
pub struct Stages {
    by_stage: BTreeMap<String, StageHistogram>,
}

#[derive(Debug, Clone, Default)]
pub struct StageHistogram {
    /// (upper bound in seconds, observations at or below it), ascending.
    buckets: Vec<(f64, f64)>,
    sum: f64,
    count: f64,
}

/// The stages in the order an event passes them.
pub const STAGE_ORDER: [&str; 7] = [
    "parse",
    "group_wait",
    "commit",
    "notify",
    "relay",
    "fan_out",
    "session",
];

const METRIC: &str = "eventrelay_latency_stage_seconds";

impl Stages {
    pub fn parse(metrics: &Metrics) -> Stages {
        let mut stages = Stages::default();
        for sample in &metrics.samples {
            let Some(kind) = sample.name.strip_prefix(METRIC) else {
                continue;
            };
            let Some(stage) = sample.label("stage") else {
                continue;
            };
            let histogram = stages.by_stage.entry(stage.to_owned()).or_default();
            match (kind, sample.label("le")) {
                ("_sum", _) => histogram.sum = sample.value,
                ("_count", _) => histogram.count = sample.value,
                ("_bucket", Some(le)) => {
                    let bound = le.parse().unwrap_or(f64::INFINITY);
                    histogram.buckets.push((bound, sample.value));
                }
                _ => {}
            }
        }
        for histogram in stages.by_stage.values_mut() {
            histogram.buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        }
        stages
    }

    /// What was observed between `earlier` and this.
    pub fn minus(&self, earlier: &Stages) -> Stages {
        let mut by_stage = BTreeMap::new();
        for (stage, now) in &self.by_stage {
            let then = earlier.by_stage.get(stage).cloned().unwrap_or_default();
            by_stage.insert(stage.clone(), now.combined(&then, -1.0));
        }
        Stages { by_stage }
    }

    /// Adds `other`'s observations to these.
    pub fn add(&mut self, other: &Stages) {
        for (stage, more) in &other.by_stage {
            let entry = self.by_stage.entry(stage.clone()).or_default();
            *entry = entry.combined(more, 1.0);
        }
    }

    pub fn stage(&self, name: &str) -> Option<&StageHistogram> {
        self.by_stage.get(name).filter(|h| h.count > 0.0)
    }
}

impl StageHistogram {
    /// `self + sign × other`, bucket by bucket (the same bounds, or none).
    fn combined(&self, other: &StageHistogram, sign: f64) -> StageHistogram {
        let buckets = if self.buckets.is_empty() {
            other
                .buckets
                .iter()
                .map(|(bound, n)| (*bound, sign * n))
                .collect()
        } else {
            self.buckets
                .iter()
                .map(|(bound, n)| {
                    let theirs = other
                        .buckets
                        .iter()
                        .find(|(b, _)| b == bound)
                        .map_or(0.0, |(_, n)| *n);
                    (*bound, n + sign * theirs)
                })
                .collect()
        };
        StageHistogram {
            buckets,
            sum: self.sum + sign * other.sum,
            count: self.count + sign * other.count,
        }
    }

    pub fn count(&self) -> f64 {
        self.count
    }

    pub fn mean(&self) -> Duration {
        if self.count <= 0.0 {
            return Duration::ZERO;
        }
        Duration::from_secs_f64((self.sum / self.count).max(0.0))
    }

    /// The `q` quantile, interpolated inside its bucket (as Prometheus's
    /// `histogram_quantile` does); past the last finite bound, that bound.
    pub fn quantile(&self, q: f64) -> Duration {
        let rank = q * self.count;
        let mut lower = (0.0, 0.0);
        for &(bound, cumulative) in &self.buckets {
            if cumulative >= rank && cumulative > 0.0 {
                if bound.is_infinite() {
                    return Duration::from_secs_f64(lower.0);
                }
                let inside = cumulative - lower.1;
                let fraction = if inside > 0.0 {
                    (rank - lower.1) / inside
                } else {
                    1.0
                };
                return Duration::from_secs_f64(lower.0 + (bound - lower.0) * fraction);
            }
            lower = (bound, cumulative);
        }
        Duration::from_secs_f64(lower.0)
    }
}

/// One load of `--floor-loads`: `1000x100` is 1,000 subscribers and 100
/// events per second.
pub fn parse_load(text: &str) -> Result<(usize, f64), String> {
    let invalid =
        || format!("`{text}` is not a load: write subscribers x events per second, as `1000x100`");
    let (subscribers, rate) = text.split_once(['x', '×']).ok_or_else(invalid)?;
    let subscribers: usize = subscribers.trim().parse().map_err(|_| invalid())?;
    let rate: f64 = rate.trim().parse().map_err(|_| invalid())?;
    if subscribers == 0 || !(rate > 0.0 && rate.is_finite()) {
        return Err(invalid());
    }
    Ok((subscribers, rate))
}

/// Latency at the floor: both lanes of HTTP publish against nchan, at
/// four loads, in alternating rounds, with the machine's commit time and
/// the relay's stage breakdown (see `scenarios::floor`).
pub async fn rows(cx: &Context, table: &mut Table) -> BenchResult<()> {
    let nchan = cx
        .nchan()
        .map(|(address, server)| (server, format!("http://{address}/pub")));
    let plan = FloorPlan {
        relay_bin: &cx.args.relay_bin,
        work_dir: &cx.args.work_dir,
        database_url: cx.db(),
        schema: &cx.schema,
        nchan,
        loads: if cx.args.floor_loads.is_empty() {
            vec![
                (cx.scale.small_fanout, 100.0),
                (cx.scale.small_fanout, 20.0),
                (cx.scale.large_fanout, 10.0),
                (cx.scale.large_fanout, 2.0),
            ]
        } else {
            cx.args.floor_loads.clone()
        },
        duration: cx.scale.fixed_run,
        rounds: cx.args.floor_rounds,
        control: cx.args.floor_control,
    };
    let figures = run(&plan).await?;
    report(&figures, table);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "\
# HELP eventrelay_latency_stage_seconds Time events spend in each stage.
eventrelay_latency_stage_seconds_sum{stage=\"commit\"} 0.03
eventrelay_latency_stage_seconds_count{stage=\"commit\"} 20
eventrelay_latency_stage_seconds_bucket{le=\"0.001\",stage=\"commit\"} 0
eventrelay_latency_stage_seconds_bucket{le=\"0.002\",stage=\"commit\"} 10
eventrelay_latency_stage_seconds_bucket{le=\"0.005\",stage=\"commit\"} 20
eventrelay_latency_stage_seconds_bucket{le=\"+Inf\",stage=\"commit\"} 20
eventrelay_events_delivered_total 5
";

    #[test]
    fn quantiles_are_interpolated_inside_their_bucket() {
        let stages = Stages::parse(&Metrics::parse(TEXT));
        let commit = stages.stage("commit").unwrap();
        assert_eq!(commit.count(), 20.0);
        let mean = commit.mean().as_secs_f64();
        assert!((mean - 0.0015).abs() < 1e-9, "{mean}");
        // Half of the 20 are at or below 2 ms, all of them by 5 ms.
        assert_eq!(commit.quantile(0.5), Duration::from_millis(2));
        assert_eq!(commit.quantile(0.75), Duration::from_micros(3500));
        assert!(stages.stage("parse").is_none());
    }

    #[test]
    fn a_difference_holds_only_what_was_observed_in_between() {
        let before = Stages::parse(&Metrics::parse(TEXT));
        let after = Stages::parse(&Metrics::parse(
            &TEXT
                .replace("} 10\n", "} 14\n")
                .replace("} 20\n", "} 24\n")
                .replace("0.03\n", "0.034\n"),
        ));
        let between = after.minus(&before);
        let commit = between.stage("commit").unwrap();
        assert_eq!(commit.count(), 4.0);
        assert_eq!(commit.quantile(0.5), Duration::from_micros(1500));
        let mut total = Stages::default();
        total.add(&between);
        total.add(&between);
        assert_eq!(total.stage("commit").unwrap().count(), 8.0);
    }

    fn figures(p50_ms: u64, p99_ms: u64) -> FanoutFigures {
        FanoutFigures {
            latency: Percentiles {
                p50: Duration::from_millis(p50_ms),
                p99: Duration::from_millis(p99_ms),
                max: Duration::from_millis(p99_ms),
            },
            ..FanoutFigures::default()
        }
    }

    /// A load of 1,000 × 100 with these runs and nothing else measured.
    fn load_of(runs: Vec<(Side, FanoutFigures)>) -> LoadFigures {
        LoadFigures {
            subscribers: 1000,
            per_second: 100.0,
            runs,
            stages: Vec::new(),
            paced_commit: Percentiles::default(),
            announced: AnnouncedCommit::default(),
        }
    }

    /// `load` with `side`'s runs left out.
    fn without(load: &LoadFigures, side: Side) -> LoadFigures {
        load_of(
            load.runs
                .iter()
                .filter(|(s, _)| *s != side)
                .cloned()
                .collect(),
        )
    }

    #[test]
    fn each_round_is_set_against_nchan_of_the_same_round() {
        let load = load_of(vec![
            (Side::Nchan, figures(4, 8)),
            (Side::Durable, figures(6, 16)),
            (Side::Ephemeral, figures(5, 8)),
            (Side::Durable, figures(4, 12)),
            (Side::Ephemeral, figures(2, 4)),
            (Side::Nchan, figures(2, 4)),
            (Side::Ephemeral, figures(3, 9)),
            (Side::Nchan, figures(3, 6)),
            (Side::Durable, figures(3, 12)),
        ]);
        let row = against_nchan_by_round(&load).unwrap();
        assert_eq!(
            row,
            "eventrelay ephemeral p50 × 1.25, 1.00, 1.00 (median 1.00) · p99 × 1.00, 1.00, 1.50 (median 1.00) \
             · eventrelay durable p50 × 1.50, 2.00, 1.00 (median 1.50) · p99 × 2.00, 3.00, 2.00 (median 2.00)"
        );
        assert!(against_nchan_by_round(&without(&load, Side::Nchan)).is_none());
    }

    #[test]
    fn a_round_without_a_figure_from_nchan_is_left_out() {
        let ours = [figures(3, 6), figures(4, 8)];
        let theirs = [figures(0, 4), figures(2, 4)];
        let (ours, theirs): (Vec<_>, Vec<_>) = (ours.iter().collect(), theirs.iter().collect());
        assert_eq!(quotients(&ours, &theirs, |f| f.latency.p50), vec![2.0]);
        assert_eq!(quotients(&ours, &theirs, |f| f.latency.p99), vec![1.5, 2.0]);
    }

    #[test]
    fn each_round_starts_with_the_next_side() {
        use Side::*;
        let (n, d, e) = (Nchan, Durable, Ephemeral);
        for (round, order) in [[n, d, e], [d, e, n], [e, n, d], [n, d, e]]
            .iter()
            .enumerate()
        {
            assert_eq!(round_order(round, false), order);
        }
    }

    #[test]
    fn the_control_runs_nchan_twice_in_every_round() {
        use Side::*;
        let (n, again, d, e) = (Nchan, NchanAgain, Durable, Ephemeral);
        let orders = [
            [d, n, e, again],
            [e, n, d, again],
            [d, again, e, n],
            [e, again, d, n],
        ];
        for (round, order) in orders.iter().enumerate() {
            assert_eq!(round_order(round, true), order);
        }
        let runs: Vec<Side> = (0..8).flat_map(|round| round_order(round, true)).collect();
        for side in Side::ALL {
            assert_eq!(runs.iter().filter(|s| **s == side).count(), 8, "{side:?}");
        }
        // Neither of nchan's runs ever comes right after the other, within
        // a round or across two.
        for pair in runs.windows(2) {
            let nchan = |side: Side| matches!(side, Nchan | NchanAgain);
            assert!(!(nchan(pair[0]) && nchan(pair[1])), "{pair:?}");
        }
    }

    #[test]
    fn the_control_is_set_against_nchan_of_the_same_round() {
        let load = load_of(vec![
            (Side::Nchan, figures(4, 8)),
            (Side::Ephemeral, figures(5, 8)),
            (Side::NchanAgain, figures(5, 10)),
            (Side::NchanAgain, figures(3, 6)),
            (Side::Nchan, figures(2, 4)),
            (Side::Ephemeral, figures(2, 4)),
        ]);
        let row = against_nchan_by_round(&load).unwrap();
        assert_eq!(
            row,
            "eventrelay ephemeral p50 × 1.25, 1.00 (median 1.12) · p99 × 1.00, 1.00 (median 1.00) \
             · nchan again p50 × 1.25, 1.50 (median 1.38) · p99 × 1.25, 1.50 (median 1.38)"
        );
        // The lane's median p50 quotient (1.125) is under nchan's own
        // spread (1.25–1.50), and so is its p99 (1.00).
        assert_eq!(
            against_nchan_spread(&load).unwrap(),
            "nchan's second run over its first: p50 1.25–1.50 · p99 1.25–1.50 \
             · eventrelay ephemeral p50 1.12 (under) · p99 1.00 (under)"
        );
        assert!(against_nchan_spread(&without(&load, Side::NchanAgain)).is_none());
    }

    #[test]
    fn a_spread_places_a_quotient_under_inside_or_above_it() {
        let spread = Spread::of(&[1.1, 0.9, 1.0]).unwrap();
        assert_eq!(spread.to_string(), "0.90–1.10");
        assert_eq!(spread.place(0.89), "under");
        assert_eq!(spread.place(0.9), "inside");
        assert_eq!(spread.place(1.1), "inside");
        assert_eq!(spread.place(1.2), "above");
        assert!(Spread::of(&[]).is_none());
    }

    #[test]
    fn a_floor_load_is_subscribers_times_a_rate() {
        assert_eq!(parse_load("1000x100"), Ok((1000, 100.0)));
        assert_eq!(parse_load("10000×2.5"), Ok((10000, 2.5)));
        for bad in [
            "1000", "x100", "1000x", "0x100", "1000x0", "1000x-1", "ax1", "1000xinf",
        ] {
            assert!(parse_load(bad).is_err(), "{bad} was taken as a load");
        }
    }
}
