//! Where an idle stream's memory goes. A relay runs inside the bench
//! process, whose counting allocator sees every heap byte; N streams are
//! opened over raw sockets (the client side allocates nothing but its
//! sockets) and left idle. The live heap per stream is then compared with
//! the same number of bare TCP connections to a listener that only holds
//! them, which is what the sockets themselves cost on both ends. A third
//! measurement lets streams carry many durable events and counts what
//! their heap grew by, which a stream that lives for hours would keep.

use crate::context::Context;
use crate::report::{Table, size};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use eventrelay_publisher::{NewEvent, Publisher};
use serde_json::json;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::alloc_counter::{SIZE_CLASS, live_blocks, live_bytes};
use crate::in_process::InProcessRelay;
use crate::sse_load::request_head;
use crate::{BenchResult, subscriber_token};

/// Heap bytes per connection, measured two ways.
#[derive(Debug, Clone)]
pub struct ConnectionHeap {
    /// An idle event stream, both ends, in one process.
    pub stream: f64,
    /// A bare TCP connection held open, both ends, in one process.
    pub bare_socket: f64,
    /// What an idle stream holds, by block size: (up to this many bytes,
    /// blocks per stream), for the sizes of which a stream holds at least
    /// half a block, largest first.
    pub blocks: Vec<(usize, f64)>,
}

/// Lets allocations made by background work settle before a reading.
const SETTLE: Duration = Duration::from_millis(500);

pub async fn measure(database_url: &str, schema: &str, n: usize) -> BenchResult<ConnectionHeap> {
    let bare_socket = bare_sockets(n).await?;
    let relay = InProcessRelay::start(database_url, schema).await?;
    let address = relay.address;
    // One stream first, so the scope's hub and the first-use allocations
    // of every part are in place before the baseline.
    let _first = open_stream(address, "heap-warm").await?;
    tokio::time::sleep(SETTLE).await;
    let mut streams = Vec::with_capacity(n);
    let blocks_before = live_blocks();
    let before = live_bytes();
    for index in 0..n {
        streams.push(open_stream(address, &format!("heap-{index}")).await?);
    }
    tokio::time::sleep(SETTLE).await;
    let after = live_bytes();
    let blocks_after = live_blocks();
    let vector = (streams.capacity() * std::mem::size_of::<TcpStream>()) as isize;
    drop(streams);
    let mut blocks: Vec<(usize, f64)> = blocks_after
        .iter()
        .zip(&blocks_before)
        .enumerate()
        .map(|(class, (after, before))| {
            (SIZE_CLASS * (class + 1), (after - before) as f64 / n as f64)
        })
        .filter(|(_, per_stream)| per_stream.abs() >= 0.5)
        .collect();
    blocks.reverse();
    // Stopping joins the relay's thread: do it off the runtime's workers.
    tokio::task::spawn_blocking(move || drop(relay)).await?;
    Ok(ConnectionHeap {
        stream: (after - before - vector) as f64 / n as f64,
        bare_socket,
        blocks,
    })
}

/// What a surge of streams connecting at once holds at its peak beyond
/// what the same streams hold once idle.
#[derive(Debug, Clone)]
pub struct SurgeHeap {
    /// Live heap at the peak, less the idle streams' heap, per stream.
    pub transient: f64,
    /// The blocks making up the difference, as in [`ConnectionHeap`].
    pub blocks: Vec<(usize, f64)>,
}

/// Opens `n` streams all at once and samples the live heap until every
/// one is ready.
pub async fn measure_surge(database_url: &str, schema: &str, n: usize) -> BenchResult<SurgeHeap> {
    let relay = InProcessRelay::start(database_url, schema).await?;
    let address = relay.address;
    let _first = open_stream(address, "surge-warm").await?;
    tokio::time::sleep(SETTLE).await;
    let before = live_bytes();
    let opening: Vec<_> = (0..n)
        .map(|index| {
            tokio::spawn(async move { open_stream(address, &format!("surge-{index}")).await })
        })
        .collect();
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
    tokio::task::spawn_blocking(move || drop(relay)).await?;
    let mut blocks: Vec<(usize, f64)> = peak
        .1
        .iter()
        .zip(&idle.1)
        .enumerate()
        .map(|(class, (at_peak, at_idle))| {
            (
                SIZE_CLASS * (class + 1),
                (at_peak - at_idle) as f64 / n as f64,
            )
        })
        .filter(|(_, per_stream)| *per_stream >= 0.05)
        .collect();
    blocks.reverse();
    Ok(SurgeHeap {
        transient: (peak.0 - idle.0) as f64 / n as f64,
        blocks,
    })
}

/// Heap per bare TCP connection: both ends held open by tokio sockets.
async fn bare_sockets(n: usize) -> BenchResult<f64> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    let mut held = Vec::with_capacity(2 * n);
    let before = live_bytes();
    for _ in 0..n {
        let client = TcpStream::connect(address).await?;
        let (server, _) = listener.accept().await?;
        held.push(client);
        held.push(server);
    }
    let after = live_bytes();
    // The vector of sockets is the measurement's own, not the sockets'.
    let vector = (held.capacity() * std::mem::size_of::<TcpStream>()) as isize;
    Ok((after - before - vector) as f64 / n as f64)
}

/// What carrying durable events adds to a live stream's heap.
#[derive(Debug, Clone)]
pub struct CarriedHeap {
    /// Live heap per stream once `events` more events were delivered to
    /// every stream, less what it held after the warm-up.
    pub growth: f64,
    pub events: usize,
}

/// The scope and event type the carrying streams use.
const CARRY_SCOPE: &str = "carry";
const CARRY_TYPE: &str = "bench.carry";
/// Events per transaction: well under a stream's queue, so fast readers
/// are never dropped as slow.
const CARRY_BATCH: usize = 250;
/// Events before the baseline: past every per-scope memory that fills up
/// and then stays (the tail, the relay's delivered set).
const CARRY_WARM_UP: usize = 5_000;

/// Opens `n` streams that read and count every event, delivers
/// [`CARRY_WARM_UP`] durable events, takes the live heap, delivers
/// `events` more and takes it again.
pub async fn measure_carried(
    database_url: &str,
    schema: &str,
    n: usize,
    events: usize,
) -> BenchResult<CarriedHeap> {
    let relay = InProcessRelay::start(database_url, schema).await?;
    let address = relay.address;
    let mut received = Vec::with_capacity(n);
    let mut readers = Vec::with_capacity(n);
    for index in 0..n {
        let socket = open_stream_in(address, &format!("carry-{index}"), CARRY_SCOPE).await?;
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
    tokio::task::spawn_blocking(move || drop(relay)).await?;
    Ok(CarriedHeap {
        growth: (after - before) as f64 / n as f64,
        events,
    })
}

/// Waits until every stream has received `events` events.
async fn every_stream_has(received: &[Arc<AtomicUsize>], events: usize) -> BenchResult<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while received
        .iter()
        .any(|count| count.load(Ordering::Relaxed) < events)
    {
        if Instant::now() > deadline {
            let behind = received
                .iter()
                .filter(|count| count.load(Ordering::Relaxed) < events)
                .count();
            return Err(
                format!("{behind} streams had not received {events} events in 30 s").into(),
            );
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}

/// Reads a stream to its end, counting its event frames into `count`.
async fn count_events(mut socket: TcpStream, count: Arc<AtomicUsize>) -> BenchResult<()> {
    let pattern = format!("event: {CARRY_TYPE}\n").into_bytes();
    let mut buffer = vec![0u8; 16 * 1024];
    // The end of the previous read, where a frame's line may have begun.
    let mut carried: Vec<u8> = Vec::with_capacity(buffer.len() + pattern.len());
    loop {
        let read = socket.read(&mut buffer).await?;
        if read == 0 {
            return Ok(());
        }
        carried.extend_from_slice(&buffer[..read]);
        let found = carried
            .windows(pattern.len())
            .filter(|window| *window == pattern.as_slice())
            .count();
        count.fetch_add(found, Ordering::Relaxed);
        let keep = carried.len().min(pattern.len() - 1);
        carried.drain(..carried.len() - keep);
    }
}

/// Opens a stream over a raw socket and reads until its `ready` frame.
async fn open_stream(address: std::net::SocketAddr, subscriber: &str) -> BenchResult<TcpStream> {
    open_stream_in(address, subscriber, "heap").await
}

/// Opens a stream of `scope` over a raw socket and reads until its
/// `ready` frame.
async fn open_stream_in(
    address: std::net::SocketAddr,
    subscriber: &str,
    scope: &str,
) -> BenchResult<TcpStream> {
    let mut socket = TcpStream::connect(address).await?;
    let token = subscriber_token(subscriber, scope);
    let authorization = format!("Bearer {token}");
    let request = request_head(address, "/v1/events", Some(&authorization), None);
    socket.write_all(request.as_bytes()).await?;
    let mut seen = [0u8; 2048];
    let mut filled = 0;
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

/// Where an idle stream's heap goes, what carrying events adds, and the
/// peak of many connecting at once.
pub async fn rows(cx: &Context, table: &mut Table) -> BenchResult<()> {
    let (db, schema) = (cx.db(), cx.schema.as_str());
    let n = if cx.args.quick { 1_000 } else { 5_000 };
    eprintln!("heap per idle stream: {n} streams");
    let heap = measure(db, schema, n).await?;
    // The client's half of each connection is a bare socket's half.
    let relay_side = heap.stream - heap.bare_socket / 2.0;
    table.add(
            format!("heap per idle stream, relay side ({n} streams, in-process, counted allocator)"),
            format!(
                "{} allocated per stream (a bare TCP connection's two ends: {}); actix-http's read and write buffers are 8 KiB each of it",
                size(relay_side),
                size(heap.bare_socket)
            ),
            "–".to_owned(),
        );
    let blocks: Vec<String> = heap
        .blocks
        .iter()
        .map(|(size, count)| format!("{count:.1} × ≤ {size} B"))
        .collect();
    table.add(
        "heap per idle stream, by block size (both ends, in-process)",
        blocks.join(" · "),
        "–".to_owned(),
    );
    let carrying = 100;
    let events = 20_000;
    eprintln!("heap per stream carrying {events} durable events: {carrying} streams");
    let carried = measure_carried(db, schema, carrying, events).await?;
    table.add(
            format!(
                "heap a live stream adds carrying {} durable events ({carrying} streams, in-process, after a warm-up)",
                carried.events
            ),
            format!("{} per stream", size(carried.growth)),
            "–".to_owned(),
        );
    let surge = measure_surge(db, schema, n).await?;
    let blocks: Vec<String> = surge
        .blocks
        .iter()
        .map(|(size, count)| format!("{count:.2} × ≤ {size} B"))
        .collect();
    table.add(
        format!(
            "heap per stream at the peak of {n} connecting at once, beyond what they hold idle"
        ),
        format!(
            "{} per stream: {}",
            size(surge.transient),
            blocks.join(" · ")
        ),
        "–".to_owned(),
    );
    Ok(())
}
