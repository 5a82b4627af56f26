//! A webhook receiver that misbehaves on purpose: per request it answers
//! 200, fails with 500, answers 503 with `Retry-After`, or stalls past the
//! sender's timeout, chosen by a seeded random generator; and it can go
//! down (connection refused) and come back on the same port. It records
//! every webhook id it accepted, so a test can count lost and duplicated
//! deliveries.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_web::{HttpRequest, HttpResponse, web};

use super::receiver::Running;

/// Out of 100 requests, roughly how many get each misbehaviour; the rest
/// are answered 200 at once.
#[derive(Debug, Clone, Copy)]
pub struct Mischief {
    pub fail_500: u8,
    pub unavailable_503: u8,
    pub stall: u8,
    /// How long a stalled request waits before answering 200 (longer than
    /// the sender's timeout, so the sender gives up and retries).
    pub stall_for: Duration,
}

#[derive(Default)]
struct Ledger {
    accepted: HashMap<String, usize>,
    requests: usize,
    in_flight: usize,
}

struct Behaviour {
    mischief: Mischief,
    rng: Mutex<fastrand::Rng>,
    ledger: Mutex<Ledger>,
}

pub struct FlakyReceiver {
    pub url: String,
    address: SocketAddr,
    behaviour: Arc<Behaviour>,
    running: Option<Running>,
}

impl FlakyReceiver {
    pub fn start(mischief: Mischief, seed: u64) -> FlakyReceiver {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        let behaviour = Arc::new(Behaviour {
            mischief,
            rng: Mutex::new(fastrand::Rng::with_seed(seed)),
            ledger: Mutex::default(),
        });
        let mut receiver = FlakyReceiver {
            url: format!("http://{address}/hook"),
            address,
            behaviour,
            running: None,
        };
        receiver.running = Some(serve(listener, Arc::clone(&receiver.behaviour)));
        receiver
    }

    /// Stops listening: senders now get connection refused.
    pub fn go_down(&mut self) {
        if let Some(running) = self.running.take() {
            running.stop();
        }
    }

    /// Listens again on the same address.
    pub fn come_up(&mut self) {
        if self.running.is_none() {
            let listener = std::net::TcpListener::bind(self.address).unwrap();
            self.running = Some(serve(listener, Arc::clone(&self.behaviour)));
        }
    }

    /// Webhook ids accepted (answered 2xx), with how many times each was.
    pub fn accepted(&self) -> HashMap<String, usize> {
        self.behaviour.ledger.lock().unwrap().accepted.clone()
    }

    pub fn requests(&self) -> usize {
        self.behaviour.ledger.lock().unwrap().requests
    }

    /// Requests being answered right now.
    pub fn in_flight(&self) -> usize {
        self.behaviour.ledger.lock().unwrap().in_flight
    }
}

impl Drop for FlakyReceiver {
    fn drop(&mut self) {
        self.go_down();
    }
}

fn serve(listener: std::net::TcpListener, behaviour: Arc<Behaviour>) -> Running {
    super::receiver::serve(listener, move |app| {
        app.app_data(web::Data::from(Arc::clone(&behaviour)))
            .default_service(web::to(answer));
    })
}

async fn answer(request: HttpRequest, behaviour: web::Data<Behaviour>) -> HttpResponse {
    let id = request
        .headers()
        .get("webhook-id")
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let roll = behaviour.rng.lock().unwrap().u8(0..100);
    let m = behaviour.mischief;
    {
        let mut ledger = behaviour.ledger.lock().unwrap();
        ledger.requests += 1;
        ledger.in_flight += 1;
    }
    let reply = if roll < m.fail_500 {
        HttpResponse::InternalServerError().finish()
    } else if roll < m.fail_500 + m.unavailable_503 {
        HttpResponse::ServiceUnavailable()
            .insert_header(("retry-after", "0"))
            .finish()
    } else {
        if roll < m.fail_500 + m.unavailable_503 + m.stall {
            // The receiver does the work, but too late: the sender has
            // timed out and will send again, which is the duplicate
            // at-least-once delivery allows.
            tokio::time::sleep(m.stall_for).await;
        }
        *behaviour
            .ledger
            .lock()
            .unwrap()
            .accepted
            .entry(id)
            .or_default() += 1;
        HttpResponse::Ok().finish()
    };
    behaviour.ledger.lock().unwrap().in_flight -= 1;
    reply
}
