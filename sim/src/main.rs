// Over 600 lines: the CLI's subcommands, each with the report it prints.
//! `pelican-sim`: sweep seeds, replay one, check the saved traces, check
//! determinism. Run it through `cargo xtask sim` / `cargo xtask replay`,
//! which build it with `--cfg madsim` in their own target directory.

#[cfg(not(madsim))]
fn main() -> std::process::ExitCode {
    eprintln!(
        "pelican-sim must be built with RUSTFLAGS=\"--cfg madsim\"; run it as `cargo xtask sim` or `cargo xtask replay`"
    );
    std::process::ExitCode::from(2)
}

#[cfg(madsim)]
fn main() -> std::process::ExitCode {
    cli::main()
}

#[cfg(madsim)]
mod cli {
    use clap::{Parser, Subcommand};
    use indicatif::{ProgressBar, ProgressStyle};
    use pelican_model::protocol::Mutant;
    use pelican_sim::trace::{Event, Trace};
    use pelican_sim::{Scenario, SeedOutcome, run_seed};
    use std::collections::BTreeMap;
    use std::ops::Range;
    use std::path::{Path, PathBuf};
    use std::process::ExitCode;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, mpsc};
    use std::time::Instant;

    /// Deterministic simulation of Pelican under madsim.
    #[derive(Parser)]
    #[command(name = "pelican-sim", version)]
    struct Cli {
        #[command(subcommand)]
        command: Cmd,
    }

    #[derive(Subcommand)]
    enum Cmd {
        /// Run a range of seeds in parallel and summarise.
        Sweep {
            /// Seeds to run, `A..B` (B excluded).
            #[arg(long, default_value = "0..1000", value_parser = parse_range)]
            seeds: Range<u64>,
            /// Scenario: standard, calm, crashy, redis-loss, busy (default:
            /// standard; with `--mutant all`, each mutant's own,
            /// `Scenario::home_of`).
            #[arg(long)]
            scenario: Option<String>,
            /// Inject a mutant (NAME, or `all` for each in turn; needs the
            /// `mutants` feature).
            #[arg(long)]
            mutant: Option<String>,
            /// Print a JSON summary as the last line.
            #[arg(long)]
            json: bool,
            /// Worker threads (default: every core).
            #[arg(long)]
            threads: Option<usize>,
            /// Where failing seeds are written (default: traces/ for the
            /// correct build, target/sim-traces/ for mutants).
            #[arg(long)]
            traces: Option<PathBuf>,
            /// Stop at the first failure.
            #[arg(long)]
            fail_fast: bool,
            /// Fail unless every interesting event happened at least once.
            #[arg(long)]
            require_events: bool,
        },
        /// Re-run one seed (or a trace file) and print its timeline.
        Replay {
            /// A seed, or a trace file.
            target: String,
            /// Scenario (for a seed).
            #[arg(long, default_value = "standard")]
            scenario: String,
            /// Mutant (for a seed).
            #[arg(long)]
            mutant: Option<String>,
        },
        /// Replay every trace in a directory: a trace of the correct build
        /// must now pass (the bug stays fixed); a mutant's must still fail.
        CheckTraces {
            /// The directory.
            #[arg(default_value = "traces")]
            dir: PathBuf,
        },
        /// Run seeds twice and fail on any difference in their events.
        Determinism {
            /// Seeds, `A..B`.
            #[arg(long, default_value = "0..20", value_parser = parse_range)]
            seeds: Range<u64>,
            /// Scenario.
            #[arg(long, default_value = "standard")]
            scenario: String,
        },
    }

    fn parse_range(s: &str) -> Result<Range<u64>, String> {
        let (a, b) = s
            .split_once("..")
            .ok_or_else(|| format!("{s:?} is not a range like 0..1000"))?;
        let a: u64 = a.parse().map_err(|_| format!("{a:?} is not a seed"))?;
        let b: u64 = b.parse().map_err(|_| format!("{b:?} is not a seed"))?;
        if a >= b {
            return Err(format!("empty range {s}"));
        }
        Ok(a..b)
    }

    fn parse_mutant(name: &str) -> Result<Mutant, String> {
        let m: Mutant = name.parse().map_err(|e| format!("{e}"))?;
        if !cfg!(feature = "mutants") {
            return Err(format!(
                "mutant {m} needs the `mutants` feature (cargo xtask sim --mutant builds it)"
            ));
        }
        Ok(m)
    }

    pub fn main() -> ExitCode {
        pelican_sim::quiet_job_panics();
        let cli = Cli::parse();
        let result = match cli.command {
            Cmd::Sweep {
                seeds,
                scenario,
                mutant,
                json,
                threads,
                traces,
                fail_fast,
                require_events,
            } => sweep(
                seeds,
                scenario.as_deref(),
                mutant.as_deref(),
                json,
                threads,
                traces,
                fail_fast,
                require_events,
            ),
            Cmd::Replay {
                target,
                scenario,
                mutant,
            } => replay(&target, &scenario, mutant.as_deref()),
            Cmd::CheckTraces { dir } => check_traces(&dir),
            Cmd::Determinism { seeds, scenario } => determinism(seeds, &scenario),
        };
        match result {
            Ok(code) => code,
            Err(e) => {
                eprintln!("pelican-sim: {e}");
                ExitCode::from(2)
            }
        }
    }

    fn threads(n: Option<usize>) -> usize {
        n.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from))
            .max(1)
    }

    /// Runs `seeds` on `threads` threads, calling `each` with every outcome
    /// as it arrives. With `stop_at_failure`, seeds above the lowest failing
    /// one are not started.
    fn run_parallel(
        seeds: Range<u64>,
        scenario: &Scenario,
        mutant: Option<Mutant>,
        threads: usize,
        stop_at_failure: bool,
        mut each: impl FnMut(SeedOutcome),
    ) {
        let next = Arc::new(AtomicU64::new(seeds.start));
        let limit = Arc::new(AtomicU64::new(seeds.end));
        let (tx, rx) = mpsc::channel();
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                let (next, limit, tx, sc) =
                    (next.clone(), limit.clone(), tx.clone(), scenario.clone());
                std::thread::spawn(move || {
                    loop {
                        let seed = next.fetch_add(1, Ordering::Relaxed);
                        if seed >= limit.load(Ordering::Relaxed) {
                            return;
                        }
                        let outcome = run_seed(seed, &sc, mutant, false);
                        if stop_at_failure && !outcome.passed() {
                            limit.fetch_min(seed + 1, Ordering::Relaxed);
                        }
                        if tx.send(outcome).is_err() {
                            return;
                        }
                    }
                })
            })
            .collect();
        drop(tx);
        for outcome in rx {
            each(outcome);
        }
        for h in handles {
            h.join()
                .expect("sweep threads do not panic: run_seed catches");
        }
    }

    fn bar(len: u64, label: &str) -> ProgressBar {
        let pb = ProgressBar::new(len);
        pb.set_style(
            ProgressStyle::with_template(
                "{prefix:>12} [{elapsed_precise}] {bar:30} {pos}/{len} seeds {per_sec} {msg}",
            )
            .expect("a valid template"),
        );
        pb.set_prefix(label.to_owned());
        pb
    }

    fn git_commit() -> String {
        std::process::Command::new("git")
            .args(["rev-parse", "--short", "HEAD"])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map_or_else(
                || "unknown".into(),
                |o| String::from_utf8_lossy(&o.stdout).trim().to_owned(),
            )
    }

    fn describe(outcome: &SeedOutcome) -> Vec<String> {
        outcome.broken.iter().map(ToString::to_string).collect()
    }

    /// Re-runs a failing seed with its log and writes its trace.
    fn save_trace(
        seed: u64,
        scenario: &Scenario,
        mutant: Option<Mutant>,
        dir: &Path,
    ) -> Result<(PathBuf, bool), String> {
        let outcome = run_seed(seed, scenario, mutant, true);
        let trace = Trace {
            seed,
            scenario: scenario.name.clone(),
            configuration: scenario.clone(),
            mutant: mutant.map(|m| m.name().to_owned()),
            commit: git_commit(),
            broken: describe(&outcome),
            digest: outcome.digest,
            events: outcome
                .log
                .unwrap_or_default()
                .into_iter()
                .map(|l| Event {
                    t_ms: l.t_ms,
                    node: l.node,
                    event: l.event,
                })
                .collect(),
        };
        let path = trace.write(dir)?;
        Ok((path, !outcome.broken.is_empty()))
    }

    #[allow(clippy::too_many_arguments)]
    fn sweep(
        seeds: Range<u64>,
        scenario: Option<&str>,
        mutant: Option<&str>,
        json: bool,
        threads_n: Option<usize>,
        traces: Option<PathBuf>,
        fail_fast: bool,
        require_events: bool,
    ) -> Result<ExitCode, String> {
        let threads = threads(threads_n);
        let started = Instant::now();
        let chosen = scenario.map(Scenario::named).transpose()?;
        if mutant == Some("all") {
            return sweep_mutants(seeds, chosen.as_ref(), json, threads, traces, started);
        }
        let sc = chosen.unwrap_or_else(Scenario::standard);
        let mutant = mutant.map(parse_mutant).transpose()?;
        let dir = traces.unwrap_or_else(|| default_traces(mutant));
        let pb = bar(seeds.end - seeds.start, &sc.name);
        let mut events: BTreeMap<String, u64> = BTreeMap::new();
        let mut failures: Vec<SeedOutcome> = Vec::new();
        let mut ran = 0u64;
        run_parallel(seeds.clone(), &sc, mutant, threads, fail_fast, |o| {
            ran += 1;
            for (k, v) in &o.counters {
                *events.entry(k.clone()).or_insert(0) += v;
            }
            if !o.passed() {
                pb.println(format!(
                    "seed {} FAILED: {}",
                    o.seed,
                    describe(&o).join("; ")
                ));
                failures.push(o);
            }
            pb.inc(1);
        });
        pb.finish_and_clear();
        let seconds = started.elapsed().as_secs_f64();
        failures.sort_by_key(|o| o.seed);
        for f in &failures {
            let (path, reproduced) = save_trace(f.seed, &sc, mutant, &dir)?;
            let m = mutant.map(|m| format!(" --mutant {m}")).unwrap_or_default();
            println!(
                "FAILED seed {} [{}]: reproduce with `cargo xtask replay {} --scenario {}{m}` (trace: {}{})",
                f.seed,
                describe(f).first().cloned().unwrap_or_default(),
                f.seed,
                sc.name,
                path.display(),
                if reproduced {
                    ""
                } else {
                    "; NOT reproduced on re-run: nondeterminism"
                }
            );
        }
        print_summary(ran, failures.len(), seconds, &events);
        let missing: Vec<&str> = INTERESTING
            .iter()
            .copied()
            .filter(|k| events.get(*k).copied().unwrap_or(0) == 0)
            .collect();
        if require_events && !missing.is_empty() {
            println!("never happened: {}", missing.join(", "));
        }
        if json {
            let v = serde_json::json!({
                "seeds": ran,
                "failures": failures.len(),
                "failing_seeds": failures.iter().map(|f| f.seed).collect::<Vec<_>>(),
                "seconds": seconds,
                "seeds_per_s": ran as f64 / seconds,
                "events": events,
            });
            println!("{v}");
        }
        Ok(
            if failures.is_empty() && (!require_events || missing.is_empty()) {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            },
        )
    }

    fn default_traces(mutant: Option<Mutant>) -> PathBuf {
        if mutant.is_some() {
            PathBuf::from("target/sim-traces")
        } else {
            PathBuf::from("traces")
        }
    }

    fn sweep_mutants(
        seeds: Range<u64>,
        chosen: Option<&Scenario>,
        json: bool,
        threads: usize,
        traces: Option<PathBuf>,
        started: Instant,
    ) -> Result<ExitCode, String> {
        if !cfg!(feature = "mutants") {
            return Err("--mutant all needs the `mutants` feature".into());
        }
        let dir = traces.unwrap_or_else(|| default_traces(Some(Mutant::ALL[0])));
        let mut report = serde_json::Map::new();
        let mut caught_all = true;
        let mut ran = 0u64;
        for &m in Mutant::ALL {
            let home = Scenario::home_of(m);
            let sc = chosen.unwrap_or(&home);
            let pb = bar(seeds.end - seeds.start, m.name());
            let mut first: Option<SeedOutcome> = None;
            run_parallel(seeds.clone(), sc, Some(m), threads, true, |o| {
                ran += 1;
                if !o.passed() && first.as_ref().is_none_or(|f| o.seed < f.seed) {
                    first = Some(o);
                }
                pb.inc(1);
            });
            pb.finish_and_clear();
            match &first {
                Some(f) => {
                    let (path, _) = save_trace(f.seed, sc, Some(m), &dir)?;
                    println!(
                        "{:<18} caught at seed {:>5}: {} (cargo xtask replay {} --scenario {} --mutant {m}; {})",
                        m.name(),
                        f.seed,
                        describe(f).first().cloned().unwrap_or_default(),
                        f.seed,
                        sc.name,
                        path.display()
                    );
                }
                None => {
                    caught_all = false;
                    println!("{:<18} NOT caught in seeds {seeds:?}", m.name());
                }
            }
            report.insert(
                m.name().to_owned(),
                serde_json::json!({
                    "caught": first.is_some(),
                    "first_failing_seed": first.as_ref().map(|f| f.seed),
                }),
            );
        }
        let seconds = started.elapsed().as_secs_f64();
        println!(
            "mutants: {}/{} caught, {ran} seeds in {seconds:.1} s",
            report.values().filter(|v| v["caught"] == true).count(),
            Mutant::ALL.len()
        );
        if json {
            let caught = report.values().filter(|v| v["caught"] == true).count();
            let v = serde_json::json!({
                "seeds": ran,
                "failures": caught,
                "seconds": seconds,
                "seeds_per_s": ran as f64 / seconds,
                "events": {},
                "mutants": report,
            });
            println!("{v}");
        }
        Ok(if caught_all {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        })
    }

    /// The events every long sweep must see (`--require-events`).
    const INTERESTING: [&str; 16] = [
        "batches",
        "reclaims",
        "late_writes_rejected",
        "retries",
        "dead_letters",
        "cancel_races",
        "trimmed_recoveries",
        "redis_losses_survived",
        "ledgers_replayed",
        "step_records_refused",
        "unknown_capped",
        "budgets_exhausted",
        "attempt_timeouts",
        "slot_waits",
        "token_waits",
        "event_logs_followed",
    ];

    fn print_summary(ran: u64, failures: usize, seconds: f64, events: &BTreeMap<String, u64>) {
        println!(
            "{ran} seeds, {failures} failed, {seconds:.1} s, {:.0} seeds/s",
            ran as f64 / seconds
        );
        for key in INTERESTING {
            println!("  {key:<24} {:>10}", events.get(key).copied().unwrap_or(0));
        }
        let rest: Vec<String> = events.iter().map(|(k, v)| format!("{k}={v}")).collect();
        println!("  all events: {}", rest.join(" "));
    }

    fn print_timeline(outcome: &SeedOutcome) {
        for l in outcome.log.iter().flatten() {
            println!("{:>8} ms  {:<16} {}", l.t_ms, l.node, l.event);
        }
    }

    fn replay(target: &str, scenario: &str, mutant: Option<&str>) -> Result<ExitCode, String> {
        let (seed, sc, m, expected) = if let Ok(seed) = target.parse::<u64>() {
            (
                seed,
                Scenario::named(scenario)?,
                mutant.map(parse_mutant).transpose()?,
                None,
            )
        } else {
            let t = Trace::read(Path::new(target))?;
            let m = t.mutant.as_deref().map(parse_mutant).transpose()?;
            (t.seed, Scenario::named(&t.scenario)?, m, Some(t))
        };
        let outcome = run_seed(seed, &sc, m, true);
        print_timeline(&outcome);
        println!("---");
        println!(
            "seed {seed}, scenario {}, mutant {}: {}",
            sc.name,
            m.map_or("none".to_owned(), |m| m.name().to_owned()),
            if outcome.passed() {
                "passed".to_owned()
            } else {
                format!("FAILED: {}", describe(&outcome).join("; "))
            }
        );
        let counters: Vec<String> = outcome
            .counters
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        println!("events: {}", counters.join(" "));
        if let Some(t) = expected {
            if t.digest == outcome.digest {
                println!(
                    "the same {} events as the trace (digest {:016x})",
                    t.events.len(),
                    t.digest
                );
            } else {
                println!(
                    "differs from the trace (digest {:016x}, trace {:016x}): the code changed since commit {}",
                    outcome.digest, t.digest, t.commit
                );
            }
        }
        Ok(if outcome.passed() {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        })
    }

    fn check_traces(dir: &Path) -> Result<ExitCode, String> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(|e| format!("{}: {e}", dir.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        files.sort();
        let mut bad = 0;
        for path in &files {
            let t = Trace::read(path)?;
            let sc = Scenario::named(&t.scenario)?;
            let (m, want_fail) = match t.mutant.as_deref() {
                None => (None, false),
                Some(name) if cfg!(feature = "mutants") => (Some(parse_mutant(name)?), true),
                Some(_) => {
                    // A mutant's trace replays on the correct build too: the
                    // correct protocol must pass that schedule's seed.
                    (None, false)
                }
            };
            let outcome = run_seed(t.seed, &sc, m, false);
            let ok = outcome.passed() != want_fail;
            if !ok {
                bad += 1;
            }
            println!(
                "{} {}: {}{}",
                if ok { "ok  " } else { "FAIL" },
                path.display(),
                if outcome.passed() {
                    "passes".to_owned()
                } else {
                    format!("fails: {}", describe(&outcome).join("; "))
                },
                if m.is_some() {
                    " (mutant, must fail)"
                } else {
                    " (must pass)"
                }
            );
        }
        println!("{} traces, {bad} wrong", files.len());
        Ok(if bad == 0 {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        })
    }

    fn determinism(seeds: Range<u64>, scenario: &str) -> Result<ExitCode, String> {
        let sc = Scenario::named(scenario)?;
        let mut bad = 0;
        let n = seeds.end - seeds.start;
        for seed in seeds {
            let a = run_seed(seed, &sc, None, false);
            let b = run_seed(seed, &sc, None, false);
            if a.digest != b.digest || a.counters != b.counters {
                bad += 1;
                println!(
                    "seed {seed}: NOT deterministic (digests {:016x} / {:016x})",
                    a.digest, b.digest
                );
            }
        }
        println!("{n} seeds run twice, {bad} differed");
        Ok(if bad == 0 {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        })
    }
}
