//! The floor scenario's commit timings against a real Postgres: the paced
//! loops keep their pace and every commit is timed; the relay's publishing
//! statement writes each event and is heard once per transaction.

use std::time::{Duration, Instant};

use eventrelay_bench::database::{create_schema, drop_schema, test_database_url, unique_schema};
use eventrelay_bench::report::Percentiles;
use eventrelay_bench::scenarios::floor;

#[tokio::test]
async fn paced_commits_keep_their_pace_and_the_publishing_statement_is_heard_each_time() {
    let url = test_database_url();
    let schema = unique_schema("bench_floor_commits");
    create_schema(&url, &schema).await.expect("schema migrates");
    let started = Instant::now();
    let paced = floor::paced_commit_time(&url, &schema, 20.0, 10).await;
    let paced_took = started.elapsed();
    let back_to_back = floor::commit_time(&url, &schema).await;
    let started = Instant::now();
    let announced = floor::announced_commit_time(&url, &schema, 20.0, 5).await;
    let announced_took = started.elapsed();
    let client = eventrelay::connect(&url).await.expect("connects");
    let written: i64 = client
        .query_one(
            &format!("SELECT count(*) FROM {schema}.outbox WHERE scope_key = 'floor-announced'"),
            &[],
        )
        .await
        .expect("counts the rows")
        .get(0);
    drop_schema(&url, &schema).await;
    let back_to_back = back_to_back.expect("the back-to-back commits run");
    // Each transaction's notification was awaited (a missing one fails the
    // call after ten seconds), so each was heard.
    let announced = announced.expect("every transaction commits and is heard");
    // Ten commits at 20 a second: the first at once, then one every 50 ms.
    assert!(
        paced_took >= Duration::from_millis(9 * 50),
        "{paced_took:?}"
    );
    assert!(
        announced_took >= Duration::from_millis(4 * 50),
        "{announced_took:?}"
    );
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
    assert!(
        figures.p50 <= figures.p99 && figures.p99 <= figures.max,
        "{figures:?}"
    );
}
