//! Webhooks: deliveries written with the event, signed and retried, the admin API that manages them, and the customer portal.

mod admin_api;
mod delivery;
mod operations;
mod portal;
