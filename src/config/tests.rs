//! Tests of loading a configuration: `Config::from_toml` end to end (the defaults, every key,
//! the errors that name a key and its line), and a named file that is missing. The
//! environment and the flags are `env_tests.rs`'s.

use super::*;

fn invalid(text: &str) -> (usize, String) {
    match Config::from_toml(text, "test.toml") {
        Err(ConfigError::Invalid { line, message, .. }) => (line, message),
        other => panic!("expected an invalid config, got {other:?}"),
    }
}

#[test]
fn empty_file_gives_every_default() {
    let config = Config::from_toml("", "test.toml").unwrap();
    assert_eq!(config.database.url, None);
    assert_eq!(config.database.pool_size, DEFAULT_POOL_SIZE);
    assert_eq!(config.worker.concurrency, DEFAULT_CONCURRENCY);
    assert_eq!(config.worker.queues, vec!["default".to_string()]);
    assert_eq!(config.worker.poll_interval, DEFAULT_POLL_INTERVAL);
    assert_eq!(config.worker.lease, DEFAULT_LEASE);
    assert_eq!(config.worker.max_inflight_bytes, 256 * 1024 * 1024);
    assert_eq!(config.worker.max_payload_bytes, None);
    assert_eq!(config.shutdown.grace, DEFAULT_SHUTDOWN_GRACE);
    assert_eq!(config.retention.finished_after, None);
    assert_eq!(config.http.listen, None);
    assert_eq!(config.http.max_connections, DEFAULT_HTTP_MAX_CONNECTIONS);
    assert_eq!(config.http.header_timeout, DEFAULT_HTTP_HEADER_TIMEOUT);
    assert_eq!(config.http.max_inflight_bytes, 256 << 20);
    assert_eq!(config.vacuum_health.check_interval, Duration::from_secs(15));
    assert_eq!(
        config.vacuum_health.xmin_horizon_warning,
        Duration::from_secs(300)
    );
    assert_eq!(config.log.format, LogFormat::Text);
    assert_eq!(config.log.level, "info");
}

#[test]
fn every_key_is_read() {
    let text = r#"
        [database]
        url = "postgres://u@db/app"
        pool_size = 4
        connect_timeout = "2s"
        statement_timeout = "0s"
        [worker]
        concurrency = 32
        queues = ["default", "mail"]
        poll_interval = "250ms"
        lease = "1m"
        max_inflight_bytes = "64MiB"
        max_payload_bytes = 1000000
        [shutdown]
        grace = "5s"
        [retention]
        finished_after = "7days"
        [http]
        listen = "127.0.0.1:8080"
        token_file = "/etc/pgtaskd/token"
        max_body = 4096
        max_connections = 64
        header_timeout = "3s"
        max_inflight_bytes = "32MiB"
        [vacuum_health]
        check_interval = "30s"
        xmin_horizon_warning = "10m"
        [log]
        format = "json"
        level = "pgtaskd=debug"
    "#;
    let config = Config::from_toml(text, "test.toml").unwrap();
    assert_eq!(config.database.url.as_deref(), Some("postgres://u@db/app"));
    assert_eq!(config.database.pool_size, 4);
    assert_eq!(config.database.connect_timeout, Duration::from_secs(2));
    assert_eq!(config.database.statement_timeout, Duration::ZERO);
    assert_eq!(config.worker.concurrency, 32);
    assert_eq!(config.worker.queues, vec!["default", "mail"]);
    assert_eq!(config.worker.poll_interval, Duration::from_millis(250));
    assert_eq!(config.worker.lease, Duration::from_secs(60));
    assert_eq!(config.worker.max_inflight_bytes, 64 << 20);
    assert_eq!(config.worker.max_payload_bytes, Some(1_000_000));
    assert_eq!(config.shutdown.grace, Duration::from_secs(5));
    assert_eq!(
        config.retention.finished_after,
        Some(Duration::from_secs(7 * 86400))
    );
    assert_eq!(config.http.listen, Some("127.0.0.1:8080".parse().unwrap()));
    assert_eq!(
        config.http.token_file,
        Some(PathBuf::from("/etc/pgtaskd/token"))
    );
    assert_eq!(config.http.max_body, 4096);
    assert_eq!(config.http.max_connections, 64);
    assert_eq!(config.http.header_timeout, Duration::from_secs(3));
    assert_eq!(config.http.max_inflight_bytes, 32 << 20);
    assert_eq!(config.vacuum_health.check_interval, Duration::from_secs(30));
    assert_eq!(
        config.vacuum_health.xmin_horizon_warning,
        Duration::from_secs(600)
    );
    assert_eq!(config.log.format, LogFormat::Json);
    assert_eq!(config.log.level, "pgtaskd=debug");
}

#[test]
fn unknown_keys_are_named_with_their_line() {
    let cases = [
        (
            "[worker]\nconcurrency = 2\nconcurency = 3\n",
            3,
            "concurency",
        ),
        ("[databse]\nurl = \"x\"\n", 1, "databse"),
        ("\n\n[log]\nformat = \"text\"\ncolour = true\n", 5, "colour"),
    ];
    for (text, want_line, key) in cases {
        let (line, message) = invalid(text);
        assert_eq!(line, want_line, "{text:?}: {message}");
        assert!(message.contains(key), "{text:?}: {message}");
    }
}

#[test]
fn a_table_given_twice_is_named_with_its_line() {
    let cases = [
        (
            "[worker]\nconcurrency = 2\n\n[worker]\nlease = \"5s\"\n",
            4,
            "[worker]",
        ),
        (
            "[queues.a]\nhandler = \"exec\"\ncommand = [\"x\"]\n[queues.a] # again\n",
            4,
            "[queues.a]",
        ),
    ];
    for (text, want_line, table) in cases {
        let (line, message) = invalid(text);
        assert_eq!(line, want_line, "{text:?}: {message}");
        assert_eq!(
            message,
            format!("{table}: the table is given twice"),
            "{text:?}"
        );
    }
}

#[test]
fn bad_values_are_named_with_their_line() {
    let cases = [
        (
            "[worker]\npoll_interval = \"soon\"\n",
            2,
            "worker.poll_interval must be a duration in quotes",
        ),
        ("[worker]\nlease = 30\n", 2, "worker.lease"),
        ("[worker]\nconcurrency = 0\n", 2, "worker.concurrency"),
        ("[worker]\n\nqueues = []\n", 3, "worker.queues"),
        (
            "[worker]\nqueues = [\"a\", \" \"]\n",
            2,
            "worker.queues: the queue name is empty",
        ),
        (
            &format!("[worker]\n\nqueues = [\"{}\"]\n", "q".repeat(129)),
            3,
            "worker.queues: the queue name is 129 bytes long; the limit is 128",
        ),
        (
            "[worker]\npoll_interval = \"0s\"\n",
            2,
            "worker.poll_interval",
        ),
        ("[database]\npool_size = -1\n", 2, "pool_size"),
        (
            "[worker]\nmax_inflight_bytes = \"lots\"\n",
            2,
            "worker.max_inflight_bytes must be a number of bytes, or a size",
        ),
        (
            "[worker]\n\nmax_payload_bytes = 0\n",
            3,
            "worker.max_payload_bytes",
        ),
        ("[log]\nformat = \"xml\"\n", 2, "xml"),
        ("[log]\nlevel = \"[[[\"\n", 2, "log.level"),
        ("[http]\nlisten = \"nowhere\"\n", 2, "address"),
        (
            "[vacuum_health]\nxmin_horizon_warning = \"0s\"\n",
            2,
            "vacuum_health.xmin_horizon_warning must be longer than zero",
        ),
        (
            "[health]\nxmin_horizon_warning = \"0s\"\n",
            2,
            "health.xmin_horizon_warning must be longer than zero",
        ),
        (
            "[vacuum_health]\ncheck_interval = \"1s\"\n[health]\ncheck_interval = \"1s\"\n",
            3,
            "give only [vacuum_health]",
        ),
        (
            "[health]\ncheck_interval = 15\n",
            2,
            "health.check_interval must be a duration in quotes",
        ),
        ("[health]\nxmin_horizon = \"5m\"\n", 2, "xmin_horizon"),
        ("[worker\n", 1, "expected `]`"),
    ];
    for (text, want_line, needle) in cases {
        let (line, message) = invalid(text);
        assert_eq!(line, want_line, "{text:?}: {message}");
        assert!(
            message.to_lowercase().contains(needle),
            "{text:?}: {message:?} lacks {needle:?}"
        );
    }
}

/// PostgreSQL takes a timeout of at most INT_MAX milliseconds, in whole milliseconds: a longer
/// one would be refused by the server at every connection (and `run` would retry forever), a
/// shorter one would be sent as 0, no timeout.
#[test]
fn a_statement_timeout_the_server_would_refuse_or_round_to_off_is_named_with_its_line() {
    for (value, needle) in [
        (
            "30days",
            "database.statement_timeout is 30days, longer than PostgreSQL takes",
        ),
        ("2147483648ms", "at most 2147483647ms"),
        ("500us", "would turn the timeout off"),
    ] {
        let (line, message) = invalid(&format!(
            "[database]\npool_size = 2\nstatement_timeout = \"{value}\"\n"
        ));
        assert_eq!(line, 3, "{value}: {message}");
        assert!(message.contains(needle), "{value}: {message}");
    }
    for (value, want) in [
        ("2147483647ms", Duration::from_millis(i32::MAX as u64)),
        ("1ms", Duration::from_millis(1)),
        ("0s", Duration::ZERO),
    ] {
        let config = Config::from_toml(
            &format!("[database]\nstatement_timeout = \"{value}\"\n"),
            "t",
        )
        .unwrap();
        assert_eq!(config.database.statement_timeout, want, "{value}");
    }
}

/// A duration past what a clock reading can have added to it (a handler's `timeout` of
/// u64::MAX seconds panicked the daemon at the first task) is refused with its line, in every
/// section; 100 years is still taken.
#[test]
fn a_duration_over_100_years_is_named_with_its_line() {
    for toml in [
        "[worker]\nlease = \"18446744073709551615s\"\n",
        "[queues.hooks]\nhandler = \"http\"\nurl = \"http://127.0.0.1:9/x\"\ntimeout = \"18446744073709551615s\"\n",
        "[queues.jobs]\nhandler = \"exec\"\ncommand = [\"/bin/true\"]\nkill_after = \"101years\"\n",
    ] {
        let (line, message) = invalid(toml);
        assert_eq!(line, toml.lines().count(), "{toml}: {message}");
        assert!(message.contains("longer than 100 years"), "{toml}: {message}");
    }
    Config::from_toml("[shutdown]\ngrace = \"100years\"\n", "t").expect("100 years is taken");
}

#[test]
fn sizes_take_iec_and_si_units() {
    for (text, bytes) in [
        ("\"256MiB\"", 256 << 20),
        ("\"1 GiB\"", 1 << 30),
        ("\"1GB\"", 1_000_000_000),
        ("\"512KiB\"", 512 << 10),
        ("4096", 4096),
    ] {
        let config =
            Config::from_toml(&format!("[worker]\nmax_inflight_bytes = {text}\n"), "t").unwrap();
        assert_eq!(config.worker.max_inflight_bytes, bytes, "{text}");
        // http.max_body too, as every size key.
        let config = Config::from_toml(&format!("[http]\nmax_body = {text}\n"), "t").unwrap();
        assert_eq!(config.http.max_body as u64, bytes, "{text}");
    }
}

#[test]
fn a_file_over_one_mebibyte_is_refused_without_reading_it_all() {
    let err = Config::load(Some(Path::new("/dev/zero"))).unwrap_err();
    assert!(matches!(err, ConfigError::TooLarge { .. }), "{err}");
    assert_eq!(
        err.to_string(),
        "config file /dev/zero is larger than 1048576 bytes (1 MiB), the most pgtaskd reads"
    );
}

#[test]
fn a_named_file_that_does_not_exist_is_an_error() {
    let err = Config::load(Some(Path::new("/nonexistent/pgtaskd.toml"))).unwrap_err();
    assert!(matches!(err, ConfigError::Read { .. }), "{err}");
    assert!(err.to_string().contains("/nonexistent/pgtaskd.toml"));
}

#[test]
fn the_old_name_of_the_vacuum_health_section_is_read_with_a_warning() {
    let old = Config::from_toml("[health]\ncheck_interval = \"30s\"\n", "old.toml").unwrap();
    assert_eq!(old.vacuum_health.check_interval, Duration::from_secs(30));
    assert_eq!(
        old.warnings,
        ["[health] is now called [vacuum_health]; the old name is still read"]
    );
    let new = Config::from_toml("[vacuum_health]\ncheck_interval = \"30s\"\n", "new.toml").unwrap();
    assert_eq!(new.vacuum_health, old.vacuum_health);
    assert!(new.warnings.is_empty());
}

#[test]
fn a_lease_under_a_second_is_taken_with_a_warning() {
    let config = Config::from_toml("[worker]\nlease = \"1ms\"\n", "test").unwrap();
    assert_eq!(config.worker.lease, Duration::from_millis(1));
    assert_eq!(config.warnings.len(), 1, "{:?}", config.warnings);
    assert!(
        config.warnings[0].starts_with("worker.lease = 1ms is under 1s"),
        "{:?}",
        config.warnings
    );
    let config = Config::from_toml("[worker]\nlease = \"1s\"\n", "test").unwrap();
    assert!(config.warnings.is_empty(), "{:?}", config.warnings);
}

#[test]
fn a_poll_interval_under_ten_milliseconds_is_taken_with_a_warning() {
    let config = Config::from_toml("[worker]\npoll_interval = \"1ns\"\n", "test").unwrap();
    assert_eq!(config.worker.poll_interval, Duration::from_nanos(1));
    assert_eq!(config.warnings.len(), 1, "{:?}", config.warnings);
    assert!(
        config.warnings[0].starts_with("worker.poll_interval = 1ns is under 10ms"),
        "{:?}",
        config.warnings
    );
    let config = Config::from_toml("[worker]\npoll_interval = \"10ms\"\n", "test").unwrap();
    assert!(config.warnings.is_empty(), "{:?}", config.warnings);
}

/// An exec queue's `kill_after` over half the lease is said: such a command's run may overlap
/// another daemon's when a lease cannot be extended.
#[test]
fn a_kill_after_over_half_the_lease_is_warned_of() {
    let toml = "[worker]\nlease = \"5s\"\nqueues = [\"jobs\"]\n\
                [queues.jobs]\nhandler = \"exec\"\ncommand = [\"/bin/true\"]\n";
    let config = Config::from_toml(toml, "t").unwrap();
    assert_eq!(config.warnings.len(), 1, "{:?}", config.warnings);
    assert!(
        config.warnings[0].contains("[queues.jobs] kill_after = 10s is over half of worker.lease"),
        "{:?}",
        config.warnings
    );
    let config = Config::from_toml(&toml.replace("5s", "30s"), "t").unwrap();
    assert!(config.warnings.is_empty(), "{:?}", config.warnings);
}
