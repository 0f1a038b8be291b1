//! Prometheus metrics: the queue's state (observed from Redis and Postgres
//! when scraped) and the worker's counters (observed by [`MetricsProbe`]).
//!
//! | metric | type | what |
//! |---|---|---|
//! | `pelican_queue_lag` | gauge | entries not yet delivered to the group (XINFO GROUPS lag) |
//! | `pelican_pel_count` | gauge | deliveries pending acknowledgement (XPENDING) |
//! | `pelican_oldest_pending_idle_ms` | gauge | idle time of the oldest pending delivery |
//! | `pelican_runs{status}` | gauge | runs by status |
//! | `pelican_attempts_total{outcome}` | counter | job executions by outcome (succeeded, retryable, terminal, panic) |
//! | `pelican_attempt_duration_seconds` | histogram | job execution time |
//! | `pelican_writes_total{statement,accepted}` | counter | fenced writes and recoveries: complete, fail, schedule_retry, dead_letter, dead_letter_exhausted, heartbeat, requeue_entry, requeue_run; `accepted="false"` is a late write rejected by its fence |
//! | `pelican_deliveries_total{end}` | counter | how deliveries ended (acked: written, terminal, stale, duplicate, exhausted, quarantined; left_pending) |
//! | `pelican_unavailable_total` | counter | calls that got no answer |

use super::pg::PgDb;
use super::redis::{RedisStream, field};
use crate::driver::{Probe, RoleId};
use pelican_model::ids::{EntryId, WorkerId};
use pelican_model::protocol::{Command, DbOp, DbReply, DeliveryEnd, Input};
use pelican_model::status::{ErrorClass, JobOutcome};
use redis::Value;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

/// Updates the queue gauges from Redis and Postgres (on scrape).
pub async fn observe_queue(stream: &RedisStream, db: &PgDb) {
    let names = stream.names().clone();
    let mut conn = stream.connection();
    if let Ok(Some(group)) = stream.group_info().await {
        let number = |name| field(&group, name).and_then(|v| v.parse::<f64>().ok());
        if let Some(lag) = number("lag") {
            metrics::gauge!("pelican_queue_lag").set(lag);
        }
        if let Some(p) = number("pending") {
            metrics::gauge!("pelican_pel_count").set(p);
        }
    }
    let oldest = redis::cmd("XPENDING")
        .arg(&names.jobs)
        .arg(&names.group)
        .arg("-")
        .arg("+")
        .arg(1)
        .query_async::<Value>(&mut conn)
        .await;
    let idle = match oldest {
        Ok(Value::Array(rows)) => rows.first().and_then(|r| match r {
            Value::Array(f) => f.get(2).and_then(|v| match v {
                Value::Int(i) => Some(*i as f64),
                _ => None,
            }),
            _ => None,
        }),
        _ => None,
    };
    metrics::gauge!("pelican_oldest_pending_idle_ms").set(idle.unwrap_or(0.0));
    if let Ok(DbReply::Counts(counts)) = db.execute(&DbOp::CountRuns).await {
        for status in pelican_model::status::RunStatus::ALL {
            let n = counts
                .iter()
                .find(|(s, _)| *s == status)
                .map_or(0, |(_, n)| *n);
            metrics::gauge!("pelican_runs", "status" => status.as_str()).set(n as f64);
        }
    }
}

/// The worker's metrics, observed through the driver's probe.
#[derive(Default)]
pub struct MetricsProbe {
    started: Mutex<HashMap<RoleId, Instant>>,
    last_write: Mutex<HashMap<RoleId, &'static str>>,
}

fn statement(op: &DbOp) -> Option<&'static str> {
    Some(match op {
        DbOp::Complete { .. } => "complete",
        DbOp::Fail { .. } => "fail",
        DbOp::ScheduleRetry { .. } => "schedule_retry",
        DbOp::DeadLetter { .. } => "dead_letter",
        DbOp::DeadLetterExhausted { .. } => "dead_letter_exhausted",
        DbOp::Heartbeat { .. } => "heartbeat",
        DbOp::RequeueEntry { .. } => "requeue_entry",
        DbOp::RequeueRun { .. } => "requeue_run",
        _ => return None,
    })
}

impl Probe for MetricsProbe {
    fn sent(&self, role: &RoleId, command: &Command) {
        match command {
            Command::Execute(_) => {
                let mut s = self.started.lock().expect("never poisoned");
                s.insert(role.clone(), Instant::now());
            }
            Command::Abort => {
                self.started.lock().expect("never poisoned").remove(role);
            }
            Command::Db(op) => {
                if let Some(name) = statement(op) {
                    self.last_write
                        .lock()
                        .expect("never poisoned")
                        .insert(role.clone(), name);
                }
            }
            _ => {}
        }
    }

    fn received(&self, role: &RoleId, _now: pelican_model::time::Timestamp, input: &Input) {
        match input {
            Input::Executed(outcome) => {
                let started = self.started.lock().expect("never poisoned").remove(role);
                if let Some(t) = started {
                    metrics::histogram!("pelican_attempt_duration_seconds")
                        .record(t.elapsed().as_secs_f64());
                }
                let label = match outcome {
                    JobOutcome::Succeeded { .. } => "succeeded",
                    JobOutcome::Failed { class, .. } => match class {
                        ErrorClass::Retryable => "retryable",
                        ErrorClass::Terminal | ErrorClass::Exhausted => "terminal",
                        ErrorClass::Panic => "panic",
                    },
                };
                metrics::counter!("pelican_attempts_total", "outcome" => label).increment(1);
            }
            Input::Db(DbReply::Rows(n)) => {
                let last = self.last_write.lock().expect("never poisoned").remove(role);
                if let Some(name) = last {
                    let accepted = if *n > 0 { "true" } else { "false" };
                    metrics::counter!("pelican_writes_total", "statement" => name, "accepted" => accepted)
                        .increment(1);
                }
            }
            Input::Unavailable => {
                self.last_write.lock().expect("never poisoned").remove(role);
                metrics::counter!("pelican_unavailable_total").increment(1);
            }
            _ => {}
        }
    }

    fn delivery_end(&self, _worker: WorkerId, _entry: EntryId, end: DeliveryEnd) {
        let label = end.name();
        metrics::counter!("pelican_deliveries_total", "end" => label).increment(1);
    }
}
