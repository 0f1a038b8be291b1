//! Prometheus metrics: the queue's state (observed from Redis and Postgres
//! when scraped) and the worker's counters (observed by [`MetricsProbe`]).
//!
//! The series, their labels and what they mean: docs/OPERATIONS.md#metrics.

use super::pg::PgDb;
use super::redis::RedisStream;
use crate::driver::{Probe, RoleId};
use metrics::{Counter, Gauge, Histogram};
use pelican_model::db::query;
use pelican_model::ids::{EntryId, WorkerId};
use pelican_model::protocol::{
    AckReason, DeliveryEnd, Input, MaintenanceTask, PassReport, PendingReason, StreamOp,
    StreamReply,
};
use pelican_model::status::{ErrorClass, JobOutcome, RunStatus};
use pelican_model::time::Timestamp;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Updates the queue gauges from Redis and Postgres (on scrape).
pub async fn observe_queue(stream: &RedisStream, db: &PgDb) {
    let queue = StreamOp::Queue {
        now: Timestamp::ZERO,
    };
    if let Ok(Ok(StreamReply::Queue(q))) = stream.execute(queue).await {
        let group = q.group.unwrap_or_default();
        if let Some(lag) = group.lag {
            metrics::gauge!("pelican_queue_lag").set(lag as f64);
        }
        metrics::gauge!("pelican_pel_count").set(group.pending as f64);
        metrics::gauge!("pelican_oldest_pending_idle_ms")
            .set(group.oldest_idle_ms.unwrap_or(0) as f64);
    }
    if let Ok(counts) = db.query(query::CountLive {}).await {
        for (status, n) in live_runs(&counts) {
            metrics::gauge!("pelican_runs", "status" => status.as_str()).set(n as f64);
        }
    }
    if let Ok(lag) = db.query(query::DueLag {}).await {
        metrics::gauge!("pelican_due_lag_ms").set(lag as f64);
    }
    if let Ok(lag) = db.query(query::ScheduleLag {}).await {
        metrics::gauge!("pelican_schedule_lag_ms").set(lag as f64);
    }
}

/// Every live status (delayed, queued, running, retry_wait) with its count in
/// `counts` ([`query::CountLive`]'s answer, which leaves out statuses with
/// none), zero where it has none.
pub fn live_runs(counts: &[(RunStatus, u64)]) -> impl Iterator<Item = (RunStatus, u64)> + '_ {
    RunStatus::ALL
        .into_iter()
        .filter(|s| !s.is_terminal())
        .map(|s| {
            (
                s,
                counts.iter().find(|(c, _)| *c == s).map_or(0, |(_, n)| *n),
            )
        })
}

/// Whether a worker is connected and reading, as its `/readyz` answers:
/// its last XREADGROUP got an answer, its last statement got an answer,
/// and it is not shutting down. A worker whose every slot is busy does not
/// read; it stays ready on its last read's answer.
#[derive(Debug)]
pub struct Readiness {
    reading: AtomicBool,
    postgres: AtomicBool,
    stopping: AtomicBool,
}

impl Default for Readiness {
    fn default() -> Readiness {
        Readiness {
            // Not ready until a read is answered; Postgres answered the
            // connection check before the worker started.
            reading: AtomicBool::new(false),
            postgres: AtomicBool::new(true),
            stopping: AtomicBool::new(false),
        }
    }
}

impl Readiness {
    /// Marks the worker as shutting down: it reads no more.
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::Relaxed);
    }

    /// Whether ready, and the parts: `(ready, reading, postgres, stopping)`.
    #[must_use]
    pub fn state(&self) -> (bool, bool, bool, bool) {
        let reading = self.reading.load(Ordering::Relaxed);
        let postgres = self.postgres.load(Ordering::Relaxed);
        let stopping = self.stopping.load(Ordering::Relaxed);
        (
            reading && postgres && !stopping,
            reading,
            postgres,
            stopping,
        )
    }
}

/// The worker's metrics, observed through the driver's probe. Each series'
/// handle is registered once, when the probe is made (after the recorder is
/// installed), so that an observation on the hot path is an atomic add,
/// never a registry lookup.
pub struct MetricsProbe {
    /// By outcome: succeeded, retryable, terminal, panic.
    attempts: [Counter; 5],
    duration: Histogram,
    /// By statement: (name, [rejected, accepted]).
    writes: Vec<(&'static str, [Counter; 2])>,
    /// By [`DeliveryEnd::name`].
    deliveries: Vec<(&'static str, Counter)>,
    unavailable: Counter,
    /// By [`MaintenanceTask::ALL`]: (rows moved on, passes, whether the
    /// last pass came back full).
    maintenance: [(Counter, Counter, Gauge); MaintenanceTask::ALL.len()],
    /// What `/readyz` answers.
    pub readiness: Arc<Readiness>,
}

/// The statements `pelican_writes_total` counts: the fenced writes and the
/// recoveries.
const WRITES: [&str; 8] = [
    "complete",
    "fail",
    "schedule_retry",
    "dead_letter",
    "dead_letter_exhausted",
    "heartbeat",
    "requeue_entry",
    "requeue_run",
];

impl Default for MetricsProbe {
    fn default() -> Self {
        MetricsProbe::new()
    }
}

impl MetricsProbe {
    /// Registers every series with the installed recorder (install it
    /// first: handles made before that count into nothing).
    #[must_use]
    pub fn new() -> MetricsProbe {
        let attempts = ["succeeded", "retryable", "terminal", "panic", "unknown"]
            .map(|outcome| metrics::counter!("pelican_attempts_total", "outcome" => outcome));
        let writes = WRITES
            .iter()
            .map(|&name| {
                let counter = |accepted: &'static str| {
                    metrics::counter!("pelican_writes_total", "statement" => name, "accepted" => accepted)
                };
                (name, [counter("false"), counter("true")])
            })
            .collect();
        let ends = [
            DeliveryEnd::Acked(AckReason::Written),
            DeliveryEnd::Acked(AckReason::Terminal),
            DeliveryEnd::Acked(AckReason::Stale),
            DeliveryEnd::Acked(AckReason::Duplicate),
            DeliveryEnd::Acked(AckReason::Exhausted),
            DeliveryEnd::Acked(AckReason::Quarantined),
            DeliveryEnd::LeftPending(PendingReason::Unavailable),
        ];
        let deliveries = ends
            .iter()
            .map(|end| {
                let name = end.name();
                (
                    name,
                    metrics::counter!("pelican_deliveries_total", "end" => name),
                )
            })
            .collect();
        let maintenance = MaintenanceTask::ALL.map(|task| {
            let name = task.as_str();
            (
                metrics::counter!("pelican_maintenance_rows_total", "task" => name),
                metrics::counter!("pelican_maintenance_passes_total", "task" => name),
                metrics::gauge!("pelican_maintenance_behind", "task" => name),
            )
        });
        MetricsProbe {
            attempts,
            maintenance,
            duration: metrics::histogram!("pelican_attempt_duration_seconds"),
            writes,
            deliveries,
            unavailable: metrics::counter!("pelican_unavailable_total"),
            readiness: Arc::default(),
        }
    }
}

impl Probe for MetricsProbe {
    fn keeps_roles(&self) -> bool {
        false
    }

    fn received(&self, role: &RoleId, _now: Timestamp, input: &Input) {
        if matches!(input, Input::Unavailable) {
            self.unavailable.increment(1);
        }
        if matches!(role, RoleId::Reader(..)) {
            let answered = matches!(input, Input::Stream(_));
            self.readiness.reading.store(answered, Ordering::Relaxed);
        }
    }

    fn job_ended(&self, _role: &RoleId, outcome: &JobOutcome, took: Duration) {
        self.duration.record(took.as_secs_f64());
        let i = match outcome {
            JobOutcome::Succeeded { .. } => 0,
            JobOutcome::Failed { class, .. } => match class {
                ErrorClass::Retryable => 1,
                ErrorClass::Terminal
                | ErrorClass::Exhausted
                | ErrorClass::Unstorable
                | ErrorClass::BudgetExhausted => 2,
                ErrorClass::Panic => 3,
                ErrorClass::Unknown => 4,
            },
        };
        self.attempts[i].increment(1);
    }

    fn db_answered(&self, _role: &RoleId, statement: &'static str, input: &Input) {
        let answered = matches!(input, Input::Db(_));
        self.readiness.postgres.store(answered, Ordering::Relaxed);
        if let Input::Db(reply) = input
            && let Some(n) = reply.rows()
            && let Some((_, counters)) = self.writes.iter().find(|(s, _)| *s == statement)
        {
            counters[usize::from(n > 0)].increment(1);
        }
    }

    fn maintained(&self, _worker: WorkerId, task: MaintenanceTask, report: &PassReport) {
        let i = MaintenanceTask::ALL
            .iter()
            .position(|t| *t == task)
            .expect("every task is listed");
        let (rows, passes, behind) = &self.maintenance[i];
        rows.increment(report.rows);
        passes.increment(1);
        behind.set(f64::from(u8::from(report.full)));
    }

    fn delivery_end(&self, _worker: WorkerId, _entry: EntryId, end: DeliveryEnd) {
        let name = end.name();
        match self.deliveries.iter().find(|(n, _)| *n == name) {
            Some((_, counter)) => counter.increment(1),
            // An end the list above does not name yet still counts.
            None => metrics::counter!("pelican_deliveries_total", "end" => name).increment(1),
        }
    }
}
