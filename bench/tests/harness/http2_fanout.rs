//! The HTTP/2 fan-out path of the load tool against an in-process relay
//! serving TLS: 20 subscribers as streams over two HTTP/2 connections for
//! about a second, every event received by every subscriber. The full
//! comparison with HTTP/1.1 is `bench/run --only http2`, never run here.

use std::time::Duration;

use eventrelay_bench::database::{create_schema, drop_schema, test_database_url, unique_schema};
use eventrelay_bench::in_process::InProcessRelay;
use eventrelay_bench::publish::{Pace, Source};
use eventrelay_bench::scenarios::fanout::{self, FanoutPlan, Server};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_fan_out_over_http2_reaches_every_subscriber() {
    let url = test_database_url();
    let schema = unique_schema("bench_h2");
    create_schema(&url, &schema).await.expect("schema migrates");
    let certified = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()]).unwrap();
    let dir = std::env::temp_dir().join(format!("{schema}-tls"));
    std::fs::create_dir_all(&dir).unwrap();
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&cert, certified.cert.pem()).unwrap();
    std::fs::write(&key, certified.key_pair.serialize_pem()).unwrap();
    let relay = InProcessRelay::start_with(&url, &schema, |config| {
        config.http.tls.cert_file = Some(cert);
        config.http.tls.key_file = Some(key);
    })
    .await
    .expect("relay starts");
    let plan = FanoutPlan {
        subscribers: 20,
        scopes: 1,
        scope_prefix: "smoke-h2".to_owned(),
        pace: Pace::PerSecond(20.0),
        duration: Duration::from_secs(1),
        writers: 2,
        source: Source::Emit {
            database_url: url.clone(),
            schema: schema.clone(),
        },
    };
    let server = Server::EventrelayTls {
        address: relay.address,
        pids: vec![std::process::id()],
        http2_streams_per_connection: Some(10),
    };
    let figures = fanout::run(&plan, &server).await;
    // Stopping joins the relay's thread: do it off this runtime's workers.
    tokio::task::spawn_blocking(move || drop(relay))
        .await
        .unwrap();
    drop_schema(&url, &schema).await;
    let _ = std::fs::remove_dir_all(&dir);
    let figures = figures.expect("the fan-out runs over HTTP/2");
    assert!(figures.published >= 10, "{figures:?}");
    assert_eq!(figures.delivered, figures.expected, "{figures:?}");
}
