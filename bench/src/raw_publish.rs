//! A lean HTTP/1.1 publisher for the publish-throughput rows: one
//! keep-alive TCP connection per publisher, each request written in one
//! piece and its answer read by hand. The relay under test shares the
//! machine's cores with its load, so a general-purpose client's own work
//! per request (header maps, connection pool, body building) would come
//! out of the figure being measured; this one spends little more than the
//! two system calls a request needs.

use std::io::Write as _;
use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::BenchResult;

/// One publisher's connection to `POST /v1/events`.
pub struct RawPublisher {
    stream: TcpStream,
    head: String,
    request: Vec<u8>,
    answer: Vec<u8>,
}

/// A complete response: its status and how many bytes it took.
#[derive(Debug, PartialEq, Eq)]
struct Answer {
    status: u16,
    length: usize,
}

impl RawPublisher {
    pub async fn connect(address: SocketAddr, bearer: &str) -> BenchResult<RawPublisher> {
        let stream = TcpStream::connect(address).await?;
        stream.set_nodelay(true)?;
        Ok(RawPublisher {
            stream,
            head: format!(
                "POST /v1/events HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer {bearer}\r\n\
                 Content-Type: application/json\r\nContent-Length: "
            ),
            request: Vec::with_capacity(512),
            answer: Vec::with_capacity(4096),
        })
    }

    /// Sends `body` and waits for the whole answer; returns its status.
    pub async fn publish(&mut self, body: &[u8]) -> BenchResult<u16> {
        self.request.clear();
        self.request.extend_from_slice(self.head.as_bytes());
        write!(self.request, "{}\r\n\r\n", body.len())?;
        self.request.extend_from_slice(body);
        self.stream.write_all(&self.request).await?;
        self.answer.clear();
        loop {
            // Keep-alive: nothing of a next answer can follow this one, since
            // the next request is not sent yet.
            if let Some(answer) = complete_answer(&self.answer)? {
                return Ok(answer.status);
            }
            if self.stream.read_buf(&mut self.answer).await? == 0 {
                return Err("the relay closed the connection".into());
            }
        }
    }
}

/// The answer at the start of `bytes` once all of it has arrived.
fn complete_answer(bytes: &[u8]) -> BenchResult<Option<Answer>> {
    let Some(end) = bytes.windows(4).position(|w| w == b"\r\n\r\n") else {
        return Ok(None);
    };
    let head = std::str::from_utf8(&bytes[..end])?;
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|line| line.split(' ').nth(1))
        .and_then(|code| code.parse().ok())
        .ok_or("an answer without a status line")?;
    let body = lines
        .filter_map(|line| line.split_once(':'))
        .find(|(name, _)| name.eq_ignore_ascii_case("content-length"))
        .map(|(_, value)| value.trim().parse::<usize>())
        .transpose()?
        .ok_or("an answer without Content-Length")?;
    let length = end + 4 + body;
    Ok((bytes.len() >= length).then_some(Answer { status, length }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_is_complete_only_with_its_whole_body() {
        let whole = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello";
        assert_eq!(
            complete_answer(whole).unwrap(),
            Some(Answer {
                status: 200,
                length: whole.len()
            })
        );
        assert_eq!(complete_answer(&whole[..whole.len() - 1]).unwrap(), None);
        assert_eq!(complete_answer(b"HTTP/1.1 503 Serv").unwrap(), None);
        let refused = b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\n\r\n";
        assert_eq!(complete_answer(refused).unwrap().unwrap().status, 401);
        assert!(complete_answer(b"HTTP/1.1 200 OK\r\n\r\n").is_err());
    }
}
