//! Fused batches take their row locks in `run_id` order, so two batches
//! over the same runs never deadlock, whatever order their commands came in.
//!
//! Two holders lock runs 1 and 2 in open transactions. Batch A (claims of
//! runs 1, 2) queues behind them, then batch B (claims of runs 2, 1). The
//! holders commit, run 1's first.
//!
//! * Bound as given ([`Binding::AsGiven`]), A takes run 1 and waits for
//!   run 2, which B takes as soon as its holder commits; B then waits for
//!   run 1. Postgres finds the cycle and aborts one batch: the scenario can
//!   deadlock.
//! * Bound as Pelican binds them ([`Binding::Pelican`], by run), both want
//!   run 1 first, so B waits for A, which claims both; B finds both taken.
//!   Answers and rows are the model's A-then-B.
//!
//! The racers plan the batch as on a large table: a nested loop over the
//! batch's rows, each found by its primary key, so that row locks follow
//! the binding order. (On a tiny table Postgres would scan `runs` in heap
//! order, and no binding could deadlock.)

use super::db::{START, migrated, reset, same_state};
use pelican_model::db::{Column, Db, DbOp, DbReply, columns};
use pelican_model::ids::{Dispatch, EntryId, RunId};
use pelican_real::live::{PgDb, PgSession};
use sqlx::Connection;
use std::time::{Duration, Instant};

/// How a racing batch is bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Binding {
    /// Pelican's [`PgSession::execute_batch`].
    Pelican,
    /// The same fused statement, its commands bound in the order given
    /// (the control: what Pelican would do without sorting).
    AsGiven,
}

const RUNS: [RunId; 2] = [RunId(1), RunId(2)];
/// The plan of a large table (see the module's documentation).
const PLAN: &str = "SET enable_seqscan = off; SET enable_bitmapscan = off; \
                    SET enable_hashjoin = off; SET enable_mergejoin = off";
const PATIENCE: Duration = Duration::from_secs(10);

fn claims(order: [RunId; 2], worker: &str) -> Vec<DbOp> {
    order
        .map(|run| DbOp::Claim {
            run,
            dispatch: Dispatch(1),
            entry: EntryId::new(run.0, 0),
            worker: worker.to_owned(),
            lease_ms: 60_000,
        })
        .to_vec()
}

/// One racing session.
enum Racer {
    Pelican(PgSession),
    AsGiven(sqlx::PgConnection),
}

impl Racer {
    async fn pid(&mut self) -> Result<i32, String> {
        match self {
            Racer::Pelican(s) => s.pid().await.map_err(|e| e.to_string()),
            Racer::AsGiven(c) => sqlx::query_scalar("SELECT pg_backend_pid()")
                .fetch_one(&mut *c)
                .await
                .map_err(|e| e.to_string()),
        }
    }

    async fn raw(&mut self, sql: &str) -> Result<(), String> {
        match self {
            Racer::Pelican(s) => s.raw(sql).await.map_err(|e| e.to_string()),
            Racer::AsGiven(c) => sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
                .execute(&mut *c)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string()),
        }
    }

    /// Sends the batch. The control's answers are not decoded: only
    /// whether Postgres took the statement matters there.
    async fn send(mut self, ops: Vec<DbOp>) -> Result<Vec<DbReply>, String> {
        match &mut self {
            Racer::Pelican(s) => s.execute_batch(&ops).await.map_err(|e| e.to_string()),
            Racer::AsGiven(c) => {
                let sql = ops[0]
                    .statement()
                    .many_sql()
                    .expect("claims have a fused form");
                let mut query = sqlx::query(sql);
                for column in columns(ops.iter().map(DbOp::params).collect()) {
                    query = match column {
                        Column::Int8(v) => query.bind(v),
                        Column::Int4(v) => query.bind(v),
                        Column::Text(v) => query.bind(v),
                    };
                }
                query
                    .execute(&mut *c)
                    .await
                    .map(|_| Vec::new())
                    .map_err(|e| e.to_string())
            }
        }
    }
}

/// Runs the scenario against the database at `url` (migrated, then
/// emptied).
///
/// # Errors
/// A batch Postgres failed (with [`Binding::AsGiven`], the deadlock), or,
/// with [`Binding::Pelican`], answers or rows other than the model's.
///
/// # Panics
/// When Postgres cannot be reached.
pub fn opposite_batches(url: &str, binding: Binding) -> Result<(), String> {
    let db = migrated(url);
    crate::rt().block_on(race(url, &db, binding))
}

async fn race(url: &str, db: &PgDb, binding: Binding) -> Result<(), String> {
    let pg = |e: pelican_real::live::pg::PgError| e.to_string();
    reset(db).await?;
    let mut model = Db::new();
    model.clock = START;
    for run in RUNS {
        let insert = DbOp::InsertRun {
            run,
            kind: "noop".into(),
            input: "{}".into(),
            attempts_max: 3,
            budget_ms: 0,
            trace: String::new(),
            delay_ms: 0,
            at_ms: 0,
        };
        model.execute(&insert);
        db.execute(&insert).await.map_err(pg)?;
    }
    let pool = PgDb::connect(url, 4, PATIENCE).await.map_err(pg)?;
    let mut racers = Vec::new();
    for _ in 0..2 {
        let mut racer = match binding {
            Binding::Pelican => Racer::Pelican(pool.session().await.map_err(pg)?),
            Binding::AsGiven => Racer::AsGiven(
                sqlx::PgConnection::connect(url)
                    .await
                    .map_err(|e| e.to_string())?,
            ),
        };
        racer
            .raw(&format!("{PLAN}; SET pelican.now_ms = '{}'", START.0))
            .await?;
        racers.push(racer);
    }
    let (mut b, mut a) = (racers.pop().expect("two"), racers.pop().expect("two"));
    let (a_pid, b_pid) = (a.pid().await?, b.pid().await?);
    // holders[0] holds run 1, holders[1] run 2.
    let mut holders = [
        pool.session().await.map_err(pg)?,
        pool.session().await.map_err(pg)?,
    ];
    let mut holder_pids = [0; 2];
    for ((h, pid), run) in holders.iter_mut().zip(&mut holder_pids).zip(RUNS) {
        *pid = h.pid().await.map_err(pg)?;
        h.raw(&format!(
            "BEGIN; SELECT run_id FROM runs WHERE run_id = {} FOR UPDATE",
            run.0
        ))
        .await
        .map_err(pg)?;
    }
    let a_ops = claims(RUNS, "a");
    let b_ops = claims([RUNS[1], RUNS[0]], "b");
    let a_task = tokio::spawn(a.send(a_ops.clone()));
    until(db, "A waits for run 1's holder", a_pid, |by| {
        by == [holder_pids[0]]
    })
    .await?;
    let b_task = tokio::spawn(b.send(b_ops.clone()));
    until(db, "B waits", b_pid, |by| !by.is_empty()).await?;
    holders[0].raw("COMMIT").await.map_err(pg)?;
    until(db, "A takes run 1 and waits at run 2", a_pid, |by| {
        !by.is_empty() && !by.contains(&holder_pids[0])
    })
    .await?;
    holders[1].raw("COMMIT").await.map_err(pg)?;
    let joined = |r: Result<Result<Vec<DbReply>, String>, tokio::task::JoinError>| {
        r.map_err(|e| e.to_string()).and_then(|r| r)
    };
    let (got_a, got_b) = tokio::time::timeout(PATIENCE, async {
        (joined(a_task.await), joined(b_task.await))
    })
    .await
    .map_err(|_| "the batches did not finish".to_owned())?;
    let (got_a, got_b) = (
        got_a.map_err(|e| format!("A: {e}"))?,
        got_b.map_err(|e| format!("B: {e}"))?,
    );
    if binding == Binding::AsGiven {
        return Ok(());
    }
    let want = (model.execute_batch(&a_ops), model.execute_batch(&b_ops));
    if (&got_a, &got_b) != (&want.0, &want.1) {
        return Err(format!(
            "Postgres answered {got_a:?} and {got_b:?}, the model's A-then-B {:?} and {:?}",
            want.0, want.1
        ));
    }
    same_state(&model, db).await
}

/// Waits until the sessions blocking `pid` satisfy `ok`.
pub(super) async fn until(
    db: &PgDb,
    what: &str,
    pid: i32,
    ok: impl Fn(&[i32]) -> bool,
) -> Result<(), String> {
    let started = Instant::now();
    loop {
        let by: Vec<i32> = sqlx::query_scalar("SELECT pg_blocking_pids($1)")
            .bind(pid)
            .fetch_one(db.pool())
            .await
            .map_err(|e| e.to_string())?;
        if ok(&by) {
            return Ok(());
        }
        if started.elapsed() > PATIENCE {
            return Err(format!("{what}: still blocked by {by:?}"));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
