//! The SSE connection itself: clients that close, stall or churn, the session protocol, and the warning before a token ends a stream.

mod churn;
mod closed_clients;
mod ends_on_time;
mod presence;
mod reauth;
mod revocation;
mod slow_clients;
mod socket_options;
