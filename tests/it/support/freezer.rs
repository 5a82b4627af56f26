//! A TCP proxy that can go silent the way a NAT gateway does when it drops
//! a flow: no FIN, no RST, bytes simply stop arriving. `freeze` black-holes
//! every flow open then (for good) and every flow opened while frozen;
//! `restore` lets new flows through again.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

#[derive(Default)]
struct Path {
    frozen: AtomicBool,
    /// Bumped by every freeze; a flow from an older one is dead.
    generation: AtomicU64,
}

impl Path {
    fn carries(&self, generation: u64) -> bool {
        !self.frozen.load(Ordering::SeqCst) && self.generation.load(Ordering::SeqCst) == generation
    }
}

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

pub struct Freezer {
    pub addr: SocketAddr,
    path: Arc<Path>,
    tasks: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl Freezer {
    /// Forwards a loopback port to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Freezer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let path = Arc::new(Path::default());
        let tasks: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let (accept_path, accept_tasks) = (Arc::clone(&path), Arc::clone(&tasks));
        let acceptor = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                let path = Arc::clone(&accept_path);
                let flow = tokio::spawn(async move {
                    let generation = path.generation.load(Ordering::SeqCst);
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let (client_read, client_write) = client.into_split();
                    let (server_read, server_write) = server.into_split();
                    tokio::join!(
                        pump(client_read, server_write, &path, generation),
                        pump(server_read, client_write, &path, generation),
                    );
                });
                accept_tasks.lock().unwrap().push(flow);
            }
        });
        tasks.lock().unwrap().push(acceptor);
        Freezer { addr, path, tasks }
    }

    /// A Postgres URL through the proxy, for `database` (such as
    /// `postgres`).
    pub fn url(&self, database: &str) -> String {
        format!(
            "postgres://postgres@{}/{database}?sslmode=disable",
            self.addr
        )
    }

    /// `db`'s URL on the shared server, through this proxy.
    pub fn url_for(&self, db: &super::TestDb) -> String {
        db.url
            .replace(&postgres_addr().to_string(), &self.addr.to_string())
    }

    pub fn freeze(&self) {
        self.path.generation.fetch_add(1, Ordering::SeqCst);
        self.path.frozen.store(true, Ordering::SeqCst);
    }

    pub fn restore(&self) {
        self.path.frozen.store(false, Ordering::SeqCst);
    }
}

/// Copies until either side closes; once the path stops carrying this
/// flow, holds both sockets open and forwards nothing, for ever.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    path: &Path,
    generation: u64,
) {
    let mut buffer = vec![0u8; 16 * 1024];
    loop {
        let read = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(read) => read,
        };
        if !path.carries(generation) {
            std::future::pending::<()>().await;
        }
        if to.write_all(&buffer[..read]).await.is_err() {
            break;
        }
    }
    // A clean end is passed on, as long as the path is alive.
    if path.carries(generation) {
        let _ = to.shutdown().await;
    } else {
        std::future::pending::<()>().await;
    }
}

impl Drop for Freezer {
    fn drop(&mut self) {
        for task in self.tasks.lock().unwrap().drain(..) {
            task.abort();
        }
    }
}
