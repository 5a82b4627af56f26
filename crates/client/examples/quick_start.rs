//! The quick start from `docs/src/subscribing.md`: prints the events of one scope.
//!
//! `EVENTRELAY_TOKEN=$(cargo run -q -- token --subscriber alice --scope org-1)
//! cargo run -p eventrelay-client --example quick_start`

#![allow(
    clippy::print_stdout,
    reason = "an example that prints what it receives"
)]

use std::sync::{Arc, Mutex};

use eventrelay_client::{ClientBuilder, ClientError, State};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let token = Arc::new(Mutex::new(std::env::var("EVENTRELAY_TOKEN")?));

    let current = token.clone();
    let refreshed = token.clone();
    let (handle, mut events) = ClientBuilder::new(move |http| {
        // Called on every connect: the token is read fresh each time.
        let token = current.lock().map(|t| t.clone()).unwrap_or_default();
        http.get("http://127.0.0.1:8080/v1/events")
            .bearer_auth(token)
    })
    .on_resync(|| println!("re-read what the service shows"))
    .on_unauthorized(move || {
        let refreshed = refreshed.clone();
        async move {
            let fresh = std::env::var("EVENTRELAY_TOKEN")?;
            if let Ok(mut token) = refreshed.lock() {
                *token = fresh;
            }
            Ok::<(), std::env::VarError>(())
        }
    })
    .degraded_after(3)
    .start();

    let mut status = handle.subscribe();
    tokio::spawn(async move {
        while status.changed().await.is_ok() {
            let status = status.borrow().clone();
            if status.state == State::Degraded {
                eprintln!("degraded, polling instead: {:?}", status.last_error);
            }
        }
    });

    while let Some(event) = events.recv().await {
        // event.envelope: id, type, scopeKey, lane, seq, data, ...
        // event.sse_id: the seq as text on durable events; store it and pass
        // it to `.last_event_id(..)` to resume after a restart.
        println!("{} {}", event.envelope.event_type, event.envelope.data);
    }

    // `events` closes when the client stops; `join` says why.
    let _: Result<(), std::sync::Arc<ClientError>> = handle.join().await;
    Ok(())
}
