//! The command line as an operator meets it, through the real binary: `check-config` checks
//! what `run` checks, `--database-url` and its precedence, connection errors that name the
//! server, plain-word configuration errors, completions and the manual page.

use crate::support::daemon::{pgtaskd, tempfile_path::TempPath};
use crate::support::{eventually, DaemonProcess, TestDb, WAIT};

/// Run `pgtaskd ARGS --config FILE` with `toml` as the file.
async fn with_config(toml: &str, args: &[&str]) -> (Option<i32>, String, String) {
    let config = TempPath::write(toml);
    let path = config.path().to_string_lossy().to_string();
    let mut all = args.to_vec();
    all.extend(["--config", &path]);
    let (status, stdout, stderr) = pgtaskd(None, &all).await;
    (status.code(), stdout, stderr)
}

#[tokio::test]
async fn a_log_level_that_is_not_a_filter_exits_78_for_check_config_and_run() {
    for args in [&["check-config"][..], &["run"]] {
        let (code, stdout, stderr) = with_config("[log]\nlevel = \"verbose\"\n", args).await;
        assert_eq!(code, Some(78), "{args:?}: {stderr}");
        assert!(stdout.is_empty(), "{stdout}");
        assert!(stderr.contains("\"verbose\" is not a level"), "{stderr}");
        assert!(stderr.contains("line 2"), "{stderr}");
    }
}

#[tokio::test]
async fn a_rust_log_that_is_not_a_filter_exits_78_for_check_config_and_run() {
    for args in [&["check-config"][..], &["run"]] {
        let output = crate::support::within(
            WAIT,
            "pgtaskd",
            tokio::process::Command::new(crate::support::daemon::binary())
                .args(args)
                .env_remove("PGTASKD_CONFIG")
                .env("RUST_LOG", "garbage===")
                .output(),
        )
        .await
        .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(78), "{args:?}: {stderr}");
        assert!(stderr.contains("RUST_LOG: "), "{stderr}");
    }
}

#[tokio::test]
async fn the_old_name_of_the_vacuum_health_section_still_works_and_says_so() {
    let (code, stdout, stderr) =
        with_config("[health]\ncheck_interval = \"30s\"\n", &["check-config"]).await;
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains("[health] is now called [vacuum_health]"),
        "{stderr}"
    );
    assert!(stdout.contains("[vacuum_health]"), "{stdout}");
    assert!(stdout.contains("check_interval = 30s"), "{stdout}");
}

#[tokio::test]
async fn check_config_names_the_file_or_says_the_defaults_apply_and_prints_every_section() {
    let token = TempPath::write("s3cret\n");
    let toml = format!(
        "[worker]\nqueues = [\"default\", \"mail\"]\n[http]\nlisten = \"127.0.0.1:8080\"\n\
         token_file = \"{}\"\n",
        token.path().display()
    );
    let config = TempPath::write(&toml);
    let path = config.path().to_string_lossy().to_string();
    let (status, stdout, stderr) = pgtaskd(None, &["check-config", "--config", &path]).await;
    assert!(status.success(), "{stderr}");
    assert!(stdout.contains(&format!("file: {path}")), "{stdout}");
    for section in [
        "[database]",
        "[worker]",
        "[shutdown]",
        "[retention]",
        "[http]",
        "[vacuum_health]",
        "[log]",
    ] {
        assert!(stdout.contains(section), "{section}: {stdout}");
    }
    assert!(stdout.contains("queues = default, mail"), "{stdout}");
    assert!(stdout.contains("listen = 127.0.0.1:8080"), "{stdout}");
    assert!(
        !stdout.contains("Unix(") && !stdout.contains("Tcp("),
        "{stdout}"
    );
    assert!(
        !stdout.contains("s3cret"),
        "the token is not printed: {stdout}"
    );

    let output = tokio::process::Command::new(crate::support::daemon::binary())
        .arg("check-config")
        .env_remove("PGTASKD_CONFIG")
        .env("PGTASKD_DATABASE_URL", "postgresql://u@db.example:6543/app")
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("the defaults apply"), "{stdout}");
    assert!(stdout.contains("servers = db.example:6543"), "{stdout}");
}

#[tokio::test]
async fn check_config_refuses_a_token_file_that_cannot_be_read() {
    let (code, stdout, stderr) = with_config(
        "[http]\ntoken_file = \"/nonexistent/token\"\n",
        &["check-config"],
    )
    .await;
    assert_eq!(code, Some(78), "{stderr}");
    assert!(stdout.is_empty(), "{stdout}");
    assert!(
        stderr.contains("cannot read http.token_file /nonexistent/token"),
        "{stderr}"
    );
}

/// A token no client could send (a line break inside, a space, a byte outside visible ASCII)
/// is a configuration error for every command that reads it, never a daemon that answers
/// every request 401 or a probe that panics.
#[tokio::test]
async fn a_token_no_client_could_send_exits_78_for_check_config_run_and_probe() {
    for (token, what) in [
        ("tok\nsecondline\n", "more than one line"),
        ("tok en\n", "white space inside the token"),
        ("tök\n", "outside visible ASCII"),
    ] {
        let file = TempPath::write(token);
        let toml = format!(
            "[http]\nlisten = \"127.0.0.1:1\"\ntoken_file = \"{}\"\n",
            file.path().display()
        );
        for args in [
            &["check-config"][..],
            &["run"],
            &["probe"],
            &["probe", "--ready"],
        ] {
            let (code, _, stderr) = with_config(&toml, args).await;
            assert_eq!(code, Some(78), "{token:?} {args:?}: {stderr}");
            assert!(stderr.contains(what), "{token:?} {args:?}: {stderr}");
            assert!(!stderr.contains("panicked"), "{token:?} {args:?}: {stderr}");
        }
    }
}

#[tokio::test]
async fn check_config_with_connect_checks_the_schema() {
    let db = TestDb::new().await;
    let (status, stdout, stderr) = pgtaskd(Some(&db.url), &["check-config", "--connect"]).await;
    assert!(status.success(), "{stderr}");
    assert!(
        stdout.contains("connected: the pgtaskd schema is at version"),
        "{stdout}"
    );

    let empty = TestDb::empty().await;
    let (status, stdout, stderr) = pgtaskd(Some(&empty.url), &["check-config", "--connect"]).await;
    assert_eq!(status.code(), Some(78), "{stderr}");
    assert!(stdout.is_empty(), "{stdout}");
    assert!(stderr.contains("run `pgtaskd migrate`"), "{stderr}");

    let (status, _, stderr) = pgtaskd(Some(&nowhere()), &["check-config", "--connect"]).await;
    assert_eq!(status.code(), Some(69), "{stderr}");
    assert!(stderr.contains("database unavailable"), "{stderr}");
}

#[tokio::test]
async fn the_database_url_flag_beats_the_environment_which_beats_the_file() {
    let db = TestDb::new().await;
    let file = "[database]\nurl = \"host=127.0.0.1 port=1 user=nobody dbname=nowhere\"\n";
    let config = TempPath::write(file);
    let path = config.path().to_string_lossy().to_string();
    // The environment (the test database) beats the file (port 1).
    let (status, stdout, stderr) = pgtaskd(
        Some(&db.url),
        &["check-config", "--connect", "--config", &path],
    )
    .await;
    assert!(status.success(), "{stderr}");
    assert!(
        stdout.contains("connection string: from PGTASKD_DATABASE_URL"),
        "{stdout}"
    );
    // The flag beats both, after the subcommand as before it.
    for args in [
        &[
            "check-config",
            "--connect",
            "--config",
            &path,
            "--database-url",
            &db.url,
        ][..],
        &[
            "--database-url",
            &db.url,
            "check-config",
            "--connect",
            "--config",
            &path,
        ],
    ] {
        let (status, stdout, stderr) = pgtaskd(Some(&nowhere()), args).await;
        assert!(status.success(), "{args:?}: {stderr}");
        assert!(
            stdout.contains("connection string: from --database-url"),
            "{stdout}"
        );
    }
    // Without either, the file's.
    let (status, stdout, _) = pgtaskd(None, &["check-config", "--config", &path]).await;
    if std::env::var_os("PGTASKD_DATABASE_URL").is_none() {
        assert!(status.success());
        assert!(stdout.contains("servers = 127.0.0.1:1"), "{stdout}");
    }
}

/// A connection string to a loopback port where nothing listens.
fn nowhere() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    format!("host=127.0.0.1 port={port} user=postgres dbname=postgres connect_timeout=2")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_listen_takes_a_host_name() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let toml = format!("[http]\nlisten = \"localhost:{port}\"\n");
    let (code, stdout, stderr) = with_config(&toml, &["check-config"]).await;
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stdout.contains(&format!("listen = localhost:{port} (resolves to ")),
        "{stdout}"
    );

    let db = TestDb::new().await;
    let mut daemon = DaemonProcess::start(&db, &toml, &[]);
    let client = reqwest::Client::new();
    let url = format!("http://localhost:{port}/healthz");
    eventually(WAIT, "/healthz on localhost", || {
        let request = client.get(&url).send();
        async move { request.await.ok().filter(|r| r.status().is_success()) }
    })
    .await;
    daemon.signal(libc::SIGTERM);
    assert!(daemon.wait().await.success(), "{}", daemon.log_text());

    let (code, _, stderr) =
        with_config("[http]\nlisten = \"localhost\"\n", &["check-config"]).await;
    assert_eq!(code, Some(78), "{stderr}");
    assert!(stderr.contains("write HOST:PORT"), "{stderr}");
}

#[tokio::test]
async fn a_connection_error_names_the_host_and_port_as_psql_does() {
    let url = nowhere();
    let port = url
        .split("port=")
        .nth(1)
        .unwrap()
        .split(' ')
        .next()
        .unwrap();
    let (status, _, stderr) = pgtaskd(None, &["status", "1", "--database-url", &url]).await;
    assert_eq!(status.code(), Some(69), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "connection to server at \"127.0.0.1\", port {port} failed: Connection refused"
        )),
        "{stderr}"
    );
}

#[tokio::test]
async fn a_url_of_another_scheme_exits_78_saying_what_is_expected() {
    let (status, stdout, stderr) =
        pgtaskd(Some("mysql://app@db.example/app"), &["status", "1"]).await;
    assert_eq!(status.code(), Some(78), "{stderr}");
    assert!(stdout.is_empty(), "{stdout}");
    assert!(
        stderr.contains("mysql://") && stderr.contains("postgresql://"),
        "{stderr}"
    );
}

#[tokio::test]
async fn completions_and_the_manual_page_need_no_configuration() {
    let broken = TempPath::write("[worker\n");
    let path = broken.path().to_string_lossy().to_string();
    for (shell, needle) in [
        ("bash", "_pgtaskd()"),
        ("zsh", "#compdef pgtaskd"),
        ("fish", "complete -c pgtaskd"),
    ] {
        let (status, stdout, stderr) =
            pgtaskd(None, &["completions", shell, "--config", &path]).await;
        assert!(status.success(), "{shell}: {stderr}");
        assert!(stdout.contains(needle), "{shell}: {stdout}");
        assert!(stdout.contains("check-config"), "{shell}");
    }
    let (status, stdout, stderr) = pgtaskd(None, &["man"]).await;
    assert!(status.success(), "{stderr}");
    assert!(stdout.contains(".TH pgtaskd 1"), "{stdout}");
    assert!(stdout.contains("check\\-config"), "{stdout}");
    let (status, _, _) = pgtaskd(None, &["completions", "tcsh"]).await;
    assert_eq!(status.code(), Some(2));
}

#[tokio::test]
async fn help_names_the_environment_variables_and_the_exit_codes() {
    let (status, stdout, stderr) = pgtaskd(None, &["--help"]).await;
    assert!(status.success(), "{stderr}");
    for needle in [
        "PGTASKD_CONFIG",
        "PGTASKD_DATABASE_URL",
        "PGTASKD_LOG_FORMAT",
        "PGHOST",
        "PGPASSWORD",
        "--database-url",
        "69  database unavailable",
        "78  configuration error",
    ] {
        assert!(stdout.contains(needle), "{needle}: {stdout}");
    }
}

#[tokio::test]
async fn a_value_of_the_wrong_kind_is_named_in_plain_words() {
    for (toml, said) in [
        (
            "[worker]\nconcurrency = \"eight\"\n",
            "worker.concurrency must be a whole number, 1 or more (found \"eight\")",
        ),
        (
            "[worker]\npoll_interval = \"soon\"\n",
            "worker.poll_interval must be a duration in quotes",
        ),
        (
            "[worker]\nlease = 30\n",
            "worker.lease must be a duration in quotes",
        ),
    ] {
        let (code, _, stderr) = with_config(toml, &["check-config"]).await;
        assert_eq!(code, Some(78), "{stderr}");
        assert!(stderr.contains(said), "{stderr}");
        assert!(stderr.contains("line 2"), "{stderr}");
        assert!(!stderr.contains("expected usize") && !stderr.contains("expected number"));
    }
}
