//! Progress reports: what a running handler says of its work (`{"percent": 40, "message":
//! "..."}`, and any checkpoint of its own), kept in memory and written to the task's row at
//! most once a second (docs/handlers.md, "Progress").
//!
//! An `exec` handler writes JSON lines to the descriptor `PGTASKD_PROGRESS_FD` names (read by
//! `handler/exec.rs` through a [`Sink`]); an `http` handler posts them to `POST
//! /tasks/{id}/progress` with its `Pgtaskd-Claim` (`http/progress.rs`). Either way a line
//! that passes [`check`] replaces the task's latest in [`Progress`]; a line that does not is
//! dropped with a warning said at most every ten seconds, and never fails the task.
//!
//! The flusher ([`Progress::run`]) writes every latest once a second with one statement for
//! all tasks (`pgtaskd.write_progress`), fenced by each claim's token and passing over rows
//! another transaction holds, so that a write from a claim that is no longer current changes
//! nothing and a flush never waits. Before a claim's finish is handed to the completer, the
//! worker writes that task's latest ([`Progress::flush_task`]), so that the last progress of a
//! failed attempt is the next attempt's checkpoint (`PGTASKD_PROGRESS`, `Pgtaskd-Progress`).
//! Flushes take turns (one lock), so that an older latest is never written after a newer one.
//!
//! Memory is bounded: a line is at most [`MAX_LINE`] bytes, and the latest of at most
//! [`MAX_PENDING`] tasks wait for a flush at once.
//!
//! | file | owns |
//! | --- | --- |
//! | `mod.rs` | the latest per task, the flusher, the claims checked for the HTTP route |
//! | `line.rs` | cutting a stream into bounded lines |
//! | `check.rs` | what a line must be; a JSON text a header can carry |

mod check;
mod line;

pub use check::{ascii_json, check, Refused};
pub use line::{Line, Lines, MAX_LINE};

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::db::{DbError, Pool};
use crate::metrics::Metrics;
use crate::queue::progress::write_progress;
use crate::repeats::{log_failure, log_recovery, Repeats};

/// How often the latest of each task is written: at most once a second per task, plus the
/// write before its finish.
pub const FLUSH_EVERY: Duration = Duration::from_secs(1);

/// The most tasks whose latest waits for a flush at once; a task past them is dropped (and
/// said) until the next flush.
pub const MAX_PENDING: usize = 10_000;

/// How many flushes a latest the database did not take (its row held by another
/// transaction, or its claim not current) is offered to before it is dropped.
const TRIES: u8 = 3;

/// The most rows one flush statement writes.
const FLUSH_ROWS: usize = 500;

/// How long a claim found current by the HTTP route is taken as current without asking the
/// database again. A write is fenced by the database whatever this says.
pub const CLAIM_CHECKED_FOR: Duration = Duration::from_secs(1);

/// The most claims remembered as checked.
const MAX_CHECKED: usize = 10_000;

/// How often dropped lines are said at WARN, with their count since.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// The progress reports of one daemon, waiting for their write.
pub struct Progress {
    pending: Mutex<HashMap<i64, Latest>>,
    /// Held by a flush from its take to its answer: flushes take turns.
    turn: tokio::sync::Mutex<()>,
    /// The tasks whose latest a periodic flush has taken and not yet settled: a finish of one
    /// of them waits for that flush, and no other finish does.
    in_flight: Mutex<HashSet<i64>>,
    /// Claims the HTTP route found current: token -> (task, when checked).
    checked: Mutex<HashMap<i64, (i64, Instant)>>,
    dropped: Mutex<Dropped>,
    failures: Repeats,
    metrics: Arc<Metrics>,
}

/// The latest report of one task.
#[derive(Debug, Clone)]
struct Latest {
    token: i64,
    json: String,
    tries: u8,
}

/// Lines dropped since the log last said so.
#[derive(Debug, Default)]
struct Dropped {
    said_at: Option<Instant>,
    since: u64,
}

impl Progress {
    pub fn new(metrics: Arc<Metrics>) -> Arc<Progress> {
        Arc::new(Progress {
            pending: Mutex::new(HashMap::new()),
            turn: tokio::sync::Mutex::new(()),
            in_flight: Mutex::new(HashSet::new()),
            checked: Mutex::new(HashMap::new()),
            dropped: Mutex::new(Dropped::default()),
            failures: Repeats::new(),
            metrics,
        })
    }

    /// The sink of one `exec` run: the lines of task `id` under claim `token`.
    pub fn sink(self: &Arc<Progress>, id: i64, token: i64) -> Sink {
        Sink {
            progress: Arc::clone(self),
            id,
            token,
            lines: Lines::default(),
            newest: Vec::new(),
        }
    }

    /// `json` (checked) is task `id`'s latest under claim `token`. False when it was dropped:
    /// [`MAX_PENDING`] other tasks wait for the flush.
    pub fn record(&self, id: i64, token: i64, json: String) -> bool {
        let mut pending = self.pending.lock().expect("not poisoned");
        if pending.len() >= MAX_PENDING && !pending.contains_key(&id) {
            drop(pending);
            self.refused(id, "too many tasks wait for the flush", "full");
            return false;
        }
        pending.insert(
            id,
            Latest {
                token,
                json,
                tries: 0,
            },
        );
        self.metrics.progress_reported();
        true
    }

    /// A line of task `id` that was dropped: counted, and said at most every ten seconds.
    pub fn refused(&self, id: i64, why: &str, label: &'static str) {
        self.metrics.progress_dropped(label);
        let now = Instant::now();
        let mut dropped = self.dropped.lock().expect("not poisoned");
        dropped.since += 1;
        let due = dropped
            .said_at
            .is_none_or(|at| now.saturating_duration_since(at) >= WARN_EVERY);
        if due {
            tracing::warn!(
                task = id,
                dropped = dropped.since,
                "progress line dropped: {why} (the task goes on; said at most every 10s)"
            );
            dropped.said_at = Some(now);
            dropped.since = 0;
        }
    }

    /// How many tasks' latest wait for a flush.
    pub fn pending(&self) -> usize {
        self.pending.lock().expect("not poisoned").len()
    }

    /// Whether claim `token` of task `id` was found current less than
    /// [`CLAIM_CHECKED_FOR`] ago.
    pub fn claim_checked(&self, id: i64, token: i64) -> bool {
        let checked = self.checked.lock().expect("not poisoned");
        checked
            .get(&token)
            .is_some_and(|&(task, at)| task == id && at.elapsed() < CLAIM_CHECKED_FOR)
    }

    /// Claim `token` of task `id` was found current now.
    pub fn claim_current(&self, id: i64, token: i64) {
        let mut checked = self.checked.lock().expect("not poisoned");
        if checked.len() >= MAX_CHECKED {
            checked.retain(|_, (_, at)| at.elapsed() < CLAIM_CHECKED_FOR);
        }
        if checked.len() < MAX_CHECKED {
            checked.insert(token, (id, Instant::now()));
        }
    }

    /// Write every task's latest, 500 rows a statement (so that each statement
    /// holds its rows' locks briefly); returns the rows written. Nothing is sent when nothing
    /// waits.
    ///
    /// # Errors
    ///
    /// The database could not be asked: what was taken waits for the next flush.
    pub async fn flush(&self, pool: &Pool) -> Result<usize, DbError> {
        let _turn = self.turn.lock().await;
        // Taken and named in flight under one lock: a `flush_task` that finds its task gone
        // from `pending` and named here knows to wait for this flush to settle it.
        let mut batch: Vec<(i64, Latest)> = {
            let mut pending = self.pending.lock().expect("not poisoned");
            let mut in_flight = self.in_flight.lock().expect("not poisoned");
            in_flight.extend(pending.keys().copied());
            pending.drain().collect()
        };
        let mut count = 0;
        let mut outcome = Ok(());
        while !batch.is_empty() {
            let rest = batch.split_off(batch.len().min(FLUSH_ROWS));
            match self.write(pool, batch).await {
                Ok(written) => count += written,
                Err(err) => {
                    // The database is away: the rest waits for the next flush too.
                    self.put_back(rest);
                    outcome = Err(err);
                    break;
                }
            }
            batch = rest;
        }
        self.in_flight.lock().expect("not poisoned").clear();
        outcome.map(|()| count)
    }

    /// Write task `id`'s latest under claim `token` now, if one waits: called before the
    /// claim's finish, so that the last report of an attempt is kept for the next. A flush
    /// in flight that took it is waited for first: were the finish committed before that
    /// flush's write, the write would find the claim ended (or its row locked, and pass it
    /// over), and the report would be lost. Returns whether a row was written here.
    ///
    /// # Errors
    ///
    /// As [`Progress::flush`].
    pub async fn flush_task(&self, pool: &Pool, id: i64, token: i64) -> Result<bool, DbError> {
        let waits = |pending: &HashMap<i64, Latest>| {
            pending.get(&id).is_some_and(|latest| latest.token == token)
        };
        let waiting = waits(&self.pending.lock().expect("not poisoned"));
        if !waiting && !self.in_flight.lock().expect("not poisoned").contains(&id) {
            return Ok(false);
        }
        let _turn = self.turn.lock().await;
        let latest = {
            let mut pending = self.pending.lock().expect("not poisoned");
            if !waits(&pending) {
                // The flush this waited for wrote it.
                return Ok(false);
            }
            pending.remove(&id).expect("found just now")
        };
        let mut latest = latest;
        // The finish comes next: no later flush would be current.
        latest.tries = TRIES;
        Ok(self.write(pool, vec![(id, latest)]).await? > 0)
    }

    /// Write `batch` in one statement; what the database did not take is offered to the next
    /// flushes while it has tries left. A row the statement refused as a whole (a report the
    /// table's CHECK refuses) makes each row be written alone, the refused ones dropped.
    async fn write(&self, pool: &Pool, batch: Vec<(i64, Latest)>) -> Result<usize, DbError> {
        if batch.is_empty() {
            return Ok(0);
        }
        let session = match pool.get().await {
            Ok(session) => session,
            Err(err) => {
                self.put_back(batch);
                return Err(self.failed(err));
            }
        };
        let ids: Vec<i64> = batch.iter().map(|(id, _)| *id).collect();
        let tokens: Vec<i64> = batch.iter().map(|(_, latest)| latest.token).collect();
        let texts: Vec<&str> = batch.iter().map(|(_, l)| l.json.as_str()).collect();
        let written = session
            .bounded(write_progress(&session, &ids, &tokens, &texts))
            .await;
        self.metrics
            .progress_flushed(written.as_ref().map_or(0, Vec::len));
        match written {
            Ok(written) => {
                log_recovery!(self.failures, "progress written again");
                let count = written.len();
                self.missed(batch, &written);
                Ok(count)
            }
            Err(err) if err.is_transient() => {
                self.put_back(batch);
                Err(self.failed(err))
            }
            Err(err) if batch.len() == 1 => {
                let (id, _) = &batch[0];
                tracing::warn!(task = id, error = %err, code = ?err.code(),
                    "the database refused a progress report; dropped");
                self.metrics.progress_dropped("refused");
                Ok(0)
            }
            Err(err) => {
                tracing::debug!(error = %err, "a flush of progress was refused; writing each alone");
                let mut count = 0;
                for (id, latest) in batch {
                    let (ids, tokens, texts) = ([id], [latest.token], [latest.json.as_str()]);
                    let one = session
                        .bounded(write_progress(&session, &ids, &tokens, &texts))
                        .await;
                    self.metrics
                        .progress_flushed(one.as_ref().map_or(0, Vec::len));
                    match one {
                        Ok(written) => {
                            count += written.len();
                            self.missed(vec![(id, latest)], &written);
                        }
                        Err(err) if err.is_transient() => {
                            self.put_back(vec![(id, latest)]);
                            return Err(self.failed(err));
                        }
                        Err(err) => {
                            tracing::warn!(task = id, error = %err, code = ?err.code(),
                                "the database refused a progress report; dropped");
                            self.metrics.progress_dropped("refused");
                        }
                    }
                }
                Ok(count)
            }
        }
    }

    /// What `written` left out of `batch` is offered again while it has tries left, unless a
    /// newer report came; its claim is checked again by the next post.
    fn missed(&self, batch: Vec<(i64, Latest)>, written: &[i64]) {
        let left: Vec<(i64, Latest)> = batch
            .into_iter()
            .filter(|(id, _)| !written.contains(id))
            .collect();
        if left.is_empty() {
            return;
        }
        {
            let mut checked = self.checked.lock().expect("not poisoned");
            for (_, latest) in &left {
                checked.remove(&latest.token);
            }
        }
        let again = left
            .into_iter()
            .filter_map(|(id, mut latest)| {
                latest.tries += 1;
                if latest.tries < TRIES {
                    return Some((id, latest));
                }
                // Its claim ended or moved on, or the row refused it: counted, not said.
                self.metrics.progress_dropped("unwritten");
                None
            })
            .collect();
        self.put_back(again);
    }

    /// `batch` waits for the next flush again, but for the tasks a newer report came for.
    fn put_back(&self, batch: Vec<(i64, Latest)>) {
        let mut pending = self.pending.lock().expect("not poisoned");
        for (id, latest) in batch {
            if pending.len() < MAX_PENDING {
                pending.entry(id).or_insert(latest);
            }
        }
    }

    fn failed(&self, err: DbError) -> DbError {
        log_failure!(
            self.failures,
            err,
            "progress cannot be written; kept for the next flush"
        );
        err
    }

    /// The flusher: every [`FLUSH_EVERY`], write what waits, until `stop` fires (once the
    /// lanes have stopped: each claim's last report was written before its finish or release,
    /// so nothing left would still be current).
    pub async fn run(self: Arc<Progress>, pool: Pool, stop: CancellationToken) {
        let mut tick = tokio::time::interval(FLUSH_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => break,
                _ = tick.tick() => {}
            }
            // Failures are said by `failed`; what was taken waits for the next tick.
            let _ = self.flush(&pool).await;
        }
    }
}

/// The progress stream of one `exec` run: bytes in, each line checked and recorded as the
/// task's latest, or dropped and said.
pub struct Sink {
    progress: Arc<Progress>,
    id: i64,
    token: i64,
    lines: Lines,
    /// The last whole line of the bytes read at once, at most [`MAX_LINE`] bytes.
    newest: Vec<u8>,
}

impl Sink {
    /// Bytes read from the stream. Of the lines they end, only the last is looked at: the
    /// latest report is what counts, and a handler writing lines as fast as it can costs the
    /// daemon one check per read, not one per line.
    pub fn push(&mut self, bytes: &[u8]) {
        let Sink {
            progress,
            id,
            token,
            lines,
            newest,
        } = self;
        let mut found = false;
        lines.push(bytes, |line| match line {
            Line::Whole(text) => {
                newest.clear();
                newest.extend_from_slice(text);
                found = true;
            }
            Line::TooLong => take(progress, *id, *token, Line::TooLong),
        });
        if found {
            take(progress, *id, *token, Line::Whole(newest));
        }
    }

    /// The stream ended (or is read no more): a last line without its newline counts.
    pub fn finish(&mut self) {
        let Sink {
            progress,
            id,
            token,
            lines,
            ..
        } = self;
        lines.finish(|line| take(progress, *id, *token, line));
    }
}

fn take(progress: &Progress, id: i64, token: i64, line: Line<'_>) {
    let checked = match line {
        Line::Whole(bytes) => check(bytes),
        Line::TooLong => Err(Refused::TooLong),
    };
    match checked {
        Ok(json) => {
            progress.record(id, token, json);
        }
        Err(refused) => progress.refused(id, &refused.to_string(), refused.as_str()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn latest(progress: &Progress, id: i64) -> Option<(i64, String, u8)> {
        let pending = progress.pending.lock().unwrap();
        pending.get(&id).map(|l| (l.token, l.json.clone(), l.tries))
    }

    #[test]
    fn the_latest_report_of_a_task_replaces_the_one_before() {
        let progress = Progress::new(Arc::new(Metrics::new()));
        let mut sink = progress.sink(7, 70);
        sink.push(b"{\"percent\": 1}\n{\"percent\": 2}\n{\"percent\"");
        assert_eq!(
            latest(&progress, 7),
            Some((70, r#"{"percent": 2}"#.into(), 0))
        );
        sink.push(b": 3}");
        sink.finish();
        assert_eq!(
            latest(&progress, 7),
            Some((70, r#"{"percent": 3}"#.into(), 0))
        );
        sink.push(b"{\"percent\": 300}\nnot json\n");
        assert_eq!(
            latest(&progress, 7),
            Some((70, r#"{"percent": 3}"#.into(), 0)),
            "bad lines change nothing"
        );
        assert_eq!(progress.pending(), 1);
    }

    #[test]
    fn at_most_max_pending_tasks_wait_and_a_waiting_one_is_still_replaced() {
        let progress = Progress::new(Arc::new(Metrics::new()));
        for id in 0..MAX_PENDING as i64 {
            assert!(progress.record(id, 1, "{}".into()));
        }
        assert!(!progress.record(-1, 1, "{}".into()), "one task too many");
        assert!(
            progress.record(5, 2, r#"{"a": 1}"#.into()),
            "a waiting task"
        );
        assert_eq!(progress.pending(), MAX_PENDING);
        assert_eq!(latest(&progress, 5), Some((2, r#"{"a": 1}"#.into(), 0)));
    }

    #[test]
    fn a_report_not_written_is_offered_again_twice_unless_a_newer_one_came() {
        let progress = Progress::new(Arc::new(Metrics::new()));
        let take = |progress: &Progress| -> Vec<(i64, Latest)> {
            progress.pending.lock().unwrap().drain().collect()
        };
        progress.record(1, 10, r#"{"n": 1}"#.into());
        progress.record(2, 20, r#"{"n": 2}"#.into());
        progress.claim_current(1, 10);
        assert!(progress.claim_checked(1, 10));
        assert!(!progress.claim_checked(2, 10), "another task's claim");
        // Task 2 written, task 1 not: offered again, its claim to be checked again.
        let batch = take(&progress);
        progress.missed(batch, &[2]);
        assert_eq!(latest(&progress, 1), Some((10, r#"{"n": 1}"#.into(), 1)));
        assert_eq!(latest(&progress, 2), None);
        assert!(!progress.claim_checked(1, 10));
        let batch = take(&progress);
        progress.missed(batch, &[]);
        assert_eq!(latest(&progress, 1).map(|l| l.2), Some(2));
        let batch = take(&progress);
        progress.missed(batch, &[]);
        assert_eq!(latest(&progress, 1), None, "dropped after three flushes");
        // A newer report that came meanwhile is kept, not the older one.
        progress.record(3, 30, r#"{"n": "old"}"#.into());
        let batch = take(&progress);
        progress.record(3, 30, r#"{"n": "new"}"#.into());
        progress.missed(batch, &[]);
        assert_eq!(
            latest(&progress, 3),
            Some((30, r#"{"n": "new"}"#.into(), 0))
        );
    }
}
