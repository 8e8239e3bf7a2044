//! Soak mode: a steady producer for a long time, with retention on at a short window, so that
//! what the table does over hours shows: whether its size levels off, whether autovacuum keeps
//! up, whether throughput and latency stay where they started, and, with `--hold-snapshot`,
//! what a transaction holding the xmin horizon does to all of that and how long the queue
//! takes to recover. Called by [`super::run`].
//!
//! Three sessions of the bench's own run beside the daemon under test (started with
//! `retention.finished_after` = [`SOAK_RETENTION`]):
//!
//! - the producer inserts `rate × elapsed` tasks in all, one statement every
//!   [`producer::INSERT_TICK`], task `k` of the run getting the workload's text `k mod 20,000`;
//! - the sampler, every [`sampler::SAMPLE`] (or half a period when periods are shorter), reads
//!   the backlog (counted from the oldest QUEUED id it saw last: see [`sampler::look`]), the
//!   table's sizes, dead tuples and autovacuum count, and the rows that finished since its last
//!   read and at least [`sampler::LAG`] ago (a finish's `finished_at` is its transaction's
//!   start, so a row may commit after rows with later stamps; the lag, beyond the daemon's
//!   statement timeout, lets every such commit land before its stamp is read).
//!   Each row is read once, before retention (a window of a minute) deletes it: its status,
//!   its counts and its latency (`finished_at - created_at`) are kept;
//! - with a hold, a `REPEATABLE READ` transaction opened at `(duration - hold) / 2`, which
//!   reads the backlog (so that its snapshot is taken) and commits `hold` later.
//!
//! After `duration` the producer stops, the daemon finishes the backlog, and the sampler reads
//! what is left. Nothing is lost when the rows read are as many as the tasks inserted, every
//! one SUCCEEDED, and their counts sum to the texts' check totals; otherwise the run is
//! refused as any other mode's.
//!
//! | module | owns |
//! | --- | --- |
//! | this one | the run: the rate, the daemon, the sessions started, the loop, the drain, the check |
//! | `producer` | the rate controller: the rows the schedule is owed, every tick |
//! | `hold` | the snapshot holder |
//! | `sampler` | the looks at the table, and the finished rows, each read once |
//! | `figures` | the periods, the summary and the hold's figures, from the samples and rows |
//!
//! The figures' types and their text form belong to the report (`super::report`, its
//! `soak.rs`).

mod figures;
mod hold;
mod producer;
mod sampler;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use tokio_postgres::Client;

use super::daemon::Daemon;
use super::report::{Report, Soak};
use super::sql;
use super::table::{delete_rows, insert, seconds_since, vacuum, wait_done};
use super::{workload, BenchError, BenchOptions, Mode, POLL, RUN_LIMIT};
use crate::analyzer::analyze;
use crate::config::Config;
use crate::db::ConnectSettings;
use figures::{hold_figures, periods, summary};
use hold::hold_snapshot;
use producer::produce;
use sampler::{look, read_finished, read_settled, Finished, Sample, FULL_COUNT_EVERY, SAMPLE};

/// The daemon's `retention.finished_after` during a soak: short, so that the table reaches a
/// steady population after about two windows.
pub const SOAK_RETENTION: Duration = Duration::from_secs(60);

/// The texts cycled through: task `k` gets `gen_text(k % TEXTS)`.
pub(super) const TEXTS: u32 = 20_000;

/// The tasks of the short drain that sets the default rate.
const PROBE_TASKS: u32 = 20_000;

/// What a soak was asked to do.
#[derive(Debug, Clone, Copy)]
pub struct SoakOptions {
    /// Tasks per second; `None`: half of a short drain measured first.
    pub rate: Option<f64>,
    pub period: Duration,
    pub hold: Option<Duration>,
}

/// Run the soak; returns the report, or refuses the run when a task is missing or did not
/// succeed.
pub(super) async fn soak(
    settings: &ConnectSettings,
    client: &Client,
    config: &Config,
    queue: &str,
    options: BenchOptions,
) -> Result<Report, BenchError> {
    let soak = options.soak;
    let (rate, rate_source, drain) = match soak.rate {
        Some(rate) => (rate, "given", None),
        None => {
            let drain = probe_drain(client, config, queue, options.concurrency).await?;
            ((drain / 2.0).floor().max(1.0), "half of drain", Some(drain))
        }
    };
    let duration = options.duration;
    if let Some(hold) = soak.hold {
        if hold >= duration {
            return Err(BenchError::Session(format!(
                "--hold-snapshot {hold:?} must be shorter than --duration {duration:?}"
            )));
        }
    }
    let texts: Arc<Vec<String>> = Arc::new((0..TEXTS).map(workload::gen_text).collect());
    let daemon = Daemon::start_with(
        config,
        queue,
        options.concurrency,
        false,
        &format!(
            "[retention]\nfinished_after = \"{}s\"\n",
            SOAK_RETENTION.as_secs()
        ),
    )?;
    daemon.wait_listening(client).await?;
    // The bench's sessions carry the daemon's deadlines. The sampler's reads of a table of
    // tens of GiB with millions of dead versions (after a held snapshot at a high rate) took
    // longer than its 30 s statement timeout, which ended a 10-minute run without figures;
    // the run's own limit bounds them instead.
    client.batch_execute(sql::NO_STATEMENT_TIMEOUT).await?;
    let t0: DateTime<Utc> = client.query_one(sql::CLOCK, &[]).await?.get(0);
    let started = Instant::now();
    let inserted = Arc::new(AtomicU64::new(0));
    let producer = tokio::spawn(produce(
        settings.connect().await?,
        queue.to_string(),
        Arc::clone(&texts),
        rate,
        duration,
        Arc::clone(&inserted),
    ));
    let holder = match soak.hold {
        Some(hold) => Some(tokio::spawn(hold_snapshot(
            settings.connect().await?,
            queue.to_string(),
            started,
            (duration - hold) / 2,
            hold,
        ))),
        None => None,
    };
    let sample_every = SAMPLE.min(soak.period / 2);
    let mut samples = Vec::new();
    let mut finished = Finished::default();
    let mut read_from = t0;
    let mut hold_span = None;
    let mut backlog_from = 0i64;
    let outcome = async {
        loop {
            if samples.len() % FULL_COUNT_EVERY == 0 {
                backlog_from = 0;
            }
            let sample = look(
                client,
                queue,
                t0,
                inserted.load(Ordering::SeqCst),
                &mut backlog_from,
            )
            .await?;
            let period = soak.period.as_secs_f64();
            if samples
                .last()
                .is_some_and(|last: &Sample| (last.at_s / period).floor() < (sample.0.at_s / period).floor())
            {
                // The figures come at the end; the table's, as they are, on the way.
                let s = &sample.0;
                eprintln!(
                    "soak: {:.0} s: {} inserted, backlog {}, table {:.1} MiB, indexes {:.1} MiB, {} dead tuples, {} autovacuums",
                    s.at_s, s.inserted, s.backlog, s.table_mib, s.index_mib, s.dead_tuples, s.autovacuums
                );
            }
            samples.push(sample.0);
            read_settled(client, queue, t0, sample.1, &mut read_from, &mut finished).await?;
            if started.elapsed() >= duration {
                break;
            }
            tokio::time::sleep(sample_every.min(duration.saturating_sub(started.elapsed()))).await;
        }
        let behind = producer
            .await
            .map_err(|err| BenchError::Session(err.to_string()))??;
        if let Some(holder) = holder {
            hold_span = Some(
                holder
                    .await
                    .map_err(|err| BenchError::Session(err.to_string()))??,
            );
        }
        Ok::<_, BenchError>(behind)
    }
    .await;
    let behind = match outcome {
        Ok(behind) => behind,
        Err(err) => {
            daemon.stop().await;
            return Err(err);
        }
    };
    let n = inserted.load(Ordering::SeqCst);
    let insert_seconds = started.elapsed().as_secs_f64().min(duration.as_secs_f64());
    wait_idle(client, queue, t0, &mut read_from, &mut finished).await?;
    let seconds = seconds_since(client, queue, t0).await?;
    let usage = daemon.usage();
    daemon.stop().await;
    read_finished(client, queue, t0, read_from, None, &mut finished).await?;
    let expected = pooled_totals(&texts, n);
    if finished.rows != n || finished.succeeded != n || finished.totals != expected {
        return Err(BenchError::Totals {
            found: finished.totals,
            expected,
            succeeded: finished.succeeded as i64,
            tasks: n as u32,
        });
    }
    let periods = periods(&samples, &finished, duration, soak.period, hold_span);
    let summary = summary(&periods);
    let hold = hold_span.map(|span| hold_figures(&samples, &finished, span, duration, rate));
    let figures = Soak {
        rate,
        rate_source,
        drain_tasks_per_s: drain,
        inserted_per_s: n as f64 / insert_seconds,
        producer_max_behind_s: behind,
        duration_s: duration.as_secs_f64(),
        period_s: soak.period.as_secs_f64(),
        retention_s: SOAK_RETENTION.as_secs_f64(),
        periods,
        summary,
        hold,
        inserted: n,
        finished: finished.rows,
        succeeded: finished.succeeded,
    };
    Ok(Report {
        max_running: None,
        mode: Mode::Soak,
        tasks: n as u32,
        concurrency: options.concurrency,
        batch: None,
        seconds,
        tasks_per_s: n as f64 / seconds,
        latency_ms: None,
        notify_floor_ms: None,
        producers: None,
        soak: Some(figures),
        daemon_cpu_s: Some(usage.cpu_s),
        daemon_cpu_s_per_1000_tasks: Some(usage.cpu_s / n.max(1) as f64 * 1000.0),
        daemon_peak_rss_mib: Some(usage.peak_rss_mib),
        daemon_idle_cpu_s_per_s: None,
        server_cpu_s: None,
        server_cpu_s_per_1000_tasks: None,
        wal_bytes_per_task: None,
        insert_wal_bytes_per_task: None,
        wal_background_bytes_per_s: None,
        drain: None,
        drain_over_ceiling: None,
        handler: None,
        check_totals: finished.totals,
    })
}

/// The default rate's drain: [`PROBE_TASKS`] inserted, a daemon started and waited for, its
/// rows deleted and the table vacuumed, so that the soak starts as a given rate's does.
async fn probe_drain(
    client: &Client,
    config: &Config,
    queue: &str,
    concurrency: usize,
) -> Result<f64, BenchError> {
    let texts: Vec<String> = (0..PROBE_TASKS).map(workload::gen_text).collect();
    insert(client, queue, &texts).await?;
    let t0: DateTime<Utc> = client.query_one(sql::CLOCK, &[]).await?.get(0);
    let daemon = Daemon::start(config, queue, concurrency, false)?;
    let done = wait_done(client, queue, texts.len()).await;
    daemon.stop().await;
    done?;
    let seconds = seconds_since(client, queue, t0).await?;
    delete_rows(client, queue).await?;
    vacuum(client).await?;
    Ok(f64::from(PROBE_TASKS) / seconds)
}

/// Wait until no task of `queue` is QUEUED or RUNNING, reading the rows that finish
/// meanwhile as the sampler does (at least [`sampler::LAG`] after their finish): a backlog
/// left at the end of an overloaded run may take longer than the retention window to drain,
/// and retention would delete rows that were never read.
async fn wait_idle(
    client: &Client,
    queue: &str,
    t0: DateTime<Utc>,
    read_from: &mut DateTime<Utc>,
    finished: &mut Finished,
) -> Result<(), BenchError> {
    let deadline = Instant::now() + RUN_LIMIT;
    loop {
        let row = client.query_one(sql::BUSY_AND_NOW, &[&queue]).await?;
        let busy: bool = row.get(0);
        if !busy {
            return Ok(());
        }
        read_settled(client, queue, t0, row.get(1), read_from, finished).await?;
        if Instant::now() > deadline {
            return Err(BenchError::TooLong(RUN_LIMIT));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The check totals of `n` tasks whose texts cycle through `texts`.
fn pooled_totals(texts: &[String], n: u64) -> (i64, i64, i64) {
    let per_text: Vec<(i64, i64, i64)> = texts
        .iter()
        .map(|text| {
            let c = analyze(text);
            (c.words, c.bytes, c.runes)
        })
        .collect();
    let sum = |upto: usize| {
        per_text[..upto]
            .iter()
            .fold((0, 0, 0), |(w, b, r), c| (w + c.0, b + c.1, r + c.2))
    };
    let (whole, rest) = (n / texts.len() as u64, (n % texts.len() as u64) as usize);
    let (all, part) = (sum(texts.len()), sum(rest));
    let whole = whole as i64;
    (
        all.0 * whole + part.0,
        all.1 * whole + part.1,
        all.2 * whole + part.2,
    )
}
