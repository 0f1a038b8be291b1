// Over 600 lines: one action's effect per method, over one state.
//! Applying an action to a state: the API, the workers' role machines and
//! maintenance run their commands against the world, and faults strike.

use super::symmetry::permutations;
use super::{Action, ApiRun, Fate, Job, Proc, Source, State, WorkerProc, run_id};
use crate::NOW;
use crate::config::{Budget, Config, OutcomeKind};
use pelican_model::db::{Delay, QueryError, query};
use pelican_model::ids::{EntryId, Partition, RunId, WorkerId};
use pelican_model::protocol::{
    Command, DbOp, DbReply, Delivery, Input, JobEntry, Ledger, Maintenance, MaintenanceTask,
    ProviderLimit, ReclaimerEvent, StepPlan, StreamOp, StreamReply, Submitter, SubmitterEnd,
    progress, progressed,
};
use pelican_model::status::{ErrorClass, JobOutcome, RunStatus};
use pelican_model::stream::{StreamError, Trim};
use pelican_model::time::Timestamp;
use pelican_model::world::Issuer;
use std::collections::BTreeSet;

/// The name of the one step a job of a configuration with steps takes.
const STEP: &str = "call";

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

/// The partition a stream command touches (0 for any other).
fn c_partition(c: &Command) -> Partition {
    match c {
        Command::Stream(op) => op.partition().unwrap_or(0),
        _ => 0,
    }
}

impl State {
    /// Applies `action`, then normalizes the state.
    pub fn step(&mut self, cfg: &Config, action: Action) {
        self.apply(cfg, action);
        self.normalize();
        self.derive(cfg);
    }

    /// Clamps the effect ledger's request counts (1 = applied once, 2 =
    /// repeated), which no protocol decision reads, so that states which
    /// differ only in them are one state and the state space is finite
    /// (Postgres is written only when a count is clamped: a write copies
    /// what the state shares with its predecessor). Redis's history
    /// counters are left out of the fingerprint instead (see
    /// `hash_redis_unlabeled`).
    fn normalize(&mut self) {
        if self.world.db.effects.values().any(|n| *n > 2) {
            for n in self.world.db.effects.values_mut() {
                *n = (*n).min(2);
            }
        }
        if self.budget.total == 0 {
            self.budget = Budget::default();
        }
    }

    fn apply(&mut self, cfg: &Config, action: Action) {
        match action {
            Action::Submit(n, fate) => self.submit(cfg, n, fate),
            Action::Resubmit(n) => self.resubmit(cfg, n),
            Action::Cancel(n) => self.cancel(n),
            Action::Fetch(w, p, fate) => self.fetch(cfg, w, p, fate),
            Action::Reclaim(w, fate) => self.reclaim(cfg, w, fate),
            Action::Step(w, src, fate) => self.worker_step(cfg, w, src, fate),
            Action::Effect(w) => self.effect(cfg, w),
            Action::Record(w) => self.record(cfg, w),
            Action::Finish(w, kind) => self.finish(cfg, w, kind),
            Action::Maintain(task, mut fate) => {
                let mut m = Maintenance::new(&cfg.policy);
                m.start(task, NOW);
                while let Some(c) = m.poll() {
                    let this = publish_fate(&c, &mut fate);
                    let input = self.execute(&c, Issuer::default(), this);
                    m.handle(NOW, input);
                }
                debug_assert!(m.is_idle());
                self.seen.consumer_forgotten |=
                    task == MaintenanceTask::Consumers && m.report().rows > 0;
            }
            Action::Schedule(w, fate) => self.schedule(w, fate),
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
                self.world.age_all();
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
                let last: Vec<EntryId> = self.world.redis.jobs.iter().map(|j| j.last_id).collect();
                self.world.redis_wiped();
                for (jobs, last) in self.world.redis.jobs.iter_mut().zip(last) {
                    jobs.last_id = last;
                }
            }
            Action::RedisLoseNewest(p) => {
                self.budget.redis_losses -= 1;
                self.budget.total -= 1;
                let jobs = self.world.redis.part_mut(p);
                let last = jobs.last_id;
                jobs.lose_newest();
                jobs.last_id = last;
            }
            Action::Trim(p) => {
                self.budget.trims -= 1;
                self.budget.total -= 1;
                let jobs = self.world.redis.part_mut(p);
                let oldest = *jobs
                    .group
                    .as_ref()
                    .and_then(|g| g.pel.keys().next())
                    .expect("guarded");
                jobs.xtrim(Trim::MinId(oldest.successor().expect("not the last ID")));
            }
        }
    }

    /// `POST /runs/{n}/cancel`, one of the budget's cancels (noting a cancel
    /// that beats a running attempt's result).
    fn cancel(&mut self, n: u8) {
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

    /// Worker `w` reads new entries of partition `partition`: XREADGROUP
    /// COUNT 1, sent and executed.
    fn fetch(&mut self, cfg: &Config, w: u8, partition: Partition, fate: Fate) {
        let consumer = WorkerId(u32::from(w)).consumer();
        let op = StreamOp::Read {
            partition,
            consumer,
            count: 1,
            now: clock(cfg, w),
        };
        self.workers[usize::from(w)]
            .outstanding
            .push((Source::Fetch, Command::Stream(op)));
        self.worker_step(cfg, w, Source::Fetch, fate);
    }

    /// Worker `w` starts a reclaim round and executes its first command.
    fn reclaim(&mut self, cfg: &Config, w: u8, fate: Fate) {
        let wp = &mut self.workers[usize::from(w)];
        wp.reclaimer.start(clock(cfg, w), 1);
        self.drain_reclaimer(cfg, w);
        if self.workers[usize::from(w)]
            .outstanding
            .iter()
            .any(|(s, _)| *s == Source::Reclaimer)
        {
            self.worker_step(cfg, w, Source::Reclaimer, fate);
        }
    }

    /// Worker `w`'s job performs its side effect. With steps, the effect
    /// is step 0: the job reads its ledger first and replays a recorded
    /// step instead (the read and the effect are one step of the model).
    fn effect(&mut self, cfg: &Config, w: u8) {
        if cfg.limits && !self.leave_to_call(cfg, w) {
            return;
        }
        let job = self.workers[usize::from(w)].job.clone().expect("guarded");
        let (run, fence) = (job.run, job.fence);
        let by = Issuer {
            worker: Some(WorkerId(u32::from(w))),
            own_fence: Some(fence),
        };
        let mut run_it = true;
        if cfg.steps {
            let recorded = (self.world.query(Ledger::read(run), by)).expect("steps are read");
            let mut ledger = Ledger::new(&cfg.policy, run, fence, recorded);
            match ledger.plan(STEP) {
                Ok(StepPlan::Replay(_)) => {
                    self.seen.step_replayed = true;
                    run_it = false;
                }
                Ok(StepPlan::Run(index)) => self.world.step_ran(run, index, fence),
                Err(e) => unreachable!("a job of one step cannot diverge: {e}"),
            }
        }
        let job = self.workers[usize::from(w)].job.as_mut().expect("guarded");
        job.effect_done = true;
        job.record_due = run_it && cfg.steps;
        if run_it {
            let key = cfg.policy.idempotency_key(run, 0, fence);
            let applied = self.world.query(query::ApplyEffect { key }, by) == Ok(true);
            self.world.effect_applied(run, 0, applied);
        }
    }

    /// With limits, worker `w`'s job asks for leave to call the provider:
    /// its permit (kept once granted), then a token. Whether it has both;
    /// if not, it asks again at its next step.
    fn leave_to_call(&mut self, cfg: &Config, w: u8) -> bool {
        const PROVIDER: &str = "p";
        let limit = Config::provider_limit();
        let job = self.workers[usize::from(w)].job.clone().expect("guarded");
        let by = Issuer {
            worker: Some(WorkerId(u32::from(w))),
            own_fence: Some(job.fence),
        };
        if !job.permit {
            let holder = ProviderLimit::holder(job.run, job.fence, 0);
            let acquire = limit
                .acquire(&cfg.policy, PROVIDER, &holder)
                .expect("a concurrency limit");
            let mut granted = self.world.query(acquire.clone(), by) == Ok(1);
            if !granted && self.world.db.slots.is_empty() {
                let ensure = limit.ensure(PROVIDER).expect("a concurrency limit");
                let _ = self.world.query(ensure, by);
                granted = self.world.query(acquire, by) == Ok(1);
            }
            if !granted {
                self.seen.slot_waited = true;
                return false;
            }
            self.workers[usize::from(w)]
                .job
                .as_mut()
                .expect("guarded")
                .permit = true;
        }
        let take = limit.take_token(PROVIDER).expect("a rate limit");
        self.world.query(take, by) == Ok(1)
    }

    /// Worker `w`'s job reports its progress, then records its step
    /// (whatever the answers, the job goes on to its outcome: a refused
    /// write means a later attempt holds the run, and the outcome's write is
    /// refused too).
    fn record(&mut self, cfg: &Config, w: u8) {
        let job = self.workers[usize::from(w)].job.as_mut().expect("guarded");
        job.record_due = false;
        let (run, fence) = (job.run, job.fence);
        let by = Issuer {
            worker: Some(WorkerId(u32::from(w))),
            own_fence: Some(fence),
        };
        let report = progress(&cfg.policy, run, fence, "{}".into()).expect("a small event");
        let answer = self.world.query(report, by).map_err(QueryError::from);
        if progressed(answer).is_err() {
            self.seen.progress_refused = true;
        }
        let op = Ledger::new(&cfg.policy, run, fence, Vec::new())
            .record(0, STEP, "true".into())
            .expect("a small output");
        let _ = self.world.query(op, by);
    }

    /// Worker `w`'s job ends with an outcome of kind `kind`.
    fn finish(&mut self, cfg: &Config, w: u8, kind: OutcomeKind) {
        let wp = &mut self.workers[usize::from(w)];
        if let Some(job) = wp.job.take().filter(|j| j.permit) {
            let by = Issuer {
                worker: Some(WorkerId(u32::from(w))),
                own_fence: Some(job.fence),
            };
            let holder = ProviderLimit::holder(job.run, job.fence, 0);
            let _ = self.world.query(ProviderLimit::release("p", &holder), by);
        }
        let wp = &mut self.workers[usize::from(w)];
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
            OutcomeKind::Poison => JobOutcome::Succeeded {
                result: "\0".into(),
            },
            OutcomeKind::Unknown => JobOutcome::Failed {
                class: ErrorClass::Unknown,
                message: String::new(),
            },
        };
        if let Some(d) = wp.delivery.as_mut() {
            d.handle(clock(cfg, w), Input::Executed(outcome));
        }
        self.drain_delivery(cfg, w);
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
            (DbOp::RunIssued { .. }, DbReply::Rows(1)) => self.seen.retired_delivered = true,
            (
                DbOp::Fail {
                    class: ErrorClass::Unknown,
                    ..
                },
                DbReply::Rows(1),
            ) => self.seen.unknown_capped = true,
            (
                DbOp::Fail {
                    class: ErrorClass::BudgetExhausted,
                    ..
                },
                DbReply::Rows(1),
            ) => self.seen.budget_exhausted = true,
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

    /// Run `n`'s idempotency key: with retention, every submission
    /// carries one (S14); without, none.
    fn key(cfg: &Config, n: u8) -> Option<String> {
        (cfg.policy.keep_finished_ms > 0).then(|| format!("key-{n}"))
    }

    /// The API answers a retry of run `n`'s submission under its key with
    /// a fresh run id, as a client's retry gets; the key must answer run
    /// `n` (S14, checked by the world as the insert executes).
    fn resubmit(&mut self, cfg: &Config, n: u8) {
        let fresh = RunId(run_id(n).0 + 100);
        let s = Submitter::new(&cfg.policy, fresh, "", "", Self::key(cfg, n).as_deref());
        let mut s = s.delayed(Self::delay(cfg, n));
        while let Some(c) = s.poll() {
            let input = self.execute(&c, Issuer::default(), Fate::Reply);
            s.handle(NOW, input);
            if s.is_accepted() {
                self.world.accepted.insert(s.run());
            }
        }
        if s.end() == Some(SubmitterEnd::Existing(run_id(n))) {
            self.seen.key_outlived_run = true;
        }
        self.api[usize::from(n)] = ApiRun::Retried;
    }

    /// Worker `w`'s scheduler: starts a pass if idle, then sends its
    /// next command with `fate` and feeds it the answer.
    fn schedule(&mut self, w: u8, fate: Fate) {
        let mut m = self.workers[usize::from(w)].scheduler.clone();
        if m.is_idle() {
            m.start(MaintenanceTask::Schedules, NOW);
        }
        if let Some(c) = m.poll() {
            let input = self.execute(&c, Issuer::default(), fate);
            m.handle(NOW, input);
        }
        self.workers[usize::from(w)].scheduler = m;
    }

    /// Run `n`'s delay: with delays, the first run is due once time
    /// passes (a tick).
    fn delay(cfg: &Config, n: u8) -> Delay {
        if cfg.delays && n == 0 {
            Delay {
                delay_ms: 1_000,
                at_ms: 0,
            }
        } else {
            Delay::NONE
        }
    }

    fn submit(&mut self, cfg: &Config, n: u8, mut fate: Fate) {
        let s = Submitter::new(&cfg.policy, run_id(n), "", "", Self::key(cfg, n).as_deref());
        let mut s = s.delayed(Self::delay(cfg, n));
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
        let partition = c_partition(&c);
        let input = self.execute(&c, by, fate);
        match src {
            Source::Fetch => match input {
                Input::Stream(Ok(StreamReply::Entries(got))) => {
                    if let Some((id, job)) = got.into_iter().next() {
                        self.start_delivery(cfg, w, id, job);
                    }
                }
                Input::Stream(Err(StreamError::NoGroup)) => {
                    self.workers[wi].outstanding.push((
                        Source::Fetch,
                        Command::Stream(StreamOp::EnsureGroup { partition }),
                    ));
                }
                _ => {}
            },
            Source::Delivery => {
                if let Some(d) = self.workers[wi].delivery.as_mut() {
                    let refused = input == Input::Db(DbReply::Refused);
                    d.handle(clock(cfg, w), input);
                    if let (true, Some((run, _))) = (refused, d.run()) {
                        self.world.check_refusal(run, d.end());
                    }
                }
                self.drain_delivery(cfg, w);
            }
            Source::Reclaimer => {
                self.workers[wi].reclaimer.handle(clock(cfg, w), input);
                self.drain_reclaimer(cfg, w);
            }
        }
    }

    /// Whether worker `w`'s heartbeat timer would fire now: it is running
    /// a job and waits for nothing else.
    pub(super) fn would_heartbeat(&self, w: usize) -> bool {
        let wp = &self.workers[w];
        let busy = wp.outstanding.iter().any(|(s, _)| *s == Source::Delivery);
        !wp.paused && !busy && wp.delivery.as_ref().is_some_and(Delivery::is_executing)
    }

    /// Fires worker `w`'s heartbeat timer if its job runs, and runs the
    /// renewal it sends in the same step.
    fn heartbeat(&mut self, cfg: &Config, w: u8) {
        if !self.would_heartbeat(usize::from(w)) {
            return;
        }
        let d = self.workers[usize::from(w)]
            .delivery
            .as_mut()
            .expect("would heartbeat");
        d.handle(clock(cfg, w), Input::Timer);
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
        let d = Delivery::new(
            clock(cfg, w),
            &cfg.policy,
            WorkerId(u32::from(w)),
            id,
            job,
            0,
        );
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
                        d.handle(clock(cfg, w), Input::Stream(reply));
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
                        d.handle(clock(cfg, w), Input::Db(reply));
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
                        record_due: false,
                        permit: false,
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

/// Worker `w`'s clock: the servers' [`NOW`], but worker 1's runs
/// `cfg.skew_ms` ahead. No statement reads a worker's clock (Postgres's
/// decides every lease) and Redis stamps with its own, so a correct build
/// explores the same states with or without skew.
fn clock(cfg: &Config, w: u8) -> Timestamp {
    if w == 1 { NOW.add_ms(cfg.skew_ms) } else { NOW }
}
