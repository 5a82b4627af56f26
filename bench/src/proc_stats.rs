//! CPU time and resident memory of server processes, read from /proc.

use std::sync::OnceLock;

/// Clock ticks per second for /proc/<pid>/stat times.
fn ticks_per_second() -> f64 {
    static TICKS: OnceLock<f64> = OnceLock::new();
    *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|out| String::from_utf8(out.stdout).ok())
            .and_then(|text| text.trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// The stat fields after the command name (which may contain spaces).
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = &text[text.rfind(')')? + 2..];
    Some(after_name.split_whitespace().map(str::to_owned).collect())
}

/// User plus system CPU seconds used so far by `pids`.
pub fn cpu_seconds(pids: &[u32]) -> f64 {
    pids.iter()
        .filter_map(|pid| {
            let fields = stat_fields(*pid)?;
            // utime and stime are fields 14 and 15; index from field 3.
            let user: f64 = fields.get(11)?.parse().ok()?;
            let system: f64 = fields.get(12)?.parse().ok()?;
            Some((user + system) / ticks_per_second())
        })
        .sum()
}

/// Resident set size in bytes (VmRSS) summed over `pids`.
pub fn rss_bytes(pids: &[u32]) -> u64 {
    pids.iter()
        .filter_map(|pid| {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
            let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib * 1024)
        })
        .sum()
}

/// The children of `parent` (nginx's workers under its master).
pub fn children_of(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            stat_fields(*pid)
                .and_then(|fields| fields.get(1)?.parse::<u32>().ok())
                .is_some_and(|ppid| ppid == parent)
        })
        .collect()
}

/// CPU and memory snapshot used around a measured phase.
#[derive(Debug, Clone, Copy)]
pub struct Usage {
    pub cpu_seconds: f64,
    pub rss_bytes: u64,
}

pub fn usage(pids: &[u32]) -> Usage {
    Usage {
        cpu_seconds: cpu_seconds(pids),
        rss_bytes: rss_bytes(pids),
    }
}
