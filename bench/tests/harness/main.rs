//! Short runs of the load tool's scenarios against real relays, so that
//! `bench/run` is known to work without running it.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    reason = "test code: a panic is the test failing, and figures are printed for the reader"
)]

mod floor_commits;
mod http1_fanout;
mod own_session;
mod restart_storm;

use std::path::PathBuf;

fn relay_binary() -> PathBuf {
    eventrelay_bench::relay_process::test_relay_binary().unwrap()
}
