//! A TCP proxy that can go silent the way a NAT gateway does when it drops
//! a flow: no FIN, no RST, bytes simply stop arriving. `freeze` black-holes
//! every flow open then (for good) and every flow opened while frozen;
//! `restore` lets new flows through again; `sever` closes the dead flows,
//! as a server's TCP keepalive would reap them in the end.
//!
//! The integration tests share this file (by `#[path]`) with the fault
//! campaign, so it uses nothing but tokio.

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

/// Every flow's task, with the generation it was opened in.
type Flows = Arc<Mutex<Vec<(u64, JoinHandle<()>)>>>;

pub struct Freezer {
    pub addr: SocketAddr,
    path: Arc<Path>,
    acceptor: JoinHandle<()>,
    flows: Flows,
}

impl Freezer {
    /// Forwards `local` to `upstream`.
    pub async fn start_on(local: SocketAddr, upstream: SocketAddr) -> std::io::Result<Freezer> {
        let listener = TcpListener::bind(local).await?;
        let addr = listener.local_addr()?;
        let path = Arc::new(Path::default());
        let flows: Flows = Arc::default();
        let (accept_path, accept_flows) = (Arc::clone(&path), Arc::clone(&flows));
        let acceptor = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                let path = Arc::clone(&accept_path);
                let generation = path.generation.load(Ordering::SeqCst);
                let flow = tokio::spawn(async move {
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
                if let Ok(mut flows) = accept_flows.lock() {
                    flows.retain(|(_, task)| !task.is_finished());
                    flows.push((generation, flow));
                }
            }
        });
        Ok(Freezer {
            addr,
            path,
            acceptor,
            flows,
        })
    }

    pub fn freeze(&self) {
        self.path.generation.fetch_add(1, Ordering::SeqCst);
        self.path.frozen.store(true, Ordering::SeqCst);
    }

    pub fn restore(&self) {
        self.path.frozen.store(false, Ordering::SeqCst);
    }

    /// Closes every flow a freeze killed: both of its sockets drop.
    pub fn sever(&self) {
        let current = self.path.generation.load(Ordering::SeqCst);
        if let Ok(mut flows) = self.flows.lock() {
            flows.retain(|(generation, task)| {
                if *generation < current {
                    task.abort();
                }
                *generation >= current
            });
        }
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
        self.acceptor.abort();
        if let Ok(mut flows) = self.flows.lock() {
            for (_, task) in flows.drain(..) {
                task.abort();
            }
        }
    }
}
