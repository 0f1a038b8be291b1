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

#[test]
fn postgres_answers_as_the_model() {
    let db = Database::create();
    let outcome = run_db(db.url(), cases(), 1);
    if let Some(m) = outcome.mismatch {
        panic!("model::Db and Postgres differ:\n{m}");
    }
}
