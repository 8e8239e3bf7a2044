//! Where in the file an error is: the line and column of a byte offset, and the dotted key on
//! that line. Called by `Config::from_toml` to point its messages at the text.

/// The 1-based line and column of a byte offset.
pub(super) fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

/// The dotted key (`table.key`) whose line holds byte `offset`, for messages that name a
/// value but not its key.
pub(super) fn key_at(text: &str, offset: usize) -> Option<String> {
    let start = text[..offset.min(text.len())]
        .rfind('\n')
        .map_or(0, |i| i + 1);
    let line = text[start..].lines().next()?.trim();
    let (key, _) = line.split_once('=')?;
    let key = key.trim().trim_matches('"');
    let table = text[..start]
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| l.starts_with('[') && !l.starts_with("[["))
        .map(|l| l.trim_matches(|c| c == '[' || c == ']').trim());
    Some(match table {
        Some(table) => format!("{table}.{key}"),
        None => key.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_at_names_the_table_and_key_of_a_line() {
        let text = "[worker]\nlease = 3\n[database]\n  pool_size = -1\n";
        assert_eq!(key_at(text, 10).as_deref(), Some("worker.lease"));
        assert_eq!(
            key_at(text, text.find("-1").unwrap()).as_deref(),
            Some("database.pool_size")
        );
        assert_eq!(key_at("[worker]\n", 0), None);
    }

    #[test]
    fn line_column_counts_from_one() {
        assert_eq!(line_column("ab\ncd", 0), (1, 1));
        assert_eq!(line_column("ab\ncd", 4), (2, 2));
        assert_eq!(line_column("ab\ncd", 99), (2, 3));
    }
}
