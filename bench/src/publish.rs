//! Event sources that put numbered bench events in front of subscribers:
//! an emit committed in Postgres, eventrelay's HTTP publish API, and nchan's
//! publisher endpoint. Each stamps the event on the shared clock: after
//! COMMIT returned for an emit, just before the request for HTTP publishing.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use eventrelay_publisher::{NewEvent, Publisher};
use serde_json::{Value, json};

use crate::report::CommitLog;
use crate::{BenchResult, PUBLISH_TOKEN};

pub const TICK_TYPE: &str = "bench.tick";
/// Padding that brings an event's data to about 100 bytes.
const PAD: &str =
    "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx";

#[derive(Clone)]
pub enum Source {
    Emit {
        database_url: String,
        schema: String,
    },
    /// `POST /v1/events` on a relay, on `lane` (`durable` or `ephemeral`).
    HttpPublish {
        base: String,
        lane: &'static str,
    },
    Nchan {
        url: String,
    },
    /// Two sources taking turns in slices of `slice` events (see [`slice_side`]),
    /// so that both see the same stretch of the run.
    Alternating {
        sources: Box<[Source; 2]>,
        slice: usize,
    },
}

impl Source {
    pub fn emit(database_url: &str, schema: &str) -> Source {
        Source::Emit {
            database_url: database_url.to_owned(),
            schema: schema.to_owned(),
        }
    }

    pub fn http(base: &str, lane: &'static str) -> Source {
        let base = base.to_owned();
        Source::HttpPublish { base, lane }
    }

    pub fn nchan(address: SocketAddr) -> Source {
        let url = format!("http://{address}/pub");
        Source::Nchan { url }
    }

    pub fn label(&self) -> &'static str {
        match self {
            Source::Emit { .. } => "emit (Postgres commit)",
            Source::HttpPublish {
                lane: "ephemeral", ..
            } => "HTTP publish, ephemeral lane",
            Source::HttpPublish { .. } => "HTTP publish",
            Source::Nchan { .. } => "nchan HTTP publish",
            Source::Alternating { sources, .. } => sources[0].label(),
        }
    }
}

/// Which of two sources taking turns in slices of `slice` events publishes
/// event `number`: A B, then B A, so neither always goes first in a pair.
pub fn slice_side(number: usize, slice: usize) -> usize {
    let index = number / slice.max(1);
    (index ^ (index >> 1)) & 1
}

#[derive(Clone, Copy, Debug)]
pub enum Pace {
    /// This many events per second, on a fixed schedule.
    PerSecond(f64),
    /// As fast as the writers can, each waiting for its previous event.
    Unthrottled,
}

pub fn event_data(number: usize) -> Value {
    json!({ "bn": number, "pad": PAD })
}

/// Bench event `number`, durable, in `scope`.
pub fn tick(scope: &str, number: usize) -> NewEvent {
    NewEvent::durable(TICK_TYPE, scope, event_data(number))
}

/// Publishes numbered events for `duration` with `writers` concurrent
/// writers; `scope_of` names each event's scope. Returns how many committed.
pub async fn publish_for(
    source: &Source,
    scope_of: Arc<dyn Fn(usize) -> String + Send + Sync>,
    pace: Pace,
    duration: Duration,
    writers: usize,
    log: Arc<CommitLog>,
) -> BenchResult<usize> {
    let start = tokio::time::Instant::now();
    let deadline = start + duration;
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..writers {
        let mut writer = Writer::open(source).await?;
        let (next, log) = (Arc::clone(&next), Arc::clone(&log));
        let scope_of = Arc::clone(&scope_of);
        tasks.push(tokio::spawn(async move {
            let mut published = 0usize;
            loop {
                let number = next.fetch_add(1, Ordering::Relaxed);
                if number >= log.capacity() {
                    break;
                }
                if let Pace::PerSecond(rate) = pace {
                    let due = start + Duration::from_secs_f64(number as f64 / rate);
                    if due >= deadline {
                        break;
                    }
                    tokio::time::sleep_until(due).await;
                } else if tokio::time::Instant::now() >= deadline {
                    break;
                }
                writer.publish(number, &scope_of(number), &log).await?;
                published += 1;
            }
            BenchResult::Ok(published)
        }));
    }
    let counts = futures_util::future::join_all(tasks).await;
    counts.into_iter().map(|t| -> BenchResult<_> { t? }).sum()
}

enum Writer {
    Emit {
        client: Box<tokio_postgres::Client>,
        publisher: Publisher,
    },
    /// To a relay, on its lane, or to nchan (`None`).
    Http {
        client: reqwest::Client,
        url: String,
        lane: Option<&'static str>,
    },
    Alternating {
        writers: Box<[Writer; 2]>,
        slice: usize,
    },
}

impl Writer {
    async fn open(source: &Source) -> BenchResult<Writer> {
        Ok(match source {
            Source::Alternating { sources, slice } => {
                let [first, second] = &**sources;
                let first = Box::pin(Writer::open(first)).await?;
                let second = Box::pin(Writer::open(second)).await?;
                Writer::Alternating {
                    writers: Box::new([first, second]),
                    slice: *slice,
                }
            }
            Source::Emit {
                database_url,
                schema,
            } => Writer::Emit {
                client: Box::new(eventrelay::connect(database_url).await?),
                publisher: Publisher::new(schema)?,
            },
            Source::HttpPublish { base, lane } => {
                Writer::http(format!("{base}/v1/events"), Some(*lane))
            }
            Source::Nchan { url } => Writer::http(url.clone(), None),
        })
    }

    fn http(url: String, lane: Option<&'static str>) -> Writer {
        let client = reqwest::Client::new();
        Writer::Http { client, url, lane }
    }

    async fn publish(&mut self, number: usize, scope: &str, log: &CommitLog) -> BenchResult<()> {
        match self {
            Writer::Alternating { writers, slice } => {
                let writer = &mut writers[slice_side(number, *slice)];
                Box::pin(writer.publish(number, scope, log)).await?;
            }
            Writer::Emit { client, publisher } => {
                let transaction = client.transaction().await?;
                publisher.emit(&transaction, tick(scope, number)).await?;
                transaction.commit().await?;
                log.record(number, log.now());
            }
            Writer::Http { client, url, lane } => {
                let post = client.post(url.as_str());
                let request = match lane {
                    // The same bytes a browser would get from eventrelay.
                    None => {
                        let mut envelope = tick(scope, number).into_envelope(chrono::Utc::now());
                        envelope.seq = Some(number as i64);
                        post.body(serde_json::to_vec(&envelope)?)
                    }
                    Some(lane) => post.bearer_auth(PUBLISH_TOKEN).json(&json!({
                        "type": TICK_TYPE,
                        "scopeKey": scope,
                        "lane": *lane,
                        "data": event_data(number),
                    })),
                };
                log.record(number, log.now());
                let response = request.send().await?;
                let status = response.status();
                if !status.is_success() {
                    let body = response.text().await.unwrap_or_default();
                    return Err(format!("publish answered {status}: {body}").into());
                }
            }
        }
        Ok(())
    }
}
