//! Many SSE subscribers over plain TCP in this process, cheap enough to run
//! 10,000 next to the server, each noting when frames carrying a bench event
//! number (`"bn":<n>`) arrive; and the frame parser client processes share.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{Semaphore, mpsc, watch};
use tokio::task::JoinHandle;

use crate::BenchResult;
use crate::report::{CommitLog, Receipt};

const NUMBER_MARKER: &[u8] = b"\"bn\":";
const READY_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub enum ReadyWhen {
    /// eventrelay: after its `event: ready` frame (replay is done).
    #[default]
    ReadyEvent,
    /// nchan: once the response headers are in.
    HeadersEnd,
}

#[derive(Clone, Debug)]
pub struct StreamTarget {
    pub address: SocketAddr,
    pub path: String,
    pub authorization: Option<String>,
    pub ready_when: ReadyWhen,
}

#[derive(Default)]
pub struct StreamOutcome {
    pub ready_at: Option<u64>,
    pub receipts: Vec<Receipt>,
}

pub struct Subscribers {
    tasks: Vec<JoinHandle<Result<StreamOutcome, String>>>,
    stop: watch::Sender<bool>,
    pub received: Arc<AtomicU64>,
}

impl Subscribers {
    pub async fn open(
        targets: Vec<StreamTarget>,
        log: Arc<CommitLog>,
        concurrency: usize,
    ) -> BenchResult<Subscribers> {
        let (stop, stopped) = watch::channel(false);
        let received = Arc::new(AtomicU64::new(0));
        let handshakes = Arc::new(Semaphore::new(concurrency));
        let (ready_tx, mut ready_rx) = mpsc::unbounded_channel::<Result<(), String>>();
        let count = targets.len();
        let tasks = targets
            .into_iter()
            .map(|target| {
                let (log, received) = (Arc::clone(&log), Arc::clone(&received));
                let (handshakes, ready) = (Arc::clone(&handshakes), ready_tx.clone());
                let stopped = stopped.clone();
                tokio::spawn(async move {
                    let permit = handshakes.acquire_owned().await.ok();
                    subscribe(target, log, received, ready, permit, stopped).await
                })
            })
            .collect();
        drop(ready_tx);
        let subscribers = Subscribers {
            tasks,
            stop,
            received,
        };
        let all_ready = async {
            for _ in 0..count {
                let ready = ready_rx.recv().await;
                ready.ok_or("a subscriber ended before it was ready")??;
            }
            BenchResult::Ok(())
        };
        // Dropping the subscribers on an error closes every stream.
        let ready = tokio::time::timeout(READY_TIMEOUT, all_ready).await;
        ready.map_err(|_| format!("not all {count} subscribers were ready in time"))??;
        Ok(subscribers)
    }

    pub async fn wait_for(&self, expected: u64, patience: Duration) {
        let deadline = tokio::time::Instant::now() + patience;
        while self.received.load(Ordering::Relaxed) < expected
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    pub async fn finish(self) -> Vec<StreamOutcome> {
        let _ = self.stop.send(true);
        let outcomes = futures_util::future::join_all(self.tasks).await;
        outcomes.into_iter().flatten().flatten().collect()
    }
}

pub fn deliveries<'a>(
    outcomes: &'a [StreamOutcome],
    log: &'a CommitLog,
) -> impl Iterator<Item = (u32, u64, u64)> + 'a {
    outcomes
        .iter()
        .flat_map(|outcome| &outcome.receipts)
        .filter_map(|receipt| {
            let (number, at) = (receipt.number, receipt.at);
            let committed = log.committed_at(number as usize)?;
            Some((number, at, at.saturating_sub(committed)))
        })
}

async fn subscribe(
    target: StreamTarget,
    log: Arc<CommitLog>,
    received: Arc<AtomicU64>,
    ready: mpsc::UnboundedSender<Result<(), String>>,
    mut handshake: Option<tokio::sync::OwnedSemaphorePermit>,
    mut stopped: watch::Receiver<bool>,
) -> Result<StreamOutcome, String> {
    let mut outcome = StreamOutcome::default();
    let read = async {
        let connected = TcpStream::connect(target.address).await;
        let mut stream = connected.map_err(|e| format!("connect: {e}"))?;
        stream.set_nodelay(true).ok();
        let authorization = target.authorization.as_deref();
        let request = request_head(target.address, &target.path, authorization, None);
        let sent = stream.write_all(request.as_bytes()).await;
        sent.map_err(|e| format!("send: {e}"))?;
        let mut parser = FrameParser::new(target.ready_when);
        let mut buffer = vec![0u8; 16 * 1024];
        loop {
            let read = tokio::select! {
                _ = stopped.changed() => return Ok(()),
                read = stream.read(&mut buffer) => read.map_err(|e| format!("read: {e}"))?,
            };
            if read == 0 {
                return match outcome.ready_at {
                    Some(_) => Ok(()),
                    None => Err("the server closed the stream before it was ready".to_owned()),
                };
            }
            let (now, before) = (log.now(), outcome.receipts.len());
            let became_ready = parser.feed(&buffer[..read], now, &mut outcome.receipts)?;
            received.fetch_add((outcome.receipts.len() - before) as u64, Ordering::Relaxed);
            if became_ready {
                outcome.ready_at = Some(now);
                handshake.take();
                let _ = ready.send(Ok(()));
            }
        }
    };
    match read.await {
        Ok(()) => Ok(outcome),
        Err(error) => {
            if outcome.ready_at.is_none() {
                let _ = ready.send(Err(format!("{}{}: {error}", target.address, target.path)));
            }
            Err(error)
        }
    }
}

pub(crate) fn request_head(
    address: SocketAddr,
    path: &str,
    authorization: Option<&str>,
    last_event_id: Option<i64>,
) -> String {
    let mut request =
        format!("GET {path} HTTP/1.1\r\nHost: {address}\r\nAccept: text/event-stream\r\n");
    if let Some(authorization) = authorization {
        request.push_str(&format!("Authorization: {authorization}\r\n"));
    }
    if let Some(id) = last_event_id {
        request.push_str(&format!("Last-Event-ID: {id}\r\n"));
    }
    request.push_str("\r\n");
    request
}

#[derive(Default)]
pub(crate) struct FrameParser {
    ready_when: ReadyWhen,
    pending: Vec<u8>,
    in_body: bool,
    status_seen: bool,
    ready: bool,
    pub(crate) status: Option<u16>,
    /// The last `id:` seen: what a reconnect sends as `Last-Event-ID`.
    pub(crate) last_id: Option<i64>,
    /// The closing chunk of the chunked response came: the server ended it.
    pub(crate) ended: bool,
}

impl FrameParser {
    pub(crate) fn new(ready_when: ReadyWhen) -> Self {
        FrameParser {
            ready_when,
            ..FrameParser::default()
        }
    }

    pub(crate) fn feed(
        &mut self,
        bytes: &[u8],
        now: u64,
        receipts: &mut Vec<Receipt>,
    ) -> Result<bool, String> {
        let was_ready = self.ready;
        let mut data: &[u8] = bytes;
        let joined;
        if !self.pending.is_empty() {
            self.pending.extend_from_slice(bytes);
            joined = std::mem::take(&mut self.pending);
            data = &joined;
        }
        let mut start = 0;
        while let Some(offset) = data[start..].iter().position(|b| *b == b'\n') {
            let line = &data[start..start + offset];
            start += offset + 1;
            self.line(line, now, receipts)?;
        }
        self.pending.extend_from_slice(&data[start..]);
        Ok(self.ready && !was_ready)
    }

    fn line(&mut self, line: &[u8], now: u64, receipts: &mut Vec<Receipt>) -> Result<(), String> {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if !self.in_body {
            if !self.status_seen {
                self.status_seen = true;
                self.status = std::str::from_utf8(line)
                    .ok()
                    .and_then(|text| text.split_whitespace().nth(1)?.parse().ok());
                if !line.windows(5).any(|w| w == b" 200 ") && !line.ends_with(b" 200") {
                    return Err(format!("refused: {}", String::from_utf8_lossy(line)));
                }
            } else if line.is_empty() {
                self.in_body = true;
                if self.ready_when == ReadyWhen::HeadersEnd {
                    self.ready = true;
                }
            }
            return Ok(());
        }
        if line.starts_with(b"data:") {
            if let Some(number) = event_number(line) {
                receipts.push(Receipt { number, at: now });
            }
        } else if let Some(id) = line.strip_prefix(b"id:") {
            let id = String::from_utf8_lossy(id);
            self.last_id = id.trim().parse().ok().or(self.last_id);
        } else if line == b"0" {
            // A chunk-size line of zero: no SSE line is a bare `0`.
            self.ended = true;
        } else if line == b"event: ready" && self.ready_when == ReadyWhen::ReadyEvent {
            self.ready = true;
        }
        Ok(())
    }
}

/// The bench event number in `text` (`"bn":<n>`, as JSON encoders write it).
pub(crate) fn event_number(text: &[u8]) -> Option<u32> {
    let marker = NUMBER_MARKER.len();
    let at = text.windows(marker).position(|w| w == NUMBER_MARKER)?;
    let digits = text[at + marker..].trim_ascii_start();
    let end = digits.iter().take_while(|b| b.is_ascii_digit()).count();
    std::str::from_utf8(&digits[..end]).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_numbers_and_readiness_across_split_reads() {
        let mut parser = FrameParser::new(ReadyWhen::ReadyEvent);
        let mut receipts = Vec::new();
        let stream = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n1a\r\nretry: 3000\n\nevent: ready\ndata: {}\n\nid: 4\nevent: t\ndata: {\"data\":{\"bn\":17,\"pad\":\"x\"}}\n\n";
        let (first, second) = stream.split_at(70);
        assert!(!parser.feed(first, 1, &mut receipts).unwrap());
        assert!(parser.feed(second, 2, &mut receipts).unwrap());
        assert_eq!(receipts.len(), 1);
        assert_eq!(receipts[0].number, 17);
        assert_eq!(parser.status, Some(200));
        assert_eq!(parser.last_id, Some(4));
        assert!(!parser.ended);
        parser.feed(b"\r\n0\r\n\r\n", 3, &mut receipts).unwrap();
        assert!(parser.ended);
    }

    #[test]
    fn a_refusal_is_an_error() {
        let mut parser = FrameParser::new(ReadyWhen::HeadersEnd);
        let refusal = b"HTTP/1.1 429 Too Many Requests\r\n\r\n";
        let error = parser.feed(refusal, 0, &mut Vec::new()).unwrap_err();
        assert!(error.contains("429"));
        assert_eq!(parser.status, Some(429));
    }
}
