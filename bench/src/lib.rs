//! The eventrelay load tool as a library: the scenarios and the pieces they
//! share. The `eventrelay-bench` binary runs them; the tests in
//! `tests/harness/` and the fault campaign use them too.

pub mod alloc_counter;
pub mod context;
pub mod database;
pub mod proc_stats;
pub mod publish;
pub mod relay_process;
pub mod report;
pub mod scenarios;
pub mod sse_load;
pub mod stream_client;

/// Errors are reported, not handled: a tool, not a library.
pub type BenchResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

pub const SUBSCRIBER_SECRET: &str = "bench-secret-that-is-long-enough-for-hs256-signing";
pub const PUBLISH_TOKEN: &str = "bench-publish-token-long-enough";

/// A subscriber token for `scope` with `grants` (`Value::Null`: none).
pub fn subscriber_token(subscriber: &str, scope: &str, grants: serde_json::Value) -> String {
    token_for_scopes(subscriber, &[scope], grants)
}

/// A subscriber token granting `scopes` (at least one).
#[allow(
    clippy::expect_used,
    reason = "HS256 with a constant secret long enough for it always mints"
)]
pub fn token_for_scopes(subscriber: &str, scopes: &[&str], grants: serde_json::Value) -> String {
    use eventrelay::auth::{Algorithm, MintOptions, TokenSpec, mint_token};
    let (scope, more) = scopes.split_first().expect("a token grants a scope");
    mint_token(
        SUBSCRIBER_SECRET,
        Algorithm::HS256,
        &TokenSpec {
            subscriber_id: subscriber.into(),
            scope_key: (*scope).into(),
            more_scopes: more.iter().map(|scope| scope.to_string()).collect(),
            grants,
            ttl: std::time::Duration::from_secs(3600),
        },
        &MintOptions::default(),
    )
    .expect("the bench secret mints tokens")
}
