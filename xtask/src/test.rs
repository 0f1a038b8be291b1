//! `cargo xtask test`: every suite, in the order of the README: those
//! that need no server, the live ones, the soaks, the release-mode model
//! checks and the mutants.

use crate::*;

/// `cargo xtask test`: every suite, in the order of the README.
pub(crate) fn test(args: &[String]) -> Result<(), String> {
    if let Some(a) = args.first() {
        return Err(format!("test takes no options, got {a:?}"));
    }
    test_without_servers()?;
    test_live()?;
    test_soaks()?;
    test_models()
}

/// The suites that need no server: unit, property and small-model tests,
/// the example under the simulator, the core with its mutants.
fn test_without_servers() -> Result<(), String> {
    let mut unit = cargo();
    unit.args([
        "test",
        "--workspace",
        "--exclude",
        "pelican-tests",
        "--exclude",
        AGENT,
    ]);
    run("unit, property and small-model tests (debug)", unit)?;
    let mut agent = madsim_cargo();
    agent.args(["test", "--release", "--package", AGENT]);
    run(
        "examples/agent: its handlers under the simulator, 1,000 seeds and the planted bug (madsim, release)",
        agent,
    )?;
    let mut agent_worker = cargo();
    agent_worker.args(["build", "--package", AGENT, "--features", AGENT_WORKER]);
    run("examples/agent: its worker binary builds", agent_worker)?;
    let mut core_mutants = cargo();
    core_mutants.args([
        "test",
        "--package",
        "pelican-model",
        "--features",
        "mutants",
    ]);
    run(
        "the core's tests with the mutants compiled in (debug)",
        core_mutants,
    )
}

/// The suites against live servers and processes: the deploy kit, the
/// image, the live tests, the dashboard in a browser, the live mutants.
fn test_live() -> Result<(), String> {
    let correct = live_binary(&[], "pelican")?;
    let mut deploy = cargo();
    deploy.env("PELICAN_BIN", &correct).args([
        "test",
        "--package",
        "pelican-tests",
        "--test",
        "deploy",
    ]);
    run(
        "deploy kit: kubectl kustomize renders deploy/k8s, its and compose's commands, flags and variables are pelican's, hadolint passes the Dockerfile",
        deploy,
    )?;
    image()?;
    let mutant = live_binary(&["mutants"], "pelican-mutants")?;
    let mut live = cargo();
    live.env("PELICAN_BIN", &correct).args([
        "test",
        "--package",
        "pelican-tests",
        "--test",
        "live",
        "--",
        "--test-threads",
        "2",
    ]);
    run(
        "live end-to-end tests: real Redis and Postgres, real processes killed",
        live,
    )?;
    let mut browser = cargo();
    browser.env("PELICAN_BIN", &correct).args([
        "test",
        "--package",
        "pelican-tests",
        "--test",
        "browser",
    ]);
    run(
        "the dashboard in headless Chromium: submit, a reclaim on the timeline, a cancel, a requeue, search, a bulk requeue, a schedule (screenshots in target/test-artefacts/dashboard)",
        browser,
    )?;
    let release = build_pelican(true, &[])?;
    let mut live_mutants = cargo();
    live_mutants.env("PELICAN_RELEASE_BIN", &release);
    live_mutants.env("PELICAN_BIN", &mutant).args([
        "test",
        "--package",
        "pelican-tests",
        "--features",
        "mutants",
        "--test",
        "mutants",
        "--",
        "--test-threads",
        "2",
    ]);
    run(
        "every mutant fails a live scenario; the release binary holds none",
        live_mutants,
    )
}

/// The chaos soaks and the steady-state soak, short forms.
fn test_soaks() -> Result<(), String> {
    run(
        "chaos soak, short: 2,000 jobs under kills, pauses, Redis and Postgres restarts, a wipe, trims and bad input",
        chaos_command(&["--short", "--quiet"])?,
    )?;
    run(
        "chaos soak on a Redis Cluster, short: 1,000 jobs under kills, pauses, master failovers, a Postgres restart, trims and bad input",
        chaos_command(&["--short", "--redis-cluster", "--quiet"])?,
    )?;
    run(
        "steady-state soak, 2 minutes at 100 runs/s: retention, 200 SSE watchers, kills of workers and the API, a Redis wipe; every series flat",
        soak_command(&[])?,
    )
}

/// The models against the servers (conformance) and against the
/// guarantees (the checker's configurations, the simulator), each with
/// its mutants.
fn test_models() -> Result<(), String> {
    // Debug: the live tests built its library already, and the suites wait
    // on the servers, not on the CPU (75 s here against 37 s for a release
    // build that took minutes to compile).
    let mut conformance = cargo();
    conformance.env("CONFORMANCE_CASES", "1000").args([
        "test",
        "--package",
        "pelican-tests",
        "--test",
        "conformance",
    ]);
    run(
        "conformance: 1,000 stream and 1,000 database sequences against Redis and Postgres; every write from every run state, racing in two sessions",
        conformance,
    )?;
    let mut release = cargo();
    release.args([
        "test",
        "--release",
        "--package",
        "pelican-checker",
        "--",
        "--ignored",
    ]);
    run(
        "the standard, retention, steps, unknown, budget, limits, partitions, trims, delays and schedules configurations, correct build (release)",
        release,
    )?;
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
    let mut sim = madsim_cargo();
    sim.args(["test", "--release", "--package", "pelican-sim"]);
    run(
        "simulated seeds, traces and determinism (madsim, release)",
        sim,
    )?;
    let mut sim_mutants = madsim_cargo();
    sim_mutants.args([
        "test",
        "--release",
        "--package",
        "pelican-sim",
        "--features",
        "mutants",
    ]);
    run(
        "every mutant fails a simulated seed; mutant traces still fail (madsim, release)",
        sim_mutants,
    )?;
    Ok(())
}
