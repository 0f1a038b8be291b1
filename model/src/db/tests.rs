//! The statements' conditions, one behaviour per test.

use super::*;

const LEASE: u64 = 1_000;

fn t(ms: u64) -> Timestamp {
    Timestamp(ms)
}

fn db_with(run: u64, attempts_max: u32) -> Db {
    let mut db = Db::new();
    assert_eq!(db.insert_run(RunId(run), "noop", "{}", attempts_max), 1);
    db
}

fn noop() -> NewRunRow<'static> {
    NewRunRow {
        kind: "noop",
        input: "{}",
        attempts_max: 1,
        budget_ms: None,
        trace: "",
        delay: Delay::NONE,
    }
}

fn e(ms: u64) -> EntryId {
    EntryId::new(ms, 0)
}

#[test]
fn insert_is_idempotent_and_starts_queued_unpublished() {
    let mut db = db_with(1, 3);
    assert_eq!(db.insert_run(RunId(1), "other", "{}", 9), 0);
    let r = db.read_run(RunId(1)).unwrap();
    assert_eq!(
        (r.status, r.dispatch, r.active_fence, r.kind.as_str()),
        (RunStatus::Queued, Dispatch(1), Fence(0), "noop")
    );
    assert_eq!(db.claim_outbox(t(1), 10).len(), 1);
    assert!(db.claim_outbox(t(2), 10).is_empty(), "taken: one publisher");
    assert_eq!(db.mark_published(RunId(1), Dispatch(2), e(1), t(5)), 0);
    assert_eq!(db.mark_published(RunId(1), Dispatch(1), e(1), t(5)), 1);
    assert!(db.claim_outbox(t(6), 10).is_empty());
}

/// The outbox's index (`published_at IS NULL`) holds queued runs only: a
/// run claimed before its publication was marked, or cancelled before it
/// was published, leaves it.
#[test]
fn only_queued_runs_wait_for_the_outbox() {
    let mut db = db_with(1, 3);
    db.insert_run(RunId(2), "noop", "{}", 3);
    db.claim(RunId(1), Dispatch(1), e(1), "w0", t(0), LEASE)
        .unwrap();
    db.cancel(RunId(2));
    assert!(db.runs.values().all(|r| r.published_at.is_some()));
    assert!(db.claim_outbox(t(1), 10).is_empty());
}

#[test]
fn retention_deletes_old_finished_runs_with_their_rows() {
    let mut db = db_with(1, 1);
    db.insert_run_keyed(RunId(2), &noop(), "k2");
    db.insert_run(RunId(3), "noop", "{}", 1);
    let c1 = db
        .claim(RunId(1), Dispatch(1), e(1), "w0", t(0), LEASE)
        .unwrap();
    let c2 = db
        .claim(RunId(2), Dispatch(1), e(2), "w0", t(0), LEASE)
        .unwrap();
    db.apply_effect("run-1/0");
    db.apply_effect("run-10/0");
    db.clock = t(100);
    db.complete(RunId(1), c1.fence, "ok");
    db.dead_letter(RunId(2), c2.fence, ErrorClass::Terminal, "boom");
    assert_eq!(db.runs[&RunId(1)].finished_at, Some(t(100)));
    assert!(db.delete_finished(t(99), 10).is_empty(), "not old enough");
    assert_eq!(db.delete_finished(t(100), 1), vec![RunId(1)], "a batch");
    assert_eq!(db.delete_finished(t(100), 10), vec![RunId(2)]);
    assert_eq!(
        db.runs.keys().copied().collect::<Vec<_>>(),
        vec![RunId(3)],
        "run 3 is live"
    );
    assert!(db.attempts.is_empty() && db.dead_letters.is_empty());
    assert_eq!(db.effects.len(), 2, "the tool service's ledger is its own");
    // Run 2's key outlives it, for its own window: a retry under it names
    // run 2 (deleted), and makes no run.
    assert_eq!(
        db.insert_run_keyed(RunId(4), &noop(), "k2"),
        (RunId(2), true)
    );
    assert!(!db.runs.contains_key(&RunId(4)));
    assert_eq!(db.expire_keys(t(100), 10), 1, "until the key expires");
    assert!(db.keys.is_empty());
}

#[test]
fn claims_get_increasing_fences_and_respect_the_lease() {
    let mut db = db_with(1, 3);
    let c1 = db
        .claim(RunId(1), Dispatch(1), e(1), "w0", t(0), LEASE)
        .unwrap();
    assert_eq!((c1.fence, c1.attempt), (Fence(1), AttemptNo(1)));
    // A live lease keeps a second claim out.
    assert_eq!(
        db.claim(RunId(1), Dispatch(1), e(1), "w1", t(999), LEASE),
        None
    );
    // A heartbeat extends it.
    assert_eq!(db.heartbeat(RunId(1), Fence(1), t(900), LEASE), 1);
    assert_eq!(
        db.claim(RunId(1), Dispatch(1), e(1), "w1", t(1_500), LEASE),
        None
    );
    // Expired: the reclaim takes over with a greater fence.
    let c2 = db
        .claim(RunId(1), Dispatch(1), e(1), "w1", t(1_900), LEASE)
        .unwrap();
    assert_eq!((c2.fence, c2.attempt), (Fence(2), AttemptNo(2)));
    // The late attempt's writes are all rejected.
    assert_eq!(db.heartbeat(RunId(1), Fence(1), t(2_000), LEASE), 0);
    assert_eq!(db.complete(RunId(1), Fence(1), "late"), 0);
    assert_eq!(db.fail(RunId(1), Fence(1), ErrorClass::Terminal, "x"), 0);
    assert_eq!(
        db.schedule_retry(RunId(1), Fence(1), ErrorClass::Retryable, "x", t(9)),
        0
    );
    assert_eq!(
        db.dead_letter(RunId(1), Fence(1), ErrorClass::Retryable, "x"),
        0
    );
    assert_eq!(db.complete(RunId(1), Fence(2), "ok"), 1);
    let r = db.read_run(RunId(1)).unwrap();
    assert_eq!(
        (r.status, r.result.as_deref()),
        (RunStatus::Succeeded, Some("ok"))
    );
    let outcomes: Vec<_> = db
        .read_attempts(RunId(1))
        .into_iter()
        .map(|(n, a)| (n, a.outcome))
        .collect();
    assert_eq!(
        outcomes,
        [
            (AttemptNo(1), None),
            (AttemptNo(2), Some(AttemptOutcome::Succeeded))
        ],
        "the success is the attempt holding the run's fence"
    );
    assert!(
        db.attempts.values().all(|a| a.outcome.is_none()),
        "a success writes no attempt row"
    );
}

#[test]
fn a_lapsed_attempt_is_taken_over_only_through_its_own_entry() {
    let mut db = db_with(1, 3);
    // A queued run is claimed through any entry of its dispatch (a
    // duplicate publication included).
    db.claim(RunId(1), Dispatch(1), e(2), "w0", t(0), LEASE)
        .unwrap();
    // Each time its attempt lapses, another entry of the same dispatch is
    // refused, and the attempt's own entry takes over.
    for (at, fence) in [(1_500, Fence(2)), (9_000, Fence(3))] {
        assert_eq!(
            db.claim(RunId(1), Dispatch(1), e(1), "w1", t(at), LEASE),
            None
        );
        let c = db
            .claim(RunId(1), Dispatch(1), e(2), "w1", t(at), LEASE)
            .unwrap();
        assert_eq!(c.fence, fence);
        assert_eq!(db.read_run(RunId(1)).unwrap().entry_id, Some(e(2)));
    }
}

#[test]
fn terminal_states_are_final() {
    let mut db = db_with(1, 3);
    let c = db
        .claim(RunId(1), Dispatch(1), e(1), "w0", t(0), LEASE)
        .unwrap();
    assert_eq!(db.complete(RunId(1), c.fence, "ok"), 1);
    assert_eq!(db.complete(RunId(1), c.fence, "again"), 0);
    assert_eq!(db.cancel(RunId(1)), 0);
    assert_eq!(
        db.claim(RunId(1), Dispatch(1), e(1), "w1", t(5_000), LEASE),
        None
    );
    assert_eq!(db.requeue_run(RunId(1), Dispatch(1), t(5_000)), 0);
    assert_eq!(db.requeue_entry(e(1), t(5_000)), 0);
    assert_eq!(db.dead_letter_exhausted(RunId(1), Dispatch(1), t(5_000)), 0);
}

#[test]
fn retry_moves_to_a_new_dispatch_and_the_scheduler_requeues_when_due() {
    let mut db = db_with(1, 3);
    let c = db
        .claim(RunId(1), Dispatch(1), e(1), "w0", t(0), LEASE)
        .unwrap();
    assert_eq!(
        db.schedule_retry(RunId(1), c.fence, ErrorClass::Retryable, "429", t(500)),
        1
    );
    let r = db.read_run(RunId(1)).unwrap();
    assert_eq!((r.status, r.dispatch), (RunStatus::RetryWait, Dispatch(2)));
    // The old entry's dispatch can no longer claim.
    assert_eq!(
        db.claim(RunId(1), Dispatch(1), e(1), "w0", t(600), LEASE),
        None
    );
    assert!(db.promote(t(499), 10, false).is_empty());
    let promoted = db.promote(t(500), 10, false);
    assert_eq!(promoted.len(), 1);
    assert_eq!(promoted[0].dispatch, Dispatch(2));
    assert_eq!(
        promoted[0].published_at,
        Some(t(500)),
        "taken for publication"
    );
    assert!(
        db.claim_outbox(t(500), 10).is_empty(),
        "the promoting pass publishes it"
    );
    assert!(
        db.claim(RunId(1), Dispatch(2), e(2), "w1", t(600), LEASE)
            .is_some()
    );
}

#[test]
fn exhausted_runs_die_with_a_dead_letter() {
    let mut db = db_with(1, 1);
    let c = db
        .claim(RunId(1), Dispatch(1), e(1), "w0", t(0), LEASE)
        .unwrap();
    // Attempt 1 of 1 crashed: no more claims, but the expired run is buried.
    assert_eq!(
        db.claim(RunId(1), Dispatch(1), e(1), "w1", t(2_000), LEASE),
        None
    );
    assert_eq!(
        db.dead_letter_exhausted(RunId(1), Dispatch(1), t(500)),
        0,
        "lease still live"
    );
    assert_eq!(db.dead_letter_exhausted(RunId(1), Dispatch(1), t(2_000)), 1);
    let d = &db.dead_letters[&RunId(1)];
    assert_eq!(
        (d.class, d.source_entry),
        (ErrorClass::Exhausted, Some(e(1)))
    );
    assert_eq!(d.attempts, vec![(AttemptNo(1), c.fence, None)]);
    // An explicit requeue runs it again, once.
    db.runs.get_mut(&RunId(1)).unwrap().unknown_failures = 1;
    db.clock = t(9_000);
    assert_eq!(db.dlq_requeue(RunId(1), 2, Some(500)), 1);
    assert_eq!(db.dlq_requeue(RunId(1), 2, Some(500)), 0);
    let r = &db.runs[&RunId(1)];
    assert_eq!(
        (r.deadline, r.unknown_failures),
        (Some(t(9_500)), 0),
        "a fresh budget from the requeue, no unknown errors counted"
    );
    let r = db.read_run(RunId(1)).unwrap();
    assert_eq!(
        (r.status, r.attempts_max, r.dispatch),
        (RunStatus::Queued, 3, Dispatch(2))
    );
}

#[test]
fn fenced_dead_letter_records_the_attempt_history() {
    let mut db = db_with(1, 2);
    let c1 = db
        .claim(RunId(1), Dispatch(1), e(1), "w0", t(0), LEASE)
        .unwrap();
    db.schedule_retry(RunId(1), c1.fence, ErrorClass::Panic, "boom", t(0));
    db.promote(t(0), 1, false);
    let c2 = db
        .claim(RunId(1), Dispatch(2), e(2), "w1", t(0), LEASE)
        .unwrap();
    assert_eq!(
        db.dead_letter(RunId(1), c2.fence, ErrorClass::Retryable, "429"),
        1
    );
    let d = &db.dead_letters[&RunId(1)];
    assert_eq!(d.source_entry, Some(e(2)));
    assert_eq!(
        d.attempts,
        vec![
            (
                AttemptNo(1),
                Fence(1),
                Some(AttemptOutcome::Failed(ErrorClass::Panic))
            ),
            (
                AttemptNo(2),
                Fence(2),
                Some(AttemptOutcome::Failed(ErrorClass::Retryable))
            ),
        ]
    );
}

#[test]
fn cancel_wins_over_a_running_attempt_and_blocks_new_ones() {
    let mut db = db_with(1, 3);
    let c = db
        .claim(RunId(1), Dispatch(1), e(1), "w0", t(0), LEASE)
        .unwrap();
    assert_eq!(db.cancel(RunId(1)), 1);
    assert_eq!(db.heartbeat(RunId(1), c.fence, t(1), LEASE), 0);
    assert_eq!(db.complete(RunId(1), c.fence, "ok"), 0);
    assert_eq!(
        db.claim(RunId(1), Dispatch(1), e(1), "w1", t(5_000), LEASE),
        None
    );
    assert_eq!(db.cancel(RunId(1)), 0);
}

#[test]
fn the_sweeper_walks_runs_by_publication_then_id() {
    let mut db = db_with(1, 3);
    db.insert_run(RunId(2), "noop", "{}", 3);
    db.insert_run(RunId(3), "noop", "{}", 3);
    db.mark_published(RunId(3), Dispatch(1), e(3), t(10));
    db.mark_published(RunId(1), Dispatch(1), e(1), t(20));
    db.mark_published(RunId(2), Dispatch(1), e(2), t(20));
    let ids = |cs: Vec<Candidate>| cs.iter().map(|c| c.run_id).collect::<Vec<_>>();
    let all = db.orphan_candidates(t(1_000), 100, 0, RunId(0), 10);
    assert_eq!(ids(all), vec![RunId(3), RunId(1), RunId(2)]);
    assert_eq!(
        ids(db.orphan_candidates(t(1_000), 100, 20, RunId(1), 10)),
        vec![RunId(2)],
        "the cursor is (published_at, run id)"
    );
    assert_eq!(
        ids(db.orphan_candidates(t(115), 100, 0, RunId(0), 10)),
        vec![RunId(3)],
        "runs published after the cutoff are not candidates"
    );
}

#[test]
fn orphans_are_found_after_the_grace_and_requeued_once() {
    let mut db = db_with(1, 3);
    db.insert_run(RunId(2), "noop", "{}", 3);
    db.mark_published(RunId(1), Dispatch(1), e(1), t(100));
    let c = db
        .claim(RunId(2), Dispatch(1), e(2), "w0", t(100), LEASE)
        .unwrap();
    assert!(
        db.orphan_candidates(t(150), 100, 0, RunId(0), 10)
            .is_empty()
    );
    let found = db.orphan_candidates(t(1_200), 100, 0, RunId(0), 10);
    assert_eq!(
        found.iter().map(|c| c.run_id).collect::<Vec<_>>(),
        vec![RunId(1), RunId(2)]
    );
    let after = db.orphan_candidates(t(1_200), 100, 100, RunId(1), 10);
    assert_eq!(
        after.iter().map(|c| c.run_id).collect::<Vec<_>>(),
        vec![RunId(2)]
    );
    assert_eq!(db.requeue_run(RunId(1), Dispatch(1), t(1_200)), 1);
    assert_eq!(
        db.requeue_run(RunId(1), Dispatch(1), t(1_200)),
        0,
        "dispatch moved on"
    );
    assert_eq!(db.requeue_entry(e(2), t(1_000)), 0, "lease still live");
    assert_eq!(db.requeue_entry(e(2), t(1_100)), 1);
    assert_eq!(db.complete(RunId(2), c.fence, "late"), 0);
}

#[test]
fn effects_apply_once_per_key() {
    let mut db = Db::new();
    assert_eq!(db.apply_effect("run-1/0"), 1);
    assert_eq!(db.apply_effect("run-1/0"), 0);
    assert_eq!(db.apply_effect("run-1/1"), 1);
    assert_eq!(db.effects["run-1/0"], 2);
}

#[test]
fn age_all_expires_every_deadline() {
    let mut db = db_with(1, 3);
    db.claim(RunId(1), Dispatch(1), e(1), "w0", t(5_000), LEASE)
        .unwrap();
    db.age_all();
    assert!(
        db.claim(RunId(1), Dispatch(1), e(1), "w1", t(5_000), LEASE)
            .is_some()
    );
}

/// A permit takes the lowest free slot; a held slot is free again once its
/// hold runs out, not before; a release frees only its holder's slot.
#[test]
fn slots_are_held_until_released_or_their_hold_runs_out() {
    let mut db = Db::new();
    db.clock = t(1_000);
    assert_eq!(db.acquire_slot("p", 2, "a", LEASE), 0, "no slots made yet");
    assert_eq!(db.ensure_slots("p", 2), 2);
    assert_eq!(db.ensure_slots("p", 2), 0, "made once");
    assert_eq!(db.acquire_slot("p", 2, "a", LEASE), 1);
    assert_eq!(db.acquire_slot("p", 2, "b", LEASE), 1);
    assert_eq!(db.acquire_slot("p", 2, "c", LEASE), 0, "both held");
    assert_eq!(db.acquire_slot("p", 1, "c", LEASE), 0, "a lower limit");
    assert_eq!(db.release_slot("p", "x"), 0);
    assert_eq!(db.release_slot("p", "b"), 1);
    assert_eq!(db.acquire_slot("p", 2, "c", LEASE), 1, "b's slot");
    assert_eq!(db.slots[&("p".to_owned(), 1)].0, "c");
    db.clock = t(1_999);
    assert_eq!(db.acquire_slot("p", 2, "d", LEASE), 0);
    db.clock = t(2_000);
    assert_eq!(db.acquire_slot("p", 2, "d", LEASE), 1, "a's hold ran out");
    assert_eq!(db.slots[&("p".to_owned(), 0)].0, "d");
    assert_eq!(db.release_slot("p", "a"), 0, "a no longer holds it");
}

/// The rate limit is a GCRA: `burst` calls at once after a quiet spell,
/// then one per interval.
#[test]
fn a_rate_is_kept_as_stated() {
    use crate::protocol::ProviderLimit;
    let limit = |n| ProviderLimit {
        per_second: Some(n),
        ..ProviderLimit::default()
    };
    for n in [1, 3, 7, 333, 501, 999, 1_000] {
        let mut db = Db::new();
        db.clock = t(1_000_000);
        let Some(query::TakeToken { interval_ns, .. }) = limit(n).take_token("p") else {
            panic!("a rate limit of {n} takes tokens");
        };
        // Ten seconds, asked every millisecond, with a burst of two (the
        // tolerance that absorbs the asking's millisecond steps): 10n
        // calls, and the burst's one more.
        let mut granted = 0;
        for ms in 0..10_000 {
            db.clock = t(1_000_000 + ms);
            granted += db.take_token("p", interval_ns, 2);
        }
        assert!(
            granted.abs_diff(10 * u64::from(n) + 1) <= 1,
            "{n}/s granted {granted} in 10 s"
        );
    }
}

#[test]
fn tokens_come_at_the_rate_after_a_burst() {
    let mut db = Db::new();
    db.clock = t(10_000);
    let granted = |db: &mut Db| db.take_token("p", 100_000_000, 3);
    assert_eq!(
        [granted(&mut db), granted(&mut db), granted(&mut db)],
        [1, 1, 1]
    );
    assert_eq!(granted(&mut db), 0, "the burst is spent");
    db.clock = t(10_099);
    assert_eq!(granted(&mut db), 0);
    db.clock = t(10_100);
    assert_eq!(granted(&mut db), 1, "one interval later");
    assert_eq!(granted(&mut db), 0);
    db.clock = t(20_000);
    assert_eq!(db.take_token("q", 100_000_000, 1), 1, "providers apart");
    assert_eq!(
        [granted(&mut db), granted(&mut db), granted(&mut db)],
        [1, 1, 1]
    );
    assert_eq!(granted(&mut db), 0, "a quiet spell refills only the burst");
}

/// A read of events stops once the data before an event reaches its bound
/// (the first event always comes), and the next read goes on from there:
/// a reader never holds more than the bound and one event.
#[test]
fn an_events_read_is_bounded_by_its_bytes() {
    let mut db = db_with(1, 3);
    let c = db
        .claim(RunId(1), Dispatch(1), e(1), "w1", t(0), 1_000)
        .expect("claimed");
    let big = "x".repeat(600);
    for _ in 0..4 {
        assert_eq!(db.append_event(RunId(1), c.fence, &big), 1);
    }
    let seqs = |after, bytes| -> Vec<u32> {
        db.read_events_bounded(RunId(1), after, 100, bytes)
            .iter()
            .map(|e| e.seq)
            .collect()
    };
    // queued (0 bytes), claimed ("w1"), then 600-byte progress events.
    assert_eq!(seqs(0, u64::MAX), [1, 2, 3, 4, 5, 6]);
    assert_eq!(seqs(0, 1_000), [1, 2, 3, 4], "602 bytes before the fourth");
    assert_eq!(seqs(4, 1_000), [5, 6]);
    assert_eq!(seqs(2, 1), [3], "the first comes whatever its size");
    assert_eq!(seqs(0, 0), [1, 2], "nothing before them");
}

/// The schema's status check allows exactly the states of
/// [`RunStatus::ALL`].
#[test]
fn the_status_check_lists_every_state() {
    let check = sql::SCHEMA_DELAYED;
    let (_, list) = check
        .split_once("CHECK (status IN")
        .expect("a status check");
    let (list, _) = list.split_once(')').expect("closed");
    let listed: Vec<&str> = list
        .split(',')
        .map(|s| {
            s.trim()
                .trim_matches(|c| c == '(' || c == '\'' || c == '\n' || c == ' ')
        })
        .collect();
    let all: Vec<&str> = RunStatus::ALL.iter().map(|s| s.as_str()).collect();
    assert_eq!(listed, all);
}

/// The schedules' policy checks allow exactly [`Overlap::ALL`] and
/// [`Catchup::ALL`].
#[test]
fn the_schedule_checks_list_every_policy() {
    use crate::schedule::{Catchup, Overlap};
    let listed = |column: &str| -> Vec<String> {
        let (_, rest) = sql::SCHEMA_SCHEDULES
            .split_once(&format!("CHECK ({column} IN ("))
            .expect("a check");
        let (list, _) = rest.split_once(')').expect("closed");
        list.split(',')
            .map(|s| s.trim_matches('\'').to_owned())
            .collect()
    };
    let names = |all: &[&str]| all.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    let overlap: Vec<&str> = Overlap::ALL.iter().map(|o| o.as_str()).collect();
    let catchup: Vec<&str> = Catchup::ALL.iter().map(|c| c.as_str()).collect();
    assert_eq!(listed("overlap"), names(&overlap));
    assert_eq!(listed("catchup"), names(&catchup));
}

/// A delayed run waits `delayed` until due, then the retry pass queues it;
/// its due time stays, its budget counts from then, and a cancel ends it
/// while it waits.
#[test]
fn a_delayed_run_waits_until_due() {
    let mut db = Db::new();
    db.clock = t(1_000);
    let new = NewRunRow {
        budget_ms: Some(50),
        delay: Delay {
            delay_ms: 200,
            at_ms: 900,
        },
        ..noop()
    };
    assert_eq!(db.insert_run_budgeted(RunId(1), &new), 1);
    let at = NewRunRow {
        delay: Delay {
            delay_ms: 0,
            at_ms: 1_500,
        },
        ..noop()
    };
    assert_eq!(db.insert_run_budgeted(RunId(2), &at), 1);
    let r = &db.runs[&RunId(1)];
    assert_eq!(r.status, RunStatus::Delayed);
    assert_eq!((r.due_at, r.retry_at), (Some(t(1_200)), Some(t(1_200))));
    assert_eq!(r.deadline, Some(t(1_250)));
    assert!(db.promote(t(1_199), 10, false).is_empty());
    assert_eq!(db.claim_outbox(t(1_199), 10), vec![]);
    let promoted = db.promote(t(1_200), 10, false);
    assert_eq!(
        promoted.iter().map(|c| c.run_id).collect::<Vec<_>>(),
        [RunId(1)]
    );
    let r = &db.runs[&RunId(1)];
    assert_eq!(
        (r.status, r.retry_at, r.due_at),
        (RunStatus::Queued, None, Some(t(1_200)))
    );
    assert_eq!(db.cancel(RunId(2)), 1);
    assert_eq!(db.runs[&RunId(2)].status, RunStatus::Cancelled);
    assert!(db.promote(t(2_000), 10, false).is_empty());
}
