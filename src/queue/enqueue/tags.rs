//! A task's tags and metadata (schema 38): labels and a JSON object a producer sets to find
//! the task by (`pgtaskd list --tag T --meta KEY=VALUE`, `GET /tasks?tag=T&meta=KEY:VALUE`).
//! What the CLI's `--tag` and `--meta` and the HTTP API's `tags` and `metadata` may hold is
//! checked here by the rules of the table's `tasks_tags_check` and `tasks_metadata_check`,
//! before any statement, so that the database's checks are a backstop: at most
//! [`MAX_TAGS`] tags, each a letter or digit then up to 62 of letters, digits and `_.:-`;
//! metadata a JSON object of at most [`MAX_METADATA_BYTES`] as the database prints it
//! (`metadata::text`, which [`jsonb_text`] reproduces: keys sorted and once, `": "` and
//! `", "` between tokens, numbers as `numeric` prints them).

use serde_json::value::RawValue;
use tokio_postgres::error::SqlState;

use super::BadInput;
use crate::db::DbError;

/// The most tags a task may have (`tasks_tags_check`; duplicates counted).
pub const MAX_TAGS: usize = 16;

/// The longest tag, in bytes (ASCII only).
pub const MAX_TAG_LEN: usize = 63;

/// The largest metadata, in bytes of its text as the database prints it.
pub const MAX_METADATA_BYTES: usize = 8192;

/// The deepest nesting of metadata's objects and arrays taken (serde_json's own limit).
const MAX_DEPTH: usize = 128;

/// The checks of the table whose violation [`tags_refusal`] sorts.
const CHECKS: [&str; 2] = ["tasks_tags_check", "tasks_metadata_check"];

/// A tag: a letter or digit, then up to 62 of letters, digits and `_ . : -`.
///
/// # Errors
///
/// [`BadInput::Tag`], naming it.
pub fn check_tag(tag: &str) -> Result<(), BadInput> {
    let bytes = tag.as_bytes();
    let good = !bytes.is_empty()
        && bytes.len() <= MAX_TAG_LEN
        && bytes[0].is_ascii_alphanumeric()
        && bytes[1..]
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'-'));
    if good {
        Ok(())
    } else {
        Err(BadInput::Tag(tag.to_string()))
    }
}

/// A task's tags: at most [`MAX_TAGS`], each by [`check_tag`].
///
/// # Errors
///
/// [`BadInput::TooManyTags`]; the first bad tag.
pub fn check_tags(tags: &[String]) -> Result<(), BadInput> {
    if tags.len() > MAX_TAGS {
        return Err(BadInput::TooManyTags(tags.len()));
    }
    tags.iter().try_for_each(|tag| check_tag(tag))
}

/// Tags as the HTTP API's JSON gives them: a list of strings, or `null` for none.
///
/// # Errors
///
/// [`BadInput::TagsType`] for anything else; the rules of [`check_tags`].
pub fn tags_from_json(value: &serde_json::Value) -> Result<Vec<String>, BadInput> {
    let tags = match value {
        serde_json::Value::Null => Vec::new(),
        serde_json::Value::Array(items) => items
            .iter()
            .map(|item| item.as_str().map(str::to_string).ok_or(BadInput::TagsType))
            .collect::<Result<Vec<String>, BadInput>>()?,
        _ => return Err(BadInput::TagsType),
    };
    check_tags(&tags)?;
    Ok(tags)
}

/// Tags as a query gives them (`POST /tasks?tags=a,b`): separated by commas, which no tag
/// holds.
///
/// # Errors
///
/// The rules of [`check_tags`].
pub fn parse_tags(text: &str) -> Result<Vec<String>, BadInput> {
    let tags: Vec<String> = text.split(',').map(str::to_string).collect();
    check_tags(&tags)?;
    Ok(tags)
}

/// A task's metadata, checked: a JSON object whose text, as the database prints it, is at
/// most [`MAX_METADATA_BYTES`]. Kept as the JSON text it came as (numbers as written), which
/// the database reads as `jsonb`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Metadata(String);

impl Metadata {
    /// Metadata from JSON text.
    ///
    /// # Errors
    ///
    /// [`BadInput::MetadataType`] for JSON that is not an object; what [`jsonb_text`]
    /// refuses; [`BadInput::MetadataTooLarge`].
    pub fn parse(json: &str) -> Result<Metadata, BadInput> {
        let stored = jsonb_text(json)?;
        if !stored.starts_with('{') {
            return Err(BadInput::MetadataType);
        }
        if stored.len() > MAX_METADATA_BYTES {
            return Err(BadInput::MetadataTooLarge(stored.len()));
        }
        Ok(Metadata(json.trim().to_string()))
    }

    /// Metadata from the HTTP API's JSON: an object, or `null` for none.
    ///
    /// # Errors
    ///
    /// What [`Metadata::parse`] refuses.
    pub fn from_json(value: &RawValue) -> Result<Option<Metadata>, BadInput> {
        match value.get() {
            "null" => Ok(None),
            text => Metadata::parse(text).map(Some),
        }
    }

    /// An object of string values, one for each `(key, value)`: what the CLI's `--meta
    /// KEY=VALUE` and the filters' terms make. `None` for no pair.
    ///
    /// # Errors
    ///
    /// [`BadInput::MetaKeyTwice`] for a key given twice; what [`Metadata::parse`] refuses.
    pub fn from_pairs(pairs: &[(String, String)]) -> Result<Option<Metadata>, BadInput> {
        if pairs.is_empty() {
            return Ok(None);
        }
        let mut object = serde_json::Map::new();
        for (key, value) in pairs {
            if object
                .insert(key.clone(), serde_json::Value::String(value.clone()))
                .is_some()
            {
                return Err(BadInput::MetaKeyTwice(key.clone()));
            }
        }
        let text = serde_json::Value::Object(object).to_string();
        Metadata::parse(&text).map(Some)
    }

    /// The JSON text, as sent to the database.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A `KEY<separator>VALUE` term (`--meta owner=ann`, `meta=owner:ann`): split at the first
/// separator; the key may not be empty, the value may.
///
/// # Errors
///
/// [`BadInput::MetaTerm`] without the separator or with an empty key.
pub fn parse_meta_term(text: &str, separator: char) -> Result<(String, String), BadInput> {
    match text.split_once(separator) {
        Some((key, value)) if !key.is_empty() => Ok((key.to_string(), value.to_string())),
        _ => Err(BadInput::MetaTerm {
            term: text.to_string(),
            separator,
        }),
    }
}

/// What an enqueue's failure `err` says of the task's tags or metadata, in words for the
/// producer, if it is about them: the database's checks (`tasks_tags_check`,
/// `tasks_metadata_check`), or JSON text it cannot read as `jsonb` (a `\u0000`). The checks
/// of [`check_tags`] and [`Metadata::parse`] come first, so this is the backstop.
pub fn tags_refusal(err: &DbError) -> Option<String> {
    let code = err.code()?;
    let message = err.message();
    if *code == SqlState::CHECK_VIOLATION {
        let check = CHECKS.iter().find(|check| message.contains(*check))?;
        Some(format!(
            "the database refused the task's {} ({check}): {}",
            if *check == CHECKS[0] {
                "tags"
            } else {
                "metadata"
            },
            if *check == CHECKS[0] {
                "at most 16, each a letter or digit then up to 62 of letters, digits and _ . : -"
            } else {
                "a JSON object of at most 8192 bytes as the database prints it"
            }
        ))
    } else if *code == SqlState::UNTRANSLATABLE_CHARACTER
        || *code == SqlState::INVALID_TEXT_REPRESENTATION
        || *code == SqlState::NUMERIC_VALUE_OUT_OF_RANGE
    {
        Some(format!(
            "the database refused the task's metadata: {message}"
        ))
    } else {
        None
    }
}

/// The text PostgreSQL prints for `json` read as `jsonb` (`'...'::jsonb::text`): objects
/// with their keys once (the last of a key given twice wins), shortest first then by bytes,
/// `": "` after a key and `", "` between items, strings with only `"`, `\`, and control
/// characters escaped, numbers as `numeric` prints them (`1e3` is `1000`, `-0.0` is `0.0`).
///
/// # Errors
///
/// [`BadInput::MetadataType`] for text that is not JSON; [`BadInput::MetadataNul`] for a
/// string with `\u0000`, which `jsonb` cannot hold; [`BadInput::MetadataTooLarge`] for a
/// number printed longer than [`MAX_METADATA_BYTES`], or a text far past it;
/// [`BadInput::MetadataDepth`] past 128 levels.
pub fn jsonb_text(json: &str) -> Result<String, BadInput> {
    let mut reader = Reader {
        text: json.as_bytes(),
        at: 0,
        budget: MAX_METADATA_BYTES * 128,
    };
    reader.space();
    let out = reader.value(0)?;
    reader.space();
    if reader.at != reader.text.len() {
        return Err(BadInput::MetadataType);
    }
    Ok(out)
}

/// A reader of JSON text that prints it as `jsonb` does ([`jsonb_text`]).
struct Reader<'a> {
    text: &'a [u8],
    at: usize,
    /// The bytes the reader may still print before it gives up (the text is refused long
    /// before a duplicate key could bring it back under the limit).
    budget: usize,
}

impl Reader<'_> {
    fn space(&mut self) {
        while matches!(self.text.get(self.at), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    fn eat(&mut self, byte: u8) -> bool {
        if self.text.get(self.at) == Some(&byte) {
            self.at += 1;
            true
        } else {
            false
        }
    }

    fn spend(&mut self, printed: usize) -> Result<(), BadInput> {
        self.budget = self
            .budget
            .checked_sub(printed)
            .ok_or(BadInput::MetadataTooLarge(MAX_METADATA_BYTES * 128))?;
        Ok(())
    }

    fn value(&mut self, depth: usize) -> Result<String, BadInput> {
        if depth > MAX_DEPTH {
            return Err(BadInput::MetadataDepth);
        }
        let leaf = match self.text.get(self.at) {
            Some(b'{') => return self.object(depth),
            Some(b'[') => return self.array(depth),
            Some(b'"') => escaped(&self.string()?),
            Some(b'-' | b'0'..=b'9') => self.number()?,
            _ => {
                let text = self.text;
                let word = ["true", "false", "null"]
                    .into_iter()
                    .find(|word| text[self.at..].starts_with(word.as_bytes()))
                    .ok_or(BadInput::MetadataType)?;
                self.at += word.len();
                word.to_string()
            }
        };
        self.spend(leaf.len())?;
        Ok(leaf)
    }

    fn object(&mut self, depth: usize) -> Result<String, BadInput> {
        self.at += 1;
        let mut pairs: Vec<(String, String)> = Vec::new();
        self.space();
        if !self.eat(b'}') {
            loop {
                self.space();
                if self.text.get(self.at) != Some(&b'"') {
                    return Err(BadInput::MetadataType);
                }
                let key = self.string()?;
                self.spend(key.len())?;
                self.space();
                if !self.eat(b':') {
                    return Err(BadInput::MetadataType);
                }
                self.space();
                let value = self.value(depth + 1)?;
                // The last of a key given twice wins.
                pairs.retain(|(k, _)| *k != key);
                pairs.push((key, value));
                self.space();
                if self.eat(b'}') {
                    break;
                }
                if !self.eat(b',') {
                    return Err(BadInput::MetadataType);
                }
            }
        }
        // jsonb's order: shorter keys first, then by their bytes.
        pairs.sort_by(|(a, _), (b, _)| a.len().cmp(&b.len()).then_with(|| a.cmp(b)));
        let items: Vec<String> = pairs
            .iter()
            .map(|(key, value)| format!("{}: {value}", escaped(key)))
            .collect();
        Ok(format!("{{{}}}", items.join(", ")))
    }

    fn array(&mut self, depth: usize) -> Result<String, BadInput> {
        self.at += 1;
        let mut items = Vec::new();
        self.space();
        if !self.eat(b']') {
            loop {
                self.space();
                items.push(self.value(depth + 1)?);
                self.space();
                if self.eat(b']') {
                    break;
                }
                if !self.eat(b',') {
                    return Err(BadInput::MetadataType);
                }
            }
        }
        Ok(format!("[{}]", items.join(", ")))
    }

    /// A string token, decoded (serde_json checks its escapes, surrogate pairs included).
    fn string(&mut self) -> Result<String, BadInput> {
        let start = self.at;
        self.at += 1;
        loop {
            match self.text.get(self.at) {
                None => return Err(BadInput::MetadataType),
                Some(b'\\') => self.at += 2,
                Some(b'"') => {
                    self.at += 1;
                    break;
                }
                Some(_) => self.at += 1,
            }
        }
        let token = self
            .text
            .get(start..self.at)
            .ok_or(BadInput::MetadataType)?;
        let token = std::str::from_utf8(token).map_err(|_| BadInput::MetadataType)?;
        let text: String = serde_json::from_str(token).map_err(|_| BadInput::MetadataType)?;
        if text.contains('\0') {
            return Err(BadInput::MetadataNul);
        }
        Ok(text)
    }

    /// A number token, as `numeric` prints it: the digits shifted by the exponent, the
    /// integer part without leading zeros ("0" when none), as many decimals as were written
    /// less the exponent (none when that is below zero), and a minus only when it is not 0.
    fn number(&mut self) -> Result<String, BadInput> {
        let text = self.text;
        let negative = self.eat(b'-');
        let digits_from = self.at;
        let run = |reader: &mut Self| {
            let from = reader.at;
            while reader.text.get(reader.at).is_some_and(u8::is_ascii_digit) {
                reader.at += 1;
            }
            reader.at - from
        };
        let int_len = run(self);
        let int_digits = &text[digits_from..digits_from + int_len];
        if int_len == 0 || (int_len > 1 && int_digits[0] == b'0') {
            return Err(BadInput::MetadataType);
        }
        let mut digits = int_digits.to_vec();
        let mut frac_len = 0;
        if self.eat(b'.') {
            let from = self.at;
            frac_len = run(self);
            if frac_len == 0 {
                return Err(BadInput::MetadataType);
            }
            digits.extend_from_slice(&text[from..self.at]);
        }
        let mut exponent: i64 = 0;
        if self.eat(b'e') || self.eat(b'E') {
            let minus = self.eat(b'-');
            if !minus {
                self.eat(b'+');
            }
            let from = self.at;
            if run(self) == 0 {
                return Err(BadInput::MetadataType);
            }
            // Past a billion, the number is refused as too large whatever it is.
            let written = std::str::from_utf8(&text[from..self.at]).unwrap_or("0");
            exponent = written.parse::<i64>().unwrap_or(i64::MAX).min(1 << 40);
            if minus {
                exponent = -exponent;
            }
        }
        let len = digits.len() as i64;
        // Where the decimal point falls in `digits`, and the decimals printed.
        let point = int_len as i64 + exponent;
        let scale = (frac_len as i64 - exponent).max(0);
        let first_nonzero = digits[..point.clamp(0, len) as usize]
            .iter()
            .position(|d| *d != b'0');
        let int_printed = match first_nonzero {
            Some(at) => point - at as i64,
            None => 1,
        };
        let zero = digits.iter().all(|d| *d == b'0');
        let printed = i64::from(negative && !zero) + int_printed + scale + i64::from(scale > 0);
        if printed > MAX_METADATA_BYTES as i64 {
            return Err(BadInput::MetadataTooLarge(
                usize::try_from(printed).unwrap_or(usize::MAX),
            ));
        }
        let mut out = String::with_capacity(printed as usize);
        if negative && !zero {
            out.push('-');
        }
        match first_nonzero {
            Some(at) => {
                for i in at as i64..point {
                    out.push(if i < len {
                        digits[i as usize] as char
                    } else {
                        '0'
                    });
                }
            }
            None => out.push('0'),
        }
        if scale > 0 {
            out.push('.');
            for i in point..point + scale {
                out.push(if i < 0 {
                    '0'
                } else {
                    digits[i as usize] as char
                });
            }
        }
        Ok(out)
    }
}

/// A string as `jsonb` prints it: `"` and `\` escaped, `\b \f \n \r \t`, every other
/// control character as `\u00XX`, the rest as it is.
fn escaped(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests;
