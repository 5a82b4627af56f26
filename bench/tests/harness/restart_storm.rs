//! A reconnect storm against the relay binary: 1,000 subscribers streaming
//! with a `Last-Event-ID`, the relay stopped with SIGTERM and started again
//! on the same port while durable events keep being emitted. Every
//! subscriber streams again with no 408 and no 5xx, none misses an
//! event, and a second wave of 1,000 arriving while the first hangs up is
//! served the same way. Resets during the restart are reported, not
//! asserted (see the assertion). `bench/run --only storm` runs it with
//! 10,000.

use std::time::Duration;

use eventrelay_bench::database::{create_schema, drop_schema, test_database_url, unique_schema};
use eventrelay_bench::relay_process::RelaySettings;
use eventrelay_bench::scenarios::storm::{self, StormPlan};

use crate::relay_binary;

/// Subscribers in the storm, and in each wave.
const SUBSCRIBERS: usize = 1_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_subscribers_ride_out_a_restart_and_a_second_wave() {
    let url = test_database_url();
    let schema = unique_schema("bench_storm");
    create_schema(&url, &schema).await.expect("schema migrates");
    let work_dir = std::env::temp_dir().join(&schema);
    std::fs::create_dir_all(&work_dir).unwrap();
    let plan = StormPlan {
        subscribers: SUBSCRIBERS,
        scopes: 10,
        events_per_sec: 40.0,
        emitting: Duration::from_secs(6),
        extra_waves: 1,
    };
    let settings = RelaySettings::new(&url, &schema);
    let client_bin = std::path::Path::new(env!("CARGO_BIN_EXE_eventrelay-bench"));
    let figures = storm::run(&plan, &relay_binary(), client_bin, &work_dir, &settings).await;
    drop_schema(&url, &schema).await;
    let figures = figures.expect("the storm runs");
    println!("STORM: {figures:#?}");
    let log = std::fs::read_dir(&work_dir)
        .unwrap()
        .filter_map(Result::ok)
        .filter(|entry| entry.path().extension().is_some_and(|e| e == "log"))
        .map(|entry| std::fs::read_to_string(entry.path()).unwrap_or_default())
        .collect::<String>();
    assert!(
        figures.first.clean(),
        "first connect: {:?}\n{log}",
        figures.first
    );
    // Every subscriber is back with no 408, 5xx or other refusal. Some
    // connections are reset during the restart's handshakes, an open
    // problem (from none to 35 of 1,000 between runs; `bench/README.md`
    // has the figures): they are printed above, not asserted.
    let restart = &figures.restart;
    assert!(
        restart.all_streaming_after.is_some()
            && restart.figures.timeouts == 0
            && restart.figures.server_errors == 0
            && restart.figures.other_refusals == 0,
        "after the restart: {restart:?}\n{log}"
    );
    assert!(figures.emitted >= 100, "{figures:?}");
    assert_eq!(figures.missed, 0, "events missed across the restart");
    assert!(
        figures.waves[0].clean(),
        "second wave: {:?}\n{log}",
        figures.waves[0]
    );
    assert!(!log.contains("panicked"), "{log}");
    let _ = std::fs::remove_dir_all(&work_dir);
}
