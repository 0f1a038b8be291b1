//! The operators' reads: runs by a filter, counted or a page at a time, a
//! key's run, and the last minutes' latency. None of them is on a path
//! a run takes; the API and the dashboard send them.

use super::{Db, RunRow};
use crate::ids::RunId;
use crate::status::RunStatus;
use crate::time::Timestamp;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The runs an operator asks for: of one status, of one kind, ended within
/// a range (each `""` or 0: any). A range keeps only finished runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunFilter<'a> {
    /// Only runs of this status (`""`: any).
    pub status: &'a str,
    /// Only runs of this kind (`""`: any).
    pub kind: &'a str,
    /// Only runs that ended at or after this instant (0: no bound).
    pub ended_from_ms: u64,
    /// Only runs that ended before this instant (0: no bound).
    pub ended_to_ms: u64,
}

impl RunFilter<'_> {
    /// Whether run `r` passes.
    #[must_use]
    pub fn matches(&self, r: &RunRow) -> bool {
        let ended = r.finished_at.map(|t| t.0);
        (self.status.is_empty() || r.status.as_str() == self.status)
            && (self.kind.is_empty() || r.kind == self.kind)
            && (self.ended_from_ms == 0 || ended.is_some_and(|t| t >= self.ended_from_ms))
            && (self.ended_to_ms == 0 || ended.is_some_and(|t| t < self.ended_to_ms))
    }
}

/// The succeeded runs of one minute: how many, and the time from their
/// publication to their success at two percentiles.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MinuteLatency {
    /// The minute's first millisecond.
    pub minute: Timestamp,
    /// Runs that succeeded in it.
    pub runs: u64,
    /// The median time from publication to success, in ms.
    pub p50_ms: u64,
    /// The 99th percentile of it, in ms.
    pub p99_ms: u64,
}

impl Db {
    /// [`Statement::ListRuns`](super::Statement::ListRuns): up to `limit`
    /// runs after `after`, by run, that pass `filter`.
    #[must_use]
    pub fn list_runs(&self, filter: &RunFilter<'_>, after: RunId, limit: usize) -> Vec<RunRow> {
        self.runs
            .range((std::ops::Bound::Excluded(after), std::ops::Bound::Unbounded))
            .map(|(_, r)| r)
            .filter(|r| filter.matches(r))
            .take(limit)
            .cloned()
            .collect()
    }

    /// [`Statement::CountMatching`](super::Statement::CountMatching): the
    /// runs that pass `filter`, counted by status.
    #[must_use]
    pub fn count_matching(&self, filter: &RunFilter<'_>) -> Vec<(RunStatus, u64)> {
        super::count_by_status(self.runs.values().filter(|r| filter.matches(r)))
    }

    /// [`Statement::RunOfKey`](super::Statement::RunOfKey): the run
    /// idempotency key `key` names, if it is known.
    #[must_use]
    pub fn run_of_key(&self, key: &str) -> Vec<RunId> {
        self.keys.get(key).map(|k| k.run).into_iter().collect()
    }

    /// [`Statement::LatencyPerMinute`](super::Statement::LatencyPerMinute):
    /// the runs that succeeded after `minutes` minutes ago (and were
    /// published), by minute: Postgres's `percentile_disc`, the first time
    /// whose place in the minute's order reaches the fraction. A run
    /// marked published after it succeeded counts as 0 ms.
    #[must_use]
    pub fn latency_per_minute(&self, minutes: u32) -> Vec<MinuteLatency> {
        let since = i128::from(self.clock.0) - i128::from(minutes) * 60_000;
        let mut by_minute: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
        for r in self.runs.values() {
            if r.status != RunStatus::Succeeded {
                continue;
            }
            let (Some(end), Some(published)) = (r.finished_at, r.published_at) else {
                continue;
            };
            if i128::from(end.0) > since {
                by_minute
                    .entry(end.0 / 60_000 * 60_000)
                    .or_default()
                    .push(end.0.saturating_sub(published.0));
            }
        }
        by_minute
            .into_iter()
            .map(|(minute, mut times)| {
                times.sort_unstable();
                MinuteLatency {
                    minute: Timestamp(minute),
                    runs: times.len() as u64,
                    p50_ms: percentile_disc(&times, 0.5),
                    p99_ms: percentile_disc(&times, 0.99),
                }
            })
            .collect()
    }
}

/// `percentile_disc(fraction)` over `sorted` (not empty), as Postgres
/// computes it: the value at place ⌈fraction × n⌉ (from 1), in doubles.
fn percentile_disc(sorted: &[u64], fraction: f64) -> u64 {
    #[allow(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "as Postgres does it: a row count as a double, its ceiling back as a place"
    )]
    let place = (fraction * sorted.len() as f64).ceil() as usize;
    sorted[place.clamp(1, sorted.len()) - 1]
}
