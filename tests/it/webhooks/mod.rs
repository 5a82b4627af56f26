//! Webhooks: deliveries written with the event, signed and retried, and the admin API that manages them.

mod admin_api;
mod delivery;
mod operations;
