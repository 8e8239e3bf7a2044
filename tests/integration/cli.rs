//! The command line's outputs and exit codes (docs/design.md, "Command line"), through the real binary.

use crate::support::daemon::{pgtaskd, tempfile_path::TempPath};
use crate::support::{nowhere, TestDb};

#[tokio::test]
async fn enqueue_then_status_prints_the_row_as_text_and_json() {
    let db = TestDb::new().await;
    let (status, stdout, stderr) = pgtaskd(Some(&db.url), &["enqueue", "hello world"]).await;
    assert!(status.success(), "{stderr}");
    let id: i64 = stdout.trim().parse().expect("enqueue prints the id");

    let (status, stdout, _) = pgtaskd(Some(&db.url), &["status", &id.to_string()]).await;
    assert!(status.success());
    assert!(
        stdout.starts_with(&format!("task {id}: QUEUED")),
        "{stdout}"
    );
    assert!(stdout.contains("attempt: 0/3"), "{stdout}");

    let (status, stdout, _) = pgtaskd(Some(&db.url), &["status", &id.to_string(), "--json"]).await;
    assert!(status.success());
    let json: serde_json::Value = serde_json::from_str(&stdout).expect("status --json prints JSON");
    assert_eq!(json["id"], id);
    assert_eq!(json["status"], "QUEUED");
    assert_eq!(json["payload"], "hello world");
    assert_eq!(json["words"], 0);
}

#[tokio::test]
async fn enqueue_reads_a_file_or_standard_input() {
    let db = TestDb::new().await;
    let file = TempPath::write("from a file");
    let (status, stdout, _) = pgtaskd(
        Some(&db.url),
        &["enqueue", "--file", &file.path().to_string_lossy()],
    )
    .await;
    assert!(status.success());
    let from_file: i64 = stdout.trim().parse().unwrap();

    let mut command = tokio::process::Command::new(crate::support::daemon::binary());
    command
        .args(["enqueue", "-"])
        .env("PGTASKD_DATABASE_URL", &db.url)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped());
    let mut child = command.spawn().unwrap();
    {
        use tokio::io::AsyncWriteExt;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all("from stdin ü".as_bytes()).await.unwrap();
    }
    let output =
        crate::support::within(crate::support::WAIT, "enqueue -", child.wait_with_output())
            .await
            .unwrap();
    assert!(output.status.success());
    let from_stdin: i64 = String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .unwrap();

    let client = db.client().await;
    for (id, want) in [(from_file, "from a file"), (from_stdin, "from stdin ü")] {
        let row = client
            .query_one(
                "SELECT payload FROM pgtaskd.task_view WHERE id = $1",
                &[&id],
            )
            .await
            .unwrap();
        assert_eq!(row.get::<_, &str>(0), want);
    }
}

#[tokio::test]
async fn status_of_a_missing_task_exits_3() {
    let db = TestDb::new().await;
    let (status, stdout, stderr) = pgtaskd(Some(&db.url), &["status", "987654"]).await;
    assert_eq!(status.code(), Some(3), "{stderr}");
    assert!(stdout.is_empty());
    assert!(stderr.contains("no such task: 987654"), "{stderr}");
}

#[tokio::test]
async fn status_and_cancel_with_the_database_down_exit_69_not_3() {
    let url = nowhere();
    for args in [
        &["status", "1"][..],
        &["cancel", "1"],
        &["enqueue", "x"],
        &["migrate"],
    ] {
        let (status, stdout, stderr) = pgtaskd(Some(&url), args).await;
        assert_eq!(status.code(), Some(69), "{args:?}: {stderr}");
        assert!(stdout.is_empty(), "{args:?}");
        assert!(
            stderr.contains("database unavailable"),
            "{args:?}: {stderr}"
        );
        assert!(!stderr.contains("no such task"), "{args:?}: {stderr}");
    }
}

#[tokio::test]
async fn cancel_reports_canceled_then_terminal_and_unknown_ids() {
    let db = TestDb::new().await;
    let (_, stdout, _) = pgtaskd(Some(&db.url), &["enqueue", "cancel me"]).await;
    let id = stdout.trim().to_string();
    let (status, stdout, _) = pgtaskd(Some(&db.url), &["cancel", &id]).await;
    assert!(status.success());
    assert_eq!(stdout.trim(), "CANCELED");
    let (status, stdout, stderr) = pgtaskd(Some(&db.url), &["cancel", &id]).await;
    assert_eq!(status.code(), Some(4), "{stderr}");
    assert!(stdout.is_empty());
    assert!(stderr.contains("already CANCELED"), "{stderr}");
    let (status, _, _) = pgtaskd(Some(&db.url), &["cancel", "55555"]).await;
    assert_eq!(status.code(), Some(3));
}

#[tokio::test]
async fn an_unknown_config_key_exits_78_naming_the_key_and_line() {
    let config = TempPath::write("[worker]\nconcurrency = 4\npoll_intervall = \"1s\"\n");
    let path = config.path().to_string_lossy().to_string();
    for args in [
        &["check-config", "--config", &path][..],
        &["run", "--config", &path],
        &["status", "1", "--config", &path],
    ] {
        let (status, stdout, stderr) = pgtaskd(None, args).await;
        assert_eq!(status.code(), Some(78), "{args:?}: {stderr}");
        assert!(stdout.is_empty());
        assert!(stderr.contains("poll_intervall"), "{stderr}");
        assert!(stderr.contains("line 3"), "{stderr}");
    }
}

#[tokio::test]
async fn the_config_file_can_be_named_by_pgtaskd_config() {
    let config = TempPath::write("[worker]\nconcurrency = 0\n");
    let output = tokio::process::Command::new(crate::support::daemon::binary())
        .arg("check-config")
        .env("PGTASKD_CONFIG", config.path())
        .output()
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(78));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("worker.concurrency must be at least 1"),
        "{stderr}"
    );
    assert!(stderr.contains("line 2"), "{stderr}");
}

#[tokio::test]
async fn check_config_accepts_the_example_file() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/pgtaskd.example.toml");
    let (status, stdout, stderr) = pgtaskd(None, &["check-config", "--config", example]).await;
    assert!(status.success(), "{stderr}");
    assert!(stdout.contains("configuration is valid"), "{stdout}");
}

#[tokio::test]
async fn a_missing_config_file_exits_78() {
    let (status, _, stderr) = pgtaskd(
        None,
        &["check-config", "--config", "/nonexistent/pgtaskd.toml"],
    )
    .await;
    assert_eq!(status.code(), Some(78));
    assert!(stderr.contains("/nonexistent/pgtaskd.toml"), "{stderr}");
}

#[tokio::test]
async fn usage_errors_exit_2_with_nothing_on_stdout() {
    for args in [
        &["status", "abc"][..],
        &["status"],
        &["frobnicate"],
        &["enqueue"],
        &["enqueue", "x", "--file", "y"],
    ] {
        let (status, stdout, stderr) = pgtaskd(None, args).await;
        assert_eq!(status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stdout.is_empty(), "{args:?}: {stdout}");
        assert!(!stderr.is_empty(), "{args:?}");
    }
}

/// A producer may schedule a task at `infinity`, `-infinity` or past the last year the
/// program's clock type holds: reading such a row (status, list; the HTTP API reads it the
/// same way) answers, with the time shown at the nearest end of that range, not a panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_scheduled_at_infinity_or_past_year_262142_are_shown_not_fatal() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let mut ids = Vec::new();
    for run_at in ["infinity", "-infinity", "290000-01-01"] {
        let id: i64 = client
            .query_one(
                "INSERT INTO pgtaskd.tasks (payload, run_at) VALUES ('far', $1::text::timestamptz) RETURNING id",
                &[&run_at],
            )
            .await
            .unwrap()
            .get(0);
        ids.push(id);
    }
    for (id, shown) in ids
        .iter()
        .zip(["262142-01-01", "-4712-01-01", "262142-01-01"])
    {
        let (status, stdout, stderr) =
            pgtaskd(Some(&db.url), &["status", &id.to_string(), "--json"]).await;
        assert_eq!(status.code(), Some(0), "status {id}: {stdout}{stderr}");
        assert!(stdout.contains(shown), "status {id}: {stdout}");
    }
    let (status, stdout, stderr) = pgtaskd(Some(&db.url), &["list"]).await;
    assert_eq!(status.code(), Some(0), "list: {stdout}{stderr}");
    assert_eq!(
        stdout.matches("far").count(),
        0,
        "payloads are not listed: {stdout}"
    );
    assert_eq!(
        stdout
            .lines()
            .filter(|line| line.contains("QUEUED"))
            .count(),
        3,
        "{stdout}"
    );
}

/// A reader that goes away before the command writes (`| head`, a closed pipe) ends the
/// command quietly with status 0, its change made; a full disk is one line and status 1.
#[tokio::test]
async fn a_closed_pipe_or_a_full_disk_ends_a_command_without_a_panic() {
    let db = TestDb::new().await;
    let bin = crate::support::daemon::binary();
    let script = format!(
        "{{ sleep 0.5; '{bin}' --database-url \"$URL\" enqueue 'into a closed pipe'; echo $? >&2; }} | true",
        bin = bin.display()
    );
    let run = |script: String| {
        let url = db.url.clone();
        async move {
            tokio::time::timeout(
                std::time::Duration::from_secs(30),
                tokio::process::Command::new("sh")
                    .arg("-c")
                    .arg(script)
                    .env("URL", url)
                    .output(),
            )
            .await
            .expect("the command ends")
            .unwrap()
        }
    };
    let output = run(script).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.trim(), "0", "{stderr}");
    let client = db.client().await;
    let made: i64 = client
        .query_one(
            "SELECT count(*) FROM pgtaskd.task_view WHERE payload = 'into a closed pipe'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(made, 1, "the enqueue committed");

    let script = format!(
        "'{bin}' --database-url \"$URL\" status 1 > /dev/full; echo $? >&2",
        bin = bin.display()
    );
    let output = run(script).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(stderr.contains("No space left on device"), "{stderr}");
    assert_eq!(stderr.lines().last(), Some("1"), "{stderr}");
}

/// The CLI refuses what the HTTP API refuses, with the same words, before it connects: a NUL
/// in the payload, an empty or over-long idempotency key, an empty queue. Exit 2, nothing
/// written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_refuses_what_http_refuses_with_the_same_words() {
    let db = TestDb::new().await;
    let port = crate::support::free_port();
    let config = db.config(&format!("[http]\nlisten = \"127.0.0.1:{port}\"\n"));
    let daemon = crate::support::InProcessDaemon::start(
        &db,
        config,
        crate::support::GatedAnalyzer::counting(),
    )
    .await;
    let nul = TempPath::write("nul \u{0} inside");
    let nul_path = nul.path().to_string_lossy().into_owned();
    let long_key = "k".repeat(300);
    let payload_nul = "the payload contains a NUL character, which PostgreSQL text cannot hold";
    let bad_key = "the idempotency key must be 1 to 255 visible ASCII characters";
    let no_queue = "the queue name is empty";
    let http = reqwest::Client::new();
    let url = format!("http://127.0.0.1:{port}/tasks");
    let text = |body: &str| {
        http.post(&url)
            .header("content-type", "text/plain")
            .body(body.to_string())
    };
    let cases: Vec<(Vec<&str>, reqwest::RequestBuilder, &str)> = vec![
        (
            vec!["enqueue", "--file", &nul_path],
            text("nul \u{0} inside"),
            payload_nul,
        ),
        (
            vec!["enqueue", "x", "--key", ""],
            text("x").header("idempotency-key", ""),
            bad_key,
        ),
        (
            vec!["enqueue", "x", "--key", &long_key],
            text("x").header("idempotency-key", &long_key),
            bad_key,
        ),
        (
            vec!["enqueue", "x", "--queue", ""],
            http.post(&url)
                .header("content-type", "application/json")
                .body(r#"{"payload": "x", "queue": ""}"#),
            no_queue,
        ),
    ];
    for (args, request, words) in cases {
        let (status, stdout, stderr) = pgtaskd(Some(&db.url), &args).await;
        assert_eq!(status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stdout.is_empty(), "{stdout}");
        assert!(stderr.contains(words), "{args:?}: {stderr}");
        let response = crate::support::within(crate::support::WAIT, "a response", request.send())
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 400, "{args:?}");
        let body: serde_json::Value =
            crate::support::within(crate::support::WAIT, "a body", response.json())
                .await
                .unwrap();
        assert_eq!(body, serde_json::json!({ "error": words }), "{args:?}");
    }
    let client = db.client().await;
    let tasks: i64 = client
        .query_one("SELECT count(*) FROM pgtaskd.task_view", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(tasks, 0, "nothing was written");
    daemon.stop().await;
}

/// `/dev/zero` as the configuration was read until the OOM killer came: the read stops past
/// 1 MiB, and every command that reads a configuration exits 78 naming the file and the limit.
#[tokio::test]
async fn a_config_file_over_one_mebibyte_exits_78_naming_the_file_and_the_limit() {
    for args in [
        &["check-config", "--config", "/dev/zero"][..],
        &["run", "--config", "/dev/zero"],
        &["status", "1", "--config", "/dev/zero"],
    ] {
        let (status, stdout, stderr) = pgtaskd(None, args).await;
        assert_eq!(status.code(), Some(78), "{args:?}: {stderr}");
        assert!(stdout.is_empty());
        assert!(
            stderr.contains("config file /dev/zero is larger than 1048576 bytes (1 MiB)"),
            "{stderr}"
        );
    }
}

/// PostgreSQL takes a timeout of at most INT_MAX milliseconds: a longer statement_timeout
/// used to pass check-config, and `run` then retried the refused sessions forever.
#[tokio::test]
async fn a_statement_timeout_postgresql_refuses_exits_78_naming_the_key_and_line() {
    let config = TempPath::write("[database]\nstatement_timeout = \"30days\"\n");
    let path = config.path().to_string_lossy().to_string();
    for args in [
        &["check-config", "--config", &path][..],
        &["run", "--config", &path],
    ] {
        let (status, _, stderr) = pgtaskd(Some(&nowhere()), args).await;
        assert_eq!(status.code(), Some(78), "{args:?}: {stderr}");
        assert!(
            stderr.contains("line 2") && stderr.contains("database.statement_timeout is 30days"),
            "{stderr}"
        );
    }
}

/// A `--database-url` whose port is served by something else (here an HTTP server, which
/// answers the startup message with a 400) is named as such, not as "bytes remaining on
/// stream"; it is still an outage (69), never "no such task". The server answers one
/// connection at a time, as a test double may.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_that_does_not_speak_postgresql_is_named_as_such() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            let mut request = [0u8; 1024];
            let _ = stream.read(&mut request).await;
            let _ = stream
                .write_all(
                    b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                )
                .await;
            // Half-close, and read what the client still sends (a startup message after the
            // answer to its TLS request), so that it sees the end of the stream, not a reset.
            let _ = stream.shutdown().await;
            while matches!(stream.read(&mut request).await, Ok(n) if n > 0) {}
        }
    });
    for sslmode in ["disable", "prefer"] {
        let url = format!("postgresql://pgtaskd@127.0.0.1:{port}/pgtaskd?sslmode={sslmode}");
        let (status, stdout, stderr) =
            pgtaskd(None, &["--database-url", &url, "status", "1"]).await;
        assert_eq!(status.code(), Some(69), "{sslmode}: {stderr}");
        assert!(stdout.is_empty());
        assert!(
            stderr.contains(&format!(
                "port {port} failed: the server there does not speak the PostgreSQL protocol"
            )),
            "{sslmode}: {stderr}"
        );
    }
    server.abort();
}

/// `list` with nothing to show prints no table (a header alone read as a failure) and says on
/// standard error what it looked for; `--json` prints nothing at all.
#[tokio::test]
async fn an_empty_list_says_so_and_names_its_filters() {
    let db = TestDb::new().await;
    let (status, stdout, stderr) = pgtaskd(
        Some(&db.url),
        &["list", "--queue", "nothing-here", "--status", "failed"],
    )
    .await;
    assert_eq!(status.code(), Some(0), "{stdout}{stderr}");
    assert_eq!(stdout, "", "no table");
    assert_eq!(stderr.trim(), "no tasks FAILED in queue nothing-here");
    let (status, stdout, stderr) = pgtaskd(Some(&db.url), &["list", "--json"]).await;
    assert_eq!(status.code(), Some(0), "{stdout}{stderr}");
    assert_eq!(stdout, "", "{stderr}");
}
