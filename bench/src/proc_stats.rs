//! CPU time and resident memory of server processes, read from /proc.

fn ticks_per_second() -> f64 {
    // SAFETY: sysconf only reads a constant of the running system.
    unsafe { libc::sysconf(libc::_SC_CLK_TCK) as f64 }
}

fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = &text[text.rfind(')')? + 2..];
    Some(after_name.split_whitespace().map(str::to_owned).collect())
}

/// User and system CPU seconds of `pids` so far, apart: system time is mostly
/// socket work in the kernel, which any server writing the same frames pays.
pub fn cpu_split(pids: &[u32]) -> (f64, f64) {
    pids.iter()
        .filter_map(|pid| {
            let fields = stat_fields(*pid)?;
            // utime and stime are fields 14 and 15; index from field 3.
            let user: f64 = fields.get(11)?.parse().ok()?;
            let system: f64 = fields.get(12)?.parse().ok()?;
            Some((user / ticks_per_second(), system / ticks_per_second()))
        })
        .fold((0.0, 0.0), |(u, s), (user, system)| (u + user, s + system))
}

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

#[derive(Debug, Clone, Copy)]
pub struct Usage {
    pub cpu_seconds: f64,
    pub system_seconds: f64,
    pub rss_bytes: u64,
}

pub fn usage(pids: &[u32]) -> Usage {
    let (user, system) = cpu_split(pids);
    Usage {
        cpu_seconds: user + system,
        system_seconds: system,
        rss_bytes: rss_bytes(pids),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn a_busy_loop_shows_as_user_time() {
        let me = [std::process::id()];
        let (user_before, _) = cpu_split(&me);
        // Spins until the kernel has counted a fifth of a second of user
        // time (it counts in ticks of 1/100 s), however busy the machine.
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut spins = 0u64;
        let (user_after, system_after) = loop {
            for _ in 0..1_000_000 {
                spins = std::hint::black_box(spins.wrapping_add(1));
            }
            let (user, system) = cpu_split(&me);
            if user - user_before >= 0.2 {
                break (user, system);
            }
            assert!(
                Instant::now() < deadline,
                "20 s of spinning counted as {} s of user time",
                user - user_before
            );
        };
        let usage = usage(&me);
        assert!(usage.cpu_seconds >= user_after + system_after);
        assert!(usage.system_seconds >= system_after);
        assert!(usage.system_seconds <= usage.cpu_seconds);
    }
}
