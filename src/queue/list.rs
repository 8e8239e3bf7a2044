//! The latest tasks, newest first, for `pgtaskd list` (and the dashboard's JSON): a summary
//! of each row, without its payload (which may weigh a gigabyte), only its size.
//!
//! The order is `id DESC`, read backwards through the primary key and stopped at the limit,
//! so a table of millions of finished rows costs no more than the rows shown. A status filter
//! is written into the statement as a literal (it is one of the five, never user text), so
//! that QUEUED and RUNNING can be read from their partial indexes.

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Row};

use super::task::{status_column, TaskStatus};
use crate::db::DbError;

/// Which tasks to list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListFilter {
    pub queue: Option<String>,
    pub status: Option<TaskStatus>,
    /// At most this many rows.
    pub limit: i64,
}

/// One row of `pgtaskd list`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Listed {
    pub id: i64,
    pub queue: String,
    pub status: TaskStatus,
    pub priority: i16,
    pub attempt: i32,
    pub max_attempts: i32,
    /// The payload's length in bytes (the text is not read).
    pub payload_bytes: i64,
    pub words: i64,
    pub bytes: i64,
    pub runes: i64,
    pub error: Option<String>,
    pub run_at: DateTime<Utc>,
    pub created_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
}

impl Listed {
    fn from_row(row: &Row) -> Listed {
        Listed {
            id: row.get("id"),
            queue: row.get("queue"),
            status: status_column(row.get("status")),
            priority: row.get("priority"),
            attempt: row.get("attempt"),
            max_attempts: row.get("max_attempts"),
            payload_bytes: row.get("payload_bytes"),
            words: row.get("words"),
            bytes: row.get("bytes"),
            runes: row.get("runes"),
            error: row.get("error"),
            run_at: row.get("run_at"),
            created_at: row.get("created_at"),
            finished_at: row.get("finished_at"),
        }
    }
}

/// The statement for `filter`; the queue and the limit are parameters.
fn statement(filter: &ListFilter) -> String {
    let mut conditions = Vec::new();
    if filter.queue.is_some() {
        conditions.push("queue = $2".to_string());
    }
    if let Some(status) = filter.status {
        // One of five fixed words: a literal the planner can match to a partial index.
        conditions.push(format!("status = '{}'", status.as_str()));
    }
    let filter_sql = if conditions.is_empty() {
        String::new()
    } else {
        format!(" WHERE {}", conditions.join(" AND "))
    };
    format!(
        "SELECT id, queue, status, priority, attempt, max_attempts, \
                octet_length(payload)::bigint AS payload_bytes, words, bytes, runes, error, \
                {}, created_at, finished_at \
           FROM pgtaskd.tasks{filter_sql} ORDER BY id DESC LIMIT $1",
        super::task::shown_run_at!()
    )
}

/// The latest tasks `filter` selects, newest (highest id) first.
///
/// # Errors
///
/// Database failures.
pub async fn list(client: &Client, filter: &ListFilter) -> Result<Vec<Listed>, DbError> {
    let sql = statement(filter);
    let mut params: Vec<(&(dyn ToSql + Sync), Type)> = vec![(&filter.limit, Type::INT8)];
    if let Some(queue) = &filter.queue {
        params.push((queue, Type::TEXT));
    }
    let rows = client.query_typed(&sql, &params).await?;
    Ok(rows.iter().map(Listed::from_row).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_filter_is_a_literal_and_the_queue_a_parameter() {
        let sql = statement(&ListFilter {
            queue: Some("q".into()),
            status: Some(TaskStatus::Running),
            limit: 5,
        });
        assert!(
            sql.contains("WHERE queue = $2 AND status = 'RUNNING'"),
            "{sql}"
        );
        assert!(sql.ends_with("ORDER BY id DESC LIMIT $1"), "{sql}");
    }

    #[test]
    fn no_filter_reads_the_primary_key_backwards() {
        let sql = statement(&ListFilter {
            queue: None,
            status: None,
            limit: 5,
        });
        assert!(!sql.contains("WHERE"), "{sql}");
    }
}
