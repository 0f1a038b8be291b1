//! A run's events: its history as a reader follows it (S13).
//!
//! Every run has one ordered log, numbered 1, 2, 3, ... without gaps: the
//! run was queued, attempt N was claimed under fence F, the attempt
//! reported progress, it succeeded, failed, had a retry scheduled or
//! dead-lettered, the run was cancelled, an operator requeued it. Each
//! number is taken from the run's row (`runs.events`) by the statement that
//! writes the event, in the same statement, under the row's lock: so the
//! log only ever grows at its end, and what a reader has seen is a prefix
//! of whatever it reads later.
//!
//! The hot path writes no row of its own for its events: a claim's event is
//! its attempt row (`attempts.claimed_seq`), and a success, always a run's
//! last event, is the run's row (`runs.events` numbers it). The other
//! events are rows of `run_events`.
//! [`Statement::ReadEvents`](crate::db::Statement::ReadEvents) reads the
//! three as one log.
//!
//! [`check`] is S13 over one log, and [`grew`] over two reads of it: the
//! world applies both at every write, the simulator's readers and the live
//! SSE test to what they received.

use crate::ids::{AttemptNo, Fence};
use crate::status::ErrorClass;
use serde::{Deserialize, Serialize};
use std::fmt;

/// What happened to the run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// Submitted (always event 1).
    Queued,
    /// Attempt `attempt` was claimed under `fence`; `data` is the worker.
    Claimed,
    /// The attempt holding `fence` reported progress; `data` is its JSON.
    Progress,
    /// The attempt holding `fence` succeeded.
    Succeeded,
    /// The attempt failed retryably (`class`, `data`: the message); the run
    /// waits for its retry.
    RetryScheduled,
    /// The attempt failed terminally (`class`, `data`: the message).
    Failed,
    /// The run is dead: its last attempt failed, or its attempts ran out
    /// (`class` `exhausted`).
    Dead,
    /// The run was cancelled.
    Cancelled,
    /// An operator requeued the dead run.
    Requeued,
}

impl EventKind {
    /// Every kind.
    pub const ALL: [EventKind; 9] = [
        EventKind::Queued,
        EventKind::Claimed,
        EventKind::Progress,
        EventKind::Succeeded,
        EventKind::RetryScheduled,
        EventKind::Failed,
        EventKind::Dead,
        EventKind::Cancelled,
        EventKind::Requeued,
    ];

    /// The text stored in Postgres, and the SSE event's name.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            EventKind::Queued => "queued",
            EventKind::Claimed => "claimed",
            EventKind::Progress => "progress",
            EventKind::Succeeded => "succeeded",
            EventKind::RetryScheduled => "retry_scheduled",
            EventKind::Failed => "failed",
            EventKind::Dead => "dead",
            EventKind::Cancelled => "cancelled",
            EventKind::Requeued => "requeued",
        }
    }

    /// The kind stored as `s`.
    #[must_use]
    pub fn parse(s: &str) -> Option<EventKind> {
        EventKind::ALL.into_iter().find(|k| k.as_str() == s)
    }

    /// Whether the run is terminal after it (a dead run may still be
    /// requeued by an operator, which continues the log).
    #[must_use]
    pub const fn is_terminal(self) -> bool {
        matches!(
            self,
            EventKind::Succeeded | EventKind::Failed | EventKind::Dead | EventKind::Cancelled
        )
    }

    /// Whether it ends the attempt that `fence` names.
    const fn ends_attempt(self) -> bool {
        matches!(
            self,
            EventKind::Succeeded | EventKind::RetryScheduled | EventKind::Failed | EventKind::Dead
        )
    }
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One event of a run.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RunEvent {
    /// Its number in the run's log: 1, 2, 3, ... (the SSE event id).
    pub seq: u32,
    /// What happened.
    pub kind: EventKind,
    /// The run's attempt at the time (0: before the first claim).
    pub attempt: AttemptNo,
    /// That attempt's fence (0: none), the writer's own for progress.
    pub fence: Fence,
    /// A failure's class.
    pub class: Option<ErrorClass>,
    /// The worker of a claim, a progress event's JSON, a failure's
    /// message; empty otherwise.
    pub data: String,
}

/// Why a log breaks S13.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EventFault {
    /// Event numbers are not 1, 2, 3, ... in order.
    #[error("event {index} of the log is numbered {seq}")]
    Gap {
        /// Its position (0-based).
        index: usize,
        /// Its number.
        seq: u32,
    },
    /// A progress event of an attempt that did not hold the run when it
    /// was written: another attempt's claim, or its own end, came first.
    #[error("event {seq} is progress under fence {fence:?}, which did not hold the run")]
    FencedOff {
        /// The event.
        seq: u32,
        /// The fence it was written under.
        fence: Fence,
    },
    /// A later read does not begin with what an earlier read returned.
    #[error("event {seq} changed or vanished between two reads")]
    Rewritten {
        /// The first event that differs.
        seq: u32,
    },
}

/// S13 over a whole log, or its tail read from after event `from`
/// (`events[0]` is then event `from + 1`): numbered without gaps, and every
/// progress event written by the attempt that held the run then, between
/// its claim and its end. A tail's first events may belong to an attempt
/// claimed before it; they are checked from its first claim on.
///
/// # Errors
/// The first fault found.
pub fn check(from: u32, events: &[RunEvent]) -> Result<(), EventFault> {
    // The attempt holding the run at this point of the log, if known.
    let mut holder: Option<Fence> = None;
    let mut known = from == 0;
    for (index, e) in events.iter().enumerate() {
        if u64::from(e.seq) != u64::from(from) + index as u64 + 1 {
            return Err(EventFault::Gap { index, seq: e.seq });
        }
        match e.kind {
            EventKind::Claimed => {
                holder = Some(e.fence);
                known = true;
            }
            EventKind::Progress if known && holder != Some(e.fence) => {
                return Err(EventFault::FencedOff {
                    seq: e.seq,
                    fence: e.fence,
                });
            }
            EventKind::Progress => {}
            k if k.ends_attempt() || k == EventKind::Cancelled => holder = None,
            _ => {}
        }
    }
    Ok(())
}

/// S13 between two reads of a log from its start: `later` begins with
/// `earlier`.
///
/// # Errors
/// The first event of `earlier` that `later` does not hold as it was.
pub fn grew(earlier: &[RunEvent], later: &[RunEvent]) -> Result<(), EventFault> {
    match earlier
        .iter()
        .zip(later.iter().map(Some).chain(std::iter::repeat(None)))
        .find(|(a, b)| Some(*a) != *b)
    {
        Some((a, _)) => Err(EventFault::Rewritten { seq: a.seq }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(seq: u32, kind: EventKind, fence: u64) -> RunEvent {
        RunEvent {
            seq,
            kind,
            attempt: AttemptNo(0),
            fence: Fence(fence),
            class: None,
            data: String::new(),
        }
    }

    #[test]
    fn a_good_log_holds() {
        use EventKind::*;
        let log = [
            ev(1, Queued, 0),
            ev(2, Claimed, 1),
            ev(3, Progress, 1),
            ev(4, Claimed, 2),
            ev(5, Progress, 2),
            ev(6, Succeeded, 2),
        ];
        assert_eq!(check(0, &log), Ok(()));
        assert_eq!(check(2, &log[2..]), Ok(()), "a tail from inside an attempt");
        assert_eq!(grew(&log[..3], &log), Ok(()));
    }

    #[test]
    fn gaps_stale_progress_and_rewrites_fail() {
        use EventKind::*;
        let gap = [ev(1, Queued, 0), ev(3, Claimed, 1)];
        assert_eq!(check(0, &gap), Err(EventFault::Gap { index: 1, seq: 3 }));
        let zombie = [
            ev(1, Queued, 0),
            ev(2, Claimed, 1),
            ev(3, Claimed, 2),
            ev(4, Progress, 1),
        ];
        assert_eq!(
            check(0, &zombie),
            Err(EventFault::FencedOff {
                seq: 4,
                fence: Fence(1)
            })
        );
        let after_end = [
            ev(1, Queued, 0),
            ev(2, Claimed, 1),
            ev(3, Failed, 1),
            ev(4, Progress, 1),
        ];
        assert!(
            check(0, &after_end).is_err(),
            "progress after its attempt ended"
        );
        let before = [ev(1, Queued, 0), ev(2, Claimed, 1)];
        let after = [ev(1, Queued, 0), ev(2, Claimed, 2)];
        assert_eq!(grew(&before, &after), Err(EventFault::Rewritten { seq: 2 }));
        assert_eq!(
            grew(&before, &before[..1]),
            Err(EventFault::Rewritten { seq: 2 })
        );
    }
}
