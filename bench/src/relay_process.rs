//! The eventrelay binary as a process of its own, with a generated
//! configuration: started, awaited until ready, stopped when dropped, for
//! the scenarios and the fault campaign; and the reader of `/metrics`.

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::{BenchResult, PUBLISH_TOKEN, SUBSCRIBER_SECRET};

pub const WEBHOOK_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
/// The event type the `webhook_url` subscription takes.
pub const WEBHOOK_TYPE: &str = "bench.hook";

#[derive(Clone, Debug, Default)]
pub struct RelaySettings {
    pub database_url: String,
    pub schema: String,
    pub queue_capacity: usize,
    pub webhook_url: Option<String>,
    pub group_commit_ms: u64,
    pub pool_size: usize,
    pub wakeup: &'static str,
    pub header_timeout_secs: Option<u64>,
    /// `webhooks.lease_ms` (with a request timeout of a third of it, and
    /// retries 1 to 20 s apart, so a run can wait for them).
    pub webhook_lease_ms: Option<u64>,
    /// How soon a silent path to Postgres counts as dead:
    /// `database.listen_health_secs` and `tcp_user_timeout_secs`.
    pub dead_path_secs: Option<u64>,
    /// Write only the settings every release has had, for an earlier
    /// binary (its configuration refuses unknown keys).
    pub baseline: bool,
    /// Start the relay in a session of its own, as nginx is (it
    /// daemonizes): Linux's autogroup scheduling shares CPU time between
    /// sessions before their threads, so a relay in the load tool's session
    /// would compete with the load as one group. Runs beside nchan set this.
    pub own_session: bool,
    /// Appended to the configuration: more keys of the `webhook_url`
    /// subscription (`max_per_second = 50`), then tables (`[telemetry]`).
    pub extra_toml: String,
}

impl RelaySettings {
    pub fn new(database_url: &str, schema: &str) -> Self {
        RelaySettings {
            database_url: database_url.to_owned(),
            schema: schema.to_owned(),
            queue_capacity: 1024,
            group_commit_ms: 2,
            pool_size: 16,
            wakeup: "notify",
            ..RelaySettings::default()
        }
    }

    pub fn in_own_session(mut self) -> Self {
        self.own_session = true;
        self
    }

    fn toml(&self, port: u16) -> String {
        let (url, schema, pool_size) = (&self.database_url, &self.schema, self.pool_size);
        let mut database = format!(
            "[database]\nurl = \"{url}\"\nschema = \"{schema}\"\nchannel = \"{schema}\"\npool_size = {pool_size}\n"
        );
        let mut http =
            format!("[http]\nbind = \"127.0.0.1:{port}\"\nworkers = 2\ninspector = false\n");
        let auth = format!(
            "[auth]\nmode = \"jwt\"\nalgorithm = \"HS256\"\nsecret = \"{SUBSCRIBER_SECRET}\"\n"
        );
        let log = "[log]\nlevel = \"warn\"\n";
        if self.baseline {
            return format!(
                "{database}\n{http}\n{auth}\n[publish]\ntoken = \"{PUBLISH_TOKEN}\"\n\n{log}"
            );
        }
        if let Some(secs) = self.dead_path_secs {
            database.insert_str(
                "[database]\n".len(),
                &format!("listen_health_secs = {secs}\ntcp_keepalive_secs = 1\ntcp_user_timeout_secs = {secs}\n"),
            );
        }
        database.push_str(&format!("wakeup = \"{}\"\n", self.wakeup));
        if let Some(secs) = self.header_timeout_secs {
            http.insert_str("[http]\n".len(), &format!("header_timeout_secs = {secs}\n"));
        }
        let mut webhooks = "[webhooks]\n".to_owned();
        if let Some(lease) = self.webhook_lease_ms {
            webhooks.push_str(&format!(
                "lease_ms = {lease}\nrequest_timeout_ms = {}\n\
                 retry_schedule_ms = [1000, 2000, 3000, 5000, 8000, 13000, 20000]\n",
                lease / 3
            ));
        }
        let mut text = format!(
            "{database}\n{http}\n[sse]\nmax_age_secs = 3600\nqueue_capacity = {}\nreplay_lookback = 100\n\n\
             [hub]\narbiters = 2\ntail_events = 128\ntail_bytes = 4194304\n\n{auth}\n\
             [publish]\ntoken = \"{PUBLISH_TOKEN}\"\ngroup_commit_ms = {}\n\n{log}\n\
             {webhooks}allow_private_networks = true\nworkers = 4\n",
            self.queue_capacity, self.group_commit_ms,
        );
        if let Some(url) = &self.webhook_url {
            text.push_str(&format!(
                "\n[[webhooks.subscriptions]]\nid = \"bench\"\nurl = \"{url}\"\n\
                 secret = \"{WEBHOOK_SECRET}\"\ntypes = [\"{WEBHOOK_TYPE}\"]\n"
            ));
        }
        text.push_str(&self.extra_toml);
        text
    }
}

pub struct RelayProcess {
    child: Child,
    pub port: u16,
    pub base: String,
}

impl RelayProcess {
    pub async fn start(
        binary: &Path,
        work_dir: &Path,
        settings: &RelaySettings,
    ) -> BenchResult<RelayProcess> {
        Self::start_on(binary, work_dir, settings, free_port()?).await
    }

    pub async fn start_on(
        binary: &Path,
        work_dir: &Path,
        settings: &RelaySettings,
        port: u16,
    ) -> BenchResult<RelayProcess> {
        let config_path: PathBuf = work_dir.join(format!("relay-{port}.toml"));
        std::fs::write(&config_path, settings.toml(port))?;
        let log_path = work_dir.join(format!("relay-{port}.log"));
        let log = File::options().create(true).append(true).open(log_path)?;
        let mut command = Command::new(binary);
        command
            .args(["serve", "--config"])
            .arg(&config_path)
            .env_remove("DATABASE_URL")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        if settings.own_session {
            // Out of our process group, Ctrl-C no longer reaches the relay:
            // it stops when the thread that started it ends instead.
            // SAFETY: runs in the child between fork and exec, where only
            // async-signal-safe calls (setsid and prctl are) are allowed.
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
        let mut relay = RelayProcess {
            child,
            port,
            base: format!("http://127.0.0.1:{port}"),
        };
        relay.wait_ready(work_dir).await?;
        Ok(relay)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub async fn terminate(&mut self, patience: Duration) -> BenchResult<Duration> {
        let started = std::time::Instant::now();
        // SAFETY: kill only signals the relay's own process.
        if unsafe { libc::kill(self.pid() as i32, libc::SIGTERM) } != 0 {
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
        let client = reqwest::Client::new();
        for _ in 0..600 {
            if let Some(status) = self.child.try_wait()? {
                let log = work_dir.join(format!("relay-{}.log", self.port));
                let log = log.display();
                return Err(format!("the relay exited with {status}; see {log}").into());
            }
            if ready(&client, &self.base).await {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err("the relay did not become ready within 60 s".into())
    }

    pub async fn metric(&self, query: &str) -> f64 {
        self.metrics().await.value(query)
    }

    pub async fn metrics(&self) -> Metrics {
        let url = format!("{}/metrics", self.base);
        let Ok(response) = reqwest::Client::new().get(url).send().await else {
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

/// Whether the relay at `base` answers `/readyz` with success.
pub(crate) async fn ready(client: &reqwest::Client, base: &str) -> bool {
    let response = client.get(format!("{base}/readyz")).send().await;
    response.is_ok_and(|response| response.status().is_success())
}

pub fn free_port() -> BenchResult<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

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
        let hint =
            "build the workspace's tests (`cargo nextest run --workspace`) or set EVENTRELAY_BIN";
        return Err(format!("no relay binary at {}: {hint}", binary.display()).into());
    }
    Ok(binary)
}

#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

impl Sample {
    pub fn parse(line: &str) -> Option<Sample> {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            return None;
        }
        let (series, value) = line.rsplit_once(' ')?;
        // Rust reads Prometheus's `+Inf` as it is.
        let value = value.parse().ok()?;
        let (name, labels) = match series.split_once('{') {
            None => (series, Vec::new()),
            Some((name, rest)) => (name, labels(rest.strip_suffix('}')?)?),
        };
        Some(Sample {
            name: name.to_owned(),
            labels,
            value,
        })
    }

    pub fn label(&self, name: &str) -> Option<&str> {
        let found = self.labels.iter().find(|(label, _)| label == name);
        found.map(|(_, value)| value.as_str())
    }
}

fn labels(text: &str) -> Option<Vec<(String, String)>> {
    text.split(',')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (name, value) = pair.split_once('=')?;
            let value = value.strip_prefix('"')?.strip_suffix('"')?;
            Some((name.trim().to_owned(), value.to_owned()))
        })
        .collect()
}

#[derive(Debug, Clone, Default)]
pub struct Metrics {
    pub samples: Vec<Sample>,
}

impl Metrics {
    pub fn parse(text: &str) -> Metrics {
        let samples = text.lines().filter_map(Sample::parse).collect();
        Metrics { samples }
    }

    /// The first sample that `query` names, 0 when none does. A query is a
    /// series as the text shows it, `replays_total{source="memory"}`: its
    /// name may leave out the relay's prefix (`eventrelay_`), and its
    /// labels must be among the sample's.
    pub fn value(&self, query: &str) -> f64 {
        let Some(wanted) = Sample::parse(&format!("{query} 0")) else {
            return 0.0;
        };
        let (suffix, labels) = (format!("_{}", wanted.name), &wanted.labels);
        let named = |s: &Sample| s.name == wanted.name || s.name.ends_with(&suffix);
        let labelled = |s: &Sample| labels.iter().all(|(n, v)| s.label(n) == Some(v));
        let found = self.samples.iter().find(|s| named(s) && labelled(s));
        found.map_or(0.0, |sample| sample.value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_finds_its_series_by_name_and_labels() {
        let metrics = Metrics::parse(
            "# HELP eventrelay_replays_total Replays.\n\
             eventrelay_replays_total{source=\"memory\"} 3\n\
             eventrelay_replays_total{source=\"outbox\"} 4\n\
             eventrelay_sse_connections 12\n\
             eventrelay_stage_bucket{le=\"+Inf\",stage=\"commit\"} 20\n",
        );
        assert_eq!(metrics.value("replays_total{source=\"outbox\"}"), 4.0);
        assert_eq!(metrics.value("sse_connections"), 12.0);
        assert_eq!(metrics.value("connections"), 12.0);
        assert_eq!(metrics.value("missing"), 0.0);
        assert_eq!(metrics.samples[3].label("le"), Some("+Inf"));
    }
}
