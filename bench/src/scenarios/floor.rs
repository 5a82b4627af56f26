//! Latency at the floor (`--only floor`): eventrelay's durable and ephemeral
//! lanes of HTTP publish against nchan at the same loads, in rounds of
//! turning order, as nchan's figures swing from run to run (`--floor-control`
//! runs nchan twice a round to show that spread). Also timed: one commit
//! (back to back and at each load's pace); the relay's publishing statement
//! at each pace with no relay running, the least a notify-mode relay can
//! take; and the relay's stages from its latency stage histograms.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use eventrelay::latency::Stage;
use eventrelay::publisher::{
    Identifier, ListenConnection, PgConnectOptions, Publisher, TcpSettings,
};
use eventrelay::store::Database;

use crate::BenchResult;
use crate::context::Context;
use crate::publish::{Pace, Source, tick};
use crate::relay_process::Metrics;
use crate::report::{Percentiles, Table, joined, median, millis, ms, verdict};
use crate::scenarios::fanout::{self, FanoutFigures, FanoutPlan, Server};

const COMMITS: usize = 400;

/// One-row commits timed at a load's pace: about five seconds' worth, and
/// enough for a p99 even at the slowest load.
fn paced_commits(per_second: f64) -> usize {
    ((per_second * 5.0).round() as usize).clamp(20, 200)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    Nchan,
    Durable,
    Ephemeral,
    /// nchan once more in the same round (`--floor-control`).
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

    /// The relay's lane this side publishes on; none for nchan.
    fn lane(self) -> Option<&'static str> {
        match self {
            Side::Durable => Some("durable"),
            Side::Ephemeral => Some("ephemeral"),
            Side::Nchan | Side::NchanAgain => None,
        }
    }
}

/// The sides of round `round`, each round starting one later (N D E,
/// D E N, ...). With the control, nchan's two runs take turns with the
/// lanes (D N E N', E N D N', D N' E N, ...), so that every run of nchan
/// comes right after one of the relay's: run right after itself, nchan's
/// median was 1.5 times as long with 10,000 subscribers at 2 events a second.
pub fn round_order(round: usize, control: bool) -> Vec<Side> {
    use Side::*;
    if !control {
        let mut order = vec![Nchan, Durable, Ephemeral];
        order.rotate_left(round % 3);
        return order;
    }
    let (mut lanes, mut nchan) = ([Durable, Ephemeral], [Nchan, NchanAgain]);
    if round % 2 == 1 {
        lanes.reverse();
    }
    if round % 4 >= 2 {
        nchan.reverse();
    }
    vec![lanes[0], nchan[0], lanes[1], nchan[1]]
}

#[derive(Default)]
pub struct LoadFigures {
    pub subscribers: usize,
    pub per_second: f64,
    pub runs: Vec<(Side, FanoutFigures)>,
    pub stages: Vec<(Side, Stages)>,
    /// One-row commits, and the relay's publishing statement, timed as
    /// often as this load's events come, before its runs.
    pub paced_commit: Percentiles,
    pub announced: AnnouncedCommit,
}

impl LoadFigures {
    pub fn of(&self, side: Side) -> Vec<&FanoutFigures> {
        let runs = self.runs.iter();
        runs.filter_map(|(s, f)| (*s == side).then_some(f))
            .collect()
    }
}

/// One-row commits with the flush (`synchronous_commit = on`) and without.
#[derive(Debug, Clone, Copy, Default)]
pub struct CommitTime {
    pub flushed: Percentiles,
    pub unflushed: Percentiles,
}

pub async fn rows(cx: &Context, table: &mut Table) -> BenchResult<()> {
    let (small, large) = (cx.scale.small_fanout, cx.scale.large_fanout);
    let loads = [(small, 100.0), (small, 20.0), (large, 10.0), (large, 2.0)];
    let before = commit_time(cx.db(), &cx.schema).await?;
    let mut figures = Vec::new();
    for (index, (subscribers, per_second)) in loads.into_iter().enumerate() {
        figures.push(run_load(cx, index, subscribers, per_second).await?);
    }
    let after = commit_time(cx.db(), &cx.schema).await?;
    report([before, after], &figures, table);
    Ok(())
}

async fn run_load(
    cx: &Context,
    index: usize,
    subscribers: usize,
    per_second: f64,
) -> BenchResult<LoadFigures> {
    let (db, schema, commits) = (cx.db(), cx.schema.as_str(), paced_commits(per_second));
    let paced_commit = timed_commits(db, schema, "on", commits, Some(per_second)).await?;
    let announced = announced_commit_time(db, schema, per_second, commits).await?;
    // One relay serves both lanes; the stage histograms are read around
    // each run, so each lane's stages are its own.
    let relay = cx.start_relay(cx.settings().in_own_session()).await?;
    let (ours, nchan) = (Server::of(&relay), cx.nchan());
    let mut runs = Vec::new();
    let lanes = [Side::Durable, Side::Ephemeral];
    let mut stages = Vec::from(lanes.map(|side| (side, Stages::default())));
    for round in 0..cx.args.floor_rounds {
        for side in round_order(round, cx.args.floor_control) {
            let (server, source) = match (side.lane(), &nchan) {
                (Some(lane), _) => (&ours, Source::http(&relay.base, lane)),
                (None, Some((address, server))) => (server, Source::nchan(*address)),
                (None, None) => continue,
            };
            let (number, label) = (round + 1, side.label());
            eprintln!("floor: {subscribers} subs × {per_second} ev/s, round {number}, {label}");
            let before = Stages::parse(&relay.metrics().await);
            let plan = FanoutPlan {
                subscribers,
                scope: format!("floor-{index}-{round}-{side:?}-0"),
                pace: Pace::PerSecond(per_second),
                duration: cx.scale.fixed_run,
                writers: 4,
                source,
                spread: fanout::ONE_SCOPE,
            };
            let figures = fanout::run(&plan, server).await?;
            if let Some((_, total)) = stages.iter_mut().find(|(s, _)| *s == side) {
                total.add(&Stages::parse(&relay.metrics().await), 1.0);
                total.add(&before, -1.0);
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

fn report(commit: [CommitTime; 2], loads: &[LoadFigures], table: &mut Table) {
    let [before, after] = commit;
    let both =
        |of: fn(&CommitTime) -> Duration| format!("{} / {}", ms(of(&before)), ms(of(&after)));
    let (flushed50, flushed99) = (both(|c| c.flushed.p50), both(|c| c.flushed.p99));
    let unflushed50 = both(|c| c.unflushed.p50);
    let flush50 = both(|c| c.flushed.p50.saturating_sub(c.unflushed.p50));
    table.note(
        "floor: one-row commit on this machine, before / after the loads",
        format!(
            "flushed p50 {flushed50} · p99 {flushed99} · without the flush p50 {unflushed50} · the flush p50 {flush50}"
        ),
    );
    // The smaller of the two measurements: the stricter target.
    let commit_p50 = before.flushed.p50.min(after.flushed.p50);
    let commit_p99 = before.flushed.p99.min(after.flushed.p99);
    for load in loads {
        let (subscribers, per_second) = (thousands(load.subscribers), load.per_second);
        let name = format!("{subscribers} subs × {per_second:.0} ev/s");
        let (paced, commits) = (load.paced_commit.p50_p99(), paced_commits(per_second));
        table.note(
            format!("floor {name}: one-row commit at this load's pace"),
            format!("{paced}, {commits} commits {per_second:.0} a second"),
        );
        let (committed, heard) = (&load.announced.committed, &load.announced.heard);
        let (committed, heard) = (committed.p50_p99(), heard.p50_p99());
        table.note(
            format!("floor {name}: the relay's publishing statement at this load's pace, no relay running"),
            format!(
                "committed {committed} · heard through LISTEN {heard}, {commits} transactions {per_second:.0} a second"
            ),
        );
        let mut medians = Vec::new();
        for side in Side::ALL {
            let runs = load.of(side);
            if runs.is_empty() {
                continue;
            }
            let each = |of: fn(&FanoutFigures) -> f64| -> Vec<f64> {
                runs.iter().map(|f| of(f)).collect()
            };
            let p50s = each(|f| millis(f.latency.p50));
            let p99s = each(|f| millis(f.latency.p99));
            let cpu = each(|f| f.cpu_seconds_per_1000 * 1000.0);
            let system = each(|f| f.system_seconds_per_1000 * 1000.0);
            let firsts = each(|f| millis(f.first_arrival.p50));
            let all = runs.iter().all(|f| f.delivered == f.expected);
            let (p50, p99) = (median(&p50s), median(&p99s));
            medians.push((side, (p50, p99)));
            let [each50, each99, firsts] = [p50s, p99s, firsts].map(|v| joined(&v, 2, ", "));
            let (cpu, system) = (median(&cpu), median(&system));
            table.add(
                format!("floor {name}, {} (send-to-receive), {} rounds", side.label(), runs.len()),
                format!(
                    "p50 {each50} ms (median {p50:.2}) · p99 {each99} ms (median {p99:.2}) · first subscriber p50 {firsts} ms · CPU per delivery {cpu:.2} µs, of it in the kernel {system:.2} · {}",
                    if all { "all received" } else { "some not received" }
                ),
                format!("all received: {}", verdict(all)),
            );
        }
        let of = |side| medians.iter().find(|(s, _)| *s == side).map(|(_, m)| *m);
        if let (Some(nchan), Some(durable), Some(ephemeral)) =
            (of(Side::Nchan), of(Side::Durable), of(Side::Ephemeral))
        {
            let large = load.subscribers >= 10_000;
            let which = if large { "p99 ≤" } else { "p50 and p99 ≤" };
            let ephemeral_met = ephemeral.1 <= nchan.1 && (large || ephemeral.0 <= nchan.0);
            let (commit50, commit99) = (millis(commit_p50), millis(commit_p99));
            let durable_met = durable.0 <= nchan.0 + commit50 && durable.1 <= nchan.1 + commit99;
            let [ephemeral_met, durable_met] = [ephemeral_met, durable_met].map(verdict);
            // A commit made as seldom as this load's costs more than one
            // back to back; the verdict keeps the stricter, back-to-back one.
            let (paced50, paced99) = (millis(load.paced_commit.p50), millis(load.paced_commit.p99));
            let durable_met_at_pace =
                durable.0 <= nchan.0 + paced50 && durable.1 <= nchan.1 + paced99;
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
                    "ephemeral {which} nchan's: {ephemeral_met} · durable ≤ nchan's + one commit: {durable_met}"
                ),
            );
        }
        if let Some(row) = against_nchan_by_round(load) {
            let what = "each round's p50 / p99 over nchan's of the same round";
            table.note(format!("floor {name}: {what}"), row);
        }
        if let Some(row) = against_nchan_spread(load) {
            let what = "each lane's median quotient against nchan's spread against itself";
            table.note(format!("floor {name}: {what}"), row);
        }
        for (side, stages) in &load.stages {
            let label = side.label();
            let what =
                format!("floor {name}, {label}: where the time goes (relay stages, p50 / mean)");
            table.note(what, breakdown(stages));
        }
    }
}

/// Each lane's p50 and p99 over nchan's of the same round (these move less
/// between runs than the figures), and nchan's second run over its first.
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
            let [each50, each99] = [&p50, &p99].map(|q| joined(q, 2, ", "));
            let (label, median50, median99) = (side.label(), median(&p50), median(&p99));
            format!(
                "{label} p50 × {each50} (median {median50:.2}) · p99 × {each99} (median {median99:.2})"
            )
        })
        .collect();
    Some(parts.join(" · "))
}

/// With the control: the range of nchan's second run over its first, and
/// where each lane's median quotient lies against it. A lane inside it is
/// as far from nchan as nchan is from itself. `None` without the control.
fn against_nchan_spread(load: &LoadFigures) -> Option<String> {
    let (nchan, again) = (load.of(Side::Nchan), load.of(Side::NchanAgain));
    let p50 = |runs: &[&FanoutFigures]| quotients(runs, &nchan, |f| f.latency.p50);
    let p99 = |runs: &[&FanoutFigures]| quotients(runs, &nchan, |f| f.latency.p99);
    let spread = [spread(&p50(&again))?, spread(&p99(&again))?];
    let [(low50, high50), (low99, high99)] = spread;
    let mut parts = vec![format!(
        "nchan's second run over its first: p50 {low50:.2}–{high50:.2} · p99 {low99:.2}–{high99:.2}"
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
            place(spread[0], ours50),
            place(spread[1], ours99)
        ));
    }
    Some(parts.join(" · "))
}

fn spread(values: &[f64]) -> Option<(f64, f64)> {
    let low = values.iter().copied().reduce(f64::min)?;
    Some((low, values.iter().copied().reduce(f64::max)?))
}

fn place((low, high): (f64, f64), value: f64) -> &'static str {
    if value < low {
        "under"
    } else if value > high {
        "above"
    } else {
        "inside"
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

fn breakdown(stages: &Stages) -> String {
    let parts: Vec<String> = Stage::ALL
        .iter()
        .filter_map(|stage| {
            let name = stage.label();
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

fn thousands(n: usize) -> String {
    if n >= 1000 && n % 1000 == 0 {
        format!("{},000", n / 1000)
    } else {
        n.to_string()
    }
}

pub async fn commit_time(database_url: &str, schema: &str) -> BenchResult<CommitTime> {
    let flushed = timed_commits(database_url, schema, "on", COMMITS, None).await?;
    let unflushed = timed_commits(database_url, schema, "off", COMMITS, None).await?;
    Ok(CommitTime { flushed, unflushed })
}

/// The relay's publishing statement at a load's pace: until its `COMMIT`
/// is answered, and until a connection `LISTEN`ing on its channel hears it.
#[derive(Debug, Clone, Copy, Default)]
pub struct AnnouncedCommit {
    pub committed: Percentiles,
    pub heard: Percentiles,
}

/// Writes `commits` durable events, `per_second` a second, as the relay
/// writes a one-event publish (its publisher and pool, prepared statements,
/// `BEGIN`, statement and `COMMIT` in one round trip), with no relay running:
/// the time until it is heard is the least a notify-mode relay can take.
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
    let channel = Identifier::new(schema)?;
    listener.listen(&channel, Some(STARTUP)).await?;
    let connection = db.get().await?;
    let event = |number| publisher.prepare_batch(vec![tick("floor-announced", number)]);
    // A first write teaches the pipeline its statements, prepared from
    // then on, as the relay's committers learn them.
    let pipeline = connection.pipeline(&[]).await?;
    let first = event(0)?;
    publisher.emit_prepared_committed(&pipeline, first).await?;
    let known = pipeline.unprepared();
    drop(pipeline);
    tokio::time::timeout(STARTUP, listener.next(None)).await??;

    let mut ticks = pacer(per_second);
    let (mut committed, mut heard) = (Vec::with_capacity(commits), Vec::with_capacity(commits));
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

/// Times `commits` one-row commits with `synchronous_commit = setting`,
/// back to back or `per_second` of them a second (as seldom as a load's
/// events). The table is in `schema`: a temporary table's changes are not
/// written to the WAL, so its commits would have nothing to flush.
pub async fn timed_commits(
    database_url: &str,
    schema: &str,
    setting: &str,
    commits: usize,
    per_second: Option<f64>,
) -> BenchResult<Percentiles> {
    let client = eventrelay::connect(database_url).await?;
    let table = format!("{schema}.floor_commits");
    let setup =
        format!("CREATE TABLE IF NOT EXISTS {table} (n int); SET synchronous_commit = {setting}");
    client.batch_execute(&setup).await?;
    let insert = format!("INSERT INTO {table} VALUES ($1)");
    let statement = client.prepare(&insert).await?;
    let mut ticks = per_second.map(pacer);
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

/// Ticks `per_second` times a second, a late tick delaying the rest.
fn pacer(per_second: f64) -> tokio::time::Interval {
    let mut ticks = tokio::time::interval(Duration::from_secs_f64(1.0 / per_second.max(0.001)));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks
}

/// The relay's stage histograms by stage, as `/metrics` serves them (cumulative).
#[derive(Debug, Clone, Default)]
pub struct Stages(BTreeMap<String, StageHistogram>);

#[derive(Debug, Clone, Default)]
pub struct StageHistogram {
    /// (upper bound in seconds, observations at or below it), ascending.
    buckets: Vec<(f64, f64)>,
    sum: f64,
    count: f64,
}

impl Stages {
    pub fn parse(metrics: &Metrics) -> Stages {
        let mut stages = Stages::default();
        for sample in &metrics.samples {
            let (Some(kind), Some(stage)) = (
                sample.name.strip_prefix("eventrelay_latency_stage_seconds"),
                sample.label("stage"),
            ) else {
                continue;
            };
            let histogram = stages.0.entry(stage.to_owned()).or_default();
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
        for histogram in stages.0.values_mut() {
            histogram.buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        }
        stages
    }

    /// Adds `sign` × `other`'s observations, bucket by bucket (the same
    /// bounds, or none yet): −1 takes an earlier reading off a later one.
    pub fn add(&mut self, other: &Stages, sign: f64) {
        for (stage, theirs) in &other.0 {
            let ours = self.0.entry(stage.clone()).or_default();
            if ours.buckets.is_empty() {
                ours.buckets = theirs.buckets.iter().map(|(b, _)| (*b, 0.0)).collect();
            }
            for (bound, n) in &mut ours.buckets {
                let found = theirs.buckets.iter().find(|(b, _)| b == bound);
                *n += sign * found.map_or(0.0, |(_, n)| *n);
            }
            ours.sum += sign * theirs.sum;
            ours.count += sign * theirs.count;
        }
    }

    pub fn stage(&self, name: &str) -> Option<&StageHistogram> {
        self.0.get(name).filter(|h| h.count > 0.0)
    }
}

impl StageHistogram {
    pub fn mean(&self) -> Duration {
        Duration::from_secs_f64((self.sum / self.count.max(f64::MIN_POSITIVE)).max(0.0))
    }

    /// The `q` quantile, interpolated inside its bucket (as Prometheus's
    /// `histogram_quantile` does); past the last finite bound, that bound.
    pub fn quantile(&self, q: f64) -> Duration {
        let (rank, mut lower) = (q * self.count, (0.0, 0.0));
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

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "\
eventrelay_latency_stage_seconds_sum{stage=\"commit\"} 0.03
eventrelay_latency_stage_seconds_count{stage=\"commit\"} 20
eventrelay_latency_stage_seconds_bucket{le=\"0.001\",stage=\"commit\"} 0
eventrelay_latency_stage_seconds_bucket{le=\"0.002\",stage=\"commit\"} 10
eventrelay_latency_stage_seconds_bucket{le=\"0.005\",stage=\"commit\"} 20
eventrelay_latency_stage_seconds_bucket{le=\"+Inf\",stage=\"commit\"} 20
eventrelay_events_delivered_total 5
";

    #[test]
    fn stage_quantiles_interpolate_and_differences_hold_what_came_between() {
        let before = Stages::parse(&Metrics::parse(TEXT));
        let commit = before.stage("commit").unwrap();
        assert!((commit.mean().as_secs_f64() - 0.0015).abs() < 1e-9);
        // Half of the 20 are at or below 2 ms, all of them by 5 ms.
        assert_eq!(commit.quantile(0.5), Duration::from_millis(2));
        assert_eq!(commit.quantile(0.75), Duration::from_micros(3500));
        assert!(before.stage("parse").is_none());
        let after = TEXT
            .replace("} 10\n", "} 14\n")
            .replace("} 20\n", "} 24\n")
            .replace("0.03\n", "0.034\n");
        let mut between = Stages::default();
        between.add(&Stages::parse(&Metrics::parse(&after)), 1.0);
        between.add(&before, -1.0);
        let commit = between.stage("commit").unwrap();
        assert_eq!(commit.count, 4.0);
        assert_eq!(commit.quantile(0.5), Duration::from_micros(1500));
    }

    #[test]
    fn rounds_turn_and_the_control_never_runs_nchan_twice_in_a_row() {
        use Side::*;
        let (n, again, d, e) = (Nchan, NchanAgain, Durable, Ephemeral);
        let plain = [[n, d, e], [d, e, n], [e, n, d], [n, d, e]];
        for (round, order) in plain.iter().enumerate() {
            assert_eq!(round_order(round, false), order);
        }
        let controlled = [[d, n, e, again], [e, n, d, again], [d, again, e, n]];
        for (round, order) in controlled.iter().enumerate() {
            assert_eq!(round_order(round, true), order);
        }
        let runs: Vec<Side> = (0..8).flat_map(|round| round_order(round, true)).collect();
        for side in Side::ALL {
            assert_eq!(runs.iter().filter(|s| **s == side).count(), 8, "{side:?}");
        }
        let nchan = |side: Side| matches!(side, Nchan | NchanAgain);
        assert!(runs.windows(2).all(|p| !(nchan(p[0]) && nchan(p[1]))));
    }

    fn figures(p50_ms: u64, p99_ms: u64) -> FanoutFigures {
        let [p50, p99] = [p50_ms, p99_ms].map(Duration::from_millis);
        let latency = Percentiles { p50, p99, max: p99 };
        FanoutFigures {
            latency,
            ..FanoutFigures::default()
        }
    }

    fn load_of(runs: Vec<(Side, FanoutFigures)>) -> LoadFigures {
        LoadFigures {
            runs,
            ..LoadFigures::default()
        }
    }

    #[test]
    fn each_round_is_set_against_nchan_of_the_same_round() {
        let load = load_of(vec![
            (Side::Nchan, figures(4, 8)),
            (Side::Durable, figures(6, 16)),
            (Side::Ephemeral, figures(5, 8)),
            (Side::NchanAgain, figures(5, 10)),
            (Side::NchanAgain, figures(3, 6)),
            (Side::Nchan, figures(2, 4)),
            (Side::Ephemeral, figures(2, 4)),
            (Side::Durable, figures(4, 12)),
        ]);
        assert_eq!(
            against_nchan_by_round(&load).unwrap(),
            "eventrelay ephemeral p50 × 1.25, 1.00 (median 1.12) · p99 × 1.00, 1.00 (median 1.00) \
             · eventrelay durable p50 × 1.50, 2.00 (median 1.75) · p99 × 2.00, 3.00 (median 2.50) \
             · nchan again p50 × 1.25, 1.50 (median 1.38) · p99 × 1.25, 1.50 (median 1.38)"
        );
        assert_eq!(
            against_nchan_spread(&load).unwrap(),
            "nchan's second run over its first: p50 1.25–1.50 · p99 1.25–1.50 \
             · eventrelay ephemeral p50 1.12 (under) · p99 1.00 (under) \
             · eventrelay durable p50 1.75 (above) · p99 2.50 (above)"
        );
        let without = |side: Side| {
            let runs = load.runs.iter().filter(|(s, _)| *s != side);
            load_of(runs.cloned().collect())
        };
        assert!(against_nchan_by_round(&without(Side::Nchan)).is_none());
        assert!(against_nchan_spread(&without(Side::NchanAgain)).is_none());
        let ours = [figures(3, 6), figures(4, 8)];
        let theirs = [figures(0, 4), figures(2, 4)];
        let (ours, theirs): (Vec<_>, Vec<_>) = (ours.iter().collect(), theirs.iter().collect());
        assert_eq!(quotients(&ours, &theirs, |f| f.latency.p50), vec![2.0]);
        assert_eq!(place(spread(&[1.1, 0.9, 1.0]).unwrap(), 0.9), "inside");
    }
}
