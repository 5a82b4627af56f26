//! The relay end to end: commits reach subscribers, replay, audiences, isolation between scopes, actors restarted under supervision.

mod delivery;
mod failover;
mod isolation;
mod supervision;
