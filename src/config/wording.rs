//! What each key takes, in plain words, for the errors serde words in its own terms
//! ("invalid type: string \"eight\", expected usize", humantime's "expected number at 0").
//! Called by `Config::from_toml` with the key, the value as written, and serde's message.

/// What `key` must be, or `None` for a key this table does not know.
fn expected(key: &str) -> Option<&'static str> {
    const DURATION: &str = "a duration in quotes, such as \"250ms\", \"30s\", \"5m\" or \"7days\"";
    const COUNT: &str = "a whole number, 1 or more";
    const SIZE: &str = "a number of bytes, or a size in quotes such as \"256MiB\" or \"1GB\"";
    Some(match key {
        "database.url" | "database.listen_url" => {
            "a connection string in quotes (a postgresql:// URL or key=value pairs)"
        }
        "database.pooler" => "\"none\" or \"transaction\"",
        "database.pool_size" | "worker.concurrency" | "http.max_connections" => COUNT,
        "database.connect_timeout"
        | "database.statement_timeout"
        | "worker.poll_interval"
        | "worker.lease"
        | "shutdown.grace"
        | "retention.finished_after"
        | "http.header_timeout"
        | "health.check_interval"
        | "health.xmin_horizon_warning"
        | "vacuum_health.check_interval"
        | "vacuum_health.xmin_horizon_warning" => DURATION,
        "worker.queues" => "a list of queue names, such as [\"default\", \"mail\"]",
        "worker.max_inflight_bytes"
        | "worker.max_payload_bytes"
        | "http.max_body"
        | "http.max_inflight_bytes" => SIZE,
        "http.listen" => "HOST:PORT in quotes, such as \"127.0.0.1:8080\" or \"localhost:8080\"",
        "http.token_file" => "a file path in quotes",
        "log.format" => "\"text\" or \"json\"",
        "log.level" => "a filter in quotes, such as \"info\" or \"pgtaskd=debug,warn\"",
        _ => return None,
    })
}

/// serde's or humantime's account of a value of the wrong type or form, as opposed to an
/// unknown key, a duplicate, or a syntax error, which keep their own words.
fn is_value_error(message: &str) -> bool {
    [
        "invalid type",
        "invalid value",
        "invalid duration",
        "invalid size",
        "data did not match",
        "unknown variant",
    ]
    .iter()
    .any(|start| message.starts_with(start))
}

/// `key must be WHAT (found VALUE)` in the place of serde's `message`, when `key` is known
/// and `message` is about its value.
pub(super) fn plain(key: &str, found: &str, message: &str) -> Option<String> {
    if !is_value_error(message) {
        return None;
    }
    let what = expected(key)?;
    let found = found.trim();
    Some(if found.is_empty() {
        format!("{key} must be {what}")
    } else {
        format!("{key} must be {what} (found {found})")
    })
}

#[cfg(test)]
mod tests {
    use super::plain;

    #[test]
    fn a_value_error_of_a_known_key_is_said_in_plain_words() {
        assert_eq!(
            plain(
                "worker.concurrency",
                "\"eight\"",
                "invalid type: string \"eight\", expected usize"
            )
            .as_deref(),
            Some("worker.concurrency must be a whole number, 1 or more (found \"eight\")")
        );
        assert_eq!(plain("worker.concurency", "3", "invalid type: x"), None);
        assert_eq!(plain("worker.lease", "3", "duplicate key"), None);
    }
}
