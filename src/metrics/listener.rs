//! The listener's metric: how often the dedicated LISTEN connection (`src/db/listen.rs`) was
//! re-established, counted by the daemon's listener events (`src/daemon.rs`).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;

pub(super) struct ListenerMetrics {
    reconnects: Counter,
}

impl ListenerMetrics {
    pub(super) fn register(registry: &mut Registry) -> ListenerMetrics {
        let reconnects = Counter::default();
        registry.register(
            "listener_reconnects",
            "Times the LISTEN connection was re-established",
            reconnects.clone(),
        );
        ListenerMetrics { reconnects }
    }

    pub(super) fn reconnected(&self) {
        self.reconnects.inc();
    }
}
