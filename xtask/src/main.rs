//! `cargo xtask`: Pelican's project commands.
//!
//! * `dev`    — the whole system on this machine (`pelican dev`), with
//!   Redis and PostgreSQL installed when missing.
//! * `check`  — model-check the protocol (`pelican-check`; mutants need the
//!   `mutants` feature, so mutant runs use that build and the correct run the
//!   default one).
//! * `chaos`  — the chaos soak on live services (`pelican-chaos`).
//! * `soak`   — the steady-state soak on live services (`pelican-soak`).
//! * `bench`  — the model, simulator and live benchmarks (`pelican-bench`).
//! * `verify` — the main job: the standard configuration must hold every
//!   guarantee, completely explored, and every mutant must be caught.
//! * `test`   — every test of the workspace, including the release-mode
//!   model checks and the mutant tests.
//! * `lint`   — the lint gate: rustfmt, clippy (normal, with the mutants,
//!   and the simulated build) and rustdoc, every warning an error.

use std::env;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Instant;

mod dev;
mod test;
use dev::dev;
use test::test;

const USAGE: &str = "\
usage: cargo xtask <command> [options]

commands:
  dev [PELICAN-DEV-OPTIONS]
            the whole system on this machine: installs Redis and PostgreSQL
            when missing (apt-get or Homebrew), builds pelican, and runs
            `pelican dev` (Redis, Postgres, the API and two workers; the
            dashboard's address and token printed; Ctrl-C stops it all)
  check [--config small|standard|large] [--mutant NAME|all] [--json] [--explore]
        [--threads N] [--timeout-s S] [--bfs] [--quiet]
            model-check the protocol with stateright
  sim [--seeds A..B] [--scenario NAME] [--mutant NAME|all] [--json]
      [--threads N] [--traces DIR] [--fail-fast] [--require-events]
            run simulated seeds under madsim (pelican-sim sweep)
  replay <SEED | traces/FILE> [--scenario NAME] [--mutant NAME]
            re-run one seed and print its timeline
  conformance [--cases N] [--seed S] [--json]
            the reference models against live Redis and Postgres: N random
            stream and N random database sequences (default 10,000 each)
  chaos [--jobs N] [--workers W] [--seconds S] [--seed X] [--redis-cluster] [--json]
        [--mutant NAME] [--short]
            the chaos soak: a real API and W real workers against throwaway
            Redis and Postgres, a seeded nemesis (kill -9, SIGSTOP, Redis
            restarts and a wipe, Postgres restarts, trims, bad input), then
            S1-S10 and the protocol traces checked (default 20,000 jobs)
  soak [--long] [--seconds S] [--rate N] [--json]
            the steady-state soak: a real API and three workers at a steady
            rate (100 runs/s for 2 minutes; --long: 200 runs/s for 20, on
            the release build) with retention on a short keep, 200 SSE
            watchers, a dashboard's polling, kill -9 of workers and of the
            API, and a Redis wipe halfway; every sampled series (tables,
            streams, PEL, connections, commits, memory, latencies) must stay
            flat, nothing lost, no 5xx, the wipe recovered in time; the
            samples in target/soak/report.json
  bench [--json] [--quick] [-- PELICAN-BENCH-OPTIONS]
            the benchmarks: the standard and standard_steps model checks,
            simulated seeds/s, and live drain, latency and recovery
            (pelican-bench), the drains of the least protocols that still
            drain, unfenced and fenced, and of the shipped statements in
            their loop (the cost of the guarantees and where it lies:
            tests/src/bench/baseline.rs), the drain beside 1,000,000
            finished runs and of a 1,000,000-run backlog, with each
            worker's peak RSS, and the drain through a Redis Cluster of
            three masters; a table, a JSON report in
            target/bench/report.json, and with --json the summary as the
            last stdout line; --quick skips the model checks and runs
            smaller live figures (a 200,000-run backlog)
  verify    the main job: check standard (complete, every guarantee holds,
            every interesting path reached) and catch every mutant; then
            10,000 simulated seeds (and 2,000 busy ones) pass and every
            mutant fails within 1,000
  test      every test in the workspace, with the release-mode model checks,
            the simulator's seeds, traces and determinism, and the mutant tests
  lint      cargo fmt --check; cargo clippy --all-targets -D warnings for the
            normal build, the build with the mutants and the --cfg madsim
            build; cargo doc --no-deps -D warnings
";

fn main() -> ExitCode {
    let args: Vec<String> = env::args().skip(1).collect();
    let Some((cmd, rest)) = args.split_first() else {
        eprint!("{USAGE}");
        return ExitCode::from(2);
    };
    let result = match cmd.as_str() {
        "dev" => dev(rest),
        "check" => check(rest),
        "verify" => verify(rest),
        "sim" => sim(rest),
        "replay" => replay(rest),
        "conformance" => conformance(rest),
        "chaos" => chaos(rest),
        "soak" => soak(rest),
        "bench" => bench(rest),
        "test" => test(rest),
        "lint" => lint(rest),
        "-h" | "--help" | "help" => {
            print!("{USAGE}");
            Ok(())
        }
        other => Err(format!("unknown command {other:?}\n{USAGE}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace root")
        .to_path_buf()
}

fn cargo() -> Command {
    let mut c = Command::new(env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(root());
    c
}

fn run(what: &str, mut c: Command) -> Result<(), String> {
    eprintln!("xtask: {what}");
    let started = Instant::now();
    let status = c
        .status()
        .map_err(|e| format!("{what}: cannot start: {e}"))?;
    eprintln!(
        "xtask: {what}: {} in {:.1} s",
        if status.success() { "ok" } else { "FAILED" },
        started.elapsed().as_secs_f64()
    );
    if status.success() {
        Ok(())
    } else {
        Err(format!("{what} failed ({status})"))
    }
}

/// Builds the container image where a container engine runs; elsewhere
/// says so, with the reason, and goes on (the Dockerfile is still linted
/// and its commands checked by the deploy tests).
fn image() -> Result<(), String> {
    let what = "the container image builds (docker build)";
    let info = Command::new("docker")
        .args(["info", "--format", "{{.ServerVersion}}"])
        .output();
    let reason = match &info {
        Err(e) => Some(format!("no docker client ({e})")),
        Ok(o) if !o.status.success() => Some(format!(
            "no container engine answers: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Ok(_) => None,
    };
    if let Some(reason) = reason {
        eprintln!("xtask: {what}: NOT BUILT on this machine: {reason}");
        return Ok(());
    }
    let mut build = Command::new("docker");
    build
        .current_dir(root())
        .args(["build", "--tag", "pelican:test", "."]);
    run(what, build)
}

/// `pelican-check` from the build with or without mutants, built with the
/// `checker` profile (release with whole-program optimisation).
fn checker(mutants: bool, args: &[String]) -> Command {
    let mut c = cargo();
    c.args([
        "run",
        "--quiet",
        "--profile",
        "checker",
        "--package",
        "pelican-checker",
        "--bin",
        "pelican-check",
    ]);
    if mutants {
        c.args(["--features", "mutants"]);
    }
    c.arg("--").args(args);
    c
}

/// `cargo <args>` built with `--cfg madsim` in its own target directory, so
/// that simulated and normal builds do not evict each other.
fn madsim_cargo() -> Command {
    let mut c = cargo();
    let flags = env::var("RUSTFLAGS").unwrap_or_default();
    c.env("RUSTFLAGS", format!("{flags} --cfg madsim").trim());
    c.env("CARGO_TARGET_DIR", root().join("target-madsim"));
    c
}

/// `pelican-sim` from the simulated build, with or without mutants.
fn simulator(mutants: bool, args: &[&str]) -> Command {
    let mut c = madsim_cargo();
    c.args(["run", "--quiet", "--release", "--package", "pelican-sim"]);
    if mutants {
        c.args(["--features", "mutants"]);
    }
    c.arg("--").args(args);
    c
}

/// Builds `pelican` (the release profile or the dev one) with `features`,
/// and answers where cargo put it: `target/<profile>/pelican`, which the
/// next build of another variant overwrites.
fn build_pelican(release: bool, features: &[&str]) -> Result<PathBuf, String> {
    let mut build = cargo();
    build.args(["build", "--package", "pelican-real", "--bin", "pelican"]);
    if release {
        build.arg("--release");
    }
    if !features.is_empty() {
        build.args(["--features", &features.join(",")]);
    }
    let profile = if release { "release" } else { "debug" };
    let mut what = format!("build pelican ({profile})");
    if !features.is_empty() {
        what = format!(
            "build pelican --features {} ({profile})",
            features.join(",")
        );
    }
    run(&what, build)?;
    Ok(root().join("target").join(profile).join("pelican"))
}

/// Copies a built `pelican` to `dir/name`, so that variants can sit side by
/// side.
fn set_aside(bin: &Path, dir: &Path, name: &str) -> Result<PathBuf, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let to = dir.join(name);
    std::fs::copy(bin, &to).map_err(|e| format!("copying the pelican binary: {e}"))?;
    Ok(to)
}

/// Builds `pelican` with the crash points (and `extra` features) for the
/// live tests, and copies it to `target/live-bin/<name>`.
fn live_binary(extra: &[&str], name: &str) -> Result<PathBuf, String> {
    let mut features = vec!["failpoints"];
    features.extend_from_slice(extra);
    let bin = build_pelican(false, &features)?;
    set_aside(&bin, &root().join("target").join("live-bin"), name)
}

fn wants_mutant(args: &[String]) -> bool {
    args.iter()
        .any(|a| a == "--mutant" || a.starts_with("--mutant="))
}

fn sim(args: &[String]) -> Result<(), String> {
    let mut full = vec!["sweep"];
    full.extend(args.iter().map(String::as_str));
    let what = format!("sim {}", args.join(" "));
    run(what.trim(), simulator(wants_mutant(args), &full))
}

fn replay(args: &[String]) -> Result<(), String> {
    let Some(target) = args.first() else {
        return Err("replay needs a seed or a trace file".into());
    };
    // A mutant's trace replays on the build with mutants.
    let mutant_trace = target.parse::<u64>().is_err()
        && std::fs::read_to_string(target)
            .map_err(|e| format!("{target}: {e}"))?
            .contains("\"mutant\": \"");
    let mut full = vec!["replay"];
    full.extend(args.iter().map(String::as_str));
    run(
        &format!("replay {}", args.join(" ")),
        simulator(mutant_trace || wants_mutant(args), &full),
    )
}

fn conformance(args: &[String]) -> Result<(), String> {
    let mut c = cargo();
    c.args([
        "run",
        "--quiet",
        "--release",
        "--package",
        "pelican-tests",
        "--bin",
        "pelican-conformance",
        "--",
    ])
    .args(args);
    run(&format!("conformance {}", args.join(" ")), c)
}

/// `pelican-chaos` (debug build of the harness) against `pelican` built
/// with the crash points, or with the mutants for `--mutant`.
fn chaos_command(args: &[&str]) -> Result<Command, String> {
    let owned: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    let bin = if wants_mutant(&owned) {
        live_binary(&["mutants"], "pelican-mutants")?
    } else {
        live_binary(&[], "pelican")?
    };
    let mut c = cargo();
    c.env("PELICAN_BIN", bin).args([
        "run",
        "--quiet",
        "--package",
        "pelican-tests",
        "--bin",
        "pelican-chaos",
    ]);
    if wants_mutant(&owned) {
        c.args(["--features", "mutants"]);
    }
    c.arg("--").args(args);
    Ok(c)
}

/// `pelican-soak` with `args`: the two-minute form on the live tests'
/// debug build, the long one (`--long`) on the release build.
fn soak_command(args: &[&str]) -> Result<Command, String> {
    let long = args.contains(&"--long");
    let bin = if long {
        build_pelican(true, &[])?
    } else {
        live_binary(&[], "pelican")?
    };
    let mut c = cargo();
    c.env("PELICAN_BIN", bin)
        .args(["run", "--quiet", "--package", "pelican-tests"]);
    if long {
        c.arg("--release");
    }
    c.args(["--bin", "pelican-soak", "--"]).args(args);
    Ok(c)
}

fn soak(args: &[String]) -> Result<(), String> {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    run(&format!("soak {}", args.join(" ")), soak_command(&args)?)
}

fn chaos(args: &[String]) -> Result<(), String> {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    run(&format!("chaos {}", args.join(" ")), chaos_command(&args)?)
}

/// Runs `c` with stderr shown, and returns its stdout's last line.
fn last_line(what: &str, mut c: Command) -> Result<String, String> {
    eprintln!("xtask: {what}");
    let started = Instant::now();
    let out = c
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("{what}: cannot start: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!(
        "xtask: {what}: {} in {:.1} s",
        if out.status.success() { "ok" } else { "FAILED" },
        started.elapsed().as_secs_f64()
    );
    if !out.status.success() {
        eprint!("{text}");
        return Err(format!("{what} failed ({})", out.status));
    }
    Ok(text.lines().last().unwrap_or_default().to_owned())
}

/// `cargo xtask bench`: the model checks, a sweep of seeds, the
/// twenty-minute soak, then `pelican-bench` with their figures.
fn bench(args: &[String]) -> Result<(), String> {
    let (json, quick, rest) = bench_options(args)?;
    let dir = root().join("target").join("bench");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let bin = build_pelican(true, &[])?;
    let model = |config: &str, what: &str| -> Result<Option<String>, String> {
        if quick {
            return Ok(None);
        }
        let args = ["--config".into(), config.into(), "--json".into()];
        last_line(what, checker(false, &args)).map(Some)
    };
    let standard = model("standard", "model: check standard")?;
    let model_steps = model(
        "standard_steps",
        "model: check standard_steps (the larger configuration)",
    )?;
    let seeds = if quick { "0..1000" } else { "0..5000" };
    let sim = last_line(
        "sim: standard seeds, all cores",
        simulator(
            false,
            &[
                "sweep",
                "--seeds",
                seeds,
                "--scenario",
                "standard",
                "--json",
            ],
        ),
    )?;
    // The steady-state soak first: its summary joins the report.
    let soak_args: &[&str] = if quick {
        &["--long", "--seconds", "120", "--json"]
    } else {
        &["--long", "--json"]
    };
    let soak = last_line("live: the steady-state soak", soak_command(soak_args)?)?;
    let report = dir.join("report.json");
    let mut live = cargo();
    live.env("PELICAN_BIN", &bin).args([
        "run",
        "--quiet",
        "--release",
        "--package",
        "pelican-tests",
        "--bin",
        "pelican-bench",
        "--",
        "--json",
        "--sim-json",
        &sim,
        "--soak-json",
        &soak,
        "--report",
    ]);
    live.arg(&report);
    if let Some(m) = &standard {
        live.args(["--model-json", m]);
    }
    if let Some(m) = &model_steps {
        live.args(["--model-steps-json", m]);
    }
    if quick {
        quick_figures(&mut live, &rest);
    }
    live.args(&rest);
    let summary = last_line("live: drain, latency, recovery", live)?;
    if json {
        println!("{summary}");
    }
    Ok(())
}

/// `bench`'s options: `--json`, `--quick`, and what follows `--`.
fn bench_options(args: &[String]) -> Result<(bool, bool, Vec<String>), String> {
    let mut json = false;
    let mut quick = false;
    let mut rest: Vec<String> = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--json" => json = true,
            "--quick" => quick = true,
            "--" => rest.extend(it.by_ref().cloned()),
            other => return Err(format!("bench: unknown option {other:?}")),
        }
    }
    Ok((json, quick, rest))
}

/// `--quick`'s smaller live figures, unless the options after `--`
/// (`rest`) say otherwise.
fn quick_figures(live: &mut Command, rest: &[String]) {
    for (flag, value) in [
        ("--jobs", "20000"),
        ("--kills", "5"),
        ("--latency-seconds", "5"),
        ("--queued-rows", "200000"),
        ("--scale-rounds", "1"),
    ] {
        if !rest
            .iter()
            .any(|a| a == flag || a.starts_with(&format!("{flag}=")))
        {
            live.args([flag, value]);
        }
    }
}

fn check(args: &[String]) -> Result<(), String> {
    let mutants = args
        .iter()
        .any(|a| a == "--mutant" || a.starts_with("--mutant="));
    let what = format!("check {}", args.join(" "));
    run(what.trim(), checker(mutants, args))
}

fn verify(args: &[String]) -> Result<(), String> {
    if let Some(a) = args.first() {
        return Err(format!("verify takes no options, got {a:?}"));
    }
    let std = |extra: &[&str]| {
        let mut v = vec!["--config".to_owned(), "standard".to_owned()];
        v.extend(extra.iter().map(|s| (*s).to_owned()));
        v
    };
    run("check standard (correct build)", checker(false, &std(&[])))?;
    run(
        "check standard --mutant all",
        checker(true, &std(&["--mutant", "all"])),
    )?;
    run(
        "sim 10,000 seeds of standard (correct build)",
        simulator(false, &["sweep", "--seeds", "0..10000", "--require-events"]),
    )?;
    run(
        "sim 2,000 seeds of busy (batches and pipelines common)",
        simulator(
            false,
            &["sweep", "--seeds", "0..2000", "--scenario", "busy"],
        ),
    )?;
    run(
        "sim --mutant all: each caught within 1,000 seeds",
        simulator(true, &["sweep", "--seeds", "0..1000", "--mutant", "all"]),
    )?;
    eprintln!(
        "xtask: verify: the model holds, 12,000 simulated seeds pass, and every mutant is caught by both"
    );
    Ok(())
}

/// The example crate of users' own jobs (examples/agent), and the feature
/// of its worker binary.
const AGENT: &str = "pelican-example-agent";
const AGENT_WORKER: &str = "pelican-example-agent/worker";

/// Every crate's `mutants` feature, for the builds that include them.
const ALL_MUTANTS: &str = "pelican-model/mutants,pelican-checker/mutants,pelican-real/mutants,pelican-sim/mutants,pelican-tests/mutants";

fn lint(args: &[String]) -> Result<(), String> {
    if let Some(a) = args.first() {
        return Err(format!("lint takes no options, got {a:?}"));
    }
    let mut fmt = cargo();
    fmt.args(["fmt", "--all", "--check"]);
    run("rustfmt", fmt)?;
    let clippy = |c: &mut Command, features: Option<&str>| {
        c.args(["clippy", "--workspace", "--all-targets"]);
        if let Some(f) = features {
            c.args(["--features", f]);
        }
        c.args(["--", "-D", "warnings"]);
    };
    let mut normal = cargo();
    clippy(&mut normal, Some(AGENT_WORKER));
    run("clippy", normal)?;
    let mut mutants = cargo();
    clippy(&mut mutants, Some(ALL_MUTANTS));
    run("clippy, with the mutants", mutants)?;
    let mut simulated = madsim_cargo();
    simulated.args([
        "clippy",
        "--package",
        "pelican-sim",
        "--package",
        "pelican-sdk",
        "--package",
        AGENT,
        "--all-targets",
        "--features",
        "pelican-sim/mutants,pelican-sdk/testing",
        "--",
        "-D",
        "warnings",
    ]);
    run("clippy, the simulated build (--cfg madsim)", simulated)?;
    let mut doc = cargo();
    let flags = env::var("RUSTDOCFLAGS").unwrap_or_default();
    doc.env("RUSTDOCFLAGS", format!("{flags} -D warnings").trim())
        .args(["doc", "--workspace", "--no-deps"]);
    run("rustdoc", doc)
}
