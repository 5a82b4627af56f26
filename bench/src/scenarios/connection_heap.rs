//! Where an idle stream's memory goes (`--only memory`), on a relay inside
//! this process whose counting allocator sees every heap byte: N idle
//! streams against as many bare TCP connections, the peak of a surge of them
//! connecting at once, and what many durable events add to a live stream.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use eventrelay::auth::{Algorithm, AuthConfig, JwtConfig, build_resolver};
use eventrelay::config::Config;
use eventrelay_publisher::{NewEvent, Publisher};
use serde_json::{Value::Null, json};
use tokio::{io::AsyncReadExt, io::AsyncWriteExt, net::TcpListener, net::TcpStream, sync::oneshot};

use crate::alloc_counter::{SIZE_CLASS, live_blocks, live_bytes};
use crate::context::Context;
use crate::report::{Table, size};
use crate::sse_load::request_head;
use crate::{BenchResult, PUBLISH_TOKEN, SUBSCRIBER_SECRET, subscriber_token};

/// Lets allocations made by background work settle before a reading.
const SETTLE: Duration = Duration::from_millis(500);
const CARRY_SCOPE: &str = "carry";
const CARRY_TYPE: &str = "bench.carry";
/// Events per transaction: well under a stream's queue, so none is dropped as slow.
const CARRY_BATCH: usize = 250;
/// Events before the baseline: past every per-scope memory that fills up
/// and then stays (the tail, the relay's delivered set).
const CARRY_WARM_UP: usize = 5_000;

/// An in-process relay with one stream open, so the scope's hub and the
/// first-use allocations of every part are in place before a baseline.
async fn warm_relay(database_url: &str, schema: &str) -> BenchResult<(InProcessRelay, TcpStream)> {
    let relay = InProcessRelay::start(database_url, schema).await?;
    let first = open_stream(relay.address, "heap-warm", "heap").await?;
    tokio::time::sleep(SETTLE).await;
    Ok((relay, first))
}

/// Stops a relay: that joins its thread, so off the runtime's workers.
pub async fn stop(relay: InProcessRelay) -> BenchResult<()> {
    Ok(tokio::task::spawn_blocking(move || drop(relay)).await?)
}

fn blocks(
    later: &[isize],
    earlier: &[isize],
    n: usize,
    shown: impl Fn(f64) -> bool,
    decimals: usize,
) -> String {
    let found: Vec<String> = later
        .iter()
        .zip(earlier)
        .enumerate()
        .rev()
        .map(|(class, (l, e))| (SIZE_CLASS * (class + 1), (l - e) as f64 / n as f64))
        .filter(|(_, per_stream)| shown(*per_stream))
        .map(|(size, count)| format!("{count:.decimals$} × ≤ {size} B"))
        .collect();
    found.join(" · ")
}

async fn idle_streams(database_url: &str, schema: &str, n: usize) -> BenchResult<(f64, String)> {
    let (relay, _first) = warm_relay(database_url, schema).await?;
    let mut streams = Vec::with_capacity(n);
    let (blocks_before, before) = (live_blocks(), live_bytes());
    for index in 0..n {
        streams.push(open_stream(relay.address, &format!("heap-{index}"), "heap").await?);
    }
    tokio::time::sleep(SETTLE).await;
    let after = live_bytes();
    let by_size = blocks(&live_blocks(), &blocks_before, n, |b| b.abs() >= 0.5, 1);
    // The vector of sockets is the measurement's own, not the streams'.
    let vector = (streams.capacity() * std::mem::size_of::<TcpStream>()) as isize;
    drop(streams);
    stop(relay).await?;
    Ok(((after - before - vector) as f64 / n as f64, by_size))
}

async fn surge(database_url: &str, schema: &str, n: usize) -> BenchResult<(f64, String)> {
    let (relay, _first) = warm_relay(database_url, schema).await?;
    let (address, before) = (relay.address, live_bytes());
    let open = |index| async move { open_stream(address, &format!("surge-{index}"), "heap").await };
    let opening: Vec<_> = (0..n).map(|index| tokio::spawn(open(index))).collect();
    let mut peak = (before, live_blocks());
    while opening.iter().any(|task| !task.is_finished()) {
        let now = live_bytes();
        if now > peak.0 {
            peak = (now, live_blocks());
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let mut streams = Vec::with_capacity(n);
    for task in opening {
        streams.push(task.await??);
    }
    tokio::time::sleep(SETTLE).await;
    let idle = (live_bytes(), live_blocks());
    drop(streams);
    stop(relay).await?;
    let transient = (peak.0 - idle.0) as f64 / n as f64;
    Ok((transient, blocks(&peak.1, &idle.1, n, |b| b >= 0.05, 2)))
}

async fn bare_sockets(n: usize) -> BenchResult<f64> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    let mut held = Vec::with_capacity(2 * n);
    let before = live_bytes();
    for _ in 0..n {
        held.push(TcpStream::connect(address).await?);
        held.push(listener.accept().await?.0);
    }
    let after = live_bytes();
    let vector = (held.capacity() * std::mem::size_of::<TcpStream>()) as isize;
    Ok((after - before - vector) as f64 / n as f64)
}

async fn carried(database_url: &str, schema: &str, n: usize, events: usize) -> BenchResult<f64> {
    let relay = InProcessRelay::start(database_url, schema).await?;
    let (mut received, mut readers) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for index in 0..n {
        let socket = open_stream(relay.address, &format!("carry-{index}"), CARRY_SCOPE).await?;
        let count = Arc::new(AtomicUsize::new(0));
        received.push(Arc::clone(&count));
        readers.push(tokio::spawn(count_events(socket, count)));
    }
    let mut client = eventrelay::connect(database_url).await?;
    let publisher = Publisher::new(schema)?;
    let mut emitted = 0;
    let mut emit = async |count: usize| -> BenchResult<()> {
        for first in (0..count).step_by(CARRY_BATCH) {
            let batch: Vec<NewEvent> = (first..count.min(first + CARRY_BATCH))
                .map(|n| NewEvent::durable(CARRY_TYPE, CARRY_SCOPE, json!({ "n": n })))
                .collect();
            emitted += batch.len();
            let tx = client.transaction().await?;
            publisher.emit_batch(&tx, batch).await?;
            tx.commit().await?;
            every_stream_has(&received, emitted).await?;
        }
        Ok(())
    };
    emit(CARRY_WARM_UP).await?;
    tokio::time::sleep(SETTLE).await;
    let before = live_bytes();
    emit(events).await?;
    tokio::time::sleep(SETTLE).await;
    let after = live_bytes();
    for reader in &readers {
        reader.abort();
    }
    stop(relay).await?;
    Ok((after - before) as f64 / n as f64)
}

async fn every_stream_has(received: &[Arc<AtomicUsize>], events: usize) -> BenchResult<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let behind = || {
        let counts = received.iter().map(|count| count.load(Ordering::Relaxed));
        counts.filter(|count| *count < events).count()
    };
    while behind() > 0 {
        if Instant::now() > deadline {
            let late = behind();
            return Err(format!("{late} streams had not received {events} events in 30 s").into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}

async fn count_events(mut socket: TcpStream, count: Arc<AtomicUsize>) -> BenchResult<()> {
    let pattern = format!("event: {CARRY_TYPE}\n").into_bytes();
    let size = pattern.len();
    let mut buffer = vec![0u8; 16 * 1024];
    // The end of the previous read, where a frame's line may have begun.
    let mut carried: Vec<u8> = Vec::with_capacity(buffer.len() + size);
    loop {
        let read = socket.read(&mut buffer).await?;
        if read == 0 {
            return Ok(());
        }
        carried.extend_from_slice(&buffer[..read]);
        let found = carried.windows(size).filter(|w| *w == pattern).count();
        count.fetch_add(found, Ordering::Relaxed);
        let keep = carried.len().min(size - 1);
        carried.drain(..carried.len() - keep);
    }
}

async fn open_stream(address: SocketAddr, subscriber: &str, scope: &str) -> BenchResult<TcpStream> {
    let mut socket = TcpStream::connect(address).await?;
    let authorization = format!("Bearer {}", subscriber_token(subscriber, scope, Null));
    let request = request_head(address, "/v1/events", Some(&authorization), None);
    socket.write_all(request.as_bytes()).await?;
    let (mut seen, mut filled) = ([0u8; 2048], 0);
    while !seen[..filled].windows(12).any(|w| w == b"event: ready") {
        if filled == seen.len() {
            return Err("the stream's start did not fit 2 KiB".into());
        }
        let read = socket.read(&mut seen[filled..]).await?;
        if read == 0 {
            return Err("the relay closed the stream before it was ready".into());
        }
        filled += read;
    }
    Ok(socket)
}

pub async fn rows(cx: &Context, table: &mut Table) -> BenchResult<()> {
    let (db, schema) = (cx.db(), cx.schema.as_str());
    let n = if cx.args.quick { 1_000 } else { 5_000 };
    eprintln!("heap per idle stream: {n} streams");
    let bare_socket = bare_sockets(n).await?;
    let (stream, by_size) = idle_streams(db, schema, n).await?;
    // The client's half of each connection is a bare socket's half.
    let [relay_side, bare_socket] = [stream - bare_socket / 2.0, bare_socket].map(size);
    table.note(
        format!("heap per idle stream, relay side ({n} streams, in-process, counted allocator)"),
        format!(
            "{relay_side} allocated per stream (a bare TCP connection's two ends: {bare_socket}); actix-http's read and write buffers are 8 KiB each of it"
        ),
    );
    let by_block = "heap per idle stream, by block size (both ends, in-process)";
    table.note(by_block, by_size);
    let (carrying, events) = (100, 20_000);
    eprintln!("heap per stream carrying {events} durable events: {carrying} streams");
    let growth = carried(db, schema, carrying, events).await?;
    table.note(
        format!(
            "heap a live stream adds carrying {events} durable events ({carrying} streams, in-process, after a warm-up)"
        ),
        format!("{} per stream", size(growth)),
    );
    let (transient, by_size) = surge(db, schema, n).await?;
    table.note(
        format!(
            "heap per stream at the peak of {n} connecting at once, beyond what they hold idle"
        ),
        format!("{} per stream: {by_size}", size(transient)),
    );
    Ok(())
}

pub struct InProcessRelay {
    pub address: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl InProcessRelay {
    pub async fn start(database_url: &str, schema: &str) -> BenchResult<InProcessRelay> {
        let mut config = Config::default();
        config.database.url = Some(database_url.into());
        config.database.schema = schema.to_owned();
        config.database.channel = schema.to_owned();
        config.database.pool_size = 4;
        config.http.workers = 1;
        config.hub.arbiters = 1;
        config.webhooks.enabled = false;
        config.publish.token = Some(PUBLISH_TOKEN.into());
        config.auth = Some(AuthConfig::Jwt(JwtConfig {
            algorithm: Algorithm::HS256,
            secret: Some(SUBSCRIBER_SECRET.into()),
            ..JwtConfig::default()
        }));
        config.validate()?;
        let auth = config.auth.as_ref().ok_or("the bench relay needs [auth]")?;
        let resolver = build_resolver(auth)?;
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        let address = listener.local_addr()?;
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            actix_rt::System::new().block_on(async move {
                let shutdown = async move { stopped.await.unwrap_or(()) };
                let served = eventrelay::server::run(config, resolver, listener, shutdown).await;
                if let Err(error) = served {
                    eprintln!("in-process relay failed: {error}");
                }
            });
        });
        let relay = InProcessRelay {
            address,
            stop: Some(stop),
            thread: Some(thread),
        };
        let client = reqwest::Client::new();
        for _ in 0..300 {
            if crate::relay_process::ready(&client, &format!("http://{address}")).await {
                return Ok(relay);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Err("the in-process relay never became ready".into())
    }
}

impl Drop for InProcessRelay {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
