//! Edge cases of each command, as Redis 7 documents and implements them.

use super::*;

fn id(ms: u64, seq: u64) -> EntryId {
    EntryId::new(ms, seq)
}

fn t(ms: u64) -> Timestamp {
    Timestamp(ms)
}

/// A stream with entries "a".."e" at 1-0..5-0 and a group at 0.
fn five() -> Stream<&'static str> {
    let mut s = Stream::new();
    for (i, p) in ["a", "b", "c", "d", "e"].into_iter().enumerate() {
        s.xadd(AddId::Auto, p, t(i as u64 + 1)).unwrap();
    }
    s.xgroup_create("g", Some(EntryId::ZERO), false).unwrap();
    s
}

#[test]
fn xadd_auto_ids_follow_the_clock_and_never_go_back() {
    let mut s = Stream::new();
    assert_eq!(s.xadd(AddId::Auto, "a", t(10)).unwrap(), id(10, 0));
    assert_eq!(s.xadd(AddId::Auto, "b", t(10)).unwrap(), id(10, 1));
    // Clock went backwards: the sequence continues.
    assert_eq!(s.xadd(AddId::Auto, "c", t(3)).unwrap(), id(10, 2));
    assert_eq!(
        s.xadd(AddId::Explicit(id(10, 2)), "x", t(11)),
        Err(StreamError::IdTooSmall)
    );
    assert_eq!(
        s.xadd(AddId::Explicit(id(20, 5)), "d", t(11)).unwrap(),
        id(20, 5)
    );
    assert_eq!(s.entries_added, 4);
    assert_eq!(s.len(), 4);
}

#[test]
fn xgroup_create_needs_the_key_or_mkstream_and_is_busy_twice() {
    let mut s: Stream<&str> = Stream::new();
    assert_eq!(
        s.xgroup_create("g", Some(EntryId::ZERO), false),
        Err(StreamError::NoKey)
    );
    s.xgroup_create("g", Some(EntryId::ZERO), true).unwrap();
    assert!(s.exists);
    assert_eq!(
        s.xgroup_create("g", None, true),
        Err(StreamError::BusyGroup)
    );
    assert_eq!(s.xinfo_groups().unwrap()[0].lag, Some(0));
}

#[test]
fn commands_without_a_group_answer_nogroup() {
    let mut s: Stream<&str> = Stream::new();
    s.xadd(AddId::Auto, "a", t(1)).unwrap();
    assert_eq!(s.xreadgroup("c", 1, t(1)), Err(StreamError::NoGroup));
    assert_eq!(
        s.xack(&[id(1, 0)]),
        Ok(0),
        "Redis answers 0 without the group"
    );
    assert!(s.xautoclaim("c", 0, EntryId::ZERO, 1, false, t(1)).is_err());
    assert!(s.xpending_summary().is_err());
}

#[test]
fn group_created_at_dollar_skips_existing_entries() {
    let mut s = Stream::new();
    s.xadd(AddId::Auto, "old", t(1)).unwrap();
    s.xgroup_create("g", None, false).unwrap();
    assert!(s.xreadgroup("c", 10, t(2)).unwrap().is_empty());
    s.xadd(AddId::Auto, "new", t(3)).unwrap();
    assert_eq!(
        s.xreadgroup("c", 10, t(4)).unwrap(),
        vec![(id(3, 0), "new")]
    );
}

#[test]
fn xreadgroup_delivers_each_entry_once_and_records_pending() {
    let mut s = five();
    let got = s.xreadgroup("c1", 2, t(10)).unwrap();
    assert_eq!(got, vec![(id(1, 0), "a"), (id(2, 0), "b")]);
    let got = s.xreadgroup("c2", 10, t(11)).unwrap();
    assert_eq!(got.len(), 3);
    assert!(s.xreadgroup("c1", 10, t(12)).unwrap().is_empty());
    let p = s.pending(id(1, 0)).unwrap();
    assert_eq!(
        (p.consumer.as_str(), p.delivery_time, p.delivery_count),
        ("c1", t(10), 1)
    );
    let info = &s.xinfo_groups().unwrap()[0];
    assert_eq!(
        (info.pending, info.consumers, info.lag, info.entries_read),
        (5, 2, Some(0), Some(5))
    );
}

#[test]
fn xack_takes_no_consumer_and_counts_only_pending_ids() {
    let mut s = five();
    s.xreadgroup("c1", 2, t(10)).unwrap();
    // Anyone can acknowledge anything: the protocol must not rely on XACK
    // checking ownership.
    assert_eq!(
        s.xack(&[id(1, 0), id(1, 0), id(9, 9), id(3, 0)]).unwrap(),
        1
    );
    assert_eq!(s.pel_len(), 1);
    // XACK does not delete the entry.
    assert_eq!(s.len(), 5);
}

#[test]
fn xautoclaim_respects_idle_count_and_cursor() {
    let mut s = five();
    s.xreadgroup("c1", 5, t(100)).unwrap();
    // Not idle long enough.
    let r = s
        .xautoclaim("c2", 50, EntryId::ZERO, 10, false, t(120))
        .unwrap();
    assert!(r.claimed.is_empty() && r.deleted.is_empty());
    assert_eq!(r.next, EntryId::ZERO);
    // Idle enough; COUNT 2 returns a cursor at the next pending ID.
    let r = s
        .xautoclaim("c2", 50, EntryId::ZERO, 2, false, t(200))
        .unwrap();
    assert_eq!(
        r.claimed,
        vec![(id(1, 0), Some("a")), (id(2, 0), Some("b"))]
    );
    assert_eq!(r.next, id(3, 0));
    let p = s.pending(id(1, 0)).unwrap();
    assert_eq!(
        (p.consumer.as_str(), p.delivery_time, p.delivery_count),
        ("c2", t(200), 2)
    );
    // Continue from the cursor with JUSTID: delivery count unchanged.
    let r = s.xautoclaim("c3", 50, id(3, 0), 10, true, t(300)).unwrap();
    assert_eq!(
        r.claimed,
        vec![(id(3, 0), None), (id(4, 0), None), (id(5, 0), None)]
    );
    assert_eq!(r.next, EntryId::ZERO);
    assert_eq!(s.pending(id(3, 0)).unwrap().delivery_count, 1);
}

#[test]
fn xautoclaim_scans_at_most_ten_times_count() {
    let mut s = Stream::new();
    for i in 0..25 {
        s.xadd(AddId::Auto, i, t(i + 1)).unwrap();
    }
    s.xgroup_create("g", Some(EntryId::ZERO), false).unwrap();
    s.xreadgroup("c1", 25, t(1000)).unwrap();
    // None is idle enough: with COUNT 1 the scan stops after 10 entries.
    let r = s
        .xautoclaim("c2", 10_000, EntryId::ZERO, 1, false, t(1001))
        .unwrap();
    assert!(r.claimed.is_empty());
    assert_eq!(r.next, id(11, 0));
}

#[test]
fn xautoclaim_reports_and_drops_deleted_ids_whatever_their_idle_time() {
    let mut s = five();
    s.xreadgroup("c1", 5, t(100)).unwrap();
    assert_eq!(s.xtrim(Trim::MinId(id(3, 0))), 2);
    s.xdel(&[id(4, 0)]);
    // min-idle not reached, yet deleted IDs are dropped and reported.
    let r = s
        .xautoclaim("c2", 1_000, EntryId::ZERO, 10, false, t(150))
        .unwrap();
    assert_eq!(r.deleted, vec![id(1, 0), id(2, 0), id(4, 0)]);
    assert!(r.claimed.is_empty());
    assert_eq!(s.pel_len(), 2);
    // Deleted IDs use up COUNT as claimed ones do (Redis 7.0, as the
    // conformance tests against a live server show).
    let mut s = five();
    s.xreadgroup("c1", 5, t(100)).unwrap();
    s.xtrim(Trim::MaxLen(2));
    let r = s
        .xautoclaim("c2", 0, EntryId::ZERO, 2, false, t(150))
        .unwrap();
    assert_eq!(r.deleted, vec![id(1, 0), id(2, 0)]);
    assert!(r.claimed.is_empty());
    assert_eq!(r.next, id(3, 0));
    let r = s.xautoclaim("c2", 0, r.next, 2, false, t(150)).unwrap();
    assert_eq!(r.deleted, vec![id(3, 0)]);
    assert_eq!(r.claimed, vec![(id(4, 0), Some("d"))]);
    assert_eq!(r.next, id(5, 0));
}

#[test]
fn xclaim_with_idle_and_justid() {
    let mut s = five();
    s.xreadgroup("c1", 3, t(100)).unwrap();
    // Min-idle not met: nothing.
    assert!(
        s.xclaim("c2", 500, &[id(1, 0)], None, false, t(200))
            .unwrap()
            .is_empty()
    );
    // Heartbeat-style touch: claim to self with JUSTID, idle reset.
    let got = s
        .xclaim("c1", 0, &[id(1, 0), id(9, 0)], None, true, t(300))
        .unwrap();
    assert_eq!(got, vec![(id(1, 0), None)]);
    let p = s.pending(id(1, 0)).unwrap();
    assert_eq!((p.delivery_time, p.delivery_count), (t(300), 1));
    // IDLE sets the delivery time in the past.
    let got = s
        .xclaim("c2", 0, &[id(2, 0)], Some(70), false, t(400))
        .unwrap();
    assert_eq!(got, vec![(id(2, 0), Some("b"))]);
    let rows = s
        .xpending_range(None, id(2, 0), id(2, 0), 10, None, t(400))
        .unwrap();
    assert_eq!(rows[0].idle_ms, 70);
    assert_eq!(rows[0].delivery_count, 2);
    // A deleted entry's pending record is dropped by XCLAIM.
    s.xdel(&[id(3, 0)]);
    assert!(
        s.xclaim("c2", 0, &[id(3, 0)], None, false, t(500))
            .unwrap()
            .is_empty()
    );
    assert!(s.pending(id(3, 0)).is_none());
}

#[test]
fn xpending_summary_and_extended() {
    let mut s = five();
    s.xreadgroup("c1", 2, t(100)).unwrap();
    s.xreadgroup("c2", 1, t(150)).unwrap();
    let sum = s.xpending_summary().unwrap();
    assert_eq!(sum.count, 3);
    assert_eq!(sum.range, Some((id(1, 0), id(3, 0))));
    assert_eq!(
        sum.consumers,
        vec![("c1".to_owned(), 2), ("c2".to_owned(), 1)]
    );
    let rows = s
        .xpending_range(Some(100), EntryId::ZERO, EntryId::MAX, 10, None, t(210))
        .unwrap();
    assert_eq!(
        rows.iter().map(|r| r.id).collect::<Vec<_>>(),
        vec![id(1, 0), id(2, 0)]
    );
    let rows = s
        .xpending_range(None, EntryId::ZERO, EntryId::MAX, 10, Some("c2"), t(210))
        .unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].idle_ms, 60);
    let empty = Stream::<u8>::new();
    assert!(empty.xpending_summary().is_err());
}

#[test]
fn xtrim_and_xdel_leave_the_pel_alone() {
    let mut s = five();
    s.xreadgroup("c1", 5, t(100)).unwrap();
    assert_eq!(s.xtrim(Trim::MaxLen(10)), 0);
    assert_eq!(s.xtrim(Trim::MaxLen(3)), 2);
    assert_eq!(s.xtrim(Trim::MinId(id(5, 0))), 2);
    assert_eq!(s.xdel(&[id(5, 0), id(5, 0), id(1, 0)]), 1);
    assert!(s.is_empty());
    assert_eq!(s.pel_len(), 5);
    assert_eq!(s.max_deleted, id(5, 0));
    assert!(s.xrange(EntryId::ZERO, EntryId::MAX, 10).is_empty());
}

#[test]
fn lag_counts_undelivered_entries_and_turns_unknown_after_a_fragmenting_xdel() {
    let mut s = five();
    assert_eq!(s.xinfo_groups().unwrap()[0].lag, Some(5));
    s.xreadgroup("c", 2, t(10)).unwrap();
    assert_eq!(s.xinfo_groups().unwrap()[0].lag, Some(3));
    // Deleting an undelivered entry in the middle: Redis cannot know.
    s.xdel(&[id(4, 0)]);
    assert_eq!(s.xinfo_groups().unwrap()[0].lag, None);
    // Reading past the tombstone gives a known counter again.
    s.xreadgroup("c", 10, t(11)).unwrap();
    assert_eq!(s.xinfo_groups().unwrap()[0].lag, Some(0));
}

#[test]
fn age_all_makes_every_delivery_idle() {
    let mut s = five();
    s.xreadgroup("c", 5, t(1_000)).unwrap();
    s.age_all();
    let r = s
        .xautoclaim("d", 1_000, EntryId::ZERO, 10, false, t(1_000))
        .unwrap();
    assert_eq!(r.claimed.len(), 5);
}
