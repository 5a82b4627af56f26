//! The scenarios, one module each: a scenario's module owns its run and its
//! table rows (`rows`), and the binary's table of scenarios names them.

pub mod connection_heap;
pub mod emit_cost;
pub mod fanout;
pub mod floor;
pub mod http2;
pub mod outage;
pub mod pools;
pub mod publish_throughput;
pub mod replay;
pub mod resume_cost;
pub mod scopes;
pub mod seal_cost;
pub mod standby;
pub mod storm;
pub mod streams;
pub mod tail;
pub mod wakeup;
pub mod webhooks;
