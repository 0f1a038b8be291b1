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
//! One `always` property per [`Guarantee`], named by
//! [`Guarantee::property_name`] ("S1 nothing lost", ...): it fails in a
//! state that breaks the guarantee ([`invariants::state`]: S2–S8) or, in a
//! final state (no action enabled: faults spent, every role idle), that
//! breaks it at rest ([`invariants::quiescent`]: S1, S5, S9, S10).
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
use pelican_model::invariants::Guarantee;
use pelican_model::status::{ErrorClass, RunStatus};
use pelican_model::time::Timestamp;
use state::{Action, State};
use stateright::{Model, Property};

/// The instant every command runs at (see "Time" above). Far larger than
/// every policy duration, so an aged deadline is always in the past.
pub const NOW: Timestamp = Timestamp(1_000_000_000);

/// The model: a configuration.
#[derive(Clone, Debug)]
pub struct PelicanModel {
    /// What is explored.
    pub cfg: Config,
}

impl PelicanModel {
    /// A model of `cfg`.
    #[must_use]
    pub fn new(cfg: Config) -> Self {
        PelicanModel { cfg }
    }

    fn is_final(&self, s: &State) -> bool {
        s.derived(&self.cfg).is_final
    }

    /// Whether `g` holds in `s`: broken neither in this state nor, if it is
    /// final, at rest (see "Properties" above).
    fn holds(&self, s: &State, g: Guarantee) -> bool {
        let d = s.derived(&self.cfg);
        let bit = state::guarantee_bit(g);
        (d.broken | d.broken_at_rest) & bit == 0
    }

    /// The names of the `always` properties, in order: one per guarantee.
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
];

/// Whether some run has consecutive attempts whose dispatches satisfy
/// `pred(earlier, later)` (they are neighbours in the key order).
fn attempts_pair(s: &State, pred: impl Fn(u32, u32) -> bool) -> bool {
    let attempts = &s.world.db.attempts;
    attempts.iter().zip(attempts.iter().skip(1)).any(
        |(((run, n), earlier), ((next_run, m), later))| {
            run == next_run && n.0 + 1 == m.0 && pred(earlier.dispatch.0, later.dispatch.0)
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
        let mut properties: Vec<Property<Self>> = Guarantee::ALL
            .into_iter()
            .zip(HOLDS)
            .map(|(g, holds)| Property::always(g.property_name(), holds))
            .collect();
        properties.extend([
            Property::sometimes("reclaim takes over a stalled attempt", |_, s: &State| {
                attempts_pair(s, |prev, next| prev == next)
            }),
            Property::sometimes("late write rejected", |_, s: &State| {
                s.seen.late_write_rejected
            }),
            Property::sometimes("retry scheduled and re-published", |_, s: &State| {
                attempts_pair(s, |prev, next| next > prev)
            }),
            Property::sometimes("dead letter", |_, s: &State| {
                !s.world.db.dead_letters.is_empty()
            }),
            Property::sometimes("cancel beats a running attempt", |_, s: &State| {
                s.seen.cancel_beat_result
            }),
            Property::sometimes("trimmed entry recovered", |_, s: &State| {
                s.seen.trimmed_recovered
            }),
            Property::sometimes(
                "duplicate publication absorbed",
                |m: &PelicanModel, s: &State| {
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
            ),
            Property::sometimes(
                "recovery after total Redis loss",
                |m: &PelicanModel, s: &State| {
                    s.seen.redis_wiped
                        && m.is_final(s)
                        && s.world
                            .db
                            .runs
                            .values()
                            .any(|r| r.status == RunStatus::Succeeded && r.dispatch.0 > 1)
                },
            ),
            Property::sometimes("malformed entry quarantined", |_, s: &State| {
                !s.world.quarantined.is_empty()
            }),
        ]);
        if self.cfg.outcomes.contains(&OutcomeKind::Poison) {
            properties.push(Property::sometimes(
                "refused result fails its run",
                |_, s: &State| {
                    s.world.db.runs.values().any(|r| {
                        r.status == RunStatus::Failed
                            && r.error.as_ref().map(|e| e.0) == Some(ErrorClass::Unstorable)
                    })
                },
            ));
        }
        if self.cfg.outcomes.contains(&OutcomeKind::Unknown) {
            properties.push(Property::sometimes(
                "unknown error fails its run at the cap",
                |_, s: &State| s.seen.unknown_capped,
            ));
        }
        if !self.cfg.policy.kinds.is_empty() {
            properties.push(Property::sometimes(
                "spent budget fails its run",
                |_, s: &State| s.seen.budget_exhausted,
            ));
        }
        if self.cfg.steps {
            properties.push(Property::sometimes(
                "recorded step replayed",
                |_, s: &State| s.seen.step_replayed,
            ));
            properties.push(Property::sometimes(
                "late progress refused",
                |_, s: &State| s.seen.progress_refused,
            ));
        }
        if self.cfg.limits {
            properties.push(Property::sometimes(
                "a call waits for a held slot",
                |_, s: &State| s.seen.slot_waited,
            ));
        }
        if self.cfg.policy.partitions > 1 {
            properties.push(Property::sometimes(
                "reclaim takes over an attempt past partition 0",
                |_, s: &State| {
                    let attempts = &s.world.db.attempts;
                    attempts.iter().zip(attempts.iter().skip(1)).any(
                        |(((run, n), earlier), ((next_run, m), later))| {
                            run == next_run
                                && n.0 + 1 == m.0
                                && earlier.dispatch == later.dispatch
                                && later.entry_id.partition > 0
                        },
                    )
                },
            ));
        }
        if self.cfg.policy.keep_finished_ms > 0 {
            properties.push(Property::sometimes(
                "entry of a deleted run acknowledged",
                |_, s: &State| s.seen.retired_delivered,
            ));
        }
        properties
    }
}

#[cfg(test)]
mod tests;
