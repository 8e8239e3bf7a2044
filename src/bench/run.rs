//! One bench run from start to finish: a queue of its own emptied before and after, the
//! workload's rows inserted as the mode says, the daemon started and waited for, the figures
//! taken and the table's totals checked against the workload's. Called through
//! [`super::run`] by `pgtaskd bench`.

use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio_postgres::{AsyncMessage, Client};

use super::daemon::{AnalyzerStarts, Daemon};
use super::report::{Latency, Report};
use super::{
    ceiling, producers, soak, workload, BenchError, BenchOptions, Mode, CEILING_BATCH,
    CEILING_SESSIONS, LATENCY_GAP, LATENCY_MODE_TASKS, LATENCY_TASKS, NOTIFY_WAIT, POLL, RUN_LIMIT,
    STREAM_STATEMENTS, WAL_BACKGROUND, WARM_UP,
};
use crate::config::Config;
use crate::db::{listen, migrate, ConnectSettings, DbError};

/// How long the notify floor's idle flag lives: the floor's 210 inserts take about 5 s.
const FLOOR_FLAG: Duration = Duration::from_secs(60);

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
    if options.mode == Mode::Soak {
        // Retention deletes its rows as it goes: it checks them as it reads them.
        delete_rows(&client, &queue).await?;
        let result = soak::soak(&settings, &client, config, &queue, options).await;
        delete_rows(&client, &queue).await?;
        return result;
    }
    let mut report = checked(&settings, &client, config, &queue, options).await?;
    if options.mode == Mode::Ceiling {
        // The drain of the same backlog, on a table in the state the ceiling found it in:
        // the ceiling's rows deleted, the table vacuumed and analyzed while empty of them.
        vacuum(&client).await?;
        let drain = BenchOptions {
            mode: Mode::Drain,
            ..options
        };
        let drain = checked(&settings, &client, config, &queue, drain).await?;
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

/// `VACUUM (ANALYZE)` the task table, as docs/benchmark.md asks before each run. A role that
/// does not own the table gets a warning from the server and nothing is done.
pub(super) async fn vacuum(client: &Client) -> Result<(), BenchError> {
    client
        .batch_execute("VACUUM (ANALYZE) pgtaskd.tasks")
        .await?;
    Ok(())
}

/// Remove every row of the run's `queue`.
pub(super) async fn delete_rows(client: &Client, queue: &str) -> Result<(), BenchError> {
    client
        .execute("DELETE FROM pgtaskd.tasks WHERE queue = $1", &[&queue])
        .await?;
    Ok(())
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
    // CPU seconds of the server backends that served the run (drain and ceiling modes).
    let mut server_cpu = None;
    let (daemon, started) = match options.mode {
        Mode::Drain => {
            let background = wal_background(client).await?;
            insert(client, queue, &texts).await?;
            let from = wal_position(client).await?;
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
    let row = client
        .query_one(
            "SELECT coalesce(sum(words), 0)::int8, coalesce(sum(bytes), 0)::int8,
                    coalesce(sum(runes), 0)::int8, count(*) FILTER (WHERE status = 'SUCCEEDED')
               FROM pgtaskd.tasks WHERE queue = $1",
            &[&queue],
        )
        .await?;
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
        drain: None,
        drain_over_ceiling: None,
        check_totals: found,
    };
    Ok((report, found, succeeded))
}

pub(super) async fn insert(
    client: &Client,
    queue: &str,
    texts: &[String],
) -> Result<(), BenchError> {
    client
        .execute(
            "INSERT INTO pgtaskd.tasks (queue, payload) SELECT $1, unnest($2::text[])",
            &[&queue, &texts],
        )
        .await?;
    Ok(())
}

/// The server's current WAL position, in bytes from the start: the whole cluster's, every
/// database's writes included.
async fn wal_position(client: &Client) -> Result<i64, BenchError> {
    Ok(client
        .query_one(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::int8",
            &[],
        )
        .await?
        .get(0))
}

/// WAL bytes per second that the cluster writes with no run going on, over
/// [`WAL_BACKGROUND`]: what other databases and sessions add to a run's WAL figure.
async fn wal_background(client: &Client) -> Result<f64, BenchError> {
    let from = wal_position(client).await?;
    let started = Instant::now();
    tokio::time::sleep(WAL_BACKGROUND).await;
    let bytes = wal_position(client).await? - from;
    Ok(bytes as f64 / started.elapsed().as_secs_f64())
}

/// Wait until no task of `queue` is QUEUED or RUNNING and `n` are SUCCEEDED. The check is an
/// `EXISTS` on the partial indexes, cheap enough not to slow the run it watches.
pub(super) async fn wait_done(client: &Client, queue: &str, n: usize) -> Result<(), BenchError> {
    let deadline = Instant::now() + RUN_LIMIT;
    loop {
        let busy: bool = client
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM pgtaskd.tasks WHERE queue = $1 AND status = 'QUEUED')
                     OR EXISTS (SELECT 1 FROM pgtaskd.tasks WHERE queue = $1 AND status = 'RUNNING')",
                &[&queue],
            )
            .await?
            .get(0);
        if !busy {
            let done: i64 = client
                .query_one(
                    "SELECT count(*) FROM pgtaskd.tasks WHERE queue = $1 AND status = 'SUCCEEDED'",
                    &[&queue],
                )
                .await?
                .get(0);
            if done as usize >= n {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            return Err(BenchError::TooLong(RUN_LIMIT));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Seconds from `started` (this process's clock) to the last `finished_at` of `queue` (the
/// database's clock: the same machine's).
pub(super) async fn seconds_since(
    client: &Client,
    queue: &str,
    started: chrono::DateTime<chrono::Utc>,
) -> Result<f64, BenchError> {
    let last: chrono::DateTime<chrono::Utc> = client
        .query_one(
            "SELECT max(finished_at) FROM pgtaskd.tasks WHERE queue = $1",
            &[&queue],
        )
        .await?
        .get(0);
    Ok((last - started).num_microseconds().unwrap_or(0) as f64 / 1e6)
}

/// Latency mode: warm-up, then one task at a time, 20 ms apart; the latency of a task is
/// from just before its INSERT to the daemon's [`crate::events::ANALYZER_RUN`] event for it.
pub(super) async fn latencies(
    client: &Client,
    queue: &str,
    texts: &[String],
    daemon: &Daemon,
) -> Result<Latency, BenchError> {
    let insert = client
        .prepare("INSERT INTO pgtaskd.tasks (queue, payload) VALUES ($1, $2) RETURNING id")
        .await?;
    let count = texts.len();
    let mut sent = Vec::with_capacity(count);
    for (i, text) in texts.iter().take(count).enumerate() {
        let before = chrono::Utc::now();
        let id: i64 = client.query_one(&insert, &[&queue, text]).await?.get(0);
        if i >= WARM_UP {
            sent.push((id, before));
        }
        tokio::time::sleep(LATENCY_GAP).await;
    }
    wait_done(client, queue, count).await?;
    let mut starts = AnalyzerStarts::default();
    let mut millis = Vec::with_capacity(sent.len());
    for (id, before) in sent {
        let started = starts.of(daemon, id).await?;
        millis.push((started - before).num_microseconds().unwrap_or(0) as f64 / 1000.0);
    }
    Ok(Latency::of(millis))
}

/// A session of the bench's own that `LISTEN`s on `channels`, its messages forwarded as the
/// daemon's listener forwards them; the session lives while the client and the pump do.
pub(super) async fn listening(
    settings: &ConnectSettings,
    channels: &[&str],
) -> Result<(Client, mpsc::Receiver<AsyncMessage>, listen::AbortOnDrop), BenchError> {
    let (session, connection) = settings
        .config()
        .connect(settings.tls())
        .await
        .map_err(DbError::from)?;
    let (messages, pump) = listen::forward_messages(connection);
    let listens: Vec<String> = channels.iter().map(|c| format!("LISTEN {c};")).collect();
    session.batch_execute(&listens.concat()).await?;
    Ok((session, messages, pump))
}

/// The floor under the latency: the same inserts, one at a time and as far apart, with no
/// daemon running and a `LISTEN` session of the bench's own timing each notification's
/// arrival. Its rows go to a queue of their own, removed afterwards. The session flags itself
/// idle as a daemon does (`pgtaskd.idle_daemons`), so that the inserts notify; the flag is
/// removed afterwards, and expires by itself within [`FLOOR_FLAG`] if the bench is killed.
async fn notify_floor(
    settings: &ConnectSettings,
    client: &Client,
    queue: &str,
    texts: &[String],
) -> Result<Latency, BenchError> {
    let (_listener, mut messages, _pump) = listening(settings, &[listen::TASKS_CHANNEL]).await?;
    let queue = format!("{queue}-floor");
    let flag = format!("{queue}:{}", std::process::id());
    client
        .execute(
            "INSERT INTO pgtaskd.idle_daemons (instance, expires_at)
             VALUES ($1, now() + $2 * interval '1 second')
             ON CONFLICT (instance) DO UPDATE SET expires_at = excluded.expires_at",
            &[&flag, &FLOOR_FLAG.as_secs_f64()],
        )
        .await?;
    let insert = client
        .prepare("INSERT INTO pgtaskd.tasks (queue, payload) VALUES ($1, $2)")
        .await?;
    let timed = async {
        let mut millis = Vec::with_capacity(LATENCY_TASKS);
        for (i, text) in texts.iter().enumerate() {
            let before = Instant::now();
            client.execute(&insert, &[&queue, text]).await?;
            let notified = async {
                loop {
                    match messages.recv().await {
                        Some(AsyncMessage::Notification(_)) => return Some(Instant::now()),
                        Some(_) => {}
                        None => return None,
                    }
                }
            };
            let arrived = tokio::time::timeout(NOTIFY_WAIT, notified)
                .await
                .ok()
                .flatten()
                .ok_or(BenchError::NoNotification)?;
            if i >= WARM_UP {
                millis.push((arrived - before).as_micros() as f64 / 1000.0);
            }
            tokio::time::sleep(LATENCY_GAP).await;
        }
        Ok::<_, BenchError>(millis)
    }
    .await;
    client
        .execute(
            "DELETE FROM pgtaskd.idle_daemons WHERE instance = $1",
            &[&flag],
        )
        .await?;
    delete_rows(client, &queue).await?;
    Ok(Latency::of(timed?))
}
