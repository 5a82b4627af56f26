//! The client processes holding the streams of the `streams`, `box` and
//! `storm` scenarios: the hidden `stream-client` subcommand opens a share of
//! the subscribers from a loopback address of its own (a process holds at
//! most 20,000 files, an address about 28,000 ports), keeps them streaming
//! from `Last-Event-ID`, and answers stdin commands (`status`, `report`,
//! `phase`, `finish <emitted> <patience_ms>`) with JSON lines. Times are
//! `CLOCK_REALTIME` nanoseconds, the one clock parent and children share.

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};

use crate::report::Percentiles;
use crate::sse_load::{FrameParser, ReadyWhen, request_head};
use crate::{BenchResult, subscriber_token};

pub const SUBCOMMAND: &str = "stream-client";
const EMFILE: i32 = 24;
const EADDRNOTAVAIL: i32 = 99;
/// How long a subscriber waits before retrying while nothing listens: a
/// browser's `EventSource` without its retry delay, the worst case.
const RETRY_WHILE_DOWN: Duration = Duration::from_millis(50);
const RETRY_AFTER_REFUSAL: Duration = Duration::from_millis(250);
const RETRY_INTERVAL: Duration = Duration::from_millis(3000);
const MAX_BACKOFF: Duration = Duration::from_secs(30);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reconnect {
    /// At once after a stream ends, every 50 ms while nothing listens,
    /// 250 ms after a refusal: the harshest a client can be.
    Immediate,
    /// As eventrelay's browser client (full jitter): a random wait up to the
    /// retry interval (3 s) after a stream ends; after failed attempts, up to
    /// that interval doubled per failure in a row, at most 30 s.
    Jittered,
}

impl Reconnect {
    /// The wait after a stream ended (`fixed` is `None`) or after the
    /// `failures`-th failed attempt in a row (`fixed`: the immediate wait).
    fn wait(self, failures: u32, fixed: Option<Duration>) -> Duration {
        let doubled = RETRY_INTERVAL.saturating_mul(1 << failures.saturating_sub(1).min(16));
        match (self, fixed) {
            (Reconnect::Immediate, fixed) => fixed.unwrap_or_default(),
            (Reconnect::Jittered, None) => RETRY_INTERVAL.mul_f64(fastrand::f64()),
            (Reconnect::Jittered, Some(_)) => doubled.min(MAX_BACKOFF).mul_f64(fastrand::f64()),
        }
    }
}
/// One read buffer for the whole process (each process runs one thread):
/// 100,000 streams with a buffer each would cost the load gigabytes.
const READ_BUFFER: usize = 64 * 1024;

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ClientSpec {
    /// Which client this is (0-based): names its receipts file and picks its
    /// source address, 127.0.0.2–9 in turn.
    pub index: usize,
    pub relay_ports: Vec<u16>,
    /// The global indexes of its streams: stream `g` goes to relay
    /// `g % relays` and scope `(g / relays) % scopes`.
    pub streams: Range<usize>,
    pub scopes: usize,
    pub scope_prefix: String,
    pub last_event_id: Option<i64>,
    pub connect_concurrency: usize,
    pub reconnect: Reconnect,
    pub work_dir: PathBuf,
}

impl ClientSpec {
    fn receipts_path(&self) -> PathBuf {
        self.work_dir
            .join(format!("stream-client-{}.receipts", self.index))
    }

    pub fn spawn(&self, binary: &Path, processes: usize) -> BenchResult<Vec<ClientProcess>> {
        let per_client = self.streams.len().div_ceil(processes).max(1);
        let shares = self.streams.clone().step_by(per_client).enumerate();
        shares
            .map(|(i, first)| {
                let spec = ClientSpec {
                    index: self.index + i,
                    streams: first..self.streams.end.min(first + per_client),
                    ..self.clone()
                };
                ClientProcess::spawn(binary, &spec)
            })
            .collect()
    }
}

pub fn placement(global: usize, relays: usize, scopes: usize) -> (usize, usize) {
    (global % relays, (global / relays) % scopes)
}

pub fn scope_name(prefix: &str, index: usize) -> String {
    format!("{prefix}-{index}")
}

/// Nanoseconds since the epoch on `CLOCK_REALTIME`, which all processes share.
pub fn realtime_ns() -> u64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH);
    since.map_or(0, |elapsed| elapsed.as_nanos() as u64)
}

struct Shared {
    relays: usize,
    /// Each phase's counters, the last current; the parent sums processes'.
    phases: Mutex<Vec<PhaseFigures>>,
    arrivals: Mutex<Vec<Arrival>>,
    timing: AtomicBool,
    streaming: AtomicUsize,
    received: AtomicU64,
    stop: watch::Sender<bool>,
    reconnect: Reconnect,
}

impl Shared {
    fn phases(&self) -> MutexGuard<'_, Vec<PhaseFigures>> {
        self.phases.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn arrivals(&self) -> MutexGuard<'_, Vec<Arrival>> {
        self.arrivals.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn phase(&self) -> usize {
        self.phases().len().saturating_sub(1)
    }

    fn count(&self, phase: usize, update: impl FnOnce(&mut PhaseFigures)) {
        if let Some(figures) = self.phases().get_mut(phase) {
            update(figures);
        }
    }

    fn next_phase(&self) -> usize {
        let mut phases = self.phases();
        phases.push(PhaseFigures::new(self.relays));
        phases.len() - 1
    }
}

enum Ended {
    ByServer,
    Stopped,
    Down,
    NoDescriptor,
    NoPort,
    Refused(u16),
    Broken(String),
}

struct Stream {
    relay: usize,
    scope: usize,
    address: SocketAddr,
    source: IpAddr,
    authorization: String,
    last_event_id: Option<i64>,
    received: Vec<u64>,
}

thread_local! {
    static BUFFER: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(vec![0; READ_BUFFER]);
}

impl Stream {
    async fn run(
        mut self,
        shared: Arc<Shared>,
        mut permit: Option<OwnedSemaphorePermit>,
    ) -> Stream {
        let (mut stop, mut failures) = (shared.stop.subscribe(), 0);
        while !*stop.borrow() {
            let phase = shared.phase();
            let ended = self.attempt(&shared, phase, &mut stop, &mut permit).await;
            if matches!(ended, Ended::Stopped) {
                break;
            }
            let mut fixed = Some(RETRY_WHILE_DOWN);
            shared.count(phase, |t| match ended {
                Ended::ByServer | Ended::Stopped => fixed = None,
                Ended::Down => t.refused_while_down += 1,
                Ended::NoDescriptor => t.out_of_descriptors += 1,
                Ended::NoPort => t.out_of_ports += 1,
                Ended::Refused(status) => {
                    fixed = Some(RETRY_AFTER_REFUSAL);
                    *match status {
                        408 => &mut t.timeouts,
                        500..=599 => &mut t.server_errors,
                        _ => &mut t.other_refusals,
                    } += 1;
                }
                Ended::Broken(how) => {
                    t.resets += 1;
                    *t.reset_reasons.entry(how).or_default() += 1;
                }
            });
            failures = if fixed.is_some() { failures + 1 } else { 0 };
            let wait = shared.reconnect.wait(failures, fixed);
            if !wait.is_zero() {
                tokio::select! {
                    _ = stop.changed() => break,
                    _ = tokio::time::sleep(wait) => {}
                }
            }
        }
        self
    }

    async fn connect(&self) -> Result<TcpStream, Ended> {
        let socket = TcpSocket::new_v4().map_err(|error| match error.raw_os_error() {
            Some(EMFILE) => Ended::NoDescriptor,
            _ => Ended::Broken(format!("socket: {}", error.kind())),
        })?;
        socket
            .bind(SocketAddr::new(self.source, 0))
            .map_err(|error| match error.raw_os_error() {
                Some(EADDRNOTAVAIL) => Ended::NoPort,
                _ => Ended::Broken(format!("bind: {}", error.kind())),
            })?;
        socket
            .connect(self.address)
            .await
            .map_err(|error| match error.raw_os_error() {
                _ if error.kind() == std::io::ErrorKind::ConnectionRefused => Ended::Down,
                Some(EADDRNOTAVAIL) => Ended::NoPort,
                _ => Ended::Broken(format!("connect: {}", error.kind())),
            })
    }

    async fn attempt(
        &mut self,
        shared: &Shared,
        phase: usize,
        stop: &mut watch::Receiver<bool>,
        permit: &mut Option<OwnedSemaphorePermit>,
    ) -> Ended {
        let started = Instant::now();
        shared.count(phase, |t| {
            if t.first_attempt == 0 {
                t.first_attempt = realtime_ns();
            }
        });
        let mut stream = match self.connect().await {
            Ok(stream) => stream,
            Err(ended) => return ended,
        };
        let (authorization, last) = (Some(self.authorization.as_str()), self.last_event_id);
        let request = request_head(self.address, "/v1/events", authorization, last);
        if stream.write_all(request.as_bytes()).await.is_err() {
            return Ended::Broken("sending the request".to_owned());
        }
        let mut parser = FrameParser::new(ReadyWhen::ReadyEvent);
        let (mut streaming, mut receipts) = (false, Vec::new());
        let ended = loop {
            tokio::select! {
                _ = stop.changed() => break Ended::Stopped,
                readable = stream.readable() => {
                    if let Err(error) = readable {
                        break Ended::Broken(format!("readable: {}", error.kind()));
                    }
                }
            }
            // Drain what the socket holds through the process's one buffer.
            let mut became_ready = false;
            let outcome = BUFFER.with_borrow_mut(|buffer| {
                loop {
                    let live = streaming || became_ready;
                    let read = match stream.try_read(buffer) {
                        Ok(0) if live => return Some(Ended::ByServer),
                        Ok(0) => return Some(Ended::Broken("closed before ready".to_owned())),
                        Ok(read) => read,
                        Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {
                            return None;
                        }
                        Err(error) => {
                            let when = if live { "streaming" } else { "before ready" };
                            return Some(Ended::Broken(format!("read {when}: {}", error.kind())));
                        }
                    };
                    match parser.feed(&buffer[..read], realtime_ns(), &mut receipts) {
                        Ok(ready) => became_ready |= ready,
                        Err(_) => return Some(Ended::Refused(parser.status.unwrap_or(0))),
                    }
                    if parser.ended {
                        return None;
                    }
                }
            });
            if let Some(id) = parser.last_id {
                self.last_event_id = Some(id);
            }
            for receipt in receipts.drain(..) {
                let number = receipt.number as usize;
                let (word, bit) = (number / 64, 1u64 << (number % 64));
                if self.received.len() <= word {
                    self.received.resize(word + 1, 0);
                }
                if self.received[word] & bit == 0 {
                    self.received[word] |= bit;
                    shared.received.fetch_add(1, Ordering::Relaxed);
                    let (number, relay, at) = (receipt.number, self.relay as u32, receipt.at);
                    if shared.timing.load(Ordering::Relaxed) {
                        shared.arrivals().push(Arrival { number, relay, at });
                    }
                }
            }
            if became_ready {
                streaming = true;
                permit.take();
                shared.streaming.fetch_add(1, Ordering::Relaxed);
                shared.count(phase, |t| {
                    t.streams_opened += 1;
                    t.last_ready[self.relay] = t.last_ready[self.relay].max(realtime_ns());
                    let micros = started.elapsed().as_micros().min(u32::MAX as u128) as u32;
                    t.connect_micros.push(micros);
                });
            }
            if let Some(outcome) = outcome {
                break outcome;
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
            shared.streaming.fetch_sub(1, Ordering::Relaxed);
        }
        ended
    }

    fn missing(&self, emitted: usize, scopes: usize) -> u64 {
        (self.scope..emitted)
            .step_by(scopes)
            .filter(|number| {
                self.received
                    .get(number / 64)
                    .is_none_or(|word| word & (1 << (number % 64)) == 0)
            })
            .count() as u64
    }
}

fn say(value: &Value) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{value}");
    let _ = out.flush();
}

pub fn main(args: &[String]) -> BenchResult<()> {
    let spec: ClientSpec = serde_json::from_str(args.first().ok_or("stream-client: no spec")?)?;
    // One thread: these processes share two cores with relays and Postgres.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(run_client(spec))
}

async fn run_client(spec: ClientSpec) -> BenchResult<()> {
    let relays = spec.relay_ports.len();
    let (stop, _) = watch::channel(false);
    let shared = Arc::new(Shared {
        relays,
        phases: Mutex::new(vec![PhaseFigures::new(relays)]),
        arrivals: Mutex::new(Vec::new()),
        timing: AtomicBool::new(true),
        streaming: AtomicUsize::new(0),
        received: AtomicU64::new(0),
        stop,
        reconnect: spec.reconnect,
    });
    let mut phase = 0;
    let handshakes = Arc::new(Semaphore::new(spec.connect_concurrency.max(1)));
    let count = spec.streams.len();
    let source = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2 + (spec.index % 8) as u8));
    let mut tasks = Vec::with_capacity(count);
    let mut expected_per_scope = vec![0u64; spec.scopes];
    for global in spec.streams.clone() {
        let (relay, scope) = placement(global, relays, spec.scopes);
        expected_per_scope[scope] += 1;
        let scope_key = scope_name(&spec.scope_prefix, scope);
        let token = subscriber_token(&format!("box-{global}"), &scope_key, Value::Null);
        let stream = Stream {
            relay,
            scope,
            address: SocketAddr::from(([127, 0, 0, 1], spec.relay_ports[relay])),
            source,
            authorization: format!("Bearer {token}"),
            last_event_id: spec.last_event_id,
            received: Vec::new(),
        };
        let (shared, handshakes) = (Arc::clone(&shared), Arc::clone(&handshakes));
        tasks.push(tokio::spawn(async move {
            let permit = handshakes.acquire_owned().await.ok();
            stream.run(shared, permit).await
        }));
    }

    let (commands_tx, mut commands) = mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines().map_while(Result::ok) {
            if commands_tx.send(line).is_err() {
                break;
            }
        }
    });

    let mut reported = false;
    let finish = loop {
        if !reported
            && shared.streaming.load(Ordering::Relaxed) >= count
            && shared.phases()[phase].streams_opened >= count as u64
        {
            reported = true;
            say(&json!({"event": "all_streaming", "phase": phase, "at": realtime_ns()}));
        }
        let command = tokio::select! {
            command = commands.recv() => command,
            () = tokio::time::sleep(Duration::from_millis(5)) => continue,
        };
        let Some(command) = command else { break None };
        let words: Vec<&str> = command.split_whitespace().collect();
        match words.as_slice() {
            ["phase"] => {
                shared.timing.store(false, Ordering::Relaxed);
                phase = shared.next_phase();
                reported = false;
            }
            ["report"] => {
                let arrivals = std::mem::take(&mut *shared.arrivals());
                let mut file =
                    std::io::BufWriter::new(std::fs::File::create(spec.receipts_path())?);
                for arrival in &arrivals {
                    file.write_all(&arrival.number.to_le_bytes())?;
                    file.write_all(&arrival.relay.to_le_bytes())?;
                    file.write_all(&arrival.at.to_le_bytes())?;
                }
                file.flush()?;
                say(&json!({
                    "event": "report",
                    "tally": serde_json::to_value(shared.phases().get(phase))?,
                    "receipts": spec.receipts_path().display().to_string(),
                }));
            }
            ["status"] => say(&json!({
                "event": "status",
                "received": shared.received.load(Ordering::Relaxed),
            })),
            ["finish", emitted, patience_ms] => {
                let patience = Duration::from_millis(patience_ms.parse()?);
                break Some((emitted.parse::<usize>()?, patience));
            }
            _ => say(&json!({"event": "error", "unknown": command})),
        }
    };
    let (emitted, patience) = finish.unwrap_or((0, Duration::ZERO));
    let expected: u64 = expected_per_scope
        .iter()
        .enumerate()
        .map(|(scope, streams)| streams * (scope..emitted).step_by(spec.scopes).count() as u64)
        .sum();
    let deadline = Instant::now() + patience;
    while shared.received.load(Ordering::Relaxed) < expected && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    shared.stop.send_replace(true);
    let (mut missing, mut missing_streams) = (0u64, 0u64);
    for task in tasks {
        let Ok(stream) = task.await else { continue };
        let gap = stream.missing(emitted, spec.scopes);
        missing += gap;
        missing_streams += u64::from(gap > 0);
    }
    let phases = serde_json::to_value(&*shared.phases())?;
    say(&json!({
        "event": "finished",
        "missing": missing,
        "missing_streams": missing_streams,
        "phases": phases,
    }));
    Ok(())
}

#[derive(Clone, Copy, Debug)]
pub struct Arrival {
    pub number: u32,
    pub relay: u32,
    pub at: u64,
}

pub struct ClientProcess {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::UnboundedReceiver<Value>,
}

impl ClientProcess {
    fn spawn(binary: &Path, spec: &ClientSpec) -> BenchResult<ClientProcess> {
        let mut child = Command::new(binary)
            .arg(SUBCOMMAND)
            .arg(serde_json::to_string(spec)?)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("cannot start {} {SUBCOMMAND}: {e}", binary.display()))?;
        let stdin = child.stdin.take().ok_or("no stdin")?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let (lines_tx, lines) = mpsc::unbounded_channel();
        std::thread::spawn(move || {
            let lines = std::io::BufReader::new(stdout).lines();
            for line in lines.map_while(Result::ok) {
                if let Ok(value) = serde_json::from_str::<Value>(&line)
                    && lines_tx.send(value).is_err()
                {
                    break;
                }
            }
        });
        Ok(ClientProcess {
            child,
            stdin,
            lines,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn send(&mut self, command: &str) -> BenchResult<()> {
        writeln!(self.stdin, "{command}")?;
        self.stdin.flush()?;
        Ok(())
    }

    pub async fn expect(&mut self, event: &str, patience: Duration) -> BenchResult<Value> {
        let deadline = tokio::time::Instant::now() + patience;
        loop {
            let line = tokio::time::timeout_at(deadline, self.lines.recv())
                .await
                .map_err(|_| format!("client {}: no {event} within {patience:?}", self.pid()))?
                .ok_or_else(|| format!("client {} exited before {event}", self.pid()))?;
            if line["event"] == event {
                return Ok(line);
            }
        }
    }

    pub fn arrivals(report: &Value) -> BenchResult<Vec<Arrival>> {
        let path = report["receipts"].as_str().ok_or("no receipts file")?;
        let bytes = std::fs::read(path)?;
        let _ = std::fs::remove_file(path);
        Ok(bytes
            .chunks_exact(16)
            .map(|r| Arrival {
                number: u32::from_le_bytes(r[0..4].try_into().unwrap_or_default()),
                relay: u32::from_le_bytes(r[4..8].try_into().unwrap_or_default()),
                at: u64::from_le_bytes(r[8..16].try_into().unwrap_or_default()),
            })
            .collect())
    }
}

pub struct Clients(pub Vec<ClientProcess>);

impl Clients {
    pub fn send(&mut self, command: &str) -> BenchResult<()> {
        self.0.iter_mut().try_for_each(|c| c.send(command))
    }

    pub async fn expect(&mut self, event: &str, patience: Duration) -> BenchResult<Vec<Value>> {
        let mut lines = Vec::new();
        for client in &mut self.0 {
            lines.push(client.expect(event, patience).await?);
        }
        Ok(lines)
    }

    pub async fn received(&mut self, patience: Duration) -> BenchResult<u64> {
        self.send("status")?;
        Ok(sum(&self.expect("status", patience).await?, "received"))
    }
}

pub fn sum(lines: &[Value], key: &str) -> u64 {
    lines.iter().map(|l| l[key].as_u64().unwrap_or(0)).sum()
}

impl Drop for ClientProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct PhaseFigures {
    pub timeouts: u64,
    pub server_errors: u64,
    pub other_refusals: u64,
    pub resets: u64,
    pub refused_while_down: u64,
    pub out_of_descriptors: u64,
    pub out_of_ports: u64,
    pub streams_opened: u64,
    /// Connect time (TCP connect to `ready`) of every stream opened, µs:
    /// what a process sends; the parent keeps their percentiles.
    connect_micros: Vec<u32>,
    #[serde(skip)]
    pub connect: Percentiles,
    pub reset_reasons: BTreeMap<String, u64>,
    /// The first attempt of the phase and, per relay, its last stream
    /// ready (realtime ns; 0 until then).
    pub first_attempt: u64,
    pub last_ready: Vec<u64>,
}

impl PhaseFigures {
    fn new(relays: usize) -> PhaseFigures {
        PhaseFigures {
            last_ready: vec![0; relays],
            ..PhaseFigures::default()
        }
    }

    pub fn clean(&self) -> bool {
        self.timeouts + self.server_errors + self.other_refusals + self.resets == 0
    }

    pub fn merge<'a>(tallies: impl Iterator<Item = &'a Value>, relays: usize) -> PhaseFigures {
        let mut phase = PhaseFigures {
            first_attempt: u64::MAX,
            ..PhaseFigures::new(relays)
        };
        let mut connect = Vec::new();
        for tally in tallies {
            let Ok(counts) = PhaseFigures::deserialize(tally) else {
                continue;
            };
            phase.timeouts += counts.timeouts;
            phase.server_errors += counts.server_errors;
            phase.other_refusals += counts.other_refusals;
            phase.resets += counts.resets;
            phase.refused_while_down += counts.refused_while_down;
            phase.out_of_descriptors += counts.out_of_descriptors;
            phase.out_of_ports += counts.out_of_ports;
            phase.streams_opened += counts.streams_opened;
            if counts.first_attempt > 0 {
                phase.first_attempt = phase.first_attempt.min(counts.first_attempt);
            }
            connect.extend(counts.connect_micros.iter().map(|&us| u64::from(us) * 1000));
            for (how, count) in counts.reset_reasons {
                *phase.reset_reasons.entry(how).or_default() += count;
            }
            for (last, ready) in phase.last_ready.iter_mut().zip(counts.last_ready) {
                *last = (*last).max(ready);
            }
        }
        phase.connect = Percentiles::of(&mut connect);
        phase
    }

    pub fn errors(&self) -> String {
        let (timeouts, errors, resets) = (self.timeouts, self.server_errors, self.resets);
        let others = self.other_refusals;
        let mut text = format!(
            "408: {timeouts} · 5xx: {errors} · other refusals: {others} · resets: {resets}"
        );
        if !self.reset_reasons.is_empty() {
            text.push_str(&format!(" ({:?})", self.reset_reasons));
        }
        text
    }
}
