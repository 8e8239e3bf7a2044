//! The answer of `GET /tasks/{id}` for a large payload or output: the JSON written as hyper
//! takes it, the payload and the output escaped a chunk at a time straight from the row the
//! database sent ([`StreamedTask`]), so that an answer holds the row and one chunk, not the
//! whole JSON besides (a 50 MB payload took the daemon from 11 to 148 MB of peak RSS when the JSON was
//! built whole).
//!
//! The escaping is serde_json's, chunk by chunk: each chunk ends on a character boundary and
//! is written as a JSON string with its quotes dropped, which is what the whole string's
//! contents would have been. Its length is counted first by the same escaping, so the answer
//! keeps its `content-length`.

use std::borrow::Cow;
use std::collections::VecDeque;
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

/// One piece of the answer: JSON written whole, or a text column of the row escaped a chunk
/// at a time from `at`.
enum Part {
    Fixed(Bytes),
    Text { column: usize, at: usize },
}

/// The answer of one task whose payload and output are escaped as hyper takes them: the JSON
/// around them, and their texts. Holds its [`Share`] of the read budget until the last byte
/// is taken.
pub(super) struct StreamedTask {
    parts: VecDeque<Part>,
    row: Row,
    left: u64,
    _share: Share,
}

impl StreamedTask {
    /// The answer for `row`, a row of `queue::task::get_row`. Escapes the payload and the
    /// output once to count their length: run it off the runtime's threads.
    pub(super) fn new(row: Row, share: Share) -> StreamedTask {
        // The fields with an empty payload and output, cut where their texts go: no string
        // field can hold `"payload":""` or `"output":""` unescaped.
        let mut task = Task::<&str>::from_row(&row);
        task.payload = "";
        let mut texts = vec![(b"\"payload\":\"\"".as_slice(), "payload")];
        if task.output.is_some() {
            task.output = Some(String::new());
            texts.push((b"\"output\":\"\"".as_slice(), "output"));
        }
        let json = Bytes::from(serde_json::to_vec(&task).expect("a task serializes"));
        let mut cuts: Vec<(usize, usize)> = texts
            .into_iter()
            .map(|(key, name)| {
                let at = json
                    .windows(key.len())
                    .position(|w| w == key)
                    .expect("a task's JSON has its payload and output");
                let column = row
                    .columns()
                    .iter()
                    .position(|c| c.name() == name)
                    .expect("the row has the column");
                // Between the empty string's quotes.
                (at + key.len() - 1, column)
            })
            .collect();
        cuts.sort_unstable();
        let mut parts = VecDeque::new();
        let mut length = 0u64;
        let mut from = 0;
        for (cut, column) in cuts {
            parts.push_back(Part::Fixed(json.slice(from..cut)));
            length += (cut - from) as u64;
            let text = row.get::<_, RawText<'_>>(column).0;
            let mut at = 0;
            while at < text.len() {
                let (chunk, next) = escaped_chunk(text, at);
                length += chunk.len() as u64;
                at = next;
            }
            parts.push_back(Part::Text { column, at: 0 });
            from = cut;
        }
        parts.push_back(Part::Fixed(json.slice(from..)));
        length += (json.len() - from) as u64;
        StreamedTask {
            parts,
            row,
            left: length,
            _share: share,
        }
    }

    fn next(&mut self) -> Option<Bytes> {
        loop {
            match self.parts.pop_front()? {
                Part::Fixed(bytes) if bytes.is_empty() => {}
                Part::Fixed(bytes) => return Some(bytes),
                Part::Text { column, at } => {
                    let text = self.row.get::<_, RawText<'_>>(column).0;
                    if at < text.len() {
                        let (chunk, next) = escaped_chunk(text, at);
                        self.parts.push_front(Part::Text { column, at: next });
                        return Some(chunk);
                    }
                }
            }
        }
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
