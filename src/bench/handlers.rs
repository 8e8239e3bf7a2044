//! `bench --mode drain --handler exec|http`: the same backlog drained again by the queue's
//! handler instead of the analyzer, in the same run, so that the report gives what a handler
//! costs the daemon per task. The `exec` handler is `wc -c` (reads its standard input, prints
//! one line); its floor is the same spawns timed without pgtaskd, `concurrency` at a time. The
//! `http` handler posts to a keep-alive server of the bench's own, answering `ok`. Called by
//! `run.rs` after the analyzer's drain.

use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use tokio_postgres::Client;

use super::daemon::Daemon;
use super::table::{delete_rows, insert, seconds_since, wait_done};
use super::{sql, BenchError};
use crate::config::Config;

/// Which handler drains the backlog the second time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum BenchHandler {
    Exec,
    Http,
}

/// The handler's drain, beside the analyzer's.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HandlerRun {
    pub handler: BenchHandler,
    pub tasks: u32,
    pub seconds: f64,
    pub tasks_per_s: f64,
    /// The analyzer's drain of the same backlog, in the same run, over this one.
    pub analyzer_over_handler: f64,
    pub daemon_cpu_s_per_1000_tasks: f64,
    pub daemon_peak_rss_mib: f64,
    /// exec: the same spawns (`wc -c`, the payload on stdin, `concurrency` at a time) without
    /// pgtaskd: what process start alone allows on this machine.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spawn_floor_tasks_per_s: Option<f64>,
}

/// The exec handler of the run: it reads its standard input and prints one line.
const EXEC_COMMAND: [&str; 2] = ["wc", "-c"];

/// Drain `texts` on `queue` with `handler`, `concurrency` at a time.
pub(super) async fn drain(
    client: &Client,
    config: &Config,
    queue: &str,
    texts: &[String],
    concurrency: usize,
    handler: BenchHandler,
    analyzer_tasks_per_s: f64,
) -> Result<HandlerRun, BenchError> {
    let server = match handler {
        BenchHandler::Http => Some(EchoServer::start().await?),
        BenchHandler::Exec => None,
    };
    let section = match &server {
        None => format!(
            "handler = \"exec\"\ncommand = [\"{}\", \"{}\"]\n",
            EXEC_COMMAND[0], EXEC_COMMAND[1]
        ),
        Some(server) => format!("handler = \"http\"\nurl = \"{}\"\n", server.url),
    };
    let extra = format!(
        "[queues.{}]\n{section}",
        toml::Value::String(queue.to_string())
    );
    delete_rows(client, queue).await?;
    insert(client, queue, texts).await?;
    let started = chrono::Utc::now();
    let daemon = Daemon::start_with(config, queue, concurrency, false, &extra)?;
    let done = wait_done(client, queue, texts.len()).await;
    let usage = daemon.usage();
    daemon.stop().await;
    done?;
    let seconds = seconds_since(client, queue, started).await?;
    let answered: i64 = client
        .query_one(sql::HANDLER_SUCCEEDED, &[&queue])
        .await?
        .get(0);
    delete_rows(client, queue).await?;
    if answered != texts.len() as i64 {
        return Err(BenchError::Session(format!(
            "the {handler:?} handler's drain left {answered} of {} tasks SUCCEEDED with an output",
            texts.len()
        )));
    }
    let n = texts.len() as f64;
    let tasks_per_s = n / seconds;
    let spawn_floor_tasks_per_s = match handler {
        BenchHandler::Exec => Some(spawn_floor(texts, concurrency).await?),
        BenchHandler::Http => None,
    };
    Ok(HandlerRun {
        handler,
        tasks: texts.len() as u32,
        seconds,
        tasks_per_s,
        analyzer_over_handler: analyzer_tasks_per_s / tasks_per_s,
        daemon_cpu_s_per_1000_tasks: usage.cpu_s / n * 1000.0,
        daemon_peak_rss_mib: usage.peak_rss_mib,
        spawn_floor_tasks_per_s,
    })
}

/// Tasks per second of the exec handler's spawns alone: `wc -c` with each text on its
/// standard input, `concurrency` at a time.
async fn spawn_floor(texts: &[String], concurrency: usize) -> Result<f64, BenchError> {
    use tokio::io::AsyncWriteExt;
    let permits = Arc::new(tokio::sync::Semaphore::new(concurrency));
    let mut runs = tokio::task::JoinSet::new();
    let started = Instant::now();
    for text in texts {
        let permit = Arc::clone(&permits)
            .acquire_owned()
            .await
            .expect("never closed");
        let text = text.clone();
        runs.spawn(async move {
            let mut child = tokio::process::Command::new(EXEC_COMMAND[0])
                .arg(EXEC_COMMAND[1])
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .spawn()?;
            let mut stdin = child.stdin.take().expect("piped");
            stdin.write_all(text.as_bytes()).await?;
            drop(stdin);
            child.wait_with_output().await?;
            drop(permit);
            Ok::<_, std::io::Error>(())
        });
        while let Some(done) = runs.try_join_next() {
            spawned(done)?;
        }
    }
    while let Some(done) = runs.join_next().await {
        spawned(done)?;
    }
    Ok(texts.len() as f64 / started.elapsed().as_secs_f64())
}

fn spawned(
    done: Result<Result<(), std::io::Error>, tokio::task::JoinError>,
) -> Result<(), BenchError> {
    match done {
        Ok(Ok(())) => Ok(()),
        Ok(Err(err)) => Err(BenchError::Session(format!(
            "cannot run {}: {err}",
            EXEC_COMMAND.join(" ")
        ))),
        Err(err) => Err(BenchError::Session(err.to_string())),
    }
}

/// A keep-alive HTTP server on loopback that reads each body and answers `ok`.
struct EchoServer {
    url: String,
    _stop: tokio_util::sync::DropGuard,
}

impl EchoServer {
    async fn start() -> Result<EchoServer, BenchError> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|err| BenchError::Session(format!("cannot bind the bench's server: {err}")))?;
        let addr = listener
            .local_addr()
            .map_err(|err| BenchError::Session(err.to_string()))?;
        let app = axum::Router::new().route(
            "/jobs",
            axum::routing::post(|_body: bytes::Bytes| async { "ok" }),
        );
        let stop = tokio_util::sync::CancellationToken::new();
        let cancelled = stop.clone();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async move { cancelled.cancelled().await })
                .await;
        });
        Ok(EchoServer {
            url: format!("http://{addr}/jobs"),
            _stop: stop.drop_guard(),
        })
    }
}
