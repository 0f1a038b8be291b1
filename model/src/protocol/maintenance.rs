//! Maintenance: the durable side of retries and recovery, driven by Postgres.
//!
//! * **Retries**: due `retry_wait` runs become `queued` again (S6). Back-off
//!   lives in `retry_at`, never in the PEL.
//! * **Outbox**: queued runs whose current dispatch was never confirmed
//!   published (the API's XADD failed or its reply was lost, a retry was
//!   promoted, a run was requeued) are published, then marked (S1).
//! * **Sweep**: runs that should have been picked up long ago — queued and
//!   published, or running with a long-expired lease — are checked against
//!   Redis; if their entry is neither in the stream nor pending (Redis lost
//!   it, or it was trimmed before delivery), they are re-dispatched (S1, S8).
//!   A cursor walks the candidates a batch per pass, so none starves behind
//!   others that stay candidates (a backlog older than the grace).
//! * **Retention**: runs finished longer than [`Policy::keep_finished_ms`]
//!   ago are deleted with everything kept about them.

use super::{Command, DbOp, DbReply, Input, JobEntry, Policy, StreamOp, StreamReply};
use crate::db::Candidate;
use crate::ids::RunId;
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
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
enum Phase {
    Idle,
    Promoting,
    ListingOutbox,
    Publishing(Candidate),
    Marking(Candidate),
    ListingOrphans,
    Locating(Candidate),
    Requeuing(Candidate),
    Deleting,
}

/// The maintenance loop (each worker runs one; they are safe to overlap).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Maintenance {
    policy: Policy,
    phase: Phase,
    todo: VecDeque<Candidate>,
    outbox: VecDeque<Command>,
    /// The sweeper's cursor: the next pass lists candidates after this
    /// (`published_at` in ms, run id) ((0, 0): from the start).
    swept: (u64, RunId),
}

impl Maintenance {
    /// An idle maintenance loop.
    #[must_use]
    pub fn new(policy: &Policy) -> Maintenance {
        Maintenance {
            policy: policy.clone(),
            phase: Phase::Idle,
            todo: VecDeque::new(),
            outbox: VecDeque::new(),
            swept: (0, RunId(0)),
        }
    }

    /// Whether no pass is running.
    #[must_use]
    pub fn is_idle(&self) -> bool {
        self.phase == Phase::Idle && self.outbox.is_empty()
    }

    /// Starts a pass; ignored while one is running.
    pub fn start(&mut self, task: MaintenanceTask) {
        if self.phase != Phase::Idle {
            return;
        }
        let limit = self.policy.sweep_batch_max;
        let (phase, op) = match task {
            MaintenanceTask::Retries => (Phase::Promoting, DbOp::PromoteRetries { limit }),
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
                } else {
                    op
                };
                (Phase::Deleting, op)
            }
        };
        self.phase = phase;
        self.outbox.push_back(Command::Db(op));
    }

    /// The next command.
    #[must_use]
    pub fn poll(&mut self) -> Option<Command> {
        self.outbox.pop_front()
    }

    fn send(&mut self, phase: Phase, c: Command) {
        self.phase = phase;
        self.outbox.push_back(c);
    }

    /// Moves to the next candidate of the current listing, or goes idle.
    fn next(&mut self, now: Timestamp, publishing: bool) {
        let Some(c) = self.todo.pop_front() else {
            self.phase = Phase::Idle;
            return;
        };
        if publishing {
            let entry = JobEntry::Job {
                run: c.run_id,
                dispatch: c.dispatch,
            };
            self.send(
                Phase::Publishing(c),
                Command::Stream(StreamOp::Publish {
                    partition: self.policy.partition_of(c.run_id),
                    entry,
                    now,
                }),
            );
        } else if let Some(id) = c.entry_id {
            self.send(Phase::Locating(c), Command::Stream(StreamOp::Locate { id }));
        } else {
            self.requeue(c);
        }
    }

    fn requeue(&mut self, c: Candidate) {
        let op = DbOp::RequeueRun {
            run: c.run_id,
            dispatch: c.dispatch,
        };
        self.send(Phase::Requeuing(c), Command::Db(op));
    }

    /// Feeds the answer to the outstanding command.
    pub fn handle(&mut self, now: Timestamp, input: Input) {
        let phase = std::mem::replace(&mut self.phase, Phase::Idle);
        match (phase, input) {
            (_, Input::Unavailable) => self.todo.clear(),
            (Phase::ListingOutbox, Input::Db(DbReply::Candidates(cs))) => {
                self.todo = cs.into();
                self.next(now, true);
            }
            (Phase::Publishing(c), Input::Stream(Ok(StreamReply::Added(entry)))) => {
                let op = DbOp::MarkPublished {
                    run: c.run_id,
                    dispatch: c.dispatch,
                    entry,
                };
                self.send(Phase::Marking(c), Command::Db(op));
            }
            (Phase::Marking(_), Input::Db(DbReply::Rows(_))) => {
                self.next(now, true);
            }
            (Phase::ListingOrphans, Input::Db(DbReply::Candidates(cs))) => {
                // A full batch: the next pass goes on after it; else from
                // the start.
                self.swept = match cs.last() {
                    Some(c) if cs.len() >= self.policy.sweep_batch_max => {
                        (c.published_at.map_or(0, Timestamp::as_ms), c.run_id)
                    }
                    _ => (0, RunId(0)),
                };
                self.todo = cs.into();
                self.next(now, false);
            }
            (Phase::Locating(c), Input::Stream(Ok(reply))) => {
                if still_deliverable(&c, &reply) {
                    // Still to be read, or the reclaimer's to take over.
                    self.next(now, false);
                } else {
                    self.requeue(c);
                }
            }
            (Phase::Requeuing(_), Input::Db(DbReply::Rows(_))) => {
                self.next(now, false);
            }
            (Phase::Promoting | Phase::Deleting, _) => {}
            (_, _) => self.todo.clear(),
        }
    }
}
