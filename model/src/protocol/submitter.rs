//! The submitter: what `POST /runs` does. The run row is durable before the
//! API answers 202 (S1); the XADD is a delivery hint. If it fails, or its
//! reply is lost, the run is still accepted: the outbox publishes it.

use super::{Command, DbOp, DbReply, Input, JobEntry, Policy, StreamOp, StreamReply};
use crate::db::Delay;
use crate::ids::{Dispatch, Partition, RunId};
use crate::time::Timestamp;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

/// What the API answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SubmitterEnd {
    /// 202: the run row is durable. `published` says whether the XADD was
    /// confirmed (if not, the outbox publishes it; a delayed run is
    /// published when due, by the retry pass).
    Accepted {
        /// The XADD was confirmed and recorded.
        published: bool,
    },
    /// The client's idempotency key already belongs to this run, first
    /// submitted with the same request: nothing new was stored.
    Existing(RunId),
    /// The client's idempotency key belongs to this run, first submitted
    /// with another request (kind or input): nothing was stored.
    KeyConflict(RunId),
    /// No answer from Postgres: the run may or may not be stored. A retry
    /// with the same idempotency key (or the same run id) is safe.
    Unavailable,
    /// 422: Postgres refused the run's values (text holding a NUL byte);
    /// nothing was stored.
    Refused,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
enum Phase {
    Inserting,
    Publishing,
    Marking,
    Done(SubmitterEnd),
}

/// One `POST /runs`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Submitter {
    run: RunId,
    partition: Partition,
    phase: Phase,
    outbox: VecDeque<Command>,
    /// Inserted `delayed`: not published at submission.
    delayed: bool,
}

impl Submitter {
    /// Starts submitting `run`; under the client's idempotency key if
    /// `key` is given.
    #[must_use]
    pub fn new(
        policy: &Policy,
        run: RunId,
        kind: &str,
        input: &str,
        key: Option<&str>,
    ) -> Submitter {
        let attempts_max = if crate::injects!(policy, NoDeadLetter) {
            u32::MAX
        } else {
            policy.attempts_max_of(kind)
        };
        let budget_ms = policy.kind(kind).budget_ms.unwrap_or(0);
        let (kind, input) = (kind.to_owned(), input.to_owned());
        let op = match key {
            None => DbOp::InsertRun {
                run,
                kind,
                input,
                attempts_max,
                budget_ms,
                trace: String::new(),
                delay_ms: 0,
                at_ms: 0,
            },
            Some(key) => DbOp::InsertRunKeyed {
                run,
                kind,
                input,
                attempts_max,
                budget_ms,
                key: key.to_owned(),
                trace: String::new(),
                delay_ms: 0,
                at_ms: 0,
            },
        };
        Submitter {
            run,
            partition: policy.partition_of(run),
            phase: Phase::Inserting,
            outbox: VecDeque::from([Command::Db(op)]),
            delayed: false,
        }
    }

    /// The same submission under the caller's W3C `traceparent` (stored
    /// with the run; `""`: none).
    #[must_use]
    pub fn traced(mut self, traceparent: &str) -> Submitter {
        if let Some(Command::Db(
            DbOp::InsertRun { trace, .. } | DbOp::InsertRunKeyed { trace, .. },
        )) = self.outbox.front_mut()
        {
            traceparent.clone_into(trace);
        }
        self
    }

    /// The same submission, not to start before `delay` ([`Delay`]): its
    /// row is inserted `delayed` and nothing is published; the retry pass
    /// queues and publishes it when due. [`Delay::NONE`] changes nothing.
    #[must_use]
    pub fn delayed(mut self, delay: Delay) -> Submitter {
        if let Some(Command::Db(
            DbOp::InsertRun {
                delay_ms, at_ms, ..
            }
            | DbOp::InsertRunKeyed {
                delay_ms, at_ms, ..
            },
        )) = self.outbox.front_mut()
        {
            (*delay_ms, *at_ms) = (delay.delay_ms, delay.at_ms);
        }
        self.delayed = delay.waits();
        self
    }

    /// The run.
    #[must_use]
    pub fn run(&self) -> RunId {
        self.run
    }

    /// The answer, once there is one.
    #[must_use]
    pub fn end(&self) -> Option<SubmitterEnd> {
        match self.phase {
            Phase::Done(end) => Some(end),
            _ => None,
        }
    }

    /// Whether the row is known durable (the API may answer 202 from here on).
    #[must_use]
    pub fn is_accepted(&self) -> bool {
        matches!(
            self.phase,
            Phase::Publishing | Phase::Marking | Phase::Done(SubmitterEnd::Accepted { .. })
        )
    }

    /// The next command.
    #[must_use]
    pub fn poll(&mut self) -> Option<Command> {
        self.outbox.pop_front()
    }

    /// Feeds the answer to the outstanding command.
    pub fn handle(&mut self, now: Timestamp, input: Input) {
        let run = self.run;
        self.phase = match (self.phase, input) {
            (Phase::Inserting, Input::Db(DbReply::Keyed { run: other, same })) if other != run => {
                Phase::Done(if same {
                    SubmitterEnd::Existing(other)
                } else {
                    SubmitterEnd::KeyConflict(other)
                })
            }
            (Phase::Inserting, Input::Db(DbReply::Rows(_) | DbReply::Keyed { .. }))
                if self.delayed =>
            {
                Phase::Done(SubmitterEnd::Accepted { published: false })
            }
            (Phase::Inserting, Input::Db(DbReply::Rows(_) | DbReply::Keyed { .. })) => {
                let entry = JobEntry::Job {
                    run,
                    dispatch: Dispatch(1),
                };
                self.outbox.push_back(Command::Stream(StreamOp::Publish {
                    partition: self.partition,
                    entry,
                    now,
                }));
                Phase::Publishing
            }
            (Phase::Inserting, Input::Db(DbReply::Refused)) => Phase::Done(SubmitterEnd::Refused),
            (Phase::Inserting, _) => Phase::Done(SubmitterEnd::Unavailable),
            (Phase::Publishing, Input::Stream(Ok(StreamReply::Added(entry)))) => {
                let op = DbOp::MarkPublished {
                    run,
                    dispatch: Dispatch(1),
                    entry,
                };
                self.outbox.push_back(Command::Db(op));
                Phase::Marking
            }
            (Phase::Marking, Input::Db(DbReply::Rows(n))) => {
                Phase::Done(SubmitterEnd::Accepted { published: n == 1 })
            }
            (Phase::Publishing | Phase::Marking, _) => {
                Phase::Done(SubmitterEnd::Accepted { published: false })
            }
            (done @ Phase::Done(_), _) => done,
        };
    }
}
