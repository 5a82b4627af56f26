//! Subscribers: each holds one SSE stream of its scope at a time, on a
//! relay picked at random, and resumes with the last `id:` it saw as a
//! browser's `EventSource` does. Every connection and every frame is
//! written down for the checker. Each drops its stream after a few seconds
//! and comes back up to 2 s later; the fault schedule can also send a
//! subscriber away for longer, or make every subscriber reconnect at once.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use eventrelay_client::sse::{SseItem, SseParser};
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
    pub seed: u64,
    pub clock: Clock,
    pub log: Arc<Mutex<SubscriberLog>>,
}

impl Subscriber {
    /// Subscribes and resumes until `stop` turns true.
    pub async fn run(self, mut away: watch::Receiver<Away>, mut stop: watch::Receiver<bool>) {
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
        });
    }
}
