//! Progress events: what a job reports while it runs (S13).
//!
//! A job's progress is an event of its run ([`crate::events`]), written
//! under the attempt's fence: once a later attempt holds the run, or the
//! attempt has ended, its progress is refused like any other write of it.
//! The mutant twin of the write is chosen here, once.

use super::Policy;
use crate::db::{DbOp, QueryError, Shaped, shape};
use crate::ids::{Fence, RunId};

/// Why a progress event was not written.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProgressError {
    /// The event is larger than the policy lets a value be.
    #[error("a progress event of {len} bytes is more than the {max} a value may hold")]
    TooLarge {
        /// Its length in bytes.
        len: usize,
        /// [`Policy::value_bytes_max`].
        max: usize,
    },
    /// The attempt no longer holds the run: a later attempt took it over,
    /// or the run ended.
    #[error("the progress event was refused: this attempt no longer holds the run")]
    Refused,
    /// Postgres did not answer: the event may or may not be written.
    #[error("the progress event may not be written: Postgres did not answer")]
    Unavailable,
}

/// The statement that writes progress `data` (JSON text) of the attempt
/// of `run` holding `fence`.
///
/// # Errors
/// [`ProgressError::TooLarge`]: `data` exceeds [`Policy::value_bytes_max`].
pub fn progress(
    policy: &Policy,
    run: RunId,
    fence: Fence,
    data: String,
) -> Result<Shaped<shape::Rows>, ProgressError> {
    if data.len() > policy.value_bytes_max {
        return Err(ProgressError::TooLarge {
            len: data.len(),
            max: policy.value_bytes_max,
        });
    }
    #[cfg(feature = "mutants")]
    if crate::injects!(policy, ZombieProgress) {
        return Ok(Shaped::new(DbOp::AppendEventUnfenced { run, fence, data }));
    }
    Ok(Shaped::new(DbOp::AppendEvent { run, fence, data }))
}

/// The answer to [`progress`]'s statement: rows written.
///
/// # Errors
/// The event was refused, or it is not known whether it was written.
pub fn progressed(answer: Result<u64, QueryError>) -> Result<(), ProgressError> {
    match answer {
        Ok(1) => Ok(()),
        Ok(_) | Err(QueryError::Unfit(_)) => Err(ProgressError::Refused),
        Err(QueryError::Unavailable(_)) => Err(ProgressError::Unavailable),
    }
}
