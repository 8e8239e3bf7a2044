use super::*;

#[test]
fn a_tag_is_a_letter_or_digit_then_62_of_letters_digits_and_four_marks() {
    for good in ["a", "9", "env:prod", "build-42", "v1.2_rc", &"a".repeat(63)] {
        assert_eq!(check_tag(good), Ok(()), "{good}");
    }
    for bad in [
        "",
        "-a",
        "_a",
        ".a",
        ":a",
        "a b",
        "a,b",
        "é",
        "a/b",
        "a\n",
        &"a".repeat(64),
    ] {
        assert_eq!(
            check_tag(bad),
            Err(BadInput::Tag(bad.to_string())),
            "{bad:?}"
        );
    }
    let many: Vec<String> = (0..17).map(|i| format!("t{i}")).collect();
    assert_eq!(check_tags(&many[..16]), Ok(()));
    assert_eq!(check_tags(&many), Err(BadInput::TooManyTags(17)));
    assert_eq!(
        BadInput::Tag("a b".into()).to_string(),
        "tag \"a b\" is not a letter or digit followed by at most 62 letters, digits and \
         _ . : -"
    );
}

#[test]
fn tags_come_as_a_list_of_strings_or_a_query_of_commas() {
    let list = serde_json::json!(["a", "b"]);
    assert_eq!(tags_from_json(&list), Ok(vec!["a".into(), "b".into()]));
    assert_eq!(tags_from_json(&serde_json::Value::Null), Ok(vec![]));
    for bad in [
        serde_json::json!("a"),
        serde_json::json!([1]),
        serde_json::json!([null]),
    ] {
        assert_eq!(tags_from_json(&bad), Err(BadInput::TagsType), "{bad}");
    }
    assert_eq!(parse_tags("a,b"), Ok(vec!["a".into(), "b".into()]));
    assert_eq!(parse_tags("a,"), Err(BadInput::Tag(String::new())));
}

#[test]
fn metadata_is_printed_as_jsonb_prints_it() {
    for (json, printed) in [
        (r#"{}"#, "{}"),
        (
            r#" { "b" : 1 , "a" : [ ] , "aa": {} } "#,
            r#"{"a": [], "b": 1, "aa": {}}"#,
        ),
        (r#"{"k": 1, "k": 2}"#, r#"{"k": 2}"#),
        (
            r#"{"n": [1e3, 1.5e1, 1.25e1, 125e-1, 1e-3, 1.0e-3, -0, -0.0, 0.012e3, 0e5]}"#,
            r#"{"n": [1000, 15, 12.5, 12.5, 0.001, 0.0010, 0, 0.0, 12, 0]}"#,
        ),
        (
            r#"{"n": [-1.50, 1E+2, 100e-2, 12345678901234567890123]}"#,
            r#"{"n": [-1.50, 100, 1.00, 12345678901234567890123]}"#,
        ),
        (
            r#"{"s": "\u00e9\t\"\\\/\u0001\u007f"}"#,
            "{\"s\": \"é\\t\\\"\\\\/\\u0001\u{7f}\"}",
        ),
        (
            r#"{"t": true, "f": false, "z": null}"#,
            r#"{"f": false, "t": true, "z": null}"#,
        ),
    ] {
        assert_eq!(jsonb_text(json).as_deref(), Ok(printed), "{json}");
    }
    assert_eq!(
        jsonb_text(r#"{"s": "a\u0000"}"#),
        Err(BadInput::MetadataNul)
    );
    assert!(matches!(
        jsonb_text(r#"{"n": 1e9000}"#),
        Err(BadInput::MetadataTooLarge(9001))
    ));
    assert!(matches!(
        jsonb_text(r#"{"n": 1e99999999999999999999}"#),
        Err(BadInput::MetadataTooLarge(_))
    ));
    for bad in [
        r#"{"a"}"#,
        r#"{"a": 01}"#,
        r#"{"a": 1.}"#,
        "{",
        r#"{"a": 1} x"#,
        "nul",
    ] {
        assert_eq!(jsonb_text(bad), Err(BadInput::MetadataType), "{bad}");
    }
    let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
    assert_eq!(jsonb_text(&deep), Err(BadInput::MetadataDepth));
}

#[test]
fn metadata_is_an_object_of_at_most_8_kib_as_printed() {
    assert_eq!(
        Metadata::parse(r#"{"a":1}"#).map(|m| m.as_str().to_string()),
        Ok(r#"{"a":1}"#.to_string())
    );
    for bad in ["[]", "\"x\"", "1", "null"] {
        assert_eq!(Metadata::parse(bad), Err(BadInput::MetadataType), "{bad}");
    }
    // {"k": "xxx..."}: 9 bytes around the value.
    let fits = format!(r#"{{"k":"{}"}}"#, "x".repeat(MAX_METADATA_BYTES - 9));
    assert!(Metadata::parse(&fits).is_ok());
    let over = format!(r#"{{"k":"{}"}}"#, "x".repeat(MAX_METADATA_BYTES - 8));
    assert_eq!(
        Metadata::parse(&over),
        Err(BadInput::MetadataTooLarge(MAX_METADATA_BYTES + 1))
    );
    let raw = RawValue::from_string("null".into()).unwrap();
    assert_eq!(Metadata::from_json(&raw), Ok(None));
}

#[test]
fn pairs_make_an_object_of_strings_each_key_once() {
    let pairs = vec![
        ("owner".to_string(), "ann".to_string()),
        ("n".into(), "1".into()),
    ];
    let metadata = Metadata::from_pairs(&pairs).unwrap().unwrap();
    assert_eq!(
        jsonb_text(metadata.as_str()).unwrap(),
        r#"{"n": "1", "owner": "ann"}"#
    );
    assert_eq!(Metadata::from_pairs(&[]), Ok(None));
    let twice = vec![("k".to_string(), "a".to_string()), ("k".into(), "b".into())];
    assert_eq!(
        Metadata::from_pairs(&twice),
        Err(BadInput::MetaKeyTwice("k".into()))
    );
    assert_eq!(
        parse_meta_term("owner=ann=b", '='),
        Ok(("owner".into(), "ann=b".into()))
    );
    assert_eq!(parse_meta_term("k:", ':'), Ok(("k".into(), String::new())));
    for bad in ["owner", "=ann"] {
        assert!(matches!(
            parse_meta_term(bad, '='),
            Err(BadInput::MetaTerm { .. })
        ));
    }
}

#[test]
fn the_databases_refusals_of_tags_and_metadata_are_told_from_others() {
    let tags = DbError::answered(
        "new row for relation \"tasks\" violates check constraint \"tasks_tags_check\"",
        SqlState::CHECK_VIOLATION,
    );
    assert!(tags_refusal(&tags).unwrap().contains("tags"));
    let other = DbError::answered(
        "new row for relation \"tasks\" violates check constraint \"tasks_queue_name\"",
        SqlState::CHECK_VIOLATION,
    );
    assert_eq!(tags_refusal(&other), None);
    assert_eq!(
        tags_refusal(&DbError::unavailable("connection refused")),
        None
    );
}
