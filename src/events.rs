//! The messages of the daemon's log events that other code reads back: the bench times a
//! task's latency by one, and the integration tests count them in a daemon's log. A log
//! line's message is its `message` field in the JSON format and its text in the plain one.
//!
//! The worker, the completer and the rescuer emit these events; whoever parses them names them
//! through this module.

/// Debug event of the worker, with the task's `id` and `attempt`, logged just before the
/// handler (the analyzer, a command, a request) starts on a claimed task.
pub const ANALYZER_RUN: &str = "handler run";

/// Info event of a task that ended FAILED, with its `id`, `queue`, `attempts` and the first
/// line of its `error` ([`task_failed`]): one line per such task, logged once its end is
/// committed, by the completer (the statement of its finishes, `queue::finish`, or its
/// re-read of a finish whose answer was lost) or the rescuer (a lease that ran out on the
/// last attempt, a parked result that failed).
pub const TASK_FAILED: &str = "task failed";

/// The most characters of an error's first line that a [`TASK_FAILED`] line shows: an
/// error may be the 1 KiB head of an endpoint's body, or a command's stderr tail.
pub const FAILED_ERROR_CHARS: usize = 200;

/// Log [`TASK_FAILED`] for task `id` of `queue`, ended on attempt `attempts` with `error`.
pub fn task_failed(id: i64, queue: &str, attempts: i32, error: &str) {
    tracing::info!(
        id,
        queue = %queue,
        attempts,
        error = %first_line(error),
        "{TASK_FAILED}"
    );
}

/// The first line of `error` that is not blank, at most [`FAILED_ERROR_CHARS`] characters
/// (cut with `...`).
fn first_line(error: &str) -> String {
    let line = error
        .lines()
        .map(str::trim)
        .find(|line| !line.is_empty())
        .unwrap_or_default();
    match line.char_indices().nth(FAILED_ERROR_CHARS) {
        Some((cut, _)) => format!("{}...", &line[..cut]),
        None => line.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_line_shows_the_errors_first_line_cut_to_a_sane_length() {
        assert_eq!(first_line("exit status 2\nstderr: boom"), "exit status 2");
        assert_eq!(first_line("\n  \n  HTTP 422: no\n"), "HTTP 422: no");
        assert_eq!(first_line(""), "");
        let long = "é".repeat(FAILED_ERROR_CHARS + 1);
        let cut = first_line(&long);
        assert_eq!(cut.chars().count(), FAILED_ERROR_CHARS + 3);
        assert!(cut.ends_with("é..."));
        assert_eq!(
            first_line(&long[..FAILED_ERROR_CHARS * 2]).len(),
            FAILED_ERROR_CHARS * 2
        );
    }
}
