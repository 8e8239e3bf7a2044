//! What a progress line must be to be kept: a JSON object of at most [`MAX_LINE`] bytes,
//! whose `percent`, when it has one, is a number from 0 to 100. Any other keys are the
//! handler's own (a checkpoint: a cursor, the last id done). Pure.

use serde_json::Value;

use super::line::MAX_LINE;

/// Why a progress line was dropped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("a progress line is at most {MAX_LINE} bytes")]
    TooLong,
    #[error("a progress line is one JSON object: {0}")]
    NotJson(String),
    #[error("a progress line is one JSON object, not {0}")]
    NotObject(&'static str),
    #[error("\"percent\" must be a number from 0 to 100")]
    Percent,
    #[error("a progress line cannot hold the character U+0000, which jsonb cannot store")]
    Nul,
}

impl Refused {
    /// The reason's label on `/metrics`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Refused::TooLong => "too_long",
            Refused::NotJson(_) => "not_json",
            Refused::NotObject(_) => "not_object",
            Refused::Percent => "percent",
            Refused::Nul => "nul",
        }
    }
}

/// The text kept of `line`: the line itself, trimmed, once it is known to be a JSON object
/// within the bound, with a `percent` of 0 to 100 if any, and no U+0000 (which `jsonb`
/// refuses).
///
/// # Errors
///
/// What is wrong with it.
pub fn check(line: &[u8]) -> Result<String, Refused> {
    if line.len() > MAX_LINE {
        return Err(Refused::TooLong);
    }
    let value: Value = serde_json::from_slice(line).map_err(|err| {
        // serde_json's words without "at line 1 column 7", which says little of a line.
        let text = err.to_string();
        let text = match text.rfind(" at line ") {
            Some(at) => text[..at].to_string(),
            None => text,
        };
        Refused::NotJson(text)
    })?;
    let Value::Object(object) = &value else {
        return Err(Refused::NotObject(kind(&value)));
    };
    if let Some(percent) = object.get("percent") {
        match percent.as_f64() {
            Some(p) if (0.0..=100.0).contains(&p) => {}
            _ => return Err(Refused::Percent),
        }
    }
    if holds_nul(&value) {
        return Err(Refused::Nul);
    }
    // The table's bound is on the text `jsonb` prints, which has a space after every `:` and
    // `,`: a line within the bound may be over it once stored.
    if printed_len(&value) > MAX_LINE {
        return Err(Refused::TooLong);
    }
    // Nor may its ASCII form, which the next attempt of an `http` handler gets as a header
    // ([`ascii_json`]: a character outside ASCII as one or two `\uXXXX`): 1,000 emoji, 4 KB
    // of text, were a 12 KB header, which a proxy's 8 KB buffer answers with 400 at every
    // attempt after.
    if printed_len(&value) + escapes_added(&value) > MAX_LINE {
        return Err(Refused::TooLong);
    }
    // Checked as UTF-8 by the parse.
    let text = std::str::from_utf8(line).map_err(|err| Refused::NotJson(err.to_string()))?;
    Ok(text.trim().to_string())
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The length of `value` as PostgreSQL prints a `jsonb` (`jsonb::text`): `", "` and `": "`
/// between items, strings with `"`, `\\` and control characters escaped and every other
/// character as it is; numbers as serde_json writes them (PostgreSQL writes an exponent out,
/// `1e300` as 301 digits: such a report is left unwritten by the database's own check).
fn printed_len(value: &Value) -> usize {
    match value {
        Value::Null => 4,
        Value::Bool(true) => 4,
        Value::Bool(false) => 5,
        Value::Number(number) => number_len(&number.to_string()),
        Value::String(text) => string_len(text),
        Value::Array(items) => {
            2 + items.iter().map(printed_len).sum::<usize>() + 2 * items.len().saturating_sub(1)
        }
        Value::Object(map) => {
            2 + map
                .iter()
                .map(|(key, value)| string_len(key) + 2 + printed_len(value))
                .sum::<usize>()
                + 2 * map.len().saturating_sub(1)
        }
    }
}

/// The length of `number` (as serde_json writes it, `1e-300` say) as PostgreSQL prints it, in
/// positional notation: `0.` and 299 zeros before the `1`.
fn number_len(number: &str) -> usize {
    let (sign, digits) = match number.strip_prefix('-') {
        Some(rest) => (1, rest),
        None => (0, number),
    };
    let (mantissa, exponent) = match digits.find(['e', 'E']) {
        Some(at) => (
            &digits[..at],
            digits[at + 1..]
                .parse::<i64>()
                .unwrap_or(i64::from(i32::MAX)),
        ),
        None => (digits, 0),
    };
    let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let count = i64::try_from(whole.len() + fraction.len()).unwrap_or(i64::MAX);
    // Where the decimal point falls, counted in digits from the first.
    let point = i64::try_from(whole.len())
        .unwrap_or(i64::MAX)
        .saturating_add(exponent);
    let len = if point <= 0 {
        // `0.`, the zeros, then the digits.
        2i64.saturating_add(point.saturating_neg())
            .saturating_add(count)
    } else if point >= count {
        point
    } else {
        count + 1
    };
    sign + usize::try_from(len).unwrap_or(usize::MAX)
}

fn string_len(text: &str) -> usize {
    2 + text
        .bytes()
        .map(|b| match b {
            b'"' | b'\\' | 0x08 | 0x0c | b'\n' | b'\r' | b'\t' => 2,
            0..=0x1f => 6,
            _ => 1,
        })
        .sum::<usize>()
}

/// The bytes [`ascii_json`] adds to `value`'s text: six a UTF-16 unit for every character
/// outside ASCII (and DEL) of its strings and keys, less the character's own UTF-8 bytes.
fn escapes_added(value: &Value) -> usize {
    let of = |text: &str| -> usize {
        text.chars()
            .filter(|&c| !c.is_ascii() || c == '\x7f')
            .map(|c| 6 * c.len_utf16() - c.len_utf8())
            .sum()
    };
    match value {
        Value::String(text) => of(text),
        Value::Array(items) => items.iter().map(escapes_added).sum(),
        Value::Object(map) => map
            .iter()
            .map(|(key, value)| of(key) + escapes_added(value))
            .sum(),
        _ => 0,
    }
}

fn holds_nul(value: &Value) -> bool {
    match value {
        Value::String(text) => text.contains('\0'),
        Value::Array(items) => items.iter().any(holds_nul),
        Value::Object(map) => map
            .iter()
            .any(|(key, value)| key.contains('\0') || holds_nul(value)),
        _ => false,
    }
}

/// `json` as a header value can carry it: the same JSON, with every character outside
/// ASCII written as a `\uXXXX` escape (two for a character outside the Basic Multilingual
/// Plane). JSON's own text outside strings is ASCII, and its strings escape control
/// characters, so the result is visible ASCII and spaces, and parses to the same value.
pub fn ascii_json(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        // DEL is ASCII, but no header value may hold it: escaped as a control character.
        if c.is_ascii() && c != '\x7f' {
            out.push(c);
        } else {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_whose_header_form_is_over_the_bound_is_refused() {
        // 1,015 emoji: 4,084 bytes as text, 12,204 as the header's \uXXXX escapes.
        let emoji = format!(r#"{{"percent":10,"m":"{}"}}"#, "\u{1F600}".repeat(1015));
        assert!(emoji.len() <= MAX_LINE);
        assert!(ascii_json(&emoji).len() > 2 * MAX_LINE);
        assert_eq!(check(emoji.as_bytes()), Err(Refused::TooLong));
        // As many as fit: the header form at most MAX_LINE.
        let fits = format!(r#"{{"percent":10,"m":"{}"}}"#, "\u{1F600}".repeat(330));
        let kept = check(fits.as_bytes()).expect("within the bound");
        assert!(
            ascii_json(&kept).len() <= MAX_LINE,
            "{}",
            ascii_json(&kept).len()
        );
        let accents = format!(r#"{{"m":"{}"}}"#, "é".repeat(1000));
        assert_eq!(check(accents.as_bytes()), Err(Refused::TooLong));
    }

    #[test]
    fn objects_with_a_percent_of_0_to_100_are_kept() {
        for ok in [
            r#"{"percent": 40, "message": "copying"}"#,
            r#"{"percent": 0}"#,
            r#"{"percent": 100.0}"#,
            r#"{"percent": 12.5, "cursor": {"table": "orders", "after": 91823}}"#,
            r#"{"message": "no percent at all"}"#,
            r#"  {"cursor": "ü日本"}  "#,
            "{}",
        ] {
            assert_eq!(check(ok.as_bytes()).as_deref(), Ok(ok.trim()), "{ok}");
        }
    }

    #[test]
    fn anything_else_is_refused_with_its_reason() {
        let refused = |line: &str| check(line.as_bytes()).unwrap_err();
        assert_eq!(refused(r#"{"percent": 500}"#), Refused::Percent);
        assert_eq!(refused(r#"{"percent": -1}"#), Refused::Percent);
        assert_eq!(refused(r#"{"percent": "40"}"#), Refused::Percent);
        assert_eq!(refused(r#"{"percent": null}"#), Refused::Percent);
        assert_eq!(refused("[1, 2]"), Refused::NotObject("an array"));
        assert_eq!(refused("42"), Refused::NotObject("a number"));
        assert_eq!(refused(r#""text""#), Refused::NotObject("a string"));
        assert_eq!(refused("null"), Refused::NotObject("null"));
        assert!(matches!(refused("{not json"), Refused::NotJson(_)));
        assert!(matches!(
            refused(r#"{"a": 1} {"b": 2}"#),
            Refused::NotJson(_)
        ));
        assert!(matches!(
            check(b"{\"a\": \"\xff\"}").unwrap_err(),
            Refused::NotJson(_)
        ));
        assert_eq!(refused(r#"{"a": "x\u0000y"}"#), Refused::Nul);
        assert_eq!(refused(r#"{"a": [{"\u0000": 1}]}"#), Refused::Nul);
        let long = format!(r#"{{"a": "{}"}}"#, "x".repeat(MAX_LINE));
        assert_eq!(refused(&long), Refused::TooLong);
        // Within the bound as written, over it as jsonb prints it.
        let items = vec!["1"; 1500].join(",");
        let compact = format!(r#"{{"a":[{items}]}}"#);
        assert!(compact.len() <= MAX_LINE);
        assert_eq!(refused(&compact), Refused::TooLong);
        // Short as written, 300 digits each as PostgreSQL prints them.
        let tiny = format!(r#"{{"a":[{}]}}"#, vec!["1e-300"; 20].join(","));
        assert_eq!(refused(&tiny), Refused::TooLong);
        assert_eq!(
            Refused::NotJson("expected value".into()).to_string(),
            "a progress line is one JSON object: expected value"
        );
    }

    #[test]
    fn the_printed_length_is_the_length_of_jsonb_text() {
        // As `SELECT octet_length('...'::jsonb::text)` answers.
        for (json, printed) in [
            (
                r#"{"a":1,"b":[1,2,"x"]}"#,
                r#"{"a": 1, "b": [1, 2, "x"]}"#.len(),
            ),
            (
                r#"{"q":"\"\\\n\u0001é"}"#,
                r#"{"q": "\"\\\n\u0001é"}"#.len(),
            ),
            (
                r#"{"t":true,"f":false,"n":null,"o":{}}"#,
                r#"{"f": false, "n": null, "o": {}, "t": true}"#.len(),
            ),
            // Numbers in positional notation, however they were written.
            (r#"{"a":1e-3}"#, r#"{"a": 0.001}"#.len()),
            (r#"{"a":-2.5e2}"#, r#"{"a": -250.0}"#.len()),
            (r#"{"a":1e-300}"#, 7 + 302),
            (r#"{"a":1e300}"#, 7 + 301),
            (r#"{"a":12.25}"#, r#"{"a": 12.25}"#.len()),
        ] {
            let value: Value = serde_json::from_str(json).unwrap();
            assert_eq!(printed_len(&value), printed, "{json}");
        }
    }

    #[test]
    fn a_header_gets_the_same_json_in_ascii() {
        let json = "{\"message\": \"naïve 日本 😀 \u{7f}\", \"tab\": \"a\\tb\"}";
        let ascii = ascii_json(json);
        assert!(
            ascii.bytes().all(|b| b == b' ' || b.is_ascii_graphic()),
            "{ascii}"
        );
        assert_eq!(
            serde_json::from_str::<Value>(&ascii).unwrap(),
            serde_json::from_str::<Value>(json).unwrap()
        );
        assert!(ascii.contains("\\ud83d\\ude00"), "{ascii}");
        assert!(ascii.contains("\\u007f"), "DEL escaped: {ascii}");
        assert_eq!(ascii_json(r#"{"percent": 5}"#), r#"{"percent": 5}"#);
    }
}
