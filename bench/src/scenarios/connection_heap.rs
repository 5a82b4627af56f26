//! Where an idle stream's memory goes. A relay runs inside the bench
//! process, whose counting allocator sees every heap byte; N streams are
//! opened over raw sockets (the client side allocates nothing but its
//! sockets) and left idle. The live heap per stream is then compared with
//! the same number of bare TCP connections to a listener that only holds
//! them, which is what the sockets themselves cost on both ends.

use std::time::Duration;

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

/// Opens a stream over a raw socket and reads until its `ready` frame.
async fn open_stream(address: std::net::SocketAddr, subscriber: &str) -> BenchResult<TcpStream> {
    let mut socket = TcpStream::connect(address).await?;
    let token = subscriber_token(subscriber, "heap");
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
