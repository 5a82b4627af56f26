//! Reconnect storms. N subscribers stream with a `Last-Event-ID` while
//! durable events are emitted; the relay is stopped with SIGTERM, as a
//! deploy does, and a new process is started on the same port. Each
//! subscriber behaves like a browser's `EventSource` without its retry
//! delay: when its stream ends it reconnects at once, resuming from the last
//! id it saw, and while nothing listens it retries every 50 ms.
//!
//! Counted per phase: refusals by status (408, 5xx, others), connections
//! the server reset, connect time (from an attempt's TCP connect to the
//! stream's `ready` frame) and how long until all N stream again. After the
//! restart every subscriber must have every event emitted into its scope.
//! Then further waves of N arrive, each while the previous one hangs up,
//! and the relay's RSS is read with each wave streaming and after the last
//! one left.

use crate::context::Context;
use crate::report::{Table, ms, size, verdict};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::clock::{CommitLog, Percentiles};
use crate::proc_stats;
use crate::publish::{Pace, Source, publish_for};
use crate::relay_process::{RelayProcess, RelaySettings};
use crate::sse_load::{FrameParser, ReadyWhen, request_head};
use crate::{BenchResult, subscriber_token};

/// `errno` for a process out of file descriptors (Linux).
const EMFILE: i32 = 24;
/// How long a subscriber waits before retrying while nothing listens.
const RETRY_WHILE_DOWN: Duration = Duration::from_millis(50);
/// How long after the last connection left the relay's memory is read
/// again: past the interval at which it returns freed memory.
const SETTLE: Duration = Duration::from_secs(5);

/// How long a subscriber waits after a refusal (a status other than 200).
const RETRY_AFTER_REFUSAL: Duration = Duration::from_millis(250);
/// Longest wait for all subscribers to stream, or for every event to arrive.
const PATIENCE: Duration = Duration::from_secs(120);

/// What to run.
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
    /// Waves of N arriving after the restart storm, each while the
    /// previous wave hangs up.
    pub extra_waves: usize,
}

/// What went wrong, and how fast it went right, in one phase.
#[derive(Default)]
struct Tally {
    timeouts: AtomicU64,
    server_errors: AtomicU64,
    other_refusals: AtomicU64,
    resets: AtomicU64,
    refused_while_down: AtomicU64,
    out_of_descriptors: AtomicU64,
    streams_opened: AtomicU64,
    connect_nanos: Mutex<Vec<u64>>,
    reset_reasons: Mutex<BTreeMap<String, u64>>,
}

/// One phase's figures.
#[derive(Debug, Clone)]
pub struct PhaseFigures {
    /// From the phase's start until all N subscribers streamed; `None`
    /// when they did not within the patience.
    pub all_streaming_after: Option<Duration>,
    /// Connect time of the streams opened in the phase.
    pub connect: Percentiles,
    pub streams_opened: u64,
    /// 408 answers.
    pub timeouts: u64,
    /// 5xx answers.
    pub server_errors: u64,
    /// Other statuses than 200.
    pub other_refusals: u64,
    /// Connections reset by the server, or failing any other way after
    /// the TCP connect.
    pub resets: u64,
    /// How the resets happened.
    pub reset_reasons: BTreeMap<String, u64>,
    /// Connection attempts refused while no relay listened.
    pub refused_while_down: u64,
    /// Connection attempts the load tool could not make for want of a
    /// file descriptor, retried 50 ms later.
    pub out_of_descriptors: u64,
}

impl PhaseFigures {
    /// Every subscriber streams and nothing was refused or reset.
    pub fn clean(&self) -> bool {
        self.all_streaming_after.is_some()
            && self.timeouts == 0
            && self.server_errors == 0
            && self.other_refusals == 0
            && self.resets == 0
    }

    fn of(tally: &Tally, all_streaming_after: Option<Duration>) -> PhaseFigures {
        let mut samples = tally
            .connect_nanos
            .lock()
            .map(|samples| samples.clone())
            .unwrap_or_default();
        PhaseFigures {
            all_streaming_after,
            connect: Percentiles::of(&mut samples),
            streams_opened: tally.streams_opened.load(Ordering::Relaxed),
            timeouts: tally.timeouts.load(Ordering::Relaxed),
            server_errors: tally.server_errors.load(Ordering::Relaxed),
            other_refusals: tally.other_refusals.load(Ordering::Relaxed),
            resets: tally.resets.load(Ordering::Relaxed),
            reset_reasons: tally
                .reset_reasons
                .lock()
                .map(|reasons| reasons.clone())
                .unwrap_or_default(),
            refused_while_down: tally.refused_while_down.load(Ordering::Relaxed),
            out_of_descriptors: tally.out_of_descriptors.load(Ordering::Relaxed),
        }
    }
}

/// The whole storm's figures.
#[derive(Debug, Clone)]
pub struct StormFigures {
    /// The subscribers' first connect, to an idle relay.
    pub first: PhaseFigures,
    /// From SIGTERM to the old process's exit.
    pub stopped_in: Duration,
    /// From starting the new process until all N streamed again.
    pub restart: PhaseFigures,
    pub emitted: usize,
    /// (subscriber, event) pairs emitted into a subscriber's scope that it
    /// never received.
    pub missed: u64,
    /// Each further wave, connecting while the previous one hangs up.
    pub waves: Vec<PhaseFigures>,
    /// Relay RSS before the first subscriber connected, in KiB.
    pub rss_before_kib: u64,
    /// Relay RSS with all N of each wave streaming (the restart storm's
    /// first), in KiB.
    pub rss_streaming_kib: Vec<u64>,
    /// Relay RSS after the last wave hung up and its connections were
    /// released, in KiB.
    pub rss_after_kib: u64,
    /// The same, a few seconds later: long enough for the relay to hand
    /// the freed memory back to the system.
    pub rss_settled_kib: u64,
}

/// State every subscriber of a wave shares.
struct Wave {
    tally: Mutex<Arc<Tally>>,
    streaming: AtomicUsize,
    /// Distinct numbered events received, by all subscribers together.
    received: AtomicU64,
    stop: watch::Sender<bool>,
    tasks: Mutex<Vec<JoinHandle<Vec<bool>>>>,
}

impl Wave {
    fn new() -> Arc<Wave> {
        Arc::new(Wave {
            tally: Mutex::new(Arc::new(Tally::default())),
            streaming: AtomicUsize::new(0),
            received: AtomicU64::new(0),
            stop: watch::Sender::new(false),
            tasks: Mutex::new(Vec::new()),
        })
    }

    fn tally(&self) -> Arc<Tally> {
        self.tally
            .lock()
            .map(|tally| Arc::clone(&tally))
            .unwrap_or_default()
    }

    /// Starts counting into a fresh tally; answers it.
    fn next_phase(&self) -> Arc<Tally> {
        let fresh = Arc::new(Tally::default());
        if let Ok(mut tally) = self.tally.lock() {
            *tally = Arc::clone(&fresh);
        }
        fresh
    }

    /// Starts `count` subscribers over `scopes` scopes, resuming after
    /// `last_event_id` when given.
    fn open(
        self: &Arc<Self>,
        address: SocketAddr,
        name: &str,
        count: usize,
        scopes: usize,
        last_event_id: Option<i64>,
    ) {
        let mut tasks = Vec::with_capacity(count);
        for index in 0..count {
            let scope = scope_name(index % scopes);
            let subscriber = Subscriber {
                address,
                authorization: format!(
                    "Bearer {}",
                    subscriber_token(&format!("{name}-{index}"), &scope)
                ),
                last_event_id,
                received: Vec::new(),
            };
            tasks.push(tokio::spawn(subscriber.run(Arc::clone(self))));
        }
        if let Ok(mut all) = self.tasks.lock() {
            all.extend(tasks);
        }
    }

    /// Waits until `count` subscribers stream and `since`'s tally saw at
    /// least `count` streams open; answers how long that took from `from`.
    async fn all_streaming(&self, count: usize, tally: &Tally, from: Instant) -> Option<Duration> {
        let deadline = from + PATIENCE;
        while self.streaming.load(Ordering::Relaxed) < count
            || tally.streams_opened.load(Ordering::Relaxed) < count as u64
        {
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Some(from.elapsed())
    }

    /// Tells every subscriber to hang up, without waiting for them.
    fn begin_hang_up(&self) {
        self.stop.send_replace(true);
    }

    /// Tells every subscriber to hang up and answers what each received.
    async fn hang_up(&self) -> Vec<Vec<bool>> {
        self.begin_hang_up();
        let tasks = self
            .tasks
            .lock()
            .map(|mut tasks| std::mem::take(&mut *tasks))
            .unwrap_or_default();
        let mut received = Vec::with_capacity(tasks.len());
        for task in tasks {
            received.push(task.await.unwrap_or_default());
        }
        received
    }
}

fn scope_name(index: usize) -> String {
    format!("storm-{index}")
}

/// How one connection attempt ended.
enum Ended {
    /// The server ended the stream (its closing chunk, or a clean close).
    ByServer,
    /// The wave was told to hang up.
    Stopped,
    /// Nothing listened.
    Down,
    /// This process had no descriptor left for another socket (the previous
    /// wave's are still being closed): the load tool's limit, not the
    /// relay's doing.
    NoDescriptor,
    /// A status other than 200.
    Refused(u16),
    /// Reset, or failed in another way after the connect; says how.
    Broken(String),
}

/// One reconnecting subscriber.
struct Subscriber {
    address: SocketAddr,
    authorization: String,
    last_event_id: Option<i64>,
    /// Which event numbers arrived.
    received: Vec<bool>,
}

impl Subscriber {
    async fn run(mut self, wave: Arc<Wave>) -> Vec<bool> {
        let mut stop = wave.stop.subscribe();
        while !*stop.borrow() {
            let tally = wave.tally();
            match self.attempt(&wave, &tally, &mut stop).await {
                Ended::ByServer => {}
                Ended::Stopped => break,
                Ended::Down => {
                    tally.refused_while_down.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(RETRY_WHILE_DOWN).await;
                }
                Ended::NoDescriptor => {
                    tally.out_of_descriptors.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(RETRY_WHILE_DOWN).await;
                }
                Ended::Refused(status) => {
                    let counter = match status {
                        408 => &tally.timeouts,
                        500..=599 => &tally.server_errors,
                        _ => &tally.other_refusals,
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(RETRY_AFTER_REFUSAL).await;
                }
                Ended::Broken(how) => {
                    tally.resets.fetch_add(1, Ordering::Relaxed);
                    if let Ok(mut reasons) = tally.reset_reasons.lock() {
                        *reasons.entry(how).or_default() += 1;
                    }
                    tokio::time::sleep(RETRY_WHILE_DOWN).await;
                }
            }
        }
        self.received
    }

    async fn attempt(
        &mut self,
        wave: &Wave,
        tally: &Tally,
        stop: &mut watch::Receiver<bool>,
    ) -> Ended {
        let started = Instant::now();
        let mut stream = match TcpStream::connect(self.address).await {
            Ok(stream) => stream,
            Err(error) if error.kind() == std::io::ErrorKind::ConnectionRefused => {
                return Ended::Down;
            }
            Err(error) if error.raw_os_error() == Some(EMFILE) => return Ended::NoDescriptor,
            Err(error) => return Ended::Broken(format!("connect: {}", error.kind())),
        };
        stream.set_nodelay(true).ok();
        let request = request_head(
            self.address,
            "/v1/events",
            Some(&self.authorization),
            self.last_event_id,
        );
        if stream.write_all(request.as_bytes()).await.is_err() {
            return Ended::Broken("sending the request".to_owned());
        }
        let mut parser = FrameParser::new(ReadyWhen::ReadyEvent);
        let mut streaming = false;
        let mut receipts = Vec::new();
        let mut buffer = vec![0u8; 8 * 1024];
        let ended = loop {
            let read = tokio::select! {
                _ = stop.changed() => break Ended::Stopped,
                read = stream.read(&mut buffer) => read,
            };
            let read = match read {
                Ok(0) if streaming => break Ended::ByServer,
                Ok(0) => break Ended::Broken("closed before ready".to_owned()),
                Err(error) => {
                    let phase = if streaming {
                        "streaming"
                    } else {
                        "before ready"
                    };
                    break Ended::Broken(format!("read {phase}: {}", error.kind()));
                }
                Ok(read) => read,
            };
            let became_ready = parser.feed(&buffer[..read], 0, &mut receipts);
            if let Some(id) = parser.last_id {
                self.last_event_id = Some(id);
            }
            for receipt in receipts.drain(..) {
                let number = receipt.number as usize;
                if self.received.len() <= number {
                    self.received.resize(number + 1, false);
                }
                if !std::mem::replace(&mut self.received[number], true) {
                    wave.received.fetch_add(1, Ordering::Relaxed);
                }
            }
            match became_ready {
                Err(_) => break Ended::Refused(parser.status.unwrap_or(0)),
                Ok(true) => {
                    streaming = true;
                    wave.streaming.fetch_add(1, Ordering::Relaxed);
                    tally.streams_opened.fetch_add(1, Ordering::Relaxed);
                    if let Ok(mut samples) = tally.connect_nanos.lock() {
                        samples.push(started.elapsed().as_nanos() as u64);
                    }
                }
                Ok(false) => {}
            }
            if parser.ended {
                break if streaming {
                    Ended::ByServer
                } else {
                    Ended::Broken("ended before ready".to_owned())
                };
            }
        };
        if streaming {
            wave.streaming.fetch_sub(1, Ordering::Relaxed);
        }
        ended
    }
}

/// Runs the storm against relay processes started from `binary`.
pub async fn run(
    plan: &StormPlan,
    binary: &Path,
    work_dir: &Path,
    settings: &RelaySettings,
) -> BenchResult<StormFigures> {
    let n = plan.subscribers;
    let mut relay = RelayProcess::start(binary, work_dir, settings).await?;
    let address = relay.address();
    let rss_before_kib = rss_kib(&relay);
    let start_after = max_seq(settings).await?;

    // The storm wave streams, resuming from the current end of the outbox.
    let storm = Wave::new();
    let first_tally = storm.tally();
    let connecting = Instant::now();
    storm.open(address, "storm", n, plan.scopes, Some(start_after));
    let first_after = storm.all_streaming(n, &first_tally, connecting).await;
    let first = PhaseFigures::of(&first_tally, first_after);
    if first_after.is_none() {
        storm.hang_up().await;
        return Err(format!(
            "only {} of {n} subscribers streamed",
            storm.streaming.load(Ordering::Relaxed)
        )
        .into());
    }

    // Events flow through the stop and the restart.
    let log = CommitLog::new(1_000_000);
    let source = Source::Emit {
        database_url: settings.database_url.clone(),
        schema: settings.schema.clone(),
    };
    let scopes = plan.scopes;
    let emitter = {
        let (pace, emitting, log) = (
            Pace::PerSecond(plan.events_per_sec),
            plan.emitting,
            Arc::clone(&log),
        );
        tokio::spawn(async move {
            publish_for(
                &source,
                Arc::new(move |number| scope_name(number % scopes)),
                pace,
                emitting,
                1,
                log,
            )
            .await
        })
    };
    tokio::time::sleep(plan.emitting / 3).await;
    let restart_tally = storm.next_phase();
    let stopped_in = relay.terminate(Duration::from_secs(30)).await?;
    let restarting = Instant::now();
    relay = RelayProcess::start_on(binary, work_dir, settings, address.port()).await?;
    let restart_after = storm.all_streaming(n, &restart_tally, restarting).await;
    let emitted = emitter.await??;

    // Every subscriber receives every event of its scope, replayed or live.
    let expected: u64 = (0..n)
        .map(|index| {
            (0..emitted)
                .filter(|e| e % scopes == index % scopes)
                .count() as u64
        })
        .sum();
    let deadline = Instant::now() + PATIENCE;
    while storm.received.load(Ordering::Relaxed) < expected && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let restart = PhaseFigures::of(&restart_tally, restart_after);
    let mut rss_streaming_kib = vec![rss_kib(&relay)];

    // Further waves, each arriving while the previous one hangs up.
    let mut leaving = storm;
    let mut waves = Vec::new();
    let mut storm_received = None;
    for number in 0..plan.extra_waves {
        let wave = Wave::new();
        let tally = wave.tally();
        // The previous wave's clients close their sockets as the new one
        // connects; the relay notices each close within its peek interval.
        leaving.begin_hang_up();
        let arriving = Instant::now();
        wave.open(address, &format!("wave{number}"), n, plan.scopes, None);
        let received = leaving.hang_up().await;
        storm_received.get_or_insert(received);
        let after = wave.all_streaming(n, &tally, arriving).await;
        waves.push(PhaseFigures::of(&tally, after));
        rss_streaming_kib.push(rss_kib(&relay));
        leaving = wave;
    }
    let received = leaving.hang_up().await;
    let storm_received = storm_received.unwrap_or(received);
    let missed = storm_received
        .iter()
        .enumerate()
        .map(|(index, got)| {
            (0..emitted)
                .filter(|e| e % scopes == index % scopes)
                .filter(|e| !got.get(*e).copied().unwrap_or(false))
                .count() as u64
        })
        .sum();

    let deadline = Instant::now() + PATIENCE;
    while relay.metric("sse_connections").await > 0.0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let rss_after_kib = rss_kib(&relay);
    tokio::time::sleep(SETTLE).await;
    let rss_settled_kib = rss_kib(&relay);
    Ok(StormFigures {
        first,
        stopped_in,
        restart,
        emitted,
        missed,
        waves,
        rss_before_kib,
        rss_streaming_kib,
        rss_after_kib,
        rss_settled_kib,
    })
}

fn rss_kib(relay: &RelayProcess) -> u64 {
    proc_stats::rss_bytes(&[relay.pid()]) / 1024
}

/// The outbox's highest seq now: the storm's subscribers resume after it.
async fn max_seq(settings: &RelaySettings) -> BenchResult<i64> {
    let client = eventrelay::connect(&settings.database_url).await?;
    let row = client
        .query_one(
            &format!(
                "SELECT coalesce(max(seq), 0) FROM {}.outbox",
                settings.schema
            ),
            &[],
        )
        .await?;
    Ok(row.get(0))
}
/// Reconnect storms: the large fan-out's subscriber count riding out a
/// SIGTERM restart, then two more waves, each arriving while the previous
/// one hangs up.
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
    let f = run(&plan, &cx.args.relay_bin, &cx.args.work_dir, &settings).await?;
    let phase = |p: &PhaseFigures| {
        format!(
            "{} · connect p50 {} · p99 {} · 408: {} · 5xx: {} · other refusals: {} · resets: {}{}",
            p.all_streaming_after.map_or_else(
                || format!("not all {n} streaming"),
                |d| format!("all {n} streaming after {:.2} s", d.as_secs_f64())
            ),
            ms(p.connect.p50),
            ms(p.connect.p99),
            p.timeouts,
            p.server_errors,
            p.other_refusals,
            p.resets,
            if p.reset_reasons.is_empty() {
                String::new()
            } else {
                format!(" ({:?})", p.reset_reasons)
            }
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
