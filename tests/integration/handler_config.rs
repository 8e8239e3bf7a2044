//! The `[queues.NAME]` sections as an operator writes them, through the real binary:
//! `check-config` names each mistake with its line and exits 78, prints what it resolved, and
//! warns of a section no served queue uses.

use crate::support::daemon::pgtaskd;
use crate::support::daemon::tempfile_path::TempPath;

async fn check(toml: &str) -> (Option<i32>, String, String) {
    let config = TempPath::write(toml);
    let path = config.path().display().to_string();
    let (status, stdout, stderr) = pgtaskd(None, &["check-config", "--config", &path]).await;
    (status.code(), stdout, stderr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_mistake_in_a_queue_section_is_named_with_its_line() {
    for (toml, said, line) in [
        (
            "[worker]\nqueues = [\"jobs\"]\n[queues.jobs]\nhandler = \"lambda\"\n",
            "queues.jobs.handler is \"lambda\": write \"text-stats\"",
            "line 4",
        ),
        (
            "[worker]\nqueues = [\"jobs\"]\n[queues.jobs]\nhandler = \"exec\"\n",
            "[queues.jobs] has handler = \"exec\" but no command",
            "line 3",
        ),
        (
            "[worker]\nqueues = [\"jobs\"]\n[queues.jobs]\nhandler = \"exec\"\ncommand = [\"/nonexistent/make-thumbnail\"]\n",
            "queues.jobs.command: /nonexistent/make-thumbnail is not an executable file",
            "line 5",
        ),
        (
            "[worker]\nqueues = [\"jobs\"]\n[queues.jobs]\nhandler = \"exec\"\ncommand = [\"sh\"]\nurl = \"http://x/\"\n",
            "queues.jobs.url is for handler = \"http\"",
            "line 6",
        ),
        (
            "[worker]\nqueues = [\"jobs\"]\n[queues.jobs]\nhandler = \"http\"\nurl = \"ftp://example.com/\"\n",
            "is not an http:// or https:// URL",
            "line 5",
        ),
        (
            "[worker]\nqueues = [\"jobs\"]\n[queues.jobs]\nhandler = \"http\"\nurl = \"http://127.0.0.1:1/\"\ncomand = [\"x\"]\n",
            "comand",
            "line 6",
        ),
        (
            "[worker]\nqueues = [\"jobs\"]\n[queues.jobs]\nhandler = \"exec\"\ncommand = [\"sh\"]\nretry_backoff = \"10s\"\nmax_backoff = \"1s\"\n",
            "queues.jobs.max_backoff (1s) is shorter than queues.jobs.retry_backoff (10s)",
            "line 7",
        ),
        (
            "[worker]\nqueues = [\"jobs\"]\n[queues.jobs]\nhandler = \"exec\"\ncommand = [\"sh\"]\nuser = \"no-such-user-x\"\n",
            "queues.jobs.user: there is no user \"no-such-user-x\" on this system",
            "line 6",
        ),
        (
            "[worker]\nqueues = [\"jobs\"]\n[queues.jobs]\nhandler = \"exec\"\ncommand = [\"sh\"]\nuser = \"root\"\ngroup = \"no-such-group-x\"\n",
            "queues.jobs.group: there is no group \"no-such-group-x\" on this system",
            "line 7",
        ),
        (
            "[worker]\nqueues = [\"jobs\"]\n[queues.jobs]\nhandler = \"http\"\nurl = \"http://127.0.0.1:1/\"\nuser = \"nobody\"\n",
            "queues.jobs.user is for handler = \"exec\"",
            "line 6",
        ),
    ] {
        let (code, _, stderr) = check(toml).await;
        assert_eq!(code, Some(78), "{toml}\n{stderr}");
        assert!(stderr.contains(said), "{toml}\nwanted {said:?} in:\n{stderr}");
        assert!(stderr.contains(line), "{toml}\nwanted {line:?} in:\n{stderr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_config_prints_the_sections_and_warns_of_one_no_served_queue_uses() {
    let (code, stdout, stderr) = check(
        "[worker]\nqueues = [\"default\", \"thumbs\"]\n\
         [queues.thumbs]\nhandler = \"exec\"\ncommand = [\"sh\", \"-c\", \"cat\"]\nconcurrency = 2\n\
         [queues.hooks]\nhandler = \"http\"\nurl = \"http://app:pw@127.0.0.1:8080/jobs?key=secret\"\n",
    )
    .await;
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stdout.contains(
            "[queues.thumbs]\nhandler = exec\ncommand = [\"sh\", \"-c\", \"cat\"]\ntimeout = 5m"
        ),
        "{stdout}"
    );
    assert!(stdout.contains("concurrency = 2"), "{stdout}");
    assert!(
        stdout.contains(
            "[queues.hooks]\nhandler = http\nurl = http://127.0.0.1:8080/jobs?...\ntimeout = 30s"
        ),
        "{stdout}"
    );
    assert!(
        !stdout.contains("secret") && !stdout.contains("pw@"),
        "the URL's password and key are printed: {stdout}"
    );
    assert!(stdout.contains("# not served"), "{stdout}");
    assert!(
        stderr.contains("[queues.hooks] is configured but worker.queues"),
        "{stderr}"
    );
}

/// Every mistake of every queue section is named in one run, each with its line
/// (docs/configuration.md: every error is reported): unknown keys, values of the wrong type,
/// values out of range, keys of another handler and a missing command, several in a section.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_mistake_of_every_queue_section_is_named_at_once() {
    let toml = "[worker]\nqueues = [\"a\", \"b\", \"c\", \"d\"]\n\
                [queues.a]\nhandler = \"lambda\"\nconcurrency = 0\n\
                [queues.b]\nhandler = \"exec\"\ncomand = [\"x\"]\nurl = \"http://x/\"\ntimeout = \"0s\"\n\
                [queues.c]\nhandler = \"http\"\nurl = \"ftp://example.com/\"\nkill_after = \"1s\"\n\
                retry_backoff = \"10s\"\nmax_backoff = \"1s\"\n\
                [queues.d]\nhandler = 7\ncommand = \"sh\"\nmax_output = \"lots\"\n";
    let (code, _, stderr) = check(toml).await;
    assert_eq!(code, Some(78), "{stderr}");
    let wanted = [
        ("queues.a.handler is \"lambda\"", "line 4"),
        ("queues.a.concurrency must be at least 1", "line 5"),
        ("comand", "line 8"),
        ("queues.b.url is for handler = \"http\"", "line 9"),
        ("queues.b.timeout must be longer than zero", "line 10"),
        ("[queues.b] has handler = \"exec\" but no command", "line 6"),
        ("is not an http:// or https:// URL", "line 13"),
        ("queues.c.kill_after is for handler = \"exec\"", "line 14"),
        ("queues.c.max_backoff (1s) is shorter", "line 16"),
        ("queues.d.handler", "line 18"),
        ("queues.d.command", "line 19"),
        ("queues.d.max_output", "line 20"),
    ];
    for (said, line) in wanted {
        let found = stderr
            .lines()
            .find(|l| l.contains(said))
            .unwrap_or_else(|| panic!("wanted {said:?} in:\n{stderr}"));
        assert!(
            found.contains(line),
            "wanted {line:?} in {found:?}:\n{stderr}"
        );
    }
    assert_eq!(
        stderr.lines().filter(|l| l.contains(" line ")).count(),
        wanted.len(),
        "one error each, no more:\n{stderr}"
    );
}

/// A queue's program that is missing (a half-done deploy) stops `run` and `check-config`
/// only: the commands that never start it read the same file and work (a hostile review:
/// `status`, `cancel`, `list` and `stats` all exited 78 over it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_program_stops_only_the_commands_that_start_it() {
    let db = crate::support::TestDb::new().await;
    let client = db.client().await;
    let id = crate::support::enqueue(&client, "a few words").await;
    let config = TempPath::write(
        "[worker]\nqueues = [\"default\", \"gone\"]\n\n\
         [queues.gone]\nhandler = \"exec\"\ncommand = [\"/nonexistent/pgtaskd-handler\"]\n\
         user = \"pgtaskd-user-not-yet-created\"\n",
    );
    let path = config.path().display().to_string();
    let id = id.to_string();
    for args in [
        vec!["status", id.as_str()],
        vec!["list"],
        vec!["stats"],
        vec!["cancel", id.as_str()],
    ] {
        let mut all = args.clone();
        all.extend(["--config", path.as_str()]);
        let (status, stdout, stderr) = pgtaskd(Some(&db.url), &all).await;
        assert!(status.success(), "{args:?}: {status:?} {stdout} {stderr}");
    }
    for args in [vec!["check-config"], vec!["run"]] {
        let mut all = args.clone();
        all.extend(["--config", path.as_str()]);
        let (status, _, stderr) = pgtaskd(Some(&db.url), &all).await;
        assert_eq!(status.code(), Some(78), "{args:?}: {stderr}");
        assert!(
            stderr.contains(
                "queues.gone.command: /nonexistent/pgtaskd-handler is not an executable file"
            ) && stderr
                .contains("queues.gone.user: there is no user \"pgtaskd-user-not-yet-created\""),
            "{args:?}: {stderr}"
        );
    }
}

/// The mistakes that used to fail every task instead, named before the first one: a program
/// the children's user may not run, a script it may not read, a `#!` interpreter that does
/// not exist, a URL whose host is missing between its slashes, port 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_would_fail_every_task_is_refused_before_the_first() {
    use std::os::unix::fs::PermissionsExt;
    let scratch = crate::handlers::Scratch::new();
    let script = |name: &str, body: &str, mode: u32| {
        let path = scratch.path(name);
        std::fs::write(&path, body).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        path.display().to_string()
    };
    let private = script("private.sh", "#!/bin/sh\necho hi\n", 0o700);
    let unreadable = script("unreadable.sh", "#!/bin/sh\necho hi\n", 0o711);
    let typo = script("typo.py", "#!/usr/bin/pyhton3\nprint(1)\n", 0o755);
    let exec = |command: &str, extra: &str| {
        format!(
            "[worker]\nqueues = [\"jobs\"]\n[queues.jobs]\nhandler = \"exec\"\n{extra}command = [\"{command}\"]\n"
        )
    };
    let http = |url: &str| {
        format!(
            "[worker]\nqueues = [\"jobs\"]\n[queues.jobs]\nhandler = \"http\"\nurl = \"{url}\"\n"
        )
    };
    for (toml, said, line) in [
        (
            exec(&private, "user = \"nobody\"\n"),
            format!("queues.jobs.command: {private} is not executable by user nobody (uid 65534, gid 65534) (mode 0700, owner uid 0, group gid 0)"),
            "line 6",
        ),
        (
            exec(&unreadable, "user = \"nobody\"\n"),
            format!("queues.jobs.command: {unreadable} is a script, which its interpreter must read, and user nobody"),
            "line 6",
        ),
        (
            exec(&typo, ""),
            format!("queues.jobs.command: {typo} names /usr/bin/pyhton3 on its #! line, which is not an executable file"),
            "line 5",
        ),
        (
            http("http:///jobs"),
            "queues.jobs.url has no host right after \"http://\", and would be read as host \"jobs\"".to_string(),
            "line 5",
        ),
        (
            http("http://127.0.0.1:0/jobs"),
            "queues.jobs.url \"http://127.0.0.1:0/jobs\" has port 0".to_string(),
            "line 5",
        ),
    ] {
        let (code, _, stderr) = check(&toml).await;
        assert_eq!(code, Some(78), "{toml}\n{stderr}");
        assert!(stderr.contains(&said), "{toml}\nwanted {said:?} in:\n{stderr}");
        assert!(stderr.contains(line), "{toml}\nwanted {line:?} in:\n{stderr}");
    }
    // Without `user`, as the daemon's own user: nobody may not run root's 0700 script, root
    // may; `run` refuses it as `check-config` does.
    let toml = exec(&private, "");
    let config = TempPath::write(&toml);
    let path = config.path().display().to_string();
    for command in ["check-config", "run"] {
        let (code, stderr) =
            crate::isolation::pgtaskd_as_nobody(&[command, "--config", &path]).await;
        assert_eq!(code, Some(78), "{command}: {stderr}");
        assert!(
            stderr.contains(&format!(
                "line 5, column 11: queues.jobs.command: {private} is not executable by user nobody"
            )),
            "{command}: {stderr}"
        );
    }
    let (code, _, stderr) = check(&toml).await;
    assert_eq!(code, Some(0), "root runs its own 0700 script: {stderr}");
}
