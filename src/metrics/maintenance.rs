//! The maintenance wing's metrics (`src/maintenance/`): the rescuer's count of expired leases
//! taken back, and the vacuum health of the task table (docs/design.md, "Vacuum health").
//!
//! The vacuum health is not read at scrape time: the daemon's watch
//! (`src/maintenance/vacuum_health.rs`) reads it every `vacuum_health.check_interval` and
//! sets its gauges here, so a storm of scrapes costs the database nothing for it; the age of
//! that reading is a gauge of its own. The horizon's gauges carry one series, labelled with
//! the kind of what holds it (`none` when nothing does); the holder's pid, name and state are
//! a series of their own only while the horizon is held past the warning threshold, so that
//! the statements that come and go do not make a new series at every reading. No label ever
//! holds query text.

use std::sync::atomic::AtomicU64;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::queue::VacuumHealth;

/// The rescuer's metric (`src/maintenance/rescuer.rs`).
pub(super) struct RescuerMetrics {
    rescued: Counter,
}

impl RescuerMetrics {
    pub(super) fn register(registry: &mut Registry) -> RescuerMetrics {
        let rescued = Counter::default();
        registry.register(
            "lease_rescues",
            "Tasks whose expired lease this daemon's rescuer took back",
            rescued.clone(),
        );
        RescuerMetrics { rescued }
    }

    pub(super) fn rescued(&self, n: usize) {
        self.rescued.inc_by(n as u64);
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TupleLabel {
    state: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PartLabel {
    part: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ByLabel {
    by: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: &'static str,
}

/// What holds the horizon: a session's pid, `application_name` and state, a slot's name (and
/// the pid using it); empty when not known. Never query text.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HolderLabel {
    kind: &'static str,
    pid: String,
    name: String,
    state: String,
}

/// The vacuum-health watch's gauges (`src/maintenance/vacuum_health.rs`).
pub(super) struct VacuumHealthMetrics {
    table_tuples: Family<TupleLabel, Gauge>,
    table_bytes: Family<PartLabel, Gauge>,
    table_vacuum_age: Family<ByLabel, Gauge<f64, AtomicU64>>,
    table_vacuum_count: Family<ByLabel, Gauge>,
    horizon_age_s: Family<KindLabel, Gauge<f64, AtomicU64>>,
    horizon_age_xids: Family<KindLabel, Gauge>,
    horizon_held: Gauge,
    horizon_holder: Family<HolderLabel, Gauge>,
    reading_age: Gauge<f64, AtomicU64>,
    /// When the vacuum health was last read; held (with the lock) while its families are
    /// cleared and set, and while encoding, so that a scrape never sees them half set.
    read_at: Mutex<Option<Instant>>,
}

impl VacuumHealthMetrics {
    pub(super) fn register(registry: &mut Registry) -> VacuumHealthMetrics {
        let table_tuples = Family::<TupleLabel, Gauge>::default();
        registry.register(
            "table_tuples",
            "Live and dead tuples of pgtaskd.task_state (the statistics system's estimates)",
            table_tuples.clone(),
        );
        let table_bytes = Family::<PartLabel, Gauge>::default();
        registry.register(
            "table_bytes",
            "Size of pgtaskd.task_state: heap, TOAST (table and index) and indexes",
            table_bytes.clone(),
        );
        let table_vacuum_age = Family::<ByLabel, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "table_vacuum_age_seconds",
            "Seconds since the last vacuum of pgtaskd.task_state, by autovacuum or by a VACUUM \
             command (no series: none since the statistics were reset)",
            table_vacuum_age.clone(),
        );
        let table_vacuum_count = Family::<ByLabel, Gauge>::default();
        registry.register(
            "table_vacuum_count",
            "Vacuums of pgtaskd.task_state since the statistics were reset, by autovacuum or by a \
             VACUUM command",
            table_vacuum_count.clone(),
        );
        let horizon_age_s = Family::<KindLabel, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "xmin_horizon_age_seconds",
            "How long the oldest xmin horizon holding back vacuum of pgtaskd.task_state has been \
             held; kind: session, prepared_transaction, replication_slot, or none (0)",
            horizon_age_s.clone(),
        );
        let horizon_age_xids = Family::<KindLabel, Gauge>::default();
        registry.register(
            "xmin_horizon_age_transactions",
            "Transaction ids assigned since the oldest xmin horizon; kind as for its age",
            horizon_age_xids.clone(),
        );
        let horizon_held = Gauge::default();
        registry.register(
            "xmin_horizon_held",
            "1 while the xmin horizon is held back longer than health.xmin_horizon_warning",
            horizon_held.clone(),
        );
        let horizon_holder = Family::<HolderLabel, Gauge>::default();
        registry.register(
            "xmin_horizon_holder",
            "1 for what holds the xmin horizon back longer than health.xmin_horizon_warning: \
             kind, the session's pid, application_name and state, or the slot's name",
            horizon_holder.clone(),
        );
        let reading_age = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "vacuum_health_reading_age_seconds",
            "Seconds since the table and horizon figures were read (every \
             health.check_interval); NaN before the first reading",
            reading_age.clone(),
        );
        reading_age.set(f64::NAN);
        VacuumHealthMetrics {
            table_tuples,
            table_bytes,
            table_vacuum_age,
            table_vacuum_count,
            horizon_age_s,
            horizon_age_xids,
            horizon_held,
            horizon_holder,
            reading_age,
            read_at: Mutex::new(None),
        }
    }

    /// Set the gauges from one reading: `horizon_age_s` is the horizon's age as the watch
    /// settled it (the server's, or its own estimate), `held` whether that is past the warning
    /// threshold.
    pub(super) fn observe(&self, health: &VacuumHealth, horizon_age_s: f64, held: bool) {
        let mut read_at = self.read_at.lock().unwrap_or_else(PoisonError::into_inner);
        *read_at = Some(Instant::now());
        for (state, n) in [("live", health.live_tuples), ("dead", health.dead_tuples)] {
            self.table_tuples
                .get_or_create(&TupleLabel { state })
                .set(n);
        }
        for (part, n) in [
            ("heap", health.table_bytes),
            ("toast", health.toast_bytes),
            ("indexes", health.index_bytes),
        ] {
            self.table_bytes.get_or_create(&PartLabel { part }).set(n);
        }
        for (by, age, count) in [
            ("vacuum", health.vacuum_age_s, health.vacuum_count),
            (
                "autovacuum",
                health.autovacuum_age_s,
                health.autovacuum_count,
            ),
        ] {
            match age {
                Some(age) => {
                    self.table_vacuum_age
                        .get_or_create(&ByLabel { by })
                        .set(age.max(0.0));
                }
                None => {
                    self.table_vacuum_age.remove(&ByLabel { by });
                }
            }
            self.table_vacuum_count
                .get_or_create(&ByLabel { by })
                .set(count);
        }
        let kind = health.horizon.as_ref().map_or("none", |h| h.kind.as_str());
        self.horizon_age_s.clear();
        self.horizon_age_xids.clear();
        self.horizon_holder.clear();
        self.horizon_age_s
            .get_or_create(&KindLabel { kind })
            .set(horizon_age_s.max(0.0));
        self.horizon_age_xids
            .get_or_create(&KindLabel { kind })
            .set(health.horizon.as_ref().map_or(0, |h| h.age_xids));
        self.horizon_held.set(i64::from(held));
        if let Some(horizon) = health.horizon.as_ref().filter(|_| held) {
            self.horizon_holder
                .get_or_create(&HolderLabel {
                    kind,
                    pid: horizon.pid.map(|p| p.to_string()).unwrap_or_default(),
                    name: horizon.name.clone().unwrap_or_default(),
                    state: horizon.state.clone().unwrap_or_default(),
                })
                .set(1);
        }
    }

    /// Set the reading's age and hold the reading's lock: the caller encodes while holding
    /// the returned guard, so that a reading is never encoded half set.
    pub(super) fn for_scrape(&self) -> MutexGuard<'_, Option<Instant>> {
        let read_at = self.read_at.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(at) = *read_at {
            self.reading_age.set(at.elapsed().as_secs_f64());
        }
        read_at
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;

    #[test]
    fn the_vacuum_gauges_show_one_horizon_and_its_holder_only_while_held() {
        use crate::queue::{Horizon, HorizonKind};
        let metrics = Metrics::new();
        assert!(metrics
            .encode()
            .contains("pgtaskd_vacuum_health_reading_age_seconds NaN"));
        let mut health = VacuumHealth {
            live_tuples: 10,
            dead_tuples: 90,
            vacuum_age_s: None,
            autovacuum_age_s: Some(12.5),
            vacuum_count: 0,
            autovacuum_count: 3,
            table_bytes: 8192,
            toast_bytes: 16384,
            index_bytes: 40960,
            horizon: Some(Horizon {
                kind: HorizonKind::Session,
                xid: 700,
                age_xids: 42,
                age_s: Some(400.0),
                pid: Some(4711),
                name: Some("analyst \"q\"".into()),
                state: Some("idle in transaction".into()),
            }),
            sees_all_sessions: true,
        };
        metrics.observe_vacuum(&health, 400.0, true);
        let text = metrics.encode();
        for line in [
            "pgtaskd_table_tuples{state=\"live\"} 10",
            "pgtaskd_table_tuples{state=\"dead\"} 90",
            "pgtaskd_table_bytes{part=\"heap\"} 8192",
            "pgtaskd_table_bytes{part=\"toast\"} 16384",
            "pgtaskd_table_bytes{part=\"indexes\"} 40960",
            "pgtaskd_table_vacuum_age_seconds{by=\"autovacuum\"} 12.5",
            "pgtaskd_table_vacuum_count{by=\"vacuum\"} 0",
            "pgtaskd_table_vacuum_count{by=\"autovacuum\"} 3",
            "pgtaskd_xmin_horizon_age_seconds{kind=\"session\"} 400.0",
            "pgtaskd_xmin_horizon_age_transactions{kind=\"session\"} 42",
            "pgtaskd_xmin_horizon_held 1",
            "pgtaskd_xmin_horizon_holder{kind=\"session\",pid=\"4711\",name=\"analyst \\\"q\\\"\",state=\"idle in transaction\"} 1",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
        assert!(
            !text.contains("by=\"vacuum\"} 0.0"),
            "never vacuumed: no series"
        );
        health.horizon = None;
        health.vacuum_age_s = Some(1.0);
        metrics.observe_vacuum(&health, 0.0, false);
        let text = metrics.encode();
        for line in [
            "pgtaskd_xmin_horizon_age_seconds{kind=\"none\"} 0.0",
            "pgtaskd_xmin_horizon_age_transactions{kind=\"none\"} 0",
            "pgtaskd_xmin_horizon_held 0",
            "pgtaskd_table_vacuum_age_seconds{by=\"vacuum\"} 1.0",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
        assert!(!text.contains("kind=\"session\""), "{text}");
        assert!(!text.contains("pgtaskd_xmin_horizon_holder{"), "{text}");
        assert!(!text.contains("reading_age_seconds NaN"), "{text}");
    }
}
