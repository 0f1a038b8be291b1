//! Differential tests of the reference models against the live servers.
//!
//! The simulator and the model checker are only as true as
//! `pelican_model::Stream` and `pelican_model::Db` are to Redis and
//! Postgres. Here proptest draws random sequences of commands; each
//! sequence runs against the model and, through the very clients the worker
//! uses ([`pelican_real::live::RedisStream`], [`pelican_real::live::PgDb`]),
//! against a live server from the same empty state. Every reply must be
//! identical, and so must the state after it: every known entry located
//! after each stream command, every row after each database sequence. A
//! failing sequence is shrunk and printed as a numbered list of commands
//! that reproduces it.
//!
//! * [`stream`]: [`StreamOp`](pelican_model::protocol::StreamOp)s, with
//!   entries deleted and Redis wiped between them.
//! * [`db`]: every declared statement, alone, fused into its batched form,
//!   and in mixed batches.
//! * [`race`]: every write that can hit a run, from every state the model
//!   can reach the run in, alone and racing another in a second session.

pub mod db;
pub mod limits;
pub mod lock_order;
pub mod race;
pub mod stream;

pub use db::{DbStep, START, db_case, db_sequence, migrated, run_db};
pub use stream::{run_stream, stream_case};

use proptest::test_runner::{Config, TestError, TestRunner};
use std::fmt::Debug;
use std::fmt::Write as _;

/// What a conformance run found.
#[derive(Debug)]
pub struct Outcome {
    /// Sequences run.
    pub cases: u32,
    /// The shrunk failing sequence, readable, if any.
    pub mismatch: Option<String>,
}

impl Outcome {
    fn of<T: Debug>(cases: u32, what: &str, result: Result<(), TestError<Vec<T>>>) -> Outcome {
        Outcome {
            cases,
            mismatch: match result {
                Ok(()) => None,
                Err(TestError::Fail(why, steps)) => {
                    let mut listed = String::new();
                    for (i, step) in steps.iter().enumerate() {
                        let _ = writeln!(listed, "  {:>2}. {step:?}", i + 1);
                    }
                    Some(format!(
                        "{why}\nshrunk sequence ({} {what}, from empty state):\n{listed}",
                        steps.len()
                    ))
                }
                Err(TestError::Abort(why)) => Some(format!("aborted: {why}")),
            },
        }
    }
}

fn runner(cases: u32, seed: u64) -> TestRunner {
    let mut seed_bytes = [0u8; 32];
    seed_bytes[..8].copy_from_slice(&seed.to_le_bytes());
    TestRunner::new_with_rng(
        Config {
            cases,
            failure_persistence: None,
            ..Config::default()
        },
        proptest::test_runner::TestRng::from_seed(
            proptest::test_runner::RngAlgorithm::ChaCha,
            &seed_bytes,
        ),
    )
}
