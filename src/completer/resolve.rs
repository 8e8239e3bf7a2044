//! Settling one claim alone, and what happens when a write's commit outcome is unknown.
//!
//! Re-read, never re-run (docs/design.md). [`write_alone`] applies the write and retries until the
//! database answers: while it is down, the claims take turns, one try per delay of a shared
//! backoff ([`super::reachable`]); after a server error, on capped, jittered backoff of its own. A server error means
//! nothing was written: the write is simply sent again. An outage (the connection failed, or
//! the deadline passed, after the statement may have been sent) means the outcome is
//! unknown: from then on, each try first re-reads the row on a fresh session (`FOR SHARE`,
//! so that it waits for a transaction still holding the row), and [`decide`] says what the
//! row means, first match wins:
//!
//! 1. RUNNING under this claim (its token): the write did not land; write again.
//! 2. After a finish, terminal with the claim's token: the finish landed (CANCELED when a
//!    cancel was requested meanwhile).
//! 3. After a release, QUEUED or CANCELED with the claim's token: the release landed.
//! 4. Anything else (another claim's token, QUEUED after a finish, ...): the claim was lost.
//! 5. No row: the task was deleted.
//!
//! Each claim settled alone is a line at debug level; at info and above, the completer says
//! once that claims are being settled alone, and once, with counts, when the last of them is
//! (`tally.rs`; docs/design.md, "Settle before rescuing").
//!
//! The result in memory is then accepted, written again, or dropped; the analyzer is never
//! asked again. A stopping daemon may give up on an unreachable database
//! ([`super::Completer::give_up`]): the claim then returns unsettled, its lease left to expire.

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::backoff::Backoff;
use crate::db::Session;
use crate::queue::{self, FinishError, TaskStatus};

use super::decide::{decide, Decision};
use super::{Action, Claim, Shared};

/// Retry delays while a write cannot reach the database.
const RETRY_BASE: Duration = Duration::from_millis(50);
const RETRY_CAP: Duration = Duration::from_secs(5);

/// How a claim comes to be settled alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Why {
    /// A write of its own (a release, a finish that never ran its analyzer).
    Alone,
    /// Its batch failed and nothing was written.
    BatchRefused,
    /// Its batch's commit outcome is unknown: re-read first.
    OutcomeUnknown,
    /// Its batch skipped its row, which someone else held locked.
    Locked,
}

/// Apply `action` to `claim`, retrying until the database answers. After a failure whose
/// outcome is unknown (or `why` says an earlier try may have committed), re-read before
/// writing again. A row someone else holds is waited for, one claim at a time.
pub(super) async fn write_alone(
    shared: &Shared,
    claim: Claim,
    action: &Action,
    why: Why,
) -> Result<TaskStatus, FinishError> {
    // A lone write is no burst: only the batches' leftovers are counted and summed up.
    let counted = why != Why::Alone;
    if counted {
        shared.tally.start(claim.id, why);
    }
    let mut landed = false;
    let result = retry(shared, claim, action, why, &mut landed).await;
    if counted {
        shared.tally.end(&result, landed);
    }
    result
}

async fn retry(
    shared: &Shared,
    claim: Claim,
    action: &Action,
    why: Why,
    landed: &mut bool,
) -> Result<TaskStatus, FinishError> {
    let Claim { id, attempt, .. } = claim;
    let mut outcome_unknown = why == Why::OutcomeUnknown;
    // A row found locked is first tried once more with this daemon's heartbeat out of the
    // way (its statement locks the rows it extends for a moment): only a lock that is still
    // there then is someone else's, to be waited for, with the result parked.
    let mut recheck = why == Why::Locked;
    let mut rechecked = recheck;
    let mut wait = false;
    let mut parked = false;
    let mut held_for_room = HeldForRoom {
        shared,
        held: false,
    };
    let mut backoff = Backoff::new(RETRY_BASE, RETRY_CAP);
    loop {
        let seen = shared.reachable.seen();
        let exhausted_seen = shared.exhausted.seen();
        let write = async {
            // Waiting for someone else's lock: one claim of this daemon at a time.
            let _waiting = match wait {
                true => Some(shared.lock_wait.acquire().await.expect("never closed")),
                false => None,
            };
            // A bounded share of the pool: settling many claims alone never starves the
            // claims, the heartbeat and the rescuer of sessions.
            let _turn = shared.alone.acquire().await.expect("never closed");
            let client = shared.pool.get().await.map_err(FinishError::Db)?;
            // After the session: the heartbeat takes its share after its session too.
            let _heartbeat_held_off = match recheck {
                true => Some(shared.heartbeat.write().await),
                false => None,
            };
            if wait && !parked {
                park(&client, claim, action).await?;
                parked = true;
            }
            if outcome_unknown {
                resolve(shared, &client, claim, action, wait, landed).await
            } else {
                apply(&client, claim, action, wait).await
            }
        };
        // A stopping daemon that gave up on the database: the statement may still land; if
        // it does not, the lease expires. Either way this claim is never written again.
        let result = tokio::select! {
            biased;
            result = write => result,
            _ = shared.give_up.cancelled() => return shared.abandon(claim, action),
        };
        recheck = false;
        match result {
            Err(FinishError::Locked) if !rechecked => {
                tracing::debug!(
                    id,
                    attempt,
                    "row locked; trying once more with this daemon's heartbeat held off"
                );
                recheck = true;
                rechecked = true;
            }
            Err(FinishError::Locked) => {
                tracing::debug!(
                    id,
                    attempt,
                    "row locked by another transaction; waiting for it"
                );
                wait = true;
            }
            Err(FinishError::Db(err)) => {
                // Counted with the burst it belongs to; a lone write is in none.
                if why != Why::Alone {
                    shared.tally.retries.fetch_add(1, Ordering::Relaxed);
                }
                let error = err.to_string();
                if err.is_unavailable() {
                    // The statement may or may not have committed. Tried again at this
                    // claim's turn, or at once when another write worked meanwhile.
                    outcome_unknown = true;
                    tracing::debug!(
                        id,
                        attempt,
                        error,
                        "commit outcome unknown; will re-read the row once the database answers"
                    );
                    tokio::select! {
                        _ = shared.reachable.turn(seen) => {}
                        _ = shared.give_up.cancelled() => return shared.abandon(claim, action),
                    }
                } else if err.is_exhausted() {
                    // Out of a resource (a full disk): nothing was written. The claims take
                    // turns, one try per delay, until a finish works: each refused try is
                    // an error in the server's log, which may share the full disk.
                    tracing::debug!(
                        id,
                        attempt,
                        error,
                        "finish refused for want of room; waiting for a turn"
                    );
                    held_for_room.hold(&error);
                    tokio::select! {
                        _ = shared.exhausted.turn(exhausted_seen) => {}
                        _ = shared.give_up.cancelled() => return shared.abandon(claim, action),
                    }
                } else {
                    // The server answered with an error: nothing was written. Tried again
                    // after this claim's delay, or, for an answer that says "not now" (a
                    // statement timeout behind a table lock that is gone now), at once when
                    // another write worked.
                    let transient = err.is_transient();
                    let delay = backoff.next_delay();
                    let retry_in_ms = delay.as_millis() as u64;
                    tracing::debug!(id, attempt, error, retry_in_ms, "finish failed; retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = shared.reachable.worked_since(seen), if transient => {}
                        _ = shared.give_up.cancelled() => return shared.abandon(claim, action),
                    }
                }
            }
            other => {
                if other.is_ok() {
                    shared.reachable.worked();
                    shared.exhausted.worked();
                }
                return other;
            }
        }
    }
}

/// A result counted in `pgtaskd_results_held_for_room` (and `/readyz`), and in this lane's
/// own count (its claims' gate), from the first refusal for want of room until its claim is
/// settled, however that ends.
struct HeldForRoom<'a> {
    shared: &'a Shared,
    held: bool,
}

impl HeldForRoom<'_> {
    /// One more refusal of this result's finish (each counted, for the rescuer).
    fn hold(&mut self, refusal: &str) {
        self.shared.metrics.refused_for_room();
        if !self.held {
            self.held = true;
            self.shared.held_for_room.fetch_add(1, Ordering::Relaxed);
            self.shared.metrics.held_for_room(refusal);
        }
    }
}

impl Drop for HeldForRoom<'_> {
    fn drop(&mut self) {
        if self.held {
            self.shared.held_for_room.fetch_sub(1, Ordering::Relaxed);
            self.shared.metrics.room_again();
        }
    }
}

/// Before a finish waits for a row someone else holds: park its result ("Parked results"
/// in docs/design.md), so that should the lease run out meanwhile and the row be let go
/// before this write gets it, a rescuer writes the result instead of giving the task back to
/// run again. The parked copy of a result this write lands is dropped by the next rescue.
///
/// The park is a safeguard, not a condition of the finish: a park the database refuses
/// outright (a role granted the finish but not the parked results, say) is logged and the
/// finish goes on without it; only an outage or a want of room, which the finish would meet
/// too, is returned, to be tried again with it.
async fn park(client: &Session, claim: Claim, action: &Action) -> Result<(), FinishError> {
    let Action::Finish(outcome) = action else {
        return Ok(()); // a release has no result to keep
    };
    let finish = queue::Finish {
        id: claim.id,
        token: claim.token,
        outcome: outcome.clone(),
    };
    match client
        .bounded(queue::park(client, std::slice::from_ref(&finish)))
        .await
    {
        Ok(_) => Ok(()),
        Err(err) if err.is_unavailable() || err.is_exhausted() => Err(FinishError::Db(err)),
        Err(err) => {
            tracing::warn!(
                id = claim.id,
                attempt = claim.attempt,
                error = %err,
                "could not park the result before waiting for its row; waiting without it"
            );
            Ok(())
        }
    }
}

/// Write `action` to `claim`: one fenced statement; with `wait`, it waits for the row if
/// someone else holds it locked, else that is [`FinishError::Locked`].
async fn apply(
    client: &Session,
    claim: Claim,
    action: &Action,
    wait: bool,
) -> Result<TaskStatus, FinishError> {
    let Claim { id, token, .. } = claim;
    match action {
        Action::Finish(outcome) => {
            client
                .bounded(queue::finish(client, token, id, outcome, wait))
                .await
        }
        Action::Release => {
            client
                .bounded(queue::release(client, token, id, wait))
                .await
        }
    }
}

/// Re-read, never re-run: find out what became of a write whose outcome is unknown, and act on it.
async fn resolve(
    shared: &Shared,
    client: &Session,
    claim: Claim,
    action: &Action,
    wait: bool,
    landed: &mut bool,
) -> Result<TaskStatus, FinishError> {
    let Claim { id, attempt, token } = claim;
    let state = client.bounded(queue::reread(client, id, wait)).await?;
    shared.metrics.unknown_commit_resolved();
    match decide(action, token, state.as_ref()) {
        Decision::Gone => {
            tracing::debug!(
                id,
                attempt,
                found = "no row",
                "commit outcome unknown: resolved"
            );
            Err(FinishError::NotFound)
        }
        Decision::Ours => {
            tracing::debug!(
                id,
                attempt,
                found = "still running under this claim",
                "commit outcome unknown: resolved; applying the same finish again"
            );
            apply(client, claim, action, wait).await
        }
        Decision::Landed(status) => {
            tracing::debug!(id, attempt, found = %status, "commit outcome unknown: resolved; the write had landed");
            if let (TaskStatus::Failed, Action::Finish(outcome)) = (status, action) {
                // The statement's answer, which says so, was lost.
                client
                    .bounded(async {
                        queue::log_failed_end(client, id, outcome.error()).await;
                        Ok::<(), FinishError>(())
                    })
                    .await
                    .ok();
            }
            *landed = true;
            Ok(status)
        }
        Decision::ClaimLost {
            status,
            attempt: found_attempt,
        } => {
            tracing::debug!(id, attempt, found = %status, found_attempt, "commit outcome unknown: resolved; the claim was lost");
            Err(FinishError::NotRunning { status })
        }
    }
}
