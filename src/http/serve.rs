//! The HTTP server: the application on the listening socket, over plain
//! HTTP/1.1 or over TLS with HTTP/2 and HTTP/1.1 (ALPN), every connection
//! read through [`Deadlined`] so that each request's headers arrive on
//! time (see [`super::deadline`]).
//!
//! actix-web's `HttpServer` assembles the same parts (actix-server's accept
//! loop and workers, actix-http's `HttpService`, actix-tls's rustls
//! acceptor) but has no place to wrap a connection's stream, so they are
//! assembled here, with `HttpServer`'s defaults for everything not set.
//!
//! A plain connection is handed to the HTTP layer once its first bytes
//! have arrived and it has a place among the connections its worker is
//! reading a first request of (`http.opening_per_worker`, waited for at
//! most `http.opening_wait_ms`): a surge is read a few hundred at a time.
//!
//! Every connection is set `TCP_NODELAY` (see [`send_at_once`]).
//!
//! Plain connections are served by actix-http's HTTP/1.1 service alone,
//! not by `HttpService`: each connection's task holds `HttpService`'s
//! state for every protocol it could speak, and the HTTP/2 variant (an h2
//! connection with its codec, about 2 KiB) would sit in every idle
//! HTTP/1.1 event stream, where HTTP/2 can never be spoken.

use std::any::Any;
use std::fmt;
use std::future::ready;
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

use actix_http::body::MessageBody;
use actix_http::error::DispatchError;
use actix_http::{Extensions, HttpServiceBuilder, KeepAlive, Protocol, Request, Response};
use actix_server::Server;
use actix_service::boxed::{self, BoxServiceFactory};
use actix_service::{IntoServiceFactory, Service, ServiceFactory, ServiceFactoryExt, map_config};
use actix_tls::accept::TlsError;
use actix_tls::accept::rustls_0_23::{Acceptor, TlsStream};
use actix_web::dev::AppConfig;
use actix_web::rt::net::TcpStream;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::Semaphore;

use super::deadline::{ClosedCounters, Deadlined, Limits};

/// How long a closing connection gets to take its last bytes
/// (`HttpServer`'s default).
const CLIENT_DISCONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// What the server is built with, besides the application and the socket.
pub struct Settings {
    /// Worker threads; 0: one per core.
    pub workers: usize,
    /// `http.header_timeout_secs` (the first request's, by actix-http, and
    /// every later one's, by [`Deadlined`]) and `http.write_timeout_secs`.
    pub limits: Limits,
    /// Counts each connection at its end.
    pub closed: Arc<ClosedCounters>,
    /// How long open connections get to finish when the server stops.
    pub shutdown_timeout: Duration,
    /// `http.opening_per_worker`: plain connections each worker reads a
    /// first request of at once.
    pub opening_per_worker: usize,
    /// `http.opening_wait_ms`: how long a connection waits for one of those
    /// places before it is read anyway.
    pub opening_wait: Duration,
    /// Called with each new connection's stream (a `TcpStream` or a
    /// `TlsStream<TcpStream>`) and the connection's data.
    pub on_connect: fn(&dyn Any, &mut Extensions),
}

/// A server running `factory`'s application on `listener`; with `tls`,
/// HTTPS (HTTP/2 offered first), else plain HTTP/1.1. Run it by awaiting
/// it; stop it through its handle.
pub fn server<F, I, S, B>(
    factory: F,
    listener: TcpListener,
    tls: Option<rustls::ServerConfig>,
    settings: Settings,
) -> std::io::Result<Server>
where
    F: Fn() -> I + Send + Clone + 'static,
    I: IntoServiceFactory<S, Request>,
    S: ServiceFactory<Request, Config = AppConfig> + 'static,
    S::Error: Into<actix_web::Error> + 'static,
    S::InitError: fmt::Debug + 'static,
    S::Response: Into<Response<B>> + 'static,
    <S::Service as Service<Request>>::Future: 'static,
    S::Service: 'static,
    B: MessageBody + 'static,
{
    let address = listener.local_addr()?;
    let mut builder = Server::build()
        .disable_signals()
        .shutdown_timeout(settings.shutdown_timeout.as_secs());
    if settings.workers > 0 {
        builder = builder.workers(settings.workers);
    }
    let Settings {
        limits,
        closed,
        on_connect,
        opening_per_worker,
        opening_wait,
        ..
    } = settings;
    let header_timeout = limits.headers;
    let builder = match tls {
        None => builder.listen("eventrelay-http", listener, move || {
            let http = http_builder(address, header_timeout, on_connect).h1(application(&factory));
            // Per worker: a connection is read by the worker it landed on.
            let opening = Arc::new(Semaphore::new(opening_per_worker));
            let closed = Arc::clone(&closed);
            (move |tcp: TcpStream| {
                let opening = Arc::clone(&opening);
                let closed = Arc::clone(&closed);
                async move {
                    send_at_once(&tcp);
                    first_bytes(&tcp, header_timeout).await?;
                    let permit = tokio::time::timeout(opening_wait, opening.acquire_owned())
                        .await
                        .ok()
                        .and_then(Result::ok);
                    let peer = tcp.peer_addr().ok();
                    let stream = Deadlined::new(tcp, limits, true, closed).opening(permit);
                    Ok::<_, DispatchError>((stream, peer))
                }
            })
            .into_factory()
            .and_then(http)
        })?,
        Some(mut config) => {
            // As actix-web does: HTTP/2 first, then HTTP/1.1.
            let mut protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
            protocols.append(&mut config.alpn_protocols);
            config.alpn_protocols = protocols;
            builder.listen("eventrelay-https", listener, move || {
                let closed = Arc::clone(&closed);
                let http =
                    http_builder(address, header_timeout, on_connect).finish(application(&factory));
                Acceptor::new(config.clone())
                    .map_err(TlsError::into_service_error)
                    .and_then(move |tls: TlsStream<TcpStream>| {
                        let protocol = match tls.get_ref().1.alpn_protocol() {
                            Some(b"h2") => Protocol::Http2,
                            _ => Protocol::Http1,
                        };
                        send_at_once(tls.get_ref().0);
                        let peer = tls.get_ref().0.peer_addr().ok();
                        let first_timed = protocol == Protocol::Http1;
                        let stream = Deadlined::new(tls, limits, first_timed, Arc::clone(&closed));
                        ready(Ok::<_, TlsError<std::io::Error, DispatchError>>((
                            stream, protocol, peer,
                        )))
                    })
                    .and_then(http.map_err(TlsError::Service))
            })?
        }
    };
    Ok(builder.run())
}

/// Turns Nagle's algorithm off on a new connection: an event frame is
/// small and must leave as soon as it is written, not wait for the
/// client's acknowledgement of the one before (which a client may hold
/// back for up to 40 ms). Neither actix-server nor actix-http does this.
/// Frames a session has ready at once still leave together: it joins
/// them into one write.
fn send_at_once(tcp: &TcpStream) {
    if let Err(error) = tcp.set_nodelay(true) {
        tracing::debug!(%error, "could not set TCP_NODELAY on a new connection");
    }
}

/// Waits until a new connection has something to read (or is closed), at
/// most `limit`.
///
/// actix-http starts timing a connection's first request when it first
/// polls the connection, and reads it only when polled again after the
/// bytes arrive. When thousands of clients come back at once (a restart),
/// every connection waits its turn behind the others' work twice, and
/// requests whose headers had long arrived were answered 408. Handed over
/// only once its first bytes are there, a connection's headers are read at
/// the first poll; a client that sends nothing is still closed after
/// `limit`, and one that starts but never finishes after `limit` more.
async fn first_bytes(tcp: &TcpStream, limit: Duration) -> Result<(), DispatchError> {
    match tokio::time::timeout(limit, tcp.readable()).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(error)) => Err(DispatchError::Io(error)),
        Err(_) => Err(DispatchError::SlowRequestTimeout),
    }
}

/// The application as actix-http serves it: its errors already answers.
type Application<Response, InitError> =
    BoxServiceFactory<(), Request, Response, actix_web::HttpResponse, InitError>;

/// actix-http's settings for one worker, over streams of type `T`.
fn http_builder<T, S>(
    address: SocketAddr,
    header_timeout: Duration,
    on_connect: fn(&dyn Any, &mut Extensions),
) -> HttpServiceBuilder<Deadlined<T>, S>
where
    S: ServiceFactory<Request, Config = ()>,
    S::Error: Into<Response<actix_http::body::BoxBody>> + 'static,
    S::InitError: fmt::Debug,
    <S::Service as Service<Request>>::Future: 'static,
    T: AsyncRead + AsyncWrite + Unpin + 'static,
{
    HttpServiceBuilder::default()
        .keep_alive(KeepAlive::default())
        .client_request_timeout(header_timeout)
        .client_disconnect_timeout(CLIENT_DISCONNECT_TIMEOUT)
        .local_addr(address)
        .on_connect_ext(move |stream: &Deadlined<T>, data: &mut Extensions| {
            data.insert(stream.clock());
            on_connect(stream.get_ref(), data);
        })
}

/// The application as actix-http serves it, for one worker. It gets
/// actix-web's default `AppConfig`: what that holds (a host, a scheme and
/// an address for `ConnectionInfo` to fall back on when a request names
/// none) is read nowhere in the relay, and the constructor `HttpServer`
/// uses is private to actix-web.
fn application<F, I, S, B>(factory: &F) -> Application<S::Response, S::InitError>
where
    F: Fn() -> I,
    I: IntoServiceFactory<S, Request>,
    S: ServiceFactory<Request, Config = AppConfig> + 'static,
    S::Error: Into<actix_web::Error> + 'static,
    S::InitError: fmt::Debug + 'static,
    S::Response: Into<Response<B>> + 'static,
    <S::Service as Service<Request>>::Future: 'static,
    S::Service: 'static,
    B: MessageBody + 'static,
{
    let application = factory()
        .into_factory()
        .map_err(|error| error.into().error_response());
    boxed::factory(map_config(application, |()| AppConfig::default()))
}
