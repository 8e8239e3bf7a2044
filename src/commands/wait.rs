//! `pgtaskd wait`, and the waiting half of `enqueue --wait`: a session that LISTENs for
//! completions, then waits for the tasks to end (docs/design.md, "Completion notifications").
//! Called by `dispatch` and by `task.rs`.

use std::process::ExitCode;

use crate::cli::WaitArgs;
use crate::config::Config;
use crate::db::migrate;
use crate::db::{ConnectSettings, DbError};
use crate::queue::{self, TaskStatus};

use super::{checked, describe_task, CommandError};

/// Wait for the tasks `args` names; the exit code is the one `Waiter::wait` says.
pub(super) async fn wait(config: &Config, args: &WaitArgs) -> Result<ExitCode, CommandError> {
    let mut waiter = Waiter::open(config).await?;
    waiter
        .wait(config, &args.ids, args.timeout, args.json)
        .await
}

/// A session that LISTENs on `pgtaskd_done`, for `wait` and `enqueue --wait`.
pub(super) struct Waiter {
    pub(super) client: tokio_postgres::Client,
    messages: tokio::sync::mpsc::Receiver<tokio_postgres::AsyncMessage>,
    _driver: tokio::task::JoinHandle<()>,
}

/// Notifications a waiting command holds unread; past this they are dropped (they are hints).
const WAIT_MESSAGES: usize = 1024;

impl Waiter {
    /// Connect, check the schema as every one-shot command does, and LISTEN, before any row
    /// is read (docs/design.md, "Completion notifications"). The session is opened with
    /// `database.listen_url`: LISTEN needs PostgreSQL itself, not a transaction pooler.
    pub(super) async fn open(config: &Config) -> Result<Waiter, CommandError> {
        let settings = ConnectSettings::listen(&config.database, "cli")?;
        let (sender, messages) = tokio::sync::mpsc::channel(WAIT_MESSAGES);
        let (client, driver) = settings.open(Some(sender)).await?;
        migrate::check(&client).await?;
        let listen = format!("LISTEN {}", crate::db::listen::DONE_CHANNEL);
        checked(&client, async {
            client.batch_execute(&listen).await.map_err(DbError::from)
        })
        .await?;
        Ok(Waiter {
            client,
            messages,
            _driver: driver,
        })
    }

    /// Wait for `ids`, print them as `status` does, and say how it ended: 0 all SUCCEEDED,
    /// 1 any FAILED or CANCELED, 3 an unknown id, 75 the timeout.
    pub(super) async fn wait(
        &mut self,
        config: &Config,
        ids: &[i64],
        timeout: Option<std::time::Duration>,
        json: bool,
    ) -> Result<ExitCode, CommandError> {
        let deadline = timeout.map(|timeout| tokio::time::Instant::now() + timeout);
        let waited = checked(
            &self.client,
            queue::wait::until_terminal(
                &self.client,
                &mut self.messages,
                ids,
                config.worker.poll_interval,
                deadline,
            ),
        )
        .await?;
        if let Some(&id) = waited.missing.first() {
            return Err(CommandError::NotFound(id));
        }
        for task in &waited.tasks {
            if json {
                println!("{}", serde_json::to_string(task)?);
            } else {
                print!("{}", describe_task(task));
            }
        }
        let tasks = waited.tasks.len();
        if waited.timed_out {
            let pending = waited
                .tasks
                .iter()
                .filter(|task| !task.status.is_terminal())
                .count();
            return Err(CommandError::TimedOut { pending, tasks });
        }
        let failed = waited
            .tasks
            .iter()
            .filter(|task| task.status != TaskStatus::Succeeded)
            .count();
        if failed > 0 {
            return Err(CommandError::NotSucceeded { failed, tasks });
        }
        Ok(ExitCode::SUCCESS)
    }
}
