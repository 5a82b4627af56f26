//! The relay as a real operating-system process (the `eventrelay` binary
//! this package builds), for tests that kill it with SIGKILL, restart it on
//! the same port, or read its resident memory from `/proc`.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};

use super::server::{PUBLISH_TOKEN, TEST_SECRET};
use super::{DEADLINE, TestDb};

/// A TOML configuration for `eventrelay serve` on `db`, listening on
/// `port`, with the test secret and publish token; `extra` is appended
/// (further tables such as `[webhooks]`).
pub fn relay_config(db: &TestDb, port: u16, extra: &str) -> String {
    format!(
        r#"
[database]
url = "{url}"
schema = "{schema}"
channel = "{channel}"
wakeup = "{wakeup}"
pool_size = 4

[http]
bind = "127.0.0.1:{port}"
workers = 1

[hub]
arbiters = 1

[auth]
mode = "jwt"
algorithm = "HS256"
secret = "{TEST_SECRET}"

[publish]
token = "{PUBLISH_TOKEN}"

[log]
level = "warn"

{extra}
"#,
        url = db.url,
        schema = db.schema,
        channel = db.channel,
        wakeup = db.wakeup,
    )
}

/// A port nothing listens on right now, for a relay that must come back on
/// the same address after a restart.
/// The eventrelay binary as a command, with none of the test process's
/// `DATABASE_URL` and `EVENTRELAY_*` settings: what it uses, it is given.
pub fn eventrelay_command() -> std::process::Command {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_eventrelay"));
    command.env_remove("DATABASE_URL");
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("EVENTRELAY_") {
            command.env_remove(name);
        }
    }
    command
}

/// A loopback port nothing listens on, for a server another process will
/// bind. It is taken from below the kernel's ephemeral range: a port from
/// inside it can be given, between this check and the server's bind, to
/// the local end of any outgoing connection (other tests open thousands),
/// and such a connection makes the server's bind fail. Ports below the
/// range are only ever taken by a bind that names them.
pub fn free_port() -> u16 {
    let range_start = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let lowest = 10_000u16.min(range_start / 2);
    let span = u32::from(range_start - lowest);
    // A random place to start, so tests starting servers at once do not
    // try the same ports in the same order.
    let start = (uuid::Uuid::new_v4().as_u128() % u128::from(span.max(1))) as u32;
    for step in 0..span {
        let port = u32::from(lowest) + (start + step) % span;
        let port = u16::try_from(port).expect("below the ephemeral range");
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub struct RelayProcess {
    child: Child,
    pub base: String,
    /// Everything the relay wrote to stderr (its log), also echoed.
    log: Arc<Mutex<String>>,
    /// Everything it wrote to stdout (the start-up banner).
    banner: Arc<Mutex<String>>,
    _config: ConfigFile,
}

impl RelayProcess {
    /// Starts `eventrelay serve --config <file>` and waits for the line
    /// announcing its address.
    pub fn spawn(config: &str) -> RelayProcess {
        let config = ConfigFile::write(config);
        let mut command = Command::new(env!("CARGO_BIN_EXE_eventrelay"));
        // The configuration file is the whole truth for these relays: no
        // DATABASE_URL, and none of the EVENTRELAY_* variables that tune
        // the tests themselves (the relay refuses unknown ones).
        command.env_remove("DATABASE_URL");
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("EVENTRELAY_") {
                command.env_remove(name);
            }
        }
        let mut child = command
            .arg("serve")
            .arg("--config")
            .arg(&config.path)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the eventrelay binary starts");
        let log = Arc::new(Mutex::new(String::new()));
        let stderr = child.stderr.take().unwrap();
        let collected = Arc::clone(&log);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("relay: {line}");
                let mut log = collected.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        let stdout = child.stdout.take().unwrap();
        let (first_line, announced) = mpsc::channel();
        let banner = Arc::new(Mutex::new(String::new()));
        let printed = Arc::clone(&banner);
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines().map_while(Result::ok);
            let first = lines.next();
            if let Some(line) = &first {
                printed.lock().unwrap().push_str(&format!("{line}\n"));
            }
            let _ = first_line.send(first.map(Ok::<_, std::io::Error>));
            // Keep draining (and keeping) so the relay never blocks on a
            // full pipe.
            for line in lines {
                printed.lock().unwrap().push_str(&format!("{line}\n"));
            }
        });
        let line = announced
            .recv_timeout(DEADLINE)
            .expect("the relay announces its address before the deadline")
            .expect("the relay printed a line")
            .expect("stdout is readable");
        let base = line
            .split_whitespace()
            .find(|word| word.starts_with("http://"))
            .unwrap_or_else(|| panic!("unexpected first line: {line}"))
            .to_owned();
        RelayProcess {
            child,
            base,
            log,
            banner,
            _config: config,
        }
    }

    /// The relay's log (stderr) so far.
    /// Replaces the configuration file the relay was started with (what a
    /// reload reads).
    pub fn rewrite_config(&self, contents: &str) {
        std::fs::write(&self._config.path, contents).unwrap();
    }

    /// Sends the relay a signal, such as `HUP`.
    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.pid().to_string())
            .status()
            .unwrap();
        assert!(status.success(), "kill -{name} failed");
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// What the relay printed on stdout so far.
    pub fn banner(&self) -> String {
        self.banner.lock().unwrap().clone()
    }

    /// True while the process has not exited.
    pub fn is_running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Ends the process with SIGKILL: no shutdown code runs.
    pub fn kill(mut self) {
        self.kill_now();
    }

    fn kill_now(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits until `/readyz` answers 200.
    pub async fn ready(&self) {
        super::wait_ready(&self.base).await
    }

    /// A field of `/proc/<pid>/status` in kB, such as `VmRSS`.
    pub fn status_kib(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        status
            .lines()
            .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|value| value.split_whitespace().next()?.parse().ok())
            .unwrap_or_else(|| panic!("no {field} in /proc status"))
    }

    /// Open file descriptors (sockets included).
    pub fn open_fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .unwrap()
            .count()
    }

    /// A metric's value from `/metrics` (see [`super::metric`]).
    pub async fn metric(&self, name: &str) -> f64 {
        super::metric(&self.base, name).await
    }
}

impl Drop for RelayProcess {
    fn drop(&mut self) {
        self.kill_now();
    }
}

/// A configuration file that is removed with its relay.
struct ConfigFile {
    path: PathBuf,
}

impl ConfigFile {
    fn write(contents: &str) -> ConfigFile {
        let path = std::env::temp_dir().join(format!(
            "eventrelay-test-{}.toml",
            uuid::Uuid::new_v4().simple()
        ));
        let mut file = std::fs::File::create(&path).unwrap();
        file.write_all(contents.as_bytes()).unwrap();
        ConfigFile { path }
    }
}

impl Drop for ConfigFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}
