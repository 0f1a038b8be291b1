// Over 600 lines: the policy and the types every role shares (commands, inputs, replies).
//! The protocol: each role of Pelican as a sans-IO state machine.
//!
//! A role never awaits, never reads a clock and never draws randomness. The
//! driver (real/ on live servers, sim/ under madsim, the checker in
//! `pelican-checker`) owns all three and runs the same loop for every role:
//!
//! ```
//! use pelican_model::protocol::{Command, Delivery, Input, Policy, JobEntry};
//! use pelican_model::{Db, ids::*, time::Timestamp, world::Redis};
//!
//! let policy = Policy::default();
//! let mut db = Db::new();
//! let mut redis = Redis::default();
//! db.insert_run(RunId(7), "noop", "{}", policy.attempts_max);
//! let entry = EntryId::new(1, 0);
//! let mut now = Timestamp(1_000);
//! let mut delivery = Delivery::new(
//!     now, &policy, WorkerId(0), entry, JobEntry::Job { run: RunId(7), dispatch: Dispatch(1) }, 0,
//! );
//! // Mutate once (`new` or `handle`), then drain every command.
//! while !delivery.is_done() {
//!     let Some(command) = delivery.poll() else { break };
//!     let input = match command {
//!         Command::Db(op) => Input::Db(db.execute(&op)),
//!         Command::Stream(op) => Input::Stream(redis.execute(&op)),
//!         Command::Execute(_) => Input::Executed(pelican_model::JobOutcome::Succeeded {
//!             result: "42".into(),
//!         }),
//!         Command::SetTimer(_) | Command::Abort => continue,
//!     };
//!     now = now.add_ms(1);
//!     delivery.handle(now, input);
//! }
//! assert_eq!(db.read_run(RunId(7)).unwrap().status, pelican_model::RunStatus::Succeeded);
//! ```
//!
//! Every command that reaches a server is data ([`DbOp`], [`StreamOp`]); its
//! result comes back as an [`Input`]. A role has at most one such command
//! outstanding, so a lost reply ([`Input::Unavailable`]) is always about the
//! command the role is waiting for.

pub use crate::db::{DbOp, DbReply};
use crate::ids::{Dispatch, EntryId, Fence, Partition, RunId, WorkerId};
use crate::status::{ErrorClass, JobOutcome};
use crate::stream::{AutoClaim, StreamError};
use crate::time::Timestamp;
pub use crate::world::StreamOp;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

mod delivery;
mod limits;
mod maintenance;
mod mutant;
mod progress;
mod reclaimer;
mod steps;
mod submitter;

pub use delivery::{AckReason, Delivery, DeliveryEnd, PendingReason, superseded};
pub use limits::ProviderLimit;
pub use maintenance::{Maintenance, MaintenanceTask, PassReport, still_deliverable};
pub use mutant::{Mutant, none_injected};
pub use progress::{ProgressError, progress, progressed};
pub use reclaimer::{Reclaimer, ReclaimerEvent};
pub use steps::{Ledger, StepError, StepPlan};
pub use submitter::{Submitter, SubmitterEnd};

/// The knobs of the protocol, with units in their names.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(default)]
pub struct Policy {
    /// How long a claim or heartbeat keeps an attempt's ownership.
    pub lease_ms: u64,
    /// How often a running attempt renews its lease (well below `lease_ms`).
    pub heartbeat_ms: u64,
    /// XAUTOCLAIM's min-idle-time: deliveries idle this long are reclaimed.
    pub reclaim_min_idle_ms: u64,
    /// XAUTOCLAIM's COUNT.
    pub reclaim_batch_max: usize,
    /// Attempts allowed per run (S6).
    pub attempts_max: u32,
    /// First retry back-off.
    pub backoff_base_ms: u64,
    /// Back-off cap.
    pub backoff_cap_ms: u64,
    /// How long a queued run may sit published, or a running run sit with an
    /// expired lease, before the sweeper checks that its entry still exists.
    pub sweep_grace_ms: u64,
    /// Rows per maintenance query.
    pub sweep_batch_max: usize,
    /// The longest result or error message an attempt may store, in bytes:
    /// a longer one fails its run as [`ErrorClass::Unstorable`].
    ///
    /// [`ErrorClass::Unstorable`]: crate::status::ErrorClass::Unstorable
    #[serde(default = "value_bytes_max")]
    pub value_bytes_max: usize,
    /// How long a finished run is kept before retention deletes it, with
    /// its attempts, dead letter and keys (0: kept forever).
    #[serde(default = "keep_finished_ms")]
    pub keep_finished_ms: u64,
    /// How many times a run may be retried after an error of class
    /// [`ErrorClass::Unknown`]; the next such error fails it (S6).
    ///
    /// [`ErrorClass::Unknown`]: crate::status::ErrorClass::Unknown
    #[serde(default = "unknown_retries_max")]
    pub unknown_retries_max: u32,
    /// How late a schedule's tick may be handled and still count as on
    /// time: a tick the scheduler reaches later than this was missed
    /// while no scheduler ran, and its schedule's catch-up policy decides
    /// ([`crate::schedule::Catchup`]).
    #[serde(default = "catchup_after_ms")]
    pub catchup_after_ms: u64,
    /// How many job stream partitions runs are spread over (at least 1):
    /// a run is published to [`Policy::partition_of`] it, and workers read,
    /// reclaim and trim every partition.
    #[serde(default = "partitions")]
    pub partitions: Partition,
    /// Per-kind policies, given when handlers are registered: what they
    /// set replaces the fields above for runs of that kind.
    #[serde(default)]
    pub kinds: BTreeMap<String, KindPolicy>,
    /// The protocol bug to inject (only with the `mutants` feature).
    pub mutant: Option<Mutant>,
}

/// What a kind of job changes of the [`Policy`] for its runs. Attempts and
/// the budget are fixed when a run is submitted; back-off and the attempt
/// timeout are the worker's at each attempt. Built from its default (the
/// [`Policy`]'s values) with a setter a field: it will grow, so other crates
/// cannot build one field by field.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct KindPolicy {
    /// Attempts allowed per run (instead of [`Policy::attempts_max`]).
    pub attempts_max: Option<u32>,
    /// First retry back-off (instead of [`Policy::backoff_base_ms`]).
    pub backoff_base_ms: Option<u64>,
    /// Back-off cap (instead of [`Policy::backoff_cap_ms`]).
    pub backoff_cap_ms: Option<u64>,
    /// How long one attempt may run before it fails retryably.
    pub attempt_timeout_ms: Option<u64>,
    /// How long a run may take from its submission, over all its attempts
    /// and waits, by Postgres's clock: a claim past it fails the run as
    /// `budget_exhausted` without running it, and an attempt is cut short
    /// when it runs out.
    pub budget_ms: Option<u64>,
}

impl KindPolicy {
    /// `n` attempts per run.
    #[must_use]
    pub const fn attempts_max(mut self, n: u32) -> KindPolicy {
        self.attempts_max = Some(n);
        self
    }

    /// Retries back off from `base_ms`, doubling, up to `cap_ms`.
    #[must_use]
    pub const fn backoff_ms(mut self, base_ms: u64, cap_ms: u64) -> KindPolicy {
        self.backoff_base_ms = Some(base_ms);
        self.backoff_cap_ms = Some(cap_ms);
        self
    }

    /// One attempt may run `ms` milliseconds.
    #[must_use]
    pub const fn attempt_timeout_ms(mut self, ms: u64) -> KindPolicy {
        self.attempt_timeout_ms = Some(ms);
        self
    }

    /// A run may take `ms` milliseconds from its submission, over all its
    /// attempts and waits.
    #[must_use]
    pub const fn budget_ms(mut self, ms: u64) -> KindPolicy {
        self.budget_ms = Some(ms);
        self
    }

    /// Each field this policy sets, else `base`'s.
    #[must_use]
    pub fn over(self, base: &KindPolicy) -> KindPolicy {
        let KindPolicy {
            attempts_max,
            backoff_base_ms,
            backoff_cap_ms,
            attempt_timeout_ms,
            budget_ms,
        } = self;
        KindPolicy {
            attempts_max: attempts_max.or(base.attempts_max),
            backoff_base_ms: backoff_base_ms.or(base.backoff_base_ms),
            backoff_cap_ms: backoff_cap_ms.or(base.backoff_cap_ms),
            attempt_timeout_ms: attempt_timeout_ms.or(base.attempt_timeout_ms),
            budget_ms: budget_ms.or(base.budget_ms),
        }
    }
}

/// How long an attempt may run, and the class it fails with past that.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TimeLimit {
    /// Milliseconds from the job's start.
    pub ms: u64,
    /// `retryable` for the kind's attempt timeout, `budget_exhausted` for
    /// the run's budget.
    pub class: ErrorClass,
}

fn partitions() -> Partition {
    1
}

fn value_bytes_max() -> usize {
    4 << 20
}

fn unknown_retries_max() -> u32 {
    1
}

fn catchup_after_ms() -> u64 {
    60_000
}

fn keep_finished_ms() -> u64 {
    7 * 24 * 3_600_000
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            lease_ms: 30_000,
            heartbeat_ms: 10_000,
            reclaim_min_idle_ms: 60_000,
            reclaim_batch_max: 16,
            attempts_max: 5,
            backoff_base_ms: 1_000,
            backoff_cap_ms: 60_000,
            sweep_grace_ms: 120_000,
            sweep_batch_max: 64,
            value_bytes_max: value_bytes_max(),
            keep_finished_ms: keep_finished_ms(),
            unknown_retries_max: unknown_retries_max(),
            catchup_after_ms: catchup_after_ms(),
            partitions: partitions(),
            kinds: BTreeMap::new(),
            mutant: None,
        }
    }
}

impl Policy {
    /// The outcome an attempt writes: `outcome`, or, when its result or
    /// error message is longer than [`Policy::value_bytes_max`], a failure
    /// of class [`ErrorClass::Unstorable`] that says so.
    #[must_use]
    pub fn storable(&self, outcome: JobOutcome) -> JobOutcome {
        let (what, len) = match &outcome {
            JobOutcome::Succeeded { result } => ("result", result.len()),
            JobOutcome::Failed { message, .. } => ("error message", message.len()),
        };
        if len <= self.value_bytes_max {
            return outcome;
        }
        JobOutcome::Failed {
            class: ErrorClass::Unstorable,
            message: format!(
                "the attempt's {what} has {len} bytes, over the limit of {} \
                 (--value-bytes-max)",
                self.value_bytes_max
            ),
        }
    }

    /// The partition `run` is published to, whenever it is: runs spread
    /// evenly, and a run keeps its partition while `partitions` stays.
    #[must_use]
    pub fn partition_of(&self, run: RunId) -> Partition {
        let n = u64::from(self.partitions.max(1));
        Partition::try_from(run.0 % n).expect("below the partition count")
    }

    /// The partitions, in order.
    pub fn all_partitions(&self) -> impl Iterator<Item = Partition> + use<> {
        0..self.partitions.max(1)
    }

    /// The policy of `kind` (empty when it has none).
    #[must_use]
    pub fn kind(&self, kind: &str) -> KindPolicy {
        self.kinds.get(kind).cloned().unwrap_or_default()
    }

    /// The attempts a new run of `kind` allows.
    #[must_use]
    pub fn attempts_max_of(&self, kind: &str) -> u32 {
        self.kind(kind).attempts_max.unwrap_or(self.attempts_max)
    }

    /// The delay before retry `attempt + 1` of a run of `kind`: exponential
    /// from the back-off base, capped, with "equal jitter" drawn from
    /// `entropy` (the driver's randomness, passed in).
    #[must_use]
    pub fn backoff_ms(&self, kind: &str, attempt: u32, entropy: u64) -> u64 {
        let k = self.kind(kind);
        let (base, cap) = (
            k.backoff_base_ms.unwrap_or(self.backoff_base_ms),
            k.backoff_cap_ms.unwrap_or(self.backoff_cap_ms),
        );
        let exp = base
            .saturating_mul(1u64 << attempt.saturating_sub(1).min(32))
            .min(cap);
        let half = exp / 2;
        half + entropy % (exp - half + 1)
    }

    /// The idempotency key of side effect `tool_call` of `run` (S5): stable
    /// across attempts, so the external service applies it once.
    #[must_use]
    pub fn idempotency_key(&self, run: RunId, tool_call: u32, fence: Fence) -> String {
        if crate::injects!(self, NoIdempotencyKey) {
            // The bug: a key that changes with every attempt.
            return format!("{run}/{tool_call}/{}", fence.0);
        }
        format!("{run}/{tool_call}")
    }
}

/// What a job stream entry says, once decoded. The real binding writes
/// `run_id` and `dispatch` fields; anything else decodes to `Malformed`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum JobEntry {
    /// "Run `run` for its dispatch `dispatch`".
    Job {
        /// The run.
        run: RunId,
        /// The dispatch this entry announces.
        dispatch: Dispatch,
    },
    /// Could not be decoded (S10); quarantined with the reason.
    Malformed {
        /// Why.
        reason: String,
    },
}

/// An entry of the dead-letter stream: a notification for operators; the
/// durable record of a dead run is its `dead_letters` row.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum DeadEntry {
    /// A run died after its attempts.
    Run {
        /// The run.
        run: RunId,
        /// The job entry it was last delivered by.
        source: EntryId,
        /// Why.
        class: ErrorClass,
    },
    /// A malformed or unknown job entry was quarantined (S10).
    Quarantined {
        /// The job entry.
        source: EntryId,
        /// Why.
        reason: String,
    },
}

/// The answer to a [`StreamOp`].
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[allow(missing_docs)]
pub enum StreamReply {
    Added(EntryId),
    GroupReady,
    Entries(Vec<(EntryId, JobEntry)>),
    Acked(u64),
    AutoClaimed(AutoClaim<JobEntry>),
    Touched(bool),
    Located {
        entry: Option<JobEntry>,
        pending: bool,
        delivered: bool,
    },
    /// Entries removed by `Retain`.
    Trimmed(u64),
    /// Consumers deleted by `ForgetConsumers`.
    Forgot(u64),
    Queue(QueueState),
}

impl StreamReply {
    /// The reply of a command on `partition`'s stream, whose IDs Redis
    /// gave without a partition: each ID put in `partition`.
    #[must_use]
    pub fn in_partition(self, partition: Partition) -> StreamReply {
        let at = |id: EntryId| id.in_partition(partition);
        match self {
            StreamReply::Added(id) => StreamReply::Added(at(id)),
            StreamReply::Entries(entries) => {
                StreamReply::Entries(entries.into_iter().map(|(id, e)| (at(id), e)).collect())
            }
            StreamReply::AutoClaimed(r) => StreamReply::AutoClaimed(AutoClaim {
                next: at(r.next),
                claimed: r.claimed.into_iter().map(|(id, e)| (at(id), e)).collect(),
                deleted: r.deleted.into_iter().map(at).collect(),
            }),
            StreamReply::Queue(q) => StreamReply::Queue(q.in_partition(partition)),
            other => other,
        }
    }
}

/// The answer to [`StreamOp::Queue`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct QueueState {
    /// Entries in the job stream (XLEN; 0 without the key).
    pub length: u64,
    /// Entries in the dead-letter stream.
    pub dead_letters: u64,
    /// The consumer group's side; `None` before the group exists.
    pub group: Option<GroupState>,
}

impl QueueState {
    /// The state of `partition`'s stream, read from Redis without a
    /// partition: its oldest pending ID put in `partition`.
    #[must_use]
    pub fn in_partition(mut self, partition: Partition) -> QueueState {
        if let Some(g) = &mut self.group {
            g.oldest_pending = g.oldest_pending.map(|id| id.in_partition(partition));
        }
        self
    }

    /// The queue over every partition, from each partition's own reading
    /// (IDs in their partitions, `dead_letters` the same in each): lengths,
    /// lag and pending add up, the oldest pending delivery is the one idle
    /// longest, consumers add up by name. `group` is `None` when no
    /// partition has the group; `lag` when one that has it cannot tell.
    #[must_use]
    pub fn merge(parts: impl IntoIterator<Item = QueueState>) -> QueueState {
        let mut out = QueueState::default();
        let mut consumers: BTreeMap<String, u64> = BTreeMap::new();
        for part in parts {
            out.length += part.length;
            out.dead_letters = part.dead_letters;
            let Some(g) = part.group else { continue };
            let merged = out.group.get_or_insert_with(|| GroupState {
                lag: Some(0),
                ..GroupState::default()
            });
            merged.lag = merged.lag.zip(g.lag).map(|(a, b)| a + b);
            merged.pending += g.pending;
            if g.oldest_pending.is_some()
                && (merged.oldest_pending.is_none() || g.oldest_idle_ms > merged.oldest_idle_ms)
            {
                merged.oldest_pending = g.oldest_pending;
                merged.oldest_idle_ms = g.oldest_idle_ms;
            }
            for (name, n) in g.consumers {
                *consumers.entry(name).or_insert(0) += n;
            }
        }
        if let Some(g) = &mut out.group {
            g.consumers = consumers.into_iter().collect();
        }
        out
    }
}

/// The consumer group's part of a [`QueueState`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GroupState {
    /// Entries not yet delivered to the group, when Redis can tell (it
    /// cannot after entries it had not delivered were deleted).
    pub lag: Option<u64>,
    /// Deliveries pending acknowledgement (the PEL's size).
    pub pending: u64,
    /// The oldest pending delivery's ID.
    pub oldest_pending: Option<EntryId>,
    /// Milliseconds since the oldest pending entry was last delivered.
    pub oldest_idle_ms: Option<u64>,
    /// Pending deliveries per consumer, by name (consumers with none are
    /// not listed).
    pub consumers: Vec<(String, u64)>,
}

/// Why a command has no answer: the server was unreachable, the call timed
/// out, or the reply was lost after the command was applied. The role cannot
/// tell which.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, thiserror::Error)]
#[error("no reply: server unreachable, timed out, or reply lost")]
pub struct Unavailable;

/// A job execution the driver must start.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Execution {
    /// The run.
    pub run: RunId,
    /// The attempt's fence (side effects use it to build idempotency keys).
    pub fence: Fence,
    /// The attempt number.
    pub attempt: u32,
    /// The job kind.
    pub kind: String,
    /// The job input.
    pub input: String,
    /// How long it may run (`None`: the driver's job timeout).
    #[serde(default)]
    pub limit: Option<TimeLimit>,
    /// The W3C `traceparent` the run was submitted under, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<String>,
}

/// What a role asks its driver to do.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Command {
    /// Run a SQL statement; answer with [`Input::Db`] or [`Input::Unavailable`].
    Db(DbOp),
    /// Run a stream command; answer with [`Input::Stream`] or [`Input::Unavailable`].
    Stream(StreamOp),
    /// Start the job; answer with [`Input::Executed`] when it ends.
    Execute(Execution),
    /// Stop the running job at its next boundary; no answer.
    Abort,
    /// Call `handle(now, Input::Timer)` at this time.
    SetTimer(Timestamp),
}

impl Command {
    /// Renames the worker (consumer) this command speaks for, as `rename`
    /// maps consumer names. Workers are interchangeable, so a model checker
    /// may relabel them to reduce symmetric states.
    pub fn rename_consumer(&mut self, rename: &dyn Fn(&str) -> String) {
        match self {
            Command::Db(DbOp::Claim { worker, .. })
            | Command::Stream(
                StreamOp::Read {
                    consumer: worker, ..
                }
                | StreamOp::AutoClaim {
                    consumer: worker, ..
                }
                | StreamOp::Touch {
                    consumer: worker, ..
                },
            ) => *worker = rename(worker),
            #[cfg(feature = "mutants")]
            Command::Db(DbOp::ClaimReviving { worker, .. }) => *worker = rename(worker),
            _ => {}
        }
    }

    /// Moves this command from worker `from` to worker `to`.
    pub fn relabel_worker(&mut self, from: WorkerId, to: WorkerId) {
        let (old, new) = (from.consumer(), to.consumer());
        self.rename_consumer(&|name| {
            if name == old {
                new.clone()
            } else {
                name.to_owned()
            }
        });
    }
}

/// What the driver feeds a role.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Input {
    /// A SQL statement's answer.
    Db(DbReply),
    /// A stream command's answer.
    Stream(Result<StreamReply, StreamError>),
    /// The outstanding command got no reply.
    Unavailable,
    /// The job ended.
    Executed(JobOutcome),
    /// A timer set with [`Command::SetTimer`] fired.
    Timer,
}

#[cfg(test)]
mod tests;
