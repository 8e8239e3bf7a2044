//! Settings without a file, through the real binary: `PGTASKD_<SECTION>_<KEY>` variables
//! beat the file and the flags of `run` and `check-config` beat the variables, for keys of
//! every kind; a variable that does not parse exits 78 naming it; `check-config` prints where
//! each value came from; every error of a file is reported with its line; and `run` with no
//! file at all serves `/healthz` on the address of `--http-listen`.

use std::process::Stdio;

use crate::support::daemon::{binary, tempfile_path::TempPath};
use crate::support::{eventually, within, DaemonProcess, TestDb, WAIT};

/// Run `pgtaskd ARGS` with the variables `env` and none of the caller's `PGTASKD_*`, to
/// completion: (exit code, stdout, stderr).
async fn pgtaskd_env(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let mut command = tokio::process::Command::new(binary());
    command.args(args).stdin(Stdio::null());
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("PGTASKD_") {
            command.env_remove(name);
        }
    }
    command.envs(env.iter().copied());
    let output = within(WAIT, &format!("pgtaskd {args:?}"), command.output())
        .await
        .expect("pgtaskd runs");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// The line of `stdout` that starts with `key = `.
fn line<'a>(stdout: &'a str, key: &str) -> &'a str {
    stdout
        .lines()
        .find(|l| l.starts_with(&format!("{key} = ")))
        .unwrap_or_else(|| panic!("no line for {key}:\n{stdout}"))
}

const FILE: &str = "[worker]\nconcurrency = 2\nlease = \"10s\"\nqueues = [\"a\"]\n\
    [http]\nlisten = \"127.0.0.1:1\"\n";

/// An integer, a duration, a list and an address.
const ENV: [(&str, &str); 4] = [
    ("PGTASKD_WORKER_CONCURRENCY", "4"),
    ("PGTASKD_WORKER_LEASE", "1m"),
    ("PGTASKD_WORKER_QUEUES", "mail,sms"),
    ("PGTASKD_HTTP_LISTEN", "127.0.0.1:2"),
];

#[tokio::test]
async fn a_variable_beats_the_file_and_a_flag_beats_the_variable() {
    let file = TempPath::write(FILE);
    let path = file.path().to_string_lossy().to_string();
    let (code, stdout, stderr) = pgtaskd_env(&["check-config", "--config", &path], &ENV).await;
    assert_eq!(code, Some(0), "{stderr}");
    for (key, want) in [
        (
            "concurrency",
            "concurrency = 4  # from PGTASKD_WORKER_CONCURRENCY",
        ),
        ("lease", "lease = 1m  # from PGTASKD_WORKER_LEASE"),
        ("queues", "queues = mail, sms  # from PGTASKD_WORKER_QUEUES"),
        ("listen", "listen = 127.0.0.1:2  # from PGTASKD_HTTP_LISTEN"),
    ] {
        assert_eq!(line(&stdout, key), want, "{stdout}");
    }

    let flags = [
        "check-config",
        "--config",
        &path,
        "--concurrency",
        "6",
        "--queues",
        "x,y",
        "--http-listen",
        "127.0.0.1:3",
    ];
    let (code, stdout, stderr) = pgtaskd_env(&flags, &ENV).await;
    assert_eq!(code, Some(0), "{stderr}");
    for (key, want) in [
        ("concurrency", "concurrency = 6  # from --concurrency"),
        ("lease", "lease = 1m  # from PGTASKD_WORKER_LEASE"),
        ("queues", "queues = x, y  # from --queues"),
        ("listen", "listen = 127.0.0.1:3  # from --http-listen"),
    ] {
        assert_eq!(line(&stdout, key), want, "{stdout}");
    }
}

#[tokio::test]
async fn check_config_prints_where_each_value_came_from() {
    let file = TempPath::write(FILE);
    let path = file.path().to_string_lossy().to_string();
    let (code, stdout, stderr) = pgtaskd_env(
        &[
            "check-config",
            "--config",
            &path,
            "--http-listen",
            "127.0.0.1:3",
        ],
        &[
            ("PGTASKD_WORKER_LEASE", "1m"),
            ("PGTASKD_WORKER_CONCURENCY", "9"),
        ],
    )
    .await;
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(
        line(&stdout, "concurrency"),
        format!("concurrency = 2  # from {path}:2")
    );
    assert_eq!(
        line(&stdout, "queues"),
        format!("queues = a  # from {path}:4")
    );
    assert_eq!(
        line(&stdout, "lease"),
        "lease = 1m  # from PGTASKD_WORKER_LEASE"
    );
    assert_eq!(
        line(&stdout, "listen"),
        "listen = 127.0.0.1:3  # from --http-listen"
    );
    assert_eq!(line(&stdout, "grace"), "grace = 20s  # default");
    assert_eq!(line(&stdout, "level"), "level = info  # default");
    // Every value printed says where it came from.
    for key in [
        "pool_size",
        "statement_timeout",
        "poll_interval",
        "max_payload_bytes",
        "finished_after",
        "token_file",
        "max_connections",
        "header_timeout",
        "check_interval",
        "xmin_horizon_warning",
        "format",
    ] {
        assert!(
            line(&stdout, key).ends_with("  # default"),
            "{key}: {stdout}"
        );
    }
    // The misspelt variable is a warning, not an error.
    assert!(
        stderr.contains("PGTASKD_WORKER_CONCURENCY names no setting of [worker]"),
        "{stderr}"
    );
}

#[tokio::test]
async fn a_variable_that_does_not_parse_exits_78_naming_it_and_its_value() {
    for (name, value, said) in [
        (
            "PGTASKD_WORKER_LEASE",
            "soon",
            "worker.lease must be a duration",
        ),
        (
            "PGTASKD_WORKER_CONCURRENCY",
            "eight",
            "worker.concurrency must be a whole number",
        ),
        (
            "PGTASKD_HTTP_LISTEN",
            "nowhere",
            "http.listen \"nowhere\" is not an address and port",
        ),
    ] {
        for command in ["check-config", "run"] {
            let (code, stdout, stderr) = pgtaskd_env(&[command], &[(name, value)]).await;
            assert_eq!(code, Some(78), "{command} {name}: {stderr}");
            assert!(stdout.is_empty(), "{stdout}");
            assert!(
                stderr.contains(&format!("{name}={value:?}: {said}")),
                "{command} {name}: {stderr}"
            );
        }
    }
}

#[tokio::test]
async fn a_file_with_three_errors_reports_all_three_with_their_lines() {
    let file = TempPath::write(
        "[worker]\nconcurrency = \"eight\"\nlease = \"0s\"\n[http]\nlisten = \"nowhere\"\n",
    );
    let path = file.path().to_string_lossy().to_string();
    for command in ["check-config", "run"] {
        let (code, stdout, stderr) = pgtaskd_env(&[command, "--config", &path], &[]).await;
        assert_eq!(code, Some(78), "{command}: {stderr}");
        assert!(stdout.is_empty(), "{stdout}");
        assert!(stderr.contains("3 errors:"), "{command}: {stderr}");
        for (line, said) in [
            (2, "worker.concurrency must be a whole number, 1 or more"),
            (3, "worker.lease must be longer than zero"),
            (5, "http.listen \"nowhere\" is not an address and port"),
        ] {
            let at = format!("{path}: line {line}, ");
            assert!(
                stderr.lines().any(|l| l.contains(&at) && l.contains(said)),
                "{command}: no {at}... {said}:\n{stderr}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_without_a_file_serves_healthz_on_the_address_of_the_flag() {
    let db = TestDb::new().await;
    let mut daemon = DaemonProcess::start_without_file(
        &db.url,
        &["--http-listen", "127.0.0.1:0", "--concurrency", "5"],
        &[
            ("PGTASKD_WORKER_CONCURRENCY", "3"),
            ("PGTASKD_WORKER_QUEUES", "default,mail"),
            ("PGTASKD_SHUTDOWN_GRACE", "2s"),
        ],
    );
    let addr = daemon.http_addr().await;
    let log = daemon.log_text();
    assert!(addr.starts_with("127.0.0.1:"), "{addr}");
    assert!(
        log.contains("concurrency=5") && log.contains("queues=[\"default\", \"mail\"]"),
        "{log}"
    );
    let client = reqwest::Client::new();
    let url = format!("http://{addr}/healthz");
    eventually(WAIT, "/healthz", || {
        let request = client.get(&url).send();
        async move { request.await.ok().filter(|r| r.status().is_success()) }
    })
    .await;
    daemon.signal(libc::SIGTERM);
    assert!(daemon.wait().await.success(), "{}", daemon.log_text());
}

/// A queue named twice in `worker.queues`, from the file, a variable or a flag, is served
/// once: the repeat is dropped, with a warning naming it.
#[tokio::test]
async fn a_queue_named_twice_is_served_once_with_a_warning() {
    let file = TempPath::write("[worker]\nqueues = [\"a\", \"b\", \"a\"]\n");
    let path = file.path().to_string_lossy().to_string();
    for (args, env, want) in [
        (
            vec!["check-config", "--config", &path],
            vec![],
            format!("queues = a, b  # from {path}:2"),
        ),
        (
            vec!["check-config", "--config", &path],
            vec![("PGTASKD_WORKER_QUEUES", "mail,mail,sms")],
            "queues = mail, sms  # from PGTASKD_WORKER_QUEUES".to_string(),
        ),
        (
            vec![
                "check-config",
                "--config",
                &path,
                "--queues",
                "shell,shell,default,shell",
            ],
            vec![],
            "queues = shell, default  # from --queues".to_string(),
        ),
    ] {
        let (code, stdout, stderr) = pgtaskd_env(&args, &env).await;
        assert_eq!(code, Some(0), "{args:?} {env:?}: {stderr}");
        assert_eq!(line(&stdout, "queues"), want, "{stdout}");
        let repeated = want
            .split_once(" = ")
            .and_then(|(_, rest)| rest.split(',').next())
            .unwrap()
            .trim();
        assert!(
            stderr.contains(&format!(
                "worker.queues names {repeated:?} more than once; each queue is served once"
            )),
            "{args:?} {env:?}: {stderr}"
        );
    }
}
