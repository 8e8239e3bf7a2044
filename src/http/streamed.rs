//! The answer of `GET /tasks/{id}` for a large payload: the JSON written as hyper takes it,
//! the payload escaped a chunk at a time straight from the row the database sent
//! ([`StreamedTask`]), so that an answer holds the row and one chunk, not the whole JSON
//! besides (a 50 MB payload took the daemon from 11 to 148 MB of peak RSS when the JSON was
//! built whole).
//!
//! The escaping is serde_json's, chunk by chunk: each chunk ends on a character boundary and
//! is written as a JSON string with its quotes dropped, which is what the whole string's
//! contents would have been. Its length is counted first by the same escaping, so the answer
//! keeps its `content-length`.

use std::borrow::Cow;
use std::error::Error;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use tokio_postgres::types::{FromSql, Type};
use tokio_postgres::Row;

use super::budget::Share;
use crate::queue::Task;

/// How much of the payload is escaped at a time: at most six times this is held for it (a
/// control character becomes `\u00XX`).
const CHUNK: usize = 256 << 10;

/// The payload column's bytes as the row holds them (the database checked them as UTF-8).
struct RawText<'a>(&'a [u8]);

impl<'a> FromSql<'a> for RawText<'a> {
    fn from_sql(_: &Type, raw: &'a [u8]) -> Result<Self, Box<dyn Error + Sync + Send>> {
        Ok(RawText(raw))
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::TEXT
    }
}

/// The contents of the JSON string of `text[from..]`'s next chunk, and where the one after it
/// starts.
fn escaped_chunk(text: &[u8], from: usize) -> (Bytes, usize) {
    let mut end = (from + CHUNK).min(text.len());
    // Back to the start of a character: a UTF-8 continuation byte is 0b10xxxxxx.
    while end > from && end < text.len() && text[end] & 0xC0 == 0x80 {
        end -= 1;
    }
    let chunk: Cow<'_, str> = String::from_utf8_lossy(&text[from..end]);
    let mut json = Vec::with_capacity(chunk.len() + 2);
    serde_json::to_writer(&mut json, chunk.as_ref()).expect("a string serializes");
    let json = Bytes::from(json);
    (json.slice(1..json.len() - 1), end)
}

/// The answer of one task whose payload is escaped as hyper takes it: the JSON before the
/// payload's text, the text, the JSON after it. Holds its [`Share`] of the read budget until
/// the last byte is taken.
pub(super) struct StreamedTask {
    before: Option<Bytes>,
    row: Row,
    payload: usize,
    at: usize,
    after: Option<Bytes>,
    left: u64,
    _share: Share,
}

impl StreamedTask {
    /// The answer for `row`, a row of `queue::task::get_row`. Escapes the payload once to
    /// count its length: run it off the runtime's threads.
    pub(super) fn new(row: Row, share: Share) -> StreamedTask {
        // The fields with an empty payload, cut where the payload's text goes: no string
        // field before it can hold `"payload":""` unescaped.
        let mut task = Task::<&str>::from_row(&row);
        task.payload = "";
        let json = serde_json::to_vec(&task).expect("a task serializes");
        let key = b"\"payload\":\"\"";
        let at = json
            .windows(key.len())
            .position(|w| w == key)
            .expect("a task's JSON has its payload");
        let json = Bytes::from(json);
        let before = json.slice(..at + key.len() - 1);
        let after = json.slice(at + key.len() - 1..);
        let payload = row
            .columns()
            .iter()
            .position(|c| c.name() == "payload")
            .expect("the row has a payload");
        let text = row.get::<_, RawText<'_>>(payload).0;
        let mut length = (before.len() + after.len()) as u64;
        let mut from = 0;
        while from < text.len() {
            let (chunk, next) = escaped_chunk(text, from);
            length += chunk.len() as u64;
            from = next;
        }
        StreamedTask {
            before: Some(before),
            row,
            payload,
            at: 0,
            after: Some(after),
            left: length,
            _share: share,
        }
    }

    fn next(&mut self) -> Option<Bytes> {
        if let Some(before) = self.before.take() {
            return Some(before);
        }
        let text = self.row.get::<_, RawText<'_>>(self.payload).0;
        if self.at < text.len() {
            let (chunk, next) = escaped_chunk(text, self.at);
            self.at = next;
            return Some(chunk);
        }
        self.after.take()
    }
}

impl Body for StreamedTask {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Poll::Ready(self.next().map(|bytes| {
            self.left = self.left.saturating_sub(bytes.len() as u64);
            Ok(Frame::data(bytes))
        }))
    }

    fn is_end_stream(&self) -> bool {
        self.left == 0
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.left)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Chunks escaped one by one join into what serde_json makes of the whole string, for
    /// texts that cut characters of every width, quotes, backslashes and control characters
    /// at the chunk boundaries.
    #[test]
    fn chunks_join_into_the_whole_strings_json() {
        for unit in [
            "a",
            "é",
            "日",
            "🦀",
            "\"",
            "\\",
            "\n",
            "\u{1}",
            "a\u{7f}é\"🦀\\\t",
        ] {
            for extra in [0, 1, 2, 3] {
                let text = format!(
                    "{}{}",
                    "x".repeat(extra),
                    unit.repeat(CHUNK / unit.len() + 7)
                );
                let mut joined = Vec::new();
                let mut from = 0;
                while from < text.len() {
                    let (chunk, next) = escaped_chunk(text.as_bytes(), from);
                    assert!(next > from, "no progress at {from}");
                    joined.extend_from_slice(&chunk);
                    from = next;
                }
                let whole = serde_json::to_vec(&text).unwrap();
                assert_eq!(joined, whole[1..whole.len() - 1], "{unit:?} after {extra}");
            }
        }
    }
}
