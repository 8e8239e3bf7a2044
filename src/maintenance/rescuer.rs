//! The rescuer: every daemon looks, on a jittered tick, for RUNNING tasks whose lease
//! expired (their daemon crashed, froze or lost the database) and takes them back
//! (docs/design.md, "Nothing lost"): QUEUED again while attempts remain, FAILED after
//! `max_attempts`, CANCELED when a cancel was requested. It then wakes the daemons.
//! Concurrent rescuers skip each other's rows, so many daemons never fight.
//!
//! Settle before rescuing (docs/design.md): a rescuer never takes back its own daemon's
//! claims, and after it lost the database it waits one lease from the moment the database
//! answers again before it takes back anything. Every daemon lost the database with it, and
//! a live one extends its leases (a third of a lease) and commits the results it held
//! within that lease; only the claims of daemons that did not come back are then expired.
//! "Answers" means takes a rescue: each rescue statement, and the probe while the rescuer
//! waits, waits for `pgtaskd.task_state` at most a quarter of a lease (at most 1 s), so that a
//! lock another transaction holds on the table, which blocks every daemon's heartbeat and
//! finish, counts as the database being away, not as leases that expired.
//!
//! A full disk is the database away too: while this daemon's heartbeats or finishes are
//! refused for want of room (counted by [`Metrics::refused_for_room`]), or it holds results
//! so refused, the other daemons' are refused as well, though a rescue's small writes may
//! still fit; the rescuer takes back nothing until a lease after its first tick that saw no
//! new refusal and no result held.
//!
//! Each rescue first writes the results that stopped daemons parked for claims whose leases
//! expired (`pgtaskd.write_parked`, docs/design.md "Parked results"): those tasks end with the
//! result their daemon computed, and the rescue passes over them.
//!
//! Each task a rescue ends FAILED (its last lease ran out, or its parked result failed) gets
//! its INFO line (`events::TASK_FAILED`) once the rescue has committed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::backoff::jitter;
use tokio_postgres::error::SqlState;

use crate::db::{DbError, Pool, Session};
use crate::events;
use crate::metrics::Metrics;
use crate::queue::{self, TaskStatus};

/// The most rows one rescue statement takes back.
const BATCH: i64 = 500;

/// How often to look: half a lease, between 100 ms and 30 s.
pub fn interval(lease: Duration) -> Duration {
    (lease / 2).clamp(Duration::from_millis(100), Duration::from_secs(30))
}

/// Rescue on every tick until `stop` fires.
pub async fn run(
    pool: Pool,
    instance: String,
    lease: Duration,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) {
    let period = interval(lease);
    let mut gate = Gate::Open;
    let mut refusals_seen = metrics.refused_for_room_count();
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(jitter(period)) => {}
        }
        let now = Instant::now();
        // This daemon's writes refused for want of room since the last look, or results it
        // still holds for room (their tries come a turn apart, up to 5 s, longer than a
        // short lease): the other daemons' heartbeats and finishes are refused too, though
        // a rescue may fit.
        let refusals = metrics.refused_for_room_count();
        if refusals != refusals_seen || metrics.held_for_room_count() > 0 {
            refusals_seen = refusals;
            if gate != Gate::Down {
                tracing::warn!(
                    "the database refuses writes for want of room; expired leases are taken back one lease after it takes them again"
                );
                gate = Gate::Down;
            }
            continue;
        }
        let result = if gate.allows(now, lease) {
            run_once(&pool, &instance, lease).await.map(|rescued| {
                metrics.rescued(rescued);
            })
        } else {
            probe(&pool, &instance, lease).await
        };
        match (result, &gate) {
            (Ok(()), Gate::Down) => {
                tracing::info!(
                    wait = ?lease,
                    "database answering again; expired leases are taken back after one lease, once live daemons have extended theirs"
                );
                gate = Gate::Since(now);
            }
            (Ok(()), _) => {}
            (Err(err), Gate::Down) => tracing::debug!(error = %err, "rescuer could not run"),
            (Err(err), _) if err.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => {
                tracing::warn!(
                    error = %err,
                    "pgtaskd.task_state is locked by another transaction; expired leases are taken back one lease after it is free"
                );
                gate = Gate::Down;
            }
            (Err(err), _) => {
                tracing::warn!(error = %err, "rescuer could not run; it waits for the database");
                gate = Gate::Down;
            }
        }
    }
}

/// Whether the rescuer may take leases back: not while the database is away, and not until
/// it has answered for one lease since.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Gate {
    /// No outage seen.
    Open,
    /// The last try failed.
    Down,
    /// Answering again since then.
    Since(Instant),
}

impl Gate {
    fn allows(&self, now: Instant, lease: Duration) -> bool {
        match self {
            Gate::Open => true,
            Gate::Down => false,
            Gate::Since(since) => now.duration_since(*since) >= lease,
        }
    }
}

/// Whether the database would take a rescue now: the rescue's statement taking nothing
/// (`LIMIT 0`), which still waits for the table as a rescue would, within [`lock_wait`]. A
/// plain `SELECT 1` answers while another transaction holds `pgtaskd.task_state` locked, which
/// blocks every daemon's heartbeat and finish too.
async fn probe(pool: &Pool, instance: &str, lease: Duration) -> Result<(), DbError> {
    let client = pool.get().await?;
    rescue_within(&client, 0, instance, lease).await?;
    Ok(())
}

/// How long a rescue waits for a lock on `pgtaskd.task_state` before it gives up: a quarter of
/// a lease, between 10 ms and 1 s. A rescue queued behind a long lock (a producer's `LOCK
/// TABLE`, an index built in an open transaction) would run the moment it goes, before the
/// live daemons' heartbeats and finishes, blocked as long, have landed.
fn lock_wait(lease: Duration) -> Duration {
    (lease / 4).clamp(Duration::from_millis(10), Duration::from_secs(1))
}

/// What one rescue took: the parked results it wrote, the leases it took back, and the
/// tasks either ended FAILED (`queue`, `attempt`, `error`), read before its commit and
/// logged after it.
struct Taken {
    unparked: Vec<queue::Unparked>,
    rescued: Vec<queue::Rescued>,
    failed: Vec<(i64, String, i32, String)>,
}

/// The queue, attempt and error of the tasks `ids`, for their [`events::TASK_FAILED`]
/// lines; read in the rescue's transaction, only when it ended some FAILED.
async fn failed_ends(
    client: &Session,
    ids: &[i64],
) -> Result<Vec<(i64, String, i32, String)>, DbError> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let rows = client
        .query_typed(
            "SELECT id, queue, attempt, coalesce(error, '') FROM pgtaskd.task_state \
              WHERE id = ANY($1) ORDER BY id",
            &[(&ids, tokio_postgres::types::Type::INT8_ARRAY)],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|row| (row.get(0), row.get(1), row.get(2), row.get(3)))
        .collect())
}

/// One rescue taking back at most `limit` leases, after writing at most `limit` parked
/// results, in a transaction of its own whose `lock_timeout` is [`lock_wait`].
async fn rescue_within(
    client: &Session,
    limit: i64,
    instance: &str,
    lease: Duration,
) -> Result<Taken, DbError> {
    let begin = format!(
        "BEGIN; SET LOCAL lock_timeout = {}",
        lock_wait(lease).as_millis()
    );
    client
        .bounded(async {
            client.batch_execute(&begin).await?;
            let taken = async {
                let owner = queue::lease_key(instance);
                let unparked = queue::write_parked(client, limit, owner).await?;
                let rescued = queue::rescue(client, limit, owner).await?;
                let ids: Vec<i64> = unparked
                    .iter()
                    .map(|task| (task.id, task.status))
                    .chain(rescued.iter().map(|task| (task.id, task.status)))
                    .filter_map(|(id, status)| (status == TaskStatus::Failed).then_some(id))
                    .collect();
                let failed = failed_ends(client, &ids).await?;
                Ok::<_, DbError>(Taken {
                    unparked,
                    rescued,
                    failed,
                })
            }
            .await;
            match taken {
                Ok(taken) => {
                    client.batch_execute("COMMIT").await?;
                    Ok(taken)
                }
                Err(err) => {
                    client.batch_execute("ROLLBACK").await?;
                    Err(err)
                }
            }
        })
        .await
}

/// Take back every expired lease now; returns how many tasks were taken back.
///
/// # Errors
///
/// Database failures.
pub async fn run_once(pool: &Pool, instance: &str, lease: Duration) -> Result<usize, DbError> {
    let client = pool.get().await?;
    let mut total = 0;
    let mut by_status = [0usize; 3];
    let mut owners = std::collections::BTreeSet::new();
    let result = loop {
        let Taken {
            unparked,
            rescued,
            failed,
        } = match rescue_within(&client, BATCH, instance, lease).await {
            Ok(taken) => taken,
            Err(err) => break Err(err),
        };
        for (id, queue, attempt, error) in &failed {
            events::task_failed(*id, queue, *attempt, error);
        }
        if !unparked.is_empty() {
            tracing::info!(
                tasks = unparked.len(),
                ids = ?unparked.iter().map(|task| task.id).take(10).collect::<Vec<_>>(),
                written_by = instance,
                "results parked by a stopped daemon written"
            );
        }
        for task in &rescued {
            by_status[match task.status {
                TaskStatus::Queued => 0,
                TaskStatus::Failed => 1,
                _ => 2,
            }] += 1;
            if owners.len() < 5 {
                owners.insert(task.previous_owner.clone().unwrap_or_default());
            }
            tracing::debug!(
                id = task.id,
                attempt = task.attempt,
                previous_owner = task.previous_owner.as_deref().unwrap_or(""),
                status = %task.status,
                rescued_by = instance,
                "lease expired; task rescued"
            );
        }
        total += rescued.len();
        if rescued.iter().any(|t| t.status == TaskStatus::Queued) {
            if let Err(err) = client.bounded(queue::notify_tasks(&client)).await {
                break Err(err);
            }
        }
        if (rescued.len() as i64) < BATCH && (unparked.len() as i64) < BATCH {
            break Ok(total);
        }
    };
    if total > 0 {
        // One line for the whole run; each task's is at debug level.
        tracing::warn!(
            tasks = total,
            queued = by_status[0],
            failed = by_status[1],
            canceled = by_status[2],
            previous_owners = ?owners,
            rescued_by = instance,
            "leases expired; tasks rescued"
        );
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn after_an_outage_leases_are_taken_back_only_once_the_database_answered_for_a_lease() {
        let lease = Duration::from_secs(5);
        let t0 = Instant::now();
        assert!(Gate::Open.allows(t0, lease));
        assert!(!Gate::Down.allows(t0, lease));
        let back = Gate::Since(t0);
        assert!(!back.allows(t0, lease));
        assert!(!back.allows(t0 + Duration::from_millis(4_999), lease));
        assert!(back.allows(t0 + lease, lease));
    }

    #[test]
    fn interval_is_half_a_lease_within_bounds() {
        assert_eq!(interval(Duration::from_secs(30)), Duration::from_secs(15));
        assert_eq!(
            interval(Duration::from_millis(50)),
            Duration::from_millis(100)
        );
        assert_eq!(interval(Duration::from_secs(600)), Duration::from_secs(30));
    }
}
