//! The checker's state and its transitions: the world, the role machines of
//! every process, and what is left of the fault budget.
//!
//! This module holds the [`State`] type, what the properties read off it
//! ([`Derived`]) and the initial state; the data types it is made of are in
//! `types`, the enabled actions in `actions`, their effect in `apply`, and
//! the symmetry reduction (fingerprints, relabeling) in `symmetry`.

mod actions;
mod apply;
mod symmetry;
mod types;

pub use actions::Action;
pub use types::{ApiRun, Fate, Job, Proc, Seen, Source, WorkerProc};

use crate::NOW;
use crate::config::{Budget, Config};
use pelican_model::Db;
use pelican_model::ids::RunId;
use pelican_model::invariants::Guarantee;
use pelican_model::protocol::{JobEntry, StreamOp};
use pelican_model::world::{Issuer, World};
use serde::Serialize;
use std::hash::{Hash, Hasher};
use std::sync::OnceLock;

/// The whole state.
///
/// Its [`Hash`] is its fingerprint ([`State::fp`]), which stateright's
/// visited set keys on: with [`Config::symmetry`], one fingerprint for all
/// the states that differ only in which worker is which.
#[derive(Debug, Serialize)]
pub struct State {
    /// Redis, Postgres, effects, history.
    pub world: World,
    /// Worker processes.
    pub workers: Vec<Proc>,
    /// The API, per run.
    pub api: Vec<ApiRun>,
    /// Faults left.
    pub budget: Budget,
    /// History flags.
    pub seen: Seen,
    /// What the properties read ([`State::derived`]) and the enabled
    /// actions: functions of the fields above, computed once, when the
    /// checker first evaluates a property of the state (most generated
    /// states are repeats, whose properties are never evaluated).
    #[serde(skip)]
    derived: OnceLock<(Derived, Vec<Action>)>,
    /// The fingerprint: a hash of every field above but `derived` (see
    /// [`State::fingerprint`]), computed once per transition.
    #[serde(skip)]
    pub fp: u64,
}

/// A clone leaves [`State::derived`] to be computed again: the checker
/// clones a state to step it, and the step changes what it derives from
/// (copying the parent's enabled actions would only be thrown away).
impl Clone for State {
    fn clone(&self) -> State {
        State {
            world: self.world.clone(),
            workers: self.workers.clone(),
            api: self.api.clone(),
            budget: self.budget,
            seen: self.seen,
            derived: OnceLock::new(),
            fp: self.fp,
        }
    }
}

impl Hash for State {
    fn hash<H: Hasher>(&self, h: &mut H) {
        h.write_u64(self.fp);
    }
}

/// Equal states: equal in every field but the two computed from the rest.
impl PartialEq for State {
    fn eq(&self, other: &State) -> bool {
        let State {
            world,
            workers,
            api,
            budget,
            seen,
            derived: _,
            fp: _,
        } = self;
        *world == other.world
            && *workers == other.workers
            && *api == other.api
            && *budget == other.budget
            && *seen == other.seen
    }
}

impl Eq for State {}

/// The properties' inputs, derived from the rest of the state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
pub struct Derived {
    /// No action is enabled.
    pub is_final: bool,
    /// Guarantees broken in this state (bit `n` for S`n`).
    pub broken: u32,
    /// Guarantees broken at rest (only set in final states).
    pub broken_at_rest: u32,
}

/// Bit `n` for guarantee S`n`.
#[must_use]
pub fn guarantee_bit(g: Guarantee) -> u32 {
    1 << g.number()
}

// Every guarantee has its bit in a `u32`.
const _: () = {
    let mut i = 0;
    while i < Guarantee::ALL.len() {
        assert!(
            Guarantee::ALL[i].number() < 32,
            "one bit per guarantee in a u32"
        );
        i += 1;
    }
};

/// The schedules configuration's schedule: every second, overlap
/// `cancel`, catch-up `one`; its first tick 1 s before [`NOW`] (missed,
/// with the configuration's 500 ms of catch-up), its second at [`NOW`].
fn schedule(db: &mut Db) {
    use pelican_model::db::NewSchedule;
    use pelican_model::schedule::{Catchup, Overlap};
    db.put_schedule(&NewSchedule {
        name: "every-second",
        kind: "",
        input: "",
        cron: "* * * * * *",
        tz: "UTC",
        overlap: Overlap::Cancel,
        catchup: Catchup::One,
    });
    for s in db.schedules.values_mut() {
        s.next_tick = NOW.sub_ms(1_000);
    }
}

fn run_id(n: u8) -> RunId {
    RunId(u64::from(n) + 1)
}

impl State {
    /// The initial state: empty Redis (with the group), empty Postgres.
    #[must_use]
    pub fn initial(cfg: &Config) -> State {
        let mut world = World::partitioned(cfg.policy.partitions);
        world.db.clock = NOW;
        // The API's ids (`run_id(n)`) were handed out by the sequence.
        world.db.run_ids = u64::from(cfg.runs);
        for _ in 0..cfg.faults.malformed {
            // Malformed entries are there from the start: where they stand
            // among the runs' entries changes nothing but the interleaving.
            let entry = JobEntry::Malformed {
                reason: "missing run_id".into(),
            };
            let _ = world.stream(
                &StreamOp::Publish {
                    partition: 0,
                    entry,
                    now: NOW,
                },
                Issuer::default(),
            );
        }
        if cfg.schedules {
            schedule(&mut world.db);
        }
        let mut s = State {
            world,
            workers: (0..cfg.workers)
                .map(|w| Proc::new(WorkerProc::new(cfg, w)))
                .collect(),
            api: vec![ApiRun::NotYet; usize::from(cfg.runs)],
            budget: cfg.faults,
            seen: Seen::default(),
            derived: OnceLock::new(),
            fp: 0,
        };
        s.derive(cfg);
        s
    }

    /// Computes the fields that are functions of the rest: the fingerprint
    /// now, [`State::derived`] on first use.
    fn derive(&mut self, cfg: &Config) {
        self.derived = OnceLock::new();
        self.fp = self.fingerprint(cfg.symmetry);
    }

    /// What the properties read about this state (computed on first use).
    pub fn derived(&self, cfg: &Config) -> Derived {
        self.derived.get_or_init(|| self.compute(cfg)).0
    }

    /// The enabled actions (see [`State::actions`]), computed once with
    /// [`State::derived`]: the checker asks for both of every state it
    /// explores.
    pub fn enabled(&self, cfg: &Config) -> &[Action] {
        &self.derived.get_or_init(|| self.compute(cfg)).1
    }

    /// What the properties read about this state, computed afresh.
    #[must_use]
    pub fn compute_derived(&self, cfg: &Config) -> Derived {
        self.compute(cfg).0
    }

    fn compute(&self, cfg: &Config) -> (Derived, Vec<Action>) {
        let mut actions = Vec::new();
        self.actions(cfg, &mut actions);
        let bits = |bs: Vec<pelican_model::invariants::Broken>| {
            bs.iter().fold(0, |acc, b| acc | guarantee_bit(b.guarantee))
        };
        let is_final = actions.is_empty();
        let derived = Derived {
            is_final,
            broken: bits(pelican_model::invariants::state(&self.world, &cfg.policy)),
            broken_at_rest: if is_final {
                bits(pelican_model::invariants::quiescent(&self.world, &|_| 1))
            } else {
                0
            },
        };
        (derived, actions)
    }
}
