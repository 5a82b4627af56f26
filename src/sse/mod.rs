//! The SSE connection, whole: the `GET /v1/events` handler that admits a
//! subscriber ([`stream`]), the session that is its response body
//! ([`session`]), and the check that finds a client that closed its side
//! ([`peer`]). The per-subscriber connection cap is the scope's hub's
//! decision, taken when the session attaches.

pub mod peer;
pub mod session;
pub mod session_actor;
pub mod stream;

pub use stream::stream_events;
