//! What /proc says about a process (Linux only): resident memory, CPU time, open descriptors.

use std::process::Command;

/// Resident set (VmRSS) in KiB; `None` when the process is gone or /proc has no such field.
pub fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// utime + stime in clock ticks.
pub fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: count from the last ')'.
    // After it, state is field 0, utime field 11 and stime field 12.
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// Number of open file descriptors.
pub fn open_fds(pid: u32) -> Option<usize> {
    std::fs::read_dir(format!("/proc/{pid}/fd")).ok().map(Iterator::count)
}

/// Clock ticks per second (`getconf CLK_TCK`; 100 on every Linux in practice).
pub fn clock_ticks_per_second() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse::<f64>().ok())
        .unwrap_or(100.0)
}

/// The kernel's TCP counters of this network namespace (`/proc/net/netstat`, `TcpExt`): e.g.
/// `ListenOverflows` (a connection arrived while a listener's accept queue was full: its SYN or
/// handshake is dropped and the client retries after 1 s, 3 s, 7 s...) and `TCPSynRetrans`.
/// They count every process of the namespace.
pub fn tcp_ext(name: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/net/netstat").ok()?;
    let mut lines = text.lines().filter(|l| l.starts_with("TcpExt:"));
    let (names, values) = (lines.next()?, lines.next()?);
    names.split_whitespace().zip(values.split_whitespace()).find(|(n, _)| *n == name).and_then(|(_, v)| v.parse().ok())
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_this_process() {
        let pid = std::process::id();
        assert!(super::rss_kib(pid).is_some_and(|kib| kib > 0));
        assert!(super::cpu_ticks(pid).is_some());
        // stdin, stdout, stderr at least.
        assert!(super::open_fds(pid).is_some_and(|n| n >= 3));
        assert!(super::clock_ticks_per_second() > 0.0);
        assert!(super::tcp_ext("ListenOverflows").is_some(), "/proc/net/netstat has TcpExt counters");
        assert_eq!(super::tcp_ext("NoSuchCounter"), None);
    }

    #[test]
    fn a_process_that_does_not_exist_reads_as_none() {
        // Above the kernel's largest pid (4,194,304).
        assert_eq!(super::rss_kib(u32::MAX), None);
        assert_eq!(super::cpu_ticks(u32::MAX), None);
        assert_eq!(super::open_fds(u32::MAX), None);
    }
}
