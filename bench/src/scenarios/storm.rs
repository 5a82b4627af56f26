//! Reconnect storms (`--only storm`). N subscribers, held by the stream
//! client processes, stream with a `Last-Event-ID` while durable events are
//! emitted; the relay gets SIGTERM, as a deploy does, and a new process
//! starts on the same port. Subscribers reconnect at once, resuming from
//! the last id they saw, and retry every 50 ms while nothing listens (a
//! browser's `EventSource` without its retry delay). Counted per phase:
//! refusals by status, resets, connect times and how long until all N
//! stream again; after the restart none may miss an event. Then more waves
//! of N arrive, each while the previous one hangs up, and the relay's RSS
//! is read with each wave streaming and after the last one left.

use std::path::Path;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::BenchResult;
use crate::context::Context;
use crate::database::max_seq;
use crate::proc_stats;
use crate::relay_process::{RelayProcess, RelaySettings};
use crate::report::{Table, ms, size, verdict};
use crate::scenarios::streams::Emitter;
use crate::stream_client::{self, ClientSpec, Clients, PhaseFigures, Reconnect, realtime_ns};

/// Past the interval at which the relay returns freed memory.
const SETTLE: Duration = Duration::from_secs(5);
/// Longest wait for all subscribers to stream, or for every event to arrive.
const PATIENCE: Duration = Duration::from_secs(120);
/// Client processes per wave, each from a source address of its own.
const CLIENTS: usize = 2;

#[derive(Clone, Debug)]
pub struct StormPlan {
    pub subscribers: usize,
    pub scopes: usize,
    /// Durable events per second, spread over the scopes, emitted from
    /// before the stop until after the restart.
    pub events_per_sec: f64,
    /// How long events are emitted after the subscribers first stream; the
    /// SIGTERM comes a third of the way in.
    pub emitting: Duration,
    /// Waves of N arriving after the restart storm.
    pub extra_waves: usize,
}

/// One phase: its counters, and how long from its start until all N
/// streamed (`None` when they did not within the patience).
#[derive(Debug, Clone)]
pub struct Phase {
    pub all_streaming_after: Option<Duration>,
    pub figures: PhaseFigures,
}

impl Phase {
    /// Every subscriber streams and nothing was refused or reset.
    pub fn clean(&self) -> bool {
        self.all_streaming_after.is_some() && self.figures.clean()
    }
}

#[derive(Debug, Clone)]
pub struct StormFigures {
    /// The subscribers' first connect, to an idle relay.
    pub first: Phase,
    /// From SIGTERM to the old process's exit.
    pub stopped_in: Duration,
    /// From starting the new process until all N streamed again.
    pub restart: Phase,
    pub emitted: usize,
    /// (subscriber, event) pairs emitted into a subscriber's scope that it
    /// never received.
    pub missed: u64,
    /// Each further wave, connecting while the previous one hangs up.
    pub waves: Vec<Phase>,
    /// Relay RSS before the first subscriber, with each wave streaming,
    /// after the last hung up, and [`SETTLE`] later, in KiB.
    pub rss_before_kib: u64,
    pub rss_streaming_kib: Vec<u64>,
    pub rss_after_kib: u64,
    pub rss_settled_kib: u64,
}

/// Opens one wave of N subscribers' streams on `port` over [`CLIENTS`]
/// client processes, all handshakes at once, resuming after `last_event_id`.
fn open_wave(
    client_bin: &Path,
    work_dir: &Path,
    plan: &StormPlan,
    name: &str,
    port: u16,
    last_event_id: Option<i64>,
) -> BenchResult<Clients> {
    let spec = ClientSpec {
        index: 0,
        relay_ports: vec![port],
        streams: 0..plan.subscribers,
        scopes: plan.scopes,
        scope_prefix: name.to_owned(),
        last_event_id,
        connect_concurrency: plan.subscribers.div_ceil(CLIENTS),
        reconnect: Reconnect::Immediate,
        work_dir: work_dir.to_owned(),
    };
    Ok(Clients(spec.spawn(client_bin, CLIENTS)?))
}

/// How long from `since` (realtime ns) until every client said all of its
/// streams of the phase are ready.
async fn all_streaming(wave: &mut Clients, since: u64) -> Option<Duration> {
    let lines = wave.expect("all_streaming", PATIENCE).await.ok()?;
    let last = lines
        .iter()
        .filter_map(|line| line["at"].as_u64())
        .fold(since, u64::max);
    Some(Duration::from_nanos(last - since))
}

/// Hangs a wave up at once, the first `emitted` events counted as missed
/// where absent: each phase's figures and the missed pairs.
async fn hang_up(wave: &mut Clients, emitted: usize) -> BenchResult<(Vec<PhaseFigures>, u64)> {
    wave.send(&format!("finish {emitted} 0"))?;
    let lines = wave.expect("finished", PATIENCE).await?;
    let phases = lines[0]["phases"].as_array().map_or(0, Vec::len);
    let figures = (0..phases)
        .map(|phase| {
            let tallies: Vec<_> = lines.iter().map(|line| &line["phases"][phase]).collect();
            PhaseFigures::merge(&tallies, 1)
        })
        .collect();
    Ok((figures, stream_client::sum(&lines, "missing")))
}

/// Runs the storm; `client_bin` is the `eventrelay-bench` binary.
pub async fn run(
    plan: &StormPlan,
    binary: &Path,
    client_bin: &Path,
    work_dir: &Path,
    settings: &RelaySettings,
) -> BenchResult<StormFigures> {
    let n = plan.subscribers;
    let mut relay = RelayProcess::start(binary, work_dir, settings).await?;
    let port = relay.port;
    let rss_before_kib = rss_kib(&relay);
    let start_after = max_seq(&settings.database_url, &settings.schema).await?;

    // The storm wave streams, resuming from the current end of the outbox.
    let connecting = realtime_ns();
    let mut storm = open_wave(client_bin, work_dir, plan, "storm", port, Some(start_after))?;
    let first_after = all_streaming(&mut storm, connecting).await.ok_or(format!(
        "not all {n} subscribers streamed within {PATIENCE:?}"
    ))?;

    // Events flow through the stop and the restart.
    let emitter = Emitter {
        database_url: settings.database_url.clone(),
        schema: settings.schema.clone(),
        scope_prefix: "storm".to_owned(),
        scopes: plan.scopes,
    };
    let (_never, no_stop) = watch::channel(false);
    let emitting = {
        let deadline = tokio::time::Instant::now() + plan.emitting;
        let rate = plan.events_per_sec;
        tokio::spawn(async move { emitter.run(0, rate, Some(deadline), no_stop).await })
    };
    tokio::time::sleep(plan.emitting / 3).await;
    storm.send("phase")?;
    let stopped_in = relay.terminate(Duration::from_secs(30)).await?;
    let restarting = realtime_ns();
    relay = RelayProcess::start_on(binary, work_dir, settings, port).await?;
    let restart_after = all_streaming(&mut storm, restarting).await;
    let emitted = emitting.await??.len();

    // Every subscriber receives every event of its scope, replayed or live.
    let expected: u64 = (0..n)
        .map(|g| (g % plan.scopes..emitted).step_by(plan.scopes).count() as u64)
        .sum();
    let deadline = Instant::now() + PATIENCE;
    while storm.received(PATIENCE).await? < expected && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut rss_streaming_kib = vec![rss_kib(&relay)];

    // Further waves, each arriving while the previous one hangs up; the
    // figures of each wave that left, the storm's first.
    let mut leaving = storm;
    let mut leaving_emitted = emitted;
    let mut left = Vec::new();
    let mut waves = Vec::new();
    for number in 0..plan.extra_waves {
        let arriving = realtime_ns();
        let name = format!("wave{number}");
        let mut wave = open_wave(client_bin, work_dir, plan, &name, port, None)?;
        left.push(hang_up(&mut leaving, leaving_emitted).await?);
        waves.push(all_streaming(&mut wave, arriving).await);
        rss_streaming_kib.push(rss_kib(&relay));
        (leaving, leaving_emitted) = (wave, 0);
    }
    left.push(hang_up(&mut leaving, leaving_emitted).await?);
    let phase = |figures: Option<&PhaseFigures>, after| Phase {
        all_streaming_after: after,
        figures: figures.cloned().unwrap_or_default(),
    };
    let waves = waves
        .into_iter()
        .zip(&left[1..])
        .map(|(after, (phases, _))| phase(phases.first(), after))
        .collect();
    let (storm_phases, missed) = &left[0];

    let deadline = Instant::now() + PATIENCE;
    while relay.metric("sse_connections").await > 0.0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let rss_after_kib = rss_kib(&relay);
    tokio::time::sleep(SETTLE).await;
    Ok(StormFigures {
        first: phase(storm_phases.first(), Some(first_after)),
        stopped_in,
        restart: phase(storm_phases.get(1), restart_after),
        emitted,
        missed: *missed,
        waves,
        rss_before_kib,
        rss_streaming_kib,
        rss_after_kib,
        rss_settled_kib: rss_kib(&relay),
    })
}

fn rss_kib(relay: &RelayProcess) -> u64 {
    proc_stats::rss_bytes(&[relay.pid()]) / 1024
}

/// The large fan-out's subscriber count through a restart, then two waves.
pub async fn rows(cx: &Context, table: &mut Table) -> BenchResult<()> {
    let n = cx.scale.large_fanout;
    eprintln!("reconnect storm: {n} subscribers");
    let plan = StormPlan {
        subscribers: n,
        scopes: 100,
        events_per_sec: 20.0,
        emitting: cx.scale.fixed_run,
        extra_waves: 2,
    };
    let settings = cx.settings();
    let client_bin = std::env::current_exe()?;
    let f = run(
        &plan,
        &cx.args.relay_bin,
        &client_bin,
        &cx.args.work_dir,
        &settings,
    )
    .await?;
    let phase = |p: &Phase| {
        format!(
            "{} · connect p50 {} · p99 {} · {}",
            p.all_streaming_after.map_or_else(
                || format!("not all {n} streaming"),
                |d| format!("all {n} streaming after {:.2} s", d.as_secs_f64())
            ),
            ms(p.figures.connect.p50),
            ms(p.figures.connect.p99),
            p.figures.errors()
        )
    };
    table.add(
        format!("reconnect storm: {n} subscribers connect at once (100 scopes)"),
        phase(&f.first),
        format!("no 408, 5xx or reset: {}", verdict(f.first.clean())),
    );
    table.add(
        format!(
            "reconnect storm: SIGTERM and restart under {n} subscribers, 20 ev/s emitted throughout"
        ),
        format!(
            "old process exited {:.2} s after SIGTERM · from the new process's start, {} · {} events, {} missed",
            f.stopped_in.as_secs_f64(),
            phase(&f.restart),
            f.emitted,
            f.missed
        ),
        format!(
            "all back, no 408, 5xx or reset, none missed: {}",
            verdict(f.restart.clean() && f.missed == 0)
        ),
    );
    for (index, wave) in f.waves.iter().enumerate() {
        table.add(
            format!(
                "reconnect storm: wave {} of {n} arrives while wave {} hangs up",
                index + 2,
                index + 1
            ),
            phase(wave),
            format!("no 408, 5xx or reset: {}", verdict(wave.clean())),
        );
    }
    let first = f.rss_streaming_kib.first().copied().unwrap_or(0) as f64;
    let last = f.rss_streaming_kib.last().copied().unwrap_or(0) as f64;
    table.add(
        format!("reconnect storm: relay RSS with each wave of {n} streaming"),
        format!(
            "before: {} · {} · after the last wave left: {} · 5 s later: {}",
            size(f.rss_before_kib as f64 * 1024.0),
            f.rss_streaming_kib
                .iter()
                .map(|kib| size(*kib as f64 * 1024.0))
                .collect::<Vec<_>>()
                .join(" → "),
            size(f.rss_after_kib as f64 * 1024.0),
            size(f.rss_settled_kib as f64 * 1024.0)
        ),
        format!(
            "last wave within 10% of the first: {}",
            verdict(last <= first * 1.10)
        ),
    );
    Ok(())
}
