//! A real PgBouncer in transaction mode in front of the shared test
//! Postgres, started from the operating system's package (Debian's
//! `pgbouncer`) for one test and stopped when dropped.
//!
//! It is set up to expose what a transaction-mode pooler breaks: few server
//! connections shared by many clients, handed out round robin, so two
//! consecutive transactions of one client land on different server
//! connections, and anything a client leaves on a server connection between
//! transactions (a named prepared statement, a `SET`, a `LISTEN`) is lost
//! or seen by someone else.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio_postgres::NoTls;
use tokio_postgres::config::Host;

use super::{DEADLINE, database_url};

/// Server connections per database and user: fewer than the clients the
/// tests open, so clients share them.
pub const SERVER_CONNECTIONS: usize = 3;

pub struct PgBouncer {
    child: Child,
    dir: PathBuf,
    pub port: u16,
    user: String,
    dbname: String,
}

impl PgBouncer {
    /// Starts PgBouncer in front of the Postgres at `DATABASE_URL` (or the
    /// default) and waits until it answers a query. Panics, saying how to
    /// install it, when no `pgbouncer` binary can be found: a test that
    /// needs one must fail rather than pass without it.
    pub async fn start() -> PgBouncer {
        let binary = binary().unwrap_or_else(|| {
            panic!(
                "pgbouncer is not installed (looked at $PGBOUNCER, /usr/sbin/pgbouncer and PATH); \
                 install it (Debian: apt-get install pgbouncer) or run scripts/test, which does"
            )
        });
        let upstream: tokio_postgres::Config = database_url()
            .parse()
            .expect("DATABASE_URL is a Postgres URL");
        let host = match upstream.get_hosts().first() {
            Some(Host::Tcp(host)) => host.clone(),
            Some(Host::Unix(path)) => path.display().to_string(),
            None => "127.0.0.1".to_owned(),
        };
        let upstream_port = upstream.get_ports().first().copied().unwrap_or(5432);
        let user = upstream.get_user().unwrap_or("postgres").to_owned();
        let dbname = upstream.get_dbname().unwrap_or(&user).to_owned();
        let password = upstream
            .get_password()
            .map(|p| String::from_utf8_lossy(p).into_owned())
            .unwrap_or_default();

        // PgBouncer 1.21 and later can track prepared statements; keep that
        // off so the pooler is the strict kind that loses them.
        let prepared = if version(&binary) >= (1, 21) {
            "max_prepared_statements = 0\n"
        } else {
            ""
        };
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("pgbouncer-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let port = super::process::free_port();
        // Every client user must be listed for `trust`; the password, when
        // the upstream needs one, is what PgBouncer logs in to it with.
        std::fs::write(
            dir.join("users.txt"),
            format!("\"{user}\" \"{}\"\n", password.replace('"', "\"\"")),
        )
        .unwrap();
        std::fs::write(
            dir.join("pgbouncer.ini"),
            format!(
                "[databases]\n\
                 * = host={host} port={upstream_port}\n\
                 [pgbouncer]\n\
                 listen_addr = 127.0.0.1\n\
                 listen_port = {port}\n\
                 unix_socket_dir = {dir}\n\
                 auth_type = trust\n\
                 auth_file = {dir}/users.txt\n\
                 admin_users = {user}\n\
                 pool_mode = transaction\n\
                 default_pool_size = {SERVER_CONNECTIONS}\n\
                 server_round_robin = 1\n\
                 max_client_conn = 200\n\
                 ignore_startup_parameters = extra_float_digits,options\n\
                 logfile = {dir}/pgbouncer.log\n\
                 pidfile = {dir}/pgbouncer.pid\n\
                 {prepared}",
                dir = dir.display(),
            ),
        )
        .unwrap();

        let mut command = Command::new(&binary);
        command
            .arg(dir.join("pgbouncer.ini"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // PgBouncer refuses to run as root. Switching the child's user
        // directly (rather than through `runuser`, which forks) keeps the
        // process this test kills the PgBouncer itself.
        if let Some((uid, gid)) = postgres_ids() {
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).unwrap();
            use std::os::unix::process::CommandExt;
            command.uid(uid).gid(gid);
        }
        let child = command.spawn().expect("pgbouncer starts");
        let mut bouncer = PgBouncer {
            child,
            dir,
            port,
            user,
            dbname,
        };
        bouncer.wait_until_answering().await;
        bouncer.open_server_connections().await;
        bouncer
    }

    /// The upstream database through PgBouncer, its sessions tagged with
    /// `application_name` (as `TestDb` URLs are).
    pub fn url(&self, application_name: &str) -> String {
        format!(
            "postgres://{}@127.0.0.1:{}/{}?application_name={application_name}",
            self.user, self.port, self.dbname
        )
    }

    /// PgBouncer's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("pgbouncer.log")).unwrap_or_default()
    }

    /// Transactions PgBouncer has passed to the upstream database so far
    /// (`SHOW STATS`, `total_xact_count`).
    pub async fn transactions(&self) -> i64 {
        let (client, connection) = tokio_postgres::connect(
            &format!("postgres://{}@127.0.0.1:{}/pgbouncer", self.user, self.port),
            NoTls,
        )
        .await
        .expect("the PgBouncer admin console answers");
        tokio::spawn(connection);
        // The admin console speaks only the simple protocol.
        let messages = client.simple_query("SHOW STATS").await.unwrap();
        messages
            .iter()
            .find_map(|message| match message {
                tokio_postgres::SimpleQueryMessage::Row(row)
                    if row.get("database") == Some(self.dbname.as_str()) =>
                {
                    row.get("total_xact_count")?.parse().ok()
                }
                _ => None,
            })
            .unwrap_or(0)
    }

    async fn wait_until_answering(&mut self) {
        let url = self.url("pgbouncer-ready");
        let deadline = tokio::time::Instant::now() + DEADLINE;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("pgbouncer exited ({status}) at start:\n{}", self.log());
            }
            if let Ok((client, connection)) = tokio_postgres::connect(&url, NoTls).await {
                tokio::spawn(connection);
                if client.simple_query("SELECT 1").await.is_ok() {
                    return;
                }
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "pgbouncer never answered on port {}:\n{}",
                self.port,
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Opens every server connection at once (clients holding transactions
    /// side by side), so from the first test step on there are several to
    /// rotate through, rather than one that would hide the sharing.
    async fn open_server_connections(&self) {
        let url = self.url("pgbouncer-warm-up");
        let mut clients = Vec::new();
        for _ in 0..SERVER_CONNECTIONS {
            let (client, connection) = tokio_postgres::connect(&url, NoTls).await.unwrap();
            tokio::spawn(connection);
            client.simple_query("BEGIN").await.unwrap();
            clients.push(client);
        }
        let mut pids = Vec::new();
        for client in &clients {
            let rows = client
                .simple_query("SELECT pg_backend_pid()::text")
                .await
                .unwrap();
            pids.extend(rows.iter().filter_map(|message| match message {
                tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
                _ => None,
            }));
        }
        pids.sort();
        pids.dedup();
        assert_eq!(
            pids.len(),
            SERVER_CONNECTIONS,
            "transactions side by side should each hold a server connection"
        );
        for client in &clients {
            client.simple_query("COMMIT").await.unwrap();
        }
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The `pgbouncer` binary: `$PGBOUNCER`, Debian's `/usr/sbin/pgbouncer`
/// (not on a non-root `PATH`), or the first on `PATH`.
fn binary() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("PGBOUNCER") {
        return Path::new(&path).is_file().then(|| PathBuf::from(path));
    }
    let debian = Path::new("/usr/sbin/pgbouncer");
    if debian.is_file() {
        return Some(debian.to_owned());
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join("pgbouncer"))
        .find(|path| path.is_file())
}

/// `(major, minor)` from `pgbouncer --version` (`PgBouncer 1.18.0`).
fn version(binary: &Path) -> (u32, u32) {
    let output = Command::new(binary)
        .arg("--version")
        .output()
        .expect("pgbouncer --version runs");
    let text = String::from_utf8_lossy(&output.stdout);
    let number = text
        .split_whitespace()
        .nth(1)
        .unwrap_or_else(|| panic!("unexpected pgbouncer --version output: {text}"));
    let mut parts = number.split('.').map(|part| part.parse().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

/// The `postgres` user's ids when running as root (PgBouncer will not run
/// as root); `None` otherwise.
fn postgres_ids() -> Option<(u32, u32)> {
    let id = |flag: &str, user: Option<&str>| -> Option<u32> {
        let output = Command::new("id").arg(flag).args(user).output().ok()?;
        String::from_utf8(output.stdout).ok()?.trim().parse().ok()
    };
    if id("-u", None)? != 0 {
        return None;
    }
    let uid = id("-u", Some("postgres")).expect("a postgres user to run pgbouncer as");
    let gid = id("-g", Some("postgres")).expect("a postgres user to run pgbouncer as");
    Some((uid, gid))
}
