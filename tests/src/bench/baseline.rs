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
//!
//! [`statement_cost`] times each protocol's two statements alone, on one
//! connection with no Redis and no other session, so that what Postgres
//! spends on a run is seen apart from the drain's contention for the cores;
//! an [`Ablation`] takes one part of the schema away to price that part.

use pelican_model::ids::{Dispatch, EntryId, RunId};
use pelican_model::protocol::{DbOp, DbReply, JobEntry};
use pelican_model::status::RunStatus;
use pelican_real::live::PgDb;
use pelican_real::live::pg::raw_execute;
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
    let db = rt
        .block_on(connect(to.database_url, tasks_n))
        .expect("the baseline's Postgres answers");
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
                db: db.clone(),
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
    db: PgDb,
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
        settle(&self.db, self.protocol, &self.consumer, &entries).await?;
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

/// A drainer's connections to Postgres: the shipped binding's, whose
/// pool the yardsticks' own statements use too, so that every drainer runs
/// with the same session settings (generic plans: planned for their first
/// arrays, the batched outcome statements scan `runs` once the statistics
/// lag the queue, and a fenced floor drained 20,000 runs at 3,100 jobs/s
/// so) and the same pool.
async fn connect(url: &str, connections: u32) -> Result<PgDb, String> {
    PgDb::connect(url, connections, std::time::Duration::from_secs(10))
        .await
        .map_err(|e| e.to_string())
}

/// The database side of one batch of `entries`, as `protocol` does it:
/// the statement that takes their runs, then the one that writes their
/// outcomes (every bench job is a no-op).
async fn settle(
    db: &PgDb,
    protocol: Protocol,
    consumer: &str,
    entries: &[(EntryId, JobEntry)],
) -> Result<(), String> {
    let runs: Vec<i64> = entries
        .iter()
        .filter_map(|(_, job)| match job {
            JobEntry::Job { run, .. } => i64::try_from(run.0).ok(),
            JobEntry::Malformed { .. } => None,
        })
        .collect();
    match protocol {
        Protocol::Unfenced => {
            let found: Vec<(i64, String, String)> = sqlx::query_as(READ)
                .bind(&runs)
                .fetch_all(db.pool())
                .await
                .map_err(|e| e.to_string())?;
            // Every bench job is a no-op: its result is the no-op
            // handler's.
            let results: Vec<String> = found.iter().map(|_| "null".to_owned()).collect();
            let ids: Vec<i64> = found.iter().map(|(run, _, _)| *run).collect();
            sqlx::query(COMPLETE)
                .bind(&ids)
                .bind(&results)
                .execute(db.pool())
                .await
                .map_err(|e| e.to_string())?;
        }
        Protocol::Fenced => {
            let claimed: Vec<(i64, i64, String, String)> = sqlx::query_as(CLAIM)
                .bind(&runs)
                .bind(LEASE_MS.cast_signed())
                .fetch_all(db.pool())
                .await
                .map_err(|e| e.to_string())?;
            let results: Vec<String> = claimed.iter().map(|_| "null".to_owned()).collect();
            let ids: Vec<i64> = claimed.iter().map(|c| c.0).collect();
            let fences: Vec<i64> = claimed.iter().map(|c| c.1).collect();
            sqlx::query(COMPLETE_FENCED)
                .bind(&ids)
                .bind(&fences)
                .bind(&results)
                .execute(db.pool())
                .await
                .map_err(|e| e.to_string())?;
        }
        Protocol::ShippedStatements => {
            let claims: Vec<DbOp> = entries
                .iter()
                .filter_map(|(id, job)| match job {
                    JobEntry::Job { run, dispatch } => Some(DbOp::Claim {
                        run: *run,
                        dispatch: *dispatch,
                        entry: *id,
                        worker: consumer.to_owned(),
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
    Ok(())
}

/// A change to the schema before [`statement_cost`] measures, to price one
/// part of the shipped statements by its absence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ablation {
    /// The schema as migrated.
    None,
    /// The triggers on `runs` disabled: the live counts
    /// (`SCHEMA_COUNTS`) are not kept.
    NoCountTriggers,
    /// Every index of `runs` that reads `finished_at` dropped: the write
    /// that finishes a run is then HOT, like the claim.
    HotFinish,
}

impl Ablation {
    /// Applies it to the database behind `pool`.
    async fn apply(self, pool: &sqlx::PgPool) -> Result<(), String> {
        let ddl: Vec<String> = match self {
            Ablation::None => Vec::new(),
            Ablation::NoCountTriggers => vec!["ALTER TABLE runs DISABLE TRIGGER USER".to_owned()],
            Ablation::HotFinish => sqlx::query_scalar::<_, String>(
                "SELECT indexname::text FROM pg_indexes \
                  WHERE tablename = 'runs' AND indexdef LIKE '%finished_at%'",
            )
            .fetch_all(pool)
            .await
            .map_err(|e| e.to_string())?
            .into_iter()
            .map(|index| format!("DROP INDEX \"{index}\""))
            .collect(),
        };
        for sql in ddl {
            sqlx::raw_sql(sqlx::AssertSqlSafe(sql.clone()))
                .execute(pool)
                .await
                .map_err(|e| format!("{sql}: {e}"))?;
        }
        Ok(())
    }
}

/// What `protocol`'s two statements alone cost Postgres, in µs per run:
/// `runs` queued runs are inserted and published with the shipped
/// statements into the empty database at `database_url`, vacuumed and
/// checkpointed as the drains' are; then one connection takes and settles
/// them `batch` at a time, one statement after another, with no Redis, no
/// worker and no other session. The time is the client's, round trips
/// included.
///
/// # Errors
/// When Postgres cannot be reached or a statement fails.
pub async fn statement_cost(
    database_url: &str,
    protocol: Protocol,
    ablation: Ablation,
    runs: u32,
    batch: u32,
) -> Result<f64, String> {
    let db = connect(database_url, 1).await?;
    db.migrate().await.map_err(|e| e.to_string())?;
    ablation.apply(db.pool()).await?;
    let ids: Vec<u64> = (1..=u64::from(runs)).collect();
    let batch = batch.max(1) as usize;
    let entry = |run: u64| EntryId::new(run, 0);
    let in_batches = |op: &dyn Fn(u64) -> DbOp| {
        let ops: Vec<Vec<DbOp>> = ids
            .chunks(batch)
            .map(|chunk| chunk.iter().map(|&run| op(run)).collect())
            .collect();
        let db = &db;
        async move {
            for ops in ops {
                db.execute_batch(&ops).await.map_err(|e| e.to_string())?;
            }
            Ok::<(), String>(())
        }
    };
    // Inserted, then analysed, then published: a batched statement's
    // generic plan is made at its first execution on a connection, so the
    // publications are planned for the full table, not for its first batch
    // (planned on an empty table, each scanned the whole table: about a
    // second a batch of 512 at 100,000 runs).
    in_batches(&|run| DbOp::InsertRun {
        run: RunId(run),
        kind: "noop".to_owned(),
        input: "{}".to_owned(),
        attempts_max: 3,
        budget_ms: 0,
        trace: String::new(),
        delay_ms: 0,
        at_ms: 0,
    })
    .await?;
    raw_execute(&db, "ANALYZE runs")
        .await
        .map_err(|e| format!("ANALYZE runs: {e}"))?;
    in_batches(&|run| DbOp::MarkPublished {
        run: RunId(run),
        dispatch: Dispatch(1),
        entry: entry(run),
    })
    .await?;
    super::settle_database(&db).await?;
    let entries: Vec<(EntryId, JobEntry)> = ids
        .iter()
        .map(|&run| {
            let job = JobEntry::Job {
                run: RunId(run),
                dispatch: Dispatch(1),
            };
            (entry(run), job)
        })
        .collect();
    let t = std::time::Instant::now();
    for chunk in entries.chunks(batch) {
        settle(&db, protocol, "statements", chunk).await?;
    }
    let elapsed = t.elapsed();
    let settled = match db.execute(&DbOp::CountRuns).await {
        Ok(DbReply::Counts(counts)) => counts
            .iter()
            .find(|(status, _)| *status == RunStatus::Succeeded)
            .map_or(0, |(_, n)| *n),
        other => return Err(format!("counting the runs: {other:?}")),
    };
    if settled != u64::from(runs) {
        return Err(format!("{settled} of {runs} runs succeeded"));
    }
    Ok(elapsed.as_secs_f64() * 1e6 / f64::from(runs))
}
