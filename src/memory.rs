//! Hands memory that departed connections, and the requests that opened
//! the streams, freed back to the operating system.
//!
//! glibc's allocator keeps freed memory in its per-thread arenas. After a
//! wave of thousands of streams leaves, most of what they held is free but
//! still resident, scattered between live blocks, and the next wave does
//! not fit neatly into it: resident memory grows wave after wave. The same
//! happens on the way up: thousands of streams that connect at once each
//! hold a request in flight (its head, its token's claims, its wait for a
//! pooled connection) until they stream, and what those requests freed
//! stays resident between the streams' live blocks. So when the number of
//! open streams has fallen well below its recent high, or has risen well
//! above what it was at the last trim and stopped rising, the trimmer asks
//! the allocator to return every free page (`malloc_trim`), off the
//! runtime's threads. Other allocators return memory by themselves, so
//! elsewhere this does nothing.

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

/// Whether a surge of arrivals has settled: a tenth more streams than at
/// the last trim (and at least a few hundred), and the count rose by at
/// most a hundredth since the previous check, so the trim comes once the
/// requests of the surge are over rather than at every step of it.
fn arrivals_settled(at_last_trim: i64, previous: i64, now: i64) -> bool {
    let arrived = now - at_last_trim;
    arrived >= 256 && arrived * 10 >= now && (now - previous) * 100 <= now
}

/// Watches `open_streams` until the task is aborted.
pub async fn trim_after_surges(open_streams: Gauge) {
    let mut high = open_streams.get();
    let mut at_last_trim = high;
    let mut previous = high;
    let mut ticks = tokio::time::interval(CHECK_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let now = open_streams.get();
        if worth_trimming(high, now) || arrivals_settled(at_last_trim, previous, now) {
            high = now;
            at_last_trim = now;
            let _ = tokio::task::spawn_blocking(release_free_pages).await;
        } else {
            high = high.max(now);
        }
        previous = now;
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
    use super::{arrivals_settled, worth_trimming};

    #[test]
    fn trims_only_after_a_real_departure() {
        assert!(worth_trimming(10_000, 0));
        assert!(worth_trimming(10_000, 9_000));
        assert!(!worth_trimming(10_000, 9_100), "under a tenth left");
        assert!(!worth_trimming(300, 100), "too few to be worth a trim");
        assert!(!worth_trimming(0, 0));
    }

    #[test]
    fn trims_once_a_surge_of_arrivals_has_settled() {
        assert!(arrivals_settled(0, 10_000, 10_000));
        assert!(arrivals_settled(1_000, 9_950, 10_000), "rose under 1%");
        assert!(!arrivals_settled(0, 8_000, 10_000), "still rising");
        assert!(
            !arrivals_settled(9_500, 10_000, 10_000),
            "under a tenth more"
        );
        assert!(!arrivals_settled(0, 200, 200), "too few to be worth a trim");
        assert!(
            !arrivals_settled(10_000, 9_000, 9_000),
            "a fall is not an arrival"
        );
    }
}
