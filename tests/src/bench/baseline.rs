//! The yardsticks of the cost of the guarantees: the least protocols that
//! still drain Pelican's queue, written here and nowhere else.
//!
//! Each of their tasks reads a batch of entries (`XREADGROUP`), takes
//! their runs in one statement, "runs" each no-op job, writes every
//! outcome in one statement, and acknowledges the batch with one `XACK`.
//! [`Protocol`] says how the runs are taken and the outcomes written:
//!
//! * [`Protocol::Unfenced`] reads the runs and writes outcomes without a
//!   fence: at-least-once delivery with durable outcomes, the contract of
//!   the common job queues. It keeps none of S3, S6 or S7 and would run a
//!   job twice after a crash.
//! * [`Protocol::Fenced`] is the floor of any protocol that fences (S3): a
//!   durable claim that takes a new fence before the job runs, and an
//!   outcome written only under that fence. Both writes are HOT. There is
//!   still no attempt row, retry, dead letter or state machine per delivery.
//! * [`Protocol::ShippedStatements`] runs Pelican's own batched claim and
//!   success statements ([`DbOp::Claim`], [`DbOp::Complete`], through the
//!   shipped Postgres binding) in this same loop: the shipped protocol's
//!   writes without its worker. Between it and a `pelican worker` lies
//!   what the worker's machinery costs (a state machine, a task and timers
//!   per delivery, maintenance passes); between it and the fenced
//!   floor, what the shipped statements write beyond a fence.
//!
//! None is Pelican, nor ever shipped; the first two's statements are their
//! own and have no twin in the model for that reason.
//!
//! They drain with the same in-flight depth and batch size as the workers
//! they are compared with: `in_flight / batch_max` tasks, each holding one
//! batch of at most `batch_max` entries.

use pelican_model::protocol::{DbOp, DbReply, JobEntry};
use pelican_real::live::PgDb;
use pelican_real::live::redis::read_entries;
use redis::Value;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// How a baseline takes its runs and writes their outcomes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// Reads the runs ([`READ`]), writes outcomes unfenced ([`COMPLETE`]).
    Unfenced,
    /// Claims the runs under a new fence ([`CLAIM`]), writes outcomes under
    /// it ([`COMPLETE_FENCED`]).
    Fenced,
    /// Claims and completes with the shipped statements.
    ShippedStatements,
}

impl Protocol {
    /// Its name in the bench's reports.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Unfenced => "the unfenced baseline",
            Protocol::Fenced => "the fenced floor",
            Protocol::ShippedStatements => "the shipped statements in the baseline's loop",
        }
    }
}

/// The unfenced baseline's read of a batch of runs.
pub const READ: &str = "SELECT run_id, kind, input FROM runs WHERE run_id = ANY($1::bigint[])";

/// The unfenced baseline's write of a batch of outcomes: any run not yet
/// terminal takes it.
pub const COMPLETE: &str = "UPDATE runs r SET status = 'succeeded', result = i.result, lease_until = NULL \
     FROM unnest($1::bigint[], $2::text[]) AS i(run_id, result) \
     WHERE r.run_id = i.run_id AND r.status IN ('queued', 'running', 'retry_wait')";

/// The fenced floor's claim of a batch of runs: each queued run becomes
/// running under a new fence and a lease (`$2` ms), in one statement and
/// one commit before any of its jobs runs.
pub const CLAIM: &str = "UPDATE runs SET status = 'running', active_fence = active_fence + 1, \
     lease_until = pelican_now_ms() + $2 \
     WHERE run_id = ANY($1::bigint[]) AND status = 'queued' \
     RETURNING run_id, active_fence, kind, input";

/// The fenced floor's write of a batch of outcomes: a run takes its
/// outcome only while it is running under the fence its claim took.
pub const COMPLETE_FENCED: &str = "UPDATE runs r SET status = 'succeeded', result = i.result, lease_until = NULL \
     FROM unnest($1::bigint[], $2::bigint[], $3::text[]) AS i(run_id, fence, result) \
     WHERE r.run_id = i.run_id AND r.active_fence = i.fence AND r.status = 'running'";

/// The lease of a fenced claim, ms: longer than any drain, as no
/// heartbeat renews it.
const LEASE_MS: u64 = 600_000;

/// The running drainer; dropping it stops its tasks.
pub struct Baseline {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Baseline {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Where the baseline drains from.
pub struct Target<'a> {
    /// Redis.
    pub redis_url: &'a str,
    /// The job stream's key.
    pub stream: &'a str,
    /// The consumer group.
    pub group: &'a str,
    /// Postgres.
    pub database_url: &'a str,
}

/// Starts `in_flight / batch_max` tasks on `rt` draining with `protocol`.
///
/// # Panics
/// When Redis or Postgres cannot be reached.
pub fn start(
    rt: &tokio::runtime::Runtime,
    to: &Target<'_>,
    in_flight: u32,
    batch_max: u32,
    protocol: Protocol,
) -> Baseline {
    let stop = Arc::new(AtomicBool::new(false));
    let batch = batch_max.max(1);
    let tasks_n = (in_flight / batch).max(1);
    let pool = rt
        .block_on(
            sqlx::postgres::PgPoolOptions::new()
                .max_connections(tasks_n)
                .connect(to.database_url),
        )
        .expect("the baseline's Postgres answers");
    let shipped = (protocol == Protocol::ShippedStatements).then(|| {
        rt.block_on(PgDb::connect(
            to.database_url,
            tasks_n,
            std::time::Duration::from_secs(10),
        ))
        .expect("the baseline's Postgres answers")
    });
    let client = redis::Client::open(to.redis_url).expect("a valid Redis URL");
    let mut conn = client
        .get_connection()
        .expect("the baseline's Redis answers");
    let created: redis::RedisResult<Value> = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(to.stream)
        .arg(to.group)
        .arg("0")
        .arg("MKSTREAM")
        .query(&mut conn);
    if let Err(e) = created {
        assert_eq!(e.code(), Some("BUSYGROUP"), "creating the group: {e}");
    }
    let tasks = (0..tasks_n)
        .map(|i| {
            let conn = rt
                .block_on(client.get_multiplexed_async_connection())
                .expect("the baseline's Redis answers");
            let task = Task {
                conn,
                pool: pool.clone(),
                shipped: shipped.clone(),
                stream: to.stream.to_owned(),
                group: to.group.to_owned(),
                consumer: format!("baseline-{i}"),
                batch: batch as usize,
                protocol,
                stop: Arc::clone(&stop),
            };
            rt.spawn(task.run())
        })
        .collect();
    Baseline { stop, tasks }
}

struct Task {
    conn: redis::aio::MultiplexedConnection,
    pool: sqlx::PgPool,
    /// The shipped binding, for [`Protocol::ShippedStatements`].
    shipped: Option<PgDb>,
    stream: String,
    group: String,
    consumer: String,
    batch: usize,
    protocol: Protocol,
    stop: Arc<AtomicBool>,
}

impl Task {
    async fn run(mut self) {
        while !self.stop.load(Ordering::Relaxed) {
            if let Err(e) = self.round().await {
                eprintln!("bench: baseline {}: {e}", self.consumer);
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }

    async fn round(&mut self) -> Result<(), String> {
        let read: Value = redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg(&self.group)
            .arg(&self.consumer)
            .arg("COUNT")
            .arg(self.batch)
            .arg("BLOCK")
            .arg(100)
            .arg("STREAMS")
            .arg(&self.stream)
            .arg(">")
            .query_async(&mut self.conn)
            .await
            .map_err(|e| e.to_string())?;
        let entries = read_entries(read);
        if entries.is_empty() {
            return Ok(());
        }
        let runs: Vec<i64> = entries
            .iter()
            .filter_map(|(_, job)| match job {
                JobEntry::Job { run, .. } => i64::try_from(run.0).ok(),
                JobEntry::Malformed { .. } => None,
            })
            .collect();
        match self.protocol {
            Protocol::Unfenced => {
                let found: Vec<(i64, String, String)> = sqlx::query_as(READ)
                    .bind(&runs)
                    .fetch_all(&self.pool)
                    .await
                    .map_err(|e| e.to_string())?;
                // Every bench job is a no-op: its result is the no-op
                // handler's.
                let results: Vec<String> = found.iter().map(|_| "null".to_owned()).collect();
                let ids: Vec<i64> = found.iter().map(|(run, _, _)| *run).collect();
                sqlx::query(COMPLETE)
                    .bind(&ids)
                    .bind(&results)
                    .execute(&self.pool)
                    .await
                    .map_err(|e| e.to_string())?;
            }
            Protocol::Fenced => {
                let claimed: Vec<(i64, i64, String, String)> = sqlx::query_as(CLAIM)
                    .bind(&runs)
                    .bind(LEASE_MS.cast_signed())
                    .fetch_all(&self.pool)
                    .await
                    .map_err(|e| e.to_string())?;
                let results: Vec<String> = claimed.iter().map(|_| "null".to_owned()).collect();
                let ids: Vec<i64> = claimed.iter().map(|c| c.0).collect();
                let fences: Vec<i64> = claimed.iter().map(|c| c.1).collect();
                sqlx::query(COMPLETE_FENCED)
                    .bind(&ids)
                    .bind(&fences)
                    .bind(&results)
                    .execute(&self.pool)
                    .await
                    .map_err(|e| e.to_string())?;
            }
            Protocol::ShippedStatements => {
                let db = self.shipped.as_ref().expect("connected for this protocol");
                let claims: Vec<DbOp> = entries
                    .iter()
                    .filter_map(|(id, job)| match job {
                        JobEntry::Job { run, dispatch } => Some(DbOp::Claim {
                            run: *run,
                            dispatch: *dispatch,
                            entry: *id,
                            worker: self.consumer.clone(),
                            lease_ms: LEASE_MS,
                        }),
                        JobEntry::Malformed { .. } => None,
                    })
                    .collect();
                let claimed = db.execute_batch(&claims).await.map_err(|e| e.to_string())?;
                let completions: Vec<DbOp> = claims
                    .iter()
                    .zip(claimed)
                    .filter_map(|(claim, reply)| match (claim, reply) {
                        (DbOp::Claim { run, .. }, DbReply::Claimed(Some(job))) => {
                            Some(DbOp::Complete {
                                run: *run,
                                fence: job.claimed.fence,
                                result: "null".to_owned(),
                            })
                        }
                        _ => None,
                    })
                    .collect();
                if !completions.is_empty() {
                    db.execute_batch(&completions)
                        .await
                        .map_err(|e| e.to_string())?;
                }
            }
        }
        let mut ack = redis::cmd("XACK");
        ack.arg(&self.stream).arg(&self.group);
        for (id, _) in &entries {
            ack.arg(id.to_string());
        }
        let _: Value = ack
            .query_async(&mut self.conn)
            .await
            .map_err(|e| e.to_string())?;
        Ok(())
    }
}
