//! A short fan-out against an in-process relay: 20 subscribers for about a
//! second, every event received by every subscriber.

use std::time::Duration;

use eventrelay_bench::database::{create_schema, drop_schema, test_database_url, unique_schema};
use eventrelay_bench::publish::{Pace, Source};
use eventrelay_bench::scenarios::connection_heap::InProcessRelay;
use eventrelay_bench::scenarios::fanout::{self, FanoutPlan, Server};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_fan_out_reaches_every_subscriber() {
    let url = test_database_url();
    let schema = unique_schema("bench_smoke");
    create_schema(&url, &schema).await.expect("schema migrates");
    let relay = InProcessRelay::start(&url, &schema)
        .await
        .expect("relay starts");
    let plan = FanoutPlan {
        subscribers: 20,
        scope: "smoke-0".to_owned(),
        pace: Pace::PerSecond(20.0),
        duration: Duration::from_secs(1),
        writers: 2,
        source: Source::Emit {
            database_url: url.clone(),
            schema: schema.clone(),
        },
    };
    let server = Server::Eventrelay {
        address: relay.address,
        pids: vec![std::process::id()],
    };
    let figures = fanout::run(&plan, &server).await;
    // Stopping joins the relay's thread: do it off this runtime's workers.
    tokio::task::spawn_blocking(move || drop(relay))
        .await
        .unwrap();
    drop_schema(&url, &schema).await;
    let figures = figures.expect("the fan-out runs");
    assert!(figures.published >= 10, "{figures:?}");
    assert_eq!(figures.delivered, figures.expected, "{figures:?}");
    assert!(figures.deliveries_per_second > 0.0, "{figures:?}");
    // Each event's first receipt is one of its receipts: no later than
    // the median of them all, and never before its commit.
    assert!(figures.first_arrival.p50 > Duration::ZERO, "{figures:?}");
    assert!(
        figures.first_arrival.p50 <= figures.latency.p50,
        "{figures:?}"
    );
    assert!(
        figures.first_arrival.max <= figures.latency.max,
        "{figures:?}"
    );
}
