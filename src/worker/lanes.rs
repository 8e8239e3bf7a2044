//! A daemon's lanes: one [`Worker`] for the queues that run the built-in text analyzer with no
//! section of their own, and one per queue with a `[queues.NAME]` section (an `exec` or
//! `http` handler, its own concurrency). Each lane claims only its own queues, sized by its own
//! intake, so a queue of slow commands never holds claims that its few slots cannot start, and
//! never takes the place of another queue's tasks. The lanes share the instance id (whose key is
//! every claim's `lease_owner`), the pool, the metrics and, when there are several, the
//! `worker.concurrency` permits that cap them all together and what each has claimed of them
//! (`shared.rs`). Each has its own idle flag, keyed `instance/queue`.
//!
//! [`Workers`] is what the daemon drives: every listener event and every stop goes to each lane.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::shared::Shared;
use super::{Withheld, Worker};
use crate::analyzer::Analyzer;
use crate::config::{Config, HandlerConfig, QueueConfig};
use crate::db::Pool;
use crate::handler::http::HttpClient;
use crate::metrics::Metrics;
use crate::progress::Progress;

/// What makes a lane more than the default one.
#[derive(Default)]
pub struct Lane {
    /// Its queue's name; empty for the default lane.
    pub name: String,
    /// Its queue's handler, when not the text analyzer.
    pub handler: Option<LaneHandler>,
    /// The permits and counts every lane shares, when there are several (`shared.rs`).
    pub shared: Option<Arc<Shared>>,
    /// The queues left out of claims, shared by every lane ([`Withheld`]).
    pub withheld: Arc<Withheld>,
}

/// A queue's section, the daemon's HTTP client for an `http` handler, and where its
/// handlers' progress reports go.
pub struct LaneHandler {
    pub queue: QueueConfig,
    pub http: Option<HttpClient>,
    pub progress: Arc<Progress>,
}

/// Every lane of one daemon.
#[derive(Clone)]
pub struct Workers {
    lanes: Vec<Worker>,
    withheld: Arc<Withheld>,
}

impl Workers {
    /// The lanes `config` asks for, claiming for `instance`, their handlers' progress
    /// reports kept in `progress`. Fails only when the HTTP client an `http` handler needs
    /// cannot be built.
    pub fn new(
        config: &Config,
        pool: &Pool,
        analyzer: &Arc<dyn Analyzer>,
        instance: &str,
        metrics: &Arc<Metrics>,
        progress: &Arc<Progress>,
    ) -> Result<Workers, String> {
        let served = &config.worker.queues;
        let sections: Vec<&QueueConfig> = config
            .queues
            .iter()
            .filter(|q| served.contains(&q.name))
            .collect();
        let plain: Vec<String> = served
            .iter()
            .filter(|name| !sections.iter().any(|q| &q.name == *name))
            .cloned()
            .collect();
        let count = sections.len() + usize::from(!plain.is_empty());
        let shared = (count > 1).then(|| Shared::new(config.worker.concurrency));
        // The in-flight byte budget is shared out, so that the daemon's total stays within it.
        let bytes = (config.worker.max_inflight_bytes / count.max(1) as u64).max(1);
        let needs_http = sections
            .iter()
            .any(|q| matches!(q.handler, HandlerConfig::Http(_)));
        let http = if needs_http {
            Some(HttpClient::new()?)
        } else {
            None
        };
        let withheld = Arc::new(Withheld::default());
        let lane = |queues: Vec<String>, concurrency: usize, name: String, handler| {
            let mut lane_config = config.worker.clone();
            lane_config.queues = queues;
            lane_config.concurrency = concurrency;
            lane_config.max_inflight_bytes = bytes;
            Worker::for_lane(
                pool.clone(),
                Arc::clone(analyzer),
                instance.to_string(),
                lane_config,
                Arc::clone(metrics),
                Lane {
                    name,
                    handler,
                    shared: shared.clone(),
                    withheld: Arc::clone(&withheld),
                },
            )
        };
        let mut lanes = Vec::with_capacity(count);
        if !plain.is_empty() {
            lanes.push(lane(plain, config.worker.concurrency, String::new(), None));
        }
        for queue in sections {
            let concurrency = queue
                .concurrency
                .unwrap_or(config.worker.concurrency)
                .min(config.worker.concurrency);
            let handler = match queue.handler {
                HandlerConfig::TextStats => None,
                HandlerConfig::Exec(_) | HandlerConfig::Http(_) => Some(LaneHandler {
                    queue: queue.clone(),
                    http: http.clone(),
                    progress: Arc::clone(progress),
                }),
            };
            tracing::info!(
                queue = %queue.name,
                handler = queue.handler.name(),
                concurrency,
                "queue served by its own lane"
            );
            lanes.push(lane(
                vec![queue.name.clone()],
                concurrency,
                queue.name.clone(),
                handler,
            ));
        }
        Ok(Workers { lanes, withheld })
    }

    /// The queues left out of every lane's claims ([`Withheld`]), for the presence to set.
    pub fn withheld(&self) -> Arc<Withheld> {
        Arc::clone(&self.withheld)
    }

    /// The daemon's instance id, whose key every lane writes as `lease_owner`.
    pub fn instance(&self) -> &str {
        self.lanes[0].instance()
    }

    /// Every lane looks for work now.
    pub fn wake(&self) {
        self.lanes.iter().for_each(Worker::wake);
    }

    /// The listener has a new session: every lane writes its idle flag again.
    pub fn relisten(&self) {
        self.lanes.iter().for_each(Worker::relisten);
    }

    /// A cancel notification: the lane that runs task `id` stops it.
    pub fn cancel_running(&self, id: i64) {
        self.lanes.iter().for_each(|lane| lane.cancel_running(id));
    }

    /// How many tasks the lanes run now, together.
    pub fn running(&self) -> usize {
        self.lanes.iter().map(Worker::running).sum()
    }

    /// Wait until every lane had a claim answered, or completed a scan for work, after this
    /// call: every lane's count is read first, then they are waited for together (one after
    /// the other, each lane's next scan was waited for after the one before it: about a poll
    /// tick per lane, 20 s to ready with 30 lanes).
    pub async fn scanned(&self) {
        let waits = self.lanes.iter().map(|lane| {
            let mut scans = lane.scans();
            let seen = *scans.borrow_and_update();
            async move {
                let _ = scans.wait_for(|n| *n > seen).await;
            }
        });
        futures_util::future::join_all(waits).await;
    }

    /// Run every lane's producer loop until `stop` fires.
    pub async fn run(&self, stop: CancellationToken) {
        futures_util::future::join_all(self.lanes.iter().map(|lane| lane.run(stop.clone()))).await;
    }

    /// Every lane's two-phase stop, at once; the claims left unsettled, together.
    pub async fn shutdown(&self, grace: Duration, hurry: CancellationToken) -> usize {
        futures_util::future::join_all(
            self.lanes
                .iter()
                .map(|lane| lane.shutdown(grace, hurry.clone())),
        )
        .await
        .into_iter()
        .sum()
    }
}
