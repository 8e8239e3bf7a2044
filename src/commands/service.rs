//! `pgtaskd run`, `pgtaskd migrate` and `pgtaskd check-config`: start the daemon, bring the
//! schema up to date, and check the configuration without starting anything. Called by
//! `dispatch`.

use std::process::ExitCode;
use std::sync::Arc;

use crate::analyzer::TextStats;
use crate::config::Config;
use crate::daemon::{self, RunOptions};
use crate::db::migrate;
use crate::db::ConnectSettings;
use crate::shutdown::Shutdown;

use super::{connect, CommandError};

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

/// Apply the migrations this binary knows and the database lacks.
pub(super) async fn migrate(config: &Config) -> Result<ExitCode, CommandError> {
    let mut client = connect(config).await?;
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

/// Print what the configuration resolves to: where the database is, and how the worker runs.
pub(super) fn check_config(config: &Config) -> Result<ExitCode, CommandError> {
    let settings = ConnectSettings::new(&config.database, "check-config")?;
    let pg = settings.config();
    println!("configuration is valid");
    println!(
        "database: hosts={:?} ports={:?} user={} dbname={}",
        pg.get_hosts(),
        pg.get_ports(),
        pg.get_user().unwrap_or(""),
        pg.get_dbname().or(pg.get_user()).unwrap_or("")
    );
    println!(
        "worker: concurrency={} queues={:?} poll_interval={:?} lease={:?}",
        config.worker.concurrency,
        config.worker.queues,
        config.worker.poll_interval,
        config.worker.lease
    );
    Ok(ExitCode::SUCCESS)
}
