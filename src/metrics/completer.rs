//! The completer's metrics: finishes whose commit outcome was unknown (the connection lost
//! between COMMIT and its answer) and that `src/completer/resolve.rs` settled by re-reading
//! the row; results held because the server refused their finish for want of room (a
//! full disk), which `/readyz` also reports; and every write (a finish, a heartbeat) refused
//! so, which the rescuer watches.

use std::sync::{Mutex, PoisonError};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

pub(super) struct CompleterMetrics {
    unknown_commits: Counter,
    held_for_room: Gauge,
    refused_for_room: Counter,
    /// The server's words for the last refusal, while results are held for room.
    room_refusal: Mutex<Option<String>>,
}

impl CompleterMetrics {
    pub(super) fn register(registry: &mut Registry) -> CompleterMetrics {
        let unknown_commits = Counter::default();
        registry.register(
            "unknown_commit_resolutions",
            "Finishes whose commit outcome was unknown and was resolved by re-reading the row",
            unknown_commits.clone(),
        );
        let held_for_room = Gauge::default();
        registry.register(
            "results_held_for_room",
            "Results held because the database refused their finish for want of room (a full disk, SQLSTATE class 53)",
            held_for_room.clone(),
        );
        let refused_for_room = Counter::default();
        registry.register(
            "writes_refused_for_room",
            "Finishes and heartbeats the database refused for want of room (a full disk, SQLSTATE class 53)",
            refused_for_room.clone(),
        );
        CompleterMetrics {
            unknown_commits,
            held_for_room,
            refused_for_room,
            room_refusal: Mutex::new(None),
        }
    }

    pub(super) fn held_for_room(&self, refusal: &str) {
        *self
            .room_refusal
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(refusal.to_string());
        self.held_for_room.inc();
    }

    pub(super) fn refused_for_room(&self) {
        self.refused_for_room.inc();
    }

    pub(super) fn refused_for_room_count(&self) -> u64 {
        self.refused_for_room.get()
    }

    pub(super) fn held_for_room_count(&self) -> i64 {
        self.held_for_room.get()
    }

    pub(super) fn room_again(&self) {
        self.held_for_room.dec();
    }

    pub(super) fn room_refusal(&self) -> Option<String> {
        if self.held_for_room.get() <= 0 {
            return None;
        }
        self.room_refusal
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub(super) fn unknown_commit_resolved(&self) {
        self.unknown_commits.inc();
    }
}

#[cfg(test)]
mod tests {
    use crate::metrics::Metrics;

    #[test]
    fn readiness_hears_of_held_results_until_the_last_is_settled() {
        let metrics = Metrics::new();
        assert_eq!(metrics.room_refusal(), None);
        metrics.held_for_room("could not extend file: No space left on device");
        metrics.held_for_room("could not extend file \"base/1/2\": No space left on device");
        assert!(metrics.encode().contains("pgtaskd_results_held_for_room 2"));
        metrics.room_again();
        assert_eq!(
            metrics.room_refusal().as_deref(),
            Some("could not extend file \"base/1/2\": No space left on device")
        );
        metrics.room_again();
        assert_eq!(metrics.room_refusal(), None);
    }
}
