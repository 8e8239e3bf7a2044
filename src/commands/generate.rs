//! `pgtaskd completions SHELL` and `pgtaskd man`: the shell completion script and the manual
//! page, generated from the command line's own definition ([`crate::cli::Cli`]) by clap's
//! generators, so they cannot drift from it. Called by `main` before the configuration is
//! loaded (neither needs it), and by `dispatch`.

use std::io::Write;
use std::process::ExitCode;

use clap::CommandFactory;

use crate::cli::Cli;

use super::EXIT_RUNTIME;

/// Write the completion script for `shell` to standard output.
pub fn completions(shell: clap_complete::Shell) -> ExitCode {
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "pgtaskd", &mut script);
    write_out(&script)
}

/// Write the manual page, in roff, to standard output.
pub fn man() -> ExitCode {
    let mut page = Vec::new();
    if clap_mangen::Man::new(Cli::command())
        .render(&mut page)
        .is_err()
    {
        return ExitCode::from(EXIT_RUNTIME);
    }
    write_out(&page)
}

/// Standard output may be a closed pipe (`| head`): that ends the command, quietly, as 1.
fn write_out(bytes: &[u8]) -> ExitCode {
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(bytes).and_then(|()| stdout.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(_) => ExitCode::from(EXIT_RUNTIME),
    }
}
