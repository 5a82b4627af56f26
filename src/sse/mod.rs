//! The SSE connection, whole: the `GET /v1/events` handler that admits a
//! subscriber ([`stream`]), the session that is its response body
//! ([`session`]), the per-subscriber connection cap ([`limiter`]) and the
//! check that finds a client that closed its side ([`peer`]).

pub mod limiter;
pub mod peer;
pub mod session;
pub mod stream;

pub use stream::stream_events;
