//! The SSE connection, whole: the `GET /v1/events` handler that admits a
//! subscriber ([`stream`]), the session that is its response body
//! ([`session`]), and the check that finds a client that closed its side
//! ([`peer`]), and the registry of this relay's open streams
//! ([`registry`]), which holds the per-subscriber connection cap, the
//! listing the admin API shows and the operator's disconnections, and the
//! reads opening streams share ([`shared_reads`]); a request's subscriber
//! credentials, resolved ([`credentials`]); and the scopes a stream
//! carries, with what a stream of several keeps per scope ([`scopes`]).
//!
//! The session is a stream, not an actor, on purpose: an actix actor per
//! connection, speaking the same protocol, measured 2.5 KiB more per idle
//! connection and a p99 1.09× as long with 10,000 subscribers.

pub mod credentials;
pub mod peer;
pub mod registry;
pub mod scopes;
pub mod session;
pub mod shared_reads;
pub mod stream;

pub use stream::stream_events;
