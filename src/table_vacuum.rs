//! The daemon's own `VACUUM` of `pgtaskd.tasks` (docs/design.md, "Vacuum"): run once the row
//! versions this daemon made dead since its last vacuum reach [`VACUUM_AFTER`], looking every
//! second. Started by [`crate::daemon`]; nothing else vacuums from the daemon.
//!
//! What counts as made dead:
//!
//! - the rows retention deleted ([`crate::retention`] adds them to the shared count), always:
//!   autovacuum visits a database at most once per `autovacuum_naptime`, and between two visits
//!   a busy queue with retention writes a minute of dead rows into new pages;
//! - while autovacuum leaves the table alone (off in the server, or `autovacuum_enabled =
//!   false` on the table; read again every minute), two per claim: the claim's update
//!   leaves the QUEUED version behind, the finish's the RUNNING one. Without a vacuum those
//!   versions stay for good, and the claims' index of QUEUED rows keeps an entry for each, which
//!   every later claim walks past: the claim's cost would grow with every task ever run.
//!
//! Only a role that may vacuum the table does (its owner, the role that ran `pgtaskd migrate`,
//! or the database's owner); a vacuum that ran into `database.statement_timeout` stops these
//! for good (the table is then too large for a vacuum on a pooled session). `SKIP_LOCKED`: a
//! vacuum already running (autovacuum's, another daemon's) makes this one a no-op.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_postgres::error::SqlState;
use tokio_util::sync::CancellationToken;

use crate::db::{DbError, Pool};
use crate::metrics::Metrics;
use crate::queue;

/// Dead row versions after which the daemon vacuums: the table's own autovacuum threshold
/// (sql/0008_autovacuum.sql).
pub const VACUUM_AFTER: u64 = 5000;
/// How often the count is looked at.
const CHECK: Duration = Duration::from_secs(1);
/// How often whether autovacuum covers the table is read again.
const RECHECK: Duration = Duration::from_secs(60);

/// Vacuum whenever due until `stop` fires, or until the daemon may not vacuum the table.
/// `pruned` counts the rows retention deleted since the last vacuum; `metrics` the claims.
pub async fn run(
    pool: Pool,
    pruned: Arc<AtomicU64>,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) {
    let mut vacuum = Vacuum::default();
    let mut claims_at_vacuum = metrics.claims();
    let mut autovacuum_off: Option<(bool, Instant)> = None;
    loop {
        if autovacuum_off.is_none_or(|(_, at)| at.elapsed() >= RECHECK) {
            match read_autovacuum_off(&pool).await {
                Ok(off) => {
                    if autovacuum_off.map(|(was, _)| was) != Some(off) && off {
                        tracing::info!(
                            "autovacuum does not vacuum pgtaskd.tasks: the daemon vacuums it after every {VACUUM_AFTER} row versions its claims and finishes leave behind"
                        );
                    }
                    autovacuum_off = Some((off, Instant::now()));
                }
                Err(err) => {
                    tracing::debug!(error = %err, "cannot read whether autovacuum covers pgtaskd.tasks");
                }
            }
        }
        let seen = pruned.load(Ordering::Relaxed);
        let claims = metrics.claims();
        let by_claims = match autovacuum_off {
            Some((true, _)) => 2 * claims.saturating_sub(claims_at_vacuum),
            _ => 0,
        };
        if seen + by_claims >= VACUUM_AFTER {
            match vacuum.run(&pool).await {
                Some(true) => {
                    pruned.fetch_sub(seen, Ordering::Relaxed);
                    claims_at_vacuum = claims;
                }
                Some(false) => return,
                None => {}
            }
        } else if autovacuum_off.is_some_and(|(off, _)| !off) {
            // Claims count only while autovacuum is off: a later switch starts from now.
            claims_at_vacuum = claims;
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(CHECK) => {}
        }
    }
}

async fn read_autovacuum_off(pool: &Pool) -> Result<bool, DbError> {
    let client = pool.get().await?;
    client.bounded(queue::prune::autovacuum_off(&client)).await
}

/// Whether the daemon may vacuum the table.
#[derive(Default)]
struct Vacuum {
    /// Unknown until first needed; `false` for good once a vacuum was refused or ran into the
    /// statement timeout (a table too large for the daemon to vacuum within it).
    allowed: Option<bool>,
}

impl Vacuum {
    /// Vacuum once: `Some(true)` when it ran, `Some(false)` when the daemon leaves vacuuming
    /// to autovacuum from now on, `None` when it failed and may be tried again.
    async fn run(&mut self, pool: &Pool) -> Option<bool> {
        let outcome = async {
            let client = pool.get().await?;
            if self.allowed.is_none() {
                let allowed = client.bounded(queue::prune::may_vacuum(&client)).await?;
                if !allowed {
                    tracing::info!(
                        "the daemon leaves vacuuming pgtaskd.tasks to autovacuum: this role does not own it"
                    );
                }
                self.allowed = Some(allowed);
            }
            if self.allowed == Some(true) {
                client.bounded(queue::prune::vacuum(&client)).await?;
            }
            Ok::<_, DbError>(self.allowed)
        }
        .await;
        match outcome {
            Ok(allowed) => allowed,
            Err(err) if err.code() == Some(&SqlState::QUERY_CANCELED) => {
                tracing::warn!(error = %err, "the daemon's vacuum of pgtaskd.tasks took longer than database.statement_timeout; leaving it to autovacuum from now on");
                self.allowed = Some(false);
                Some(false)
            }
            Err(err) => {
                tracing::warn!(error = %err, "the daemon could not vacuum pgtaskd.tasks");
                None
            }
        }
    }
}
