//! Maintenance: the durable side of retries and recovery, driven by Postgres.
//!
//! * **Retries**: due `retry_wait` runs become `queued` again (S6), and the
//!   same pass publishes them, taken as the outbox takes its runs. Back-off
//!   lives in `retry_at`, never in the PEL.
//! * **Outbox**: queued runs whose current dispatch was never confirmed
//!   published (the API's XADD failed or its reply was lost, a run was
//!   requeued) are published, then marked (S1).
//! * **Sweep**: runs that should have been picked up long ago — queued and
//!   published, or running with a long-expired lease — are checked against
//!   Redis; if their entry is neither in the stream nor pending (Redis lost
//!   it, or it was trimmed before delivery), they are re-dispatched (S1, S8).
//!   A cursor walks the candidates a batch per pass, so none starves behind
//!   others that stay candidates (a backlog older than the grace).
//! * **Retention**: runs finished longer than [`Policy::keep_finished_ms`]
//!   ago are deleted with everything kept about them but their idempotency
//!   keys, which keep their own window.
//! * **Schedules**: the due ticks of cron schedules are handled, each by
//!   one compare-and-set statement that also makes its run (S16,
//!   [`crate::schedule`]).
//! * **Consumers**: each partition's consumers idle longer than
//!   [`Policy::reclaim_min_idle_ms`] that hold nothing are deleted from the
//!   group (a stopped worker's, whose deliveries the reclaimer took), in one
//!   atomic command a partition (S4: a consumer's pending entries would go
//!   with it).
//!
//! A pass handles one batch of at most [`Policy::sweep_batch_max`] rows,
//! each step of it for the whole batch at once; its [`PassReport`] says
//! whether the batch was full, and the driver runs the next pass at once
//! while it is (a backlog is worked off at the pace of the servers, not of
//! the maintenance period). Passes of every task may overlap, in any
//! order, on any worker: each step is a conditional statement.

use super::{Command, DbOp, DbReply, Input, JobEntry, Policy, StreamOp, StreamReply};
use crate::db::Candidate;
use crate::ids::{EntryId, RunId};
use crate::time::Timestamp;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

/// Whether candidate `c` can still be reached through its entry, given what
/// `Locate` found at its ID: the ID must hold this very run and dispatch (after
/// Redis lost its data an ID can come back holding another entry), and that
/// entry must be pending (the reclaimer's) or not yet delivered (a reader's).
#[must_use]
pub fn still_deliverable(c: &Candidate, located: &StreamReply) -> bool {
    let ours = JobEntry::Job {
        run: c.run_id,
        dispatch: c.dispatch,
    };
    match located {
        StreamReply::Located {
            entry: Some(e),
            pending,
            delivered,
        } => *e == ours && (*pending || !*delivered),
        _ => false,
    }
}

/// One maintenance pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum MaintenanceTask {
    /// Promote due retries.
    Retries,
    /// Publish the outbox.
    Outbox,
    /// Re-dispatch runs whose entry is gone.
    Sweep,
    /// Delete runs finished long ago.
    Retention,
    /// Delete consumers that are idle and hold nothing.
    Consumers,
    /// Handle the due ticks of cron schedules ([`crate::schedule`]).
    Schedules,
}

impl MaintenanceTask {
    /// Every task, in the order a worker's maintenance round runs them.
    pub const ALL: [MaintenanceTask; 6] = [
        MaintenanceTask::Schedules,
        MaintenanceTask::Retries,
        MaintenanceTask::Outbox,
        MaintenanceTask::Sweep,
        MaintenanceTask::Retention,
        MaintenanceTask::Consumers,
    ];

    /// Its name in logs and metrics labels.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            MaintenanceTask::Retries => "retries",
            MaintenanceTask::Outbox => "outbox",
            MaintenanceTask::Sweep => "sweep",
            MaintenanceTask::Retention => "retention",
            MaintenanceTask::Consumers => "consumers",
            MaintenanceTask::Schedules => "schedules",
        }
    }
}

/// What one pass did: the driver's pace, and whether to go on at once.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PassReport {
    /// Rows it moved on: retries promoted, runs published, runs
    /// re-dispatched, runs deleted, consumers deleted.
    pub rows: u64,
    /// Whether its query came back full ([`Policy::sweep_batch_max`] rows):
    /// there may be more to do, and the next pass should follow at once.
    /// (A sweep's full batch whose entries were all still in place is not:
    /// the backlog is the readers' to take.)
    pub full: bool,
    /// A schedules pass: how soon the earliest next tick it planned falls
    /// due, in ms from its read by Postgres's clock (`None`: it planned
    /// none). The driver wakes for it, so that a steady schedule's ticks
    /// are handled as they fall, not at the next period.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_tick_in_ms: Option<u64>,
}

/// A pass's phase. A listing's candidates are handled a group at a time:
/// every command of a group is sent before any answer is read (the driver
/// sends them as one pipeline or one statement), and the answers come back
/// in the order of the commands.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
enum Phase {
    Idle,
    Promoting,
    ListingOutbox,
    /// The XADDs of these candidates are out; `added` holds the answers so
    /// far, in order.
    Publishing {
        group: Vec<Candidate>,
        added: Vec<Option<EntryId>>,
    },
    /// This many marks are out.
    Marking(usize),
    ListingOrphans,
    /// The `Locate`s of these candidates are out (`answered` of them
    /// answered); `gone` collects the ones to re-dispatch.
    Locating {
        group: Vec<Candidate>,
        answered: usize,
        gone: Vec<Candidate>,
    },
    /// This many re-dispatches are out.
    Requeuing(usize),
    Deleting,
    /// The due schedules are being read.
    Scheduling,
    /// This many `FireTick`s are out.
    Firing(usize),
    /// This many partitions' `ForgetConsumers` are out.
    Forgetting(usize),
}

/// The maintenance loop (each worker runs one; they are safe to overlap).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Maintenance {
    policy: Policy,
    phase: Phase,
    outbox: VecDeque<Command>,
    /// The sweeper's cursor: the next pass lists candidates after this
    /// (`published_at` in ms, run id) ((0, 0): from the start).
    swept: (u64, RunId),
    /// What the current (or last) pass did.
    report: PassReport,
}

impl Maintenance {
    /// An idle maintenance loop.
    #[must_use]
    pub fn new(policy: &Policy) -> Maintenance {
        Maintenance {
            policy: policy.clone(),
            phase: Phase::Idle,
            outbox: VecDeque::new(),
            swept: (0, RunId(0)),
            report: PassReport::default(),
        }
    }

    /// Whether no pass is running.
    #[must_use]
    pub fn is_idle(&self) -> bool {
        self.phase == Phase::Idle && self.outbox.is_empty()
    }

    /// What the last pass did (once idle).
    #[must_use]
    pub fn report(&self) -> PassReport {
        self.report
    }

    /// Starts a pass at `now` (the sender's clock); ignored while one is
    /// running.
    pub fn start(&mut self, task: MaintenanceTask, now: Timestamp) {
        if self.phase != Phase::Idle {
            return;
        }
        self.report = PassReport::default();
        let limit = self.policy.sweep_batch_max;
        let (phase, op) = match task {
            MaintenanceTask::Retries => {
                let op = DbOp::PromoteRetries { limit };
                #[cfg(feature = "mutants")]
                let op = if crate::injects!(self.policy, PromoteEarly) {
                    DbOp::PromoteEarly { limit }
                } else {
                    op
                };
                (Phase::Promoting, op)
            }
            MaintenanceTask::Outbox if crate::injects!(self.policy, NoPublishRecovery) => return,
            MaintenanceTask::Outbox => (Phase::ListingOutbox, DbOp::ClaimOutbox { limit }),
            MaintenanceTask::Sweep if crate::injects!(self.policy, NoSweep) => return,
            MaintenanceTask::Sweep => {
                let grace_ms = self.policy.sweep_grace_ms;
                let (after_published_ms, after) = self.swept;
                (
                    Phase::ListingOrphans,
                    DbOp::OrphanCandidates {
                        grace_ms,
                        after_published_ms,
                        after,
                        limit,
                    },
                )
            }
            MaintenanceTask::Retention if self.policy.keep_finished_ms == 0 => return,
            MaintenanceTask::Retention => {
                let keep_ms = self.policy.keep_finished_ms;
                let op = DbOp::DeleteFinished { keep_ms, limit };
                #[cfg(feature = "mutants")]
                let op = if crate::injects!(self.policy, RetainLive) {
                    DbOp::DeletePublished { keep_ms, limit }
                } else if crate::injects!(self.policy, ForgetKeys) {
                    DbOp::DeleteFinishedKeys { keep_ms, limit }
                } else {
                    op
                };
                (Phase::Deleting, op)
            }
            MaintenanceTask::Consumers => return self.forget_consumers(now),
            MaintenanceTask::Schedules => (Phase::Scheduling, DbOp::DueSchedules { limit }),
        };
        self.phase = phase;
        self.outbox.push_back(Command::Db(op));
    }

    /// Deletes every partition's idle consumers that hold nothing: one
    /// command a partition, all sent at once.
    fn forget_consumers(&mut self, now: Timestamp) {
        let idle_ms = self.policy.reclaim_min_idle_ms;
        let forgets: Vec<Command> = self
            .policy
            .all_partitions()
            .map(|partition| {
                #[cfg(feature = "mutants")]
                if crate::injects!(self.policy, ForgetHolders) {
                    return Command::Stream(StreamOp::DropConsumers {
                        partition,
                        idle_ms,
                        now,
                    });
                }
                Command::Stream(StreamOp::ForgetConsumers {
                    partition,
                    idle_ms,
                    now,
                })
            })
            .collect();
        self.send_all(Phase::Forgetting(forgets.len()), forgets);
    }

    /// The next command.
    #[must_use]
    pub fn poll(&mut self) -> Option<Command> {
        self.outbox.pop_front()
    }

    /// Sends `commands` as one group in `phase`, or goes idle if there
    /// are none.
    fn send_all(&mut self, phase: Phase, commands: impl IntoIterator<Item = Command>) {
        let before = self.outbox.len();
        self.outbox.extend(commands);
        self.phase = if self.outbox.len() > before {
            phase
        } else {
            Phase::Idle
        };
    }

    /// Publishes the outbox's candidates `cs`, all at once.
    fn publish(&mut self, now: Timestamp, cs: Vec<Candidate>) {
        let publishes: Vec<Command> = cs
            .iter()
            .map(|c| {
                Command::Stream(StreamOp::Publish {
                    partition: self.policy.partition_of(c.run_id),
                    entry: JobEntry::Job {
                        run: c.run_id,
                        dispatch: c.dispatch,
                    },
                    now,
                })
            })
            .collect();
        let phase = Phase::Publishing {
            added: Vec::with_capacity(cs.len()),
            group: cs,
        };
        self.send_all(phase, publishes);
    }

    /// Looks up the entries of the sweeper's candidates `cs`, all at once;
    /// a candidate with no entry recorded is gone already.
    fn locate(&mut self, cs: Vec<Candidate>) {
        let (group, gone): (Vec<Candidate>, Vec<Candidate>) =
            cs.into_iter().partition(|c| c.entry_id.is_some());
        let locates: Vec<Command> = group
            .iter()
            .filter_map(|c| c.entry_id)
            .map(|id| Command::Stream(StreamOp::Locate { id }))
            .collect();
        if locates.is_empty() {
            self.requeue(gone);
        } else {
            let phase = Phase::Locating {
                group,
                answered: 0,
                gone,
            };
            self.send_all(phase, locates);
        }
    }

    /// Re-dispatches the candidates `gone`, all at once.
    fn requeue(&mut self, gone: Vec<Candidate>) {
        let n = gone.len();
        let requeues = gone.into_iter().map(|c| {
            Command::Db(DbOp::RequeueRun {
                run: c.run_id,
                dispatch: c.dispatch,
            })
        });
        self.send_all(Phase::Requeuing(n), requeues);
    }

    /// Feeds the answer to the oldest outstanding command.
    pub fn handle(&mut self, now: Timestamp, input: Input) {
        let limit = self.policy.sweep_batch_max;
        let phase = std::mem::replace(&mut self.phase, Phase::Idle);
        match (phase, input) {
            (Phase::Deleting, Input::Db(DbReply::Rows(n))) => {
                self.report = PassReport {
                    rows: n,
                    full: n >= limit as u64,
                    next_tick_in_ms: None,
                };
            }
            (Phase::Promoting | Phase::ListingOutbox, Input::Db(DbReply::Candidates(cs))) => {
                self.report.full = cs.len() >= limit;
                self.publish(now, cs);
            }
            (Phase::Publishing { group, added }, input) => self.published(group, added, &input),
            (Phase::Scheduling, Input::Db(DbReply::Schedules(due))) => {
                // Each due schedule's tick, planned by Postgres's clock as
                // the read answered it; all sent at once.
                let fires: Vec<(Timestamp, DbOp)> = due
                    .iter()
                    .map(|(db_now, s)| (*db_now, crate::schedule::plan(s, *db_now, &self.policy)))
                    .collect();
                self.report = PassReport {
                    rows: due.len() as u64,
                    full: due.len() >= limit,
                    next_tick_in_ms: fires
                        .iter()
                        .filter_map(|(db_now, op)| op.next_tick().map(|t| t.ms_since(*db_now)))
                        .min(),
                };
                let fires: Vec<Command> =
                    fires.into_iter().map(|(_, op)| Command::Db(op)).collect();
                self.send_all(Phase::Firing(fires.len()), fires);
            }
            (Phase::ListingOrphans, Input::Db(DbReply::Candidates(cs))) => {
                // A full batch: the next pass goes on after it; else from
                // the start.
                self.report.full = cs.len() >= limit;
                self.swept = match cs.last() {
                    Some(c) if self.report.full => {
                        (c.published_at.map_or(0, Timestamp::as_ms), c.run_id)
                    }
                    _ => (0, RunId(0)),
                };
                self.locate(cs);
            }
            (
                Phase::Locating {
                    group,
                    answered,
                    gone,
                },
                input,
            ) => self.located(group, answered, gone, &input),
            (Phase::Forgetting(left), input) => {
                if let Input::Stream(Ok(StreamReply::Forgot(n))) = input {
                    self.report.rows += n;
                }
                if left > 1 {
                    self.phase = Phase::Forgetting(left - 1);
                }
            }
            (Phase::Marking(left), _) if left > 1 => self.phase = Phase::Marking(left - 1),
            (Phase::Requeuing(left), _) if left > 1 => self.phase = Phase::Requeuing(left - 1),
            (Phase::Firing(left), _) if left > 1 => self.phase = Phase::Firing(left - 1),
            // The last answer of a pass, or a failed listing: the pass ends.
            (_, _) => {}
        }
    }

    /// One publication of `group` answered (`added` holds the earlier
    /// answers); once all are, the published ones are marked.
    fn published(&mut self, group: Vec<Candidate>, mut added: Vec<Option<EntryId>>, input: &Input) {
        added.push(match input {
            Input::Stream(Ok(StreamReply::Added(entry))) => Some(*entry),
            // Lost or refused: taken, but not marked; the sweeper finds it
            // after its grace.
            _ => None,
        });
        if added.len() < group.len() {
            self.phase = Phase::Publishing { group, added };
            return;
        }
        let marks: Vec<Command> = group
            .iter()
            .zip(added)
            .filter_map(|(c, entry)| {
                Some(Command::Db(DbOp::MarkPublished {
                    run: c.run_id,
                    dispatch: c.dispatch,
                    entry: entry?,
                }))
            })
            .collect();
        self.report.rows = marks.len() as u64;
        self.send_all(Phase::Marking(marks.len()), marks);
    }

    /// The `Locate` of `group[answered]` answered (`gone` holds the
    /// candidates found gone so far); once all are, those are re-dispatched.
    fn located(
        &mut self,
        group: Vec<Candidate>,
        answered: usize,
        mut gone: Vec<Candidate>,
        input: &Input,
    ) {
        let c = &group[answered];
        match input {
            // Still to be read, or the reclaimer's to take over.
            Input::Stream(Ok(reply)) if still_deliverable(c, reply) => {}
            Input::Stream(Ok(_)) => gone.push(*c),
            // Not known: left for a later pass.
            _ => {}
        }
        if answered + 1 < group.len() {
            let answered = answered + 1;
            self.phase = Phase::Locating {
                group,
                answered,
                gone,
            };
        } else {
            // A full batch whose entries are all in place is a backlog for
            // the readers, not more to do at once: the next sweep goes on
            // from the cursor in its own time.
            self.report.rows = gone.len() as u64;
            self.report.full &= !gone.is_empty();
            self.requeue(gone);
        }
    }
}
