//! The SSE connection itself: clients that close, stall or churn, and the session protocol.

mod churn;
mod closed_clients;
mod ends_on_time;
mod slow_clients;
