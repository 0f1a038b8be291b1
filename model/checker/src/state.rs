//! The checker's state and its transitions: the world, the role machines of
//! every process, and what is left of the fault budget.

use crate::NOW;
use crate::config::{Budget, Config, OutcomeKind};
use pelican_model::db::Candidate;
use pelican_model::ids::{EntryId, Fence, RunId, WorkerId};
use pelican_model::protocol::{
    Command, DbOp, DbReply, Delivery, Input, JobEntry, Maintenance, MaintenanceTask, Reclaimer,
    ReclaimerEvent, StreamOp, StreamReply, Submitter, still_deliverable,
};
use pelican_model::status::{ErrorClass, JobOutcome, RunStatus};
use pelican_model::stream::{StreamError, Trim};
use pelican_model::world::{Issuer, World};
use serde::Serialize;
use std::collections::BTreeSet;

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
}

/// The whole state.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct State {
    /// Redis, Postgres, effects, history.
    pub world: World,
    /// Worker processes.
    pub workers: Vec<WorkerProc>,
    /// The API, per run.
    pub api: Vec<ApiRun>,
    /// Faults left.
    pub budget: Budget,
    /// History flags.
    pub seen: Seen,
    /// What the properties read, computed once per transition (a function
    /// of the fields above, so it never tells equal states apart).
    pub derived: Derived,
}

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

/// Bit `n` for guarantee "S`n`".
#[must_use]
pub fn guarantee_bit(g: &str) -> u16 {
    1 << g[1..].parse::<u16>().expect("guarantees are named S1..S10")
}

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
    /// A long time passes: every lease, retry time and idle time expires.
    Tick,
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
        State {
            world,
            workers: (0..cfg.workers).map(|w| WorkerProc::new(cfg, w)).collect(),
            api: vec![ApiRun::NotYet; usize::from(cfg.runs)],
            budget: cfg.faults,
            seen: Seen::default(),
            derived: Derived::default(),
        }
        .derive(cfg)
    }

    fn derive(mut self, cfg: &Config) -> State {
        self.derived = self.compute_derived(cfg);
        self
    }

    /// What the properties read about this state, computed afresh.
    #[must_use]
    pub fn compute_derived(&self, cfg: &Config) -> Derived {
        let mut actions = Vec::new();
        self.actions(cfg, &mut actions);
        let bits = |bs: Vec<pelican_model::invariants::Broken>| {
            bs.iter().fold(0, |acc, b| acc | guarantee_bit(b.guarantee))
        };
        let is_final = actions.is_empty();
        Derived {
            is_final,
            broken: bits(pelican_model::invariants::state(&self.world, &cfg.policy)),
            broken_at_rest: if is_final {
                bits(pelican_model::invariants::quiescent(&self.world, &|_| 1))
            } else {
                0
            },
        }
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
            out.push(Action::Tick);
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
                !cfg.policy
                    .is(pelican_model::protocol::Mutant::NoPublishRecovery)
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
        *self = std::mem::replace(self, State::placeholder()).derive(cfg);
    }

    fn placeholder() -> State {
        State {
            world: World::default(),
            workers: Vec::new(),
            api: Vec::new(),
            budget: Budget::default(),
            seen: Seen::default(),
            derived: Derived::default(),
        }
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
                self.workers[usize::from(w)] = WorkerProc::new(cfg, w);
                self.world.worker_crashed(WorkerId(u32::from(w)));
            }
            Action::Pause(w) => {
                self.budget.pauses -= 1;
                self.budget.total -= 1;
                self.workers[usize::from(w)].paused = true;
            }
            Action::Resume(w) => self.workers[usize::from(w)].paused = false,
            Action::Tick => {
                self.world.redis.jobs.age_all();
                self.world.db.age_all();
                // Time passed while jobs ran: a live worker's heartbeat timer
                // fired meanwhile (a late heartbeat is the pause fault).
                for w in 0..self.workers.len() {
                    self.heartbeat(cfg, w as u8);
                }
            }
            // The checker's clock is frozen, but a real restart happens
            // later: new IDs exceed every ID from before. Carrying `last_id`
            // across the restart says so; XADD only compares against it.
            Action::RedisWipe => {
                self.budget.redis_wipes -= 1;
                self.budget.total -= 1;
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
                self.seen.trimmed_recovered = true
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
    fn heartbeat(&mut self, cfg: &Config, w: u8) {
        let wp = &mut self.workers[usize::from(w)];
        let busy = wp.outstanding.iter().any(|(s, _)| *s == Source::Delivery);
        let Some(d) = wp.delivery.as_mut() else {
            return;
        };
        if wp.paused || busy || !d.is_executing() {
            return;
        }
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

/// Symmetry: workers are interchangeable, so states that differ only in
/// which worker is which are one. [`representative`] picks, among every
/// relabeling of the workers, the one with the smallest fingerprint.
impl State {
    /// The same state with worker `i` renamed `perm[i]`.
    #[must_use]
    pub fn permuted(&self, perm: &[u32]) -> State {
        let rename = |name: &str| -> String {
            name.strip_prefix('w')
                .and_then(|n| n.parse::<usize>().ok())
                .and_then(|i| perm.get(i))
                .map_or_else(|| name.to_owned(), |j| WorkerId(*j).consumer())
        };
        let mut next = self.clone();
        let mut workers: Vec<Option<WorkerProc>> = vec![None; self.workers.len()];
        for (i, w) in self.workers.iter().enumerate() {
            let to = perm[i];
            let mut w = w.clone();
            if let Some(d) = w.delivery.as_mut() {
                d.relabel(WorkerId(to));
            }
            w.reclaimer.relabel(WorkerId(to));
            for (_, c) in &mut w.outstanding {
                c.rename_consumer(&rename);
            }
            workers[to as usize] = Some(w);
        }
        next.workers = workers
            .into_iter()
            .map(|w| w.expect("a permutation"))
            .collect();
        if let Some(g) = next.world.redis.jobs.group.as_mut() {
            for p in g.pel.values_mut() {
                p.consumer = rename(&p.consumer);
            }
            g.consumers = g.consumers.iter().map(|c| rename(c)).collect();
        }
        for a in next.world.db.attempts.values_mut() {
            a.worker = rename(&a.worker);
        }
        next.world.trimmed_owed = self
            .world
            .trimmed_owed
            .iter()
            .map(|(w, ids)| (WorkerId(perm[w.0 as usize]), ids.clone()))
            .collect();
        next
    }
}

fn permutations(n: u32) -> Vec<Vec<u32>> {
    if n == 0 {
        return vec![Vec::new()];
    }
    let mut out = Vec::new();
    for p in permutations(n - 1) {
        for at in 0..=p.len() {
            let mut q = p.clone();
            q.insert(at, n - 1);
            out.push(q);
        }
    }
    out
}

/// The representative of `s`'s symmetry class: its worker relabeling with
/// the smallest fingerprint.
#[must_use]
pub fn representative(s: &State) -> State {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let fp = |s: &State| {
        let mut h = DefaultHasher::new();
        s.hash(&mut h);
        h.finish()
    };
    permutations(s.workers.len() as u32)
        .into_iter()
        .map(|p| s.permuted(&p))
        .min_by_key(fp)
        .expect("at least the identity")
}
