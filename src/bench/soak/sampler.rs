//! The soak's sampler: a look at the table every [`SAMPLE`] (its backlog, sizes, dead tuples
//! and autovacuums), and the rows that finished, each read once, at least [`LAG`] after its
//! finish and before retention deletes it.

use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_postgres::Client;

use crate::bench::sql;
use crate::bench::BenchError;

/// How often the sampler looks at the table (at most: half a period when periods are shorter).
pub(super) const SAMPLE: Duration = Duration::from_secs(1);

/// How old a finish must be before the sampler reads it: longer than the daemon's
/// `database.statement_timeout` (30 s, the bench's daemon runs the default), the longest the
/// one-statement transaction of a finish can last, and well under [`super::SOAK_RETENTION`].
pub(super) const LAG: Duration = Duration::from_secs(35);

/// One sample in this many counts the backlog from the start of the queue (see [`look`]).
pub(super) const FULL_COUNT_EVERY: usize = 30;

/// One look at the table.
#[derive(Debug, Clone, Copy)]
pub(super) struct Sample {
    pub(super) at_s: f64,
    pub(super) inserted: u64,
    pub(super) backlog: i64,
    pub(super) dead_tuples: i64,
    pub(super) autovacuums: i64,
    pub(super) table_mib: f64,
    pub(super) toast_mib: f64,
    pub(super) index_mib: f64,
}

/// The finished rows read so far.
#[derive(Default)]
pub(super) struct Finished {
    /// Latencies in ms, by the whole second of the run in which the task finished.
    pub(super) by_second: Vec<Vec<f32>>,
    pub(super) rows: u64,
    pub(super) succeeded: u64,
    pub(super) totals: (i64, i64, i64),
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
pub(super) async fn look(
    client: &Client,
    queue: &str,
    t0: DateTime<Utc>,
    inserted: u64,
    backlog_from: &mut i64,
) -> Result<(Sample, DateTime<Utc>), BenchError> {
    let row = client
        .query_one(sql::SAMPLE, &[&queue, &*backlog_from])
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
pub(super) async fn read_settled(
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
pub(super) async fn read_finished(
    client: &Client,
    queue: &str,
    t0: DateTime<Utc>,
    from: DateTime<Utc>,
    upto: Option<DateTime<Utc>>,
    into: &mut Finished,
) -> Result<(), BenchError> {
    let rows = client
        .query(sql::FINISHED, &[&queue, &t0, &from, &upto])
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

fn seconds_between(from: DateTime<Utc>, to: DateTime<Utc>) -> f64 {
    (to - from).num_microseconds().unwrap_or(0) as f64 / 1e6
}
