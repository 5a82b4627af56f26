//! A relay inside the current process, on its own thread and actix system,
//! for the smoke test: no release build or separate process needed.

use std::net::SocketAddr;

use eventrelay::auth::{Algorithm, AuthConfig, JwtConfig, build_resolver};
use eventrelay::config::Config;
use tokio::sync::oneshot;

use crate::{BenchResult, PUBLISH_TOKEN, SUBSCRIBER_SECRET};

pub struct InProcessRelay {
    pub address: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl InProcessRelay {
    /// Starts a relay on `database_url` in `schema` (used as the channel too)
    /// and waits until it is ready.
    pub async fn start(database_url: &str, schema: &str) -> BenchResult<InProcessRelay> {
        let mut config = Config::default();
        config.database.url = Some(database_url.into());
        config.database.schema = schema.to_owned();
        config.database.channel = schema.to_owned();
        config.database.pool_size = 4;
        config.http.workers = 1;
        config.hub.arbiters = 1;
        config.webhooks.enabled = false;
        config.publish.token = Some(PUBLISH_TOKEN.into());
        config.auth = Some(AuthConfig::Jwt(JwtConfig {
            algorithm: Algorithm::HS256,
            secret: Some(SUBSCRIBER_SECRET.into()),
            ..JwtConfig::default()
        }));
        config.validate()?;
        let auth = config.auth.as_ref().ok_or("the bench relay needs [auth]")?;
        let resolver = build_resolver(auth)?;
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        let address = listener.local_addr()?;
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            actix_rt::System::new().block_on(async move {
                let shutdown = async move {
                    let _ = stopped.await;
                };
                if let Err(error) =
                    eventrelay::server::run(config, resolver, listener, shutdown).await
                {
                    eprintln!("in-process relay failed: {error}");
                }
            });
        });
        let relay = InProcessRelay {
            address,
            stop: Some(stop),
            thread: Some(thread),
        };
        let client = reqwest::Client::new();
        for _ in 0..300 {
            if let Ok(response) = client.get(format!("http://{address}/readyz")).send().await {
                if response.status().is_success() {
                    return Ok(relay);
                }
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        Err("the in-process relay never became ready".into())
    }
}

impl Drop for InProcessRelay {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
