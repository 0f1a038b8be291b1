//! The database client on Postgres (sqlx, a connection pool).
//!
//! Nothing here knows a statement by name: each [`DbOp`] sends its
//! declared text ([`Statement::sql`]) with its parameters
//! ([`DbOp::params`]) bound in order, and its rows are decoded by the shape
//! of its answer (`rows.rs`) into the same [`DbReply`] the reference twin in
//! `pelican_model::Db` gives. Every time is Postgres's own clock
//! (`pelican_now_ms()`). The schema is the model's migrations
//! (`pelican_model::db::sql`), applied as embedded sqlx migrations
//! ([`migrator`]).

use crate::driver::{BoxFuture, DbClient, Tools};
use pelican_model::db::{
    Access, AnswerOf, Column, DbOp, DbReply, Param, Query, Shape, Statement, columns, query, sql,
};
use pelican_model::ids::{Fence, RunId};
use pelican_model::protocol::Unavailable;
use sqlx::SqlSafeStr;
use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::postgres::{PgPool, PgPoolOptions};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

mod rows;
mod snapshot;

/// The connections each `pelican` process's pool opens at most (it opens
/// them as its load needs, and keeps them).
pub const POOL_MAX: u32 = 16;

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
    /// The reply is not the statement's typed answer ([`PgDb::query`]).
    #[error(transparent)]
    Unfit(#[from] pelican_model::db::Unfit),
    /// A stored value the model cannot represent.
    #[error("unexpected value in column {column}: {value:?}")]
    Corrupt {
        /// The column.
        column: &'static str,
        /// What it held.
        value: String,
    },
}

/// The embedded migrations, in order: each is one constant of
/// `pelican_model::db::sql`, whose doc says what it changes.
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
        migration(3, "submission keys", sql::SCHEMA_SUBMIT_KEYS),
        migration(4, "one clock", sql::SCHEMA_ONE_CLOCK),
        migration(5, "worker registry", sql::SCHEMA_WORKERS),
        migration(6, "live runs and retention", sql::SCHEMA_LIVE),
        migration(7, "execution ledger", sql::SCHEMA_STEPS),
        migration(8, "retry policy", sql::SCHEMA_RETRY_POLICY),
        migration(9, "elapsed budgets", sql::SCHEMA_BUDGET),
        migration(10, "provider limits", sql::SCHEMA_LIMITS),
        migration(11, "run events", sql::SCHEMA_EVENTS),
        migration(12, "sweeper index", sql::SCHEMA_SWEEP),
        migration(13, "live counts", sql::SCHEMA_COUNTS),
        migration(14, "success on the run", sql::SCHEMA_SUCCESS_ON_RUN),
        migration(15, "retention without a foreign key", sql::SCHEMA_RETENTION),
        migration(
            16,
            "exact rates and deployment settings",
            sql::SCHEMA_EXACT_RATES,
        ),
        migration(17, "due retries in order", sql::SCHEMA_RETRY_ORDER),
        migration(18, "trace context", sql::SCHEMA_TRACE),
        migration(19, "attempt times", sql::SCHEMA_ATTEMPT_TIMES),
        migration(20, "delayed runs", sql::SCHEMA_DELAYED),
        migration(21, "cron schedules", sql::SCHEMA_SCHEDULES),
    ])
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
    /// And with `enable_bitmapscan = off` and `enable_seqscan = off`:
    /// every statement of Pelican's finds its rows by key or through an
    /// index in the index's order, and the planner, without the statistics
    /// of a table filled faster than autovacuum analyzes it, may not see it
    /// (`auto_explain`):
    ///
    /// * A generic plan takes a range bound by parameters for a few rows,
    ///   and for a few rows a bitmap scan and a sort look cheaper than an
    ///   index scan in order that stops at the `LIMIT`: the sweeper's
    ///   listing (`OrphanCandidates`) read every candidate up to its cutoff
    ///   to keep a batch of them, 46 ms a pass (median, up to 121 ms) with
    ///   200,000 runs wiped from Redis, 9.6 s of the 25 s it took to put
    ///   them back in the stream; 17 s without.
    /// * Without statistics a column is taken for 200 distinct values:
    ///   retention's delete of a batch's attempts by `run_id = ANY(...)`
    ///   was a sequential scan of `attempts`, 2.7 s a pass of 1,000 at
    ///   764,000 rows, though `attempts_pkey` leads with `run_id`.
    ///
    /// A query with no index to use still scans (an operator's count of
    /// every run by status, say): the settings only price the scan out
    /// where an index serves. And with `jit = off`: a plan that still
    /// holds a scan priced out costs more than `jit_above_cost`, and its
    /// compilation took 122 ms of every 64th statement's count trigger
    /// (the merge of `run_count_deltas`); no statement of Pelican's runs
    /// long enough for compiled expressions to pay.
    ///
    /// # Errors
    /// The URL is invalid or the server cannot be reached.
    pub async fn connect(
        url: &str,
        max_connections: u32,
        acquire_timeout: Duration,
    ) -> Result<PgDb, PgError> {
        let options = url.parse::<sqlx::postgres::PgConnectOptions>()?.options([
            ("plan_cache_mode", "force_generic_plan"),
            ("enable_bitmapscan", "off"),
            ("enable_seqscan", "off"),
            ("jit", "off"),
        ]);
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
    /// (for tests and operators' checks: the invariants run over it), all
    /// read at one moment.
    ///
    /// # Errors
    /// A query failed or a stored value is not representable.
    pub async fn snapshot(&self) -> Result<pelican_model::Db, PgError> {
        // One transaction, so that the tables agree with each other while
        // the processes go on writing (retention deleting a run's rows,
        // say): every read sees the same moment.
        let mut tx = self.pool.begin().await?;
        sqlx::query(sql::snapshot::ISOLATION)
            .execute(&mut *tx)
            .await?;
        let mut db = pelican_model::Db::new();
        snapshot::read_records(&mut tx, &mut db).await?;
        snapshot::read_workers_and_limits(&mut tx, &mut db).await?;
        tx.commit().await?;
        Ok(db)
    }

    /// Runs one statement: its text, its parameters bound in order, its
    /// rows decoded by its answer's shape.
    ///
    /// # Errors
    /// The statement failed or returned a value the model cannot hold.
    pub async fn execute(&self, op: &DbOp) -> Result<DbReply, PgError> {
        run_one(&mut *self.pool.acquire().await?, op).await
    }

    /// Runs the statement `q`: its typed answer.
    ///
    /// # Errors
    /// As [`PgDb::execute`], or Postgres refused the values
    /// ([`PgError::Unfit`]).
    pub async fn query<Q: Query>(&self, q: Q) -> Result<AnswerOf<Q>, PgError> {
        let op: DbOp = q.into();
        Ok(Q::answer(op.statement(), self.execute(&op).await?)?)
    }

    /// Runs the statements `qs` as a batch ([`PgDb::execute_batch`]): their
    /// typed answers, in order.
    ///
    /// # Errors
    /// As [`PgDb::execute_batch`], or Postgres refused one command's values
    /// ([`PgError::Unfit`]).
    pub async fn query_batch<Q: Query>(&self, qs: Vec<Q>) -> Result<Vec<AnswerOf<Q>>, PgError> {
        let ops: Vec<DbOp> = qs.into_iter().map(Into::into).collect();
        let replies = self.execute_batch(&ops).await?;
        let answers = ops.iter().zip(replies);
        answers
            .map(|(op, reply)| Ok(Q::answer(op.statement(), reply)?))
            .collect()
    }

    /// Runs `ops` as [`pelican_model::Db::execute_batch`] defines a batch:
    /// independent commands, each answering for itself. Commands of one
    /// statement that has a batched form ([`Statement::many_sql`]), on
    /// distinct runs unless they only read, go out as that one statement;
    /// any other batch runs statement by statement.
    ///
    /// A fused statement binds its commands in `run_id` order, so its row
    /// locks are taken in that order and two batches cannot deadlock on
    /// each other. When Postgres refuses a fused statement's values (one
    /// command's text holds a NUL byte), nothing of it took effect, and the
    /// batch runs again statement by statement: the refused command
    /// answers [`DbReply::Refused`], every other one for itself.
    ///
    /// # Errors
    /// When Postgres fails or answers something unexpected. For a fused
    /// batch, nothing took effect, or (a lost commit answer) everything did;
    /// statement by statement, the commands before the failing one took
    /// effect. Either way each command is as uncertain as a lost reply.
    pub async fn execute_batch(&self, ops: &[DbOp]) -> Result<Vec<DbReply>, PgError> {
        run_batch(&mut *self.pool.acquire().await?, ops).await
    }

    /// A session of its own (one connection of the pool, held until
    /// dropped): for transactions that span statements, which Pelican's
    /// roles never need, and tests that race two sessions do.
    ///
    /// # Errors
    /// No connection could be had.
    pub async fn session(&self) -> Result<PgSession, PgError> {
        Ok(PgSession {
            conn: self.pool.acquire().await?,
        })
    }
}

/// One connection, held: statements run in it as [`PgDb::execute`] and
/// [`PgDb::execute_batch`] run them, inside whatever transaction the
/// session has open ([`PgSession::raw`] `BEGIN` / `COMMIT`).
pub struct PgSession {
    conn: sqlx::pool::PoolConnection<sqlx::Postgres>,
}

impl PgSession {
    /// As [`PgDb::execute`], in this session.
    ///
    /// # Errors
    /// As [`PgDb::execute`].
    pub async fn execute(&mut self, op: &DbOp) -> Result<DbReply, PgError> {
        run_one(&mut self.conn, op).await
    }

    /// As [`PgDb::query`], in this session.
    ///
    /// # Errors
    /// As [`PgDb::query`].
    pub async fn query<Q: Query>(&mut self, q: Q) -> Result<AnswerOf<Q>, PgError> {
        let op: DbOp = q.into();
        Ok(Q::answer(op.statement(), self.execute(&op).await?)?)
    }

    /// As [`PgDb::execute_batch`], in this session.
    ///
    /// # Errors
    /// As [`PgDb::execute_batch`].
    pub async fn execute_batch(&mut self, ops: &[DbOp]) -> Result<Vec<DbReply>, PgError> {
        run_batch(&mut self.conn, ops).await
    }

    /// Runs SQL text of the caller's (`BEGIN`, `COMMIT`, `SET ...`).
    ///
    /// # Errors
    /// Postgres failed it.
    pub async fn raw(&mut self, sql: &str) -> Result<(), PgError> {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
            .execute(&mut *self.conn)
            .await?;
        Ok(())
    }

    /// The server process of this session (`pg_backend_pid()`).
    ///
    /// # Errors
    /// Postgres failed to answer.
    pub async fn pid(&mut self) -> Result<i32, PgError> {
        Ok(sqlx::query_scalar(sql::BACKEND_PID)
            .fetch_one(&mut *self.conn)
            .await?)
    }
}

/// One statement on `conn`: its text, its parameters bound in order, its
/// rows decoded by its answer's shape.
async fn run_one(conn: &mut sqlx::PgConnection, op: &DbOp) -> Result<DbReply, PgError> {
    let statement = op.statement();
    let mut query = sqlx::query(statement.sql());
    for param in op.params() {
        query = match param {
            Param::Int8(v) => query.bind(v),
            Param::Int4(v) => query.bind(v),
            Param::Text(v) => query.bind(v),
        };
    }
    let answer = if statement.shape() == Shape::Rows {
        query
            .execute(&mut *conn)
            .await
            .map(|done| (Vec::new(), done.rows_affected()))
    } else {
        query.fetch_all(&mut *conn).await.map(|rows| (rows, 0))
    };
    match answer {
        Ok((found, affected)) => rows::reply(statement.shape(), &found, affected),
        Err(e) if is_refusal(&e) => {
            tracing::warn!(error = %e, statement = statement.name(), "Postgres refused the values");
            Ok(DbReply::Refused)
        }
        Err(e) => Err(e.into()),
    }
}

/// A batch on `conn` ([`PgDb::execute_batch`]).
async fn run_batch(conn: &mut sqlx::PgConnection, ops: &[DbOp]) -> Result<Vec<DbReply>, PgError> {
    if let Some((statement, sql)) = batched_form(ops) {
        let mut params: Vec<Vec<Param>> = ops.iter().map(DbOp::params).collect();
        let runs: Vec<RunId> = params.iter().map(|p| batch_key(p)).collect();
        let mut seen = BTreeSet::new();
        if (statement.access() == Access::Read || runs.iter().all(|r| seen.insert(*r)))
            && distinct_keys(ops)
        {
            params.sort_by_key(|p| batch_key(p));
            match run_many(&mut *conn, statement.shape(), sql, params, &runs).await {
                Err(PgError::Sql(e)) if is_refusal(&e) => {
                    tracing::warn!(error = %e, statement = statement.name(), commands = ops.len(),
                        "Postgres refused a batch's values: running it statement by statement");
                }
                answer => return answer,
            }
        }
    }
    let mut replies = Vec::with_capacity(ops.len());
    for op in ops {
        replies.push(run_one(&mut *conn, op).await?);
    }
    Ok(replies)
}

/// One batched statement on `conn`: `params` bound as columns, each answer
/// row given to the command of its run.
async fn run_many(
    conn: &mut sqlx::PgConnection,
    shape: Shape,
    sql: &'static str,
    params: Vec<Vec<Param>>,
    runs: &[RunId],
) -> Result<Vec<DbReply>, PgError> {
    let mut query = sqlx::query(sql);
    for column in columns(params) {
        query = match column {
            Column::Int8(v) => query.bind(v),
            Column::Int4(v) => query.bind(v),
            Column::Text(v) => query.bind(v),
        };
    }
    let found = query.fetch_all(&mut *conn).await?;
    let mut by_run = BTreeMap::new();
    for row in &found {
        by_run.insert(rows::run_id(row)?, row);
    }
    runs.iter()
        .map(|run| rows::reply_of(shape, by_run.get(run).copied()))
        .collect()
}

/// Whether Postgres refused a statement's values (SQLSTATE class 22, data
/// exception: text holding a NUL byte is 22021), having applied nothing.
fn is_refusal(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(d) if d.code().is_some_and(|c| c.starts_with("22")))
}

/// Whether no idempotency key comes twice in `ops`: a fused keyed insert
/// takes each key once (a second would be the first's run, in order, which
/// one statement cannot say), so a batch that repeats one runs statement
/// by statement.
fn distinct_keys(ops: &[DbOp]) -> bool {
    let mut keys = BTreeSet::new();
    ops.iter().all(|op| match op {
        DbOp::InsertRunKeyed { key, .. } => keys.insert(key.as_str()),
        _ => true,
    })
}

/// The run a command of a batched form answers for: its first parameter.
fn batch_key(params: &[Param]) -> RunId {
    match params.first() {
        Some(Param::Int8(run)) => RunId(u64::try_from(*run).unwrap_or_default()),
        _ => unreachable!("a batched form is keyed by its first parameter, the run"),
    }
}

/// The statement and batched text `ops` may go out as: every command of
/// one statement that has a batched form.
fn batched_form(ops: &[DbOp]) -> Option<(Statement, &'static str)> {
    let statement = ops.first()?.statement();
    let sql = statement.many_sql()?;
    ops.iter()
        .all(|op| op.statement() == statement)
        .then_some((statement, sql))
}

impl DbClient for PgDb {
    async fn call(&self, op: DbOp) -> Result<DbReply, Unavailable> {
        self.execute(&op).await.map_err(|e| {
            // The statement's name and ids (`describe`), never its values:
            // inputs, results, steps' outputs and progress are users' data.
            tracing::warn!(error = %e, op = %op.describe(), "statement failed");
            Unavailable
        })
    }

    async fn call_batch(&self, ops: Vec<DbOp>) -> Result<Vec<DbReply>, Unavailable> {
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
    fn apply(
        &self,
        _run: RunId,
        _call: u32,
        _fence: Fence,
        key: String,
    ) -> BoxFuture<Result<bool, Unavailable>> {
        let db = self.0.clone();
        Box::pin(async move {
            match db.query(query::ApplyEffect { key }).await {
                Ok(applied) => Ok(applied),
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
