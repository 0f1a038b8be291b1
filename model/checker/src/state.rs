//! The checker's state and its transitions: the world, the role machines of
//! every process, and what is left of the fault budget.

use crate::NOW;
use crate::config::{Budget, Config, OutcomeKind};
use pelican_model::db::Candidate;
use pelican_model::ids::{EntryId, Fence, RunId, WorkerId};
use pelican_model::invariants::Guarantee;
use pelican_model::protocol::{
    Command, DbOp, DbReply, Delivery, Input, JobEntry, Maintenance, MaintenanceTask, Reclaimer,
    ReclaimerEvent, StreamOp, StreamReply, Submitter, still_deliverable,
};
use pelican_model::status::{ErrorClass, JobOutcome, RunStatus};
use pelican_model::stream::{StreamError, Trim};
use pelican_model::world::{Issuer, World};
use serde::Serialize;
use std::collections::BTreeSet;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::{Arc, OnceLock};

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
    /// Whether its side effect was performed.
    pub effect_done: bool,
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
        }
    }
}

/// A worker process in a state: shared with the states before and after it
/// until one of them changes it (copy on write: most steps change one
/// worker, or none), with its fingerprint cached (see
/// [`State::fingerprint`]). Reads and writes go through `Deref`/`DerefMut`.
#[derive(Clone)]
pub struct Proc(Arc<(WorkerProc, OnceLock<(usize, u64)>)>);

impl Proc {
    /// Wraps `w`.
    #[must_use]
    pub fn new(w: WorkerProc) -> Proc {
        Proc(Arc::new((w, OnceLock::new())))
    }

    /// Worker `i`'s process hashed as if it were worker 0 (computed once
    /// per version of the process, for the place it holds).
    fn fingerprint(&self, i: usize, n: usize) -> u64 {
        let compute = || {
            let mut h = fp_hasher();
            if i == 0 {
                self.0.0.hash(&mut h);
            } else {
                let mut w = self.0.0.clone();
                w.relabel(i, &permutations(n)[swap_index(n, i)]);
                w.hash(&mut h);
            }
            h.finish()
        };
        match self.0.1.get_or_init(|| (i, compute())) {
            (at, fp) if *at == i => *fp,
            _ => compute(),
        }
    }
}

impl std::ops::Deref for Proc {
    type Target = WorkerProc;
    fn deref(&self) -> &WorkerProc {
        &self.0.0
    }
}

impl std::ops::DerefMut for Proc {
    fn deref_mut(&mut self) -> &mut WorkerProc {
        let inner = Arc::make_mut(&mut self.0);
        inner.1 = OnceLock::new();
        &mut inner.0
    }
}

impl PartialEq for Proc {
    fn eq(&self, other: &Proc) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0.0 == other.0.0
    }
}

impl Eq for Proc {}

impl Hash for Proc {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.0.0.hash(h);
    }
}

impl std::fmt::Debug for Proc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.0.fmt(f)
    }
}

impl Serialize for Proc {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.0.serialize(s)
    }
}

/// The API's handling of one run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum ApiRun {
    /// Not submitted yet.
    NotYet,
    /// Answered.
    Done,
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
}

/// The whole state.
///
/// Its [`Hash`] is its fingerprint ([`State::fp`]), which stateright's
/// visited set keys on: with [`Config::symmetry`], one fingerprint for all
/// the states that differ only in which worker is which.
#[derive(Clone, Debug, Serialize)]
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
    pub broken: u16,
    /// Guarantees broken at rest (only set in final states).
    pub broken_at_rest: u16,
}

/// Bit `n` for guarantee S`n`.
#[must_use]
pub fn guarantee_bit(g: Guarantee) -> u16 {
    1 << g.number()
}

// Every guarantee has its bit in a `u16`.
const _: () = {
    let mut i = 0;
    while i < Guarantee::ALL.len() {
        assert!(
            Guarantee::ALL[i].number() < 16,
            "one bit per guarantee in a u16"
        );
        i += 1;
    }
};

/// A step of the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Action {
    /// The API handles `POST /runs` for run `n` in one step: INSERT, XADD
    /// (whose fate this is: a lost publish is left to the outbox), mark.
    Submit(u8, Fate),
    /// `POST /runs/{n}/cancel`.
    Cancel(u8),
    /// Worker `w` reads new entries (XREADGROUP COUNT 1), sent and executed
    /// in one step.
    Fetch(u8, Fate),
    /// Worker `w` starts a reclaim round; its first command is executed in
    /// the same step.
    Reclaim(u8, Fate),
    /// One of worker `w`'s outstanding commands is executed.
    Step(u8, Source, Fate),
    /// Worker `w`'s job performs its side effect.
    Effect(u8),
    /// Worker `w`'s job ends.
    Finish(u8, OutcomeKind),
    /// Maintenance runs one pass in one step; the fate is its first XADD's.
    Maintain(MaintenanceTask, Fate),
    /// Fault: worker `w` is killed and restarts empty.
    Crash(u8),
    /// Fault: worker `w` stops (past its lease).
    Pause(u8),
    /// Worker `w` continues.
    Resume(u8),
    /// A long time passes: every lease, retry time and idle time expires,
    /// and every live worker's heartbeat timer fires, in the order of
    /// permutation `k` of the workers (every order is explored when two or
    /// more workers heartbeat: their heartbeats race for the same PEL entry
    /// and run row).
    Tick(u8),
    /// Fault: Redis restarts without persistence.
    RedisWipe,
    /// Fault: Redis restarts having lost its newest write.
    RedisLoseNewest,
    /// Fault: the stream is trimmed below its oldest pending ID.
    Trim,
}

/// The fate of command `c` in a multi-command step whose fault point is its
/// first XADD: that XADD takes `fate` (leaving `Reply` behind), every other
/// command gets its reply.
fn publish_fate(c: &Command, fate: &mut Fate) -> Fate {
    if matches!(c, Command::Stream(StreamOp::Publish { .. })) {
        std::mem::replace(fate, Fate::Reply)
    } else {
        Fate::Reply
    }
}

fn run_id(n: u8) -> RunId {
    RunId(u64::from(n) + 1)
}

impl State {
    /// The initial state: empty Redis (with the group), empty Postgres.
    #[must_use]
    pub fn initial(cfg: &Config) -> State {
        let mut world = World::new();
        for _ in 0..cfg.faults.malformed {
            // Malformed entries are there from the start: where they stand
            // among the runs' entries changes nothing but the interleaving.
            let entry = JobEntry::Malformed {
                reason: "missing run_id".into(),
            };
            let _ = world.stream(&StreamOp::Publish { entry, now: NOW }, Issuer::default());
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

    /// What may happen to an XADD that publishes a run. Worker commands
    /// always get their reply: a lost request or reply ends the delivery and
    /// leaves its entry pending, which is what a crash at that step does, and
    /// crashes strike at every step.
    fn publish_fates(&self) -> Vec<Fate> {
        let b = &self.budget;
        let mut fates = vec![Fate::Reply];
        if b.total > 0 && b.lost > 0 {
            fates.extend([Fate::LostReply, Fate::LostRequest]);
        }
        if b.total > 0 && b.duplicates > 0 {
            fates.push(Fate::Duplicated);
        }
        fates
    }

    /// Every enabled action. Each is guarded so that it changes the state:
    /// a state with no action is final, and the quiescence properties (S1,
    /// S9, S10) are checked there.
    pub fn actions(&self, cfg: &Config, out: &mut Vec<Action>) {
        let publish = self.publish_fates();
        let reply = [Fate::Reply];
        let b = if self.budget.total > 0 {
            self.budget
        } else {
            Budget::default()
        };
        let jobs = &self.world.redis.jobs;
        for (i, api) in self.api.iter().enumerate() {
            let n = i as u8;
            if *api == ApiRun::NotYet {
                out.extend(publish.iter().map(|f| Action::Submit(n, *f)));
            }
            if b.cancels > 0
                && self
                    .world
                    .db
                    .runs
                    .get(&run_id(n))
                    .is_some_and(|r| !r.status.is_terminal())
            {
                out.push(Action::Cancel(n));
            }
        }
        let undelivered = match &jobs.group {
            None => true,
            Some(g) => jobs
                .entries
                .range(g.last_delivered..)
                .any(|(id, _)| *id > g.last_delivered),
        };
        let reclaimable = match &jobs.group {
            None => false,
            Some(g) => g.pel.iter().any(|(id, p)| {
                !jobs.entries.contains_key(id)
                    || NOW.ms_since(p.delivery_time) >= cfg.policy.reclaim_min_idle_ms
            }),
        };
        for (i, w) in self.workers.iter().enumerate() {
            let n = i as u8;
            let holds = w.delivery.is_some() || !w.outstanding.is_empty() || !w.reclaimer.is_idle();
            if b.crashes > 0 && holds {
                out.push(Action::Crash(n));
            }
            if w.paused {
                out.push(Action::Resume(n));
                continue;
            }
            let writing = w.outstanding.iter().any(|(s, c)| {
                *s == Source::Delivery
                    && matches!(c, Command::Db(op) if op.fenced_write().is_some())
            });
            if b.pauses > 0 && (w.job.is_some() || writing) {
                out.push(Action::Pause(n));
            }
            for (src, _) in &w.outstanding {
                out.extend(reply.iter().map(|f| Action::Step(n, *src, *f)));
            }
            let free = w.delivery.is_none() && w.backlog.is_none() && w.outstanding.is_empty();
            if free && w.reclaimer.is_idle() {
                if undelivered {
                    out.extend(reply.iter().map(|f| Action::Fetch(n, *f)));
                }
                if reclaimable || jobs.group.is_none() || w.reclaimer.unrecovered().next().is_some()
                {
                    out.extend(reply.iter().map(|f| Action::Reclaim(n, *f)));
                }
            }
            if let Some(job) = &w.job {
                if job.effect_done {
                    out.extend(cfg.outcomes.iter().map(|o| Action::Finish(n, *o)));
                } else {
                    out.push(Action::Effect(n));
                }
            }
        }
        for task in [
            MaintenanceTask::Retries,
            MaintenanceTask::Outbox,
            MaintenanceTask::Sweep,
        ] {
            if self.maintenance_matters(cfg, task) {
                let publishes = task != MaintenanceTask::Retries;
                let fates: &[Fate] = if publishes { &publish } else { &reply };
                out.extend(fates.iter().map(|f| Action::Maintain(task, *f)));
            }
        }
        // Progress is urgent: time passes only when every role waits (for
        // a job or for time). A worker that stalls mid-command is the pause
        // fault, which holds its command across the tick. Submissions are the
        // users' doing: time may pass before them.
        let waiting = !out.iter().any(|a| {
            matches!(
                a,
                Action::Fetch(..) | Action::Reclaim(..) | Action::Step(..) | Action::Maintain(..)
            )
        });
        if waiting && self.ageable() {
            // Heartbeats of different runs on different entries touch
            // different rows and PEL entries, so they commute: one order
            // covers them. Two on the same run or entry race: every order.
            let beating: Vec<(RunId, EntryId)> = (0..self.workers.len())
                .filter(|w| self.would_heartbeat(*w))
                .filter_map(|w| {
                    let d = self.workers[w].delivery.as_ref()?;
                    Some((d.run()?.0, d.entry()))
                })
                .collect();
            let race = beating.iter().enumerate().any(|(i, (run, entry))| {
                beating[i + 1..].iter().any(|(r, e)| r == run || e == entry)
            });
            let orders = if race {
                permutations(self.workers.len()).len()
            } else {
                1
            };
            out.extend((0..orders).map(|k| Action::Tick(k as u8)));
        }
        if b.redis_wipes > 0 && jobs.exists {
            out.push(Action::RedisWipe);
        }
        if b.redis_losses > 0 && jobs.entries.keys().next_back() == Some(&jobs.last_id) {
            out.push(Action::RedisLoseNewest);
        }
        if b.trims > 0 && jobs.pel_len() > 0 {
            out.push(Action::Trim);
        }
    }

    fn maintenance_matters(&self, cfg: &Config, task: MaintenanceTask) -> bool {
        let db = &self.world.db;
        match task {
            MaintenanceTask::Retries => db
                .runs
                .values()
                .any(|r| r.status == RunStatus::RetryWait && r.retry_at.is_some_and(|t| t <= NOW)),
            MaintenanceTask::Outbox => {
                !pelican_model::injects!(cfg.policy, NoPublishRecovery)
                    && !db.unpublished(1).is_empty()
            }
            MaintenanceTask::Sweep => db
                .orphan_candidates(NOW, cfg.policy.sweep_grace_ms, usize::MAX)
                .iter()
                .any(|c| !self.locatable(c)),
        }
    }

    fn locatable(&self, c: &Candidate) -> bool {
        let Some(id) = c.entry_id else { return false };
        still_deliverable(c, &self.world.redis.locate(id))
    }

    fn ageable(&self) -> bool {
        let fresh = |t: &Option<pelican_model::time::Timestamp>| t.is_some_and(|t| t.as_ms() > 0);
        self.world.db.runs.values().any(|r| {
            !r.status.is_terminal()
                && (fresh(&r.lease_until) || fresh(&r.retry_at) || fresh(&r.published_at))
        }) || self
            .world
            .redis
            .jobs
            .group
            .as_ref()
            .is_some_and(|g| g.pel.values().any(|p| p.delivery_time.as_ms() > 0))
    }

    /// Applies `action`, then normalizes the state.
    pub fn step(&mut self, cfg: &Config, action: Action) {
        self.apply(cfg, action);
        self.normalize();
        self.derive(cfg);
    }

    /// Clamps counters that no protocol decision reads, so that states which
    /// differ only in them are one state and the state space is finite:
    /// PEL delivery counts (1 = delivered once, 2 = redelivered) and the
    /// effect ledger's request counts (1 = applied once, 2 = repeated).
    fn normalize(&mut self) {
        if let Some(g) = self.world.redis.jobs.group.as_mut() {
            for p in g.pel.values_mut() {
                p.delivery_count = p.delivery_count.min(2);
            }
        }
        for n in self.world.db.effects.values_mut() {
            *n = (*n).min(2);
        }
        if self.budget.total == 0 {
            self.budget = Budget::default();
        }
    }

    fn apply(&mut self, cfg: &Config, action: Action) {
        match action {
            Action::Submit(n, fate) => self.submit(cfg, n, fate),
            Action::Cancel(n) => {
                self.budget.cancels -= 1;
                self.budget.total -= 1;
                let running = self
                    .world
                    .db
                    .runs
                    .get(&run_id(n))
                    .is_some_and(|r| r.status == RunStatus::Running);
                let rows = self
                    .world
                    .db(&DbOp::Cancel { run: run_id(n) }, Issuer::default());
                if running
                    && rows == DbReply::Rows(1)
                    && self
                        .workers
                        .iter()
                        .any(|w| w.job.as_ref().is_some_and(|j| j.run == run_id(n)))
                {
                    self.seen.cancel_beat_result = true;
                }
            }
            Action::Fetch(w, fate) => {
                let consumer = WorkerId(u32::from(w)).consumer();
                let op = StreamOp::Read {
                    consumer,
                    count: 1,
                    now: NOW,
                };
                self.workers[usize::from(w)]
                    .outstanding
                    .push((Source::Fetch, Command::Stream(op)));
                self.worker_step(cfg, w, Source::Fetch, fate);
            }
            Action::Reclaim(w, fate) => {
                let wp = &mut self.workers[usize::from(w)];
                wp.reclaimer.start(NOW, 1);
                self.drain_reclaimer(cfg, w);
                if self.workers[usize::from(w)]
                    .outstanding
                    .iter()
                    .any(|(s, _)| *s == Source::Reclaimer)
                {
                    self.worker_step(cfg, w, Source::Reclaimer, fate);
                }
            }
            Action::Step(w, src, fate) => self.worker_step(cfg, w, src, fate),
            Action::Effect(w) => {
                let job = self.workers[usize::from(w)].job.as_mut().expect("guarded");
                job.effect_done = true;
                let (run, fence) = (job.run, job.fence);
                let key = cfg.policy.idempotency_key(run, 0, fence);
                let by = Issuer {
                    worker: Some(WorkerId(u32::from(w))),
                    own_fence: Some(fence),
                };
                let applied = self.world.db(&DbOp::ApplyEffect { key }, by) == DbReply::Rows(1);
                self.world.effect_applied(run, 0, applied);
            }
            Action::Finish(w, kind) => {
                let wp = &mut self.workers[usize::from(w)];
                wp.job = None;
                let outcome = match kind {
                    OutcomeKind::Success => JobOutcome::Succeeded {
                        result: String::new(),
                    },
                    OutcomeKind::Retryable => JobOutcome::Failed {
                        class: ErrorClass::Retryable,
                        message: String::new(),
                    },
                    OutcomeKind::Terminal => JobOutcome::Failed {
                        class: ErrorClass::Terminal,
                        message: String::new(),
                    },
                    OutcomeKind::Panic => JobOutcome::Failed {
                        class: ErrorClass::Panic,
                        message: String::new(),
                    },
                };
                if let Some(d) = wp.delivery.as_mut() {
                    d.handle(NOW, Input::Executed(outcome));
                }
                self.drain_delivery(cfg, w);
            }
            Action::Maintain(task, mut fate) => {
                let mut m = Maintenance::new(&cfg.policy);
                m.start(NOW, task);
                while let Some(c) = m.poll() {
                    let this = publish_fate(&c, &mut fate);
                    let input = self.execute(&c, Issuer::default(), this);
                    m.handle(NOW, input);
                }
                debug_assert!(m.is_idle());
            }
            Action::Crash(w) => {
                self.budget.crashes -= 1;
                self.budget.total -= 1;
                self.workers[usize::from(w)] = Proc::new(WorkerProc::new(cfg, w));
                self.world.worker_crashed(WorkerId(u32::from(w)));
            }
            Action::Pause(w) => {
                self.budget.pauses -= 1;
                self.budget.total -= 1;
                self.workers[usize::from(w)].paused = true;
            }
            Action::Resume(w) => self.workers[usize::from(w)].paused = false,
            Action::Tick(k) => {
                self.world.redis.jobs.age_all();
                self.world.db.age_all();
                // Time passed while jobs ran: a live worker's heartbeat timer
                // fired meanwhile (a late heartbeat is the pause fault).
                for w in &permutations(self.workers.len())[usize::from(k)] {
                    self.heartbeat(cfg, *w as u8);
                }
            }
            // The checker's clock is frozen, but a real restart happens
            // later: new IDs exceed every ID from before. Carrying `last_id`
            // across the restart says so; XADD only compares against it.
            Action::RedisWipe => {
                self.budget.redis_wipes -= 1;
                self.budget.total -= 1;
                self.seen.redis_wiped = true;
                let last = self.world.redis.jobs.last_id;
                self.world.redis_wiped();
                self.world.redis.jobs.last_id = last;
            }
            Action::RedisLoseNewest => {
                self.budget.redis_losses -= 1;
                self.budget.total -= 1;
                let last = self.world.redis.jobs.last_id;
                self.world.redis.jobs.lose_newest();
                self.world.redis.jobs.last_id = last;
            }
            Action::Trim => {
                self.budget.trims -= 1;
                self.budget.total -= 1;
                let jobs = &mut self.world.redis.jobs;
                let oldest = *jobs
                    .group
                    .as_ref()
                    .and_then(|g| g.pel.keys().next())
                    .expect("guarded");
                jobs.xtrim(Trim::MinId(oldest.successor().expect("not the last ID")));
            }
        }
    }

    fn execute(&mut self, c: &Command, by: Issuer, fate: Fate) -> Input {
        match fate {
            Fate::Reply => {}
            Fate::LostReply | Fate::LostRequest => {
                self.budget.lost -= 1;
                self.budget.total -= 1;
            }
            Fate::Duplicated => {
                self.budget.duplicates -= 1;
                self.budget.total -= 1;
                let _ = self.execute(c, by, Fate::Reply);
            }
        }
        if fate == Fate::LostRequest {
            return Input::Unavailable;
        }
        let input = match c {
            Command::Db(op) => {
                let reply = self.world.db(op, by);
                self.observe(op, &reply);
                Input::Db(reply)
            }
            Command::Stream(op) => Input::Stream(self.world.stream(op, by)),
            other => unreachable!("only I/O commands are outstanding, not {other:?}"),
        };
        if fate == Fate::LostReply {
            Input::Unavailable
        } else {
            input
        }
    }

    fn observe(&mut self, op: &DbOp, reply: &DbReply) {
        match (op, reply) {
            (DbOp::RequeueEntry { .. }, DbReply::Rows(n)) if *n > 0 => {
                self.seen.trimmed_recovered = true;
            }
            (op, DbReply::Rows(0)) => {
                if let Some((run, fence)) = op.fenced_write()
                    && self
                        .world
                        .db
                        .runs
                        .get(&run)
                        .is_some_and(|r| r.active_fence > fence)
                {
                    self.seen.late_write_rejected = true;
                }
            }
            _ => {}
        }
    }

    fn submit(&mut self, cfg: &Config, n: u8, mut fate: Fate) {
        let mut s = Submitter::new(&cfg.policy, run_id(n), "", "");
        while let Some(c) = s.poll() {
            let this = publish_fate(&c, &mut fate);
            let input = self.execute(&c, Issuer::default(), this);
            s.handle(NOW, input);
            if s.is_accepted() {
                self.world.accepted.insert(s.run());
            }
        }
        debug_assert!(s.end().is_some());
        self.api[usize::from(n)] = ApiRun::Done;
    }

    fn worker_step(&mut self, cfg: &Config, w: u8, src: Source, fate: Fate) {
        let wi = usize::from(w);
        let pos = self.workers[wi]
            .outstanding
            .iter()
            .position(|(s, _)| *s == src)
            .expect("guarded");
        let (_, c) = self.workers[wi].outstanding.remove(pos);
        let own_fence = match src {
            Source::Delivery => self.workers[wi]
                .delivery
                .as_ref()
                .and_then(Delivery::own_fence),
            _ => None,
        };
        let by = Issuer {
            worker: Some(WorkerId(u32::from(w))),
            own_fence,
        };
        let input = self.execute(&c, by, fate);
        match src {
            Source::Fetch => match input {
                Input::Stream(Ok(StreamReply::Entries(got))) => {
                    if let Some((id, job)) = got.into_iter().next() {
                        self.start_delivery(cfg, w, id, job);
                    }
                }
                Input::Stream(Err(StreamError::NoGroup)) => {
                    self.workers[wi]
                        .outstanding
                        .push((Source::Fetch, Command::Stream(StreamOp::EnsureGroup)));
                }
                _ => {}
            },
            Source::Delivery => {
                if let Some(d) = self.workers[wi].delivery.as_mut() {
                    d.handle(NOW, input);
                }
                self.drain_delivery(cfg, w);
            }
            Source::Reclaimer => {
                self.workers[wi].reclaimer.handle(NOW, input);
                self.drain_reclaimer(cfg, w);
            }
        }
    }

    /// Fires worker `w`'s heartbeat timer if its job runs, and runs the
    /// renewal it sends in the same step.
    /// Whether worker `w`'s heartbeat timer would fire now: it is running
    /// a job and waits for nothing else.
    fn would_heartbeat(&self, w: usize) -> bool {
        let wp = &self.workers[w];
        let busy = wp.outstanding.iter().any(|(s, _)| *s == Source::Delivery);
        !wp.paused && !busy && wp.delivery.as_ref().is_some_and(Delivery::is_executing)
    }

    fn heartbeat(&mut self, cfg: &Config, w: u8) {
        if !self.would_heartbeat(usize::from(w)) {
            return;
        }
        let d = self.workers[usize::from(w)]
            .delivery
            .as_mut()
            .expect("would heartbeat");
        d.handle(NOW, Input::Timer);
        self.drain_delivery(cfg, w);
        if self.workers[usize::from(w)]
            .outstanding
            .iter()
            .any(|(s, c)| {
                *s == Source::Delivery && matches!(c, Command::Db(DbOp::Heartbeat { .. }))
            })
        {
            self.worker_step(cfg, w, Source::Delivery, Fate::Reply);
        }
    }

    fn start_delivery(&mut self, cfg: &Config, w: u8, id: EntryId, job: JobEntry) {
        let d = Delivery::new(NOW, &cfg.policy, WorkerId(u32::from(w)), id, job, 0);
        self.workers[usize::from(w)].delivery = Some(d);
        self.drain_delivery(cfg, w);
    }

    fn drain_delivery(&mut self, cfg: &Config, w: u8) {
        let wi = usize::from(w);
        loop {
            let wp = &mut self.workers[wi];
            let Some(d) = wp.delivery.as_mut() else {
                return;
            };
            let Some(c) = d.poll() else { break };
            match c {
                Command::Stream(StreamOp::Touch { .. }) => {
                    // The heartbeat's PEL idle reset follows its lease
                    // renewal in the same step: nothing observes the gap.
                    let Command::Stream(op) = &c else {
                        unreachable!()
                    };
                    let reply = self.world.stream(op, Issuer::default());
                    if let Some(d) = self.workers[wi].delivery.as_mut() {
                        d.handle(NOW, Input::Stream(reply));
                    }
                }
                Command::Db(DbOp::ReadRun { .. }) => {
                    // A pure read runs in the step that issued it: what the
                    // delivery does next is guarded by conditional writes,
                    // or is an ack that is safe whenever it is decided.
                    let by = Issuer {
                        worker: Some(WorkerId(u32::from(w))),
                        own_fence: d.own_fence(),
                    };
                    let Command::Db(op) = &c else { unreachable!() };
                    let reply = self.world.db(op, by);
                    if let Some(d) = self.workers[wi].delivery.as_mut() {
                        d.handle(NOW, Input::Db(reply));
                    }
                }
                Command::Db(_) | Command::Stream(_) => {
                    debug_assert!(!wp.outstanding.iter().any(|(s, _)| *s == Source::Delivery));
                    wp.outstanding.push((Source::Delivery, c));
                }
                Command::Execute(e) => {
                    let own = d.own_fence();
                    wp.job = Some(Job {
                        run: e.run,
                        fence: e.fence,
                        effect_done: false,
                    });
                    self.world.check_execution(e.run, own);
                }
                Command::Abort => wp.job = None,
                Command::SetTimer(_) => {}
            }
        }
        let wp = &mut self.workers[wi];
        if wp.delivery.as_ref().is_some_and(Delivery::is_done) {
            wp.delivery = None;
            wp.job = None;
            if let Some((id, job)) = wp.backlog.take() {
                self.start_delivery(cfg, w, id, job);
            }
        }
    }

    fn drain_reclaimer(&mut self, cfg: &Config, w: u8) {
        let wi = usize::from(w);
        let wp = &mut self.workers[wi];
        while let Some(c) = wp.reclaimer.poll() {
            wp.outstanding.push((Source::Reclaimer, c));
        }
        let mut deliver = None;
        while let Some(ev) = wp.reclaimer.poll_event() {
            if let ReclaimerEvent::Deliver(id, job) = ev {
                debug_assert!(deliver.is_none(), "the model reclaims one entry at a time");
                deliver = Some((id, job));
            }
        }
        let held: BTreeSet<EntryId> = wp.reclaimer.unrecovered().collect();
        self.world.check_trimmed_held(WorkerId(u32::from(w)), &held);
        if let Some((id, job)) = deliver {
            if self.workers[wi].delivery.is_none() {
                self.start_delivery(cfg, w, id, job);
            } else {
                self.workers[wi].backlog = Some((id, job));
            }
        }
    }
}

impl WorkerProc {
    /// Worker `from`'s process as worker `perm[from]`'s (see
    /// [`State::permuted`]): every consumer name it holds renamed.
    fn relabel(&mut self, from: usize, perm: &[u32]) {
        let to = WorkerId(perm[from]);
        if let Some(d) = self.delivery.as_mut() {
            d.relabel(to);
        }
        self.reclaimer.relabel(to);
        for (_, c) in &mut self.outstanding {
            c.rename_consumer(&|name| rename(name, perm));
        }
    }
}

/// Worker `i`'s consumer name, for worker `perm[i]`; other names unchanged.
fn rename(name: &str, perm: &[u32]) -> String {
    match worker_number(name, perm) {
        Some(j) => WorkerId(j).consumer(),
        None => name.to_owned(),
    }
}

/// `perm[i]` if `name` is worker `i`'s consumer name.
fn worker_number(name: &str, perm: &[u32]) -> Option<u32> {
    let i = match name.as_bytes() {
        // The checker's workers are w0..w9: the fast path.
        [b'w', d] if d.is_ascii_digit() => usize::from(d - b'0'),
        _ => name.strip_prefix('w')?.parse::<usize>().ok()?,
    };
    perm.get(i).copied()
}

/// Hashes a consumer name as worker `perm[i]`'s if it is worker `i`'s.
fn hash_consumer<H: Hasher>(name: &str, perm: &[u32], h: &mut H) {
    match worker_number(name, perm) {
        Some(j) => (0u8, j).hash(h),
        None => (1u8, name).hash(h),
    }
}

/// Symmetry: workers are interchangeable, so states that differ only in
/// which worker is which are one. [`State::fingerprint`] gives all of them
/// one fingerprint — the smallest over every relabeling of the workers — so
/// the checker keeps one of them. A relabeling is a symmetry of the model
/// (the test `worker_relabeling_is_a_symmetry` checks it along random
/// walks): it maps enabled actions to enabled actions, successors to
/// successors, and no property tells relabeled states apart. Hence every
/// verdict is unchanged, and a path found in the reduced space is a path of
/// the model (the checker continues from the state it reached, never from a
/// relabeled one).
impl State {
    /// The same state with worker `i` renamed `perm[i]` (fingerprinted with
    /// or without `symmetry`).
    #[must_use]
    pub fn permuted(&self, perm: &[u32], symmetry: bool) -> State {
        let mut next = self.clone();
        let mut workers: Vec<Option<Proc>> = vec![None; self.workers.len()];
        for (i, w) in self.workers.iter().enumerate() {
            let mut w = WorkerProc::clone(w);
            w.relabel(i, perm);
            workers[perm[i] as usize] = Some(Proc::new(w));
        }
        next.workers = workers
            .into_iter()
            .map(|w| w.expect("a permutation"))
            .collect();
        if let Some(g) = next.world.redis.jobs.group.as_mut() {
            for p in g.pel.values_mut() {
                p.consumer = rename(&p.consumer, perm);
            }
            g.consumers = g.consumers.iter().map(|c| rename(c, perm)).collect();
        }
        for a in next.world.db.attempts.values_mut() {
            a.worker = rename(&a.worker, perm);
        }
        next.world.trimmed_owed = self
            .world
            .trimmed_owed
            .iter()
            .map(|(w, ids)| (WorkerId(perm[w.0 as usize]), ids.clone()))
            .collect();
        next.fp = next.fingerprint(symmetry);
        next
    }

    /// The fingerprint: with `symmetry`, the smallest of
    /// [`State::fingerprint_as`] over every relabeling of the workers (one
    /// value for the whole symmetry class); without, the identity's.
    #[must_use]
    pub fn fingerprint(&self, symmetry: bool) -> u64 {
        let mut common = fp_hasher();
        self.hash_unlabeled(&mut common);
        let procs = self.process_fingerprints();
        let perms = permutations(self.workers.len());
        let mut best = self.hash_labeled(&perms[0], &procs, common.clone());
        if symmetry {
            for perm in &perms[1..] {
                best = best.min(self.hash_labeled(perm, &procs, common.clone()));
            }
        }
        best
    }

    /// The fingerprint `self.permuted(perm)` has without symmetry, computed
    /// without building it.
    #[must_use]
    pub fn fingerprint_as(&self, perm: &[u32]) -> u64 {
        let mut common = fp_hasher();
        self.hash_unlabeled(&mut common);
        self.hash_labeled(perm, &self.process_fingerprints(), common)
    }

    /// Each worker process's hash as if it were worker 0. A process names
    /// no worker but itself, and its place in [`State::workers`] says which
    /// it is, so this loses nothing; and a relabeling of the workers only
    /// reorders these hashes.
    fn process_fingerprints(&self) -> Vec<u64> {
        let n = self.workers.len();
        self.workers
            .iter()
            .enumerate()
            .map(|(i, w)| w.fingerprint(i, n))
            .collect()
    }

    /// Hashes every field that names no worker. The destructuring lists
    /// every field, so that a new one cannot be forgotten here.
    fn hash_unlabeled(&self, h: &mut FpHasher) {
        let State {
            world,
            workers: _, // labeled
            api,
            budget,
            seen,
            derived: _, // a function of the rest
            fp: _,
        } = self;
        let World {
            redis,
            db,
            accepted,
            entries,
            quarantined,
            effects,
            trimmed_owed: _, // labeled
            violations,
        } = world;
        let pelican_model::stream::Stream {
            exists,
            entries: stream_entries,
            last_id,
            entries_added,
            max_deleted,
            group,
        } = &redis.jobs;
        (exists, stream_entries, last_id, entries_added, max_deleted).hash(h);
        match group {
            None => 0u8.hash(h),
            Some(pelican_model::stream::Group {
                name,
                last_delivered,
                entries_read,
                pel,
                consumers: _, // labeled
            }) => {
                (1u8, name, last_delivered, entries_read, pel.len()).hash(h);
                for (id, p) in pel {
                    let pelican_model::stream::Pending {
                        consumer: _, // labeled
                        delivery_time,
                        delivery_count,
                    } = p;
                    (id, delivery_time, delivery_count).hash(h);
                }
            }
        }
        redis.dead.hash(h);
        let pelican_model::db::Db {
            runs,
            attempts,
            effects: db_effects,
            dead_letters,
            run_ids,
        } = db;
        (runs, db_effects, dead_letters, run_ids, attempts.len()).hash(h);
        for (key, a) in attempts {
            let pelican_model::db::AttemptRow {
                fence,
                worker: _, // labeled
                entry_id,
                dispatch,
                outcome,
            } = a;
            (key, fence, entry_id, dispatch, outcome).hash(h);
        }
        (accepted, entries, quarantined, effects, violations).hash(h);
        (api, budget, seen).hash(h);
    }

    /// Finishes `h` with every field that names a worker, each as if worker
    /// `i` were worker `perm[i]` (`procs`: [`State::process_fingerprints`]).
    fn hash_labeled(&self, perm: &[u32], procs: &[u64], mut h: FpHasher) -> u64 {
        if let Some(g) = &self.world.redis.jobs.group {
            for p in g.pel.values() {
                hash_consumer(&p.consumer, perm, &mut h);
            }
            // Other names as they come (relabeling moves none of them), then
            // the workers' names as a bit set, which does not depend on the
            // order the relabeling puts them in.
            let mut known: u128 = 0;
            for c in &g.consumers {
                match worker_number(c, perm) {
                    Some(j) if j < 128 => known |= 1 << j,
                    _ => c.hash(&mut h),
                }
            }
            known.hash(&mut h);
        }
        for a in self.world.db.attempts.values() {
            hash_consumer(&a.worker, perm, &mut h);
        }
        let owed = &self.world.trimmed_owed;
        let mut relabeled: Vec<(u32, &BTreeSet<EntryId>)> = owed
            .iter()
            .map(|(w, ids)| (perm.get(w.0 as usize).copied().unwrap_or(w.0), ids))
            .collect();
        relabeled.sort_unstable_by_key(|(w, _)| *w);
        relabeled.hash(&mut h);
        procs.len().hash(&mut h);
        for j in 0..procs.len() {
            let i = perm
                .iter()
                .position(|p| *p as usize == j)
                .expect("a permutation");
            h.write_u64(procs[i]);
        }
        h.finish()
    }
}

/// The fingerprints' hash function: foldhash's quality variant with a fixed
/// seed (64 well-mixed bits, a few times faster than SipHash on the many
/// small writes of a derived `Hash`; the visited set trusts 64-bit
/// fingerprints either way, as stateright's own do).
type FpHasher = foldhash::quality::FoldHasher<'static>;

fn fp_hasher() -> FpHasher {
    foldhash::quality::FixedState::with_seed(0x7065_6c69_6361_6e21).build_hasher()
}

/// The index in [`permutations`]`(n)` of the transposition of 0 and `i`.
fn swap_index(n: usize, i: usize) -> usize {
    permutations(n)
        .iter()
        .position(|p| {
            p.iter().enumerate().all(|(k, v)| {
                *v as usize
                    == match k {
                        0 => i,
                        k if k == i => 0,
                        k => k,
                    }
            })
        })
        .expect("every transposition is a permutation")
}

/// Every permutation of `0..n`, the identity first (cached for small `n`).
fn permutations(n: usize) -> &'static [Vec<u32>] {
    static CACHE: OnceLock<Vec<Vec<Vec<u32>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(|| (0..=5).map(all_permutations).collect());
    cache
        .get(n)
        .expect("symmetry reduction over at most five workers")
}

fn all_permutations(n: usize) -> Vec<Vec<u32>> {
    if n == 0 {
        return vec![Vec::new()];
    }
    let mut out = Vec::new();
    for p in all_permutations(n - 1) {
        for at in (0..=p.len()).rev() {
            let mut q = p.clone();
            q.insert(at, (n - 1) as u32);
            out.push(q);
        }
    }
    out
}
