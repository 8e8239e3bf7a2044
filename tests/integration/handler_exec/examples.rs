//! The example handlers of docs/examples (shown in docs/handlers.md), run as the daemon runs
//! them: so that what the documentation shows works.

use super::*;

fn example(name: &str) -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("docs/examples")
        .join(name);
    assert!(path.exists(), "{} is missing", path.display());
    vec![path.to_str().expect("UTF-8 path").to_owned()]
}

#[tokio::test]
async fn the_shell_example_answers_a_checksum() {
    let output = succeeded(exec(&spec(example("checksum.sh")), b"hello").await);
    assert_eq!(
        output,
        "{\"bytes\": 5, \"sha256\": \
         \"2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824\"}\n"
    );
}

#[tokio::test]
async fn the_shell_example_fails_an_empty_payload_for_good() {
    let failure = failed(exec(&spec(example("checksum.sh")), b"").await);
    assert_eq!(
        (failure.kind, failure.retry),
        (FailureKind::Exit, Retry::Never)
    );
    assert!(
        failure.message.ends_with(
            "exited with status 65; stderr: task 42, attempt 2, queue thumbnails\n\
             the payload is empty: nothing to checksum"
        ),
        "{}",
        failure.message
    );
}

/// The Python example needs `python3` on the PATH (`apt-get install python3`).
#[tokio::test]
async fn the_python_example_answers_json() {
    let payload = r#"{"text": "une tâche de plus", "shout": true}"#.as_bytes();
    let output = succeeded(exec(&spec(example("handler.py")), payload).await);
    assert_eq!(
        output, "{\"task\": 42, \"words\": 4, \"text\": \"UNE TÂCHE DE PLUS\"}\n",
        "python3 must be on the PATH for this test"
    );
}

#[tokio::test]
async fn the_python_example_fails_bad_json_for_good() {
    let failure = failed(exec(&spec(example("handler.py")), b"{not json").await);
    assert_eq!(
        (failure.kind, failure.retry),
        (FailureKind::Exit, Retry::Never),
        "{} (python3 must be on the PATH for this test)",
        failure.message
    );
    assert!(
        failure
            .message
            .contains("run 4, key 0123456789abcdef-42-1765000000000000\nthe payload is not JSON: "),
        "{}",
        failure.message
    );
}
