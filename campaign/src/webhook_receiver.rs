//! A local webhook receiver that answers each request as a function of the
//! request decides (the campaign's receiver fails some first tries).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use eventrelay_bench::BenchResult;

/// How to answer one request, from its head (as sent) and its body: a
/// status, after a delay.
pub type Answer = Arc<dyn Fn(&str, &[u8]) -> (u16, Duration) + Send + Sync>;

pub struct WebhookReceiver {
    pub url: String,
    received: Arc<AtomicU64>,
    accept: tokio::task::JoinHandle<()>,
}

impl WebhookReceiver {
    /// A receiver that answers each request as `answer` says.
    pub async fn start_answering(answer: Answer) -> BenchResult<WebhookReceiver> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}/hook", listener.local_addr()?);
        let received = Arc::new(AtomicU64::new(0));
        let counter = Arc::clone(&received);
        let accept = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream, Arc::clone(&counter), Arc::clone(&answer)));
            }
        });
        Ok(WebhookReceiver {
            url,
            received,
            accept,
        })
    }

    pub fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }
}

impl Drop for WebhookReceiver {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Serves keep-alive requests on one connection: reads the head and the
/// `content-length` body, answers as `answer` says.
async fn serve(mut stream: TcpStream, received: Arc<AtomicU64>, answer: Answer) {
    let mut buffer = Vec::with_capacity(8192);
    let mut chunk = vec![0u8; 8192];
    loop {
        let head_end = loop {
            if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buffer[..head_end]).to_ascii_lowercase();
        let body_length: usize = head
            .lines()
            .find_map(|line| line.strip_prefix("content-length:"))
            .and_then(|value| value.trim().parse().ok())
            .unwrap_or(0);
        while buffer.len() < head_end + body_length {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
            }
        }
        let (status, delay) = answer(
            &String::from_utf8_lossy(&buffer[..head_end]),
            &buffer[head_end..head_end + body_length],
        );
        buffer.drain(..head_end + body_length);
        received.fetch_add(1, Ordering::Relaxed);
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let response = format!("HTTP/1.1 {status} Status\r\ncontent-length: 0\r\n\r\n");
        if stream.write_all(response.as_bytes()).await.is_err() {
            return;
        }
    }
}
