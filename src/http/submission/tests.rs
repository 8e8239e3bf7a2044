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

#[test]
fn a_batch_id_is_an_integer_from_the_body_or_the_query_and_null_is_none() {
    let task = |body: &str| json(body).and_then(|submission| submission.task(None));
    assert_eq!(
        task(r#"{"payload": "p", "batch_id": 7}"#).unwrap().batch_id,
        Some(7)
    );
    assert_eq!(
        task(r#"{"payload": "p", "batch_id": null}"#)
            .unwrap()
            .batch_id,
        None
    );
    assert_eq!(task(r#"{"payload": "p"}"#).unwrap().batch_id, None);
    assert_eq!(text("batch_id=7", "p").unwrap().batch_id, Some(7));
    for bad in [r#""7""#, "7.5", "[7]"] {
        let err = task(&format!(r#"{{"payload": "p", "batch_id": {bad}}}"#)).unwrap_err();
        assert!(matches!(&err, ApiError::BadRequest(_)), "{bad}: {err:?}");
        assert!(err.to_string().contains("batch_id"), "{err}");
    }
    let err = text("batch_id=seven", "p").unwrap_err();
    assert!(err.to_string().contains("batch_id"), "{err}");
    // With a JSON body, the field is the body's.
    let err = Submission::read(
        &headers("application/json"),
        Some("batch_id=7"),
        br#"{"payload": "p"}"#,
    )
    .unwrap_err();
    assert!(err.to_string().contains("batch_id"), "{err}");
}
