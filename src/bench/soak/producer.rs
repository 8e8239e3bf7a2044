//! The soak's producer, a rate controller: every [`INSERT_TICK`], one statement with the rows
//! that `rate × elapsed` says are owed, so that a slow statement is caught up at the next
//! tick rather than lost; how far behind it fell is part of the figures.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_postgres::Client;

use super::TEXTS;
use crate::bench::sql;
use crate::bench::BenchError;

/// How often the producer inserts: `rate × INSERT_TICK` rows per statement.
pub(super) const INSERT_TICK: Duration = Duration::from_millis(10);

/// The producer: every [`INSERT_TICK`], one statement with the rows the schedule is owed.
/// Returns the furthest it fell behind, in seconds of inserts.
pub(super) async fn produce(
    session: Client,
    queue: String,
    texts: Arc<Vec<String>>,
    rate: f64,
    duration: Duration,
    inserted: Arc<AtomicU64>,
) -> Result<f64, BenchError> {
    let statement = session.prepare(sql::INSERT_MANY).await?;
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
