//! `pelican-bench`: the live part of `cargo xtask bench` (drain, latency,
//! recovery; see `pelican_tests::bench`), and the report that joins it with
//! the model checker's and the simulator's figures.
#![allow(
    clippy::too_many_lines,
    reason = "a scenario, bench or check reads top to bottom as one script"
)]

use clap::Parser;
use pelican_tests::bench::steady::{self, SteadyPlan};
use pelican_tests::bench::{BenchPlan, run};
use serde_json::{Value, json};
use std::process::ExitCode;

/// The live figures the summary carries, under their own names.
const SUMMARY_LIVE_KEYS: [&str; 40] = [
    "live_jobs_per_s",
    "submit_from_file_per_s",
    "submit_api_per_s",
    "submit_api_to_cli_ratio",
    "live_jobs_per_s_unbatched",
    "otlp_drains_off",
    "otlp_drains_on",
    "live_jobs_per_s_unguarded",
    "guarantees_cost_pct",
    "live_jobs_per_s_fenced_floor",
    "fencing_floor_cost_pct",
    "beyond_floor_cost_pct",
    "drain_floor_ratio",
    "cpu_floor_ratio",
    "instructions_per_delivery",
    "pg_us_per_run",
    "cpu_us_per_run",
    "live_p50_ms",
    "live_p99_ms",
    "latency_rate_high",
    "live_p50_ms_high",
    "live_p99_ms_high",
    "delay_start_late_p50_ms",
    "delay_start_late_p99_ms",
    "tick_start_late_p50_ms",
    "tick_start_late_p99_ms",
    "recovery_p50_ms",
    "recovery_p99_ms",
    "maintenance_pass_ms_1m_finished",
    "metrics_ms_1m_finished",
    "live_jobs_per_s_1m_finished",
    "slowdown_pct_1m_finished",
    "live_jobs_per_s_1m_queued",
    "slowdown_pct_1m_queued",
    "maintenance_pass_ms_1m_queued",
    "metrics_ms_1m_queued",
    "worker_peak_rss_mib",
    "worker_peak_rss_mib_1m_finished",
    "worker_peak_rss_mib_1m_queued",
    "live_jobs_per_s_redis_cluster_3_masters",
];

/// Live benchmarks of Pelican against throwaway Redis and Postgres.
#[derive(Debug, Parser)]
#[command(name = "pelican-bench")]
struct Args {
    /// No-op runs in the drain.
    #[arg(long, default_value_t = BenchPlan::default().drain_jobs, value_parser = clap::value_parser!(u32).range(1..))]
    jobs: u32,
    /// Worker processes (the recovery run starts at least two).
    #[arg(long, default_value_t = BenchPlan::default().workers, value_parser = clap::value_parser!(u32).range(1..=64))]
    workers: u32,
    /// Each worker's --in-flight-max.
    #[arg(long, default_value_t = BenchPlan::default().in_flight, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    in_flight: u32,
    /// Offered load of the latency run, runs per second.
    #[arg(long, default_value_t = BenchPlan::default().latency_rate, value_parser = clap::value_parser!(u32).range(1..))]
    latency_rate: u32,
    /// Offered load of the second latency run, runs per second (0: skip it).
    #[arg(long, default_value_t = BenchPlan::default().latency_rate_high)]
    latency_rate_high: u32,
    /// Runs behind the worker's instructions per delivery: drains of this
    /// many and three times as many under valgrind (0: skip them).
    #[arg(long, default_value_t = BenchPlan::default().instructions_runs)]
    instructions_runs: u32,
    /// Delayed runs a second, as long as the latency run, to measure how
    /// late they start after their due time (0: skip them).
    #[arg(long, default_value_t = BenchPlan::default().delay_rate)]
    delay_rate: u32,
    /// Schedules every second, as long as the latency run, to measure how
    /// late their ticks' runs start (0: skip them).
    #[arg(long, default_value_t = BenchPlan::default().schedules)]
    schedules: u32,
    /// Seconds of the latency run.
    #[arg(long, default_value_t = BenchPlan::default().latency_seconds, value_parser = clap::value_parser!(u32).range(1..))]
    latency_seconds: u32,
    /// Workers killed in the recovery run.
    #[arg(long, default_value_t = BenchPlan::default().kills, value_parser = clap::value_parser!(u32).range(1..))]
    kills: u32,
    /// The workers' --reclaim-min-idle-ms (how soon a reclaim pass looks at
    /// a silent delivery; the lease still decides whether it is taken).
    #[arg(long, default_value_t = BenchPlan::default().reclaim_min_idle_ms)]
    reclaim_min_idle_ms: u64,
    /// The workers' --batch-max.
    #[arg(long, default_value_t = BenchPlan::default().batch_max, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    batch_max: u32,
    /// Skip the second drain with --batch-max 1.
    #[arg(long)]
    no_unbatched: bool,
    /// Pairs of drains with span export off and on (0: none).
    #[arg(long, default_value_t = BenchPlan::default().otlp_rounds)]
    otlp_rounds: u32,
    /// Skip the baselines' drains (the least protocols that still drain,
    /// unfenced and fenced, which price the guarantees).
    #[arg(long)]
    no_baseline: bool,
    /// Rounds of drains behind the cost of the guarantees: shipped; then
    /// in the baseline's loop, its statements, the fenced floor and the
    /// unfenced baseline. Their medians are compared.
    #[arg(long, default_value_t = BenchPlan::default().cost_rounds, value_parser = clap::value_parser!(u32).range(1..=20))]
    cost_rounds: u32,
    /// Pairs (small table, at scale) behind each drain at scale: 1M
    /// finished runs and the 1M backlog; the median of their slowdowns is
    /// reported.
    #[arg(long, default_value_t = BenchPlan::default().scale_rounds, value_parser = clap::value_parser!(u32).range(1..=20))]
    scale_rounds: u32,
    /// Finished runs (submitted and drained by Pelican first) for the
    /// scale figures and the drain beside them (0: skip both).
    #[arg(long, default_value_t = BenchPlan::default().finished_rows)]
    finished_rows: u32,
    /// Queued runs of the backlog drain (0: skip it).
    #[arg(long, default_value_t = BenchPlan::default().queued_rows)]
    queued_rows: u32,
    /// Skip the drain through a Redis Cluster of three masters.
    #[arg(long)]
    no_redis_cluster: bool,
    /// Job stream partitions of the drains on one server (the cluster's
    /// drain has one per master).
    #[arg(long, default_value_t = BenchPlan::default().partitions, value_parser = clap::value_parser!(u16).range(1..=1024))]
    partitions: u16,
    /// Runs behind each timing of the drainers' statements alone, on one
    /// connection without Redis or a worker (0: skip them; they are timed
    /// only with the baselines).
    #[arg(long, default_value_t = BenchPlan::default().statement_runs)]
    statement_runs: u32,
    /// Runs behind the steady-state figures: retention against the drain,
    /// and a wiped backlog's recovery (0: skip every steady-state figure).
    #[arg(long, default_value_t = 1_000_000)]
    steady_runs: u32,
    /// Events streams open on one API in the watchers' figure.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(1..=18_000))]
    watchers: u32,
    /// Measure the steady-state figures alone (no drains, latency or
    /// recovery).
    #[arg(long)]
    steady_only: bool,
    /// The steady-state soak's JSON line (`pelican-soak --json`), to join
    /// into the report.
    #[arg(long)]
    soak_json: Option<String>,
    /// The model checker's JSON line, to join into the report.
    #[arg(long)]
    model_json: Option<String>,
    /// The model checker's JSON line for `standard_steps`, the larger
    /// configuration, to join into the report.
    #[arg(long)]
    model_steps_json: Option<String>,
    /// The simulator's JSON line, to join into the report.
    #[arg(long)]
    sim_json: Option<String>,
    /// Write the full report here (JSON).
    #[arg(long)]
    report: Option<std::path::PathBuf>,
    /// Print the summary as JSON on the last stdout line.
    #[arg(long)]
    json: bool,
}

fn parse(what: &str, text: Option<&str>) -> Result<Value, String> {
    match text {
        None => Ok(Value::Null),
        Some(t) => serde_json::from_str(t).map_err(|e| format!("--{what}-json is not JSON: {e}")),
    }
}

fn main() -> ExitCode {
    let a = Args::parse();
    let (model, model_steps, sim) = match (
        parse("model", a.model_json.as_deref()),
        parse("model-steps", a.model_steps_json.as_deref()),
        parse("sim", a.sim_json.as_deref()),
    ) {
        (Ok(m), Ok(ms), Ok(s)) => (m, ms, s),
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => {
            eprintln!("pelican-bench: {e}");
            return ExitCode::from(2);
        }
    };
    let plan = BenchPlan {
        drain_jobs: a.jobs,
        workers: a.workers,
        in_flight: a.in_flight,
        latency_rate: a.latency_rate,
        latency_rate_high: a.latency_rate_high,
        instructions_runs: a.instructions_runs,
        latency_seconds: a.latency_seconds,
        kills: a.kills,
        reclaim_min_idle_ms: a.reclaim_min_idle_ms,
        batch_max: a.batch_max,
        compare_unbatched: !a.no_unbatched,
        otlp_rounds: a.otlp_rounds,
        baseline: !a.no_baseline,
        cost_rounds: a.cost_rounds,
        scale_rounds: a.scale_rounds,
        finished_rows: a.finished_rows,
        queued_rows: a.queued_rows,
        redis_cluster: !a.no_redis_cluster,
        partitions: a.partitions,
        statement_runs: a.statement_runs,
        delay_rate: a.delay_rate,
        schedules: a.schedules,
        ..BenchPlan::default()
    };
    let soak = match parse("soak", a.soak_json.as_deref()) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("pelican-bench: {e}");
            return ExitCode::from(2);
        }
    };
    let steady_plan = SteadyPlan {
        runs: a.steady_runs,
        watchers: a.watchers,
        in_flight: a.in_flight,
        batch_max: a.batch_max,
    };
    if a.steady_only {
        let steady = steady::run(&steady_plan);
        println!("{steady}");
        return ExitCode::SUCCESS;
    }
    let live = run(&plan).json();
    let steady = if a.steady_runs > 0 {
        steady::run(&steady_plan)
    } else {
        Value::Null
    };
    let mut summary = json!({
        "model_seconds": model["seconds"],
        "model_unique_states": model["unique_states"],
        "model_states_per_s": model["states_per_s"].as_f64().map(f64::round),
        "model_standard_steps_seconds": model_steps["seconds"],
        "model_standard_steps_unique_states": model_steps["unique_states"],
        "model_standard_steps_states_per_s": model_steps["states_per_s"].as_f64().map(f64::round),
        "sim_seeds_per_s": sim["seeds_per_s"].as_f64().map(f64::round),
    });
    for key in SUMMARY_LIVE_KEYS {
        summary[key] = live[key].clone();
    }
    for part in [&steady, &soak] {
        if let (Some(into), Some(from)) = (summary.as_object_mut(), part.as_object()) {
            into.extend(from.clone());
        }
    }
    let target = |key: &str, ok: bool, goal: &str| {
        let v = &summary[key];
        let mark = if v.is_null() {
            "not measured"
        } else if ok {
            "met"
        } else {
            "NOT met"
        };
        eprintln!(
            "  {key:<22} {:>14}   target {goal:<14} {mark}",
            v.to_string()
        );
    };
    let num = |key: &str| summary[key].as_f64();
    eprintln!(
        "\nbench: {} no-op runs drained by {} worker process{} ({} in flight each); latency at {} runs/s; {} kills",
        plan.drain_jobs,
        plan.workers,
        if plan.workers == 1 { "" } else { "es" },
        plan.in_flight,
        plan.latency_rate,
        plan.kills
    );
    target(
        "model_seconds",
        num("model_seconds").is_some_and(|s| s <= 30.0),
        "<= 30",
    );
    eprintln!(
        "  {:<22} {:>14}",
        "model_unique_states",
        summary["model_unique_states"].to_string()
    );
    eprintln!(
        "  {:<22} {:>14}",
        "model_states_per_s",
        summary["model_states_per_s"].to_string()
    );
    target(
        "model_standard_steps_seconds",
        num("model_standard_steps_seconds").is_some_and(|s| s <= 600.0),
        "<= 600",
    );
    eprintln!(
        "  {:<32} {:>10}   ({} unique states)",
        "model_standard_steps_states_per_s",
        summary["model_standard_steps_states_per_s"].to_string(),
        summary["model_standard_steps_unique_states"]
    );
    target(
        "sim_seeds_per_s",
        num("sim_seeds_per_s").is_some_and(|s| s >= 500.0),
        ">= 500",
    );
    target(
        "live_jobs_per_s",
        num("live_jobs_per_s").is_some_and(|s| s >= 50_000.0),
        ">= 50,000",
    );
    eprintln!(
        "  {:<22} {:>14}   (each claim and completion on its own: --batch-max 1)",
        "live_jobs_unbatched",
        live["live_jobs_per_s_unbatched"].to_string()
    );
    eprintln!(
        "  {:<22} {:>14}   (span export off, then on: --otlp-endpoint)",
        "live_jobs_otlp",
        format!("{} / {}", live["otlp_drains_off"], live["otlp_drains_on"])
    );
    eprintln!(
        "  {:<22} {:>14}   (the least protocol that still drains: tests/src/bench/baseline.rs)",
        "live_jobs_unguarded",
        live["live_jobs_per_s_unguarded"].to_string()
    );
    eprintln!(
        "  {:<22} {:>14}   (shipped drains {}, baseline drains {} jobs/s)",
        "guarantees_cost_pct",
        live["guarantees_cost_pct"].to_string(),
        live["cost_drains_shipped"],
        live["cost_drains_unguarded"]
    );
    eprintln!(
        "  {:<22} {:>14}   (Pelican's claim and success statements in the baseline's loop: drains {} jobs/s)",
        "live_jobs_statements",
        live["live_jobs_per_s_shipped_statements"].to_string(),
        live["cost_drains_shipped_statements"]
    );
    eprintln!(
        "  {:<22} {:>14}   (a durable claim under a new fence and a fenced outcome, both HOT: drains {} jobs/s)",
        "live_jobs_fenced_floor",
        live["live_jobs_per_s_fenced_floor"].to_string(),
        live["cost_drains_fenced_floor"]
    );
    eprintln!(
        "  {:<22} {:>14}   (the floor below the baseline: the least any protocol keeping S3 costs; the shipped protocol costs {}% beyond it)",
        "fencing_floor_cost_pct",
        live["fencing_floor_cost_pct"].to_string(),
        live["beyond_floor_cost_pct"]
    );
    target(
        "drain_floor_ratio",
        num("drain_floor_ratio").is_some_and(|r| r >= 0.65),
        ">= 0.65",
    );
    target(
        "cpu_floor_ratio",
        num("cpu_floor_ratio").is_some_and(|r| r <= 1.5),
        "<= 1.5",
    );
    target(
        "instructions_per_delivery",
        num("instructions_per_delivery").is_some_and(|i| i <= 25_000.0),
        "<= 25,000",
    );
    if let Some(costs) = live["pg_us_per_run"].as_object() {
        for (name, us) in costs {
            eprintln!(
                "  {:<22} {:>14}   (µs of Postgres a run, statements alone on one session: {name})",
                "pg_us_per_run",
                us.to_string()
            );
        }
    }
    if let Some(drains) = live["cpu_us_per_run"].as_object() {
        for (name, split) in drains {
            eprintln!(
                "  {:<22} {:>14}   (CPU µs a run in the drains, {name}: workers {}, bench {}, Postgres {}, Redis {})",
                "cpu_us_per_run",
                split["total"].to_string(),
                split["workers"],
                split["bench"],
                split["postgres"],
                split["redis"]
            );
        }
    }
    target(
        "submit_from_file_per_s",
        num("submit_from_file_per_s").is_some_and(|r| r >= 50_000.0),
        ">= 50,000",
    );
    target(
        "submit_api_to_cli_ratio",
        num("submit_api_to_cli_ratio").is_some_and(|r| r >= 0.8),
        ">= 0.8",
    );
    eprintln!(
        "  {:<22} {:>14}   (POST /runs, arrays of {}, {} in flight)",
        "submit_api_per_s",
        summary["submit_api_per_s"].to_string(),
        pelican_tests::bench::submission::PER_REQUEST,
        pelican_tests::bench::submission::CLIENTS
    );
    eprintln!(
        "  {:<22} {:>14}   (submit path, one run per call: {} runs/s)",
        "live_p50_ms",
        summary["live_p50_ms"].to_string(),
        live["submit_per_s"]
    );
    target(
        "live_p99_ms",
        num("live_p99_ms").is_some_and(|ms| ms <= 10.0),
        "<= 10",
    );
    eprintln!(
        "  {:<22} {:>14}   (at {} runs/s; p50 {})",
        "live_p99_ms_high",
        summary["live_p99_ms_high"].to_string(),
        summary["latency_rate_high"],
        summary["live_p50_ms_high"]
    );
    eprintln!(
        "  {:<22} {:>14}   (p50 {}; {} runs delayed 1 s, started after their due time)",
        "delay_start_late_p99_ms",
        summary["delay_start_late_p99_ms"].to_string(),
        summary["delay_start_late_p50_ms"],
        live["delay_runs"]
    );
    eprintln!(
        "  {:<22} {:>14}   (p50 {}; {} ticks' runs of schedules every second, after their tick)",
        "tick_start_late_p99_ms",
        summary["tick_start_late_p99_ms"].to_string(),
        summary["tick_start_late_p50_ms"],
        live["tick_runs"]
    );
    eprintln!(
        "  {:<22} {:>14}   ({} runs, slowest {} ms)",
        "recovery_p50_ms",
        summary["recovery_p50_ms"].to_string(),
        live["recovery_runs"],
        live["recovery_max_ms"]
    );
    target(
        "recovery_p99_ms",
        num("recovery_p99_ms").is_some_and(|s| s <= 3000.0),
        "<= 3000",
    );
    for key in ["maintenance_pass_ms_1m_finished", "metrics_ms_1m_finished"] {
        target(key, num(key).is_some_and(|s| s < 10.0), "< 10");
    }
    eprintln!(
        "  {:<32} {:>8}   (every run counted, as `pelican status` does: a scan)",
        "count_all_ms_1m_finished",
        live["count_all_ms_1m_finished"].to_string()
    );
    eprintln!(
        "  {:<22} {:>14}   (beside {} finished runs; its small-table pair {})",
        "live_jobs_per_s_1m_finished",
        summary["live_jobs_per_s_1m_finished"].to_string(),
        live["finished_rows"],
        live["live_jobs_per_s_1m_finished_pair"]
    );
    eprintln!(
        "  {:<22} {:>14}   ({} queued runs drained whole; its small-table pair {})",
        "live_jobs_per_s_1m_queued",
        summary["live_jobs_per_s_1m_queued"].to_string(),
        live["queued_rows"],
        live["live_jobs_per_s_1m_queued_pair"]
    );
    for key in ["slowdown_pct_1m_finished", "slowdown_pct_1m_queued"] {
        target(key, num(key).is_some_and(|s| s <= 10.0), "<= 10");
    }
    for key in ["maintenance_pass_ms_1m_queued", "metrics_ms_1m_queued"] {
        target(key, num(key).is_some_and(|s| s < 10.0), "< 10");
    }
    eprintln!(
        "  {:<22} {:>14}   (3 partitions over 3 masters; on one server {})",
        "live_jobs_per_s_redis_cluster_3_masters",
        summary["live_jobs_per_s_redis_cluster_3_masters"].to_string(),
        live["live_jobs_per_s_redis_cluster_3_masters_pair"]
    );
    for (key, what) in [
        ("worker_peak_rss_mib", "the headline drain"),
        (
            "worker_peak_rss_mib_1m_finished",
            "beside the finished runs",
        ),
        ("worker_peak_rss_mib_1m_queued", "the backlog"),
    ] {
        eprintln!(
            "  {key:<32} {:>8}   (a worker's peak resident set, {what})",
            live[key].to_string()
        );
    }
    print_steady(&summary);
    if let Some(path) = &a.report {
        let full = json!({ "summary": summary, "model": model, "model_standard_steps": model_steps, "sim": sim, "live": live });
        let text = serde_json::to_string_pretty(&full).expect("JSON prints");
        if let Err(e) = std::fs::write(path, text) {
            eprintln!("pelican-bench: cannot write {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
        eprintln!("bench: report written to {}", path.display());
    }
    if a.json {
        println!("{summary}");
    }
    ExitCode::SUCCESS
}

/// The steady-state figures against their targets: retention deletes at
/// least as fast as a worker drains; a wiped backlog is back in the stream
/// within 2 minutes; Postgres's commits do not grow with the watchers.
fn print_steady(summary: &Value) {
    let num = |key: &str| summary[key].as_f64();
    let line = |key: &str, goal: String, ok: Option<bool>| {
        let mark = match ok {
            None => "not measured",
            Some(true) => "met",
            Some(false) => "NOT met",
        };
        eprintln!(
            "  {key:<32} {:>10}   target {goal:<22} {mark}",
            summary[key].to_string()
        );
    };
    let drain = num("retention_drain_per_s");
    line(
        "retention_deletes_per_s",
        format!(">= {} (the drain)", drain.unwrap_or(f64::NAN)),
        num("retention_deletes_per_s")
            .zip(drain)
            .map(|(d, r)| d >= r),
    );
    line(
        "wipe_back_in_stream_s",
        format!("<= 120 ({} runs)", summary["steady_runs"]),
        num("wipe_back_in_stream_s").map(|s| s <= 120.0),
    );
    for key in ["outbox_published_per_s", "retries_promoted_per_s"] {
        line(
            key,
            ">= 20000 (submissions a second)".to_owned(),
            num(key).map(|n| n >= 20_000.0),
        );
    }
    let idle = num("pg_commits_per_s_0_watchers");
    line(
        "pg_commits_per_s_watched",
        format!("~ {} (none open)", idle.unwrap_or(f64::NAN)),
        num("pg_commits_per_s_watched")
            .zip(idle)
            .map(|(w, i)| w <= i * 1.2 + 20.0),
    );
    for key in [
        "wipe_all_run_s",
        "api_rss_mib_watched",
        "soak_wipe_recovery_s",
    ] {
        eprintln!("  {key:<32} {:>10}", summary[key].to_string());
    }
}
