//! Bounded configurations of the model: how many runs and workers, which job
//! outcomes, and how many faults of each kind a path may contain.

use pelican_model::protocol::{Mutant, Policy};
use serde::{Deserialize, Serialize};

/// How a job may end, as the checker chooses it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum OutcomeKind {
    /// Succeeds (after its side effect).
    Success,
    /// A retryable error.
    Retryable,
    /// A terminal error.
    Terminal,
    /// The handler panics.
    Panic,
    /// The handler returns a result Postgres refuses (a NUL byte).
    Poison,
    /// An error of class `unknown`: retried up to the policy's cap.
    Unknown,
}

/// Faults a single path may contain, by kind.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct Budget {
    /// Worker crashes (kill -9 and restart) at any step.
    pub crashes: u8,
    /// Workers pausing (past their lease) and resuming later.
    pub pauses: u8,
    /// Commands whose request or reply is lost (network, Postgres restart).
    pub lost: u8,
    /// Redis restarts without persistence: streams and group gone.
    pub redis_wipes: u8,
    /// Redis restarts losing the newest write (AOF everysec).
    pub redis_losses: u8,
    /// Trims below the oldest pending ID.
    pub trims: u8,
    /// Duplicate publications of a run's current dispatch.
    pub duplicates: u8,
    /// Cancels.
    pub cancels: u8,
    /// Malformed entries written to the stream.
    pub malformed: u8,
    /// Faults of all kinds together on one path.
    pub total: u8,
}

/// A bounded configuration.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Config {
    /// Its name.
    pub name: String,
    /// Runs submitted through the API.
    pub runs: u8,
    /// Worker processes.
    pub workers: u8,
    /// The protocol's policy (attempts_max, ...; durations are abstracted).
    pub policy: Policy,
    /// The outcomes a job may have.
    pub outcomes: Vec<OutcomeKind>,
    /// Fault budget per path.
    pub faults: Budget,
    /// How far worker 1's clock runs ahead of the servers' (ms). No
    /// statement takes a time from its sender (a unit test of the statement
    /// table says so), so only a bug that lets a worker's clock judge a
    /// lease can tell; WorkerClock's configuration sets it. A skewed
    /// worker is not interchangeable with the others, so skew turns
    /// symmetry reduction off.
    #[serde(default)]
    pub skew_ms: u64,
    /// Symmetry reduction over workers: states that differ only in which
    /// worker is which count once (see `State::fingerprint`). Every verdict
    /// is the same either way; on by default.
    #[serde(default = "yes")]
    pub symmetry: bool,
    /// Jobs make their side effect inside a durable step: the step's
    /// ledger is read, the effect runs unless replayed, and its record is
    /// a step of its own (S11).
    #[serde(default)]
    pub steps: bool,
    /// Jobs call their side effect under a provider's limits
    /// ([`Config::provider_limit`]): a permit (its one slot) and a token,
    /// taken before the effect and released as the job ends (S12).
    #[serde(default)]
    pub limits: bool,
    /// Maintenance deletes idle consumers that hold nothing
    /// ([`MaintenanceTask::Consumers`]), as a worker's does every sweep.
    ///
    /// [`MaintenanceTask::Consumers`]: pelican_model::protocol::MaintenanceTask::Consumers
    #[serde(default)]
    pub consumers: bool,
    /// The first run is submitted with a delay, due at the next tick: the
    /// retry pass must not queue it before (S15).
    #[serde(default)]
    pub delays: bool,
    /// A cron schedule with two ticks due, and every worker runs the
    /// scheduler, one command a step: two schedulers race for each tick
    /// (S16).
    #[serde(default)]
    pub schedules: bool,
}

fn yes() -> bool {
    true
}

impl Config {
    /// Policy durations are all far below [`crate::NOW`], so one "tick" of
    /// abstract time expires every lease, retry and idle time at once.
    fn policy(attempts_max: u32) -> Policy {
        Policy {
            lease_ms: 30_000,
            heartbeat_ms: 10_000,
            reclaim_min_idle_ms: 60_000,
            reclaim_batch_max: 1,
            attempts_max,
            backoff_base_ms: 1_000,
            backoff_cap_ms: 8_000,
            sweep_grace_ms: 120_000,
            sweep_batch_max: 8,
            value_bytes_max: 1 << 20,
            keep_finished_ms: 0,
            unknown_retries_max: 1,
            catchup_after_ms: 500,
            partitions: 1,
            kinds: std::collections::BTreeMap::new(),
            mutant: None,
        }
    }

    /// The checker's runs' kind (its submissions name none) with an
    /// elapsed budget: a tick spends it.
    fn with_budget(policy: &mut Policy) {
        let budget = pelican_model::protocol::KindPolicy::default().budget_ms(1_000);
        policy.kinds.insert(String::new(), budget);
    }

    /// One run, two workers, a crash and a lost reply.
    #[must_use]
    pub fn small() -> Config {
        Config {
            name: "small".into(),
            runs: 1,
            workers: 2,
            policy: Self::policy(2),
            outcomes: vec![OutcomeKind::Success, OutcomeKind::Retryable],
            faults: Budget {
                crashes: 1,
                total: 1,
                ..Budget::default()
            },
            skew_ms: 0,
            symmetry: true,
            steps: false,
            limits: false,
            consumers: false,
            delays: false,
            schedules: false,
        }
    }

    /// Two runs, two workers, three attempts, every job outcome and every
    /// fault kind at least once.
    #[must_use]
    pub fn standard() -> Config {
        Config {
            name: "standard".into(),
            runs: 2,
            workers: 2,
            policy: Self::policy(3),
            // Panic takes Retryable's path with another class: `large` has it.
            outcomes: vec![
                OutcomeKind::Success,
                OutcomeKind::Retryable,
                OutcomeKind::Terminal,
            ],
            faults: Budget {
                crashes: 1,
                pauses: 1,
                lost: 1,
                redis_wipes: 1,
                redis_losses: 1,
                trims: 1,
                duplicates: 1,
                cancels: 1,
                malformed: 1,
                total: 1,
            },
            skew_ms: 0,
            symmetry: true,
            steps: false,
            limits: false,
            consumers: false,
            delays: false,
            schedules: false,
        }
    }

    /// Standard with more of everything: for long runs.
    #[must_use]
    pub fn large() -> Config {
        let mut c = Self::standard();
        c.name = "large".into();
        c.workers = 3;
        c.outcomes.push(OutcomeKind::Panic);
        c.outcomes.push(OutcomeKind::Poison);
        c.outcomes.push(OutcomeKind::Unknown);
        c.faults.crashes = 2;
        c.faults.lost = 2;
        c.faults.total = 3;
        c
    }

    /// Small with a job whose result Postgres refuses, beside the others:
    /// the run must fail on that attempt, not be retried.
    #[must_use]
    pub fn poison() -> Config {
        let mut c = Self::small();
        c.name = "poison".into();
        c.outcomes.push(OutcomeKind::Poison);
        c
    }

    /// Housekeeping: two runs whose finished rows retention deletes once
    /// time passes, and whose workers' consumers are deleted once idle,
    /// beside a crash, a pause (a zombie attempt that outlives its run's
    /// row), a Redis wipe and a duplicate publication (whose entry may be
    /// delivered after its run is gone).
    #[must_use]
    pub fn retention() -> Config {
        let mut c = Self::small();
        c.name = "retention".into();
        c.runs = 2;
        c.policy.keep_finished_ms = 1;
        c.consumers = true;
        c.faults = Budget {
            crashes: 1,
            pauses: 1,
            redis_wipes: 1,
            duplicates: 1,
            total: 1,
            ..Budget::default()
        };
        c
    }

    /// `standard` with every job's side effect in a durable step, over two
    /// partitions (a run in each): the larger configuration `cargo xtask
    /// bench` times beside `standard`.
    #[must_use]
    pub fn standard_steps() -> Config {
        let mut c = Self::standard();
        c.name = "standard_steps".into();
        c.steps = true;
        c.policy.partitions = 2;
        c
    }

    /// Small with the job's side effect inside a durable step, and up to
    /// three faults per path: a crash (between the step and its record, or
    /// after), a pause (a zombie that ran the step before a later attempt
    /// recorded it) and a lost reply. A recorded step is replayed, never
    /// run again by a later attempt.
    #[must_use]
    pub fn steps() -> Config {
        let mut c = Self::small();
        c.name = "steps".into();
        c.steps = true;
        c.faults = Budget {
            crashes: 1,
            pauses: 1,
            lost: 1,
            total: 3,
            ..Budget::default()
        };
        c
    }

    /// One run with three attempts whose job succeeds or fails with an
    /// unknown error, and a crash and a lost reply: the second unknown error
    /// fails the run (the cap is 1), with attempts left.
    #[must_use]
    pub fn unknown() -> Config {
        let mut c = Self::small();
        c.name = "unknown".into();
        c.policy = Self::policy(3);
        c.outcomes = vec![OutcomeKind::Success, OutcomeKind::Unknown];
        c.faults = Budget {
            crashes: 1,
            lost: 1,
            total: 2,
            ..Budget::default()
        };
        c
    }

    /// One run with three attempts whose kind has an elapsed budget, a job
    /// that succeeds or fails retryably, a crash, a pause and a lost reply
    /// (two per path): once time passes, a
    /// claim finds the budget spent and fails the run without running it.
    #[must_use]
    pub fn budget() -> Config {
        let mut c = Self::small();
        c.name = "budget".into();
        c.policy = Self::policy(3);
        Self::with_budget(&mut c.policy);
        c.faults = Budget {
            crashes: 1,
            pauses: 1,
            lost: 1,
            total: 2,
            ..Budget::default()
        };
        c
    }

    /// Two runs on two workers over two partitions (one run in each), with
    /// a crash, a lost reply, a trim, a lost newest write or a duplicate
    /// publication, one per path: workers read each partition, the
    /// reclaimer's scan moves from one partition to the next, and every
    /// entry is acknowledged, trimmed and located in its own stream.
    #[must_use]
    pub fn partitions() -> Config {
        let mut c = Self::small();
        c.name = "partitions".into();
        c.runs = 2;
        c.policy.partitions = 2;
        c.faults = Budget {
            crashes: 1,
            lost: 1,
            trims: 1,
            redis_losses: 1,
            duplicates: 1,
            total: 1,
            ..Budget::default()
        };
        c
    }

    /// One run on two workers with a trim below its pending entry beside a
    /// crash or a pause (two faults a path): a reclaim pass reports a
    /// trimmed entry once it is idle, so its run is recovered when its
    /// holder is gone, not while a live worker runs it.
    #[must_use]
    pub fn trims() -> Config {
        let mut c = Self::small();
        c.name = "trims".into();
        c.faults = Budget {
            crashes: 1,
            pauses: 1,
            trims: 1,
            total: 2,
            ..Budget::default()
        };
        c
    }

    /// The provider every job of a configuration with limits calls: one
    /// slot, held until a tick, and one call a tick (burst 1).
    #[must_use]
    pub fn provider_limit() -> pelican_model::protocol::ProviderLimit {
        pelican_model::protocol::ProviderLimit::default()
            .concurrent(1)
            .per_second(1)
            .burst(1)
            .hold_ms(30_000)
    }

    /// Two runs on two workers whose jobs call one provider under its
    /// limits, with a crash (a dead holder's slot stays held until time
    /// passes), a pause (a holder outlives its hold, and its slot is taken)
    /// or a lost reply, one per path: no two unexpired permits at once, no
    /// two calls in one tick, and every run still ends.
    #[must_use]
    pub fn limits() -> Config {
        let mut c = Self::small();
        c.name = "limits".into();
        c.runs = 2;
        c.limits = true;
        c.faults = Budget {
            crashes: 1,
            pauses: 1,
            lost: 1,
            total: 1,
            ..Budget::default()
        };
        c
    }

    /// Two runs on two workers, the first submitted with a delay (due once
    /// time passes), with a crash, a lost reply or a cancel (of the delayed
    /// run while it waits, or of either later), one per path: the delayed
    /// run holds no entry and starts no attempt until it is due (S15), and
    /// every run still ends.
    #[must_use]
    pub fn delays() -> Config {
        let mut c = Self::small();
        c.name = "delays".into();
        c.runs = 2;
        c.delays = true;
        c.faults = Budget {
            crashes: 1,
            lost: 1,
            cancels: 1,
            total: 1,
            ..Budget::default()
        };
        c
    }

    /// No submitted run; a schedule every second whose first tick is
    /// missed (caught up by one run) and whose second is due, overlap
    /// `cancel`; two workers, each running the scheduler, with a crash or
    /// a lost reply: each tick is handled once (S16), and every tick's run
    /// ends.
    #[must_use]
    pub fn schedules() -> Config {
        let mut c = Self::small();
        c.name = "schedules".into();
        c.runs = 0;
        c.schedules = true;
        c.faults = Budget {
            crashes: 1,
            lost: 1,
            total: 1,
            ..Budget::default()
        };
        c
    }

    /// The names [`Config::named`] knows.
    pub const NAMES: [&'static str; 14] = [
        "small",
        "standard",
        "standard_steps",
        "large",
        "poison",
        "retention",
        "steps",
        "unknown",
        "budget",
        "limits",
        "partitions",
        "trims",
        "delays",
        "schedules",
    ];

    /// A configuration by name.
    pub fn named(name: &str) -> Result<Config, String> {
        let mut c = match name {
            "small" => Ok(Self::small()),
            "standard" => Ok(Self::standard()),
            "large" => Ok(Self::large()),
            "poison" => Ok(Self::poison()),
            "retention" => Ok(Self::retention()),
            "steps" => Ok(Self::steps()),
            "standard_steps" => Ok(Self::standard_steps()),
            "unknown" => Ok(Self::unknown()),
            "budget" => Ok(Self::budget()),
            "limits" => Ok(Self::limits()),
            "partitions" => Ok(Self::partitions()),
            "trims" => Ok(Self::trims()),
            "delays" => Ok(Self::delays()),
            "schedules" => Ok(Self::schedules()),
            other => Err(format!(
                "unknown configuration {other:?}; known: {}",
                Self::NAMES.join(", ")
            )),
        }?;
        if let Ok(total) = std::env::var("PELICAN_CHECK_FAULTS_TOTAL") {
            c.faults.total = total
                .parse()
                .map_err(|e| format!("PELICAN_CHECK_FAULTS_TOTAL: {e}"))?;
        }
        Ok(c)
    }

    /// Overrides fault budgets from `kind=n,kind=n` (kinds: crashes, pauses,
    /// lost, redis_wipes, redis_losses, trims, duplicates, cancels, malformed,
    /// total; `none` zeroes every budget first).
    pub fn with_faults(mut self, spec: &str) -> Result<Config, String> {
        for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            if part == "none" {
                self.faults = Budget::default();
                continue;
            }
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| format!("bad fault budget {part:?}: expected kind=n"))?;
            let n: u8 = v
                .parse()
                .map_err(|_| format!("bad fault budget {part:?}: {v:?} is not a number 0..=255"))?;
            let f = &mut self.faults;
            let slot = match k {
                "crashes" => &mut f.crashes,
                "pauses" => &mut f.pauses,
                "lost" => &mut f.lost,
                "redis_wipes" => &mut f.redis_wipes,
                "redis_losses" => &mut f.redis_losses,
                "trims" => &mut f.trims,
                "duplicates" => &mut f.duplicates,
                "cancels" => &mut f.cancels,
                "malformed" => &mut f.malformed,
                "total" => &mut f.total,
                other => return Err(format!("unknown fault kind {other:?}")),
            };
            *slot = n;
        }
        self.name = format!("{}[{spec}]", self.name);
        Ok(self)
    }

    /// The same configuration with a mutant injected, and with what the
    /// mutant's bug needs to show: PoisonRetried a job whose result
    /// Postgres refuses, WorkerClock a worker whose clock runs ahead (and
    /// a reclaim threshold of 0: a lapsed attempt is taken over only
    /// through its own entry, which must reach the skewed worker),
    /// RetainLive and ForgetKeys retention that runs, StepRerun and ZombieProgress jobs
    /// with steps (whose record reports progress first),
    /// UnknownRetried a job failing with an unknown error, IgnoreBudget a
    /// kind with a budget, Overbooked jobs under a provider's limits,
    /// ReclaimOnePartition two partitions, IgnoreTrimmed a reclaim
    /// threshold of 0 (a trimmed entry is reported once idle),
    /// ForgetHolders the consumers' housekeeping, PromoteEarly a delayed
    /// run, TickUnfenced a schedule.
    #[must_use]
    pub fn with_mutant(mut self, mutant: Option<Mutant>) -> Config {
        self.policy.mutant = mutant;
        #[cfg(feature = "mutants")]
        if mutant == Some(Mutant::PoisonRetried) && !self.outcomes.contains(&OutcomeKind::Poison) {
            self.outcomes.push(OutcomeKind::Poison);
        }
        #[cfg(feature = "mutants")]
        if mutant == Some(Mutant::WorkerClock) {
            if self.skew_ms == 0 {
                self.skew_ms = 4 * self.policy.lease_ms;
            }
            // A live attempt's own entry reaches the skewed worker's
            // reclaimer however recently it was touched.
            self.policy.reclaim_min_idle_ms = 0;
        }
        #[cfg(feature = "mutants")]
        if mutant == Some(Mutant::IgnoreTrimmed) {
            // A reclaim pass reports a trimmed entry once it is idle: here
            // at once, so one fault (the trim) shows the dropped recovery.
            self.policy.reclaim_min_idle_ms = 0;
        }
        #[cfg(feature = "mutants")]
        if mutant == Some(Mutant::UnknownRetried) && !self.outcomes.contains(&OutcomeKind::Unknown)
        {
            self.outcomes.push(OutcomeKind::Unknown);
        }
        #[cfg(feature = "mutants")]
        if matches!(mutant, Some(Mutant::StepRerun | Mutant::ZombieProgress)) {
            self.steps = true;
        }
        #[cfg(feature = "mutants")]
        if mutant == Some(Mutant::Overbooked) {
            self.limits = true;
        }
        #[cfg(feature = "mutants")]
        if matches!(mutant, Some(Mutant::RetainLive | Mutant::ForgetKeys))
            && self.policy.keep_finished_ms == 0
        {
            self.policy.keep_finished_ms = 1;
        }
        #[cfg(feature = "mutants")]
        if mutant == Some(Mutant::ForgetHolders) {
            self.consumers = true;
        }
        #[cfg(feature = "mutants")]
        if mutant == Some(Mutant::PromoteEarly) {
            self.delays = true;
        }
        #[cfg(feature = "mutants")]
        if mutant == Some(Mutant::TickUnfenced) {
            self.schedules = true;
        }
        #[cfg(feature = "mutants")]
        if mutant == Some(Mutant::ReclaimOnePartition) && self.policy.partitions < 2 {
            self.policy.partitions = 2;
        }
        #[cfg(feature = "mutants")]
        if mutant == Some(Mutant::IgnoreBudget) && self.policy.kinds.is_empty() {
            Self::with_budget(&mut self.policy);
        }
        // A skewed worker is not interchangeable with the others.
        self.symmetry &= self.skew_ms == 0;
        self
    }
}
