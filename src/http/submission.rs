//! What a `POST /tasks` asks for: the body (`text/plain` or `application/json`) and the query,
//! read into one [`Submission`] whose fields are then checked by the rules `pgtaskd enqueue`
//! applies (`queue::enqueue`), each error naming its field (docs/http.md, "Submitting a task").
//!
//! - `text/plain`: the body is the payload; `queue`, `priority`, `run_at`, `max_attempts`,
//!   `concurrency_key`, `depends_on` (ids separated by commas), `on_dep_failure`, `tags`
//!   (separated by commas) and `metadata` (a JSON object's text) come from the query
//!   (`?queue=thumbs&priority=5&depends_on=12,13&tags=a,b`).
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
}

/// The parameters a query may hold, as a refusal names them.
const PARAMETERS: &str = "wait, queue, priority, run_at, max_attempts, concurrency_key, \
                          depends_on, on_dep_failure, tags and metadata";

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
mod tests {
    use super::*;

    fn headers(content_type: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_TYPE, content_type.parse().unwrap());
        headers
    }

    fn json(body: &str) -> Result<Submission, ApiError> {
        Submission::read(&headers("application/json"), None, body.as_bytes())
    }

    fn text(query: &str, body: &str) -> Result<queue::NewTask, ApiError> {
        Submission::read(
            &headers("text/plain; charset=utf-8"),
            Some(query),
            body.as_bytes(),
        )?
        .task(None)
    }

    #[test]
    fn an_object_or_an_array_payload_is_its_compact_json_text() {
        let body = r#"{"payload": { "b" : [1, 2.50, 12345678901234567890123],
            "a": "x  \" y\\" , "c": {} }}"#;
        assert_eq!(
            json(body).unwrap().payload,
            r#"{"b":[1,2.50,12345678901234567890123],"a":"x  \" y\\","c":{}}"#
        );
        assert_eq!(json(r#"{"payload": [ ]}"#).unwrap().payload, "[]");
        assert_eq!(
            json(r#"{"payload": "a string\nstays text"}"#)
                .unwrap()
                .payload,
            "a string\nstays text"
        );
    }

    #[test]
    fn a_number_a_boolean_or_null_payload_is_refused() {
        for (payload, what) in [
            ("5", "a number"),
            ("-1.5e3", "a number"),
            ("true", "a boolean"),
            ("null", "null"),
        ] {
            let err = json(&format!(r#"{{"payload": {payload}}}"#))
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(&format!("payload is {what}")),
                "{payload}: {err}"
            );
        }
    }

    #[test]
    fn a_text_body_takes_its_fields_from_the_query() {
        let task = text(
            "queue=thumbs&priority=-5&max_attempts=7&run_at=10m&wait=1s&concurrency_key=t%201",
            "x",
        )
        .unwrap();
        assert_eq!(task.concurrency_key.as_deref(), Some("t 1"));
        assert_eq!(task.queue, "thumbs");
        assert_eq!(task.priority, Some(-5));
        assert_eq!(task.max_attempts, Some(7));
        assert!(!matches!(task.run_at, RunAt::Now));
        assert_eq!(text("queue=th%C3%BCmbs+2", "x").unwrap().queue, "thümbs 2");
        assert_eq!(text("", "x").unwrap().queue, crate::config::DEFAULT_QUEUE);
        for (query, says) in [
            ("queue=", "queue name is empty"),
            ("priority=high", "priority"),
            ("priority=40000", "priority"),
            ("max_attempts=0", "max_attempts"),
            ("run_at=someday", "run_at"),
            ("queue=a&queue=b", "given twice"),
            ("qeue=thumbs", "unknown query parameter \"qeue\""),
        ] {
            let err = text(query, "x").unwrap_err().to_string();
            assert!(err.contains(says), "{query}: {err}");
        }
    }

    #[test]
    fn a_json_body_takes_no_field_from_the_query() {
        let err = Submission::read(
            &headers("application/json"),
            Some("queue=thumbs"),
            br#"{"payload": "x"}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("queue is given in the query"), "{err}");
        let task = json(r#"{"payload": "x", "concurrency_key": "tenant-42"}"#)
            .unwrap()
            .task(None)
            .unwrap();
        assert_eq!(task.concurrency_key.as_deref(), Some("tenant-42"));
        for (body, says) in [
            (
                format!(
                    r#"{{"payload": "x", "concurrency_key": "{}"}}"#,
                    "k".repeat(257)
                ),
                "concurrency key is 257 bytes long; the limit is 256",
            ),
            (
                r#"{"payload": "x", "concurrency_key": 42}"#.to_string(),
                "concurrency_key must be a string",
            ),
        ] {
            let err = json(&body).unwrap().task(None).unwrap_err().to_string();
            assert!(err.contains(says), "{body}: {err}");
        }
        assert!(Submission::read(
            &headers("application/json"),
            Some("wait=1s"),
            br#"{"payload": "x"}"#
        )
        .is_ok());
    }

    #[test]
    fn parents_are_a_list_of_ids_and_a_policy_of_three() {
        let task = json(r#"{"payload": "x", "depends_on": [12, 13], "on_dep_failure": "run"}"#)
            .unwrap()
            .task(None)
            .unwrap();
        assert_eq!(task.depends_on, [12, 13]);
        assert_eq!(task.on_dep_failure, Some(queue::OnDepFailure::Run));
        let task = json(r#"{"payload": "x", "depends_on": null, "on_dep_failure": null}"#)
            .unwrap()
            .task(None)
            .unwrap();
        assert!(task.depends_on.is_empty() && task.on_dep_failure.is_none());
        let task = text("depends_on=12,%2013&on_dep_failure=wait", "x").unwrap();
        assert_eq!(task.depends_on, [12, 13]);
        assert_eq!(task.on_dep_failure, Some(queue::OnDepFailure::Wait));
        let many = (1..=10_001)
            .map(|id| id.to_string())
            .collect::<Vec<_>>()
            .join(",");
        for (body, says) in [
            (
                r#"{"payload": "x", "depends_on": 12}"#.to_string(),
                "depends_on must be a list",
            ),
            (
                r#"{"payload": "x", "depends_on": ["12"]}"#.to_string(),
                "depends_on must be a list",
            ),
            (
                r#"{"payload": "x", "depends_on": [1.5]}"#.to_string(),
                "depends_on must be a list",
            ),
            (
                format!(r#"{{"payload": "x", "depends_on": [{many}]}}"#),
                "depends_on names 10001 tasks; the limit is 10000",
            ),
            (
                r#"{"payload": "x", "on_dep_failure": "skip"}"#.to_string(),
                "on_dep_failure must be",
            ),
            (
                r#"{"payload": "x", "on_dep_failure": 1}"#.to_string(),
                "on_dep_failure must be",
            ),
        ] {
            let err = json(&body).unwrap().task(None).unwrap_err().to_string();
            assert!(err.contains(says), "{body:.80}: {err}");
        }
        for (query, says) in [
            ("depends_on=12,x", "depends_on must be a list"),
            ("depends_on=", "depends_on must be a list"),
            ("on_dep_failure=Cancel", "on_dep_failure must be"),
        ] {
            let err = text(query, "x").unwrap_err().to_string();
            assert!(err.contains(says), "{query}: {err}");
        }
    }

    #[test]
    fn tags_and_metadata_come_from_the_body_or_the_query_and_a_bad_one_is_422() {
        let task = json(r#"{"payload": "x", "tags": ["a", "b"], "metadata": {"n": 1.50}}"#)
            .unwrap()
            .task(None)
            .unwrap();
        assert_eq!(task.tags, ["a", "b"]);
        assert_eq!(task.metadata.unwrap().as_str(), r#"{"n": 1.50}"#);
        let task = json(r#"{"payload": "x", "tags": null, "metadata": null}"#)
            .unwrap()
            .task(None)
            .unwrap();
        assert!(task.tags.is_empty() && task.metadata.is_none());
        let task = text("tags=a,b&metadata=%7B%22k%22%3A%22v%22%7D", "x").unwrap();
        assert_eq!(task.tags, ["a", "b"]);
        assert_eq!(task.metadata.unwrap().as_str(), r#"{"k":"v"}"#);
        for body in [
            r#"{"payload": "x", "tags": ["a b"]}"#,
            r#"{"payload": "x", "tags": "a"}"#,
            r#"{"payload": "x", "metadata": []}"#,
        ] {
            let err = json(body).unwrap().task(None).unwrap_err();
            assert!(matches!(err, ApiError::BadTags(_)), "{body}: {err:?}");
        }
        for query in ["tags=a,", "metadata=x"] {
            let err = text(query, "x").unwrap_err();
            assert!(matches!(err, ApiError::BadTags(_)), "{query}: {err:?}");
        }
        let err = Submission::read(
            &headers("application/json"),
            Some("tags=a"),
            br#"{"payload": "x"}"#,
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("tags is given in the query"),
            "{err}"
        );
    }
}
