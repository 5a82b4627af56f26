//! Tracing's cost (`--only traces`): HTTP publish throughput (64 publishers)
//! and fan-out p99 at 1,000 streams × 100 events/s over HTTP, on fresh relays
//! tracing off, at 1% and at 100% into a local OTLP sink; alternating rounds.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::TcpListener;

use crate::BenchResult;
use crate::context::Context;
use crate::publish::{Pace, Source};
use crate::report::{Table, alternating, joined, median_of, verdict};
use crate::scenarios::fanout::{self, FanoutPlan, Server};
use crate::scenarios::publish_throughput::{http_publish, serve_ok};

const RATIOS: [Option<f64>; 3] = [None, Some(0.01), Some(1.0)];

/// Takes OTLP/HTTP exports and throws them away.
async fn otlp_sink() -> BenchResult<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    serve_ok(listener, Duration::ZERO, |_| {});
    Ok(address)
}

/// Publish events/s and fan-out p99 (ms) on a relay tracing at `ratio`.
async fn measure(cx: &Context, sink: SocketAddr, ratio: Option<f64>) -> BenchResult<[f64; 2]> {
    let mut settings = cx.settings().in_own_session();
    if let Some(ratio) = ratio {
        settings.extra_toml = format!(
            "\n[telemetry]\notlp_endpoint = \"http://{sink}\"\nsample_ratio = {ratio}\nexport_delay_ms = 1000\n"
        );
    }
    let relay = cx.start_relay(settings).await?;
    let (seconds, subscribers) = if cx.args.quick { (3, 200) } else { (10, 1_000) };
    let duration = Duration::from_secs(seconds);
    let publish = http_publish(relay.address(), 64, duration).await?;
    let plan = FanoutPlan {
        subscribers,
        scope: "trace-bench".into(),
        pace: Pace::PerSecond(100.0),
        duration,
        writers: 1,
        source: Source::http(&relay.base, "durable"),
        spread: fanout::ONE_SCOPE,
    };
    let p99 = fanout::run(&plan, &Server::of(&relay)).await?.latency.p99;
    Ok([publish.events_per_second, p99.as_secs_f64() * 1e3])
}

pub async fn rows(cx: &Context, table: &mut Table) -> BenchResult<()> {
    let sink = otlp_sink().await?;
    let rounds = if cx.args.quick { 1 } else { 3 };
    let figures = alternating(rounds, 3, async |_, case| {
        measure(cx, sink, RATIOS[case]).await
    })
    .await?;
    let [publish, p99] = [0, 1].map(|i| [0, 1, 2].map(|case| median_of(&figures[case], |f| f[i])));
    let [publish_cost, p99_cost] = [publish, p99].map(|f| f[1] / f[0]);
    table.add(
        format!("traces: HTTP publish (64 publishers) and fan-out p99 at 1,000 × 100/s over HTTP, tracing off / 1% / 100% to a local OTLP sink, {rounds} alternating rounds"),
        format!("publish {} events/s ({publish_cost:.3}× at 1%) · fan-out p99 {} ms ({p99_cost:.2}× at 1%)", joined(&publish, 0, " / "), joined(&p99, 1, " / ")),
        format!("at 1%, under 5% cost: {}", verdict(publish_cost >= 0.95 && p99_cost <= 1.05)),
    );
    Ok(())
}
