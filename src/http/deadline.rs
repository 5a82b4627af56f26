//! Every connection makes progress on time: each request's headers
//! arrive, and each response is taken by the client.
//!
//! actix-http times only the first request of an HTTP/1.1 connection (its
//! `client_request_timeout`, set from `http.header_timeout_secs`, answered
//! 408). After a response, its keep-alive timer waits for the next request,
//! but stops at the first byte of it: a client that sends `GET /he` and
//! nothing more holds the connection for ever. Over HTTP/2 no request's
//! headers are timed at all. And nothing times a response in flight: a
//! client that stops reading, or opens an HTTP/2 stream with a window of
//! zero, holds its connection (and the kernel's send buffer) for ever.
//!
//! So each connection is read and written through [`Deadlined`], which
//! shares a [`ConnectionClock`] with the requests of the connection
//! (through the connection's data). The [`track`] middleware counts a
//! request in when it reaches the application, its headers complete, and
//! out when its response body is dropped: sent, or abandoned. Three
//! deadlines follow from it:
//!
//! - **Headers.** Whenever no request is in flight, the next one must reach
//!   the application within `http.header_timeout_secs` of the moment the
//!   last one ended (for HTTP/2's first request, of the connection's start;
//!   HTTP/1.1's first is actix-http's). Past that, every read answers
//!   end-of-stream: the HTTP layer takes the client for gone and closes the
//!   connection. No 408 is sent: nothing below the HTTP layer can write
//!   into its stream of responses, and an HTTP/2 connection has no request
//!   to answer.
//! - **Writes.** A write the socket refuses (its send buffer full) must be
//!   followed by one it takes within `http.write_timeout_secs`.
//! - **Pulls.** A response body that handed the HTTP layer a chunk must be
//!   asked for its next within `http.write_timeout_secs`. The HTTP layer
//!   asks once the chunk is on its way: over HTTP/1.1 when its buffer has
//!   room (so this agrees with the write deadline), over HTTP/2 when the
//!   stream's flow-control window lets the chunk go. A client that keeps
//!   the connection busy with pings while one stream's window stays shut
//!   is caught here, where the socket itself never stalls.
//!
//! Past a write or pull deadline every read and write of the connection
//! fails, and the HTTP layer closes it (an event stream with it: a reader
//! that takes nothing is a slow consumer). An idle event stream is not
//! waiting on its client, only on events, and no deadline runs.
//! `eventrelay_connections_closed_total{reason}` counts every connection
//! at its end, by which deadline (if any) closed it.
//!
//! The clock also carries the connection's place among the connections its
//! worker is reading a first request of (see [`super::serve`]), so that the
//! [`track`] middleware gives it back as soon as that request is answered.
//!
//! What this means beyond stalled clients: a kept-alive connection with
//! nothing in flight is closed `http.header_timeout_secs` after its last
//! response at the latest (actix-http's 5 s keep-alive closes a silent
//! HTTP/1.1 one sooner), and so is an idle HTTP/2 connection, whose pings
//! alone no longer keep it open. Request bodies have their own deadline
//! (see [`super::body`]). Pipelining is bounded by actix-http: an HTTP/1.1
//! connection has at most 16 requests parsed and waiting, and no more is
//! read while its answers wait to be written.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use actix_web::body::{BodySize, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use bytes::Bytes;
use prometheus_client::metrics::counter::Counter;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::{Instant, Sleep};

/// The bounds a connection is held to.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// `http.header_timeout_secs`.
    pub headers: Duration,
    /// `http.write_timeout_secs`.
    pub writes: Duration,
}

/// `eventrelay_connections_closed_total`, one counter per reason, shared
/// by every connection of the server.
#[derive(Debug, Default)]
pub struct ClosedCounters {
    pub header_timeout: Counter,
    pub write_timeout: Counter,
    /// Closed by the client, by the HTTP layer (keep-alive, an error) or
    /// at shutdown: no deadline of this module.
    pub ended: Counter,
}

/// Which deadline closed a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expired {
    Headers,
    Writes,
}

/// What a connection's reader and its requests share.
pub struct ConnectionClock {
    limits: Limits,
    /// Requests that reached the application and whose responses are not
    /// finished.
    in_flight: Cell<usize>,
    /// Since when no request has been in flight; `None` while the HTTP
    /// layer times the connection's first request itself.
    idle_since: Cell<Option<Instant>>,
    /// Response bodies that handed over a chunk and have not been asked
    /// for the next: (body, since when). One at a time over HTTP/1.1.
    awaiting_pull: RefCell<Vec<(u64, Instant)>>,
    /// Numbers the connection's response bodies.
    bodies: Cell<u64>,
    /// Whoever reads the connection, woken when a deadline starts running
    /// so that it is watched.
    reader: Cell<Option<Waker>>,
    /// The connection's place among those its worker is opening (see
    /// `serve`), given back once its first request has been answered.
    opening: Cell<Option<OwnedSemaphorePermit>>,
}

impl ConnectionClock {
    /// When the next request's headers are due, if no request is in flight.
    fn headers_due(&self) -> Option<Instant> {
        if self.in_flight.get() > 0 {
            return None;
        }
        self.idle_since
            .get()
            .map(|since| since + self.limits.headers)
    }

    /// When the longest-waiting response body must have been asked for
    /// its next chunk.
    fn pull_due(&self) -> Option<Instant> {
        let awaiting = self.awaiting_pull.borrow();
        let oldest = awaiting.iter().map(|&(_, since)| since).min()?;
        Some(oldest + self.limits.writes)
    }

    /// Remembers who reads the connection.
    fn watched_by(&self, waker: &Waker) {
        let mut reader = self.reader.take();
        if !reader.as_ref().is_some_and(|known| known.will_wake(waker)) {
            reader = Some(waker.clone());
        }
        self.reader.set(reader);
    }

    /// Wakes the reader, unless it is the task at hand (which watches the
    /// deadlines at its next read or write anyway).
    fn wake_reader(&self, current: Option<&Waker>) {
        let reader = self.reader.take();
        match (&reader, current) {
            (Some(reader), Some(current)) if reader.will_wake(current) => {}
            (Some(reader), _) => reader.wake_by_ref(),
            (None, _) => {}
        }
        self.reader.set(reader);
    }

    /// Counts a request in until the returned guard is dropped.
    fn request(self: &Rc<Self>) -> InFlight {
        self.in_flight.set(self.in_flight.get() + 1);
        InFlight(Rc::clone(self))
    }

    /// A number for a new response body.
    fn new_body(&self) -> u64 {
        let body = self.bodies.get();
        self.bodies.set(body + 1);
        body
    }

    /// `body` handed over a chunk: its next pull is due.
    fn chunk_handed_over(&self, body: u64, waker: &Waker) {
        let mut awaiting = self.awaiting_pull.borrow_mut();
        let first = awaiting.is_empty();
        awaiting.push((body, Instant::now()));
        drop(awaiting);
        if first {
            self.wake_reader(Some(waker));
        }
    }

    /// `body` is being asked for its next chunk (or is gone).
    fn pulled(&self, body: u64) {
        let mut awaiting = self.awaiting_pull.borrow_mut();
        if let Some(at) = awaiting.iter().position(|&(waiting, _)| waiting == body) {
            awaiting.swap_remove(at);
        }
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
            clock.wake_reader(None);
        }
    }
}

/// A connection's stream (TCP, or TLS over it) read and written under the
/// connection's deadlines.
pub struct Deadlined<T> {
    io: T,
    clock: Rc<ConnectionClock>,
    /// Since when the socket has refused every write.
    write_blocked_since: Option<Instant>,
    /// Wakes the connection's task at the next deadline; made at the first.
    timer: Option<Pin<Box<Sleep>>>,
    /// A deadline passed: reads end (headers) or fail (writes), and so do
    /// writes.
    expired: Option<Expired>,
    closed: Arc<ClosedCounters>,
}

impl<T> Deadlined<T> {
    /// Wraps a new connection. `first_request_timed` says the HTTP layer
    /// times the first request itself (HTTP/1.1); otherwise its headers are
    /// due `limits.headers` from now.
    pub fn new(
        io: T,
        limits: Limits,
        first_request_timed: bool,
        closed: Arc<ClosedCounters>,
    ) -> Self {
        let idle_since = (!first_request_timed).then(Instant::now);
        Deadlined {
            io,
            clock: Rc::new(ConnectionClock {
                limits,
                in_flight: Cell::new(0),
                idle_since: Cell::new(idle_since),
                awaiting_pull: RefCell::new(Vec::new()),
                bodies: Cell::new(0),
                reader: Cell::new(None),
                opening: Cell::new(None),
            }),
            write_blocked_since: None,
            timer: None,
            expired: None,
            closed,
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

    /// Which deadline has passed, if one has; otherwise makes sure the
    /// connection's task is woken at the next.
    fn check(&mut self, cx: &mut Context<'_>) -> Option<Expired> {
        if self.expired.is_some() {
            return self.expired;
        }
        let writes = self
            .write_blocked_since
            .map(|since| since + self.clock.limits.writes);
        let due = [
            (self.clock.headers_due(), Expired::Headers),
            (writes, Expired::Writes),
            (self.clock.pull_due(), Expired::Writes),
        ]
        .into_iter()
        .filter_map(|(due, kind)| Some((due?, kind)))
        .min_by_key(|&(due, _)| due);
        let (deadline, kind) = due?;
        let passed = Instant::now() >= deadline || {
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
        };
        if !passed {
            return None;
        }
        match kind {
            Expired::Headers => tracing::debug!(
                timeout = ?self.clock.limits.headers,
                "closing a connection whose next request's headers did not arrive in time \
                 (http.header_timeout_secs)"
            ),
            Expired::Writes => tracing::debug!(
                timeout = ?self.clock.limits.writes,
                "closing a connection whose client took none of a response in time \
                 (http.write_timeout_secs)"
            ),
        }
        self.expired = Some(kind);
        self.expired
    }

    /// The outcome of a write, with the write deadline kept.
    fn wrote<R>(
        &mut self,
        cx: &mut Context<'_>,
        outcome: Poll<io::Result<R>>,
    ) -> Poll<io::Result<R>> {
        match outcome {
            Poll::Pending => {
                self.write_blocked_since.get_or_insert_with(Instant::now);
                match self.check(cx) {
                    Some(_) => Poll::Ready(Err(timed_out())),
                    None => Poll::Pending,
                }
            }
            ready => {
                self.write_blocked_since = None;
                ready
            }
        }
    }

    /// Fails a write once the write deadline has passed.
    fn refuse_write(&mut self, cx: &mut Context<'_>) -> Option<io::Error> {
        (self.check(cx) == Some(Expired::Writes)).then(timed_out)
    }
}

fn timed_out() -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        "the client took none of the response within http.write_timeout_secs",
    )
}

impl<T> Drop for Deadlined<T> {
    fn drop(&mut self) {
        match self.expired {
            Some(Expired::Headers) => self.closed.header_timeout.inc(),
            Some(Expired::Writes) => self.closed.write_timeout.inc(),
            None => self.closed.ended.inc(),
        };
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Deadlined<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match this.check(cx) {
            // Nothing filled: the end of the stream.
            Some(Expired::Headers) => return Poll::Ready(Ok(())),
            Some(Expired::Writes) => return Poll::Ready(Err(timed_out())),
            None => {}
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
        let this = self.get_mut();
        if let Some(error) = this.refuse_write(cx) {
            return Poll::Ready(Err(error));
        }
        let outcome = Pin::new(&mut this.io).poll_write(cx, buf);
        this.wrote(cx, outcome)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if let Some(error) = this.refuse_write(cx) {
            return Poll::Ready(Err(error));
        }
        let outcome = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.wrote(cx, outcome)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(error) = this.refuse_write(cx) {
            return Poll::Ready(Err(error));
        }
        let outcome = Pin::new(&mut this.io).poll_flush(cx);
        this.wrote(cx, outcome)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// Middleware: counts each request in flight on its connection's clock,
/// from now until its response body is dropped, and watches that body's
/// chunks being taken.
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
    Ok(response.map_body(|_, body| {
        let id = in_flight.as_ref().map(|request| request.0.new_body());
        InFlightBody {
            body,
            id,
            handed_over: false,
            in_flight,
        }
    }))
}

/// A response body that keeps its request in flight until it is dropped,
/// and tells its connection's clock when it awaits a pull.
pub struct InFlightBody<B> {
    body: B,
    /// Its number on the connection (none outside a tracked connection).
    id: Option<u64>,
    /// It handed over a chunk and has not been asked for the next.
    handed_over: bool,
    in_flight: Option<InFlight>,
}

impl<B> InFlightBody<B> {
    fn pulled(&mut self) {
        if std::mem::take(&mut self.handed_over)
            && let (Some(request), Some(id)) = (&self.in_flight, self.id)
        {
            request.0.pulled(id);
        }
    }
}

impl<B> Drop for InFlightBody<B> {
    fn drop(&mut self) {
        self.pulled();
    }
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
        let this = self.get_mut();
        this.pulled();
        let next = Pin::new(&mut this.body).poll_next(cx);
        if let Poll::Ready(Some(Ok(_))) = &next
            && let (Some(request), Some(id)) = (&this.in_flight, this.id)
        {
            this.handed_over = true;
            request.0.chunk_handed_over(id, cx.waker());
        }
        next
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        headers: Duration::from_secs(10),
        writes: Duration::from_secs(30),
    };

    /// A socket whose peer takes bytes only when told to, and sends none.
    #[derive(Default)]
    struct Peer {
        takes: bool,
    }

    impl AsyncRead for Peer {
        fn poll_read(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            _: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            Poll::Pending
        }
    }

    impl AsyncWrite for Peer {
        fn poll_write(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            if self.takes {
                Poll::Ready(Ok(buf.len()))
            } else {
                Poll::Pending
            }
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    fn connection(counters: &Arc<ClosedCounters>) -> Deadlined<Peer> {
        Deadlined::new(Peer::default(), LIMITS, true, Arc::clone(counters))
    }

    fn write(connection: &mut Deadlined<Peer>) -> Poll<io::Result<usize>> {
        let mut cx = Context::from_waker(Waker::noop());
        Pin::new(connection).poll_write(&mut cx, b"event")
    }

    fn read(connection: &mut Deadlined<Peer>) -> Poll<io::Result<()>> {
        let mut cx = Context::from_waker(Waker::noop());
        let mut bytes = [0u8; 16];
        Pin::new(connection).poll_read(&mut cx, &mut ReadBuf::new(&mut bytes))
    }

    fn timed_out<T: std::fmt::Debug>(outcome: Poll<io::Result<T>>) -> bool {
        matches!(outcome, Poll::Ready(Err(error)) if error.kind() == io::ErrorKind::TimedOut)
    }

    #[test]
    fn the_header_deadline_runs_only_while_no_request_is_in_flight() {
        let counters = Arc::default();
        let first_timed = connection(&counters);
        assert_eq!(first_timed.clock.headers_due(), None);

        let connection = Deadlined::new(Peer::default(), LIMITS, false, counters);
        let clock = &connection.clock;
        let started = clock.headers_due().unwrap();
        let (one, two) = (clock.request(), clock.request());
        assert_eq!(clock.headers_due(), None);
        drop(one);
        assert_eq!(clock.headers_due(), None, "a request is still in flight");
        drop(two);
        let next = clock.headers_due().unwrap();
        assert!(next >= started, "the deadline restarts when the last ends");
        assert!(next <= Instant::now() + LIMITS.headers);
    }

    #[tokio::test(start_paused = true)]
    async fn a_socket_that_takes_nothing_fails_at_the_write_timeout() {
        let counters = Arc::default();
        let mut connection = connection(&counters);
        let _request = connection.clock.request();
        assert!(write(&mut connection).is_pending());
        tokio::time::advance(LIMITS.writes - Duration::from_secs(1)).await;
        assert!(write(&mut connection).is_pending(), "not yet");
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(timed_out(write(&mut connection)));
        assert!(timed_out(read(&mut connection)), "reads fail too");
        drop(connection);
        assert_eq!(counters.write_timeout.get(), 1);
        assert_eq!(counters.ended.get(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn any_byte_taken_restarts_the_write_timeout() {
        let counters = Arc::default();
        let mut connection = connection(&counters);
        let _request = connection.clock.request();
        for _ in 0..4 {
            connection.io.takes = false;
            assert!(write(&mut connection).is_pending());
            tokio::time::advance(LIMITS.writes - Duration::from_secs(5)).await;
            connection.io.takes = true;
            assert!(matches!(write(&mut connection), Poll::Ready(Ok(5))));
        }
        drop(connection);
        assert_eq!(counters.write_timeout.get(), 0);
        assert_eq!(counters.ended.get(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_not_asked_for_its_next_chunk_closes_the_connection() {
        let counters = Arc::default();
        let mut connection = connection(&counters);
        let clock = Rc::clone(&connection.clock);
        let _request = clock.request();
        let (shut, flowing) = (clock.new_body(), clock.new_body());
        clock.chunk_handed_over(shut, Waker::noop());
        for _ in 0..4 {
            // Another stream of the connection keeps going, and the
            // socket takes everything.
            clock.chunk_handed_over(flowing, Waker::noop());
            tokio::time::advance(LIMITS.writes / 4 - Duration::from_millis(1)).await;
            clock.pulled(flowing);
            connection.io.takes = true;
            assert!(write(&mut connection).is_ready());
            assert!(read(&mut connection).is_pending());
        }
        tokio::time::advance(Duration::from_millis(10)).await;
        assert!(timed_out(read(&mut connection)));
        assert!(timed_out(write(&mut connection)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_asked_again_in_time_keeps_its_connection() {
        let counters = Arc::default();
        let mut connection = connection(&counters);
        let clock = Rc::clone(&connection.clock);
        let _request = clock.request();
        let body = clock.new_body();
        for _ in 0..4 {
            clock.chunk_handed_over(body, Waker::noop());
            tokio::time::advance(LIMITS.writes - Duration::from_secs(1)).await;
            assert!(read(&mut connection).is_pending());
            clock.pulled(body);
        }
        // Idle (waiting for events, not for the client): no deadline.
        tokio::time::advance(LIMITS.writes * 10).await;
        assert!(read(&mut connection).is_pending());
    }
}
