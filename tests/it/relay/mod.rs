//! The relay end to end: commits reach subscribers, replay, late commits found on resume and after a reconnect, audiences, isolation between scopes, actors restarted under supervision.

mod delivery;
mod failover;
mod isolation;
mod late_commits;
mod supervision;
