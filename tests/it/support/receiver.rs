//! A real local webhook receiver: an HTTP server on port 0 that records
//! every request and answers from a script.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
use tokio::sync::oneshot;

use super::eventually;

/// One scripted answer.
#[derive(Debug, Clone)]
pub enum Reply {
    Status(u16),
    /// A status with one extra header.
    WithHeader(u16, &'static str, String),
    /// Wait, then answer with the status.
    Slow(Duration, u16),
    /// A status with a body.
    WithBody(u16, String),
}

/// A request as the receiver saw it.
#[derive(Debug, Clone)]
pub struct Received {
    pub path: String,
    pub headers: HashMap<String, String>,
    pub body: Vec<u8>,
    /// When it arrived.
    pub at: std::time::Instant,
    /// The status it was answered with.
    pub status: u16,
}

#[derive(Default)]
struct Script {
    replies: Mutex<VecDeque<Reply>>,
    received: Mutex<Vec<Received>>,
}

pub struct Receiver {
    pub url: String,
    script: Arc<Script>,
    running: Option<Running>,
}

impl Receiver {
    /// Answers `replies` in order, then 200 to everything.
    pub fn start(replies: impl IntoIterator<Item = Reply>) -> Receiver {
        let script = Arc::new(Script {
            replies: Mutex::new(replies.into_iter().collect()),
            received: Mutex::default(),
        });
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        let shared = Arc::clone(&script);
        let running = serve(listener, move |app| {
            app.app_data(web::Data::from(Arc::clone(&shared)))
                .default_service(web::to(answer));
        });
        Receiver {
            url,
            script,
            running: Some(running),
        }
    }

    pub fn received(&self) -> Vec<Received> {
        self.script.received.lock().unwrap().clone()
    }

    /// Waits until at least `count` requests arrived.
    pub async fn wait_for(&self, count: usize) -> Vec<Received> {
        eventually(&format!("{count} webhook requests arrive"), async || {
            let received = self.received();
            (received.len() >= count).then_some(received)
        })
        .await
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if let Some(running) = self.running.take() {
            running.stop();
        }
    }
}

/// An HTTP server on its own thread and actix system, until stopped.
pub struct Running {
    stop: oneshot::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl Running {
    /// Stops the server and waits for its thread.
    pub fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.thread.join();
    }
}

/// Serves the routes `configure` adds on `listener` (two workers, no
/// signal handling, no shutdown grace).
pub fn serve(
    listener: std::net::TcpListener,
    configure: impl Fn(&mut web::ServiceConfig) + Send + Clone + 'static,
) -> Running {
    let (stop, stopped) = oneshot::channel::<()>();
    let thread = std::thread::spawn(move || {
        actix_web::rt::System::new().block_on(async move {
            let server = HttpServer::new(move || App::new().configure(configure.clone()))
                .workers(2)
                .disable_signals()
                .shutdown_timeout(0)
                .listen(listener)
                .unwrap()
                .run();
            let handle = server.handle();
            actix_web::rt::spawn(server);
            let _ = stopped.await;
            handle.stop(false).await;
        });
    });
    Running { stop, thread }
}

async fn answer(request: HttpRequest, body: web::Bytes, script: web::Data<Script>) -> HttpResponse {
    let headers = request
        .headers()
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_owned(),
                v.to_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    let reply = script.replies.lock().unwrap().pop_front();
    let answered = match &reply {
        None => 200,
        Some(Reply::Status(code) | Reply::WithHeader(code, ..) | Reply::WithBody(code, _)) => *code,
        Some(Reply::Slow(_, code)) => *code,
    };
    script.received.lock().unwrap().push(Received {
        path: request.path().to_owned(),
        headers,
        body: body.to_vec(),
        at: std::time::Instant::now(),
        status: answered,
    });
    let status = |code: u16| actix_web::http::StatusCode::from_u16(code).unwrap();
    match reply {
        None => HttpResponse::Ok().finish(),
        Some(Reply::Status(code)) => HttpResponse::build(status(code)).finish(),
        Some(Reply::WithHeader(code, name, value)) => HttpResponse::build(status(code))
            .insert_header((name, value))
            .finish(),
        Some(Reply::WithBody(code, body)) => HttpResponse::build(status(code)).body(body),
        Some(Reply::Slow(wait, code)) => {
            tokio::time::sleep(wait).await;
            HttpResponse::build(status(code)).finish()
        }
    }
}
