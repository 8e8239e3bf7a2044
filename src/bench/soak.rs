//! Soak mode: a steady producer for a long time, with retention on at a short window, so that
//! what the table does over hours shows: whether its size levels off, whether autovacuum keeps
//! up, whether throughput and latency stay where they started, and, with `--hold-snapshot`,
//! what a transaction holding the xmin horizon does to all of that and how long the queue
//! takes to recover. Called by [`super::run`].
//!
//! Three sessions of the bench's own run beside the daemon under test (started with
//! `retention.finished_after` = [`SOAK_RETENTION`]):
//!
//! - the producer inserts `rate × elapsed` tasks in all, one statement every [`INSERT_TICK`],
//!   task `k` of the run getting the workload's text `k mod 20,000`;
//! - the sampler, every [`SAMPLE`] (or half a period when periods are shorter), reads the
//!   backlog (counted from the oldest QUEUED id it saw last: see [`look`]), the table's sizes,
//!   dead tuples and autovacuum count, and the rows that finished
//!   since its last read and at least [`LAG`] ago (a finish's `finished_at` is its
//!   transaction's start, so a row may commit after rows with later stamps; the lag, beyond
//!   the daemon's statement timeout, lets every such commit land before its stamp is read).
//!   Each row is read once, before retention (a window of a minute) deletes it: its status,
//!   its counts and its latency (`finished_at - created_at`) are kept;
//! - with a hold, a `REPEATABLE READ` transaction opened at `(duration - hold) / 2`, which
//!   reads the backlog (so that its snapshot is taken) and commits `hold` later.
//!
//! After `duration` the producer stops, the daemon finishes the backlog, and the sampler reads
//! what is left. Nothing is lost when the rows read are as many as the tasks inserted, every
//! one SUCCEEDED, and their counts sum to the texts' check totals; otherwise the run is
//! refused as any other mode's.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio_postgres::Client;

use super::daemon::Daemon;
use super::report::{nearest_rank, Report};
use super::table::{delete_rows, insert, seconds_since, vacuum, wait_done};
use super::{workload, BenchError, BenchOptions, Mode, POLL, RUN_LIMIT};
use crate::analyzer::analyze;
use crate::config::Config;
use crate::db::ConnectSettings;

/// The daemon's `retention.finished_after` during a soak: short, so that the table reaches a
/// steady population after about two windows.
pub const SOAK_RETENTION: Duration = Duration::from_secs(60);
/// How often the producer inserts: `rate × INSERT_TICK` rows per statement.
const INSERT_TICK: Duration = Duration::from_millis(10);
/// How often the sampler looks at the table (at most: half a period when periods are shorter).
const SAMPLE: Duration = Duration::from_secs(1);
/// How old a finish must be before the sampler reads it: longer than the daemon's
/// `database.statement_timeout` (30 s, the bench's daemon runs the default), the longest the
/// one-statement transaction of a finish can last, and well under [`SOAK_RETENTION`].
const LAG: Duration = Duration::from_secs(35);
/// The texts cycled through: task `k` gets `gen_text(k % TEXTS)`.
const TEXTS: u32 = 20_000;
/// The tasks of the short drain that sets the default rate.
const PROBE_TASKS: u32 = 20_000;
/// One sample in this many counts the backlog from the start of the queue (see [`look`]).
const FULL_COUNT_EVERY: usize = 30;
/// The window over which recovery after a hold is judged.
const RECOVERY_WINDOW: Duration = Duration::from_secs(10);
/// Within how much of the before-the-hold figure p99 and backlog count as recovered.
const RECOVERED: f64 = 1.10;

/// What a soak was asked to do.
#[derive(Debug, Clone, Copy)]
pub struct SoakOptions {
    /// Tasks per second; `None`: half of a short drain measured first.
    pub rate: Option<f64>,
    pub period: Duration,
    pub hold: Option<Duration>,
}

/// A soak's figures.
#[derive(Debug, Clone, Serialize)]
pub struct Soak {
    /// The target insert rate, tasks per second.
    pub rate: f64,
    /// `"given"` or `"half of drain"`.
    pub rate_source: &'static str,
    /// The short drain's tasks per second, when it set the rate.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drain_tasks_per_s: Option<f64>,
    /// Tasks inserted per second over the run, as achieved.
    pub inserted_per_s: f64,
    /// The furthest the producer fell behind its schedule, in seconds of inserts.
    pub producer_max_behind_s: f64,
    pub duration_s: f64,
    pub period_s: f64,
    /// The daemon's `retention.finished_after`, seconds.
    pub retention_s: f64,
    pub periods: Vec<Period>,
    pub summary: Summary,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hold: Option<Hold>,
    /// Tasks inserted, tasks read back finished, and of those SUCCEEDED: all three equal.
    pub inserted: u64,
    pub finished: u64,
    pub succeeded: u64,
}

/// One period's figures. Rates and latencies are of the tasks that finished in it; sizes,
/// dead tuples and autovacuum count are sampled at its end, the backlog over it.
#[derive(Debug, Clone, Serialize)]
pub struct Period {
    /// Seconds from the start of the run to the end of the period.
    pub end_s: f64,
    pub tasks_per_s: f64,
    pub inserted_per_s: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p50_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p99_ms: Option<f64>,
    /// `pg_table_size`: the heap, its free-space and visibility maps, and TOAST.
    pub table_mib: f64,
    /// The TOAST table and its index, part of `table_mib`.
    pub toast_mib: f64,
    /// `pg_indexes_size`.
    pub index_mib: f64,
    pub total_mib: f64,
    /// `pg_stat_user_tables.n_dead_tup`.
    pub dead_tuples: i64,
    /// Autovacuum runs on the table that ended in the period.
    pub autovacuums: i64,
    /// QUEUED tasks of the run: the mean and the largest of the samples in the period.
    pub backlog: f64,
    pub backlog_max: i64,
    /// A snapshot was held during some of the period.
    pub held: bool,
}

/// Last period against first, and the size after the first retention windows.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub tasks_per_s_last_over_first: Option<f64>,
    pub p99_last_over_first: Option<f64>,
    /// Seconds into the run of the period the growth is measured from: the first ending
    /// two retention windows in (the first rows are pruned after one window, the table is
    /// at its steady population after the second).
    pub steady_from_s: Option<f64>,
    pub total_mib_steady: Option<f64>,
    pub total_mib_end: f64,
    pub growth_mib_per_min: Option<f64>,
}

/// What the held snapshot did.
#[derive(Debug, Clone, Serialize)]
pub struct Hold {
    pub start_s: f64,
    pub end_s: f64,
    /// Over the 10 s before the hold started.
    pub p99_before_ms: Option<f64>,
    pub backlog_before: f64,
    pub dead_tuples_before: i64,
    pub total_mib_before: f64,
    /// The worst of each during the hold and until recovery.
    pub p99_worst_ms: Option<f64>,
    pub backlog_worst: i64,
    pub dead_tuples_worst: i64,
    pub total_mib_worst: f64,
    /// From the end of the hold to the end of the first 10 s window whose
    /// p99 and mean backlog are within 10% of before (the backlog also within one insert
    /// statement's rows); `None`: not by the end of the run.
    pub recovered_after_s: Option<f64>,
}

/// One look at the table.
#[derive(Debug, Clone, Copy)]
struct Sample {
    at_s: f64,
    inserted: u64,
    backlog: i64,
    dead_tuples: i64,
    autovacuums: i64,
    table_mib: f64,
    toast_mib: f64,
    index_mib: f64,
}

/// The finished rows read so far.
#[derive(Default)]
struct Finished {
    /// Latencies in ms, by the whole second of the run in which the task finished.
    by_second: Vec<Vec<f32>>,
    rows: u64,
    succeeded: u64,
    totals: (i64, i64, i64),
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
    client.batch_execute("SET statement_timeout = 0").await?;
    let t0: DateTime<Utc> = client
        .query_one("SELECT clock_timestamp()", &[])
        .await?
        .get(0);
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
        wal_background_bytes_per_s: None,
        drain: None,
        drain_over_ceiling: None,
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
    let t0: DateTime<Utc> = client
        .query_one("SELECT clock_timestamp()", &[])
        .await?
        .get(0);
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
/// meanwhile as the sampler does (at least [`LAG`] after their finish): a backlog left at the
/// end of an overloaded run may take longer than the retention window to drain, and retention
/// would delete rows that were never read.
async fn wait_idle(
    client: &Client,
    queue: &str,
    t0: DateTime<Utc>,
    read_from: &mut DateTime<Utc>,
    finished: &mut Finished,
) -> Result<(), BenchError> {
    let deadline = Instant::now() + RUN_LIMIT;
    loop {
        let row = client
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM pgtaskd.tasks WHERE queue = $1 AND status = 'QUEUED')
                     OR EXISTS (SELECT 1 FROM pgtaskd.tasks WHERE queue = $1 AND status = 'RUNNING'),
                        now()",
                &[&queue],
            )
            .await?;
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

/// The producer: every [`INSERT_TICK`], one statement with the rows the schedule is owed.
/// Returns the furthest it fell behind, in seconds of inserts.
async fn produce(
    session: Client,
    queue: String,
    texts: Arc<Vec<String>>,
    rate: f64,
    duration: Duration,
    inserted: Arc<AtomicU64>,
) -> Result<f64, BenchError> {
    let statement = session
        .prepare("INSERT INTO pgtaskd.tasks (queue, payload) SELECT $1, unnest($2::text[])")
        .await?;
    let started = Instant::now();
    let mut interval = tokio::time::interval(INSERT_TICK);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut done = 0u64;
    let mut behind = 0.0f64;
    loop {
        interval.tick().await;
        let elapsed = started.elapsed().min(duration);
        let due = (rate * elapsed.as_secs_f64()) as u64;
        if due > done {
            behind = behind.max((due - done) as f64 / rate - INSERT_TICK.as_secs_f64());
            let batch: Vec<&str> = (done..due)
                .map(|k| texts[(k % u64::from(TEXTS)) as usize].as_str())
                .collect();
            session.execute(&statement, &[&queue, &batch]).await?;
            done = due;
            inserted.store(done, Ordering::SeqCst);
        }
        if elapsed >= duration {
            return Ok(behind.max(0.0));
        }
    }
}

/// The hold: wait `after`, open a REPEATABLE READ transaction, read (its snapshot is taken
/// then), keep it open for `hold`, commit. Returns when it began and ended, in seconds of the
/// run.
async fn hold_snapshot(
    mut session: Client,
    queue: String,
    started: Instant,
    after: Duration,
    hold: Duration,
) -> Result<(f64, f64), BenchError> {
    tokio::time::sleep_until((started + after).into()).await;
    // The bench's sessions carry the daemon's deadlines, whose idle-in-transaction timeout
    // (a minute) would end a longer hold by closing the session.
    session
        .batch_execute("SET idle_in_transaction_session_timeout = 0")
        .await?;
    let tx = session
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .start()
        .await?;
    tx.query_one(
        "SELECT count(*) FROM pgtaskd.tasks WHERE queue = $1 AND status = 'QUEUED'",
        &[&queue],
    )
    .await?;
    let begun = started.elapsed().as_secs_f64();
    tokio::time::sleep(hold).await;
    tx.commit().await?;
    Ok((begun, started.elapsed().as_secs_f64()))
}

/// One sample, and the database's clock when it was taken.
///
/// The backlog is counted from `backlog_from`, the oldest QUEUED id the last sample saw, which
/// it moves on: a count from the start of the claim index would walk the entries of every task
/// claimed since a held snapshot began (the cost the daemon's claims after a position avoid),
/// once a second, and the bench would load the server it measures. The producer is one
/// session inserting in id order, at priority 0, so no new task lands below it; a task the
/// daemon gives back (a lease rescued, the tasks of a claim whose answer was lost) keeps its
/// old id and is missed until the next count from the start: the caller sets `backlog_from`
/// to 0 every [`FULL_COUNT_EVERY`] samples.
async fn look(
    client: &Client,
    queue: &str,
    t0: DateTime<Utc>,
    inserted: u64,
    backlog_from: &mut i64,
) -> Result<(Sample, DateTime<Utc>), BenchError> {
    let row = client
        .query_one(
            "SELECT clock_timestamp(), b.n, b.oldest,
                    coalesce(s.n_dead_tup, 0), coalesce(s.autovacuum_count, 0),
                    pg_table_size(c.oid), coalesce(pg_total_relation_size(nullif(c.reltoastrelid, 0)), 0),
                    pg_indexes_size(c.oid)
               FROM pg_class c LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid,
                    LATERAL (SELECT count(*) AS n, min(id) AS oldest FROM pgtaskd.tasks
                              WHERE queue = $1 AND priority = 0 AND id >= $2
                                AND status = 'QUEUED') b
              WHERE c.oid = 'pgtaskd.tasks'::regclass",
            &[&queue, &*backlog_from],
        )
        .await?;
    if let Some(oldest) = row.get::<_, Option<i64>>(2) {
        *backlog_from = oldest;
    }
    let at: DateTime<Utc> = row.get(0);
    let mib = |i: usize| row.get::<_, i64>(i) as f64 / (1024.0 * 1024.0);
    Ok((
        Sample {
            at_s: seconds_between(t0, at),
            inserted,
            backlog: row.get(1),
            dead_tuples: row.get(3),
            autovacuums: row.get(4),
            table_mib: mib(5),
            toast_mib: mib(6),
            index_mib: mib(7),
        },
        at,
    ))
}

/// Read the rows of `queue` that finished since `read_from` and at least [`LAG`] before
/// `now` (the database's clock), and move `read_from` on to there.
async fn read_settled(
    client: &Client,
    queue: &str,
    t0: DateTime<Utc>,
    now: DateTime<Utc>,
    read_from: &mut DateTime<Utc>,
    into: &mut Finished,
) -> Result<(), BenchError> {
    let upto = now - chrono::Duration::from_std(LAG).unwrap_or_default();
    if upto > *read_from {
        read_finished(client, queue, t0, *read_from, Some(upto), into).await?;
        *read_from = upto;
    }
    Ok(())
}

/// Read the rows of `queue` that finished in `[from, upto)` (`upto` `None`: from `from` on).
async fn read_finished(
    client: &Client,
    queue: &str,
    t0: DateTime<Utc>,
    from: DateTime<Utc>,
    upto: Option<DateTime<Utc>>,
    into: &mut Finished,
) -> Result<(), BenchError> {
    let rows = client
        .query(
            "SELECT extract(epoch FROM finished_at - $2)::float8,
                    (extract(epoch FROM finished_at - created_at) * 1000)::float8,
                    status = 'SUCCEEDED', words, bytes, runes
               FROM pgtaskd.tasks
              WHERE queue = $1 AND finished_at >= $3
                AND ($4::timestamptz IS NULL OR finished_at < $4)",
            &[&queue, &t0, &from, &upto],
        )
        .await?;
    for row in rows {
        let second = row.get::<_, f64>(0).max(0.0) as usize;
        if into.by_second.len() <= second {
            into.by_second.resize_with(second + 1, Vec::new);
        }
        into.by_second[second].push(row.get::<_, f64>(1) as f32);
        into.rows += 1;
        if row.get::<_, bool>(2) {
            into.succeeded += 1;
        }
        let (w, b, r) = into.totals;
        into.totals = (
            w + row.get::<_, i64>(3),
            b + row.get::<_, i64>(4),
            r + row.get::<_, i64>(5),
        );
    }
    Ok(())
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

fn seconds_between(from: DateTime<Utc>, to: DateTime<Utc>) -> f64 {
    (to - from).num_microseconds().unwrap_or(0) as f64 / 1e6
}

/// Latencies of the tasks that finished in whole seconds `[from, to)`.
fn latencies(finished: &Finished, from: f64, to: f64) -> Vec<f64> {
    let (from, to) = (from.max(0.0) as usize, (to.max(0.0).ceil() as usize));
    finished
        .by_second
        .iter()
        .take(to)
        .skip(from)
        .flatten()
        .map(|&ms| f64::from(ms))
        .collect()
}

/// The nearest-rank percentile `q` of `values`, sorting them.
fn percentile(values: &mut [f64], q: f64) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    nearest_rank(values, q)
}

fn periods(
    samples: &[Sample],
    finished: &Finished,
    duration: Duration,
    period: Duration,
    hold: Option<(f64, f64)>,
) -> Vec<Period> {
    let (total, step) = (duration.as_secs_f64(), period.as_secs_f64());
    let count = (total / step).ceil() as usize;
    let mut out = Vec::with_capacity(count);
    let mut autovacuums_before = samples.first().map_or(0, |s| s.autovacuums);
    let mut inserted_before = 0;
    for i in 0..count {
        let (start, end) = (i as f64 * step, ((i + 1) as f64 * step).min(total));
        let span = end - start;
        let within: Vec<&Sample> = samples
            .iter()
            .filter(|s| s.at_s >= start && s.at_s < end + 0.5 * step.min(1.0))
            .collect();
        let Some(last) = within.last().copied().or_else(|| samples.last()) else {
            continue;
        };
        let mut millis = latencies(finished, start, end);
        let done = millis.len();
        let backlog = if within.is_empty() {
            last.backlog as f64
        } else {
            within.iter().map(|s| s.backlog as f64).sum::<f64>() / within.len() as f64
        };
        out.push(Period {
            end_s: end,
            tasks_per_s: done as f64 / span,
            inserted_per_s: last.inserted.saturating_sub(inserted_before) as f64 / span,
            p50_ms: percentile(&mut millis, 0.50),
            p99_ms: percentile(&mut millis, 0.99),
            table_mib: last.table_mib,
            toast_mib: last.toast_mib,
            index_mib: last.index_mib,
            total_mib: last.table_mib + last.index_mib,
            dead_tuples: last.dead_tuples,
            autovacuums: last.autovacuums - autovacuums_before,
            backlog,
            backlog_max: within
                .iter()
                .map(|s| s.backlog)
                .max()
                .unwrap_or(last.backlog),
            held: hold.is_some_and(|(from, to)| from < end && to > start),
        });
        autovacuums_before = last.autovacuums;
        inserted_before = last.inserted;
    }
    out
}

fn summary(periods: &[Period]) -> Summary {
    let ratio = |last: Option<f64>, first: Option<f64>| match (last, first) {
        (Some(last), Some(first)) if first > 0.0 && periods.len() > 1 => Some(last / first),
        _ => None,
    };
    let (first, last) = (periods.first(), periods.last());
    let steady = periods
        .iter()
        .find(|p| p.end_s >= 2.0 * SOAK_RETENTION.as_secs_f64());
    let total_mib_end = last.map_or(0.0, |p| p.total_mib);
    let growth = match (steady, last) {
        (Some(steady), Some(last)) if last.end_s > steady.end_s => {
            Some((last.total_mib - steady.total_mib) / (last.end_s - steady.end_s) * 60.0)
        }
        _ => None,
    };
    Summary {
        tasks_per_s_last_over_first: ratio(
            last.map(|p| p.tasks_per_s),
            first.map(|p| p.tasks_per_s),
        ),
        p99_last_over_first: ratio(last.and_then(|p| p.p99_ms), first.and_then(|p| p.p99_ms)),
        steady_from_s: steady.map(|p| p.end_s),
        total_mib_steady: steady.map(|p| p.total_mib),
        total_mib_end,
        growth_mib_per_min: growth,
    }
}

/// The hold's figures: before it (the [`RECOVERY_WINDOW`] before it began), the worst from its
/// start until recovery (or the end of the run), and the time to recover.
fn hold_figures(
    samples: &[Sample],
    finished: &Finished,
    (start, end): (f64, f64),
    duration: Duration,
    rate: f64,
) -> Hold {
    let window = RECOVERY_WINDOW.as_secs_f64();
    let in_span = |from: f64, to: f64| {
        samples
            .iter()
            .filter(move |s| s.at_s >= from && s.at_s < to)
    };
    let mean_backlog = |from: f64, to: f64| {
        let (sum, n) =
            in_span(from, to).fold((0.0, 0usize), |(sum, n), s| (sum + s.backlog as f64, n + 1));
        (n > 0).then(|| sum / n as f64)
    };
    let before_from = (start - window).max(0.0);
    let p99_before = percentile(&mut latencies(finished, before_from, start), 0.99);
    let backlog_before = mean_backlog(before_from, start).unwrap_or(0.0);
    let before = in_span(0.0, start).next_back().copied();
    // Within 10%, or within one insert statement's rows for a backlog near zero.
    let backlog_limit =
        (backlog_before * RECOVERED).max(backlog_before + rate * INSERT_TICK.as_secs_f64());
    let mut recovered = None;
    let mut t = end;
    while t + window <= duration.as_secs_f64() + 1e-9 {
        let p99 = percentile(&mut latencies(finished, t, t + window), 0.99);
        let p99_ok = match (p99, p99_before) {
            (Some(now), Some(before)) => now <= before * RECOVERED,
            _ => false,
        };
        let backlog_ok = mean_backlog(t, t + window).is_some_and(|b| b <= backlog_limit);
        if p99_ok && backlog_ok {
            recovered = Some(t + window - end);
            break;
        }
        t += 1.0;
    }
    let worst_to = recovered.map_or(duration.as_secs_f64(), |r| end + r);
    let mut worst_p99 = None;
    let mut s = start;
    while s < worst_to {
        let p99 = percentile(
            &mut latencies(finished, s, (s + window).min(worst_to)),
            0.99,
        );
        worst_p99 = match (worst_p99, p99) {
            (Some(a), Some(b)) => Some(f64::max(a, b)),
            (a, b) => a.or(b),
        };
        s += window;
    }
    let worst: Vec<&Sample> = in_span(start, worst_to + 1.0).collect();
    Hold {
        start_s: start,
        end_s: end,
        p99_before_ms: p99_before,
        backlog_before,
        dead_tuples_before: before.map_or(0, |s| s.dead_tuples),
        total_mib_before: before.map_or(0.0, |s| s.table_mib + s.index_mib),
        p99_worst_ms: worst_p99,
        backlog_worst: worst.iter().map(|s| s.backlog).max().unwrap_or(0),
        dead_tuples_worst: worst.iter().map(|s| s.dead_tuples).max().unwrap_or(0),
        total_mib_worst: worst
            .iter()
            .map(|s| s.table_mib + s.index_mib)
            .fold(0.0, f64::max),
        recovered_after_s: recovered,
    }
}

impl std::fmt::Display for Soak {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ms = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |v| format!("{v:.1}"));
        let ratio = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |v| format!("{v:.2}"));
        match self.drain_tasks_per_s {
            Some(drain) => write!(
                f,
                "  rate                 {:.0} tasks/s (half of a drain at {drain:.0} tasks/s)",
                self.rate
            )?,
            None => write!(f, "  rate                 {:.0} tasks/s (given)", self.rate)?,
        }
        writeln!(
            f,
            "; inserted {:.0}/s, the producer at most {:.2} s behind",
            self.inserted_per_s, self.producer_max_behind_s
        )?;
        writeln!(
            f,
            "  retention            finished_after {:.0} s; periods of {:.0} s over {:.0} s",
            self.retention_s, self.period_s, self.duration_s
        )?;
        writeln!(
            f,
            "  {:>7} {:>8} {:>8} {:>8} {:>8} {:>9} {:>9} {:>9} {:>10} {:>7} {:>16}",
            "end s",
            "tasks/s",
            "ins/s",
            "p50 ms",
            "p99 ms",
            "table MiB",
            "index MiB",
            "total MiB",
            "dead tup",
            "autovac",
            "backlog (max)"
        )?;
        for p in &self.periods {
            writeln!(
                f,
                "  {:>7.0} {:>8.0} {:>8.0} {:>8} {:>8} {:>9.1} {:>9.1} {:>9.1} {:>10} {:>7} {:>16}{}",
                p.end_s,
                p.tasks_per_s,
                p.inserted_per_s,
                ms(p.p50_ms),
                ms(p.p99_ms),
                p.table_mib,
                p.index_mib,
                p.total_mib,
                p.dead_tuples,
                p.autovacuums,
                format!("{:.0} ({})", p.backlog, p.backlog_max),
                if p.held { "  held" } else { "" }
            )?;
        }
        let s = &self.summary;
        write!(
            f,
            "  last / first         tasks/s {}, p99 {}",
            ratio(s.tasks_per_s_last_over_first),
            ratio(s.p99_last_over_first)
        )?;
        match (s.steady_from_s, s.total_mib_steady, s.growth_mib_per_min) {
            (Some(from), Some(steady), Some(growth)) => writeln!(
                f,
                "; size {steady:.1} MiB at {from:.0} s, {:.1} MiB at the end: {growth:+.1} MiB/min",
                s.total_mib_end
            )?,
            _ => writeln!(
                f,
                "; size {:.1} MiB at the end (no period after two retention windows)",
                s.total_mib_end
            )?,
        }
        if let Some(h) = &self.hold {
            writeln!(
                f,
                "  snapshot held        {:.0}-{:.0} s: p99 {} -> worst {} ms, backlog {:.0} -> {}, dead tuples {} -> {}, size {:.1} -> {:.1} MiB; {}",
                h.start_s,
                h.end_s,
                ms(h.p99_before_ms),
                ms(h.p99_worst_ms),
                h.backlog_before,
                h.backlog_worst,
                h.dead_tuples_before,
                h.dead_tuples_worst,
                h.total_mib_before,
                h.total_mib_worst,
                h.recovered_after_s.map_or_else(
                    || "not recovered by the end".to_string(),
                    |r| format!("recovered {r:.0} s after its end")
                )
            )?;
        }
        writeln!(
            f,
            "  nothing lost         {} inserted, {} finished, {} SUCCEEDED",
            self.inserted, self.finished, self.succeeded
        )
    }
}
