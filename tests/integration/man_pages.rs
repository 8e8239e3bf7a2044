//! The generated documentation of the command line, through the real binary: `pgtaskd man
//! --dir DIR` writes a page for every subcommand and every page the pages name; `--help` lists
//! every subcommand once, in its group; the completion scripts complete what each argument
//! takes (file names, a status, nothing).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::support::daemon::pgtaskd;

/// A directory of its own under the temporary directory, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        let path = std::env::temp_dir().join(format!(
            "pgtaskd-test-man-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        std::fs::create_dir(&path).expect("create a temporary directory");
        TempDir(path)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The subcommands the binary defines, from its own command line.
fn subcommands() -> Vec<String> {
    pgtaskd::cli::command()
        .get_subcommands()
        .filter(|sub| !sub.is_hide_set())
        .map(|sub| sub.get_name().to_string())
        .collect()
}

/// Every `pgtaskd-NAME(1)` a roff page names (roff writes the dash as `\-`).
fn pages_named(roff: &str) -> BTreeSet<String> {
    roff.lines()
        .filter_map(|line| line.strip_prefix("pgtaskd\\-")?.strip_suffix("(1)"))
        .map(|name| format!("pgtaskd-{}.1", name.replace("\\-", "-")))
        .collect()
}

#[tokio::test]
async fn man_dir_writes_a_page_for_every_subcommand_and_every_page_named_exists() {
    let dir = TempDir::new();
    let dir_arg = dir.path().to_string_lossy().into_owned();
    let (status, stdout, stderr) = pgtaskd(None, &["man", "--dir", &dir_arg]).await;
    assert!(status.success(), "{stderr}");

    let subs = subcommands();
    assert!(subs.len() >= 16, "{subs:?}");
    for sub in &subs {
        let page = dir.path().join(format!("pgtaskd-{sub}.1"));
        let roff = std::fs::read_to_string(&page)
            .unwrap_or_else(|err| panic!("{}: {err}", page.display()));
        assert!(
            roff.contains(&format!(
                ".TH pgtaskd-{sub} 1  \"pgtaskd {}\"",
                env!("CARGO_PKG_VERSION")
            )),
            "{} has no title of its own:\n{roff}",
            page.display()
        );
        assert!(stdout.contains(&page.display().to_string()), "{stdout}");
    }

    let main_page = std::fs::read_to_string(dir.path().join("pgtaskd.1")).expect("pgtaskd.1");
    let named = pages_named(&main_page);
    assert_eq!(named.len(), subs.len(), "{named:?}");
    for name in &named {
        assert!(
            dir.path().join(name).is_file(),
            "pgtaskd.1 names {name}, not written"
        );
    }
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let roff = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        for name in pages_named(&roff) {
            assert!(
                dir.path().join(&name).is_file(),
                "{name} is named, not written"
            );
        }
    }

    // Without --dir: pgtaskd.1 on standard output, the same page.
    let (status, stdout, stderr) = pgtaskd(None, &["man"]).await;
    assert!(status.success(), "{stderr}");
    assert_eq!(stdout, main_page);
}

#[tokio::test]
async fn man_dir_that_does_not_exist_is_a_failure_naming_it() {
    let dir = TempDir::new();
    let missing = dir.path().join("missing");
    let missing = missing.to_string_lossy();
    let (status, stdout, stderr) = pgtaskd(None, &["man", "--dir", &missing]).await;
    assert_eq!(status.code(), Some(1), "{stdout}{stderr}");
    assert!(stderr.contains(&*missing), "{stderr}");
}

/// The subcommands' part of `--help`: from the end of the usage to "Options:".
fn commands_part(help: &str) -> &str {
    let start = help.find("\n\nDaemon:\n").expect("a Daemon group") + 2;
    let end = help.find("\nOptions:\n").expect("the options");
    &help[start..end]
}

#[tokio::test]
async fn help_lists_every_subcommand_once_in_its_group() {
    let (status, help, stderr) = pgtaskd(None, &["--help"]).await;
    assert!(status.success(), "{stderr}");
    let (status, help_subcommand, _) = pgtaskd(None, &["help"]).await;
    assert!(status.success());
    assert_eq!(help, help_subcommand, "`pgtaskd help` and `--help` differ");

    let part = commands_part(&help);
    let headings: Vec<&str> = part.lines().filter(|line| line.ends_with(':')).collect();
    assert_eq!(
        headings,
        ["Daemon:", "Tasks:", "Queues:", "Tools:"],
        "{help}"
    );
    assert!(!help.contains("Commands:"), "{help}");

    let listed: Vec<&str> = part
        .lines()
        .filter_map(|line| line.strip_prefix("  ")?.split_whitespace().next())
        .collect();
    let mut expected = subcommands();
    expected.push("help".to_string());
    for sub in &expected {
        let times = listed.iter().filter(|name| *name == sub).count();
        assert_eq!(times, 1, "{sub} is listed {times} times:\n{part}");
    }
    assert_eq!(listed.len(), expected.len(), "{part}");

    // The groups of the brief, each under its heading.
    let group_of = |sub: &str| {
        let at = part.find(&format!("\n  {sub} ")).expect(sub);
        part[..at]
            .lines()
            .rev()
            .find(|line| line.ends_with(':'))
            .unwrap()
            .to_string()
    };
    for (group, subs) in [
        ("Daemon:", &["run", "migrate", "check-config"][..]),
        (
            "Tasks:",
            &["enqueue", "status", "wait", "cancel", "retry", "list"],
        ),
        ("Queues:", &["stats", "pause", "resume"]),
        ("Tools:", &["analyze", "bench", "completions", "man"]),
    ] {
        for sub in subs {
            assert_eq!(group_of(sub), group, "{sub}");
        }
    }
}

/// The case arm of a bash completion script for `option`, in the function of `path`
/// (e.g. "pgtaskd__subcmd__enqueue"): the lines from `option)` to its `;;`.
fn bash_arm<'a>(script: &'a str, path: &str, option: &str) -> &'a str {
    let function = script
        .find(&format!("        {path})"))
        .unwrap_or_else(|| panic!("no {path} in the script"));
    let rest = &script[function..];
    let arm = rest
        .find(&format!("                {option})\n"))
        .unwrap_or_else(|| panic!("no {option} in {path}"));
    let arm = &rest[arm..];
    &arm[..arm.find(";;").unwrap()]
}

#[tokio::test]
async fn bash_completions_complete_what_each_argument_takes() {
    let (status, script, stderr) = pgtaskd(None, &["completions", "bash"]).await;
    assert!(status.success(), "{stderr}");
    let files = "compgen -f";
    for (path, option, wanted) in [
        ("pgtaskd__subcmd__run", "--config", files),
        ("pgtaskd__subcmd__enqueue", "--file", files),
        (
            "pgtaskd__subcmd__run",
            "--http-listen",
            "COMPREPLY=(\"${cur}\")",
        ),
        (
            "pgtaskd__subcmd__run",
            "--database-url",
            "COMPREPLY=(\"${cur}\")",
        ),
        (
            "pgtaskd__subcmd__enqueue",
            "--queue",
            "COMPREPLY=(\"${cur}\")",
        ),
        (
            "pgtaskd__subcmd__list",
            "--status",
            "compgen -W \"waiting queued running succeeded failed canceled\"",
        ),
        ("pgtaskd__subcmd__man", "--dir", "compopt -o plusdirs"),
    ] {
        let arm = bash_arm(&script, path, option);
        assert!(arm.contains(wanted), "{path} {option}:\n{arm}");
    }

    // analyze FILE: file names, by zsh's and fish's file completion (bash falls back to them).
    let (status, zsh, _) = pgtaskd(None, &["completions", "zsh"]).await;
    assert!(status.success());
    assert!(
        zsh.lines()
            .any(|line| line.contains("The files") && line.ends_with(":_files' \\")),
        "{zsh}"
    );
}

#[tokio::test]
async fn help_and_manual_describe_a_task_daemon_running_commands_and_webhooks() {
    let (status, short, stderr) = pgtaskd(None, &["-h"]).await;
    assert!(status.success(), "{stderr}");
    let (status, long, stderr) = pgtaskd(None, &["--help"]).await;
    assert!(status.success(), "{stderr}");
    let (status, page, stderr) = pgtaskd(None, &["man"]).await;
    assert!(status.success(), "{stderr}");
    // roff writes a dash as `\-`; a line break may fall anywhere in the description.
    let page = page.replace("\\-", "-").replace('\n', " ");
    let long = long.replace('\n', " ");
    for (what, text) in [("-h", &short), ("--help", &long), ("pgtaskd.1", &page)] {
        for said in ["your command", "webhook", "text analyzer"] {
            assert!(text.contains(said), "{what} says {said:?}:\n{text}");
        }
        assert!(!text.contains("get its words"), "{what}:\n{text}");
    }
    for (what, text) in [("--help", &long), ("pgtaskd.1", &page)] {
        for handler in [
            "exec starts your command",
            "http posts the payload to your URL",
        ] {
            assert!(text.contains(handler), "{what} names {handler:?}:\n{text}");
        }
    }
}
