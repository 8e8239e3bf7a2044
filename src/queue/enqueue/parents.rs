//! A task's parents (`depends_on`, schema 37): the tasks it waits for, and what a parent's
//! failure does to it (`on_dep_failure`). What the CLI's `--after` and `--on-dep-failure`
//! and the HTTP API's `depends_on` and `on_dep_failure` may hold is checked here, before any
//! statement; what only the database can tell (a parent that does not exist, or was not
//! enqueued before the task) comes back as its refusal, sorted by [`refusal`] so that both
//! answer it in the same words.

use std::fmt;
use std::str::FromStr;

use serde::Serialize;
use tokio_postgres::error::SqlState;

use super::BadInput;
use crate::db::DbError;

/// The most parents a task may have: the table's `tasks_depends_on_earlier` refuses more
/// (duplicates counted; the database ignores them otherwise).
pub const MAX_PARENTS: usize = 10_000;

/// The constraint that keeps every parent's id smaller than its child's.
const EARLIER: &str = "tasks_depends_on_earlier";

/// What a parent that ends FAILED or CANCELED does to its child (`on_dep_failure`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OnDepFailure {
    /// The child is CANCELED (the column's meaning when unset).
    Cancel,
    /// The child runs anyway, once every parent has ended.
    Run,
    /// The child stays WAITING until a retry of the parent succeeds.
    Wait,
}

impl OnDepFailure {
    /// The three, as the column holds them.
    pub const NAMES: [&'static str; 3] = ["cancel", "run", "wait"];

    pub fn as_str(self) -> &'static str {
        match self {
            OnDepFailure::Cancel => "cancel",
            OnDepFailure::Run => "run",
            OnDepFailure::Wait => "wait",
        }
    }
}

impl fmt::Display for OnDepFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for OnDepFailure {
    type Err = BadInput;

    /// One of the three, in lowercase, as the column holds them.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "cancel" => Ok(OnDepFailure::Cancel),
            "run" => Ok(OnDepFailure::Run),
            "wait" => Ok(OnDepFailure::Wait),
            _ => Err(BadInput::OnDepFailure),
        }
    }
}

/// A task's parents: at most [`MAX_PARENTS`] ids. Whether each exists, and was enqueued
/// before the task, only the insert can tell ([`refusal`]).
///
/// # Errors
///
/// [`BadInput::TooManyParents`].
pub fn check_depends_on(parents: &[i64]) -> Result<(), BadInput> {
    if parents.len() > MAX_PARENTS {
        Err(BadInput::TooManyParents(parents.len()))
    } else {
        Ok(())
    }
}

/// A parent list as text gives it (the CLI's `--after`, a `POST /tasks` query's
/// `depends_on`): task ids separated by commas, spaces allowed around each.
///
/// # Errors
///
/// [`BadInput::DependsOn`] for anything but ids; [`BadInput::TooManyParents`].
pub fn parse_depends_on(text: &str) -> Result<Vec<i64>, BadInput> {
    let parents = text
        .split(',')
        .map(|id| id.trim().parse::<i64>().map_err(|_| BadInput::DependsOn))
        .collect::<Result<Vec<i64>, BadInput>>()?;
    check_depends_on(&parents)?;
    Ok(parents)
}

/// Why the database refused a task's parents.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParentRefusal {
    /// A parent does not exist (SQLSTATE 23503): the database's words, which name it
    /// (`task depends on task 12, which does not exist`). What an unknown task id is
    /// everywhere: the CLI's exit 3; the HTTP API's 422.
    #[error("{0}")]
    Unknown(String),
    /// A parent's id is not smaller than the task's own (`tasks_depends_on_earlier`, 23514):
    /// a usage error, exit 2 or 422.
    #[error(
        "a task may depend only on tasks enqueued before it: depends_on names an id that is not \
         smaller than the new task's own"
    )]
    NotEarlier,
}

/// What an enqueue's failure `err` says of the task's parents, if it is about them. Nothing
/// else of the task can fail so: no other constraint of the table is a foreign key's, and
/// its other checks are checked before the statement. A check's violation is told by the
/// constraint its message names, in quotes of its language whatever `lc_messages` is.
pub fn refusal(err: &DbError) -> Option<ParentRefusal> {
    let code = err.code()?;
    if *code == SqlState::FOREIGN_KEY_VIOLATION {
        Some(ParentRefusal::Unknown(err.message().to_string()))
    } else if *code == SqlState::CHECK_VIOLATION && err.message().contains(EARLIER) {
        Some(ParentRefusal::NotEarlier)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_policy_is_one_of_three_lowercase_words() {
        for name in OnDepFailure::NAMES {
            assert_eq!(name.parse::<OnDepFailure>().unwrap().as_str(), name);
        }
        for bad in ["", "Cancel", "retry", "wait "] {
            assert_eq!(bad.parse::<OnDepFailure>(), Err(BadInput::OnDepFailure));
        }
        assert_eq!(
            serde_json::to_string(&OnDepFailure::Wait).unwrap(),
            "\"wait\""
        );
    }

    #[test]
    fn parents_are_ids_at_most_ten_thousand_duplicates_counted() {
        assert_eq!(parse_depends_on("12"), Ok(vec![12]));
        assert_eq!(parse_depends_on(" 12 , 13,12"), Ok(vec![12, 13, 12]));
        for bad in ["", "12,", "a", "1.5", "99999999999999999999"] {
            assert_eq!(parse_depends_on(bad), Err(BadInput::DependsOn), "{bad:?}");
        }
        assert_eq!(check_depends_on(&vec![7; MAX_PARENTS]), Ok(()));
        assert_eq!(
            check_depends_on(&vec![7; MAX_PARENTS + 1]),
            Err(BadInput::TooManyParents(MAX_PARENTS + 1))
        );
    }

    #[test]
    fn the_databases_refusals_of_parents_are_told_from_others() {
        let unknown = DbError::answered(
            "task depends on task 99, which does not exist",
            SqlState::FOREIGN_KEY_VIOLATION,
        );
        assert_eq!(
            refusal(&unknown),
            Some(ParentRefusal::Unknown(
                "task depends on task 99, which does not exist".into()
            ))
        );
        let later = DbError::answered(
            "new row for relation \"tasks\" violates check constraint \"tasks_depends_on_earlier\"",
            SqlState::CHECK_VIOLATION,
        );
        assert_eq!(refusal(&later), Some(ParentRefusal::NotEarlier));
        let french = DbError::answered(
            "la nouvelle ligne de la relation « tasks » viole la contrainte de vérification « tasks_depends_on_earlier »",
            SqlState::CHECK_VIOLATION,
        );
        assert_eq!(refusal(&french), Some(ParentRefusal::NotEarlier));
        let other = DbError::answered(
            "new row for relation \"tasks\" violates check constraint \"tasks_queue_name\"",
            SqlState::CHECK_VIOLATION,
        );
        assert_eq!(refusal(&other), None);
        assert_eq!(refusal(&DbError::unavailable("connection refused")), None);
    }
}
