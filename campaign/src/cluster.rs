//! The campaign's own Postgres: a primary and a streaming standby in
//! throwaway data directories on two loopback ports, which the campaign
//! restarts, fails over and rebuilds. Relays and writers reach whichever is
//! the primary through one multi-host URL over both ports.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::postgres_tools::{base_backup, is_root, run_tool, server_binaries, server_tool};
use eventrelay_bench::BenchResult;

/// One server: its data directory and port.
struct Server {
    data: PathBuf,
    port: u16,
}

pub struct Cluster {
    bin: PathBuf,
    root: PathBuf,
    primary: Server,
    standby: Server,
    /// Data directories made so far, for fresh names.
    made: usize,
}

/// Server settings: logical decoding possible in both modes, no fsync,
/// enough WAL kept for a standby that fell behind (a primary restarting
/// under load) to catch up rather than be stranded, and then promoted
/// without the last commits, and a short `wal_sender_timeout`: a WAL
/// sender whose relay's path froze holds up a fast shutdown until then.
const SETTINGS: &str = "-c wal_level=logical -c max_wal_senders=20 -c max_replication_slots=20 \
     -c hot_standby_feedback=on -c fsync=off -c max_connections=200 -c wal_keep_size=2048 \
     -c wal_sender_timeout=5s";

impl Cluster {
    /// Creates the primary under `root`, and a standby copied from it.
    pub fn start(root: &Path) -> BenchResult<Cluster> {
        let bin = server_binaries()
            .ok_or("no Postgres server binaries (initdb, pg_ctl): install them or set PG_BINDIR")?;
        std::fs::create_dir_all(root)?;
        let mut cluster = Cluster {
            bin,
            root: root.to_owned(),
            primary: Server {
                data: PathBuf::new(),
                port: eventrelay_bench::relay_process::free_port()?,
            },
            standby: Server {
                data: PathBuf::new(),
                port: eventrelay_bench::relay_process::free_port()?,
            },
            made: 0,
        };
        if is_root() {
            run(Command::new("chown").arg("postgres:").arg(root))?;
        }
        cluster.primary.data = cluster.fresh_dir();
        run(cluster
            .tool("initdb")
            .args(["-A", "trust", "-U", "postgres", "--no-sync", "-D"])
            .arg(&cluster.primary.data))?;
        cluster.start_server(&cluster.primary)?;
        cluster.rebuild_standby()?;
        Ok(cluster)
    }

    /// Both servers, primary first as relays should try them.
    pub fn url(&self) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/postgres?target_session_attrs=read-write",
            self.primary.port, self.standby.port
        )
    }

    /// Both servers' ports. They stay the same through failovers: the
    /// servers swap roles, and a new standby takes the old primary's port.
    pub fn ports(&self) -> [u16; 2] {
        [self.primary.port, self.standby.port]
    }

    /// The current primary alone.
    pub fn primary_url(&self) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/postgres",
            self.primary.port
        )
    }

    /// A fast restart of the primary: sessions end, committed data stays.
    pub fn restart_primary(&self) -> BenchResult<()> {
        self.stop_server(&self.primary)?;
        self.start_server(&self.primary)
    }

    /// Stops the primary, promotes the standby, and makes a new standby of
    /// the new primary on the old primary's port, so the URL still names
    /// both servers. A planned failover that loses nothing: the primary
    /// stops only once the standby streams from it, and a fast shutdown
    /// sends a streaming standby every commit before the primary is down.
    /// (A standby that is not streaming then, such as one just made or
    /// whose primary just restarted, would be promoted without the last
    /// commits, and the history the clients saw would be rewritten.)
    pub fn fail_over(&mut self) -> BenchResult<()> {
        self.wait_streaming()?;
        self.stop_server(&self.primary)?;
        self.promote_standby()
    }

    /// A failover that loses commits, as an asynchronous standby's does
    /// when its primary dies: the standby stops receiving, the primary goes
    /// on taking commits for `alone`, then crashes; the standby starts
    /// again and is promoted without them.
    pub fn fail_over_losing_commits(&mut self, alone: std::time::Duration) -> BenchResult<()> {
        self.wait_streaming()?;
        self.stop_server(&self.standby)?;
        std::thread::sleep(alone);
        run(self.tool("pg_ctl").arg("-D").arg(&self.primary.data).args([
            "-w",
            "-m",
            "immediate",
            "stop",
        ]))?;
        self.start_server(&self.standby)?;
        self.promote_standby()
    }

    /// Promotes the standby, swaps the roles, and makes a new standby on
    /// the old primary's port.
    fn promote_standby(&mut self) -> BenchResult<()> {
        run(self
            .tool("pg_ctl")
            .arg("-D")
            .arg(&self.standby.data)
            .args(["-w", "promote"]))?;
        std::mem::swap(&mut self.primary, &mut self.standby);
        let old = std::mem::take(&mut self.standby.data);
        let _ = std::fs::remove_dir_all(&old);
        self.rebuild_standby()
    }

    /// A standby copied from the primary with `pg_basebackup`, started on
    /// the standby's port.
    fn rebuild_standby(&mut self) -> BenchResult<()> {
        self.standby.data = self.fresh_dir();
        run(&mut base_backup(
            &self.bin,
            self.primary.port,
            &self.standby.data,
        ))?;
        self.start_server(&self.standby)
    }

    /// Waits until the standby streams from the primary (at most 30 s).
    fn wait_streaming(&self) -> BenchResult<()> {
        let port = self.primary.port.to_string();
        for _ in 0..300 {
            let output = self
                .tool("psql")
                .args(["-h", "127.0.0.1", "-p", &port, "-U", "postgres", "-Atc"])
                .arg(
                    // The physical standby's connection, not a relay's
                    // logical stream.
                    "SELECT count(*) FROM pg_stat_replication \
                     WHERE state = 'streaming' AND application_name = 'walreceiver'",
                )
                .output()?;
            if String::from_utf8_lossy(&output.stdout).trim() != "0" && output.status.success() {
                return Ok(());
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        Err("the standby did not stream from the primary within 30 s".into())
    }

    fn fresh_dir(&mut self) -> PathBuf {
        self.made += 1;
        self.root.join(format!("data-{}", self.made))
    }

    fn start_server(&self, server: &Server) -> BenchResult<()> {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 {SETTINGS}",
            server.port,
            self.root.display()
        );
        run(self
            .tool("pg_ctl")
            .arg("-D")
            .arg(&server.data)
            .args(["-w", "-l"])
            .arg(server.data.with_extension("log"))
            .args(["-o", &options, "start"]))
    }

    fn stop_server(&self, server: &Server) -> BenchResult<()> {
        run(self
            .tool("pg_ctl")
            .arg("-D")
            .arg(&server.data)
            .args(["-w", "-m", "fast", "stop"]))
    }

    fn tool(&self, program: &str) -> Command {
        server_tool(&self.bin, program)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for server in [&self.primary, &self.standby] {
            let _ = self
                .tool("pg_ctl")
                .arg("-D")
                .arg(&server.data)
                .args(["-m", "immediate", "stop"])
                .output();
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

fn run(command: &mut Command) -> BenchResult<()> {
    Ok(run_tool(command)?)
}
