//! Enqueueing a file's contents without holding them: the file is streamed with a binary
//! `COPY` into a temporary table of the enqueueing transaction, and the task is inserted (or,
//! for an idempotency key already taken, found) from there by the same statement as
//! [`super::enqueue()`]. The client holds one chunk of the file at a time, where a parameter
//! would hold the whole text three times (the string, the protocol message, the connection's
//! write buffer). The text is checked as it streams: UTF-8, and no NUL.
//!
//! Needs the `TEMPORARY` right on the database (every role has it unless it was revoked from
//! `PUBLIC`).

use futures_util::SinkExt;
use tokio::io::AsyncReadExt;
use tokio_postgres::Client;

use super::enqueue::{enqueue_with, BadInput, Enqueued, NewTask, ENQUEUE};
use crate::db::DbError;

/// How much of the file is read and sent at a time.
const CHUNK: usize = 1 << 20;

/// Why a file could not be enqueued.
#[derive(Debug, thiserror::Error)]
pub enum FileEnqueueError {
    #[error(transparent)]
    Db(#[from] DbError),
    #[error(transparent)]
    Input(#[from] BadInput),
    #[error("the payload is not UTF-8 text (invalid bytes at offset {0})")]
    NotUtf8(u64),
    #[error("cannot read the file: {0}")]
    Io(#[from] std::io::Error),
    #[error("the file changed while it was read ({expected} bytes expected, {read} read)")]
    Changed { expected: u64, read: u64 },
}

impl From<tokio_postgres::Error> for FileEnqueueError {
    fn from(err: tokio_postgres::Error) -> Self {
        FileEnqueueError::Db(err.into())
    }
}

/// Insert `task` (its `payload` is ignored) with the `len` bytes of `file` as its payload,
/// in one transaction on `client`.
///
/// # Errors
///
/// Database failures (nothing was inserted), a payload that is not UTF-8 or holds a NUL, a
/// file that cannot be read or changed its length meanwhile.
pub async fn enqueue_file(
    client: &mut Client,
    task: &NewTask,
    mut file: tokio::fs::File,
    len: u64,
) -> Result<Enqueued, FileEnqueueError> {
    let field_len = i32::try_from(len).map_err(|_| FileEnqueueError::Changed {
        expected: len,
        read: 0,
    })?;
    let tx = client.transaction().await?;
    tx.batch_execute(
        "CREATE TEMPORARY TABLE pgtaskd_staged_payload (payload text NOT NULL) ON COMMIT DROP",
    )
    .await?;
    let sink = tx
        .copy_in("COPY pg_temp.pgtaskd_staged_payload (payload) FROM STDIN (FORMAT binary)")
        .await?;
    futures_util::pin_mut!(sink);
    // The binary format's header, then one row of one field of `len` bytes.
    let mut head = Vec::with_capacity(25);
    head.extend_from_slice(b"PGCOPY\n\xff\r\n\0");
    head.extend_from_slice(&0i32.to_be_bytes());
    head.extend_from_slice(&0i32.to_be_bytes());
    head.extend_from_slice(&1i16.to_be_bytes());
    head.extend_from_slice(&field_len.to_be_bytes());
    sink.send(std::io::Cursor::new(head)).await?;
    let mut checker = Utf8Check::default();
    let mut read: u64 = 0;
    loop {
        let mut chunk = vec![0; CHUNK];
        let n = file.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        chunk.truncate(n);
        checker.feed(&chunk, read)?;
        read += n as u64;
        if read > len {
            return Err(FileEnqueueError::Changed {
                expected: len,
                read,
            });
        }
        sink.send(std::io::Cursor::new(chunk)).await?;
    }
    checker.finish(read)?;
    if read != len {
        return Err(FileEnqueueError::Changed {
            expected: len,
            read,
        });
    }
    sink.send(std::io::Cursor::new((-1i16).to_be_bytes().to_vec()))
        .await?;
    sink.as_mut().finish().await?;
    let sql = ENQUEUE.replace(
        "$2",
        "(SELECT s.payload FROM pg_temp.pgtaskd_staged_payload AS s)",
    );
    let enqueued = enqueue_with(&tx, &sql, task).await?;
    tx.commit().await?;
    Ok(enqueued)
}

/// UTF-8 and no NUL, checked chunk by chunk: a character cut by a chunk's end is carried over.
#[derive(Default)]
struct Utf8Check {
    carry: Vec<u8>,
}

impl Utf8Check {
    /// Check `chunk`, which starts at byte `offset` of the text.
    fn feed(&mut self, chunk: &[u8], offset: u64) -> Result<(), FileEnqueueError> {
        if chunk.contains(&0) {
            return Err(BadInput::PayloadNul.into());
        }
        let start = offset - self.carry.len() as u64;
        let mut bytes = std::mem::take(&mut self.carry);
        bytes.extend_from_slice(chunk);
        match std::str::from_utf8(&bytes) {
            Ok(_) => Ok(()),
            // Cut at the end: the rest comes with the next chunk.
            Err(err) if err.error_len().is_none() => {
                self.carry = bytes[err.valid_up_to()..].to_vec();
                Ok(())
            }
            Err(err) => Err(FileEnqueueError::NotUtf8(start + err.valid_up_to() as u64)),
        }
    }

    /// The text ended at `len`: nothing may be left over.
    fn finish(&self, len: u64) -> Result<(), FileEnqueueError> {
        if self.carry.is_empty() {
            Ok(())
        } else {
            Err(FileEnqueueError::NotUtf8(len - self.carry.len() as u64))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(chunks: &[&[u8]]) -> Result<(), FileEnqueueError> {
        let mut checker = Utf8Check::default();
        let mut offset = 0;
        for chunk in chunks {
            checker.feed(chunk, offset)?;
            offset += chunk.len() as u64;
        }
        checker.finish(offset)
    }

    #[test]
    fn text_is_checked_across_chunk_ends() {
        let text = "naïve 日本語".as_bytes();
        for cut in 0..=text.len() {
            assert!(check(&[&text[..cut], &text[cut..]]).is_ok(), "cut at {cut}");
        }
        assert!(matches!(
            check(&[b"ab", b"\xff"]),
            Err(FileEnqueueError::NotUtf8(2))
        ));
        assert!(matches!(
            check(&[b"ab\xe6\x97"]),
            Err(FileEnqueueError::NotUtf8(2))
        ));
        assert!(matches!(
            check(&[b"a", b"\0b"]),
            Err(FileEnqueueError::Input(BadInput::PayloadNul))
        ));
    }
}
