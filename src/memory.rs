//! Hands memory that departed connections freed back to the operating
//! system.
//!
//! glibc's allocator keeps freed memory in its per-thread arenas. After a
//! wave of thousands of streams leaves, most of what they held is free but
//! still resident, scattered between live blocks, and the next wave does
//! not fit neatly into it: resident memory grows wave after wave. When the
//! number of open streams has fallen well below its recent high, the
//! trimmer asks the allocator to return every free page (`malloc_trim`),
//! off the runtime's threads. Other allocators return memory by
//! themselves, so elsewhere this does nothing.

use std::time::Duration;

use prometheus_client::metrics::gauge::Gauge;

/// How often the stream count is compared with its recent high.
const CHECK_EVERY: Duration = Duration::from_millis(500);

/// Whether enough streams left since the last trim to be worth one: a tenth
/// of the high, and at least a few hundred (a trim walks every arena).
fn worth_trimming(high: i64, now: i64) -> bool {
    let left = high - now;
    left >= 256 && left * 10 >= high
}

/// Watches `open_streams` until the task is aborted.
pub async fn trim_after_departures(open_streams: Gauge) {
    let mut high = open_streams.get();
    let mut ticks = tokio::time::interval(CHECK_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let now = open_streams.get();
        if worth_trimming(high, now) {
            high = now;
            let _ = tokio::task::spawn_blocking(release_free_pages).await;
        } else {
            high = high.max(now);
        }
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn release_free_pages() {
    let started = std::time::Instant::now();
    // SAFETY: malloc_trim takes no pointers and only rearranges the
    // allocator's own free lists; it is safe to call from any thread.
    let released = unsafe { libc::malloc_trim(0) } == 1;
    tracing::debug!(released, took = ?started.elapsed(), "returned free memory to the system");
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn release_free_pages() {}

#[cfg(test)]
mod tests {
    use super::worth_trimming;

    #[test]
    fn trims_only_after_a_real_departure() {
        assert!(worth_trimming(10_000, 0));
        assert!(worth_trimming(10_000, 9_000));
        assert!(!worth_trimming(10_000, 9_100), "under a tenth left");
        assert!(!worth_trimming(300, 100), "too few to be worth a trim");
        assert!(!worth_trimming(0, 0));
    }
}
