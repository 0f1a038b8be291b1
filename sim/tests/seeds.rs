//! The simulator's test suite (run by `cargo xtask test` with
//! `--cfg madsim`): a few hundred seeds of every scenario pass, seeds are
//! deterministic, every saved trace replays as it should, and (with the
//! `mutants` feature) every mutant fails within the first 1,000 seeds.

#![cfg(madsim)]

use pelican_sim::trace::Trace;
use pelican_sim::{Scenario, run_seed};
use std::path::PathBuf;

fn sweep(scenario: &str, seeds: std::ops::Range<u64>) {
    pelican_sim::quiet_job_panics();
    let sc = Scenario::named(scenario).expect("a known scenario");
    let failed: Vec<String> = seeds
        .filter_map(|seed| {
            let o = run_seed(seed, &sc, None, false);
            (!o.passed()).then(|| {
                format!(
                    "seed {seed}: {:?} (cargo xtask replay {seed} --scenario {scenario})",
                    o.broken
                )
            })
        })
        .collect();
    assert!(
        failed.is_empty(),
        "{} seeds failed:\n{}",
        failed.len(),
        failed.join("\n")
    );
}

#[test]
fn standard_seeds_pass() {
    sweep("standard", 0..300);
}

#[test]
fn calm_seeds_pass() {
    sweep("calm", 0..50);
}

#[test]
fn crashy_seeds_pass() {
    sweep("crashy", 0..100);
}

#[test]
fn redis_loss_seeds_pass() {
    sweep("redis-loss", 0..100);
}

#[test]
fn busy_seeds_pass() {
    sweep("busy", 0..200);
}

/// The busy scenario exercises what the standard one rarely does: claims,
/// completions and reads batched into one statement, and acknowledgements
/// pipelined, under faults (so the checks above cover them).
#[test]
fn busy_seeds_batch_and_pipeline() {
    pelican_sim::quiet_job_panics();
    let sc = Scenario::named("busy").expect("a known scenario");
    let (mut batches, mut pipelines) = (0, 0);
    for seed in 0..20 {
        let o = run_seed(seed, &sc, None, false);
        batches += o.counters.get("batches").copied().unwrap_or(0);
        pipelines += o.counters.get("pipelines").copied().unwrap_or(0);
    }
    assert!(batches >= 100, "{batches} batches in 20 busy seeds");
    assert!(pipelines >= 20, "{pipelines} pipelines in 20 busy seeds");
}

/// Workers killed and started again leave their consumers behind, and the
/// consumers' housekeeping deletes them once idle (under faults, so the
/// checks above cover it).
#[test]
fn crashy_seeds_forget_consumers() {
    pelican_sim::quiet_job_panics();
    let sc = Scenario::named("crashy").expect("a known scenario");
    let forgotten: u64 = (0..20)
        .map(|seed| {
            let o = run_seed(seed, &sc, None, false);
            o.counters.get("consumers_forgotten").copied().unwrap_or(0)
        })
        .sum();
    assert!(
        forgotten >= 5,
        "{forgotten} consumer deletions in 20 crashy seeds"
    );
}

/// The same seed gives the same events (every event is hashed in order).
#[test]
fn seeds_are_deterministic() {
    pelican_sim::quiet_job_panics();
    let sc = Scenario::standard();
    for seed in 1_000..1_030 {
        let a = run_seed(seed, &sc, None, false);
        let b = run_seed(seed, &sc, None, false);
        assert_eq!(a.digest, b.digest, "seed {seed} is not deterministic");
        assert_eq!(a.counters, b.counters, "seed {seed} is not deterministic");
    }
    // A recorded run is the same run as an unrecorded one.
    let a = run_seed(7, &sc, None, false);
    let b = run_seed(7, &sc, None, true);
    assert_eq!(a.digest, b.digest, "recording changed the run");
    assert!(b.log.is_some_and(|l| l.len() > 100));
}

/// A calm seed settles with work done: the checks see real traffic.
#[test]
fn a_calm_seed_does_the_work() {
    let o = run_seed(3, &Scenario::named("calm").expect("known"), None, false);
    assert!(o.passed(), "{:?}", o.broken);
    // A run a worker claims before the API marks it published counts as
    // submitted unpublished (the mark finds it running; the outbox has
    // nothing to do).
    let count = |k: &str| o.counters.get(k).copied().unwrap_or(0);
    assert_eq!(
        count("submitted") + count("submitted_unpublished") + count("submitted_delayed"),
        10
    );
    assert!(o.counters.get("acked_written").copied().unwrap_or(0) >= 10);
    assert!(!o.counters.contains_key("kills"));
}

fn traces() -> Vec<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../traces");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("traces/ exists")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    files
}

/// Every trace replays: a trace of the correct build must pass now (the bug
/// it found stays fixed); a mutant's trace must pass on the correct build
/// and, with the `mutants` feature, still fail with its mutant.
#[test]
fn every_trace_replays() {
    pelican_sim::quiet_job_panics();
    let files = traces();
    assert!(!files.is_empty(), "traces/ holds the regression traces");
    for path in files {
        let t = Trace::read(&path).expect("a valid trace");
        let sc = Scenario::named(&t.scenario).expect("a known scenario");
        let correct = run_seed(t.seed, &sc, None, false);
        assert!(
            correct.passed(),
            "{}: fails on the correct build: {:?}",
            path.display(),
            correct.broken
        );
        #[cfg(feature = "mutants")]
        if let Some(name) = &t.mutant {
            let m: pelican_model::protocol::Mutant = name.parse().expect("a known mutant");
            let o = run_seed(t.seed, &sc, Some(m), false);
            assert!(
                !o.passed(),
                "{}: mutant {name} is no longer caught by seed {}",
                path.display(),
                t.seed
            );
        }
    }
}

/// Each mutant fails within the first 1,000 seeds of its home scenario
/// ([`Scenario::home_of`]: standard, or busy for ZombieProgress).
#[cfg(feature = "mutants")]
mod mutants {
    use super::*;
    use pelican_model::protocol::Mutant;

    fn caught(m: Mutant) {
        pelican_sim::quiet_job_panics();
        let sc = Scenario::home_of(m);
        let first = (0..1_000).find(|&seed| !run_seed(seed, &sc, Some(m), false).passed());
        assert!(
            first.is_some(),
            "mutant {m} survived 1,000 seeds of {}",
            sc.name
        );
    }

    macro_rules! mutant_tests {
        ($($name:ident => $m:ident),* $(,)?) => {
            $(#[test] fn $name() { caught(Mutant::$m); })*
        };
    }

    mutant_tests! {
        mutant_ack_before_commit => AckBeforeCommit,
        mutant_no_fence => NoFence,
        mutant_no_terminal_check => NoTerminalCheck,
        mutant_no_idempotency_key => NoIdempotencyKey,
        mutant_retry_in_pel => RetryInPel,
        mutant_no_dead_letter => NoDeadLetter,
        mutant_stale_ack => StaleAck,
        mutant_ignore_trimmed => IgnoreTrimmed,
        mutant_revive_cancelled => ReviveCancelled,
        mutant_no_publish_recovery => NoPublishRecovery,
        mutant_poison_retried => PoisonRetried,
        mutant_worker_clock => WorkerClock,
        mutant_retain_live => RetainLive,
        mutant_step_rerun => StepRerun,
        mutant_unknown_retried => UnknownRetried,
        mutant_forget_keys => ForgetKeys,
        mutant_forget_holders => ForgetHolders,
        mutant_no_sweep => NoSweep,
        mutant_overbooked => Overbooked,
        mutant_ignore_budget => IgnoreBudget,
        mutant_zombie_progress => ZombieProgress,
        mutant_reclaim_one_partition => ReclaimOnePartition,
        mutant_promote_early => PromoteEarly,
        mutant_tick_unfenced => TickUnfenced,
    }
}
