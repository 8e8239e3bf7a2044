//! The soak's figures, computed from the samples and the finished rows once the run is over:
//! each period's, the last period against the first, and what the held snapshot did. Pure.

use std::time::Duration;

use super::producer::INSERT_TICK;
use super::sampler::{Finished, Sample};
use super::SOAK_RETENTION;
use crate::bench::report::{nearest_rank, Hold, Period, Summary};

/// The window over which recovery after a hold is judged.
const RECOVERY_WINDOW: Duration = Duration::from_secs(10);

/// Within how much of the before-the-hold figure p99 and backlog count as recovered.
const RECOVERED: f64 = 1.10;

/// Latencies of the tasks that finished in whole seconds `[from, to)`.
fn latencies(finished: &Finished, from: f64, to: f64) -> Vec<f64> {
    let (from, to) = (from.max(0.0) as usize, (to.max(0.0).ceil() as usize));
    finished
        .by_second
        .iter()
        .take(to)
        .skip(from)
        .flatten()
        .map(|&ms| f64::from(ms))
        .collect()
}

/// The nearest-rank percentile `q` of `values`, sorting them.
fn percentile(values: &mut [f64], q: f64) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    nearest_rank(values, q)
}

pub(super) fn periods(
    samples: &[Sample],
    finished: &Finished,
    duration: Duration,
    period: Duration,
    hold: Option<(f64, f64)>,
) -> Vec<Period> {
    let (total, step) = (duration.as_secs_f64(), period.as_secs_f64());
    let count = (total / step).ceil() as usize;
    let mut out = Vec::with_capacity(count);
    let mut autovacuums_before = samples.first().map_or(0, |s| s.autovacuums);
    let mut inserted_before = 0;
    for i in 0..count {
        let (start, end) = (i as f64 * step, ((i + 1) as f64 * step).min(total));
        let span = end - start;
        let within: Vec<&Sample> = samples
            .iter()
            .filter(|s| s.at_s >= start && s.at_s < end + 0.5 * step.min(1.0))
            .collect();
        let Some(last) = within.last().copied().or_else(|| samples.last()) else {
            continue;
        };
        let mut millis = latencies(finished, start, end);
        let done = millis.len();
        let backlog = if within.is_empty() {
            last.backlog as f64
        } else {
            within.iter().map(|s| s.backlog as f64).sum::<f64>() / within.len() as f64
        };
        out.push(Period {
            end_s: end,
            tasks_per_s: done as f64 / span,
            inserted_per_s: last.inserted.saturating_sub(inserted_before) as f64 / span,
            p50_ms: percentile(&mut millis, 0.50),
            p99_ms: percentile(&mut millis, 0.99),
            table_mib: last.table_mib,
            toast_mib: last.toast_mib,
            index_mib: last.index_mib,
            total_mib: last.table_mib + last.index_mib,
            dead_tuples: last.dead_tuples,
            autovacuums: last.autovacuums - autovacuums_before,
            backlog,
            backlog_max: within
                .iter()
                .map(|s| s.backlog)
                .max()
                .unwrap_or(last.backlog),
            held: hold.is_some_and(|(from, to)| from < end && to > start),
        });
        autovacuums_before = last.autovacuums;
        inserted_before = last.inserted;
    }
    out
}

pub(super) fn summary(periods: &[Period]) -> Summary {
    let ratio = |last: Option<f64>, first: Option<f64>| match (last, first) {
        (Some(last), Some(first)) if first > 0.0 && periods.len() > 1 => Some(last / first),
        _ => None,
    };
    let (first, last) = (periods.first(), periods.last());
    let steady = periods
        .iter()
        .find(|p| p.end_s >= 2.0 * SOAK_RETENTION.as_secs_f64());
    let total_mib_end = last.map_or(0.0, |p| p.total_mib);
    let growth = match (steady, last) {
        (Some(steady), Some(last)) if last.end_s > steady.end_s => {
            Some((last.total_mib - steady.total_mib) / (last.end_s - steady.end_s) * 60.0)
        }
        _ => None,
    };
    Summary {
        tasks_per_s_last_over_first: ratio(
            last.map(|p| p.tasks_per_s),
            first.map(|p| p.tasks_per_s),
        ),
        p99_last_over_first: ratio(last.and_then(|p| p.p99_ms), first.and_then(|p| p.p99_ms)),
        steady_from_s: steady.map(|p| p.end_s),
        total_mib_steady: steady.map(|p| p.total_mib),
        total_mib_end,
        growth_mib_per_min: growth,
    }
}

/// The hold's figures: before it (the [`RECOVERY_WINDOW`] before it began), the worst from its
/// start until recovery (or the end of the run), and the time to recover.
pub(super) fn hold_figures(
    samples: &[Sample],
    finished: &Finished,
    (start, end): (f64, f64),
    duration: Duration,
    rate: f64,
) -> Hold {
    let window = RECOVERY_WINDOW.as_secs_f64();
    let in_span = |from: f64, to: f64| {
        samples
            .iter()
            .filter(move |s| s.at_s >= from && s.at_s < to)
    };
    let mean_backlog = |from: f64, to: f64| {
        let (sum, n) =
            in_span(from, to).fold((0.0, 0usize), |(sum, n), s| (sum + s.backlog as f64, n + 1));
        (n > 0).then(|| sum / n as f64)
    };
    let before_from = (start - window).max(0.0);
    let p99_before = percentile(&mut latencies(finished, before_from, start), 0.99);
    let backlog_before = mean_backlog(before_from, start).unwrap_or(0.0);
    let before = in_span(0.0, start).next_back().copied();
    // Within 10%, or within one insert statement's rows for a backlog near zero.
    let backlog_limit =
        (backlog_before * RECOVERED).max(backlog_before + rate * INSERT_TICK.as_secs_f64());
    let mut recovered = None;
    let mut t = end;
    while t + window <= duration.as_secs_f64() + 1e-9 {
        let p99 = percentile(&mut latencies(finished, t, t + window), 0.99);
        let p99_ok = match (p99, p99_before) {
            (Some(now), Some(before)) => now <= before * RECOVERED,
            _ => false,
        };
        let backlog_ok = mean_backlog(t, t + window).is_some_and(|b| b <= backlog_limit);
        if p99_ok && backlog_ok {
            recovered = Some(t + window - end);
            break;
        }
        t += 1.0;
    }
    let worst_to = recovered.map_or(duration.as_secs_f64(), |r| end + r);
    let mut worst_p99 = None;
    let mut s = start;
    while s < worst_to {
        let p99 = percentile(
            &mut latencies(finished, s, (s + window).min(worst_to)),
            0.99,
        );
        worst_p99 = match (worst_p99, p99) {
            (Some(a), Some(b)) => Some(f64::max(a, b)),
            (a, b) => a.or(b),
        };
        s += window;
    }
    let worst: Vec<&Sample> = in_span(start, worst_to + 1.0).collect();
    Hold {
        start_s: start,
        end_s: end,
        p99_before_ms: p99_before,
        backlog_before,
        dead_tuples_before: before.map_or(0, |s| s.dead_tuples),
        total_mib_before: before.map_or(0.0, |s| s.table_mib + s.index_mib),
        p99_worst_ms: worst_p99,
        backlog_worst: worst.iter().map(|s| s.backlog).max().unwrap_or(0),
        dead_tuples_worst: worst.iter().map(|s| s.dead_tuples).max().unwrap_or(0),
        total_mib_worst: worst
            .iter()
            .map(|s| s.table_mib + s.index_mib)
            .fold(0.0, f64::max),
        recovered_after_s: recovered,
    }
}
