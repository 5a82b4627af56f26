//! The actors that move events: the listener hears notifications (or, in
//! the logical wake-up mode, reads the replication stream), the relay reads
//! the outbox for active scopes, and one hub per scope fans out to its
//! subscribers (its state, in [`hub_core`], behind a lock that publish
//! handlers also take). Messages are typed next to the actor that handles
//! them.

pub mod directory;
pub mod encoded;
pub mod hub;
pub mod hub_core;
pub mod listener;
pub mod mailbox;
pub mod relay;
pub mod scope;
pub mod tail;
pub mod tail_budget;

pub use directory::HubDirectory;
pub use encoded::EncodedEvent;
pub use listener::Listener;
pub use relay::Relay;
