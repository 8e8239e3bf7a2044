//! Cutting a handler's progress stream into lines, never holding more than [`MAX_LINE`]
//! bytes: a line longer than that is reported once as too long and skipped to its newline
//! without being buffered. Pure: fed bytes, it hands out lines.

/// The most bytes of one progress line (its newline not counted), and of one `POST
/// /tasks/{id}/progress` body.
pub const MAX_LINE: usize = 4096;

/// What one line came to, before its JSON is looked at.
#[derive(Debug, PartialEq, Eq)]
pub enum Line<'a> {
    /// A line of at most [`MAX_LINE`] bytes, without its newline (nor a `\r` before it).
    Whole(&'a [u8]),
    /// A line over [`MAX_LINE`] bytes: dropped, and skipped to its newline.
    TooLong,
}

/// The line splitter of one progress stream.
#[derive(Debug, Default)]
pub struct Lines {
    /// The start of the line being read, at most [`MAX_LINE`] bytes.
    partial: Vec<u8>,
    /// The line being read is over [`MAX_LINE`]: its bytes are passed over up to its newline.
    skipping: bool,
}

impl Lines {
    /// Feed `bytes`, calling `each` for every line they end (and once for a line that grows
    /// over [`MAX_LINE`], as soon as it does). Blank lines are passed over.
    pub fn push(&mut self, mut bytes: &[u8], mut each: impl FnMut(Line<'_>)) {
        while !bytes.is_empty() {
            let newline = bytes.iter().position(|&b| b == b'\n');
            let (piece, ends) = match newline {
                Some(at) => (&bytes[..at], true),
                None => (bytes, false),
            };
            bytes = match newline {
                Some(at) => &bytes[at + 1..],
                None => &[],
            };
            if self.skipping {
                if ends {
                    self.skipping = false;
                }
                continue;
            }
            if !ends {
                // Room for one byte more: a `\r` the newline may follow.
                if self.partial.len() + piece.len() > MAX_LINE + 1 {
                    self.partial.clear();
                    self.skipping = true;
                    each(Line::TooLong);
                } else {
                    self.partial.extend_from_slice(piece);
                }
                continue;
            }
            if self.partial.is_empty() {
                emit(trim_cr(piece), &mut each);
            } else {
                let mut line = std::mem::take(&mut self.partial);
                line.extend_from_slice(piece);
                emit(trim_cr(&line), &mut each);
                line.clear();
                self.partial = line;
            }
        }
    }

    /// The stream ended: a last line without a newline counts as a line.
    pub fn finish(&mut self, mut each: impl FnMut(Line<'_>)) {
        if !self.skipping && !self.partial.is_empty() {
            let line = std::mem::take(&mut self.partial);
            emit(trim_cr(&line), &mut each);
        }
        self.partial.clear();
        self.skipping = false;
    }
}

fn emit(line: &[u8], each: &mut impl FnMut(Line<'_>)) {
    if line.len() > MAX_LINE {
        each(Line::TooLong);
    } else if !line.iter().all(u8::is_ascii_whitespace) {
        each(Line::Whole(line));
    }
}

fn trim_cr(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\r").unwrap_or(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lines `chunks` come to, fed one after the other, then finished.
    fn lines(chunks: &[&[u8]]) -> Vec<Result<String, ()>> {
        let mut lines = Lines::default();
        let mut out = Vec::new();
        let mut each = |line: Line<'_>| match line {
            Line::Whole(bytes) => out.push(Ok(String::from_utf8_lossy(bytes).into_owned())),
            Line::TooLong => out.push(Err(())),
        };
        for chunk in chunks {
            lines.push(chunk, &mut each);
        }
        lines.finish(&mut each);
        assert!(lines.partial.capacity() <= 2 * MAX_LINE, "bounded");
        out
    }

    #[test]
    fn lines_are_cut_at_newlines_whatever_the_chunks() {
        let ok = |s: &str| Ok(s.to_string());
        assert_eq!(lines(&[b"a\nbc\n"]), [ok("a"), ok("bc")]);
        assert_eq!(lines(&[b"a", b"b", b"\nc", b"\n"]), [ok("ab"), ok("c")]);
        assert_eq!(
            lines(&[b"a\r\n\n  \nb"]),
            [ok("a"), ok("b")],
            "blank lines pass"
        );
        assert_eq!(lines(&[b"x\r", b"\n"]), [ok("x")]);
        assert_eq!(lines(&[]), []);
    }

    #[test]
    fn a_line_of_the_bound_is_kept_and_one_byte_more_is_not() {
        let most = vec![b'x'; MAX_LINE];
        let mut line = most.clone();
        line.push(b'\n');
        assert_eq!(lines(&[&line]), [Ok("x".repeat(MAX_LINE))]);
        let mut crlf = most.clone();
        crlf.extend_from_slice(b"\r\n");
        assert_eq!(lines(&[&crlf]), [Ok("x".repeat(MAX_LINE))]);
        for cut in [1, MAX_LINE, MAX_LINE + 1] {
            assert_eq!(
                lines(&[&crlf[..cut], &crlf[cut..]]),
                [Ok("x".repeat(MAX_LINE))]
            );
        }
        let mut over = most.clone();
        over.extend_from_slice(b"x\nnext\n");
        assert_eq!(lines(&[&over]), [Err(()), Ok("next".into())]);
        // Cut anywhere.
        for cut in [1, 100, MAX_LINE, MAX_LINE + 1, MAX_LINE + 2] {
            assert_eq!(
                lines(&[&over[..cut], &over[cut..]]),
                [Err(()), Ok("next".into())],
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn a_megabyte_without_a_newline_is_one_drop_and_never_buffered() {
        let chunk = vec![b'{'; 64 * 1024];
        let mut lines = Lines::default();
        let mut seen = Vec::new();
        for _ in 0..16 {
            lines.push(&chunk, |line| seen.push(line == Line::TooLong));
            assert!(lines.partial.len() <= MAX_LINE);
        }
        lines.push(b"\n{\"percent\": 1}\n", |line| {
            seen.push(line == Line::TooLong);
        });
        assert_eq!(seen, [true, false]);
        // Unended at the end of the stream: nothing more.
        let mut lines = Lines::default();
        let mut count = 0;
        lines.push(&chunk, |_| count += 1);
        lines.finish(|_| count += 1);
        assert_eq!(count, 1);
    }
}
