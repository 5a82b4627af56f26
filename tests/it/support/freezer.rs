//! The silent-path proxy (shared with the fault campaign), and where it
//! points in the tests: the shared Postgres server.

use std::net::SocketAddr;

#[path = "../../../campaign/src/freezer.rs"]
mod proxy;
pub use proxy::Freezer;

/// The shared Postgres server's address, for a proxy to forward to.
pub fn postgres_addr() -> SocketAddr {
    let config: tokio_postgres::Config = super::database_url().parse().unwrap();
    let host = match &config.get_hosts()[0] {
        tokio_postgres::config::Host::Tcp(host) => host.clone(),
        #[allow(unreachable_patterns)]
        _ => "127.0.0.1".to_owned(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    format!("{host}:{port}").parse().unwrap()
}

impl Freezer {
    /// Forwards a free loopback port to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Freezer {
        Freezer::start_on("127.0.0.1:0".parse().unwrap(), upstream)
            .await
            .unwrap()
    }

    /// `db`'s URL on the shared server, through this proxy.
    pub fn url_for(&self, db: &super::TestDb) -> String {
        db.url
            .replace(&postgres_addr().to_string(), &self.addr.to_string())
    }
}
