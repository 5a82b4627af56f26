//! Emitting: the publisher crate in the caller's transaction, the HTTP publish API and its group commit.

mod group_commit;
mod http_api;
mod publisher_crate;
