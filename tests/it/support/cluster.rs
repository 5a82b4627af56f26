//! A throwaway Postgres cluster a test starts, restarts and removes itself,
//! for faults that would disturb every other test on the shared server.
//! It needs the server binaries (`initdb`, `pg_ctl`): found through
//! `PG_BINDIR`, Debian's `/usr/lib/postgresql/<version>/bin`, or `PATH`.
//! As root it runs them as the `postgres` user, since Postgres refuses root.

use std::path::{Path, PathBuf};
use std::process::Command;

#[path = "../../../campaign/src/postgres_tools.rs"]
mod postgres_tools;
use postgres_tools::{
    base_backup, debian_binaries, is_root, run_tool, server_binaries, server_tool,
};

pub struct Cluster {
    bin: PathBuf,
    data: PathBuf,
    pub port: u16,
    /// Further `-c` settings for the server.
    settings: String,
}

impl Cluster {
    /// Creates and starts a cluster on a free loopback port; `None` when no
    /// server binaries are installed.
    pub fn start() -> Option<Cluster> {
        let cluster = Self::init(server_binaries()?)?;
        cluster.pg_ctl_start();
        Some(cluster)
    }

    /// A cluster with `wal_level = logical`, for the logical wake-up mode.
    pub fn start_logical() -> Option<Cluster> {
        Self::start_logical_with(20, 20)
    }

    /// A logical cluster with this many WAL senders and replication slots.
    pub fn start_logical_with(wal_senders: usize, slots: usize) -> Option<Cluster> {
        Self::start_logical_and(wal_senders, slots, "")
    }

    /// A logical cluster with more server settings (`-c name=value ...`).
    pub fn start_logical_and(wal_senders: usize, slots: usize, more: &str) -> Option<Cluster> {
        Self::start_logical_on(server_binaries()?, wal_senders, slots, more)
    }

    /// A logical cluster of Postgres 16 or later, which can decode on its
    /// standbys: `PG16_BINDIR` (scripts/test sets it, fetching the
    /// binaries when the machine has none) or Debian's packages.
    pub fn start_logical_16(more: &str) -> Cluster {
        let bin = binaries_16().unwrap_or_else(|| {
            panic!("no Postgres 16 or later: set PG16_BINDIR (scripts/test fetches one)")
        });
        Self::start_logical_on(bin, 20, 20, more).unwrap()
    }

    fn start_logical_on(
        bin: PathBuf,
        wal_senders: usize,
        slots: usize,
        more: &str,
    ) -> Option<Cluster> {
        let mut cluster = Self::init(bin)?;
        cluster.settings = format!(
            "-c wal_level=logical -c max_wal_senders={wal_senders} -c max_replication_slots={slots} {more}"
        );
        cluster.pg_ctl_start();
        Some(cluster)
    }

    /// A cluster that speaks only TLS, with this certificate and key: a
    /// connection without TLS is refused by `pg_hba.conf`.
    pub fn start_tls_only(cert: &Path, key: &Path) -> Option<Cluster> {
        let mut cluster = Self::init(server_binaries()?)?;
        let root = cluster.data.parent().unwrap().to_owned();
        let (server_cert, server_key) = (root.join("server.crt"), root.join("server.key"));
        std::fs::copy(cert, &server_cert).unwrap();
        std::fs::copy(key, &server_key).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&server_key, std::fs::Permissions::from_mode(0o600)).unwrap();
        if is_root() {
            run(Command::new("chown")
                .arg("postgres:")
                .arg(&server_cert)
                .arg(&server_key));
        }
        std::fs::write(
            cluster.data.join("pg_hba.conf"),
            "local all all trust\nhostssl all all 127.0.0.1/32 trust\nhostssl all all ::1/128 trust\n",
        )
        .unwrap();
        cluster.settings = format!(
            "-c ssl=on -c ssl_cert_file={} -c ssl_key_file={}",
            server_cert.display(),
            server_key.display()
        );
        cluster.pg_ctl_start();
        Some(cluster)
    }

    /// A streaming standby of `primary`, copied from it with
    /// `pg_basebackup` and started with the same settings: it follows the
    /// primary's WAL until [`Cluster::promote`].
    pub fn start_standby_of(primary: &Cluster) -> Cluster {
        let mut standby = Self::prepare(primary.bin.clone());
        run(&mut base_backup(&primary.bin, primary.port, &standby.data));
        standby.settings = primary.settings.clone();
        standby.pg_ctl_start();
        standby
    }

    /// A standby of `primary` made from a copy of its data directory taken
    /// while it is briefly stopped (for server binaries that come without
    /// `pg_basebackup`), started with the primary's settings and `more`.
    pub fn start_cold_standby_of(primary: &Cluster, more: &str) -> Cluster {
        let mut standby = Self::prepare(primary.bin.clone());
        primary.stop();
        run(Command::new("cp")
            .arg("-a")
            .arg(&primary.data)
            .arg(&standby.data));
        primary.pg_ctl_start();
        for leftover in ["postmaster.pid", "postmaster.opts"] {
            let _ = std::fs::remove_file(standby.data.join(leftover));
        }
        std::fs::write(standby.data.join("standby.signal"), "").unwrap();
        let conninfo = format!(
            "\nprimary_conninfo = 'host=127.0.0.1 port={} user=postgres'\n",
            primary.port
        );
        let mut auto = std::fs::read_to_string(standby.data.join("postgresql.auto.conf")).unwrap();
        auto.push_str(&conninfo);
        std::fs::write(standby.data.join("postgresql.auto.conf"), auto).unwrap();
        if is_root() {
            run(Command::new("chown")
                .arg("-R")
                .arg("postgres:")
                .arg(&standby.data));
        }
        standby.settings = format!("{} {more}", primary.settings);
        standby.pg_ctl_start();
        standby
    }

    /// Makes a standby the primary, and waits until it takes writes.
    pub fn promote(&self) {
        run(self
            .command("pg_ctl")
            .arg("-D")
            .arg(&self.data)
            .args(["-w", "promote"]));
    }

    /// Stops the server (a fast shutdown: sessions end, and a standby
    /// receives every committed change before the primary is down).
    pub fn stop(&self) {
        run(self
            .command("pg_ctl")
            .arg("-D")
            .arg(&self.data)
            .args(["-w", "-m", "fast", "stop"]));
    }

    /// Stops the server at once, as a crash would: no shutdown checkpoint,
    /// and a standby gets nothing more.
    pub fn crash(&self) {
        run(self.command("pg_ctl").arg("-D").arg(&self.data).args([
            "-w",
            "-m",
            "immediate",
            "stop",
        ]));
    }

    /// Starts a stopped server again with its settings.
    pub fn start_again(&self) {
        self.pg_ctl_start();
    }

    /// A data directory's place and a free port; nothing in it yet.
    fn prepare(bin: PathBuf) -> Cluster {
        let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("pg-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&root).unwrap();
        let cluster = Cluster {
            bin,
            data: root.join("data"),
            port: super::process::free_port(),
            settings: String::new(),
        };
        if is_root() {
            run(Command::new("chown").arg("postgres:").arg(&root));
        }
        cluster
    }

    fn init(bin: PathBuf) -> Option<Cluster> {
        let cluster = Self::prepare(bin);
        run(cluster
            .command("initdb")
            .args(["-A", "trust", "-U", "postgres", "--no-sync", "-D"])
            .arg(&cluster.data));
        Some(cluster)
    }

    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// A fast restart: sessions are ended, committed data stays. (Stop and
    /// start rather than `pg_ctl restart`, which forgets the log file and
    /// leaves the server holding this process's output pipes.)
    pub fn restart(&self) {
        self.stop();
        self.pg_ctl_start();
    }

    fn pg_ctl_start(&self) {
        let root = self.data.parent().unwrap();
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off {}",
            self.port,
            root.display(),
            self.settings
        );
        let output = self
            .command("pg_ctl")
            .arg("-D")
            .arg(&self.data)
            .args(["-w", "-l"])
            .arg(root.join("log"))
            .args(["-o", &options, "start"])
            .output()
            .expect("pg_ctl starts");
        // The directory, and the server's log in it, go with the cluster:
        // say what the server said while it is still there.
        assert!(
            output.status.success(),
            "the cluster on port {} did not start: {}{}\nits log:\n{}",
            self.port,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr),
            std::fs::read_to_string(root.join("log")).unwrap_or_default()
        );
    }

    fn command(&self, program: &str) -> Command {
        server_tool(&self.bin, program)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self
            .command("pg_ctl")
            .arg("-D")
            .arg(&self.data)
            .args(["-m", "immediate", "stop"])
            .output();
        if let Some(root) = self.data.parent() {
            let _ = std::fs::remove_dir_all(root);
        }
    }
}

fn run(command: &mut Command) {
    if let Err(error) = run_tool(command) {
        panic!("{error}");
    }
}

/// Server binaries of Postgres 16 or later: `PG16_BINDIR`, else Debian's,
/// else those scripts/test fetched into `target/postgres-17`.
fn binaries_16() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("PG16_BINDIR") {
        return Some(PathBuf::from(dir)).filter(|dir| dir.join("initdb").is_file());
    }
    let fetched = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/postgres-17/native/bin");
    debian_binaries()
        .into_iter()
        .rev()
        .find(|(version, dir)| *version >= 16 && dir.join("initdb").is_file())
        .map(|(_, dir)| dir)
        .or_else(|| fetched.join("initdb").is_file().then_some(fetched))
}
