//! `pgtaskd run`, `pgtaskd migrate` and `pgtaskd check-config`: start the daemon, bring the
//! schema up to date, and check the configuration without starting anything (or, with
//! `--connect`, connecting and checking the schema, and nothing more). Called by `dispatch`.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::config::Host;

use crate::analyzer::TextStats;
use crate::config::{Config, LogFormat, Source, UrlSource, CONFIG_ENV, DEFAULT_CONFIG_PATH};
use crate::daemon::{self, DaemonError, RunOptions};
use crate::db::migrate;
use crate::db::tls::SslMode;
use crate::db::ConnectSettings;
use crate::http;
use crate::shutdown::Shutdown;

use super::CommandError;

/// Run the daemon until a signal stops it.
pub(super) async fn run(config: &Config, migrate: bool) -> Result<ExitCode, CommandError> {
    let shutdown = Shutdown::new();
    shutdown.on_signals().map_err(CommandError::Signals)?;
    daemon::run(
        config,
        Arc::new(TextStats),
        shutdown,
        RunOptions { migrate },
    )
    .await?;
    Ok(ExitCode::SUCCESS)
}

/// Apply the migrations this binary knows and the database lacks, saying first which
/// database (host, port, name, user; never the password).
pub(super) async fn migrate(config: &Config) -> Result<ExitCode, CommandError> {
    let settings = ConnectSettings::new(&config.database, "cli")?;
    let mut client = settings.connect().await?;
    println!("migrating {}", migrate::target(&settings, &client).await?);
    let applied = migrate::migrate(&mut client).await?;
    if applied.is_empty() {
        println!("schema is up to date (version {})", migrate::LATEST_VERSION);
    } else {
        for version in applied {
            println!("applied migration {version}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Check everything `run` checks before it connects (the file, the log filter, the
/// connection string, the HTTP token file and address), then print every section as it
/// resolves; with `connect`, also open a session and check the schema version, as `run` does.
pub(super) async fn check_config(config: &Config, connect: bool) -> Result<ExitCode, CommandError> {
    let settings = ConnectSettings::new(&config.database, "check-config")?;
    let listen = ConnectSettings::listen(&config.database, "check-config")?;
    for warning in &config.warnings {
        eprintln!("warning: {warning}");
    }
    if let Some(path) = &config.http.token_file {
        http::read_token(path).map_err(|err| CommandError::Daemon(DaemonError::Token(err)))?;
    }
    let mut resolved = Vec::new();
    if let Some(addr) = &config.http.listen {
        let addrs = tokio::net::lookup_host(addr.as_str())
            .await
            .map_err(|source| {
                CommandError::Daemon(DaemonError::Bind(http::HttpError::Bind {
                    addr: addr.clone(),
                    source,
                }))
            })?;
        resolved.extend(addrs.map(|a| a.to_string()));
    }
    let schema = if connect {
        let client = super::connect(config).await?;
        let version = migrate::check(&client).await?;
        crate::health::check_writable(&client).await?;
        check_pooler(config, &client, &listen).await?;
        Some(version)
    } else {
        None
    };
    let mut out = String::new();
    describe(&mut out, config, &settings, &resolved);
    out.push_str(&match schema {
        Some(version) => {
            format!("\nconnected: the pgtaskd schema is at version {version}, this binary's\n")
        }
        None => {
            "\nnot connected (add --connect to open a session and check the schema)\n".to_string()
        }
    });
    print!("configuration is valid\n{out}");
    Ok(ExitCode::SUCCESS)
}

/// What `run` checks of a pooler at start: the role's transaction defaults behind one in
/// transaction mode, and that the LISTEN session reaches PostgreSQL itself.
async fn check_pooler(
    config: &Config,
    client: &tokio_postgres::Client,
    listen: &ConnectSettings,
) -> Result<(), CommandError> {
    use crate::db::pooler::{self, PoolerError};
    let misplaced = |err: PoolerError| match err {
        PoolerError::Db(err) => CommandError::Db(err),
        PoolerError::Misplaced(message) => CommandError::Daemon(DaemonError::Pooler(message)),
    };
    let transaction_pooler = config.database.pooler == crate::config::Pooler::Transaction;
    pooler::check_defaults(client, transaction_pooler)
        .await
        .map_err(misplaced)?;
    pooler::check_listen(listen, pooler::listen_setting(&config.database))
        .await
        .map_err(misplaced)
}

/// Every section of `config` in the file's own layout, each value followed by where it came
/// from (`# from --flag`, `# from PGTASKD_...`, `# from FILE:LINE`, `# default`), with the
/// connection and the HTTP address (`listen`, its addresses) as resolved.
fn describe(out: &mut String, config: &Config, settings: &ConnectSettings, listen: &[String]) {
    use std::fmt::Write;
    let duration = |d: Duration| humantime::format_duration(d).to_string();
    let size = |bytes: u64| format!("{bytes} ({})", bytesize::ByteSize::b(bytes).display().iec());
    let or = |value: Option<String>, none: &str| value.unwrap_or_else(|| none.to_string());
    let put = |out: &mut String, section: &str, key: &str, value: String| {
        let _ = writeln!(
            out,
            "{key} = {value}  # {}",
            from(config.source(section, key))
        );
    };
    let file = match &config.file {
        Some(path) => format!("file: {}", path.display()),
        None => format!(
            "file: none (no --config, no {CONFIG_ENV}, no {DEFAULT_CONFIG_PATH}): the defaults apply"
        ),
    };
    let pg = settings.config();
    let db = &config.database;
    let w = &config.worker;
    let h = &config.http;
    let _ = writeln!(out, "{file}");
    let _ = writeln!(out, "\n[database]");
    let _ = match db.url_source {
        UrlSource::Unset => writeln!(
            out,
            "connection string: none; the libpq environment and defaults apply"
        ),
        UrlSource::File => writeln!(
            out,
            "connection string: from {}  # from {}",
            UrlSource::File,
            config.source("database", "url")
        ),
        source => writeln!(out, "connection string: from {source}"),
    };
    let _ = writeln!(out, "servers = {}", servers(pg));
    let _ = writeln!(out, "user = {}", pg.get_user().unwrap_or(""));
    let _ = writeln!(
        out,
        "dbname = {}",
        pg.get_dbname().or(pg.get_user()).unwrap_or("")
    );
    let password = if pg.get_password().is_some() {
        "given"
    } else {
        "none"
    };
    let _ = writeln!(out, "password = {password}");
    let _ = writeln!(out, "sslmode = {}", ssl_mode_name(settings.ssl_mode()));
    let attrs = if settings.requires_writes() {
        "read-write"
    } else {
        "any"
    };
    let _ = writeln!(out, "target_session_attrs = {attrs}");
    put(out, "database", "pool_size", db.pool_size.to_string());
    match pg.get_connect_timeout().copied() {
        Some(timeout) if timeout != db.connect_timeout => {
            let _ = writeln!(
                out,
                "connect_timeout = {}  # from the connection string or PGCONNECT_TIMEOUT",
                duration(timeout)
            );
        }
        _ => put(
            out,
            "database",
            "connect_timeout",
            duration(db.connect_timeout),
        ),
    }
    let statement_timeout = match db.statement_timeout {
        d if d.is_zero() => "off".to_string(),
        d => duration(d),
    };
    put(out, "database", "statement_timeout", statement_timeout);
    let pooler = match db.pooler {
        crate::config::Pooler::None => "none",
        crate::config::Pooler::Transaction => {
            "transaction (no startup options on database.url's sessions)"
        }
    };
    put(out, "database", "pooler", pooler.to_string());
    // Parsed already by `check_config` with the same string.
    if let Ok(listen) = ConnectSettings::listen(db, "check-config") {
        let from = if db.listen_url.is_some() {
            "database.listen_url"
        } else {
            "the connection string"
        };
        let _ = writeln!(
            out,
            "listen servers = {} (from {from})",
            servers(listen.config())
        );
    }
    let _ = writeln!(out, "\n[worker]");
    put(out, "worker", "concurrency", w.concurrency.to_string());
    put(out, "worker", "queues", w.queues.join(", "));
    put(out, "worker", "poll_interval", duration(w.poll_interval));
    put(out, "worker", "lease", duration(w.lease));
    put(
        out,
        "worker",
        "max_inflight_bytes",
        size(w.max_inflight_bytes),
    );
    put(
        out,
        "worker",
        "max_payload_bytes",
        or(w.max_payload_bytes.map(size), "no limit"),
    );
    for queue in &config.queues {
        describe_queue(out, queue, &w.queues);
    }
    let _ = writeln!(out, "\n[shutdown]");
    put(out, "shutdown", "grace", duration(config.shutdown.grace));
    let _ = writeln!(out, "\n[retention]");
    put(
        out,
        "retention",
        "finished_after",
        or(
            config.retention.finished_after.map(duration),
            "never (finished rows are kept)",
        ),
    );
    let _ = writeln!(out, "\n[http]");
    let listen = match &h.listen {
        None => "off".to_string(),
        Some(addr) if listen.len() == 1 && listen[0] == *addr => addr.clone(),
        Some(addr) => format!("{addr} (resolves to {})", listen.join(", ")),
    };
    put(out, "http", "listen", listen);
    put(
        out,
        "http",
        "token_file",
        or(
            h.token_file
                .as_ref()
                .map(|p| format!("{} (readable)", p.display())),
            "none (no token required)",
        ),
    );
    put(out, "http", "max_body", size(h.max_body as u64));
    put(
        out,
        "http",
        "max_connections",
        h.max_connections.to_string(),
    );
    put(out, "http", "header_timeout", duration(h.header_timeout));
    put(
        out,
        "http",
        "max_inflight_bytes",
        size(h.max_inflight_bytes),
    );
    let vacuum = &config.vacuum_health;
    let _ = writeln!(out, "\n[vacuum_health]");
    put(
        out,
        "vacuum_health",
        "check_interval",
        duration(vacuum.check_interval),
    );
    put(
        out,
        "vacuum_health",
        "xmin_horizon_warning",
        duration(vacuum.xmin_horizon_warning),
    );
    let format = match config.log.format {
        LogFormat::Text => "text",
        LogFormat::Json => "json",
    };
    let _ = writeln!(out, "\n[log]");
    put(out, "log", "format", format.to_string());
    put(out, "log", "level", config.log.level.clone());
    if let Ok(filter) = std::env::var("RUST_LOG") {
        let _ = writeln!(out, "RUST_LOG = {filter} (overrides log.level when valid)");
    }
}

/// Where a value came from, as `check-config` says it after the value.
fn from(source: &Source) -> String {
    match source {
        Source::Default => "default".to_string(),
        source => format!("from {source}"),
    }
}

/// The servers a session tries, in order: `host:port`, or a socket directory and its port.
fn servers(pg: &tokio_postgres::Config) -> String {
    let ports = pg.get_ports();
    let port = |i: usize| ports.get(i).or(ports.first()).copied().unwrap_or(5432);
    let hosts: Vec<String> = pg
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, host)| match host {
            Host::Tcp(name) if name.contains(':') => format!("[{name}]:{}", port(i)),
            Host::Tcp(name) => format!("{name}:{}", port(i)),
            Host::Unix(dir) => format!("Unix socket in {}, port {}", dir.display(), port(i)),
        })
        .collect();
    hosts.join(", ")
}

/// libpq's word for `mode`.
fn ssl_mode_name(mode: SslMode) -> &'static str {
    match mode {
        SslMode::Disable => "disable",
        SslMode::Allow => "allow",
        SslMode::Prefer => "prefer",
        SslMode::Require => "require",
        SslMode::VerifyCa => "verify-ca",
        SslMode::VerifyFull => "verify-full",
    }
}

/// One `[queues.NAME]` section as it resolves (read from the file only), and whether this
/// daemon serves the queue.
fn describe_queue(out: &mut String, queue: &crate::config::QueueConfig, served: &[String]) {
    use crate::config::HandlerConfig;
    use std::fmt::Write;
    let duration = |d: Duration| humantime::format_duration(d).to_string();
    let _ = writeln!(
        out,
        "\n[queues.{}]",
        crate::config::queues::toml_key(&queue.name)
    );
    let _ = writeln!(out, "handler = {}", queue.handler.name());
    match &queue.handler {
        HandlerConfig::TextStats => {}
        HandlerConfig::Exec(spec) => {
            let _ = writeln!(out, "command = {:?}", spec.command);
            let _ = writeln!(out, "timeout = {}", duration(spec.timeout));
            let _ = writeln!(out, "kill_after = {}", duration(spec.kill_after));
            if let Some(run_as) = &spec.run_as {
                let who = crate::privileges::Identity::of_child(Some(run_as)).describe();
                let _ = writeln!(out, "runs as {who}");
            }
            let _ = writeln!(
                out,
                "max_output = {}",
                bytesize::ByteSize(spec.max_output as u64)
            );
        }
        HandlerConfig::Http(spec) => {
            let _ = writeln!(out, "url = {}", crate::handler::http::shown_url(&spec.url));
            let _ = writeln!(out, "timeout = {}", duration(spec.timeout));
            let _ = writeln!(
                out,
                "max_output = {}",
                bytesize::ByteSize(spec.max_output as u64)
            );
        }
    }
    let concurrency = match queue.concurrency {
        Some(n) => n.to_string(),
        None => "worker.concurrency".to_string(),
    };
    let _ = writeln!(out, "concurrency = {concurrency}");
    let _ = writeln!(out, "retry_backoff = {}", duration(queue.retry_backoff));
    let _ = writeln!(out, "max_backoff = {}", duration(queue.max_backoff));
    if !served.contains(&queue.name) {
        let _ = writeln!(out, "# not served: worker.queues does not name it");
    }
}
