//! What operators touch: live reload, metrics for pools and dashboards, secrets kept out of output, traces.

mod console;
mod dashboards;
mod live_reload;
mod pool_metrics;
mod secrets;
mod traces;
