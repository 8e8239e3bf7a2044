//! Settling one claim alone, and what happens when a write's commit outcome is unknown.
//!
//! Re-read, never re-run (docs/design.md). [`settle`] applies the write and retries until the
//! database answers, with capped, jittered backoff while it is down. A server error means
//! nothing was written: the write is simply sent again. An outage (the connection failed, or
//! the deadline passed, after the statement may have been sent) means the outcome is
//! unknown: from then on, each try first re-reads the row on a fresh session (`FOR SHARE`,
//! so that it waits for a transaction still holding the row), and [`decide`] says what the
//! row means, first match wins:
//!
//! 1. RUNNING under this claim (its attempt, this owner): the write did not land; write
//!    again.
//! 2. After a finish, terminal at the claim's attempt: the finish landed (CANCELED when a
//!    cancel was requested meanwhile).
//! 3. After a release, QUEUED or CANCELED: the release landed.
//! 4. Anything else (another attempt or owner, QUEUED after a finish, ...): the claim was
//!    lost.
//! 5. No row: the task was deleted.
//!
//! The result in memory is then accepted, written again, or dropped; the analyzer is never
//! asked again. A stopping daemon may give up on an unreachable database
//! ([`super::Completer::give_up`]): the claim then returns unsettled, its lease left to expire.

use std::time::Duration;

use crate::backoff::Backoff;
use crate::db::Session;
use crate::queue::{self, ClaimState, FinishError, TaskStatus};

use super::{Action, Claim, Shared};

/// Retry delays while a write cannot reach the database.
const RETRY_BASE: Duration = Duration::from_millis(50);
const RETRY_CAP: Duration = Duration::from_secs(5);

/// Apply `action` to `claim`, retrying until the database answers. With `outcome_unknown`
/// (an earlier try may have committed), or after a failure whose outcome is unknown,
/// re-read before writing again.
pub(super) async fn settle(
    shared: &Shared,
    claim: Claim,
    action: &Action,
    mut outcome_unknown: bool,
) -> Result<TaskStatus, FinishError> {
    let Claim { id, attempt } = claim;
    let mut backoff = Backoff::new(RETRY_BASE, RETRY_CAP);
    loop {
        let write = async {
            match shared.pool.get().await {
                Err(err) => Err(FinishError::Db(err)),
                Ok(client) if outcome_unknown => resolve(shared, &client, claim, action).await,
                Ok(client) => apply(shared, &client, claim, action).await,
            }
        };
        // A stopping daemon that gave up on the database: the statement may still land; if
        // it does not, the lease expires. Either way this claim is never written again.
        let result = tokio::select! {
            biased;
            result = write => result,
            _ = shared.give_up.cancelled() => return shared.abandon(),
        };
        match result {
            Err(FinishError::Db(err)) => {
                let delay = backoff.next_delay();
                let retry_in_ms = delay.as_millis() as u64;
                let error = err.to_string();
                if err.is_unavailable() {
                    // The statement may or may not have committed.
                    outcome_unknown = true;
                    tracing::warn!(
                        id,
                        attempt,
                        error,
                        retry_in_ms,
                        "commit outcome unknown; will re-read the row"
                    );
                } else {
                    // The server answered with an error: nothing was written.
                    tracing::warn!(id, attempt, error, retry_in_ms, "finish failed; retrying");
                }
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = shared.give_up.cancelled() => return shared.abandon(),
                }
            }
            other => return other,
        }
    }
}

/// Write `action` to `claim`: one fenced statement.
async fn apply(
    shared: &Shared,
    client: &Session,
    claim: Claim,
    action: &Action,
) -> Result<TaskStatus, FinishError> {
    let Claim { id, attempt } = claim;
    let owner = &shared.owner;
    match action {
        Action::Finish(outcome) => {
            client
                .bounded(queue::finish(client, owner, id, attempt, outcome))
                .await
        }
        Action::Release => {
            client
                .bounded(queue::release(client, owner, id, attempt))
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
) -> Result<TaskStatus, FinishError> {
    let Claim { id, attempt } = claim;
    let state = client.bounded(queue::reread(client, id)).await?;
    shared.metrics.unknown_commit_resolved();
    match decide(action, attempt, &shared.owner, state.as_ref()) {
        Decision::Gone => {
            tracing::warn!(
                id,
                attempt,
                found = "no row",
                "commit outcome unknown: resolved"
            );
            Err(FinishError::NotFound)
        }
        Decision::Ours => {
            tracing::warn!(
                id,
                attempt,
                found = "still running under this claim",
                "commit outcome unknown: resolved; applying the same finish again"
            );
            apply(shared, client, claim, action).await
        }
        Decision::Landed(status) => {
            tracing::warn!(id, attempt, found = %status, "commit outcome unknown: resolved; the write had landed");
            Ok(status)
        }
        Decision::ClaimLost {
            status,
            attempt: found_attempt,
        } => {
            tracing::warn!(id, attempt, found = %status, found_attempt, "commit outcome unknown: resolved; the claim was lost");
            Err(FinishError::NotRunning { status })
        }
    }
}

/// What a re-read row says of a write whose outcome was unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Decision {
    /// Still RUNNING under this claim: the write did not land; apply it again.
    Ours,
    /// The write had landed: this is the status it wrote.
    Landed(TaskStatus),
    /// The row moved on without this claim (rescued, released, finished by someone else):
    /// drop the result.
    ClaimLost { status: TaskStatus, attempt: i32 },
    /// There is no such task any more.
    Gone,
}

/// Decide, from the row as re-read, what became of `action` on the claim (`attempt`, held by
/// `owner`). Pure: the rules of the module documentation, as code.
fn decide(action: &Action, attempt: i32, owner: &str, reread: Option<&ClaimState>) -> Decision {
    let Some(state) = reread else {
        return Decision::Gone;
    };
    let ours = state.status == TaskStatus::Running
        && state.attempt == attempt
        && state.lease_owner.as_deref() == Some(owner);
    if ours {
        return Decision::Ours;
    }
    let landed = match action {
        Action::Finish(_) => state.status.is_terminal() && state.attempt == attempt,
        Action::Release => {
            state.status == TaskStatus::Queued || state.status == TaskStatus::Canceled
        }
    };
    if landed {
        Decision::Landed(state.status)
    } else {
        Decision::ClaimLost {
            status: state.status,
            attempt: state.attempt,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyzer::Counts;
    use crate::queue::Outcome;
    use TaskStatus::{Canceled, Failed, Queued, Running, Succeeded};

    const ME: &str = "daemon-a";
    const OTHER: &str = "daemon-b";
    const ATTEMPT: i32 = 3;

    fn row(status: TaskStatus, attempt: i32, owner: Option<&str>) -> Option<ClaimState> {
        Some(ClaimState {
            status,
            attempt,
            lease_owner: owner.map(str::to_string),
        })
    }

    fn lost(status: TaskStatus, attempt: i32) -> Decision {
        Decision::ClaimLost { status, attempt }
    }

    #[test]
    fn a_reread_after_a_finish_accepts_applies_again_or_drops() {
        let finish = Action::Finish(Outcome::Succeeded(Counts::default()));
        let cases = [
            // (what the re-read found, what to do)
            (row(Running, ATTEMPT, Some(ME)), Decision::Ours),
            (row(Succeeded, ATTEMPT, None), Decision::Landed(Succeeded)),
            (row(Failed, ATTEMPT, None), Decision::Landed(Failed)),
            // A cancel requested meanwhile: the finish wrote CANCELED.
            (row(Canceled, ATTEMPT, None), Decision::Landed(Canceled)),
            (
                row(Succeeded, ATTEMPT + 1, None),
                lost(Succeeded, ATTEMPT + 1),
            ),
            (row(Queued, ATTEMPT, None), lost(Queued, ATTEMPT)),
            (row(Queued, ATTEMPT - 1, None), lost(Queued, ATTEMPT - 1)),
            (
                row(Running, ATTEMPT + 1, Some(ME)),
                lost(Running, ATTEMPT + 1),
            ),
            (row(Running, ATTEMPT, Some(OTHER)), lost(Running, ATTEMPT)),
            (row(Running, ATTEMPT, None), lost(Running, ATTEMPT)),
            (None, Decision::Gone),
        ];
        for (reread, expected) in cases {
            assert_eq!(
                decide(&finish, ATTEMPT, ME, reread.as_ref()),
                expected,
                "after a finish, re-read {reread:?}"
            );
        }
    }

    #[test]
    fn a_reread_after_a_release_accepts_queued_or_canceled() {
        let cases = [
            (row(Running, ATTEMPT, Some(ME)), Decision::Ours),
            // The release does not count the attempt.
            (row(Queued, ATTEMPT - 1, None), Decision::Landed(Queued)),
            // A cancel requested meanwhile: the release wrote CANCELED.
            (row(Canceled, ATTEMPT, None), Decision::Landed(Canceled)),
            (row(Succeeded, ATTEMPT, None), lost(Succeeded, ATTEMPT)),
            (row(Failed, ATTEMPT, None), lost(Failed, ATTEMPT)),
            (row(Running, ATTEMPT, Some(OTHER)), lost(Running, ATTEMPT)),
            (
                row(Running, ATTEMPT + 1, Some(ME)),
                lost(Running, ATTEMPT + 1),
            ),
            (None, Decision::Gone),
        ];
        for (reread, expected) in cases {
            assert_eq!(
                decide(&Action::Release, ATTEMPT, ME, reread.as_ref()),
                expected,
                "after a release, re-read {reread:?}"
            );
        }
    }

    #[test]
    fn the_outcome_of_a_finish_does_not_change_the_decision() {
        let outcomes = [
            Outcome::Succeeded(Counts::default()),
            Outcome::Failed("boom".into()),
            Outcome::Canceled,
        ];
        for outcome in outcomes {
            let finish = Action::Finish(outcome);
            let reread = row(Succeeded, ATTEMPT, None);
            assert_eq!(
                decide(&finish, ATTEMPT, ME, reread.as_ref()),
                Decision::Landed(Succeeded)
            );
        }
    }
}
