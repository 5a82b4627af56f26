//! The service's integration tests, in one binary: a module per feature,
//! fixtures in `support`. Every test talks to a real Postgres in a schema
//! and channel of its own, and to the real server on port 0 over TCP, so
//! the tests run in parallel.
//!
//! Run one feature's tests with `cargo nextest run -E 'test(/^webhooks::/)'`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    reason = "test code: a panic is the test failing, and figures are printed for the reader"
)]

mod support;

mod browsers;
mod client;
mod deadlines;
mod docs;
mod faults;
mod logical;
mod operations;
mod packaging;
mod postgres;
mod publish;
mod relay;
mod sse;
mod webhooks;
