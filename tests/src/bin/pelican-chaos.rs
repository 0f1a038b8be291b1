//! `pelican-chaos`: the chaos soak on live services (`cargo xtask chaos`).
//! A real API and real workers (the `pelican` binary named by
//! `PELICAN_BIN`) against a throwaway Redis and a throwaway Postgres
//! cluster, a seeded nemesis, and the guarantees checked at the end. See
//! `pelican_tests::chaos`.
#![allow(
    clippy::too_many_lines,
    reason = "a scenario, bench or check reads top to bottom as one script"
)]

use clap::Parser;
use pelican_tests::chaos::{Plan, run_and_print};
use std::process::ExitCode;

/// The chaos soak: real processes, real Redis and Postgres, everything
/// going wrong at once; then S1–S10 and the protocol traces are checked.
#[derive(Debug, Parser)]
#[command(name = "pelican-chaos")]
struct Args {
    /// Runs submitted through the API.
    #[arg(long, default_value_t = Plan::default().jobs, value_parser = clap::value_parser!(u32).range(1..))]
    jobs: u32,
    /// Worker processes.
    #[arg(long, default_value_t = Plan::default().workers, value_parser = clap::value_parser!(u32).range(1..=64))]
    workers: u32,
    /// Seconds of faults (submissions are spread over them).
    #[arg(long, default_value_t = Plan::default().seconds, value_parser = clap::value_parser!(u32).range(10..))]
    seconds: u32,
    /// The nemesis's and the workload's seed.
    #[arg(long, default_value_t = Plan::default().seed)]
    seed: u64,
    /// Attempts per run.
    #[arg(long, default_value_t = Plan::default().attempts_max, value_parser = clap::value_parser!(u32).range(1..=100))]
    attempts_max: u32,
    /// Seconds to wait for quiescence after healing.
    #[arg(long, default_value_t = Plan::default().settle_seconds)]
    settle_seconds: u32,
    /// Run every process with this mutant (needs a `pelican` built with the
    /// `mutants` feature; the soak must then fail).
    #[arg(long)]
    mutant: Option<String>,
    /// The short run of `cargo xtask test` (2,000 jobs, 3 workers, 35 s;
    /// with `--redis-cluster`, 1,000 jobs and 30 s); other flags given
    /// override it.
    #[arg(long)]
    short: bool,
    /// Run against a throwaway Redis Cluster (three masters with a replica
    /// each), killing the job stream's master instead of restarting and
    /// wiping Redis.
    #[arg(long)]
    redis_cluster: bool,
    /// Print the summary as JSON on the last stdout line.
    #[arg(long)]
    json: bool,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let given =
        |name: &str| std::env::args().any(|a| a == name || a.starts_with(&format!("{name}=")));
    let base = match (args.short, args.redis_cluster) {
        (true, true) => Plan::short_cluster(),
        (true, false) => Plan::short(),
        (false, cluster) => Plan {
            redis_cluster: cluster,
            ..Plan::default()
        },
    };
    let plan = Plan {
        jobs: if given("--jobs") {
            args.jobs
        } else {
            base.jobs
        },
        workers: if given("--workers") {
            args.workers
        } else {
            base.workers
        },
        seconds: if given("--seconds") {
            args.seconds
        } else {
            base.seconds
        },
        seed: if given("--seed") {
            args.seed
        } else {
            base.seed
        },
        attempts_max: args.attempts_max,
        settle_seconds: args.settle_seconds,
        mutant: args.mutant,
        redis_cluster: args.redis_cluster,
    };
    let result = run_and_print(&plan, args.quiet);
    let report = match &result {
        Ok(r) => r,
        Err(r) => r,
    };
    if args.json {
        println!("{}", report.json());
    }
    if result.is_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
