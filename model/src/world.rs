// Over 600 lines: the world and its per-guarantee checks, which read one another's records at
// each step; splitting them would make those records public.
//! The world every level checks: Redis (the job stream and the dead-letter
//! stream), Postgres, the external effects, and the history the invariants
//! need.
//!
//! [`World::db`] and [`World::stream`] execute one command each and check, at
//! that instant, the guarantees that are about a single step: a terminal state
//! never changes (S2), an accepted fenced write carries its attempt's own fence
//! and new fences grow (S3), an entry is acknowledged only after its run's
//! next step is durable (S4), an effect is applied at most once (S5), a
//! cancelled run never gets a new attempt (S7). Whatever is violated is
//! recorded in [`World::violations`]; [`crate::invariants`] checks the rest
//! over the state.

use crate::db::{AnswerOf, Claimed, Class, Db, Query, RunRow, Unfit};
use crate::events::{self, EventFault, RunEvent};
use crate::ids::{AttemptNo, EntryId, Fence, Partition, RunId, WorkerId, partition_at};
use crate::invariants::Guarantee;
use crate::protocol::{
    DbOp, DbReply, DeadEntry, DeliveryEnd, GroupState, JobEntry, QueueState, StreamReply,
};
use crate::shared::Shared;
use crate::status::RunStatus;
use crate::stream::{AutoClaim, Stream, StreamError, Trim};
use crate::time::Timestamp;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

mod commands;

pub use commands::StreamOp;

/// The consumer group's name.
pub const GROUP: &str = "pelican";

/// Redis: the job stream of each partition with its group, and the
/// dead-letter stream.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Redis {
    /// `pelican:jobs` (or the partitions' keys): partition `p` at index `p`.
    pub jobs: Vec<Stream<JobEntry>>,
    /// `pelican:jobs:dead`.
    pub dead: Stream<DeadEntry>,
}

impl Default for Redis {
    /// One partition.
    fn default() -> Self {
        Redis::partitioned(1)
    }
}

impl Redis {
    /// Empty streams, `partitions` job streams (at least one).
    #[must_use]
    pub fn partitioned(partitions: Partition) -> Redis {
        Redis {
            jobs: vec![Stream::new(); usize::from(partitions.max(1))],
            dead: Stream::new(),
        }
    }

    /// The job stream of `partition`.
    ///
    /// # Panics
    /// If there is no such partition.
    #[must_use]
    pub fn part(&self, partition: Partition) -> &Stream<JobEntry> {
        &self.jobs[usize::from(partition)]
    }

    /// The job stream of `partition`, to change.
    ///
    /// # Panics
    /// If there is no such partition.
    pub fn part_mut(&mut self, partition: Partition) -> &mut Stream<JobEntry> {
        &mut self.jobs[usize::from(partition)]
    }

    /// The pending delivery of entry `id`, in its partition.
    #[must_use]
    pub fn pending(&self, id: EntryId) -> Option<&crate::stream::Pending> {
        self.jobs
            .get(usize::from(id.partition))?
            .pending(id.local())
    }

    /// Whether entry `id` is in its partition's stream.
    #[must_use]
    pub fn holds(&self, id: EntryId) -> bool {
        self.jobs
            .get(usize::from(id.partition))
            .is_some_and(|s| s.entries.contains_key(&id.local()))
    }

    /// `Locate` of `id` in its partition (nothing there without one).
    #[must_use]
    pub fn locate(&self, id: EntryId) -> StreamReply {
        match self.jobs.get(usize::from(id.partition)) {
            Some(jobs) => locate(jobs, id.local()),
            None => StreamReply::Located {
                entry: None,
                pending: false,
                delivered: false,
            },
        }
    }

    /// The IDs pending in `partition`, in the partition.
    pub fn pending_in(&self, partition: Partition) -> impl Iterator<Item = EntryId> + '_ {
        self.jobs
            .get(usize::from(partition))
            .and_then(|jobs| jobs.group.as_ref())
            .into_iter()
            .flat_map(move |g| g.pel.keys().map(move |id| id.in_partition(partition)))
    }

    /// Deliveries pending in every partition.
    #[must_use]
    pub fn pel_len(&self) -> usize {
        self.jobs.iter().map(Stream::pel_len).sum()
    }

    /// `Retain` on `partition`; partition 0's trims the dead-letter stream
    /// too (its notices older than `before`), and the reply counts both.
    fn retain_all(
        &mut self,
        partition: Partition,
        before: Timestamp,
    ) -> Result<StreamReply, StreamError> {
        let dead = if partition == 0 {
            self.dead.xtrim(Trim::MinId(EntryId::new(before.0, 0)))
        } else {
            0
        };
        self.on(partition, |jobs| {
            Ok(StreamReply::Trimmed(retain(jobs, before) + dead))
        })
    }

    /// Runs `command` on `partition`'s stream and puts the reply's IDs in
    /// `partition`. A partition this Redis does not have is an empty key.
    fn on(
        &mut self,
        partition: Partition,
        command: impl FnOnce(&mut Stream<JobEntry>) -> Result<StreamReply, StreamError>,
    ) -> Result<StreamReply, StreamError> {
        let jobs = self
            .jobs
            .get_mut(usize::from(partition))
            .ok_or(StreamError::NoGroup)?;
        command(jobs).map(|r| r.in_partition(partition))
    }

    /// `Queue`: the streams' lengths and the group's lag and PEL, over
    /// every partition. Read-only.
    #[must_use]
    pub fn queue(&self, now: Timestamp) -> QueueState {
        QueueState::merge(self.queue_parts(now))
    }

    /// Each partition's own [`QueueState`], its IDs in the partition: what
    /// [`Redis::queue`] merges.
    pub fn queue_parts(&self, now: Timestamp) -> impl Iterator<Item = QueueState> + '_ {
        let dead_letters = self.dead.len();
        self.jobs
            .iter()
            .enumerate()
            .map(move |(p, jobs)| queue_of(jobs, dead_letters, now).in_partition(partition_at(p)))
    }

    /// `Retain` on `partition`: the cutoff below which every entry is
    /// delivered, acknowledged and older than `before`; `None` without the
    /// group.
    #[must_use]
    pub fn retention_cutoff(&self, partition: Partition, before: Timestamp) -> Option<EntryId> {
        retention_cutoff_of(self.jobs.get(usize::from(partition))?, before)
    }
}

/// A terminal run as S2 remembers it: its status and result.
type Ended = (RunId, RunStatus, Option<String>);

/// `AutoClaim` on one stream: XPENDING IDLE for the first idle entry from
/// `start`, then XAUTOCLAIM from it.
fn autoclaim(
    jobs: &mut Stream<JobEntry>,
    consumer: &str,
    min_idle_ms: u64,
    start: EntryId,
    count: usize,
    now: Timestamp,
) -> Result<StreamReply, StreamError> {
    let idle = Some(min_idle_ms);
    let first = jobs.xpending_range(idle, start.local(), EntryId::MAX, 1, None, now)?;
    match first.first() {
        // Nothing idle from `start` on: the scan is over.
        None => Ok(AutoClaim::scan_over()),
        Some(row) => jobs.xautoclaim(consumer, min_idle_ms, row.id, count, false, now),
    }
    .map(StreamReply::AutoClaimed)
}

/// `ForgetConsumers` on one stream: deletes each consumer idle at least
/// `idle_ms` that holds nothing (or, `holding`, whatever it holds), and
/// answers how many. Nothing without the group.
fn forget(jobs: &mut Stream<JobEntry>, idle_ms: u64, now: Timestamp, holding: bool) -> u64 {
    let Ok(consumers) = jobs.xinfo_consumers(now) else {
        return 0;
    };
    let mut n = 0;
    for c in consumers {
        if c.idle_ms >= idle_ms && (c.pending == 0 || holding) {
            jobs.xgroup_delconsumer(&c.name)
                .expect("the group listed it");
            n += 1;
        }
    }
    n
}

/// One partition's [`QueueState`], its IDs without partition.
fn queue_of(jobs: &Stream<JobEntry>, dead_letters: u64, now: Timestamp) -> QueueState {
    let group = jobs.group().ok().map(|_| {
        let info = jobs.xinfo_groups().ok().and_then(|g| g.into_iter().next());
        let summary = jobs.xpending_summary().unwrap_or_default();
        let oldest = jobs
            .xpending_range(None, EntryId::ZERO, EntryId::MAX, 1, None, now)
            .ok()
            .and_then(|rows| rows.into_iter().next());
        GroupState {
            lag: info.and_then(|i| i.lag),
            pending: summary.count,
            oldest_pending: oldest.as_ref().map(|r| r.id),
            oldest_idle_ms: oldest.map(|r| r.idle_ms),
            consumers: summary.consumers,
        }
    });
    QueueState {
        length: jobs.len(),
        dead_letters,
        group,
    }
}

fn retention_cutoff_of(jobs: &Stream<JobEntry>, before: Timestamp) -> Option<EntryId> {
    let group = jobs.group.as_ref()?;
    Some(retention_cutoff(
        before,
        group.pel.keys().next().copied(),
        group.last_delivered,
    ))
}

fn retain(jobs: &mut Stream<JobEntry>, before: Timestamp) -> u64 {
    match retention_cutoff_of(jobs, before) {
        Some(cutoff) => jobs.xtrim(Trim::MinId(cutoff)),
        None => 0,
    }
}

/// `Locate`: XRANGE id id, XPENDING id id 1, and the group's last
/// delivered ID (XINFO GROUPS), in one partition. Read-only.
fn locate(jobs: &Stream<JobEntry>, id: EntryId) -> StreamReply {
    let entry = jobs.xrange(id, id, 1).pop().map(|(_, e)| e);
    let pending = jobs.pending(id).is_some();
    let delivered = jobs.group.as_ref().is_some_and(|g| id <= g.last_delivered);
    StreamReply::Located {
        entry,
        pending,
        delivered,
    }
}

/// The `Retain` rule, shared by the model and the Redis binding: the
/// smallest of `before` (as an ID), the oldest pending ID and the first ID
/// after the last delivered one. Every entry below it is delivered,
/// acknowledged and older than `before`.
#[must_use]
pub fn retention_cutoff(
    before: Timestamp,
    oldest_pending: Option<EntryId>,
    last_delivered: EntryId,
) -> EntryId {
    let mut cutoff = EntryId::new(before.0, 0);
    if let Some(oldest) = oldest_pending {
        cutoff = cutoff.min(oldest);
    }
    if let Some(first_undelivered) = last_delivered.successor() {
        cutoff = cutoff.min(first_undelivered);
    }
    cutoff
}

/// Who issued a command: the invariants need the issuing attempt's own fence.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Issuer {
    /// The worker, if a worker issued it.
    pub worker: Option<WorkerId>,
    /// The fence of the attempt this delivery claimed itself, if any.
    pub own_fence: Option<Fence>,
}

impl Issuer {
    /// A worker's command outside any claimed attempt (reads, reclaims,
    /// maintenance).
    #[must_use]
    pub fn worker(worker: WorkerId) -> Issuer {
        Issuer {
            worker: Some(worker),
            own_fence: None,
        }
    }
}

/// A guarantee broken at some step.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Violation {
    /// S2: a terminal run's state or result changed.
    TerminalChanged(RunId),
    /// S2: a job was executed without holding a fresh claim.
    ExecutedWithoutClaim(RunId),
    /// S3: a fenced write was accepted with a fence other than the writer's own.
    StaleWriteAccepted(RunId),
    /// S3: a claim did not increase the fence.
    FenceNotIncreasing(RunId),
    /// S4: an entry was acknowledged, or left the PEL with its consumer,
    /// before its run's next step was durable.
    AckBeforeDurable(EntryId),
    /// S5: a side effect was applied twice.
    EffectTwice(RunId, u32),
    /// S7: a cancelled run got a new attempt.
    CancelledRevived(RunId),
    /// S8: a deleted pending ID was dropped without recovery.
    TrimmedDropped(EntryId),
    /// S3: a claim took over a running run whose lease had not expired by
    /// Postgres's clock (its holder may still be heartbeating).
    LiveLeaseTaken(RunId),
    /// S6: an attempt whose outcome Postgres refused left its entry pending
    /// (to be retried, and refused again) instead of failing the run.
    RefusalRetried(RunId),
    /// S1: retention deleted a run that was not terminal.
    LiveRunDeleted(RunId),
    /// S11: an attempt ran a step (`.1`) of the run although an earlier
    /// attempt had recorded it before this one was claimed.
    StepRerun(RunId, u32),
    /// S11: a recorded step (`.1`) of the run was replaced.
    StepReplaced(RunId, u32),
    /// S6: a job ran under a claim that found the run's elapsed budget
    /// spent (it must fail the run as `budget_exhausted` instead).
    RanPastBudget(RunId),
    /// S12: the provider had more unexpired permits than slots.
    SlotOverbooked(String),
    /// S12: the provider's calls started faster than its rate allows.
    RateExceeded(String),
    /// S13: the run's events were renumbered, rewritten or left a gap:
    /// an earlier read is not a prefix of a later one.
    EventsRewritten(RunId),
    /// S13: an attempt that did not hold the run wrote one of its events.
    EventFromFencedOff(RunId),
    /// S14: a submission under a key still kept made a run other than the
    /// key's first (`.0`).
    KeyForgotten(RunId),
    /// S15: an attempt of a delayed run was claimed before its due time.
    StartedEarly(RunId),
    /// S16: a schedule (its number) handled a tick that was not after
    /// every tick it had handled: one tick twice, or an older one again.
    TickRepeated(u64),
}

impl Violation {
    /// The guarantee it breaks.
    #[must_use]
    pub fn guarantee(&self) -> Guarantee {
        match self {
            Violation::TerminalChanged(_) | Violation::ExecutedWithoutClaim(_) => Guarantee::S2,
            Violation::StaleWriteAccepted(_)
            | Violation::FenceNotIncreasing(_)
            | Violation::LiveLeaseTaken(_) => Guarantee::S3,
            Violation::AckBeforeDurable(_) => Guarantee::S4,
            Violation::EffectTwice(..) => Guarantee::S5,
            Violation::CancelledRevived(_) => Guarantee::S7,
            Violation::RefusalRetried(_) | Violation::RanPastBudget(_) => Guarantee::S6,
            Violation::TrimmedDropped(_) => Guarantee::S8,
            Violation::LiveRunDeleted(_) => Guarantee::S1,
            Violation::StepRerun(..) | Violation::StepReplaced(..) => Guarantee::S11,
            Violation::SlotOverbooked(_) | Violation::RateExceeded(_) => Guarantee::S12,
            Violation::EventsRewritten(_) | Violation::EventFromFencedOff(_) => Guarantee::S13,
            Violation::KeyForgotten(_) => Guarantee::S14,
            Violation::StartedEarly(_) => Guarantee::S15,
            Violation::TickRepeated(_) => Guarantee::S16,
        }
    }
}

/// Redis + Postgres + the external world + history.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct World {
    /// Redis (shared by a world's clones until one writes to it).
    pub redis: Shared<Redis>,
    /// Postgres (shared by a world's clones until one writes to it).
    pub db: Shared<Db>,
    /// Runs the API answered 202 for.
    pub accepted: BTreeSet<RunId>,
    /// Every job entry ever added, by ID (the payload of a trimmed entry is
    /// still known here; shared by a world's clones until one writes to it).
    pub entries: Shared<BTreeMap<EntryId, JobEntry>>,
    /// Job entries quarantined on the dead stream.
    pub quarantined: BTreeSet<EntryId>,
    /// External applications of each logical side effect (run, tool call).
    pub effects: BTreeMap<(RunId, u32), u32>,
    /// Runs retention deleted, with the status each ended in.
    pub retired: BTreeMap<RunId, RunStatus>,
    /// Deleted IDs reported to each live reclaimer and not yet recovered.
    pub trimmed_owed: BTreeMap<WorkerId, BTreeSet<EntryId>>,
    /// Attempts (run, fence) claimed with the run's budget already spent.
    #[serde(default)]
    pub spent_claims: BTreeSet<(RunId, Fence)>,
    /// Each provider's permits as they were granted and not released:
    /// holder → until when its slot is held (S12).
    #[serde(default)]
    pub permits: BTreeMap<String, BTreeMap<String, Timestamp>>,
    /// Each rate-limited provider's latest token grants, oldest first, at
    /// most [`TOKENS_KEPT`] (S12).
    #[serde(default)]
    pub tokens: BTreeMap<String, Vec<Timestamp>>,
    /// Each idempotency key a submission made, with its first run, until
    /// [`DbOp::ExpireKeys`] forgets it (S14).
    #[serde(default)]
    pub keys: BTreeMap<String, RunId>,
    /// Every violation seen.
    pub violations: BTreeSet<Violation>,
}

/// The run whose events `op` may write (S13 is checked around it): the
/// one its class names, or the one it writes under a fence.
fn event_target(op: &DbOp) -> Option<RunId> {
    (op.class().events).or_else(|| op.fenced_write().map(|(run, _)| run))
}

/// How many of a provider's latest token grants [`World::tokens`] keeps:
/// the rate is checked over every span they cover.
pub const TOKENS_KEPT: usize = 32;

/// What S16 compares around a statement that handles a tick: the
/// schedule's number, its last tick and how many ticks it has handled.
#[derive(Clone, Copy, Debug)]
struct Handled {
    id: u64,
    last_tick: Timestamp,
    handled: u64,
}

impl Handled {
    fn of(s: &crate::schedule::ScheduleRow) -> Handled {
        Handled {
            id: s.id,
            last_tick: s.last_tick,
            handled: s.fired + s.skipped,
        }
    }
}

impl World {
    /// An empty world whose servers' clock reads `now`; the consumer group
    /// exists (as after `pelican migrate`).
    #[must_use]
    pub fn at(now: Timestamp) -> World {
        let mut w = World::new();
        w.db.clock = now;
        w
    }

    /// An empty world; the consumer group exists (as after `pelican migrate`).
    #[must_use]
    pub fn new() -> World {
        World::partitioned(1)
    }

    /// An empty world with `partitions` job streams, each with the group.
    #[must_use]
    pub fn partitioned(partitions: Partition) -> World {
        let mut w = World {
            redis: Redis::partitioned(partitions).into(),
            ..World::default()
        };
        for partition in 0..partitions.max(1) {
            w.redis
                .execute(&StreamOp::EnsureGroup { partition })
                .expect("creating a group on an empty Redis succeeds");
        }
        w
    }

    /// The statement `q`, run as [`World::db`] runs it: its typed answer.
    ///
    /// # Errors
    /// The reference database refused the values.
    pub fn query<Q: Query>(&mut self, q: Q, by: Issuer) -> Result<AnswerOf<Q>, Unfit> {
        let op: DbOp = q.into();
        let reply = self.db(&op, by);
        Q::answer(op.statement(), reply)
    }

    /// Executes a SQL statement, checking S2, S3, S7 at this step.
    pub fn db(&mut self, op: &DbOp, by: Issuer) -> DbReply {
        let class = op.class();
        let target = (class.claims).or_else(|| op.fenced_write().map(|(run, _)| run));
        let before = target.and_then(|r| self.db.runs.get(&r).cloned());
        let (terminal_before, live_before) = self.runs_before(class, before.as_ref());
        let logged = event_target(op);
        let log_before = logged.map(|run| self.db.read_events(run, 0, usize::MAX));
        let step = class.records_step;
        let step_before = step.and_then(|key| self.db.steps.get(&key).cloned());
        let ticked = class
            .ticks
            .and_then(|s| self.db.schedules.get(s))
            .map(Handled::of);
        let reply = self.db.execute(op);
        self.check_tick(class, ticked);
        self.check_keys(class, &reply);
        if let (Some(run), DbReply::Claimed(Some(job))) = (target, &reply)
            && job.claimed.budget_left_ms.is_some_and(|left| left <= 0)
        {
            self.spent_claims.insert((run, job.claimed.fence));
        }
        if let (Some(before), Some((run, step))) = (step_before, step)
            && self.db.steps.get(&(run, step)) != Some(&before)
        {
            self.violations.insert(Violation::StepReplaced(run, step));
        }
        for run in live_before {
            if !self.db.runs.contains_key(&run) {
                self.violations.insert(Violation::LiveRunDeleted(run));
            }
        }
        for (run, status, result) in terminal_before {
            let Some(now) = self.db.runs.get(&run) else {
                // Deleted by retention: what it ended as is history now.
                self.retired.insert(run, status);
                continue;
            };
            if now.status != status || now.result != result {
                self.violations.insert(Violation::TerminalChanged(run));
            }
        }
        self.check_fences(op, by, target, &reply, before.as_ref());
        if let (Some(entry), Some(w)) = (class.requeues_entry, by.worker)
            && let Some(owed) = self.trimmed_owed.get_mut(&w)
        {
            owed.remove(&entry);
        }
        self.check_limits(class, &reply);
        if let (Some(run), Some(before)) = (logged, log_before) {
            self.check_events(run, &before);
        }
        reply
    }

    /// What S1 and S2 compare a statement's effect with: the terminal runs
    /// (each with its status and result) and, for retention, the live
    /// runs before it; a set-based statement's over every run, another's
    /// over its target (`before`).
    fn runs_before(&self, class: Class, before: Option<&RunRow>) -> (Vec<Ended>, Vec<RunId>) {
        // Retention: every live run must survive it (S1).
        let deletes = class.deletes;
        let set_based = deletes || class.sweeps;
        // Set-based statements: snapshot every terminal run.
        let terminal = |r: &RunRow| {
            r.status
                .is_terminal()
                .then(|| (r.run_id, r.status, r.result.clone()))
        };
        let terminal_before: Vec<_> = if set_based {
            self.db.runs.values().filter_map(terminal).collect()
        } else {
            before.into_iter().filter_map(terminal).collect()
        };
        let live_before: Vec<RunId> = if deletes {
            self.db
                .runs
                .values()
                .filter(|r| !r.status.is_terminal())
                .map(|r| r.run_id)
                .collect()
        } else {
            Vec::new()
        };
        (terminal_before, live_before)
    }

    /// S3 and S7 at a claim or a fenced write: a claim raises the fence,
    /// revives no cancelled run and takes no live lease; a write lands
    /// only under the writer's own fence. `before` is the target run's row
    /// before the statement.
    fn check_fences(
        &mut self,
        op: &DbOp,
        by: Issuer,
        target: Option<RunId>,
        reply: &DbReply,
        before: Option<&RunRow>,
    ) {
        match (reply, before) {
            (DbReply::Claimed(Some(c)), Some(before)) => {
                if c.claimed.fence <= before.active_fence {
                    self.violations
                        .insert(Violation::FenceNotIncreasing(before.run_id));
                }
                if before.status == RunStatus::Cancelled {
                    self.violations
                        .insert(Violation::CancelledRevived(before.run_id));
                }
                if before.status == RunStatus::Running
                    && before.lease_until.is_some_and(|l| l > self.db.clock)
                {
                    self.violations
                        .insert(Violation::LiveLeaseTaken(before.run_id));
                }
                if before.due_at.is_some_and(|due| due > self.db.clock) {
                    self.violations
                        .insert(Violation::StartedEarly(before.run_id));
                }
                self.debug_assert_claimed(op, before, c.claimed);
            }
            (DbReply::Claimed(None), _) => {
                debug_assert_eq!(
                    target.and_then(|run| self.db.runs.get(&run)),
                    before,
                    "a refused claim changes nothing"
                );
            }
            (DbReply::Rows(n), Some(before)) => {
                if let Some((run, fence)) = op.fenced_write() {
                    if *n > 0 {
                        if by.own_fence != Some(fence) {
                            self.violations.insert(Violation::StaleWriteAccepted(run));
                        }
                        debug_assert_eq!(
                            before.active_fence, fence,
                            "the statement checks the fence"
                        );
                        debug_assert_eq!(
                            before.status,
                            RunStatus::Running,
                            "a fenced write lands only on a running run"
                        );
                        debug_assert_eq!(
                            self.db.runs[&run].active_fence, fence,
                            "a fenced write keeps the fence"
                        );
                    } else {
                        debug_assert_eq!(
                            &self.db.runs[&run], before,
                            "a refused fenced write changes nothing"
                        );
                    }
                }
            }
            _ => {}
        }
    }

    /// S13 at a statement that may write an event of `run`: the log read
    /// now begins with the log read just before (`before`), and is whole.
    fn check_events(&mut self, run: RunId, before: &[RunEvent]) {
        if !self.db.runs.contains_key(&run) {
            return;
        }
        let after = self.db.read_events(run, 0, usize::MAX);
        if after == before {
            return;
        }
        if events::grew(before, &after).is_err() {
            self.violations.insert(Violation::EventsRewritten(run));
        }
        match events::check(0, &after) {
            Ok(()) => {}
            Err(EventFault::FencedOff { .. }) => {
                self.violations.insert(Violation::EventFromFencedOff(run));
            }
            Err(_) => {
                self.violations.insert(Violation::EventsRewritten(run));
            }
        }
    }

    /// S12 at a permit's grant or release and at a token's grant. A permit
    /// counts until it is released or its hold runs out by Postgres's
    /// clock, whether or not its holder is still alive: a dead holder's
    /// slot is free only once its hold has run out.
    /// S16 after a statement that handles a tick: if it handled one, that
    /// tick is after every tick the schedule handled before. `before` is
    /// the schedule as it was.
    fn check_tick(&mut self, class: Class, before: Option<Handled>) {
        let (Some(name), Some(before)) = (class.ticks, before) else {
            return;
        };
        let Some(after) = self.db.schedules.get(name).map(Handled::of) else {
            return;
        };
        if after.id == before.id
            && after.handled > before.handled
            && before.handled > 0
            && after.last_tick <= before.last_tick
        {
            self.violations.insert(Violation::TickRepeated(before.id));
        }
    }

    fn check_limits(&mut self, class: Class, reply: &DbReply) {
        let now = self.db.clock;
        let granted = *reply == DbReply::Rows(1);
        if let Some((provider, holder)) = class.frees_slot
            && let Some(held) = self.permits.get_mut(provider)
        {
            held.remove(holder);
        }
        if let Some((provider, interval_ns, burst)) = class.takes_token
            && granted
            && interval_ns > 0
        {
            self.token_granted(provider, interval_ns, burst);
        }
        let Some(take) = class.takes_slot.filter(|_| granted) else {
            return;
        };
        let held = self.permits.entry(take.provider.to_owned()).or_default();
        held.retain(|_, until| *until > now);
        held.insert(take.holder.to_owned(), now.add_ms(take.hold_ms));
        if held.len() > take.slots as usize {
            self.violations
                .insert(Violation::SlotOverbooked(take.provider.to_owned()));
        }
    }

    /// S14 after `op` answered `reply`: a kept key answers its first run.
    /// A key the database expired ([`DbOp::ExpireKeys`]) is forgotten here
    /// too; a key that vanished any other way is found out by its next
    /// submission.
    fn check_keys(&mut self, class: Class, reply: &DbReply) {
        if let (Some(key), DbReply::Keyed { run, .. }) = (class.binds_key, reply) {
            match self.keys.get(key) {
                Some(first) if first != run => {
                    self.violations.insert(Violation::KeyForgotten(*first));
                }
                Some(_) => {}
                None => {
                    self.keys.insert(key.to_owned(), *run);
                }
            }
        }
        if class.expires_keys {
            let db = &self.db;
            self.keys.retain(|key, _| db.keys.contains_key(key));
        }
    }

    /// A token of `provider` was granted now: over every span ending now
    /// that the kept grants cover, at most `burst + span / interval_ns`
    /// calls started (the bound of the GCRA that grants them).
    fn token_granted(&mut self, provider: &str, interval_ns: u64, burst: u32) {
        let now = self.db.clock;
        let grants = self.tokens.entry(provider.to_owned()).or_default();
        grants.push(now);
        if grants.len() > TOKENS_KEPT {
            grants.remove(0);
        }
        let burst = u64::from(burst.max(1));
        let too_many = grants
            .iter()
            .rev()
            .zip(1u64..)
            .any(|(t, n)| n > burst + now.ms_since(*t).saturating_mul(1_000_000) / interval_ns);
        if too_many {
            self.violations
                .insert(Violation::RateExceeded(provider.to_owned()));
        }
    }

    /// A long time passes (the model checker's tick): every lease, retry
    /// time, idle time, slot hold and rate-limit state expires at once.
    pub fn age_all(&mut self) {
        self.redis.jobs.iter_mut().for_each(Stream::age_all);
        self.db.age_all();
        for until in self.permits.values_mut().flat_map(BTreeMap::values_mut) {
            *until = Timestamp::ZERO;
        }
        self.tokens.clear();
    }

    /// The claim statement's postconditions, for claim `op` granted
    /// `claimed` on a run that was `before`: the run is running under the
    /// new fence, larger than every earlier one, with a lease from the
    /// claim's time on; its new attempt is the next one, within the run's
    /// bound, and holds that fence with no outcome yet.
    fn debug_assert_claimed(&self, op: &DbOp, before: &RunRow, claimed: Claimed) {
        if !cfg!(debug_assertions) {
            return;
        }
        let at = match op {
            #[cfg(feature = "mutants")]
            DbOp::ClaimAt { now, .. } => Some(*now),
            _ => Some(self.db.clock),
        };
        let r = &self.db.runs[&before.run_id];
        debug_assert!(
            claimed.fence > before.active_fence,
            "a claim increases the fence"
        );
        debug_assert_eq!(r.status, RunStatus::Running, "a claimed run is running");
        debug_assert_eq!(r.active_fence, claimed.fence, "under the claimed fence");
        debug_assert!(
            r.lease_until.is_some_and(|l| at.is_none_or(|at| l >= at)),
            "a claimed run holds a lease from the claim on: {:?}",
            r.lease_until
        );
        debug_assert!(
            claimed.attempt == AttemptNo(before.attempts + 1)
                && claimed.attempt == AttemptNo(r.attempts)
                && r.attempts <= r.attempts_max,
            "a claim starts the next attempt, within the bound: {claimed:?} of {r:?}"
        );
        debug_assert!(
            self.db
                .attempts
                .get(&(r.run_id, claimed.attempt))
                .is_some_and(|a| a.fence == claimed.fence && a.outcome.is_none()),
            "the new attempt holds the claimed fence, with no outcome yet"
        );
    }

    /// Executes a stream command, checking S4 at acknowledgements. Redis
    /// reads its own clock, the servers' true time ([`Db::clock`]), not
    /// the sender's ([`StreamOp::clock_mut`]).
    pub fn stream(&mut self, op: &StreamOp, by: Issuer) -> Result<StreamReply, StreamError> {
        let mut own;
        let op = match op.clock() {
            Some(at) if at != self.db.clock => {
                own = op.clone();
                if let Some(at) = own.clock_mut() {
                    *at = self.db.clock;
                }
                &own
            }
            _ => op,
        };
        if let StreamOp::Ack { ids } = op {
            for id in ids {
                if self.redis.pending(*id).is_some() && !self.durable_next_step(*id) {
                    self.violations.insert(Violation::AckBeforeDurable(*id));
                }
            }
        }
        // A consumer deleted takes its pending entries with it: they leave
        // the PEL as if acknowledged, and S4 holds them to the same rule.
        let held = op
            .forgets_consumers()
            .map(|p| self.redis.pending_in(p).collect::<Vec<_>>());
        let reply = self.redis.execute(op);
        for id in held.into_iter().flatten() {
            if self.redis.pending(id).is_none() && !self.durable_next_step(id) {
                self.violations.insert(Violation::AckBeforeDurable(id));
            }
        }
        match (op, &reply) {
            (StreamOp::Ack { ids }, Ok(StreamReply::Acked(n))) => {
                debug_assert!(
                    ids.iter().all(|id| self.redis.pending(*id).is_none()),
                    "XACK removes every ID it names from the PEL"
                );
                debug_assert!(*n <= ids.len() as u64, "XACK counts only IDs it named");
            }
            (StreamOp::Touch { consumer, id, .. }, Ok(StreamReply::Touched(true))) => {
                debug_assert!(
                    self.redis
                        .pending(*id)
                        .is_some_and(|p| p.consumer == *consumer),
                    "a touched entry is pending for the toucher"
                );
            }
            (StreamOp::Publish { entry, .. }, Ok(StreamReply::Added(id))) => {
                self.entries.insert(*id, entry.clone());
            }
            (
                StreamOp::PublishDead {
                    entry: DeadEntry::Quarantined { source, .. },
                    ..
                },
                Ok(_),
            ) => {
                self.quarantined.insert(*source);
            }
            (StreamOp::AutoClaim { consumer, .. }, Ok(StreamReply::AutoClaimed(r))) => {
                debug_assert!(
                    r.claimed.iter().all(|(id, _)| self
                        .redis
                        .pending(*id)
                        .is_some_and(|p| p.consumer == *consumer)),
                    "XAUTOCLAIM hands each entry it claims to the claimer"
                );
                debug_assert!(
                    r.deleted.iter().all(|id| self.redis.pending(*id).is_none()),
                    "XAUTOCLAIM drops the deleted IDs it reports from the PEL"
                );
                if let Some(w) = by.worker {
                    self.trimmed_owed
                        .entry(w)
                        .or_default()
                        .extend(r.deleted.iter().copied());
                }
            }
            _ => {}
        }
        reply
    }

    /// Whether `run` is over: its row is terminal, or retention deleted it.
    #[must_use]
    pub fn finished(&self, run: RunId) -> bool {
        self.retired.contains_key(&run)
            || self
                .db
                .runs
                .get(&run)
                .is_some_and(|r| r.status.is_terminal())
    }

    /// S4: may entry `id` be acknowledged now? Yes if its run is terminal, has
    /// moved to a newer dispatch, or is running under an attempt claimed from
    /// another entry of the same dispatch (a duplicate publication); and for a
    /// malformed entry or an unknown run, once it is quarantined; and for a
    /// run retention deleted (it was terminal).
    #[must_use]
    pub fn durable_next_step(&self, id: EntryId) -> bool {
        match self.entries.get(&id) {
            None => true, // not a job entry this world published: nothing to lose
            Some(JobEntry::Malformed { .. }) => self.quarantined.contains(&id),
            Some(JobEntry::Job { run, dispatch }) => match self.db.runs.get(run) {
                None => self.retired.contains_key(run) || self.quarantined.contains(&id),
                Some(r) => {
                    r.status.is_terminal()
                        || r.dispatch > *dispatch
                        || crate::protocol::superseded(r, id, *dispatch)
                }
            },
        }
    }

    /// Records the external application of side effect `tool_call` of `run`
    /// when the ledger applied it (`applied`), checking S5.
    pub fn effect_applied(&mut self, run: RunId, tool_call: u32, applied: bool) {
        if applied {
            let n = self.effects.entry((run, tool_call)).or_insert(0);
            *n += 1;
            if *n > 1 {
                self.violations
                    .insert(Violation::EffectTwice(run, tool_call));
            }
        }
    }

    /// S11: the attempt of `run` holding `fence` runs step `step`. A record
    /// made by an earlier fence means the step was recorded before this
    /// attempt was claimed (fences grow with every claim): it must have
    /// been replayed.
    pub fn step_ran(&mut self, run: RunId, step: u32, fence: Fence) {
        if self
            .db
            .steps
            .get(&(run, step))
            .is_some_and(|s| s.fence < fence)
        {
            self.violations.insert(Violation::StepRerun(run, step));
        }
    }

    /// S2: an execution may start only under a claim this delivery made,
    /// while the run is running under that fence.
    pub fn check_execution(&mut self, run: RunId, own_fence: Option<Fence>) {
        let ok =
            self.db.runs.get(&run).is_some_and(|r| {
                r.status == RunStatus::Running && Some(r.active_fence) == own_fence
            });
        if !ok {
            self.violations.insert(Violation::ExecutedWithoutClaim(run));
        }
        if let Some(fence) = own_fence {
            self.check_budget(run, fence);
        }
    }

    /// S6: no job runs under a claim that found its run's budget spent.
    fn check_budget(&mut self, run: RunId, fence: Fence) {
        if self.spent_claims.contains(&(run, fence)) {
            self.violations.insert(Violation::RanPastBudget(run));
        }
    }

    /// S2, where time passes between a claim's answer and the job's start
    /// (the simulator, the live worker): the job must run under a claim this
    /// delivery made itself, for this fence. A cancel or a reclaim may land
    /// in between; the attempt then stops at its next boundary (S7).
    pub fn check_execution_claimed(&mut self, run: RunId, fence: Fence, own_fence: Option<Fence>) {
        let claimed = own_fence == Some(fence)
            && self
                .db
                .attempts
                .range((run, AttemptNo(0))..=(run, AttemptNo(u32::MAX)))
                .any(|(_, a)| a.fence == fence);
        if !claimed {
            self.violations.insert(Violation::ExecutedWithoutClaim(run));
        }
        self.check_budget(run, fence);
    }

    /// S8: every deleted ID reported to `worker`'s live reclaimer must still
    /// be held by it (`held`) until recovered.
    pub fn check_trimmed_held(&mut self, worker: WorkerId, held: &BTreeSet<EntryId>) {
        let dropped: Vec<EntryId> = self
            .trimmed_owed
            .get(&worker)
            .into_iter()
            .flatten()
            .filter(|id| !held.contains(id))
            .copied()
            .collect();
        for id in dropped {
            self.violations.insert(Violation::TrimmedDropped(id));
        }
    }

    /// S6: delivery of `run` was just answered [`DbReply::Refused`] for
    /// its outcome and came to `end` (`None`: it goes on). An outcome
    /// Postgres refuses would be refused on every attempt, so the delivery
    /// must fail the run at once; leaving the entry pending retries it.
    pub fn check_refusal(&mut self, run: RunId, end: Option<DeliveryEnd>) {
        if matches!(end, Some(DeliveryEnd::LeftPending(_))) {
            self.violations.insert(Violation::RefusalRetried(run));
        }
    }

    /// A worker crashed: its reclaimer's obligations die with it (the sweeper
    /// recovers those runs).
    pub fn worker_crashed(&mut self, worker: WorkerId) {
        self.trimmed_owed.remove(&worker);
    }

    /// Redis lost everything (restart without persistence): both streams and
    /// the group are gone.
    pub fn redis_wiped(&mut self) {
        self.redis = Redis::partitioned(partition_at(self.redis.jobs.len())).into();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{Dispatch, RunId};

    fn job(n: u64) -> JobEntry {
        JobEntry::Job {
            run: RunId(n),
            dispatch: Dispatch(1),
        }
    }

    /// Retention trims only entries that are delivered, acknowledged and
    /// older than the cutoff time: never a pending or undelivered one.
    #[test]
    fn retention_keeps_pending_and_undelivered_entries() {
        let mut w = World::new();
        for n in 1..=5 {
            let now = Timestamp(n * 10);
            w.db.clock = now;
            w.stream(
                &StreamOp::Publish {
                    partition: 0,
                    entry: job(n),
                    now,
                },
                Issuer::default(),
            )
            .expect("XADD");
        }
        w.db.clock = Timestamp(60);
        let read = StreamOp::Read {
            partition: 0,
            consumer: "w0".into(),
            count: 3,
            now: Timestamp(60),
        };
        w.stream(&read, Issuer::default()).expect("XREADGROUP");
        let ack = StreamOp::Ack {
            ids: vec![EntryId::new(10, 0)],
        };
        w.stream(&ack, Issuer::default()).expect("XACK");
        // Entry 1 is acked; 2 and 3 are pending; 4 and 5 are undelivered.
        let retain = |w: &mut World, before| {
            w.redis
                .execute(&StreamOp::Retain {
                    partition: 0,
                    before: Timestamp(before),
                })
                .expect("Retain")
        };
        assert_eq!(retain(&mut w, 1_000), StreamReply::Trimmed(1));
        assert_eq!(w.redis.part(0).len(), 4);
        w.stream(
            &StreamOp::Ack {
                ids: vec![EntryId::new(20, 0), EntryId::new(30, 0)],
            },
            Issuer::default(),
        )
        .expect("XACK");
        // Time bounds it too: only entries older than 25 ms.
        assert_eq!(retain(&mut w, 25), StreamReply::Trimmed(1));
        assert_eq!(retain(&mut w, 1_000), StreamReply::Trimmed(1));
        assert_eq!(w.redis.part(0).len(), 2, "undelivered entries stay");
        w.redis_wiped();
        assert_eq!(
            retain(&mut w, 1_000),
            StreamReply::Trimmed(0),
            "no group: no trim"
        );
    }

    /// S12: a permit counts until its hold runs out, whether its holder
    /// lives or not; a second unexpired one on a single slot is flagged,
    /// and so are calls starting faster than the rate.
    #[test]
    fn provider_limits_are_checked_at_each_grant() {
        let limit = crate::protocol::ProviderLimit {
            concurrent: Some(1),
            per_second: Some(10),
            burst: 1,
            hold_ms: 1_000,
        };
        let policy = crate::protocol::Policy::default();
        let mut w = World::at(Timestamp(5_000));
        let by = Issuer::default();
        let acquire = |h| DbOp::from(limit.acquire(&policy, "p", h).expect("a concurrency limit"));
        w.db(&limit.ensure("p").expect("slots").into(), by);
        assert_eq!(w.db(&acquire("a"), by), DbReply::Rows(1));
        assert_eq!(w.db(&acquire("b"), by), DbReply::Rows(0), "held");
        w.db.clock = Timestamp(6_000);
        assert_eq!(
            w.db(&acquire("b"), by),
            DbReply::Rows(1),
            "a's hold ran out"
        );
        assert!(w.violations.is_empty(), "{:?}", w.violations);
        // A statement that hands out a held slot (as Overbooked's does).
        w.db.slots
            .values_mut()
            .for_each(|(_, until)| *until = Timestamp::ZERO);
        assert_eq!(w.db(&acquire("c"), by), DbReply::Rows(1));
        assert!(
            w.violations
                .contains(&Violation::SlotOverbooked("p".into()))
        );

        let mut w = World::at(Timestamp(5_000));
        let take = DbOp::from(limit.take_token("p").expect("a rate limit"));
        assert_eq!(w.db(&take, by), DbReply::Rows(1));
        assert_eq!(w.db(&take, by), DbReply::Rows(0), "too soon");
        w.db.clock = Timestamp(5_100);
        assert_eq!(w.db(&take, by), DbReply::Rows(1), "one interval later");
        assert!(w.violations.is_empty(), "{:?}", w.violations);
        // A rate limit that forgot its state.
        w.db.rates.clear();
        assert_eq!(w.db(&take, by), DbReply::Rows(1));
        assert!(w.violations.contains(&Violation::RateExceeded("p".into())));
    }
}
