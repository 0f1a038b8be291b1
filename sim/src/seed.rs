//! One seed: build the world, run the workload under the nemesis
//! (`nemesis.rs`), heal, wait for every run to settle, check. One file of
//! over 600 lines, because those steps are one seed's timeline and share
//! its nodes and oracle.

use crate::harness::{External, Jobs, SimStepHook};
use crate::nemesis::{Damage, Nodes, heal, kill_worker, nemesis};
use crate::net::{self, Client, EXTERNAL, POSTGRES, REDIS, TOOLS};
use crate::oracle::{LogLine, Oracle, Shared, lock};
use crate::scenario::{FaultMix, Scenario};
use madsim::rand::Rng;
use madsim::runtime::{Handle, Runtime};
use madsim::task::NodeId;
use pelican_model::db::Delay;
use pelican_model::ids::{EntryId, Fence, RunId, WorkerId};
use pelican_model::invariants::Broken;
use pelican_model::protocol::{
    Command, DbOp, DbReply, DeliveryEnd, Execution, Input, Mutant, SubmitterEnd,
};
use pelican_model::world::Issuer;
use pelican_real::jobs::{ProviderLimit, Registry, effects_of};
use pelican_real::{Batching, Entropy, Io, NewRun, Probe, RoleId, Worker, cancel, submit_many};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;

/// Why a seed failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Failure {
    /// A guarantee was broken.
    Broken(Broken),
    /// The simulation panicked (with this message).
    Panicked(String),
    /// Liveness: the seed did not settle within the heal bound (what was
    /// still open).
    Unsettled(String),
}

/// "S4 AckBeforeDurable(..)", "panic ...", "liveness ...".
impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Broken(b) => b.fmt(f),
            Failure::Panicked(text) => write!(f, "panic {text}"),
            Failure::Unsettled(text) => write!(f, "liveness {text}"),
        }
    }
}

/// What one seed did.
#[derive(Clone, Debug)]
pub struct SeedOutcome {
    /// The seed.
    pub seed: u64,
    /// Why it failed (empty: it passed).
    pub broken: Vec<Failure>,
    /// Event counters.
    pub counters: BTreeMap<String, u64>,
    /// Hash of every event, for determinism checks.
    pub digest: u64,
    /// The event log, when recorded.
    pub log: Option<Vec<LogLine>>,
    /// The fault mix the seed drew.
    pub faults: FaultMix,
    /// Simulated milliseconds.
    pub sim_ms: u64,
}

impl SeedOutcome {
    /// Whether every guarantee held.
    #[must_use]
    pub fn passed(&self) -> bool {
        self.broken.is_empty()
    }
}

/// Runs `seed` of `scenario` with the built-in job kinds, with `mutant`
/// injected, recording the event log if `record`.
#[must_use]
pub fn run_seed(
    seed: u64,
    scenario: &Scenario,
    mutant: Option<Mutant>,
    record: bool,
) -> SeedOutcome {
    run_jobs(seed, scenario, mutant, record, &Jobs::builtins())
}

/// Runs `seed` of `scenario` with `jobs`' handlers and workload.
#[must_use]
pub(crate) fn run_jobs(
    seed: u64,
    scenario: &Scenario,
    mutant: Option<Mutant>,
    record: bool,
    jobs: &Jobs,
) -> SeedOutcome {
    let mut config = madsim::Config::default();
    config.net.send_latency = Duration::from_millis(1)..Duration::from_millis(5);
    let mut rt = Runtime::with_seed_and_config(seed, config);
    rt.set_time_limit(Duration::from_millis(
        scenario.fault_phase_ms + scenario.heal_bound_ms + 60_000,
    ));
    let (sc, jobs) = (scenario.clone(), jobs.clone());
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        rt.block_on(simulate(seed, sc, mutant, record, jobs))
    }));
    match result {
        Ok(outcome) => outcome,
        Err(panic) => {
            let text = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "non-string panic".to_owned());
            SeedOutcome {
                seed,
                broken: vec![Failure::Panicked(text)],
                counters: BTreeMap::new(),
                digest: 0,
                log: None,
                faults: FaultMix::default(),
                sim_ms: 0,
            }
        }
    }
}

/// The seed's randomness, for the driver's retry jitter.
struct SeedEntropy;
impl Entropy for SeedEntropy {
    fn next_u64(&self) -> u64 {
        madsim::rand::random()
    }
}

/// Forwards what a node's driver does to the oracle.
struct SimProbe {
    oracle: Shared,
    node: String,
}

impl Probe for SimProbe {
    fn sent(&self, role: &RoleId, command: &Command) {
        lock(&self.oracle).sent(&self.node, role, command);
    }
    fn received(&self, role: &RoleId, _now: pelican_model::time::Timestamp, input: &Input) {
        lock(&self.oracle).received(&self.node, role, input);
    }
    fn executing(&self, _role: &RoleId, execution: &Execution, own_fence: Option<Fence>) {
        lock(&self.oracle).executing(&self.node, execution, own_fence);
    }
    fn delivery_end(&self, _worker: WorkerId, entry: EntryId, end: DeliveryEnd) {
        lock(&self.oracle).delivery_end(&self.node, entry, end);
    }
    fn reclaimer_holds(&self, worker: WorkerId, held: &BTreeSet<EntryId>) {
        lock(&self.oracle).reclaimer_holds(worker, held);
    }
}

type SimIo = Io<Batching<Client>, Batching<Client>, SimProbe>;

async fn io_for(
    oracle: &Shared,
    node: &str,
    scenario: &Scenario,
    mutant: Option<Mutant>,
    clock_offset_ms: i64,
) -> (Arc<SimIo>, Client) {
    let client = Client::bind(node).await;
    let mut config = scenario.driver.clone();
    config.policy.mutant = mutant;
    config.clock_offset_ms = clock_offset_ms;
    let batch_max = config.in_flight_max;
    let timeout = Duration::from_millis(config.call_timeout_ms);
    let io = Io {
        stream: Batching::stream(client.clone(), batch_max, timeout),
        db: Batching::db(client.clone(), batch_max, timeout),
        probe: SimProbe {
            oracle: oracle.clone(),
            node: node.to_owned(),
        },
        entropy: Arc::new(SeedEntropy),
        config,
    };
    (Arc::new(io), client)
}

/// The provider the built-in `limited` runs call.
pub(crate) const PROVIDER: &str = "p";

/// Its limits: one call at once and two a second; a dead holder's slot is
/// free after 1.5 s.
pub(crate) fn provider_limit() -> ProviderLimit {
    ProviderLimit::default()
        .concurrent(1)
        .per_second(2)
        .burst(1)
        .hold_ms(1_500)
}

/// A run the API will submit.
#[derive(Clone, Debug)]
struct Planned {
    at_ms: u64,
    run: RunId,
    kind: String,
    input: String,
    /// Its submission's delay (S15).
    delay: Delay,
}

fn plan(rng: &mut impl Rng, scenario: &Scenario) -> Vec<Planned> {
    let window = scenario.fault_phase_ms * 2 / 3;
    let mut runs: Vec<Planned> = (1..=u64::from(scenario.runs))
        .map(|n| {
            let (kind, input) = match rng.gen_range(0..100) {
                0..15 => ("noop", "{}".to_owned()),
                15..40 => ("sleep", format!("{{\"ms\":{}}}", rng.gen_range(0..3_500))),
                // Calls to a provider under its limits (S12), held 0-0.8 s.
                40..48 => (
                    "limited",
                    format!(
                        "{{\"provider\":\"{PROVIDER}\",\"ms\":{}}}",
                        rng.gen_range(0..800)
                    ),
                ),
                // Side effects, alone or each in a durable step.
                48..65 => (
                    if rng.gen_bool(0.4) { "steps" } else { "effect" },
                    format!(
                        "{{\"calls\":{},\"ms\":{}}}",
                        rng.gen_range(1..4),
                        rng.gen_range(0..900)
                    ),
                ),
                65..82 => (
                    "fail",
                    format!(
                        "{{\"class\":\"{}\",\"times\":{},\"ms\":{}}}",
                        if rng.gen_bool(0.3) {
                            "unknown"
                        } else {
                            "retryable"
                        },
                        rng.gen_range(0..7),
                        rng.gen_range(0..500)
                    ),
                ),
                82..91 => (
                    "fail",
                    format!(
                        "{{\"class\":\"terminal\",\"times\":{},\"ms\":{}}}",
                        rng.gen_range(0..2),
                        rng.gen_range(0..500)
                    ),
                ),
                91..98 => ("panic", format!("{{\"times\":{}}}", rng.gen_range(0..3))),
                98 => ("no-such-kind", "{}".to_owned()),
                // A result Postgres refuses (a NUL byte).
                _ => ("echo", r#"{"text":"poison\u0000"}"#.to_owned()),
            };
            // One run in eight waits up to 3 s before it may start (S15).
            let delay = Delay {
                delay_ms: if rng.gen_range(0..8) == 0 {
                    rng.gen_range(1..3_000)
                } else {
                    0
                },
                at_ms: 0,
            };
            Planned {
                at_ms: rng.gen_range(0..window.max(1)),
                run: RunId(n),
                kind: kind.to_owned(),
                input,
                delay,
            }
        })
        .collect();
    runs.sort_by_key(|p| p.at_ms);
    runs
}

/// A workload of users' jobs: run `n` is what `submit` makes of a random
/// number, submitted at a random time of the fault phase.
fn plan_with(
    rng: &mut impl Rng,
    scenario: &Scenario,
    submit: &dyn Fn(u64, u32) -> (String, String),
) -> Vec<Planned> {
    let window = scenario.fault_phase_ms * 2 / 3;
    let mut runs: Vec<Planned> = (1..=scenario.runs)
        .map(|n| {
            let (kind, input) = submit(rng.r#gen(), n);
            Planned {
                at_ms: rng.gen_range(0..window.max(1)),
                run: RunId(u64::from(n)),
                kind,
                input,
                delay: Delay::NONE,
            }
        })
        .collect();
    runs.sort_by_key(|p| p.at_ms);
    runs
}

fn draw_mix(rng: &mut impl Rng, scenario: &Scenario) -> FaultMix {
    if !scenario.faults {
        return FaultMix::default();
    }
    let mut on = |w: u32| if rng.gen_bool(0.6) { w } else { 0 };
    let mut mix = FaultMix {
        fault_every_ms: 0,
        kill: on(scenario.kill_weight),
        pause: on(3),
        partition: on(3),
        redis_restart: on(scenario.redis_loss_weight),
        redis_wipe: on(scenario.redis_loss_weight.div_ceil(2)),
        pg_restart: on(2),
        trim: on(2),
        duplicate: on(2),
        malformed: on(2),
        cancel: on(3),
        lost_request_p: 0.0,
        lost_reply_p: 0.0,
    };
    mix.fault_every_ms = rng.gen_range(300..1_500);
    if rng.gen_bool(0.5) {
        mix.lost_request_p = rng.gen_range(0.0..0.04);
    }
    if rng.gen_bool(0.5) {
        mix.lost_reply_p = rng.gen_range(0.0..0.04);
    }
    mix
}

/// Commands the supervisor sends the API node.
pub(crate) enum ApiCommand {
    Cancel(RunId),
}

async fn api_main(
    oracle: Shared,
    scenario: Scenario,
    mutant: Option<Mutant>,
    plan: Vec<Planned>,
    mut commands: mpsc::UnboundedReceiver<ApiCommand>,
) {
    let (io, _) = io_for(&oracle, "api", &scenario, mutant, 0).await;
    let started = pelican_real::now().0;
    // Planned runs in groups of three, in order: every other group is one
    // bulk submission at its first run's time (their inserts fused, their
    // publications pipelined), the rest one submission a run.
    for (g, group) in plan.chunks(3).enumerate() {
        let bulk = g % 2 == 0 && group.len() > 1;
        let groups: Vec<Vec<Planned>> = if bulk {
            vec![group.to_vec()]
        } else {
            group.iter().map(|p| vec![p.clone()]).collect()
        };
        for runs in groups {
            let io = io.clone();
            let oracle = oracle.clone();
            madsim::task::spawn(submit_group(io, oracle, started, runs));
        }
    }
    while let Some(command) = commands.recv().await {
        match command {
            ApiCommand::Cancel(run) => {
                let io = io.clone();
                madsim::task::spawn(async move {
                    let _ = cancel(&*io, run).await;
                });
            }
        }
    }
}

/// One group of planned runs submitted together at its first run's time
/// (a bulk submission when there are several), and again while some got
/// no answer: a client retries what got no answer, and the run id makes
/// the retry idempotent.
async fn submit_group(io: Arc<SimIo>, oracle: Shared, started: u64, mut runs: Vec<Planned>) {
    let left = (started + runs[0].at_ms).saturating_sub(pelican_real::now().0);
    madsim::time::sleep(Duration::from_millis(left)).await;
    for p in &runs {
        lock(&oracle)
            .effects_expected
            .insert(p.run, effects_of(&p.kind, &p.input));
    }
    if runs.len() > 1 {
        lock(&oracle).count("bulk_submissions");
    }
    // A client retries what got no answer; the run id makes
    // the retry idempotent.
    for _ in 0..4 {
        let batch: Vec<(RunId, NewRun)> = runs
            .iter()
            .map(|p| {
                let run = NewRun {
                    kind: p.kind.clone(),
                    input: p.input.clone(),
                    key: Some(key_of(p.run)),
                    trace: None,
                    delay: p.delay,
                };
                (p.run, run)
            })
            .collect();
        let ends = submit_many(&*io, &batch).await;
        let left = submitted(&io, &oracle, runs, ends);
        runs = left;
        if runs.is_empty() {
            break;
        }
        madsim::time::sleep(Duration::from_millis(300)).await;
    }
}

/// The oracle's record of a group's ends: accepted runs (a third retried
/// under their key later, half followed over their events), and the runs
/// that got no answer, which it returns.
fn submitted(
    io: &Arc<SimIo>,
    oracle: &Shared,
    runs: Vec<Planned>,
    ends: Vec<SubmitterEnd>,
) -> Vec<Planned> {
    let mut o = lock(oracle);
    let mut left = Vec::new();
    for (p, end) in runs.into_iter().zip(ends) {
        match end {
            SubmitterEnd::Accepted { published } => {
                o.world.accepted.insert(p.run);
                if p.run.0 % 3 == 0 {
                    madsim::task::spawn(retry_under_key(io.clone(), oracle.clone(), p.clone()));
                }
                if p.run.0 % 2 == 1 {
                    madsim::task::spawn(watch_events(io.clone(), oracle.clone(), p.run));
                }
                o.count(if p.delay.waits() {
                    "submitted_delayed"
                } else if published {
                    "submitted"
                } else {
                    "submitted_unpublished"
                });
            }
            end @ (SubmitterEnd::Refused
            | SubmitterEnd::Existing(_)
            | SubmitterEnd::KeyConflict(_)) => {
                unreachable!("a run's own key and valid text answer no {end:?}")
            }
            SubmitterEnd::Unavailable => {
                o.count("submit_retries");
                left.push(p);
            }
        }
    }
    left
}

/// Run `run`'s idempotency key: every planned submission carries one.
fn key_of(run: RunId) -> String {
    format!("key-{}", run.0)
}

/// A client's late retry of `p`'s submission under its key, with a fresh
/// run id, once retention has deleted the run: the key still answers the
/// run (S14, checked by the world as the insert executes). Retried while
/// unanswered; a second run it made is accepted like any other.
async fn retry_under_key<S, D, P>(io: Arc<Io<S, D, P>>, oracle: Shared, p: Planned)
where
    S: pelican_real::StreamClient,
    D: pelican_real::DbClient,
    P: Probe,
{
    while !lock(&oracle).world.retired.contains_key(&p.run) {
        madsim::time::sleep(Duration::from_millis(500)).await;
    }
    let fresh = RunId(p.run.0 + 1_000_000);
    let run = NewRun {
        kind: p.kind.clone(),
        input: p.input.clone(),
        key: Some(key_of(p.run)),
        trace: None,
        delay: p.delay,
    };
    for _ in 0..8 {
        let end = submit_many(&*io, &[(fresh, run.clone())]).await;
        {
            let mut o = lock(&oracle);
            match end.first() {
                Some(SubmitterEnd::Unavailable) => o.count("key_retries_unanswered"),
                Some(SubmitterEnd::Accepted { .. }) => {
                    o.effects_expected
                        .insert(fresh, effects_of(&p.kind, &p.input));
                    o.world.accepted.insert(fresh);
                    return;
                }
                _ => {
                    o.count("key_retries_answered");
                    return;
                }
            }
        }
        madsim::time::sleep(Duration::from_millis(300)).await;
    }
}

/// A reader following `run`'s events as a client of `GET /runs/{id}/events`
/// does, through lost replies and partitions: it asks for the events after
/// the last one it holds, a few at a time, until it holds a terminal one.
/// What it holds is checked as it grows, and against the final log at the
/// seed's end ([`Oracle::watched`], S13).
async fn watch_events<S, D, P>(io: Arc<Io<S, D, P>>, oracle: Shared, run: RunId)
where
    S: pelican_real::StreamClient,
    D: pelican_real::DbClient,
    P: Probe,
{
    let mut seen: Vec<pelican_model::events::RunEvent> = Vec::new();
    loop {
        let after = seen.last().map_or(0, |e| e.seq);
        // Few events a read, and few bytes: the reader follows a log
        // across reads that stop at either bound.
        let read = DbOp::ReadEvents {
            run,
            after,
            limit: 4,
            bytes_max: 8,
        };
        if let Ok(DbReply::Events(batch)) = io.db.call(read).await
            && !batch.is_empty()
        {
            seen.extend(batch);
            let mut o = lock(&oracle);
            o.count("events_read");
            let done = seen.last().is_some_and(|e| e.kind.is_terminal());
            o.watched(run, &seen);
            if done {
                o.count("event_logs_followed");
                return;
            }
        }
        madsim::time::sleep(Duration::from_millis(150)).await;
    }
}

async fn simulate(
    seed: u64,
    mut scenario: Scenario,
    mutant: Option<Mutant>,
    record: bool,
    jobs: Jobs,
) -> SeedOutcome {
    if jobs.submit.is_some() {
        register_kinds(&mut scenario, &jobs).await;
    }
    let h = Handle::current();
    let mut rng = madsim::rand::thread_rng();
    let faults = draw_mix(&mut rng, &scenario);
    let plan = match &jobs.submit {
        None => plan(&mut rng, &scenario),
        Some(submit) => plan_with(&mut rng, &scenario, &**submit),
    };
    let scheduled = jobs.submit.is_none();
    let oracle = new_oracle(seed, &scenario, mutant, record, &faults);
    schedule_ticks(&oracle, scheduled, true);
    let server = |name, listen, fsync| server(&h, &oracle, name, listen, fsync);
    let redis = server("redis", REDIS, true);
    let pg = server("postgres", POSTGRES, false);
    let tools = server("tools", TOOLS, false);
    // Built-in seeds keep the world (and so the schedules) they always had.
    let external = jobs
        .submit
        .is_some()
        .then(|| server("external", EXTERNAL, false));

    // Workers that crash themselves at a step boundary ask for it here.
    let (crash_tx, mut crash_rx) = mpsc::unbounded_channel::<u32>();
    let workers = spawn_workers(&h, &oracle, &scenario, &jobs, mutant, &crash_tx);
    let (api_tx, api_rx) = mpsc::unbounded_channel();
    let api = h
        .create_node()
        .name("api")
        .ip("10.0.2.1".parse().expect("valid IP"))
        .build();
    api.spawn(api_main(
        oracle.clone(),
        scenario.clone(),
        mutant,
        plan,
        api_rx,
    ));

    let nodes = Arc::new(Nodes {
        redis: redis.id(),
        pg: pg.id(),
        workers,
    });
    let damage = Arc::new(Mutex::new(Damage::default()));
    let crashes = (jobs.step_crash_p > 0.0).then(|| {
        let (oracle, nodes, damage) = (oracle.clone(), nodes.clone(), damage.clone());
        let lease_ms = scenario.driver.policy.lease_ms;
        madsim::task::spawn(async move {
            while let Some(w) = crash_rx.recv().await {
                let back = madsim::rand::thread_rng().gen_range(200..lease_ms * 2);
                kill_worker(w, &nodes, &damage, &oracle, "at a step boundary", back);
            }
        })
        .abort_handle()
    });
    if scenario.faults {
        nemesis(&oracle, &scenario, &faults, &nodes, &damage, &api_tx).await;
    } else {
        madsim::time::sleep(Duration::from_millis(scenario.fault_phase_ms)).await;
    }
    heal(&oracle, &nodes, &damage);
    schedule_ticks(&oracle, scheduled, false);

    let settled = settles(&oracle, &scenario).await;
    let outcome = conclude(&mut lock(&oracle), seed, settled, &scenario, faults);
    // The seed is over: end every task but this one, so that their futures
    // are dropped while the runtime runs. madsim does not drop a pending
    // task when the runtime ends, and a task waiting on a timer holds the
    // timers that hold its waker: such a cycle keeps the whole simulated
    // world (the oracle among it) alive, and a long sweep runs out of memory.
    let mends = std::mem::take(&mut damage.lock().expect("single-threaded").mends);
    for task in mends.into_iter().chain(crashes) {
        task.abort();
    }
    let ids = [redis.id(), pg.id(), tools.id(), api.id()]
        .into_iter()
        .chain(external.map(|n| n.id()))
        .chain(nodes.workers.iter().copied());
    for id in ids {
        h.kill(id);
    }
    madsim::time::sleep(Duration::from_millis(1)).await;
    outcome
}

/// The built-in seeds' schedule.
const TICKS: &str = "every-second";

/// Puts [`TICKS`] (`on`), an echo every second, overlap `cancel`,
/// catch-up `one`, or deletes it: the built-in seeds (`scheduled`) have
/// it through the fault phase, and the workers' schedulers race for its
/// ticks through every fault (S16).
fn schedule_ticks(oracle: &Shared, scheduled: bool, on: bool) {
    if !scheduled {
        return;
    }
    let op = if on {
        DbOp::PutSchedule {
            name: TICKS.into(),
            kind: "echo".into(),
            input: r#"{"text":"tick"}"#.into(),
            cron: "* * * * * *".into(),
            tz: "UTC".into(),
            overlap: pelican_model::schedule::Overlap::Cancel,
            catchup: pelican_model::schedule::Catchup::One,
        }
    } else {
        DbOp::DeleteSchedule { name: TICKS.into() }
    };
    lock(oracle).db("api", &op, Issuer::default());
}

/// The seed's oracle, its first note naming the seed, scenario, mutant and
/// faults.
fn new_oracle(
    seed: u64,
    scenario: &Scenario,
    mutant: Option<Mutant>,
    record: bool,
    faults: &FaultMix,
) -> Shared {
    let mut policy = scenario.driver.policy.clone();
    policy.mutant = mutant;
    let oracle: Shared = Arc::new(Mutex::new(Oracle::new(policy, faults.clone(), record)));
    {
        let mut o = lock(&oracle);
        // The plan's ids (1..=runs) were handed out by the sequence.
        o.world.db.run_ids = u64::from(scenario.runs);
        let f = format!("{faults:?}");
        o.note(
            "nemesis",
            format!(
                "seed {seed}, scenario {}, mutant {mutant:?}, faults {f}",
                scenario.name
            ),
        );
    }
    oracle
}

/// A server node `name` listening on `listen`, serving the oracle's world
/// (with an fsync every second, for Redis's AOF).
fn server(
    h: &Handle,
    oracle: &Shared,
    name: &'static str,
    listen: &'static str,
    fsync: bool,
) -> madsim::runtime::NodeHandle {
    let o = oracle.clone();
    h.create_node()
        .name(name)
        .ip(listen
            .parse::<std::net::SocketAddr>()
            .expect("constant")
            .ip())
        .init(move || {
            let o = o.clone();
            async move {
                if fsync {
                    madsim::task::spawn(net::fsync_every_second(o.clone()));
                }
                net::serve(o, listen, name).await;
            }
        })
        .build()
}

/// The scenario's worker nodes, each running `pelican_real::Worker` with
/// the scenario's jobs (and, if asked, crashing itself at step boundaries
/// through `crash_tx`).
fn spawn_workers(
    h: &Handle,
    oracle: &Shared,
    scenario: &Scenario,
    jobs: &Jobs,
    mutant: Option<Mutant>,
    crash_tx: &mpsc::UnboundedSender<u32>,
) -> Vec<NodeId> {
    let mut workers = Vec::new();
    for i in 0..scenario.workers {
        let (o, sc, jobs, crash) = (
            oracle.clone(),
            scenario.clone(),
            jobs.clone(),
            crash_tx.clone(),
        );
        let node = h
            .create_node()
            .name(format!("w{i}"))
            .ip(format!("10.0.1.{}", i + 1).parse().expect("valid IP"))
            .init(move || {
                let (o, sc, jobs, crash) = (o.clone(), sc.clone(), jobs.clone(), crash.clone());
                async move {
                    let name = format!("w{i}");
                    let skew = i64::try_from(sc.clock_skew_ms).unwrap_or(i64::MAX);
                    let offset = [0, skew, -skew][(i % 3) as usize];
                    let (io, client) = io_for(&o, &name, &sc, mutant, offset).await;
                    let timeout = Duration::from_millis(io.config.call_timeout_ms);
                    let external = External::new(client.clone(), timeout);
                    let client = Arc::new(client);
                    let mut registry = Registry::new(client.clone(), client, &io.config.policy)
                        .with_tool_timeout(timeout);
                    (jobs.register)(&mut registry, &external);
                    if jobs.step_crash_p > 0.0 {
                        let hook = SimStepHook::new(o.clone(), i, jobs.step_crash_p, crash);
                        registry = registry.with_step_hook(Arc::new(hook));
                    }
                    Worker::new(io, Arc::new(registry), WorkerId(i), true)
                        .run(std::future::pending())
                        .await;
                }
            })
            .build();
        workers.push(node.id());
    }
    workers
}

/// Liveness: whether everything settles within the scenario's bound after
/// healing (a broken guarantee ends the wait).
async fn settles(oracle: &Shared, scenario: &Scenario) -> bool {
    let healed_at = lock(oracle).elapsed_ms();
    while lock(oracle).elapsed_ms() < healed_at + scenario.heal_bound_ms {
        madsim::time::sleep(Duration::from_millis(250)).await;
        let o = lock(oracle);
        if !o.broken.is_empty() {
            return false;
        }
        if o.settled() {
            return true;
        }
    }
    false
}

/// The policies users' kinds are registered with, into the scenario's: for
/// the API's submissions, the workers and the oracle alike.
async fn register_kinds(scenario: &mut Scenario, jobs: &Jobs) {
    let client = Client::bind("registry").await;
    let external = External::new(client.clone(), Duration::from_millis(1));
    let client = Arc::new(client);
    let mut registry = Registry::new(client.clone(), client, &scenario.driver.policy);
    (jobs.register)(&mut registry, &external);
    let kinds = registry.policies().clone();
    scenario.driver.policy.kinds.extend(kinds);
}

/// The seed's outcome, once it has settled (or not) after healing: what
/// broke while it ran, or else what the final check finds.
fn conclude(
    o: &mut Oracle,
    seed: u64,
    settled: bool,
    scenario: &Scenario,
    faults: FaultMix,
) -> SeedOutcome {
    let mut broken: Vec<Failure> = o.broken.iter().cloned().map(Failure::Broken).collect();
    if broken.is_empty() {
        if !settled {
            broken.push(Failure::Unsettled(unsettled(o, scenario.heal_bound_ms)));
        }
        broken.extend(o.final_check().into_iter().map(Failure::Broken));
        if !broken.is_empty() {
            let text = broken
                .iter()
                .map(Failure::to_string)
                .collect::<Vec<_>>()
                .join("; ");
            o.note("oracle", format!("final check: {text}"));
        }
    }
    if broken.is_empty()
        && (o.counters.contains_key("redis_restarts") || o.counters.contains_key("redis_wipes"))
    {
        o.count("redis_losses_survived");
    }
    let sim_ms = o.elapsed_ms();
    SeedOutcome {
        seed,
        broken,
        counters: o
            .counters
            .iter()
            .map(|(k, v)| ((*k).to_owned(), *v))
            .collect(),
        digest: o.digest(),
        log: o.log.take(),
        faults,
        sim_ms,
    }
}

fn unsettled(o: &Oracle, bound_ms: u64) -> String {
    let w = &o.world;
    let stuck: Vec<String> = w
        .accepted
        .iter()
        .filter_map(|r| {
            let row = w.db.runs.get(r)?;
            (!row.status.is_terminal())
                .then(|| format!("{r} {} (dispatch {})", row.status, row.dispatch.0))
        })
        .collect();
    format!(
        "not settled {bound_ms} ms after healing: {} runs not terminal [{}], {} entries pending",
        stuck.len(),
        stuck.join(", "),
        w.redis.pel_len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oracle::tests::Alive;

    /// A seed leaves nothing behind: when it ends, every task it started
    /// has ended, so its simulated world is dropped. A waiting task that
    /// outlives the seed keeps the world alive through madsim's timers, and
    /// a long sweep runs out of memory.
    #[test]
    fn a_seed_leaves_nothing_behind() {
        crate::quiet_job_panics();
        for scenario in ["standard", "crashy", "redis-loss"] {
            let sc = Scenario::named(scenario).expect("a known scenario");
            for seed in 0..10 {
                let o = run_seed(seed, &sc, None, false);
                assert!(o.passed(), "seed {seed} of {scenario}: {:?}", o.broken);
                assert_eq!(
                    Alive::count(),
                    0,
                    "seed {seed} of {scenario} left its oracle alive"
                );
            }
        }
    }
}
