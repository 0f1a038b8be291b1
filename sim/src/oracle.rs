// Over 600 lines: the world every simulated server shares, with its counters, log and hash.
//! The oracle: the one [`World`] every simulated server applies commands to,
//! the guarantees checked as they do, the seed's event counters, its event
//! log, and a running hash of every event (for determinism checks).

use crate::net::ExternalCall;
use crate::scenario::FaultMix;
use pelican_model::events::{self, RunEvent};
use pelican_model::ids::{EntryId, Fence, RunId, WorkerId};
use pelican_model::invariants::{self, Broken, Guarantee};
use pelican_model::protocol::{
    Command, DbOp, DbReply, DeadEntry, DeliveryEnd, Execution, Input, JobEntry, Policy, StreamOp,
    StreamReply,
};
use pelican_model::shared::Shared as CopyOnWrite;
use pelican_model::status::{ErrorClass, JobOutcome, RunStatus};
use pelican_model::stream::StreamError;
use pelican_model::time::Timestamp;
use pelican_model::world::{Issuer, Redis, World};
use pelican_real::RoleId;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex, MutexGuard};

/// One line of a seed's event log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogLine {
    /// Simulated milliseconds since the seed started.
    pub t_ms: u64,
    /// Which node (or "nemesis").
    pub node: String,
    /// What happened.
    pub event: String,
}

/// The oracle's state; shared by every node of a seed.
pub struct Oracle {
    /// Redis, Postgres, the effects and the history.
    pub world: World,
    /// The protocol's knobs (for S6).
    pub policy: Policy,
    /// What this seed's faults are.
    pub faults: FaultMix,
    /// Whether faults are on (false once healing starts).
    pub faulty: bool,
    /// Redis as of its last fsync (AOF everysec), shared with the world's
    /// until either is written.
    pub fsynced: CopyOnWrite<Redis>,
    /// Side effects each run's job makes when it succeeds.
    pub effects_expected: BTreeMap<RunId, u32>,
    /// The external service users' handlers call.
    pub external: ExternalService,
    /// Counters of interesting events.
    pub counters: BTreeMap<&'static str, u64>,
    /// The first guarantees broken, if any.
    pub broken: Vec<Broken>,
    /// The event log, when recording.
    pub log: Option<Vec<LogLine>>,
    /// Each followed run's events as its reader holds them (S13).
    pub followed: BTreeMap<RunId, Vec<RunEvent>>,
    /// Deliveries (by node and entry) whose last input was a refused
    /// outcome write: what they do next is checked (S6).
    refused: BTreeSet<(String, EntryId)>,
    /// Every attempt (run, fence) Postgres granted: what S2 checks a job's
    /// start against once retention has deleted the run and its attempts
    /// (a paused worker may start a job after that).
    granted: BTreeSet<(RunId, Fence)>,
    hash: DefaultHasher,
    start_ms: u64,
    #[cfg(test)]
    _alive: tests::Alive,
}

/// The oracle as nodes hold it.
pub type Shared = Arc<Mutex<Oracle>>;

/// Locks the oracle (the simulation is single-threaded; a poisoned lock
/// means a node panicked, which already fails the seed).
pub fn lock(o: &Shared) -> MutexGuard<'_, Oracle> {
    o.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn sim_now_ms() -> u64 {
    pelican_real::now().0
}

impl Oracle {
    /// A fresh oracle: empty Postgres, Redis with the consumer group.
    #[must_use]
    pub fn new(policy: Policy, faults: FaultMix, record: bool) -> Oracle {
        let world = World::partitioned(policy.partitions);
        let fsynced = world.redis.clone();
        Oracle {
            world,
            policy,
            faults,
            faulty: true,
            fsynced,
            effects_expected: BTreeMap::new(),
            external: ExternalService::default(),
            counters: BTreeMap::new(),
            broken: Vec::new(),
            log: record.then(Vec::new),
            refused: BTreeSet::new(),
            granted: BTreeSet::new(),
            followed: BTreeMap::new(),
            hash: DefaultHasher::new(),
            start_ms: sim_now_ms(),
            #[cfg(test)]
            _alive: tests::Alive::new(),
        }
    }

    /// Milliseconds since the seed started.
    #[must_use]
    pub fn elapsed_ms(&self) -> u64 {
        sim_now_ms().saturating_sub(self.start_ms)
    }

    /// Counts one `name` event.
    pub fn count(&mut self, name: &'static str) {
        *self.counters.entry(name).or_insert(0) += 1;
    }

    /// Records an event: hashed always, logged when recording. `what` is
    /// only formatted when recording.
    pub fn event(
        &mut self,
        node: &str,
        what: &dyn Fn() -> String,
        hashed: &dyn Fn(&mut DefaultHasher),
    ) {
        let t_ms = self.elapsed_ms();
        t_ms.hash(&mut self.hash);
        node.hash(&mut self.hash);
        hashed(&mut self.hash);
        if let Some(log) = &mut self.log {
            log.push(LogLine {
                t_ms,
                node: node.to_owned(),
                event: what(),
            });
        }
    }

    /// A nemesis or harness event.
    pub fn note(&mut self, node: &str, text: String) {
        let h = text.clone();
        self.event(node, &|| text.clone(), &|s| h.hash(s));
    }

    /// The hash of every event so far.
    #[must_use]
    pub fn digest(&self) -> u64 {
        self.hash.finish()
    }

    /// Applies a SQL statement for `node`, counting and checking.
    pub fn db(&mut self, node: &str, op: &DbOp, by: Issuer) -> DbReply {
        let cancel_hits = match op {
            DbOp::Cancel { run } => self.world.db.runs.get(run).map(|r| r.status),
            _ => None,
        };
        self.world.db.clock = Timestamp(sim_now_ms());
        let reply = self.world.db(op, by);
        match (op, &reply) {
            // A claim (or, in a build with the mutants, `ClaimReviving`).
            (_, DbReply::Claimed(Some(job))) => {
                self.count("claims");
                if let Some(run) = op.class().claims {
                    self.granted.insert((run, job.claimed.fence));
                }
            }
            (DbOp::ScheduleRetry { .. }, DbReply::Rows(1)) => self.count("retries"),
            (DbOp::DeadLetter { .. } | DbOp::DeadLetterExhausted { .. }, DbReply::Rows(1)) => {
                self.count("dead_letters");
            }
            (DbOp::RequeueEntry { .. }, DbReply::Rows(1)) => self.count("trimmed_recoveries"),
            (DbOp::RequeueRun { .. }, DbReply::Rows(1)) => self.count("sweeper_requeues"),
            (DbOp::MarkPublished { .. }, DbReply::Rows(1)) => self.count("publishes_marked"),
            (DbOp::PromoteRetries { .. }, DbReply::Candidates(cs)) if !cs.is_empty() => {
                self.count("retries_promoted");
            }
            (DbOp::DeleteFinished { .. }, DbReply::Rows(n)) if *n > 0 => {
                self.count("runs_deleted");
            }
            (DbOp::RunIssued { .. }, DbReply::Rows(1)) => self.count("deleted_run_delivered"),
            (DbOp::FireTick { tick, .. }, DbReply::Rows(1)) if tick.0 > 0 => {
                self.count("ticks_handled");
            }
            (DbOp::FireTick { .. }, DbReply::Rows(0)) => self.count("tick_races"),
            (DbOp::RecordStep { .. }, DbReply::Rows(1)) => self.count("steps_recorded"),
            (
                DbOp::Fail {
                    class: ErrorClass::Unknown,
                    ..
                },
                DbReply::Rows(1),
            ) => self.count("unknown_capped"),
            (
                DbOp::Fail {
                    class: ErrorClass::BudgetExhausted,
                    ..
                },
                DbReply::Rows(1),
            ) => self.count("budgets_exhausted"),
            (DbOp::RecordStep { .. }, DbReply::Rows(0)) => self.count("step_records_refused"),
            (DbOp::AcquireSlot { .. }, DbReply::Rows(1)) => self.count("permits"),
            (DbOp::AcquireSlot { .. }, DbReply::Rows(0)) => self.count("slot_waits"),
            (DbOp::TakeToken { .. }, DbReply::Rows(0)) => self.count("token_waits"),
            (DbOp::ReadSteps { .. }, DbReply::Steps(s)) if !s.is_empty() => {
                self.count("ledgers_replayed");
            }
            (DbOp::Cancel { .. }, DbReply::Rows(n)) => match cancel_hits {
                Some(RunStatus::Running) if *n == 1 => self.count("cancel_races"),
                Some(s) if s.is_terminal() => self.count("cancel_races"),
                _ => self.count("cancels"),
            },
            (op, DbReply::Rows(0)) if op.fenced_write().is_some() => {
                self.count("late_writes_rejected");
            }
            _ => {}
        }
        let (o, r) = (op.clone(), reply.clone());
        self.event(node, &|| format!("{o:?} -> {r:?}"), &|s| {
            op.hash(s);
            reply.hash(s);
        });
        if op.is_write() {
            self.check_state();
        }
        reply
    }

    /// Applies a stream command for `node`, counting and checking.
    pub fn stream(&mut self, node: &str, op: &StreamOp) -> Result<StreamReply, StreamError> {
        // Deleted IDs are owed a recovery once the reclaimer *receives*
        // them (see `received`), not when Redis answers: a lost reply
        // leaves the run to the sweeper.
        self.world.db.clock = Timestamp(sim_now_ms());
        let reply = self.world.stream(op, Issuer::default());
        match (op, &reply) {
            (StreamOp::AutoClaim { .. }, Ok(StreamReply::AutoClaimed(r)))
                if !r.claimed.is_empty() =>
            {
                self.count("reclaims");
            }
            (
                StreamOp::PublishDead {
                    entry: DeadEntry::Quarantined { .. },
                    ..
                },
                Ok(_),
            ) => self.count("quarantined"),
            (StreamOp::EnsureGroup { .. }, Ok(_)) => self.count("group_ensured"),
            (StreamOp::Retain { .. }, Ok(StreamReply::Trimmed(n))) if *n > 0 => {
                self.count("retention_trims");
            }
            (_, Ok(StreamReply::Forgot(n))) if *n > 0 => self.count("consumers_forgotten"),
            _ => {}
        }
        let (o, r) = (op.clone(), reply.clone());
        self.event(node, &|| format!("{o:?} -> {r:?}"), &|s| {
            op.hash(s);
            reply.hash(s);
        });
        if matches!(op, StreamOp::Ack { .. }) {
            self.check_state();
        }
        reply
    }

    /// The tool service applies side effect `call` of `run` under `key`,
    /// sent by the attempt holding `fence`. A `steps` job makes call `i`
    /// in its step `i`, so the call is that step running (S11).
    pub fn effect(&mut self, node: &str, run: RunId, call: u32, fence: Fence, key: &str) -> bool {
        self.world.step_ran(run, call, fence);
        let applied = self.world.db.apply_effect(key) == 1;
        self.world.effect_applied(run, call, applied);
        if !applied {
            self.count("effects_deduplicated");
        }
        self.event(
            node,
            &|| format!("apply effect {run}/{call} key {key:?}: applied={applied}"),
            &|s| {
                run.hash(s);
                call.hash(s);
                applied.hash(s);
            },
        );
        self.check_state();
        applied
    }

    /// The external service answers `call`. A side effect is applied once
    /// per key (a key seen before gets its first answer back); each effect
    /// of a run, by name, may be applied once (S5): a retry that sends it
    /// again under another key, or none, breaks that.
    pub fn external(&mut self, node: &str, call: &ExternalCall) -> String {
        let x = &mut self.external;
        let id = (call.run, call.name.clone());
        let n = x.requests.entry(id.clone()).or_insert(0);
        *n += 1;
        let fresh = format!("{} #{n} for {}", call.name, call.run);
        let (answer, applied) = match (&call.key, call.effect) {
            (Some(key), true) => match x.answers.get(key) {
                Some(first) => (first.clone(), false),
                None => {
                    x.answers.insert(key.clone(), fresh.clone());
                    (fresh, true)
                }
            },
            (None, true) => (fresh, true),
            (_, false) => (fresh, false),
        };
        if applied {
            let keys = x.applied.entry(id).or_default();
            keys.push(call.key.clone());
            if keys.len() > 1 && self.broken.is_empty() {
                let detail = format!(
                    "{}'s external effect {:?} applied {} times, under keys {keys:?}",
                    call.run,
                    call.name,
                    keys.len()
                );
                self.note("oracle", format!("broken: S5 {detail}"));
                self.broken.push(Broken {
                    guarantee: Guarantee::S5,
                    detail,
                });
            }
        } else if call.effect {
            self.count("external_deduplicated");
        }
        self.count(if call.effect {
            "external_effects"
        } else {
            "external_queries"
        });
        let a = answer.clone();
        self.event(
            node,
            &|| format!("external {call:?}: applied={applied} -> {a:?}"),
            &|s| {
                call.run.hash(s);
                call.name.hash(s);
                applied.hash(s);
            },
        );
        answer
    }

    /// A job starts: S2 requires a fresh claim of this delivery's own.
    pub fn executing(&mut self, node: &str, e: &Execution, own: Option<Fence>) {
        if self.world.retired.contains_key(&e.run) && !self.world.db.runs.contains_key(&e.run) {
            // Retention deleted the run and its attempts after the claim.
            if own != Some(e.fence) || !self.granted.contains(&(e.run, e.fence)) {
                self.world
                    .violations
                    .insert(pelican_model::world::Violation::ExecutedWithoutClaim(e.run));
            }
        } else {
            self.world.check_execution_claimed(e.run, e.fence, own);
        }
        self.count("executions");
        let e2 = e.clone();
        self.event(
            node,
            &|| {
                format!(
                    "execute {} fence {} attempt {} ({} {})",
                    e2.run, e2.fence.0, e2.attempt, e2.kind, e2.input
                )
            },
            &|s| e.hash(s),
        );
        self.check_state();
    }

    /// A role of `worker` received an input.
    pub fn received(&mut self, node: &str, role: &RoleId, input: &Input) {
        if let RoleId::Delivery(_, entry, _) = role {
            let key = (node.to_owned(), *entry);
            if *input == Input::Db(DbReply::Refused) {
                self.count("refused");
                self.refused.insert(key);
            } else {
                self.refused.remove(&key);
            }
        }
        match (role, input) {
            (RoleId::Reclaimer(w), Input::Stream(Ok(StreamReply::AutoClaimed(r))))
                if !r.deleted.is_empty() =>
            {
                self.count("trimmed_detected");
                self.world
                    .trimmed_owed
                    .entry(*w)
                    .or_default()
                    .extend(r.deleted.iter().copied());
            }
            (
                _,
                Input::Executed(JobOutcome::Failed {
                    class: ErrorClass::Panic,
                    ..
                }),
            ) => self.count("panics"),
            (
                _,
                Input::Executed(JobOutcome::Failed {
                    class: ErrorClass::Retryable,
                    message,
                }),
            ) if message.starts_with("job timed out") => self.count("attempt_timeouts"),
            (_, Input::Unavailable) => self.count("unavailable"),
            _ => {}
        }
        // Hashed whether or not the log is recorded, so that a recorded
        // replay has the digest of the sweep that found it.
        let (r, i) = (role.clone(), input.clone());
        self.event(node, &|| format!("{r:?} <- {i:?}"), &|s| {
            role.hash(s);
            input.hash(s);
        });
    }

    /// A role of a worker sent a command (logged only: servers log replies).
    pub fn sent(&mut self, node: &str, role: &RoleId, command: &Command) {
        // Logged, not hashed: the servers hash what they apply, and a
        // recorded replay must keep the sweep's digest.
        let t_ms = self.elapsed_ms();
        if let Some(log) = &mut self.log {
            log.push(LogLine {
                t_ms,
                node: node.to_owned(),
                event: format!("{role:?} -> {command:?}"),
            });
        }
    }

    /// A delivery ended.
    pub fn delivery_end(&mut self, node: &str, entry: EntryId, end: DeliveryEnd) {
        self.count(end.name());
        if self.refused.remove(&(node.to_owned(), entry))
            && let Some(JobEntry::Job { run, .. }) = self.world.entries.get(&entry)
        {
            let run = *run;
            self.world.check_refusal(run, Some(end));
            self.check_state();
        }
        self.event(node, &|| format!("delivery {entry} ended: {end:?}"), &|s| {
            entry.hash(s);
            end.hash(s);
        });
    }

    /// S8: the reclaimer of `worker` holds these deleted IDs.
    pub fn reclaimer_holds(&mut self, worker: WorkerId, held: &BTreeSet<EntryId>) {
        self.world.check_trimmed_held(worker, held);
        self.check_state();
    }

    /// Records the guarantees the state breaks now (the first time only).
    pub fn check_state(&mut self) {
        if !self.broken.is_empty() {
            return;
        }
        let broken = invariants::state(&self.world, &self.policy);
        if !broken.is_empty() {
            let t = self.elapsed_ms();
            let text = format!(
                "broken at {t} ms: {}",
                broken
                    .iter()
                    .map(Broken::to_string)
                    .collect::<Vec<_>>()
                    .join("; ")
            );
            self.note("oracle", text);
            self.broken = broken;
        }
    }

    /// Whether the seed is done: every accepted run and every schedule's
    /// run terminal, PEL empty.
    #[must_use]
    pub fn settled(&self) -> bool {
        let w = &self.world;
        let undelivered = w.redis.jobs.iter().any(|jobs| match &jobs.group {
            Some(g) => g
                .last_delivered
                .successor()
                .is_some_and(|next| jobs.entries.range(next..).next().is_some()),
            None => !jobs.entries.is_empty(),
        });
        let ticks_ended = w.db.runs.values().all(|r| {
            pelican_model::schedule::tick_of(r.run_id).is_none() || r.status.is_terminal()
        });
        !undelivered
            && w.redis.pel_len() == 0
            && w.accepted.iter().all(|r| w.finished(*r))
            && ticks_ended
    }

    /// A reader of `run`'s events now holds `seen`: numbered from 1
    /// without gaps, and no progress of an attempt that did not hold the
    /// run (S13).
    pub fn watched(&mut self, run: RunId, seen: &[RunEvent]) {
        if let Err(e) = events::check(0, seen)
            && self.broken.is_empty()
        {
            let detail = format!("a reader of {run}'s events holds {e}");
            self.note("oracle", format!("broken: S13 {detail}"));
            self.broken.push(Broken {
                guarantee: Guarantee::S13,
                detail,
            });
        }
        self.followed.insert(run, seen.to_vec());
    }

    /// The end-of-seed checks: S1, S5, S9, S10 ([`invariants::quiescent`]),
    /// the state guarantees, and what every level checks of the final
    /// database ([`invariants::outcomes`]: one outcome per run, attempts
    /// and dead letters that agree with it, no stale write's mark, each
    /// effect under one key, whole event logs), and that what each reader
    /// of events holds is the start of its run's log (S13).
    #[must_use]
    pub fn final_check(&self) -> Vec<Broken> {
        let w = &self.world;
        let mut out = invariants::state(w, &self.policy);
        for (run, seen) in &self.followed {
            let Some(_) = w.db.runs.get(run) else {
                continue;
            };
            let log = w.db.read_events(*run, 0, usize::MAX);
            if let Err(e) = events::grew(seen, &log) {
                out.push(Broken {
                    guarantee: Guarantee::S13,
                    detail: format!(
                        "what a reader of {run}'s events holds is not the run's history: {e}"
                    ),
                });
            }
        }
        let effects = |run: RunId| self.effects_expected.get(&run).copied().unwrap_or(0);
        out.extend(invariants::quiescent(w, &effects));
        out.extend(invariants::outcomes(&w.db, &effects));
        for (run, want) in &self.external.expected {
            let succeeded = w.retired.get(run).or(w.db.runs.get(run).map(|r| &r.status))
                == Some(&RunStatus::Succeeded);
            let applied = self
                .external
                .applied
                .range((*run, String::new())..)
                .take_while(|((r, _), _)| r == run)
                .count();
            if succeeded && applied != *want as usize {
                out.push(Broken {
                    guarantee: Guarantee::S5,
                    detail: format!(
                        "{run} succeeded with {applied} external effects applied, not {want}"
                    ),
                });
            }
        }
        out
    }
}

/// The external service of a seed: what it answered, and what it applied.
#[derive(Debug, Default)]
pub struct ExternalService {
    /// The first answer to each idempotency key.
    answers: BTreeMap<String, String>,
    /// Each run's effects, by name: the keys they were applied under.
    pub applied: BTreeMap<(RunId, String), Vec<Option<String>>>,
    /// Requests of each run, by name (effects and queries).
    pub requests: BTreeMap<(RunId, String), u32>,
    /// The effects each run applies when it succeeds, where the harness
    /// was told ([`crate::harness::JobSim::effects`]).
    pub expected: BTreeMap<RunId, u32>,
}

#[cfg(test)]
pub(crate) mod tests {
    use std::cell::Cell;

    thread_local! {
        static ALIVE: Cell<usize> = const { Cell::new(0) };
    }

    /// Counts the oracles alive on this thread (a seed runs on the thread
    /// that calls it): a test's way to see that a seed left none behind.
    pub(crate) struct Alive(());

    impl Alive {
        pub(crate) fn new() -> Alive {
            ALIVE.with(|n| n.set(n.get() + 1));
            Alive(())
        }

        /// How many oracles this thread holds.
        pub(crate) fn count() -> usize {
            ALIVE.with(Cell::get)
        }
    }

    impl Drop for Alive {
        fn drop(&mut self) {
            ALIVE.with(|n| n.set(n.get() - 1));
        }
    }
}
