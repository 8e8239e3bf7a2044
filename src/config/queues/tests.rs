//! Unit tests of the `[queues.NAME]` sections (`queues.rs`): backoff, fingerprints, URLs.

use super::*;

fn queue(backoff: u64, cap: u64) -> QueueConfig {
    QueueConfig {
        name: "q".into(),
        handler: HandlerConfig::TextStats,
        concurrency: None,
        retry_backoff: Duration::from_secs(backoff),
        max_backoff: Duration::from_secs(cap),
    }
}

#[test]
fn the_backoff_doubles_per_attempt_under_its_cap_with_full_jitter() {
    let q = queue(1, 10);
    for (attempt, ceiling) in [(1, 1), (2, 2), (3, 4), (4, 8), (5, 10), (40, 10)] {
        let drawn: Vec<Duration> = (0..200).map(|_| q.backoff(attempt, None)).collect();
        let ceiling = Duration::from_secs(ceiling);
        assert!(drawn.iter().all(|d| *d <= ceiling), "attempt {attempt}");
        // Full jitter: some draws fall in the lower half.
        assert!(drawn.iter().any(|d| *d < ceiling / 2), "attempt {attempt}");
    }
}

#[test]
fn a_retry_after_is_taken_as_given_up_to_the_cap() {
    let q = queue(1, 10);
    assert_eq!(
        q.backoff(1, Some(Duration::from_secs(7))),
        Duration::from_secs(7)
    );
    assert_eq!(
        q.backoff(1, Some(Duration::from_secs(70))),
        Duration::from_secs(10)
    );
}

#[test]
fn fingerprints_name_the_handler_and_hash_its_command_or_url() {
    let exec = |command: &[&str]| {
        HandlerConfig::Exec(ExecSpec {
            command: command.iter().map(|part| part.to_string()).collect(),
            timeout: Duration::from_secs(1),
            kill_after: Duration::from_secs(1),
            max_output: 1,
        })
        .fingerprint()
    };
    assert_eq!(HandlerConfig::TextStats.fingerprint(), "text-stats");
    let cat = exec(&["cat"]);
    assert!(cat.starts_with("exec:") && cat.len() == 13, "{cat}");
    assert_eq!(cat, exec(&["cat"]), "the same section, the same text");
    assert_ne!(
        exec(&["wc", "-c"]),
        exec(&["wc -c"]),
        "arguments are kept apart"
    );
    // Fixed across builds and versions: 64-bit FNV-1a of "cat", its halves xored.
    assert_eq!(cat, "exec:f907a43e");
}

#[test]
fn a_url_must_be_absolute_http_or_https() {
    assert!(check_url("http://127.0.0.1:8080/jobs", "k").is_ok());
    assert!(check_url("https://example.com/x", "k").is_ok());
    assert!(check_url("ftp://example.com/x", "k").is_err());
    assert!(check_url("/jobs", "k").is_err());
    assert!(check_url("not a url", "k").is_err());
    // What the handler's client would refuse at every task.
    let port = check_url("http://127.0.0.1:99999/x", "k").unwrap_err();
    assert!(port.contains("invalid port"), "{port}");
    // Credentials are not shown.
    let shown = check_url("ftp://alice:secret@example.com/x", "k").unwrap_err();
    assert!(!shown.contains("secret"), "{shown}");
}

#[test]
fn a_program_is_looked_up_as_given_or_on_path() {
    assert!(check_program(&["sh".into()], "k", true).is_ok());
    assert!(check_program(&["/bin/sh".into(), "-c".into()], "k", true).is_ok());
    assert!(check_program(&["/nonexistent/prog".into()], "k", true).is_err());
    let plain = std::env::temp_dir().join(format!("pgtaskd-not-executable-{}", std::process::id()));
    std::fs::write(&plain, "not a program").unwrap();
    let refused = check_program(&[plain.display().to_string()], "k", true);
    std::fs::remove_file(&plain).unwrap();
    assert!(refused.is_err());
    assert!(check_program(&[], "k", true).is_err());
    // For the commands that never start it: named, not looked up.
    assert!(check_program(&["/nonexistent/prog".into()], "k", false).is_ok());
    assert!(check_program(&[], "k", false).is_err());
    let nul = check_program(&["/bin/echo".into(), "a\0b".into()], "k", false).unwrap_err();
    assert!(nul.contains("NUL character (in word 2)"), "{nul}");
}

#[test]
fn a_queue_name_is_shown_as_a_toml_key_bare_or_quoted_and_escaped() {
    use super::toml_key;
    assert_eq!(toml_key("mail"), "mail");
    assert_eq!(toml_key("mail_out-2"), "mail_out-2");
    assert_eq!(toml_key("mail.out"), "\"mail.out\"");
    assert_eq!(toml_key("a b"), "\"a b\"");
    let shown = toml_key("evil\u{1b}[31m\n");
    assert!(!shown.chars().any(char::is_control), "{shown:?}");
    // What is shown parses back to the name.
    let table: toml::Table = format!("{shown} = 1").parse().unwrap();
    assert!(table.contains_key("evil\u{1b}[31m\n"), "{table:?}");
}
