//! Noticing that a client closed its connection while its stream is idle.
//!
//! The HTTP layer learns that a peer went away only when a write to it
//! fails, which for an idle event stream is the next heartbeat, up to
//! `sse.heartbeat_secs` later. Until then the stream holds its connection
//! permit, its place in the hub and its memory: a browser that reloads a
//! page a few times is refused for having too many streams. So a live
//! session peeks at its socket (never reading from it) and ends as soon as
//! the peer's side is closed (FIN) or reset (RST). On HTTP/1.x it peeks
//! when the connection wakes it for anything but an event: the HTTP layer
//! keeps reading the connection, so a FIN or an RST wakes the stream at
//! once; it looks once more `PEEK_EVERY` later. An HTTP/2 stream, which its
//! connection's reads never wake, peeks every `PEEK_EVERY`. A stream with
//! events flowing thus has no timer firing for it between heartbeats: with
//! ten thousand streams, a timer twice a second each was twenty thousand
//! wake-ups a second of CPU the events then waited behind.
//!
//! Peeking uses the connection's own descriptor: a second descriptor per
//! connection would double what 10,000 streams need. Under TLS the socket
//! beneath the TLS layer is peeked: the HTTP layer keeps reading a
//! connection while it streams, so a client's closing alert is consumed by
//! TLS and the peek then sees the end of the TCP stream, as for plain TCP.
//! Bytes not yet read (a record still in flight) count as alive; such a
//! stream is found by the next peek or by the heartbeat write.

use std::any::Any;
use std::io::ErrorKind;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::time::Duration;

use actix_web::dev::Extensions;

/// How often an HTTP/2 stream looks at its socket, and how soon an HTTP/1.x
/// stream woken by its connection looks again.
pub const PEEK_EVERY: Duration = Duration::from_millis(500);

/// The socket of a plain TCP connection, as its requests see it.
#[derive(Debug, Clone, Copy)]
pub struct PeerSocket(RawFd);

impl PeerSocket {
    /// True when the peer closed or reset the connection. Data the client
    /// sent and the HTTP layer has not read yet counts as alive.
    ///
    /// Must only be called while the connection is open, which holds for a
    /// session: it is the response body of this connection, polled by the
    /// connection's own dispatcher, which owns the socket.
    /// Cuts the connection: what it had queued still goes out, then the
    /// peer sees its end. For a stream whose reader stalled past the
    /// stream's end: the HTTP layer polls a response only when it can
    /// write, so a stream that cannot write cannot end itself.
    ///
    /// Must only be called while the connection is open (see
    /// [`PeerSocket::is_closed`]).
    pub fn cut(self) {
        // SAFETY: as in `is_closed`: the caller holds the connection open.
        let socket = unsafe { BorrowedFd::borrow_raw(self.0) };
        if let Err(error) = socket2::SockRef::from(&socket).shutdown(std::net::Shutdown::Both) {
            tracing::debug!(%error, "could not cut a stalled stream's connection");
        }
    }

    /// Bytes written to the socket that the peer has not acknowledged yet
    /// (`SIOCOUTQ`): how far the reader is behind, beyond what its own
    /// receive buffer holds. `None` where the kernel cannot tell.
    ///
    /// Must only be called while the connection is open (see
    /// [`PeerSocket::is_closed`]).
    pub fn unacknowledged(self) -> Option<usize> {
        #[cfg(target_os = "linux")]
        {
            let mut queued: libc::c_int = 0;
            // SAFETY: the descriptor is open (see above) and `queued` is
            // the `int` this request writes.
            let result = unsafe { libc::ioctl(self.0, libc::TIOCOUTQ, &mut queued) };
            (result == 0).then(|| usize::try_from(queued).unwrap_or(0))
        }
        #[cfg(not(target_os = "linux"))]
        {
            None
        }
    }

    pub fn is_closed(self) -> bool {
        // SAFETY: the descriptor is the connection's socket, which stays
        // open for as long as the connection's response is being polled
        // (see above); it is only borrowed for this one call.
        let socket = unsafe { BorrowedFd::borrow_raw(self.0) };
        let mut probe = [MaybeUninit::<u8>::uninit(); 1];
        // The socket is non-blocking (the runtime made it so), so peeking
        // never waits.
        match socket2::SockRef::from(&socket).peek(&mut probe) {
            Ok(0) => true,
            Ok(_) => false,
            Err(error) if error.kind() == ErrorKind::WouldBlock => false,
            Err(error) if error.kind() == ErrorKind::Interrupted => false,
            Err(_) => true,
        }
    }
}

/// The HTTP server's on-connect hook (the server module passes it in): remembers
/// the TCP socket of each connection, plain or under TLS.
pub fn on_connect(connection: &dyn Any, data: &mut Extensions) {
    type TlsOverTcp = actix_tls::accept::rustls_0_23::TlsStream<actix_web::rt::net::TcpStream>;
    if let Some(stream) = connection.downcast_ref::<actix_web::rt::net::TcpStream>() {
        data.insert(PeerSocket(stream.as_raw_fd()));
    } else if let Some(stream) = connection.downcast_ref::<TlsOverTcp>() {
        let (tcp, _) = stream.get_ref();
        data.insert(PeerSocket(tcp.as_raw_fd()));
    }
}
