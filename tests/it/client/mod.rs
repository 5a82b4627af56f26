//! The Rust SSE client against the real relay.

mod rust_client;
mod token_renewal;
