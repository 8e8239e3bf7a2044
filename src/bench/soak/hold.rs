//! The soak's snapshot holder: a `REPEATABLE READ` transaction opened in the middle of the
//! run and kept open for `--hold-snapshot`, holding back the xmin horizon as a forgotten
//! session would.

use std::time::{Duration, Instant};

use tokio_postgres::Client;

use crate::bench::sql;
use crate::bench::BenchError;

/// The hold: wait `after`, open a REPEATABLE READ transaction, read (its snapshot is taken
/// then), keep it open for `hold`, commit. Returns when it began and ended, in seconds of the
/// run.
pub(super) async fn hold_snapshot(
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
        .batch_execute(sql::NO_IDLE_IN_TRANSACTION_TIMEOUT)
        .await?;
    let tx = session
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .start()
        .await?;
    tx.query_one(sql::QUEUED, &[&queue]).await?;
    let begun = started.elapsed().as_secs_f64();
    tokio::time::sleep(hold).await;
    tx.commit().await?;
    Ok((begun, started.elapsed().as_secs_f64()))
}
