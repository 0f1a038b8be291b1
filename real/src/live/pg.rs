//! The database client on Postgres (sqlx, a connection pool).
//!
//! Each [`DbOp`] runs exactly one statement of `pelican_model::db::sql`, the
//! text that sits beside its reference twin in `pelican_model::Db`; the rows
//! come back as the same [`DbReply`] values. Times are bound as `bigint`
//! milliseconds, so no statement reads the server's clock. The schema is the
//! model's `SCHEMA` and `SCHEMA_HOT_PATH`, applied as embedded sqlx
//! migrations.

use crate::driver::{BoxFuture, DbClient, Tools};
use pelican_model::db::{AttemptRow, Candidate, Claimed, ClaimedJob, DeadLetter, RunRow, sql};
use pelican_model::ids::{AttemptNo, Dispatch, EntryId, Fence, RunId};
use pelican_model::protocol::{DbOp, DbReply, Unavailable};
use pelican_model::status::{AttemptOutcome, ErrorClass, RunStatus};
use pelican_model::time::Timestamp;
use pelican_model::world::Issuer;
use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::postgres::{PgPool, PgPoolOptions, PgRow};
use sqlx::{Row, SqlSafeStr};
use std::time::Duration;

/// The Postgres client.
#[derive(Clone, Debug)]
pub struct PgDb {
    pool: PgPool,
}

/// A database error, for the binary's own commands.
#[derive(Debug, thiserror::Error)]
pub enum PgError {
    /// Connecting or a statement failed.
    #[error("Postgres: {0}")]
    Sql(#[from] sqlx::Error),
    /// Migrations failed.
    #[error("migrating the schema: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A stored value the model cannot represent.
    #[error("unexpected value in column {column}: {value:?}")]
    Corrupt {
        /// The column.
        column: &'static str,
        /// What it held.
        value: String,
    },
}

/// The embedded migrations: version 1 is the model's schema, version 2 its
/// hot-path indexes (`sql::SCHEMA_HOT_PATH`).
#[must_use]
pub fn migrator() -> Migrator {
    let migration = |version, name: &str, sql: &'static str| {
        Migration::new(
            version,
            name.to_owned().into(),
            MigrationType::Simple,
            sql.into_sql_str(),
            false,
        )
    };
    Migrator::with_migrations(vec![
        migration(1, "pelican schema", sql::SCHEMA),
        migration(2, "hot-path updates", sql::SCHEMA_HOT_PATH),
    ])
}

fn ms(t: Timestamp) -> i64 {
    i64::try_from(t.0).unwrap_or(i64::MAX)
}

fn big(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn small(n: u32) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

fn corrupt(column: &'static str, value: impl ToString) -> PgError {
    PgError::Corrupt {
        column,
        value: value.to_string(),
    }
}

fn unsigned(column: &'static str, v: i64) -> Result<u64, PgError> {
    u64::try_from(v).map_err(|_| corrupt(column, v))
}

fn unsigned32(column: &'static str, v: i32) -> Result<u32, PgError> {
    u32::try_from(v).map_err(|_| corrupt(column, v))
}

fn time(column: &'static str, v: Option<i64>) -> Result<Option<Timestamp>, PgError> {
    v.map(|v| unsigned(column, v).map(Timestamp)).transpose()
}

fn entry(column: &'static str, v: Option<String>) -> Result<Option<EntryId>, PgError> {
    v.map(|s| s.parse::<EntryId>().map_err(|_| corrupt(column, s)))
        .transpose()
}

fn class(column: &'static str, s: &str) -> Result<ErrorClass, PgError> {
    ErrorClass::parse(s).ok_or_else(|| corrupt(column, s))
}

fn outcome(v: Option<String>) -> Result<Option<AttemptOutcome>, PgError> {
    v.map(|s| match s.as_str() {
        "succeeded" => Ok(AttemptOutcome::Succeeded),
        other => class("outcome", other).map(AttemptOutcome::Failed),
    })
    .transpose()
}

fn run_row(r: &PgRow) -> Result<RunRow, PgError> {
    let status: String = r.try_get("status")?;
    let error_class: Option<String> = r.try_get("error_class")?;
    let error_message: Option<String> = r.try_get("error_message")?;
    Ok(RunRow {
        run_id: RunId(unsigned("run_id", r.try_get("run_id")?)?),
        kind: r.try_get("kind")?,
        input: r.try_get("input")?,
        status: RunStatus::parse(&status).ok_or_else(|| corrupt("status", &status))?,
        dispatch: Dispatch(unsigned32("dispatch", r.try_get("dispatch")?)?),
        active_fence: Fence(unsigned("active_fence", r.try_get("active_fence")?)?),
        attempts: unsigned32("attempts", r.try_get("attempts")?)?,
        attempts_max: unsigned32("attempts_max", r.try_get("attempts_max")?)?,
        lease_until: time("lease_until", r.try_get("lease_until")?)?,
        retry_at: time("retry_at", r.try_get("retry_at")?)?,
        published_at: time("published_at", r.try_get("published_at")?)?,
        entry_id: entry("entry_id", r.try_get("entry_id")?)?,
        result: r.try_get("result")?,
        error: match error_class {
            Some(c) => Some((class("error_class", &c)?, error_message.unwrap_or_default())),
            None => None,
        },
    })
}

fn candidate(r: &PgRow) -> Result<Candidate, PgError> {
    Ok(Candidate {
        run_id: RunId(unsigned("run_id", r.try_get("run_id")?)?),
        dispatch: Dispatch(unsigned32("dispatch", r.try_get("dispatch")?)?),
        entry_id: entry("entry_id", r.try_get("entry_id")?)?,
    })
}

fn attempt_row(r: &PgRow) -> Result<(AttemptNo, AttemptRow), PgError> {
    Ok((
        AttemptNo(unsigned32("attempt", r.try_get("attempt")?)?),
        AttemptRow {
            fence: Fence(unsigned("fence", r.try_get("fence")?)?),
            worker: r.try_get("worker")?,
            entry_id: entry("entry_id", Some(r.try_get("entry_id")?))?
                .expect("a present column parses to Some"),
            dispatch: Dispatch(unsigned32("dispatch", r.try_get("dispatch")?)?),
            outcome: outcome(r.try_get("outcome")?)?,
        },
    ))
}

fn dead_letter(r: &PgRow) -> Result<(RunId, DeadLetter), PgError> {
    let attempts: sqlx::types::Json<Vec<(u32, u64, Option<String>)>> = r.try_get("attempts")?;
    let class_text: String = r.try_get("class")?;
    Ok((
        RunId(unsigned("run_id", r.try_get("run_id")?)?),
        DeadLetter {
            source_entry: entry("source_entry", r.try_get("source_entry")?)?,
            class: class("class", &class_text)?,
            message: r.try_get("message")?,
            attempts: attempts
                .0
                .into_iter()
                .map(|(n, f, o)| Ok((AttemptNo(n), Fence(f), outcome(o)?)))
                .collect::<Result<_, PgError>>()?,
            requeued: r.try_get("requeued")?,
        },
    ))
}

impl PgDb {
    /// Connects a pool of at most `max_connections` to `url`.
    ///
    /// Every session runs with `plan_cache_mode = force_generic_plan`: each
    /// prepared statement gets one plan, made without looking at its
    /// parameters. The batched statements need that. Planned for the arrays
    /// at hand (Postgres's custom plans, its first five executions of each
    /// statement on each connection), a batch's join with `runs` follows the
    /// column statistics, which a queue outruns: with statistics taken while
    /// every run was queued, 512 outcomes among 4,096 running runs (of
    /// 20,000) were planned as a scan of `runs` estimated at one `running`
    /// row, looping over the whole batch for each of the 4,096 — 215 ms,
    /// against 2.2 ms for the generic plan, a lookup by primary key per
    /// batch row (`EXPLAIN ANALYZE`; a 512-claim batch: 12 ms against 3.9
    /// ms). The generic plan of every other statement is the same lookup or
    /// scan a custom one would be, without planning it on every call.
    ///
    /// # Errors
    /// The URL is invalid or the server cannot be reached.
    pub async fn connect(
        url: &str,
        max_connections: u32,
        acquire_timeout: Duration,
    ) -> Result<PgDb, PgError> {
        let options = url
            .parse::<sqlx::postgres::PgConnectOptions>()?
            .options([("plan_cache_mode", "force_generic_plan")]);
        let pool = PgPoolOptions::new()
            .max_connections(max_connections)
            // No ping before each statement: a connection that broke while
            // idle fails its next statement (an unavailable answer, which
            // every role handles) and is closed when released, where sqlx
            // pings anyway.
            .test_before_acquire(false)
            .acquire_timeout(acquire_timeout)
            .connect_with(options)
            .await?;
        Ok(PgDb { pool })
    }

    /// The pool (for the binary's own queries and tests).
    #[must_use]
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Applies the embedded migrations.
    ///
    /// # Errors
    /// A migration failed, or one applied earlier was changed.
    pub async fn migrate(&self) -> Result<(), PgError> {
        migrator().run(&self.pool).await?;
        Ok(())
    }

    /// Every row of every table, as the model's [`Db`](pelican_model::Db)
    /// (for tests and operators' checks: the invariants run over it).
    ///
    /// # Errors
    /// A query failed or a stored value is not representable.
    pub async fn snapshot(&self) -> Result<pelican_model::Db, PgError> {
        let p = &self.pool;
        let mut db = pelican_model::Db::new();
        let runs = sqlx::query(
            "SELECT run_id, kind, input, status, dispatch, active_fence, attempts, attempts_max, \
             lease_until, retry_at, published_at, entry_id, result, error_class, error_message FROM runs",
        )
        .fetch_all(p)
        .await?;
        for r in &runs {
            let row = run_row(r)?;
            db.run_ids = db.run_ids.max(row.run_id.0);
            db.runs.insert(row.run_id, row);
        }
        for r in &sqlx::query(
            "SELECT run_id, attempt, fence, worker, entry_id, dispatch, outcome FROM attempts",
        )
        .fetch_all(p)
        .await?
        {
            let run = RunId(unsigned("run_id", r.try_get("run_id")?)?);
            let (n, a) = attempt_row(r)?;
            db.attempts.insert((run, n), a);
        }
        for r in &sqlx::query(
            "SELECT run_id, source_entry, class, message, attempts, requeued FROM dead_letters",
        )
        .fetch_all(p)
        .await?
        {
            let (run, d) = dead_letter(r)?;
            db.dead_letters.insert(run, d);
        }
        for r in &sqlx::query("SELECT key, requests FROM effects")
            .fetch_all(p)
            .await?
        {
            let n: i64 = r.try_get("requests")?;
            db.effects
                .insert(r.try_get("key")?, unsigned("requests", n)?);
        }
        Ok(db)
    }

    /// Runs one statement.
    ///
    /// # Errors
    /// The statement failed or returned a value the model cannot hold.
    pub async fn execute(&self, op: &DbOp) -> Result<DbReply, PgError> {
        use sqlx::query as q;
        let p = &self.pool;
        let rows = |r: sqlx::postgres::PgQueryResult| DbReply::Rows(r.rows_affected());
        Ok(match op {
            DbOp::InsertRun {
                run,
                kind,
                input,
                attempts_max,
            } => rows(
                q(sql::INSERT_RUN)
                    .bind(big(run.0))
                    .bind(kind)
                    .bind(input)
                    .bind(small(*attempts_max))
                    .execute(p)
                    .await?,
            ),
            DbOp::MarkPublished {
                run,
                dispatch,
                entry,
                now,
            } => rows(
                q(sql::MARK_PUBLISHED)
                    .bind(big(run.0))
                    .bind(small(dispatch.0))
                    .bind(entry.to_string())
                    .bind(ms(*now))
                    .execute(p)
                    .await?,
            ),
            DbOp::Claim {
                run,
                dispatch,
                entry,
                worker,
                now,
                lease_ms,
            } => {
                self.claim(sql::CLAIM, *run, *dispatch, *entry, worker, *now, *lease_ms)
                    .await?
            }
            DbOp::ClaimReviving {
                run,
                dispatch,
                entry,
                worker,
                now,
                lease_ms,
            } => {
                self.claim(
                    sql::CLAIM_REVIVING,
                    *run,
                    *dispatch,
                    *entry,
                    worker,
                    *now,
                    *lease_ms,
                )
                .await?
            }
            DbOp::ReadRun { run } => {
                match q(sql::READ_RUN).bind(big(run.0)).fetch_optional(p).await? {
                    Some(r) => DbReply::Run(Some(run_row(&r)?)),
                    None => DbReply::Run(None),
                }
            }
            DbOp::Heartbeat {
                run,
                fence,
                now,
                lease_ms,
            } => rows(
                q(sql::HEARTBEAT)
                    .bind(big(run.0))
                    .bind(big(fence.0))
                    .bind(ms(*now))
                    .bind(big(*lease_ms))
                    .execute(p)
                    .await?,
            ),
            DbOp::Complete { run, fence, result } => rows(
                q(sql::COMPLETE)
                    .bind(big(run.0))
                    .bind(big(fence.0))
                    .bind(result)
                    .execute(p)
                    .await?,
            ),
            DbOp::CompleteUnfenced { run, result } => rows(
                q(sql::COMPLETE_UNFENCED)
                    .bind(big(run.0))
                    .bind(result)
                    .execute(p)
                    .await?,
            ),
            DbOp::FailUnfenced {
                run,
                class,
                message,
            } => rows(
                q(sql::FAIL_UNFENCED)
                    .bind(big(run.0))
                    .bind(class.as_str())
                    .bind(message)
                    .execute(p)
                    .await?,
            ),
            // Three statements with the same parameters: (run, fence, class,
            // message).
            DbOp::Fail {
                run,
                fence,
                class,
                message,
            }
            | DbOp::RecordFailureOnly {
                run,
                fence,
                class,
                message,
            }
            | DbOp::DeadLetter {
                run,
                fence,
                class,
                message,
            } => {
                let text = match op {
                    DbOp::Fail { .. } => sql::FAIL,
                    DbOp::RecordFailureOnly { .. } => sql::RECORD_FAILURE_ONLY,
                    _ => sql::DEAD_LETTER,
                };
                rows(
                    q(text)
                        .bind(big(run.0))
                        .bind(big(fence.0))
                        .bind(class.as_str())
                        .bind(message)
                        .execute(p)
                        .await?,
                )
            }
            DbOp::ScheduleRetry {
                run,
                fence,
                class,
                message,
                retry_at,
            } => rows(
                q(sql::SCHEDULE_RETRY)
                    .bind(big(run.0))
                    .bind(big(fence.0))
                    .bind(class.as_str())
                    .bind(message)
                    .bind(ms(*retry_at))
                    .execute(p)
                    .await?,
            ),
            DbOp::DeadLetterExhausted { run, dispatch, now } => rows(
                q(sql::DEAD_LETTER_EXHAUSTED)
                    .bind(big(run.0))
                    .bind(small(dispatch.0))
                    .bind(ms(*now))
                    .execute(p)
                    .await?,
            ),
            DbOp::Cancel { run } => rows(q(sql::CANCEL).bind(big(run.0)).execute(p).await?),
            DbOp::PromoteRetries { now, limit } => rows(
                q(sql::PROMOTE_RETRIES)
                    .bind(ms(*now))
                    .bind(big(*limit as u64))
                    .execute(p)
                    .await?,
            ),
            DbOp::Unpublished { limit } => DbReply::Candidates(
                q(sql::UNPUBLISHED)
                    .bind(big(*limit as u64))
                    .fetch_all(p)
                    .await?
                    .iter()
                    .map(candidate)
                    .collect::<Result<_, _>>()?,
            ),
            DbOp::OrphanCandidates {
                now,
                grace_ms,
                limit,
            } => DbReply::Candidates(
                q(sql::ORPHAN_CANDIDATES)
                    .bind(ms(*now).saturating_sub(big(*grace_ms)).max(0))
                    .bind(big(*limit as u64))
                    .fetch_all(p)
                    .await?
                    .iter()
                    .map(candidate)
                    .collect::<Result<_, _>>()?,
            ),
            DbOp::RequeueRun { run, dispatch, now } => rows(
                q(sql::REQUEUE_RUN)
                    .bind(big(run.0))
                    .bind(small(dispatch.0))
                    .bind(ms(*now))
                    .execute(p)
                    .await?,
            ),
            DbOp::RequeueEntry { entry, now } => rows(
                q(sql::REQUEUE_ENTRY)
                    .bind(entry.to_string())
                    .bind(ms(*now))
                    .execute(p)
                    .await?,
            ),
            DbOp::ApplyEffect { key } => {
                let applied: bool = q(sql::APPLY_EFFECT)
                    .bind(key)
                    .fetch_one(p)
                    .await?
                    .try_get("applied")?;
                DbReply::Rows(u64::from(applied))
            }
            DbOp::NextRunId => {
                let id: i64 = q(sql::NEXT_RUN_ID).fetch_one(p).await?.try_get(0)?;
                DbReply::NewRun(RunId(unsigned("run_id", id)?))
            }
            DbOp::ReadAttempts { run } => DbReply::Attempts(
                q(sql::READ_ATTEMPTS)
                    .bind(big(run.0))
                    .fetch_all(p)
                    .await?
                    .iter()
                    .map(attempt_row)
                    .collect::<Result<_, _>>()?,
            ),
            DbOp::ListDeadLetters { limit } => DbReply::DeadLetters(
                q(sql::LIST_DEAD_LETTERS)
                    .bind(big(*limit as u64))
                    .fetch_all(p)
                    .await?
                    .iter()
                    .map(dead_letter)
                    .collect::<Result<_, _>>()?,
            ),
            DbOp::CountRuns => DbReply::Counts(
                q(sql::COUNT_RUNS)
                    .fetch_all(p)
                    .await?
                    .iter()
                    .map(|r| {
                        let s: String = r.try_get("status")?;
                        let n: i64 = r.try_get("n")?;
                        Ok((
                            RunStatus::parse(&s).ok_or_else(|| corrupt("status", &s))?,
                            unsigned("count", n)?,
                        ))
                    })
                    .collect::<Result<_, PgError>>()?,
            ),
            DbOp::DlqRequeue {
                run,
                extra_attempts,
            } => rows(
                q(sql::DLQ_REQUEUE)
                    .bind(big(run.0))
                    .bind(small(*extra_attempts))
                    .execute(p)
                    .await?,
            ),
        })
    }

    #[allow(clippy::too_many_arguments)]
    async fn claim(
        &self,
        text: &'static str,
        run: RunId,
        dispatch: Dispatch,
        entry: EntryId,
        worker: &str,
        now: Timestamp,
        lease_ms: u64,
    ) -> Result<DbReply, PgError> {
        let row = sqlx::query(text)
            .bind(big(run.0))
            .bind(small(dispatch.0))
            .bind(entry.to_string())
            .bind(worker)
            .bind(ms(now))
            .bind(big(lease_ms))
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref()
            .map(claimed_job)
            .transpose()
            .map(DbReply::Claimed)
    }

    /// Runs `ops` in order, the twin of
    /// [`pelican_model::Db::execute_batch`]: claims on distinct runs as one
    /// [`sql::CLAIM_MANY`], completions on distinct runs as one
    /// [`sql::COMPLETE_MANY`] (one statement, one transaction); for the
    /// benchmarks' baseline (`Unguarded`), reads as one
    /// [`sql::READ_RUN_MANY`] and unfenced results on distinct runs as one
    /// [`sql::COMPLETE_UNFENCED_MANY`]; anything else statement by
    /// statement.
    ///
    /// # Errors
    /// When Postgres fails or answers something unexpected; for one
    /// statement nothing took effect, or (a lost commit answer) everything
    /// did.
    pub async fn execute_batch(&self, ops: &[DbOp]) -> Result<Vec<DbReply>, PgError> {
        let distinct = {
            let mut runs = std::collections::BTreeSet::new();
            ops.iter().all(|op| match op {
                DbOp::Claim { run, .. }
                | DbOp::Complete { run, .. }
                | DbOp::CompleteUnfenced { run, .. } => runs.insert(*run),
                _ => false,
            })
        };
        if distinct && ops.iter().all(|op| matches!(op, DbOp::Claim { .. })) {
            return self.claim_many(ops).await;
        }
        if distinct && ops.iter().all(|op| matches!(op, DbOp::Complete { .. })) {
            return self.complete_many(ops).await;
        }
        if distinct
            && ops
                .iter()
                .all(|op| matches!(op, DbOp::CompleteUnfenced { .. }))
        {
            return self.complete_unfenced_many(ops).await;
        }
        if ops.iter().all(|op| matches!(op, DbOp::ReadRun { .. })) {
            return self.read_many(ops).await;
        }
        // Other mixes (the batching driver sends none) run one by one: an
        // error then leaves each command as uncertain as a lost reply.
        let mut replies = Vec::with_capacity(ops.len());
        for op in ops {
            replies.push(self.execute(op).await?);
        }
        Ok(replies)
    }

    async fn claim_many(&self, ops: &[DbOp]) -> Result<Vec<DbReply>, PgError> {
        let (mut runs, mut dispatches, mut entries, mut workers, mut nows, mut leases) =
            (vec![], vec![], vec![], vec![], vec![], vec![]);
        for op in ops {
            if let DbOp::Claim {
                run,
                dispatch,
                entry,
                worker,
                now,
                lease_ms,
            } = op
            {
                runs.push(big(run.0));
                dispatches.push(small(dispatch.0));
                entries.push(entry.to_string());
                workers.push(worker.clone());
                nows.push(ms(*now));
                leases.push(big(*lease_ms));
            }
        }
        let rows = sqlx::query(sql::CLAIM_MANY)
            .bind(&runs)
            .bind(&dispatches)
            .bind(&entries)
            .bind(&workers)
            .bind(&nows)
            .bind(&leases)
            .fetch_all(&self.pool)
            .await?;
        let mut took = std::collections::BTreeMap::new();
        for r in rows {
            let run: i64 = r.try_get("run_id")?;
            took.insert(run, claimed_job(&r)?);
        }
        Ok(runs
            .iter()
            .map(|run| DbReply::Claimed(took.remove(run)))
            .collect())
    }

    async fn complete_many(&self, ops: &[DbOp]) -> Result<Vec<DbReply>, PgError> {
        let (mut runs, mut fences, mut results) = (vec![], vec![], vec![]);
        for op in ops {
            if let DbOp::Complete { run, fence, result } = op {
                runs.push(big(run.0));
                fences.push(big(fence.0));
                results.push(result.clone());
            }
        }
        let rows = sqlx::query(sql::COMPLETE_MANY)
            .bind(&runs)
            .bind(&fences)
            .bind(&results)
            .fetch_all(&self.pool)
            .await?;
        took(&runs, &rows)
    }

    async fn read_many(&self, ops: &[DbOp]) -> Result<Vec<DbReply>, PgError> {
        let runs: Vec<i64> = ops
            .iter()
            .filter_map(|op| match op {
                DbOp::ReadRun { run } => Some(big(run.0)),
                _ => None,
            })
            .collect();
        let rows = sqlx::query(sql::READ_RUN_MANY)
            .bind(&runs)
            .fetch_all(&self.pool)
            .await?;
        let mut found = std::collections::BTreeMap::new();
        for r in rows {
            let row = run_row(&r)?;
            found.insert(big(row.run_id.0), row);
        }
        // A run read twice in one batch gets its row twice.
        Ok(runs
            .iter()
            .map(|run| DbReply::Run(found.get(run).cloned()))
            .collect())
    }

    async fn complete_unfenced_many(&self, ops: &[DbOp]) -> Result<Vec<DbReply>, PgError> {
        let (mut runs, mut results) = (vec![], vec![]);
        for op in ops {
            if let DbOp::CompleteUnfenced { run, result } = op {
                runs.push(big(run.0));
                results.push(result.clone());
            }
        }
        let rows = sqlx::query(sql::COMPLETE_UNFENCED_MANY)
            .bind(&runs)
            .bind(&results)
            .fetch_all(&self.pool)
            .await?;
        took(&runs, &rows)
    }
}

/// The answers to a batch of writes on `runs` whose statement returned the
/// `run_id` of each write that took: one row affected, or none.
fn took(runs: &[i64], rows: &[PgRow]) -> Result<Vec<DbReply>, PgError> {
    let mut took = std::collections::BTreeSet::new();
    for r in rows {
        took.insert(r.try_get::<i64, _>("run_id")?);
    }
    Ok(runs
        .iter()
        .map(|run| DbReply::Rows(u64::from(took.contains(run))))
        .collect())
}

/// A claim's answer row: the new fence, the attempt, and what to run.
fn claimed_job(r: &PgRow) -> Result<ClaimedJob, PgError> {
    Ok(ClaimedJob {
        claimed: Claimed {
            fence: Fence(unsigned("active_fence", r.try_get("active_fence")?)?),
            attempt: AttemptNo(unsigned32("attempts", r.try_get("attempts")?)?),
            attempts_max: unsigned32("attempts_max", r.try_get("attempts_max")?)?,
        },
        kind: r.try_get("kind")?,
        input: r.try_get("input")?,
    })
}

impl DbClient for PgDb {
    async fn call(&self, op: DbOp, by: Issuer) -> Result<DbReply, Unavailable> {
        self.execute(&op).await.map_err(|e| {
            tracing::warn!(error = %e, op = ?op, worker = ?by.worker, "statement failed");
            Unavailable
        })
    }

    async fn call_batch(&self, ops: Vec<(DbOp, Issuer)>) -> Result<Vec<DbReply>, Unavailable> {
        let ops: Vec<DbOp> = ops.into_iter().map(|(op, _)| op).collect();
        self.execute_batch(&ops).await.map_err(|e| {
            tracing::warn!(error = %e, commands = ops.len(), "batch failed");
            Unavailable
        })
    }
}

/// The demo tool service: the `effects` table counts the requests of each
/// idempotency key and applies the first (S5). It stands in for an external
/// API that deduplicates by key.
#[derive(Clone, Debug)]
pub struct PgTools(pub PgDb);

impl Tools for PgTools {
    fn apply(&self, _run: RunId, _call: u32, key: String) -> BoxFuture<Result<bool, Unavailable>> {
        let db = self.0.clone();
        Box::pin(async move {
            match db.execute(&DbOp::ApplyEffect { key }).await {
                Ok(DbReply::Rows(n)) => Ok(n == 1),
                Ok(_) => Err(Unavailable),
                Err(e) => {
                    tracing::warn!(error = %e, "tool service unavailable");
                    Err(Unavailable)
                }
            }
        })
    }
}

/// Runs a SQL text outside the protocol's statements (test and operator
/// tooling: creating and dropping databases).
///
/// # Errors
/// The statement failed.
pub async fn raw_execute(db: &PgDb, sql: &str) -> Result<u64, PgError> {
    let r = sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(&db.pool)
        .await?;
    Ok(r.rows_affected())
}
