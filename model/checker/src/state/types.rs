//! The data types a state is made of: worker processes and their jobs,
//! the sources and fates of commands, the API's runs and the history flags.

use crate::config::Config;
use pelican_model::ids::{EntryId, Fence, RunId, WorkerId};
use pelican_model::protocol::{Command, Delivery, JobEntry, Maintenance, Reclaimer};
use pelican_model::shared::Shared;
use serde::Serialize;

/// Which part of a worker issued a command.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Source {
    /// The read loop (XREADGROUP, or recreating the group).
    Fetch,
    /// The delivery being handled.
    Delivery,
    /// The reclaim loop.
    Reclaimer,
}

/// What happens to a command on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Fate {
    /// Executed, answered.
    Reply,
    /// Executed, answer lost.
    LostReply,
    /// Never reached the server.
    LostRequest,
    /// An XADD applied twice: its reply was lost and the publisher retried
    /// (a duplicate publication).
    Duplicated,
}

/// A running job.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Job {
    /// Its run.
    pub run: RunId,
    /// The fence it runs under.
    pub fence: Fence,
    /// Whether its side effect was performed (or, in a step, replayed).
    pub effect_done: bool,
    /// Whether its step ran and its record is still to be sent.
    pub record_due: bool,
    /// With limits: whether it holds its permit (a slot of the provider).
    pub permit: bool,
}

/// One worker process.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct WorkerProc {
    /// Paused (SIGSTOP): takes no step until resumed.
    pub paused: bool,
    /// The delivery in hand (in-flight max is 1 in the model).
    pub delivery: Option<Delivery>,
    /// The reclaim loop.
    pub reclaimer: Reclaimer,
    /// A reclaimed entry waiting for the delivery slot.
    pub backlog: Option<(EntryId, JobEntry)>,
    /// Commands sent and not yet answered, one per source at most.
    pub outstanding: Vec<(Source, Command)>,
    /// The job, while it runs.
    pub job: Option<Job>,
    /// The scheduler's pass ([`MaintenanceTask::Schedules`]), one command
    /// a step, so that two workers' passes interleave.
    ///
    /// [`MaintenanceTask::Schedules`]: pelican_model::protocol::MaintenanceTask::Schedules
    pub scheduler: Maintenance,
}

impl WorkerProc {
    /// A worker process just started: nothing in hand, reclaim cursor at 0.
    #[must_use]
    pub fn new(cfg: &Config, w: u8) -> WorkerProc {
        WorkerProc {
            paused: false,
            delivery: None,
            reclaimer: Reclaimer::new(&cfg.policy, WorkerId(u32::from(w))),
            backlog: None,
            outstanding: Vec::new(),
            job: None,
            scheduler: Maintenance::new(&cfg.policy),
        }
    }
}

/// A worker process in a state: shared with the states before and after it
/// until one of them changes it (copy on write: most steps change one
/// worker, or none). Its memo is its fingerprint as worker 0 and the place
/// it was computed for (see [`State::fingerprint`]).
///
/// [`State::fingerprint`]: super::State::fingerprint
pub type Proc = Shared<WorkerProc, (usize, u64)>;

/// The API's handling of one run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum ApiRun {
    /// Not submitted yet.
    NotYet,
    /// Answered.
    Done,
    /// Submitted again under its idempotency key, after retention deleted
    /// the run (S14), and answered.
    Retried,
}

/// Things that happened that the `sometimes` properties look for and that
/// cannot be read off the state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
pub struct Seen {
    /// A late attempt's fenced write was rejected.
    pub late_write_rejected: bool,
    /// A cancel won the race against a running attempt's result.
    pub cancel_beat_result: bool,
    /// A run was recovered from a trimmed pending entry.
    pub trimmed_recovered: bool,
    /// Redis lost all its data.
    pub redis_wiped: bool,
    /// A delivery found its run deleted by retention.
    pub retired_delivered: bool,
    /// An attempt replayed a step an earlier attempt recorded.
    pub step_replayed: bool,
    /// An attempt's progress event was refused (it no longer held the run).
    pub progress_refused: bool,
    /// A job waited for a slot another permit held.
    pub slot_waited: bool,
    /// An unknown error failed its run at the policy's cap.
    pub unknown_capped: bool,
    /// A claim found its run's budget spent and failed it.
    pub budget_exhausted: bool,
    /// A retry under a key answered the key's run, deleted by retention.
    pub key_outlived_run: bool,
    /// Maintenance deleted an idle consumer.
    pub consumer_forgotten: bool,
}
