//! The reference models against the live servers: random command sequences
//! on `model::Stream` and on Redis, on `model::Db` and on Postgres, must
//! answer alike (see `pelican_tests::conformance`). `CONFORMANCE_CASES`
//! sets the number of sequences (default 1,000 each);
//! `cargo xtask conformance` runs the long mode.
#![allow(
    clippy::too_many_lines,
    reason = "a scenario, bench or check reads top to bottom as one script"
)]

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

/// The sweeper's walk: runs published in another order than their ids
/// come back oldest publication first, from the cursor on, in Postgres as
/// in the model (random sequences seldom publish two runs out of order).
#[test]
fn the_sweeper_walks_in_the_models_order() {
    use pelican_model::ids::{Dispatch, EntryId, RunId};
    use pelican_model::protocol::DbOp;
    use pelican_model::time::Timestamp;
    use pelican_tests::conformance::{DbStep, db_case, migrated};
    let db = Database::create();
    let pg = migrated(db.url());
    let publish = |run, ms| {
        DbStep::One(DbOp::MarkPublished {
            run: RunId(run),
            dispatch: Dispatch(1),
            entry: EntryId::new(ms, 0),
        })
    };
    let sweep = |after_published_ms, after, limit| {
        DbStep::One(DbOp::OrphanCandidates {
            grace_ms: 1_000,
            after_published_ms,
            after: RunId(after),
            limit,
        })
    };
    let steps = [
        insert_run(1),
        insert_run(2),
        insert_run(3),
        DbStep::Clock(Timestamp(2_000)),
        publish(3, 2_000),
        DbStep::Clock(Timestamp(3_000)),
        publish(1, 3_000),
        publish(2, 3_000),
        DbStep::Clock(Timestamp(9_000)),
        sweep(0, 0, 10),
        sweep(0, 0, 2),
        sweep(3_000, 1, 10),
        DbStep::Clock(Timestamp(3_500)),
        sweep(0, 0, 10),
    ];
    if let Err(e) = pelican_tests::rt().block_on(db_case(&pg, &steps)) {
        panic!("model::Db and Postgres differ on the sweeper's walk:\n{e}");
    }
}

/// A success is the run's row alone (schema version 14): read back, it is
/// the outcome of the attempt holding the run's fence and the run's last
/// event, in Postgres as in the model, after a lapsed attempt's takeover,
/// a stale completion, progress, and a retry, one success alone and one in
/// a batch (random sequences seldom reach a second attempt's success).
#[test]
fn a_success_is_read_from_the_runs_row() {
    use pelican_model::ids::{Dispatch, EntryId, Fence, RunId};
    use pelican_model::protocol::DbOp;
    use pelican_model::status::ErrorClass;
    use pelican_model::time::Timestamp;
    use pelican_tests::conformance::{DbStep, db_case, migrated};
    let db = Database::create();
    let pg = migrated(db.url());
    let one = DbStep::One;
    let (r1, r2) = (RunId(1), RunId(2));
    let (e1, e2, e3) = (
        EntryId::new(2_000, 0),
        EntryId::new(2_000, 1),
        EntryId::new(9_000, 0),
    );
    let publish = |run, dispatch, entry| {
        one(DbOp::MarkPublished {
            run,
            dispatch: Dispatch(dispatch),
            entry,
        })
    };
    let claim = |run, dispatch, entry, worker: &str| {
        one(DbOp::Claim {
            run,
            dispatch: Dispatch(dispatch),
            entry,
            worker: worker.into(),
            lease_ms: 1_000,
        })
    };
    let complete = |run, fence| DbOp::Complete {
        run,
        fence: Fence(fence),
        result: "ok".into(),
    };
    let read = |run| {
        [
            one(DbOp::ReadAttempts { run }),
            one(DbOp::ReadEvents {
                run,
                after: 0,
                limit: 100,
                bytes_max: u64::MAX,
            }),
            one(DbOp::ReadEvents {
                run,
                after: 3,
                limit: 1,
                bytes_max: u64::MAX,
            }),
            one(DbOp::ReadEvents {
                run,
                after: 0,
                limit: 100,
                bytes_max: 1,
            }),
        ]
    };
    let mut steps = vec![
        insert_run(1),
        insert_run(2),
        DbStep::Clock(Timestamp(2_000)),
        publish(r1, 1, e1),
        publish(r2, 1, e2),
        claim(r1, 1, e1, "w1"),
        claim(r2, 1, e2, "w1"),
        DbStep::Clock(Timestamp(4_000)),
        // The first attempt of run 1 lapsed: the second takes it over, and
        // the first's late success is refused.
        claim(r1, 1, e1, "w2"),
        one(complete(r1, 1)),
        one(DbOp::AppendEvent {
            run: r1,
            fence: Fence(2),
            data: "{}".into(),
        }),
        one(complete(r1, 2)),
        one(complete(r1, 2)),
        // Run 2 fails retryably, waits, and succeeds on its second dispatch.
        one(DbOp::ScheduleRetry {
            run: r2,
            fence: Fence(1),
            class: ErrorClass::Retryable,
            message: "again".into(),
            backoff_ms: 1_000,
        }),
    ];
    steps.extend(read(r1));
    steps.extend([
        DbStep::Clock(Timestamp(9_000)),
        one(DbOp::PromoteRetries { limit: 10 }),
        publish(r2, 2, e3),
        claim(r2, 2, e3, "w2"),
        DbStep::Batch(vec![complete(r2, 2), complete(r1, 1)]),
    ]);
    steps.extend(read(r2));
    if let Err(e) = pelican_tests::rt().block_on(db_case(&pg, &steps)) {
        panic!("model::Db and Postgres differ on a success:\n{e}");
    }
}

/// A worker of the release before schema version 14, still running while
/// a fleet is upgraded, completes a run with its own statement (which also
/// writes the attempt's `outcome` and `outcome_seq`): it succeeds, and the
/// run reads as if a current worker had completed it.
#[test]
fn a_success_written_by_the_previous_release_reads_the_same() {
    use pelican_model::ids::{Dispatch, EntryId, Fence, RunId};
    use pelican_model::protocol::DbOp;
    use pelican_tests::conformance::{DbStep, db_case, migrated};
    let db = Database::create();
    let pg = migrated(db.url());
    let entry = EntryId::new(2_000, 0);
    let steps = [
        insert_run(1),
        DbStep::One(DbOp::MarkPublished {
            run: RunId(1),
            dispatch: Dispatch(1),
            entry,
        }),
        DbStep::One(DbOp::Claim {
            run: RunId(1),
            dispatch: Dispatch(1),
            entry,
            worker: "w1".into(),
            lease_ms: 1_000,
        }),
    ];
    // That release's completion, as it sent it.
    const PREVIOUS_COMPLETE: &str = "WITH done AS ( \
        UPDATE runs SET status = 'succeeded', result = 'ok', lease_until = NULL, finished_at = pelican_now_ms(), \
               events = events + 1 \
         WHERE run_id = 1 AND active_fence = 1 AND status = 'running' RETURNING run_id, events) \
      UPDATE attempts a SET outcome = 'succeeded', outcome_seq = d.events FROM done d \
       WHERE a.run_id = d.run_id AND a.fence = 1";
    pelican_tests::rt().block_on(async {
        let mut model = match db_case(&pg, &steps).await {
            Ok(model) => model,
            Err(e) => panic!("before the completion: {e}"),
        };
        let complete = DbOp::Complete {
            run: RunId(1),
            fence: Fence(1),
            result: "ok".into(),
        };
        assert_eq!(
            model.execute(&complete),
            pelican_model::protocol::DbReply::Rows(1)
        );
        let written = pelican_real::live::pg::raw_execute(&pg, PREVIOUS_COMPLETE).await;
        assert!(
            matches!(written, Ok(1)),
            "the previous release's completion: {written:?}"
        );
        for op in [
            DbOp::ReadRun { run: RunId(1) },
            DbOp::ReadAttempts { run: RunId(1) },
            DbOp::ReadEvents {
                run: RunId(1),
                after: 0,
                limit: 100,
                bytes_max: u64::MAX,
            },
        ] {
            let got = pg.execute(&op).await.expect("Postgres answers");
            let mut want = model.execute(&op);
            if let (
                pelican_model::protocol::DbReply::Run(Some(w)),
                pelican_model::protocol::DbReply::Run(Some(g)),
            ) = (&mut want, &got)
            {
                // Stamped by each side's own clock.
                w.finished_at = g.finished_at;
            }
            assert_eq!(got, want, "{op:?}");
        }
    });
}

/// `TRUNCATE runs` (an operator's, not Pelican's) empties the live counts
/// with it: counted afterwards, no run is live.
#[test]
fn truncating_runs_empties_the_live_counts() {
    use pelican_tests::conformance::{DbStep, db_case, migrated};
    let db = Database::create();
    let pg = migrated(db.url());
    pelican_tests::rt().block_on(async {
        // Counted twice over: a base folded by the first statements, and
        // deltas on top of it.
        let steps: Vec<DbStep> = (1..=4).map(insert_run).collect();
        if let Err(e) = db_case(&pg, &steps).await {
            panic!("inserting runs: {e}");
        }
        pelican_real::live::pg::raw_execute(&pg, "TRUNCATE runs CASCADE")
            .await
            .expect("runs truncate");
        // Emptied again by deletes, which count nothing more, and compared
        // with an empty model.
        if let Err(e) = db_case(&pg, &[]).await {
            panic!("after TRUNCATE runs: {e}");
        }
    });
}

/// Delayed runs, and keys that outlive their runs, in Postgres as in the
/// model: a run inserted with `delay_ms` or `run_at_ms` waits `delayed`
/// until the retry pass queues it when due (a past `run_at_ms` is due at
/// once), is cancellable while it waits, its budget counts from its due
/// time, and the lag of the most overdue is read as the model reads it; a keyed insert whose key outlived its run (deleted by
/// retention) answers that run and inserts nothing, even under the same
/// run id.
#[test]
fn delayed_runs_and_kept_keys_answer_as_the_model() {
    use pelican_model::ids::{Dispatch, EntryId, Fence, RunId};
    use pelican_model::protocol::DbOp;
    use pelican_model::time::Timestamp;
    use pelican_tests::conformance::{DbStep, START, db_case, migrated};
    let db = Database::create();
    let pg = migrated(db.url());
    let one = DbStep::One;
    let insert = |run, delay_ms, at_ms, key: Option<&str>| {
        let (kind, input, trace) = ("noop".to_owned(), "{}".to_owned(), String::new());
        one(match key {
            None => DbOp::InsertRun {
                run: RunId(run),
                kind,
                input,
                attempts_max: 3,
                budget_ms: 5_000,
                trace,
                delay_ms,
                at_ms,
            },
            Some(key) => DbOp::InsertRunKeyed {
                run: RunId(run),
                kind,
                input,
                attempts_max: 3,
                budget_ms: 0,
                key: key.into(),
                trace,
                delay_ms,
                at_ms,
            },
        })
    };
    let at = START.as_ms();
    let steps = vec![
        DbStep::Clock(START),
        insert(1, 2_000, 0, None),
        insert(2, 0, at + 4_000, None),
        insert(3, 2_000, at + 1_000, Some("k3")),
        insert(4, 0, at / 2, None),
        insert(5, 3_000, 0, None),
        one(DbOp::Cancel { run: RunId(5) }),
        one(DbOp::DueLag),
        one(DbOp::PromoteRetries { limit: 10 }),
        DbStep::Clock(Timestamp(at + 2_000)),
        one(DbOp::PromoteRetries { limit: 1 }),
        one(DbOp::PromoteRetries { limit: 10 }),
        one(DbOp::Claim {
            run: RunId(3),
            dispatch: Dispatch(1),
            entry: EntryId::new(at + 2_000, 0),
            worker: "w1".into(),
            lease_ms: 1_000,
        }),
        one(DbOp::Complete {
            run: RunId(3),
            fence: Fence(1),
            result: "ok".into(),
        }),
        DbStep::Clock(Timestamp(at + 9_000)),
        one(DbOp::DueLag),
        one(DbOp::PromoteRetries { limit: 10 }),
        one(DbOp::DueLag),
        one(DbOp::DeleteFinished {
            keep_ms: 1_000,
            limit: 10,
        }),
        insert(3, 0, 0, Some("k3")),
        insert(6, 0, 0, Some("k3")),
    ];
    if let Err(e) = pelican_tests::rt().block_on(db_case(&pg, &steps)) {
        panic!("model::Db and Postgres differ: {e}");
    }
}

/// Schedules answer as the model's: a put numbers a new schedule (and
/// draws from the sequence when it replaces one), the scheduler's read
/// finds the due ones, a tick is handled once (a stale statement changes
/// nothing), catch-up `skip` counts a tick skipped, overlap `cancel`
/// cancels the live previous run with its event, overlap `skip` makes no
/// run beside a live one, and a delete leaves the runs.
#[test]
fn schedules_answer_as_the_model() {
    use pelican_model::protocol::DbOp;
    use pelican_model::schedule::{Catchup, Overlap, tick_run};
    use pelican_model::time::Timestamp;
    use pelican_tests::conformance::{DbStep, START, db_case, migrated};
    let db = Database::create();
    let pg = migrated(db.url());
    let one = DbStep::One;
    let put = |name: &str, overlap, catchup| {
        one(DbOp::PutSchedule {
            name: name.into(),
            kind: "noop".into(),
            input: "{}".into(),
            cron: "* * * * * *".into(),
            tz: "UTC".into(),
            overlap,
            catchup,
        })
    };
    let at = |s: u64| Timestamp(START.as_ms() + 1_000 * s);
    let fire =
        |name: &str, expect: Timestamp, tick: Timestamp, next: Timestamp, id: Option<u64>| {
            one(DbOp::FireTick {
                schedule: name.into(),
                expect,
                tick,
                next,
                run: id.map_or(pelican_model::ids::RunId(0), |id| tick_run(id, tick)),
                attempts_max: 3,
                budget_ms: 2_000,
            })
        };
    let zero = Timestamp::ZERO;
    let steps = vec![
        DbStep::Clock(START),
        put("a", Overlap::Cancel, Catchup::One),
        put("b", Overlap::Skip, Catchup::Skip),
        put("a", Overlap::Cancel, Catchup::One),
        one(DbOp::DueSchedules { limit: 1 }),
        one(DbOp::DueSchedules { limit: 10 }),
        fire("a", zero, zero, at(1), None),
        fire("b", zero, zero, at(1), None),
        one(DbOp::DueSchedules { limit: 10 }),
        DbStep::Clock(at(1)),
        one(DbOp::DueSchedules { limit: 10 }),
        fire("a", at(1), at(1), at(2), Some(1)),
        fire("a", at(1), at(1), at(2), Some(1)),
        fire("b", at(1), at(1), at(2), None),
        DbStep::Clock(at(2)),
        fire("a", at(2), at(2), at(3), Some(1)),
        fire("b", at(2), at(2), at(3), Some(2)),
        DbStep::Clock(at(3)),
        fire("b", at(3), at(3), at(4), Some(2)),
        one(DbOp::ListSchedules),
        one(DbOp::DeleteSchedule { name: "a".into() }),
        one(DbOp::DeleteSchedule { name: "a".into() }),
        one(DbOp::PromoteRetries { limit: 10 }),
        one(DbOp::ListSchedules),
    ];
    if let Err(e) = pelican_tests::rt().block_on(db_case(&pg, &steps)) {
        panic!("model::Db and Postgres differ: {e}");
    }
}

/// A run of kind `noop` inserted, as the API inserts one.
fn insert_run(run: u64) -> pelican_tests::conformance::DbStep {
    use pelican_model::ids::RunId;
    use pelican_model::protocol::DbOp;
    pelican_tests::conformance::DbStep::One(DbOp::InsertRun {
        run: RunId(run),
        kind: "noop".into(),
        input: "{}".into(),
        attempts_max: 3,
        budget_ms: 0,
        trace: String::new(),
        delay_ms: 0,
        at_ms: 0,
    })
}
