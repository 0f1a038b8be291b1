//! The live benchmarks of `cargo xtask bench` (the three measurements share
//! their servers and clients, hence one file): drain throughput, latency at a
//! fixed offered load, and recovery after kill -9 — real `pelican worker`
//! processes (a release build, named by `PELICAN_BIN`) against a throwaway
//! Redis (AOF everysec) and a throwaway Postgres cluster (fsync and
//! `synchronous_commit` on).
//!
//! * **Drain**: `drain_jobs` no-op runs are submitted first through the
//!   submit path the API uses (insert, XADD, mark published; many at once),
//!   then the workers start; the clock runs from their start until every
//!   run has its durable outcome and the PEL is empty. Each drain also
//!   reports each process's CPU time ([`cpu`]) and what it asked of Redis
//!   and Postgres ([`work`]), per run.
//! * **Latency**: with the workers idle, runs are submitted at a fixed rate
//!   below saturation; each run's latency is from the start of its
//!   submission until a poll of Postgres (every 2 ms) sees it succeeded.
//! * **Recovery**: sleep runs are started; once they are running, the
//!   worker holding some is killed with kill -9; each of its runs' recovery
//!   time is from the kill until the poll sees it succeeded (another
//!   worker reclaims and re-runs it). Lease 2 s, heartbeat 400 ms.
//! * **The cost of the guarantees**: the same drain (same submission,
//!   in-flight depth and batch size) with the least protocol that still
//!   drains the queue ([`baseline`]): read the run, run the job, write the
//!   outcome unfenced, acknowledge; no fenced claim, attempt record, lease
//!   or heartbeat. The shipped protocol's drain against it prices fencing,
//!   attempts and leases. Between the two, the fenced floor: the baseline
//!   with a durable claim under a new fence and a fenced outcome, the least
//!   any protocol that keeps S3 writes; and Pelican's own claim and success
//!   statements in the baseline's loop, which part the statements' cost
//!   from the worker's. Heartbeats cost a no-op drain nothing either way:
//!   no job outlives the first heartbeat tick.
//!
//! * **Scale**: a fresh database is given `finished_rows` finished runs
//!   (submitted in bulk and drained by `pelican worker`s, as users' runs
//!   finish) and 1,000 live ones; then a worker's
//!   maintenance pass (retries, outbox, sweep, retention, as `pelican
//!   worker` runs them) and a `GET /metrics` of `pelican api` are timed,
//!   20 of each, medians reported. Neither may scan finished runs.
//! * **Cost as work grows**: the drain again, twice: `drain_jobs` runs
//!   beside `finished_rows` finished ones, given as above (retention, as
//!   shipped, keeps them for a week), and a backlog of
//!   `queued_rows` runs (submitted with `pelican submit --from-file`, the
//!   bulk path) drained whole; before the latter drain starts, the
//!   maintenance pass and `GET /metrics` are timed with the backlog queued.
//!   Each is compared with a small-table drain run right before it, its
//!   pair. Every drain reports its worker's peak resident set (`VmHWM`).
//! * **Redis Cluster**: the drain again through a throwaway Redis Cluster
//!   of three masters with a replica each (`--redis-cluster`), over three
//!   partitions, one on each master (`--partitions 3`), paired with a
//!   drain on one server (one partition).
//!
//! Figures are what this machine did in this run: nothing here asserts a
//! target; `cargo xtask bench` prints them against the targets.

use crate::{Cluster, Database, Env, Proc, Redis, round, submit_new};
use baseline::{Ablation, Protocol};
use pelican_model::protocol::{DbOp, DbReply};
use pelican_model::status::RunStatus;
use pelican_real::live::{PgDb, RedisAddr, RedisStream};
use pelican_real::{Config, Io, NoProbe};
use serde_json::{Value, json};
use std::collections::BTreeMap;

pub mod baseline;
pub mod cpu;
pub mod delays;
pub mod instructions;
pub mod steady;
pub mod submission;
pub mod work;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What to measure.
#[derive(Clone, Debug)]
pub struct BenchPlan {
    /// No-op runs drained.
    pub drain_jobs: u32,
    /// Worker processes of the drain and the latency run (the recovery run
    /// starts at least two: one to kill, one to take over). One by default:
    /// on two cores shared with Redis and Postgres, one process running both
    /// cores with twice the deliveries in flight drained faster than two
    /// (26,100–29,900 jobs/s in four runs against 17,100–20,200 in five): it
    /// gathers every delivery's claim into the same batches, and fewer
    /// threads fight for the cores.
    pub workers: u32,
    /// Each worker's `--in-flight-max` (and so its XREADGROUP COUNT): how
    /// many deliveries a worker holds, which bounds how full its batches
    /// get. 4,096 by default: a no-op drain is a backlog, and the deeper the
    /// worker reads into it the fuller its claim and completion batches
    /// (capped at `batch_max`) and the less each job costs Postgres; drains
    /// on this machine ran 42,200–46,700 jobs/s at 1,024, 49,000–51,400 at
    /// 2,048, 53,400–57,400 at 3,072 and 48,700–62,900 at 4,096.
    pub in_flight: u32,
    /// Offered load of the latency run, runs per second.
    pub latency_rate: u32,
    /// Offered load of a second latency run, as long (0: skip it).
    pub latency_rate_high: u32,
    /// Runs behind the worker's instructions per delivery ([`instructions`];
    /// 0: skip them): drains of this many and three times as many.
    pub instructions_runs: u32,
    /// Length of the latency run, seconds.
    pub latency_seconds: u32,
    /// Workers killed in the recovery run.
    pub kills: u32,
    /// Submissions in flight during the bulk submit.
    pub submit_concurrency: usize,
    /// The workers' `--reclaim-min-idle-ms`.
    pub reclaim_min_idle_ms: u64,
    /// The workers' `--batch-max`.
    pub batch_max: u32,
    /// Also drain with `--batch-max 1` (every claim and completion on its
    /// own), to show what batching buys.
    pub compare_unbatched: bool,
    /// Rounds of a drain whose workers export their spans
    /// (`--otlp-endpoint`, to the tests' OTLP receiver), each paired with
    /// one that does not, the order alternating (0: skip them).
    pub otlp_rounds: u32,
    /// The workers' `--otlp-endpoint` (set by the exporting drains).
    pub otlp_endpoint: Option<String>,
    /// Also drain with the [`baseline`]s, to price the guarantees.
    pub baseline: bool,
    /// Rounds of drains behind the cost of the guarantees: shipped; then
    /// in the baseline's loop, its statements, the fenced floor and the
    /// unfenced baseline. The first round's shipped drain is the headline
    /// drain. Their medians are compared.
    pub cost_rounds: u32,
    /// Pairs (small table, at scale) behind each drain at scale; the
    /// median of their slowdowns is reported.
    pub scale_rounds: u32,
    /// Finished runs loaded for the scale figures and the drain beside
    /// them (0: skip both).
    pub finished_rows: u32,
    /// Queued runs of the backlog drain (0: skip it).
    pub queued_rows: u32,
    /// Also drain through a Redis Cluster of three masters (each with a
    /// replica), paired with a single-server drain.
    pub redis_cluster: bool,
    /// Job stream partitions of the drains on one server.
    pub partitions: u16,
    /// Runs behind each measure of the statements alone (0: skip them;
    /// they are measured only with the baselines).
    pub statement_runs: u32,
    /// Delayed runs submitted a second for `latency_seconds`, each delayed
    /// `delay_ms`, to measure how late they start ([`delays`]; 0: skip).
    pub delay_rate: u32,
    /// Their delay.
    pub delay_ms: u64,
    /// Schedules every second, for `latency_seconds`, to measure how late
    /// their ticks' runs start ([`delays::tick_lateness`]; 0: skip).
    pub schedules: u32,
}

impl Default for BenchPlan {
    fn default() -> BenchPlan {
        BenchPlan {
            drain_jobs: 100_000,
            workers: 1,
            in_flight: 4096,
            latency_rate: 500,
            latency_rate_high: 5_000,
            instructions_runs: 10_000,
            latency_seconds: 10,
            kills: 20,
            submit_concurrency: 64,
            reclaim_min_idle_ms: 500,
            batch_max: 512,
            compare_unbatched: true,
            otlp_rounds: 2,
            otlp_endpoint: None,
            baseline: false,
            cost_rounds: 2,
            scale_rounds: 3,
            finished_rows: 1_000_000,
            queued_rows: 1_000_000,
            redis_cluster: true,
            partitions: 1,
            statement_runs: 100_000,
            delay_rate: 200,
            delay_ms: 1_000,
            schedules: 20,
        }
    }
}

/// The live figures.
#[derive(Clone, Debug, Default)]
pub struct LiveFigures {
    /// Runs submitted for the drain.
    pub drain_jobs: u64,
    /// Bulk submission: seconds, and runs per second.
    pub submit_seconds: f64,
    /// Runs submitted per second.
    pub submit_per_s: f64,
    /// Runs `pelican submit --from-file` stored and published per second
    /// (process start and file included).
    pub submit_from_file_per_s: Option<f64>,
    /// Runs `POST /runs` stored a second in arrays ([`submission`]).
    pub submit_api_per_s: Option<f64>,
    /// From the workers' start to every run's outcome and an empty PEL.
    pub drain_seconds: f64,
    /// `drain_jobs / drain_seconds`.
    pub jobs_per_s: f64,
    /// The same drain with `--batch-max 1`.
    pub unbatched_jobs_per_s: Option<f64>,
    /// Pairs (export off, export on) of drains, jobs/s.
    pub otlp_pairs: Vec<(f64, f64)>,
    /// The shipped protocol's drains of the cost comparison, jobs/s (the
    /// first is the headline drain).
    pub shipped_drains: Vec<f64>,
    /// The unfenced [`baseline`]'s drains, jobs/s.
    pub unguarded_drains: Vec<f64>,
    /// The fenced floor's drains ([`baseline::Protocol::Fenced`]), jobs/s.
    pub fenced_floor_drains: Vec<f64>,
    /// The shipped statements' drains in the baseline's loop
    /// ([`baseline::Protocol::ShippedStatements`]), jobs/s.
    pub statements_drains: Vec<f64>,
    /// Each drainer's CPU split ([`cpu::PerRun`]), one per drain of the
    /// cost comparison, under the names of [`STATEMENT_COSTS`] (and
    /// `shipped` for `pelican worker`'s); the headline drain's alone
    /// without the baselines.
    pub drain_cpu: Vec<(&'static str, Vec<cpu::PerRun>)>,
    /// Each drainer's work per run in Redis and Postgres ([`work::Work`]),
    /// as [`LiveFigures::drain_cpu`].
    pub drain_work: Vec<(&'static str, Vec<work::Work>)>,
    /// Runs measured in the latency run.
    pub latency_jobs: u64,
    /// Submit to durable outcome, at `latency_rate`.
    pub p50_ms: f64,
    /// 99th percentile of the same.
    pub p99_ms: f64,
    /// The second latency run: its rate, p50 and p99 in ms.
    pub latency_high: Option<(u32, f64, f64)>,
    /// How late delayed runs started ([`delays`]).
    pub delays: Option<delays::Lateness>,
    /// How late schedules' ticks' runs started.
    pub ticks: Option<delays::Lateness>,
    /// The worker's instructions per delivery ([`instructions`]).
    pub instructions_per_delivery: Option<f64>,
    /// Runs the kills interrupted.
    pub recovery_runs: u64,
    /// Kill to outcome of each interrupted run.
    pub recovery_p50_ms: f64,
    /// 99th percentile of the same.
    pub recovery_p99_ms: f64,
    /// The slowest recovery.
    pub recovery_max_ms: f64,
    /// Finished runs in the tables of the scale figures.
    pub finished_rows: u64,
    /// Median maintenance pass with them, ms.
    pub maintenance_pass_ms: Option<f64>,
    /// Median `GET /metrics` with them, ms.
    pub metrics_ms: Option<f64>,
    /// For scale: the median count of every run by status (`pelican
    /// status`, which scans them all), ms.
    pub count_all_ms: Option<f64>,
    /// The headline drain's worker: peak resident set, KiB.
    pub peak_rss_kib: Option<u64>,
    /// The drain of `drain_jobs` runs beside `finished_rows` finished ones.
    pub beside_finished: Option<ScaleDrain>,
    /// Runs in the backlog drain.
    pub queued_rows: u64,
    /// The backlog drained whole.
    pub backlog: Option<ScaleDrain>,
    /// Median maintenance pass with the backlog queued, ms.
    pub queued_maintenance_pass_ms: Option<f64>,
    /// Median `GET /metrics` with the backlog queued, ms.
    pub queued_metrics_ms: Option<f64>,
    /// The drain through a Redis Cluster of three masters, its pair the
    /// same drain on one `redis-server`.
    pub redis_cluster: Option<ScaleDrain>,
    /// Each drainer's statements alone, in µs per run of Postgres's time
    /// (see [`STATEMENT_COSTS`]), one value per round.
    pub statement_costs: Vec<(&'static str, Vec<f64>)>,
}

/// A baseline's name in the report's objects: its entry of
/// [`STATEMENT_COSTS`] with the schema as shipped.
fn report_key(protocol: Protocol) -> &'static str {
    STATEMENT_COSTS
        .iter()
        .find(|(_, p, a)| *p == protocol && *a == Ablation::None)
        .map(|(name, ..)| *name)
        .expect("every baseline is timed as shipped")
}

/// The statements timed alone ([`baseline::statement_cost`]), under their
/// names in the report: the three drainers', and the shipped ones with one
/// part of the schema taken away at a time, to price that part.
pub const STATEMENT_COSTS: [(&str, Protocol, Ablation); 5] = [
    ("unfenced", Protocol::Unfenced, Ablation::None),
    ("fenced_floor", Protocol::Fenced, Ablation::None),
    (
        "shipped_statements",
        Protocol::ShippedStatements,
        Ablation::None,
    ),
    (
        "shipped_statements_without_count_triggers",
        Protocol::ShippedStatements,
        Ablation::NoCountTriggers,
    ),
    (
        "shipped_statements_with_hot_finish",
        Protocol::ShippedStatements,
        Ablation::HotFinish,
    ),
];

/// Drains at scale (or on a cluster), each with its pair: the same
/// small-table drain on one Redis server, run right beside it so that a
/// slow spell of the machine falls on both. One pair cannot resolve a few
/// percent on a noisy machine (single pairs of one build read 5.9% to
/// 17.5% apart), so the figure is the median over several pairs, run in
/// alternating order (pair first, then the drain at scale first).
#[derive(Clone, Debug, Default)]
pub struct ScaleDrain {
    /// Each pair, in the order run: (the small-table drain, the drain at
    /// scale), jobs/s.
    pub pairs: Vec<(f64, f64)>,
    /// The highest peak resident set of a worker draining at scale, KiB.
    pub peak_rss_kib: Option<u64>,
}

impl ScaleDrain {
    /// The small-table drains' median, jobs/s.
    #[must_use]
    pub fn pair_jobs_per_s(&self) -> Option<f64> {
        median(&self.pairs.iter().map(|p| p.0).collect::<Vec<_>>())
    }

    /// The drains at scale's median, jobs/s.
    #[must_use]
    pub fn jobs_per_s(&self) -> Option<f64> {
        median(&self.pairs.iter().map(|p| p.1).collect::<Vec<_>>())
    }

    /// How much slower each drain at scale was than its pair, percent
    /// (negative: faster), in the order run.
    #[must_use]
    pub fn slowdowns_pct(&self) -> Vec<f64> {
        self.pairs
            .iter()
            .map(|(pair, at_scale)| 100.0 * (1.0 - at_scale / pair))
            .collect()
    }

    /// The median of [`ScaleDrain::slowdowns_pct`]: each drain is compared
    /// with its own pair, never with a drain at another moment.
    #[must_use]
    pub fn slowdown_pct(&self) -> Option<f64> {
        median(&self.slowdowns_pct())
    }
}

impl LiveFigures {
    /// Records a drain's CPU split and work under `name` (see
    /// [`LiveFigures::drain_cpu`]).
    fn push_drain(&mut self, name: &'static str, d: &Drained) {
        push_named(&mut self.drain_cpu, name, d.cpu);
        push_named(&mut self.drain_work, name, d.work.clone());
    }

    /// The baseline protocol's median drain, jobs/s.
    #[must_use]
    pub fn unguarded_jobs_per_s(&self) -> Option<f64> {
        median(&self.unguarded_drains)
    }

    /// What the guarantees cost a no-op drain: how much lower the shipped
    /// protocol's median drain is than the baseline's, in percent of the
    /// baseline (negative: the shipped protocol drained faster).
    #[must_use]
    pub fn guarantees_cost_pct(&self) -> Option<f64> {
        let (shipped, baseline) = (median(&self.shipped_drains)?, self.unguarded_jobs_per_s()?);
        Some(100.0 * (1.0 - shipped / baseline))
    }

    /// The fenced floor's median drain, jobs/s.
    #[must_use]
    pub fn fenced_floor_jobs_per_s(&self) -> Option<f64> {
        median(&self.fenced_floor_drains)
    }

    /// What fencing alone costs: how much lower the fenced floor's median
    /// drain is than the unfenced baseline's, in percent of the latter.
    /// No protocol that keeps S3 can cost less on this machine.
    #[must_use]
    pub fn fencing_floor_cost_pct(&self) -> Option<f64> {
        let (floor, baseline) = (
            self.fenced_floor_jobs_per_s()?,
            self.unguarded_jobs_per_s()?,
        );
        Some(100.0 * (1.0 - floor / baseline))
    }

    /// What the shipped protocol costs beyond the fenced floor, in percent
    /// of the floor's median drain.
    #[must_use]
    pub fn beyond_floor_cost_pct(&self) -> Option<f64> {
        let (shipped, floor) = (
            median(&self.shipped_drains)?,
            self.fenced_floor_jobs_per_s()?,
        );
        Some(100.0 * (1.0 - shipped / floor))
    }

    /// The yardstick of the drain: the shipped protocol's median drain as
    /// a fraction of the fenced floor's.
    #[must_use]
    pub fn drain_floor_ratio(&self) -> Option<f64> {
        Some(median(&self.shipped_drains)? / self.fenced_floor_jobs_per_s()?)
    }

    /// The yardstick of CPU: the shipped drain's CPU per run, every process
    /// together, as a multiple of the fenced floor's (medians of each).
    #[must_use]
    pub fn cpu_floor_ratio(&self) -> Option<f64> {
        let total = |name: &str| {
            let (_, drains) = self.drain_cpu.iter().find(|(n, _)| *n == name)?;
            median(&drains.iter().map(cpu::PerRun::total).collect::<Vec<_>>())
        };
        Some(total("shipped")? / total(report_key(Protocol::Fenced))?)
    }

    /// As JSON.
    #[must_use]
    pub fn json(&self) -> Value {
        let mib = |kib: Option<u64>| kib.map(|k| round(k as f64 / 1024.0, 1));
        let (finished, queued) = (self.beside_finished.as_ref(), self.backlog.as_ref());
        let cluster = self.redis_cluster.as_ref();
        let mut out = json!({
            "drain_jobs": self.drain_jobs,
            "submit_seconds": round(self.submit_seconds, 2),
            "submit_per_s": round(self.submit_per_s, 0),
            "submit_from_file_per_s": self.submit_from_file_per_s.map(|x| round(x, 0)),
            "drain_seconds": round(self.drain_seconds, 2),
            "live_jobs_per_s": round(self.jobs_per_s, 0),
            "live_jobs_per_s_unbatched": self.unbatched_jobs_per_s.map(|x| round(x, 0)),
            "otlp_drains_off": self.otlp_pairs.iter().map(|p| round(p.0, 0)).collect::<Vec<_>>(),
            "otlp_drains_on": self.otlp_pairs.iter().map(|p| round(p.1, 0)).collect::<Vec<_>>(),
            "live_jobs_per_s_unguarded": self.unguarded_jobs_per_s().map(|x| round(x, 0)),
            "guarantees_cost_pct": self.guarantees_cost_pct().map(|x| round(x, 1)),
            "cost_drains_shipped": self.shipped_drains.iter().map(|x| round(*x, 0)).collect::<Vec<_>>(),
            "cost_drains_unguarded": self.unguarded_drains.iter().map(|x| round(*x, 0)).collect::<Vec<_>>(),
            "latency_jobs": self.latency_jobs,
            "live_p50_ms": round(self.p50_ms, 1),
            "live_p99_ms": round(self.p99_ms, 1),
            "recovery_runs": self.recovery_runs,
            "recovery_p50_ms": round(self.recovery_p50_ms, 0),
            "recovery_p99_ms": round(self.recovery_p99_ms, 0),
            "recovery_max_ms": round(self.recovery_max_ms, 0),
            "finished_rows": self.finished_rows,
            "maintenance_pass_ms_1m_finished": self.maintenance_pass_ms.map(|x| round(x, 2)),
            "metrics_ms_1m_finished": self.metrics_ms.map(|x| round(x, 2)),
            "count_all_ms_1m_finished": self.count_all_ms.map(|x| round(x, 1)),
            "worker_peak_rss_mib": mib(self.peak_rss_kib),
            "live_jobs_per_s_1m_finished": finished.and_then(ScaleDrain::jobs_per_s).map(|x| round(x, 0)),
            "live_jobs_per_s_1m_finished_pair": finished.and_then(ScaleDrain::pair_jobs_per_s).map(|x| round(x, 0)),
            "slowdown_pct_1m_finished": finished.and_then(ScaleDrain::slowdown_pct).map(|x| round(x, 1)),
            "slowdowns_pct_1m_finished": finished.map(|d| pcts(&d.slowdowns_pct())),
            "worker_peak_rss_mib_1m_finished": mib(finished.and_then(|d| d.peak_rss_kib)),
            "queued_rows": self.queued_rows,
            "live_jobs_per_s_1m_queued": queued.and_then(ScaleDrain::jobs_per_s).map(|x| round(x, 0)),
            "live_jobs_per_s_1m_queued_pair": queued.and_then(ScaleDrain::pair_jobs_per_s).map(|x| round(x, 0)),
            "slowdown_pct_1m_queued": queued.and_then(ScaleDrain::slowdown_pct).map(|x| round(x, 1)),
            "slowdowns_pct_1m_queued": queued.map(|d| pcts(&d.slowdowns_pct())),
            "worker_peak_rss_mib_1m_queued": mib(queued.and_then(|d| d.peak_rss_kib)),
            "maintenance_pass_ms_1m_queued": self.queued_maintenance_pass_ms.map(|x| round(x, 2)),
            "metrics_ms_1m_queued": self.queued_metrics_ms.map(|x| round(x, 2)),
            "live_jobs_per_s_redis_cluster_3_masters": cluster.and_then(ScaleDrain::jobs_per_s).map(|x| round(x, 0)),
            "live_jobs_per_s_redis_cluster_3_masters_pair": cluster.and_then(ScaleDrain::pair_jobs_per_s).map(|x| round(x, 0)),
            "slowdown_pct_redis_cluster_3_masters": cluster.and_then(ScaleDrain::slowdown_pct).map(|x| round(x, 1)),
        });
        // The cost's split over the baselines, the yardstick and the bulk
        // submissions (one `json!` of every key would pass the macro's
        // recursion limit).
        let floor = json!({
            "live_jobs_per_s_fenced_floor": self.fenced_floor_jobs_per_s().map(|x| round(x, 0)),
            "cost_drains_fenced_floor": self.fenced_floor_drains.iter().map(|x| round(*x, 0)).collect::<Vec<_>>(),
            "fencing_floor_cost_pct": self.fencing_floor_cost_pct().map(|x| round(x, 1)),
            "beyond_floor_cost_pct": self.beyond_floor_cost_pct().map(|x| round(x, 1)),
            "submit_api_per_s": self.submit_api_per_s.map(|x| round(x, 0)),
            "submit_api_to_cli_ratio": self.submit_api_per_s.zip(self.submit_from_file_per_s).map(|(a, c)| round(a / c, 3)),
            "drain_floor_ratio": self.drain_floor_ratio().map(|x| round(x, 3)),
            "cpu_floor_ratio": self.cpu_floor_ratio().map(|x| round(x, 3)),
            "instructions_per_delivery": self.instructions_per_delivery.map(|x| round(x, 0)),
            "latency_rate_high": self.latency_high.map(|(rate, ..)| rate),
            "live_p50_ms_high": self.latency_high.map(|(_, p50, _)| round(p50, 1)),
            "live_p99_ms_high": self.latency_high.map(|(.., p99)| round(p99, 1)),
            "delay_runs": self.delays.map(|d| d.runs),
            "delay_start_late_p50_ms": self.delays.map(|d| round(d.p50_ms, 0)),
            "delay_start_late_p99_ms": self.delays.map(|d| round(d.p99_ms, 0)),
            "delay_start_late_max_ms": self.delays.map(|d| round(d.max_ms, 0)),
            "tick_runs": self.ticks.map(|d| d.runs),
            "tick_start_late_p50_ms": self.ticks.map(|d| round(d.p50_ms, 0)),
            "tick_start_late_p99_ms": self.ticks.map(|d| round(d.p99_ms, 0)),
            "tick_start_late_max_ms": self.ticks.map(|d| round(d.max_ms, 0)),
            "live_jobs_per_s_shipped_statements": median(&self.statements_drains).map(|x| round(x, 0)),
            "cost_drains_shipped_statements": self.statements_drains.iter().map(|x| round(*x, 0)).collect::<Vec<_>>(),
        });
        if let (Value::Object(out), Value::Object(floor)) = (&mut out, floor) {
            out.extend(floor);
        }
        if !self.statement_costs.is_empty() {
            let medians: serde_json::Map<String, Value> = self
                .statement_costs
                .iter()
                .map(|(name, us)| ((*name).to_owned(), json!(median(us).map(|x| round(x, 2)))))
                .collect();
            let rounds: serde_json::Map<String, Value> = self
                .statement_costs
                .iter()
                .map(|(name, us)| {
                    let us: Vec<f64> = us.iter().map(|x| round(*x, 2)).collect();
                    ((*name).to_owned(), json!(us))
                })
                .collect();
            out["pg_us_per_run"] = Value::Object(medians);
            out["pg_us_per_run_rounds"] = Value::Object(rounds);
        }
        if let Some(split) = by_name(&self.drain_cpu, cpu::PerRun::medians_json) {
            out["cpu_us_per_run"] = split;
        }
        if let Some(work) = by_name(&self.drain_work, work::Work::medians_json) {
            out["work_per_run"] = work;
        }
        out
    }
}

/// Each name's drains summed up by `medians` as one JSON object; `None`
/// without drains.
fn by_name<T>(lists: &[(&'static str, Vec<T>)], medians: fn(&[T]) -> Value) -> Option<Value> {
    (!lists.is_empty()).then(|| {
        Value::Object(
            lists
                .iter()
                .map(|(name, drains)| ((*name).to_owned(), medians(drains)))
                .collect(),
        )
    })
}

/// Appends `x` to `name`'s list, which is made at its first value.
fn push_named<T>(lists: &mut Vec<(&'static str, Vec<T>)>, name: &'static str, x: T) {
    match lists.iter_mut().find(|(n, _)| *n == name) {
        Some((_, xs)) => xs.push(x),
        None => lists.push((name, vec![x])),
    }
}

/// Percentages as JSON, to a tenth.
fn pcts(xs: &[f64]) -> Vec<f64> {
    xs.iter().map(|x| round(*x, 1)).collect()
}

/// The median of `xs` (of an even count, the mean of the middle two).
fn median(xs: &[f64]) -> Option<f64> {
    let mut xs = xs.to_vec();
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(xs[n / 2]),
        _ => Some(f64::midpoint(xs[n / 2 - 1], xs[n / 2])),
    }
}

/// The `q` quantile (0..=1) of `xs`, nearest rank.
#[must_use]
pub fn quantile(xs: &mut [f64], q: f64) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    xs.sort_by(f64::total_cmp);
    let rank = ((q * xs.len() as f64).ceil() as usize).clamp(1, xs.len());
    xs[rank - 1]
}

type Clients = Io<RedisStream, PgDb, NoProbe>;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime starts")
}

async fn clients(env: &Env, pool: u32) -> Clients {
    let stream = RedisStream::connect(
        &RedisAddr::new(&env.redis.url(), env.redis.is_cluster()),
        env.names(),
        100,
        Duration::from_secs(5),
    )
    .await
    .expect("the bench's Redis answers");
    let db = PgDb::connect(&env.database_url, pool, Duration::from_secs(10))
        .await
        .expect("the bench's Postgres answers");
    Io {
        stream,
        db,
        probe: NoProbe,
        entropy: Arc::new(crate::Fixed),
        config: Config {
            policy: pelican_model::protocol::Policy {
                partitions: env.partitions,
                ..pelican_model::protocol::Policy::default()
            },
            ..Config::default()
        },
    }
}

/// Submits `n` runs, `concurrency` at a time.
async fn submit_many(io: &Arc<Clients>, n: u32, concurrency: usize, kind: &str, input: &str) {
    let mut tasks = tokio::task::JoinSet::new();
    let mut next = 0;
    while next < n || !tasks.is_empty() {
        while next < n && tasks.len() < concurrency {
            let (io, kind, input) = (Arc::clone(io), kind.to_owned(), input.to_owned());
            tasks.spawn(async move { submit_new(&io, &kind, &input).await });
            next += 1;
        }
        if let Some(r) = tasks.join_next().await {
            r.expect("a submission does not panic");
        }
    }
}

async fn statuses(db: &PgDb, runs: &[i64]) -> BTreeMap<i64, String> {
    // An observation query of the bench, not a protocol statement.
    sqlx::query_as::<_, (i64, String)>("SELECT run_id, status FROM runs WHERE run_id = ANY($1)")
        .bind(runs)
        .fetch_all(db.pool())
        .await
        .unwrap_or_default()
        .into_iter()
        .collect()
}

async fn open_runs(db: &PgDb) -> u64 {
    match db.execute(&DbOp::CountRuns).await {
        Ok(DbReply::Counts(counts)) => counts
            .iter()
            .filter(|(s, _)| !s.is_terminal())
            .map(|(_, n)| n)
            .sum(),
        _ => u64::MAX,
    }
}

/// The workers' timings: the harness's lease (2 s) and heartbeat (400 ms),
/// a reclaim pass every 200 ms, and the shipped defaults for maintenance
/// (every second) and the sweeper's grace (two minutes: a backlog of queued
/// runs is not a lost publication).
const WORKER_FLAGS: [&str; 8] = [
    "--reclaim-every-ms",
    "200",
    "--read-block-ms",
    "500",
    "--maintenance-every-ms",
    "1000",
    "--sweep-grace-ms",
    "120000",
];

/// A database of its own on `cluster`, a fresh Redis, and the plan's
/// workers on them, untraced: a run measured alone.
fn fresh_env(cluster: &Cluster, plan: &BenchPlan) -> (Env, Vec<Proc>) {
    let db = Database::create_on(&cluster.admin_url());
    let url = db.url().to_owned();
    let mut env = Env::with_database(url, Some(db), None);
    env.trace = false;
    let workers = start_workers(&mut env, plan);
    (env, workers)
}

fn start_workers(env: &mut Env, plan: &BenchPlan) -> Vec<Proc> {
    (1..=plan.workers)
        .map(|w| start_worker(env, plan, w))
        .collect()
}

fn start_worker(env: &mut Env, plan: &BenchPlan, w: u32) -> Proc {
    let in_flight = plan.in_flight.to_string();
    let min_idle = plan.reclaim_min_idle_ms.to_string();
    let batch_max = plan.batch_max.to_string();
    let mut flags: Vec<&str> = WORKER_FLAGS.to_vec();
    flags.extend(["--in-flight-max", &in_flight]);
    flags.extend(["--reclaim-min-idle-ms", &min_idle]);
    flags.extend(["--batch-max", &batch_max]);
    if let Some(url) = &plan.otlp_endpoint {
        flags.extend(["--otlp-endpoint", url]);
    }
    env.worker(w, None, &flags)
}

/// Measures the drain, the latency and the recovery; progress on stderr.
///
/// # Panics
/// When a service cannot be started, or a run does not finish within a
/// few minutes (the figures would be meaningless).
pub fn run(plan: &BenchPlan) -> LiveFigures {
    let rt = runtime();
    let cluster = Cluster::start_with(&work::PG_SETTINGS);
    let mut figures = LiveFigures::default();

    // Drain, batched as shipped; then the baselines (the fenced floor, the
    // shipped statements, the unfenced baseline), in rounds with the
    // shipped protocol; then each claim and completion on its own.
    let jobs = f64::from(plan.drain_jobs);
    let one = Topology::Server;
    let drain_as = |batch_max, baseline, backlog, redis| {
        drain(&rt, &cluster, plan, batch_max, baseline, backlog, redis)
    };
    // The shipped protocol on a small table and one server, as shipped.
    let small = || drain_as(plan.batch_max, None, Backlog::Fresh, one);
    let headline = small();
    figures.drain_jobs = u64::from(plan.drain_jobs);
    figures.submit_seconds = headline.submit_s;
    figures.submit_per_s = jobs / headline.submit_s;
    figures.drain_seconds = headline.drain_s;
    figures.jobs_per_s = headline.jobs_per_s();
    figures.peak_rss_kib = headline.peak_rss_kib;
    figures.push_drain("shipped", &headline);
    if plan.baseline {
        for round in 0..plan.cost_rounds.max(1) {
            // The first round's shipped drain is the headline drain.
            let shipped = match round {
                0 => figures.jobs_per_s,
                _ => {
                    let d = small();
                    figures.push_drain("shipped", &d);
                    d.jobs_per_s()
                }
            };
            figures.shipped_drains.push(shipped);
            for protocol in [
                Protocol::Fenced,
                Protocol::ShippedStatements,
                Protocol::Unfenced,
            ] {
                let d = drain_as(plan.batch_max, Some(protocol), Backlog::Fresh, one);
                let drains = match protocol {
                    Protocol::Fenced => &mut figures.fenced_floor_drains,
                    Protocol::ShippedStatements => &mut figures.statements_drains,
                    Protocol::Unfenced => &mut figures.unguarded_drains,
                };
                drains.push(d.jobs_per_s());
                figures.push_drain(report_key(protocol), &d);
            }
        }
        eprintln!(
            "bench: the guarantees cost {:.1}% of the baseline's drain, fencing alone {:.1}% (shipped {:.0?}, its statements in the baseline's loop {:.0?}, fenced floor {:.0?}, baseline {:.0?} jobs/s)",
            figures.guarantees_cost_pct().unwrap_or(f64::NAN),
            figures.fencing_floor_cost_pct().unwrap_or(f64::NAN),
            figures.shipped_drains,
            figures.statements_drains,
            figures.fenced_floor_drains,
            figures.unguarded_drains,
        );
    }
    if plan.baseline && plan.statement_runs > 0 {
        figures.statement_costs = statement_costs(&rt, &cluster, plan);
    }
    figures.submit_api_per_s = Some(submission::through_api(&cluster, plan.drain_jobs));
    figures.submit_from_file_per_s = Some(submit_from_file(&cluster, plan.drain_jobs));
    if plan.compare_unbatched {
        let unbatched = drain_as(1, None, Backlog::Fresh, one);
        figures.unbatched_jobs_per_s = Some(unbatched.jobs_per_s());
    }
    for round in 0..plan.otlp_rounds {
        let sink = crate::otlp::OtlpSink::start();
        let exporting = BenchPlan {
            otlp_endpoint: Some(sink.url.clone()),
            ..plan.clone()
        };
        let on = || {
            drain(
                &rt,
                &cluster,
                &exporting,
                plan.batch_max,
                None,
                Backlog::Fresh,
                one,
            )
        };
        let (off, on) = if round % 2 == 0 {
            (small().jobs_per_s(), on().jobs_per_s())
        } else {
            let on = on().jobs_per_s();
            (small().jobs_per_s(), on)
        };
        eprintln!(
            "bench: drain {off:.0} jobs/s with export off, {on:.0} with it on ({} spans received)",
            sink.spans().len()
        );
        figures.otlp_pairs.push((off, on));
    }
    // Cost as work grows: each drain at scale with its pair, `rounds`
    // times, the order alternating.
    let at_scale = |backlog, redis, rounds: u32| {
        let mut figures = ScaleDrain::default();
        let mut drains = Vec::new();
        for round in 0..rounds.max(1) {
            let (pair, d) = if round % 2 == 0 {
                let pair = small();
                (pair, drain_as(plan.batch_max, None, backlog, redis))
            } else {
                let d = drain_as(plan.batch_max, None, backlog, redis);
                (small(), d)
            };
            figures.pairs.push((pair.jobs_per_s(), d.jobs_per_s()));
            figures.peak_rss_kib = figures.peak_rss_kib.max(d.peak_rss_kib);
            drains.push(d);
        }
        eprintln!(
            "bench: {} pairs (small table, at scale): {:.0?} jobs/s; slower by {:.1?}%",
            figures.pairs.len(),
            figures.pairs,
            figures.slowdowns_pct()
        );
        (figures, drains)
    };
    if plan.finished_rows > 0 {
        let rounds = plan.scale_rounds;
        figures.beside_finished =
            Some(at_scale(Backlog::Finished(plan.finished_rows), one, rounds).0);
    }
    if plan.queued_rows > 0 {
        let (backlog, drains) = at_scale(Backlog::Queued(plan.queued_rows), one, plan.scale_rounds);
        figures.queued_rows = u64::from(plan.queued_rows);
        figures.backlog = Some(backlog);
        let timed = |f: fn(&Drained) -> Option<f64>| {
            median(&drains.iter().filter_map(f).collect::<Vec<_>>())
        };
        figures.queued_maintenance_pass_ms = timed(|d| d.maintenance_pass_ms);
        figures.queued_metrics_ms = timed(|d| d.metrics_ms);
    }
    if plan.redis_cluster {
        // No target rides on the cluster's figure: one pair.
        figures.redis_cluster = Some(at_scale(Backlog::Fresh, Topology::Cluster, 1).0);
    }

    // Latency at a fixed offered load, then at a higher one.
    let (jobs, p50, p99) = latency_at(&rt, &cluster, plan, plan.latency_rate);
    (figures.latency_jobs, figures.p50_ms, figures.p99_ms) = (jobs, p50, p99);
    if plan.latency_rate_high > 0 {
        let (_, p50, p99) = latency_at(&rt, &cluster, plan, plan.latency_rate_high);
        figures.latency_high = Some((plan.latency_rate_high, p50, p99));
    }
    if plan.delay_rate > 0 {
        let at = (plan.delay_rate, plan.latency_seconds, plan.delay_ms);
        figures.delays = Some(delays::lateness(&rt, &cluster, plan, at));
    }
    if plan.schedules > 0 {
        let at = (plan.schedules, plan.latency_seconds);
        figures.ticks = Some(delays::tick_lateness(&rt, &cluster, plan, at));
    }
    if plan.instructions_runs > 0 {
        figures.instructions_per_delivery = Some(
            instructions::per_delivery(&cluster, plan.instructions_runs)
                .unwrap_or_else(|e| panic!("counting the worker's instructions: {e}")),
        );
    }

    // Recovery after kill -9.
    {
        let db = Database::create_on(&cluster.admin_url());
        let url = db.url().to_owned();
        let mut env = Env::with_database(url, Some(db), None);
        // PELICAN_BENCH_TRACE=1 keeps the recovery run's traces and logs.
        env.trace = std::env::var_os("PELICAN_BENCH_TRACE").is_some();
        env.keep_logs = env.trace;
        if env.trace {
            eprintln!("bench: recovery logs and traces in {}", env.logs.display());
        }
        let plan = &BenchPlan {
            workers: plan.workers.max(2),
            ..plan.clone()
        };
        let mut workers = start_workers(&mut env, plan);
        let io = Arc::new(rt.block_on(clients(&env, 8)));
        let mut samples = Vec::new();
        for k in 0..plan.kills {
            let (victim, got) = rt.block_on(recovery(&io, &mut workers, 8));
            samples.extend(got);
            workers[victim] = start_worker(&mut env, plan, victim as u32 + 1);
            // The restarted worker joins the group before the next round.
            std::thread::sleep(Duration::from_millis(300));
            eprintln!(
                "bench: kill {}/{}: {} runs recovered so far",
                k + 1,
                plan.kills,
                samples.len()
            );
        }
        samples.sort_by(f64::total_cmp);
        let shown: Vec<String> = samples.iter().map(|s| format!("{s:.0}")).collect();
        eprintln!("bench: recovery times (ms): {}", shown.join(" "));
        figures.recovery_runs = samples.len() as u64;
        figures.recovery_p50_ms = quantile(&mut samples, 0.50);
        figures.recovery_p99_ms = quantile(&mut samples, 0.99);
        figures.recovery_max_ms = quantile(&mut samples, 1.0);
    }
    if plan.finished_rows > 0 {
        let (pass, metrics, count_all) = scale(&rt, &cluster, plan);
        figures.finished_rows = u64::from(plan.finished_rows);
        figures.maintenance_pass_ms = Some(pass);
        figures.metrics_ms = Some(metrics);
        figures.count_all_ms = Some(count_all);
    }
    drop(cluster);
    figures
}

/// Submission to the outcome seen in Postgres at `rate` runs/s for the
/// plan's `latency_seconds`, with the workers idle at the start: the runs
/// measured, the p50 and the p99 in ms.
fn latency_at(
    rt: &tokio::runtime::Runtime,
    cluster: &Cluster,
    plan: &BenchPlan,
    rate: u32,
) -> (u64, f64, f64) {
    let (env, _workers) = fresh_env(cluster, plan);
    let io = Arc::new(rt.block_on(clients(&env, 8)));
    let n = rate * plan.latency_seconds;
    eprintln!(
        "bench: latency at {rate} runs/s for {} s",
        plan.latency_seconds
    );
    // Warm up the workers' connections.
    rt.block_on(submit_many(&io, 20, 4, "noop", "{}"));
    std::thread::sleep(Duration::from_millis(500));
    let mut lat = rt.block_on(latency(&io, n, rate));
    let (p50, p99) = (quantile(&mut lat, 0.50), quantile(&mut lat, 0.99));
    eprintln!(
        "bench: latency at {rate} runs/s: p50 {p50:.1} ms, p99 {p99:.1} ms over {} runs",
        lat.len()
    );
    (lat.len() as u64, p50, p99)
}

/// [`STATEMENT_COSTS`], each on a database of its own, in rounds
/// (`cost_rounds`, at least three) so that a slow spell of the machine
/// falls on one value of each, not on all of one.
fn statement_costs(
    rt: &tokio::runtime::Runtime,
    cluster: &Cluster,
    plan: &BenchPlan,
) -> Vec<(&'static str, Vec<f64>)> {
    let mut costs: Vec<(&'static str, Vec<f64>)> = STATEMENT_COSTS
        .iter()
        .map(|(name, ..)| (*name, Vec::new()))
        .collect();
    for _ in 0..plan.cost_rounds.max(3) {
        for ((_, protocol, ablation), (name, us)) in STATEMENT_COSTS.iter().zip(&mut costs) {
            let db = Database::create_on(&cluster.admin_url());
            let cost = rt
                .block_on(baseline::statement_cost(
                    db.url(),
                    *protocol,
                    *ablation,
                    plan.statement_runs,
                    plan.batch_max,
                ))
                .unwrap_or_else(|e| panic!("timing the statements of {name}: {e}"));
            us.push(cost);
        }
    }
    for (name, us) in &costs {
        eprintln!(
            "bench: statements alone, {name}: {:.2} µs a run (median of {:.2?})",
            median(us).unwrap_or(f64::NAN),
            us
        );
    }
    costs
}

/// The scale figures (see the module's notes): the median maintenance
/// pass, `GET /metrics` and full count by status, in ms, with the plan's
/// `finished_rows` finished runs.
fn scale(rt: &tokio::runtime::Runtime, cluster: &Cluster, plan: &BenchPlan) -> (f64, f64, f64) {
    let rows = plan.finished_rows;
    let db = Database::create_on(&cluster.admin_url());
    let url = db.url().to_owned();
    let mut env = Env::with_database(url, Some(db), None);
    env.trace = false;
    let io = Arc::new(rt.block_on(clients(&env, 4)));
    finish_runs(rt, &mut env, &io, plan, rows);
    rt.block_on(submit_many(&io, 1_000, 16, "noop", "{}"));
    let pass = time_maintenance(rt, &io, 20);
    let metrics = time_metrics(&mut env, 20);
    let counts: Vec<f64> = (0..5)
        .map(|_| {
            let start = Instant::now();
            let counted = rt.block_on(io.db.execute(&DbOp::CountRuns));
            assert!(matches!(counted, Ok(DbReply::Counts(_))), "{counted:?}");
            start.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    let count_all = median(&counts).unwrap_or(f64::NAN);
    eprintln!(
        "bench: with {rows} finished runs: maintenance pass {pass:.2} ms, GET /metrics {metrics:.2} ms \
         (medians of 20); counting every run by status (pelican status) {count_all:.1} ms (median of 5)"
    );
    (pass, metrics, count_all)
}

/// Gives an empty database `rows` finished runs written the way Pelican
/// writes them: submitted with `pelican submit --from-file`, drained whole
/// by `pelican worker`s, then vacuumed. Later submissions take the ids after
/// them.
///
/// The rows' pages are then as the hot path leaves them. A run inserted in
/// its finished form instead (one `INSERT ... SELECT`) fills each page to
/// the fill factor with rows wider than a new run's, and leaves room for
/// one new run on nearly every page: the drain's runs then land one to a
/// page over the whole table, and its claims and outcomes dirty tens of
/// thousands of pages where they would dirty a few thousand.
fn finish_runs(
    rt: &tokio::runtime::Runtime,
    env: &mut Env,
    io: &Clients,
    plan: &BenchPlan,
    rows: u32,
) {
    eprintln!("bench: giving the database {rows} finished runs");
    let t = Instant::now();
    bulk_submit(env, rows);
    let workers = start_workers(env, plan);
    let _ = wait_drained(rt, env, io, Instant::now());
    drop(workers);
    rt.block_on(pelican_real::live::pg::raw_execute(
        &io.db,
        "VACUUM (ANALYZE) runs, attempts",
    ))
    .expect("vacuuming the finished runs");
    eprintln!(
        "bench: {rows} runs submitted, drained and vacuumed in {:.1} s",
        t.elapsed().as_secs_f64()
    );
}

/// Settles the database before a measurement, as a queue that filled up a
/// while ago would be: the writes' dead row versions vacuumed, statistics
/// current, and a checkpoint done, so that neither an autovacuum nor a
/// checkpoint's full-page writes land in the middle of the measurement by
/// chance (without this step, drains of one code ranged 13,500 to 19,800
/// jobs/s; with it, 17,100 to 18,600).
///
/// # Errors
/// A statement failed; the message names it.
pub async fn settle_database(db: &PgDb) -> Result<(), String> {
    for sql in ["VACUUM (ANALYZE) runs, attempts", "CHECKPOINT"] {
        pelican_real::live::pg::raw_execute(db, sql)
            .await
            .map_err(|e| format!("{sql}: {e}"))?;
    }
    Ok(())
}

/// Waits until every run has its outcome and the PEL is empty (at most 15
/// minutes from `start`); returns how long after `start` the first
/// delivery was seen pending (the drainers' start-up, as far as a 10 ms
/// poll tells it).
fn wait_drained(
    rt: &tokio::runtime::Runtime,
    env: &Env,
    io: &Clients,
    start: Instant,
) -> Option<Duration> {
    let mut first_delivery = None;
    loop {
        if first_delivery.is_none() && env.pel_len() > 0 {
            first_delivery = Some(start.elapsed());
        }
        // Redis first (cheap); count the runs (a table scan) only once the
        // stream is drained.
        if env.stream_drained() && rt.block_on(open_runs(&io.db)) == 0 {
            return first_delivery;
        }
        assert!(
            start.elapsed() < Duration::from_secs(900),
            "the drain did not finish in 15 minutes"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The median of `n` maintenance passes (retries, outbox, sweep, retention,
/// as `pelican worker` runs them, each from a fresh sweeper cursor), ms.
fn time_maintenance(rt: &tokio::runtime::Runtime, io: &Arc<Clients>, n: usize) -> f64 {
    use pelican_model::protocol::{Maintenance, MaintenanceTask};
    let passes: Vec<f64> = (0..n)
        .map(|_| {
            let mut m = Maintenance::new(&io.config.policy);
            let start = Instant::now();
            for task in [
                MaintenanceTask::Retries,
                MaintenanceTask::Outbox,
                MaintenanceTask::Sweep,
                MaintenanceTask::Retention,
            ] {
                rt.block_on(pelican_real::maintain(
                    io,
                    pelican_model::ids::WorkerId(1),
                    &mut m,
                    task,
                ));
            }
            start.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    median(&passes).unwrap_or(f64::NAN)
}

/// The median of `n` `GET /metrics` of a `pelican api` started for them, ms.
fn time_metrics(env: &mut Env, n: usize) -> f64 {
    let (_api, base) = env.api("bench");
    let scrapes: Vec<f64> = (0..n)
        .map(|_| {
            let start = Instant::now();
            let mut resp = ureq::get(format!("{base}/metrics"))
                .header("Authorization", "Bearer bench")
                .call()
                .expect("GET /metrics");
            let _ = resp.body_mut().read_to_string().expect("metrics text");
            start.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    median(&scrapes).unwrap_or(f64::NAN)
}

/// Times `pelican submit --from-file` of `n` no-op lines into an empty
/// database, checks that it stored every line, and answers runs per
/// second.
fn submit_from_file(cluster: &Cluster, n: u32) -> f64 {
    let db = Database::create_on(&cluster.admin_url());
    let url = db.url().to_owned();
    let mut env = Env::with_database(url, Some(db), None);
    env.trace = false;
    let seconds = bulk_submit(&env, n);
    eprintln!(
        "bench: submitted from a file in {seconds:.2} s ({:.0}/s)",
        f64::from(n) / seconds
    );
    f64::from(n) / seconds
}

/// `pelican submit --from-file` of `n` no-op lines, each input its own;
/// checks that every line was stored and answers the command's seconds
/// (process start and file included).
fn bulk_submit(env: &Env, n: u32) -> f64 {
    use std::fmt::Write as _;
    let mut text = String::with_capacity(n as usize * 40);
    for i in 0..n {
        let _ = writeln!(text, r#"{{"kind":"noop","input":{{"i":{i}}}}}"#);
    }
    let path = std::env::temp_dir().join(format!("pelican-bench-{}.jsonl", std::process::id()));
    std::fs::write(&path, text).expect("the bench writes its lines");
    eprintln!("bench: pelican submit --from-file of {n} lines");
    let t = Instant::now();
    let out = env.cli(&["--json", "submit", "--from-file", &path.to_string_lossy()]);
    let seconds = t.elapsed().as_secs_f64();
    let _ = std::fs::remove_file(&path);
    assert!(
        out.status.success(),
        "pelican submit --from-file failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("it prints JSON");
    assert_eq!(v["accepted"], n, "every line stored: {v}");
    seconds
}

/// What a drain starts from.
#[derive(Clone, Copy, Debug)]
enum Backlog {
    /// `drain_jobs` runs submitted one per call into empty tables.
    Fresh,
    /// The same, beside this many finished runs (see [`finish_runs`]).
    Finished(u32),
    /// This many runs submitted in bulk and drained whole; the maintenance
    /// pass and `GET /metrics` are timed with them queued.
    Queued(u32),
}

/// One drain's figures.
#[derive(Debug)]
struct Drained {
    /// Runs drained.
    jobs: u32,
    /// Seconds of their submission.
    submit_s: f64,
    /// From the workers' start to every outcome and an empty PEL.
    drain_s: f64,
    /// The largest peak resident set among the worker processes, KiB.
    peak_rss_kib: Option<u64>,
    /// Each process's CPU time over the drain, µs per run.
    cpu: cpu::PerRun,
    /// What the drain asked of Redis and Postgres, per run.
    work: work::Work,
    /// With a queued backlog: the median maintenance pass, ms.
    maintenance_pass_ms: Option<f64>,
    /// With a queued backlog: the median `GET /metrics`, ms.
    metrics_ms: Option<f64>,
}

impl Drained {
    fn jobs_per_s(&self) -> f64 {
        f64::from(self.jobs) / self.drain_s
    }
}

/// Which Redis a drain runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Topology {
    /// One `redis-server` (AOF everysec).
    Server,
    /// A Redis Cluster: three masters, a replica each.
    Cluster,
}

/// Submits the runs `backlog` says, then starts the workers (with
/// `--batch-max batch_max`) and waits until every run has its outcome and
/// the PEL is empty. `baseline`: the [`baseline`] drains with that
/// protocol instead of `pelican worker`s.
fn drain(
    rt: &tokio::runtime::Runtime,
    cluster: &Cluster,
    plan: &BenchPlan,
    batch_max: u32,
    baseline: Option<Protocol>,
    backlog: Backlog,
    redis: Topology,
) -> Drained {
    assert!(
        !(baseline.is_some() && redis == Topology::Cluster),
        "the baseline drains one server"
    );
    let db = Database::create_on(&cluster.admin_url());
    let url = db.url().to_owned();
    let redis_service = match redis {
        Topology::Server => Redis::start(),
        Topology::Cluster => Redis::cluster(),
    };
    let mut env = Env::with_services(url, Some(db), redis_service, None);
    env.trace = false;
    if redis == Topology::Server {
        env.partitions = plan.partitions;
    }
    let io = Arc::new(rt.block_on(clients(&env, 16)));
    if let Backlog::Finished(rows) = backlog {
        finish_runs(rt, &mut env, &io, plan, rows);
    }
    let (jobs, submit) = match backlog {
        Backlog::Fresh | Backlog::Finished(_) => {
            eprintln!(
                "bench: submitting {} no-op runs ({} at a time)",
                plan.drain_jobs, plan.submit_concurrency
            );
            let t = Instant::now();
            rt.block_on(submit_many(
                &io,
                plan.drain_jobs,
                plan.submit_concurrency,
                "noop",
                "{}",
            ));
            (plan.drain_jobs, t.elapsed().as_secs_f64())
        }
        Backlog::Queued(rows) => (rows, bulk_submit(&env, rows)),
    };
    rt.block_on(settle_database(&io.db))
        .unwrap_or_else(|e| panic!("settling the database: {e}"));
    let (maintenance_pass_ms, metrics_ms) = match backlog {
        Backlog::Queued(rows) => {
            let pass = time_maintenance(rt, &io, 10);
            let metrics = time_metrics(&mut env, 10);
            eprintln!(
                "bench: with {rows} queued runs: maintenance pass {pass:.2} ms, GET /metrics {metrics:.2} ms (medians of 10)"
            );
            (Some(pass), Some(metrics))
        }
        Backlog::Fresh | Backlog::Finished(_) => (None, None),
    };
    eprintln!(
        "bench: submitted {jobs} in {submit:.1} s ({:.0}/s), vacuumed; draining with {} worker process(es), batches of at most {batch_max}, {}{}{}",
        f64::from(jobs) / submit,
        plan.workers,
        match redis {
            Topology::Server => "",
            Topology::Cluster => "through a Redis Cluster of three masters (a partition on each), ",
        },
        baseline.map_or("the shipped protocol", Protocol::name),
        match backlog {
            Backlog::Fresh => String::new(),
            Backlog::Finished(rows) => format!(", beside {rows} finished runs"),
            Backlog::Queued(_) => ", the whole backlog".to_owned(),
        }
    );
    let postmaster = cluster.postmaster_pid();
    let redis_pids = env.redis.pids();
    let sample = |workers: &[Proc]| cpu::Sample {
        workers: workers.iter().map(|w| cpu::process(w.pid())).sum(),
        bench: cpu::process(std::process::id()),
        postgres: postmaster.map_or(0.0, cpu::tree),
        redis: redis_pids.iter().copied().map(cpu::process).sum(),
    };
    let tally_before = work::tally(rt, &env.redis, &io.db);
    let before = sample(&[]);
    let t = Instant::now();
    let _baseline = baseline.map(|protocol| {
        let redis_url = env.redis.url();
        let to = baseline::Target {
            redis_url: &redis_url,
            stream: &format!("{}:jobs", env.stream),
            group: "pelican",
            database_url: &env.database_url,
        };
        baseline::start(rt, &to, plan.in_flight * plan.workers, batch_max, protocol)
    });
    let worker_plan = BenchPlan {
        batch_max,
        ..plan.clone()
    };
    let workers: Vec<Proc> = (1..=plan.workers)
        .filter(|_| baseline.is_none())
        .map(|w| start_worker(&mut env, &worker_plan, w))
        .collect();
    let first_delivery = wait_drained(rt, &env, &io, t);
    let drain_s = t.elapsed().as_secs_f64();
    let cpu = cpu::PerRun::between(before, sample(&workers), jobs);
    let work = work::Work::between(&tally_before, &work::tally(rt, &env.redis, &io.db), jobs);
    let peak_rss_kib = workers.iter().filter_map(Proc::peak_rss_kib).max();
    eprintln!(
        "bench: drained in {drain_s:.2} s: {:.0} jobs/s (first delivery pending after {}){}",
        f64::from(jobs) / drain_s,
        first_delivery.map_or_else(|| "-".to_owned(), |d| format!("{} ms", d.as_millis())),
        peak_rss_kib.map_or_else(String::new, |k| format!(
            "; worker peak RSS {:.1} MiB",
            k as f64 / 1024.0
        ))
    );
    eprintln!(
        "bench: {cpu}: {:.2} cores busy",
        cpu.total() * f64::from(jobs) / 1e6 / drain_s
    );
    eprintln!("bench: servers' work per run:{work}");
    drop(workers);
    Drained {
        jobs,
        submit_s: submit,
        drain_s,
        peak_rss_kib,
        cpu,
        work,
        maintenance_pass_ms,
        metrics_ms,
    }
}

/// Submits `n` no-op runs at `rate` per second while a poller watches
/// Postgres; returns each run's latency in milliseconds.
async fn latency(io: &Arc<Clients>, n: u32, rate: u32) -> Vec<f64> {
    type Started = Arc<std::sync::Mutex<BTreeMap<i64, Instant>>>;
    let started: Started = Arc::default();
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs_f64(f64::from(n) / f64::from(rate) + 60.0);
    let poller = {
        let (io, started) = (Arc::clone(io), Arc::clone(&started));
        tokio::spawn(async move {
            let mut done: BTreeMap<i64, f64> = BTreeMap::new();
            while done.len() < n as usize && Instant::now() < deadline {
                let pending: Vec<(i64, Instant)> = {
                    let s = started.lock().expect("not poisoned");
                    s.iter()
                        .filter(|(r, _)| !done.contains_key(r))
                        .map(|(r, at)| (*r, *at))
                        .collect()
                };
                if !pending.is_empty() {
                    let ids: Vec<i64> = pending.iter().map(|(r, _)| *r).collect();
                    let seen = statuses(&io.db, &ids).await;
                    let now = Instant::now();
                    for (run, at) in pending {
                        if seen.get(&run).map(String::as_str) == Some(RunStatus::Succeeded.as_str())
                        {
                            done.insert(run, now.duration_since(at).as_secs_f64() * 1000.0);
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            done
        })
    };
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..n {
        let due = t0 + Duration::from_secs_f64(f64::from(i) / f64::from(rate));
        tokio::time::sleep_until(due.into()).await;
        let (io, started) = (Arc::clone(io), Arc::clone(&started));
        tasks.spawn(async move {
            // The clock starts before the submission; the poller looks for
            // the run once it is known (a run already finished by then is
            // seen at its next poll).
            let at = Instant::now();
            let run = submit_new(&io, "noop", "{}").await;
            let id = i64::try_from(run.0).expect("run ids fit in bigint");
            started.lock().expect("not poisoned").insert(id, at);
        });
        while let Some(r) = tasks.try_join_next() {
            r.expect("a submission does not panic");
        }
    }
    while let Some(r) = tasks.join_next().await {
        r.expect("a submission does not panic");
    }
    let done = poller.await.expect("the poller does not panic");
    assert_eq!(
        done.len(),
        n as usize,
        "every latency run finishes within a minute"
    );
    done.into_values().collect()
}

/// One recovery round: starts `runs` sleep runs, waits until all are
/// running, kills -9 the worker holding the most, and returns the index of
/// the killed worker and, for each run it held, the milliseconds from the
/// kill until the run succeeded.
async fn recovery(io: &Arc<Clients>, workers: &mut [Proc], runs: u32) -> (usize, Vec<f64>) {
    let mut ids = Vec::new();
    for _ in 0..runs {
        let run = submit_new(io, "sleep", r#"{"ms":300}"#).await;
        ids.push(i64::try_from(run.0).expect("run ids fit in bigint"));
    }
    let t = Instant::now();
    loop {
        let s = statuses(&io.db, &ids).await;
        if s.len() == ids.len() && s.values().all(|st| st == "running") {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the recovery runs did not all start: {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // An observation query of the bench, not a protocol statement.
    let holders: Vec<(i64, String)> =
        sqlx::query_as("SELECT run_id, worker FROM attempts WHERE run_id = ANY($1)")
            .bind(&ids)
            .fetch_all(io.db.pool())
            .await
            .expect("the attempts are readable");
    let mut by_worker: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for (run, w) in holders {
        by_worker.entry(w).or_default().push(run);
    }
    let (name, held) = by_worker
        .into_iter()
        .max_by_key(|(_, r)| r.len())
        .expect("someone holds the runs");
    let victim = name
        .trim_start_matches('w')
        .parse::<usize>()
        .expect("worker names are w<N>")
        - 1;
    workers[victim].kill9();
    let killed = Instant::now();
    let mut done: BTreeMap<i64, f64> = BTreeMap::new();
    while done.len() < held.len() {
        let now = Instant::now();
        for (run, st) in statuses(&io.db, &held).await {
            if st == RunStatus::Succeeded.as_str() {
                done.entry(run)
                    .or_insert_with(|| now.duration_since(killed).as_secs_f64() * 1000.0);
            }
        }
        assert!(
            killed.elapsed() < Duration::from_secs(60),
            "runs of a killed worker not recovered within a minute"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // Let the other runs finish so that the next round starts idle.
    loop {
        let s = statuses(&io.db, &ids).await;
        if s.values().all(|st| st == "succeeded") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (victim, done.into_values().collect())
}

#[cfg(test)]
mod tests {
    use super::{LiveFigures, Protocol, ScaleDrain, median};

    #[test]
    fn the_cost_compares_medians() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0]), Some(2.5));
        let f = LiveFigures {
            shipped_drains: vec![60_000.0, 62_000.0],
            unguarded_drains: vec![70_000.0, 90_000.0],
            ..LiveFigures::default()
        };
        assert_eq!(f.unguarded_jobs_per_s(), Some(80_000.0));
        let cost = f.guarantees_cost_pct().expect("both measured");
        assert!((cost - 23.75).abs() < 1e-9, "{cost}");
        assert_eq!(LiveFigures::default().guarantees_cost_pct(), None);
    }

    #[test]
    fn the_statements_alone_report_their_medians_by_name() {
        let f = LiveFigures {
            statement_costs: vec![
                ("unfenced", vec![7.0, 6.0, 9.0]),
                ("fenced_floor", vec![10.0]),
            ],
            ..LiveFigures::default()
        };
        let json = f.json();
        assert_eq!(json["pg_us_per_run"]["unfenced"], 7.0);
        assert_eq!(json["pg_us_per_run"]["fenced_floor"], 10.0);
        assert_eq!(json["pg_us_per_run_rounds"]["unfenced"][2], 9.0);
        assert!(LiveFigures::default().json().get("pg_us_per_run").is_none());
    }

    #[test]
    fn each_drainer_reports_its_cpu_medians_by_name() {
        let split = |postgres| super::cpu::PerRun {
            workers: 10.0,
            bench: 0.5,
            postgres,
            redis: 4.0,
        };
        let mut f = LiveFigures::default();
        assert!(f.json().get("cpu_us_per_run").is_none());
        super::push_named(&mut f.drain_cpu, "shipped", split(18.0));
        super::push_named(&mut f.drain_cpu, "unfenced", split(7.0));
        super::push_named(&mut f.drain_cpu, "shipped", split(20.0));
        super::push_named(&mut f.drain_cpu, "shipped", split(19.0));
        let json = f.json();
        assert_eq!(json["cpu_us_per_run"]["shipped"]["postgres"], 19.0);
        assert_eq!(json["cpu_us_per_run"]["shipped"]["total"], 33.5);
        assert_eq!(json["cpu_us_per_run"]["unfenced"]["postgres"], 7.0);
        assert_eq!(super::report_key(Protocol::Fenced), "fenced_floor");
        assert!(json.get("work_per_run").is_none());
        let xack = |calls| super::work::Work {
            redis: vec![super::work::Line {
                name: "XACK".into(),
                calls,
                us: 1.0,
            }],
            postgres: vec![],
        };
        super::push_named(&mut f.drain_work, "shipped", xack(1.0));
        super::push_named(&mut f.drain_work, "unfenced", xack(0.002));
        super::push_named(&mut f.drain_work, "shipped", xack(3.0));
        let json = f.json();
        assert_eq!(
            json["work_per_run"]["shipped"]["redis"]["XACK"]["calls"],
            2.0
        );
        assert_eq!(
            json["work_per_run"]["unfenced"]["redis"]["XACK"]["calls"],
            0.002
        );
    }

    #[test]
    fn the_fenced_floor_splits_the_cost() {
        let f = LiveFigures {
            shipped_drains: vec![50_000.0, 70_000.0],
            fenced_floor_drains: vec![100_000.0, 80_000.0, 90_000.0],
            unguarded_drains: vec![120_000.0],
            ..LiveFigures::default()
        };
        let close = |x: Option<f64>, want: f64| (x.expect("measured") - want).abs() < 1e-9;
        assert!(close(f.fencing_floor_cost_pct(), 25.0));
        assert!(close(f.beyond_floor_cost_pct(), 100.0 / 3.0));
        assert!(close(f.guarantees_cost_pct(), 50.0));
        assert!(close(f.drain_floor_ratio(), 2.0 / 3.0));
        let json = f.json();
        assert_eq!(json["live_jobs_per_s_fenced_floor"], 90_000.0);
        assert_eq!(json["fencing_floor_cost_pct"], 25.0);
        assert_eq!(json["drain_floor_ratio"], 0.667);
        let unfloored = LiveFigures {
            fenced_floor_drains: Vec::new(),
            ..f
        };
        assert_eq!(unfloored.fencing_floor_cost_pct(), None);
        assert_eq!(unfloored.beyond_floor_cost_pct(), None);
        assert_eq!(unfloored.drain_floor_ratio(), None);
    }

    #[test]
    fn the_cpu_yardstick_compares_every_process_with_the_floors() {
        let split = |workers, postgres| super::cpu::PerRun {
            workers,
            bench: 1.0,
            postgres,
            redis: 3.0,
        };
        let mut f = LiveFigures::default();
        super::push_named(&mut f.drain_cpu, "shipped", split(20.0, 22.0));
        assert_eq!(f.cpu_floor_ratio(), None, "no floor drained");
        super::push_named(&mut f.drain_cpu, "fenced_floor", split(0.0, 12.0));
        super::push_named(&mut f.drain_cpu, "fenced_floor", split(0.0, 14.0));
        super::push_named(&mut f.drain_cpu, "fenced_floor", split(0.0, 8.0));
        // 46 µs against the floor's median total, 16.
        let ratio = f.cpu_floor_ratio().expect("both drained");
        assert!((ratio - 46.0 / 16.0).abs() < 1e-9, "{ratio}");
        assert_eq!(f.json()["cpu_floor_ratio"], 2.875);
    }

    #[test]
    fn a_drain_at_scale_is_compared_with_its_pair() {
        let d = ScaleDrain {
            // The second pair ran in a slow spell: its own pair was slow too.
            pairs: vec![
                (40_000.0, 36_000.0),
                (20_000.0, 22_000.0),
                (40_000.0, 38_000.0),
            ],
            peak_rss_kib: None,
        };
        let slowdowns = d.slowdowns_pct();
        assert!((slowdowns[0] - 10.0).abs() < 1e-9 && (slowdowns[1] + 10.0).abs() < 1e-9);
        assert!((d.slowdown_pct().expect("measured") - 5.0).abs() < 1e-9);
        assert_eq!(d.pair_jobs_per_s(), Some(40_000.0));
        assert_eq!(d.jobs_per_s(), Some(36_000.0));
        assert_eq!(ScaleDrain::default().slowdown_pct(), None);
        let figures = LiveFigures {
            beside_finished: Some(d),
            ..LiveFigures::default()
        };
        let json = figures.json();
        assert_eq!(json["slowdown_pct_1m_finished"], 5.0);
        assert_eq!(
            json["slowdowns_pct_1m_finished"],
            serde_json::json!([10.0, -10.0, 5.0])
        );
        assert!(json["slowdown_pct_1m_queued"].is_null(), "not measured");
    }
}
