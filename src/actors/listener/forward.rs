//! What the listener does with each payload it hears, whichever way it
//! heard it (a LISTEN connection, the embedded database's feed, or a
//! logical message on the replication stream): open its seal, decode it
//! with the wire codec and hand it on. Events and pointers go to the
//! relay; queued webhook deliveries go straight to the dispatcher, when it
//! runs here. A payload that was not sealed with the schema's key, or says
//! more than its sender may (an emitter's seal on anything but ephemeral
//! events), is dropped with a warning and counted as rejected; one that
//! does not decode, as malformed.

use std::sync::Arc;
use std::time::Instant;

use actix::{Addr, Recipient};
use eventrelay_wire::{
    DecodeError, EventNotification, Origin, SealKey, decode_notification_within,
    defer_carried_rows, sealed_len,
};

use crate::actors::mailbox::Counted;
use crate::actors::relay::{
    Ephemeral, HorizonHeard, ListenerConnected, Pointer, Relay, count_unreadable_rows,
};
use crate::metrics::{ActorKind, Metrics, ReasonLabel};
use crate::webhooks::DeliveriesDue;

/// Where what the listener hears goes.
#[derive(Clone)]
pub struct Targets {
    pub relay: Counted<Addr<Relay>>,
    /// The webhook dispatcher, when it runs on this replica: told when a
    /// transaction queued deliveries.
    pub deliveries_due: Option<Counted<Recipient<DeliveriesDue>>>,
    pub metrics: Arc<Metrics>,
    /// The schema's notification key; `None` for the embedded database,
    /// whose notifications are not sealed (nothing else can reach it).
    pub seal: Option<Arc<SealKey>>,
}

impl Targets {
    /// The listener (re)connected: the relay re-reads what it may have
    /// missed meanwhile.
    pub fn connected(&self) {
        self.relay.do_send(ListenerConnected);
    }

    /// A transaction queued webhook deliveries.
    pub fn deliveries_queued(&self) {
        if let Some(dispatcher) = &self.deliveries_due {
            dispatcher.do_send(DeliveriesDue);
        }
    }
}

/// [`forward`] under supervision: false when it panicked, after which the
/// listener restarts (a new connection, and the relay re-reads every active
/// scope), which is counted. Notifications longer than `limit` bytes
/// (before sealing) are malformed.
pub(super) fn supervised_forward(payload: &str, limit: usize, targets: &Targets) -> bool {
    let forwarded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        forward(payload, limit, targets);
    }));
    if forwarded.is_err() {
        targets.metrics.restarted(ActorKind::Listener);
        tracing::error!("the listener failed on a notification; restarting it");
    }
    forwarded.is_ok()
}

/// The prefix of the test suite's fault notifications (with the
/// `fault-injection` feature only).
#[cfg(feature = "fault-injection")]
const FAULT_PREFIX: &str = "eventrelay-fault:";

/// Decodes one notification and hands it to the relay: the listener's
/// unit of work, timed as its handling.
fn forward(payload: &str, limit: usize, targets: &Targets) {
    let heard_at = Instant::now();
    let Targets { relay, metrics, .. } = targets;
    let _handling = metrics.actor(ActorKind::Listener).timed();
    #[cfg(feature = "fault-injection")]
    if let Some(target) = payload.strip_prefix(FAULT_PREFIX) {
        use crate::actors::relay::InjectFault;
        match target {
            "listener" => panic!("fault injected into the listener"),
            "relay" => {
                relay.do_send(InjectFault::Relay);
            }
            _ => {
                if let Some(scope_key) = target.strip_prefix("hub:") {
                    relay.do_send(InjectFault::Hub(scope_key.to_owned()));
                }
            }
        }
        return;
    }
    let opened;
    let (origin, payload) = match &targets.seal {
        None => (Origin::Rows, payload),
        Some(key) => {
            if payload.len() > sealed_len(limit) {
                reject(metrics, "too_large", payload);
                return;
            }
            match key.open(payload) {
                Ok((origin, text)) => {
                    opened = text;
                    (origin, opened.as_str())
                }
                Err(error) => {
                    reject(metrics, error.reason(), payload);
                    return;
                }
            }
        }
    };
    if origin == Origin::Emitter {
        // An emitter chose every byte: only ephemeral events may come this way.
        match decode_notification_within(payload.as_bytes(), limit) {
            Ok(EventNotification::Inline { envelope }) => {
                relay.do_send(Ephemeral { envelope, heard_at })
            }
            Ok(EventNotification::InlineBatch { envelopes, .. }) => {
                for envelope in envelopes {
                    relay.do_send(Ephemeral { envelope, heard_at });
                }
            }
            Ok(_) => reject(metrics, "emitter_kind", payload),
            Err(error) => malformed(metrics, &error, payload),
        }
        return;
    }
    // Most payloads under load are pointers carrying rows: the relay
    // decodes those rows only for a scope with subscribers.
    if let Some(pointer) = defer_carried_rows(payload, limit) {
        relay.do_send(Pointer {
            scope_key: pointer.scope_key.clone(),
            seq: pointer.seq,
            carried: Some(pointer),
            heard_at,
        });
        return;
    }
    match decode_notification_within(payload.as_bytes(), limit) {
        Ok(EventNotification::Pointer { scope_key, seq, .. }) => {
            // A bare pointer, or rows in a form the deferred reading leaves
            // alone (a field given twice): those rows are read back.
            relay.do_send(Pointer {
                scope_key,
                seq,
                carried: None,
                heard_at,
            });
        }
        Ok(EventNotification::Inline { envelope }) => {
            relay.do_send(Ephemeral { envelope, heard_at });
        }
        Ok(EventNotification::InlineBatch { envelopes, .. }) => {
            for envelope in envelopes {
                relay.do_send(Ephemeral { envelope, heard_at });
            }
        }
        Ok(EventNotification::DeliveriesQueued) => targets.deliveries_queued(),
        Ok(EventNotification::Horizon { xmin }) => relay.do_send(HorizonHeard { xmin }),
        Err(DecodeError::UnreadableCarriedRows {
            scope_key,
            seq,
            reason,
        }) => {
            // The pointer is sound: its rows are read back instead.
            count_unreadable_rows(metrics, &scope_key, seq, &reason);
            relay.do_send(Pointer {
                scope_key,
                seq,
                carried: None,
                heard_at,
            });
        }
        Err(error) => malformed(metrics, &error, payload),
    }
}

fn malformed(metrics: &Metrics, error: &DecodeError, payload: &str) {
    metrics.notifications_malformed.inc();
    let shown: String = payload.chars().take(120).collect();
    tracing::warn!(%error, payload = %shown, "dropping malformed notification");
}

/// Counts and logs a notification that did not come from this schema's
/// functions (or says more than its sender may). Only its length is
/// logged: it may be a stranger's, of any size and content.
fn reject(metrics: &Metrics, reason: &'static str, payload: &str) {
    metrics
        .notifications_rejected
        .get_or_create(&ReasonLabel { reason })
        .inc();
    tracing::warn!(
        reason,
        bytes = payload.len(),
        "dropping a notification not sealed by this schema's functions"
    );
}
