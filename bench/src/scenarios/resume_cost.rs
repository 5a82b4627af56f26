//! What a resume costs: one writer commits durable events into a scope at
//! a steady pace (and into other scopes besides, so seqs advance as they
//! do under load), while a subscriber of the scope keeps dropping its
//! stream and resuming with the last `id:` it saw, as a browser does. Per
//! resume it counts the events sent again before `ready` (already
//! delivered), and whether any committed event never arrived. Run against
//! two relay binaries, it shows what exact resume costs in re-sent events
//! against a fixed look-back.

use crate::context::Context;
use crate::report::{Table, verdict};
use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use eventrelay_client::sse::{SseItem, SseParser};
use futures_util::StreamExt;
use uuid::Uuid;

use crate::BenchResult;
use crate::database::{drop_schema, unique_schema};
use crate::relay_process::{RelayProcess, RelaySettings};

/// Events per second into the watched scope, and into the others.
const WATCHED_RATE: u64 = 100;
const OTHER_RATE: u64 = 400;
/// How long each stream lasts before it is dropped, and the time away.
const CONNECTED: Duration = Duration::from_millis(1_500);
const AWAY: Duration = Duration::from_millis(200);

#[derive(Debug, Clone)]
pub struct ResumeFigures {
    pub resumes: usize,
    /// Events sent again per resume: mean and most.
    pub resent_mean: f64,
    pub resent_max: usize,
    /// Committed events of the scope the subscriber never received.
    pub missed: usize,
}

/// Resumes `resumes` times against `relay`, whose schema is `schema`.
pub async fn run(
    relay: &RelayProcess,
    database_url: &str,
    schema: &str,
    resumes: usize,
) -> BenchResult<ResumeFigures> {
    let stop = Arc::new(AtomicBool::new(false));
    let written = tokio::spawn(write(
        database_url.to_owned(),
        schema.to_owned(),
        Arc::clone(&stop),
    ));
    let http = reqwest::Client::new();
    let token = crate::subscriber_token("resumer", "resume-watched");
    let mut seen: HashSet<Uuid> = HashSet::new();
    let mut last_id: Option<String> = None;
    let mut resent = Vec::new();
    for round in 0..=resumes {
        let mut request = http
            .get(format!("{}/v1/events", relay.base))
            .bearer_auth(&token);
        if let Some(id) = &last_id {
            request = request.header("last-event-id", id);
        }
        let response = request.send().await?.error_for_status()?;
        let mut body = response.bytes_stream();
        let mut parser = SseParser::new();
        let (mut ready, mut again) = (false, 0);
        let until = Instant::now() + CONNECTED;
        while let Ok(Some(chunk)) = tokio::time::timeout_at(until.into(), body.next()).await {
            for item in parser.feed(&chunk?) {
                let SseItem::Event(event) = item else {
                    continue;
                };
                if event.event_type == "ready" {
                    ready = true;
                    continue;
                }
                let envelope: serde_json::Value = serde_json::from_str(&event.data)?;
                let Some(id) = envelope["id"].as_str().and_then(|id| id.parse().ok()) else {
                    continue;
                };
                if !seen.insert(id) && !ready {
                    again += 1;
                }
                if event.id.is_some() {
                    last_id = event.id;
                }
            }
        }
        if round > 0 {
            resent.push(again);
        }
        drop(body);
        tokio::time::sleep(AWAY).await;
    }
    stop.store(true, Ordering::Relaxed);
    let committed = written.await??;
    // What committed in the scope while the subscriber came and went, and
    // never arrived (the last second's may still be in flight: not counted).
    let missed = committed.iter().filter(|id| !seen.contains(id)).count();
    Ok(ResumeFigures {
        resumes,
        resent_mean: resent.iter().sum::<usize>() as f64 / resent.len().max(1) as f64,
        resent_max: resent.iter().copied().max().unwrap_or(0),
        missed,
    })
}

/// Commits at the scenario's pace until `stop`; answers the ids written to
/// the watched scope, except the last second's.
async fn write(url: String, schema: String, stop: Arc<AtomicBool>) -> BenchResult<Vec<Uuid>> {
    let client = eventrelay::connect(&url).await?;
    let statement =
        format!("SELECT {schema}.emit($1::text, $2::text, '{{}}'::jsonb, NULL, '{{}}', $3::uuid)");
    let per_tick = (WATCHED_RATE + OTHER_RATE) / 100;
    let mut ticks = tokio::time::interval(Duration::from_millis(10));
    let mut written = Vec::new();
    let mut n: u64 = 0;
    while !stop.load(Ordering::Relaxed) {
        ticks.tick().await;
        for _ in 0..per_tick {
            n += 1;
            let watched = n % (per_tick * 100 / (WATCHED_RATE.max(1))).max(1) == 0;
            let scope = if watched {
                "resume-watched".to_owned()
            } else {
                format!("resume-other-{}", n % 7)
            };
            let id = Uuid::from_u128(fastrand::u128(..));
            client
                .execute(&statement, &[&"bench.resume", &scope, &id])
                .await?;
            if watched {
                written.push((Instant::now(), id));
            }
        }
    }
    let settled = Instant::now() - Duration::from_secs(1);
    Ok(written
        .into_iter()
        .filter(|(at, _)| *at < settled)
        .map(|(_, id)| id)
        .collect())
}

/// Resumes against this build, and against an earlier release when given.
pub async fn rows(cx: &Context, table: &mut Table) -> BenchResult<()> {
    let db = cx.db();
    // Each relay in a schema of its own, which it migrates at start;
    // the earlier release beside this one when BASELINE_REV names it.
    let mut relays = vec![("this build", cx.args.relay_bin.clone(), false)];
    if let Some(binary) = &cx.args.baseline_relay_bin {
        relays.push(("the earlier release", binary.clone(), true));
    }
    for (label, binary, baseline) in relays {
        eprintln!("resumes against {label}");
        let schema = unique_schema("bench_resume");
        let mut settings = RelaySettings::new(db, &schema);
        settings.baseline = baseline;
        let relay = RelayProcess::start(&binary, &cx.args.work_dir, &settings).await?;
        let f = run(&relay, db, &schema, 20).await;
        drop(relay);
        drop_schema(db, &schema).await;
        let f = f?;
        table.add(
            format!(
                "{} resumes after 200 ms away, 100 of 500 events/s in the scope, {label}",
                f.resumes
            ),
            format!(
                "{:.1} events sent again per resume (at most {}), {} missed",
                f.resent_mean, f.resent_max, f.missed
            ),
            format!("none missed: {}", verdict(f.missed == 0)),
        );
    }
    Ok(())
}
