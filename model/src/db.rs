// Over 600 lines: the reference database is one type, a method per statement (the twins the
// table in statements.rs calls) beside the rows they read and write.
//! Reference semantics of Pelican's PostgreSQL schema.
//!
//! Each method of [`Db`] is the twin of exactly one SQL statement, declared
//! in [`Statement`] with its text: the real binding runs that text, and
//! nothing else in the workspace restates its conditions. A method answers
//! what Postgres answers: the rows affected, or the rows returned. The
//! conditions in each `WHERE` are the protocol: the fence check (S3), the
//! status checks that make terminal states final (S2), the lease that keeps a
//! live attempt from being taken over, and the dispatch that makes old stream
//! entries stale.
//!
//! Each method takes the time it compares or stores as an argument; the
//! statement table passes [`Db::clock`], Postgres's clock, which whoever
//! runs the model sets (the checker, the simulator's Postgres node, the
//! conformance suite).
//!
//! The file is long because it is the whole schema's semantics: one short
//! method per statement, meant to be read beside its SQL.

use crate::events::{EventKind, RunEvent};
use crate::ids::{AttemptNo, Dispatch, EntryId, Fence, RunId, WorkerId};
use crate::status::{AttemptOutcome, ErrorClass, RunStatus};
use crate::time::Timestamp;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// [`RunRow::SUMMARY_MESSAGE_MAX`] as a literal, so that `ListRuns`' SQL
/// cuts messages by the same figure (`concat!` takes literals only).
macro_rules! summary_message_max {
    () => {
        256
    };
}

/// [`RunFilter`] in SQL, over its fields bound first (`$1` status, `$2`
/// kind, `$3` and `$4` the range of ends), stated once for every
/// statement that filters runs so.
macro_rules! run_filter {
    () => {
        "($1 = '' OR status = $1) AND ($2 = '' OR kind = $2) \
         AND ($3 = 0 OR finished_at >= $3) AND ($4 = 0 OR finished_at < $4)"
    };
}

/// The columns of a `runs` row, in the order and with the names that
/// [`RunRow`]'s decoder reads, stated once for every statement and read
/// that answers rows: the full row; its head (`head`: the users' values,
/// input, result and error message, read as empty, as [`RunRow::head`]);
/// or the three user columns given as SQL expressions.
macro_rules! run_columns {
    () => {
        run_columns!("input", "result", "error_message")
    };
    (head) => {
        run_columns!("'' AS input", "NULL::text AS result", "'' AS error_message")
    };
    ($input:expr, $result:expr, $message:expr) => {
        concat!(
            "run_id, kind, ",
            $input,
            ", status, dispatch, active_fence, attempts, attempts_max, lease_until, retry_at, \
             published_at, finished_at, entry_id, ",
            $result,
            ", error_class, ",
            $message,
            ", unknown_failures, deadline_ms, events, trace_parent, due_at"
        )
    };
}

/// The columns of a `schedules` row, in the order [`ScheduleRow`]'s
/// decoder reads them, stated once for every statement and read that
/// answers schedules.
///
/// [`ScheduleRow`]: crate::schedule::ScheduleRow
macro_rules! schedule_columns {
    () => {
        "name, id, kind, input, cron, tz, overlap, catchup, next_tick, last_tick, last_run, \
         fired, skipped"
    };
}

mod answers;
mod class;
mod reads;
mod schedules;
pub mod sql;
mod statements;

pub use answers::{Answer, AnswerOf, Keyed, Query, QueryError, Shape, Shaped, Unfit, shape};
pub use class::{Class, SlotTake};
pub use reads::{MinuteLatency, RunFilter};
pub use schedules::{Fire, NewSchedule};
pub use statements::{
    Access, Column, DbOp, DbReply, Param, Pick, Picks, Statement, ToParam, columns, query,
};

/// One row of `runs`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RunRow {
    /// Primary key.
    pub run_id: RunId,
    /// The job kind (which handler runs it).
    pub kind: String,
    /// The job's input (JSON text).
    pub input: String,
    /// Lifecycle state.
    pub status: RunStatus,
    /// Current publication number; stream entries of older dispatches are stale.
    pub dispatch: Dispatch,
    /// The fence of the newest attempt (0: none yet).
    pub active_fence: Fence,
    /// Attempts started so far.
    pub attempts: u32,
    /// Attempts allowed.
    pub attempts_max: u32,
    /// While running: the attempt's lease, renewed by heartbeats.
    pub lease_until: Option<Timestamp>,
    /// While waiting for a retry, or delayed: when it is due.
    pub retry_at: Option<Timestamp>,
    /// When a delayed run was due to start (its submission's `delay_ms` or
    /// `run_at_ms`), kept for good; `None`: submitted without a delay. No
    /// attempt of the run starts before it (S15).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub due_at: Option<Timestamp>,
    /// When the current dispatch was published, or taken by the outbox to
    /// publish (NULL: queued and waiting for the outbox). Set once a run
    /// leaves `queued`, so the outbox's index holds only its work.
    pub published_at: Option<Timestamp>,
    /// When the run became terminal (NULL: not yet). Runs without one are
    /// the live runs (index `runs_live`); retention deletes by it.
    #[serde(default)]
    pub finished_at: Option<Timestamp>,
    /// The stream entry that announced the current dispatch, or that the
    /// current attempt was claimed from.
    pub entry_id: Option<EntryId>,
    /// The result, once succeeded.
    pub result: Option<String>,
    /// The last error's class and message.
    pub error: Option<(ErrorClass, String)>,
    /// Retries scheduled after errors of class `unknown` (capped by
    /// `Policy::unknown_retries_max`).
    #[serde(default)]
    pub unknown_failures: u32,
    /// When the run's elapsed budget runs out (its kind's `budget_ms`
    /// after it was inserted; `None`: no budget).
    #[serde(default)]
    pub deadline: Option<Timestamp>,
    /// The number of the run's latest event ([`crate::events`]): 1 when
    /// inserted (its `queued` event), one more at each event.
    #[serde(default = "first_event")]
    pub events: u32,
    /// The W3C `traceparent` the run was submitted under (`None`: none
    /// given): its spans join that trace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<String>,
}

impl RunRow {
    /// The most of an error message a page of runs shows
    /// ([`RunRow::summary`]), in characters.
    pub const SUMMARY_MESSAGE_MAX: usize = summary_message_max!();

    /// The row as a page of runs has it ([`Statement::ListRuns`]): input and
    /// result empty, the error message cut to its first
    /// [`RunRow::SUMMARY_MESSAGE_MAX`] characters.
    #[must_use]
    pub fn summary(self) -> RunRow {
        let cut = |m: String| m.chars().take(Self::SUMMARY_MESSAGE_MAX).collect();
        RunRow {
            input: String::new(),
            result: None,
            error: self.error.map(|(class, m)| (class, cut(m))),
            ..self
        }
    }

    /// The row without its users' values ([`Statement::ReadRunHead`]):
    /// input, result and error message empty.
    #[must_use]
    pub fn head(self) -> RunRow {
        RunRow {
            input: String::new(),
            result: None,
            error: self.error.map(|(class, _)| (class, String::new())),
            ..self
        }
    }
}

fn first_event() -> u32 {
    1
}

impl RunRow {
    /// Whether no live attempt holds the run at `now`: it is queued, or
    /// running under a lease that has run out. Such a run is claimable
    /// (a lapsed attempt through its own entry only) and, once its
    /// attempts are spent, buried.
    #[must_use]
    pub fn orphaned(&self, now: Timestamp) -> bool {
        match self.status {
            RunStatus::Queued => true,
            RunStatus::Running => self.lease_until.is_some_and(|l| l <= now),
            _ => false,
        }
    }

    /// How attempt `a` of this run ended: its recorded outcome, or
    /// `Succeeded` if it holds the fence of this succeeded run. A success
    /// is the run's last write, and the fence of a succeeded run never
    /// changes again, so the run's row is the succeeding attempt's record:
    /// [`Db::complete`], the hot path's outcome, writes no attempt row.
    #[must_use]
    pub fn outcome_of(&self, a: &AttemptRow) -> Option<AttemptOutcome> {
        a.outcome
            .or_else(|| self.succeeded_by(a).then_some(AttemptOutcome::Succeeded))
    }

    /// When attempt `a` of this run ended: its own `ended_at`, or the
    /// run's end if `a` is the attempt that succeeded.
    #[must_use]
    pub fn ended_of(&self, a: &AttemptRow) -> Option<Timestamp> {
        a.ended_at
            .or_else(|| self.finished_at.filter(|_| self.succeeded_by(a)))
    }

    fn succeeded_by(&self, a: &AttemptRow) -> bool {
        self.status == RunStatus::Succeeded && a.fence == self.active_fence
    }
}

/// One row of `attempts`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AttemptRow {
    /// Its fence.
    pub fence: Fence,
    /// The consumer (worker) that claimed it.
    pub worker: String,
    /// The entry it was claimed from.
    pub entry_id: EntryId,
    /// The dispatch it was claimed for.
    pub dispatch: Dispatch,
    /// How it ended, once recorded: a failure. A success is read from the
    /// run's row ([`RunRow::outcome_of`]); only successes written by
    /// releases before schema version 14 are recorded here.
    pub outcome: Option<AttemptOutcome>,
    /// The number of its `claimed` event (none for attempts claimed before
    /// the run had events: schema version 10).
    #[serde(default)]
    pub claimed_seq: Option<u32>,
    /// When it was claimed, by Postgres's clock (none before schema
    /// version 19). History for people: no statement decides by it.
    #[serde(default)]
    pub claimed_at: Option<Timestamp>,
    /// When its failure was written (a success's end is the run's
    /// `finished_at`: [`RunRow::ended_of`]); none while it runs, or if it
    /// was fenced off without an outcome.
    #[serde(default)]
    pub ended_at: Option<Timestamp>,
}

/// One row of `dead_letters`: what an operator needs to investigate (S6).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DeadLetter {
    /// The stream entry the last attempt came from.
    pub source_entry: Option<EntryId>,
    /// Why the run died.
    pub class: ErrorClass,
    /// The last error message.
    pub message: String,
    /// Every attempt: number, fence, outcome.
    pub attempts: Vec<(AttemptNo, Fence, Option<AttemptOutcome>)>,
    /// Whether an operator requeued it (the run then runs again).
    pub requeued: bool,
}

/// What a successful claim returns: the new attempt's fence and number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Claimed {
    /// The new fence.
    pub fence: Fence,
    /// The new attempt's number.
    pub attempt: AttemptNo,
    /// Attempts the run allows (the last one dead-letters instead of retrying).
    pub attempts_max: u32,
    /// Retries the run has had after errors of class `unknown`.
    pub unknown_failures: u32,
    /// What is left of the run's elapsed budget at the claim, by
    /// Postgres's clock (`None`: no budget; 0 or less: spent).
    #[serde(default)]
    pub budget_left_ms: Option<i64>,
}

/// A claim's answer as the statement returns it: the new attempt and the job
/// to run (`RETURNING ..., kind, input`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ClaimedJob {
    /// The new attempt.
    pub claimed: Claimed,
    /// The job kind.
    pub kind: String,
    /// The job input.
    pub input: String,
    /// The `traceparent` the run was submitted under, if any.
    pub trace: Option<String>,
}

/// A run the sweeper looks at: possibly without a stream entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Candidate {
    /// The run.
    pub run_id: RunId,
    /// Its dispatch.
    pub dispatch: Dispatch,
    /// Its entry, if one was recorded.
    pub entry_id: Option<EntryId>,
    /// When its dispatch was published (or taken to be): the sweeper's
    /// order, with the run id.
    pub published_at: Option<Timestamp>,
}

/// One recorded step of a run (`steps`): what the job asked for and what
/// it produced, under the attempt that recorded it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct StepRow {
    /// The step's name, as the job asked for it.
    pub name: String,
    /// Its output (JSON text).
    pub output: String,
    /// The fence of the attempt that recorded it.
    pub fence: Fence,
}

/// A run as [`Db::insert_run_budgeted`] writes it: what its submission
/// carried.
#[derive(Clone, Copy, Debug)]
pub struct NewRunRow<'a> {
    /// The job's kind.
    pub kind: &'a str,
    /// The job's input, as JSON text.
    pub input: &'a str,
    /// How many attempts it may make.
    pub attempts_max: u32,
    /// Its budget, if any: from its due time if it is delayed, else from
    /// now.
    pub budget_ms: Option<u64>,
    /// The caller's `traceparent` (`""`: none).
    pub trace: &'a str,
    /// When it may start: not before this many ms from now, nor before
    /// this time (`Delay::NONE`: at once).
    pub delay: Delay,
}

/// When a submitted run may start: the later of `delay_ms` after its
/// insert and `at_ms`, both by Postgres's clock (0: no bound). A run with
/// either bound is inserted `delayed`, holds no stream entry until the
/// retry pass promotes it at that time, and its elapsed budget counts from
/// then.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct Delay {
    /// Not before this many ms after the insert (0: no bound).
    #[serde(default)]
    pub delay_ms: u64,
    /// Not before this time, in ms since the Unix epoch (0: no bound).
    #[serde(default)]
    pub at_ms: u64,
}

impl Delay {
    /// No delay: the run is queued at once.
    pub const NONE: Delay = Delay {
        delay_ms: 0,
        at_ms: 0,
    };

    /// Whether there is no delay (for serde's `skip_serializing_if`).
    #[must_use]
    pub fn is_none(&self) -> bool {
        !self.waits()
    }

    /// Whether the run waits (either bound is set).
    #[must_use]
    pub const fn waits(self) -> bool {
        self.delay_ms > 0 || self.at_ms > 0
    }

    /// When the run is due, for an insert at `now`; `None`: no delay.
    #[must_use]
    pub fn due(self, now: Timestamp) -> Option<Timestamp> {
        self.waits()
            .then(|| now.add_ms(self.delay_ms).max(Timestamp(self.at_ms)))
    }
}

/// A client's idempotency key for a submission (`submit_keys`): the run it
/// created, the request it was first used with, and when.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SubmitKey {
    /// The run the key's first submission created.
    pub run: RunId,
    /// That submission's kind and input ([`SubmitKey::request`]).
    pub request: String,
    /// When that submission was made.
    pub created_at: Timestamp,
}

impl SubmitKey {
    /// A request as `submit_keys.request` holds it: the kind's length in
    /// bytes, `:`, the kind, the input (unambiguous: the length says where
    /// the kind ends).
    #[must_use]
    pub fn request(kind: &str, input: &str) -> String {
        format!("{}:{kind}{input}", kind.len())
    }
}

/// The database: `runs`, `attempts`, `effects` (the side-effect ledger of the
/// demo tool service), `dead_letters` and `submit_keys`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Db {
    /// `runs`.
    pub runs: BTreeMap<RunId, RunRow>,
    /// `attempts`, keyed by (run, attempt number).
    pub attempts: BTreeMap<(RunId, AttemptNo), AttemptRow>,
    /// `effects`: idempotency key → times requested (applied once, at insert).
    pub effects: BTreeMap<String, u64>,
    /// `dead_letters`.
    pub dead_letters: BTreeMap<RunId, DeadLetter>,
    /// The `run_ids` sequence: the last id handed out.
    pub run_ids: u64,
    /// `submit_keys`: idempotency key → the run it made.
    pub keys: BTreeMap<String, SubmitKey>,
    /// `workers`: registered worker numbers → host name, pid, start time.
    pub workers: BTreeMap<u32, (String, u32, Timestamp)>,
    /// `steps`: the execution ledger, by (run, step index).
    #[serde(default)]
    pub steps: BTreeMap<(RunId, u32), StepRow>,
    /// `provider_slots`: (provider, slot) → the permit holding it (empty:
    /// none) and until when.
    #[serde(default)]
    pub slots: BTreeMap<(String, u32), (String, Timestamp)>,
    /// `deployment`'s partition count, once a process stored it.
    #[serde(default)]
    pub partitions: Option<u32>,
    /// `provider_rates`: provider → the theoretical arrival time of its
    /// next request (GCRA), in nanoseconds since the epoch.
    #[serde(default)]
    pub rates: BTreeMap<String, u64>,
    /// `run_events`: the events that are not an attempt row's, by (run,
    /// number).
    #[serde(default)]
    pub events: BTreeMap<(RunId, u32), RunEvent>,
    /// `schedules`, by name.
    #[serde(default)]
    pub schedules: BTreeMap<String, crate::schedule::ScheduleRow>,
    /// The `schedule_ids` sequence: the last number handed out.
    #[serde(default)]
    pub schedule_ids: u64,
    /// Postgres's clock (`pelican_now_ms()`): every time a statement stores
    /// or compares. Whoever runs the model sets it; a worker's clock never
    /// reaches a statement.
    pub clock: Timestamp,
}

impl Db {
    /// An empty database (after migrations).
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    fn attempt_mut(&mut self, run: RunId, fence: Fence) -> Option<&mut AttemptRow> {
        self.attempts
            .range_mut((run, AttemptNo(0))..=(run, AttemptNo(u32::MAX)))
            .map(|(_, a)| a)
            .find(|a| a.fence == fence)
    }

    /// The row of `run` if it is `running` under `fence` (the fenced-write
    /// condition shared by every write an attempt makes).
    fn fenced(&mut self, run: RunId, fence: Fence) -> Option<&mut RunRow> {
        self.runs
            .get_mut(&run)
            .filter(|r| r.active_fence == fence && r.status == RunStatus::Running)
    }

    /// Writes event `kind` of `run` as a `run_events` row, numbered by the
    /// run's row, at its current attempt; `fence` is the writer's.
    fn log(
        &mut self,
        run: RunId,
        kind: EventKind,
        fence: Fence,
        class: Option<ErrorClass>,
        data: &str,
    ) {
        let r = self.runs.get_mut(&run).expect("caller checked the row");
        r.events += 1;
        let event = RunEvent {
            seq: r.events,
            kind,
            attempt: AttemptNo(r.attempts),
            fence,
            class,
            data: data.to_owned(),
        };
        self.events.insert((run, event.seq), event);
    }

    /// A new run without a budget or a trace ([`Db::insert_run_budgeted`]).
    pub fn insert_run(&mut self, run: RunId, kind: &str, input: &str, attempts_max: u32) -> u64 {
        let new = NewRunRow {
            kind,
            input,
            attempts_max,
            budget_ms: None,
            trace: "",
            delay: Delay::NONE,
        };
        self.insert_run_budgeted(run, &new)
    }

    /// [`Statement::InsertRun`]: a new run, `queued`, dispatch 1, not yet
    /// published, whose budget (if any) starts now. Idempotent: a second
    /// insert of the same id affects no row.
    pub fn insert_run_budgeted(&mut self, run: RunId, new: &NewRunRow<'_>) -> u64 {
        let NewRunRow {
            kind,
            input,
            attempts_max,
            budget_ms,
            trace,
            delay,
        } = *new;
        if self.runs.contains_key(&run) {
            return 0;
        }
        let due = delay.due(self.clock);
        self.runs.insert(
            run,
            RunRow {
                run_id: run,
                kind: kind.to_owned(),
                input: input.to_owned(),
                status: if due.is_some() {
                    RunStatus::Delayed
                } else {
                    RunStatus::Queued
                },
                dispatch: Dispatch(1),
                active_fence: Fence(0),
                attempts: 0,
                attempts_max,
                lease_until: None,
                retry_at: due,
                due_at: due,
                published_at: None,
                finished_at: None,
                entry_id: None,
                result: None,
                error: None,
                unknown_failures: 0,
                deadline: budget_ms.map(|b| due.unwrap_or(self.clock).add_ms(b)),
                events: 1,
                trace: (!trace.is_empty()).then(|| trace.to_owned()),
            },
        );
        1
    }

    /// [`Statement::InsertRunKeyed`]: `insert_run` under the client's
    /// idempotency `key`, made now (by [`Db::clock`]). A new key records `run` and
    /// inserts it; a known key inserts nothing. Answers the key's run and
    /// whether its request (kind and input) is this one.
    pub fn insert_run_keyed(
        &mut self,
        run: RunId,
        new: &NewRunRow<'_>,
        key: &str,
    ) -> (RunId, bool) {
        let now = self.clock;
        let request = SubmitKey::request(new.kind, new.input);
        if let Some(k) = self.keys.get(key) {
            return (k.run, k.request == request);
        }
        self.keys.insert(
            key.to_owned(),
            SubmitKey {
                run,
                request,
                created_at: now,
            },
        );
        self.insert_run_budgeted(run, new);
        (run, true)
    }

    /// [`Statement::EnsureSlots`]: slots `0..slots` of `provider` exist
    /// (free, unless held already). Answers the slots made.
    pub fn ensure_slots(&mut self, provider: &str, slots: u32) -> u64 {
        let mut made = 0;
        for slot in 0..slots {
            self.slots
                .entry((provider.to_owned(), slot))
                .or_insert_with(|| {
                    made += 1;
                    (String::new(), Timestamp::ZERO)
                });
        }
        made
    }

    /// [`Statement::AcquireSlot`]: `holder` takes the lowest free slot of
    /// `provider` below `slots` (free: its hold ran out) until `hold_ms`
    /// from now. Answers 1, or 0 when every slot is held.
    pub fn acquire_slot(&mut self, provider: &str, slots: u32, holder: &str, hold_ms: u64) -> u64 {
        self.take_slot(provider, slots, holder, hold_ms, true)
    }

    /// [`Statement::AcquireAnySlot`], the mutant twin (`Overbooked`): takes
    /// the lowest slot, held or not.
    #[cfg(feature = "mutants")]
    pub fn acquire_any_slot(
        &mut self,
        provider: &str,
        slots: u32,
        holder: &str,
        hold_ms: u64,
    ) -> u64 {
        self.take_slot(provider, slots, holder, hold_ms, false)
    }

    fn take_slot(
        &mut self,
        provider: &str,
        slots: u32,
        holder: &str,
        hold_ms: u64,
        free_only: bool,
    ) -> u64 {
        let now = self.clock;
        let free = self
            .slots
            .range_mut((provider.to_owned(), 0)..(provider.to_owned(), slots))
            .find(|(_, (_, until))| !free_only || *until <= now);
        match free {
            Some((_, hold)) => {
                *hold = (holder.to_owned(), now.add_ms(hold_ms));
                1
            }
            None => 0,
        }
    }

    /// [`Statement::ReleaseSlot`]: frees the slots of `provider` that
    /// `holder` holds. Answers how many.
    pub fn release_slot(&mut self, provider: &str, holder: &str) -> u64 {
        let mut n = 0;
        for ((p, _), hold) in &mut self.slots {
            if p == provider && hold.0 == holder {
                *hold = (String::new(), Timestamp::ZERO);
                n += 1;
            }
        }
        n
    }

    /// [`Statement::TakeToken`]: one request of `provider` at a rate of one
    /// per `interval_ns`, `burst` at once (GCRA). Answers 1 and advances
    /// the provider's theoretical arrival time, or 0 (too soon).
    pub fn take_token(&mut self, provider: &str, interval_ns: u64, burst: u32) -> u64 {
        let now = self.clock.as_ms().saturating_mul(1_000_000);
        let tat = self.rates.get(provider).copied().unwrap_or(now).max(now);
        let tolerance = u64::from(burst.saturating_sub(1)).saturating_mul(interval_ns);
        if tat - now > tolerance {
            return 0;
        }
        self.rates
            .insert(provider.to_owned(), tat.saturating_add(interval_ns));
        1
    }

    /// [`Statement::ExpireKeys`]: forgets up to `limit` idempotency keys
    /// made at or before `before`, oldest first (ties by key, bytewise).
    pub fn expire_keys(&mut self, before: Timestamp, limit: usize) -> u64 {
        let mut old: Vec<(Timestamp, String)> = self
            .keys
            .iter()
            .filter(|(_, k)| k.created_at <= before)
            .map(|(key, k)| (k.created_at, key.clone()))
            .collect();
        old.sort();
        old.truncate(limit);
        for (_, key) in &old {
            self.keys.remove(key);
        }
        old.len() as u64
    }

    /// [`Statement::MarkPublished`]: the XADD of `dispatch` succeeded with `entry`.
    pub fn mark_published(
        &mut self,
        run: RunId,
        dispatch: Dispatch,
        entry: EntryId,
        now: Timestamp,
    ) -> u64 {
        match self.runs.get_mut(&run) {
            Some(r) if r.dispatch == dispatch && r.status == RunStatus::Queued => {
                r.published_at = Some(now);
                r.entry_id = Some(entry);
                1
            }
            _ => 0,
        }
    }

    /// [`Statement::Claim`]: start a new attempt of `run` for the delivery of
    /// `entry`, if the entry's dispatch is current, the run is queued (or
    /// running under an expired lease claimed through this same entry: a
    /// reclaim), and attempts remain. The new fence is one more than every
    /// earlier fence of the run.
    ///
    /// A lapsed attempt is taken over only through its own entry, so an
    /// entry that once finds its run running under another entry of its
    /// dispatch can never claim it again: the run does not return to
    /// `queued` under that dispatch (every requeue moves it on), and its
    /// entry changes only to one that claims it. That is what lets a
    /// delivery acknowledge a duplicate publication at once (S4).
    #[allow(clippy::too_many_arguments)]
    pub fn claim(
        &mut self,
        run: RunId,
        dispatch: Dispatch,
        entry: EntryId,
        worker: &str,
        now: Timestamp,
        lease_ms: u64,
    ) -> Option<Claimed> {
        let r = self.runs.get_mut(&run)?;
        let claimable =
            r.orphaned(now) && (r.status == RunStatus::Queued || r.entry_id == Some(entry));
        if r.dispatch != dispatch || !claimable || r.attempts >= r.attempts_max {
            return None;
        }
        Some(self.start_attempt(run, entry, worker, now, lease_ms))
    }

    fn start_attempt(
        &mut self,
        run: RunId,
        entry: EntryId,
        worker: &str,
        now: Timestamp,
        lease_ms: u64,
    ) -> Claimed {
        let r = self.runs.get_mut(&run).expect("caller checked the row");
        r.status = RunStatus::Running;
        r.active_fence = Fence(r.active_fence.0 + 1);
        r.attempts += 1;
        r.lease_until = Some(now.add_ms(lease_ms));
        r.retry_at = None;
        r.entry_id = Some(entry);
        r.published_at.get_or_insert(now);
        r.events += 1;
        let claimed_seq = Some(r.events);
        let claimed = Claimed {
            fence: r.active_fence,
            attempt: AttemptNo(r.attempts),
            attempts_max: r.attempts_max,
            unknown_failures: r.unknown_failures,
            budget_left_ms: r.deadline.map(|d| d.0 as i64 - now.0 as i64),
        };
        let dispatch = r.dispatch;
        self.attempts.insert(
            (run, claimed.attempt),
            AttemptRow {
                fence: claimed.fence,
                worker: worker.to_owned(),
                entry_id: entry,
                dispatch,
                outcome: None,
                claimed_seq,
                claimed_at: Some(self.clock),
                ended_at: None,
            },
        );
        claimed
    }

    /// Mutant twin of [`Db::claim`] that also takes over cancelled runs
    /// (`ReviveCancelled`). Only in a build with the `mutants` feature.
    #[cfg(feature = "mutants")]
    #[allow(clippy::too_many_arguments)]
    pub fn claim_reviving(
        &mut self,
        run: RunId,
        dispatch: Dispatch,
        entry: EntryId,
        worker: &str,
        now: Timestamp,
        lease_ms: u64,
    ) -> Option<Claimed> {
        let r = self.runs.get(&run)?;
        if r.status == RunStatus::Cancelled && r.attempts < r.attempts_max {
            return Some(self.start_attempt(run, entry, worker, now, lease_ms));
        }
        self.claim(run, dispatch, entry, worker, now, lease_ms)
    }

    /// [`Statement::ReadRun`].
    #[must_use]
    pub fn read_run(&self, run: RunId) -> Option<RunRow> {
        self.runs.get(&run).cloned()
    }

    /// [`Statement::ReadSteps`]: the steps recorded for `run`, by index.
    #[must_use]
    pub fn read_steps(&self, run: RunId) -> Vec<(u32, StepRow)> {
        self.steps
            .range((run, 0)..=(run, u32::MAX))
            .map(|((_, i), s)| (*i, s.clone()))
            .collect()
    }

    /// [`Statement::RecordStep`]: records step `step` of `run` for the
    /// attempt holding `fence`. 1 when recorded; 0 when the attempt no
    /// longer holds the run, or the step is recorded already (a record is
    /// never replaced).
    pub fn record_step(
        &mut self,
        run: RunId,
        fence: Fence,
        step: u32,
        name: &str,
        output: &str,
    ) -> u64 {
        if self.fenced(run, fence).is_none() || self.steps.contains_key(&(run, step)) {
            return 0;
        }
        let row = StepRow {
            name: name.to_owned(),
            output: output.to_owned(),
            fence,
        };
        self.steps.insert((run, step), row);
        1
    }

    /// [`Statement::Heartbeat`]: extend the lease of the attempt holding `fence`.
    pub fn heartbeat(&mut self, run: RunId, fence: Fence, now: Timestamp, lease_ms: u64) -> u64 {
        match self.fenced(run, fence) {
            Some(r) => {
                r.lease_until = Some(now.add_ms(lease_ms));
                1
            }
            None => 0,
        }
    }

    /// [`Statement::AppendEvent`]: the attempt holding `fence` reports
    /// progress `data` (JSON). 1 when written; 0 when the attempt no longer
    /// holds the run.
    pub fn append_event(&mut self, run: RunId, fence: Fence, data: &str) -> u64 {
        if self.fenced(run, fence).is_none() {
            return 0;
        }
        self.log(run, EventKind::Progress, fence, None, data);
        1
    }

    /// Mutant twin of [`Db::append_event`] (`ZombieProgress`): writes the
    /// progress of any attempt while the run is running, holding the run
    /// or not. Only in a build with the `mutants` feature.
    #[cfg(feature = "mutants")]
    pub fn append_event_unfenced(&mut self, run: RunId, fence: Fence, data: &str) -> u64 {
        match self.runs.get(&run) {
            Some(r) if r.status == RunStatus::Running => {
                self.log(run, EventKind::Progress, fence, None, data);
                1
            }
            _ => 0,
        }
    }

    /// [`Statement::ReadEvents`]: up to `limit` events of `run` numbered
    /// above `after`, in order: event 1 (`queued`), each attempt's claim
    /// (its row), the success (the run's row: its last event), and the
    /// rows of `run_events`.
    #[must_use]
    pub fn read_events(&self, run: RunId, after: u32, limit: usize) -> Vec<RunEvent> {
        let Some(r) = self.runs.get(&run) else {
            return Vec::new();
        };
        let mut log = vec![RunEvent {
            seq: 1,
            kind: EventKind::Queued,
            attempt: AttemptNo(0),
            fence: Fence(0),
            class: None,
            data: String::new(),
        }];
        for ((_, n), a) in self
            .attempts
            .range((run, AttemptNo(0))..=(run, AttemptNo(u32::MAX)))
        {
            log.extend(a.claimed_seq.map(|seq| RunEvent {
                seq,
                kind: EventKind::Claimed,
                attempt: *n,
                fence: a.fence,
                class: None,
                data: a.worker.clone(),
            }));
        }
        // A run that succeeded before it had events (schema version 10)
        // still numbers 1: its log is its `queued` event alone.
        if r.status == RunStatus::Succeeded && r.events > 1 {
            log.push(RunEvent {
                seq: r.events,
                kind: EventKind::Succeeded,
                attempt: AttemptNo(r.attempts),
                fence: r.active_fence,
                class: None,
                data: String::new(),
            });
        }
        log.extend(
            self.events
                .range((run, 0)..=(run, u32::MAX))
                .map(|(_, e)| e.clone()),
        );
        log.retain(|e| e.seq > after);
        log.sort_by_key(|e| e.seq);
        log.truncate(limit);
        log
    }

    /// [`Statement::ReadEvents`]: [`Db::read_events`], each event after the
    /// first kept only while the data before it is under `bytes_max`.
    #[must_use]
    pub fn read_events_bounded(
        &self,
        run: RunId,
        after: u32,
        limit: usize,
        bytes_max: u64,
    ) -> Vec<RunEvent> {
        let mut before = 0u64;
        let mut log = self.read_events(run, after, limit);
        log.retain(|e| {
            let keep = before == 0 || before < bytes_max;
            before = before.saturating_add(e.data.len() as u64);
            keep
        });
        log
    }

    /// [`Statement::Complete`]: the attempt holding `fence` succeeded. Its
    /// success is the run's row alone ([`RunRow::outcome_of`]), its event
    /// the row's last number ([`Db::read_events`]).
    pub fn complete(&mut self, run: RunId, fence: Fence, result: &str) -> u64 {
        let now = self.clock;
        let Some(r) = self.fenced(run, fence) else {
            return 0;
        };
        r.status = RunStatus::Succeeded;
        r.result = Some(result.to_owned());
        r.lease_until = None;
        r.finished_at = Some(now);
        r.events += 1;
        1
    }

    fn set_outcome(&mut self, run: RunId, fence: Fence, outcome: AttemptOutcome) {
        let now = self.clock;
        if let Some(a) = self.attempt_mut(run, fence) {
            a.outcome = Some(outcome);
            a.ended_at = Some(now);
        }
    }

    /// [`Statement::Fail`]: the attempt holding `fence` failed terminally.
    pub fn fail(&mut self, run: RunId, fence: Fence, class: ErrorClass, message: &str) -> u64 {
        let now = self.clock;
        let Some(r) = self.fenced(run, fence) else {
            return 0;
        };
        r.status = RunStatus::Failed;
        r.error = Some((class, message.to_owned()));
        r.lease_until = None;
        r.finished_at = Some(now);
        self.set_outcome(run, fence, AttemptOutcome::Failed(class));
        self.log(run, EventKind::Failed, fence, Some(class), message);
        1
    }

    /// [`Statement::ScheduleRetry`]: the attempt holding `fence` failed retryably;
    /// the run waits until `retry_at` under the next dispatch, so its current
    /// entry becomes stale and can be acknowledged.
    pub fn schedule_retry(
        &mut self,
        run: RunId,
        fence: Fence,
        class: ErrorClass,
        message: &str,
        retry_at: Timestamp,
    ) -> u64 {
        let Some(r) = self.fenced(run, fence) else {
            return 0;
        };
        r.status = RunStatus::RetryWait;
        r.retry_at = Some(retry_at);
        r.dispatch = Dispatch(r.dispatch.0 + 1);
        r.lease_until = None;
        r.error = Some((class, message.to_owned()));
        if class == ErrorClass::Unknown {
            r.unknown_failures += 1;
        }
        self.set_outcome(run, fence, AttemptOutcome::Failed(class));
        self.log(run, EventKind::RetryScheduled, fence, Some(class), message);
        1
    }

    /// Mutant twin (`RetryInPel`): records the failed attempt but leaves the
    /// run running, relying on the PEL for the retry. Only in a build with
    /// the `mutants` feature.
    #[cfg(feature = "mutants")]
    pub fn record_failure_only(
        &mut self,
        run: RunId,
        fence: Fence,
        class: ErrorClass,
        message: &str,
    ) -> u64 {
        let Some(r) = self.fenced(run, fence) else {
            return 0;
        };
        r.error = Some((class, message.to_owned()));
        self.set_outcome(run, fence, AttemptOutcome::Failed(class));
        1
    }

    fn bury(&mut self, run: RunId, class: ErrorClass, message: &str) {
        let now = self.clock;
        let r = self.runs.get_mut(&run).expect("caller checked the row");
        r.status = RunStatus::Dead;
        r.lease_until = None;
        r.published_at.get_or_insert(now);
        r.finished_at = Some(now);
        r.error = Some((class, message.to_owned()));
        let source_entry = r.entry_id;
        let attempts = self
            .attempts
            .range((run, AttemptNo(0))..=(run, AttemptNo(u32::MAX)))
            .map(|((_, n), a)| (*n, a.fence, a.outcome))
            .collect();
        self.dead_letters.insert(
            run,
            DeadLetter {
                source_entry,
                class,
                message: message.to_owned(),
                attempts,
                requeued: false,
            },
        );
    }

    /// [`Statement::DeadLetter`]: the attempt holding `fence` failed and was the
    /// last one allowed: the run is dead, with a dead-letter record.
    pub fn dead_letter(
        &mut self,
        run: RunId,
        fence: Fence,
        class: ErrorClass,
        message: &str,
    ) -> u64 {
        if self.fenced(run, fence).is_none() {
            return 0;
        }
        self.set_outcome(run, fence, AttemptOutcome::Failed(class));
        self.bury(run, class, message);
        self.log(run, EventKind::Dead, fence, Some(class), message);
        1
    }

    /// [`Statement::DeadLetterExhausted`]: the run's attempts are used up and its
    /// last attempt is gone (its lease expired, or it never ran): dead, with
    /// class `exhausted`.
    pub fn dead_letter_exhausted(&mut self, run: RunId, dispatch: Dispatch, now: Timestamp) -> u64 {
        let Some(r) = self.runs.get(&run) else {
            return 0;
        };
        let gone = match r.status {
            RunStatus::Queued => true,
            RunStatus::Running => r.lease_until.is_some_and(|l| l <= now),
            _ => false,
        };
        if r.dispatch != dispatch || !gone || r.attempts < r.attempts_max {
            return 0;
        }
        let fence = r.active_fence;
        self.bury(run, ErrorClass::Exhausted, "attempts exhausted");
        self.log(
            run,
            EventKind::Dead,
            fence,
            Some(ErrorClass::Exhausted),
            "attempts exhausted",
        );
        1
    }

    /// [`Statement::Cancel`]: the first terminal write wins; cancelling a running
    /// run makes every later write of its attempt fail the status check.
    pub fn cancel(&mut self, run: RunId) -> u64 {
        let now = self.clock;
        match self.runs.get_mut(&run) {
            Some(r) if !r.status.is_terminal() => {
                r.status = RunStatus::Cancelled;
                r.lease_until = None;
                r.retry_at = None;
                r.published_at.get_or_insert(now);
                r.finished_at = Some(now);
                let fence = r.active_fence;
                self.log(run, EventKind::Cancelled, fence, None, "");
                1
            }
            _ => 0,
        }
    }

    /// [`Statement::PromoteRetries`]: due retries and delayed runs become
    /// queued, at most `limit` of them, oldest `retry_at` first, and taken
    /// for publication at `now` as [`Db::claim_outbox`] takes them; by run
    /// id. `early` (the `PromoteEarly` mutant's twin) takes delayed runs
    /// whether due or not.
    pub fn promote(&mut self, now: Timestamp, limit: usize, early: bool) -> Vec<Candidate> {
        let mut due: Vec<(Timestamp, RunId)> = self
            .runs
            .values()
            .filter(|r| match r.status {
                RunStatus::Delayed if early => true,
                RunStatus::RetryWait | RunStatus::Delayed => r.retry_at.is_some_and(|t| t <= now),
                _ => false,
            })
            .map(|r| (r.retry_at.expect("filtered"), r.run_id))
            .collect();
        due.sort();
        due.truncate(limit);
        let mut taken: Vec<Candidate> = due
            .iter()
            .map(|(_, run)| {
                let r = self.runs.get_mut(run).expect("collected above");
                r.status = RunStatus::Queued;
                r.retry_at = None;
                r.published_at = Some(now);
                candidate(r)
            })
            .collect();
        taken.sort_by_key(|c| c.run_id);
        taken
    }

    /// [`Statement::ClaimOutbox`]: the outbox — takes up to `limit` queued
    /// runs whose current dispatch nobody has published, lowest run id
    /// first, and marks them taken at `now`, so no other worker publishes
    /// them. A taker that dies before its XADD leaves the run to the
    /// sweeper, which finds it published long ago with no entry.
    pub fn claim_outbox(&mut self, now: Timestamp, limit: usize) -> Vec<Candidate> {
        self.runs
            .values_mut()
            .filter(|r| r.status == RunStatus::Queued && r.published_at.is_none())
            .take(limit)
            .map(|r| {
                r.published_at = Some(now);
                candidate(r)
            })
            .collect()
    }

    /// [`Statement::OrphanCandidates`]: runs that should have been picked up long
    /// ago: published at least `grace_ms` ago and still queued, or running
    /// with a lease expired at least `grace_ms` ago; of those, the first
    /// `limit` in the order of (`published_at`, run id) after the sweeper's
    /// cursor (`after_published_ms`, `after`). The sweeper checks whether
    /// their entry still exists in the stream or the PEL.
    ///
    /// A running run was published before it was claimed (a claim sets
    /// `published_at` if it was unset), so its `published_at` is at most its
    /// lease's end: every run of the second kind is published long ago too.
    /// The order lets Postgres read just the runs published before the
    /// cutoff (`runs_sweep`), however many younger ones are queued.
    #[must_use]
    pub fn orphan_candidates(
        &self,
        now: Timestamp,
        grace_ms: u64,
        after_published_ms: u64,
        after: RunId,
        limit: usize,
    ) -> Vec<Candidate> {
        let cutoff = now.sub_ms(grace_ms);
        let mut found: Vec<&RunRow> = self
            .runs
            .values()
            .filter(|r| r.finished_at.is_none())
            .filter(|r| {
                r.published_at.is_some_and(|t| {
                    t <= cutoff && (t.as_ms(), r.run_id) > (after_published_ms, after)
                })
            })
            .filter(|r| match r.status {
                RunStatus::Queued => true,
                RunStatus::Running => r.lease_until.is_some_and(|t| t <= cutoff),
                _ => false,
            })
            .collect();
        found.sort_by_key(|r| (r.published_at, r.run_id));
        found.into_iter().take(limit).map(candidate).collect()
    }

    /// [`Statement::RequeueRun`]: re-dispatch a run whose entry is gone (trimmed,
    /// deleted, or lost with Redis' data), if it is still queued at `dispatch`
    /// or running at `dispatch` under an expired lease.
    pub fn requeue_run(&mut self, run: RunId, dispatch: Dispatch, now: Timestamp) -> u64 {
        match self.runs.get_mut(&run) {
            Some(r) if r.dispatch == dispatch && r.orphaned(now) => {
                redispatch(r);
                1
            }
            _ => 0,
        }
    }

    /// [`Statement::RequeueEntry`]: as [`Db::requeue_run`], for the run whose
    /// current entry is `entry` (XAUTOCLAIM reported it deleted; S8).
    pub fn requeue_entry(&mut self, entry: EntryId, now: Timestamp) -> u64 {
        let mut n = 0;
        for r in self.runs.values_mut() {
            if r.entry_id == Some(entry) && r.finished_at.is_none() && r.orphaned(now) {
                redispatch(r);
                n += 1;
            }
        }
        n
    }

    /// [`Statement::DlqRequeue`]: an operator's explicit re-run of a dead run, with
    /// `extra_attempts` more attempts, a fresh budget of `budget_ms` from
    /// now (`None`: no budget) and no unknown errors counted.
    pub fn dlq_requeue(&mut self, run: RunId, extra_attempts: u32, budget_ms: Option<u64>) -> u64 {
        let now = self.clock;
        match (self.runs.get_mut(&run), self.dead_letters.get_mut(&run)) {
            (Some(r), Some(d)) if r.status == RunStatus::Dead && !d.requeued => {
                d.requeued = true;
                r.attempts_max = r.attempts.saturating_add(extra_attempts);
                r.deadline = budget_ms.map(|b| now.add_ms(b));
                r.unknown_failures = 0;
                redispatch(r);
                let fence = r.active_fence;
                self.log(run, EventKind::Requeued, fence, None, "");
                1
            }
            _ => 0,
        }
    }

    /// [`Statement::RegisterWorker`]: a worker number never handed out
    /// before, recorded with the process's host name and pid.
    pub fn register_worker(&mut self, host: &str, pid: u32, now: Timestamp) -> WorkerId {
        let n = u32::try_from(self.workers.len() + 1).unwrap_or(u32::MAX);
        self.workers.insert(n, (host.to_owned(), pid, now));
        WorkerId(n)
    }

    /// [`Statement::AgreePartitions`]: the stored partition count, or
    /// `partitions`, stored.
    pub fn agree_partitions(&mut self, partitions: u32) -> u32 {
        *self.partitions.get_or_insert(partitions)
    }

    /// [`Statement::SetPartitions`]: `partitions` stored (1), unless fewer
    /// than the stored count (0).
    pub fn set_partitions(&mut self, partitions: u32) -> u64 {
        if self.partitions.is_some_and(|p| p > partitions) {
            return 0;
        }
        self.partitions = Some(partitions);
        1
    }

    /// [`Statement::NextRunId`]: a run id never handed out before.
    pub fn next_run_id(&mut self) -> RunId {
        self.run_ids += 1;
        RunId(self.run_ids)
    }

    /// [`Statement::ReadAttempts`]: `run`'s attempts in order, each with
    /// how it ended ([`RunRow::outcome_of`]).
    #[must_use]
    pub fn read_attempts(&self, run: RunId) -> Vec<(AttemptNo, AttemptRow)> {
        let Some(r) = self.runs.get(&run) else {
            return Vec::new();
        };
        self.attempts
            .range((run, AttemptNo(0))..=(run, AttemptNo(u32::MAX)))
            .map(|((_, n), a)| {
                let (outcome, ended_at) = (r.outcome_of(a), r.ended_of(a));
                (
                    *n,
                    AttemptRow {
                        outcome,
                        ended_at,
                        ..a.clone()
                    },
                )
            })
            .collect()
    }

    /// [`Statement::ListDeadLetters`]: up to `limit` dead letters of runs
    /// after `after`, by run.
    #[must_use]
    pub fn list_dead_letters(&self, after: RunId, limit: usize) -> Vec<(RunId, DeadLetter)> {
        self.dead_letters
            .range((std::ops::Bound::Excluded(after), std::ops::Bound::Unbounded))
            .take(limit)
            .map(|(r, d)| (*r, d.clone()))
            .collect()
    }

    /// [`Statement::CountRuns`]: how many runs have each status (statuses with
    /// none are left out).
    #[must_use]
    pub fn count_runs(&self) -> Vec<(RunStatus, u64)> {
        count_by_status(self.runs.values())
    }

    /// [`Statement::DueLag`]: how long before `now` the earliest due
    /// retry or delayed run fell due (0: none is due).
    #[must_use]
    pub fn due_lag(&self, now: Timestamp) -> u64 {
        self.runs
            .values()
            .filter(|r| matches!(r.status, RunStatus::RetryWait | RunStatus::Delayed))
            .filter_map(|r| r.retry_at)
            .min()
            .map_or(0, |due| now.ms_since(due))
    }

    /// [`Statement::ScheduleLag`]: how long before `now` the earliest
    /// planned tick nobody has handled fell due (0: none is due).
    #[must_use]
    pub fn schedule_lag(&self, now: Timestamp) -> u64 {
        self.schedules
            .values()
            .map(|s| s.next_tick)
            .filter(|t| *t > Timestamp::ZERO)
            .min()
            .map_or(0, |t| now.ms_since(t))
    }

    /// [`Statement::CountLive`]: as [`Db::count_runs`], for the runs not
    /// finished (the `runs_live` index; finished runs are never scanned).
    #[must_use]
    pub fn count_live(&self) -> Vec<(RunStatus, u64)> {
        count_by_status(self.runs.values().filter(|r| r.finished_at.is_none()))
    }

    /// [`Statement::FinishedPerMinute`]: the runs finished after
    /// `minutes` minutes ago, counted by (minute, status), in order.
    #[must_use]
    pub fn finished_per_minute(&self, minutes: u32) -> Vec<(Timestamp, RunStatus, u64)> {
        // As Postgres computes it, in bigint: before 0 when the window
        // reaches back past the epoch.
        let since = i128::from(self.clock.0) - i128::from(minutes) * 60_000;
        let mut counts: BTreeMap<(u64, &'static str), (RunStatus, u64)> = BTreeMap::new();
        for r in self.runs.values() {
            if let Some(t) = r.finished_at.filter(|t| i128::from(t.0) > since) {
                let minute = t.0 / 60_000 * 60_000;
                counts
                    .entry((minute, r.status.as_str()))
                    .or_insert((r.status, 0))
                    .1 += 1;
            }
        }
        counts
            .into_iter()
            .map(|((minute, _), (status, n))| (Timestamp(minute), status, n))
            .collect()
    }

    /// [`Statement::DeleteFinished`]: retention. Deletes up to `limit` runs
    /// that finished at or before `before`, oldest first (ties by run), with
    /// everything Pelican keeps about them: attempts, dead letter,
    /// idempotency keys. Answers the runs.
    ///
    /// Not the effects ledger: it stands for the tool service's own, and a
    /// zombie attempt (paused past the window) that calls the service
    /// after its run is deleted must still find its key there (S5).
    pub fn delete_finished(&mut self, before: Timestamp, limit: usize) -> Vec<RunId> {
        self.delete_aged(before, limit, |r| r.finished_at)
    }

    /// Mutant twin of [`Db::delete_finished`] (`ForgetKeys`): deletes the
    /// runs' idempotency keys with them, inside their window.
    #[cfg(feature = "mutants")]
    pub fn delete_finished_keys(&mut self, before: Timestamp, limit: usize) -> Vec<RunId> {
        let gone = self.delete_finished(before, limit);
        self.keys.retain(|_, k| !gone.contains(&k.run));
        gone
    }

    /// Mutant twin of [`Db::delete_finished`] (`RetainLive`): ages every
    /// run by its publication, finished or not.
    #[cfg(feature = "mutants")]
    pub fn delete_published(&mut self, before: Timestamp, limit: usize) -> Vec<RunId> {
        self.delete_aged(before, limit, |r| r.published_at)
    }

    /// Deletes up to `limit` runs whose `age` is at or before `before`,
    /// oldest first (ties by run), with their attempts, dead letter, steps
    /// and events; their idempotency keys stay until they expire.
    fn delete_aged(
        &mut self,
        before: Timestamp,
        limit: usize,
        age: fn(&RunRow) -> Option<Timestamp>,
    ) -> Vec<RunId> {
        let mut old: Vec<(Timestamp, RunId)> = self
            .runs
            .values()
            .filter_map(|r| age(r).filter(|t| *t <= before).map(|t| (t, r.run_id)))
            .collect();
        old.sort();
        let gone: Vec<RunId> = old.into_iter().take(limit).map(|(_, run)| run).collect();
        for run in &gone {
            self.runs.remove(run);
            self.attempts.retain(|(r, _), _| r != run);
            self.dead_letters.remove(run);
            self.steps.retain(|(r, _), _| r != run);
            self.events.retain(|(r, _), _| r != run);
        }
        gone
    }

    /// [`Statement::ApplyEffect`]: the demo tool service's ledger. Returns 1 when
    /// `key` is new (the effect is applied), 0 for a repeat (deduplicated).
    pub fn apply_effect(&mut self, key: &str) -> u64 {
        let n = self.effects.entry(key.to_owned()).or_insert(0);
        *n += 1;
        u64::from(*n == 1)
    }

    /// Model-only: "a long time passes" for every stored deadline (leases,
    /// retry times, publication times). See [`crate::stream::Stream::age_all`].
    pub fn age_all(&mut self) {
        for r in self.runs.values_mut() {
            for t in [
                &mut r.lease_until,
                &mut r.retry_at,
                &mut r.published_at,
                &mut r.finished_at,
                &mut r.deadline,
                &mut r.due_at,
            ]
            .into_iter()
            .flatten()
            {
                *t = Timestamp::ZERO;
            }
        }
        for (_, until) in self.slots.values_mut() {
            *until = Timestamp::ZERO;
        }
        for tat in self.rates.values_mut() {
            *tat = 0;
        }
    }
}

fn count_by_status<'a>(runs: impl Iterator<Item = &'a RunRow>) -> Vec<(RunStatus, u64)> {
    let mut counts: BTreeMap<&'static str, (RunStatus, u64)> = BTreeMap::new();
    for r in runs {
        counts.entry(r.status.as_str()).or_insert((r.status, 0)).1 += 1;
    }
    counts.into_values().collect()
}

fn candidate(r: &RunRow) -> Candidate {
    Candidate {
        run_id: r.run_id,
        dispatch: r.dispatch,
        entry_id: r.entry_id,
        published_at: r.published_at,
    }
}

fn redispatch(r: &mut RunRow) {
    r.status = RunStatus::Queued;
    r.dispatch = Dispatch(r.dispatch.0 + 1);
    r.published_at = None;
    r.finished_at = None;
    r.lease_until = None;
    r.retry_at = None;
}

#[cfg(test)]
mod tests;
