//! The headers of every request arrive on time, on every connection.
//!
//! actix-http times only the first request of an HTTP/1.1 connection (its
//! `client_request_timeout`, set from `http.header_timeout_secs`, answered
//! 408). After a response, its keep-alive timer waits for the next request,
//! but stops at the first byte of it: a client that sends `GET /he` and
//! nothing more holds the connection for ever. Over HTTP/2 no request's
//! headers are timed at all.
//!
//! So each connection is read through [`Deadlined`], which shares a
//! [`ConnectionClock`] with the requests of the connection (through the
//! connection's data). The [`track`] middleware counts a request in when it
//! reaches the application, its headers complete, and out when its response
//! body is dropped: sent, or abandoned. Whenever no request is in flight,
//! the next one must reach the application within `http.header_timeout_secs`
//! of the moment the last one ended (for HTTP/2's first request, of the
//! connection's start; HTTP/1.1's first is actix-http's). Past that, every
//! read of the connection answers end-of-stream: the HTTP layer takes the
//! client for gone and closes the connection. No 408 is sent: nothing below
//! the HTTP layer can write into its stream of responses, and an HTTP/2
//! connection has no request to answer.
//!
//! The clock also carries the connection's place among the connections its
//! worker is reading a first request of (see [`super::serve`]), so that the
//! [`track`] middleware gives it back as soon as that request is answered.
//!
//! What this means beyond stalled headers: a kept-alive connection with
//! nothing in flight is closed `http.header_timeout_secs` after its last
//! response at the latest (actix-http's 5 s keep-alive closes a silent
//! HTTP/1.1 one sooner), and so is an idle HTTP/2 connection, whose pings
//! alone no longer keep it open. A long response (an event stream) is a
//! request in flight, which nothing here limits; request bodies have their
//! own deadline (see [`super::body`]).

use std::cell::Cell;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use actix_web::body::{BodySize, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::{Instant, Sleep};

/// What a connection's reader and its requests share.
pub struct ConnectionClock {
    /// How long the next request's headers may take.
    limit: Duration,
    /// Requests that reached the application and whose responses are not
    /// finished.
    in_flight: Cell<usize>,
    /// Since when no request has been in flight; `None` while the HTTP
    /// layer times the connection's first request itself.
    idle_since: Cell<Option<Instant>>,
    /// Whoever reads the connection, woken when its last request ends so
    /// that the deadline starts being watched.
    reader: Cell<Option<Waker>>,
    /// The connection's place among those its worker is opening (see
    /// `serve`), given back once its first request has been answered.
    opening: Cell<Option<OwnedSemaphorePermit>>,
}

impl ConnectionClock {
    /// When the next request's headers are due, if no request is in flight.
    fn deadline(&self) -> Option<Instant> {
        if self.in_flight.get() > 0 {
            return None;
        }
        self.idle_since.get().map(|since| since + self.limit)
    }

    /// Remembers who reads the connection.
    fn watched_by(&self, waker: &Waker) {
        let mut reader = self.reader.take();
        if !reader.as_ref().is_some_and(|known| known.will_wake(waker)) {
            reader = Some(waker.clone());
        }
        self.reader.set(reader);
    }

    /// Counts a request in until the returned guard is dropped.
    fn request(self: &Rc<Self>) -> InFlight {
        self.in_flight.set(self.in_flight.get() + 1);
        InFlight(Rc::clone(self))
    }
}

/// The clock of a connection, as its requests find it in the connection's
/// data.
#[derive(Clone)]
pub struct ClockHandle(Rc<ConnectionClock>);

/// A request in flight; dropping it ends the request.
pub struct InFlight(Rc<ConnectionClock>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let clock = &self.0;
        let left = clock.in_flight.get().saturating_sub(1);
        clock.in_flight.set(left);
        if left == 0 {
            clock.idle_since.set(Some(Instant::now()));
            if let Some(reader) = clock.reader.take() {
                reader.wake();
            }
        }
    }
}

/// A connection's stream (TCP, or TLS over it) read under the connection's
/// header deadline; writes pass through.
pub struct Deadlined<T> {
    io: T,
    clock: Rc<ConnectionClock>,
    /// Wakes the reader at the deadline; made at the first one.
    timer: Option<Pin<Box<Sleep>>>,
    /// The deadline passed: every read is the end of the stream.
    expired: bool,
}

impl<T> Deadlined<T> {
    /// Wraps a new connection. `first_request_timed` says the HTTP layer
    /// times the first request itself (HTTP/1.1); otherwise its headers are
    /// due `limit` from now.
    pub fn new(io: T, limit: Duration, first_request_timed: bool) -> Self {
        let idle_since = (!first_request_timed).then(Instant::now);
        Deadlined {
            io,
            clock: Rc::new(ConnectionClock {
                limit,
                in_flight: Cell::new(0),
                idle_since: Cell::new(idle_since),
                reader: Cell::new(None),
                opening: Cell::new(None),
            }),
            timer: None,
            expired: false,
        }
    }

    /// Holds `permit` until the connection's first request is answered
    /// (or the connection ends).
    pub fn opening(self, permit: Option<OwnedSemaphorePermit>) -> Self {
        self.clock.opening.set(permit);
        self
    }

    /// The stream beneath.
    pub fn get_ref(&self) -> &T {
        &self.io
    }

    /// The handle the connection's requests are counted with, for the
    /// connection's data.
    pub fn clock(&self) -> ClockHandle {
        ClockHandle(Rc::clone(&self.clock))
    }

    /// True once the next request's headers are overdue; otherwise makes
    /// sure the reader is woken when they become so.
    fn overdue(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(deadline) = self.clock.deadline() else {
            return false;
        };
        if Instant::now() >= deadline {
            return true;
        }
        let timer = match &mut self.timer {
            Some(timer) => {
                if timer.deadline() != deadline {
                    timer.as_mut().reset(deadline);
                }
                timer
            }
            None => self
                .timer
                .insert(Box::pin(tokio::time::sleep_until(deadline))),
        };
        timer.as_mut().poll(cx).is_ready()
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Deadlined<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.expired && this.overdue(cx) {
            this.expired = true;
            tracing::debug!(
                timeout = ?this.clock.limit,
                "closing a connection whose next request's headers did not arrive in time \
                 (http.header_timeout_secs)"
            );
        }
        if this.expired {
            // Nothing filled: the end of the stream.
            return Poll::Ready(Ok(()));
        }
        this.clock.watched_by(cx.waker());
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Deadlined<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// Middleware: counts each request in flight on its connection's clock,
/// from now until its response body is dropped.
pub async fn track<B: MessageBody + Unpin + 'static>(
    request: ServiceRequest,
    next: Next<B>,
) -> Result<ServiceResponse<InFlightBody<B>>, actix_web::Error> {
    let clock = request.conn_data::<ClockHandle>().cloned();
    let in_flight = clock.as_ref().map(|handle| handle.0.request());
    let response = next.call(request).await;
    // Answered (its body may stream for hours): the connection is open.
    if let Some(handle) = &clock {
        drop(handle.0.opening.take());
    }
    let response = response?;
    Ok(response.map_body(|_, body| InFlightBody {
        body,
        _in_flight: in_flight,
    }))
}

/// A response body that keeps its request in flight until it is dropped.
pub struct InFlightBody<B> {
    body: B,
    _in_flight: Option<InFlight>,
}

impl<B: MessageBody + Unpin> MessageBody for InFlightBody<B> {
    type Error = B::Error;

    fn size(&self) -> BodySize {
        self.body.size()
    }

    fn poll_next(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, Self::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_next(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_deadline_runs_only_while_no_request_is_in_flight() {
        let limit = Duration::from_secs(10);
        let first_timed = Deadlined::new((), limit, true);
        assert_eq!(first_timed.clock.deadline(), None);

        let connection = Deadlined::new((), limit, false);
        let clock = &connection.clock;
        let started = clock.deadline().unwrap();
        let (one, two) = (clock.request(), clock.request());
        assert_eq!(clock.deadline(), None);
        drop(one);
        assert_eq!(clock.deadline(), None, "a request is still in flight");
        drop(two);
        let next = clock.deadline().unwrap();
        assert!(next >= started, "the deadline restarts when the last ends");
        assert!(next <= Instant::now() + limit);
    }
}
