use super::*;

#[test]
fn priority_max_attempts_and_run_at_have_the_columns_rules() {
    assert_eq!(check_priority(-32768), Ok(i16::MIN));
    assert_eq!(check_priority(32768), Err(BadInput::Priority));
    assert_eq!(check_max_attempts(1), Ok(1));
    assert_eq!(check_max_attempts(0), Err(BadInput::MaxAttempts));
    assert_eq!(check_max_attempts(1 << 31), Err(BadInput::MaxAttempts));
    assert!(matches!(
        parse_run_at("2026-12-01T08:00:00Z"),
        Ok(RunAt::At(_))
    ));
    assert_eq!(
        parse_run_at("10m"),
        Ok(RunAt::After(std::time::Duration::from_secs(600)))
    );
    for bad in ["tomorrow", "2026-12-01", "101years", ""] {
        assert!(
            matches!(parse_run_at(bad), Err(BadInput::RunAt(_))),
            "{bad}"
        );
    }
}

#[test]
fn queue_names_are_one_to_128_bytes_without_nul() {
    assert_eq!(check_queue_name("default"), Ok(()));
    assert_eq!(check_queue_name(&"é".repeat(64)), Ok(()));
    assert_eq!(check_queue_name("a\u{1b}[31m"), Ok(()));
    assert_eq!(check_queue_name(""), Err(BadInput::QueueEmpty));
    assert_eq!(check_queue_name(" \t"), Err(BadInput::QueueEmpty));
    assert_eq!(
        check_queue_name(&"é".repeat(65)),
        Err(BadInput::QueueTooLong(130))
    );
    assert_eq!(check_queue_name("a\0b"), Err(BadInput::QueueNul));
}

#[test]
fn keys_are_one_to_255_visible_ascii_characters() {
    assert_eq!(check_idempotency_key("order-42"), Ok(()));
    assert_eq!(check_idempotency_key(&"k".repeat(255)), Ok(()));
    for bad in ["", "a b", "clé", "\0"] {
        assert_eq!(check_idempotency_key(bad), Err(BadInput::Key), "{bad:?}");
    }
    assert_eq!(check_idempotency_key(&"k".repeat(256)), Err(BadInput::Key));
    assert_eq!(
        check_idempotency_key("schedule:nightly:2026-12-07T01:30:00Z"),
        Err(BadInput::KeyKept)
    );
    assert_eq!(check_idempotency_key("schedules"), Ok(()));
}

#[test]
fn a_task_is_checked_field_by_field() {
    let mut task = NewTask::new("q", "text");
    assert_eq!(task.check(), Ok(()));
    task.payload = "a\0".into();
    assert_eq!(task.check(), Err(BadInput::PayloadNul));
    task.payload = "a".into();
    task.idempotency_key = Some(String::new());
    assert_eq!(task.check(), Err(BadInput::Key));
    task.idempotency_key = None;
    task.concurrency_key = Some("k".repeat(257));
    assert_eq!(task.check(), Err(BadInput::ConcurrencyKeyTooLong(257)));
    task.concurrency_key = Some("é".repeat(128));
    assert_eq!(task.check(), Ok(()));
    task.concurrency_key = Some("a\0".into());
    assert_eq!(task.check(), Err(BadInput::ConcurrencyKeyNul));
    task.concurrency_key = None;
    task.depends_on = vec![1; MAX_PARENTS + 1];
    assert_eq!(task.check(), Err(BadInput::TooManyParents(MAX_PARENTS + 1)));
    task.depends_on.truncate(MAX_PARENTS);
    assert_eq!(task.check(), Ok(()));
    task.tags = vec!["ok".into(), "not ok".into()];
    assert_eq!(task.check(), Err(BadInput::Tag("not ok".into())));
    task.tags = (0..17).map(|i| i.to_string()).collect();
    assert_eq!(task.check(), Err(BadInput::TooManyTags(17)));
    task.tags.truncate(16);
    assert_eq!(task.check(), Ok(()));
}
