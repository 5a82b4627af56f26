//! Subscribers: each holds one SSE stream of its scope at a time, on a
//! relay picked at random, and resumes with the last `id:` it saw as a
//! browser's `EventSource` does. Every connection and every frame is
//! written down for the checker. Each drops its stream after a few seconds
//! and comes back up to 2 s later; the fault schedule can also send a
//! subscriber away for longer, or make every subscriber reconnect at once.
//!
//! Some subscribers use the Rust client instead: it reconnects and
//! resumes by itself (to a relay picked at random on every connect) and
//! drops envelopes it has already delivered, so one run of the client is
//! one connection in the records, and a repeat within it is the client's
//! own failure to de-duplicate.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use eventrelay_client::sse::{SseItem, SseParser};
use eventrelay_client::{ClientBuilder, State};
use futures_util::StreamExt;
use serde_json::Value;
use tokio::sync::watch;

use super::Clock;
use super::records::{Connection, Received, SubscriberLog};

/// How long a connection may stay silent (heartbeats come every 20 s).
const SILENCE: Duration = Duration::from_secs(30);

/// What the fault schedule tells a subscriber: drop the stream and stay
/// away this long. Each new value is one order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Away {
    pub order: u64,
    pub millis: u64,
}

pub struct Subscriber {
    pub token: String,
    /// Every relay's base URL; a restarted relay keeps its port.
    pub relays: Arc<Vec<String>>,
    /// Reads slowly: a few milliseconds after every chunk, so its queue on
    /// the relay fills under load and the relay drops it.
    pub slow: bool,
    /// Subscribes through the Rust client.
    pub via_client: bool,
    pub seed: u64,
    pub clock: Clock,
    pub log: Arc<Mutex<SubscriberLog>>,
}

impl Subscriber {
    /// Subscribes and resumes until `stop` turns true.
    pub async fn run(self, away: watch::Receiver<Away>, stop: watch::Receiver<bool>) {
        if self.via_client {
            self.run_client(away, stop).await
        } else {
            self.run_event_source(away, stop).await
        }
    }

    /// As a browser's `EventSource` does: one stream at a time, resumed
    /// with the last `id:` seen.
    async fn run_event_source(
        self,
        mut away: watch::Receiver<Away>,
        mut stop: watch::Receiver<bool>,
    ) {
        let mut rng = fastrand::Rng::with_seed(self.seed);
        let Ok(http) = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(2))
            .build()
        else {
            return;
        };
        let mut last_id: Option<String> = None;
        while !*stop.borrow() {
            let relay = rng.usize(0..self.relays.len());
            let connection = self.open_connection(relay, last_id.clone());
            let mut request = http
                .get(format!("{}/v1/events", self.relays[relay]))
                .bearer_auth(&self.token);
            if let Some(id) = &last_id {
                request = request.header("last-event-id", id);
            }
            let mut stay_away = Duration::from_millis(rng.u64(20..200));
            // Pages come and go (a laptop lid, a tunnel): each stream is
            // dropped after a while, and the next resumes from its cursor.
            let leaves = tokio::time::sleep(Duration::from_millis(rng.u64(500..6000)));
            tokio::pin!(leaves);
            match request.send().await {
                Ok(response) if response.status().is_success() => {
                    let mut body = response.bytes_stream();
                    let mut parser = SseParser::new();
                    loop {
                        tokio::select! {
                            _ = &mut leaves => {
                                stay_away = Duration::from_millis(rng.u64(0..2000));
                                break;
                            }
                            chunk = tokio::time::timeout(SILENCE, body.next()) => {
                                let Ok(Some(Ok(chunk))) = chunk else { break };
                                for item in parser.feed(&chunk) {
                                    if let SseItem::Event(event) = item {
                                        self.frame(connection, &event.event_type, &event.data, event.id, &mut last_id);
                                    }
                                }
                                if self.slow {
                                    tokio::time::sleep(Duration::from_millis(5)).await;
                                }
                            }
                            changed = away.changed() => {
                                if changed.is_ok() {
                                    stay_away = Duration::from_millis(away.borrow().millis);
                                }
                                break;
                            }
                            _ = stop.changed() => break,
                        }
                    }
                }
                // Refused (over the cap while an old stream is not yet
                // released, the relay restarting): try again shortly.
                _ => stay_away = Duration::from_millis(rng.u64(100..400)),
            }
            tokio::select! {
                _ = tokio::time::sleep(stay_away) => {}
                _ = stop.changed() => {}
            }
        }
    }

    /// Through the Rust client: each run of it lasts 5 to 20 s (through
    /// the faults, which make it reconnect by itself), and the next starts
    /// from the last `id:` it delivered, as an application that persists
    /// its position does.
    async fn run_client(self, mut away: watch::Receiver<Away>, mut stop: watch::Receiver<bool>) {
        let mut rng = fastrand::Rng::with_seed(self.seed);
        let mut last_id: Option<String> = None;
        while !*stop.borrow() {
            // Every connect picks a relay; the first one's is recorded.
            let mut picks = fastrand::Rng::with_seed(rng.u64(..));
            let first = picks.usize(0..self.relays.len());
            let connection = self.open_connection(first, last_id.clone());
            let next_relay = Mutex::new((Some(first), picks));
            let (relays, token) = (Arc::clone(&self.relays), self.token.clone());
            let (log, clock) = (Arc::clone(&self.log), self.clock);
            let mut builder = ClientBuilder::new(move |http| {
                let relay = match next_relay.lock() {
                    Ok(mut next) => match next.0.take() {
                        Some(first) => first,
                        None => next.1.usize(0..relays.len()),
                    },
                    Err(_) => 0,
                };
                http.get(format!("{}/v1/events", relays[relay]))
                    .bearer_auth(&token)
            })
            .backoff(Duration::from_millis(100), Duration::from_secs(1))
            .idle_timeout(Some(SILENCE))
            .on_resync(move || {
                if let Ok(mut log) = log.lock()
                    && let Some(record) = log.connections.get_mut(connection)
                {
                    record.resyncs.push(clock.now());
                }
            });
            if let Some(id) = &last_id {
                builder = builder.last_event_id(id.clone());
            }
            let (handle, mut events) = builder.start();
            let mut status = handle.subscribe();
            let mut stay_away = Duration::from_millis(rng.u64(20..200));
            let leaves = tokio::time::sleep(Duration::from_millis(rng.u64(5_000..20_000)));
            tokio::pin!(leaves);
            loop {
                tokio::select! {
                    _ = &mut leaves => break,
                    event = events.recv() => {
                        let Some(event) = event else { break };
                        let Ok(data) = serde_json::to_string(&event.envelope) else { continue };
                        self.frame(connection, &event.event_type, &data, event.sse_id, &mut last_id);
                    }
                    changed = status.changed() => {
                        if changed.is_err() {
                            break;
                        }
                        if status.borrow().state == State::Connected {
                            self.connected(connection);
                        }
                    }
                    changed = away.changed() => {
                        if changed.is_ok() {
                            stay_away = Duration::from_millis(away.borrow().millis);
                        }
                        break;
                    }
                    _ = stop.changed() => break,
                }
            }
            let _ = handle.stop().await;
            // What the client had received but not yet handed over is
            // dropped with it, as an application that stops loses it.
            tokio::select! {
                _ = tokio::time::sleep(stay_away) => {}
                _ = stop.changed() => {}
            }
        }
    }

    /// The client said it is connected: the first time is the record's
    /// `ready` (its resyncs are written down apart).
    fn connected(&self, connection: usize) {
        if let Ok(mut log) = self.log.lock()
            && let Some(record) = log.connections.get_mut(connection)
            && record.ready.is_none()
        {
            record.ready = Some((self.clock.now(), false));
        }
    }

    fn open_connection(&self, relay: usize, resumed_from: Option<String>) -> usize {
        let Ok(mut log) = self.log.lock() else {
            return 0;
        };
        log.connections.push(Connection {
            relay,
            resumed_from,
            ..Connection::default()
        });
        log.connections.len() - 1
    }

    /// Writes one frame down; a durable event's `id:` becomes the cursor
    /// to resume from.
    fn frame(
        &self,
        connection: usize,
        event_type: &str,
        data: &str,
        frame_id: Option<String>,
        last_id: &mut Option<String>,
    ) {
        let Ok(mut log) = self.log.lock() else {
            return;
        };
        let Some(record) = log.connections.get_mut(connection) else {
            return;
        };
        let Ok(envelope) = serde_json::from_str::<Value>(data) else {
            return;
        };
        if event_type == "ready" {
            let resync = envelope["resync"].as_bool().unwrap_or(true);
            record.ready = Some((self.clock.now(), resync));
            return;
        }
        let Some(id) = envelope["id"].as_str().and_then(|id| id.parse().ok()) else {
            return;
        };
        if let Some(frame_id) = &frame_id {
            *last_id = Some(frame_id.clone());
        }
        record.received.push(Received {
            id,
            seq: envelope["seq"].as_i64(),
            scope: envelope["scopeKey"].as_str().unwrap_or_default().to_owned(),
            event_type: envelope["type"].as_str().unwrap_or_default().to_owned(),
            data: envelope["data"].clone(),
            frame_id: frame_id.unwrap_or_default(),
            at: self.clock.now(),
        });
    }
}
