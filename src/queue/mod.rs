//! The task table's operations: one SQL statement per function, the SQL next to it.
//!
//! Every status change here is guarded by the status and claim it expects (docs/design.md,
//! "States"), so that no stale actor can overwrite a newer state:
//!
//! | file | owns |
//! | --- | --- |
//! | [`mod@enqueue`] | inserting a task, with the tasks it waits for |
//! | [`mod@batches`] | batches: opening, sealing and reading one; what the database refuses of a member |
//! | [`mod@graph`] | inserting a graph of tasks named by refs, parents first, in one transaction |
//! | [`mod@enqueue_file`] | inserting a task whose payload is a file, streamed, never held whole |
//! | [`mod@claim`] | QUEUED -> RUNNING, in batches, one winner per task (a WAITING task is never claimed) |
//! | [`mod@finish`] | RUNNING -> SUCCEEDED / FAILED / CANCELED, fenced by the claim token; release back to QUEUED |
//! | [`mod@cancel`] | `pgtaskd.cancel(id)` |
//! | [`mod@rescue`] | RUNNING with an expired lease -> QUEUED / FAILED / CANCELED |
//! | [`mod@park`] | results a stopping daemon could not write for a row lock, parked; written by rescuers |
//! | [`mod@prune`] | deleting old finished rows (retention) |
//! | [`mod@daemons`] | each daemon's row in `pgtaskd.daemons`: its queues, version and heartbeat |
//! | [`mod@idle`] | the daemon's idle flag, which the insert trigger reads before it notifies |
//! | [`mod@progress`] | a handler's progress reports written, batched and fenced by their claims; the claim a report names |
//! | [`mod@heartbeat`] | extending the leases of running tasks, reading their cancel requests |
//! | [`mod@task`] | the row as clients see it, and reading it |
//! | [`mod@pause`] | pausing and resuming a queue |
//! | [`mod@retry`] | FAILED / CANCELED -> QUEUED, as if new; a queue's FAILED tasks, a batch at a time |
//! | [`mod@list`] | the latest tasks, newest first, a page at a time |
//! | [`mod@settings`] | a queue's limits and defaults (`pgtaskd.queue_settings`, `pgtaskd.set_queue`) |
//! | [`mod@stats`] | per-queue figures from indexes and bounded ranges; the daemons connected |
//! | [`mod@wait`] | waiting until tasks end: LISTEN `pgtaskd_done`, read, re-read on each hint and poll tick |
//! | [`mod@vacuum`] | the table's bloat and the oldest xmin horizon holding back its vacuum |

pub mod batches;
pub mod cancel;
pub mod claim;
pub mod daemons;
pub mod enqueue;
pub mod enqueue_file;
pub mod finish;
pub mod graph;
pub mod heartbeat;
pub mod idle;
pub mod list;
pub mod park;
pub mod pause;
pub mod progress;
pub mod prune;
pub mod rescue;
pub mod retry;
pub mod settings;
pub mod stats;
pub mod task;
pub mod vacuum;
pub mod wait;

pub use cancel::{cancel, cancel_requested, CancelOutcome};
pub use claim::{
    claim, claim_after, claim_within, held_by, lease_key, ClaimBatch, ClaimLimits, Claimed,
    Payload, Position, Told,
};
pub use enqueue::{enqueue, Enqueued, NewTask, OnDepFailure, RunAt};
pub use enqueue_file::{enqueue_file, FileEnqueueError};
pub use finish::{
    finish, finish_many, log_failed_end, release, reread, ClaimState, Finish, FinishError, Outcome,
};
pub use heartbeat::{extend_one, heartbeat, Beat, Extended};
pub use idle::{clear_idle, flag_idle, remove_idle, settled};
pub use list::{list, page, ListFilter, Listed, Page};
pub use park::{park, write_parked, Unparked};
pub use pause::{pause, paused_since, resume};
pub use prune::prune;
pub use rescue::{notify_tasks, rescue, Rescued};
pub use retry::{
    failed_count, queue_known, retry, retry_failed, RetriedBatch, RetryOutcome, RETRY_FAILED_BATCH,
};
pub use stats::{
    backlog, finished_per_minute, stats, Backlog, Daemon, Finished, QueueStats, Stats,
};
pub use task::{get, get_many, JsonText, Task, TaskStatus};
pub use vacuum::{vacuum_health, Horizon, HorizonKind, VacuumHealth};
