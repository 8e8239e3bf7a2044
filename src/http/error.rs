//! [`ApiError`]: every way a request fails, and the answer it becomes: a status code and a
//! JSON body `{"error": "..."}`. Handlers return `Result<_, ApiError>` and use `?`.
//!
//! A database failure the database could not help (an outage, a timeout, an overload) is
//! 503 "database unavailable", never 404; any other database error is 500 "internal error"
//! (inputs are validated first, so it is a bug). Either way the body names no detail; the
//! log has it. The one refusal only the database can make of valid input, a task's parents
//! that do not exist or were not enqueued before it, is 422 with its words
//! ([`ApiError::BadParents`]); so are tags and metadata the table would refuse
//! ([`ApiError::BadTags`]), checked before the insert, and a batch that does not exist or is
//! sealed ([`ApiError::BadBatch`]).

use axum::extract::Request;
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::db::DbError;
use crate::queue::TaskStatus;
use crate::repeats::{log_failure, log_recovery, Repeats};

/// The requests the database could not serve since the last it did: an outage is said once
/// at WARN (with a reminder a minute), not once per request, and its end once
/// ([`database_answered`]).
static DATABASE_FAILURES: Repeats = Repeats::new();

/// The seconds a read refused by the budget of `http.max_inflight_bytes` is told to wait.
const RETRY_AFTER: &str = "2";

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ApiError {
    #[error("{0}")]
    BadRequest(String),
    #[error("the task id must be an integer")]
    BadTaskId,
    #[error("unauthorized")]
    Unauthorized,
    /// A request a browser made for another site's page, or through another name (`origin.rs`).
    #[error("{0}")]
    OtherSite(String),
    #[error("no such task")]
    NoSuchTask,
    #[error("no such route")]
    NoSuchRoute,
    #[error("no such queue: it has no task and is not paused")]
    NoSuchQueue,
    #[error("no such schedule")]
    NoSuchSchedule,
    #[error("no such batch")]
    NoSuchBatch,
    #[error("task is already {0}")]
    AlreadyFinished(TaskStatus),
    #[error("task is {0}: only a FAILED or CANCELED task can be retried")]
    NotRetryable(TaskStatus),
    /// A progress report whose claim is not the current one of a RUNNING task.
    #[error("the claim is not the current one of a RUNNING task (the task is {0})")]
    NotCurrentClaim(TaskStatus),
    /// A progress report that found the daemon holding too many reports for its next flush.
    #[error("too many progress reports wait for the next write; retry later")]
    ProgressFull,
    #[error("the Idempotency-Key is already used by task {id}, with another payload or batch")]
    KeyConflict { id: i64 },
    /// The database refused the task's `depends_on`: a parent that does not exist (its
    /// words), or one not enqueued before the task. Nothing was inserted.
    #[error(transparent)]
    BadParents(crate::queue::enqueue::ParentRefusal),
    /// Tags or metadata the table would refuse (`tasks_tags_check`, `tasks_metadata_check`):
    /// checked before the insert, or, as a backstop, refused by it. Nothing was inserted.
    #[error("{0}")]
    BadTags(String),
    /// The database refused the task's `batch_id`: a batch that does not exist or is sealed,
    /// in its words, which name the batch. Nothing was inserted.
    #[error(transparent)]
    BadBatch(crate::queue::batches::BatchRefusal),
    /// A graph `pgtaskd.enqueue_graph` refused, in its words (a cycle, named): nothing was
    /// inserted.
    #[error("{0}")]
    BadGraph(String),
    #[error("send the text as text/plain, or JSON {{\"payload\": ...}} as application/json")]
    UnsupportedMediaType,
    #[error("request body over {max} bytes")]
    BodyOver { max: usize },
    #[error("request body too large")]
    BodyTooLarge,
    #[error("method not allowed")]
    MethodNotAllowed,
    #[error("request timed out")]
    Timeout,
    #[error(
        "too many large payloads being answered at once (http.max_inflight_bytes); retry later"
    )]
    ReadBudget,
    #[error(transparent)]
    Db(#[from] DbError),
}

/// A task's field the queue layer refuses: 400 with its words, as the CLI prints them; 422
/// for its tags or metadata.
impl From<crate::queue::enqueue::BadInput> for ApiError {
    fn from(err: crate::queue::enqueue::BadInput) -> Self {
        if err.is_tags_or_metadata() {
            ApiError::BadTags(err.to_string())
        } else {
            ApiError::BadRequest(err.to_string())
        }
    }
}

impl ApiError {
    /// An enqueue's failure: [`ApiError::BadParents`] when the database refused the task's
    /// parents, [`ApiError::BadTags`] its tags or metadata, [`ApiError::BadBatch`] its batch,
    /// else the database error it is.
    pub(super) fn enqueue(err: DbError) -> ApiError {
        if let Some(refused) = crate::queue::enqueue::tags_refusal(&err) {
            return ApiError::BadTags(refused);
        }
        if let Some(refused) = crate::queue::batches::refusal(&err) {
            return ApiError::BadBatch(refused);
        }
        match crate::queue::enqueue::refusal(&err) {
            Some(refused) => ApiError::BadParents(refused),
            None => ApiError::Db(err),
        }
    }

    fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) | ApiError::BadTaskId => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::OtherSite(_) => StatusCode::FORBIDDEN,
            ApiError::NoSuchTask
            | ApiError::NoSuchRoute
            | ApiError::NoSuchQueue
            | ApiError::NoSuchSchedule
            | ApiError::NoSuchBatch => StatusCode::NOT_FOUND,
            ApiError::AlreadyFinished(_)
            | ApiError::NotRetryable(_)
            | ApiError::NotCurrentClaim(_) => StatusCode::CONFLICT,
            ApiError::KeyConflict { .. }
            | ApiError::BadParents(_)
            | ApiError::BadTags(_)
            | ApiError::BadBatch(_)
            | ApiError::BadGraph(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::BodyOver { .. } | ApiError::BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Timeout => StatusCode::REQUEST_TIMEOUT,
            ApiError::ReadBudget | ApiError::ProgressFull => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Db(err) if err.is_transient() => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Db(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl ApiError {
    /// The answer of this error, met about task `id` that is in the table (a wait after its
    /// insert failed): the task's `id` in the body, and its `Location`, so that a client
    /// retrying on the error does not enqueue the task again.
    pub(super) fn about_enqueued(self, id: i64) -> Response {
        let status = self.status();
        let mut body = self.body();
        body["id"] = id.into();
        let mut response = (status, Json(body)).into_response();
        if let Ok(location) = HeaderValue::from_str(&format!("/tasks/{id}")) {
            response.headers_mut().insert(header::LOCATION, location);
        }
        response
    }

    /// The JSON body of this error's answer; a database's failure is logged here.
    fn body(&self) -> serde_json::Value {
        match self {
            ApiError::Db(err) if err.is_transient() => {
                log_failure!(
                    DATABASE_FAILURES,
                    err,
                    "HTTP requests cannot be served by the database"
                );
                serde_json::json!({ "error": "database unavailable" })
            }
            ApiError::Db(err) => {
                tracing::error!(error = %err, "HTTP request failed in the database");
                serde_json::json!({ "error": "internal error" })
            }
            ApiError::AlreadyFinished(status)
            | ApiError::NotRetryable(status)
            | ApiError::NotCurrentClaim(status) => {
                serde_json::json!({ "error": self.to_string(), "status": status })
            }
            ApiError::KeyConflict { id } => {
                serde_json::json!({ "error": self.to_string(), "id": id })
            }
            other => serde_json::json!({ "error": other.to_string() }),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let body = self.body();
        let mut response = (status, Json(body)).into_response();
        if matches!(self, ApiError::ReadBudget | ApiError::ProgressFull) {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static(RETRY_AFTER));
        }
        if status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

/// After each request: a success of a route that reads the database (`/tasks`, `/batches`,
/// `/queues`, `/stats`) ends an outage the log said, once.
pub(super) async fn database_answered(request: Request, next: Next) -> Response {
    let path = request.uri().path();
    let reads_database = path.starts_with("/tasks")
        || path.starts_with("/batches")
        || path.starts_with("/queues/")
        || path.starts_with("/stats");
    let response = next.run(request).await;
    if reads_database && response.status().is_success() {
        log_recovery!(
            DATABASE_FAILURES,
            "HTTP requests served by the database again"
        );
    }
    response
}
