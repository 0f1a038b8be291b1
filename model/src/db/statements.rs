//! Every SQL statement Pelican runs, declared once. The file is long
//! because it is that table: one entry, with its SQL, per statement.
//!
//! Each entry of the table at the bottom is one statement: its parameters
//! (the fields of its [`DbOp`] variant, bound as `$1, $2, ...` in that
//! order), its name, whether it reads, writes, or writes under a fence, its
//! class (what the world's checks watch: [`Class`]), the shape of its
//! answer, its SQL text (and, for a few, the text of the batched form), the
//! fields a timeline shows, and its reference semantics (a call of the
//! [`Db`] method that is its twin). Everything else follows from the table:
//!
//! * [`DbOp`], the command a role sends, and [`Statement`], its kind;
//! * one struct per statement in [`query`], whose [`Query`] impl types its
//!   answer by its shape;
//! * [`DbOp::class`], which [`World::db`](crate::world::World::db) reads;
//! * [`Db::execute`], the model's dispatch;
//! * [`DbOp::params`] and [`Statement::sql`], which the Postgres binding
//!   binds and sends without knowing any statement by name; it decodes the
//!   rows by [`Shape`], one decoder per shape;
//! * [`DbOp::describe`], for timelines and logs;
//! * [`DbOp::draw`], which builds a random instance of any statement from
//!   a [`Picks`] source (the conformance tests' generator).
//!
//! Adding a statement is one entry here plus its method on [`Db`].
//!
//! Statements only a mutant sends carry `#[cfg(feature = "mutants")]`: a
//! build without the feature has no variant, text, binding or name of them.
//!
//! Every time a statement stores or compares is Postgres's clock, in
//! milliseconds (`pelican_now_ms()`, migration 4; [`Db::clock`] in the
//! model): leases, retries and publication times are decided by one clock,
//! whatever the clocks of the workers that send the statements say.

use super::answers::{Query, Shape, shape};
use super::class::{Class, class_of};
use super::schedules::{Fire, NewSchedule};
use super::{Candidate, Db, Delay, NewRunRow, RunFilter, RunRow};
use crate::ids::{AttemptNo, Dispatch, EntryId, Fence, RunId, WorkerId};
use crate::schedule::{Catchup, Overlap};
use crate::status::{ErrorClass, RunStatus};
use crate::time::Timestamp;
use serde::{Deserialize, Serialize};

/// A parameter as Postgres receives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Param {
    /// `bigint`.
    Int8(i64),
    /// `integer`.
    Int4(i32),
    /// `text`.
    Text(String),
}

/// A column of a batched statement's parameters: one array per parameter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Column {
    /// `bigint[]`.
    Int8(Vec<i64>),
    /// `integer[]`.
    Int4(Vec<i32>),
    /// `text[]`.
    Text(Vec<String>),
}

/// How a field of a statement is bound.
pub trait ToParam {
    /// The bound value.
    fn to_param(&self) -> Param;

    /// Whether Postgres refuses the value: text holding a NUL byte.
    fn holds_nul(&self) -> bool {
        false
    }
}

fn int8(n: u64) -> Param {
    Param::Int8(i64::try_from(n).unwrap_or(i64::MAX))
}

fn int4(n: u32) -> Param {
    Param::Int4(i32::try_from(n).unwrap_or(i32::MAX))
}

macro_rules! to_param {
    ($($ty:ty => |$v:ident| $e:expr;)*) => {$(
        impl ToParam for $ty {
            fn to_param(&self) -> Param {
                let $v = self;
                $e
            }
        }
    )*};
}

to_param! {
    RunId => |v| int8(v.0);
    Fence => |v| int8(v.0);
    Dispatch => |v| int4(v.0);
    Timestamp => |v| int8(v.0);
    u64 => |v| int8(*v);
    u32 => |v| int4(*v);
    usize => |v| int8(u64::try_from(*v).unwrap_or(u64::MAX));
    EntryId => |v| Param::Text(v.to_string());
    ErrorClass => |v| Param::Text(v.as_str().to_owned());
    Overlap => |v| Param::Text(v.as_str().to_owned());
    Catchup => |v| Param::Text(v.as_str().to_owned());
}

impl ToParam for String {
    fn to_param(&self) -> Param {
        Param::Text(self.clone())
    }

    fn holds_nul(&self) -> bool {
        self.contains('\0')
    }
}

/// Whether a statement reads or writes, and whether its write is fenced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Access {
    /// Reads only.
    Read,
    /// Writes, unfenced (submission, claims, maintenance, operators).
    Write,
    /// Writes as one attempt, accepted only under the run's current fence
    /// (S3).
    FencedWrite,
}

/// The answer to a [`DbOp`].
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DbReply {
    /// Rows affected.
    Rows(u64),
    /// A claim's result.
    Claimed(Option<super::ClaimedJob>),
    /// A row read.
    Run(Option<RunRow>),
    /// Rows selected by the sweeper.
    Candidates(Vec<Candidate>),
    /// A fresh run id.
    NewRun(RunId),
    /// Fresh run ids, in increasing order.
    NewRuns(Vec<RunId>),
    /// A fresh worker number.
    NewWorker(WorkerId),
    /// A run's attempts.
    Attempts(Vec<(AttemptNo, super::AttemptRow)>),
    /// Dead letters by run.
    DeadLetters(Vec<(RunId, super::DeadLetter)>),
    /// Runs by status.
    Counts(Vec<(RunStatus, u64)>),
    /// The run an idempotency key belongs to, and whether the request it
    /// was first made with (kind and input) is this one.
    Keyed {
        /// The key's run: the one this command inserted, or an earlier one.
        run: RunId,
        /// Whether the earlier request was the same.
        same: bool,
    },
    /// A run's recorded steps, by index.
    Steps(Vec<(u32, super::StepRow)>),
    /// A run's events, in order.
    Events(Vec<crate::events::RunEvent>),
    /// Runs, by id.
    Runs(Vec<RunRow>),
    /// Counts by minute (its first millisecond) and status, in order.
    PerMinute(Vec<(Timestamp, RunStatus, u64)>),
    /// Succeeded runs and their latency by minute, in order.
    Latency(Vec<super::MinuteLatency>),
    /// Schedules, each with Postgres's clock when read.
    Schedules(Vec<(Timestamp, crate::schedule::ScheduleRow)>),
    /// Postgres refused the command's values and applied nothing: text
    /// holding a NUL byte, which `text` cannot store ([`DbOp::refused`]).
    /// The binding logs Postgres's own message.
    Refused,
}

/// A source of field values for [`DbOp::draw`]: one [`Pick`] per field
/// type that statements use.
pub trait Picks:
    Pick<RunId>
    + Pick<Fence>
    + Pick<Dispatch>
    + Pick<EntryId>
    + Pick<Timestamp>
    + Pick<String>
    + Pick<ErrorClass>
    + Pick<Overlap>
    + Pick<Catchup>
    + Pick<u64>
    + Pick<u32>
    + Pick<usize>
{
}

impl<G> Picks for G where
    G: Pick<RunId>
        + Pick<Fence>
        + Pick<Dispatch>
        + Pick<EntryId>
        + Pick<Timestamp>
        + Pick<String>
        + Pick<ErrorClass>
        + Pick<Overlap>
        + Pick<Catchup>
        + Pick<u64>
        + Pick<u32>
        + Pick<usize>
{
}

/// Picks a value of type `T` for the field named `field` of `statement`.
pub trait Pick<T> {
    /// The value.
    fn pick(&mut self, statement: Statement, field: &'static str) -> T;
}

macro_rules! statements {
    ($(
        $(#[cfg($cfg:meta)])?
        $(#[doc = $doc:literal])*
        $op:ident $({ $($field:ident : $ty:ty),* $(,)? })? => {
            name: $name:literal,
            access: $access:ident $(($frun:ident, $ffence:ident))?,
            class: [$($class:ident $(($($carg:ident),*))?),*],
            reply: $shape:ident,
            sql: $sql:expr,
            $(many: $many:expr,)?
            show: [$($show:ident),*],
            model: |$db:ident| $model:expr $(,)?
        }
    )*) => {
        /// A database command: one SQL statement, executed by
        /// [`Db::execute`] in the model and by the binding on Postgres.
        #[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
        #[allow(missing_docs)]
        pub enum DbOp {
            $(
                $(#[cfg($cfg)])?
                $(#[doc = $doc])*
                $op $({ $($field: $ty),* })?,
            )*
        }

        /// The kind of a [`DbOp`]: which statement, without its parameters.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum Statement {
            $(
                $(#[cfg($cfg)])?
                $(#[doc = $doc])*
                $op,
            )*
        }

        impl Statement {
            /// Every statement of this build.
            pub const ALL: &'static [Statement] = &[$($(#[cfg($cfg)])? Statement::$op,)*];

            /// Its name, in snake case (`claim`, `complete`, ...): for logs
            /// and metrics labels.
            #[must_use]
            pub const fn name(self) -> &'static str {
                match self { $($(#[cfg($cfg)])? Statement::$op => $name,)* }
            }

            /// Whether it reads, writes, or writes under a fence.
            #[must_use]
            pub const fn access(self) -> Access {
                match self { $($(#[cfg($cfg)])? Statement::$op => Access::$access,)* }
            }

            /// The shape of its answer.
            #[must_use]
            pub const fn shape(self) -> Shape {
                match self { $($(#[cfg($cfg)])? Statement::$op => Shape::$shape,)* }
            }

            /// Whether only a mutant sends it (it exists only in a build
            /// with the `mutants` feature).
            #[must_use]
            #[allow(unused_variables)]
            pub const fn mutant_only(self) -> bool {
                match self {
                    $($(#[cfg($cfg)])? Statement::$op => {
                        let only = false;
                        $(let only = { let _ = stringify!($cfg); true };)?
                        only
                    })*
                }
            }

            /// Its SQL text.
            #[must_use]
            pub const fn sql(self) -> &'static str {
                match self { $($(#[cfg($cfg)])? Statement::$op => $sql,)* }
            }

            /// The SQL text of its batched form, if it has one: each
            /// parameter bound as an array (one element per command), each
            /// answer row carrying the `run_id` it belongs to.
            #[must_use]
            #[allow(unused_variables)]
            pub const fn many_sql(self) -> Option<&'static str> {
                match self {
                    $($(#[cfg($cfg)])? Statement::$op => {
                        let many: Option<&'static str> = None;
                        $(let many = Some($many);)?
                        many
                    })*
                }
            }
        }

        impl DbOp {
            /// Which statement this is.
            #[must_use]
            pub const fn statement(&self) -> Statement {
                match self { $($(#[cfg($cfg)])? DbOp::$op { .. } => Statement::$op,)* }
            }

            /// Its parameters, in binding order (`$1`, `$2`, ...).
            #[must_use]
            #[allow(unused_variables)]
            pub fn params(&self) -> Vec<Param> {
                match self {
                    $($(#[cfg($cfg)])? DbOp::$op $({ $($field),* })? => {
                        vec![$($(ToParam::to_param($field)),*)?]
                    })*
                }
            }

            /// The run a fenced write targets and the fence it carries.
            #[must_use]
            #[allow(unused_variables)]
            pub fn fenced_write(&self) -> Option<(RunId, Fence)> {
                match self {
                    $($(#[cfg($cfg)])? DbOp::$op $({ $($field),* })? => {
                        let fenced: Option<(RunId, Fence)> = None;
                        $(let fenced = Some((*$frun, *$ffence));)?
                        fenced
                    })*
                }
            }

            /// What it does that the world's checks watch, as its entry
            /// declares.
            #[must_use]
            #[allow(unused_variables, unused_mut)]
            pub fn class(&self) -> Class<'_> {
                match self {
                    $($(#[cfg($cfg)])? DbOp::$op $({ $($field),* })? => {
                        let mut class = Class::default();
                        $(class_of!(class, $class $(($($carg),*))?);)*
                        class
                    })*
                }
            }

            /// One line: the statement's name and the fields that identify
            /// what it acts on.
            #[must_use]
            #[allow(unused_variables, unused_mut)]
            pub fn describe(&self) -> String {
                match self {
                    $($(#[cfg($cfg)])? DbOp::$op $({ $($field),* })? => {
                        let mut line = String::from($name);
                        $(
                            line.push(' ');
                            line.push_str(&$show.to_string());
                        )*
                        line
                    })*
                }
            }

            /// A random instance of `statement`, each field picked by `g`.
            #[must_use]
            pub fn draw<G: Picks>(statement: Statement, g: &mut G) -> DbOp {
                match statement {
                    $($(#[cfg($cfg)])? Statement::$op => DbOp::$op $({
                        $($field: <G as Pick<$ty>>::pick(g, statement, stringify!($field))),*
                    })?,)*
                }
            }
        }

        impl DbOp {
            /// Whether Postgres refuses this command's values: a text
            /// parameter holding a NUL byte (`text` cannot store U+0000;
            /// Postgres answers SQLSTATE 22021 and applies nothing).
            #[must_use]
            #[allow(unused_variables)]
            pub fn refused(&self) -> bool {
                match self {
                    $($(#[cfg($cfg)])? DbOp::$op $({ $($field),* })? => {
                        false $($(|| ToParam::holds_nul($field))*)?
                    })*
                }
            }
        }

        /// Each statement as a type of its own: its fields are the
        /// statement's parameters, and its [`Query`] impl names its typed
        /// answer. `db.query(query::Claim { .. })` answers an
        /// `Option<ClaimedJob>`.
        pub mod query {
            #[allow(clippy::wildcard_imports)]
            use super::*;
            $(
                $(#[cfg($cfg)])?
                $(#[doc = $doc])*
                #[derive(Clone, Debug, PartialEq, Eq)]
                #[allow(missing_docs)]
                pub struct $op { $($(pub $field: $ty),*)? }

                $(#[cfg($cfg)])?
                impl From<$op> for DbOp {
                    fn from(q: $op) -> DbOp {
                        let $op { $($($field),*)? } = q;
                        DbOp::$op $({ $($field),* })?
                    }
                }

                $(#[cfg($cfg)])?
                impl Query for $op {
                    type Shape = shape::$shape;
                }
            )*
        }

        impl Db {
            /// Executes one command against the reference database. Like
            /// Postgres, it refuses a command whose text holds a NUL byte
            /// and applies nothing ([`DbReply::Refused`]).
            pub fn execute(&mut self, op: &DbOp) -> DbReply {
                if op.refused() {
                    return DbReply::Refused;
                }
                match op {
                    $($(#[cfg($cfg)])? DbOp::$op $({ $($field),* })? => {
                        let $db = &mut *self;
                        $model
                    })*
                }
            }
        }
    };
}

impl DbOp {
    /// Whether this statement writes (the rest only read).
    #[must_use]
    pub fn is_write(&self) -> bool {
        self.statement().access() != Access::Read
    }

    /// The statement's name (see [`Statement::name`]).
    #[must_use]
    pub fn name(&self) -> &'static str {
        self.statement().name()
    }
}

impl Db {
    fn claimed_job(&self, run: RunId, claimed: super::Claimed) -> super::ClaimedJob {
        let r = &self.runs[&run];
        super::ClaimedJob {
            claimed,
            kind: r.kind.clone(),
            input: r.input.clone(),
            trace: r.trace.clone(),
        }
    }

    /// Executes `ops` in order, each as its own statement: a batch is a
    /// list of independent commands, each answering for itself, as if sent
    /// concurrently in that order. The binding may fuse a batch of one
    /// statement on distinct runs into its batched form
    /// ([`Statement::many_sql`]): on distinct rows, one statement's effect
    /// equals the sequence's. Any other batch it runs statement by
    /// statement.
    pub fn execute_batch(&mut self, ops: &[DbOp]) -> Vec<DbReply> {
        ops.iter().map(|op| self.execute(op)).collect()
    }
}

/// The columns of a batch of one statement, from each command's
/// parameters ([`DbOp::params`]): parameter `i` of every command, as one
/// array, for each `i`.
///
/// # Panics
/// If the commands bind different types at one position (they are not of
/// one statement).
#[must_use]
pub fn columns(params: Vec<Vec<Param>>) -> Vec<Column> {
    let rows = params.len();
    let mut params = params.into_iter();
    let Some(first) = params.next() else {
        return Vec::new();
    };
    let mut columns: Vec<Column> = first
        .iter()
        .map(|p| match p {
            Param::Int8(_) => Column::Int8(Vec::with_capacity(rows)),
            Param::Int4(_) => Column::Int4(Vec::with_capacity(rows)),
            Param::Text(_) => Column::Text(Vec::with_capacity(rows)),
        })
        .collect();
    for row in std::iter::once(first).chain(params) {
        assert_eq!(
            row.len(),
            columns.len(),
            "a batched form takes one statement"
        );
        for (column, param) in columns.iter_mut().zip(row) {
            match (column, param) {
                (Column::Int8(v), Param::Int8(p)) => v.push(p),
                (Column::Int4(v), Param::Int4(p)) => v.push(p),
                (Column::Text(v), Param::Text(p)) => v.push(p),
                _ => panic!("a batched form takes one statement: a parameter changed type"),
            }
        }
    }
    columns
}

/// The end every single-run claim statement shares (`Claim` and its mutant
/// twins): the new attempt's row, and the answer. `claimed` is the updated
/// run, `RETURNING run_id, active_fence, attempts, attempts_max, dispatch,
/// kind, input, events`; `$3` is the entry and `$4` the worker.
macro_rules! claim_tail {
    () => {
        "recorded AS (INSERT INTO attempts (run_id, attempt, fence, worker, entry_id, dispatch, claimed_seq) \
           SELECT run_id, attempts, active_fence, $4, $3, dispatch, events FROM claimed) \
         SELECT run_id, active_fence, attempts, attempts_max, unknown_failures, budget_left_ms, kind, input, trace_parent FROM claimed"
    };
}

/// The end of a retention statement: deletes the runs of its `picked` CTE
/// with everything kept about them, and answers their ids.
/// The columns of a `run_events` row, in the order the statements that
/// write one select them.
macro_rules! event_row {
    () => {
        "INSERT INTO run_events (run_id, seq, kind, attempt, fence, class, data) "
    };
}

/// Retention's pick: up to `$2` runs finished `$1` ms ago or earlier,
/// oldest first, locked (those another pass holds are skipped).
macro_rules! pick_finished {
    () => {
        "WITH picked AS MATERIALIZED ( \
           SELECT run_id FROM runs WHERE finished_at <= GREATEST(pelican_now_ms() - $1, 0) \
            ORDER BY finished_at, run_id LIMIT $2 FOR UPDATE SKIP LOCKED), "
    };
}

/// Deletes the runs `picked` names, and their rows. The runs and their
/// rows are found by `run_id = ANY (ARRAY(...))`, an index lookup whatever
/// the batch: a join with `picked` is planned generically, for a batch of a
/// tenth of the candidates whatever the `LIMIT`, as a hash join over a
/// sequential scan of `runs` (406 ms of a 627 ms pass at 626,000 runs), and
/// `IN (SELECT run_id FROM gone)` as a hash semi join over a sequential
/// scan of `attempts` (50–90 ms of a pass at 300,000 runs, `auto_explain`).
/// The maintenance statements that update the runs a CTE picked do the
/// same.
macro_rules! delete_picked {
    () => {
        "gone AS (DELETE FROM runs r WHERE r.run_id = ANY (ARRAY(SELECT run_id FROM picked)) \
           RETURNING r.run_id), \
         a AS (DELETE FROM attempts WHERE run_id = ANY (ARRAY(SELECT run_id FROM gone))), \
         d AS (DELETE FROM dead_letters WHERE run_id = ANY (ARRAY(SELECT run_id FROM gone))), \
         s AS (DELETE FROM steps WHERE run_id = ANY (ARRAY(SELECT run_id FROM gone))), \
         e AS (DELETE FROM run_events WHERE run_id = ANY (ARRAY(SELECT run_id FROM gone))) \
         SELECT run_id FROM gone"
    };
}

use DbReply::{Candidates, Rows};

/// `FireTick` and its mutant twin, from the condition on `next_tick`
/// (`$1` is the schedule) and the placeholders of the tick, the next tick,
/// the run, its attempts and its budget. The row is locked first, so a
/// second scheduler's statement waits, then finds `next_tick` moved.
macro_rules! fire_tick {
    ($expect:literal, $tick:literal, $next:literal, $run:literal, $attempts:literal, $budget:literal) => {
        concat!(
            "WITH s AS MATERIALIZED (SELECT * FROM schedules WHERE name = $1 ", $expect, " FOR UPDATE), \
             prev AS (SELECT r.run_id FROM runs r JOIN s ON r.run_id = s.last_run \
                       WHERE r.status IN ('delayed', 'queued', 'running', 'retry_wait')), \
             go AS (SELECT s.*, (", $tick, " > 0 AND ", $run, " > 0 \
                       AND NOT (s.overlap = 'skip' AND EXISTS (SELECT 1 FROM prev))) AS fires FROM s), \
             stop AS ( \
               UPDATE runs SET status = 'cancelled', lease_until = NULL, retry_at = NULL, \
                      published_at = coalesce(published_at, pelican_now_ms()), \
                      finished_at = pelican_now_ms(), events = events + 1 \
                WHERE run_id = (SELECT run_id FROM prev) \
                  AND (SELECT fires AND overlap = 'cancel' FROM go) \
               RETURNING run_id, events, attempts, active_fence), \
             stopped AS (", event_row!(), "SELECT run_id, events, 'cancelled', attempts, active_fence, NULL, '' FROM stop), \
             d AS (SELECT ", due!("0", $tick), " AS due), \
             made AS (INSERT INTO runs (", insert_columns!(), ") \
               SELECT ", $run, ", go.kind, go.input, ", insert_values!("d.due", $attempts, $budget, "''"), " \
                 FROM go, d WHERE go.fires ON CONFLICT (run_id) DO NOTHING) \
             UPDATE schedules t SET next_tick = ", $next, ", \
                    last_tick = CASE WHEN ", $tick, " > 0 THEN ", $tick, " ELSE t.last_tick END, \
                    last_run = CASE WHEN go.fires THEN ", $run, " ELSE t.last_run END, \
                    fired = t.fired + go.fires::int, \
                    skipped = t.skipped + (", $tick, " > 0 AND NOT go.fires)::int \
               FROM go WHERE t.name = go.name"
        )
    };
}

/// The tail of a pass that queues the runs of its `due` CTE and takes them
/// for publication (`PromoteRetries` and its mutant twin): their rows as
/// candidates, by run id.
macro_rules! queue_due {
    () => {
        "taken AS ( \
           UPDATE runs r SET status = 'queued', retry_at = NULL, published_at = pelican_now_ms() \
            WHERE r.run_id = ANY (ARRAY(SELECT run_id FROM due)) \
           RETURNING r.run_id, r.dispatch, r.entry_id, r.published_at) \
         SELECT run_id, dispatch, entry_id, published_at FROM taken ORDER BY run_id"
    };
}

/// When a new run is due, from its `delay_ms` and `at_ms` ([`Delay::due`]):
/// NULL when both are 0.
macro_rules! due {
    ($delay:literal, $at:literal) => {
        concat!(
            "CASE WHEN ",
            $delay,
            " > 0 OR ",
            $at,
            " > 0 THEN GREATEST(pelican_now_ms() + ",
            $delay,
            ", ",
            $at,
            ") END"
        )
    };
}

/// The columns an insert of a new run writes, in [`insert_values`]'s order
/// after its id, kind and input.
macro_rules! insert_columns {
    () => {
        "run_id, kind, input, status, dispatch, active_fence, attempts, attempts_max, \
         deadline_ms, trace_parent, retry_at, due_at"
    };
}

/// The values of a new run after its id, kind and input, from its due time
/// (`due`, NULL: none), attempts, budget and trace: `delayed` until due,
/// else `queued`; its budget counted from its due time, or from now.
macro_rules! insert_values {
    ($due:literal, $attempts_max:literal, $budget_ms:literal, $trace:literal) => {
        concat!(
            "CASE WHEN ",
            $due,
            " IS NULL THEN 'queued' ELSE 'delayed' END, 1, 0, 0, ",
            $attempts_max,
            ", coalesce(",
            $due,
            ", pelican_now_ms()) + NULLIF(",
            $budget_ms,
            ", 0), NULLIF(",
            $trace,
            ", ''), ",
            $due,
            ", ",
            $due
        )
    };
}

/// A statement's `budget_ms` (0: no budget).
fn budget(budget_ms: u64) -> Option<u64> {
    (budget_ms > 0).then_some(budget_ms)
}

statements! {
    /// A new run, dispatch 1, not yet published, under the caller's W3C
    /// `traceparent` `trace` (`""`: none): `queued`; or `delayed` until
    /// `delay_ms` from now and `at_ms` (Unix ms) have both passed by
    /// Postgres's clock, when either is not 0 ([`Delay`]). Its elapsed
    /// budget (`budget_ms`, 0: none) starts then, or now.
    /// Idempotent: a second insert of the same id affects no row.
    InsertRun { run: RunId, kind: String, input: String, attempts_max: u32, budget_ms: u64, trace: String, delay_ms: u64, at_ms: u64 } => {
        name: "insert_run",
        access: Write,
        class: [],
        reply: Rows,
        sql: concat!("WITH d AS (SELECT ", due!("$7", "$8"), " AS due) \
              INSERT INTO runs (", insert_columns!(), ") \
              SELECT $1, $2, $3, ", insert_values!("d.due", "$4", "$5", "$6"), " FROM d \
              ON CONFLICT (run_id) DO NOTHING"),
        many: concat!("WITH input AS ( \
                SELECT i.*, ", due!("i.delay_ms", "i.at_ms"), " AS due \
                  FROM unnest($1::bigint[], $2::text[], $3::text[], $4::integer[], $5::bigint[], $6::text[], \
                              $7::bigint[], $8::bigint[]) \
                  AS i(run_id, kind, input, attempts_max, budget_ms, trace, delay_ms, at_ms)) \
              INSERT INTO runs (", insert_columns!(), ") \
              SELECT run_id, kind, input, ", insert_values!("due", "attempts_max", "budget_ms", "trace"), " \
                FROM input ORDER BY run_id \
              ON CONFLICT (run_id) DO NOTHING RETURNING run_id"),
        show: [run],
        model: |db| {
            let delay = Delay { delay_ms: *delay_ms, at_ms: *at_ms };
            let new = NewRunRow { kind, input, attempts_max: *attempts_max, budget_ms: budget(*budget_ms), trace, delay };
            Rows(db.insert_run_budgeted(*run, &new))
        },
    }

    /// `InsertRun` under a client's idempotency key: a new
    /// key inserts the run; a known one inserts nothing and answers its
    /// run. The key row is locked before the run is inserted, so a
    /// concurrent retry with the same key waits for this one and then
    /// answers its run (`DO UPDATE` returns the latest row version, which
    /// a plain read in the same statement could not see). Only a key this
    /// statement made inserts (`xmax = 0`: the row version is an insert's,
    /// not `DO UPDATE`'s): a known key whose run retention deleted
    /// answers that run and inserts nothing, as the model does.
    InsertRunKeyed { run: RunId, kind: String, input: String, attempts_max: u32, budget_ms: u64, key: String, trace: String, delay_ms: u64, at_ms: u64 } => {
        name: "insert_run_keyed",
        access: Write,
        class: [binds_key(key)],
        reply: Keyed,
        sql: concat!("WITH k AS ( \
                INSERT INTO submit_keys (key, run_id, request, created_at) \
                VALUES ($6, $1, octet_length($2) || ':' || $2 || $3, pelican_now_ms()) \
                ON CONFLICT (key) DO UPDATE SET key = EXCLUDED.key \
                RETURNING run_id, request, xmax = 0 AS fresh), \
              d AS (SELECT ", due!("$8", "$9"), " AS due), \
              inserted AS ( \
                INSERT INTO runs (", insert_columns!(), ") \
                SELECT $1, $2, $3, ", insert_values!("d.due", "$4", "$5", "$7"), " FROM k, d WHERE k.fresh \
                ON CONFLICT (run_id) DO NOTHING) \
              SELECT run_id, request = octet_length($2) || ':' || $2 || $3 AS same FROM k"),
        // Keys distinct within a batch (the submitter sends a key again
        // only after its first run's answer), taken in the keys' order so
        // that two batches sharing keys lock them in the same order. Each
        // row answers for its command's run (`run_id`) with the key's run
        // (`key_run`).
        many: concat!("WITH input AS ( \
                SELECT i.*, ", due!("i.delay_ms", "i.at_ms"), " AS due \
                  FROM unnest($1::bigint[], $2::text[], $3::text[], $4::integer[], $5::bigint[], $6::text[], $7::text[], \
                              $8::bigint[], $9::bigint[]) \
                  AS i(run_id, kind, input, attempts_max, budget_ms, key, trace, delay_ms, at_ms)), \
              k AS ( \
                INSERT INTO submit_keys AS s (key, run_id, request, created_at) \
                SELECT key, run_id, octet_length(kind) || ':' || kind || input, pelican_now_ms() \
                  FROM input ORDER BY key COLLATE \"C\" \
                ON CONFLICT (key) DO UPDATE SET key = EXCLUDED.key \
                RETURNING s.key, s.run_id AS key_run, s.request, s.xmax = 0 AS fresh), \
              inserted AS ( \
                INSERT INTO runs (", insert_columns!(), ") \
                SELECT i.run_id, i.kind, i.input, ", insert_values!("i.due", "i.attempts_max", "i.budget_ms", "i.trace"), " \
                  FROM input i JOIN k ON k.key = i.key AND k.fresh ORDER BY i.run_id \
                ON CONFLICT (run_id) DO NOTHING) \
              SELECT i.run_id, k.key_run, k.request = octet_length(i.kind) || ':' || i.kind || i.input AS same \
                FROM input i JOIN k ON k.key = i.key"),
        show: [run, key],
        model: |db| {
            let delay = Delay { delay_ms: *delay_ms, at_ms: *at_ms };
            let new = NewRunRow { kind, input, attempts_max: *attempts_max, budget_ms: budget(*budget_ms), trace, delay };
            let (run, same) = db.insert_run_keyed(*run, &new, key);
            DbReply::Keyed { run, same }
        },
    }

    /// Forget up to `limit` idempotency keys made `keep_ms` or longer ago.
    ExpireKeys { keep_ms: u64, limit: usize } => {
        name: "expire_keys",
        access: Write,
        class: [expires_keys],
        reply: Rows,
        sql: "WITH old AS MATERIALIZED (SELECT key FROM submit_keys \
                WHERE created_at <= pelican_now_ms() - $1 ORDER BY created_at, key COLLATE \"C\" LIMIT $2) \
              DELETE FROM submit_keys WHERE key = ANY (ARRAY(SELECT key FROM old))",
        show: [],
        model: |db| Rows(db.expire_keys(db.clock.sub_ms(*keep_ms), *limit)),
    }

    /// The XADD of `dispatch` succeeded with `entry`.
    MarkPublished { run: RunId, dispatch: Dispatch, entry: EntryId } => {
        name: "mark_published",
        access: Write,
        class: [],
        reply: Rows,
        sql: "UPDATE runs SET published_at = pelican_now_ms(), entry_id = $3 \
              WHERE run_id = $1 AND dispatch = $2 AND status = 'queued'",
        many: "WITH input AS ( \
                SELECT * FROM unnest($1::bigint[], $2::integer[], $3::text[]) AS i(run_id, dispatch, entry_id)) \
              UPDATE runs r SET published_at = pelican_now_ms(), entry_id = i.entry_id \
                FROM input i \
               WHERE r.run_id = i.run_id AND r.dispatch = i.dispatch AND r.status = 'queued' \
              RETURNING r.run_id",
        show: [run, dispatch, entry],
        model: |db| Rows(db.mark_published(*run, *dispatch, *entry, db.clock)),
    }

    /// Start a new attempt of `run` for the delivery of `entry`: answers the
    /// new fence, attempt number and attempts_max, and the job to run.
    Claim { run: RunId, dispatch: Dispatch, entry: EntryId, worker: String, lease_ms: u64 } => {
        name: "claim",
        access: Write,
        class: [claims(run), events(run)],
        reply: Claimed,
        sql: concat!("WITH claimed AS ( \
                UPDATE runs SET status = 'running', active_fence = active_fence + 1, attempts = attempts + 1, \
                       events = events + 1, \
                       lease_until = pelican_now_ms() + $5, retry_at = NULL, entry_id = $3, \
                       published_at = coalesce(published_at, pelican_now_ms()) \
                 WHERE run_id = $1 AND dispatch = $2 AND attempts < attempts_max \
                   AND (status = 'queued' OR (status = 'running' AND lease_until <= pelican_now_ms() AND entry_id = $3)) \
                RETURNING run_id, active_fence, attempts, attempts_max, unknown_failures, \
                          deadline_ms - pelican_now_ms() AS budget_left_ms, dispatch, kind, input, trace_parent, events), ",
              claim_tail!()),
        many: "WITH input AS ( \
                SELECT * FROM unnest($1::bigint[], $2::integer[], $3::text[], $4::text[], $5::bigint[]) \
                  AS i(run_id, dispatch, entry_id, worker, lease_ms)), \
              claimed AS ( \
                UPDATE runs r SET status = 'running', active_fence = r.active_fence + 1, attempts = r.attempts + 1, \
                       events = r.events + 1, \
                       lease_until = pelican_now_ms() + i.lease_ms, retry_at = NULL, entry_id = i.entry_id, \
                       published_at = coalesce(r.published_at, pelican_now_ms()) \
                  FROM input i \
                 WHERE r.run_id = i.run_id AND r.dispatch = i.dispatch AND r.attempts < r.attempts_max \
                   AND (r.status = 'queued' OR (r.status = 'running' AND r.lease_until <= pelican_now_ms() AND r.entry_id = i.entry_id)) \
                RETURNING r.run_id, r.active_fence, r.attempts, r.attempts_max, r.unknown_failures, \
                          r.deadline_ms - pelican_now_ms() AS budget_left_ms, r.dispatch, r.kind, r.input, r.trace_parent, \
                          r.events, i.entry_id, i.worker), \
              recorded AS (INSERT INTO attempts (run_id, attempt, fence, worker, entry_id, dispatch, claimed_seq) \
                SELECT run_id, attempts, active_fence, worker, entry_id, dispatch, events FROM claimed) \
              SELECT run_id, active_fence, attempts, attempts_max, unknown_failures, budget_left_ms, kind, input, trace_parent FROM claimed",
        show: [run, dispatch, entry],
        model: |db| DbReply::Claimed(
            db.claim(*run, *dispatch, *entry, worker, db.clock, *lease_ms)
                .map(|c| db.claimed_job(*run, c)),
        ),
    }

    /// The run's row.
    ReadRun { run: RunId } => {
        name: "read_run",
        access: Read,
        class: [],
        reply: Run,
        sql: concat!("SELECT ", run_columns!(), " FROM runs WHERE run_id = $1"),
        many: concat!("SELECT ", run_columns!(), " FROM runs WHERE run_id = ANY($1::bigint[])"),
        show: [run],
        model: |db| DbReply::Run(db.read_run(*run)),
    }

    /// `run`'s row without the values its users gave and got: its input,
    /// result and error message read as empty. What a watcher or a list
    /// needs (status, attempts, event count) at a row's cost, whatever
    /// the values' size.
    ReadRunHead { run: RunId } => {
        name: "read_run_head",
        access: Read,
        class: [],
        reply: Run,
        sql: concat!("SELECT ", run_columns!(head), " FROM runs WHERE run_id = $1"),
        many: concat!("SELECT ", run_columns!(head), " FROM runs WHERE run_id = ANY($1::bigint[])"),
        show: [run],
        model: |db| DbReply::Run(db.read_run(*run).map(RunRow::head)),
    }

    /// The steps recorded for `run`: what a new attempt replays.
    ReadSteps { run: RunId } => {
        name: "read_steps",
        access: Read,
        class: [],
        reply: Steps,
        sql: "SELECT step, name, output, fence FROM steps WHERE run_id = $1 ORDER BY step",
        show: [run],
        model: |db| DbReply::Steps(db.read_steps(*run)),
    }

    /// Records step `step` (its name and output) for the attempt holding
    /// `fence` (S11). The run's row is share-locked, so a claim waits for
    /// the record or the record sees the claim's new fence. A recorded step
    /// is never replaced.
    RecordStep { run: RunId, fence: Fence, step: u32, name: String, output: String } => {
        name: "record_step",
        access: FencedWrite(run, fence),
        class: [records_step(run, step)],
        reply: Rows,
        sql: "INSERT INTO steps (run_id, step, name, output, fence) \
              SELECT run_id, $3, $4, $5, active_fence FROM runs \
               WHERE run_id = $1 AND active_fence = $2 AND status = 'running' FOR SHARE \
              ON CONFLICT (run_id, step) DO NOTHING",
        show: [run, fence, step],
        model: |db| Rows(db.record_step(*run, *fence, *step, name, output)),
    }

    /// Extend the lease of the attempt holding `fence`.
    Heartbeat { run: RunId, fence: Fence, lease_ms: u64 } => {
        name: "heartbeat",
        access: FencedWrite(run, fence),
        class: [],
        reply: Rows,
        sql: "UPDATE runs SET lease_until = pelican_now_ms() + $3 \
              WHERE run_id = $1 AND active_fence = $2 AND status = 'running'",
        show: [run, fence],
        model: |db| Rows(db.heartbeat(*run, *fence, db.clock, *lease_ms)),
    }

    /// The attempt holding `fence` reports progress `data` (JSON): the
    /// run's next event (S13). The run's row is updated for its number, so
    /// a claim or an outcome waits for the event or the event sees them.
    AppendEvent { run: RunId, fence: Fence, data: String } => {
        name: "append_event",
        access: FencedWrite(run, fence),
        class: [],
        reply: Rows,
        sql: concat!("WITH held AS ( \
                UPDATE runs SET events = events + 1 \
                 WHERE run_id = $1 AND active_fence = $2 AND status = 'running' \
                RETURNING run_id, events, attempts) ",
              event_row!(), "SELECT run_id, events, 'progress', attempts, $2, NULL, $3 FROM held"),
        show: [run, fence],
        model: |db| Rows(db.append_event(*run, *fence, data)),
    }

    #[cfg(feature = "mutants")]
    /// Mutant twin of `AppendEvent` (`ZombieProgress`): any attempt's
    /// progress while the run is running, whether or not it holds the run.
    AppendEventUnfenced { run: RunId, fence: Fence, data: String } => {
        name: "append_event_unfenced",
        access: Write,
        class: [events(run)],
        reply: Rows,
        sql: concat!("WITH held AS ( \
                UPDATE runs SET events = events + 1 \
                 WHERE run_id = $1 AND status = 'running' \
                RETURNING run_id, events, attempts) ",
              event_row!(), "SELECT run_id, events, 'progress', attempts, $2, NULL, $3 FROM held"),
        show: [run, fence],
        model: |db| Rows(db.append_event_unfenced(*run, *fence, data)),
    }

    /// Up to `limit` events of `run` numbered above `after`, in order
    /// ([`crate::events`]): event 1 and a success are the run's row, each
    /// claim an attempt's row, the others rows of `run_events`. Each event
    /// after the first is read only if the data before it is under
    /// `bytes_max`: a read holds at most `bytes_max` plus one event's data.
    ReadEvents { run: RunId, after: u32, limit: usize, bytes_max: u64 } => {
        name: "read_events",
        access: Read,
        class: [],
        reply: Events,
        sql: "SELECT seq, kind, attempt, fence, class, data FROM ( \
                SELECT *, sum(octet_length(data)) OVER (ORDER BY seq) - octet_length(data) AS before FROM ( \
                  SELECT seq, kind, attempt, fence, class, data FROM ( \
                    SELECT 1 AS seq, 'queued' AS kind, 0 AS attempt, 0::bigint AS fence, NULL::text AS class, \
                           '' AS data FROM runs WHERE run_id = $1 \
                    UNION ALL SELECT claimed_seq, 'claimed', attempt, fence, NULL, worker FROM attempts \
                     WHERE run_id = $1 AND claimed_seq IS NOT NULL \
                    UNION ALL SELECT events, 'succeeded', attempts, active_fence, NULL, '' FROM runs \
                     WHERE run_id = $1 AND status = 'succeeded' AND events > 1 \
                    UNION ALL SELECT seq, kind, attempt, fence, class, data FROM run_events WHERE run_id = $1) e \
                  WHERE seq > $2 ORDER BY seq LIMIT $3) l) b \
              WHERE before < $4 OR before = 0 ORDER BY seq",
        show: [run, after],
        model: |db| DbReply::Events(db.read_events_bounded(*run, *after, *limit, *bytes_max)),
    }

    /// The attempt holding `fence` succeeded with `result`: the run's row
    /// alone records it ([`RunRow::outcome_of`]).
    Complete { run: RunId, fence: Fence, result: String } => {
        name: "complete",
        access: FencedWrite(run, fence),
        class: [],
        reply: Rows,
        sql: "UPDATE runs SET status = 'succeeded', result = $3, lease_until = NULL, finished_at = pelican_now_ms(), \
                     events = events + 1 \
               WHERE run_id = $1 AND active_fence = $2 AND status = 'running'",
        many: "UPDATE runs r SET status = 'succeeded', result = i.result, lease_until = NULL, \
                      finished_at = pelican_now_ms(), events = r.events + 1 \
                 FROM unnest($1::bigint[], $2::bigint[], $3::text[]) AS i(run_id, fence, result) \
                WHERE r.run_id = i.run_id AND r.active_fence = i.fence AND r.status = 'running' \
               RETURNING r.run_id",
        show: [run, fence],
        model: |db| Rows(db.complete(*run, *fence, result)),
    }

    /// The attempt holding `fence` failed terminally.
    Fail { run: RunId, fence: Fence, class: ErrorClass, message: String } => {
        name: "fail",
        access: FencedWrite(run, fence),
        class: [],
        reply: Rows,
        sql: concat!("WITH done AS ( \
                UPDATE runs SET status = 'failed', error_class = $3, error_message = $4, lease_until = NULL, \
                       finished_at = pelican_now_ms(), events = events + 1 \
                 WHERE run_id = $1 AND active_fence = $2 AND status = 'running' RETURNING run_id, events, attempts), \
              logged AS (", event_row!(), "SELECT run_id, events, 'failed', attempts, $2, $3, $4 FROM done) \
              UPDATE attempts SET outcome = $3, ended_at = pelican_now_ms() WHERE run_id IN (SELECT run_id FROM done) AND fence = $2"),
        show: [run, fence],
        model: |db| Rows(db.fail(*run, *fence, *class, message)),
    }

    /// The attempt holding `fence` failed retryably: the run waits
    /// `backoff_ms` under the next dispatch.
    ScheduleRetry { run: RunId, fence: Fence, class: ErrorClass, message: String, backoff_ms: u64 } => {
        name: "schedule_retry",
        access: FencedWrite(run, fence),
        class: [],
        reply: Rows,
        sql: concat!("WITH done AS ( \
                UPDATE runs SET status = 'retry_wait', retry_at = pelican_now_ms() + $5, dispatch = dispatch + 1, \
                       lease_until = NULL, error_class = $3, error_message = $4, \
                       unknown_failures = unknown_failures + (CASE WHEN $3 = 'unknown' THEN 1 ELSE 0 END), \
                       events = events + 1 \
                 WHERE run_id = $1 AND active_fence = $2 AND status = 'running' RETURNING run_id, events, attempts), \
              logged AS (", event_row!(), "SELECT run_id, events, 'retry_scheduled', attempts, $2, $3, $4 FROM done) \
              UPDATE attempts SET outcome = $3, ended_at = pelican_now_ms() WHERE run_id IN (SELECT run_id FROM done) AND fence = $2"),
        show: [run, fence],
        model: |db| Rows(db.schedule_retry(*run, *fence, *class, message, db.clock.add_ms(*backoff_ms))),
    }

    /// The attempt holding `fence` failed on the last attempt: the run is
    /// dead, with its dead-letter record.
    DeadLetter { run: RunId, fence: Fence, class: ErrorClass, message: String } => {
        name: "dead_letter",
        access: FencedWrite(run, fence),
        class: [],
        reply: Rows,
        sql: concat!("WITH done AS ( \
                UPDATE runs SET status = 'dead', error_class = $3, error_message = $4, lease_until = NULL, \
                       published_at = coalesce(published_at, pelican_now_ms()), finished_at = pelican_now_ms(), \
                       events = events + 1 \
                 WHERE run_id = $1 AND active_fence = $2 AND status = 'running' \
                RETURNING run_id, entry_id, events, attempts), \
              outcome AS (UPDATE attempts SET outcome = $3, ended_at = pelican_now_ms() WHERE run_id IN (SELECT run_id FROM done) AND fence = $2), \
              logged AS (", event_row!(), "SELECT run_id, events, 'dead', attempts, $2, $3, $4 FROM done) \
              INSERT INTO dead_letters (run_id, source_entry, class, message, attempts) \
              SELECT d.run_id, d.entry_id, $3, $4, (SELECT coalesce(jsonb_agg(jsonb_build_array(a.attempt, a.fence, \
                     CASE WHEN a.fence = $2 THEN $3 ELSE a.outcome END) ORDER BY a.attempt), '[]') \
                     FROM attempts a WHERE a.run_id = d.run_id) FROM done d \
              ON CONFLICT (run_id) DO UPDATE SET source_entry = EXCLUDED.source_entry, class = EXCLUDED.class, \
                     message = EXCLUDED.message, attempts = EXCLUDED.attempts, requeued = false"),
        show: [run, fence],
        model: |db| Rows(db.dead_letter(*run, *fence, *class, message)),
    }

    /// A delivered run with no attempts left is dead (class `exhausted`).
    DeadLetterExhausted { run: RunId, dispatch: Dispatch } => {
        name: "dead_letter_exhausted",
        access: Write,
        class: [events(run)],
        reply: Rows,
        sql: concat!("WITH done AS ( \
                UPDATE runs SET status = 'dead', error_class = 'exhausted', error_message = 'attempts exhausted', \
                       lease_until = NULL, published_at = coalesce(published_at, pelican_now_ms()), \
                       finished_at = pelican_now_ms(), events = events + 1 \
                 WHERE run_id = $1 AND dispatch = $2 AND attempts >= attempts_max \
                   AND (status = 'queued' OR (status = 'running' AND lease_until <= pelican_now_ms())) \
                RETURNING run_id, entry_id, events, attempts, active_fence), \
              logged AS (", event_row!(), "SELECT run_id, events, 'dead', attempts, active_fence, 'exhausted', \
                'attempts exhausted' FROM done) \
              INSERT INTO dead_letters (run_id, source_entry, class, message, attempts) \
              SELECT d.run_id, d.entry_id, 'exhausted', 'attempts exhausted', (SELECT coalesce(jsonb_agg( \
                     jsonb_build_array(a.attempt, a.fence, a.outcome) ORDER BY a.attempt), '[]') \
                     FROM attempts a WHERE a.run_id = d.run_id) FROM done d \
              ON CONFLICT (run_id) DO UPDATE SET source_entry = EXCLUDED.source_entry, class = EXCLUDED.class, \
                     message = EXCLUDED.message, attempts = EXCLUDED.attempts, requeued = false"),
        show: [run, dispatch],
        model: |db| Rows(db.dead_letter_exhausted(*run, *dispatch, db.clock)),
    }

    /// Cancel a run that is not yet terminal (S7).
    Cancel { run: RunId } => {
        name: "cancel",
        access: Write,
        class: [events(run)],
        reply: Rows,
        sql: concat!("WITH done AS ( \
                UPDATE runs SET status = 'cancelled', lease_until = NULL, retry_at = NULL, \
                       published_at = coalesce(published_at, pelican_now_ms()), finished_at = pelican_now_ms(), \
                       events = events + 1 \
                 WHERE run_id = $1 AND status IN ('delayed', 'queued', 'running', 'retry_wait') \
                RETURNING run_id, events, attempts, active_fence) ",
              event_row!(), "SELECT run_id, events, 'cancelled', attempts, active_fence, NULL, '' FROM done"),
        show: [run],
        model: |db| Rows(db.cancel(*run)),
    }

    /// Queues up to `limit` runs whose retry, or delay, is due, oldest due
    /// first, and takes them for publication as the outbox does ([`ClaimOutbox`]):
    /// the promoting pass publishes them itself, so no other worker's
    /// outbox does, and a taker that dies before its XADD leaves the run
    /// to the sweeper.
    ///
    /// [`ClaimOutbox`]: Statement::ClaimOutbox
    PromoteRetries { limit: usize } => {
        name: "promote_retries",
        access: Write,
        class: [sweeps],
        reply: Candidates,
        sql: concat!("WITH due AS MATERIALIZED ( \
                SELECT run_id FROM runs WHERE status IN ('retry_wait', 'delayed') AND retry_at <= pelican_now_ms() \
                 ORDER BY retry_at, run_id LIMIT $1 FOR UPDATE SKIP LOCKED), ",
              queue_due!()),
        show: [],
        model: |db| Candidates(db.promote(db.clock, *limit, false)),
    }

    /// The outbox: takes up to `limit` queued runs nobody has published,
    /// so that no other worker publishes them (rows another session holds
    /// are skipped, not waited for).
    ClaimOutbox { limit: usize } => {
        name: "claim_outbox",
        access: Write,
        class: [],
        reply: Candidates,
        sql: "WITH picked AS MATERIALIZED ( \
                SELECT run_id FROM runs WHERE status = 'queued' AND published_at IS NULL \
                 ORDER BY run_id LIMIT $1 FOR UPDATE SKIP LOCKED), \
              taken AS ( \
                UPDATE runs r SET published_at = pelican_now_ms() \
                 WHERE r.run_id = ANY (ARRAY(SELECT run_id FROM picked)) \
                RETURNING r.run_id, r.dispatch, r.entry_id, r.published_at) \
              SELECT run_id, dispatch, entry_id, published_at FROM taken ORDER BY run_id",
        show: [],
        model: |db| Candidates(db.claim_outbox(db.clock, *limit)),
    }

    /// Runs published, or leased, longer than `grace_ms` ago: the sweeper
    /// checks that their entries still exist. They come in the order of
    /// (`published_at`, run id), after the sweeper's cursor: a range of
    /// `runs_sweep` that ends at the cutoff, so runs queued more recently
    /// cost nothing. `after_published_ms` is a `published_at` this
    /// statement answered before, a position, not the sender's clock.
    OrphanCandidates { grace_ms: u64, after_published_ms: u64, after: RunId, limit: usize } => {
        name: "orphan_candidates",
        access: Read,
        class: [],
        reply: Candidates,
        sql: "SELECT run_id, dispatch, entry_id, published_at FROM runs \
              WHERE finished_at IS NULL AND published_at <= GREATEST(pelican_now_ms() - $1, 0) \
                AND (published_at, run_id) > ($2, $3) \
                AND (status = 'queued' \
                  OR (status = 'running' AND lease_until <= GREATEST(pelican_now_ms() - $1, 0))) \
              ORDER BY published_at, run_id LIMIT $4",
        show: [after_published_ms, after],
        model: |db| Candidates(db.orphan_candidates(db.clock, *grace_ms, *after_published_ms, *after, *limit)),
    }

    /// Re-dispatch a run whose entry is gone.
    RequeueRun { run: RunId, dispatch: Dispatch } => {
        name: "requeue_run",
        access: Write,
        class: [sweeps],
        reply: Rows,
        sql: "UPDATE runs SET status = 'queued', dispatch = dispatch + 1, published_at = NULL, \
                     lease_until = NULL, retry_at = NULL \
              WHERE run_id = $1 AND dispatch = $2 \
                AND (status = 'queued' OR (status = 'running' AND lease_until <= pelican_now_ms()))",
        many: "WITH input AS ( \
                SELECT * FROM unnest($1::bigint[], $2::integer[]) AS i(run_id, dispatch)) \
              UPDATE runs r SET status = 'queued', dispatch = r.dispatch + 1, published_at = NULL, \
                     lease_until = NULL, retry_at = NULL \
                FROM input i \
               WHERE r.run_id = i.run_id AND r.dispatch = i.dispatch \
                 AND (r.status = 'queued' OR (r.status = 'running' AND r.lease_until <= pelican_now_ms())) \
              RETURNING r.run_id",
        show: [run, dispatch],
        model: |db| Rows(db.requeue_run(*run, *dispatch, db.clock)),
    }

    /// Re-dispatch the run whose current entry is `entry` (S8).
    RequeueEntry { entry: EntryId } => {
        name: "requeue_entry",
        access: Write,
        class: [sweeps, requeues_entry(entry)],
        reply: Rows,
        sql: "UPDATE runs SET status = 'queued', dispatch = dispatch + 1, published_at = NULL, \
                     lease_until = NULL, retry_at = NULL \
              WHERE entry_id = $1 AND finished_at IS NULL \
                AND (status = 'queued' OR (status = 'running' AND lease_until <= pelican_now_ms()))",
        show: [entry],
        model: |db| Rows(db.requeue_entry(*entry, db.clock)),
    }

    /// The demo tool service's ledger: 1 when `key` is new.
    ApplyEffect { key: String } => {
        name: "apply_effect",
        access: Write,
        class: [],
        reply: Applied,
        sql: "INSERT INTO effects (key, requests) VALUES ($1, 1) \
              ON CONFLICT (key) DO UPDATE SET requests = effects.requests + 1 RETURNING (requests = 1) AS applied",
        show: [key],
        model: |db| Rows(db.apply_effect(key)),
    }

    /// A worker process that starts without an id of its own (host name
    /// and pid, for operators): its number, unique among all workers ever
    /// registered, which names its consumer (`w<n>`).
    RegisterWorker { host: String, pid: u32 } => {
        name: "register_worker",
        access: Write,
        class: [],
        reply: NewWorker,
        sql: "INSERT INTO workers (host, pid, started_at) VALUES ($1, $2, pelican_now_ms()) RETURNING worker_id",
        show: [host, pid],
        model: |db| DbReply::NewWorker(db.register_worker(host, *pid, db.clock)),
    }

    /// The deployment's partition count: the one stored, or `partitions`,
    /// stored, when none is yet (the first process to connect after
    /// `pelican migrate` sets it). A process whose own count differs
    /// refuses to start.
    AgreePartitions { partitions: u32 } => {
        name: "agree_partitions",
        access: Write,
        class: [],
        reply: Value,
        sql: "INSERT INTO deployment (key, value) VALUES ('partitions', $1) \
              ON CONFLICT (key) DO UPDATE SET key = EXCLUDED.key RETURNING value",
        show: [partitions],
        model: |db| Rows(u64::from(db.agree_partitions(*partitions))),
    }

    /// How long the most overdue run (a due retry, or a delayed run past
    /// its due time) has waited to be queued, in ms by Postgres's clock;
    /// 0 when none is due. The retry pass's lag: the first entry of
    /// `runs_retry_order`, however many runs wait.
    DueLag => {
        name: "due_lag",
        access: Read,
        class: [],
        reply: Value,
        sql: "SELECT GREATEST(coalesce(pelican_now_ms() - (SELECT retry_at FROM runs \
                WHERE status IN ('retry_wait', 'delayed') AND retry_at IS NOT NULL \
                ORDER BY retry_at LIMIT 1), 0), 0) AS value",
        show: [],
        model: |db| Rows(db.due_lag(db.clock)),
    }

    /// Makes schedule `name`, or replaces what an existing one runs and
    /// when (it keeps its number and history). Either way the next
    /// scheduler pass plans it afresh (`next_tick` 0). `nextval` is drawn
    /// even when the name exists, as the model draws it.
    PutSchedule { name: String, kind: String, input: String, cron: String, tz: String, overlap: Overlap, catchup: Catchup } => {
        name: "put_schedule",
        access: Write,
        class: [],
        reply: Rows,
        sql: "INSERT INTO schedules (name, id, kind, input, cron, tz, overlap, catchup) \
              VALUES ($1, nextval('schedule_ids'), $2, $3, $4, $5, $6, $7) \
              ON CONFLICT (name) DO UPDATE SET kind = EXCLUDED.kind, input = EXCLUDED.input, \
                cron = EXCLUDED.cron, tz = EXCLUDED.tz, overlap = EXCLUDED.overlap, \
                catchup = EXCLUDED.catchup, next_tick = 0",
        show: [name],
        model: |db| {
            let new = NewSchedule { name, kind, input, cron, tz, overlap: *overlap, catchup: *catchup };
            Rows(db.put_schedule(&new))
        },
    }

    /// Deletes schedule `name`; its runs stay.
    DeleteSchedule { name: String } => {
        name: "delete_schedule",
        access: Write,
        class: [],
        reply: Rows,
        sql: "DELETE FROM schedules WHERE name = $1",
        show: [name],
        model: |db| Rows(db.delete_schedule(name)),
    }

    /// Every schedule, by name, each with Postgres's clock.
    ListSchedules => {
        name: "list_schedules",
        access: Read,
        class: [],
        reply: Schedules,
        sql: concat!("SELECT pelican_now_ms() AS now, ", schedule_columns!(), " FROM schedules \
              ORDER BY name COLLATE \"C\""),
        show: [],
        model: |db| DbReply::Schedules(db.list_schedules(db.clock)),
    }

    /// The scheduler's read: up to `limit` schedules whose next tick is
    /// due by Postgres's clock (or not planned yet: 0), earliest first,
    /// each with that clock (index `schedules_next_tick`).
    DueSchedules { limit: usize } => {
        name: "due_schedules",
        access: Read,
        class: [],
        reply: Schedules,
        sql: concat!("SELECT pelican_now_ms() AS now, ", schedule_columns!(), " FROM schedules \
              WHERE next_tick <= pelican_now_ms() ORDER BY next_tick, name COLLATE \"C\" LIMIT $1"),
        show: [],
        model: |db| DbReply::Schedules(db.due_schedules(db.clock, *limit)),
    }

    /// Handles one tick of `schedule` as the scheduler planned it
    /// ([`crate::schedule::plan`]), only while its `next_tick` is still
    /// `expect` (S16: a compare-and-set, so of two schedulers that read
    /// one tick, one handles it). Moves `next_tick` to `next`; unless only
    /// planning (`tick` 0), records the tick and makes its run `run` (due
    /// now, queued by the retry pass), or counts it skipped: `run` 0 (the
    /// catch-up policy makes none), or overlap `skip` with the previous
    /// run live. Overlap `cancel` cancels a live previous run in the same
    /// statement.
    FireTick { schedule: String, expect: Timestamp, tick: Timestamp, next: Timestamp, run: RunId, attempts_max: u32, budget_ms: u64 } => {
        name: "fire_tick",
        access: Write,
        class: [sweeps, ticks(schedule)],
        reply: Rows,
        sql: fire_tick!("AND next_tick = $2", "$3", "$4", "$5", "$6", "$7"),
        show: [schedule, tick, run],
        model: |db| {
            let fire = Fire { schedule, expect: Some(*expect), tick: *tick, next: *next, run: *run,
                              attempts_max: *attempts_max, budget_ms: *budget_ms };
            Rows(db.fire_tick(&fire))
        },
    }

    /// How long the earliest planned tick nobody has handled has been due,
    /// in ms by Postgres's clock; 0 when none is: the schedulers' lag, the
    /// first entry of `schedules_next_tick`.
    ScheduleLag => {
        name: "schedule_lag",
        access: Read,
        class: [],
        reply: Value,
        sql: "SELECT GREATEST(coalesce(pelican_now_ms() - (SELECT next_tick FROM schedules \
                WHERE next_tick > 0 ORDER BY next_tick LIMIT 1), 0), 0) AS value",
        show: [],
        model: |db| Rows(db.schedule_lag(db.clock)),
    }

    /// The deployment's stored partition count (0: none stored yet).
    ReadPartitions => {
        name: "read_partitions",
        access: Read,
        class: [],
        reply: Value,
        sql: "SELECT coalesce((SELECT value FROM deployment WHERE key = 'partitions'), 0) AS value",
        show: [],
        model: |db| Rows(u64::from(db.partitions.unwrap_or(0))),
    }

    /// `pelican partitions --set`: the deployment's partition count becomes
    /// `partitions` (1) unless that is fewer than the stored count (0):
    /// entries in a dropped partition would be read by no worker.
    SetPartitions { partitions: u32 } => {
        name: "set_partitions",
        access: Write,
        class: [],
        reply: Rows,
        sql: "INSERT INTO deployment AS d (key, value) VALUES ('partitions', $1) \
              ON CONFLICT (key) DO UPDATE SET value = $1 WHERE d.value <= $1",
        show: [partitions],
        model: |db| Rows(db.set_partitions(*partitions)),
    }

    /// A fresh run id.
    NextRunId => {
        name: "next_run_id",
        access: Write,
        class: [],
        reply: NewRun,
        sql: "SELECT nextval('run_ids')",
        show: [],
        model: |db| DbReply::NewRun(db.next_run_id()),
    }

    /// `count` fresh run ids, in increasing order: a bulk submission's.
    NextRunIds { count: u32 } => {
        name: "next_run_ids",
        access: Write,
        class: [],
        reply: NewRuns,
        sql: "SELECT nextval('run_ids') AS run_id FROM generate_series(1, $1) ORDER BY 1",
        show: [count],
        model: |db| DbReply::NewRuns((0..*count).map(|_| db.next_run_id()).collect()),
    }

    /// The run's attempts in order, each with how and when it ended
    /// ([`RunRow::outcome_of`], [`RunRow::ended_of`]).
    ReadAttempts { run: RunId } => {
        name: "read_attempts",
        access: Read,
        class: [],
        reply: Attempts,
        sql: "SELECT a.attempt, a.fence, a.worker, a.entry_id, a.dispatch, \
                     coalesce(a.outcome, CASE WHEN r.status = 'succeeded' AND a.fence = r.active_fence \
                                              THEN 'succeeded' END) AS outcome, a.claimed_seq, a.claimed_at, \
                     coalesce(a.ended_at, CASE WHEN r.status = 'succeeded' AND a.fence = r.active_fence \
                                               THEN r.finished_at END) AS ended_at \
                FROM attempts a JOIN runs r ON r.run_id = a.run_id \
               WHERE a.run_id = $1 ORDER BY a.attempt",
        show: [run],
        model: |db| DbReply::Attempts(db.read_attempts(*run)),
    }

    /// Up to `limit` dead letters of runs after `after`, by run (keyset
    /// pagination: the next page starts after the last run of this one).
    ListDeadLetters { after: RunId, limit: usize } => {
        name: "list_dead_letters",
        access: Read,
        class: [],
        reply: DeadLetters,
        sql: "SELECT run_id, source_entry, class, message, attempts, requeued \
              FROM dead_letters WHERE run_id > $1 ORDER BY run_id LIMIT $2",
        show: [after],
        model: |db| DbReply::DeadLetters(db.list_dead_letters(*after, *limit)),
    }

    /// Up to `limit` runs after `after`, by run, that pass the filter
    /// ([`RunFilter`]: status, kind, ended within a range), for `GET /runs`
    /// (keyset pagination): each as [`RunRow::summary`] has it, without
    /// the values a page does not show, so a page of 1,000 reads no input
    /// or result.
    ListRuns { status: String, kind: String, ended_from_ms: u64, ended_to_ms: u64, after: RunId, limit: usize } => {
        name: "list_runs",
        access: Read,
        class: [],
        reply: Runs,
        sql: concat!(
            "SELECT ",
            run_columns!(
                "'' AS input",
                "NULL::text AS result",
                concat!("left(error_message, ", summary_message_max!(), ") AS error_message")
            ),
            " FROM runs WHERE ", run_filter!(), " AND run_id > $5 ORDER BY run_id LIMIT $6"
        ),
        show: [after],
        model: |db| {
            let filter = RunFilter { status, kind, ended_from_ms: *ended_from_ms, ended_to_ms: *ended_to_ms };
            DbReply::Runs(db.list_runs(&filter, *after, *limit).into_iter().map(RunRow::summary).collect())
        },
    }

    /// How many runs pass the filter of [`Statement::ListRuns`], by status:
    /// the count an operator confirms before a bulk action.
    CountMatching { status: String, kind: String, ended_from_ms: u64, ended_to_ms: u64 } => {
        name: "count_matching",
        access: Read,
        class: [],
        reply: Counts,
        sql: concat!(
            "SELECT status, count(*) AS n FROM runs WHERE ", run_filter!(),
            " GROUP BY status ORDER BY status"
        ),
        show: [],
        model: |db| {
            let filter = RunFilter { status, kind, ended_from_ms: *ended_from_ms, ended_to_ms: *ended_to_ms };
            DbReply::Counts(db.count_matching(&filter))
        },
    }

    /// The run idempotency key `key` names (none: an unknown or expired
    /// key), for a search by key.
    RunOfKey { key: String } => {
        name: "run_of_key",
        access: Read,
        class: [],
        reply: NewRuns,
        sql: "SELECT run_id FROM submit_keys WHERE key = $1",
        show: [],
        model: |db| DbReply::NewRuns(db.run_of_key(key)),
    }

    /// How many runs have each status.
    CountRuns => {
        name: "count_runs",
        access: Read,
        class: [],
        reply: Counts,
        sql: "SELECT status, count(*) AS n FROM runs GROUP BY status ORDER BY status",
        show: [],
        model: |db| DbReply::Counts(db.count_runs()),
    }

    /// How many live (unfinished) runs have each status: a few rows,
    /// however many runs are live.
    CountLive => {
        name: "count_live",
        access: Read,
        class: [],
        reply: Counts,
        // The counts kept by migration 13's triggers (`SCHEMA_COUNTS`):
        // their base and the deltas not folded into it yet.
        sql: "SELECT status, sum(n)::bigint AS n FROM \
              (SELECT status, n FROM run_counts UNION ALL SELECT status, n FROM run_count_deltas) c \
              GROUP BY status HAVING sum(n) <> 0 ORDER BY status",
        show: [],
        model: |db| DbReply::Counts(db.count_live()),
    }

    /// Runs that finished in the last `minutes` minutes (Postgres's
    /// clock), counted by the minute they finished in and their status:
    /// the throughput `GET /queue` reports. A range of the `runs_finished`
    /// index, so its cost follows the window, not the table.
    FinishedPerMinute { minutes: u32 } => {
        name: "finished_per_minute",
        access: Read,
        class: [],
        reply: PerMinute,
        sql: "SELECT (finished_at / 60000) * 60000 AS minute, status, count(*) AS n FROM runs \
              WHERE finished_at > pelican_now_ms() - $1::bigint * 60000 \
              GROUP BY 1, 2 ORDER BY 1, 2",
        show: [minutes],
        model: |db| DbReply::PerMinute(db.finished_per_minute(*minutes)),
    }

    /// The runs that succeeded in the last `minutes` minutes (Postgres's
    /// clock), by the minute they succeeded in: how many, and their time
    /// from publication to success at p50 and p99 (`percentile_disc`).
    /// A range of the `runs_finished` index, as [`Statement::FinishedPerMinute`].
    LatencyPerMinute { minutes: u32 } => {
        name: "latency_per_minute",
        access: Read,
        class: [],
        reply: Latency,
        sql: "SELECT (finished_at / 60000) * 60000 AS minute, count(*) AS n, \
                     percentile_disc(0.5) WITHIN GROUP (ORDER BY greatest(finished_at - published_at, 0)) AS p50, \
                     percentile_disc(0.99) WITHIN GROUP (ORDER BY greatest(finished_at - published_at, 0)) AS p99 \
                FROM runs \
               WHERE finished_at > pelican_now_ms() - $1::bigint * 60000 \
                 AND status = 'succeeded' AND published_at IS NOT NULL \
               GROUP BY 1 ORDER BY 1",
        show: [minutes],
        model: |db| DbReply::Latency(db.latency_per_minute(*minutes)),
    }

    /// Whether run id `run` was ever handed out: a run without a row whose
    /// id was is one retention deleted.
    RunIssued { run: RunId } => {
        name: "run_issued",
        access: Read,
        class: [],
        reply: Applied,
        sql: "SELECT $1 <= (SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM run_ids) AS applied",
        show: [run],
        model: |db| Rows(u64::from(run.0 <= db.run_ids)),
    }

    /// Whether Postgres answers (`/healthz`).
    Ping => {
        name: "ping",
        access: Read,
        class: [],
        reply: Rows,
        sql: "SELECT 1",
        show: [],
        model: |_db| Rows(1),
    }

    /// Retention: delete up to `limit` runs finished `keep_ms` or longer
    /// ago, with their attempts, dead letters, steps and events. Their
    /// idempotency keys stay for their own window ([`Statement::ExpireKeys`]): a
    /// retry under one still answers its run, deleted or not.
    DeleteFinished { keep_ms: u64, limit: usize } => {
        name: "delete_finished",
        access: Write,
        class: [deletes],
        reply: Rows,
        sql: concat!(pick_finished!(), delete_picked!()),
        show: [],
        model: |db| Rows(db.delete_finished(db.clock.sub_ms(*keep_ms), *limit).len() as u64),
    }

    /// Slots `0..slots` of `provider`'s concurrency limit exist (made free).
    EnsureSlots { provider: String, slots: u32 } => {
        name: "ensure_slots",
        access: Write,
        class: [],
        reply: Rows,
        sql: "INSERT INTO provider_slots (provider, slot) SELECT $1, g FROM generate_series(0, $2 - 1) g \
              ON CONFLICT (provider, slot) DO NOTHING",
        show: [provider],
        model: |db| Rows(db.ensure_slots(provider, *slots)),
    }

    /// `holder` takes the lowest free slot of `provider` below `slots`
    /// for `hold_ms` (1), or finds them all held (0). A held slot is
    /// skipped, not waited for.
    AcquireSlot { provider: String, slots: u32, holder: String, hold_ms: u64 } => {
        name: "acquire_slot",
        access: Write,
        class: [takes_slot(provider, slots, holder, hold_ms)],
        reply: Rows,
        sql: "WITH free AS ( \
                SELECT slot FROM provider_slots \
                 WHERE provider = $1 AND slot < $2 AND until_ms <= pelican_now_ms() \
                 ORDER BY slot LIMIT 1 FOR UPDATE SKIP LOCKED) \
              UPDATE provider_slots p SET holder = $3, until_ms = pelican_now_ms() + $4 FROM free \
               WHERE p.provider = $1 AND p.slot = free.slot AND p.until_ms <= pelican_now_ms()",
        show: [provider, holder],
        model: |db| Rows(db.acquire_slot(provider, *slots, holder, *hold_ms)),
    }

    #[cfg(feature = "mutants")]
    /// Mutant twin of `AcquireSlot` (`Overbooked`): takes the lowest slot
    /// of `provider` below `slots`, whether or not its hold has run out.
    AcquireAnySlot { provider: String, slots: u32, holder: String, hold_ms: u64 } => {
        name: "acquire_any_slot",
        access: Write,
        class: [takes_slot(provider, slots, holder, hold_ms)],
        reply: Rows,
        sql: "UPDATE provider_slots SET holder = $3, until_ms = pelican_now_ms() + $4 \
               WHERE provider = $1 AND slot = ( \
                 SELECT min(slot) FROM provider_slots WHERE provider = $1 AND slot < $2)",
        show: [provider, holder],
        model: |db| Rows(db.acquire_any_slot(provider, *slots, holder, *hold_ms)),
    }

    /// Frees the slots of `provider` that `holder` holds.
    ReleaseSlot { provider: String, holder: String } => {
        name: "release_slot",
        access: Write,
        class: [frees_slot(provider, holder)],
        reply: Rows,
        sql: "UPDATE provider_slots SET holder = '', until_ms = 0 WHERE provider = $1 AND holder = $2",
        show: [provider, holder],
        model: |db| Rows(db.release_slot(provider, holder)),
    }

    /// One request of `provider` at one per `interval_ns`, `burst` at once
    /// (GCRA on the provider's row, locked by the upsert): 1, or 0 when it
    /// is too soon. The state is `tat_ns`; `tat_ms` (its floor) is kept
    /// for workers of schema 15 and earlier, whose writes count here too.
    TakeToken { provider: String, interval_ns: u64, burst: u32 } => {
        name: "take_token",
        access: Write,
        class: [takes_token(provider, interval_ns, burst)],
        reply: Rows,
        sql: "INSERT INTO provider_rates AS r (provider, tat_ms, tat_ns) \
              VALUES ($1, (pelican_now_ns() + $2) / 1000000, pelican_now_ns() + $2) \
              ON CONFLICT (provider) DO UPDATE \
                SET tat_ns = GREATEST(r.tat_ns, r.tat_ms * 1000000, pelican_now_ns()) + $2, \
                    tat_ms = (GREATEST(r.tat_ns, r.tat_ms * 1000000, pelican_now_ns()) + $2) / 1000000 \
               WHERE GREATEST(r.tat_ns, r.tat_ms * 1000000, pelican_now_ns()) - pelican_now_ns() \
                     <= ($3 - 1) * $2",
        show: [provider],
        model: |db| Rows(db.take_token(provider, *interval_ns, *burst)),
    }

    /// An operator's re-run of a dead run, with `extra_attempts` more, a
    /// fresh elapsed budget of `budget_ms` from now (0: none; the
    /// requeuer's for the run's kind) and its count of unknown errors
    /// reset: it starts over as a new submission would.
    DlqRequeue { run: RunId, extra_attempts: u32, budget_ms: u64 } => {
        name: "dlq_requeue",
        access: Write,
        class: [events(run)],
        reply: Rows,
        sql: concat!("WITH d AS (UPDATE dead_letters SET requeued = true WHERE run_id = $1 AND NOT requeued \
                RETURNING run_id), \
              r AS (UPDATE runs SET status = 'queued', attempts_max = attempts + $2, dispatch = dispatch + 1, \
                     published_at = NULL, finished_at = NULL, lease_until = NULL, retry_at = NULL, \
                     deadline_ms = pelican_now_ms() + NULLIF($3, 0), unknown_failures = 0, \
                     events = events + 1 \
               WHERE run_id IN (SELECT run_id FROM d) AND status = 'dead' \
               RETURNING run_id, events, attempts, active_fence) ",
              event_row!(), "SELECT run_id, events, 'requeued', attempts, active_fence, NULL, '' FROM r"),
        show: [run],
        model: |db| Rows(db.dlq_requeue(*run, *extra_attempts, budget(*budget_ms))),
    }

    #[cfg(feature = "mutants")]
    /// Mutant twin of `Claim` (`ReviveCancelled`): also takes over
    /// cancelled runs.
    ClaimReviving { run: RunId, dispatch: Dispatch, entry: EntryId, worker: String, lease_ms: u64 } => {
        name: "claim_reviving",
        access: Write,
        class: [claims(run), events(run)],
        reply: Claimed,
        sql: concat!("WITH claimed AS ( \
                UPDATE runs SET status = 'running', active_fence = active_fence + 1, attempts = attempts + 1, \
                       events = events + 1, \
                       lease_until = pelican_now_ms() + $5, retry_at = NULL, entry_id = $3, \
                       published_at = coalesce(published_at, pelican_now_ms()) \
                 WHERE run_id = $1 AND attempts < attempts_max \
                   AND (status = 'cancelled' OR (dispatch = $2 \
                        AND (status = 'queued' OR (status = 'running' AND lease_until <= pelican_now_ms() AND entry_id = $3)))) \
                RETURNING run_id, active_fence, attempts, attempts_max, unknown_failures, \
                          deadline_ms - pelican_now_ms() AS budget_left_ms, dispatch, kind, input, trace_parent, events), ",
              claim_tail!()),
        show: [run, dispatch, entry],
        model: |db| DbReply::Claimed(
            db.claim_reviving(*run, *dispatch, *entry, worker, db.clock, *lease_ms)
                .map(|c| db.claimed_job(*run, c)),
        ),
    }

    #[cfg(feature = "mutants")]
    /// Mutant twin of `Claim` (`WorkerClock`): the lease is judged by the
    /// claiming worker's clock, `now`, not by Postgres's.
    ClaimAt { run: RunId, dispatch: Dispatch, entry: EntryId, worker: String, now: Timestamp, lease_ms: u64 } => {
        name: "claim_at",
        access: Write,
        class: [claims(run), events(run)],
        reply: Claimed,
        sql: concat!("WITH claimed AS ( \
                UPDATE runs SET status = 'running', active_fence = active_fence + 1, attempts = attempts + 1, \
                       events = events + 1, \
                       lease_until = $5 + $6, retry_at = NULL, entry_id = $3, \
                       published_at = coalesce(published_at, $5) \
                 WHERE run_id = $1 AND dispatch = $2 AND attempts < attempts_max \
                   AND (status = 'queued' OR (status = 'running' AND lease_until <= $5 AND entry_id = $3)) \
                RETURNING run_id, active_fence, attempts, attempts_max, unknown_failures, \
                          deadline_ms - $5 AS budget_left_ms, dispatch, kind, input, trace_parent, events), ",
              claim_tail!()),
        show: [run, dispatch, entry],
        model: |db| DbReply::Claimed(
            db.claim(*run, *dispatch, *entry, worker, *now, *lease_ms)
                .map(|c| db.claimed_job(*run, c)),
        ),
    }

    #[cfg(feature = "mutants")]
    /// Mutant twin of `FireTick` (`TickUnfenced`): handles the tick
    /// whatever `next_tick` holds now.
    FireTickUnfenced { schedule: String, tick: Timestamp, next: Timestamp, run: RunId, attempts_max: u32, budget_ms: u64 } => {
        name: "fire_tick_unfenced",
        access: Write,
        class: [sweeps, ticks(schedule)],
        reply: Rows,
        sql: fire_tick!("", "$2", "$3", "$4", "$5", "$6"),
        show: [schedule, tick, run],
        model: |db| {
            let fire = Fire { schedule, expect: None, tick: *tick, next: *next, run: *run,
                              attempts_max: *attempts_max, budget_ms: *budget_ms };
            Rows(db.fire_tick(&fire))
        },
    }

    #[cfg(feature = "mutants")]
    /// Mutant twin of `PromoteRetries` (`PromoteEarly`): promotes every
    /// delayed run, due or not, beside the due retries.
    PromoteEarly { limit: usize } => {
        name: "promote_early",
        access: Write,
        class: [sweeps],
        reply: Candidates,
        sql: concat!("WITH due AS MATERIALIZED ( \
                SELECT run_id FROM runs WHERE (status = 'retry_wait' AND retry_at <= pelican_now_ms()) \
                    OR status = 'delayed' \
                 ORDER BY retry_at, run_id LIMIT $1 FOR UPDATE SKIP LOCKED), ",
              queue_due!()),
        show: [],
        model: |db| Candidates(db.promote(db.clock, *limit, true)),
    }

    #[cfg(feature = "mutants")]
    /// Mutant twin of `DeleteFinished` (`RetainLive`): ages runs by their
    /// publication, finished or not.
    DeletePublished { keep_ms: u64, limit: usize } => {
        name: "delete_published",
        access: Write,
        class: [deletes],
        reply: Rows,
        sql: concat!("WITH picked AS MATERIALIZED ( \
                SELECT run_id FROM runs WHERE published_at <= GREATEST(pelican_now_ms() - $1, 0) \
                 ORDER BY published_at, run_id LIMIT $2 FOR UPDATE SKIP LOCKED), ",
              delete_picked!()),
        show: [],
        model: |db| Rows(db.delete_published(db.clock.sub_ms(*keep_ms), *limit).len() as u64),
    }

    #[cfg(feature = "mutants")]
    /// Mutant twin of `DeleteFinished` (`ForgetKeys`): deletes the runs'
    /// idempotency keys with them.
    DeleteFinishedKeys { keep_ms: u64, limit: usize } => {
        name: "delete_finished_keys",
        access: Write,
        class: [deletes],
        reply: Rows,
        sql: concat!(pick_finished!(),
              "k AS (DELETE FROM submit_keys WHERE run_id = ANY (ARRAY(SELECT run_id FROM picked))), ",
              delete_picked!()),
        show: [],
        model: |db| Rows(db.delete_finished_keys(db.clock.sub_ms(*keep_ms), *limit).len() as u64),
    }

    #[cfg(feature = "mutants")]
    /// Mutant twin (`RetryInPel`): records the failure, leaves the run
    /// running.
    RecordFailureOnly { run: RunId, fence: Fence, class: ErrorClass, message: String } => {
        name: "record_failure_only",
        access: FencedWrite(run, fence),
        class: [],
        reply: Rows,
        sql: "WITH done AS ( \
                UPDATE runs SET error_class = $3, error_message = $4 \
                 WHERE run_id = $1 AND active_fence = $2 AND status = 'running' RETURNING run_id) \
              UPDATE attempts SET outcome = $3, ended_at = pelican_now_ms() WHERE run_id IN (SELECT run_id FROM done) AND fence = $2",
        show: [run, fence],
        model: |db| Rows(db.record_failure_only(*run, *fence, *class, message)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_snake_case() {
        let mut seen = std::collections::BTreeSet::new();
        for s in Statement::ALL {
            assert!(seen.insert(s.name()), "{} declared twice", s.name());
            assert!(
                s.name().chars().all(|c| c.is_ascii_lowercase() || c == '_'),
                "{}",
                s.name()
            );
        }
    }

    /// Fixed field values; a time only where `times` allows it (the
    /// WorkerClock mutant's claim always takes one).
    struct Fixed {
        times: bool,
    }

    macro_rules! fixed {
        ($($t:ty => $v:expr),*) => {$(impl Pick<$t> for Fixed {
            fn pick(&mut self, _: Statement, _: &'static str) -> $t { $v }
        })*};
    }
    fixed!(RunId => RunId(1), Fence => Fence(1), Dispatch => Dispatch(1),
           EntryId => EntryId::new(1, 0), String => String::new(),
           ErrorClass => ErrorClass::Terminal, u64 => 1, u32 => 1, usize => 1,
           Overlap => Overlap::Skip, Catchup => Catchup::Skip);

    impl Pick<Timestamp> for Fixed {
        fn pick(&mut self, s: Statement, field: &'static str) -> Timestamp {
            // A tick's times are cron times the scheduler planned from
            // Postgres's clock, as `DueSchedules` answered it.
            let times = self.times || s == Statement::FireTick;
            #[cfg(feature = "mutants")]
            let times = times || s == Statement::ClaimAt || s == Statement::FireTickUnfenced;
            assert!(
                times,
                "{} takes `{field}`, a time from its sender",
                s.name()
            );
            Timestamp(1)
        }
    }

    /// One clock: no statement takes a time from its sender; Postgres's
    /// clock (`pelican_now_ms()`) is the only one a statement reads. Only
    /// the WorkerClock mutant's claim breaks this. (`FireTick`'s times
    /// are ticks, planned from Postgres's clock.)
    #[test]
    fn no_statement_takes_its_senders_clock() {
        for &s in Statement::ALL {
            let _ = DbOp::draw(s, &mut Fixed { times: false });
        }
    }

    /// Each statement's model twin answers in the shape its entry declares,
    /// so its typed answer ([`Query`]) is always there.
    #[test]
    fn each_twin_answers_in_its_declared_shape() {
        let mut fixed = Fixed { times: true };
        for &s in Statement::ALL {
            let mut db = Db::default();
            let reply = db.execute(&DbOp::draw(s, &mut fixed));
            assert!(s.shape().fits(&reply), "{} answered {reply:?}", s.name());
        }
    }

    #[test]
    fn each_statement_binds_exactly_its_placeholders() {
        // Every $n from 1 to the parameter count appears, and no higher one.
        let mut fixed = Fixed { times: true };
        for &s in Statement::ALL {
            let n = DbOp::draw(s, &mut fixed).params().len();
            for text in std::iter::once(s.sql()).chain(s.many_sql()) {
                for i in 1..=n {
                    assert!(text.contains(&format!("${i}")), "{}: no ${i}", s.name());
                }
                assert!(
                    !text.contains(&format!("${}", n + 1)),
                    "{}: ${} unbound",
                    s.name(),
                    n + 1
                );
            }
            if s.many_sql().is_some() {
                assert!(
                    matches!(
                        DbOp::draw(s, &mut fixed).params().first(),
                        Some(Param::Int8(_))
                    ),
                    "{}: a batched form is keyed by its first parameter, the run",
                    s.name()
                );
            }
        }
    }
}
