//! Starts the eventrelay binary as a separate process with a generated
//! configuration file, waits until it is ready, and stops it when dropped.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::metrics::Metrics;
use crate::{BenchResult, PUBLISH_TOKEN, SUBSCRIBER_SECRET};

/// The webhook secret of the bench subscription (Standard Webhooks form).
pub const WEBHOOK_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// What differs between the relays the scenarios start.
#[derive(Clone, Debug)]
pub struct RelaySettings {
    pub database_url: String,
    pub schema: String,
    pub tail_events: usize,
    pub tail_bytes: usize,
    pub queue_capacity: usize,
    pub replay_lookback: i64,
    /// Deliver every `bench.hook` event to this URL.
    pub webhook_url: Option<String>,
    /// Serve HTTPS (and HTTP/2) with this PEM certificate and key.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// `publish.group_commit_ms`; 0 turns group commit off.
    pub group_commit_ms: u64,
    pub arbiters: usize,
    pub pool_size: usize,
    pub webhook_workers: usize,
    /// `database.wakeup`: `notify` or `logical`.
    pub wakeup: &'static str,
    /// `database.listen_url`: where the LISTEN connection or the
    /// replication stream goes (a standby, say); unset, `database_url`.
    pub listen_url: Option<String>,
    /// `http.header_timeout_secs`; unset, the relay's default.
    pub header_timeout_secs: Option<u64>,
    /// `webhooks.lease_ms` (and a request timeout of a third of it, and
    /// retries 1, 2, 3, 5, 8, 13 and 20 s apart, so a run can wait for
    /// them); unset, the relay's defaults.
    pub webhook_lease_ms: Option<u64>,
    /// How soon a silent path to Postgres counts as dead:
    /// `database.listen_health_secs` and `tcp_user_timeout_secs` (with
    /// keepalive probes every second); unset, the relay's defaults.
    pub dead_path_secs: Option<u64>,
    /// Write only the settings every release has had, for an earlier
    /// binary run side by side (its configuration refuses unknown keys).
    pub baseline: bool,
    /// Start the relay in a session of its own, as a service manager
    /// would, and as nginx is (it daemonizes). Linux's autogroup
    /// scheduling shares CPU time between sessions before it shares it
    /// between their threads: a relay left in the load tool's session
    /// competes with the load tool's readers as one group, where nginx is
    /// a group apart, so side-by-side runs with nchan set this.
    pub own_session: bool,
}

impl RelaySettings {
    pub fn new(database_url: &str, schema: &str) -> Self {
        RelaySettings {
            database_url: database_url.to_owned(),
            schema: schema.to_owned(),
            tail_events: 128,
            tail_bytes: 4 * 1024 * 1024,
            queue_capacity: 1024,
            replay_lookback: 100,
            webhook_url: None,
            tls: None,
            group_commit_ms: 2,
            arbiters: 2,
            pool_size: 16,
            webhook_workers: 4,
            wakeup: "notify",
            listen_url: None,
            header_timeout_secs: None,
            webhook_lease_ms: None,
            dead_path_secs: None,
            baseline: false,
            own_session: false,
        }
    }

    /// In a session of its own (see [`RelaySettings::own_session`]).
    pub fn in_own_session(mut self) -> Self {
        self.own_session = true;
        self
    }

    /// Serves TLS with a self-signed certificate for 127.0.0.1, written to
    /// `work_dir`.
    pub fn with_tls(mut self, work_dir: &Path) -> BenchResult<Self> {
        let certified = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()])?;
        let cert = work_dir.join("relay-cert.pem");
        let key = work_dir.join("relay-key.pem");
        std::fs::write(&cert, certified.cert.pem())?;
        std::fs::write(&key, certified.key_pair.serialize_pem())?;
        self.tls = Some((cert, key));
        Ok(self)
    }

    fn toml(&self, port: u16) -> String {
        if self.baseline {
            return self.baseline_toml(port);
        }
        let mut text = format!(
            r#"[database]
url = "{url}"
schema = "{schema}"
channel = "{schema}"
pool_size = {pool_size}
wakeup = "{wakeup}"

[http]
bind = "127.0.0.1:{port}"
workers = 2
inspector = false

[sse]
max_age_secs = 3600
queue_capacity = {queue}
replay_lookback = {lookback}

[hub]
arbiters = {arbiters}
tail_events = {tail_events}
tail_bytes = {tail_bytes}

[auth]
mode = "jwt"
algorithm = "HS256"
secret = "{secret}"

[publish]
token = "{token}"
group_commit_ms = {group}

[log]
level = "warn"

[webhooks]
allow_private_networks = true
workers = {webhook_workers}
"#,
            url = self.database_url,
            schema = self.schema,
            queue = self.queue_capacity,
            lookback = self.replay_lookback,
            tail_events = self.tail_events,
            tail_bytes = self.tail_bytes,
            secret = SUBSCRIBER_SECRET,
            token = PUBLISH_TOKEN,
            group = self.group_commit_ms,
            arbiters = self.arbiters,
            pool_size = self.pool_size,
            webhook_workers = self.webhook_workers,
            wakeup = self.wakeup,
        );
        if let Some(url) = &self.listen_url {
            // Appended: `[database]` is the first table of the file.
            text = text.replacen(
                "[database]\n",
                &format!("[database]\nlisten_url = \"{url}\"\n"),
                1,
            );
        }
        if let Some(secs) = self.dead_path_secs {
            text = text.replacen(
                "[database]\n",
                &format!(
                    "[database]\nlisten_health_secs = {secs}\ntcp_keepalive_secs = 1\n\
                     tcp_user_timeout_secs = {secs}\n"
                ),
                1,
            );
        }
        if let Some(secs) = self.header_timeout_secs {
            text = text.replacen(
                "[http]\n",
                &format!("[http]\nheader_timeout_secs = {secs}\n"),
                1,
            );
        }
        if let Some(lease) = self.webhook_lease_ms {
            text = text.replacen(
                "[webhooks]\n",
                &format!(
                    "[webhooks]\nlease_ms = {lease}\nrequest_timeout_ms = {}\n\
                     retry_schedule_ms = [1000, 2000, 3000, 5000, 8000, 13000, 20000]\n",
                    lease / 3
                ),
                1,
            );
        }
        if let Some((cert, key)) = &self.tls {
            text.push_str(&format!(
                "\n[http.tls]\ncert_file = \"{}\"\nkey_file = \"{}\"\n",
                cert.display(),
                key.display()
            ));
        }
        if let Some(url) = &self.webhook_url {
            text.push_str(&format!(
                r#"
[[webhooks.subscriptions]]
id = "bench"
url = "{url}"
secret = "{WEBHOOK_SECRET}"
types = ["bench.hook"]
"#
            ));
        }
        text
    }
}

impl RelaySettings {
    /// The settings an earlier release understands: database, HTTP,
    /// authentication and the publish token, each left at its default
    /// otherwise.
    fn baseline_toml(&self, port: u16) -> String {
        format!(
            r#"[database]
url = "{url}"
schema = "{schema}"
channel = "{schema}"
pool_size = {pool_size}

[http]
bind = "127.0.0.1:{port}"
workers = 2
inspector = false

[auth]
mode = "jwt"
algorithm = "HS256"
secret = "{secret}"

[publish]
token = "{token}"

[log]
level = "warn"
"#,
            url = self.database_url,
            schema = self.schema,
            pool_size = self.pool_size,
            secret = SUBSCRIBER_SECRET,
            token = PUBLISH_TOKEN,
        )
    }
}

/// A running relay process.
pub struct RelayProcess {
    child: Child,
    pub port: u16,
    pub base: String,
}

impl RelayProcess {
    /// Starts `binary serve` with `settings`; its log goes to `work_dir`.
    pub async fn start(
        binary: &Path,
        work_dir: &Path,
        settings: &RelaySettings,
    ) -> BenchResult<RelayProcess> {
        Self::start_on(binary, work_dir, settings, free_port()?).await
    }

    /// Like [`RelayProcess::start`], on a given loopback port (a restart
    /// takes over the port its predecessor listened on).
    pub async fn start_on(
        binary: &Path,
        work_dir: &Path,
        settings: &RelaySettings,
        port: u16,
    ) -> BenchResult<RelayProcess> {
        let config_path: PathBuf = work_dir.join(format!("relay-{port}.toml"));
        std::fs::write(&config_path, settings.toml(port))?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(work_dir.join(format!("relay-{port}.log")))?;
        let mut command = Command::new(binary);
        command
            .arg("serve")
            .arg("--config")
            .arg(&config_path)
            .env_remove("DATABASE_URL")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        if settings.own_session {
            // Out of the load tool's process group, Ctrl-C no longer
            // reaches the relay: it is told to stop when the thread that
            // started it ends instead.
            //
            // SAFETY: runs in the child between fork and exec, where only
            // async-signal-safe calls are allowed; setsid and prctl are,
            // and nothing else is touched.
            unsafe {
                command.pre_exec(|| {
                    if libc::setsid() == -1
                        || libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) == -1
                    {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let child = command
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", binary.display()))?;
        let scheme = if settings.tls.is_some() {
            "https"
        } else {
            "http"
        };
        let mut relay = RelayProcess {
            child,
            port,
            base: format!("{scheme}://127.0.0.1:{port}"),
        };
        relay.wait_ready(work_dir).await?;
        Ok(relay)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Stops the relay with SIGTERM, as a deploy does, and waits until the
    /// process has exited (killing it after `patience`); answers how long
    /// the shutdown took.
    pub async fn terminate(&mut self, patience: Duration) -> BenchResult<Duration> {
        let started = std::time::Instant::now();
        let status = Command::new("kill")
            .arg("-TERM")
            .arg(self.pid().to_string())
            .status()?;
        if !status.success() {
            return Err(format!("kill -TERM {} failed", self.pid()).into());
        }
        while self.child.try_wait()?.is_none() {
            if started.elapsed() > patience {
                let _ = self.child.kill();
                let _ = self.child.wait();
                return Err(
                    format!("the relay did not exit within {patience:?} of SIGTERM").into(),
                );
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(started.elapsed())
    }

    pub fn address(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    async fn wait_ready(&mut self, work_dir: &Path) -> BenchResult<()> {
        // The bench's own self-signed certificate, when serving TLS.
        let client = reqwest::Client::builder()
            .danger_accept_invalid_certs(true)
            .build()?;
        for _ in 0..600 {
            if let Some(status) = self.child.try_wait()? {
                return Err(format!(
                    "the relay exited with {status}; see {}/relay-{}.log",
                    work_dir.display(),
                    self.port
                )
                .into());
            }
            let url = format!("{}/readyz", self.base);
            if let Ok(response) = client.get(url).send().await {
                if response.status().is_success() {
                    return Ok(());
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err("the relay did not become ready within 60 s".into())
    }

    /// One series of `/metrics` (see [`Metrics::value`]); 0 when absent.
    pub async fn metric(&self, query: &str) -> f64 {
        self.metrics().await.value(query)
    }

    /// Everything `/metrics` serves; nothing when it cannot be read.
    pub async fn metrics(&self) -> Metrics {
        let Ok(client) = reqwest::Client::builder()
            .danger_accept_invalid_certs(true)
            .build()
        else {
            return Metrics::default();
        };
        let Ok(response) = client.get(format!("{}/metrics", self.base)).send().await else {
            return Metrics::default();
        };
        Metrics::parse(&response.text().await.unwrap_or_default())
    }
}

impl Drop for RelayProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A loopback port nothing listens on right now.
pub fn free_port() -> BenchResult<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// The relay binary a workspace test build made, next to the running test's
/// own directory (`target/<profile>/eventrelay`), or `EVENTRELAY_BIN`: what
/// the bench's and the campaign's tests start.
pub fn test_relay_binary() -> BenchResult<PathBuf> {
    if let Ok(path) = std::env::var("EVENTRELAY_BIN") {
        return Ok(PathBuf::from(path));
    }
    let test = std::env::current_exe()?;
    let binary = test
        .parent()
        .and_then(|deps| deps.parent())
        .ok_or("a test binary lives in target/<profile>/deps")?
        .join("eventrelay");
    if !binary.exists() {
        return Err(format!(
            "no relay binary at {}: build the workspace's tests (`cargo nextest run --workspace`) or set EVENTRELAY_BIN",
            binary.display()
        )
        .into());
    }
    Ok(binary)
}
