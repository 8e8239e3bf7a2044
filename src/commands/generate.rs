//! `pgtaskd completions SHELL` and `pgtaskd man [--dir DIR]`: the shell completion script and
//! the manual pages, generated from the command line's own definition ([`crate::cli::command`])
//! by clap's generators, so they cannot drift from it. Called by `main` before the
//! configuration is loaded (neither needs it), and by `dispatch`. The Debian package runs both
//! at build time (packaging/build-deb).

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use crate::cli::command;

use super::EXIT_RUNTIME;

/// Write the completion script for `shell` to standard output.
pub fn completions(shell: clap_complete::Shell) -> ExitCode {
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut command(), "pgtaskd", &mut script);
    write_out(&script)
}

/// Without `dir`, write pgtaskd.1, in roff, to standard output. With it, write pgtaskd.1 and
/// pgtaskd-SUBCOMMAND.1 for every subcommand into `dir`, so that each page pgtaskd.1 names
/// exists, and print the paths written.
pub fn man(dir: Option<&Path>) -> ExitCode {
    match dir {
        None => {
            let mut page = Vec::new();
            if clap_mangen::Man::new(man_command())
                .render(&mut page)
                .is_err()
            {
                return ExitCode::from(EXIT_RUNTIME);
            }
            write_out(&page)
        }
        Some(dir) => match write_pages(dir) {
            Ok(paths) => write_out(paths.as_bytes()),
            Err(err) => {
                eprintln!(
                    "pgtaskd: cannot write the manual pages into {}: {err}",
                    dir.display()
                );
                ExitCode::from(EXIT_RUNTIME)
            }
        },
    }
}

/// Every page into `dir`; the paths written, one a line, in order.
fn write_pages(dir: &Path) -> std::io::Result<String> {
    if !dir.is_dir() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "no such directory",
        ));
    }
    // clap_mangen::generate_to would title the subcommands' pages with their own (empty)
    // versions: each page here says "pgtaskd VERSION", as pgtaskd.1 does.
    let mut cmd = man_command();
    cmd.build();
    let source = format!("pgtaskd {}", env!("CARGO_PKG_VERSION"));
    let mut written = vec![clap_mangen::Man::new(cmd.clone()).generate_to(dir)?];
    write_subcommand_pages(&cmd, dir, &source, &mut written)?;
    Ok(written
        .iter()
        .map(|path| format!("{}\n", path.display()))
        .collect())
}

/// A page for each subcommand of `cmd`, and for theirs (`pgtaskd-schedule-add.1`).
fn write_subcommand_pages(
    cmd: &clap::Command,
    dir: &Path,
    source: &str,
    written: &mut Vec<std::path::PathBuf>,
) -> std::io::Result<()> {
    for sub in cmd
        .get_subcommands()
        .filter(|sub| !sub.is_hide_set() && sub.get_name() != "help")
    {
        let page = clap_mangen::Man::new(sub.clone()).source(source.to_string());
        written.push(page.generate_to(dir)?);
        write_subcommand_pages(sub, dir, source, written)?;
    }
    Ok(())
}

/// The command line the pages describe: without clap's `help` subcommand, which has no page
/// (`pgtaskd help` is `pgtaskd --help`), so that pgtaskd.1 names only pages that exist.
fn man_command() -> clap::Command {
    command().disable_help_subcommand(true)
}

/// Standard output may be a closed pipe (`| head`): that ends the command, quietly, as 1.
fn write_out(bytes: &[u8]) -> ExitCode {
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(bytes).and_then(|()| stdout.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(_) => ExitCode::from(EXIT_RUNTIME),
    }
}
