//! Running the checker and reporting what it found.

use crate::state::{Action, State, guarantee_bit};
use crate::{Config, EVERY_GUARANTEE, PelicanModel, timeline};
use pelican_model::invariants::{self, Guarantee};
use pelican_model::protocol::Mutant;
use serde::Serialize;
use stateright::{Checker, HasDiscoveries, Model, Path, Property};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// How to run the checker.
#[derive(Clone, Debug)]
pub struct Options {
    /// Worker threads.
    pub threads: usize,
    /// Stop after this long (the result is then incomplete).
    pub timeout: Option<Duration>,
    /// Stop at the first failing property (mutant hunting).
    pub stop_at_failure: bool,
    /// Call this about every 250 ms with (unique states, states, depth).
    pub progress: Option<fn(usize, usize, usize, Duration)>,
    /// Breadth first (shortest counterexamples, more memory) or depth first.
    pub bfs: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            threads: std::thread::available_parallelism().map_or(1, std::num::NonZero::get),
            timeout: None,
            stop_at_failure: false,
            progress: None,
            bfs: false,
        }
    }
}

/// A property's verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// `always`, no counterexample.
    Holds,
    /// `always`, counterexample found.
    Violated,
    /// `sometimes`, example found.
    Reached,
    /// `sometimes`, no example found.
    Unreached,
}

impl Verdict {
    /// An `always` property's verdict: whether a counterexample was found.
    fn always(found: bool) -> Verdict {
        if found {
            Verdict::Violated
        } else {
            Verdict::Holds
        }
    }

    /// A `sometimes` property's verdict: whether an example was found.
    fn sometimes(found: bool) -> Verdict {
        if found {
            Verdict::Reached
        } else {
            Verdict::Unreached
        }
    }
}

/// A counterexample.
#[derive(Clone, Debug, Serialize)]
pub struct Counterexample {
    /// The property.
    pub property: String,
    /// Steps.
    pub path_len: usize,
    /// The numbered timeline.
    pub timeline: String,
    /// What the invariants say about the last state.
    pub broken: Vec<String>,
    /// stateright's action path.
    pub actions: Vec<String>,
}

/// What one check found.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// Configuration name.
    pub config: String,
    /// Mutant, if any.
    pub mutant: Option<String>,
    /// Whether every reachable state was explored.
    pub complete: bool,
    /// Unique states.
    pub unique_states: usize,
    /// States generated, with repeats.
    pub states: usize,
    /// Longest path explored.
    pub max_depth: usize,
    /// Wall-clock seconds.
    pub seconds: f64,
    /// Unique states per second.
    pub states_per_s: f64,
    /// Verdict per property.
    pub properties: BTreeMap<String, Verdict>,
    /// Counterexamples of violated `always` properties.
    pub counterexamples: Vec<Counterexample>,
}

impl Report {
    /// Whether every `always` property holds (and, on a complete run,
    /// every `sometimes` property was reached).
    #[must_use]
    pub fn passed(&self) -> bool {
        self.properties
            .values()
            .all(|v| matches!(v, Verdict::Holds | Verdict::Reached))
    }

    /// The shortest counterexample, if any.
    #[must_use]
    pub fn shortest(&self) -> Option<&Counterexample> {
        self.counterexamples.iter().min_by_key(|c| c.path_len)
    }
}

/// Checks `cfg`: with one property for every guarantee
/// ([`crate::EVERY_GUARANTEE`]), which stops at the first counterexample
/// (stateright stops once each of its properties has a discovery), and, if
/// it found one and `opts` do not stop there, once more with one property
/// per guarantee, whose report it returns (every guarantee's own verdict
/// and counterexample).
#[must_use]
pub fn check(cfg: &Config, opts: &Options) -> Report {
    let report = check_model(PelicanModel::new(cfg.clone()), opts);
    if !opts.stop_at_failure && !report.counterexamples.is_empty() {
        return check_model(PelicanModel::new(cfg.clone()).plain(), opts);
    }
    report
}

/// Checks `model` once, with its own properties.
pub(crate) fn check_model(model: PelicanModel, opts: &Options) -> Report {
    let cfg = &model.cfg.clone();
    let mut builder = model.clone().checker().threads(opts.threads.max(1));
    if let Some(t) = opts.timeout {
        builder = builder.timeout(t);
    }
    if opts.stop_at_failure {
        builder = builder.finish_when(HasDiscoveries::AnyFailures);
    }
    let started = Instant::now();
    if opts.bfs {
        finish(&model, cfg, opts, started, builder.spawn_bfs())
    } else {
        finish(&model, cfg, opts, started, builder.spawn_dfs())
    }
}

fn finish(
    model: &PelicanModel,
    cfg: &Config,
    opts: &Options,
    started: Instant,
    checker: impl Checker<PelicanModel>,
) -> Report {
    let properties = model.properties();
    let mut nap = Duration::from_millis(5);
    while !checker.is_done() {
        std::thread::sleep(nap);
        nap = (nap * 2).min(Duration::from_millis(250));
        if let Some(progress) = opts.progress {
            progress(
                checker.unique_state_count(),
                checker.state_count(),
                checker.max_depth(),
                started.elapsed(),
            );
        }
    }
    let checker = checker.join();
    let seconds = started.elapsed().as_secs_f64();
    let discoveries = checker.discoveries();
    let timed_out = opts.timeout.is_some_and(|t| started.elapsed() >= t);
    let mut verdicts = BTreeMap::new();
    let mut counterexamples = Vec::new();
    let mut failed = false;
    for p in &properties {
        let found = discoveries.get(p.name);
        if p.name == EVERY_GUARANTEE {
            let found = found.map(|path| counterexample(model, p.name, path.clone()));
            let broken = found.as_ref().map_or(0, |(_, broken)| *broken);
            for g in Guarantee::ALL {
                let verdict = Verdict::always(broken & guarantee_bit(g) != 0);
                verdicts.insert(g.property_name().to_owned(), verdict);
            }
            if let Some((c, _)) = found {
                failed = true;
                counterexamples.push(c);
            }
            continue;
        }
        let always = p.expectation.discovery_is_failure();
        let verdict = if always {
            Verdict::always(found.is_some())
        } else {
            Verdict::sometimes(found.is_some())
        };
        if let (true, Some(path)) = (always, found) {
            failed = true;
            counterexamples.push(counterexample(model, p.name, path.clone()).0);
        }
        verdicts.insert(p.name.to_owned(), verdict);
    }
    if !model.plain {
        for (name, reached) in checker.model().reached() {
            verdicts.insert(name.to_owned(), Verdict::sometimes(reached));
        }
    }
    let unique = checker.unique_state_count();
    Report {
        config: cfg.name.clone(),
        mutant: cfg.policy.mutant.map(|m| m.name().to_owned()),
        complete: !(timed_out || (failed && (opts.stop_at_failure || !model.plain))),
        unique_states: unique,
        states: checker.state_count(),
        max_depth: checker.max_depth(),
        seconds,
        states_per_s: unique as f64 / seconds.max(1e-9),
        properties: verdicts,
        counterexamples,
    }
}

/// Replays `actions` from the initial state; returns the states up to the
/// first one that breaks `property`, or `None` if an action is not enabled
/// where it is taken or the property never breaks.
fn replay(
    model: &PelicanModel,
    property: &Property<PelicanModel>,
    actions: &[Action],
) -> Option<Vec<State>> {
    let mut states = model.init_states();
    states.truncate(1);
    let mut enabled = Vec::new();
    for a in actions {
        let last = states.last().expect("starts with the initial state");
        if !(property.condition)(model, last) {
            return Some(states);
        }
        enabled.clear();
        model.actions(last, &mut enabled);
        if !enabled.contains(a) {
            return None;
        }
        let next = model
            .next_state(last, *a)
            .expect("every action has a next state");
        states.push(next);
    }
    let last = states.last().expect("starts with the initial state");
    (!(property.condition)(model, last)).then_some(states)
}

/// Shrinks a counterexample: drops windows of consecutive steps (largest
/// first, down to single steps), keeping each drop after which the replayed
/// path still breaks the property, until nothing more can go. (stateright's
/// BFS hands work out in blocks, so its paths are not always shortest.)
fn shrink(
    model: &PelicanModel,
    property: &Property<PelicanModel>,
    mut actions: Vec<Action>,
) -> (Vec<State>, Vec<Action>) {
    let mut states =
        replay(model, property, &actions).expect("the checker's path breaks the property");
    actions.truncate(states.len() - 1);
    let mut width = actions.len().max(1);
    while width > 0 {
        let mut i = 0;
        let mut shrunk = false;
        while i + width <= actions.len() {
            let mut candidate = actions.clone();
            candidate.drain(i..i + width);
            if let Some(shorter) = replay(model, property, &candidate) {
                candidate.truncate(shorter.len() - 1);
                actions = candidate;
                states = shorter;
                shrunk = true;
            } else {
                i += 1;
            }
        }
        if !shrunk {
            width -= 1;
        }
    }
    (states, actions)
}

/// The shrunk counterexample of `property` on `path`, and the guarantees
/// its last state breaks ([`guarantee_bit`]s). A counterexample of
/// [`EVERY_GUARANTEE`] is named by the guarantees it breaks.
fn counterexample(
    model: &PelicanModel,
    property: &str,
    path: Path<State, Action>,
) -> (Counterexample, u32) {
    let prop = model
        .properties()
        .into_iter()
        .find(|p| p.name == property)
        .expect("a discovered property exists");
    let (states, actions) = shrink(model, &prop, path.into_actions());
    let last = states.last().expect("a path has a state");
    let mut broken: Vec<String> = invariants::state(&last.world, &model.cfg.policy)
        .into_iter()
        .chain(invariants::quiescent(&last.world, &|_| 1))
        .map(|b| format!("{}: {}", b.guarantee, b.detail))
        .collect();
    broken.dedup();
    let bits = model.broken(last);
    let property = if property == EVERY_GUARANTEE {
        Guarantee::ALL
            .into_iter()
            .filter(|g| bits & guarantee_bit(*g) != 0)
            .map(Guarantee::property_name)
            .collect::<Vec<_>>()
            .join(", ")
    } else {
        property.to_owned()
    };
    let c = Counterexample {
        property,
        path_len: actions.len(),
        timeline: timeline::render(&states, &actions),
        broken,
        actions: actions.iter().map(|a| format!("{a:?}")).collect(),
    };
    (c, bits)
}

/// A mutant's result.
#[derive(Clone, Debug, Serialize)]
pub struct MutantResult {
    /// Whether a property failed.
    pub caught: bool,
    /// The shortest counterexample's length.
    pub path_len: Option<usize>,
    /// The properties it broke first.
    pub property: Option<String>,
    /// Seconds spent.
    pub seconds: f64,
}

/// Checks `cfg` once per mutant, stopping each at its first failure.
#[must_use]
pub fn hunt(
    cfg: &Config,
    opts: &Options,
    mutants: &[Mutant],
) -> BTreeMap<String, (MutantResult, Report)> {
    let opts = Options {
        stop_at_failure: true,
        ..opts.clone()
    };
    mutants
        .iter()
        .map(|m| {
            let report = check(&cfg.clone().with_mutant(Some(*m)), &opts);
            let shortest = report.shortest();
            let result = MutantResult {
                caught: shortest.is_some(),
                path_len: shortest.map(|c| c.path_len),
                property: shortest.map(|c| c.property.clone()),
                seconds: report.seconds,
            };
            (m.name().to_owned(), (result, report))
        })
        .collect()
}
