//! The child's pipes while it runs: the payload written to stdin while stdout, stderr and the
//! progress pipe are read, in one loop, so that a child that writes before it reads cannot
//! deadlock; then, once it has exited, what they still hold, read without waiting.

use std::io;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;

use super::output::{read_now, StderrTail, Stdout, STDERR_TAIL};
use super::spawn::Child;
use crate::progress::Sink;

/// The most bytes written to stdin or read from stdout in one go.
const CHUNK: usize = 64 * 1024;

/// The most bytes read from the progress pipe in one go.
const PROGRESS_CHUNK: usize = 16 * 1024;

/// The most bytes read from one pipe after the child's exit: a pipe's largest buffer by
/// default (`/proc/sys/fs/pipe-max-size`), so all the child wrote, but no endless reading of
/// a process outside the group that keeps writing.
const DRAIN_MAX: usize = 1024 * 1024;

/// The child's pipes (stdin, stdout, stderr and, when progress is read, the progress pipe)
/// and what was read from them.
pub(super) struct Pipes<'a> {
    /// What is left to write.
    payload: &'a [u8],
    pub(super) stdin: Option<pipe::Sender>,
    stdout: Option<pipe::Receiver>,
    stderr: Option<pipe::Receiver>,
    pub(super) out: Stdout,
    pub(super) err: StderrTail,
    out_buf: Vec<u8>,
    err_buf: Vec<u8>,
    /// The progress pipe and where its lines go.
    progress: Option<pipe::Receiver>,
    sink: Option<&'a mut Sink>,
    progress_buf: Vec<u8>,
}

impl<'a> Pipes<'a> {
    pub(super) fn new(
        child: &mut Child,
        payload: &'a [u8],
        max_output: usize,
        sink: Option<&'a mut Sink>,
    ) -> Pipes<'a> {
        let progress = child.progress.take().filter(|_| sink.is_some());
        Pipes {
            progress_buf: if progress.is_some() {
                vec![0; PROGRESS_CHUNK]
            } else {
                Vec::new()
            },
            progress,
            sink,
            payload,
            // Nothing to write: closed at once, the child reads an end of file.
            stdin: child.stdin.take().filter(|_| !payload.is_empty()),
            stdout: child.stdout.take(),
            stderr: child.stderr.take(),
            out: Stdout::new(max_output),
            err: StderrTail::default(),
            out_buf: vec![0; CHUNK],
            err_buf: vec![0; STDERR_TAIL],
        }
    }

    /// Write some of the payload or read some of stdout, stderr or the progress pipe, whichever
    /// is ready first.
    /// False when stdout went over `max_output` (stdout is then closed). Never returns once
    /// every pipe is closed. Cancel-safe: nothing is lost when dropped unfinished.
    pub(super) async fn step(&mut self) -> bool {
        let want = self.out.want(self.out_buf.len());
        let payload: &'a [u8] = self.payload;
        let chunk = &payload[..payload.len().min(CHUNK)];
        tokio::select! {
            written = write_some(&mut self.stdin, chunk) => {
                match written {
                    Ok(n) => self.payload = &self.payload[n..],
                    // A broken pipe: the child does not read (the rest of) its input.
                    Err(_) => self.payload = &[],
                }
                if self.payload.is_empty() {
                    self.stdin = None;
                }
            }
            read = read_some(&mut self.stdout, &mut self.out_buf[..want]) => {
                match read {
                    Ok(n) if n > 0 => {
                        if !self.out.push(&self.out_buf[..n]) {
                            self.stdout = None;
                            return false;
                        }
                    }
                    _ => self.stdout = None,
                }
            }
            read = read_some(&mut self.stderr, &mut self.err_buf) => {
                match read {
                    Ok(n) if n > 0 => self.err.push(&self.err_buf[..n]),
                    _ => self.stderr = None,
                }
            }
            read = read_some(&mut self.progress, &mut self.progress_buf) => {
                match read {
                    Ok(n) if n > 0 => {
                        if let Some(sink) = self.sink.as_deref_mut() {
                            sink.push(&self.progress_buf[..n]);
                        }
                    }
                    // Closed by the child (or broken): its last line counts.
                    _ => self.end_progress(),
                }
            }
        }
        true
    }

    /// The progress pipe is read no more: closed, and a last line without its newline
    /// handed on.
    fn end_progress(&mut self) {
        self.progress = None;
        if let Some(sink) = self.sink.as_deref_mut() {
            sink.finish();
        }
    }

    /// Once the child has exited and its group is killed: read what stdout, the progress pipe
    /// and stderr hold without waiting for their end (a process outside the group may hold
    /// them), then close every pipe.
    pub(super) fn drain(&mut self) {
        self.stdin = None;
        if let Some(stdout) = self.stdout.take() {
            let mut drained = 0;
            while drained < DRAIN_MAX {
                let want = self.out.want(self.out_buf.len());
                match read_now(&stdout, &mut self.out_buf[..want]) {
                    Ok(n) if n > 0 && self.out.push(&self.out_buf[..n]) => drained += n,
                    _ => break,
                }
            }
        }
        if let Some(progress) = self.progress.take() {
            let sink = &mut self.sink;
            drain_into(&progress, &mut self.progress_buf, |bytes| {
                if let Some(sink) = sink.as_deref_mut() {
                    sink.push(bytes);
                }
            });
            self.end_progress();
        }
        if let Some(stderr) = self.stderr.take() {
            let err = &mut self.err;
            drain_into(&stderr, &mut self.err_buf, |bytes| err.push(bytes));
        }
    }
}

/// Read what `pipe` holds now, without waiting, into `take`, [`DRAIN_MAX`] bytes at most.
fn drain_into(pipe: &pipe::Receiver, buf: &mut [u8], mut take: impl FnMut(&[u8])) {
    let mut drained = 0;
    while drained < DRAIN_MAX {
        match read_now(pipe, buf) {
            Ok(n) if n > 0 => {
                take(&buf[..n]);
                drained += n;
            }
            _ => break,
        }
    }
}

/// Write some of `chunk` to `pipe`; pending forever when the pipe is closed.
async fn write_some(pipe: &mut Option<pipe::Sender>, chunk: &[u8]) -> io::Result<usize> {
    match pipe {
        Some(pipe) => pipe.write(chunk).await,
        None => std::future::pending().await,
    }
}

/// Read some of `pipe` into `buf`; pending forever when the pipe is closed.
async fn read_some(pipe: &mut Option<impl AsyncRead + Unpin>, buf: &mut [u8]) -> io::Result<usize> {
    match pipe {
        Some(pipe) => pipe.read(buf).await,
        None => std::future::pending().await,
    }
}
