//! # pelican-checker: the stateright model of Pelican's recovery protocol
//!
//! The model composes the very role machines of `pelican-model` — the
//! worker's [`Delivery`](pelican_model::protocol::Delivery), the
//! [`Reclaimer`](pelican_model::protocol::Reclaimer),
//! [`Maintenance`](pelican_model::protocol::Maintenance) and the
//! [`Submitter`](pelican_model::protocol::Submitter) — with the reference
//! [`World`](pelican_model::world::World), and lets stateright explore every
//! interleaving of their steps with every fault of a bounded
//! [`Config`]: crashes at any step, pauses past the lease, lost requests and
//! replies, Redis wipes and partial loss, trims below pending IDs, duplicate
//! publications, cancels, job outcomes and malformed entries.
//!
//! ## Time
//!
//! The clock is abstract. Every command runs at the same instant [`NOW`],
//! and the `Tick` action means "a long time passes": it ages every stored
//! deadline (leases, `retry_at`, publication times, PEL delivery times) to the
//! epoch, so each lease expires, each retry falls due and each delivery
//! becomes idle — through the same comparisons the statements and commands
//! make. States stay finite without bounding time, and every race between a
//! lease and its holder (a pause, a late heartbeat) is explored.
//!
//! ## Properties
//!
//! Each [`Guarantee`] has a verdict, named by
//! [`Guarantee::property_name`] ("S1 nothing lost", ...): it is broken in a
//! state that breaks the guarantee ([`invariants::state`]: S2–S8) or, in a
//! final state (no action enabled: faults spent, every role idle), that
//! breaks it at rest ([`invariants::quiescent`]: S1, S5, S9, S10). The
//! checker explores with one `always` property for them all
//! ([`EVERY_GUARANTEE`]); a report gives each guarantee its own verdict.
//! `sometimes` properties show the interesting paths are reached.
//!
//! [`invariants::state`]: pelican_model::invariants::state
//! [`invariants::quiescent`]: pelican_model::invariants::quiescent

#![warn(missing_docs)]

pub mod config;
pub mod report;
pub mod state;
pub mod timeline;

pub use config::{Config, OutcomeKind};
use pelican_model::db::AttemptRow;
use pelican_model::invariants::Guarantee;
use pelican_model::status::{ErrorClass, RunStatus};
use pelican_model::time::Timestamp;
use state::{Action, State};
use stateright::{Model, Property};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// The instant every command runs at (see "Time" above). Far larger than
/// every policy duration, so an aged deadline is always in the past.
pub const NOW: Timestamp = Timestamp(1_000_000_000);

/// The model: a configuration.
#[derive(Clone, Debug)]
pub struct PelicanModel {
    /// What is explored.
    pub cfg: Config,
    /// Properties as stateright means them ([`PelicanModel::plain`]).
    pub(crate) plain: bool,
    /// The entries of [`SOMETIMES`] `cfg` explores, bit `i` for entry `i`.
    explored: u32,
    witnessed: Witnessed,
}

/// The name of the one property a check gives stateright, instead of one
/// per guarantee and one per `sometimes` property: every guarantee holds.
///
/// stateright looks up each property's discoveries in a shared map for
/// every state it explores (a hash and a shared lock each), whether or not
/// the property has anything left to find, and records the path to every
/// state where a `sometimes` property holds (most read history flags,
/// which stay set in every later state). So the model keeps the
/// `sometimes` properties itself: evaluating this property also notes, in
/// flags its threads share, which of them the state reaches, skipping those
/// reached already. One property holds exactly where all the guarantees
/// do, so a check that passes says the same of each. When it fails, the
/// report names the guarantees its counterexample breaks, and a check that
/// does not stop at its first failure runs again with one property per
/// guarantee
/// ([`PelicanModel::plain`]) to give each its own verdict. A `sometimes`
/// property needs no path: the report says whether it was reached.
pub const EVERY_GUARANTEE: &str = "every guarantee";

impl PelicanModel {
    /// A model of `cfg`, with one `always` property for all guarantees.
    #[must_use]
    pub fn new(cfg: Config) -> Self {
        let explored = SOMETIMES
            .iter()
            .enumerate()
            .filter(|(_, p)| (p.explored)(&cfg))
            .fold(0, |bits, (i, _)| bits | 1 << i);
        PelicanModel {
            cfg,
            plain: false,
            explored,
            witnessed: Witnessed::default(),
        }
    }

    /// The same model with every property given to stateright: one
    /// `always` property per guarantee, named by
    /// [`Guarantee::property_name`], and one per `sometimes` property (as
    /// the Explorer shows them).
    #[must_use]
    pub fn plain(self) -> Self {
        PelicanModel {
            plain: true,
            ..self
        }
    }

    /// Records which `sometimes` properties `s` reaches, of those not yet
    /// reached (see [`EVERY_GUARANTEE`]).
    fn witness(&self, s: &State) {
        for (p, reached) in self.sometimes() {
            if !reached.load(Ordering::Relaxed) && (p.reached)(self, s) {
                reached.store(true, Ordering::Relaxed);
            }
        }
    }

    /// The `sometimes` properties this configuration explores, each with
    /// its flag in [`Witnessed`].
    fn sometimes(&self) -> impl Iterator<Item = (&'static Sometimes, &AtomicBool)> {
        SOMETIMES
            .iter()
            .zip(self.witnessed.0.iter())
            .enumerate()
            .filter(|(i, _)| self.explored & 1 << i != 0)
            .map(|(_, entry)| entry)
    }

    /// The `sometimes` properties this configuration explores, and whether
    /// a check of this model has reached each (never, for a
    /// [`PelicanModel::plain`] one: stateright has those properties).
    #[must_use]
    pub fn reached(&self) -> Vec<(&'static str, bool)> {
        self.sometimes()
            .map(|(p, reached)| (p.name, reached.load(Ordering::Relaxed)))
            .collect()
    }

    fn is_final(&self, s: &State) -> bool {
        s.derived(&self.cfg).is_final
    }

    /// The guarantees `s` breaks, as [`state::guarantee_bit`]s: in this state
    /// or, if it is final, at rest (see "Properties" above).
    #[must_use]
    pub fn broken(&self, s: &State) -> u32 {
        let d = s.derived(&self.cfg);
        d.broken | d.broken_at_rest
    }

    /// Whether `g` holds in `s`.
    fn holds(&self, s: &State, g: Guarantee) -> bool {
        self.broken(s) & state::guarantee_bit(g) == 0
    }

    /// The names of the guarantees' `always` properties, in order.
    pub const ALWAYS: [&'static str; Guarantee::ALL.len()] = {
        let mut names = [""; Guarantee::ALL.len()];
        let mut i = 0;
        while i < names.len() {
            names[i] = Guarantee::ALL[i].property_name();
            i += 1;
        }
        names
    };
}

/// The condition of the `always` property of `Guarantee::ALL[I]`.
/// (Stateright takes a condition as a `fn` pointer, which cannot capture
/// the guarantee: hence one instance per index.)
fn holds<const I: usize>(m: &PelicanModel, s: &State) -> bool {
    m.holds(s, Guarantee::ALL[I])
}

/// The conditions of the `always` properties, in the order of
/// [`Guarantee::ALL`] (a new guarantee makes this table one short: add
/// its index).
const HOLDS: [fn(&PelicanModel, &State) -> bool; Guarantee::ALL.len()] = [
    holds::<0>,
    holds::<1>,
    holds::<2>,
    holds::<3>,
    holds::<4>,
    holds::<5>,
    holds::<6>,
    holds::<7>,
    holds::<8>,
    holds::<9>,
    holds::<10>,
    holds::<11>,
    holds::<12>,
    holds::<13>,
    holds::<14>,
    holds::<15>,
];

/// Whether some run has consecutive attempts that satisfy
/// `pred(earlier, later)` (they are neighbours in the key order).
fn attempts_pair(s: &State, pred: impl Fn(&AttemptRow, &AttemptRow) -> bool) -> bool {
    let attempts = &s.world.db.attempts;
    attempts.iter().zip(attempts.iter().skip(1)).any(
        |(((run, n), earlier), ((next_run, m), later))| {
            run == next_run && n.0 + 1 == m.0 && pred(earlier, later)
        },
    )
}

impl Model for PelicanModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State::initial(&self.cfg)]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        actions.extend_from_slice(state.enabled(&self.cfg));
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut next = last.clone();
        next.step(&self.cfg, action);
        Some(next)
    }

    fn format_action(&self, action: &Action) -> String {
        format!("{action:?}")
    }

    fn format_step(&self, last: &State, action: Action) -> Option<String> {
        Some(timeline::describe(last, action))
    }

    fn properties(&self) -> Vec<Property<Self>> {
        if !self.plain {
            return vec![Property::always(EVERY_GUARANTEE, |m, s| {
                m.witness(s);
                m.broken(s) == 0
            })];
        }
        let mut properties: Vec<Property<Self>> = Guarantee::ALL
            .into_iter()
            .zip(HOLDS)
            .map(|(g, holds)| Property::always(g.property_name(), holds))
            .collect();
        properties.extend(
            self.sometimes()
                .map(|(p, _)| Property::sometimes(p.name, p.reached)),
        );
        properties
    }
}

/// A `sometimes` property: a path the exploration must reach.
struct Sometimes {
    name: &'static str,
    /// Whether the configuration can reach it at all.
    explored: fn(&Config) -> bool,
    reached: fn(&PelicanModel, &State) -> bool,
}

const ALWAYS_EXPLORED: fn(&Config) -> bool = |_| true;

/// The `sometimes` properties, each with the configurations that explore it
/// (at most 32: [`PelicanModel::explored`] has a bit for each).
const SOMETIMES: [Sometimes; 23] =
    [
        Sometimes {
            name: "schedule's tick run ended",
            explored: |cfg| cfg.schedules,
            reached: |_, s| {
                s.world.db.runs.values().any(|r| {
                    pelican_model::schedule::tick_of(r.run_id).is_some() && r.status.is_terminal()
                })
            },
        },
        Sometimes {
            name: "schedule's tick cancelled the previous tick's live run",
            explored: |cfg| cfg.schedules,
            reached: |_, s| {
                s.world.db.schedules.values().any(|sc| sc.fired == 2)
                    && s.world.db.runs.values().any(|r| {
                        pelican_model::schedule::tick_of(r.run_id).is_some()
                            && r.status == RunStatus::Cancelled
                    })
            },
        },
        Sometimes {
            name: "delayed run started when due",
            explored: |cfg| cfg.delays,
            reached: |_, s| {
                s.world
                    .db
                    .runs
                    .values()
                    .any(|r| r.due_at.is_some() && r.attempts > 0)
            },
        },
        Sometimes {
            name: "delayed run cancelled while it waits",
            explored: |cfg| cfg.delays && cfg.faults.cancels > 0,
            reached: |_, s| {
                s.world.db.runs.values().any(|r| {
                    r.due_at.is_some() && r.status == RunStatus::Cancelled && r.attempts == 0
                })
            },
        },
        Sometimes {
            name: "reclaim takes over a stalled attempt",
            explored: ALWAYS_EXPLORED,
            reached: |_, s| attempts_pair(s, |prev, next| prev.dispatch == next.dispatch),
        },
        Sometimes {
            name: "late write rejected",
            explored: ALWAYS_EXPLORED,
            reached: |_, s| s.seen.late_write_rejected,
        },
        Sometimes {
            name: "retry scheduled and re-published",
            explored: ALWAYS_EXPLORED,
            reached: |_, s| attempts_pair(s, |prev, next| next.dispatch > prev.dispatch),
        },
        Sometimes {
            name: "dead letter",
            explored: ALWAYS_EXPLORED,
            reached: |_, s| !s.world.db.dead_letters.is_empty(),
        },
        Sometimes {
            name: "cancel beats a running attempt",
            explored: ALWAYS_EXPLORED,
            reached: |_, s| s.seen.cancel_beat_result,
        },
        Sometimes {
            name: "trimmed entry recovered",
            // Reported once idle: the holder must be gone too (two faults).
            explored: |cfg| {
                cfg.faults.trims > 0
                    && cfg.faults.crashes + cfg.faults.pauses > 0
                    && cfg.faults.total >= 2
            },
            reached: |_, s| s.seen.trimmed_recovered,
        },
        Sometimes {
            name: "duplicate publication absorbed",
            explored: ALWAYS_EXPLORED,
            reached: |m, s| {
                m.is_final(s) && {
                    let mut seen = std::collections::BTreeSet::new();
                    s.world.entries.values().any(|e| !seen.insert(e.clone()))
                        && s.world
                            .db
                            .runs
                            .values()
                            .any(|r| r.status == RunStatus::Succeeded)
                }
            },
        },
        Sometimes {
            name: "recovery after total Redis loss",
            explored: ALWAYS_EXPLORED,
            reached: |m, s| {
                s.seen.redis_wiped
                    && m.is_final(s)
                    && s.world
                        .db
                        .runs
                        .values()
                        .any(|r| r.status == RunStatus::Succeeded && r.dispatch.0 > 1)
            },
        },
        Sometimes {
            name: "malformed entry quarantined",
            explored: ALWAYS_EXPLORED,
            reached: |_, s| !s.world.quarantined.is_empty(),
        },
        Sometimes {
            name: "refused result fails its run",
            explored: |cfg| cfg.outcomes.contains(&OutcomeKind::Poison),
            reached: |_, s| {
                s.world.db.runs.values().any(|r| {
                    r.status == RunStatus::Failed
                        && r.error.as_ref().map(|e| e.0) == Some(ErrorClass::Unstorable)
                })
            },
        },
        Sometimes {
            name: "unknown error fails its run at the cap",
            explored: |cfg| cfg.outcomes.contains(&OutcomeKind::Unknown),
            reached: |_, s| s.seen.unknown_capped,
        },
        Sometimes {
            name: "spent budget fails its run",
            explored: |cfg| !cfg.policy.kinds.is_empty(),
            reached: |_, s| s.seen.budget_exhausted,
        },
        Sometimes {
            name: "recorded step replayed",
            explored: |cfg| cfg.steps,
            reached: |_, s| s.seen.step_replayed,
        },
        Sometimes {
            name: "late progress refused",
            explored: |cfg| cfg.steps,
            reached: |_, s| s.seen.progress_refused,
        },
        Sometimes {
            name: "a call waits for a held slot",
            explored: |cfg| cfg.limits,
            reached: |_, s| s.seen.slot_waited,
        },
        Sometimes {
            name: "reclaim takes over an attempt past partition 0",
            explored: |cfg| cfg.policy.partitions > 1,
            reached: |_, s| {
                attempts_pair(s, |prev, next| {
                    prev.dispatch == next.dispatch && next.entry_id.partition > 0
                })
            },
        },
        Sometimes {
            name: "entry of a deleted run acknowledged",
            explored: |cfg| cfg.policy.keep_finished_ms > 0,
            reached: |_, s| s.seen.retired_delivered,
        },
        Sometimes {
            name: "a retry under a key answers its deleted run",
            explored: |cfg| cfg.policy.keep_finished_ms > 0,
            reached: |_, s| s.seen.key_outlived_run,
        },
        Sometimes {
            name: "an idle consumer forgotten",
            explored: |cfg| cfg.consumers,
            reached: |_, s| s.seen.consumer_forgotten,
        },
    ];

const _: () = assert!(SOMETIMES.len() <= 32, "one bit per entry in a u32");

/// Which `sometimes` properties a model has been found to reach, one flag
/// per entry of [`SOMETIMES`], shared by the checker's threads. A clone
/// starts with none: each checker is handed its own clone of the model and
/// must find its own witnesses.
#[derive(Debug)]
struct Witnessed(Arc<[AtomicBool; SOMETIMES.len()]>);

impl Default for Witnessed {
    fn default() -> Self {
        Witnessed(Arc::new(std::array::from_fn(|_| AtomicBool::new(false))))
    }
}

impl Clone for Witnessed {
    fn clone(&self) -> Self {
        Witnessed::default()
    }
}

/// A random walk's choices: from `seed`, an index below each `n` asked for
/// (a linear congruential generator, so that a walk repeats exactly and the
/// model's tree needs no RNG crate).
pub fn walk_picker(mut seed: u64) -> impl FnMut(usize) -> usize {
    move |n| {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        usize::try_from(seed >> 33).expect("31 bits fit a usize") % n
    }
}

#[cfg(test)]
mod tests;
