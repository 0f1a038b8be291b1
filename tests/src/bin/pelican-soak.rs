//! `pelican-soak`: the steady-state soak on live services (`cargo xtask
//! soak`). A real API and real workers (the `pelican` binary named by
//! `PELICAN_BIN`) against a throwaway Redis and Postgres at a steady rate,
//! with kills and a wipe; every series it samples must stay flat. See
//! `pelican_tests::soak`.
#![allow(
    clippy::too_many_lines,
    reason = "a scenario, bench or check reads top to bottom as one script"
)]

use clap::Parser;
use pelican_tests::soak::{Plan, Report, run};
use std::process::ExitCode;

/// The steady-state soak: the whole system at a steady rate for minutes,
/// housekeeping and recovery keeping pace with it.
#[derive(Debug, Parser)]
#[command(name = "pelican-soak")]
struct Args {
    /// The twenty-minute form (`cargo xtask bench`); without it, the
    /// two-minute form of `cargo xtask test`.
    #[arg(long)]
    long: bool,
    /// Seconds of steady load, instead of the form's.
    #[arg(long, value_parser = clap::value_parser!(u32).range(30..))]
    seconds: Option<u32>,
    /// Runs submitted a second, instead of the form's.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=5_000))]
    rate: Option<u32>,
    /// Where to write the report (JSON, with every sample).
    #[arg(long, default_value = "target/soak/report.json")]
    report: std::path::PathBuf,
    /// Print the summary as JSON on the last stdout line.
    #[arg(long)]
    json: bool,
    /// Draw the series as PNGs in DIR (with gnuplot).
    #[arg(long, value_name = "DIR")]
    plots: Option<std::path::PathBuf>,
    /// Run no soak: draw the samples of the report at PATH into --plots.
    #[arg(long, value_name = "PATH", requires = "plots")]
    plot_from: Option<std::path::PathBuf>,
}

/// Draws `samples` into `dir`, saying what it wrote.
fn draw(samples: &[pelican_tests::soak::Sample], wipe_s: f64, dir: &std::path::Path) -> bool {
    match pelican_tests::soak::plot(samples, wipe_s, dir) {
        Ok(files) => {
            for f in files {
                eprintln!("soak: drew {}", f.display());
            }
            true
        }
        Err(e) => {
            eprintln!("soak: {e}");
            false
        }
    }
}

/// `--plot-from`: the samples and the wipe's time of a written report.
fn redraw(path: &std::path::Path, dir: &std::path::Path) -> ExitCode {
    let read = std::fs::read_to_string(path)
        .map_err(|e| e.to_string())
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).map_err(|e| e.to_string()));
    let report = match read {
        Ok(r) => r,
        Err(e) => {
            eprintln!("soak: {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    };
    let samples: Vec<pelican_tests::soak::Sample> =
        serde_json::from_value(report["samples"].clone()).unwrap_or_default();
    let wipe_s = report["wipe_at_s"].as_f64().unwrap_or(0.0);
    if draw(&samples, wipe_s, dir) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let (Some(from), Some(dir)) = (&args.plot_from, &args.plots) {
        return redraw(from, dir);
    }
    let base = if args.long {
        Plan::long()
    } else {
        Plan::short()
    };
    let plan = Plan {
        seconds: args.seconds.unwrap_or(base.seconds),
        rate_per_s: args.rate.unwrap_or(base.rate_per_s),
        ..base
    };
    eprintln!(
        "soak: {} s at {} runs/s, {} workers, {} watchers, keep {} ms; a worker killed every {} s, the API every {} s, Redis wiped at {} s",
        plan.seconds,
        plan.rate_per_s,
        plan.workers,
        plan.watchers,
        plan.keep_finished_ms,
        plan.worker_kill_every_s,
        plan.api_kill_every_s,
        plan.seconds / 2
    );
    let report = run(&plan, &|line| eprintln!("soak: {line}"));
    eprint!("{}", table(&report));
    if let Some(dir) = args.report.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let text = serde_json::to_string_pretty(&report).expect("the report serializes");
    if let Err(e) = std::fs::write(&args.report, text) {
        eprintln!("soak: cannot write {}: {e}", args.report.display());
    }
    if let Some(dir) = &args.plots {
        draw(&report.samples, report.wipe_at_s, dir);
    }
    if args.json {
        println!(
            "{}",
            serde_json::to_string(&summary(&report)).expect("JSON")
        );
    }
    if report.passed() {
        eprintln!("soak: PASSED");
        ExitCode::SUCCESS
    } else {
        eprintln!("soak: FAILED");
        for f in &report.failures {
            eprintln!("  {f}");
        }
        ExitCode::FAILURE
    }
}

/// Each series' mean over the first, middle and last third of the samples.
fn table(r: &Report) -> String {
    use std::fmt::Write as _;
    let n = r.samples.len();
    let (a, b) = (n / 3, 2 * n / 3);
    let names: std::collections::BTreeSet<&String> =
        r.samples.iter().flat_map(|s| s.values.keys()).collect();
    let mean = |range: &[pelican_tests::soak::Sample], name: &str| {
        let xs: Vec<f64> = range
            .iter()
            .filter_map(|s| s.values.get(name).copied())
            .collect();
        if xs.is_empty() {
            f64::NAN
        } else {
            xs.iter().sum::<f64>() / xs.len() as f64
        }
    };
    let mut out = format!(
        "{:<28} {:>12} {:>12} {:>12}\n",
        "series (mean by third)", "first", "middle", "last"
    );
    for name in names {
        let _ = writeln!(
            out,
            "{name:<28} {:>12.1} {:>12.1} {:>12.1}",
            mean(&r.samples[..a], name),
            mean(&r.samples[a..b], name),
            mean(&r.samples[b..], name)
        );
    }
    let _ = writeln!(
        out,
        "runs accepted {}, deleted by retention after they finished {}; kills: {} workers, {} API; answers {:?}",
        r.accepted, r.retired, r.kills.0, r.kills.1, r.statuses
    );
    let _ = writeln!(
        out,
        "Redis wiped at {:.0} s with {} runs unfinished: recovered in {}",
        r.wipe_at_s,
        r.wipe_backlog,
        r.wipe_recovery_s
            .map_or("(not recovered)".to_owned(), |s| format!("{s:.1} s"))
    );
    out
}

/// The figures `cargo xtask bench` keeps.
fn summary(r: &Report) -> serde_json::Value {
    let last = |name: &str| {
        r.samples
            .iter()
            .rev()
            .find_map(|s| s.values.get(name).copied())
    };
    serde_json::json!({
        "soak_passed": r.passed(),
        "soak_accepted": r.accepted,
        "soak_wipe_backlog": r.wipe_backlog,
        "soak_wipe_recovery_s": r.wipe_recovery_s,
        "soak_runs_rows_last": last("pg.rows.runs"),
        "soak_submit_p99_ms_last": last("submit_ms.p99"),
        "soak_watch_lag_p99_ms_last": last("watch_lag_ms.p99"),
    })
}
