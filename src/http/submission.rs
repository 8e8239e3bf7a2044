//! What a `POST /tasks` asks for: the body (`text/plain` or `application/json`) and the query,
//! read into one [`Submission`] whose fields are then checked by the rules `pgtaskd enqueue`
//! applies (`queue::enqueue`), each error naming its field (docs/http.md, "Submitting a task").
//!
//! - `text/plain`: the body is the payload; `queue`, `priority`, `run_at`, `max_attempts`,
//!   `concurrency_key`, `depends_on` (ids separated by commas), `on_dep_failure`, `tags`
//!   (separated by commas), `metadata` (a JSON object's text) and `batch_id` come from the
//!   query (`?queue=thumbs&priority=5&depends_on=12,13&tags=a,b&batch_id=7`).
//! - `application/json`: `{"payload": ..., "queue": ..., ...}`. The payload is a string (the
//!   text itself) or an object or an array, stored as its JSON text with the whitespace
//!   between tokens taken out ([`compact`]): the keys in the order sent and each number as
//!   written, never rounded through a float. A number, a boolean or `null` is 400: the text a
//!   handler should get from it is a guess. The fields are the body's own: the same field in
//!   the query is 400 rather than one of the two silently winning.
//!
//! Either way the query may hold `wait` (`wait.rs`); any other parameter is 400 naming it, as
//! an unknown field of the JSON body is.

use axum::http::{header, HeaderMap};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

use super::error::ApiError;
use crate::queue::enqueue::BadInput;
use crate::queue::{self, RunAt};

/// A task as submitted, before its fields are checked by [`Submission::task`].
#[derive(Debug)]
pub(super) struct Submission {
    /// The payload text, as it will be stored.
    payload: String,
    queue: Option<String>,
    /// Each of the three is kept as the JSON value it came as (a query's number as a
    /// number), so that a wrong one is refused with the field's own rule
    /// (`queue::enqueue::check_priority`), as the CLI refuses it, not with serde's words.
    priority: Option<Value>,
    run_at: Option<Value>,
    max_attempts: Option<Value>,
    /// A string, or null for none.
    concurrency_key: Option<Value>,
    /// An array of task ids, or null for none.
    depends_on: Option<Value>,
    /// `cancel`, `run` or `wait`, or null for the default (`cancel`).
    on_dep_failure: Option<Value>,
    /// A list of tags, or null for none.
    tags: Option<Value>,
    /// A JSON object's text as sent (its numbers as written), or `null`.
    metadata: Option<Box<RawValue>>,
    /// The id of the batch it joins (schema 39), or null for none.
    batch_id: Option<Value>,
}

/// The JSON body. The payload is borrowed from the body as sent, so that a large one is
/// copied once, into the payload text.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonBody<'a> {
    #[serde(borrow)]
    payload: &'a RawValue,
    /// Absent or `null`: the default queue, as for the other optional fields.
    #[serde(default)]
    queue: Option<String>,
    #[serde(default)]
    priority: Option<Value>,
    #[serde(default)]
    run_at: Option<Value>,
    #[serde(default)]
    max_attempts: Option<Value>,
    #[serde(default)]
    concurrency_key: Option<Value>,
    #[serde(default)]
    depends_on: Option<Value>,
    #[serde(default)]
    on_dep_failure: Option<Value>,
    #[serde(default)]
    tags: Option<Value>,
    /// Borrowed as sent: read by the rules of `tasks_metadata_check`, then stored as written.
    #[serde(default, borrow)]
    metadata: Option<&'a RawValue>,
    #[serde(default)]
    batch_id: Option<Value>,
}

/// The task fields of a `POST /tasks` query, each as text. `wait` is read by `wait.rs`.
#[derive(Debug, Default)]
struct QueryParams {
    queue: Option<String>,
    priority: Option<String>,
    run_at: Option<String>,
    max_attempts: Option<String>,
    concurrency_key: Option<String>,
    depends_on: Option<String>,
    on_dep_failure: Option<String>,
    tags: Option<String>,
    metadata: Option<String>,
    batch_id: Option<String>,
}

/// The parameters a query may hold, as a refusal names them.
const PARAMETERS: &str = "wait, queue, priority, run_at, max_attempts, concurrency_key, \
                          depends_on, on_dep_failure, tags, metadata and batch_id";

impl QueryParams {
    /// The parameters of `query` (percent-decoded, `+` a space, as a form's): 400 for one
    /// this route does not take, or one given twice.
    fn parse(query: Option<&str>) -> Result<QueryParams, ApiError> {
        let mut params = QueryParams::default();
        // Only so that a second one is refused too.
        let mut wait = None;
        for (name, value) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
            let slot = match &*name {
                "wait" => &mut wait,
                "queue" => &mut params.queue,
                "priority" => &mut params.priority,
                "run_at" => &mut params.run_at,
                "max_attempts" => &mut params.max_attempts,
                "concurrency_key" => &mut params.concurrency_key,
                "depends_on" => &mut params.depends_on,
                "on_dep_failure" => &mut params.on_dep_failure,
                "tags" => &mut params.tags,
                "metadata" => &mut params.metadata,
                "batch_id" => &mut params.batch_id,
                other => {
                    return Err(ApiError::BadRequest(format!(
                        "unknown query parameter {other:?}: POST /tasks takes {PARAMETERS}"
                    )))
                }
            };
            if slot.replace(value.into_owned()).is_some() {
                return Err(ApiError::BadRequest(format!(
                    "the query parameter {name} is given twice"
                )));
            }
        }
        Ok(params)
    }

    /// The task fields the query gives, by name (for a JSON body, which must not have any).
    fn fields(&self) -> impl Iterator<Item = &'static str> + '_ {
        [
            ("queue", self.queue.is_some()),
            ("priority", self.priority.is_some()),
            ("run_at", self.run_at.is_some()),
            ("max_attempts", self.max_attempts.is_some()),
            ("concurrency_key", self.concurrency_key.is_some()),
            ("depends_on", self.depends_on.is_some()),
            ("on_dep_failure", self.on_dep_failure.is_some()),
            ("tags", self.tags.is_some()),
            ("metadata", self.metadata.is_some()),
            ("batch_id", self.batch_id.is_some()),
        ]
        .into_iter()
        .filter_map(|(name, given)| given.then_some(name))
    }
}

impl Submission {
    /// The submission a request makes: its body, read by its `Content-Type`, and its query.
    ///
    /// # Errors
    ///
    /// 415 for a `Content-Type` other than `text/plain` or `application/json`; 400 for a body
    /// or a query that cannot be read, naming what is wrong.
    pub(super) fn read(
        headers: &HeaderMap,
        query: Option<&str>,
        body: &[u8],
    ) -> Result<Submission, ApiError> {
        let params = QueryParams::parse(query)?;
        match content_type(headers).as_deref() {
            Some("application/json") => {
                if let Some(field) = params.fields().next() {
                    return Err(ApiError::BadRequest(format!(
                        "{field} is given in the query of a JSON body: give it in the body"
                    )));
                }
                let body = serde_json::from_slice::<JsonBody>(body)
                    .map_err(|err| ApiError::BadRequest(format!("invalid JSON body: {err}")))?;
                Ok(Submission {
                    payload: json_payload(body.payload)?,
                    queue: body.queue,
                    priority: body.priority,
                    run_at: body.run_at,
                    max_attempts: body.max_attempts,
                    concurrency_key: body.concurrency_key,
                    depends_on: body.depends_on,
                    on_dep_failure: body.on_dep_failure,
                    tags: body.tags,
                    metadata: body.metadata.map(RawValue::to_owned),
                    batch_id: body.batch_id,
                })
            }
            Some("text/plain") => {
                let payload = std::str::from_utf8(body)
                    .map_err(|_| ApiError::BadRequest("the body is not UTF-8 text".into()))?;
                // An integer stays a number, anything else text, which the field's rule refuses.
                let number =
                    |text: String| text.parse::<i64>().map_or(Value::String(text), Value::from);
                Ok(Submission {
                    payload: payload.to_string(),
                    queue: params.queue,
                    priority: params.priority.map(number),
                    run_at: params.run_at.map(Value::String),
                    max_attempts: params.max_attempts.map(number),
                    concurrency_key: params.concurrency_key.map(Value::String),
                    // Read into ids here: the field's rule is the JSON array's from then on.
                    depends_on: params
                        .depends_on
                        .map(|text| queue::enqueue::parse_depends_on(&text))
                        .transpose()?
                        .map(Value::from),
                    on_dep_failure: params.on_dep_failure.map(Value::String),
                    // Read into a list here, as depends_on is.
                    tags: params
                        .tags
                        .map(|text| queue::enqueue::parse_tags(&text))
                        .transpose()?
                        .map(Value::from),
                    // Not JSON at all is refused as metadata that is not an object.
                    metadata: params
                        .metadata
                        .map(|text| {
                            RawValue::from_string(text)
                                .map_err(|_| ApiError::from(BadInput::MetadataType))
                        })
                        .transpose()?,
                    batch_id: params.batch_id.map(number),
                })
            }
            _ => Err(ApiError::UnsupportedMediaType),
        }
    }

    /// The task to insert: the fields checked by the rules `pgtaskd enqueue` applies
    /// (`queue::enqueue`), each error naming its field. A `null` is the column's default.
    pub(super) fn task(self, idempotency_key: Option<String>) -> Result<queue::NewTask, ApiError> {
        let integer = |value: &Value| value.as_i64();
        let priority = match self.priority.filter(|v| !v.is_null()) {
            None => None,
            Some(value) => Some(
                integer(&value)
                    .ok_or(BadInput::Priority)
                    .and_then(queue::enqueue::check_priority)?,
            ),
        };
        let max_attempts = match self.max_attempts.filter(|v| !v.is_null()) {
            None => None,
            Some(value) => Some(
                integer(&value)
                    .ok_or(BadInput::MaxAttempts)
                    .and_then(queue::enqueue::check_max_attempts)?,
            ),
        };
        let run_at = match self.run_at.filter(|v| !v.is_null()) {
            None => RunAt::Now,
            Some(Value::String(text)) => queue::enqueue::parse_run_at(&text)?,
            Some(other) => return Err(BadInput::RunAt(other.to_string()).into()),
        };
        let concurrency_key = match self.concurrency_key.filter(|v| !v.is_null()) {
            None => None,
            Some(Value::String(key)) => Some(key),
            Some(_) => return Err(BadInput::ConcurrencyKeyType.into()),
        };
        let depends_on = match self.depends_on.filter(|v| !v.is_null()) {
            None => Vec::new(),
            Some(Value::Array(ids)) => ids
                .iter()
                .map(|id| id.as_i64().ok_or(BadInput::DependsOn))
                .collect::<Result<Vec<i64>, BadInput>>()?,
            Some(_) => return Err(BadInput::DependsOn.into()),
        };
        let on_dep_failure = match self.on_dep_failure.filter(|v| !v.is_null()) {
            None => None,
            Some(Value::String(policy)) => Some(policy.parse::<queue::OnDepFailure>()?),
            Some(_) => return Err(BadInput::OnDepFailure.into()),
        };
        let tags = match &self.tags {
            None => Vec::new(),
            Some(value) => queue::enqueue::tags_from_json(value)?,
        };
        let metadata = match &self.metadata {
            None => None,
            Some(raw) => queue::enqueue::Metadata::from_json(raw)?,
        };
        let batch_id = match self.batch_id.filter(|v| !v.is_null()) {
            None => None,
            Some(value) => Some(value.as_i64().ok_or(BadInput::BatchId)?),
        };
        let task = queue::NewTask {
            queue: self
                .queue
                .unwrap_or_else(|| crate::config::DEFAULT_QUEUE.to_string()),
            payload: self.payload,
            priority,
            run_at,
            max_attempts,
            idempotency_key,
            concurrency_key,
            depends_on,
            on_dep_failure,
            tags,
            metadata,
            batch_id,
        };
        task.check()?;
        Ok(task)
    }
}

/// The media type of the request, lowercase and without its parameters.
fn content_type(headers: &HeaderMap) -> Option<String> {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        })
}

/// The payload text of a JSON body's `payload`: a string's text, an object's or an array's
/// [`compact`] JSON text; 400 for anything else.
fn json_payload(payload: &RawValue) -> Result<String, ApiError> {
    let text = payload.get();
    match text.as_bytes().first() {
        Some(b'"') => serde_json::from_str::<String>(text)
            .map_err(|err| ApiError::BadRequest(format!("invalid JSON body: {err}"))),
        Some(b'{' | b'[') => Ok(compact(text)),
        _ => {
            let what = match text {
                "null" => "null",
                "true" | "false" => "a boolean",
                _ => "a number",
            };
            Err(ApiError::BadRequest(format!(
                "payload is {what}: it must be a string (the task's text), or an object or an \
                 array (stored as its JSON text)"
            )))
        }
    }
}

/// Valid JSON text without the whitespace between its tokens: what is inside strings, the
/// order of keys and the digits of numbers stay as they are.
fn compact(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    let mut in_string = false;
    let mut escaped = false;
    for c in json.chars() {
        if in_string {
            out.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
        } else if !matches!(c, ' ' | '\t' | '\n' | '\r') {
            in_string = c == '"';
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests;
