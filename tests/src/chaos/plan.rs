//! What a soak runs: the [`Plan`] and the fault counts it implies.

use super::BadInput;

/// What to run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Runs submitted through the API.
    pub jobs: u32,
    /// Worker processes.
    pub workers: u32,
    /// Length of the fault phase, in seconds (submissions are spread over
    /// it).
    pub seconds: u32,
    /// The nemesis's and the workload's seed.
    pub seed: u64,
    /// Attempts per run (the API's `--attempts-max`).
    pub attempts_max: u32,
    /// How long to wait for quiescence after healing, in seconds.
    pub settle_seconds: u32,
    /// Run every process with this mutant (a `pelican` built with
    /// `mutants`): the soak must then fail.
    pub mutant: Option<String>,
    /// Run against a Redis Cluster (three masters with a replica each)
    /// instead of one server: master failovers take the place of Redis
    /// restarts and the wipe.
    pub redis_cluster: bool,
}

impl Default for Plan {
    /// The default soak: 20,000 jobs, 4 workers, 150 s of faults.
    fn default() -> Plan {
        Plan {
            jobs: 20_000,
            workers: 4,
            seconds: 150,
            seed: 1,
            attempts_max: 5,
            settle_seconds: 240,
            mutant: None,
            redis_cluster: false,
        }
    }
}

impl Plan {
    /// The short soak `cargo xtask test` runs: 2,000 jobs, 3 workers, 35 s
    /// of faults (≥ 20 kills, a Redis restart, a wipe, a Postgres restart,
    /// every kind of bad input).
    #[must_use]
    pub fn short() -> Plan {
        Plan {
            jobs: 2_000,
            workers: 3,
            seconds: 35,
            seed: 7,
            ..Plan::default()
        }
    }

    /// The short soak on a Redis Cluster: 1,000 jobs, 3 workers, 30 s of
    /// faults, among them master failovers.
    #[must_use]
    pub fn short_cluster() -> Plan {
        Plan {
            jobs: 1_000,
            seconds: 30,
            redis_cluster: true,
            ..Plan::short()
        }
    }

    /// How many faults of each kind the schedule throws.
    #[must_use]
    pub fn fault_counts(&self) -> FaultCounts {
        let s = self.seconds;
        let cluster = self.redis_cluster;
        FaultCounts {
            // About one kill every 1.3 s of the fault phase.
            kills: (s * 10).div_ceil(13).max(20),
            pauses: (s / 6).max(2),
            redis_restarts: if cluster { 0 } else { (s / 45).max(1) },
            redis_wipes: u32::from(!cluster),
            // A failover every 15 s; each keeps the slot without a master
            // for a few seconds.
            failovers: if cluster { (s / 15).max(2) } else { 0 },
            pg_restarts: (s / 60).max(1),
            trims: (s / 8).max(2),
            // Every kind at least twice.
            bad_inputs: (s * 2).max(2 * BadInput::ALL.len() as u32),
            duplicate_publishes: (s / 2).max(5),
        }
    }
}

/// Fault counts of a schedule.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultCounts {
    /// kill -9 of a worker.
    pub kills: u32,
    /// SIGSTOP of a worker past its lease.
    pub pauses: u32,
    /// Redis killed and restarted on its AOF.
    pub redis_restarts: u32,
    /// Redis killed and restarted empty.
    pub redis_wipes: u32,
    /// The job stream's master killed; its replica takes over.
    pub failovers: u32,
    /// Postgres shut down immediately and restarted.
    pub pg_restarts: u32,
    /// XTRIM MINID / XDEL below pending IDs.
    pub trims: u32,
    /// Bad input sent.
    pub bad_inputs: u32,
    /// An existing job entry published again.
    pub duplicate_publishes: u32,
}
