//! The text-stats workload in docs/benchmark.md, byte for byte: task `i` gets
//! `gen_text(i)`, built from a mulberry32 stream seeded with `0x5EED1234 + i`. The bench
//! inserts these texts and checks the table against [`check_totals`]; the integration tests
//! use the same totals.

/// The 64 words, in the order the workload defines.
pub const WORDS: [&str; 64] = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "lazy",
    "dog",
    "queue",
    "worker",
    "job",
    "task",
    "database",
    "postgres",
    "latency",
    "throughput",
    "commit",
    "lock",
    "row",
    "index",
    "vacuum",
    "notify",
    "listen",
    "batch",
    "retry",
    "payload",
    "result",
    "handler",
    "tokio",
    "rust",
    "async",
    "await",
    "future",
    "stream",
    "buffer",
    "socket",
    "naïve",
    "café",
    "façade",
    "Straße",
    "Ünïcödé",
    "日本語",
    "中文",
    "한국어",
    "Ελληνικά",
    "русский",
    "العربية",
    "עברית",
    "emoji🚀",
    "😀",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "crème",
    "brûlée",
    "jalapeño",
    "smörgåsbord",
    "a",
    "an",
    "of",
    "to",
    "in",
    "and",
    "is",
    "it",
    "that",
];

/// Totals over tasks `0..20_000` that a run must reproduce: words, bytes, runes.
pub const CHECK_TOTALS_20000: (i64, i64, i64) = (2_752_017, 20_391_842, 16_571_488);

/// The largest text, in bytes.
const MAX_BYTES: usize = 1024;

/// mulberry32 over wrapping 32-bit arithmetic.
struct Mulberry32(u32);

impl Mulberry32 {
    fn next(&mut self) -> u32 {
        self.0 = self.0.wrapping_add(0x6D2B_79F5);
        let a = self.0;
        let mut t = (a ^ (a >> 15)).wrapping_mul(1 | a);
        t = t.wrapping_add((t ^ (t >> 7)).wrapping_mul(61 | t)) ^ t;
        t ^ (t >> 14)
    }
}

/// The text of task `i`.
pub fn gen_text(i: u32) -> String {
    let mut rng = Mulberry32(0x5EED_1234_u32.wrapping_add(i));
    let mut text = String::with_capacity(MAX_BYTES);
    text.push_str(WORDS[(rng.next() % 64) as usize]);
    loop {
        let separator = match rng.next() % 100 {
            0..=79 => " ",
            80..=84 => "\n",
            85..=88 => "\t",
            89..=91 => "\u{3000}",
            92..=94 => "\u{00A0}",
            _ => "  ",
        };
        let word = WORDS[(rng.next() % 64) as usize];
        if text.len() + separator.len() + word.len() > MAX_BYTES {
            return text;
        }
        text.push_str(separator);
        text.push_str(word);
    }
}

/// The totals (words, bytes, runes) of tasks `0..n`, by the reference analyzer.
pub fn check_totals(n: u32) -> (i64, i64, i64) {
    (0..n).fold((0, 0, 0), |(w, b, r), i| {
        let counts = crate::analyzer::analyze(&gen_text(i));
        (w + counts.words, b + counts.bytes, r + counts.runes)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyzer::analyze;

    #[test]
    fn the_first_texts_match_the_workload_check_values() {
        for (i, (words, bytes, runes)) in [(139, 1023, 835), (142, 1022, 852), (148, 1022, 857)]
            .into_iter()
            .enumerate()
        {
            let counts = analyze(&gen_text(i as u32));
            assert_eq!(
                (counts.words, counts.bytes, counts.runes),
                (words, bytes, runes),
                "i = {i}"
            );
        }
    }

    #[test]
    fn twenty_thousand_texts_reproduce_the_check_totals() {
        assert_eq!(check_totals(20_000), CHECK_TOTALS_20000);
    }

    #[test]
    fn texts_stop_within_one_piece_of_1024_bytes() {
        // docs/benchmark.md says "1000 to 1024 bytes"; the rule it defines stops at the first
        // piece that would pass 1024, so a text ends within the longest piece of the limit.
        let longest_piece = 3 + WORDS.iter().map(|w| w.len()).max().unwrap();
        for i in 0..5_000 {
            let len = gen_text(i).len();
            assert!(len <= MAX_BYTES, "i = {i}: {len} bytes");
            assert!(len > MAX_BYTES - longest_piece, "i = {i}: {len} bytes");
        }
    }
}
