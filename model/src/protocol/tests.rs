//! The roles, one behaviour per test, driven against the reference world.

use super::*;
use crate::ids::{AttemptNo, Dispatch, EntryId, RunId, WorkerId};
use crate::status::{ErrorClass, JobOutcome, RunStatus};
use crate::stream::Trim;
use crate::time::Timestamp;
use crate::world::{Issuer, World};
use std::collections::BTreeSet;

const T0: Timestamp = Timestamp(1_000_000);

fn policy() -> Policy {
    Policy {
        attempts_max: 2,
        ..Policy::default()
    }
}

fn ok() -> JobOutcome {
    JobOutcome::Succeeded {
        result: "42".into(),
    }
}

fn failed(class: ErrorClass) -> JobOutcome {
    JobOutcome::Failed {
        class,
        message: "boom".into(),
    }
}

/// Submits `run` through the Submitter; returns its entry.
fn submit(world: &mut World, run: u64) -> EntryId {
    let mut s = Submitter::new(&policy(), RunId(run), "noop", "{}", None);
    while let Some(c) = s.poll() {
        let input = exec(world, &c, Issuer::default());
        s.handle(T0, input);
    }
    assert_eq!(s.end(), Some(SubmitterEnd::Accepted { published: true }));
    world.db.runs[&RunId(run)].entry_id.expect("published")
}

fn exec(world: &mut World, c: &Command, by: Issuer) -> Input {
    match c {
        Command::Db(op) => Input::Db(world.db(op, by)),
        Command::Stream(op) => Input::Stream(world.stream(op, by)),
        other => panic!("not an I/O command: {other:?}"),
    }
}

/// Publishes `entry` straight to partition 0, as a duplicate or foreign
/// publisher would.
fn publish(world: &mut World, entry: JobEntry, now: Timestamp) {
    let op = StreamOp::Publish {
        partition: 0,
        entry,
        now,
    };
    world.stream(&op, Issuer::default()).expect("published");
}

/// Reads one entry as worker `w`.
fn read(world: &mut World, w: u32) -> (EntryId, JobEntry) {
    let op = StreamOp::Read {
        partition: 0,
        consumer: WorkerId(w).consumer(),
        count: 1,
        now: T0,
    };
    match world.stream(&op, Issuer::default()) {
        Ok(StreamReply::Entries(mut v)) => v.pop().expect("an entry to read"),
        other => panic!("{other:?}"),
    }
}

/// Drives `d` until it ends, answering its job with `outcome` (None: the job
/// never ends, the delivery must end on its own).
fn drive(world: &mut World, d: &mut Delivery, mut outcome: Option<JobOutcome>) -> DeliveryEnd {
    for _ in 0..50 {
        if let Some(end) = d.end() {
            assert!(d.poll().is_none(), "commands left after the end");
            return end;
        }
        let Some(c) = d.poll() else {
            let out = outcome.take().expect("the delivery waits for its job");
            d.handle(T0, Input::Executed(out));
            continue;
        };
        match c {
            Command::Execute(e) => world.check_execution(e.run, d.own_fence()),
            Command::SetTimer(_) | Command::Abort => {}
            c => {
                let by = Issuer {
                    worker: None,
                    own_fence: d.own_fence(),
                };
                let input = exec(world, &c, by);
                d.handle(T0, input);
            }
        }
    }
    panic!("the delivery did not end");
}

/// Worker `w`'s reclaimer takes one idle entry at `now`.
fn reclaim_one(world: &mut World, w: u32, now: Timestamp) -> (EntryId, JobEntry) {
    let mut r = Reclaimer::new(&policy(), WorkerId(w));
    r.start(now, 1);
    let c = r.poll().unwrap();
    let input = exec(world, &c, Issuer::default());
    r.handle(now, input);
    match r.poll_event() {
        Some(ReclaimerEvent::Deliver(id, job)) => (id, job),
        other => panic!("nothing reclaimed: {other:?}"),
    }
}

fn deliver(world: &mut World, w: u32, outcome: Option<JobOutcome>) -> (EntryId, DeliveryEnd) {
    let (id, job) = read(world, w);
    let mut d = Delivery::new(T0, &policy(), WorkerId(w), id, job, 7);
    (id, drive(world, &mut d, outcome))
}

#[test]
fn success_is_written_then_acked() {
    let mut world = World::at(T0);
    submit(&mut world, 1);
    let (_, end) = deliver(&mut world, 0, Some(ok()));
    assert_eq!(end, DeliveryEnd::Acked(AckReason::Written));
    let r = &world.db.runs[&RunId(1)];
    assert_eq!(
        (r.status, r.result.as_deref()),
        (RunStatus::Succeeded, Some("42"))
    );
    assert_eq!(world.redis.pel_len(), 0);
    assert!(world.violations.is_empty(), "{:?}", world.violations);
}

/// Values Postgres cannot store fail the run at once, as `unstorable`: a
/// result or message it refuses (a NUL byte), and one over the policy's
/// size limit.
#[test]
fn unstorable_outcomes_fail_the_run_on_their_attempt() {
    let too_long = "x".repeat(policy().value_bytes_max + 1);
    let outcomes = [
        JobOutcome::Succeeded {
            result: "\"a\u{0}\"".into(),
        },
        JobOutcome::Failed {
            class: ErrorClass::Retryable,
            message: "a\u{0}".into(),
        },
        JobOutcome::Failed {
            class: ErrorClass::Terminal,
            message: "a\u{0}".into(),
        },
        JobOutcome::Succeeded { result: too_long },
    ];
    for (i, outcome) in outcomes.into_iter().enumerate() {
        let mut world = World::at(T0);
        submit(&mut world, 1);
        let (_, end) = deliver(&mut world, 0, Some(outcome));
        assert_eq!(end, DeliveryEnd::Acked(AckReason::Written), "case {i}");
        let r = &world.db.runs[&RunId(1)];
        assert_eq!((r.status, r.attempts), (RunStatus::Failed, 1), "case {i}");
        assert_eq!(
            r.error.as_ref().map(|e| e.0),
            Some(ErrorClass::Unstorable),
            "case {i}"
        );
        assert!(world.violations.is_empty(), "{:?}", world.violations);
    }
}

#[test]
fn a_redelivered_finished_run_is_acked_without_running() {
    let mut world = World::at(T0);
    let id = submit(&mut world, 1);
    let (_, end) = deliver(&mut world, 0, Some(ok()));
    assert_eq!(end, DeliveryEnd::Acked(AckReason::Written));
    // The entry comes back (say the ack's reply was lost and it was
    // reclaimed): the claim is refused, the run is terminal, ack.
    let job = world.entries[&id].clone();
    let mut d = Delivery::new(T0, &policy(), WorkerId(1), id, job, 0);
    assert_eq!(
        drive(&mut world, &mut d, None),
        DeliveryEnd::Acked(AckReason::Terminal)
    );
    assert!(world.violations.is_empty(), "{:?}", world.violations);
}

#[test]
fn retryable_failure_schedules_a_durable_retry_with_backoff() {
    let mut world = World::at(T0);
    submit(&mut world, 1);
    let (_, end) = deliver(&mut world, 0, Some(failed(ErrorClass::Retryable)));
    assert_eq!(end, DeliveryEnd::Acked(AckReason::Written));
    let r = world.db.runs[&RunId(1)].clone();
    assert_eq!((r.status, r.dispatch), (RunStatus::RetryWait, Dispatch(2)));
    let backoff = r.retry_at.unwrap().ms_since(T0);
    assert!(
        (500..=1_000).contains(&backoff),
        "first retry after {backoff} ms"
    );
    // Maintenance promotes it when due and publishes the new dispatch.
    let mut m = Maintenance::new(&policy());
    world.db.clock = r.retry_at.unwrap();
    for task in [MaintenanceTask::Retries, MaintenanceTask::Outbox] {
        m.start(task, T0);
        while let Some(c) = m.poll() {
            let input = exec(&mut world, &c, Issuer::default());
            m.handle(T0, input);
        }
    }
    let (_, job) = read(&mut world, 1);
    assert_eq!(
        job,
        JobEntry::Job {
            run: RunId(1),
            dispatch: Dispatch(2)
        }
    );
}

/// A delayed submission publishes nothing; the retry pass publishes it
/// once due, and not before. The mutant's twin starts it early (S15).
#[test]
fn a_delayed_run_is_published_when_due() {
    let mut world = World::at(T0);
    let delay = crate::db::Delay {
        delay_ms: 5_000,
        at_ms: 0,
    };
    let mut s = Submitter::new(&policy(), RunId(1), "noop", "{}", None).delayed(delay);
    while let Some(c) = s.poll() {
        assert!(matches!(c, Command::Db(_)), "no publication: {c:?}");
        let input = exec(&mut world, &c, Issuer::default());
        s.handle(T0, input);
    }
    assert_eq!(s.end(), Some(SubmitterEnd::Accepted { published: false }));
    let promote = |world: &mut World| {
        let mut m = Maintenance::new(&policy());
        m.start(MaintenanceTask::Retries, T0);
        while let Some(c) = m.poll() {
            let input = exec(world, &c, Issuer::default());
            m.handle(T0, input);
        }
    };
    world.db.clock = T0.add_ms(4_999);
    promote(&mut world);
    assert_eq!(world.db.runs[&RunId(1)].status, RunStatus::Delayed);
    assert_eq!(world.redis.part(0).len(), 0);
    world.db.clock = T0.add_ms(5_000);
    promote(&mut world);
    let (_, job) = read(&mut world, 1);
    assert_eq!(
        job,
        JobEntry::Job {
            run: RunId(1),
            dispatch: Dispatch(1)
        }
    );
    assert!(world.violations.is_empty(), "{:?}", world.violations);
}

#[test]
fn the_last_attempt_dead_letters_and_notifies() {
    let mut world = World::at(T0);
    world.db.insert_run(RunId(1), "noop", "{}", 1);
    let entry = JobEntry::Job {
        run: RunId(1),
        dispatch: Dispatch(1),
    };
    publish(&mut world, entry, T0);
    let (id, end) = deliver(&mut world, 0, Some(failed(ErrorClass::Panic)));
    assert_eq!(end, DeliveryEnd::Acked(AckReason::Written));
    assert_eq!(world.db.runs[&RunId(1)].status, RunStatus::Dead);
    let dl = &world.db.dead_letters[&RunId(1)];
    assert_eq!((dl.class, dl.source_entry), (ErrorClass::Panic, Some(id)));
    assert_eq!(world.redis.dead.len(), 1);
}

#[test]
fn terminal_failure_is_not_retried() {
    let mut world = World::at(T0);
    submit(&mut world, 1);
    deliver(&mut world, 0, Some(failed(ErrorClass::Terminal)));
    let r = &world.db.runs[&RunId(1)];
    assert_eq!((r.status, r.attempts), (RunStatus::Failed, 1));
}

#[test]
fn a_late_write_is_rejected_and_the_late_worker_does_not_ack() {
    let mut world = World::at(T0);
    let id = submit(&mut world, 1);
    let (_, job) = read(&mut world, 0);
    let mut late = Delivery::new(T0, &policy(), WorkerId(0), id, job.clone(), 0);
    // Claim, start the job, then stall.
    let claim = late.poll().unwrap();
    let input = exec(&mut world, &claim, Issuer::default());
    late.handle(T0, input);
    assert!(late.is_executing());
    // Long past the lease, another worker reclaims and takes over.
    let later = T0.add_ms(policy().lease_ms + policy().reclaim_min_idle_ms);
    world.db.clock = later;
    let (rid, rjob) = reclaim_one(&mut world, 1, later);
    let mut fresh = Delivery::new(later, &policy(), WorkerId(1), rid, rjob, 0);
    let c = fresh.poll().unwrap();
    let input = exec(&mut world, &c, Issuer::default());
    fresh.handle(later, input);
    assert_eq!(fresh.own_fence(), Some(Fence(2)));
    // The late worker finishes: its write is rejected and it leaves the
    // entry to the new owner.
    while late.poll().is_some() {}
    late.handle(later, Input::Executed(ok()));
    let end = drive(&mut world, &mut late, None);
    assert_eq!(end, DeliveryEnd::LeftPending(PendingReason::OwnedElsewhere));
    assert!(world.redis.pending(id).is_some());
    assert!(world.violations.is_empty(), "{:?}", world.violations);
    assert_eq!(world.db.runs[&RunId(1)].status, RunStatus::Running);
}

#[test]
fn malformed_entries_and_unknown_runs_are_quarantined() {
    let mut world = World::at(T0);
    let bad = JobEntry::Malformed {
        reason: "missing run_id".into(),
    };
    publish(&mut world, bad, T0);
    let (_, end) = deliver(&mut world, 0, None);
    assert_eq!(end, DeliveryEnd::Acked(AckReason::Quarantined));
    let ghost = JobEntry::Job {
        run: RunId(99),
        dispatch: Dispatch(1),
    };
    publish(&mut world, ghost, T0);
    let (_, end) = deliver(&mut world, 0, None);
    assert_eq!(end, DeliveryEnd::Acked(AckReason::Quarantined));
    assert_eq!(world.redis.dead.len(), 2);
    assert_eq!(world.redis.pel_len(), 0);
    assert!(world.violations.is_empty(), "{:?}", world.violations);
}

#[test]
fn a_duplicate_publication_is_acked_while_the_original_runs() {
    let mut world = World::at(T0);
    submit(&mut world, 1);
    let dup = JobEntry::Job {
        run: RunId(1),
        dispatch: Dispatch(1),
    };
    publish(&mut world, dup, T0);
    let (id, job) = read(&mut world, 0);
    let mut d = Delivery::new(T0, &policy(), WorkerId(0), id, job, 0);
    let c = d.poll().unwrap();
    let input = exec(&mut world, &c, Issuer::default());
    d.handle(T0, input);
    let (dup_id, end) = deliver(&mut world, 1, None);
    assert_eq!(end, DeliveryEnd::Acked(AckReason::Duplicate));
    assert!(world.redis.pending(dup_id).is_none());
    assert_eq!(
        drive(&mut world, &mut d, Some(ok())),
        DeliveryEnd::Acked(AckReason::Written)
    );
    assert_eq!(world.redis.pel_len(), 0);
    assert!(world.violations.is_empty(), "{:?}", world.violations);
}

/// Found by the simulator: a run's lapsed attempt was taken over through a
/// duplicate publication, and then through its first entry again, while a
/// stale delivery of that first entry, which had read the run running under
/// the duplicate, acknowledged it; the acknowledgement dropped the entry of
/// a running attempt (S4). A lapsed attempt is taken over only through its
/// own entry: a duplicate is acknowledged, and a reclaim of the first entry
/// takes over.
#[test]
fn a_duplicate_does_not_take_over_a_lapsed_attempt() {
    let mut world = World::at(T0);
    let first = submit(&mut world, 1);
    let dup = JobEntry::Job {
        run: RunId(1),
        dispatch: Dispatch(1),
    };
    publish(&mut world, dup, T0);
    // Worker 0 claims through the first entry and stalls.
    let (id, job) = read(&mut world, 0);
    assert_eq!(id, first);
    let mut late = Delivery::new(T0, &policy(), WorkerId(0), id, job, 0);
    let claim = late.poll().unwrap();
    let input = exec(&mut world, &claim, Issuer::default());
    late.handle(T0, input);
    while late.poll().is_some() {}
    // Past its lease, the duplicate's claim is refused: it is acknowledged.
    let t1 = T0.add_ms(policy().lease_ms + 1);
    world.db.clock = t1;
    let (dup_id, end) = deliver(&mut world, 1, None);
    assert_eq!(end, DeliveryEnd::Acked(AckReason::Duplicate));
    assert!(world.redis.pending(dup_id).is_none());
    let row = &world.db.runs[&RunId(1)];
    assert_eq!((row.active_fence, row.entry_id), (Fence(1), Some(first)));
    // A reclaim of the first entry takes over and finishes the run.
    let t2 = T0.add_ms(policy().lease_ms + policy().reclaim_min_idle_ms);
    world.db.clock = t2;
    let (rid, rjob) = reclaim_one(&mut world, 2, t2);
    assert_eq!(rid, first);
    let mut fresh = Delivery::new(t2, &policy(), WorkerId(2), rid, rjob, 0);
    let end = drive(&mut world, &mut fresh, Some(ok()));
    assert_eq!(end, DeliveryEnd::Acked(AckReason::Written));
    assert_eq!(world.db.runs[&RunId(1)].status, RunStatus::Succeeded);
    // Worker 0 resumes: its write is refused, and the run is terminal.
    let end = drive(&mut world, &mut late, Some(ok()));
    assert_eq!(end, DeliveryEnd::Acked(AckReason::Terminal));
    assert_eq!(world.redis.pel_len(), 0);
    assert!(world.violations.is_empty(), "{:?}", world.violations);
}

#[test]
fn a_cancelled_run_stops_at_its_heartbeat() {
    let mut world = World::at(T0);
    submit(&mut world, 1);
    let (id, job) = read(&mut world, 0);
    let mut d = Delivery::new(T0, &policy(), WorkerId(0), id, job, 0);
    let c = d.poll().unwrap();
    let input = exec(&mut world, &c, Issuer::default());
    d.handle(T0, input);
    assert_eq!(
        world.db(&DbOp::Cancel { run: RunId(1) }, Issuer::default()),
        DbReply::Rows(1)
    );
    while d.poll().is_some() {}
    d.handle(T0, Input::Timer);
    let mut aborted = false;
    while let Some(c) = d.poll() {
        if c == Command::Abort {
            aborted = true;
            continue;
        }
        let input = exec(&mut world, &c, Issuer::default());
        d.handle(T0, input);
    }
    assert!(aborted, "the job was not stopped");
    assert_eq!(d.end(), Some(DeliveryEnd::Acked(AckReason::Terminal)));
    assert_eq!(world.db.runs[&RunId(1)].status, RunStatus::Cancelled);
}

#[test]
fn the_reclaimer_holds_deleted_ids_until_recovered() {
    let mut world = World::at(T0);
    let id = submit(&mut world, 1);
    let (_, job) = read(&mut world, 0);
    let mut d = Delivery::new(T0, &policy(), WorkerId(0), id, job, 0);
    let c = d.poll().unwrap();
    let input = exec(&mut world, &c, Issuer::default());
    d.handle(T0, input);
    // The worker dies; the stream is trimmed below its pending entry.
    world.redis.part_mut(0).xtrim(Trim::MaxLen(0));
    let mut r = Reclaimer::new(&policy(), WorkerId(1));
    let by = Issuer {
        worker: Some(WorkerId(1)),
        own_fence: None,
    };
    // Not idle long enough yet: the pass looks no further than XPENDING.
    let soon = T0.add_ms(policy().reclaim_min_idle_ms - 1);
    world.db.clock = soon;
    r.start(soon, 1);
    let c = r.poll().unwrap();
    let input = exec(&mut world, &c, by);
    r.handle(soon, input);
    assert_eq!(r.poll_event(), None);
    assert_eq!(world.redis.part_mut(0).pel_len(), 1);
    let later = T0.add_ms(policy().reclaim_min_idle_ms);
    world.db.clock = later;
    r.start(later, 1);
    let c = r.poll().unwrap();
    let input = exec(&mut world, &c, by);
    r.handle(later, input);
    assert_eq!(r.poll_event(), Some(ReclaimerEvent::Trimmed(id)));
    assert_eq!(r.unrecovered().collect::<Vec<_>>(), vec![id]);
    // The recovery's reply is lost: still held, retried next round.
    let c = r.poll().unwrap();
    r.handle(later, Input::Unavailable);
    assert_eq!(r.unrecovered().count(), 1);
    r.start(later, 1);
    let c2 = r.poll().unwrap();
    assert_eq!(c, c2);
    let input = exec(&mut world, &c2, by);
    r.handle(later, input);
    assert_eq!(r.unrecovered().count(), 0);
    let run = &world.db.runs[&RunId(1)];
    assert_eq!(
        (run.status, run.dispatch, run.published_at),
        (RunStatus::Queued, Dispatch(2), None)
    );
    assert_eq!(world.db.attempts[&(RunId(1), AttemptNo(1))].outcome, None);
}

#[test]
fn a_keyed_retry_answers_the_first_run() {
    let mut world = World::at(T0);
    let keyed = |world: &mut World, run: u64, input: &str| {
        let mut s = Submitter::new(&policy(), RunId(run), "noop", input, Some("k1"));
        while let Some(c) = s.poll() {
            let input = exec(world, &c, Issuer::default());
            s.handle(T0, input);
        }
        s.end().expect("ended")
    };
    assert_eq!(
        keyed(&mut world, 1, "{}"),
        SubmitterEnd::Accepted { published: true }
    );
    assert_eq!(keyed(&mut world, 2, "{}"), SubmitterEnd::Existing(RunId(1)));
    assert_eq!(
        keyed(&mut world, 3, "{\"a\":1}"),
        SubmitterEnd::KeyConflict(RunId(1))
    );
    assert_eq!(world.db.runs.len(), 1, "one run for one key");
    assert_eq!(world.db.expire_keys(T0, 10), 1);
    assert_eq!(
        keyed(&mut world, 4, "{}"),
        SubmitterEnd::Accepted { published: true },
        "an expired key is new again"
    );
}

#[test]
fn a_lost_publish_is_left_to_the_outbox() {
    let mut world = World::at(T0);
    let mut s = Submitter::new(&policy(), RunId(1), "noop", "{}", None);
    let insert = s.poll().unwrap();
    let input = exec(&mut world, &insert, Issuer::default());
    s.handle(T0, input);
    assert!(s.is_accepted());
    let _publish = s.poll().unwrap();
    s.handle(T0, Input::Unavailable);
    assert_eq!(s.end(), Some(SubmitterEnd::Accepted { published: false }));
    let mut m = Maintenance::new(&policy());
    m.start(MaintenanceTask::Outbox, T0);
    while let Some(c) = m.poll() {
        let input = exec(&mut world, &c, Issuer::default());
        m.handle(T0, input);
    }
    assert!(world.db.runs[&RunId(1)].published_at.is_some());
    assert_eq!(world.redis.part(0).len(), 1);
}

#[test]
fn backoff_is_exponential_capped_and_jittered_within_bounds() {
    let p = Policy {
        backoff_base_ms: 100,
        backoff_cap_ms: 1_000,
        ..Policy::default()
    };
    for entropy in [0, 1, 17, u64::MAX] {
        for (attempt, exp) in [
            (1, 100),
            (2, 200),
            (3, 400),
            (4, 800),
            (5, 1_000),
            (40, 1_000),
        ] {
            let b = p.backoff_ms("noop", attempt, entropy);
            assert!(
                (exp / 2..=exp).contains(&b),
                "attempt {attempt}: {b} not in {}..={exp}",
                exp / 2
            );
        }
    }
}

#[test]
fn idempotency_keys_are_stable_across_attempts() {
    let p = policy();
    assert_eq!(
        p.idempotency_key(RunId(3), 1, Fence(1)),
        p.idempotency_key(RunId(3), 1, Fence(9))
    );
    assert_ne!(
        p.idempotency_key(RunId(3), 1, Fence(1)),
        p.idempotency_key(RunId(3), 2, Fence(1))
    );
}

#[cfg(feature = "mutants")]
#[test]
fn every_mutant_name_parses() {
    for &m in Mutant::ALL {
        assert_eq!(m.name().parse::<Mutant>(), Ok(m));
        assert_eq!(m.name().to_lowercase().parse::<Mutant>(), Ok(m));
    }
    assert_eq!(Mutant::ALL.len(), 24);
    assert!("Bare".parse::<Mutant>().is_err());
}

#[cfg(not(feature = "mutants"))]
#[test]
fn a_build_without_mutants_names_none() {
    assert!(Mutant::ALL.is_empty());
    let err = "NoFence".parse::<Mutant>().expect_err("no mutants here");
    assert!(err.to_string().contains("--features mutants"), "{err}");
}

/// A backlog older than the sweep grace stays candidates pass after pass
/// (its entries are still to be read); the cursor takes the sweeper past
/// it to the run whose entry Redis lost.
#[test]
fn the_sweeper_walks_past_candidates_that_stay_candidates() {
    let p = Policy {
        sweep_batch_max: 2,
        ..policy()
    };
    let mut world = World::at(T0);
    for run in 1..=5 {
        submit(&mut world, run);
    }
    assert!(
        world.redis.part_mut(0).lose_newest(),
        "run 5's entry is gone"
    );
    world.db.clock = T0.add_ms(p.sweep_grace_ms);
    let mut m = Maintenance::new(&p);
    for _ in 0..3 {
        m.start(MaintenanceTask::Sweep, T0);
        while let Some(c) = m.poll() {
            let input = exec(&mut world, &c, Issuer::default());
            m.handle(T0, input);
        }
    }
    let dispatches: Vec<u32> = world.db.runs.values().map(|r| r.dispatch.0).collect();
    assert_eq!(dispatches, [1, 1, 1, 1, 2], "only run 5 is re-dispatched");
}

/// A delivery for a run retention deleted is acknowledged as stale; one for
/// a run id never handed out is quarantined.
#[test]
fn a_delivery_for_a_deleted_run_is_stale() {
    let mut world = World::at(T0);
    let id = world.db.next_run_id();
    assert_eq!(id, RunId(1));
    submit(&mut world, 1);
    let (_, end) = deliver(&mut world, 0, Some(ok()));
    assert_eq!(end, DeliveryEnd::Acked(AckReason::Written));
    world.db.clock = T0.add_ms(10);
    let op = DbOp::DeleteFinished {
        keep_ms: 10,
        limit: 10,
    };
    assert_eq!(
        exec(&mut world, &Command::Db(op), Issuer::default()),
        Input::Db(DbReply::Rows(1))
    );
    assert_eq!(world.retired[&RunId(1)], RunStatus::Succeeded);
    let now = world.db.clock;
    for (run, why) in [(1, AckReason::Stale), (7, AckReason::Quarantined)] {
        let entry = JobEntry::Job {
            run: RunId(run),
            dispatch: Dispatch(1),
        };
        publish(&mut world, entry, now);
        let (_, end) = deliver(&mut world, 0, None);
        assert_eq!(end, DeliveryEnd::Acked(why));
    }
    assert!(world.violations.is_empty(), "{:?}", world.violations);
}

#[test]
fn a_recorded_step_is_replayed_and_an_unrecorded_one_runs() {
    use crate::db::{QueryError, Statement, StepRow, Unfit};
    let p = policy();
    let row = |name: &str| StepRow {
        name: name.into(),
        output: "1".into(),
        fence: Fence(1),
    };
    let mut l = Ledger::new(&p, RunId(1), Fence(2), vec![(0, row("fetch"))]);
    assert_eq!(l.plan("fetch"), Ok(StepPlan::Replay("1".into())));
    assert_eq!(l.plan("send"), Ok(StepPlan::Run(1)));
    assert_eq!(
        l.record(1, "send", "true".into()),
        Ok(crate::db::query::RecordStep {
            run: RunId(1),
            fence: Fence(2),
            step: 1,
            name: "send".into(),
            output: "true".into(),
        })
    );
    assert_eq!(l.recorded("send", Ok(1)), Ok(()));
    assert!(matches!(
        l.recorded("send", Ok(0)),
        Err(StepError::NotRecorded { .. })
    ));
    assert!(matches!(
        l.recorded("send", Err(QueryError::Unavailable(Unavailable))),
        Err(StepError::Unavailable { .. })
    ));
    let refused = l
        .recorded("se\0nd", Err(Unfit::Refused(Statement::RecordStep).into()))
        .unwrap_err();
    assert!(matches!(
        refused.outcome(),
        JobOutcome::Failed {
            class: ErrorClass::Unstorable,
            ..
        }
    ));
}

#[test]
fn steps_asked_in_another_order_fail_the_run() {
    use crate::db::StepRow;
    let p = policy();
    let recorded = StepRow {
        name: "fetch".into(),
        output: "1".into(),
        fence: Fence(1),
    };
    let mut l = Ledger::new(&p, RunId(1), Fence(2), vec![(0, recorded)]);
    let e = l.plan("send").unwrap_err();
    assert!(matches!(
        e.outcome(),
        JobOutcome::Failed {
            class: ErrorClass::Terminal,
            ..
        }
    ));
    assert!(e.to_string().contains("same order"), "{e}");
}

#[test]
fn a_step_output_over_the_limit_is_unstorable() {
    let p = policy();
    let l = Ledger::new(&p, RunId(1), Fence(1), Vec::new());
    let e = l
        .record(0, "big", "x".repeat(p.value_bytes_max + 1))
        .unwrap_err();
    assert!(matches!(
        e.outcome(),
        JobOutcome::Failed {
            class: ErrorClass::Unstorable,
            ..
        }
    ));
}

#[test]
fn only_the_current_fence_records_a_step_and_a_record_stays() {
    let mut db = crate::Db::new();
    db.insert_run(RunId(1), "steps", "{}", 3);
    let e = EntryId::new(1, 0);
    assert!(
        db.claim(RunId(1), Dispatch(1), e, "w", Timestamp(0), 10)
            .is_some()
    );
    assert_eq!(
        db.record_step(RunId(1), Fence(0), 0, "a", "1"),
        0,
        "stale fence"
    );
    assert_eq!(db.record_step(RunId(1), Fence(1), 0, "a", "1"), 1);
    assert_eq!(
        db.record_step(RunId(1), Fence(1), 0, "a", "2"),
        0,
        "never replaced"
    );
    assert_eq!(db.read_steps(RunId(1))[0].1.output, "1");
}

/// A kind's budget, by Postgres's clock: a claim within it runs the job
/// with what is left as its time limit; a claim after it fails the run as
/// `budget_exhausted` without running the job, attempts left or not.
#[test]
fn a_spent_budget_fails_the_run_without_running_it() {
    let mut p = policy();
    p.attempts_max = 5;
    let budget = KindPolicy {
        budget_ms: Some(10_000),
        attempt_timeout_ms: Some(4_000),
        ..KindPolicy::default()
    };
    p.kinds.insert("noop".into(), budget);
    let mut world = World::at(T0);
    let mut s = Submitter::new(&p, RunId(1), "noop", "{}", None);
    while let Some(c) = s.poll() {
        let input = exec(&mut world, &c, Issuer::default());
        s.handle(T0, input);
    }
    assert_eq!(world.db.runs[&RunId(1)].deadline, Some(T0.add_ms(10_000)));
    // Within the budget: the attempt timeout is the tighter limit.
    let (id, job) = read(&mut world, 0);
    let mut d = Delivery::new(T0, &p, WorkerId(0), id, job, 7);
    let execution = loop {
        match d.poll().expect("the delivery claims, then runs the job") {
            Command::Execute(e) => break e,
            c => {
                let by = Issuer {
                    worker: None,
                    own_fence: d.own_fence(),
                };
                let input = exec(&mut world, &c, by);
                d.handle(T0, input);
            }
        }
    };
    let limit = |ms, class| Some(TimeLimit { ms, class });
    assert_eq!(execution.limit, limit(4_000, ErrorClass::Retryable));
    world.db.clock = T0.add_ms(7_000);
    d.handle(T0, Input::Executed(failed(ErrorClass::Retryable)));
    assert_eq!(
        drive(&mut world, &mut d, None),
        DeliveryEnd::Acked(AckReason::Written)
    );
    // The retry is due once the budget is spent.
    world.db.clock = T0.add_ms(10_000);
    world.db.promote(T0.add_ms(10_000), usize::MAX, false);
    let entry = JobEntry::Job {
        run: RunId(1),
        dispatch: world.db.runs[&RunId(1)].dispatch,
    };
    publish(&mut world, entry, T0);
    let (_, end) = deliver(&mut world, 1, None);
    assert_eq!(end, DeliveryEnd::Acked(AckReason::Written));
    let r = &world.db.runs[&RunId(1)];
    assert_eq!((r.status, r.attempts), (RunStatus::Failed, 2), "{r:?}");
    assert_eq!(
        r.error.as_ref().map(|e| e.0),
        Some(ErrorClass::BudgetExhausted)
    );
    assert!(world.violations.is_empty(), "{:?}", world.violations);
}

/// Runs spread over the partitions by run ID; a delivery read from
/// partition 1 is claimed, acknowledged and recorded with its partition;
/// the reclaimer, after partition 0's scan wraps, takes over a dead
/// worker's delivery in partition 1; the queue adds the partitions up.
#[test]
fn partitions_keep_each_entry_in_its_own_stream() {
    let policy = Policy {
        partitions: 2,
        ..policy()
    };
    assert_eq!(
        (policy.partition_of(RunId(4)), policy.partition_of(RunId(7))),
        (0, 1)
    );
    let mut world = World::partitioned(2);
    world.db.clock = T0;
    let mut s = Submitter::new(&policy, RunId(7), "noop", "{}", None);
    while let Some(c) = s.poll() {
        let input = exec(&mut world, &c, Issuer::default());
        s.handle(T0, input);
    }
    let id = world.db.runs[&RunId(7)].entry_id.expect("published");
    assert_eq!(id.partition, 1, "run 7 goes to partition 1");
    assert_eq!(world.redis.part(0).len(), 0);
    assert_eq!(world.redis.part(1).len(), 1);
    assert!(id.to_string().starts_with("1:"), "{id}");

    // Worker 0 reads it from partition 1, claims it, and dies.
    let read = StreamOp::Read {
        partition: 1,
        consumer: WorkerId(0).consumer(),
        count: 1,
        now: T0,
    };
    let Ok(StreamReply::Entries(got)) = world.stream(&read, Issuer::default()) else {
        panic!("partition 1 holds the entry");
    };
    assert_eq!(got[0].0, id, "the reply's ID carries its partition");
    let mut d = Delivery::new(T0, &policy, WorkerId(0), id, got[0].1.clone(), 0);
    let c = d.poll().unwrap();
    let input = exec(&mut world, &c, Issuer::default());
    d.handle(T0, input);
    assert_eq!(
        world.db.attempts[&(RunId(7), AttemptNo(1))].entry_id,
        id,
        "the attempt records the entry's partition"
    );
    let queue = world.redis.queue(T0);
    let group = queue.group.expect("groups");
    assert_eq!(
        (queue.length, group.pending, group.oldest_pending),
        (1, 1, Some(id))
    );

    // The reclaimer scans partition 0 (nothing), then partition 1.
    let later = T0.add_ms(policy.reclaim_min_idle_ms + 1);
    world.age_all();
    world.db.clock = later;
    let mut r = Reclaimer::new(&policy, WorkerId(1));
    let by = Issuer::worker(WorkerId(1));
    let mut delivered = Vec::new();
    for _ in 0..2 {
        r.start(later, 1);
        while let Some(c) = r.poll() {
            let input = exec(&mut world, &c, by);
            r.handle(later, input);
        }
        while let Some(e) = r.poll_event() {
            delivered.push(e);
        }
    }
    assert_eq!(
        delivered,
        vec![ReclaimerEvent::Deliver(id, got[0].1.clone())],
        "the second round claims partition 1's delivery"
    );
    assert_eq!(
        world.redis.pending(id).map(|p| p.consumer.clone()),
        Some(WorkerId(1).consumer())
    );
}

/// A pass sends a whole batch's publications before reading any answer,
/// then its marks; its report says how many it published and whether the
/// batch was full, so the driver goes on until a pass is not.
#[test]
fn an_outbox_pass_publishes_a_batch_at_once_and_reports_it() {
    let p = Policy {
        sweep_batch_max: 2,
        ..policy()
    };
    let mut world = World::at(T0);
    for run in 1..=3 {
        world.db.insert_run(RunId(run), "noop", "{}", 1);
    }
    let mut m = Maintenance::new(&p);
    let mut reports = Vec::new();
    for _ in 0..3 {
        m.start(MaintenanceTask::Outbox, T0);
        loop {
            let group: Vec<Command> = std::iter::from_fn(|| m.poll()).collect();
            if group.is_empty() {
                break;
            }
            let kinds: BTreeSet<&str> = group
                .iter()
                .map(|c| match c {
                    Command::Db(op) => op.name(),
                    _ => "stream",
                })
                .collect();
            assert_eq!(kinds.len(), 1, "one kind of command a group: {group:?}");
            for c in &group {
                let input = exec(&mut world, c, Issuer::default());
                m.handle(T0, input);
            }
        }
        assert!(m.is_idle());
        reports.push(m.report());
    }
    let report = |rows, full| PassReport {
        rows,
        full,
        next_tick_in_ms: None,
    };
    assert_eq!(
        reports,
        [report(2, true), report(1, false), report(0, false)]
    );
    assert_eq!(world.redis.part(0).len(), 3);
    assert!(world.db.runs.values().all(|r| r.entry_id.is_some()));
}

/// The sweeper re-dispatches a whole batch of runs whose entries Redis
/// lost, and reports the batch full only when it found some gone: a full
/// batch of entries still in place is the readers' backlog.
#[test]
fn a_sweep_reports_full_only_when_it_found_entries_gone() {
    let p = Policy {
        sweep_batch_max: 2,
        ..policy()
    };
    let mut world = World::at(T0);
    for run in 1..=4 {
        submit(&mut world, run);
    }
    world.db.clock = T0.add_ms(p.sweep_grace_ms);
    let mut m = Maintenance::new(&p);
    let mut pass = |world: &mut World| {
        m.start(MaintenanceTask::Sweep, T0);
        while let Some(c) = m.poll() {
            let input = exec(world, &c, Issuer::default());
            m.handle(T0, input);
        }
        m.report()
    };
    let report = |rows, full| PassReport {
        rows,
        full,
        next_tick_in_ms: None,
    };
    // Runs 1 and 2: in place, a full batch, nothing to do at once.
    assert_eq!(pass(&mut world), report(0, false));
    world.redis_wiped();
    // From the cursor: 3 and 4, gone; then nothing after them, and the
    // cursor goes back to the start: 1 and 2, gone.
    assert_eq!(pass(&mut world), report(2, true));
    assert_eq!(pass(&mut world), report(0, false));
    assert_eq!(pass(&mut world), report(2, true));
    let dispatches: Vec<u32> = world.db.runs.values().map(|r| r.dispatch.0).collect();
    assert_eq!(dispatches, [2, 2, 2, 2]);
}

/// The consumers' pass deletes a consumer that holds nothing once it is
/// idle past the reclaim threshold, keeps one that still holds a delivery
/// (its entry would leave the PEL unacknowledged: S4), and keeps a fresh
/// one.
#[test]
fn the_consumers_pass_forgets_only_idle_consumers_holding_nothing() {
    let p = policy();
    let mut world = World::at(T0);
    for run in 1..=2 {
        submit(&mut world, run);
    }
    let (done, _) = read(&mut world, 1);
    let ack = StreamOp::Ack { ids: vec![done] };
    world.stream(&ack, Issuer::default()).expect("acked");
    read(&mut world, 2);
    // The ack above is the test's (its run is still queued): S4 has its
    // say about that one already.
    let before = world.violations.clone();
    let forget = |world: &mut World, at: Timestamp| {
        world.db.clock = at;
        let mut m = Maintenance::new(&p);
        m.start(MaintenanceTask::Consumers, at);
        while let Some(c) = m.poll() {
            let input = exec(world, &c, Issuer::default());
            m.handle(at, input);
        }
        m.report().rows
    };
    assert_eq!(
        forget(&mut world, T0.add_ms(1)),
        0,
        "both were seen just now"
    );
    assert_eq!(forget(&mut world, T0.add_ms(p.reclaim_min_idle_ms)), 1);
    let consumers: Vec<_> = world.redis.jobs[0]
        .xinfo_consumers(world.db.clock)
        .expect("the group")
        .into_iter()
        .map(|c| (c.name, c.pending))
        .collect();
    assert_eq!(consumers, [(WorkerId(2).consumer(), 1)]);
    assert_eq!(world.violations, before, "the pass broke no guarantee");
}
