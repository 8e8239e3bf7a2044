//! The `[queues.NAME]` sections: which handler runs a queue's tasks (the built-in
//! `text-stats`, `exec` or `http`), with its settings, its concurrency and its retry backoff.
//! A queue without a section runs `text-stats` with the defaults. Read by
//! `RawConfig::validate` (raw.rs); used by the daemon to give each such queue a worker lane of
//! its own (docs/configuration.md, "[queues.NAME]"; docs/handlers.md).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use super::values::{duration, nonzero, positive, positive_size, size, Errors};
use crate::handler::exec::ExecSpec;
use crate::handler::http::HttpSpec;
use crate::privileges::{self, Identity, RunAs};

mod preflight;

use preflight::{check_program, check_url};

/// An exec handler's `timeout` when none is given.
pub const DEFAULT_EXEC_TIMEOUT: Duration = Duration::from_secs(300);
/// An http handler's `timeout` when none is given.
pub const DEFAULT_HTTP_TIMEOUT: Duration = Duration::from_secs(30);
/// From SIGTERM to SIGKILL of an exec handler's process group.
pub const DEFAULT_KILL_AFTER: Duration = Duration::from_secs(10);
/// The most bytes of a handler's answer stored as `output`.
pub const DEFAULT_MAX_OUTPUT: u64 = 1 << 20;
/// The largest `max_output` taken: the answer is held in memory and written in one row.
pub const MAX_MAX_OUTPUT: u64 = 64 << 20;
/// The first retry's ceiling: the n-th failed attempt waits up to `retry_backoff * 2^(n-1)`.
pub const DEFAULT_RETRY_BACKOFF: Duration = Duration::from_secs(1);
/// The longest wait before a retry.
pub const DEFAULT_MAX_BACKOFF: Duration = Duration::from_secs(600);

/// What runs a queue's tasks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandlerConfig {
    /// The built-in text analyzer: words, bytes and runes.
    TextStats,
    /// A command per task.
    Exec(ExecSpec),
    /// A `POST` per task.
    Http(HttpSpec),
}

impl HandlerConfig {
    /// The name written as `handler = "..."`.
    pub fn name(&self) -> &'static str {
        match self {
            HandlerConfig::TextStats => "text-stats",
            HandlerConfig::Exec(_) => "exec",
            HandlerConfig::Http(_) => "http",
        }
    }

    /// How this daemon runs the queue, as `pgtaskd.daemons.handlers` records it: `text-stats`,
    /// or `exec:` / `http:` and eight hex digits of a hash of the command or the URL (the URL
    /// may hold a key: only its hash is written). Two daemons with the same section give the
    /// same text; the hash is FNV-1a, the same in every build.
    pub fn fingerprint(&self) -> String {
        let hash = |parts: &[&str]| {
            let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
            for (i, part) in parts.iter().enumerate() {
                let separator: &[u8] = if i == 0 { b"" } else { b"\0" };
                for byte in separator.iter().chain(part.as_bytes()) {
                    hash ^= u64::from(*byte);
                    hash = hash.wrapping_mul(0x0100_0000_01b3);
                }
            }
            format!("{:08x}", (hash >> 32) as u32 ^ hash as u32)
        };
        match self {
            HandlerConfig::TextStats => self.name().to_string(),
            HandlerConfig::Exec(spec) => {
                let parts: Vec<&str> = spec.command.iter().map(String::as_str).collect();
                format!("exec:{}", hash(&parts))
            }
            // The URL as messages show it: its user name, password, query and fragment, where
            // secrets ride, are not hashed (the table is readable by producers).
            HandlerConfig::Http(spec) => format!(
                "http:{}",
                hash(&[crate::handler::http::shown_url(&spec.url).as_str()])
            ),
        }
    }
}

/// A queue's name as a TOML key: bare when it can be (`mail`), else quoted and escaped
/// (`"mail.out"`, `"a\u001B[31m"`), so that a section or key named in a message or in
/// `check-config`'s output can be pasted back into the file and no control character of a
/// name reaches the terminal.
pub(crate) fn toml_key(name: &str) -> String {
    let bare = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if bare {
        return name.to_string();
    }
    // A TOML basic string on one line: quotes, backslashes and control characters escaped.
    let mut key = String::with_capacity(name.len() + 2);
    key.push('"');
    for c in name.chars() {
        match c {
            '"' => key.push_str("\\\""),
            '\\' => key.push_str("\\\\"),
            c if c.is_control() => key.push_str(&format!("\\u{:04X}", u32::from(c))),
            c => key.push(c),
        }
    }
    key.push('"');
    key
}

/// One `[queues.NAME]` section, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueConfig {
    pub name: String,
    pub handler: HandlerConfig,
    /// At most this many of the queue's tasks at once in this daemon; `worker.concurrency`
    /// when not given (and `worker.concurrency` caps every queue together).
    pub concurrency: Option<usize>,
    /// The first retry's ceiling (full jitter: the wait is uniform below it).
    pub retry_backoff: Duration,
    /// The longest wait before a retry, `Retry-After` included.
    pub max_backoff: Duration,
}

impl QueueConfig {
    /// How long to wait before attempt `attempt + 1`, after attempt `attempt` failed:
    /// uniform in `[0, min(max_backoff, retry_backoff * 2^(attempt-1))]`, or the handler's
    /// own `after` (an HTTP `Retry-After`) capped at `max_backoff`.
    pub fn backoff(&self, attempt: i32, after: Option<Duration>) -> Duration {
        if let Some(after) = after {
            return after.min(self.max_backoff);
        }
        let doublings = attempt.saturating_sub(1).clamp(0, 30) as u32;
        let ceiling = self
            .retry_backoff
            .saturating_mul(1u32 << doublings)
            .min(self.max_backoff);
        let nanos = ceiling.as_nanos().min(u128::from(u64::MAX)) as u64;
        Duration::from_nanos(fastrand::u64(0..=nanos))
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawQueue {
    handler: Option<Spanned<String>>,
    command: Option<Spanned<Vec<String>>>,
    url: Option<Spanned<String>>,
    #[serde(default, deserialize_with = "duration")]
    timeout: Option<Spanned<Duration>>,
    #[serde(default, deserialize_with = "duration")]
    kill_after: Option<Spanned<Duration>>,
    concurrency: Option<Spanned<usize>>,
    #[serde(default, deserialize_with = "size")]
    max_output: Option<Spanned<u64>>,
    #[serde(default, deserialize_with = "duration")]
    retry_backoff: Option<Spanned<Duration>>,
    #[serde(default, deserialize_with = "duration")]
    max_backoff: Option<Spanned<Duration>>,
    user: Option<Spanned<String>>,
    group: Option<Spanned<String>>,
    /// Keys whose values the reading of the file refused (and said so), and took out: what
    /// depends on them is not checked again.
    #[serde(skip)]
    pub(super) refused: Vec<String>,
}

/// Validate every section; `served` are `worker.queues`, for the warnings; with
/// `check_programs`, each `exec` program must exist and be executable. Every error of every
/// section is added to `errors`, each at its position; the sections given are those without
/// one.
pub(super) fn validate(
    raw: BTreeMap<Spanned<String>, Spanned<RawQueue>>,
    served: &[String],
    concurrency: usize,
    check_programs: bool,
    warnings: &mut Vec<String>,
    errors: &mut Errors,
) -> Vec<QueueConfig> {
    let mut queues = Vec::with_capacity(raw.len());
    for (name, section) in raw {
        let span = name.span();
        let name = name.into_inner();
        let shown = toml_key(&name);
        if let Err(err) = crate::queue::enqueue::check_queue_name(&name) {
            errors.0.push((span, format!("[queues.{shown}]: {err}")));
            continue;
        }
        let Some(queue) = section
            .into_inner()
            .validate(&name, span, check_programs, errors)
        else {
            continue;
        };
        if !served.contains(&queue.name) {
            warnings.push(format!(
                "[queues.{shown}] is configured but worker.queues ({}) does not serve it: \
                 this daemon never runs its handler",
                served.join(", ")
            ));
        }
        if let Some(n) = queue.concurrency {
            if n > concurrency {
                warnings.push(format!(
                    "queues.{shown}.concurrency is {n}, but worker.concurrency ({concurrency}) \
                     caps every queue together"
                ));
            }
        }
        queues.push(queue);
    }
    queues
}

impl RawQueue {
    /// This section, validated; `None` when it has an error, each of which is added to `e`.
    fn validate(
        self,
        name: &str,
        span: std::ops::Range<usize>,
        check_programs: bool,
        e: &mut Errors,
    ) -> Option<QueueConfig> {
        let before = e.0.len();
        let shown = toml_key(name);
        let key = |k: &str| format!("queues.{shown}.{k}");
        let refused = |k: &str| self.refused.iter().any(|r| r == k);
        let handler = match &self.handler {
            None if refused("handler") => None,
            None => Some("text-stats"),
            Some(h) => match h.get_ref().as_str() {
                "text-stats" => Some("text-stats"),
                "exec" => Some("exec"),
                "http" => Some("http"),
                other => {
                    e.0.push((
                        h.span(),
                        format!(
                            "{} is {other:?}: write \"text-stats\" (the built-in analyzer), \
                             \"exec\" (a command per task) or \"http\" (a POST per task)",
                            key("handler")
                        ),
                    ));
                    None
                }
            },
        };
        // A key of another handler is a mistake, not something to ignore.
        let foreign = [
            ("command", self.command.as_ref().map(Spanned::span), "exec"),
            ("url", self.url.as_ref().map(Spanned::span), "http"),
            (
                "kill_after",
                self.kill_after.as_ref().map(Spanned::span),
                "exec",
            ),
            (
                "timeout",
                self.timeout.as_ref().map(Spanned::span),
                "exec\" or \"http",
            ),
            (
                "max_output",
                self.max_output.as_ref().map(Spanned::span),
                "exec\" or \"http",
            ),
            ("user", self.user.as_ref().map(Spanned::span), "exec"),
            ("group", self.group.as_ref().map(Spanned::span), "exec"),
        ];
        if let Some(handler) = handler {
            for (k, at, owner) in foreign {
                let belongs = owner.split("\" or \"").any(|o| o == handler);
                if let (Some(at), false) = (at, belongs) {
                    e.0.push((
                        at,
                        format!(
                            "{} is for handler = \"{owner}\", and this queue's handler is \"{handler}\"",
                            key(k)
                        ),
                    ));
                }
            }
        }
        let max_output = e.check(self.max_output.as_ref(), DEFAULT_MAX_OUTPUT, |v| {
            let n = positive_size(&key("max_output"), v)?;
            if n > MAX_MAX_OUTPUT {
                return Err((
                    v.span(),
                    format!("{} is over the largest taken, 64MiB", key("max_output")),
                ));
            }
            Ok(n)
        }) as usize;
        let timeout = |e: &mut Errors, default| {
            e.check(self.timeout.as_ref(), default, |v| {
                nonzero(&key("timeout"), v)
            })
        };
        let handler = match handler {
            Some("exec") => {
                // First: the program is checked as the user and group the child runs as.
                let run_as = self.run_as(&key, check_programs, e);
                let who = Identity::of_child(run_as.as_ref());
                let command = match &self.command {
                    None if refused("command") => Vec::new(),
                    None => {
                        e.0.push((
                            span.clone(),
                            format!(
                                "[queues.{shown}] has handler = \"exec\" but no command: write \
                                 command = [\"/path/to/program\", \"arg\"]"
                            ),
                        ));
                        Vec::new()
                    }
                    Some(command) => e.check(Some(command), Vec::new(), |command| {
                        let exists = check_programs.then_some(&who);
                        check_program(command.get_ref(), &key("command"), exists)
                            .map(|()| command.get_ref().clone())
                            .map_err(|message| (command.span(), message))
                    }),
                };
                let timeout = timeout(e, DEFAULT_EXEC_TIMEOUT);
                let kill_after = e.check(self.kill_after.as_ref(), DEFAULT_KILL_AFTER, |v| {
                    nonzero(&key("kill_after"), v)
                });
                Some(HandlerConfig::Exec(ExecSpec {
                    command,
                    timeout,
                    kill_after,
                    max_output,
                    run_as,
                }))
            }
            Some("http") => {
                let url = match &self.url {
                    None if refused("url") => String::new(),
                    None => {
                        e.0.push((
                            span.clone(),
                            format!(
                                "[queues.{shown}] has handler = \"http\" but no url: write \
                                 url = \"http://127.0.0.1:8080/jobs\""
                            ),
                        ));
                        String::new()
                    }
                    Some(url) => e.check(Some(url), String::new(), |url| {
                        check_url(url.get_ref(), &key("url"))
                            .map(|()| url.get_ref().clone())
                            .map_err(|message| (url.span(), message))
                    }),
                };
                let timeout = timeout(e, DEFAULT_HTTP_TIMEOUT);
                Some(HandlerConfig::Http(HttpSpec {
                    url,
                    timeout,
                    max_output,
                }))
            }
            Some(_) => Some(HandlerConfig::TextStats),
            None => None,
        };
        let retry_backoff = e.check(self.retry_backoff.as_ref(), DEFAULT_RETRY_BACKOFF, |v| {
            nonzero(&key("retry_backoff"), v)
        });
        let max_backoff = e.check(
            self.max_backoff.as_ref(),
            DEFAULT_MAX_BACKOFF.max(retry_backoff),
            |v| {
                let d = nonzero(&key("max_backoff"), v)?;
                if d < retry_backoff {
                    return Err((
                        v.span(),
                        format!(
                            "{} ({}) is shorter than {} ({})",
                            key("max_backoff"),
                            humantime::format_duration(d),
                            key("retry_backoff"),
                            humantime::format_duration(retry_backoff)
                        ),
                    ));
                }
                Ok(d)
            },
        );
        let concurrency = e.check(self.concurrency.as_ref(), None, |v| {
            positive(&key("concurrency"), v).map(Some)
        });
        if e.0.len() > before || !self.refused.is_empty() {
            return None;
        }
        Some(QueueConfig {
            name: name.to_string(),
            handler: handler?,
            concurrency,
            retry_backoff,
            max_backoff,
        })
    }
}

impl RawQueue {
    /// `user` and `group`, resolved to ids; `None` when neither is given or one is refused
    /// (added to `e`). With `check_switch` (the commands that start children), the system must
    /// know both names, and the daemon must be able to switch a child to them and signal it:
    /// root, or `CAP_SETGID` (and `CAP_SETUID` and `CAP_KILL` for a user) in its effective
    /// set. Without it, a name the system does not know is let pass (nothing is started).
    fn run_as(
        &self,
        key: &dyn Fn(&str) -> String,
        check_switch: bool,
        e: &mut Errors,
    ) -> Option<RunAs> {
        let user = self.user.as_ref();
        let group = self.group.as_ref();
        let (k, at) = match (user, group) {
            (Some(user), _) => ("user", user),
            (None, Some(group)) => ("group", group),
            (None, None) => return None,
        };
        let run_as = match privileges::resolve(
            user.map(|u| u.get_ref().as_str()),
            group.map(|g| g.get_ref().as_str()),
        ) {
            Ok(run_as) => run_as,
            // For the commands that never start a child: a user not created yet, in a deploy
            // half done, must not keep an operator from `status` or `list`.
            Err(_) if !check_switch => return None,
            Err((is_user, message)) => {
                let (k, at) = match (is_user, user, group) {
                    (true, Some(user), _) => ("user", user),
                    (false, _, Some(group)) => ("group", group),
                    _ => (k, at),
                };
                e.0.push((at.span(), format!("{}: {message}", key(k))));
                return None;
            }
        };
        if check_switch {
            if let Err(missing) = privileges::can_switch(user.is_some()) {
                let daemon = Identity::current().describe();
                e.0.push((
                    at.span(),
                    format!(
                        "{} = {:?}: this daemon runs as {daemon} without {missing}, and cannot \
                         start and stop a child as another user or group; run it as root or \
                         give it CAP_SETUID, CAP_SETGID and CAP_KILL (docs/handlers.md, \"Who \
                         the child runs as\")",
                        key(k),
                        at.get_ref()
                    ),
                ));
                return None;
            }
        }
        Some(run_as)
    }
}

#[cfg(test)]
mod tests;
