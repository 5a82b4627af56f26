//! HTTP spoken by hand over any stream (a TCP socket, TLS over one), for
//! what no HTTP client sends: headers cut off, bodies dripped a byte at a
//! time, HTTP/2 frames left unfinished. Every read has a deadline.

use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;

use super::DEADLINE;

/// An HTTP/1.1 response as read off the wire.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    /// Header names in lower case.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The body as JSON.
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }
}

/// Reads one HTTP/1.1 response with a `content-length` (every answer of
/// the relay but the event stream has one), within [`DEADLINE`]. Bytes
/// read past it stay in `buffer` for the next response.
pub async fn read_response<S: AsyncRead + Unpin>(stream: &mut S, buffer: &mut Vec<u8>) -> Response {
    let deadline = Instant::now() + DEADLINE;
    let head_end = loop {
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
        read_more(stream, buffer, deadline).await;
    };
    let head = String::from_utf8(buffer[..head_end].to_vec()).unwrap();
    let mut lines = head.trim_end().split("\r\n");
    let status = lines
        .next()
        .and_then(|line| line.split(' ').nth(1))
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("not a status line: {head:?}"));
    let headers: Vec<(String, String)> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_lowercase(), value.trim().to_owned()))
        .collect();
    let length: usize = headers
        .iter()
        .find(|(name, _)| name == "content-length")
        .map(|(_, value)| value.parse().unwrap())
        .unwrap_or_else(|| panic!("no content-length: {head:?}"));
    while buffer.len() < head_end + length {
        read_more(stream, buffer, deadline).await;
    }
    let body = buffer[head_end..head_end + length].to_vec();
    buffer.drain(..head_end + length);
    Response {
        status,
        headers,
        body,
    }
}

async fn read_more<S: AsyncRead + Unpin>(stream: &mut S, buffer: &mut Vec<u8>, deadline: Instant) {
    let mut chunk = [0u8; 16 * 1024];
    let read = tokio::time::timeout_at(deadline, stream.read(&mut chunk))
        .await
        .expect("an answer before the deadline")
        .expect("the connection reads");
    assert!(
        read > 0,
        "the connection closed mid-answer: {:?}",
        String::from_utf8_lossy(buffer)
    );
    buffer.extend_from_slice(&chunk[..read]);
}

/// Waits for the peer to close the connection (the end of the stream, or
/// an error such as a reset or a TLS stream cut without its closing
/// alert), reading and keeping what arrives until then; fails the test if
/// it is still open after `within`.
pub async fn closed_within<S: AsyncRead + Unpin>(stream: &mut S, within: Duration) -> Vec<u8> {
    let deadline = Instant::now() + within;
    let mut seen = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut chunk)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return seen,
            Ok(Ok(read)) => seen.extend_from_slice(&chunk[..read]),
            Err(_) => panic!(
                "the connection was still open after {within:?}; it sent {:?}",
                String::from_utf8_lossy(&seen)
            ),
        }
    }
}

/// Writes `bytes` one at a time, `every` apart, until all are written or
/// the peer stops taking them; answers how many were written. A client
/// that sends its body slowly.
pub async fn drip<S: AsyncWrite + Unpin>(stream: &mut S, bytes: &[u8], every: Duration) -> usize {
    let mut ticks = tokio::time::interval(every);
    for (written, byte) in bytes.iter().enumerate() {
        ticks.tick().await;
        let sent = async {
            stream.write_all(std::slice::from_ref(byte)).await?;
            stream.flush().await
        };
        if sent.await.is_err() {
            return written;
        }
    }
    bytes.len()
}

/// HTTP/2 frames, for a client that speaks the protocol by hand.
pub mod h2 {
    use super::*;

    /// What a client sends first: the preface and an empty SETTINGS frame.
    pub fn preface() -> Vec<u8> {
        let mut bytes = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        bytes.extend(frame(SETTINGS, 0, 0, &[]));
        bytes
    }

    pub const DATA: u8 = 0x0;
    pub const HEADERS: u8 = 0x1;
    pub const SETTINGS: u8 = 0x4;
    pub const END_STREAM: u8 = 0x1;
    pub const END_HEADERS: u8 = 0x4;
    pub const ACK: u8 = 0x1;

    /// One frame: a 9-byte header and its payload.
    pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let length = u32::try_from(payload.len()).unwrap();
        let mut bytes = length.to_be_bytes()[1..].to_vec();
        bytes.push(kind);
        bytes.push(flags);
        bytes.extend((stream & 0x7fff_ffff).to_be_bytes());
        bytes.extend_from_slice(payload);
        bytes
    }

    /// A header block (HPACK, nothing indexed or compressed but the
    /// static table's `:method: GET` and `:scheme: https`) asking for
    /// `GET path`.
    pub fn get(path: &str) -> Vec<u8> {
        let mut block = vec![0x82, 0x87];
        for (index, value) in [(0x04, path), (0x01, "127.0.0.1")] {
            // A literal without indexing, its name from the static table.
            block.push(index);
            block.push(u8::try_from(value.len()).unwrap());
            block.extend_from_slice(value.as_bytes());
        }
        block
    }

    /// A frame as read: (type, flags, stream, payload).
    pub type Frame = (u8, u8, u32, Vec<u8>);

    /// The complete frames at the start of `bytes`.
    pub fn frames(mut bytes: &[u8]) -> Vec<Frame> {
        let mut frames = Vec::new();
        while bytes.len() >= 9 {
            let length = u32::from_be_bytes([0, bytes[0], bytes[1], bytes[2]]) as usize;
            if bytes.len() < 9 + length {
                break;
            }
            let id = u32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]) & 0x7fff_ffff;
            frames.push((bytes[3], bytes[4], id, bytes[9..9 + length].to_vec()));
            bytes = &bytes[9 + length..];
        }
        frames
    }

    /// Reads the next frame within [`DEADLINE`], acknowledging the
    /// server's SETTINGS on the way.
    pub async fn next_frame<S: AsyncRead + AsyncWrite + Unpin>(
        stream: &mut S,
        buffer: &mut Vec<u8>,
    ) -> Frame {
        let deadline = Instant::now() + DEADLINE;
        loop {
            if let Some(frame) = frames(buffer).into_iter().next() {
                buffer.drain(..9 + frame.3.len());
                if frame.0 == SETTINGS && frame.1 & ACK == 0 {
                    stream
                        .write_all(&self::frame(SETTINGS, ACK, 0, &[]))
                        .await
                        .unwrap();
                }
                return frame;
            }
            super::read_more(stream, buffer, deadline).await;
        }
    }
}
