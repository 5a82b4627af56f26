//! The relay's own side of its connections, read from this process's file
//! descriptors: the test relay runs in the test's process, so the sockets
//! it accepted are there to inspect.

use std::net::SocketAddr;
use std::os::fd::{BorrowedFd, RawFd};

/// For each connection the relay listening on `server` accepted and still
/// holds, whether it has `TCP_NODELAY` set.
pub fn accepted_nodelay(server: SocketAddr) -> Vec<bool> {
    let Ok(entries) = std::fs::read_dir("/proc/self/fd") else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let Some(fd) = entry
            .file_name()
            .to_str()
            .and_then(|name| name.parse::<RawFd>().ok())
        else {
            continue;
        };
        // SAFETY: `fd` was one of this process's descriptors a moment ago
        // and is only borrowed for the reads below, never closed here. One
        // that is not a socket (the listing's own), or was closed
        // meanwhile, fails those reads and is skipped.
        let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
        let socket = socket2::SockRef::from(&borrowed);
        let local = socket.local_addr().ok().and_then(|a| a.as_socket());
        let accepted = local == Some(server) && socket.peer_addr().is_ok();
        if accepted && let Ok(nodelay) = socket.tcp_nodelay() {
            found.push(nodelay);
        }
    }
    found
}

/// The address a base URL (`http://host:port`) names.
pub fn address_of(base: &str) -> SocketAddr {
    let rest = base.split("://").nth(1).unwrap_or(base);
    rest.trim_end_matches('/')
        .parse()
        .expect("a base URL with an IP and port")
}
