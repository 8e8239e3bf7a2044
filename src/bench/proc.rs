//! A process's CPU time and peak memory, read from `/proc`: what the bench reports of the
//! daemon it runs, and the CPU time of the server's backends that served a run (when the
//! server runs on the same machine). Called by [`super::daemon`] and [`super::run`].

/// What a process has used so far.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Usage {
    /// CPU seconds, user and system, all threads.
    pub(super) cpu_s: f64,
    /// Peak resident set size (`VmHWM`), in MiB.
    pub(super) peak_rss_mib: f64,
}

impl Usage {
    /// The usage of process `pid`; zeros for what cannot be read (a process that has exited).
    pub(super) fn of(pid: u32) -> Usage {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        // SAFETY: sysconf has no preconditions.
        let ticks_per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        Usage {
            cpu_s: cpu_ticks(&stat) / ticks_per_second,
            peak_rss_mib: peak_kib(&status) / 1024.0,
        }
    }
}

/// CPU seconds, user and system, that the server processes `pids` (the backends of a run's
/// sessions) have used so far. `None` unless every one of them is a PostgreSQL process of this
/// machine: a server elsewhere has its own process ids, which mean nothing here.
pub(super) fn backends_cpu_s(pids: &[i32]) -> Option<f64> {
    let mut ticks = 0.0;
    for pid in pids {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        if command_name(&stat) != Some("postgres") {
            return None;
        }
        ticks += cpu_ticks(&stat);
    }
    // SAFETY: sysconf has no preconditions.
    Some(ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64)
}

/// The command name of a `/proc/PID/stat` line: what the parentheses hold.
fn command_name(stat: &str) -> Option<&str> {
    let (_, rest) = stat.split_once('(')?;
    Some(rest.rsplit_once(')')?.0)
}

/// utime + stime of a `/proc/PID/stat` line, in clock ticks.
fn cpu_ticks(stat: &str) -> f64 {
    // Fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    ticks(11) + ticks(12)
}

/// `VmHWM` of a `/proc/PID/status` file, in KiB.
fn peak_kib(status: &str) -> f64 {
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_ticks_are_utime_plus_stime_even_when_the_command_name_holds_spaces_and_parens() {
        let stat = "4242 (pg (task) d) S 1 4242 4242 0 -1 4194560 100 0 0 0 17 5 0 0 20 0 9 0";
        assert_eq!(cpu_ticks(stat), 22.0);
    }

    #[test]
    fn the_command_name_is_what_the_parentheses_hold() {
        let stat = "4242 (pg (task) d) S 1 4242 4242 0 -1 4194560 100 0 0 0 17 5 0 0 20 0 9 0";
        assert_eq!(command_name(stat), Some("pg (task) d"));
        assert_eq!(command_name("4242 postgres S"), None);
    }

    #[test]
    fn a_process_that_is_not_postgres_gives_no_server_cpu() {
        // This test's own process is not named postgres.
        assert_eq!(backends_cpu_s(&[std::process::id() as i32]), None);
        assert_eq!(backends_cpu_s(&[]), Some(0.0));
    }

    #[test]
    fn peak_kib_is_the_vmhwm_line() {
        let status = "Name:\tpgtaskd\nVmPeak:\t  9000 kB\nVmHWM:\t    5120 kB\nVmRSS:\t 4096 kB\n";
        assert_eq!(peak_kib(status), 5120.0);
    }

    #[test]
    fn unreadable_files_count_as_zero() {
        assert_eq!(cpu_ticks(""), 0.0);
        assert_eq!(peak_kib(""), 0.0);
    }
}
