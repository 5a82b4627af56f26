//! A Rust client for the eventrelay event stream (`GET /v1/events`).
//!
//! It does what the browser client does, for services: builds its request
//! on every connect (so credentials are fresh), replays from a durable-only
//! `Last-Event-ID` watermark after a reconnect, backs off with full jitter
//! (from the relay's `retry:`), reports `connecting`, `connected`,
//! `reconnecting`, `degraded` and `stopped`, drops duplicate envelopes
//! (delivery is at least once), and calls back when the relay says the
//! application must re-read its state.
//!
//! Tokens that expire are renewed without a gap, given a
//! [`token_provider`](ClientBuilder::token_provider): when the relay warns
//! that the stream's token expires soon (`event: reauth`), the client opens
//! the next stream with a fresh token and the watermark while the current
//! one still delivers, reads both until the new one is `ready` (dropping
//! what both deliver), then closes the old one. No event is lost or
//! delivered twice, and the state stays `Connected`.
//!
//! ```no_run
//! use eventrelay_client::{ClientBuilder, State};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let token = std::env::var("EVENTRELAY_TOKEN")?;
//! let (handle, mut events) = ClientBuilder::new(move |http| {
//!     http.get("http://127.0.0.1:8080/v1/events").bearer_auth(&token)
//! })
//! .on_resync(|| println!("re-read the state"))
//! .start();
//!
//! while let Some(event) = events.recv().await {
//!     println!("{} {}", event.envelope.event_type, event.envelope.data);
//!     if handle.state() == State::Degraded {
//!         // poll instead until the state is Connected again
//!     }
//! }
//! handle.stop().await?;
//! # Ok(())
//! # }
//! ```
//!
//! With expiring tokens:
//!
//! ```no_run
//! use eventrelay_client::ClientBuilder;
//!
//! # async fn mint_token() -> Result<String, std::io::Error> { Ok(String::new()) }
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let (handle, mut events) =
//!     ClientBuilder::new(|http| http.get("http://127.0.0.1:8080/v1/events"))
//!         // Called at the start, before the token expires, after a refusal.
//!         .token_provider(|| async { mint_token().await })
//!         .start();
//! while let Some(event) = events.recv().await {
//!     println!("{}", event.envelope.event_type);
//! }
//! handle.stop().await?;
//! # Ok(())
//! # }
//! ```
//!
//! # Layout
//!
//! `client.rs` holds [`ClientBuilder`] and the connection loop; [`sse`]
//! parses the event stream; [`seen`] remembers envelope ids to drop
//! duplicates; [`presence`] keeps who is connected to the scope (from the
//! relay's `presence` frames); `backoff.rs` computes the reconnect delays;
//! `error.rs` holds [`ClientError`].

mod backoff;
mod client;
mod error;
pub mod presence;
pub mod seen;
pub mod sse;

pub use backoff::Backoff;
pub use client::{ClientBuilder, ClientHandle, Event, RequestFuture, State, Status};
pub use error::{BoxError, ClientError};
pub use eventrelay_wire::EventEnvelope;
pub use presence::{Member, Presence, PresenceChange, Presences};
