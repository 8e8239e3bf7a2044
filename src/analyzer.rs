//! The text analyzer: words, bytes and runes of a UTF-8 text.
//!
//! Pure code: no async, no I/O. The semantics are those of docs/design.md, "Analyzer", which
//! are Go's `len(strings.Fields(s))`, `len(s)` and `utf8.RuneCountInString(s)`:
//!
//! - `bytes` is the length of the UTF-8 encoding;
//! - `runes` is the number of Unicode scalar values;
//! - `words` is the number of maximal runs of characters that are not White_Space
//!   (U+0009..U+000D, U+0020, U+0085, U+00A0, U+1680, U+2000..U+200A, U+2028, U+2029,
//!   U+202F, U+205F, U+3000; not U+200B nor U+FEFF).
//!
//! The scan works on bytes, never decoding a `char`: a rune starts at every byte that is not
//! a UTF-8 continuation byte, and the few multi-byte White_Space characters are recognised by
//! their encoded bytes. On x86_64 it takes 32 bytes at a time with AVX2 (16 with SSE2 where
//! the processor lacks AVX2), multi-byte spaces included, and steps byte by byte only through
//! the last few bytes of a text. It checks its cancellation signal between chunks, so a large
//! text stops early when asked to.
//!
//! The worker calls it through the [`Analyzer`] trait, so that tests can put a gate in front
//! of it or make it fail.

use std::fmt;

use tokio_util::sync::CancellationToken;

/// How many bytes are scanned between two looks at the cancellation signal.
const CANCEL_CHECK_BYTES: usize = 1 << 20;

/// The three results of an analysis.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Counts {
    pub words: i64,
    pub bytes: i64,
    pub runes: i64,
}

impl fmt::Display for Counts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "words={} bytes={} runes={}",
            self.words, self.bytes, self.runes
        )
    }
}

/// Why an analysis ended without a result.
///
/// Both variants carry the partial counts reached so far; the finisher never stores them
/// ("Results with status" in docs/design.md), but logs may show them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnalyzeError {
    /// The cancellation signal was seen before the text was fully scanned.
    #[error("analysis canceled")]
    Canceled { partial: Counts },
    /// The analyzer failed; the message becomes the task's `error`.
    #[error("{message}")]
    Failed { message: String, partial: Counts },
}

/// Something that turns a payload into [`Counts`].
///
/// The daemon uses [`TextStats`]; tests substitute analyzers held at a gate, counting their
/// calls, or failing. Implementations are called on a blocking thread and should look at
/// `cancel` now and then on long inputs.
pub trait Analyzer: Send + Sync + 'static {
    /// Analyze `text`.
    ///
    /// # Errors
    ///
    /// [`AnalyzeError::Canceled`] when `cancel` fired before the end, and
    /// [`AnalyzeError::Failed`] when the analysis itself failed.
    fn analyze(&self, text: &str, cancel: &CancellationToken) -> Result<Counts, AnalyzeError>;

    /// Texts shorter than this many bytes may be analyzed on the async worker thread itself,
    /// saving the hop to a blocking thread. Only for analyzers that never block: the default,
    /// zero, always uses a blocking thread.
    fn inline_below(&self) -> usize {
        0
    }

    /// Analyze a stream (a file). The default reads it whole and calls
    /// [`Analyzer::analyze`]; the real analyzer scans it a buffer at a time.
    ///
    /// # Errors
    ///
    /// As [`analyze_stream`].
    fn analyze_reader(
        &self,
        reader: &mut dyn std::io::Read,
        cancel: &CancellationToken,
    ) -> Result<Counts, StreamError> {
        let mut bytes = Vec::new();
        reader.read_to_end(&mut bytes).map_err(StreamError::Read)?;
        let text = simdutf8::basic::from_utf8(&bytes).map_err(|_| StreamError::NotUtf8)?;
        Ok(self.analyze(text, cancel)?)
    }
}

/// The real analyzer (docs/design.md, "Analyzer").
#[derive(Debug, Clone, Copy, Default)]
pub struct TextStats;

impl Analyzer for TextStats {
    fn analyze(&self, text: &str, cancel: &CancellationToken) -> Result<Counts, AnalyzeError> {
        analyze_cancellable(text, || cancel.is_cancelled())
    }

    /// A 64 KiB text takes tens of microseconds: short enough for an async thread.
    fn inline_below(&self) -> usize {
        64 * 1024
    }

    fn analyze_reader(
        &self,
        reader: &mut dyn std::io::Read,
        cancel: &CancellationToken,
    ) -> Result<Counts, StreamError> {
        analyze_stream(reader, || cancel.is_cancelled())
    }
}

/// Analyze the whole of `text`.
pub fn analyze(text: &str) -> Counts {
    match analyze_cancellable(text, || false) {
        Ok(counts) => counts,
        Err(_) => unreachable!("an analysis that is never canceled always finishes"),
    }
}

/// Analyze `text`, asking `canceled` between chunks whether to stop.
///
/// # Errors
///
/// [`AnalyzeError::Canceled`] with the counts of the part scanned so far when `canceled`
/// returned true before the end.
pub fn analyze_cancellable(
    text: &str,
    canceled: impl Fn() -> bool,
) -> Result<Counts, AnalyzeError> {
    let bytes = text.as_bytes();
    let mut scan = Scan::default();
    let mut start = 0;
    while start < bytes.len() {
        if canceled() {
            return Err(AnalyzeError::Canceled {
                partial: scan.counts(start),
            });
        }
        let end = (start + CANCEL_CHECK_BYTES).min(bytes.len());
        scan.run(bytes, start, end);
        start = end;
    }
    Ok(scan.counts(bytes.len()))
}

/// Why a stream could not be analyzed.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    #[error("cannot read: {0}")]
    Read(#[source] std::io::Error),
    #[error("not valid UTF-8")]
    NotUtf8,
    #[error(transparent)]
    Analyze(#[from] AnalyzeError),
}

/// How much of a stream is read at a time.
const STREAM_BUFFER: usize = 1 << 18;

/// Analyze everything `reader` yields, a buffer at a time, without holding it all: each
/// buffer is validated as UTF-8 and scanned up to its last complete character; the rest
/// starts the next buffer.
///
/// # Errors
///
/// A read error, bytes that are not UTF-8, or [`AnalyzeError::Canceled`] when `canceled`
/// returned true before the end.
pub fn analyze_stream(
    reader: &mut dyn std::io::Read,
    canceled: impl Fn() -> bool,
) -> Result<Counts, StreamError> {
    let mut buffer = vec![0u8; STREAM_BUFFER];
    let mut kept = 0; // bytes of an incomplete character carried to the front
    let mut total = 0usize;
    let mut scan = Scan::default();
    loop {
        if canceled() {
            return Err(AnalyzeError::Canceled {
                partial: scan.counts(total),
            }
            .into());
        }
        let read = match reader.read(&mut buffer[kept..]) {
            Ok(read) => read,
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(err) => return Err(StreamError::Read(err)),
        };
        let filled = kept + read;
        let valid = match simdutf8::compat::from_utf8(&buffer[..filled]) {
            Ok(text) => text.len(),
            // An incomplete character at the end is completed by the next read.
            Err(err) if err.error_len().is_none() && read > 0 => err.valid_up_to(),
            Err(_) => return Err(StreamError::NotUtf8),
        };
        scan.run(&buffer[..valid], 0, valid);
        total += valid;
        if read == 0 {
            return Ok(scan.counts(total));
        }
        buffer.copy_within(valid..filled, 0);
        kept = filled - valid;
    }
}

/// The state carried from one byte, block and chunk to the next.
///
/// The scan works at byte granularity: a byte is a "space byte" when it belongs to a
/// White_Space character. A word starts at every byte that is not a space byte and follows
/// one (or the start). Continuation bytes share their lead byte's kind, so this counts
/// exactly the runs of non-space characters.
#[derive(Debug)]
struct Scan {
    words: i64,
    runes: i64,
    /// Whether the previous byte was a space byte.
    prev_space: bool,
    /// Continuation bytes still to come of a multi-byte space character.
    pending: u8,
}

impl Default for Scan {
    fn default() -> Self {
        Scan {
            words: 0,
            runes: 0,
            prev_space: true,
            pending: 0,
        }
    }
}

impl Scan {
    fn counts(&self, bytes: usize) -> Counts {
        Counts {
            words: self.words,
            bytes: bytes as i64,
            runes: self.runes,
        }
    }

    /// Scan `bytes[start..end]`. `bytes` is valid UTF-8, so the look-ahead of a lead byte
    /// stays inside it even when the character crosses `end`.
    fn run(&mut self, bytes: &[u8], start: usize, end: usize) {
        let mut i = start;
        #[cfg(target_arch = "x86_64")]
        {
            i = run_blocks(self, bytes, i, end);
        }
        while i < end {
            self.step(bytes, i);
            i += 1;
        }
    }

    /// One byte.
    #[inline]
    fn step(&mut self, bytes: &[u8], i: usize) {
        let b = bytes[i];
        let space = if self.pending > 0 {
            self.pending -= 1;
            true
        } else if b < 0x80 {
            b == b' ' || b.wrapping_sub(b'\t') < 5
        } else if b < 0xC0 {
            // A continuation byte of a character that is not a space.
            false
        } else {
            match multibyte_space_len(b, bytes, i) {
                0 => false,
                len => {
                    self.pending = len - 1;
                    true
                }
            }
        };
        self.runes += i64::from(b & 0xC0 != 0x80);
        self.words += i64::from(!space & self.prev_space);
        self.prev_space = space;
    }
}

/// The block scanners: 32 bytes at a time with AVX2 where the processor has it, 16 with SSE2
/// (part of every x86_64) otherwise and for what is left. Both come from one body
/// ([`block_scanner`]). Returns where the bytes left for [`Scan::step`] begin.
#[cfg(target_arch = "x86_64")]
fn run_blocks(scan: &mut Scan, bytes: &[u8], i: usize, end: usize) -> usize {
    let i = if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the processor has AVX2, checked just above.
        unsafe { blocks_avx2(scan, bytes, i, end) }
    } else {
        i
    };
    // SAFETY: SSE2 is part of the x86_64 baseline.
    unsafe { blocks_sse2(scan, bytes, i, end) }
}

/// Rune starts, ASCII spaces and the multi-byte spaces (recognised from the block and the same
/// block loaded one and two bytes further on) by vector compares, `$lanes` bytes at a time.
/// Space bytes that spill past a block's end carry into the next.
#[cfg(target_arch = "x86_64")]
macro_rules! block_scanner {
    ($(#[$attr:meta])* $name:ident, $lanes:literal, $vector:ty, $load:ident, $set1:ident,
     $cmpeq:ident, $cmpgt:ident, $and:ident, $or:ident, $xor:ident, $sub:ident, $movemask:ident) => {
        $(#[$attr])*
        unsafe fn $name(scan: &mut Scan, bytes: &[u8], mut i: usize, end: usize) -> usize {
            use std::arch::x86_64::*;
            const LANES: usize = $lanes;
            const BLOCK: u64 = (1 << LANES) - 1;
            let mut carry: u64 = (1u64 << scan.pending) - 1;
            scan.pending = 0;
            while i + LANES <= end && i + LANES + 2 <= bytes.len() {
                // SAFETY: the three loads read bytes[i..i + LANES + 2], in bounds by the loop
                // condition, and allow any alignment; the caller guarantees the instructions.
                let (starts, spaces) = unsafe {
                    let at = |k: usize| $load(bytes.as_ptr().add(i + k).cast::<$vector>());
                    let byte = |b: u8| $set1(b as i8);
                    let (v0, v1, v2) = (at(0), at(1), at(2));
                    // Unsigned `x - low < len` by a signed compare after moving the sign bit.
                    let below = |x: $vector, low: u8, len: u8| {
                        $cmpgt(byte(0x80 ^ len), $xor($sub(x, byte(low)), byte(0x80)))
                    };
                    let mask = |v: $vector| u64::from($movemask(v) as u32);
                    let continuation = $cmpgt(byte(0xC0), v0);
                    let ascii = $or($cmpeq(v0, byte(b' ')), below(v0, b'\t', 5));
                    // U+0085, U+00A0: C2 85, C2 A0.
                    let two = $and(
                        $cmpeq(v0, byte(0xC2)),
                        $or($cmpeq(v1, byte(0x85)), $cmpeq(v1, byte(0xA0))),
                    );
                    // U+1680: E1 9A 80. U+3000: E3 80 80.
                    let ogham = $and(
                        $and($cmpeq(v0, byte(0xE1)), $cmpeq(v1, byte(0x9A))),
                        $cmpeq(v2, byte(0x80)),
                    );
                    let ideographic = $and(
                        $and($cmpeq(v0, byte(0xE3)), $cmpeq(v1, byte(0x80))),
                        $cmpeq(v2, byte(0x80)),
                    );
                    // U+2000..U+200A, U+2028, U+2029, U+202F: E2 80 (80..8A | A8 | A9 | AF).
                    let general = $and(
                        $and($cmpeq(v0, byte(0xE2)), $cmpeq(v1, byte(0x80))),
                        $or(
                            $or(below(v2, 0x80, 11), below(v2, 0xA8, 2)),
                            $cmpeq(v2, byte(0xAF)),
                        ),
                    );
                    // U+205F: E2 81 9F.
                    let medium = $and(
                        $and($cmpeq(v0, byte(0xE2)), $cmpeq(v1, byte(0x81))),
                        $cmpeq(v2, byte(0x9F)),
                    );
                    let three = $or($or(ogham, ideographic), $or(general, medium));
                    let (two, three) = (mask(two), mask(three));
                    let spaces =
                        mask(ascii) | two | (two << 1) | three | (three << 1) | (three << 2);
                    (!mask(continuation) & BLOCK, spaces)
                };
                let spaces = spaces | carry;
                carry = spaces >> LANES;
                let block = spaces & BLOCK;
                let previous = (block << 1) | u64::from(scan.prev_space);
                scan.words += i64::from((!block & previous & BLOCK).count_ones());
                scan.runes += i64::from(starts.count_ones());
                scan.prev_space = block >> (LANES - 1) != 0;
                i += LANES;
            }
            scan.pending = carry.count_ones() as u8;
            i
        }
    };
}

#[cfg(target_arch = "x86_64")]
block_scanner!(
    blocks_sse2,
    16,
    __m128i,
    _mm_loadu_si128,
    _mm_set1_epi8,
    _mm_cmpeq_epi8,
    _mm_cmpgt_epi8,
    _mm_and_si128,
    _mm_or_si128,
    _mm_xor_si128,
    _mm_sub_epi8,
    _mm_movemask_epi8
);

#[cfg(target_arch = "x86_64")]
block_scanner!(
    #[target_feature(enable = "avx2")]
    blocks_avx2,
    32,
    __m256i,
    _mm256_loadu_si256,
    _mm256_set1_epi8,
    _mm256_cmpeq_epi8,
    _mm256_cmpgt_epi8,
    _mm256_and_si256,
    _mm256_or_si256,
    _mm256_xor_si256,
    _mm256_sub_epi8,
    _mm256_movemask_epi8
);

/// The length in bytes of the White_Space character led by `lead` at `bytes[i]`, or zero
/// when that character is not a space.
#[inline]
fn multibyte_space_len(lead: u8, bytes: &[u8], i: usize) -> u8 {
    let next = |k: usize| bytes.get(i + k).copied().unwrap_or(0);
    let space = match lead {
        // U+0085, U+00A0
        0xC2 => return if matches!(next(1), 0x85 | 0xA0) { 2 } else { 0 },
        // U+1680
        0xE1 => next(1) == 0x9A && next(2) == 0x80,
        0xE2 => match next(1) {
            // U+2000..U+200A, U+2028, U+2029, U+202F
            0x80 => matches!(next(2), 0x80..=0x8A | 0xA8 | 0xA9 | 0xAF),
            // U+205F
            0x81 => next(2) == 0x9F,
            _ => false,
        },
        // U+3000
        0xE3 => next(1) == 0x80 && next(2) == 0x80,
        _ => false,
    };
    if space {
        3
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every character with the Unicode White_Space property.
    const WHITE_SPACE: &[char] = &[
        '\u{0009}', '\u{000A}', '\u{000B}', '\u{000C}', '\u{000D}', '\u{0020}', '\u{0085}',
        '\u{00A0}', '\u{1680}', '\u{2000}', '\u{2001}', '\u{2002}', '\u{2003}', '\u{2004}',
        '\u{2005}', '\u{2006}', '\u{2007}', '\u{2008}', '\u{2009}', '\u{200A}', '\u{2028}',
        '\u{2029}', '\u{202F}', '\u{205F}', '\u{3000}',
    ];

    fn counts(words: i64, bytes: i64, runes: i64) -> Counts {
        Counts {
            words,
            bytes,
            runes,
        }
    }

    #[test]
    fn table_of_texts_gives_go_fields_len_and_rune_count() {
        let cases: &[(&str, Counts)] = &[
            ("", counts(0, 0, 0)),
            (" ", counts(0, 1, 1)),
            ("   \t\n\r\x0b\x0c ", counts(0, 9, 9)),
            ("hello", counts(1, 5, 5)),
            ("hello world", counts(2, 11, 11)),
            ("  hello   world  ", counts(2, 17, 17)),
            ("naïve 日本語 text", counts(3, 21, 14)),
            ("emoji🚀 😀", counts(2, 14, 8)),
            ("𝔘𝔫𝔦", counts(1, 12, 3)),
            ("a\u{3000}b\u{00A0}c", counts(3, 8, 5)),
            ("a\u{200B}b", counts(1, 5, 3)),
            ("a\u{FEFF}b", counts(1, 5, 3)),
            ("\u{200B}", counts(1, 3, 1)),
            ("\u{FEFF}", counts(1, 3, 1)),
            ("Straße crème brûlée", counts(3, 23, 19)),
            // Near misses of the multi-byte spaces: same lead bytes, other characters.
            (
                "\u{00A1}\u{1681}\u{200C}\u{2030}\u{2060}\u{3001}",
                counts(1, 17, 6),
            ),
        ];
        for (text, want) in cases {
            assert_eq!(analyze(text), *want, "text {text:?}");
        }
    }

    #[test]
    fn every_white_space_character_separates_words_and_alone_is_no_word() {
        for &space in WHITE_SPACE {
            let alone = space.to_string();
            assert_eq!(analyze(&alone).words, 0, "{space:?} alone");
            let between = format!("a{space}b");
            let want = counts(2, 2 + space.len_utf8() as i64, 3);
            assert_eq!(analyze(&between), want, "{space:?} between two words");
            let runs = format!("{space}{space}x{space}");
            assert_eq!(analyze(&runs).words, 1, "{space:?} around one word");
        }
    }

    #[test]
    fn white_space_table_is_the_unicode_property() {
        // Rust's char::is_whitespace is the White_Space property; check our table against it
        // over every scalar value, so that the byte scan and the property cannot drift apart.
        let from_property: Vec<char> = (0..=0x10FFFF_u32)
            .filter_map(char::from_u32)
            .filter(|c| c.is_whitespace())
            .collect();
        assert_eq!(from_property, WHITE_SPACE);
        for c in (0..=0x10FFFF_u32).filter_map(char::from_u32) {
            let text = format!("x{c}y");
            let want = if c.is_whitespace() { 2 } else { 1 };
            assert_eq!(analyze(&text).words, want, "U+{:04X}", c as u32);
        }
    }

    #[test]
    fn random_texts_agree_with_split_whitespace_and_chars() {
        let alphabet: Vec<char> = WHITE_SPACE
            .iter()
            .copied()
            .chain("ab日本😀ïß\u{200B}\u{FEFF}\u{00A1}\u{2030}".chars())
            .collect();
        let mut rng = fastrand::Rng::with_seed(7);
        for _ in 0..2_000 {
            let len = rng.usize(0..64);
            let text: String = (0..len)
                .map(|_| alphabet[rng.usize(..alphabet.len())])
                .collect();
            let want = counts(
                text.split_whitespace().count() as i64,
                text.len() as i64,
                text.chars().count() as i64,
            );
            assert_eq!(analyze(&text), want, "text {text:?}");
        }
    }

    /// The byte-by-byte scan alone, without the vector blocks.
    fn stepwise(text: &str) -> Counts {
        let mut scan = Scan::default();
        for i in 0..text.len() {
            scan.step(text.as_bytes(), i);
        }
        scan.counts(text.len())
    }

    /// The SSE2 blocks alone (then byte steps), whether or not the processor has AVX2.
    #[cfg(target_arch = "x86_64")]
    fn sse2_only(text: &str) -> Counts {
        let bytes = text.as_bytes();
        let mut scan = Scan::default();
        // SAFETY: SSE2 is part of the x86_64 baseline.
        let mut i = unsafe { blocks_sse2(&mut scan, bytes, 0, bytes.len()) };
        while i < bytes.len() {
            scan.step(bytes, i);
            i += 1;
        }
        scan.counts(bytes.len())
    }

    #[test]
    fn long_random_texts_agree_block_by_block_and_byte_by_byte() {
        // Long enough for many 16- and 32-byte blocks, with multi-byte spaces and near misses
        // that straddle block boundaries at every alignment.
        let alphabet: Vec<char> = WHITE_SPACE
            .iter()
            .copied()
            .chain("abcdefgh日本😀ïßé\u{200B}\u{FEFF}\u{00A1}\u{2030}\u{1681}\u{3001}".chars())
            .collect();
        let mut rng = fastrand::Rng::with_seed(11);
        for round in 0..300 {
            let len = rng.usize(16..600);
            let text: String = (0..len)
                .map(|_| {
                    if rng.u8(..4) == 0 {
                        alphabet[rng.usize(..alphabet.len())]
                    } else {
                        (b'a' + rng.u8(..26)) as char
                    }
                })
                .collect();
            for skip in 0..4 {
                let Some(tail) = text.get(skip..) else {
                    continue;
                };
                let want = counts(
                    tail.split_whitespace().count() as i64,
                    tail.len() as i64,
                    tail.chars().count() as i64,
                );
                assert_eq!(analyze(tail), want, "round {round}, skip {skip}: {tail:?}");
                assert_eq!(stepwise(tail), want, "round {round}, skip {skip}");
                #[cfg(target_arch = "x86_64")]
                assert_eq!(sse2_only(tail), want, "round {round}, skip {skip}");
            }
        }
    }

    /// A reader that hands out a few bytes at a time, so characters straddle its reads.
    struct Trickle<'a>(&'a [u8], usize);

    impl std::io::Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = self.1.min(buf.len()).min(self.0.len());
            buf[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Ok(n)
        }
    }

    #[test]
    fn a_stream_read_in_pieces_counts_as_the_whole_text() {
        let text = "日本語 café\u{3000}x\u{00A0}😀 ".repeat(500);
        for piece in [1, 2, 3, 5, 7, 16, 4096] {
            let got = analyze_stream(&mut Trickle(text.as_bytes(), piece), || false).unwrap();
            assert_eq!(got, analyze(&text), "pieces of {piece}");
        }
        let larger = "ab\u{2028}ü ".repeat(STREAM_BUFFER / 3);
        let got = analyze_stream(&mut larger.as_bytes(), || false).unwrap();
        assert_eq!(got, analyze(&larger));
    }

    #[test]
    fn a_stream_that_is_not_utf8_is_refused() {
        for bytes in [&b"ok \xff no"[..], b"cut \xe6\x97"] {
            let err = analyze_stream(&mut &bytes[..], || false).unwrap_err();
            assert!(matches!(err, StreamError::NotUtf8), "{bytes:?}: {err}");
        }
    }

    #[test]
    fn texts_larger_than_a_chunk_count_across_chunk_boundaries() {
        // Multi-byte characters and words straddle every chunk boundary.
        let piece = "日本語 café\u{3000}x ";
        let text = piece.repeat(3 * CANCEL_CHECK_BYTES / piece.len() + 7);
        let want = counts(
            text.split_whitespace().count() as i64,
            text.len() as i64,
            text.chars().count() as i64,
        );
        assert_eq!(analyze(&text), want);
    }

    #[test]
    fn a_canceled_analysis_stops_early_with_partial_counts() {
        let text = "word ".repeat(CANCEL_CHECK_BYTES); // five chunks
        let asked = std::cell::Cell::new(0);
        let result = analyze_cancellable(&text, || {
            asked.set(asked.get() + 1);
            asked.get() > 2
        });
        match result {
            Err(AnalyzeError::Canceled { partial }) => {
                assert_eq!(partial.bytes, 2 * CANCEL_CHECK_BYTES as i64);
                let scanned = &text[..partial.bytes as usize];
                assert_eq!(partial, analyze(scanned));
            }
            other => panic!("expected a canceled analysis, got {other:?}"),
        }
    }

    #[test]
    fn text_stats_reports_canceled_when_the_token_fired() {
        let token = CancellationToken::new();
        token.cancel();
        let result = TextStats.analyze("some words", &token);
        assert!(matches!(result, Err(AnalyzeError::Canceled { .. })));
        assert_eq!(
            TextStats.analyze("", &token),
            Ok(Counts::default()),
            "an empty text has nothing left to cancel"
        );
    }
}
