//! The messages of the daemon's log events that other code reads back: the bench times a
//! task's latency by one, and the integration tests count them in a daemon's log. A log
//! line's message is its `message` field in the JSON format and its text in the plain one.
//!
//! The worker emits these events; whoever parses them names them through this module.

/// Debug event of the worker, with the task's `id` and `attempt`, logged just before the
/// handler (the analyzer, a command, a request) starts on a claimed task.
pub const ANALYZER_RUN: &str = "handler run";
