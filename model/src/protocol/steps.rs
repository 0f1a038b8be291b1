//! Durable steps: the execution ledger of a run (S11).
//!
//! A job asks for its steps by name, in the same order on every attempt.
//! When an attempt first asks for one, the driver reads what earlier
//! attempts recorded ([`Ledger::read`]) and builds the attempt's
//! [`Ledger`]. Then, step by step:
//!
//! * a step recorded before is replayed: its output, without running it;
//! * a step not recorded runs, and its output is recorded under the
//!   attempt's fence ([`Ledger::record`]) before the job goes on. Only the
//!   attempt holding the run can record; a record is never replaced.
//! * a step whose index holds another name in the ledger fails the run
//!   terminally: the job did not ask for its steps in the same order.
//!
//! So a step recorded before an attempt was claimed never runs in that
//! attempt. A step can still run twice: an attempt that dies between the
//! step's work and its record, or a zombie that started the step before a
//! later attempt recorded it. What a step does outside Pelican must
//! therefore carry an idempotency key ([`Policy::step_key`]).

use super::Policy;
use crate::db::{QueryError, StepRow, Unfit, query};
use crate::ids::{Fence, RunId};
use crate::status::{ErrorClass, JobOutcome};
use std::collections::BTreeMap;

/// What an attempt does at the step it asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StepPlan {
    /// Recorded by an earlier attempt: this output, without running it.
    Replay(String),
    /// Not recorded: run it, then record its output as step `index`.
    Run(u32),
}

/// Why a step could not be taken or recorded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StepError {
    /// The job asked for its steps in another order than an earlier
    /// attempt did.
    #[error(
        "step {index} is {recorded:?} in the run's ledger, but this attempt asked for {asked:?}: \
         a job must ask for its steps in the same order on every attempt"
    )]
    Diverged {
        /// The step's index.
        index: u32,
        /// The name the ledger holds there.
        recorded: String,
        /// The name this attempt asked for.
        asked: String,
    },
    /// The step's output is larger than a step may record.
    #[error("step {name:?} produced {len} bytes, more than the {max} a step may record")]
    TooLarge {
        /// The step.
        name: String,
        /// Its output's length in bytes.
        len: usize,
        /// [`Policy::value_bytes_max`].
        max: usize,
    },
    /// The record was refused: this attempt no longer holds the run (a
    /// later attempt took it over, or the run ended).
    #[error("step {name:?} was not recorded: this attempt no longer holds the run")]
    NotRecorded {
        /// The step.
        name: String,
    },
    /// Postgres refused the record's text (a NUL byte in the step's name;
    /// an output is JSON, which escapes it): every retry would be refused.
    #[error("Postgres refused to store step {name:?} (text holding a NUL byte)")]
    Refused {
        /// The step.
        name: String,
    },
    /// Postgres did not answer: the step may or may not be recorded.
    #[error("step {name:?}: Postgres did not answer; a later attempt finds out")]
    Unavailable {
        /// The step.
        name: String,
    },
}

impl StepError {
    /// The attempt's outcome when a step fails it: a diverged ledger, an
    /// output too large or a record Postgres refuses fail the run (a retry
    /// would do the same); anything else is worth another attempt.
    #[must_use]
    pub fn outcome(&self) -> JobOutcome {
        let class = match self {
            StepError::Diverged { .. } => ErrorClass::Terminal,
            StepError::TooLarge { .. } | StepError::Refused { .. } => ErrorClass::Unstorable,
            StepError::NotRecorded { .. } | StepError::Unavailable { .. } => ErrorClass::Retryable,
        };
        JobOutcome::Failed {
            class,
            message: self.to_string(),
        }
    }
}

/// One attempt's view of its run's ledger.
#[derive(Clone, Debug)]
pub struct Ledger {
    run: RunId,
    fence: Fence,
    recorded: BTreeMap<u32, StepRow>,
    next: u32,
    policy: Policy,
}

impl Ledger {
    /// The read that starts an attempt's ledger.
    #[must_use]
    pub fn read(run: RunId) -> query::ReadSteps {
        query::ReadSteps { run }
    }

    /// The ledger of the attempt of `run` holding `fence`, from the answer
    /// to [`Ledger::read`].
    #[must_use]
    pub fn new(policy: &Policy, run: RunId, fence: Fence, recorded: Vec<(u32, StepRow)>) -> Ledger {
        Ledger {
            run,
            fence,
            recorded: recorded.into_iter().collect(),
            next: 0,
            policy: policy.clone(),
        }
    }

    /// The job asks for its next step, `name`.
    ///
    /// # Errors
    /// [`StepError::Diverged`]: the ledger holds another step at this index.
    pub fn plan(&mut self, name: &str) -> Result<StepPlan, StepError> {
        let index = self.next;
        self.next += 1;
        match self.recorded.get(&index) {
            Some(_) if crate::injects!(self.policy, StepRerun) => Ok(StepPlan::Run(index)),
            Some(row) if row.name == name => Ok(StepPlan::Replay(row.output.clone())),
            Some(row) => Err(StepError::Diverged {
                index,
                recorded: row.name.clone(),
                asked: name.to_owned(),
            }),
            None => Ok(StepPlan::Run(index)),
        }
    }

    /// The statement that records step `index`, `name`, with `output`.
    ///
    /// # Errors
    /// [`StepError::TooLarge`]: `output` exceeds [`Policy::value_bytes_max`].
    pub fn record(
        &self,
        index: u32,
        name: &str,
        output: String,
    ) -> Result<query::RecordStep, StepError> {
        if output.len() > self.policy.value_bytes_max {
            return Err(StepError::TooLarge {
                name: name.to_owned(),
                len: output.len(),
                max: self.policy.value_bytes_max,
            });
        }
        Ok(query::RecordStep {
            run: self.run,
            fence: self.fence,
            step: index,
            name: name.to_owned(),
            output,
        })
    }

    /// The answer to [`Ledger::record`]'s statement: rows written.
    ///
    /// # Errors
    /// The step was not recorded, or it is not known whether it was.
    pub fn recorded(&self, name: &str, answer: Result<u64, QueryError>) -> Result<(), StepError> {
        let name = name.to_owned();
        match answer {
            Ok(1) => Ok(()),
            Err(QueryError::Unfit(Unfit::Refused(_))) => Err(StepError::Refused { name }),
            Ok(_) | Err(QueryError::Unfit(Unfit::Mismatch(_))) => {
                Err(StepError::NotRecorded { name })
            }
            Err(QueryError::Unavailable(_)) => Err(StepError::Unavailable { name }),
        }
    }
}

impl Policy {
    /// The idempotency key of step `name` of `run`, for what the step sends
    /// outside Pelican: the same on every attempt.
    #[must_use]
    pub fn step_key(&self, run: RunId, name: &str) -> String {
        format!("{run}/{name}")
    }
}
