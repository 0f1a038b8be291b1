//! `pelican-check`: model-check Pelican's protocol (run it through
//! `cargo xtask check`, which picks the build with or without mutants).

use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use pelican_checker::report::{self, Options, Report, Verdict};
use pelican_checker::{Config, PelicanModel};
use pelican_model::protocol::Mutant;
use std::process::ExitCode;
use std::sync::OnceLock;
use std::time::Duration;

/// Model-check Pelican's recovery protocol with stateright.
#[derive(Parser, Debug)]
#[command(name = "pelican-check")]
struct Args {
    /// The configuration to check.
    #[arg(
        long,
        default_value = "standard",
        value_parser = clap::builder::PossibleValuesParser::new(Config::NAMES)
    )]
    config: String,
    /// A mutant to inject (needs the `mutants` feature), or `all`.
    #[arg(long)]
    mutant: Option<String>,
    /// Print one JSON object as the last line of stdout.
    #[arg(long)]
    json: bool,
    /// Serve stateright's Explorer instead of checking.
    #[arg(long)]
    explore: bool,
    /// Explorer address.
    #[arg(long, default_value = "127.0.0.1:3000")]
    address: String,
    /// Checker threads (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Give up after this many seconds (the result is then incomplete).
    #[arg(long)]
    timeout_s: Option<u64>,
    /// Override fault budgets, e.g. `none,crashes=1,total=1`.
    #[arg(long)]
    faults: Option<String>,
    /// Do not show progress.
    #[arg(long)]
    quiet: bool,
    /// Search breadth first (shortest counterexamples, more memory).
    #[arg(long)]
    bfs: bool,
    /// Check without the symmetry reduction over workers (every verdict is
    /// the same, with about twice the states).
    #[arg(long)]
    no_symmetry: bool,
}

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

static BAR: OnceLock<ProgressBar> = OnceLock::new();

fn progress(unique: usize, total: usize, depth: usize, elapsed: Duration) {
    if let Some(bar) = BAR.get() {
        let rate = unique as f64 / elapsed.as_secs_f64().max(1e-9);
        bar.set_message(format!(
            "{unique} unique states ({total} generated), depth {depth}, {rate:.0} states/s"
        ));
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("pelican-check: {e}");
            ExitCode::from(2)
        }
    }
}

fn run(args: &Args) -> Result<ExitCode, String> {
    let mut cfg = Config::named(&args.config)?;
    if let Some(spec) = &args.faults {
        cfg = cfg.with_faults(spec)?;
    }
    if args.no_symmetry {
        cfg.symmetry = false;
        cfg.name.push_str("[no symmetry]");
    }
    let mutants: Vec<Mutant> = match args.mutant.as_deref() {
        None => Vec::new(),
        Some("all") => Mutant::ALL.to_vec(),
        Some(name) => vec![name.parse::<Mutant>().map_err(|e| e.to_string())?],
    };
    if !mutants.is_empty() && !cfg!(feature = "mutants") {
        return Err(
            "mutants need a build with `--features mutants` (use `cargo xtask check`)".into(),
        );
    }
    if args.explore {
        return explore(args, cfg.with_mutant(mutants.first().copied()));
    }
    let mut opts = Options {
        timeout: args.timeout_s.map(Duration::from_secs),
        ..Options::default()
    };
    opts.bfs = args.bfs;
    if let Some(t) = args.threads {
        opts.threads = t;
    }
    if !args.quiet {
        let bar = ProgressBar::new_spinner();
        bar.set_style(
            ProgressStyle::with_template("{spinner} {elapsed} {msg}").expect("valid template"),
        );
        bar.enable_steady_tick(Duration::from_millis(200));
        let _ = BAR.set(bar);
        opts.progress = Some(progress);
    }
    let result = match mutants.as_slice() {
        [] => check_correct(args, &cfg, &opts),
        [single] if args.mutant.as_deref() != Some("all") => {
            check_mutant(args, &cfg, opts, *single)
        }
        all => hunt(args, &cfg, &opts, all),
    };
    Ok(ExitCode::from(result))
}

/// Serves stateright's Explorer on `--address`, for good.
fn explore(args: &Args, cfg: Config) -> Result<ExitCode, String> {
    // stateright panics on a bind failure: check the address first.
    drop(
        std::net::TcpListener::bind(args.address.as_str())
            .map_err(|e| format!("cannot serve the Explorer on {}: {e}", args.address))?,
    );
    eprintln!(
        "serving stateright's Explorer on http://{} (Ctrl-C to stop)",
        args.address
    );
    use stateright::Model;
    let _checker = PelicanModel::new(cfg)
        .plain()
        .checker()
        .serve(args.address.as_str());
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

/// The correct build: every property's verdict; 0 when all hold and the
/// exploration was complete.
fn check_correct(args: &Args, cfg: &Config, opts: &Options) -> u8 {
    let report = report::check(cfg, opts);
    finish_bar();
    print_report(&report);
    if args.json {
        println!(
            "{}",
            serde_json::to_string(&json_report(&report, None)).expect("serializable")
        );
    }
    if report.passed() && report.complete {
        0
    } else {
        1
    }
}

/// One mutant, stopping at its first counterexample; 0 when caught.
fn check_mutant(args: &Args, cfg: &Config, opts: Options, single: Mutant) -> u8 {
    let report = report::check(
        &cfg.clone().with_mutant(Some(single)),
        &Options {
            stop_at_failure: true,
            ..opts
        },
    );
    finish_bar();
    print_report(&report);
    let caught = !report.counterexamples.is_empty();
    println!(
        "mutant {single}: {}",
        if caught { "caught" } else { "NOT caught" }
    );
    if args.json {
        let mut mutants = serde_json::Map::new();
        mutants.insert(
            single.name().into(),
            mutant_json(caught, report.shortest().map(|c| c.path_len)),
        );
        println!(
            "{}",
            serde_json::to_string(&json_report(&report, Some(mutants))).expect("serializable")
        );
    }
    if caught { 0 } else { 1 }
}

/// Every mutant of `all`, each to its first counterexample; 0 when every
/// one is caught.
fn hunt(args: &Args, cfg: &Config, opts: &Options, all: &[Mutant]) -> u8 {
    let results = report::hunt(cfg, opts, all);
    finish_bar();
    println!(
        "{:<20} {:<8} {:>8}  {:<24} {:>8}",
        "mutant", "caught", "path", "first property broken", "seconds"
    );
    let mut json = serde_json::Map::new();
    let mut missed = 0;
    for (name, (r, report)) in &results {
        println!(
            "{:<20} {:<8} {:>8}  {:<24} {:>8.2}",
            name,
            if r.caught { "yes" } else { "NO" },
            r.path_len.map_or("-".into(), |n| n.to_string()),
            r.property.as_deref().unwrap_or("-"),
            r.seconds
        );
        if let (Some(c), false) = (report.shortest(), args.json) {
            println!("    shortest counterexample ({} steps):", c.path_len);
            for line in c.timeline.lines() {
                println!("    {line}");
            }
        }
        missed += usize::from(!r.caught);
        json.insert(name.clone(), mutant_json(r.caught, r.path_len));
    }
    println!(
        "{} of {} mutants caught",
        results.len() - missed,
        results.len()
    );
    if args.json {
        // Each hunt stops at its first counterexample, so the
        // aggregate exploration is never complete.
        let reports = results.values().map(|(_, r)| r);
        let properties: serde_json::Map<String, serde_json::Value> = results
            .iter()
            .map(|(name, (r, _))| (name.clone(), serde_json::json!(r.property)))
            .collect();
        let obj = serde_json::json!({
            "config": cfg.name,
            "complete": false,
            "unique_states": reports.clone().map(|r| r.unique_states).sum::<usize>(),
            "max_depth": reports.clone().map(|r| r.max_depth).max().unwrap_or(0),
            "seconds": reports.map(|r| r.seconds).sum::<f64>(),
            "properties": properties,
            "mutants": json,
        });
        println!("{}", serde_json::to_string(&obj).expect("serializable"));
    }
    if missed == 0 { 0 } else { 1 }
}

fn finish_bar() {
    if let Some(bar) = BAR.get() {
        bar.finish_and_clear();
    }
}

fn mutant_json(caught: bool, path_len: Option<usize>) -> serde_json::Value {
    serde_json::json!({ "caught": caught, "path_len": path_len })
}

fn json_report(
    r: &Report,
    mutants: Option<serde_json::Map<String, serde_json::Value>>,
) -> serde_json::Value {
    let mut v = serde_json::json!({
        "config": r.config,
        "mutant": r.mutant,
        "complete": r.complete,
        "unique_states": r.unique_states,
        "states": r.states,
        "max_depth": r.max_depth,
        "seconds": r.seconds,
        "states_per_s": r.states_per_s,
        "properties": r.properties,
    });
    if let Some(m) = mutants {
        v["mutants"] = serde_json::Value::Object(m);
    }
    v
}

fn print_report(r: &Report) {
    println!(
        "config {}{}: {} unique states ({} generated), max depth {}, {:.2} s, {:.0} states/s, {}",
        r.config,
        r.mutant
            .as_deref()
            .map(|m| format!(" with mutant {m}"))
            .unwrap_or_default(),
        r.unique_states,
        r.states,
        r.max_depth,
        r.seconds,
        r.states_per_s,
        if r.complete { "complete" } else { "INCOMPLETE" }
    );
    for (name, v) in &r.properties {
        let mark = match v {
            Verdict::Holds | Verdict::Reached => "ok  ",
            Verdict::Violated | Verdict::Unreached => "FAIL",
        };
        println!(
            "  {mark} {name:<40} {}",
            serde_json::to_string(v)
                .expect("serializable")
                .trim_matches('"')
        );
    }
    for c in &r.counterexamples {
        println!(
            "\ncounterexample to {:?} ({} steps):",
            c.property, c.path_len
        );
        print!("{}", c.timeline);
        for b in &c.broken {
            println!("  broken: {b}");
        }
        println!("  stateright path: {}", c.actions.join(", "));
    }
}
