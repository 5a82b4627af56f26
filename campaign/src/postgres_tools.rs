//! Finding and running Postgres's server programs (`initdb`, `pg_ctl`,
//! `pg_basebackup`) for throwaway clusters: shared, by path, between the
//! fault campaign (`campaign/`) and the integration tests' clusters
//! (`tests/it/support/cluster.rs`), so it uses the standard library only.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Debian's server binary folders with their major versions, oldest first.
pub fn debian_binaries() -> Vec<(u32, PathBuf)> {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
            Some((version, entry.path().join("bin")))
        })
        .collect();
    found.sort();
    found
}

/// `PG_BINDIR`, else the newest of Debian's server packages, else `PATH`.
pub fn server_binaries() -> Option<PathBuf> {
    let has_initdb = |dir: &Path| dir.join("initdb").is_file().then(|| dir.to_owned());
    if let Some(dir) = std::env::var_os("PG_BINDIR") {
        return has_initdb(Path::new(&dir));
    }
    debian_binaries()
        .iter()
        .rev()
        .find_map(|(_, dir)| has_initdb(dir))
        .or_else(|| {
            std::env::split_paths(&std::env::var_os("PATH")?).find_map(|dir| has_initdb(&dir))
        })
}

pub fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| out.stdout.trim_ascii() == b"0")
}

/// `program` from `bin`, run as `postgres` when this runs as root
/// (Postgres refuses root).
pub fn server_tool(bin: &Path, program: &str) -> Command {
    let path = bin.join(program);
    if is_root() {
        let mut command = Command::new("runuser");
        command.args(["-u", "postgres", "--"]).arg(path);
        command
    } else {
        Command::new(path)
    }
}

/// Runs `command`; its output is the error when it fails.
pub fn run_tool(command: &mut Command) -> Result<(), String> {
    let output = command.output().map_err(|e| format!("{command:?}: {e}"))?;
    if output.status.success() {
        return Ok(());
    }
    Err(format!(
        "{command:?} failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    ))
}

/// `pg_basebackup` copying the server on `port` into `data` as a streaming
/// standby of it (`-R`), after a fast checkpoint.
pub fn base_backup(bin: &Path, port: u16, data: &Path) -> Command {
    let mut command = server_tool(bin, "pg_basebackup");
    command
        .args(["-h", "127.0.0.1", "-U", "postgres", "-X", "stream", "-R"])
        .args(["-c", "fast", "--no-sync", "-p", &port.to_string(), "-D"])
        .arg(data);
    command
}
