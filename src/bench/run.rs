//! One bench run from start to finish: a queue of its own emptied before and after, the
//! workload's rows inserted as the mode says, the daemon started and waited for, the figures
//! taken and the table's totals checked against the workload's. Called through
//! [`super::run`] by `pgtaskd bench`.

use tokio_postgres::Client;

use super::daemon::Daemon;
use super::report::Report;
use super::sql;
use super::table::{
    delete_rows, insert, seconds_since, vacuum, wait_done, wal_background, wal_position,
};
use super::timing::{latencies, notify_floor};
use super::{
    ceiling, handlers, producers, soak, workload, BenchError, BenchOptions, Mode, CEILING_BATCH,
    CEILING_SESSIONS, LATENCY_MODE_TASKS, STREAM_STATEMENTS,
};
use crate::config::Config;
use crate::db::{migrate, ConnectSettings};

/// Run the benchmark.
///
/// # Errors
///
/// Database failures, a daemon that cannot start, a run that does not finish, or totals that
/// differ from the check totals.
pub async fn run(config: &Config, options: BenchOptions) -> Result<Report, BenchError> {
    let settings = ConnectSettings::new(&config.database, "bench")
        .map_err(|err| BenchError::Daemon(err.to_string()))?;
    let client = settings.connect().await?;
    migrate::check(&client).await?;
    let queue = format!("bench-{}", std::process::id());
    // A limited queue's settings are the bench's own, and go with it.
    let limit = options
        .max_running
        .map(|most| serde_json::json!({ "max_running": most }));
    if let Some(limit) = &limit {
        client
            .execute(sql::SET_QUEUE, &[&queue, &limit.to_string()])
            .await?;
    }
    let result = run_on(&settings, &client, config, &queue, options).await;
    if limit.is_some() {
        let unset = serde_json::json!({ "max_running": null }).to_string();
        client.execute(sql::SET_QUEUE, &[&queue, &unset]).await?;
    }
    result
}

/// Run `options` on `queue`.
async fn run_on(
    settings: &ConnectSettings,
    client: &Client,
    config: &Config,
    queue: &str,
    options: BenchOptions,
) -> Result<Report, BenchError> {
    if options.mode == Mode::Soak {
        // Retention deletes its rows as it goes: it checks them as it reads them.
        delete_rows(client, queue).await?;
        let result = soak::soak(settings, client, config, queue, options).await;
        delete_rows(client, queue).await?;
        return result;
    }
    let mut report = checked(settings, client, config, queue, options).await?;
    if let (Mode::Drain, Some(handler)) = (options.mode, options.handler) {
        let texts: Vec<String> = (0..options.tasks).map(workload::gen_text).collect();
        let result = handlers::drain(
            client,
            config,
            queue,
            &texts,
            options.concurrency,
            handler,
            report.tasks_per_s,
        )
        .await;
        delete_rows(client, queue).await?;
        report.handler = Some(result?);
    }
    if options.mode == Mode::Ceiling {
        // The drain of the same backlog, on a table in the state the ceiling found it in:
        // the ceiling's rows deleted, the table vacuumed and analyzed while empty of them.
        vacuum(client).await?;
        let drain = BenchOptions {
            mode: Mode::Drain,
            ..options
        };
        let drain = checked(settings, client, config, queue, drain).await?;
        report.drain_over_ceiling = Some(drain.tasks_per_s / report.tasks_per_s);
        report.drain = Some(Box::new(drain));
    }
    Ok(report)
}

/// Run one mode on `queue`, emptied before and after, and check the table's totals.
async fn checked(
    settings: &ConnectSettings,
    client: &Client,
    config: &Config,
    queue: &str,
    options: BenchOptions,
) -> Result<Report, BenchError> {
    delete_rows(client, queue).await?;
    let result = measure(settings, client, config, queue, options).await;
    delete_rows(client, queue).await?;
    let (report, found, succeeded) = result?;
    // Producers mode learns its task count from the run.
    let expected = if report.tasks == 20_000 {
        workload::CHECK_TOTALS_20000
    } else {
        workload::check_totals(report.tasks)
    };
    if found != expected || succeeded != i64::from(report.tasks) {
        return Err(BenchError::Totals {
            found,
            expected,
            succeeded,
            tasks: report.tasks,
        });
    }
    Ok(report)
}

/// Run one mode; returns the report, the table's totals and the SUCCEEDED count.
async fn measure(
    settings: &ConnectSettings,
    client: &Client,
    config: &Config,
    queue: &str,
    options: BenchOptions,
) -> Result<(Report, (i64, i64, i64), i64), BenchError> {
    let mut n = options.tasks as usize;
    let texts: Vec<String> = match options.mode {
        Mode::Producers => Vec::new(),
        _ => (0..options.tasks).map(workload::gen_text).collect(),
    };
    let mut latency = None;
    let mut floor = None;
    let mut idle_cpu = None;
    let mut batch = None;
    let mut producers = None;
    let mut measured = None;
    // WAL written during the run (cluster-wide), and by others just before it.
    let mut wal = None;
    // WAL written by the INSERTs of the backlog (drain mode).
    let mut insert_wal = None;
    // CPU seconds of the server backends that served the run (drain and ceiling modes).
    let mut server_cpu = None;
    let (daemon, started) = match options.mode {
        Mode::Drain => {
            let background = wal_background(client).await?;
            let before_insert = wal_position(client).await?;
            insert(client, queue, &texts).await?;
            let from = wal_position(client).await?;
            insert_wal = Some(from - before_insert);
            let started = chrono::Utc::now();
            let daemon = Daemon::start(config, queue, options.concurrency, false)?;
            wait_done(client, queue, n).await?;
            wal = Some((wal_position(client).await? - from, background));
            server_cpu = daemon.server_cpu_s(client).await?;
            (Some(daemon), started)
        }
        Mode::Ceiling => {
            let background = wal_background(client).await?;
            insert(client, queue, &texts).await?;
            batch = Some(CEILING_BATCH);
            let from = wal_position(client).await?;
            let started = chrono::Utc::now();
            // From the first claim, not from here: the counts are computed first.
            let ceiling = ceiling::ceiling(settings, client, queue).await?;
            wal = Some((wal_position(client).await? - from, background));
            measured = Some(ceiling.seconds);
            server_cpu = ceiling.server_cpu_s;
            (None, started)
        }
        Mode::Producers => {
            let floor_texts: Vec<String> =
                (0..LATENCY_MODE_TASKS).map(workload::gen_text).collect();
            floor = Some(notify_floor(settings, client, queue, &floor_texts).await?);
            let daemon = Daemon::start(config, queue, options.concurrency, true)?;
            daemon.wait_listening(client).await?;
            let started = chrono::Utc::now();
            let (figures, inserted) = producers::producers(
                settings,
                client,
                queue,
                &daemon,
                options.producers,
                options.duration,
            )
            .await?;
            n = inserted as usize;
            producers = Some(figures);
            (Some(daemon), started)
        }
        Mode::Stream => {
            let daemon = Daemon::start(config, queue, options.concurrency, false)?;
            daemon.wait_listening(client).await?;
            idle_cpu = Some(daemon.idle_cpu().await);
            let started = chrono::Utc::now();
            let per_statement = n.div_ceil(STREAM_STATEMENTS).max(1);
            for chunk in texts.chunks(per_statement) {
                insert(client, queue, chunk).await?;
            }
            wait_done(client, queue, n).await?;
            (Some(daemon), started)
        }
        Mode::Soak => {
            return Err(BenchError::Session(
                "soak mode runs through soak::soak".to_string(),
            ))
        }
        Mode::Latency => {
            floor = Some(notify_floor(settings, client, queue, &texts).await?);
            let daemon = Daemon::start(config, queue, options.concurrency, true)?;
            daemon.wait_listening(client).await?;
            idle_cpu = Some(daemon.idle_cpu().await);
            let started = chrono::Utc::now();
            // Returns once every task is done.
            latency = Some(latencies(client, queue, &texts, &daemon).await?);
            (Some(daemon), started)
        }
    };
    let seconds = match measured {
        Some(seconds) => seconds,
        None => seconds_since(client, queue, started).await?,
    };
    let usage = daemon.as_ref().map(Daemon::usage);
    if let Some(daemon) = daemon {
        daemon.stop().await;
    }
    let row = client.query_one(sql::TOTALS, &[&queue]).await?;
    let found = (row.get(0), row.get(1), row.get(2));
    let succeeded: i64 = row.get(3);
    let report = Report {
        mode: options.mode,
        tasks: n as u32,
        concurrency: match options.mode {
            Mode::Ceiling => CEILING_SESSIONS,
            _ => options.concurrency,
        },
        batch,
        max_running: options.max_running,
        seconds,
        tasks_per_s: n as f64 / seconds,
        latency_ms: latency,
        notify_floor_ms: floor,
        producers,
        soak: None,
        daemon_cpu_s: usage.as_ref().map(|u| u.cpu_s),
        daemon_cpu_s_per_1000_tasks: usage.as_ref().map(|u| u.cpu_s / n as f64 * 1000.0),
        daemon_peak_rss_mib: usage.as_ref().map(|u| u.peak_rss_mib),
        daemon_idle_cpu_s_per_s: idle_cpu,
        server_cpu_s: server_cpu,
        server_cpu_s_per_1000_tasks: server_cpu.map(|cpu| cpu / n as f64 * 1000.0),
        wal_bytes_per_task: wal.map(|(bytes, _)| bytes as f64 / n as f64),
        wal_background_bytes_per_s: wal.map(|(_, background)| background),
        insert_wal_bytes_per_task: insert_wal.map(|bytes| bytes as f64 / n as f64),
        drain: None,
        drain_over_ceiling: None,
        handler: None,
        check_totals: found,
    };
    Ok((report, found, succeeded))
}
