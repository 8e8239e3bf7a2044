//! The documentation's links: every relative link in `README.md`, `CHANGELOG.md` and
//! `docs/*.md` names a file or directory that exists, and every `#anchor` into a Markdown file
//! names one of its headings, by GitHub's slug rules (lowercase; spaces to `-`; every other
//! character but letters, digits, `-` and `_` removed; a repeated heading gets `-1`, `-2`...).
//! Links inside code (fenced blocks, indented blocks, `spans`) are not links and are skipped.
//! And where the docs repeat what the binary's help says (the libpq variables read, exit 4),
//! they say the same.

use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::path::{Component, Path, PathBuf};
use std::process::Command;

#[test]
fn every_relative_link_and_anchor_in_the_docs_resolves() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let files = markdown_files(root);
    assert!(
        files.iter().any(|f| f.ends_with("README.md")) && files.len() > 2,
        "no documentation found under {}",
        root.display()
    );
    let broken = broken_links(root, &files);
    assert!(
        broken.is_empty(),
        "{} broken link(s) in the documentation:\n{}",
        broken.len(),
        broken.join("\n")
    );
}

#[test]
fn a_missing_file_or_heading_is_reported_with_its_line() {
    let dir = std::env::temp_dir().join(format!("pgtaskd-doc-links-{}", std::process::id()));
    let docs = dir.join("docs");
    fs::create_dir_all(&docs).unwrap();
    fs::write(
        dir.join("README.md"),
        "# Title\n\n## Two words, `code` & more\n\nSee [ok](#two-words-code--more),\n\
         [ok](docs/a.md#the-end), [ok](docs/a.md#the-end-1), [dir](docs),\n\
         [gone](docs/gone.md) and [no heading](docs/a.md#nowhere) and\n\
         [also gone](#title-1). `[code](not-a-link.md)`\n\n    [indented](not-a-link.md)\n\n\
         ```\n[fenced](not-a-link.md)\n```\n",
    )
    .unwrap();
    fs::write(docs.join("a.md"), "# The end\n\n# The end\n").unwrap();
    let files = markdown_files(&dir);
    let broken = broken_links(&dir, &files);
    fs::remove_dir_all(&dir).unwrap();
    assert_eq!(
        broken,
        [
            "README.md:7: docs/gone.md: no such file",
            "README.md:7: docs/a.md#nowhere: no heading \"nowhere\" in docs/a.md",
            "README.md:8: #title-1: no heading \"title-1\" in README.md",
        ],
        "{broken:#?}"
    );
}

#[test]
fn the_help_the_example_file_and_the_docs_name_the_same_libpq_variables() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let help = help(&["run", "--help"]);
    let from_help = libpq_variables(between(&help, "RUST_LOG", "libpq's, for whatever"));
    assert!(
        from_help.contains("PGHOST") && from_help.contains("PGTARGETSESSIONATTRS"),
        "{from_help:?}\n{help}"
    );
    let read = |path: &str| fs::read_to_string(root.join(path)).unwrap();
    let example = read("pgtaskd.example.toml");
    let configuration = read("docs/configuration.md");
    let operations = read("docs/operations.md");
    for (source, text) in [
        (
            "pgtaskd.example.toml, [database]",
            between(&example, "else the libpq environment", "which also fills"),
        ),
        (
            "docs/configuration.md, The connection",
            between(
                &configuration,
                "then the libpq environment",
                "which also fills",
            ),
        ),
        (
            "docs/configuration.md, Environment variables",
            between(&configuration, "| `PGHOST`", "libpq's, for whatever"),
        ),
        (
            "docs/operations.md, Run as a sidecar",
            between(
                &operations,
                "| `PGHOST`",
                "fill what the string leaves unset",
            ),
        ),
    ] {
        assert_eq!(libpq_variables(text), from_help, "{source}: {text}");
    }
}

#[test]
fn the_help_and_the_docs_agree_on_exit_4() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let top = help(&["--help"]);
    let four = between(&top, "\n  4 ", "\n  69 ");
    assert!(
        four.contains("cancel") && four.contains("retry") && four.contains("FAILED or CANCELED"),
        "pgtaskd --help, exit 4: {four}"
    );
    let retry = help(&["retry", "--help"]);
    assert!(
        retry.contains("4 for a task that is not FAILED or CANCELED"),
        "{retry}"
    );
    let cli = fs::read_to_string(root.join("docs/cli.md")).unwrap();
    let row = between(&cli, "| 4 |", "\n");
    assert!(
        row.contains("`cancel` of a finished task")
            && row.contains("`retry` of a task that is not FAILED or CANCELED"),
        "docs/cli.md, exit 4: {row}"
    );
}

/// What `pgtaskd ARGS` prints on standard output; it must succeed.
fn help(args: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_pgtaskd"))
        .args(args)
        .output()
        .unwrap();
    assert!(output.status.success(), "pgtaskd {args:?}: {output:?}");
    String::from_utf8(output.stdout).unwrap()
}

/// The text of `text` from the first `start` to the next `end` after it.
fn between<'a>(text: &'a str, start: &str, end: &str) -> &'a str {
    let from = text
        .find(start)
        .unwrap_or_else(|| panic!("{start:?} not found in:\n{text}"));
    let rest = &text[from..];
    let to = rest
        .find(end)
        .unwrap_or_else(|| panic!("{end:?} not found after {start:?} in:\n{text}"));
    &rest[..to]
}

/// The libpq variables `text` names: words of `PG` and capitals, `PGTASKD_*` left out.
fn libpq_variables(text: &str) -> BTreeSet<String> {
    text.split(|c: char| !(c.is_ascii_uppercase() || c == '_'))
        .filter(|word| word.starts_with("PG") && word.len() > 2 && !word.starts_with("PGTASKD_"))
        .map(str::to_string)
        .collect()
}

/// `README.md`, `CHANGELOG.md` and `docs/*.md` under `root`, sorted.
fn markdown_files(root: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = ["README.md", "CHANGELOG.md"]
        .iter()
        .map(|name| root.join(name))
        .filter(|path| path.is_file())
        .collect();
    if let Ok(entries) = fs::read_dir(root.join("docs")) {
        let mut docs: Vec<PathBuf> = entries
            .map(|entry| entry.unwrap().path())
            .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
            .collect();
        docs.sort();
        files.extend(docs);
    }
    files
}

/// One line per broken link: `FILE:LINE: TARGET: why`.
fn broken_links(root: &Path, files: &[PathBuf]) -> Vec<String> {
    let mut anchors: HashMap<PathBuf, Vec<String>> = HashMap::new();
    let mut broken = Vec::new();
    for file in files {
        let text = fs::read_to_string(file).unwrap();
        let shown = file
            .strip_prefix(root)
            .unwrap_or(file)
            .display()
            .to_string();
        for (line, target) in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, anchor) = match target.split_once('#') {
                Some((path, anchor)) => (path, Some(anchor)),
                None => (target.as_str(), None),
            };
            let resolved = if path.is_empty() {
                file.clone()
            } else {
                normalize(&file.parent().unwrap().join(path))
            };
            if !resolved.exists() {
                broken.push(format!("{shown}:{line}: {target}: no such file"));
                continue;
            }
            let Some(anchor) = anchor else { continue };
            if resolved.extension().is_none_or(|ext| ext != "md") {
                continue;
            }
            let known = anchors
                .entry(resolved.clone())
                .or_insert_with(|| headings(&fs::read_to_string(&resolved).unwrap_or_default()));
            if !known.iter().any(|slug| slug == anchor) {
                let shown_target = resolved.strip_prefix(root).unwrap_or(&resolved);
                broken.push(format!(
                    "{shown}:{line}: {target}: no heading {anchor:?} in {}",
                    shown_target.display()
                ));
            }
        }
    }
    broken
}

/// `a/b/../c` as `a/c`, without asking the file system (a link may name a missing file).
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// The lines of `text` that are prose: fenced and indented code blocks blanked out, so that
/// line numbers stay right.
fn prose_lines(text: &str) -> Vec<String> {
    let mut fence: Option<String> = None;
    let mut previous_blank = true;
    let mut in_indented = false;
    text.lines()
        .map(|line| {
            let trimmed = line.trim_start();
            if let Some(marker) = &fence {
                if trimmed.starts_with(marker.as_str()) {
                    fence = None;
                }
                return String::new();
            }
            if trimmed.starts_with("```") || trimmed.starts_with("~~~") {
                fence = Some(trimmed[..3].to_string());
                return String::new();
            }
            let blank = line.trim().is_empty();
            // An indented block starts after a blank line (not inside a list item's
            // continuation, which follows text) and lasts while lines stay indented or blank.
            if line.starts_with("    ") && (previous_blank && !blank || in_indented) {
                in_indented = true;
                previous_blank = false;
                return String::new();
            }
            if !blank {
                in_indented = false;
            }
            previous_blank = blank;
            line.to_string()
        })
        .collect()
}

/// Every inline link or image target of `text`, with its line number (1-based), code spans
/// left out. A link's text may run over several lines.
fn links(text: &str) -> Vec<(usize, String)> {
    let prose = prose_lines(text).join("\n");
    let chars: Vec<char> = without_code_spans(&prose).chars().collect();
    let mut found = Vec::new();
    let mut line = 1;
    let mut i = 0;
    while i < chars.len() {
        if chars[i] == '\n' {
            line += 1;
        }
        if chars[i] == ']' && chars.get(i + 1) == Some(&'(') {
            let start = i + 2;
            let mut end = start;
            while end < chars.len() && chars[end] != ')' && !chars[end].is_whitespace() {
                end += 1;
            }
            let target: String = chars[start..end].iter().collect();
            let target = target
                .trim_start_matches('<')
                .trim_end_matches('>')
                .to_string();
            if !target.is_empty() {
                found.push((line, target));
            }
            i = end;
            continue;
        }
        i += 1;
    }
    found
}

/// `text` with every code span's characters replaced by `x` (newlines kept).
fn without_code_spans(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        if chars[i] != '`' {
            out.push(chars[i]);
            i += 1;
            continue;
        }
        let ticks = chars[i..].iter().take_while(|c| **c == '`').count();
        let close = (i + ticks..chars.len()).find(|&j| {
            chars[j..].iter().take_while(|c| **c == '`').count() == ticks
                && (j == 0 || chars[j - 1] != '`')
        });
        match close {
            Some(j) => {
                for c in &chars[i..j + ticks] {
                    out.push(if *c == '\n' { '\n' } else { 'x' });
                }
                i = j + ticks;
            }
            None => {
                out.extend(&chars[i..i + ticks]);
                i += ticks;
            }
        }
    }
    out
}

/// The anchors GitHub gives the headings of `text`, in order.
fn headings(text: &str) -> Vec<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut slugs = Vec::new();
    for line in prose_lines(text) {
        let hashes = line.chars().take_while(|c| *c == '#').count();
        if hashes == 0 || hashes > 6 || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(line[hashes..].trim().trim_end_matches('#').trim());
        let count = seen.entry(base.clone()).or_insert(0);
        slugs.push(if *count == 0 {
            base.clone()
        } else {
            format!("{base}-{count}")
        });
        *count += 1;
    }
    slugs
}

/// GitHub's anchor for a heading's text.
fn slug(heading: &str) -> String {
    heading
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            '-' | '_' => Some(c),
            c if c.is_alphanumeric() => Some(c),
            _ => None,
        })
        .collect()
}
