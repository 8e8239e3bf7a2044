//! The command line of SPEC section 5, as clap derive types. Parsing only; the commands
//! themselves live in [`crate::commands`].

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "pgtaskd",
    version,
    about = "A PostgreSQL task daemon: INSERT a row into pgtaskd.tasks, get its words, bytes and runes"
)]
pub struct Cli {
    /// Configuration file (default: $PGTASKD_CONFIG, else /etc/pgtaskd/pgtaskd.toml if it exists)
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the daemon until SIGTERM or SIGINT
    Run {
        /// Apply pending migrations first
        #[arg(long)]
        migrate: bool,
    },
    /// Apply the embedded schema migrations
    Migrate,
    /// Insert one task and print its id
    Enqueue(EnqueueArgs),
    /// Print a task row
    Status {
        /// Task id
        id: i64,
        /// Print the row as JSON
        #[arg(long)]
        json: bool,
    },
    /// Request cancellation of a task and print the resulting status
    Cancel {
        /// Task id
        id: i64,
    },
    /// Validate the configuration and exit
    CheckConfig,
}

#[derive(Debug, Args)]
pub struct EnqueueArgs {
    /// The text to analyze; `-` reads standard input
    #[arg(conflicts_with = "file", required_unless_present = "file")]
    pub text: Option<String>,
    /// Read the text from this file
    #[arg(long, value_name = "FILE")]
    pub file: Option<PathBuf>,
    /// The queue to put it in
    #[arg(long, default_value = crate::config::DEFAULT_QUEUE)]
    pub queue: String,
}
