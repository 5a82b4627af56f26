//! Webhooks, the whole domain: subscriptions and their rules, and the
//! delivery statuses and attempt outcomes ([`model`]),
//! the SQL behind them and the delivery queue ([`store`]), what managing a
//! subscription means for the admin API and the command line ([`admin`]),
//! the `[webhooks]` settings ([`settings`]), and the dispatcher that sends
//! due deliveries signed ([`dispatcher`]).
//!
//! Deliveries are written by the outbox's trigger in the event's own
//! transaction; nothing here is on the SSE path.

pub mod admin;
pub mod dispatcher;
pub mod model;
pub mod settings;
pub mod store;

pub use crate::store::StoreError;
pub use admin::{
    ConfiguredSubscription, SubscriptionRequest, ensure_changeable, generate_secret,
    prepare_subscription,
};
pub use dispatcher::{DeliveriesDue, Dispatcher, SetWorkers, StopDispatcher};
pub use model::{
    Attempt, AttemptOutcome, AttemptRecord, Claimed, Delivery, DeliveryFilter, DeliveryOrder,
    DeliveryStatus, InvalidSubscription, MAX_PAGE, MAX_RESPONSE_BYTES, NewSubscription, PauseRule,
    Recorded, Subscription, SubscriptionHealth, SubscriptionPatch, SubscriptionWithHealth,
    UnknownName, check_max_per_second, check_ordering_max_block, validate_subscription,
    validate_subscription_fields,
};
pub use settings::{MIN_RETRY_AFTER, WebhooksConfig};
pub use store::WebhookStore;
