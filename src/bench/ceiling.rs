//! Ceiling mode: what the database reaches through pgtaskd's own claim and finish functions
//! with no daemon and no analyzer. The backlog is inserted and its counts computed before the
//! clock starts; then [`CEILING_SESSIONS`] sessions each claim up to [`CEILING_BATCH`] tasks
//! with [`queue::claim_within`] and finish the same rows SUCCEEDED with
//! [`queue::finish_many`] (a row another session's claim held locked is finished again alone,
//! waiting), until nothing is left to claim. Called by [`super::run`].

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_postgres::Client;

use super::sql;
use super::{proc, BenchError, CEILING_BATCH, CEILING_SESSIONS, RUN_LIMIT};
use crate::analyzer::{analyze, Counts};
use crate::db::ConnectSettings;
use crate::queue::{self, ClaimLimits, Finish, FinishError, Outcome};

/// Every claim's lease: longer than any run.
const LEASE: Duration = Duration::from_secs(3600);

/// What a ceiling run measured.
pub(super) struct Measured {
    /// From the first claim to the last finish.
    pub(super) seconds: f64,
    /// CPU seconds of the sessions' server backends over the same span, when the server runs on
    /// this machine.
    pub(super) server_cpu_s: Option<f64>,
}

/// Claim and finish every task of `queue` (already inserted).
pub(super) async fn ceiling(
    settings: &ConnectSettings,
    client: &Client,
    queue: &str,
) -> Result<Measured, BenchError> {
    // The counts each finish writes, by id, computed before the clock starts.
    let rows = client.query(sql::PAYLOADS, &[&queue]).await?;
    let counts: Arc<HashMap<i64, Counts>> = Arc::new(
        rows.iter()
            .map(|row| (row.get(0), analyze(row.get(1))))
            .collect(),
    );
    let mut sessions = Vec::with_capacity(CEILING_SESSIONS);
    let mut backends = Vec::with_capacity(CEILING_SESSIONS);
    for _ in 0..CEILING_SESSIONS {
        let session = settings.connect().await?;
        backends.push(
            session
                .query_one(sql::BACKEND_PID, &[])
                .await?
                .get::<_, i32>(0),
        );
        sessions.push(session);
    }
    let cpu_before = proc::backends_cpu_s(&backends);
    let started = Instant::now();
    let mut loops = tokio::task::JoinSet::new();
    for (i, session) in sessions.into_iter().enumerate() {
        let owner = format!("bench-ceiling-{}-{i}", std::process::id());
        let queues = vec![queue.to_string()];
        let counts = Arc::clone(&counts);
        // Each loop hands its session back, so that its backend is still there to be read.
        loops.spawn(async move {
            claim_and_finish(&session, &owner, &queues, &counts)
                .await
                .map(|()| session)
        });
    }
    let all = async {
        let mut done = Vec::with_capacity(CEILING_SESSIONS);
        while let Some(session) = loops.join_next().await {
            done.push(session.map_err(|err| BenchError::Session(err.to_string()))??);
        }
        Ok::<_, BenchError>(done)
    };
    let sessions = tokio::time::timeout(RUN_LIMIT, all)
        .await
        .map_err(|_| BenchError::TooLong(RUN_LIMIT))??;
    let seconds = started.elapsed().as_secs_f64();
    let server_cpu_s = match (cpu_before, proc::backends_cpu_s(&backends)) {
        (Some(before), Some(after)) => Some(after - before),
        _ => None,
    };
    drop(sessions);
    Ok(Measured {
        seconds,
        server_cpu_s,
    })
}

/// One session's loop: claim a batch, finish it, until a claim comes back empty.
async fn claim_and_finish(
    client: &Client,
    owner: &str,
    queues: &[String],
    counts: &HashMap<i64, Counts>,
) -> Result<(), BenchError> {
    let limits = ClaimLimits {
        tasks: CEILING_BATCH,
        bytes: u64::MAX,
        take_one: true,
        max_payload: None,
    };
    loop {
        let batch = queue::claim_within(client, owner, queues, limits, LEASE).await?;
        if batch.tasks.is_empty() {
            // A limited queue another session was claiming from: again once it may have room.
            match batch.again_in {
                Some(again_in) => {
                    tokio::time::sleep(again_in).await;
                    continue;
                }
                None => return Ok(()),
            }
        }
        let finishes: Vec<Finish> = batch
            .tasks
            .iter()
            .map(|task| Finish {
                id: task.id,
                token: task.token,
                outcome: Outcome::Succeeded(counts.get(&task.id).copied().unwrap_or_default()),
            })
            .collect();
        let results = queue::finish_many(client, &finishes)
            .await
            .map_err(finish_error)?;
        for (finish, result) in finishes.iter().zip(results) {
            match result {
                Ok(_) => {}
                // Another session's claim, scanning past this row after it left QUEUED, can
                // hold its lock until that claim commits: finish it alone, waiting, as the
                // daemon's completer does.
                Err(FinishError::Locked) => {
                    queue::finish(client, finish.token, finish.id, &finish.outcome, true)
                        .await
                        .map_err(|err| match err {
                            FinishError::Db(err) => BenchError::Db(err),
                            _ => BenchError::Lost(finish.id),
                        })?;
                }
                Err(_) => return Err(BenchError::Lost(finish.id)),
            }
        }
    }
}

fn finish_error(err: FinishError) -> BenchError {
    match err {
        FinishError::Db(err) => BenchError::Db(err),
        FinishError::NotRunning { .. } | FinishError::NotFound | FinishError::Locked => {
            BenchError::Session(err.to_string())
        }
    }
}
