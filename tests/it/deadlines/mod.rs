//! Every request has a deadline, over raw sockets against a real relay:
//! the headers of each request on a kept-alive connection (HTTP/1.1 and
//! HTTP/2, plain and TLS), the body of each request that has one,
//! refusals that never wait for a body, and every response's writes.

mod bodies;
mod headers;
mod writes;
