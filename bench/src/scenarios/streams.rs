//! Streams held by client processes (`stream_client`). `--only streams`:
//! idle streams on one relay in steps up to 19,000; `--only box`: 100,000
//! over six relays on one database; then one event per second to each, and
//! the box restarts every relay at once under them. `--only storm`: the
//! relay is SIGTERMed and restarted on its port while events are emitted and
//! subscribers retry every 50 ms; none may miss an event. Then more waves
//! arrive, each while the previous one hangs up.

use crate::context::Context;
use crate::report::{Percentiles, Table, size, verdict};
use std::path::Path;
use std::time::{Duration, Instant};

use eventrelay_publisher::{NewEvent, Publisher};
use tokio::sync::watch;

use crate::BenchResult;
use crate::database::max_seq;
use crate::proc_stats::{self, Usage, usage};
use crate::publish::{TICK_TYPE, event_data};
use crate::relay_process::{RelayProcess, RelaySettings};
use crate::stream_client::{
    self, Arrival, ClientProcess, ClientSpec, Clients, PhaseFigures, Reconnect, realtime_ns,
};

const APPLICATION_NAME: &str = "eventrelay-box";
/// Connections left free for everything that is not one of these relays:
/// the emitter, the scenario's own queries, and other users of the same
/// server (another relay under test holds `pool_size + 1` = 17 by default).
const HEADROOM: usize = 20;
/// The largest pool worth giving a relay here: 8 connections served 500
/// simultaneous outbox replays as fast as 32 did.
const POOL_CEILING: usize = 8;
const PATIENCE: Duration = Duration::from_secs(300);
const STORM_PATIENCE: Duration = Duration::from_secs(180);
const DRAIN: Duration = Duration::from_secs(20);
/// Every relay's `http.header_timeout_secs`: a restarted relay reads the
/// requests of all its 16,667 clients at once, on a sixth of two cores, the
/// last about a minute later; the default 10 s would close them first.
const HEADER_TIMEOUT_SECS: u64 = 60;

#[derive(Clone, Debug)]
pub struct BoxPlan {
    pub label: &'static str,
    pub relays: usize,
    pub steps: Vec<usize>,
    pub settle: Duration,
    pub clients: usize,
    /// Scopes in all: every relay holds streams of every scope, as a load
    /// balancer in front of a fleet spreads each scope's subscribers.
    pub scopes: usize,
    pub run: Duration,
    pub storm_rate: f64,
    pub connect_concurrency: usize,
    pub restart: bool,
}

impl BoxPlan {
    pub fn of(quick: bool) -> BoxPlan {
        BoxPlan {
            label: "box",
            relays: 6,
            steps: vec![if quick { 12_000 } else { 100_000 }],
            settle: Duration::from_secs(2),
            clients: 8,
            scopes: 10,
            run: Duration::from_secs(if quick { 10 } else { 30 }),
            storm_rate: 5.0,
            connect_concurrency: 64,
            restart: true,
        }
    }

    pub fn streams(quick: bool) -> BoxPlan {
        let scale = if quick { 1 } else { 10 };
        BoxPlan {
            label: "streams",
            relays: 1,
            steps: vec![500 * scale, 1_000 * scale, 1_900 * scale],
            settle: Duration::from_secs(if quick { 1 } else { 5 }),
            clients: 1,
            run: Duration::from_secs(if quick { 5 } else { 30 }),
            connect_concurrency: 200,
            restart: false,
            ..BoxPlan::of(quick)
        }
    }

    pub fn streams_total(&self) -> usize {
        self.steps.last().copied().unwrap_or(0)
    }

    fn streams_on(&self, relay: usize) -> usize {
        (0..self.streams_total())
            .filter(|g| stream_client::placement(*g, self.relays, self.scopes).0 == relay)
            .count()
    }

    fn streams_in(&self, scope: usize) -> u64 {
        (0..self.streams_total())
            .filter(|g| stream_client::placement(*g, self.relays, self.scopes).1 == scope)
            .count() as u64
    }

    fn expected(&self, emitted: usize) -> u64 {
        (0..self.scopes)
            .map(|scope| {
                self.streams_in(scope) * (scope..emitted).step_by(self.scopes).count() as u64
            })
            .sum()
    }
}

/// A `database.pool_size` for which `relays × (pool_size + 1)` (with each
/// relay's LISTEN connection) fits in `max_connections` less the superuser
/// reserve, the connections in use and [`HEADROOM`]; and those three.
pub async fn pool_budget(database_url: &str, relays: usize) -> BenchResult<(usize, [usize; 3])> {
    let client = eventrelay::connect(database_url).await?;
    let settings = "SELECT current_setting('max_connections')::int,
                           current_setting('superuser_reserved_connections')::int,
                           (SELECT count(*)::int FROM pg_stat_activity
                            WHERE backend_type = 'client backend')";
    let row = client.query_one(settings, &[]).await?;
    let [max_connections, reserved, in_use] = [0, 1, 2].map(|i| row.get::<_, i32>(i) as usize);
    let budget = max_connections.saturating_sub(reserved + in_use + HEADROOM);
    let per_relay = budget / relays.max(1);
    let pool_size = per_relay.saturating_sub(1).clamp(1, POOL_CEILING);
    Ok((pool_size, [max_connections, reserved, in_use]))
}

#[derive(Clone)]
struct Emitter {
    pub database_url: String,
    pub schema: String,
    pub scope_prefix: String,
    pub scopes: usize,
}

impl Emitter {
    /// Numbered durable emits from `first` on, one transaction each, `rate`
    /// a second round robin over the scopes, until `deadline` or `stop`;
    /// answers each one's commit time (realtime ns), indexed from `first`.
    async fn run(
        &self,
        first: usize,
        rate: f64,
        deadline: Option<tokio::time::Instant>,
        mut stop: watch::Receiver<bool>,
    ) -> BenchResult<Vec<u64>> {
        let mut client = eventrelay::connect(&self.database_url).await?;
        let publisher = Publisher::new(&self.schema)?;
        let start = tokio::time::Instant::now();
        let mut committed = Vec::new();
        for offset in 0usize.. {
            let due = start + Duration::from_secs_f64(offset as f64 / rate);
            if deadline.is_some_and(|deadline| due >= deadline) || *stop.borrow() {
                break;
            }
            tokio::select! {
                () = tokio::time::sleep_until(due) => {}
                _ = stop.changed() => break,
            }
            let number = first + offset;
            let scope = stream_client::scope_name(&self.scope_prefix, number % self.scopes);
            let event = NewEvent::durable(TICK_TYPE, &scope, event_data(number));
            let transaction = client.transaction().await?;
            publisher.emit(&transaction, event).await?;
            transaction.commit().await?;
            committed.push(realtime_ns());
        }
        Ok(committed)
    }
}

async fn count_connections(database_url: String, mut stop: watch::Receiver<bool>) -> i64 {
    let Ok(client) = eventrelay::connect(&database_url).await else {
        return -1;
    };
    let count = "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1";
    let mut most = 0;
    loop {
        if let Ok(row) = client.query_one(count, &[&APPLICATION_NAME]).await {
            most = most.max(row.get::<_, i64>(0));
        }
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(250)) => {}
            _ = stop.changed() => break,
        }
    }
    most
}

/// Realtime nanoseconds `from` to `to`, in seconds; 0 if `to` came first.
fn seconds_between(from: u64, to: u64) -> f64 {
    to.saturating_sub(from) as f64 / 1e9
}

fn with_application_name(url: &str) -> String {
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}application_name={APPLICATION_NAME}")
}

/// Runs the scenario and adds its rows to `table` as each phase ends, so a
/// storm that does not settle still leaves the fan-out's figures.
async fn run(plan: &BoxPlan, cx: &Context, table: &mut Table) -> BenchResult<()> {
    let (relay_bin, work_dir) = (&cx.args.relay_bin, &cx.args.work_dir);
    let (database_url, schema) = (cx.db(), cx.schema.as_str());
    let (relays_n, n, label) = (plan.relays, plan.streams_total(), plan.label);
    let (pool, [most, reserved, in_use]) = pool_budget(database_url, relays_n).await?;
    eprintln!(
        "{label}: {n} streams over {relays_n} relays (pool_size {}) and {} client processes",
        pool, plan.clients
    );
    let mut settings = RelaySettings::new(&with_application_name(database_url), schema);
    settings.pool_size = pool;
    settings.header_timeout_secs = Some(HEADER_TIMEOUT_SECS);

    let (sampling, sampler_stop) = watch::channel(false);
    let sampler = tokio::spawn(count_connections(database_url.to_owned(), sampler_stop));

    let starting = (0..relays_n).map(|_| RelayProcess::start(relay_bin, work_dir, &settings));
    let mut relays = futures_util::future::try_join_all(starting).await?;
    let ports: Vec<u16> = relays.iter().map(|relay| relay.port).collect();
    let usages = |relays: &[RelayProcess]| -> Vec<Usage> {
        relays.iter().map(|r| usage(&[r.pid()])).collect()
    };
    let before = usages(&relays);
    let start_after = max_seq(database_url, schema).await?;

    let scope_prefix = format!("{label}-{}", std::process::id());
    let (mut clients, mut at_step) = (Clients(Vec::new()), Vec::new());
    let (mut opened, mut connecting) = (0, Duration::ZERO);
    for &step in &plan.steps {
        let (started, from) = (Instant::now(), clients.0.len());
        let spec = ClientSpec {
            index: from,
            relay_ports: ports.clone(),
            streams: opened..step,
            scopes: plan.scopes,
            scope_prefix: scope_prefix.clone(),
            last_event_id: Some(start_after),
            connect_concurrency: plan.connect_concurrency,
            reconnect: Reconnect::Jittered,
            work_dir: work_dir.to_owned(),
        };
        let spawned = spec.spawn(&std::env::current_exe()?, plan.clients)?;
        clients.0.extend(spawned);
        for client in &mut clients.0[from..] {
            client.expect("all_streaming", PATIENCE).await?;
        }
        connecting += started.elapsed();
        opened = step;
        eprintln!("{label}: {step} streaming");
        tokio::time::sleep(plan.settle).await;
        at_step.push((step, usages(&relays)));
    }
    let idle = usages(&relays);
    let client_pids: Vec<u32> = clients.0.iter().map(ClientProcess::pid).collect();
    let clients_idle_rss = proc_stats::rss_bytes(&client_pids);

    let rate = plan.scopes as f64;
    let (_never, no_stop) = watch::channel(false);
    let run_deadline = tokio::time::Instant::now() + plan.run;
    eprintln!("{label}: emitting {rate} events/s for {:?}", plan.run);
    let emitter = Emitter {
        database_url: database_url.to_owned(),
        schema: schema.to_owned(),
        scope_prefix: scope_prefix.clone(),
        scopes: plan.scopes,
    };
    let mut committed = emitter.run(0, rate, Some(run_deadline), no_stop).await?;
    let run_events = committed.len();
    let expected_run = plan.expected(run_events);
    let (drain_deadline, mut received_run) = (Instant::now() + DRAIN, 0);
    while Instant::now() < drain_deadline {
        received_run = clients.received(Duration::from_secs(10)).await?;
        if received_run >= expected_run {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (after_run, clients_rss) = (usages(&relays), proc_stats::rss_bytes(&client_pids));
    clients.send("report")?;
    let reports = clients.expect("report", Duration::from_secs(60)).await?;
    let mut arrivals: Vec<Arrival> = Vec::new();
    for report in &reports {
        arrivals.extend(ClientProcess::arrivals(report)?);
    }
    let first = PhaseFigures::merge(reports.iter().map(|r| &r["tally"]), relays_n);

    let mut per_relay_latency = vec![Vec::new(); relays_n];
    let (mut all_latency, mut last_arrival) = (Vec::with_capacity(arrivals.len()), 0u64);
    for arrival in &arrivals {
        let Some(&commit) = committed.get(arrival.number as usize) else {
            continue;
        };
        let latency = arrival.at.saturating_sub(commit);
        last_arrival = last_arrival.max(arrival.at);
        all_latency.push(latency);
        if let Some(relay) = per_relay_latency.get_mut(arrival.relay as usize) {
            relay.push(latency);
        }
    }
    drop(arrivals);
    let delivered = all_latency.len() as u64;
    let span = seconds_between(committed.first().copied().unwrap_or(0), last_arrival);
    let latency = Percentiles::of(&mut all_latency);
    let connect_secs =
        |relay: usize| seconds_between(first.first_attempt, first.last_ready[relay]).max(1e-9);
    let (connect_all, run_secs) = (connecting.as_secs_f64().max(1e-9), plan.run.as_secs_f64());

    let (processes, scopes) = (clients.0.len(), plan.scopes);
    let (last_source, per_relay, all_relays) =
        (1 + processes.min(8), pool + 1, relays_n * (pool + 1));
    table.note(
        format!(
            "{label}: {n} streams, {relays_n} relays × pool_size {pool} on one Postgres (http.header_timeout_secs {HEADER_TIMEOUT_SECS}), {processes} client processes on 127.0.0.2–.{last_source}, {scopes} scopes shared by every relay"
        ),
        format!(
            "max_connections {most} − {reserved} reserved − {in_use} in use − {HEADROOM} headroom → pool_size {pool} ({relays_n} × {per_relay} = {all_relays} for the relays)"
        ),
    );
    for r in 0..relays_n {
        let streams = plan.streams_on(r);
        let cpu = after_run[r].cpu_seconds - idle[r].cpu_seconds;
        let mut samples = std::mem::take(&mut per_relay_latency[r]);
        let (relay_delivered, p) = (samples.len(), Percentiles::of(&mut samples).summary());
        let [before_rss, idle_rss, after_rss] =
            [&before, &idle, &after_run].map(|u| u[r].rss_bytes);
        let per_connection = size((idle_rss as f64 - before_rss as f64) / streams as f64);
        let (idle_rss, after_rss) = (size(idle_rss as f64), size(after_rss as f64));
        let (connect, share) = (streams as f64 / connect_secs(r), cpu / run_secs * 100.0);
        table.note(
            format!("{label}: relay {} ({streams} streams)", r + 1),
            format!(
                "connect {connect:.0} streams/s · idle RSS per connection {per_connection} · RSS idle {idle_rss} · after the run {after_rss} · CPU {cpu:.1} s over the {run_secs:.0} s run ({share:.0}% of a core) · {relay_delivered} deliveries, {p}"
            ),
        );
    }
    let sum_rss = |usages: &[Usage]| usages.iter().map(|u| u.rss_bytes).sum::<u64>() as f64;
    let per_stream = |usages: &[Usage], streams: usize| {
        (sum_rss(usages) - sum_rss(&before)) / streams.max(1) as f64
    };
    for (index, (step, usages)) in at_step.iter().enumerate() {
        let per_relay: Vec<String> = (0..relays_n)
            .map(|r| {
                let grown = usages[r].rss_bytes as f64 - before[r].rss_bytes as f64;
                size(grown / plan.streams_on(r).max(1) as f64 * n as f64 / *step as f64)
            })
            .collect();
        // The last step against the one before: RSS per stream stays flat.
        let target = match index.checked_sub(1).map(|before| &at_step[before]) {
            Some((middle, middle_usage)) if index + 1 == at_step.len() => {
                let at_middle = per_stream(middle_usage, *middle);
                let small = verdict(at_middle <= 14.0 * 1024.0);
                let flat = verdict(per_stream(usages, *step) <= at_middle * 1.1);
                format!("≤ 14 KiB at {middle}: {small} · {step} within 10% of {middle}: {flat}")
            }
            _ => "–".to_owned(),
        };
        let all = size(per_stream(usages, *step));
        let (per_relay, settle) = (per_relay.join(" / "), plan.settle.as_secs());
        table.add(
            format!(
                "{label}: RSS per idle stream at {step}, {relays_n} relay(s), {settle} s after the step"
            ),
            format!("{all} over all relays · per relay {per_relay}"),
            target,
        );
    }
    let cpu_run: f64 = (0..relays_n)
        .map(|r| after_run[r].cpu_seconds - idle[r].cpu_seconds)
        .sum();
    let (opened, concurrency) = (first.streams_opened, plan.connect_concurrency);
    let (connect_rate, connect, errors) = (n as f64 / connect_all, first.connect, first.errors());
    let connect = connect.p50_p99();
    let per_connection = size((sum_rss(&idle) - sum_rss(&before)) / n as f64);
    let (relays_idle, clients_idle) = (size(sum_rss(&idle)), clients_idle_rss as f64);
    let (clients_idle, clients_per_stream) = (size(clients_idle), size(clients_idle / n as f64));
    table.add(
        format!(
            "{label}: all {relays_n} relays, first connect ({concurrency} handshakes in flight per client process)"
        ),
        format!(
            "{opened} streams ready in {connect_all:.1} s ({connect_rate:.0} streams/s) · connect {connect} · {errors} · idle RSS per connection {per_connection} · relays' RSS idle {relays_idle} · clients' RSS idle {clients_idle} ({clients_per_stream} per stream), after the run {}",
            size(clients_rss as f64),
        ),
        format!("no 408, 5xx or reset: {}", verdict(first.clean())),
    );
    let missing = expected_run.saturating_sub(delivered);
    let share = cpu_run / run_secs * 100.0;
    let (latency, rss_after) = (latency.summary(), size(sum_rss(&after_run)));
    table.add(
        format!(
            "{label}: one event per second to each of {n} streams for {run_secs:.0} s ({rate:.0} durable emits/s, commit-to-receive)"
        ),
        format!(
            "{:.0} deliveries/s · {latency} · {delivered} of {expected_run} delivered ({missing} missing) · relays' CPU {cpu_run:.1} s over {run_secs:.0} s ({share:.0}% of one core), RSS after {rss_after}",
            delivered as f64 / span.max(1e-9),
        ),
        format!("every delivery made: {}", verdict(delivered == expected_run && received_run >= expected_run)),
    );
    if !plan.restart {
        return Ok(());
    }

    clients.send("phase")?;
    let (stop_storm, storm_stopped) = watch::channel(false);
    let storm_emitter = {
        let (emitter, rate) = (emitter.clone(), plan.storm_rate);
        tokio::spawn(async move { emitter.run(run_events, rate, None, storm_stopped).await })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    eprintln!("{label}: SIGTERM to every relay, each restarted on its port");
    let sigterm_at = realtime_ns();
    let storm_deadline = tokio::time::Instant::now() + STORM_PATIENCE;
    let restarted = futures_util::future::join_all(relays.drain(..).map(|mut relay| {
        let settings = &settings;
        async move {
            let stopped_in = relay.terminate(Duration::from_secs(30)).await?;
            let port = relay.port;
            drop(relay);
            let fresh = tokio::time::timeout_at(
                storm_deadline,
                RelayProcess::start_on(relay_bin, work_dir, settings, port),
            )
            .await
            .map_err(|_| format!("the relay on port {port} was not ready within {STORM_PATIENCE:?} of the SIGTERMs"))??;
            BenchResult::Ok((stopped_in, fresh, realtime_ns()))
        }
    }))
    .await;
    let (mut stopped_in, mut last_ready_relay, mut failures) = (Vec::new(), 0, Vec::new());
    for outcome in restarted {
        match outcome {
            Ok((stopped, fresh, ready_at)) => {
                stopped_in.push(stopped);
                last_ready_relay = last_ready_relay.max(ready_at);
                relays.push(fresh);
            }
            Err(error) => failures.push(error.to_string()),
        }
    }
    let (mut all_back_at, mut all_back) = (0u64, failures.is_empty());
    for client in &mut clients.0 {
        let left = storm_deadline.saturating_duration_since(tokio::time::Instant::now());
        let left = left.max(Duration::from_millis(1));
        match client.expect("all_streaming", left).await {
            Ok(line) => all_back_at = all_back_at.max(line["at"].as_u64().unwrap_or(0)),
            Err(error) => {
                failures.push(error.to_string());
                all_back = false;
            }
        }
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop_storm.send_replace(true);
    committed.extend(storm_emitter.await??);
    let (emitted, after_storm) = (committed.len(), usages(&relays));
    let waiting = relays.iter().map(|r| r.metric("database_pool_waiting"));
    let pool_waiting = futures_util::future::join_all(waiting).await;
    sampling.send_replace(true);
    let most_connections = sampler.await.unwrap_or(-1);
    let patience = if all_back { DRAIN } else { DRAIN / 4 };
    clients.send(&format!("finish {emitted} {}", patience.as_millis()))?;
    let finished = clients.expect("finished", patience + PATIENCE).await?;
    drop(clients);
    let total = |key| stream_client::sum(&finished, key);
    let (missing, missing_streams) = (total("missing"), total("missing_streams"));
    let storm = PhaseFigures::merge(finished.iter().map(|f| &f["phases"][1]), relays_n);
    let from_sigterm = seconds_between(sigterm_at, all_back_at);
    let from_last_relay = seconds_between(last_ready_relay, all_back_at);
    let slowest_stop = stopped_in.iter().max().map_or(0.0, Duration::as_secs_f64);
    let last_ready = seconds_between(sigterm_at, last_ready_relay);
    let (connect, errors) = (storm.connect.summary(), storm.errors());
    let (refused, opened) = (storm.refused_while_down, storm.streams_opened);
    let rss = size(sum_rss(&after_storm));
    let failures: String = failures.iter().map(|f| format!(" · {f}")).collect();
    let all_back_clean = verdict(all_back && storm.clean() && missing == 0);
    table.add(
        format!(
            "{label}: reconnect storm, all {relays_n} relays SIGTERMed at once and restarted on their ports under {n} streams, {} events/s emitted throughout, clients reconnecting as eventrelay's browser client (full jitter over 3 s, backoff after failures)",
            plan.storm_rate,
        ),
        format!(
            "{} · slowest relay exited {slowest_stop:.2} s after SIGTERM, last one ready again {last_ready:.2} s after it · connect {connect} · {errors} · refused while down: {refused} · {opened} streams opened · {emitted} events emitted in all, {missing} (subscriber, event) pairs missed on {missing_streams} streams · relays' RSS after {rss} · most relay connections to Postgres at once {most_connections} · pool waiters at the end {pool_waiting:?}{failures}",
            if all_back {
                format!(
                    "all {n} streaming again {from_sigterm:.1} s after the SIGTERMs ({from_last_relay:.1} s after the last relay was ready)"
                )
            } else {
                format!("not all {n} streaming again within {STORM_PATIENCE:?}")
            }
        ),
        format!("all back, no 408, 5xx or reset, none missed: {all_back_clean}"),
    );
    let descriptors = first.out_of_descriptors + storm.out_of_descriptors;
    let ports = first.out_of_ports + storm.out_of_ports;
    if descriptors + ports > 0 {
        table.note(
            format!("{label}: the load's own limits"),
            format!(
                "attempts without a file descriptor: {descriptors} · without an ephemeral port: {ports}"
            ),
        );
    }
    Ok(())
}

pub async fn rows(cx: &Context, table: &mut Table) -> BenchResult<()> {
    run(&BoxPlan::streams(cx.args.quick), cx, table).await
}

pub async fn box_rows(cx: &Context, table: &mut Table) -> BenchResult<()> {
    run(&BoxPlan::of(cx.args.quick), cx, table).await
}

const SETTLE: Duration = Duration::from_secs(5);
const WAVE_PATIENCE: Duration = Duration::from_secs(120);
const CLIENTS: usize = 2;

#[derive(Clone, Debug)]
pub struct StormPlan {
    pub subscribers: usize,
    pub scopes: usize,
    pub events_per_sec: f64,
    pub emitting: Duration,
    pub extra_waves: usize,
}

#[derive(Debug, Clone)]
pub struct Phase {
    pub all_streaming_after: Option<Duration>,
    pub figures: PhaseFigures,
}

impl Phase {
    pub fn clean(&self) -> bool {
        self.all_streaming_after.is_some() && self.figures.clean()
    }
}

#[derive(Debug, Clone)]
pub struct StormFigures {
    pub first: Phase,
    pub stopped_in: Duration,
    pub restart: Phase,
    pub emitted: usize,
    pub missed: u64,
    pub waves: Vec<Phase>,
    pub rss_before_kib: u64,
    pub rss_streaming_kib: Vec<u64>,
    pub rss_after_kib: u64,
    pub rss_settled_kib: u64,
}

async fn all_streaming(wave: &mut Clients, since: u64) -> Option<Duration> {
    let lines = wave.expect("all_streaming", WAVE_PATIENCE).await.ok()?;
    let last = lines
        .iter()
        .filter_map(|line| line["at"].as_u64())
        .fold(since, u64::max);
    Some(Duration::from_nanos(last - since))
}

async fn hang_up(wave: &mut Clients, emitted: usize) -> BenchResult<(Vec<PhaseFigures>, u64)> {
    wave.send(&format!("finish {emitted} 0"))?;
    let lines = wave.expect("finished", WAVE_PATIENCE).await?;
    let phases = lines[0]["phases"].as_array().map_or(0, Vec::len);
    let merge = |phase| PhaseFigures::merge(lines.iter().map(|l| &l["phases"][phase]), 1);
    let figures = (0..phases).map(merge).collect();
    Ok((figures, stream_client::sum(&lines, "missing")))
}

pub async fn run_storm(
    plan: &StormPlan,
    binary: &Path,
    client_bin: &Path,
    work_dir: &Path,
    settings: &RelaySettings,
) -> BenchResult<StormFigures> {
    let n = plan.subscribers;
    let mut relay = RelayProcess::start(binary, work_dir, settings).await?;
    let (port, rss_before_kib) = (relay.port, rss_kib(&relay));
    let start_after = max_seq(&settings.database_url, &settings.schema).await?;
    // A wave: every subscriber, on scopes named after the wave.
    let open_wave = |name: &str, last_event_id| -> BenchResult<Clients> {
        let spec = ClientSpec {
            index: 0,
            relay_ports: vec![port],
            streams: 0..n,
            scopes: plan.scopes,
            scope_prefix: name.to_owned(),
            last_event_id,
            connect_concurrency: n.div_ceil(CLIENTS),
            reconnect: Reconnect::Immediate,
            work_dir: work_dir.to_owned(),
        };
        Ok(Clients(spec.spawn(client_bin, CLIENTS)?))
    };

    let connecting = realtime_ns();
    let mut storm = open_wave("storm", Some(start_after))?;
    let first_after = all_streaming(&mut storm, connecting).await.ok_or(format!(
        "not all {n} subscribers streamed within {WAVE_PATIENCE:?}"
    ))?;

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

    let expected: u64 = (0..n)
        .map(|g| (g % plan.scopes..emitted).step_by(plan.scopes).count() as u64)
        .sum();
    let deadline = Instant::now() + WAVE_PATIENCE;
    while storm.received(WAVE_PATIENCE).await? < expected && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut rss_streaming_kib = vec![rss_kib(&relay)];

    let (mut leaving, mut leaving_emitted) = (storm, emitted);
    let (mut left, mut waves) = (Vec::new(), Vec::new());
    for number in 0..plan.extra_waves {
        let arriving = realtime_ns();
        let mut wave = open_wave(&format!("wave{number}"), None)?;
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

    let deadline = Instant::now() + WAVE_PATIENCE;
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

pub async fn storm_rows(cx: &Context, table: &mut Table) -> BenchResult<()> {
    let n = cx.scale.large_fanout;
    eprintln!("reconnect storm: {n} subscribers");
    let plan = StormPlan {
        subscribers: n,
        scopes: 100,
        events_per_sec: 20.0,
        emitting: cx.scale.fixed_run,
        extra_waves: 2,
    };
    let (relay_bin, work_dir) = (&cx.args.relay_bin, &cx.args.work_dir);
    let client_bin = std::env::current_exe()?;
    let f = run_storm(&plan, relay_bin, &client_bin, work_dir, &cx.settings()).await?;
    let phase = |p: &Phase| {
        let streaming = match p.all_streaming_after {
            Some(after) => format!("all {n} streaming after {:.2} s", after.as_secs_f64()),
            None => format!("not all {n} streaming"),
        };
        let (connect, errors) = (p.figures.connect.p50_p99(), p.figures.errors());
        format!("{streaming} · connect {connect} · {errors}")
    };
    table.add(
        format!("reconnect storm: {n} subscribers connect at once (100 scopes)"),
        phase(&f.first),
        format!("no 408, 5xx or reset: {}", verdict(f.first.clean())),
    );
    let (stopped, restart) = (f.stopped_in.as_secs_f64(), phase(&f.restart));
    let (emitted, missed) = (f.emitted, f.missed);
    let all_back_clean = verdict(f.restart.clean() && f.missed == 0);
    table.add(
        format!(
            "reconnect storm: SIGTERM and restart under {n} subscribers, 20 ev/s emitted throughout"
        ),
        format!(
            "old process exited {stopped:.2} s after SIGTERM · from the new process's start, {restart} · {emitted} events, {missed} missed"
        ),
        format!("all back, no 408, 5xx or reset, none missed: {all_back_clean}"),
    );
    for (index, wave) in f.waves.iter().enumerate() {
        let (number, previous) = (index + 2, index + 1);
        table.add(
            format!("reconnect storm: wave {number} of {n} arrives while wave {previous} hangs up"),
            phase(wave),
            format!("no 408, 5xx or reset: {}", verdict(wave.clean())),
        );
    }
    let first = f.rss_streaming_kib.first().copied().unwrap_or(0) as f64;
    let last = f.rss_streaming_kib.last().copied().unwrap_or(0) as f64;
    let kib = |kib: &u64| size(*kib as f64 * 1024.0);
    let streaming: Vec<String> = f.rss_streaming_kib.iter().map(kib).collect();
    let [before, after, settled] =
        [&f.rss_before_kib, &f.rss_after_kib, &f.rss_settled_kib].map(kib);
    table.add(
        format!("reconnect storm: relay RSS with each wave of {n} streaming"),
        format!(
            "before: {before} · {} · after the last wave left: {after} · 5 s later: {settled}",
            streaming.join(" → ")
        ),
        format!(
            "last wave within 10% of the first: {}",
            verdict(last <= first * 1.10)
        ),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_spread_evenly_over_relays_and_scopes() {
        let plan = BoxPlan::of(true);
        let per_relay: Vec<usize> = (0..plan.relays).map(|r| plan.streams_on(r)).collect();
        assert_eq!(per_relay.iter().sum::<usize>(), plan.streams_total());
        assert!(per_relay.iter().max().unwrap() - per_relay.iter().min().unwrap() <= 1);
        let per_scope: Vec<u64> = (0..plan.scopes).map(|s| plan.streams_in(s)).collect();
        assert!(per_scope.iter().max().unwrap() - per_scope.iter().min().unwrap() <= 1);
        let mut pairs = std::collections::BTreeSet::new();
        for g in 0..plan.streams_total() {
            pairs.insert(stream_client::placement(g, plan.relays, plan.scopes));
        }
        assert_eq!(pairs.len(), plan.relays * plan.scopes);
    }
}
