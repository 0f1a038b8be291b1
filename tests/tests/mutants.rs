//! The live tests' teeth: each mutant, injected into every `pelican`
//! process (and the test's own submissions), must make the scenario that
//! exposes it fail. Needs the `mutants` feature here and a `pelican` binary
//! built with `mutants` (`cargo xtask test` builds both).
#![allow(
    clippy::too_many_lines,
    reason = "a scenario, bench or check reads top to bottom as one script"
)]
#![cfg(feature = "mutants")]

use pelican_tests::scenarios as s;

fn caught(mutant: &str, scenario: fn(Option<&str>)) {
    let _ = pelican_tests::take_traces();
    let outcome = std::panic::catch_unwind(|| scenario(Some(mutant)));
    let traces = pelican_tests::take_traces();
    let rejected: Vec<String> = traces
        .iter()
        .filter_map(|t| pelican_real::trace::check_file(t).err())
        .map(|r| r.reason)
        .collect();
    // The scenario failed on purpose: its logs are not needed.
    for dir in traces.iter().filter_map(|t| t.parent()) {
        let _ = std::fs::remove_dir_all(dir);
    }
    eprintln!(
        "mutant {mutant}: {} trace(s) rejected{}",
        rejected.len(),
        rejected
            .first()
            .map(|r| format!(": {r:.200}"))
            .unwrap_or_default()
    );
    if ["AckBeforeCommit", "NoFence", "StaleAck"].contains(&mutant) {
        assert!(
            !rejected.is_empty(),
            "no trace of mutant {mutant} was rejected"
        );
    }
    let Err(panic) = outcome else {
        panic!("mutant {mutant} passed its live scenario: the live tests cannot see it");
    };
    let why = panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_default();
    eprintln!(
        "mutant {mutant} caught: {}",
        why.lines().next().unwrap_or("")
    );
}

macro_rules! mutants {
    ($($test:ident: $mutant:literal => $scenario:ident),* $(,)?) => {
        $(#[test] fn $test() { caught($mutant, s::$scenario); })*
    };
}

mutants! {
    ack_before_commit: "AckBeforeCommit" => kill_right_after_ack,
    no_fence: "NoFence" => premature_reclaim_of_a_live_long_job,
    no_terminal_check: "NoTerminalCheck" => kill_after_commit_before_ack,
    no_idempotency_key: "NoIdempotencyKey" => kill_right_after_the_side_effect,
    retry_in_pel: "RetryInPel" => retryable_errors_back_off_then_dead_letter,
    no_dead_letter: "NoDeadLetter" => retryable_errors_back_off_then_dead_letter,
    stale_ack: "StaleAck" => late_worker_does_not_ack_a_reclaimed_entry,
    ignore_trimmed: "IgnoreTrimmed" => trimmed_pending_entry_is_recovered,
    revive_cancelled: "ReviveCancelled" => cancelled_before_delivery_never_runs,
    no_publish_recovery: "NoPublishRecovery" => unpublished_run_is_published_by_the_outbox,
    no_sweep: "NoSweep" => redis_cluster_master_failover,
    poison_retried: "PoisonRetried" => poison_values_fail_alone,
    worker_clock: "WorkerClock" => skewed_clock_takes_no_live_lease,
    retain_live: "RetainLive" => retention_deletes_finished_runs,
    step_rerun: "StepRerun" => kill_right_after_a_step_is_recorded,
    unknown_retried: "UnknownRetried" => unknown_errors_are_retried_up_to_the_cap,
    ignore_budget: "IgnoreBudget" => budgets_and_timeouts_bound_runs,
    overbooked: "Overbooked" => a_dead_workers_permit_frees_after_its_hold,
    zombie_progress: "ZombieProgress" => a_late_attempts_progress_is_refused,
    reclaim_one_partition: "ReclaimOnePartition" => partitions_spread_over_cluster_masters,
    forget_keys: "ForgetKeys" => retention_keeps_a_keys_window,
    forget_holders: "ForgetHolders" => idle_consumers_are_forgotten_unless_they_hold,
    promote_early: "PromoteEarly" => delayed_runs_start_when_due,
    tick_unfenced: "TickUnfenced" => schedule_ticks_run_once,
}

/// The mutants' statements answer as their model twins: first on every
/// status a run can be in, then in the random conformance sequences of a
/// build with the mutants (which draw every declared statement).
#[test]
fn mutant_statements_answer_as_the_model() {
    use pelican_model::ids::{Dispatch, EntryId, Fence, RunId};
    use pelican_model::protocol::DbOp;
    use pelican_model::status::ErrorClass;
    use pelican_model::time::Timestamp;
    use pelican_tests::conformance::{DbStep, START, db_case, migrated};

    let db = pelican_tests::Database::create();
    let run = RunId;
    let one = DbStep::One;
    let insert_delayed = |r, delay_ms| {
        one(DbOp::InsertRun {
            run: run(r),
            kind: "noop".into(),
            input: "{}".into(),
            attempts_max: 3,
            budget_ms: 0,
            trace: String::new(),
            delay_ms,
            at_ms: 0,
        })
    };
    let insert = |r| insert_delayed(r, 0);
    let claim = |r| DbOp::Claim {
        run: run(r),
        dispatch: Dispatch(1),
        entry: EntryId::new(r, 0),
        worker: "w1".into(),
        lease_ms: 2_000,
    };
    let revive = |r, dispatch| {
        one(DbOp::ClaimReviving {
            run: run(r),
            dispatch: Dispatch(dispatch),
            // The claim's own entry: a lapsed attempt is taken over only
            // through it.
            entry: EntryId::new(r, 0),
            worker: "w2".into(),
            lease_ms: 2_000,
        })
    };
    let failure_only = |r| {
        one(DbOp::RecordFailureOnly {
            run: run(r),
            fence: Fence(1),
            class: ErrorClass::Retryable,
            message: "again".into(),
        })
    };
    // Runs 1-5: queued, running, in retry_wait, cancelled, succeeded.
    let mut steps: Vec<DbStep> = (1..=5).map(insert).collect();
    steps.extend([2, 3, 5].map(|r| one(claim(r))));
    steps.push(one(DbOp::ScheduleRetry {
        run: run(3),
        fence: Fence(1),
        class: ErrorClass::Retryable,
        message: "later".into(),
        backoff_ms: 4_000,
    }));
    steps.push(one(DbOp::Cancel { run: run(4) }));
    steps.push(one(DbOp::Complete {
        run: run(5),
        fence: Fence(1),
        result: "\"done\"".into(),
    }));
    steps.extend((1..=5).map(failure_only));
    steps.push(DbStep::Clock(Timestamp(9_000)));
    steps.extend((1..=5).flat_map(|r| [revive(r, 1), revive(r, 2)]));
    // WorkerClock's claim judges the lease by the claimer's clock.
    // Its lease runs to 3,000: refused by a clock at 2,500, taken at 3,500.
    let runs = [6, 7];
    steps.push(DbStep::Clock(START));
    steps.extend(runs.map(insert));
    steps.extend(runs.map(|r| one(claim(r))));
    steps.extend(runs.map(|r| {
        one(DbOp::ClaimAt {
            run: run(r),
            dispatch: Dispatch(1),
            entry: EntryId::new(r, 0),
            worker: "w3".into(),
            now: Timestamp(if r == 6 { 2_500 } else { 3_500 }),
            lease_ms: 2_000,
        })
    }));
    // PromoteEarly's pass takes run 8, delayed a minute, at once, and
    // leaves run 9, submitted without a delay, queued as it was.
    steps.extend([insert_delayed(8, 60_000), insert(9)]);
    steps.push(one(DbOp::PromoteRetries { limit: 10 }));
    steps.push(one(DbOp::PromoteEarly { limit: 10 }));
    // TickUnfenced's statement handles a tick the schedule has handled:
    // it counts it again (its run exists), where FireTick does nothing.
    steps.push(one(DbOp::PutSchedule {
        name: "s".into(),
        kind: "noop".into(),
        input: "{}".into(),
        cron: "* * * * * *".into(),
        tz: "UTC".into(),
        overlap: pelican_model::schedule::Overlap::Queue,
        catchup: pelican_model::schedule::Catchup::One,
    }));
    let tick = START;
    let run = pelican_model::schedule::tick_run(1, tick);
    let fire = |expect| DbOp::FireTick {
        schedule: "s".into(),
        expect,
        tick,
        next: tick.add_ms(1_000),
        run,
        attempts_max: 3,
        budget_ms: 0,
    };
    steps.extend([fire(Timestamp(0)), fire(Timestamp(0))].map(one));
    steps.push(one(DbOp::FireTickUnfenced {
        schedule: "s".into(),
        tick,
        next: tick.add_ms(1_000),
        run,
        attempts_max: 3,
        budget_ms: 0,
    }));
    let pg = migrated(db.url());
    if let Err(e) = pelican_tests::rt().block_on(db_case(&pg, &steps)) {
        panic!("model::Db and Postgres differ on every status: {e}");
    }
    let outcome = pelican_tests::conformance::run_db(db.url(), 1_000, 2);
    if let Some(m) = outcome.mismatch {
        panic!("model::Db and Postgres differ:\n{m}");
    }
}

/// The limits' race test has teeth: Overbooked's acquire waits for the
/// slot another session holds, then takes it as well.
#[test]
fn overbooked_acquire_fails_the_limits_race() {
    use pelican_model::protocol::{Mutant, Policy};
    use pelican_tests::conformance::limits::provider_limits_race;
    let db = pelican_tests::Database::create();
    let policy = Policy {
        mutant: Some(Mutant::Overbooked),
        ..Policy::default()
    };
    let e = provider_limits_race(db.url(), &policy)
        .expect_err("an acquire that takes held slots passed the race");
    assert!(e.starts_with("two acquires of the last slot"), "{e}");
}

/// What only a build with the mutants may hold: every mutant's name, every
/// mutant-only statement's name and text, and the label of a mutant's ack.
fn mutant_strings() -> Vec<String> {
    use pelican_model::db::Statement;
    use pelican_model::protocol::Mutant;
    let mut strings: Vec<String> = Mutant::ALL.iter().map(|m| m.name().to_owned()).collect();
    for s in Statement::ALL.iter().filter(|s| s.mutant_only()) {
        strings.push(s.name().to_owned());
        strings.push(s.sql().to_owned());
    }
    strings.push("acked_mutant".to_owned());
    strings
}

/// The `strings` that occur in the file `bin`.
fn found_in(bin: &std::path::Path, strings: &[String]) -> Vec<String> {
    let bytes = std::fs::read(bin).unwrap_or_else(|e| panic!("{}: {e}", bin.display()));
    strings
        .iter()
        .filter(|s| memchr::memmem::find(&bytes, s.as_bytes()).is_some())
        .cloned()
        .collect()
}

/// A production binary cannot run a mutant or the benchmarks' baseline:
/// the release `pelican` built without features (`PELICAN_RELEASE_BIN`,
/// which `cargo xtask test` builds) holds none of the mutants' names,
/// statements or labels, nor the baseline's statements, while the build
/// with the mutants under test (`PELICAN_BIN`) holds every mutant string.
#[test]
fn release_binary_holds_no_mutant() {
    let release = std::env::var_os("PELICAN_RELEASE_BIN")
        .expect("PELICAN_RELEASE_BIN names the release pelican (cargo xtask test sets it)");
    let strings = mutant_strings();
    assert!(strings.len() > 10, "{strings:?}");
    let baseline = [
        pelican_tests::bench::baseline::READ.to_owned(),
        pelican_tests::bench::baseline::COMPLETE.to_owned(),
    ];
    let leaked = found_in(
        std::path::Path::new(&release),
        &[&strings[..], &baseline[..]].concat(),
    );
    assert!(leaked.is_empty(), "the release binary holds {leaked:?}");
    let with_mutants =
        std::env::var_os("PELICAN_BIN").expect("PELICAN_BIN names the mutants' pelican");
    let present = found_in(std::path::Path::new(&with_mutants), &strings);
    let missing: Vec<&String> = strings.iter().filter(|s| !present.contains(s)).collect();
    assert!(
        missing.is_empty(),
        "the scan finds nothing: the build with the mutants lacks {missing:?}"
    );
}
