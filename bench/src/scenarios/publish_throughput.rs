//! Publishing at scale (`--only publish`): durable events per second the HTTP
//! API takes from publishers each awaiting its answer (sent after the commit),
//! group commit off and on, and against an earlier release given
//! `--baseline-relay-bin`; and the publisher crate's batch emit against emit.

use crate::context::Context;
use crate::report::{Percentiles, Table, alternating, median, ms, target_if, verdict};
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use eventrelay_publisher::{NewEvent, Publisher};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::database::{drop_schema, unique_schema};
use crate::relay_process::{RelayProcess, RelaySettings};
use crate::{BenchResult, PUBLISH_TOKEN};

#[derive(Debug, Clone)]
pub struct PublishFigures {
    pub events_per_second: f64,
    pub latency: Percentiles,
    pub failed: usize,
}

/// `publishers` concurrent publishers to the relay at `address` for
/// `duration`, each on a keep-alive connection of its own ([`RawPublisher`]).
pub async fn http_publish(
    address: SocketAddr,
    publishers: usize,
    duration: Duration,
) -> BenchResult<PublishFigures> {
    let stop = Arc::new(AtomicBool::new(false));
    let mut connections = Vec::with_capacity(publishers);
    for _ in 0..publishers {
        connections.push(RawPublisher::connect(address, PUBLISH_TOKEN).await?);
    }
    let started = Instant::now();
    let tasks: Vec<_> = connections
        .into_iter()
        .enumerate()
        .map(|(publisher, mut connection)| {
            let stop = Arc::clone(&stop);
            tokio::spawn(async move {
                let (mut samples, mut failed, mut n) = (Vec::new(), 0usize, 0u64);
                while !stop.load(Ordering::Relaxed) {
                    let body = format!(
                        r#"{{"type":"bench.publish","scopeKey":"publish-bench","lane":"durable","data":{{"p":{publisher},"n":{n}}}}}"#
                    );
                    n += 1;
                    let sent = Instant::now();
                    match connection.publish(body.as_bytes()).await {
                        Ok(status) if (200..300).contains(&status) => {
                            samples.push(sent.elapsed().as_nanos() as u64);
                        }
                        Ok(_) => failed += 1,
                        Err(_) => {
                            failed += 1;
                            break;
                        }
                    }
                }
                (samples, failed)
            })
        })
        .collect();
    tokio::time::sleep(duration).await;
    stop.store(true, Ordering::Relaxed);
    let (mut samples, mut failed) = (Vec::new(), 0);
    for task in tasks {
        let (mine, lost) = task.await?;
        samples.extend(mine);
        failed += lost;
    }
    Ok(PublishFigures {
        events_per_second: samples.len() as f64 / started.elapsed().as_secs_f64(),
        latency: Percentiles::of(&mut samples),
        failed,
    })
}

pub async fn emit_versus_batch(db: &str, schema: &str, count: usize) -> BenchResult<(f64, f64)> {
    let mut client = eventrelay::connect(db).await?;
    let publisher = Publisher::new(schema)?;
    let events = || -> Vec<NewEvent> {
        (0..count)
            .map(|n| NewEvent::durable("bench.batch", "batch-bench", json!({"n": n})))
            .collect()
    };
    let tx = client.transaction().await?;
    let started = Instant::now();
    for event in events() {
        publisher.emit(&tx, event).await?;
    }
    tx.commit().await?;
    let one_by_one = count as f64 / started.elapsed().as_secs_f64();
    let tx = client.transaction().await?;
    let started = Instant::now();
    publisher.emit_batch(&tx, events()).await?;
    tx.commit().await?;
    let batched = count as f64 / started.elapsed().as_secs_f64();
    Ok((one_by_one, batched))
}

pub async fn rows(cx: &Context, table: &mut Table) -> BenchResult<()> {
    let baseline_at_64 = match &cx.args.baseline_relay_bin {
        Some(binary) => Some(baseline_publish_row(cx, binary, table).await?),
        None => None,
    };
    let mut off_at_64 = None;
    for group_commit_ms in [0, 2] {
        let mut settings = cx.settings();
        settings.group_commit_ms = group_commit_ms;
        let relay = cx.start_relay(settings).await?;
        let label = match group_commit_ms {
            0 => "group commit off".to_owned(),
            ms => format!("group commit on ({ms} ms)"),
        };
        for publishers in [1, 64] {
            eprintln!("HTTP publish, {publishers} publishers, {label}");
            let f = http_publish(relay.address(), publishers, cx.scale.emit_run * 2).await?;
            if (group_commit_ms, publishers) == (0, 64) {
                off_at_64 = Some(f.events_per_second);
            }
            let off = f.events_per_second / off_at_64.unwrap_or(f64::INFINITY);
            let mut target = format!("{off:.1}× group commit off");
            if let Some(baseline) = baseline_at_64 {
                // One pair of runs, half a minute apart; the
                // alternating rounds below judge the target.
                let ratio = f.events_per_second / baseline;
                target = format!("{ratio:.1}× the earlier release ({target})");
            }
            let target = target_if(group_commit_ms > 0 && publishers == 64, target);
            table.add(
                format!("HTTP publish, durable, {publishers} concurrent publisher(s), {label}"),
                publish_figures(&f),
                target,
            );
        }
    }
    if let Some(binary) = &cx.args.baseline_relay_bin {
        baseline_rounds(cx, binary, table).await?;
    }
    let count = if cx.args.quick { 1_000 } else { 5_000 };
    let (one_by_one, batched) = emit_versus_batch(cx.db(), &cx.schema, count).await?;
    let speedup = batched / one_by_one;
    table.note(
        format!("publisher: {count} durable events in one transaction, emit each vs emit_batch"),
        format!(
            "emit: {one_by_one:.0} events/s · emit_batch: {batched:.0} events/s ({speedup:.1}×)"
        ),
    );
    Ok(())
}

fn publish_figures(f: &PublishFigures) -> String {
    let (rate, latency, failed) = (f.events_per_second, f.latency.p50_p99(), f.failed);
    format!("{rate:.0} events/s · publish latency {latency} · {failed} failed")
}

fn baseline_settings(cx: &Context) -> (String, RelaySettings) {
    let schema = unique_schema("bench_baseline");
    let mut settings = RelaySettings::new(cx.db(), &schema);
    settings.baseline = true;
    (schema, settings)
}

async fn baseline_publish_row(cx: &Context, binary: &Path, table: &mut Table) -> BenchResult<f64> {
    let (schema, settings) = baseline_settings(cx);
    let rows = async {
        let relay = RelayProcess::start(binary, &cx.args.work_dir, &settings).await?;
        let mut at_64 = 0.0;
        for publishers in [1, 64] {
            eprintln!("HTTP publish, {publishers} publishers, earlier release");
            let f = http_publish(relay.address(), publishers, cx.scale.emit_run * 2).await?;
            at_64 = f.events_per_second;
            table.note(
                format!(
                    "HTTP publish, durable, {publishers} concurrent publisher(s), earlier release ({})",
                    binary.display()
                ),
                publish_figures(&f),
            );
        }
        BenchResult::Ok(at_64)
    }
    .await;
    drop_schema(cx.db(), &schema).await;
    rows
}

const PUBLISH_ROUNDS: usize = 3;

/// 64 publishers against the earlier release and this one (group commit on)
/// in rounds of alternating order, as this machine's speed drifts within
/// minutes (a third either way); the target is judged on the median ratio.
async fn baseline_rounds(cx: &Context, binary: &Path, table: &mut Table) -> BenchResult<()> {
    let (baseline_schema, baseline_settings) = baseline_settings(cx);
    let rounds = async {
        let baseline = RelayProcess::start(binary, &cx.args.work_dir, &baseline_settings).await?;
        let current = cx.start_relay(cx.settings()).await?;
        let addresses = [baseline.address(), current.address()];
        let figures = alternating(PUBLISH_ROUNDS, 2, async |round, case| {
            let round = round + 1;
            eprintln!("HTTP publish, 64 publishers, round {round} of {PUBLISH_ROUNDS}");
            http_publish(addresses[case], 64, cx.scale.emit_run * 2).await
        })
        .await?;
        let (mut shown, mut ratios) = (Vec::new(), Vec::new());
        for (earlier, now) in figures[0].iter().zip(&figures[1]) {
            let ratio = now.events_per_second / earlier.events_per_second;
            shown.push(format!(
                "{:.0} vs {:.0} events/s, p99 {} vs {} ({ratio:.1}×)",
                earlier.events_per_second,
                now.events_per_second,
                ms(earlier.latency.p99),
                ms(now.latency.p99),
            ));
            ratios.push(ratio);
        }
        BenchResult::Ok((shown, ratios))
    }
    .await;
    drop_schema(cx.db(), &baseline_schema).await;
    let (shown, ratios) = rounds?;
    let ratio = median(&ratios);
    let met = verdict(ratio >= 10.0);
    table.add(
        format!(
            "HTTP publish, durable, 64 concurrent publishers, earlier release vs group commit on, \
             {PUBLISH_ROUNDS} rounds in alternating order"
        ),
        format!("{} · median {ratio:.1}×", shown.join(" · ")),
        format!("≥ 10× the earlier release: {ratio:.1}× {met}"),
    );
    Ok(())
}

/// A lean HTTP/1.1 publisher: one keep-alive connection, each request
/// written in one piece, its answer read by hand. The relay shares the cores
/// with its load, so a general-purpose client's work would cost the figure.
pub struct RawPublisher {
    stream: TcpStream,
    head: String,
    request: Vec<u8>,
    answer: Vec<u8>,
}

impl RawPublisher {
    pub async fn connect(address: SocketAddr, bearer: &str) -> BenchResult<RawPublisher> {
        let stream = TcpStream::connect(address).await?;
        stream.set_nodelay(true)?;
        Ok(RawPublisher {
            stream,
            head: format!(
                "POST /v1/events HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer {bearer}\r\n\
                 Content-Type: application/json\r\nContent-Length: "
            ),
            request: Vec::with_capacity(512),
            answer: Vec::with_capacity(4096),
        })
    }

    /// Sends `body` and waits for the whole answer; returns its status.
    pub async fn publish(&mut self, body: &[u8]) -> BenchResult<u16> {
        self.request.clear();
        self.request.extend_from_slice(self.head.as_bytes());
        write!(self.request, "{}\r\n\r\n", body.len())?;
        self.request.extend_from_slice(body);
        self.stream.write_all(&self.request).await?;
        self.answer.clear();
        loop {
            // Keep-alive: nothing of a next answer can follow this one, since
            // the next request is not sent yet.
            if message_length(&self.answer)?.is_some() {
                return status(&self.answer);
            }
            if self.stream.read_buf(&mut self.answer).await? == 0 {
                return Err("the relay closed the connection".into());
            }
        }
    }
}

/// The length of the HTTP message (request or answer) at the start of
/// `bytes` once all of it has arrived, by its `Content-Length`.
pub(crate) fn message_length(bytes: &[u8]) -> BenchResult<Option<usize>> {
    let Some(end) = bytes.windows(4).position(|w| w == b"\r\n\r\n") else {
        return Ok(None);
    };
    let head = std::str::from_utf8(&bytes[..end])?;
    let body = head
        .split("\r\n")
        .filter_map(|line| line.split_once(':'))
        .find(|(name, _)| name.eq_ignore_ascii_case("content-length"))
        .map(|(_, value)| value.trim().parse::<usize>())
        .transpose()?
        .ok_or("a message without Content-Length")?;
    Ok((bytes.len() >= end + 4 + body).then_some(end + 4 + body))
}

/// Answers every request on `listener` with an empty `200 OK`, `delay`
/// after it came whole, handing it to `on_request` first.
pub(crate) fn serve_ok(
    listener: TcpListener,
    delay: Duration,
    on_request: impl Fn(&[u8]) + Clone + Send + 'static,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let on_request = on_request.clone();
            tokio::spawn(async move {
                let mut buffer = Vec::with_capacity(8192);
                while let Ok(1..) = stream.read_buf(&mut buffer).await {
                    while let Ok(Some(length)) = message_length(&buffer) {
                        on_request(&buffer[..length]);
                        buffer.drain(..length);
                        tokio::time::sleep(delay).await;
                        let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
                        if stream.write_all(ok).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    })
}

/// The status of the answer in `bytes` (`HTTP/1.1 200 OK`).
fn status(bytes: &[u8]) -> BenchResult<u16> {
    let code = bytes
        .get(9..12)
        .and_then(|code| std::str::from_utf8(code).ok());
    Ok(code.ok_or("an answer without a status line")?.parse()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_is_complete_only_with_its_whole_body() {
        let whole = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello";
        assert_eq!(message_length(whole).unwrap(), Some(whole.len()));
        assert_eq!(status(whole).unwrap(), 200);
        assert_eq!(message_length(&whole[..whole.len() - 1]).unwrap(), None);
        assert_eq!(message_length(b"HTTP/1.1 503 Serv").unwrap(), None);
        let request = b"POST /hook HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}";
        assert_eq!(message_length(request).unwrap(), Some(request.len()));
        let refused = b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\n\r\n";
        assert_eq!(status(refused).unwrap(), 401);
        assert!(message_length(b"HTTP/1.1 200 OK\r\n\r\n").is_err());
    }
}
