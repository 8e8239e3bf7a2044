//! The maintenance wing: the periodic services every daemon runs beside its worker, started
//! together by `start` and stopped by one token.
//!
//! | file | owns |
//! | --- | --- |
//! | [`rescuer`] | taking back the tasks of other daemons' expired leases (docs/design.md, "Nothing lost", "Settle before rescuing") |
//! | [`scheduler`] | firing the schedules that are due, with exactly one daemon making each fire |
//! | [`retention`] | deleting finished rows older than `retention.finished_after`, when set |
//! | [`vacuum`] | the daemon's own `VACUUM` of the task table, after retention's deletes or while autovacuum leaves the table alone |
//! | [`presence`] | the daemon's row in `pgtaskd.daemons`: its queues, version and heartbeat; forgetting the long gone |
//! | `vacuum_health` | watching the table's bloat and a held xmin horizon, for `/metrics`, `/readyz` and the log |

pub mod presence;
pub mod rescuer;
pub mod retention;
pub mod scheduler;
pub mod vacuum;
pub(crate) mod vacuum_health;

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::db::{ConnectSettings, Pool};
use crate::health::Health;
use crate::metrics::Metrics;

/// Start every maintenance service of the daemon `instance`; each runs until `stop` fires.
pub(crate) fn start(
    config: &Config,
    pool: &Pool,
    settings: &ConnectSettings,
    instance: &str,
    metrics: &Arc<Metrics>,
    health: &Arc<Health>,
    stop: &CancellationToken,
) {
    tokio::spawn(rescuer::run(
        pool.clone(),
        instance.to_string(),
        config.worker.lease,
        Arc::clone(metrics),
        stop.clone(),
    ));
    tokio::spawn(scheduler::run(pool.clone(), stop.clone()));
    // Rows retention deleted, which the vacuum counts as made dead.
    let pruned = Arc::new(AtomicU64::new(0));
    if let Some(older_than) = config.retention.finished_after {
        tokio::spawn(retention::run(
            pool.clone(),
            older_than,
            Arc::clone(&pruned),
            stop.clone(),
        ));
    }
    tokio::spawn(vacuum::run(
        pool.clone(),
        settings.clone(),
        pruned,
        Arc::clone(metrics),
        stop.clone(),
    ));
    tokio::spawn(vacuum_health::run(
        pool.clone(),
        config.vacuum_health.clone(),
        Arc::clone(metrics),
        Arc::clone(health),
        stop.clone(),
    ));
}
