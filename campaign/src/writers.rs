//! Writers: each emits events in transactions of its own, as an
//! application does, across the campaign's scopes, and writes down what it
//! emitted and how each transaction ended. Some transactions roll back;
//! the slow writer holds each of its transactions open for seconds, which
//! is what makes late commits.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use eventrelay::publisher::{Audience, NewEvent, Publisher};
use serde_json::json;
use tokio::sync::watch;

use super::Clock;
use super::records::{Outcome, Written};

/// The permission some events carry; half the subscribers hold it.
pub const PERMISSION: &str = "orders:read";
/// The event type the relays' webhook subscription takes (see
/// `RelaySettings::webhook_url`).
pub const HOOK_TYPE: &str = "bench.hook";

/// What a writer needs.
pub struct Writer {
    pub index: usize,
    pub url: String,
    pub schema: String,
    /// Scopes `scope-0` .. this.
    pub scopes: usize,
    /// Of which `scope-0` .. this have subscribers, and get more events.
    pub watched: usize,
    /// Subscriber ids that `audience.users` picks from.
    pub subscribers: Vec<String>,
    /// Holds each transaction open for 0.5 to 2 s.
    pub slow: bool,
    pub seed: u64,
    pub clock: Clock,
    pub log: Arc<Mutex<Vec<Written>>>,
}

impl Writer {
    /// Writes until `stop` turns true.
    pub async fn run(self, mut stop: watch::Receiver<bool>) {
        let mut rng = fastrand::Rng::with_seed(self.seed);
        let publisher = match Publisher::new(&self.schema) {
            Ok(publisher) => publisher,
            Err(error) => {
                eprintln!("writer {}: {error}", self.index);
                return;
            }
        };
        let mut n = 0u64;
        while !*stop.borrow() {
            let Ok(mut client) = eventrelay::connect(&self.url).await else {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            };
            while !*stop.borrow() {
                n += 1;
                if !self.transaction(&mut client, &publisher, &mut rng, n).await {
                    break;
                }
                if !self.slow {
                    let pause = Duration::from_millis(rng.u64(2..12));
                    tokio::select! {
                        _ = tokio::time::sleep(pause) => {}
                        _ = stop.changed() => {}
                    }
                }
            }
        }
    }

    /// One transaction; false when the connection is gone.
    async fn transaction(
        &self,
        client: &mut tokio_postgres::Client,
        publisher: &Publisher,
        rng: &mut fastrand::Rng,
        n: u64,
    ) -> bool {
        let Ok(tx) = client.transaction().await else {
            return false;
        };
        let mut emitted = Vec::new();
        for k in 0..rng.usize(1..4) {
            let event = self.event(rng, n, k);
            match publisher.emit(&tx, event.clone()).await {
                Ok(envelope) => emitted.push((envelope, event)),
                Err(_) => {
                    // The transaction is aborted: nothing in it commits.
                    self.record(emitted, Outcome::RolledBack);
                    return false;
                }
            }
        }
        if self.slow {
            tokio::time::sleep(Duration::from_millis(rng.u64(500..2000))).await;
        }
        if rng.u8(0..10) == 0 {
            let ended = tx.rollback().await.is_ok();
            self.record(emitted, Outcome::RolledBack);
            return ended;
        }
        let at = self.clock.now();
        let outcome = match tx.commit().await {
            Ok(()) => Outcome::Committed,
            Err(_) => Outcome::Unknown,
        };
        self.record_at(emitted, outcome, at);
        outcome == Outcome::Committed
    }

    fn event(&self, rng: &mut fastrand::Rng, n: u64, k: usize) -> NewEvent {
        let scope = if rng.u8(0..10) < 6 {
            rng.usize(0..self.watched)
        } else {
            rng.usize(0..self.scopes)
        };
        let scope = format!("scope-{scope}");
        let event_type = if rng.u8(0..10) == 0 {
            HOOK_TYPE
        } else {
            "campaign.event"
        };
        let data = json!({"writer": self.index, "n": n, "k": k});
        let mut event = if rng.u8(0..100) < 85 {
            NewEvent::durable(event_type, &scope, data)
        } else {
            NewEvent::ephemeral("campaign.ephemeral", &scope, data)
        };
        match rng.u8(0..20) {
            0..=2 => {
                let users: Vec<String> = (0..2)
                    .filter_map(|_| rng.choice(&self.subscribers).cloned())
                    .collect();
                event = event.with_audience(Audience::users(users));
            }
            3 | 4 => event = event.with_audience(Audience::permission(json!(PERMISSION))),
            _ => {}
        }
        event
    }

    fn record(&self, emitted: Vec<(eventrelay::wire::EventEnvelope, NewEvent)>, outcome: Outcome) {
        self.record_at(emitted, outcome, self.clock.now());
    }

    fn record_at(
        &self,
        emitted: Vec<(eventrelay::wire::EventEnvelope, NewEvent)>,
        outcome: Outcome,
        ended_at: f64,
    ) {
        let written = emitted.into_iter().map(|(envelope, _)| Written {
            id: envelope.id,
            durable: envelope.is_durable(),
            users: envelope.audience.as_ref().and_then(|a| a.users.clone()),
            permission: envelope
                .audience
                .as_ref()
                .is_some_and(|a| a.permission.is_some()),
            scope: envelope.scope_key,
            event_type: envelope.event_type,
            data: envelope.data,
            outcome,
            ended_at,
        });
        if let Ok(mut log) = self.log.lock() {
            log.extend(written);
        }
    }
}
