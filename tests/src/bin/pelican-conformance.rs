//! `pelican-conformance [--cases N] [--seed S] [--json]`: the long mode of
//! the differential tests (`cargo xtask conformance`). Starts its own Redis,
//! creates its own database on `PELICAN_TEST_PG`, runs N random stream
//! sequences and N random database sequences (default 10,000 each, the two
//! kinds in parallel), then every write from every reachable run state,
//! alone and racing in two sessions (`conformance::race`), and two fused
//! batches in opposite orders (`conformance::lock_order`), and prints any
//! shrunk mismatch.
#![allow(
    clippy::too_many_lines,
    reason = "a scenario, bench or check reads top to bottom as one script"
)]

use pelican_tests::conformance::{run_db, run_stream};
use pelican_tests::{Database, Redis};
use std::process::ExitCode;
use std::time::Instant;

fn main() -> ExitCode {
    let mut cases: u32 = 10_000;
    let mut seed: u64 = 1;
    let mut json = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let value = |args: &mut dyn Iterator<Item = String>, name: &str| {
            args.next()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or_else(|| {
                    eprintln!("pelican-conformance: {name} needs a number");
                    std::process::exit(2)
                })
        };
        match a.as_str() {
            "--cases" => cases = u32::try_from(value(&mut args, "--cases")).unwrap_or(u32::MAX),
            "--seed" => seed = value(&mut args, "--seed"),
            "--json" => json = true,
            "-h" | "--help" => {
                println!("usage: pelican-conformance [--cases N] [--seed S] [--json]");
                return ExitCode::SUCCESS;
            }
            other => {
                eprintln!("pelican-conformance: unknown argument {other:?}");
                return ExitCode::from(2);
            }
        }
    }
    let started = Instant::now();
    let redis = Redis::start();
    let db = Database::create();
    let url = redis.url();
    let stream = std::thread::spawn(move || run_stream(&url, cases, seed));
    let dbo = run_db(db.url(), cases, seed);
    let so = stream.join().expect("the stream run does not panic");
    let raced = Database::create();
    let race = pelican_tests::conformance::race::run(raced.url());
    let lock_order = pelican_tests::conformance::lock_order::opposite_batches(
        raced.url(),
        pelican_tests::conformance::lock_order::Binding::Pelican,
    );
    let seconds = started.elapsed().as_secs_f64();
    let mut mismatches = 0;
    for (what, o) in [
        ("model::Stream vs Redis", &so),
        ("model::Db vs Postgres", &dbo),
    ] {
        match &o.mismatch {
            None => println!("{what}: {} sequences, no difference", o.cases),
            Some(m) => {
                mismatches += 1;
                println!("{what}: DIFFERENT\n{m}");
            }
        }
    }
    println!("model::Db vs Postgres, every run state, two sessions racing:\n{race}");
    for f in &race.failures {
        println!("  DIFFERENT: {f}");
    }
    if !race.failures.is_empty() {
        mismatches += 1;
    }
    match &lock_order {
        Ok(()) => {
            println!("fused batches in opposite orders: the model's serial order, no deadlock");
        }
        Err(e) => {
            mismatches += 1;
            println!("fused batches in opposite orders: DIFFERENT: {e}");
        }
    }
    println!("{seconds:.1} s");
    if json {
        println!(
            "{}",
            serde_json::json!({
                "stream_cases": so.cases,
                "db_cases": dbo.cases,
                "race_states": race.classes,
                "races": race.races,
                "races_waited": race.waited,
                "mismatches": mismatches,
                "seconds": seconds,
            })
        );
    }
    if mismatches == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
