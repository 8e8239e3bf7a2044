//! What a row re-read after a write whose commit outcome was unknown says of that write: the
//! rules of `resolve.rs`'s module documentation, as a pure function.

use crate::queue::{ClaimState, TaskStatus};

use super::Action;

/// What a re-read row says of a write whose outcome was unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Decision {
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

/// Decide, from the row as re-read, what became of `action` on the claim `token`.
pub(super) fn decide(action: &Action, token: i64, reread: Option<&ClaimState>) -> Decision {
    let Some(state) = reread else {
        return Decision::Gone;
    };
    let this_claim = state.token == Some(token);
    if this_claim && state.status == TaskStatus::Running {
        return Decision::Ours;
    }
    let landed = this_claim
        && match action {
            Action::Finish(_) => state.status.is_terminal(),
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

    const TOKEN: i64 = 41;
    const OTHER: i64 = 42;
    const ATTEMPT: i32 = 3;

    fn row(status: TaskStatus, attempt: i32, token: Option<i64>) -> Option<ClaimState> {
        Some(ClaimState {
            status,
            attempt,
            token,
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
            (row(Running, ATTEMPT, Some(TOKEN)), Decision::Ours),
            (
                row(Succeeded, ATTEMPT, Some(TOKEN)),
                Decision::Landed(Succeeded),
            ),
            (row(Failed, ATTEMPT, Some(TOKEN)), Decision::Landed(Failed)),
            // A cancel requested meanwhile: the finish wrote CANCELED.
            (
                row(Canceled, ATTEMPT, Some(TOKEN)),
                Decision::Landed(Canceled),
            ),
            // Finished under another claim, even one of the same attempt (a claim given
            // back does not count as an attempt).
            (
                row(Succeeded, ATTEMPT + 1, Some(OTHER)),
                lost(Succeeded, ATTEMPT + 1),
            ),
            (
                row(Succeeded, ATTEMPT, Some(OTHER)),
                lost(Succeeded, ATTEMPT),
            ),
            (row(Queued, ATTEMPT, Some(TOKEN)), lost(Queued, ATTEMPT)),
            (
                row(Queued, ATTEMPT - 1, Some(TOKEN)),
                lost(Queued, ATTEMPT - 1),
            ),
            (row(Running, ATTEMPT, Some(OTHER)), lost(Running, ATTEMPT)),
            (row(Running, ATTEMPT, None), lost(Running, ATTEMPT)),
            (None, Decision::Gone),
        ];
        for (reread, expected) in cases {
            assert_eq!(
                decide(&finish, TOKEN, reread.as_ref()),
                expected,
                "after a finish, re-read {reread:?}"
            );
        }
    }

    #[test]
    fn a_reread_after_a_release_accepts_queued_or_canceled() {
        let cases = [
            (row(Running, ATTEMPT, Some(TOKEN)), Decision::Ours),
            // The release does not count the attempt.
            (
                row(Queued, ATTEMPT - 1, Some(TOKEN)),
                Decision::Landed(Queued),
            ),
            // A cancel requested meanwhile: the release wrote CANCELED.
            (
                row(Canceled, ATTEMPT, Some(TOKEN)),
                Decision::Landed(Canceled),
            ),
            (
                row(Succeeded, ATTEMPT, Some(TOKEN)),
                lost(Succeeded, ATTEMPT),
            ),
            (row(Failed, ATTEMPT, Some(TOKEN)), lost(Failed, ATTEMPT)),
            (row(Running, ATTEMPT, Some(OTHER)), lost(Running, ATTEMPT)),
            (
                row(Queued, ATTEMPT - 1, Some(OTHER)),
                lost(Queued, ATTEMPT - 1),
            ),
            (None, Decision::Gone),
        ];
        for (reread, expected) in cases {
            assert_eq!(
                decide(&Action::Release, TOKEN, reread.as_ref()),
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
            let reread = row(Succeeded, ATTEMPT, Some(TOKEN));
            assert_eq!(
                decide(&finish, TOKEN, reread.as_ref()),
                Decision::Landed(Succeeded)
            );
        }
    }
}
