//! The guarantees S1–S10 as functions over a [`World`].
//!
//! Step guarantees (S2, S3, S4, S5, S7, S8) are checked as commands execute
//! and recorded in [`World::violations`]; [`state`] adds the ones that are
//! facts about a single state, and [`quiescent`] the ones that must hold once
//! faults stop and nothing is left to do (S1, S9).

use crate::protocol::{JobEntry, Policy};
use crate::status::RunStatus;
use crate::world::World;

/// One broken guarantee, for reports.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Broken {
    /// "S1" .. "S10".
    pub guarantee: &'static str,
    /// What exactly.
    pub detail: String,
}

fn broken(guarantee: &'static str, detail: String) -> Broken {
    Broken { guarantee, detail }
}

/// Everything wrong with this state regardless of progress: the recorded
/// step violations, plus S6 (attempts within bounds, no run left running
/// after its attempt's outcome was recorded, dead runs have dead letters).
#[must_use]
pub fn state(world: &World, policy: &Policy) -> Vec<Broken> {
    let mut out: Vec<Broken> = world
        .violations
        .iter()
        .map(|v| broken(v.guarantee(), format!("{v:?}")))
        .collect();
    for r in world.db.runs.values() {
        if r.attempts > policy.attempts_max {
            out.push(broken(
                "S6",
                format!(
                    "{} has {} attempts > {}",
                    r.run_id, r.attempts, policy.attempts_max
                ),
            ));
        }
        if r.status == RunStatus::Running {
            let active = world
                .db
                .attempts
                .range(
                    (r.run_id, crate::ids::AttemptNo(0))
                        ..=(r.run_id, crate::ids::AttemptNo(u32::MAX)),
                )
                .find(|(_, a)| a.fence == r.active_fence);
            if active.is_some_and(|(_, a)| a.outcome.is_some()) {
                out.push(broken("S6", format!("{} is running after its attempt's outcome was recorded (retry left in the PEL)", r.run_id)));
            }
        }
        if r.status == RunStatus::Dead && !world.db.dead_letters.contains_key(&r.run_id) {
            out.push(broken(
                "S6",
                format!("{} is dead without a dead-letter record", r.run_id),
            ));
        }
    }
    out
}

/// What must hold once faults have stopped and no role has anything left to
/// do: every accepted run is terminal (S1), the PEL is empty (S9), every
/// malformed entry was quarantined (S10), and every succeeded run's side
/// effects were applied exactly once (S5). `effects_of(run)` is how many
/// tool calls `run`'s job makes when it succeeds.
#[must_use]
pub fn quiescent(world: &World, effects_of: &dyn Fn(crate::ids::RunId) -> u32) -> Vec<Broken> {
    let mut out = Vec::new();
    for run in &world.accepted {
        match world.db.runs.get(run) {
            None => out.push(broken("S1", format!("{run} was accepted but has no row"))),
            Some(r) if !r.status.is_terminal() => {
                out.push(broken(
                    "S1",
                    format!("{run} is stuck {} (dispatch {})", r.status, r.dispatch.0),
                ));
            }
            Some(r) if r.status == RunStatus::Succeeded => {
                for call in 0..effects_of(*run) {
                    let n = world.effects.get(&(*run, call)).copied().unwrap_or(0);
                    if n != 1 {
                        out.push(broken(
                            "S5",
                            format!("{run} succeeded with effect {call} applied {n} times"),
                        ));
                    }
                }
            }
            Some(_) => {}
        }
    }
    let pel = world.redis.jobs.pel_len();
    if pel > 0 {
        out.push(broken("S9", format!("{pel} entries left pending")));
    }
    for (id, e) in &world.entries {
        if matches!(e, JobEntry::Malformed { .. })
            && world.redis.jobs.entries.contains_key(id)
            && !world.quarantined.contains(id)
        {
            out.push(broken(
                "S10",
                format!("malformed entry {id} was never quarantined"),
            ));
        }
    }
    out
}
