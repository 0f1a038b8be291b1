//! Scenarios (the fixed shape of a seed's world) and fault mixes (what a
//! seed draws for itself).

use pelican_model::protocol::{KindPolicy, Policy};
use pelican_real::Config;
use serde::{Deserialize, Serialize};

/// The shape of a simulated world; everything else comes from the seed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Scenario {
    /// Its name (`--scenario`).
    pub name: String,
    /// Worker nodes.
    pub workers: u32,
    /// Runs the API submits.
    pub runs: u32,
    /// Simulated milliseconds of faults.
    pub fault_phase_ms: u64,
    /// After healing, every accepted run must be terminal and the PEL empty
    /// within this many simulated milliseconds.
    pub heal_bound_ms: u64,
    /// Whether faults are drawn at all (`calm` has none).
    pub faults: bool,
    /// Weight of Redis data loss among the faults (higher in `redis-loss`).
    pub redis_loss_weight: u32,
    /// Weight of worker kills among the faults (higher in `crashy`).
    pub kill_weight: u32,
    /// How far worker clocks are off the servers' (ms): worker `i` runs
    /// ahead by this for `i % 3 == 1`, behind for `i % 3 == 2`. More than a
    /// lease: Postgres's clock alone may judge leases.
    #[serde(default)]
    pub clock_skew_ms: u64,
    /// The driver's knobs.
    pub driver: Config,
}

impl Scenario {
    /// The names [`Scenario::named`] knows.
    pub const NAMES: [&'static str; 5] = ["standard", "calm", "crashy", "redis-loss", "busy"];

    /// The standard scenario: 3 workers with 2 slots each, 10 runs over 2
    /// partitions, 12 s of faults, short leases so that faults and
    /// recoveries interleave.
    #[must_use]
    pub fn standard() -> Scenario {
        Scenario {
            name: "standard".into(),
            workers: 3,
            runs: 10,
            fault_phase_ms: 12_000,
            heal_bound_ms: 90_000,
            faults: true,
            redis_loss_weight: 2,
            kill_weight: 4,
            clock_skew_ms: 6_000,
            driver: Config {
                policy: Policy {
                    lease_ms: 2_000,
                    heartbeat_ms: 600,
                    reclaim_min_idle_ms: 3_000,
                    reclaim_batch_max: 4,
                    attempts_max: 4,
                    backoff_base_ms: 200,
                    backoff_cap_ms: 2_000,
                    sweep_grace_ms: 4_000,
                    sweep_batch_max: 16,
                    value_bytes_max: 1 << 20,
                    keep_finished_ms: 2_000,
                    unknown_retries_max: 1,
                    // A tick 2 s late was missed: outages make catch-ups.
                    catchup_after_ms: 2_000,
                    partitions: 2,
                    kinds: kinds(),
                    mutant: None,
                },
                in_flight_max: 2,
                read_count_max: 2,
                idle_poll_ms: 250,
                call_timeout_ms: 1_000,
                reclaim_every_ms: 1_000,
                maintenance_every_ms: 1_000,
                promote_every_ms: 250,
                shutdown_grace_ms: 2_000,
                job_timeout_ms: 20_000,
                retention_ms: 3_000,
                clock_offset_ms: 0,
            },
        }
    }

    /// The scenario whose first 1,000 seeds must catch mutant `m` (`cargo
    /// xtask verify`, `sim/tests/seeds.rs`): `standard`, but `busy` for
    /// ZombieProgress, whose progress write needs a paused worker to wake
    /// in the few ms between a takeover's claim and its first write: rare
    /// in `standard` (11 of its first 3,000 seeds in one build), so that
    /// its first `standard` seed moves far with any change to the seeds'
    /// timings; common in `busy`.
    #[must_use]
    pub fn home_of(m: pelican_model::protocol::Mutant) -> Scenario {
        let name = if m.name() == "ZombieProgress" {
            "busy"
        } else {
            "standard"
        };
        Scenario::named(name).expect("a known scenario")
    }

    /// A scenario by name.
    ///
    /// # Errors
    /// An unknown name, with the known ones.
    pub fn named(name: &str) -> Result<Scenario, String> {
        let mut s = Scenario::standard();
        match name {
            "standard" => {}
            "calm" => s.faults = false,
            "crashy" => {
                s.kill_weight = 12;
                s.workers = 4;
            }
            "redis-loss" => s.redis_loss_weight = 10,
            "busy" => {
                // Enough deliveries at once that the batching client's
                // batches (claims, completions, reads in one statement)
                // and pipelines (XACKs in one round trip) are common
                // rather than rare, under the same faults.
                s.runs = 40;
                s.driver.in_flight_max = 8;
                s.driver.read_count_max = 8;
            }
            other => {
                return Err(format!(
                    "unknown scenario {other:?}; known: {}",
                    Scenario::NAMES.join(", ")
                ));
            }
        }
        s.name = name.to_owned();
        Ok(s)
    }
}

/// The built-in kinds' policies in the simulation: failing jobs have a
/// back-off of their own and an elapsed budget that some exhaust; sleeps
/// longer than their attempt timeout time out and are retried.
fn kinds() -> std::collections::BTreeMap<String, KindPolicy> {
    let mut fail = KindPolicy::default().budget_ms(7_000);
    fail.backoff_base_ms = Some(300);
    let sleep = KindPolicy::default()
        .attempt_timeout_ms(3_000)
        .attempts_max(5);
    [("fail".to_owned(), fail), ("sleep".to_owned(), sleep)].into()
}

/// What one seed draws for itself (swarm testing): which faults are on and
/// how often they strike. Probabilities are per message; weights are
/// relative among the enabled faults.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FaultMix {
    /// Mean pause between two faults, ms.
    pub fault_every_ms: u64,
    /// Kill a worker, restart it later.
    pub kill: u32,
    /// Pause a worker past its lease, then resume it.
    pub pause: u32,
    /// Cut a worker off Redis or Postgres for a while.
    pub partition: u32,
    /// Restart Redis, losing what was not yet fsynced (AOF everysec).
    pub redis_restart: u32,
    /// Restart Redis with no persistence: stream and group gone.
    pub redis_wipe: u32,
    /// Restart Postgres (nothing lost).
    pub pg_restart: u32,
    /// Trim the stream below pending IDs, or XDEL a pending entry.
    pub trim: u32,
    /// Publish a run's current dispatch again.
    pub duplicate: u32,
    /// Write a malformed entry or one naming an unknown run.
    pub malformed: u32,
    /// Cancel a random run.
    pub cancel: u32,
    /// A request is lost before the server applies it.
    pub lost_request_p: f64,
    /// A reply is lost after the server applied the command.
    pub lost_reply_p: f64,
}
