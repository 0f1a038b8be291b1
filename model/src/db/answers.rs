//! Statements' answers, typed. Each [`Shape`] names the Rust type of its
//! answer, and each statement is a type of its own (the structs of
//! [`query`](super::query), generated with [`DbOp`] from the statement
//! table) whose [`Query::answer`] turns the [`DbReply`] it got into that
//! type. Callers outside the protocol's core send a `query::...` value and
//! get its typed answer; none of them matches a [`DbReply`] by hand.

use super::{AttemptRow, DeadLetter, StepRow};
use super::{Candidate, ClaimedJob, DbOp, DbReply, RunRow, Statement};
use crate::events::RunEvent;
use crate::ids::{AttemptNo, RunId, WorkerId};
use crate::protocol::Unavailable;
use crate::status::RunStatus;
use crate::time::Timestamp;
use std::marker::PhantomData;

/// A shape's answer as a Rust type: what [`DbReply`] of that shape holds.
pub trait Answer {
    /// The shape.
    const SHAPE: Shape;
    /// The answer's type.
    type Typed;
    /// The answer `reply` holds, if it has this shape.
    fn typed(reply: DbReply) -> Option<Self::Typed>;
}

/// An idempotency key's run, and whether the request it was first made
/// with (kind and input) is this one ([`Shape::Keyed`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Keyed {
    /// The key's run: the one this command inserted, or an earlier one.
    pub run: RunId,
    /// Whether the earlier request was the same.
    pub same: bool,
}

macro_rules! shapes {
    ($(
        $(#[doc = $doc:literal])*
        $shape:ident => $ty:ty { $pat:pat => $val:expr }
    )*) => {
        /// The shape of a statement's answer: the binding has one decoder
        /// per shape, and a batched form answers each command by its run.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Shape {
            $($(#[doc = $doc])* $shape,)*
        }

        impl Shape {
            /// Whether `reply` has this shape.
            #[must_use]
            pub fn fits(self, reply: &DbReply) -> bool {
                match self {
                    $(Shape::$shape => <shape::$shape as Answer>::typed(reply.clone()).is_some(),)*
                }
            }
        }

        /// One type per [`Shape`], the [`Answer`] of that shape.
        pub mod shape {
            use super::*;
            $(
                $(#[doc = $doc])*
                #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
                pub enum $shape {}

                impl Answer for $shape {
                    const SHAPE: Shape = Shape::$shape;
                    type Typed = $ty;
                    fn typed(reply: DbReply) -> Option<$ty> {
                        #[allow(unreachable_patterns)]
                        match reply {
                            $pat => Some($val),
                            _ => None,
                        }
                    }
                }
            )*
        }
    };
}

shapes! {
    /// Rows affected ([`DbReply::Rows`]).
    Rows => u64 { DbReply::Rows(n) => n }
    /// One row with a boolean `applied` ([`DbReply::Rows`], 1 or 0).
    Applied => bool { DbReply::Rows(n) => n == 1 }
    /// At most one claim row ([`DbReply::Claimed`]).
    Claimed => Option<ClaimedJob> { DbReply::Claimed(c) => c }
    /// At most one `runs` row ([`DbReply::Run`]).
    Run => Option<RunRow> { DbReply::Run(r) => r }
    /// Sweeper candidates ([`DbReply::Candidates`]).
    Candidates => Vec<Candidate> { DbReply::Candidates(c) => c }
    /// One new id ([`DbReply::NewRun`]).
    NewRun => RunId { DbReply::NewRun(r) => r }
    /// New ids, in order ([`DbReply::NewRuns`]).
    NewRuns => Vec<RunId> { DbReply::NewRuns(r) => r }
    /// One new worker number ([`DbReply::NewWorker`]).
    NewWorker => WorkerId { DbReply::NewWorker(w) => w }
    /// Attempt rows ([`DbReply::Attempts`]).
    Attempts => Vec<(AttemptNo, AttemptRow)> { DbReply::Attempts(a) => a }
    /// Dead-letter rows ([`DbReply::DeadLetters`]).
    DeadLetters => Vec<(RunId, DeadLetter)> { DbReply::DeadLetters(d) => d }
    /// Counts by status ([`DbReply::Counts`]).
    Counts => Vec<(RunStatus, u64)> { DbReply::Counts(c) => c }
    /// An idempotency key's run, and whether its request is this one
    /// ([`DbReply::Keyed`]).
    Keyed => super::Keyed { DbReply::Keyed { run, same } => super::Keyed { run, same } }
    /// Recorded steps ([`DbReply::Steps`]).
    Steps => Vec<(u32, StepRow)> { DbReply::Steps(s) => s }
    /// A run's events ([`DbReply::Events`]).
    Events => Vec<RunEvent> { DbReply::Events(e) => e }
    /// `runs` rows ([`DbReply::Runs`]).
    Runs => Vec<RunRow> { DbReply::Runs(r) => r }
    /// Counts by minute and status ([`DbReply::PerMinute`]).
    PerMinute => Vec<(Timestamp, RunStatus, u64)> { DbReply::PerMinute(p) => p }
    /// Succeeded runs and their latency by minute ([`DbReply::Latency`]).
    Latency => Vec<crate::db::MinuteLatency> { DbReply::Latency(l) => l }
    /// Schedules, each with Postgres's clock ([`DbReply::Schedules`]).
    Schedules => Vec<(Timestamp, crate::schedule::ScheduleRow)> { DbReply::Schedules(s) => s }
    /// One row's `value` ([`DbReply::Rows`]).
    Value => u64 { DbReply::Rows(n) => n }
}

impl DbReply {
    /// The rows a statement of the shape [`Shape::Rows`] affected (or
    /// [`Shape::Applied`]'s 1 or 0, or [`Shape::Value`]'s value): for
    /// observers of the protocol's commands, which see every statement.
    #[must_use]
    pub fn rows(&self) -> Option<u64> {
        match self {
            DbReply::Rows(n) => Some(*n),
            _ => None,
        }
    }
}

/// Why a statement's reply is not its typed answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
pub enum Unfit {
    /// Postgres refused the command's values and applied nothing
    /// ([`DbReply::Refused`]).
    #[error("Postgres refused the values of `{}`", .0.name())]
    Refused(Statement),
    /// The reply has another shape than the statement's: a binding bug.
    #[error("`{}` answered with another shape than its own", .0.name())]
    Mismatch(Statement),
}

/// Why a typed statement has no answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
pub enum QueryError {
    /// No reply: the statement may or may not have taken effect.
    #[error(transparent)]
    Unavailable(#[from] Unavailable),
    /// The reply is not the statement's answer: Postgres refused the
    /// values and applied nothing, or (a binding bug) another shape.
    #[error(transparent)]
    Unfit(#[from] Unfit),
}

/// One statement as a type: its parameters are the struct's fields, and
/// its answer is [`AnswerOf`] it. The statement table generates one per
/// statement, in [`query`](super::query); [`Shaped`] is any command of a
/// known shape.
pub trait Query: Into<DbOp> {
    /// The shape of its answer.
    type Shape: Answer;

    /// The typed answer `reply` holds, `reply` being the answer to a
    /// command of `statement`.
    ///
    /// # Errors
    /// Postgres refused the values, or the reply has another shape.
    fn answer(statement: Statement, reply: DbReply) -> Result<AnswerOf<Self>, Unfit> {
        if reply == DbReply::Refused {
            return Err(Unfit::Refused(statement));
        }
        <Self::Shape as Answer>::typed(reply).ok_or(Unfit::Mismatch(statement))
    }
}

/// The typed answer of the statement `Q`.
pub type AnswerOf<Q> = <<Q as Query>::Shape as Answer>::Typed;

/// A command whose answer has the shape `A`, whichever statement it is: a
/// protocol helper's pick among a statement and the mutant twins that
/// stand in for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shaped<A> {
    op: DbOp,
    shape: PhantomData<fn() -> A>,
}

impl<A: Answer> Shaped<A> {
    /// `op`, as a command answering `A`.
    ///
    /// # Panics
    /// If `op`'s statement answers another shape.
    #[must_use]
    pub fn new(op: DbOp) -> Shaped<A> {
        assert_eq!(
            op.statement().shape(),
            A::SHAPE,
            "{} has another shape",
            op.name()
        );
        Shaped {
            op,
            shape: PhantomData,
        }
    }
}

impl<A> From<Shaped<A>> for DbOp {
    fn from(s: Shaped<A>) -> DbOp {
        s.op
    }
}

impl<A: Answer> Query for Shaped<A> {
    type Shape = A;
}
