//! The `exec` handler: one child process per task (to be written).

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{Job, Ran};

/// A queue's `exec` settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecSpec {
    /// argv: the program and its arguments; no shell.
    pub command: Vec<String>,
    /// Then SIGTERM to the child's process group.
    pub timeout: Duration,
    /// After SIGTERM (timeout, cancel, shutdown), SIGKILL this much later.
    pub kill_after: Duration,
    /// The most bytes of stdout kept as the output; over it the attempt fails.
    pub max_output: usize,
}

/// Run `spec.command` for `job`, with `payload` on its stdin.
pub async fn run(spec: &ExecSpec, job: &Job, payload: &[u8], cancel: &CancellationToken) -> Ran {
    let _ = (spec, job, payload, cancel);
    todo!("exec handler")
}
