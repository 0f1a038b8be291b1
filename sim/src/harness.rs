//! Users' own job handlers under the simulator, from their own `cargo test`.
//!
//! A [`JobSim`] runs the handlers a crate registers on simulated workers,
//! submits a workload it draws from each seed, and puts the seed's world
//! through the standard nemesis: workers killed (also at every boundary of
//! every durable step: before its body, between the body and its record,
//! after the record), paused past their lease, cut off, Redis restarted or
//! wiped, Postgres restarted, requests and replies lost. Every guarantee
//! (S1-S11) is checked as the seed runs and at its end, and so is the
//! service outside Pelican the handlers call ([`External`]): each side
//! effect a run names is applied once, and a run that succeeded applied
//! all of its effects.
//!
//! ```ignore
//! #[test]
//! fn agent_runs_survive_the_simulator() {
//!     JobSim::new(|registry, external| my_jobs::register(registry, external.clone()))
//!         .submit(|random, _n| ("agent".into(), format!("{{\"topic\":{random}}}")))
//!         .effects(|_kind, _input| 2)
//!         .check(0..1_000);
//! }
//! ```
//!
//! A failing seed panics with a one-line command that replays it and
//! prints its timeline (`PELICAN_SIM_SEED=N cargo test ...`). Needs the
//! whole build under `--cfg madsim` (a crate's `.cargo/config.toml`).

use crate::net::{Client, EXTERNAL, ExternalCall, Reply, Request};
use crate::oracle::{Shared, lock};
use crate::scenario::Scenario;
use crate::seed::{SeedOutcome, run_jobs};
use pelican_model::ids::{Fence, RunId};
use pelican_model::protocol::Unavailable;
use pelican_real::driver::BoxFuture;
use pelican_real::jobs::{Registry, StepBoundary, StepHook};
use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;

type Register = dyn Fn(&mut Registry, &External) + Send + Sync;
type Submit = dyn Fn(u64, u32) -> (String, String) + Send + Sync;
type Effects = dyn Fn(&str, &str) -> u32 + Send + Sync;

/// What a seed's workers run and its API submits.
#[derive(Clone)]
pub(crate) struct Jobs {
    /// Registers the handlers on a worker's registry.
    pub(crate) register: Arc<Register>,
    /// Run `n`'s kind and input from a random number (`None`: the built-in
    /// kinds' plan).
    pub(crate) submit: Option<Arc<Submit>>,
    /// How many external effects a run applies when it succeeds.
    pub(crate) effects: Option<Arc<Effects>>,
    /// The chance that a worker dies at each step boundary.
    pub(crate) step_crash_p: f64,
}

impl Jobs {
    /// The built-in kinds and their plan: the simulator's own seeds.
    pub(crate) fn builtins() -> Jobs {
        Jobs {
            register: Arc::new(|r: &mut Registry, _: &External| {
                r.register_builtins();
                r.limit(crate::seed::PROVIDER, crate::seed::provider_limit());
            }),
            submit: None,
            effects: None,
            step_crash_p: 0.0,
        }
    }
}

/// The simulated service outside Pelican that handlers call: a model
/// provider, a payment API, a mailer. Requests cross the simulated
/// network, so they and their replies can be lost; an answer not heard
/// within the driver's call timeout is [`Unavailable`].
#[derive(Clone)]
pub struct External {
    client: Client,
    timeout: Duration,
}

impl External {
    pub(crate) fn new(client: Client, timeout: Duration) -> External {
        External { client, timeout }
    }

    /// Sends side effect `name` of `run` (charge the card, send the mail)
    /// under the idempotency key `key`. The service applies a key once and
    /// answers a key it has seen with its first answer. A run's effect
    /// `name` may be applied once: sent again without the key, or under a
    /// key that changed, it is applied twice and the seed fails (S5).
    ///
    /// # Errors
    /// No answer: the effect may or may not have been applied.
    pub async fn effect(
        &self,
        run: RunId,
        name: &str,
        key: Option<String>,
        body: &str,
    ) -> Result<String, Unavailable> {
        self.send(run, name, key, true, body).await
    }

    /// Sends query `name` of `run` (a model call): no effect to apply
    /// once, so every request is answered afresh ("model #2 for run-7" on
    /// the second request).
    ///
    /// # Errors
    /// No answer.
    pub async fn query(&self, run: RunId, name: &str, body: &str) -> Result<String, Unavailable> {
        self.send(run, name, None, false, body).await
    }

    async fn send(
        &self,
        run: RunId,
        name: &str,
        key: Option<String>,
        effect: bool,
        body: &str,
    ) -> Result<String, Unavailable> {
        let call = ExternalCall {
            run,
            name: name.to_owned(),
            key,
            effect,
            body: body.to_owned(),
        };
        let sent = self.client.call(EXTERNAL, Request::External(call));
        match tokio::time::timeout(self.timeout, sent).await {
            Ok(Ok(Reply::External(answer))) => Ok(answer),
            _ => Err(Unavailable),
        }
    }
}

/// Checks S11 as each step starts and kills the worker at step boundaries.
pub(crate) struct SimStepHook {
    oracle: Shared,
    worker: u32,
    crash_p: f64,
    crash: mpsc::UnboundedSender<u32>,
}

impl SimStepHook {
    pub(crate) fn new(
        oracle: Shared,
        worker: u32,
        crash_p: f64,
        crash: mpsc::UnboundedSender<u32>,
    ) -> SimStepHook {
        SimStepHook {
            oracle,
            worker,
            crash_p,
            crash,
        }
    }
}

impl StepHook for SimStepHook {
    fn at(
        &self,
        run: RunId,
        fence: Fence,
        step: u32,
        name: &str,
        at: StepBoundary,
    ) -> BoxFuture<()> {
        let faulty = {
            let mut o = lock(&self.oracle);
            if at == StepBoundary::Starting {
                o.world.step_ran(run, step, fence);
                o.check_state();
            }
            let w = self.worker;
            o.note(
                &format!("w{w}"),
                format!("{run} step {step} {name:?} fence {}: {at:?}", fence.0),
            );
            o.faulty
        };
        if !faulty
            || madsim::rand::random::<f64>() >= self.crash_p
            || self.crash.send(self.worker).is_err()
        {
            return Box::pin(std::future::ready(()));
        }
        // The supervisor kills this node; the step goes no further.
        Box::pin(std::future::pending())
    }
}

/// A simulated test of a crate's own handlers (see the module's
/// documentation).
#[derive(Clone)]
pub struct JobSim {
    jobs: Jobs,
    scenario: Scenario,
}

/// What [`JobSim::check`] saw across its seeds.
#[derive(Clone, Debug, Default)]
pub struct Sweep {
    /// Seeds run.
    pub seeds: u64,
    /// Each event counter summed over the seeds ("kills",
    /// "step_boundary_kills", "external_deduplicated", ...).
    pub counters: BTreeMap<String, u64>,
}

impl Sweep {
    /// The sum of counter `name` (0 if it never happened).
    #[must_use]
    pub fn count(&self, name: &str) -> u64 {
        self.counters.get(name).copied().unwrap_or(0)
    }
}

impl JobSim {
    /// A simulation whose workers' handlers `register` registers; the
    /// handlers call the outside world through `External`.
    pub fn new(register: impl Fn(&mut Registry, &External) + Send + Sync + 'static) -> JobSim {
        let mut scenario = Scenario::standard();
        scenario.name = "jobs".into();
        JobSim {
            jobs: Jobs {
                register: Arc::new(register),
                submit: Some(Arc::new(|_, _| ("noop".into(), "{}".into()))),
                effects: None,
                step_crash_p: 0.1,
            },
            scenario,
        }
    }

    /// The workload: run `n` (1, 2, ...) of each seed is the kind and
    /// input `submit` makes of a random number drawn from the seed.
    #[must_use]
    pub fn submit(
        mut self,
        submit: impl Fn(u64, u32) -> (String, String) + Send + Sync + 'static,
    ) -> JobSim {
        self.jobs.submit = Some(Arc::new(submit));
        self
    }

    /// How many external effects a run of `kind` with `input` applies
    /// when it succeeds: checked at the end of every seed.
    #[must_use]
    pub fn effects(
        mut self,
        effects: impl Fn(&str, &str) -> u32 + Send + Sync + 'static,
    ) -> JobSim {
        self.jobs.effects = Some(Arc::new(effects));
        self
    }

    /// The chance that a worker dies at each step boundary (default 0.1).
    #[must_use]
    pub fn step_crash_p(mut self, p: f64) -> JobSim {
        self.jobs.step_crash_p = p;
        self
    }

    /// Changes the world's shape (workers, runs, timings, policy).
    #[must_use]
    pub fn scenario(mut self, change: impl FnOnce(&mut Scenario)) -> JobSim {
        change(&mut self.scenario);
        self
    }

    /// Runs one seed; `record` keeps its timeline.
    #[must_use]
    pub fn run_seed(&self, seed: u64, record: bool) -> SeedOutcome {
        run_jobs(seed, &self.scenario, None, record, &self.jobs)
    }

    /// Runs `seeds` on every core and panics at a failing one, with the
    /// command that replays it. `PELICAN_SIM_SEED=N` runs seed N alone and
    /// prints its timeline; `PELICAN_SIM_SEEDS=A..B` runs another range.
    ///
    /// # Panics
    /// A seed broke a guarantee, panicked or did not settle.
    #[must_use = "the sweep's counters show what the seeds exercised"]
    pub fn check(&self, seeds: Range<u64>) -> Sweep {
        if let Some(seed) = env_seed() {
            return self.replay(seed);
        }
        let seeds = env_range().unwrap_or(seeds);
        let first_failure = Mutex::new(None::<SeedOutcome>);
        let sweep = Mutex::new(Sweep::default());
        let next = AtomicU64::new(seeds.start);
        let threads = std::thread::available_parallelism().map_or(1, usize::from);
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| {
                    loop {
                        let seed = next.fetch_add(1, Ordering::Relaxed);
                        if seed >= seeds.end {
                            return;
                        }
                        let outcome = self.run_seed(seed, false);
                        let mut sw = sweep
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner);
                        sw.seeds += 1;
                        for (k, v) in &outcome.counters {
                            *sw.counters.entry(k.clone()).or_insert(0) += v;
                        }
                        drop(sw);
                        if !outcome.passed() {
                            let mut f = first_failure
                                .lock()
                                .unwrap_or_else(std::sync::PoisonError::into_inner);
                            if f.as_ref().is_none_or(|o| o.seed > seed) {
                                *f = Some(outcome);
                            }
                            next.store(seeds.end, Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        if let Some(failed) = first_failure
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
        {
            panic!(
                "seed {} failed: {}\nreplay: {}",
                failed.seed,
                failures(&failed),
                replay_command(failed.seed)
            );
        }
        sweep
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn replay(&self, seed: u64) -> Sweep {
        let outcome = self.run_seed(seed, true);
        for line in outcome.log.iter().flatten() {
            eprintln!("{:>7} ms {:>10}  {}", line.t_ms, line.node, line.event);
        }
        assert!(
            outcome.passed(),
            "seed {seed} failed: {}",
            failures(&outcome)
        );
        Sweep {
            seeds: 1,
            counters: outcome.counters,
        }
    }
}

fn failures(o: &SeedOutcome) -> String {
    o.broken
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

fn env_seed() -> Option<u64> {
    let text = std::env::var("PELICAN_SIM_SEED").ok()?;
    Some(
        text.trim()
            .parse()
            .unwrap_or_else(|_| panic!("PELICAN_SIM_SEED={text:?} is not a seed")),
    )
}

fn env_range() -> Option<Range<u64>> {
    let text = std::env::var("PELICAN_SIM_SEEDS").ok()?;
    let range = text
        .split_once("..")
        .and_then(|(a, b)| Some(a.trim().parse().ok()?..b.trim().parse().ok()?));
    Some(range.unwrap_or_else(|| panic!("PELICAN_SIM_SEEDS={text:?} is not a range like 0..1000")))
}

/// `PELICAN_SIM_SEED=N cargo test --test T -- NAME --exact`, from the test
/// binary's name and the test thread's.
fn replay_command(seed: u64) -> String {
    let mut cmd = format!("PELICAN_SIM_SEED={seed} cargo test");
    let exe = std::env::current_exe().ok();
    let stem = exe
        .as_ref()
        .and_then(|p| p.file_stem())
        .and_then(|s| s.to_str())
        .and_then(|s| s.rsplit_once('-'))
        .map(|(name, _hash)| name.to_owned());
    if let Some(t) = stem {
        cmd += &format!(" --test {t}");
    }
    if let Some(name) = std::thread::current().name().filter(|n| *n != "main") {
        cmd += &format!(" -- {name} --exact");
    }
    cmd
}
