//! The reference models against the live servers: random command sequences
//! on `model::Stream` and on Redis, on `model::Db` and on Postgres, must
//! answer alike (see `pelican_tests::conformance`). `CONFORMANCE_CASES`
//! sets the number of sequences (default 1,000 each);
//! `cargo xtask conformance` runs the long mode.

use pelican_tests::conformance::{run_db, run_stream};
use pelican_tests::{Database, Redis};

fn cases() -> u32 {
    std::env::var("CONFORMANCE_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(1_000)
}

#[test]
fn redis_streams_answer_as_the_model() {
    let redis = Redis::start();
    let outcome = run_stream(&redis.url(), cases(), 1);
    if let Some(m) = outcome.mismatch {
        panic!("model::Stream and Redis differ:\n{m}");
    }
}

/// Every write that can hit a run, from every state the model reaches it
/// in, alone and racing another write in a second session.
#[test]
fn racing_statements_end_as_a_serial_order() {
    let db = Database::create();
    let report = pelican_tests::conformance::race::run(db.url());
    println!("{report}");
    assert!(
        report.failures.is_empty(),
        "{} differences from the model:\n{}",
        report.failures.len(),
        report.failures.join("\n")
    );
}

/// Two fused batches over the same runs, sent in opposite orders and
/// queued behind row locks: bound as given they deadlock (the scenario
/// can fail), bound as Pelican binds them they end as the model's serial
/// order.
#[test]
fn fused_batches_in_opposite_orders_do_not_deadlock() {
    use pelican_tests::conformance::lock_order::{Binding, opposite_batches};
    let db = Database::create();
    let control = opposite_batches(db.url(), Binding::AsGiven);
    assert!(
        control
            .as_ref()
            .is_err_and(|e| e.contains("deadlock detected")),
        "bound as given, the batches should deadlock: {control:?}"
    );
    if let Err(e) = opposite_batches(db.url(), Binding::Pelican) {
        panic!("bound by run, the batches differ from the model or deadlock: {e}");
    }
}

#[test]
fn postgres_answers_as_the_model() {
    let db = Database::create();
    let outcome = run_db(db.url(), cases(), 1);
    if let Some(m) = outcome.mismatch {
        panic!("model::Db and Postgres differ:\n{m}");
    }
}

/// Permits and tokens taken, made and released in two sessions at once
/// answer as the model does in one order or the other, and an acquire
/// never waits for a slot another session holds.
#[test]
fn provider_limits_race_in_two_sessions() {
    use pelican_tests::conformance::limits::provider_limits_race;
    let db = Database::create();
    let policy = pelican_model::protocol::Policy::default();
    match provider_limits_race(db.url(), &policy) {
        Ok(n) => assert_eq!(n, 7, "every race ran"),
        Err(e) => panic!("{e}"),
    }
}
