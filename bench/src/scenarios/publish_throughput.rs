//! Publishing at scale: how many durable events per second the HTTP publish
//! API accepts from concurrent publishers, each sending one event and
//! waiting for the answer before the next (the answer comes after the
//! commit), with the publish latency each saw; and the publisher crate's
//! batch emit against one emit per event.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use eventrelay_publisher::{NewEvent, Publisher};
use serde_json::json;

use crate::clock::Percentiles;
use crate::raw_publish::RawPublisher;
use crate::{BenchResult, PUBLISH_TOKEN};

#[derive(Debug, Clone)]
pub struct PublishFigures {
    pub publishers: usize,
    pub events_per_second: f64,
    pub latency: Percentiles,
    pub failed: usize,
}

/// `publishers` concurrent publishers against the relay at `address` for
/// `duration`, each on a keep-alive connection of its own (see
/// [`RawPublisher`] for why not a general-purpose client).
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
                let mut samples = Vec::new();
                let mut failed = 0usize;
                let mut n = 0u64;
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
    let mut samples = Vec::new();
    let mut failed = 0;
    for task in tasks {
        let (mine, lost) = task.await?;
        samples.extend(mine);
        failed += lost;
    }
    let elapsed = started.elapsed().as_secs_f64();
    Ok(PublishFigures {
        publishers,
        events_per_second: samples.len() as f64 / elapsed,
        latency: Percentiles::of(&mut samples),
        failed,
    })
}

/// Events per second writing `count` durable events in one transaction,
/// one `emit` each and then one `emit_batch` for all: (emit, batch).
pub async fn emit_versus_batch(
    database_url: &str,
    schema: &str,
    count: usize,
) -> BenchResult<(f64, f64)> {
    let mut client = eventrelay::connect(database_url).await?;
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
