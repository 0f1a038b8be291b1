//! The yardstick of the cost of the guarantees: the least protocol that
//! still drains Pelican's queue, written here and nowhere else.
//!
//! Each of its tasks reads a batch of entries (`XREADGROUP`), reads their
//! runs in one statement, "runs" each no-op job, writes every outcome in one
//! statement without a fence, and acknowledges the batch with one `XACK`.
//! There is no claim, attempt row, lease, heartbeat, retry or dead letter:
//! it keeps none of S3, S6 or S7 and would run a job twice after a crash.
//! It is not Pelican and is never shipped; its statements are its own and
//! have no twin in the model for that reason.
//!
//! It drains with the same in-flight depth and batch size as the workers
//! it is compared with: `in_flight / batch_max` tasks, each holding one
//! batch of at most `batch_max` entries.

use pelican_model::protocol::JobEntry;
use pelican_real::live::redis::read_entries;
use redis::Value;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// The baseline's read of a batch of runs.
pub const READ: &str = "SELECT run_id, kind, input FROM runs WHERE run_id = ANY($1::bigint[])";

/// The baseline's unfenced write of a batch of outcomes: any run not yet
/// terminal takes it.
pub const COMPLETE: &str = "UPDATE runs r SET status = 'succeeded', result = i.result, lease_until = NULL \
     FROM unnest($1::bigint[], $2::text[]) AS i(run_id, result) \
     WHERE r.run_id = i.run_id AND r.status IN ('queued', 'running', 'retry_wait')";

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

/// Starts `in_flight / batch_max` draining tasks on `rt`.
///
/// # Panics
/// When Redis or Postgres cannot be reached.
pub fn start(
    rt: &tokio::runtime::Runtime,
    to: &Target<'_>,
    in_flight: u32,
    batch_max: u32,
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
                stream: to.stream.to_owned(),
                group: to.group.to_owned(),
                consumer: format!("baseline-{i}"),
                batch: batch as usize,
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
    stream: String,
    group: String,
    consumer: String,
    batch: usize,
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
        let found: Vec<(i64, String, String)> = sqlx::query_as(READ)
            .bind(&runs)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| e.to_string())?;
        // Every bench job is a no-op: its result is the no-op handler's.
        let results: Vec<String> = found.iter().map(|_| "null".to_owned()).collect();
        let ids: Vec<i64> = found.iter().map(|(run, _, _)| *run).collect();
        sqlx::query(COMPLETE)
            .bind(&ids)
            .bind(&results)
            .execute(&self.pool)
            .await
            .map_err(|e| e.to_string())?;
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
