//! `cargo xtask`: Pelican's project commands.
//!
//! * `check`  — model-check the protocol (`pelican-check`; mutants need the
//!   `mutants` feature, so mutant runs use that build and the correct run the
//!   default one).
//! * `verify` — the main job: the standard configuration must hold every
//!   guarantee, completely explored, and every mutant must be caught.
//! * `test`   — every test of the workspace, including the release-mode
//!   model checks and the mutant tests.

use std::env;
use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::Instant;

const USAGE: &str = "\
usage: cargo xtask <command> [options]

commands:
  check [--config small|standard|large] [--mutant NAME|all] [--json] [--explore]
        [--threads N] [--timeout-s S] [--bfs] [--quiet]
            model-check the protocol with stateright
  verify    the main job: check standard (complete, every guarantee holds,
            every interesting path reached) and catch all ten mutants
  test      every test in the workspace, with the release-mode model checks
            and the mutant tests
";

fn main() -> ExitCode {
    let args: Vec<String> = env::args().skip(1).collect();
    let Some((cmd, rest)) = args.split_first() else {
        eprint!("{USAGE}");
        return ExitCode::from(2);
    };
    let result = match cmd.as_str() {
        "check" => check(rest),
        "verify" => verify(rest),
        "test" => test(rest),
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

/// `pelican-check` from the build with or without mutants.
fn checker(mutants: bool, args: &[String]) -> Command {
    let mut c = cargo();
    c.args([
        "run",
        "--quiet",
        "--release",
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
    eprintln!("xtask: verify: the model holds and all ten mutants are caught");
    Ok(())
}

fn test(args: &[String]) -> Result<(), String> {
    if let Some(a) = args.first() {
        return Err(format!("test takes no options, got {a:?}"));
    }
    let mut unit = cargo();
    unit.args(["test", "--workspace"]);
    run("unit, property and small-model tests (debug)", unit)?;
    let mut release = cargo();
    release.args([
        "test",
        "--release",
        "--package",
        "pelican-checker",
        "--",
        "--ignored",
    ]);
    run("standard configuration, correct build (release)", release)?;
    let mut mutants = cargo();
    mutants.args([
        "test",
        "--release",
        "--package",
        "pelican-checker",
        "--features",
        "mutants",
        "--",
        "--ignored",
        "mutant",
    ]);
    run("every mutant yields a counterexample (release)", mutants)?;
    Ok(())
}
