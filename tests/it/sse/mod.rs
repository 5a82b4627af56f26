//! The SSE connection itself: clients that close, stall or churn, the session protocol, the warning before a token ends a stream, and streams of several scopes.

mod churn;
mod closed_clients;
mod ends_on_time;
mod presence;
mod reauth;
mod revocation;
mod several_scopes;
mod slow_clients;
mod socket_options;
