//! The bench's operations on the task table, shared by every mode: insert the workload's
//! texts, wait until a queue is done, time its last finish, remove its rows, vacuum; and the
//! server's WAL position, for the WAL written per task. Depends on nothing else in the bench
//! but its error and limits.

use std::time::Instant;

use tokio_postgres::Client;

use super::sql;
use super::{BenchError, POLL, RUN_LIMIT, WAL_BACKGROUND};

/// Insert `texts` into `queue`, one task each, in one statement.
pub(super) async fn insert(
    client: &Client,
    queue: &str,
    texts: &[String],
) -> Result<(), BenchError> {
    client.execute(sql::INSERT_MANY, &[&queue, &texts]).await?;
    Ok(())
}

/// Remove every row of the run's `queue`.
pub(super) async fn delete_rows(client: &Client, queue: &str) -> Result<(), BenchError> {
    client.execute(sql::DELETE_ROWS, &[&queue]).await?;
    Ok(())
}

/// `VACUUM (ANALYZE)` the task table, as docs/benchmark.md asks before each run. A role that
/// does not own the table gets a warning from the server and nothing is done.
pub(super) async fn vacuum(client: &Client) -> Result<(), BenchError> {
    client.batch_execute(sql::VACUUM).await?;
    Ok(())
}

/// Wait until no task of `queue` is QUEUED or RUNNING and `n` are SUCCEEDED. The check is an
/// `EXISTS` on the partial indexes, cheap enough not to slow the run it watches.
pub(super) async fn wait_done(client: &Client, queue: &str, n: usize) -> Result<(), BenchError> {
    let deadline = Instant::now() + RUN_LIMIT;
    loop {
        let busy: bool = client.query_one(sql::BUSY, &[&queue]).await?.get(0);
        if !busy {
            let done: i64 = client.query_one(sql::SUCCEEDED, &[&queue]).await?.get(0);
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
    let last: chrono::DateTime<chrono::Utc> =
        client.query_one(sql::LAST_FINISH, &[&queue]).await?.get(0);
    Ok((last - started).num_microseconds().unwrap_or(0) as f64 / 1e6)
}

/// The server's current WAL position, in bytes from the start: the whole cluster's, every
/// database's writes included.
pub(super) async fn wal_position(client: &Client) -> Result<i64, BenchError> {
    Ok(client.query_one(sql::WAL_POSITION, &[]).await?.get(0))
}

/// WAL bytes per second that the cluster writes with no run going on, over
/// [`WAL_BACKGROUND`]: what other databases and sessions add to a run's WAL figure.
pub(super) async fn wal_background(client: &Client) -> Result<f64, BenchError> {
    let from = wal_position(client).await?;
    let started = Instant::now();
    tokio::time::sleep(WAL_BACKGROUND).await;
    let bytes = wal_position(client).await? - from;
    Ok(bytes as f64 / started.elapsed().as_secs_f64())
}
