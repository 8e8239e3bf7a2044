//! Unit tests of the `[queues.NAME]` sections (`queues.rs`): backoff, fingerprints, URLs, and
//! the checks of a program as the user its child runs as.

use super::preflight::interpreter;
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
            run_as: None,
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
fn a_url_must_name_its_host_between_the_slashes_and_a_port_above_0() {
    // The parser reads each of these as host `x`, the path's first word.
    for url in [
        "http:///x",
        "https:///x/y",
        "http:x",
        "http:/x",
        "http://\\x",
        "http:\\\\x",
    ] {
        let said = check_url(url, "queues.q.url").unwrap_err();
        assert!(
            said.contains("has no host right after") && said.contains("read as host \"x\""),
            "{url}: {said}"
        );
    }
    let said = check_url("http://127.0.0.1:0/jobs", "queues.q.url").unwrap_err();
    assert!(said.contains("has port 0"), "{said}");
    assert!(check_url("HTTP://example.com:8080/x", "k").is_ok());
    assert!(check_url("http://[::1]:1/x", "k").is_ok());
}

/// A file of `body` with `mode`, in a directory of its own (mode 0755), owned by this
/// process's user (root, as the tests run).
struct Made(std::path::PathBuf);

impl Made {
    fn new(name: &str, body: &[u8], mode: u32) -> Made {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!(
            "pgtaskd-queue-check-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, body).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        Made(path)
    }

    fn command(&self) -> Vec<String> {
        vec![self.0.display().to_string()]
    }

    fn dir_mode(&self, mode: u32) {
        use std::os::unix::fs::PermissionsExt;
        let dir = self.0.parent().unwrap();
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode)).unwrap();
    }
}

impl Drop for Made {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(self.0.parent().unwrap());
    }
}

#[test]
fn a_program_is_checked_as_the_user_its_child_runs_as() {
    use std::os::unix::fs::MetadataExt;
    let me = Identity::current();
    let made = Made::new("tool.sh", b"#!/bin/sh\necho hi\n", 0o700);
    let owner = std::fs::metadata(&made.0).unwrap().uid();
    // Someone who neither owns the file nor is in its group.
    let other = Identity {
        uid: owner.wrapping_add(12345),
        gid: 54321,
        groups: vec![54321],
    };
    assert!(check_program(&made.command(), "k", Some(&me)).is_ok());
    let said = check_program(&made.command(), "queues.q.command", Some(&other)).unwrap_err();
    assert!(
        said.starts_with("queues.q.command: ")
            && said.contains("is not executable by")
            && said.contains("mode 0700"),
        "{said}"
    );
    // 0711: anyone may execute it, but a script must be read by its interpreter.
    std::fs::set_permissions(&made.0, std::os::unix::fs::PermissionsExt::from_mode(0o711)).unwrap();
    let said = check_program(&made.command(), "k", Some(&other)).unwrap_err();
    assert!(
        said.contains("is a script, which its interpreter must read"),
        "{said}"
    );
    // A binary need not be readable: the kernel maps it, nobody reads it.
    let elf = Made::new("tool", b"\x7fELF\x02\x01\x01", 0o711);
    assert!(check_program(&elf.command(), "k", Some(&other)).is_ok());
    // A directory on the way it may not enter.
    let hidden = Made::new("tool.sh", b"#!/bin/sh\n", 0o755);
    hidden.dir_mode(0o700);
    let said = check_program(&hidden.command(), "k", Some(&other)).unwrap_err();
    assert!(said.contains("may not enter"), "{said}");
    assert!(check_program(&hidden.command(), "k", Some(&me)).is_ok());
}

#[test]
fn a_scripts_interpreter_must_exist_and_be_executable() {
    let me = Identity::current();
    let missing = Made::new("tool.py", b"#!/nonexistent/python3 -u\nprint(1)\n", 0o755);
    let said = check_program(&missing.command(), "queues.q.command", Some(&me)).unwrap_err();
    assert!(
        said.contains("names /nonexistent/python3 on its #! line, which is not an executable file"),
        "{said}"
    );
    let plain = Made::new("not-a-program", b"data", 0o644);
    let script = Made::new(
        "tool.sh",
        format!("#!{}\n", plain.0.display()).as_bytes(),
        0o755,
    );
    let said = check_program(&script.command(), "k", Some(&me)).unwrap_err();
    assert!(
        said.contains("on its #! line, which is not executable by"),
        "{said}"
    );
    // No #! line: /bin/sh runs it, as execvp does.
    let bare = Made::new("tool", b"echo hi\n", 0o755);
    assert!(check_program(&bare.command(), "k", Some(&me)).is_ok());
    assert_eq!(
        interpreter(b"#! \t/usr/bin/env python3\n"),
        Some("/usr/bin/env".into())
    );
    assert_eq!(interpreter(b"#!/bin/sh\r\n"), Some("/bin/sh".into()));
    assert_eq!(interpreter(b"#!\n"), None);
    assert_eq!(interpreter(b"echo"), None);
}

#[test]
fn a_program_is_looked_up_as_given_or_on_path() {
    let me = Identity::current();
    let me = Some(&me);
    assert!(check_program(&["sh".into()], "k", me).is_ok());
    assert!(check_program(&["/bin/sh".into(), "-c".into()], "k", me).is_ok());
    assert!(check_program(&["/nonexistent/prog".into()], "k", me).is_err());
    let plain = std::env::temp_dir().join(format!("pgtaskd-not-executable-{}", std::process::id()));
    std::fs::write(&plain, "not a program").unwrap();
    let refused = check_program(&[plain.display().to_string()], "k", me);
    std::fs::remove_file(&plain).unwrap();
    assert!(refused.is_err());
    assert!(check_program(&[], "k", me).is_err());
    // For the commands that never start it: named, not looked up.
    assert!(check_program(&["/nonexistent/prog".into()], "k", None).is_ok());
    assert!(check_program(&[], "k", None).is_err());
    let nul = check_program(&["/bin/echo".into(), "a\0b".into()], "k", None).unwrap_err();
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
