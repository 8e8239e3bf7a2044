//! The latest tasks, newest first, for `pgtaskd list` and `GET /tasks`: each row without its
//! payload (which may weigh a gigabyte), only its size and its first 200 characters; and
//! likewise a handler's `output`, when there is one.
//!
//! The order is `id DESC`, read backwards and stopped at the limit, so a table of millions of
//! finished rows costs no more than the rows shown; a page after another starts below the last
//! id shown (keyset paging: no offset to skip). Without a filter, and with filters most rows
//! pass, the primary key is read backwards; a queue that holds few of the rows, or a status
//! few rows have, is read from `tasks_list_queue_idx` (queue, status, id) and
//! `tasks_list_status_idx` (status, id), both of finished rows only, and the partial indexes
//! of QUEUED and RUNNING rows, instead of walking past every other row (schema 19;
//! docs/http.md gives the timings). A status filter is written into the
//! statement as a literal (it is one of the six, never user text), so that the planner can
//! match it to the partial indexes.
//!
//! Tags and metadata (schema 38) are the task table's, and the view's rows come from the
//! state table: a condition on the view's `tags` would be checked on every state row read.
//! So the ids with every tag and metadata term asked for are found first, through the
//! table's partial GIN indexes (`tasks_tags_idx`, `tasks_metadata_idx`), into an array, and
//! the view is read for those ids only (`id = ANY (ARRAY(...))`): the state table's primary
//! key, or its status index, walked backwards along the array and stopped at the limit. A
//! tag that 1,000 of 1,000,000 finished rows have is a page in 1 to 2 ms, with or
//! without a status (docs/http.md, "Listing tasks"); a list without them is planned as
//! before.

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Row};

use super::enqueue::Metadata;
use super::task::{status_column, TaskStatus};
use crate::db::DbError;

/// Which tasks to list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListFilter {
    pub queue: Option<String>,
    pub status: Option<TaskStatus>,
    /// At most this many rows.
    pub limit: i64,
    /// Only tasks older than this one (lower ids): the page after the one that ended there.
    pub after: Option<i64>,
    /// Only tasks with every one of these tags (`tags @> ...`); empty for any.
    pub tags: Vec<String>,
    /// Only tasks whose metadata holds this object (`metadata @> ...`).
    pub metadata: Option<Metadata>,
}

impl ListFilter {
    /// The latest `limit` tasks of any queue and status.
    pub fn latest(limit: i64) -> ListFilter {
        ListFilter {
            queue: None,
            status: None,
            limit,
            after: None,
            tags: Vec::new(),
            metadata: None,
        }
    }

    /// Whether it asks for tags or metadata, which the task table's GIN indexes find.
    fn by_tags(&self) -> bool {
        !self.tags.is_empty() || self.metadata.is_some()
    }
}

/// The characters of a payload that a listed row shows.
pub const PREVIEW_CHARS: i32 = 200;

/// One row of `pgtaskd list`: a [`Task`](super::Task) without its payload and output, with
/// their sizes and first characters.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Listed {
    pub id: i64,
    pub queue: String,
    pub idempotency_key: Option<String>,
    pub status: TaskStatus,
    pub priority: i16,
    pub run_at: DateTime<Utc>,
    pub attempt: i32,
    pub max_attempts: i32,
    pub cancel_requested: bool,
    pub words: i64,
    pub bytes: i64,
    pub runes: i64,
    pub error: Option<String>,
    pub lease_owner: Option<String>,
    pub lease_expires_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    /// The payload's length in bytes.
    pub payload_bytes: i64,
    /// The payload's first [`PREVIEW_CHARS`] characters, read alone (`substr` fetches only
    /// the first chunks of a large payload).
    pub payload_preview: String,
    /// The output's length in bytes; `None` when there is no output (an analyzer's task, or
    /// one not finished).
    pub output_bytes: Option<i64>,
    /// The output's first [`PREVIEW_CHARS`] characters, read alone as the payload's are.
    pub output_preview: Option<String>,
    /// Its tags (schema 38); `None` for none.
    pub tags: Option<Vec<String>>,
}

impl Listed {
    fn from_row(row: &Row) -> Listed {
        Listed {
            id: row.get("id"),
            queue: row.get("queue"),
            idempotency_key: row.get("idempotency_key"),
            status: status_column(row.get("status")),
            priority: row.get("priority"),
            run_at: row.get("run_at"),
            attempt: row.get("attempt"),
            max_attempts: row.get("max_attempts"),
            cancel_requested: row.get("cancel_requested"),
            words: row.get("words"),
            bytes: row.get("bytes"),
            runes: row.get("runes"),
            error: row.get("error"),
            lease_owner: row.get("lease_owner"),
            lease_expires_at: row.get("lease_expires_at"),
            created_at: row.get("created_at"),
            started_at: row.get("started_at"),
            finished_at: row.get("finished_at"),
            payload_bytes: row.get("payload_bytes"),
            payload_preview: row.get("payload_preview"),
            output_bytes: row.get("output_bytes"),
            output_preview: row.get("output_preview"),
            tags: row.get("tags"),
        }
    }
}

/// The columns of a [`Listed`], read from a row of the table or of a branch of it.
const LISTED_COLUMNS: &str = concat!(
    "id, queue, idempotency_key, status, priority, ",
    super::task::shown_run_at!(),
    ", attempt, max_attempts, cancel_requested, words, bytes, runes, error, lease_owner, \
     lease_expires_at, created_at, started_at, finished_at, \
     octet_length(payload)::bigint AS payload_bytes, \
     octet_length(output)::bigint AS output_bytes, tags"
);

/// The statement for `filter`: `$1` the limit, then the queue, the id to start below, the
/// tags and the metadata, each when given.
///
/// A queue without a status is read as six branches, one per status, each newest first
/// and stopped at the limit, merged: `tasks_list_queue_idx` holds finished rows only (so
/// that no claim, finish or cancel, whose conditions never name a finished status, can be
/// planned on it), and a branch per status is what lets it serve a queue.
///
/// Tags and metadata restrict the ids first, through the task table's GIN indexes (see the
/// module's comment); the queue then needs no branches: the ids are few, or most rows pass.
fn statement(filter: &ListFilter) -> String {
    let mut conditions = Vec::new();
    let mut next = 2;
    if filter.queue.is_some() {
        conditions.push(format!("queue = ${next}"));
        next += 1;
    }
    if filter.after.is_some() {
        conditions.push(format!("id < ${next}"));
        next += 1;
    }
    if filter.by_tags() {
        // `x.tags @> ...` implies `x.tags IS NOT NULL`, the partial index's predicate (and
        // so for the metadata): the planner matches them without a condition more. Nothing
        // else is asked of the task table, not even `x.id < after`, which could tempt the
        // planner to walk its primary key instead.
        let mut found = Vec::new();
        if !filter.tags.is_empty() {
            found.push(format!("x.tags @> ${next}::text[]"));
            next += 1;
        }
        if filter.metadata.is_some() {
            found.push(format!("x.metadata @> ${next}::jsonb"));
        }
        conditions.push(format!(
            "id = ANY (ARRAY(SELECT x.id FROM pgtaskd.tasks AS x WHERE {}))",
            found.join(" AND ")
        ));
    }
    let preview = format!(
        "substr(payload, 1, {PREVIEW_CHARS}) AS payload_preview, \
         substr(output, 1, {PREVIEW_CHARS}) AS output_preview"
    );
    let where_sql = |status: Option<TaskStatus>| {
        let mut all = conditions.clone();
        if let Some(status) = status {
            // One of six fixed words: a literal the planner can match to a partial index.
            all.push(format!("status = '{}'", status.as_str()));
        }
        if all.is_empty() {
            String::new()
        } else {
            format!(" WHERE {}", all.join(" AND "))
        }
    };
    if filter.queue.is_some() && filter.status.is_none() && !filter.by_tags() {
        let branches: Vec<String> = TaskStatus::ALL
            .iter()
            .map(|&status| {
                format!(
                    "(SELECT * FROM pgtaskd.task_view{} ORDER BY id DESC LIMIT $1)",
                    where_sql(Some(status))
                )
            })
            .collect();
        return format!(
            "SELECT {LISTED_COLUMNS}, {preview} FROM ({}) AS t ORDER BY id DESC LIMIT $1",
            branches.join(" UNION ALL ")
        );
    }
    format!(
        "SELECT {LISTED_COLUMNS}, {preview} FROM pgtaskd.task_view{} ORDER BY id DESC LIMIT $1",
        where_sql(filter.status)
    )
}

/// The latest tasks `filter` selects, newest (highest id) first.
///
/// # Errors
///
/// Database failures.
pub async fn list(client: &Client, filter: &ListFilter) -> Result<Vec<Listed>, DbError> {
    let rows = run(client, filter, "").await?;
    Ok(rows.iter().map(Listed::from_row).collect())
}

/// The plan of [`list`]'s statement for `filter`, one line a row: `EXPLAIN (options)` with
/// the same parameters, such as `COSTS OFF` (for a test that the tags are found through
/// their index) or `ANALYZE, BUFFERS`.
///
/// # Errors
///
/// Database failures.
pub async fn explain(
    client: &Client,
    filter: &ListFilter,
    options: &str,
) -> Result<Vec<String>, DbError> {
    let rows = run(client, filter, &format!("EXPLAIN ({options}) ")).await?;
    Ok(rows.iter().map(|row| row.get(0)).collect())
}

/// Run [`statement`] for `filter`, after `prefix`, with its parameters.
async fn run(client: &Client, filter: &ListFilter, prefix: &str) -> Result<Vec<Row>, DbError> {
    let sql = format!("{prefix}{}", statement(filter));
    let mut params: Vec<(&(dyn ToSql + Sync), Type)> = vec![(&filter.limit, Type::INT8)];
    if let Some(queue) = &filter.queue {
        params.push((queue, Type::TEXT));
    }
    if let Some(after) = &filter.after {
        params.push((after, Type::INT8));
    }
    if !filter.tags.is_empty() {
        params.push((&filter.tags, Type::TEXT_ARRAY));
    }
    let metadata = filter.metadata.as_ref().map(Metadata::as_str);
    if let Some(metadata) = &metadata {
        params.push((metadata, Type::TEXT));
    }
    Ok(client.query_typed(&sql, &params).await?)
}

/// A page of [`list`]: the rows, and the id to ask the next page `after` (`None` at the end).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Page {
    pub tasks: Vec<Listed>,
    pub next: Option<i64>,
}

/// The page `filter` selects: one row more than the limit is read, so that the last page
/// says it is the last.
///
/// # Errors
///
/// Database failures.
pub async fn page(client: &Client, filter: &ListFilter) -> Result<Page, DbError> {
    let limit = usize::try_from(filter.limit).unwrap_or(0);
    let mut tasks = list(
        client,
        &ListFilter {
            limit: filter.limit + 1,
            ..filter.clone()
        },
    )
    .await?;
    let more = tasks.len() > limit;
    tasks.truncate(limit);
    let next = if more {
        tasks.last().map(|task| task.id)
    } else {
        None
    };
    Ok(Page { tasks, next })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_filter_is_a_literal_and_the_queue_a_parameter() {
        let sql = statement(&ListFilter {
            queue: Some("q".into()),
            status: Some(TaskStatus::Running),
            after: Some(9),
            ..ListFilter::latest(5)
        });
        assert!(
            sql.contains("WHERE queue = $2 AND id < $3 AND status = 'RUNNING'"),
            "{sql}"
        );
        let sql = statement(&ListFilter {
            queue: None,
            status: None,
            after: Some(9),
            ..ListFilter::latest(5)
        });
        assert!(sql.contains("WHERE id < $2"), "{sql}");
        let sql = statement(&ListFilter {
            queue: Some("q".into()),
            status: None,
            after: Some(9),
            ..ListFilter::latest(5)
        });
        assert_eq!(sql.matches(" UNION ALL ").count(), 5, "{sql}");
        assert!(sql.contains("status = 'WAITING'"), "{sql}");
        assert!(
            sql.contains("WHERE queue = $2 AND id < $3 AND status = 'CANCELED'"),
            "{sql}"
        );
        assert!(sql.ends_with("ORDER BY id DESC LIMIT $1"), "{sql}");
    }

    #[test]
    fn no_filter_reads_the_primary_key_backwards() {
        let sql = statement(&ListFilter::latest(5));
        assert!(!sql.contains("WHERE"), "{sql}");
    }

    #[test]
    fn tags_and_metadata_find_the_ids_in_the_task_table_first() {
        let metadata = Metadata::from_pairs(&[("k".into(), "v".into())]).unwrap();
        let sql = statement(&ListFilter {
            queue: Some("q".into()),
            after: Some(9),
            tags: vec!["a".into(), "b".into()],
            metadata,
            ..ListFilter::latest(5)
        });
        assert!(
            sql.contains(
                "WHERE queue = $2 AND id < $3 AND id = ANY (ARRAY(SELECT x.id FROM pgtaskd.tasks \
                 AS x WHERE x.tags @> $4::text[] AND x.metadata @> $5::jsonb)) \
                 ORDER BY id DESC LIMIT $1"
            ),
            "{sql}"
        );
        assert!(!sql.contains("UNION ALL"), "{sql}");
        assert!(
            !sql.contains("WHERE tags") && !sql.contains(" tags @>"),
            "{sql}"
        );
        let sql = statement(&ListFilter {
            status: Some(TaskStatus::Succeeded),
            tags: vec!["a".into()],
            ..ListFilter::latest(5)
        });
        assert!(
            sql.contains(
                "WHERE id = ANY (ARRAY(SELECT x.id FROM pgtaskd.tasks AS x WHERE \
                 x.tags @> $2::text[])) AND status = 'SUCCEEDED'"
            ),
            "{sql}"
        );
    }
}
