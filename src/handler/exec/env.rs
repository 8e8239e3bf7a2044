//! The environment an `exec` handler's child gets: the daemon's own, minus its secrets and its
//! settings, plus what the child is told about its task.
//!
//! A pure function of the inherited variables and the [`Job`], so that what is removed is
//! tested without touching the process's environment.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;

use crate::handler::Job;
use crate::privileges::User;

/// The variables that name the user, replaced by the queue's `user`'s when it has one.
const USER_VARS: &[&str] = &["HOME", "USER", "LOGNAME"];

/// Variables never passed on, besides every name starting with `PG` (libpq's `PGPASSWORD`,
/// `PGHOST`, `PGPASSFILE`, `PGSSLKEY`... and the daemon's own `PGTASKD_*` settings): the
/// database's address, systemd's credentials and its notification, socket-activation and
/// watchdog variables (meant for the daemon alone), and a trace context that is not the task's.
const REMOVED: &[&str] = &[
    "DATABASE_URL",
    "CREDENTIALS_DIRECTORY",
    "NOTIFY_SOCKET",
    "LISTEN_FDS",
    "LISTEN_PID",
    "LISTEN_FDNAMES",
    "WATCHDOG_USEC",
    "WATCHDOG_PID",
    "TRACEPARENT",
    "TRACESTATE",
];

/// Whether the daemon's variable `name` is kept out of a child's environment.
pub fn is_removed(name: &OsStr) -> bool {
    let bytes = name.as_bytes();
    bytes.starts_with(b"PG") || REMOVED.iter().any(|removed| removed.as_bytes() == bytes)
}

/// The child's environment for `job`: `inherited` (the daemon's environment, as
/// `std::env::vars_os()` gives it) without the variables [`is_removed`] names, then
/// `PGTASKD_TASK_ID`, `PGTASKD_TASK_KEY` (the same for every attempt: the handler's
/// idempotency key), `PGTASKD_ATTEMPT`, `PGTASKD_RUN`, `PGTASKD_QUEUE`, `PGTASKD_CLAIM` (the
/// claim's token) and, when the task has them, `PGTASKD_IDEMPOTENCY_KEY` (the producer's),
/// `PGTASKD_SCHEDULE` and `PGTASKD_SCHEDULED_AT` (a schedule's fire), `PGTASKD_PARENTS` (the
/// first 200 parents' `ID=STATUS`, separated by commas) and `PGTASKD_PARENT_COUNT` (a task
/// with parents), `PGTASKD_BATCH` (a batch's member or callback) and, for a callback,
/// `PGTASKD_BATCH_SUCCEEDED`, `PGTASKD_BATCH_FAILED` and `PGTASKD_BATCH_CANCELED`,
/// `PGTASKD_PROGRESS` (the progress an earlier attempt left, JSON), and `TRACEPARENT`;
/// `PGTASKD_PROGRESS_FD` when the run reads progress on `progress_fd`. With
/// `user` (the queue's `user`), `HOME`, `USER` and `LOGNAME` are the user's instead of the
/// daemon's.
pub fn child_env<I>(
    inherited: I,
    job: &Job,
    user: Option<&User>,
    progress_fd: Option<i32>,
) -> Vec<(OsString, OsString)>
where
    I: IntoIterator<Item = (OsString, OsString)>,
{
    let mut env: Vec<(OsString, OsString)> = inherited
        .into_iter()
        .filter(|(name, _)| !is_removed(name))
        .filter(|(name, _)| user.is_none() || !USER_VARS.iter().any(|var| name == *var))
        .collect();
    let mut set = |name: &str, value: String| env.push((name.into(), value.into()));
    if let Some(user) = user {
        set("HOME", user.home.clone());
        set("USER", user.name.clone());
        set("LOGNAME", user.name.clone());
    }
    set("PGTASKD_TASK_ID", job.id.to_string());
    set("PGTASKD_TASK_KEY", job.key.clone());
    set("PGTASKD_ATTEMPT", job.attempt.to_string());
    set("PGTASKD_RUN", job.run.to_string());
    set("PGTASKD_QUEUE", job.queue.clone());
    set("PGTASKD_CLAIM", job.token.to_string());
    if let Some(key) = &job.idempotency_key {
        set("PGTASKD_IDEMPOTENCY_KEY", key.clone());
        if let Some((schedule, instant)) = crate::schedule::fired_by(key) {
            set("PGTASKD_SCHEDULE", schedule.to_string());
            set("PGTASKD_SCHEDULED_AT", instant.to_string());
        }
    }
    if let Some(parents) = &job.parents {
        set("PGTASKD_PARENTS", parents.clone());
        set("PGTASKD_PARENT_COUNT", job.parent_count.to_string());
    }
    if let Some(progress) = &job.progress {
        set("PGTASKD_PROGRESS", progress.clone());
    }
    if let Some(fd) = progress_fd {
        set("PGTASKD_PROGRESS_FD", fd.to_string());
    }
    if let Some(batch) = job.batch {
        set("PGTASKD_BATCH", batch.to_string());
    }
    // A callback's counts, one variable per outcome.
    for (outcome, count) in job
        .batch_counts
        .iter()
        .flat_map(|counts| batch_counts(counts))
    {
        let name = match outcome {
            "succeeded" => "PGTASKD_BATCH_SUCCEEDED",
            "failed" => "PGTASKD_BATCH_FAILED",
            "canceled" => "PGTASKD_BATCH_CANCELED",
            _ => continue,
        };
        set(name, count.to_owned());
    }
    if let Some(traceparent) = &job.traceparent {
        set("TRACEPARENT", traceparent.clone());
    }
    env
}

/// The `outcome=count` pairs of a callback's counts (`succeeded=3,failed=0,canceled=1`).
fn batch_counts(counts: &str) -> impl Iterator<Item = (&str, &str)> {
    counts.split(',').filter_map(|pair| pair.split_once('='))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(traceparent: Option<&str>) -> Job {
        Job {
            id: 42,
            attempt: 3,
            queue: "thumbnails".into(),
            token: 9001,
            run: 5,
            key: "0123456789abcdef-42-1765000000000000".into(),
            idempotency_key: None,
            traceparent: traceparent.map(str::to_owned),
            parents: None,
            parent_count: 0,
            progress: None,
            batch: None,
            batch_counts: None,
        }
    }

    fn vars(pairs: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
        pairs
            .iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v)))
            .collect()
    }

    fn get<'a>(env: &'a [(OsString, OsString)], name: &str) -> Vec<&'a OsStr> {
        env.iter()
            .filter(|(k, _)| k == name)
            .map(|(_, v)| v.as_os_str())
            .collect()
    }

    #[test]
    fn secrets_and_settings_are_removed() {
        let daemon = vars(&[
            ("PGPASSWORD", "hunter2"),
            ("PGHOST", "db"),
            ("PGUSER", "u"),
            ("PGDATABASE", "d"),
            ("PGSERVICE", "s"),
            ("PGPASSFILE", "/root/.pgpass"),
            ("PGSSLKEY", "/k"),
            ("PGSSLMODE", "verify-full"),
            ("PGTASKD_DATABASE_URL", "postgres://u:p@db/d"),
            ("PGTASKD_TASK_ID", "forged"),
            ("DATABASE_URL", "postgres://u:p@db/d"),
            ("CREDENTIALS_DIRECTORY", "/run/credentials/pgtaskd.service"),
            ("NOTIFY_SOCKET", "/run/systemd/notify"),
            ("LISTEN_FDS", "1"),
            ("LISTEN_PID", "1"),
            ("LISTEN_FDNAMES", "http"),
            ("WATCHDOG_USEC", "30000000"),
            ("WATCHDOG_PID", "1"),
            ("TRACEPARENT", "00-daemon-trace-01"),
            ("TRACESTATE", "x=y"),
        ]);
        let env = child_env(daemon, &job(None), None, None);
        let names: Vec<_> = env.iter().map(|(k, _)| k.to_str().unwrap()).collect();
        assert_eq!(
            names,
            [
                "PGTASKD_TASK_ID",
                "PGTASKD_TASK_KEY",
                "PGTASKD_ATTEMPT",
                "PGTASKD_RUN",
                "PGTASKD_QUEUE",
                "PGTASKD_CLAIM"
            ]
        );
        assert_eq!(
            get(&env, "PGTASKD_TASK_ID"),
            ["42"],
            "ours, not the forged one"
        );
    }

    #[test]
    fn the_rest_is_kept_in_order() {
        let daemon = vars(&[
            ("PATH", "/usr/bin:/bin"),
            ("HOME", "/var/lib/pgtaskd"),
            ("LANG", "C.UTF-8"),
            ("pgpassword", "lowercase is not libpq's"),
            ("MY_PGHOST", "only a prefix counts"),
            ("TZ", "UTC"),
        ]);
        let env = child_env(daemon.clone(), &job(None), None, None);
        assert_eq!(env[..daemon.len()], daemon[..]);
    }

    #[test]
    fn the_task_is_described() {
        let env = child_env(Vec::new(), &job(Some("00-abc-def-01")), None, None);
        assert_eq!(get(&env, "PGTASKD_TASK_ID"), ["42"]);
        assert_eq!(
            get(&env, "PGTASKD_TASK_KEY"),
            ["0123456789abcdef-42-1765000000000000"]
        );
        assert_eq!(get(&env, "PGTASKD_ATTEMPT"), ["3"]);
        assert_eq!(get(&env, "PGTASKD_RUN"), ["5"]);
        assert_eq!(get(&env, "PGTASKD_QUEUE"), ["thumbnails"]);
        assert_eq!(get(&env, "PGTASKD_CLAIM"), ["9001"]);
        assert_eq!(get(&env, "TRACEPARENT"), ["00-abc-def-01"]);
        assert!(get(&env, "PGTASKD_IDEMPOTENCY_KEY").is_empty());
        let keyed = Job {
            idempotency_key: Some("order 17/ü".into()),
            ..job(None)
        };
        let env = child_env(Vec::new(), &keyed, None, None);
        assert_eq!(get(&env, "PGTASKD_IDEMPOTENCY_KEY"), ["order 17/ü"]);
        assert!(get(&env, "PGTASKD_SCHEDULE").is_empty());
        let fired = Job {
            idempotency_key: Some("schedule:nightly:2026-12-06T03:00:00Z".into()),
            ..job(None)
        };
        let env = child_env(Vec::new(), &fired, None, None);
        assert_eq!(get(&env, "PGTASKD_SCHEDULE"), ["nightly"]);
        assert_eq!(get(&env, "PGTASKD_SCHEDULED_AT"), ["2026-12-06T03:00:00Z"]);
        assert!(get(&env, "PGTASKD_PARENTS").is_empty());
        assert!(get(&env, "PGTASKD_PARENT_COUNT").is_empty());
        let child = Job {
            parents: Some("12=SUCCEEDED,13=FAILED".into()),
            parent_count: 2,
            batch: Some(7),
            batch_counts: Some("succeeded=3,failed=1,canceled=0".to_owned()),
            ..job(None)
        };
        let env = child_env(Vec::new(), &child, None, None);
        assert_eq!(get(&env, "PGTASKD_PARENTS"), ["12=SUCCEEDED,13=FAILED"]);
        assert_eq!(get(&env, "PGTASKD_PARENT_COUNT"), ["2"]);
        assert_eq!(get(&env, "PGTASKD_BATCH"), ["7"]);
        assert_eq!(get(&env, "PGTASKD_BATCH_SUCCEEDED"), ["3"]);
        assert_eq!(get(&env, "PGTASKD_BATCH_FAILED"), ["1"]);
        assert_eq!(get(&env, "PGTASKD_BATCH_CANCELED"), ["0"]);
        assert!(get(&env, "PGTASKD_PROGRESS").is_empty());
        assert!(get(&env, "PGTASKD_PROGRESS_FD").is_empty());
        let resumed = Job {
            progress: Some(r#"{"cursor": 17, "percent": 40}"#.into()),
            ..job(None)
        };
        let env = child_env(Vec::new(), &resumed, None, Some(3));
        assert_eq!(
            get(&env, "PGTASKD_PROGRESS"),
            [r#"{"cursor": 17, "percent": 40}"#]
        );
        assert_eq!(get(&env, "PGTASKD_PROGRESS_FD"), ["3"]);
    }

    #[test]
    fn a_queue_user_gets_its_home_user_and_logname() {
        let daemon = vars(&[
            ("HOME", "/root"),
            ("PATH", "/usr/bin:/bin"),
            ("USER", "root"),
            ("LOGNAME", "root"),
        ]);
        let user = User {
            name: "nobody".into(),
            uid: 65534,
            gid: 65534,
            home: "/nonexistent".into(),
        };
        let env = child_env(daemon.clone(), &job(None), Some(&user), None);
        assert_eq!(get(&env, "HOME"), ["/nonexistent"]);
        assert_eq!(get(&env, "USER"), ["nobody"]);
        assert_eq!(get(&env, "LOGNAME"), ["nobody"]);
        assert_eq!(get(&env, "PATH"), ["/usr/bin:/bin"]);
        let own = child_env(daemon, &job(None), None, None);
        assert_eq!(get(&own, "HOME"), ["/root"], "the daemon's, without a user");
    }

    #[test]
    fn names_that_are_not_utf8_are_filtered_too() {
        use std::os::unix::ffi::OsStringExt;
        let daemon = vec![
            (
                OsString::from_vec(b"PG\xffX".to_vec()),
                OsString::from("secret"),
            ),
            (
                OsString::from_vec(b"K\xff".to_vec()),
                OsString::from("kept"),
            ),
        ];
        let env = child_env(daemon, &job(None), None, None);
        assert_eq!(env[0].0, OsString::from_vec(b"K\xff".to_vec()));
        assert_eq!(env.len(), 7);
    }
}
