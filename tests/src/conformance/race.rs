//! Every write that can hit a run, from every state the model can reach the
//! run in: alone, and racing another write in a second Postgres session.
//!
//! * **States.** What the statements can tell of a run ([`RunClass`]) is
//!   reached by a breadth-first search over the model's [`Db`]: one run,
//!   every write aimed at it ([`aimed`]), and time passing past every lease
//!   and back-off. Each class keeps the shortest path that reaches it.
//! * **Coverage.** Every write ([`writes`], and the batched form of those
//!   that have one) runs from every reachable class on the model and on
//!   Postgres, which must agree ([`db_case`]). The report counts, per
//!   statement, the classes it ran from; a reachable class some statement
//!   never ran from fails the suite, since random sequences that never
//!   reach a state prove nothing about it.
//! * **Races.** From every class, for each write A that changes the run and
//!   every write B, A runs in an open transaction in one session and B in
//!   another, then A commits. If B waited for A's row lock, both answers
//!   and the rows must be the model's A-then-B; if B went through without
//!   waiting (its snapshot did not match the row, or it skips locked rows),
//!   the model's B-then-A, where a statement that skips locked rows finds
//!   nothing. Each pair runs in both orders. Lock clauses (`FOR UPDATE SKIP
//!   LOCKED`, the re-check of a row an update waited for, snapshots read by
//!   a statement's other parts) are tested here, not trusted.

use super::db::{DbStep, START, db_case, migrated, reset, same_state};
use pelican_model::db::{Access, Db, DbOp, DbReply, Pick, Statement};
use pelican_model::ids::{Dispatch, EntryId, Fence, RunId};
use pelican_model::schedule::{Catchup, Overlap};
use pelican_model::status::{ErrorClass, RunStatus};
use pelican_model::time::Timestamp;
use pelican_real::live::{PgDb, PgSession};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::time::{Duration, Instant};

/// The run every case is about.
pub const RUN: RunId = RunId(1);
/// Leases and back-offs of the aimed statements; a tick passes them all.
const LEASE_MS: u64 = 1_000;
const TICK: DbStep = DbStep::Clock(Timestamp(0));
const TICK_MS: u64 = 2_000;
/// How deep the search goes: deeper paths reach no new class.
const DEPTH: usize = 9;

/// What the statements can tell of a run: its status, and the facts their
/// conditions read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RunClass {
    /// No row: retention deleted it.
    pub gone: bool,
    /// Its status.
    pub status: RunStatus,
    /// Running with its lease expired, or waiting with its retry due.
    pub due: bool,
    /// No attempt left.
    pub exhausted: bool,
    /// Published (or taken by the outbox).
    pub published: bool,
    /// An operator requeued it from the dead-letter queue before.
    pub requeued: bool,
}

impl RunClass {
    /// The class of [`RUN`] in `db`.
    #[must_use]
    pub fn of(db: &Db) -> RunClass {
        let requeued = db.dead_letters.get(&RUN).is_some_and(|d| d.requeued);
        let Some(r) = db.runs.get(&RUN) else {
            return RunClass {
                gone: true,
                status: RunStatus::Succeeded,
                due: false,
                exhausted: false,
                published: false,
                requeued,
            };
        };
        let due = match r.status {
            RunStatus::Running => r.lease_until.is_some_and(|t| t <= db.clock),
            RunStatus::RetryWait | RunStatus::Delayed => r.retry_at.is_some_and(|t| t <= db.clock),
            _ => false,
        };
        RunClass {
            gone: false,
            status: r.status,
            due,
            exhausted: r.attempts >= r.attempts_max,
            published: r.published_at.is_some(),
            requeued,
        }
    }
}

impl fmt::Display for RunClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.gone {
            return f.write_str("deleted");
        }
        f.write_str(self.status.as_str())?;
        let facts: Vec<&str> = [
            (self.due, "due"),
            (self.exhausted, "exhausted"),
            (!self.published, "unpublished"),
            (self.requeued, "requeued from the DLQ"),
        ]
        .into_iter()
        .filter_map(|(on, what)| on.then_some(what))
        .collect();
        if !facts.is_empty() {
            write!(f, " ({})", facts.join(", "))?;
        }
        Ok(())
    }
}

/// The statements that write a run's row or write as its attempt: every
/// fenced write, and every write whose text updates or deletes `runs`
/// (read off the declarations, not listed by hand).
#[must_use]
pub fn writes() -> Vec<Statement> {
    Statement::ALL
        .iter()
        .copied()
        .filter(|s| match s.access() {
            Access::Read => false,
            Access::FencedWrite => true,
            Access::Write => {
                s.sql().contains("UPDATE runs") || s.sql().contains("DELETE FROM runs")
            }
        })
        .collect()
}

/// A write as a step: alone, or fused (its batched form, for one run).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Form {
    /// The statement.
    One(Statement),
    /// Its batched form.
    Fused(Statement),
}

impl Form {
    fn all() -> Vec<Form> {
        let mut forms: Vec<Form> = writes().into_iter().map(Form::One).collect();
        forms.extend(
            writes()
                .into_iter()
                .filter(|s| s.many_sql().is_some())
                .map(Form::Fused),
        );
        forms
    }

    fn name(self) -> String {
        match self {
            Form::One(s) => s.name().to_owned(),
            Form::Fused(s) => format!("{} (batched)", s.name()),
        }
    }

    /// The step that sends it, aimed at [`RUN`] as it is in `db`.
    fn step(self, db: &Db) -> DbStep {
        match self {
            Form::One(s) => DbStep::One(aimed(s, db)),
            Form::Fused(s) => DbStep::Batch(vec![aimed(s, db)]),
        }
    }

    /// Whether its text skips rows another session holds.
    fn skips_locked(self) -> bool {
        let (Form::One(s) | Form::Fused(s)) = self;
        s.sql().contains("SKIP LOCKED")
    }
}

/// Field values aimed at [`RUN`] as it is: its current fence, dispatch and
/// entry, so that each write does what it would do to the run now.
struct Aim<'a>(&'a Db);

impl Pick<RunId> for Aim<'_> {
    fn pick(&mut self, _: Statement, field: &'static str) -> RunId {
        if field == "after" { RunId(0) } else { RUN }
    }
}
impl Pick<Fence> for Aim<'_> {
    fn pick(&mut self, _: Statement, _: &'static str) -> Fence {
        self.0.runs.get(&RUN).map_or(Fence(0), |r| r.active_fence)
    }
}
impl Pick<Dispatch> for Aim<'_> {
    fn pick(&mut self, _: Statement, _: &'static str) -> Dispatch {
        self.0.runs.get(&RUN).map_or(Dispatch(1), |r| r.dispatch)
    }
}
impl Pick<EntryId> for Aim<'_> {
    fn pick(&mut self, s: Statement, _: &'static str) -> EntryId {
        let row = self.0.runs.get(&RUN);
        let current = row.and_then(|r| r.entry_id);
        let running = row.is_some_and(|r| r.status == RunStatus::Running);
        match s {
            // A reclaim takes a running run over through its own entry.
            Statement::Claim if running => current.unwrap_or(EntryId::new(1, 0)),
            // A new entry for the new publication or delivery.
            Statement::Claim | Statement::MarkPublished => {
                let n = current.map_or(0, |e| e.ms);
                EntryId::new(n + 1, 0)
            }
            _ => current.unwrap_or(EntryId::new(1, 0)),
        }
    }
}
impl Pick<Timestamp> for Aim<'_> {
    fn pick(&mut self, _: Statement, _: &'static str) -> Timestamp {
        self.0.clock
    }
}
impl Pick<Overlap> for Aim<'_> {
    fn pick(&mut self, _: Statement, _: &'static str) -> Overlap {
        Overlap::Queue
    }
}
impl Pick<Catchup> for Aim<'_> {
    fn pick(&mut self, _: Statement, _: &'static str) -> Catchup {
        Catchup::One
    }
}
impl Pick<ErrorClass> for Aim<'_> {
    fn pick(&mut self, s: Statement, _: &'static str) -> ErrorClass {
        match s {
            Statement::Fail => ErrorClass::Terminal,
            _ => ErrorClass::Retryable,
        }
    }
}
impl Pick<String> for Aim<'_> {
    fn pick(&mut self, _: Statement, field: &'static str) -> String {
        match field {
            "kind" => "noop".into(),
            "input" => "{}".into(),
            "worker" => "w1".into(),
            "result" => "\"ok\"".into(),
            _ => "boom".into(),
        }
    }
}
impl Pick<u64> for Aim<'_> {
    fn pick(&mut self, _: Statement, field: &'static str) -> u64 {
        match field {
            "keep_ms" | "grace_ms" | "after_published_ms" => 0,
            _ => LEASE_MS,
        }
    }
}
impl Pick<u32> for Aim<'_> {
    fn pick(&mut self, _: Statement, _: &'static str) -> u32 {
        1
    }
}
impl Pick<usize> for Aim<'_> {
    fn pick(&mut self, _: Statement, _: &'static str) -> usize {
        8
    }
}

/// Statement `s` aimed at [`RUN`] as it is in `db`.
#[must_use]
pub fn aimed(s: Statement, db: &Db) -> DbOp {
    DbOp::draw(s, &mut Aim(db))
}

/// The model after `step`.
fn apply(db: &mut Db, step: &DbStep) -> Vec<DbReply> {
    match step {
        DbStep::One(op) => vec![db.execute(op)],
        DbStep::Batch(ops) => db.execute_batch(ops),
        DbStep::Clock(_) => {
            db.clock = db.clock.add_ms(TICK_MS);
            Vec::new()
        }
    }
}

/// A path's steps with the ticks' times filled in, from [`START`].
fn timed(path: &[DbStep]) -> Vec<DbStep> {
    let mut at = START;
    path.iter()
        .map(|step| match step {
            DbStep::Clock(_) => {
                at = at.add_ms(TICK_MS);
                DbStep::Clock(at)
            }
            other => other.clone(),
        })
        .collect()
}

/// Every class the model can reach [`RUN`] in, with the shortest path to
/// it (from an empty database: the run inserted with two attempts).
#[must_use]
pub fn reachable() -> BTreeMap<RunClass, Vec<DbStep>> {
    let insert = DbStep::One(DbOp::InsertRun {
        run: RUN,
        kind: "noop".into(),
        input: "{}".into(),
        attempts_max: 2,
        budget_ms: 0,
        trace: String::new(),
        delay_ms: 0,
        at_ms: 0,
    });
    let mut start = Db::new();
    start.clock = START;
    apply(&mut start, &insert);
    let mut found = BTreeMap::from([(RunClass::of(&start), vec![insert.clone()])]);
    let mut seen = std::collections::HashSet::from([start.clone()]);
    let mut queue = VecDeque::from([(start, vec![insert])]);
    while let Some((db, path)) = queue.pop_front() {
        if path.len() > DEPTH {
            continue;
        }
        let mut nexts: Vec<DbStep> = Form::all().into_iter().map(|f| f.step(&db)).collect();
        nexts.push(TICK);
        for step in nexts {
            let mut next = db.clone();
            apply(&mut next, &step);
            if !seen.insert(next.clone()) {
                continue;
            }
            let mut p = path.clone();
            p.push(step);
            found
                .entry(RunClass::of(&next))
                .or_insert_with(|| p.clone());
            queue.push_back((next, p));
        }
    }
    found
        .into_iter()
        .map(|(class, path)| (class, timed(&path)))
        .collect()
}

/// The model at the end of `path`.
fn model_after(path: &[DbStep]) -> Db {
    let mut db = Db::new();
    db.clock = START;
    for step in path {
        match step {
            DbStep::Clock(at) => db.clock = *at,
            other => {
                apply(&mut db, other);
            }
        }
    }
    db
}

/// What the suite found.
#[derive(Debug, Default)]
pub struct Report {
    /// Reachable classes.
    pub classes: usize,
    /// Statement (form) → classes it ran from.
    pub coverage: BTreeMap<String, BTreeSet<RunClass>>,
    /// Races run.
    pub races: usize,
    /// Of those, the ones where B waited for A's lock.
    pub waited: usize,
    /// Differences from the model, and classes some statement missed.
    pub failures: Vec<String>,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} reachable run states; every write from each, alone and racing:",
            self.classes
        )?;
        for (name, classes) in &self.coverage {
            writeln!(f, "  {name:<32} from {} states", classes.len())?;
        }
        write!(
            f,
            "{} races in two sessions, {} with the second waiting for the first's row lock",
            self.races, self.waited
        )
    }
}

/// Runs the suite against the database at `url` (migrated first).
///
/// # Panics
/// When Postgres cannot be reached.
#[must_use]
pub fn run(url: &str) -> Report {
    let db = migrated(url);
    let races = crate::rt().block_on(async {
        // Two sessions to race, and one to prepare and to look.
        PgDb::connect(url, 3, Duration::from_secs(10))
            .await
            .expect("the conformance database answers")
    });
    crate::rt().block_on(suite(&db, &races))
}

async fn suite(db: &PgDb, pool: &PgDb) -> Report {
    let classes = reachable();
    let mut report = Report {
        classes: classes.len(),
        ..Report::default()
    };
    let forms = Form::all();
    for (class, path) in &classes {
        let at = model_after(path);
        for form in &forms {
            let mut steps = path.clone();
            steps.push(form.step(&at));
            match db_case(db, &steps).await {
                Ok(_) => {
                    report
                        .coverage
                        .entry(form.name())
                        .or_default()
                        .insert(*class);
                }
                Err(e) => report
                    .failures
                    .push(format!("{} from {class}: {e}", form.name())),
            }
        }
    }
    for form in &forms {
        let ran = report.coverage.get(&form.name()).map_or(0, BTreeSet::len);
        if ran < classes.len() {
            report.failures.push(format!(
                "{} ran from {ran} of the {} reachable states",
                form.name(),
                classes.len()
            ));
        }
    }
    let (mut one, mut two) = (sessions(pool).await, sessions(pool).await);
    for (class, path) in &classes {
        let at = model_after(path);
        for a in &forms {
            let a_step = a.step(&at);
            let mut alone = at.clone();
            apply(&mut alone, &a_step);
            if alone == at {
                continue; // A changes nothing: no lock to wait for.
            }
            for b in &forms {
                let b_step = b.step(&at);
                report.races += 1;
                match race(
                    pool,
                    (&mut one, &mut two),
                    path,
                    (&a_step, &b_step),
                    b.skips_locked(),
                )
                .await
                {
                    Ok(waited) => report.waited += usize::from(waited),
                    Err(e) => report.failures.push(format!(
                        "{} racing {} from {class}: {e}",
                        a.name(),
                        b.name()
                    )),
                }
            }
        }
    }
    report
}

async fn sessions(db: &PgDb) -> PgSession {
    db.session().await.expect("a session of its own")
}

/// One race from the end of `path`: A in an open transaction of session
/// one, B in session two, then A commits. Answers whether B waited.
async fn race(
    db: &PgDb,
    (one, two): (&mut PgSession, &mut PgSession),
    path: &[DbStep],
    (a, b): (&DbStep, &DbStep),
    b_skips_locked: bool,
) -> Result<bool, String> {
    let pg = |e: pelican_real::live::pg::PgError| e.to_string();
    reset(db).await?;
    let mut clock = START;
    for s in [&mut *one, &mut *two] {
        s.raw(&format!("ROLLBACK; SET pelican.now_ms = '{}'", clock.0))
            .await
            .map_err(pg)?;
    }
    for step in path {
        match step {
            DbStep::Clock(at) => {
                clock = *at;
                for s in [&mut *one, &mut *two] {
                    s.raw(&format!("SET pelican.now_ms = '{}'", clock.0))
                        .await
                        .map_err(pg)?;
                }
            }
            other => {
                send(one, other).await.map_err(pg)?;
            }
        }
    }
    let at = model_after(path);
    let (one_pid, two_pid) = (one.pid().await.map_err(pg)?, two.pid().await.map_err(pg)?);
    one.raw("BEGIN").await.map_err(pg)?;
    let got_a = send(one, a).await.map_err(pg)?;
    let (got_b, waited) = {
        let b_fut = send(two, b);
        tokio::pin!(b_fut);
        let started = Instant::now();
        let mut waited = false;
        loop {
            tokio::select! {
                got = &mut b_fut => break (got, waited),
                () = tokio::time::sleep(Duration::from_millis(5)) => {
                    if !waited && blocked(db, two_pid, one_pid).await? {
                        waited = true;
                        one.raw("COMMIT").await.map_err(pg)?;
                    } else if started.elapsed() > Duration::from_secs(5) {
                        return Err("the second statement neither ran nor waited".into());
                    }
                }
            }
        }
    };
    let got_b = got_b.map_err(pg)?;
    if !waited {
        one.raw("COMMIT").await.map_err(pg)?;
    }
    let mut model = at.clone();
    let (want_a, want_b) = if waited {
        let want_a = apply(&mut model, a);
        (want_a, apply(&mut model, b))
    } else if b_skips_locked {
        let want_a = apply(&mut model, a);
        let mut without = at.clone();
        without.runs.remove(&RUN);
        (want_a, apply(&mut without, b))
    } else {
        let want_b = apply(&mut model, b);
        (apply(&mut model, a), want_b)
    };
    let order = if waited {
        "A then B"
    } else {
        "B, A waiting to commit"
    };
    if (&got_a, &got_b) != (&want_a, &want_b) {
        return Err(format!(
            "{order}: Postgres answered {got_a:?} and {got_b:?}, the model {want_a:?} and {want_b:?}"
        ));
    }
    same_state(&model, db)
        .await
        .map_err(|e| format!("{order}: {e}"))?;
    Ok(waited)
}

async fn send(
    s: &mut PgSession,
    step: &DbStep,
) -> Result<Vec<DbReply>, pelican_real::live::pg::PgError> {
    match step {
        DbStep::One(op) => Ok(vec![s.execute(op).await?]),
        DbStep::Batch(ops) => s.execute_batch(ops).await,
        DbStep::Clock(_) => Ok(Vec::new()),
    }
}

/// Whether the server process `pid` waits for a lock `by` holds (not for
/// one another process holds a moment, such as autovacuum truncating a
/// table the deletes of [`reset`] emptied).
async fn blocked(db: &PgDb, pid: i32, by: i32) -> Result<bool, String> {
    sqlx::query_scalar::<_, bool>("SELECT $2 = ANY (pg_blocking_pids($1))")
        .bind(pid)
        .bind(by)
        .fetch_one(db.pool())
        .await
        .map_err(|e| e.to_string())
}
