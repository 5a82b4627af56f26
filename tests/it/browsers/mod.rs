//! Browsers across origins (CORS) and HTTPS/HTTP/2 served by the relay itself.

mod cors;
mod tls;
