//! The model's steps ([`Action`]) and which of them a state enables.

use super::symmetry::permutations;
use super::{ApiRun, Fate, Source, State, run_id};
use crate::NOW;
use crate::config::{Budget, Config, OutcomeKind};
use pelican_model::db::Candidate;
use pelican_model::ids::{EntryId, Partition, RunId, partition_at};
use pelican_model::protocol::{Command, MaintenanceTask, still_deliverable};
use pelican_model::status::RunStatus;
use serde::Serialize;

/// A step of the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Action {
    /// The API handles `POST /runs` for run `n` in one step: INSERT, XADD
    /// (whose fate this is: a lost publish is left to the outbox), mark.
    Submit(u8, Fate),
    /// With retention: `POST /runs` for run `n` again under its key, once
    /// retention has deleted the run (S14), in one step.
    Resubmit(u8),
    /// `POST /runs/{n}/cancel`.
    Cancel(u8),
    /// Worker `w` reads new entries of a partition (XREADGROUP COUNT 1),
    /// sent and executed in one step.
    Fetch(u8, Partition, Fate),
    /// Worker `w` starts a reclaim round; its first command is executed in
    /// the same step.
    Reclaim(u8, Fate),
    /// One of worker `w`'s outstanding commands is executed.
    Step(u8, Source, Fate),
    /// Worker `w`'s job performs its side effect (with steps: reads its
    /// ledger and runs the step, or replays it).
    Effect(u8),
    /// Worker `w`'s job reports its progress and records its step.
    Record(u8),
    /// Worker `w`'s job ends.
    Finish(u8, OutcomeKind),
    /// Maintenance runs one pass in one step; the fate is its first XADD's.
    Maintain(MaintenanceTask, Fate),
    /// Worker `w`'s scheduler sends its next command (its pass's first,
    /// the read of the due schedules, if it is idle), with this fate.
    Schedule(u8, Fate),
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
    /// Fault: Redis restarts having lost its newest write (to a partition).
    RedisLoseNewest(Partition),
    /// Fault: a partition's stream is trimmed below its oldest pending ID.
    Trim(Partition),
}

impl State {
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
        let b = if self.budget.total > 0 {
            self.budget
        } else {
            Budget::default()
        };
        self.api_actions(&b, &publish, out);
        self.worker_actions(cfg, &b, out);
        for task in MaintenanceTask::ALL {
            if self.maintenance_matters(cfg, task) {
                let publishes = matches!(
                    task,
                    MaintenanceTask::Retries | MaintenanceTask::Outbox | MaintenanceTask::Sweep
                );
                let fates: &[Fate] = if publishes { &publish } else { &[Fate::Reply] };
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
                Action::Fetch(..)
                    | Action::Reclaim(..)
                    | Action::Step(..)
                    | Action::Maintain(..)
                    | Action::Schedule(..)
            )
        });
        if waiting && self.ageable() {
            out.extend((0..self.tick_orders()).map(|k| Action::Tick(k as u8)));
        }
        self.redis_faults(&b, out);
    }

    /// The API's actions: submissions, resubmissions under a key,
    /// cancels.
    fn api_actions(&self, b: &Budget, publish: &[Fate], out: &mut Vec<Action>) {
        for (i, api) in self.api.iter().enumerate() {
            let n = i as u8;
            if *api == ApiRun::NotYet {
                out.extend(publish.iter().map(|f| Action::Submit(n, *f)));
            }
            if *api == ApiRun::Done && self.world.retired.contains_key(&run_id(n)) {
                out.push(Action::Resubmit(n));
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
    }

    /// Each worker's actions: its faults, its outstanding commands, its
    /// reads and reclaim rounds when free, its job's next step.
    fn worker_actions(&self, cfg: &Config, b: &Budget, out: &mut Vec<Action>) {
        let reply = [Fate::Reply];
        let redis = &self.world.redis;
        let no_group = |p: Partition| redis.part(p).group.is_none();
        let no_group_anywhere = redis.jobs.iter().any(|j| j.group.is_none());
        let undelivered: Vec<Partition> = (0..redis.jobs.len())
            .map(partition_at)
            .filter(|p| self.undelivered(*p))
            .collect();
        let reclaimable: Vec<bool> = (0..redis.jobs.len())
            .map(|p| self.reclaimable(cfg, partition_at(p)))
            .collect();
        let reclaimable_anywhere = reclaimable.contains(&true);
        for (i, w) in self.workers.iter().enumerate() {
            let n = i as u8;
            let holds = w.delivery.is_some()
                || !w.outstanding.is_empty()
                || !w.reclaimer.is_idle()
                || !w.scheduler.is_idle();
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
            if !w.scheduler.is_idle() {
                out.push(Action::Schedule(n, Fate::Reply));
                if b.lost > 0 {
                    out.extend(
                        [Fate::LostReply, Fate::LostRequest].map(|f| Action::Schedule(n, f)),
                    );
                }
            } else if cfg.schedules && self.world.db.schedules.values().any(|s| s.next_tick <= NOW)
            {
                out.push(Action::Schedule(n, Fate::Reply));
            }
            let free = w.delivery.is_none() && w.backlog.is_none() && w.outstanding.is_empty();
            if free && w.reclaimer.is_idle() {
                for p in &undelivered {
                    out.extend(reply.iter().map(|f| Action::Fetch(n, *p, *f)));
                }
                // A round changes the state: it recovers a deleted ID, claims
                // in (or recreates the group of) its cursor's partition, or
                // its scan wraps and moves the cursor on to a partition
                // where there is something to do.
                let r = &w.reclaimer;
                let p = r.cursor().partition;
                let moves_on =
                    (reclaimable_anywhere || no_group_anywhere) && r.wrap_target() != r.cursor();
                if reclaimable[usize::from(p)]
                    || no_group(p)
                    || moves_on
                    || r.unrecovered().next().is_some()
                {
                    out.extend(reply.iter().map(|f| Action::Reclaim(n, *f)));
                }
            }
            if let Some(job) = &w.job {
                if job.record_due {
                    out.push(Action::Record(n));
                } else if job.effect_done {
                    out.extend(cfg.outcomes.iter().map(|o| Action::Finish(n, *o)));
                } else {
                    out.push(Action::Effect(n));
                }
            }
        }
    }

    /// Redis's faults: a wipe, the loss of a partition's newest write, a
    /// trim below a partition's oldest pending entry.
    fn redis_faults(&self, b: &Budget, out: &mut Vec<Action>) {
        let redis = &self.world.redis;
        if b.redis_wipes > 0 && redis.jobs.iter().any(|j| j.exists) {
            out.push(Action::RedisWipe);
        }
        for (p, jobs) in redis.jobs.iter().enumerate() {
            if b.redis_losses > 0 && jobs.entries.keys().next_back() == Some(&jobs.last_id) {
                out.push(Action::RedisLoseNewest(partition_at(p)));
            }
            if b.trims > 0 && jobs.pel_len() > 0 {
                out.push(Action::Trim(partition_at(p)));
            }
        }
    }

    /// Whether a read of partition `p` may get something: its stream has
    /// an entry past the group's last delivered ID, or there is no group
    /// (the read fails and the worker recreates it).
    fn undelivered(&self, p: Partition) -> bool {
        let jobs = self.world.redis.part(p);
        match &jobs.group {
            None => true,
            Some(g) => jobs
                .entries
                .range(g.last_delivered..)
                .any(|(id, _)| *id > g.last_delivered),
        }
    }

    /// Whether a reclaim round in partition `p` may claim something: a
    /// pending entry has been idle for the reclaim threshold. A round looks
    /// no further than XPENDING's IDLE filter otherwise, so an entry gone
    /// from its stream is reported once it is idle too
    /// ([`pelican_model::protocol::StreamOp::AutoClaim`]).
    fn reclaimable(&self, cfg: &Config, p: Partition) -> bool {
        let jobs = self.world.redis.part(p);
        match &jobs.group {
            None => false,
            Some(g) => g
                .pel
                .values()
                .any(|p| NOW.ms_since(p.delivery_time) >= cfg.policy.reclaim_min_idle_ms),
        }
    }

    /// How many orders of the workers' heartbeats a tick explores.
    /// Heartbeats of different runs on different entries touch different
    /// rows and PEL entries, so they commute: one order covers them. Two on
    /// the same run or entry race: every order.
    fn tick_orders(&self) -> usize {
        let beating: Vec<(RunId, EntryId)> = (0..self.workers.len())
            .filter(|w| self.would_heartbeat(*w))
            .filter_map(|w| {
                let d = self.workers[w].delivery.as_ref()?;
                Some((d.run()?.0, d.entry()))
            })
            .collect();
        let race = beating
            .iter()
            .enumerate()
            .any(|(i, (run, entry))| beating[i + 1..].iter().any(|(r, e)| r == run || e == entry));
        if race {
            permutations(self.workers.len()).len()
        } else {
            1
        }
    }

    fn maintenance_matters(&self, cfg: &Config, task: MaintenanceTask) -> bool {
        let db = &self.world.db;
        match task {
            MaintenanceTask::Retries => {
                let early = pelican_model::injects!(cfg.policy, PromoteEarly);
                db.runs.values().any(|r| match r.status {
                    RunStatus::Delayed if early => true,
                    RunStatus::RetryWait | RunStatus::Delayed => {
                        r.retry_at.is_some_and(|t| t <= NOW)
                    }
                    _ => false,
                })
            }
            MaintenanceTask::Outbox => {
                !pelican_model::injects!(cfg.policy, NoPublishRecovery)
                    && db
                        .runs
                        .values()
                        .any(|r| r.status == RunStatus::Queued && r.published_at.is_none())
            }
            MaintenanceTask::Sweep => {
                !pelican_model::injects!(cfg.policy, NoSweep)
                    && db
                        .orphan_candidates(NOW, cfg.policy.sweep_grace_ms, 0, RunId(0), usize::MAX)
                        .iter()
                        .any(|c| !self.locatable(c))
            }
            MaintenanceTask::Consumers => {
                let holding = pelican_model::injects!(cfg.policy, ForgetHolders);
                let idle = cfg.policy.reclaim_min_idle_ms;
                cfg.consumers
                    && self.world.redis.jobs.iter().any(|jobs| {
                        jobs.xinfo_consumers(NOW).is_ok_and(|cs| {
                            cs.iter()
                                .any(|c| c.idle_ms >= idle && (c.pending == 0 || holding))
                        })
                    })
            }
            MaintenanceTask::Retention => {
                let keep = cfg.policy.keep_finished_ms;
                keep > 0
                    && db
                        .runs
                        .values()
                        .any(|r| r.finished_at.is_some_and(|t| t <= NOW.sub_ms(keep)))
            }
            // Each worker's scheduler steps on its own (`Action::Schedule`).
            MaintenanceTask::Schedules => false,
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
        }) || self.world.redis.jobs.iter().any(|jobs| {
            jobs.group
                .as_ref()
                .is_some_and(|g| g.pel.values().any(|p| p.delivery_time.as_ms() > 0))
        }) || self
            .world
            .db
            .slots
            .values()
            .any(|(_, until)| until.as_ms() > 0)
            || self.world.db.rates.values().any(|tat| *tat > 0)
    }
}
