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
         [queues.gone]\nhandler = \"exec\"\ncommand = [\"/nonexistent/pgtaskd-handler\"]\n",
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
            ),
            "{args:?}: {stderr}"
        );
    }
}
