//! Run states, error classes and job outcomes.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Where a run is in its life. Stored as text in Postgres (`runs.status`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// Submitted with a delay and not yet due: no stream entry and no worker
    /// slot. Promoted to `queued` at its due time (`due_at`), by the pass
    /// that promotes retries.
    Delayed,
    /// Waiting for a worker; published (or about to be) on the stream.
    Queued,
    /// An attempt holds the run under its fence and lease.
    Running,
    /// A retryable failure was recorded; the retry scheduler re-queues the run
    /// at `retry_at`.
    RetryWait,
    /// Terminal: the job's result is stored.
    Succeeded,
    /// Terminal: a non-retryable error.
    Failed,
    /// Terminal: cancelled by request.
    Cancelled,
    /// Terminal: attempts exhausted; a dead-letter record exists.
    Dead,
}

impl RunStatus {
    /// All states, in lifecycle order.
    pub const ALL: [RunStatus; 8] = [
        RunStatus::Delayed,
        RunStatus::Queued,
        RunStatus::Running,
        RunStatus::RetryWait,
        RunStatus::Succeeded,
        RunStatus::Failed,
        RunStatus::Cancelled,
        RunStatus::Dead,
    ];

    /// A terminal state never changes again (S2).
    #[must_use]
    pub const fn is_terminal(self) -> bool {
        matches!(
            self,
            RunStatus::Succeeded | RunStatus::Failed | RunStatus::Cancelled | RunStatus::Dead
        )
    }

    /// The text stored in Postgres.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            RunStatus::Delayed => "delayed",
            RunStatus::Queued => "queued",
            RunStatus::Running => "running",
            RunStatus::RetryWait => "retry_wait",
            RunStatus::Succeeded => "succeeded",
            RunStatus::Failed => "failed",
            RunStatus::Cancelled => "cancelled",
            RunStatus::Dead => "dead",
        }
    }

    /// Parses the text stored in Postgres.
    #[must_use]
    pub fn parse(s: &str) -> Option<RunStatus> {
        RunStatus::ALL.into_iter().find(|st| st.as_str() == s)
    }
}

impl fmt::Display for RunStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a failure is classified, which decides what happens next (S6).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorClass {
    /// Worth another attempt after back-off (rate limits, timeouts).
    Retryable,
    /// Retrying cannot help (invalid input, permission denied).
    Terminal,
    /// The handler panicked: treated as retryable, and counted.
    Panic,
    /// Attempts are exhausted; recorded on dead runs.
    Exhausted,
    /// The attempt's result or error could not be stored (Postgres refused
    /// it, or it exceeds [`Policy::value_bytes_max`]): the run fails at
    /// once, since every retry would produce a value as unstorable.
    ///
    /// [`Policy::value_bytes_max`]: crate::protocol::Policy::value_bytes_max
    Unstorable,
    /// Not known to be worth retrying or not (an error the handler did not
    /// classify): retried at most [`Policy::unknown_retries_max`] times in a
    /// run, then the run fails.
    ///
    /// [`Policy::unknown_retries_max`]: crate::protocol::Policy::unknown_retries_max
    Unknown,
    /// The run's elapsed budget ran out (its kind's `budget_ms`, counted
    /// from its insert by Postgres's clock): it fails, and is never retried.
    BudgetExhausted,
}

impl ErrorClass {
    /// The text stored in Postgres and on the dead-letter stream.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            ErrorClass::Retryable => "retryable",
            ErrorClass::Terminal => "terminal",
            ErrorClass::Panic => "panic",
            ErrorClass::Exhausted => "exhausted",
            ErrorClass::Unstorable => "unstorable",
            ErrorClass::Unknown => "unknown",
            ErrorClass::BudgetExhausted => "budget_exhausted",
        }
    }

    /// Parses the stored text.
    #[must_use]
    pub fn parse(s: &str) -> Option<ErrorClass> {
        [
            ErrorClass::Retryable,
            ErrorClass::Terminal,
            ErrorClass::Panic,
            ErrorClass::Exhausted,
            ErrorClass::Unstorable,
            ErrorClass::Unknown,
            ErrorClass::BudgetExhausted,
        ]
        .into_iter()
        .find(|c| c.as_str() == s)
    }

    /// Whether another attempt may help (an unknown error: up to a cap).
    #[must_use]
    pub const fn is_retryable(self) -> bool {
        matches!(
            self,
            ErrorClass::Retryable | ErrorClass::Panic | ErrorClass::Unknown
        )
    }
}

impl fmt::Display for ErrorClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a job's execution came to, as the executor reports it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum JobOutcome {
    /// Finished; the result to store.
    Succeeded {
        /// The job's result (JSON text in the real binding).
        result: String,
    },
    /// Failed with an error of the given class.
    Failed {
        /// Its class.
        class: ErrorClass,
        /// A message for people.
        message: String,
    },
}

/// How an attempt ended, as recorded in the `attempts` table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttemptOutcome {
    /// The attempt's result was stored.
    Succeeded,
    /// The attempt failed with this class.
    Failed(ErrorClass),
}

impl AttemptOutcome {
    /// The text stored in Postgres (`attempts.outcome`): `succeeded`, or
    /// the failure's class.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            AttemptOutcome::Succeeded => "succeeded",
            AttemptOutcome::Failed(class) => class.as_str(),
        }
    }
}
