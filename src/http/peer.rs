//! Noticing that a client closed its connection while its stream is idle.
//!
//! The HTTP layer learns that a peer went away only when a write to it
//! fails, which for an idle event stream is the next heartbeat, up to
//! `sse.heartbeat_secs` later. Until then the stream holds its connection
//! permit, its place in the hub and its memory: a browser that reloads a
//! page a few times is refused for having too many streams. So every plain
//! TCP connection gets a watcher on a second handle to its socket, which
//! peeks (never reads) and reports the end of the peer's side (FIN or RST)
//! at once. Sessions end when their connection's watcher reports.
//!
//! The second handle would keep the socket open after the HTTP layer closes
//! it, so the watcher stops, and closes it, as soon as the connection's
//! data is dropped. TLS connections are not watched; their streams are
//! still found by the heartbeat write.

use std::any::Any;
use std::os::fd::AsFd;
use std::time::Duration;

use actix_web::dev::Extensions;
use tokio::sync::{oneshot, watch};

/// How long a watcher waits before peeking again when the client has sent
/// bytes the HTTP layer has not read yet (peeking would return at once).
const RECHECK: Duration = Duration::from_millis(250);

/// A connection's watcher, as its requests see it.
#[derive(Clone)]
pub struct PeerWatch {
    closed: watch::Receiver<bool>,
}

impl PeerWatch {
    /// Resolves when the peer has closed its side of the connection.
    pub async fn closed(mut self) {
        let _ = self.closed.wait_for(|closed| *closed).await;
    }
}

/// Dropped with the connection's data, which stops the watcher.
struct StopWatching(#[allow(dead_code)] oneshot::Sender<()>);

/// `HttpServer::on_connect`: starts a watcher for plain TCP connections.
pub fn on_connect(connection: &dyn Any, data: &mut Extensions) {
    let Some(stream) = connection.downcast_ref::<actix_web::rt::net::TcpStream>() else {
        return;
    };
    let Ok(handle) = stream.as_fd().try_clone_to_owned() else {
        return;
    };
    let handle = std::net::TcpStream::from(handle);
    if handle.set_nonblocking(true).is_err() {
        return;
    }
    let Ok(handle) = tokio::net::TcpStream::from_std(handle) else {
        return;
    };
    let (closed, watch) = watch::channel(false);
    let (stop, stopped) = oneshot::channel();
    tokio::spawn(watch_peer(handle, closed, stopped));
    data.insert(PeerWatch { closed: watch });
    data.insert(StopWatching(stop));
}

async fn watch_peer(
    socket: tokio::net::TcpStream,
    closed: watch::Sender<bool>,
    mut stopped: oneshot::Receiver<()>,
) {
    let mut probe = [0u8; 1];
    loop {
        tokio::select! {
            _ = &mut stopped => return,
            peeked = socket.peek(&mut probe) => match peeked {
                Ok(0) | Err(_) => {
                    closed.send_replace(true);
                    return;
                }
                // Bytes of a next request, not yet read by the HTTP layer.
                Ok(_) => tokio::select! {
                    _ = &mut stopped => return,
                    () = tokio::time::sleep(RECHECK) => {}
                },
            },
        }
    }
}
