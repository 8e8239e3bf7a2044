//! The socket under each HTTP connection ([`Socket`]), made by [`super::server`]'s accept loop.
//!
//! hyper answers a request head it cannot parse (a garbage request line, a bad header line, a
//! head larger than its buffer, a URI too long) by itself, before any service runs: 400, 414 or
//! 431 with an empty body, then it closes the connection; it has no option to change or
//! suppress that answer. So the socket holds back the last bytes hyper writes when they are
//! exactly such an answer, and tells hyper they were written; when the connection then ends
//! with hyper's parse error, [`Leftover::finish`] writes the same status with the JSON error
//! body of every other error of the API instead. Any other ending sends the held bytes as they
//! were, and any later read or write sends them first: nothing hyper writes is lost or
//! reordered, and a held answer hyper did not make (a body that happens to end with the same
//! bytes) is only delayed until hyper's next step.
//!
//! The socket also bounds how long one write may wait for the client to read
//! (`http.header_timeout`, as nginx's `send_timeout`): a client that stops reading an answer,
//! such as a large payload, loses its connection instead of holding the answer, and its share
//! of `http.max_inflight_bytes`, for ever.

use std::future::Future;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::time::Sleep;

/// The status lines of hyper's automatic answers to a request head it cannot parse
/// (`hyper::proto::h1::role::Server::on_error`).
const AUTOMATIC_STATUS: [&[u8]; 3] = [
    b"HTTP/1.1 400 Bad Request\r\n",
    b"HTTP/1.1 414 URI Too Long\r\n",
    b"HTTP/1.1 431 Request Header Fields Too Large\r\n",
];
/// The headers of those answers, up to the date's value.
const AUTOMATIC_HEADERS: &[u8] = b"connection: close\r\ncontent-length: 0\r\ndate: ";
/// An HTTP date: `Thu, 03 Dec 2026 12:44:26 GMT`.
const DATE_LEN: usize = 29;
/// The longest automatic answer.
const MAX_AUTOMATIC: usize = 47 + AUTOMATIC_HEADERS.len() + DATE_LEN + 4;

/// A connection's socket as hyper sees it; see the module's documentation.
pub(super) struct Socket {
    /// Taken only by `drop`, which hands it back through `handback`.
    io: Option<TokioIo<TcpStream>>,
    /// An automatic answer of hyper's, held back; empty when none.
    held: Vec<u8>,
    stall_timeout: Duration,
    /// When the write waiting for the client gives up.
    stalled: Option<Pin<Box<Sleep>>>,
    handback: Arc<Mutex<Option<Leftover>>>,
}

/// Where a [`Socket`] leaves its stream when hyper drops it.
pub(super) struct Handback(Arc<Mutex<Option<Leftover>>>);

impl Handback {
    /// The stream and what it held back, once hyper dropped the socket.
    pub(super) fn take(&self) -> Option<Leftover> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
    }
}

/// A socket's stream after hyper is done with it, with the answer it held back.
pub(super) struct Leftover {
    stream: TcpStream,
    held: Vec<u8>,
}

impl Leftover {
    /// End the connection after hyper ended with `error` (`None`: without one): replace a
    /// held automatic answer to a parse error with the JSON one, or send what was held as it
    /// was, within `timeout`.
    pub(super) async fn finish(self, error: Option<&hyper::Error>, timeout: Duration) {
        let Leftover { mut stream, held } = self;
        if held.is_empty() {
            return;
        }
        let answer = match error {
            Some(err) if err.is_parse() => json_answer(&held, err),
            _ => held,
        };
        let sent = tokio::time::timeout(timeout, async {
            stream.write_all(&answer).await?;
            stream.shutdown().await
        })
        .await;
        if let Ok(Err(err)) = sent {
            tracing::debug!(error = %err, "HTTP answer to a malformed request not sent");
        }
    }
}

/// hyper's automatic `answer` (its status and date kept) with the API's JSON error body,
/// `{"error": "bad HTTP request: ..."}` in hyper's words.
fn json_answer(answer: &[u8], err: &hyper::Error) -> Vec<u8> {
    let status_line = AUTOMATIC_STATUS
        .iter()
        .find(|status| answer.starts_with(status))
        .copied()
        .unwrap_or(AUTOMATIC_STATUS[0]);
    let date_at = answer.len() - DATE_LEN - 4;
    let date = &answer[date_at..date_at + DATE_LEN];
    let body = serde_json::json!({ "error": format!("bad HTTP request: {err}") }).to_string();
    let mut out = Vec::with_capacity(status_line.len() + 160 + body.len());
    out.extend_from_slice(status_line);
    out.extend_from_slice(
        b"content-type: application/json\r\nconnection: close\r\ncontent-length: ",
    );
    out.extend_from_slice(body.len().to_string().as_bytes());
    out.extend_from_slice(b"\r\ndate: ");
    out.extend_from_slice(date);
    out.extend_from_slice(b"\r\n\r\n");
    out.extend_from_slice(body.as_bytes());
    out
}

/// Where the automatic answer `bytes` end with starts, if they end with one.
fn automatic_answer_start(bytes: &[u8]) -> Option<usize> {
    AUTOMATIC_STATUS.iter().find_map(|status| {
        let len = status.len() + AUTOMATIC_HEADERS.len() + DATE_LEN + 4;
        let start = bytes.len().checked_sub(len)?;
        let answer = &bytes[start..];
        let date = &answer[len - DATE_LEN - 4..len - 4];
        (answer.starts_with(status)
            && answer[status.len()..].starts_with(AUTOMATIC_HEADERS)
            && date.ends_with(b" GMT")
            && date.iter().all(|b| b.is_ascii_graphic() || *b == b' ')
            && answer.ends_with(b"\r\n\r\n"))
        .then_some(start)
    })
}

impl Socket {
    /// `stream` for hyper, with writes that wait for the client longer than `stall_timeout`
    /// failing; the stream comes back through the [`Handback`] when hyper drops the socket.
    pub(super) fn new(stream: TcpStream, stall_timeout: Duration) -> (Socket, Handback) {
        let handback = Arc::new(Mutex::new(None));
        let socket = Socket {
            io: Some(TokioIo::new(stream)),
            held: Vec::new(),
            stall_timeout,
            stalled: None,
            handback: Arc::clone(&handback),
        };
        (socket, Handback(handback))
    }

    fn io(&mut self) -> Pin<&mut TokioIo<TcpStream>> {
        Pin::new(self.io.as_mut().expect("the stream is taken only on drop"))
    }

    /// A write's outcome, failing once the client has not taken a byte for `stall_timeout`.
    fn bounded(
        &mut self,
        cx: &mut Context<'_>,
        result: Poll<io::Result<usize>>,
    ) -> Poll<io::Result<usize>> {
        if result.is_ready() {
            self.stalled = None;
            return result;
        }
        let timeout = self.stall_timeout;
        let stalled = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        if stalled.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client stopped reading the answer",
            )));
        }
        Poll::Pending
    }

    fn poll_inner_write(&mut self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let result = hyper::rt::Write::poll_write(self.io(), cx, buf);
        self.bounded(cx, result)
    }

    fn poll_inner_write_vectored(
        &mut self,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let result = hyper::rt::Write::poll_write_vectored(self.io(), cx, bufs);
        self.bounded(cx, result)
    }

    /// Send what was held back: hyper went on, so it was not an answer to a parse error.
    fn poll_release(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !self.held.is_empty() {
            let held = std::mem::take(&mut self.held);
            let written = self.poll_inner_write(cx, &held);
            self.held = held;
            match ready!(written)? {
                0 => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                n => {
                    self.held.drain(..n);
                }
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl Drop for Socket {
    fn drop(&mut self) {
        if let Some(io) = self.io.take() {
            let leftover = Leftover {
                stream: io.into_inner(),
                held: std::mem::take(&mut self.held),
            };
            *self
                .handback
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(leftover);
        }
    }
}

impl hyper::rt::Read for Socket {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_release(cx))?;
        this.io().poll_read(cx, buf)
    }
}

impl hyper::rt::Write for Socket {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_release(cx))?;
        let Some(start) = automatic_answer_start(buf) else {
            return this.poll_inner_write(cx, buf);
        };
        if start > 0 {
            let n = ready!(this.poll_inner_write(cx, &buf[..start]))?;
            if n < start {
                return Poll::Ready(Ok(n));
            }
        }
        this.held = buf[start..].to_vec();
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_release(cx))?;
        let total: usize = bufs.iter().map(|buf| buf.len()).sum();
        let tail = last_bytes(bufs, MAX_AUTOMATIC.min(total));
        let Some(start_in_tail) = automatic_answer_start(&tail) else {
            return this.poll_inner_write_vectored(cx, bufs);
        };
        let start = total - tail.len() + start_in_tail;
        if start > 0 {
            let prefix = first_bytes(bufs, start);
            let n = ready!(this.poll_inner_write_vectored(cx, &prefix))?;
            if n < start {
                return Poll::Ready(Ok(n));
            }
        }
        this.held = tail[start_in_tail..].to_vec();
        Poll::Ready(Ok(total))
    }

    fn is_write_vectored(&self) -> bool {
        self.io.as_ref().is_some_and(|io| io.is_write_vectored())
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().io().poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.held.is_empty() {
            // Left to `Leftover::finish`, which knows how the connection ended.
            return Poll::Ready(Ok(()));
        }
        this.io().poll_shutdown(cx)
    }
}

/// The last `n` bytes of `bufs`.
fn last_bytes(bufs: &[IoSlice<'_>], n: usize) -> Vec<u8> {
    let mut tail = Vec::with_capacity(n);
    let mut left = n;
    for buf in bufs.iter().rev() {
        if left == 0 {
            break;
        }
        let take = left.min(buf.len());
        tail.splice(0..0, buf[buf.len() - take..].iter().copied());
        left -= take;
    }
    tail
}

/// The first `n` bytes of `bufs`, as slices of them.
fn first_bytes<'a>(bufs: &'a [IoSlice<'a>], n: usize) -> Vec<IoSlice<'a>> {
    let mut prefix = Vec::new();
    let mut left = n;
    for buf in bufs {
        if left == 0 {
            break;
        }
        let take = left.min(buf.len());
        prefix.push(IoSlice::new(&buf[..take]));
        left -= take;
    }
    prefix
}

#[cfg(test)]
mod tests {
    use super::*;

    const ANSWER: &[u8] = b"HTTP/1.1 431 Request Header Fields Too Large\r\nconnection: close\r\n\
        content-length: 0\r\ndate: Thu, 03 Dec 2026 12:44:26 GMT\r\n\r\n";

    #[test]
    fn only_an_automatic_answer_at_the_very_end_is_recognized() {
        assert_eq!(automatic_answer_start(ANSWER), Some(0));
        let mut after = b"{\"status\":\"ok\"}".to_vec();
        after.extend_from_slice(ANSWER);
        assert_eq!(automatic_answer_start(&after), Some(15));
        assert!(ANSWER.len() <= MAX_AUTOMATIC);
        assert_eq!(automatic_answer_start(&ANSWER[..ANSWER.len() - 1]), None);
        let mut followed = ANSWER.to_vec();
        followed.push(b'x');
        assert_eq!(automatic_answer_start(&followed), None);
        let with_body = b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n\
            content-length: 2\r\ndate: Thu, 03 Dec 2026 12:44:26 GMT\r\n\r\n{}";
        assert_eq!(automatic_answer_start(with_body), None);
    }

    #[test]
    fn vectored_writes_are_cut_across_their_slices() {
        let bufs = [
            IoSlice::new(b"abc"),
            IoSlice::new(b"de"),
            IoSlice::new(b"f"),
        ];
        assert_eq!(last_bytes(&bufs, 4), b"cdef");
        assert_eq!(last_bytes(&bufs, 0), b"");
        let prefix = first_bytes(&bufs, 4);
        let joined: Vec<u8> = prefix.iter().flat_map(|s| s.iter().copied()).collect();
        assert_eq!(joined, b"abcd");
    }
}
