//! The campaign's webhook receiver: it verifies every request's Standard
//! Webhooks signature and writes down what came, and it answers 500 to
//! the first try of one event in five and takes 800 ms over one in seven,
//! so retries and slow answers are part of every run.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use eventrelay::publisher::{WebhookHeaders, WebhookSecret, verify};

use crate::webhook_receiver::WebhookReceiver;
use eventrelay_bench::BenchResult;
use eventrelay_bench::relay_process::WEBHOOK_SECRET;

/// One request the receiver got.
#[derive(Debug, Clone, serde::Serialize)]
pub struct HookReceived {
    /// `webhook-id`: the event's id.
    pub id: String,
    pub verified: bool,
    pub status: u16,
}

pub struct Hooks {
    pub receiver: WebhookReceiver,
    pub log: Arc<Mutex<Vec<HookReceived>>>,
}

fn header<'a>(head: &'a str, name: &str) -> &'a str {
    head.lines()
        .find_map(|line| {
            let (key, value) = line.split_once(':')?;
            key.trim().eq_ignore_ascii_case(name).then(|| value.trim())
        })
        .unwrap_or_default()
}

/// A small, stable number from an event id, to pick which fail or lag.
fn pick(id: &str) -> u32 {
    id.bytes()
        .fold(7u32, |acc, b| acc.wrapping_mul(31).wrapping_add(b.into()))
}

pub async fn start() -> BenchResult<Hooks> {
    let secret = WebhookSecret::parse(WEBHOOK_SECRET)?;
    let log: Arc<Mutex<Vec<HookReceived>>> = Arc::default();
    let failed_once: Arc<Mutex<HashSet<String>>> = Arc::default();
    let record = Arc::clone(&log);
    let receiver = WebhookReceiver::start_answering(Arc::new(move |head: &str, body: &[u8]| {
        let headers = WebhookHeaders {
            id: header(head, "webhook-id"),
            timestamp: header(head, "webhook-timestamp"),
            signature: header(head, "webhook-signature"),
        };
        let verified = verify(&secret, headers, body).is_ok();
        let id = headers.id.to_owned();
        let first_try = failed_once
            .lock()
            .map(|mut failed| pick(&id) % 5 == 0 && failed.insert(id.clone()))
            .unwrap_or(false);
        let (status, delay) = match () {
            _ if first_try => (500, Duration::ZERO),
            _ if pick(&id) % 7 == 0 => (200, Duration::from_millis(800)),
            _ => (200, Duration::ZERO),
        };
        if let Ok(mut log) = record.lock() {
            log.push(HookReceived {
                id,
                verified,
                status,
            });
        }
        (status, delay)
    }))
    .await?;
    Ok(Hooks { receiver, log })
}
