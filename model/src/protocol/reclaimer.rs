//! The reclaimer: takes over deliveries idle past `reclaim_min_idle_ms`
//! (their worker died or stalled) with XAUTOCLAIM, and recovers from Postgres
//! every run whose pending entry was trimmed or deleted (S8).
//!
//! Deleted IDs are obligations: XAUTOCLAIM removes them from the PEL and
//! reports them once, so the reclaimer holds each until its `RequeueEntry`
//! got an answer, and retries the rest before its next XAUTOCLAIM.

use super::{Command, DbOp, DbReply, Input, JobEntry, Policy, StreamOp, StreamReply};
use crate::ids::{EntryId, WorkerId};
use crate::stream::StreamError;
use crate::time::Timestamp;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

/// What the reclaimer hands to its worker.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ReclaimerEvent {
    /// A delivery taken over: handle it as a new [`super::Delivery`].
    Deliver(EntryId, JobEntry),
    /// A pending ID whose entry was gone (reported for metrics and logs).
    Trimmed(EntryId),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
enum Phase {
    Idle,
    Claiming,
    Recovering(EntryId),
    EnsuringGroup,
}

/// The reclaim loop of one worker. Its cursor is in one partition at a
/// time: a scan that wraps around moves it to the next partition's start.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Reclaimer {
    policy: Policy,
    worker: WorkerId,
    cursor: EntryId,
    phase: Phase,
    deleted: VecDeque<EntryId>,
    outbox: VecDeque<Command>,
    events: VecDeque<ReclaimerEvent>,
}

impl Reclaimer {
    /// A reclaimer for `worker`, idle, cursor at partition 0's `0-0`.
    #[must_use]
    pub fn new(policy: &Policy, worker: WorkerId) -> Reclaimer {
        Reclaimer {
            policy: policy.clone(),
            worker,
            cursor: EntryId::ZERO,
            phase: Phase::Idle,
            deleted: VecDeque::new(),
            outbox: VecDeque::new(),
            events: VecDeque::new(),
        }
    }

    /// Relabels the worker this reclaimer runs in (see
    /// [`Command::rename_consumer`]).
    pub fn relabel(&mut self, worker: WorkerId) {
        for c in &mut self.outbox {
            c.relabel_worker(self.worker, worker);
        }
        self.worker = worker;
    }

    /// Whether no round is in progress.
    #[must_use]
    pub fn is_idle(&self) -> bool {
        self.phase == Phase::Idle && self.outbox.is_empty()
    }

    /// Where the next XAUTOCLAIM starts (its partition, and the ID in it).
    #[must_use]
    pub fn cursor(&self) -> EntryId {
        self.cursor
    }

    /// Where the cursor goes when its partition's scan wraps around: the
    /// start of the next partition (of the same one, with one partition).
    #[must_use]
    pub fn wrap_target(&self) -> EntryId {
        let next = if crate::injects!(self.policy, ReclaimOnePartition) {
            0
        } else {
            (self.cursor.partition + 1) % self.policy.partitions.max(1)
        };
        EntryId::ZERO.in_partition(next)
    }

    /// Deleted IDs not yet recovered (held until `RequeueEntry` answers).
    pub fn unrecovered(&self) -> impl Iterator<Item = EntryId> + '_ {
        self.deleted.iter().copied()
    }

    /// Starts a round with room for `free` deliveries: first the recoveries
    /// still owed, then one XAUTOCLAIM. Does nothing if a round is running.
    pub fn start(&mut self, now: Timestamp, free: usize) {
        if self.phase != Phase::Idle {
            return;
        }
        if self.next_recovery() {
            return;
        }
        if free == 0 {
            return;
        }
        self.phase = Phase::Claiming;
        self.outbox.push_back(Command::Stream(StreamOp::AutoClaim {
            consumer: self.worker.consumer(),
            min_idle_ms: self.policy.reclaim_min_idle_ms,
            start: self.cursor,
            count: free.min(self.policy.reclaim_batch_max).max(1),
            now,
        }));
    }

    fn next_recovery(&mut self) -> bool {
        let Some(&entry) = self.deleted.front() else {
            return false;
        };
        self.phase = Phase::Recovering(entry);
        self.outbox
            .push_back(Command::Db(DbOp::RequeueEntry { entry }));
        true
    }

    /// The next command.
    #[must_use]
    pub fn poll(&mut self) -> Option<Command> {
        self.outbox.pop_front()
    }

    /// The next event for the worker.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<ReclaimerEvent> {
        self.events.pop_front()
    }

    /// Feeds the answer to the outstanding command.
    pub fn handle(&mut self, _now: Timestamp, input: Input) {
        match (self.phase, input) {
            (Phase::Claiming, Input::Stream(Ok(StreamReply::AutoClaimed(reply)))) => {
                self.cursor = if reply.next.local() == EntryId::ZERO {
                    self.wrap_target()
                } else {
                    reply.next
                };
                for id in reply.deleted {
                    self.events.push_back(ReclaimerEvent::Trimmed(id));
                    if !crate::injects!(self.policy, IgnoreTrimmed) {
                        self.deleted.push_back(id);
                    }
                }
                for (id, payload) in reply.claimed {
                    let job = payload.expect("XAUTOCLAIM without JUSTID returns entries");
                    self.events.push_back(ReclaimerEvent::Deliver(id, job));
                }
                self.phase = Phase::Idle;
                self.next_recovery();
            }
            (Phase::Claiming, Input::Stream(Err(StreamError::NoGroup))) => {
                // Redis lost the group (restart without persistence, or a
                // wipe): recreate it; the sweeper republishes from Postgres.
                let partition = self.cursor.partition;
                self.cursor = EntryId::ZERO.in_partition(partition);
                self.phase = Phase::EnsuringGroup;
                self.outbox
                    .push_back(Command::Stream(StreamOp::EnsureGroup { partition }));
            }
            (Phase::Recovering(entry), Input::Db(DbReply::Rows(_))) => {
                let done = self.deleted.pop_front();
                debug_assert_eq!(done, Some(entry));
                self.phase = Phase::Idle;
                self.next_recovery();
            }
            (_, _) => self.phase = Phase::Idle,
        }
    }
}
