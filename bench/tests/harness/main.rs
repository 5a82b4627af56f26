//! Short runs of the load tool's scenarios against real relays, so that
//! `bench/run` is known to work without running it.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    reason = "test code: a panic is the test failing, and figures are printed for the reader"
)]

use eventrelay_bench::database::{create_schema, drop_schema, test_database_url, unique_schema};
use eventrelay_bench::publish::{Pace, Source};
use eventrelay_bench::relay_process::{RelayProcess, RelaySettings};
use eventrelay_bench::report::Percentiles;
use eventrelay_bench::scenarios::connection_heap::{self, InProcessRelay};
use eventrelay_bench::scenarios::fanout::{self, FanoutPlan, Server};
use eventrelay_bench::scenarios::floor;
use eventrelay_bench::scenarios::streams::{StormPlan, run_storm};
use std::path::PathBuf;
use std::time::{Duration, Instant};

fn relay_binary() -> PathBuf {
    eventrelay_bench::relay_process::test_relay_binary().unwrap()
}

/// A migrated schema of its own on the test database, and a work folder.
async fn fresh_schema(prefix: &str) -> (String, String, PathBuf) {
    let (url, schema) = (test_database_url(), unique_schema(prefix));
    create_schema(&url, &schema).await.expect("schema migrates");
    let work_dir = std::env::temp_dir().join(&schema);
    std::fs::create_dir_all(&work_dir).unwrap();
    (url, schema, work_dir)
}

/// The floor scenario's commit timings against a real Postgres: the paced
/// loops keep their pace and every commit is timed; the relay's publishing
/// statement writes each event and is heard once per transaction.
#[tokio::test]
async fn paced_commits_keep_their_pace_and_the_publishing_statement_is_heard_each_time() {
    let (url, schema, _) = fresh_schema("bench_floor_commits").await;
    let started = Instant::now();
    let paced = floor::timed_commits(&url, &schema, "on", 10, Some(20.0)).await;
    let paced_for = started.elapsed();
    let back_to_back = floor::commit_time(&url, &schema).await;
    let started = Instant::now();
    let announced = floor::announced_commit_time(&url, &schema, 20.0, 5).await;
    let heard_for = started.elapsed();
    let client = eventrelay::connect(&url).await.expect("connects");
    let count = format!("SELECT count(*) FROM {schema}.outbox WHERE scope_key = 'floor-announced'");
    let written: i64 = client.query_one(&count, &[]).await.expect("counts").get(0);
    drop_schema(&url, &schema).await;
    let back_to_back = back_to_back.expect("the back-to-back commits run");
    // Each transaction's notification was awaited (a missing one fails the
    // call after ten seconds), so each was heard.
    let announced = announced.expect("every transaction commits and is heard");
    // Ten commits at 20 a second: the first at once, then one every 50 ms.
    assert!(paced_for >= Duration::from_millis(450), "{paced_for:?}");
    assert!(heard_for >= Duration::from_millis(200), "{heard_for:?}");
    // The first write, which prepares the statements, and the five timed.
    assert_eq!(written, 6);
    let paced = paced.expect("the paced commits run");
    for figures in [paced, back_to_back.flushed, back_to_back.unflushed] {
        assert_timed(figures);
    }
    assert_timed(announced.committed);
    assert_timed(announced.heard);
}

/// Every sample took some time, and the percentiles are in order.
fn assert_timed(figures: Percentiles) {
    assert!(figures.p50 > Duration::ZERO, "{figures:?}");
    let in_order = figures.p50 <= figures.p99 && figures.p99 <= figures.max;
    assert!(in_order, "{figures:?}");
}

/// A short fan-out against an in-process relay, each event reaching all 20
/// subscribers for about a second; then 20 streams each carrying 3 scopes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_fan_out_reaches_every_subscriber() {
    let (url, schema, _) = fresh_schema("bench_smoke").await;
    let relay = InProcessRelay::start(&url, &schema).await.expect("starts");
    let server = Server::Eventrelay {
        address: relay.address,
        pids: vec![std::process::id()],
    };
    let mut figures = Vec::new();
    let spreads = [fanout::ONE_SCOPE, (3, fanout::Carry::All)];
    for (round, spread) in spreads.into_iter().enumerate() {
        let plan = FanoutPlan {
            subscribers: 20,
            scope: format!("smoke-{round}"),
            pace: Pace::PerSecond(20.0),
            duration: Duration::from_secs(1),
            writers: 2,
            source: Source::emit(&url, &schema),
            spread,
        };
        figures.push(fanout::run(&plan, &server).await);
    }
    connection_heap::stop(relay).await.unwrap();
    drop_schema(&url, &schema).await;
    for figures in figures {
        let f = figures.expect("the fan-out runs");
        assert!(f.published >= 10, "{f:?}");
        assert_eq!(f.delivered, f.expected, "{f:?}");
        assert!(f.deliveries_per_second > 0.0, "{f:?}");
        // Each event's first receipt is one of its receipts: no later than
        // the median of them all, and never before its commit.
        assert!(f.first_arrival.p50 > Duration::ZERO, "{f:?}");
        assert!(f.first_arrival.p50 <= f.latency.p50, "{f:?}");
        assert!(f.first_arrival.max <= f.latency.max, "{f:?}");
    }
}

fn session_of(pid: u32) -> i32 {
    // SAFETY: getsid only reads the kernel's record of a process.
    unsafe { libc::getsid(pid as i32) }
}

/// A side-by-side relay runs in a session of its own (as nginx does), so the
/// kernel's autogroup scheduling does not count it with the load tool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_started_in_its_own_session_leads_it_and_one_started_plainly_shares_ours() {
    let (url, schema, work_dir) = fresh_schema("bench_session").await;
    let ours = session_of(std::process::id());

    let (binary, settings) = (relay_binary(), RelaySettings::new(&url, &schema));
    let apart = RelayProcess::start(&binary, &work_dir, &settings.clone().in_own_session()).await;
    let plain = RelayProcess::start(&binary, &work_dir, &settings).await;
    let ids = |relay: &RelayProcess| (relay.pid() as i32, session_of(relay.pid()));
    let sessions = match (&apart, &plain) {
        (Ok(apart), Ok(plain)) => Some((ids(apart), ids(plain))),
        _ => None,
    };
    drop((apart, plain));
    drop_schema(&url, &schema).await;
    let ((pid, apart_sid), (_, plain_sid)) = sessions.expect("both relays start");
    assert_eq!(apart_sid, pid, "the relay leads a session of its own");
    assert_ne!(apart_sid, ours);
    assert_eq!(plain_sid, ours, "without it, the relay stays in ours");
}

/// A reconnect storm of 1,000 subscribers (`--only storm` runs 10,000): all
/// stream again after a SIGTERM and a restart on the port, with no 408 or 5xx
/// and no event missed; so does a second wave arriving as the first leaves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_subscribers_ride_out_a_restart_and_a_second_wave() {
    let (url, schema, work_dir) = fresh_schema("bench_storm").await;
    let plan = StormPlan {
        subscribers: 1_000,
        scopes: 10,
        events_per_sec: 40.0,
        emitting: Duration::from_secs(6),
        extra_waves: 1,
    };
    let settings = RelaySettings::new(&url, &schema);
    let client_bin = std::path::Path::new(env!("CARGO_BIN_EXE_eventrelay-bench"));
    let figures = run_storm(&plan, &relay_binary(), client_bin, &work_dir, &settings).await;
    drop_schema(&url, &schema).await;
    let f = figures.expect("the storm runs");
    println!("STORM: {f:#?}");
    let log = std::fs::read_dir(&work_dir)
        .unwrap()
        .filter_map(Result::ok)
        .filter(|entry| entry.path().extension().is_some_and(|e| e == "log"))
        .map(|entry| std::fs::read_to_string(entry.path()).unwrap_or_default())
        .collect::<String>();
    let (first, wave) = (&f.first, &f.waves[0]);
    assert!(first.clean(), "first connect: {first:?}\n{log}");
    // All back with no 408, 5xx or other refusal; resets in the restart's
    // handshakes (none to 35 of 1,000 between runs) are printed, not asserted.
    let restart = &f.restart;
    assert!(
        restart.all_streaming_after.is_some()
            && restart.figures.timeouts == 0
            && restart.figures.server_errors == 0
            && restart.figures.other_refusals == 0,
        "after the restart: {restart:?}\n{log}"
    );
    assert!(f.emitted >= 100, "{f:?}");
    assert_eq!(f.missed, 0, "events missed across the restart");
    assert!(wave.clean(), "second wave: {wave:?}\n{log}");
    assert!(!log.contains("panicked"), "{log}");
    let _ = std::fs::remove_dir_all(&work_dir);
}
