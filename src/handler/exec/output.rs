//! What an `exec` child's pipes are read into: its stdout, kept whole up to `max_output` bytes
//! ([`Stdout`]), and the last [`STDERR_TAIL`] bytes of its stderr ([`StderrTail`]). Both hold
//! a bounded amount of memory whatever the child writes.
//!
//! Also [`read_now`]: a read that never waits, for what a pipe still holds once the child has
//! exited.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsFd, AsRawFd};

/// How many of stderr's last bytes a failure's message keeps.
pub const STDERR_TAIL: usize = 4096;

/// A child's stdout, up to a limit.
#[derive(Debug)]
pub struct Stdout {
    bytes: Vec<u8>,
    max: usize,
    over: bool,
}

impl Stdout {
    /// An empty stdout that keeps at most `max` bytes.
    pub fn new(max: usize) -> Stdout {
        Stdout {
            bytes: Vec::new(),
            max,
            over: false,
        }
    }

    /// How many bytes the next read should ask for at most, out of `chunk`: one more than
    /// still fits, so that going over is seen without reading further.
    pub fn want(&self, chunk: usize) -> usize {
        chunk.min((self.max - self.bytes.len()).saturating_add(1))
    }

    /// Keep `read`; false (and nothing kept) when it goes over the limit: the reading stops.
    pub fn push(&mut self, read: &[u8]) -> bool {
        let len = self.bytes.len() + read.len();
        if len > self.max {
            self.over = true;
            return false;
        }
        if len > self.bytes.capacity() {
            // Grow by doubling, but never past the limit: the limit is the memory bound.
            let target = (self.bytes.capacity() * 2).max(len).min(self.max);
            self.bytes.reserve_exact(target - self.bytes.len());
        }
        self.bytes.extend_from_slice(read);
        true
    }

    /// Whether the child wrote more than the limit.
    pub fn is_over(&self) -> bool {
        self.over
    }

    /// What was kept.
    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }
}

/// The last [`STDERR_TAIL`] bytes of a child's stderr: a ring, whatever the child writes.
#[derive(Debug, Default)]
pub struct StderrTail {
    ring: VecDeque<u8>,
    /// Whether bytes were dropped from the front.
    cut: bool,
}

impl StderrTail {
    /// Keep `read`'s bytes, dropping the oldest beyond [`STDERR_TAIL`].
    pub fn push(&mut self, read: &[u8]) {
        if self.ring.capacity() < STDERR_TAIL {
            self.ring.reserve_exact(STDERR_TAIL);
        }
        let read = if read.len() > STDERR_TAIL {
            self.cut = true;
            self.ring.clear();
            &read[read.len() - STDERR_TAIL..]
        } else {
            read
        };
        let overflow = (self.ring.len() + read.len()).saturating_sub(STDERR_TAIL);
        if overflow > 0 {
            self.cut = true;
            self.ring.drain(..overflow);
        }
        self.ring.extend(read);
    }

    /// The tail as text: starting on a character boundary when the front was cut, invalid
    /// UTF-8 replaced, trailing white space trimmed. `None` when nothing was written.
    pub fn text(&mut self) -> Option<(String, bool)> {
        let bytes = self.ring.make_contiguous();
        let start = if self.cut {
            // At most 3 continuation bytes of a character whose start was dropped.
            bytes
                .iter()
                .take(3)
                .take_while(|b| (**b & 0b1100_0000) == 0b1000_0000)
                .count()
        } else {
            0
        };
        let text = String::from_utf8_lossy(&bytes[start..]);
        let text = text.trim_end();
        (!text.is_empty()).then(|| (text.to_owned(), self.cut))
    }
}

/// Read what `pipe` holds right now into `buf`, without waiting: `Ok(0)` at end of file,
/// [`io::ErrorKind::WouldBlock`] when it is empty but still open (a process outside the
/// child's group holds its other end).
pub fn read_now(pipe: &impl AsFd, buf: &mut [u8]) -> io::Result<usize> {
    let fd = pipe.as_fd().as_raw_fd();
    let mut poll = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        // SAFETY: one valid pollfd for an open descriptor (borrowed for this call), no wait.
        let ready = unsafe { libc::poll(&mut poll, 1, 0) };
        if ready == 0 {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        if ready > 0 {
            // SAFETY: `buf` is valid for `buf.len()` bytes and `fd` is open; poll said a read
            // will not wait (data, or the end of file).
            let read = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
            if read >= 0 {
                return Ok(read as usize);
            }
        }
        let error = io::Error::last_os_error();
        if error.kind() != io::ErrorKind::Interrupted {
            return Err(error);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stdout_keeps_up_to_the_limit_and_stops_past_it() {
        let mut out = Stdout::new(10);
        assert_eq!(out.want(8192), 11);
        assert!(out.push(b"0123456789"));
        assert_eq!(out.want(8192), 1);
        assert!(!out.is_over());
        assert!(!out.push(b"x"));
        assert!(out.is_over());
        assert_eq!(out.into_bytes(), b"0123456789");
    }

    #[test]
    fn stdout_capacity_never_passes_the_limit() {
        let mut out = Stdout::new(1000);
        for _ in 0..100 {
            assert!(out.push(b"0123456789"));
        }
        assert_eq!(out.bytes.capacity(), 1000);
        assert_eq!(Stdout::new(usize::MAX).want(64), 64);
    }

    #[test]
    fn stderr_keeps_the_last_bytes() {
        let mut tail = StderrTail::default();
        for i in 0..10_000u32 {
            tail.push(format!("line {i}\n").as_bytes());
            assert!(tail.ring.len() <= STDERR_TAIL);
        }
        tail.push(&[b'y'; 3 * STDERR_TAIL]);
        tail.push(b"\nthe end\n");
        assert!(tail.ring.capacity() < 2 * STDERR_TAIL);
        let (text, cut) = tail.text().unwrap();
        assert!(cut);
        assert_eq!(text.len(), STDERR_TAIL - 1, "the last newline is trimmed");
        assert!(text.ends_with("yyy\nthe end"));
    }

    #[test]
    fn stderr_cut_starts_on_a_character() {
        let mut tail = StderrTail::default();
        tail.push("é".repeat(STDERR_TAIL).as_bytes());
        let (text, cut) = tail.text().unwrap();
        assert!(cut);
        assert_eq!(text, "é".repeat(STDERR_TAIL / 2));
        let mut odd = StderrTail::default();
        odd.push(b"x");
        odd.push("é".repeat(STDERR_TAIL).as_bytes());
        odd.push(b"z");
        let (text, _) = odd.text().unwrap();
        assert!(!text.contains('\u{FFFD}'), "no half character: {text:?}");
        assert!(text.ends_with("éz"));
    }

    #[test]
    fn stderr_untouched_is_none_and_invalid_bytes_are_replaced() {
        assert_eq!(StderrTail::default().text(), None);
        let mut tail = StderrTail::default();
        tail.push(b"bad \xff byte\n");
        assert_eq!(tail.text(), Some(("bad \u{FFFD} byte".to_owned(), false)));
    }

    #[test]
    fn read_now_does_not_wait() {
        let (reader, mut writer) = std::os::unix::net::UnixStream::pair().unwrap();
        let mut buf = [0u8; 16];
        let empty = read_now(&reader, &mut buf).unwrap_err();
        assert_eq!(empty.kind(), io::ErrorKind::WouldBlock);
        io::Write::write_all(&mut writer, b"abc").unwrap();
        assert_eq!(read_now(&reader, &mut buf).unwrap(), 3);
        writer.shutdown(std::net::Shutdown::Write).unwrap();
        assert_eq!(read_now(&reader, &mut buf).unwrap(), 0);
    }
}
