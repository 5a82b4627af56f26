//! Many idle streams on relays, and then one event per second to each of
//! them: what a stream costs a relay in resident memory as the count grows
//! (read in steps), how fast streams connect, and whether every delivery
//! is made once they all receive.
//!
//! The streams are held by child processes of the load tool (the
//! `streams-client` command), each under the machine's open-file limit,
//! each stream connecting from one of several loopback source addresses so
//! that no source runs out of ephemeral ports. The parent starts the
//! children, tells them how many streams to open at each step, reads the
//! relays' RSS, emits the events and records their commit times; each
//! child then checks its own streams against those times, event by event,
//! on the machine's monotonic clock.

use crate::context::Context;
use crate::report::{Table, ms, size, verdict};
use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use std::sync::atomic::{AtomicU64, Ordering};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinHandle;

use crate::BenchResult;
use crate::clock::{CommitLog, Percentiles, Receipt};
use crate::proc_stats;
use crate::publish::{Pace, Source, publish_for};
use crate::relay_process::{RelayProcess, RelaySettings};
use crate::sse_load::{FrameParser, ReadyWhen, StreamTarget, connect_from, request_head};

/// Handshakes each child keeps in flight while its streams connect.
const CONNECT_CONCURRENCY: usize = 200;
/// Longest wait for the last deliveries after the events stop.
const DRAIN_PATIENCE: Duration = Duration::from_secs(10);

/// One run.
#[derive(Clone, Debug)]
pub struct StreamsPlan {
    /// Open streams at which the relays' RSS is read; the last is the total.
    pub steps: Vec<usize>,
    /// How long the streams sit idle at each step before the reading.
    pub settle: Duration,
    pub scopes: usize,
    /// Prefix of this run's scope names.
    pub scope_prefix: String,
    /// Events per second into each scope.
    pub rate_per_scope: f64,
    pub duration: Duration,
    /// Streams per child process, kept under its open-file limit.
    pub per_child: usize,
    /// Loopback addresses the streams connect from, round robin.
    pub sources: Vec<IpAddr>,
    /// How long a stream waits before it reconnects, after its stream
    /// ended or an attempt failed: a browser's `EventSource` waits the
    /// stream's `retry:` (the relay sends 3 s); at least 50 ms.
    pub reconnect_delay: Duration,
}

/// RSS per idle stream at one step.
#[derive(Clone, Debug)]
pub struct Step {
    pub streams: usize,
    /// (RSS now − RSS before any stream) / streams, summed over relays.
    pub rss_per_stream: f64,
    /// The same for each relay, over the streams it holds.
    pub per_relay: Vec<f64>,
}

#[derive(Clone, Debug)]
pub struct StreamsFigures {
    pub steps: Vec<Step>,
    pub children: usize,
    /// Time spent opening streams (all steps, not the idle waits).
    pub connect_time: Duration,
    pub published: usize,
    pub expected: u64,
    pub delivered: u64,
    /// Expected deliveries that never came.
    pub missing: u64,
    /// Streams that missed at least one event, or failed.
    pub streams_short: u64,
    /// Frames received twice, or from another scope.
    pub unexpected: u64,
    pub deliveries_per_second: f64,
    /// The relays' CPU seconds (user and system) per 1,000 deliveries,
    /// over the events and their drain.
    pub cpu_seconds_per_1000: f64,
    pub latency: Percentiles,
    /// Deliveries per relay, in the order of the plan's relays.
    pub delivered_per_relay: Vec<u64>,
    pub rss_after: Vec<u64>,
    /// Events received again after a reconnect (replayed from before the
    /// stream's `Last-Event-ID`); not a failure.
    pub repeated: u64,
    pub storm: Option<StormFigures>,
}

/// Every relay restarted at once under its streams.
#[derive(Clone, Debug)]
pub struct StormFigures {
    /// From the SIGTERMs until every relay's new process was ready.
    pub relays_back_after: Duration,
    /// From the SIGTERMs until every stream was streaming again.
    pub all_streaming_after: Option<Duration>,
    /// Answers other than 200 during the storm.
    pub refused: u64,
    /// Of them: 408, 429 and 5xx.
    pub refused_408: u64,
    pub refused_429: u64,
    pub refused_5xx: u64,
    /// Connections broken after the connect during the storm.
    pub broken: u64,
}

/// Restarting the relays after the events: their binary and settings.
pub struct Restart<'a> {
    pub binary: &'a Path,
    pub settings: &'a [RelaySettings],
}

/// Longest wait for every stream to stream again after the restart.
const STORM_PATIENCE: Duration = Duration::from_secs(180);

impl StreamsFigures {
    /// Streams per second while connecting.
    pub fn connect_rate(&self) -> f64 {
        let total = self.steps.last().map_or(0, |step| step.streams);
        total as f64 / self.connect_time.as_secs_f64().max(1e-9)
    }
}

/// Which relay and scope global stream `index` goes to.
fn placement(index: usize, relays: usize, scopes: usize) -> (usize, usize) {
    (index % relays, (index / relays) % scopes)
}

/// Runs `plan` against `relays`; with `restart`, ends with every relay
/// restarted at once under its streams.
pub async fn run(
    plan: &StreamsPlan,
    relays_running: &mut [RelayProcess],
    restart: Option<Restart<'_>>,
    bench_bin: &Path,
    work_dir: &Path,
    source: &Source,
) -> BenchResult<StreamsFigures> {
    let total = plan.steps.last().copied().unwrap_or(0);
    let relays = relays_running.len();
    let addresses: Vec<SocketAddr> = relays_running.iter().map(RelayProcess::address).collect();
    let pids = |running: &[RelayProcess]| -> Vec<Vec<u32>> {
        running.iter().map(|relay| vec![relay.pid()]).collect()
    };
    let relay_pids = pids(relays_running);
    let children_count = total.div_ceil(plan.per_child.max(1)).max(1);
    let before: Vec<u64> = relay_pids
        .iter()
        .map(|pids| proc_stats::rss_bytes(pids))
        .collect();
    let mut children = Vec::with_capacity(children_count);
    for index in 0..children_count {
        let first = index * total / children_count;
        let count = (index + 1) * total / children_count - first;
        children.push(
            ClientProcess::start(bench_bin, work_dir, plan, &addresses, index, first, count)
                .await?,
        );
    }

    let mut steps = Vec::new();
    let mut connect_time = Duration::ZERO;
    for &target in &plan.steps {
        let started = Instant::now();
        let opening = children.iter_mut().map(|child| {
            let want = target * child.count / total.max(1);
            let more = want.saturating_sub(child.opened);
            child.open(more)
        });
        for opened in futures_util::future::join_all(opening).await {
            opened?;
        }
        connect_time += started.elapsed();
        eprintln!(
            "streams: {target} open after {:.1} s of connecting",
            connect_time.as_secs_f64()
        );
        tokio::time::sleep(plan.settle).await;
        let mut per_relay = Vec::with_capacity(relays);
        let mut grown = 0.0;
        for (relay, pids) in relay_pids.iter().enumerate() {
            let held = (0..target)
                .filter(|index| placement(*index, relays, plan.scopes).0 == relay)
                .count();
            let growth = proc_stats::rss_bytes(pids) as f64 - before[relay] as f64;
            grown += growth;
            per_relay.push(growth / held.max(1) as f64);
        }
        steps.push(Step {
            streams: target,
            rss_per_stream: grown / target.max(1) as f64,
            per_relay,
        });
    }

    let rate = plan.rate_per_scope * plan.scopes as f64;
    let capacity = (rate * plan.duration.as_secs_f64()).ceil() as usize + 1;
    let log = CommitLog::new(capacity);
    let prefix = plan.scope_prefix.clone();
    let scopes = plan.scopes;
    let scope_of = Arc::new(move |number: usize| format!("{prefix}-{}", number % scopes));
    let cpu_before = proc_stats::cpu_seconds(&relay_pids.concat());
    let published = publish_for(
        source,
        scope_of,
        Pace::PerSecond(rate),
        plan.duration,
        2,
        Arc::clone(&log),
    )
    .await?;

    let mut per_scope = vec![0u64; plan.scopes];
    for index in 0..total {
        per_scope[placement(index, relays, plan.scopes).1] += 1;
    }
    let committed: Vec<(usize, u64)> = (0..log.capacity())
        .filter_map(|number| Some((number, log.to_monotonic(log.committed_at(number)?))))
        .collect();
    let expected: u64 = committed
        .iter()
        .map(|(number, _)| per_scope[number % plan.scopes])
        .sum();
    let deadline = Instant::now() + DRAIN_PATIENCE;
    while Instant::now() < deadline {
        let mut received = 0;
        for child in &mut children {
            received += child.count_received().await?;
        }
        if received >= expected {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    let cpu_spent = proc_stats::cpu_seconds(&relay_pids.concat()) - cpu_before;
    let commit_file = work_dir.join(format!("streams-commits-{}.txt", std::process::id()));
    let lines: String = committed
        .iter()
        .map(|(number, at)| format!("{number} {at}\n"))
        .collect();
    std::fs::write(&commit_file, lines)?;
    let rss_after = relay_pids
        .iter()
        .map(|pids| proc_stats::rss_bytes(pids))
        .collect();
    let storm = match restart {
        Some(restart) => {
            Some(restart_storm(relays_running, &restart, work_dir, &mut children, total).await?)
        }
        None => None,
    };
    let mut figures = StreamsFigures {
        steps,
        children: children.len(),
        connect_time,
        published,
        expected,
        delivered: 0,
        missing: 0,
        streams_short: 0,
        unexpected: 0,
        deliveries_per_second: 0.0,
        cpu_seconds_per_1000: 0.0,
        latency: Percentiles::default(),
        delivered_per_relay: vec![0; relays],
        rss_after,
        repeated: 0,
        storm,
    };
    let mut latencies = Vec::with_capacity(expected as usize);
    let mut last_receipt = 0u64;
    for child in &mut children {
        let done = child.finish(&commit_file).await?;
        figures.delivered += done.delivered;
        figures.missing += done.missing;
        figures.streams_short += done.streams_short;
        figures.unexpected += done.unexpected;
        figures.repeated += done.repeated;
        for (relay, delivered) in done.per_relay.iter().enumerate() {
            if let Some(sum) = figures.delivered_per_relay.get_mut(relay) {
                *sum += delivered;
            }
        }
        last_receipt = last_receipt.max(done.last_receipt);
        latencies.extend(read_latencies(&child.latency_file)?);
    }
    let _ = std::fs::remove_file(&commit_file);
    let first_commit = committed.iter().map(|(_, at)| *at).min().unwrap_or(0);
    let span = last_receipt.saturating_sub(first_commit) as f64 / 1e9;
    if span > 0.0 {
        figures.deliveries_per_second = figures.delivered as f64 / span;
    }
    figures.latency = Percentiles::of(&mut latencies);
    if figures.delivered > 0 {
        figures.cpu_seconds_per_1000 = cpu_spent / figures.delivered as f64 * 1000.0;
    }
    Ok(figures)
}

/// SIGTERM to every relay at once, each started again on its port once it
/// has exited, while every stream reconnects with its `Last-Event-ID`.
async fn restart_storm(
    relays: &mut [RelayProcess],
    restart: &Restart<'_>,
    work_dir: &Path,
    children: &mut [ClientProcess],
    total: usize,
) -> BenchResult<StormFigures> {
    let before = status(children).await?;
    eprintln!(
        "streams: restarting {} relays under {total} streams",
        relays.len()
    );
    let started = Instant::now();
    let stopping = relays
        .iter_mut()
        .map(|relay| relay.terminate(Duration::from_secs(60)));
    for stopped in futures_util::future::join_all(stopping).await {
        stopped?;
    }
    let starting = relays
        .iter()
        .zip(restart.settings)
        .map(|(relay, settings)| {
            RelayProcess::start_on(restart.binary, work_dir, settings, relay.port)
        });
    let started_again = futures_util::future::join_all(starting).await;
    for (relay, started_again) in relays.iter_mut().zip(started_again) {
        *relay = started_again?;
    }
    let relays_back_after = started.elapsed();
    let mut all_streaming_after = None;
    while started.elapsed() < STORM_PATIENCE {
        let now = status(children).await?;
        if now[0] >= total as u64 {
            all_streaming_after = Some(started.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let after = status(children).await?;
    let during = |field: usize| after[field] - before[field];
    Ok(StormFigures {
        relays_back_after,
        all_streaming_after,
        refused: during(1),
        broken: during(2),
        refused_408: during(3),
        refused_429: during(4),
        refused_5xx: during(5),
    })
}

/// Over every child: streams streaming now, then so far: refusals, broken
/// connections, 408s, 429s and 5xx answers.
async fn status(children: &mut [ClientProcess]) -> BenchResult<[u64; 6]> {
    let mut sum = [0; 6];
    for child in children {
        let words = child.ask("status").await?;
        for (field, total) in sum.iter_mut().enumerate() {
            *total += number(&words, field + 1)?;
        }
    }
    Ok(sum)
}

fn read_latencies(path: &Path) -> BenchResult<Vec<u64>> {
    let bytes = std::fs::read(path)?;
    let _ = std::fs::remove_file(path);
    Ok(bytes
        .chunks_exact(8)
        .map(|chunk| {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            u64::from_le_bytes(word)
        })
        .collect())
}

/// What a child found in its streams.
struct Done {
    delivered: u64,
    missing: u64,
    streams_short: u64,
    unexpected: u64,
    repeated: u64,
    last_receipt: u64,
    per_relay: Vec<u64>,
}

/// A child process holding some of the streams.
struct ClientProcess {
    child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
    count: usize,
    opened: usize,
    latency_file: PathBuf,
}

impl ClientProcess {
    async fn start(
        bench_bin: &Path,
        work_dir: &Path,
        plan: &StreamsPlan,
        relays: &[SocketAddr],
        index: usize,
        first: usize,
        count: usize,
    ) -> BenchResult<ClientProcess> {
        let join = |items: Vec<String>| items.join(",");
        let latency_file = work_dir.join(format!(
            "streams-latency-{}-{index}.bin",
            std::process::id()
        ));
        let mut child = Command::new(bench_bin)
            .arg("streams-client")
            .arg(join(relays.iter().map(ToString::to_string).collect()))
            .arg(join(plan.sources.iter().map(ToString::to_string).collect()))
            .arg(&plan.scope_prefix)
            .arg(plan.scopes.to_string())
            .arg(first.to_string())
            .arg(count.to_string())
            .arg(&latency_file)
            .arg(plan.reconnect_delay.as_millis().to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot start {} streams-client: {e}", bench_bin.display()))?;
        let stdin = child.stdin.take().ok_or("the child has no stdin")?;
        let stdout = child.stdout.take().ok_or("the child has no stdout")?;
        Ok(ClientProcess {
            child,
            stdin,
            stdout: BufReader::new(stdout).lines(),
            count,
            opened: 0,
            latency_file,
        })
    }

    async fn ask(&mut self, command: &str) -> BenchResult<Vec<String>> {
        self.stdin
            .write_all(format!("{command}\n").as_bytes())
            .await?;
        self.stdin.flush().await?;
        let Some(line) = self.stdout.next_line().await? else {
            let status = self.child.wait().await?;
            return Err(format!("a streams-client exited ({status}) on `{command}`").into());
        };
        let words: Vec<String> = line.split_whitespace().map(str::to_owned).collect();
        if words.first().map(String::as_str) == Some("error") {
            return Err(format!("streams-client: {line}").into());
        }
        Ok(words)
    }

    async fn open(&mut self, more: usize) -> BenchResult<()> {
        if more > 0 {
            self.ask(&format!("open {more}")).await?;
            self.opened += more;
        }
        Ok(())
    }

    async fn count_received(&mut self) -> BenchResult<u64> {
        let words = self.ask("count").await?;
        number(&words, 1)
    }

    async fn finish(&mut self, commit_file: &Path) -> BenchResult<Done> {
        let words = self
            .ask(&format!("finish {}", commit_file.display()))
            .await?;
        let per_relay = words
            .get(6)
            .map(|list| list.split(',').filter_map(|n| n.parse().ok()).collect())
            .unwrap_or_default();
        Ok(Done {
            delivered: number(&words, 1)?,
            missing: number(&words, 2)?,
            streams_short: number(&words, 3)?,
            unexpected: number(&words, 4)?,
            last_receipt: number(&words, 5)?,
            per_relay,
            repeated: number(&words, 7)?,
        })
    }
}

fn number(words: &[String], index: usize) -> BenchResult<u64> {
    words
        .get(index)
        .and_then(|word| word.parse().ok())
        .ok_or_else(|| format!("a streams-client answered {words:?}").into())
}

/// The `streams-client` command: holds streams `first .. first + count`
/// of a run and answers the parent's commands on its standard input, one
/// line each: `open N` (opens the next N, answering once all are ready),
/// `count` (frames with an event number received so far), `status`
/// (streams streaming now, and the failed attempts so far: refused, and
/// broken after the connect), `finish FILE` (closes every stream and checks
/// each against the commits in FILE, writing every delivery's latency to
/// the latency file).
///
/// Each stream behaves like a browser's `EventSource` without its retry
/// delay: when the server ends it, it reconnects at once with the last id
/// it saw as `Last-Event-ID`, retrying every 50 ms while nothing listens.
pub async fn client_main(args: &[String]) -> BenchResult<()> {
    let [
        relays,
        sources,
        prefix,
        scopes,
        first,
        count,
        latency_file,
        reconnect_ms,
    ] = args
    else {
        return Err("usage: streams-client RELAYS SOURCES PREFIX SCOPES FIRST COUNT LATENCY_FILE RECONNECT_MS".into());
    };
    let reconnect_delay = Duration::from_millis(reconnect_ms.parse()?).max(RETRY_WHILE_DOWN);
    let relays: Vec<SocketAddr> = relays
        .split(',')
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    let sources: Vec<IpAddr> = sources
        .split(',')
        .filter(|s| !s.is_empty())
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    let scopes: usize = scopes.parse()?;
    let first: usize = first.parse()?;
    let count: usize = count.parse()?;
    raise_file_limit();
    let log = CommitLog::new(0);
    let target = |index: usize| {
        let (relay, scope) = placement(index, relays.len(), scopes);
        StreamTarget {
            address: relays[relay],
            path: "/v1/events".to_owned(),
            authorization: Some(format!(
                "Bearer {}",
                crate::subscriber_token(&format!("s{index}"), &format!("{prefix}-{scope}"))
            )),
            last_event_id: None,
            ready_when: ReadyWhen::ReadyEvent,
            source: (!sources.is_empty()).then(|| sources[index % sources.len()]),
        }
    };
    let tally = Arc::new(Tally::default());
    let handshakes = Arc::new(Semaphore::new(CONNECT_CONCURRENCY));
    let (stop, stopped) = watch::channel(false);
    let mut held: Vec<(usize, JoinHandle<Vec<Receipt>>)> = Vec::new();
    let mut next = first;
    let mut input = BufReader::new(tokio::io::stdin()).lines();
    let mut output = tokio::io::stdout();
    while let Some(line) = input.next_line().await? {
        let mut words = line.split_whitespace();
        let answer = match (words.next(), words.next()) {
            (Some("open"), Some(more)) => {
                let more: usize = more.parse()?;
                let more = more.min(first + count - next);
                for index in next..next + more {
                    let holder = Holder {
                        target: target(index),
                        tally: Arc::clone(&tally),
                        log: Arc::clone(&log),
                        reconnect_delay,
                    };
                    let permit = Arc::clone(&handshakes).acquire_owned();
                    let stopped = stopped.clone();
                    held.push((
                        index,
                        tokio::spawn(async move { holder.run(permit.await.ok(), stopped).await }),
                    ));
                }
                next += more;
                let opened = (next - first) as u64;
                let deadline = Instant::now() + OPEN_PATIENCE;
                loop {
                    if tally.first_ready.load(Ordering::Relaxed) >= opened {
                        break format!("ready {more}");
                    }
                    if tally.failed_before_ready() > 0 || Instant::now() > deadline {
                        break format!(
                            "error {} of {opened} streams ready; {}",
                            tally.first_ready.load(Ordering::Relaxed),
                            tally.describe()
                        );
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            (Some("count"), None) => {
                format!("count {}", tally.received.load(Ordering::Relaxed))
            }
            (Some("status"), None) => format!(
                "status {} {} {} {} {} {}",
                tally.streaming.load(Ordering::Relaxed),
                tally.refused.load(Ordering::Relaxed),
                tally.broken.load(Ordering::Relaxed),
                tally.refused_408.load(Ordering::Relaxed),
                tally.refused_429.load(Ordering::Relaxed),
                tally.refused_5xx.load(Ordering::Relaxed)
            ),
            (Some("finish"), Some(file)) => {
                let commits = read_commits(Path::new(file))?;
                let mut check = Check::new(&commits, scopes, relays.len());
                let _ = stop.send(true);
                for (index, task) in held.drain(..) {
                    let outcome = task
                        .await
                        .map_err(|error| format!("a stream's task failed: {error}"));
                    check.stream(index, outcome, &log);
                }
                let bytes: Vec<u8> = check
                    .latencies
                    .iter()
                    .flat_map(|latency| latency.to_le_bytes())
                    .collect();
                std::fs::write(latency_file, bytes)?;
                let per_relay: Vec<String> =
                    check.per_relay.iter().map(ToString::to_string).collect();
                let answer = format!(
                    "done {} {} {} {} {} {} {}",
                    check.delivered,
                    check.missing,
                    check.streams_short,
                    check.unexpected,
                    check.last_receipt,
                    per_relay.join(","),
                    check.repeated
                );
                output.write_all(format!("{answer}\n").as_bytes()).await?;
                output.flush().await?;
                return Ok(());
            }
            _ => format!("error unknown command {line:?}"),
        };
        output.write_all(format!("{answer}\n").as_bytes()).await?;
        output.flush().await?;
    }
    Ok(())
}

/// Longest wait for the streams of one `open` to be ready.
const OPEN_PATIENCE: Duration = Duration::from_secs(120);
/// How long a stream waits before retrying while nothing listens.
const RETRY_WHILE_DOWN: Duration = Duration::from_millis(50);

/// What a child's streams did, all together.
#[derive(Default)]
struct Tally {
    /// Streams that were ready at least once.
    first_ready: AtomicU64,
    /// Streams streaming now.
    streaming: AtomicU64,
    /// Frames with an event number received.
    received: AtomicU64,
    /// Answers other than 200.
    refused: AtomicU64,
    refused_408: AtomicU64,
    refused_429: AtomicU64,
    refused_5xx: AtomicU64,
    /// Connections that failed after the TCP connect (reset, or closed
    /// before `ready`), or connects that failed other than refused.
    broken: AtomicU64,
}

impl Tally {
    fn failed_before_ready(&self) -> u64 {
        self.refused.load(Ordering::Relaxed) + self.broken.load(Ordering::Relaxed)
    }

    fn describe(&self) -> String {
        format!(
            "{} refused, {} broken",
            self.refused.load(Ordering::Relaxed),
            self.broken.load(Ordering::Relaxed)
        )
    }
}

/// One stream, reconnecting until told to stop.
struct Holder {
    target: StreamTarget,
    tally: Arc<Tally>,
    log: Arc<CommitLog>,
    reconnect_delay: Duration,
}

/// How one connection attempt ended.
enum Ended {
    Stopped,
    /// The server ended the stream, or nothing listened: reconnect.
    Again,
    /// A status other than 200, or a connection broken after the connect.
    Failed,
}

impl Holder {
    async fn run(
        mut self,
        mut handshake: Option<OwnedSemaphorePermit>,
        mut stopped: watch::Receiver<bool>,
    ) -> Vec<Receipt> {
        let mut receipts = Vec::new();
        let mut ready_once = false;
        while !*stopped.borrow() {
            let ended = self
                .attempt(&mut receipts, &mut ready_once, &mut handshake, &mut stopped)
                .await;
            match ended {
                Ended::Stopped => break,
                Ended::Again | Ended::Failed => {
                    tokio::select! {
                        _ = stopped.changed() => break,
                        () = tokio::time::sleep(self.reconnect_delay) => {}
                    }
                }
            }
        }
        receipts
    }

    async fn attempt(
        &mut self,
        receipts: &mut Vec<Receipt>,
        ready_once: &mut bool,
        handshake: &mut Option<OwnedSemaphorePermit>,
        stopped: &mut watch::Receiver<bool>,
    ) -> Ended {
        let target = &self.target;
        let mut stream = match connect_from(target.source, target.address).await {
            Ok(stream) => stream,
            Err(error) if error.kind() == std::io::ErrorKind::ConnectionRefused => {
                return Ended::Again;
            }
            Err(_) => {
                self.tally.broken.fetch_add(1, Ordering::Relaxed);
                return Ended::Failed;
            }
        };
        stream.set_nodelay(true).ok();
        let request = request_head(
            target.address,
            &target.path,
            target.authorization.as_deref(),
            target.last_event_id,
        );
        if stream.write_all(request.as_bytes()).await.is_err() {
            self.tally.broken.fetch_add(1, Ordering::Relaxed);
            return Ended::Failed;
        }
        let mut parser = FrameParser::new(ReadyWhen::ReadyEvent);
        let mut streaming = false;
        let mut buffer = vec![0u8; 4 * 1024];
        let ended = loop {
            let read = tokio::select! {
                _ = stopped.changed() => break Ended::Stopped,
                read = stream.read(&mut buffer) => read,
            };
            let read = match read {
                Ok(0) if streaming => break Ended::Again,
                Ok(0) | Err(_) => {
                    self.tally.broken.fetch_add(1, Ordering::Relaxed);
                    break Ended::Failed;
                }
                Ok(read) => read,
            };
            let before = receipts.len();
            let became_ready = parser.feed(&buffer[..read], self.log.now(), receipts);
            self.tally
                .received
                .fetch_add((receipts.len() - before) as u64, Ordering::Relaxed);
            if let Some(id) = parser.last_id {
                self.target.last_event_id = Some(id);
            }
            match became_ready {
                Err(_) => {
                    self.tally.refused.fetch_add(1, Ordering::Relaxed);
                    let by_status = match parser.status {
                        Some(408) => Some(&self.tally.refused_408),
                        Some(429) => Some(&self.tally.refused_429),
                        Some(500..=599) => Some(&self.tally.refused_5xx),
                        _ => None,
                    };
                    if let Some(counter) = by_status {
                        counter.fetch_add(1, Ordering::Relaxed);
                    }
                    break Ended::Failed;
                }
                Ok(true) => {
                    streaming = true;
                    self.tally.streaming.fetch_add(1, Ordering::Relaxed);
                    if !std::mem::replace(ready_once, true) {
                        handshake.take();
                        self.tally.first_ready.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Ok(false) => {}
            }
            if parser.ended {
                if streaming {
                    break Ended::Again;
                }
                self.tally.broken.fetch_add(1, Ordering::Relaxed);
                break Ended::Failed;
            }
        };
        if streaming {
            self.tally.streaming.fetch_sub(1, Ordering::Relaxed);
        }
        ended
    }
}

/// Commit times by event number, from the parent's file.
fn read_commits(path: &Path) -> BenchResult<Vec<Option<u64>>> {
    let text = std::fs::read_to_string(path)?;
    let mut commits = Vec::new();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        let (Some(number), Some(at)) = (words.next(), words.next()) else {
            continue;
        };
        let number: usize = number.parse()?;
        if commits.len() <= number {
            commits.resize(number + 1, None);
        }
        commits[number] = Some(at.parse()?);
    }
    Ok(commits)
}

/// Each stream's receipts against the events committed into its scope.
struct Check<'a> {
    commits: &'a [Option<u64>],
    scopes: usize,
    relays: usize,
    delivered: u64,
    missing: u64,
    streams_short: u64,
    unexpected: u64,
    /// Events received again: a stream that reconnects is replayed
    /// `sse.replay_lookback` seqs before its `Last-Event-ID`.
    repeated: u64,
    last_receipt: u64,
    per_relay: Vec<u64>,
    latencies: Vec<u64>,
}

impl<'a> Check<'a> {
    fn new(commits: &'a [Option<u64>], scopes: usize, relays: usize) -> Self {
        Check {
            commits,
            scopes,
            relays,
            delivered: 0,
            missing: 0,
            streams_short: 0,
            unexpected: 0,
            repeated: 0,
            last_receipt: 0,
            per_relay: vec![0; relays],
            latencies: Vec::new(),
        }
    }

    fn stream(&mut self, index: usize, outcome: Result<Vec<Receipt>, String>, log: &CommitLog) {
        let (relay, scope) = placement(index, self.relays, self.scopes);
        let expected = self
            .commits
            .iter()
            .enumerate()
            .filter(|(number, at)| at.is_some() && number % self.scopes == scope)
            .count() as u64;
        let Ok(receipts) = outcome else {
            self.missing += expected;
            self.streams_short += 1;
            return;
        };
        let mut seen = HashSet::new();
        for receipt in &receipts {
            let number = receipt.number as usize;
            let committed = self.commits.get(number).copied().flatten();
            match committed {
                Some(_) if number % self.scopes == scope && seen.contains(&number) => {
                    self.repeated += 1;
                }
                Some(at) if number % self.scopes == scope && seen.insert(number) => {
                    let arrived = log.to_monotonic(receipt.at);
                    self.latencies.push(arrived.saturating_sub(at));
                    self.last_receipt = self.last_receipt.max(arrived);
                    self.delivered += 1;
                    self.per_relay[relay] += 1;
                }
                _ => self.unexpected += 1,
            }
        }
        let short = expected.saturating_sub(seen.len() as u64);
        self.missing += short;
        if short > 0 {
            self.streams_short += 1;
        }
    }
}

/// Raises this process's soft open-file limit to its hard limit: each
/// stream is a socket.
fn raise_file_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write one rlimit through
    // valid pointers.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

/// The loopback addresses streams connect from, so that tens of thousands
/// of them stay within each source's ephemeral port range.
fn stream_sources() -> Vec<std::net::IpAddr> {
    (2..=9)
        .map(|last| std::net::IpAddr::from([127, 0, 0, last]))
        .collect()
}

/// Idle streams on one relay in steps up to 19,000 (under the machine's
/// 20,000 open files), then one event per second into each of 10 scopes.
pub async fn rows(cx: &Context, table: &mut Table) -> BenchResult<()> {
    let (steps, settle, duration) = if cx.args.quick {
        (
            vec![500, 1_000, 1_900],
            Duration::from_secs(1),
            Duration::from_secs(5),
        )
    } else {
        (
            vec![5_000, 10_000, 19_000],
            Duration::from_secs(5),
            Duration::from_secs(30),
        )
    };
    let total = steps.last().copied().unwrap_or(0);
    let relay = cx.start_relay(cx.settings()).await?;
    let plan = StreamsPlan {
        steps,
        settle,
        scopes: 10,
        scope_prefix: "streams".to_owned(),
        rate_per_scope: 1.0,
        duration,
        per_child: 9_500,
        sources: stream_sources(),
        // Nothing restarts here: a stream that ended would be a failure.
        reconnect_delay: Duration::from_millis(50),
    };
    eprintln!("streams: {total} on one relay");
    let bench_bin = std::env::current_exe()?;
    let f = run(
        &plan,
        &mut [relay],
        None,
        &bench_bin,
        &cx.args.work_dir,
        &cx.emit_source(),
    )
    .await?;
    let per = |streams: usize| {
        f.steps
            .iter()
            .find(|step| step.streams == streams)
            .map_or(0.0, |step| step.rss_per_stream)
    };
    let readings: Vec<String> = f
        .steps
        .iter()
        .map(|step| format!("{} at {}", size(step.rss_per_stream), step.streams))
        .collect();
    let middle = f
        .steps
        .get(f.steps.len().saturating_sub(2))
        .map_or(0, |s| s.streams);
    let (at_middle, at_total) = (per(middle), per(total));
    let flat = at_total <= at_middle * 1.1;
    table.add(
        format!(
            "streams: RSS per idle stream, one relay, {} s after each step",
            settle.as_secs()
        ),
        readings.join(" · "),
        format!(
            "≤ 14 KiB at {middle}: {} · {total} within 10% of {middle}: {}",
            verdict(at_middle <= 14.0 * 1024.0),
            verdict(flat)
        ),
    );
    table.add(
        format!("streams: connect {total} (raw HTTP/1.1, 8 source addresses)"),
        format!(
            "{:.0} streams/s ({total} in {:.1} s of connecting, {} client processes × 200 handshakes in flight)",
            f.connect_rate(),
            f.connect_time.as_secs_f64(),
            f.children
        ),
        "–",
    );
    let all = f.missing == 0 && f.unexpected == 0 && f.delivered == f.expected && f.expected > 0;
    table.add(
        format!(
            "streams: {total} streams, 1 ev/s into each of 10 scopes for {} s, emit (commit-to-receive)",
            duration.as_secs()
        ),
        format!(
            "{:.0} deliveries/s · p50 {} · p99 {} · max {} · delivered {} of {} ({} missing in {} streams, {} unexpected, {} repeated) · relay CPU {:.3} s per 1,000 deliveries · relay RSS {}",
            f.deliveries_per_second,
            ms(f.latency.p50),
            ms(f.latency.p99),
            ms(f.latency.max),
            f.delivered,
            f.expected,
            f.missing,
            f.streams_short,
            f.unexpected,
            f.repeated,
            f.cpu_seconds_per_1000,
            size(f.rss_after.iter().sum::<u64>() as f64)
        ),
        if all {
            format!("every delivery made: {}", verdict(true))
        } else {
            format!("every delivery made: {} (deliveries missing)", verdict(false))
        },
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_spread_over_relays_then_scopes() {
        assert_eq!(placement(0, 1, 10), (0, 0));
        assert_eq!(placement(13, 1, 10), (0, 3));
        // Six relays: consecutive streams go to consecutive relays, and
        // each relay's streams cover every scope.
        let scopes_on_relay_2: HashSet<usize> = (0..120)
            .map(|index| placement(index, 6, 10))
            .filter(|(relay, _)| *relay == 2)
            .map(|(_, scope)| scope)
            .collect();
        assert_eq!(scopes_on_relay_2.len(), 10);
    }

    #[test]
    fn a_stream_short_of_an_event_is_counted() {
        let log = CommitLog::new(0);
        let origin = log.to_monotonic(0);
        let commits = vec![Some(origin), Some(origin), Some(origin), Some(origin)];
        let mut check = Check::new(&commits, 2, 1);
        let receipt = |number: u32| crate::clock::Receipt { number, at: 1_000 };
        // Scope 0 expects events 0 and 2; scope 1 expects 1 and 3.
        check.stream(0, Ok(vec![receipt(0), receipt(2)]), &log);
        check.stream(1, Ok(vec![receipt(1), receipt(1), receipt(2)]), &log);
        check.stream(2, Err("refused".to_owned()), &log);
        assert_eq!(check.delivered, 3);
        assert_eq!(check.missing, 1 + 2);
        assert_eq!(check.streams_short, 2);
        assert_eq!(check.repeated, 1, "received again after a reconnect");
        assert_eq!(check.unexpected, 1, "another scope's event");
        assert_eq!(check.latencies, [1_000, 1_000, 1_000]);
    }
}
