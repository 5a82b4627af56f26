//! Publishing at scale: how many durable events per second the HTTP publish
//! API accepts from concurrent publishers, each sending one event and
//! waiting for the answer before the next (the answer comes after the
//! commit), with the publish latency each saw; and the publisher crate's
//! batch emit against one emit per event.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use eventrelay_publisher::{NewEvent, Publisher};
use serde_json::json;

use crate::clock::Percentiles;
use crate::{BenchResult, PUBLISH_TOKEN};

#[derive(Debug, Clone)]
pub struct PublishFigures {
    pub publishers: usize,
    pub events_per_second: f64,
    pub latency: Percentiles,
    pub failed: usize,
}

/// `publishers` concurrent publishers against `base` for `duration`.
pub async fn http_publish(
    base: &str,
    publishers: usize,
    duration: Duration,
) -> BenchResult<PublishFigures> {
    let stop = Arc::new(AtomicBool::new(false));
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(publishers)
        .build()?;
    let url = format!("{base}/v1/events");
    let started = Instant::now();
    let tasks: Vec<_> = (0..publishers)
        .map(|publisher| {
            let (client, url, stop) = (client.clone(), url.clone(), Arc::clone(&stop));
            tokio::spawn(async move {
                let mut samples = Vec::new();
                let mut failed = 0usize;
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let body = json!({"type": "bench.publish", "scopeKey": "publish-bench",
                        "lane": "durable", "data": {"p": publisher, "n": n}});
                    n += 1;
                    let sent = Instant::now();
                    let answer = client
                        .post(&url)
                        .bearer_auth(PUBLISH_TOKEN)
                        .json(&body)
                        .send()
                        .await;
                    match answer {
                        Ok(response) if response.status().is_success() => {
                            samples.push(sent.elapsed().as_nanos() as u64);
                        }
                        _ => failed += 1,
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
