//! `pgtaskd graph FILE`: a graph of tasks that wait for one another, inserted in one
//! transaction through `pgtaskd.enqueue_graph` (`queue::graph`, docs/dependencies.md,
//! "Graphs"). Exit 2 for a file that is not a graph the database takes (a cycle, named; a
//! ref twice; an unknown ref), 3 for an `after` naming the id of a task that does not exist.

use std::io::Read as _;
use std::process::ExitCode;

use crate::config::Config;
use crate::queue::graph::{self, GraphRefusal, MAX_GRAPH_BYTES};

use super::{checked, session, CommandError};

/// Insert the graph of `file` (`-`: standard input) and print each task's ref and id, one
/// per line in the order inserted (parents first), or one JSON array with `json`.
pub(super) async fn graph(
    config: &Config,
    file: &str,
    json: bool,
) -> Result<ExitCode, CommandError> {
    let text = read(file)?;
    // Judged here first, so that a file that is not JSON says where, before a connection.
    if let Err(err) = serde_json::from_str::<serde::de::IgnoredAny>(&text) {
        return Err(CommandError::Usage(format!("{file} is not JSON: {err}")));
    }
    if let Some(unknown) = graph::unknown_key(&text) {
        return Err(CommandError::Usage(format!("{file}: {unknown}")));
    }
    let client = session(config).await?;
    let inserted = match checked(&client, graph::enqueue_graph(&client, &text)).await {
        Ok(inserted) => inserted,
        Err(CommandError::Db(err)) => {
            return Err(match graph::refusal(&err) {
                Some(GraphRefusal::Invalid(message)) => CommandError::Usage(message),
                Some(GraphRefusal::UnknownParent(message)) => CommandError::NoSuchParent(message),
                None => CommandError::Db(err),
            })
        }
        Err(other) => return Err(other),
    };
    if json {
        println!("{}", serde_json::to_string(&inserted)?);
    } else {
        for task in &inserted {
            println!("{}\t{}", task.name, task.id);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The file's text, at most [`MAX_GRAPH_BYTES`].
fn read(file: &str) -> Result<String, CommandError> {
    let input = |source: std::io::Error| CommandError::Input {
        what: file.to_string(),
        source,
    };
    let mut bytes = Vec::new();
    let limit = MAX_GRAPH_BYTES as u64 + 1;
    if file == "-" {
        std::io::stdin()
            .take(limit)
            .read_to_end(&mut bytes)
            .map_err(input)?;
    } else {
        std::fs::File::open(file)
            .map_err(input)?
            .take(limit)
            .read_to_end(&mut bytes)
            .map_err(input)?;
    }
    if bytes.len() > MAX_GRAPH_BYTES {
        return Err(CommandError::Usage(format!(
            "{file}: a graph takes at most {MAX_GRAPH_BYTES} bytes"
        )));
    }
    String::from_utf8(bytes).map_err(|err| {
        CommandError::Usage(format!(
            "{file} is not UTF-8 (byte {})",
            err.utf8_error().valid_up_to()
        ))
    })
}
