//! The floor scenario's commit timings against a real Postgres: the paced
//! loop keeps its pace, so a load's commits are timed as seldom as its
//! events come, and every commit is timed.

use std::time::{Duration, Instant};

use eventrelay_bench::database::{create_schema, drop_schema, test_database_url, unique_schema};
use eventrelay_bench::scenarios::floor;

#[tokio::test]
async fn paced_commits_keep_their_pace_and_each_is_timed() {
    let url = test_database_url();
    let schema = unique_schema("bench_floor_commits");
    create_schema(&url, &schema).await.expect("schema migrates");
    let started = Instant::now();
    let paced = floor::paced_commit_time(&url, &schema, 20.0, 10).await;
    let took = started.elapsed();
    let back_to_back = floor::commit_time(&url, &schema).await;
    drop_schema(&url, &schema).await;
    let paced = paced.expect("the paced commits run");
    let back_to_back = back_to_back.expect("the back-to-back commits run");
    // Ten commits at 20 a second: the first at once, then one every 50 ms.
    assert!(
        took >= Duration::from_millis(9 * 50),
        "10 commits at 20 a second took only {took:?}"
    );
    for figures in [paced, back_to_back.flushed, back_to_back.unflushed] {
        assert!(figures.p50 > Duration::ZERO, "{figures:?}");
        assert!(
            figures.p50 <= figures.p99 && figures.p99 <= figures.max,
            "{figures:?}"
        );
    }
}
