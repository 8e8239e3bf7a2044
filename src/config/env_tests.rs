//! Tests of the settings given outside the file: `Config::resolve` under an `Overlay` of
//! variables and flags (the precedence, the errors that name a variable, where each value
//! came from), and every error of a file reported, each with its line.

use std::ffi::OsString;

use super::*;

/// `text` under the variables `vars` and the flags `flags`.
fn resolve(
    text: &str,
    vars: &[(&str, &str)],
    flags: &[(&'static str, &str)],
) -> Result<Config, ConfigError> {
    let vars = vars
        .iter()
        .map(|(name, value)| (OsString::from(name), OsString::from(value)));
    let flags: Vec<(&'static str, String)> = flags
        .iter()
        .map(|(flag, value)| (*flag, value.to_string()))
        .collect();
    Config::resolve(text, "f.toml", &Overlay::new(vars, &flags))
}

const FILE: &str = "[worker]\nconcurrency = 2\nlease = \"10s\"\nqueues = [\"a\"]\n\
    [http]\nlisten = \"127.0.0.1:1\"\n";

#[test]
fn a_variable_wins_over_the_file_and_a_flag_over_the_variable() {
    let vars = [
        ("PGTASKD_WORKER_CONCURRENCY", "4"),
        ("PGTASKD_WORKER_LEASE", "1m"),
        ("PGTASKD_WORKER_QUEUES", "mail, sms"),
        ("PGTASKD_HTTP_LISTEN", "127.0.0.1:2"),
        ("PGTASKD_WORKER_MAX_INFLIGHT_BYTES", "64MiB"),
    ];
    let config = resolve(FILE, &vars, &[]).unwrap();
    assert_eq!(config.worker.concurrency, 4);
    assert_eq!(config.worker.lease, Duration::from_secs(60));
    assert_eq!(config.worker.queues, ["mail", "sms"]);
    assert_eq!(config.http.listen.as_deref(), Some("127.0.0.1:2"));
    assert_eq!(config.worker.max_inflight_bytes, 64 << 20);

    let flags = [
        ("--concurrency", "6"),
        ("--queues", "x,y"),
        ("--http-listen", "127.0.0.1:3"),
    ];
    let config = resolve(FILE, &vars, &flags).unwrap();
    assert_eq!(config.worker.concurrency, 6);
    assert_eq!(config.worker.queues, ["x", "y"]);
    assert_eq!(config.http.listen.as_deref(), Some("127.0.0.1:3"));
    assert_eq!(config.worker.lease, Duration::from_secs(60));
    assert_eq!(
        config.source("worker", "concurrency"),
        &Source::Flag("--concurrency")
    );
    assert_eq!(
        config.source("worker", "lease"),
        &Source::Env("PGTASKD_WORKER_LEASE".into())
    );
    assert_eq!(
        config.source("http", "listen"),
        &Source::Flag("--http-listen")
    );
    assert_eq!(config.source("shutdown", "grace"), &Source::Default);
}

#[test]
fn each_value_says_where_it_came_from() {
    let config = resolve(FILE, &[("PGTASKD_WORKER_LEASE", "1m")], &[]).unwrap();
    let file = |line| Source::File {
        file: "f.toml".into(),
        line,
    };
    assert_eq!(config.source("worker", "concurrency"), &file(2));
    assert_eq!(config.source("worker", "queues"), &file(4));
    assert_eq!(config.source("http", "listen"), &file(6));
    assert_eq!(
        config.source("worker", "lease").to_string(),
        "PGTASKD_WORKER_LEASE"
    );
    assert_eq!(config.source("log", "level"), &Source::Default);
    assert_eq!(
        config.source("worker", "concurrency").to_string(),
        "f.toml:2"
    );
}

#[test]
fn the_connection_string_and_log_format_variables_are_settings_like_the_others() {
    let config = resolve(
        "[database]\nurl = \"host=file\"\n",
        &[
            ("PGTASKD_DATABASE_URL", "host=env"),
            ("PGTASKD_LOG_FORMAT", "json"),
        ],
        &[],
    )
    .unwrap();
    assert_eq!(config.database.url.as_deref(), Some("host=env"));
    assert_eq!(config.database.url_source, UrlSource::Environment);
    assert_eq!(config.log.format, LogFormat::Json);
    let config = resolve(
        "[database]\nurl = \"host=file\"\n",
        &[("PGTASKD_DATABASE_URL", ""), ("PGTASKD_LOG_FORMAT", "")],
        &[("--database-url", "host=flag")],
    )
    .unwrap();
    assert_eq!(config.database.url.as_deref(), Some("host=flag"));
    assert_eq!(config.database.url_source, UrlSource::Flag);
    assert_eq!(config.log.format, LogFormat::Text);
    let err = resolve("", &[("PGTASKD_LOG_FORMAT", "JSON")], &[]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "PGTASKD_LOG_FORMAT=\"JSON\": log.format must be \"text\" or \"json\""
    );
}

#[test]
fn a_value_that_does_not_parse_names_the_variable_and_the_value() {
    for (name, value, said) in [
        (
            "PGTASKD_WORKER_CONCURRENCY",
            "eight",
            "worker.concurrency must be a whole number, 1 or more",
        ),
        (
            "PGTASKD_WORKER_CONCURRENCY",
            "0",
            "worker.concurrency must be at least 1",
        ),
        (
            "PGTASKD_WORKER_LEASE",
            "soon",
            "worker.lease must be a duration, such as",
        ),
        (
            "PGTASKD_HTTP_LISTEN",
            "nowhere",
            "is not an address and port",
        ),
        (
            "PGTASKD_WORKER_QUEUES",
            "a,,b",
            "worker.queues: the queue name is empty",
        ),
        (
            "PGTASKD_WORKER_MAX_PAYLOAD_BYTES",
            "lots",
            "worker.max_payload_bytes must be a number of bytes",
        ),
    ] {
        let err = resolve(FILE, &[(name, value)], &[])
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with(&format!("{name}={value:?}: ")),
            "{name}: {err}"
        );
        assert!(err.contains(said), "{name}: {err}");
    }
    let err = resolve("", &[], &[("--concurrency", "-3")]).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("--concurrency \"-3\": worker.concurrency must be"),
        "{err}"
    );
}

#[test]
fn every_error_of_the_file_and_the_environment_is_reported_in_order() {
    let text = "[worker]\nconcurrency = \"eight\"\nlease = \"0s\"\nconcurency = 3\n\
        [http]\nlisten = \"nowhere\"\n";
    let err = resolve(text, &[("PGTASKD_SHUTDOWN_GRACE", "later")], &[]).unwrap_err();
    let ConfigError::Several(errors) = &err else {
        panic!("expected several errors, got {err}");
    };
    let lines: Vec<String> = errors.iter().map(ToString::to_string).collect();
    assert_eq!(lines.len(), 5, "{err}");
    for (i, (start, said)) in [
        (
            "f.toml: line 2,",
            "worker.concurrency must be a whole number",
        ),
        ("f.toml: line 3,", "worker.lease must be longer than zero"),
        ("f.toml: line 4,", "concurency"),
        ("f.toml: line 6,", "is not an address and port"),
        (
            "PGTASKD_SHUTDOWN_GRACE=\"later\": ",
            "shutdown.grace must be a duration",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        assert!(lines[i].starts_with(start), "{i}: {}", lines[i]);
        assert!(lines[i].contains(said), "{i}: {}", lines[i]);
    }
    assert!(
        err.to_string().starts_with("5 errors:\n  f.toml: line 2,"),
        "{err}"
    );
}

#[test]
fn a_section_under_its_old_name_takes_the_variables_of_the_new_one() {
    let config = resolve(
        "[health]\ncheck_interval = \"30s\"\n",
        &[("PGTASKD_VACUUM_HEALTH_XMIN_HORIZON_WARNING", "1m")],
        &[],
    )
    .unwrap();
    assert_eq!(config.vacuum_health.check_interval, Duration::from_secs(30));
    assert_eq!(
        config.vacuum_health.xmin_horizon_warning,
        Duration::from_secs(60)
    );
    assert_eq!(config.warnings.len(), 1, "{:?}", config.warnings);
}

#[test]
fn an_unknown_variable_of_a_section_is_a_warning_of_the_config() {
    let config = resolve("", &[("PGTASKD_HTTP_LISTN", "x")], &[]).unwrap();
    assert_eq!(config.warnings.len(), 1);
    assert!(
        config.warnings[0].contains("PGTASKD_HTTP_LISTN"),
        "{:?}",
        config.warnings
    );
}
