//! Several scopes per stream (`--only scopes`): the relay's RSS per idle
//! stream carrying 1, 4 and 16 scopes; fan-out p99 at 1,000 streams of 4
//! scopes against 4,000 streams of one (the same scopes, events and
//! deliveries), alternating; and the length of a stream's `id:` with 1, 4
//! and 16 busy scopes.

use std::time::Duration;

use futures_util::StreamExt;

use crate::BenchResult;
use crate::context::Context;
use crate::publish::Pace;
use crate::report::{Table, alternating, joined, median, size, verdict};
use crate::scenarios::fanout::{self, Carry, FanoutPlan, Server};

const SCOPE_COUNTS: [usize; 3] = [1, 4, 16];

fn plan(cx: &Context, scope: String, subscribers: usize, spread: (usize, Carry)) -> FanoutPlan {
    let quick = cx.args.quick;
    FanoutPlan {
        subscribers: if quick { subscribers / 5 } else { subscribers },
        scope,
        pace: Pace::PerSecond(100.0),
        duration: Duration::from_secs(if quick { 3 } else { 10 }),
        writers: 4,
        source: cx.emit_source(),
        spread,
    }
}

/// The `id:` of the last of 64 events published round-robin over `scopes`
/// scopes, on one stream carrying them all.
async fn id_length(cx: &Context, scopes: usize) -> BenchResult<usize> {
    let relay = cx.start_relay(cx.settings().in_own_session()).await?;
    let names: Vec<String> = (0..scopes).map(|k| format!("ids-{scopes}-{k}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let query: Vec<(&str, &str)> = refs.iter().map(|scope| ("scope", *scope)).collect();
    let http = reqwest::Client::new();
    let token = crate::token_for_scopes("ids", &refs, serde_json::Value::Null);
    let response = http
        .get(format!("{}/v1/events", relay.base))
        .query(&query)
        .bearer_auth(token)
        .send()
        .await?
        .error_for_status()?;
    let mut body = response.bytes_stream();
    let mut text = String::new();
    while !text.contains("event: ready") {
        text.push_str(&String::from_utf8_lossy(
            &body.next().await.ok_or("ended")??,
        ));
    }
    let events: Vec<serde_json::Value> = (0..64)
        .map(|n| serde_json::json!({"type": "bench.id", "scopeKey": names[n % scopes], "lane": "durable", "data": {}}))
        .collect();
    http.post(format!("{}/v1/events", relay.base))
        .bearer_auth(crate::PUBLISH_TOKEN)
        .json(&events)
        .send()
        .await?
        .error_for_status()?;
    let ids = |text: &str| text.lines().filter(|line| line.starts_with("id: ")).count();
    while ids(&text) < 64 {
        let chunk = tokio::time::timeout(Duration::from_secs(10), body.next()).await?;
        text.push_str(&String::from_utf8_lossy(&chunk.ok_or("ended")??));
    }
    let last = text
        .lines()
        .rev()
        .find_map(|line| line.strip_prefix("id: "));
    Ok(last.map_or(0, str::len))
}

pub async fn rows(cx: &Context, table: &mut Table) -> BenchResult<()> {
    let mut idle = Vec::new();
    for scopes in SCOPE_COUNTS {
        let relay = cx.start_relay(cx.settings().in_own_session()).await?;
        let mut quiet = plan(cx, format!("idle-{scopes}"), 2_000, (scopes, Carry::All));
        quiet.pace = Pace::PerSecond(10.0);
        quiet.duration = Duration::from_secs(2);
        let figures = fanout::run(&quiet, &Server::of(&relay)).await?;
        idle.push(figures.idle_rss_per_connection);
    }
    let shown: Vec<String> = idle.iter().map(|bytes| size(*bytes)).collect();
    table.add(
        "scopes: relay RSS per idle stream carrying 1 / 4 / 16 scopes (2,000 streams)",
        shown.join(" / "),
        format!(
            "16 scopes under 2× one: {}",
            verdict(idle[2] < 2.0 * idle[0])
        ),
    );

    let rounds = if cx.args.quick { 1 } else { 3 };
    let layouts = [(1_000, (4, Carry::All)), (4_000, (4, Carry::One))];
    let figures = alternating(rounds, 2, async |round, case| {
        let (subscribers, spread) = layouts[case];
        let relay = cx.start_relay(cx.settings().in_own_session()).await?;
        let scope = format!("fan-scopes-{round}-{case}");
        let f = fanout::run(&plan(cx, scope, subscribers, spread), &Server::of(&relay)).await?;
        if f.delivered != f.expected {
            return Err(format!("{} of {} delivered", f.delivered, f.expected).into());
        }
        Ok(f.latency.p99.as_secs_f64() * 1e3)
    })
    .await?;
    let p99 = [0, 1].map(|case| median(&figures[case]));
    table.add(
        format!("scopes: fan-out p99, 1,000 streams × 4 scopes against 4,000 streams × 1 (100 events/s over the 4 scopes, SQL emit), {rounds} alternating rounds"),
        format!("p99 {} ms ({:.2}×)", joined(&p99, 1, " / "), p99[0] / p99[1]),
        format!("within 1.5× of one scope per stream: {}", verdict(p99[0] <= 1.5 * p99[1])),
    );

    let mut lengths = Vec::new();
    for scopes in SCOPE_COUNTS {
        lengths.push(id_length(cx, scopes).await? as f64);
    }
    table.add(
        "scopes: `id:` length with 1 / 4 / 16 busy scopes (characters, on every durable frame)",
        joined(&lengths, 0, " / "),
        format!("16 scopes under 200: {}", verdict(lengths[2] < 200.0)),
    );
    Ok(())
}
