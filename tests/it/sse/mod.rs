//! The SSE connection itself: clients that close, stall or churn, and the session protocol.

mod churn;
mod closed_clients;
mod slow_clients;
