//! Every request has a deadline, over raw sockets against a real relay:
//! the body of each request that has one, and refusals that never wait
//! for a body.

mod bodies;
