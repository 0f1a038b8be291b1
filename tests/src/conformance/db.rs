//! Database conformance: every statement declared in
//! [`pelican_model::db::Statement`] (the mutants' too, in a build with
//! them), drawn from small domains so that sequences hit the same runs,
//! fences and dispatches often; alone, as a fused batch on distinct runs,
//! and in mixed batches.

use super::{Outcome, runner};
use pelican_model::db::{Db, DbOp, DbReply, Pick, Statement};
use pelican_model::ids::{Dispatch, EntryId, Fence, RunId};
use pelican_model::schedule::{Catchup, Overlap};
use pelican_model::status::ErrorClass;
use pelican_model::time::Timestamp;
use pelican_real::live::PgDb;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use std::time::Duration;

/// One step of a database sequence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DbStep {
    /// One statement.
    One(DbOp),
    /// A batch ([`Db::execute_batch`]).
    Batch(Vec<DbOp>),
    /// Postgres's clock moves to this time ([`Db::clock`]; in Postgres,
    /// `SET pelican.now_ms`, which `pelican_now_ms()` reads).
    Clock(Timestamp),
}

/// The clock a sequence starts at.
pub const START: Timestamp = Timestamp(1_000);

/// Pins the clock of Postgres's session (the suite's pool has one).
pub(super) async fn set_clock(db: &PgDb, at: Timestamp) -> Result<(), String> {
    pelican_real::live::pg::raw_execute(db, &format!("SET pelican.now_ms = '{}'", at.0))
        .await
        .map(|_| ())
        .map_err(|e| format!("setting the clock: {e}"))
}

/// How often a statement is drawn, against 1 for the rest: runs must exist
/// and be claimed for the other statements to find something.
fn weight(s: Statement) -> u64 {
    match s {
        Statement::InsertRun | Statement::Claim => 3,
        Statement::MarkPublished
        | Statement::Heartbeat
        | Statement::Complete
        | Statement::ScheduleRetry
        // The sweeper's order: candidates published in another order
        // than their ids.
        | Statement::OrphanCandidates => 2,
        _ => 1,
    }
}

/// Field values from a list of random words: each field takes the next
/// word and reduces it to its small domain (so shrinking a word toward 0
/// shrinks the value). `run` pins every run field, for batches on
/// distinct runs.
struct Words<'a> {
    words: &'a [u64],
    next: usize,
    run: Option<RunId>,
}

impl Words<'_> {
    fn word(&mut self) -> u64 {
        let w = self.words.get(self.next).copied().unwrap_or(0);
        self.next += 1;
        w
    }
}

impl Pick<RunId> for Words<'_> {
    fn pick(&mut self, _: Statement, _: &'static str) -> RunId {
        let w = self.word();
        self.run.unwrap_or(RunId(1 + w % 4))
    }
}
impl Pick<Fence> for Words<'_> {
    fn pick(&mut self, _: Statement, _: &'static str) -> Fence {
        Fence(self.word() % 5)
    }
}
impl Pick<Dispatch> for Words<'_> {
    fn pick(&mut self, _: Statement, _: &'static str) -> Dispatch {
        Dispatch(1 + (self.word() % 3) as u32)
    }
}
impl Pick<EntryId> for Words<'_> {
    fn pick(&mut self, _: Statement, _: &'static str) -> EntryId {
        EntryId::new(1 + self.word() % 6, 0)
    }
}
impl Pick<Timestamp> for Words<'_> {
    fn pick(&mut self, _: Statement, field: &'static str) -> Timestamp {
        let w = self.word();
        let drawn = Timestamp(1_000 * (w % 13) + 1_000);
        match field {
            // A tick's expected `next_tick`: half the time a schedule not
            // planned yet (0, as a put leaves it).
            "expect" if w.is_multiple_of(2) => Timestamp::ZERO,
            // Only planned, half the time.
            "tick" if w % 4 == 1 => Timestamp::ZERO,
            _ => drawn,
        }
    }
}
impl Pick<Overlap> for Words<'_> {
    fn pick(&mut self, _: Statement, _: &'static str) -> Overlap {
        Overlap::ALL[(self.word() % Overlap::ALL.len() as u64) as usize]
    }
}
impl Pick<Catchup> for Words<'_> {
    fn pick(&mut self, _: Statement, _: &'static str) -> Catchup {
        Catchup::ALL[(self.word() % Catchup::ALL.len() as u64) as usize]
    }
}
impl Pick<ErrorClass> for Words<'_> {
    fn pick(&mut self, _: Statement, _: &'static str) -> ErrorClass {
        [
            ErrorClass::Retryable,
            ErrorClass::Terminal,
            ErrorClass::Panic,
            ErrorClass::Exhausted,
            ErrorClass::Unstorable,
            ErrorClass::Unknown,
            ErrorClass::BudgetExhausted,
        ][(self.word() % 7) as usize]
    }
}
impl Pick<String> for Words<'_> {
    fn pick(&mut self, _: Statement, field: &'static str) -> String {
        let w = self.word();
        match field {
            "kind" => "noop".into(),
            "input" => ["{}", "{\"a\":1}"][(w % 2) as usize].into(),
            "worker" => format!("w{}", w % 3),
            // One in eight results and messages holds a NUL byte, which
            // Postgres refuses: alone, and in fused batches beside others.
            "result" if w % 8 == 7 => "\"r\u{0}\"".into(),
            "result" => format!("\"r{}\"", w % 3),
            "key" => format!("run-1/{}", w % 3),
            "provider" => ["p", "q"][(w % 2) as usize].into(),
            "holder" => format!("h{}", w % 3),
            // Two schedules, and what they run and when, stored as text.
            "name" | "schedule" => ["daily", "hourly"][(w % 2) as usize].into(),
            "cron" => ["* * * * * *", "0 9 * * 1-5"][(w % 2) as usize].into(),
            "tz" => ["UTC", "Europe/Berlin"][(w % 2) as usize].into(),
            // An operator's filter: any status, or one.
            "status" => [
                "",
                "queued",
                "running",
                "succeeded",
                "dead",
                "cancelled",
                "delayed",
            ][(w % 7) as usize]
                .into(),
            // None, or a caller's trace context, stored and answered as is.
            "trace" => [
                "",
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            ][(w % 2) as usize]
                .into(),
            _ if w % 8 == 7 => "bo\u{0}om".into(),
            _ => ["boom", "timeout"][(w % 2) as usize].into(),
        }
    }
}
impl Pick<u64> for Words<'_> {
    fn pick(&mut self, _: Statement, field: &'static str) -> u64 {
        let w = self.word();
        match field {
            "grace_ms" => w % 3_001,
            // The sweeper's cursor: from the start, or a published_at
            // among the drawn clocks.
            "after_published_ms" => [0, 1_000 * (w % 13) + 1_000][(w % 2) as usize],
            // No budget, or one that runs out within the drawn clocks.
            "budget_ms" => [0, 1_000, 5_000][(w % 3) as usize],
            // Mostly no delay; else one that ends within the drawn clocks,
            // or a due time among them (or past).
            "delay_ms" => [0, 0, 0, 1_000 * (w % 5) + 1][(w % 4) as usize],
            "at_ms" => [0, 0, 0, 1_000 * (w % 13) + 500][(w % 4) as usize],
            // No bound, or one among the drawn clocks.
            "ended_from_ms" | "ended_to_ms" => [0, 1_000 * (w % 13) + 1_000][(w % 2) as usize],
            _ => 2_000,
        }
    }
}
impl Pick<u32> for Words<'_> {
    fn pick(&mut self, _: Statement, _: &'static str) -> u32 {
        1 + (self.word() % 3) as u32
    }
}
impl Pick<usize> for Words<'_> {
    fn pick(&mut self, _: Statement, _: &'static str) -> usize {
        1 + (self.word() % 3) as usize
    }
}

/// The statement a word picks, by [`weight`].
fn statement(word: u64, among: &[Statement]) -> Statement {
    let total: u64 = among.iter().map(|s| weight(*s)).sum();
    let mut w = word % total;
    for &s in among {
        if w < weight(s) {
            return s;
        }
        w -= weight(s);
    }
    unreachable!("the word is below the total weight")
}

fn draw(s: Statement, words: &[u64], run: Option<RunId>) -> DbOp {
    DbOp::draw(
        s,
        &mut Words {
            words,
            next: 0,
            run,
        },
    )
}

/// One random step: mostly a single statement; otherwise a batch of one
/// statement that has a batched form, on distinct runs (reads may repeat),
/// or a mixed batch.
fn step() -> impl Strategy<Value = DbStep> {
    let words = || prop::collection::vec(any::<u64>(), 8);
    let one = (any::<u64>(), words())
        .prop_map(|(s, w)| DbStep::One(draw(statement(s, Statement::ALL), &w, None)));
    let fusable: Vec<Statement> = Statement::ALL
        .iter()
        .copied()
        .filter(|s| s.many_sql().is_some())
        .collect();
    let fused = (
        prop::sample::select(fusable),
        prop::sample::subsequence(vec![1u64, 2, 3, 4], 2..=4),
        prop::collection::vec(words(), 4),
    )
        .prop_map(|(s, runs, ws)| {
            DbStep::Batch(
                runs.into_iter()
                    .zip(ws)
                    .map(|(r, w)| draw(s, &w, Some(RunId(r))))
                    .collect(),
            )
        });
    let mixed = prop::collection::vec((any::<u64>(), words()), 2..=4).prop_map(|ops| {
        DbStep::Batch(
            ops.into_iter()
                .map(|(s, w)| draw(statement(s, Statement::ALL), &w, None))
                .collect(),
        )
    });
    let clock = any::<u64>().prop_map(|w| DbStep::Clock(Timestamp(1_000 * (w % 13) + 1_000)));
    prop_oneof![9 => one, 2 => fused, 1 => mixed, 1 => clock]
}

/// A random database sequence.
pub fn db_sequence() -> impl Strategy<Value = Vec<DbStep>> {
    prop::collection::vec(step(), 1..30)
}

/// Empties every table and restarts the run and worker ids.
///
/// DELETE, not TRUNCATE: a case holds a few rows, and TRUNCATE gives each
/// of the dozen tables it empties (with the live counts' trigger) new
/// files, which took 35–40 ms a case, most of a case's time. The counts'
/// triggers see the deletes; `setval` leaves no catalog change behind.
pub(super) async fn reset(db: &PgDb) -> Result<(), String> {
    pelican_real::live::pg::raw_execute(
        db,
        "DELETE FROM attempts; DELETE FROM dead_letters; DELETE FROM runs; \
         DELETE FROM effects; DELETE FROM submit_keys; DELETE FROM workers; \
         DELETE FROM steps; DELETE FROM provider_slots; DELETE FROM provider_rates; \
         DELETE FROM run_events; DELETE FROM deployment; DELETE FROM schedules; \
         SELECT setval('run_ids', 1, false), setval('schedule_ids', 1, false), \
         setval(pg_get_serial_sequence('workers', 'worker_id'), 1, false)",
    )
    .await
    .map(|_| ())
    .map_err(|e| format!("reset: {e}"))
}

/// Runs one database sequence on the model and on Postgres (emptied
/// first), and answers the model as the sequence left it. `Err` names the
/// first difference.
///
/// # Errors
/// The first statement whose answer differs, or the final rows.
pub async fn db_case(db: &PgDb, steps: &[DbStep]) -> Result<Db, String> {
    reset(db).await?;
    set_clock(db, START).await?;
    let mut model = Db::new();
    model.clock = START;
    for (i, step) in steps.iter().enumerate() {
        let (want, got) = match step {
            DbStep::Clock(at) => {
                model.clock = *at;
                set_clock(db, *at).await?;
                continue;
            }
            DbStep::One(op) => (
                vec![model.execute(op)],
                db.execute(op).await.map(|r| vec![r]),
            ),
            DbStep::Batch(ops) => (model.execute_batch(ops), db.execute_batch(ops).await),
        };
        let got =
            got.map_err(|e| format!("statement {} {step:?} failed on Postgres: {e}", i + 1))?;
        if want != got {
            return Err(format!(
                "statement {} {step:?}: model {want:?}, Postgres {got:?}",
                i + 1
            ));
        }
    }
    // The sequence is Postgres state too; the snapshot takes the largest id.
    model.run_ids = model.runs.keys().map(|r| r.0).max().unwrap_or(0);
    same_state(&model, db).await.map(|()| model)
}

/// Whether Postgres holds what the model does: every table
/// ([`same_rows`]), and the live runs' counts its triggers keep
/// ([`DbOp::CountLive`]), which must be the model's scan.
pub(super) async fn same_state(model: &Db, db: &PgDb) -> Result<(), String> {
    let live = db.snapshot().await.map_err(|e| format!("snapshot: {e}"))?;
    same_rows(model, &live)?;
    let counted = db
        .execute(&DbOp::CountLive)
        .await
        .map_err(|e| format!("counting live runs: {e}"))?;
    let scanned = DbReply::Counts(model.count_live());
    if counted != scanned {
        return Err(format!(
            "live runs counted {counted:?}, the model's scan {scanned:?}"
        ));
    }
    Ok(())
}

/// Whether every table of `live` (a Postgres snapshot) holds what the
/// model's does; `Err` names the first that differs.
pub(super) fn same_rows(model: &Db, live: &Db) -> Result<(), String> {
    let differ = |what: &str, m: &dyn std::fmt::Debug, l: &dyn std::fmt::Debug| {
        Err(format!(
            "final {what} differ:\n model    {m:?}\n Postgres {l:?}"
        ))
    };
    if model.runs != live.runs {
        return differ("runs", &model.runs, &live.runs);
    }
    if model.attempts != live.attempts {
        return differ("attempts", &model.attempts, &live.attempts);
    }
    if model.dead_letters != live.dead_letters {
        return differ("dead letters", &model.dead_letters, &live.dead_letters);
    }
    if model.effects != live.effects {
        return differ("effects", &model.effects, &live.effects);
    }
    if model.keys != live.keys {
        return differ("submit keys", &model.keys, &live.keys);
    }
    if model.workers != live.workers {
        return differ("workers", &model.workers, &live.workers);
    }
    if model.steps != live.steps {
        return differ("steps", &model.steps, &live.steps);
    }
    if model.slots != live.slots {
        return differ("provider slots", &model.slots, &live.slots);
    }
    if model.rates != live.rates {
        return differ("provider rates", &model.rates, &live.rates);
    }
    if model.partitions != live.partitions {
        return differ("deployment", &model.partitions, &live.partitions);
    }
    Ok(())
}

/// A connection to the database at `url`, migrated: where [`db_case`]
/// runs its sequences.
///
/// # Panics
/// When Postgres cannot be reached or a migration fails.
#[must_use]
pub fn migrated(url: &str) -> PgDb {
    crate::rt().block_on(async {
        // One connection: the clock is pinned per session (`DbStep::Clock`).
        let db = PgDb::connect(url, 1, Duration::from_secs(10))
            .await
            .unwrap_or_else(|e| panic!("cannot reach Postgres at {url}: {e}"));
        db.migrate().await.expect("migrations apply");
        // Live counts fold every 64th counting statement; here every
        // second, so that sequences this short fold onto a base that
        // holds counts already, and still sum deltas not folded yet.
        pelican_real::live::pg::raw_execute(
            &db,
            "ALTER SEQUENCE run_count_statements INCREMENT BY 32 RESTART WITH 32",
        )
        .await
        .expect("the live counts' fold rate is set");
        db
    })
}

/// Runs `cases` random database sequences against the database at `url`
/// (migrated first).
///
/// # Panics
/// When Postgres cannot be reached.
#[must_use]
pub fn run_db(url: &str, cases: u32, seed: u64) -> Outcome {
    let db = migrated(url);
    let mut runner = runner(cases, seed);
    let result = runner.run(&db_sequence(), |steps| {
        crate::rt()
            .block_on(db_case(&db, &steps))
            .map(drop)
            .map_err(TestCaseError::fail)
    });
    Outcome::of(cases, "statements", result)
}
