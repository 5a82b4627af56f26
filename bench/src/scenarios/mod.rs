//! The scenarios, one module each: a scenario's module owns its run and its
//! table rows (`rows`), and the binary's table of scenarios names them.

pub mod connection_heap;
pub mod emit_cost;
pub mod fanout;
pub mod floor;
pub mod presence_cost;
pub mod publish_throughput;
pub mod scope_cost;
pub mod seal_cost;
pub mod streams;
pub mod tail;
pub mod trace_cost;
pub mod wakeup;
pub mod webhooks;
