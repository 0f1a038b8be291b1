//! The guarantees S1–S16 ([`Guarantee`]) as functions over a [`World`] or
//! its database.
//!
//! Step guarantees (S2, S3, S4, S5, S7, S8) are checked as commands execute
//! and recorded in [`World::violations`]; [`state`] adds the ones that are
//! facts about a single state, and [`quiescent`] the ones that must hold once
//! faults stop and nothing is left to do (S1, S5, S9, S10). [`outcomes`]
//! holds the checks every level makes on the database at the end of a run
//! (the simulator's oracle and the live audit, and through it the chaos
//! soak): each run's status agrees with its attempts, its dead letter and
//! its side effects. [`terminal_row`] is S1 for one accepted run, shared by
//! [`quiescent`] and the live audit.

use crate::db::{AttemptRow, Db, RunRow};
use crate::events::{self, EventKind};
use crate::ids::{AttemptNo, RunId};
use crate::protocol::{JobEntry, Policy};
use crate::status::{AttemptOutcome, ErrorClass, RunStatus};
use crate::world::World;
use serde::{Deserialize, Serialize};
use std::fmt;

/// Defines [`Guarantee`] from one table: each guarantee's code (its
/// variant), number and short title.
macro_rules! guarantees {
    ($($(#[doc = $doc:literal])* $code:ident = $n:literal, $title:literal;)*) => {
        /// One of Pelican's guarantees (README, "The guarantees"; in full in
        /// docs/VERIFICATION.md).
        ///
        /// A closed set: the model checker has one `always` property per
        /// guarantee, named by [`Guarantee::property_name`], and every report
        /// names a broken one by its code. A new one is a new line in the table in
        /// `invariants.rs` (with its number, at most 15: the checker keeps
        /// one bit per guarantee in a `u16`), after which the compiler points
        /// at each exhaustive `match` over guarantees and at the checker's
        /// table of conditions.
        #[derive(
            Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
        )]
        pub enum Guarantee {
            $($(#[doc = $doc])* $code = $n,)*
        }

        impl Guarantee {
            /// Every guarantee, in order.
            pub const ALL: [Guarantee; [$($n),*].len()] = [$(Guarantee::$code),*];

            /// Its code: "S1", "S2", ...
            #[must_use]
            pub const fn code(self) -> &'static str {
                match self {
                    $(Guarantee::$code => stringify!($code),)*
                }
            }

            /// Its short title: "nothing lost", "one outcome", ...
            #[must_use]
            pub const fn title(self) -> &'static str {
                match self {
                    $(Guarantee::$code => $title,)*
                }
            }

            /// The name of the model checker's property for it: code and
            /// title, "S1 nothing lost".
            #[must_use]
            pub const fn property_name(self) -> &'static str {
                match self {
                    $(Guarantee::$code => concat!(stringify!($code), " ", $title),)*
                }
            }
        }
    };
}

guarantees! {
    /// Nothing lost: every accepted run reaches a terminal state once faults
    /// stop, even if Redis lost its data.
    S1 = 1, "nothing lost";
    /// One outcome: a terminal state never changes; a result is written at
    /// most once.
    S2 = 2, "one outcome";
    /// Fencing: each attempt's fence exceeds all earlier ones; only the
    /// current fence can write.
    S3 = 3, "fencing";
    /// Ack after durable: an entry is acknowledged, or leaves the PEL with
    /// its consumer, only after its run's next step is durable, or after it
    /// was quarantined.
    S4 = 4, "ack after durable";
    /// Effects once: side effects carry a stable idempotency key and are
    /// applied at most once.
    S5 = 5, "effects once";
    /// Bounded retries: retries wait in Postgres, never in the PEL; errors
    /// of class `unknown` are retried at most the policy's cap; exhausted
    /// runs are dead-lettered.
    S6 = 6, "bounded retries";
    /// Cancellation: a cancelled run never gets a new attempt; the first
    /// terminal write wins.
    S7 = 7, "cancellation";
    /// Trimmed entries: a pending entry that was trimmed is recovered from
    /// Postgres.
    S8 = 8, "trimmed entries";
    /// No PEL leak: once all runs are terminal, the PEL is empty.
    S9 = 9, "no PEL leak";
    /// Bad input: a malformed entry is quarantined and acknowledged; it
    /// never blocks the queue.
    S10 = 10, "bad input";
    /// Durable steps: a step recorded before an attempt was claimed never
    /// runs in that attempt (it is replayed), a record is never replaced,
    /// and only the current fence can record one.
    S11 = 11, "durable steps";
    /// Provider limits: a provider never has more unexpired permits than
    /// its concurrency limit allows, and its calls start no faster than its
    /// rate allows (at most `burst + d / interval` in any span `d`).
    S12 = 12, "provider limits";
    /// Run events: what a reader sees of a run's events is a prefix of its
    /// history, numbered without gaps, with no event written by an attempt
    /// that did not hold the run.
    S13 = 13, "run events";
    /// Submit once: submissions under one idempotency key make one run for
    /// as long as the key is kept, whatever retention did with the run.
    S14 = 14, "submit once";
    /// Delays: no attempt of a run submitted with a delay starts before
    /// its due time by Postgres's clock.
    S15 = 15, "delays";
    /// Schedules: each tick of a cron schedule is handled once, however
    /// many schedulers run: it makes one run (under its own id) or, as
    /// its policies say, none; never two.
    S16 = 16, "schedules";
}

impl Guarantee {
    /// Its number: 1 for S1, ...
    #[must_use]
    pub const fn number(self) -> u8 {
        self as u8
    }
}

/// Its code, "S1".
impl fmt::Display for Guarantee {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.code())
    }
}

/// One broken guarantee, for reports.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Broken {
    /// Which one.
    pub guarantee: Guarantee,
    /// What exactly.
    pub detail: String,
}

/// "S1 run-3 is stuck queued (dispatch 1)": the code, then the detail.
impl fmt::Display for Broken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.guarantee, self.detail)
    }
}

fn broken(guarantee: Guarantee, detail: String) -> Broken {
    Broken { guarantee, detail }
}

/// `run`'s attempts, in order.
fn attempts(db: &Db, run: RunId) -> impl Iterator<Item = (AttemptNo, &AttemptRow)> {
    db.attempts
        .range((run, AttemptNo(0))..=(run, AttemptNo(u32::MAX)))
        .map(|((_, n), a)| (*n, a))
}

/// Everything wrong with this state regardless of progress: the recorded
/// step violations, plus S6 (attempts and retries of unknown errors within
/// bounds, no run left running after its attempt's outcome was recorded,
/// dead runs have dead letters).
#[must_use]
pub fn state(world: &World, policy: &Policy) -> Vec<Broken> {
    let mut out: Vec<Broken> = world
        .violations
        .iter()
        .map(|v| broken(v.guarantee(), format!("{v:?}")))
        .collect();
    for r in world.db.runs.values() {
        let attempts_max = policy.attempts_max_of(&r.kind);
        if r.attempts > attempts_max {
            out.push(broken(
                Guarantee::S6,
                format!("{} has {} attempts > {attempts_max}", r.run_id, r.attempts),
            ));
        }
        if r.unknown_failures > policy.unknown_retries_max {
            out.push(broken(
                Guarantee::S6,
                format!(
                    "{} was retried after {} unknown errors > {}",
                    r.run_id, r.unknown_failures, policy.unknown_retries_max
                ),
            ));
        }
        if r.status == RunStatus::Running {
            let active = attempts(&world.db, r.run_id).find(|(_, a)| a.fence == r.active_fence);
            if active.is_some_and(|(_, a)| r.outcome_of(a).is_some()) {
                out.push(broken(
                    Guarantee::S6,
                    format!(
                        "{} is running after its attempt's outcome was recorded (retry left in the PEL)",
                        r.run_id
                    ),
                ));
            }
        }
        if r.status == RunStatus::Dead && !world.db.dead_letters.contains_key(&r.run_id) {
            out.push(broken(
                Guarantee::S6,
                format!("{} is dead without a dead-letter record", r.run_id),
            ));
        }
    }
    out
}

/// What must hold once faults have stopped and no role has anything left to
/// do: every accepted run is terminal (S1, [`terminal_row`]), the PEL is
/// empty (S9), every malformed entry was quarantined (S10), and every
/// succeeded run's side effects were applied exactly once (S5).
/// `effects_of(run)` is how many tool calls `run`'s job makes when it
/// succeeds.
#[must_use]
pub fn quiescent(world: &World, effects_of: &dyn Fn(RunId) -> u32) -> Vec<Broken> {
    let mut out = Vec::new();
    for run in &world.accepted {
        let status = match (world.retired.get(run), terminal_row(&world.db, *run)) {
            (Some(s), _) => *s,
            (None, Ok(r)) => r.status,
            (None, Err(b)) => {
                out.push(b);
                continue;
            }
        };
        if status != RunStatus::Succeeded {
            continue;
        }
        for call in 0..effects_of(*run) {
            let n = world.effects.get(&(*run, call)).copied().unwrap_or(0);
            if n != 1 {
                out.push(broken(
                    Guarantee::S5,
                    format!("{run} succeeded with effect {call} applied {n} times"),
                ));
            }
        }
    }
    let pel = world.redis.pel_len();
    if pel > 0 {
        out.push(broken(Guarantee::S9, format!("{pel} entries left pending")));
    }
    for (id, e) in world.entries.iter() {
        if matches!(e, JobEntry::Malformed { .. })
            && world.redis.holds(*id)
            && !world.quarantined.contains(id)
        {
            out.push(broken(
                Guarantee::S10,
                format!("malformed entry {id} was never quarantined"),
            ));
        }
    }
    out
}

/// S1 for accepted run `run`, once faults have stopped and everything
/// settled: its row, which is terminal; or what is wrong with it.
///
/// # Errors
/// S1: the run has no row, or its row is not terminal.
pub fn terminal_row(db: &Db, run: RunId) -> Result<&RunRow, Broken> {
    match db.runs.get(&run) {
        None => Err(broken(
            Guarantee::S1,
            format!("{run} was accepted but has no row"),
        )),
        Some(r) if !r.status.is_terminal() => Err(broken(
            Guarantee::S1,
            format!("{run} is stuck {} (dispatch {})", r.status, r.dispatch.0),
        )),
        Some(r) => Ok(r),
    }
}

/// The checks on the database every level makes at the end of a run (the
/// simulator's oracle, the live audit and through it the chaos soak), for
/// every run, accepted or not: its status agrees with its attempts, its dead
/// letter and its side effects.
///
/// * S2: a succeeded run has exactly one succeeded attempt, any other run
///   none.
/// * S6: a run has no more attempts than it allows; a dead run used them all;
///   a run is dead exactly when it has a dead letter (one an operator
///   requeued no longer counts: the run runs again).
/// * S3: no stale write left its mark ([`stale_write_evidence`]).
/// * S5: each side effect of a succeeded run was requested under one key
///   only ([`effect_keys`]); `effects_of(run)` is how many tool calls `run`'s
///   job makes when it succeeds.
///
/// These are facts about any state, but only the end of a run has them
/// checked: the model checker's properties are [`state`] and [`quiescent`].
#[must_use]
pub fn outcomes(db: &Db, effects_of: &dyn Fn(RunId) -> u32) -> Vec<Broken> {
    let mut out = Vec::new();
    for r in db.runs.values() {
        let run = r.run_id;
        if let Some(detail) = event_log(db, r) {
            out.push(broken(Guarantee::S13, detail));
        }
        let succeeded = attempts(db, run)
            .filter(|(_, a)| r.outcome_of(a) == Some(AttemptOutcome::Succeeded))
            .count();
        let want = usize::from(r.status == RunStatus::Succeeded);
        if succeeded != want {
            out.push(broken(
                Guarantee::S2,
                format!("{run} is {} with {succeeded} succeeded attempts", r.status),
            ));
        }
        if r.status == RunStatus::Dead && r.attempts < r.attempts_max {
            out.push(broken(
                Guarantee::S6,
                format!(
                    "{run} is dead after {} of {} attempts",
                    r.attempts, r.attempts_max
                ),
            ));
        }
        let lettered = db.dead_letters.get(&run).is_some_and(|d| !d.requeued);
        if lettered != (r.status == RunStatus::Dead) {
            out.push(broken(
                Guarantee::S6,
                format!("{run} is {} with dead letter: {lettered}", r.status),
            ));
        }
        if r.attempts > r.attempts_max {
            out.push(broken(
                Guarantee::S6,
                format!("{run} ran {} of {} attempts", r.attempts, r.attempts_max),
            ));
        }
        if let Some(e) = stale_write_evidence(db, run) {
            out.push(broken(Guarantee::S3, e));
        }
        if r.status == RunStatus::Succeeded {
            for call in 0..effects_of(run) {
                let keys = effect_keys(db, run, call);
                if keys.len() != 1 {
                    out.push(broken(
                        Guarantee::S5,
                        format!(
                            "effect {run}/{call} applied under {} keys: {keys:?}",
                            keys.len()
                        ),
                    ));
                }
            }
        }
    }
    out
}

/// The keys under which `run`'s tool call `call` was requested: `run/call`
/// (see [`Policy::idempotency_key`]), or `run/call/…` for a key with a
/// per-attempt suffix, which is how a job without idempotency keys would
/// show.
#[must_use]
pub fn effect_keys(db: &Db, run: RunId, call: u32) -> Vec<String> {
    let key = format!("{run}/{call}");
    let suffixed = format!("{key}/");
    db.effects
        .keys()
        .filter(|k| **k == key || k.starts_with(&suffixed))
        .cloned()
        .collect()
}

/// What a stale write accepted by Postgres leaves behind in the final state
/// of one run, if anything: the attempt rows tell which fence wrote last.
/// A fenced protocol records an outcome only for the run's active attempt,
/// and claims a new attempt only while the run is not terminal, so:
/// a succeeded or terminally failed attempt is the run's last one; a
/// succeeded run's last attempt succeeded; a failed run's last attempt
/// failed. A success is the run's row, read as the outcome of the attempt
/// holding its fence ([`RunRow::outcome_of`]), so a stale success is
/// caught where it is written (S3 at each write), not here. (A stale
/// retryable failure written between two claims leaves no trace in the
/// rows; the step checks and the live workers' traces catch that one.)
#[must_use]
pub fn stale_write_evidence(db: &Db, run: RunId) -> Option<String> {
    let r = db.runs.get(&run)?;
    let last = attempts(db, run).last();
    for (n, a) in attempts(db, run) {
        let ends = matches!(
            r.outcome_of(a),
            Some(AttemptOutcome::Succeeded | AttemptOutcome::Failed(ErrorClass::Terminal))
        );
        if ends && Some(n) != last.map(|(n, _)| n) {
            return Some(format!(
                "{run}: attempt {n:?} (fence {:?}) ended the run but a later attempt exists",
                a.fence
            ));
        }
    }
    let last_outcome = last.and_then(|(_, a)| r.outcome_of(a));
    let consistent = match r.status {
        RunStatus::Succeeded => last_outcome == Some(AttemptOutcome::Succeeded),
        RunStatus::Failed => matches!(last_outcome, Some(AttemptOutcome::Failed(_))),
        _ => true,
    };
    (!consistent).then(|| {
        format!(
            "{run} is {} but its last attempt's outcome is {last_outcome:?}",
            r.status
        )
    })
}

/// S13 on a run's final log: whole ([`events::check`]), as long as the
/// row says, and ending as the run did.
fn event_log(db: &Db, r: &RunRow) -> Option<String> {
    let run = r.run_id;
    let log = db.read_events(run, 0, usize::MAX);
    if let Err(e) = events::check(0, &log) {
        return Some(format!("{run}'s events: {e}"));
    }
    let last = log.last().expect("a run's log holds its queued event");
    if last.seq != r.events {
        return Some(format!(
            "{run}'s last event is {} but its row counts {}",
            last.seq, r.events
        ));
    }
    // A run from before schema version 11 has attempts without events.
    if attempts(db, run).any(|(_, a)| a.claimed_seq.is_none()) {
        return None;
    }
    let ended = match r.status {
        RunStatus::Succeeded => Some(EventKind::Succeeded),
        RunStatus::Failed => Some(EventKind::Failed),
        RunStatus::Cancelled => Some(EventKind::Cancelled),
        RunStatus::Dead => Some(EventKind::Dead),
        _ => None,
    };
    match ended {
        Some(kind) if last.kind != kind => Some(format!(
            "{run} is {} but its last event is {} {}",
            r.status, last.seq, last.kind
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The checker's property names, which reports print and tests pin.
    #[test]
    fn codes_titles_and_property_names() {
        let names: Vec<&str> = Guarantee::ALL.iter().map(|g| g.property_name()).collect();
        assert_eq!(
            names,
            [
                "S1 nothing lost",
                "S2 one outcome",
                "S3 fencing",
                "S4 ack after durable",
                "S5 effects once",
                "S6 bounded retries",
                "S7 cancellation",
                "S8 trimmed entries",
                "S9 no PEL leak",
                "S10 bad input",
                "S11 durable steps",
                "S12 provider limits",
                "S13 run events",
                "S14 submit once",
                "S15 delays",
                "S16 schedules",
            ]
        );
        for (i, g) in Guarantee::ALL.into_iter().enumerate() {
            assert_eq!(usize::from(g.number()), i + 1);
            assert_eq!(g.code(), format!("S{}", g.number()));
            assert_eq!(g.to_string(), g.code());
            assert_eq!(g.property_name(), format!("{} {}", g.code(), g.title()));
        }
        assert!(Guarantee::S2 < Guarantee::S10, "ordered by number");
    }
}
