//! The completer's metric: finishes whose commit outcome was unknown (the connection lost
//! between COMMIT and its answer) and that `src/completer/resolve.rs` settled by re-reading
//! the row.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;

pub(super) struct CompleterMetrics {
    unknown_commits: Counter,
}

impl CompleterMetrics {
    pub(super) fn register(registry: &mut Registry) -> CompleterMetrics {
        let unknown_commits = Counter::default();
        registry.register(
            "unknown_commit_resolutions",
            "Finishes whose commit outcome was unknown and was resolved by re-reading the row",
            unknown_commits.clone(),
        );
        CompleterMetrics { unknown_commits }
    }

    pub(super) fn unknown_commit_resolved(&self) {
        self.unknown_commits.inc();
    }
}
