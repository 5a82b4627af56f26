//! The load tool's own tests, in one binary: short runs of its scenarios
//! against real relays, so `bench/run` is known to work without running it.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    reason = "test code: a panic is the test failing, and figures are printed for the reader"
)]

mod campaign;
mod floor_commits;
mod http1_fanout;
mod http2_fanout;
mod own_session;
mod restart_storm;

use std::path::PathBuf;

/// The relay binary the workspace's test build made, next to this test's
/// own directory (`target/<profile>/eventrelay`), or `EVENTRELAY_BIN`.
fn relay_binary() -> PathBuf {
    if let Ok(path) = std::env::var("EVENTRELAY_BIN") {
        return PathBuf::from(path);
    }
    let test = std::env::current_exe().unwrap();
    let profile_dir = test.parent().and_then(|deps| deps.parent()).unwrap();
    let binary = profile_dir.join("eventrelay");
    assert!(
        binary.exists(),
        "no relay binary at {}: build the workspace's tests (`cargo nextest run --workspace`) \
         or set EVENTRELAY_BIN",
        binary.display()
    );
    binary
}
