//! The live tests' teeth: each mutant, injected into every `pelican`
//! process (and the test's own submissions), must make the scenario that
//! exposes it fail. Needs the `mutants` feature here and a `pelican` binary
//! built with `mutants` (`cargo xtask test` builds both).

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
    // Not one of the ten: the benchmarks' baseline, the least protocol that
    // still drains a queue, must not pass the live tests either. (It never
    // marks a run running, so the fencing scenarios, which wait for that,
    // cannot drive it; the model checker and the simulator catch its
    // unclaimed executions.)
    unguarded_baseline: "Unguarded" => retryable_errors_back_off_then_dead_letter,
}

/// The mutants' statements and the baseline's answer as their model twins,
/// alone and batched, among the correct ones: first on every status a run
/// can be in, then in the random conformance sequences of a build with the
/// mutants.
#[test]
fn mutant_and_baseline_statements_answer_as_the_model() {
    use pelican_model::ids::{Dispatch, EntryId, Fence, RunId};
    use pelican_model::protocol::DbOp;
    use pelican_model::status::ErrorClass;
    use pelican_model::time::Timestamp;
    use pelican_tests::conformance::{DbStep, db_case, migrated};

    let db = pelican_tests::Database::create();
    let run = RunId;
    let insert = |r| {
        DbStep::One(DbOp::InsertRun {
            run: run(r),
            kind: "noop".into(),
            input: "{}".into(),
            attempts_max: 3,
        })
    };
    let claim = |r| {
        DbStep::One(DbOp::Claim {
            run: run(r),
            dispatch: Dispatch(1),
            entry: EntryId::new(r, 0),
            worker: "w1".into(),
            now: Timestamp(1_000),
            lease_ms: 2_000,
        })
    };
    let retry = |r| {
        DbStep::One(DbOp::ScheduleRetry {
            run: run(r),
            fence: Fence(1),
            class: ErrorClass::Retryable,
            message: "later".into(),
            retry_at: Timestamp(5_000),
        })
    };
    let done = |r| DbOp::CompleteUnfenced {
        run: run(r),
        result: format!("\"u{r}\""),
    };
    let fail = |r| {
        DbStep::One(DbOp::FailUnfenced {
            run: run(r),
            class: ErrorClass::Terminal,
            message: "no".into(),
        })
    };
    // Runs 1-4 queued, running, in retry_wait and cancelled for the batch;
    // 5-8 queued, in retry_wait, cancelled and running for the single
    // statements, and 1 and 5 again once they are finished.
    let mut steps: Vec<DbStep> = (1..=8).map(insert).collect();
    steps.extend([claim(2), claim(3), retry(3), claim(6), retry(6), claim(8)]);
    steps.push(DbStep::One(DbOp::Cancel { run: run(4) }));
    steps.push(DbStep::One(DbOp::Cancel { run: run(7) }));
    steps.push(DbStep::Batch((1..=4).map(done).collect()));
    steps.extend([fail(1), fail(5), fail(6), fail(7), fail(8)]);
    steps.push(DbStep::One(done(5)));
    let pg = migrated(db.url());
    if let Err(e) = pelican_tests::rt().block_on(db_case(&pg, &steps)) {
        panic!("model::Db and Postgres differ on every status: {e}");
    }
    let outcome = pelican_tests::conformance::run_db(db.url(), 1_000, 2);
    if let Some(m) = outcome.mismatch {
        panic!("model::Db and Postgres differ:\n{m}");
    }
}
