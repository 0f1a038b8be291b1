//! The twins of the `schedules` statements ([`crate::schedule`]).

use super::{Db, Delay, NewRunRow};
use crate::ids::RunId;
use crate::schedule::{Catchup, Overlap, ScheduleRow};
use crate::time::Timestamp;

/// A schedule as [`Db::put_schedule`] writes it: what its request carried.
#[derive(Clone, Copy, Debug)]
pub struct NewSchedule<'a> {
    /// Its name.
    pub name: &'a str,
    /// The kind of its runs.
    pub kind: &'a str,
    /// The input of its runs.
    pub input: &'a str,
    /// Its cron expression.
    pub cron: &'a str,
    /// Its time zone.
    pub tz: &'a str,
    /// Its overlap policy.
    pub overlap: Overlap,
    /// Its catch-up policy.
    pub catchup: Catchup,
}

/// A tick as [`Db::fire_tick`] handles it: what the scheduler planned
/// ([`crate::schedule::plan`]).
#[derive(Clone, Copy, Debug)]
pub struct Fire<'a> {
    /// The schedule.
    pub schedule: &'a str,
    /// The `next_tick` the scheduler read: the statement applies only
    /// while the row still holds it (`None`: whatever it holds, the
    /// `TickUnfenced` mutant's twin).
    pub expect: Option<Timestamp>,
    /// The tick handled (0: none, the schedule is only being planned).
    pub tick: Timestamp,
    /// The schedule's next tick after this one.
    pub next: Timestamp,
    /// The tick's run (0: the catch-up policy makes none).
    pub run: RunId,
    /// The run's attempts.
    pub attempts_max: u32,
    /// The run's budget (0: none).
    pub budget_ms: u64,
}

impl Db {
    /// [`Statement::PutSchedule`]: makes schedule `new.name`, numbered
    /// from `schedule_ids`, or replaces what an existing one runs and
    /// when, keeping its number and history. Either way it is planned
    /// afresh by the next scheduler pass (`next_tick` 0).
    ///
    /// [`Statement::PutSchedule`]: super::Statement::PutSchedule
    pub fn put_schedule(&mut self, new: &NewSchedule<'_>) -> u64 {
        // `nextval` is drawn before the conflict is found, as Postgres does.
        self.schedule_ids += 1;
        let id = self
            .schedules
            .get(new.name)
            .map_or(self.schedule_ids, |s| s.id);
        let old = self.schedules.remove(new.name);
        let row = ScheduleRow {
            name: new.name.to_owned(),
            id,
            kind: new.kind.to_owned(),
            input: new.input.to_owned(),
            cron: new.cron.to_owned(),
            tz: new.tz.to_owned(),
            overlap: new.overlap,
            catchup: new.catchup,
            next_tick: Timestamp::ZERO,
            last_tick: old.as_ref().map_or(Timestamp::ZERO, |s| s.last_tick),
            last_run: old.as_ref().and_then(|s| s.last_run),
            fired: old.as_ref().map_or(0, |s| s.fired),
            skipped: old.as_ref().map_or(0, |s| s.skipped),
        };
        self.schedules.insert(row.name.clone(), row);
        1
    }

    /// [`Statement::DeleteSchedule`]: the schedule is gone; its runs stay.
    ///
    /// [`Statement::DeleteSchedule`]: super::Statement::DeleteSchedule
    pub fn delete_schedule(&mut self, name: &str) -> u64 {
        u64::from(self.schedules.remove(name).is_some())
    }

    /// [`Statement::DueSchedules`]: up to `limit` schedules whose next
    /// tick is due at `now` (or that are not planned yet), earliest first,
    /// each with `now`.
    ///
    /// [`Statement::DueSchedules`]: super::Statement::DueSchedules
    #[must_use]
    pub fn due_schedules(&self, now: Timestamp, limit: usize) -> Vec<(Timestamp, ScheduleRow)> {
        let mut due: Vec<&ScheduleRow> = self
            .schedules
            .values()
            .filter(|s| s.next_tick <= now)
            .collect();
        due.sort_by(|a, b| (a.next_tick, &a.name).cmp(&(b.next_tick, &b.name)));
        due.into_iter()
            .take(limit)
            .map(|s| (now, s.clone()))
            .collect()
    }

    /// [`Statement::ListSchedules`]: every schedule, by name, each with
    /// `now`.
    ///
    /// [`Statement::ListSchedules`]: super::Statement::ListSchedules
    #[must_use]
    pub fn list_schedules(&self, now: Timestamp) -> Vec<(Timestamp, ScheduleRow)> {
        self.schedules.values().map(|s| (now, s.clone())).collect()
    }

    /// [`Statement::FireTick`]: handles one tick of a schedule, if its
    /// `next_tick` is still `fire.expect`: moves it to `fire.next`, and,
    /// unless only planning, records the tick and makes its run, or counts
    /// it skipped (the catch-up policy made no run, or the overlap policy
    /// found the previous run live). Under [`Overlap::Cancel`] a live
    /// previous run is cancelled first. The run is inserted due now (the
    /// retry pass queues it), with the schedule's kind and input.
    ///
    /// [`Statement::FireTick`]: super::Statement::FireTick
    pub fn fire_tick(&mut self, fire: &Fire<'_>) -> u64 {
        let Some(s) = self.schedules.get(fire.schedule) else {
            return 0;
        };
        if fire.expect.is_some_and(|e| e != s.next_tick) {
            return 0;
        }
        let (kind, input, overlap) = (s.kind.clone(), s.input.clone(), s.overlap);
        let live = s
            .last_run
            .and_then(|r| self.runs.get(&r))
            .filter(|r| !r.status.is_terminal())
            .map(|r| r.run_id);
        let fires = fire.tick > Timestamp::ZERO
            && fire.run != RunId(0)
            && !(overlap == Overlap::Skip && live.is_some());
        if let (true, Overlap::Cancel, Some(prev)) = (fires, overlap, live) {
            self.cancel(prev);
        }
        if fires {
            let new = NewRunRow {
                kind: &kind,
                input: &input,
                attempts_max: fire.attempts_max,
                budget_ms: (fire.budget_ms > 0).then_some(fire.budget_ms),
                trace: "",
                delay: Delay {
                    delay_ms: 0,
                    at_ms: fire.tick.0,
                },
            };
            self.insert_run_budgeted(fire.run, &new);
        }
        let s = self.schedules.get_mut(fire.schedule).expect("read above");
        s.next_tick = fire.next;
        if fire.tick > Timestamp::ZERO {
            s.last_tick = fire.tick;
            if fires {
                s.last_run = Some(fire.run);
                s.fired += 1;
            } else {
                s.skipped += 1;
            }
        }
        1
    }
}
