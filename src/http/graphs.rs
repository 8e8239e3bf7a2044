//! `POST /graphs`: a graph of tasks that wait for one another, inserted in one transaction
//! through `pgtaskd.enqueue_graph` (`queue::graph`, docs/dependencies.md, "Graphs").

use axum::body::Bytes;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::error::ApiError;
use super::extract::Db;
use crate::queue::graph::{self, GraphRefusal, Inserted};

/// The answer: each task's ref and id, in the order inserted (parents first).
#[derive(serde::Serialize)]
struct Graph {
    tasks: Vec<Inserted>,
}

/// `POST /graphs` with a JSON array of tasks, each `{"ref", "payload", "after": [refs or
/// ids], ...}` as `pgtaskd.enqueue_graph` takes them: 201 with `{"tasks": [{"ref", "id"}]}`;
/// 400 for a body that is not JSON or a task with a key a graph does not take; 422 for a graph the database refuses (a cycle, named; a
/// ref twice; an unknown ref; an `after` naming a task that does not exist; a task the table
/// refuses), nothing inserted.
pub(super) async fn submit(Db(session): Db, body: Bytes) -> Result<Response, ApiError> {
    let text = std::str::from_utf8(&body)
        .map_err(|_| ApiError::BadRequest("the graph is not UTF-8".into()))?;
    serde_json::from_str::<serde::de::IgnoredAny>(text)
        .map_err(|err| ApiError::BadRequest(format!("the graph is not JSON: {err}")))?;
    if let Some(unknown) = graph::unknown_key(text) {
        return Err(ApiError::BadRequest(unknown));
    }
    let tasks = session
        .bounded(graph::enqueue_graph(&session, text))
        .await
        .map_err(|err| match graph::refusal(&err) {
            Some(GraphRefusal::Invalid(message) | GraphRefusal::UnknownParent(message)) => {
                ApiError::BadGraph(message)
            }
            None => ApiError::Db(err),
        })?;
    Ok((StatusCode::CREATED, Json(Graph { tasks })).into_response())
}
