use super::*;
use crate::db::{Db, DbReply, NewSchedule};
use crate::status::RunStatus;

/// 2026-12-07T00:00:00Z, in Unix ms.
const MIDNIGHT: Timestamp = Timestamp(1_796_601_600_000);

fn row(cron: &str, catchup: Catchup, next_tick: Timestamp) -> ScheduleRow {
    ScheduleRow {
        name: "nightly".into(),
        id: 7,
        kind: "report".into(),
        input: "{}".into(),
        cron: cron.into(),
        tz: "UTC".into(),
        overlap: Overlap::Queue,
        catchup,
        next_tick,
        last_tick: Timestamp::ZERO,
        last_run: None,
        fired: 0,
        skipped: 0,
    }
}

fn fire_of(op: &DbOp) -> (Timestamp, Timestamp, RunId) {
    match op {
        DbOp::FireTick {
            tick, next, run, ..
        } => (*tick, *next, *run),
        other => panic!("planned {other:?}"),
    }
}

#[test]
fn ticks_fall_in_their_time_zone() {
    let berlin = Cron::parse("0 9 * * *", "Europe/Berlin").unwrap();
    // 09:00 in Berlin is 08:00 UTC in December.
    assert_eq!(berlin.after(MIDNIGHT), Some(MIDNIGHT.add_ms(8 * 3_600_000)));
    let every_second = Cron::parse("* * * * * *", "UTC").unwrap();
    assert_eq!(every_second.after(MIDNIGHT), Some(MIDNIGHT.add_ms(1_000)));
    assert!(
        Cron::parse("0 9 * * *", "Mars/Olympus")
            .unwrap_err()
            .contains("time zone")
    );
    assert!(
        Cron::parse("61 * * * *", "UTC")
            .unwrap_err()
            .contains("cron expression")
    );
}

#[test]
fn tick_runs_name_their_schedule_and_second() {
    let run = tick_run(7, MIDNIGHT);
    assert!(run.0 >= TICK_RUNS);
    assert_eq!(tick_of(run), Some((7, MIDNIGHT)));
    assert_ne!(tick_run(8, MIDNIGHT), run);
    assert_ne!(tick_run(7, MIDNIGHT.add_ms(1_000)), run);
    assert_eq!(tick_of(RunId(42)), None);
    // Exact in JavaScript's numbers, and the sequence's bound is the
    // encoding's.
    assert!(tick_run(SCHEDULE_IDS_MAX - 1, Timestamp(u64::MAX)).0 < 1 << 53);
    assert!(
        crate::db::sql::SCHEMA_SCHEDULES.contains(&format!("MAXVALUE {}", SCHEDULE_IDS_MAX - 1))
    );
}

#[test]
fn a_due_tick_fires_and_the_next_follows() {
    let policy = Policy::default();
    let tick = MIDNIGHT.add_ms(60_000);
    let s = row("* * * * *", Catchup::Skip, tick);
    let (t, next, run) = fire_of(&plan(&s, tick.add_ms(150), &policy));
    assert_eq!(
        (t, next, run),
        (tick, tick.add_ms(60_000), tick_run(7, tick))
    );
    // Not planned yet: the first tick after now, nothing handled.
    let s = row("* * * * *", Catchup::Skip, Timestamp::ZERO);
    let (t, next, run) = fire_of(&plan(&s, MIDNIGHT.add_ms(5), &policy));
    assert_eq!(
        (t, next, run),
        (Timestamp::ZERO, MIDNIGHT.add_ms(60_000), RunId(0))
    );
}

#[test]
fn missed_ticks_follow_the_catch_up_policy() {
    let policy = Policy::default();
    let tick = MIDNIGHT;
    let now = MIDNIGHT.add_ms(10 * 60_000 + 30_000);
    // Missed: more than catchup_after_ms late. The schedule goes on from
    // the first tick not missed (10:00 - 60 s = 09:30, so 10:00).
    for (catchup, run) in [(Catchup::Skip, RunId(0)), (Catchup::One, tick_run(7, tick))] {
        let s = row("* * * * *", catchup, tick);
        let (t, next, r) = fire_of(&plan(&s, now, &policy));
        assert_eq!((t, next, r), (tick, MIDNIGHT.add_ms(10 * 60_000), run));
    }
}

fn put(db: &mut Db, overlap: Overlap) {
    let new = NewSchedule {
        name: "nightly",
        kind: "report",
        input: "{}",
        cron: "* * * * * *",
        tz: "UTC",
        overlap,
        catchup: Catchup::One,
    };
    assert_eq!(db.put_schedule(&new), 1);
}

/// Plans and fires schedule "nightly" at `now`, as a scheduler pass does.
fn pass(db: &mut Db, now: Timestamp) -> DbOp {
    db.clock = now;
    let due = db.due_schedules(now, 10);
    let (at, s) = due.first().expect("due").clone();
    let op = plan(&s, at, &Policy::default());
    assert_eq!(db.execute(&op), DbReply::Rows(1));
    op
}

#[test]
fn one_tick_one_run_and_a_stale_fire_does_nothing() {
    let mut db = Db::new();
    put(&mut db, Overlap::Queue);
    pass(&mut db, MIDNIGHT.add_ms(400));
    let first = MIDNIGHT.add_ms(1_000);
    assert_eq!(db.schedules["nightly"].next_tick, first);
    let stale = plan(&db.schedules["nightly"].clone(), first, &Policy::default());
    pass(&mut db, first.add_ms(20));
    let run = tick_run(db.schedules["nightly"].id, first);
    assert_eq!(db.runs[&run].status, RunStatus::Delayed);
    assert_eq!(db.schedules["nightly"].fired, 1);
    // A second scheduler that read the same tick: its compare-and-set
    // finds the tick handled.
    assert_eq!(db.execute(&stale), DbReply::Rows(0));
    assert_eq!(db.schedules["nightly"].fired, 1);
}

#[test]
fn overlap_skips_or_cancels_a_live_previous_run() {
    for (overlap, fired, prev) in [
        (Overlap::Skip, 1, RunStatus::Delayed),
        (Overlap::Cancel, 2, RunStatus::Cancelled),
        (Overlap::Queue, 2, RunStatus::Delayed),
    ] {
        let mut db = Db::new();
        put(&mut db, overlap);
        pass(&mut db, MIDNIGHT.add_ms(400));
        pass(&mut db, MIDNIGHT.add_ms(1_000));
        pass(&mut db, MIDNIGHT.add_ms(2_000));
        let s = &db.schedules["nightly"];
        assert_eq!((s.fired, s.skipped), (fired, 2 - fired), "{overlap}");
        let first = tick_run(s.id, MIDNIGHT.add_ms(1_000));
        assert_eq!(db.runs[&first].status, prev, "{overlap}");
    }
}
