//! Fan-out (`--only fanout`): N SSE subscribers of one scope, events at a
//! fixed rate or unthrottled, against eventrelay or nchan: deliveries per
//! second, latency, server CPU per 1,000 deliveries, server RSS and idle
//! connections' RSS. The floor, wake-up, scopes and traces runs build on it.

use crate::context::Context;
use crate::report::{CommitLog, Percentiles, Table, ms, size, verdict};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value::Null;

use crate::BenchResult;
use crate::proc_stats::{self, Usage};
use crate::publish::{Pace, Source, publish_for};
use crate::sse_load::{ReadyWhen, StreamTarget, Subscribers, deliveries};

pub(crate) const CONNECT_CONCURRENCY: usize = 200;
pub(crate) const DRAIN_PATIENCE: Duration = Duration::from_secs(5);
const UNTHROTTLED_CAPACITY: usize = 1 << 21;

#[derive(Clone, Debug)]
pub enum Server {
    Eventrelay { address: SocketAddr, pids: Vec<u32> },
    Nchan { address: SocketAddr, pids: Vec<u32> },
}

impl Server {
    pub fn of(relay: &crate::relay_process::RelayProcess) -> Server {
        Server::Eventrelay {
            address: relay.address(),
            pids: vec![relay.pid()],
        }
    }

    pub(crate) fn pids(&self) -> &[u32] {
        match self {
            Server::Eventrelay { pids, .. } | Server::Nchan { pids, .. } => pids,
        }
    }

    pub(crate) fn target(&self, subscriber: usize, scope: &str) -> StreamTarget {
        self.target_of(subscriber, &[scope])
    }

    /// A stream of `scopes` (several: `?scope=` each).
    pub(crate) fn target_of(&self, subscriber: usize, scopes: &[&str]) -> StreamTarget {
        let token = || crate::token_for_scopes(&format!("s{subscriber}"), scopes, Null);
        let query: Vec<String> = scopes.iter().map(|s| format!("scope={s}")).collect();
        let path = match scopes.len() {
            1 => "/v1/events".to_owned(),
            _ => format!("/v1/events?{}", query.join("&")),
        };
        match self {
            Server::Eventrelay { address, .. } => StreamTarget {
                address: *address,
                path,
                authorization: Some(format!("Bearer {}", token())),
                ready_when: ReadyWhen::ReadyEvent,
            },
            Server::Nchan { address, .. } => StreamTarget {
                address: *address,
                path: "/sub".to_owned(),
                authorization: None,
                ready_when: ReadyWhen::HeadersEnd,
            },
        }
    }
}

#[derive(Clone)]
pub struct FanoutPlan {
    pub subscribers: usize,
    pub scope: String,
    pub pace: Pace,
    pub duration: Duration,
    pub writers: usize,
    pub source: Source,
    /// Over how many scopes (`<scope>-<k>`) events go, and whether each
    /// stream carries them all or one (stream `i` scope `i mod n`).
    pub spread: (usize, Carry),
}

/// What each stream of a fan-out spread over several scopes carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Carry {
    One,
    All,
}

/// One scope, the plain fan-out.
pub const ONE_SCOPE: (usize, Carry) = (1, Carry::One);

#[derive(Debug, Clone, Default)]
pub struct FanoutFigures {
    pub published: usize,
    pub expected: u64,
    pub delivered: u64,
    pub deliveries_per_second: f64,
    pub latency: Percentiles,
    /// Per event, the latency of its first receipt: when the server started
    /// writing it, apart from how long writing it to everyone took.
    pub first_arrival: Percentiles,
    pub cpu_seconds_per_1000: f64,
    pub system_seconds_per_1000: f64,
    pub rss_bytes: u64,
    /// (RSS with every subscriber connected and idle − RSS before) / N.
    pub idle_rss_per_connection: f64,
}

pub async fn run(plan: &FanoutPlan, server: &Server) -> BenchResult<FanoutFigures> {
    let capacity = match plan.pace {
        Pace::PerSecond(rate) => (rate * plan.duration.as_secs_f64()).ceil() as usize + 1,
        Pace::Unthrottled => UNTHROTTLED_CAPACITY,
    };
    let log = CommitLog::new(capacity);
    let (spread, carry) = plan.spread;
    let scopes: Vec<String> = match spread {
        1 => vec![plan.scope.clone()],
        _ => (0..spread).map(|k| format!("{}-{k}", plan.scope)).collect(),
    };
    let names: Vec<&str> = scopes.iter().map(String::as_str).collect();
    let targets = (0..plan.subscribers).map(|i| match carry {
        Carry::All => server.target_of(i, &names),
        Carry::One => server.target(i, names[i % spread]),
    });

    let before_connect = proc_stats::usage(server.pids());
    let subscribers =
        Subscribers::open(targets.collect(), Arc::clone(&log), CONNECT_CONCURRENCY).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle = proc_stats::usage(server.pids());

    let scope_of = Arc::new(move |number: usize| scopes[number % spread].clone());
    let (pace, duration, writers) = (plan.pace, plan.duration, plan.writers);
    let log_for = Arc::clone(&log);
    let published = publish_for(&plan.source, scope_of, pace, duration, writers, log_for).await?;
    let expected = match carry {
        Carry::All => (published * plan.subscribers) as u64,
        Carry::One => (0..plan.subscribers)
            .map(|i| (0..published).filter(|n| n % spread == i % spread).count() as u64)
            .sum(),
    };
    subscribers.wait_for(expected, DRAIN_PATIENCE).await;
    let after = proc_stats::usage(server.pids());
    let outcomes = subscribers.finish().await;

    let mut latencies = Vec::with_capacity(expected as usize);
    let mut first_arrivals = HashMap::with_capacity(published);
    let mut last_receipt = 0u64;
    for (number, at, latency) in deliveries(&outcomes, &log) {
        latencies.push(latency);
        let first = first_arrivals.entry(number).or_insert(latency);
        *first = (*first).min(latency);
        last_receipt = last_receipt.max(at);
    }
    let mut first_arrivals: Vec<u64> = first_arrivals.into_values().collect();
    let delivered = latencies.len() as u64;
    let span = last_receipt.saturating_sub(log.first_commit().unwrap_or(0)) as f64 / 1e9;
    let rate = delivered as f64 / span;
    Ok(FanoutFigures {
        published,
        expected,
        delivered,
        deliveries_per_second: if span > 0.0 { rate } else { 0.0 },
        latency: Percentiles::of(&mut latencies),
        first_arrival: Percentiles::of(&mut first_arrivals),
        cpu_seconds_per_1000: cpu_per_1000(idle, after, delivered),
        system_seconds_per_1000: per_1000(after.system_seconds - idle.system_seconds, delivered),
        rss_bytes: after.rss_bytes,
        idle_rss_per_connection: (idle.rss_bytes as f64 - before_connect.rss_bytes as f64)
            / plan.subscribers as f64,
    })
}

pub(crate) fn cpu_per_1000(before: Usage, after: Usage, delivered: u64) -> f64 {
    per_1000(after.cpu_seconds - before.cpu_seconds, delivered)
}

fn per_1000(seconds: f64, delivered: u64) -> f64 {
    if delivered == 0 {
        return 0.0;
    }
    seconds / delivered as f64 * 1000.0
}

/// Fan-out at one scope, eventrelay (emit, HTTP publish, the ephemeral lane
/// beside nchan) and nchan side by side, at fixed rates, then unthrottled.
/// Each lane runs on a fresh relay in a session of its own, as nginx does.
pub async fn rows(cx: &Context, table: &mut Table) -> BenchResult<()> {
    let nchan = cx.nchan();
    let (small, large) = (cx.scale.small_fanout, cx.scale.large_fanout);
    let (fixed, unthrottled) = (cx.scale.fixed_run, cx.scale.unthrottled_run);
    let runs = [
        (small, Pace::PerSecond(100.0), fixed, 4),
        (large, Pace::PerSecond(2.0), fixed, 4),
        (large, Pace::PerSecond(10.0), fixed, 4),
        (small, Pace::Unthrottled, unthrottled, 8),
        (small, Pace::Unthrottled, unthrottled, 64),
    ];
    for (run, (subscribers, pace, duration, writers)) in runs.into_iter().enumerate() {
        let pace_label = match pace {
            Pace::PerSecond(rate) => format!("{rate:.0} ev/s"),
            Pace::Unthrottled => format!("unthrottled ({writers} publishers)"),
        };
        let plan = |lane: &str, source: Source| FanoutPlan {
            subscribers,
            scope: format!("fan-{run}-{lane}-0"),
            pace,
            duration,
            writers,
            source,
            spread: ONE_SCOPE,
        };
        let mut ours = Vec::new();
        // SQL emit, then HTTP publish on each lane.
        for lane in [None, Some("durable"), Some("ephemeral")] {
            if lane == Some("ephemeral") && nchan.is_none() {
                break;
            }
            let relay = cx.start_relay(cx.settings().in_own_session()).await?;
            let source = lane.map_or_else(|| cx.emit_source(), |l| Source::http(&relay.base, l));
            eprintln!("fan-out {subscribers}, {pace_label}, {}", source.label());
            let scope = lane.unwrap_or("emit");
            let f = self::run(&plan(scope, source.clone()), &Server::of(&relay)).await?;
            let http = lane.is_some();
            let clock = ["commit-to-receive", "send-to-receive"][usize::from(http)];
            table.add(
                format!(
                    "eventrelay fan-out {subscribers} subs, 1 scope, {pace_label}, {} ({clock})",
                    source.label()
                ),
                fanout_summary(&f),
                fanout_target(subscribers, pace, http, &f),
            );
            if subscribers == large && !http {
                let per = f.idle_rss_per_connection;
                table.add(
                    format!(
                        "eventrelay idle connections: RSS per idle SSE connection at {subscribers}"
                    ),
                    size(per),
                    format!("≤ 16 KiB: {}", verdict(per <= 16.0 * 1024.0)),
                );
            }
            if http {
                ours.push((source.label(), f));
            }
        }
        let Some((address, server)) = &nchan else {
            continue;
        };
        eprintln!("fan-out {subscribers}, {pace_label}, nchan");
        let f = self::run(&plan("nchan", Source::nchan(*address)), server).await?;
        table.add(
            format!("nchan fan-out {subscribers} subs, 1 channel, {pace_label}, HTTP publish (send-to-receive)"),
            fanout_summary(&f),
            format!("all received: {}", verdict(f.delivered == f.expected)),
        );
        for (lane, ours) in ours {
            let ratio = ours.deliveries_per_second / f.deliveries_per_second.max(1.0);
            let (as_many, p99_below) = (ratio >= 0.995, ours.latency.p99 < f.latency.p99);
            let p50_near = ours.latency.p50.as_secs_f64() <= 1.2 * f.latency.p50.as_secs_f64();
            let (target, met) = if matches!(pace, Pace::Unthrottled) {
                ("≥ 1.5× nchan's, p99 below", ratio >= 1.5 && p99_below)
            } else if subscribers == large {
                ("deliveries/s ≥ nchan's, p99 below", as_many && p99_below)
            } else {
                (
                    "deliveries/s ≥ nchan's, p50 ≤ 1.2× nchan's",
                    as_many && p50_near,
                )
            };
            table.add(
                format!(
                    "side by side, {subscribers} subs, {pace_label}: eventrelay {lane} / nchan"
                ),
                format!("deliveries/s {ratio:.2}× · {}", against(&ours, &f)),
                format!("{target}: {}", verdict(met)),
            );
        }
    }
    Ok(())
}

pub fn against(ours: &FanoutFigures, theirs: &FanoutFigures) -> String {
    let (p50, p99) = (ms(ours.latency.p50), ms(ours.latency.p99));
    let (their_p50, their_p99) = (ms(theirs.latency.p50), ms(theirs.latency.p99));
    let (cpu, their_cpu) = (ours.cpu_seconds_per_1000, theirs.cpu_seconds_per_1000);
    format!(
        "p50 {p50} vs {their_p50} · p99 {p99} vs {their_p99} · CPU s/1k {cpu:.3} vs {their_cpu:.3}"
    )
}

fn fanout_target(subscribers: usize, pace: Pace, http: bool, f: &FanoutFigures) -> String {
    let all = f.delivered == f.expected;
    let (target, met) = match pace {
        Pace::PerSecond(rate) if subscribers == 1_000 && rate == 100.0 && !http => {
            let fast = f.latency.p50 <= Duration::from_millis(3)
                && f.latency.p99 <= Duration::from_millis(20);
            ("p50 ≤ 3 ms, p99 ≤ 20 ms", all && fast)
        }
        _ if subscribers == 10_000 && !http => ("10,000 subscribers on 2 cores, all received", all),
        _ => ("all received", all),
    };
    format!("{target}: {}", verdict(met))
}

pub fn fanout_summary(f: &FanoutFigures) -> String {
    let (delivered, expected, published) = (f.delivered, f.expected, f.published);
    let (rate, cpu) = (f.deliveries_per_second, f.cpu_seconds_per_1000);
    let (latency, rss) = (f.latency.summary(), size(f.rss_bytes as f64));
    format!(
        "{rate:.0} deliveries/s · {delivered} of {expected} received from {published} events · {latency} · {cpu:.3} CPU s per 1,000 deliveries · RSS {rss}"
    )
}
