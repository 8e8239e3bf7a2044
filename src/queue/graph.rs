//! A graph of tasks inserted in one transaction through `pgtaskd.enqueue_graph(jsonb)`
//! (schema 37, docs/dependencies.md, "Graphs"): tasks named by local refs, each waiting for
//! the refs (and the ids of tasks already there) its `after` lists. The database puts parents
//! before children and refuses a cycle, naming it, inserting nothing. Called by
//! `pgtaskd graph` and `POST /graphs`.

use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;
use tokio_postgres::Client;

use crate::db::DbError;

/// The most bytes of JSON one graph may take: a graph of 10,000 tasks of a kilobyte each.
pub const MAX_GRAPH_BYTES: usize = 16 * 1024 * 1024;

/// One task of a graph, inserted.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Inserted {
    #[serde(rename = "ref")]
    pub name: String,
    pub id: i64,
}

/// Why the database refused a graph, in its own words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GraphRefusal {
    /// Not a graph the function takes: not an array of tasks, a ref named twice, an `after`
    /// naming a ref the graph lacks, a cycle (`cycle: a -> b -> a`), a bad value: 22023, or a
    /// task the table's checks refuse (23514, 22P02 and the like). A usage error.
    #[error("{0}")]
    Invalid(String),
    /// An `after` names the id of a task that does not exist (23503): what an unknown task id
    /// is everywhere.
    #[error("{0}")]
    UnknownParent(String),
}

/// Insert `graph` (a JSON array of tasks, as text) in one statement; the refs and ids in the
/// order the tasks were inserted, parents first.
///
/// # Errors
///
/// Database failures; [`refusal`] says which are the graph's fault.
pub async fn enqueue_graph(client: &Client, graph: &str) -> Result<Vec<Inserted>, DbError> {
    let rows = client
        .query_typed(
            "SELECT ref, task_id FROM pgtaskd.enqueue_graph($1::text::jsonb)",
            &[(&graph, Type::TEXT)],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|row| Inserted {
            name: row.get(0),
            id: row.get(1),
        })
        .collect())
}

/// The keys a task of a graph takes (`pgtaskd.enqueue_graph`).
const GRAPH_KEYS: [&str; 12] = [
    "ref",
    "payload",
    "after",
    "queue",
    "priority",
    "run_at",
    "max_attempts",
    "idempotency_key",
    "concurrency_key",
    "on_dep_failure",
    "tags",
    "metadata",
];

/// The first key of a task of `graph` (a JSON array of objects) that a graph does not take,
/// in words: the database passes over such a key, so a misspelt one (`tag`) or one a graph
/// has not (`batch_id`) would be dropped without a word. `None` when there is none, or when
/// `graph` is not an array of objects (the database says what is wrong with it then).
pub fn unknown_key(graph: &str) -> Option<String> {
    use std::collections::BTreeMap;
    let tasks: Vec<BTreeMap<String, serde::de::IgnoredAny>> = serde_json::from_str(graph).ok()?;
    tasks.iter().enumerate().find_map(|(i, task)| {
        let key = task
            .keys()
            .find(|key| !GRAPH_KEYS.contains(&key.as_str()))?;
        Some(format!(
            "task {} of the graph has the key {key:?}, which a graph's task does not take: {}{}",
            i + 1,
            GRAPH_KEYS.join(", "),
            if key == "batch_id" {
                " (a graph's tasks join no batch: enqueue them one by one with batch_id)"
            } else {
                ""
            }
        ))
    })
}

/// What a graph's failure `err` says of the graph, if it is about it.
pub fn refusal(err: &DbError) -> Option<GraphRefusal> {
    let code = err.code()?;
    if *code == SqlState::FOREIGN_KEY_VIOLATION {
        Some(GraphRefusal::UnknownParent(err.message().to_string()))
    } else if [
        SqlState::INVALID_PARAMETER_VALUE,
        SqlState::CHECK_VIOLATION,
        SqlState::INVALID_TEXT_REPRESENTATION,
        SqlState::INVALID_DATETIME_FORMAT,
        SqlState::DATETIME_FIELD_OVERFLOW,
        SqlState::NUMERIC_VALUE_OUT_OF_RANGE,
        SqlState::NOT_NULL_VIOLATION,
        SqlState::UNIQUE_VIOLATION,
        SqlState::PROGRAM_LIMIT_EXCEEDED,
        SqlState::STRING_DATA_RIGHT_TRUNCATION,
        SqlState::UNTRANSLATABLE_CHARACTER,
        SqlState::CHARACTER_NOT_IN_REPERTOIRE,
    ]
    .contains(code)
    {
        Some(GraphRefusal::Invalid(err.message().to_string()))
    } else {
        None
    }
}
