//! The scenarios, one module each. Each is bounded in time and returns its
//! measured figures; the binary turns them into table rows.

pub mod box_scale;
pub mod connection_heap;
pub mod emit_cost;
pub mod fanout;
pub mod floor;
pub mod outage;
pub mod paired_fanout;
pub mod pools;
pub mod publish_throughput;
pub mod replay;
pub mod resume_cost;
pub mod seal_cost;
pub mod standby;
pub mod storm;
pub mod streams;
pub mod tail_memory;
pub mod tails_budget;
pub mod webhooks;
