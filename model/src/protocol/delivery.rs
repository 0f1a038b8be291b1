// Over 600 lines: one state machine, the delivery, with its phases in one match.
//! The worker's handling of one delivery, from receipt to acknowledgement.
//! One state machine in one file: its phases and transitions read together.
//!
//! ```text
//! entry ──malformed──▶ quarantine (dead stream) ──▶ XACK
//!   │
//!   └─▶ claim (fenced attempt) ──refused──▶ read run ──▶ terminal / stale ──▶ XACK
//!          │                                   ├──▶ exhausted ──▶ dead letter ──▶ XACK
//!          │                                   └──▶ owned elsewhere: leave pending
//!          ▼
//!       execute ◀── heartbeat (lease in Postgres, idle reset in the PEL)
//!          │           └── rejected: abort, read run
//!          ▼
//!       fenced write (result / failure / retry_at / dead letter)
//!          ├──accepted──▶ XACK                         (S4: ack after durable)
//!          └──rejected──▶ read run ──▶ terminal ──▶ XACK, else leave pending (S3)
//! ```
//!
//! Any command without a reply ends the delivery with the entry left pending:
//! that is always safe, because a pending entry is reclaimed and every step
//! above is idempotent under the run's dispatch and fence.

use super::{
    Command, DbOp, DbReply, DeadEntry, Execution, Input, JobEntry, Policy, StreamOp, StreamReply,
    TimeLimit,
};
use crate::db::{Claimed, RunRow};
use crate::ids::{Dispatch, EntryId, RunId, WorkerId};
use crate::status::{ErrorClass, JobOutcome, RunStatus};
use crate::time::Timestamp;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

/// Whether entry `id` (announcing `dispatch`) is a duplicate publication that
/// needs no work: its run is running under an attempt claimed from another
/// entry of the same dispatch. That entry carries the run's progress and has
/// its own recovery (reclaim, trimmed-entry recovery, the sweeper), and this
/// one can never claim the run again (a lapsed attempt is taken over only
/// through its own entry: [`Db::claim`](crate::db::Db::claim)), so it can be
/// acknowledged at once (S4).
#[must_use]
pub fn superseded(row: &RunRow, id: EntryId, dispatch: Dispatch) -> bool {
    row.status == RunStatus::Running
        && row.dispatch == dispatch
        && row.entry_id.is_some_and(|e| e != id)
}

/// How a delivery ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum DeliveryEnd {
    /// Acknowledged after the run's next step was durable.
    Acked(AckReason),
    /// Left in the PEL for a later reclaim.
    LeftPending(PendingReason),
}

impl DeliveryEnd {
    /// A short name for counters and metrics labels (`acked_written`,
    /// `left_pending`, ...).
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            DeliveryEnd::Acked(AckReason::Written) => "acked_written",
            DeliveryEnd::Acked(AckReason::Terminal) => "acked_terminal",
            DeliveryEnd::Acked(AckReason::Stale) => "acked_stale",
            DeliveryEnd::Acked(AckReason::Duplicate) => "acked_duplicate",
            DeliveryEnd::Acked(AckReason::Exhausted) => "acked_exhausted",
            DeliveryEnd::Acked(AckReason::Quarantined) => "acked_quarantined",
            #[cfg(feature = "mutants")]
            DeliveryEnd::Acked(AckReason::Mutant) => "acked_mutant",
            DeliveryEnd::LeftPending(_) => "left_pending",
        }
    }
}

/// Why an entry was acknowledged (S4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum AckReason {
    /// This attempt's outcome was written.
    Written,
    /// The run was already terminal.
    Terminal,
    /// The entry's dispatch is older than the run's, or its run was
    /// finished and then deleted by retention.
    Stale,
    /// A duplicate publication: the run is running under an attempt claimed
    /// from another entry of the same dispatch.
    Duplicate,
    /// The run's attempts were exhausted; it is now dead.
    Exhausted,
    /// The entry was malformed or named an unknown run (S10).
    Quarantined,
    /// Mutant behaviour (only in a build with the `mutants` feature).
    #[cfg(feature = "mutants")]
    Mutant,
}

/// Why an entry was left pending.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum PendingReason {
    /// A command got no reply.
    Unavailable,
    /// Another attempt owns the run (a live lease or a newer fence).
    OwnedElsewhere,
    /// Mutant behaviour (only in a build with the `mutants` feature).
    #[cfg(feature = "mutants")]
    Mutant,
}

/// What the delivery is waiting for.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
enum Phase {
    /// PublishDead (quarantine) outstanding.
    Quarantining,
    /// Claim outstanding.
    Claiming,
    /// ReadRun outstanding; `refused_claim` when it follows a refused claim.
    Reading { refused_claim: bool },
    /// RunIssued outstanding: the run has no row.
    CheckingIssued,
    /// The job runs.
    Executing {
        claimed: Claimed,
        heartbeat: Heartbeat,
        outcome: Option<JobOutcome>,
    },
    /// NoFence mutant: reading the run's current fence before writing.
    #[cfg(feature = "mutants")]
    ReadingFence {
        claimed: Claimed,
        outcome: JobOutcome,
    },
    /// A fenced write outstanding.
    Writing(Write),
    /// DeadLetterExhausted outstanding.
    Burying,
    /// PublishDead (dead-letter notification) outstanding.
    Notifying,
    /// Ack outstanding.
    Acking(AckReason),
    /// AckBeforeCommit mutant: the ack outstanding, the write to follow.
    #[cfg(feature = "mutants")]
    AckingFirst(DbOp),
    /// Over.
    Done(DeliveryEnd),
}

/// Which fenced write is outstanding, and what follows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
enum Write {
    /// Result, terminal failure or retry: ack when accepted.
    Result,
    /// Dead letter: notify the dead stream, then ack.
    Dead(ErrorClass),
    /// The failure written because Postgres refused the outcome
    /// ([`ErrorClass::Unstorable`]): ack when accepted; if it too is
    /// refused, leave the entry pending.
    Unstorable,
    /// AckBeforeCommit mutant: the ack already happened.
    #[cfg(feature = "mutants")]
    AckedFirst,
    /// RetryInPel mutant: leave the entry pending either way.
    #[cfg(feature = "mutants")]
    LeavePending,
}

/// Where the heartbeat is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
enum Heartbeat {
    /// Waiting for its timer.
    Idle,
    /// The lease renewal is outstanding.
    Renewing,
    /// The PEL idle reset is outstanding.
    Touching,
}

/// One delivery being handled by a worker (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Delivery {
    policy: Policy,
    worker: WorkerId,
    entry: EntryId,
    job: JobEntry,
    entropy: u64,
    phase: Phase,
    own: Option<Claimed>,
    /// The claimed run's kind (its policy's back-off).
    kind: String,
    outbox: VecDeque<Command>,
}

impl Delivery {
    /// Starts handling `entry` (just read or reclaimed by `worker`).
    /// `entropy` is the driver's random draw for retry jitter.
    #[must_use]
    pub fn new(
        now: Timestamp,
        policy: &Policy,
        worker: WorkerId,
        entry: EntryId,
        job: JobEntry,
        entropy: u64,
    ) -> Delivery {
        let mut d = Delivery {
            policy: policy.clone(),
            worker,
            entry,
            job,
            entropy,
            phase: Phase::Claiming,
            own: None,
            kind: String::new(),
            outbox: VecDeque::with_capacity(4),
        };
        match d.job.clone() {
            JobEntry::Malformed { reason } => d.quarantine(now, reason),
            JobEntry::Job { run, dispatch } => {
                let (worker, lease_ms) = (d.worker.consumer(), d.policy.lease_ms);
                let op = match () {
                    #[cfg(feature = "mutants")]
                    () if crate::injects!(d.policy, ReviveCancelled) => DbOp::ClaimReviving {
                        run,
                        dispatch,
                        entry,
                        worker,
                        lease_ms,
                    },
                    #[cfg(feature = "mutants")]
                    () if crate::injects!(d.policy, WorkerClock) => DbOp::ClaimAt {
                        run,
                        dispatch,
                        entry,
                        worker,
                        now,
                        lease_ms,
                    },
                    () => DbOp::Claim {
                        run,
                        dispatch,
                        entry,
                        worker,
                        lease_ms,
                    },
                };
                d.send(Command::Db(op));
            }
        }
        d
    }

    /// Relabels the worker this delivery runs in (see
    /// [`Command::rename_consumer`]).
    pub fn relabel(&mut self, worker: WorkerId) {
        for c in &mut self.outbox {
            c.relabel_worker(self.worker, worker);
        }
        self.worker = worker;
    }

    /// The stream entry being handled.
    #[must_use]
    pub fn entry(&self) -> EntryId {
        self.entry
    }

    /// The decoded entry.
    #[must_use]
    pub fn job(&self) -> &JobEntry {
        &self.job
    }

    /// The run and dispatch the entry names, if well-formed.
    #[must_use]
    pub fn run(&self) -> Option<(RunId, Dispatch)> {
        match self.job {
            JobEntry::Job { run, dispatch } => Some((run, dispatch)),
            JobEntry::Malformed { .. } => None,
        }
    }

    /// The attempt this delivery holds, while executing.
    #[must_use]
    pub fn claimed(&self) -> Option<Claimed> {
        match &self.phase {
            Phase::Executing { claimed, .. } => Some(*claimed),
            #[cfg(feature = "mutants")]
            Phase::ReadingFence { claimed, .. } => Some(*claimed),
            _ => None,
        }
    }

    /// The fence of the attempt this delivery claimed itself, if it did.
    #[must_use]
    pub fn own_fence(&self) -> Option<crate::ids::Fence> {
        self.own.map(|c| c.fence)
    }

    /// Whether the job is running (started and not yet reported).
    #[must_use]
    pub fn is_executing(&self) -> bool {
        matches!(&self.phase, Phase::Executing { outcome: None, .. })
    }

    /// How it ended, once it has.
    #[must_use]
    pub fn end(&self) -> Option<DeliveryEnd> {
        match self.phase {
            Phase::Done(end) => Some(end),
            _ => None,
        }
    }

    /// Whether it has ended and every command was drained.
    #[must_use]
    pub fn is_done(&self) -> bool {
        self.end().is_some() && self.outbox.is_empty()
    }

    /// The next command for the driver.
    #[must_use]
    pub fn poll(&mut self) -> Option<Command> {
        self.outbox.pop_front()
    }

    fn send(&mut self, c: Command) {
        self.outbox.push_back(c);
    }

    fn finish(&mut self, end: DeliveryEnd) {
        self.phase = Phase::Done(end);
    }

    fn quarantine(&mut self, now: Timestamp, reason: String) {
        self.phase = Phase::Quarantining;
        let entry = DeadEntry::Quarantined {
            source: self.entry,
            reason,
        };
        self.send(Command::Stream(StreamOp::PublishDead { entry, now }));
    }

    fn ack(&mut self, why: AckReason) {
        self.phase = Phase::Acking(why);
        self.send(Command::Stream(StreamOp::Ack {
            ids: vec![self.entry],
        }));
    }

    fn read(&mut self, refused_claim: bool) {
        let (run, _) = self.run().expect("only well-formed entries are read");
        self.phase = Phase::Reading { refused_claim };
        self.send(Command::Db(DbOp::ReadRun { run }));
    }

    /// Feeds the answer to the outstanding command, a timer, or the job's end.
    pub fn handle(&mut self, now: Timestamp, input: Input) {
        let phase = std::mem::replace(&mut self.phase, Phase::Claiming);
        match (phase, input) {
            (phase @ Phase::Done(_), _) => self.phase = phase,
            (
                Phase::Executing {
                    claimed,
                    heartbeat,
                    outcome,
                },
                input,
            ) => {
                self.on_executing(now, claimed, heartbeat, outcome, input);
            }
            (_, Input::Unavailable) => {
                self.finish(DeliveryEnd::LeftPending(PendingReason::Unavailable));
            }
            (Phase::Quarantining, Input::Stream(Ok(StreamReply::Added(_)))) => {
                self.ack(AckReason::Quarantined);
            }
            (Phase::Claiming, Input::Db(DbReply::Claimed(Some(job)))) => {
                self.on_claimed(now, job);
            }
            (Phase::Claiming, Input::Db(DbReply::Claimed(None))) => self.read(true),
            (Phase::Reading { refused_claim }, Input::Db(DbReply::Run(row))) => {
                self.decide(now, row, refused_claim);
            }
            (Phase::CheckingIssued, Input::Db(DbReply::Rows(1))) => self.ack(AckReason::Stale),
            (Phase::CheckingIssued, Input::Db(DbReply::Rows(_))) => {
                self.quarantine(now, "unknown run".to_owned());
            }
            #[cfg(feature = "mutants")]
            (Phase::ReadingFence { claimed, outcome }, Input::Db(DbReply::Run(row))) => {
                // NoFence: write with whatever fence the run has now.
                let fence = row.map_or(claimed.fence, |r| r.active_fence);
                self.write_outcome(Claimed { fence, ..claimed }, outcome);
            }
            (Phase::Writing(kind), Input::Db(DbReply::Refused)) => self.on_refused(kind),
            (Phase::Writing(kind), Input::Db(DbReply::Rows(rows))) => {
                self.written(now, kind, rows);
            }
            (Phase::Burying, Input::Db(DbReply::Rows(rows))) => {
                debug_assert!(rows <= 1, "a burial matches at most its run's row");
                if rows == 1 {
                    self.notify_dead(now, ErrorClass::Exhausted);
                } else {
                    self.read(false);
                }
            }
            (Phase::Notifying, Input::Stream(_)) => {
                // The notification is best effort: the dead_letters row is
                // the durable record, so ack either way.
                self.ack(AckReason::Written);
            }
            (Phase::Acking(why), Input::Stream(Ok(StreamReply::Acked(n)))) => {
                debug_assert!(n <= 1, "an XACK of one ID acknowledges at most one");
                self.finish(DeliveryEnd::Acked(why));
            }
            #[cfg(feature = "mutants")]
            (Phase::AckingFirst(op), Input::Stream(Ok(StreamReply::Acked(_)))) => {
                self.phase = Phase::Writing(Write::AckedFirst);
                self.send(Command::Db(op));
            }
            (phase, input) => {
                // An answer of the wrong shape (or a stream error such as
                // NOGROUP after Redis lost its data): leave the entry pending.
                debug_assert!(
                    matches!(input, Input::Stream(Err(_)) | Input::Timer),
                    "unexpected {input:?} in {phase:?}"
                );
                let _ = phase;
                self.finish(DeliveryEnd::LeftPending(PendingReason::Unavailable));
            }
        }
    }

    /// The claim took the run: this delivery's own attempt starts.
    fn on_claimed(&mut self, now: Timestamp, job: crate::db::ClaimedJob) {
        debug_assert!(self.own.is_none(), "a delivery claims at most once");
        debug_assert!(
            job.claimed.fence > crate::ids::Fence(0)
                && (1..=job.claimed.attempts_max).contains(&job.claimed.attempt.0),
            "a claim starts a fenced attempt within the run's bound: {:?}",
            job.claimed
        );
        self.own = Some(job.claimed);
        self.start(now, job.claimed, job.kind, job.input, job.trace);
    }

    /// A fenced write of `kind` matched `rows` rows: written (then acked,
    /// or the dead letter noticed), or rejected.
    fn written(&mut self, now: Timestamp, kind: Write, rows: u64) {
        debug_assert!(rows <= 1, "a fenced write matches at most its run's row");
        #[cfg(feature = "mutants")]
        if let Some(end) = self.mutant_written(kind, rows) {
            return end;
        }
        if let (1, Write::Dead(class)) = (rows, kind) {
            self.notify_dead(now, class);
        } else if rows == 1 {
            self.ack(AckReason::Written);
        } else {
            // Rejected: a newer attempt holds the run, or it is terminal.
            // Never overwrite; find out which.
            self.read(false);
        }
    }

    fn start(
        &mut self,
        now: Timestamp,
        claimed: Claimed,
        kind: String,
        input: String,
        trace: Option<String>,
    ) {
        debug_assert!(
            self.own == Some(claimed) || crate::injects!(self.policy, NoTerminalCheck),
            "a job runs only under this delivery's own claim (S2)"
        );
        let (run, _) = self.run().expect("claimed a well-formed entry");
        let timeout_ms = self.policy.kind(&kind).attempt_timeout_ms;
        self.kind = kind;
        let budget_left = claimed
            .budget_left_ms
            .filter(|_| !crate::injects!(self.policy, IgnoreBudget));
        if let Some(left) = budget_left
            && left <= 0
        {
            // Spent by Postgres's clock: the run fails without running.
            let message = format!(
                "the run's elapsed budget ran out {} ms before this attempt's claim",
                left.unsigned_abs()
            );
            let class = ErrorClass::BudgetExhausted;
            return self.write_outcome(claimed, JobOutcome::Failed { class, message });
        }
        let limits = [
            budget_left.map(|left| TimeLimit {
                ms: left.unsigned_abs(),
                class: ErrorClass::BudgetExhausted,
            }),
            timeout_ms.map(|ms| TimeLimit {
                ms,
                class: ErrorClass::Retryable,
            }),
        ];
        self.phase = Phase::Executing {
            claimed,
            heartbeat: Heartbeat::Idle,
            outcome: None,
        };
        self.send(Command::Execute(Execution {
            run,
            fence: claimed.fence,
            attempt: claimed.attempt.0,
            kind: self.kind.clone(),
            input,
            limit: limits.into_iter().flatten().min_by_key(|l| l.ms),
            trace,
        }));
        self.send(Command::SetTimer(now.add_ms(self.policy.heartbeat_ms)));
    }

    fn decide(&mut self, now: Timestamp, row: Option<RunRow>, refused_claim: bool) {
        let (_, dispatch) = self.run().expect("only well-formed entries are read");
        let Some(row) = row else {
            // Deleted by retention (its id was handed out), or never made.
            self.phase = Phase::CheckingIssued;
            let (run, _) = self.run().expect("only well-formed entries are read");
            return self.send(Command::Db(DbOp::RunIssued { run }));
        };
        if row.status.is_terminal() {
            if refused_claim && crate::injects!(self.policy, NoTerminalCheck) {
                // The bug: run the finished run again under its last fence.
                let claimed = Claimed {
                    fence: row.active_fence,
                    attempt: crate::ids::AttemptNo(row.attempts),
                    attempts_max: row.attempts_max,
                    unknown_failures: row.unknown_failures,
                    budget_left_ms: None,
                };
                return self.start(now, claimed, row.kind, row.input, row.trace);
            }
            return self.ack(AckReason::Terminal);
        }
        if row.dispatch > dispatch {
            return self.ack(AckReason::Stale);
        }
        if superseded(&row, self.entry, dispatch) {
            return self.ack(AckReason::Duplicate);
        }
        if row.dispatch == dispatch && row.orphaned(now) && row.attempts >= row.attempts_max {
            self.phase = Phase::Burying;
            let run = row.run_id;
            return self.send(Command::Db(DbOp::DeadLetterExhausted { run, dispatch }));
        }
        self.finish(DeliveryEnd::LeftPending(PendingReason::OwnedElsewhere));
    }

    fn on_executing(
        &mut self,
        now: Timestamp,
        claimed: Claimed,
        heartbeat: Heartbeat,
        outcome: Option<JobOutcome>,
        input: Input,
    ) {
        let (run, _) = self.run().expect("executing a well-formed entry");
        let (fence, lease_ms) = (claimed.fence, self.policy.lease_ms);
        let next = |d: &mut Delivery, heartbeat, outcome| {
            d.phase = Phase::Executing {
                claimed,
                heartbeat,
                outcome,
            };
        };
        match (heartbeat, input) {
            (Heartbeat::Idle, Input::Timer) if outcome.is_none() => {
                debug_assert!(
                    self.own_fence() == Some(fence)
                        || crate::injects!(self.policy, NoTerminalCheck),
                    "a heartbeat carries this delivery's own fence (S3)"
                );
                next(self, Heartbeat::Renewing, None);
                self.send(Command::Db(DbOp::Heartbeat {
                    run,
                    fence,
                    lease_ms,
                }));
            }
            (Heartbeat::Renewing, Input::Db(DbReply::Rows(1))) => {
                next(self, Heartbeat::Touching, outcome);
                let consumer = self.worker.consumer();
                self.send(Command::Stream(StreamOp::Touch {
                    consumer,
                    id: self.entry,
                    now,
                }));
            }
            (Heartbeat::Renewing, Input::Db(DbReply::Rows(_))) => {
                // Fenced out or cancelled: stop the job at its next boundary.
                if outcome.is_none() {
                    self.send(Command::Abort);
                }
                self.read(false);
            }
            (Heartbeat::Renewing | Heartbeat::Touching, Input::Unavailable | Input::Stream(_)) => {
                // A failed renewal is retried at the next tick; the lease
                // may still hold.
                match outcome {
                    Some(outcome) => self.write(claimed, outcome),
                    None => {
                        next(self, Heartbeat::Idle, None);
                        self.send(Command::SetTimer(now.add_ms(self.policy.heartbeat_ms)));
                    }
                }
            }
            (Heartbeat::Idle, Input::Executed(outcome)) => self.write(claimed, outcome),
            (hb, Input::Executed(outcome)) => next(self, hb, Some(outcome)),
            (hb, input) => {
                debug_assert!(
                    matches!(input, Input::Timer),
                    "unexpected {input:?} while executing"
                );
                next(self, hb, outcome);
            }
        }
    }

    fn write(&mut self, claimed: Claimed, outcome: JobOutcome) {
        #[cfg(feature = "mutants")]
        if crate::injects!(self.policy, NoFence) {
            let (run, _) = self.run().expect("executing a well-formed entry");
            self.phase = Phase::ReadingFence { claimed, outcome };
            return self.send(Command::Db(DbOp::ReadRun { run }));
        }
        self.write_outcome(claimed, outcome);
    }

    fn write_outcome(&mut self, claimed: Claimed, outcome: JobOutcome) {
        let (run, _) = self.run().expect("executing a well-formed entry");
        debug_assert!(
            self.own_fence() == Some(claimed.fence)
                || crate::injects!(self.policy, NoFence)
                || crate::injects!(self.policy, NoTerminalCheck),
            "a fenced write carries this delivery's own fence (S3)"
        );
        let fence = claimed.fence;
        let (op, kind) = match self.policy.storable(outcome) {
            JobOutcome::Succeeded { result } => {
                (DbOp::Complete { run, fence, result }, Write::Result)
            }
            JobOutcome::Failed {
                class: ErrorClass::Unstorable,
                message,
            } => (
                DbOp::Fail {
                    run,
                    fence,
                    class: ErrorClass::Unstorable,
                    message,
                },
                Write::Unstorable,
            ),
            JobOutcome::Failed { class, message } => self.failure(run, claimed, class, message),
        };
        #[cfg(feature = "mutants")]
        if crate::injects!(self.policy, AckBeforeCommit) {
            self.phase = Phase::AckingFirst(op);
            return self.send(Command::Stream(StreamOp::Ack {
                ids: vec![self.entry],
            }));
        }
        self.phase = Phase::Writing(kind);
        self.send(Command::Db(op));
    }

    /// The write a failure of class `class` makes: the run fails (a
    /// terminal error, or an unknown one past the policy's cap), is retried
    /// (attempts left), or is dead-lettered.
    fn failure(
        &self,
        run: RunId,
        claimed: Claimed,
        class: ErrorClass,
        message: String,
    ) -> (DbOp, Write) {
        let fence = claimed.fence;
        let fails = matches!(
            class,
            ErrorClass::Terminal | ErrorClass::Exhausted | ErrorClass::BudgetExhausted
        ) || (class == ErrorClass::Unknown
            && claimed.unknown_failures >= self.policy.unknown_retries_max
            && !crate::injects!(self.policy, UnknownRetried));
        if fails {
            // Below the cap, and within the attempts, an unknown error is
            // retried like the others.
            let class = if matches!(class, ErrorClass::Unknown | ErrorClass::BudgetExhausted) {
                class
            } else {
                ErrorClass::Terminal
            };
            let op = DbOp::Fail {
                run,
                fence,
                class,
                message,
            };
            return (op, Write::Result);
        }
        #[cfg(feature = "mutants")]
        if crate::injects!(self.policy, RetryInPel) {
            // The bug: record the failure, leave the entry in the PEL as
            // "the retry".
            let op = DbOp::RecordFailureOnly {
                run,
                fence,
                class,
                message,
            };
            return (op, Write::LeavePending);
        }
        if claimed.attempt.0 < claimed.attempts_max {
            let backoff_ms = self
                .policy
                .backoff_ms(&self.kind, claimed.attempt.0, self.entropy);
            let op = DbOp::ScheduleRetry {
                run,
                fence,
                class,
                message,
                backoff_ms,
            };
            return (op, Write::Result);
        }
        let op = DbOp::DeadLetter {
            run,
            fence,
            class,
            message,
        };
        (op, Write::Dead(class))
    }

    /// Postgres refused the outcome's values (text holding a NUL byte).
    /// Every retry would produce the same value, so the run fails now, as
    /// `unstorable`, with a message of ours that Postgres stores.
    fn on_refused(&mut self, kind: Write) {
        let retry = matches!(kind, Write::Result | Write::Dead(_));
        match self.own {
            Some(claimed) if retry && !crate::injects!(self.policy, PoisonRetried) => {
                let message = "Postgres refused to store this attempt's result or error \
                               message (text holding a NUL byte); the worker's log has its \
                               own error"
                    .to_owned();
                self.write_outcome(
                    claimed,
                    JobOutcome::Failed {
                        class: ErrorClass::Unstorable,
                        message,
                    },
                );
            }
            _ => self.finish(DeliveryEnd::LeftPending(PendingReason::Unavailable)),
        }
    }

    fn notify_dead(&mut self, now: Timestamp, class: ErrorClass) {
        let (run, _) = self.run().expect("buried a well-formed entry");
        self.phase = Phase::Notifying;
        let entry = DeadEntry::Run {
            run,
            source: self.entry,
            class,
        };
        self.send(Command::Stream(StreamOp::PublishDead { entry, now }));
    }

    /// The ends the mutants give a write's answer, if any.
    #[cfg(feature = "mutants")]
    fn mutant_written(&mut self, kind: Write, rows: u64) -> Option<()> {
        match kind {
            Write::AckedFirst => self.finish(DeliveryEnd::Acked(AckReason::Mutant)),
            Write::LeavePending => self.finish(DeliveryEnd::LeftPending(PendingReason::Mutant)),
            _ if rows != 1 && crate::injects!(self.policy, StaleAck) => {
                self.ack(AckReason::Mutant);
            }
            _ => return None,
        }
        Some(())
    }
}
